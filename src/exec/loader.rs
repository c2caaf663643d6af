//! The per-rank executor: a [`Loader`] yields each step's [`Batch`] of decoded tensors, planned
//! by the chosen [`Policy`] identically on every rank.
//!
//! Each call of [`Loader::next_batch`] (right after the training step's gradient sync):
//!
//! 1. all-gathers every rank's fixed-size step record (measured step time, tokens, queued decode
//!    work, decode timings, failed samples) and feeds the cost models in rank order, so every
//!    rank holds the same models;
//! 2. plans the steps up to `lookahead` beyond this one that are not planned yet and submits this rank's
//!    decode jobs to its worker pool in plan order (the pool runs while the accelerator works);
//! 3. waits for this rank's decodes of the current step, then moves tensors decoded for other
//!    ranks in one all-to-all-v (only when the plan moves any — every rank knows from the plan);
//! 4. applies the policy's after-decode step (post-decode token balancing, or DataHelix's
//!    cost-gated rebalance), again with one all-to-all-v only when it runs;
//! 5. returns the batch. [`Loader::report_step`] then takes the step's accelerator seconds.
//!
//! ```no_run
//! use datahelix::comm::{self, Config};
//! use datahelix::exec::loader::{Loader, LoaderConfig};
//!
//! let world = comm::init(Config::from_env()?)?;
//! let mut loader = Loader::new(world.collective(), LoaderConfig::new("data/tiny".into()))?;
//! for _ in 0..10 {
//!     let batch = loader.next_batch()?;
//!     let gpu_s = 0.1; // train on batch.samples here
//!     loader.report_step(gpu_s, &batch);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;

mod shipping;

use crate::collective::{Collective, CollectiveError};
use crate::cost::accel::{AccelFit, AccelModel, TokenFormula};
use crate::decode::cost::{CostModel, Features};
use crate::decode::pool::{Job, Mode, Output, Pool, PoolConfig, Tensor};
use crate::decode::sample::{output_shape, Params};
use crate::decode::split::FrameRange;
use crate::descriptor::{Codec, Descriptor};
use crate::exec::cgroup::CpuGroup;
use crate::exec::exchange::{self, Piece};
use crate::index::{Index, IndexError};
use crate::metrics::Span;
use crate::plan::rebalance::{self, Decoded};
use crate::plan::record::{DecodeObservation, StepRecord};
use crate::plan::{PlanInput, PlanOptions, RankState, TransferCost};
use crate::policy::pieces::{OfferContext, StepOffer};
use crate::policy::{self, AfterDecode, Policy, StepPlan};
use crate::sampler::Sampler;

/// How to load.
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    /// The dataset folder (indexed).
    pub data: PathBuf,
    /// The policy.
    pub policy: Policy,
    /// Samples per global batch.
    pub global_batch: usize,
    /// Decode workers across all ranks (W); each rank gets W / R (the remainder to low ranks).
    pub workers: usize,
    /// Sampler seed.
    pub seed: u64,
    /// Steps the run will take (nothing is planned beyond).
    pub steps: u64,
    /// Steps decoded ahead of the one in training (the DataLoader's prefetch: while step `s`
    /// trains, steps `s+1 … s+lookahead` decode; 2 by default, the protocol's limit).
    pub lookahead: usize,
    /// Preprocessing.
    pub params: Params,
    /// Bytes of decoded tensors a rank may hold in its pool.
    pub budget_bytes: usize,
    /// Enforce the per-rank CPU budget with a cgroup.
    pub cpu_budget: bool,
    /// Cores of the machine the budget divides (0: all online cores).
    pub cores: f64,
    /// Names the cgroups (`datahelix-<job>-r<rank>`).
    pub job: String,
    /// Tokens or latents.
    pub token_formula: TokenFormula,
    /// The accelerator model before any measurement.
    pub accel_prior: AccelModel,
    /// The transfer model.
    pub transfer: TransferCost,
    /// All-reduce every plan's hash and fail on a mismatch.
    pub check_plan: bool,
    /// Keep trace spans.
    pub trace: bool,
    /// Decode every sample predicted longer than this in pieces (placement policies), late or
    /// not; `None`: only samples that one worker could not finish before their batch is due.
    pub split_above_s: Option<f64>,
    /// How long before its accelerator's step ends a rank calls [`Loader::ship_ahead`]: the
    /// time a tensor has to cross to its owner off the input-wait path.
    pub ship_margin_s: f64,
    /// How long before the step ends [`Loader::ship_ahead`] stops waiting for tensors still
    /// decoding for other ranks and sends them: the planner's last exchange before a deadline.
    pub ship_slack_s: f64,
}

/// [`LoaderConfig::ship_margin_s`]'s default: 100 ms, ample for a few MiB on one machine.
pub const DEFAULT_SHIP_MARGIN_S: f64 = 0.1;

/// [`LoaderConfig::ship_slack_s`]'s default: 30 ms, several times a decoded clip's crossing
/// between ranks of one machine (5–13 ms measured for 10–30 MiB on the development machine).
pub const DEFAULT_SHIP_SLACK_S: f64 = 0.03;

