//! Image headers read by hand: the size of a JPEG (its SOF segment) or a PNG (its IHDR chunk)
//! without decoding a pixel, and whether the file ends where the format says it must.

use crate::descriptor::Codec;

/// What an image header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    /// `Jpeg` or `Png`.
    pub codec: Codec,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// Why an image header could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageProblem {
    /// The bytes end before the size is stated.
    Truncated,
    /// A marker or chunk that the format does not allow.
    Corrupt,
}

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
const PNG_IEND: [u8; 12] = [0, 0, 0, 0, b'I', b'E', b'N', b'D', 0xae, 0x42, 0x60, 0x82];

/// The image codec a file's first bytes announce, if any.
pub fn sniff(head: &[u8]) -> Option<Codec> {
    if head.starts_with(&[0xff, 0xd8, 0xff]) {
        Some(Codec::Jpeg)
    } else if head.starts_with(&PNG_SIGNATURE) {
        Some(Codec::Png)
    } else {
        None
    }
}

/// Reads the size from a PNG's IHDR chunk (which must come first).
pub fn png(head: &[u8]) -> Result<ImageHeader, ImageProblem> {
    if head.len() < 24 {
        return Err(ImageProblem::Truncated);
    }
    if &head[12..16] != b"IHDR" {
        return Err(ImageProblem::Corrupt);
    }
    let be = |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    Ok(ImageHeader { codec: Codec::Png, width: be(16), height: be(20) })
}

/// Whether a PNG's last 12 bytes are its IEND chunk.
pub fn png_complete(tail: &[u8]) -> bool {
    tail.ends_with(&PNG_IEND)
}

/// Walks a JPEG's marker segments up to its first start-of-frame and reads the size there.
pub fn jpeg(bytes: &[u8]) -> Result<ImageHeader, ImageProblem> {
    let mut at = 2; // after SOI
    loop {
        // Markers may be preceded by any number of 0xff fill bytes.
        while at < bytes.len() && bytes[at] == 0xff && bytes.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        if at + 4 > bytes.len() {
            return Err(ImageProblem::Truncated);
        }
        if bytes[at] != 0xff {
            return Err(ImageProblem::Corrupt);
        }
        let marker = bytes[at + 1];
        let len = u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize;
        let is_sof = matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc);
        if is_sof {
            if at + 9 > bytes.len() {
                return Err(ImageProblem::Truncated);
            }
            let height = u16::from_be_bytes([bytes[at + 5], bytes[at + 6]]) as u32;
            let width = u16::from_be_bytes([bytes[at + 7], bytes[at + 8]]) as u32;
            return Ok(ImageHeader { codec: Codec::Jpeg, width, height });
        }
        if marker == 0xd9 || marker == 0xda || len < 2 {
            // End of image or start of scan before any frame header: not a valid JPEG.
            return Err(ImageProblem::Corrupt);
        }
        at += 2 + len;
    }
}

/// Whether a JPEG ends with its EOI marker (a cheap check for a cut-off file).
pub fn jpeg_complete(tail: &[u8]) -> bool {
    // Some encoders pad after EOI; accept EOI within the last few bytes.
    tail.windows(2).rev().take(16).any(|w| w == [0xff, 0xd9])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn png_header() {
        let mut b = PNG_SIGNATURE.to_vec();
        b.extend_from_slice(&[0, 0, 0, 13]);
        b.extend_from_slice(b"IHDR");
        b.extend_from_slice(&530u32.to_be_bytes());
        b.extend_from_slice(&17u32.to_be_bytes());
        assert_eq!(sniff(&b), Some(Codec::Png));
        assert_eq!(png(&b), Ok(ImageHeader { codec: Codec::Png, width: 530, height: 17 }));
        assert_eq!(png(&b[..20]), Err(ImageProblem::Truncated));
    }

    #[test]
    fn jpeg_header_after_app_segments() {
        let mut b = vec![0xff, 0xd8];
        b.extend_from_slice(&[0xff, 0xe0, 0, 4, 1, 2]); // APP0 with 2 bytes of payload
        b.extend_from_slice(&[0xff, 0xff, 0xc2, 0, 11, 8, 0x01, 0xe0, 0x02, 0x80, 3]); // fill + SOF2
        assert_eq!(jpeg(&b), Ok(ImageHeader { codec: Codec::Jpeg, width: 640, height: 480 }));
        assert_eq!(jpeg(&b[..8]), Err(ImageProblem::Truncated));
        assert_eq!(jpeg(&[0xff, 0xd8, 0xff, 0xda, 0, 2]), Err(ImageProblem::Corrupt));
        assert_eq!(jpeg(&[0xff, 0xd8, 0x00, 0x00, 0, 2]), Err(ImageProblem::Corrupt));
    }
}
