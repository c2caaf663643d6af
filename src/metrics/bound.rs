//! A lower bound on the wall time of a run's measured steps that no schedule of the same global
//! batches, CPU budget, lookahead and accelerator can beat — the denominator of `efficiency`.
//!
//! ```
//! use datahelix::metrics::bound::{wall_bound, StepBound};
//!
//! // Two steps of 1 s of accelerator work each; step 1's 6 CPU-seconds of decoding on 2 cores
//! // can start no earlier than step 1 − lookahead.
//! let steps = [
//!     StepBound { step: 3, accel_s: 1.0, floor_s: 0.1, cpu_s: 0.0, chain_s: 0.0 },
//!     StepBound { step: 4, accel_s: 1.0, floor_s: 0.1, cpu_s: 6.0, chain_s: 0.0 },
//! ];
//! assert_eq!(wall_bound(&steps, 2.0, 2), 2.0); // lookahead 2: step 4 decodes during warm-up too
//! assert_eq!(wall_bound(&steps, 2.0, 1), 3.1); // lookahead 1: 3 s of decoding from step 3's start
//!
//! // One of step 4's samples needs 2.5 s on one worker whatever the cut (fact 4): the cores
//! // cannot share that out.
//! let mut steps = steps;
//! steps[1] = StepBound { cpu_s: 2.5, chain_s: 2.5, ..steps[1] };
//! assert_eq!(wall_bound(&steps, 2.0, 1), 2.6); // 2.5 s from step 3's start, then a step
//! ```
//!
//! # The derivation
//!
//! Number the measured steps `w … S−1`. Let `ready(s)` be the first moment a rank is ready for
//! step `s` (its previous step's gradient all-reduce done; the start of the measured wall time
//! for `s = w`), and `end(s)` the moment the last rank's accelerator finishes step `s`; every
//! rank's all-reduce of step `s` ends after it, so `ready(s+1) ≥ end(s)`, and the measured wall
//! time is at least `end(S−1) − ready(w)`. Three facts hold for every schedule:
//!
//! 1. **Accelerator work.** Rank `r`'s emulated step takes `n_r (c0 + Σ_{i∈B_r} w_i)`, with its
//!    realised noise `n_r = exp(σ z(seed, step, r))` and `w_i = a·tokens_i + b·tokens_i²`
//!    (`shared/bench/PROTOCOL.md`). Every rank starts the step at or after `ready(s)`, so
//!    `end(s) ≥ ready(s) + min over splits of max_r n_r (c0 + W_r)`, and that minimum is at least
//!    each of: `max_r n_r c0` (every rank runs a step, an empty one too);
//!    `(R c0 + Σ_i w_i) / Σ_r 1/n_r` (the fractional split, from `Σ_r T/n_r ≥ Σ_r (c0 + W_r)`);
//!    `min_r n_r (c0 + max_i w_i)` (the largest sample lies whole on some rank); and the
//!    packing term: with the step's samples heaviest first, `w_(1) ≥ w_(2) ≥ …`, a step of
//!    length `T` leaves rank `r` room for `T / n_r − c0` of work, and of the `m` heaviest
//!    samples it can hold at most as many as the lightest of them fit in that room; when the
//!    ranks' counts sum below `m`, no split ends by `T` ([`packing_s`] checks `m = kR + 1`,
//!    `k = 0 … 64`, and bisects on `T`). At equal noise this is the pigeonhole bound: of the
//!    `kR + 1` heaviest some rank trains `k + 1`, at least the `k + 1` lightest of them. With two
//!    samples a rank of very different sizes (latents, buckets) the mean is well below what any
//!    split reaches, and this is not. Nor is the pairing term ([`pairing`], steps of at most four
//!    samples a rank): of the `j` heaviest, the `k` heaviest each need a rank, and a rank that
//!    holds one of them beside others needs room for both — a count of what each rank can hold,
//!    relaxed by a multiplier, that at equal noise is the classic pairing of the `k`-th heaviest
//!    with the `(2R + 1 − k)`-th. Where a step has at most 32 samples the minimum itself is
//!    searched ([`best_split`]) and, when the search ends, taken. The largest of these is the
//!    step's `accel_s`.
//!
//!    It knows the noise of every rank, which no planner does: on uniform batches a loader that
//!    splits evenly ends at `max_r n_r` times the mean, so at σ = 0.05 no real schedule reaches
//!    more than ~0.93 of this bound at 8 ranks, ~0.89 at 64, ~0.86 at 512. Where the records
//!    carry no emulator terms (a real accelerator), `accel_s` falls back to
//!    `max(Σ_r gpu_r / R, largest sample)`. Records without their samples' seconds (written
//!    before they were kept) leave out the packing and best-split terms, and a record's samples
//!    that could not be an emulator's (negative, not finite, more of them than its ids) are left
//!    out whole: the terms of any subset of the step's samples are still bounds.
//! 2. **Decode CPU, inside its lookahead.** A sample of step `j` is decoded after some rank
//!    planned step `j`, which happens once a rank has its batch of `j − L` (`L` the lookahead):
//!    after `ready(j − L)`. It is decoded before its rank's accelerator starts step `j`, so
//!    before `end(j)`. So the decodes of steps `a … s` all run inside
//!    `[ready(a − L), max(end(s−1), D_s)]`, `D_s` the end of step `s`'s last decode, on at most
//!    `C` cores: `max(end(s−1), D_s) ≥ ready(a − L) + CPU(a … s) / C`. A decode worker is
//!    single-threaded (`PROTOCOL.md`), so `C` is the cores the workers can use: per rank its
//!    budget or its worker count, whichever is less ([`super::usable_cores`]) — four ranks of
//!    one worker decode on at most four cores, however large their budgets. Only windows that open
//!    inside the measured steps (`a − L ≥ w`) are used: decodes of earlier windows may have run
//!    during the warm-up.
//! 3. **After the last decode of a step**, the rank that waited for it still trains a step:
//!    `end(s) ≥ D_s + floor_s`, with `floor_s = min_r n_r c0`.
//!
//! 4. **One target's frames are decoded in order, on one worker.** A decode worker is
//!    single-threaded (`PROTOCOL.md`, "CPU budget"), and a video target can only be reached
//!    by decoding from its keyframe through its frame: whatever the cut into pieces and however
//!    many workers are free, sample `i`'s decode ends at least `chain_i` after it starts,
//!    `chain_i` the time of its longest such run (`RankStep::sample_chain_s`); it starts after
//!    `ready(s − L)` (fact 2), and then the rank that trains `i` runs at least
//!    `n_min (c0 + w_i)`. So `end(s) ≥ ready(s − L) + chain_s + floor_s` with
//!    `chain_s = max_i (chain_i + n_min w_i)` ([`step_chain`]). The simulator knows `chain_i`
//!    (its streams' keyframes lie every `keyint` frames, priced by its decode truth without the
//!    per-frame discard term); real runs leave it out.
//!
//! Putting them together, step by step from `ready(w) = 0`:
//! `end(s) ≥ max(end(s−1) + accel_s, X_s + floor_s)` with
//! `X_s = max(max over a of (ready(a − L) + CPU(a … s) / C), ready(s − L) + chain_s)` (when
//! `X_s ≤ end(s−1)` its term is below the first anyway, since `floor_s ≤ accel_s`).
//! [`wall_bound`] computes it in one pass.
//!
//! The CPU term uses the decode CPU the run measured (its own split pieces and retries
//! included): it bounds schedules that do the same decoding work, and it can only undercount
//! (a decode filed after its step was reported is not counted), which keeps it a bound.
//!
//! # What a planner that does not see the noise can expect (fact 5)
//!
//! Fact 1 knows each rank's realised noise; no loader does: a step's split is made before its
//! noise is drawn (the emulator draws it as the step runs), and on a split that evens the work
//! the slowest rank sets the step. Against fact 1, even work on uniform batches reaches ~0.93
//! at 8 ranks and ~0.86 at 512. [`blind`] derives what a split made before the noise can
//! expect at best — the `k` most loaded ranks meet the largest of `k` factors, and by convexity
//! the mean load meets the largest of all — and, in the recursion above in place of fact 1's
//! term, a bound on the *expected* wall time: `blind_ideal_s` and
//! [`crate::metrics::Summary::blind_efficiency`], never below the sound ones. It separates a
//! planner's own slack from the noise; a run can land above it by luck.
//!
//! # What a wall time costs in misses (fact 6)
//!
//! Facts 2 and 4 also say which samples are out only after their step's batch is due, given
//! how long the steps before it took: [`misses`] turns that into a frontier, the least wall time
//! of any schedule with a given number of misses (`datahelix frontier`). Where samples cannot
//! be decoded inside the lookahead (camera originals), efficiency and misses trade against each
//! other, and the frontier says how far any schedule can take both.
//!

