//! The plan is the same on every rank of a real MPI job (`--check-plan` all-reduces its hash),
//! and a job whose ranks planned different things fails loudly.

mod common;

use std::time::{Duration, Instant};

fn mpirun(np: u32, args: &[&str]) -> std::process::Output {
    let mut cmd = std::process::Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", &np.to_string()]);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "30");
    cmd.args(args);
    let started = Instant::now();
    let out = common::run_limited(&mut cmd, std::time::Duration::from_secs(300));
    assert!(started.elapsed() < Duration::from_secs(120), "mpirun took too long");
    out
}

#[test]
fn four_ranks_plan_identically() {
    let bin = env!("CARGO_BIN_EXE_datahelix");
    for kind in ["uniform", "heavy-tail", "bimodal"] {
        let o = mpirun(
            4,
            &[
                bin,
                "plan",
                "--synthetic",
                kind,
                "--samples",
                "256",
                "--ranks",
                "16",
                "--lookahead",
                "2",
                "--check-plan",
                "--json",
            ],
        );
        assert!(o.status.success(), "{kind}: {}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("rank 0 prints one document");
        assert_eq!(v["plan_hash"].as_str().unwrap().len(), 16);
        assert_eq!(v["loads"].as_array().unwrap().len(), 16);
    }
}

#[test]
fn ranks_with_different_inputs_are_caught() {
    let script = format!(
        "exec {} plan --synthetic bimodal --samples 64 --ranks 8 --check-plan --seed $OMPI_COMM_WORLD_RANK",
        env!("CARGO_BIN_EXE_datahelix")
    );
    let o = mpirun(2, &["sh", "-c", &script]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--check-plan"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
