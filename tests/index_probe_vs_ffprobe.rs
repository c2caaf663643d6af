//! The probe's metadata agrees with the `ffprobe` CLI on every file of a generated dataset:
//! width, height, codec, frames within ±1, duration within 50 ms.

mod common;

use std::process::Command;

use datahelix::descriptor::{Modality, Status};
use datahelix::index::Index;

struct Probed {
    codec: String,
    width: u32,
    height: u32,
    frames: Option<u64>,
    duration: Option<f64>,
}

fn ffprobe(path: &std::path::Path) -> Probed {
    let o = common::run(
        Command::new("ffprobe")
            .args([
                "-v",
                "error",
                "-select_streams",
                "v:0",
                "-count_frames",
                "-show_entries",
                "stream=codec_name,width,height,nb_read_frames,duration:format=duration",
                "-of",
                "json",
            ])
            .arg(path),
    );
    assert!(o.status.success(), "ffprobe {} failed", path.display());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &v["streams"][0];
    let num = |x: &serde_json::Value| x.as_str().and_then(|t| t.parse::<f64>().ok());
    Probed {
        codec: s["codec_name"].as_str().unwrap_or_default().to_string(),
        width: s["width"].as_u64().unwrap_or(0) as u32,
        height: s["height"].as_u64().unwrap_or(0) as u32,
        frames: num(&s["nb_read_frames"]).map(|f| f as u64),
        duration: num(&s["duration"]).or_else(|| num(&v["format"]["duration"])),
    }
}

#[test]
fn every_file_matches_ffprobe() {
    let dir = common::tiny_dataset();
    let index = Index::open(&dir).expect("open index");
    assert_eq!(index.len(), 12);
    let mut videos = 0;
    for i in 0..index.len() {
        let d = index.get(i).unwrap();
        let path = dir.join(index.path(i).unwrap());
        assert_eq!(d.status, Status::Ok, "{} should probe ok", path.display());
        let p = ffprobe(&path);
        let what = format!("{} (id {})", path.display(), d.id);
        assert_eq!((d.width, d.height), (p.width, p.height), "size of {what}");
        let expected_codec = if p.codec == "mjpeg" { "jpeg" } else { p.codec.as_str() };
        assert_eq!(d.codec.name(), expected_codec, "codec of {what}");
        if d.modality == Modality::Video {
            videos += 1;
            let frames = p.frames.expect("ffprobe counted frames");
            assert!(
                (d.frames as i64 - frames as i64).abs() <= 1,
                "frames of {what}: {} vs ffprobe {frames}",
                d.frames
            );
            let dur = p.duration.expect("ffprobe duration");
            assert!(
                (d.duration_s() - dur).abs() <= 0.050,
                "duration of {what}: {} vs ffprobe {dur}",
                d.duration_s()
            );
            assert!(d.bit_rate > 0, "bit rate of {what}");
            assert!(d.fps() > 0.0, "fps of {what}");
        } else {
            assert_eq!(d.frames, 1);
        }
    }
    assert!(videos >= 6, "the tiny spec should hold several videos, got {videos}");
}

#[test]
fn mp4_keyframe_interval_is_read_from_the_header() {
    let dir = common::tiny_dataset();
    let index = Index::open(&dir).unwrap();
    // The tiny spec encodes its h264/mp4 clips with -g 24 and its mpeg4/mp4 clips with -g 15.
    let mut seen = 0;
    for i in 0..index.len() {
        let d = index.get(i).unwrap();
        if d.container.name() == "mp4" {
            let want = if d.codec.name() == "h264" { 24 } else { 15 };
            assert!(
                d.keyint <= want && d.keyint > 0,
                "{}: keyint {} (gop {want})",
                index.path(i).unwrap(),
                d.keyint
            );
            seen += 1;
        }
    }
    assert!(seen > 0);
}
