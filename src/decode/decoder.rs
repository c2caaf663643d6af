//! The sampled-frame decoder: PROTOCOL.md's preprocessing over the FFmpeg safe layer, writing
//! packed RGB24 `[F, H', W', 3]` into a caller-provided buffer.

use std::path::Path;

use super::ffmpeg::{self, AvError, CodecContext, Frame, Input, Packet, Received, Scaler, StreamInfo};
use super::sample::{frame_count, output_size, target, Params, Ratio, Strategy};
use super::split::FrameRange;
use crate::shard::location::{Part, Window};

/// Why a file could not be decoded (this layer's error; the pool adds the sample's id and path).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The container could not be opened or probed.
    #[error("cannot open: {0}")]
    Open(AvError),
    /// A member of a shard could not be read: its shard cannot be opened, or a deflated zip
    /// member does not inflate to what its header says.
    #[error("cannot read the shard member: {0}")]
    Member(std::io::Error),
    /// The file holds no video or image stream.
    #[error("no video or image stream")]
    NoVideoStream,
    /// No decoder for the stream's codec, or it would not open.
    #[error("cannot open the decoder: {0}")]
    Codec(AvError),
    /// Neither the stream nor the container states a duration.
    #[error("no duration in stream or container")]
    NoDuration,
    /// The header states no picture size.
    #[error("no picture size in the header")]
    NoSize,
    /// Reading packets failed (damaged or truncated file).
    #[error("demuxing failed (damaged or truncated file): {0}")]
    Demux(AvError),
    /// The decoder rejected the data.
    #[error("decoding failed (corrupt data): {0}")]
    Decode(AvError),
    /// The decoder reported damage it concealed.
    #[error("frame {frame} is corrupt (decoder concealed errors)")]
    CorruptFrame {
        /// 0-based index of the decoded frame.
        frame: u64,
    },
    /// The stream ended before its stated duration by more than a second.
    #[error("stream ends at {last_s:.3} s of a stated {duration_s:.3} s (truncated?)")]
    EndsEarly {
        /// Time of the last decoded frame.
        last_s: f64,
        /// Stated duration.
        duration_s: f64,
    },
    /// A JPEG image ends before its end-of-image marker.
    #[error("truncated JPEG (no end-of-image marker)")]
    TruncatedImage,
    /// Not a single frame could be decoded.
    #[error("no frame decoded (zero-frame video)")]
    NoFrames,
    /// The decode ran past its deadline (`decode_timeout_s`): a file far costlier than its
    /// header promised (e.g. a long video without a seek index, scanned from the start).
    #[error("decode stopped at its deadline of {timeout_s} s after {frames} frames (raise decode_timeout_s for such files, or re-encode them with a seek index)")]
    Deadline {
        /// The deadline, seconds after the decode started.
        timeout_s: f64,
        /// Frames decoded by then.
        frames: u64,
    },
    /// A decoded picture is larger than the header said: the memory granted for the decode
    /// was reckoned from the header ([`Decoder::working_bytes`]).
    #[error("frame {frame} is {width}x{height}, larger than the {header_width}x{header_height} its header states (a stream that changes size; re-encode it)")]
    LargerThanHeader {
        /// 0-based index of the decoded frame.
        frame: u64,
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
        /// The header's width.
        header_width: u32,
        /// The header's height.
        header_height: u32,
    },
    /// A decoded frame carries no presentation timestamp.
    #[error("decoded frame {frame} has no pts")]
    MissingPts {
        /// 0-based index of the decoded frame.
        frame: u64,
    },
    /// The decoded pixel format cannot be converted.
    #[error("pixel format {format} is not supported by the scaler")]
    PixelFormat {
        /// FFmpeg's name of the format.
        format: String,
    },
    /// Scaling failed.
    #[error("scaling failed: {0}")]
    Scale(AvError),
    /// The range of target frames asked for is empty or reaches past the sample's frames (an
    /// image has only `0..1`); split with `decode::split::split_targets`.
    #[error("target frames {start}..{end} are not a range of this sample's 0..{frames}")]
    BadRange {
        /// First target asked for.
        start: u32,
        /// One past the last target asked for.
        end: u32,
        /// The sample's target frames `F`.
        frames: u32,
    },
    /// The output buffer does not match the output shape.
    #[error("output buffer holds {have} bytes, the sample needs {need}")]
    BufferSize {
        /// Bytes the sample needs.
        need: usize,
        /// Bytes given.
        have: usize,
    },
}

