//! Shared helpers of the decode tests: media made with the `ffmpeg` CLI, and an independent
//! reference decode (the `ffmpeg`/`ffprobe` CLIs plus the protocol's frame choice, written out
//! again here from PROTOCOL.md rather than reusing the library's code).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the ffmpeg CLI quietly; panics with its stderr when it fails.
pub fn ffmpeg(args: &[&str]) {
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin", "-y"])
        .args(args)
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success(), "ffmpeg {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test clip from lavfi's `testsrc2` (moving, coloured), encoded by `codec_args` into `out`.
pub fn make_clip(out: &Path, size: &str, rate: u32, seconds: f64, codec_args: &[&str]) -> PathBuf {
    let src = format!("testsrc2=size={size}:rate={rate}:duration={seconds}");
    let mut args = vec!["-f", "lavfi", "-i", &src];
    args.extend_from_slice(codec_args);
    let o = out.to_str().unwrap();
    args.push(o);
    ffmpeg(&args);
    out.to_path_buf()
}

/// Decodes the whole sample at `path` with the library's decoder: the tensor and what it took.
pub fn decode_with(
    path: &Path,
    params: &datahelix::decode::Params,
    strategy: datahelix::decode::Strategy,
) -> (Vec<u8>, datahelix::decode::Decoded) {
    let mut dec =
        datahelix::decode::Decoder::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = vec![0u8; dec.shape(params).unwrap().bytes()];
    let got =
        dec.decode_into(params, strategy, &mut buf).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (buf, got)
}

/// The index's descriptor of a media file (what the planner prices and splits by), probed as
/// `datahelix index` does; panics unless it is usable.
pub fn probed(path: &Path) -> datahelix::descriptor::Descriptor {
    let entry = datahelix::manifest::Entry {
        id: 0,
        path: path.file_name().unwrap().to_str().unwrap().into(),
        text_tokens: 0,
        line: 1,
        extra: None,
    };
    let d = datahelix::probe::probe(path.parent().unwrap(), &entry);
    assert_eq!(d.status, datahelix::descriptor::Status::Ok, "{}: {d:?}", path.display());
    d
}

/// A still image from `testsrc2`.
pub fn make_image(out: &Path, size: &str, extra: &[&str]) -> PathBuf {
    let src = format!("testsrc2=size={size}");
    let mut args = vec!["-f", "lavfi", "-i", &src, "-frames:v", "1"];
    args.extend_from_slice(extra);
    args.push(out.to_str().unwrap());
    ffmpeg(&args);
    out.to_path_buf()
}

/// A small varied set of files: H.264 in MP4 (short and long GOP, B-frames, odd and large sizes),
/// MPEG-4 Part 2 in MKV (with B-frames), HEVC in MP4 (B-frames, open GOP: x265's default), VP9
/// in WebM, AV1 in MKV, JPEG and PNG.
pub fn media_set(dir: &Path) -> Vec<PathBuf> {
    vec![
        make_clip(&dir.join("h264_320x240.mp4"), "320x240", 24, 3.0, &["-c:v", "libx264", "-g", "48"]),
        make_clip(
            &dir.join("h264_530_gop5.mp4"),
            "530x530",
            25,
            2.2,
            &["-c:v", "libx264", "-g", "5", "-bf", "3"],
        ),
        make_clip(
            &dir.join("h264_1280x720.mp4"),
            "1280x720",
            30,
            1.5,
            &["-c:v", "libx264", "-preset", "ultrafast"],
        ),
        make_clip(&dir.join("mpeg4_530.mkv"), "530x530", 25, 2.0, &["-c:v", "mpeg4", "-bf", "2", "-g", "12"]),
        make_clip(&dir.join("mpeg4_176x144.mkv"), "176x144", 15, 4.4, &["-c:v", "mpeg4"]),
        make_clip(&dir.join("h264_odd.mkv"), "211x157", 10, 0.4, &["-c:v", "libx264", "-pix_fmt", "yuv444p"]),
        make_clip(
            &dir.join("hevc_530x298.mp4"),
            "530x298",
            25,
            2.0,
            &[
                "-c:v",
                "libx265",
                "-preset",
                "veryfast",
                "-x265-params",
                "log-level=error:keyint=12:bframes=3",
                "-tag:v",
                "hvc1",
            ],
        ),
        make_clip(
            &dir.join("vp9_320x240.webm"),
            "320x240",
            24,
            2.0,
            &[
                "-c:v",
                "libvpx-vp9",
                "-deadline",
                "realtime",
                "-cpu-used",
                "8",
                "-g",
                "10",
                "-b:v",
                "0",
                "-crf",
                "36",
            ],
        ),
        make_clip(
            &dir.join("av1_352x288.mkv"),
            "352x288",
            25,
            2.0,
            &["-c:v", "libsvtav1", "-preset", "12", "-g", "16"],
        ),
        make_image(&dir.join("img_641x479.jpg"), "641x479", &[]),
        make_image(&dir.join("img_333x222.png"), "333x222", &["-pix_fmt", "rgba"]),
        make_image(&dir.join("img_20x10.png"), "20x10", &[]),
    ]
}

/// The reference decode of one file.
#[derive(Debug)]
pub struct Reference {
    /// `[F, H', W', 3]`.
    pub shape: [usize; 4],
    /// Chosen frame indices (in decode output order).
    pub chosen: Vec<usize>,
    /// Chosen frame times, seconds.
    pub timestamps_s: Vec<f64>,
    /// Packed RGB24 tensor.
    pub pixels: Vec<u8>,
}

fn probe(path: &Path, args: &[&str]) -> String {
    let out = Command::new("ffprobe")
        .args(["-v", "error", "-select_streams", "v:0"])
        .args(args)
        .arg(path)
        .output()
        .expect("run ffprobe");
    assert!(out.status.success(), "ffprobe: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn isqrt(n: u128) -> u128 {
    let mut x = (n as f64).sqrt() as u128;
    while x * x > n {
        x -= 1;
    }
    while (x + 1) * (x + 1) <= n {
        x += 1;
    }
    x
}

fn side(a: u128, b: u128, max: u128) -> u128 {
    let s = if a * b <= max { a / 28 * 28 } else { isqrt(a * max / (784 * b)) * 28 };
    s.max(28)
}

fn micros(s: &str) -> Option<i128> {
    // "12.345678" → 12345678, exactly.
    let s = s.trim();
    let (i, f) = s.split_once('.').unwrap_or((s, ""));
    let f = format!("{f:0<6}");
    Some(i.parse::<i128>().ok()? * 1_000_000 + f[..6].parse::<i128>().ok()?)
}

/// Decodes `path` the protocol's way with the ffmpeg CLI (defaults: 2 fps, ≤ 16 frames,
/// ≤ 200704 pixels).
pub fn reference(path: &Path) -> Reference {
    let info = probe(
        path,
        &[
            "-show_entries",
            "stream=width,height,time_base,start_pts,duration_ts:format=duration,format_name",
            "-of",
            "default=nw=0",
        ],
    );
    let get = |k: &str| info.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).map(str::to_owned);
    let (w, h) =
        (get("width").unwrap().parse::<u128>().unwrap(), get("height").unwrap().parse::<u128>().unwrap());
    let (oh, ow) = (side(h, w, 200_704), side(w, h, 200_704));
    let format = get("format_name").unwrap();
    let image = format == "image2" || format.ends_with("_pipe");
    let tb = get("time_base").unwrap_or_default();
    let (tbn, tbd) = tb
        .split_once('/')
        .map(|(a, b)| (a.parse::<i128>().unwrap_or(1), b.parse::<i128>().unwrap_or(1)))
        .unwrap_or((1, 1));
    let start: i128 = get("start_pts").and_then(|s| s.parse().ok()).unwrap_or(0);
    let (dn, dd) = match get("duration_ts").and_then(|s| s.parse::<i128>().ok()).filter(|&d| d > 0) {
        Some(d) => (d * tbn, tbd),
        None => (get("duration").and_then(|d| micros(&d)).unwrap_or(0), 1_000_000),
    };
    let pts: Vec<Option<i128>> = probe(path, &["-show_entries", "frame=pts", "-of", "csv=p=0"])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().trim_end_matches(',').parse().ok())
        .collect();
    let scale = format!("scale={ow}:{oh}:flags=bilinear");
    let out = Command::new("ffmpeg")
        .args(["-v", "error", "-nostdin", "-threads", "1", "-i"])
        .arg(path)
        .args([
            "-map",
            "0:v:0",
            "-vf",
            &scale,
            "-pix_fmt",
            "rgb24",
            "-fps_mode",
            "passthrough",
            "-f",
            "rawvideo",
            "-",
        ])
        .output()
        .expect("run ffmpeg");
    assert!(out.status.success(), "ffmpeg: {}", String::from_utf8_lossy(&out.stderr));
    let fb = (oh * ow * 3) as usize;
    assert_eq!(out.stdout.len(), fb * pts.len(), "{}: ffmpeg frames vs ffprobe frames", path.display());
    let f: u128 = if image { 1 } else { ((dn * 2 / dd) as u128).clamp(1, 16) };
    let mut chosen = Vec::new();
    let mut times = Vec::new();
    let time = |p: i128| ((p - start) * tbn, tbd);
    let mut k = 0usize;
    for i in 0..f as i128 {
        // t_i = (2i+1)·d / (2F) = (2i+1)·dn / (2F·dd)
        let (tn, td) = ((2 * i + 1) * dn, 2 * f as i128 * dd);
        loop {
            if image {
                break;
            }
            if k >= pts.len() {
                break;
            }
            let (xn, xd) = time(pts[k].expect("frame without pts"));
            if xn * td >= tn * xd {
                break;
            }
            k += 1;
        }
        let idx = k.min(pts.len() - 1);
        chosen.push(idx);
        times.push(if image {
            0.0
        } else {
            let (xn, xd) = time(pts[idx].unwrap());
            xn as f64 / xd as f64
        });
    }
    let mut pixels = Vec::with_capacity(fb * chosen.len());
    for &c in &chosen {
        pixels.extend_from_slice(&out.stdout[c * fb..(c + 1) * fb]);
    }
    Reference { shape: [f as usize, oh as usize, ow as usize, 3], chosen, timestamps_s: times, pixels }
}

