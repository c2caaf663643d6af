//! Splitting one heavy video sample into pieces that different ranks decode.
//!
//! A piece is a contiguous range of the sample's target frames (PROTOCOL.md's `t_i`,
//! `i ∈ [start, end)`). Its decoder seeks to the keyframe before `t_start` and decodes forward
//! ([`Decoder::decode_range_into`](super::Decoder::decode_range_into)); the pieces' tensors,
//! concatenated in order, are byte for byte the whole sample's tensor (`tests/decode_pieces.rs`).
//!
//! Where to cut is predicted from the descriptor alone, in integers, so that every rank computes
//! the same ranges: target `i` lies at stream frame `p_i = ⌈t_i · fps⌉`, keyframes at multiples of
//! the descriptor's `keyint`. The piece starting at target `a` seeks to the keyframe at or before
//! `t_a`, frame `k_a = ⌊⌊t_a · fps⌋ / keyint⌋ · keyint`, and decodes up to its last target's frame.
//! A cut before `a` is made only where `k_a > p_{a−1}`: the two pieces decode no frame twice. `keyint` is the *largest*
//! keyframe distance, so real keyframes may be denser; a wrong guess costs decode time (a piece
//! that starts earlier than predicted), never correctness.
//!
//! ```
//! use datahelix::decode::split::{split_targets, FrameRange};
//! use datahelix::decode::Params;
//! use datahelix::descriptor::{Descriptor, Modality};
//!
//! // 8 s at 24 fps, a keyframe every 12 frames: 16 targets, 2 pieces of 8.
//! let d = Descriptor {
//!     modality: Modality::Video,
//!     frames: 192,
//!     fps_num: 24,
//!     fps_den: 1,
//!     duration_ticks: 8,
//!     time_base_num: 1,
//!     time_base_den: 1,
//!     keyint: 12,
//!     ..Descriptor::default()
//! };
//! let pieces = split_targets(&d, &Params::default(), 2);
//! assert_eq!(pieces, [FrameRange { start: 0, end: 8 }, FrameRange { start: 8, end: 16 }]);
//! ```

use serde::{Deserialize, Serialize};

use super::sample::{output_shape, Params};
use crate::descriptor::{Descriptor, Modality};

/// A contiguous range `[start, end)` of a sample's target frames (protocol frame indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FrameRange {
    /// First target frame of the range.
    pub start: u32,
    /// One past the last target frame of the range.
    pub end: u32,
}

impl FrameRange {
    /// Number of target frames in the range (0 when `end ≤ start`).
    pub fn len(&self) -> u32 {
        self.end.saturating_sub(self.start)
    }

    /// Whether the range holds no target frame.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole sample: `0..frames`.
    pub fn whole(frames: u32) -> FrameRange {
        FrameRange { start: 0, end: frames }
    }
}

/// Most pieces [`split_targets`] makes of one sample, whatever `parts` asks (keeps the search
/// bounded on any descriptor; far more than a sample's useful parallelism).
pub const MAX_PARTS: u32 = 1024;

/// Groups of pictures [`split_targets`] looks back for a boundary before giving up on a cut
/// (bounds the search on pathological descriptors; real ones need one or two).
const BOUNDARY_LOOKBACK: u32 = 64;

/// The exact frame timing of a video descriptor: where its targets fall in the stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Target frames `F`.
    pub(crate) targets: u32,
    /// `(2i + 1) · num / den` rounded up is target `i`'s stream frame.
    num: u128,
    den: u128,
    /// Largest keyframe distance, frames (0 unknown).
    keyint: u128,
}

