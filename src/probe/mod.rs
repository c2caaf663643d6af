//! Reading a sample's [`Descriptor`] from its file, without decoding it.
//!
//! Images are read by their own headers ([`image`]); videos by FFmpeg's demuxer, which reads the
//! container header (`avformat_open_input`) — MP4's `moov`, Matroska's tracks and cues. Only when
//! the header lacks a field (MPEG-4 Part 2 in MP4 states no size) does the probe fall back to
//! `avformat_find_stream_info`, which decodes the first frames. A structural check of the
//! container ([`container`]) catches files cut off after an intact header.
//!
//! ```no_run
//! use datahelix::manifest::Entry;
//! use datahelix::probe::probe;
//!
//! let entry = Entry { id: 7, path: "videos/000007.mp4".into(), text_tokens: 32, line: 1, extra: None };
//! let d = probe(std::path::Path::new("data/tiny"), &entry);
//! println!("{} {}x{} {} frames: {}", d.codec, d.width, d.height, d.frames, d.status);
//! ```
//!
//! The probe never fails: a file that cannot be used yields a descriptor whose [`Status`] says
//! why.

pub mod container;
pub mod image;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use ffmpeg_sys_next::AVCodecID;

use crate::decode::ffmpeg::{AvError, AvErrorKind, IndexEntry, Input, StreamInfo};
use crate::descriptor::{Codec, Container, Descriptor, Modality, Status};
use crate::manifest::Entry;
use crate::shard::location::{MemberPath, Window};
use container::Structure;
use ffmpeg_sys_next as ff;

/// Largest width or height a descriptor accepts: what FFmpeg's decoders take (16384 for most).
pub const MAX_SIDE: u32 = 16_384;

/// Whether a manifest path stays inside the dataset folder (relative, no `..`).
pub fn is_safe_relative(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && !path.contains('\0')
}

/// Resolves the manifest path `rel` beneath the dataset folder `root` (canonical, as from
/// [`std::fs::canonicalize`]), following symbolic links: the file's canonical path, or why it
/// cannot be used — [`Status::BadPath`] (absolute, `..`, NUL), [`Status::OutsideDataset`] (a
/// link out of the folder), [`Status::Missing`] or [`Status::Unreadable`]. Index and decode both
/// resolve every path through here, so a link swapped after indexing is refused too.
pub fn resolve_beneath(root: &Path, rel: &str) -> Result<PathBuf, Status> {
    if !is_safe_relative(rel) {
        return Err(Status::BadPath);
    }
    let real = match std::fs::canonicalize(root.join(rel)) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Status::Missing),
        Err(_) => return Err(Status::Unreadable),
    };
    if !real.starts_with(root) {
        return Err(Status::OutsideDataset);
    }
    Ok(real)
}

/// File size and modification time (ns since the epoch), or the status that explains why not.
pub fn stat(path: &Path) -> Result<(u64, i64), Status> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Status::Missing),
        Err(_) => return Err(Status::Unreadable),
    };
    if !meta.is_file() {
        return Err(Status::Unreadable);
    }
    let mtime_ns = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0);
    Ok((meta.len(), mtime_ns))
}

/// Probes one manifest entry of the dataset in `dir`.
pub fn probe(dir: &Path, entry: &Entry) -> Descriptor {
    let mut d = Descriptor {
        id: entry.id,
        text_tokens: entry.text_tokens,
        manifest_line: entry.line,
        ..Descriptor::default()
    };
    // A member of a shard is probed in place (its byte range of a tar, or a zip member's
    // bytes, inflated when deflated).
    let member = MemberPath::parse(&entry.path);
    let path = match std::fs::canonicalize(dir)
        .map_err(|_| Status::Unreadable)
        .and_then(|root| resolve_beneath(&root, member.map_or(&entry.path, |m| m.shard)))
    {
        Ok(p) => p,
        Err(status) => {
            d.status = status;
            return d;
        }
    };
    match stat(&path) {
        Ok((bytes, mtime_ns)) => {
            d.bytes = member.map_or(bytes, |m| m.part.bytes());
            d.mtime_ns = mtime_ns;
            if member.is_some_and(|m| m.part.range.end().is_none_or(|e| e > bytes)) {
                d.status = Status::Truncated;
                return d;
            }
        }
        Err(status) => {
            d.status = status;
            return d;
        }
    }
    if d.bytes == 0 {
        d.status = Status::Empty;
        return d;
    }
    let part = member.map(|m| m.part);
    let opened = File::open(&path).and_then(|f| match part {
        Some(p) => Window::open(f, p),
        None => Window::whole(f),
    });
    let mut file = match opened {
        Ok(f) => f,
        Err(e) => {
            // A deflated member that does not inflate to what its header says is damaged.
            d.status = if e.kind() == std::io::ErrorKind::InvalidData {
                Status::Corrupt
            } else {
                Status::Unreadable
            };
            return d;
        }
    };
    let head = match read_head(&mut file, 64 * 1024) {
        Ok(h) => h,
        Err(_) => {
            d.status = Status::Unreadable;
            return d;
        }
    };
    if let Some(codec) = image::sniff(&head) {
        probe_image(&mut d, codec, &head, &mut file);
    } else {
        probe_video(&mut d, &path, part.is_some(), &head, &mut file);
    }
    d
}

