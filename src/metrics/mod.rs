//! What a training run measured, and the protocol's summary of it
//! (`shared/bench/PROTOCOL.md`, "What is measured"; JSON shape in `shared/CLI.md`, `train`).
//!
//! ```
//! use datahelix::metrics::{summarize, RankStep, RunShape};
//!
//! let rec = |rank, step, wait: f64, start: f64| RankStep {
//!     rank, step, input_wait_s: wait, gpu_s: 0.1, start_s: start, end_s: start + 0.1 + wait,
//!     ids: vec![step * 2 + rank as u64], ..RankStep::default()
//! };
//! let records = vec![rec(0, 0, 0.5, 0.0), rec(1, 0, 0.0, 0.0), rec(0, 1, 0.0, 0.6), rec(1, 1, 0.02, 0.6)];
//! let s = summarize(&records, RunShape { warmup: 1, ranks: 2, cores: 2.0, lookahead: 2 });
//! assert_eq!(s.miss_rate, 0.5);       // of the measured step's two ranks, one waited > 1 ms
//! assert!((s.throughput - 2.0 / 0.12).abs() < 1e-9); // 2 samples in 0.12 s
//! ```

use serde::{Deserialize, Serialize};

pub mod bound;
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
    /// Noise-free accelerator seconds of the largest single sample in this rank's batch.
    pub max_sample_gpu_s: f64,
    /// Noise-free accelerator seconds of each sample of this rank's batch (`a·tokens +
    /// b·tokens²`), with an emulated accelerator; empty for a real one and in records written
    /// before it was kept. The sound bound's pigeonhole term uses them ([`bound`], fact 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample_gpu_s: Vec<f64>,
    /// Per sample of this rank's batch (in `ids` order): the least seconds one decode worker
    /// needed before it was out, however it was cut — its longest run of frames from a keyframe
    /// through a target, priced by the decode truth. The simulator's only; empty for real runs
    /// and older records. The sound bound's fact 4 uses them ([`bound`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sample_chain_s: Vec<f64>,
    /// The emulated accelerator's terms of this step (`gpu_s = (fixed_s + work_s) × noise`);
    /// `None` for a real accelerator. The sound bound uses them ([`bound`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<AccelTerms>,
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

/// The emulated accelerator's step of one rank: `(fixed_s + work_s) × noise` seconds
/// (`shared/bench/PROTOCOL.md`, "Emulated accelerator").
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AccelTerms {
    /// The profile's per-step constant `c0`.
    pub fixed_s: f64,
    /// `Σ (a·tokens + b·tokens²)` over the delivered samples.
    pub work_s: f64,
    /// The realised noise `exp(σ z(seed, step, rank))`.
    pub noise: f64,
}

/// The cores a run's decoding can use, all ranks together: per rank, its budget or one core a
/// worker, whichever is less (a decode worker is single-threaded). The bound's decode term
/// divides by this: a budget above the workers' count cannot be used, so it does not shorten
/// the bound.
///
/// ```
/// use datahelix::metrics::usable_cores;
///
/// // Four ranks of one worker each, 3 cores a rank: at most 4 cores decode at once.
/// assert_eq!(usable_cores(&[3.0; 4], &[1; 4]), 4.0);
/// // Below a core a worker the budget binds.
/// assert_eq!(usable_cores(&[0.375; 4], &[1; 4]), 1.5);
/// ```
pub fn usable_cores(cores_per_rank: &[f64], workers_per_rank: &[u32]) -> f64 {
    cores_per_rank.iter().zip(workers_per_rank).map(|(&c, &w)| c.min(f64::from(w))).sum()
}

