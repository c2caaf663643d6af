//! The input policies compared on one protocol (`shared/DESIGN.md`, "Policies"), behind one
//! function: given a step's global batch and what every rank reported, which rank trains each
//! sample, which rank decodes it, in what order, and what happens after decoding.
//!
//! | policy | split | decode | after decode |
//! |---|---|---|---|
//! | `rank-local` | strided (DistributedSampler) | own workers, in order | — |
//! | `actor-pool` | strided | one shared pool of all W workers, FIFO, results shipped | — |
//! | `post-balance` | strided | own workers, in order | LPT on decoded tokens + all-to-all, skipped below 20% imbalance |
//! | `helix-batching` | token-aware LPT + local search | own workers, EDF | — |
//! | `helix-placement` | as above | deadline-aware placement | — |
//! | `helix` | as above | deadline-aware placement | cost-gated rebalance |
//!
//! ```
//! use datahelix::policy::Policy;
//!
//! assert_eq!("helix".parse::<Policy>().unwrap(), Policy::Helix);
//! assert_eq!(Policy::ALL.len(), 6);
//! assert!(Policy::ActorPool.ships_tensors());
//! ```

pub mod pieces;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::str::FromStr;

use crate::cost::accel::AccelModel;

use crate::plan::{self, Batching, PlanInput, PlanOptions, RankState, SampleIn, TransferCost};

/// A policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Policy {
    /// PyTorch DataLoader + DistributedSampler.
    RankLocal,
    /// Ray ActorPool.
    ActorPool,
    /// Rank-local decode, then post-decode token balancing (LoongForge / MindSpeed-MM).
    PostBalance,
    /// DataHelix's batching alone.
    HelixBatching,
    /// DataHelix's batching and decode placement.
    HelixPlacement,
    /// DataHelix, full: batching, placement, cost-gated rebalance.
    Helix,
}

/// What happens to decoded tensors before delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterDecode {
    /// Deliver as planned.
    Nothing,
    /// LPT on decoded token counts + all-to-all, unless the imbalance is below 20%.
    TokenBalance,
    /// DataHelix's cost-gated rebalance.
    Gated,
}

impl Policy {
    /// Every policy, in the order tables list them.
    pub const ALL: [Policy; 6] = [
        Policy::RankLocal,
        Policy::ActorPool,
        Policy::PostBalance,
        Policy::HelixBatching,
        Policy::HelixPlacement,
        Policy::Helix,
    ];

    /// The name in `shared/CLI.md`.
    pub fn name(self) -> &'static str {
        match self {
            Policy::RankLocal => "rank-local",
            Policy::ActorPool => "actor-pool",
            Policy::PostBalance => "post-balance",
            Policy::HelixBatching => "helix-batching",
            Policy::HelixPlacement => "helix-placement",
            Policy::Helix => "helix",
        }
    }

    /// Whether decoded tensors may travel between ranks before the step.
    pub fn ships_tensors(self) -> bool {
        matches!(self, Policy::ActorPool | Policy::HelixPlacement | Policy::Helix)
    }

    /// Whether its plans use what ranks report every step (queued work, measured times). The
    /// DataLoader-style baselines do not, and so skip the per-step all-gather that DataHelix
    /// (and the actor pool's scheduler) pays for.
    pub fn uses_records(self) -> bool {
        !matches!(self, Policy::RankLocal | Policy::PostBalance)
    }

    /// What happens after decoding.
    pub fn after_decode(self) -> AfterDecode {
        match self {
            Policy::PostBalance => AfterDecode::TokenBalance,
            Policy::Helix => AfterDecode::Gated,
            _ => AfterDecode::Nothing,
        }
    }
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        Policy::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown policy {s:?}; one of {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One step's decisions, identical on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct StepPlan {
    /// The step.
    pub step: u64,
    /// Per sample of the input (batch order): the rank that trains it.
    pub owner: Vec<u32>,
    /// Per decode job: the rank that decodes it.
    pub decoder: Vec<u32>,
    /// Per decode job: its sample and piece (job `i < n` is sample `i`; see [`plan::Plan::jobs`]).
    pub jobs: Vec<plan::DecodeJob>,
    /// Per rank: decode-job indices in the order its workers take them.
    pub order: Vec<Vec<u32>>,
    /// Predicted accelerator seconds per rank (by the model at planning time).
    pub accel_s: Vec<f64>,
    /// Per sample of the input: its tokens (to predict the ranks' steps again under a newer
    /// model: [`StepPlan::accel_under`]).
    pub tokens: Vec<u64>,
    /// Predicted misses (the planner's; 0 for baselines, which do not predict).
    pub predicted_misses: u64,
    /// Predicted delay of the step's latest batch past its deadline, seconds (the planner's;
    /// 0 for baselines).
    pub delay_s: f64,
    /// Planning groups the decode work was placed in (0: none; see [`plan::groups`]).
    pub groups: u32,
    /// The accelerator seconds the plan stretched the step's most loaded rank towards, past the
    /// CPUs' pace ([`plan::Plan::stretch_s`]; 0: not stretched). The rebalance gate does not cut the
    /// step below it.
    pub stretch_s: f64,
    /// The ranks left to wait for their input, ascending ([`plan::Plan::late_ranks`]; placement
    /// policies only).
    pub late_ranks: Vec<u32>,
    /// Whether their decode jobs queue behind the next step's ([`plan::Plan::late_jobs_behind`]).
    pub late_jobs_behind: bool,
    /// What placing the groups took, where it did (measured, never read by a decision).
    pub timing: Option<plan::GroupTiming>,
    /// Hash of the decisions.
    pub hash: u64,
}