fn read_head(file: &mut Window, max: usize) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(max);
    file.by_ref().take(max as u64).read_to_end(&mut head)?;
    Ok(head)
}

fn read_tail(file: &mut Window, len: u64, n: u64) -> std::io::Result<Vec<u8>> {
    let n = n.min(len);
    file.seek(SeekFrom::Start(len - n))?;
    let mut tail = Vec::with_capacity(n as usize);
    file.by_ref().take(n).read_to_end(&mut tail)?;
    Ok(tail)
}

fn probe_image(d: &mut Descriptor, codec: Codec, head: &[u8], file: &mut Window) {
    d.modality = Modality::Image;
    d.codec = codec;
    d.container = if codec == Codec::Jpeg { Container::Jpeg } else { Container::Png };
    d.frames = 1;
    let header = if codec == Codec::Jpeg { image::jpeg(head) } else { image::png(head) };
    let header = match header {
        Ok(h) => h,
        Err(image::ImageProblem::Truncated) if (head.len() as u64) < d.bytes => {
            // The SOF sits beyond the first 64 KiB (large EXIF): read the whole file.
            let mut all = Vec::new();
            let whole = file.seek(SeekFrom::Start(0)).and_then(|_| file.read_to_end(&mut all));
            match whole.ok().and_then(|_| image::jpeg(&all).ok()) {
                Some(h) => h,
                None => {
                    d.status = Status::Corrupt;
                    return;
                }
            }
        }
        Err(image::ImageProblem::Truncated) => {
            d.status = Status::Truncated;
            return;
        }
        Err(image::ImageProblem::Corrupt) => {
            d.status = Status::Corrupt;
            return;
        }
    };
    d.width = header.width;
    d.height = header.height;
    d.bit_rate = 0;
    let complete = match read_tail(file, d.bytes, 16) {
        Ok(tail) if codec == Codec::Jpeg => image::jpeg_complete(&tail),
        Ok(tail) => image::png_complete(&tail),
        Err(_) => false,
    };
    d.status = if !complete {
        Status::Truncated
    } else if !sides_ok(d.width, d.height) {
        Status::BadDimensions
    } else {
        Status::Ok
    };
}

/// Whether FFmpeg can decode a picture of `w` × `h`: both sides in `1..=MAX_SIDE`, and the
/// picture within `av_image_check_size`'s bound, `(8w + 1024)(h + 128) < i32::MAX` (a
/// 16384 × 16384 image passes the side test and fails this one, at every decode). Such files
/// are `bad_dimensions` at index time instead of failing at every epoch.
pub fn sides_ok(w: u32, h: u32) -> bool {
    let fits = (8 * w as u64 + 1024) * (h as u64 + 128) < i32::MAX as u64;
    (1..=MAX_SIDE).contains(&w) && (1..=MAX_SIDE).contains(&h) && fits
}

fn codec_of(id: AVCodecID) -> Codec {
    match id {
        AVCodecID::AV_CODEC_ID_H264 => Codec::H264,
        AVCodecID::AV_CODEC_ID_MPEG4 => Codec::Mpeg4,
        AVCodecID::AV_CODEC_ID_MJPEG => Codec::Jpeg,
        AVCodecID::AV_CODEC_ID_PNG => Codec::Png,
        AVCodecID::AV_CODEC_ID_HEVC => Codec::Hevc,
        AVCodecID::AV_CODEC_ID_VP9 => Codec::Vp9,
        AVCodecID::AV_CODEC_ID_AV1 => Codec::Av1,
        _ => Codec::Other,
    }
}

fn container_of(format_name: &str) -> Container {
    if format_name.starts_with("mov,mp4") {
        Container::Mp4
    } else if format_name.starts_with("matroska") {
        Container::Mkv
    } else {
        Container::Other
    }
}

fn structure_of(head: &[u8], file: &mut Window, len: u64) -> Structure {
    let checked = match container::sniff(head) {
        Some(Container::Mp4) => container::check_mp4(file, len),
        Some(Container::Mkv) => container::check_mkv(file, len),
        _ => Ok(Structure::Unknown),
    };
    checked.unwrap_or(Structure::Corrupt)
}