/// The shape of a decoded sample, `[F, H', W', 3]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Frames.
    pub frames: u32,
    /// Output height.
    pub height: u32,
    /// Output width.
    pub width: u32,
}

impl Shape {
    /// Bytes of the packed RGB24 tensor.
    pub fn bytes(&self) -> usize {
        self.frames as usize * self.frame_bytes()
    }

    /// Bytes of one frame.
    pub fn frame_bytes(&self) -> usize {
        self.height as usize * self.width as usize * 3
    }

    /// `[F, H', W', 3]`.
    pub fn dims(&self) -> [usize; 4] {
        [self.frames as usize, self.height as usize, self.width as usize, 3]
    }
}

/// Work counters of one decode, the cost model's features as observed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Frames the decoder produced.
    pub frames_decoded: u64,
    /// Decoded frames that were not chosen for any target.
    pub frames_discarded: u64,
    /// Pixels of all decoded frames.
    pub pixels_decoded: u64,
    /// Compressed bytes sent to the decoder.
    pub bytes_read: u64,
    /// Seeks done.
    pub seeks: u32,
}

/// A decoded sample's description (the pixels are in the caller's buffer).
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// Output shape.
    pub shape: Shape,
    /// Time of each chosen frame, seconds from the stream start.
    pub timestamps_s: Vec<f64>,
    /// Work done.
    pub stats: DecodeStats,
    /// How the frames were reached.
    pub strategy: Strategy,
}

/// Every frame of a stream, decoded and kept in the native format (`--all-frames`).
#[derive(Clone, Debug, PartialEq)]
pub struct AllFrames {
    /// Frames decoded.
    pub frames: u64,
    /// Picture width of the first frame.
    pub width: u32,
    /// Picture height of the first frame.
    pub height: u32,
    /// Native pixel format of the first frame (`yuv420p`).
    pub pix_fmt: String,
    /// Time of each frame, seconds from the stream start (`NaN` where a frame has no pts).
    pub timestamps_s: Vec<f64>,
    /// Work done.
    pub stats: DecodeStats,
}

/// One open file, ready to decode its sampled frames.
pub struct Decoder {
    input: Input,
    codec: CodecContext,
    stream: StreamInfo,
    image: bool,
    duration: Option<Ratio>,
    start: i64,
    packet: Packet,
    frame: Frame,
    last: Frame,
    scalers: Vec<Scaler>,
    draining: bool,
    /// Dts of the last packet of our stream sent to the decoder.
    position: Option<i64>,
    /// Dts of the first packet read after the last seek.
    first_dts_after_seek: Option<i64>,
    stats: DecodeStats,
    /// When decoding must stop ([`Decoder::set_deadline`]), and that timeout in seconds.
    deadline: Option<(std::time::Instant, f64)>,
    /// Size of the file on disk ([`Decoder::working_bytes`]).
    file_bytes: u64,
}

/// Bytes of one picture of `w` × `h` in FFmpeg's pixel format `pix_fmt`; 8 bytes a pixel (the
/// largest of the formats decoded here, 16-bit RGBA) where the format is unknown.
fn picture_bytes(pix_fmt: i32, w: usize, h: usize) -> usize {
    let (w32, h32) = (u32::try_from(w).unwrap_or(u32::MAX), u32::try_from(h).unwrap_or(u32::MAX));
    ffmpeg::picture_bytes(pix_fmt, w32, h32).unwrap_or_else(|| w.saturating_mul(h).saturating_mul(8))
}

