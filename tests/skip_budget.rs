//! The skip budget (issue 18, item 4): a run whose samples keep failing ends on every rank with
//! the failing ids and what to do, instead of training on silently empty batches. And a stale
//! index re-probes its changed files instead of skipping them: a dataset copied with new
//! modification times (every sample "changed" since indexing, which once ended the run here)
//! trains.

mod common;

use std::process::Command;
use std::time::Duration;

/// The dataset's media files, from its manifest.
fn media(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_to_string(dir.join("manifest.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            dir.join(v["path"].as_str().unwrap())
        })
        .collect()
}

#[test]
fn a_dataset_copied_with_new_times_is_reprobed_and_trains() {
    // Indexed, then every file given a new modification time (the bytes are the same).
    let data = common::copy_dataset(&common::tiny_dataset());
    let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("index").arg(data.path()));
    assert!(o.status.success());
    let later = std::time::SystemTime::now() + Duration::from_secs(3600);
    for file in media(data.path()) {
        std::fs::File::options().write(true).open(file).unwrap().set_modified(later).unwrap();
    }
    let common::TrainRun { ok, text, .. } = common::train_2_ranks(
        data.path(),
        "helix",
        12,
        &["--checksums"],
        &[("DATAHELIX_LOG", "warn".into())],
    );
    assert!(ok, "{text}");
    assert!(text.contains("changed since indexing") && text.contains("re-probing"), "{text}");
    assert!(!text.contains("skipped"), "{text}");
}

#[test]
fn a_run_whose_samples_all_fail_ends_with_their_ids() {
    // Indexed, then every file replaced by bytes no decoder reads (a re-probe cannot help).
    let data = common::copy_dataset(&common::tiny_dataset());
    let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("index").arg(data.path()));
    assert!(o.status.success());
    for file in media(data.path()) {
        std::fs::write(file, b"not media at all").unwrap();
    }
    for policy in ["helix", "rank-local"] {
        let common::TrainRun { ok, text, took } = common::train_2_ranks(data.path(), policy, 12, &[], &[]);
        assert!(!ok, "{policy}: the run went on with every sample failing:\n{text}");
        assert!(
            text.contains("more than --max-skip-rate 0.01") && text.contains("re-run `datahelix index`"),
            "{policy}:\n{text}"
        );
        assert!(
            text.contains("ids ") && text.chars().filter(|c| c.is_ascii_digit()).count() > 20,
            "{policy}: no ids:\n{text}"
        );
        assert!(took < Duration::from_secs(60), "{policy}: took {took:?}");
        eprintln!("{policy}: ended in {took:.1?}");
        // With the budget lifted, the same run goes to its end, every sample skipped.
        let common::TrainRun { ok, text, .. } =
            common::train_2_ranks(data.path(), policy, 12, &["--max-skip-rate", "1"], &[]);
        assert!(ok, "{policy} with --max-skip-rate 1:\n{text}");
    }
}

/// Each "step S: F of the P samples planned so far failed" of a run's output, sorted.
fn verdicts(text: &str) -> Vec<String> {
    let mut found: Vec<String> = text
        .match_indices("samples planned so far failed")
        .filter_map(|(at, _)| {
            let head = &text[..at];
            head.rfind("step ").map(|from| text[from..at].to_string())
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

#[test]
fn a_resumed_run_ends_where_the_run_it_continues_would_have() {
    // A third of the samples bad in the index: a run at --max-skip-rate 0.25 ends once ten
    // have failed, a few epochs in.
    let data = common::copy_dataset(&common::tiny_dataset());
    for file in media(data.path()).iter().take(4) {
        std::fs::write(file, b"not media at all").unwrap();
    }
    let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("index").arg(data.path()));
    assert!(o.status.success());
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    let state = state.to_str().unwrap();
    for policy in ["helix", "rank-local"] {
        let budget = ["--max-skip-rate", "0.25", "--warmup", "0"];
        let whole = common::train_2_ranks(data.path(), policy, 40, &budget, &[]);
        assert!(!whole.ok, "{policy}: the run went on:\n{}", whole.text);
        let ended = verdicts(&whole.text);
        assert!(!ended.is_empty(), "{policy}: no verdict:\n{}", whole.text);
        // Stopped after step 2, with the state of the steps so far, then resumed: it ends at the
        // same step with the same count (counting from zero, it went on for steps more).
        let saving = [&budget[..], &["--save-state", state]].concat();
        let first = common::train_2_ranks(data.path(), policy, 3, &saving, &[]);
        assert!(first.ok, "{policy}: the first 3 steps:\n{}", first.text);
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap();
        assert_eq!(doc["skips"]["planned"], 12, "{policy}: {}", doc["skips"]);
        assert_eq!(doc["skips"]["failed"], 4, "{policy}: {}", doc["skips"]);
        let resuming = [&budget[..], &["--resume", state]].concat();
        let resumed = common::train_2_ranks(data.path(), policy, 40, &resuming, &[]);
        assert!(!resumed.ok, "{policy}: the resumed run went on:\n{}", resumed.text);
        assert_eq!(verdicts(&resumed.text), ended, "{policy}:\n{}", resumed.text);
        eprintln!("{policy}: both ended at {ended:?}");
    }
}
