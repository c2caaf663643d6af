//! No hang: a rank killed mid-run, stopped (SIGSTOP), or one that skips a collective, ends the
//! whole job non-zero within the watchdog timeout plus a small margin, with a message naming the
//! collective and the rank; a peer's short message ends it too.

mod collective_support;

use std::time::Duration;

use collective_support::{assert_ended_within, driver, mpirun};

const TIMEOUT_S: u64 = 3;
/// Launch, the watchdog's grace period for peer answers, and teardown of the job.
const MARGIN_S: u64 = 10;

#[test]
fn killed_rank_ends_the_job() {
    let t = TIMEOUT_S.to_string();
    let o = mpirun(
        3,
        &driver(),
        &["kill", "--at", "5"],
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", &t)],
        Duration::from_secs(TIMEOUT_S + 60),
    );
    assert_ended_within(&o, TIMEOUT_S, MARGIN_S);
    assert!(o.stderr.contains("killing myself"), "{}", o.stderr);
    assert!(o.stderr.contains("all_to_all_v #5 (step 5)"), "no message names the collective:\n{}", o.stderr);
}

#[test]
fn skipped_collective_ends_the_job() {
    let t = TIMEOUT_S.to_string();
    let o = mpirun(
        3,
        &driver(),
        &["skip", "--at", "3"],
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", &t)],
        Duration::from_secs(TIMEOUT_S + 60),
    );
    assert_ended_within(&o, TIMEOUT_S, MARGIN_S);
    assert_eq!(o.code, Some(datahelix::comm::EXIT_ABORTED), "{}", o.stderr);
    assert!(o.elapsed >= Duration::from_secs(TIMEOUT_S), "aborted before the timeout: {:?}", o.elapsed);
    assert!(o.stderr.contains("all_reduce #9 (step 9) did not complete"), "{}", o.stderr);
    assert!(o.stderr.contains("NOT ARRIVED: it is in finalize barrier"), "{}", o.stderr);
}

#[test]
fn stopped_rank_is_named_by_the_others() {
    let t = TIMEOUT_S.to_string();
    let o = mpirun(
        3,
        &driver(),
        &["stop", "--at", "4"],
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", &t)],
        Duration::from_secs(TIMEOUT_S + 60),
    );
    assert_ended_within(&o, TIMEOUT_S, MARGIN_S);
    assert!(o.stderr.contains("stopping myself"), "{}", o.stderr);
    assert!(o.stderr.contains("all_reduce #4 (step 4) did not complete"), "{}", o.stderr);
    assert!(
        o.stderr.contains("rank 2: NOT ARRIVED: no answer within"),
        "the stopped rank is not named:\n{}",
        o.stderr
    );
}

/// Without the receive's count check the short message went unnoticed and the job exited 0.
#[test]
fn a_short_point_to_point_message_ends_the_job() {
    let o = mpirun(
        2,
        &driver(),
        &["short"],
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", "30"), ("DATAHELIX_MPI_MAX_MESSAGE", "64")],
        Duration::from_secs(60),
    );
    assert!(!o.killed, "the job hung until the test killed it:\n{}", o.stderr);
    assert_eq!(o.code, Some(datahelix::comm::EXIT_ABORTED), "{}", o.stderr);
    assert!(o.stderr.contains("fewer bytes than the collective announced"), "{}", o.stderr);
}
