//! Fact 5 of the bound: what a loader that splits a step before its noise is drawn can expect
//! of the step at best — every loader does (the emulator draws the noise as the step runs), so
//! this separates a planner's own slack from the noise that fact 1 knows and no planner does.
//!
//! ```
//! use datahelix::metrics::bound::blind::{blind_step_accel, NoiseLaw};
//! use datahelix::metrics::{AccelTerms, RankStep};
//!
//! // Two ranks of 1 s each (c0 = 0) drew factors 0.9 and 1.1. Fact 1, knowing which rank drew
//! // which, allows 1.048 s (the fractional split); a loader that splits before the draw meets
//! // the slower factor on its even split: 1.1 s.
//! let rec = |noise| RankStep {
//!     accel: Some(AccelTerms { fixed_s: 0.0, work_s: 1.0, noise }),
//!     ..RankStep::default()
//! };
//! let (a, b) = (rec(0.9), rec(1.1));
//! let law = NoiseLaw::of([[&a, &b].as_slice()], 2).unwrap();
//! assert!((law.max_of(1) - 1.0).abs() < 1e-12 && (law.max_of(2) - 1.1).abs() < 1e-12);
//! assert!((blind_step_accel(&[&a, &b], 2, &law).unwrap() - 1.1).abs() < 1e-12);
//! ```
//!
//! # Why it bounds the expected step
//!
//! Take a split fixed before the noise, rank loads `L_r = c0 + W_r`, and noise independent and
//! identically distributed over ranks (the emulator's `exp(σ z(seed, step, rank))`). Write
//! `M_k = E[max of k ranks' factors]`, nondecreasing in `k`.
//!
//! - **Any `k` most loaded ranks.** With the loads sorted, `L_(1) ≥ L_(2) ≥ …`, the step is at
//!   least the slowest of the `k` most loaded ranks, each carrying at least `L_(k)`, and which
//!   ranks those are does not depend on the noise: `E[T] ≥ L_(k) · M_k` for every `k`. So
//!   `E[T] ≥ min over splits of max_k L_(k) M_k`, which is fact 1's least step length with rank
//!   factors `M_1 ≤ M_2 ≤ … ≤ M_R` (fact 1 pairs the heaviest load with the smallest factor), and
//!   each of fact 1's terms bounds that minimum for any factors (`least_split_s` in `metrics::bound`).
//! - **Convexity.** `f(L) = E[max_r n_r L_r]` is convex in `L` and unchanged by permuting the
//!   ranks, so it is at least its value at the mean of `L`'s permutations, the even split:
//!   `E[T] ≥ L̄ · M_R`, `L̄ = c0 + Σ w / R` (the first term's fractional part only gives
//!   `(R c0 + Σ w) / Σ_k 1/M_k`, lower).
//!
//! The larger of the two is [`blind_step_accel`]. `M_k` is estimated from the run's own factors
//! ([`NoiseLaw`]): per step, the mean over every `k` of its ranks of their largest factor (an
//! unbiased estimate of `M_k`), averaged over the steps. In the recursion of facts 2–4 it gives
//! a bound on the expected wall time (by Jensen, `E[max(a, b)] ≥ max(E[a], E[b])`), not on each
//! run: a run can land above it by luck, where its heavier steps happen to draw milder factors
//! than the run's mean. A planner that saw the noise could beat it; none does.

use super::{emulator_terms, fixed_s, least_split_s};
use crate::metrics::RankStep;

/// Counts of ranks `k` at which [`NoiseLaw`] estimates `M_k` exactly: every `k` up to this, then
/// a geometric ladder (between its rungs `M_k` takes the rung below: `M` grows with `k`, so the
/// estimate stays low).
const EVERY_COUNT_UP_TO: usize = 64;
/// The ladder's ratio above [`EVERY_COUNT_UP_TO`].
const LADDER_RATIO: f64 = 1.05;
/// Weights below this are left out of a step's estimate (the largest of `k` among `R` is one of
/// the few largest factors once `k` is large).
const NEGLIGIBLE_WEIGHT: f64 = 1e-15;

/// The run's noise as a planner that does not see it meets it: per count of ranks `k`, the
/// expected largest factor among `k` ranks, `M_k` (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct NoiseLaw {
    /// `max_of[k − 1]` estimates `M_k`, for `k = 1 …` the most ranks a step had.
    max_of: Vec<f64>,
}

