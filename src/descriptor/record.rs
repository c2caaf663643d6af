//! The fixed-size binary form of a [`Descriptor`], as stored in the index file.
//!
//! Every field is little-endian at a fixed offset, so a reader decodes sample `i` from
//! `records[i * RECORD_BYTES ..]` without parsing anything else, and a record written on one
//! machine reads the same on another. The record also carries where the sample's path lives in
//! the index's path table.
//!
//! ```
//! use datahelix::descriptor::record::{decode, encode, PathRef, RECORD_BYTES};
//! use datahelix::descriptor::Descriptor;
//!
//! let d = Descriptor { id: u64::MAX, width: 640, height: 480, ..Descriptor::default() };
//! let mut buf = [0u8; RECORD_BYTES];
//! encode(&d, PathRef { offset: 10, len: 3 }, &mut buf);
//! let (back, path) = decode(&buf).unwrap();
//! assert_eq!(back, d);
//! assert_eq!(path, PathRef { offset: 10, len: 3 });
//! ```

use super::{Codec, Container, Descriptor, Modality, Status};

/// Bytes per record.
pub const RECORD_BYTES: usize = 96;

/// Where a record's path lives in the index's path table (byte offset and length).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathRef {
    /// Byte offset into the path table.
    pub offset: u64,
    /// Length in bytes of the UTF-8 path.
    pub len: u32,
}

/// A record byte that no version of the format writes, found while decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("record field `{field}` holds {value}, which no index version writes")]
pub struct BadField {
    /// The field's name.
    pub field: &'static str,
    /// The byte found.
    pub value: u8,
}

// Field offsets. Keep in one place: the format's version must change if any of these do.
const ID: usize = 0;
const BYTES: usize = 8;
const MTIME: usize = 16;
const DURATION: usize = 24;
const BIT_RATE: usize = 32;
const PATH_OFF: usize = 40;
const PATH_LEN: usize = 48;
const TB_NUM: usize = 52;
const TB_DEN: usize = 56;
const WIDTH: usize = 60;
const HEIGHT: usize = 64;
const FRAMES: usize = 68;
const FPS_NUM: usize = 72;
const FPS_DEN: usize = 76;
const KEYINT: usize = 80;
const TEXT_TOKENS: usize = 84;
const MODALITY: usize = 88;
const CODEC: usize = 89;
const CONTAINER: usize = 90;
const STATUS: usize = 91;
const LINE: usize = 92;

fn put_u64(b: &mut [u8; RECORD_BYTES], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(b: &mut [u8; RECORD_BYTES], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn get_u64(b: &[u8; RECORD_BYTES], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}
fn get_u32(b: &[u8; RECORD_BYTES], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// Writes `d` and its path reference into `out`.
pub fn encode(d: &Descriptor, path: PathRef, out: &mut [u8; RECORD_BYTES]) {
    *out = [0u8; RECORD_BYTES];
    put_u64(out, ID, d.id);
    put_u64(out, BYTES, d.bytes);
    put_u64(out, MTIME, d.mtime_ns as u64);
    put_u64(out, DURATION, d.duration_ticks as u64);
    put_u64(out, BIT_RATE, d.bit_rate);
    put_u64(out, PATH_OFF, path.offset);
    put_u32(out, PATH_LEN, path.len);
    put_u32(out, TB_NUM, d.time_base_num);
    put_u32(out, TB_DEN, d.time_base_den);
    put_u32(out, WIDTH, d.width);
    put_u32(out, HEIGHT, d.height);
    put_u32(out, FRAMES, d.frames);
    put_u32(out, FPS_NUM, d.fps_num);
    put_u32(out, FPS_DEN, d.fps_den);
    put_u32(out, KEYINT, d.keyint);
    put_u32(out, TEXT_TOKENS, d.text_tokens);
    out[MODALITY] = d.modality.to_byte();
    out[CODEC] = d.codec.to_byte();
    out[CONTAINER] = d.container.to_byte();
    out[STATUS] = d.status.to_byte();
    put_u32(out, LINE, d.manifest_line);
}

/// Reads a record. Fails only on an enumeration byte no writer produces (a corrupt file).
pub fn decode(b: &[u8; RECORD_BYTES]) -> Result<(Descriptor, PathRef), BadField> {
    let byte = |field: &'static str, at: usize| BadField { field, value: b[at] };
    let d = Descriptor {
        id: get_u64(b, ID),
        bytes: get_u64(b, BYTES),
        mtime_ns: get_u64(b, MTIME) as i64,
        duration_ticks: get_u64(b, DURATION) as i64,
        bit_rate: get_u64(b, BIT_RATE),
        time_base_num: get_u32(b, TB_NUM),
        time_base_den: get_u32(b, TB_DEN),
        width: get_u32(b, WIDTH),
        height: get_u32(b, HEIGHT),
        frames: get_u32(b, FRAMES),
        fps_num: get_u32(b, FPS_NUM),
        fps_den: get_u32(b, FPS_DEN),
        keyint: get_u32(b, KEYINT),
        text_tokens: get_u32(b, TEXT_TOKENS),
        modality: Modality::from_byte(b[MODALITY]).ok_or_else(|| byte("modality", MODALITY))?,
        codec: Codec::from_byte(b[CODEC]).ok_or_else(|| byte("codec", CODEC))?,
        container: Container::from_byte(b[CONTAINER]).ok_or_else(|| byte("container", CONTAINER))?,
        status: Status::from_byte(b[STATUS]).ok_or_else(|| byte("status", STATUS))?,
        manifest_line: get_u32(b, LINE),
    };
    let path = PathRef { offset: get_u64(b, PATH_OFF), len: get_u32(b, PATH_LEN) };
    Ok((d, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_round_trips() {
        let d = Descriptor {
            id: 0xDEAD_BEEF_0123_4567,
            modality: Modality::Video,
            codec: Codec::Mpeg4,
            container: Container::Mkv,
            status: Status::Truncated,
            bytes: 1 << 40,
            mtime_ns: -5,
            width: 1920,
            height: 1080,
            frames: 601,
            fps_num: 30000,
            fps_den: 1001,
            duration_ticks: 20_020_000,
            time_base_num: 1,
            time_base_den: 1_000_000,
            bit_rate: 8_000_000,
            keyint: 250,
            text_tokens: 77,
            manifest_line: 12,
        };
        let mut buf = [0u8; RECORD_BYTES];
        encode(&d, PathRef { offset: 99, len: 7 }, &mut buf);
        assert_eq!(decode(&buf).unwrap(), (d, PathRef { offset: 99, len: 7 }));
    }

    #[test]
    fn unknown_enum_byte_is_an_error_naming_the_field() {
        let mut buf = [0u8; RECORD_BYTES];
        encode(&Descriptor::default(), PathRef::default(), &mut buf);
        buf[STATUS] = 77;
        let err = decode(&buf).unwrap_err();
        assert_eq!(err.field, "status");
        assert_eq!(err.value, 77);
    }
}
