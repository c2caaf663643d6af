//! Probe throughput (files/s) against `ffprobe` per file, measured in the same run, and the cost
//! of an index lookup (by position and by id).
//!
//!     cargo bench --bench index
//!
//! The dataset is `scripts/specs/small.json` (48 files: h264/mpeg4 in mp4/mkv, jpeg, png),
//! generated once under target/bench-data.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datahelix::gen::{generate, GenOptions, Spec};
use datahelix::index::{build, BuildOptions, Index};
use datahelix::manifest;
use datahelix::probe::probe;

fn dataset() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = root.join("target/bench-data/small");
    let spec = Spec::load(&root.join("scripts/specs/small.json")).expect("spec");
    generate(&spec, &out, &GenOptions::default()).expect("generate the bench dataset");
    build(&out, &BuildOptions { progress: false, ..BuildOptions::default() }).expect("index");
    out
}

fn probe_throughput(c: &mut Criterion) {
    let dir = dataset();
    let entries = manifest::parse(&std::fs::read(dir.join("manifest.jsonl")).unwrap()).entries;
    let mut g = c.benchmark_group("probe");
    g.throughput(Throughput::Elements(entries.len() as u64));
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    g.bench_function(BenchmarkId::new("datahelix", entries.len()), |b| {
        b.iter(|| {
            for e in &entries {
                black_box(probe(&dir, e));
            }
        })
    });
    g.bench_function(BenchmarkId::new("ffprobe_cli_per_file", entries.len()), |b| {
        b.iter(|| {
            for e in &entries {
                let o = Command::new("ffprobe")
                    .args(["-v", "error", "-show_streams", "-show_format", "-of", "json"])
                    .arg(dir.join(&e.path))
                    .output()
                    .expect("run ffprobe");
                black_box(o.stdout.len());
            }
        })
    });
    g.finish();
}

fn lookup(c: &mut Criterion) {
    let dir = dataset();
    let index = Index::open(&dir).unwrap();
    let n = index.len();
    let ids: Vec<u64> = (0..n).map(|i| index.get(i).unwrap().id).collect();
    let mut g = c.benchmark_group("index_lookup");
    g.throughput(Throughput::Elements(1));
    g.bench_function("open", |b| b.iter(|| black_box(Index::open(&dir).unwrap().len())));
    let mut i = 0usize;
    g.bench_function("get_by_position", |b| {
        b.iter(|| {
            i = (i + 7) % n;
            black_box(index.get(i).unwrap())
        })
    });
    g.bench_function("path_by_position", |b| {
        b.iter(|| {
            i = (i + 7) % n;
            black_box(index.path(i).unwrap().len())
        })
    });
    g.bench_function("position_of_id", |b| {
        b.iter(|| {
            i = (i + 7) % n;
            black_box(index.position_of(ids[i]))
        })
    });
    g.finish();
}

criterion_group!(benches, probe_throughput, lookup);
criterion_main!(benches);
