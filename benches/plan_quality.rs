//! Planner quality report (a bench binary, not a timed test): for each synthetic workload at
//! 64 ranks × 16 samples, the imbalance (largest rank's predicted accelerator work over the lower
//! bound max(total/R, largest sample)) of LPT only, LPT + local search and Karmarkar–Karp, and the
//! predicted deadline misses with owner-only decoding vs deadline-aware placement. Mean over seeds.
//!
//!     cargo bench --bench plan_quality

use std::time::Instant;

use datahelix::plan::synthetic::{synthetic, Kind};
use datahelix::plan::{plan, Batching};

const SEEDS: u64 = 10;

fn main() {
    // `cargo test --benches` runs bench binaries with `--test`-like args; keep that quick.
    let quick = std::env::args().any(|a| a == "--test" || a == "--list");
    let seeds = if quick { 2 } else { SEEDS };
    let (ranks, per_rank) = (64usize, 16usize);
    println!("plan quality at {ranks} ranks x {per_rank} samples per rank, mean over {seeds} seeds");
    println!(
        "{:<11} {:>9} {:>11} {:>9} {:>9} {:>9} {:>14} {:>14}",
        "workload", "LPT", "LPT+search", "KK", "LPT us", "KK us", "misses owner", "misses helix"
    );
    for kind in [Kind::Uniform, Kind::HeavyTail, Kind::Bimodal] {
        let mut imb = [0.0f64; 3];
        let mut us = [0.0f64; 3];
        let (mut owner_misses, mut helix_misses) = (0u64, 0u64);
        for seed in 0..seeds {
            let base = synthetic(kind, ranks * per_rank, ranks, 1, seed);
            for (k, batching) in
                [Batching::Lpt, Batching::LptLocalSearch, Batching::KarmarkarKarp].into_iter().enumerate()
            {
                let mut input = base.clone();
                input.options.batching = batching;
                input.options.placement = false;
                let t = Instant::now();
                let p = plan(&input).expect("plan");
                us[k] += t.elapsed().as_secs_f64() * 1e6;
                imb[k] += p.imbalance;
                if batching == Batching::LptLocalSearch {
                    owner_misses += p.predicted_misses;
                }
            }
            helix_misses += plan(&base).expect("plan").predicted_misses;
        }
        let n = seeds as f64;
        println!(
            "{:<11} {:>9.4} {:>11.4} {:>9.4} {:>9.0} {:>9.0} {:>14.1} {:>14.1}",
            format!("{kind:?}"),
            imb[0] / n,
            imb[1] / n,
            imb[2] / n,
            us[0] / n,
            us[2] / n,
            owner_misses as f64 / n,
            helix_misses as f64 / n
        );
    }
}
