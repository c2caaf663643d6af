//! The planner: a pure, deterministic function from [`PlanInput`] to [`Plan`], run identically on
//! every rank (no coordinator). It decides, for the next `L` steps' global batches:
//!
//! 1. **batching** ([`batching`]): which rank trains each sample — the split that minimises the
//!    largest predicted accelerator time under memory caps ([`batching::balanced`]: LPT, pairwise
//!    passes from 1024 ranks, a local search);
//! 2. **placement** ([`placement`]): which rank decodes each sample and in what order — each pool
//!    earliest-deadline-first, samples of late batches moved to ranks with slack when their
//!    tensor then arrives in time;
//!
//! and, once decoded sizes are known, 3. whether a **rebalance** of decoded tensors pays for its
//! transfer ([`rebalance`]).
//!
//! ```
//! use datahelix::plan::{plan, synthetic::{synthetic, Kind}};
//!
//! let input = synthetic(Kind::HeavyTail, 64, 8, 1, 7);
//! let a = plan(&input).unwrap();
//! let b = plan(&input.clone()).unwrap();
//! assert_eq!(a.hash, b.hash); // same inputs ⇒ same plan, on every rank
//! assert!(a.imbalance <= 1.10);
//! assert_eq!(a.owner.len(), 64);
//! ```
//!
//! Determinism: every time and weight is converted once to integer nanoseconds, sums are integer,
//! no hash map is iterated, and every tie is broken by sample id then index. The plan's
//! [`Plan::hash`] is cheap to compute; a `--check-plan` run all-reduces it each step.

pub mod batching;
pub mod groups;
mod input;
pub mod late;
pub mod packed;
pub mod placement;
pub mod rebalance;
pub mod record;
pub mod synthetic;

pub use groups::{GroupTiming, Scope};
pub use input::{Batching, PieceIn, PlanInput, PlanOptions, RankState, SampleIn, TransferCost};
pub use late::LATE_BELOW_PACE;

use serde::Serialize;

/// Seconds to integer nanoseconds, rounded half away from zero (saturating; negative times
/// allowed for deadlines; NaN is 0).
///
/// ```
/// use datahelix::plan::ns;
///
/// assert_eq!((ns(1.5e-9), ns(-2.5e-9), ns(0.25)), (2, -3, 250_000_000));
/// assert_eq!((ns(f64::INFINITY), ns(f64::NAN)), (i64::MAX, 0));
/// ```
pub fn ns(seconds: f64) -> i64 {
    let x = seconds * 1e9;
    if x.abs() < (1u64 << 52) as f64 {
        // `f64::round` without its library call (a tenth of a plan's own time at 127k samples):
        // below 2⁵² the truncation and the remainder are exact.
        let t = x as i64;
        let rest = x - t as f64;
        return t + (rest >= 0.5) as i64 - (rest <= -0.5) as i64;
    }
    if x.is_nan() {
        return 0;
    }
    x.round().clamp(i64::MIN as f64, i64::MAX as f64) as i64
}

fn secs(ns: i64) -> f64 {
    ns as f64 * 1e-9
}

/// The prediction for one rank's batch of one planned step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct BatchPrediction {
    /// Planned step (absolute).
    pub step: u64,
    /// Rank.
    pub rank: u32,
    /// Samples it trains.
    pub samples: u32,
    /// Predicted accelerator seconds (`c0 + Σ a·tok + b·tok²`).
    pub accel_s: f64,
    /// Its deadline, seconds from now.
    pub deadline_s: f64,
    /// When its last tensor is predicted in hand, seconds from now.
    pub ready_s: f64,
    /// Decoded bytes it holds.
    pub bytes: u64,
}

/// One unit of decode work: a whole sample or one piece of a split one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DecodeJob {
    /// Index of the sample in the input.
    pub sample: u32,
    /// Which piece (0 for a whole sample).
    pub part: u32,
}

