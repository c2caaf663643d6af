//! The simulated cluster: one [`Engine`] per rank — the loader's step protocol, not a copy of it
//! — driven in simulated time. What is simulated is only what the engines ask their drivers
//! for: decode pools ([`CpuPool`]), collectives over links ([`Links`]), the emulated
//! accelerator and the clock. Every engine shares one [`Agreed`] (what every rank computes
//! identically from the gathered records), so a plan is made once per step, not once per rank.
//!
//! Per step `s`, every rank leaves the previous step's all-reduce together, then runs the
//! loader's step driver (`Loader::train_step`): `Next` (its batch in hand), the accelerator
//! launched, `Prepare`, `Ship` [`SimConfig::ship_margin_s`] before its accelerator's step ends,
//! and the report; the all-reduce ends the step at the slowest rank. A call's collectives are
//! resolved when every rank has reached them: an all-gather ends for everyone at the last
//! arrival plus its cost; a pairwise exchange ends for each rank when its partners have arrived
//! and its messages have crossed. Ranks that reach different collectives — a schedule that is
//! not the same on every rank — are an error naming them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::Serialize;

use super::engine::{CpuPool, Links, SimJob};
use super::workload::Calibration;
use crate::cost::accel::{AccelModel, TokenFormula};
use crate::decode::sample::Params;
use crate::decode::split::FrameRange;
use crate::descriptor::Descriptor;
use crate::emu::Profile;
use crate::exec::exchange::HEADER;
use crate::metrics::{summarize, usable_cores, RankStep, RunShape, Summary};
use crate::plan::record::RECORD_BYTES;
use crate::plan::TransferCost;
use crate::policy::Policy;
use crate::sampler::Sampler;
use crate::step::{Action, Agreed, AgreedConfig, BatchSpec, Call, Catalog, Engine, Event, Finished, PartKey};

/// How to simulate one run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The policy.
    pub policy: Policy,
    /// Decode workers per rank (its length is the number of ranks).
    pub workers: Vec<u32>,
    /// Cores per rank its workers share.
    pub cores: Vec<f64>,
    /// Samples per global batch.
    pub global_batch: usize,
    /// Steps, warm-up included.
    pub steps: u64,
    /// Warm-up steps (not measured).
    pub warmup: u64,
    /// Steps decoded ahead of the one in training (as the loader's).
    pub lookahead: usize,
    /// Seed of the sampler and the accelerator noise.
    pub seed: u64,
    /// Preprocessing.
    pub params: Params,
    /// Tokens or latents.
    pub formula: TokenFormula,
    /// The hidden accelerator profile.
    pub profile: Profile,
    /// The links.
    pub links: Links,
    /// The transfer model the planner is given.
    pub planner_transfer: TransferCost,
    /// The accelerator model before any measurement (the loader's default).
    pub accel_prior: AccelModel,
    /// Fixed seconds each step's input hand-over costs a rank (the loader's own overhead).
    pub step_overhead_s: f64,
    /// Observations the accelerator fit keeps (the loader's: [`super::loader_accel_window`]).
    pub accel_window: usize,
    /// How long before its accelerator's step ends a rank ships what of the next step is
    /// decoded (`LoaderConfig::ship_margin_s`).
    pub ship_margin_s: f64,
    /// How long before its step ends a rank stops waiting for the rest it owes and ships it
    /// (`LoaderConfig::ship_slack_s`).
    pub ship_slack_s: f64,
    /// Decode samples predicted longer than this in pieces (`LoaderConfig::split_above_s`).
    pub split_above_s: Option<f64>,
    /// Agree on every round's plans and schedule, as `--check-plan` does.
    pub check_plan: bool,
    /// Ranks per planning group (`LoaderConfig::plan_group_ranks`; 0: automatic).
    pub plan_group_ranks: u32,
    /// Keep every planner input in [`SimRun::plan_inputs`] (the planner bench plans them again).
    pub keep_plan_inputs: bool,
    /// The CPU quota's period, seconds: each rank's cores given as the kernel's CFS quota
    /// gives them ([`super::engine::CpuPool::with_quota_period`]); 0: shared smoothly.
    pub cfs_period_s: f64,
    /// Late ranks, as `LoaderConfig::late_pieces` (on in `datahelix train`, whose step driver
    /// calls `prepare_ahead` right after each batch).
    pub late_pieces: bool,
}

