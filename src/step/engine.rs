//! One rank's step engine: the stages of each call, and what this rank alone knows.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::agreed::{AfterDecode, LastExchange, Planned};
use super::{
    Action, Agreed, BatchSpec, Call, Catalog, DecodeRequest, Event, ExchangeOrder, Finished, Message,
    PartKey, Payload, SampleSpec, StepError,
};
use crate::decode::cost::Features;
use crate::plan::rebalance::Decoded;
use crate::plan::record::{DecodeObservation, FailedSample, StepRecord};
use crate::plan::{Fnv, PlanOptions};
use crate::policy;

/// Run-level counters of one rank.
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
    /// Samples this rank sent in a rebalance while the step before trained (off the
    /// input-wait path).
    pub moved_ahead: u64,
    /// Samples this rank sent in a rebalance while its step was collected (on it).
    pub moved_at_collection: u64,
}

/// A sample put together on this rank (its bytes are the driver's).
#[derive(Clone, Copy, Debug)]
struct Held {
    id: u64,
    shape: [usize; 4],
    tokens: u64,
}

/// The stages of a call, run in order; a stage may put further stages in front of the rest.
#[derive(Clone, Debug)]
enum Stage {
    /// Records (when needed) and planning of the steps `from ..= current + L` not planned yet.
    Round { current: u64, from: u64 },
    /// A round from step `step` before its batch is collected, when its plan splits a sample
    /// and predicts it late by more than a step (a decode longer than its window: the steps
    /// ahead, likely the same, start decoding while the late rank waits).
    EarlyRound { step: u64 },
    /// Plans `todo` and submits this rank's jobs (after the records were filed).
    Plan { current: u64, todo: Vec<u64>, check: bool },
    /// All ranks agree on this round's plans and on the collectives issued so far.
    Agree { value: u64, steps: Vec<u64> },
    /// Collecting step `s`: its exchange when it moves tensors, then the own decodes.
    Collect { step: u64 },
    /// One exchange of step `step`'s parts; `all`: every owed part (waiting for it first).
    Exchange { step: u64, label: &'static str, all: bool },
    /// Waits for this rank's parts of `step` owed to others, until the slack before the slowest
    /// rank's predicted end of the step that ends (on this rank) at `step_end_s`.
    AwaitOwed { step: u64, step_end_s: f64 },
    /// Waits for this rank's own parts of `step`.
    AwaitOwn { step: u64 },
    /// Fails unless these decodes are done.
    CheckDone { step: u64, keys: Vec<PartKey> },
    /// Puts every sample of `step` this rank trains together.
    Assemble { step: u64 },
    /// Puts this rank's split samples of `step` whose parts are all in hand together.
    AssembleAhead { step: u64 },
    /// The policy's after-decode step.
    AfterDecode { step: u64 },
    /// Moves whole samples as decided (those not moved ahead already).
    MoveSamples { step: u64, decision: Arc<AfterDecode> },
    /// Ahead of the step (shipping): decides the cost-gated rebalance of `step` — from the
    /// plan's predictions, so nothing waits for it — and puts together the samples it moves
    /// away from this rank whose parts are all in hand.
    AssembleMoving { step: u64 },
    /// Ahead of the step: moves the samples put together for the move, off the input-wait path
    /// (every pair of the decision meets; what is not ready moves at collection).
    MoveAhead { step: u64, decision: Arc<AfterDecode> },
    /// Hands the batch over.
    Deliver { step: u64 },
    /// A late-rank step, after its collection's exchange, on a late rank: it receives the
    /// pieces decoded for it that were not ready ([`crate::plan::Plan::late_ranks`]) and sends
    /// what it owes the other late ranks, once decoded.
    LateReceive { step: u64 },
    /// A late-rank step, after its collection's exchange, on another rank: the pieces it still
    /// owes the late ranks, sent at the start of its next call.
    LateOwed { step: u64 },
    /// The start of the call after a late-rank step's collection: this rank's pieces for the
    /// late ranks, once decoded, in one exchange (empty where it owes none).
    LateSend { step: u64, keys: Vec<PartKey> },
}

/// Which answer the engine waits for.
#[derive(Clone, Debug)]
enum Waiting {
    Records { current: u64, todo: Vec<u64> },
    Agree { steps: Vec<u64> },
    Parts,
    Samples { step: u64, expected: HashSet<(usize, u32)> },
    Sizes { step: u64, per_rank: usize },
}

/// One rank's step engine (see the module docs for the schedule it follows).
pub struct Engine {
    rank: usize,
    ranks: usize,
    workers: u32,
    worker_millicores: u32,
    record: StepRecord,
    /// zstd (ratio, bytes/s) measured on this rank.
    zstd: (f64, f64),
    /// Predicted seconds of this rank's decode jobs queued or running.
    outstanding: HashMap<PartKey, f64>,
    /// This rank's finished decodes not yet used.
    done: HashMap<PartKey, Finished>,
    /// Parts received from other ranks not yet used.
    received: HashMap<PartKey, Message>,
    sent: HashSet<PartKey>,
    got: HashSet<PartKey>,
    held: BTreeMap<(u64, u32), Held>,
    /// Slots `(step, slot)` this rank trains that are put together or skipped already.
    settled: HashSet<(u64, u32)>,
    /// Slots `(step, slot)` a rebalance moved already (sent from or received by this rank).
    moved: HashSet<(u64, u32)>,
    skipped: HashMap<u64, Vec<u64>>,
    bytes_in: HashMap<u64, u64>,
    cpu_by_step: HashMap<u64, f64>,
    /// Decode timings offered to the record since it was made (it keeps a sample of them).
    observed: u64,
    /// Steps whose jobs this rank submitted.
    submitted: HashSet<u64>,
    next_step: u64,
    prepared: Option<u64>,
    behind_slowest_s: f64,
    /// This rank's predicted accelerator seconds of the step in training.
    own_step_s: f64,
    prepares: bool,
    ships: bool,
    last_tokens: Option<Vec<u64>>,
    /// Records this rank gathered (rounds).
    rounds: u64,
    /// Hash of the collectives issued so far (kind, step), and how many.
    schedule: Fnv,
    collectives: u64,
    stages: VecDeque<Stage>,
    waiting: Option<Waiting>,
    counters: Counters,
    /// This rank's decode failures not yet told: in its next records (a record lists
    /// [`MAX_SKIPS`](crate::plan::record::MAX_SKIPS); the rest wait for the next), or straight
    /// to the skip budget for the baselines, which gather no records after their first round.
    failed: VecDeque<FailedSample>,
    /// A late-rank step collected here (not the late rank): its pieces for the late rank not
    /// sent at collection, to send from the next call.
    late_out: Option<(u64, Vec<PartKey>)>,
}

fn protocol(what: String) -> StepError {
    StepError::Protocol(what)
}

impl Engine {
    /// The engine of `rank` of `ranks`, with `workers` decode workers of `worker_millicores`
    /// thousandths of a core each (0: not limited).
    pub fn new(rank: usize, ranks: usize, workers: u32, worker_millicores: u32) -> Engine {
        Engine {
            rank,
            ranks,
            workers,
            worker_millicores,
            record: StepRecord { rank: rank as u32, workers, worker_millicores, ..StepRecord::default() },
            zstd: (0.0, 0.0),
            failed: VecDeque::new(),
            outstanding: HashMap::new(),
            done: HashMap::new(),
            received: HashMap::new(),
            sent: HashSet::new(),
            got: HashSet::new(),
            held: BTreeMap::new(),
            settled: HashSet::new(),
            moved: HashSet::new(),
            skipped: HashMap::new(),
            bytes_in: HashMap::new(),
            cpu_by_step: HashMap::new(),
            observed: 0,
            submitted: HashSet::new(),
            next_step: 0,
            prepared: None,
            behind_slowest_s: 0.0,
            own_step_s: 0.0,
            prepares: false,
            ships: false,
            last_tokens: None,
            rounds: 0,
            schedule: Fnv::default(),
            collectives: 0,
            stages: VecDeque::new(),
            waiting: None,
            counters: Counters::default(),
            late_out: None,
        }
    }