use super::{AccelTerms, RankStep};

pub mod best_split;
pub mod blind;
pub mod misses;
pub mod pairing;

/// What the bound needs of one measured step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepBound {
    /// The step.
    pub step: u64,
    /// The least time the accelerators need for the step's batch, any split (fact 1).
    pub accel_s: f64,
    /// The least time any rank's step takes, empty or not (fact 3).
    pub floor_s: f64,
    /// Decode CPU seconds of the step's samples, on every rank.
    pub cpu_s: f64,
    /// The longest any one of the step's samples takes on one worker, however cut (fact 4).
    pub chain_s: f64,
}

/// The accelerator terms of one step from its `ranks` records (module docs, facts 1 and 3).
pub fn step_accel(records: &[&RankStep], ranks: usize) -> (f64, f64) {
    match emulator_terms(records, ranks) {
        Some(t) => {
            let noise: Vec<f64> = t.iter().map(|x| x.noise).collect();
            // The run's own split is one split: the search looks for shorter ones only.
            let run = t.iter().map(|x| x.noise * (x.fixed_s + x.work_s)).fold(0.0, f64::max);
            let n_min = noise.iter().copied().fold(f64::INFINITY, f64::min);
            (least_split_s(records, &t, &noise, run), n_min * fixed_s(&t))
        }
        None => {
            let r_n = ranks.max(records.len()).max(1) as f64;
            let largest = records.iter().map(|r| r.max_sample_gpu_s).fold(0.0, f64::max);
            let gpu: f64 = records.iter().map(|r| r.gpu_s).sum();
            ((gpu / r_n).max(largest), 0.0)
        }
    }
}

