//! What a plan is a function of: [`PlanInput`], one value holding everything every rank agrees on.

use serde::{Deserialize, Serialize};

use crate::cost::accel::AccelModel;

/// One sample of the global batches being planned.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleIn {
    /// Sample id (ties are broken by it).
    pub id: u64,
    /// Which planned step it belongs to: 0 for step s+1, 1 for s+2, … (lookahead).
    pub step: u32,
    /// Tokens (or latents) it gives the accelerator.
    pub tokens: u64,
    /// Predicted decode seconds on one worker (from the decode-cost model).
    pub decode_s: f64,
    /// Decoded tensor bytes (what moves if another rank decodes it).
    pub bytes: u64,
}

/// One piece of a sample whose decode is split across ranks (a contiguous range of its sampled
/// frames, starting at a keyframe: [`crate::decode::split`]). A split sample is decoded as its
/// pieces only — placement may put each piece on another rank — and is trained whole by its
/// owner once every piece has arrived.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PieceIn {
    /// Index into [`PlanInput::samples`] of the sample it belongs to.
    pub sample: u32,
    /// Predicted decode seconds of this piece on one worker.
    pub decode_s: f64,
    /// Decoded bytes of this piece.
    pub bytes: u64,
}

/// What a rank contributes to the plan (from its all-gathered step record).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankState {
    /// Decode workers of this rank (its CPU budget).
    pub workers: u32,
    /// Seconds from now until its accelerator finishes the current step: the deadline of its
    /// batch for step s+1.
    pub accel_free_s: f64,
    /// Seconds of decode work already queued on its workers (not part of this plan).
    pub queued_cpu_s: f64,
    /// Bytes of decoded tensors it may hold for one step (0: no cap).
    pub mem_cap: u64,
}

/// Transfer seconds of a message between two ranks: `α + bytes/β`, by size band (the
/// collectives' model), with bands of their own between nodes when the links were measured per
/// class (a node's shared memory and its network differ by an order of magnitude).
///
/// ```
/// use datahelix::plan::TransferCost;
/// let near = TransferCost::linear(5e-6, 2e10);
/// let far = TransferCost::linear(2e-5, 2e9);
/// let links = TransferCost::per_node(&near, &far, vec![0, 0, 1, 1]);
/// assert_eq!(links.between(1 << 20, 0, 1), near.seconds(1 << 20));
/// assert_eq!(links.between(1 << 20, 1, 2), far.seconds(1 << 20));
/// assert_eq!(links.seconds(1 << 20), far.seconds(1 << 20)); // the slowest link
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransferCost {
    /// Bands `(up_to_bytes, alpha_s, beta_bytes_per_s)`, ascending; the last covers everything.
    /// Between ranks of one node, or between any two ranks when `inter_node` is empty.
    pub bands: Vec<(u64, f64, f64)>,
    /// Bands between ranks on different nodes (empty: `bands` for every pair). Inputs written
    /// without it read as empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inter_node: Vec<(u64, f64, f64)>,
    /// Per rank, the node it runs on (dense ids from 0); empty: one node. Used only with
    /// `inter_node`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_of: Vec<u32>,
}

impl TransferCost {
    /// One band for every size.
    pub fn linear(alpha_s: f64, beta_bytes_per_s: f64) -> TransferCost {
        TransferCost::banded(vec![(u64::MAX, alpha_s, beta_bytes_per_s)])
    }

    /// One class of links with these bands.
    pub fn banded(bands: Vec<(u64, f64, f64)>) -> TransferCost {
        TransferCost { bands, inter_node: Vec::new(), node_of: Vec::new() }
    }

    /// Two classes: `near` between ranks with the same `node_of`, `far` between the others
    /// (their own node tables, if any, are not used).
    pub fn per_node(near: &TransferCost, far: &TransferCost, node_of: Vec<u32>) -> TransferCost {
        TransferCost { bands: near.bands.clone(), inter_node: far.bands.clone(), node_of }
    }

    /// Whether the model tells links apart (two classes and a node table).
    pub fn has_classes(&self) -> bool {
        !self.inter_node.is_empty() && !self.node_of.is_empty()
    }

    /// Whether ranks `a` and `b` are linked as ranks of one node (always, with one class).
    pub fn same_node(&self, a: usize, b: usize) -> bool {
        !self.has_classes() || self.node_of.get(a) == self.node_of.get(b)
    }

    /// Predicted seconds to move `bytes` over the slowest link: between two nodes when the
    /// model tells links apart, else between any two ranks.
    pub fn seconds(&self, bytes: u64) -> f64 {
        band_seconds(if self.has_classes() { &self.inter_node } else { &self.bands }, bytes)
    }

    /// Predicted seconds to move `bytes` within one node.
    pub fn seconds_near(&self, bytes: u64) -> f64 {
        band_seconds(&self.bands, bytes)
    }

    /// Predicted seconds to move `bytes` from rank `a` to rank `b`.
    pub fn between(&self, bytes: u64, a: usize, b: usize) -> f64 {
        if self.same_node(a, b) {
            self.seconds_near(bytes)
        } else {
            self.seconds(bytes)
        }
    }