/// A plan: owner and decoder of every sample, decode order per rank, and its predictions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The first planned step.
    pub first_step: u64,
    /// Per input sample: the rank that trains it.
    pub owner: Vec<u32>,
    /// Per decode job (see [`Plan::jobs`]): the rank that decodes it.
    pub decoder: Vec<u32>,
    /// Per decode job: the sample and piece it decodes. Jobs `0..n` are the input samples (a
    /// split sample's first piece); the further pieces of split samples follow, in input order.
    /// Without pieces there is one job per sample and job `i` is sample `i`.
    pub jobs: Vec<DecodeJob>,
    /// Per rank: decode-job indices in the order its decode workers take them.
    pub decode_order: Vec<Vec<u32>>,
    /// Per (step, rank), step-major.
    pub batches: Vec<BatchPrediction>,
    /// Lower bound of the first step's largest accelerator time: `c0 + max(work/R, largest)`.
    pub lower_bound_s: f64,
    /// First step: largest sample work of a rank over the lower bound's (1.0 is optimal).
    pub imbalance: f64,
    /// First step: the accelerator seconds its most loaded rank was stretched towards, past the
    /// CPUs' pace ([`PlanInput::decode_pace_s`], [`batching::stretch`]); 0 when the step was not
    /// decode-bound (or the plan places no decode work).
    pub stretch_s: f64,
    /// First step, where some rank must wait for its input whatever the schedule and
    /// [`PlanInput::late_pieces`] allows: the ranks left waiting, ascending — the last ones, of
    /// each placement group where there are groups ([`late`]: samples whose decode chains
    /// outlast their deadline, grouped on as few ranks
    /// as a step no longer than the balanced one allows; or the one rank given the stretched
    /// batch of a step the CPUs cannot keep up with). The pieces decoded for them that are not ready at collection reach
    /// them in one more exchange after, so that the other ranks' batches are ready when they
    /// come back from the gradient sync (`crate::step`, "A late rank"). Empty: none.
    pub late_ranks: Vec<u32>,
    /// Whether the late ranks' decode jobs queue behind the next step's on every rank (the
    /// CPUs' case: the other ranks' next batches are due first); chains start at once.
    pub late_jobs_behind: bool,
    /// Batches predicted to miss their deadline.
    pub predicted_misses: u64,
    /// Total predicted lateness, seconds.
    pub lateness_s: f64,
    /// Predicted delay: the sum over steps of the latest batch's lateness, seconds.
    pub delay_s: f64,
    /// Bytes of decoded tensors the placement sends between ranks.
    pub bytes_moved: u64,
    /// Samples decoded away from their owner.
    pub offloads: u32,
    /// Owner swaps made by the joint placement.
    pub swaps: u32,
    /// Samples placed on a rank beyond its memory cap (no rank had room).
    pub cap_violations: u32,
    /// Planning groups the decode work was placed in ([`groups`]; 0: placed over every rank at
    /// once). With groups, a plan made for one group ([`Scope::GroupOf`]) leaves the other
    /// groups' jobs on their owners, and their predicted misses, lateness, readiness and bytes
    /// out.
    pub groups: u32,
    /// FNV-1a 64, word by word ([`Fnv::word`]), of the decisions (owners, decoders, orders;
    /// with groups, the owners and jobs only, which every rank decides alike).
    pub hash: u64,
}

impl Plan {
    /// Whether `rank` is one of the first step's late ranks ([`Plan::late_ranks`]).
    pub fn is_late(&self, rank: usize) -> bool {
        self.late_ranks.binary_search(&(rank as u32)).is_ok()
    }

    /// Predicted accelerator seconds per rank of the first planned step.
    pub fn first_step_loads(&self) -> Vec<f64> {
        self.batches.iter().filter(|b| b.step == self.first_step).map(|b| b.accel_s).collect()
    }
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot plan: {0}")]
pub struct PlanError(pub String);

/// FNV-1a 64 accumulator for plan hashes.
#[derive(Clone, Copy, Debug)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Feeds bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self
    }
    /// Feeds a u64 (little-endian), byte by byte.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// Feeds a u64 as one word, `h = (h ^ v) · p`: an eighth of [`Fnv::u64`]'s multiplications,
    /// for the plan's hash of hundreds of thousands of decisions (bytewise, hashing them cost
    /// ~10 ms of a plan at 4096 ranks). Each step is a bijection of the state (the prime is odd),
    /// so one changed word always changes the hash.
    pub fn word(&mut self, v: u64) -> &mut Self {
        self.0 = (self.0 ^ v).wrapping_mul(0x0000_0100_0000_01b3);
        self
    }
    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// Makes the plan. Pure: the same input gives the same plan, bit for bit.
pub fn plan(input: &PlanInput) -> Result<Plan, PlanError> {
    plan_scoped(input, Scope::Every).map(|p| p.plan)
}

/// A plan and, where it placed decode work in groups ([`groups`]), what the groups took.
#[derive(Clone, Debug)]
pub struct Planning {
    /// The plan.
    pub plan: Plan,
    /// What placing the groups took; `None` for a plan without groups.
    pub timing: Option<GroupTiming>,
}

/// [`plan`] of only `scope`'s groups' placements (see [`groups`]): what a rank of a loader
/// needs at thousands of ranks. Below [`groups::GROUPS_FROM_RANKS`] ranks, the whole plan.
pub fn plan_scoped(input: &PlanInput, scope: Scope) -> Result<Planning, PlanError> {
    plan_as(input, input.first_step, &input.options, &input.pieces, scope)
}

