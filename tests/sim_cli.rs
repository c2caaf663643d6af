//! `datahelix sim`: the JSON shapes of shared/CLI.md, and clear errors on bad workload files.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("sim").args(args).output().unwrap()
}

#[test]
fn workload_json_has_the_documented_shape() {
    let out = sim(&["--workload", "scripts/workloads/panda70m.toml", "--steps", "5", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["workload"], "panda70m");
    assert_eq!(v["ranks"], 8);
    for p in ["rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement", "helix"] {
        for k in ["throughput", "miss_rate", "p95_wait_s", "efficiency"] {
            assert!(v["policies"][p][k].is_number(), "{p}.{k}");
        }
    }
}

#[test]
fn bad_workload_files_say_which_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string("scripts/workloads/panda70m.toml").unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, text.replace("workers_per_rank = 1", "workers_per_rank = 0")).unwrap();
    let out = sim(&["--workload", bad.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("run.workers_per_rank"), "{err}");
    let missing = dir.path().join("nocal.toml");
    std::fs::write(&missing, text.replace("[model]", "calibration = \"nowhere.json\"\n[model]")).unwrap();
    let out = sim(&["--workload", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nowhere.json"));
    let out = sim(&[]);
    assert_eq!(out.status.code(), Some(2));
}
