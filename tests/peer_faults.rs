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

use std::time::Duration;

fn assert_refused(fault: &str, says: &str) {
    let env = [("DATAHELIX_FAULT", format!("{fault}@1"))];
    let common::TrainRun { ok, text, took } =
        common::train_2_ranks(&common::tiny_dataset(), "actor-pool", 6, &[], &env);
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
