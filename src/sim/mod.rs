//! A discrete-event simulator of the input data plane at scale (`shared/DESIGN.md`,
//! "Simulator"): the real planner, policies, cost models and step record, driven by simulated
//! time instead of threads, processes and sleeps. The step protocol is the loader's own
//! ([`crate::step`]), one engine per rank; [`exec`] drives them, CPU pools and links are the
//! event engine ([`engine`]); workloads are TOML files ([`workload`]).
//!
//! Deterministic: the same workload, policy, ranks and seed give the same records, bit for bit
//! (the planner's measured wall time is reported beside them, never mixed in unless asked).
//!
//! ```
//! use datahelix::policy::Policy;
//! use datahelix::sim::{self, workload::{Calibration, Workload}, Overrides};
//!
//! let w = Workload::parse(r#"
//! name = "doc"
//! follows = "a toy"
//! [model]
//! formula = "tokens"
//! c0 = 0.02
//! a = 2e-6
//! b = 0.0
//! sigma = 0.05
//! [run]
//! global_batch = 8
//! ranks = 2
//! workers_per_rank = 1
//! steps = 6
//! warmup = 1
//! [dataset]
//! count = 64
//! [[dataset.components]]
//! weight = 1
//! modality = "image"
//! codec = "jpeg"
//! resolutions = [{ size = [640, 480], weight = 1 }]
//! file_kb = { median = 80, sigma = 0.3, min = 10, max = 400 }
//! text_tokens = { median = 32, sigma = 0.5, min = 4, max = 256 }
//! "#, "doc.toml").unwrap();
//! let cal = Calibration::parse(r#"{"models": {"jpeg": {"coefficients":
//!     {"c0": 0.001, "c_px": 0.008, "c_bits": 0.002, "c_seek": 0}, "mean_rel_error": 0.1}}}"#, "c").unwrap();
//! let a = sim::run_workload(&w, &cal, Policy::Helix, &Overrides::default()).unwrap();
//! let b = sim::run_workload(&w, &cal, Policy::Helix, &Overrides::default()).unwrap();
//! assert_eq!(a.records, b.records);
//! assert!(a.summary.throughput > 0.0);
//! ```

pub mod engine;
pub mod exec;
pub mod workload;

use std::path::Path;

use serde::Serialize;

pub use exec::{simulate, SimConfig, SimData, SimRun};
use workload::{Calibration, Workload};

use crate::cost::accel::{AccelModel, TokenFormula};
use crate::decode::sample::Params;
use crate::descriptor::Status;
use crate::emu::Profile;
use crate::index::Index;
use crate::plan::TransferCost;
use crate::policy::{self, Policy};

/// Command-line changes to a workload.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Ranks (the global batch and the dataset scale with them, per-rank batch kept).
    pub ranks: Option<usize>,
    /// Workers per rank.
    pub workers_per_rank: Option<usize>,
    /// Steps (warm-up kept below).
    pub steps: Option<u64>,
    /// Seed.
    pub seed: Option<u64>,
    /// Observations the accelerator fit keeps (None: the loader's, [`loader_accel_window`]).
    pub accel_window: Option<usize>,
    /// The CPU budget as a share of the accelerator ([`workload::Run::cpu_per_accel`]); replaces
    /// the file's budget.
    pub cpu_per_accel: Option<f64>,
    /// Ranks per planning group (`LoaderConfig::plan_group_ranks`; None: automatic).
    pub plan_group_ranks: Option<u32>,
    /// Steps decoded ahead ([`workload::Run::lookahead`]; the protocol allows 2).
    pub lookahead: Option<usize>,
    /// The CPU quota's period, seconds ([`engine::CpuPool::with_quota_period`]; None: the
    /// cores are shared smoothly).
    pub cfs_period_s: Option<f64>,
    /// No late ranks ([`SimConfig::late_pieces`] off; on as in `datahelix train`).
    pub no_late_pieces: bool,
}

