//! The protocol's preprocessing arithmetic (`shared/bench/PROTOCOL.md`, "Preprocessing"), exact
//! and FFI-free: output size, frame count, frame targets as rationals, tokens.

/// The patch size `P` every output side is a multiple of.
pub const PATCH: u64 = 28;

/// Preprocessing parameters. Defaults are the protocol's: 2 frames per second, at most 16
/// frames, at most 448 × 448 pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Frames sampled per second of video, `(num, den)`.
    pub sample_fps: (u32, u32),
    /// Most frames per sample.
    pub max_frames: u32,
    /// Most output pixels per frame.
    pub max_pixels: u64,
}

impl Default for Params {
    fn default() -> Self {
        Params { sample_fps: (2, 1), max_frames: 16, max_pixels: 200_704 }
    }
}

/// Integer square root (floor).
pub fn isqrt(n: u64) -> u64 {
    let n = n as u128;
    let mut x = (n as f64).sqrt() as u128;
    while x * x > n {
        x -= 1;
    }
    while (x + 1) * (x + 1) <= n {
        x += 1;
    }
    x as u64
}

/// The protocol's output length of side `a` against the other side `b`:
/// `a' = (a // P)·P` when `a·b ≤ max_pixels`, else `isqrt((a·max_pixels) // (P²·b))·P`; then
/// `max(P, a')`.
pub fn resize_side(a: u32, b: u32, max_pixels: u64) -> u32 {
    let (a, b) = (a as u64, b as u64);
    let side = if a * b <= max_pixels {
        (a / PATCH) * PATCH
    } else {
        let q = (a as u128 * max_pixels as u128) / (PATCH as u128 * PATCH as u128 * b.max(1) as u128);
        isqrt(q.min(u64::MAX as u128) as u64) * PATCH
    };
    side.max(PATCH).min(u32::MAX as u64) as u32
}

/// Output `(H', W')` of a `width`×`height` picture.
pub fn output_size(width: u32, height: u32, max_pixels: u64) -> (u32, u32) {
    (resize_side(height, width, max_pixels), resize_side(width, height, max_pixels))
}

/// A non-negative exact rational `num / den` (`den > 0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ratio {
    /// Numerator.
    pub num: i128,
    /// Denominator (> 0).
    pub den: i128,
}

impl Ratio {
    /// `num / den`; `None` when `den ≤ 0`.
    pub fn new(num: i128, den: i128) -> Option<Ratio> {
        (den > 0).then_some(Ratio { num, den })
    }

    /// Compares exactly.
    pub fn cmp_exact(&self, other: &Ratio) -> std::cmp::Ordering {
        (self.num * other.den).cmp(&(other.num * self.den))
    }

    /// As seconds, for reports.
    pub fn to_f64(&self) -> f64 {
        self.num as f64 / self.den as f64
    }
}

/// `F = clamp(floor(d × sample_fps), 1, max_frames)`.
pub fn frame_count(duration: Ratio, params: &Params) -> u32 {
    let (fn_, fd) = (params.sample_fps.0 as i128, params.sample_fps.1.max(1) as i128);
    let f = (duration.num.max(0) * fn_) / (duration.den * fd);
    f.clamp(1, params.max_frames.max(1) as i128) as u32
}

/// Target `t_i = (2i + 1) / (2F) × d`.
pub fn target(i: u32, frames: u32, duration: Ratio) -> Ratio {
    Ratio { num: (2 * i as i128 + 1) * duration.num, den: 2 * frames.max(1) as i128 * duration.den }
}

/// The protocol's output shape `(F, H', W')` of a sample, from its descriptor alone: images have
/// one frame; a video `clamp(floor(d × sample_fps), 1, max_frames)` frames (1 when it states no
/// duration). The decoder produces exactly this shape for every sample it decodes.
pub fn output_shape(d: &crate::descriptor::Descriptor, params: &Params) -> (u32, u32, u32) {
    let (h, w) = output_size(d.width, d.height, params.max_pixels);
    let f = if d.modality == crate::descriptor::Modality::Image {
        1
    } else {
        Ratio::new(d.duration_ticks as i128 * d.time_base_num as i128, (d.time_base_den as i128).max(1))
            .map_or(1, |r| frame_count(r, params))
    };
    (f, h, w)
}

