//! The per-rank executor: a [`Loader`] yields each step's [`Batch`] of decoded tensors, planned
//! by the chosen [`Policy`] identically on every rank.
//!
//! The step protocol itself is [`crate::step`]'s: the loader drives one [`Engine`] with the real
//! collectives, the decode pool and the clock, and keeps the tensors' bytes (the engine knows
//! only what they are). [`crate::step`]'s module docs give the fixed collective schedule; when a
//! loader call returns, this rank owes its peers nothing, so a training loop may run its own
//! collectives between any two calls.
//!
//! The step driver — [`Loader::next_batch`], then, while the accelerator runs,
//! [`Loader::prepare_ahead`], [`Loader::ship_ahead`] shortly before the step ends and
//! [`Loader::report_step`] — is written once, in [`Loader::train_step`]:
//!
//! ```no_run
//! use datahelix::comm::{self, Config};
//! use datahelix::exec::loader::{Accelerator, Batch, Loader, LoaderConfig};
//!
//! /// An accelerator that takes 0.1 s a step (launch your real step in `launch`).
//! struct Fixed(std::time::Instant);
//! impl Accelerator for Fixed {
//!     fn launch(&mut self, _batch: &Batch) -> Result<(), String> {
//!         self.0 = std::time::Instant::now();
//!         Ok(())
//!     }
//!     fn seconds_left(&self) -> Option<f64> {
//!         Some(0.1 - self.0.elapsed().as_secs_f64())
//!     }
//!     fn wait(&mut self) -> Result<f64, String> {
//!         std::thread::sleep(std::time::Duration::from_secs_f64(self.seconds_left().unwrap_or(0.0).max(0.0)));
//!         Ok(0.1)
//!     }
//! }
//!
//! let world = comm::init(Config::from_env()?)?;
//! let mut loader = Loader::new(world, LoaderConfig::new("data/tiny".into()))?; // owns its world
//! let mut accel = Fixed(std::time::Instant::now());
//! for _ in 0..10 {
//!     let batch = loader.train_step(&mut accel)?;
//!     // the gradient all-reduce of the step, on your own communicator, here
//!     drop(batch);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod tensors;

use super::fingerprint::{self, Fingerprint, JobFacts};
use super::state::{DatasetId, LoaderState};
use crate::collective::{Collective, CollectiveError};
use crate::comm::World;
use crate::cost::accel::{AccelModel, TokenFormula};
use crate::decode::pool::{Charge, Job, Mode, Pool, PoolConfig, Tensor};
use crate::decode::sample::Params;
use crate::decode::split::FrameRange;
use crate::descriptor::Descriptor;
use crate::exec::cgroup::CpuGroup;
use crate::index::{Index, IndexError};
use crate::metrics::Span;
use crate::plan::{PlanInput, TransferCost};
use crate::policy::{self, Policy};
use crate::sampler::Sampler;
use crate::step::{Action, Agreed, AgreedConfig, Call, Catalog, Engine, Event, PartKey, StepError};

pub use crate::step::Counters;

/// How to load.
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    /// The dataset folder (indexed).
    pub data: PathBuf,
    /// The folder of its index when it is not inside the dataset ([`crate::index::index_file`]:
    /// a dataset on read-only storage); `None`: `DATAHELIX_INDEX_DIR`, else the dataset's own.
    pub index_dir: Option<PathBuf>,
    /// The policy.
    pub policy: Policy,
    /// Samples per global batch.
    pub global_batch: usize,
    /// Decode workers across all ranks (W); each rank gets W / R (the remainder to low ranks).
    pub workers: usize,
    /// Sampler seed.
    pub seed: u64,
    /// Draw the global batches from the dataset's groups (the first folders of its samples'
    /// paths) at these weights instead of uniformly ([`crate::sampler::mix`]); `None`: the
    /// protocol's uniform draw.
    pub mix: Option<crate::sampler::mix::Mix>,
    /// Steps the run will take (nothing is planned beyond).
    pub steps: u64,
    /// Steps decoded ahead of the one in training (the DataLoader's prefetch: while step `s`
    /// trains, steps `s+1 … s+lookahead` decode; 2 by default, the protocol's limit).
    pub lookahead: usize,
    /// Preprocessing.
    pub params: Params,
    /// Bytes of decoded tensors a rank may hold in its pool.
    pub budget_bytes: usize,
    /// The most one sample's decode may take before it is skipped with a reason (`None`: no
    /// limit; default [`crate::decode::pool::DEFAULT_DECODE_TIMEOUT`]).
    pub decode_timeout: Option<Duration>,
    /// The largest fraction of planned samples that may fail before the run ends with their ids
    /// (default [`crate::step::DEFAULT_MAX_SKIP_RATE`], 1%; 1: no limit).
    pub max_skip_rate: f64,
    /// Enforce the per-rank CPU budget with a cgroup.
    pub cpu_budget: bool,
    /// Cores of the machine the budget divides (0: all online cores).
    pub cores: f64,
    /// Names the cgroups (`datahelix-<job>-r<rank>`).
    pub job: String,
    /// Tokens or latents.
    pub token_formula: TokenFormula,
    /// The accelerator model before any measurement: it batches the steps planned before the
    /// first one is measured (those plans move no decode work for its deadlines).
    pub accel_prior: AccelModel,
    /// The transfer model the rebalance gate and placement start from (replaced by a measured
    /// one with `measure_transfer`).
    pub transfer: TransferCost,
    /// Measure the transfer model at open ([`crate::exec::links::measure_transfer_model`]): a short all-to-all-v
    /// sweep, the same model on every rank. Off by default: the constant of
    /// [`policy::default_transfer`].
    pub measure_transfer: bool,
    /// All-reduce every round's plan hash (and the sequence of collectives) and fail on a mismatch:
    /// 8 bytes a step, on by default.
    pub check_plan: bool,
    /// Keep trace spans.
    pub trace: bool,
    /// Decode every sample predicted longer than this in pieces (placement policies), late or
    /// not; `None`: only samples that one worker could not finish before their batch is due.
    pub split_above_s: Option<f64>,
    /// How long before its accelerator's step ends [`Loader::train_step`] calls
    /// [`Loader::ship_ahead`]: the time a tensor has to cross to its owner off the input-wait path.
    pub ship_margin_s: f64,
    /// How long before the step ends [`Loader::ship_ahead`] stops waiting for tensors still
    /// decoding for other ranks and sends them: the planner's last exchange before a deadline.
    pub ship_slack_s: f64,
    /// Ranks per planning group: each rank places decode work only within its group, and plans
    /// only its own group's placement (`plan::groups`). 0, automatic: none below 1024 ranks,
    /// from there the nodes of a measured transfer model, else 8 consecutive ranks.
    pub plan_group_ranks: u32,
    /// Whether a step where some rank must wait whatever the schedule (its CPUs cannot keep up,
    /// or decode chains outlast the deadline) gets late ranks, whose pieces decoded by others
    /// may reach them after their batches' collection (`plan::Plan::late_ranks`): only for a
    /// caller that calls [`Loader::prepare_ahead`] (or [`Loader::ship_ahead`]) right after
    /// [`Loader::next_batch`], before any collective of its own — [`Loader::train_step`] does.
    /// Off by default; `datahelix train` turns it on.
    pub late_pieces: bool,
}

