//! `datahelix plan --synthetic KIND --samples N --ranks R --json`: plan one synthetic step and
//! show what the planner decided and predicted.

use std::time::Instant;

use clap::Args;
use serde::Serialize;

use super::{write_json, CliError};
use crate::comm;
use crate::plan::synthetic::{synthetic, Kind};
use crate::plan::{plan, Batching};

/// Plan a synthetic step and print loads, lower bound, imbalance, predicted misses and timing.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Token distribution of the synthetic batch.
    #[arg(long, value_enum, required_unless_present = "input")]
    pub synthetic: Option<Kind>,
    /// Instead of a synthetic step: a planner input as the loader writes it with
    /// `DATAHELIX_PLAN_DUMP=DIR` (`DIR/step-<t>.json`), planned with placement; `--json` then
    /// prints the whole plan.
    #[arg(long, conflicts_with = "synthetic")]
    pub input: Option<std::path::PathBuf>,
    /// Samples in the global batch of each step.
    #[arg(long, default_value_t = 256)]
    pub samples: usize,
    /// Ranks.
    #[arg(long, default_value_t = 16)]
    pub ranks: usize,
    /// Steps planned ahead.
    #[arg(long, default_value_t = 1)]
    pub lookahead: usize,
    /// Seed of the synthetic draw.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Batching method.
    #[arg(long, value_enum, default_value = "lpt-local-search")]
    pub batching: BatchingArg,
    /// Keep every sample's decode on its owner (no deadline-aware placement).
    #[arg(long)]
    pub no_placement: bool,
    /// Under mpirun: every rank plans and the ranks compare plan hashes (all-reduce); a mismatch
    /// is an error (exit 1). Only rank 0 prints.
    #[arg(long)]
    pub check_plan: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `--batching` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum BatchingArg {
    /// DistributedSampler split.
    Strided,
    /// LPT only.
    Lpt,
    /// LPT + local search.
    LptLocalSearch,
    /// Karmarkar–Karp differencing.
    KarmarkarKarp,
}

impl From<BatchingArg> for Batching {
    fn from(b: BatchingArg) -> Batching {
        match b {
            BatchingArg::Strided => Batching::Strided,
            BatchingArg::Lpt => Batching::Lpt,
            BatchingArg::LptLocalSearch => Batching::LptLocalSearch,
            BatchingArg::KarmarkarKarp => Batching::KarmarkarKarp,
        }
    }
}

#[derive(Serialize)]
struct PlanJson {
    kind: String,
    ranks: usize,
    samples: usize,
    lookahead: usize,
    plan_hash: String,
    loads: Vec<f64>,
    lower_bound: f64,
    imbalance: f64,
    predicted_misses: u64,
    predicted_misses_without_placement: u64,
    lateness_s: f64,
    bytes_moved: u64,
    offloads: u32,
    owner_swaps: u32,
    plan_us: f64,
}

/// Runs `datahelix plan`.
pub fn run(args: PlanArgs) -> Result<i32, CliError> {
    if args.ranks == 0 || args.samples == 0 {
        return Err(CliError::usage("--ranks and --samples must be at least 1"));
    }
    if let Some(path) = &args.input {
        return replan(path, args.json);
    }
    let kind = args.synthetic.ok_or_else(|| CliError::usage("give --synthetic KIND or --input FILE"))?;
    let mut input = synthetic(kind, args.samples, args.ranks, args.lookahead, args.seed);
    input.options.batching = args.batching.into();
    input.options.placement = !args.no_placement;
    let started = Instant::now();
    let p = plan(&input).map_err(|e| CliError::usage(e.to_string()))?;
    let plan_us = started.elapsed().as_secs_f64() * 1e6;
    let mut owner_only = input.clone();
    owner_only.options.placement = false;
    let baseline = plan(&owner_only).map_err(|e| CliError::usage(e.to_string()))?;
    let mut rank = 0;
    if args.check_plan {
        let config = comm::Config::from_env().map_err(|e| CliError::usage(e.to_string()))?;
        let world = comm::init(config).map_err(|e| CliError::usage(format!("cannot start MPI: {e}")))?;
        let c = world.collective();
        rank = c.rank();
        let agreed = c.agree(p.hash).map_err(|e| CliError::usage(e.to_string()))?;
        if !agreed {
            return Err(CliError {
                code: super::EXIT_FAILURES,
                message: format!(
                    "--check-plan: rank {} planned {:016x}, and another rank planned something else; \
                     the ranks' inputs (flags, seed) or builds differ — run the same binary with the same arguments",
                    c.rank(),
                    p.hash
                ),
            });
        }
    }
    if rank != 0 {
        return Ok(0);
    }
    let doc = PlanJson {
        kind: format!("{kind:?}").to_lowercase(),
        ranks: args.ranks,
        samples: args.samples,
        lookahead: args.lookahead,
        plan_hash: format!("{:016x}", p.hash),
        loads: p.first_step_loads(),
        lower_bound: p.lower_bound_s,
        imbalance: p.imbalance,
        predicted_misses: p.predicted_misses,
        predicted_misses_without_placement: baseline.predicted_misses,
        lateness_s: p.lateness_s,
        bytes_moved: p.bytes_moved,
        offloads: p.offloads,
        owner_swaps: p.swaps,
        plan_us,
    };
    if args.json {
        write_json(&doc, None)?;
    } else {
        let max = doc.loads.iter().copied().fold(0.0, f64::max);
        println!("{} samples x {} ranks ({}), lookahead {}", doc.samples, doc.ranks, doc.kind, doc.lookahead);
        println!(
            "largest step     {:.4} s   lower bound {:.4} s   imbalance {:.3}",
            max, doc.lower_bound, doc.imbalance
        );
        println!(
            "predicted misses {} (owner-only decode: {})   offloads {}   owner swaps {}   {:.1} MiB moved",
            doc.predicted_misses,
            doc.predicted_misses_without_placement,
            doc.offloads,
            doc.owner_swaps,
            doc.bytes_moved as f64 / (1 << 20) as f64
        );
        println!("plan hash        {}   planned in {:.0} us", doc.plan_hash, doc.plan_us);
    }
    Ok(0)
}

/// Plans a dumped input with placement and prints the plan (all of it with `json`).
fn replan(path: &std::path::Path, json: bool) -> Result<i32, CliError> {
    let bytes =
        std::fs::read(path).map_err(|e| CliError::usage(format!("cannot read {}: {e}", path.display())))?;
    let mut input: crate::plan::PlanInput = serde_json::from_slice(&bytes).map_err(|e| {
        CliError::usage(format!(
            "{} is not a planner input (DATAHELIX_PLAN_DUMP writes them): {e}",
            path.display()
        ))
    })?;
    input.options.placement = true;
    let p = plan(&input).map_err(|e| CliError::usage(format!("{}: {e}", path.display())))?;
    if json {
        write_json(&p, None)?;
        return Ok(0);
    }
    println!(
        "{}: plan {:016x}, {} predicted misses, lateness {:.3} s",
        path.display(),
        p.hash,
        p.predicted_misses,
        p.lateness_s
    );
    for b in &p.batches {
        println!(
            "step {} rank {}: {} samples, accelerator {:.3} s, deadline {:.3} s, ready {:.3} s",
            b.step, b.rank, b.samples, b.accel_s, b.deadline_s, b.ready_s
        );
    }
    Ok(0)
}