impl LoaderConfig {
    /// Defaults for a dataset folder: helix, G = 16, W = 4, 2 steps ahead.
    pub fn new(data: PathBuf) -> LoaderConfig {
        LoaderConfig {
            data,
            policy: Policy::Helix,
            global_batch: 16,
            workers: 4,
            seed: 0,
            steps: u64::MAX,
            lookahead: 2,
            params: Params::default(),
            budget_bytes: 512 << 20,
            cpu_budget: false,
            cores: 0.0,
            job: format!("{}", std::process::id()),
            token_formula: TokenFormula::Tokens,
            accel_prior: AccelModel { c0: 0.01, a: 1e-6, b: 0.0 },
            transfer: policy::default_transfer(),
            check_plan: false,
            trace: false,
            split_above_s: None,
            ship_margin_s: DEFAULT_SHIP_MARGIN_S,
            ship_slack_s: DEFAULT_SHIP_SLACK_S,
        }
    }
}

/// Why loading stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The index could not be used.
    #[error("{0}")]
    Index(#[from] IndexError),
    /// A collective failed (the watchdog names which).
    #[error("{0}")]
    Collective(#[from] CollectiveError),
    /// Something else that makes the run meaningless, with what to do.
    #[error("{0}")]
    Invalid(String),
}

/// Bytes of one decoded tensor, pooled or received.
pub enum TensorData {
    /// In a buffer of this rank's pool (returned when dropped).
    Pooled(Tensor),
    /// Received from another rank.
    Owned(Vec<u8>),
}

impl std::ops::Deref for TensorData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            TensorData::Pooled(t) => t,
            TensorData::Owned(v) => v,
        }
    }
}

/// One delivered sample.
pub struct Sample {
    /// Sample id.
    pub id: u64,
    /// `[F, H', W', 3]`, uint8.
    pub shape: [usize; 4],
    /// Tokens (from the decoded shape and the manifest's text tokens).
    pub tokens: u64,
    /// Packed RGB24 bytes.
    pub data: TensorData,
}

/// A step's batch on this rank.
pub struct Batch {
    /// Step.
    pub step: u64,
    /// Delivered samples, in batch order.
    pub samples: Vec<Sample>,
    /// Ids of this rank's samples that failed (bad in the index or in decoding).
    pub skipped: Vec<u64>,
    /// Seconds `next_batch` waited.
    pub input_wait_s: f64,
    /// CPU seconds this rank's workers spent on samples of this step.
    pub decode_cpu_s: f64,
    /// Bytes of tensors received from other ranks for this step.
    pub bytes_in: u64,
}

/// The two exchanges of a step's tensors (see [`Loader::ship`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Exchange {
    /// What is decoded already, as the step is collected.
    Ready,
    /// Everything left of the step, and what of the next is decoded already.
    Rest,
}

/// One decoded job's output on its way into a sample: the whole sample, or one of its pieces.
struct Part {
    slot: usize,
    part: u16,
    out: Result<([usize; 4], TensorData), u64>,
}

/// What one sample of a planned step is.
#[derive(Clone, Copy)]
struct Slot {
    id: u64,
    pos: Option<usize>,
    desc: Option<Descriptor>,
    ok: bool,
}

struct Planned {
    slots: Vec<Slot>,
    /// Index into `slots` of each planner sample (the usable ones).
    usable: Vec<usize>,
    /// Per usable sample: predicted tokens and tensor bytes (exact under the protocol's
    /// preprocessing, which fixes the output shape from the header).
    predicted: Vec<(u64, u64)>,
    /// Per decode job of the plan: the sampled frames it decodes (the whole range for a sample
    /// decoded in one piece).
    ranges: Vec<FrameRange>,
    plan: StepPlan,
}

impl Planned {
    /// The batch slot of decode job `j`'s sample.
    fn slot_of(&self, j: usize) -> usize {
        self.usable[self.plan.jobs[j].sample as usize]
    }

    /// The rank that trains decode job `j`'s sample.
    fn owner_of(&self, j: usize) -> usize {
        self.plan.owner[self.plan.jobs[j].sample as usize] as usize
    }
}

/// The executor of one rank.
pub struct Loader<'w> {
    world: &'w dyn Collective,
    cfg: LoaderConfig,
    index: Index,
    sampler: Sampler,
    pool: Pool,
    group: CpuGroup,
    workers_here: u32,
    /// One decode worker's CPU under the budget, thousandths of a core (0: not limited).
    worker_millicores: u32,
    /// Where rank 0 writes every planner input (`DATAHELIX_PLAN_DUMP`).
    plan_dump: Option<PathBuf>,
    decode_model: CostModel,
    accel: AccelFit,
    plans: BTreeMap<u64, Planned>,
    done: HashMap<(u64, usize), crate::decode::pool::Outcome>,
    outstanding: HashMap<(u64, usize), f64>,
    record: StepRecord,
    /// What every rank reported at the last all-gather.
    ranks: Vec<RankState>,
    /// zstd (ratio, bytes/s) measured here; and the average over ranks (what decisions use).
    zstd: (f64, f64),
    zstd_shared: (f64, f64),
    /// Tensors offered to [`Loader::measure_zstd`] so far.
    zstd_seen: u64,
    cpu_by_step: HashMap<u64, f64>,
    next_step: u64,
    /// `Some(s)` when [`Loader::prepare_ahead`] already planned what `next_batch` of step `s`
    /// would.
    prepared: Option<u64>,
    /// The step handed over last and its predicted accelerator seconds.
    training: Option<(u64, f64)>,
    /// How much longer than this rank's the slowest rank's step of it is predicted to take.
    behind_slowest_s: f64,
    /// Decode jobs `(step, job)` whose tensors this rank sent, and those it received.
    sent: HashSet<(u64, usize)>,
    got: HashSet<(u64, usize)>,
    /// Parts received ahead of their step (shipped while the step before trained), and bytes.
    early: HashMap<u64, Vec<Part>>,
    early_bytes: HashMap<u64, u64>,
    /// Split samples of a step put together ahead of its collection: the samples, the ids of
    /// those that failed, and their batch slots.
    assembled: HashMap<u64, (Vec<(usize, Sample)>, Vec<u64>, Vec<usize>)>,
    /// The last step whose [`Exchange::Rest`] ran.
    rest_done: Option<u64>,
    /// Whether the caller calls [`Loader::prepare_ahead`] (from its first call on).
    prepares: bool,
    /// Whether the caller runs [`Loader::ship_ahead`] each step (set at its first call).
    ships_ahead: bool,
    started: Instant,
    spans: Vec<Span>,
    /// Rebalances run / skipped, bytes moved between ranks (this rank's receipts).
    pub counters: Counters,
}

