//! `datahelix compare --results`: the table, the `--json` document and the plots, from synthetic
//! `train` results written to a temporary folder; and `scripts/demo_table.py`, the README's demo
//! table, over several such folders.
//!
//! Set `DATAHELIX_REPORT_KEEP=DIR` to keep the rendered plots in DIR for a look.

mod common;

use std::path::{Path, PathBuf};

use datahelix::metrics::table::CompareReport;
use datahelix::metrics::{summarize, RankStep, RunShape, TrainResult};
use serde_json::{json, Value};

const RANKS: u32 = 4;
const STEPS: u64 = 40;
const WARMUP: u64 = 4;

/// A deterministic synthetic run: each step every rank computes ~50 ms; `wait(rank, step)` is the
/// rank's input wait; the step ends when the slowest rank's all-reduce ends (+2 ms).
fn synthetic(
    policy: &str,
    wait: impl Fn(u32, u64) -> f64,
    rebalances: (u64, u64),
    bytes_moved: u64,
) -> TrainResult {
    let mut records = Vec::new();
    let mut start = 0.0;
    for step in 0..STEPS {
        let rows: Vec<(u32, f64, f64)> = (0..RANKS)
            .map(|rank| {
                let gpu = 0.05 + 0.004 * f64::from((rank * 7 + step as u32 * 3) % 5);
                (rank, wait(rank, step), gpu)
            })
            .collect();
        let end = start + rows.iter().map(|(_, w, g)| w + g).fold(0.0, f64::max) + 0.002;
        for (rank, w, g) in rows {
            let first = step * u64::from(RANKS) * 2 + u64::from(rank) * 2;
            records.push(RankStep {
                rank,
                step,
                input_wait_s: w,
                gpu_s: g,
                ids: vec![first, first + 1],
                start_s: start,
                end_s: end,
                max_sample_gpu_s: g * 0.6,
                decode_cpu_s: 0.03,
                tokens: 1000,
                ..RankStep::default()
            });
        }
        start = end;
    }
    let shape = RunShape { warmup: WARMUP, ranks: RANKS as usize, cores: 2.0, lookahead: 2 };
    let mut summary = summarize(&records, shape);
    summary.rebalances_run = rebalances.0;
    summary.rebalances_skipped = rebalances.1;
    summary.bytes_moved = bytes_moved;
    TrainResult {
        params: json!({"policy": policy, "ranks": RANKS, "warmup": WARMUP, "workers": 4, "cpu_budget": "unenforced"}),
        records,
        summary,
    }
}

/// rank-local: a straggling rank every third step; actor-pool: smaller, more frequent waits;
/// helix: sub-millisecond waits.
fn three_policies() -> Vec<(String, TrainResult)> {
    vec![
        (
            "helix".into(),
            synthetic("helix", |r, s| 0.0002 * f64::from(r) + 0.0001 * (s % 3) as f64, (30, 6), 48 << 20),
        ),
        (
            "rank-local".into(),
            synthetic(
                "rank-local",
                |r, s| if (s + u64::from(r)) % 3 == 0 { 0.04 + 0.01 * f64::from(r) } else { 0.0 },
                (0, 0),
                0,
            ),
        ),
        (
            "actor-pool".into(),
            synthetic(
                "actor-pool",
                |r, s| if (s * 7 + u64::from(r)) % 4 == 0 { 0.015 } else { 0.0015 },
                (0, 0),
                0,
            ),
        ),
    ]
}

fn write_results(dir: &Path, results: &[(String, TrainResult)]) {
    for (name, r) in results {
        std::fs::write(dir.join(format!("{name}.json")), serde_json::to_string_pretty(r).unwrap()).unwrap();
    }
}

fn compare(args: &[&str]) -> std::process::Output {
    common::run(common::datahelix().arg("compare").args(args))
}

