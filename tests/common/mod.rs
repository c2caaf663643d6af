//! Shared helpers of the integration tests: generated datasets, the built binary, Open MPI's
//! environment for this machine.
#![allow(dead_code)]

pub mod results;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `datahelix` binary built for this test run.
pub fn datahelix() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_datahelix"));
    c.env("DATAHELIX_LOG", "warn").env("OMPI_MCA_orte_top_session_dir", session_dir());
    c
}

/// A session directory of Open MPI's for one launch, which it creates and removes. Launches
/// sharing the default one (`/tmp/ompi.<host>.<uid>`) race when one starts while another ends:
/// the last to end removes it as the next creates it, and the next fails with "orte_session_dir
/// failed … File exists" (tests of one binary run side by side; seen in CI on a fresh machine).
pub fn session_dir() -> PathBuf {
    static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("dh-ompi.{}.{n}", std::process::id()))
}

/// Runs a command and returns its output, failing the test with its stderr if it could not start.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs a command (typically `mpirun`) in a process group of its own and kills the whole group
/// if it outlives `limit`, failing the test: a multi-rank test can fail, never hang.
pub fn run_limited(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::os::unix::process::CommandExt;
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let (out, err) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
    let (out, err) = (read_in_background(out), read_in_background(err));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > limit {
            let alive = processes_in_group(child.id());
            // SAFETY: kill() only sends a signal; a negative pid names our child's process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            // What the ranks printed before they hung names where they hung; a process outside
            // the group still holding a pipe must not hang the test, hence the bounded wait.
            let grace = std::time::Duration::from_secs(10);
            let text = |r: std::sync::mpsc::Receiver<Vec<u8>>| {
                String::from_utf8_lossy(&r.recv_timeout(grace).unwrap_or_default()).into_owned()
            };
            let (out, err) = (text(out), text(err));
            panic!(
                "{cmd:?} ran past {limit:?} and was killed\n--- processes still running then (which \
                 one hung: the launcher or a rank, and in what kernel wait)\n{alive}\n--- stdout\n{out}\n\
                 --- stderr\n{err}"
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    Output { status, stdout: out.recv().unwrap_or_default(), stderr: err.recv().unwrap_or_default() }
}

/// The `ps` lines of the processes of process group `pgid`.
fn processes_in_group(pgid: u32) -> String {
    let Ok(out) = Command::new("ps").args(["-eo", "pid,pgid,stat,etime,wchan:24,args"]).output() else {
        return "(ps could not run)".into();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default().to_owned();
    let group = pgid.to_string();
    let members = lines.filter(|l| l.split_whitespace().nth(1) == Some(group.as_str()));
    std::iter::once(header).chain(members.map(str::to_owned)).collect::<Vec<_>>().join("\n")
}

/// Reads a pipe to its end on a thread of its own; the bytes arrive on the returned channel.
fn read_in_background(mut pipe: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = pipe.read_to_end(&mut b);
        let _ = tx.send(b);
    });
    rx
}

/// Generates the dataset of `scripts/specs/NAME.json` once per test binary, under the target
/// folder (shared across test binaries: generation is skipped when the folder already holds it),
/// and returns its folder. The folder is read-only by convention: copy it to change it.
pub fn dataset(name: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("datasets").join(name);
    let spec = repo().join("scripts/specs").join(format!("{name}.json"));
    let o = run(datahelix().args(["gen", "--spec"]).arg(&spec).arg("--out").arg(&out));
    assert!(o.status.success(), "gen {name} failed: {}", String::from_utf8_lossy(&o.stderr));
    out
}

/// The dataset of `scripts/specs/NAME.json` ([`dataset`]), indexed (once per test binary).
pub fn indexed(name: &str) -> PathBuf {
    let dir = dataset(name);
    let o = run(datahelix().arg("index").arg(&dir));
    assert!(o.status.success(), "index {name} failed: {}", String::from_utf8_lossy(&o.stderr));
    dir
}

/// The tiny dataset (12 samples: h264/mpeg4 in mp4/mkv, jpeg, png), indexed.
pub fn tiny_dataset() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = dataset("tiny");
        let o = run(datahelix().arg("index").arg(&dir));
        assert!(o.status.success(), "index failed: {}", String::from_utf8_lossy(&o.stderr));
        dir
    })
    .clone()
}

/// Copies a dataset folder (files and manifest, not its index) into a fresh temporary folder.
pub fn copy_dataset(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().expect("tempdir");
    copy_tree(from, to.path());
    let _ = std::fs::remove_dir_all(to.path().join(".datahelix"));
    to
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// Appends `datahelix train` with the small-run settings the multi-rank tests share (G = 8,
/// W = 4, one warm-up step, plans checked across ranks) to a launcher's command line:
/// `mpirun -np 4` or a host launcher.
pub fn train_args<'c>(
    cmd: &'c mut Command,
    data: &Path,
    policy: &str,
    profile: &str,
    out: &Path,
    extra: &[&str],
) -> &'c mut Command {
    cmd.arg(env!("CARGO_BIN_EXE_datahelix"))
        .args(["train", "--data"])
        .arg(data)
        .args(["--policy", policy, "--global-batch", "8", "--workers", "4", "--warmup", "1"])
        .args(["--profile", profile, "--check-plan", "--out"])
        .arg(out)
        .args(extra)
}