/// Run-level counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// After-decode rebalances run.
    pub rebalances_run: u64,
    /// After-decode rebalances the gate (or threshold) skipped.
    pub rebalances_skipped: u64,
    /// Bytes this rank received from other ranks.
    pub bytes_in: u64,
    /// Plans whose predicted misses were non-zero.
    pub predicted_misses: u64,
}

/// Writes step `t`'s planner input to `DIR/step-<t>.json`, `DIR` from `DATAHELIX_PLAN_DUMP`
/// (`datahelix plan --input` replans it): the plan is a function of it alone.
fn dump_plan_input(dir: &std::path::Path, t: u64, input: &PlanInput) {
    let path = dir.join(format!("step-{t}.json"));
    let written = std::fs::create_dir_all(&dir)
        .map_err(|e| e.to_string())
        .and_then(|()| serde_json::to_vec_pretty(input).map_err(|e| e.to_string()))
        .and_then(|bytes| std::fs::write(&path, bytes).map_err(|e| e.to_string()));
    if let Err(e) = written {
        tracing::warn!("DATAHELIX_PLAN_DUMP: cannot write {}: {e}", path.display());
    }
}

fn workers_of(rank: usize, ranks: usize, total: usize) -> u32 {
    (total / ranks + usize::from(rank < total % ranks)).max(1) as u32
}

