//! Build probe: checks that the FFmpeg and MPI development files DataHelix links against are
//! present, and says how to get them when they are not. The `-sys` crates (`ffmpeg-sys-next`,
//! `mpi-sys`) do the actual linking; this script exists so that a missing library produces one
//! clear message instead of a page of bindgen errors.

use std::process::Command;

const FFMPEG_LIBS: [&str; 4] = ["libavformat", "libavcodec", "libavutil", "libswscale"];

fn pkg_config_has(lib: &str) -> bool {
    Command::new("pkg-config").args(["--exists", lib]).status().map(|s| s.success()).unwrap_or(false)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=MPICC");
    // The commit this library is built from: part of the job fingerprint every rank compares
    // (`src/exec/fingerprint.rs`), so that ranks running different builds stop at start-up.
    for git in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if std::path::Path::new(git).exists() {
            println!("cargo:rerun-if-changed={git}");
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=DATAHELIX_BUILD_COMMIT={commit}");
    // The shared library's soname carries the ABI's major version (libdatahelix.so.0), as
    // scripts/install.sh installs it; DH_VERSION_MAJOR in the header must match (src/ffi/mod.rs).
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libdatahelix.so.{major}");

    let missing: Vec<&str> = FFMPEG_LIBS.iter().copied().filter(|l| !pkg_config_has(l)).collect();
    if !missing.is_empty() {
        println!(
            "cargo:warning=FFmpeg development files not found by pkg-config: {}. \
             Run scripts/setup.sh (Debian: libavformat-dev libavcodec-dev libavutil-dev libswscale-dev), \
             or point PKG_CONFIG_PATH at your FFmpeg build.",
            missing.join(", ")
        );
    }
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_string());
    let has_mpi = Command::new(&mpicc).arg("-showme:version").output().is_ok()
        || pkg_config_has("ompi")
        || pkg_config_has("mpich");
    if !has_mpi {
        println!(
            "cargo:warning=no MPI found ({mpicc} not runnable, no ompi/mpich pkg-config). \
             Run scripts/setup.sh (Debian: libopenmpi-dev openmpi-bin) or set MPICC."
        );
    }
}
