//! Placement in groups: from [`GROUPS_FROM_RANKS`] ranks, decode work is placed within groups of
//! ranks — the nodes, when the transfer model names them, else [`GROUP_RANKS`] consecutive ranks —
//! so that a rank plans the batching of every rank but the placement of its own group only.
//!
//! The batching (which rank trains each sample) stays global: every rank needs it to predict the
//! step, and the after-decode gate reads it. Placement is most of a plan's time at thousands of
//! ranks (spreading and laying out ~200k pieces, simulating every pool), and a group's placement
//! depends only on the global batching and its own ranks: its jobs are the samples its ranks
//! train, its helpers its own ranks. So a rank that places only its own group makes the same
//! decisions for that group as one that places them all ([`Scope::Every`], the simulator), and
//! nothing of another group reaches it: no tensor crosses between groups before the batch is
//! collected. Owner swaps are off in groups (an owner must be the same on every rank).
//!
//! ```
//! use datahelix::plan::{groups::{Groups, Scope}, plan_scoped};
//! use datahelix::plan::synthetic::{synthetic, Kind};
//!
//! let mut input = synthetic(Kind::HeavyTail, 128, 16, 1, 7);
//! input.options.group_ranks = 4; // automatic: none below 1024 ranks, then nodes or 8 ranks
//! let groups = Groups::of(&input).unwrap();
//! assert_eq!(groups.members[1], vec![4, 5, 6, 7]);
//! let every = plan_scoped(&input, Scope::Every).unwrap().plan;
//! let mine = plan_scoped(&input, Scope::GroupOf(5)).unwrap().plan;
//! assert_eq!(every.owner, mine.owner); // the batching is global
//! assert_eq!(every.hash, mine.hash); // and so is what the hash covers
//! for (j, job) in mine.jobs.iter().enumerate() {
//!     let owner = mine.owner[job.sample as usize];
//!     if groups.of[owner as usize] == 1 {
//!         assert_eq!(every.decoder[j], mine.decoder[j]); // group 1's placement, either way
//!         assert_eq!(groups.of[every.decoder[j] as usize], 1); // decoded in the group
//!     } else {
//!         assert_eq!(mine.decoder[j], owner); // another group's: not planned here
//!     }
//! }
//! assert_eq!(every.decode_order[5], mine.decode_order[5]);
//! assert!(mine.decode_order[0].is_empty());
//! ```

use std::time::Instant;

use super::input::PlanInput;
use super::placement::{self, Placement, Problem, Search};

/// Plans of this many ranks or more place decode work in groups.
pub const GROUPS_FROM_RANKS: usize = 1024;

/// Ranks in a group when the transfer model names no nodes.
pub const GROUP_RANKS: usize = 8;

/// Which groups' placements a plan computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every group's: the whole plan (the simulator, tools, and plans below
    /// [`GROUPS_FROM_RANKS`] ranks, which have no groups).
    Every,
    /// Only the group of this rank (a loader's rank): other groups' jobs are left decoded by
    /// their owners, other ranks' decode orders empty.
    GroupOf(u32),
}

/// The planning groups of a plan's ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Groups {
    /// Per group: its ranks, ascending.
    pub members: Vec<Vec<u32>>,
    /// Per rank: its group.
    pub of: Vec<u32>,
}

impl Groups {
    /// The groups of `input`'s ranks (`PlanOptions::group_ranks`); `None` where there are
    /// none: below [`GROUPS_FROM_RANKS`] ranks unless the options ask for groups.
    pub fn of(input: &PlanInput) -> Option<Groups> {
        let r = input.ranks.len();
        let size = input.options.group_ranks as usize;
        let of: Vec<u32> = if size > 0 {
            (0..r).map(|q| (q / size) as u32).collect()
        } else if r < GROUPS_FROM_RANKS {
            return None;
        } else if input.transfer.has_classes() {
            input.transfer.node_of.clone()
        } else {
            (0..r).map(|q| (q / GROUP_RANKS) as u32).collect()
        };
        let count = of.iter().max().map_or(0, |&g| g as usize + 1);
        let mut members = vec![Vec::new(); count];
        for (q, &g) in of.iter().enumerate() {
            members[g as usize].push(q as u32);
        }
        Some(Groups { members, of })
    }
}

