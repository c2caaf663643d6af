//! An opened media file: FFmpeg's `AVFormatContext`, owned.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use ffmpeg_sys_next as ff;

use super::io::WindowIo;
use super::{check, init, AvError, Packet};
use crate::shard::location::Window;

/// What the container says about one stream, copied out of FFmpeg's structs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's index in the container.
    pub index: usize,
    /// FFmpeg's codec id.
    pub codec_id: ff::AVCodecID,
    /// Coded width (0 when the header does not say).
    pub width: u32,
    /// Coded height (0 when the header does not say).
    pub height: u32,
    /// Time base of the stream's timestamps, `(num, den)`.
    pub time_base: (i32, i32),
    /// First presentation time, in `time_base` units.
    pub start_time: Option<i64>,
    /// Duration in `time_base` units, when the stream states one (> 0).
    pub duration: Option<i64>,
    /// Frame count from the container (0 when not stated).
    pub nb_frames: i64,
    /// Average frame rate `(num, den)`, `(0, x)` when unknown.
    pub avg_frame_rate: (i32, i32),
    /// Real base frame rate `(num, den)`, `(0, x)` when unknown.
    pub r_frame_rate: (i32, i32),
    /// Stream bit rate (0 when not stated).
    pub bit_rate: i64,
    /// FFmpeg's pixel-format number as the header states it (-1 when unknown).
    pub pix_fmt: i32,
}

/// An open input file (demuxer). Closed on drop.
pub struct Input {
    ctx: NonNull<ff::AVFormatContext>,
    path: PathBuf,
    /// When FFmpeg's own loops must give up ([`Input::set_deadline`]): read by the interrupt
    /// callback through the context's `opaque` pointer, so boxed (it must not move) and dropped
    /// after the context (field order).
    deadline: Box<Deadline>,
    /// The I/O context of an input opened on a window ([`Input::open_window`]): freed after
    /// the format context is closed (`Drop` closes it before any field is dropped).
    _io: Option<WindowIo>,
}

/// A deadline FFmpeg's interrupt callback reads: nanoseconds after [`epoch`], `u64::MAX` for none.
struct Deadline(AtomicU64);

/// The process's reference instant for [`Deadline`]s.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// FFmpeg's interrupt callback: non-zero once the input's deadline has passed, which makes the
/// blocking loops inside FFmpeg (probing, resyncing, reading) return `AVERROR_EXIT`.
unsafe extern "C" fn interrupted(opaque: *mut c_void) -> c_int {
    if opaque.is_null() {
        return 0;
    }
    // SAFETY: opaque is the Deadline boxed in the Input that owns the context calling us; the
    // box outlives the context (it is dropped after it) and is only read here, atomically.
    let deadline = unsafe { &*opaque.cast::<Deadline>() };
    let at = deadline.0.load(Ordering::Relaxed);
    c_int::from(at != u64::MAX && epoch().elapsed().as_nanos() as u64 >= at)
}

// SAFETY: an AVFormatContext is not tied to the thread that opened it; FFmpeg only forbids
// concurrent use, which `&mut self` on every mutating method (and no `Sync`) prevents.
unsafe impl Send for Input {}

/// The demuxers FFmpeg may use: the containers DataHelix supports (MP4/MOV, Matroska/WebM, and
/// JPEG/PNG images), nothing else of the hundreds FFmpeg would otherwise probe a file as.
pub const FORMAT_WHITELIST: &CStr = c"mov,mp4,matroska,webm,image2,jpeg_pipe,png_pipe";
/// The protocols FFmpeg may use: local files only (no network, no `concat:`, no `subfile,`).
pub const PROTOCOL_WHITELIST: &CStr = c"file";

impl Input {
    /// Opens `path` and reads its container header (`avformat_open_input`), with FFmpeg limited
    /// to `FORMAT_WHITELIST` and `PROTOCOL_WHITELIST`: any other container or protocol is an
    /// error, whatever the file's bytes or name say.
    pub fn open(path: &Path) -> Result<Input, AvError> {
        Input::open_with(path, None)
    }

    /// [`Input::open`] of the bytes of `window` (a member of a tar or zip shard, from `path`),
    /// read as if they were the whole file: FFmpeg reads through a custom I/O context that
    /// never leaves the window.
    pub fn open_window(path: &Path, window: Window) -> Result<Input, AvError> {
        Input::open_with(path, Some(WindowIo::new(window)?))
    }