/// The configuration and data of a workload under `over`.
pub fn prepare(
    w: &Workload,
    cal: &Calibration,
    policy: Policy,
    over: &Overrides,
) -> Result<(SimConfig, SimData), String> {
    let base_ranks = w.run.ranks;
    let ranks = over.ranks.unwrap_or(base_ranks).max(1);
    let wpr = over.workers_per_rank.unwrap_or(w.run.workers_per_rank).max(1);
    let global_batch = (w.run.global_batch * ranks).div_ceil(base_ranks).max(1);
    let steps = over.steps.unwrap_or(w.run.steps);
    let warmup = w.run.warmup.min(steps.saturating_sub(1) / 2);
    let seed = over.seed.unwrap_or(w.run.seed);
    let mut scaled = w.clone();
    scaled.dataset.count = w.dataset.count.max(w.dataset.count * ranks / base_ranks).max(2 * global_batch);
    let params = w.preprocess.params();
    let descriptors = scaled.descriptors();
    let decode_s = descriptors
        .iter()
        .map(|d| if d.status.is_ok() { cal.decode_s(d, &params, seed) } else { Ok(0.0) })
        .collect::<Result<Vec<f64>, String>>()
        .map_err(|e| format!("workload {}: {e}", w.path.display()))?;
    let cores = match over.cpu_per_accel.or(w.run.cpu_per_accel) {
        Some(share) => {
            let batch = global_batch as f64 / ranks as f64;
            cores_for_share(&descriptors, &decode_s, w, &params, batch, share)
        }
        None => w.run.cores_per_rank.map_or(wpr as f64, |c| c * wpr as f64 / w.run.workers_per_rank as f64),
    };
    // A worker runs one decode at a time: a budget of more cores than workers gets a worker per core.
    let wpr = if over.workers_per_rank.is_some() { wpr } else { wpr.max(cores.ceil() as usize) };
    let links = w.cluster.links();
    // The planner knows the links as a loader measuring them per class would
    // (`--transfer-model measured`): a node's own, and the network's between nodes.
    let planner_transfer = if ranks > links.ranks_per_node {
        let node_of = (0..ranks).map(|r| (r / links.ranks_per_node) as u32).collect();
        TransferCost::per_node(&links.intra, &links.inter, node_of)
    } else {
        links.intra.clone()
    };
    let cfg = SimConfig {
        policy,
        workers: vec![wpr as u32; ranks],
        cores: vec![cores; ranks],
        global_batch,
        steps,
        warmup,
        lookahead: over.lookahead.unwrap_or(w.run.lookahead),
        seed,
        params,
        formula: w.model.formula,
        profile: w.model.profile(),
        links,
        planner_transfer,
        accel_prior: default_accel_prior(),
        step_overhead_s: 0.0,
        accel_window: over.accel_window.unwrap_or(loader_accel_window(ranks)),
        ship_margin_s: crate::exec::loader::DEFAULT_SHIP_MARGIN_S,
        ship_slack_s: crate::exec::loader::DEFAULT_SHIP_SLACK_S,
        split_above_s: None,
        check_plan: false,
        plan_group_ranks: over.plan_group_ranks.unwrap_or(0),
        keep_plan_inputs: false,
        cfs_period_s: over.cfs_period_s.unwrap_or(0.0),
        late_pieces: !over.no_late_pieces,
    };
    Ok((cfg, SimData::new(descriptors, decode_s, cal.clone())?))
}

/// Cores per rank at which a rank's mean decode CPU-seconds per step (`batch` samples of the
/// dataset's mean decode time) take `share` of its mean accelerator step (`c0` plus `batch`
/// samples of the mean sample seconds): the budget `run.cpu_per_accel` names.
fn cores_for_share(
    descriptors: &[crate::descriptor::Descriptor],
    decode_s: &[f64],
    w: &Workload,
    params: &Params,
    batch: f64,
    share: f64,
) -> f64 {
    let profile = w.model.profile();
    let ok: Vec<usize> = (0..descriptors.len()).filter(|&i| descriptors[i].status.is_ok()).collect();
    let n = ok.len().max(1) as f64;
    let decode = ok.iter().map(|&i| decode_s[i]).sum::<f64>() / n;
    let sample = ok
        .iter()
        .map(|&i| {
            let d = &descriptors[i];
            let (f, h, wd) = crate::decode::sample::output_shape(d, params);
            profile.sample_seconds(w.model.formula.count(d.text_tokens, f, h, wd))
        })
        .sum::<f64>()
        / n;
    let accel = profile.c0 + batch * sample;
    (batch * decode / (share * accel)).max(1e-3)
}