/// Mean absolute difference of two equal-length byte slices.
pub fn mean_abs_diff(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    let s: u64 = a.iter().zip(b).map(|(&x, &y)| (x as i16 - y as i16).unsigned_abs() as u64).sum();
    s as f64 / a.len().max(1) as f64
}

/// Runs `decode` (a `datahelix decode DIR` command) with `--json --workers 2 --dump` and checks
/// every sample against [`reference`]: no error, the same shape, frame times (to within an ulp of
/// JSON's round trip) and bytes. Returns the samples checked.
pub fn assert_decode_matches_reference(dir: &Path, decode: &mut Command) -> usize {
    let dump = tempfile::tempdir().unwrap();
    let out =
        decode.args(["--json", "--workers", "2", "--dump"]).arg(dump.path()).output().expect("run decode");
    assert!(out.status.success(), "decode: {}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document on stdout");
    let samples = doc["samples"].as_array().unwrap();
    for s in samples {
        assert!(s["error"].is_null(), "{s}");
        let id = s["id"].as_u64().unwrap();
        let path = dir.join(s["path"].as_str().unwrap());
        let want = reference(&path);
        let shape: Vec<usize> =
            s["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(shape, want.shape, "{id} {}: shape", path.display());
        let ts: Vec<f64> =
            s["timestamps_s"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!(ts.len(), want.timestamps_s.len(), "{id} {}", path.display());
        for (a, b) in ts.iter().zip(&want.timestamps_s) {
            let (p, w) = (path.display(), &want.timestamps_s);
            assert!((a - b).abs() < 1e-9, "{id} {p}: frame choice {ts:?} vs {w:?}");
        }
        let got = std::fs::read(dump.path().join(format!("{id}.rgb"))).unwrap();
        let mad = mean_abs_diff(&got, &want.pixels);
        assert!(got == want.pixels, "{id} {}: not byte-identical (mad {mad})", path.display());
        assert_eq!(s["sha256"].as_str().map(str::len), Some(64), "{s}");
    }
    samples.len()
}
