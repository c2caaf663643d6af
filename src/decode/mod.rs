//! Decoding samples into tensors.
//!
//! [`ffmpeg`] is the safe layer over `ffmpeg-sys-next`: it owns every FFmpeg handle and maps every
//! return code. The index's probe uses its [`ffmpeg::Input`] to read container headers; the
//! sampled-frame decoder builds on the same layer.

mod clock;
pub mod cost;
pub mod decoder;
pub mod ffmpeg;
pub mod pool;
pub mod sample;

pub use decoder::{AllFrames, DecodeError, DecodeStats, Decoded, Decoder, Shape};
pub use sample::{Params, Strategy};