    /// The same links with every band's `(α, β)` mapped (compression folded in, say).
    pub fn map_bands(&self, f: impl Fn(f64, f64) -> (f64, f64)) -> TransferCost {
        let map = |bands: &[(u64, f64, f64)]| {
            bands
                .iter()
                .map(|&(up_to, a, b)| {
                    let (a, b) = f(a, b);
                    (up_to, a, b)
                })
                .collect()
        };
        TransferCost {
            bands: map(&self.bands),
            inter_node: map(&self.inter_node),
            node_of: self.node_of.clone(),
        }
    }

    /// Checks the bands and that the node table, if any, covers `ranks` ranks.
    pub fn validate(&self, ranks: usize) -> Result<(), String> {
        for (name, bands) in [("bands", &self.bands), ("inter_node", &self.inter_node)] {
            for &(_, a, b) in bands.iter() {
                if !(a.is_finite() && a >= 0.0 && b.is_finite() && b >= 0.0) {
                    return Err(format!("transfer.{name}: α {a} and β {b} must be finite and ≥ 0"));
                }
            }
        }
        if self.bands.is_empty() {
            return Err("transfer.bands is empty: give at least one (up_to_bytes, α, β)".into());
        }
        if !self.node_of.is_empty() && self.node_of.len() != ranks {
            return Err(format!(
                "transfer.node_of names {} ranks, the plan has {ranks}: one node id per rank",
                self.node_of.len()
            ));
        }
        Ok(())
    }
}

/// A measured model's bands (each holds sizes below its bound) as the planner's (sizes up to
/// theirs).
impl From<&crate::collective::cost::TransferModel> for TransferCost {
    fn from(m: &crate::collective::cost::TransferModel) -> TransferCost {
        let up_to = |max: u64| if max == u64::MAX { u64::MAX } else { max.saturating_sub(1) };
        TransferCost::banded(
            m.bands.iter().map(|b| (up_to(b.max_bytes), b.alpha_s, b.beta_bytes_per_s)).collect(),
        )
    }
}

fn band_seconds(bands: &[(u64, f64, f64)], bytes: u64) -> f64 {
    match bands.iter().find(|b| bytes <= b.0).or(bands.last()) {
        Some(&(_, alpha, beta)) if beta > 0.0 => alpha + bytes as f64 / beta,
        Some(&(_, alpha, _)) => alpha,
        None => 0.0,
    }
}

/// How the global batch is split across ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Batching {
    /// DistributedSampler: position p of the batch to rank p mod R (the rank-local baseline).
    Strided,
    /// Longest processing time first: heaviest sample to the least-loaded rank.
    Lpt,
    /// LPT, then moves and swaps off the most-loaded rank while the maximum drops.
    #[default]
    LptLocalSearch,
    /// Karmarkar–Karp largest differencing, R-way (for comparison).
    KarmarkarKarp,
}

/// [`PlanOptions::guard_share`]'s default: a tenth of the time until the batch is due, about
/// the error of a two-step window's predicted length plus a large clip's predicted decode.
pub const DEFAULT_GUARD_SHARE: f64 = 0.1;

/// Knobs of the planner. Part of the input: two ranks with different options plan differently.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// How to split each global batch.
    pub batching: Batching,
    /// Whether samples may be decoded away from their owner (deadline-aware placement).
    pub placement: bool,
    /// Bound on local-search rounds per step.
    pub local_search_rounds: u32,
    /// Whether placement may also swap the owners of two samples (joint batching + placement).
    pub swap_owners: bool,
    /// Bound on placement changes per plan.
    pub placement_moves: u32,
    /// Helper ranks tried per move.
    pub helpers_per_move: u32,
    /// Input wait above which a batch counts as a miss (seconds; the protocol's 1 ms).
    pub miss_tolerance_s: f64,
    /// Share of the time until a batch is due that placement tries to keep free before each of
    /// its jobs is due (0: none — a plan on time by a hair is as good as any). Inputs written
    /// without it read as 0.
    #[serde(default)]
    pub guard_share: f64,
    /// Ranks per planning group, whose decode work is placed apart from the other groups'
    /// (`plan::groups`): 0, automatic — none below `groups::GROUPS_FROM_RANKS` ranks, from
    /// there the transfer model's nodes, else groups of `groups::GROUP_RANKS`; `n`, groups of
    /// `n` consecutive ranks at any scale. Inputs written without it read as 0.
    #[serde(default)]
    pub group_ranks: u32,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            batching: Batching::LptLocalSearch,
            placement: true,
            swap_owners: true,
            local_search_rounds: 4096,
            placement_moves: 4096,
            helpers_per_move: 8,
            miss_tolerance_s: 0.001,
            guard_share: DEFAULT_GUARD_SHARE,
            group_ranks: 0,
        }
    }
}