/// The step's emulator terms, one per record, when every record has them, they are at least
/// `ranks` and each can be an emulator's (terms read from a peer's record are not trusted
/// otherwise).
fn emulator_terms(records: &[&RankStep], ranks: usize) -> Option<Vec<AccelTerms>> {
    let t: Vec<AccelTerms> = records.iter().map(|r| r.accel).collect::<Option<_>>()?;
    (!t.is_empty() && t.len() >= ranks && t.iter().all(plausible)).then_some(t)
}

fn fixed_s(terms: &[AccelTerms]) -> f64 {
    terms.iter().map(|x| x.fixed_s).fold(0.0, f64::max)
}

/// Fact 1's least step length of any split of the records' samples over ranks slowed by
/// `noise` (one factor per term of `t`); `run` is one split's length (the search's start).
fn least_split_s(records: &[&RankStep], t: &[AccelTerms], noise: &[f64], run: f64) -> f64 {
    let c0 = fixed_s(t);
    let r_n = noise.len() as f64;
    let largest = records.iter().map(|r| r.max_sample_gpu_s).fold(0.0, f64::max);
    let work: f64 = t.iter().map(|x| x.work_s).sum();
    let harmonic: f64 = noise.iter().map(|n| 1.0 / n.max(1e-300)).sum();
    let n_max = noise.iter().copied().fold(0.0, f64::max);
    let n_min = noise.iter().copied().fold(f64::INFINITY, f64::min);
    let known = (n_max * c0).max((r_n * c0 + work) / harmonic).max(n_min * (c0 + largest));
    let works = sample_works(records);
    let packed = pairing::pairing_s(&works, noise, c0, packing_s(&works, noise, c0, known));
    let best = best_split::best_split_s(&works, noise, c0, packed, run).unwrap_or(0.0);
    packed.max(best)
}