/// [`LoaderConfig::lookahead`]'s default: the protocol's prefetch limit (`PROTOCOL.md`, "CPU
/// budget": at most 2 steps ahead per rank).
pub const DEFAULT_LOOKAHEAD: usize = 2;

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
            index_dir: None,
            policy: Policy::Helix,
            global_batch: 16,
            workers: 4,
            seed: 0,
            mix: None,
            steps: u64::MAX,
            lookahead: DEFAULT_LOOKAHEAD,
            params: Params::default(),
            budget_bytes: 512 << 20,
            decode_timeout: Some(crate::decode::pool::DEFAULT_DECODE_TIMEOUT),
            max_skip_rate: crate::step::DEFAULT_MAX_SKIP_RATE,
            cpu_budget: false,
            cores: 0.0,
            job: format!("{}", std::process::id()),
            token_formula: TokenFormula::Tokens,
            accel_prior: AccelModel { c0: 0.01, a: 1e-6, b: 0.0 },
            transfer: policy::default_transfer(),
            measure_transfer: false,
            check_plan: true,
            trace: false,
            split_above_s: None,
            ship_margin_s: DEFAULT_SHIP_MARGIN_S,
            ship_slack_s: DEFAULT_SHIP_SLACK_S,
            plan_group_ranks: 0,
            late_pieces: false,
        }
    }

    /// What every rank must run with identically, for the engine.
    fn agreed(&self, ranks: usize) -> AgreedConfig {
        AgreedConfig {
            policy: self.policy,
            global_batch: self.global_batch,
            steps: self.steps,
            lookahead: self.lookahead,
            params: self.params,
            formula: self.token_formula,
            transfer: self.transfer.clone(),
            split_above_s: self.split_above_s,
            ship_slack_s: self.ship_slack_s,
            check_plan: self.check_plan,
            seed: self.seed,
            accel_prior: self.accel_prior,
            // Several steps of every rank's observations: one step's near-equal sums alone
            // leave the fit ill-conditioned at many ranks.
            accel_window: 8 * ranks.max(8),
            max_skip_rate: self.max_skip_rate,
            plan_group_ranks: self.plan_group_ranks,
            late_pieces: self.late_pieces,
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
    /// The step protocol could not go on (a peer, the planner, or the order of calls).
    #[error("{0}")]
    Step(#[from] StepError),
    /// Something else that makes the run meaningless, with what to do.
    #[error("{0}")]
    Invalid(String),
}

/// Bytes of one decoded tensor, pooled or received.
pub enum TensorData {
    /// In a buffer of this rank's pool (returned when dropped).
    Pooled(Tensor),
    /// Received from another rank, or put together from pieces: counted in this rank's pool
    /// budget until dropped ([`Pool::charge`]), so that what a rank is sent holds back its own
    /// decoding ahead instead of adding to it.
    Received(Vec<u8>, Charge),
    /// Bytes of their own, outside any budget (a replica's copy, tests).
    Owned(Vec<u8>),
}

impl TensorData {
    /// The bytes as a vector of their own, without a copy; they leave the pool's budget
    /// ([`Tensor::detach`]).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            TensorData::Pooled(t) => t.detach(),
            TensorData::Received(v, _) | TensorData::Owned(v) => v,
        }
    }
}

impl std::ops::Deref for TensorData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            TensorData::Pooled(t) => t,
            TensorData::Received(v, _) | TensorData::Owned(v) => v,
        }
    }
}

impl std::ops::DerefMut for TensorData {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            TensorData::Pooled(t) => t,
            TensorData::Received(v, _) | TensorData::Owned(v) => v,
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
    /// Each delivered frame's presentation time in seconds from the stream's start (`shape[0]`
    /// of them; 0 for an image).
    pub timestamps_s: Vec<f64>,
    /// Its metadata, a JSON object: `path` (in the dataset folder) and the manifest row's other
    /// fields (caption, label, ...). Filled as the batch is delivered.
    pub meta: String,
}