/// Everything a plan is a function of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanInput {
    /// The step the first planned batch belongs to (s+1).
    pub first_step: u64,
    /// The global batches of the planned steps, samples in sampler order within each step.
    pub samples: Vec<SampleIn>,
    /// Per rank, in rank order.
    pub ranks: Vec<RankState>,
    /// The accelerator model's current parameters.
    pub accel: AccelModel,
    /// The transfer model's current parameters.
    pub transfer: TransferCost,
    /// Planner knobs.
    pub options: PlanOptions,
    /// Pieces of the samples decoded in parts, each sample's pieces together and in frame order
    /// (at least two per split sample); empty when nothing is split.
    #[serde(default)]
    pub pieces: Vec<PieceIn>,
    /// Seconds from now until the last exchange of decoded tensors before the first planned
    /// batch is due (the hand-over of the step before it, while the accelerator runs); 0 when
    /// none is left. A tensor decoded on another rank after it waits for the batch's collection.
    #[serde(default)]
    pub exchange_s: f64,
    /// The CPUs' pace: seconds a step's decode work takes spread over every worker, averaged
    /// over recent steps (0: unknown). Where it outlasts a step's most loaded accelerator, the
    /// CPUs set the step's length, and placement relaxes the step's balance up to it
    /// ([`crate::plan::batching::stretch`]). Inputs written without it read as 0.
    #[serde(default)]
    pub decode_pace_s: f64,
    /// How much that pace moves: the standard deviation of the recent steps' paces, seconds (0:
    /// unknown). It bounds how far past the pace a stretched step reaches
    /// ([`crate::plan::batching::stretch_margin_cap_ns`]). Inputs written without it read as 0.
    #[serde(default)]
    pub decode_pace_spread_s: f64,
    /// Whether the loader can hand a rank pieces after its batch's collection (its caller calls
    /// `prepare_ahead` or `ship_ahead` right after `next_batch`): then a step where some rank
    /// must wait whatever the schedule gets late ranks ([`crate::plan::Plan::late_ranks`]).
    /// Inputs written without it read as false.
    #[serde(default)]
    pub late_pieces: bool,
    /// Seconds from now until the batches are expected due, counting the waits predicted for
    /// the steps before (a step whose late ranks wait on chains ends that much later): a sample
    /// whose chain outlasts it is late wherever it is decoded ([`crate::plan::late`]). 0: the
    /// ranks' earliest `accel_free_s`. Inputs written without it read as 0.
    #[serde(default)]
    pub late_due_s: f64,
}

impl PlanInput {
    /// Number of planned steps (lookahead).
    pub fn steps(&self) -> usize {
        self.samples.iter().map(|s| s.step as usize + 1).max().unwrap_or(0)
    }

    /// Checks what the planner relies on; says which sample or rank is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.ranks.is_empty() {
            return Err("no ranks".into());
        }
        if !(self.decode_pace_s.is_finite() && self.decode_pace_s >= 0.0) {
            return Err(format!("decode_pace_s {} must be finite and ≥ 0", self.decode_pace_s));
        }
        if !(self.decode_pace_spread_s.is_finite() && self.decode_pace_spread_s >= 0.0) {
            return Err(format!("decode_pace_spread_s {} must be finite and ≥ 0", self.decode_pace_spread_s));
        }
        if !(self.late_due_s.is_finite() && self.late_due_s >= 0.0) {
            return Err(format!("late_due_s {} must be finite and ≥ 0", self.late_due_s));
        }
        if !(0.0..1.0).contains(&self.options.guard_share) {
            return Err(format!("options.guard_share {} must be in [0, 1)", self.options.guard_share));
        }
        for (r, s) in self.ranks.iter().enumerate() {
            if s.workers == 0 {
                return Err(format!("rank {r} has no decode workers"));
            }
            if !(s.accel_free_s.is_finite() && s.queued_cpu_s.is_finite() && s.queued_cpu_s >= 0.0) {
                return Err(format!("rank {r}: accel_free_s and queued_cpu_s must be finite, queued ≥ 0"));
            }
        }
        for s in &self.samples {
            if !(s.decode_s.is_finite() && s.decode_s >= 0.0) {
                return Err(format!("sample {}: decode_s must be finite and ≥ 0", s.id));
            }
        }
        if !self.exchange_s.is_finite() {
            return Err("exchange_s must be finite".into());
        }
        self.transfer.validate(self.ranks.len())?;
        let mut seen = vec![0u32; self.samples.len()];
        for (k, p) in self.pieces.iter().enumerate() {
            let Some(n) = seen.get_mut(p.sample as usize) else {
                return Err(format!("piece {k} names sample index {} of {}", p.sample, self.samples.len()));
            };
            if *n > 0 && self.pieces[k - 1].sample != p.sample {
                return Err(format!(
                    "the pieces of sample {} are not listed together",
                    self.samples[p.sample as usize].id
                ));
            }
            if !(p.decode_s.is_finite() && p.decode_s >= 0.0) {
                return Err(format!("piece {k}: decode_s must be finite and ≥ 0"));
            }
            *n += 1;
        }
        if let Some(i) = seen.iter().position(|&n| n == 1) {
            return Err(format!(
                "sample {} is split into one piece; a split sample needs two or more",
                self.samples[i].id
            ));
        }
        if self.steps() > 1024 {
            return Err("more than 1024 lookahead steps".into());
        }
        Ok(())
    }
}
