//! `datahelix compare --results DIR_OR_FILE... [--plots OUTDIR] [--json]`: the policy comparison
//! table (and `compare --json`, `shared/CLI.md`) and its plots, from `datahelix train --out`
//! result files.
//!
//! Two halves: gathering results (today: reading them with [`load_results`]; later also running
//! `mpirun ... datahelix train --policy P` per policy) and reporting them with [`report`], which
//! either half calls.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

use super::{write_json, CliError};
use crate::metrics::plots;
use crate::metrics::table::CompareReport;
use crate::metrics::{RankStep, Summary, TrainResult};

/// Compare policies: print the table (throughput, speed-up over rank-local, miss rates, waits,
/// efficiency, rebalances, bytes moved) and write the plots.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Result files of `datahelix train --out`, or folders of them (every `*.json` directly
    /// inside; files there that are not results, such as traces, are passed over). The policy is
    /// the file's `params.policy`, else its file stem.
    #[arg(long, num_args = 1.., value_name = "DIR_OR_FILE")]
    pub results: Vec<PathBuf>,
    /// Write the plots (wait_cdf.png, timeline.png, throughput.png) into this folder.
    #[arg(long, value_name = "OUTDIR")]
    pub plots: Option<PathBuf>,
    /// Print one JSON document on stdout: `{"policies": {name: summary}, "plots": [paths],
    /// "speedup_vs_rank_local": {name: ratio}}`.
    #[arg(long)]
    pub json: bool,
    /// Run every policy on this dataset first (spawning `mpirun -np RANKS datahelix train`),
    /// writing results, traces and plots into `--out-dir`.
    #[arg(long, conflicts_with = "results")]
    pub data: Option<PathBuf>,
    /// With --data: where results and plots go.
    #[arg(long, default_value = "target/compare")]
    pub out_dir: PathBuf,
    /// With --data: ranks.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// With --data: the policies to run, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    pub policies: String,
    /// With --data: arguments passed to every `datahelix train` (e.g. "--steps 20 --workers 4").
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub train_args: String,
    /// With --data: the MPI launcher.
    #[arg(long, default_value = "mpirun")]
    pub mpirun: String,
}

/// Runs `datahelix compare`.
pub fn run(args: CompareArgs) -> Result<i32, CliError> {
    let (results, plots_dir) = match &args.data {
        Some(data) => {
            let results = run_policies(&args, data)?;
            (results, Some(args.plots.clone().unwrap_or_else(|| args.out_dir.join("plots"))))
        }
        None => {
            if args.results.is_empty() {
                return Err(CliError::usage(
                    "compare needs --data DIR (run every policy) or --results FILE_OR_DIR... (result files of `datahelix train --out`)",
                ));
            }
            (load_results(&args.results)?, args.plots.clone())
        }
    };
    let report = report(&results, plots_dir.as_deref())?;
    if args.json {
        write_json(&report, None)?;
    } else {
        print!("{}", report.table());
        for p in &report.plots {
            println!("plot: {}", p.display());
        }
    }
    Ok(0)
}

/// Runs `mpirun -np R datahelix train --policy P` for each policy on the same data, batches,
/// CPU budget and accelerator profile; returns the results in policy order.
fn run_policies(args: &CompareArgs, data: &Path) -> Result<Vec<(String, TrainResult)>, CliError> {
    let policies: Vec<crate::policy::Policy> = if args.policies == "all" {
        crate::policy::Policy::ALL.to_vec()
    } else {
        args.policies
            .split(',')
            .map(|p| p.trim().parse().map_err(CliError::usage))
            .collect::<Result<_, _>>()?
    };
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| CliError::usage(format!("cannot create {}: {e}", args.out_dir.display())))?;
    let exe =
        std::env::current_exe().map_err(|e| CliError::usage(format!("cannot find this program: {e}")))?;
    let extra: Vec<&str> = args.train_args.split_whitespace().collect();
    let mut out = Vec::new();
    for (k, policy) in policies.iter().enumerate() {
        let file = args.out_dir.join(format!("{policy}.json"));
        let trace = args.out_dir.join(format!("{policy}.trace.json"));
        eprintln!("compare: [{}/{}] {policy} on {} ranks ...", k + 1, policies.len(), args.ranks);
        let status = std::process::Command::new(&args.mpirun)
            .args(["-np", &args.ranks.to_string()])
            .arg(&exe)
            .arg("train")
            .arg("--data")
            .arg(data)
            .args(["--policy", policy.name()])
            .args(&extra)
            .arg("--out")
            .arg(&file)
            .arg("--trace")
            .arg(&trace)
            .status()
            .map_err(|e| {
                CliError::usage(format!(
                    "cannot run {}: {e}; is MPI installed (scripts/setup.sh)?",
                    args.mpirun
                ))
            })?;
        if !status.success() {
            return Err(CliError {
                code: 3,
                message: format!("compare: {policy} failed ({status}); see its output above"),
            });
        }
        out.extend(load_results(std::slice::from_ref(&file))?);
    }
    Ok(out)
}

/// Reports results keyed by policy: the summaries in table order with speed-ups over
/// `rank-local`, and, with `plots_dir`, the three plots written there (created if missing).
/// Errors (exit 2) on no results, a policy given twice, or a plot that cannot be drawn.
pub fn report(
    results: &[(String, TrainResult)],
    plots_dir: Option<&Path>,
) -> Result<CompareReport, CliError> {
    if results.is_empty() {
        return Err(CliError::usage("compare: no results to report"));
    }
    for (i, (p, _)) in results.iter().enumerate() {
        if results[..i].iter().any(|(q, _)| q == p) {
            return Err(CliError::usage(format!("compare: two results for policy {p}; give one per policy")));
        }
    }
    let plot_paths = match plots_dir {
        Some(dir) => plots::write_all(results, dir).map_err(|e| CliError::usage(e.to_string()))?,
        None => Vec::new(),
    };
    let summaries = results.iter().map(|(p, r)| (p.clone(), r.summary.clone())).collect();
    Ok(CompareReport::new(summaries, plot_paths))
}

