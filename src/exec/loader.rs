//! The per-rank executor: a [`Loader`] yields each step's [`Batch`] of decoded tensors, planned
//! by the chosen [`Policy`] identically on every rank.
//!
//! Each call of [`Loader::next_batch`] (right after the training step's gradient sync):
//!
//! 1. all-gathers every rank's fixed-size step record (measured step time, tokens, queued decode
//!    work, decode timings, failed samples) and feeds the cost models in rank order, so every
//!    rank holds the same models;
//! 2. plans the steps up to `lookahead` ahead that are not planned yet and submits this rank's
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

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use crate::collective::{Collective, CollectiveError};
use crate::cost::accel::{AccelFit, AccelModel, TokenFormula};
use crate::decode::cost::{output_bytes, CostModel, Features};
use crate::decode::pool::{Job, Mode, Output, Pool, PoolConfig, Tensor};
use crate::decode::sample::{output_shape, Params};
use crate::descriptor::{Codec, Descriptor};
use crate::exec::cgroup::CpuGroup;
use crate::exec::exchange::{self, Piece};
use crate::index::{Index, IndexError};
use crate::metrics::Span;
use crate::plan::rebalance::{self, Decoded};
use crate::plan::record::{DecodeObservation, StepRecord};
use crate::plan::{PlanInput, PlanOptions, RankState, SampleIn, TransferCost};
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
    /// Steps decoded ahead (the DataLoader's prefetch; 2 by default).
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
}

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
    plan: StepPlan,
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
    cpu_by_step: HashMap<u64, f64>,
    next_step: u64,
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
        let record = StepRecord { rank: rank as u32, workers: workers_here, ..StepRecord::default() };
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
            decode_model: CostModel::default(),
            plans: BTreeMap::new(),
            done: HashMap::new(),
            outstanding: HashMap::new(),
            record,
            ranks: Vec::new(),
            zstd: (0.0, 0.0),
            zstd_shared: (0.0, 0.0),
            cpu_by_step: HashMap::new(),
            next_step: 0,
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
        // The DataLoader-style baselines plan from the sampler alone: they exchange records once,
        // for everyone's worker counts, and never again.
        if s == 0 || self.cfg.policy.uses_records() || self.cfg.check_plan {
            self.exchange_records(s)?;
        }
        let plan_start = self.now();
        let last = (s + self.cfg.lookahead as u64).min(self.cfg.steps.max(s + 1));
        for t in s..last {
            if !self.plans.contains_key(&t) {
                self.plan_and_submit(t, s)?;
            }
        }
        let plan_end = self.now();
        self.span(0, "plan", format!("plan ≤ step {}", last - 1), plan_start, plan_end);
        let mut batch = self.collect(s)?;
        self.next_step += 1;
        self.plans.remove(&s);
        let end = self.now();
        batch.input_wait_s = end - call;
        self.span(0, "wait", format!("input step {s}"), call, end);
        Ok(batch)
    }

    fn exchange_records(&mut self, s: u64) -> Result<(), ExecError> {
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
        self.record = StepRecord { rank, workers: self.workers_here, ..StepRecord::default() };
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
        let mut samples = Vec::with_capacity(usable.len());
        for &k in &usable {
            let d = slots[k].desc.expect("usable slots have descriptors");
            let (f, h, w) = output_shape(&d, &self.cfg.params);
            samples.push(SampleIn {
                id: d.id,
                step: 0,
                tokens: self.tokens(d.text_tokens, f, h, w),
                decode_s: self.decode_model.predict(&d, &self.cfg.params).max(0.0),
                bytes: output_bytes(&d, &self.cfg.params),
            });
        }
        // Every rank's batch of step t is due when step t−1 ends: the predicted ends of the steps
        // already planned, from now (synchronous training: the slowest rank sets each step).
        let due: f64 = (now_step..t).filter_map(|j| self.plans.get(&j)).map(|p| p.plan.step_s()).sum();
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
            samples,
            ranks: rank_states,
            accel: self.accel.model(),
            transfer: self.effective_transfer(),
            options: PlanOptions::default(),
        };
        let plan =
            policy::plan_step(self.cfg.policy, t, &input).map_err(|e| ExecError::Invalid(e.to_string()))?;
        if self.cfg.check_plan && !self.world.agree(plan.hash)? {
            return Err(ExecError::Invalid(format!(
                "--check-plan: rank {me}'s plan of step {t} ({:016x}) differs from another rank's; the ranks' inputs or builds differ",
                plan.hash
            )));
        }
        self.counters.predicted_misses += plan.predicted_misses;
        for (k, &i) in plan.order[me].iter().enumerate() {
            let slot = slots[usable[i as usize]];
            let (pos, desc) = (slot.pos.expect("usable"), slot.desc.expect("usable"));
            let path = self.index.dir().join(self.index.path(pos)?);
            self.pool.submit(Job {
                id: slot.id,
                path,
                deadline: (t << 32) | k as u64,
                descriptor: Some(desc),
                mode: Mode::Sampled,
                strategy: None,
                frames: None,
            });
            self.outstanding.insert((t, usable[i as usize]), input.samples[i as usize].decode_s);
        }
        let predicted = input.samples.iter().map(|x| (x.tokens, x.bytes)).collect();
        self.plans.insert(t, Planned { slots, usable, predicted, plan });
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

    /// Measures zstd on a tensor about to be sent (every 16th, and the first).
    fn measure_zstd(&mut self, data: &[u8]) {
        if data.len() < 4096 || (self.zstd.1 > 0.0 && self.counters.bytes_in % 16 != 0) {
            return;
        }
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
        let mine: Vec<usize> = p.plan.order[me].iter().map(|&i| p.usable[i as usize]).collect();
        let ships = p.plan.owner.iter().zip(&p.plan.decoder).any(|(o, d)| o != d);
        let slots = p.slots.clone();
        // Owner of every slot: the plan's for usable ones; bad ones are reported by the rank the
        // strided split gives them.
        let mut owner_of = vec![u32::MAX; slots.len()];
        for (i, &k) in p.usable.iter().enumerate() {
            owner_of[k] = p.plan.owner[i];
        }
        let mut held: Vec<(usize, Sample)> = Vec::new();
        let mut skipped: Vec<u64> = Vec::new();
        for (k, slot) in slots.iter().enumerate() {
            if !slot.ok && k % ranks == me {
                skipped.push(slot.id);
            }
        }
        // 1. Samples this rank decodes for others come first (their jobs run first too: earlier
        //    deadlines), so that a slow local sample never holds the other ranks at the exchange.
        let (shipped, kept): (Vec<usize>, Vec<usize>) =
            mine.iter().partition(|&&k| owner_of[k] as usize != me);
        self.wait_for(s, &shipped)?;
        let mut blocks: Vec<Vec<u8>> = vec![Vec::new(); ranks];
        for &k in &shipped {
            let owner = owner_of[k] as usize;
            let piece = match self.take(s, k, &slots)? {
                Ok(smp) => {
                    self.measure_zstd(&smp.data);
                    Piece {
                        index: k as u32,
                        id: smp.id,
                        shape: smp.shape,
                        tokens: smp.tokens,
                        ok: true,
                        data: smp.data.to_vec(),
                    }
                }
                Err(id) => {
                    Piece { index: k as u32, id, shape: [0; 4], tokens: 0, ok: false, data: Vec::new() }
                }
            };
            let z = piece.ok && self.compress(piece.data.len());
            exchange::pack(&mut blocks[owner], &piece, z).map_err(|e| ExecError::Invalid(e.to_string()))?;
        }
        // 2. The exchange (every rank knows from the plan whether any tensor moves).
        let mut bytes_in = 0u64;
        if ships {
            let t0 = self.now();
            let received = self.world.all_to_all_v_vec(&blocks)?;
            for block in received {
                bytes_in += block.len() as u64;
                self.receive(
                    &exchange::unpack(&block).map_err(|e| ExecError::Invalid(e.to_string()))?,
                    &mut held,
                    &mut skipped,
                );
            }
            let t1 = self.now();
            self.span(0, "transfer", format!("placement step {s}"), t0, t1);
        }
        // The samples this rank decodes for itself.
        self.wait_for(s, &kept)?;
        for &k in &kept {
            match self.take(s, k, &slots)? {
                Ok(smp) => held.push((k, smp)),
                Err(id) => skipped.push(id),
            }
        }
        // 3. After decoding.
        let after = self.cfg.policy.after_decode();
        if after != AfterDecode::Nothing {
            bytes_in += self.rebalance(s, after, &mut held, &mut skipped)?;
        }
        held.sort_by_key(|(k, _)| *k);
        skipped.sort_unstable();
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

    /// Blocks until the decodes of these slots of step `s` are done.
    fn wait_for(&mut self, s: u64, slots: &[usize]) -> Result<(), ExecError> {
        while slots.iter().any(|&k| !self.done.contains_key(&(s, k))) {
            let Some(outcome) = self.pool.recv() else {
                let me = self.world.rank();
                return Err(ExecError::Invalid(format!("rank {me}: the decode pool lost jobs of step {s}")));
            };
            self.absorb(outcome);
        }
        Ok(())
    }

    /// The decoded sample of slot `k` of step `s`, or its id when decoding failed (logged and
    /// reported in the next step record).
    fn take(&mut self, s: u64, k: usize, slots: &[Slot]) -> Result<Result<Sample, u64>, ExecError> {
        let outcome = self
            .done
            .remove(&(s, k))
            .ok_or_else(|| ExecError::Invalid(format!("slot {k} of step {s} was not decoded")))?;
        let text = slots[k].desc.map_or(0, |d| d.text_tokens);
        match outcome.result {
            Ok(Output::Sampled { tensor, decoded }) => {
                let sh = decoded.shape;
                let tokens = self.tokens(text, sh.frames, sh.height, sh.width);
                Ok(Ok(Sample { id: slots[k].id, shape: sh.dims(), tokens, data: TensorData::Pooled(tensor) }))
            }
            Ok(Output::AllFrames(_)) => Err(ExecError::Invalid("all-frames output in a training run".into())),
            Err(e) => {
                tracing::warn!(rank = self.world.rank(), step = s, "skipping {e}");
                self.record.push_skip(slots[k].id);
                Ok(Err(slots[k].id))
            }
        }
    }

    fn receive(&mut self, pieces: &[Piece], held: &mut Vec<(usize, Sample)>, skipped: &mut Vec<u64>) {
        for p in pieces {
            if p.ok {
                let data = TensorData::Owned(p.data.clone());
                held.push((p.index as usize, Sample { id: p.id, shape: p.shape, tokens: p.tokens, data }));
            } else {
                skipped.push(p.id);
            }
        }
    }

    /// Files a finished decode: stores it, learns from it, traces it.
    fn absorb(&mut self, outcome: crate::decode::pool::Outcome) {
        let me = self.world.rank();
        let (t, k) = (outcome.deadline >> 32, (outcome.deadline & 0xffff_ffff) as usize);
        let Some(slot) =
            self.plans.get(&t).and_then(|p| p.plan.order[me].get(k).map(|&i| p.usable[i as usize]))
        else {
            return; // not ours (cannot happen: every job was submitted from a plan)
        };
        self.outstanding.remove(&(t, slot));
        *self.cpu_by_step.entry(t).or_default() += outcome.cpu_seconds;
        if let (Ok(Output::Sampled { .. }), Some(d)) = (&outcome.result, self.plans[&t].slots[slot].desc) {
            let f = Features::predict(&d, &self.cfg.params);
            self.record.push_observation(DecodeObservation {
                codec: d.codec.to_byte(),
                mpixels: f.mpixels,
                mbits: f.mbits,
                discarded: f.discarded,
                seconds: outcome.seconds,
            });
        }
        let end = self.now();
        let lane = 1 + (k as u32 % self.workers_here.max(1));
        self.span(lane, "decode", format!("decode {} (step {t})", outcome.id), end - outcome.seconds, end);
        self.done.insert((t, slot), outcome);
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
    /// moves; one all-to-all-v carries them when there are any. Returns bytes received.
    /// (`Decoded::id` holds the sample's batch index here.)
    fn rebalance(
        &mut self,
        s: u64,
        after: AfterDecode,
        held: &mut Vec<(usize, Sample)>,
        skipped: &mut Vec<u64>,
    ) -> Result<u64, ExecError> {
        let me = self.world.rank();
        let ranks = self.world.size();
        let decoded: Vec<Decoded> = if after == AfterDecode::Gated {
            // DataHelix decides from the plan's predictions, identical on every rank, without a
            // collective: under the protocol they are the decoded sizes (failed samples aside).
            let p = &self.plans[&s];
            p.usable
                .iter()
                .zip(&p.predicted)
                .zip(&p.plan.owner)
                .map(|((&k, &(tokens, bytes)), &owner)| Decoded { id: k as u64, owner, tokens, bytes })
                .collect()
        } else {
            self.gather_decoded(held)?
        };
        let moves: Vec<(usize, u32)> = match after {
            AfterDecode::TokenBalance => policy::token_balance(&decoded, ranks),
            AfterDecode::Gated => {
                let d = rebalance::rebalance(
                    &decoded,
                    ranks,
                    &self.accel.model(),
                    &self.effective_transfer(),
                    0.1,
                );
                d.moves.iter().map(|m| (m.sample, m.to)).collect()
            }
            AfterDecode::Nothing => Vec::new(),
        };
        if moves.is_empty() {
            self.counters.rebalances_skipped += 1;
            return Ok(0);
        }
        self.counters.rebalances_run += 1;
        let t0 = self.now();
        let mut blocks: Vec<Vec<u8>> = vec![Vec::new(); ranks];
        for (i, to) in moves {
            let d = decoded[i];
            if d.owner as usize != me {
                continue;
            }
            let k = d.id as usize; // the batch index travels in `id` here
            let Some(pos) = held.iter().position(|(hk, _)| *hk == k) else { continue };
            let (_, smp) = held.swap_remove(pos);
            self.measure_zstd(&smp.data);
            let piece = Piece {
                index: k as u32,
                id: smp.id,
                shape: smp.shape,
                tokens: smp.tokens,
                ok: true,
                data: smp.data.to_vec(),
            };
            let z = self.compress(piece.data.len());
            exchange::pack(&mut blocks[to as usize], &piece, z)
                .map_err(|e| ExecError::Invalid(e.to_string()))?;
        }
        let received = self.world.all_to_all_v_vec(&blocks)?;
        let mut bytes_in = 0;
        for block in received {
            bytes_in += block.len() as u64;
            self.receive(
                &exchange::unpack(&block).map_err(|e| ExecError::Invalid(e.to_string()))?,
                held,
                skipped,
            );
        }
        let t1 = self.now();
        self.span(0, "transfer", format!("rebalance step {s}"), t0, t1);
        Ok(bytes_in)
    }
}