/// Reference pictures a decoder of `codec` may keep for pictures of `w` × `h` at `level` (the
/// header's, `-99` when unknown): H.264's from its level's limit on the decoded picture buffer
/// (MaxDpbMbs, Table A-1), HEVC's from its level's MaxLumaPs (A.4.2), the others' from their
/// specifications' reference counts.
pub fn pictures_held(codec: ffmpeg_sys_next::AVCodecID, level: i32, w: usize, h: usize) -> u32 {
    use ffmpeg_sys_next::AVCodecID::*;
    match codec {
        AV_CODEC_ID_H264 => {
            let max_dpb_mbs: usize = match level {
                9 | 10 => 396,
                11 => 900,
                12 | 13 | 20 => 2376,
                21 => 4752,
                22 | 30 => 8100,
                31 => 18000,
                32 => 20480,
                40 | 41 => 32768,
                42 => 34816,
                50 => 110400,
                51 | 52 => 184320,
                60..=62 => 696320,
                _ => return 16,
            };
            let mbs = w.div_ceil(16).max(1) * h.div_ceil(16).max(1);
            (max_dpb_mbs / mbs).clamp(1, 16) as u32
        }
        AV_CODEC_ID_HEVC => {
            // general_level_idc is 30 × the level; MaxLumaPs of Table A.8, and the decoded
            // picture buffer's size for a picture of w × h (A.4.2: maxDpbPicBuf = 6).
            let max_luma_ps: usize = match level {
                30 => 36_864,
                60 => 122_880,
                63 => 245_760,
                90 => 552_960,
                93 => 983_040,
                120 | 123 => 2_228_224,
                150 | 153 | 156 => 8_912_896,
                180 | 183 | 186 => 35_651_584,
                _ => return 16,
            };
            let luma = w.max(1) * h.max(1);
            if luma <= max_luma_ps >> 2 {
                16
            } else if luma <= max_luma_ps >> 1 {
                12
            } else if luma <= (3 * max_luma_ps) >> 2 {
                8
            } else {
                6
            }
        }
        AV_CODEC_ID_MPEG4 | AV_CODEC_ID_MPEG2VIDEO | AV_CODEC_ID_MPEG1VIDEO => 2,
        AV_CODEC_ID_VP8 => 3,
        AV_CODEC_ID_VP9 | AV_CODEC_ID_AV1 => 8,
        _ => 16,
    }
}

/// Time of a pts relative to the stream start, as an exact rational of seconds.
fn time_of(pts: i64, start: i64, tb: (i32, i32)) -> Ratio {
    Ratio { num: (pts as i128 - start as i128) * tb.0 as i128, den: (tb.1 as i128).max(1) }
}

impl Decoder {
    /// Opens `path`, probes it the way the protocol's loaders do (`avformat_find_stream_info`)
    /// and opens a single-threaded decoder for its best video stream.
    pub fn open(path: &Path) -> Result<Decoder, DecodeError> {
        Self::open_within(path, None)
    }

    /// [`Decoder::open`] with FFmpeg refusing pictures of more than `max_pixels`, in the probe
    /// (which decodes an image whole) and in the decoder: the pool passes what its byte budget
    /// can hold, so a picture larger than its header said fails instead of taking that memory.
    pub fn open_within(path: &Path, max_pixels: Option<u64>) -> Result<Decoder, DecodeError> {
        Self::open_part_within(path, None, max_pixels)
    }

    /// [`Decoder::open_within`] of the member `part` of the shard `path` when given (a tar
    /// member read in place, a deflated zip member inflated first: [`Window::open`]).
    pub fn open_part_within(
        path: &Path,
        part: Option<Part>,
        max_pixels: Option<u64>,
    ) -> Result<Decoder, DecodeError> {
        let mut input = match part {
            Some(p) => {
                let window = std::fs::File::open(path)
                    .and_then(|f| Window::open(f, p))
                    .map_err(DecodeError::Member)?;
                Input::open_window(path, window)
            }
            None => Input::open(path),
        }
        .map_err(DecodeError::Open)?;
        input.find_stream_info_within(max_pixels).map_err(DecodeError::Open)?;
        let stream = input.best_video_stream().ok_or(DecodeError::NoVideoStream)?;
        if stream.time_base.0 <= 0 || stream.time_base.1 <= 0 {
            return Err(DecodeError::NoDuration);
        }
        let format = input.format_name();
        let image = format == "image2" || format.ends_with("_pipe");
        let duration = match stream.duration {
            Some(d) => Ratio::new(d as i128 * stream.time_base.0 as i128, stream.time_base.1 as i128),
            None => input.duration_us().and_then(|us| Ratio::new(us as i128, 1_000_000)),
        };
        let codec =
            CodecContext::open_within(&input, stream.index, max_pixels).map_err(DecodeError::Codec)?;
        let file_bytes = part.map_or_else(|| std::fs::metadata(path).map_or(0, |m| m.len()), |p| p.bytes());
        let new = |r: Result<Frame, AvError>| r.map_err(DecodeError::Codec);
        Ok(Decoder {
            codec,
            image,
            duration,
            start: stream.start_time.unwrap_or(0),
            packet: Packet::new().map_err(DecodeError::Codec)?,
            frame: new(Frame::new())?,
            last: new(Frame::new())?,
            scalers: Vec::new(),
            draining: false,
            deadline: None,
            position: None,
            first_dts_after_seek: None,
            stats: DecodeStats::default(),
            file_bytes,
            stream,
            input,
        })
    }