/// Reads result files, expanding folders to the `*.json` files directly inside them (sorted;
/// documents there without `records` or `summary` are passed over). Each result is keyed by its
/// `params.policy`, else its file stem. A malformed file is an error naming it; so is a policy
/// that two files claim.
pub fn load_results(paths: &[PathBuf]) -> Result<Vec<(String, TrainResult)>, CliError> {
    let mut out: Vec<(String, TrainResult, PathBuf)> = Vec::new();
    for path in paths {
        let (files, from_dir) = if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|e| CliError::usage(format!("cannot read folder {}: {e}", path.display())))?;
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
                .collect();
            files.sort();
            (files, true)
        } else {
            (vec![path.clone()], false)
        };
        for file in files {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| CliError::usage(format!("cannot read result {}: {e}", file.display())))?;
            let doc: Value = serde_json::from_str(&text)
                .map_err(|e| CliError::usage(format!("{} is not JSON: {e}", file.display())))?;
            if from_dir && !(doc.get("records").is_some() || doc.get("summary").is_some()) {
                tracing::info!("compare: {} is not a train result; passed over", file.display());
                continue;
            }
            let result = parse_result(doc).map_err(|e| {
                CliError::usage(format!("{} is not a `datahelix train` result: {e}", file.display()))
            })?;
            let policy = match result.policy() {
                Some(p) => p.to_string(),
                None => file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
            };
            if let Some((_, _, first)) = out.iter().find(|(p, _, _)| *p == policy) {
                return Err(CliError::usage(format!(
                    "{} and {} are both results of policy {policy}; give one per policy",
                    first.display(),
                    file.display()
                )));
            }
            out.push((policy, result, file));
        }
    }
    if out.is_empty() {
        return Err(CliError::usage("compare: no result files found in --results"));
    }
    Ok(out.into_iter().map(|(p, r, _)| (p, r)).collect())
}

/// Overlays `given`'s keys on `T::default()`'s JSON, so a document that carries only the keys
/// `shared/CLI.md` lists (as an outside loader's may) still reads.
fn with_defaults<T>(given: &Value, what: &str) -> Result<T, String>
where
    T: Default + serde::Serialize + serde::de::DeserializeOwned,
{
    let Some(given) = given.as_object() else {
        return Err(format!("{what} is not a JSON object"));
    };
    let mut base = serde_json::to_value(T::default()).map_err(|e| e.to_string())?;
    if let Some(base) = base.as_object_mut() {
        for (k, v) in given {
            base.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(base).map_err(|e| format!("{what}: {e}"))
}

/// A `train` result document: `params` (any JSON; `{}` when absent), `records` and `summary`
/// (both required; keys missing from a record or the summary take their defaults).
pub fn parse_result(doc: Value) -> Result<TrainResult, String> {
    if !doc.is_object() {
        return Err("the document is not a JSON object".into());
    }
    let records = match doc.get("records") {
        Some(Value::Array(rs)) => rs
            .iter()
            .enumerate()
            .map(|(i, r)| with_defaults::<RankStep>(r, &format!("record {i}")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => return Err("`records` is not an array".into()),
        None => return Err("no `records`".into()),
    };
    let summary = match doc.get("summary") {
        Some(s) => with_defaults::<Summary>(s, "summary")?,
        None => return Err("no `summary`".into()),
    };
    let params = doc.get("params").cloned().unwrap_or_else(|| Value::Object(Default::default()));
    Ok(TrainResult { params, records, summary })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_minimal_protocol_document_reads() {
        let doc = json!({
            "params": {"policy": "rank-local"},
            "records": [{"rank": 0, "step": 0, "input_wait_s": 0.1, "gpu_s": 0.2, "ids": [1], "skipped": []}],
            "summary": {"throughput": 10.0, "miss_rate": 0.5, "miss_rate_10ms": 0.5, "p50_wait_s": 0.1,
                        "p95_wait_s": 0.1, "max_wait_s": 0.1, "efficiency": 0.5, "rebalances_run": 0,
                        "rebalances_skipped": 0, "bytes_moved": 0}
        });
        let r = parse_result(doc).unwrap();
        assert_eq!(r.policy(), Some("rank-local"));
        assert_eq!(r.records[0].ids, vec![1]);
        assert_eq!(r.summary.throughput, 10.0);
        assert!(r.summary.step_max_wait_s.is_empty());
    }

    #[test]
    fn malformed_documents_say_what_is_wrong() {
        assert!(parse_result(json!([1])).unwrap_err().contains("not a JSON object"));
        assert!(parse_result(json!({"summary": {}})).unwrap_err().contains("records"));
        assert!(parse_result(json!({"records": []})).unwrap_err().contains("summary"));
        let e = parse_result(json!({"records": [{}, {"rank": "x"}], "summary": {}})).unwrap_err();
        assert!(e.starts_with("record 1:"), "{e}");
        let e = parse_result(json!({"records": [], "summary": {"throughput": "fast"}})).unwrap_err();
        assert!(e.starts_with("summary:"), "{e}");
    }

    #[test]
    fn report_refuses_empty_and_duplicate_input() {
        assert_eq!(report(&[], None).unwrap_err().code, super::super::EXIT_USAGE);
        let r = TrainResult::default();
        let dup = vec![("helix".to_string(), r.clone()), ("helix".to_string(), r)];
        assert!(report(&dup, None).unwrap_err().message.contains("two results for policy helix"));
    }
}
