//! Fact 6: the fewest misses any schedule can have at a given wall time — a frontier beside the
//! sound bound, for workloads whose samples cannot be decoded inside the lookahead.
//!
//! ```
//! use datahelix::metrics::bound::misses::{Frontier, MissStep};
//!
//! // Two ranks, lookahead 1: three steps of two samples, each 1 s of accelerator work with a
//! // 3-s chain (no constant, no noise). A step's window is the step before it.
//! let step = MissStep { accel_s: 1.0, n_min: 1.0, c0: 0.0, samples: vec![(3.0, 1.0), (3.0, 1.0)] };
//! let f = Frontier::of(&[step.clone(), step.clone(), step], 2, 1, 0.001, 41).unwrap();
//! // Fastest: a 1-s first step (its window opened in the warm-up) leaves the second one's
//! // samples 2 s late, on both ranks (3 s) or on one that trains both (4 s); the third is then
//! // on time: 5 s with two misses, 6 s with one.
//! assert!(f.least_wall(2.0) > 4.6 && f.least_wall(2.0) <= 5.0);
//! assert!(f.least_wall(1.0) > 5.6 && f.least_wall(1.0) <= 6.0);
//! // No miss: the first two steps long enough for the chains after them, 3 + 3 + 1.
//! assert!(f.least_wall(0.0) > 6.6 && f.least_wall(0.0) <= 7.0);
//! assert_eq!(f.least_misses(7.0), 0.0);
//! assert!(f.least_misses(4.5) > 1.0);
//! ```
//!
//! # The derivation
//!
//! Facts 2 and 4 say when a sample of step `s` can be out at the earliest: `chain_i` after
//! `ready(s − L)`. Synchronous training adds one more: every rank asks for step `s`'s batch when
//! step `s − 1`'s gradient all-reduce ends, which is the same moment, `ready(s)`, on every rank.
//! Write `T_s = ready(s + 1) − ready(s)` (for the last measured step, its end less `ready`): the
//! wall time is `Σ T_s`, and step `s`'s window is `D_s = T_{s−L} + … + T_{s−1}`. A sample with
//! `chain_i > D_s + tolerance` makes whichever rank trains it miss, and that rank starts its
//! accelerator no sooner than its *release* `chain_i − D_s` after `ready(s)`; every rank must
//! then train its batch by `ready(s) + T_s`, at the step's least noise `n_min` at best.
//!
//! Which ranks can hold the step's samples within `T`, and how many of them must start late, is
//! a packing problem. With divisible samples it is solved by filling ranks in order of release,
//! latest first: a rank opens at its first sample's release `max(0, chain − D)` and holds
//! `T − release − n_min c0` of work (times `n_min`) before the next opens. No packing within
//! `T` opens fewer ranks, nor fewer late ones: by induction the `k`-th rank the filling opens
//! opens no later than the `k`-th latest-opening rank of any packing, so it has at least that
//! rank's room, and a packing that fit in fewer ranks would have to hold the rest of the first
//! sample the filling could not place — all of it released at least as late — in less room.
//! So `m_s(D, T)`, the late ranks that filling opens (none possible where it needs more than `R`
//! ranks or `T` is below fact 1's accelerator time), is the fewest misses step `s` can have.
//!
//! A schedule is then a step length `T_s` for every step, with at least `Σ m_s(D_s, T_s)` misses
//! in `Σ T_s`. For a price `λ` per miss, a dynamic program over the last `L` step lengths
//! (lookahead 1 or 2; the protocol's is 2) finds `F(λ) = min Σ_s (T_s + λ m_s)` on a grid of
//! step lengths, rounded in the schedule's favour: a length counts as the grid point below it
//! and opens windows as the one above, and the top point stands for every longer step. The grid
//! starts at the least of the steps' accelerator times, which no step is shorter than, so its
//! points lie closer than from 0 (each step counts short, and opens windows long, by less than
//! their spacing: on the camera originals at 64 ranks with the default 96 points, 0.111 s from
//! that floor against 0.131 s from 0). So every
//! schedule with `M` misses has wall time `W ≥ F(λ) − λM`, whatever `λ`:
//! [`Frontier::least_wall`] takes the largest over a range of prices, and
//! [`Frontier::least_misses`] turns it round. The first `L` measured steps' windows opened in
//! the warm-up: they are taken never to be late. Like fact 4, the frontier needs the simulator's
//! chains; without them (a real run) no sample is late and it says nothing.

