//! The simulated executor: `src/exec/loader.rs`'s step loop in simulated time, for all ranks at
//! once. Policies, planner, cost models and the step record are the real code; what is simulated
//! is time — decode pools ([`CpuPool`]), links ([`Links`]), the emulated accelerator and the
//! collectives' barriers.
//!
//! Per step `s`, starting at `T_s` (every rank leaves the previous step's all-reduce together):
//!
//! 1. (first steps only) the step records are all-gathered (an all-gather of `RECORD_BYTES` per
//!    rank) and fed to the accelerator and decode-cost models in rank order, and steps
//!    `s ..= s+L` are planned with `plan_step` (`accel_free_s`: the predicted step times of the
//!    steps already planned from `s` on); each rank's jobs — whole samples, or pieces of a
//!    sample split at keyframes (`policy::pieces`) — are queued in its pool, keyed
//!    `(step << 32) | position` (EDF in plan order);
//! 2. each rank waits for its own decodes of step `s`, absorbing completions in time order;
//! 3. when the plan moves tensors, the pairwise exchange: each tensor reaches its owner once it
//!    is decoded and moved over its link (a rank waits only for what it receives, never to
//!    send: the loader sends the rest while its accelerator runs); then the policy's
//!    after-decode step (post-balance: an
//!    all-gather of (index, tokens, bytes) and an all-to-all-v, a barrier; helix's gate:
//!    decided from the plan, pairwise when it moves anything);
//! 4. the loader's `prepare_ahead`: with every batch in hand, the records are all-gathered
//!    and step `s+L` is planned and queued — off the input-wait path;
//! 5. the emulated accelerator runs the delivered batch (the protocol's step time, noise
//!    included), and the all-reduce ends the step at the slowest rank.
//!
//! The `as-is` variant keeps the older executor for comparison: records and planning at the
//! start of every step, a global all-to-all, and the gate behind an all-gather.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;

use super::engine::{CpuPool, Done, Links, SimJob};
use crate::cost::accel::{AccelFit, AccelModel, TokenFormula};
use crate::decode::cost::{output_bytes, CostModel, Features};
use crate::decode::sample::Params;
use crate::decode::split::FrameRange;
use crate::descriptor::Descriptor;
use crate::emu::Profile;
use crate::metrics::{summarize, RankStep, Summary};
use crate::plan::rebalance::{self, Decoded};
use crate::plan::record::{DecodeObservation, StepRecord, RECORD_BYTES};
use crate::plan::{PlanInput, PlanOptions, RankState, TransferCost};
use crate::policy::pieces::{OfferContext, StepOffer};
use crate::policy::{self, AfterDecode, Policy, StepPlan};
use crate::sampler::Sampler;

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
    /// Add the planner's measured wall time to simulated time (not deterministic).
    pub charge_planner: bool,
    /// Observations the accelerator fit keeps (the loader's is 64).
    pub accel_window: usize,
    /// Which executor: the loader as it is, or with the changes this simulator proposes.
    pub variant: Variant,
    /// How long before its accelerator's step ends a rank ships what of the next step is
    /// decoded (`Loader::ship_ahead`; the proposed executor).
    pub ship_margin_s: f64,
    /// How long before its step ends a rank stops waiting for the rest it owes and ships it
    /// (`Loader::ship_ahead`'s second exchange).
    pub ship_slack_s: f64,
}

/// The executor simulated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// The older executor (kept to show the effect of the fixes): finished decodes counted as
    /// queued work, records and planning at the start of every step, tensors moved by a global
    /// all-to-all, and helix's gate behind an after-decode all-gather (a barrier).
    AsIs,
    /// `src/exec/loader.rs` as it is now: finished decodes are drained before the step record is
    /// built, records and planning happen while the accelerator runs (`prepare_ahead`), tensors
    /// move pairwise, and helix's gate is decided by every rank from the plan's token counts
    /// (known from descriptors), without an after-decode barrier.
    #[default]
    Proposed,
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Variant, String> {
        match s {
            "as-is" => Ok(Variant::AsIs),
            "proposed" => Ok(Variant::Proposed),
            _ => Err(format!("unknown executor {s:?}; as-is or proposed")),
        }
    }
}

