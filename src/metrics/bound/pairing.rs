//! The pairing term of fact 1: where a step has at most a few samples a rank, some rank must
//! train one of the heaviest beside another — the term the packing count misses when two samples
//! a rank differ by orders of magnitude (latents, buckets) and the step is too large for the
//! exact search ([`super::best_split`]).
//!
//! ```
//! use datahelix::metrics::bound::pairing::pairing_s;
//!
//! // Samples of 10, 9, 1, 1 s on two equal ranks: the mean says 10.5 s, the pigeonhole count
//! // 10 s; but the 10 s sample shares its rank with another (11 s), or the other rank holds
//! // three (11 s).
//! let t = pairing_s(&[10.0, 9.0, 1.0, 1.0], &[1.0, 1.0], 0.0, 10.5);
//! assert!((t - 11.0).abs() < 1e-9, "{t}");
//! ```
//!
//! # Why it is a bound
//!
//! A step of length `T` leaves rank `r` room `ρ_r = T / n_r − c0` for its samples' work. Take the
//! `j` heaviest samples (heaviest first, `w_1 ≥ w_2 ≥ …`) and call the `k` heaviest of them big
//! and the other `j − k` small. A rank holding `h` big and `s` small ones carries at least
//! `B_h + S_s`, the `h` lightest big and the `s` lightest small, so it holds `h` big ones and at
//! most `c_r(h) = h + max{s ≤ j − k : B_h + S_s ≤ ρ_r}` of the `j`. Any split that ends by `T`
//! places all `j` with `Σ h_r = k`, so for every `λ ≥ 0`
//! `j ≤ Σ_r c_r(h_r) = Σ_r (c_r(h_r) + λ h_r) − λ k ≤ Σ_r max_h (c_r(h) + λ h) − λ k`.
//! Where the right side is below `j`, no split ends by `T`. With `k = 2R + 1 − j` and `λ = 1`
//! this is the pairing argument at equal noise (the optimum of `n ≤ 2R` samples pairs the `k`-th
//! heaviest with the `(2R + 1 − k)`-th): either a big one shares its rank within the `j`, or the
//! small ones crowd three to a rank. With `k = 0` it is the count alone: of the `j ≤ R`
//! heaviest, `j` ranks need room for the `j`-th (the largest samples on the fastest ranks, one
//! each — where one sample a rank sets the step, as Open-Sora-Plan's largest latents do).
//! [`pairing_s`] checks `j = 1 … min(n, R)` with `k = 0`, `j = R + 1 … min(n, 2R)` with
//! `k = 2R + 1 − j`, and every pair of the sharpest drops between sample sizes (buckets), each
//! with `λ ∈ {0, 1, 2}`, and bisects on `T` as the packing term does; every check it leaves out
//! only weakens the term, so it stays a bound.

/// Steps with more samples than this many a rank are not checked: there the mean or the packing
/// count binds, and the check would cost more than it finds.
pub const MAX_PER_RANK: usize = 4;

/// Cuts between sample sizes whose pairs are checked, besides the pairing argument's.
const MAX_CUTS: usize = 24;

/// Combinations `(h, s)` one check enumerates before it leaves that `j` out (a room that holds
/// many of the heaviest samples: the count terms bind there).
const MAX_COMBOS: usize = 256;

/// The least step length `T ≥ known` at which no check of the module docs fails, for samples of
/// `works` seconds (heaviest first) on ranks of `noise` with per-step constant `c0`; `known`
/// when the step has more than [`MAX_PER_RANK`] samples a rank, or when it already passes.
/// Bisection keeps its lower end at a length that fails a check.
pub fn pairing_s(works: &[f64], noise: &[f64], c0: f64, known: f64) -> f64 {
    let mut by_noise: Vec<f64> = noise.iter().copied().filter(|n| n.is_finite() && *n > 0.0).collect();
    let ranks = by_noise.len();
    if ranks == 0 || works.len() <= ranks || works.len() > MAX_PER_RANK * ranks || !known.is_finite() {
        return known;
    }
    if !works.iter().all(|w| w.is_finite() && *w >= 0.0) || works.windows(2).any(|p| p[0] < p[1]) {
        return known;
    }
    // Slowest first: rooms ascending, for counting the ranks with room for a combination.
    by_noise.sort_by(|a, b| b.total_cmp(a));
    let checks = Checks::new(works, ranks);
    let (mut lo, mut hi) = (known, by_noise[0] * (c0 + works.iter().sum::<f64>()));
    if hi <= lo || checks.pass(&by_noise, c0, lo) {
        return lo;
    }
    // To a part in 10⁹ of the step (each check costs ~R combinations at 16,384 ranks).
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi || hi - lo <= 1e-9 * hi {
            break;
        }
        if checks.pass(&by_noise, c0, mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    lo
}

/// The checks of one step: its samples (heaviest first) and the `(j, k)` pairs checked.
struct Checks<'a> {
    works: &'a [f64],
    pairs: Vec<(usize, usize)>,
}

