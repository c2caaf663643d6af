//! The step record: everything one rank contributes to the next plan, in one fixed-size record
//! that the ranks all-gather every step (`Collective::all_gather`, [`RECORD_BYTES`] each).
//!
//! ```
//! use datahelix::plan::record::{DecodeObservation, FailedSample, StepRecord, RECORD_BYTES};
//!
//! let mut r = StepRecord { rank: 3, step: 41, workers: 2, accel_free_s: 0.12, ..StepRecord::default() };
//! r.skips.push(FailedSample { step: 42, id: 0xDEAD });
//! r.push_observation(DecodeObservation { codec: 1, mpixels: 3.2, mbits: 1.5, discarded: 0.0, seconds: 0.04 });
//! let bytes = r.encode();
//! assert_eq!(bytes.len(), RECORD_BYTES);
//! assert_eq!(StepRecord::decode(&bytes).unwrap(), r);
//! ```
//!
//! Fixed size keeps the all-gather a single cheap collective of known length. What does not fit
//! waits or is sampled: a rank with more than [`MAX_SKIPS`] failed samples to tell lists the
//! first ones and keeps the rest for its next records (`step::Engine`), so that every failure is
//! counted once, with its step; of more than [`MAX_OBSERVATIONS`] decode
//! timings it keeps a uniform sample ([`StepRecord::sample_observation`]: the first ones are the
//! longest jobs of an earliest-deadline-first pool, and a model fitted on them learns mostly the
//! longest decodes).

use super::RankState;

/// Failed samples a record carries (a rank's failures past it wait for its next records: a
/// failure is told late, never lost). With their steps, 8 take the room 16 bare ids took: the
/// record stays 544 bytes, which the simulator prices every round.
pub const MAX_SKIPS: usize = 8;
/// Decode observations a record carries.
pub const MAX_OBSERVATIONS: usize = 8;
/// Bytes of an encoded record.
pub const RECORD_BYTES: usize = HEADER + MAX_SKIPS * SKIP_BYTES + MAX_OBSERVATIONS * OBS_BYTES;

const MAGIC: u32 = 0xD4_7A_5E_C1;
/// The most decode workers a record may state for one rank: the planner sizes per-worker state by
/// it, so a peer's `u32::MAX` must not reach it.
pub const MAX_WORKERS: u32 = 1 << 16;
const HEADER: usize = 96;
const OBS_BYTES: usize = 40;
const SKIP_BYTES: usize = 16;

/// A sample whose decode failed: the step it was planned in, and its id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailedSample {
    /// The step whose global batch holds it.
    pub step: u64,
    /// The sample's id.
    pub id: u64,
}

/// One measured decode, as the decode-cost model's features (per codec).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeObservation {
    /// The codec's descriptor byte.
    pub codec: u8,
    /// Decoded megapixels.
    pub mpixels: f64,
    /// Compressed megabits read.
    pub mbits: f64,
    /// Frames decoded and discarded.
    pub discarded: f64,
    /// Measured seconds.
    pub seconds: f64,
}

/// One rank's contribution to the plan of the next steps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepRecord {
    /// The rank.
    pub rank: u32,
    /// The step this record closes.
    pub step: u64,
    /// Its decode workers.
    pub workers: u32,
    /// Seconds from the all-gather until its accelerator is free (predicted).
    pub accel_free_s: f64,
    /// Seconds of decode work still queued on its workers.
    pub queued_cpu_s: f64,
    /// Byte cap of one step's decoded batch (0: none).
    pub mem_cap: u64,
    /// Measured accelerator seconds of its last step.
    pub gpu_s: f64,
    /// Σ tokens of the samples it trained in that step.
    pub sum_tokens: f64,
    /// Σ tokens² of those samples.
    pub sum_tokens_sq: f64,
    /// Samples it trained in that step.
    pub samples: u32,
    /// Samples that failed on this rank since its last record (at most [`MAX_SKIPS`]; the
    /// rank keeps the rest for its next record).
    pub skips: Vec<FailedSample>,
    /// Decode timings measured since the last record.
    pub observations: Vec<DecodeObservation>,
    /// zstd level-1 compression ratio measured on this rank's tensors (0: not measured).
    pub zstd_ratio: f64,
    /// zstd level-1 compression speed in bytes per second (0: not measured).
    pub zstd_bps: f64,
    /// CPU of one of its decode workers under the CPU budget, in thousandths of a core (0: not
    /// limited).
    pub worker_millicores: u32,
}

