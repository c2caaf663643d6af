//! One sample decoded in pieces (ranges of its target frames, each seeking to the keyframe before
//! its first target) gives, concatenated in order, exactly the bytes and timestamps of the whole
//! decode: at every split point, for the ranges `split_targets` predicts, through the pool, by
//! scan and by seek; a later piece really seeks and decodes fewer frames than the whole.

mod decode_support;

use std::path::{Path, PathBuf};

use datahelix::decode::pool::{Failure, Job, Output, Pool, PoolConfig};
use datahelix::decode::split::{split_targets, FrameRange};
use datahelix::decode::{DecodeError, Decoded, Decoder, Params, Strategy};
use datahelix::descriptor::Descriptor;
use decode_support::{make_clip, make_image, probed};

/// Short clips with a keyframe every 12 frames, and one at 3 fps with a keyframe every 4: its last
/// target falls past the stream's last frame (it takes the last decoded frame) and, at 6 targets a
/// second, targets share frames.
fn clips(dir: &Path) -> Vec<PathBuf> {
    clips_and_gops(dir).into_iter().map(|c| c.0).collect()
}

/// The clips with the keyframe interval they were encoded with.
fn clips_and_gops(dir: &Path) -> Vec<(PathBuf, u32)> {
    vec![
        (make_clip(&dir.join("h264_g12.mp4"), "192x144", 24, 4.0, &["-c:v", "libx264", "-g", "12"]), 12),
        (make_clip(&dir.join("h264_g12.mkv"), "192x144", 25, 4.0, &["-c:v", "libx264", "-g", "12"]), 12),
        (make_clip(&dir.join("mpeg4_g12.mkv"), "192x144", 30, 4.0, &["-c:v", "mpeg4", "-g", "12"]), 12),
        (make_clip(&dir.join("h264_3fps.mp4"), "192x144", 3, 4.0, &["-c:v", "libx264", "-g", "4"]), 4),
    ]
}

fn decode(path: &Path, params: &Params, strategy: Strategy, range: Option<FrameRange>) -> (Vec<u8>, Decoded) {
    let mut dec = Decoder::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let shape = dec.shape(params).unwrap();
    let range = range.unwrap_or(FrameRange::whole(shape.frames));
    let mut buf = vec![0u8; range.len() as usize * shape.frame_bytes()];
    let got = dec
        .decode_range_into(params, strategy, range, &mut buf)
        .unwrap_or_else(|e| panic!("{} {range:?} {strategy:?}: {e}", path.display()));
    assert_eq!(got.shape.frames, range.len());
    assert_eq!(got.timestamps_s.len(), range.len() as usize);
    (buf, got)
}

/// Decodes `ranges` one by one (each on a fresh decoder, as on another rank) and checks their
/// concatenation against the whole decode.
fn check_pieces(
    path: &Path,
    params: &Params,
    strategy: Strategy,
    ranges: &[FrameRange],
    whole: &(Vec<u8>, Decoded),
) -> Vec<Decoded> {
    let (mut bytes, mut times, mut stats) = (Vec::new(), Vec::new(), Vec::new());
    for &r in ranges {
        let (b, d) = decode(path, params, strategy, Some(r));
        bytes.extend_from_slice(&b);
        times.extend_from_slice(&d.timestamps_s);
        stats.push(d);
    }
    let name = path.file_name().unwrap().to_string_lossy();
    assert_eq!(times, whole.1.timestamps_s, "{name} {strategy:?} {ranges:?}: timestamps");
    if bytes != whole.0 {
        let fb = whole.1.shape.frame_bytes();
        let bad: Vec<usize> = (0..whole.1.shape.frames as usize)
            .filter(|&k| bytes[k * fb..(k + 1) * fb] != whole.0[k * fb..(k + 1) * fb])
            .collect();
        panic!("{name} {strategy:?} {ranges:?}: frames {bad:?} differ from the whole decode");
    }
    stats
}

fn dense() -> Params {
    // 6 targets a second: several targets per group of pictures, so most split points fall
    // inside one (the later piece seeks back into frames the earlier one decoded).
    Params { sample_fps: (6, 1), max_frames: 32, ..Params::default() }
}

