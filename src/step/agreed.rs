//! What every rank computes identically from the gathered step records: the accelerator and
//! decode-cost models, each rank's reported state, and the plans of the steps ahead. A pure
//! function of the sequence of gathered records (and of the configuration every rank checked at
//! start), so one value can serve every engine of a simulated cluster: the first engine to file a
//! round's records updates it, the others find it updated (rounds are numbered).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::learned::{Learned, Resumed, MAX_ACCEL_OBSERVATIONS};
use super::{PartKey, StepError};
use crate::cost::accel::{AccelFit, AccelModel, TokenFormula};
use crate::decode::cost::{CostModel, Features, SavedFit};
use crate::decode::sample::{output_shape, Params};
use crate::decode::split::FrameRange;
use crate::descriptor::{Codec, Descriptor};
use crate::plan::rebalance::{self, Decoded};
use crate::plan::record::{FailedSample, StepRecord};
use crate::plan::{PlanInput, PlanOptions, RankState, Scope, TransferCost};
use crate::policy::pieces::{OfferContext, StepOffer};
use crate::policy::{self, Policy, StepPlan};
use crate::sampler::Sampler;

/// Where a dataset's descriptors come from: the index (the loader) or a workload (the simulator).
pub trait Catalog {
    /// The sample's position and descriptor, or None when the dataset has no such id.
    fn lookup(&self, id: u64) -> Result<Option<(usize, Descriptor)>, String>;
}

/// What every rank runs with (checked equal on every rank at start).
#[derive(Clone, Debug)]
pub struct AgreedConfig {
    /// The policy.
    pub policy: Policy,
    /// Samples per global batch.
    pub global_batch: usize,
    /// Steps the run takes (nothing is planned beyond).
    pub steps: u64,
    /// Steps decoded ahead of the one in training.
    pub lookahead: usize,
    /// Preprocessing.
    pub params: Params,
    /// Tokens or latents.
    pub formula: TokenFormula,
    /// The transfer model the planner is given.
    pub transfer: TransferCost,
    /// Decode every sample predicted longer than this in pieces (None: only late ones).
    pub split_above_s: Option<f64>,
    /// How long before a step ends the last exchange of the next step's tensors happens.
    pub ship_slack_s: f64,
    /// Agree on every round's plans and schedule (an all-reduce of 8 bytes).
    pub check_plan: bool,
    /// Sampler seed.
    pub seed: u64,
    /// The accelerator model before any measurement.
    pub accel_prior: AccelModel,
    /// Observations the accelerator fit keeps.
    pub accel_window: usize,
    /// The largest fraction of planned samples that may fail (bad in the index or in decoding)
    /// before the run ends with the failing ids ([`Agreed::skip_budget`]); 1 or more: no limit.
    pub max_skip_rate: f64,
    /// Ranks per planning group (`PlanOptions::group_ranks`; 0: automatic, groups only from
    /// 1024 ranks).
    pub plan_group_ranks: u32,
    /// Whether a rank may be handed pieces after its batch's collection: the caller calls
    /// `prepare_ahead` (or `ship_ahead`) right after `next_batch`, before any collective of its
    /// own (`train_step` does). Then a step where some rank must wait whatever the schedule
    /// (the CPUs cannot keep up, or decode chains outlast the deadline) gets late ranks
    /// ([`crate::plan::Plan::late_ranks`]).
    pub late_pieces: bool,
}

/// Failures below this many never end a run, whatever the rate (a first bad sample among the
/// first few planned is no evidence of a broken dataset).
pub const MIN_SKIPS_JUDGED: u64 = 10;

/// [`AgreedConfig::max_skip_rate`]'s default: 1%.
pub const DEFAULT_MAX_SKIP_RATE: f64 = 0.01;

impl AgreedConfig {
    /// A small configuration for examples and tests: helix, G = 2, 4 steps.
    pub fn for_tests() -> AgreedConfig {
        AgreedConfig {
            policy: Policy::Helix,
            global_batch: 2,
            steps: 4,
            lookahead: 2,
            params: Params::default(),
            formula: TokenFormula::Tokens,
            transfer: policy::default_transfer(),
            split_above_s: None,
            ship_slack_s: 0.03,
            check_plan: false,
            seed: 0,
            accel_prior: AccelModel { c0: 0.01, a: 1e-6, b: 0.0 },
            accel_window: 64,
            max_skip_rate: 1.0,
            plan_group_ranks: 0,
            late_pieces: false,
        }
    }
}

/// The samples that failed so far, against the samples planned ([`Agreed::skip_budget`]), with
/// what of both belongs to the steps not yet delivered, so that a loader state counts the steps
/// before its next one only ([`Agreed::skips_before`]): a resumed run plans and decodes the others
/// again. A sample counts once per step, however many of its pieces failed (a split sample's
/// pieces decode on several ranks, and each rank reports the pieces it failed).
#[derive(Clone, Debug, Default)]
struct SkipTally {
    /// Samples failed (index-bad ones at planning, decode failures from the gathered records).
    failed: u64,
    /// The ids of the failures counted, by step, from [`FAILURES_KEPT_STEPS`] steps before the
    /// one in training on: a piece's failure told again is not counted again.
    counted: BTreeMap<u64, HashSet<u64>>,
    /// Samples of every planned global batch.
    planned: u64,
    /// The first [`NAMED_SKIPS`] failures, named in the budget's error (a resumed run's carry
    /// step 0: they are all before it).
    named: Vec<FailedSample>,
    /// The step in training: failures and plans of steps before it are final.
    training: u64,
    /// Per step from `training` on: its planned samples and failures, which `planned` and
    /// `failed` include.
    recent: BTreeMap<u64, (u64, u64)>,
}

/// Failed samples the skip budget's error names (and a loader state keeps).
pub const NAMED_SKIPS: usize = 20;

/// Steps before the one in training whose counted failures a tally keeps, to count a sample
/// whose pieces failed on several ranks once: a record tells at most
/// [`MAX_SKIPS`](crate::plan::record::MAX_SKIPS) failures a round, so a step's failures may
/// trickle in over several rounds. A piece told later still than this counts again.
pub const FAILURES_KEPT_STEPS: u64 = 64;

