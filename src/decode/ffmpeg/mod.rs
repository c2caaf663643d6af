//! The safe layer over FFmpeg (`ffmpeg-sys-next`): owned handles with `Drop`, every return code
//! checked through [`check`], every `unsafe` block here and nowhere above.
//!
//! ```no_run
//! use datahelix::decode::ffmpeg::Input;
//!
//! let input = Input::open(std::path::Path::new("clip.mp4")).expect("open");
//! let video = input.best_video_stream().expect("a video stream");
//! println!("{}x{} {:?}", video.width, video.height, video.codec_id);
//! ```

mod codec;
mod error;
mod frame;
mod input;
mod io;
mod scale;

pub use codec::{CodecContext, Received};
pub use error::{check, AvError, AvErrorKind};
pub use frame::{Frame, Packet};
pub use input::{IndexEntry, Input, StreamInfo};
pub use scale::{picture_bytes, pixel_format, pixel_format_name, Scaler};

/// Silences FFmpeg's own logging (errors come back as return codes, which we report with the
/// sample's id and path). Called once by every constructor in this module.
pub(crate) fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let level = if std::env::var_os("DATAHELIX_FFMPEG_LOG").is_some() {
            ffmpeg_sys_next::AV_LOG_ERROR
        } else {
            ffmpeg_sys_next::AV_LOG_QUIET
        };
        // SAFETY: av_log_set_level only stores an integer in a global; any value is accepted.
        unsafe { ffmpeg_sys_next::av_log_set_level(level) };
    });
}
