//! Planner invariants, by property tests over random inputs: determinism (same inputs, same plan
//! and hash), exactly one owner and one decoder per sample, decode orders that cover every sample
//! once, memory caps kept where they can be, and a rebalance gate that never runs at a loss.

use datahelix::cost::accel::AccelModel;
use datahelix::plan::rebalance::{rebalance, Decoded};
use datahelix::plan::synthetic::{synthetic, Kind};
use datahelix::plan::{plan, Batching, PlanInput, PlanOptions, RankState, SampleIn, TransferCost};
use proptest::prelude::*;

fn arb_input() -> impl Strategy<Value = PlanInput> {
    (1usize..9, 1usize..4, any::<u64>(), 0usize..60, any::<bool>(), 0u8..4).prop_flat_map(
        |(ranks, steps, seed, per_step, caps, batching)| {
            let samples = proptest::collection::vec(
                (0u64..50_000, 0.0f64..0.2, 1u64..50_000_000, 0u64..8),
                per_step * steps,
            );
            let rank_states =
                proptest::collection::vec((1u32..6, -0.05f64..0.5, 0.0f64..0.3, 0u64..400_000_000), ranks);
            (samples, rank_states).prop_map(move |(samples, rank_states)| {
                let samples = samples
                    .into_iter()
                    .enumerate()
                    .map(|(k, (tokens, decode_s, bytes, dup))| SampleIn {
                        // A few duplicate ids (a dataset smaller than the batch wraps around).
                        id: if dup == 0 { 7 } else { seed.wrapping_add(k as u64) },
                        step: (k / per_step.max(1)) as u32,
                        tokens,
                        decode_s,
                        bytes,
                    })
                    .collect();
                let ranks = rank_states
                    .into_iter()
                    .map(|(workers, free, queued, cap)| RankState {
                        workers,
                        accel_free_s: free,
                        queued_cpu_s: queued,
                        mem_cap: if caps { cap } else { 0 },
                    })
                    .collect();
                let batching =
                    [Batching::Strided, Batching::Lpt, Batching::LptLocalSearch, Batching::KarmarkarKarp]
                        [batching as usize];
                PlanInput {
                    first_step: seed % 1000,
                    samples,
                    ranks,
                    accel: AccelModel { c0: 0.01, a: 2e-6, b: 1e-11 },
                    transfer: TransferCost::linear(2e-5, 5e9),
                    options: PlanOptions { batching, ..PlanOptions::default() },
                    pieces: Vec::new(),
                    exchange_s: (seed % 3) as f64 * 0.02,
                    decode_pace_s: 0.0,
                    decode_pace_spread_s: 0.0,
                    late_pieces: false,
                    late_due_s: 0.0,
                }
            })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn same_inputs_same_plan(input in arb_input()) {
        let a = plan(&input).unwrap();
        let b = plan(&input.clone()).unwrap();
        prop_assert_eq!(a.hash, b.hash);
        prop_assert_eq!(a, b);
    }

    #[test]
    fn every_sample_has_one_owner_and_one_decoder_and_is_decoded_once(input in arb_input()) {
        let p = plan(&input).unwrap();
        let r = input.ranks.len() as u32;
        let n = input.samples.len();
        prop_assert_eq!(p.owner.len(), n);
        prop_assert_eq!(p.decoder.len(), n);
        prop_assert!(p.owner.iter().all(|&o| o < r));
        prop_assert!(p.decoder.iter().all(|&d| d < r));
        let mut seen = vec![0u32; n];
        for (rank, order) in p.decode_order.iter().enumerate() {
            for &i in order {
                prop_assert_eq!(p.decoder[i as usize], rank as u32);
                seen[i as usize] += 1;
            }
        }
        prop_assert!(seen.iter().all(|&c| c == 1), "each sample decoded exactly once");
        // Per step, the batch predictions account for every sample.
        let total: u32 = p.batches.iter().map(|b| b.samples).sum();
        prop_assert_eq!(total as usize, n);
        prop_assert!(p.imbalance >= 1.0 - 1e-12);
        let bytes_moved: u64 = (0..n).filter(|&i| p.owner[i] != p.decoder[i]).map(|i| input.samples[i].bytes).sum();
        prop_assert_eq!(p.bytes_moved, bytes_moved);
    }

    #[test]
    fn memory_caps_hold_unless_reported(input in arb_input()) {
        let p = plan(&input).unwrap();
        let mut violations = 0;
        for b in &p.batches {
            let cap = input.ranks[b.rank as usize].mem_cap;
            if cap != 0 && b.bytes > cap {
                violations += 1;
            }
        }
        if matches!(input.options.batching, Batching::Lpt | Batching::LptLocalSearch) {
            prop_assert!(violations <= p.cap_violations as usize, "{} batches over cap, {} reported", violations, p.cap_violations);
        }
    }

    #[test]
    fn placement_never_makes_the_prediction_worse(input in arb_input()) {
        let with = plan(&input).unwrap();
        let mut off = input.clone();
        off.options.placement = false;
        let without = plan(&off).unwrap();
        // Lexicographic, as the planner decides: step delay, then misses, then lateness.
        let key = |p: &datahelix::plan::Plan| (p.delay_s, p.predicted_misses, p.lateness_s);
        let (w, o) = (key(&with), key(&without));
        prop_assert!(
            w.0 < o.0 - 1e-9 || (w.0 <= o.0 + 1e-9 && (w.1 < o.1 || (w.1 == o.1 && w.2 <= o.2 + 1e-9))),
            "placement {:?} vs owner-only {:?}", w, o
        );
        prop_assert_eq!(without.bytes_moved, 0);
    }

    #[test]
    fn the_gate_never_runs_a_rebalance_at_a_loss(
        ranks in 1usize..8,
        samples in proptest::collection::vec((0u32..8, 0u64..40_000, 1u64..200_000_000), 0..64),
        alpha in 0.0f64..0.05,
        beta in 1e8f64..2e10,
        margin in 0.0f64..0.5,
    ) {
        let decoded: Vec<Decoded> = samples
            .iter()
            .enumerate()
            .map(|(i, &(o, tokens, bytes))| Decoded { id: i as u64, owner: o % ranks as u32, tokens, bytes })
            .collect();
        let accel = AccelModel { c0: 0.01, a: 2e-6, b: 1e-11 };
        let d = rebalance(&decoded, ranks, &accel, &TransferCost::linear(alpha, beta), margin);
        if d.run {
            prop_assert!(d.gain_s > d.transfer_s * (1.0 + margin), "ran with gain {} ≤ cost {}", d.gain_s, d.transfer_s);
            prop_assert!(!d.moves.is_empty());
            prop_assert!(d.max_after_s < d.max_before_s);
        } else {
            prop_assert!(d.moves.is_empty());
        }
    }
}

#[test]
fn strided_batching_is_the_rank_local_split() {
    let mut input = synthetic(Kind::Uniform, 37, 4, 1, 3);
    input.options.batching = Batching::Strided;
    input.options.placement = false;
    let p = plan(&input).unwrap();
    for (pos, &o) in p.owner.iter().enumerate() {
        assert_eq!(o as usize, pos % 4);
    }
}

#[test]
fn quality_on_the_issue_size() {
    // Heavy-tailed tokens at 64 ranks x 16 samples: LPT + local search within 5% of the bound.
    for seed in 0..5 {
        let input = synthetic(Kind::HeavyTail, 64 * 16, 64, 1, seed);
        let p = plan(&input).unwrap();
        assert!(p.imbalance <= 1.05, "seed {seed}: imbalance {}", p.imbalance);
    }
}

#[test]
fn placement_cuts_the_predicted_delay_on_skewed_cpus() {
    let mut cut = 0.0;
    for seed in 0..5 {
        let input = synthetic(Kind::Bimodal, 64 * 16, 64, 1, seed);
        let with = plan(&input).unwrap();
        let mut off = input.clone();
        off.options.placement = false;
        let without = plan(&off).unwrap();
        assert!(
            with.delay_s <= without.delay_s + 1e-9,
            "seed {seed}: {} > {}",
            with.delay_s,
            without.delay_s
        );
        cut += without.delay_s - with.delay_s;
    }
    assert!(cut > 0.0, "placement should shorten the predicted delay on the bimodal workload");
}
