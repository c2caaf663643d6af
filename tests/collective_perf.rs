//! `datahelix perf`: a short checked sweep at 2 ranks, against raw MPI in the same run, produces
//! the JSON of shared/CLI.md with no wrong bytes.

mod collective_support;

use std::time::Duration;

use collective_support::{direct, mpirun};

const CLI: &str = env!("CARGO_BIN_EXE_datahelix");

fn check_doc(text: &str, op: &str, ranks: u64, raw: bool) -> serde_json::Value {
    let doc: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(doc["op"], op);
    assert_eq!(doc["ranks"], ranks);
    assert_eq!(doc["raw"], raw);
    let rows = doc["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for row in rows {
        for key in ["size", "count", "type", "time_us", "algbw", "busbw", "wrong"] {
            assert!(row.get(key).is_some(), "row lacks {key}: {row}");
        }
        assert_eq!(row["wrong"], 0, "{row}");
        if raw {
            assert_eq!(row["raw_wrong"], 0, "{row}");
        }
    }
    doc
}

#[test]
fn perf_checks_every_op_at_2_ranks() {
    for op in ["alltoallv", "allgather", "allreduce", "broadcast"] {
        let o = mpirun(
            2,
            CLI,
            &[
                "perf", op, "-b", "1K", "-e", "256K", "-f", "16", "-w", "1", "-n", "3", "-c", "1", "--raw",
                "--json",
            ],
            &[("DATAHELIX_COLLECTIVE_TIMEOUT", "60")],
            Duration::from_secs(120),
        );
        assert_eq!(o.code, Some(0), "{op}: {}\n{}", o.stdout, o.stderr);
        let doc = check_doc(&o.stdout, op, 2, true);
        assert_eq!(doc["backend"], "mpi");
        assert_eq!(doc["rows"].as_array().map(Vec::len), Some(3), "sizes 1K, 16K, 256K");
    }
}

#[test]
fn perf_runs_without_launcher() {
    let o = direct(
        CLI,
        &["perf", "alltoallv", "-b", "64K", "-e", "64K", "-n", "2", "--json"],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    check_doc(&o.stdout, "alltoallv", 1, false);
    let o = direct(CLI, &["perf", "alltoallv", "-f", "1"], &[], Duration::from_secs(60));
    assert_eq!(o.code, Some(2), "bad usage exits 2: {}", o.stderr);
}
