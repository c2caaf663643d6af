//! `datahelix sim`: the simulator at scale (`--workload FILE`, `--suite DIR`) or configured like a
//! real `datahelix train` run on an indexed dataset (`--data DIR`).

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::{write_json, CliError};
use crate::emu::Profile;
use crate::policy::Policy;
use crate::sim::{self, workload::Calibration, DataRun, Overrides, PolicyResult, WorkloadResult};

/// Simulate policies on workloads (see shared/CLI.md).
#[derive(Debug, Args)]
pub struct SimArgs {
    /// A workload file (TOML).
    #[arg(long, conflicts_with_all = ["suite", "data"])]
    pub workload: Option<PathBuf>,
    /// A folder of workload files: the suite's table.
    #[arg(long, conflicts_with = "data")]
    pub suite: Option<PathBuf>,
    /// An indexed dataset folder: simulate a `datahelix train` run on it (validation).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The folder of the dataset's index, when it cannot live in the dataset folder (read-only
    /// storage); default: `DATAHELIX_INDEX_DIR`, else the dataset's .datahelix.
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Ranks (workloads: the global batch scales with them; suite default 8).
    #[arg(long)]
    pub ranks: Option<usize>,
    /// Decode workers per rank (workloads).
    #[arg(long)]
    pub workers_per_rank: Option<usize>,
    /// Workloads: the CPU budget as a share of the accelerator — cores per rank such that the
    /// mean decode CPU of a step takes this share of the mean balanced accelerator step
    /// (replaces the files' `run.cores_per_rank` / `run.cpu_per_accel`).
    #[arg(long)]
    pub cpu_per_accel: Option<f64>,
    /// Workloads: place decode work within groups of this many consecutive ranks (helix;
    /// default: automatic, groups of 8 from 1024 ranks — what `train --plan-group-ranks` sets).
    #[arg(long)]
    pub plan_group_ranks: Option<u32>,
    /// Steps decoded ahead of the one in training, every policy alike (the DataLoader's prefetch;
    /// the protocol allows 2; default: the workload file's `run.lookahead`, else 2).
    #[arg(long)]
    pub lookahead: Option<usize>,
    /// Give each rank's cores as the kernel's CFS quota does, in periods of this many
    /// milliseconds, 1 to 1000 (the loader's CPU group uses 100): a rank's workers run at a core
    /// each until the period's share is spent, then wait for the next period. Default: shared
    /// smoothly.
    #[arg(long)]
    pub cfs_period_ms: Option<f64>,
    /// No late rank: every piece decoded for another rank crosses at or before its batch's
    /// collection, as before late ranks (`train --no-late-pieces`).
    #[arg(long)]
    pub no_late_pieces: bool,
    /// A policy or `all`.
    #[arg(long, default_value = "all")]
    pub policy: String,
    /// Steps, warm-up included.
    #[arg(long)]
    pub steps: Option<u64>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// `--data`: the model profile c0,a,b,sigma.
    #[arg(long, default_value = "0.05,2e-5,2e-9,0.05")]
    pub profile: Profile,
    /// `--data`: decode workers across all ranks.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// `--data`: cores the CPU budget divides.
    #[arg(long, default_value_t = 2.0)]
    pub cores: f64,
    /// `--data`: samples per global batch.
    #[arg(long, default_value_t = 16)]
    pub global_batch: usize,
    /// `--data`: warm-up steps.
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// `--data`: per-step input hand-over overhead of the real loader, seconds.
    #[arg(long, default_value_t = 0.0)]
    pub overhead_s: f64,
    /// `--data`: plan without agreeing on a hash of the plans each round, like `train
    /// --no-check-plan` (by default the simulated loader checks, as `train` does).
    #[arg(long)]
    pub no_check_plan: bool,
    /// `--data`: the decode-cost calibration (`datahelix calibrate --json` output).
    #[arg(long, default_value = "scripts/workloads/calibration.json")]
    pub calibration: PathBuf,
    /// `--data`: multiplies every calibrated decode time (a machine whose budgeted pools spend more
    /// CPU per decode than a calibration does; `scripts/sim_validate.sh` measures it).
    #[arg(long, default_value_t = 1.0)]
    pub decode_scale: f64,
    /// Observations the accelerator fit keeps (default: the loader's, 8 × max(R, 8)).
    #[arg(long)]
    pub accel_window: Option<usize>,
    /// Print one JSON document.
    #[arg(long)]
    pub json: bool,
    /// Write the JSON document here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// `--data`: the links between ranks, measured: the JSON of `mpirun -np R datahelix perf
    /// alltoallv --json` on the machine that runs the real side (default: 20 µs + 5 GB/s).
    #[arg(long, value_name = "PERF_JSON")]
    pub links: Option<PathBuf>,
    /// `--data` or `--workload`: write each policy's per-rank step records to
    /// `DIR/sim-<policy>.json`, in the shape of `train --out` (`{"records": [...], "summary":
    /// {...}}`), to compare step by step or recompute the bound.
    #[arg(long, value_name = "DIR")]
    pub records: Option<PathBuf>,
}

