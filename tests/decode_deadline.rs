//! A decode has a deadline (issue 18, item 3): a sample whose decode runs past
//! `--decode-timeout` (`decode_timeout_s` in C and Python) fails with a reason naming it and the
//! deadline, and is listed, not lost; without a limit the same sample decodes. Without the
//! deadline a long video scanned from its start held its worker (and its rank) to the end.

mod common;

use std::process::Command;

/// A 30 s 320x240 H.264 video in Matroska, `long.mkv` in `d`.
fn long_video(d: &std::path::Path) {
    let args = "-nostdin -loglevel error -y -f lavfi -i testsrc2=size=320x240:rate=30 -t 30 \
                -c:v libx264 -preset ultrafast -g 300";
    let o = common::run(Command::new("ffmpeg").args(args.split_whitespace()).arg(d.join("long.mkv")));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// FFmpeg's own reading loops see the deadline too (its interrupt callback): past it, reading
/// the file stops with `AVERROR_EXIT` instead of going on to the end. Without the callback every
/// packet is read.
#[test]
fn ffmpeg_stops_reading_once_the_deadline_passed() {
    use datahelix::decode::ffmpeg::{Input, Packet};
    let dir = tempfile::tempdir().unwrap();
    long_video(dir.path());
    let count = |deadline: Option<std::time::Instant>| {
        let mut input = Input::open(&dir.path().join("long.mkv")).unwrap();
        if let Some(at) = deadline {
            input.set_deadline(at);
        }
        let mut packet = Packet::new().unwrap();
        let mut n = 0u64;
        loop {
            match input.read_packet(&mut packet) {
                Ok(true) => n += 1,
                Ok(false) => return Ok(n),
                Err(e) => return Err((n, e)),
            }
        }
    };
    let all = count(None).expect("without a deadline the whole file reads");
    assert!(all >= 900, "{all} packets");
    let (read, e) = count(Some(std::time::Instant::now())).expect_err("past its deadline FFmpeg must stop");
    assert!(read < all, "stopped after {read} of {all} packets");
    eprintln!("stopped after {read} of {all} packets: {e}");
}

#[test]
fn a_decode_past_its_deadline_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    long_video(d);
    std::fs::write(d.join("manifest.jsonl"), "{\"id\": 7, \"path\": \"long.mkv\", \"text_tokens\": 4}\n")
        .unwrap();
    let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("index").arg(d));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let decode = |timeout: &str| {
        let o = common::run(Command::new(env!("CARGO_BIN_EXE_datahelix")).arg("decode").arg(d).args([
            "--json",
            "--strategy",
            "scan",
            "--decode-timeout",
            timeout,
        ]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        doc["samples"][0].clone()
    };
    let late = decode("0.02");
    assert_eq!(late["id"], 7, "the refused sample stays listed: {late}");
    let e = late["error"].as_str().unwrap_or_default();
    assert!(e.contains("sample 7") && e.contains("deadline of 0.02 s"), "{late}");
    let whole = decode("0");
    assert!(whole["error"].is_null(), "without a limit it decodes: {whole}");
}