/// Fact 4's term of one step: over its samples, the largest single-worker decode (the records'
/// `sample_chain_s`) plus that sample's own accelerator work on the fastest rank, `n_min·w_i`
/// (`sample_gpu_s`, where the record has one per sample; the step's `floor_s`, `n_min·c0`, is
/// added after). A record whose list no decode could give (negative, not finite, longer than
/// its ids) is left out, and no run counts for more than the step's decode CPU, `cpu_s`.
pub fn step_chain(records: &[&RankStep], cpu_s: f64) -> f64 {
    let terms: Option<Vec<AccelTerms>> = records.iter().map(|r| r.accel).collect();
    let n_min = match terms {
        Some(t) if !t.is_empty() && t.iter().all(plausible) => {
            t.iter().map(|x| x.noise).fold(f64::INFINITY, f64::min)
        }
        _ => 0.0,
    };
    let cpu_s = cpu_s.max(0.0);
    let mut longest = 0.0f64;
    for r in records {
        let chains = &r.sample_chain_s;
        if chains.len() > r.ids.len() || !chains.iter().all(|x| x.is_finite() && *x >= 0.0) {
            continue;
        }
        let works = &r.sample_gpu_s;
        let paired = works.len() == chains.len() && works.iter().all(|x| x.is_finite() && *x >= 0.0);
        for (j, &c) in chains.iter().enumerate() {
            let own = if paired { n_min * works[j] } else { 0.0 };
            longest = longest.max(c.min(cpu_s) + own);
        }
    }
    longest
}

/// The step's samples' noise-free seconds from the records' `sample_gpu_s`, heaviest first; a
/// record whose list no emulator could give (negative, not finite, longer than its ids) is left
/// out whole.
fn sample_works(records: &[&RankStep]) -> Vec<f64> {
    let mut w: Vec<f64> = records
        .iter()
        .filter(|r| r.sample_gpu_s.len() <= r.ids.len())
        .filter(|r| r.sample_gpu_s.iter().all(|x| x.is_finite() && *x >= 0.0))
        .flat_map(|r| r.sample_gpu_s.iter().copied())
        .collect();
    w.sort_by(|a, b| b.total_cmp(a));
    w
}

