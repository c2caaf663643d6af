//! A run that stops and resumes delivers the global batches of a run that never stopped, under
//! every policy and at another world size, and plans with what the run before learned; three
//! epochs visit every sample once each, in new orders; tampered, foreign, truncated and missing
//! state files are refused before any step.
//! All under `mpirun` on the skewed small dataset (24 samples, G = 8: an epoch is 3 steps).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use datahelix::sampler::Sampler;
use serde_json::Value;

const STEPS: u64 = 9;
const GLOBAL_BATCH: usize = 8;
const POLICIES: [&str; 6] =
    ["rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement", "helix"];

fn dataset() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| common::indexed("skewed_small")).clone()
}

/// `datahelix train` under `mpirun -np RANKS`; returns the process output.
fn train(ranks: usize, policy: &str, args: &[&str]) -> Output {
    // One job at a time: two jobs on two cores would only test the watchdog's patience.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", &ranks.to_string()]);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    cmd.arg(env!("CARGO_BIN_EXE_datahelix")).args(["train", "--data"]).arg(dataset());
    cmd.args(["--policy", policy, "--global-batch", &GLOBAL_BATCH.to_string(), "--workers", "4"]);
    cmd.args(["--warmup", "0", "--profile", "0.03,2e-6,0,0.05", "--no-cpu-budget"]).args(args);
    common::run_limited(&mut cmd, Duration::from_secs(240))
}

fn train_ok(ranks: usize, policy: &str, args: &[&str]) -> Value {
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut all: Vec<&str> = args.to_vec();
    let path = out.path().to_str().unwrap().to_string();
    all.extend(["--out", &path]);
    let o = train(ranks, policy, &all);
    assert!(o.status.success(), "{policy} {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out.path()).unwrap()).unwrap()
}

/// Each step's global batch (delivered and skipped ids over all ranks, sorted), and the bytes
/// moved between ranks in it.
fn batches(result: &Value) -> BTreeMap<u64, (Vec<u64>, u64)> {
    let mut by_step: BTreeMap<u64, (Vec<u64>, u64)> = BTreeMap::new();
    for r in result["records"].as_array().unwrap() {
        let e = by_step.entry(r["step"].as_u64().unwrap()).or_default();
        for key in ["ids", "skipped"] {
            e.0.extend(r[key].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()));
        }
        e.1 += r["bytes_in"].as_u64().unwrap();
    }
    for (ids, _) in by_step.values_mut() {
        ids.sort_unstable();
    }
    by_step
}

fn save_state(ranks: usize, policy: &str, steps: u64, seed: u64, state: &Path) -> Value {
    let state = state.to_str().unwrap();
    train_ok(
        ranks,
        policy,
        &["--steps", &steps.to_string(), "--seed", &seed.to_string(), "--save-state", state],
    )
}

#[test]
fn a_resumed_run_delivers_the_global_batches_of_one_that_never_stopped() {
    let sampler = Sampler::new(&common::manifest_ids(&dataset()), 0);
    let tmp = tempfile::tempdir().unwrap();
    for policy in POLICIES {
        let whole = batches(&train_ok(4, policy, &["--steps", &STEPS.to_string()]));
        for (step, (ids, _)) in &whole {
            let mut want = sampler.global_batch(*step, GLOBAL_BATCH);
            want.sort_unstable();
            assert_eq!(ids, &want, "{policy}: step {step} of the uninterrupted run");
        }
        // Mid-epoch (step 4 starts at position 32: epoch 1, its 9th sample) and, for the
        // policies that move tensors, on a step where they moved some (else at an epoch's start,
        // step 6).
        let moved = whole.iter().find(|(s, (_, bytes))| **s > 0 && **s != 4 && *bytes > 0).map(|(s, _)| *s);
        assert!(
            moved.is_some() || !["actor-pool", "helix-placement", "helix"].contains(&policy),
            "{policy} moved no tensor in any step: the test would not cover a resume after moves"
        );
        let stops = [4, moved.unwrap_or(6)];
        for k in stops {
            let state = tmp.path().join(format!("{policy}-{k}.json"));
            let first = batches(&save_state(4, policy, k, 0, &state));
            assert_eq!(first.keys().copied().collect::<Vec<_>>(), (0..k).collect::<Vec<_>>());
            let doc: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
            assert_eq!(doc["next_step"], k, "{policy}: the state continues after the last step");
            assert_eq!(doc["epoch"], k * GLOBAL_BATCH as u64 / 24);
            assert!(doc["seed"].is_u64(), "the seed is a JSON integer");
            let resumed =
                train_ok(4, policy, &["--steps", &STEPS.to_string(), "--resume", state.to_str().unwrap()]);
            assert_eq!(resumed["params"]["resumed_models"], "restored", "{policy}: stopped at {k}");
            let rest = batches(&resumed);
            assert_eq!(
                rest.keys().copied().collect::<Vec<_>>(),
                (k..STEPS).collect::<Vec<_>>(),
                "{policy}: the resumed run's records carry the global step numbers"
            );
            for (step, (ids, _)) in first.iter().chain(rest.iter()) {
                assert_eq!(ids, &whole[step].0, "{policy}: stopped at {k}, step {step}");
            }
        }
    }
}

