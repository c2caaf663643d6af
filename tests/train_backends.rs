//! `train --backend hccl` (on the project's HCCL emulator) delivers the same samples and the same
//! tensors as the MPI backend, for a policy that moves tensors between ranks.
#![cfg(feature = "hccl")]

mod common;

use serde_json::Value;

fn run(backend: &str, out: &std::path::Path) -> Value {
    let mut cmd = std::process::Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", "2"]);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    cmd.arg(env!("CARGO_BIN_EXE_datahelix"))
        .args(["train", "--data"])
        .arg(common::tiny_dataset())
        .args(["--policy", "actor-pool", "--backend", backend, "--global-batch", "8", "--workers", "2"])
        .args(["--steps", "4", "--warmup", "1", "--profile", "0.02,1e-6,0,0", "--checksums", "--out"])
        .arg(out);
    let o = common::run_limited(&mut cmd, std::time::Duration::from_secs(300));
    assert!(o.status.success(), "{backend}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

#[test]
fn hccl_and_mpi_deliver_identical_tensors() {
    let tmp = tempfile::tempdir().unwrap();
    let mpi = run("mpi", &tmp.path().join("mpi.json"));
    let hccl = run("hccl", &tmp.path().join("hccl.json"));
    let key = |r: &Value| {
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
    };
    assert_eq!(key(&mpi), key(&hccl));
    assert_eq!(hccl["params"]["backend"], "hccl");
    assert!(hccl["summary"]["bytes_moved"].as_u64().unwrap() > 0, "the actor pool ships tensors");
}