/// What a run's summary needs besides its records.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunShape {
    /// Steps before this one are warm-up, not measured.
    pub warmup: u64,
    /// Ranks.
    pub ranks: usize,
    /// Cores the decode workers can use, all ranks together: each rank's budget, but no more
    /// than one core a worker, since a worker decodes single-threaded (`PROTOCOL.md`, "CPU
    /// budget") — [`usable_cores`].
    pub cores: f64,
    /// Steps decoded ahead of the one in training.
    pub lookahead: u64,
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
    /// The sound bound's wall time over the actual wall time of the measured steps
    /// ([`bound`]): at most 1 for any schedule.
    pub efficiency: f64,
    /// The bound in expectation for loaders that split a step before its noise is drawn
    /// (every real one: [`bound::blind`], fact 5) over the measured wall time; at least
    /// `efficiency`. Not a bound on each run: a run can land above 1 by luck, where its heavier
    /// steps draw milder factors than the run's mean. Equal to `efficiency` without emulator
    /// noise terms (a real accelerator); absent (0) in results written before it.
    #[serde(default)]
    pub blind_efficiency: f64,
    /// Rebalancing all-to-alls run.
    pub rebalances_run: u64,
    /// Rebalances the gate skipped.
    pub rebalances_skipped: u64,
    /// Bytes of decoded tensors moved between ranks.
    pub bytes_moved: u64,
    /// Steps whose plan stretched them past the balanced step to the CPUs' pace (helix, a
    /// decode-bound step: [`crate::plan::batching::stretch`]), warm-up included; absent (0) in
    /// results written before it was counted.
    #[serde(default)]
    pub stretched_steps: u64,
    /// Steps whose plan left one rank to wait for its input, its pieces sent after the others'
    /// batches were collected ([`crate::plan::Plan::late_ranks`]), warm-up included; absent (0)
    /// in results written before late ranks.
    #[serde(default)]
    pub late_steps: u64,
    /// Measured steps.
    pub steps: u64,
    /// Samples delivered in the measured steps.
    pub delivered: u64,
    /// Samples skipped (failed) in the measured steps.
    pub skipped: u64,
    /// Wall seconds of the measured steps.
    pub wall_s: f64,
    /// The sound bound on the wall time of the measured steps ([`bound::wall_bound`]).
    pub ideal_s: f64,
    /// The wall time of `blind_efficiency`'s bound (fact 5); absent (0) in results written
    /// before it.
    #[serde(default)]
    pub blind_ideal_s: f64,
    /// The accelerator's part of the bound: Σ over steps of the least accelerator time of any
    /// split of the step's batch under its realised noise ([`bound::step_accel`]).
    pub accel_bound_s: f64,
    /// Σ over steps of decode CPU / cores. Above `accel_bound_s`, no loader can keep the
    /// accelerators busy on this budget.
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

