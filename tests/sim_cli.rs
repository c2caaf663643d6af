//! `datahelix sim`: the JSON shapes of shared/CLI.md, and clear errors on bad workload files.

mod common;

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("sim").args(args).output().unwrap()
}

#[test]
fn workload_json_has_the_documented_shape() {
    let out = sim(&["--workload", "scripts/workloads/panda70m.toml", "--steps", "5", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["workload"], "panda70m");
    assert_eq!(v["ranks"], 8);
    for p in ["rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement", "helix"] {
        for k in ["throughput", "miss_rate", "p95_wait_s", "efficiency"] {
            assert!(v["policies"][p][k].is_number(), "{p}.{k}");
        }
    }
}

#[test]
fn bad_workload_files_say_which_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string("scripts/workloads/panda70m.toml").unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, text.replace("workers_per_rank = 1", "workers_per_rank = 0")).unwrap();
    let out = sim(&["--workload", bad.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("run.workers_per_rank"), "{err}");
    let missing = dir.path().join("nocal.toml");
    std::fs::write(&missing, text.replace("[model]", "calibration = \"nowhere.json\"\n[model]")).unwrap();
    let out = sim(&["--workload", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere.json"));
    let out = sim(&[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_cpu_quota_period_is_checked_and_changes_when_short_jobs_run() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--workload",
            "scripts/workloads/panda70m.toml",
            "--steps",
            "12",
            "--policy",
            "rank-local",
            "--json",
        ];
        args.extend_from_slice(extra);
        sim(&args)
    };
    for bad in ["0", "-5", "NaN", "inf", "0.5", "2000"] {
        let arg = format!("--cfs-period-ms={bad}");
        let out = run(&[&arg]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--cfs-period-ms"), "{bad}");
    }
    let wall = |out: std::process::Output| -> f64 {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["policies"]["rank-local"]["throughput"].as_f64().unwrap()
    };
    // panda70m decodes one short clip at a time on a worker and a fraction of a core: in 100-ms
    // periods a job waits for its rank's share to come round; the run's pace moves with it.
    let (smooth, grained) = (wall(run(&[])), wall(run(&["--cfs-period-ms", "100"])));
    assert!(smooth > 0.0 && grained > 0.0);
    assert_ne!(smooth, grained, "the quota's grain changed nothing");
}

/// `sim --data --links`: the links come from `datahelix perf alltoallv --json`; slow ones slow
/// a policy that moves tensors every step, and a bad file is named.
#[test]
fn measured_links_change_what_moving_tensors_costs() {
    let data = common::tiny_dataset();
    let dir = tempfile::tempdir().unwrap();
    // A perf document of links at ~10 kB/s with 5 ms of latency.
    let slow = dir.path().join("slow.json");
    let rows: Vec<serde_json::Value> = [1u64 << 10, 1 << 14, 1 << 18, 1 << 22]
        .iter()
        .map(|&size| serde_json::json!({"size": size, "time_us": 5000.0 + 100.0 * size as f64}))
        .collect();
    let doc = serde_json::json!({"op": "alltoallv", "ranks": 2, "backend": "mpi", "rows": rows});
    std::fs::write(&slow, doc.to_string()).unwrap();
    let run = |extra: &[&str]| {
        let mut args =
            vec!["--data", data.to_str().unwrap(), "--ranks", "2", "--global-batch", "4", "--steps", "8"];
        args.extend_from_slice(&["--policy", "actor-pool", "--json"]);
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["policies"]["actor-pool"]["throughput"].as_f64().unwrap()
    };
    let (fast, slowed) = (run(&[]), run(&["--links", slow.to_str().unwrap()]));
    assert!(slowed < fast * 0.5, "slow links: {slowed} samples/s, default: {fast}");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"op\": \"allreduce\"}").unwrap();
    let out = sim(&["--data", data.to_str().unwrap(), "--links", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad.json"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--records` with a workload writes each policy's per-rank steps, complete enough to give the
/// run's summary again (the sound bound included) from the records alone.
#[test]
fn a_workloads_records_give_its_summary_again() {
    use datahelix::metrics::{summarize, RankStep, RunShape};
    let dir = tempfile::tempdir().unwrap();
    let out = sim(&[
        "--workload",
        "scripts/workloads/egoexo4d_4k.toml",
        "--ranks",
        "4",
        "--steps",
        "12",
        "--policy",
        "rank-local,helix",
        "--records",
        dir.path().to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cores = v["cores_per_rank"].as_f64().unwrap() * 4.0;
    for p in ["rank-local", "helix"] {
        let text = std::fs::read_to_string(dir.path().join(format!("sim-{p}.json"))).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        let records: Vec<RankStep> = serde_json::from_value(doc["records"].clone()).unwrap();
        assert_eq!(records.len(), 4 * 12, "{p}");
        // Camera originals: every delivered sample carries its keyframe run (fact 4 of the bound).
        assert!(records.iter().all(|r| r.sample_chain_s.len() == r.ids.len()), "{p}");
        let again = summarize(&records, RunShape { warmup: 5, ranks: 4, cores, lookahead: 2 });
        let said = v["policies"][p]["efficiency"].as_f64().unwrap();
        assert!(
            (again.efficiency - said).abs() < 1e-9,
            "{p}: {} from the records, {said} printed",
            again.efficiency
        );
        assert!(again.efficiency > 0.0 && again.efficiency <= 1.0, "{p}: {}", again.efficiency);
        // The bound for loaders that split before the noise (fact 5) likewise, never below.
        let blind = v["policies"][p]["blind_efficiency"].as_f64().unwrap();
        assert!(
            (again.blind_efficiency - blind).abs() < 1e-9,
            "{p}: {} from the records, {blind} printed",
            again.blind_efficiency
        );
        assert!(blind >= again.efficiency, "{p}: blind {blind} below the sound {}", again.efficiency);
    }
    // Policies not asked for are not written.
    assert!(!dir.path().join("sim-actor-pool.json").exists());
}

/// `scripts/split_quality.py` reads what `--records` writes: the policy's split before noise is
/// no shorter than the lower bound of any split, and a split that knows the noise (best-fit
/// decreasing into the noisy rooms) ends before the policy's realised steps, which meet the
/// noise unseen (on this run 6% longer than best-fit's split, measured 2026-12-06).
#[test]
fn split_quality_reads_a_workloads_records() {
    let dir = tempfile::tempdir().unwrap();
    let out = sim(&[
        "--workload",
        "scripts/workloads/opensora12_buckets.toml",
        "--ranks",
        "16",
        "--steps",
        "12",
        "--policy",
        "helix",
        "--records",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("python3")
        .arg("scripts/split_quality.py")
        .arg(dir.path().join("sim-helix.json"))
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let number_after = |key: &str| -> f64 {
        let at = text.find(key).unwrap_or_else(|| panic!("{key:?} in {text}")) + key.len();
        text[at..]
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .find(|s| !s.is_empty())
            .unwrap()
            .parse()
            .unwrap()
    };
    let own = number_after("noise-free: the policy's split ");
    let lower = number_after("no split below ");
    let realised = number_after("realised (with noise): the policy's split ");
    let oracle = number_after("knows noise (7 steps): ");
    assert!(own >= lower - 1e-3, "{text}");
    assert!(oracle <= realised + 1e-3, "{text}");
}

/// `scripts/suite_tables.py` reads what `sim --suite --json` writes: its regime table carries the
/// JSON's ratios, and its check of issue 20's targets names the workload, policy and value that
/// break one, and exits 1.
#[test]
fn suite_tables_read_a_suite_and_name_what_fails() {
    let dir = tempfile::tempdir().unwrap();
    let suite = dir.path().join("suite");
    std::fs::create_dir(&suite).unwrap();
    for f in ["panda70m.toml", "opensora12_buckets.toml", "calibration.json"] {
        std::fs::copy(common::repo().join("scripts/workloads").join(f), suite.join(f)).unwrap();
    }
    let run = dir.path().join("s8_1.0.json");
    let out = sim(&["--suite", suite.to_str().unwrap(), "--steps", "10", "--cpu-per-accel", "1.0", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&run, &out.stdout).unwrap();
    let tables = |args: &[&std::ffi::OsStr]| {
        let out =
            Command::new("python3").arg("scripts/suite_tables.py").args(args).output().expect("python3 runs");
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (code, text) = tables(&["regimes".as_ref(), run.as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    for (regime, g) in doc["regimes"].as_object().unwrap() {
        let vs = g["geomean_speedup_vs"]["rank-local"].as_f64().unwrap();
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {regime} |")))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(row.contains(&format!("| {vs:.2}× |")), "{row}");
    }
    let (code, text) = tables(&["budgets".as_ref(), run.as_os_str()]);
    let all = doc["suite"]["geomean_speedup_vs"]["rank-local"].as_f64().unwrap();
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.starts_with("| regime | 8, X=1.0 |") && text.contains(&format!("| **all** | {all:.2}× / ")),
        "{text}"
    );
    let (code, text) =
        tables(&["workloads".as_ref(), "--only".as_ref(), "panda70m".as_ref(), run.as_os_str()]);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("| panda70m | 8 | 1.0 |")).count(), 1, "{text}");
    assert!(!text.contains("opensora"), "{text}");
    let (code, text) = tables(&["check".as_ref(), run.as_os_str()]);
    assert!(code == Some(0) || code == Some(1), "{text}");
    assert!(text.contains("holds: no policy above efficiency 1"), "{text}");
    // A run where helix reports more than the bound and misses more than rank-local, and falls
    // short of the bound where a loader blind to the noise could expect more.
    let mut bad = doc.clone();
    for w in bad["workloads"].as_array_mut().unwrap() {
        if w["workload"] == "panda70m" {
            w["policies"]["helix"]["efficiency"] = 1.5.into();
            w["policies"]["helix"]["miss_rate"] = 0.9.into();
            w["policies"]["rank-local"]["miss_rate"] = 0.3.into();
        } else {
            w["policies"]["helix"]["efficiency"] = 0.5.into();
            w["policies"]["helix"]["blind_efficiency"] = 0.625.into();
        }
    }
    let bad_run = dir.path().join("bad_0.75.json");
    std::fs::write(&bad_run, serde_json::to_vec(&bad).unwrap()).unwrap();
    let (code, text) = tables(&["check".as_ref(), bad_run.as_os_str()]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("FAILS: no policy above efficiency 1\n    panda70m helix 1.500 (8 ranks, X = 0.75)"),
        "{text}"
    );
    assert!(text.contains("panda70m 1 ms 0.900 > 0.300 / 3 (8 ranks, X = 0.75)"), "{text}");
    // The ceiling is efficiency / blind efficiency: the run's sound bound over its blind one.
    assert!(
        text.contains(
            "opensora-1.2-buckets 0.500 (8 ranks, X = 0.75; a loader blind to the noise can expect at most 0.800)"
        ),
        "{text}"
    );
    // A run whose budget is neither in its name nor given.
    let unnamed = dir.path().join("run.json");
    std::fs::copy(&run, &unnamed).unwrap();
    let (code, text) = tables(&["check".as_ref(), unnamed.as_os_str()]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("run.json") && text.contains("X=FILE"), "{text}");
}

/// Helix's gate decides from the plan's sizes, so the samples it moves cross while the step
/// before trains (`Ship`), off the input-wait path: in the simulator decoding runs ahead, so
/// every move of a workload that rebalances happens there.
#[test]
fn the_rebalance_moves_samples_ahead_of_their_step() {
    let out = sim(&["--workload", "scripts/workloads/panda70m.toml", "--policy", "helix", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let helix = &v["policies"]["helix"];
    let (runs, ahead, late) = (
        helix["rebalances_run"].as_u64().unwrap(),
        helix["moved_ahead"].as_u64().unwrap(),
        helix["moved_at_collection"].as_u64().unwrap(),
    );
    assert!(runs > 0, "panda70m rebalances under helix: {helix}");
    assert!(ahead >= runs, "every rebalance moves a sample: {runs} run, {ahead} moved ahead");
    assert_eq!(late, 0, "no move waited for its step's collection: {helix}");
}

/// `sim --workload scripts/workloads/FILE --cpu-per-accel 1.25 --policy POLICIES --json`: a
/// CPU budget a quarter short of the decode work, where the CPUs set a step's length.
fn at_a_short_budget(file: &str, policies: &str) -> serde_json::Value {
    let workload = format!("scripts/workloads/{file}");
    let out = sim(&["--workload", &workload, "--cpu-per-accel", "1.25", "--policy", policies, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rate(p: &serde_json::Value, k: &str) -> f64 {
    p[k].as_f64().unwrap()
}

/// Helix waits over 1 ms and over 10 ms on at most a third as many rank-steps as rank-local.
fn assert_a_third_of_rank_locals_misses(v: &serde_json::Value) {
    let (helix, local) = (&v["policies"]["helix"], &v["policies"]["rank-local"]);
    for k in ["miss_rate", "miss_rate_10ms"] {
        assert!(rate(helix, k) <= rate(local, k) / 3.0, "{k}: helix {helix} against rank-local {local}");
    }
}

/// Rank-local misses on at least 5% of rank-steps; helix on at most a third as many, and it
/// trains faster.
fn assert_helix_misses_a_third_and_trains_faster(v: &serde_json::Value) {
    let (helix, local) = (&v["policies"]["helix"], &v["policies"]["rank-local"]);
    assert!(rate(local, "miss_rate") >= 0.05, "rank-local should miss here: {local}");
    assert_a_third_of_rank_locals_misses(v);
    assert!(
        rate(helix, "throughput") > rate(local, "throughput"),
        "helix {helix} against rank-local {local}"
    );
}

#[test]
fn a_decode_bound_step_waits_at_the_sync_not_at_the_input() {
    // mmc4 at the short budget. Balanced to the last token, every rank would wait for its next
    // batch every step (80% of rank-steps before helix stretched such steps past the CPUs'
    // pace); rank-local's unbalanced steps give most ranks' CPUs time. Helix must miss less
    // than a third as often, and still train faster than rank-local.
    let v = at_a_short_budget("mmc4_interleaved.toml", "all");
    assert_helix_misses_a_third_and_trains_faster(&v);
    let (helix, local) = (&v["policies"]["helix"], &v["policies"]["rank-local"]);
    // It is the stretch that does it, nearly every step here; the DataLoader-style baselines
    // never stretch.
    let stretched = |p: &serde_json::Value| p["stretched_steps"].as_u64().unwrap();
    let steps = v["steps"].as_u64().unwrap();
    assert!(stretched(helix) > steps / 2, "{} of {steps} steps stretched: {helix}", stretched(helix));
    assert_eq!(stretched(local), 0, "{local}");
}

#[test]
fn split_samples_pace_the_cpus_by_their_pieces() {
    // miradata's minute-long clips are decoded in pieces. Their whole-clip predictions overstate
    // the pieces' work by ~13%, and a pace taken from them stretched 197 of 200 steps at this
    // budget although the CPUs kept up (helix misses 0.001 of rank-steps unstretched) and cost
    // 10% of throughput. Paced by the planned pieces, helix stretches a minority of steps and
    // still misses far less than rank-local.
    let v = at_a_short_budget("miradata_long.toml", "helix,rank-local");
    let helix = &v["policies"]["helix"];
    let steps = v["steps"].as_u64().unwrap();
    let stretched = helix["stretched_steps"].as_u64().unwrap();
    assert!(stretched < steps / 4, "{stretched} of {steps} steps stretched: {helix}");
    assert_a_third_of_rank_locals_misses(&v);
}

#[test]
fn two_samples_a_rank_pace_the_cpus_by_the_steps_ahead() {
    // cogvideox's sixteen clips a step vary their decode by far more than a step of 64
    // does: paced by the mean of the last eight planned steps, helix missed 0.107 of rank-steps
    // at this budget, rank-local 0.097. Paced mostly by the steps that decode while a step
    // trains (the sampler knows them), it must miss under a third of rank-local's rate.
    let v = at_a_short_budget("cogvideox_latents.toml", "helix,rank-local");
    assert_helix_misses_a_third_and_trains_faster(&v);
}

/// Where no split of a step keeps any accelerator busy as long as the CPUs take (the tiny
/// dataset, two samples a rank, 0.075 of a core a rank, 20-ms accelerator steps), every rank
/// waits for its input unless one waits for all: with late ranks (`train`'s default) one rank
/// trains the stretched batch and its pieces reach it after the others' batches are collected.
/// Helix's misses halve (0.95 → 0.48 of rank-steps, deterministic) at a few percent of
/// throughput; with `--no-late-pieces` no step has a late rank.
#[test]
fn a_late_rank_takes_the_wait_the_cpus_leave() {
    let data = common::tiny_dataset();
    let run = |extra: &[&str]| {
        let mut args =
            vec!["--data", data.to_str().unwrap(), "--ranks", "4", "--workers", "4", "--cores", "0.3"];
        args.extend_from_slice(&["--global-batch", "8", "--steps", "30", "--warmup", "3"]);
        args.extend_from_slice(&["--profile", "0.02,1e-6,0,0.05", "--policy", "helix", "--json"]);
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["policies"]["helix"].clone()
    };
    let (late, plain) = (run(&[]), run(&["--no-late-pieces"]));
    let late_steps = |p: &serde_json::Value| p["late_steps"].as_u64().unwrap();
    assert!(late_steps(&late) > 15, "{late}");
    assert_eq!(late_steps(&plain), 0, "{plain}");
    let miss = |p: &serde_json::Value| p["miss_rate"].as_f64().unwrap();
    assert!(
        miss(&late) < 0.6 * miss(&plain),
        "misses {} with late ranks, {} without",
        miss(&late),
        miss(&plain)
    );
    let thr = |p: &serde_json::Value| p["throughput"].as_f64().unwrap();
    assert!(
        thr(&late) > 0.9 * thr(&plain),
        "throughput {} with late ranks, {} without",
        thr(&late),
        thr(&plain)
    );
}

/// Camera originals (egoexo4d-4k, 8 ranks, 8 samples a rank): most clips keep a target ~250 4K
/// frames past their keyframe, 6–9 s of decoding in order, begun two steps (~4 s) ahead of
/// their batch: late wherever they are decoded. Spread by accelerator balance they hold nearly
/// every rank; grouped on the last ranks (`plan::late`) they hold only those, whose pieces cross
/// after the others' batches are collected. Misses 0.70 → 0.35 of rank-steps (deterministic),
/// under rank-local's 0.43, at 2.2% of throughput.
#[test]
fn chains_late_wherever_they_decode_wait_on_the_last_ranks() {
    let workload = common::repo().join("scripts/workloads/egoexo4d_4k.toml");
    let run = |extra: &[&str]| {
        let mut args =
            vec!["--workload", workload.to_str().unwrap(), "--policy", "helix,rank-local", "--json"];
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["policies"].clone()
    };
    let (late, plain) = (run(&[]), run(&["--no-late-pieces"]));
    let (grouped, spread, rank_local) = (&late["helix"], &plain["helix"], &late["rank-local"]);
    assert!(grouped["late_steps"].as_u64().unwrap() > 20, "{grouped}");
    assert_eq!(spread["late_steps"].as_u64(), Some(0), "{spread}");
    let miss = |p: &serde_json::Value| p["miss_rate"].as_f64().unwrap();
    assert!(miss(grouped) < 0.7 * miss(spread), "misses {} grouped, {} spread", miss(grouped), miss(spread));
    assert!(
        miss(grouped) <= miss(rank_local),
        "misses {} grouped, rank-local {}",
        miss(grouped),
        miss(rank_local)
    );
    let thr = |p: &serde_json::Value| p["throughput"].as_f64().unwrap();
    assert!(thr(grouped) > 0.95 * thr(spread), "throughput {} grouped, {} spread", thr(grouped), thr(spread));
}

/// `datahelix frontier` reads what `--records` writes: on the camera originals no schedule as
/// fast as helix's run gets by without misses, no run is faster than the frontier allows at its
/// own misses, and a file that is not a run's results is named in a usage error.
#[test]
fn the_frontier_reads_a_workloads_records() {
    let dir = tempfile::tempdir().unwrap();
    let out = sim(&[
        "--workload",
        "scripts/workloads/egoexo4d_4k.toml",
        "--ranks",
        "8",
        "--steps",
        "30",
        "--policy",
        "rank-local,helix",
        "--records",
        dir.path().to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let frontier = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("frontier").args(args).output().unwrap()
    };
    for p in ["rank-local", "helix"] {
        let file = dir.path().join(format!("sim-{p}.json"));
        let out = frontier(&[file.to_str().unwrap(), "--grid", "32", "--at", "0.1", "--json"]);
        assert!(out.status.success(), "{p}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (v["ranks"].as_u64(), v["steps"].as_u64(), v["lookahead"].as_u64()),
            (Some(8), Some(25), Some(2))
        );
        let (wall, misses) = (v["wall_s"].as_f64().unwrap(), v["miss_rate"].as_f64().unwrap());
        let rows = v["frontier"].as_array().unwrap();
        let at = |rate: f64| {
            rows.iter().find(|r| (r["miss_rate"].as_f64().unwrap() - rate).abs() < 1e-12).unwrap()
                ["least_wall_s"]
                .as_f64()
                .unwrap()
        };
        assert!(wall >= at(misses), "{p}: {wall} s, the frontier says at least {} s at {misses}", at(misses));
        // Fewer misses never cost less time.
        assert!(at(0.0) >= at(0.1) && at(0.1) >= at(0.5), "{p}: {rows:?}");
        if p == "helix" {
            assert!(v["least_miss_rate_at_wall"].as_f64().unwrap() > 0.0, "{v}");
        }
    }
    std::fs::write(dir.path().join("not.json"), "{\"steps\": 3}").unwrap();
    let out = frontier(&[dir.path().join("not.json").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not.json") && err.contains("records"), "{err}");
    // A run too long for the grid asked is refused before the work, with what to change.
    let steps: Vec<serde_json::Value> = (0..20_000)
        .map(|t| {
            serde_json::json!({"rank": 0, "step": t, "input_wait_s": 0.0, "gpu_s": 1.0, "ids": [],
                "skipped": [], "start_s": t as f64, "end_s": t as f64 + 1.0, "max_sample_gpu_s": 0.0,
                "decode_cpu_s": 0.0, "tokens": 0, "bytes_in": 0})
        })
        .collect();
    let long = dir.path().join("long.json");
    std::fs::write(&long, serde_json::json!({ "records": steps }).to_string()).unwrap();
    let out = frontier(&[long.to_str().unwrap(), "--grid", "256"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("long.json") && err.contains("hours") && err.contains("--grid"), "{err}");
    let out = frontier(&[long.to_str().unwrap(), "--grid", "512"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--grid 512"));
}
