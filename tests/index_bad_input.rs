//! Every kind of bad input becomes a status (or, for a manifest line, an error naming the line);
//! the index build never aborts, and a rebuild re-probes only what changed.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use datahelix::descriptor::Status;
use datahelix::index::{build, BuildOptions, Index};

fn ffmpeg(args: &[&str], out: &Path) {
    let o = common::run(
        Command::new("ffmpeg").args(["-nostdin", "-loglevel", "error", "-y"]).args(args).arg(out),
    );
    assert!(o.status.success(), "ffmpeg {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

fn first_with_ext(dir: &Path, ext: &str) -> String {
    let text = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let p = v["path"].as_str().unwrap();
        if p.ends_with(ext) {
            return p.to_string();
        }
    }
    panic!("no {ext} in the tiny dataset");
}

fn truncate_copy(dir: &Path, from: &str, to: &str, keep: f64) {
    let bytes = std::fs::read(dir.join(from)).unwrap();
    std::fs::write(dir.join(to), &bytes[..(bytes.len() as f64 * keep) as usize]).unwrap();
}

/// A dataset holding one sample of every bad kind beside two good ones.
fn bad_dataset() -> (tempfile::TempDir, BTreeMap<u64, Status>) {
    let tmp = common::copy_dataset(&common::tiny_dataset());
    let d = tmp.path();
    let mp4 = first_with_ext(d, ".mp4");
    let mkv = first_with_ext(d, ".mkv");
    let jpg = first_with_ext(d, ".jpg");
    let png = first_with_ext(d, ".png");
    std::fs::create_dir_all(d.join("bad")).unwrap();
    std::fs::write(d.join("bad/empty.mp4"), b"").unwrap();
    std::fs::write(d.join("bad/text.mp4"), b"hello, I am a text file and not a video\n".repeat(20)).unwrap();
    truncate_copy(d, &mp4, "bad/cut.mp4", 0.5);
    truncate_copy(d, &mkv, "bad/cut.mkv", 0.5);
    truncate_copy(d, &jpg, "bad/cut.jpg", 0.6);
    truncate_copy(d, &png, "bad/cut.png", 0.6);
    // A faststart MP4 (moov first) cut short: the header is intact, the data is not.
    ffmpeg(
        &[
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=160x120:rate=10",
            "-t",
            "2",
            "-c:v",
            "libx264",
            "-movflags",
            "+faststart",
        ],
        &d.join("bad/fast.mp4"),
    );
    truncate_copy(d, "bad/fast.mp4", "bad/fastcut.mp4", 0.7);
    ffmpeg(
        &["-f", "lavfi", "-i", "testsrc2=size=160x120:rate=10", "-t", "1", "-c:v", "mpeg2video"],
        &d.join("bad/mpeg2.mkv"),
    );
    ffmpeg(&["-f", "lavfi", "-i", "sine=frequency=440:duration=1"], &d.join("bad/audio.mkv"));
    std::fs::create_dir_all(d.join("bad/dir.mp4")).unwrap();

    let cases: Vec<(u64, String, Status)> = vec![
        (1, mp4.clone(), Status::Ok),
        (2, png.clone(), Status::Ok),
        (3, "bad/nothere.mp4".into(), Status::Missing),
        (4, "bad/empty.mp4".into(), Status::Empty),
        (5, "bad/text.mp4".into(), Status::NotMedia),
        (6, "bad/cut.mp4".into(), Status::Truncated),
        (7, "bad/cut.mkv".into(), Status::Truncated),
        (8, "bad/cut.jpg".into(), Status::Truncated),
        (9, "bad/cut.png".into(), Status::Truncated),
        (10, "bad/fastcut.mp4".into(), Status::Truncated),
        (11, "bad/mpeg2.mkv".into(), Status::UnsupportedCodec),
        (12, "bad/audio.mkv".into(), Status::NoVideoStream),
        (13, "../outside.mp4".into(), Status::BadPath),
        (14, "/etc/passwd".into(), Status::BadPath),
        (15, "bad/dir.mp4".into(), Status::Unreadable),
        (1, mkv.clone(), Status::DuplicateId),
        (u64::MAX, mkv, Status::Ok),
    ];
    let mut manifest = String::new();
    for (i, (id, path, _)) in cases.iter().enumerate() {
        manifest.push_str(&serde_json::json!({"id": id, "path": path, "text_tokens": i}).to_string());
        manifest.push('\n');
        if i == 3 {
            manifest.push_str("{\"id\": 99, \"path\": \n"); // malformed: line 5
            manifest.push_str("{\"id\": -3, \"path\": \"x.mp4\"}\n"); // negative id: line 6
        }
    }
    std::fs::write(d.join("manifest.jsonl"), manifest).unwrap();
    let expect = cases.iter().filter(|c| c.2 != Status::DuplicateId).map(|c| (c.0, c.2)).collect();
    (tmp, expect)
}

#[test]
fn every_bad_input_becomes_a_reported_status() {
    let (tmp, expect) = bad_dataset();
    let report =
        build(tmp.path(), &BuildOptions { workers: 2, progress: false, force: false, ..Default::default() })
            .expect("build never aborts");
    assert_eq!(report.count, 17 + 2);
    assert_eq!(report.ok, 3);
    assert_eq!(report.bad, 16);
    assert_eq!(report.by_status.get("malformed_line"), Some(&2));
    assert_eq!(report.by_status.get("duplicate_id"), Some(&1));
    assert_eq!(report.by_status.get("bad_path"), Some(&2));
    let lines: Vec<u32> = report.manifest_errors.iter().map(|e| e.line).collect();
    assert_eq!(lines, vec![5, 6]);

    let index = Index::open(tmp.path()).unwrap();
    assert_eq!(index.len(), 17);
    let mut dup_seen = false;
    for i in 0..index.len() {
        let d = index.get(i).unwrap();
        let path = index.path(i).unwrap();
        if d.status == Status::DuplicateId {
            assert_eq!(d.id, 1);
            dup_seen = true;
            continue;
        }
        assert_eq!(Some(&d.status), expect.get(&d.id), "sample {} ({path})", d.id);
    }
    assert!(dup_seen);
    // Lookup by id finds the first occurrence of a duplicated id.
    assert_eq!(index.position_of(1), Some(0));
    assert_eq!(index.position_of(u64::MAX), Some(16));
    assert_eq!(index.position_of(424242), None);
}

#[test]
fn rebuild_reprobes_only_changed_files() {
    let tmp = common::copy_dataset(&common::tiny_dataset());
    let opts = BuildOptions { workers: 2, progress: false, force: false, ..Default::default() };
    let first = build(tmp.path(), &opts).unwrap();
    assert_eq!((first.probed, first.reused), (12, 0));
    let second = build(tmp.path(), &opts).unwrap();
    assert_eq!((second.probed, second.reused), (0, 12));

    // Change one file: cut it in half. Only it is probed again, and the change is seen.
    let path = first_with_ext(tmp.path(), ".mp4");
    truncate_copy(tmp.path(), &path, &path, 0.5);
    let third = build(tmp.path(), &opts).unwrap();
    assert_eq!((third.probed, third.reused), (1, 11));
    assert_eq!(third.by_status.get("truncated"), Some(&1));
    let forced = build(tmp.path(), &BuildOptions { force: true, ..opts }).unwrap();
    assert_eq!((forced.probed, forced.reused), (12, 0));
}

#[test]
fn a_missing_manifest_is_an_error_not_a_crash() {
    let tmp = tempfile::tempdir().unwrap();
    let err = build(tmp.path(), &BuildOptions::default()).unwrap_err();
    assert!(err.to_string().contains("manifest.jsonl"), "{err}");
}
