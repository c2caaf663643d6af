//! Decoding samples into tensors.
//!
//! Three layers (`shared/STYLE.md`): `ffmpeg-sys-next` declares; [`ffmpeg`] owns every FFmpeg
//! handle (format context, codec context, frame, packet, scaler) and maps every return code;
//! [`Decoder`] implements `shared/bench/PROTOCOL.md`'s preprocessing on top: `F` frames at
//! `t_i = (2i + 1)/(2F)·d` compared as exact rationals, the integer resize rule, one bilinear
//! swscale context per frame size (made from the first decoded frame, never from the header's
//! guess), packed RGB24 `[F, H', W', 3]` written into the caller's buffer. Its output is
//! byte-identical to an `ffmpeg` CLI decode with the same frame choice (`tests/decode_reference.rs`).
//!
//! ```no_run
//! use datahelix::decode::{Decoder, Params, Strategy};
//!
//! let params = Params::default(); // 2 fps, ≤ 16 frames, ≤ 448² pixels
//! let mut dec = Decoder::open(std::path::Path::new("clip.mp4"))?;
//! let shape = dec.shape(&params)?;
//! let mut tensor = vec![0u8; shape.bytes()];
//! let decoded = dec.decode_into(&params, Strategy::Scan, &mut tensor)?;
//! println!("{:?} at {:?} s", shape.dims(), decoded.timestamps_s);
//! # Ok::<(), datahelix::decode::DecodeError>(())
//! ```
//!
//! | piece | where |
//! |---|---|
//! | preprocessing arithmetic (sizes, targets, tokens, seek-or-scan choice) | [`sample`] |
//! | sampled decoding (whole, or a range of the targets) and all-frames decoding | [`decoder`] |
//! | worker pool: EDF queue, byte-budgeted buffers, per-sample errors | [`pool`] |
//! | one sample in pieces: target ranges cut at predicted keyframes, decoded on different ranks | [`split`] |
//! | decode-cost model `c0 + c_px·px + c_bits·bits + c_seek·discarded`, per codec | [`cost`] |
//!
//! Not done here: hardware decoders, audio, codecs outside the protocol's set (they may decode,
//! untested).

pub mod clock;
pub mod cost;
pub mod decoder;
pub mod ffmpeg;
pub mod pool;
pub mod sample;
pub mod split;

pub use decoder::{AllFrames, DecodeError, DecodeStats, Decoded, Decoder, Shape};
pub use sample::{Params, Strategy};
pub use split::FrameRange;
