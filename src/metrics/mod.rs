//! What a training run measured, and the protocol's summary of it
//! (`shared/bench/PROTOCOL.md`, "What is measured"; JSON shape in `shared/CLI.md`, `train`).
//!
//! ```
//! use datahelix::metrics::{summarize, RankStep};
//!
//! let rec = |rank, step, wait: f64, start: f64| RankStep {
//!     rank, step, input_wait_s: wait, gpu_s: 0.1, start_s: start, end_s: start + 0.1 + wait,
//!     ids: vec![step * 2 + rank as u64], ..RankStep::default()
//! };
//! let records = vec![rec(0, 0, 0.5, 0.0), rec(1, 0, 0.0, 0.0), rec(0, 1, 0.0, 0.6), rec(1, 1, 0.02, 0.6)];
//! let s = summarize(&records, 1, 2, 2.0);
//! assert_eq!(s.miss_rate, 0.5);       // of the measured step's two ranks, one waited > 1 ms
//! assert!((s.throughput - 2.0 / 0.12).abs() < 1e-9); // 2 samples in 0.12 s
//! ```

use serde::{Deserialize, Serialize};

pub mod plots;
pub mod table;
pub mod trace;

/// One rank's record of one step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankStep {
    /// Rank.
    pub rank: u32,
    /// Step (counting from 0, warm-up included).
    pub step: u64,
    /// From the rank being ready for the step to its batch being in hand.
    pub input_wait_s: f64,
    /// Emulated (or measured) accelerator seconds of the step.
    pub gpu_s: f64,
    /// Sample ids delivered to this rank for this step.
    pub ids: Vec<u64>,
    /// Sample ids of this rank's share that failed and were skipped.
    pub skipped: Vec<u64>,
    /// When the rank was ready for the step (seconds since the run's start).
    pub start_s: f64,
    /// When the step's gradient all-reduce finished on this rank.
    pub end_s: f64,
    /// Accelerator seconds of the largest single sample in this rank's batch.
    pub max_sample_gpu_s: f64,
    /// CPU seconds this rank's decode workers spent on samples of this step.
    pub decode_cpu_s: f64,
    /// Tokens delivered.
    pub tokens: u64,
    /// Bytes of tensors this rank received from other ranks for this step.
    pub bytes_in: u64,
    /// With `train --checksums`: the wrapping sum over delivered samples of FNV-1a 64 of (id,
    /// tensor bytes) — equal across backends and policies that deliver the same tensors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_checksum: Option<u64>,
    /// Bytes of received (and put-together) tensors counted in this rank's pool budget when
    /// the step's call returned, its batch in hand (real runs; `None` in the simulator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged_bytes: Option<u64>,
}

/// The protocol's summary of a run (keys are a contract: `shared/CLI.md`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Delivered samples per wall second of the measured steps.
    pub throughput: f64,
    /// Share of measured (rank, step) with input wait above 1 ms.
    pub miss_rate: f64,
    /// Likewise above 10 ms.
    pub miss_rate_10ms: f64,
    /// Median input wait.
    pub p50_wait_s: f64,
    /// 95th-percentile input wait.
    pub p95_wait_s: f64,
    /// Largest input wait.
    pub max_wait_s: f64,
    /// Ideal-bound wall time over actual wall time of the measured steps.
    pub efficiency: f64,
    /// Rebalancing all-to-alls run.
    pub rebalances_run: u64,
    /// Rebalances the gate skipped.
    pub rebalances_skipped: u64,
    /// Bytes of decoded tensors moved between ranks.
    pub bytes_moved: u64,
    /// Measured steps.
    pub steps: u64,
    /// Samples delivered in the measured steps.
    pub delivered: u64,
    /// Samples skipped (failed) in the measured steps.
    pub skipped: u64,
    /// Wall seconds of the measured steps.
    pub wall_s: f64,
    /// Ideal-bound seconds of the measured steps.
    pub ideal_s: f64,
    /// The accelerator's part of the ideal bound: Σ over steps of max(Σ gpu / R, largest sample).
    pub accel_bound_s: f64,
    /// The CPU budget's part of the ideal bound: Σ over steps of decode CPU / cores. Above
    /// `accel_bound_s`, no loader can keep the accelerators busy on this budget.
    pub cpu_bound_s: f64,
    /// Per measured step, the largest input wait over ranks.
    pub step_max_wait_s: Vec<f64>,
}