/// A decoded piece of a sample in hand (a whole sample is one piece): its bytes and frame times
/// (its shape is the plan's).
pub(crate) struct Part {
    data: TensorData,
    timestamps_s: Vec<f64>,
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

/// The accelerator side of a training step, for [`Loader::train_step`].
pub trait Accelerator {
    /// Starts the step on `batch` (asynchronously where the accelerator can).
    fn launch(&mut self, batch: &Batch) -> Result<(), String>;
    /// Seconds until the step is expected to end (None: the loader predicts it).
    fn seconds_left(&self) -> Option<f64>;
    /// Waits for the step to end; returns its accelerator seconds.
    fn wait(&mut self) -> Result<f64, String>;
}

/// Launches `batch` on `accel`; when it was launched.
pub(crate) fn launch(accel: &mut dyn Accelerator, batch: &Batch) -> Result<Instant, ExecError> {
    let launched = Instant::now();
    accel.launch(batch).map_err(|e| {
        ExecError::Invalid(format!("the accelerator's step {} did not launch: {e}", batch.step))
    })?;
    Ok(launched)
}

/// The collectives a loader runs on: borrowed from the caller, or owned.
pub enum WorldRef<'w> {
    /// The caller keeps the world alive for the loader's life.
    Borrowed(&'w dyn Collective),
    /// The loader owns it (and frees it last, after its workers).
    Owned(Box<World>),
}

impl WorldRef<'_> {
    /// The collectives.
    pub fn get(&self) -> &dyn Collective {
        match self {
            WorldRef::Borrowed(c) => *c,
            WorldRef::Owned(w) => w.collective(),
        }
    }

    /// The world, when owned.
    pub(crate) fn into_owned(self) -> Option<Box<World>> {
        match self {
            WorldRef::Borrowed(_) => None,
            WorldRef::Owned(w) => Some(w),
        }
    }
}

impl<'w> From<&'w dyn Collective> for WorldRef<'w> {
    fn from(c: &'w dyn Collective) -> WorldRef<'w> {
        WorldRef::Borrowed(c)
    }
}

impl From<World> for WorldRef<'_> {
    fn from(w: World) -> Self {
        WorldRef::Owned(Box::new(w))
    }
}

/// The index as the engine's catalog.
struct IndexCatalog<'a>(&'a Index);

impl Catalog for IndexCatalog<'_> {
    fn lookup(&self, id: u64) -> Result<Option<(usize, Descriptor)>, String> {
        match self.0.position_of(id) {
            Some(p) => self.0.get(p).map(|d| Some((p, d))).map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }
}

