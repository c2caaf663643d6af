//! Manifests as public datasets ship their metadata (issue 19, item 2): `manifest.csv` and
//! `manifest.parquet` (written here by Python's csv module and by pyarrow, a real Parquet writer)
//! give the same index as the equivalent `manifest.jsonl`; `datahelix manifest DIR` makes a
//! manifest for a folder of media with sidecar captions.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use datahelix::descriptor::{Descriptor, Status};
use datahelix::index::Index;

/// The project's Python environment (scripts/setup.sh), which has pyarrow.
fn python() -> PathBuf {
    let venv = std::env::var_os("DH_VENV").map(PathBuf::from).unwrap_or_else(|| common::repo().join(".venv"));
    let py = venv.join("bin/python");
    assert!(py.is_file(), "no Python environment at {}: run scripts/setup.sh", venv.display());
    py
}

/// Runs a Python script with `args`; fails the test with its stderr.
fn run_python(script: &str, args: &[&Path]) {
    let o = Command::new(python()).arg("-c").arg(script).args(args).output().expect("run python");
    assert!(o.status.success(), "python failed: {}", String::from_utf8_lossy(&o.stderr));
}

/// Rewrites DIR/manifest.jsonl as manifest.csv and two Parquet files (snappy, zstd), the columns
/// shuffled and a caption column added (commas, quotes, newlines in it), then removes the jsonl.
const TABLES: &str = r#"
import csv, json, sys
import pyarrow as pa, pyarrow.parquet as pq
d = sys.argv[1]
rows = [json.loads(l) for l in open(f"{d}/manifest.jsonl") if l.strip()]
for r in rows:
    r["caption"] = f'clip {r["id"]}, "quoted"\nsecond line'