use rayon::prelude::*;

use super::{emulator_terms, fixed_s, step_accel};
use crate::metrics::RankStep;

/// One measured step, as the frontier needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct MissStep {
    /// Fact 1's least accelerator time of the step, any split.
    pub accel_s: f64,
    /// The step's least realised noise (0 without emulator terms: then only the samples'
    /// releases count, not their accelerator work).
    pub n_min: f64,
    /// The accelerator's per-step constant (0 without emulator terms).
    pub c0: f64,
    /// The step's samples as (chain seconds, noise-free accelerator seconds).
    pub samples: Vec<(f64, f64)>,
}

impl MissStep {
    /// The step from its `ranks` records: their samples' chains and accelerator seconds, where
    /// they can be an emulator's (a record whose lists are longer than its ids, or hold a value
    /// that is negative or not finite, adds no samples: fewer samples only loosen the frontier).
    /// A chain longer than the step's decode CPU is cut to it, as fact 4 does.
    pub fn of(records: &[&RankStep], ranks: usize) -> MissStep {
        let (accel_s, _) = step_accel(records, ranks);
        let (n_min, c0) = match emulator_terms(records, ranks) {
            Some(t) => (t.iter().map(|x| x.noise).fold(f64::INFINITY, f64::min), fixed_s(&t)),
            // Without the emulator's terms no sample's accelerator time is known to be a floor.
            None => (0.0, 0.0),
        };
        let cpu_s: f64 = records.iter().map(|r| r.decode_cpu_s).sum::<f64>().max(0.0);
        let good = |v: &[f64], n: usize| v.len() <= n && v.iter().all(|x| x.is_finite() && *x >= 0.0);
        let mut samples = Vec::new();
        for r in records {
            if r.sample_chain_s.is_empty() || !good(&r.sample_chain_s, r.ids.len()) {
                continue;
            }
            let paired = r.sample_gpu_s.len() == r.sample_chain_s.len() && good(&r.sample_gpu_s, r.ids.len());
            for (j, &chain) in r.sample_chain_s.iter().enumerate() {
                samples.push((chain.min(cpu_s), if paired { r.sample_gpu_s[j] } else { 0.0 }));
            }
        }
        MissStep { accel_s, n_min, c0, samples }
    }

    /// Samples by release order: longest chain first.
    fn sorted(mut self) -> MissStep {
        self.samples.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.total_cmp(&a.1)));
        self
    }

    /// The late ranks the filling opens for a step of length `t` whose window is `d` (module
    /// docs); `None` where no packing fits: `t` below the accelerator's time, or more than
    /// `ranks` ranks needed. Samples must be in release order ([`MissStep::sorted`]).
    fn late_ranks(&self, d: f64, t: f64, ranks: usize, tolerance: f64) -> Option<u32> {
        if t < self.accel_s {
            return None;
        }
        let c0 = self.n_min * self.c0;
        let (mut opened, mut late, mut room) = (0usize, 0u32, 0.0f64);
        for &(chain, work) in &self.samples {
            let release = (chain - d).max(0.0);
            let mut left = self.n_min * work;
            // The sample is not divisible: its rank opens at its release at the latest.
            if release + c0 + left > t {
                return None;
            }
            if opened == 0 || left > room {
                // What the open rank holds of it; the rest opens ranks at its release.
                left -= if opened == 0 { 0.0 } else { room };
                loop {
                    opened += 1;
                    late += u32::from(release > tolerance);
                    room = t - release - c0;
                    if opened > ranks || room < 0.0 || (room == 0.0 && left > 0.0) {
                        return None;
                    }
                    if left <= room {
                        break;
                    }
                    left -= room;
                }
            }
            room -= left;
        }
        Some(late)
    }
}