impl NoiseLaw {
    /// From the records of each step (`steps`, each with at least `ranks` records); `None` when
    /// no step has emulator terms.
    pub fn of<'a>(steps: impl IntoIterator<Item = &'a [&'a RankStep]>, ranks: usize) -> Option<NoiseLaw> {
        let mut sums: Vec<f64> = Vec::new();
        let mut counts: Vec<usize> = Vec::new();
        for records in steps {
            let Some(t) = emulator_terms(records, ranks) else { continue };
            let mut factors: Vec<f64> = t.iter().map(|x| x.noise).collect();
            factors.sort_by(f64::total_cmp);
            let r = factors.len();
            if sums.len() < r {
                sums.resize(r, 0.0);
                counts.resize(r, 0);
            }
            for k in ladder(r) {
                sums[k - 1] += mean_largest_of(&factors, k);
                counts[k - 1] += 1;
            }
        }
        let mut max_of = Vec::with_capacity(sums.len());
        let mut rung = None;
        for k in 0..sums.len() {
            if counts[k] > 0 {
                rung = Some(sums[k] / counts[k] as f64);
            }
            max_of.push(rung?);
        }
        // Steps of fewer ranks fill fewer rungs; the estimate of a count is kept no higher than
        // that of any count above it.
        for k in (0..max_of.len().saturating_sub(1)).rev() {
            max_of[k] = max_of[k].min(max_of[k + 1]);
        }
        (!max_of.is_empty()).then_some(NoiseLaw { max_of })
    }

    /// The estimate of `M_k` (the largest count known for larger `k`; 0 for `k = 0`).
    pub fn max_of(&self, k: usize) -> f64 {
        match k {
            0 => 0.0,
            k => self.max_of[k.min(self.max_of.len()) - 1],
        }
    }
}

/// The counts `1 … r` at which `M_k` is estimated: every one up to [`EVERY_COUNT_UP_TO`], then
/// rungs [`LADDER_RATIO`] apart, and `r` itself.
fn ladder(r: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = (1..=r.min(EVERY_COUNT_UP_TO)).collect();
    let mut k = EVERY_COUNT_UP_TO as f64;
    while (k as usize) < r {
        k = (k * LADDER_RATIO).ceil();
        ks.push((k as usize).min(r));
    }
    ks.dedup();
    ks
}

/// The mean over every `k` of `sorted`'s values (ascending) of their largest: the `j`-th
/// smallest is the largest of `C(j − 1, k − 1)` of the `C(R, k)` sets, a weight that falls by
/// `(j − k) / (j − 1)` from `j` to `j − 1`, starting at `k / R` for the largest.
fn mean_largest_of(sorted: &[f64], k: usize) -> f64 {
    let r = sorted.len();
    if k == 0 || k > r {
        return 0.0;
    }
    let mut weight = k as f64 / r as f64;
    let mut sum = 0.0;
    for j in (k..=r).rev() {
        sum += weight * sorted[j - 1];
        if j == k {
            break;
        }
        weight *= (j - k) as f64 / (j - 1) as f64;
        if weight < NEGLIGIBLE_WEIGHT {
            break;
        }
    }
    sum
}

/// Fact 5's accelerator term of one step: the least length a split made without seeing the
/// step's noise can expect (module docs), from `law`'s `M_k`. `None` without emulator terms (a
/// real accelerator: fact 1's term stands).
pub fn blind_step_accel(records: &[&RankStep], ranks: usize, law: &NoiseLaw) -> Option<f64> {
    let t = emulator_terms(records, ranks)?;
    let r = t.len();
    // Rank factors M_1 ≤ … ≤ M_R: the k-th most loaded rank meets M_k.
    let factors: Vec<f64> = (1..=r).map(|k| law.max_of(k)).collect();
    let mut loads: Vec<f64> = t.iter().map(|x| x.fixed_s + x.work_s).collect();
    loads.sort_by(|a, b| b.total_cmp(a));
    // The run's own split is one split: the search looks for shorter ones only.
    let run = loads.iter().zip(&factors).map(|(l, m)| l * m).fold(0.0, f64::max);
    let most_loaded = least_split_s(records, &t, &factors, run);
    let mean_load = fixed_s(&t) + t.iter().map(|x| x.work_s).sum::<f64>() / r as f64;
    Some(most_loaded.max(mean_load * law.max_of(r)))
}

#[cfg(test)]
mod tests {
    use super::super::tests::records_of;
    use super::*;

