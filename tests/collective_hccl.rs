//! The collective test suite of the MPI backend (`tests/collective_mpi.rs`), unchanged, against the
//! HCCL backend: `dh-collective-check semantics --backend hccl` under `mpirun -np N` (N = 1..4),
//! without a launcher, and with buffers beyond 64 MiB at 2 ranks. Built without CANN, this runs on
//! the host-memory emulator in `csrc/hccl-emu/`. Also: `datahelix perf --backend hccl -c 1`, and a
//! skipped or killed rank ends the job within the timeout with a message naming the collective.
#![cfg(feature = "hccl")]

mod collective_support;

use std::time::Duration;

use collective_support::{assert_ended_within, direct, driver, mpirun, Outcome};

const CLI: &str = env!("CARGO_BIN_EXE_datahelix");

/// HCCL's own connection and execution timeouts, short enough that a broken test cannot hang.
const HCCL_ENV: [(&str, &str); 2] = [("HCCL_CONNECT_TIMEOUT", "60"), ("HCCL_EXEC_TIMEOUT", "120")];

fn env<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    HCCL_ENV.iter().copied().chain(extra.iter().copied()).collect()
}

fn assert_ok(np: usize, o: &Outcome) {
    assert!(
        o.code == Some(0) && !o.killed,
        "{np} ranks: exit {:?} after {:.1} s (killed: {})\nstdout:\n{}\nstderr:\n{}",
        o.code,
        o.elapsed.as_secs_f64(),
        o.killed,
        o.stdout,
        o.stderr
    );
    for r in 0..np {
        assert!(o.stdout.contains(&format!("rank {r}/{np}: ")), "rank {r} did not report:\n{}", o.stdout);
    }
    assert!(o.stdout.contains("0 failed in the job"), "{}", o.stdout);
}

fn semantics(np: usize) {
    let o = mpirun(
        np,
        &driver(),
        &["semantics", "--backend", "hccl"],
        &env(&[("DATAHELIX_COLLECTIVE_TIMEOUT", "60")]),
        Duration::from_secs(120),
    );
    assert_ok(np, &o);
}

#[test]
fn one_rank_without_launcher() {
    let o = direct(&driver(), &["semantics", "--backend", "hccl"], &env(&[]), Duration::from_secs(60));
    assert_ok(1, &o);
}

#[test]
fn semantics_1_rank() {
    semantics(1);
}

#[test]
fn semantics_2_ranks() {
    semantics(2);
}

#[test]
fn semantics_3_ranks() {
    semantics(3);
}

#[test]
fn semantics_4_ranks() {
    semantics(4);
}

#[test]
fn large_buffers_2_ranks() {
    let o = mpirun(
        2,
        &driver(),
        &["semantics", "--large", "--backend", "hccl"],
        &env(&[("DATAHELIX_COLLECTIVE_TIMEOUT", "120")]),
        Duration::from_secs(240),
    );
    assert_ok(2, &o);
}

#[test]
fn perf_alltoallv_checks_at_2_ranks_against_raw_mpi() {
    let o = mpirun(
        2,
        CLI,
        &[
            "perf",
            "alltoallv",
            "--backend",
            "hccl",
            "-b",
            "1K",
            "-e",
            "256K",
            "-f",
            "16",
            "-w",
            "1",
            "-n",
            "3",
            "-c",
            "1",
            "--raw",
            "--json",
        ],
        &env(&[("DATAHELIX_COLLECTIVE_TIMEOUT", "60")]),
        Duration::from_secs(120),
    );
    assert_eq!(o.code, Some(0), "{}\n{}", o.stdout, o.stderr);
    let doc: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout));
    assert_eq!(doc["backend"], "hccl");
    assert_eq!(doc["ranks"], 2);
    let rows = doc["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3, "sizes 1K, 16K, 256K");
    for row in rows {
        for key in ["size", "count", "type", "time_us", "algbw", "busbw", "wrong", "raw_time_us"] {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
        assert_eq!(row["wrong"], 0, "{row}");
        assert_eq!(row["raw_wrong"], 0, "{row}");
    }
}

#[test]
fn perf_without_launcher() {
    let o = direct(
        CLI,
        &["perf", "alltoallv", "--backend", "hccl", "-b", "64K", "-e", "64K", "-n", "2", "-c", "1", "--json"],
        &env(&[]),
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let doc: serde_json::Value =
        serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout));
    assert_eq!(doc["backend"], "hccl");
    assert_eq!(doc["rows"][0]["wrong"], 0);
}