/// One price's optimum: `cost_s = F(λ)` and the wall time and misses of the schedule that
/// reached it (on the grid).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The price of a miss, seconds.
    pub lambda_s: f64,
    /// `F(λ)`: least `wall + λ · misses` over every schedule.
    pub cost_s: f64,
    /// The optimum's wall time (grid lengths, rounded down).
    pub wall_s: f64,
    /// The optimum's misses, rank-steps.
    pub misses: f64,
    /// The optimum's step lengths (grid points, rounded down).
    pub lengths_s: Vec<f64>,
    /// The optimum's late ranks per step.
    pub late: Vec<u32>,
}

/// The frontier of a run's measured steps (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Frontier {
    /// One point per price, the first at price 0 (the least wall time, misses or not).
    pub points: Vec<Point>,
    /// Ranks.
    pub ranks: usize,
    /// Measured steps.
    pub steps: usize,
}

impl Frontier {
    /// The frontier of `steps` (in order, the measured ones) on `ranks` ranks with lookahead
    /// `lookahead` (1 or 2; `None` otherwise, or for no steps), counting a wait over
    /// `tolerance` seconds as a miss, with `grid` step lengths (at least 4; more is tighter
    /// and slower, as `grid³` a step and price).
    pub fn of(
        steps: &[MissStep],
        ranks: usize,
        lookahead: u64,
        tolerance: f64,
        grid: usize,
    ) -> Option<Frontier> {
        if steps.is_empty() || ranks == 0 || !(1..=2).contains(&lookahead) || grid < 4 {
            return None;
        }
        let steps: Vec<MissStep> = steps.iter().cloned().map(MissStep::sorted).collect();
        let top = steps
            .iter()
            .map(|s| s.accel_s + s.samples.first().map_or(0.0, |x| x.0) + s.n_min * s.c0)
            .fold(0.0, f64::max);
        // No step is shorter than the least accelerator time of any (fact 1): the grid starts
        // there, and its points fall that much closer together.
        let floor = steps.iter().map(|s| s.accel_s).fold(f64::INFINITY, f64::min).clamp(0.0, top);
        let table = Tables::of(&steps, ranks, lookahead as usize, tolerance, grid, (floor, top.max(1e-9)));
        let mean_accel = steps.iter().map(|s| s.accel_s).sum::<f64>() / steps.len() as f64;
        let unit = (mean_accel / ranks as f64).max(1e-6);
        let prices: Vec<f64> =
            std::iter::once(0.0).chain((1..PRICES).map(|k| unit * 2f64.powi(k as i32 - 5))).collect();
        let points = prices.par_iter().map(|&price| table.solve(price)).collect();
        Some(Frontier { points, ranks, steps: steps.len() })
    }

    /// The frontier of a run's steps from `warmup` on ([`Frontier::of`], [`MissStep::of`]);
    /// `ranks` as many as the run had.
    pub fn of_records(
        records: &[RankStep],
        warmup: u64,
        ranks: usize,
        lookahead: u64,
        tolerance: f64,
        grid: usize,
    ) -> Option<Frontier> {
        let mut by_step: std::collections::BTreeMap<u64, Vec<&RankStep>> = Default::default();
        for r in records.iter().filter(|r| r.step >= warmup) {
            by_step.entry(r.step).or_default().push(r);
        }
        let steps: Vec<MissStep> = by_step.values().map(|recs| MissStep::of(recs, ranks)).collect();
        Frontier::of(&steps, ranks, lookahead, tolerance, grid)
    }

    /// About how many elementary steps [`Frontier::of`] takes for `steps` steps holding
    /// `samples` samples in all on `grid` step lengths with lookahead `lookahead`: filling
    /// every sample into every window and length of its step, and a pass of the dynamic
    /// program per price.
    pub fn work(samples: usize, steps: usize, grid: usize, lookahead: u64) -> f64 {
        let (g, l) = (grid as f64, lookahead as f64);
        let tables = samples as f64 * g * (l * (g - 2.0).max(0.0) + 2.0);
        let passes = steps as f64 * g.powf(l + 1.0) * PRICES as f64;
        tables + passes
    }