#[test]
fn a_run_of_4_ranks_resumes_on_2_with_the_same_global_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = batches(&train_ok(4, "helix", &["--steps", &STEPS.to_string()]));
    let state = tmp.path().join("state.json");
    save_state(4, "helix", 5, 0, &state);
    let rest =
        batches(&train_ok(2, "helix", &["--steps", &STEPS.to_string(), "--resume", state.to_str().unwrap()]));
    assert_eq!(rest.len() as u64, STEPS - 5);
    for (step, (ids, _)) in &rest {
        assert_eq!(ids, &whole[step].0, "step {step} at 2 ranks");
    }
}

#[test]
fn three_epochs_visit_every_sample_once_each_in_a_new_order() {
    let result = train_ok(2, "helix", &["--steps", &STEPS.to_string()]);
    assert_eq!(result["params"]["protocol"], "1.3");
    let mut all = common::manifest_ids(&dataset());
    all.sort_unstable();
    // The slots of the global batches in order; a step's slots are known as a set, so an
    // epoch's order shows as its sequence of per-step sets.
    let by_step = batches(&result);
    let mut epochs: Vec<Vec<Vec<u64>>> = Vec::new();
    for e in 0..3u64 {
        let steps: Vec<Vec<u64>> = (3 * e..3 * e + 3).map(|s| by_step[&s].0.clone()).collect();
        let mut ids: Vec<u64> = steps.concat();
        ids.sort_unstable();
        assert_eq!(ids, all, "epoch {e} delivers (or skips) every sample exactly once");
        epochs.push(steps);
    }
    assert_ne!(epochs[0], epochs[1], "epoch 1 repeats epoch 0's order");
    assert_ne!(epochs[1], epochs[2], "epoch 2 repeats epoch 1's order");
}

/// Each decode's prediction in a trace (`decode ID (step S, predicted X s)`), by (step, id).
fn predictions(trace: &Path) -> BTreeMap<(u64, u64), f64> {
    let doc: Value = serde_json::from_slice(&std::fs::read(trace).unwrap()).unwrap();
    let mut out = BTreeMap::new();
    for e in doc["traceEvents"].as_array().unwrap() {
        let Some(name) = e["name"].as_str() else { continue };
        let Some(rest) = name.strip_prefix("decode ") else { continue };
        let words: Vec<&str> = rest.split([' ', '(', ',', ')']).filter(|w| !w.is_empty()).collect();
        if let [id, "step", step, "predicted", s, "s"] = words[..] {
            out.insert((step.parse().unwrap(), id.parse().unwrap()), s.parse().unwrap());
        }
    }
    out
}