impl<'w> Loader<'w> {
    /// Opens the index, starts this rank's decode workers (inside its CPU cgroup when asked).
    pub fn new(world: &'w dyn Collective, cfg: LoaderConfig) -> Result<Loader<'w>, ExecError> {
        let index = Index::open(&cfg.data)?;
        if cfg.global_batch == 0 || cfg.workers == 0 || cfg.lookahead == 0 {
            return Err(ExecError::Invalid("global batch, workers and lookahead must be at least 1".into()));
        }
        let (rank, ranks) = (world.rank(), world.size());
        let mut ids = Vec::with_capacity(index.len());
        for i in 0..index.len() {
            let d = index.get(i)?;
            if d.status != crate::descriptor::Status::DuplicateId {
                ids.push(d.id);
            }
        }
        if ids.is_empty() {
            return Err(ExecError::Invalid(format!(
                "{} holds no samples; run `datahelix index` on a dataset",
                cfg.data.display()
            )));
        }
        let workers_here = workers_of(rank, ranks, cfg.workers);
        let cores = if cfg.cores > 0.0 {
            cfg.cores
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
        };
        let group = if cfg.cpu_budget {
            CpuGroup::create(&cfg.job, rank, cores * workers_here as f64 / cfg.workers as f64)
        } else {
            CpuGroup::none("not asked for (--no-cpu-budget)")
        };
        group.enter_current_thread();
        let pool = Pool::new(PoolConfig {
            workers: workers_here as usize,
            budget_bytes: cfg.budget_bytes,
            params: cfg.params,
        });
        group.leave_current_thread();
        // One worker's share of a core under the budget, for the decode priors (all-gathered:
        // every rank's model starts from the same one).
        let worker_millicores = if group.status() == "enforced" {
            (1000.0 * cores / cfg.workers as f64).round().clamp(1.0, 1000.0) as u32
        } else {
            0
        };
        let record = StepRecord {
            rank: rank as u32,
            workers: workers_here,
            worker_millicores,
            ..StepRecord::default()
        };
        Ok(Loader {
            world,
            sampler: Sampler::new(&ids, cfg.seed),
            // Several steps of every rank's observations: one step's near-equal sums alone leave
            // the fit ill-conditioned at many ranks.
            accel: AccelFit::new(cfg.accel_prior, 8 * world.size().max(8)),
            cfg,
            index,
            pool,
            group,
            workers_here,
            worker_millicores,
            plan_dump: std::env::var_os("DATAHELIX_PLAN_DUMP").map(PathBuf::from),
            decode_model: CostModel::default(),
            plans: BTreeMap::new(),
            done: HashMap::new(),
            outstanding: HashMap::new(),
            record,
            ranks: Vec::new(),
            zstd: (0.0, 0.0),
            zstd_shared: (0.0, 0.0),
            zstd_seen: 0,
            cpu_by_step: HashMap::new(),
            next_step: 0,
            prepared: None,
            training: None,
            behind_slowest_s: 0.0,
            sent: HashSet::new(),
            got: HashSet::new(),
            early: HashMap::new(),
            early_bytes: HashMap::new(),
            assembled: HashMap::new(),
            rest_done: None,
            prepares: false,
            ships_ahead: false,
            started: Instant::now(),
            spans: Vec::new(),
            counters: Counters::default(),
        })
    }

    /// `"enforced"` or `"unenforced"`, and why not.
    pub fn cpu_budget(&self) -> (&'static str, Option<&str>) {
        (self.group.status(), self.group.why_not())
    }

    /// Decode workers on this rank.
    pub fn workers_here(&self) -> u32 {
        self.workers_here
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// The trace spans kept so far (with `trace`).
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The accelerator model learnt so far.
    pub fn accel_model(&self) -> AccelModel {
        self.accel.model()
    }

    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Sets the instant the trace and records count from.
    pub fn set_epoch(&mut self, t0: Instant) {
        self.started = t0;
    }

    fn span(&mut self, thread: u32, cat: &str, name: String, start_s: f64, end_s: f64) {
        if self.cfg.trace {
            self.spans.push(Span {
                rank: self.world.rank() as u32,
                thread,
                cat: cat.into(),
                name,
                start_s,
                dur_s: (end_s - start_s).max(0.0),
            });
        }
    }

    /// Tokens of a sample of `frames × h × w` output with `text` text tokens.
    fn tokens(&self, text: u32, frames: u32, h: u32, w: u32) -> u64 {
        self.cfg.token_formula.count(text, frames, h, w)
    }

    /// Records that a step ended with `gpu_s` accelerator seconds on this rank.
    pub fn report_step(&mut self, gpu_s: f64, batch: &Batch) {
        self.record.gpu_s = gpu_s;
        self.record.sum_tokens = batch.samples.iter().map(|s| s.tokens as f64).sum();
        self.record.sum_tokens_sq = batch.samples.iter().map(|s| (s.tokens as f64).powi(2)).sum();
        self.record.samples = batch.samples.len() as u32;
    }

    /// The next step's batch.
    pub fn next_batch(&mut self) -> Result<Batch, ExecError> {
        let s = self.next_step;
        let call = self.now();
        self.world.set_step(Some(s));
        if self.prepared != Some(s) {
            self.advance(s, s)?;
        }
        let mut batch = self.collect(s)?;
        self.next_step += 1;
        // Step s trains now: its plan stays until `prepare_ahead` has sent the rest of its
        // tensors; its predicted time is still ahead when planning from here.
        let accel = self.plans.get(&s).map(|p| p.plan.accel_under(&self.accel.model()));
        let slowest = accel.as_ref().map(|a| a.iter().copied().fold(0.0, f64::max));
        self.training = slowest.map(|x| (s, x));
        let own = accel.and_then(|a| a.get(self.world.rank()).copied()).unwrap_or(0.0);
        self.behind_slowest_s = slowest.map_or(0.0, |x| (x - own).clamp(0.0, own.max(0.0)));
        self.plans.retain(|&t, _| t >= s);
        self.assembled.retain(|&t, _| t > s);
        self.prepared = None;
        let end = self.now();
        batch.input_wait_s = end - call;
        self.span(0, "wait", format!("input step {s}"), call, end);
        Ok(batch)
    }

    /// Plans the step that may now start decoding — `lookahead` beyond the batch just handed
    /// over — and submits its decode jobs: the step-record all-gather and the planning, done
    /// while the accelerator runs instead of while the next step waits for its input. Call it
    /// right after [`Loader::next_batch`], once the training step is launched; `next_batch`
    /// does the same work itself when it was not called. Call it on every rank at every step, or
    /// never: from its first call on, ranks leave sending the rest of a step's tensors to it.
    ///
    /// ```no_run
    /// # use datahelix::exec::loader::Loader;
    /// # fn step(loader: &mut Loader<'_>) -> Result<(), Box<dyn std::error::Error>> {
    /// let batch = loader.next_batch()?;
    /// // launch the accelerator's step on `batch` here (asynchronous), then:
    /// loader.prepare_ahead()?;
    /// // wait for the step, all-reduce the gradients, then:
    /// loader.report_step(0.25, &batch);
    /// # Ok(()) }
    /// ```
    pub fn prepare_ahead(&mut self) -> Result<(), ExecError> {
        let Some(current) = self.next_step.checked_sub(1) else { return Ok(()) };
        if self.prepared == Some(self.next_step) {
            return Ok(());
        }
        self.prepares = true;
        // The rest of the step just handed over, sent to the ranks still waiting for it, and
        // what of the next step is decoded already — before the record all-gather, so that
        // every rank runs the collectives in one order.
        if self.rest_done != Some(current) && (self.moves(current) || self.moves(current + 1)) {
            let t0 = self.now();
            let (received, _) = self.ship(current, Exchange::Rest)?;
            debug_assert!(received.is_empty(), "a rank with its batch in hand awaits nothing of it");
            let t1 = self.now();
            self.span(0, "transfer", format!("ship rest of step {current}"), t0, t1);
        }
        self.rest_done = Some(current);
        self.sent.retain(|&(t, _)| t > current);
        self.got.retain(|&(t, _)| t > current);
        self.advance(current, self.next_step)?;
        self.prepared = Some(self.next_step);
        Ok(())
    }

    /// Plans the steps from `from` through `current + lookahead` that are not planned yet (step
    /// `current` trains now or is about to). Every rank takes the same decision, so the record
    /// all-gather happens on all of them or none.
    fn advance(&mut self, current: u64, from: u64) -> Result<(), ExecError> {
        let last = (current + 1 + self.cfg.lookahead as u64).min(self.cfg.steps.max(current + 1));
        let todo: Vec<u64> = (from..last).filter(|t| !self.plans.contains_key(t)).collect();
        if todo.is_empty() {
            return Ok(());
        }
        // The DataLoader-style baselines plan from the sampler alone: they exchange records once,
        // for everyone's worker counts, and never again.
        if self.ranks.is_empty() || self.cfg.policy.uses_records() || self.cfg.check_plan {
            self.exchange_records(current)?;
        }
        let plan_start = self.now();
        for &t in &todo {
            self.plan_and_submit(t, current)?;
        }
        let plan_end = self.now();
        self.span(0, "plan", format!("plan ≤ step {}", last - 1), plan_start, plan_end);
        Ok(())
    }

    fn exchange_records(&mut self, s: u64) -> Result<(), ExecError> {
        let first = self.ranks.is_empty();
        // Decodes that finished since are no longer queued work: file them first.
        while let Some(outcome) = self.pool.try_recv() {
            self.absorb(outcome);
        }
        self.record.step = s;
        self.record.queued_cpu_s = self.outstanding.values().sum();
        self.record.zstd_ratio = self.zstd.0;
        self.record.zstd_bps = self.zstd.1;
        let bytes = self.world.all_gather_vec(&self.record.encode())?;
        let records = StepRecord::decode_all(&bytes, self.world.size())
            .map_err(|e| ExecError::Invalid(e.to_string()))?;
        let measured: Vec<(f64, f64, f64)> = records
            .iter()
            .filter(|r| s > 0 && r.gpu_s > 0.0)
            .map(|r| (r.sum_tokens, r.sum_tokens_sq, r.gpu_s))
            .collect();
        self.accel.observe_many(&measured);
        if first {
            // The priors are for a whole core: scale them to the slowest rank's worker.
            let slowest = records.iter().map(|r| r.worker_millicores).filter(|&m| m > 0).min();
            self.decode_model = CostModel::for_worker_cores(slowest.map_or(1.0, |m| m as f64 / 1000.0));
        }
        for r in &records {
            for o in &r.observations {
                if let Some(codec) = Codec::from_byte(o.codec) {
                    let f = Features { mpixels: o.mpixels, mbits: o.mbits, discarded: o.discarded };
                    self.decode_model.observe_features(codec, &f, o.seconds);
                }
            }
        }
        self.ranks = records.iter().map(StepRecord::rank_state).collect();
        let measured: Vec<&StepRecord> = records.iter().filter(|r| r.zstd_bps > 0.0).collect();
        if !measured.is_empty() {
            let n = measured.len() as f64;
            self.zstd_shared = (
                measured.iter().map(|r| r.zstd_ratio).sum::<f64>() / n,
                measured.iter().map(|r| r.zstd_bps).sum::<f64>() / n,
            );
        }
        let rank = self.world.rank() as u32;
        self.record = StepRecord {
            rank,
            workers: self.workers_here,
            worker_millicores: self.worker_millicores,
            ..StepRecord::default()
        };
        Ok(())
    }

    fn plan_and_submit(&mut self, t: u64, now_step: u64) -> Result<(), ExecError> {
        let ranks = self.world.size();
        let me = self.world.rank();
        let ids = self.sampler.global_batch(t, self.cfg.global_batch);
        let mut slots = Vec::with_capacity(ids.len());
        for &id in &ids {
            let pos = self.index.position_of(id);
            let desc = match pos {
                Some(p) => Some(self.index.get(p)?),
                None => None,
            };
            let ok = desc.is_some_and(|d| d.status.is_ok());
            slots.push(Slot { id, pos, desc, ok });
        }
        let usable: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].ok).collect();
        // Every rank's batch of step t is due when step t−1 ends.
        // Steps planned before are predicted again: the model has learned since.
        let model = self.accel.model();
        let planned = |j| self.plans.get(&j).map(|p: &Planned| p.plan.step_under(&model));
        // Planned against the steps running short by one spread of the accelerator model: a
        // batch is then ready even when they do.
        let due =
            policy::time_to_deadline(now_step, t, planned, self.training) * (-self.accel.spread()).exp();
        // The last exchange of step t's tensors before it is due: `ship_ahead` near the end of
        // step t−1, else `prepare_ahead` at its start (what of step t is decoded by then).
        let exchange = if self.ships_ahead {
            (due - self.cfg.ship_slack_s).max(0.0)
        } else if self.prepares {
            policy::time_to_exchange(now_step, t, planned, self.training)
        } else {
            0.0
        };
        // A sample one worker may not decode before its batch is due is offered in pieces.
        let descriptors: Vec<Descriptor> = usable.iter().map(|&k| slots[k].desc.expect("usable")).collect();
        let offer = StepOffer::new(
            &descriptors,
            &OfferContext {
                params: &self.cfg.params,
                formula: &self.cfg.token_formula,
                model: &self.decode_model,
                due_s: due,
                ranks,
                split_above_s: self.cfg.split_above_s,
            },
        );
        let rank_states: Vec<RankState> = (0..ranks)
            .map(|r| {
                let reported = self.ranks.get(r).copied().unwrap_or(RankState {
                    workers: 1,
                    accel_free_s: 0.0,
                    queued_cpu_s: 0.0,
                    mem_cap: 0,
                });
                RankState { accel_free_s: due, mem_cap: 0, ..reported }
            })
            .collect();
        let input = PlanInput {
            first_step: t,
            samples: offer.samples.clone(),
            ranks: rank_states,
            accel: self.accel.model(),
            transfer: self.effective_transfer(),
            options: PlanOptions::default(),
            pieces: offer.pieces.clone(),
            exchange_s: exchange,
        };
        if let (0, Some(dir)) = (me, &self.plan_dump) {
            dump_plan_input(dir, t, &input);
        }
        let plan =
            policy::plan_step(self.cfg.policy, t, &input).map_err(|e| ExecError::Invalid(e.to_string()))?;
        if self.cfg.check_plan && !self.world.agree(plan.hash)? {
            return Err(ExecError::Invalid(format!(
                "--check-plan: rank {me}'s plan of step {t} ({:016x}) differs from another rank's; the ranks' inputs or builds differ",
                plan.hash
            )));
        }
        self.counters.predicted_misses += plan.predicted_misses;
        let work = offer.job_work(plan.jobs.len());
        for (k, &j) in plan.order[me].iter().enumerate() {
            let job = plan.jobs[j as usize];
            let slot = slots[usable[job.sample as usize]];
            let (pos, desc) = (slot.pos.expect("usable"), slot.desc.expect("usable"));
            let path = self.index.dir().join(self.index.path(pos)?);
            let range = work[j as usize].frames;
            let whole = FrameRange::whole(output_shape(&desc, &self.cfg.params).0);
            self.pool.submit(Job {
                id: slot.id,
                path,
                deadline: (t << 32) | k as u64,
                descriptor: Some(desc),
                mode: Mode::Sampled,
                strategy: None,
                frames: (range != whole).then_some(range),
            });
            self.outstanding.insert((t, j as usize), work[j as usize].decode_s);
        }
        let predicted = input.samples.iter().map(|x| (x.tokens, x.bytes)).collect();
        let ranges = work.iter().map(|w| w.frames).collect();
        self.plans.insert(t, Planned { slots, usable, predicted, ranges, plan });
        Ok(())
    }