/// Writes step `t`'s planner input to `DIR/step-<t>.json`, `DIR` from `DATAHELIX_PLAN_DUMP`
/// (`datahelix plan --input` replans it): the plan is a function of it alone.
fn dump_plan_input(dir: &std::path::Path, t: u64, input: &PlanInput) {
    let path = dir.join(format!("step-{t}.json"));
    let written = std::fs::create_dir_all(dir)
        .map_err(|e| e.to_string())
        .and_then(|()| serde_json::to_vec_pretty(input).map_err(|e| e.to_string()))
        .and_then(|bytes| std::fs::write(&path, bytes).map_err(|e| e.to_string()));
    if let Err(e) = written {
        tracing::warn!("DATAHELIX_PLAN_DUMP: cannot write {}: {e}", path.display());
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A dataset opened for a loader, and where it starts.
struct OpenedDataset {
    index: Index,
    /// What the global batches are drawn from: the index's ids, uniformly or by the mix.
    sampler: Sampler,
    dataset: DatasetId,
    index_sha256: [u8; 32],
    first_step: u64,
    /// What the run resumed learned, where its state carries it.
    learned: Option<crate::step::Learned>,
    /// The skip budget's count of the run resumed, where its state carries it.
    skips: Option<crate::step::SkipCount>,
}

impl Loader<'_> {
    /// Opens the index and checks the configuration and the state to resume, if any.
    fn open_dataset(cfg: &LoaderConfig, resume: Option<&LoaderState>) -> Result<OpenedDataset, ExecError> {
        let index = Index::open_in(&cfg.data, cfg.index_dir.as_deref())?;
        if cfg.global_batch == 0 || cfg.workers == 0 || cfg.lookahead == 0 {
            return Err(ExecError::Invalid("global batch, workers and lookahead must be at least 1".into()));
        }
        let mut samples = Vec::with_capacity(index.len());
        for i in 0..index.len() {
            let d = index.get(i)?;
            if d.status != crate::descriptor::Status::DuplicateId {
                samples.push((d.id, index.path(i)?));
            }
        }
        if samples.is_empty() {
            return Err(ExecError::Invalid(format!(
                "{} holds no samples; run `datahelix index` on a dataset",
                cfg.data.display()
            )));
        }
        let sampler = match &cfg.mix {
            None => Sampler::new(&samples.iter().map(|&(id, _)| id).collect::<Vec<u64>>(), cfg.seed),
            Some(mix) => Sampler::mixed(mix, &crate::sampler::mix::groups_of(samples), cfg.seed)
                .map_err(|e| ExecError::Invalid(format!("{}: {e}", cfg.data.display())))?,
        };
        let index_sha256 = index.content_sha256()?;
        let dataset = DatasetId {
            samples: sampler.len() as u64,
            manifest_sha256: hex(&index.manifest_sha256()),
            index_sha256: hex(&index_sha256),
            mix: cfg.mix.as_ref().map(ToString::to_string),
        };
        let first_step = match resume {
            Some(state) => {
                state
                    .check_against(cfg.seed, cfg.global_batch as u64, &dataset)
                    .map_err(ExecError::Invalid)?;
                state.next_step
            }
            None => 0,
        };
        if first_step >= cfg.steps {
            return Err(ExecError::Invalid(format!(
                "the loader state continues at step {first_step}, but the run has {} steps in all: nothing \
                 is left to deliver (the step count is the total, not the steps still to run)",
                cfg.steps
            )));
        }
        let learned = resume.and_then(|s| s.learned.clone());
        let skips = resume.and_then(|s| s.skips.clone());
        Ok(OpenedDataset { index, sampler, dataset, index_sha256, first_step, learned, skips })
    }
}

/// Starts `agreed` from what the resumed run learned, where every rank's state carries the same
/// (compared by hash: ranks given different states' files start from the priors, all of them,
/// and say so). **Collective** (an agreement of 8 bytes), on every rank whether it resumes or not.
fn resume_learned(
    world: &dyn Collective,
    agreed: &mut Agreed,
    learned: Option<crate::step::Learned>,
) -> Result<(), ExecError> {
    let same = world.agree(learned.as_ref().map_or(0, crate::step::Learned::hash))?;
    match learned {
        Some(learned) if same => agreed.resume_from(learned),
        Some(_) => {
            let why = "the ranks' loader states carry different learned models (resume every rank from one \
                       rank's state, or from states taken at the same point of the loop)";
            if world.rank() == 0 {
                // Once, whole, on stderr: a C or Python host has no log subscriber.
                crate::comm::say_whole(&format!(
                    "datahelix: rank 0: every rank starts its cost models from the priors: {why}"
                ));
            }
            agreed.resume_from_priors(why.into());
        }
        None => {}
    }
    Ok(())
}

/// Starts the skip budget's count from the resumed run's. The planning policies' counts are the
/// same on every rank (they come from the gathered records), so theirs is taken where every
/// rank's state carries the same, else every rank counts from zero and rank 0 says so; a
/// baseline's rank counts its own decode failures, so each rank takes its own. **Collective**
/// (an agreement of 8 bytes), on every rank whether it resumes or not.
fn resume_skips(
    world: &dyn Collective,
    agreed: &mut Agreed,
    skips: Option<crate::step::SkipCount>,
) -> Result<(), ExecError> {
    let same = world.agree(skips.as_ref().map_or(0, crate::step::SkipCount::hash))?;
    match skips {
        Some(count) if same || !agreed.config().policy.uses_records() => agreed.resume_skips(count),
        Some(_) if world.rank() == 0 => crate::comm::say_whole(
            "datahelix: rank 0: the skip budget counts from zero: the ranks' loader states carry \
             different counts of failed samples (resume every rank from one rank's state, or from \
             states taken at the same point of the loop)",
        ),
        Some(_) | None => {}
    }
    Ok(())
}

/// Re-probes the files that changed since the dataset was indexed (size or modification time:
/// a dataset copied or touched after `datahelix index`), so that they are decoded instead of
/// skipped at every epoch. **Collective**: an all-reduce of "some file changed here", then, if
/// any rank saw one, a barrier between rank 0's rebuild (which serves every rank sharing its
/// storage) and the rebuilds of ranks whose own copy is still stale. The fingerprint that
/// follows checks that every rank ended with the same index. A rebuild that fails (a read-only
/// dataset folder) is reported and the changed files are skipped, with their reason, as before.
fn reprobe_changed_files(
    world: &dyn Collective,
    dir: &std::path::Path,
    index_dir: Option<&std::path::Path>,
) -> Result<(), ExecError> {
    let changed = || crate::index::writer::changed_since_indexing(dir, index_dir).unwrap_or(0);
    let mut any = [changed() as u64];
    world.all_reduce_u64(&mut any, crate::collective::ReduceOp::Max)?;
    if any[0] == 0 {
        return Ok(());
    }
    let rebuild = |n: usize| {
        if n == 0 {
            return;
        }
        tracing::warn!(
            target: "datahelix::exec",
            "rank {}: {n} files of {} changed since indexing (size or modification time); re-probing them",
            world.rank(),
            dir.display()
        );
        let opts = crate::index::BuildOptions {
            progress: false,
            index_dir: index_dir.map(Into::into),
            ..Default::default()
        };
        if let Err(e) = crate::index::build(dir, &opts) {
            tracing::warn!(
                target: "datahelix::exec",
                "rank {}: cannot re-index {}: {e}; the changed files will be skipped",
                world.rank(),
                dir.display()
            );
        }
    };
    if world.rank() == 0 {
        rebuild(changed());
    }
    world.barrier()?;
    if world.rank() != 0 {
        rebuild(changed());
    }
    Ok(())
}

fn workers_of(rank: usize, ranks: usize, total: usize) -> u32 {
    (total / ranks + usize::from(rank < total % ranks)).max(1) as u32
}

/// Each rank's decode workers and the cores they share, for `workers` (W) across `ranks` on a
/// budget of `cores`: W / R workers a rank (the remainder to low ranks, at least one each), and
/// `cores × (workers of the rank) / W` cores — the protocol's per-rank budget, which the
/// loader's CPU group enforces.
///
/// ```
/// use datahelix::exec::loader::budget_per_rank;
///
/// let (workers, cores) = budget_per_rank(6.0, 4, 8);
/// assert_eq!(workers, vec![2; 4]);
/// assert_eq!(cores, vec![1.5; 4]);
/// ```
pub fn budget_per_rank(cores: f64, ranks: usize, workers: usize) -> (Vec<u32>, Vec<f64>) {
    let here: Vec<u32> = (0..ranks).map(|r| workers_of(r, ranks, workers)).collect();
    let share = here.iter().map(|&w| cores * f64::from(w) / workers.max(1) as f64).collect();
    (here, share)
}

/// How often a rank waiting for its decodes answers peers' watchdog queries, in seconds.
const WATCHDOG_SERVE_S: f64 = 0.05;

/// The executor of one rank. Fields are dropped in order: the workers stop before the world goes.
pub struct Loader<'w> {
    engine: Engine,
    agreed: Agreed,
    pool: Pool,
    group: CpuGroup,
    index: Index,
    /// Each delivered sample's metadata, by id in `index`.
    sample_meta: super::sample_meta::SampleMeta,
    /// The dataset folder, canonical: every decode's path is resolved beneath it.
    root: PathBuf,
    /// Which dataset the index holds (for [`Loader::state`]).
    dataset: DatasetId,
    cfg: LoaderConfig,
    workers_here: u32,
    /// Where rank 0 writes every planner input (`DATAHELIX_PLAN_DUMP`).
    plan_dump: Option<PathBuf>,
    /// Decode jobs in the pool, by their priority key: what each decodes, its frames when a
    /// piece, and its predicted seconds (named in its trace span).
    in_pool: HashMap<u64, (PartKey, Option<FrameRange>, f64)>,
    /// Decoded parts (own or received) and samples put together, by what the engine calls them.
    parts: HashMap<PartKey, Part>,
    samples: HashMap<(u64, u32), Sample>,
    /// Tensors offered to [`Loader::measure_zstd`] so far.
    zstd_seen: u64,
    started: Instant,
    spans: Vec<Span>,
    world: WorldRef<'w>,
}

