//! A seeking decode of an MP4 with B-frames: FFmpeg's MP4 index holds decode times, the frames
//! asked for are presentation times, and a keyframe is shown two frames after it is decoded.
//! Until 2026-12-07 the decoder chose its keyframe in decode times, so a keyframe shown just
//! after a target passed for one before it, FFmpeg's seek (in presentation times) went back a
//! whole GOP — to the file's start on short clips — and seeking decoded up to 1.7× a scan's
//! frames (`docs/measured.md`, "Seek or scan"). Now a seek never decodes more than the scan.

mod decode_support;

use datahelix::decode::{Params, Strategy};
use decode_support::{decode_with as decode, make_clip};

#[test]
fn seeking_an_mp4_with_b_frames_decodes_no_more_than_a_scan() {
    let dir = tempfile::tempdir().unwrap();
    // 4 s at 24 fps, keyframes at 0 and 2 s only (no scene cuts), two B-frames: the keyframe at
    // 2 s is decoded at 1.917 s.
    let x264 = ["-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-g", "48", "-sc_threshold", "0"];
    let mp4 = make_clip(&dir.path().join("bframes.mp4"), "96x64", 24, 4.0, &x264);
    let mut seeks = 0;
    // Targets sit at (i + ½) × 4 s / F: frame counts that put one of them in the two frames
    // before the keyframe is shown (23/24, 25/26, 27/28, ... of 2 s), where the old choice
    // went back to the file's start, and others where a seek to it skips frames.
    for frames in 20..=32 {
        let params = Params { sample_fps: (8, 1), max_frames: frames, ..Params::default() };
        let scan = decode(&mp4, &params, Strategy::Scan);
        let seek = decode(&mp4, &params, Strategy::Seek);
        let case = format!("F = {frames}");
        assert!(seek.0 == scan.0, "{case}: seek and scan differ");
        assert_eq!(seek.1.timestamps_s, scan.1.timestamps_s, "{case}");
        assert!(
            seek.1.stats.frames_decoded <= scan.1.stats.frames_decoded,
            "{case}: the seeking decode read {} frames in {} seeks, the scan {}",
            seek.1.stats.frames_decoded,
            seek.1.stats.seeks,
            scan.1.stats.frames_decoded
        );
        seeks += seek.1.stats.seeks;
    }
    eprintln!("{seeks} seeks over the frame counts");
    assert!(seeks >= 1, "no seek at all: the test no longer exercises seeking");
}