/// The packing term of one step (module docs, fact 1): the least step length `T ≥ known` at
/// which the ranks' rooms, `T / noise_r − c0`, can hold the `m` heaviest of `works` (heaviest
/// first) for every `m = k·R + 1`, `k = 0 … 64` — each rank at most as many as the lightest
/// of them fit in its room. `known` is a bound already; bisection keeps its lower end at a
/// length that fails the check, so the result is a bound whatever the iterations.
///
/// ```
/// use datahelix::metrics::bound::packing_s;
///
/// // Three 1 s samples on two ranks: one rank trains two of them, whatever the split.
/// let t = packing_s(&[1.0, 1.0, 1.0], &[1.0, 1.0], 0.0, 1.5);
/// assert!((t - 2.0).abs() < 1e-9);
/// // A rank twice as slow: the fast one takes two (2 s), the slow one the third (2 s).
/// let t = packing_s(&[1.0, 1.0, 1.0], &[1.0, 2.0], 0.0, 1.0);
/// assert!((t - 2.0).abs() < 1e-9);
/// ```
pub fn packing_s(works: &[f64], noise: &[f64], c0: f64, known: f64) -> f64 {
    let mut by_noise: Vec<f64> = noise.iter().copied().filter(|n| n.is_finite() && *n > 0.0).collect();
    if works.is_empty() || by_noise.is_empty() || !known.is_finite() {
        return known;
    }
    // Fastest first: the rooms in descending order.
    by_noise.sort_by(f64::total_cmp);
    let ranks = by_noise.len();
    let prefix: Vec<f64> = std::iter::once(0.0)
        .chain(works.iter().scan(0.0, |sum, w| {
            *sum += w;
            Some(*sum)
        }))
        .collect();
    let tops: Vec<usize> = (0..=64).map(|k| k * ranks + 1).take_while(|&m| m <= works.len()).collect();
    let fits = |t: f64| {
        tops.iter().all(|&m| {
            // Σ_r (how many of the m heaviest rank r can hold) = Σ_j (ranks with room for the
            // j lightest of them together).
            let mut held = 0usize;
            for j in 1..=m {
                let need = prefix[m] - prefix[m - j];
                let roomy = by_noise.partition_point(|&n| t / n - c0 >= need);
                if roomy == 0 {
                    break;
                }
                held += roomy;
                if held >= m {
                    return true;
                }
            }
            false
        })
    };
    let (mut lo, mut hi) = (known, by_noise[ranks - 1] * (c0 + prefix[works.len()]));
    if hi <= lo || fits(lo) {
        return lo;
    }
    for _ in 0..64 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    lo
}

fn plausible(t: &AccelTerms) -> bool {
    [t.fixed_s, t.work_s].iter().all(|x| x.is_finite() && *x >= 0.0) && t.noise.is_finite() && t.noise > 0.0
}

