//! Read-only datasets (issue 19, item 3): `--index-dir` (and `DATAHELIX_INDEX_DIR`) put the
//! index elsewhere, every command that reads a dataset finds it there, and nothing is written
//! into the dataset folder — a read-only bind mount of it, where the test may mount.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

/// Every path under `dir` with its size and modification time: what "nothing written" compares.
fn listing(dir: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            let name = e.path().strip_prefix(dir).unwrap().display().to_string();
            out.insert(name, (m.len(), m.modified().unwrap()));
        }
    }
    out
}

/// A read-only bind mount of a folder (root ignores file modes, so only a read-only mount shows
/// that nothing tries to write), unmounted on drop, also when the test fails.
struct ReadOnlyMount {
    at: tempfile::TempDir,
}

impl ReadOnlyMount {
    /// Mounts `src` read-only at a new folder; `None` where mounting is not allowed (not root).
    fn new(src: &Path) -> Option<ReadOnlyMount> {
        let mount = |args: &[&std::ffi::OsStr]| {
            std::process::Command::new("mount").args(args).status().is_ok_and(|s| s.success())
        };
        let at = tempfile::tempdir().unwrap();
        if !mount(&["--bind".as_ref(), src.as_os_str(), at.path().as_os_str()]) {
            return None;
        }
        let mounted = ReadOnlyMount { at };
        let remounted = mount(&["-o".as_ref(), "remount,ro,bind".as_ref(), mounted.path().as_os_str()]);
        assert!(remounted, "cannot remount {} read-only", mounted.path().display());
        Some(mounted)
    }

    fn path(&self) -> &Path {
        self.at.path()
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.at.path()).status();
    }
}

/// `datahelix decode --json` of `dir` with `args` and `env`: each sample's (id, sha256).
fn decoded(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Result<BTreeMap<u64, String>, String> {
    let mut cmd = common::datahelix();
    cmd.arg("decode").arg(dir).arg("--json").args(args).env_remove("DATAHELIX_INDEX_DIR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = common::run(&mut cmd);
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).into_owned());
    }
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    Ok(doc["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_u64().unwrap(), s["sha256"].as_str().unwrap_or("failed").to_string()))
        .collect())
}

#[test]
fn a_dataset_indexed_elsewhere_is_read_everywhere_and_left_untouched() {
    let copy = common::copy_dataset(&common::tiny_dataset());
    let mount = ReadOnlyMount::new(copy.path());
    let data: &Path = match &mount {
        Some(m) => m.path(),
        None => {
            eprintln!("not allowed to mount here: the dataset is a writable copy, checked for writes");
            copy.path()
        }
    };
    let idx = tempfile::tempdir().unwrap();
    let index_dir = idx.path().join("tiny-index");
    let before = listing(data);

    if mount.is_some() {
        // Without an index folder, a read-only dataset is indexed in the cache, saying so, and
        // found there by the commands that read it.
        let cache = tempfile::tempdir().unwrap();
        let o = common::run(
            common::datahelix()
                .arg("index")
                .arg(data)
                .env_remove("DATAHELIX_INDEX_DIR")
                .env("XDG_CACHE_HOME", cache.path()),
        );
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{e}");
        assert!(e.contains("cannot be written") && e.contains(cache.path().to_str().unwrap()), "{e}");
        let from_cache = decoded(data, &[], &[("XDG_CACHE_HOME", cache.path())]).unwrap();
        assert_eq!(from_cache, decoded(&common::tiny_dataset(), &[], &[]).unwrap());
    }

    let o = common::run(
        common::datahelix()
            .arg("index")
            .arg(data)
            .arg("--index-dir")
            .arg(&index_dir)
            .env_remove("DATAHELIX_INDEX_DIR"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(index_dir.join("index").is_file(), "no index in {}", index_dir.display());

    // The same bytes as the dataset indexed in place.
    let reference = decoded(&common::tiny_dataset(), &[], &[]).unwrap();
    let elsewhere = decoded(data, &["--index-dir", index_dir.to_str().unwrap()], &[]).unwrap();
    assert_eq!(elsewhere, reference);
    assert!(!reference.values().any(|s| s == "failed"), "{reference:?}");
    let from_env = decoded(data, &[], &[("DATAHELIX_INDEX_DIR", &index_dir)]).unwrap();
    assert_eq!(from_env, reference);
    // Without it the dataset has no index, and the error says how to make one.
    let e = decoded(data, &[], &[]).unwrap_err();
    assert!(e.contains("datahelix index"), "{e}");

    // Training on two ranks, with the fingerprint's check of the index.
    let run = common::train_2_ranks(data, "helix", 6, &["--index-dir", index_dir.to_str().unwrap()], &[]);
    assert!(run.ok, "{}", run.text);

    assert_eq!(listing(data), before, "the dataset folder was written to");
}