impl Timing {
    /// The timing of `d` under `params`: `F` from [`output_shape`], `d = duration_ticks ·
    /// time_base_num / time_base_den`, fps from `fps_num / fps_den` (else `frames / d`).
    /// `None` for an image or a descriptor without a usable duration or frame rate, or where the
    /// arithmetic would not fit in 128 bits.
    pub(crate) fn new(d: &Descriptor, params: &Params) -> Option<Timing> {
        if d.modality != Modality::Video || d.duration_ticks <= 0 || d.time_base_num == 0 {
            return None;
        }
        let targets = output_shape(d, params).0;
        let dn = d.duration_ticks as u128 * d.time_base_num as u128;
        let dd = d.time_base_den.max(1) as u128;
        let (fnum, fden) = if d.fps_num > 0 && d.fps_den > 0 {
            (d.fps_num as u128, d.fps_den as u128)
        } else if d.frames > 0 {
            (d.frames as u128 * dd, dn)
        } else {
            return None;
        };
        // p_i = ⌈(2i + 1) · dn · fnum / (2F · dd · fden)⌉.
        let num = dn.checked_mul(fnum)?;
        let den = (2 * targets as u128).checked_mul(dd)?.checked_mul(fden)?;
        let t = Timing { targets, num, den, keyint: d.keyint as u128 };
        // The largest numerator must fit; smaller targets then fit too.
        t.frame_checked(targets.max(1) - 1)?;
        Some(t)
    }

    fn frame_checked(&self, i: u32) -> Option<u128> {
        let n = (2 * i as u128 + 1).checked_mul(self.num)?;
        Some(n.div_ceil(self.den))
    }

    /// The target index clamped to the checked bound.
    fn clamp(&self, i: u32) -> u32 {
        i.min(self.targets.max(1) - 1)
    }

    /// Predicted stream frame of target `i`, the first at or after `t_i`: `⌈t_i · fps⌉`.
    pub(crate) fn frame(&self, i: u32) -> u128 {
        // `new` checked the largest target; clamping keeps any `i` in that bound.
        self.frame_checked(self.clamp(i)).unwrap_or(u128::MAX)
    }

    /// Predicted last stream frame at or before `t_i`: `⌊t_i · fps⌋`.
    fn frame_before(&self, i: u32) -> u128 {
        (2 * self.clamp(i) as u128 + 1).checked_mul(self.num).map_or(u128::MAX, |n| n / self.den)
    }

    /// Predicted first frame a piece starting at target `s` decodes: 0 for the first piece, else
    /// the predicted keyframe at or before `t_s` — where the decoder's seek lands (0 when the
    /// keyframe distance is unknown).
    pub(crate) fn piece_start(&self, s: u32) -> u128 {
        if s == 0 {
            0
        } else {
            self.keyframe_before(s)
        }
    }

    /// Predicted keyframe at or before `t_i`: the last multiple of `keyint` at or before
    /// `⌊t_i · fps⌋` (0 when the keyframe distance is unknown: the stream's first frame).
    fn keyframe_before(&self, i: u32) -> u128 {
        self.frame_before(i).checked_div(self.keyint).map_or(0, |gop| gop * self.keyint)
    }

    /// Frames decoded for the targets `[s, e)` when keyframes lie exactly every `keyint` frames:
    /// a scan runs from the range's start to its last target's frame; a seek jumps to a
    /// target's keyframe whenever that lies past the frame the decoder stands at.
    fn decoded(&self, s: u32, e: u32, seek: bool) -> u128 {
        if !seek {
            return self.cost(s, e);
        }
        let (mut at, mut n) = (self.piece_start(s), 0u128);
        for x in s..e {
            at = at.max(self.keyframe_before(x));
            let through = self.frame(x).saturating_add(1);
            n += through.saturating_sub(at);
            at = at.max(through);
        }
        n
    }

    /// Frames decoded, in order, from target `i`'s keyframe through its frame: what any decoder
    /// of `i` spends on one thread before `i` is out, however the sample is cut.
    fn chain(&self, i: u32) -> u128 {
        (self.frame(i) + 1).saturating_sub(self.keyframe_before(i))
    }

    /// Predicted frames decoded by the piece `[s, e)` read as one scan from its start.
    fn cost(&self, s: u32, e: u32) -> u128 {
        (self.frame(e - 1) + 1).saturating_sub(self.piece_start(s))
    }