impl SkipTally {
    fn note_planned(&mut self, step: u64, samples: u64) {
        self.planned += samples;
        if step >= self.training {
            self.recent.entry(step).or_default().0 += samples;
        }
    }

    fn note_failed(&mut self, f: FailedSample) {
        if !self.counted.entry(f.step).or_default().insert(f.id) {
            return; // another piece of a sample counted already
        }
        self.failed += 1;
        if self.named.len() < NAMED_SKIPS {
            self.named.push(f);
        }
        if f.step >= self.training {
            self.recent.entry(f.step).or_default().1 += 1;
        }
    }

    fn note_training(&mut self, s: u64) {
        self.training = self.training.max(s);
        self.recent.retain(|&t, _| t >= s);
        let kept_from = self.training.saturating_sub(FAILURES_KEPT_STEPS);
        self.counted = self.counted.split_off(&kept_from);
    }

    fn before(&self, s: u64) -> SkipCount {
        let (planned, failed) =
            self.recent.range(s..).fold((self.planned, self.failed), |(p, f), (_, &(dp, df))| {
                (p.saturating_sub(dp), f.saturating_sub(df))
            });
        let ids = self.named.iter().filter(|f| f.step < s).map(|f| f.id).collect();
        SkipCount { planned, failed, ids }
    }
}

/// The skip budget's count of the steps before a loader state's next step: what a resumed run
/// starts counting from ([`Agreed::resume_skips`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SkipCount {
    /// Samples of those steps' global batches.
    pub planned: u64,
    /// Those of them that failed (a baseline's rank counts its own decode failures only).
    pub failed: u64,
    /// The first failed ones' ids (at most [`NAMED_SKIPS`]).
    pub ids: Vec<u64>,
}

impl SkipCount {
    /// A hash of the count, to compare ranks' by.
    pub fn hash(&self) -> u64 {
        let bytes = serde_json::to_vec(self).expect("counts serialise");
        crate::sampler::words_hash(&bytes)
    }

    /// `Ok` when the count is one a run could have kept; else what is wrong with it. (Failures
    /// may outnumber the samples planned: earlier builds counted each failed piece of a split
    /// sample, and a piece told over `FAILURES_KEPT_STEPS` (64) steps late still counts again.)
    pub fn check(&self) -> Result<(), String> {
        if self.ids.len() > NAMED_SKIPS || self.ids.len() as u64 > self.failed {
            return Err(format!("{} failed ids for {} failed samples", self.ids.len(), self.failed));
        }
        Ok(())
    }
}

/// What one sample of a planned step is.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    /// Its id.
    pub id: u64,
    /// Its catalog position (None: not in the dataset).
    pub pos: Option<usize>,
    /// Its descriptor.
    pub desc: Option<Descriptor>,
    /// Usable (known and probed ok).
    pub ok: bool,
}

/// A planned step: its samples, the plan, and each decode job's work.
#[derive(Debug)]
pub struct Planned {
    /// Every sample of the global batch, in batch order.
    pub slots: Vec<Slot>,
    /// Index into `slots` of each planner sample (the usable ones).
    pub usable: Vec<usize>,
    /// Per usable sample: predicted tokens and tensor bytes.
    pub predicted: Vec<(u64, u64)>,
    /// Per decode job: the sampled frames it decodes.
    pub ranges: Vec<FrameRange>,
    /// Per decode job: its predicted seconds on one worker.
    pub work_s: Vec<f64>,
    /// Per decode job: its output shape, `[frames of its range, H', W', 3]`.
    pub shapes: Vec<[usize; 4]>,
    /// Per decode job: whether it decodes only a piece of its sample.
    pub partial: Vec<bool>,
    /// The decisions.
    pub plan: StepPlan,
    /// The decode job of each `(slot, part)`.
    pub job_of: HashMap<(u32, u16), usize>,
    /// Per rank: the slots it trains, in batch order.
    pub owned: Vec<Vec<u32>>,
    /// Per rank: the jobs other ranks decode for it.
    pub inbound: Vec<Vec<u32>>,
    /// Per slot: its decode jobs, in piece order.
    pub jobs_of: Vec<Vec<usize>>,
    /// Whether any job is decoded away from its sample's owner (every rank knows); always
    /// with planning groups, where a rank knows only its own group's placement.
    pub moves: bool,
    /// The per-rank accelerator prediction of [`Agreed::accel_of`] and the round it was made in.
    accel_cache: std::sync::Mutex<Option<(u64, Arc<Vec<f64>>)>>,
}

impl Planned {
    /// How much longer than its accelerator work the step is expected to take: where its late
    /// ranks wait on chains ([`crate::plan::late`]), the plan's predicted delay; else 0. When
    /// the steps after it are expected due counts it. (The placement's delay carries the
    /// planning margin; the expected chains, without it, left the steps after a long one
    /// predicted due too soon, and their batches grouped late for nothing: 0.37–0.45 of the
    /// camera originals' rank-steps missed at 8 ranks became 0.42–0.47.)
    pub fn chain_wait_s(&self) -> f64 {
        if self.plan.late_ranks.is_empty() || self.plan.late_jobs_behind {
            0.0
        } else {
            self.plan.delay_s
        }
    }

    /// The batch slot of decode job `j`'s sample.
    pub fn slot_of(&self, j: usize) -> usize {
        self.usable[self.plan.jobs[j].sample as usize]
    }

    /// The rank that trains decode job `j`'s sample.
    pub fn owner_of(&self, j: usize) -> usize {
        self.plan.owner[self.plan.jobs[j].sample as usize] as usize
    }

    /// The rank that decodes job `j`.
    pub fn decoder_of(&self, j: usize) -> usize {
        self.plan.decoder[j] as usize
    }

    /// Job `j`'s part key.
    pub fn key_of(&self, j: usize) -> PartKey {
        PartKey { step: self.plan.step, slot: self.slot_of(j) as u32, part: self.plan.jobs[j].part as u16 }
    }
}