    #[test]
    fn the_mean_largest_of_k_counts_every_set_once() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // k = 2: the six pairs' largest are 2, 3, 4, 3, 4, 4.
        assert!((mean_largest_of(&v, 2) - 20.0 / 6.0).abs() < 1e-12);
        assert!((mean_largest_of(&v, 1) - 2.5).abs() < 1e-12);
        assert!((mean_largest_of(&v, 4) - 4.0).abs() < 1e-12);
        // Large counts: only the top of the factors matters, and the ladder keeps its ends.
        let many: Vec<f64> = (0..4096).map(|i| i as f64).collect();
        assert!((mean_largest_of(&many, 4096) - 4095.0).abs() < 1e-9);
        let l = ladder(4096);
        assert_eq!((l[0], l[63], *l.last().unwrap()), (1, 64, 4096));
        assert!(l.windows(2).all(|p| p[0] < p[1]));
    }

    /// Every order of `draws`' factors over the ranks: the empirical law of a noise that is
    /// the same for every rank, under which fact 5's expectations hold exactly.
    fn permuted(draws: &[Vec<f64>]) -> Vec<Vec<f64>> {
        fn orders(r: usize) -> Vec<Vec<usize>> {
            if r == 0 {
                return vec![vec![]];
            }
            let mut all = Vec::new();
            for o in orders(r - 1) {
                for at in 0..r {
                    let mut o = o.clone();
                    o.insert(at, r - 1);
                    all.push(o);
                }
            }
            all
        }
        let r = draws.first().map_or(0, Vec::len);
        draws
            .iter()
            .flat_map(|d| orders(r).into_iter().map(move |o| o.iter().map(|&q| d[q]).collect()))
            .collect()
    }

    proptest::proptest! {
        // A split made before the noise is drawn cannot expect to end before the blind term,
        // nor can a bad one: the expectation over the draws in every order of ranks.
        #[test]
        fn no_split_made_before_the_noise_expects_to_beat_the_blind_term(
            works in proptest::collection::vec(0.0f64..2.0, 0..8),
            ranks in 1usize..5,
            c0 in 0.0f64..0.5,
            split in proptest::collection::vec(proptest::prelude::any::<u32>(), 8),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let mut rng = crate::rng::Rng(seed);
            let draws: Vec<Vec<f64>> =
                (0..3).map(|_| (0..ranks).map(|_| (0.3 * rng.normal()).exp()).collect()).collect();
            // The step under each draw: the law's estimates are the draws' own.
            let steps: Vec<Vec<RankStep>> =
                permuted(&draws).iter().map(|d| records_of(&works, &split, d, c0)).collect();
            let refs: Vec<Vec<&RankStep>> = steps.iter().map(|s| s.iter().collect()).collect();
            let law = NoiseLaw::of(refs.iter().map(Vec::as_slice), ranks).unwrap();
            let term = blind_step_accel(&refs[0], ranks, &law).unwrap();
            let expected = steps
                .iter()
                .map(|s| s.iter().map(|r| r.accel.unwrap()).map(|t| t.noise * (c0 + t.work_s)).fold(0.0, f64::max))
                .sum::<f64>() / steps.len() as f64;
            proptest::prop_assert!(term <= expected + 1e-9, "blind term {term} above the split's expected {expected}");
        }
    }

    #[test]
    fn the_most_loaded_ranks_meet_the_noise_of_as_many() {
        // Three ranks, factors 0.9, 1.0, 1.1 in some order: M_1 = 1.0, M_2 = (1.0 + 1.1 + 1.1)
        // / 3, M_3 = 1.1. Samples of 2, 1, 1 (c0 = 0): the split 2 | 1 | 1 expects
        // max(2 · 1.0, 1 · M_2, 1 · M_3) = 2.0 — and the even-load term 4/3 · 1.1 is lower.
        let records = records_of(&[2.0, 1.0, 1.0], &[0, 1, 2], &[0.9, 1.0, 1.1], 0.0);
        let refs: Vec<&RankStep> = records.iter().collect();
        let law = NoiseLaw::of([refs.as_slice()], 3).unwrap();
        assert!((law.max_of(2) - 3.2 / 3.0).abs() < 1e-12);
        assert!((blind_step_accel(&refs, 3, &law).unwrap() - 2.0).abs() < 1e-12);
        // Samples of 1, 1, 1, 1: some rank holds two (2 · M_1 = 2.0), else the mean load 4/3
        // meets M_3: max(2.0, 1.467) = 2.0.
        let records = records_of(&[1.0; 4], &[0, 1, 2, 0], &[0.9, 1.0, 1.1], 0.0);
        let refs: Vec<&RankStep> = records.iter().collect();
        assert!((blind_step_accel(&refs, 3, &law).unwrap() - 2.0).abs() < 1e-9);
        // Without emulator terms there is no blind term.
        let real = RankStep { gpu_s: 1.0, ..RankStep::default() };
        assert_eq!(blind_step_accel(&[&real], 1, &law), None);
    }
}