impl SimConfig {
    /// Ranks.
    pub fn ranks(&self) -> usize {
        self.workers.len()
    }
}

/// The dataset: descriptors and the true decode CPU seconds of each.
#[derive(Clone, Debug)]
pub struct SimData {
    /// Descriptors (the sampler draws their ids).
    pub descriptors: Vec<Descriptor>,
    /// True decode CPU seconds, per descriptor.
    pub decode_s: Vec<f64>,
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
}

/// One sample of a planned step.
#[derive(Clone, Copy)]
struct Slot {
    id: u64,
    pos: Option<usize>,
    ok: bool,
}

struct Planned {
    slots: Vec<Slot>,
    usable: Vec<usize>,
    plan: StepPlan,
    /// Per decode job: the sampled frames it decodes.
    ranges: Vec<FrameRange>,
    /// Per decode job: when it finished (NaN while it has not).
    done_at: Vec<f64>,
    /// Per rank: own decode jobs of this step not finished yet.
    left: Vec<u32>,
}

impl Planned {
    fn owner_of(&self, j: usize) -> usize {
        self.plan.owner[self.plan.jobs[j].sample as usize] as usize
    }
}

/// The simulator's state over one run.
struct Sim<'a> {
    cfg: &'a SimConfig,
    data: &'a SimData,
    pos_of: HashMap<u64, usize>,
    sampler: Sampler,
    pools: Vec<CpuPool>,
    plans: BTreeMap<u64, Planned>,
    outstanding: Vec<HashMap<(u64, usize), f64>>,
    cpu_by_step: Vec<HashMap<u64, f64>>,
    records: Vec<StepRecord>,
    accel: AccelFit,
    decode_model: CostModel,
    plan_wall_s: f64,
    plan_max_s: f64,
    plans_made: u64,
    rebalances: (u64, u64),
    /// The step being trained and its predicted accelerator seconds (the loader's `training`).
    training: Option<(u64, f64)>,
}

impl<'a> Sim<'a> {
    fn absorb(&mut self, r: usize, d: Done) {
        let t = d.job.key >> 32;
        let j = d.job.tag as usize;
        self.outstanding[r].remove(&(t, j));
        *self.cpu_by_step[r].entry(t).or_default() += d.job.cpu_s;
        if let Some(pl) = self.plans.get_mut(&t) {
            pl.left[r] = pl.left[r].saturating_sub(1);
            pl.done_at[j] = d.end_s;
            let slot = pl.usable[pl.plan.jobs[j].sample as usize];
            if let Some(pos) = pl.slots[slot].pos {
                let desc = &self.data.descriptors[pos];
                let f = Features::predict_range(desc, &self.cfg.params, pl.ranges[j]);
                self.records[r].push_observation(DecodeObservation {
                    codec: desc.codec.to_byte(),
                    mpixels: f.mpixels,
                    mbits: f.mbits,
                    discarded: f.discarded,
                    seconds: d.end_s - d.start_s,
                });
            }
        }
    }

    fn exchange_records(&mut self, s: u64) -> Vec<RankState> {
        let measured: Vec<(f64, f64, f64)> = self
            .records
            .iter()
            .filter(|r| s > 0 && r.gpu_s > 0.0)
            .map(|r| (r.sum_tokens, r.sum_tokens_sq, r.gpu_s))
            .collect();
        self.accel.observe_many(&measured);
        for r in &self.records {
            for o in &r.observations {
                if let Some(codec) = crate::descriptor::Codec::from_byte(o.codec) {
                    let f = Features { mpixels: o.mpixels, mbits: o.mbits, discarded: o.discarded };
                    self.decode_model.observe_features(codec, &f, o.seconds);
                }
            }
        }
        let states: Vec<RankState> = (0..self.cfg.ranks())
            .map(|r| {
                let mut rec = self.records[r].clone();
                rec.queued_cpu_s = self.outstanding[r].values().sum();
                rec.rank_state()
            })
            .collect();
        for (r, rec) in self.records.iter_mut().enumerate() {
            *rec = StepRecord { rank: r as u32, workers: self.cfg.workers[r], ..StepRecord::default() };
        }
        states
    }

