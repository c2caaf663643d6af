//! The simulator's event engine: per-rank CPU pools and the cost of collectives over links.
//!
//! A [`CpuPool`] is one rank's decode pool in simulated time: `workers` workers take queued jobs
//! earliest-deadline-first (ties by sample id, then submission order — the real pool's key) and
//! share `cores` cores by processor sharing (each running job progresses at
//! `min(1, cores / running)` CPU-seconds per second), the way a CPU cgroup with a quota below the
//! worker count throttles them. Events are job completions; the pool advances from one to the
//! next, so its clock only moves forward and its results depend on nothing but its inputs.
//!
//! ```
//! use datahelix::sim::engine::{CpuPool, SimJob};
//!
//! let mut pool = CpuPool::new(2, 2.0);
//! pool.submit(0.0, SimJob { key: 2, id: 1, cpu_s: 1.0, tag: 0 });
//! pool.submit(0.0, SimJob { key: 1, id: 2, cpu_s: 3.0, tag: 0 });
//! let mut ends = Vec::new();
//! while let Some(d) = pool.next_completion() {
//!     ends.push((d.job.id, d.end_s));
//! }
//! assert_eq!(ends, vec![(1, 1.0), (2, 3.0)]);
//! ```

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::plan::TransferCost;

/// A job for a simulated pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimJob {
    /// EDF key (the loader's `(step << 32) | position in the rank's order`).
    pub key: u64,
    /// Sample id (ties).
    pub id: u64,
    /// CPU seconds the job needs on one uncontended core.
    pub cpu_s: f64,
    /// Caller's tag (carried through).
    pub tag: u64,
}

/// A finished job.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Done {
    /// The job.
    pub job: SimJob,
    /// When a worker took it.
    pub start_s: f64,
    /// When it finished.
    pub end_s: f64,
}

#[derive(Clone, Copy, Debug)]
struct Queued {
    job: SimJob,
    seq: u64,
}

impl Queued {
    fn order(&self) -> (u64, u64, u64) {
        (self.job.key, self.job.id, self.seq)
    }
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        self.order() == other.order()
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> Ordering {
        self.order().cmp(&other.order())
    }
}

#[derive(Clone, Copy, Debug)]
struct Running {
    job: SimJob,
    start_s: f64,
    left_s: f64,
    seq: u64,
}

/// One rank's decode pool in simulated time (see the module docs).
#[derive(Clone, Debug)]
pub struct CpuPool {
    workers: usize,
    cores: f64,
    now: f64,
    seq: u64,
    queue: BinaryHeap<Reverse<Queued>>,
    running: Vec<Running>,
    finished: std::collections::VecDeque<Done>,
    cpu_s: f64,
    /// The quota's grain, when the cores are shared the way the kernel enforces them
    /// ([`CpuPool::with_quota_period`]); `None`: processor sharing.
    quota: Option<Quota>,
}

/// A CFS bandwidth quota: every `period_s` the pool's workers may use `cores × period_s`
/// CPU-seconds, each at up to a core, and are stopped once it is spent until the next period.
#[derive(Clone, Copy, Debug)]
struct Quota {
    period_s: f64,
    /// The period `now` lies in (`⌊now / period_s⌋`).
    index: f64,
    /// CPU-seconds left in it.
    left_s: f64,
}

/// Work below this many CPU-seconds counts as finished (float round-off of processor sharing).
const EPS: f64 = 1e-12;

impl CpuPool {
    /// A pool of `workers` workers on `cores` cores (at least one worker; cores > 0).
    pub fn new(workers: usize, cores: f64) -> CpuPool {
        CpuPool {
            workers: workers.max(1),
            cores: if cores > 0.0 { cores } else { workers.max(1) as f64 },
            now: 0.0,
            seq: 0,
            queue: BinaryHeap::new(),
            running: Vec::new(),
            finished: Default::default(),
            cpu_s: 0.0,
            quota: None,
        }
    }