fn policies(arg: &str) -> Result<Vec<Policy>, CliError> {
    if arg == "all" {
        return Ok(Policy::ALL.to_vec());
    }
    arg.split(',').map(|p| p.trim().parse::<Policy>().map_err(CliError::usage)).collect()
}

fn print_workload(w: &WorkloadResult) {
    println!(
        "{} ({}) — {} ranks, global batch {}, {} workers/rank on {:.2} cores, {} steps, lookahead {}",
        w.workload,
        w.regime,
        w.ranks,
        w.global_batch,
        w.workers_per_rank,
        w.cores_per_rank,
        w.steps,
        w.lookahead
    );
    println!(
        "  {:<16} {:>12} {:>9} {:>11} {:>10} {:>10} {:>11}",
        "policy", "samples/s", "miss", "p95 wait", "effic.", "step", "plan/step"
    );
    for p in Policy::ALL {
        if let Some(r) = w.policies.get(p.name()) {
            println!(
                "  {:<16} {:>12.2} {:>9.3} {:>9.1}ms {:>10.2} {:>8.3}s {:>9.2}ms",
                p.name(),
                r.throughput,
                r.miss_rate,
                r.p95_wait_s * 1e3,
                r.efficiency,
                r.step_s,
                r.plan_s_per_step * 1e3
            );
        }
    }
}

fn print_summary(s: &sim::SuiteSummary) {
    for (base, x) in &s.geomean_speedup_vs {
        println!("  helix vs {base:<13} {x:.2}× (geometric mean throughput)");
    }
    println!("  mean miss-rate reduction vs rank-local  {:.1}%", s.mean_miss_reduction_vs_rank_local * 100.0);
    println!("  mean p95-wait reduction vs rank-local   {:.1}%", s.mean_p95_reduction_vs_rank_local * 100.0);
    if let (Some(h), Some(r)) = (s.geomean_efficiency.get("helix"), s.geomean_efficiency.get("rank-local")) {
        println!("  efficiency (geometric mean)             helix {h:.2}, rank-local {r:.2}");
    }
    if !s.helix_not_ahead_of_post_balance.is_empty() {
        println!("  helix not ahead of post-balance on: {}", s.helix_not_ahead_of_post_balance.join(", "));
    }
}

/// Writes one policy's records to `dir/sim-<policy>.json` (`--records`).
fn write_records(dir: &std::path::Path, p: Policy, run: &sim::SimRun) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| CliError::usage(format!("--records {}: {e}", dir.display())))?;
    let doc = json!({ "records": run.records, "summary": run.summary });
    write_json(&doc, Some(&dir.join(format!("sim-{}.json", p.name()))))
}