    /// Bytes FFmpeg itself holds while this file decodes, beside the output tensor: the decoded
    /// pictures (the codec's references and reordering delay, the frame being decoded and the
    /// last one kept here, each at the header's size and pixel format, padded) and, for an
    /// image, its one packet, the whole file, held twice. The pool counts it in its byte budget for the
    /// length of the decode. Measured against the process's peak memory by
    /// `tests/decode_memory.rs`.
    pub fn working_bytes(&self) -> usize {
        let (w, h) = (self.stream.width as usize, self.stream.height as usize);
        if self.image {
            // The whole picture at its native format, and the file as one packet twice: the
            // probe's buffered copy and the one read to decode (measured: an 8192x8192 PNG
            // peaks at 217 MB above the process's own, a 6000x6000 64 MiB JPEG at 244 MB).
            let packets = (self.file_bytes as usize).saturating_mul(2);
            return picture_bytes(self.stream.pix_fmt, w, h).saturating_add(packets).saturating_add(1 << 20);
        }
        let held = pictures_held(self.stream.codec_id, self.codec.level(), w, h) + 2;
        // FFmpeg pads video pictures (aligned strides, edges for motion vectors).
        picture_bytes(self.stream.pix_fmt, w + 64, h + 64).saturating_mul(held as usize)
    }

    /// What the container says about the decoded stream.
    pub fn stream(&self) -> &StreamInfo {
        &self.stream
    }

    /// Whether the file is a still image (F = 1).
    pub fn is_image(&self) -> bool {
        self.image
    }

    /// The protocol's duration `d`, when stated.
    pub fn duration(&self) -> Option<Ratio> {
        self.duration
    }

    /// Largest distance between keyframes in the demuxer's index, in packets (0 when the index
    /// lists keyframes only, or nothing).
    pub fn keyint_from_index(&self) -> u32 {
        let entries = self.input.index_entries(self.stream.index);
        if entries.iter().all(|e| e.keyframe) {
            return 0;
        }
        let mut last = None;
        let mut gap = 0usize;
        for (i, e) in entries.iter().enumerate() {
            if e.keyframe {
                if let Some(l) = last {
                    gap = gap.max(i - l);
                }
                last = Some(i);
            }
        }
        if let Some(l) = last {
            gap = gap.max(entries.len() - l);
        }
        gap.min(u32::MAX as usize) as u32
    }

    /// The output shape under `params`.
    pub fn shape(&self, params: &Params) -> Result<Shape, DecodeError> {
        if self.stream.width == 0 || self.stream.height == 0 {
            return Err(DecodeError::NoSize);
        }
        let frames =
            if self.image { 1 } else { frame_count(self.duration.ok_or(DecodeError::NoDuration)?, params) };
        let (height, width) = output_size(self.stream.width, self.stream.height, params.max_pixels);
        Ok(Shape { frames, height, width })
    }

    /// Stops every later decode call with [`DecodeError::Deadline`] once `timeout` has passed
    /// from now (checked at every packet read).
    pub fn set_deadline(&mut self, timeout: std::time::Duration) {
        let at = std::time::Instant::now() + timeout;
        self.input.set_deadline(at);
        self.deadline = Some((at, timeout.as_secs_f64()));
    }

