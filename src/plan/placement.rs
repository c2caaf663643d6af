//! Deadline-aware decode placement: which rank's CPUs decode each job (a sample, or one piece of
//! a sample split at keyframes), and in what order —
//! decided jointly with a last adjustment of which rank trains it.
//!
//! Each rank's workers run earliest-deadline-first (ties: the longer job first, then the id). A
//! batch is late when its last sample arrives after the owner's deadline (the end of its current
//! accelerator window). A tensor decoded on another rank travels at an exchange: the last one
//! before the deadline if it is done by then (its transfer then costs no wait), else when the
//! batch is collected — its transfer after the deadline. Every job starts on its owner, except
//! the pieces of split samples, which start side by side on the ranks that free up first. While
//! a batch is predicted late (or, once none is, at risk), the planner tries, for its
//! last-arriving samples and the ranks whose workers free up first:
//!
//! - **offload**: decode the sample on the other rank and send the tensor (it must then arrive in
//!   time: decoded by the exchange);
//! - **swap owners**: give the sample to the other rank to train, taking back one of the other's
//!   samples of the nearest accelerator weight, when neither rank then exceeds the step's current
//!   largest accelerator load (a decode-heavy sample goes to the rank whose window is longer or
//!   whose CPUs are idle, without unbalancing the accelerators).
//!
//! It keeps the first change that improves the objective, in this order: less step delay (the sum
//! over steps of the latest batch's lateness: a synchronous step waits for its last batch), fewer
//! misses, less total lateness, then less risk — how far the jobs finish inside their batch's
//! guard (`Problem::guard_ns`) before they are due: a plan on time by a hair is late as soon as a
//! prediction runs long, so once no batch is late the search moves work off batches at risk to
//! idle ranks (offloads are only made to improve these, so fewer bytes move). All times are
//! integer nanoseconds: exact and rank-independent.

mod layout;
mod spread;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use layout::Layout;
use spread::spread_pieces;

/// A placement problem: decode jobs with owners, and each rank's workers, backlog and deadlines.
/// ("Sample" below means a job: a whole sample or a piece of one.)
#[derive(Clone, Debug)]
pub struct Problem {
    /// Lookahead steps.
    pub steps: usize,
    /// Per sample: planned step (0-based).
    pub step: Vec<u32>,
    /// Per sample: owner rank (from batching).
    pub owner: Vec<u32>,
    /// Per sample: accelerator nanoseconds (for owner swaps).
    pub accel_ns: Vec<i64>,
    /// Per step: the largest accelerator load of a rank, which owner swaps may not exceed.
    pub max_load_ns: Vec<i64>,
    /// Per sample: decode nanoseconds on one worker.
    pub decode_ns: Vec<i64>,
    /// Per sample: nanoseconds to send its tensor to another rank of its owner's node.
    pub transfer_ns: Vec<i64>,
    /// Per sample: nanoseconds to send its tensor from another node (empty: `transfer_ns`).
    pub transfer_far_ns: Vec<i64>,
    /// Per rank: its node (empty: every rank on one node).
    pub node: Vec<u32>,
    /// Per sample: decoded bytes.
    pub bytes: Vec<u64>,
    /// Per rank: bytes of decoded tensors one step's batch may hold (0: no cap).
    pub mem_cap: Vec<u64>,
    /// Per sample: id (ties).
    pub id: Vec<u64>,
    /// Per job: a piece of a split sample, whose owner no swap may change.
    pub pinned: Vec<bool>,
    /// Per rank: decode workers.
    pub workers: Vec<u32>,
    /// Per rank: when its workers free up from already-queued work.
    pub backlog_ns: Vec<i64>,
    /// Per rank: one the step leaves waiting for its input ([`crate::plan::late`]; empty:
    /// none). The search moves no job of a late rank to another late rank, which would hold its
    /// own batch until the piece is sent. (The starting spread of pieces does not look: keeping
    /// it off the other late ranks cost a pass over the ranks a piece, 45 ms of a 512-rank plan
    /// of the camera originals instead of 11, for 1.5% of their throughput at 8 ranks and
    /// more misses at some budgets; at 64 and 512 ranks 2–3% for as many misses or more. A
    /// late rank given such a piece takes its own pieces only once it has sent it (the `late`
    /// exchange, `crate::step`): traced at 64 ranks, up to 2 s later — `docs/measured.md`,
    /// "What holds helix back at 64 and 512 ranks".)
    pub late: Vec<bool>,
    /// Per rank and step (`r * steps + k`): the batch's deadline.
    pub deadline_ns: Vec<i64>,
    /// Per rank and step: the last exchange of tensors before the deadline (the hand-over of the
    /// step before, while the accelerator runs), `i64::MIN` when there is none. A tensor decoded
    /// elsewhere by then travels off the input-wait path; one decoded later is sent only when
    /// the batch is collected, and arrives its transfer time after the deadline.
    pub exchange_ns: Vec<i64>,
    /// Input wait that counts as a miss.
    pub tolerance_ns: i64,
    /// Per rank and step: the slack its jobs should keep before they are due (their batch's
    /// deadline, or the exchange for a tensor decoded elsewhere); a job finishing with less is
    /// at risk, and the search, once nothing is late, moves work away from such batches.
    pub guard_ns: Vec<i64>,
}

impl Problem {
    /// Whether `owner` and `helper` are two different late ranks ([`Problem::late`]).
    pub(crate) fn late_pair(&self, owner: usize, helper: usize) -> bool {
        owner != helper && self.late.get(owner) == Some(&true) && self.late.get(helper) == Some(&true)
    }
}

