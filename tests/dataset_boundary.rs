//! Files stay inside the dataset, and FFmpeg opens only what DataHelix supports (issue 18, item
//! 2): a symbolic link out of the dataset folder is refused at index time and, when a file is
//! swapped for such a link after indexing, at decode time; containers off the whitelist (AVI,
//! MPEG-TS, an HLS playlist that would make FFmpeg fetch a URL) are `not_media`.
//!
//! Without the fixes: the outside link was indexed `ok` and decoded, the swapped file decoded
//! (its size and mtime match the index), and the AVI and MPEG-TS files were indexed `ok`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use datahelix::descriptor::Status;
use datahelix::index::{build, BuildOptions, Index};

fn first_with_ext(dir: &Path, ext: &str) -> String {
    let text = std::fs::read_to_string(dir.join("manifest.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["path"].as_str().unwrap().to_string())
        .find(|p| p.ends_with(ext))
        .unwrap_or_else(|| panic!("no {ext} in the tiny dataset"))
}

/// A copy of `from` at `to` with the same bytes and modification time.
fn twin(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap();
    let mtime = std::fs::metadata(from).unwrap().modified().unwrap();
    std::fs::File::options().write(true).open(to).unwrap().set_modified(mtime).unwrap();
}

fn statuses(dir: &Path) -> BTreeMap<u64, Status> {
    let index = Index::open(dir).unwrap();
    (0..index.len()).map(|i| index.get(i).unwrap()).map(|d| (d.id, d.status)).collect()
}

/// `manifest.jsonl` of these `(id, path)` samples.
fn write_manifest(dir: &Path, samples: &[(u64, &str)]) {
    let text: String = samples
        .iter()
        .map(|(id, p)| format!("{{\"id\": {id}, \"path\": \"{p}\", \"text_tokens\": 4}}\n"))
        .collect();
    std::fs::write(dir.join("manifest.jsonl"), text).unwrap();
}

fn opts() -> BuildOptions {
    BuildOptions { workers: 2, progress: false, force: false, ..Default::default() }
}

#[test]
fn links_out_of_the_dataset_are_refused_at_index_and_at_decode() {
    let data = common::copy_dataset(&common::tiny_dataset());
    let outside = tempfile::tempdir().unwrap();
    let d = data.path();
    let mp4 = first_with_ext(d, ".mp4");
    twin(&d.join(&mp4), &outside.path().join("clip.mp4"));
    std::os::unix::fs::symlink(d.join(&mp4), d.join("inside-link.mp4")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("clip.mp4"), d.join("outside-link.mp4")).unwrap();
    twin(&d.join(&mp4), &d.join("swapped.mp4"));
    write_manifest(d, &[(1, "inside-link.mp4"), (2, "outside-link.mp4"), (3, "swapped.mp4")]);

    build(d, &opts()).unwrap();
    let s = statuses(d);
    assert_eq!(s[&1], Status::Ok, "a link that stays inside is fine");
    assert_eq!(s[&2], Status::OutsideDataset, "a link out of the folder is refused at index time");
    assert_eq!(s[&3], Status::Ok);

    // After indexing, the file is replaced by a link to its twin outside: same size, same mtime.
    std::fs::remove_file(d.join("swapped.mp4")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("clip.mp4"), d.join("swapped.mp4")).unwrap();
    let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("decode").arg(d).arg("--json"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let by_id: BTreeMap<u64, &serde_json::Value> =
        doc["samples"].as_array().unwrap().iter().map(|s| (s["id"].as_u64().unwrap(), s)).collect();
    assert!(by_id[&1]["error"].is_null(), "{}", by_id[&1]);
    let refused = by_id[&3]["error"].as_str().unwrap_or_default();
    assert!(
        refused.contains("path refused (outside_dataset)") && refused.contains("swapped.mp4"),
        "{refused}"
    );
    assert!(by_id[&2]["error"].as_str().unwrap_or_default().contains("outside_dataset"), "{}", by_id[&2]);

    // A rebuild re-probes the swapped file (its size and time did not change) and refuses it.
    build(d, &opts()).unwrap();
    assert_eq!(statuses(d)[&3], Status::OutsideDataset);
}

#[test]
fn ffmpeg_opens_only_the_supported_containers() {
    let data = tempfile::tempdir().unwrap();
    let d = data.path();
    let ffmpeg = |args: &[&str], out: &str| {
        let o = common::run(
            Command::new("ffmpeg")
                .args([
                    "-nostdin",
                    "-loglevel",
                    "error",
                    "-y",
                    "-f",
                    "lavfi",
                    "-i",
                    "testsrc2=size=160x120:rate=10",
                ])
                .args(["-t", "1"])
                .args(args)
                .arg(d.join(out)),
        );
        assert!(o.status.success(), "ffmpeg {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    ffmpeg(&["-c:v", "libx264"], "good.mp4");
    ffmpeg(&["-c:v", "mpeg4"], "clip.avi");
    ffmpeg(&["-c:v", "libx264", "-f", "mpegts"], "ts-named.mp4");
    // An HLS playlist: FFmpeg would open the URL it lists (here a closed local port).
    std::fs::write(
        d.join("playlist.mp4"),
        "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nhttp://127.0.0.1:9/x.ts\n#EXT-X-ENDLIST\n",
    )
    .unwrap();
    write_manifest(d, &[(1, "good.mp4"), (2, "clip.avi"), (3, "ts-named.mp4"), (4, "playlist.mp4")]);
    build(d, &opts()).unwrap();
    let s = statuses(d);
    assert_eq!(s[&1], Status::Ok);
    for id in [2, 3, 4] {
        assert_eq!(s[&id], Status::NotMedia, "sample {id}: not a supported container");
    }
}