    /// Decodes the next frame of the stream into `self.frame`; `Ok(false)` at the end.
    fn next_frame(&mut self) -> Result<bool, DecodeError> {
        loop {
            match self.codec.receive(&mut self.frame).map_err(DecodeError::Decode)? {
                Received::Frame => {
                    let n = self.stats.frames_decoded;
                    self.stats.frames_decoded += 1;
                    self.stats.pixels_decoded += self.frame.width() as u64 * self.frame.height() as u64;
                    if self.frame.is_corrupt() {
                        return Err(DecodeError::CorruptFrame { frame: n });
                    }
                    let (w, h) = (self.frame.width(), self.frame.height());
                    let (hw, hh) = (self.stream.width, self.stream.height);
                    if w as u64 * h as u64 > hw as u64 * hh as u64 {
                        return Err(DecodeError::LargerThanHeader {
                            frame: n,
                            width: w,
                            height: h,
                            header_width: hw,
                            header_height: hh,
                        });
                    }
                    return Ok(true);
                }
                Received::Eof => return Ok(false),
                Received::NeedInput if self.draining => return Ok(false),
                Received::NeedInput => {}
            }
            loop {
                if let Some((at, timeout_s)) = self.deadline {
                    if std::time::Instant::now() >= at {
                        return Err(DecodeError::Deadline { timeout_s, frames: self.stats.frames_decoded });
                    }
                }
                let read = self.input.read_packet(&mut self.packet).map_err(|e| match self.deadline {
                    // FFmpeg's interrupt callback stopped it: the deadline, not the file.
                    Some((at, timeout_s)) if std::time::Instant::now() >= at => {
                        DecodeError::Deadline { timeout_s, frames: self.stats.frames_decoded }
                    }
                    _ => DecodeError::Demux(e),
                });
                if !read? {
                    self.codec.send(None).map_err(DecodeError::Decode)?;
                    self.draining = true;
                    break;
                }
                if self.packet.stream_index() != self.stream.index {
                    continue;
                }
                self.stats.bytes_read += self.packet.size() as u64;
                if self.image && self.stream.codec_id == ffmpeg_sys_next::AVCodecID::AV_CODEC_ID_MJPEG {
                    // FFmpeg's JPEG decoder quietly "emulates" a missing end-of-image marker and
                    // returns a partly grey picture; a cut file must fail instead.
                    let d = self.packet.data();
                    let end = d.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
                    if !d[..end].ends_with(&[0xFF, 0xD9]) {
                        return Err(DecodeError::TruncatedImage);
                    }
                }
                let dts = self.packet.dts();
                if dts.is_some() {
                    self.position = dts;
                }
                if self.first_dts_after_seek.is_none() {
                    self.first_dts_after_seek = dts;
                }
                if !self.codec.send(Some(&mut self.packet)).map_err(DecodeError::Decode)? {
                    // The API promises input is accepted after receive asked for it; refusing
                    // twice would loop forever, so treat it as a decoder failure.
                    return Err(DecodeError::Decode(AvError {
                        call: "avcodec_send_packet (refused input)",
                        code: ffmpeg_sys_next::AVERROR_BUG,
                    }));
                }
                break;
            }
        }
    }

    fn scale(&mut self, use_last: bool, out: &mut [u8], shape: &Shape) -> Result<(), DecodeError> {
        let f = if use_last { &self.last } else { &self.frame };
        let (w, h, fmt) = (f.width(), f.height(), f.format());
        let pos = match self.scalers.iter().position(|s| s.fits(w, h, fmt)) {
            Some(p) => p,
            None => {
                if ffmpeg::pixel_format(fmt).is_none() {
                    return Err(DecodeError::PixelFormat { format: ffmpeg::pixel_format_name(fmt) });
                }
                let s = Scaler::new(w, h, fmt, shape.width, shape.height).map_err(|e| {
                    if e.call == "sws_isSupportedInput" {
                        DecodeError::PixelFormat { format: ffmpeg::pixel_format_name(fmt) }
                    } else {
                        DecodeError::Scale(e)
                    }
                })?;
                self.scalers.push(s);
                self.scalers.len() - 1
            }
        };
        let f = if use_last { &self.last } else { &self.frame };
        self.scalers[pos].scale_into(f, out).map_err(DecodeError::Scale)
    }

