//! `datahelix train`: an emulated synchronous training run whose input pipeline is DataHelix
//! (or a baseline policy), under `mpirun -np R`. Follows `shared/bench/PROTOCOL.md`; writes its
//! output document (`params`, `records`, `summary`) with `--out`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::{CliError, EXIT_USAGE};
use crate::collective::ReduceOp;
use crate::comm;
use crate::emu::Profile;
use crate::exec::driver::Driver;
use crate::exec::emulated::EmulatedAccelerator;
use crate::exec::loader::{budget_per_rank, LoaderConfig};
use crate::exec::state::LoaderState;
use crate::metrics::trace::{write_trace, RankMeta};
use crate::metrics::{quantile, summarize, usable_cores, RankStep, RunShape, Span, TrainResult};
use crate::policy::Policy;

/// Run emulated training steps and measure the input pipeline (PROTOCOL.md).
#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The dataset folder (indexed with `datahelix index`).
    #[arg(long)]
    pub data: PathBuf,
    /// The folder of the dataset's index, when it cannot live in the dataset folder (read-only
    /// storage); default: `DATAHELIX_INDEX_DIR`, else DIR/.datahelix.
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// rank-local, actor-pool, post-balance, helix-batching, helix-placement or helix.
    #[arg(long, default_value = "helix")]
    pub policy: Policy,
    /// Samples per global batch.
    #[arg(long, default_value_t = 16)]
    pub global_batch: usize,
    /// Decode workers across all ranks (W); each rank gets W / R.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Steps, warm-up included.
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// Warm-up steps (not measured).
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// Seed of the sampler and the accelerator noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Draw the global batches from the dataset's groups (the first folders of its samples'
    /// paths) at these integer weights instead of uniformly: `video=3,image=1`.
    #[arg(long)]
    pub mix: Option<crate::sampler::mix::Mix>,
    /// The hidden model profile c0,a,b,sigma (seconds).
    #[arg(long, default_value = "0.05,2e-5,2e-9,0.05")]
    pub profile: Profile,
    /// Placement policies: decode every sample predicted to take longer than this many seconds
    /// in pieces split at keyframes, late or not (default: only samples that would be late).
    #[arg(long)]
    pub split_above: Option<f64>,
    /// Place decode work within groups of this many consecutive ranks, each rank planning only
    /// its own group's (default: automatic — from 1024 ranks, the nodes of `--transfer-model
    /// measured`, else 8 ranks).
    #[arg(long, default_value_t = 0)]
    pub plan_group_ranks: u32,
    /// Steps decoded ahead of the one in training (prefetch; the protocol allows 2).
    #[arg(long, default_value_t = crate::exec::loader::DEFAULT_LOOKAHEAD)]
    pub lookahead: usize,
    /// Bytes of decoded tensors a rank's pool may hold, MiB.
    #[arg(long, default_value_t = 1024)]
    pub budget_mib: usize,
    /// Seconds one sample's decode may take before it is skipped with a reason (0: no limit).
    #[arg(long, default_value_t = 60.0)]
    pub decode_timeout: f64,
    /// The largest fraction of planned samples that may fail (bad in the index or in decoding)
    /// before the run ends with their ids; at least 10 must fail first (1: no limit).
    #[arg(long, default_value_t = 0.01)]
    pub max_skip_rate: f64,
    /// Do not confine decode workers to per-rank CPU cgroups.
    #[arg(long)]
    pub no_cpu_budget: bool,
    /// Cores the CPU budget divides (default: the machine's).
    #[arg(long, default_value_t = 0.0)]
    pub cores: f64,
    /// All-reduce every plan's hash and fail on a mismatch (the default; 8 bytes a step).
    #[arg(long, overrides_with = "no_check_plan")]
    pub check_plan: bool,
    /// Do not check the plans' hashes.
    #[arg(long, overrides_with = "check_plan")]
    pub no_check_plan: bool,
    /// No late rank: in a step the CPUs cannot keep up with, every piece decoded for another
    /// rank crosses by its batch's collection, so every rank waits alike (`LoaderConfig::
    /// late_pieces`; on by default here, where each batch's next call is the loader's own).
    #[arg(long)]
    pub no_late_pieces: bool,
    /// After the last step, write the loader's state here (rank 0) for `--resume`.
    #[arg(long)]
    pub save_state: Option<PathBuf>,
    /// Continue the run a `--save-state` file describes: its next step is the first trained;
    /// `--steps` stays the total (records carry the global step numbers).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Seconds of the job's own set-up (a model load) between opening the loader and the first
    /// step, emulated by a sleep; the run's clock starts after it.
    #[arg(long, default_value_t = 0.0)]
    pub setup_s: f64,
    /// Call `prepare_ahead` right after opening the loader, so that the first steps decode
    /// during `--setup-s`.
    #[arg(long)]
    pub prepare_at_open: bool,
    /// Groups of this many consecutive ranks (a tensor-parallel group) train on the same
    /// batches, decoded once by the group's first rank and broadcast to the others (on the
    /// run's backend: MPI, or HCCL communicators of the groups' own).
    /// Records and summary are then the data-parallel view: one rank per group (`params.ranks`
    /// counts groups; its accelerator step the slowest of the group's), the other ranks' input
    /// waits under `followers`.
    #[arg(long, default_value_t = 1)]
    pub replica_ranks: usize,
    /// Collective backend: `mpi`, or `hccl` (built with `--features hccl`; tensors move through
    /// HCCL device buffers — on the project's emulator where no Ascend device exists).
    #[arg(long, default_value = "mpi")]
    pub backend: String,
    /// The transfer model of the rebalance gate and placement: `default` (20 µs + 5 GB/s) or
    /// `measured` (a short all-to-all-v sweep at start-up, the same model on every rank).
    #[arg(long, default_value = "default", value_parser = ["default", "measured"])]
    pub transfer_model: String,
    /// Record a checksum of the delivered tensors per rank and step (for comparing backends).
    #[arg(long)]
    pub checksums: bool,
    /// Write the result document here (rank 0).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write a Chrome trace (one process per rank) here.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