    /// About how many bytes [`Frontier::of`] holds for `steps` steps on `grid` step lengths
    /// with lookahead `lookahead`: the fewest late ranks of every window and length of every
    /// step, and each price's way back through the steps (as many prices at once as threads).
    pub fn memory_bytes(steps: usize, grid: usize, lookahead: u64) -> u64 {
        let (s, g, l) = (steps as u64, grid as u64, lookahead as u32);
        let tables = s * g * (u64::from(l) * g.saturating_sub(2) + 2) * 2;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        tables.saturating_add(threads.saturating_mul(s).saturating_mul(g.saturating_pow(l)).saturating_mul(2))
    }

    /// The least wall time of any schedule with at most `misses` misses (rank-steps).
    pub fn least_wall(&self, misses: f64) -> f64 {
        self.points.iter().map(|p| p.cost_s - p.lambda_s * misses).fold(0.0, f64::max)
    }

    /// The fewest misses (rank-steps) any schedule that takes at most `wall_s` can have.
    pub fn least_misses(&self, wall_s: f64) -> f64 {
        self.points
            .iter()
            .filter(|p| p.lambda_s > 0.0)
            .map(|p| (p.cost_s - wall_s) / p.lambda_s)
            .fold(0.0, f64::max)
    }

    /// Misses as a share of the measured rank-steps.
    pub fn rate(&self, misses: f64) -> f64 {
        misses / (self.ranks * self.steps).max(1) as f64
    }

    /// Rank-steps at a miss rate.
    pub fn count(&self, rate: f64) -> f64 {
        rate * (self.ranks * self.steps) as f64
    }
}

/// Per step the fewest late ranks for each window and length on the grid.
struct Tables {
    /// `late[s][k * rows + u]`: step `s` at length index `k`, window row `u` (grid indices of the
    /// `L` steps before summed; the last row: a window that opened in the warm-up or holds a
    /// step at the top of the grid, never late). `u16::MAX`: no packing fits.
    late: Vec<Vec<u16>>,
    rows: usize,
    grid: usize,
    /// Grid point `k` is the length `floor + k·dt`.
    floor: f64,
    dt: f64,
    lookahead: usize,
}

const NONE: u16 = u16::MAX;

/// Prices a frontier is solved at: 0, then `2^-4 … 2^12` times the mean step's accelerator
/// time per rank.
const PRICES: usize = 18;

impl Tables {
    fn of(
        steps: &[MissStep],
        ranks: usize,
        lookahead: usize,
        tolerance: f64,
        grid: usize,
        (floor, top): (f64, f64),
    ) -> Tables {
        let dt = ((top - floor) / (grid - 1) as f64).max(1e-12);
        // Windows of `lookahead` lengths below the top: index sums 0 ..= lookahead (grid − 2).
        let rows = lookahead * (grid - 2) + 2;
        let never = rows - 1;
        // A late count as the table holds it (one below `NONE`, at most: fewer only loosens).
        let entry = |m: Option<u32>| m.map_or(NONE, |m| m.min(u32::from(NONE) - 1) as u16);
        let late = steps
            .par_iter()
            .map(|st| {
                let longest = st.samples.first().map_or(0.0, |x| x.0);
                let mut t = vec![NONE; grid * rows];
                for k in 0..grid {
                    let length = if k + 1 == grid { f64::INFINITY } else { floor + (k + 1) as f64 * dt };
                    let open = st.late_ranks(f64::INFINITY, length, ranks, tolerance);
                    for u in 0..rows {
                        // Rounded up: a window of lengths in [floor + i·dt, floor + (i+1)·dt) each.
                        let d = lookahead as f64 * floor + (u + lookahead) as f64 * dt;
                        t[k * rows + u] = if u == never || d > longest + tolerance {
                            entry(open)
                        } else {
                            entry(st.late_ranks(d, length, ranks, tolerance))
                        };
                    }
                }
                t
            })
            .collect();
        Tables { late, rows, grid, floor, dt, lookahead }
    }