/// A state carries what the policy learned (decode and accelerator models); a run resumed from
/// it plans with them — its first steps' decodes are predicted otherwise than from the priors,
/// which a state of version 1 (none learned, still read) gives.
#[test]
fn a_resumed_run_plans_with_what_the_run_before_learned() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    save_state(4, "helix", 4, 0, &state);
    let doc: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(doc["version"], 3);
    // The skip budget's count covers the 4 steps delivered, not those planned ahead of them.
    assert_eq!(doc["skips"]["planned"], 4 * GLOBAL_BATCH as u64, "{}", doc["skips"]);
    assert_eq!(doc["skips"]["failed"], 0, "{}", doc["skips"]);
    let learned = &doc["learned"];
    let codecs: Vec<&str> =
        learned["decode"].as_array().unwrap().iter().map(|f| f["codec"].as_str().unwrap()).collect();
    assert!(codecs.contains(&"h264"), "no H.264 decode model in {codecs:?}");
    // At least one measured step of each of the 4 ranks (the last steps' are never gathered: no
    // round follows them).
    assert!(learned["accel"].as_array().unwrap().len() >= 4, "{learned}");
    // The same state as version 1 documents were: nothing learned.
    let mut v1 = datahelix::exec::state::LoaderState::read(&state).unwrap();
    v1.version = 1;
    let v1 = v1.with_learned(None).with_skips(None);
    let cold = tmp.path().join("v1.json");
    std::fs::write(&cold, v1.to_json()).unwrap();
    let resume = |from: &Path, name: &str| {
        let trace = tmp.path().join(format!("{name}.trace.json"));
        let args = ["--steps", "6", "--resume", from.to_str().unwrap(), "--trace", trace.to_str().unwrap()];
        (train_ok(4, "helix", &args), predictions(&trace))
    };
    let (warm, warm_predicted) = resume(&state, "warm");
    let (cold, cold_predicted) = resume(&cold, "cold");
    assert_eq!(warm["params"]["resumed_models"], "restored");
    assert_eq!(cold["params"]["resumed_models"], Value::Null);
    assert_eq!(
        batches(&warm).into_values().map(|b| b.0).collect::<Vec<_>>(),
        batches(&cold).into_values().map(|b| b.0).collect::<Vec<_>>()
    );
    // Steps 4 and 5 were planned at the resumed run's first round, before it measured anything.
    let both: Vec<(u64, f64, f64)> = warm_predicted
        .iter()
        .filter(|((step, _), _)| *step < 6)
        .filter_map(|(key, p)| cold_predicted.get(key).map(|c| (key.1, *p, *c)))
        .collect();
    assert!(both.len() >= 4, "{} decodes of steps 4-5 traced in both runs", both.len());
    // Traces print milliseconds, and a learned model can meet the prior's at some sample: most
    // predictions differ, not every one (with the decode models not restored, none did).
    let differ = both.iter().filter(|(_, w, c)| w != c).count();
    assert!(
        2 * differ > both.len(),
        "{differ} of {} decodes of steps 4-5 predicted otherwise from the state than from the priors: {both:?}",
        both.len()
    );
}

/// A replica group's state is its leader's, with what the policy learned and the skip count
/// (every rank's is the same document: `tests/own_comm.rs`); a run resumed from it, in replica
/// groups or not, plans with those models and delivers the uninterrupted run's global batches.
/// (Until replica states carried them, such a run resumed from the priors and counted from 0.)
#[test]
fn a_replica_groups_state_carries_what_its_leaders_learned() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("replicas.json");
    let path = state.to_str().unwrap();
    train_ok(4, "helix", &["--steps", "4", "--replica-ranks", "2", "--save-state", path]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(doc["next_step"], 4);
    assert_eq!(doc["skips"]["planned"], 4 * GLOBAL_BATCH as u64, "{}", doc["skips"]);
    let codecs: Vec<&str> = (doc["learned"]["decode"].as_array())
        .unwrap_or_else(|| panic!("no decode models in the replica group's state: {doc}"))
        .iter()
        .map(|f| f["codec"].as_str().unwrap())
        .collect();
    assert!(codecs.contains(&"h264"), "no H.264 decode model in {codecs:?}");
    let sampler = Sampler::new(&common::manifest_ids(&dataset()), 0);
    for replicas in ["2", "1"] {
        let resumed = train_ok(4, "helix", &["--steps", "6", "--replica-ranks", replicas, "--resume", path]);
        assert_eq!(resumed["params"]["resumed_models"], "restored", "replica groups of {replicas}");
        let got = batches(&resumed);
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), [4, 5], "replica groups of {replicas}");
        for (step, (ids, _)) in got {
            let mut want = sampler.global_batch(step, GLOBAL_BATCH);
            want.sort_unstable();
            assert_eq!(ids, want, "replica groups of {replicas}: step {step}");
        }
    }
}

fn refused(args: &[&str], expect: &str) {
    let out = tempfile::NamedTempFile::new().unwrap();
    std::fs::remove_file(out.path()).unwrap();
    let path = out.path().to_str().unwrap().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--steps", "9", "--out", &path]);
    let started = std::time::Instant::now();
    let o = train(2, "helix", &all);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} was accepted:\n{err}");
    assert!(err.contains(expect), "{args:?}: the error does not say {expect:?}:\n{err}");
    assert!(!out.path().exists(), "{args:?}: training started (a result was written)");
    assert!(started.elapsed() < Duration::from_secs(60), "{args:?}: took {:?} to fail", started.elapsed());
}

