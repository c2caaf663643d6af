//! A training loop that runs its own blocking collectives on its own communicator between every
//! pair of loader calls — from Rust (`examples/own_collectives.rs`) and from C
//! (`csrc/tests/own_collectives.c`, also through `dh_loader_step`) — finishes every step under
//! `mpirun -np 4` with the placement policies on a skewed dataset, also when every rank delays
//! its calls by random amounts. (Before the fixed collective schedule of `src/step`, such a loop
//! deadlocked at step 1: one rank waited in the loader's exchange for tensors its peers would only
//! send in their next loader call, while they waited in the caller's collective.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use datahelix::sampler::Sampler;

const STEPS: u64 = 6;
const GLOBAL_BATCH: usize = 16;
const SEED: u64 = 5;

fn dataset() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::dataset("skewed_small");
        let o = common::run(common::datahelix().arg("index").arg(&dir));
        assert!(o.status.success(), "index failed: {}", String::from_utf8_lossy(&o.stderr));
        dir
    })
    .clone()
}

/// `target/debug`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn mpirun(program: &Path, policy: &str, delay: Option<u64>) -> String {
    mpirun_env(program, policy, delay, &[])
}

fn mpirun_env(program: &Path, policy: &str, delay: Option<u64>, env: &[(&str, &str)]) -> String {
    // One job at a time: two 4-rank jobs on two cores would only test the watchdog's patience.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["--tag-output", "-np", "4"]);
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "90").env("DATAHELIX_LOG", "warn");
    cmd.arg(program).arg(dataset()).arg(policy);
    cmd.args([STEPS.to_string(), GLOBAL_BATCH.to_string(), "4".into()]);
    cmd.arg(delay.map_or("-".into(), |d| d.to_string()));
    let o = common::run_limited(&mut cmd, Duration::from_secs(300));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{} {policy} (delays {delay:?}) failed ({}):\nstdout:\n{out}\nstderr:\n{}",
        program.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The lines of `mpirun --tag-output`, tags dropped.
fn lines(out: &str) -> Vec<String> {
    out.lines().map(|l| l.split_once("<stdout>:").map_or(l, |(_, rest)| rest).trim().to_string()).collect()
}

#[test]
fn a_rust_loop_with_its_own_collectives_finishes_every_step() {
    let program = target_dir().join("examples/own_collectives");
    assert!(program.exists(), "{} is not built (cargo build --examples)", program.display());
    for policy in ["helix", "helix-placement"] {
        for delay in [None, Some(17)] {
            let out = mpirun(&program, policy, delay);
            let done: Vec<Vec<String>> = lines(&out)
                .iter()
                .filter(|l| l.starts_with("ok "))
                .map(|l| l.split(' ').map(String::from).collect())
                .collect();
            assert_eq!(done.len(), 4, "{policy}: every rank finishes:\n{out}");
            // ok RANK STEPS collectives N bytes_in B
            let issued: Vec<&str> = done.iter().map(|f| f[4].as_str()).collect();
            assert!(
                issued.iter().all(|n| *n == issued[0]),
                "{policy}: every rank issues the same collectives: {issued:?}"
            );
            let moved: u64 = done.iter().map(|f| f[6].parse::<u64>().unwrap()).sum();
            assert!(moved > 0, "{policy}: no tensor moved between ranks, so no exchange was tested:\n{out}");
        }
    }
}

/// A job that calls `prepare_ahead` right after opening the loader and then spends 6 s setting
/// up (a model load) finds its first batch decoded: on every rank, every decode of step 0 had
/// ended before the first `next_batch` (without the call, none had begun), and the run goes on
/// with the global batches checked step by step.
#[test]
fn prepare_ahead_before_the_first_batch_decodes_it_during_the_callers_setup() {
    let program = target_dir().join("examples/own_collectives");
    assert!(program.exists(), "{} is not built (cargo build --examples)", program.display());
    for (mode, early) in [("prepare", true), ("plain", false)] {
        let setup = format!("{mode}:6000");
        let out = mpirun_env(&program, "helix", None, &[("OWN_SETUP", &setup)]);
        let lines = lines(&out);
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("ok ")).count(),
            4,
            "{mode}: every rank finishes:\n{out}"
        );
        // first RANK DONE OWN
        let first: Vec<(usize, usize)> = lines
            .iter()
            .filter(|l| l.starts_with("first "))
            .map(|l| {
                let f: Vec<usize> = l.split(' ').skip(2).map(|w| w.parse().unwrap()).collect();
                (f[0], f[1])
            })
            .collect();
        assert_eq!(first.len(), 4, "{mode}: one line per rank:\n{out}");
        assert!(first.iter().map(|f| f.1).sum::<usize>() > 0, "{mode}: no decode of step 0 traced:\n{out}");
        for (done, own) in first {
            let want = if early { own } else { 0 };
            assert_eq!(
                done, want,
                "{mode}: {done} of a rank's {own} decodes of step 0 ended before its first batch:\n{out}"
            );
        }
    }
}

fn c_program() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("caller_collectives");
            std::fs::create_dir_all(&dir).unwrap();
            let exe = dir.join("own_collectives");
            let source = common::repo().join("csrc/tests/own_collectives.c");
            common::compile_c("mpicc", &source, &target_dir(), &exe);
            exe
        })
        .clone()
}

#[test]
fn a_c_program_with_its_own_mpi_collectives_finishes_every_step() {
    let program = c_program();
    let sampler = Sampler::new(&common::manifest_ids(&dataset()), SEED);
    for policy in ["helix", "helix-placement"] {
        for delay in [None, Some(23)] {
            let out = mpirun(&program, policy, delay);
            let lines = lines(&out);
            for step in 0..STEPS {
                let mut got: Vec<u64> = Vec::new();
                let mut ranks = 0;
                for l in &lines {
                    let f: Vec<&str> = l.split(' ').collect();
                    if f.len() >= 5 && f[0] == "ids" && f[1] == step.to_string() {
                        ranks += 1;
                        for list in [f[3], f.get(5).copied().unwrap_or("")] {
                            got.extend(
                                list.split(',').filter(|s| !s.is_empty()).map(|s| s.parse::<u64>().unwrap()),
                            );
                        }
                    }
                }
                assert_eq!(ranks, 4, "{policy} step {step}: one line per rank in\n{out}");
                got.sort_unstable();
                let mut want = sampler.global_batch(step, GLOBAL_BATCH);
                want.sort_unstable();
                assert_eq!(got, want, "{policy} step {step}: the global batch exactly once");
            }
            for rank in 0..4 {
                assert!(
                    lines.iter().any(|l| *l == format!("ok {rank}")),
                    "{policy}: rank {rank} did not finish:\n{out}"
                );
            }
        }
    }
}