impl StepPlan {
    /// Whether `rank` is one of the step's late ranks ([`StepPlan::late_ranks`]).
    pub fn is_late(&self, rank: usize) -> bool {
        self.late_ranks.binary_search(&(rank as u32)).is_ok()
    }

    /// The predicted step time: the slowest rank.
    pub fn step_s(&self) -> f64 {
        self.accel_s.iter().copied().fold(0.0, f64::max)
    }

    /// Per rank: its batch's accelerator seconds under `model` — a plan made before the first
    /// steps were measured predicted them with the prior, and the time until a later batch is
    /// due must not.
    pub fn accel_under(&self, model: &AccelModel) -> Vec<f64> {
        let mut tokens: Vec<Vec<u64>> = vec![Vec::new(); self.accel_s.len()];
        for (&owner, &t) in self.owner.iter().zip(&self.tokens) {
            if let Some(rank) = tokens.get_mut(owner as usize) {
                rank.push(t);
            }
        }
        tokens.iter().map(|t| model.step_seconds(t)).collect()
    }

    /// The step's time under `model`: its slowest rank's.
    pub fn step_under(&self, model: &AccelModel) -> f64 {
        self.accel_under(model).into_iter().fold(0.0, f64::max)
    }
}

/// Plans one step under `policy`. `input.samples` are the usable samples of the global batch in
/// batch order (all with `step` 0); `input.ranks` what each rank reported. `scope`: which
/// planning groups' placements to make ([`plan::groups`]; a loader's rank needs only its own).
pub fn plan_step(
    policy: Policy,
    step: u64,
    input: &PlanInput,
    scope: plan::Scope,
) -> Result<StepPlan, plan::PlanError> {
    let r = input.ranks.len();
    let n = input.samples.len();
    let mut options = PlanOptions { ..input.options.clone() };
    let in_order = matches!(policy, Policy::RankLocal | Policy::PostBalance | Policy::ActorPool);
    match policy {
        Policy::RankLocal | Policy::PostBalance | Policy::ActorPool => {
            options.batching = Batching::Strided;
            options.placement = false;
        }
        Policy::HelixBatching => options.placement = false,
        Policy::HelixPlacement | Policy::Helix => options.placement = true,
    }
    // Only DataHelix's placement decodes a sample in pieces on several ranks.
    let pieces: &[plan::PieceIn] = if options.placement { &input.pieces } else { &[] };
    let plan::Planning { plan: p, timing } = plan::plan_as(input, step, &options, pieces, scope)?;
    let accel_s = p.first_step_loads();
    let plan::Plan {
        owner,
        decoder,
        jobs,
        decode_order,
        predicted_misses,
        delay_s,
        hash,
        groups,
        stretch_s,
        late_ranks,
        late_jobs_behind,
        ..
    } = p;
    let mut decoder = decoder;
    let mut order = decode_order;
    if policy == Policy::ActorPool {
        decoder = actor_pool_decoders(&input.samples, &input.ranks);
    }
    if in_order {
        order = vec![Vec::new(); r];
        for i in 0..n {
            order[decoder[i] as usize].push(i as u32);
        }
    }
    let mut h = plan::Fnv::default();
    h.word(hash).word(policy as u64);
    // With groups a rank knows its own group's decoders and orders only (the plan's hash
    // covers what every rank decides alike).
    if groups == 0 {
        for (i, &d) in decoder.iter().enumerate() {
            h.word(i as u64).word(d as u64);
        }
        for o in &order {
            for &i in o {
                h.word(i as u64);
            }
        }
    }
    Ok(StepPlan {
        step,
        owner,
        decoder,
        jobs,
        order,
        accel_s,
        tokens: input.samples.iter().map(|s| s.tokens).collect(),
        predicted_misses: if policy.name().starts_with("helix") { predicted_misses } else { 0 },
        delay_s: if policy.name().starts_with("helix") { delay_s } else { 0.0 },
        groups,
        stretch_s,
        late_ranks,
        late_jobs_behind,
        timing,
        hash: h.finish(),
    })
}

/// Seconds from now until step `t`'s batches are due, planning from step `now` (which trains now
/// or is about to): the predicted times of the steps before `t` — `planned(j)` for a planned
/// step, else `training`'s `(step, seconds)` for the one in training (synchronous training: the
/// slowest rank sets each step).
pub fn time_to_deadline(
    now: u64,
    t: u64,
    planned: impl Fn(u64) -> Option<f64>,
    training: Option<(u64, f64)>,
) -> f64 {
    (now..t).filter_map(|j| planned(j).or_else(|| training.filter(|x| x.0 == j).map(|x| x.1))).sum()
}

