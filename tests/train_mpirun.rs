//! End to end under `mpirun -np 4` on the tiny dataset: every policy delivers each sample of every
//! global batch exactly once (checked from the result's ids against the protocol's sampler),
//! `--check-plan` passes, a damaged file is skipped by every policy in the same way, and the
//! trace is valid JSON with one process per rank.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::results::{assert_exactly_once, step_checksums};
use serde_json::Value;

fn train(data: &Path, policy: &str, out: &Path, extra: &[&str]) -> Value {
    train_with(data, policy, out, "0.02,1e-6,0,0.05", extra)
}

/// `datahelix train` under `mpirun -np 4` with this accelerator profile.
fn train_with(data: &Path, policy: &str, out: &Path, profile: &str, extra: &[&str]) -> Value {
    train_on(&[], data, policy, out, profile, &[&["--steps", "6"], extra].concat())
}

/// [`train_with`], each rank started through `launcher` (a command that ends by running its
/// arguments); `extra` names the steps.
fn train_on(
    launcher: &[&str],
    data: &Path,
    policy: &str,
    out: &Path,
    profile: &str,
    extra: &[&str],
) -> Value {
    let mut cmd = std::process::Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", "4"]);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    common::train_args(cmd.args(launcher), data, policy, profile, out, extra);
    let started = Instant::now();
    let o = common::run_limited(&mut cmd, std::time::Duration::from_secs(300));
    assert!(started.elapsed() < Duration::from_secs(150), "{policy}: too slow");
    assert!(o.status.success(), "{policy} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

#[test]
fn every_policy_delivers_exactly_once_and_skips_the_same_bad_samples() {
    let tmp = common::copy_dataset(&common::tiny_dataset());
    let dir = tmp.path();
    // One file unusable at index time (text), one damaged after indexing (decode fails).
    let manifest = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    let paths: Vec<String> = manifest
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["path"].as_str().unwrap().to_string())
        .collect();
    let mp4s: Vec<&String> = paths.iter().filter(|p| p.ends_with(".mp4")).collect();
    std::fs::write(dir.join(mp4s[0]), b"not a video at all").unwrap();
    let o = common::run(common::datahelix().arg("index").arg(dir));
    assert!(o.status.success());
    let victim = dir.join(mp4s[1]);
    let bytes = std::fs::read(&victim).unwrap();
    std::fs::write(&victim, &bytes[..bytes.len() / 2]).unwrap();

    let ids = common::manifest_ids(dir);
    let out = tempfile::tempdir().unwrap();
    let mut skips_by_policy = Vec::new();
    for policy in ["rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement", "helix"] {
        let trace = out.path().join(format!("{policy}.trace.json"));
        // Two of the twelve samples are bad: far above the default skip budget (1%), which
        // tests/skip_budget.rs checks; here the skipping itself is tested.
        let mut extra = vec!["--trace", trace.to_str().unwrap(), "--max-skip-rate", "1"];
        if policy == "helix" {
            extra.push("--no-cpu-budget");
        }
        if policy == "helix-placement" {
            // Every clip with a keyframe between its sampled frames decodes in pieces, the
            // damaged one included: a failed piece must skip its sample like a failed decode.
            extra.extend(["--split-above", "0"]);
        }
        let result = train(dir, policy, &out.path().join(format!("{policy}.json")), &extra);
        let skipped = assert_exactly_once(&result, &ids);
        let total: usize = skipped.values().map(Vec::len).sum();
        assert!(total > 0, "{policy}: the damaged samples are in the batches and must be skipped");
        skips_by_policy.push((policy, skipped));
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
            "stretched_steps",
        ] {
            assert!(result["summary"].get(key).is_some(), "{policy}: summary misses {key}");
        }
        if !policy.starts_with("helix") {
            // Only a placement policy stretches a step to the CPUs' pace.
            assert_eq!(result["summary"]["stretched_steps"], 0, "{policy}");
        }
        // The emulated accelerator's records carry each sample's seconds (the bound's packing
        // and best-split terms), and no real run beats the bound by more than timing noise.
        for r in result["records"].as_array().unwrap() {
            let delivered = r["ids"].as_array().unwrap().len();
            let seconds = r.get("sample_gpu_s").and_then(Value::as_array).map_or(0, Vec::len);
            assert_eq!(seconds, delivered, "{policy}: a record's samples without their seconds: {r}");
        }
        let efficiency = result["summary"]["efficiency"].as_f64().unwrap();
        assert!(efficiency > 0.0 && efficiency <= 1.02, "{policy}: efficiency {efficiency}");
        let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).expect("trace is JSON");
        let pids: std::collections::BTreeSet<u64> = t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(pids.len(), 4, "{policy}: one trace process per rank");
    }
    // Every policy skips the same ids at the same steps.
    for (policy, skipped) in &skips_by_policy[1..] {
        let mut a: Vec<(u64, Vec<u64>)> = skipped
            .iter()
            .map(|(k, v)| {
                (*k, {
                    let mut v = v.clone();
                    v.sort();
                    v
                })
            })
            .collect();
        let mut b: Vec<(u64, Vec<u64>)> = skips_by_policy[0]
            .1
            .iter()
            .map(|(k, v)| {
                (*k, {
                    let mut v = v.clone();
                    v.sort();
                    v
                })
            })
            .collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{policy} skipped differently from rank-local");
    }
}