/// Tokens of a sample: `text_tokens + ceil(F / 2) × (H' / 28) × (W' / 28)`.
pub fn tokens(text_tokens: u32, frames: u32, height: u32, width: u32) -> u64 {
    text_tokens as u64 + (frames as u64).div_ceil(2) * (height as u64 / PATCH) * (width as u64 / PATCH)
}

/// How the decoder reaches the sampled frames. Both give the same frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// One sequential pass from the start.
    Scan,
    /// Before a target, seek to the keyframe preceding it when that keyframe lies beyond the
    /// current position; decode forward from there.
    Seek,
}

impl Strategy {
    /// The name printed in reports.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Scan => "scan",
            Strategy::Seek => "seek",
        }
    }

    /// The strategy for decoding the targets `range` of `d` (the whole sample or a piece of
    /// a split): [`choose`](Strategy::choose) over the stream's frames and the whole sample's
    /// target count, or over the range's own target count where that says seek.
    ///
    /// A piece is a run of the whole's targets, with the whole's gaps between them: where the
    /// whole seeks, so does every piece. (Judged by its own count alone, a piece of 17 of 33
    /// targets scanned 76 frames where the whole seeks and decodes 66.) Where the whole scans and
    /// a piece's own count says seek, the piece seeks to the keyframes inside it, as pieces
    /// always have: on `skewed.json`'s 87 Mbit/s clip `000040.mp4`, whose whole scans, two
    /// pieces of a three-way cut took 0.64 and 0.92 s seeking against 0.99 and 1.14 s
    /// scanning (one run each); `scripts/demo.sh`'s figures were measured so.
    ///
    /// ```
    /// use datahelix::decode::{FrameRange, Params, Strategy};
    /// use datahelix::descriptor::{Descriptor, Modality};
    ///
    /// // 51 s at 3 fps, a keyframe every 2 frames, 33 targets 4–5 frames apart: the whole seeks,
    /// // and so does its second half.
    /// let d = Descriptor {
    ///     modality: Modality::Video,
    ///     frames: 153,
    ///     fps_num: 3,
    ///     fps_den: 1,
    ///     duration_ticks: 51,
    ///     time_base_num: 1,
    ///     time_base_den: 1,
    ///     keyint: 2,
    ///     ..Descriptor::default()
    /// };
    /// let p = Params { max_frames: 33, ..Params::default() };
    /// assert_eq!(Strategy::for_range(&d, &p, FrameRange::whole(33)), Strategy::Seek);
    /// assert_eq!(Strategy::for_range(&d, &p, FrameRange { start: 16, end: 33 }), Strategy::Seek);
    /// ```
    pub fn for_range(
        d: &crate::descriptor::Descriptor,
        params: &Params,
        range: super::split::FrameRange,
    ) -> Strategy {
        let whole = Strategy::choose(d.keyint, d.frames, output_shape(d, params).0);
        if whole == Strategy::Seek {
            return whole;
        }
        Strategy::choose(d.keyint, d.frames, range.len())
    }

    /// Picks the strategy predicted cheaper from descriptor fields: `keyint` (largest keyframe
    /// distance in frames, 0 unknown), the stream's `frames` and the number of sampled frames.
    ///
    /// A scan decodes about `frames × (F − ½) / F` frames. A seek decodes, per target, on average
    /// half a GOP plus the keyframe (costlier than the frames it replaces) and pays a flush:
    /// about `keyint / 2 + SEEK_OVERHEAD_FRAMES`, and only where the gap between targets exceeds
    /// the distance back to the preceding keyframe. Seeking wins only when the gap between
    /// targets is well above the keyframe interval.
    pub fn choose(keyint: u32, frames: u32, sampled: u32) -> Strategy {
        /// Flush, demuxer seek and the keyframe's extra cost, in frame-decode units (measured:
        /// seeking every target of 720p/1080p x264 clips ran ~4× slower than a scan).
        const SEEK_OVERHEAD_FRAMES: u64 = 8;
        if keyint == 0 || sampled == 0 || frames == 0 {
            return Strategy::Scan;
        }
        let (k, n, f) = (keyint as u64, frames as u64, sampled as u64);
        let scan = n * (2 * f - 1) / (2 * f);
        let gap = n / f;
        let per_target = (k / 2 + SEEK_OVERHEAD_FRAMES).min(gap);
        let seek = per_target * f;
        if gap > k && seek < scan {
            Strategy::Seek
        } else {
            Strategy::Scan
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_integer_rule() {
        // Small pictures: floor to a multiple of 28, at least 28.
        assert_eq!(output_size(320, 240, 200_704), (224, 308));
        assert_eq!(output_size(20, 10, 200_704), (28, 28));
        // 530×530 = 280900 > max: isqrt(530·200704 // (784·530)) = isqrt(256) = 16 → 448.
        assert_eq!(output_size(530, 530, 200_704), (448, 448));
        // 1920×1080: H' = isqrt(1080·200704 // (784·1920))·28 = isqrt(144)·28 = 336;
        // W' = isqrt(1920·200704 // (784·1080))·28 = isqrt(455)·28 = 21·28 = 588.
        assert_eq!(output_size(1920, 1080, 200_704), (336, 588));
        assert_eq!(isqrt(255), 15);
        assert_eq!(isqrt(256), 16);
        assert_eq!(isqrt(u64::MAX), 4_294_967_295);
    }

    #[test]
    fn frames_and_targets_are_exact() {
        let p = Params::default();
        let d = Ratio::new(3, 1).unwrap();
        assert_eq!(frame_count(d, &p), 6);
        assert_eq!(frame_count(Ratio::new(1, 10).unwrap(), &p), 1);
        assert_eq!(frame_count(Ratio::new(100, 1).unwrap(), &p), 16);
        let t0 = target(0, 6, d);
        assert_eq!(t0.cmp_exact(&Ratio::new(1, 4).unwrap()), std::cmp::Ordering::Equal);
        assert_eq!(tokens(5, 3, 224, 308), 5 + 2 * 8 * 11);
    }

    #[test]
    fn a_piece_seeks_where_its_whole_seeks_or_its_own_count_says_so() {
        use crate::decode::split::FrameRange;
        use crate::descriptor::{Descriptor, Modality};
        // skewed.json's noisy 720p clip: 101 frames at 30 fps, keyframes 29 apart, 6 targets
        // 17 frames apart: the whole scans; a piece of one target seeks to its keyframe.
        let d = Descriptor {
            modality: Modality::Video,
            frames: 101,
            fps_num: 30,
            fps_den: 1,
            duration_ticks: 3367,
            time_base_num: 1,
            time_base_den: 1000,
            keyint: 29,
            ..Descriptor::default()
        };
        let p = Params::default();
        assert_eq!(output_shape(&d, &p).0, 6);
        assert_eq!(Strategy::for_range(&d, &p, FrameRange::whole(6)), Strategy::Scan);
        assert_eq!(Strategy::for_range(&d, &p, FrameRange { start: 5, end: 6 }), Strategy::Seek);
        // Keyframes unknown: always a scan.
        let d = Descriptor { keyint: 0, ..d };
        assert_eq!(Strategy::for_range(&d, &p, FrameRange { start: 5, end: 6 }), Strategy::Scan);
    }

    #[test]
    fn seek_only_when_gaps_dwarf_the_gop() {
        assert_eq!(Strategy::choose(250, 240, 16), Strategy::Scan);
        assert_eq!(Strategy::choose(0, 100_000, 16), Strategy::Scan);
        assert_eq!(Strategy::choose(30, 3600, 16), Strategy::Seek);
    }
}
