//! Each step's accelerator term of the sound bound (fact 1 of `metrics::bound`: the least
//! length any split of the step's samples over its ranks reaches, knowing each rank's noise),
//! from a run's records — for comparing the bound step by step with a split found elsewhere
//! (`docs/experiments/exact_split.py`).
//!
//! ```text
//! target/release/datahelix sim --workload scripts/workloads/opensora12_buckets.toml --ranks 512 \
//!     --policy helix --records /tmp/rec
//! cargo run --release --example step_bounds -- /tmp/rec/sim-helix.json
//! ```
//!
//! Prints `STEP ACCEL_S REALISED_S` per step (every step of the records, warm-up included):
//! the bound's term and the slowest rank's emulated time in the run. A record without emulator
//! terms (a real accelerator) gets the fallback term, as in the summary.

use datahelix::metrics::{bound::step_accel, RankStep};
use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!(
            "usage: step_bounds RESULTS.json   (`datahelix sim --records DIR` writes DIR/sim-POLICY.json)"
        );
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let records: Vec<RankStep> = serde_json::from_value(doc["records"].take())
        .map_err(|e| format!("{path}: `records` is not a list of rank-step records: {e}"))?;
    let mut steps: BTreeMap<u64, Vec<&RankStep>> = BTreeMap::new();
    for r in &records {
        steps.entry(r.step).or_default().push(r);
    }
    for (step, rs) in steps {
        let (accel_s, _floor_s) = step_accel(&rs, rs.len());
        let realised = rs.iter().map(|r| r.gpu_s).fold(0.0, f64::max);
        println!("{step} {accel_s:.6} {realised:.6}");
    }
    Ok(())
}