/// Observations the loader's accelerator fit keeps at `ranks` ranks (`exec::loader`: eight
/// steps of every rank, at least 64).
pub fn loader_accel_window(ranks: usize) -> usize {
    8 * ranks.max(8)
}

/// The loader's accelerator model before any measurement (`LoaderConfig::new`).
pub fn default_accel_prior() -> AccelModel {
    AccelModel { c0: 0.01, a: 1e-6, b: 0.0 }
}

/// Simulates one policy on a workload.
pub fn run_workload(
    w: &Workload,
    cal: &Calibration,
    policy: Policy,
    over: &Overrides,
) -> Result<SimRun, String> {
    let (cfg, data) = prepare(w, cal, policy, over)?;
    simulate(&cfg, &data).map_err(|e| format!("workload {} under {policy}: {e}", w.name))
}

/// One policy's line in `sim --json` (`shared/CLI.md`), with the planner's cost beside it.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyResult {
    /// Samples per simulated second of the measured steps.
    pub throughput: f64,
    /// Share of (rank, step) with input wait above 1 ms.
    pub miss_rate: f64,
    /// 95th-percentile input wait.
    pub p95_wait_s: f64,
    /// The sound bound's wall time over the measured one (at most 1).
    pub efficiency: f64,
    /// The bound in expectation for a planner that does not see a step's noise, over the
    /// measured wall time (`metrics::Summary::blind_efficiency`).
    pub blind_efficiency: f64,
    /// Share above 10 ms.
    pub miss_rate_10ms: f64,
    /// Rebalances run / skipped.
    pub rebalances_run: u64,
    /// Rebalances skipped.
    pub rebalances_skipped: u64,
    /// Bytes moved between ranks (measured steps).
    pub bytes_moved: u64,
    /// Samples the rebalance moved while the step before trained, off the input-wait path
    /// (every step, warm-up included).
    pub moved_ahead: u64,
    /// Samples the rebalance moved while their step was collected, on the input-wait path.
    pub moved_at_collection: u64,
    /// Mean simulated step seconds (measured steps).
    pub step_s: f64,
    /// Mean wall seconds per plan on this machine.
    pub plan_s_per_step: f64,
    /// Largest plan's wall seconds.
    pub plan_max_s: f64,
    /// Steps whose plan stretched them past the balanced step to the CPUs' pace, warm-up
    /// included (a decode-bound step: the most loaded rank took samples from the others).
    pub stretched_steps: u64,
    /// Steps whose plan left a late rank, warm-up included ([`crate::plan::Plan::late_ranks`]).
    pub late_steps: u64,
    /// Wall seconds of the simulation.
    pub sim_wall_s: f64,
    /// Decode CPU seconds per delivered sample (measured steps).
    pub decode_cpu_s_per_sample: f64,
    /// Decode CPU seconds over the CPU budget's cores, per accelerator second of the ideal
    /// bound: below 1 the budget can keep the accelerators busy; above, every loader is CPU-bound.
    pub cpu_per_accel: f64,
}

impl PolicyResult {
    /// From a run.
    pub fn of(run: &SimRun) -> PolicyResult {
        let s = &run.summary;
        PolicyResult {
            throughput: s.throughput,
            miss_rate: s.miss_rate,
            p95_wait_s: s.p95_wait_s,
            efficiency: s.efficiency,
            blind_efficiency: s.blind_efficiency,
            miss_rate_10ms: s.miss_rate_10ms,
            rebalances_run: s.rebalances_run,
            rebalances_skipped: s.rebalances_skipped,
            bytes_moved: s.bytes_moved,
            moved_ahead: run.moved_ahead,
            moved_at_collection: run.moved_at_collection,
            step_s: if s.steps > 0 { s.wall_s / s.steps as f64 } else { 0.0 },
            plan_s_per_step: run.plan_wall_s / run.plans.max(1) as f64,
            plan_max_s: run.plan_max_s,
            stretched_steps: s.stretched_steps,
            late_steps: s.late_steps,
            sim_wall_s: run.sim_wall_s,
            decode_cpu_s_per_sample: {
                let m = run.records.iter().filter(|r| r.step >= run.warmup);
                let (cpu, n) = m.fold((0.0, 0usize), |(c, n), r| (c + r.decode_cpu_s, n + r.ids.len()));
                cpu / n.max(1) as f64
            },
            cpu_per_accel: s.cpu_bound_s / s.accel_bound_s.max(1e-12),
        }
    }
}

