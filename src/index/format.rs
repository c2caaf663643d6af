//! The index file's layout (version 1), all integers little-endian:
//!
//! ```text
//! offset  size  field
//!      0     8  magic "DHXINDEX"
//!      8     4  version (1)
//!     12     4  record size (96)
//!     16     8  count: samples
//!     24     8  records offset  (count × record size bytes: descriptor::record)
//!     32     8  ids offset      (count × 16 bytes: (id u64, position u64), sorted by id)
//!     40     8  paths offset    (UTF-8 paths, concatenated; records point into it)
//!     48     8  paths length
//!     56     8  manifest length in bytes   } the manifest this index was built from, to
//!     64     8  manifest mtime, ns          } notice when it changed
//!     72    32  manifest SHA-256            }
//!    104     8  header checksum: FNV-1a 64 of bytes 0..104
//!    112    16  reserved (zero)
//!    128        records, ids, paths; the file ends exactly at paths offset + paths length
//! ```
//!
//! Every offset and length is checked against the file's size when the index is opened, so a
//! truncated or foreign file is rejected before anything is read from it.

use super::IndexError;
use crate::descriptor::record::RECORD_BYTES;

/// The first 8 bytes of every index file.
pub const MAGIC: [u8; 8] = *b"DHXINDEX";
/// The version this build writes and reads.
pub const VERSION: u32 = 1;
/// Header bytes.
pub const HEADER_BYTES: usize = 128;
/// Bytes per entry of the id table.
pub const ID_ENTRY_BYTES: usize = 16;

const CHECKSUMMED: usize = 104;

/// The decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Number of samples.
    pub count: u64,
    /// Byte offset of the records.
    pub records_off: u64,
    /// Byte offset of the id table.
    pub ids_off: u64,
    /// Byte offset of the path table.
    pub paths_off: u64,
    /// Bytes in the path table.
    pub paths_len: u64,
    /// Manifest size when indexed.
    pub manifest_len: u64,
    /// Manifest modification time when indexed (ns).
    pub manifest_mtime_ns: i64,
    /// SHA-256 of the manifest when indexed.
    pub manifest_sha256: [u8; 32],
}

/// FNV-1a, 64 bit: a cheap checksum of the header (not a defence against tampering).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    /// A header for `count` samples and `paths_len` path bytes, laid out back to back.
    pub fn layout(count: u64, paths_len: u64) -> Header {
        let records_off = HEADER_BYTES as u64;
        let ids_off = records_off + count * RECORD_BYTES as u64;
        let paths_off = ids_off + count * ID_ENTRY_BYTES as u64;
        Header {
            count,
            records_off,
            ids_off,
            paths_off,
            paths_len,
            manifest_len: 0,
            manifest_mtime_ns: 0,
            manifest_sha256: [0; 32],
        }
    }

    /// Total file size this header describes.
    pub fn file_len(&self) -> u64 {
        self.paths_off + self.paths_len
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
        for (at, v) in [
            (16, self.count),
            (24, self.records_off),
            (32, self.ids_off),
            (40, self.paths_off),
            (48, self.paths_len),
            (56, self.manifest_len),
            (64, self.manifest_mtime_ns as u64),
        ] {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        b[72..104].copy_from_slice(&self.manifest_sha256);
        let sum = fnv1a64(&b[..CHECKSUMMED]);
        b[104..112].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Reads and validates a header against the size of the file it came from.
    pub fn decode(file: &[u8]) -> Result<Header, IndexError> {
        if file.len() < 8 || file[0..8] != MAGIC {
            return Err(IndexError::NotAnIndex);
        }
        if file.len() < HEADER_BYTES {
            return Err(IndexError::Truncated { expected: HEADER_BYTES as u64, actual: file.len() as u64 });
        }
        let b = &file[..HEADER_BYTES];
        let version = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if version != VERSION {
            return Err(IndexError::Version { found: version, supported: VERSION });
        }
        if fnv1a64(&b[..CHECKSUMMED]) != u64_at(b, 104) {
            return Err(IndexError::Corrupt("header checksum does not match".into()));
        }
        let record = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
        if record as usize != RECORD_BYTES {
            return Err(IndexError::Corrupt(format!("record size {record}, expected {RECORD_BYTES}")));
        }
        let mut sha = [0u8; 32];
        sha.copy_from_slice(&b[72..104]);
        let h = Header {
            count: u64_at(b, 16),
            records_off: u64_at(b, 24),
            ids_off: u64_at(b, 32),
            paths_off: u64_at(b, 40),
            paths_len: u64_at(b, 48),
            manifest_len: u64_at(b, 56),
            manifest_mtime_ns: u64_at(b, 64) as i64,
            manifest_sha256: sha,
        };
        // The layout must be exactly the one writers produce; anything else is not trusted.
        let expected = Header::layout(h.count.min(u64::MAX / 1024), h.paths_len.min(u64::MAX / 2));
        if h.count > u64::MAX / 1024
            || h.paths_len > u64::MAX / 2
            || (h.records_off, h.ids_off, h.paths_off)
                != (expected.records_off, expected.ids_off, expected.paths_off)
        {
            return Err(IndexError::Corrupt("section offsets do not match the sample count".into()));
        }
        let want = h.file_len();
        if (file.len() as u64) < want {
            return Err(IndexError::Truncated { expected: want, actual: file.len() as u64 });
        }
        if (file.len() as u64) > want {
            return Err(IndexError::Corrupt(format!(
                "{} trailing bytes after the path table",
                file.len() as u64 - want
            )));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_checks_itself() {
        let mut h = Header::layout(3, 10);
        h.manifest_len = 77;
        h.manifest_sha256[5] = 9;
        let mut file = h.encode().to_vec();
        file.resize(h.file_len() as usize, 0);
        assert_eq!(Header::decode(&file).unwrap(), h);
        file[20] ^= 1;
        assert!(matches!(Header::decode(&file), Err(IndexError::Corrupt(_))));
    }
}