fn fail(e: impl std::fmt::Display) -> CliError {
    CliError { code: 3, message: e.to_string() }
}

/// A loader error on one rank of several: said here, then the job ends on every rank at once
/// (the others would otherwise wait in their next collective until the watchdog's timeout, and
/// this rank in MPI's finalisation, with the message unprinted).
fn fail_job(rank: usize, ranks: usize, e: impl std::fmt::Display) -> CliError {
    if ranks > 1 && crate::comm::mpi::raw::is_active() {
        eprintln!(
            "datahelix: rank {rank}: {e}; ending the job on every rank (exit {})",
            crate::comm::EXIT_ABORTED
        );
        crate::comm::mpi::raw::abort(crate::comm::EXIT_ABORTED);
    }
    fail(e)
}

/// Rank 0 reads the state file and broadcasts it (the file need not be on every node); every
/// rank parses the same bytes, so all refuse a bad file together.
fn read_state_on_rank0(
    c: &dyn crate::collective::Collective,
    path: &std::path::Path,
) -> Result<LoaderState, String> {
    let text = if c.rank() == 0 {
        std::fs::read(path).map_err(|e| format!("cannot read the loader state {}: {e}", path.display()))
    } else {
        Ok(Vec::new())
    };
    // Length first (u64::MAX: rank 0 could not read it), then the bytes.
    let too_long = |len: u64| len > crate::exec::state::MAX_BYTES;
    let text = text.and_then(|t| match too_long(t.len() as u64) {
        true => Err(format!(
            "{}: {} bytes is not a loader state (at most {})",
            path.display(),
            t.len(),
            crate::exec::state::MAX_BYTES
        )),
        false => Ok(t),
    });
    let mut len = text.as_ref().map_or(u64::MAX, |t| t.len() as u64).to_le_bytes();
    c.broadcast(0, &mut len).map_err(|e| e.to_string())?;
    let len = u64::from_le_bytes(len);
    if len == u64::MAX || too_long(len) {
        return Err(text.err().unwrap_or_else(|| {
            format!("rank 0 could not read the loader state {}; see its error", path.display())
        }));
    }
    let mut bytes = text.unwrap_or_default();
    bytes.resize(usize::try_from(len).map_err(|_| "the loader state is too large".to_string())?, 0);
    c.broadcast(0, &mut bytes).map_err(|e| e.to_string())?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: not a loader state (not UTF-8 text)", path.display()))?;
    LoaderState::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `datahelix train`.
pub fn run(args: TrainArgs) -> Result<i32, CliError> {
    let backend: comm::Backend = args.backend.parse().map_err(CliError::usage)?;
    if args.warmup >= args.steps {
        return Err(CliError::usage("--warmup must be smaller than --steps"));
    }
    if !(args.setup_s.is_finite() && (0.0..=86_400.0).contains(&args.setup_s)) {
        return Err(CliError::usage(format!("--setup-s {}: expected seconds, 0 to 86400", args.setup_s)));
    }
    let config = comm::Config::from_env().map_err(|e| CliError::usage(e.to_string()))?;
    let world = comm::init_backend(config, backend)
        .map_err(|e| fail(format!("cannot start the {} backend: {e}", args.backend)))?;
    let (rank, world_ranks) = (world.collective().rank(), world.collective().size());
    let group = args.replica_ranks;
    if group == 0 || world_ranks % group != 0 {
        return Err(CliError::usage(format!(
            "--replica-ranks {group}: expected a divisor of the {world_ranks} ranks of the job"
        )));
    }
    // Data-parallel ranks: one per replica group.
    let ranks = world_ranks / group;
    // The cgroups are named after rank 0's pid, shared by broadcast.
    let mut job = (std::process::id() as u64).to_le_bytes();
    world.collective().broadcast(0, &mut job).map_err(fail)?;
    let job = u64::from_le_bytes(job);
    let cores = if args.cores > 0.0 {
        args.cores
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
    };
    let mut cfg = LoaderConfig::new(args.data.clone());
    cfg.index_dir = args.index_dir.clone();
    cfg.policy = args.policy;
    cfg.global_batch = args.global_batch;
    cfg.workers = args.workers;
    cfg.seed = args.seed;
    cfg.mix = args.mix.clone();
    cfg.steps = args.steps;
    cfg.lookahead = args.lookahead;
    cfg.split_above_s = args.split_above;
    cfg.plan_group_ranks = args.plan_group_ranks;
    cfg.budget_bytes = args.budget_mib << 20;
    cfg.decode_timeout = super::decode::timeout(args.decode_timeout);
    if !(args.max_skip_rate.is_finite() && args.max_skip_rate >= 0.0) {
        return Err(CliError::usage(format!(
            "--max-skip-rate {}: expected a fraction, 0 to 1",
            args.max_skip_rate
        )));
    }
    cfg.max_skip_rate = args.max_skip_rate;
    cfg.cpu_budget = !args.no_cpu_budget;
    cfg.cores = cores;
    cfg.job = format!("{job:x}");
    cfg.check_plan = !args.no_check_plan;
    cfg.late_pieces = !args.no_late_pieces;
    cfg.measure_transfer = args.transfer_model == "measured";
    cfg.trace = args.trace.is_some();
    // A bad state and a failed open end every rank together. Each rank says why at once, before
    // the world ends: ending it waits for the other ranks, and a rank that only learned of
    // another's failure and exits first has the launcher stop that rank before it could name
    // its own cause (rank 0's unreadable state file, a dataset folder that is not there).
    let state = match args.resume.as_deref().map(|path| read_state_on_rank0(world.collective(), path)) {
        Some(Err(e)) => {
            eprintln!("datahelix: {e}");
            drop(world);
            return Err(CliError::said(EXIT_USAGE));
        }
        Some(Ok(state)) => Some(state),
        None => None,
    };
    let mut driver = match Driver::open_or_give_back(world, cfg, state.as_ref(), group) {
        Ok(driver) => driver,
        Err((e, world)) => {
            eprintln!("datahelix: {e}");
            drop(world);
            return Err(CliError::said(EXIT_USAGE));
        }
    };
    let first_step = state.as_ref().map_or(0, |s| s.next_step);
    // Rank 0 always decodes (it leads the first replica group).
    let (budget, why) = driver.cpu_budget().unwrap_or(("none", None));
    let (budget, why) = (budget.to_string(), why.map(str::to_string));
    if rank == 0 {
        let groups = if group > 1 {
            format!(" (replica groups of {group}: {world_ranks} ranks in all)")
        } else {
            String::new()
        };
        eprintln!(
            "train: {ranks} ranks{groups}, policy {}, W = {}, G = {}, {} steps ({} warm-up), cpu budget {budget}{}",
            args.policy,
            args.workers,
            args.global_batch,
            args.steps,
            args.warmup,
            why.map(|w| format!(" ({w})")).unwrap_or_default()
        );
    }
    if args.prepare_at_open {
        driver.prepare_ahead().map_err(|e| fail_job(rank, world_ranks, e))?;
    }
    std::thread::sleep(Duration::from_secs_f64(args.setup_s));
    driver.world().barrier().map_err(fail)?;
    let t0 = Instant::now();
    driver.set_epoch(t0);
    let mut records = Vec::with_capacity(args.steps as usize);
    let mut spans: Vec<Span> = Vec::new();
    let mut accel = EmulatedAccelerator::new(args.profile, args.seed, rank);
    for step in first_step..args.steps {
        let start_s = t0.elapsed().as_secs_f64();
        // The library's step driver: the batch, the accelerator's step on it (the loader plans
        // and ships meanwhile), its seconds reported.
        let batch = driver.train_step(&mut accel).map_err(|e| fail_job(rank, world_ranks, e))?;
        let gpu_s = accel.last_seconds();
        let compute_end = t0.elapsed().as_secs_f64();
        let mut grad = [gpu_s];
        driver.world().all_reduce_f64(&mut grad, ReduceOp::Sum).map_err(fail)?;
        let end_s = t0.elapsed().as_secs_f64();
        if args.trace.is_some() {
            let r = rank as u32;
            spans.push(Span {
                rank: r,
                thread: 0,
                cat: "compute".into(),
                name: format!("step {step}"),
                start_s: compute_end - gpu_s,
                dur_s: gpu_s,
            });
            spans.push(Span {
                rank: r,
                thread: 0,
                cat: "wait".into(),
                name: format!("sync {step}"),
                start_s: compute_end,
                dur_s: end_s - compute_end,
            });
        }
        records.push(RankStep {
            rank: rank as u32,
            step,
            input_wait_s: batch.input_wait_s,
            gpu_s,
            ids: batch.samples.iter().map(|s| s.id).collect(),
            skipped: batch.skipped.clone(),
            start_s,
            end_s,
            max_sample_gpu_s: accel.max_sample_seconds(&batch),
            sample_chain_s: Vec::new(),
            sample_gpu_s: accel.sample_seconds(&batch),
            accel: accel.last_terms(),
            decode_cpu_s: batch.decode_cpu_s,
            tokens: batch.samples.iter().map(|s| s.tokens).sum(),
            bytes_in: batch.bytes_in,
            charged_bytes: Some(driver.charged_bytes() as u64),
            tensor_checksum: args.checksums.then(|| {
                batch.samples.iter().fold(0u64, |acc, smp| {
                    let mut h = crate::plan::Fnv::default();
                    h.u64(smp.id).bytes(&smp.data);
                    acc.wrapping_add(h.finish())
                })
            }),
        });
    }
    spans.extend(driver.spans().iter().cloned());
    let counters = driver.counters();
    let stretched_steps = driver.stretched_steps();
    let late_steps = driver.late_steps();
    let transfer_json = driver.transfer().map(|t| transfer_json(&args.transfer_model, t));
    let resumed_models = driver.resumed_json();
    if let (Some(path), 0) = (&args.save_state, rank) {
        driver.state().write(path).map_err(|e| fail_job(rank, world_ranks, e))?;
    }

    // Gather every rank's records (and spans) on every rank; rank 0 writes. The loader stays
    // open until then (its drop closes its communicators, after every rank's last collective).
    let bytes_ahead = driver.replica_bytes().filter(|_| !driver.leads());
    let mine = serde_json::to_vec(&(records, spans, driver.leads(), bytes_ahead)).map_err(fail)?;
    // A rank's records and spans as JSON: a generous bound (a long traced run is tens of MB).
    let all = driver.world().all_gather_v_vec(&mine, 1 << 31).map_err(fail)?;
    if rank != 0 {
        return Ok(0);
    }
    let mut records: Vec<RankStep> = Vec::new();
    let mut follower_records: Vec<RankStep> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    // The followers' batch tensor bytes: [received ahead of their batch, with it].
    let mut follower_bytes = [0u64; 2];
    for block in all {
        type Block = (Vec<RankStep>, Vec<Span>, bool, Option<[u64; 2]>);
        let (r, s, leads, bytes): Block = serde_json::from_slice(&block).map_err(fail)?;
        if let Some(b) = bytes {
            follower_bytes = [0, 1].map(|k| follower_bytes[k] + b[k]);
        }
        if leads {
            // The data-parallel view: the leader of a group is its rank `global / group`.
            records.extend(r.into_iter().map(|x| RankStep { rank: x.rank / group as u32, ..x }));
        } else {
            follower_records.extend(r);
        }
        spans.extend(s);
    }
    records.sort_by_key(|r| (r.step, r.rank));
    let followers_match = batches_match_leaders(&records, &follower_records, group);
    let steps_set_by_followers =
        slowest_member_sets_the_step(&mut records, &follower_records, group, args.warmup);
    let (workers_per_rank, cores_per_rank) = budget_per_rank(cores, ranks, args.workers);
    let usable = usable_cores(&cores_per_rank, &workers_per_rank);
    let shape = RunShape { warmup: args.warmup, ranks, cores: usable, lookahead: args.lookahead as u64 };
    let mut summary = summarize(&records, shape);
    summary.rebalances_run = counters.rebalances_run;
    summary.rebalances_skipped = counters.rebalances_skipped;
    summary.stretched_steps = stretched_steps;
    summary.late_steps = late_steps;
    summary.bytes_moved = records.iter().filter(|r| r.step >= args.warmup).map(|r| r.bytes_in).sum();
    let mut params = json!({
        "policy": args.policy.name(),
        "ranks": ranks,
        "global_batch": args.global_batch,
        "workers": args.workers,
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "profile": args.profile,
        "lookahead": args.lookahead,
        "cpu_budget": budget,
        "cores": cores,
        "backend": args.backend,
        "dataset": args.data.display().to_string(),
        "protocol": crate::sampler::PROTOCOL,
        "transfer": transfer_json,
        "resumed_models": resumed_models,
        "setup_s": args.setup_s,
        "prepare_at_open": args.prepare_at_open,
    });
    if let Some(mix) = &args.mix {
        params["mix"] = json!(mix.to_string());
    }
    if group > 1 {
        params["replica_ranks"] = json!(group);
        params["world_ranks"] = json!(world_ranks);
    }
    let result = TrainResult { params, records, summary };
    if let Some(path) = &args.trace {
        let meta: Vec<RankMeta> = (0..world_ranks as u32)
            .map(|r| RankMeta { rank: r, label: format!("{}", args.policy) })
            .collect();
        write_trace(path, &spans, &meta).map_err(fail)?;
    }
    let mut doc = serde_json::to_value(&result).map_err(fail)?;
    if group > 1 {
        doc["followers"] = followers_json(&follower_records, args.warmup);
        doc["followers"]["steps_set_by_followers"] = json!(steps_set_by_followers);
        doc["followers"]["tensor_bytes_ahead"] = json!(follower_bytes[0]);
        doc["followers"]["tensor_bytes_with_batch"] = json!(follower_bytes[1]);
        doc["followers"]["batches_identical"] = json!(followers_match);
    }
    if args.mix.is_some() {
        doc["drawn_by_group"] = drawn_by_group(&args, &result.records).map_err(fail)?;
    }
    let text = serde_json::to_string_pretty(&doc).map_err(fail)?;
    match &args.out {
        Some(p) => {
            std::fs::write(p, text + "\n").map_err(|e| fail(format!("cannot write {}: {e}", p.display())))?
        }
        None => println!("{text}"),
    }
    let s = &result.summary;
    eprintln!(
        "train: {} — {:.2} samples/s, miss rate {:.3} (10 ms: {:.3}), p95 wait {:.1} ms, efficiency {:.2} (blind to the noise {:.2})",
        args.policy,
        s.throughput,
        s.miss_rate,
        s.miss_rate_10ms,
        s.p95_wait_s * 1e3,
        s.efficiency,
        s.blind_efficiency
    );
    Ok(0)
}

/// A replica group's accelerator step is as long as its slowest rank's (they compute one step
/// together, and the step's gradient sync waits for every rank): each group's record (`records`,
/// ranks numbered by group) takes the longest `gpu_s` among its group's records of that step,
/// with its `accel` terms, so that the bound sees the noise that held the step. Returns how
/// many of the measured group-steps (from `warmup` on) a follower's accelerator set.
/// The samples each group of the dataset gave the run's global batches (delivered or skipped,
/// warm-up included), by group name: what a mix drew, measured.
fn drawn_by_group(args: &TrainArgs, records: &[RankStep]) -> Result<serde_json::Value, String> {
    let index =
        crate::index::Index::open_in(&args.data, args.index_dir.as_deref()).map_err(|e| e.to_string())?;
    let mut group_of = std::collections::HashMap::with_capacity(index.len());
    for i in 0..index.len() {
        let id = index.get(i).map_err(|e| e.to_string())?.id;
        group_of
            .insert(id, crate::sampler::mix::group_of(index.path(i).map_err(|e| e.to_string())?).to_owned());
    }
    let mut drawn: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for id in records.iter().flat_map(|r| r.ids.iter().chain(&r.skipped)) {
        *drawn.entry(group_of.get(id).map_or("(not in the index)", String::as_str)).or_default() += 1;
    }
    Ok(json!(drawn))
}

fn slowest_member_sets_the_step(
    records: &mut [RankStep],
    followers: &[RankStep],
    group: usize,
    warmup: u64,
) -> u64 {
    let mut slowest: std::collections::HashMap<(u32, u64), &RankStep> = std::collections::HashMap::new();
    for f in followers {
        let key = (f.rank / group.max(1) as u32, f.step);
        let best = slowest.entry(key).or_insert(f);
        if f.gpu_s > best.gpu_s {
            *best = f;
        }
    }
    let mut set = 0;
    for r in records.iter_mut() {
        if let Some(f) = slowest.get(&(r.rank, r.step)).filter(|f| f.gpu_s > r.gpu_s) {
            r.gpu_s = f.gpu_s;
            r.accel = f.accel;
            set += u64::from(r.step >= warmup);
        }
    }
    set
}

/// With `--checksums`: whether every follower's batch of every step holds its leader's ids,
/// skipped ids and tensors (by checksum), and every leader's batch reached each of its group's
/// `group - 1` followers; `None` without checksums. `leaders` are numbered by group.
fn batches_match_leaders(leaders: &[RankStep], followers: &[RankStep], group: usize) -> Option<bool> {
    let key = |r: &RankStep| Some((r.ids.clone(), r.skipped.clone(), r.tensor_checksum?));
    let by_step: std::collections::HashMap<(u32, u64), _> =
        leaders.iter().map(|r| ((r.rank, r.step), key(r))).collect();
    let mut matched = 0;
    for f in followers {
        let mine = key(f)?;
        let leader = by_step.get(&(f.rank / group.max(1) as u32, f.step)).cloned().flatten();
        if leader.as_ref() != Some(&mine) {
            return Some(false);
        }
        matched += 1;
    }
    Some(matched == leaders.len() * group.saturating_sub(1))
}

/// The input waits of the replica groups' other ranks over the measured steps (they wait for
/// their leader's broadcast): `ranks`, `miss_rate` (over 1 ms) and `miss_rate_10ms` of their
/// rank-steps, `p95_wait_s`, `max_wait_s`.
fn followers_json(records: &[RankStep], warmup: u64) -> serde_json::Value {
    let mut waits: Vec<f64> = records.iter().filter(|r| r.step >= warmup).map(|r| r.input_wait_s).collect();
    waits.sort_by(f64::total_cmp);
    let mut ranks: Vec<u32> = records.iter().map(|r| r.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let n = waits.len().max(1) as f64;
    json!({
        "ranks": ranks,
        "miss_rate": waits.iter().filter(|&&w| w > 0.001).count() as f64 / n,
        "miss_rate_10ms": waits.iter().filter(|&&w| w > 0.010).count() as f64 / n,
        "p95_wait_s": quantile(&waits, 0.95),
        "max_wait_s": waits.last().copied().unwrap_or(0.0),
    })
}

/// The transfer model the run planned with, as results carry it: `bands` within a node (or
/// between any two ranks), and, where links were measured per class, `inter_node_bands` and
/// `node_of` (each rank's node).
fn transfer_json(model: &str, t: &crate::plan::TransferCost) -> serde_json::Value {
    let bands = |b: &[(u64, f64, f64)]| -> Vec<serde_json::Value> {
        b.iter()
            .map(|&(up_to, alpha, beta)| json!({"up_to_bytes": up_to, "alpha_s": alpha, "beta_bytes_per_s": beta}))
            .collect()
    };
    let mut v = json!({"model": model, "bands": bands(&t.bands)});
    if t.has_classes() {
        v["inter_node_bands"] = json!(bands(&t.inter_node));
        v["node_of"] = json!(t.node_of);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(rank: u32, step: u64, gpu_s: f64) -> RankStep {
        let accel = Some(crate::metrics::AccelTerms { fixed_s: 1.0, work_s: 0.0, noise: gpu_s });
        RankStep { rank, step, gpu_s, accel, ..RankStep::default() }
    }

    /// Groups of 2 (world ranks 0-3; records numbered by group): a follower slower than its
    /// leader sets the group's step, with its noise; a faster one does not; warm-up steps are
    /// raised but not counted.
    #[test]
    fn a_groups_step_is_its_slowest_ranks() {
        let mut records = vec![step(0, 0, 1.0), step(1, 0, 1.0), step(0, 1, 1.0), step(1, 1, 1.3)];
        let followers = [step(1, 0, 1.2), step(3, 0, 0.9), step(1, 1, 1.1), step(3, 1, 1.4)];
        let set = slowest_member_sets_the_step(&mut records, &followers, 2, 1);
        let gpu: Vec<f64> = records.iter().map(|r| r.gpu_s).collect();
        assert_eq!(gpu, [1.2, 1.0, 1.1, 1.4]);
        assert_eq!(records[3].accel.map(|a| a.noise), Some(1.4), "the slowest rank's terms");
        assert_eq!(set, 2, "step 1's two groups, both set by followers");
    }

    /// Followers' batches are checked against their leader's (group index `rank / group`) by
    /// ids, skipped ids and tensor checksum; a missing follower batch is a mismatch too.
    #[test]
    fn followers_batches_are_compared_with_their_leaders() {
        let batch = |rank: u32, step: u64, id: u64, sum: u64| RankStep {
            rank,
            step,
            ids: vec![id],
            tensor_checksum: Some(sum),
            ..RankStep::default()
        };
        let leaders = [batch(0, 0, 1, 10), batch(1, 0, 2, 20)];
        let same = [batch(1, 0, 1, 10), batch(3, 0, 2, 20)];
        assert_eq!(batches_match_leaders(&leaders, &same, 2), Some(true));
        let other_bytes = [batch(1, 0, 1, 10), batch(3, 0, 2, 21)];
        assert_eq!(batches_match_leaders(&leaders, &other_bytes, 2), Some(false));
        let other_ids = [batch(1, 0, 2, 10), batch(3, 0, 2, 20)];
        assert_eq!(batches_match_leaders(&leaders, &other_ids, 2), Some(false));
        assert_eq!(batches_match_leaders(&leaders, &same[..1], 2), Some(false), "a follower's batch missing");
        let unsummed = [RankStep { tensor_checksum: None, ..batch(1, 0, 1, 10) }];
        assert_eq!(batches_match_leaders(&leaders[..1], &unsummed, 2), None);
    }
}
