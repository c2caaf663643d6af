//! FFmpeg return codes as a typed error that names the call that failed.

use std::ffi::CStr;
use std::fmt;

use ffmpeg_sys_next as ff;

/// What kind of failure an FFmpeg code means, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AvErrorKind {
    /// End of the stream (`AVERROR_EOF`).
    Eof,
    /// Output is not available yet; feed more input (`AVERROR(EAGAIN)`).
    Again,
    /// The bytes do not follow the format (`AVERROR_INVALIDDATA`).
    InvalidData,
    /// A file, stream, decoder or option was not found.
    NotFound,
    /// An operating-system error (the errno is in the code).
    Io,
    /// Memory could not be allocated.
    NoMemory,
    /// Anything else.
    Other,
}

/// A negative FFmpeg return code, with the call that returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AvError {
    /// The FFmpeg function that failed.
    pub call: &'static str,
    /// The raw return code (negative).
    pub code: i32,
}

impl AvError {
    /// Classifies the code.
    pub fn kind(&self) -> AvErrorKind {
        match self.code {
            ff::AVERROR_EOF => AvErrorKind::Eof,
            ff::AVERROR_INVALIDDATA => AvErrorKind::InvalidData,
            c if c == ff::AVERROR(libc::EAGAIN) => AvErrorKind::Again,
            c if c == ff::AVERROR(libc::ENOMEM) => AvErrorKind::NoMemory,
            c if c == ff::AVERROR(libc::ENOENT)
                || c == ff::AVERROR_DECODER_NOT_FOUND
                || c == ff::AVERROR_DEMUXER_NOT_FOUND
                || c == ff::AVERROR_STREAM_NOT_FOUND =>
            {
                AvErrorKind::NotFound
            }
            c if (-4095..0).contains(&c) => AvErrorKind::Io,
            _ => AvErrorKind::Other,
        }
    }

    /// FFmpeg's own text for the code.
    pub fn message(&self) -> String {
        let mut buf = [0 as libc::c_char; 128];
        // SAFETY: av_strerror writes at most buf.len() bytes, NUL-terminated, into buf.
        let ret = unsafe { ff::av_strerror(self.code, buf.as_mut_ptr(), buf.len()) };
        if ret < 0 {
            return format!("unknown FFmpeg error {}", self.code);
        }
        // SAFETY: on success av_strerror left a NUL-terminated string inside buf.
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }
}

impl fmt::Display for AvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.message(), self.code)
    }
}

impl std::error::Error for AvError {}

/// Maps an FFmpeg return value: negative is an error naming `call`, anything else is returned.
pub fn check(ret: libc::c_int, call: &'static str) -> Result<libc::c_int, AvError> {
    if ret < 0 {
        Err(AvError { call, code: ret })
    } else {
        Ok(ret)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_classified() {
        assert_eq!(check(3, "x"), Ok(3));
        let e = check(ff::AVERROR_INVALIDDATA, "avformat_open_input").unwrap_err();
        assert_eq!(e.kind(), AvErrorKind::InvalidData);
        assert!(e.to_string().contains("avformat_open_input"));
        assert_eq!(check(ff::AVERROR(libc::ENOENT), "x").unwrap_err().kind(), AvErrorKind::NotFound);
        assert_eq!(check(ff::AVERROR_EOF, "x").unwrap_err().kind(), AvErrorKind::Eof);
    }
}