    /// Starts the run at `step` instead of 0 (a resumed run: the steps before were delivered by
    /// an earlier one). Only before the first call.
    pub fn start_at(&mut self, step: u64) -> Result<(), StepError> {
        if self.collectives > 0 || self.busy() || self.next_step != 0 {
            return Err(protocol(format!("rank {}: start_at({step}) after the run began", self.rank)));
        }
        self.next_step = step;
        Ok(())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The step the next [`Call::Next`] delivers.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Run-level counters.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Collectives issued so far, and the hash of their sequence (kind and step of each).
    pub fn schedule(&self) -> (u64, u64) {
        (self.collectives, self.schedule.finish())
    }

    /// How much longer than this rank's the slowest rank's step in training is predicted to take.
    pub fn behind_slowest_s(&self) -> f64 {
        self.behind_slowest_s
    }

    /// This rank's predicted accelerator seconds of the step in training (the model's).
    pub fn own_step_s(&self) -> f64 {
        self.own_step_s
    }

    /// Whether this rank still owes `key` to a late rank (its bytes must be kept past its
    /// step's delivery, until the next call sends them).
    pub fn owes_late(&self, key: &PartKey) -> bool {
        self.late_out.as_ref().is_some_and(|(_, keys)| keys.contains(key))
    }

    /// Decode CPU seconds of delivered step `step` filed since its delivery: the pieces this
    /// rank decoded for a late rank after the step's collection (taken once).
    pub fn take_late_cpu_s(&mut self, step: u64) -> f64 {
        if step >= self.next_step {
            return 0.0;
        }
        self.cpu_by_step.remove(&step).unwrap_or(0.0)
    }

    /// Whether a call is under way.
    pub fn busy(&self) -> bool {
        !self.stages.is_empty() || self.waiting.is_some()
    }

    /// Files zstd level-1 figures measured on a tensor this rank sent (ratio, bytes per second).
    pub fn note_zstd(&mut self, ratio: f64, bps: f64) {
        self.zstd = if self.zstd.1 > 0.0 {
            (0.7 * self.zstd.0 + 0.3 * ratio, 0.7 * self.zstd.1 + 0.3 * bps)
        } else {
            (ratio, bps)
        };
    }

    /// Whether zstd was measured here yet.
    pub fn zstd_measured(&self) -> bool {
        self.zstd.1 > 0.0
    }

    /// Records the accelerator seconds of the step delivered last (once per step; no batch
    /// needed: the engine kept its tokens).
    pub fn report(&mut self, accel_s: f64) -> Result<(), StepError> {
        let tokens = self.last_tokens.take().ok_or_else(|| {
            protocol("no step to report: each step is reported once, after its batch was delivered".into())
        })?;
        self.record.gpu_s = accel_s;
        self.record.sum_tokens = tokens.iter().map(|&t| t as f64).sum();
        self.record.sum_tokens_sq = tokens.iter().map(|&t| (t as f64).powi(2)).sum();
        self.record.samples = tokens.len() as u32;
        Ok(())
    }

    /// Files a finished decode of this rank (at any time, in any call or between calls).
    pub fn finished(&mut self, agreed: &Agreed, f: Finished) {
        self.outstanding.remove(&f.key);
        *self.cpu_by_step.entry(f.key.step).or_default() += f.cpu_s;
        if let Some(p) = agreed.plan_of(f.key.step) {
            if let Some(&j) = p.job_of.get(&(f.key.slot, f.key.part)) {
                let slot = p.slots[p.slot_of(j)];
                match (f.ok, slot.desc) {
                    (true, Some(d)) => {
                        let feat = Features::predict_range(&d, &agreed.config().params, p.ranges[j]);
                        let o = DecodeObservation {
                            codec: d.codec.to_byte(),
                            mpixels: feat.mpixels,
                            mbits: feat.mbits,
                            discarded: feat.discarded,
                            seconds: f.seconds,
                        };
                        self.record.sample_observation(o, self.observed);
                        self.observed += 1;
                    }
                    (false, _) => self.failed.push_back(FailedSample { step: f.key.step, id: slot.id }),
                    _ => {}
                }
            }
        }
        self.done.insert(f.key, f);
    }

    /// Whether every one of `keys` is decoded.
    pub fn all_done(&self, keys: &[PartKey]) -> bool {
        keys.iter().all(|k| self.done.contains_key(k))
    }

    /// Begins a call; then [`Engine::poll`] until [`Action::Done`].
    pub fn begin(&mut self, call: Call) -> Result<(), StepError> {
        if self.busy() {
            return Err(protocol(format!("rank {}: a call began while another was under way", self.rank)));
        }
        // Before anything else of the call: what the last collection left owed to a late rank.
        if let Some((step, keys)) = self.late_out.take() {
            self.stages.push_back(Stage::LateSend { step, keys });
        }
        match call {
            Call::Next => {
                let s = self.next_step;
                if self.prepared != Some(s) {
                    self.stages.push_back(Stage::Round { current: s, from: s });
                } else {
                    self.stages.push_back(Stage::EarlyRound { step: s });
                }
                self.stages.push_back(Stage::Collect { step: s });
            }
            Call::Prepare => {
                let s = self.next_step;
                if self.prepared == Some(s) {
                    return Ok(());
                }
                if self.rounds == 0 {
                    // Before the first batch (of the run, or of a resumed run): the round its
                    // `Next` would take, now, so that the first steps decode while the caller
                    // still loads its model. Nothing is planned yet, so nothing is exchanged.
                    self.stages.push_back(Stage::Round { current: s, from: s });
                } else {
                    let Some(current) = s.checked_sub(1) else { return Ok(()) };
                    self.stages.push_back(Stage::Exchange { step: s, label: "prepare", all: false });
                    self.stages.push_back(Stage::Round { current, from: s });
                }
                self.prepares = true;
                self.prepared = Some(s);
            }
            Call::Ship { step_end_s } => {
                self.ships = true;
                let t = self.next_step;
                self.stages.push_back(Stage::Exchange { step: t, label: "ship ahead", all: false });
                self.stages.push_back(Stage::AwaitOwed { step: t, step_end_s });
                self.stages.push_back(Stage::Exchange { step: t, label: "ship late", all: false });
                self.stages.push_back(Stage::AssembleAhead { step: t });
                self.stages.push_back(Stage::AssembleMoving { step: t });
            }
        }
        Ok(())
    }

    /// The next action of the call under way, `answer` being the result of the collective the
    /// last action asked for (None after a local action).
    pub fn poll(
        &mut self,
        agreed: &mut Agreed,
        catalog: &dyn Catalog,
        answer: Option<Event>,
    ) -> Result<Action, StepError> {
        match (self.waiting.take(), answer) {
            (Some(w), Some(event)) => self.answer(agreed, w, event)?,
            (None, None) => {}
            (Some(_), None) => {
                return Err(protocol(format!("rank {}: a collective's result is missing", self.rank)))
            }
            (None, Some(_)) => {
                return Err(protocol(format!(
                    "rank {}: a result came that no collective asked for",
                    self.rank
                )))
            }
        }
        while let Some(stage) = self.stages.pop_front() {
            if let Some(action) = self.run(agreed, catalog, stage)? {
                if matches!(
                    action,
                    Action::Gather(_) | Action::GatherV(_) | Action::Agree(_) | Action::Exchange(_)
                ) {
                    self.issued(&action);
                }
                return Ok(action);
            }
        }
        Ok(Action::Done)
    }

    fn issued(&mut self, action: &Action) {
        let (kind, step) = match action {
            Action::Gather(_) => (1, self.next_step),
            Action::GatherV(_) => (2, self.next_step),
            Action::Agree(_) => (3, self.next_step),
            Action::Exchange(o) => (4, o.step),
            _ => return,
        };
        self.schedule.u64(kind).u64(step);
        self.collectives += 1;
    }

    fn last_exchange(&self) -> LastExchange {
        if self.ships {
            LastExchange::AtShip
        } else if self.prepares {
            LastExchange::AtPrepare
        } else {
            LastExchange::AtCollection
        }
    }

    fn run(
        &mut self,
        agreed: &mut Agreed,
        catalog: &dyn Catalog,
        stage: Stage,
    ) -> Result<Option<Action>, StepError> {
        let cfg = agreed.config();
        match stage {
            Stage::Round { current, from } => {
                // The skip budget, from what every rank knows (its own failures too, for the
                // baselines): the run ends here, at a round's start, on every rank at once.
                let last = (current + 1 + cfg.lookahead as u64).min(cfg.steps.max(current + 1));
                if !cfg.policy.uses_records() {
                    for f in self.failed.drain(..) {
                        agreed.note_local_skip(f);
                    }
                }
                agreed
                    .skip_budget()
                    .map_err(|e| StepError::SkipBudget(format!("rank {}, step {current}: {e}", self.rank)))?;
                let cfg = agreed.config();
                let todo: Vec<u64> = (from..last).filter(|t| !self.submitted.contains(t)).collect();
                if todo.is_empty() {
                    return Ok(None);
                }
                // The DataLoader-style baselines plan from the sampler alone: they gather records
                // once, for everyone's worker counts, and never again — like the loaders they
                // stand for, they add no collective to a step (so `check_plan` checks them at
                // that first round only; later plans follow from the sampler, which the start-up
                // fingerprint covers).
                if !agreed.has_states() || cfg.policy.uses_records() {
                    self.record.step = current;
                    self.record.take_skips(&mut self.failed);
                    self.record.queued_cpu_s = self.outstanding.values().sum();
                    (self.record.zstd_ratio, self.record.zstd_bps) = self.zstd;
                    let bytes = self.record.encode().to_vec();
                    self.waiting = Some(Waiting::Records { current, todo });
                    return Ok(Some(Action::Gather(bytes)));
                }
                self.stages.push_front(Stage::Plan { current, todo, check: false });
                Ok(None)
            }
            Stage::EarlyRound { step } => {
                // Every rank holds the same plan of `step`: all of them take this round, or none.
                // Where the CPUs are short instead (nothing split), starting earlier gains no
                // throughput and spreads the waits: 0.78 → 0.90 of mmc4-interleaved's rank-steps
                // missed at X = 1.25 when every predicted-late step took it. And the round's
                // collectives sit on every rank's input-wait path: taken on every late-and-split
                // step of the demo's real runs it cost ranks whose batches were ready 1–10 ms
                // (helix's 1 ms misses 2.9% → 14.7%), so only a delay longer than the step
                // itself — a wait no collective adds to — takes it.
                let model = agreed.accel_model();
                // A CPU-bound late rank's wait is planned: its round would only hold the ranks
                // whose batches are ready (1–30 ms at the start of most of their steps in real
                // runs of the CPU-bound validation data). Where late ranks wait on chains the
                // round starts the steps ahead, as in any step predicted late.
                let late = agreed.plan_of(step).is_some_and(|p| {
                    !p.plan.late_jobs_behind
                        && p.plan.predicted_misses > 0
                        && p.partial.contains(&true)
                        && p.plan.delay_s > p.plan.step_under(&model)
                });
                // Nor where the round's own collectives would make the ranks whose batches are
                // ready miss: across two hosts joined at 20 Mbit/s its record all-gather, behind
                // the tensors on the link, held every rank 10-20 ms at the first steps (0.10-0.24
                // of rank-steps over 10 ms; without it 0.00-0.03 at the same throughput:
                // `scripts/hosts_bench.sh`, docs/measured.md, "Across two hosts").
                let cheap = agreed.round_gather_s() <= PlanOptions::default().miss_tolerance_s;
                if late && cheap {
                    self.stages.push_front(Stage::Round { current: step, from: step });
                }
                Ok(None)
            }
            Stage::Plan { current, todo, check } => {
                let last = self.last_exchange();
                let mut jobs = Vec::new();
                let mut hash = Fnv::default();
                for &t in &todo {
                    let p = agreed.plan(t, current, catalog, last)?;
                    self.submitted.insert(t);
                    hash.u64(p.plan.hash);
                    self.counters.predicted_misses += p.plan.predicted_misses;
                    jobs.extend(self.requests(&p));
                }
                if check {
                    hash.u64(self.schedule.finish());
                    self.stages.push_front(Stage::Agree { value: hash.finish(), steps: todo });
                }
                Ok((!jobs.is_empty()).then_some(Action::Submit(jobs)))
            }
            Stage::Agree { value, steps } => {
                self.waiting = Some(Waiting::Agree { steps });
                Ok(Some(Action::Agree(value)))
            }
            Stage::Collect { step } => {
                let mut then =
                    vec![Stage::AwaitOwn { step }, Stage::Assemble { step }, Stage::AfterDecode { step }];
                if agreed.moves(step) {
                    let plan = agreed.plan_of(step).map(|p| &p.plan);
                    if plan.is_some_and(|p| p.is_late(self.rank)) {
                        then.insert(0, Stage::LateReceive { step });
                    } else if plan.is_some_and(|p| !p.late_ranks.is_empty()) {
                        then.insert(0, Stage::LateOwed { step });
                    }
                    then.insert(0, Stage::Exchange { step, label: "collect", all: true });
                }
                then.push(Stage::Deliver { step });
                for s in then.into_iter().rev() {
                    self.stages.push_front(s);
                }
                Ok(None)
            }
            Stage::Exchange { step, label, all } => {
                let Some(p) = agreed.plan_of(step).filter(|p| p.moves).cloned() else { return Ok(None) };
                if all {
                    // What is owed to a late rank is sent after, from the next call.
                    let waiting: Vec<PartKey> = self
                        .owed(&p)
                        .into_iter()
                        .filter(|&j| !p.plan.is_late(p.owner_of(j)))
                        .map(|j| p.key_of(j))
                        .filter(|k| !self.done.contains_key(k))
                        .collect();
                    if !waiting.is_empty() {
                        self.stages.push_front(Stage::Exchange { step, label, all: false });
                        self.stages.push_front(Stage::CheckDone { step, keys: waiting.clone() });
                        return Ok(Some(Action::Await { keys: waiting, until_s: None }));
                    }
                }
                Ok(Some(self.exchange_parts(agreed, &p, label)))
            }
            Stage::AwaitOwed { step, step_end_s } => {
                let until_s = step_end_s + self.behind_slowest_s - cfg.ship_slack_s;
                let Some(p) = agreed.plan_of(step).filter(|p| p.moves).cloned() else { return Ok(None) };
                let keys: Vec<PartKey> = self
                    .owed(&p)
                    .into_iter()
                    .map(|j| p.key_of(j))
                    .filter(|k| !self.done.contains_key(k))
                    .collect();
                Ok((!keys.is_empty()).then_some(Action::Await { keys, until_s: Some(until_s) }))
            }
            Stage::AwaitOwn { step } => {
                let Some(p) = agreed.plan_of(step).cloned() else {
                    return Err(protocol(format!("rank {}: step {step} was never planned", self.rank)));
                };
                let me = self.rank;
                let keys: Vec<PartKey> = p.plan.order[me]
                    .iter()
                    .map(|&j| j as usize)
                    .filter(|&j| p.owner_of(j) == me)
                    .map(|j| p.key_of(j))
                    .filter(|k| !self.done.contains_key(k) && !self.settled.contains(&(step, k.slot)))
                    .collect();
                if keys.is_empty() {
                    return Ok(None);
                }
                self.stages.push_front(Stage::CheckDone { step, keys: keys.clone() });
                Ok(Some(Action::Await { keys, until_s: None }))
            }
            Stage::CheckDone { step, keys } => {
                if self.all_done(&keys) {
                    Ok(None)
                } else {
                    Err(protocol(format!("rank {}: the decode pool lost jobs of step {step}", self.rank)))
                }
            }
            Stage::Assemble { step } => {
                let Some(p) = agreed.plan_of(step).cloned() else { return Ok(None) };
                let me = self.rank;
                let mut skipped: Vec<u64> = (me..p.slots.len())
                    .step_by(self.ranks)
                    .filter(|&k| !p.slots[k].ok)
                    .map(|k| p.slots[k].id)
                    .collect();
                let slots: Vec<u32> =
                    p.owned[me].iter().copied().filter(|&k| !self.settled.contains(&(step, k))).collect();
                let action = self.assemble(agreed, &p, &slots, true, &mut skipped);
                self.skipped.entry(step).or_default().extend(skipped);
                Ok(action)
            }
            Stage::AssembleAhead { step } => {
                let Some(p) = agreed.plan_of(step).cloned() else { return Ok(None) };
                let me = self.rank;
                let jobs_of = &p.jobs_of;
                let in_hand = |k: &PartKey| self.done.contains_key(k) || self.received.contains_key(k);
                let slots: Vec<u32> = p.owned[me]
                    .iter()
                    .copied()
                    .filter(|&k| jobs_of[k as usize].len() > 1 && !self.settled.contains(&(step, k)))
                    .filter(|&k| jobs_of[k as usize].iter().all(|&j| in_hand(&p.key_of(j))))
                    .collect();
                let mut skipped = Vec::new();
                let action = self.assemble(agreed, &p, &slots, false, &mut skipped);
                self.skipped.entry(step).or_default().extend(skipped);
                Ok(action)
            }
            Stage::AfterDecode { step } => match cfg.policy.after_decode() {
                policy::AfterDecode::Nothing => Ok(None),
                policy::AfterDecode::Gated => {
                    let decision = agreed.gate(step);
                    self.after_decided(step, decision);
                    Ok(None)
                }
                policy::AfterDecode::TokenBalance => {
                    // One all-gather of fixed size, as the loaders post-balance stands for
                    // gather their lengths: every rank's entries padded to the most slots any
                    // rank trains in the plan (an all-gather-v would be two collectives, and
                    // both sit on the input path).
                    let per_rank =
                        agreed.plan_of(step).map_or(0, |p| p.owned.iter().map(Vec::len).max().unwrap_or(0));
                    let mut mine: Vec<u8> = self
                        .held
                        .range((step, 0)..=(step, u32::MAX))
                        .take(per_rank)
                        .flat_map(|(&(_, k), h)| {
                            let bytes = h.shape.iter().product::<usize>() as u64;
                            [k as u64, h.tokens, bytes].into_iter().flat_map(u64::to_le_bytes)
                        })
                        .collect();
                    let padding = [NO_SLOT, 0, 0].into_iter().flat_map(u64::to_le_bytes);
                    while mine.len() < per_rank * super::SIZE_ENTRY_BYTES {
                        mine.extend(padding.clone());
                    }
                    self.waiting = Some(Waiting::Sizes { step, per_rank });
                    Ok(Some(Action::Gather(mine)))
                }
            },
            Stage::MoveSamples { step, decision } => {
                Ok(Some(self.move_samples(agreed, step, &decision, false)))
            }
            Stage::AssembleMoving { step } => {
                // Decided here, while the step before trains: every rank ships at the same point
                // of its calls, so all decide on the same model. Without a plan yet, collection
                // decides.
                if cfg.policy.after_decode() != policy::AfterDecode::Gated {
                    return Ok(None);
                }
                let Some(p) = agreed.plan_of(step).cloned() else { return Ok(None) };
                let decision = agreed.gate(step);
                if decision.moves.is_empty() {
                    return Ok(None);
                }
                let me = self.rank;
                let leaving: Vec<u32> = decision
                    .moves
                    .iter()
                    .map(|&(i, _)| decision.decoded[i])
                    .filter(|d| d.owner as usize == me && !self.settled.contains(&(step, d.id as u32)))
                    .map(|d| d.id as u32)
                    .collect();
                self.stages.push_front(Stage::MoveAhead { step, decision });
                let mut skipped = Vec::new();
                let action = self.assemble(agreed, &p, &leaving, false, &mut skipped);
                self.skipped.entry(step).or_default().extend(skipped);
                Ok(action)
            }
            Stage::MoveAhead { step, decision } => Ok(Some(self.move_samples(agreed, step, &decision, true))),
            Stage::Deliver { step } => Ok(Some(self.deliver(agreed, step))),
            Stage::LateReceive { step } => {
                let Some(p) = agreed.plan_of(step).cloned() else { return Ok(None) };
                let me = self.rank;
                // What it owes the other late ranks goes in the same exchange (they wait for it
                // inside their calls too), once decoded.
                let keys = self.owed_late(&p);
                let waiting: Vec<PartKey> =
                    keys.iter().copied().filter(|k| !self.done.contains_key(k)).collect();
                if !waiting.is_empty() {
                    self.stages.push_front(Stage::LateReceive { step });
                    self.stages.push_front(Stage::CheckDone { step, keys: waiting.clone() });
                    return Ok(Some(Action::Await { keys: waiting, until_s: None }));
                }
                let expect: Vec<usize> = p.inbound[me]
                    .iter()
                    .filter(|&&j| !self.got.contains(&p.key_of(j as usize)))
                    .map(|&j| p.decoder_of(j as usize))
                    .collect();
                Ok(Some(self.late_exchange(agreed, step, &keys, ranks_of(expect))))
            }
            Stage::LateOwed { step } => {
                let Some(p) = agreed.plan_of(step).cloned() else { return Ok(None) };
                let keys = self.owed_late(&p);
                self.late_out = Some((step, keys));
                Ok(None)
            }
            Stage::LateSend { step, keys } => {
                let waiting: Vec<PartKey> =
                    keys.iter().copied().filter(|k| !self.done.contains_key(k)).collect();
                if !waiting.is_empty() {
                    self.stages.push_front(Stage::LateSend { step, keys });
                    self.stages.push_front(Stage::CheckDone { step, keys: waiting.clone() });
                    return Ok(Some(Action::Await { keys: waiting, until_s: None }));
                }
                Ok(Some(self.late_exchange(agreed, step, &keys, Vec::new())))
            }
        }
    }

    /// This rank's decode requests of a new plan.
    fn requests(&mut self, p: &Planned) -> Vec<DecodeRequest> {
        let t = p.plan.step;
        let mut out = Vec::with_capacity(p.plan.order[self.rank].len());
        for (k, &j) in p.plan.order[self.rank].iter().enumerate() {
            let j = j as usize;
            let slot = p.slots[p.slot_of(j)];
            let key = p.key_of(j);
            out.push(DecodeRequest {
                key,
                id: slot.id,
                pos: slot.pos.unwrap_or(0),
                // A late rank's jobs queue behind the next step's, on every rank: the other
                // ranks' batches of that step are due first.
                priority: if p.plan.late_jobs_behind && p.plan.is_late(p.owner_of(j)) {
                    ((t + 1) << 32) | (1 << 31) | k as u64
                } else {
                    (t << 32) | k as u64
                },
                frames: p.partial[j].then_some(p.ranges[j]),
                predicted_s: p.work_s[j],
                shape: p.shapes[j],
            });
            self.outstanding.insert(key, p.work_s[j]);
        }
        out
    }

    /// This rank's jobs of `p` decoded for others and not sent yet.
    fn owed(&self, p: &Planned) -> Vec<usize> {
        let me = self.rank;
        p.plan.order[me]
            .iter()
            .map(|&j| j as usize)
            .filter(|&j| p.owner_of(j) != me && !self.sent.contains(&p.key_of(j)))
            .collect()
    }

    /// This rank's jobs of `p` owed to its late ranks and not sent yet.
    fn owed_late(&self, p: &Planned) -> Vec<PartKey> {
        self.owed(p).into_iter().filter(|&j| p.plan.is_late(p.owner_of(j))).map(|j| p.key_of(j)).collect()
    }

    /// One exchange of `p`'s parts: every pair with a part not yet across meets; what is decoded
    /// is sent.
    fn exchange_parts(&mut self, agreed: &Agreed, p: &Planned, label: &'static str) -> Action {
        let me = self.rank;
        let (mut send, mut expect) = (Vec::new(), Vec::new());
        let mut outgoing = Vec::new();
        // A late rank's pieces skip its step's collection, where their bytes would hold the
        // ranks that decoded them: all that is left of them crosses in the late exchange.
        let late = |q: usize| label == "collect" && p.plan.is_late(q);
        for j in self.owed(p) {
            let (to, key) = (p.owner_of(j), p.key_of(j));
            if late(to) {
                continue;
            }
            send.push(to);
            if let Some(f) = self.done.get(&key) {
                let id = p.slots[key.slot as usize].id;
                let bytes = f.shape.iter().product::<usize>();
                let message = Message { key, id, ok: f.ok, shape: f.shape, tokens: 0 };
                outgoing.push((to, message, f.ok && agreed.compress(bytes, me, to)));
                self.done.remove(&key);
                self.sent.insert(key);
            }
        }
        for &j in p.inbound[me].iter().filter(|_| !late(me)) {
            let key = p.key_of(j as usize);
            if !self.got.contains(&key) {
                expect.push(p.decoder_of(j as usize));
            }
        }
        self.waiting = Some(Waiting::Parts);
        Action::Exchange(ExchangeOrder {
            label,
            step: p.plan.step,
            payload: Payload::Parts,
            send: ranks_of(send),
            expect: ranks_of(expect),
            outgoing,
        })
    }

    /// The late exchange of `step`: `keys` (decoded, owed to late ranks) go to their owners,
    /// and a late rank receives from the ranks in `expect`. A rank with neither meets no one,
    /// so every rank issues the same collectives.
    fn late_exchange(&mut self, agreed: &Agreed, step: u64, keys: &[PartKey], expect: Vec<usize>) -> Action {
        let me = self.rank;
        let mut send = Vec::new();
        let mut outgoing = Vec::new();
        let plan = agreed.plan_of(step);
        for key in keys {
            let (Some(p), Some(f)) = (plan, self.done.remove(key)) else { continue };
            let Some(&j) = p.job_of.get(&(key.slot, key.part)) else { continue };
            let to = p.owner_of(j);
            let id = p.slots[key.slot as usize].id;
            let bytes = f.shape.iter().product::<usize>();
            outgoing.push((
                to,
                Message { key: *key, id, ok: f.ok, shape: f.shape, tokens: 0 },
                f.ok && agreed.compress(bytes, me, to),
            ));
            send.push(to);
        }
        self.waiting = Some(Waiting::Parts);
        Action::Exchange(ExchangeOrder {
            label: super::LATE_EXCHANGE,
            step,
            payload: Payload::Parts,
            send: ranks_of(send),
            expect,
            outgoing,
        })
    }

    /// Puts `slots` of `p` together from their parts; with `all`, a sample whose parts are not
    /// all in hand is skipped (its bytes dropped).
    fn assemble(
        &mut self,
        agreed: &Agreed,
        p: &Planned,
        slots: &[u32],
        all: bool,
        skipped: &mut Vec<u64>,
    ) -> Option<Action> {
        let me = self.rank;
        let step = p.plan.step;
        let jobs_of = &p.jobs_of;
        let (mut samples, mut drop) = (Vec::new(), Vec::new());
        for &k in slots {
            let slot = p.slots[k as usize];
            let keys: Vec<(PartKey, bool)> =
                jobs_of[k as usize].iter().map(|&j| (p.key_of(j), p.decoder_of(j) == me)).collect();
            let peek = |&(key, own): &(PartKey, bool)| {
                if own {
                    self.done.get(&key).map(|f| (f.ok, f.shape))
                } else {
                    self.received.get(&key).map(|m| (m.ok, m.shape))
                }
            };
            let states: Vec<Option<(bool, [usize; 4])>> = keys.iter().map(peek).collect();
            let missing = states.iter().filter(|x| x.is_none()).count();
            let failed = states.iter().any(|x| matches!(x, Some((false, _))));
            if missing > 0 && !failed && !all {
                continue; // not all in hand yet: later
            }
            // The slot is settled now: put together, or skipped with what of it is in hand.
            for (key, own) in &keys {
                if *own {
                    self.done.remove(key);
                } else {
                    self.received.remove(key);
                }
            }
            self.settled.insert((step, k));
            if missing > 0 || failed {
                if !failed {
                    tracing::warn!(
                        rank = me,
                        "sample {}: {} of {} pieces arrived",
                        slot.id,
                        keys.len() - missing,
                        keys.len()
                    );
                }
                drop.extend(
                    keys.iter().zip(&states).filter(|(_, st)| st.is_some()).map(|((key, _), _)| *key),
                );
                skipped.push(slot.id);
                continue;
            }
            let parts: Vec<PartKey> = keys.iter().map(|(key, _)| *key).collect();
            let shapes: Vec<[usize; 4]> = states.iter().flatten().map(|(_, shape)| *shape).collect();
            // Pieces share H', W' and channels; their frames add up.
            let frames = shapes.iter().map(|s| s[0]).sum();
            let shape = [frames, shapes[0][1], shapes[0][2], shapes[0][3]];
            let tokens = agreed.tokens(slot.desc.map_or(0, |d| d.text_tokens), shape);
            self.held.insert((step, k), Held { id: slot.id, shape, tokens });
            samples.push(SampleSpec { step, slot: k, id: slot.id, parts, shape, tokens });
        }
        (!samples.is_empty() || !drop.is_empty()).then_some(Action::Assemble { samples, drop, ahead: !all })
    }

    fn after_decided(&mut self, step: u64, decision: Arc<AfterDecode>) {
        if decision.moves.is_empty() {
            self.counters.rebalances_skipped += 1;
        } else {
            self.counters.rebalances_run += 1;
            self.stages.push_front(Stage::MoveSamples { step, decision });
        }
    }

    /// The exchange of whole samples an after-decode decision moves (`Decoded::id` holds the
    /// sample's batch slot) and that have not moved yet. `ahead`: before the step is collected,
    /// so a sample not put together yet stays (its pair still meets; both sides know what came).
    fn move_samples(&mut self, agreed: &Agreed, step: u64, decision: &AfterDecode, ahead: bool) -> Action {
        let me = self.rank;
        let (mut send, mut expect) = (Vec::new(), Vec::new());
        let mut outgoing = Vec::new();
        let mut expected = HashSet::new();
        for &(i, to) in &decision.moves {
            let d = decision.decoded[i];
            let (from, to, k) = (d.owner as usize, to as usize, d.id as u32);
            if self.moved.contains(&(step, k)) {
                continue;
            }
            if to == me && from != me {
                expect.push(from);
                expected.insert((from, k));
            }
            if from != me {
                continue;
            }
            send.push(to);
            if ahead && !self.settled.contains(&(step, k)) {
                continue;
            }
            self.moved.insert((step, k));
            if ahead {
                self.counters.moved_ahead += 1;
            } else {
                self.counters.moved_at_collection += 1;
            }
            let key = PartKey { step, slot: k, part: 0 };
            // A sample that failed here (and was reported here) still sends its header.
            let message = match self.held.remove(&(step, k)) {
                Some(h) => Message { key, id: h.id, ok: true, shape: h.shape, tokens: h.tokens },
                None => Message { key, id: 0, ok: false, shape: [0; 4], tokens: 0 },
            };
            let bytes = message.shape.iter().product::<usize>();
            outgoing.push((to, message, message.ok && agreed.compress(bytes, self.rank, to)));
        }
        self.waiting = Some(Waiting::Samples { step, expected });
        Action::Exchange(ExchangeOrder {
            label: if ahead { "rebalance ahead" } else { "rebalance" },
            step,
            payload: Payload::Samples,
            send: ranks_of(send),
            expect: ranks_of(expect),
            outgoing,
        })
    }

    fn deliver(&mut self, agreed: &mut Agreed, step: u64) -> Action {
        let keys: Vec<(u64, u32)> = self.held.range((step, 0)..=(step, u32::MAX)).map(|(&k, _)| k).collect();
        let mut spec = BatchSpec {
            step,
            slots: Vec::with_capacity(keys.len()),
            ids: Vec::with_capacity(keys.len()),
            tokens: Vec::with_capacity(keys.len()),
            skipped: self.skipped.remove(&step).unwrap_or_default(),
            bytes_in: self.bytes_in.remove(&step).unwrap_or(0),
            decode_cpu_s: self.cpu_by_step.remove(&step).unwrap_or(0.0),
        };
        for k in keys {
            if let Some(h) = self.held.remove(&k) {
                spec.slots.push(k.1);
                spec.ids.push(h.id);
                spec.tokens.push(h.tokens);
            }
        }
        spec.skipped.sort_unstable();
        spec.skipped.dedup();
        self.counters.bytes_in += spec.bytes_in;
        // Step `step` trains now: its predicted time is still ahead when planning from here.
        agreed.start_training(step);
        if let Some(accel) = agreed.accel_of(step) {
            let slowest = accel.iter().copied().fold(0.0, f64::max);
            let own = accel.get(self.rank).copied().unwrap_or(0.0);
            self.behind_slowest_s = (slowest - own).clamp(0.0, own.max(0.0));
            self.own_step_s = own;
        }
        self.sent.retain(|k| k.step > step);
        self.got.retain(|k| k.step > step);
        self.received.retain(|k, _| k.step > step);
        self.settled.retain(|k| k.0 > step);
        self.moved.retain(|k| k.0 > step);
        // Late decode CPU of a step no driver took (`take_late_cpu_s`) goes a step later.
        self.cpu_by_step.retain(|&t, _| t + 1 >= step);
        let owed_late = self.late_out.as_ref().map_or(&[][..], |(_, keys)| &keys[..]);
        self.done.retain(|k, _| k.step > step || owed_late.contains(k));
        self.next_step = step + 1;
        self.prepared = self.prepared.filter(|&t| t > step);
        self.last_tokens = Some(spec.tokens.clone());
        Action::Deliver(spec)
    }

    fn answer(&mut self, agreed: &mut Agreed, waiting: Waiting, event: Event) -> Result<(), StepError> {
        let me = self.rank;
        match (waiting, event) {
            (Waiting::Records { current, todo }, Event::Gathered(bytes)) => {
                // Every engine of a simulated cluster gets the same bytes: the first files them.
                if agreed.rounds() <= self.rounds {
                    let records = StepRecord::decode_all(&bytes, self.ranks)
                        .map_err(|e| protocol(format!("rank {me}, step {current}: {e}")))?;
                    agreed.absorb(self.rounds, current, &records);
                }
                self.rounds += 1;
                self.observed = 0;
                self.record = StepRecord {
                    rank: me as u32,
                    workers: self.workers,
                    worker_millicores: self.worker_millicores,
                    ..StepRecord::default()
                };
                let check = agreed.config().check_plan;
                self.stages.push_front(Stage::Plan { current, todo, check });
            }
            (Waiting::Agree { steps }, Event::Agreed(same)) => {
                if !same {
                    return Err(protocol(format!(
                        "--check-plan: rank {me}'s plans of steps {steps:?} or its sequence of collectives ({} so far) differ from another rank's; the ranks' inputs, builds or calls differ",
                        self.collectives
                    )));
                }
            }
            (Waiting::Parts, Event::Exchanged(messages)) => {
                for (from, m, bytes) in messages {
                    let planned = agreed.plan_of(m.key.step).and_then(|p| {
                        let j = *p.job_of.get(&(m.key.slot, m.key.part))?;
                        (p.decoder_of(j) == from && p.owner_of(j) == me).then_some(j)
                    });
                    let Some(j) = planned.filter(|_| !self.got.contains(&m.key)) else {
                        return Err(protocol(format!(
                            "rank {me} received part {} of slot {} of step {} from rank {from}, which the plan does not send it (or sent twice); every rank must run the same build",
                            m.key.part, m.key.slot, m.key.step
                        )));
                    };
                    if let Some(p) = agreed.plan_of(m.key.step) {
                        let slot = p.slots[p.slot_of(j)];
                        if m.ok && (m.shape != p.shapes[j] || m.id != slot.id) {
                            return Err(protocol(format!(
                                "rank {me} received from rank {from} part {} of slot {} of step {} as sample {} with shape {:?}; the plan says sample {} with shape {:?}; every rank must run the same build",
                                m.key.part, m.key.slot, m.key.step, m.id, m.shape, slot.id, p.shapes[j]
                            )));
                        }
                    }
                    self.got.insert(m.key);
                    self.received.insert(m.key, m);
                    *self.bytes_in.entry(m.key.step).or_default() += bytes;
                }
            }
            (Waiting::Samples { step, expected }, Event::Exchanged(messages)) => {
                for (from, m, bytes) in messages {
                    if m.key.step != step || !expected.contains(&(from, m.key.slot)) {
                        return Err(protocol(format!(
                            "rank {me} received sample slot {} of step {} from rank {from}, which the rebalance does not move to it",
                            m.key.slot, m.key.step
                        )));
                    }
                    if let (true, Some(want)) =
                        (m.ok, agreed.plan_of(step).and_then(|p| planned_shape(p, m.key.slot)))
                    {
                        if m.shape != want {
                            return Err(protocol(format!(
                                "rank {me} received from rank {from} sample slot {} of step {} with shape {:?}; the plan says {want:?}",
                                m.key.slot, step, m.shape
                            )));
                        }
                    }
                    *self.bytes_in.entry(step).or_default() += bytes;
                    self.moved.insert((step, m.key.slot));
                    if m.ok {
                        self.held
                            .insert((step, m.key.slot), Held { id: m.id, shape: m.shape, tokens: m.tokens });
                    }
                }
            }
            (Waiting::Sizes { step, per_rank }, Event::Gathered(all)) => {
                let block = per_rank * super::SIZE_ENTRY_BYTES;
                if all.len() != block * self.ranks {
                    return Err(protocol(format!(
                        "rank {me}: step {step}'s sizes are {} bytes, {} ranks of {per_rank} entries make {}",
                        all.len(),
                        self.ranks,
                        block * self.ranks
                    )));
                }
                let decision = agreed.token_balance(step, || {
                    let mut decoded = Vec::new();
                    for (r, block) in all.chunks_exact(block.max(1)).enumerate() {
                        for c in block.chunks_exact(super::SIZE_ENTRY_BYTES) {
                            let v =
                                |at: usize| u64::from_le_bytes(c[at..at + 8].try_into().unwrap_or([0; 8]));
                            if v(0) != NO_SLOT {
                                decoded.push(Decoded {
                                    id: v(0),
                                    owner: r as u32,
                                    tokens: v(8),
                                    bytes: v(16),
                                });
                            }
                        }
                    }
                    decoded
                });
                self.after_decided(step, decision);
            }
            (w, e) => {
                return Err(protocol(format!("rank {me}: waited for {w:?} and got {}", event_name(&e))));
            }
        }
        Ok(())
    }
}

/// The slot of a padding entry in post-balance's gathered sizes.
const NO_SLOT: u64 = u64::MAX;

/// The whole shape a sample of `p` is decoded to: its pieces' frames added up.
fn planned_shape(p: &Planned, slot: u32) -> Option<[usize; 4]> {
    let jobs = p.jobs_of.get(slot as usize)?;
    let first = p.shapes[*jobs.first()?];
    Some([jobs.iter().map(|&j| p.shapes[j][0]).sum(), first[1], first[2], first[3]])
}

/// Sorted, without repeats.
fn ranks_of(mut ranks: Vec<usize>) -> Vec<usize> {
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

fn event_name(e: &Event) -> &'static str {
    match e {
        Event::Gathered(_) => "an all-gather's result",
        Event::GatheredV(_) => "an all-gather-v's result",
        Event::Agreed(_) => "an agreement",
        Event::Exchanged(_) => "an exchange's result",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::Descriptor;

    struct Empty;
    impl Catalog for Empty {
        fn lookup(&self, _: u64) -> Result<Option<(usize, Descriptor)>, String> {
            Ok(None)
        }
    }

    fn agreed(ranks: usize) -> Agreed {
        Agreed::new(crate::step::AgreedConfig::for_tests(), &[1, 2, 3, 4], ranks)
    }

    #[test]
    fn a_report_needs_a_delivered_step_and_comes_once() {
        let mut e = Engine::new(0, 1, 1, 0);
        assert!(e.report(0.1).is_err(), "nothing was delivered yet");
        let mut a = agreed(1);
        e.begin(Call::Next).unwrap();
        let mut answer = None;
        loop {
            match e.poll(&mut a, &Empty, answer.take()).unwrap() {
                Action::Gather(bytes) => answer = Some(Event::Gathered(Arc::new(bytes))),
                Action::Deliver(spec) => {
                    // No sample of the catalog exists: all skipped, none lost.
                    assert_eq!(spec.step, 0);
                    assert!(spec.ids.is_empty());
                    assert_eq!(spec.skipped.len(), 2);
                }
                Action::Done => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        e.report(0.1).unwrap();
        assert!(e.report(0.1).is_err(), "each step is reported once");
    }

    #[test]
    fn calls_do_not_overlap_and_answers_must_match_the_question() {
        let mut e = Engine::new(0, 1, 1, 0);
        let mut a = agreed(1);
        e.begin(Call::Next).unwrap();
        assert!(e.begin(Call::Prepare).is_err(), "a call is under way");
        let Action::Gather(_) = e.poll(&mut a, &Empty, None).unwrap() else { panic!("records first") };
        assert!(e.poll(&mut a, &Empty, None).is_err(), "the all-gather's result is missing");
        let mut e = Engine::new(0, 1, 1, 0);
        e.begin(Call::Next).unwrap();
        let Action::Gather(_) = e.poll(&mut a, &Empty, None).unwrap() else { panic!("records first") };
        assert!(e.poll(&mut a, &Empty, Some(Event::Agreed(true))).is_err(), "wrong answer kind");
    }

    /// A rebalance split between `ship_ahead` and collection: a sample not put together at
    /// ship time stays for collection (its pair still meets), what came ahead is not expected
    /// again, and a peer that sends it twice is refused with the rank, slot and step named.
    #[test]
    fn a_rebalance_moves_ahead_what_is_ready_and_refuses_a_sample_twice() {
        let a = agreed(2);
        let step = 5;
        let decoded = vec![
            Decoded { id: 3, owner: 1, tokens: 900, bytes: 12 },
            Decoded { id: 4, owner: 0, tokens: 900, bytes: 12 },
        ];
        // Slot 3 moves from rank 1 to rank 0, slot 4 from rank 0 to rank 1.
        let decision = AfterDecode { decoded, moves: vec![(0, 0), (1, 1)] };
        let sample = |slot| Message {
            key: PartKey { step, slot, part: 0 },
            id: 40 + slot as u64,
            ok: true,
            shape: [1, 2, 2, 3],
            tokens: 9,
        };
        let order = |action: Action| match action {
            Action::Exchange(o) => o,
            other => panic!("an exchange, not {other:?}"),
        };

        // Rank 0 at ship time: slot 4 is not put together yet, so it stays; both pairs meet.
        let mut e = Engine::new(0, 2, 1, 0);
        let o = order(e.move_samples(&a, step, &decision, true));
        assert_eq!((o.label, o.send.clone(), o.expect.clone()), ("rebalance ahead", vec![1], vec![1]));
        assert!(o.outgoing.is_empty(), "slot 4 is not put together: {o:?}");
        let came = Event::Exchanged(vec![(1, sample(3), 48)]);
        assert!(matches!(e.poll(&mut agreed(2), &Empty, Some(came)), Ok(Action::Done)));
        assert!(e.held.contains_key(&(step, 3)), "the sample that came ahead is held for the step");

        // At collection slot 4 is put together: it moves now, and slot 3 is not expected again.
        e.settled.insert((step, 4));
        e.held.insert((step, 4), Held { id: 44, shape: [1, 2, 2, 3], tokens: 9 });
        let o = order(e.move_samples(&a, step, &decision, false));
        assert_eq!((o.send.clone(), o.expect.clone()), (vec![1], vec![]));
        assert_eq!(o.outgoing.len(), 1);
        assert_eq!(o.outgoing[0].1.key.slot, 4);
        assert_eq!(e.counters().moved_at_collection, 1);
        let again = Event::Exchanged(vec![(1, sample(3), 48)]);
        let err = e.poll(&mut agreed(2), &Empty, Some(again)).unwrap_err().to_string();
        assert!(err.contains("rank 0") && err.contains("slot 3") && err.contains("rank 1"), "{err}");
    }

    #[test]
    fn the_same_calls_issue_the_same_schedule() {
        let run = || {
            let mut e = Engine::new(0, 1, 1, 0);
            let mut a = agreed(1);
            for _ in 0..3 {
                for call in [Call::Next, Call::Prepare, Call::Ship { step_end_s: 1.0 }] {
                    e.begin(call).unwrap();
                    let mut answer = None;
                    loop {
                        match e.poll(&mut a, &Empty, answer.take()).unwrap() {
                            Action::Gather(bytes) => answer = Some(Event::Gathered(Arc::new(bytes))),
                            Action::Agree(_) => answer = Some(Event::Agreed(true)),
                            Action::Done => break,
                            _ => {}
                        }
                    }
                }
                e.report(0.05).unwrap();
            }
            e.schedule()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        assert!(a.0 >= 2, "records were gathered: {a:?}");
    }
}