/// `sim --workload --json`.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadResult {
    /// Workload name.
    pub workload: String,
    /// The workload's regime ([`workload::Workload::regime`]).
    pub regime: String,
    /// Ranks simulated.
    pub ranks: usize,
    /// Global batch simulated.
    pub global_batch: usize,
    /// Workers per rank.
    pub workers_per_rank: usize,
    /// Cores per rank of the CPU budget (the workers share them).
    pub cores_per_rank: f64,
    /// Steps (warm-up included).
    pub steps: u64,
    /// Steps decoded ahead, every policy alike (the protocol's prefetch is 2).
    pub lookahead: usize,
    /// Per policy.
    pub policies: std::collections::BTreeMap<String, PolicyResult>,
}

/// Runs `policies` on a workload (in parallel on the machine's threads; results deterministic).
pub fn run_policies(
    w: &Workload,
    cal: &Calibration,
    policies: &[Policy],
    over: &Overrides,
) -> Result<WorkloadResult, String> {
    run_policies_with(w, cal, policies, over, |_, _| Ok(()))
}

/// [`run_policies`], handing each policy's whole run (its per-rank records) to `keep` before it
/// is reduced to its [`PolicyResult`] — `sim --workload --records` writes them out.
pub fn run_policies_with(
    w: &Workload,
    cal: &Calibration,
    policies: &[Policy],
    over: &Overrides,
    mut keep: impl FnMut(Policy, &SimRun) -> Result<(), String>,
) -> Result<WorkloadResult, String> {
    use rayon::prelude::*;
    // One dataset for every policy: only the policy differs between the runs.
    let (cfg, data) = prepare(w, cal, Policy::Helix, over)?;
    let runs: Vec<Result<(Policy, SimRun), String>> = policies
        .par_iter()
        .map(|&p| {
            let cfg = SimConfig { policy: p, ..cfg.clone() };
            simulate(&cfg, &data).map(|r| (p, r)).map_err(|e| format!("workload {} under {p}: {e}", w.name))
        })
        .collect();
    let mut out = WorkloadResult {
        workload: w.name.clone(),
        regime: w.regime.clone(),
        ranks: cfg.ranks(),
        global_batch: cfg.global_batch,
        workers_per_rank: cfg.workers[0] as usize,
        cores_per_rank: cfg.cores[0],
        steps: over.steps.unwrap_or(w.run.steps),
        lookahead: cfg.lookahead,
        policies: Default::default(),
    };
    if let Some(n) = over.workers_per_rank {
        out.workers_per_rank = n;
    }
    for r in runs {
        let (p, run) = r?;
        keep(p, &run)?;
        out.policies.insert(p.name().to_owned(), PolicyResult::of(&run));
    }
    Ok(out)
}

/// The suite's table in the published form.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SuiteSummary {
    /// Geometric mean over workloads of helix throughput / the baseline's.
    pub geomean_speedup_vs: std::collections::BTreeMap<String, f64>,
    /// Mean over workloads of `1 − miss(helix) / miss(rank-local)` (workloads where rank-local
    /// never misses are left out).
    pub mean_miss_reduction_vs_rank_local: f64,
    /// Mean over workloads of `1 − p95(helix) / p95(rank-local)`.
    pub mean_p95_reduction_vs_rank_local: f64,
    /// Workloads where helix's throughput is not above post-balance's.
    pub helix_not_ahead_of_post_balance: Vec<String>,
    /// Geometric mean over workloads of each policy's ideal-bound efficiency: no loader beats the
    /// bound, so helix's speed-up over a baseline is at most 1 / the baseline's efficiency.
    pub geomean_efficiency: std::collections::BTreeMap<String, f64>,
}