    /// The same pool with its cores given as the kernel's CFS quota does (cgroup
    /// `cpu.cfs_period_us` of `period_s`): within each period the running jobs progress at a
    /// core each until the period's `cores × period_s` CPU-seconds are spent, then not at all
    /// until the next one. A short job may so wait most of a period, where processor sharing
    /// would run it at once, slowly; the mean rate is the same. A period ≤ 0 keeps processor
    /// sharing. The efficiency bound counts the budget's mean rate over each window of steps
    /// (`metrics::bound`); under a quota a window can hold up to one period's share more, so a
    /// run simulated this way (like a real one) could come out a little above it — the suite at
    /// 100 ms reached 0.994 at most (`cpu_per_accel` 0.5 and 1.25, 2026-12-05).
    ///
    /// ```
    /// use datahelix::sim::engine::{CpuPool, SimJob};
    ///
    /// // A quarter of a core in 100-ms periods: a 50-ms job runs 25 ms, waits 75, runs 25.
    /// let mut pool = CpuPool::new(1, 0.25).with_quota_period(0.1);
    /// pool.submit(0.0, SimJob { key: 1, id: 1, cpu_s: 0.05, tag: 0 });
    /// let done = pool.next_completion().unwrap();
    /// assert!((done.end_s - 0.125).abs() < 1e-9, "{}", done.end_s);
    /// // Shared smoothly it would end at 0.2 s.
    /// let mut smooth = CpuPool::new(1, 0.25);
    /// smooth.submit(0.0, SimJob { key: 1, id: 1, cpu_s: 0.05, tag: 0 });
    /// assert!((smooth.next_completion().unwrap().end_s - 0.2).abs() < 1e-9);
    /// ```
    pub fn with_quota_period(mut self, period_s: f64) -> CpuPool {
        self.quota = (period_s > 0.0 && period_s.is_finite()).then(|| {
            let index = (self.now / period_s).floor();
            Quota { period_s, index, left_s: self.cores * period_s }
        });
        self
    }

    /// The pool's clock.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Jobs queued or running.
    pub fn pending(&self) -> usize {
        self.queue.len() + self.running.len()
    }