    /// The transfer model with zstd folded in where compressing is predicted to be faster.
    fn effective_transfer(&self) -> TransferCost {
        let (ratio, bps) = self.zstd_shared;
        if ratio <= 0.0 || bps <= 0.0 {
            return self.cfg.transfer.clone();
        }
        let bands = self
            .cfg
            .transfer
            .bands
            .iter()
            .map(|&(up_to, alpha, beta)| {
                // Seconds per byte: raw 1/β; compressed: compress + decompress (≈ a third) + ratio/β.
                let raw = 1.0 / beta.max(1.0);
                let zstd = 1.33 / bps + ratio / beta.max(1.0);
                (up_to, alpha, 1.0 / raw.min(zstd))
            })
            .collect();
        TransferCost { bands }
    }

    fn compress(&self, bytes: usize) -> bool {
        let (ratio, bps) = self.zstd_shared;
        if ratio <= 0.0 || bps <= 0.0 {
            return false;
        }
        let beta = self.cfg.transfer.bands.last().map_or(1e9, |b| b.2).max(1.0);
        let b = bytes as f64;
        b * (1.33 / bps + ratio / beta) < b / beta
    }

    /// Measures zstd level 1 on a tensor about to be sent: on its first MiB (a tensor's frames
    /// are alike; compressing all of it would put tens of milliseconds on the exchange's path),
    /// for the first tensor and every 16th after.
    fn measure_zstd(&mut self, data: &[u8]) {
        const SAMPLE: usize = 1 << 20;
        let nth = self.zstd_seen;
        self.zstd_seen += 1;
        if data.len() < 4096 || (self.zstd.1 > 0.0 && nth % 16 != 0) {
            return;
        }
        let data = &data[..data.len().min(SAMPLE)];
        let t = Instant::now();
        if let Ok(c) = zstd::bulk::compress(data, 1) {
            let secs = t.elapsed().as_secs_f64().max(1e-9);
            let (ratio, bps) = (c.len() as f64 / data.len() as f64, data.len() as f64 / secs);
            self.zstd = if self.zstd.1 > 0.0 {
                (0.7 * self.zstd.0 + 0.3 * ratio, 0.7 * self.zstd.1 + 0.3 * bps)
            } else {
                (ratio, bps)
            };
        }
    }

