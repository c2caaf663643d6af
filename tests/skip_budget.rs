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

/// A sample split into pieces on several ranks (`--split-above 0`) whose file cannot be decoded
/// counts once a step, not once a piece: the loader state's count stays within the samples that
/// failed. The tiny dataset's MP4s are garbled past their first bytes with their size and
/// modification time kept, so the index still trusts them and every piece fails to open (each
/// rank reported its own pieces, and the count of 8 steps was 26 for 15 failed samples).
#[test]
fn a_split_sample_that_fails_counts_once_a_step() {
    let data = common::copy_dataset(&common::tiny_dataset());
    let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("index").arg(data.path()));
    assert!(o.status.success());
    let files = media(data.path());
    let bad: Vec<_> = files.iter().filter(|f| f.extension().is_some_and(|e| e == "mp4")).collect();
    assert!(bad.len() >= 2, "{files:?}");
    for file in &bad {
        let modified = std::fs::metadata(file).unwrap().modified().unwrap();
        let mut bytes = std::fs::read(file).unwrap();
        for b in &mut bytes[64..] {
            *b = b.wrapping_mul(7).wrapping_add(13);
        }
        std::fs::write(file, &bytes).unwrap();
        std::fs::File::options().write(true).open(file).unwrap().set_modified(modified).unwrap();
    }
    let out = tempfile::tempdir().unwrap();
    let state = out.path().join("state.json");
    let extra = ["--split-above", "0", "--max-skip-rate", "1", "--save-state", state.to_str().unwrap()];
    let (steps, batch, samples) = (8u64, 4u64, files.len() as u64);
    let common::TrainRun { ok, text, .. } = common::train_2_ranks(data.path(), "helix", steps, &extra, &[]);
    assert!(ok, "{text}");
    assert!(!text.contains("changed since indexing"), "the garbled files were re-probed:\n{text}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let failed = s["skips"]["failed"].as_u64().unwrap();
    // Every bad sample fails each time it is planned; the steps before the last two (told by
    // the end) hold whole epochs, and no count may pass the epochs begun.
    let told = (steps - 2) * batch / samples * bad.len() as u64;
    let begun = (steps * batch).div_ceil(samples) * bad.len() as u64;
    assert!(
        (told..=begun).contains(&failed),
        "{failed} failures counted, {told} to {begun} expected: {}",
        s["skips"]
    );
}
