//! Planning time of one step, as the loader plans it (`policy::plan_step`, batching and
//! placement), on two kinds of input:
//!
//! - `plan_heavy_tail`: R ∈ {8, 64, 512, 4096} ranks × {4, 16, 64} samples per rank, on the
//!   heavy-tailed synthetic workload (`plan::synthetic`);
//! - `plan_workload`: the inputs the step engine itself built, at 4096 ranks, in a short
//!   simulated run of an in-tree workload (`scripts/workloads/`): real backlogs, deadlines,
//!   split pieces and decode estimates, where the synthetic draw has none of them
//!   (kinetics700_10s, hdvila_long, mmc4_interleaved), planned as the loader's rank 0 plans
//!   them: the batching of every rank, the decode placement of its own planning group
//!   (`plan::groups`).
//!
//! ```text
//! cargo bench --bench planner
//! cargo bench --bench planner -- plan_workload     # the workload inputs only
//! ```
//!
//! Goals (issue 5): ≤ 1 ms at 64 × 16 and ≤ 50 ms at 4096 × 8; issue 20: ≤ 20 ms on average
//! and ≤ 50 ms at worst on the suite's workloads at 4096 ranks.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datahelix::plan::synthetic::{synthetic, Kind};
use datahelix::plan::{plan, PlanInput, Scope};
use datahelix::policy::{plan_step, Policy};
use datahelix::sim::{self, Overrides};

fn planning(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_heavy_tail");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let mut sizes: Vec<(usize, usize)> = Vec::new();
    for ranks in [8usize, 64, 512, 4096] {
        for per_rank in [4usize, 16, 64] {
            sizes.push((ranks, per_rank));
        }
    }
    sizes.push((4096, 8));
    for (ranks, per_rank) in sizes {
        let input = synthetic(Kind::HeavyTail, ranks * per_rank, ranks, 1, 11);
        g.throughput(Throughput::Elements((ranks * per_rank) as u64));
        g.bench_with_input(BenchmarkId::new(format!("{ranks}_ranks"), per_rank), &input, |b, input| {
            b.iter(|| black_box(plan(input).expect("plan").hash))
        });
    }
    g.finish();
}

/// Ranks of the workload inputs: 4096 under `cargo bench`; 64 where `cargo test` runs the bench
/// once, unoptimised, to check that it works (a 4096-rank simulation takes minutes there).
fn workload_ranks() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        4096
    } else {
        64
    }
}

/// The planner inputs of a short helix run of `file` at `ranks` ranks: the last two planned
/// steps (past the first plans, made before any backlog or measurement).
fn workload_inputs(file: &str, ranks: usize) -> Vec<(u64, PlanInput)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/workloads").join(file);
    let (w, cal) = sim::load(&path).expect("an in-tree workload loads");
    let over = Overrides { ranks: Some(ranks), steps: Some(6), ..Overrides::default() };
    let (mut cfg, data) = sim::prepare(&w, &cal, Policy::Helix, &over).expect("workload prepares");
    cfg.keep_plan_inputs = true;
    let run = sim::simulate(&cfg, &data).expect("workload simulates");
    let n = run.plan_inputs.len();
    run.plan_inputs.into_iter().skip(n.saturating_sub(2)).collect()
}

fn planning_workloads(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_workload");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    let ranks = workload_ranks();
    // A mild set, long segments split into pieces (~100k jobs a step at 4096 ranks), and the
    // interleaved set with the most samples (~127k a step: local search's hardest).
    for file in ["kinetics700_10s.toml", "hdvila_long.toml", "mmc4_interleaved.toml"] {
        let name = file.trim_end_matches(".toml");
        let inputs = workload_inputs(file, ranks);
        assert!(!inputs.is_empty(), "{file}: the simulated run kept no planner input");
        for (t, input) in inputs {
            g.throughput(Throughput::Elements(input.samples.len() as u64));
            g.bench_with_input(
                BenchmarkId::new(format!("{name}_{ranks}_ranks"), format!("step_{t}")),
                &input,
                |b, input| {
                    b.iter(|| {
                        black_box(plan_step(Policy::Helix, t, input, Scope::GroupOf(0)).expect("plan").hash)
                    })
                },
            );
        }
    }
    g.finish();
}

criterion_group!(benches, planning, planning_workloads);
criterion_main!(benches);
