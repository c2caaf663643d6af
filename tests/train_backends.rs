//! `train --backend hccl` (on the project's HCCL emulator) delivers the same samples and the same
//! tensors as the MPI backend, for a policy that moves tensors between ranks, and in replica
//! groups (`--replica-ranks 2`), whose communicators are HCCL's too.
#![cfg(feature = "hccl")]

mod common;

use serde_json::Value;

/// `datahelix train` of `policy` on `ranks` ranks with `backend` and `more` arguments.
fn run(backend: &str, ranks: usize, policy: &str, more: &[&str], out: &std::path::Path) -> Value {
    let mut cmd = std::process::Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", &ranks.to_string()]);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    cmd.arg(env!("CARGO_BIN_EXE_datahelix"))
        .args(["train", "--data"])
        .arg(common::tiny_dataset())
        .args(["--policy", policy, "--backend", backend, "--global-batch", "8", "--workers", "2"])
        .args(["--steps", "4", "--warmup", "1", "--profile", "0.02,1e-6,0,0", "--checksums"])
        .args(more)
        .arg("--out")
        .arg(out);
    let o = common::run_limited(&mut cmd, std::time::Duration::from_secs(300));
    assert!(o.status.success(), "{backend} {more:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

/// Each record's (step, rank, ids, tensor checksum), sorted.
fn delivered(r: &Value) -> Vec<(u64, u64, Vec<u64>, u64)> {
    let mut v: Vec<(u64, u64, Vec<u64>, u64)> = r["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            let ids = x["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
            (
                x["step"].as_u64().unwrap(),
                x["rank"].as_u64().unwrap(),
                ids,
                x["tensor_checksum"].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn hccl_and_mpi_deliver_identical_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let mpi = run("mpi", 2, "actor-pool", &[], &tmp.path().join("mpi.json"));
    let hccl = run("hccl", 2, "actor-pool", &[], &tmp.path().join("hccl.json"));
    assert_eq!(delivered(&mpi), delivered(&hccl));
    assert_eq!(hccl["params"]["backend"], "hccl");
    assert!(hccl["summary"]["bytes_moved"].as_u64().unwrap() > 0, "the actor pool ships tensors");
}

/// Replica groups on HCCL (until 2026-12-07 refused: "replica groups need MPI"): pairs of 4
/// ranks, the leaders' data-parallel world and each pair on HCCL communicators of their own;
/// the leaders deliver what MPI's replica groups deliver, and each follower its leader's batch
/// byte for byte.
#[test]
fn replica_groups_on_hccl_deliver_what_they_deliver_on_mpi() {
    let tmp = tempfile::tempdir().unwrap();
    let pairs = ["--replica-ranks", "2"];
    let mpi = run("mpi", 4, "helix", &pairs, &tmp.path().join("mpi.json"));
    let hccl = run("hccl", 4, "helix", &pairs, &tmp.path().join("hccl.json"));
    assert_eq!(hccl["params"]["ranks"], 2, "two data-parallel ranks (the groups)");
    // Helix splits a step by what it measured, which differs from run to run: each step's
    // global batch and the (wrapping) sum of its samples' checksums do not.
    let by_step = |run: &Value| {
        let mut steps: std::collections::BTreeMap<u64, (Vec<u64>, u64)> = Default::default();
        for (step, _, ids, sum) in delivered(run) {
            let e = steps.entry(step).or_default();
            e.0.extend(ids);
            e.0.sort_unstable();
            e.1 = e.1.wrapping_add(sum);
        }
        steps
    };
    assert_eq!(by_step(&mpi), by_step(&hccl));
    assert_eq!(by_step(&hccl).len(), 4);
    for (name, run) in [("mpi", &mpi), ("hccl", &hccl)] {
        assert_eq!(run["followers"]["ranks"], serde_json::json!([1, 3]), "{name}");
        assert_eq!(run["followers"]["batches_identical"], true, "{name}: {}", run["followers"]);
    }
}
