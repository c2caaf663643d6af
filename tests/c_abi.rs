//! The C ABI from C and Python: the programs of `csrc/tests/` are compiled against
//! `csrc/include/datahelix.h` and `target/debug/libdatahelix.so` with the machine's `cc`, and run
//! under `mpirun -np 2` on the tiny dataset: a few emulated training steps (ids checked against
//! the protocol's sampler), every misuse expecting an error code, and both again under valgrind
//! with zero errors. The Python example (`csrc/examples/python/`) trains under `mpirun -np 2`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use datahelix::sampler::Sampler;

/// `target/debug`, where the cdylib is.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn work_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_abi");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles `csrc/tests/NAME.c` (once per test binary) and returns the program.
fn program(name: &'static str) -> PathBuf {
    static BUILT: OnceLock<std::sync::Mutex<Vec<&'static str>>> = OnceLock::new();
    let lock = BUILT.get_or_init(Default::default);
    let mut built = lock.lock().unwrap_or_else(|e| e.into_inner());
    let exe = work_dir().join(name);
    if !built.contains(&name) {
        let source = common::repo().join("csrc/tests").join(format!("{name}.c"));
        common::compile_c("cc", &source, &lib_dir(), &exe);
        built.push(name);
    }
    exe
}

fn mpirun(np: usize) -> Command {
    let mut cmd = Command::new("mpirun");
    // --tag-output: Open MPI forwards each rank's output line by line (untagged, two ranks'
    // partial writes can share a line).
    common::mpi_env(&mut cmd).args(["--tag-output", "-np", &np.to_string()]);
    cmd.env("DATAHELIX_COLLECTIVE_TIMEOUT", "120").env("DATAHELIX_LOG", "warn");
    cmd
}

fn valgrind(cmd: &mut Command) -> &mut Command {
    cmd.args([
        "valgrind",
        "--quiet",
        "--error-exitcode=99",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "--show-leak-kinds=definite",
        "--track-origins=no",
        "--num-callers=30",
    ])
    .arg(format!("--suppressions={}", common::repo().join("csrc/tests/valgrind.supp").display()))
}