    fn plan_and_submit(
        &mut self,
        t: u64,
        now_step: u64,
        states: &[RankState],
        at: f64,
    ) -> Result<f64, String> {
        let cfg = self.cfg;
        let ids = self.sampler.global_batch(t, cfg.global_batch);
        let slots: Vec<Slot> = ids
            .iter()
            .map(|&id| {
                let pos = self.pos_of.get(&id).copied();
                let ok = pos.is_some_and(|p| self.data.descriptors[p].status.is_ok());
                Slot { id, pos, ok }
            })
            .collect();
        let usable: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].ok).collect();
        // Steps planned before are predicted again: the model has learned since.
        let model = self.accel.model();
        let planned = |j| self.plans.get(&j).map(|p: &Planned| p.plan.step_under(&model));
        // Planned against the steps running short by one spread of the accelerator model: a
        // batch is then ready even when they do.
        let due =
            policy::time_to_deadline(now_step, t, planned, self.training) * (-self.accel.spread()).exp();
        let exchange = match cfg.variant {
            Variant::Proposed => (due - cfg.ship_slack_s).max(0.0),
            Variant::AsIs => 0.0,
        };
        let offer = StepOffer::new(
            usable.iter().map(|&k| &self.data.descriptors[slots[k].pos.unwrap_or(0)]),
            &OfferContext {
                params: &cfg.params,
                formula: &cfg.formula,
                model: &self.decode_model,
                due_s: due,
                ranks: cfg.ranks(),
                split_above_s: None,
            },
        );
        let ranks: Vec<RankState> =
            states.iter().map(|s| RankState { accel_free_s: due, mem_cap: 0, ..*s }).collect();
        let input = PlanInput {
            first_step: t,
            samples: offer.samples.clone(),
            ranks,
            accel: self.accel.model(),
            transfer: cfg.planner_transfer.clone(),
            options: PlanOptions::default(),
            pieces: offer.pieces.clone(),
            exchange_s: exchange,
        };
        let clock = Instant::now();
        let plan = policy::plan_step(cfg.policy, t, &input).map_err(|e| format!("step {t}: {e}"))?;
        let took = clock.elapsed().as_secs_f64();
        self.plan_wall_s += took;
        self.plan_max_s = self.plan_max_s.max(took);
        self.plans_made += 1;
        let at = if cfg.charge_planner { at + took } else { at };
        let work = offer.job_work(plan.jobs.len());
        let mut left = vec![0u32; cfg.ranks()];
        for (r, order) in plan.order.iter().enumerate() {
            for (k, &j) in order.iter().enumerate() {
                let sample = plan.jobs[j as usize].sample as usize;
                let slot = usable[sample];
                let pos = slots[slot].pos.unwrap_or(0);
                let w = work[j as usize];
                // A piece takes its predicted share of the sample's true decode time.
                let whole_s = input.samples[sample].decode_s;
                let cpu_s = if w.frames == FrameRange::whole(offer.frames[sample]) {
                    self.data.decode_s[pos]
                } else {
                    self.data.decode_s[pos] * if whole_s > 0.0 { w.decode_s / whole_s } else { 0.5 }
                };
                self.pools[r].submit(
                    at,
                    SimJob { key: (t << 32) | k as u64, id: slots[slot].id, cpu_s, tag: j as u64 },
                );
                self.outstanding[r].insert((t, j as usize), w.decode_s);
                left[r] += 1;
            }
        }
        let (jobs, ranges) = (plan.jobs.len(), work.iter().map(|w| w.frames).collect());
        self.plans.insert(t, Planned { slots, usable, plan, ranges, done_at: vec![f64::NAN; jobs], left });
        Ok(at)
    }
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
    if data.descriptors.is_empty() || data.decode_s.len() != data.descriptors.len() {
        return Err("the dataset is empty (or its decode times do not match it)".into());
    }
    let mut pos_of = HashMap::with_capacity(data.descriptors.len());
    for (i, d) in data.descriptors.iter().enumerate() {
        pos_of.entry(d.id).or_insert(i);
    }
    let ids: Vec<u64> = data.descriptors.iter().map(|d| d.id).collect();
    let mut sim = Sim {
        cfg,
        data,
        pos_of,
        sampler: Sampler::new(&ids, cfg.seed),
        pools: (0..r_n).map(|r| CpuPool::new(cfg.workers[r] as usize, cfg.cores[r])).collect(),
        plans: BTreeMap::new(),
        outstanding: vec![HashMap::new(); r_n],
        cpu_by_step: vec![HashMap::new(); r_n],
        records: (0..r_n)
            .map(|r| StepRecord { rank: r as u32, workers: cfg.workers[r], ..StepRecord::default() })
            .collect(),
        accel: AccelFit::new(cfg.accel_prior, cfg.accel_window),
        decode_model: CostModel::default(),
        plan_wall_s: 0.0,
        plan_max_s: 0.0,
        plans_made: 0,
        rebalances: (0, 0),
        training: None,
    };
    let links = &cfg.links;
    let gather_s = links.all_gather_s(r_n, RECORD_BYTES as u64);
    let reduce_s = links.all_gather_s(r_n, 8);
    let after = cfg.policy.after_decode();
    let mut out: Vec<RankStep> = Vec::with_capacity(r_n * cfg.steps as usize);
    let mut now = 0.0f64;
    let proposed = cfg.variant == Variant::Proposed;
    // Per rank: when it last had its batch in hand (and ran `prepare_ahead`'s exchange).
    let mut handed = vec![f64::NEG_INFINITY; r_n];
    // Per rank: when it last ran `ship_ahead` (its step's end less the margin), and the latest
    // its second exchange may wait for (the slowest rank's predicted end less the slack). (Not
    // mirrored: the loader scales its decode priors to a worker's share of a core; this
    // model starts from the priors as they are.)
    let mut shipped = vec![f64::NEG_INFINITY; r_n];
    let mut ship_limit = vec![f64::NEG_INFINITY; r_n];
    for s in 0..cfg.steps {
        // 1–2. Records and planning — done here only for what the previous step did not plan
        //    ahead (the first steps, and every step of the as-is executor).
        let mut at = now;
        if !sim.plans.contains_key(&s) || !proposed {
            if proposed {
                for r in 0..r_n {
                    sim.pools[r].advance_to(now);
                    while let Some(d) = sim.pools[r].take_finished() {
                        sim.absorb(r, d);
                    }
                }
            }
            let states = sim.exchange_records(s);
            at = now + gather_s;
            let last = (s + 1 + cfg.lookahead as u64).min(cfg.steps.max(s + 1));
            for t in s..last {
                if !sim.plans.contains_key(&t) {
                    at = sim.plan_and_submit(t, s, &states, at)?;
                }
            }
        }
        // 3. Own decodes.
        let mut ready = vec![at; r_n];
        for (r, ready_r) in ready.iter_mut().enumerate() {
            while sim.plans.get(&s).is_some_and(|p| p.left[r] > 0) {
                let Some(d) = sim.pools[r].next_completion() else {
                    return Err(format!("rank {r}: the simulated pool lost jobs of step {s}"));
                };
                *ready_r = ready_r.max(d.end_s);
                sim.absorb(r, d);
            }
        }
        let p = sim.plans.remove(&s).ok_or_else(|| format!("step {s} was never planned"))?;
        sim.training = Some((s, p.plan.step_under(&sim.accel.model())));
        // Owner of each usable sample, as planned.
        let mut owner: Vec<u32> = p.plan.owner.clone();
        let mut bytes_in = vec![0u64; r_n];
        let mut in_hand = ready.clone();
        let moved: Vec<(usize, usize, u64)> = (0..p.plan.jobs.len())
            .filter(|&j| p.plan.decoder[j] as usize != p.owner_of(j))
            .map(|j| {
                let pos = p.slots[p.usable[p.plan.jobs[j].sample as usize]].pos.unwrap_or(0);
                let (_, h, w) = crate::decode::sample::output_shape(&data.descriptors[pos], &cfg.params);
                (
                    p.plan.decoder[j] as usize,
                    p.owner_of(j),
                    p.ranges[j].len() as u64 * h as u64 * w as u64 * 3,
                )
            })
            .collect();
        // 4. Placement's exchange, then the after-decode step.
        if !moved.is_empty() && proposed {
            // Pairwise, and a rank never waits to send: each tensor reaches its owner once it is
            // decoded (sent at the step's start when done by then) and moved over its link.
            let done_of = |j: usize| if p.done_at[j].is_finite() { p.done_at[j] } else { at };
            let rounds = |j: usize| {
                let (from, to) = (p.plan.decoder[j] as usize, p.owner_of(j));
                (handed[from].max(handed[to]), shipped[from].max(shipped[to]))
            };
            // `ship_ahead`'s second exchange: a rank still owing tensors after the first waits
            // for them until its limit, then sends.
            let mut second = vec![f64::NEG_INFINITY; r_n];
            for j in 0..p.plan.jobs.len() {
                let from = p.plan.decoder[j] as usize;
                if from != p.owner_of(j) && done_of(j) > rounds(j).1 {
                    second[from] = second[from].max(done_of(j).min(ship_limit[from]));
                }
            }
            for j in 0..p.plan.jobs.len() {
                let (from, to) = (p.plan.decoder[j] as usize, p.owner_of(j));
                if from == to {
                    continue;
                }
                let pos = p.slots[p.usable[p.plan.jobs[j].sample as usize]].pos.unwrap_or(0);
                let (_, h, w) = crate::decode::sample::output_shape(&data.descriptors[pos], &cfg.params);
                let bytes = p.ranges[j].len() as u64 * h as u64 * w as u64 * 3;
                let done = done_of(j);
                // Decoded by the previous hand-over: sent then (`prepare_ahead`); by the
                // previous step's end less the margin: then (`ship_ahead`); by the sender's
                // second exchange: then — all while the accelerators ran; otherwise when the
                // batch is collected, or once decoded.
                let (early, late) = rounds(j);
                let sent = if done <= early {
                    early
                } else if done <= late {
                    late
                } else if done <= second[from] {
                    second[from].max(shipped[to])
                } else {
                    done.max(at)
                };
                in_hand[to] = in_hand[to].max(sent + links.between(from, to).seconds(bytes));
                bytes_in[to] += bytes;
            }
        } else if !moved.is_empty() {
            let start = ready.iter().copied().fold(f64::MIN, f64::max);
            let end = start + links.all_to_all_s(r_n, &moved);
            in_hand.iter_mut().for_each(|x| *x = end);
            for &(_, to, b) in &moved {
                bytes_in[to] += b;
            }
        }
        let tokens_of = |pos: usize| {
            let d = &data.descriptors[pos];
            let (f, h, w) = crate::decode::sample::output_shape(d, &cfg.params);
            cfg.formula.count(d.text_tokens, f, h, w)
        };
        if after != AfterDecode::Nothing {
            // Everything held, by batch index (the loader sorts the all-gathered list by it).
            let mut by_index: Vec<(usize, usize)> = (0..p.usable.len()).map(|i| (p.usable[i], i)).collect();
            by_index.sort_unstable();
            let decoded: Vec<Decoded> = by_index
                .iter()
                .map(|&(k, i)| {
                    let pos = p.slots[k].pos.unwrap_or(0);
                    Decoded {
                        id: k as u64,
                        owner: owner[i],
                        tokens: tokens_of(pos),
                        bytes: output_bytes(&data.descriptors[pos], &cfg.params),
                    }
                })
                .collect();
            let start = in_hand.iter().copied().fold(f64::MIN, f64::max);
            let per_rank = (24 * decoded.len()).div_ceil(r_n) as u64;
            // The proposed gate needs no all-gather (no decode fails here: the tokens are the plan's).
            let local = cfg.variant == Variant::Proposed && after == AfterDecode::Gated;
            let mut end = if local { start } else { start + links.all_gather_s(r_n, per_rank) };
            let moves: Vec<(usize, u32)> = match after {
                AfterDecode::TokenBalance => policy::token_balance(&decoded, r_n),
                AfterDecode::Gated => {
                    let d =
                        rebalance::rebalance(&decoded, r_n, &sim.accel.model(), &cfg.planner_transfer, 0.1);
                    d.moves.iter().map(|m| (m.sample, m.to)).collect()
                }
                AfterDecode::Nothing => Vec::new(),
            };
            if moves.is_empty() {
                sim.rebalances.1 += 1;
                if local {
                    end = f64::NAN; // no collective: each rank keeps its own time
                }
            } else {
                sim.rebalances.0 += 1;
                let pairs: Vec<(usize, usize, u64)> = moves
                    .iter()
                    .map(|&(j, to)| (decoded[j].owner as usize, to as usize, decoded[j].bytes))
                    .collect();
                if local {
                    // The proposed gate's exchange is pairwise too: only the ranks concerned meet.
                    let busy = links.busy_s(r_n, &pairs);
                    let before = in_hand.clone();
                    for &(from, to, _) in &pairs {
                        let both = before[from].max(before[to]);
                        in_hand[from] = in_hand[from].max(both + busy[from]);
                        in_hand[to] = in_hand[to].max(both + busy[to]);
                    }
                    end = f64::NAN;
                } else {
                    end += links.all_to_all_s(r_n, &pairs);
                }
                for &(j, to) in &moves {
                    let i = by_index[j].1;
                    owner[i] = to;
                    bytes_in[to as usize] += decoded[j].bytes;
                }
            }
            if !end.is_nan() {
                in_hand.iter_mut().for_each(|x| *x = end);
            }
        }
        // The loader's `prepare_ahead`: once its batch is in hand (the accelerator running),
        // each rank joins the record all-gather, and the step that may now start decoding is
        // planned. A rank waiting there for a slower peer loses no accelerator time.
        if proposed {
            for r in 0..r_n {
                handed[r] = in_hand[r] + cfg.step_overhead_s;
            }
        }
        let mut prepared = f64::MIN;
        let last = (s + 1 + cfg.lookahead as u64).min(cfg.steps.max(s + 1));
        if proposed && (s + 1..last).any(|t| !sim.plans.contains_key(&t)) {
            for r in 0..r_n {
                sim.pools[r].advance_to(in_hand[r] + cfg.step_overhead_s);
                while let Some(d) = sim.pools[r].take_finished() {
                    sim.absorb(r, d);
                }
            }
            let states = sim.exchange_records(s);
            let mut at = in_hand.iter().copied().fold(now, f64::max) + cfg.step_overhead_s + gather_s;
            for t in s + 1..last {
                if !sim.plans.contains_key(&t) {
                    at = sim.plan_and_submit(t, s, &states, at)?;
                }
            }
            prepared = at;
        }
        // 5. The accelerator and the all-reduce.
        let mut held: Vec<Vec<usize>> = vec![Vec::new(); r_n];
        for (i, &k) in p.usable.iter().enumerate() {
            held[owner[i] as usize].push(k);
        }
        let mut skipped: Vec<Vec<u64>> = vec![Vec::new(); r_n];
        for (k, slot) in p.slots.iter().enumerate() {
            if !slot.ok {
                skipped[k % r_n].push(slot.id);
            }
        }
        let mut ends = vec![0.0f64; r_n];
        let mut step_records = Vec::with_capacity(r_n);
        // Per rank: how much longer the slowest rank's step is predicted to take.
        let accel = p.plan.accel_under(&sim.accel.model());
        let slowest = accel.iter().copied().fold(0.0, f64::max);
        for r in 0..r_n {
            held[r].sort_unstable();
            let tokens: Vec<u64> = held[r].iter().map(|&k| tokens_of(p.slots[k].pos.unwrap_or(0))).collect();
            let gpu_s = cfg.profile.step_seconds(&tokens, cfg.seed, s, r as u64);
            let hand = in_hand[r] + cfg.step_overhead_s;
            ends[r] = hand + gpu_s;
            if proposed {
                shipped[r] = (ends[r] - cfg.ship_margin_s).max(hand);
                // Until the slowest rank is predicted to end its step (the loader's wait).
                let behind = (slowest - accel[r]).clamp(0.0, accel[r].max(0.0));
                ship_limit[r] = (ends[r] + behind - cfg.ship_slack_s).max(shipped[r]);
            }
            let rec = &mut sim.records[r];
            rec.gpu_s = gpu_s;
            rec.sum_tokens = tokens.iter().map(|&t| t as f64).sum();
            rec.sum_tokens_sq = tokens.iter().map(|&t| (t as f64).powi(2)).sum();
            rec.samples = tokens.len() as u32;
            step_records.push(RankStep {
                rank: r as u32,
                step: s,
                input_wait_s: hand - now,
                gpu_s,
                ids: held[r].iter().map(|&k| p.slots[k].id).collect(),
                skipped: std::mem::take(&mut skipped[r]),
                start_s: now,
                end_s: 0.0,
                max_sample_gpu_s: tokens.iter().map(|&t| cfg.profile.sample_seconds(t)).fold(0.0, f64::max),
                decode_cpu_s: sim.cpu_by_step[r].remove(&s).unwrap_or(0.0),
                tokens: tokens.iter().sum(),
                bytes_in: bytes_in[r],
                tensor_checksum: None,
            });
        }
        let next = ends.iter().copied().fold(now.max(prepared), f64::max) + reduce_s;
        if std::env::var_os("DH_SIM_DEBUG").is_some() {
            let lo = ready.iter().copied().fold(f64::MAX, f64::min) - now;
            let hi = ready.iter().copied().fold(f64::MIN, f64::max) - now;
            eprintln!(
                "step {s}: predicted misses {} moved {} ready {lo:.3}..{hi:.3} predicted step {:.3} actual {:.3} queued {:.2} accel {:?} max samples/rank {} h264 margin {:.2}",
                p.plan.predicted_misses,
                moved.len(),
                p.plan.step_s(),
                next - now,
                sim.outstanding.iter().flat_map(|o| o.values()).sum::<f64>(),
                sim.accel.model(),
                held.iter().map(Vec::len).max().unwrap_or(0),
                sim.decode_model.planning_factor(crate::descriptor::Codec::H264)
            );
        }
        for mut rec in step_records {
            rec.end_s = next;
            out.push(rec);
        }
        now = next;
    }
    let cores: f64 = cfg.cores.iter().sum();
    let mut summary = summarize(&out, cfg.warmup, r_n, cores);
    summary.rebalances_run = sim.rebalances.0;
    summary.rebalances_skipped = sim.rebalances.1;
    summary.bytes_moved = out.iter().filter(|r| r.step >= cfg.warmup).map(|r| r.bytes_in).sum();
    Ok(SimRun {
        records: out,
        summary,
        plan_wall_s: sim.plan_wall_s,
        plans: sim.plans_made,
        plan_max_s: sim.plan_max_s,
        sim_wall_s: wall.elapsed().as_secs_f64(),
        warmup: cfg.warmup,
    })
}