    fn open_with(path: &Path, mut io: Option<WindowIo>) -> Result<Input, AvError> {
        init();
        let c_path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| AvError {
            call: "avformat_open_input (path holds a NUL byte)",
            code: ff::AVERROR(libc::EINVAL),
        })?;
        let mut options: *mut ff::AVDictionary = ptr::null_mut();
        for (key, value) in
            [(c"format_whitelist", FORMAT_WHITELIST), (c"protocol_whitelist", PROTOCOL_WHITELIST)]
        {
            // SAFETY: options is a valid dictionary out-pointer (NULL or one av_dict_set made);
            // key and value are static NUL-terminated strings, copied by FFmpeg.
            let ret = unsafe { ff::av_dict_set(&mut options, key.as_ptr(), value.as_ptr(), 0) };
            if ret < 0 {
                // SAFETY: options is NULL or a dictionary av_dict_set allocated; freed once.
                unsafe { ff::av_dict_free(&mut options) };
                return Err(AvError { call: "av_dict_set (whitelists)", code: ret });
            }
        }
        let deadline = Box::new(Deadline(AtomicU64::new(u64::MAX)));
        // SAFETY: avformat_alloc_context returns a new context or NULL.
        let mut raw: *mut ff::AVFormatContext = unsafe { ff::avformat_alloc_context() };
        if raw.is_null() {
            // SAFETY: options is NULL or a dictionary av_dict_set allocated; freed once.
            unsafe { ff::av_dict_free(&mut options) };
            return Err(AvError { call: "avformat_alloc_context", code: ff::AVERROR(libc::ENOMEM) });
        }
        // SAFETY: raw is a live context; the callback and its opaque pointer (the boxed deadline,
        // which the Input keeps alive beyond the context) are what FFmpeg calls in its loops.
        unsafe {
            (*raw).interrupt_callback.callback = Some(interrupted);
            (*raw).interrupt_callback.opaque = (&*deadline as *const Deadline).cast_mut().cast::<c_void>();
        }
        if let Some(io) = io.as_mut() {
            // SAFETY: raw is a live context; io outlives it (the Input drops it after closing
            // the context, and on a failed open FFmpeg frees the context but leaves a custom
            // pb to us). With a pb set FFmpeg opens no file or protocol itself.
            unsafe {
                (*raw).pb = io.as_mut_ptr();
                (*raw).flags |= ff::AVFMT_FLAG_CUSTOM_IO;
            }
        }
        // SAFETY: raw is a context allocated above (FFmpeg takes it over); c_path is NUL-terminated
        // and outlives the call; a NULL format asks FFmpeg to probe (among the whitelisted
        // formats); options is a dictionary it consumes the entries it knows from. On failure
        // FFmpeg frees the context and leaves NULL.
        let ret = unsafe { ff::avformat_open_input(&mut raw, c_path.as_ptr(), ptr::null(), &mut options) };
        // SAFETY: options is NULL or the dictionary of left-over entries; freed once.
        unsafe { ff::av_dict_free(&mut options) };
        if ret == ff::AVERROR(libc::EINVAL) {
            // What FFmpeg answers for a container (or protocol) off the whitelists.
            return Err(AvError {
                call: "avformat_open_input (not a supported container: MP4/MOV, Matroska/WebM, JPEG or PNG)",
                code: ff::AVERROR_INVALIDDATA,
            });
        }
        check(ret, "avformat_open_input")?;
        let ctx = NonNull::new(raw).ok_or(AvError {
            call: "avformat_open_input (returned NULL)",
            code: ff::AVERROR(libc::ENOMEM),
        })?;
        Ok(Input { ctx, path: path.to_path_buf(), deadline, _io: io })
    }

    /// From now on FFmpeg's own loops on this input give up (`AVERROR_EXIT`) once `at` passes.
    pub fn set_deadline(&self, at: Instant) {
        let nanos = at.saturating_duration_since(epoch()).as_nanos().min(u64::MAX as u128 - 1) as u64;
        self.deadline.0.store(nanos, Ordering::Relaxed);
    }

    /// The path this input was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn ctx(&self) -> &ff::AVFormatContext {
        // SAFETY: ctx is non-null and owned by self for its whole life.
        unsafe { self.ctx.as_ref() }
    }

    /// Raw context pointer, for other modules of this safe layer (decoders need it).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut ff::AVFormatContext {
        self.ctx.as_ptr()
    }

    /// Reads packets to fill in what the header lacks (`avformat_find_stream_info`). Costly: it
    /// decodes the first frames. Call only when a field is missing.
    pub fn find_stream_info(&mut self) -> Result<(), AvError> {
        self.find_stream_info_within(None)
    }

    /// [`Input::find_stream_info`], with the decoders it opens refusing pictures of more than
    /// `max_pixels` (their `max_pixels` option): probing an image decodes it whole, and a huge
    /// one must not take memory the pool's budget did not grant. A refused picture leaves its
    /// pixel format unknown; the call still succeeds.
    pub fn find_stream_info_within(&mut self, max_pixels: Option<u64>) -> Result<(), AvError> {
        let n = self.ctx().nb_streams as usize;
        let mut options: Vec<*mut ff::AVDictionary> = vec![ptr::null_mut(); n];
        if let Some(px) = max_pixels {
            let value = CString::new(px.clamp(1, i32::MAX as u64).to_string()).expect("digits");
            for o in &mut options {
                // SAFETY: o is a NULL or valid dictionary pointer; key and value are C strings
                // copied by the call (flags 0).
                let ret = unsafe { ff::av_dict_set(o, c"max_pixels".as_ptr(), value.as_ptr(), 0) };
                if ret < 0 {
                    free_dicts(&mut options);
                    return check(ret, "av_dict_set").map(|_| ());
                }
            }
        }
        let opts = if max_pixels.is_some() && n > 0 { options.as_mut_ptr() } else { ptr::null_mut() };
        // SAFETY: ctx is a valid open context; opts is NULL or an array of nb_streams
        // dictionaries, which the call may replace with the options it did not use.
        let ret = unsafe { ff::avformat_find_stream_info(self.ctx.as_ptr(), opts) };
        free_dicts(&mut options);
        check(ret, "avformat_find_stream_info").map(|_| ())
    }

    /// The demuxer's short name, e.g. `mov,mp4,m4a,3gp,3g2,mj2` or `matroska,webm`.
    pub fn format_name(&self) -> String {
        let fmt = self.ctx().iformat;
        if fmt.is_null() {
            return String::new();
        }
        // SAFETY: an opened context's iformat points to a static AVInputFormat whose name is a
        // static NUL-terminated string.
        unsafe { CStr::from_ptr((*fmt).name) }.to_string_lossy().into_owned()
    }

    /// Container duration in microseconds, when stated (> 0).
    pub fn duration_us(&self) -> Option<i64> {
        let d = self.ctx().duration;
        (d != ff::AV_NOPTS_VALUE && d > 0).then_some(d)
    }

    /// Container bit rate, when stated (> 0).
    pub fn bit_rate(&self) -> Option<i64> {
        let b = self.ctx().bit_rate;
        (b > 0).then_some(b)
    }

    fn stream_ptr(&self, index: usize) -> Option<*mut ff::AVStream> {
        let ctx = self.ctx();
        if index >= ctx.nb_streams as usize || ctx.streams.is_null() {
            return None;
        }
        // SAFETY: streams holds nb_streams valid pointers; index was bounds-checked above.
        let st = unsafe { *ctx.streams.add(index) };
        (!st.is_null()).then_some(st)
    }

    /// Index of the best video stream (`av_find_best_stream`), if any.
    pub fn best_video_stream(&self) -> Option<StreamInfo> {
        // SAFETY: ctx is valid; a NULL decoder out-pointer is allowed.
        let ret = unsafe {
            ff::av_find_best_stream(
                self.ctx.as_ptr(),
                ff::AVMediaType::AVMEDIA_TYPE_VIDEO,
                -1,
                -1,
                ptr::null_mut(),
                0,
            )
        };
        if ret < 0 {
            return None;
        }
        self.stream(ret as usize)
    }

    /// What the container says about stream `index`.
    pub fn stream(&self, index: usize) -> Option<StreamInfo> {
        let st = self.stream_ptr(index)?;
        // SAFETY: st is a valid stream of this open context; codecpar is allocated with the stream.
        let (st, par) = unsafe { (&*st, &*(*st).codecpar) };
        let positive = |v: i64| (v != ff::AV_NOPTS_VALUE && v > 0).then_some(v);
        Some(StreamInfo {
            index,
            codec_id: par.codec_id,
            width: par.width.max(0) as u32,
            height: par.height.max(0) as u32,
            time_base: (st.time_base.num, st.time_base.den),
            start_time: (st.start_time != ff::AV_NOPTS_VALUE).then_some(st.start_time),
            duration: positive(st.duration),
            nb_frames: st.nb_frames.max(0),
            avg_frame_rate: (st.avg_frame_rate.num, st.avg_frame_rate.den),
            r_frame_rate: (st.r_frame_rate.num, st.r_frame_rate.den),
            bit_rate: par.bit_rate.max(0),
            pix_fmt: par.format,
        })
    }

    /// The codec parameters and time base of stream `index`, for the decoder of this layer. The
    /// pointer stays valid while `self` lives.
    pub(crate) fn codecpar(&self, index: usize) -> Option<(*const ff::AVCodecParameters, (i32, i32))> {
        let st = self.stream_ptr(index)?;
        // SAFETY: st is a valid stream of this open context.
        let st = unsafe { &*st };
        (!st.codecpar.is_null()).then_some((st.codecpar as *const _, (st.time_base.num, st.time_base.den)))
    }

    /// Reads the next packet of any stream into `packet` (`av_read_frame`). `Ok(false)` at the
    /// end of the file; a damaged or truncated file is an error.
    pub fn read_packet(&mut self, packet: &mut Packet) -> Result<bool, AvError> {
        packet.unref();
        // SAFETY: ctx is an open context; packet is a valid, empty packet.
        let ret = unsafe { ff::av_read_frame(self.as_mut_ptr(), packet.as_mut_ptr()) };
        match check(ret, "av_read_frame") {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == super::AvErrorKind::Eof => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Seeks stream `index` to the last keyframe at or before `timestamp` (stream time base),
    /// `av_seek_frame` with `AVSEEK_FLAG_BACKWARD`.
    pub fn seek_backward(&mut self, index: usize, timestamp: i64) -> Result<(), AvError> {
        let idx = libc::c_int::try_from(index)
            .map_err(|_| AvError { call: "av_seek_frame", code: ff::AVERROR_STREAM_NOT_FOUND })?;
        // SAFETY: ctx is an open context; any timestamp is accepted (FFmpeg clamps or fails).
        let ret = unsafe { ff::av_seek_frame(self.ctx.as_ptr(), idx, timestamp, ff::AVSEEK_FLAG_BACKWARD) };
        check(ret, "av_seek_frame").map(|_| ())
    }

    /// Has the demuxer read its whole seek index, and rewinds stream `index` to its first
    /// keyframe: an `av_seek_frame` back to `start` (the stream's start, in its time base).
    ///
    /// FFmpeg's Matroska demuxer reads the file's cues only at the first seek, so until then a
    /// Matroska stream's [`Input::index_entries`] lists only the keyframes read so far — none
    /// after opening — where MP4's `moov` lists every sample from the start. Matroska with a
    /// single cue (one keyframe) reads its clusters to the end here, without decoding them; a
    /// file written without cues keeps an index of the keyframes read.
    pub fn read_seek_index(&mut self, index: usize, start: i64) -> Result<(), AvError> {
        self.seek_backward(index, start)
    }

    /// The demuxer's seek index of a stream: `(timestamp, byte position, size, is keyframe)` per
    /// entry. MP4 lists every sample, from the header alone; Matroska its cues (keyframes), read
    /// at the first seek ([`Input::read_seek_index`]).
    pub fn index_entries(&self, index: usize) -> Vec<IndexEntry> {
        let Some(st) = self.stream_ptr(index) else { return Vec::new() };
        // SAFETY: st is a valid stream of this open context.
        let n = unsafe { ff::avformat_index_get_entries_count(st) }.max(0);
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n {
            // SAFETY: i < the count FFmpeg just returned; the entry stays valid until the next
            // demuxer call, and we copy it out at once.
            let e = unsafe { ff::avformat_index_get_entry(st, i) };
            if e.is_null() {
                break;
            }
            // SAFETY: non-null entries point into the stream's index array.
            let e = unsafe { &*e };
            out.push(IndexEntry {
                timestamp: e.timestamp,
                pos: e.pos,
                size: e.size() as u32,
                keyframe: (e.flags() as i32 & ff::AVINDEX_KEYFRAME) != 0,
            });
        }
        out
    }
}

/// One entry of a demuxer's seek index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    /// Timestamp in the stream's time base.
    pub timestamp: i64,
    /// Byte position of the packet in the file.
    pub pos: i64,
    /// Packet size in bytes (0 when the demuxer does not know).
    pub size: u32,
    /// Whether decoding can start here.
    pub keyframe: bool,
}

impl Drop for Input {
    fn drop(&mut self) {
        let mut raw = self.ctx.as_ptr();
        // SAFETY: raw came from avformat_open_input and is closed exactly once, here.
        unsafe { ff::avformat_close_input(&mut raw) };
    }
}

/// Frees dictionaries FFmpeg handed back (NULL entries are skipped by `av_dict_free`).
fn free_dicts(dicts: &mut [*mut ff::AVDictionary]) {
    for d in dicts {
        // SAFETY: d is NULL or a dictionary this module made or FFmpeg returned to it.
        unsafe { ff::av_dict_free(d) };
    }
}
