//! Transfer-cost model for the planner's rebalancing gate: `t(B) = α + B / β` seconds, where `B` is
//! the largest number of bytes one rank sends to (or receives from) the other ranks in one
//! all-to-all-v, with one `(α, β)` per message-size band (the Hockney model, fitted per band because
//! MPI switches protocols — eager, rendezvous, pipelined — at size thresholds).
//!
//! A model is either calibrated at start-up by a short all-to-all-v sweep ([`TransferModel::calibrate`])
//! or loaded from a `datahelix perf alltoallv --json` document ([`TransferModel::from_perf_json`]).
//! Every rank must hold the same model (the plan is a pure function of its inputs): calibration fits
//! on times max-reduced over all ranks, and [`TransferModel::agree`] broadcasts rank 0's model.
//!
//! ```
//! use datahelix::collective::cost::TransferModel;
//! let samples = [(1_000u64, 11e-6), (100_000, 20e-6), (10_000_000, 1.01e-3)];
//! let m = TransferModel::fit("mpi", 2, &samples, &[]);
//! assert!((m.predict(10_000_000) - 1.01e-3).abs() < 1e-4);
//! ```

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{prefix_sums, Collective, CollectiveError, ReduceOp};

/// One size band: `α + B / β` for `B < max_bytes` (and at or above the previous band's bound).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Band {
    /// Exclusive upper bound of the band in bytes (`u64::MAX` for the last band).
    pub max_bytes: u64,
    /// Latency term, seconds.
    pub alpha_s: f64,
    /// Bandwidth term, bytes per second.
    pub beta_bytes_per_s: f64,
}

/// Per-backend transfer-cost model; see the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferModel {
    /// Backend the model was measured on.
    pub backend: String,
    /// Number of ranks it was measured at.
    pub ranks: usize,
    /// Bands in increasing `max_bytes`; never empty.
    pub bands: Vec<Band>,
}

/// Default band edges (bytes per rank): eager-sized messages, mid-size, bulk.
pub const DEFAULT_EDGES: [u64; 2] = [64 << 10, 4 << 20];

/// Why a model could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CostError {
    /// A collective of the calibration failed.
    #[error("transfer-cost calibration: {0}")]
    Collective(#[from] CollectiveError),
    /// The perf JSON is unreadable or has no usable rows.
    #[error("transfer-cost model from perf JSON: {0}. Produce one with `datahelix perf alltoallv --json`")]
    PerfJson(String),
}

impl TransferModel {
    /// Predicted seconds to move `bytes` (largest per-rank volume) in one all-to-all-v.
    pub fn predict(&self, bytes: u64) -> f64 {
        let band = self.bands.iter().find(|b| bytes < b.max_bytes).or(self.bands.last());
        match band {
            Some(b) => b.alpha_s + bytes as f64 / b.beta_bytes_per_s,
            None => 0.0,
        }
    }

    /// Fits one `(α, β)` per band (`edges`, or [`DEFAULT_EDGES`] if empty) by least squares on
    /// `(bytes, seconds)` samples. Bands without samples borrow the nearest fitted band. Pure and
    /// deterministic: the same samples give bit-identical models on every rank.
    pub fn fit(backend: &str, ranks: usize, samples: &[(u64, f64)], edges: &[u64]) -> Self {
        let edges: Vec<u64> = if edges.is_empty() { DEFAULT_EDGES.to_vec() } else { edges.to_vec() };
        let bounds: Vec<u64> = edges.iter().copied().chain([u64::MAX]).collect();
        let mut fitted: Vec<Option<(f64, f64)>> = Vec::new();
        let mut singles: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut lo = 0u64;
        for &hi in &bounds {
            let pts: Vec<(f64, f64)> =
                samples.iter().filter(|(b, _)| *b >= lo && *b < hi).map(|&(b, t)| (b as f64, t)).collect();
            fitted.push(if distinct_x(&pts) >= 2 { fit_line(&pts) } else { None });
            singles.push(pts);
            lo = hi;
        }
        let all: Vec<(f64, f64)> = samples.iter().map(|&(b, t)| (b as f64, t)).collect();
        let fallback = fit_line(&all).unwrap_or((0.0, 1e-9));
        // A band with a single size cannot separate α from β: keep the overall slope and fit α.
        for (f, pts) in fitted.iter_mut().zip(&singles) {
            if f.is_none() && !pts.is_empty() {
                let gamma = fallback.1;
                let alpha = pts.iter().map(|&(x, t)| t - gamma * x).sum::<f64>() / pts.len() as f64;
                *f = Some((alpha.max(0.0), gamma));
            }
        }
        let bands = bounds
            .iter()
            .enumerate()
            .map(|(i, &max_bytes)| {
                let near = (0..fitted.len())
                    .filter(|&j| fitted[j].is_some())
                    .min_by_key(|&j| (j as isize - i as isize).unsigned_abs());
                let (alpha, gamma) = near.and_then(|j| fitted[j]).unwrap_or(fallback);
                Band { max_bytes, alpha_s: alpha, beta_bytes_per_s: 1.0 / gamma }
            })
            .collect();
        TransferModel { backend: backend.to_string(), ranks, bands }
    }