/// When a step's tensors last cross between ranks before the step is due (what the caller's
/// use of the calls allows; the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastExchange {
    /// In the step's own `Next`.
    AtCollection,
    /// In `Prepare` after the step before is delivered.
    AtPrepare,
    /// In `Ship` shortly before the step before ends.
    AtShip,
}

/// The agreed state (see the module docs).
pub struct Agreed {
    cfg: AgreedConfig,
    ranks: usize,
    sampler: Sampler,
    decode_model: CostModel,
    /// The slowest decode worker's share of a core (thousandths; 0: not enforced), from the
    /// first round's records: the decode priors are scaled to it.
    worker_millicores: u32,
    /// A resumed run's decode models, with the share they were measured at, until the first
    /// round says whether this run's workers have the same ([`Agreed::resume_from`]).
    resumed_decode: Option<(u32, Vec<SavedFit>)>,
    resumed: Resumed,
    accel: AccelFit,
    states: Vec<RankState>,
    zstd_shared: (f64, f64),
    plans: BTreeMap<u64, Arc<Planned>>,
    rounds: u64,
    training: Option<(u64, f64)>,
    /// Wall seconds the planner took (measured, never read by a decision), plans, largest.
    plan_stats: (f64, u64, f64),
    /// Plans whose step was stretched to the CPUs' pace ([`crate::plan::Plan::stretch_s`]).
    stretched: u64,
    /// Plans that left a late rank ([`crate::plan::Plan::late_ranks`]).
    late: u64,
    /// Whose decode placement this state plans: a loader's rank needs only its own planning
    /// group's at thousands of ranks ([`crate::plan::groups`]); the simulator every group's.
    scope: Scope,
    keep_inputs: bool,
    inputs: Vec<(u64, PlanInput)>,
    /// Per step: the samples as the after-decode step sees them and the moves it decided.
    after: BTreeMap<u64, Arc<AfterDecode>>,
    skips: SkipTally,
    /// The last [`PACE_STEPS`] planned steps' expected decode work spread over every worker,
    /// seconds — a planned step's jobs' (a split sample's pieces, each from its keyframe), the
    /// step being planned its samples' whole decodes. The same on every rank: jobs follow from
    /// the offer.
    paces: VecDeque<f64>,
    /// The same steps' samples' whole decodes, spread alike: what `paces` came to against them
    /// scales the steps ahead's.
    wholes: VecDeque<f64>,
    /// The same steps' balanced accelerator time (the model's, every sample's share over the
    /// ranks plus the constant), seconds.
    balanced: VecDeque<f64>,
    /// Steps not planned yet whose samples a plan looked up to pace the CPUs: what the catalog
    /// gave for each, in batch order, taken by the step's own plan (each sample is looked up
    /// once, only earlier).
    looked_up: BTreeMap<u64, Vec<LookedUp>>,
}

/// What the catalog gave for one sample id.
type LookedUp = Result<Option<(usize, Descriptor)>, String>;

/// The share of the balanced accelerator step that the planned steps' decode work (spread over
/// every worker) must reach before the steps ahead count in the CPUs' pace: below it a run is
/// not decode-bound on average, and a heavy step ahead is left to the lookahead and the
/// placement. (On the demo's data the share is 0.57–0.76 once the accelerator model is fitted;
/// a pace that looked ahead there stretched a step for nothing, −1.3% throughput simulated.)
pub const DECODE_BOUND_SHARE: f64 = 0.9;

/// Planned steps whose decode work the CPUs' pace averages: the lookahead smooths a heavy
/// step's decode over its neighbours', so a step is stretched to the pace, not to its own.
pub const PACE_STEPS: usize = 8;

/// The after-decode step's decision of one step (every rank's is the same).
#[derive(Debug, Default)]
pub struct AfterDecode {
    /// The samples, `id` holding the batch slot.
    pub decoded: Vec<Decoded>,
    /// `(index into decoded, new owner)` of each sample that moves.
    pub moves: Vec<(usize, u32)>,
}

impl Agreed {
    /// The state before the first round, for a dataset of `ids` over `ranks` ranks.
    pub fn new(cfg: AgreedConfig, ids: &[u64], ranks: usize) -> Agreed {
        let sampler = Sampler::new(ids, cfg.seed);
        Agreed::with_sampler(cfg, sampler, ranks)
    }

    /// [`Agreed::new`] with the dataset's sampler already made (the simulator shares one across
    /// policies). The sampler's seed is the configuration's.
    pub fn with_sampler(mut cfg: AgreedConfig, sampler: Sampler, ranks: usize) -> Agreed {
        cfg.seed = sampler.seed();
        Agreed {
            sampler,
            accel: AccelFit::new(cfg.accel_prior, cfg.accel_window),
            cfg,
            ranks,
            decode_model: CostModel::default(),
            worker_millicores: 0,
            resumed_decode: None,
            resumed: Resumed::No,
            states: Vec::new(),
            zstd_shared: (0.0, 0.0),
            plans: BTreeMap::new(),
            rounds: 0,
            training: None,
            plan_stats: (0.0, 0, 0.0),
            stretched: 0,
            late: 0,
            scope: Scope::Every,
            keep_inputs: false,
            inputs: Vec::new(),
            after: BTreeMap::new(),
            skips: SkipTally::default(),
            paces: VecDeque::with_capacity(PACE_STEPS),
            wholes: VecDeque::with_capacity(PACE_STEPS),
            balanced: VecDeque::with_capacity(PACE_STEPS),
            looked_up: BTreeMap::new(),
        }
    }

    /// Plans decode placement only for `rank`'s planning group ([`crate::plan::groups`]: from
    /// 1024 ranks on, a rank needs no other group's). Without it every group is placed.
    pub fn place_only_for(&mut self, rank: usize) {
        self.scope = Scope::GroupOf(rank as u32);
    }

    /// Keeps every planner input for [`Agreed::take_inputs`] (`DATAHELIX_PLAN_DUMP`).
    pub fn keep_inputs(&mut self, keep: bool) {
        self.keep_inputs = keep;
    }