/// A record that does not decode: not the format, or inconsistent counts.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("step record from the all-gather is malformed: {0}; every rank must run the same DataHelix build")]
pub struct RecordError(pub &'static str);

fn put(out: &mut [u8], at: usize, bytes: &[u8]) {
    out[at..at + bytes.len()].copy_from_slice(bytes);
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
fn f64_at(b: &[u8], at: usize) -> f64 {
    f64::from_bits(u64_at(b, at))
}

impl StepRecord {
    /// Moves failed samples from the front of `waiting` into the record while it has room
    /// ([`MAX_SKIPS`]); the rest stay for the next record.
    pub fn take_skips(&mut self, waiting: &mut std::collections::VecDeque<FailedSample>) {
        let room = MAX_SKIPS.saturating_sub(self.skips.len()).min(waiting.len());
        self.skips.extend(waiting.drain(..room));
    }

    /// Adds a decode timing (dropped past [`MAX_OBSERVATIONS`]).
    pub fn push_observation(&mut self, o: DecodeObservation) {
        if self.observations.len() < MAX_OBSERVATIONS {
            self.observations.push(o);
        }
    }

    /// Offers the `seen`-th decode timing (from 0) since the record was made, keeping a uniform
    /// sample of all those offered (reservoir sampling, its draws a hash of `seen`: the same
    /// timings in the same order keep the same sample).
    ///
    /// ```
    /// use datahelix::plan::record::{DecodeObservation, StepRecord, MAX_OBSERVATIONS};
    ///
    /// let mut r = StepRecord::default();
    /// for k in 0..1000u64 {
    ///     let o = DecodeObservation { codec: 1, mpixels: 1.0, mbits: 1.0, discarded: 0.0, seconds: k as f64 };
    ///     r.sample_observation(o, k);
    /// }
    /// assert_eq!(r.observations.len(), MAX_OBSERVATIONS);
    /// assert!(r.observations.iter().any(|o| o.seconds >= 500.0)); // not only the first ones
    /// ```
    pub fn sample_observation(&mut self, o: DecodeObservation, seen: u64) {
        if self.observations.len() < MAX_OBSERVATIONS {
            self.observations.push(o);
            return;
        }
        let j = crate::sampler::splitmix64(seen) % (seen + 1);
        if let Some(slot) = self.observations.get_mut(j as usize) {
            *slot = o;
        }
    }

    /// What the planner takes from this record.
    pub fn rank_state(&self) -> RankState {
        RankState {
            workers: self.workers,
            accel_free_s: self.accel_free_s,
            queued_cpu_s: self.queued_cpu_s,
            mem_cap: self.mem_cap,
        }
    }

    /// The fixed-size bytes.
    pub fn encode(&self) -> [u8; RECORD_BYTES] {
        let mut b = [0u8; RECORD_BYTES];
        put(&mut b, 0, &MAGIC.to_le_bytes());
        put(&mut b, 4, &self.rank.to_le_bytes());
        put(&mut b, 8, &self.step.to_le_bytes());
        put(&mut b, 16, &self.workers.to_le_bytes());
        put(&mut b, 20, &self.samples.to_le_bytes());
        put(&mut b, 24, &self.accel_free_s.to_bits().to_le_bytes());
        put(&mut b, 32, &self.queued_cpu_s.to_bits().to_le_bytes());
        put(&mut b, 40, &self.mem_cap.to_le_bytes());
        put(&mut b, 48, &self.gpu_s.to_bits().to_le_bytes());
        put(&mut b, 56, &self.sum_tokens.to_bits().to_le_bytes());
        put(&mut b, 64, &self.sum_tokens_sq.to_bits().to_le_bytes());
        b[72] = self.skips.len().min(MAX_SKIPS) as u8;
        b[74] = self.observations.len().min(MAX_OBSERVATIONS) as u8;
        put(&mut b, 76, &self.worker_millicores.to_le_bytes());
        put(&mut b, 80, &self.zstd_ratio.to_bits().to_le_bytes());
        put(&mut b, 88, &self.zstd_bps.to_bits().to_le_bytes());
        for (k, f) in self.skips.iter().take(MAX_SKIPS).enumerate() {
            put(&mut b, HEADER + SKIP_BYTES * k, &f.step.to_le_bytes());
            put(&mut b, HEADER + SKIP_BYTES * k + 8, &f.id.to_le_bytes());
        }
        let obs_at = HEADER + SKIP_BYTES * MAX_SKIPS;
        for (k, o) in self.observations.iter().take(MAX_OBSERVATIONS).enumerate() {
            let at = obs_at + OBS_BYTES * k;
            b[at] = o.codec;
            put(&mut b, at + 8, &o.mpixels.to_bits().to_le_bytes());
            put(&mut b, at + 16, &o.mbits.to_bits().to_le_bytes());
            put(&mut b, at + 24, &o.discarded.to_bits().to_le_bytes());
            put(&mut b, at + 32, &o.seconds.to_bits().to_le_bytes());
        }
        b
    }

    /// Reads a record.
    pub fn decode(b: &[u8]) -> Result<StepRecord, RecordError> {
        if b.len() != RECORD_BYTES {
            return Err(RecordError("wrong length"));
        }
        if u32_at(b, 0) != MAGIC {
            return Err(RecordError("wrong magic"));
        }
        let (n_skips, reserved, n_obs) = (b[72] as usize, b[73], b[74] as usize);
        if n_skips > MAX_SKIPS || n_obs > MAX_OBSERVATIONS || reserved != 0 {
            return Err(RecordError("counts out of range"));
        }
        let obs_at = HEADER + SKIP_BYTES * MAX_SKIPS;
        let rec = StepRecord {
            rank: u32_at(b, 4),
            step: u64_at(b, 8),
            workers: u32_at(b, 16),
            samples: u32_at(b, 20),
            accel_free_s: f64_at(b, 24),
            queued_cpu_s: f64_at(b, 32),
            mem_cap: u64_at(b, 40),
            gpu_s: f64_at(b, 48),
            sum_tokens: f64_at(b, 56),
            sum_tokens_sq: f64_at(b, 64),
            skips: (0..n_skips)
                .map(|k| FailedSample {
                    step: u64_at(b, HEADER + SKIP_BYTES * k),
                    id: u64_at(b, HEADER + SKIP_BYTES * k + 8),
                })
                .collect(),
            zstd_ratio: f64_at(b, 80),
            zstd_bps: f64_at(b, 88),
            worker_millicores: u32_at(b, 76),
            observations: (0..n_obs)
                .map(|k| {
                    let at = obs_at + OBS_BYTES * k;
                    DecodeObservation {
                        codec: b[at],
                        mpixels: f64_at(b, at + 8),
                        mbits: f64_at(b, at + 16),
                        discarded: f64_at(b, at + 24),
                        seconds: f64_at(b, at + 32),
                    }
                })
                .collect(),
        };
        rec.check()?;
        Ok(rec)
    }

    /// The bounds a peer's record must keep before the planner uses it: a worker count the
    /// planner can size state by, and numbers that are finite (non-negative where they count
    /// seconds, tokens or bytes).
    fn check(&self) -> Result<(), RecordError> {
        if self.workers > MAX_WORKERS || self.worker_millicores > 1_000_000 {
            return Err(RecordError("decode workers out of range"));
        }
        let counts = [
            self.queued_cpu_s,
            self.gpu_s,
            self.sum_tokens,
            self.sum_tokens_sq,
            self.zstd_ratio,
            self.zstd_bps,
        ];
        let measured = self.observations.iter().flat_map(|o| [o.mpixels, o.mbits, o.discarded, o.seconds]);
        if !self.accel_free_s.is_finite()
            || counts.into_iter().chain(measured).any(|x| !(x.is_finite() && x >= 0.0))
        {
            return Err(RecordError("a time, count or measurement is negative or not finite"));
        }
        Ok(())
    }

    /// Decodes the concatenated records of an all-gather, checking each sits at its rank's slot.
    pub fn decode_all(bytes: &[u8], ranks: usize) -> Result<Vec<StepRecord>, RecordError> {
        if ranks.checked_mul(RECORD_BYTES) != Some(bytes.len()) {
            return Err(RecordError("all-gather length is not ranks × record size"));
        }
        bytes
            .chunks_exact(RECORD_BYTES)
            .enumerate()
            .map(|(r, chunk)| {
                let rec = StepRecord::decode(chunk)?;
                if rec.rank as usize != r {
                    return Err(RecordError("a record sits at another rank's slot"));
                }
                Ok(rec)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the bounds, a peer's `workers = u32::MAX` reached the planner (which sizes a heap
    /// by it) and a NaN reached its sorts.
    #[test]
    fn out_of_range_fields_are_rejected() {
        let good = StepRecord { rank: 0, workers: 4, gpu_s: 0.1, ..StepRecord::default() };
        assert!(StepRecord::decode(&good.encode()).is_ok());
        for bad in [
            StepRecord { workers: u32::MAX, ..good.clone() },
            StepRecord { gpu_s: f64::NAN, ..good.clone() },
            StepRecord { queued_cpu_s: -1.0, ..good.clone() },
            StepRecord { accel_free_s: f64::INFINITY, ..good.clone() },
        ] {
            assert!(StepRecord::decode(&bad.encode()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn failures_past_the_room_wait_and_bad_bytes_are_rejected() {
        let mut r = StepRecord { rank: 1, worker_millicores: 500, ..StepRecord::default() };
        let mut waiting: std::collections::VecDeque<FailedSample> =
            (0..12).map(|id| FailedSample { step: 7 + id / 6, id }).collect();
        r.take_skips(&mut waiting);
        assert_eq!(r.skips.len(), MAX_SKIPS);
        assert_eq!(r.skips[7], FailedSample { step: 8, id: 7 });
        // The four that did not fit wait, in order, for the next record.
        assert_eq!(waiting.iter().map(|f| f.id).collect::<Vec<_>>(), [8, 9, 10, 11]);
        let mut next = StepRecord::default();
        next.take_skips(&mut waiting);
        assert_eq!(next.skips.len(), 4);
        assert!(waiting.is_empty());
        assert_eq!(RECORD_BYTES, 544, "the simulator prices every round's all-gather of it");
        let b = r.encode();
        assert_eq!(StepRecord::decode(&b).unwrap(), r);
        let mut bad = b;
        bad[72] = 200;
        assert!(StepRecord::decode(&bad).is_err());
        let mut bad = b;
        bad[73] = 1;
        assert!(StepRecord::decode(&bad).is_err());
        assert!(StepRecord::decode(&b[..10]).is_err());
        let mut two = StepRecord { rank: 0, ..Default::default() }.encode().to_vec();
        two.extend_from_slice(&b);
        assert_eq!(StepRecord::decode_all(&two, 2).unwrap().len(), 2);
        let mut swapped = b.to_vec();
        swapped.extend_from_slice(&StepRecord { rank: 0, ..Default::default() }.encode());
        assert!(StepRecord::decode_all(&swapped, 2).is_err());
    }
}