#[test]
fn samples_decoded_in_pieces_on_several_ranks_are_the_bytes_of_whole_decodes() {
    let dir = common::tiny_dataset();
    let ids = common::manifest_ids(&dir);
    let out = tempfile::tempdir().unwrap();
    let whole = train(&dir, "rank-local", &out.path().join("whole.json"), &["--checksums"]);
    let trace = out.path().join("pieces.trace.json");
    let extra = ["--checksums", "--split-above", "0", "--trace", trace.to_str().unwrap()];
    let pieces = train(&dir, "helix", &out.path().join("pieces.json"), &extra);
    assert_exactly_once(&pieces, &ids);
    assert_eq!(step_checksums(&pieces), step_checksums(&whole), "assembled pieces differ from whole decodes");
    // Pieces were really decoded, and some on a rank other than their sample's owner.
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let names: Vec<&str> =
        t["traceEvents"].as_array().unwrap().iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(names.iter().any(|n| n.starts_with("decode ") && n.contains(" frames ")), "no piece was decoded");
    // Each decode names the planner's prediction beside its measured span.
    let predicted: Vec<Option<f64>> = names
        .iter()
        .filter(|n| n.starts_with("decode "))
        .map(|n| n.split_once("predicted ").and_then(|(_, s)| s.trim_end_matches(" s)").parse().ok()))
        .collect();
    assert!(
        predicted.iter().all(|p| p.is_some_and(|s: f64| s.is_finite() && s >= 0.0))
            && predicted.iter().any(|p| p.is_some_and(|s| s > 0.0)),
        "decode spans without the planner's predicted seconds: {names:?}"
    );
    assert!(pieces["summary"]["bytes_moved"].as_u64().unwrap() > 0, "no piece moved between ranks");

    // With accelerator steps long enough for the pieces to be decoded and shipped while they
    // run, the owners put them together ahead of the batch's collection: the same bytes.
    let trace = out.path().join("ahead.trace.json");
    let extra = ["--checksums", "--split-above", "0", "--trace", trace.to_str().unwrap()];
    let ahead = train_with(&dir, "helix", &out.path().join("ahead.json"), "0.4,1e-6,0,0.05", &extra);
    assert_exactly_once(&ahead, &ids);
    assert_eq!(
        step_checksums(&ahead),
        step_checksums(&whole),
        "pieces assembled ahead differ from whole decodes"
    );
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let ahead_spans = t["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("assemble ahead")))
        .count();
    assert!(ahead_spans > 0, "no split sample was put together while the accelerator ran");
}

/// A step its CPUs cannot keep up with — 0.15 of a core a rank against 20-ms accelerator
/// steps — leaves ranks late (`plan::Plan::late_ranks`: the last ones, here also for clips whose
/// decode on one worker outlasts the time until their batch is due): the pieces others decode
/// for them cross after their own batches are collected, in an exchange each issues at the start
/// of its next call (a late rank, inside its own). Every sample still arrives once with the bytes of a whole decode, `--check-plan`
/// agrees on every round, and the run ends (half its steps had a late rank in runs here), also
/// under a byte budget smaller than its batches.
#[test]
fn a_late_ranks_pieces_arrive_after_collection_with_the_bytes_of_whole_decodes() {
    let dir = common::tiny_dataset();
    let ids = common::manifest_ids(&dir);
    let out = tempfile::tempdir().unwrap();
    let profile = "0.02,1e-6,0,0.05";
    let steps = ["--steps", "12", "--cores", "0.6", "--checksums"];
    let whole = train_on(&[], &dir, "rank-local", &out.path().join("whole.json"), profile, &steps);
    let trace = out.path().join("late.trace.json");
    let traced = [&steps[..], &["--trace", trace.to_str().unwrap()]].concat();
    let late = train_on(&[], &dir, "helix", &out.path().join("late.json"), profile, &traced);
    assert_exactly_once(&late, &ids);
    assert_eq!(step_checksums(&late), step_checksums(&whole), "pieces sent late differ from whole decodes");
    let late_steps = late["summary"]["late_steps"].as_u64().unwrap();
    assert!(late_steps > 0, "no step had a late rank: the test shows nothing");
    // The late ranks are the last ones ("late step S (ranks 2 3 late): N pieces in, M out"),
    // pieces reached them in their late exchanges, and only them.
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let mut pieces_in = [0u64; 4];
    for e in t["traceEvents"].as_array().unwrap() {
        let Some(rest) = e["name"].as_str().and_then(|n| n.strip_prefix("late step ")) else { continue };
        let (head, counts) = rest.split_once(": ").unwrap();
        let named = head.split_once("(ranks ").unwrap().1.trim_end_matches(" late)");
        let late: Vec<u64> = named.split(' ').map(|q| q.parse().unwrap()).collect();
        assert!(
            late.iter().rev().zip((0..4).rev()).all(|(&q, r)| q == r),
            "late ranks {late:?} are not the last"
        );
        let n: u64 = counts.split(' ').next().unwrap().parse().unwrap();
        let pid = e["pid"].as_u64().unwrap();
        assert!(n == 0 || late.contains(&pid), "rank {pid} got {n} late pieces, not late in {rest}");
        pieces_in[pid as usize] += n;
    }
    assert!(pieces_in[3] > 0, "no piece reached the last rank after its collection: {pieces_in:?}");
    // Under a byte budget smaller than the batches, a wait for the late rank's jobs — queued
    // behind the next step's — still gets bytes: the run ends (it deadlocked before 2026-12-05).
    let tight = [&steps[..], &["--budget-mib", "4", "--max-skip-rate", "1"]].concat();
    let squeezed = train_on(&[], &dir, "helix", &out.path().join("tight.json"), profile, &tight);
    assert!(squeezed["summary"]["late_steps"].as_u64().unwrap() > 0, "no late rank under the tight budget");
    let off = [&steps[..], &["--no-late-pieces"]].concat();
    let plain = train_on(&[], &dir, "helix", &out.path().join("plain.json"), profile, &off);
    assert_eq!(plain["summary"]["late_steps"].as_u64(), Some(0), "--no-late-pieces still left a rank late");
    assert_eq!(step_checksums(&plain), step_checksums(&whole));
}

/// Placement in planning groups (what 1024 ranks and more do, `plan::groups`), here groups of two
/// of the four ranks: each rank plans the batching of all four but the decode placement of its
/// own group only, so no rank knows what the other group moves. The exchanges still match
/// (`--check-plan` agrees on every round's collectives), every sample is delivered once, and
/// the pieces decoded on the owner's group-mate are the bytes of whole decodes.
#[test]
fn ranks_that_plan_only_their_own_groups_placement_deliver_the_same_bytes() {
    let dir = common::tiny_dataset();
    let ids = common::manifest_ids(&dir);
    let out = tempfile::tempdir().unwrap();
    let whole = train(&dir, "rank-local", &out.path().join("whole.json"), &["--checksums"]);
    let extra = ["--checksums", "--split-above", "0", "--plan-group-ranks", "2"];
    let grouped = train(&dir, "helix", &out.path().join("grouped.json"), &extra);
    assert_exactly_once(&grouped, &ids);
    assert_eq!(step_checksums(&grouped), step_checksums(&whole), "pieces placed in groups differ");
    assert!(grouped["summary"]["bytes_moved"].as_u64().unwrap() > 0, "no piece moved within a group");
}

/// Tensors a rank is sent count in its pool's byte budget (issue 18): each step's record says
/// how many bytes of received tensors the pool counted with the batch in hand, at least what
/// arrived for that step. Under a budget of 4 MiB, smaller than what some steps receive beside
/// their own decodes, received bytes hold back decoding ahead but never a decode the rank waits
/// for: the run ends, nothing deadlocks.
#[test]
fn received_tensors_count_in_the_byte_budget_without_deadlock() {
    let dir = common::tiny_dataset();
    let out = tempfile::tempdir().unwrap();
    let result = train(&dir, "helix", &out.path().join("tight.json"), &["--budget-mib", "4"]);
    let records = result["records"].as_array().unwrap();
    let mut moved = 0;
    for r in records {
        // A sample that fails (here the clip too large for the budget) drops the pieces of it
        // this rank was sent, and their charge with them, while `bytes_in` still counts them.
        if !r["skipped"].as_array().unwrap().is_empty() {
            continue;
        }
        let (bytes_in, charged) = (r["bytes_in"].as_u64().unwrap(), r["charged_bytes"].as_u64().unwrap());
        // bytes_in counts each piece's header too: a few hundred bytes a step.
        assert!(
            charged + 4096 >= bytes_in,
            "step {} rank {}: {bytes_in} bytes in, {charged} counted",
            r["step"],
            r["rank"]
        );
        moved += (bytes_in > 4096) as usize;
    }
    assert!(moved > 0, "no tensor crossed ranks: the test shows nothing");
}

/// `--transfer-model measured`: the gate's model comes from an all-to-all-v sweep at start-up,
/// the same on every rank (`--check-plan` would fail on the first plan that differs), and the
/// result says which model ran.
#[test]
fn a_measured_transfer_model_is_agreed_by_every_rank_and_reported() {
    let dir = common::tiny_dataset();
    let out = tempfile::tempdir().unwrap();
    let result = train(&dir, "helix", &out.path().join("measured.json"), &["--transfer-model", "measured"]);
    assert_exactly_once(&result, &common::manifest_ids(&dir));
    let transfer = &result["params"]["transfer"];
    assert_eq!(transfer["model"], "measured", "{transfer}");
    let bands = transfer["bands"].as_array().unwrap();
    assert!(bands.len() >= 2, "one band a message-size class: {transfer}");
    for b in bands {
        let (alpha, beta) = (b["alpha_s"].as_f64().unwrap(), b["beta_bytes_per_s"].as_f64().unwrap());
        assert!(alpha.is_finite() && alpha >= 0.0 && beta.is_finite() && beta > 0.0, "{b}");
    }
    assert_eq!(bands.last().unwrap()["up_to_bytes"], u64::MAX, "the last band covers every size");
    // One node (every rank's host name is the same): one class of link, no node table.
    assert!(transfer.get("node_of").is_none() && transfer.get("inter_node_bands").is_none(), "{transfer}");
    let default = train(&dir, "helix", &out.path().join("default.json"), &[]);
    assert_eq!(default["params"]["transfer"]["model"], "default");
    assert_ne!(default["params"]["transfer"]["bands"], transfer["bands"], "nothing was measured");
}

/// Two nodes named by `DATAHELIX_NODE` (ranks 0–1 on one, 2–3 on the other): the calibration
/// measures each class of link apart, every rank ends with the same node table and models
/// (`--check-plan`), and the result carries both.
#[test]
fn a_measured_transfer_model_tells_a_nodes_links_from_the_network() {
    let dir = common::tiny_dataset();
    let out = tempfile::tempdir().unwrap();
    let two_nodes = [
        "sh",
        "-c",
        r#"DATAHELIX_NODE="node$(( ${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}} / 2 ))" exec "$0" "$@""#,
    ];
    let path = out.path().join("two-nodes.json");
    let result = train_on(
        &two_nodes,
        &dir,
        "helix",
        &path,
        "0.02,1e-6,0,0.05",
        &["--steps", "6", "--transfer-model", "measured"],
    );
    assert_exactly_once(&result, &common::manifest_ids(&dir));
    let transfer = &result["params"]["transfer"];
    assert_eq!(transfer["node_of"], serde_json::json!([0, 0, 1, 1]), "{transfer}");
    for class in ["bands", "inter_node_bands"] {
        let bands = transfer[class].as_array().unwrap_or_else(|| panic!("no {class}: {transfer}"));
        assert!(bands.len() >= 2, "{class}: one band a message-size class: {transfer}");
        for b in bands {
            let beta = b["beta_bytes_per_s"].as_f64().unwrap();
            assert!(beta.is_finite() && beta > 0.0, "{class}: {b}");
        }
    }
}

/// `--prepare-at-open --setup-s 2`: the loader plans and starts decoding the first steps before
/// an emulated set-up of 2 s, and the run delivers every global batch once with the bytes of a
/// run without either; the result says how it started. A set-up that is not a duration is a
/// usage error.
#[test]
fn a_run_prepared_at_open_delivers_the_same_batches() {
    let dir = common::tiny_dataset();
    let ids = common::manifest_ids(&dir);
    let out = tempfile::tempdir().unwrap();
    let plain = train(&dir, "helix", &out.path().join("plain.json"), &["--checksums"]);
    let extra = ["--checksums", "--prepare-at-open", "--setup-s", "2"];
    let early = train(&dir, "helix", &out.path().join("early.json"), &extra);
    assert_exactly_once(&early, &ids);
    assert_eq!(step_checksums(&early), step_checksums(&plain), "prepared at open, other bytes");
    assert_eq!(early["params"]["prepare_at_open"], true);
    assert_eq!(early["params"]["setup_s"], 2.0);
    for bad in ["-1", "nan", "1e9"] {
        let setup = format!("--setup-s={bad}");
        let o = common::run(
            common::datahelix()
                .args(["train", "--data"])
                .arg(&dir)
                .args(["--steps", "2", "--warmup", "0", &setup]),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{setup}: {err}");
        assert!(err.contains("--setup-s") && err.contains("0 to 86400"), "{setup}: {err}");
    }
}

#[test]
fn a_missing_dataset_is_a_usage_error() {
    let o = common::run(common::datahelix().args([
        "train",
        "--data",
        "/nonexistent",
        "--steps",
        "2",
        "--warmup",
        "0",
    ]));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("datahelix index"));
}

/// `--replica-ranks 2` on 4 ranks: two groups of two train on the same batches, decoded by each
/// group's first rank. The result is the data-parallel view — 2 ranks whose records hold every
/// global batch exactly once with the bytes of a plain 4-rank run — and the followers' waits.
#[test]
fn replica_groups_train_the_data_parallel_view() {
    let dir = common::tiny_dataset();
    let ids = common::manifest_ids(&dir);
    let out = tempfile::tempdir().unwrap();
    let plain = train(&dir, "rank-local", &out.path().join("plain.json"), &["--checksums"]);
    let groups =
        train(&dir, "helix", &out.path().join("groups.json"), &["--checksums", "--replica-ranks", "2"]);
    let p = &groups["params"];
    assert_eq!(
        (p["ranks"].as_u64(), p["world_ranks"].as_u64(), p["replica_ranks"].as_u64()),
        (Some(2), Some(4), Some(2))
    );
    let ranks: std::collections::BTreeSet<u64> =
        groups["records"].as_array().unwrap().iter().map(|r| r["rank"].as_u64().unwrap()).collect();
    assert_eq!(ranks, [0, 1].into(), "records are the leaders', numbered by group");
    assert_exactly_once(&groups, &ids);
    assert_eq!(step_checksums(&groups), step_checksums(&plain), "replica groups delivered other bytes");
    let f = &groups["followers"];
    assert_eq!(f["ranks"], serde_json::json!([1, 3]), "{f}");
    for key in ["miss_rate", "miss_rate_10ms", "p95_wait_s", "max_wait_s"] {
        assert!(f[key].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "{key}: {f}");
    }
    // A group's step is its slowest rank's: with the profile's noise (σ = 0.05, drawn per rank)
    // some of the 10 measured group-steps are a follower's (deterministic: seed 0).
    let set = f["steps_set_by_followers"].as_u64().expect("steps_set_by_followers");
    assert!((1..=10).contains(&set), "steps set by followers: {set} of 10\n{f}");
    // The followers' tensors cross while the step before trains, the rest with their batch.
    let bytes = ["tensor_bytes_ahead", "tensor_bytes_with_batch"].map(|k| f[k].as_u64().expect(k));
    assert!(bytes[0] > 0, "no tensor was sent ahead of its batch: {f}");
    assert!(groups["summary"]["throughput"].as_f64().unwrap() > 0.0);

    // Groups that do not divide the job: refused on every rank before anything opens.
    let mut cmd = std::process::Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", "4"]);
    cmd.arg(env!("CARGO_BIN_EXE_datahelix")).args(["train", "--data"]).arg(&dir).args([
        "--steps",
        "2",
        "--warmup",
        "0",
        "--replica-ranks",
        "3",
    ]);
    let o = common::run_limited(&mut cmd, Duration::from_secs(60));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--replica-ranks 3: expected a divisor of the 4 ranks"), "{err}");
}
