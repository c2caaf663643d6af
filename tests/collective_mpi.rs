//! Multi-rank semantics of the collective layer: `mpirun -np N` (N = 1..4) on a driver that
//! asserts on every rank (zero-size peers, uneven sizes, a rank sending nothing, chunked
//! transfers, provenance of every received byte), plus buffers beyond 64 MiB at 2 ranks.

mod collective_support;

use std::time::Duration;

use collective_support::{direct, driver, mpirun, Outcome};

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
        &["semantics"],
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", "60")],
        Duration::from_secs(120),
    );
    assert_ok(np, &o);
}

#[test]
fn one_rank_without_launcher() {
    let o = direct(&driver(), &["semantics"], &[], Duration::from_secs(60));
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
        &["semantics", "--large"],
        &[("DATAHELIX_COLLECTIVE_TIMEOUT", "120")],
        Duration::from_secs(240),
    );
    assert_ok(2, &o);
}