const TIMEOUT_S: u64 = 3;
const MARGIN_S: u64 = 10;

#[test]
fn skipped_collective_ends_the_job() {
    let t = TIMEOUT_S.to_string();
    let o = mpirun(
        3,
        &driver(),
        &["skip", "--at", "3", "--backend", "hccl"],
        &env(&[("DATAHELIX_COLLECTIVE_TIMEOUT", &t)]),
        Duration::from_secs(TIMEOUT_S + 60),
    );
    assert_ended_within(&o, TIMEOUT_S, MARGIN_S);
    assert_eq!(o.code, Some(datahelix::comm::EXIT_ABORTED), "{}", o.stderr);
    assert!(o.elapsed >= Duration::from_secs(TIMEOUT_S), "aborted before the timeout: {:?}", o.elapsed);
    // Ranks 0 and 2 wait in their last all-reduce, which rank 1 (one short) never joins: the
    // watchdog asks it over the bootstrap MPI world, and it answers from its closing barrier.
    assert!(o.stderr.contains("all_reduce #9 (step 9) (hccl) did not complete"), "{}", o.stderr);
    assert!(o.stderr.contains("rank 1: NOT ARRIVED: it is in finalize barrier"), "{}", o.stderr);
    assert!(o.stderr.contains("rank 0: arrived") || o.stderr.contains("rank 2: arrived"), "{}", o.stderr);
}

/// Before, an HCCL collective that timed out ended the job with HCCL's own error, naming no rank;
/// now the ranks waiting in it poll and answer the watchdog, and a stopped rank is named.
#[test]
fn stopped_rank_is_named_by_the_others() {
    assert_stopped_rank_named(&[], "all_reduce");
}

/// The same for the device-buffer methods (`all_gather_device`): they waited in HCCL's
/// synchronisation and could not answer; now they poll as the host collectives do.
#[test]
fn stopped_rank_is_named_in_a_device_collective() {
    assert_stopped_rank_named(&["--device"], "all_gather");
}

/// `dh-collective-check stop --at 4` on 3 ranks (plus `extra`): the job ends within the timeout,
/// the others' report of their `op` #4 names the stopped rank 2, and the other waiting rank
/// answered from inside the same HCCL collective.
fn assert_stopped_rank_named(extra: &[&str], op: &str) {
    let t = TIMEOUT_S.to_string();
    let args = [&["stop", "--at", "4", "--backend", "hccl"], extra].concat();
    let o = mpirun(
        3,
        &driver(),
        &args,
        &env(&[("DATAHELIX_COLLECTIVE_TIMEOUT", &t)]),
        Duration::from_secs(TIMEOUT_S + 60),
    );
    assert_ended_within(&o, TIMEOUT_S, MARGIN_S);
    assert!(o.stderr.contains("stopping myself"), "{}", o.stderr);
    let report = format!("{op} #4 (step 4) (hccl) did not complete");
    assert!(o.stderr.contains(&report), "no {report:?} in:\n{}", o.stderr);
    assert!(
        o.stderr.contains("rank 2: NOT ARRIVED: no answer within"),
        "the stopped rank is not named:\n{}",
        o.stderr
    );
    assert!(o.stderr.contains("arrived (also waiting in it"), "{}", o.stderr);
}

#[test]
fn killed_rank_ends_the_job() {
    let t = TIMEOUT_S.to_string();
    let o = mpirun(
        3,
        &driver(),
        &["kill", "--at", "5", "--backend", "hccl"],
        &env(&[("DATAHELIX_COLLECTIVE_TIMEOUT", &t)]),
        Duration::from_secs(TIMEOUT_S + 60),
    );
    assert_ended_within(&o, TIMEOUT_S, MARGIN_S);
    assert!(o.stderr.contains("killing myself"), "{}", o.stderr);
    assert!(o.stderr.contains("all_to_all_v #5 (step 5)"), "no message names the collective:\n{}", o.stderr);
}