/// Probes the video `file` (from `path`; a shard's member when `member`, opened by FFmpeg from a
/// second window over the same bytes).
fn probe_video(d: &mut Descriptor, path: &Path, member: bool, head: &[u8], file: &mut Window) {
    let structure = structure_of(head, file, d.bytes);
    let known_container = container::sniff(head);
    d.container = known_container.unwrap_or(Container::Unknown);
    let opened = if member {
        file.try_clone()
            .map_err(|e| AvError {
                call: "dup (the shard)",
                code: ff::AVERROR(e.raw_os_error().unwrap_or(libc::EIO)),
            })
            .and_then(|w| Input::open_window(path, w))
    } else {
        Input::open(path)
    };
    let mut input = match opened {
        Ok(i) => i,
        Err(e) => {
            d.status = match (structure, known_container, e.kind()) {
                (Structure::Truncated, _, _) => Status::Truncated,
                (_, Some(_), _) => Status::Corrupt,
                (_, None, AvErrorKind::NotFound) => Status::Missing,
                (_, None, AvErrorKind::Io) => Status::Unreadable,
                _ => Status::NotMedia,
            };
            return;
        }
    };
    d.container = container_of(&input.format_name());
    let Some(mut stream) = input.best_video_stream() else {
        d.status = Status::NoVideoStream;
        return;
    };
    d.modality = Modality::Video;
    d.codec = codec_of(stream.codec_id);
    if stream.width == 0 || stream.height == 0 || fps_of(&stream).is_none() {
        // The header lacks a field (MPEG-4 Part 2 in MP4 states no size): read the first frames.
        if input.find_stream_info().is_ok() {
            if let Some(s) = input.stream(stream.index) {
                stream = s;
            }
        }
    }
    d.width = stream.width;
    d.height = stream.height;
    fill_timing(d, &input, &stream);
    let mut entries = input.index_entries(stream.index);
    if d.container == Container::Mkv {
        // Matroska's cues are read at the first seek: before it the index lists only the
        // keyframes read (none, or the first where a field was missing), the keyframe interval is
        // unknown, and the samples are never sought in nor split. A file whose seek fails keeps
        // what was read.
        if input.read_seek_index(stream.index, stream.start_time.unwrap_or(0)).is_ok() {
            entries = input.index_entries(stream.index);
            // Written without cues (live, to a pipe), the index lists only the keyframes read
            // while the seek settled, the last seemingly running to the stream's end: the
            // packets that follow say where the others are (demuxed, not decoded).
            let unlisted = keyframe_gaps(&entries, &stream, d).is_none_or(|(inner, last)| last > inner);
            if unlisted {
                entries.extend(keyframes_read(&mut input, stream.index, MKV_READ_LIMIT_BYTES));
            }
        }
    }
    d.keyint = keyint_of(&entries, &stream, d);
    if let Some(end) = index_end(&entries) {
        if end > d.bytes {
            d.status = Status::Truncated;
            return;
        }
    }
    d.status = if structure == Structure::Truncated {
        Status::Truncated
    } else if structure == Structure::Corrupt {
        Status::Corrupt
    } else if !d.codec.is_supported() {
        Status::UnsupportedCodec
    } else if !sides_ok(d.width, d.height) {
        Status::BadDimensions
    } else if d.duration_ticks <= 0 {
        Status::NoDuration
    } else {
        Status::Ok
    };
}

fn fps_of(s: &StreamInfo) -> Option<(u32, u32)> {
    let ok = |(n, d): (i32, i32)| (n > 0 && d > 0).then_some((n as u32, d as u32));
    ok(s.avg_frame_rate).or_else(|| ok(s.r_frame_rate))
}

/// Duration (exact, PROTOCOL.md's rule: the stream's, else the container's), fps, frames, bit rate.
fn fill_timing(d: &mut Descriptor, input: &Input, s: &StreamInfo) {
    let (tb_num, tb_den) = s.time_base;
    if let (Some(ticks), true) = (s.duration, tb_num > 0 && tb_den > 0) {
        d.duration_ticks = ticks;
        d.time_base_num = tb_num as u32;
        d.time_base_den = tb_den as u32;
    } else if let Some(us) = input.duration_us() {
        d.duration_ticks = us;
        d.time_base_num = 1;
        d.time_base_den = 1_000_000;
    }
    if let Some((n, den)) = fps_of(s) {
        d.fps_num = n;
        d.fps_den = den;
    }
    let duration = d.duration_s();
    d.frames = if s.nb_frames > 0 {
        s.nb_frames.min(u32::MAX as i64) as u32
    } else {
        // Matroska states no frame count: duration × fps.
        (duration * d.fps()).round().clamp(0.0, u32::MAX as f64) as u32
    };
    d.bit_rate = if s.bit_rate > 0 {
        s.bit_rate as u64
    } else if let Some(b) = input.bit_rate() {
        b as u64
    } else if duration > 0.0 {
        (d.bytes as f64 * 8.0 / duration) as u64
    } else {
        0
    };
}