    /// Waits for this rank's decodes of step `s`, moves tensors as planned, applies the policy's
    /// after-decode step, and assembles the batch.
    fn collect(&mut self, s: u64) -> Result<Batch, ExecError> {
        let me = self.world.rank();
        let ranks = self.world.size();
        let p =
            self.plans.get(&s).ok_or_else(|| ExecError::Invalid(format!("step {s} was never planned")))?;
        let ships = (0..p.plan.jobs.len()).any(|j| p.plan.decoder[j] as usize != p.owner_of(j));
        let (ready, ready_skipped, ready_slots) = self.assembled.remove(&s).unwrap_or_default();
        let kept: Vec<usize> = p.plan.order[me]
            .iter()
            .map(|&j| j as usize)
            .filter(|&j| p.owner_of(j) == me && !ready_slots.contains(&p.slot_of(j)))
            .collect();
        let mut parts_of = vec![0u32; p.slots.len()];
        for j in 0..p.plan.jobs.len() {
            parts_of[p.slot_of(j)] += 1;
        }
        let slots = p.slots.clone();
        let mut skipped: Vec<u64> = Vec::new();
        for (k, slot) in slots.iter().enumerate() {
            if !slot.ok && k % ranks == me {
                skipped.push(slot.id);
            }
        }
        // 1. Tensors from other ranks: what came while the previous step trained, what is
        //    decoded already; and only when something this rank needs is still missing (or the
        //    gate will move tensors, which needs every batch whole), the rest, waiting for it.
        //    Otherwise this rank sends its own rest while its accelerator runs
        //    (`prepare_ahead`): a rank never waits to send, only to receive.
        let mut parts = self.early.remove(&s).unwrap_or_default();
        let mut bytes_in = self.early_bytes.remove(&s).unwrap_or(0);
        let t0 = self.now();
        if ships {
            let (received, bytes) = self.ship(s, Exchange::Ready)?;
            parts.extend(received);
            bytes_in += bytes;
        }
        let rest = ships || self.moves(s + 1);
        let gate = self.cfg.policy.after_decode() == AfterDecode::Gated && !self.gate(s).1.is_empty();
        // Without `prepare_ahead` (never called), nobody would send the rest later: now, then.
        if rest && (!self.awaited(s).is_empty() || gate || !self.prepares) {
            let (received, bytes) = self.ship(s, Exchange::Rest)?;
            parts.extend(received);
            bytes_in += bytes;
            self.rest_done = Some(s);
        }
        if ships {
            let t1 = self.now();
            self.span(0, "transfer", format!("placement step {s}"), t0, t1);
        }
        // The jobs this rank decodes for itself.
        self.wait_for(s, &kept)?;
        for &j in &kept {
            let (k, part) = {
                let p = &self.plans[&s];
                (p.slot_of(j), p.plan.jobs[j].part as u16)
            };
            parts.push(Part { slot: k, part, out: self.take(s, j)? });
        }
        let t2 = self.now();
        let mut held = self.assemble(parts, &parts_of, &slots, &mut skipped);
        held.extend(ready);
        skipped.extend(ready_skipped);
        let t3 = self.now();
        self.span(0, "assemble", format!("assemble step {s}"), t2, t3);
        // 2. After decoding.
        let after = self.cfg.policy.after_decode();
        if after != AfterDecode::Nothing {
            bytes_in += self.rebalance(s, after, &mut held)?;
        }
        held.sort_by_key(|(k, _)| *k);
        skipped.sort_unstable();
        skipped.dedup();
        self.counters.bytes_in += bytes_in;
        Ok(Batch {
            step: s,
            samples: held.into_iter().map(|(_, smp)| smp).collect(),
            skipped,
            input_wait_s: 0.0,
            decode_cpu_s: self.cpu_by_step.remove(&s).unwrap_or(0.0),
            bytes_in,
        })
    }