fn check(what: &str, o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{what} failed ({}):\nstdout:\n{out}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The printed records of `mpirun --tag-output`: every `[job,rank]<stdout>:` tag starts one
/// (a rank's line and its newline may reach the pipe in separate writes, interleaved with
/// another rank's), blank ones dropped.
fn records(out: &str) -> Vec<String> {
    const TAG_END: &str = "]<stdout>:";
    let mut text = String::new();
    let mut rest = out;
    while let Some(i) = rest.find(TAG_END) {
        let start = rest[..i].rfind('[').unwrap_or(i);
        text.push_str(&rest[..start]);
        text.push('\n');
        rest = &rest[i + TAG_END.len()..];
    }
    text.push_str(rest);
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
}

/// `mpirun --tag-output`'s text with its `[job,rank]<stdout>:` / `<stderr>:` tags taken out where
/// they stand: Open MPI tags every chunk a rank writes, also in the middle of a line (seen in CI:
/// "within the [1,0]<stderr>:5[1,0]<stderr>:.[1,0]<stderr>:0 s collective timeout").
fn untagged(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        let tag_len = after.find(']').and_then(|close| {
            let inside = &after[1..close];
            let numbers = inside.split(',').count() == 2
                && inside.split(',').all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            let stream = ["<stdout>:", "<stderr>:"].into_iter().find(|t| after[close + 1..].starts_with(t));
            (numbers && stream.is_some()).then(|| close + 1 + stream.map_or(0, str::len))
        });
        match tag_len {
            Some(n) => rest = &after[n..],
            None => {
                out.push('[');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn tags_are_taken_out_where_they_stand() {
    let t = "[1,1]<stderr>:within the [1,0]<stderr>:5[1,0]<stderr>:.[1,0]<stderr>:0 s [a,b] [3] x";
    assert_eq!(untagged(t), "within the 5.0 s [a,b] [3] x");
}

/// Every step's global batch appears exactly once over the ranks' printed ids and skipped ids.
fn assert_ids(out: &str, data: &Path, steps: u64, g: usize, seed: u64, ranks: usize) {
    let sampler = Sampler::new(&common::manifest_ids(data), seed);
    let records = records(out);
    for step in 0..steps {
        let mut got = Vec::new();
        let mut lines = 0;
        for l in &records {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() >= 5 && f[0] == "ids" && f[1] == step.to_string() {
                lines += 1;
                for list in [f[3], f.get(5).copied().unwrap_or("")] {
                    got.extend(list.split(',').filter(|s| !s.is_empty()).map(|s| s.parse::<u64>().unwrap()));
                }
            }
        }
        assert_eq!(lines, ranks, "step {step}: one line per rank expected in\n{out}");
        got.sort_unstable();
        let mut want = sampler.global_batch(step, g);
        want.sort_unstable();
        assert_eq!(got, want, "step {step}");
    }
    for rank in 0..ranks {
        let done = records.iter().any(|l| *l == format!("ok {rank}"));
        assert!(done, "rank {rank} did not finish:\n{out}");
    }
}

#[test]
fn header_compiles_as_c99_and_cpp() {
    let inc = common::repo().join("csrc/include");
    let dir = work_dir();
    let src = dir.join("include.c");
    std::fs::write(&src, "#include \"datahelix.h\"\nint main(void) { return dh_version() == 0; }\n").unwrap();
    for (compiler, std) in [("cc", "-std=c99"), ("c++", "-std=c++11")] {
        let mut cmd = Command::new(compiler);
        cmd.args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"]).arg("-I").arg(&inc);
        if compiler == "c++" {
            cmd.args(["-x", "c++"]);
        }
        let o = common::run(cmd.arg(&src));
        assert!(o.status.success(), "{compiler} {std}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The MindSpore AOT op needs only the header (the PyTorch one needs torch: not compiled here).
#[test]
fn mindspore_op_source_compiles_against_the_header() {
    let repo = common::repo();
    let o = common::run(
        Command::new("c++")
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-I"])
            .arg(repo.join("csrc/include"))
            .arg(repo.join("csrc/examples/mindspore/datahelix_aot.cc")),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn c_program_trains_emulated_steps_under_mpirun() {
    let captioned = common::captioned_tiny();
    let data = captioned.path();
    let exe = program("train");
    let o = common::run_limited(
        mpirun(2).arg(&exe).arg(data).args(["4", "4"]),
        std::time::Duration::from_secs(400),
    );
    let out = check("train", &o);
    assert_ids(&out, data, 4, 4, 1, 2);
    // Every delivered sample's metadata (dh_batch_meta): its path, caption and label.
    let want = common::expected_meta(data);
    let mut seen = 0;
    for l in records(&out) {
        let Some(rest) = l.strip_prefix("meta ") else { continue };
        let (id, json) = rest.split_once(' ').unwrap();
        let id: u64 = id.parse().unwrap();
        let got: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"));
        assert_eq!(got, want[&id], "sample {id}");
        seen += 1;
    }
    assert!(seen >= 12, "{seen} metadata lines in\n{out}");
    // And each frame's time (dh_batch_timestamps), as `datahelix decode` gives it (train.c sets
    // max_frames 4).
    let o = common::run(common::datahelix().arg("decode").arg(data).args(["--json", "--max-frames", "4"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let decoded: std::collections::HashMap<u64, Vec<f64>> = doc["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let ts = s["timestamps_s"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
            (s["id"].as_u64().unwrap(), ts)
        })
        .collect();
    let mut timed = 0;
    for l in records(&out) {
        let Some(rest) = l.strip_prefix("times ") else { continue };
        let mut f = rest.split(' ');
        let id: u64 = f.next().unwrap().parse().unwrap();
        let got: Vec<f64> = f.map(|t| t.parse().unwrap()).collect();
        let want = &decoded[&id];
        assert_eq!(got.len(), want.len(), "sample {id}: {got:?} vs {want:?}");
        assert!(got.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-9), "sample {id}: {got:?} vs {want:?}");
        timed += 1;
    }
    assert_eq!(timed, seen);
}

#[test]
fn c_misuse_gives_error_codes_not_crashes() {
    let data = common::tiny_dataset();
    let exe = program("misuse");
    let tmp = tempfile::tempdir().unwrap();
    let o = common::run_limited(
        mpirun(2).arg(&exe).arg(&data).arg(tmp.path()),
        std::time::Duration::from_secs(400),
    );
    let out = check("misuse", &o);
    assert!(out.contains("ok 0") && out.contains("ok 1"), "{out}");
}

/// A rank that fails alone before its loader exists ends the job within the collective timeout:
/// without the bounded communicator duplicate and the bounded `MPI_Finalize` at exit, its exit
/// and the other rank's `dh_loader_new` wait for each other for good (seen in CI).
#[test]
fn a_rank_failing_before_its_loader_ends_the_job_not_hangs() {
    let data = common::tiny_dataset();
    let exe = program("rank_fails_early");
    let started = std::time::Instant::now();
    let o = common::run_limited(
        mpirun(2).env("DATAHELIX_COLLECTIVE_TIMEOUT", "5").arg(&exe).arg(&data),
        std::time::Duration::from_secs(90),
    );
    let text =
        untagged(&format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)));
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("fails on its own"), "{text}");
    assert!(
        text.contains("did not complete within the 5.0 s collective timeout")
            || text.contains("MPI_Finalize at exit did not return within 10.0 s"),
        "the job should end naming why: {text}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "{:?}: {text}", started.elapsed());
}

#[test]
fn c_programs_are_valgrind_clean() {
    let found =
        Command::new("valgrind").arg("--version").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(found, "valgrind is missing: scripts/setup.sh installs it");
    let data = common::tiny_dataset();
    let train = program("train");
    let o = common::run_limited(
        valgrind(&mut mpirun(2)).arg(&train).arg(&data).args(["3", "4"]),
        std::time::Duration::from_secs(600),
    );
    let out = check("train under valgrind", &o);
    assert_ids(&out, &data, 3, 4, 1, 2);

    let misuse = program("misuse");
    let tmp = tempfile::tempdir().unwrap();
    let o = common::run_limited(
        valgrind(&mut mpirun(2)).arg(&misuse).arg(&data).arg(tmp.path()),
        std::time::Duration::from_secs(600),
    );
    let out = check("misuse under valgrind", &o);
    assert!(out.contains("ok 0") && out.contains("ok 1"), "{out}");

    // A replica pair (`replica_ranks` = 2): the follower's batches are its own copies of what
    // the leader broadcast, and both continue half-way from the follower's state.
    let replicas = work_dir().join("replicas");
    common::compile_c("mpicc", &common::repo().join("csrc/tests/replicas.c"), &lib_dir(), &replicas);
    let o = common::run_limited(
        valgrind(&mut mpirun(2)).arg(&replicas).arg(&data).args(["helix", "4", "4"]),
        std::time::Duration::from_secs(600),
    );
    let out = check("replicas under valgrind", &o);
    assert!(out.contains("ok 0") && out.contains("ok 1"), "{out}");
}

/// A Python interpreter with numpy: `python3`, else Debian's.
fn python_with_numpy() -> Option<String> {
    ["python3", "/usr/bin/python3"].into_iter().map(str::to_string).find(|py| {
        Command::new(py).args(["-c", "import numpy"]).output().map(|o| o.status.success()).unwrap_or(false)
    })
}

#[test]
fn python_example_trains_under_mpirun() {
    let Some(py) = python_with_numpy() else {
        eprintln!("SKIPPED python_example_trains_under_mpirun: no python3 with numpy (apt-get install python3-numpy)");
        return;
    };
    let data = common::tiny_dataset();
    let script = common::repo().join("csrc/examples/python/train.py");
    let o = common::run_limited(
        mpirun(2)
            .env("DATAHELIX_LIB", lib_dir().join("libdatahelix.so"))
            .arg(&py)
            .arg(&script)
            .arg("--data")
            .arg(&data)
            .args(["--steps", "4", "--global-batch", "4", "--seed", "1"]),
        std::time::Duration::from_secs(300),
    );
    let out = check("python example", &o);
    assert_ids(&out, &data, 4, 4, 1, 2);
    for rank in 0..2 {
        assert!(
            out.contains(&format!("state {rank} next_step 4")),
            "rank {rank} printed no loader state:\n{out}"
        );
    }
}