    /// The planner inputs kept since the last call.
    pub fn take_inputs(&mut self) -> Vec<(u64, PlanInput)> {
        std::mem::take(&mut self.inputs)
    }

    /// The configuration.
    pub fn config(&self) -> &AgreedConfig {
        &self.cfg
    }

    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Predicted seconds of a round's step-record all-gather: every other rank's record
    /// reaching one rank over the slowest link of the transfer model (records are not
    /// compressed). Tens of microseconds on one node; milliseconds across a slow network.
    ///
    /// ```
    /// use datahelix::plan::TransferCost;
    /// use datahelix::step::{Agreed, AgreedConfig};
    ///
    /// let fast = Agreed::new(AgreedConfig::for_tests(), &[1, 2, 3, 4], 4);
    /// assert!(fast.round_gather_s() < 1e-4); // the constant model: 20 µs + 5 GB/s
    /// let link = TransferCost::linear(0.0, 7e5); // 0.7 MB/s a message, as two hosts at 20 Mbit/s
    /// let slow = Agreed::new(AgreedConfig { transfer: link, ..AgreedConfig::for_tests() }, &[1, 2, 3, 4], 4);
    /// assert!(slow.round_gather_s() > 2e-3);
    /// ```
    pub fn round_gather_s(&self) -> f64 {
        let bytes = crate::plan::record::RECORD_BYTES * self.ranks.saturating_sub(1);
        self.cfg.transfer.seconds(bytes as u64)
    }

    /// Rounds filed so far.
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// The accelerator model learnt so far.
    pub fn accel_model(&self) -> AccelModel {
        self.accel.model()
    }

    /// The decode-cost model learnt so far.
    pub fn decode_model(&self) -> &CostModel {
        &self.decode_model
    }

    /// Planner wall seconds in all, plans made, and the largest plan's seconds. Where decode
    /// work is placed in groups and every group's placement is made here (the simulator), a plan
    /// counts the time of its slowest group's only, beside the rest: what a rank that places
    /// only its own group spends, at most.
    pub fn plan_stats(&self) -> (f64, u64, f64) {
        self.plan_stats
    }

    /// How many plans stretched their step past the balanced one to the CPUs' pace (a
    /// decode-bound step: [`crate::plan::batching::stretch`]).
    pub fn stretched_plans(&self) -> u64 {
        self.stretched
    }

    /// How many plans left a late rank ([`crate::plan::Plan::late_ranks`]).
    pub fn late_plans(&self) -> u64 {
        self.late
    }

    /// Whether ranks have reported at least once.
    pub fn has_states(&self) -> bool {
        !self.states.is_empty()
    }

    /// The plan of step `t`, if made and not retired.
    pub fn plan_of(&self, t: u64) -> Option<&Arc<Planned>> {
        self.plans.get(&t)
    }

    /// Whether step `t` is planned and moves a tensor between ranks.
    pub fn moves(&self, t: u64) -> bool {
        self.plans.get(&t).is_some_and(|p| p.moves)
    }

    /// Per rank, the predicted accelerator seconds of step `s`'s batch under the model as it is
    /// now (predicted again at most once per round).
    pub fn accel_of(&mut self, s: u64) -> Option<Arc<Vec<f64>>> {
        let rounds = self.rounds;
        let model = self.accel.model();
        let p = self.plans.get(&s)?;
        let mut cache = p.accel_cache.lock().unwrap_or_else(|e| e.into_inner());
        match &*cache {
            Some((r, a)) if *r == rounds => Some(Arc::clone(a)),
            _ => {
                let a = Arc::new(p.plan.accel_under(&model));
                *cache = Some((rounds, Arc::clone(&a)));
                Some(a)
            }
        }
    }

    /// What this state learned so far, for a loader state to resume from
    /// ([`Agreed::resume_from`]).
    pub fn learned(&self) -> Learned {
        let (worker_millicores, decode) = match &self.resumed_decode {
            // Resumed, and no round yet: what the state gave.
            Some((m, fits)) => (*m, fits.clone()),
            None => (self.worker_millicores, self.decode_model.saved()),
        };
        Learned {
            worker_millicores,
            decode,
            accel: self.accel.recent(MAX_ACCEL_OBSERVATIONS),
            zstd: [self.zstd_shared.0, self.zstd_shared.1],
            paces: self.paces.iter().copied().collect(),
            wholes: self.wholes.iter().copied().collect(),
            balanced: self.balanced.iter().copied().collect(),
        }
    }

    /// Starts from what a run before learned (checked: [`Learned::check`]), before the first
    /// round: the accelerator fit, the zstd figures and the CPUs' recent pace at once; the decode
    /// models at the first round, where its records show workers of the share they were measured
    /// at (else the priors, and [`Agreed::resumed`] says why).
    pub fn resume_from(&mut self, learned: Learned) {
        let obs: Vec<(f64, f64, f64)> = learned.accel.iter().map(|o| (o[0], o[1], o[2])).collect();
        self.accel.observe_many(&obs);
        self.zstd_shared = (learned.zstd[0], learned.zstd[1]);
        let tail = |w: Vec<f64>| w.iter().rev().take(PACE_STEPS).rev().copied().collect();
        self.paces = tail(learned.paces);
        self.wholes = tail(learned.wholes);
        self.balanced = tail(learned.balanced);
        self.resumed_decode = Some((learned.worker_millicores, learned.decode));
        self.resumed = Resumed::Restored;
    }

    /// A resumed run's start that restores nothing, and why (the ranks' states disagree).
    pub fn resume_from_priors(&mut self, why: String) {
        self.resumed = Resumed::Priors(why);
    }

    /// Whether, and how far, this state started from what a run before learned.
    pub fn resumed(&self) -> &Resumed {
        &self.resumed
    }