impl SimConfig {
    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.workers.len()
    }

    fn agreed(&self) -> AgreedConfig {
        AgreedConfig {
            policy: self.policy,
            global_batch: self.global_batch,
            steps: self.steps,
            lookahead: self.lookahead,
            params: self.params,
            formula: self.formula,
            transfer: self.planner_transfer.clone(),
            split_above_s: self.split_above_s,
            ship_slack_s: self.ship_slack_s,
            check_plan: self.check_plan,
            seed: self.seed,
            accel_prior: self.accel_prior,
            accel_window: self.accel_window,
            // The simulated decodes never fail: no budget to keep.
            max_skip_rate: 1.0,
            plan_group_ranks: self.plan_group_ranks,
            late_pieces: self.late_pieces,
        }
    }
}

/// The dataset: descriptors and the true decode CPU seconds of each, indexed once for every
/// policy simulated over it (at 4096 ranks a workload holds millions of descriptors).
#[derive(Clone, Debug)]
pub struct SimData {
    /// Descriptors (the sampler draws their ids).
    descriptors: Vec<Descriptor>,
    /// True decode CPU seconds, per descriptor.
    decode_s: Vec<f64>,
    /// The decode truth `decode_s` was drawn from: what a piece of a sample costs.
    truth: Calibration,
    /// Position of each id's first descriptor.
    pos_of: HashMap<u64, usize>,
    /// The sampler of the last seed simulated.
    sampler: Arc<Mutex<Option<Sampler>>>,
}

impl SimData {
    /// The dataset of `descriptors` whose decodes take `decode_s` CPU seconds (one per
    /// descriptor, drawn from `truth`, which also prices their pieces).
    pub fn new(
        descriptors: Vec<Descriptor>,
        decode_s: Vec<f64>,
        truth: Calibration,
    ) -> Result<SimData, String> {
        if descriptors.is_empty() || decode_s.len() != descriptors.len() {
            return Err("the dataset is empty (or its decode times do not match it)".into());
        }
        let mut pos_of = HashMap::with_capacity(descriptors.len());
        for (i, d) in descriptors.iter().enumerate() {
            pos_of.entry(d.id).or_insert(i);
        }
        Ok(SimData { descriptors, decode_s, truth, pos_of, sampler: Arc::default() })
    }

    /// The descriptors.
    pub fn descriptors(&self) -> &[Descriptor] {
        &self.descriptors
    }

    /// True decode CPU seconds, per descriptor.
    pub fn decode_s(&self) -> &[f64] {
        &self.decode_s
    }

    /// True CPU seconds of decoding the targets `frames` (all of them with `None`) of the
    /// sample at `pos`.
    fn part_s(&self, pos: usize, frames: Option<FrameRange>, params: &Params) -> f64 {
        let whole_s = self.decode_s[pos];
        match frames {
            Some(range) => self.truth.part_s(&self.descriptors[pos], params, whole_s, range),
            None => whole_s,
        }
    }

    /// The least seconds one worker takes before the sample of `id` is decoded, however it is
    /// cut ([`Calibration::chain_s`]); 0 for an id not in the dataset.
    fn chain_s(&self, id: u64, params: &Params) -> f64 {
        self.pos_of
            .get(&id)
            .map_or(0.0, |&pos| self.truth.chain_s(&self.descriptors[pos], params, self.decode_s[pos]))
    }

    /// The sampler of these ids under `seed` (made once per seed in a row).
    fn sampler(&self, seed: u64) -> Sampler {
        let mut kept = self.sampler.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.as_ref() {
            Some(s) if s.seed() == seed => s.clone(),
            _ => {
                let ids: Vec<u64> = self.descriptors.iter().map(|d| d.id).collect();
                let s = Sampler::new(&ids, seed);
                *kept = Some(s.clone());
                s
            }
        }
    }
}

