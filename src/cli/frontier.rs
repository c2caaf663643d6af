//! `datahelix frontier RESULTS`: from a run's records (`sim --records DIR`'s
//! `DIR/sim-<policy>.json`, or `train --out`), the least wall time any schedule of the same
//! batches has at each miss rate, and the fewest misses any schedule as fast as the run can have
//! ([`crate::metrics::bound::misses`], fact 6). It needs the simulator's decode chains: a real
//! run's records have none, and then no sample is ever late.

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};

use super::{write_json, CliError};
use crate::metrics::bound::misses::{Frontier, Point};
use crate::metrics::{RankStep, Summary};

/// The most memory the frontier may hold (its tables and ways back).
const MEMORY_LIMIT: u64 = 4 << 30;
/// The most elementary steps it may take ([`Frontier::work`]): ~5 minutes on this machine's two
/// cores (the camera originals at 512 ranks, 195 steps, grid 96: 1.8·10¹⁰ in ~5 s).
const WORK_LIMIT: f64 = 1e12;

/// The least wall time at each miss rate, and the fewest misses at the run's wall time.
#[derive(Debug, Args)]
pub struct FrontierArgs {
    /// A run's results: `{"records": [...], "summary": {...}}` (`sim --records`, `train --out`).
    pub results: PathBuf,
    /// Steps decoded ahead (1 or 2; default: the results' `params.lookahead`, else 2).
    #[arg(long)]
    pub lookahead: Option<u64>,
    /// Warm-up steps, not measured (default: as many as the results' summary does not count
    /// as measured; none without a summary).
    #[arg(long)]
    pub warmup: Option<u64>,
    /// A wait above this many milliseconds is a miss.
    #[arg(long, default_value_t = 1.0)]
    pub tolerance_ms: f64,
    /// Step lengths on the grid, 4 to 256 (more is tighter and slower, as its cube a step).
    #[arg(long, default_value_t = 96)]
    pub grid: usize,
    /// Miss rates to give the least wall time at (besides 0 … 0.5 by 0.05 and the run's own).
    #[arg(long, value_delimiter = ',')]
    pub at: Vec<f64>,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Deserialize)]
struct Results {
    records: Vec<RankStep>,
    #[serde(default)]
    summary: Option<Summary>,
    #[serde(default)]
    params: Option<serde_json::Value>,
}

/// The least wall time at one miss rate.
#[derive(Serialize)]
struct AtRate {
    miss_rate: f64,
    least_wall_s: f64,
    /// The sound bound over that wall time: no schedule with these misses is more efficient.
    most_efficiency: f64,
}

#[derive(Serialize)]
struct FrontierJson {
    ranks: usize,
    steps: usize,
    lookahead: u64,
    tolerance_s: f64,
    grid: usize,
    wall_s: f64,
    miss_rate: f64,
    ideal_s: f64,
    /// The fewest misses any schedule that takes no longer than the run can have.
    least_miss_rate_at_wall: f64,
    frontier: Vec<AtRate>,
    points: Vec<PointJson>,
}

#[derive(Serialize)]
struct PointJson {
    lambda_s: f64,
    cost_s: f64,
    wall_s: f64,
    miss_rate: f64,
    /// The optimum's step lengths, seconds (grid points, rounded down), and late ranks.
    lengths_s: Vec<f64>,
    late: Vec<u32>,
}