/// The `q`-quantile (0..=1) of sorted values, by linear interpolation between closest ranks.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Summarises the records of steps `warmup..` of a run of `ranks` ranks whose CPU budget had
/// `cores` cores. Rebalance counters and bytes moved are filled in by the caller.
///
/// The ideal bound of a step is `max(Σ gpu / R, largest single sample's gpu, Σ decode CPU /
/// cores)`: no schedule finishes the step faster on this accelerator work and CPU budget.
pub fn summarize(records: &[RankStep], warmup: u64, ranks: usize, cores: f64) -> Summary {
    let measured: Vec<&RankStep> = records.iter().filter(|r| r.step >= warmup).collect();
    if measured.is_empty() || ranks == 0 {
        return Summary::default();
    }
    let mut waits: Vec<f64> = measured.iter().map(|r| r.input_wait_s.max(0.0)).collect();
    waits.sort_by(f64::total_cmp);
    let n = waits.len() as f64;
    let start = measured.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let end = measured.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
    let wall = (end - start).max(1e-12);
    let delivered: u64 = measured.iter().map(|r| r.ids.len() as u64).sum();
    let skipped: u64 = measured.iter().map(|r| r.skipped.len() as u64).sum();

    let mut steps: Vec<u64> = measured.iter().map(|r| r.step).collect();
    steps.sort_unstable();
    steps.dedup();
    let (mut ideal, mut accel_bound, mut cpu_bound) = (0.0, 0.0, 0.0);
    let mut step_max_wait = Vec::with_capacity(steps.len());
    for &s in &steps {
        let of_step = measured.iter().filter(|r| r.step == s);
        let (mut gpu, mut largest, mut cpu, mut wait) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for r in of_step {
            gpu += r.gpu_s;
            largest = largest.max(r.max_sample_gpu_s);
            cpu += r.decode_cpu_s;
            wait = wait.max(r.input_wait_s);
        }
        let (accel, cpu) = ((gpu / ranks as f64).max(largest), cpu / cores.max(1e-9));
        ideal += accel.max(cpu);
        accel_bound += accel;
        cpu_bound += cpu;
        step_max_wait.push(wait);
    }
    Summary {
        throughput: delivered as f64 / wall,
        miss_rate: waits.iter().filter(|&&w| w > 0.001).count() as f64 / n,
        miss_rate_10ms: waits.iter().filter(|&&w| w > 0.010).count() as f64 / n,
        p50_wait_s: quantile(&waits, 0.50),
        p95_wait_s: quantile(&waits, 0.95),
        max_wait_s: *waits.last().unwrap_or(&0.0),
        efficiency: ideal / wall,
        steps: steps.len() as u64,
        delivered,
        skipped,
        wall_s: wall,
        ideal_s: ideal,
        accel_bound_s: accel_bound,
        cpu_bound_s: cpu_bound,
        step_max_wait_s: step_max_wait,
        ..Summary::default()
    }
}

/// A whole run's output: PROTOCOL.md's document (`params`, `records`, `summary`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainResult {
    /// The run's parameters (policy, ranks, workers, profile, cpu_budget, ...).
    pub params: serde_json::Value,
    /// Every (rank, step) record, warm-up included.
    pub records: Vec<RankStep>,
    /// The summary of the measured steps.
    pub summary: Summary,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.95), 3.8);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn ideal_bound_takes_the_binding_resource() {
        let r = |rank, gpu: f64, largest: f64, cpu: f64| RankStep {
            rank,
            step: 0,
            gpu_s: gpu,
            max_sample_gpu_s: largest,
            decode_cpu_s: cpu,
            start_s: 0.0,
            end_s: 1.0,
            ..Default::default()
        };
        // Accelerator-bound: (0.4 + 0.2) / 2 = 0.3.
        let s = summarize(&[r(0, 0.4, 0.1, 0.1), r(1, 0.2, 0.1, 0.1)], 0, 2, 2.0);
        assert!((s.ideal_s - 0.3).abs() < 1e-12);
        // One huge sample binds: 0.5.
        let s = summarize(&[r(0, 0.5, 0.5, 0.1), r(1, 0.0, 0.0, 0.1)], 0, 2, 2.0);
        assert!((s.ideal_s - 0.5).abs() < 1e-12);
        // CPU-bound: 3 CPU-seconds on 2 cores = 1.5.
        let s = summarize(&[r(0, 0.1, 0.1, 2.0), r(1, 0.1, 0.1, 1.0)], 0, 2, 2.0);
        assert!((s.ideal_s - 1.5).abs() < 1e-12);
        assert!((s.efficiency - 1.5).abs() < 1e-12); // wall 1 s: the records are inconsistent, not the math
    }
}

/// A span of time on one rank, for the Chrome trace (`--trace`): decode, wait, compute,
/// transfer, plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// Rank (one trace process per rank).
    pub rank: u32,
    /// Thread within the rank: 0 the training loop, 1.. decode workers.
    pub thread: u32,
    /// Category: `decode`, `wait`, `compute`, `transfer`, `plan` or `assemble` (a split
    /// sample's pieces put together).
    pub cat: String,
    /// Label, e.g. `decode 1234` (a sample id) or `step 7`.
    pub name: String,
    /// Start, seconds since the run's start.
    pub start_s: f64,
    /// Duration, seconds.
    pub dur_s: f64,
}