/// [`plan`] of `input` as a policy plans it: from step `first_step`, with its `options` and
/// `pieces`, without copying the input. `input` is validated with its own options and pieces:
/// `options` must differ from them only in the choice of methods, and `pieces` must be
/// `input.pieces` or none; `scope` as for [`plan_scoped`].
pub(crate) fn plan_as(
    input: &PlanInput,
    first_step: u64,
    options: &PlanOptions,
    pieces: &[PieceIn],
    scope: Scope,
) -> Result<Planning, PlanError> {
    input.validate().map_err(PlanError)?;
    let r = input.ranks.len();
    let steps = input.steps().max(1);
    let n = input.samples.len();
    let weight: Vec<u64> =
        input.samples.iter().map(|s| ns(input.accel.sample_seconds(s.tokens)) as u64).collect();
    let mem: Vec<u64> = input.samples.iter().map(|s| s.bytes).collect();
    let ids: Vec<u64> = input.samples.iter().map(|s| s.id).collect();
    let caps: Vec<u64> = input.ranks.iter().map(|s| s.mem_cap).collect();
    let c0 = ns(input.accel.c0.max(0.0)) as u64;
    // Each sample's step, read once (a sample is 40 bytes: at 127k samples, reading its step
    // where it is used was a pass over 5 MB each time).
    let step_of: Vec<u32> = input.samples.iter().map(|s| s.step).collect();
    // Where a sample's (owner, step) sits in per-rank, per-step tables.
    let at = |owner: u32, i: usize| owner as usize * steps + step_of[i] as usize;

    // 1. Batching, one step at a time.
    let mut owner = vec![0u32; n];
    let mut cap_violations = 0u32;
    let mut first_lb = 0u64;
    let mut stretched = 0u64;
    let mut late_ranks = Vec::new();
    let mut late_jobs_behind = false;
    let grouping = if options.placement { groups::Groups::of(input) } else { None };
    let chain = if input.late_pieces && options.placement { late::chains(input, pieces) } else { Vec::new() };
    for k in 0..steps {
        // One step (the step engine plans one at a time): its samples are all of them.
        let idx: Vec<usize> = if steps == 1 {
            (0..n).collect()
        } else {
            (0..n).filter(|&i| step_of[i] as usize == k).collect()
        };
        let of_step = |all: &[u64]| -> Vec<u64> { idx.iter().map(|&i| all[i]).collect() };
        let copied;
        let items = if steps == 1 {
            batching::Items { weight: &weight, mem: &mem, id: &ids }
        } else {
            copied = [of_step(&weight), of_step(&mem), of_step(&ids)];
            batching::Items { weight: &copied[0], mem: &copied[1], id: &copied[2] }
        };
        let mut split = match options.batching {
            Batching::Strided => batching::strided(idx.len(), r),
            Batching::Lpt => batching::lpt(&items, r, &caps),
            Batching::LptLocalSearch => batching::balanced(&items, r, &caps, options.local_search_rounds),
            Batching::KarmarkarKarp => batching::karmarkar_karp(&items, r),
        };
        let mut used = vec![0u64; r];
        for (j, &i) in idx.iter().enumerate() {
            used[split[j] as usize] += mem[i];
        }
        if options.placement {
            let target = (ns(input.decode_pace_s) - c0 as i64).max(0) as u64;
            let margin_cap = batching::stretch_margin_cap_ns(input.decode_pace_spread_s, r);
            let reached = batching::stretch(&items, &mut split, target, margin_cap, &caps, &mut used);
            if k == 0 && reached > 0 {
                stretched = c0 + reached;
            }
            if k == 0 && input.late_pieces {
                let due = match input.late_due_s {
                    d if d > 0.0 => ns(d),
                    _ => input.ranks.iter().map(|q| ns(q.accel_free_s)).min().unwrap_or(0),
                };
                let release: Vec<i64> = idx.iter().map(|&i| chain[i]).collect();
                let tolerance = ns(options.miss_tolerance_s);
                // In placement groups each group's late samples stay on its own ranks: a group's
                // CPUs decode only what its ranks train.
                let grouped_late = match &grouping {
                    Some(g) => Some(late::group_late_within(
                        &items, &release, due, c0, tolerance, &caps, &mut split, g,
                    ))
                    .filter(|l| !l.is_empty()),
                    None => late::group_late(&items, &release, due, c0, tolerance, &caps, &mut split)
                        .map(|m| (r as u32 - m..r as u32).collect()),
                };
                if let Some(late) = grouped_late {
                    late_ranks = late;
                    used.fill(0);
                    for (j, &i) in idx.iter().enumerate() {
                        used[split[j] as usize] += mem[i];
                    }
                } else if reached > 0 {
                    if let Some(top) = late::falls_short(&items, &split, r, target) {
                        late_ranks = vec![late::as_last_rank(&mut split, &mut used, &caps, top)];
                        late_jobs_behind = true;
                    }
                }
            }
        }
        for (j, &i) in idx.iter().enumerate() {
            owner[i] = split[j];
        }
        cap_violations += (0..r).filter(|&q| caps[q] != 0 && used[q] > caps[q]).count() as u32;
        if k == 0 {
            first_lb = batching::lower_bound(&items, r);
        }
    }

    // 2. Deadlines: step s+1 ends each rank's current window; later steps end when the slowest
    //    rank finishes the step before (synchronous training).
    let mut accel = vec![0i64; r * steps];
    for i in 0..n {
        accel[at(owner[i], i)] += weight[i] as i64;
    }
    //    Tensors decoded elsewhere travel at the exchange before a deadline: the first step's
    //    is the input's `exchange_s`, a later step's the deadline of the step before it.
    let mut deadline = vec![0i64; r * steps];
    let mut exchange = vec![i64::MIN; r * steps];
    let mut common = i64::MIN;
    for k in 0..steps {
        let mut next = i64::MIN;
        for q in 0..r {
            let d = if k == 0 { ns(input.ranks[q].accel_free_s) } else { common };
            deadline[q * steps + k] = d;
            exchange[q * steps + k] = match k {
                0 if input.exchange_s > 0.0 => ns(input.exchange_s).min(d),
                0 => i64::MIN,
                _ => deadline[q * steps + k - 1],
            };
            next = next.max(d + c0 as i64 + accel[q * steps + k]);
        }
        common = next;
    }
    let max_load_ns: Vec<i64> =
        (0..steps).map(|k| (0..r).map(|q| accel[q * steps + k]).max().unwrap_or(0)).collect();
    // Decode jobs: every sample, then the later pieces of split samples. A split sample's
    // accelerator weight stays on its first job; its pieces keep their owner (no swaps).
    let mut jobs: Vec<DecodeJob> = (0..n as u32).map(|i| DecodeJob { sample: i, part: 0 }).collect();
    let mut job_decode: Vec<i64> = input.samples.iter().map(|s| ns(s.decode_s)).collect();
    let mut job_bytes = mem.clone();
    let mut split = vec![false; n];
    let mut part = 0u32;
    for (k, pc) in pieces.iter().enumerate() {
        let i = pc.sample as usize;
        part = if k > 0 && pieces[k - 1].sample == pc.sample { part + 1 } else { 0 };
        split[i] = true;
        if part == 0 {
            job_decode[i] = ns(pc.decode_s);
            job_bytes[i] = pc.bytes;
        } else {
            jobs.push(DecodeJob { sample: pc.sample, part });
            job_decode.push(ns(pc.decode_s));
            job_bytes.push(pc.bytes);
        }
    }
    let jobs_table = groups::Jobs {
        input,
        steps,
        step: jobs.iter().map(|j| step_of[j.sample as usize]).collect(),
        owner: jobs.iter().map(|j| owner[j.sample as usize]).collect(),
        accel_ns: (0..jobs.len()).map(|j| if j < n { weight[j] as i64 } else { 0 }).collect(),
        decode_ns: job_decode,
        bytes: job_bytes,
        id: jobs.iter().map(|j| ids[j.sample as usize]).collect(),
        pinned: jobs.iter().map(|j| split[j.sample as usize]).collect(),
        max_load_ns,
        guard_ns: deadline.iter().map(|&d| (options.guard_share * d as f64).max(0.0) as i64).collect(),
        deadline_ns: deadline,
        exchange_ns: exchange,
        tolerance_ns: ns(options.miss_tolerance_s),
        late: if late_ranks.is_empty() {
            Vec::new()
        } else {
            let mut late = vec![false; r];
            late_ranks.iter().for_each(|&q| late[q as usize] = true);
            late
        },
    };
    let o = options;
    let search = placement::Search {
        offload: o.placement,
        // A swap of owners would take a late sample to a rank the grouping kept on time.
        swap_owners: o.placement && o.swap_owners && (late_ranks.is_empty() || late_jobs_behind),
        max_moves: o.placement_moves,
        helpers: o.helpers_per_move,
    };
    let (placed, timing) = match &grouping {
        Some(g) => {
            let (placed, timing) = jobs_table.place_grouped(g, scope, search);
            (placed, Some(timing))
        }
        None => (jobs_table.place_flat(search), None),
    };
    let deadline = jobs_table.deadline_ns;
    let owner: Vec<u32> = placed.owner[..n].to_vec();
    // Owner swaps keep every rank within the step's largest load; recompute the loads they moved.
    let mut accel = vec![0i64; r * steps];
    for i in 0..n {
        accel[at(owner[i], i)] += weight[i] as i64;
    }
    let first_max = (0..r).map(|q| accel[q * steps] as u64).max().unwrap_or(0);

    let mut counts = vec![(0u32, 0u64); r * steps];
    for i in 0..n {
        let c = &mut counts[at(owner[i], i)];
        c.0 += 1;
        c.1 += mem[i];
    }
    let mut batches = Vec::with_capacity(r * steps);
    for k in 0..steps {
        for q in 0..r {
            let (count, bytes) = counts[q * steps + k];
            batches.push(BatchPrediction {
                step: first_step + k as u64,
                rank: q as u32,
                samples: count,
                accel_s: secs(c0 as i64 + accel[q * steps + k]),
                deadline_s: secs(deadline[q * steps + k]),
                ready_s: secs(placed.ready_ns[q * steps + k]),
                bytes,
            });
        }
    }
    // In groups, a rank knows only its own group's placement: the hash covers what every rank
    // decides alike.
    let placed_everywhere = grouping.is_none();
    let mut h = Fnv::default();
    h.word(first_step).word(r as u64).word(n as u64).word(late_jobs_behind as u64);
    h.word(late_ranks.len() as u64);
    for &q in &late_ranks {
        h.word(q as u64);
    }
    for i in 0..n {
        h.word(ids[i]).word(owner[i] as u64);
        if placed_everywhere {
            h.word(placed.decoder[i] as u64);
        }
    }
    for (j, job) in jobs.iter().enumerate().skip(n) {
        h.word(job.sample as u64).word(job.part as u64);
        if placed_everywhere {
            h.word(placed.decoder[j] as u64);
        }
    }
    if placed_everywhere {
        for order in &placed.order {
            h.word(order.len() as u64);
            for &i in order {
                h.word(i as u64);
            }
        }
    }
    let plan = Plan {
        first_step,
        owner,
        decoder: placed.decoder,
        jobs,
        decode_order: placed.order,
        batches,
        lower_bound_s: secs((c0 + first_lb) as i64),
        imbalance: if first_lb == 0 { 1.0 } else { first_max as f64 / first_lb as f64 },
        stretch_s: secs(stretched as i64),
        late_ranks,
        late_jobs_behind,
        predicted_misses: placed.misses,
        lateness_s: secs(placed.lateness_ns),
        delay_s: secs(placed.delay_ns),
        bytes_moved: placed.bytes_moved,
        offloads: placed.offloads,
        swaps: placed.swaps,
        cap_violations,
        groups: grouping.map_or(0, |g| g.members.len() as u32),
        hash: h.finish(),
    };
    Ok(Planning { plan, timing })
}

