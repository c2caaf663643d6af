//! Each sample's metadata beside the index: a JSON object per index position — its `path` and
//! the manifest row's other fields (caption, label, any JSON) — in the file `meta` next to
//! `index`, memory-mapped, read by position in O(1).
//!
//! ```
//! use datahelix::index::meta::{encode, Meta};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("meta");
//! let texts = [r#"{"path":"a.mp4","caption":"a cat"}"#, r#"{"path":"b.png"}"#];
//! std::fs::write(&path, encode(&texts, [7; 32])).unwrap();
//! let meta = Meta::open(&path, [7; 32], 2).unwrap();
//! assert_eq!(meta.get(0), Some(texts[0]));
//! assert_eq!(meta.get(2), None);
//! assert!(Meta::open(&path, [8; 32], 2).is_err()); // written for another manifest
//! ```
//!
//! Layout (little-endian): magic `DHMETA\0\1` (8 bytes), the manifest's SHA-256 (32), the count
//! `n` (u64), `n + 1` offsets (u64) into the text that follows. Everything is checked at open:
//! the file is untrusted like the index.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"DHMETA\0\x01";

/// Bytes before the offsets.
const HEAD: usize = 48;

/// The metadata file beside the index file `index_path`.
pub fn meta_file(index_path: &Path) -> PathBuf {
    index_path.with_file_name("meta")
}

/// The bytes of a metadata file holding `texts` (one per index position) for the manifest with
/// SHA-256 `manifest_sha256`.
pub fn encode<S: AsRef<str>>(texts: &[S], manifest_sha256: [u8; 32]) -> Vec<u8> {
    let total: usize = texts.iter().map(|t| t.as_ref().len()).sum();
    let mut out = Vec::with_capacity(HEAD + (texts.len() + 1) * 8 + total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&manifest_sha256);
    out.extend_from_slice(&(texts.len() as u64).to_le_bytes());
    let mut at = 0u64;
    out.extend_from_slice(&at.to_le_bytes());
    for t in texts {
        at += t.as_ref().len() as u64;
        out.extend_from_slice(&at.to_le_bytes());
    }
    for t in texts {
        out.extend_from_slice(t.as_ref().as_bytes());
    }
    out
}

/// Why a metadata file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}; run `datahelix index` on the dataset again to rewrite it")]
pub struct MetaError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub reason: String,
}

/// An opened metadata file.
pub struct Meta {
    map: Mmap,
    count: usize,
}

impl Meta {
    /// Opens the metadata file at `path`, written for the manifest `manifest_sha256` with
    /// `count` entries (the index's), checking every offset.
    pub fn open(path: &Path, manifest_sha256: [u8; 32], count: usize) -> Result<Meta, MetaError> {
        let bad = |reason: String| MetaError { path: path.to_path_buf(), reason };
        let file = File::open(path).map_err(|e| bad(format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only; the file is replaced by rename, never rewritten in place
        // (a file truncated under us by another program could raise SIGBUS, as for the index).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(format!("cannot map: {e}")))?;
        let b = &map[..];
        if b.len() < HEAD || &b[..8] != MAGIC {
            return Err(bad("not a DataHelix metadata file".into()));
        }
        if b[8..40] != manifest_sha256 {
            return Err(bad("written for another version of the manifest than the index".into()));
        }
        let n = u64::from_le_bytes(b[40..48].try_into().expect("8 bytes"));
        if n != count as u64 {
            return Err(bad(format!("holds {n} entries where the index holds {count}")));
        }
        let text_at = count
            .checked_add(1)
            .and_then(|k| k.checked_mul(8))
            .and_then(|k| k.checked_add(HEAD))
            .filter(|&k| k <= b.len())
            .ok_or_else(|| bad(format!("{} bytes are too few for {count} entries", b.len())))?;
        let text_len = (b.len() - text_at) as u64;
        let mut last = 0u64;
        for i in 0..=count {
            let o = offset(b, i);
            if (i == 0 && o != 0) || o < last || o > text_len || (i == count && o != text_len) {
                return Err(bad(format!("offset {i} ({o}) is out of order or beyond the text")));
            }
            last = o;
        }
        Ok(Meta { map, count })
    }

    /// The metadata of index position `i` (a JSON object), or `None` past the end or where the
    /// bytes are not UTF-8.
    pub fn get(&self, i: usize) -> Option<&str> {
        if i >= self.count {
            return None;
        }
        let b = &self.map[..];
        let text_at = HEAD + (self.count + 1) * 8;
        let (from, to) = (offset(b, i) as usize, offset(b, i + 1) as usize);
        std::str::from_utf8(&b[text_at + from..text_at + to]).ok()
    }
}

fn offset(b: &[u8], i: usize) -> u64 {
    let at = HEAD + i * 8;
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