    /// Reads `datahelix perf alltoallv --json` output: `B = size · (ranks − 1)`, `t = time_us`.
    pub fn from_perf_json(json: &str) -> Result<Self, CostError> {
        #[derive(Deserialize)]
        struct Row {
            size: u64,
            time_us: f64,
        }
        #[derive(Deserialize)]
        struct Doc {
            op: String,
            ranks: usize,
            backend: String,
            rows: Vec<Row>,
        }
        let doc: Doc = serde_json::from_str(json).map_err(|e| CostError::PerfJson(e.to_string()))?;
        if doc.op != "alltoallv" && doc.op != "allgather" {
            return Err(CostError::PerfJson(format!("op is {:?}, expected \"alltoallv\"", doc.op)));
        }
        let peers = doc.ranks.saturating_sub(1).max(1) as u64;
        let samples: Vec<(u64, f64)> = doc
            .rows
            .iter()
            .filter(|r| r.time_us.is_finite() && r.time_us > 0.0)
            .map(|r| (r.size * peers, r.time_us * 1e-6))
            .collect();
        if samples.is_empty() {
            return Err(CostError::PerfJson("no rows with a positive time_us".into()));
        }
        Ok(TransferModel::fit(&doc.backend, doc.ranks, &samples, &[]))
    }

    /// Calibrates by timing all-to-all-v exchanges of `per_peer` bytes to every other rank
    /// (`iters` timed after one warm-up each), max-reducing times over ranks, and fitting.
    pub fn calibrate(comm: &dyn Collective, per_peer: &[usize], iters: usize) -> Result<Self, CostError> {
        let me = comm.rank();
        TransferModel::calibrate_among(comm, per_peer, iters, &|p| p != me)
    }

    /// [`TransferModel::calibrate`] over one class of links: each rank sends only to the peers
    /// `peer` accepts (the ranks of its own node, say, or of the others). `B` is `per_peer` times
    /// the most such peers any rank has. **Collective**: every rank calls it with the same
    /// sizes; a rank without such peers takes part with nothing to send.
    pub fn calibrate_among(
        comm: &dyn Collective,
        per_peer: &[usize],
        iters: usize,
        peer: &dyn Fn(usize) -> bool,
    ) -> Result<Self, CostError> {
        let n = comm.size();
        let me = comm.rank();
        let iters = iters.max(1);
        let is_peer: Vec<bool> = (0..n).map(|p| p != me && peer(p)).collect();
        let mut times = Vec::with_capacity(per_peer.len());
        for &s in per_peer {
            let counts: Vec<usize> = is_peer.iter().map(|&yes| if yes { s } else { 0 }).collect();
            let displs = prefix_sums(&counts);
            let send = vec![0u8; counts.iter().sum()];
            // What this rank receives: the same size from every peer that sends to it. The
            // classes used here are symmetric (a node's ranks, or the other nodes' ranks).
            let mut recv = vec![0u8; send.len()];
            comm.all_to_all_v(&send, &counts, &displs, &mut recv, &counts, &displs)?;
            let t0 = Instant::now();
            for _ in 0..iters {
                comm.all_to_all_v(&send, &counts, &displs, &mut recv, &counts, &displs)?;
            }
            times.push(t0.elapsed().as_secs_f64() / iters as f64);
        }
        comm.all_reduce_f64(&mut times, ReduceOp::Max)?;
        let mut peers = [is_peer.iter().filter(|&&yes| yes).count() as u64];
        comm.all_reduce_u64(&mut peers, ReduceOp::Max)?;
        let peers = peers[0].max(1);
        let samples: Vec<(u64, f64)> =
            per_peer.iter().zip(&times).map(|(&s, &t)| (s as u64 * peers, t)).collect();
        Ok(TransferModel::fit(comm.backend(), n, &samples, &[]))
    }