    /// Seeks so that decoding forward reaches the first frame at or after `t` (seconds, exact),
    /// checking that the keyframe it lands on is not already past `t` (then it steps back).
    /// `Ok(true)` when a decoded frame is left in `self.frame` for the caller to look at.
    fn seek_before(&mut self, t: Ratio) -> Result<bool, DecodeError> {
        let tb = self.stream.time_base;
        // Target in stream ticks: start + floor(t / tb).
        let ticks = t.num * tb.1 as i128 / (t.den * tb.0 as i128);
        let mut ts = (self.start as i128 + ticks).clamp(i64::MIN as i128 / 2, i64::MAX as i128 / 2) as i64;
        for attempt in 0..6 {
            let to = if attempt == 5 { i64::MIN / 2 } else { ts };
            self.input.seek_backward(self.stream.index, to).map_err(DecodeError::Demux)?;
            self.stats.seeks += 1;
            self.codec.flush();
            self.draining = false;
            self.first_dts_after_seek = None;
            self.position = None;
            if !self.next_frame()? {
                return Ok(false);
            }
            let pts =
                self.frame.pts().ok_or(DecodeError::MissingPts { frame: self.stats.frames_decoded - 1 })?;
            if time_of(pts, self.start, tb).cmp_exact(&t).is_le() || attempt == 5 {
                // Give the frame back to the caller's loop: it becomes the pending frame.
                return Ok(true);
            }
            match self.first_dts_after_seek {
                Some(d) if d < ts => ts = d - 1,
                _ => ts = ts.saturating_sub(1),
            }
            self.stats.frames_discarded += 1;
        }
        Ok(false)
    }

    /// Decodes the protocol's sampled frames into `out` (exactly [`Decoder::shape`]`.bytes()`
    /// long), packed RGB24 `[F, H', W', 3]`: [`Decoder::decode_range_into`] of the whole range.
    pub fn decode_into(
        &mut self,
        params: &Params,
        strategy: Strategy,
        out: &mut [u8],
    ) -> Result<Decoded, DecodeError> {
        let frames = self.shape(params)?.frames;
        self.decode_range_into(params, strategy, FrameRange::whole(frames), out)
    }

