//! Matroska (MKV, WebM) lists its keyframes in cues that FFmpeg reads only at the first seek.
//! Until 2026-12-06 nothing here sought before probing or before a seeking decode's first frame,
//! so a Matroska sample's keyframe interval was unknown (0: never sought in, never split) and a
//! seeking decode scanned every frame (`docs/measured.md`, "Matroska's cues"). Now the probe
//! reads the cues, and so does a seeking decode before its first frame: the same bytes as a scan,
//! a fraction of the frames. A file without cues has its packets read by the probe (demuxed, not
//! decoded) for its keyframes.

mod decode_support;

use std::path::{Path, PathBuf};

use datahelix::decode::{Decoded, Params, Strategy};
use decode_support::{decode_with, make_clip, probed};

/// Decodes the whole sample with `strategy` at the protocol's defaults.
fn decode(path: &Path, strategy: Strategy) -> (Vec<u8>, Decoded) {
    decode_with(path, &Params::default(), strategy)
}

/// `path` with its cues hidden: every Cues element ID (in the seek head and the element itself)
/// renamed to one no demuxer knows, as a file written without cues (live, to a pipe) reads.
fn without_cues(path: &Path) -> PathBuf {
    const CUES: [u8; 4] = [0x1C, 0x53, 0xBB, 0x6B];
    let mut bytes = std::fs::read(path).unwrap();
    let mut hidden = 0;
    for i in 0..bytes.len().saturating_sub(3) {
        if bytes[i..i + 4] == CUES {
            bytes[i + 3] = 0x6C;
            hidden += 1;
        }
    }
    assert!(hidden >= 1, "{}: no Cues element to hide", path.display());
    let out = path.with_file_name(format!("nocues_{}", path.file_name().unwrap().to_str().unwrap()));
    std::fs::write(&out, bytes).unwrap();
    out
}

#[test]
fn the_probe_reads_the_keyframe_interval_from_matroska_cues() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let h264 = ["-c:v", "libx264", "-preset", "ultrafast"];
    let files = [
        (make_clip(&d.join("h264_g20.mkv"), "96x64", 25, 6.0, &[&h264[..], &["-g", "20"]].concat()), 20),
        (make_clip(&d.join("mpeg4_g15.mkv"), "96x64", 30, 4.0, &["-c:v", "mpeg4", "-g", "15"]), 15),
        (
            make_clip(
                &d.join("vp9_g30.webm"),
                "96x64",
                30,
                4.0,
                &["-c:v", "libvpx-vp9", "-g", "30", "-speed", "8"],
            ),
            30,
        ),
        // One keyframe: the interval is the stream (150 frames), not unknown.
        (
            make_clip(&d.join("h264_one_gop.mkv"), "96x64", 25, 6.0, &[&h264[..], &["-g", "1000"]].concat()),
            150,
        ),
        // B-frames put MP4's decode times two frames before the first picture: the single GOP
        // read 152 frames long before.
        (
            make_clip(&d.join("h264_one_gop_bf.mp4"), "96x64", 25, 6.0, &["-c:v", "libx264", "-g", "1000"]),
            150,
        ),
    ];
    for (path, gop) in &files {
        let got = probed(path);
        assert_eq!(got.keyint, *gop, "{}: {got:?}", path.display());
    }
    // Without cues the index holds only the keyframes read while the seek settles; the probe
    // reads the packets that follow (demuxed, not decoded) for the others.
    for (path, gop) in &files[..3] {
        let hidden = without_cues(path);
        let got = probed(&hidden);
        assert_eq!(got.keyint, *gop, "{}: {got:?}", hidden.display());
    }
}

#[test]
fn a_seeking_decode_of_matroska_seeks_and_gives_the_scans_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // 60 s at 25 fps, a keyframe a second: 16 targets ~3.75 s apart, so a seek skips ~3 GOPs.
    let mkv = make_clip(
        &dir.path().join("minute.mkv"),
        "96x64",
        25,
        60.0,
        &["-c:v", "libx264", "-preset", "ultrafast", "-g", "25"],
    );
    for path in [mkv.clone(), without_cues(&mkv)] {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let scan = decode(&path, Strategy::Scan);
        let seek = decode(&path, Strategy::Seek);
        assert!(seek.0 == scan.0, "{name}: seek and scan differ");
        assert_eq!(seek.1.timestamps_s, scan.1.timestamps_s, "{name}");
        eprintln!(
            "{name}: scan decoded {} frames, seek {} in {} seeks",
            scan.1.stats.frames_decoded, seek.1.stats.frames_decoded, seek.1.stats.seeks
        );
        assert_eq!(scan.1.stats.seeks, 0, "{name}");
        assert!(seek.1.stats.seeks >= 15, "{name}: {:?}", seek.1.stats);
        assert!(
            seek.1.stats.frames_decoded * 2 < scan.1.stats.frames_decoded,
            "{name}: seek decoded {} frames, scan {}",
            seek.1.stats.frames_decoded,
            scan.1.stats.frames_decoded
        );
        // The probe's interval leads `auto` to the seek.
        let d = probed(&path);
        assert_eq!(
            Strategy::for_range(&d, &Params::default(), datahelix::decode::split::FrameRange::whole(16)),
            Strategy::Seek,
            "{name}: {d:?}"
        );
    }
}
