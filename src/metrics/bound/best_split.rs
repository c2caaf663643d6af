//! The best split of a small step, searched exactly: the least `max_r n_r (c0 + W_r)` over every
//! way to give the step's samples to its ranks under the realised noise `n_r` — fact 1's bound
//! itself, not a relaxation of it, where the step is small enough to search (the latent and
//! bucket workloads: two samples a rank of very different sizes, where the packing term still
//! leaves a few percent).
//!
//! Branch and bound over the partitions of the samples into at most R groups, not over
//! assignments to ranks: once the groups are made, the heaviest group goes to the fastest rank,
//! the next to the next (an exchange argument: swapping two ranks' whole batches so that the
//! faster one holds more never lengthens the step), so the ranks' order needs no search. Samples
//! go heaviest first, each to a group or to one new group; a branch is cut when the length its
//! groups give already is no shorter than the best split found, and the search ends at a split
//! as short as `lower`. It gives up after a fixed number of branches and then says nothing, so
//! what it returns is always the best split's length.
//!
//! ```
//! use datahelix::metrics::bound::best_split::best_split_s;
//!
//! // Samples of 3, 3, 2, 2, 2 s on two equal ranks: 6 s, 3 + 3 and 2 + 2 + 2.
//! assert_eq!(best_split_s(&[3.0, 3.0, 2.0, 2.0, 2.0], &[1.0, 1.0], 0.0, 0.0, f64::INFINITY), Some(6.0));
//! // On ranks of noise 1 and 1.5: 3 + 2 + 2 on the fast one (7 s), 3 + 2 on the slow (7.5 s),
//! // where the fractional split says 7.2 s.
//! let t = best_split_s(&[3.0, 3.0, 2.0, 2.0, 2.0], &[1.0, 1.5], 0.0, 0.0, f64::INFINITY).unwrap();
//! assert!((t - 7.5).abs() < 1e-12, "{t}");
//! ```

/// Steps with more samples than this are not searched (the packing term stands alone there).
pub const MAX_SAMPLES: usize = 32;

/// Branches one search may visit before it gives up.
pub const MAX_BRANCHES: u64 = 50_000;

/// The least step length of any split of `works` (noise-free seconds, any order) over ranks of
/// `noise` (each finite and positive) with per-step constant `c0`; `None` when the step is too
/// large to search or the search gave up. `upper`, when finite, is the length of a split known
/// to exist (the run's own): the search looks only for shorter ones and returns it if none is.
/// `lower` is a length no split beats (the other terms): a split that long ends the search.
pub fn best_split_s(works: &[f64], noise: &[f64], c0: f64, lower: f64, upper: f64) -> Option<f64> {
    if works.len() > MAX_SAMPLES || noise.is_empty() {
        return None;
    }
    let mut w = works.to_vec();
    w.sort_by(|a, b| b.total_cmp(a));
    let mut fastest_first = noise.to_vec();
    fastest_first.sort_by(f64::total_cmp);
    let mut search = Search {
        w: &w,
        noise: &fastest_first,
        c0,
        lower,
        groups: vec![0.0; noise.len()],
        sorted: Vec::with_capacity(noise.len()),
        best: upper,
        branches: 0,
    };
    let empty = search.length();
    search.branch(0, empty);
    (search.branches <= MAX_BRANCHES && search.best.is_finite()).then_some(search.best)
}

struct Search<'a> {
    /// Samples heaviest first.
    w: &'a [f64],
    /// The ranks' noise, fastest first.
    noise: &'a [f64],
    c0: f64,
    /// No split is shorter: one this long is the best.
    lower: f64,
    /// Work of each of the R groups on the current branch (0 for a group not yet begun).
    groups: Vec<f64>,
    /// Scratch: the groups heaviest first.
    sorted: Vec<f64>,
    /// The shortest split found (or the caller's upper bound).
    best: f64,
    branches: u64,
}

impl Search<'_> {
    /// The step length of the groups: heaviest group on the fastest rank. Groups only grow
    /// along a branch, and the length never falls when one does.
    fn length(&mut self) -> f64 {
        self.sorted.clear();
        self.sorted.extend_from_slice(&self.groups);
        self.sorted.sort_by(|a, b| b.total_cmp(a));
        self.sorted.iter().zip(self.noise).fold(0.0, |m, (&w, &n)| f64::max(m, n * (self.c0 + w)))
    }

    /// Places samples `k..`; `now` is the length of the groups so far.
    fn branch(&mut self, k: usize, now: f64) {
        self.branches += 1;
        if self.branches > MAX_BRANCHES || now >= self.best || self.best <= self.lower {
            return;
        }
        if k == self.w.len() {
            self.best = now;
            return;
        }
        // Sample k into each group; of groups of equal work (the groups not begun among them)
        // one stands for all.
        let mut children: Vec<(f64, usize)> = Vec::with_capacity(self.groups.len());
        for g in 0..self.groups.len() {
            if self.groups[..g].contains(&self.groups[g]) {
                continue;
            }
            let before = self.groups[g];
            self.groups[g] = before + self.w[k];
            children.push((self.length(), g));
            self.groups[g] = before;
        }
        children.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        for (length, g) in children {
            if length >= self.best {
                break; // the rest are no shorter
            }
            let before = self.groups[g];
            self.groups[g] = before + self.w[k];
            self.branch(k + 1, length);
            self.groups[g] = before;
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Every split of `works` over ranks of `noise`, the shortest (the reference the search and
    /// the bound's accelerator term are held to).
    pub(in crate::metrics::bound) fn every_split(works: &[f64], noise: &[f64], c0: f64) -> f64 {
        let r = noise.len();
        let mut best = f64::INFINITY;
        for code in 0..r.pow(works.len() as u32) {
            let (mut load, mut c) = (vec![c0; r], code);
            for &w in works {
                load[c % r] += w;
                c /= r;
            }
            best = best.min((0..r).map(|q| noise[q] * load[q]).fold(0.0, f64::max));
        }
        best
    }

    proptest::proptest! {
        // The search finds what trying every split finds.
        #[test]
        fn the_search_finds_the_best_split(
            works in proptest::collection::vec(0.0f64..2.0, 0..8),
            noise in proptest::collection::vec(0.5f64..2.0, 1..4),
            c0 in 0.0f64..0.5,
        ) {
            let every = every_split(&works, &noise, c0);
            let found = best_split_s(&works, &noise, c0, 0.0, f64::INFINITY).expect("small steps are searched");
            proptest::prop_assert!((found - every).abs() <= 1e-9 * every.max(1.0), "{found} vs {every}");
            // Told of a split no better than the best, it still finds the best.
            let told = best_split_s(&works, &noise, c0, 0.0, every * 1.5 + 1.0).unwrap();
            proptest::prop_assert!((told - every).abs() <= 1e-9 * every.max(1.0));
        }
    }

    #[test]
    fn steps_too_large_to_search_say_nothing() {
        assert_eq!(best_split_s(&[1.0; MAX_SAMPLES + 1], &[1.0; 8], 0.1, 0.0, f64::INFINITY), None);
        assert_eq!(best_split_s(&[1.0], &[], 0.1, 0.0, f64::INFINITY), None);
    }
}
