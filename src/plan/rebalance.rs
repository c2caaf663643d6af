//! Cost-gated rebalancing of decoded tensors.
//!
//! After decoding, each sample's real token count and tensor size are known (all-gathered, a few
//! bytes each). Every rank computes the same greedy sequence of moves off the most-loaded rank
//! (each tensor moves at most once, from the rank that decoded it for training);
//! of its prefixes it keeps the one with the largest net gain — predicted cut of the step's
//! maximum accelerator time minus the predicted all-to-all time, with a safety margin — and runs
//! it only if that net gain is positive. The decision and both predictions are recorded.
//!
//! ```
//! use datahelix::cost::accel::AccelModel;
//! use datahelix::plan::rebalance::{rebalance, Decoded};
//! use datahelix::plan::TransferCost;
//!
//! let accel = AccelModel { c0: 0.0, a: 1e-3, b: 0.0 };
//! let samples = [
//!     Decoded { id: 1, owner: 0, tokens: 900, bytes: 1_000 },
//!     Decoded { id: 2, owner: 0, tokens: 900, bytes: 1_000 },
//!     Decoded { id: 3, owner: 1, tokens: 100, bytes: 1_000 },
//! ];
//! // A fast link: moving sample 2 cuts the max from 1.8 s to 0.9 s for microseconds of transfer.
//! let d = rebalance(&samples, 2, &accel, &TransferCost::linear(1e-5, 1e9), 0.1);
//! assert!(d.run);
//! assert_eq!(d.moves.len(), 1);
//! // A link that takes 10 s per tensor: not worth it.
//! assert!(!rebalance(&samples, 2, &accel, &TransferCost::linear(10.0, 1e9), 0.1).run);
//! ```

use serde::Serialize;

use super::{ns, TransferCost};
use crate::cost::accel::AccelModel;

/// A decoded sample as the rebalance sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Sample id (ties).
    pub id: u64,
    /// The rank holding its tensor (and training it, unless moved).
    pub owner: u32,
    /// Its actual token count.
    pub tokens: u64,
    /// Its tensor's bytes.
    pub bytes: u64,
}

/// One move of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Move {
    /// Index into the input samples.
    pub sample: usize,
    /// From rank.
    pub from: u32,
    /// To rank.
    pub to: u32,
}

/// The gate's decision, with the predictions it was made on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// Whether to run the all-to-all.
    pub run: bool,
    /// The moves (empty when not run).
    pub moves: Vec<Move>,
    /// Predicted largest accelerator seconds without rebalancing.
    pub max_before_s: f64,
    /// Predicted largest accelerator seconds after the candidate moves (when `run` is false, the
    /// whole greedy sequence that lost to its cost; it is not run).
    pub max_after_s: f64,
    /// `max_before_s - max_after_s`.
    pub gain_s: f64,
    /// Predicted all-to-all seconds of the candidate moves.
    pub transfer_s: f64,
}

/// Predicted all-to-all seconds of these moves: the busiest rank's messages (α each) plus its
/// larger of sent and received bytes over β (a rank sends and receives concurrently), per class
/// of link when the model tells a node's links from the network's (the two classes one after
/// the other: a conservative sum).
pub fn all_to_all_seconds(samples: &[Decoded], moves: &[Move], ranks: usize, transfer: &TransferCost) -> f64 {
    if moves.is_empty() {
        return 0.0;
    }
    // Per rank and class (0: within its node, 1: between nodes).
    let mut sent = vec![[0u64; 2]; ranks];
    let mut received = vec![[0u64; 2]; ranks];
    let mut messages = vec![[0u32; 2]; ranks];
    for m in moves {
        let (from, to) = (m.from as usize, m.to as usize);
        if from >= ranks || to >= ranks {
            continue;
        }
        let class = usize::from(!transfer.same_node(from, to));
        let b = samples[m.sample].bytes;
        sent[from][class] += b;
        received[to][class] += b;
        messages[from][class] += 1;
    }
    let class_s = |class: usize, bytes: u64| {
        if class == 0 {
            transfer.seconds_near(bytes)
        } else {
            transfer.seconds(bytes)
        }
    };
    (0..ranks)
        .map(|r| {
            (0..2)
                .map(|c| {
                    let bytes = sent[r][c].max(received[r][c]);
                    if bytes == 0 && messages[r][c] == 0 {
                        return 0.0;
                    }
                    class_s(c, bytes) + class_s(c, 0) * messages[r][c].saturating_sub(1) as f64
                })
                .sum::<f64>()
        })
        .fold(0.0, f64::max)
}

/// Computes the gated rebalance. `margin` is the fraction by which the gain must exceed the
/// predicted transfer (0.1: gain > 1.1 × transfer).
pub fn rebalance(
    samples: &[Decoded],
    ranks: usize,
    accel: &AccelModel,
    transfer: &TransferCost,
    margin: f64,
) -> Decision {
    rebalance_above(samples, ranks, accel, transfer, margin, 0.0)
}

