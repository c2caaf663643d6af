//! The `gen` and `index` commands: JSON shapes from shared/CLI.md, exit codes, determinism.

mod common;

use serde_json::Value;

#[test]
fn index_json_has_the_documented_shape() {
    let dir = common::tiny_dataset();
    let o = common::run(common::datahelix().arg("index").arg(&dir).args(["--json", "--records"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("exactly one JSON document on stdout");
    for key in ["dataset", "count", "ok", "bad", "by_status", "records"] {
        assert!(v.get(key).is_some(), "missing key {key}");
    }
    assert_eq!(v["count"], 12);
    let records = v["records"].as_array().unwrap();
    assert_eq!(records.len(), 12);
    for r in records {
        for key in [
            "id",
            "path",
            "modality",
            "codec",
            "container",
            "bytes",
            "width",
            "height",
            "frames",
            "fps",
            "duration_s",
            "bit_rate",
            "keyint",
            "text_tokens",
            "status",
        ] {
            assert!(r.get(key).is_some(), "record misses {key}: {r}");
        }
    }
    // Ids use the full u64 range and survive JSON exactly.
    let manifest = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    let first: Value = serde_json::from_str(manifest.lines().next().unwrap()).unwrap();
    assert_eq!(records[0]["id"].as_u64(), first["id"].as_u64());
}

#[test]
fn exit_codes_follow_the_contract() {
    let missing = common::run(common::datahelix().args(["index", "/nonexistent/dataset", "--json"]));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("manifest.jsonl"));
    assert!(missing.stdout.is_empty());

    let tmp = common::copy_dataset(&common::tiny_dataset());
    let m = tmp.path().join("manifest.jsonl");
    let mut text = std::fs::read_to_string(&m).unwrap();
    text.push_str("{\"id\": 5, \"path\": \"videos/gone.mp4\"}\n");
    std::fs::write(&m, text).unwrap();
    let lax = common::run(common::datahelix().arg("index").arg(tmp.path()).arg("--json"));
    assert_eq!(lax.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&lax.stdout).unwrap();
    assert_eq!(v["by_status"]["missing"], 1);
    let strict = common::run(common::datahelix().arg("index").arg(tmp.path()).args(["--json", "--strict"]));
    assert_eq!(strict.status.code(), Some(1));

    let bad_spec = common::run(
        common::datahelix().args(["gen", "--spec", "/nonexistent.json", "--out"]).arg(tmp.path()),
    );
    assert_eq!(bad_spec.status.code(), Some(2));
}

#[test]
fn gen_is_deterministic_per_spec() {
    let a = tempfile::tempdir().unwrap();
    let spec = common::repo().join("scripts/specs/tiny.json");
    let o = common::run(
        common::datahelix().args(["gen", "--workers", "2", "--spec"]).arg(&spec).arg("--out").arg(a.path()),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ours = std::fs::read(a.path().join("manifest.jsonl")).unwrap();
    let shared = std::fs::read(common::tiny_dataset().join("manifest.jsonl")).unwrap();
    assert_eq!(ours, shared, "same spec, same manifest");
    // Same files, byte for byte (ffmpeg runs single-threaded with bitexact flags).
    for line in String::from_utf8(ours).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let p = v["path"].as_str().unwrap();
        assert_eq!(
            std::fs::read(a.path().join(p)).unwrap(),
            std::fs::read(common::tiny_dataset().join(p)).unwrap(),
            "{p} differs between two generations"
        );
    }
    // A second run with the same spec writes nothing.
    let again =
        common::run(common::datahelix().args(["gen", "--spec"]).arg(&spec).arg("--out").arg(a.path()));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds"));
}