/// Runs `datahelix sim`.
pub fn run(args: SimArgs) -> Result<i32, CliError> {
    let pols = policies(&args.policy)?;
    if let Some(ms) = args.cfs_period_ms {
        if !(1.0..=1000.0).contains(&ms) {
            return Err(CliError::usage(format!(
                "--cfs-period-ms {ms}: expected 1 to 1000 milliseconds, the periods the kernel accepts \
                 (its default and the loader's is 100)"
            )));
        }
    }
    let over = Overrides {
        ranks: args.ranks,
        workers_per_rank: args.workers_per_rank,
        steps: args.steps,
        seed: args.seed,
        accel_window: args.accel_window,
        cpu_per_accel: args.cpu_per_accel,
        plan_group_ranks: args.plan_group_ranks,
        lookahead: args.lookahead,
        cfs_period_s: args.cfs_period_ms.map(|ms| ms / 1e3),
        no_late_pieces: args.no_late_pieces,
    };
    let emit = |doc: &serde_json::Value| -> Result<(), CliError> {
        if args.json || args.out.is_some() {
            write_json(doc, args.out.as_deref())?;
        }
        Ok(())
    };
    if let Some(file) = &args.workload {
        let (w, cal) = sim::load(file).map_err(CliError::usage)?;
        let res = sim::run_policies_with(&w, &cal, &pols, &over, |p, run| match &args.records {
            Some(dir) => write_records(dir, p, run).map_err(|e| e.message),
            None => Ok(()),
        })
        .map_err(CliError::usage)?;
        if !args.json {
            print_workload(&res);
        }
        emit(&serde_json::to_value(&res).map_err(|e| CliError::usage(e.to_string()))?)?;
        return Ok(0);
    }
    if let Some(dir) = &args.suite {
        let over = Overrides { ranks: Some(args.ranks.unwrap_or(8)), ..over };
        let mut results = Vec::new();
        for file in sim::suite_files(dir).map_err(CliError::usage)? {
            let (w, cal) = sim::load(&file).map_err(CliError::usage)?;
            let res = sim::run_policies(&w, &cal, &pols, &over).map_err(CliError::usage)?;
            if !args.json {
                print_workload(&res);
            } else {
                eprintln!("sim: {} done", res.workload);
            }
            results.push(res);
        }
        let suite = sim::suite_summary(&results);
        let regimes = sim::regime_summaries(&results);
        if !args.json {
            println!("suite ({} workloads):", results.len());
            print_summary(&suite);
            println!(
                "  {:<20} {:>3} {:>10} {:>10} {:>12} {:>8} {:>9} {:>9}",
                "regime", "n", "vs r-local", "vs a-pool", "vs post-bal", "miss red", "eff helix", "eff r-loc"
            );
            for (name, r) in &regimes {
                let x =
                    |k: &str| r.summary.geomean_speedup_vs.get(k).map_or("-".into(), |x| format!("{x:.2}×"));
                let e =
                    |k: &str| r.summary.geomean_efficiency.get(k).map_or("-".into(), |x| format!("{x:.2}"));
                println!(
                    "  {:<20} {:>3} {:>10} {:>10} {:>12} {:>7.1}% {:>9} {:>9}",
                    name,
                    r.workloads.len(),
                    x("rank-local"),
                    x("actor-pool"),
                    x("post-balance"),
                    r.summary.mean_miss_reduction_vs_rank_local * 100.0,
                    e("helix"),
                    e("rank-local")
                );
            }
        }
        emit(&json!({ "workloads": results, "suite": suite, "regimes": regimes }))?;
        return Ok(0);
    }
    if let Some(dir) = &args.data {
        let cal = Calibration::load(&args.calibration).map_err(CliError::usage)?;
        let ranks = args.ranks.unwrap_or(2);
        let steps = args.steps.unwrap_or(20);
        if args.warmup >= steps {
            return Err(CliError::usage("--warmup must be smaller than --steps"));
        }
        let links = match &args.links {
            None => None,
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| CliError::usage(format!("--links {}: {e}", path.display())))?;
                let model = crate::collective::cost::TransferModel::from_perf_json(&text)
                    .map_err(|e| CliError::usage(format!("--links {}: {e}", path.display())))?;
                Some(crate::plan::TransferCost::from(&model))
            }
        };
        let mut out = serde_json::Map::new();
        for &p in &pols {
            let run = DataRun {
                index_dir: args.index_dir.clone(),
                links: links.clone(),
                policy: p,
                ranks,
                workers: args.workers,
                cores: args.cores,
                global_batch: args.global_batch,
                steps,
                warmup: args.warmup,
                seed: args.seed.unwrap_or(0),
                profile: args.profile,
                overhead_s: args.overhead_s,
                check_plan: !args.no_check_plan,
                decode_scale: args.decode_scale,
                lookahead: args.lookahead.unwrap_or(crate::exec::loader::DEFAULT_LOOKAHEAD),
                cfs_period_s: args.cfs_period_ms.map_or(0.0, |ms| ms / 1e3),
                late_pieces: !args.no_late_pieces,
            };
            let r = sim::run_data(dir, &cal, &run).map_err(CliError::usage)?;
            let pr = PolicyResult::of(&r);
            if let Some(dir) = &args.records {
                write_records(dir, p, &r)?;
            }
            if !args.json {
                println!(
                    "{:<16} {:>10.2} samples/s  miss {:.3}  p95 wait {:.1} ms  efficiency {:.2} (blind to the noise {:.2})",
                    p.name(),
                    pr.throughput,
                    pr.miss_rate,
                    pr.p95_wait_s * 1e3,
                    pr.efficiency,
                    pr.blind_efficiency
                );
            }
            out.insert(
                p.name().into(),
                serde_json::to_value(&pr).map_err(|e| CliError::usage(e.to_string()))?,
            );
        }
        emit(&json!({ "workload": dir.display().to_string(), "ranks": ranks, "policies": out }))?;
        return Ok(0);
    }
    Err(CliError::usage("sim needs --workload FILE, --suite DIR or --data DIR"))
}
