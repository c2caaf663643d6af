//! Structural checks of a video container, in plain Rust and without FFmpeg: does the file hold
//! as many bytes as its own top-level structure declares? A cut-off download or copy fails this
//! even when the header that FFmpeg reads is intact (an MP4 with its `moov` first).

use std::io::{Read, Seek, SeekFrom};

/// The outcome of a structural check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Structure {
    /// The declared sizes fit the file.
    Whole,
    /// A top-level element claims bytes beyond the end of the file.
    Truncated,
    /// The top-level structure is not the format's (bad sizes, unknown layout).
    Corrupt,
    /// Not a format this module checks.
    Unknown,
}

const EBML_MAGIC: [u8; 4] = [0x1a, 0x45, 0xdf, 0xa3];
const MATROSKA_SEGMENT: u32 = 0x1853_8067;

/// Which container a file's first bytes announce (`ftyp` box or EBML magic).
pub fn sniff(head: &[u8]) -> Option<crate::descriptor::Container> {
    use crate::descriptor::Container;
    if head.len() >= 8 && &head[4..8] == b"ftyp" {
        Some(Container::Mp4)
    } else if head.starts_with(&EBML_MAGIC) {
        Some(Container::Mkv)
    } else {
        None
    }
}

/// Walks the top-level boxes of an ISO-BMFF (MP4/MOV) file: each box's size must fit.
pub fn check_mp4<F: Read + Seek>(file: &mut F, len: u64) -> std::io::Result<Structure> {
    let mut at = 0u64;
    let mut boxes = 0u32;
    while at < len {
        if len - at < 8 {
            return Ok(Structure::Truncated);
        }
        let mut hdr = [0u8; 16];
        file.seek(SeekFrom::Start(at))?;
        let n = read_up_to(file, &mut hdr)?;
        let size32 = u32::from_be_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as u64;
        let size = match size32 {
            0 => len - at, // box extends to the end of the file
            1 => {
                if n < 16 {
                    return Ok(Structure::Truncated);
                }
                u64::from_be_bytes([hdr[8], hdr[9], hdr[10], hdr[11], hdr[12], hdr[13], hdr[14], hdr[15]])
            }
            s => s,
        };
        if size < 8 {
            return Ok(Structure::Corrupt);
        }
        let end = at.checked_add(size).ok_or(std::io::ErrorKind::InvalidData)?;
        if end > len {
            return Ok(Structure::Truncated);
        }
        at = end;
        boxes += 1;
        if boxes > 1_000_000 {
            return Ok(Structure::Corrupt);
        }
    }
    Ok(Structure::Whole)
}

/// Reads an EBML variable-length integer at `at`; returns (value, its length, all-ones = unknown).
fn ebml_vint(buf: &[u8], keep_marker: bool) -> Option<(u64, usize, bool)> {
    let first = *buf.first()?;
    let width = first.leading_zeros() as usize + 1;
    if width > 8 || buf.len() < width {
        return None;
    }
    let mut v = if keep_marker { first as u64 } else { (first as u64) & (0xff >> width) };
    let mut all_ones = (first as u64) & (0xff >> width) == (0xff >> width);
    for &b in &buf[1..width] {
        v = (v << 8) | b as u64;
        all_ones &= b == 0xff;
    }
    Some((v, width, all_ones))
}

/// Checks a Matroska file: the EBML header, then the Segment whose declared size must fit.
pub fn check_mkv<F: Read + Seek>(file: &mut F, len: u64) -> std::io::Result<Structure> {
    let mut head = [0u8; 64];
    file.seek(SeekFrom::Start(0))?;
    let n = read_up_to(file, &mut head)?;
    let head = &head[..n];
    // EBML header element.
    let Some((id, id_len, _)) = ebml_vint(head, true) else { return Ok(Structure::Truncated) };
    if id != u32::from_be_bytes(EBML_MAGIC) as u64 {
        return Ok(Structure::Corrupt);
    }
    let Some((size, size_len, _)) = ebml_vint(&head[id_len..], false) else {
        return Ok(Structure::Truncated);
    };
    let seg_at = (id_len + size_len) as u64 + size;
    if seg_at + 12 > len {
        return Ok(Structure::Truncated);
    }
    let mut seg = [0u8; 12];
    file.seek(SeekFrom::Start(seg_at))?;
    read_up_to(file, &mut seg)?;
    let Some((id, id_len, _)) = ebml_vint(&seg, true) else { return Ok(Structure::Corrupt) };
    if id != MATROSKA_SEGMENT as u64 {
        return Ok(Structure::Corrupt);
    }
    let Some((size, size_len, unknown)) = ebml_vint(&seg[id_len..], false) else {
        return Ok(Structure::Corrupt);
    };
    if unknown {
        return Ok(Structure::Whole); // live-written file: size not stated
    }
    let end = seg_at.saturating_add((id_len + size_len) as u64).saturating_add(size);
    Ok(if end > len { Structure::Truncated } else { Structure::Whole })
}

fn read_up_to<F: Read>(file: &mut F, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut t = tempfile::NamedTempFile::new().unwrap();
        t.write_all(bytes).unwrap();
        let f = File::open(t.path()).unwrap();
        (t, f)
    }

    #[test]
    fn mp4_boxes_must_fit() {
        let mut b = Vec::new();
        b.extend_from_slice(&[0, 0, 0, 16]);
        b.extend_from_slice(b"ftypisom\0\0\0\0");
        b.extend_from_slice(&[0, 0, 0, 100]);
        b.extend_from_slice(b"mdat");
        b.extend_from_slice(&[7u8; 92]);
        let (_t, mut f) = file_with(&b);
        assert_eq!(check_mp4(&mut f, b.len() as u64).unwrap(), Structure::Whole);
        let (_t, mut f) = file_with(&b[..60]);
        assert_eq!(check_mp4(&mut f, 60).unwrap(), Structure::Truncated);
        let mut bad = b.clone();
        bad[16..20].copy_from_slice(&[0, 0, 0, 3]);
        let (_t, mut f) = file_with(&bad);
        assert_eq!(check_mp4(&mut f, bad.len() as u64).unwrap(), Structure::Corrupt);
    }

    #[test]
    fn mkv_segment_must_fit() {
        let mut b = vec![0x1a, 0x45, 0xdf, 0xa3, 0x80 | 2, 0x42, 0x86]; // EBML header, 2 bytes
        b.extend_from_slice(&[0x18, 0x53, 0x80, 0x67, 0x80 | 20]); // Segment, 20 bytes
        b.extend_from_slice(&[0u8; 20]);
        let (_t, mut f) = file_with(&b);
        assert_eq!(check_mkv(&mut f, b.len() as u64).unwrap(), Structure::Whole);
        let (_t, mut f) = file_with(&b[..20]);
        assert_eq!(check_mkv(&mut f, 20).unwrap(), Structure::Truncated);
    }
}