    /// Decodes the sampled frames of targets `range.start..range.end` into `out` (exactly
    /// `range.len()` frames of [`Decoder::shape`]), packed RGB24 `[range.len(), H', W', 3]`:
    /// the same bytes as those frames of the whole decode, so pieces decoded apart and
    /// concatenated in order give the whole tensor.
    ///
    /// A range that does not start at 0 first seeks to the keyframe before `t_start` (checking
    /// it lands at or before `t_start`), then goes on with `strategy`. Where the stream ends
    /// before a target, the remaining targets take the last decoded frame, as in the whole
    /// decode. An image has only the range `0..1`; an empty range or one past `F` is
    /// [`DecodeError::BadRange`].
    pub fn decode_range_into(
        &mut self,
        params: &Params,
        strategy: Strategy,
        range: FrameRange,
        out: &mut [u8],
    ) -> Result<Decoded, DecodeError> {
        let whole = self.shape(params)?;
        let f = whole.frames;
        if range.is_empty() || range.end > f {
            return Err(DecodeError::BadRange { start: range.start, end: range.end, frames: f });
        }
        let shape = Shape { frames: range.len(), ..whole };
        if out.len() != shape.bytes() {
            return Err(DecodeError::BufferSize { need: shape.bytes(), have: out.len() });
        }
        let fb = shape.frame_bytes();
        let tb = self.stream.time_base;
        let strategy = if self.image { Strategy::Scan } else { strategy };
        let mut timestamps = Vec::with_capacity(shape.frames as usize);
        if self.image {
            if !self.next_frame()? {
                return Err(DecodeError::NoFrames);
            }
            self.scale(false, out, &shape)?;
            timestamps.push(0.0);
            return Ok(Decoded { shape, timestamps_s: timestamps, stats: self.stats, strategy });
        }
        let duration = self.duration.ok_or(DecodeError::NoDuration)?;
        // Target i goes to slot i − range.start of `out`.
        let slot = |i: u32| (i - range.start) as usize;
        // The last decoded frame lives in `self.last`; `last_slot` says where it was written.
        let mut have_last: Option<Ratio> = None;
        let mut last_slot: Option<usize> = None;
        // A frame decoded by a seek check, not yet looked at.
        let mut pending = false;
        // A later piece starts at the keyframe before its first target.
        let mut seek_first = range.start > 0;
        if strategy == Strategy::Seek && !seek_first {
            self.read_seek_index()?;
        }
        let mut i = range.start;
        'targets: while i < range.end {
            let t = target(i, f, duration);
            if let (Some(lt), Some(s)) = (have_last, last_slot) {
                if lt.cmp_exact(&t).is_ge() {
                    // The frame chosen for the previous target is also the first at or after t.
                    out.copy_within(s * fb..(s + 1) * fb, slot(i) * fb);
                    timestamps.push(lt.to_f64());
                    last_slot = Some(slot(i));
                    i += 1;
                    continue;
                }
            }
            if std::mem::take(&mut seek_first) || (strategy == Strategy::Seek && self.should_seek(t)) {
                pending = self.seek_before(t)?;
            }
            loop {
                if !pending && !self.next_frame()? {
                    break 'targets;
                }
                pending = false;
                let n = self.stats.frames_decoded - 1;
                let pts = self.frame.pts().ok_or(DecodeError::MissingPts { frame: n })?;
                let time = time_of(pts, self.start, tb);
                if time.cmp_exact(&t).is_ge() {
                    self.scale(false, &mut out[slot(i) * fb..(slot(i) + 1) * fb], &shape)?;
                    timestamps.push(time.to_f64());
                    std::mem::swap(&mut self.frame, &mut self.last);
                    have_last = Some(time);
                    last_slot = Some(slot(i));
                    i += 1;
                    continue 'targets;
                }
                self.stats.frames_discarded += 1;
                std::mem::swap(&mut self.frame, &mut self.last);
                have_last = Some(time);
                last_slot = None;
            }
        }
        if i < range.end {
            // The stream ended first: the remaining targets take the last decoded frame.
            let Some(lt) = have_last else { return Err(DecodeError::NoFrames) };
            self.check_end(lt)?;
            let first = match last_slot {
                Some(s) => s,
                None => {
                    self.stats.frames_discarded = self.stats.frames_discarded.saturating_sub(1);
                    self.scale(true, &mut out[slot(i) * fb..(slot(i) + 1) * fb], &shape)?;
                    timestamps.push(lt.to_f64());
                    i += 1;
                    slot(i) - 1
                }
            };
            while i < range.end {
                out.copy_within(first * fb..(first + 1) * fb, slot(i) * fb);
                timestamps.push(lt.to_f64());
                i += 1;
            }
        }
        Ok(Decoded { shape, timestamps_s: timestamps, stats: self.stats, strategy })
    }

    /// A stream that stops well short of its stated duration is damaged or truncated, even
    /// where the demuxer reports a clean end (Matroska does). A whole file ends one frame
    /// interval before its duration; allow half a second, or three frame intervals for slow
    /// streams.
    fn check_end(&self, last: Ratio) -> Result<(), DecodeError> {
        let Some(duration) = self.duration else { return Ok(()) };
        let end_gap =
            Ratio { num: duration.num * last.den - last.num * duration.den, den: duration.den * last.den };
        let (rn, rd) = self.stream.avg_frame_rate;
        let allowed = if rn > 0 && rd > 0 && 6 * rd as i128 > rn as i128 {
            Ratio { num: 3 * rd as i128, den: rn as i128 }
        } else {
            Ratio { num: 1, den: 2 }
        };
        if end_gap.cmp_exact(&allowed).is_gt() {
            return Err(DecodeError::EndsEarly { last_s: last.to_f64(), duration_s: duration.to_f64() });
        }
        Ok(())
    }

    /// Before the first frame is read, has the demuxer read its seek index where it defers it
    /// (Matroska's cues, read at the first seek): without it [`Decoder::should_seek`] knows no
    /// keyframe ahead, and a seeking decode scans. Rewinds to the stream's start, so the decode
    /// that follows is the same as without it.
    fn read_seek_index(&mut self) -> Result<(), DecodeError> {
        let deferred = self.input.format_name().starts_with("matroska");
        if !deferred || self.stats.frames_decoded > 0 || self.stats.seeks > 0 {
            return Ok(());
        }
        self.input.read_seek_index(self.stream.index, self.start).map_err(DecodeError::Demux)?;
        self.stats.seeks += 1;
        self.codec.flush();
        self.draining = false;
        self.first_dts_after_seek = None;
        self.position = None;
        Ok(())
    }

    /// Whether a keyframe of the demuxer's index, shown at or before `t`, lies past the current
    /// position: the one FFmpeg's seek to `t` lands on.
    ///
    /// The index holds decode times (MP4) or presentation times (Matroska's cues); `t` is a
    /// presentation time. Where B-frames delay presentation, a keyframe is shown `shift` after
    /// it is decoded (the stream's start against its first decode time), and FFmpeg's MP4 seek
    /// lands on the keyframe *shown* at or before the time asked. Compared in decode times, a
    /// keyframe shown just after `t` passed for one before it, and the seek went back a whole
    /// GOP — to the file's start on short clips: seeking took up to 1.66× a scan's time a clip
    /// (`tests/seek_b_frames.rs`; `docs/measured.md`, "Seek or scan").
    fn should_seek(&self, t: Ratio) -> bool {
        let tb = self.stream.time_base;
        let ticks = t.num * tb.1 as i128 / (t.den * tb.0 as i128);
        let ts = (self.start as i128 + ticks).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        let entries = self.input.index_entries(self.stream.index);
        let first = entries.iter().map(|e| e.timestamp).min();
        let shift = first.map_or(0, |first| self.start.saturating_sub(first).max(0));
        let key = entries
            .iter()
            .filter(|e| e.keyframe && e.timestamp.saturating_add(shift) <= ts)
            .map(|e| e.timestamp)
            .max();
        // Compared in decode times: the last packet sent, or before the first the stream's start.
        match (key, self.position) {
            (Some(k), Some(p)) => k > p,
            (Some(k), None) => self.stats.frames_decoded == 0 && k > self.start.saturating_sub(shift),
            _ => false,
        }
    }

    /// Decodes every frame, keeping each in the decoder's native format (no scaling, no
    /// conversion): the work of `ffmpeg -threads 1 -i FILE -f null -`.
    pub fn decode_all_frames(&mut self) -> Result<AllFrames, DecodeError> {
        let tb = self.stream.time_base;
        let mut timestamps = Vec::new();
        let (mut width, mut height, mut fmt) = (0, 0, -1);
        let mut latest: Option<Ratio> = None;
        while self.next_frame()? {
            if timestamps.is_empty() {
                (width, height, fmt) = (self.frame.width(), self.frame.height(), self.frame.format());
            }
            let t = self.frame.pts().map(|p| time_of(p, self.start, tb));
            if let Some(t) = t {
                if latest.is_none_or(|l| t.cmp_exact(&l).is_gt()) {
                    latest = Some(t);
                }
            }
            timestamps.push(t.map_or(f64::NAN, |t| t.to_f64()));
        }
        if timestamps.is_empty() {
            return Err(DecodeError::NoFrames);
        }
        if let (false, Some(l)) = (self.image, latest) {
            self.check_end(l)?;
        }
        Ok(AllFrames {
            frames: timestamps.len() as u64,
            width,
            height,
            pix_fmt: ffmpeg::pixel_format_name(fmt),
            timestamps_s: timestamps,
            stats: self.stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::pictures_held;
    use ffmpeg_sys_next::AVCodecID::*;

    #[test]
    fn reference_pictures_follow_each_codecs_level_limits() {
        // H.264 level 4.0: MaxDpbMbs 32 768 over 120 × 68 macroblocks of 1080p.
        assert_eq!(pictures_held(AV_CODEC_ID_H264, 40, 1920, 1080), 4);
        // HEVC level 4 (general_level_idc 120): 1080p fills more than 3/4 of MaxLumaPs,
        // 960 × 540 at most a quarter of it.
        assert_eq!(pictures_held(AV_CODEC_ID_HEVC, 120, 1920, 1080), 6);
        assert_eq!(pictures_held(AV_CODEC_ID_HEVC, 120, 960, 540), 16);
        assert_eq!(pictures_held(AV_CODEC_ID_HEVC, 120, 1280, 720), 12);
        // Unknown levels assume the most any level allows.
        assert_eq!(pictures_held(AV_CODEC_ID_HEVC, -99, 64, 64), 16);
        assert_eq!(pictures_held(AV_CODEC_ID_AV1, -99, 1920, 1080), 8);
    }
}