#[cfg(test)]
mod tests {
    proptest::proptest! {
        // Half away from zero, saturating, as `f64::round` then a clamp: at every magnitude,
        // at the halves, and past 2⁵² where every float is whole.
        #[test]
        fn ns_rounds_as_f64_round(mantissa in -1.0f64..1.0, exponent in -12i32..12, half in proptest::bool::ANY) {
            let seconds = if half { (mantissa * 1e6).trunc() / 1e9 + 0.5e-9 } else { mantissa * 10f64.powi(exponent) };
            let reference = |s: f64| (s * 1e9).round().clamp(i64::MIN as f64, i64::MAX as f64) as i64;
            proptest::prop_assert_eq!(super::ns(seconds), reference(seconds));
        }
    }

    use super::*;
    use crate::cost::accel::AccelModel;

    /// A sample of the first planned step with a 1 MiB tensor.
    fn step0_sample(id: u64, tokens: u64, decode_s: f64) -> SampleIn {
        SampleIn { id, step: 0, tokens, decode_s, bytes: 1 << 20 }
    }

    /// Four ranks of one worker each; step 0 is due in 2.5 s and holds one sample that takes
    /// 4 s to decode on one worker, plus three light ones.
    fn heavy_step(pieces: Vec<PieceIn>) -> PlanInput {
        let sample = |id: u64, decode_s: f64| step0_sample(id, 1000, decode_s);
        PlanInput {
            first_step: 5,
            samples: vec![sample(1, 4.0), sample(2, 0.1), sample(3, 0.1), sample(4, 0.1)],
            ranks: vec![RankState { workers: 1, accel_free_s: 2.5, queued_cpu_s: 0.0, mem_cap: 0 }; 4],
            accel: AccelModel { c0: 0.5, a: 1e-4, b: 0.0 },
            transfer: TransferCost::linear(20e-6, 5e9),
            options: PlanOptions::default(),
            pieces,
            exchange_s: 0.0,
            decode_pace_s: 0.0,
            decode_pace_spread_s: 0.0,
            late_pieces: false,
            late_due_s: 0.0,
        }
    }