    /// CPU seconds of the jobs finished so far.
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_s
    }

    fn rate(&self) -> f64 {
        if self.running.is_empty() {
            1.0
        } else {
            (self.cores / self.running.len() as f64).min(1.0)
        }
    }

    /// Seconds from now until each running job has progressed `work` CPU-seconds (they all
    /// progress alike).
    fn time_to_progress(&self, work: f64) -> f64 {
        let Some(q) = self.quota else { return work / self.rate() };
        let (n, budget) = (self.running.len().max(1) as f64, self.cores * q.period_s);
        let (mut t, mut index, mut left, mut work) = (self.now, q.index, q.left_s, work.max(0.0));
        loop {
            let end = (index + 1.0) * q.period_s;
            let run = (left / n).min(end - t);
            if run >= work {
                return t + work - self.now;
            }
            work -= run;
            (t, index, left) = (end, index + 1.0, budget);
        }
    }

    /// Lets `dt` seconds pass, to `target` (`now + dt`, as the caller computed it: the clock
    /// lands on it exactly): the running jobs progress, the quota is spent and renewed.
    fn pass(&mut self, dt: f64, target: f64) {
        let Some(mut q) = self.quota else {
            let rate = self.rate();
            for r in &mut self.running {
                r.left_s -= dt * rate;
            }
            self.now = target;
            return;
        };
        let (n, budget) = (self.running.len() as f64, self.cores * q.period_s);
        if n == 0.0 {
            // Idle: nothing is spent; the quota is whole again once a period boundary passes.
            let index = (target / q.period_s).floor();
            if index > q.index {
                (q.index, q.left_s) = (index, budget);
            }
            self.now = target;
        }
        while self.now < target {
            let end = (q.index + 1.0) * q.period_s;
            let span = (end.min(target)) - self.now;
            let run = if n > 0.0 { (q.left_s / n).min(span) } else { 0.0 };
            for r in &mut self.running {
                r.left_s -= run;
            }
            q.left_s -= run * n;
            if end <= target {
                (self.now, q.index, q.left_s) = (end, q.index + 1.0, budget);
            } else {
                self.now = target;
            }
        }
        self.quota = Some(q);
    }

    fn fill(&mut self) {
        while self.running.len() < self.workers {
            let Some(Reverse(q)) = self.queue.pop() else { break };
            self.running.push(Running {
                job: q.job,
                start_s: self.now,
                left_s: q.job.cpu_s.max(0.0),
                seq: q.seq,
            });
        }
    }

    /// Queues `job` at time `at` (the pool first advances to `at`; an earlier `at` counts as now).
    /// Completions passed on the way are returned by later [`CpuPool::next_completion`] calls in
    /// order, so none is lost.
    pub fn submit(&mut self, at: f64, job: SimJob) {
        self.advance_to(at);
        self.queue.push(Reverse(Queued { job, seq: self.seq }));
        self.seq += 1;
        self.fill();
    }

    /// Moves the clock to `t`, finishing what finishes before (kept for `next_completion`).
    pub fn advance_to(&mut self, t: f64) {
        while t > self.now {
            match self.peek_completion() {
                Some(end) if end <= t => {
                    let d = self.complete_next();
                    self.finished.push_back(d);
                }
                _ => self.pass(t - self.now, t),
            }
        }
    }

    fn peek_completion(&self) -> Option<f64> {
        let least = self.running.iter().map(|r| r.left_s.max(0.0)).min_by(f64::total_cmp)?;
        Some(self.now + self.time_to_progress(least))
    }

    /// Finishes the running job that ends first (ties: earliest key, then submission).
    fn complete_next(&mut self) -> Done {
        let k = (0..self.running.len())
            .min_by(|&a, &b| {
                let (ra, rb) = (&self.running[a], &self.running[b]);
                ra.left_s.total_cmp(&rb.left_s).then((ra.job.key, ra.seq).cmp(&(rb.job.key, rb.seq)))
            })
            .expect("called with a running job");
        let dt = self.time_to_progress(self.running[k].left_s.max(0.0));
        self.pass(dt, self.now + dt);
        self.running[k].left_s = 0.0;
        let r = self.running.swap_remove(k);
        // Others that ended within round-off finish at the same instant, on the next call.
        for o in &mut self.running {
            if o.left_s < EPS {
                o.left_s = 0.0;
            }
        }
        self.cpu_s += r.job.cpu_s;
        self.fill();
        Done { job: r.job, start_s: r.start_s, end_s: self.now }
    }

    /// The completions already passed (by [`CpuPool::advance_to`] or a submission), without
    /// running the pool further.
    pub fn take_finished(&mut self) -> Option<Done> {
        self.finished.pop_front()
    }

    /// The next completion if it comes by `limit` (first any passed already); otherwise the
    /// clock moves to `limit` (when finite) and `None`.
    pub fn next_completion_by(&mut self, limit: f64) -> Option<Done> {
        if let Some(d) = self.finished.pop_front() {
            return Some(d);
        }
        match self.peek_completion() {
            Some(end) if end <= limit => Some(self.complete_next()),
            _ => {
                if limit.is_finite() {
                    self.advance_to(limit);
                }
                self.finished.pop_front()
            }
        }
    }

    /// The next completion, in time order (first any passed by [`CpuPool::advance_to`]); `None`
    /// when the pool is idle.
    pub fn next_completion(&mut self) -> Option<Done> {
        if let Some(d) = self.finished.pop_front() {
            return Some(d);
        }
        if self.running.is_empty() {
            return None;
        }
        Some(self.complete_next())
    }
}

/// Links between ranks: `ranks_per_node` ranks share a node; messages within a node and between
/// nodes each follow `α + bytes/β`.
#[derive(Clone, Debug, PartialEq)]
pub struct Links {
    /// Ranks per node (at least 1).
    pub ranks_per_node: usize,
    /// Within a node.
    pub intra: TransferCost,
    /// Between nodes.
    pub inter: TransferCost,
}

impl Links {
    /// The link between two ranks.
    pub fn between(&self, a: usize, b: usize) -> &TransferCost {
        let n = self.ranks_per_node.max(1);
        if a / n == b / n {
            &self.intra
        } else {
            &self.inter
        }
    }

    /// The slowest link a collective over `ranks` ranks crosses.
    pub fn widest(&self, ranks: usize) -> &TransferCost {
        if ranks > self.ranks_per_node.max(1) {
            &self.inter
        } else {
            &self.intra
        }
    }

