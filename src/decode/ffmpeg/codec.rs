//! A video or image decoder (`AVCodecContext`), owned.

use std::ptr::{self, NonNull};

use ffmpeg_sys_next as ff;

use super::{check, AvError, AvErrorKind, Frame, Input, Packet};

/// An opened decoder for one stream of an [`Input`]. Freed on drop.
pub struct CodecContext {
    ctx: NonNull<ff::AVCodecContext>,
}

// SAFETY: an AVCodecContext opened with one thread has no thread affinity; FFmpeg forbids only
// concurrent use, which `&mut self` on every call (and no `Sync`) prevents.
unsafe impl Send for CodecContext {}

/// What [`CodecContext::receive`] produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// A frame was written.
    Frame,
    /// The decoder needs more packets.
    NeedInput,
    /// The decoder is drained.
    Eof,
}

impl CodecContext {
    /// Opens the decoder of stream `index` of `input`, single-threaded (the protocol's CPU
    /// budget counts one core per worker), with the stream's time base as packet time base.
    pub fn open(input: &Input, index: usize) -> Result<CodecContext, AvError> {
        Self::open_within(input, index, None)
    }

    /// [`CodecContext::open`], refusing pictures of more than `max_pixels` (FFmpeg's option of
    /// that name): a stream whose pictures outgrow what its header said fails to decode instead
    /// of taking memory the pool's budget did not grant.
    pub fn open_within(
        input: &Input,
        index: usize,
        max_pixels: Option<u64>,
    ) -> Result<CodecContext, AvError> {
        let not_found = AvError { call: "avcodec_find_decoder", code: ff::AVERROR_DECODER_NOT_FOUND };
        let (par, time_base) = input
            .codecpar(index)
            .ok_or(AvError { call: "stream lookup", code: ff::AVERROR_STREAM_NOT_FOUND })?;
        // SAFETY: par points to the stream's codec parameters, valid while `input` lives.
        let codec = unsafe { ff::avcodec_find_decoder((*par).codec_id) };
        if codec.is_null() {
            return Err(not_found);
        }
        // SAFETY: codec is a valid static decoder description.
        let raw = unsafe { ff::avcodec_alloc_context3(codec) };
        let ctx = NonNull::new(raw)
            .ok_or(AvError { call: "avcodec_alloc_context3", code: ff::AVERROR(libc::ENOMEM) })?;
        let this = CodecContext { ctx };
        // SAFETY: ctx is a fresh context we own; par is valid (see above).
        let ret = unsafe { ff::avcodec_parameters_to_context(ctx.as_ptr(), par) };
        check(ret, "avcodec_parameters_to_context")?;
        // SAFETY: ctx is valid and not yet opened; these are plain option fields.
        unsafe {
            let c = ctx.as_ptr();
            (*c).thread_count = 1;
            (*c).thread_type = 0;
            (*c).pkt_timebase = ff::AVRational { num: time_base.0, den: time_base.1 };
            if let Some(px) = max_pixels {
                (*c).max_pixels = px.clamp(1, i32::MAX as u64) as i64;
            }
        }
        // SAFETY: ctx was allocated for codec; NULL options are allowed.
        let ret = unsafe { ff::avcodec_open2(ctx.as_ptr(), codec, ptr::null_mut()) };
        check(ret, "avcodec_open2")?;
        Ok(this)
    }

    /// Feeds one packet (`avcodec_send_packet`); `None` starts draining. `Ok(false)` means the
    /// decoder is full: receive frames, then send the same packet again.
    pub fn send(&mut self, packet: Option<&mut Packet>) -> Result<bool, AvError> {
        let p = packet.map_or(ptr::null_mut(), |p| p.as_mut_ptr());
        // SAFETY: ctx is an open decoder; p is a valid packet or NULL (drain).
        let ret = unsafe { ff::avcodec_send_packet(self.ctx.as_ptr(), p) };
        match check(ret, "avcodec_send_packet") {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == AvErrorKind::Again => Ok(false),
            // Draining an already drained decoder: nothing more will come.
            Err(e) if e.kind() == AvErrorKind::Eof => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Takes the next decoded frame, if one is ready (`avcodec_receive_frame`).
    pub fn receive(&mut self, frame: &mut Frame) -> Result<Received, AvError> {
        // SAFETY: ctx is an open decoder; frame is a valid frame (unref'd by the call).
        let ret = unsafe { ff::avcodec_receive_frame(self.ctx.as_ptr(), frame.as_mut_ptr()) };
        match check(ret, "avcodec_receive_frame") {
            Ok(_) => Ok(Received::Frame),
            Err(e) if e.kind() == AvErrorKind::Again => Ok(Received::NeedInput),
            Err(e) if e.kind() == AvErrorKind::Eof => Ok(Received::Eof),
            Err(e) => Err(e),
        }
    }

    /// The stream's level as the header states it (FFmpeg's `level`; `-99` when unknown).
    pub fn level(&self) -> i32 {
        // SAFETY: ctx is a valid context; a plain field read.
        unsafe { (*self.ctx.as_ptr()).level }
    }

    /// Forgets buffered packets and frames, e.g. after a seek (`avcodec_flush_buffers`).
    pub fn flush(&mut self) {
        // SAFETY: ctx is an open decoder.
        unsafe { ff::avcodec_flush_buffers(self.ctx.as_ptr()) };
    }
}

impl Drop for CodecContext {
    fn drop(&mut self) {
        let mut raw = self.ctx.as_ptr();
        // SAFETY: raw came from avcodec_alloc_context3 and is freed exactly once, here (this also
        // closes the decoder when it was opened).
        unsafe { ff::avcodec_free_context(&mut raw) };
    }
}
