//! Pixel-format conversion and resizing (`SwsContext`), owned.

use std::ffi::c_int;
use std::ptr::{self, NonNull};

use ffmpeg_sys_next as ff;

use super::frame::to_c_int;
use super::{AvError, Frame};

/// Converts an FFmpeg pixel-format number to the enum, when it names a format this FFmpeg knows.
pub fn pixel_format(format: i32) -> Option<ff::AVPixelFormat> {
    if !(0..ff::AVPixelFormat::AV_PIX_FMT_NB as i32).contains(&format) {
        return None;
    }
    // SAFETY: AVPixelFormat is `repr(i32)` with contiguous values from -1 (NONE) to NB, generated
    // from the installed headers; format was checked to lie in 0..NB.
    Some(unsafe { std::mem::transmute::<i32, ff::AVPixelFormat>(format) })
}

/// Bytes of one unpadded picture of `width` × `height` in pixel format `format`
/// (`av_image_get_buffer_size`), when FFmpeg knows the format and the size is valid.
pub fn picture_bytes(format: i32, width: u32, height: u32) -> Option<usize> {
    let f = pixel_format(format)?;
    let (w, h) = (c_int::try_from(width).ok()?, c_int::try_from(height).ok()?);
    // SAFETY: a pure computation over a valid format and two ints; errors come back negative.
    let n = unsafe { ff::av_image_get_buffer_size(f, w, h, 1) };
    usize::try_from(n).ok().filter(|&n| n > 0)
}

/// FFmpeg's name of a pixel format (`yuv420p`), or `fmt<N>` when it has none.
pub fn pixel_format_name(format: i32) -> String {
    let name = pixel_format(format).map_or(ptr::null(), |f| {
        // SAFETY: f is a valid pixel format; the call returns a static string or NULL.
        unsafe { ff::av_get_pix_fmt_name(f) }
    });
    if name.is_null() {
        return format!("fmt{format}");
    }
    // SAFETY: a non-NULL result is a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// A scaler from one source size and format to packed RGB24 at one destination size, bilinear,
/// default colour details (`sws_getContext(W, H, fmt, W', H', RGB24, SWS_BILINEAR, NULL, NULL,
/// NULL)`, PROTOCOL.md "Pixels"). Freed on drop.
pub struct Scaler {
    ctx: NonNull<ff::SwsContext>,
    src: (u32, u32, i32),
    dst: (u32, u32),
    /// Aligned, padded RGB24 picture the scaler writes into; rows are then copied out tight.
    scratch: Frame,
}

// SAFETY: an SwsContext is plain heap state with no thread affinity; `&mut self` guards use.
unsafe impl Send for Scaler {}

impl Scaler {
    /// Creates the scaler for frames of `src_w`×`src_h` in `src_format` (FFmpeg's number, taken
    /// from a decoded frame). Fails, without reaching FFmpeg's asserts, on a format swscale does
    /// not take as input.
    pub fn new(src_w: u32, src_h: u32, src_format: i32, dst_w: u32, dst_h: u32) -> Result<Scaler, AvError> {
        let unsupported = AvError { call: "sws_isSupportedInput", code: ff::AVERROR_PATCHWELCOME };
        let fmt = pixel_format(src_format).ok_or(unsupported.clone())?;
        // SAFETY: fmt is a valid pixel format.
        if unsafe { ff::sws_isSupportedInput(fmt) } <= 0 {
            return Err(unsupported);
        }
        if src_w == 0 || src_h == 0 || dst_w == 0 || dst_h == 0 {
            return Err(AvError { call: "sws_getContext (empty picture)", code: ff::AVERROR(libc::EINVAL) });
        }
        let (sw, sh, dw, dh) = (to_c_int(src_w)?, to_c_int(src_h)?, to_c_int(dst_w)?, to_c_int(dst_h)?);
        let scratch = Frame::with_buffer(dst_w, dst_h, ff::AVPixelFormat::AV_PIX_FMT_RGB24)?;
        // SAFETY: sizes are positive, both formats are valid and supported; NULL filters and
        // params ask for the defaults.
        let raw = unsafe {
            ff::sws_getContext(
                sw,
                sh,
                fmt,
                dw,
                dh,
                ff::AVPixelFormat::AV_PIX_FMT_RGB24,
                ff::SWS_BILINEAR,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null(),
            )
        };
        let ctx =
            NonNull::new(raw).ok_or(AvError { call: "sws_getContext", code: ff::AVERROR(libc::EINVAL) })?;
        Ok(Scaler { ctx, src: (src_w, src_h, src_format), dst: (dst_w, dst_h), scratch })
    }

    /// Whether this scaler takes frames of this size and format.
    pub fn fits(&self, w: u32, h: u32, format: i32) -> bool {
        self.src == (w, h, format)
    }

    /// Scales `frame` into `out`, packed RGB24 rows of `3 × W'` bytes with no padding.
    pub fn scale_into(&mut self, frame: &Frame, out: &mut [u8]) -> Result<(), AvError> {
        let (dw, dh) = (self.dst.0 as usize, self.dst.1 as usize);
        if !self.fits(frame.width(), frame.height(), frame.format()) || out.len() != dw * dh * 3 {
            return Err(AvError {
                call: "sws_scale (frame or buffer size mismatch)",
                code: ff::AVERROR(libc::EINVAL),
            });
        }
        let (src, src_stride) = frame.planes();
        let (dst, dst_stride) = self.scratch.planes_mut();
        // SAFETY: the context was made for this frame's size and format (checked above); src holds
        // the frame's plane pointers and strides; dst is the scratch RGB24 picture of W'×H' that
        // av_frame_get_buffer allocated with alignment and padding.
        let ret = unsafe {
            ff::sws_scale(
                self.ctx.as_ptr(),
                src.as_ptr(),
                src_stride.as_ptr(),
                0,
                self.src.1 as libc::c_int,
                dst.as_ptr(),
                dst_stride.as_ptr(),
            )
        };
        if ret < 0 {
            return Err(AvError { call: "sws_scale", code: ret });
        }
        if ret as usize != dh || dst[0].is_null() || dst_stride[0] < (dw * 3) as libc::c_int {
            return Err(AvError { call: "sws_scale (short output)", code: ff::AVERROR_BUG });
        }
        let stride = dst_stride[0] as usize;
        for (y, row) in out.chunks_exact_mut(dw * 3).enumerate() {
            // SAFETY: the scratch picture has dh rows of `stride` ≥ 3·dw bytes; y < dh.
            let src_row = unsafe { std::slice::from_raw_parts(dst[0].add(y * stride), dw * 3) };
            row.copy_from_slice(src_row);
        }
        Ok(())
    }
}

impl Drop for Scaler {
    fn drop(&mut self) {
        // SAFETY: ctx came from sws_getContext and is freed exactly once, here.
        unsafe { ff::sws_freeContext(self.ctx.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_or_unsupported_formats_are_errors_not_aborts() {
        // -1 (none), out of range, and a hardware format swscale cannot read.
        for fmt in [-1, 100_000, ff::AVPixelFormat::AV_PIX_FMT_VAAPI as i32] {
            assert!(Scaler::new(64, 64, fmt, 28, 28).is_err(), "format {fmt}");
        }
        assert!(Scaler::new(0, 64, 0, 28, 28).is_err());
        assert!(Scaler::new(64, 64, ff::AVPixelFormat::AV_PIX_FMT_YUV420P as i32, 28, 28).is_ok());
        assert_eq!(pixel_format_name(0), "yuv420p");
        assert_eq!(pixel_format_name(-1), "fmt-1");
    }
}