/// Largest gap between keyframes, in frames, from the demuxer's seek index (0 when it has none,
/// or lists a single keyframe of a stream of unknown length). The last gap runs to the stream's
/// end: its start plus the descriptor's duration. The start is the stream's, or its first
/// keyframe's timestamp where that is earlier — MP4's index holds decode times, which B-frames put
/// before the first presentation time; measured from the presentation start, a single-keyframe
/// H.264 stream with B-frames read two frames longer than it is.
fn keyint_of(entries: &[IndexEntry], s: &StreamInfo, d: &Descriptor) -> u32 {
    let Some((inner, last)) = keyframe_gaps(entries, s, d) else { return 0 };
    let max_gap = inner.max(last);
    if max_gap < 0.5 {
        return 0;
    }
    max_gap.round().clamp(1.0, u32::MAX as f64) as u32
}

/// In frames, the longest gap between the keyframes the index lists, and the gap from the last
/// of them to the stream's end (0 when the duration is unknown); `None` without a listed
/// keyframe or a time base and frame rate to count with.
fn keyframe_gaps(entries: &[IndexEntry], s: &StreamInfo, d: &Descriptor) -> Option<(f64, f64)> {
    let (tb_num, tb_den) = s.time_base;
    let fps = d.fps();
    if tb_num <= 0 || tb_den <= 0 || fps <= 0.0 {
        return None;
    }
    let mut keys: Vec<i64> = entries.iter().filter(|e| e.keyframe).map(|e| e.timestamp).collect();
    keys.sort_unstable();
    keys.dedup();
    let (&first, &last) = (keys.first()?, keys.last()?);
    let ticks_to_frames = |t: i64| t as f64 * tb_num as f64 / tb_den as f64 * fps;
    let inner = keys.windows(2).map(|w| ticks_to_frames(w[1].saturating_sub(w[0]))).fold(0.0, f64::max);
    let start = s.start_time.map_or(first, |t| t.min(first));
    let frames = d.duration_s() * fps;
    let to_end = if frames > 0.0 { frames - ticks_to_frames(last.saturating_sub(start)) } else { 0.0 };
    Some((inner, to_end))
}

/// The most packet bytes the probe reads of a Matroska file whose index lists too few
/// keyframes: past it, the stretch after the last keyframe read counts as one gap (an
/// interval too long, never too short: the sample is scanned rather than sought in).
const MKV_READ_LIMIT_BYTES: usize = 64 << 20;

/// What a packet counts for at least against [`MKV_READ_LIMIT_BYTES`]: a file of empty blocks
/// ends the read after 2¹⁸ packets (2.4 hours of video at 30 fps), not at its end.
const MKV_PACKET_MIN_BYTES: usize = 256;

/// The keyframes of stream `index` among the packets read from where the demuxer stands, up to
/// `limit` bytes of packets (of every stream, each at least [`MKV_PACKET_MIN_BYTES`]) or the
/// first error, as index entries.
fn keyframes_read(input: &mut Input, index: usize, limit: usize) -> Vec<IndexEntry> {
    let Ok(mut packet) = crate::decode::ffmpeg::Packet::new() else { return Vec::new() };
    let (mut keys, mut read) = (Vec::new(), 0usize);
    while read < limit && matches!(input.read_packet(&mut packet), Ok(true)) {
        read += packet.size().max(MKV_PACKET_MIN_BYTES);
        if packet.stream_index() == index && packet.is_key() {
            if let Some(timestamp) = packet.pts().or(packet.dts()) {
                keys.push(IndexEntry { timestamp, pos: -1, size: 0, keyframe: true });
            }
        }
    }
    keys
}

/// The byte just past the last packet the seek index lists, when it lists sizes (MP4 does).
fn index_end(entries: &[IndexEntry]) -> Option<u64> {
    entries.iter().filter(|e| e.pos >= 0 && e.size > 0).map(|e| e.pos as u64 + e.size as u64).max()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the area bound, 16384 × 16384 was accepted (FFmpeg refuses it at every decode).
    #[test]
    fn sides_are_what_ffmpeg_decodes() {
        assert!(sides_ok(1920, 1080) && sides_ok(16_000, 16_000) && sides_ok(16_384, 1));
        assert!(!sides_ok(16_384, 16_384), "past av_image_check_size");
        assert!(!sides_ok(20_000, 100) && !sides_ok(0, 10) && !sides_ok(10, 0));
    }

    #[test]
    fn paths_must_stay_inside_the_dataset() {
        assert!(is_safe_relative("videos/a.mp4"));
        assert!(is_safe_relative("./a.mp4"));
        assert!(!is_safe_relative("../a.mp4"));
        assert!(!is_safe_relative("videos/../../etc/passwd"));
        assert!(!is_safe_relative("/etc/passwd"));
        assert!(!is_safe_relative(""));
    }
}