    /// Seconds of an all-to-all-v where `sent[(from, to)]` bytes move: each rank's messages are
    /// sent one after another (α each plus bytes/β on its link) while it receives concurrently;
    /// the collective ends with its busiest rank. `pairs` are `(from, to, bytes)`.
    pub fn all_to_all_s(&self, ranks: usize, pairs: &[(usize, usize, u64)]) -> f64 {
        self.busy_s(ranks, pairs).into_iter().fold(0.0, f64::max)
    }

    /// Per rank, seconds it spends in a sparse exchange where `pairs` `(from, to, bytes)` move:
    /// its messages out one after another, while it receives concurrently (0 for ranks not in
    /// any pair).
    pub fn busy_s(&self, ranks: usize, pairs: &[(usize, usize, u64)]) -> Vec<f64> {
        let mut send = vec![0.0f64; ranks];
        let mut recv = vec![0.0f64; ranks];
        for &(from, to, bytes) in pairs {
            if from == to || from >= ranks || to >= ranks {
                continue;
            }
            let t = self.between(from, to).seconds(bytes);
            send[from] += t;
            recv[to] += t;
        }
        (0..ranks).map(|r| send[r].max(recv[r])).collect()
    }

    /// Seconds of an all-gather (or all-reduce) of `bytes_per_rank` over `ranks` ranks: a
    /// recursive-doubling tree, `⌈log2 R⌉` rounds of α, and every rank receiving everything.
    pub fn all_gather_s(&self, ranks: usize, bytes_per_rank: u64) -> f64 {
        if ranks <= 1 {
            return 0.0;
        }
        let link = self.widest(ranks);
        let rounds = (usize::BITS - (ranks - 1).leading_zeros()) as f64;
        let alpha = link.seconds(0);
        let total = bytes_per_rank.saturating_mul(ranks as u64 - 1);
        rounds * alpha + (link.seconds(total) - alpha).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(key: u64, id: u64, cpu_s: f64) -> SimJob {
        SimJob { key, id, cpu_s, tag: id }
    }

    fn drain(pool: &mut CpuPool) -> Vec<(u64, f64)> {
        let mut v = Vec::new();
        while let Some(d) = pool.next_completion() {
            v.push((d.job.id, d.end_s));
        }
        v
    }

    #[test]
    fn edf_order_on_one_worker() {
        let mut p = CpuPool::new(1, 1.0);
        p.submit(0.0, job(3, 1, 1.0));
        p.submit(0.0, job(1, 2, 1.0));
        p.submit(0.0, job(2, 3, 1.0));
        // The first submitted starts at once (the worker was idle); then EDF.
        assert_eq!(drain(&mut p), vec![(1, 1.0), (2, 2.0), (3, 3.0)]);
    }

    #[test]
    fn processor_sharing_slows_workers_beyond_the_cores() {
        // Two workers on one core: two 1-s jobs both end at 2 s.
        let mut p = CpuPool::new(2, 1.0);
        p.submit(0.0, job(1, 1, 1.0));
        p.submit(0.0, job(2, 2, 1.0));
        let d = drain(&mut p);
        assert!((d[0].1 - 2.0).abs() < 1e-9 && (d[1].1 - 2.0).abs() < 1e-9, "{d:?}");
        // A short and a long job: the short ends at 1 s (half speed), the long then runs alone.
        let mut p = CpuPool::new(2, 1.0);
        p.submit(0.0, job(1, 1, 0.5));
        p.submit(0.0, job(2, 2, 1.5));
        let d = drain(&mut p);
        assert!((d[0].1 - 1.0).abs() < 1e-9 && (d[1].1 - 2.0).abs() < 1e-9, "{d:?}");
        assert!((p.cpu_seconds() - 2.0).abs() < 1e-12);
    }

    #[test]
    fn late_submissions_and_advancing_keep_every_completion() {
        let mut p = CpuPool::new(1, 1.0);
        p.submit(0.0, job(1, 1, 1.0));
        p.submit(5.0, job(1, 2, 1.0)); // the first finished at 1 s on the way
        assert_eq!(p.now(), 5.0);
        assert_eq!(drain(&mut p), vec![(1, 1.0), (2, 6.0)]);
        assert_eq!(p.pending(), 0);
        p.advance_to(10.0);
        assert_eq!(p.next_completion(), None);
    }

    #[test]
    fn same_inputs_same_times() {
        let run = || {
            let mut p = CpuPool::new(3, 2.0);
            for i in 0..50u64 {
                p.submit(i as f64 * 0.01, job(i % 7, i, 0.013 * (1 + i % 5) as f64));
            }
            drain(&mut p)
        };
        let (a, b) = (run(), run());
        assert_eq!(a.len(), 50);
        assert_eq!(a, b);
        assert!(a.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn a_quota_runs_jobs_in_bursts_of_its_share_of_each_period() {
        // Half a core in 100-ms periods, two workers: each period's 50 ms of CPU go to both at a
        // core each (25 ms apiece), then both wait for the next period.
        let mut p = CpuPool::new(2, 0.5).with_quota_period(0.1);
        p.submit(0.0, job(1, 1, 0.05));
        p.submit(0.0, job(2, 2, 0.05));
        let d = drain(&mut p);
        assert!(d.iter().all(|&(_, end)| (end - 0.125).abs() < 1e-9), "{d:?}");
        // A job submitted after the period's share is spent waits for the next period.
        let mut p = CpuPool::new(1, 0.25).with_quota_period(0.1);
        p.submit(0.0, job(1, 1, 0.025));
        p.submit(0.05, job(1, 2, 0.01));
        let d = drain(&mut p);
        assert!((d[0].1 - 0.025).abs() < 1e-9 && (d[1].1 - 0.11).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn a_quota_keeps_the_mean_rate_and_every_job() {
        // Over many periods a quota gives the cores' rate, as processor sharing does; the
        // per-job times differ, the work done does not.
        for (workers, cores) in [(1usize, 0.375), (2, 0.5), (4, 1.5), (3, 3.0)] {
            let run = |period: f64| {
                let mut p = CpuPool::new(workers, cores).with_quota_period(period);
                for i in 0..200u64 {
                    p.submit(0.0, job(i % 5, i, 0.004 + 0.003 * (i % 7) as f64));
                }
                let d = drain(&mut p);
                assert_eq!(d.len(), 200);
                assert!(d.windows(2).all(|w| w[0].1 <= w[1].1 + 1e-12), "in time order");
                (d.last().unwrap().1, p.cpu_seconds())
            };
            let (smooth_end, cpu) = run(0.0);
            let (grained_end, grained_cpu) = run(0.1);
            assert!((cpu - grained_cpu).abs() < 1e-9);
            // The last job ends within one period of where the smooth pool ends it (the work is
            // the same; a quota only moves it inside periods).
            assert!(
                (grained_end - smooth_end).abs() <= 0.1 + 1e-9,
                "{workers} workers on {cores}: {grained_end} vs {smooth_end}"
            );
            assert!(grained_end >= cpu / cores - 0.1 - 1e-9, "never above the cores' mean rate");
        }
    }

    #[test]
    fn links_cost_collectives() {
        let links = Links {
            ranks_per_node: 2,
            intra: TransferCost::linear(1e-6, 1e10),
            inter: TransferCost::linear(1e-5, 1e9),
        };
        assert_eq!(links.all_to_all_s(4, &[]), 0.0);
        let intra = links.all_to_all_s(4, &[(0, 1, 1_000_000)]);
        let inter = links.all_to_all_s(4, &[(0, 2, 1_000_000)]);
        assert!((intra - (1e-6 + 1e-4)).abs() < 1e-12 && (inter - (1e-5 + 1e-3)).abs() < 1e-12);
        // Two messages from one rank queue behind each other.
        let two = links.all_to_all_s(4, &[(0, 2, 1_000_000), (0, 3, 1_000_000)]);
        assert!((two - 2.0 * inter).abs() < 1e-12);
        assert!(links.all_gather_s(8, 100) > links.all_gather_s(2, 100));
        assert_eq!(links.all_gather_s(1, 100), 0.0);
    }
}