impl<'w> Loader<'w> {
    /// Opens the index, checks that every rank runs the same job (a fingerprint all-gathered:
    /// dataset, build, settings; every rank fails with the same message naming the ranks and
    /// fields that differ), starts this rank's decode workers (inside its CPU cgroup when asked).
    /// `world` is borrowed (`world.collective()`) or owned (a [`World`]). Collective.
    pub fn new(world: impl Into<WorldRef<'w>>, cfg: LoaderConfig) -> Result<Loader<'w>, ExecError> {
        Loader::open(world.into(), cfg, None)
    }

    /// [`Loader::new`] continuing a run from its [`Loader::state`]: the first batch delivered is
    /// `state.next_step`'s, and every global batch is the one a run that never stopped delivers
    /// (at any world size). A state of another dataset, seed, global batch or protocol is refused,
    /// naming the field. Collective.
    pub fn resume(
        world: impl Into<WorldRef<'w>>,
        cfg: LoaderConfig,
        state: &LoaderState,
    ) -> Result<Loader<'w>, ExecError> {
        Loader::open(world.into(), cfg, Some(state))
    }

    fn open(
        world: WorldRef<'w>,
        cfg: LoaderConfig,
        resume: Option<&LoaderState>,
    ) -> Result<Loader<'w>, ExecError> {
        Loader::open_or_give_back(world, cfg, resume).map_err(|(e, _world)| e)
    }

    /// [`Loader::new`] / [`Loader::resume`] that hands `world` back when the job's checks fail
    /// (a rank's dataset or state unusable, ranks running different jobs): every rank fails
    /// there together, and a caller that owns its world says why before it ends the world
    /// (whose closing barrier lets the first rank out exit, and the launcher stop the others
    /// before they could print).
    pub(crate) fn open_or_give_back(
        world: WorldRef<'w>,
        cfg: LoaderConfig,
        resume: Option<&LoaderState>,
    ) -> Result<Loader<'w>, (ExecError, Option<WorldRef<'w>>)> {
        match Loader::check_job(world.get(), &cfg, resume) {
            Ok(ds) => Loader::start(world, cfg, ds).map_err(|e| (e, None)),
            Err(e) => Err((e, Some(world))),
        }
    }

    /// The checks every rank passes or fails together: files changed since indexing re-probed,
    /// the dataset (and the state to resume) opened, the job's fingerprint compared. Collective.
    fn check_job(
        world: &dyn Collective,
        cfg: &LoaderConfig,
        resume: Option<&LoaderState>,
    ) -> Result<OpenedDataset, ExecError> {
        let rank = world.rank();
        reprobe_changed_files(world, &cfg.data, cfg.index_dir.as_deref())?;
        // Every rank reaches the fingerprint's all-gather, also one whose dataset or state is
        // unusable: the others then stop at once too, instead of waiting for it in a collective.
        let opened = Self::open_dataset(cfg, resume);
        let mine = match &opened {
            Ok(ds) => Fingerprint::of(&JobFacts {
                manifest_sha256: ds.index.manifest_sha256(),
                index_sha256: ds.index_sha256,
                samples: ds.dataset.samples,
                params: cfg.params,
                policy: cfg.policy.name(),
                global_batch: cfg.global_batch as u64,
                seed: cfg.seed,
                workers: cfg.workers as u64,
                lookahead: cfg.lookahead as u64,
                steps: cfg.steps,
                first_step: ds.first_step,
                formula: cfg.token_formula.name(),
                check_plan: cfg.check_plan,
                split_above_s: cfg.split_above_s,
                max_skip_rate: cfg.max_skip_rate,
                measure_transfer: cfg.measure_transfer,
                plan_group_ranks: cfg.plan_group_ranks,
                late_pieces: cfg.late_pieces,
                mix: ds.dataset.mix.as_deref(),
            }),
            Err(_) => Fingerprint::unready(),
        };
        let verdict = fingerprint::check_same_job(world, &mine);
        let ds = opened?;
        verdict.map_err(|e| ExecError::Invalid(format!("rank {rank}: {e}")))?;
        Ok(ds)
    }

    /// The rest of opening, once [`Loader::check_job`] passed: the transfer model, this rank's
    /// CPU group, decode pool and step engine. Collective.
    fn start(world: WorldRef<'w>, cfg: LoaderConfig, ds: OpenedDataset) -> Result<Loader<'w>, ExecError> {
        let rank = world.get().rank();
        let OpenedDataset { index, sampler, dataset, first_step, learned, skips, .. } = ds;
        let mut cfg = cfg;
        if cfg.measure_transfer {
            cfg.transfer = super::links::measure_transfer_model(world.get())?;
        }
        let sample_meta = super::sample_meta::SampleMeta::open(&index, &cfg.data, cfg.index_dir.as_deref());
        let root = std::fs::canonicalize(index.dir()).map_err(|e| {
            ExecError::Invalid(format!("rank {rank}: the dataset folder {}: {e}", index.dir().display()))
        })?;
        let ranks = world.get().size();
        let workers_here = workers_of(rank, ranks, cfg.workers);
        let cores = if cfg.cores > 0.0 {
            cfg.cores
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
        };
        let group = if cfg.cpu_budget {
            CpuGroup::create(&cfg.job, rank, budget_per_rank(cores, ranks, cfg.workers).1[rank])
        } else {
            CpuGroup::none("not asked for (--no-cpu-budget)")
        };
        group.enter_current_thread();
        let pool = Pool::new(PoolConfig {
            workers: workers_here as usize,
            budget_bytes: cfg.budget_bytes,
            params: cfg.params,
            decode_timeout: cfg.decode_timeout,
        });
        group.leave_current_thread();
        // One worker's share of a core under the budget, for the decode priors (all-gathered:
        // every rank's model starts from the same one).
        let worker_millicores = if group.status() == "enforced" {
            (1000.0 * cores / cfg.workers as f64).round().clamp(1.0, 1000.0) as u32
        } else {
            0
        };
        let plan_dump = std::env::var_os("DATAHELIX_PLAN_DUMP").map(PathBuf::from);
        let mut agreed = Agreed::with_sampler(cfg.agreed(ranks), sampler, ranks);
        resume_learned(world.get(), &mut agreed, learned)?;
        resume_skips(world.get(), &mut agreed, skips)?;
        agreed.place_only_for(rank);
        agreed.keep_inputs(rank == 0 && plan_dump.is_some());
        let mut engine = Engine::new(rank, ranks, workers_here, worker_millicores);
        engine.start_at(first_step).map_err(ExecError::Step)?;
        Ok(Loader {
            engine,
            dataset,
            agreed,
            pool,
            group,
            index,
            sample_meta,
            root,
            cfg,
            workers_here,
            plan_dump,
            in_pool: HashMap::new(),
            parts: HashMap::new(),
            samples: HashMap::new(),
            zstd_seen: 0,
            started: Instant::now(),
            spans: Vec::new(),
            world,
        })
    }

    /// Where the run stands, to [`Loader::resume`] it: the next step is the one after the batch
    /// delivered last (checkpoint it with the model after that step's optimizer update).
    /// It carries what the policy learned so far and the skip budget's count of the steps
    /// delivered, which a resumed run starts from: take it at the same point of the loop on
    /// every rank (or have every rank resume from one rank's).
    pub fn state(&self) -> LoaderState {
        let next = self.engine.next_step();
        LoaderState::new(
            self.cfg.seed,
            next,
            self.cfg.policy.name(),
            self.cfg.global_batch as u64,
            self.dataset.clone(),
        )
        .with_learned(Some(self.agreed.learned()))
        .with_skips(Some(self.agreed.skips_before(next)))
    }

    /// Whether this loader started from what the run it resumed had learned (`null` in JSON
    /// where it did not resume from a state that carries it).
    pub fn resumed(&self) -> &crate::step::Resumed {
        self.agreed.resumed()
    }

    /// The collectives the loader runs on (also the caller's to use between loader calls).
    pub fn world(&self) -> &dyn Collective {
        self.world.get()
    }

    /// `"enforced"` or `"unenforced"`, and why not.
    pub fn cpu_budget(&self) -> (&'static str, Option<&str>) {
        (self.group.status(), self.group.why_not())
    }

    /// Decode workers on this rank.
    pub fn workers_here(&self) -> u32 {
        self.workers_here
    }

    /// The transfer model the planner uses: the configured one, or the one measured at open.
    pub fn transfer(&self) -> &TransferCost {
        &self.cfg.transfer
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// Bytes of tensors received from other ranks (or put together from pieces) that count in
    /// this rank's pool budget now: held by batches not yet dropped and by steps ahead.
    pub fn charged_bytes(&self) -> usize {
        self.pool.charged_bytes()
    }

    /// Rebalances run and skipped, bytes received, predicted misses.
    pub fn counters(&self) -> Counters {
        self.engine.counters()
    }

    /// Steps whose plan stretched them past the balanced step to the CPUs' pace (every rank
    /// plans alike, so every rank counts the same).
    pub fn stretched_steps(&self) -> u64 {
        self.agreed.stretched_plans()
    }

    /// Steps whose plan left a late rank (`plan::Plan::late_ranks`; every rank counts the same).
    pub fn late_steps(&self) -> u64 {
        self.agreed.late_plans()
    }

    /// Collectives the loader issued so far, and the hash of their sequence.
    pub fn schedule(&self) -> (u64, u64) {
        self.engine.schedule()
    }

    /// The trace spans kept so far (with `trace`).
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The accelerator model learnt so far.
    pub fn accel_model(&self) -> AccelModel {
        self.agreed.accel_model()
    }

    /// Sets the instant the trace and records count from.
    pub fn set_epoch(&mut self, t0: Instant) {
        self.started = t0;
    }

    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn secs(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.started) {
            Some(d) => d.as_secs_f64(),
            None => -self.started.duration_since(at).as_secs_f64(),
        }
    }

    fn span(&mut self, thread: u32, cat: &str, name: String, start_s: f64, end_s: f64) {
        if self.cfg.trace {
            self.spans.push(Span {
                rank: self.world.get().rank() as u32,
                thread,
                cat: cat.into(),
                name,
                start_s,
                dur_s: (end_s - start_s).max(0.0),
            });
        }
    }

    /// One training step, the library's step driver: the next batch, the accelerator launched
    /// on it, the coming steps planned while it runs, the next step's tensors shipped
    /// [`LoaderConfig::ship_margin_s`] before it ends, and its measured seconds reported.
    /// Returns the batch (its tensors stay valid as long as it lives). Collective, like each
    /// call it makes; the step's gradient all-reduce is the caller's, after it returns.
    pub fn train_step(&mut self, accel: &mut dyn Accelerator) -> Result<Batch, ExecError> {
        let mut batch = self.next_batch()?;
        let launched = launch(accel, &batch)?;
        self.finish_step(accel, launched)?;
        // What this rank decoded for a late rank after the step's collection is the step's too.
        batch.decode_cpu_s += self.engine.take_late_cpu_s(batch.step);
        Ok(batch)
    }

    /// The rest of [`Loader::train_step`] once the step delivered last was launched (at
    /// `launched`) on `accel`: plan ahead, ship near the step's end, wait, report. For drivers
    /// that launch the step themselves (the C ABI's `dh_loader_step`).
    pub fn finish_step(&mut self, accel: &mut dyn Accelerator, launched: Instant) -> Result<(), ExecError> {
        self.finish_step_then(accel, launched, |_, _| Ok(()))
    }

    /// [`Loader::finish_step`], calling `after(self, ok)` once planning ahead and again once
    /// shipping are over (`ok`: whether that call succeeded; its error is returned after
    /// `after` ran): where a replica group's leader sends its followers what it holds of the
    /// next batch, while the accelerator runs (`exec::replica`).
    pub(crate) fn finish_step_then(
        &mut self,
        accel: &mut dyn Accelerator,
        launched: Instant,
        mut after: impl FnMut(&mut Self, bool) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        let step = self.engine.next_step().saturating_sub(1);
        let prepared = self.prepare_ahead();
        after(self, prepared.is_ok())?;
        prepared?;
        let predicted = self.engine.own_step_s();
        let left = accel
            .seconds_left()
            .filter(|x| x.is_finite())
            .unwrap_or_else(|| predicted - launched.elapsed().as_secs_f64())
            .clamp(0.0, 86_400.0);
        let step_end = Instant::now() + Duration::from_secs_f64(left);
        let margin = Duration::from_secs_f64(self.cfg.ship_margin_s.max(0.0));
        std::thread::sleep(step_end.saturating_duration_since(Instant::now()).saturating_sub(margin));
        let shipped = self.ship_ahead(step_end);
        after(self, shipped.is_ok())?;
        shipped?;
        let accel_s = accel
            .wait()
            .map_err(|e| ExecError::Invalid(format!("the accelerator's step {step} failed: {e}")))?;
        self.report_step(accel_s)
    }

    /// Records that the step delivered last took `accel_s` accelerator seconds on this rank
    /// (once per step; the batch may be gone already).
    pub fn report_step(&mut self, accel_s: f64) -> Result<(), ExecError> {
        if !(accel_s.is_finite() && accel_s >= 0.0) {
            return Err(ExecError::Invalid(format!(
                "accelerator seconds {accel_s} must be finite and non-negative"
            )));
        }
        Ok(self.engine.report(accel_s)?)
    }

    /// The next step's batch. Collective.
    pub fn next_batch(&mut self) -> Result<Batch, ExecError> {
        self.next_batch_in_slots().map(|(batch, _)| batch)
    }

    /// [`Loader::next_batch`] and each sample's slot in the global batch.
    pub(crate) fn next_batch_in_slots(&mut self) -> Result<(Batch, Vec<u32>), ExecError> {
        let call = self.now();
        let s = self.engine.next_step();
        self.world.get().set_step(Some(s));
        let spec = self
            .drive(Call::Next)?
            .ok_or_else(|| ExecError::Invalid(format!("step {s} delivered nothing")))?;
        let mut samples = Vec::with_capacity(spec.slots.len());
        for &k in &spec.slots {
            let sample = self.samples.remove(&(s, k)).ok_or_else(|| {
                ExecError::Invalid(format!(
                    "rank {}: sample slot {k} of step {s} is not in hand",
                    self.engine.rank()
                ))
            })?;
            samples.push(sample);
        }
        self.samples.retain(|&(t, _), _| t > s);
        let engine = &self.engine;
        self.parts.retain(|k, _| k.step > s || engine.owes_late(k));
        self.sample_meta.fill(&self.index, &mut samples);
        let end = self.now();
        self.span(0, "wait", format!("input step {s}"), call, end);
        let batch = Batch {
            step: s,
            samples,
            skipped: spec.skipped,
            input_wait_s: end - call,
            decode_cpu_s: spec.decode_cpu_s,
            bytes_in: spec.bytes_in,
        };
        Ok((batch, spec.slots))
    }

    /// Plans the step that may now start decoding — `lookahead` beyond the batch just handed
    /// over — and submits its decode jobs, and sends what of the next step is decoded for other
    /// ranks: done while the accelerator runs instead of while the next step waits for its
    /// input. Call it right after [`Loader::next_batch`] once the training step is launched
    /// (`next_batch` does the planning itself when it was not called); on every rank at every
    /// step, or never. With [`LoaderConfig::late_pieces`] it first sends what this rank owes a
    /// late rank, which waits for it inside its `next_batch`: no collective of the caller's may
    /// come between the two calls.
    ///
    /// Called before the first `next_batch` (of a run or of a resumed run), it plans the first
    /// steps and starts decoding them at once: open the loader, call it, then load the model —
    /// the first batch is decoded meanwhile instead of after (on every rank, or on none).
    pub fn prepare_ahead(&mut self) -> Result<(), ExecError> {
        self.drive(Call::Prepare).map(drop)
    }

    /// Exchanges the next step's tensors decoded for other ranks while the accelerator finishes
    /// the step in training, so that they reach their owners before their batches are
    /// collected: what is decoded already; then, after waiting for this rank's own until
    /// [`LoaderConfig::ship_slack_s`] before the slowest rank is predicted to end its step
    /// (`step_end` is this rank's), a second time. Call it on every rank (or on none), after
    /// [`Loader::prepare_ahead`] and shortly before the step ends.
    pub fn ship_ahead(&mut self, step_end: Instant) -> Result<(), ExecError> {
        let step_end_s = self.secs(step_end);
        self.drive(Call::Ship { step_end_s }).map(drop)
    }

    /// Runs one call of the engine to its end; the batch when it delivers one.
    fn drive(&mut self, call: Call) -> Result<Option<crate::step::BatchSpec>, ExecError> {
        self.engine.begin(call)?;
        let mut answer = None;
        let mut delivered = None;
        loop {
            self.file_finished();
            let t0 = self.now();
            let action = self.engine.poll(&mut self.agreed, &IndexCatalog(&self.index), answer.take())?;
            match action {
                Action::Gather(bytes) => {
                    let all = self.world.get().all_gather_vec(&bytes)?;
                    answer = Some(Event::Gathered(Arc::new(all)));
                }
                Action::GatherV(bytes) => {
                    // The decoded sizes: one entry per sample a rank holds of the step.
                    let max = crate::step::SIZE_ENTRY_BYTES * self.cfg.global_batch;
                    let all = self.world.get().all_gather_v_vec(&bytes, max)?;
                    answer = Some(Event::GatheredV(Arc::new(all)));
                }
                Action::Agree(value) => answer = Some(Event::Agreed(self.world.get().agree(value)?)),
                Action::Exchange(order) => answer = Some(Event::Exchanged(self.exchange(order)?)),
                Action::Submit(jobs) => {
                    let t1 = self.now();
                    self.span(
                        0,
                        "plan",
                        format!("plan ≤ step {}", jobs.last().map_or(0, |j| j.key.step)),
                        t0,
                        t1,
                    );
                    self.submit(jobs)?;
                    self.dump_inputs();
                }
                Action::Await { keys, until_s } => self.await_decodes(&keys, until_s),
                Action::Assemble { samples, drop, ahead } => self.assemble(samples, drop, ahead)?,
                Action::Deliver(spec) => delivered = Some(spec),
                Action::Done => return Ok(delivered),
            }
        }
    }

    fn dump_inputs(&mut self) {
        let inputs = self.agreed.take_inputs();
        if let Some(dir) = &self.plan_dump {
            for (t, input) in &inputs {
                dump_plan_input(dir, *t, input);
            }
        }
    }

    fn submit(&mut self, jobs: Vec<crate::step::DecodeRequest>) -> Result<(), ExecError> {
        for r in jobs {
            let desc = self.index.get(r.pos)?;
            let rel = self.index.path(r.pos)?;
            let path = self.index.dir().join(rel);
            let beneath = Some((self.root.clone(), rel.to_string()));
            self.in_pool.insert(r.priority, (r.key, r.frames, r.predicted_s));
            self.pool.submit(Job {
                id: r.id,
                path,
                deadline: r.priority,
                descriptor: Some(desc),
                mode: Mode::Sampled,
                strategy: None,
                frames: r.frames,
                beneath,
            });
        }
        Ok(())
    }

    /// Files every decode finished by now.
    fn file_finished(&mut self) {
        while let Some(outcome) = self.pool.try_recv() {
            self.file(outcome);
        }
    }

    /// Waits until these decodes are done or the clock reaches `until_s`, answering peers'
    /// watchdog queries meanwhile (a rank waiting for its decodes is alive, not silent).
    fn await_decodes(&mut self, keys: &[PartKey], until_s: Option<f64>) {
        // What this thread waits for must not wait for received tensors' budget: only this
        // thread's progress (and its caller's) frees that.
        let last = keys.iter().map(|k| k.step).max();
        if let Some(last) = last {
            // A late rank's jobs queue behind the next step's (their key is past `last + 1 <<
            // 32`): exempt up to the latest key waited for, or such a wait never gets bytes.
            let queued = self.in_pool.iter().filter(|(_, (k, _, _))| keys.contains(k)).map(|(&d, _)| d + 1);
            self.pool.exempt_below(queued.fold((last + 1) << 32, u64::max));
        }
        let first_overdraft = self.pool.overdrafts() == 0;
        while !self.engine.all_done(keys) {
            let left = until_s.map_or(f64::INFINITY, |limit| limit - self.now());
            if left <= 0.0 {
                break;
            }
            let wait = Duration::from_secs_f64(left.min(WATCHDOG_SERVE_S));
            match self.pool.recv_timeout(wait) {
                Some(o) => self.file(o),
                None if self.pool.is_idle() => break, // the pool holds nothing: the engine decides
                None => self.world.get().serve_watchdog(),
            }
        }
        if first_overdraft && self.pool.overdrafts() > 0 {
            tracing::warn!(
                rank = self.world.get().rank(),
                step = last,
                "the decode budget ({} MiB) is smaller than the batches this rank waits for: the \
                 tensors it holds took all of it, so decoding went past it rather than wait \
                 forever; raise the budget (--budget-mib, budget_mib) to keep memory within it",
                self.pool.budget_bytes() >> 20
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_shared_out_with_the_remainder_to_low_ranks() {
        assert_eq!((0..3).map(|r| workers_of(r, 3, 7)).collect::<Vec<_>>(), vec![3, 2, 2]);
        assert_eq!(workers_of(3, 4, 2), 1, "every rank gets a worker");
    }
}
