//! The committed `csrc/include/datahelix.h` is what the pinned cbindgen generates from `src/ffi`
//! (so every exported function, struct layout and result number agrees with the Rust side), and
//! the built `libdatahelix.so` exports exactly the header's functions.
//!
//! After changing `src/ffi`, regenerate the header with `DH_BLESS=1 cargo test --test c_abi_header`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let root = repo();
    let config = cbindgen::Config::from_file(root.join("csrc/include/cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root.join("src/ffi/mod.rs")) // and the modules it declares
        .generate()
        .expect("cbindgen failed on src/ffi");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn header_is_generated_from_src_ffi() {
    let path = repo().join("csrc/include/datahelix.h");
    let want = generate();
    if std::env::var_os("DH_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{} is stale (first difference at line {}: have {:?}, generated {:?}); \
             run `DH_BLESS=1 cargo test --test c_abi_header` and commit it",
            path.display(),
            first + 1,
            have.lines().nth(first).unwrap_or(""),
            want.lines().nth(first).unwrap_or("")
        );
    }
}

/// Function names declared in the header: comments and preprocessor lines removed, each
/// declaration up to `;` whose text has a `(` and is not a type definition.
fn header_functions(text: &str) -> BTreeSet<String> {
    let mut code = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        code.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    code.push_str(rest);
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    let mut names = BTreeSet::new();
    for decl in code.split([';', '{', '}']) {
        let decl = decl.trim();
        if decl.starts_with("typedef") || decl.starts_with("extern") {
            continue;
        }
        if let Some(paren) = decl.find('(') {
            let head = &decl[..paren];
            if let Some(name) =
                head.split(|c: char| !(c.is_alphanumeric() || c == '_')).rev().find(|s| !s.is_empty())
            {
                if name.starts_with("dh_") {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

fn cdylib() -> PathBuf {
    // target/debug/deps/c_abi_header-HASH -> target/debug
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().join("libdatahelix.so")
}

#[test]
fn cdylib_exports_exactly_the_header_functions() {
    let header = std::fs::read_to_string(repo().join("csrc/include/datahelix.h")).unwrap();
    let declared = header_functions(&header);
    assert!(declared.len() >= 20, "too few functions parsed from the header: {declared:?}");
    let lib = cdylib();
    assert!(lib.exists(), "{} not built (crate-type cdylib in Cargo.toml)", lib.display());
    let o = Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("nm");
    assert!(o.status.success(), "nm failed: {}", String::from_utf8_lossy(&o.stderr));
    let exported: BTreeSet<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|n| n.starts_with("dh_"))
        .map(str::to_string)
        .collect();
    assert_eq!(exported, declared, "exports of {} vs functions of datahelix.h", lib.display());
}