/// [`rebalance`] of a step that cannot end before `floor_s` seconds of sample work (the CPUs'
/// pace the plan stretched it to, [`super::batching::stretch`]): loads up to it cost nothing,
/// so cutting the largest load below it gains nothing and moves no tensor (the decision's
/// maxima are reported with the floor).
pub fn rebalance_above(
    samples: &[Decoded],
    ranks: usize,
    accel: &AccelModel,
    transfer: &TransferCost,
    margin: f64,
    floor_s: f64,
) -> Decision {
    let w: Vec<i64> = samples.iter().map(|s| ns(accel.sample_seconds(s.tokens))).collect();
    let mut load = vec![0i64; ranks];
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); ranks];
    for (i, s) in samples.iter().enumerate() {
        if (s.owner as usize) < ranks {
            load[s.owner as usize] += w[i];
            held[s.owner as usize].push(i);
        }
    }
    let floor = ns(floor_s.max(0.0));
    let max_of = |l: &[i64]| l.iter().copied().max().unwrap_or(0).max(floor);
    let before = max_of(&load);
    let mut moves: Vec<Move> = Vec::new();
    let mut maxima = vec![before];
    for _ in 0..samples.len() {
        let m = (0..ranks).max_by_key(|&r| (load[r], std::cmp::Reverse(r))).unwrap_or(0);
        let n = (0..ranks).min_by_key(|&r| (load[r], r)).unwrap_or(0);
        if m == n {
            break;
        }
        // The sample whose move best evens the two ranks, if any lowers the larger — evened
        // down to the floor at most: among moves that reach it, the lightest, which leaves the
        // rank's load nearest the floor (evening a stretched rank with the least loaded one
        // would cut the step below the CPUs' pace for a gain of the little it was above it).
        let best = held[m]
            .iter()
            .map(|&i| ((load[m] - w[i]).max(load[n] + w[i]), i))
            .filter(|&(worst, _)| worst < load[m])
            .map(|(worst, i)| (worst.max(floor), if worst <= floor { w[i] } else { 0 }, samples[i].id, i))
            .min();
        let Some((_, _, _, i)) = best else { break };
        load[m] -= w[i];
        load[n] += w[i];
        // A moved tensor stays where it went: it crosses one link, from its owner.
        held[m].retain(|&x| x != i);
        moves.push(Move { sample: i, from: m as u32, to: n as u32 });
        maxima.push(max_of(&load));
    }
    // Best prefix by net gain.
    let mut best = (0.0f64, 0usize, 0.0f64);
    for k in 1..=moves.len() {
        let gain = (before - maxima[k]) as f64 * 1e-9;
        let cost = all_to_all_seconds(samples, &moves[..k], ranks, transfer);
        let net = gain - cost * (1.0 + margin);
        if net > best.0 {
            best = (net, k, cost);
        }
    }
    let (net, k, cost) = best;
    let run = net > 0.0;
    // Not run: report the predictions of the whole candidate sequence, which lost to its cost.
    let (k, cost) =
        if run { (k, cost) } else { (moves.len(), all_to_all_seconds(samples, &moves, ranks, transfer)) };
    let after = maxima[k];
    moves.truncate(if run { k } else { 0 });
    Decision {
        run,
        moves,
        max_before_s: before as f64 * 1e-9,
        max_after_s: after as f64 * 1e-9,
        gain_s: (before - after) as f64 * 1e-9,
        transfer_s: cost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        // Each tensor moves once, from the rank that holds it: the engine sends every move from
        // the sample's owner, so a sample moved on again would be sent twice (to both ranks)
        // and the second rank would wait for a block its sender no longer has.
        #[test]
        fn a_sample_moves_at_most_once_and_from_its_owner(
            owners in proptest::collection::vec(0u32..6, 1..40),
            tokens in proptest::collection::vec(1u64..5000, 40),
            ranks in 2usize..7,
        ) {
            let samples: Vec<Decoded> = owners
                .iter()
                .enumerate()
                .map(|(i, &o)| Decoded { id: i as u64, owner: o % ranks as u32, tokens: tokens[i], bytes: 10 })
                .collect();
            let accel = AccelModel { c0: 0.0, a: 1e-3, b: 0.0 };
            let d = rebalance(&samples, ranks, &accel, &TransferCost::linear(1e-9, 1e12), 0.1);
            let mut seen = std::collections::HashSet::new();
            for m in &d.moves {
                proptest::prop_assert!(seen.insert(m.sample), "sample {} moves twice: {:?}", m.sample, d.moves);
                proptest::prop_assert_eq!(m.from, samples[m.sample].owner);
            }
        }
    }

    #[test]
    fn a_step_stretched_to_the_cpus_pace_is_not_cut_below_it() {
        // Rank 0 carries 1.8 s, rank 1 nothing: a cut to 0.9 s pays for a fast link, unless the
        // step cannot end before 1.5 s anyway; then only the 0.3 s above the floor counts.
        let accel = AccelModel { c0: 0.0, a: 1e-3, b: 0.0 };
        let samples = [
            Decoded { id: 1, owner: 0, tokens: 900, bytes: 1_000 },
            Decoded { id: 2, owner: 0, tokens: 900, bytes: 1_000 },
        ];
        let fast = TransferCost::linear(1e-5, 1e9);
        assert!(rebalance_above(&samples, 2, &accel, &fast, 0.1, 0.0).run);
        assert!(!rebalance_above(&samples, 2, &accel, &fast, 0.1, 1.8).run, "nothing above the floor");
        let floor = rebalance_above(&samples, 2, &accel, &fast, 0.1, 1.5);
        assert!(floor.run && (floor.gain_s - 0.3).abs() < 1e-9, "{floor:?}");
        // A link that takes 0.5 s per tensor pays for the 0.9 s cut, not for the 0.3 s one.
        let slow = TransferCost::linear(0.5, 1e9);
        assert!(rebalance_above(&samples, 2, &accel, &slow, 0.1, 0.0).run);
        assert!(!rebalance_above(&samples, 2, &accel, &slow, 0.1, 1.5).run);
    }

    #[test]
    fn a_stretched_rank_a_little_above_its_floor_gives_the_lightest_sample_that_reaches_it() {
        // Rank 0 was stretched to 3.0 s and the model now says 3.05 s; rank 1 holds 2.0 s.
        // Evening the two would move the 0.5-s sample and end the step at 2.55 s, under the CPUs'
        // pace; the 0.1-s one brings rank 0 to the floor and the step stays where it was planned.
        let accel = AccelModel { c0: 0.0, a: 1e-3, b: 0.0 };
        let samples = [
            Decoded { id: 1, owner: 0, tokens: 500, bytes: 1_000 },
            Decoded { id: 2, owner: 0, tokens: 100, bytes: 1_000 },
            Decoded { id: 3, owner: 0, tokens: 2_450, bytes: 1_000 },
            Decoded { id: 4, owner: 1, tokens: 2_000, bytes: 1_000 },
        ];
        let fast = TransferCost::linear(1e-6, 1e12);
        let d = rebalance_above(&samples, 2, &accel, &fast, 0.1, 3.0);
        assert!(d.run, "{d:?}");
        let moved: Vec<usize> = d.moves.iter().map(|m| m.sample).collect();
        assert_eq!(moved, [1], "{d:?}");
        // Without a floor the gate evens them: the 0.5-s sample goes.
        let even = rebalance_above(&samples, 2, &accel, &fast, 0.1, 0.0);
        assert_eq!(even.moves.iter().map(|m| m.sample).collect::<Vec<_>>(), [0], "{even:?}");
    }

    #[test]
    fn the_gate_prices_each_move_on_the_link_it_crosses() {
        // Rank 0 holds 1.8 s of accelerator work, ranks 1 (its node) and 2 (another) nothing.
        let accel = AccelModel { c0: 0.0, a: 1e-3, b: 0.0 };
        let samples = [
            Decoded { id: 1, owner: 0, tokens: 900, bytes: 100 << 20 },
            Decoded { id: 2, owner: 0, tokens: 900, bytes: 100 << 20 },
        ];
        let near = TransferCost::linear(5e-6, 2e10);
        let far = TransferCost::linear(2e-5, 1e8);
        let m = |to: u32| Move { sample: 1, from: 0, to };
        let links = TransferCost::per_node(&near, &far, vec![0, 0, 1]);
        let (to_near, to_far) = (
            all_to_all_seconds(&samples, &[m(1)], 3, &links),
            all_to_all_seconds(&samples, &[m(2)], 3, &links),
        );
        assert!((to_near - near.seconds(100 << 20)).abs() < 1e-9);
        assert!((to_far - far.seconds(100 << 20)).abs() < 1e-9);
        // Both classes at once: one after the other.
        let both = all_to_all_seconds(&samples, &[m(1), Move { sample: 0, from: 0, to: 2 }], 3, &links);
        assert!((both - to_near - to_far).abs() < 1e-9);
        // 0.9 s gained: worth 5 ms within the node, not 1 s across the network. The greedy
        // sequence's first move goes to the least-loaded rank with the lowest index, rank 1.
        assert!(rebalance(&samples, 3, &accel, &links, 0.1).run);
        let across = TransferCost::per_node(&near, &far, vec![0, 1, 1]);
        assert!(!rebalance(&samples, 3, &accel, &across, 0.1).run);
    }
}
