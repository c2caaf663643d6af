//! Probes for a CANN install and links its `libhccl.so` / `libascendcl.so`; without one, builds
//! the project's host-memory emulator (`csrc/hccl-emu/`) and links that, saying so once.
//!
//! Order of the places looked (the first with both libraries wins):
//! 1. `DATAHELIX_CANN_HOME` (explicit; an error if it does not hold the libraries),
//! 2. `ASCEND_HOME_PATH` (exported by CANN's `set_env.sh`), 3. `ASCEND_TOOLKIT_HOME`,
//! 4. `/usr/local/Ascend/cann`, 5. `/usr/local/Ascend/ascend-toolkit/latest`.
//!
//! `DATAHELIX_HCCL_EMULATOR=1` skips the probe and links the emulator even where CANN exists.
//!
//! The emulator libraries get their absolute path as soname, so binaries linked against them
//! find them without `LD_LIBRARY_PATH` (a `DT_NEEDED` with a slash is loaded from that path).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const EXPLICIT: &str = "DATAHELIX_CANN_HOME";
const ENV_ROOTS: [&str; 2] = ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"];
const DEFAULT_ROOTS: [&str; 2] = ["/usr/local/Ascend/cann", "/usr/local/Ascend/ascend-toolkit/latest"];
const FORCE_EMULATOR: &str = "DATAHELIX_HCCL_EMULATOR";

fn lib_dir_of(root: &Path) -> Option<PathBuf> {
    ["lib64", "lib"]
        .iter()
        .map(|d| root.join(d))
        .find(|d| d.join("libhccl.so").is_file() && d.join("libascendcl.so").is_file())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=include/dh_hccl.h");
    for v in [EXPLICIT, ENV_ROOTS[0], ENV_ROOTS[1], FORCE_EMULATOR, "CC", "CFLAGS"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo::rustc-check-cfg=cfg(hccl_emulator)");

    let force = env::var(FORCE_EMULATOR).map(|v| v == "1").unwrap_or(false);
    let mut looked: Vec<String> = Vec::new();
    if !force {
        if let Some(root) = env::var_os(EXPLICIT).filter(|v| !v.is_empty()) {
            let root = PathBuf::from(root);
            match lib_dir_of(&root) {
                Some(dir) => return link_cann(&dir),
                None => {
                    eprintln!(
                        "hccl-sys: {EXPLICIT}={} holds no lib64/libhccl.so and lib64/libascendcl.so.\n\
                         Point {EXPLICIT} at a CANN toolkit root (the folder with include/ and lib64/), \
                         or unset it to probe ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME / the default roots, \
                         or set {FORCE_EMULATOR}=1 to link the host-memory emulator.",
                        root.display()
                    );
                    std::process::exit(1);
                }
            }
        }
        looked.push(format!("{EXPLICIT} (unset)"));
        let mut candidates: Vec<(String, PathBuf)> = Vec::new();
        for v in ENV_ROOTS {
            match env::var_os(v).filter(|x| !x.is_empty()) {
                Some(p) => candidates.push((v.to_string(), PathBuf::from(p))),
                None => looked.push(format!("{v} (unset)")),
            }
        }
        for d in DEFAULT_ROOTS {
            candidates.push(("default root".to_string(), PathBuf::from(d)));
        }
        for (how, root) in candidates {
            match lib_dir_of(&root) {
                Some(dir) => return link_cann(&dir),
                None => {
                    looked.push(format!("{} ({how}): no lib64/libhccl.so + libascendcl.so", root.display()))
                }
            }
        }
    } else {
        looked.push(format!("{FORCE_EMULATOR}=1: probe skipped"));
    }
    build_emulator(&looked);
}

fn link_cann(dir: &Path) {
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-env=HCCL_SYS_LINKED_FROM={}", dir.display());
    println!("cargo:lib_dir={}", dir.display());
    println!("cargo:emulator=0");
}

fn build_emulator(looked: &[String]) {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let src = manifest.join("..").join("csrc").join("hccl-emu");
    let include = manifest.join("include");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("hccl-emu");
    if let Err(e) = std::fs::create_dir_all(&out) {
        fail(&format!("cannot create {}: {e}", out.display()));
    }
    for f in ["emu.h", "ascendcl.c", "hccl.c"] {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
        if !src.join(f).is_file() {
            fail(&format!(
                "the emulator source {} is missing (hccl-sys builds the emulator from the DataHelix \
                 workspace's csrc/hccl-emu/)",
                src.join(f).display()
            ));
        }
    }
    let compiler = cc::Build::new().opt_level(2).get_compiler();
    let acl = out.join("libascendcl.so");
    let hccl = out.join("libhccl.so");
    let common = |cmd: &mut Command| {
        cmd.args(["-shared", "-fPIC", "-O2", "-g", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra"])
            .arg("-fvisibility=hidden")
            .arg(format!("-I{}", include.display()))
            .arg(format!("-I{}", src.display()));
    };
    let mut cmd = compiler.to_command();
    common(&mut cmd);
    cmd.arg(src.join("ascendcl.c"))
        .arg("-o")
        .arg(&acl)
        .arg(format!("-Wl,-soname,{}", acl.display()))
        .args(["-lpthread", "-lrt"]);
    run(cmd, "libascendcl.so");
    let mut cmd = compiler.to_command();
    common(&mut cmd);
    cmd.arg(src.join("hccl.c"))
        .arg("-o")
        .arg(&hccl)
        .arg(format!("-Wl,-soname,{}", hccl.display()))
        .arg(&acl)
        .args(["-lpthread", "-lrt"]);
    run(cmd, "libhccl.so");

    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-cfg=hccl_emulator");
    println!("cargo:rustc-env=HCCL_SYS_LINKED_FROM={}", out.display());
    println!("cargo:lib_dir={}", out.display());
    println!("cargo:emulator=1");
    println!(
        "cargo:warning=hccl-sys: no CANN install found ({}); linking the host-memory HCCL/ACL emulator \
         from csrc/hccl-emu (for tests; not for Ascend hardware). Set {EXPLICIT} or source CANN's set_env.sh to use CANN.",
        looked.join("; ")
    );
}

fn run(mut cmd: Command, what: &str) {
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!("compiling the emulator's {what} failed ({s}): {cmd:?}")),
        Err(e) => fail(&format!(
            "cannot run the C compiler for the emulator's {what}: {e} ({cmd:?}); install gcc or set CC"
        )),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("hccl-sys: {msg}");
    std::process::exit(1);
}