/// Everything of a plan's decode jobs that placement reads, for the whole plan; a
/// [`placement::Problem`] is cut from it for any set of ranks and their jobs.
pub(super) struct Jobs<'a> {
    pub input: &'a PlanInput,
    pub steps: usize,
    /// Per job: planned step, owner, accelerator ns, decode ns, bytes, id, pinned.
    pub step: Vec<u32>,
    pub owner: Vec<u32>,
    pub accel_ns: Vec<i64>,
    pub decode_ns: Vec<i64>,
    pub bytes: Vec<u64>,
    pub id: Vec<u64>,
    pub pinned: Vec<bool>,
    /// Per step: the largest accelerator load of a rank.
    pub max_load_ns: Vec<i64>,
    /// Per rank and step (`q * steps + k`): deadline, last exchange, guard.
    pub deadline_ns: Vec<i64>,
    pub exchange_ns: Vec<i64>,
    pub guard_ns: Vec<i64>,
    pub tolerance_ns: i64,
    /// Per rank: left waiting by the first step ([`crate::plan::Plan::late_ranks`]; empty: none).
    pub late: Vec<bool>,
}

impl Jobs<'_> {
    /// The placement problem of `ranks` (local rank `i` is `ranks[i]`) and `jobs`, whose owners
    /// must be among `ranks`; `local_of[q]` is rank `q`'s index in `ranks`. With `links`, the
    /// transfer model's node table and far links are kept (the whole plan); a group is one node.
    fn problem(&self, ranks: &[u32], local_of: &[u32], jobs: &[u32], links: bool) -> Problem {
        let input = self.input;
        let t = &input.transfer;
        let per_batch = |v: &[i64]| -> Vec<i64> {
            let mut out = Vec::with_capacity(ranks.len() * self.steps);
            for &q in ranks {
                let q = q as usize;
                out.extend_from_slice(&v[q * self.steps..(q + 1) * self.steps]);
            }
            out
        };
        let of_jobs = |f: &dyn Fn(usize) -> i64| jobs.iter().map(|&j| f(j as usize)).collect::<Vec<i64>>();
        let classes = links && t.has_classes();
        Problem {
            steps: self.steps,
            step: jobs.iter().map(|&j| self.step[j as usize]).collect(),
            owner: jobs.iter().map(|&j| local_of[self.owner[j as usize] as usize]).collect(),
            accel_ns: of_jobs(&|j| self.accel_ns[j]),
            max_load_ns: self.max_load_ns.clone(),
            decode_ns: of_jobs(&|j| self.decode_ns[j]),
            transfer_ns: of_jobs(&|j| super::ns(t.seconds_near(self.bytes[j]))),
            transfer_far_ns: if classes {
                of_jobs(&|j| super::ns(t.seconds(self.bytes[j])))
            } else {
                Vec::new()
            },
            node: if classes { t.node_of.clone() } else { Vec::new() },
            bytes: jobs.iter().map(|&j| self.bytes[j as usize]).collect(),
            mem_cap: ranks.iter().map(|&q| input.ranks[q as usize].mem_cap).collect(),
            id: jobs.iter().map(|&j| self.id[j as usize]).collect(),
            pinned: jobs.iter().map(|&j| self.pinned[j as usize]).collect(),
            workers: ranks.iter().map(|&q| input.ranks[q as usize].workers).collect(),
            backlog_ns: ranks
                .iter()
                .map(|&q| {
                    let s = &input.ranks[q as usize];
                    super::ns(s.queued_cpu_s / s.workers.max(1) as f64)
                })
                .collect(),
            late: if self.late.is_empty() {
                Vec::new()
            } else {
                ranks.iter().map(|&q| self.late[q as usize]).collect()
            },
            deadline_ns: per_batch(&self.deadline_ns),
            exchange_ns: per_batch(&self.exchange_ns),
            tolerance_ns: self.tolerance_ns,
            guard_ns: per_batch(&self.guard_ns),
        }
    }

    /// The placement of every job over every rank, as one problem.
    pub fn place_flat(&self, search: Search) -> Placement {
        let r = self.input.ranks.len();
        let ranks: Vec<u32> = (0..r as u32).collect();
        let jobs: Vec<u32> = (0..self.owner.len() as u32).collect();
        placement::place(&self.problem(&ranks, &ranks, &jobs, true), search)
    }

    /// The placement of `scope`'s groups, each its own problem, merged into one of the whole plan
    /// (see the module docs); and what the groups' placements took.
    pub fn place_grouped(&self, groups: &Groups, scope: Scope, search: Search) -> (Placement, GroupTiming) {
        let r = self.input.ranks.len();
        let steps = self.steps;
        let n_jobs = self.owner.len();
        let mut local_of = vec![0u32; r];
        for m in &groups.members {
            for (i, &q) in m.iter().enumerate() {
                local_of[q as usize] = i as u32;
            }
        }
        let wanted: Vec<usize> = match scope {
            Scope::Every => (0..groups.members.len()).collect(),
            Scope::GroupOf(q) => vec![groups.of[q as usize] as usize],
        };
        // Jobs by group, in job order (a counting sort over the owners' groups).
        let mut start = vec![0usize; groups.members.len() + 1];
        for &o in &self.owner {
            start[groups.of[o as usize] as usize + 1] += 1;
        }
        for g in 0..groups.members.len() {
            start[g + 1] += start[g];
        }
        let mut fill = start.clone();
        let mut by_group = vec![0u32; n_jobs];
        for (j, &o) in self.owner.iter().enumerate() {
            let g = groups.of[o as usize] as usize;
            by_group[fill[g]] = j as u32;
            fill[g] += 1;
        }
        let mut out = Placement {
            owner: self.owner.clone(),
            decoder: self.owner.clone(),
            order: vec![Vec::new(); r],
            arrival_ns: vec![0; n_jobs],
            ready_ns: vec![0; r * steps],
            misses: 0,
            lateness_ns: 0,
            delay_ns: 0,
            bytes_moved: 0,
            offloads: 0,
            swaps: 0,
        };
        let search = Search { swap_owners: false, ..search };
        let mut timing = GroupTiming { groups: wanted.len() as u32, ..GroupTiming::default() };
        let mut placed_ranks: Vec<usize> = Vec::new();
        for g in wanted {
            let clock = Instant::now();
            let ranks = &groups.members[g];
            let jobs = &by_group[start[g]..start[g + 1]];
            let placed = placement::place(&self.problem(ranks, &local_of, jobs, false), search);
            for (i, &j) in jobs.iter().enumerate() {
                out.decoder[j as usize] = ranks[placed.decoder[i] as usize];
                out.arrival_ns[j as usize] = placed.arrival_ns[i];
            }
            for (i, &q) in ranks.iter().enumerate() {
                let q = q as usize;
                placed_ranks.push(q);
                out.order[q] = placed.order[i].iter().map(|&j| jobs[j as usize]).collect();
                out.ready_ns[q * steps..(q + 1) * steps]
                    .copy_from_slice(&placed.ready_ns[i * steps..(i + 1) * steps]);
            }
            out.misses += placed.misses;
            out.lateness_ns += placed.lateness_ns;
            out.bytes_moved += placed.bytes_moved;
            out.offloads += placed.offloads;
            let took = clock.elapsed().as_secs_f64();
            timing.total_s += took;
            timing.slowest_s = timing.slowest_s.max(took);
        }
        // A synchronous step waits for its latest batch, whichever group holds it.
        for k in 0..steps {
            let late = placed_ranks
                .iter()
                .map(|&q| out.ready_ns[q * steps + k] - self.deadline_ns[q * steps + k])
                .max()
                .unwrap_or(0);
            out.delay_ns += late.max(0);
        }
        (out, timing)
    }
}