/// Summarises the records of the measured steps (`shape.warmup..`) of a run. Rebalance
/// counters and bytes moved are filled in by the caller. `efficiency` is the sound bound
/// ([`bound`]) over the measured wall time.
pub fn summarize(records: &[RankStep], shape: RunShape) -> Summary {
    let measured: Vec<&RankStep> = records.iter().filter(|r| r.step >= shape.warmup).collect();
    if measured.is_empty() || shape.ranks == 0 {
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

    let mut by_step: std::collections::BTreeMap<u64, Vec<&RankStep>> = Default::default();
    for r in &measured {
        by_step.entry(r.step).or_default().push(r);
    }
    let cores = shape.cores.max(1e-9);
    let noise_law = bound::blind::NoiseLaw::of(by_step.values().map(Vec::as_slice), shape.ranks);
    let mut per_step = Vec::with_capacity(by_step.len());
    let mut blind_steps = Vec::with_capacity(by_step.len());
    let mut step_max_wait = Vec::with_capacity(by_step.len());
    for (&s, of_step) in &by_step {
        let (accel_s, floor_s) = bound::step_accel(of_step, shape.ranks);
        let cpu_s: f64 = of_step.iter().map(|r| r.decode_cpu_s).sum();
        let chain_s = bound::step_chain(of_step, cpu_s);
        let step = bound::StepBound { step: s, accel_s, floor_s, cpu_s, chain_s };
        per_step.push(step);
        let blind =
            noise_law.as_ref().and_then(|law| bound::blind::blind_step_accel(of_step, shape.ranks, law));
        blind_steps.push(bound::StepBound { accel_s: blind.unwrap_or(accel_s), ..step });
        step_max_wait.push(of_step.iter().map(|r| r.input_wait_s).fold(0.0, f64::max));
    }
    let ideal = bound::wall_bound(&per_step, cores, shape.lookahead);
    let blind_ideal = bound::wall_bound(&blind_steps, cores, shape.lookahead).max(ideal);
    Summary {
        throughput: delivered as f64 / wall,
        miss_rate: waits.iter().filter(|&&w| w > 0.001).count() as f64 / n,
        miss_rate_10ms: waits.iter().filter(|&&w| w > 0.010).count() as f64 / n,
        p50_wait_s: quantile(&waits, 0.50),
        p95_wait_s: quantile(&waits, 0.95),
        max_wait_s: *waits.last().unwrap_or(&0.0),
        efficiency: ideal / wall,
        blind_efficiency: blind_ideal / wall,
        steps: by_step.len() as u64,
        delivered,
        skipped,
        wall_s: wall,
        ideal_s: ideal,
        blind_ideal_s: blind_ideal,
        accel_bound_s: per_step.iter().map(|b| b.accel_s).sum(),
        cpu_bound_s: per_step.iter().map(|b| b.cpu_s).sum::<f64>() / cores,
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
    fn a_summary_written_before_stretches_were_counted_still_reads() {
        let mut old =
            serde_json::to_value(Summary { throughput: 2.5, stretched_steps: 7, ..Summary::default() })
                .unwrap();
        old.as_object_mut().unwrap().remove("stretched_steps");
        let read: Summary = serde_json::from_value(old).unwrap();
        assert_eq!((read.throughput, read.stretched_steps), (2.5, 0));
    }

    #[test]
    fn quantiles_interpolate() {
        let v = [0.0, 1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.95), 3.8);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn the_blind_bound_meets_the_noise_an_even_split_cannot_avoid() {
        // Two ranks of ten 0.1-s samples each, two steps, factors 0.9 and 1.1 then swapped: an
        // even split ends each step at 1.1 s. Knowing the factors, eleven samples on the fast
        // rank end at 0.99 s (the sound bound); not knowing them, 1.1 s is the least to expect.
        let r = |rank, step, noise: f64| RankStep {
            rank,
            step,
            ids: (0..10).collect(),
            sample_gpu_s: vec![0.1; 10],
            max_sample_gpu_s: 0.1,
            gpu_s: noise,
            accel: Some(AccelTerms { fixed_s: 0.0, work_s: 1.0, noise }),
            start_s: 1.1 * step as f64,
            end_s: 1.1 * step as f64 + noise,
            ..Default::default()
        };
        let records = [r(0, 0, 0.9), r(1, 0, 1.1), r(0, 1, 1.1), r(1, 1, 0.9)];
        let s = summarize(&records, RunShape { warmup: 0, ranks: 2, cores: 2.0, lookahead: 2 });
        assert!((s.ideal_s - 1.98).abs() < 1e-9, "{}", s.ideal_s);
        assert!((s.blind_ideal_s - 2.2).abs() < 1e-9, "{}", s.blind_ideal_s);
        assert!((s.efficiency - 0.9).abs() < 1e-9 && (s.blind_efficiency - 1.0).abs() < 1e-9);
        // Without the emulator's terms (a real accelerator) the two are one.
        let real: Vec<RankStep> = records.iter().map(|x| RankStep { accel: None, ..x.clone() }).collect();
        let s = summarize(&real, RunShape { warmup: 0, ranks: 2, cores: 2.0, lookahead: 2 });
        assert_eq!(s.blind_ideal_s, s.ideal_s);
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
        let shape = |lookahead| RunShape { warmup: 0, ranks: 2, cores: 2.0, lookahead };
        // Accelerator-bound: (0.4 + 0.2) / 2 = 0.3.
        let s = summarize(&[r(0, 0.4, 0.1, 0.1), r(1, 0.2, 0.1, 0.1)], shape(2));
        assert!((s.ideal_s - 0.3).abs() < 1e-12);
        // One huge sample binds: 0.5.
        let s = summarize(&[r(0, 0.5, 0.5, 0.1), r(1, 0.0, 0.0, 0.1)], shape(2));
        assert!((s.ideal_s - 0.5).abs() < 1e-12);
        // 3 CPU-seconds on 2 cores: the first measured step's decoding may have run during the
        // warm-up (its window opened before it) — the accelerator binds; with no lookahead the
        // step's decoding starts with the step: 1.5 s.
        let s = summarize(&[r(0, 0.1, 0.1, 2.0), r(1, 0.1, 0.1, 1.0)], shape(2));
        assert!((s.ideal_s - 0.1).abs() < 1e-12);
        assert!((s.cpu_bound_s - 1.5).abs() < 1e-12);
        let s = summarize(&[r(0, 0.1, 0.1, 2.0), r(1, 0.1, 0.1, 1.0)], shape(0));
        assert!((s.ideal_s - 1.5).abs() < 1e-12);
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