    /// The decode model of the first round: the resumed one where the workers' share matches,
    /// else the priors scaled to the slowest worker.
    fn first_decode_model(&mut self) -> CostModel {
        let m = self.worker_millicores;
        let cores = if m > 0 { m as f64 / 1000.0 } else { 1.0 };
        let share = |m: u32| {
            if m > 0 {
                format!("{:.3} of a core", m as f64 / 1000.0)
            } else {
                "an unenforced CPU budget".into()
            }
        };
        match self.resumed_decode.take() {
            Some((saved, fits)) if saved == m => match CostModel::restored(cores, &fits) {
                Ok(model) => return model,
                Err(why) => self.resumed = Resumed::DecodePriors(why),
            },
            Some((saved, _)) => {
                self.resumed = Resumed::DecodePriors(format!(
                    "they were measured on decode workers of {}, this run's have {}",
                    share(saved),
                    share(m)
                ))
            }
            None => {}
        }
        CostModel::for_worker_cores(cores)
    }

    /// Files round `round`'s records (rank order) — once: a later call for the same round is a
    /// no-op (the simulator's engines all file it). `step` is the step the records close.
    pub fn absorb(&mut self, round: u64, step: u64, records: &[StepRecord]) {
        if round < self.rounds {
            return;
        }
        self.rounds = round + 1;
        let measured: Vec<(f64, f64, f64)> = records
            .iter()
            .filter(|r| step > 0 && r.gpu_s > 0.0)
            .map(|r| (r.sum_tokens, r.sum_tokens_sq, r.gpu_s))
            .collect();
        self.accel.observe_many(&measured);
        if round == 0 {
            // The priors are for a whole core: scale them to the slowest rank's worker.
            let slowest = records.iter().map(|r| r.worker_millicores).filter(|&m| m > 0).min();
            self.worker_millicores = slowest.unwrap_or(0);
            self.decode_model = self.first_decode_model();
        }
        for r in records {
            for o in &r.observations {
                if let Some(codec) = Codec::from_byte(o.codec) {
                    let f = Features { mpixels: o.mpixels, mbits: o.mbits, discarded: o.discarded };
                    self.decode_model.observe_features(codec, &f, o.seconds);
                }
            }
        }
        for f in records.iter().flat_map(|r| &r.skips) {
            self.skips.note_failed(*f);
        }
        self.states = records.iter().map(StepRecord::rank_state).collect();
        let zstd: Vec<&StepRecord> = records.iter().filter(|r| r.zstd_bps > 0.0).collect();
        if !zstd.is_empty() {
            let n = zstd.len() as f64;
            self.zstd_shared = (
                zstd.iter().map(|r| r.zstd_ratio).sum::<f64>() / n,
                zstd.iter().map(|r| r.zstd_bps).sum::<f64>() / n,
            );
        }
    }

    /// A sample that failed on this rank, for the DataLoader-style baselines, which gather no
    /// records after their first round: their skip budget counts each rank's own failures (and
    /// the index-bad samples every rank knows) against its share of the planned samples.
    pub fn note_local_skip(&mut self, f: FailedSample) {
        self.skips.note_failed(f);
    }

    /// The skip budget's count of the steps before `s`, for a loader state whose next step is
    /// `s` (not before the step in training): the steps from `s` on, planned and perhaps
    /// decoded already, are planned and decoded again by the run that resumes it.
    pub fn skips_before(&self, s: u64) -> SkipCount {
        self.skips.before(s)
    }

    /// Starts the skip budget's count from a resumed run's (checked: [`SkipCount::check`]),
    /// before the first plan.
    pub fn resume_skips(&mut self, count: SkipCount) {
        self.skips.planned += count.planned;
        self.skips.failed += count.failed;
        let room = NAMED_SKIPS.saturating_sub(self.skips.named.len());
        self.skips.named.extend(count.ids.into_iter().take(room).map(|id| FailedSample { step: 0, id }));
    }

    /// Whether the run stays within its skip budget: `Err` (what failed and what to do) once more
    /// than `max_skip_rate` of the samples planned so far failed, and at least
    /// [`MIN_SKIPS_JUDGED`]. With records every round, every rank reaches the same verdict at the
    /// same round, so the run ends everywhere at once.
    pub fn skip_budget(&self) -> Result<(), String> {
        let rate = self.cfg.max_skip_rate;
        let failed = self.skips.failed;
        let planned = if self.cfg.policy.uses_records() {
            self.skips.planned
        } else {
            self.skips.planned.div_ceil(self.ranks.max(1) as u64)
        };
        if rate >= 1.0 || failed < MIN_SKIPS_JUDGED || (failed as f64) <= rate * planned as f64 {
            return Ok(());
        }
        let shown: Vec<String> = self.skips.named.iter().map(|f| f.id.to_string()).collect();
        let more = failed.saturating_sub(shown.len() as u64);
        Err(format!(
            "{failed} of the {planned} samples planned so far failed (bad in the index, or their decode: each decoding \
             rank's log says why), more than --max-skip-rate {rate}: ids {}{}; fix or remove them and re-run \
             `datahelix index`, or raise max_skip_rate",
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ))
    }

    /// The step in training and its predicted seconds on the slowest rank; set once per step by
    /// the first engine that delivers it.
    pub fn start_training(&mut self, s: u64) {
        self.skips.note_training(s);
        if self.training.is_some_and(|t| t.0 >= s) {
            return;
        }
        let model = self.accel.model();
        self.training = self.plans.get(&s).map(|p| (s, p.plan.step_under(&model)));
        self.plans.retain(|&t, _| t >= s);
        self.after.retain(|&t, _| t >= s);
    }

    /// DataHelix's cost-gated rebalance of step `s`, decided from the plan's predictions —
    /// known before any tensor is decoded (under the protocol they are the decoded sizes, failed
    /// samples aside). Decided once per step.
    pub fn gate(&mut self, s: u64) -> Arc<AfterDecode> {
        if let Some(a) = self.after.get(&s) {
            return Arc::clone(a);
        }
        let decision = match self.plans.get(&s) {
            Some(p) => {
                let decoded: Vec<Decoded> = p
                    .usable
                    .iter()
                    .zip(&p.predicted)
                    .zip(&p.plan.owner)
                    .map(|((&k, &(tokens, bytes)), &owner)| Decoded { id: k as u64, owner, tokens, bytes })
                    .collect();
                let model = self.accel.model();
                // A step the plan stretched to the CPUs' pace ends no sooner for a cut below it.
                let floor_s = (p.plan.stretch_s - model.c0).max(0.0);
                let d = rebalance::rebalance_above(
                    &decoded,
                    self.ranks,
                    &model,
                    &self.effective_transfer(),
                    0.1,
                    floor_s,
                );
                // A late-rank step moves nothing after decoding: its late exchange comes at
                // different points of the ranks' calls, and a move at collection between them
                // would meet a rank in another collective.
                let moves = if !p.plan.late_ranks.is_empty() {
                    Vec::new()
                } else {
                    d.moves.iter().map(|m| (m.sample, m.to)).collect()
                };
                AfterDecode { decoded, moves }
            }
            None => AfterDecode::default(),
        };
        let a = Arc::new(decision);
        self.after.insert(s, Arc::clone(&a));
        a
    }