impl<'a> Checks<'a> {
    /// The pairing argument's `(j, 2R + 1 − j)`, and every pair of the [`MAX_CUTS`] sharpest
    /// cuts: where the weights fall most between the `m`-th heaviest and the next, a set of
    /// buckets' sizes (where the binding `k` and `j` lie, measured: Open-Sora's buckets at 64
    /// ranks bound at `j` ≈ 1.5 R, `k` ≈ 0.5–0.8 R).
    fn new(works: &'a [f64], ranks: usize) -> Self {
        let n = works.len();
        // `k = 0`: the count alone — of the `j ≤ R` heaviest, `j` ranks need room for the `j`-th
        // (the largest samples on the fastest ranks, one each).
        let mut pairs: Vec<(usize, usize)> = (1..=n.min(ranks)).map(|j| (j, 0)).collect();
        pairs.extend((ranks + 1..=n.min(2 * ranks)).map(|j| (j, 2 * ranks + 1 - j)));
        let mut drops: Vec<(f64, usize)> = (1..n)
            .filter(|&m| works[m - 1] > works[m])
            .map(|m| (works[m - 1] / works[m].max(f64::MIN_POSITIVE), m))
            .collect();
        drops.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut cuts: Vec<usize> = drops.iter().take(MAX_CUTS).map(|d| d.1).collect();
        cuts.sort_unstable();
        for &j in cuts.iter().chain(std::iter::once(&n)).filter(|&&j| j > ranks) {
            pairs.extend(cuts.iter().filter(|&&k| k < j).map(|&k| (j, k)));
        }
        Checks { works, pairs }
    }

    /// Whether every check passes at length `t` (`noise` slowest first).
    fn pass(&self, noise: &[f64], c0: f64, t: f64) -> bool {
        let rooms: Vec<f64> = noise.iter().map(|n| t / n - c0).collect(); // ascending
        let Some(&widest) = rooms.last() else { return true };
        if rooms[0] < 0.0 {
            return false; // some rank's empty step is longer than t
        }
        let roomy = |need: f64| rooms.len() - rooms.partition_point(|&room| room < need);
        let mut combos: Vec<(f64, u32, u32)> = Vec::new();
        for &(j, k) in &self.pairs {
            let (big, small) = (&self.works[..k], &self.works[k..j]);
            combos.clear();
            // (B_h + S_s, h, s) for every combination some room holds.
            let mut b_h = 0.0;
            'h: for h in 0..=k {
                if h > 0 {
                    b_h += big[k - h];
                }
                if b_h > widest {
                    break;
                }
                let mut s_s = 0.0;
                for s in 0..=small.len() {
                    if s > 0 {
                        s_s += small[small.len() - s];
                    }
                    if b_h + s_s > widest {
                        break;
                    }
                    if combos.len() == MAX_COMBOS {
                        break 'h;
                    }
                    combos.push((b_h + s_s, h as u32, s as u32));
                }
            }
            if combos.len() == MAX_COMBOS {
                continue; // left out: only weakens the term
            }
            combos.sort_by(|a, b| a.0.total_cmp(&b.0));
            for lambda in [0u32, 1, 2] {
                // Σ_r max over the combinations rank r has room for of h (1 + λ) + s, as the
                // running maximum's steps times the ranks with room for each.
                let (mut best, mut total) = (0u64, 0u64);
                for &(need, h, s) in &combos {
                    let v = (h * (1 + lambda) + s) as u64;
                    if v > best {
                        total += (v - best) * roomy(need) as u64;
                        best = v;
                    }
                }
                if total < (j + lambda as usize * k) as u64 {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_pairs_the_heaviest_with_the_lightest_at_equal_noise() {
        // 10, 9, 6, 6 on two equal ranks: the mean says 15.5 s, the pigeonhole count (two of
        // the three heaviest share) 15 s; the best split is 10 + 6 and 9 + 6, 16 s.
        let t = pairing_s(&[10.0, 9.0, 6.0, 6.0], &[1.0; 2], 0.0, 15.5);
        assert!((t - 16.0).abs() < 1e-9, "{t}");
    }

    #[test]
    fn a_faster_rank_can_take_the_pair() {
        // 10, 9, 1, 1 on ranks of noise 0.5 and 1: 10 + 9 on the fast one (9.5 s), 1 + 1 on
        // the slow one (2 s) — the term must not claim more than that split takes.
        let t = pairing_s(&[10.0, 9.0, 1.0, 1.0], &[0.5, 1.0], 0.0, 1.0);
        assert!(t <= 9.5 + 1e-9, "{t}");
    }

    #[test]
    fn steps_of_many_samples_a_rank_are_left_to_the_other_terms() {
        let works = vec![1.0; 5 * 2];
        assert_eq!(pairing_s(&works, &[1.0, 1.0], 0.0, 3.0), 3.0);
    }

    proptest::proptest! {
        // No split beats the term: against every split of up to 8 samples over up to 4 ranks.
        #[test]
        fn no_split_beats_the_pairing_term(
            mut works in proptest::collection::vec(0.0f64..4.0, 0..9),
            noise in proptest::collection::vec(0.5f64..2.0, 1..5),
            c0 in 0.0f64..0.5,
        ) {
            works.sort_by(|a, b| b.total_cmp(a));
            let term = pairing_s(&works, &noise, c0, 0.0);
            let best = super::super::best_split::tests::every_split(&works, &noise, c0);
            proptest::prop_assert!(term <= best + 1e-9, "term {term} above the best split's {best}");
        }
    }
}