/// What placing the groups took (measured, never read by a decision).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GroupTiming {
    /// Groups placed.
    pub groups: u32,
    /// Seconds of all of them.
    pub total_s: f64,
    /// Seconds of the slowest one: what a rank that places only its own group spends at most.
    pub slowest_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::synthetic::{synthetic, Kind};
    use crate::plan::{plan, plan_scoped, Plan, TransferCost};

    /// Every job decoded in its owner's group, and in exactly one rank's order.
    fn assert_placed_within(p: &Plan, g: &Groups) {
        for (j, job) in p.jobs.iter().enumerate() {
            let owner = p.owner[job.sample as usize] as usize;
            assert_eq!(g.of[p.decoder[j] as usize], g.of[owner], "job {j} left its group");
        }
        let mut all: Vec<u32> = p.decode_order.concat();
        all.sort_unstable();
        assert_eq!(all, (0..p.jobs.len() as u32).collect::<Vec<_>>());
    }

    #[test]
    fn from_1024_ranks_decode_work_is_placed_within_groups_of_eight_or_within_nodes() {
        assert!(Groups::of(&synthetic(Kind::HeavyTail, 2 * 1023, 1023, 1, 3)).is_none());
        let input = synthetic(Kind::HeavyTail, 2 * 1024, 1024, 1, 3);
        let eights = Groups::of(&input).expect("groups from 1024 ranks");
        assert_eq!(eights.members.len(), 128);
        assert_eq!(eights.members[127], (1016..1024).collect::<Vec<u32>>());
        let p = plan(&input).unwrap();
        assert_eq!(p.groups, 128);
        assert!(p.offloads > 0, "the heavy tail moves decode work: {} offloads", p.offloads);
        assert_placed_within(&p, &eights);

        // Nodes named by the transfer model are the groups, however their ranks interleave.
        let node_of: Vec<u32> = (0..1024u32).map(|q| q % 64).collect();
        let near = TransferCost::linear(20e-6, 5e9);
        let far = TransferCost::linear(50e-6, 1e9);
        let by_node = PlanInput { transfer: TransferCost::per_node(&near, &far, node_of), ..input };
        let nodes = Groups::of(&by_node).unwrap();
        assert_eq!(nodes.members.len(), 64);
        assert_eq!(nodes.members[3][..3], [3, 67, 131]);
        let p = plan(&by_node).unwrap();
        assert!(p.offloads > 0);
        assert_placed_within(&p, &nodes);
    }

    #[test]
    fn a_rank_that_places_only_its_group_decides_for_it_what_the_whole_plan_does() {
        let mut input = synthetic(Kind::Bimodal, 192, 24, 1, 5);
        input.options.group_ranks = 8;
        let every = plan_scoped(&input, Scope::Every).unwrap();
        assert_eq!(every.timing.unwrap().groups, 3);
        let g = Groups::of(&input).unwrap();
        assert_placed_within(&every.plan, &g);
        for rank in [0u32, 11, 23] {
            let mine = plan_scoped(&input, Scope::GroupOf(rank)).unwrap();
            assert_eq!(mine.timing.unwrap().groups, 1);
            let (p, group) = (&mine.plan, g.of[rank as usize]);
            assert_eq!((p.hash, &p.owner, &p.jobs), (every.plan.hash, &every.plan.owner, &every.plan.jobs));
            for q in 0..24 {
                let own = g.of[q] == group;
                assert_eq!(
                    p.decode_order[q] == every.plan.decode_order[q],
                    own || every.plan.decode_order[q].is_empty()
                );
                let at = |plan: &Plan| plan.batches.iter().find(|b| b.rank == q as u32).unwrap().ready_s;
                if own {
                    assert_eq!(at(p), at(&every.plan), "rank {q}'s batch readiness");
                }
            }
            for (j, job) in p.jobs.iter().enumerate() {
                let owner = p.owner[job.sample as usize];
                let expect = if g.of[owner as usize] == group { every.plan.decoder[j] } else { owner };
                assert_eq!(p.decoder[j], expect, "job {j}");
            }
        }
        // Placing in groups swaps no owner (every rank must know every owner alike).
        assert_eq!(every.plan.swaps, 0);
    }
}