/// Bounds of the search.
#[derive(Clone, Copy, Debug)]
pub struct Search {
    /// Offloads allowed.
    pub offload: bool,
    /// Owner swaps allowed.
    pub swap_owners: bool,
    /// Changes kept at most.
    pub max_moves: u32,
    /// Other ranks tried per late batch.
    pub helpers: u32,
}

/// The outcome: owner and decoder per sample, decode order per rank, predicted readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Per sample: the rank that trains it (batching's choice unless swapped).
    pub owner: Vec<u32>,
    /// Per sample: the rank that decodes it.
    pub decoder: Vec<u32>,
    /// Per rank: sample indices in the order its workers take them.
    pub order: Vec<Vec<u32>>,
    /// Per sample: predicted arrival at its owner.
    pub arrival_ns: Vec<i64>,
    /// Per batch (`r * steps + k`): predicted time its last sample arrives (0 when empty).
    pub ready_ns: Vec<i64>,
    /// Predicted misses.
    pub misses: u64,
    /// Total predicted lateness.
    pub lateness_ns: i64,
    /// Sum over steps of the latest batch's lateness: the predicted delay of the run.
    pub delay_ns: i64,
    /// Bytes of tensors sent between ranks.
    pub bytes_moved: u64,
    /// Offloads kept.
    pub offloads: u32,
    /// Owner swaps kept.
    pub swaps: u32,
}

/// The maximum of `n` values kept up to date under single-value changes: a binary tree over
/// them in an array (`O(log n)` per change, `O(1)` for the maximum).
#[derive(Clone, Debug)]
struct MaxTree {
    n: usize,
    node: Vec<i64>,
}

impl MaxTree {
    fn new(n: usize) -> MaxTree {
        MaxTree { n: n.max(1), node: vec![i64::MIN; 2 * n.max(1)] }
    }

    fn set(&mut self, i: usize, v: i64) {
        let mut at = i + self.n;
        self.node[at] = v;
        while at > 1 {
            at /= 2;
            self.node[at] = self.node[2 * at].max(self.node[2 * at + 1]);
        }
    }

    /// The largest value set (every index is set before use).
    fn max(&self) -> i64 {
        self.node[1]
    }
}

/// `(step delay, misses, lateness, risk)` of a set of batches: the steps' delays first — in
/// synchronous training a step starts when its last batch is ready, so what counts is each
/// step's latest batch, summed over the steps concerned — then late batches, then their total
/// lateness, then the risk of their jobs ([`State::risk_of`]).
type Objective = (i64, u64, i64, i64);

#[cfg_attr(test, derive(Clone))]
struct State<'a> {
    p: &'a Problem,
    ranks: usize,
    owner: Vec<u32>,
    decoder: Vec<u32>,
    pools: Vec<Vec<u32>>,
    arrival: Vec<i64>,
    /// Per job: when its decode is predicted to end.
    done: Vec<i64>,
    batch_samples: Vec<Vec<u32>>,
    ready: Vec<i64>,
    /// Per step: its batches' lateness by rank, with their maximum at hand (every leaf is set
    /// in `new`; the tree's root covers all of them whatever the rank count).
    late_by_step: Vec<MaxTree>,
    load: Vec<i64>,
    used: Vec<u64>,
    /// Per batch: its risk ([`State::risk_of`]), kept as the sum of its jobs' shares, which
    /// change only where a pool is simulated again (summing a batch's jobs at every tried move
    /// cost seconds a plan once samples were split in sixteen pieces over thousands of ranks).
    risk: Vec<i64>,
    /// Per job: its share of its batch's risk.
    risk_share: Vec<i64>,
    /// Batches one of whose jobs arrives at another time since the last refresh: only their
    /// readiness can have changed.
    stale: Vec<usize>,
    /// Batches whose readiness changed since the search last looked, with their readiness
    /// before (the search keeps the latest batch at hand from them; an undone move restores it).
    moved: Vec<(usize, i64)>,
    /// What the last [`State::relocate`] changed, to undo it.
    undo: Undo,
    /// Scratch space for [`State::simulate`]'s workers.
    workers_free: Vec<Reverse<(i64, usize)>>,
    /// Per job: its index in the caller's problem, which breaks the last ties (jobs are
    /// renumbered pool by pool, [`Layout`]; the plan is the one the caller's numbering gives).
    tie: Vec<u32>,
}

/// What a relocation changed: both pools as they were, and every job of theirs' predicted times
/// before it. Undoing restores them instead of simulating both pools again (half the work of a
/// tried move, and most tried moves are undone).
#[derive(Clone, Default)]
struct Undo {
    job: usize,
    from: usize,
    to: usize,
    pool_from: Vec<u32>,
    pool_to: Vec<u32>,
    /// `(job, done, arrival, risk share)` before.
    times: Vec<(u32, i64, i64, i64)>,
    /// `State::moved`'s length before.
    moved_mark: usize,
}

