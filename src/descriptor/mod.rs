//! Descriptors: a sample's metadata, read without decoding.
//!
//! A [`Descriptor`] is what the planner sees of a sample while it is still a few dozen bytes: its
//! id, what it is (modality, codec, container), how big it is (bytes, width, height, frames,
//! duration as an exact rational, bit rate, keyframe interval) and whether it can be used at all
//! ([`Status`]). It is built by [`crate::probe`] from the container header and stored as a
//! fixed-size record in the [`crate::index`].
//!
//! ```
//! use datahelix::descriptor::{Codec, Container, Descriptor, Modality, Status};
//!
//! let d = Descriptor {
//!     id: 42,
//!     modality: Modality::Video,
//!     codec: Codec::H264,
//!     container: Container::Mp4,
//!     width: 1280,
//!     height: 720,
//!     frames: 240,
//!     fps_num: 24,
//!     fps_den: 1,
//!     duration_ticks: 10 * 12_288,
//!     time_base_num: 1,
//!     time_base_den: 12_288,
//!     ..Descriptor::default()
//! };
//! assert_eq!(d.duration_s(), 10.0);
//! assert_eq!(d.fps(), 24.0);
//! assert!(d.status.is_ok());
//! ```

mod kinds;
pub mod record;

pub use kinds::{Codec, Container, Modality, Status};

use serde::Serialize;

/// Metadata of one sample, as probed from its file header.
///
/// Durations are kept exact: `duration_ticks × time_base_num / time_base_den` seconds, the stream's
/// own duration in its own time base (or the container's, in microseconds, where the stream has
/// none), because the protocol's frame targets are computed from the exact rational.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Descriptor {
    /// The sample's id from the manifest (any u64).
    pub id: u64,
    /// Video or image.
    pub modality: Modality,
    /// The video or image codec.
    pub codec: Codec,
    /// The file's container.
    pub container: Container,
    /// Usable (`Ok`) or the reason it is not.
    pub status: Status,
    /// File size in bytes.
    pub bytes: u64,
    /// File modification time, nanoseconds since the Unix epoch (to notice changed files).
    pub mtime_ns: i64,
    /// Coded width in pixels (0 when unknown).
    pub width: u32,
    /// Coded height in pixels (0 when unknown).
    pub height: u32,
    /// Number of frames (the container's count, or duration × fps where it has none; 1 for images).
    pub frames: u32,
    /// Frame rate numerator (0 when unknown or an image).
    pub fps_num: u32,
    /// Frame rate denominator.
    pub fps_den: u32,
    /// Duration in `time_base` units.
    pub duration_ticks: i64,
    /// Time base numerator of `duration_ticks`.
    pub time_base_num: u32,
    /// Time base denominator of `duration_ticks`.
    pub time_base_den: u32,
    /// Bits per second (the stream's, else the container's, else bytes × 8 / duration).
    pub bit_rate: u64,
    /// Largest distance between keyframes, in frames; 0 when it could not be read cheaply.
    pub keyint: u32,
    /// Text tokens from the manifest.
    pub text_tokens: u32,
    /// 1-based line of the manifest this sample came from.
    pub manifest_line: u32,
}

impl Descriptor {
    /// Duration in seconds (0.0 when unknown).
    pub fn duration_s(&self) -> f64 {
        if self.time_base_den == 0 {
            return 0.0;
        }
        self.duration_ticks as f64 * self.time_base_num as f64 / self.time_base_den as f64
    }

    /// Frames per second (0.0 when unknown).
    pub fn fps(&self) -> f64 {
        if self.fps_den == 0 {
            return 0.0;
        }
        self.fps_num as f64 / self.fps_den as f64
    }

    /// Decoded pixels of one full frame.
    pub fn pixels_per_frame(&self) -> u64 {
        self.width as u64 * self.height as u64
    }

    /// The JSON shape of `datahelix index --json --records` (`../shared/CLI.md`).
    pub fn to_json(&self, path: &str) -> DescriptorJson {
        DescriptorJson {
            id: self.id,
            path: path.to_owned(),
            modality: self.modality.name(),
            codec: self.codec.name(),
            container: self.container.name(),
            bytes: self.bytes,
            width: self.width,
            height: self.height,
            frames: self.frames,
            fps: self.fps(),
            duration_s: self.duration_s(),
            bit_rate: self.bit_rate,
            keyint: self.keyint,
            text_tokens: self.text_tokens,
            status: self.status.name(),
        }
    }
}

/// A descriptor as the CLI prints it; field names are a contract (`../shared/CLI.md`).
#[derive(Debug, Serialize)]
pub struct DescriptorJson {
    /// Sample id.
    pub id: u64,
    /// Path relative to the dataset folder.
    pub path: String,
    /// `video` or `image`.
    pub modality: &'static str,
    /// Codec name (`h264`, `mpeg4`, `jpeg`, `png`, ...).
    pub codec: &'static str,
    /// Container name (`mp4`, `mkv`, `jpeg`, `png`, ...).
    pub container: &'static str,
    /// File bytes.
    pub bytes: u64,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Frame count.
    pub frames: u32,
    /// Frames per second.
    pub fps: f64,
    /// Duration in seconds.
    pub duration_s: f64,
    /// Bits per second.
    pub bit_rate: u64,
    /// Keyframe interval in frames, 0 if unknown.
    pub keyint: u32,
    /// Text tokens.
    pub text_tokens: u32,
    /// `ok` or a reason word.
    pub status: &'static str,
}
