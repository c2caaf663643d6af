//! Planning time of one step: R ∈ {8, 64, 512, 4096} ranks × {4, 16, 64} samples per rank, on
//! the heavy-tailed synthetic workload, batching + placement (the whole `plan()`).
//!
//!     cargo bench --bench planner
//!
//! Goals (issue 5): ≤ 1 ms at 64 × 16 and ≤ 50 ms at 4096 × 8 on the 2-core development machine.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datahelix::plan::plan;
use datahelix::plan::synthetic::{synthetic, Kind};

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

criterion_group!(benches, planning);
criterion_main!(benches);
