//! Every rank must run the same job: ranks given different datasets or settings (an MPMD
//! `mpirun … : …` line gives each rank its own command) all fail within seconds with one message
//! naming the fields and the ranks; processes started by a launcher that is not MPI's (torchrun,
//! srun without PMI) are told how to launch instead of each training alone.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn dataset() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(common::tiny_dataset).clone()
}

/// `mpirun -np 1 datahelix train A… : -np 1 datahelix train B…`: rank 0 runs A, rank 1 runs B.
fn mpmd(a: &[&str], b: &[&str]) -> (Output, Duration) {
    let bin = env!("CARGO_BIN_EXE_datahelix");
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd).env("DATAHELIX_COLLECTIVE_TIMEOUT", "120");
    cmd.args(["-np", "1", bin, "train", "--steps", "4", "--warmup", "1", "--no-cpu-budget"]).args(a);
    cmd.args([":", "-np", "1", bin, "train", "--steps", "4", "--warmup", "1", "--no-cpu-budget"]).args(b);
    let started = Instant::now();
    let o = common::run_limited(&mut cmd, Duration::from_secs(180));
    (o, started.elapsed())
}

fn assert_refused(o: &Output, took: Duration, expect: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the job ran:\n{err}");
    for rank in 0..2 {
        assert!(
            err.contains(&format!("rank {rank}: the ranks are not running the same job")),
            "rank {rank} did not say so:\n{err}"
        );
    }
    for e in expect {
        assert!(err.contains(e), "the message does not name {e:?}:\n{err}");
    }
    // Well under the collective watchdog's 120 s: no rank waited for another.
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

#[test]
fn ranks_given_different_datasets_all_fail_naming_the_dataset() {
    let other = common::copy_dataset(&dataset());
    let manifest = std::fs::read_to_string(other.path().join("manifest.jsonl")).unwrap();
    let fewer: Vec<&str> = manifest.lines().skip(1).collect();
    std::fs::write(other.path().join("manifest.jsonl"), fewer.join("\n") + "\n").unwrap();
    assert!(common::run(common::datahelix().arg("index").arg(other.path())).status.success());
    let data = dataset();
    let (a, b) = (data.to_str().unwrap(), other.path().to_str().unwrap());
    let (o, took) = mpmd(&["--data", a], &["--data", b]);
    assert_refused(
        &o,
        took,
        &["manifest_sha256: ", "on rank [0]", "on rank [1]", "samples: 12 on rank [0], 11 on rank [1]"],
    );
}

#[test]
fn the_same_dataset_in_two_folders_is_the_same_job() {
    let copy = common::copy_dataset(&dataset());
    assert!(common::run(common::datahelix().arg("index").arg(copy.path())).status.success());
    let data = dataset();
    let (o, _) = mpmd(&["--data", data.to_str().unwrap()], &["--data", copy.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn ranks_given_different_settings_all_fail_naming_them() {
    let data = dataset();
    let d = data.to_str().unwrap();
    let (o, took) = mpmd(
        &["--data", d, "--global-batch", "8", "--seed", "1"],
        &["--data", d, "--global-batch", "16", "--seed", "1", "--no-check-plan"],
    );
    assert_refused(
        &o,
        took,
        &["global_batch: 8 on rank [0], 16 on rank [1]", "check_plan: on on rank [0], off on rank [1]"],
    );
    assert!(!String::from_utf8_lossy(&o.stderr).contains("seed:"), "the seeds agree");
}

#[test]
fn a_rank_that_cannot_open_its_dataset_stops_the_others_at_once() {
    let data = dataset();
    let (o, took) = mpmd(&["--data", data.to_str().unwrap()], &["--data", "/nonexistent/dataset"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("rank [1] could not open the dataset"), "rank 0 was not told:\n{err}");
    assert!(err.contains("/nonexistent/dataset"), "rank 1 did not name its folder:\n{err}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

fn without_mpi(vars: &[(&str, &str)], out: &Path) -> Output {
    let mut cmd = common::datahelix();
    for v in ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "WORLD_SIZE"] {
        cmd.env_remove(v);
    }
    cmd.envs(vars.iter().copied()).args(["train", "--data"]).arg(dataset());
    cmd.args(["--steps", "3", "--warmup", "1", "--no-cpu-budget", "--out"]).arg(out);
    common::run_limited(&mut cmd, Duration::from_secs(60))
}

#[test]
fn torchrun_and_srun_without_pmi_get_the_launcher_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r.json");
    for (vars, names) in [
        (
            &[("WORLD_SIZE", "4"), ("RANK", "1"), ("LOCAL_RANK", "1")][..],
            &["WORLD_SIZE=4", "RANK=1", "torchrun"][..],
        ),
        (
            &[("SLURM_STEP_NUM_TASKS", "8"), ("SLURM_PROCID", "0")][..],
            &["SLURM_STEP_NUM_TASKS=8", "srun --mpi=pmix"][..],
        ),
    ] {
        let o = without_mpi(vars, &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{vars:?}: ran as one rank:\n{err}");
        for n in names {
            assert!(err.contains(n), "{vars:?}: the error does not name {n:?}:\n{err}");
        }
        assert!(err.contains("mpirun -np"), "{err}");
        assert!(!out.exists(), "{vars:?}: trained anyway");
    }
    // One process that says it is one of one runs.
    let o = without_mpi(&[("WORLD_SIZE", "1"), ("RANK", "0")], &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
