//! `datahelix index DIR`: probe every manifest entry and write the descriptor index.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::{write_json, CliError, EXIT_FAILURES};
use crate::descriptor::DescriptorJson;
use crate::index::{build, BuildOptions, Index};

/// Probe a dataset's files (headers only) and write DIR/.datahelix/index.
#[derive(Debug, Args)]
pub struct IndexArgs {
    /// The dataset folder (holding its manifest: manifest.jsonl, manifest.csv or manifest.parquet).
    pub dir: PathBuf,
    /// The folder of the dataset's index, when it cannot live in the dataset folder (read-only
    /// storage); default: `DATAHELIX_INDEX_DIR`, else DIR/.datahelix.
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Probe threads (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Print one JSON document on stdout (see shared/CLI.md).
    #[arg(long)]
    pub json: bool,
    /// With --json, include every descriptor.
    #[arg(long)]
    pub records: bool,
    /// Write the JSON document to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Re-probe every file, ignoring the existing index.
    #[arg(long)]
    pub force: bool,
    /// Exit 1 when any sample is bad.
    #[arg(long)]
    pub strict: bool,
}

#[derive(Serialize)]
struct ManifestErrorJson {
    line: u32,
    reason: String,
}

#[derive(Serialize)]
struct IndexJson {
    dataset: String,
    count: usize,
    ok: usize,
    bad: usize,
    by_status: BTreeMap<String, usize>,
    probed: usize,
    reused: usize,
    seconds: f64,
    index: String,
    manifest_errors: Vec<ManifestErrorJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    records: Option<Vec<DescriptorJson>>,
}

/// Runs `datahelix index`.
pub fn run(args: IndexArgs) -> Result<i32, CliError> {
    let opts = BuildOptions {
        workers: args.workers,
        progress: !args.json || args.out.is_some(),
        force: args.force,
        index_dir: args.index_dir.clone(),
    };
    let report = build(&args.dir, &opts).map_err(|e| CliError::usage(e.to_string()))?;
    for e in &report.manifest_errors {
        eprintln!("index: {e}");
    }
    let records = if args.records {
        let index = Index::open_in(&args.dir, args.index_dir.as_deref())
            .map_err(|e| CliError::usage(e.to_string()))?;
        let mut out = Vec::with_capacity(index.len());
        for i in 0..index.len() {
            let d = index.get(i).map_err(|e| CliError::usage(e.to_string()))?;
            out.push(d.to_json(index.path(i).map_err(|e| CliError::usage(e.to_string()))?));
        }
        Some(out)
    } else {
        None
    };
    if args.json || args.out.is_some() {
        let doc = IndexJson {
            dataset: args.dir.display().to_string(),
            count: report.count,
            ok: report.ok,
            bad: report.bad,
            by_status: report.by_status.clone(),
            probed: report.probed,
            reused: report.reused,
            seconds: report.seconds,
            index: report.path.display().to_string(),
            manifest_errors: report
                .manifest_errors
                .iter()
                .map(|e| ManifestErrorJson { line: e.line, reason: e.reason.clone() })
                .collect(),
            records,
        };
        write_json(&doc, args.out.as_deref())?;
    } else {
        println!("dataset   {}", args.dir.display());
        println!("samples   {} ({} ok, {} bad)", report.count, report.ok, report.bad);
        for (reason, n) in &report.by_status {
            println!("  {reason:<18} {n}");
        }
        println!(
            "probed    {} files in {:.2} s ({} unchanged, reused)",
            report.probed, report.seconds, report.reused
        );
        println!("index     {}", report.path.display());
        if let Ok(index) = Index::open_in(&args.dir, args.index_dir.as_deref()) {
            print_breakdown(&index);
        }
    }
    Ok(if args.strict && report.bad > 0 { EXIT_FAILURES } else { 0 })
}

/// Per (modality, codec, container): samples, bytes, seconds of video, largest frame — the skew
/// a planner has to deal with, at a glance.
fn print_breakdown(index: &Index) {
    #[derive(Default)]
    struct Row {
        n: usize,
        bytes: u64,
        seconds: f64,
        max_seconds: f64,
        max_pixels: (u32, u32),
    }
    let mut rows: BTreeMap<(String, String, String), Row> = BTreeMap::new();
    for d in index.iter().flatten().filter(|d| d.status.is_ok()) {
        let key = (d.modality.name().to_string(), d.codec.name().to_string(), d.container.name().to_string());
        let r = rows.entry(key).or_default();
        r.n += 1;
        r.bytes += d.bytes;
        r.seconds += d.duration_s();
        r.max_seconds = r.max_seconds.max(d.duration_s());
        if d.pixels_per_frame() > r.max_pixels.0 as u64 * r.max_pixels.1 as u64 {
            r.max_pixels = (d.width, d.height);
        }
    }
    println!();
    println!(
        "{:<6} {:<6} {:<5} {:>7} {:>10} {:>10} {:>9} {:>10}",
        "kind", "codec", "cont", "samples", "MiB", "video s", "longest", "largest"
    );
    for ((m, c, k), r) in rows {
        println!(
            "{:<6} {:<6} {:<5} {:>7} {:>10.1} {:>10.1} {:>9.1} {:>10}",
            m,
            c,
            k,
            r.n,
            r.bytes as f64 / (1 << 20) as f64,
            r.seconds,
            r.max_seconds,
            format!("{}x{}", r.max_pixels.0, r.max_pixels.1)
        );
    }
}
