//! `datahelix decode` on the generated tiny dataset: every sample decodes, and shapes, frame
//! choices, timestamps and pixels equal an independent ffmpeg-CLI reference decode byte for
//! byte. Also `--all-frames` counts every frame, and `calibrate` prints the documented shape.

mod common;
mod decode_support;

use std::collections::BTreeMap;

use common::{datahelix, run, tiny_dataset};
use decode_support::assert_decode_matches_reference;
use serde_json::Value;

fn json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON document on stdout")
}

#[test]
fn every_sample_matches_the_reference_decode() {
    let dir = tiny_dataset();
    let checked = assert_decode_matches_reference(&dir, datahelix().arg("decode").arg(&dir));
    let manifest = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    assert_eq!(checked, manifest.lines().filter(|l| !l.trim().is_empty()).count());
}

#[test]
fn seek_and_scan_give_identical_tensors() {
    let dir = tiny_dataset();
    let mut by: BTreeMap<&str, BTreeMap<u64, String>> = BTreeMap::new();
    for strategy in ["scan", "seek"] {
        let doc = json(&run(datahelix().arg("decode").arg(&dir).args(["--json", "--strategy", strategy])));
        for s in doc["samples"].as_array().unwrap() {
            by.entry(strategy)
                .or_default()
                .insert(s["id"].as_u64().unwrap(), s["sha256"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(by["scan"], by["seek"]);
}

#[test]
fn all_frames_counts_every_frame_and_ids_select() {
    let dir = tiny_dataset();
    let doc = json(&run(datahelix().arg("decode").arg(&dir).args(["--json", "--all-frames"])));
    let samples = doc["samples"].as_array().unwrap();
    let first = &samples[0];
    let path = dir.join(first["path"].as_str().unwrap());
    let frames = std::process::Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-count_frames",
            "-show_entries",
            "stream=nb_read_frames",
            "-of",
            "csv=p=0",
        ])
        .arg(&path)
        .output()
        .unwrap();
    let n: u64 = String::from_utf8_lossy(&frames.stdout).trim().trim_end_matches(',').parse().unwrap();
    assert_eq!(first["shape"][0].as_u64().unwrap(), n);
    let id = samples[1]["id"].as_u64().unwrap();
    let doc =
        json(&run(datahelix().arg("decode").arg(&dir).args(["--json", "--ids", &format!("{id},12345")])));
    let s = doc["samples"].as_array().unwrap();
    assert_eq!(s.len(), 2);
    assert!(s.iter().any(|x| x["id"].as_u64() == Some(id) && x["error"].is_null()));
    assert!(s.iter().any(|x| x["id"].as_u64() == Some(12345) && !x["error"].is_null()));
}

#[test]
fn calibrate_reports_models_per_codec() {
    let dir = tiny_dataset();
    let doc = json(&run(datahelix().arg("calibrate").arg(&dir).args(["--json"])));
    let models = doc["models"].as_object().unwrap();
    assert!(models.contains_key("h264") && models.contains_key("mpeg4"), "{doc}");
    for (_, m) in models {
        for k in ["c0", "c_px", "c_bits", "c_seek"] {
            assert!(m["coefficients"][k].is_number(), "{m}");
        }
        assert!(m["mean_rel_error"].is_number() && m["p95_rel_error"].is_number() && m["n"].is_u64());
    }
}