/// `python3 scripts/demo_table.py FOLDER…`.
fn demo_table<P: AsRef<std::ffi::OsStr>>(folders: impl IntoIterator<Item = P>) -> std::process::Output {
    common::run(std::process::Command::new("python3").arg("scripts/demo_table.py").args(folders))
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A PNG that decodes, is at least `min_w` wide, and is not one flat colour.
fn check_png(path: &Path, min_w: u32) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.len() > 10 * 1024, "{} is only {} bytes", path.display(), bytes.len());
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{} has no PNG signature", path.display());
    let mut reader = png::Decoder::new(std::io::Cursor::new(&bytes)).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert!(info.width >= min_w && info.height >= 300, "{}: {}x{}", path.display(), info.width, info.height);
    let pixels = &buf[..info.buffer_size()];
    let first = &pixels[..3];
    let differing = pixels.chunks(3).filter(|p| p != &first).count();
    assert!(differing > 1000, "{} is nearly blank ({differing} non-background pixels)", path.display());
}

fn keep(plots: &[PathBuf]) {
    if let Some(dir) = std::env::var_os("DATAHELIX_REPORT_KEEP") {
        std::fs::create_dir_all(&dir).unwrap();
        for p in plots {
            std::fs::copy(p, Path::new(&dir).join(p.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn table_from_a_folder_with_plots() {
    let results = three_policies();
    let dir = tempfile::tempdir().unwrap();
    let res = dir.path().join("results");
    std::fs::create_dir(&res).unwrap();
    write_results(&res, &results);
    // A trace beside the results is passed over, not an error.
    std::fs::write(res.join("trace.json"), r#"{"traceEvents": []}"#).unwrap();
    let plots = dir.path().join("plots");

    let out = compare(&["--results", res.to_str().unwrap(), "--plots", plots.to_str().unwrap()]);
    assert!(out.status.success(), "compare failed: {}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("policy") && lines[0].contains("speed-up") && lines[0].contains("MiB moved"),
        "{text}"
    );
    let policies: Vec<&str> = lines[1..4].iter().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(policies, ["rank-local", "actor-pool", "helix"], "{text}");

    let thr = |p: &str| results.iter().find(|(n, _)| n == p).unwrap().1.summary.throughput;
    let cells = |i: usize| lines[i].split_whitespace().collect::<Vec<_>>();
    assert_eq!(cells(1)[2], "1.00x");
    assert_eq!(cells(2)[2], format!("{:.2}x", thr("actor-pool") / thr("rank-local")));
    assert_eq!(cells(3)[2], format!("{:.2}x", thr("helix") / thr("rank-local")));
    assert!(thr("helix") > thr("rank-local") * 1.2, "the synthetic helix run should be faster");
    // helix: no wait above 1 ms; 30/6 rebalances; 48 MiB moved.
    assert_eq!(&cells(3)[3..5], ["0.0%", "0.0%"]);
    assert_eq!(&cells(3)[9..], ["30/6", "48.0"]);

    let written: Vec<PathBuf> =
        lines.iter().filter_map(|l| l.strip_prefix("plot: ")).map(PathBuf::from).collect();
    assert_eq!(written.len(), 3, "{text}");
    for (p, name) in written.iter().zip(["wait_cdf.png", "timeline.png", "throughput.png"]) {
        assert_eq!(p.file_name().unwrap(), name);
        check_png(p, 700);
    }
    keep(&written);
}

#[test]
fn json_document() {
    let results = three_policies();
    let dir = tempfile::tempdir().unwrap();
    write_results(dir.path(), &results);
    let files: Vec<String> = ["helix", "rank-local", "actor-pool"]
        .iter()
        .map(|p| dir.path().join(format!("{p}.json")).display().to_string())
        .collect();
    let mut args = vec!["--json", "--results"];
    args.extend(files.iter().map(String::as_str));
    let out = compare(&args);
    assert!(out.status.success(), "compare failed: {}", stderr(&out));

    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let policies = v["policies"].as_object().unwrap();
    assert_eq!(policies.len(), 3);
    for key in [
        "throughput",
        "miss_rate",
        "miss_rate_10ms",
        "p50_wait_s",
        "p95_wait_s",
        "max_wait_s",
        "efficiency",
        "rebalances_run",
        "rebalances_skipped",
        "bytes_moved",
    ] {
        assert!(policies["helix"].get(key).is_some(), "summary lacks {key}");
    }
    assert_eq!(v["plots"], json!([]));
    // Table order survives in the JSON text; speed-ups are throughput ratios.
    let report: CompareReport = serde_json::from_str(&stdout(&out)).unwrap();
    let order: Vec<&str> = report.policies.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(order, ["rank-local", "actor-pool", "helix"]);
    let base = results[1].1.summary.throughput;
    let helix = v["speedup_vs_rank_local"]["helix"].as_f64().unwrap();
    assert!((helix - results[0].1.summary.throughput / base).abs() < 1e-12);
    assert_eq!(v["speedup_vs_rank_local"]["rank-local"].as_f64(), Some(1.0));
    assert_eq!(policies["helix"]["throughput"].as_f64(), Some(results[0].1.summary.throughput));
}

#[test]
fn policy_falls_back_to_the_file_stem() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = three_policies().remove(0).1;
    r.params = json!({"warmup": WARMUP});
    let file = dir.path().join("my-loader.json");
    std::fs::write(&file, serde_json::to_string(&r).unwrap()).unwrap();
    let out = compare(&["--json", "--results", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(v["policies"].get("my-loader").is_some(), "{v}");
    assert_eq!(v["speedup_vs_rank_local"], json!({}));
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("helix.json");
    std::fs::write(&good, serde_json::to_string(&three_policies()[0].1).unwrap()).unwrap();

    // Not JSON.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"records\": [").unwrap();
    let out = compare(&["--results", good.to_str().unwrap(), broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("broken.json"), "{}", stderr(&out));

    // JSON, wrong shape.
    let wrong = dir.path().join("wrong.json");
    std::fs::write(&wrong, r#"{"records": [{"rank": "zero"}], "summary": {}}"#).unwrap();
    let out = compare(&["--results", wrong.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("wrong.json") && err.contains("record 0"), "{err}");

    // A file explicitly named must be a result, even if it is a trace.
    let trace = dir.path().join("trace.json");
    std::fs::write(&trace, r#"{"traceEvents": []}"#).unwrap();
    let out = compare(&["--results", trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("trace.json"), "{}", stderr(&out));

    // Two results of one policy.
    let copy = dir.path().join("helix-again.json");
    std::fs::copy(&good, &copy).unwrap();
    let out = compare(&["--results", good.to_str().unwrap(), copy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("both results of policy helix"), "{}", stderr(&out));

    // Missing file, empty folder, no --results.
    let out = compare(&["--results", dir.path().join("absent.json").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("absent.json"));
    let empty = tempfile::tempdir().unwrap();
    let out = compare(&["--results", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let out = compare(&[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn report_api_without_plots() {
    let report = datahelix::cli::compare::report(&three_policies(), None).unwrap();
    assert!(report.plots.is_empty());
    assert_eq!(report.policies[0].0, "rank-local");
    assert!(report.table().lines().count() == 4);
}

/// `scripts/demo_table.py` (the README's demo table) reads the folders `compare` writes: per
/// policy the median and range over the runs, ratios taken within each run.
#[test]
fn demo_table_takes_medians_over_run_folders() {
    let runs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // Helix's throughput scaled by 1.0, 1.2 and 0.9 run by run, rank-local's by 1.1 in run 3.
    for (dir, (scale, rank_local_scale)) in runs.iter().zip([(1.0, 1.0), (1.2, 1.0), (0.9, 1.1)]) {
        let mut results = three_policies();
        results[0].1.summary.throughput *= scale;
        results[1].1.summary.throughput *= rank_local_scale;
        write_results(dir.path(), &results);
    }
    let base = three_policies();
    let throughput = |name: &str| base.iter().find(|(n, _)| n == name).unwrap().1.summary.throughput;
    let (helix, rank_local, actor_pool) =
        (throughput("helix"), throughput("rank-local"), throughput("actor-pool"));

    let out = demo_table(runs.iter().map(|d| d.path()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("| {name} |")))
            .unwrap_or_else(|| panic!("no {name} row:\n{text}"))
    };
    // Median of the three runs is run 1's; the range spans runs 3 and 2.
    let expected = format!("| helix | {:.2} ({:.2}–{:.2}) |", helix, 0.9 * helix, 1.2 * helix);
    assert!(row("helix").starts_with(&expected), "{}\nwanted {expected}", row("helix"));
    // Over rank-local within each run: 1.0, 1.2 and 0.9 / 1.1 of the ratio.
    let over = format!(
        "{:.2} ({:.2}–{:.2})×",
        helix / rank_local,
        0.9 * helix / (1.1 * rank_local),
        1.2 * helix / rank_local
    );
    assert!(row("helix").contains(&over), "{}\nwanted {over}", row("helix"));
    assert!(row("rank-local").contains("| 1.00 (1.00–1.00)× |"), "{}", row("rank-local"));
    let rank_local_row =
        format!("| rank-local | {:.2} ({:.2}–{:.2}) |", rank_local, rank_local, 1.1 * rank_local);
    assert!(row("rank-local").starts_with(&rank_local_row), "{}\nwanted {rank_local_row}", row("rank-local"));
    assert!(!text.contains("| post-balance |"), "a policy no run has gets no row:\n{text}");
    let ratios = format!(
        "helix over actor-pool: {:.3} ({:.3}–{:.3})×, runs: {:.3}, {:.3}, {:.3}",
        helix / actor_pool,
        0.9 * helix / actor_pool,
        1.2 * helix / actor_pool,
        helix / actor_pool,
        1.2 * helix / actor_pool,
        0.9 * helix / actor_pool
    );
    assert!(text.contains(&ratios), "{text}\nwanted {ratios}");

    // A folder with no results is named.
    let empty = tempfile::tempdir().unwrap();
    let out = demo_table([runs[0].path(), empty.path()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains(empty.path().to_str().unwrap()), "{}", stderr(&out));

    // Without rank-local there is nothing to take ratios over: said, naming the folder.
    let no_rank_local = tempfile::tempdir().unwrap();
    let others: Vec<_> = three_policies().into_iter().filter(|(name, _)| name != "rank-local").collect();
    write_results(no_rank_local.path(), &others);
    let out = demo_table([runs[0].path(), no_rank_local.path()]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains(no_rank_local.path().to_str().unwrap()), "{}", stderr(&out));
    assert!(!stderr(&out).contains("Traceback"), "{}", stderr(&out));

    // A damaged result, one without the summary's figures, or one with no throughput is named,
    // not a traceback or a division by zero.
    let zero = serde_json::to_string(
        &json!({"summary": {"throughput": 0.0, "miss_rate": 0.0, "miss_rate_10ms": 0.0,
        "p95_wait_s": 0.0, "efficiency": 0.0, "max_wait_s": 0.0}}),
    )
    .unwrap();
    for damaged in [
        "{\"summary\": {\"throughput\": 1.0",
        "{\"summary\": {\"throughput\": \"fast\"}}",
        "[1, 2]",
        zero.as_str(),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_results(dir.path(), &three_policies());
        let bad = dir.path().join("actor-pool.json");
        std::fs::write(&bad, damaged).unwrap();
        let out = demo_table([dir.path()]);
        assert!(!out.status.success(), "{damaged}: {}", stdout(&out));
        assert!(stderr(&out).contains(bad.to_str().unwrap()), "{damaged}: {}", stderr(&out));
        assert!(!stderr(&out).contains("Traceback"), "{damaged}: {}", stderr(&out));
    }
}