    /// The CPUs' pace for the plan of step `t` ([`PlanInput::decode_pace_s`]), seconds: a
    /// step's expected decode work spread over every worker. While `t` trains, the CPUs decode
    /// the steps after it (`t + 1 … t + L`, L the lookahead), so that is what a stretch of `t`
    /// must make room for: their samples are known (the sampler) before they are planned, and
    /// their whole decodes are scaled by what the last planned steps' jobs came to against
    /// theirs (pieces decode less than a whole clip's prediction says). Three quarters of the
    /// pace is theirs, one quarter the mean of the last [`PACE_STEPS`] planned steps' (this one
    /// by its samples) — once that mean reaches [`DECODE_BOUND_SHARE`] of the same steps' mean
    /// balanced accelerator step; below it the past alone is the pace (the stretch then acts
    /// only on a step the balance leaves shorter than it, as before the steps ahead counted).
    /// Measured on the suite (8 ranks): the steps ahead alone took
    /// cogvideox-latents to 0.893 of the bound at `cpu_per_accel` 1.0, half and half left its
    /// misses at 1.25 above rank-local's, and the past alone (until 2026-12-05) left those of
    /// cogvideox-latents and opensora-1.2-buckets there above rank-local's (0.107 and 0.047
    /// against 0.097 and 0.035; now 0.017 and 0.026). At the run's end only the past counts.
    fn cpu_pace_s(&mut self, t: u64, catalog: &dyn Catalog, workers: f64) -> f64 {
        let past = self.paces.iter().sum::<f64>() / self.paces.len().max(1) as f64;
        let balanced = self.balanced.iter().sum::<f64>() / self.balanced.len().max(1) as f64;
        if past < DECODE_BOUND_SHARE * balanced {
            return past;
        }
        let planned = self.paces.len().saturating_sub(1);
        let jobs: f64 = self.paces.iter().take(planned).sum();
        let wholes: f64 = self.wholes.iter().take(planned).sum();
        let scale = if jobs > 0.0 && wholes > 0.0 { jobs / wholes } else { 1.0 };
        let last = (t + self.cfg.lookahead as u64).min(self.cfg.steps.saturating_sub(1));
        let ahead: Vec<f64> = (t + 1..=last).map(|u| self.expected_whole_s(u, catalog)).collect();
        if ahead.is_empty() {
            return past;
        }
        let next = ahead.iter().sum::<f64>() / ahead.len() as f64 * scale / workers;
        0.25 * past + 0.75 * next
    }

    /// Step `u`'s usable samples' expected whole decodes on one worker, without the planning
    /// margin, on today's model, before `u` is planned. A sample the catalog cannot give counts
    /// nothing here; its step's plan reports it.
    fn expected_whole_s(&mut self, u: u64, catalog: &dyn Catalog) -> f64 {
        let (sampler, batch) = (&self.sampler, self.cfg.global_batch);
        let looked = self.looked_up.entry(u).or_insert_with(|| {
            sampler.global_batch(u, batch).into_iter().map(|id| catalog.lookup(id)).collect()
        });
        looked
            .iter()
            .filter_map(|l| match l {
                Ok(Some((_, d))) if d.status.is_ok() => {
                    Some(self.decode_model.predict(d, &self.cfg.params).max(0.0))
                }
                _ => None,
            })
            .sum()
    }

    /// Post-balance's token LPT of step `s` over every rank's gathered `(slot, tokens, bytes)`
    /// (`gathered()` is called only by the first engine to ask). Decided once per step.
    pub fn token_balance(&mut self, s: u64, gathered: impl FnOnce() -> Vec<Decoded>) -> Arc<AfterDecode> {
        if let Some(a) = self.after.get(&s) {
            return Arc::clone(a);
        }
        let mut decoded = gathered();
        decoded.sort_by_key(|d| d.id);
        let moves = policy::token_balance(&decoded, self.ranks);
        let a = Arc::new(AfterDecode { decoded, moves });
        self.after.insert(s, Arc::clone(&a));
        a
    }