/// Runs `datahelix frontier`.
pub fn run(args: FrontierArgs) -> Result<i32, CliError> {
    let name = args.results.display().to_string();
    let text = std::fs::read_to_string(&args.results)
        .map_err(|e| CliError::usage(format!("cannot read {name}: {e}")))?;
    let res: Results = serde_json::from_str(&text).map_err(|e| {
        CliError::usage(format!(
            "{name}: not a run's results ({e}); give `sim --records`' or `train --out`'s JSON"
        ))
    })?;
    let summary = res.summary.unwrap_or_default();
    let last = res
        .records
        .iter()
        .map(|r| r.step)
        .max()
        .ok_or_else(|| CliError::usage(format!("{name}: no records")))?;
    // Without a summary that counts its measured steps, every step is measured.
    let warmup = args.warmup.unwrap_or(match summary.steps {
        0 => 0,
        measured => (last + 1).saturating_sub(measured),
    });
    let lookahead = args
        .lookahead
        .or_else(|| res.params.as_ref().and_then(|p| p.get("lookahead")).and_then(|v| v.as_u64()))
        .unwrap_or(2);
    if !(1..=2).contains(&lookahead) {
        return Err(CliError::usage(format!("--lookahead {lookahead}: the frontier is computed for 1 or 2")));
    }
    if !(args.tolerance_ms.is_finite() && args.tolerance_ms >= 0.0) {
        return Err(CliError::usage(format!("--tolerance-ms {}: must be ≥ 0", args.tolerance_ms)));
    }
    if !(4..=256).contains(&args.grid) {
        return Err(CliError::usage(format!(
            "--grid {}: give 4 to 256 (the work grows as its cube: 192 takes ~20 s for 200 steps on 2 cores)",
            args.grid
        )));
    }
    let ranks = res.records.iter().map(|r| r.rank).collect::<std::collections::BTreeSet<_>>().len();
    let tolerance = args.tolerance_ms / 1e3;
    let measured = res
        .records
        .iter()
        .filter(|r| r.step >= warmup)
        .map(|r| r.step)
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let samples: usize =
        res.records.iter().filter(|r| r.step >= warmup).map(|r| r.sample_chain_s.len()).sum();
    if Frontier::work(samples, measured, args.grid, lookahead) > WORK_LIMIT {
        return Err(CliError::usage(format!(
            "{name}: the frontier of {measured} steps ({samples} samples) on a grid of {} would take hours; give a smaller --grid, or fewer steps (--warmup)",
            args.grid
        )));
    }
    let need = Frontier::memory_bytes(measured, args.grid, lookahead);
    if need > MEMORY_LIMIT {
        return Err(CliError::usage(format!(
            "{name}: the frontier of {measured} steps on a grid of {} would hold ~{:.1} GiB; give a smaller --grid, or fewer steps (--warmup)",
            args.grid,
            need as f64 / (1u64 << 30) as f64
        )));
    }
    let f = Frontier::of_records(&res.records, warmup, ranks, lookahead, tolerance, args.grid)
        .ok_or_else(|| CliError::usage(format!("{name}: no measured step from step {warmup}")))?;
    let (wall, misses) = own_point(&res.records, warmup, tolerance);
    let ideal = summary.ideal_s;
    let mut rates: Vec<f64> = (0..=10).map(|k| k as f64 * 0.05).chain(args.at.iter().copied()).collect();
    rates.push(f.rate(misses));
    rates.sort_by(f64::total_cmp);
    rates.dedup_by(|a, b| (*a - *b).abs() < 1e-12);
    let frontier: Vec<AtRate> = rates
        .into_iter()
        .filter(|r| (0.0..=1.0).contains(r))
        .map(|miss_rate| {
            let least_wall_s = f.least_wall(f.count(miss_rate));
            let most_efficiency = if least_wall_s > 0.0 { (ideal / least_wall_s).min(1.0) } else { 1.0 };
            AtRate { miss_rate, least_wall_s, most_efficiency }
        })
        .collect();
    let doc = FrontierJson {
        ranks,
        steps: f.steps,
        lookahead,
        tolerance_s: tolerance,
        grid: args.grid,
        wall_s: wall,
        miss_rate: f.rate(misses),
        ideal_s: ideal,
        least_miss_rate_at_wall: f.rate(f.least_misses(wall)),
        frontier,
        points: f
            .points
            .iter()
            .map(|p: &Point| PointJson {
                lambda_s: p.lambda_s,
                cost_s: p.cost_s,
                wall_s: p.wall_s,
                miss_rate: f.rate(p.misses),
                lengths_s: p.lengths_s.clone(),
                late: p.late.clone(),
            })
            .collect(),
    };
    if args.json {
        write_json(&doc, None)?;
    } else {
        print_text(&name, &doc);
    }
    Ok(0)
}

/// The run's own wall time and misses over the measured steps.
fn own_point(records: &[RankStep], warmup: u64, tolerance: f64) -> (f64, f64) {
    let measured: Vec<&RankStep> = records.iter().filter(|r| r.step >= warmup).collect();
    let start = measured.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let end = measured.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
    let misses = measured.iter().filter(|r| r.input_wait_s > tolerance).count();
    ((end - start).max(0.0), misses as f64)
}

fn print_text(name: &str, d: &FrontierJson) {
    println!(
        "{name}: {} ranks, {} measured steps, lookahead {}, a wait over {} ms a miss",
        d.ranks,
        d.steps,
        d.lookahead,
        d.tolerance_s * 1e3
    );
    let eff = if d.wall_s > 0.0 { d.ideal_s / d.wall_s } else { 0.0 };
    println!(
        "this run: {:.1} s, misses {:.3}, efficiency {:.3}; any schedule as fast misses at least {:.3}",
        d.wall_s, d.miss_rate, eff, d.least_miss_rate_at_wall
    );
    println!("  miss rate   least wall s   most efficiency");
    for a in &d.frontier {
        println!("  {:9.3}   {:12.1}   {:15.3}", a.miss_rate, a.least_wall_s, a.most_efficiency);
    }
}