    /// Waits until these decode jobs of step `s` are done or `limit` has come.
    fn wait_until(&mut self, s: u64, jobs: &[usize], limit: Instant) {
        while jobs.iter().any(|&j| !self.done.contains_key(&(s, j))) {
            let left = limit.saturating_duration_since(Instant::now());
            match self.pool.recv_timeout(left) {
                Some(outcome) => self.absorb(outcome),
                None => return,
            }
        }
    }

    /// Blocks until these decode jobs of step `s` are done.
    fn wait_for(&mut self, s: u64, jobs: &[usize]) -> Result<(), ExecError> {
        while jobs.iter().any(|&j| !self.done.contains_key(&(s, j))) {
            let Some(outcome) = self.pool.recv() else {
                let me = self.world.rank();
                return Err(ExecError::Invalid(format!("rank {me}: the decode pool lost jobs of step {s}")));
            };
            self.absorb(outcome);
        }
        Ok(())
    }

    /// The output of decode job `j` of step `s` (`[F, H', W', 3]` of its frames and the bytes),
    /// or its sample's id when decoding failed (logged and reported in the next step record).
    #[allow(clippy::type_complexity)]
    fn take(&mut self, s: u64, j: usize) -> Result<Result<([usize; 4], TensorData), u64>, ExecError> {
        let outcome = self
            .done
            .remove(&(s, j))
            .ok_or_else(|| ExecError::Invalid(format!("decode job {j} of step {s} was not decoded")))?;
        let id = outcome.id;
        match outcome.result {
            Ok(Output::Sampled { tensor, decoded }) => {
                Ok(Ok((decoded.shape.dims(), TensorData::Pooled(tensor))))
            }
            Ok(Output::AllFrames(_)) => Err(ExecError::Invalid("all-frames output in a training run".into())),
            Err(e) => {
                tracing::warn!(rank = self.world.rank(), step = s, "skipping {e}");
                self.record.push_skip(id);
                Ok(Err(id))
            }
        }
    }

    /// Files a finished decode: stores it, learns from it, traces it.
    fn absorb(&mut self, outcome: crate::decode::pool::Outcome) {
        let me = self.world.rank();
        let (t, k) = (outcome.deadline >> 32, (outcome.deadline & 0xffff_ffff) as usize);
        let Some(plan) = self.plans.get(&t) else { return };
        let Some(j) = plan.plan.order[me].get(k).map(|&j| j as usize) else {
            return; // not ours (cannot happen: every job was submitted from a plan)
        };
        let (desc, range) = (plan.slots[plan.slot_of(j)].desc, plan.ranges[j]);
        let predicted = self.outstanding.remove(&(t, j));
        *self.cpu_by_step.entry(t).or_default() += outcome.cpu_seconds;
        if let (Ok(Output::Sampled { .. }), Some(d)) = (&outcome.result, desc) {
            let f = Features::predict_range(&d, &self.cfg.params, range);
            self.record.push_observation(DecodeObservation {
                codec: d.codec.to_byte(),
                mpixels: f.mpixels,
                mbits: f.mbits,
                discarded: f.discarded,
                seconds: outcome.seconds,
            });
        }
        let end = outcome.finished.saturating_duration_since(self.started).as_secs_f64();
        let lane = 1 + (k as u32 % self.workers_here.max(1));
        let mut what = if range.start > 0 || plan.plan.jobs[j].part > 0 {
            format!("decode {} frames {}..{} (step {t})", outcome.id, range.start, range.end)
        } else {
            format!("decode {} (step {t})", outcome.id)
        };
        if let Some(p) = predicted {
            what.push_str(&format!(", predicted {p:.3} s"));
        }
        self.span(lane, "decode", what, end - outcome.seconds, end);
        self.done.insert((t, j), outcome);
    }