/// A simulated run's result.
#[derive(Clone, Debug, Serialize)]
pub struct SimRun {
    /// Every (rank, step) record, as `datahelix train` writes them.
    pub records: Vec<RankStep>,
    /// The protocol's summary of the measured steps.
    pub summary: Summary,
    /// Wall seconds the planner took over the whole run (measured on this machine).
    pub plan_wall_s: f64,
    /// Plans made.
    pub plans: u64,
    /// Largest single plan's wall seconds.
    pub plan_max_s: f64,
    /// Wall seconds the whole simulation took.
    pub sim_wall_s: f64,
    /// Warm-up steps (not in the summary).
    pub warmup: u64,
    /// Samples the rebalance moved while the step before trained (every rank's, every step).
    pub moved_ahead: u64,
    /// Samples the rebalance moved while their step was collected.
    pub moved_at_collection: u64,
    /// Every planner input by step, when [`SimConfig::keep_plan_inputs`] asked for them.
    #[serde(skip)]
    pub plan_inputs: Vec<(u64, crate::plan::PlanInput)>,
}

/// The workload's descriptors as the engines' catalog.
struct DataCatalog<'a> {
    data: &'a SimData,
}

impl Catalog for DataCatalog<'_> {
    fn lookup(&self, id: u64) -> Result<Option<(usize, Descriptor)>, String> {
        Ok(self.data.pos_of.get(&id).map(|&p| (p, self.data.descriptors[p])))
    }
}

/// One simulated rank: its engine, its decode pool and its clock.
struct Rank {
    /// When each of its decodes of late-rank steps ended, by part key (a late rank's pieces are
    /// looked up here once their decoder filed them; kept until their step ends).
    ended: HashMap<PartKey, f64>,
    engine: Engine,
    pool: CpuPool,
    /// The rank's clock, simulated seconds.
    t: f64,
    /// Part keys of the jobs in its pool, by the pool tag.
    tags: Vec<PartKey>,
    /// The collective it waits in.
    pending: Option<Action>,
    answer: Option<Event>,
    delivered: Option<BatchSpec>,
    done: bool,
}

struct Cluster<'a> {
    /// Pieces of late-rank steps that crossed in an exchange (kept until their step ends): what
    /// a late rank still waits for is what did not.
    crossed: std::collections::HashSet<PartKey>,
    cfg: &'a SimConfig,
    catalog: DataCatalog<'a>,
    agreed: Agreed,
    ranks: Vec<Rank>,
}

fn kind(a: &Action) -> &'static str {
    match a {
        Action::Gather(_) => "all-gather",
        Action::GatherV(_) => "all-gather-v",
        Action::Agree(_) => "agree",
        Action::Exchange(_) => "exchange",
        _ => "a local action",
    }
}