    #[test]
    fn a_step_the_cpus_outlast_is_stretched_past_their_pace() {
        // Eight equal samples over four ranks: 0.7 s of accelerator a rank when balanced.
        let mut input = heavy_step(Vec::new());
        input.samples = (1..=8).map(|id| step0_sample(id, 1000, 0.5)).collect();
        let balanced = plan(&input).unwrap();
        assert_eq!(balanced.stretch_s, 0.0, "no pace given: nothing stretched");
        assert!(balanced.first_step_loads().iter().all(|&a| (a - 0.7).abs() < 1e-9));
        // The CPUs take 1.1 s a step: rank 0 aims at 0.6 + (0.6 - 0.2) / 2 = 0.8 s of samples
        // and takes all it may, the others keeping one each: five samples, 0.5 s.
        input.decode_pace_s = 1.1;
        let stretched = plan(&input).unwrap();
        assert!((stretched.stretch_s - 1.3).abs() < 1e-9, "{}", stretched.stretch_s);
        let loads = stretched.first_step_loads();
        assert!(
            (loads[0] - 1.0).abs() < 1e-9 && loads[1..].iter().all(|&a| (a - 0.6).abs() < 1e-9),
            "{loads:?}"
        );
        // A steady pace (a spread of 0.05 s over 4 ranks) asks for less margin: 0.05 · √4 · √2 / 4.
        input.decode_pace_spread_s = 0.05;
        let steady = plan(&input).unwrap().stretch_s;
        assert!((steady - (1.1 + 0.1 * batching::STRETCH_MARGIN_FACTOR)).abs() < 1e-6, "{steady}");
        input.decode_pace_spread_s = 0.0;
        // A pace the balanced step already covers changes nothing.
        input.decode_pace_s = 0.7;
        assert_eq!(plan(&input).unwrap().owner, balanced.owner);
        // A pace from a caller or a file is checked before it is used.
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            input.decode_pace_s = bad;
            let e = plan(&input).unwrap_err().to_string();
            assert!(e.contains("decode_pace_s"), "{e}");
        }
        input.decode_pace_s = 1.1;
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            input.decode_pace_spread_s = bad;
            let e = plan(&input).unwrap_err().to_string();
            assert!(e.contains("decode_pace_spread_s"), "{e}");
        }
    }

    #[test]
    fn a_step_its_cpus_far_outlast_leaves_the_last_rank_late() {
        let mut input = heavy_step(Vec::new());
        input.samples = (1..=8).map(|id| step0_sample(id, 1000, 0.5)).collect();
        input.late_pieces = true;
        // A pace of 1.1 s: the stretched rank reaches 0.5 s of the 0.6 s it aims at, more than
        // LATE_BELOW_PACE of it: no late rank.
        input.decode_pace_s = 1.1;
        assert!(plan(&input).unwrap().late_ranks.is_empty());
        // 2 s: five samples, 0.5 s, of the 1.5 s — every split leaves some rank waiting. The
        // stretched batch goes to the last rank, which is named late.
        input.decode_pace_s = 2.0;
        let late = plan(&input).unwrap();
        assert_eq!((&late.late_ranks[..], late.late_jobs_behind), (&[3][..], true));
        let loads = late.first_step_loads();
        assert!(
            (loads[3] - 1.0).abs() < 1e-9 && loads[..3].iter().all(|&a| (a - 0.6).abs() < 1e-9),
            "{loads:?}"
        );
        // Without late pieces (a caller whose next call may come after a collective of its
        // own) the same stretch, wherever the split put it, and no late rank.
        input.late_pieces = false;
        let plain = plan(&input).unwrap();
        assert!(plain.late_ranks.is_empty());
        assert!((plain.first_step_loads()[0] - 1.0).abs() < 1e-9, "{:?}", plain.first_step_loads());
        assert_ne!(plain.hash, late.hash);
    }

    #[test]
    fn samples_whose_chains_outlast_the_deadline_wait_on_the_last_ranks() {
        // Sixteen samples over four ranks, due in 2.5 s: the first four decode in runs of
        // 3.02–3.08 s on one worker (no placement makes them in time), the rest in 0.2 s.
        let mut input = heavy_step(Vec::new());
        input.samples = (1..=16)
            .map(|id| step0_sample(id, 1000, if id <= 4 { 3.0 + id as f64 / 50.0 } else { 0.2 }))
            .collect();
        input.ranks.iter_mut().for_each(|q| q.workers = 8);
        // (Owner swaps may group late samples too, by the placement's objective: off here.)
        input.options.swap_owners = false;
        let spread = plan(&input).unwrap();
        let waits = |p: &Plan| (0..4).filter(|&q| (0..4).any(|i| p.owner[i] == q)).count();
        assert!(spread.late_ranks.is_empty(), "without late pieces, balance alone");
        assert!(waits(&spread) > 1, "balanced, the slow samples hold {} ranks", waits(&spread));
        input.late_pieces = true;
        let grouped = plan(&input).unwrap();
        assert_eq!(grouped.late_ranks, vec![3]);
        assert!(!grouped.late_jobs_behind, "chains start at once");
        assert_eq!(waits(&grouped), 1);
        assert!((0..4).all(|i| grouped.owner[i] == 3));
        assert_ne!(grouped.hash, spread.hash);
        assert_eq!(plan(&input).unwrap().hash, grouped.hash);
        // Expected due later (the steps before predicted to wait), the chains are in time.
        input.late_due_s = 4.0;
        assert!(plan(&input).unwrap().late_ranks.is_empty());
        // A due time from a caller or a file is checked before it is used.
        for bad in [f64::NAN, f64::INFINITY, -1.0] {
            input.late_due_s = bad;
            let e = plan(&input).unwrap_err().to_string();
            assert!(e.contains("late_due_s"), "{e}");
        }
    }

    #[test]
    fn in_placement_groups_each_group_keeps_its_samples_and_waits_on_its_own_last_ranks() {
        // Thirty-two samples over eight ranks in two groups of four, due in 2.5 s: eight decode
        // in runs of 3.02-3.16 s, the rest in 0.2 s. Balanced, every rank holds a slow one.
        let mut input = heavy_step(Vec::new());
        input.samples = (1..=32)
            .map(|id| step0_sample(id, 1000, if id <= 8 { 3.0 + id as f64 / 50.0 } else { 0.2 }))
            .collect();
        input.ranks = vec![input.ranks[0]; 8];
        input.ranks.iter_mut().for_each(|q| q.workers = 8);
        input.options.swap_owners = false;
        input.options.group_ranks = 4;
        let group = |q: u32| q / 4;
        let spread = plan(&input).unwrap();
        let holders = |p: &Plan| (0..8).filter(|&q| (0..8).any(|i| p.owner[i] == q)).count();
        assert_eq!(holders(&spread), 8);
        input.late_pieces = true;
        let grouped = plan(&input).unwrap();
        // Each group's slow samples wait on its own last rank; none leaves its group, so no
        // group's CPUs decode more of the step than the balanced split gave them.
        assert_eq!(grouped.late_ranks, vec![3, 7]);
        assert!((0..8).all(|i| grouped.owner[i] == 3 || grouped.owner[i] == 7), "{:?}", &grouped.owner[..8]);
        assert!((0..32).all(|i| group(grouped.owner[i]) == group(spread.owner[i])));
        assert!((0..8u32).all(|q| grouped.owner.contains(&q)), "every rank trains");
        assert_eq!(plan(&input).unwrap().hash, grouped.hash);
        // Without groups the last ranks of the whole step take them: ranks 6 and 7.
        input.options.group_ranks = 0;
        let global = plan(&input).unwrap();
        assert_eq!(global.late_ranks, vec![6, 7]);
        assert_ne!(global.hash, grouped.hash);
    }

    #[test]
    fn pieces_of_a_split_sample_decode_on_different_ranks_and_meet_the_deadline() {
        let whole = plan(&heavy_step(Vec::new())).unwrap();
        assert_eq!(whole.predicted_misses, 1, "4 s of decode cannot finish in 2.5 s on one worker");
        assert_eq!(whole.jobs.len(), 4);

        let half = |sample| PieceIn { sample, decode_s: 2.1, bytes: 1 << 19 };
        let split = plan(&heavy_step(vec![half(0), half(0)])).unwrap();
        assert_eq!(split.jobs.len(), 5);
        assert_eq!(split.jobs[4], DecodeJob { sample: 0, part: 1 });
        assert_eq!(split.predicted_misses, 0, "two 2.1 s pieces on two ranks make it");
        assert_ne!(split.decoder[0], split.decoder[4], "the pieces run in parallel");
        // Every job is in exactly one rank's order.
        let mut all: Vec<u32> = split.decode_order.concat();
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3, 4]);
        assert_ne!(split.hash, whole.hash);
        assert_eq!(plan(&heavy_step(vec![half(0), half(0)])).unwrap().hash, split.hash);
    }

    #[test]
    fn a_tensor_decoded_elsewhere_after_the_last_exchange_arrives_after_the_deadline() {
        // 64 MiB pieces take 13.4 ms to move; each is decoded by 2.1 s, the batch due at 2.5 s.
        let big = |sample| PieceIn { sample, decode_s: 2.1, bytes: 64 << 20 };
        let with = |exchange_s| plan(&PlanInput { exchange_s, ..heavy_step(vec![big(0), big(0)]) }).unwrap();
        let early = with(2.4);
        assert_eq!(early.predicted_misses, 0, "done before the exchange at 2.4 s: in by 2.413 s");
        assert_eq!(early.delay_s, 0.0);
        let late = with(1.0);
        let transfer = TransferCost::linear(20e-6, 5e9).seconds(64 << 20);
        assert_eq!(late.predicted_misses, 1, "sent only when the batch is collected");
        assert!((late.delay_s - transfer).abs() < 1e-6, "late by the transfer: {}", late.delay_s);
    }

    #[test]
    fn an_offload_late_by_its_transfer_stays_on_the_owners_node_when_the_network_is_slow() {
        // LPT gives rank 3 both 1 s decodes against a batch due at 1.5 s: one must move, and
        // with no exchange left it arrives its transfer after the deadline. Rank 2 shares rank
        // 3's node but is busy until 0.3 s; ranks 0 and 1 are idle across a 100 MB/s network.
        let near = TransferCost::linear(20e-6, 5e9);
        let far = TransferCost::linear(50e-6, 1e8);
        let input = |transfer: TransferCost, rank2_busy_s: f64| PlanInput {
            first_step: 0,
            samples: vec![
                step0_sample(1, 3000, 0.1),
                step0_sample(2, 3000, 0.1),
                step0_sample(3, 3000, 0.1),
                step0_sample(4, 1000, 1.0),
                step0_sample(5, 1000, 1.0),
            ],
            ranks: (0..4)
                .map(|r| RankState {
                    workers: 1,
                    accel_free_s: 1.5,
                    queued_cpu_s: if r == 2 { rank2_busy_s } else { 0.0 },
                    mem_cap: 0,
                })
                .collect(),
            accel: AccelModel { c0: 0.5, a: 1e-4, b: 0.0 },
            transfer,
            options: PlanOptions { swap_owners: false, guard_share: 0.0, ..PlanOptions::default() },
            pieces: Vec::new(),
            exchange_s: 0.0,
            decode_pace_s: 0.0,
            decode_pace_spread_s: 0.0,
            late_pieces: false,
            late_due_s: 0.0,
        };
        let node_of = vec![0, 0, 1, 1];
        let aware = plan(&input(TransferCost::per_node(&near, &far, node_of.clone()), 0.3)).unwrap();
        let moved: Vec<usize> = (0..5).filter(|&i| aware.decoder[i] != aware.owner[i]).collect();
        assert_eq!(moved.len(), 1, "one of rank 3's decodes moves: {aware:?}");
        let i = moved[0];
        assert_eq!(aware.owner[i], 3);
        assert_eq!(aware.decoder[i], 2, "to the busy rank on its own node");
        assert_eq!(aware.predicted_misses, 0, "late by 0.2 ms of a node's link: {}", aware.delay_s);
        // With its node-mate busy past the deadline it crosses the network, late by that link.
        let across = plan(&input(TransferCost::per_node(&near, &far, node_of.clone()), 1.5)).unwrap();
        let k = (3..5).find(|&i| across.decoder[i] != across.owner[i]).unwrap();
        assert_eq!(node_of[across.decoder[k] as usize], 0, "{across:?}");
        let late = across.batches.iter().find(|b| b.rank == 3).unwrap();
        assert!((late.ready_s - 1.5 - far.seconds(1 << 20)).abs() < 1e-6, "{across:?}");
        // Told only of the node's links, the planner sends it to the first idle rank instead.
        let blind = plan(&input(near.clone(), 0.3)).unwrap();
        let j = (0..5).find(|&i| blind.decoder[i] != blind.owner[i]).unwrap();
        assert_eq!(node_of[blind.decoder[j] as usize], 0, "{blind:?}");
        assert_ne!(blind.hash, aware.hash);
        // A node table that does not cover the ranks is refused.
        let short = TransferCost::per_node(&near, &far, vec![0, 1]);
        assert!(plan(&input(short, 0.3)).unwrap_err().to_string().contains("node_of names 2 ranks"));
    }

    #[test]
    fn malformed_pieces_are_refused_with_the_sample_named() {
        let one = vec![PieceIn { sample: 0, decode_s: 1.0, bytes: 1 }];
        assert!(plan(&heavy_step(one)).unwrap_err().to_string().contains("sample 1"));
        let apart = vec![
            PieceIn { sample: 0, decode_s: 1.0, bytes: 1 },
            PieceIn { sample: 1, decode_s: 1.0, bytes: 1 },
            PieceIn { sample: 0, decode_s: 1.0, bytes: 1 },
        ];
        assert!(plan(&heavy_step(apart)).is_err());
        let outside = vec![PieceIn { sample: 9, decode_s: 1.0, bytes: 1 }; 2];
        assert!(plan(&heavy_step(outside)).is_err());
    }

    #[test]
    fn a_batch_on_time_by_a_hair_hands_work_to_an_idle_rank_under_a_guard() {
        // LPT gives the three 2000-token samples a rank each and both 1000-token ones to the
        // fourth rank: 2.2 s + 0.25 s of decode against a batch due in 2.5 s — on time by 50 ms.
        let input = |guard_share: f64| PlanInput {
            first_step: 0,
            samples: vec![
                step0_sample(1, 1000, 2.2),
                step0_sample(2, 1000, 0.25),
                step0_sample(3, 2000, 0.1),
                step0_sample(4, 2000, 0.1),
                step0_sample(5, 2000, 0.1),
            ],
            ranks: vec![RankState { workers: 1, accel_free_s: 2.5, queued_cpu_s: 0.0, mem_cap: 0 }; 4],
            accel: AccelModel { c0: 0.5, a: 1e-4, b: 0.0 },
            transfer: TransferCost::linear(20e-6, 5e9),
            options: PlanOptions { guard_share, ..PlanOptions::default() },
            pieces: Vec::new(),
            exchange_s: 2.4,
            decode_pace_s: 0.0,
            decode_pace_spread_s: 0.0,
            late_pieces: false,
            late_due_s: 0.0,
        };
        let bare = plan(&input(0.0)).unwrap();
        assert_eq!(bare.owner[0], bare.owner[1], "batching put both light-token samples on one rank");
        assert_eq!(bare.predicted_misses, 0);
        assert_eq!(bare.decoder[1], bare.decoder[0], "on time, nothing moves without a guard");
        let guarded = plan(&input(0.1)).unwrap();
        assert_eq!(guarded.predicted_misses, 0);
        assert_ne!(
            guarded.decoder[1], guarded.decoder[0],
            "with a 0.25 s guard the short decode leaves the rank busy with the long one"
        );
        let mut bad = input(1.5);
        assert!(plan(&bad).is_err(), "a guard of more than the whole window is refused");
        bad.options.guard_share = f64::NAN;
        assert!(plan(&bad).is_err());
    }

    #[test]
    fn an_idle_rank_helps_though_its_own_batch_waits_for_pieces() {
        // A step of the demo's data (DATAHELIX_PLAN_DUMP): a noisy clip in three pieces of 3.1–
        // 3.7 s for a 3.9 s window; its owner's worker is idle after 1.9 s of backlog. Helpers
        // used to be only ranks whose own batches were on time, which left that worker idle and
        // four batches predicted late.
        let input: PlanInput =
            serde_json::from_str(include_str!("../../tests/fixtures/plan/split-clip-step.json")).unwrap();
        let p = plan(&input).unwrap();
        assert!(p.predicted_misses <= 1, "{} predicted misses", p.predicted_misses);
    }
}
