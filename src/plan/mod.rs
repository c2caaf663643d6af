//! The planner: a pure, deterministic function from [`PlanInput`] to [`Plan`], run identically on
//! every rank (no coordinator). It decides, for the next `L` steps' global batches:
//!
//! 1. **batching** ([`batching`]): which rank trains each sample — the split that minimises the
//!    largest predicted accelerator time under memory caps (LPT + local search);
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
mod input;
pub mod placement;
pub mod rebalance;
pub mod record;
pub mod synthetic;

pub use input::{Batching, PlanInput, PlanOptions, RankState, SampleIn, TransferCost};

use serde::Serialize;

/// Seconds to integer nanoseconds (saturating; negative times allowed for deadlines).
pub fn ns(seconds: f64) -> i64 {
    if seconds.is_nan() {
        return 0;
    }
    (seconds * 1e9).round().clamp(i64::MIN as f64, i64::MAX as f64) as i64
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

/// A plan: owner and decoder of every sample, decode order per rank, and its predictions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Plan {
    /// The first planned step.
    pub first_step: u64,
    /// Per input sample: the rank that trains it.
    pub owner: Vec<u32>,
    /// Per input sample: the rank that decodes it.
    pub decoder: Vec<u32>,
    /// Per rank: input-sample indices in the order its decode workers take them.
    pub decode_order: Vec<Vec<u32>>,
    /// Per (step, rank), step-major.
    pub batches: Vec<BatchPrediction>,
    /// Lower bound of the first step's largest accelerator time: `c0 + max(work/R, largest)`.
    pub lower_bound_s: f64,
    /// First step: largest sample work of a rank over the lower bound's (1.0 is optimal).
    pub imbalance: f64,
    /// Batches predicted to miss their deadline.
    pub predicted_misses: u64,
    /// Total predicted lateness, seconds.
    pub lateness_s: f64,
    /// Bytes of decoded tensors the placement sends between ranks.
    pub bytes_moved: u64,
    /// Samples decoded away from their owner.
    pub offloads: u32,
    /// Owner swaps made by the joint placement.
    pub swaps: u32,
    /// Samples placed on a rank beyond its memory cap (no rank had room).
    pub cap_violations: u32,
    /// FNV-1a 64 of the decisions (owners, decoders, orders).
    pub hash: u64,
}

impl Plan {
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
    /// Feeds a u64 (little-endian).
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// The hash.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// Makes the plan. Pure: the same input gives the same plan, bit for bit.
pub fn plan(input: &PlanInput) -> Result<Plan, PlanError> {
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

    // 1. Batching, one step at a time.
    let mut owner = vec![0u32; n];
    let mut cap_violations = 0u32;
    let mut first_lb = 0u64;
    for k in 0..steps {
        let idx: Vec<usize> = (0..n).filter(|&i| input.samples[i].step as usize == k).collect();
        let w: Vec<u64> = idx.iter().map(|&i| weight[i]).collect();
        let m: Vec<u64> = idx.iter().map(|&i| mem[i]).collect();
        let id: Vec<u64> = idx.iter().map(|&i| ids[i]).collect();
        let items = batching::Items { weight: &w, mem: &m, id: &id };
        let split = match input.options.batching {
            Batching::Strided => batching::strided(idx.len(), r),
            Batching::Lpt => batching::lpt(&items, r, &caps),
            Batching::LptLocalSearch => {
                let mut o = batching::lpt(&items, r, &caps);
                batching::local_search(&items, &caps, &mut o, r, input.options.local_search_rounds);
                o
            }
            Batching::KarmarkarKarp => batching::karmarkar_karp(&items, r),
        };
        let mut used = vec![0u64; r];
        for (j, &i) in idx.iter().enumerate() {
            owner[i] = split[j];
            used[split[j] as usize] += mem[i];
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
        accel[owner[i] as usize * steps + input.samples[i].step as usize] += weight[i] as i64;
    }
    let mut deadline = vec![0i64; r * steps];
    let mut common = i64::MIN;
    for k in 0..steps {
        let mut next = i64::MIN;
        for q in 0..r {
            let d = if k == 0 { ns(input.ranks[q].accel_free_s) } else { common };
            deadline[q * steps + k] = d;
            next = next.max(d + c0 as i64 + accel[q * steps + k]);
        }
        common = next;
    }
    let max_load_ns: Vec<i64> =
        (0..steps).map(|k| (0..r).map(|q| accel[q * steps + k]).max().unwrap_or(0)).collect();
    let problem = placement::Problem {
        steps,
        step: input.samples.iter().map(|s| s.step).collect(),
        owner,
        accel_ns: weight.iter().map(|&w| w as i64).collect(),
        max_load_ns,
        decode_ns: input.samples.iter().map(|s| ns(s.decode_s)).collect(),
        transfer_ns: input.samples.iter().map(|s| ns(input.transfer.seconds(s.bytes))).collect(),
        bytes: mem.clone(),
        mem_cap: caps.clone(),
        id: ids.clone(),
        workers: input.ranks.iter().map(|s| s.workers).collect(),
        backlog_ns: input.ranks.iter().map(|s| ns(s.queued_cpu_s / s.workers.max(1) as f64)).collect(),
        deadline_ns: deadline.clone(),
        tolerance_ns: ns(input.options.miss_tolerance_s),
    };
    let o = &input.options;
    let search = placement::Search {
        offload: o.placement,
        swap_owners: o.placement && o.swap_owners,
        max_moves: o.placement_moves,
        helpers: o.helpers_per_move,
    };
    let placed = placement::place(&problem, search);
    let owner = placed.owner.clone();
    // Owner swaps keep every rank within the step's largest load; recompute the loads they moved.
    let mut accel = vec![0i64; r * steps];
    for i in 0..n {
        accel[owner[i] as usize * steps + input.samples[i].step as usize] += weight[i] as i64;
    }
    let first_max = (0..r).map(|q| accel[q * steps] as u64).max().unwrap_or(0);

    let mut counts = vec![(0u32, 0u64); r * steps];
    for i in 0..n {
        let c = &mut counts[owner[i] as usize * steps + input.samples[i].step as usize];
        c.0 += 1;
        c.1 += mem[i];
    }
    let mut batches = Vec::with_capacity(r * steps);
    for k in 0..steps {
        for q in 0..r {
            let (count, bytes) = counts[q * steps + k];
            batches.push(BatchPrediction {
                step: input.first_step + k as u64,
                rank: q as u32,
                samples: count,
                accel_s: secs(c0 as i64 + accel[q * steps + k]),
                deadline_s: secs(deadline[q * steps + k]),
                ready_s: secs(placed.ready_ns[q * steps + k]),
                bytes,
            });
        }
    }
    let mut h = Fnv::default();
    h.u64(input.first_step).u64(r as u64).u64(n as u64);
    for i in 0..n {
        h.u64(ids[i]).u64(owner[i] as u64).u64(placed.decoder[i] as u64);
    }
    for order in &placed.order {
        h.u64(order.len() as u64);
        for &i in order {
            h.u64(i as u64);
        }
    }
    Ok(Plan {
        first_step: input.first_step,
        owner,
        decoder: placed.decoder,
        decode_order: placed.order,
        batches,
        lower_bound_s: secs((c0 + first_lb) as i64),
        imbalance: if first_lb == 0 { 1.0 } else { first_max as f64 / first_lb as f64 },
        predicted_misses: placed.misses,
        lateness_s: secs(placed.lateness_ns),
        bytes_moved: placed.bytes_moved,
        offloads: placed.offloads,
        swaps: placed.swaps,
        cap_violations,
        hash: h.finish(),
    })
}