#[test]
fn tampered_foreign_truncated_and_missing_states_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let good = tmp.path().join("good.json");
    save_state(2, "rank-local", 3, 0, &good);
    let text = std::fs::read_to_string(&good).unwrap();
    let write = |name: &str, body: &str| {
        let p = tmp.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let truncated = write("truncated.json", &text[..text.len() / 2]);
    refused(&["--resume", &truncated], "truncated");
    let tampered = write("tampered.json", &text.replace("\"next_step\": 3", "\"next_step\": 2"));
    refused(&["--resume", &tampered], "checksum");
    // Valid JSON, 1 MiB longer than the state: rank 0 refuses it before sending it to the others.
    let huge = write("huge.json", &(" ".repeat(1 << 20) + &text));
    refused(&["--resume", &huge], "is not a loader state (at most 1048576)");
    refused(&["--resume", tmp.path().join("missing.json").to_str().unwrap()], "cannot read the loader state");
    // Another seed, another dataset.
    let good = good.to_str().unwrap();
    refused(&["--resume", good, "--seed", "9"], "seed: state 0, this run 9");
    let other = common::copy_dataset(&dataset());
    let manifest = std::fs::read_to_string(other.path().join("manifest.jsonl")).unwrap();
    let fewer: Vec<&str> = manifest.lines().skip(1).collect();
    std::fs::write(other.path().join("manifest.jsonl"), fewer.join("\n") + "\n").unwrap();
    assert!(common::run(common::datahelix().arg("index").arg(other.path())).status.success());
    let out = tempfile::NamedTempFile::new().unwrap();
    let o = {
        let mut cmd = Command::new("mpirun");
        common::mpi_env(&mut cmd).args(["-np", "2"]).arg(env!("CARGO_BIN_EXE_datahelix"));
        cmd.args(["train", "--data"]).arg(other.path()).args(["--steps", "9", "--resume", good, "--out"]);
        common::run_limited(cmd.arg(out.path()), Duration::from_secs(120))
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("samples: state 24, this dataset 23"), "{err}");
    assert!(err.contains("manifest_sha256: state"), "{err}");
}

/// The skewed set's (id, path) rows.
fn rows() -> Vec<(u64, String)> {
    std::fs::read_to_string(dataset().join("manifest.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["id"].as_u64().unwrap(), v["path"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// A mix draws its groups (the folders `images/` and `videos/`) by weight at every step, the
/// few images up-sampled to half of each batch; a run resumed from its state, at another world
/// size, draws the batches of the run that never stopped; resuming without the mix, or naming
/// a group the dataset lacks, is refused before any step, named.
#[test]
fn a_mixed_run_draws_by_weight_and_resumes_the_same_batches() {
    use datahelix::sampler::mix::{groups_of, Mix};
    let rows = rows();
    let images: Vec<u64> = rows.iter().filter(|(_, p)| p.starts_with("images/")).map(|(id, _)| *id).collect();
    assert!((2..8).contains(&images.len()), "{} images: the test wants a few", images.len());
    let mix: Mix = "videos=1,images=1".parse().unwrap();
    let sampler = Sampler::mixed(&mix, &groups_of(rows.iter().map(|(id, p)| (*id, p.as_str()))), 0).unwrap();
    let doc = train_ok(2, "helix", &["--steps", &STEPS.to_string(), "--mix", "videos=1,images=1"]);
    let half = STEPS * GLOBAL_BATCH as u64 / 2;
    assert_eq!(
        doc["drawn_by_group"],
        serde_json::json!({"images": half, "videos": half}),
        "what the mix drew"
    );
    let whole = batches(&doc);
    assert_eq!(whole.len() as u64, STEPS);
    for (step, (ids, _)) in &whole {
        let mut want = sampler.global_batch(*step, GLOBAL_BATCH);
        want.sort_unstable();
        assert_eq!(ids, &want, "step {step}");
        assert_eq!(ids.iter().filter(|id| images.contains(id)).count(), GLOBAL_BATCH / 2, "step {step}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("mixed.json");
    let state_arg = state.to_str().unwrap();
    train_ok(2, "helix", &["--steps", "4", "--mix", "images=1,videos=1", "--save-state", state_arg]);
    let doc: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(doc["mix"], "images=1,videos=1");
    let rest = batches(&train_ok(
        4,
        "helix",
        &["--steps", &STEPS.to_string(), "--mix", "images=1,videos=1", "--resume", state_arg],
    ));
    assert_eq!(rest.keys().copied().collect::<Vec<_>>(), (4..STEPS).collect::<Vec<_>>());
    for (step, (ids, _)) in &rest {
        assert_eq!(ids, &whole[step].0, "step {step}, resumed at 4 ranks");
    }
    refused(&["--resume", state_arg], "mix: state images=1,videos=1, this run none (uniform)");
    refused(&["--mix", "audio=2,videos=1"], "the mix names group \"audio\", which holds no samples");
}