/// The suite's table over the workloads of one regime (`sim --suite --json`'s `regimes`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RegimeSummary {
    /// The regime's workloads, in suite order.
    pub workloads: Vec<String>,
    /// Their table, as [`suite_summary`] makes it for the whole suite.
    #[serde(flatten)]
    pub summary: SuiteSummary,
}

fn geomean(logs: &[f64]) -> Option<f64> {
    (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp())
}

/// Aggregates workload results into the suite's table.
pub fn suite_summary(results: &[WorkloadResult]) -> SuiteSummary {
    let mut s = SuiteSummary::default();
    for base in ["rank-local", "actor-pool", "post-balance"] {
        let logs: Vec<f64> = results
            .iter()
            .filter_map(|w| {
                let h = w.policies.get("helix")?.throughput;
                let b = w.policies.get(base)?.throughput;
                (h > 0.0 && b > 0.0).then(|| (h / b).ln())
            })
            .collect();
        if let Some(g) = geomean(&logs) {
            s.geomean_speedup_vs.insert(base.into(), g);
        }
    }
    for p in Policy::ALL {
        let logs: Vec<f64> = results
            .iter()
            .filter_map(|w| w.policies.get(p.name()).map(|r| r.efficiency))
            .filter(|&e| e > 0.0)
            .map(f64::ln)
            .collect();
        if let Some(g) = geomean(&logs) {
            s.geomean_efficiency.insert(p.name().into(), g);
        }
    }
    let mean = |f: &dyn Fn(&PolicyResult) -> f64| {
        let v: Vec<f64> = results
            .iter()
            .filter_map(|w| {
                let (h, b) = (f(w.policies.get("helix")?), f(w.policies.get("rank-local")?));
                (b > 0.0).then(|| 1.0 - h / b)
            })
            .collect();
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    s.mean_miss_reduction_vs_rank_local = mean(&|p| p.miss_rate);
    s.mean_p95_reduction_vs_rank_local = mean(&|p| p.p95_wait_s);
    for w in results {
        if let (Some(h), Some(pb)) = (w.policies.get("helix"), w.policies.get("post-balance")) {
            if h.throughput <= pb.throughput {
                s.helix_not_ahead_of_post_balance.push(w.workload.clone());
            }
        }
    }
    s
}

/// The suite's table per regime: every workload in exactly one regime's table, by its
/// [`WorkloadResult::regime`].
pub fn regime_summaries(results: &[WorkloadResult]) -> std::collections::BTreeMap<String, RegimeSummary> {
    let mut groups: std::collections::BTreeMap<String, Vec<WorkloadResult>> = Default::default();
    for w in results {
        groups.entry(w.regime.clone()).or_default().push(w.clone());
    }
    groups
        .into_iter()
        .map(|(regime, ws)| {
            let workloads = ws.iter().map(|w| w.workload.clone()).collect();
            (regime, RegimeSummary { workloads, summary: suite_summary(&ws) })
        })
        .collect()
}

/// The workload files of a folder (`*.toml`), sorted by name.
pub fn suite_files(dir: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read suite folder {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{} holds no *.toml workloads", dir.display()));
    }
    Ok(files)
}

/// A simulation of a real `datahelix train` run: the dataset's descriptors from its index, decode
/// times from the calibration, R ranks sharing W workers and `cores` cores as the CPU budget
/// divides them, the loader's default transfer model and links of one machine.
#[derive(Clone, Debug)]
pub struct DataRun {
    /// The folder of the dataset's index, when not inside it ([`crate::index::index_file`]).
    pub index_dir: Option<std::path::PathBuf>,
    /// Policy.
    pub policy: Policy,
    /// Ranks.
    pub ranks: usize,
    /// Workers across all ranks.
    pub workers: usize,
    /// Cores the CPU budget divides.
    pub cores: f64,
    /// Global batch.
    pub global_batch: usize,
    /// Steps.
    pub steps: u64,
    /// Warm-up steps.
    pub warmup: u64,
    /// Seed.
    pub seed: u64,
    /// Profile.
    pub profile: Profile,
    /// Per-step hand-over overhead, seconds.
    pub overhead_s: f64,
    /// Factor on every calibrated decode time.
    pub decode_scale: f64,
    /// Steps decoded ahead (`train --lookahead`).
    pub lookahead: usize,
    /// The CPU quota's period, seconds (0: the cores are shared smoothly;
    /// [`engine::CpuPool::with_quota_period`]).
    pub cfs_period_s: f64,
    /// Late ranks ([`SimConfig::late_pieces`]; `train`'s default: on).
    pub late_pieces: bool,
    /// The links between ranks (`None`: one machine's default, 20 µs + 5 GB/s; `sim --links`
    /// gives the bands measured by `datahelix perf alltoallv` on the machine that runs the
    /// real side).
    pub links: Option<crate::plan::TransferCost>,
    /// Whether every planning round agrees on a hash of the plans, as `train` does by default
    /// (`--no-check-plan` turns it off): for the DataLoader-style baselines that makes each
    /// round a collective, so a rank's planning ahead waits for the slowest rank.
    pub check_plan: bool,
}

/// Simulates a `datahelix train` run on an indexed dataset folder.
pub fn run_data(dir: &Path, cal: &Calibration, run: &DataRun) -> Result<SimRun, String> {
    let index = Index::open_in(dir, run.index_dir.as_deref()).map_err(|e| e.to_string())?;
    let params = Params::default();
    let mut descriptors = Vec::with_capacity(index.len());
    for i in 0..index.len() {
        let d = index.get(i).map_err(|e| e.to_string())?;
        if d.status != Status::DuplicateId {
            descriptors.push(d);
        }
    }
    let decode_s = descriptors
        .iter()
        .map(|d| if d.status.is_ok() { cal.decode_s(d, &params, run.seed) } else { Ok(0.0) })
        .map(|s| s.map(|s| s * run.decode_scale))
        .collect::<Result<Vec<f64>, String>>()?;
    if !(run.decode_scale.is_finite() && run.decode_scale > 0.0) {
        return Err(format!("decode scale {} must be a positive number", run.decode_scale));
    }
    let r = run.ranks.max(1);
    // The loader's own share of workers and cores per rank, as `train` gets them.
    let (workers, cores) = crate::exec::loader::budget_per_rank(run.cores, r, run.workers);
    let cfg = SimConfig {
        policy: run.policy,
        workers,
        cores,
        global_batch: run.global_batch,
        steps: run.steps,
        warmup: run.warmup,
        lookahead: run.lookahead,
        seed: run.seed,
        params,
        formula: TokenFormula::Tokens,
        profile: run.profile,
        links: {
            let link = run.links.clone().unwrap_or_else(|| crate::plan::TransferCost::linear(20e-6, 5e9));
            engine::Links { ranks_per_node: r, intra: link.clone(), inter: link }
        },
        planner_transfer: policy::default_transfer(),
        accel_prior: default_accel_prior(),
        step_overhead_s: run.overhead_s,
        accel_window: loader_accel_window(r),
        ship_margin_s: crate::exec::loader::DEFAULT_SHIP_MARGIN_S,
        ship_slack_s: crate::exec::loader::DEFAULT_SHIP_SLACK_S,
        split_above_s: None,
        check_plan: run.check_plan,
        plan_group_ranks: 0,
        keep_plan_inputs: false,
        cfs_period_s: run.cfs_period_s,
        late_pieces: run.late_pieces,
    };
    simulate(&cfg, &SimData::new(descriptors, decode_s, cal.clone())?)
}

/// Loads a workload and its calibration.
pub fn load(path: &Path) -> Result<(Workload, Calibration), String> {
    let w = Workload::load(path)?;
    let cal = Calibration::load(&w.calibration_path())
        .map_err(|e| format!("workload {}: field calibration: {e}", path.display()))?;
    Ok((w, cal))
}