    /// Whether a piece may start at target `a`: its predicted keyframe lies at or past the frame
    /// of target `a − 1`, so the two pieces decode at most one frame twice — that keyframe, when
    /// it is target `a − 1`'s frame (common: x264 puts keyframes at scene cuts and GOP ends that
    /// targets land on; refusing the cut there left two-GOP clips unsplit).
    fn is_boundary(&self, a: u32) -> bool {
        a > 0 && a < self.targets && self.keyint > 0 && self.piece_start(a) >= self.frame(a - 1)
    }

    /// The first target whose predicted seek frame `⌊t_i · fps⌋` is at or past `frame`, in
    /// `[lo, targets]`.
    fn first_seeking_at_or_past(&self, frame: u128, mut lo: u32) -> u32 {
        let mut hi = self.targets;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.frame_before(mid) >= frame {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    }

    /// The last boundary in `(s, b]`, looking back at most [`BOUNDARY_LOOKBACK`] groups of
    /// pictures. The targets seeking into the group of `b` are a run ending at `b`; only the
    /// run's first can be a boundary (the others' previous target is in that group too). When it
    /// is not (its previous target's frame is that group's keyframe), the search goes on before.
    fn last_boundary(&self, s: u32, mut b: u32) -> Option<u32> {
        for _ in 0..BOUNDARY_LOOKBACK {
            if b <= s || self.keyint == 0 {
                return None;
            }
            let a = self.first_seeking_at_or_past(self.piece_start(b.max(1)), s + 1).min(b);
            if self.is_boundary(a) {
                return Some(a);
            }
            b = a - 1;
        }
        None
    }

    /// Cuts greedily so that no piece predicts more than `budget` decoded frames: each piece runs
    /// to the last useful boundary within the budget. `None` when more than `parts` pieces, or a
    /// piece without a boundary inside the budget, would be needed. Greedy is optimal here: a
    /// piece's cost falls as its start moves later and rises as its end does.
    fn cuts(&self, budget: u128, parts: u32) -> Option<Vec<FrameRange>> {
        let mut out = Vec::new();
        let mut s = 0u32;
        loop {
            if out.len() as u32 >= parts || self.cost(s, s + 1) > budget {
                return None;
            }
            // The largest end e in (s, F] with cost(s, e) ≤ budget.
            let (mut lo, mut hi) = (s + 1, self.targets);
            while lo < hi {
                let mid = hi - (hi - lo) / 2;
                if self.cost(s, mid) <= budget {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            if lo == self.targets {
                out.push(FrameRange { start: s, end: lo });
                return Some(out);
            }
            // Target `lo` is the first beyond the budget: the piece ends at the last boundary
            // at or before it.
            let a = self.last_boundary(s, lo)?;
            out.push(FrameRange { start: s, end: a });
            s = a;
        }
    }
}

/// Splits the sample's F target frames into at most `parts` contiguous ranges whose boundaries lie
/// at predicted keyframes (from the descriptor's `keyint`, `frames`, `fps`, duration), so that each
/// range after the first starts with a seek to a keyframe and no range re-decodes another's
/// frames; balances the ranges' predicted decoded-frame counts (minimise the largest), using the
/// fewest ranges that reach that minimum. Returns exactly one range `0..F` when the sample cannot
/// be split: an image, keyint 0 or ≥ the stream's frames, F < 2, `parts` ≤ 1, or no keyframe
/// boundary falls between two targets. Pure and deterministic (integer arithmetic only: every
/// rank computes the same ranges); never panics. At most [`MAX_PARTS`] ranges.
pub fn split_targets(d: &Descriptor, params: &Params, parts: u32) -> Vec<FrameRange> {
    let whole = vec![FrameRange::whole(output_shape(d, params).0)];
    if d.modality != Modality::Video || d.keyint == 0 || d.keyint >= d.frames || parts <= 1 {
        return whole;
    }
    let Some(t) = Timing::new(d, params) else { return whole };
    if t.targets < 2 {
        return whole;
    }
    let parts = parts.min(t.targets).min(MAX_PARTS);
    // The smallest budget (largest piece's predicted decoded frames) that `parts` pieces meet.
    let (mut lo, mut hi) = (1u128, t.cost(0, t.targets).max(1));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if t.cuts(mid, parts).is_some() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    t.cuts(lo, parts).unwrap_or(whole)
}

/// Stream frames a single-threaded decoder decodes for the targets `range` of `d` by
/// `strategy`, exactly, where keyframes lie every `keyint` frames (the simulator's streams;
/// real ones may have more). `None` without a frame timing (an image, no duration or rate).
///
/// ```
/// use datahelix::decode::split::decoded_frames;
/// use datahelix::decode::{FrameRange, Params, Strategy};
/// use datahelix::descriptor::{Descriptor, Modality};
///
/// // 32 s at 10 fps, a keyframe every 40 frames, 16 targets 20 frames apart (at 10, 30, …).
/// let d = Descriptor {
///     modality: Modality::Video,
///     frames: 320,
///     fps_num: 10,
///     fps_den: 1,
///     duration_ticks: 32,
///     time_base_num: 1,
///     time_base_den: 1,
///     keyint: 40,
///     ..Descriptor::default()
/// };
/// let p = Params::default();
/// // A scan of the whole: frames 0 … 310.
/// assert_eq!(decoded_frames(&d, &p, FrameRange::whole(16), Strategy::Scan), Some(311));
/// // Targets 2 and 3 (frames 50 and 70) by seeks: from keyframe 40 through frame 70.
/// assert_eq!(decoded_frames(&d, &p, FrameRange { start: 2, end: 4 }, Strategy::Seek), Some(31));
/// ```
pub fn decoded_frames(
    d: &Descriptor,
    params: &Params,
    range: FrameRange,
    strategy: super::Strategy,
) -> Option<u64> {
    let t = Timing::new(d, params)?;
    let end = range.end.min(t.targets);
    let start = range.start.min(end);
    let n = t.decoded(start, end, strategy == super::Strategy::Seek);
    Some(n.min(u64::MAX as u128) as u64)
}

/// The longest run of frames one target of `d` needs decoded in order, from its keyframe (at a
/// multiple of `keyint`, or the stream's start) through its own frame: no split and no number
/// of workers brings that target out sooner than its run takes one worker. `None` without a
/// frame timing.
///
/// ```
/// use datahelix::decode::split::longest_chain_frames;
/// use datahelix::decode::Params;
/// use datahelix::descriptor::{Descriptor, Modality};
///
/// // As above: the targets at 30, 70, 110, … lie 31 frames past their keyframes (0, 40, 80, …).
/// let d = Descriptor {
///     modality: Modality::Video,
///     frames: 320,
///     fps_num: 10,
///     fps_den: 1,
///     duration_ticks: 32,
///     time_base_num: 1,
///     time_base_den: 1,
///     keyint: 40,
///     ..Descriptor::default()
/// };
/// assert_eq!(longest_chain_frames(&d, &Params::default()), Some(31));
/// ```
pub fn longest_chain_frames(d: &Descriptor, params: &Params) -> Option<u64> {
    let t = Timing::new(d, params)?;
    let longest = (0..t.targets).map(|i| t.chain(i)).max().unwrap_or(0);
    Some(longest.min(u64::MAX as u128) as u64)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn clip(seconds: i64, fps: u32, keyint: u32) -> Descriptor {
        Descriptor {
            modality: Modality::Video,
            frames: seconds as u32 * fps,
            fps_num: fps,
            fps_den: 1,
            duration_ticks: seconds * 1000,
            time_base_num: 1,
            time_base_den: 1000,
            keyint,
            ..Descriptor::default()
        }
    }

    /// Checks the invariants every split must hold and returns the ranges.
    fn check(d: &Descriptor, p: &Params, parts: u32) -> Vec<FrameRange> {
        let r = split_targets(d, p, parts);
        let f = output_shape(d, p).0;
        assert!(!r.is_empty());
        assert!(r.len() as u32 <= parts.max(1), "{r:?} for {parts} parts");
        assert_eq!(r[0].start, 0);
        assert_eq!(r[r.len() - 1].end, f);
        for w in r.windows(2) {
            assert_eq!(w[0].end, w[1].start, "contiguous: {r:?}");
        }
        assert!(r.iter().all(|x| !x.is_empty()), "{r:?}");
        if r.len() > 1 {
            let t = Timing::new(d, p).expect("a split sample has a timing");
            for x in &r[1..] {
                assert!(t.is_boundary(x.start), "{x:?} does not start past a predicted keyframe: {r:?}");
            }
        }
        r
    }

    #[test]
    fn cuts_at_predicted_keyframes_and_balances() {
        let p = Params::default();
        // 8 s at 24 fps, GOP 12: targets at 0.25 + 0.5 i s = frames 6, 18, 30, …, 366/2: one per
        // GOP, so every boundary is usable and the halves balance exactly.
        let d = clip(8, 24, 12);
        assert_eq!(check(&d, &p, 2), [FrameRange { start: 0, end: 8 }, FrameRange { start: 8, end: 16 }]);
        let four = check(&d, &p, 4);
        assert_eq!(four.len(), 4);
        assert!(four.iter().all(|r| r.len() == 4), "{four:?}");
        // One GOP holds every target: nothing to cut.
        assert_eq!(split_targets(&clip(8, 24, 191), &p, 4), [FrameRange::whole(16)]);
        // GOP of 48 frames = 4 targets: cuts only every 4 targets. Three parts would cost no
        // less than two (the piece holding the end still spans 8 targets' frames, 91), so the
        // fewer pieces win.
        let gop48 = check(&clip(8, 24, 48), &p, 3);
        assert_eq!(gop48, [FrameRange { start: 0, end: 8 }, FrameRange { start: 8, end: 16 }]);
        let t = Timing::new(&clip(8, 24, 48), &p).unwrap();
        assert_eq!((t.cost(0, 8), t.cost(8, 16), t.cost(0, 16)), (91, 91, 187));
        // GOP 12: a piece of n targets costs 12·n − 5 frames wherever it starts, so five parts
        // cannot beat four (some piece still holds 4 targets) and four are used.
        assert_eq!(check(&d, &p, 5), four);
    }

    #[test]
    fn a_cut_may_share_one_keyframe_with_the_piece_before_but_no_more() {
        // 4 s at 25 fps, GOP 12, 6 targets a second: t_i · fps = (2i + 1) · 25/12. Target 11's
        // frame is ⌈47.9⌉ = 48, and target 12 (at 52.08) seeks back to keyframe 48: a cut at 12
        // decodes that one frame twice, which is allowed. Target 13 (at 56.25, frame 57) would
        // seek to 48 too, behind target 12's frame 53: not a cut.
        let p = Params { sample_fps: (6, 1), max_frames: 32, ..Params::default() };
        let d = Descriptor { frames: 100, fps_num: 25, duration_ticks: 4000, keyint: 12, ..clip(4, 25, 12) };
        let t = Timing::new(&d, &p).unwrap();
        assert_eq!((t.frame(11), t.piece_start(12), t.piece_start(14), t.frame(13)), (48, 48, 60, 57));
        assert!(t.is_boundary(12) && !t.is_boundary(13) && t.is_boundary(14));
        let two = check(&d, &p, 2);
        assert_eq!(two.len(), 2);
        assert!(two[0].end == 12 || two[0].end == 14, "{two:?}");
    }

    #[test]
    fn what_cannot_be_split_is_one_range() {
        let p = Params::default();
        let whole = |d: &Descriptor, parts| split_targets(d, &p, parts);
        let d = clip(8, 24, 12);
        assert_eq!(whole(&d, 1), [FrameRange::whole(16)]);
        assert_eq!(whole(&d, 0), [FrameRange::whole(16)]);
        assert_eq!(whole(&Descriptor { keyint: 0, ..d }, 4), [FrameRange::whole(16)]);
        assert_eq!(whole(&Descriptor { keyint: 192, ..d }, 4), [FrameRange::whole(16)]);
        let image = Descriptor { modality: Modality::Image, frames: 1, width: 64, height: 64, ..d };
        assert_eq!(whole(&image, 4), [FrameRange::whole(1)]);
        // F = 1: a half-second clip.
        assert_eq!(whole(&Descriptor { duration_ticks: 600, ..d }, 4), [FrameRange::whole(1)]);
        // No duration, no frame rate.
        assert_eq!(whole(&Descriptor { duration_ticks: 0, ..d }, 4), [FrameRange::whole(1)]);
        assert_eq!(whole(&Descriptor { fps_num: 0, frames: 0, ..d }, 4), [FrameRange::whole(16)]);
        // Without a stated rate, frames / duration stands in for it.
        assert_eq!(whole(&Descriptor { fps_num: 0, ..d }, 2).len(), 2);
    }

    #[test]
    fn frames_of_targets_are_exact() {
        // 30000/1001 fps over 10.01 s: t_i = (2i+1)/32 · 10.01, p_i = ⌈t_i · 30000/1001⌉.
        let d = Descriptor {
            modality: Modality::Video,
            frames: 300,
            fps_num: 30000,
            fps_den: 1001,
            duration_ticks: 10010,
            time_base_num: 1,
            time_base_den: 1000,
            keyint: 30,
            ..Descriptor::default()
        };
        let t = Timing::new(&d, &Params::default()).unwrap();
        assert_eq!(t.targets, 16);
        // t_0 = 10.01/32 s → 10.01 · 30000 / (32 · 1001) = 9.375 → 10.
        assert_eq!(t.frame(0), 10);
        // t_15 = 31 · 10.01/32 s → 290.625 → 291.
        assert_eq!(t.frame(15), 291);
        // p_4 = ⌈84.375⌉ = 85, in the GOP starting at frame 60.
        assert_eq!(t.piece_start(4), 60);
    }

    fn arbitrary_descriptor() -> impl Strategy<Value = (Descriptor, Params)> {
        (
            (any::<u8>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<i64>(), any::<u32>(), any::<u32>()),
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        )
            .prop_map(
                |((m, frames, fps_num, fps_den, ticks, tb_num, tb_den), (keyint, w, h, sf, mf))| {
                    let d = Descriptor {
                        modality: Modality::from_byte(m % 3).unwrap_or_default(),
                        frames,
                        fps_num,
                        fps_den,
                        duration_ticks: ticks,
                        time_base_num: tb_num,
                        time_base_den: tb_den,
                        keyint,
                        width: w,
                        height: h,
                        ..Descriptor::default()
                    };
                    let p =
                        Params { sample_fps: (sf % 64, (sf >> 8) % 8), max_frames: mf, max_pixels: 200_704 };
                    (d, p)
                },
            )
    }

    /// Videos that pass every early exit, with values of every magnitude (log-uniform, up to
    /// the type's limit): long searches and the overflow checks.
    fn extreme_video() -> impl Strategy<Value = (Descriptor, Params, u32)> {
        fn mag(v: u64, bits: u32) -> u64 {
            (v >> (v % bits as u64)) >> (64 - bits)
        }
        (proptest::array::uniform10(any::<u64>()), any::<u32>()).prop_map(|(v, parts)| {
            let frames = (mag(v[0], 32) as u32).max(2);
            let d = Descriptor {
                modality: Modality::Video,
                frames,
                fps_num: (mag(v[1], 32) as u32).max(1),
                fps_den: (mag(v[2], 32) as u32).max(1),
                duration_ticks: (mag(v[3], 63) as i64).max(1),
                time_base_num: (mag(v[4], 32) as u32).max(1),
                time_base_den: mag(v[5], 32) as u32,
                keyint: 1 + mag(v[6], 32) as u32 % (frames - 1),
                ..Descriptor::default()
            };
            let sample_fps = ((mag(v[7], 32) as u32).max(1), (mag(v[8], 32) as u32).max(1));
            let p = Params { sample_fps, max_frames: (mag(v[9], 32) as u32).max(2), max_pixels: 200_704 };
            (d, p, parts >> (parts % 32))
        })
    }

    fn plausible_clip() -> impl Strategy<Value = (Descriptor, Params, u32)> {
        (1u32..600, 1u32..121, 1u32..1001, 1u32..300, 1u32..64, 0u32..40).prop_map(
            |(seconds_x10, fps, fps_den_x1000, keyint, max_frames, parts)| {
                let fps_den = if fps_den_x1000 > 500 { 1001 } else { 1 };
                let fps_num = if fps_den == 1001 { fps * 1000 } else { fps };
                let frames = (seconds_x10 as u64 * fps as u64 / 10) as u32;
                let d = Descriptor {
                    modality: Modality::Video,
                    frames,
                    fps_num,
                    fps_den,
                    duration_ticks: seconds_x10 as i64 * 100,
                    time_base_num: 1,
                    time_base_den: 1000,
                    keyint,
                    ..Descriptor::default()
                };
                (d, Params { max_frames, ..Params::default() }, parts)
            },
        )
    }

    proptest! {
        #[test]
        fn never_panics_on_any_descriptor((d, p) in arbitrary_descriptor(), parts in any::<u32>()) {
            check(&d, &p, parts);
            prop_assert_eq!(split_targets(&d, &p, parts), split_targets(&d, &p, parts));
        }

        #[test]
        fn never_panics_on_extreme_videos((d, p, parts) in extreme_video()) {
            check(&d, &p, parts);
        }

        #[test]
        fn no_range_reaches_a_target_sooner_than_its_run(
            (d, p, _) in plausible_clip(),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
            seek in any::<bool>(),
        ) {
            // Fact 4 of the sound bound: whatever piece holds target i, and however it decodes,
            // it decodes at least i's run from its keyframe; the longest run is one of them.
            if let Some(t) = Timing::new(&d, &p) {
                let n = t.targets as usize;
                let (x, y) = (a.index(n) as u32, b.index(n) as u32);
                let range = FrameRange { start: x.min(y), end: x.max(y) + 1 };
                let how = if seek { crate::decode::Strategy::Seek } else { crate::decode::Strategy::Scan };
                let decoded = decoded_frames(&d, &p, range, how).unwrap() as u128;
                let longest = longest_chain_frames(&d, &p).unwrap() as u128;
                for i in range.start..range.end {
                    prop_assert!(decoded >= t.chain(i), "{:?} decodes {} < run {} of {}", range, decoded, t.chain(i), i);
                    prop_assert!(longest >= t.chain(i));
                }
                prop_assert!((0..t.targets).any(|i| t.chain(i) == longest));
            }
        }

        #[test]
        fn splits_are_contiguous_bounded_and_minimax((d, p, parts) in plausible_clip()) {
            let r = check(&d, &p, parts);
            // No split into fewer or equally many useful pieces has a smaller largest piece:
            // checked against every choice of boundaries when there are few.
            if let Some(t) = Timing::new(&d, &p) {
                if r.len() > 1 {
                    let worst = r.iter().map(|x| t.cost(x.start, x.end)).max().unwrap();
                    let cuts: Vec<u32> = (1..t.targets).filter(|&a| t.is_boundary(a)).collect();
                    if cuts.len() <= 12 {
                        let mut best = t.cost(0, t.targets);
                        for mask in 0u32..(1 << cuts.len()) {
                            if mask.count_ones() + 1 > parts {
                                continue;
                            }
                            let mut starts = vec![0];
                            starts.extend(cuts.iter().enumerate().filter(|(k, _)| mask >> k & 1 == 1).map(|(_, &a)| a));
                            starts.push(t.targets);
                            let w = starts.windows(2).map(|s| t.cost(s[0], s[1])).max().unwrap();
                            best = best.min(w);
                        }
                        prop_assert_eq!(worst, best, "{:?}", r);
                    }
                }
            }
        }
    }
}