    /// DataHelix's cost-gated rebalance of step `s`, decided from the plan's predictions —
    /// identical on every rank and known before any tensor is decoded (under the protocol they
    /// are the decoded sizes, failed samples aside): the samples and the moves that pay.
    fn gate(&self, s: u64) -> (Vec<Decoded>, Vec<(usize, u32)>) {
        let p = &self.plans[&s];
        let decoded: Vec<Decoded> = p
            .usable
            .iter()
            .zip(&p.predicted)
            .zip(&p.plan.owner)
            .map(|((&k, &(tokens, bytes)), &owner)| Decoded { id: k as u64, owner, tokens, bytes })
            .collect();
        let d = rebalance::rebalance(
            &decoded,
            self.world.size(),
            &self.accel.model(),
            &self.effective_transfer(),
            0.1,
        );
        let moves = d.moves.iter().map(|m| (m.sample, m.to)).collect();
        (decoded, moves)
    }

    /// Every rank's (batch index, tokens, bytes) of the samples it holds, in batch order (an
    /// all-gather: post-decode balancing needs the decoded sizes).
    fn gather_decoded(&self, held: &[(usize, Sample)]) -> Result<Vec<Decoded>, ExecError> {
        let mine: Vec<u8> = held
            .iter()
            .flat_map(|(k, smp)| {
                let mut b = Vec::with_capacity(24);
                b.extend_from_slice(&(*k as u64).to_le_bytes());
                b.extend_from_slice(&smp.tokens.to_le_bytes());
                b.extend_from_slice(&(smp.data.len() as u64).to_le_bytes());
                b
            })
            .collect();
        let all = self.world.all_gather_v_vec(&mine)?;
        let mut decoded: Vec<Decoded> = Vec::new();
        for (r, block) in all.iter().enumerate() {
            for c in block.chunks_exact(24) {
                let v = |at: usize| u64::from_le_bytes(c[at..at + 8].try_into().unwrap_or([0; 8]));
                decoded.push(Decoded { id: v(0), owner: r as u32, tokens: v(8), bytes: v(16) });
            }
        }
        decoded.sort_by_key(|d| d.id);
        Ok(decoded)
    }

    /// After-decode balancing: post-balance's token LPT on the gathered decoded sizes, or
    /// DataHelix's cost-gated rebalance on the plan's predictions. Every rank computes the same
    /// moves; one sparse exchange between the ranks concerned carries them when there are any.
    /// Returns bytes received. (`Decoded::id` holds the sample's batch index here; a sample that
    /// failed was already reported by the rank that held it.)
    fn rebalance(
        &mut self,
        s: u64,
        after: AfterDecode,
        held: &mut Vec<(usize, Sample)>,
    ) -> Result<u64, ExecError> {
        let me = self.world.rank();
        let ranks = self.world.size();
        let (decoded, moves) = match after {
            AfterDecode::Gated => self.gate(s),
            AfterDecode::TokenBalance => {
                let decoded = self.gather_decoded(held)?;
                let moves = policy::token_balance(&decoded, ranks);
                (decoded, moves)
            }
            AfterDecode::Nothing => (Vec::new(), Vec::new()),
        };
        if moves.is_empty() {
            self.counters.rebalances_skipped += 1;
            return Ok(0);
        }
        self.counters.rebalances_run += 1;
        let t0 = self.now();
        let mut blocks: Vec<Vec<u8>> = vec![Vec::new(); ranks];
        let (mut send, mut expect) = (vec![false; ranks], vec![false; ranks]);
        for &(i, to) in &moves {
            let d = decoded[i];
            let (from, to) = (d.owner as usize, to as usize);
            if to == me && from != me {
                expect[from] = true;
            }
            if from != me {
                continue;
            }
            send[to] = true;
            let k = d.id as usize; // the batch index travels in `id` here
            let piece = match held.iter().position(|(hk, _)| *hk == k) {
                Some(pos) => {
                    let (_, smp) = held.swap_remove(pos);
                    self.measure_zstd(&smp.data);
                    Piece {
                        step: s,
                        index: k as u32,
                        part: 0,
                        id: smp.id,
                        shape: smp.shape,
                        tokens: smp.tokens,
                        ok: true,
                        data: smp.data.to_vec(),
                    }
                }
                // Failed here (and reported here): the receiver expects a message all the same.
                None => Piece {
                    step: s,
                    index: k as u32,
                    part: 0,
                    id: 0,
                    shape: [0; 4],
                    tokens: 0,
                    ok: false,
                    data: vec![],
                },
            };
            let z = piece.ok && self.compress(piece.data.len());
            exchange::pack(&mut blocks[to], &piece, z).map_err(|e| ExecError::Invalid(e.to_string()))?;
        }
        let received = self.world.exchange_vec(&blocks, &send, &expect)?;
        let mut bytes_in = 0;
        for block in received {
            bytes_in += block.len() as u64;
            for p in exchange::unpack(&block).map_err(|e| ExecError::Invalid(e.to_string()))? {
                if p.ok {
                    let data = TensorData::Owned(p.data);
                    held.push((
                        p.index as usize,
                        Sample { id: p.id, shape: p.shape, tokens: p.tokens, data },
                    ));
                }
            }
        }
        let t1 = self.now();
        self.span(0, "transfer", format!("rebalance step {s}"), t0, t1);
        Ok(bytes_in)
    }
}