/// The environment Open MPI needs on this machine (root, more ranks than cores, no pinning), and
/// a session directory of the launch's own ([`session_dir`]).
pub fn mpi_env(cmd: &mut Command) -> &mut Command {
    cmd.env("OMPI_MCA_orte_top_session_dir", session_dir())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .env("OMPI_MCA_hwloc_base_binding_policy", "none")
        .env("OMPI_MCA_btl", "self,vader,tcp")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
}

/// The ids of a dataset's `manifest.jsonl`, in file order.
pub fn manifest_ids(dir: &Path) -> Vec<u64> {
    std::fs::read_to_string(dir.join("manifest.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_u64().unwrap())
        .collect()
}

/// Links `lib/libdatahelix.so.0` (the soname a program linked with `-ldatahelix` asks the dynamic
/// loader for) to the freshly built `libdatahelix.so`, as an install does (`scripts/install.sh`).
pub fn soname_link(lib: &Path) {
    let link = lib.join(format!("libdatahelix.so.{}", env!("CARGO_PKG_VERSION_MAJOR")));
    if std::fs::read_link(&link).is_err() {
        let _ = std::fs::remove_file(&link);
        match std::os::unix::fs::symlink("libdatahelix.so", &link) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {} // a parallel test made it
            Err(e) => panic!("cannot link {}: {e}", link.display()),
        }
    }
}

/// Compiles the C program `source` against `csrc/include/datahelix.h` and the `libdatahelix.so`
/// in `lib` with `compiler` (`cc`, or `mpicc` for a program that calls MPI itself), warnings as
/// errors, into `exe`; fails the test with the compiler's output otherwise.
pub fn compile_c(compiler: &str, source: &Path, lib: &Path, exe: &Path) {
    assert!(lib.join("libdatahelix.so").exists(), "libdatahelix.so not built in {}", lib.display());
    soname_link(lib);
    let mut cmd = Command::new(compiler);
    cmd.args([
        "-std=c11",
        "-D_POSIX_C_SOURCE=200809L",
        "-g",
        "-O0",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-pthread",
    ])
    .arg("-I")
    .arg(repo().join("csrc/include"))
    .arg(source)
    .arg("-o")
    .arg(exe)
    .arg("-L")
    .arg(lib)
    .arg(format!("-Wl,-rpath,{}", lib.display()))
    .args(["-ldatahelix", "-lm"]);
    let o = run(&mut cmd);
    assert!(
        o.status.success(),
        "{compiler} {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// What a `datahelix train` job under `mpirun -np 2` did: whether it succeeded, everything it
/// printed, and how long it took.
pub struct TrainRun {
    pub ok: bool,
    pub text: String,
    pub took: std::time::Duration,
}

/// Runs `datahelix train` on `data` under `mpirun -np 2` (G = 4, W = 2, no CPU budget, a 30 s
/// collective watchdog, killed after 120 s) with `policy`, `steps`, `extra` arguments and `env`
/// forwarded to the ranks: for tests of runs that must end, and how.
pub fn train_2_ranks(
    data: &Path,
    policy: &str,
    steps: u64,
    extra: &[&str],
    env: &[(&str, String)],
) -> TrainRun {
    let out = tempfile::tempdir().expect("tempdir");
    let mut cmd = Command::new("mpirun");
    mpi_env(&mut cmd).env("DATAHELIX_COLLECTIVE_TIMEOUT", "30").args([
        "-np",
        "2",
        "-x",
        "DATAHELIX_COLLECTIVE_TIMEOUT",
    ]);
    for (k, v) in env {
        cmd.env(k, v).arg("-x").arg(k);
    }
    cmd.arg(env!("CARGO_BIN_EXE_datahelix"))
        .arg("train")
        .arg("--data")
        .arg(data)
        .args(["--policy", policy, "--global-batch", "4", "--workers", "2", "--no-cpu-budget"])
        .args(["--steps", &steps.to_string()])
        .args(extra)
        .arg("--out")
        .arg(out.path().join("result.json"));
    let t = std::time::Instant::now();
    let o = run_limited(&mut cmd, std::time::Duration::from_secs(120));
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    TrainRun { ok: o.status.success(), text, took: t.elapsed() }
}

/// A copy of the tiny dataset whose manifest gives every sample a caption (with a comma and
/// quotes) and a label, indexed: what batches' metadata is checked against.
pub fn captioned_tiny() -> tempfile::TempDir {
    let data = copy_dataset(&tiny_dataset());
    let manifest = data.path().join("manifest.jsonl");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut out = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut row: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
        let id = row["id"].as_u64().unwrap();
        row.insert("caption".into(), format!("clip {id}, \"quoted\"").into());
        row.insert("label".into(), (id % 7).into());
        out.push_str(&serde_json::Value::Object(row).to_string());
        out.push('\n');
    }
    std::fs::write(&manifest, out).unwrap();
    let o = run(datahelix().arg("index").arg(data.path()).env_remove("DATAHELIX_INDEX_DIR"));
    assert!(o.status.success(), "index failed: {}", String::from_utf8_lossy(&o.stderr));
    data
}

/// The metadata a sample of [`captioned_tiny`] must arrive with: its path, caption and label.
pub fn expected_meta(data: &Path) -> std::collections::HashMap<u64, serde_json::Value> {
    let text = std::fs::read_to_string(data.join("manifest.jsonl")).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let row: serde_json::Value = serde_json::from_str(l).unwrap();
            let id = row["id"].as_u64().unwrap();
            let want =
                serde_json::json!({"path": row["path"], "caption": row["caption"], "label": row["label"]});
            (id, want)
        })
        .collect()
}
