//! The decode pool's byte budget bounds the process's real peak memory (issue 18, item 3):
//! FFmpeg's own pictures and packets count in it beside the output tensors, so huge inputs are
//! refused with a reason when they cannot fit and decoded one at a time when only one fits.
//! Measured with `datahelix decode --json`'s `peak_rss_mib` (the process's `ru_maxrss`).
//!
//! Before FFmpeg's memory counted, two workers decoded the 8K PNG and the 64 MiB JPEG below at
//! once under a 320 MiB budget (peak 491 MB), and a 64 MiB budget refused neither.

mod common;

use std::path::Path;
use std::process::Command;

/// Writes `name` in `dir` with the FFmpeg CLI from `args` (input options and filters).
fn ffmpeg(dir: &Path, args: &str, name: &str) {
    let o = common::run(
        Command::new("ffmpeg")
            .args("-nostdin -loglevel error -y".split(' '))
            .args(args.split_whitespace())
            .arg(dir.join(name)),
    );
    assert!(o.status.success(), "ffmpeg {args}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A valid 16384x16384 RGB PNG, streamed through zlib by Python's standard library (FFmpeg
/// refuses to make pictures that large, which is the point).
fn png_16k(path: &Path) {
    let script = r#"
import struct, sys, zlib
w = h = 16384
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
with open(sys.argv[1], "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
    z = zlib.compressobj(1)
    row = b"\x00" + bytes(range(256)) * (w * 3 // 256)
    data = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    f.write(chunk(b"IDAT", data) + chunk(b"IEND", b""))
"#;
    let o = common::run(Command::new("python3").arg("-c").arg(script).arg(path));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The huge inputs of issue 18 plus a 1080p H.264 clip, indexed: ids 1 (8192x8192 PNG),
/// 2 (6400x6400 noise JPEG of ~65 MiB), 3 (16384x16384 PNG), 4 (1080p MKV).
fn huge_dataset(d: &Path) {
    ffmpeg(d, "-f lavfi -i testsrc2=size=8192x8192 -frames:v 1 -compression_level 1", "big8k.png");
    // Noise of a fixed seed, at the JPEG quality that keeps it near 64 MiB.
    ffmpeg(
        d,
        "-f lavfi -i nullsrc=size=6400x6400,format=gray,noise=alls=100:all_seed=7,format=rgb24 -frames:v 1 \
         -q:v 1 -pix_fmt yuvj444p",
        "noise64.jpg",
    );
    png_16k(&d.join("side16k.png"));
    ffmpeg(d, "-f lavfi -i testsrc2=size=1920x1080:rate=30 -t 2 -c:v libx264 -preset ultrafast", "hd.mkv");
    let manifest = ["big8k.png", "noise64.jpg", "side16k.png", "hd.mkv"]
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{{\"id\": {}, \"path\": \"{p}\", \"text_tokens\": 4}}\n", i + 1))
        .collect::<String>();
    std::fs::write(d.join("manifest.jsonl"), manifest).unwrap();
    let o = common::run(common::datahelix().arg("index").arg(d));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `datahelix decode DIR --json` with `args`: the document.
fn decode(d: &Path, args: &[&str]) -> serde_json::Value {
    let o = common::run(common::datahelix().arg("decode").arg(d).arg("--json").args(args));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn error_of(doc: &serde_json::Value, id: u64) -> Option<String> {
    let s = doc["samples"].as_array().unwrap().iter().find(|s| s["id"] == id);
    let s = s.unwrap_or_else(|| panic!("sample {id} is not listed: {doc}"));
    s["error"].as_str().map(str::to_string)
}

#[test]
fn the_budget_bounds_peak_memory_with_ffmpeg_included() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    huge_dataset(d);
    let jpeg = std::fs::metadata(d.join("noise64.jpg")).unwrap().len();
    assert!(jpeg > 63 << 20, "the JPEG is {jpeg} bytes");

    // The process's own footprint: the small clip alone.
    let alone = decode(d, &["--ids", "4", "--budget-mib", "320"]);
    assert_eq!(error_of(&alone, 4), None);
    let own = alone["peak_rss_mib"].as_f64().unwrap();

    // 64 MiB: every huge picture is refused, unread, with the budget named; all stay listed.
    let small = decode(d, &["--budget-mib", "64", "--workers", "2"]);
    for id in [1, 2] {
        let e = error_of(&small, id).unwrap_or_else(|| panic!("sample {id} decoded under 64 MiB"));
        assert!(e.contains("FFmpeg pictures") && e.contains("budget of 64 MiB"), "{e}");
    }
    let e = error_of(&small, 3).expect("the 16K PNG cannot decode");
    assert!(e.contains("bad_dimensions") || e.contains("16384"), "{e}");
    let peak = small["peak_rss_mib"].as_f64().unwrap();
    eprintln!("budget 64 MiB: peak {peak:.0} MiB (own footprint {own:.0} MiB)");
    assert!(peak < 400.0, "a 16K PNG under a 64 MiB budget peaked at {peak:.0} MiB");
    assert!(peak < own + 64.0, "peak {peak:.0} MiB over the budget and the {own:.0} MiB footprint");

    // 320 MiB, two workers: each huge picture fits alone, not two at once; the peak stays
    // within the budget above the process's own footprint.
    let mid = decode(d, &["--budget-mib", "320", "--workers", "2"]);
    for id in [1, 2, 4] {
        assert_eq!(error_of(&mid, id), None, "sample {id}");
    }
    let peak = mid["peak_rss_mib"].as_f64().unwrap();
    eprintln!("budget 320 MiB, 2 workers: peak {peak:.0} MiB (own footprint {own:.0} MiB)");
    assert!(peak < own + 320.0, "peak {peak:.0} MiB over the 320 MiB budget and the {own:.0} MiB footprint");
}

/// A one-hour video with a single keyframe: every sampled frame is a scan from the start (7,200
/// pictures decoded), and none of it may accumulate: the peak stays within the budget above the
/// process's own footprint, and the frames delivered span the hour.
#[test]
fn an_hour_long_mkv_with_one_keyframe_is_scanned_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let one_gop = "-c:v libx264 -preset ultrafast -g 100000 -keyint_min 100000 -sc_threshold 0";
    ffmpeg(d, &format!("-f lavfi -i testsrc2=size=320x240:rate=2 -t 3600 {one_gop}"), "hour.mkv");
    ffmpeg(d, &format!("-f lavfi -i testsrc2=size=320x240:rate=2 -t 2 {one_gop}"), "short.mkv");
    let manifest = "{\"id\": 1, \"path\": \"hour.mkv\", \"text_tokens\": 4}\n\
                    {\"id\": 2, \"path\": \"short.mkv\", \"text_tokens\": 4}\n";
    std::fs::write(d.join("manifest.jsonl"), manifest).unwrap();
    let o = common::run(common::datahelix().arg("index").arg(d));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let own = decode(d, &["--ids", "2", "--budget-mib", "64"])["peak_rss_mib"].as_f64().unwrap();
    let doc = decode(d, &["--ids", "1", "--budget-mib", "64"]);
    assert_eq!(error_of(&doc, 1), None);
    let s = &doc["samples"][0];
    let times: Vec<f64> = s["timestamps_s"].as_array().unwrap().iter().map(|t| t.as_f64().unwrap()).collect();
    assert!(times.len() > 1 && times[0] < 600.0 && *times.last().unwrap() > 3000.0, "{times:?}");
    let peak = doc["peak_rss_mib"].as_f64().unwrap();
    eprintln!("one-hour MKV, one keyframe, budget 64 MiB: peak {peak:.0} MiB (own footprint {own:.0} MiB)");
    assert!(peak < own + 64.0, "peak {peak:.0} MiB over the 64 MiB budget and the {own:.0} MiB footprint");
}

#[test]
fn a_picture_larger_than_ffmpeg_may_allocate_is_refused_by_ffmpeg_itself() {
    // Without an index (no descriptor), FFmpeg's own max_pixels stops the picture.
    use datahelix::decode::{Decoder, Params, Strategy};
    let dir = tempfile::tempdir().unwrap();
    ffmpeg(dir.path(), "-f lavfi -i testsrc2=size=2048x2048 -frames:v 1", "big.png");
    let path = dir.path().join("big.png");
    let mut dec =
        Decoder::open_within(&path, Some(1 << 20)).expect("opens; the probe leaves the size unknown");
    let shape = dec.shape(&Params::default());
    let refused = shape.is_err() || {
        let mut out = vec![0u8; shape.unwrap().bytes()];
        dec.decode_into(&Params::default(), Strategy::Scan, &mut out).is_err()
    };
    assert!(refused, "a 4-Mpixel picture decoded under a 1-Mpixel limit");
    let mut dec = Decoder::open_within(&path, Some(8 << 20)).unwrap();
    let mut out = vec![0u8; dec.shape(&Params::default()).unwrap().bytes()];
    dec.decode_into(&Params::default(), Strategy::Scan, &mut out).expect("within the limit it decodes");
}