impl<'a> State<'a> {
    /// The first schedule: each job on `decoder`, `tie` its index in the caller's problem.
    fn new(p: &'a Problem, decoder: Vec<u32>, tie: Vec<u32>) -> State<'a> {
        let ranks = p.workers.len();
        let mut s = State {
            p,
            ranks,
            owner: p.owner.clone(),
            decoder,
            pools: vec![Vec::new(); ranks],
            arrival: vec![0; p.owner.len()],
            done: vec![0; p.owner.len()],
            batch_samples: vec![Vec::new(); ranks * p.steps],
            ready: vec![0; ranks * p.steps],
            late_by_step: vec![MaxTree::new(ranks); p.steps],
            load: vec![0; ranks * p.steps],
            used: vec![0; ranks * p.steps],
            risk: vec![0; ranks * p.steps],
            risk_share: vec![0; p.owner.len()],
            stale: Vec::new(),
            moved: Vec::new(),
            undo: Undo::default(),
            workers_free: Vec::new(),
            tie,
        };
        let (mut pool_len, mut batch_len) = (vec![0usize; ranks], vec![0usize; s.ready.len()]);
        for i in 0..p.owner.len() {
            pool_len[s.decoder[i] as usize] += 1;
            batch_len[s.batch_of(i)] += 1;
        }
        for (pool, &len) in s.pools.iter_mut().zip(&pool_len) {
            pool.reserve_exact(len);
        }
        for (batch, &len) in s.batch_samples.iter_mut().zip(&batch_len) {
            batch.reserve_exact(len);
        }
        for i in 0..p.owner.len() {
            s.pools[s.decoder[i] as usize].push(i as u32);
            let b = s.batch_of(i);
            s.batch_samples[b].push(i as u32);
            s.load[b] += p.accel_ns[i];
            s.used[b] += p.bytes[i];
        }
        // Each pool in order, its keys computed once per job and sorted beside it (every key is
        // distinct, so the order is the one any sort gives).
        let mut keyed = Vec::new();
        for h in 0..ranks {
            keyed.clear();
            keyed.extend(s.pools[h].iter().map(|&i| (s.edf_key(i as usize), i)));
            keyed.sort_unstable();
            s.pools[h].clear();
            s.pools[h].extend(keyed.iter().map(|&(_, i)| i));
            s.simulate(h);
        }
        for b in 0..s.ready.len() {
            s.ready[b] = s.batch_ready(b);
            s.late_by_step[b % p.steps].set(b / p.steps, s.ready[b] - p.deadline_ns[b]);
        }
        s.stale.clear();
        s
    }

    fn batch_of(&self, i: usize) -> usize {
        self.owner[i] as usize * self.p.steps + self.p.step[i] as usize
    }

    fn remote(&self, i: usize) -> bool {
        self.decoder[i] != self.owner[i]
    }

    /// The deadline a job must finish by on its decoder: the owner's; for a tensor another rank
    /// decodes, the exchange before it (or, with none, the deadline less the transfer).
    fn job_deadline(&self, i: usize) -> i64 {
        let b = self.batch_of(i);
        let d = self.p.deadline_ns[b];
        if !self.remote(i) {
            d
        } else if self.p.exchange_ns[b] != i64::MIN {
            self.p.exchange_ns[b]
        } else {
            d - self.transfer_of(i)
        }
    }

    /// Nanoseconds to send job `i`'s tensor from its decoder to its owner: over the node's own
    /// links, or between nodes.
    #[inline]
    fn transfer_of(&self, i: usize) -> i64 {
        if self.p.transfer_far_ns.is_empty() {
            return self.p.transfer_ns[i];
        }
        let (from, to) = (self.decoder[i] as usize, self.owner[i] as usize);
        match (self.p.node.get(from), self.p.node.get(to)) {
            (Some(a), Some(b)) if a != b => self.p.transfer_far_ns[i],
            _ => self.p.transfer_ns[i],
        }
    }

    /// When a job finished at `done` reaches its owner: at once when decoded there; else sent at
    /// the exchange before the deadline if done by then, otherwise when the batch is collected
    /// (the deadline) or when it is done, whichever is later, plus the transfer.
    fn arrival_of(&self, i: usize, done: i64) -> i64 {
        if !self.remote(i) {
            return done;
        }
        let b = self.batch_of(i);
        let exchange = self.p.exchange_ns[b];
        let sent =
            if exchange != i64::MIN && done <= exchange { exchange } else { done.max(self.p.deadline_ns[b]) };
        sent + self.transfer_of(i)
    }

    /// Earliest-deadline-first list scheduling of pool `h` (kept in [`State::edf_key`] order);
    /// writes the predicted times of its jobs.
    fn simulate(&mut self, h: usize) {
        let jobs = std::mem::take(&mut self.pools[h]);
        let w = self.p.workers[h].max(1) as usize;
        let mut free = std::mem::take(&mut self.workers_free);
        free.clear();
        free.extend((0..w).map(|k| Reverse((self.p.backlog_ns[h], k))));
        let mut free = BinaryHeap::from(free);
        for &i in &jobs {
            let i = i as usize;
            // The worker that frees up first takes it (its key grows in place: one sift).
            let mut first = free.peek_mut().expect("at least one worker");
            let done = first.0 .0 + self.p.decode_ns[i];
            first.0 .0 = done;
            drop(first);
            self.done[i] = done;
            let arrival = self.arrival_of(i, done);
            let b = self.batch_of(i);
            if arrival != self.arrival[i] {
                self.arrival[i] = arrival;
                self.stale.push(b);
            }
            let share = self.risk_share_of(i);
            self.risk[b] += share - self.risk_share[i];
            self.risk_share[i] = share;
        }
        self.pools[h] = jobs;
        self.workers_free = free.into_vec();
    }

    /// How far job `i` finishes inside its batch's guard before it is due (0 without a guard,
    /// or when it keeps it).
    fn risk_share_of(&self, i: usize) -> i64 {
        let guard = self.p.guard_ns.get(self.batch_of(i)).copied().unwrap_or(0);
        if guard <= 0 {
            return 0;
        }
        (guard - (self.job_deadline(i) - self.done[i])).clamp(0, guard)
    }

    fn batch_ready(&self, b: usize) -> i64 {
        self.batch_samples[b].iter().map(|&i| self.arrival[i as usize]).max().unwrap_or(0)
    }

    fn objective_of(&self, batches: &[usize]) -> Objective {
        let steps = self.p.steps;
        let mut o = (0i64, 0u64, 0i64, 0i64);
        let mut seen = vec![false; steps];
        for &b in batches {
            let late = self.ready[b] - self.p.deadline_ns[b];
            o.1 += (late > self.p.tolerance_ns) as u64;
            o.2 += late.max(0);
            o.3 += self.risk_of(b);
            let k = b % steps;
            if !seen[k] {
                seen[k] = true;
                o.0 += self.step_delay(k);
            }
        }
        o
    }

    /// Σ over batch `b`'s jobs of how far each finishes inside the batch's guard before it is
    /// due (0 without a guard, or when every job keeps it).
    fn risk_of(&self, b: usize) -> i64 {
        self.risk[b]
    }

    /// How late step `k`'s latest batch is (0 when every batch is on time).
    fn step_delay(&self, k: usize) -> i64 {
        self.late_by_step[k].max().max(0)
    }

    /// Batches whose readiness depends on pools `a` or `b`, or that belong to ranks `a` or `b`.
    fn affected(&self, a: usize, b: usize) -> Vec<usize> {
        let steps = self.p.steps;
        let mut out: Vec<usize> =
            self.pools[a].iter().chain(&self.pools[b]).map(|&i| self.batch_of(i as usize)).collect();
        out.extend((0..steps).map(|k| a * steps + k));
        out.extend((0..steps).map(|k| b * steps + k));
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Moves job `i` from pool `from` to pool `to`, at its place in `to`'s order (its key
    /// there: its owner may have changed, and where it is decoded changes its deadline).
    fn move_job(&mut self, i: usize, from: usize, to: usize) {
        let pos = self.pools[from].iter().position(|&x| x as usize == i).expect("job is in its pool");
        self.pools[from].remove(pos);
        self.decoder[i] = to as u32;
        let key = self.edf_key(i);
        let at = self.pools[to].partition_point(|&j| self.edf_key(j as usize) < key);
        self.pools[to].insert(at, i as u32);
    }

    /// The order of a pool's jobs: earliest deadline first, then the longer job, then the id
    /// (and the index: every job has its own key, so a pool kept in order by insertions is in the
    /// order a sort gives).
    fn edf_key(&self, i: usize) -> (i64, Reverse<i64>, u64, usize) {
        (self.job_deadline(i), Reverse(self.p.decode_ns[i]), self.p.id[i], self.tie[i] as usize)
    }

    /// Simulates pools `a` and `b` again and updates the readiness of the batches that changed
    /// (those with a job arriving at another time, and `regrouped`, whose jobs changed); returns
    /// the objective over `batches`, which hold them all.
    fn refresh(&mut self, a: usize, b: usize, batches: &[usize], regrouped: &[usize]) -> Objective {
        self.stale.clear();
        self.stale.extend_from_slice(regrouped);
        self.simulate(a);
        self.simulate(b);
        let mut stale = std::mem::take(&mut self.stale);
        stale.sort_unstable();
        stale.dedup();
        let steps = self.p.steps;
        for &x in &stale {
            let ready = self.batch_ready(x);
            if ready != self.ready[x] {
                self.moved.push((x, self.ready[x]));
                self.ready[x] = ready;
                self.late_by_step[x % steps].set(x / steps, ready - self.p.deadline_ns[x]);
            }
        }
        self.stale = stale;
        self.objective_of(batches)
    }

    /// Decodes sample `i` on rank `to`. Returns the objective over the affected batches before
    /// and after, and those batches. (Moving a job between two pools leaves the union of their
    /// jobs unchanged, so the same batches depend on them before and after.)
    fn relocate(&mut self, i: usize, to: usize) -> (Objective, Objective, Vec<usize>) {
        let from = self.decoder[i] as usize;
        let batches = self.affected(from, to);
        let before = self.objective_of(&batches);
        self.save(i, from, to);
        self.move_job(i, from, to);
        let after = self.refresh(from, to, &batches, &[]);
        (before, after, batches)
    }

    /// Records what relocating job `i` from pool `from` to `to` will change.
    fn save(&mut self, i: usize, from: usize, to: usize) {
        let mut u = std::mem::take(&mut self.undo);
        (u.job, u.from, u.to) = (i, from, to);
        u.pool_from.clone_from(&self.pools[from]);
        u.pool_to.clone_from(&self.pools[to]);
        u.times.clear();
        for &j in self.pools[from].iter().chain(&self.pools[to]) {
            let x = j as usize;
            u.times.push((j, self.done[x], self.arrival[x], self.risk_share[x]));
        }
        u.moved_mark = self.moved.len();
        self.undo = u;
    }

    /// Undoes the last [`State::relocate`]: the state is as it was before, bit for bit.
    fn undo_relocate(&mut self) {
        let mut u = std::mem::take(&mut self.undo);
        std::mem::swap(&mut self.pools[u.from], &mut u.pool_from);
        std::mem::swap(&mut self.pools[u.to], &mut u.pool_to);
        self.decoder[u.job] = u.from as u32;
        for &(j, done, arrival, share) in &u.times {
            let x = j as usize;
            self.done[x] = done;
            self.arrival[x] = arrival;
            let b = self.batch_of(x);
            self.risk[b] += share - self.risk_share[x];
            self.risk_share[x] = share;
        }
        let steps = self.p.steps;
        for &(x, ready) in self.moved[u.moved_mark..].iter().rev() {
            self.ready[x] = ready;
            self.late_by_step[x % steps].set(x / steps, ready - self.p.deadline_ns[x]);
        }
        self.moved.truncate(u.moved_mark);
        self.undo = u;
    }

    /// Exchanges the owners of `i` (owned and decoded by one rank) and `j` (owned and decoded by
    /// another): each is then trained and decoded where the other was. Its own inverse.
    fn swap_owners(&mut self, i: usize, j: usize) -> (Objective, Objective, Vec<usize>) {
        let (a, b) = (self.owner[i] as usize, self.owner[j] as usize);
        let mut batches = self.affected(a, b);
        let before = self.objective_of(&batches);
        let mut regrouped = Vec::with_capacity(4);
        for (x, from, to) in [(i, a, b), (j, b, a)] {
            let old = self.batch_of(x);
            // Its risk moves with it: taken off here, added where its new pool is simulated.
            self.risk[old] -= std::mem::take(&mut self.risk_share[x]);
            self.batch_samples[old].retain(|&y| y as usize != x);
            self.load[old] -= self.p.accel_ns[x];
            self.used[old] -= self.p.bytes[x];
            self.owner[x] = to as u32;
            let new = self.batch_of(x);
            self.batch_samples[new].push(x as u32);
            self.load[new] += self.p.accel_ns[x];
            self.used[new] += self.p.bytes[x];
            self.move_job(x, from, to);
            batches.push(new);
            regrouped.extend([old, new]);
        }
        batches.sort_unstable();
        batches.dedup();
        let after = self.refresh(a, b, &batches, &regrouped);
        (before, after, batches)
    }

    /// For swapping out `i`: the sample of rank `q`'s batch of the same step, owned and decoded
    /// there, whose accelerator weight is nearest to `i`'s, if the swap keeps both ranks' loads
    /// within the step's largest load and their memory within its cap.
    fn swap_partner(&self, i: usize, q: usize) -> Option<usize> {
        let k = self.p.step[i] as usize;
        let o = self.owner[i] as usize;
        let (bo, bq) = (o * self.p.steps + k, q * self.p.steps + k);
        let cap = self.p.max_load_ns[k];
        let wi = self.p.accel_ns[i];
        self.batch_samples[bq]
            .iter()
            .map(|&j| j as usize)
            .filter(|&j| !self.remote(j) && !self.p.pinned[j] && self.p.decode_ns[j] < self.p.decode_ns[i])
            .filter(|&j| {
                let wj = self.p.accel_ns[j];
                self.load[bo] - wi + wj <= cap && self.load[bq] - wj + wi <= cap
            })
            .filter(|&j| {
                let (mi, mj) = (self.p.bytes[i], self.p.bytes[j]);
                let fits = |r: usize, b: usize, gain: u64, loss: u64| {
                    let cap = self.p.mem_cap[r];
                    cap == 0 || gain <= loss || self.used[b] - loss + gain <= cap
                };
                fits(o, bo, mj, mi) && fits(q, bq, mi, mj)
            })
            .min_by_key(|&j| ((self.p.accel_ns[j] - wi).abs(), self.p.id[j], self.tie[j]))
    }

    /// When rank `h`'s workers run out of planned work (its backlog when it decodes nothing).
    fn free_at(&self, h: usize) -> i64 {
        self.pools[h].iter().map(|&i| self.done[i as usize]).max().unwrap_or(self.p.backlog_ns[h])
    }
}

/// Late batches in a row the search may fail to help before it stops: when the latest 32
/// cannot be helped, those less late seldom can (every batch is late when nothing is measured
/// yet, or when decoding outlasts every step, and trying each of thousands cost most of a plan's
/// time). Planning one step at a time (as the step engine does) on at most 32 ranks, every late
/// batch is still tried. At 256, camera originals (`egoexo4d_4k`, every batch late) planned 2.6×
/// slower at 4096 ranks for 0.2% more throughput, and 3.8× slower at 512 for 0.05% less; the
/// 8-rank suite is the same at both.
pub const STUCK_IN_A_ROW: usize = 32;

/// Batches at risk (on time, inside their guard) the search tries to relieve, most at risk first
/// (each by moving its last-arriving sample only): relief, not a second search.
pub const RISK_TRIES: usize = 32;

/// The ranks by when their workers free up, kept current as moves change their pools.
struct Helpers {
    free_key: Vec<i64>,
    by_free: BTreeSet<(i64, usize)>,
}

/// The latest late batch, kept at hand as the search changes batches' readiness (a scan of
/// every batch per change was a tenth of a plan at thousands of ranks): a heap of
/// `(lateness, earlier step, lower rank)` entries, each pushed when a batch's readiness changes;
/// an entry no longer current is dropped when it comes to the top.
struct LatestBatch {
    heap: BinaryHeap<(i64, Reverse<usize>, Reverse<usize>)>,
}

impl LatestBatch {
    fn new(s: &State<'_>) -> LatestBatch {
        let mut latest = LatestBatch { heap: BinaryHeap::new() };
        latest.push_all(s, 0..s.ready.len());
        latest
    }

    fn push_all(&mut self, s: &State<'_>, batches: impl Iterator<Item = usize>) {
        let steps = s.p.steps;
        for b in batches {
            let late = s.ready[b] - s.p.deadline_ns[b];
            if late > s.p.tolerance_ns {
                self.heap.push((late, Reverse(b % steps), Reverse(b / steps)));
            }
        }
    }

    /// Takes in the batches whose readiness changed.
    fn update(&mut self, s: &mut State<'_>) {
        let moved = std::mem::take(&mut s.moved);
        self.push_all(s, moved.iter().map(|&(b, _)| b));
        s.moved = moved;
        s.moved.clear();
    }

    /// The latest late batch not `stuck` (ties: the earlier step, then the lower rank).
    fn pick(&mut self, s: &State<'_>, stuck: &[bool]) -> Option<usize> {
        while let Some(&(late, Reverse(k), Reverse(r))) = self.heap.peek() {
            let b = r * s.p.steps + k;
            if !stuck[b] && late == s.ready[b] - s.p.deadline_ns[b] {
                return Some(b);
            }
            self.heap.pop();
        }
        None
    }
}

/// Changes kept so far.
struct Moves {
    offloads: u32,
    swaps: u32,
}

/// Tries, for batch `b`'s `cands` last-arriving own-decoded samples and the ranks that free up
/// first, an offload or an owner swap, and keeps the first that improves the objective over the
/// batches it touches. Returns whether one was kept.
fn improve(
    s: &mut State<'_>,
    b: usize,
    cands_n: usize,
    search: Search,
    helpers: &mut Helpers,
    moves: &mut Moves,
) -> bool {
    let p = s.p;
    let owner = b / p.steps;
    let mut cands: Vec<usize> =
        s.batch_samples[b].iter().map(|&i| i as usize).filter(|&i| !s.remote(i)).collect();
    cands.sort_by_key(|&i| (Reverse(s.arrival[i]), Reverse(p.decode_ns[i]), p.id[i], s.tie[i]));
    cands.truncate(cands_n);
    // Whether their own batches are on time or wait for someone else's pieces: idle CPUs can
    // help either way.
    let mut tried: Vec<usize> = helpers
        .by_free
        .iter()
        .map(|&(_, h)| h)
        .filter(|&h| h != owner && !p.late_pair(owner, h))
        .take(search.helpers.max(1) as usize)
        .collect();
    // The first change that helps is kept: of the earliest-free ranks, try the owner's node
    // first, whose links are the cheaper ones (a stable sort: one node, one order).
    if !p.node.is_empty() {
        tried.sort_by_key(|&h| p.node.get(h) != p.node.get(owner));
    }
    let mut kept: Option<Vec<usize>> = None;
    'search: for &i in &cands {
        for &h in &tried {
            if search.offload {
                let (before, after, batches) = s.relocate(i, h);
                if after < before {
                    moves.offloads += 1;
                    kept = Some(batches);
                    break 'search;
                }
                s.undo_relocate();
            }
            if search.swap_owners && !p.pinned[i] {
                if let Some(j) = s.swap_partner(i, h) {
                    let (before, after, batches) = s.swap_owners(i, j);
                    if after < before {
                        moves.swaps += 1;
                        kept = Some(batches);
                        break 'search;
                    }
                    s.swap_owners(i, j);
                }
            }
        }
    }
    let Some(batches) = kept else { return false };
    let mut touched: Vec<usize> = batches.iter().map(|&x| x / p.steps).collect();
    touched.extend(tried.iter().copied().chain([owner]));
    touched.sort_unstable();
    touched.dedup();
    for r in touched {
        helpers.by_free.remove(&(helpers.free_key[r], r));
        helpers.free_key[r] = s.free_at(r);
        helpers.by_free.insert((helpers.free_key[r], r));
    }
    true
}

/// Places decode work: starts from every sample decoded by its owner and the pieces of split
/// samples spread (`spread_pieces`), and changes late batches while the objective improves, then
/// relieves the batches most at risk — at most `search.max_moves` changes in all.
pub fn place(p: &Problem, search: Search) -> Placement {
    let first = spread_pieces(p, p.workers.len());
    let layout = Layout::by_pool(&first, p.workers.len());
    let renumbered = layout.problem(p);
    let p = &renumbered;
    let mut s = State::new(p, layout.gather(&first), layout.old_of.clone());
    let (mut offloads, mut swaps) = (0u32, 0u32);
    if (search.offload || search.swap_owners) && s.ranks > 1 {
        let free_key: Vec<i64> = (0..s.ranks).map(|h| s.free_at(h)).collect();
        let by_free: BTreeSet<(i64, usize)> = (0..s.ranks).map(|h| (free_key[h], h)).collect();
        let mut helpers = Helpers { free_key, by_free };
        let mut moves = Moves { offloads: 0, swaps: 0 };
        // 1. Late batches, the latest first, while a move helps one of them (ties: earlier step,
        //    lower rank), until [`STUCK_IN_A_ROW`] of them in a row were not helped.
        let mut stuck = vec![false; s.ready.len()];
        let mut stuck_in_a_row = 0usize;
        let mut latest = LatestBatch::new(&s);
        while moves.offloads + moves.swaps < search.max_moves && stuck_in_a_row < STUCK_IN_A_ROW {
            let Some(b) = latest.pick(&s, &stuck) else { break };
            if improve(&mut s, b, 3, search, &mut helpers, &mut moves) {
                stuck_in_a_row = 0;
            } else {
                stuck[b] = true;
                stuck_in_a_row += 1;
            }
            latest.update(&mut s);
        }
        // 2. Then the batches most at risk, each tried once ([`RISK_TRIES`] of them at most: the
        //    search stays bounded at thousands of ranks).
        let mut at_risk: Vec<(i64, usize)> = (0..s.ready.len())
            .filter(|&b| s.ready[b] - p.deadline_ns[b] <= p.tolerance_ns)
            .map(|b| (s.risk_of(b), b))
            .filter(|&(risk, _)| risk > 0)
            .collect();
        at_risk.sort_by_key(|&(risk, b)| (Reverse(risk), b % p.steps, b / p.steps));
        for &(_, b) in at_risk.iter().take(RISK_TRIES) {
            if moves.offloads + moves.swaps >= search.max_moves {
                break;
            }
            if s.risk_of(b) > 0 {
                improve(&mut s, b, 1, search, &mut helpers, &mut moves);
            }
        }
        offloads = moves.offloads;
        swaps = moves.swaps;
    }
    let all: Vec<usize> = (0..s.ready.len()).collect();
    let (delay_ns, misses, lateness_ns, _) = s.objective_of(&all);
    let bytes_moved = (0..s.decoder.len()).filter(|&i| s.remote(i)).map(|i| p.bytes[i]).sum();
    let order =
        s.pools.iter().map(|pool| pool.iter().map(|&i| layout.old_of[i as usize]).collect()).collect();
    Placement {
        owner: layout.scatter(&s.owner),
        decoder: layout.scatter(&s.decoder),
        order,
        arrival_ns: layout.scatter(&s.arrival),
        ready_ns: s.ready,
        misses,
        lateness_ns,
        delay_ns,
        bytes_moved,
        offloads,
        swaps,
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::{spread_pieces, MaxTree, Problem, State};

    /// Everything a move changes and an undone one must restore.
    type Snapshot =
        (Vec<Vec<u32>>, Vec<u32>, Vec<u32>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>);

    fn snapshot(s: &State<'_>) -> Snapshot {
        let late = s.late_by_step.iter().map(MaxTree::max).collect();
        (
            s.pools.clone(),
            s.owner.clone(),
            s.decoder.clone(),
            s.done.clone(),
            s.arrival.clone(),
            s.ready.clone(),
            s.risk.clone(),
            s.risk_share.clone(),
            late,
        )
    }

    /// What the state keeps up to date move by move is what a fresh computation gives: pools in
    /// order, predicted times, readiness, risk, and each step's latest batch.
    fn assert_consistent(s: &State<'_>) {
        let p = s.p;
        for h in 0..s.ranks {
            let keys: Vec<_> = s.pools[h].iter().map(|&i| s.edf_key(i as usize)).collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "pool {h} out of order");
            assert!(
                s.pools[h].iter().all(|&i| s.decoder[i as usize] as usize == h),
                "pool {h} holds others' jobs"
            );
        }
        let mut fresh = s.clone();
        for h in 0..s.ranks {
            fresh.simulate(h);
        }
        assert_eq!((&fresh.done, &fresh.arrival, &fresh.risk_share), (&s.done, &s.arrival, &s.risk_share));
        for b in 0..s.ready.len() {
            assert_eq!(s.ready[b], s.batch_ready(b), "batch {b}'s readiness");
            let risk: i64 = s.batch_samples[b].iter().map(|&i| s.risk_share_of(i as usize)).sum();
            assert_eq!(s.risk[b], risk, "batch {b}'s risk");
        }
        for k in 0..p.steps {
            let latest =
                (0..s.ranks).map(|r| s.ready[r * p.steps + k] - p.deadline_ns[r * p.steps + k]).max();
            assert_eq!(Some(s.late_by_step[k].max()), latest, "step {k}'s latest batch");
        }
    }

    /// Two steps on `ranks` ranks of two nodes, deadlines `deadline_ms` per batch (rank-major),
    /// the first step's tensors crossing at an exchange 5 ms before it on even ranks, a guard
    /// of 3 ms: `jobs` as (owner, step, decode ms, transfer ms, piece of a split sample).
    fn two_step_problem(ranks: usize, deadline_ms: &[i64], jobs: &[(u32, u32, i64, i64, bool)]) -> Problem {
        let n = jobs.len();
        let ms = 1_000_000;
        let deadline_ns: Vec<i64> = deadline_ms[..2 * ranks].iter().map(|d| d * ms).collect();
        Problem {
            steps: 2,
            step: jobs.iter().map(|j| j.1).collect(),
            owner: jobs.iter().map(|j| j.0 % ranks as u32).collect(),
            accel_ns: jobs.iter().map(|j| j.2 * ms / 2).collect(),
            max_load_ns: vec![i64::MAX / 4; 2],
            decode_ns: jobs.iter().map(|j| j.2 * ms).collect(),
            transfer_ns: jobs.iter().map(|j| j.3 * ms).collect(),
            transfer_far_ns: jobs.iter().map(|j| 3 * j.3 * ms).collect(),
            node: (0..ranks as u32).map(|r| r % 2).collect(),
            bytes: vec![1; n],
            mem_cap: vec![0; ranks],
            id: (0..n as u64).map(|i| i / 2).collect(),
            pinned: jobs.iter().map(|j| j.4).collect(),
            workers: (0..ranks as u32).map(|r| 1 + r % 2).collect(),
            backlog_ns: vec![0; ranks],
            late: Vec::new(),
            exchange_ns: (0..2 * ranks)
                .map(|b| if b % 2 == 0 && (b / 2) % 2 == 0 { deadline_ns[b] - 5 * ms } else { i64::MIN })
                .collect(),
            deadline_ns,
            tolerance_ns: 0,
            guard_ns: vec![3 * ms; 2 * ranks],
        }
    }

    proptest! {
        // Moves tried and undone, or kept, in any order: the state kept up to date is the one
        // computed afresh, and an undone move leaves it as it was, bit for bit.
        #[test]
        fn moves_kept_or_undone_keep_the_state_exact(
            ranks in 2usize..5,
            deadline_ms in proptest::collection::vec(0i64..80, 8),
            jobs in proptest::collection::vec((0u32..4, 0u32..2, 1i64..30, 0i64..6, proptest::bool::weighted(0.2)), 1..16),
            moves in proptest::collection::vec((0usize..16, 0usize..16, proptest::bool::ANY), 1..12),
        ) {
            let p = two_step_problem(ranks, &deadline_ms, &jobs);
            let mut s = State::new(&p, spread_pieces(&p, ranks), (0..jobs.len() as u32).collect());
            assert_consistent(&s);
            let n = jobs.len();
            for (a, b, keep) in moves {
                let before = snapshot(&s);
                let (i, j, to) = (a % n, b % n, b % ranks);
                if s.decoder[i] as usize != to {
                    s.relocate(i, to);
                    assert_consistent(&s);
                    if !keep {
                        s.undo_relocate();
                        prop_assert!(snapshot(&s) == before, "an undone relocation left a trace");
                    }
                } else if s.owner[i] != s.owner[j]
                    && !s.remote(i)
                    && !s.remote(j)
                    && !p.pinned[i]
                    && !p.pinned[j]
                    && p.step[i] == p.step[j]
                {
                    s.swap_owners(i, j);
                    assert_consistent(&s);
                    if !keep {
                        s.swap_owners(i, j);
                        prop_assert!(snapshot(&s) == before, "a swap undone left a trace");
                    }
                }
                assert_consistent(&s);
            }
        }
    }

    /// `spread_pieces` as first written, on an ordered set: the heap must choose the same ranks.
    fn spread_pieces_on_a_set(p: &Problem, ranks: usize) -> Vec<u32> {
        let mut decoder = p.owner.clone();
        let mut busy: Vec<i64> = p.backlog_ns.clone();
        for i in (0..p.owner.len()).filter(|&i| !p.pinned[i]) {
            busy[p.owner[i] as usize] += p.decode_ns[i];
        }
        let key = |busy: &[i64], h: usize| (busy[h] / p.workers[h].max(1) as i64, h);
        let mut free_first: BTreeSet<(i64, usize)> = (0..ranks).map(|h| key(&busy, h)).collect();
        let mut pieces: Vec<usize> = (0..p.owner.len()).filter(|&i| p.pinned[i]).collect();
        pieces.sort_by_key(|&i| (Reverse(p.decode_ns[i]), p.id[i], i));
        let mut taken: std::collections::HashMap<u64, Vec<usize>> = std::collections::HashMap::new();
        for i in pieces {
            let mine = taken.entry(p.id[i]).or_default();
            let h = free_first
                .iter()
                .map(|&(_, h)| h)
                .find(|h| !mine.contains(h))
                .unwrap_or_else(|| free_first.first().expect("at least one rank").1);
            free_first.remove(&key(&busy, h));
            busy[h] += p.decode_ns[i];
            free_first.insert(key(&busy, h));
            decoder[i] = h as u32;
            mine.push(h);
        }
        decoder
    }

    /// A one-step problem: `jobs` as (owner, decode ms, sample id, piece of a split sample).
    fn problem(ranks: usize, workers: &[u32], backlog_ms: &[i64], jobs: &[(u32, i64, u64, bool)]) -> Problem {
        let n = jobs.len();
        Problem {
            steps: 1,
            step: vec![0; n],
            owner: jobs.iter().map(|j| j.0).collect(),
            accel_ns: vec![0; n],
            max_load_ns: vec![0],
            decode_ns: jobs.iter().map(|j| j.1 * 1_000_000).collect(),
            transfer_ns: vec![0; n],
            transfer_far_ns: Vec::new(),
            node: Vec::new(),
            bytes: vec![0; n],
            mem_cap: vec![0; ranks],
            id: jobs.iter().map(|j| j.2).collect(),
            pinned: jobs.iter().map(|j| j.3).collect(),
            workers: workers.to_vec(),
            backlog_ns: backlog_ms.iter().map(|b| b * 1_000_000).collect(),
            late: Vec::new(),
            deadline_ns: vec![i64::MAX / 4; ranks],
            exchange_ns: vec![i64::MIN; ranks],
            tolerance_ns: 0,
            guard_ns: vec![0; ranks],
        }
    }

    proptest! {
        // Samples of up to 9 pieces on 1–6 ranks: more pieces than ranks, equal keys and
        // ranks with several workers all occur.
        #[test]
        fn pieces_spread_on_the_heap_as_on_an_ordered_set(
            ranks in 1usize..7,
            workers in proptest::collection::vec(1u32..4, 6),
            backlog in proptest::collection::vec(0i64..50, 6),
            samples in proptest::collection::vec((0u32..6, 1i64..40, 0usize..10), 1..12),
        ) {
            let mut jobs = Vec::new();
            for (id, &(owner, ms, pieces)) in samples.iter().enumerate() {
                let owner = owner % ranks as u32;
                if pieces < 2 {
                    jobs.push((owner, ms, id as u64, false));
                } else {
                    jobs.extend((0..pieces).map(|k| (owner, ms + (k as i64 % 3), id as u64, true)));
                }
            }
            let p = problem(ranks, &workers[..ranks], &backlog[..ranks], &jobs);
            prop_assert_eq!(spread_pieces(&p, ranks), spread_pieces_on_a_set(&p, ranks));
        }
    }

    #[test]
    fn max_tree_follows_changes_for_any_size() {
        for n in 1..12usize {
            let mut t = MaxTree::new(n);
            let mut v: Vec<i64> = (0..n as i64).map(|i| (i * 7919) % 13 - 6).collect();
            for (i, &x) in v.iter().enumerate() {
                t.set(i, x);
            }
            for step in 0..50i64 {
                let i = (step as usize * 5) % n;
                v[i] = (step * 31) % 17 - 8;
                t.set(i, v[i]);
                assert_eq!(t.max(), *v.iter().max().unwrap(), "n {n} step {step}");
            }
        }
    }
}
