//! What a peer sends is checked before it is used (issue 18, item 1): under `mpirun -np 2`, rank
//! 1 corrupts its first tensor message (`DATAHELIX_FAULT`, debug builds: `src/exec/fault.rs`) —
//! another shape for the same bytes, a 2^50-byte length, a payload shorter than announced, an
//! earlier step — and each ends the job on every rank, in seconds, with an error naming the
//! sending rank and the step: no out-of-bounds view, no huge allocation, no hang.
//!
//! Without the checks: the wrong shape was delivered as it came (consumers building views from
//! `shape` read past the bytes when it is larger) and the 2^50 length made zstd allocate it (the
//! process aborts).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

fn run_with_fault(fault: &str) -> (bool, String, Duration) {
    let data = common::tiny_dataset();
    let out = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd)
        .env("DATAHELIX_FAULT", format!("{fault}@1"))
        .env("DATAHELIX_COLLECTIVE_TIMEOUT", "20")
        .args(["-np", "2", "-x", "DATAHELIX_FAULT", "-x", "DATAHELIX_COLLECTIVE_TIMEOUT"])
        .arg(env!("CARGO_BIN_EXE_datahelix"))
        .arg("train")
        .arg("--data")
        .arg(&data)
        .args([
            "--policy",
            "actor-pool",
            "--global-batch",
            "4",
            "--workers",
            "2",
            "--steps",
            "6",
            "--no-cpu-budget",
        ])
        .arg("--out")
        .arg(out.path().join("r.json"));
    let t = Instant::now();
    let o = common::run_limited(&mut cmd, Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.success(), text, t.elapsed())
}

fn assert_refused(fault: &str, says: &str) {
    let (ok, text, took) = run_with_fault(fault);
    assert!(!ok, "{fault}: the job finished as if nothing were wrong:\n{text}");
    assert!(text.contains(says), "{fault}: no {says:?} in:\n{text}");
    assert!(text.contains("from rank 1"), "{fault}: the sender is not named:\n{text}");
    assert!(text.contains("step "), "{fault}: the step is not named:\n{text}");
    assert!(took < Duration::from_secs(60), "{fault}: took {took:?}, not seconds");
    eprintln!("{fault}: refused in {took:.1?}");
}

#[test]
fn another_shape_for_the_same_bytes_is_refused_against_the_plan() {
    assert_refused("shape", "the plan says sample");
}

#[test]
fn a_huge_announced_length_is_refused_before_allocating() {
    assert_refused("oversized", "announces 1125899906842624 bytes");
}

#[test]
fn a_payload_shorter_than_announced_is_refused() {
    assert_refused("truncated", "payload shorter than its header says");
}

#[test]
fn a_message_of_another_step_is_refused() {
    assert_refused("stale", "which the plan does not send it");
}
