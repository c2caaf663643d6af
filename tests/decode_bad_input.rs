//! Bad input becomes a per-sample error, never a crash or a hang: truncated files, corrupt
//! packets, zero-frame video, missing files, an unsupported pixel format.

mod decode_support;

use std::path::Path;

use datahelix::decode::{DecodeError, Decoder, Params, Strategy};
use decode_support::{ffmpeg, make_clip};

fn decode(path: &Path) -> Result<Vec<u8>, DecodeError> {
    let params = Params::default();
    let mut dec = Decoder::open(path)?;
    let mut buf = vec![0u8; dec.shape(&params)?.bytes()];
    dec.decode_into(&params, Strategy::Scan, &mut buf)?;
    Ok(buf)
}

fn truncated_copy(src: &Path, dst: &Path, keep: f64) {
    let bytes = std::fs::read(src).unwrap();
    std::fs::write(dst, &bytes[..(bytes.len() as f64 * keep) as usize]).unwrap();
}

#[test]
fn truncated_mid_stream_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases = [
        make_clip(&d.join("plain.mp4"), "320x240", 24, 4.0, &["-c:v", "libx264"]),
        make_clip(&d.join("fast.mp4"), "320x240", 24, 4.0, &["-c:v", "libx264", "-movflags", "+faststart"]),
        make_clip(&d.join("clip.mkv"), "320x240", 24, 4.0, &["-c:v", "libx264"]),
        make_clip(&d.join("m4.mkv"), "320x240", 24, 4.0, &["-c:v", "mpeg4"]),
    ];
    for src in &cases {
        for keep in [0.5, 0.8] {
            let dst = d.join(format!("cut{keep}_{}", src.file_name().unwrap().to_str().unwrap()));
            truncated_copy(src, &dst, keep);
            let r = decode(&dst);
            eprintln!("{}: {:?}", dst.display(), r.as_ref().map(|_| ()));
            assert!(r.is_err(), "{}: truncated file decoded without error", dst.display());
        }
    }
}

#[test]
fn corrupt_packets_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, args) in
        [("c.mp4", &["-c:v", "libx264", "-movflags", "+faststart"][..]), ("c.mkv", &["-c:v", "mpeg4"][..])]
    {
        let src = make_clip(&d.join(name), "320x240", 24, 3.0, args);
        let mut bytes = std::fs::read(&src).unwrap();
        let n = bytes.len();
        // Overwrite a run of bytes in the middle of the media data.
        for b in &mut bytes[n / 2..n / 2 + 4000] {
            *b = 0xff;
        }
        let dst = d.join(format!("bad_{name}"));
        std::fs::write(&dst, &bytes).unwrap();
        let r = decode(&dst);
        eprintln!("{}: {:?}", dst.display(), r.as_ref().map(|_| ()));
        assert!(r.is_err(), "{}: corrupt file decoded without error", dst.display());
    }
}

#[test]
fn zero_frame_video_and_missing_file_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // An MP4 with a video track and no samples: keep only the header by cutting every frame.
    let src = d.join("zero.mp4");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=64x64:rate=10:duration=1",
        "-c:v",
        "libx264",
        "-frames:v",
        "0",
        src.to_str().unwrap(),
    ]);
    let r = decode(&src);
    eprintln!("zero: {:?}", r.as_ref().map(|_| ()));
    assert!(r.is_err());
    let src = d.join("zero.mkv");
    ffmpeg(&[
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=64x64:rate=10:duration=1",
        "-c:v",
        "mpeg4",
        "-frames:v",
        "0",
        src.to_str().unwrap(),
    ]);
    let r = decode(&src);
    eprintln!("zero mkv: {:?}", r.as_ref().map(|_| ()));
    assert!(r.is_err());
    let r = decode(&d.join("nope.mp4"));
    eprintln!("missing: {:?}", r.as_ref().map(|_| ()));
    assert!(matches!(r, Err(DecodeError::Open(_))));
    std::fs::write(d.join("empty.mp4"), b"").unwrap();
    assert!(decode(&d.join("empty.mp4")).is_err());
    std::fs::write(d.join("text.mkv"), b"this is not a video at all").unwrap();
    assert!(decode(&d.join("text.mkv")).is_err());
}

mod common;

#[test]
fn cli_reports_changed_and_missing_files_per_sample_and_goes_on() {
    use common::{copy_dataset, datahelix, run, tiny_dataset};
    let copy = copy_dataset(&tiny_dataset());
    let dir = copy.path();
    assert!(run(datahelix().arg("index").arg(dir)).status.success());
    let mut files: Vec<_> =
        std::fs::read_dir(dir.join("videos")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    // One file grows after indexing, one disappears, one is cut in half (same size? no: a new
    // size is also a change), and one is overwritten in place with garbage of the same size.
    let mut grown = std::fs::read(&files[0]).unwrap();
    grown.extend_from_slice(b"appended");
    std::fs::write(&files[0], grown).unwrap();
    std::fs::remove_file(&files[1]).unwrap();
    let n = std::fs::metadata(&files[2]).unwrap().len() as usize;
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&files[2], vec![0x42u8; n]).unwrap();
    let out = run(datahelix().arg("decode").arg(dir).args(["--json", "--strict"]));
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let samples = doc["samples"].as_array().unwrap();
    let err_of = |f: &std::path::Path| {
        let name = f.file_name().unwrap().to_str().unwrap();
        let s = samples.iter().find(|s| s["path"].as_str().unwrap().ends_with(name)).unwrap();
        s["error"].as_str().map(str::to_owned)
    };
    let e0 = err_of(&files[0]).expect("grown file must fail");
    assert!(
        e0.contains("changed since indexing") && e0.contains(files[0].file_name().unwrap().to_str().unwrap()),
        "{e0}"
    );
    let e1 = err_of(&files[1]).expect("missing file must fail");
    assert!(e1.contains("missing"), "{e1}");
    let e2 = err_of(&files[2]).expect("rewritten file must fail");
    assert!(e2.contains("changed since indexing"), "{e2}");
    let ok = samples.iter().filter(|s| s["error"].is_null()).count();
    assert_eq!(ok, samples.len() - 3);
}