    /// Plans step `t` from step `now` (which trains now or is about to) — once: a later call for
    /// a planned step returns its plan.
    pub fn plan(
        &mut self,
        t: u64,
        now: u64,
        catalog: &dyn Catalog,
        last: LastExchange,
    ) -> Result<Arc<Planned>, StepError> {
        if let Some(p) = self.plans.get(&t) {
            return Ok(Arc::clone(p));
        }
        let ids = self.sampler.global_batch(t, self.cfg.global_batch);
        let mut looked = self.looked_up.remove(&t).filter(|l| l.len() == ids.len());
        self.looked_up.retain(|&u, _| u > t);
        let mut slots = Vec::with_capacity(ids.len());
        for (k, &id) in ids.iter().enumerate() {
            let found = match looked.as_mut() {
                Some(l) => std::mem::replace(&mut l[k], Ok(None)),
                None => catalog.lookup(id),
            };
            let found = found.map_err(StepError::Catalog)?;
            let (pos, desc) = match found {
                Some((p, d)) => (Some(p), Some(d)),
                None => (None, None),
            };
            slots.push(Slot { id, pos, desc, ok: desc.is_some_and(|d| d.status.is_ok()) });
        }
        let usable: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].ok).collect();
        self.skips.note_planned(t, slots.len() as u64);
        for slot in slots.iter().filter(|s| !s.ok) {
            self.skips.note_failed(FailedSample { step: t, id: slot.id });
        }
        // Every rank's batch of step t is due when step t−1 ends; steps planned before are
        // predicted again (the model has learned since), against the steps running short by
        // one spread of the model: a batch is then ready even when they do.
        let model = self.accel.model();
        // Before the first step is measured the model is the prior, whose deadlines say every
        // batch is late: the plans made then split no sample for them (`split_above_s` still
        // does) and move no decode work: at 4096 ranks that search took 600–800 ms a plan. They
        // decode on the owners the prior's batching chose (on the demo's data one rank then
        // waited 2.2 s at warm-up for a clip the search had split).
        let measured = !self.accel.is_empty();
        let planned = |j| self.plans.get(&j).map(|p: &Arc<Planned>| p.plan.step_under(&model));
        let due = policy::time_to_deadline(now, t, planned, self.training) * (-self.accel.spread()).exp();
        // When the batch is expected due, the waits on chains of the steps before counted.
        let waited =
            |j| self.plans.get(&j).map(|p: &Arc<Planned>| p.plan.step_under(&model) + p.chain_wait_s());
        let late_due = policy::time_to_deadline(now, t, waited, self.training);
        let exchange = match last {
            LastExchange::AtShip => (due - self.cfg.ship_slack_s).max(0.0),
            LastExchange::AtPrepare => policy::time_to_exchange(now, t, planned, self.training),
            LastExchange::AtCollection => 0.0,
        };
        let descriptors: Vec<Descriptor> = usable.iter().filter_map(|&k| slots[k].desc).collect();
        let offer = StepOffer::new(
            &descriptors,
            &OfferContext {
                params: &self.cfg.params,
                formula: &self.cfg.formula,
                model: &self.decode_model,
                due_s: if measured { due } else { 0.0 },
                ranks: self.ranks,
                split_above_s: self.cfg.split_above_s,
            },
        );
        // The CPUs' pace, once measured (the prior decode model may be far off).
        let workers: u32 = (0..self.ranks).map(|r| self.states.get(r).map_or(1, |s| s.workers.max(1))).sum();
        let workers = workers.max(1) as f64;
        let accel_work: f64 = offer.samples.iter().map(|x| model.sample_seconds(x.tokens)).sum();
        let balanced = model.c0.max(0.0) + accel_work / self.ranks.max(1) as f64;
        for (window, value) in [
            (&mut self.paces, offer.expected_decode_s / workers),
            (&mut self.wholes, offer.expected_decode_s / workers),
            (&mut self.balanced, balanced),
        ] {
            if window.len() == PACE_STEPS {
                window.pop_front();
            }
            window.push_back(value);
        }
        let pace = if measured { self.cpu_pace_s(t, catalog, workers) } else { 0.0 };
        let pace_spread = std_dev(&self.paces);
        let states: Vec<RankState> = (0..self.ranks)
            .map(|r| {
                let reported = self.states.get(r).copied().unwrap_or(RankState {
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
            ranks: states,
            accel: model,
            transfer: self.effective_transfer(),
            options: PlanOptions {
                placement_moves: if measured { PlanOptions::default().placement_moves } else { 0 },
                group_ranks: self.cfg.plan_group_ranks,
                ..PlanOptions::default()
            },
            pieces: offer.pieces.clone(),
            exchange_s: exchange,
            decode_pace_s: pace,
            decode_pace_spread_s: pace_spread,
            // Only where the caller's next call follows its batch before any collective of its
            // own: the pieces owed to the late rank are sent from there.
            late_pieces: self.cfg.late_pieces && last != LastExchange::AtCollection,
            late_due_s: if measured { late_due } else { 0.0 },
        };
        let clock = Instant::now();
        let plan = policy::plan_step(self.cfg.policy, t, &input, self.scope)?;
        let took = clock.elapsed().as_secs_f64()
            - plan.timing.map_or(0.0, |g| if g.groups > 1 { g.total_s - g.slowest_s } else { 0.0 });
        self.plan_stats = (self.plan_stats.0 + took, self.plan_stats.1 + 1, self.plan_stats.2.max(took));
        self.stretched += u64::from(plan.stretch_s > 0.0);
        self.late += u64::from(!plan.late_ranks.is_empty());
        let work = offer.job_work(plan.jobs.len());
        // Once planned, the step's pace counts its jobs' expected decode (without the planning
        // margin), not its samples' whole decodes: where samples are split, those overstate the
        // work by 6–13% on the long-video sets (a whole video's prediction extrapolates the
        // pieces the model learns from), and the stretch acted on steps the CPUs kept up with.
        let expected: f64 = (0..plan.jobs.len())
            .map(|j| {
                let codec = descriptors[plan.jobs[j].sample as usize].codec;
                work[j].decode_s / self.decode_model.planning_factor(codec).max(1e-9)
            })
            .sum();
        if let Some(last) = self.paces.back_mut() {
            *last = expected / workers;
        }
        let partial: Vec<bool> = (0..plan.jobs.len())
            .map(|j| work[j].frames != FrameRange::whole(offer.frames[plan.jobs[j].sample as usize]))
            .collect();
        let shapes = (0..plan.jobs.len())
            .map(|j| {
                let d = &descriptors[plan.jobs[j].sample as usize];
                let (_, h, w) = output_shape(d, &self.cfg.params);
                [work[j].frames.len() as usize, h as usize, w as usize, 3]
            })
            .collect();
        let mut planned = Planned {
            slots,
            usable,
            predicted: input.samples.iter().map(|x| (x.tokens, x.bytes)).collect(),
            ranges: work.iter().map(|w| w.frames).collect(),
            work_s: work.iter().map(|w| w.decode_s).collect(),
            shapes,
            partial,
            plan,
            job_of: HashMap::new(),
            owned: vec![Vec::new(); self.ranks],
            inbound: vec![Vec::new(); self.ranks],
            jobs_of: Vec::new(),
            moves: false,
            accel_cache: Default::default(),
        };
        let mut jobs_of: Vec<Vec<usize>> = vec![Vec::new(); planned.slots.len()];
        for j in 0..planned.plan.jobs.len() {
            let key = planned.key_of(j);
            planned.job_of.insert((key.slot, key.part), j);
            let owner = planned.owner_of(j);
            if planned.plan.jobs[j].part == 0 {
                planned.owned[owner].push(key.slot);
            }
            if planned.decoder_of(j) != owner {
                planned.inbound[owner].push(j as u32);
                planned.moves = true;
            }
            jobs_of[key.slot as usize].push(j);
        }
        for js in &mut jobs_of {
            js.sort_by_key(|&j| planned.plan.jobs[j].part);
        }
        // With groups no rank knows whether another group moves anything: every rank then
        // takes part in the exchanges (one that has nothing to send or receive sends nothing).
        if planned.plan.groups > 0 {
            planned.moves = true;
        }
        planned.jobs_of = jobs_of;

        for slots in &mut planned.owned {
            slots.sort_unstable();
        }
        if self.keep_inputs {
            self.inputs.push((t, input));
        }
        let planned = Arc::new(planned);
        self.plans.insert(t, Arc::clone(&planned));
        Ok(planned)
    }

    /// The transfer model with zstd folded in where compressing is predicted to be faster.
    pub fn effective_transfer(&self) -> TransferCost {
        let (ratio, bps) = self.zstd_shared;
        if ratio <= 0.0 || bps <= 0.0 {
            return self.cfg.transfer.clone();
        }
        // Seconds per byte: raw 1/β; compressed: compress + decompress (≈ a third) + ratio/β.
        self.cfg.transfer.map_bands(|alpha, beta| {
            let raw = 1.0 / beta.max(1.0);
            let zstd = 1.33 / bps + ratio / beta.max(1.0);
            (alpha, 1.0 / raw.min(zstd))
        })
    }

    /// Whether a tensor of `bytes` is predicted to cross faster compressed (zstd level 1) from
    /// rank `from` to rank `to` (over a node's own links or between nodes).
    pub fn compress(&self, bytes: usize, from: usize, to: usize) -> bool {
        let (ratio, bps) = self.zstd_shared;
        if ratio <= 0.0 || bps <= 0.0 {
            return false;
        }
        let t = &self.cfg.transfer;
        let bands = if t.same_node(from, to) { &t.bands } else { &t.inter_node };
        let beta = bands.last().map_or(1e9, |b| b.2).max(1.0);
        let b = bytes as f64;
        b * (1.33 / bps + ratio / beta) < b / beta
    }

    /// Tokens of a sample of `frames × h × w` output with `text` text tokens.
    pub fn tokens(&self, text: u32, shape: [usize; 4]) -> u64 {
        self.cfg.formula.count(text, shape[0] as u32, shape[1] as u32, shape[2] as u32)
    }
}

/// The standard deviation of `values` (of the whole window, not an estimate of a wider one); 0
/// for fewer than two. (Not the cost models' `spread`, a log-residual of predictions.)
fn std_dev(values: &VecDeque<f64>) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    (values.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(step: u64, id: u64) -> FailedSample {
        FailedSample { step, id }
    }

    #[test]
    fn a_state_counts_the_steps_before_its_next_one_only() {
        let mut t = SkipTally::default();
        // Steps 0 to 3 planned (two of them ahead of the step in training), an index-bad sample
        // in step 3, decode failures of steps 1 and 2 told by records.
        for step in 0..4 {
            t.note_planned(step, 4);
        }
        t.note_failed(failed(3, 30));
        t.note_training(1);
        t.note_failed(failed(1, 10));
        t.note_failed(failed(2, 20));
        assert_eq!(t.before(2), SkipCount { planned: 8, failed: 1, ids: vec![10] });
        assert_eq!(t.before(3), SkipCount { planned: 12, failed: 2, ids: vec![10, 20] });
        // A failure of a step gone by, told late, is in every count after it.
        t.note_training(2);
        t.note_failed(failed(0, 5));
        assert_eq!(t.before(3), SkipCount { planned: 12, failed: 3, ids: vec![10, 20, 5] });
        assert_eq!(t.recent.keys().copied().collect::<Vec<_>>(), [2, 3]);
        // The budget judges them all.
        assert_eq!((t.planned, t.failed), (16, 4));
    }

    #[test]
    fn a_sample_whose_pieces_failed_on_several_ranks_counts_once_a_step() {
        let mut t = SkipTally::default();
        t.note_planned(0, 4);
        t.note_planned(1, 4);
        t.note_failed(failed(0, 7));
        t.note_failed(failed(0, 7)); // its other piece, from another rank's record
        t.note_failed(failed(1, 7)); // the same sample in another step (another epoch)
        assert_eq!(t.before(2), SkipCount { planned: 8, failed: 2, ids: vec![7, 7] });
        // A piece told after the tally stopped keeping its step counts again.
        t.note_training(FAILURES_KEPT_STEPS + 1);
        t.note_failed(failed(0, 7));
        assert_eq!(t.failed, 3);
        t.note_failed(failed(1, 7));
        assert_eq!(t.failed, 3);
    }

    #[test]
    fn a_resumed_count_brings_the_verdict_forward() {
        let cfg = AgreedConfig { max_skip_rate: 0.1, ..AgreedConfig::for_tests() };
        let mut fresh = Agreed::new(cfg.clone(), &[1, 2, 3, 4], 2);
        let mut resumed = Agreed::new(cfg, &[1, 2, 3, 4], 2);
        resumed.resume_skips(SkipCount { planned: 40, failed: 9, ids: vec![7; 9] });
        for a in [&mut fresh, &mut resumed] {
            a.skips.note_planned(10, 4);
            a.note_local_skip(failed(10, 3));
        }
        assert!(fresh.skip_budget().is_ok(), "1 failure is below the judged minimum");
        let e = resumed.skip_budget().unwrap_err();
        assert!(e.starts_with("10 of the 44 samples planned so far failed"), "{e}");
        assert!(e.contains("ids 7, 7, 7, 7, 7, 7, 7, 7, 7, 3;"), "{e}");
    }
}