    /// `F(λ)` and the optimum that reaches it.
    fn solve(&self, lambda: f64) -> Point {
        let (g, rows, top) = (self.grid, self.rows, self.grid - 1);
        let step_cost = |s: usize, k: usize, u: usize| -> Option<(f64, u16)> {
            let m = self.late[s][k * rows + u];
            (m != NONE).then(|| (self.floor + k as f64 * self.dt + lambda * f64::from(m), m))
        };
        // A state is the grid indices of the last `lookahead` steps, oldest first, flattened;
        // `newer` runs over the indices after the oldest. The run starts from steps at the top
        // of the grid: its first windows opened in the warm-up, never late.
        let newer = g.pow(self.lookahead as u32 - 1);
        let digits = |mut x: usize| {
            let (mut sum, mut at_top) = (0, false);
            for _ in 1..self.lookahead {
                (sum, at_top) = (sum + x % g, at_top || x % g == top);
                x /= g;
            }
            (sum, at_top)
        };
        let newer_digits: Vec<(usize, bool)> = (0..newer).map(digits).collect();
        let mut cost = vec![f64::INFINITY; g * newer];
        cost[(0..self.lookahead).fold(0, |i, _| i * g + top)] = 0.0;
        let mut next = vec![f64::INFINITY; g * newer];
        // `from[s][state]`: the oldest index of the best state before it.
        let mut from: Vec<Vec<u16>> = Vec::with_capacity(self.late.len());
        for s in 0..self.late.len() {
            next.fill(f64::INFINITY);
            let mut came = vec![0u16; g * newer];
            for (rest, &(sum, at_top)) in newer_digits.iter().enumerate() {
                for k in 0..g {
                    let (mut best, mut arg) = (f64::INFINITY, 0);
                    for x in 0..g {
                        let c = cost[x * newer + rest];
                        if !c.is_finite() {
                            continue;
                        }
                        let row = if at_top || x == top { rows - 1 } else { sum + x };
                        if let Some((dc, _)) = step_cost(s, k, row) {
                            if c + dc < best {
                                (best, arg) = (c + dc, x);
                            }
                        }
                    }
                    next[rest * g + k] = best;
                    came[rest * g + k] = arg as u16;
                }
            }
            std::mem::swap(&mut cost, &mut next);
            from.push(came);
        }
        // Back from the best last state.
        let (mut state, cost_s) =
            cost.iter().copied().enumerate().fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
        let (mut lengths_s, mut late) = (vec![0.0; from.len()], vec![0u32; from.len()]);
        if cost_s.is_finite() {
            for s in (0..from.len()).rev() {
                let (k, rest) = (state % g, state / g);
                let x = usize::from(from[s][state]);
                let (sum, at_top) = newer_digits[rest];
                let row = if at_top || x == top { rows - 1 } else { sum + x };
                lengths_s[s] = self.floor + k as f64 * self.dt;
                late[s] = u32::from(self.late[s][k * rows + row]);
                state = x * newer + rest;
            }
        }
        let misses = late.iter().map(|&m| f64::from(m)).sum::<f64>();
        Point { lambda_s: lambda, cost_s, wall_s: cost_s - lambda * misses, misses, lengths_s, late }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(samples: &[(f64, f64)]) -> MissStep {
        let work: f64 = samples.iter().map(|x| x.1).sum();
        MissStep { accel_s: work / 2.0, n_min: 1.0, c0: 0.0, samples: samples.to_vec() }.sorted()
    }

    #[test]
    fn the_filling_opens_the_latest_released_ranks_first_and_as_few_as_fit() {
        // Window 2: releases 3, 1, 0, 0 (chains 5, 3, 1, 1), a second of work each.
        let s = step(&[(1.0, 1.0), (5.0, 1.0), (3.0, 1.0), (1.0, 1.0)]);
        // In 4 s: rank one opens at 3 (holds 1), rank two at 1 (holds 3: the rest) — two late.
        assert_eq!(s.late_ranks(2.0, 4.0, 4, 0.001), Some(2));
        // In 6 s the rank opened at 3 holds three; the last sample opens an on-time rank.
        assert_eq!(s.late_ranks(2.0, 6.0, 4, 0.001), Some(1));
        // In 7 s one late rank holds all.
        assert_eq!(s.late_ranks(2.0, 7.0, 4, 0.001), Some(1));
        // A window of 5: nothing late.
        assert_eq!(s.late_ranks(5.0, 2.0, 4, 0.001), Some(0));
        // Too short for the latest sample's release and work, or fewer ranks than it needs.
        assert_eq!(s.late_ranks(2.0, 3.5, 4, 0.001), None);
        assert_eq!(s.late_ranks(2.0, 4.0, 1, 0.001), None);
        // Below the accelerator's time: nothing fits.
        assert_eq!(s.late_ranks(9.0, 1.9, 4, 0.001), None);
    }

    #[test]
    fn a_wait_within_the_tolerance_is_no_miss() {
        let s = step(&[(2.0005, 1.0), (0.0, 1.0)]);
        assert_eq!(s.late_ranks(2.0, 2.0, 2, 0.001), Some(0));
        assert_eq!(s.late_ranks(2.0, 2.0, 2, 0.0001), Some(1));
    }

    #[test]
    fn on_a_grid_that_fits_the_steps_the_frontier_is_theirs_less_a_grid_step_each() {
        // The module's example on a grid of 0.1 s (from the accelerator's 1 s to its top, 4 s,
        // over 30): the schedules of 5 s with two misses (steps of 1, 3 and 1 s), 6 s with one
        // (1, 4, 1) and 7 s with none (3, 3, 1), the 1-s steps counted exactly (the grid's
        // first point) and each longer one 0.1 s short — the 4-s one 0.2 s, as the 1-s window
        // before it opens as 1.1 s. A window rounded down instead of up fails it (checked).
        let step = MissStep { accel_s: 1.0, n_min: 1.0, c0: 0.0, samples: vec![(3.0, 1.0), (3.0, 1.0)] };
        let f = Frontier::of(&[step.clone(), step.clone(), step], 2, 1, 0.001, 31).unwrap();
        for (misses, wall) in [(2.0, 4.9), (1.0, 5.8), (0.0, 6.8)] {
            assert!((f.least_wall(misses) - wall).abs() < 1e-9, "{misses}: {}", f.least_wall(misses));
        }
        // The optimum at a high price: no miss, steps of 3, 3 and 1 s (counted 2.9, 2.9, 1).
        let calm = f.points.last().unwrap();
        assert_eq!((calm.misses, calm.late.clone()), (0.0, vec![0, 0, 0]));
        assert!(calm.lengths_s.iter().zip([2.9, 2.9, 1.0]).all(|(a, b)| (a - b).abs() < 1e-9), "{calm:?}");
    }

    #[test]
    fn the_grid_starts_at_the_accelerators_floor() {
        // The module's example on 41 points: from 1 s to 4 s they lie 0.075 s apart, and the
        // three steps together count less than three spacings short (from 0 s the points would
        // lie 0.1 s apart, and the 5-s schedule count 4.7 s: checked).
        let step = MissStep { accel_s: 1.0, n_min: 1.0, c0: 0.0, samples: vec![(3.0, 1.0), (3.0, 1.0)] };
        let f = Frontier::of(&[step.clone(), step.clone(), step], 2, 1, 0.001, 41).unwrap();
        for (misses, wall) in [(2.0, 5.0), (1.0, 6.0), (0.0, 7.0)] {
            let least = f.least_wall(misses);
            assert!(least <= wall + 1e-9 && least > wall - 3.0 * 0.075, "{misses}: {least}");
        }
        // No length an optimum counts is below the grid's first point, the accelerator's 1 s.
        for p in &f.points {
            assert!(p.lengths_s.iter().all(|&t| t >= 1.0 - 1e-9), "{:?}", p.lengths_s);
        }
    }

    #[test]
    fn the_frontier_prices_misses_against_time() {
        // Lookahead 2, one rank, steps of one sample (1 s) with a 5-s chain: with steps of 1 s
        // every step from the third waits 3 s (4 s long); with steps of 2.5 s none waits.
        let st = step(&[(5.0, 1.0)]);
        let st = MissStep { accel_s: 1.0, ..st };
        let f = Frontier::of(&vec![st; 8], 1, 2, 0.001, 60).unwrap();
        let fast = f.least_wall(8.0);
        let calm = f.least_wall(0.0);
        // With misses allowed, the accelerator's 8 s at least; without, more.
        assert!(fast >= 8.0 && fast <= f.least_wall(0.0), "{fast} {calm}");
        assert!(calm > fast, "no miss costs time: {calm} against {fast}");
        // A schedule of eight 1-s steps is out of reach: some step must wait or be longer.
        assert!(f.least_misses(8.0) > 0.0);
    }
}
