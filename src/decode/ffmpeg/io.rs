//! FFmpeg reading a [`Window`] as if it were the whole file: a custom `AVIOContext` whose read
//! and seek callbacks never leave the window (a member of a tar or zip shard, in place or
//! inflated).

use std::ffi::{c_int, c_void};
use std::io::{Read, Seek, SeekFrom};
use std::ptr::NonNull;

use ffmpeg_sys_next as ff;

use super::AvError;
use crate::shard::location::Window;

/// Bytes FFmpeg reads at a time through the context.
const BUFFER_BYTES: usize = 64 * 1024;

/// An `AVIOContext` over a window, owned. Handed to a format context as its `pb`; it must
/// outlive that context (the [`super::Input`] holding both drops the context first).
pub(crate) struct WindowIo {
    ctx: NonNull<ff::AVIOContext>,
    /// Read by the callbacks through the context's `opaque`: boxed so that it does not move,
    /// and dropped after the context is freed.
    _window: Box<Window>,
}

// SAFETY: the context and its window are used by one thread at a time, through the Input that
// owns them (`&mut self` on every reading method); nothing in them is tied to a thread.
unsafe impl Send for WindowIo {}

impl WindowIo {
    /// A context reading `window` from its start.
    pub(crate) fn new(window: Window) -> Result<WindowIo, AvError> {
        let mut window = Box::new(window);
        // SAFETY: av_malloc returns BUFFER_BYTES bytes or NULL.
        let buffer = unsafe { ff::av_malloc(BUFFER_BYTES) }.cast::<u8>();
        if buffer.is_null() {
            return Err(AvError { call: "av_malloc (I/O buffer)", code: ff::AVERROR(libc::ENOMEM) });
        }
        let opaque = (&mut *window as *mut Window).cast::<c_void>();
        // SAFETY: buffer is an av_malloc'ed block of BUFFER_BYTES that the context takes over;
        // opaque is the boxed window, which lives as long as the context; the callbacks match
        // FFmpeg's signatures. write_flag 0: read only.
        let ctx = unsafe {
            ff::avio_alloc_context(buffer, BUFFER_BYTES as c_int, 0, opaque, Some(read), None, Some(seek))
        };
        let Some(ctx) = NonNull::new(ctx) else {
            let mut b = buffer.cast::<c_void>();
            // SAFETY: the context was not made, so the buffer is still ours; freed once.
            unsafe { ff::av_freep((&mut b as *mut *mut c_void).cast::<c_void>()) };
            return Err(AvError { call: "avio_alloc_context", code: ff::AVERROR(libc::ENOMEM) });
        };
        Ok(WindowIo { ctx, _window: window })
    }

    /// The context, for a format context's `pb`.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut ff::AVIOContext {
        self.ctx.as_ptr()
    }
}

impl Drop for WindowIo {
    fn drop(&mut self) {
        let mut ctx = self.ctx.as_ptr();
        // SAFETY: ctx is the context made in new, no longer used by any format context (the
        // owner closed it first). Its buffer may have been replaced by FFmpeg, so the current
        // one is freed, then the context, each once.
        unsafe {
            ff::av_freep((&mut (*ctx).buffer as *mut *mut u8).cast::<c_void>());
            ff::avio_context_free(&mut ctx);
        }
    }
}

/// FFmpeg's read callback: up to `size` bytes at the window's position, `AVERROR_EOF` at its end.
unsafe extern "C" fn read(opaque: *mut c_void, buf: *mut u8, size: c_int) -> c_int {
    // SAFETY: opaque is the boxed Window of the WindowIo whose context calls us; only this
    // context's callbacks touch it, one at a time.
    let w = unsafe { &mut *opaque.cast::<Window>() };
    if size <= 0 {
        return ff::AVERROR_EOF;
    }
    // SAFETY: FFmpeg hands a buffer of at least `size` bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf, size as usize) };
    match w.read(out) {
        Ok(0) => ff::AVERROR_EOF,
        Ok(k) => k as c_int,
        Err(e) => ff::AVERROR(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// FFmpeg's seek callback: positions are relative to the window; `AVSEEK_SIZE` asks its length.
unsafe extern "C" fn seek(opaque: *mut c_void, offset: i64, whence: c_int) -> i64 {
    // SAFETY: as in `read`.
    let w = unsafe { &mut *opaque.cast::<Window>() };
    if whence & ff::AVSEEK_SIZE != 0 {
        return w.len() as i64;
    }
    let to = match whence & !ff::AVSEEK_FORCE {
        libc::SEEK_SET if offset >= 0 => SeekFrom::Start(offset as u64),
        libc::SEEK_CUR => SeekFrom::Current(offset),
        libc::SEEK_END => SeekFrom::End(offset),
        _ => return ff::AVERROR(libc::EINVAL) as i64,
    };
    match w.seek(to) {
        Ok(p) if p <= i64::MAX as u64 => p as i64,
        _ => ff::AVERROR(libc::EINVAL) as i64,
    }
}