with open(f"{d}/manifest.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=["caption", "path", "text_tokens", "id"])
    w.writeheader()
    w.writerows(rows)
table = pa.table({
    "path": pa.array([r["path"] for r in rows], pa.string()),
    "id": pa.array([r["id"] for r in rows], pa.uint64()),
    "caption": pa.array([r["caption"] for r in rows], pa.string()),
    "text_tokens": pa.array([r["text_tokens"] for r in rows], pa.int32()),
})
pq.write_table(table, f"{d}/snappy.parquet", row_group_size=7)
pq.write_table(table, f"{d}/zstd.parquet", compression="zstd")
"#;

/// The index's descriptors, each without the manifest line it came from (a CSV's rows start
/// on line 2, a Parquet's count from 1).
fn descriptors(dir: &Path) -> Vec<(String, Descriptor)> {
    let index = Index::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    (0..index.len())
        .map(|i| {
            let d = Descriptor { manifest_line: 0, ..index.get(i).unwrap() };
            (index.path(i).unwrap().to_owned(), d)
        })
        .collect()
}

/// `decode --json`'s metadata of the first three samples of the index, by id.
fn decoded_meta(dir: &Path) -> Vec<(u64, serde_json::Value)> {
    let index = Index::open(dir).unwrap();
    let ids: Vec<String> = (0..3).map(|i| index.get(i).unwrap().id.to_string()).collect();
    let o = common::run(common::datahelix().arg("decode").arg(dir).args(["--json", "--ids", &ids.join(",")]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    doc["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_u64().unwrap(), s["meta"].clone()))
        .collect()
}

/// What [`decoded_meta`] must give for `TABLES`' rows: path and caption (text_tokens is not
/// metadata).
fn caption_meta(dir: &Path) -> Vec<(u64, serde_json::Value)> {
    let index = Index::open(dir).unwrap();
    (0..3)
        .map(|i| {
            let id = index.get(i).unwrap().id;
            let caption = format!("clip {id}, \"quoted\"\nsecond line");
            (id, serde_json::json!({"path": index.path(i).unwrap(), "caption": caption}))
        })
        .collect()
}

fn index(dir: &Path) -> std::process::Output {
    common::run(
        common::datahelix()
            .arg("index")
            .arg(dir)
            .args(["--force", "--json"])
            .env_remove("DATAHELIX_INDEX_DIR"),
    )
}

#[test]
fn csv_and_parquet_manifests_give_the_jsonl_index() {
    let data = common::copy_dataset(&common::tiny_dataset());
    let dir = data.path();
    let o = index(dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let reference = descriptors(dir);
    assert!(reference.len() > 10 && reference.iter().any(|(_, d)| d.id > i64::MAX as u64));

    run_python(TABLES, &[dir]);
    // Two manifests side by side: which one is meant is not guessed.
    let o = index(dir);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("manifest.jsonl") && e.contains("manifest.csv"), "{e}");
    std::fs::remove_file(dir.join("manifest.jsonl")).unwrap();

    let o = index(dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(descriptors(dir), reference, "manifest.csv");
    // The table's other columns are each sample's metadata (decode --json's "meta").
    assert_eq!(decoded_meta(dir), caption_meta(dir), "manifest.csv");
    let csv_lines: Vec<u32> = {
        let index = Index::open(dir).unwrap();
        (0..index.len()).map(|i| index.get(i).unwrap().manifest_line).collect()
    };
    // Each row starts on its own line after the header, two lines a row (the caption's newline
    // is inside quotes).
    assert_eq!(csv_lines, (0..reference.len() as u32).map(|i| 2 + 2 * i).collect::<Vec<_>>());

    std::fs::remove_file(dir.join("manifest.csv")).unwrap();
    for table in ["snappy.parquet", "zstd.parquet"] {
        std::fs::copy(dir.join(table), dir.join("manifest.parquet")).unwrap();
        let o = index(dir);
        assert!(o.status.success(), "{table}: {}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(descriptors(dir), reference, "{table}");
        assert_eq!(decoded_meta(dir), caption_meta(dir), "{table}");
    }
    // A damaged table is this file's error, not a crash.
    let mut bytes = std::fs::read(dir.join("manifest.parquet")).unwrap();
    let n = bytes.len();
    bytes.truncate(n / 2);
    std::fs::write(dir.join("manifest.parquet"), &bytes).unwrap();
    let o = index(dir);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("manifest.parquet"), "{e}");
}

#[test]
fn bad_csv_rows_are_named_and_the_rest_indexed() {
    let data = common::copy_dataset(&common::tiny_dataset());
    let dir = data.path();
    let jsonl = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    let (id, path) = (first["id"].as_u64().unwrap(), first["path"].as_str().unwrap());
    let csv = format!("id,path,text_tokens\n{id},{path},5\n-3,videos/x.mp4,1\n7,,1\n8,images/y.png,lots\n");
    std::fs::write(dir.join("manifest.csv"), csv).unwrap();
    std::fs::remove_file(dir.join("manifest.jsonl")).unwrap();
    let o = index(dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let errors = doc["manifest_errors"].as_array().unwrap();
    let lines: Vec<u64> = errors.iter().map(|e| e["line"].as_u64().unwrap()).collect();
    assert_eq!(lines, vec![3, 4, 5], "{doc}");
    let text = errors.iter().map(|e| e.to_string()).collect::<String>();
    assert!(text.contains("-3") && text.contains("path is empty") && text.contains("lots"), "{text}");
    let ds = descriptors(dir);
    assert_eq!(ds.len(), 1);
    assert_eq!((ds[0].1.id, ds[0].1.status, ds[0].1.text_tokens), (id, Status::Ok, 5));
}

#[test]
fn datahelix_manifest_lists_media_with_their_captions() {
    let tiny = common::tiny_dataset();
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    let mut media: Vec<PathBuf> = Vec::new();
    for sub in ["videos", "images"] {
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(tiny.join(sub)).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        media.extend(files.into_iter().take(2));
    }
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::create_dir_all(dir.join(".cache")).unwrap();
    let names = ["a/b/one", "a/two", "three", "four"];
    for (src, name) in media.iter().zip(names) {
        let ext = src.extension().unwrap().to_str().unwrap().to_uppercase();
        std::fs::copy(src, dir.join(format!("{name}.{ext}"))).unwrap();
    }
    std::fs::copy(&media[0], dir.join(".cache/hidden.mp4")).unwrap();
    std::fs::write(dir.join("a/b/one.txt"), "  a red car turns left \n").unwrap();
    std::fs::write(dir.join("a/two.json"), r#"{"caption": "two dogs", "label": 3}"#).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a caption of anything").unwrap();

    let manifest = |force: bool| {
        let mut c = common::datahelix();
        c.arg("manifest").arg(dir).arg("--json");
        if force {
            c.arg("--force");
        }
        common::run(&mut c)
    };
    let o = manifest(false);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((doc["samples"].as_u64(), doc["with_caption"].as_u64()), (Some(4), Some(2)), "{doc}");
    let written = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = written.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    let ext = |i: usize| media[i].extension().unwrap().to_str().unwrap().to_uppercase();
    let mut want = vec![
        format!("a/b/one.{}", ext(0)),
        format!("a/two.{}", ext(1)),
        format!("four.{}", ext(3)),
        format!("three.{}", ext(2)),
    ];
    want.sort();
    assert_eq!(paths, want);
    let one = rows.iter().find(|r| r["path"].as_str().unwrap().starts_with("a/b/one")).unwrap();
    assert_eq!(
        (one["caption"].as_str(), one["text_tokens"].as_u64()),
        (Some("a red car turns left"), Some(5))
    );
    let two = rows.iter().find(|r| r["path"].as_str().unwrap().starts_with("a/two")).unwrap();
    assert_eq!((two["caption"].as_str(), two["text_tokens"].as_u64()), (Some("two dogs"), Some(2)));

    // An existing manifest is kept unless --force; the ids come from the paths, so they agree.
    let o = manifest(false);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--force"));
    assert!(manifest(true).status.success());
    assert_eq!(std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap(), written);

    let o = index(dir);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ds = descriptors(dir);
    assert_eq!(ds.len(), 4);
    assert!(ds.iter().all(|(_, d)| d.status == Status::Ok), "{ds:?}");
}