#[test]
fn pieces_at_every_split_point_concatenate_to_the_whole_decode() {
    let dir = tempfile::tempdir().unwrap();
    for path in clips(dir.path()) {
        for params in [Params::default(), dense()] {
            let whole = decode(&path, &params, Strategy::Scan, None);
            let f = whole.1.shape.frames;
            assert!(f >= 2, "{}: {f} targets", path.display());
            let seek = decode(&path, &params, Strategy::Seek, None);
            assert!(seek.0 == whole.0, "{}: seek and scan differ", path.display());
            assert_eq!(seek.1.timestamps_s, whole.1.timestamps_s);
            for strategy in [Strategy::Scan, Strategy::Seek] {
                for a in 1..f {
                    let ranges = [FrameRange { start: 0, end: a }, FrameRange { start: a, end: f }];
                    let pieces = check_pieces(&path, &params, strategy, &ranges, &whole);
                    assert!(pieces[1].stats.seeks >= 1, "{} [{a}, {f}) did not seek", path.display());
                }
                // Every target alone.
                let singles: Vec<_> = (0..f).map(|i| FrameRange { start: i, end: i + 1 }).collect();
                check_pieces(&path, &params, strategy, &singles, &whole);
            }
            eprintln!("{}: {f} targets, every split point matches", path.display());
        }
    }
}

#[test]
fn predicted_splits_match_the_whole_and_later_pieces_decode_less() {
    let dir = tempfile::tempdir().unwrap();
    for (path, gop) in clips_and_gops(dir.path()) {
        let from_index = probed(&path);
        // MP4's sample table and Matroska's cues (read at a seek: `tests/matroska_cues.rs`).
        assert_eq!(from_index.keyint, gop, "{}", path.display());
        // An index may overstate the interval (a Matroska file without cues: what was read
        // before the first keyframe after its start), which costs only decode time; with the
        // real one the pieces must not overlap at all.
        for d in [from_index, Descriptor { keyint: gop * 3 / 2, ..from_index }] {
            for params in [Params::default(), dense()] {
                check_predicted_split(&path, &d, &params, d.keyint == gop);
            }
        }
    }
}

fn check_predicted_split(path: &Path, d: &Descriptor, params: &Params, exact_keyint: bool) {
    let name = path.file_name().unwrap().to_string_lossy();
    let scan = decode(path, params, Strategy::Scan, None);
    let f = scan.1.shape.frames;
    for parts in 2..=4 {
        let ranges = split_targets(d, params, parts);
        // Targets less than a frame apart leave no keyframe between neighbours to cut at.
        let (sn, sd) = params.sample_fps;
        if d.fps() * sd as f64 > 2.0 * sn as f64 {
            assert!(ranges.len() >= 2, "{name}: keyint {} gave no split", d.keyint);
        }
        assert!(ranges.len() <= parts as usize);
        assert_eq!((ranges[0].start, ranges[ranges.len() - 1].end), (0, f));
        for strategy in [Strategy::Scan, Strategy::Seek] {
            let whole = decode(path, params, strategy, None);
            let pieces = check_pieces(path, params, strategy, &ranges, &scan);
            let per_piece: Vec<u64> = pieces.iter().map(|p| p.stats.frames_decoded).collect();
            eprintln!(
                "{name} F={f} keyint={} parts={parts} {strategy:?}: {ranges:?} frames decoded: whole {} \
                 pieces {per_piece:?}",
                d.keyint, whole.1.stats.frames_decoded,
            );
            // The later pieces seek (to the keyframe before their first target) and decode less
            // than the whole.
            for p in &pieces[1..] {
                assert!(p.stats.seeks >= 1);
                assert!(
                    p.stats.frames_decoded < whole.1.stats.frames_decoded,
                    "{name}: a later piece decoded {} frames, the whole {}",
                    p.stats.frames_decoded,
                    whole.1.stats.frames_decoded
                );
            }
            // Together they decode no more than the whole scan, but for a keyframe two pieces
            // may share (the one a piece seeks to, when it is the previous target's frame).
            // Seeking within a piece may step back a frame; an overstated interval may start a
            // piece up to a GOP early.
            let slack = match (exact_keyint, strategy) {
                (true, Strategy::Scan) => 1,
                (true, _) => 2,
                (false, _) => 1 + d.keyint as u64,
            };
            let sum: u64 = per_piece.iter().sum();
            assert!(
                sum <= whole.1.stats.frames_decoded + pieces.len() as u64 * slack,
                "{name} {strategy:?} keyint {}: pieces decoded {per_piece:?}, the whole {}",
                d.keyint,
                whole.1.stats.frames_decoded
            );
        }
    }
}

