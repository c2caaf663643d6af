//! The C library installs the usual way and a program outside the tree builds against it with
//! pkg-config alone: `scripts/install.sh --prefix P --from <this build>` lays out
//! `lib/libdatahelix.so.X.Y.Z` with its soname link, `lib/libdatahelix.a`, `include/datahelix.h`
//! and `lib/pkgconfig/datahelix.pc`; `csrc/tests/installed.c`, copied to a folder outside the
//! source tree, is compiled with `cc $(pkg-config --cflags --libs datahelix)` — dynamically and,
//! once more, `--static` — and each binary runs under `mpirun -np 2`, finding the library only
//! through the prefix, delivering every sample of each global batch exactly once.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use datahelix::sampler::Sampler;

const STEPS: u64 = 4;
const GLOBAL_BATCH: usize = 4;

fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let o = common::run(
        Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
            .args(args)
            .arg("datahelix"),
    );
    assert!(
        o.status.success(),
        "pkg-config {args:?} datahelix failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect()
}

/// Runs the client under `mpirun -np 2`; returns its stdout.
fn run_client(exe: &Path, prefix: &Path, data: &Path) -> String {
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd)
        .args(["-np", "2", "-x", "LD_LIBRARY_PATH"])
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .env("DATAHELIX_COLLECTIVE_TIMEOUT", "60")
        .arg(exe)
        .arg(data)
        .args([STEPS.to_string(), GLOBAL_BATCH.to_string()]);
    let o = common::run_limited(&mut cmd, Duration::from_secs(240));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{} failed ({}):\n{out}\n{}",
        exe.display(),
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Every global batch delivered exactly once across the two ranks, and both ranks finished.
fn check_delivery(out: &str, data: &Path) {
    let ids = common::manifest_ids(data);
    let sampler = Sampler::new(&ids, 0);
    let mut got: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in out.lines().filter_map(|l| l.strip_prefix("ids ")) {
        let mut f = line.split(' ');
        let step: u64 = f.next().unwrap().parse().unwrap();
        let _rank = f.next().unwrap();
        let batch = got.entry(step).or_default();
        // "ids STEP RANK delivered skipped": a skipped sample is delivered nowhere else either.
        for list in [f.next(), f.nth(1)] {
            let list = list.unwrap_or("");
            batch.extend(list.split(',').filter(|s| !s.is_empty()).map(|s| s.parse::<u64>().unwrap()));
        }
    }
    assert_eq!(got.len() as u64, STEPS, "steps delivered:\n{out}");
    for (step, mut batch) in got {
        let mut want = sampler.global_batch(step, GLOBAL_BATCH);
        batch.sort_unstable();
        want.sort_unstable();
        assert_eq!(batch, want, "step {step}: the two ranks together did not deliver the global batch once");
    }
    let version = format!("datahelix {}", env!("CARGO_PKG_VERSION"));
    for rank in 0..2 {
        assert!(out.contains(&format!("ok {rank} {version}")), "rank {rank} did not finish:\n{out}");
    }
}

#[test]
fn installed_library_builds_a_client_outside_the_tree_with_pkg_config() {
    let lib = build_dir();
    let tmp = tempfile::tempdir().unwrap();
    let prefix = tmp.path().join("prefix");
    let o = common::run(
        Command::new("bash")
            .arg(common::repo().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--from")
            .arg(&lib),
    );
    assert!(o.status.success(), "install.sh failed:\n{}", String::from_utf8_lossy(&o.stderr));

    // The layout, the soname and the links a dynamic loader and a linker look for.
    let version = env!("CARGO_PKG_VERSION");
    let major = env!("CARGO_PKG_VERSION_MAJOR");
    let real = prefix.join(format!("lib/libdatahelix.so.{version}"));
    assert!(real.is_file(), "{} missing", real.display());
    let read_link = |p: &str| std::fs::read_link(prefix.join(p)).unwrap().display().to_string();
    assert_eq!(read_link(&format!("lib/libdatahelix.so.{major}")), format!("libdatahelix.so.{version}"));
    assert_eq!(read_link("lib/libdatahelix.so"), format!("libdatahelix.so.{major}"));
    for f in [
        "lib/libdatahelix.a",
        "include/datahelix.h",
        "lib/pkgconfig/datahelix.pc",
        "share/doc/datahelix/LICENSE",
    ] {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    let o = common::run(Command::new("readelf").arg("-d").arg(&real));
    let dynamic = String::from_utf8_lossy(&o.stdout);
    assert!(
        dynamic.contains(&format!("Library soname: [libdatahelix.so.{major}]")),
        "no soname libdatahelix.so.{major}:\n{dynamic}"
    );
    let header = std::fs::read_to_string(prefix.join("include/datahelix.h")).unwrap();
    let parts: Vec<&str> = version.split('.').collect();
    for (name, value) in ["MAJOR", "MINOR", "PATCH"].iter().zip(&parts) {
        assert!(
            header.contains(&format!("#define DH_VERSION_{name} {value}")),
            "header lacks DH_VERSION_{name} {value}"
        );
    }
    assert_eq!(pkg_config(&prefix, &["--modversion"]), vec![version.to_string()]);

    // A client outside the source tree: only pkg-config's flags find the header and library.
    let outside = tmp.path().join("client");
    std::fs::create_dir(&outside).unwrap();
    let source = outside.join("installed.c");
    std::fs::copy(common::repo().join("csrc/tests/installed.c"), &source).unwrap();
    let data = common::tiny_dataset();
    let build = |exe: &Path, static_link: bool| {
        let mut args = vec!["--cflags", "--libs"];
        if static_link {
            args.push("--static");
        }
        let flags = pkg_config(&prefix, &args);
        let mut cc = Command::new("cc");
        cc.current_dir(&outside)
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror"])
            .arg(&source)
            .arg("-o")
            .arg(exe);
        if static_link {
            // The archive, not the shared library, for this one binary (the system's own
            // libraries stay shared).
            cc.arg(prefix.join("lib/libdatahelix.a"));
            cc.args(flags.iter().filter(|f| *f != "-ldatahelix"));
        } else {
            cc.args(&flags);
        }
        let o = common::run(&mut cc);
        assert!(
            o.status.success(),
            "cc {} {flags:?} failed:\n{}",
            source.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let dynamic_exe = outside.join("installed");
    build(&dynamic_exe, false);
    let o = common::run(Command::new("readelf").arg("-d").arg(&dynamic_exe));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("Shared library: [libdatahelix.so.{major}]")),
        "the client does not ask for the soname"
    );
    check_delivery(&run_client(&dynamic_exe, &prefix, &data), &data);

    let static_exe = outside.join("installed-static");
    build(&static_exe, true);
    let o = common::run(Command::new("readelf").arg("-d").arg(&static_exe));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("libdatahelix"),
        "the static client still needs libdatahelix.so"
    );
    check_delivery(&run_client(&static_exe, &prefix, &data), &data);
}