/// The least wall time of the measured steps (ascending, consecutive or not) on `cores` cores
/// of decoding with `lookahead` steps decoded ahead (module docs).
pub fn wall_bound(steps: &[StepBound], cores: f64, lookahead: u64) -> f64 {
    let cores = cores.max(1e-9);
    // ready[k]: the bound on ready(steps[k].step); cpu_before: CPU of the steps so far / cores.
    let mut ready: Vec<f64> = Vec::with_capacity(steps.len() + 1);
    let mut cpu_before = 0.0f64;
    // The best `ready(a − L) − CPU(steps before a) / C` over the windows opened so far.
    let mut best_open = f64::NEG_INFINITY;
    let mut end = 0.0f64;
    for (k, st) in steps.iter().enumerate() {
        ready.push(end);
        let mut chained = f64::NEG_INFINITY;
        if let Some(opened) = st.step.checked_sub(lookahead) {
            if let Ok(i) = steps[..=k].binary_search_by_key(&opened, |x| x.step) {
                best_open = best_open.max(ready[i] - cpu_before);
                chained = ready[i] + st.chain_s;
            }
        }
        cpu_before += st.cpu_s / cores;
        let decoded = (best_open + cpu_before).max(chained); // X_s
        end = (end + st.accel_s).max(decoded + st.floor_s);
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(noise: f64, work: f64, largest: f64) -> RankStep {
        RankStep {
            gpu_s: (0.1 + work) * noise,
            max_sample_gpu_s: largest,
            accel: Some(AccelTerms { fixed_s: 0.1, work_s: work, noise }),
            ..RankStep::default()
        }
    }

    #[test]
    fn the_accelerator_term_takes_the_fractional_split_under_the_realised_noise() {
        // Noise 1 and 2: a split can give the slow rank a third of the work, 1.2 s in all:
        // T/1 + T/2 = 1.2 + 0.2 → T = 1.4 / 1.5.
        let (a, b) = (rec(1.0, 0.6, 0.1), rec(2.0, 0.6, 0.1));
        let (accel, floor) = step_accel(&[&a, &b], 2);
        assert!((accel - 1.4 / 1.5).abs() < 1e-12, "{accel}");
        assert!((floor - 0.1).abs() < 1e-12);
        // Every rank's c0 under its noise binds when the work is small.
        let (a, b) = (rec(1.0, 0.0, 0.0), rec(3.0, 0.0, 0.0));
        assert!((step_accel(&[&a, &b], 2).0 - 0.3).abs() < 1e-12);
        // One sample larger than the rest binds on the fastest rank.
        let (a, b) = (rec(1.0, 2.0, 2.0), rec(2.0, 0.0, 0.0));
        assert!((step_accel(&[&a, &b], 2).0 - 2.1).abs() < 1e-12);
    }

    /// The records of one split of `works` over the ranks (`split[i] mod R` trains sample i).
    #[test]
    fn a_samples_run_counts_with_its_own_work_on_the_fastest_rank() {
        let mut a = rec(1.0, 0.5, 0.5);
        (a.ids, a.sample_gpu_s, a.sample_chain_s) = (vec![1, 2], vec![0.5, 0.0], vec![1.0, 2.0]);
        let mut b = rec(2.0, 0.0, 0.0);
        (b.ids, b.sample_chain_s) = (vec![3], vec![0.5]);
        // The fastest rank's noise is 1: sample 1 takes 1.0 + 0.5, sample 2 2.0 + 0.
        assert!((step_chain(&[&a, &b], 10.0) - 2.0).abs() < 1e-12);
        // No run counts for more than the step's decode CPU.
        assert!((step_chain(&[&a, &b], 1.2) - 1.5).abs() < 1e-12);
        // A list no decode could give is left out whole.
        for lie in [vec![9.0, 9.0], vec![-1.0], vec![f64::NAN]] {
            b.sample_chain_s = lie;
            assert!((step_chain(&[&a, &b], 10.0) - 2.0).abs() < 1e-12);
        }
        // Without one work per run, the runs count alone.
        a.sample_gpu_s = vec![0.5];
        assert!((step_chain(&[&a], 10.0) - 2.0).abs() < 1e-12);
        a.sample_chain_s = vec![1.9, 0.1];
        assert!((step_chain(&[&a], 10.0) - 1.9).abs() < 1e-12);
    }

    pub(super) fn records_of(works: &[f64], split: &[u32], noise: &[f64], c0: f64) -> Vec<RankStep> {
        let r = noise.len();
        (0..r)
            .map(|q| {
                let mine: Vec<f64> =
                    works.iter().zip(split).filter(|(_, &s)| s as usize % r == q).map(|(&w, _)| w).collect();
                RankStep {
                    ids: (0..mine.len() as u64).collect(),
                    max_sample_gpu_s: mine.iter().copied().fold(0.0, f64::max),
                    accel: Some(AccelTerms { fixed_s: c0, work_s: mine.iter().sum(), noise: noise[q] }),
                    sample_gpu_s: mine,
                    ..RankStep::default()
                }
            })
            .collect()
    }

    #[test]
    fn two_of_three_samples_share_a_rank_whatever_the_split() {
        // Three 1 s samples on two ranks: the mean (1.5 s) and the largest (1 s) are below what
        // any split takes (2 s); the packing term is it.
        let records = records_of(&[1.0, 1.0, 1.0], &[0, 1, 0], &[1.0, 1.0], 0.1);
        let refs: Vec<&RankStep> = records.iter().collect();
        assert!((step_accel(&refs, 2).0 - 2.1).abs() < 1e-12);
        // Records that say nothing of their samples keep the three other terms.
        let bare: Vec<RankStep> =
            records.iter().map(|r| RankStep { sample_gpu_s: Vec::new(), ..r.clone() }).collect();
        let refs: Vec<&RankStep> = bare.iter().collect();
        assert!((step_accel(&refs, 2).0 - 1.6).abs() < 1e-12);
        // A list no emulator could give (more samples than the record's ids) is left out.
        let mut lying = records.clone();
        lying[1].sample_gpu_s = vec![9.0, 9.0];
        let refs: Vec<&RankStep> = lying.iter().collect();
        assert!((step_accel(&refs, 2).0 - 1.6).abs() < 1e-12, "only rank 0's two samples count");
        lying[1].sample_gpu_s = vec![-1.0];
        let refs: Vec<&RankStep> = lying.iter().collect();
        assert!((step_accel(&refs, 2).0 - 1.6).abs() < 1e-12);
    }

    proptest::proptest! {
        // No split of a step's samples beats its accelerator term under the realised noise:
        // the term against every split of up to 7 samples over up to 3 ranks.
        #[test]
        fn no_split_beats_the_accelerator_term(
            works in proptest::collection::vec(0.0f64..2.0, 0..8),
            noise in proptest::collection::vec(0.5f64..2.0, 1..4),
            c0 in 0.0f64..0.5,
            split in proptest::collection::vec(proptest::prelude::any::<u32>(), 8),
        ) {
            let r = noise.len();
            let records = records_of(&works, &split, &noise, c0);
            let refs: Vec<&RankStep> = records.iter().collect();
            let (term, _) = step_accel(&refs, r);
            let best = best_split::tests::every_split(&works, &noise, c0);
            proptest::prop_assert!(term <= best + 1e-9, "term {term} above the best split's {best}");
        }
    }

    #[test]
    fn terms_no_emulator_could_give_fall_back_to_the_measured_times() {
        let good = rec(1.0, 0.6, 0.1);
        for noise in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            let bad = RankStep {
                accel: Some(AccelTerms { fixed_s: 0.1, work_s: 0.6, noise }),
                ..rec(1.0, 0.6, 0.1)
            };
            let (accel, floor) = step_accel(&[&good, &bad], 2);
            assert!((accel - 0.7).abs() < 1e-12, "noise {noise}: {accel}"); // (0.7 + 0.7) / 2
            assert_eq!(floor, 0.0);
        }
    }

    #[test]
    fn without_emulator_terms_the_mean_and_largest_sample_bind() {
        let r = |gpu: f64, largest: f64| RankStep {
            gpu_s: gpu,
            max_sample_gpu_s: largest,
            ..RankStep::default()
        };
        let (a, b) = (r(0.4, 0.1), r(0.2, 0.1));
        assert!((step_accel(&[&a, &b], 2).0 - 0.3).abs() < 1e-12);
        let (a, b) = (r(0.5, 0.5), r(0.0, 0.0));
        assert!((step_accel(&[&a, &b], 2).0 - 0.5).abs() < 1e-12);
    }

    #[test]
    fn decoding_cannot_start_before_its_window_opens() {
        let st =
            |step, accel, cpu| StepBound { step, accel_s: accel, floor_s: 0.0, cpu_s: cpu, chain_s: 0.0 };
        // Accelerator-bound: the sum of the steps.
        assert_eq!(wall_bound(&[st(0, 1.0, 0.5), st(1, 1.0, 0.5), st(2, 1.0, 0.5)], 1.0, 1), 3.0);
        // CPU-bound at lookahead 1: step 1's 4 CPU-s start at ready(0) = 0, step 2's at ready(1).
        let b = wall_bound(&[st(0, 0.1, 0.0), st(1, 0.1, 4.0), st(2, 0.1, 4.0)], 2.0, 1);
        assert!((b - 4.0).abs() < 1e-12, "{b}"); // 8 CPU-s on 2 cores from 0
                                                 // Lookahead 3: every window opens before the measured steps (decoded during the warm-up).
        let b = wall_bound(&[st(0, 0.1, 0.0), st(1, 0.1, 4.0), st(2, 0.1, 4.0)], 2.0, 3);
        assert!((b - 0.3).abs() < 1e-12, "{b}");
        // Never below the accelerator's sum, whatever the CPU.
        let b = wall_bound(&[st(5, 2.0, 0.0), st(6, 2.0, 0.1)], 1.0, 1);
        assert_eq!(b, 4.0);
    }
}