#[test]
fn the_pool_decodes_a_jobs_range_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = &clips(dir.path())[0];
    let d = probed(path);
    let params = Params::default();
    let whole = decode(path, &params, Strategy::Scan, None);
    let ranges = split_targets(&d, &params, 3);
    assert!(ranges.len() >= 2, "{ranges:?}");
    let pool = Pool::new(PoolConfig { workers: 2, params, ..PoolConfig::default() });
    for (k, &r) in ranges.iter().enumerate() {
        pool.submit(Job { descriptor: Some(d), frames: Some(r), ..Job::sampled(k as u64, path.clone(), 0) });
    }
    let mut got: Vec<(u64, Vec<u8>, Vec<f64>)> = Vec::new();
    while let Some(o) = pool.recv() {
        let Ok(Output::Sampled { tensor, decoded }) = o.result else { panic!("{:?}", o.result.err()) };
        assert_eq!(decoded.shape.frames, ranges[o.id as usize].len());
        assert_eq!(tensor.len(), decoded.shape.bytes());
        got.push((o.id, tensor.to_vec(), decoded.timestamps_s));
    }
    got.sort_by_key(|g| g.0);
    let bytes: Vec<u8> = got.iter().flat_map(|g| g.1.iter().copied()).collect();
    let times: Vec<f64> = got.iter().flat_map(|g| g.2.iter().copied()).collect();
    assert!(bytes == whole.0, "pool pieces differ from the whole decode");
    assert_eq!(times, whole.1.timestamps_s);

    // A range past the sample's targets is a per-sample error, before any buffer is taken.
    let f = whole.1.shape.frames;
    pool.submit(Job {
        frames: Some(FrameRange { start: 2, end: f + 1 }),
        ..Job::sampled(9, path.clone(), 0)
    });
    let o = pool.recv().unwrap();
    let e = o.result.expect_err("a range past F must fail");
    assert!(matches!(e.reason, Failure::Decode(DecodeError::BadRange { start: 2, .. })), "{e}");
    eprintln!("{e}");
}

#[test]
fn bad_ranges_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let clip = make_clip(&dir.path().join("c.mp4"), "64x64", 10, 2.0, &["-c:v", "libx264", "-g", "5"]);
    let img = make_image(&dir.path().join("i.png"), "64x64", &[]);
    let params = Params::default();
    let try_range = |path: &Path, r: FrameRange| {
        let mut dec = Decoder::open(path).unwrap();
        let shape = dec.shape(&params).unwrap();
        let mut buf = vec![0u8; r.len() as usize * shape.frame_bytes()];
        dec.decode_range_into(&params, Strategy::Scan, r, &mut buf)
    };
    // 2 s → 4 targets.
    for r in
        [FrameRange { start: 0, end: 5 }, FrameRange { start: 2, end: 2 }, FrameRange { start: 3, end: 1 }]
    {
        let e = try_range(&clip, r).expect_err("bad range");
        assert!(matches!(e, DecodeError::BadRange { frames: 4, .. }), "{r:?}: {e}");
    }
    assert!(try_range(&clip, FrameRange { start: 3, end: 4 }).is_ok());
    // An image has only 0..1.
    assert!(try_range(&img, FrameRange::whole(1)).is_ok());
    for r in [FrameRange { start: 1, end: 2 }, FrameRange { start: 0, end: 2 }] {
        let e = try_range(&img, r).expect_err("an image has one frame");
        assert!(matches!(e, DecodeError::BadRange { frames: 1, .. }), "{r:?}: {e}");
    }
    // The buffer must hold exactly the range.
    let mut dec = Decoder::open(&clip).unwrap();
    let fb = dec.shape(&params).unwrap().frame_bytes();
    let mut buf = vec![0u8; 3 * fb];
    let e = dec.decode_range_into(&params, Strategy::Scan, FrameRange { start: 1, end: 3 }, &mut buf);
    assert!(matches!(e, Err(DecodeError::BufferSize { .. })), "{e:?}");
}
