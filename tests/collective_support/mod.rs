//! Launching `mpirun` from tests: the Open MPI settings a root run on a small machine needs are
//! set on the command itself (never taken from the caller's shell), and a hard time limit kills
//! the whole launched process group if the job overruns, so a test can never hang.

#![allow(dead_code)]

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a launched job did.
#[derive(Debug)]
pub struct Outcome {
    /// Exit status, `None` if killed by a signal.
    pub code: Option<i32>,
    /// Standard output of all ranks.
    pub stdout: String,
    /// Standard error of all ranks and of mpirun.
    pub stderr: String,
    /// Wall time from launch to exit.
    pub elapsed: Duration,
    /// Whether the time limit killed it.
    pub killed: bool,
}

/// A job with a faulty rank ended on its own, not zero, within the watchdog's `timeout_s` plus
/// `margin_s` (launch, the grace period for peers' answers, teardown).
pub fn assert_ended_within(o: &Outcome, timeout_s: u64, margin_s: u64) {
    assert!(!o.killed, "the job hung until the test killed it:\n{}", o.stderr);
    assert_ne!(o.code, Some(0), "the job must fail:\n{}", o.stderr);
    let limit = Duration::from_secs(timeout_s + margin_s);
    assert!(o.elapsed < limit, "took {:?}:\n{}", o.elapsed, o.stderr);
}

/// The collective layer's test driver, `examples/dh-collective-check.rs` (an example, so that
/// `cargo install` installs only `datahelix`): `cargo test` builds it beside the test binaries.
/// The HCCL tests need it built with the feature (`cargo build --features hccl --example
/// dh-collective-check`, which scripts/test.sh runs first).
pub fn driver() -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>/deps");
    let driver = dir.join("examples/dh-collective-check");
    assert!(
        driver.exists(),
        "{} is not built: run `cargo build --examples` (scripts/test.sh does)",
        driver.display()
    );
    driver.to_string_lossy().into_owned()
}

/// Runs `mpirun -np N program args…` with `env` forwarded to the ranks, killed after `limit`.
pub fn mpirun(np: usize, program: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Outcome {
    let mut cmd = Command::new("mpirun");
    cmd.arg("-np").arg(np.to_string());
    for (k, _) in env {
        cmd.arg("-x").arg(k);
    }
    cmd.arg(program).args(args);
    launch(cmd, env, limit)
}

/// Runs `program args…` directly (no launcher), killed after `limit`.
pub fn direct(program: &str, args: &[&str], env: &[(&str, &str)], limit: Duration) -> Outcome {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for v in ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"] {
        cmd.env_remove(v);
    }
    launch(cmd, env, limit)
}

/// A session directory of Open MPI's for one launch (as `tests/common`'s `session_dir`: launches
/// sharing the default one race when one starts as another ends).
fn session_dir() -> std::path::PathBuf {
    static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("dh-ompi.{}.{n}", std::process::id()))
}

fn launch(mut cmd: Command, env: &[(&str, &str)], limit: Duration) -> Outcome {
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_hwloc_base_binding_policy", "none")
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("OMPI_MCA_orte_base_help_aggregate", "0")
        .env("OMPI_MCA_orte_top_session_dir", session_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).process_group(0);
    let start = Instant::now();
    let mut child = cmd.spawn().expect("mpirun not found: run scripts/setup.sh (installs openmpi-bin)");
    let pid = child.id() as i32;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut killed = false;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for mpirun") {
            break st;
        }
        if start.elapsed() > limit && !killed {
            killed = true;
            // SAFETY: signals the process group this test created (mpirun and its ranks).
            unsafe { libc::kill(-pid, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(2));
            // SAFETY: as above.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    Outcome {
        code: status.code(),
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
        elapsed,
        killed,
    }
}