/// Seconds from now until the exchange of tensors before step `t` is due: the hand-over of step
/// `t − 1` (`prepare_ahead` sends then what of step `t` is decoded); 0 when that is not ahead
/// (`t − 1` trains now or is about to). Arguments as for [`time_to_deadline`].
pub fn time_to_exchange(
    now: u64,
    t: u64,
    planned: impl Fn(u64) -> Option<f64>,
    training: Option<(u64, f64)>,
) -> f64 {
    match t.checked_sub(1) {
        Some(before) if before > now => time_to_deadline(now, before, planned, training),
        _ => 0.0,
    }
}

/// Ray ActorPool semantics, predicted: samples in batch order go to whichever worker of the
/// shared pool frees up first (worker w lives on rank w mod R), using predicted decode times.
fn actor_pool_decoders(samples: &[SampleIn], ranks: &[RankState]) -> Vec<u32> {
    let r = ranks.len();
    let total: u32 = ranks.iter().map(|s| s.workers).sum();
    // (free at, worker index): the earliest-free worker first, the lower index on a tie.
    let mut free: BinaryHeap<Reverse<(i64, usize)>> = (0..total as usize)
        .map(|w| {
            let rank = &ranks[w % r];
            Reverse((plan::ns(rank.queued_cpu_s / rank.workers.max(1) as f64), w))
        })
        .collect();
    samples
        .iter()
        .map(|s| {
            let Reverse((at, w)) = free.pop().expect("at least one worker");
            free.push(Reverse((at + plan::ns(s.decode_s), w)));
            (w % r) as u32
        })
        .collect()
}

/// Post-balance's decision (LoongForge / MindSpeed-MM): LPT of the decoded samples by token count,
/// made only when the heaviest rank holds at least 20% more tokens than the mean. Returns
/// `(sample, new owner)` for every sample that moves.
pub fn token_balance(decoded: &[plan::rebalance::Decoded], ranks: usize) -> Vec<(usize, u32)> {
    let mut load = vec![0u64; ranks];
    for d in decoded {
        load[d.owner as usize] += d.tokens;
    }
    let total: u64 = load.iter().sum();
    let max = load.iter().copied().max().unwrap_or(0);
    if total == 0 || (max as f64) < 1.2 * total as f64 / ranks as f64 {
        return Vec::new();
    }
    let weight: Vec<u64> = decoded.iter().map(|d| d.tokens).collect();
    let ids: Vec<u64> = decoded.iter().map(|d| d.id).collect();
    let mem = vec![0u64; decoded.len()];
    let items = plan::batching::Items { weight: &weight, mem: &mem, id: &ids };
    let owner = plan::batching::lpt(&items, ranks, &vec![0; ranks]);
    (0..decoded.len()).filter(|&i| owner[i] != decoded[i].owner).map(|i| (i, owner[i])).collect()
}

/// Transfer model used by policies before one is calibrated: 20 µs + bytes / 5 GB/s.
pub fn default_transfer() -> TransferCost {
    TransferCost::linear(20e-6, 5e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_made_under_the_prior_is_predicted_again_under_the_fitted_model() {
        let sample = |id, tokens| SampleIn { id, step: 0, tokens, decode_s: 0.01, bytes: 1 };
        let input = PlanInput {
            first_step: 0,
            samples: vec![sample(1, 1000), sample(2, 3000)],
            ranks: vec![RankState { workers: 1, accel_free_s: 1.0, queued_cpu_s: 0.0, mem_cap: 0 }; 2],
            accel: AccelModel { c0: 0.01, a: 1e-6, b: 0.0 },
            transfer: default_transfer(),
            options: PlanOptions::default(),
            pieces: Vec::new(),
            exchange_s: 0.0,
            decode_pace_s: 0.0,
            decode_pace_spread_s: 0.0,
            late_pieces: false,
            late_due_s: 0.0,
        };
        let p = plan_step(Policy::Helix, 0, &input, plan::Scope::Every).unwrap();
        assert!(p.step_s() < 0.02, "the prior predicts {} s", p.step_s());
        let fitted = AccelModel { c0: 1.0, a: 5e-4, b: 0.0 };
        let mut accel = p.accel_under(&fitted);
        accel.sort_by(f64::total_cmp);
        assert_eq!(accel.len(), 2);
        assert!((accel[0] - 1.5).abs() < 1e-9 && (accel[1] - 2.5).abs() < 1e-9, "{accel:?}");
        assert!((p.step_under(&fitted) - 2.5).abs() < 1e-9);
        // Two such steps ahead of a batch: due in 5 s, not in the prior's 0.02 s.
        let due = time_to_deadline(0, 2, |_| Some(p.step_under(&fitted)), None);
        assert!((due - 5.0).abs() < 1e-9);
    }
}
