//! Decoded pictures (`AVFrame`) and compressed packets (`AVPacket`), owned.

use std::ptr::NonNull;

use ffmpeg_sys_next as ff;

use super::{check, AvError};

/// A decoded picture (`AVFrame`), reference-counted by FFmpeg. Freed on drop.
pub struct Frame {
    ptr: NonNull<ff::AVFrame>,
}

// SAFETY: an AVFrame and the buffers it references are plain heap data with atomic reference
// counts; nothing ties them to a thread. `&mut self` guards every mutation.
unsafe impl Send for Frame {}

impl Frame {
    /// Allocates an empty frame (`av_frame_alloc`).
    pub fn new() -> Result<Frame, AvError> {
        // SAFETY: av_frame_alloc has no preconditions; it returns NULL when out of memory.
        let raw = unsafe { ff::av_frame_alloc() };
        let ptr =
            NonNull::new(raw).ok_or(AvError { call: "av_frame_alloc", code: ff::AVERROR(libc::ENOMEM) })?;
        Ok(Frame { ptr })
    }

    /// Allocates a frame that owns a picture buffer of `width`×`height` in `format`, with
    /// FFmpeg's default row alignment and padding (`av_frame_get_buffer`).
    pub fn with_buffer(width: u32, height: u32, format: ff::AVPixelFormat) -> Result<Frame, AvError> {
        let frame = Frame::new()?;
        let (w, h) = (to_c_int(width)?, to_c_int(height)?);
        // SAFETY: frame.ptr is a freshly allocated, empty frame that we own.
        unsafe {
            let f = frame.ptr.as_ptr();
            (*f).width = w;
            (*f).height = h;
            (*f).format = format as libc::c_int;
        }
        // SAFETY: width, height and format are set as av_frame_get_buffer requires; align 0 picks
        // the CPU's alignment.
        let ret = unsafe { ff::av_frame_get_buffer(frame.ptr.as_ptr(), 0) };
        check(ret, "av_frame_get_buffer")?;
        Ok(frame)
    }

    fn raw(&self) -> &ff::AVFrame {
        // SAFETY: ptr is non-null and owned by self for its whole life.
        unsafe { self.ptr.as_ref() }
    }

    /// Picture width in pixels.
    pub fn width(&self) -> u32 {
        self.raw().width.max(0) as u32
    }

    /// Picture height in pixels.
    pub fn height(&self) -> u32 {
        self.raw().height.max(0) as u32
    }

    /// FFmpeg's pixel-format number (-1 when none).
    pub fn format(&self) -> i32 {
        self.raw().format
    }

    /// Presentation timestamp in the stream's time base, when the frame has one.
    pub fn pts(&self) -> Option<i64> {
        let p = self.raw().pts;
        (p != ff::AV_NOPTS_VALUE).then_some(p)
    }

    /// Whether the decoder flagged the frame as damaged (`AV_FRAME_FLAG_CORRUPT` or a non-zero
    /// `decode_error_flags`).
    pub fn is_corrupt(&self) -> bool {
        let f = self.raw();
        (f.flags & ff::AV_FRAME_FLAG_CORRUPT) != 0 || f.decode_error_flags != 0
    }

    /// Plane pointers and strides, for the scaler.
    pub(crate) fn planes(&self) -> ([*const u8; 8], [libc::c_int; 8]) {
        let f = self.raw();
        (f.data.map(|p| p as *const u8), f.linesize)
    }

    /// Mutable plane pointers and strides, for a frame that owns its buffer.
    pub(crate) fn planes_mut(&mut self) -> ([*mut u8; 8], [libc::c_int; 8]) {
        let f = self.raw();
        (f.data, f.linesize)
    }

    /// Raw pointer, for the codec context of this layer.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut ff::AVFrame {
        self.ptr.as_ptr()
    }

    /// Drops the picture this frame references (`av_frame_unref`).
    pub fn unref(&mut self) {
        // SAFETY: ptr is a valid frame; unref on an empty frame is a no-op.
        unsafe { ff::av_frame_unref(self.ptr.as_ptr()) };
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        let mut raw = self.ptr.as_ptr();
        // SAFETY: raw came from av_frame_alloc and is freed exactly once, here.
        unsafe { ff::av_frame_free(&mut raw) };
    }
}

/// A compressed packet (`AVPacket`). Freed on drop.
pub struct Packet {
    ptr: NonNull<ff::AVPacket>,
}

// SAFETY: as for Frame: reference-counted heap data, mutated only through `&mut self`.
unsafe impl Send for Packet {}

impl Packet {
    /// Allocates an empty packet (`av_packet_alloc`).
    pub fn new() -> Result<Packet, AvError> {
        // SAFETY: no preconditions; NULL when out of memory.
        let raw = unsafe { ff::av_packet_alloc() };
        let ptr =
            NonNull::new(raw).ok_or(AvError { call: "av_packet_alloc", code: ff::AVERROR(libc::ENOMEM) })?;
        Ok(Packet { ptr })
    }

    fn raw(&self) -> &ff::AVPacket {
        // SAFETY: ptr is non-null and owned by self.
        unsafe { self.ptr.as_ref() }
    }

    /// Index of the stream the packet belongs to.
    pub fn stream_index(&self) -> usize {
        self.raw().stream_index.max(0) as usize
    }

    /// Payload size in bytes.
    pub fn size(&self) -> usize {
        self.raw().size.max(0) as usize
    }

    /// The payload bytes.
    pub fn data(&self) -> &[u8] {
        let p = self.raw();
        if p.data.is_null() || p.size <= 0 {
            return &[];
        }
        // SAFETY: a filled packet's data points to `size` readable bytes that live as long as
        // the packet's reference, which `&self` keeps.
        unsafe { std::slice::from_raw_parts(p.data, p.size as usize) }
    }

    /// Presentation timestamp, when known.
    pub fn pts(&self) -> Option<i64> {
        let t = self.raw().pts;
        (t != ff::AV_NOPTS_VALUE).then_some(t)
    }

    /// Decoding timestamp, when known.
    pub fn dts(&self) -> Option<i64> {
        let d = self.raw().dts;
        (d != ff::AV_NOPTS_VALUE).then_some(d)
    }

    /// Whether the packet starts at a keyframe.
    pub fn is_key(&self) -> bool {
        (self.raw().flags & ff::AV_PKT_FLAG_KEY) != 0
    }

    /// Raw pointer, for the demuxer and decoder of this layer.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut ff::AVPacket {
        self.ptr.as_ptr()
    }

    /// Drops the payload this packet references (`av_packet_unref`).
    pub fn unref(&mut self) {
        // SAFETY: ptr is a valid packet; unref on an empty packet is a no-op.
        unsafe { ff::av_packet_unref(self.ptr.as_ptr()) };
    }
}

impl Drop for Packet {
    fn drop(&mut self) {
        let mut raw = self.ptr.as_ptr();
        // SAFETY: raw came from av_packet_alloc and is freed exactly once, here.
        unsafe { ff::av_packet_free(&mut raw) };
    }
}

pub(crate) fn to_c_int(v: u32) -> Result<libc::c_int, AvError> {
    libc::c_int::try_from(v)
        .map_err(|_| AvError { call: "dimension out of range", code: ff::AVERROR(libc::EINVAL) })
}