impl Cluster<'_> {
    /// Files what rank `r`'s pool finished by its clock.
    fn file_finished(&mut self, r: usize) {
        let rank = &mut self.ranks[r];
        rank.pool.advance_to(rank.t);
        while let Some(d) = rank.pool.take_finished() {
            Self::file(&self.agreed, rank, d);
        }
    }

    fn file(agreed: &Agreed, rank: &mut Rank, d: super::engine::Done) {
        let key = rank.tags[d.job.tag as usize];
        let plan = agreed.plan_of(key.step);
        // Only a late-rank step's decodes are looked up by their end.
        if plan.is_some_and(|p| !p.plan.late_ranks.is_empty()) {
            rank.ended.insert(key, d.end_s);
        }
        let shape =
            plan.and_then(|p| p.job_of.get(&(key.slot, key.part)).map(|&j| p.shapes[j])).unwrap_or([0; 4]);
        let f = Finished { key, ok: true, shape, seconds: d.end_s - d.start_s, cpu_s: d.job.cpu_s };
        rank.engine.finished(agreed, f);
    }

    /// Runs rank `r`'s engine until it waits in a collective or ends its call.
    fn advance(&mut self, r: usize) -> Result<(), String> {
        loop {
            self.file_finished(r);
            let answer = self.ranks[r].answer.take();
            let action = self.ranks[r]
                .engine
                .poll(&mut self.agreed, &self.catalog, answer)
                .map_err(|e| e.to_string())?;
            let rank = &mut self.ranks[r];
            match action {
                Action::Submit(jobs) => {
                    for j in jobs {
                        let cpu_s = self.catalog.data.part_s(j.pos, j.frames, &self.cfg.params);
                        let tag = rank.tags.len() as u64;
                        rank.tags.push(j.key);
                        rank.pool.submit(rank.t, SimJob { key: j.priority, id: j.id, cpu_s, tag });
                    }
                }
                Action::Await { keys, until_s } => {
                    let limit = until_s.unwrap_or(f64::INFINITY);
                    while !rank.engine.all_done(&keys) {
                        match rank.pool.next_completion_by(limit) {
                            Some(d) => {
                                rank.t = rank.t.max(d.end_s);
                                Self::file(&self.agreed, rank, d);
                            }
                            None => {
                                if limit.is_finite() {
                                    rank.t = rank.t.max(limit);
                                }
                                break;
                            }
                        }
                    }
                }
                Action::Assemble { .. } => {}
                Action::Deliver(spec) => rank.delivered = Some(spec),
                Action::Exchange(order) if order.label == crate::step::LATE_EXCHANGE => {
                    let answer = self.late_exchange(r, &order)?;
                    self.ranks[r].answer = Some(answer);
                }
                Action::Done => {
                    rank.done = true;
                    return Ok(());
                }
                collective => {
                    rank.pending = Some(collective);
                    return Ok(());
                }
            }
        }
    }

    /// Runs one call on every rank to its end (`call(r)` is rank `r`'s).
    fn call(&mut self, call: impl Fn(&Rank) -> Call) -> Result<(), String> {
        for rank in &mut self.ranks {
            let c = call(rank);
            rank.engine.begin(c).map_err(|e| e.to_string())?;
            rank.done = false;
        }
        loop {
            for r in 0..self.ranks.len() {
                if !self.ranks[r].done && self.ranks[r].pending.is_none() {
                    self.advance(r)?;
                }
            }
            let waiting: Vec<usize> =
                (0..self.ranks.len()).filter(|&r| self.ranks[r].pending.is_some()).collect();
            if waiting.is_empty() {
                return Ok(());
            }
            let first = waiting[0];
            let what = kind(self.ranks[first].pending.as_ref().expect("waiting"));
            if let Some(r) =
                (0..self.ranks.len()).find(|&r| self.ranks[r].pending.as_ref().map(kind) != Some(what))
            {
                let theirs = self.ranks[r].pending.as_ref().map_or("the end of the call", kind);
                return Err(format!(
                    "the collective schedule differs between ranks: rank {first} is in an {what}, rank {r} in {theirs}"
                ));
            }
            self.resolve()?;
        }
    }

    /// Completes the collective every rank waits in.
    fn resolve(&mut self) -> Result<(), String> {
        let n = self.ranks.len();
        let links = &self.cfg.links;
        let actions: Vec<Action> =
            self.ranks.iter_mut().map(|r| r.pending.take().expect("every rank waits")).collect();
        let latest = self.ranks.iter().map(|r| r.t).fold(f64::MIN, f64::max);
        match &actions[0] {
            Action::Gather(_) => {
                let mut all = Vec::with_capacity(n * RECORD_BYTES);
                for a in &actions {
                    if let Action::Gather(b) = a {
                        all.extend_from_slice(b);
                    }
                }
                let all = Arc::new(all);
                let end = latest + links.all_gather_s(n, RECORD_BYTES as u64);
                for rank in &mut self.ranks {
                    rank.t = end;
                    rank.answer = Some(Event::Gathered(Arc::clone(&all)));
                }
            }
            Action::GatherV(_) => {
                let blocks: Vec<Vec<u8>> = actions
                    .iter()
                    .map(|a| if let Action::GatherV(b) = a { b.clone() } else { Vec::new() })
                    .collect();
                let widest = blocks.iter().map(Vec::len).max().unwrap_or(0) as u64;
                let all = Arc::new(blocks);
                let end = latest + links.all_gather_s(n, widest);
                for rank in &mut self.ranks {
                    rank.t = end;
                    rank.answer = Some(Event::GatheredV(Arc::clone(&all)));
                }
            }
            Action::Agree(v) => {
                let same = actions.iter().all(|a| matches!(a, Action::Agree(w) if w == v));
                let end = latest + 2.0 * links.all_gather_s(n, 8);
                for rank in &mut self.ranks {
                    rank.t = end;
                    rank.answer = Some(Event::Agreed(same));
                }
            }
            Action::Exchange(_) => self.exchange(&actions)?,
            other => return Err(format!("{} is not a collective", kind(other))),
        }
        Ok(())
    }

    /// A late-rank step's late exchange, which the ranks issue at different points of their calls
    /// (a late rank right after its collection, the others at the start of their next call):
    /// not met in lockstep. A sender pays its bytes' crossing; a late rank gets from each
    /// sender the pieces it still owed at collection once the last of them is decoded (the
    /// sender's pool says when), the sender has returned from its collection (when it has, in
    /// this pass over the ranks: the late ranks are the last ones; another late rank sends from
    /// its own late exchange, right after its collection) and the bytes have crossed.
    fn late_exchange(&mut self, r: usize, order: &crate::step::ExchangeOrder) -> Result<Event, String> {
        let links = &self.cfg.links;
        let bytes_of = message_bytes;
        let send_s: f64 =
            order.outgoing.iter().map(|(to, m, _)| links.between(r, *to).seconds(bytes_of(m))).sum();
        self.ranks[r].t += send_s;
        if order.expect.is_empty() {
            return Ok(Event::Exchanged(Vec::new()));
        }
        let p = self
            .agreed
            .plan_of(order.step)
            .ok_or_else(|| format!("late exchange of unplanned step {}", order.step))?;
        let mut got = Vec::new();
        let mut arrive = self.ranks[r].t;
        for &h in &order.expect {
            let (mut last_end, mut bytes) = (0.0f64, 0u64);
            for &j in &p.inbound[r] {
                let j = j as usize;
                let key = p.key_of(j);
                if p.decoder_of(j) != h || self.crossed.contains(&key) {
                    continue;
                }
                let end = match self.ranks[h].ended.get(&key) {
                    Some(&e) => e,
                    None => {
                        // Not filed yet: run a copy of its decoder's pool to it (later submissions
                        // queue behind it: they belong to later steps).
                        let mut pool = self.ranks[h].pool.clone();
                        let tags = &self.ranks[h].tags;
                        std::iter::from_fn(|| pool.next_completion())
                            .find(|d| tags[d.job.tag as usize] == key)
                            .map(|d| d.end_s)
                            .ok_or_else(|| {
                                format!(
                                    "rank {h} owes rank {r} a piece of step {} it never decodes",
                                    order.step
                                )
                            })?
                    }
                };
                let m = crate::step::Message {
                    key,
                    id: p.slots[key.slot as usize].id,
                    ok: true,
                    shape: p.shapes[j],
                    tokens: 0,
                };
                last_end = last_end.max(end);
                bytes += bytes_of(&m);
                got.push((h, m, bytes_of(&m)));
            }
            let sender = &self.ranks[h];
            let returned =
                if sender.done && !p.plan.is_late(h) { sender.t + self.cfg.step_overhead_s } else { 0.0 };
            arrive = arrive.max(last_end.max(returned) + links.between(h, r).seconds(bytes));
        }
        self.ranks[r].t = arrive;
        Ok(Event::Exchanged(got))
    }

    /// A pairwise exchange: each rank meets its partners, sends its messages one after another
    /// and receives concurrently; ranks without partners return at once.
    fn exchange(&mut self, actions: &[Action]) -> Result<(), String> {
        let n = self.ranks.len();
        let links = &self.cfg.links;
        let orders: Vec<&crate::step::ExchangeOrder> = actions
            .iter()
            .map(|a| match a {
                Action::Exchange(o) => Ok(o),
                _ => Err("an exchange met another collective".to_string()),
            })
            .collect::<Result<_, _>>()?;
        let mut incoming: Vec<Vec<(usize, crate::step::Message, u64)>> = vec![Vec::new(); n];
        let mut send_s = vec![0.0f64; n];
        let mut recv_s = vec![0.0f64; n];
        let mut partners: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (r, o) in orders.iter().enumerate() {
            for &p in &o.send {
                if p >= n || orders[p].expect.binary_search(&r).is_err() {
                    return Err(format!(
                        "exchange of step {}: rank {r} would send to rank {p}, which does not expect it",
                        o.step
                    ));
                }
                let bytes: u64 = o
                    .outgoing
                    .iter()
                    .filter(|m| m.0 == p)
                    .map(|m| (HEADER + m.1.shape.iter().product::<usize>()) as u64)
                    .sum();
                let s = links.between(r, p).seconds(bytes);
                send_s[r] += s;
                recv_s[p] += s;
            }
            for &p in &o.expect {
                if p >= n || orders[p].send.binary_search(&r).is_err() {
                    return Err(format!(
                        "exchange of step {}: rank {r} expects a block from rank {p}, which does not send it",
                        o.step
                    ));
                }
            }
            partners[r] = o.send.iter().chain(&o.expect).copied().filter(|&p| p != r).collect();
            for &(to, m, _) in &o.outgoing {
                let bytes = message_bytes(&m);
                let late_step =
                    self.agreed.plan_of(m.key.step).is_some_and(|p| !p.plan.late_ranks.is_empty());
                if late_step && o.payload == crate::step::Payload::Parts {
                    self.crossed.insert(m.key);
                }
                incoming[to].push((r, m, bytes));
            }
        }
        let before: Vec<f64> = self.ranks.iter().map(|r| r.t).collect();
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            if !partners[r].is_empty() {
                let met = partners[r].iter().map(|&p| before[p]).fold(before[r], f64::max);
                rank.t = met + send_s[r].max(recv_s[r]);
            }
            rank.answer = Some(Event::Exchanged(std::mem::take(&mut incoming[r])));
        }
        Ok(())
    }
}