    /// Makes every rank hold rank 0's model (a broadcast of its encoding).
    pub fn agree(self, comm: &dyn Collective) -> Result<Self, CostError> {
        let mut len = [self.encode().len() as u64];
        comm.all_reduce_u64(&mut len, ReduceOp::Max)?;
        let mut buf = self.encode();
        buf.resize(len[0] as usize, 0);
        comm.broadcast(0, &mut buf)?;
        Ok(TransferModel::decode(&buf).unwrap_or(self))
    }

    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    fn decode(buf: &[u8]) -> Option<Self> {
        let end = buf.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        serde_json::from_slice(&buf[..end]).ok()
    }
}

fn distinct_x(pts: &[(f64, f64)]) -> usize {
    let mut xs: Vec<u64> = pts.iter().map(|p| p.0.to_bits()).collect();
    xs.sort_unstable();
    xs.dedup();
    xs.len()
}

/// Least-squares `t = α + γ·B` with `α ≥ 0`, `γ > 0`; `None` without samples.
fn fit_line(pts: &[(f64, f64)]) -> Option<(f64, f64)> {
    if pts.is_empty() {
        return None;
    }
    let n = pts.len() as f64;
    let (sx, sy) = pts.iter().fold((0.0, 0.0), |(a, b), &(x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxx, sxy) =
        pts.iter().fold((0.0, 0.0), |(a, b), &(x, y)| (a + (x - mx) * (x - mx), b + (x - mx) * (y - my)));
    let mut gamma = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let mut alpha = my - gamma * mx;
    if alpha < 0.0 || gamma <= 0.0 {
        // Refit through the origin (pure bandwidth) or as a constant (pure latency).
        let sxx0: f64 = pts.iter().map(|&(x, _)| x * x).sum();
        let sxy0: f64 = pts.iter().map(|&(x, y)| x * y).sum();
        if alpha < 0.0 && sxx0 > 0.0 {
            alpha = 0.0;
            gamma = sxy0 / sxx0;
        } else {
            alpha = my.max(0.0);
            gamma = 0.0;
        }
    }
    Some((alpha, gamma.max(1e-15)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::LocalWorld;

    #[test]
    fn fit_recovers_per_band_parameters() {
        // Two regimes: 10 us + 1 GB/s below 64 KiB, 50 us + 10 GB/s above.
        let t = |b: u64| if b < 64 << 10 { 10e-6 + b as f64 / 1e9 } else { 50e-6 + b as f64 / 1e10 };
        let samples: Vec<(u64, f64)> = (0..12).map(|k| 1024u64 << k).map(|b| (b, t(b))).collect();
        let m = TransferModel::fit("mpi", 4, &samples, &[]);
        assert_eq!(m.bands.len(), 3);
        assert!(
            (m.bands[0].alpha_s - 10e-6).abs() < 1e-9
                && (m.bands[0].beta_bytes_per_s / 1e9 - 1.0).abs() < 1e-6
        );
        assert!((m.bands[1].beta_bytes_per_s / 1e10 - 1.0).abs() < 1e-6);
        assert_eq!(
            m.bands[2],
            Band { max_bytes: u64::MAX, ..m.bands[1].clone() },
            "empty band borrows its neighbour"
        );
        for (b, s) in samples {
            assert!((m.predict(b) - s).abs() / s < 1e-6);
        }
        assert_eq!(
            m,
            TransferModel::fit(
                "mpi",
                4,
                &(0..12).map(|k| 1024u64 << k).map(|b| (b, t(b))).collect::<Vec<_>>(),
                &[]
            )
        );
    }

    #[test]
    fn perf_json_loads_and_rejects_garbage() {
        let doc = r#"{"op":"alltoallv","ranks":2,"backend":"mpi","raw":false,
            "rows":[{"size":65536,"count":65536,"type":"uint8","time_us":20.0,"algbw":3.2,"busbw":1.6,"wrong":0},
                    {"size":1048576,"count":1048576,"type":"uint8","time_us":300.0,"algbw":3.5,"busbw":1.7,"wrong":0}]}"#;
        let m = TransferModel::from_perf_json(doc).unwrap();
        assert!((m.predict(1 << 20) - 300e-6).abs() < 1e-9);
        assert!(TransferModel::from_perf_json("{}").is_err());
        let err = TransferModel::from_perf_json(&doc.replace("alltoallv", "broadcast")).unwrap_err();
        assert!(err.to_string().contains("datahelix perf alltoallv"));
    }

    #[test]
    fn calibrate_and_agree_on_one_rank() {
        let w = LocalWorld::new();
        let m = TransferModel::calibrate(&w, &[1 << 10, 1 << 16], 2).unwrap().agree(&w).unwrap();
        assert_eq!(m.backend, "local");
        assert!(m.predict(1 << 20).is_finite());
    }
}