/// Bytes of one message on the wire: its header, and its tensor when decoded.
fn message_bytes(m: &crate::step::Message) -> u64 {
    (HEADER + if m.ok { m.shape.iter().product::<usize>() } else { 0 }) as u64
}

/// Simulates one run of `cfg` on `data`.
pub fn simulate(cfg: &SimConfig, data: &SimData) -> Result<SimRun, String> {
    let wall = Instant::now();
    let r_n = cfg.ranks();
    if r_n == 0 || cfg.global_batch == 0 || cfg.lookahead == 0 || cfg.warmup >= cfg.steps {
        return Err("ranks, global batch and lookahead must be ≥ 1 and warm-up < steps".into());
    }
    if cfg.cores.len() != r_n || cfg.workers.contains(&0) {
        return Err("every rank needs ≥ 1 worker and a core count".into());
    }
    let ranks = (0..r_n)
        .map(|r| {
            // A worker's share of a core, as the loader reports it under an enforced budget.
            let millicores =
                (1000.0 * cfg.cores[r] / cfg.workers[r] as f64).round().clamp(1.0, 1000.0) as u32;
            Rank {
                engine: Engine::new(r, r_n, cfg.workers[r], millicores),
                pool: CpuPool::new(cfg.workers[r] as usize, cfg.cores[r]).with_quota_period(cfg.cfs_period_s),
                t: 0.0,
                tags: Vec::new(),
                ended: HashMap::new(),
                pending: None,
                answer: None,
                delivered: None,
                done: false,
            }
        })
        .collect();
    let mut cluster = Cluster {
        crossed: std::collections::HashSet::new(),
        cfg,
        catalog: DataCatalog { data },
        agreed: Agreed::with_sampler(cfg.agreed(), data.sampler(cfg.seed), r_n),
        ranks,
    };
    cluster.agreed.keep_inputs(cfg.keep_plan_inputs);
    let reduce_s = cfg.links.all_gather_s(r_n, 8);
    let mut out: Vec<RankStep> = Vec::with_capacity(r_n * cfg.steps as usize);
    let mut now = 0.0f64;
    for s in 0..cfg.steps {
        cluster.call(|_| Call::Next)?;
        let mut ends = vec![0.0f64; r_n];
        let mut step_records = Vec::with_capacity(r_n);
        for (r, rank) in cluster.ranks.iter_mut().enumerate() {
            let spec =
                rank.delivered.take().ok_or_else(|| format!("rank {r}: step {s} delivered nothing"))?;
            let hand = rank.t + cfg.step_overhead_s;
            let terms = cfg.profile.step_terms(&spec.tokens, cfg.seed, s, r as u64);
            let gpu_s = (terms.fixed_s + terms.work_s) * terms.noise;
            let sample_gpu_s: Vec<f64> = spec.tokens.iter().map(|&t| cfg.profile.sample_seconds(t)).collect();
            rank.t = hand;
            ends[r] = hand + gpu_s;
            step_records.push(RankStep {
                rank: r as u32,
                step: s,
                input_wait_s: hand - now,
                gpu_s,
                ids: spec.ids.clone(),
                skipped: spec.skipped,
                start_s: now,
                end_s: 0.0,
                max_sample_gpu_s: sample_gpu_s.iter().copied().fold(0.0, f64::max),
                sample_chain_s: spec.ids.iter().map(|&id| data.chain_s(id, &cfg.params)).collect(),
                sample_gpu_s,
                accel: Some(terms),
                decode_cpu_s: spec.decode_cpu_s,
                tokens: spec.tokens.iter().sum(),
                bytes_in: spec.bytes_in,
                tensor_checksum: None,
                charged_bytes: None,
            });
        }
        // While the accelerators run: plan ahead, then ship near each step's end.
        cluster.call(|_| Call::Prepare)?;
        for (r, rank) in cluster.ranks.iter_mut().enumerate() {
            rank.t = rank.t.max(ends[r] - cfg.ship_margin_s);
        }
        cluster.call(|rank| Call::Ship { step_end_s: ends[rank.engine.rank()] })?;
        for (rank, rec) in cluster.ranks.iter_mut().zip(&mut step_records) {
            // The pieces it decoded for a late rank after the step's collection count here.
            rec.decode_cpu_s += rank.engine.take_late_cpu_s(s);
            rank.engine.report(rec.gpu_s).map_err(|e| e.to_string())?;
            rank.ended.retain(|k, _| k.step >= s);
        }
        cluster.crossed.retain(|k| k.step >= s);
        let next =
            cluster.ranks.iter().zip(&ends).map(|(rank, &e)| rank.t.max(e)).fold(now, f64::max) + reduce_s;
        for rank in &mut cluster.ranks {
            rank.t = next;
        }
        for mut rec in step_records {
            rec.end_s = next;
            out.push(rec);
        }
        now = next;
    }
    let cores = usable_cores(&cfg.cores, &cfg.workers);
    let shape = RunShape { warmup: cfg.warmup, ranks: r_n, cores, lookahead: cfg.lookahead as u64 };
    let mut summary = summarize(&out, shape);
    let counters = cluster.ranks[0].engine.counters();
    summary.rebalances_run = counters.rebalances_run;
    summary.rebalances_skipped = counters.rebalances_skipped;
    summary.stretched_steps = cluster.agreed.stretched_plans();
    summary.late_steps = cluster.agreed.late_plans();
    summary.bytes_moved = out.iter().filter(|r| r.step >= cfg.warmup).map(|r| r.bytes_in).sum();
    let (plan_wall_s, plans, plan_max_s) = cluster.agreed.plan_stats();
    Ok(SimRun {
        records: out,
        summary,
        plan_wall_s,
        plans,
        plan_max_s,
        sim_wall_s: wall.elapsed().as_secs_f64(),
        warmup: cfg.warmup,
        moved_ahead: cluster.ranks.iter().map(|r| r.engine.counters().moved_ahead).sum(),
        moved_at_collection: cluster.ranks.iter().map(|r| r.engine.counters().moved_at_collection).sum(),
        plan_inputs: cluster.agreed.take_inputs(),
    })
}
