//! The descriptor index: every sample's [`Descriptor`] in one memory-mapped file.
//!
//! `datahelix index DIR` writes `DIR/.datahelix/index`; every rank maps it. Opening is O(1) (the
//! header is validated against the file size; nothing else is parsed), reading sample `i` is O(1)
//! (one fixed-size record), finding a sample by id is a binary search of a sorted id table.
//!
//! ```no_run
//! use datahelix::index::Index;
//!
//! let index = Index::open(std::path::Path::new("data/tiny"))?;
//! for i in 0..index.len() {
//!     let d = index.get(i)?;
//!     println!("{} {} {}x{} {}", d.id, index.path(i)?, d.width, d.height, d.status);
//! }
//! let first = index.get(0)?.id;
//! assert_eq!(index.position_of(first), Some(0));
//! # Ok::<(), datahelix::index::IndexError>(())
//! ```
//!
//! The file layout is in [`format`](mod@format); building (and re-building only what changed) in [`writer`].

pub mod format;
pub mod meta;
pub mod source;
pub mod writer;

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use sha2::{Digest, Sha256};

use crate::descriptor::record::{self, RECORD_BYTES};
use crate::descriptor::Descriptor;
use crate::manifest::MANIFEST_FILE;
use format::{Header, ID_ENTRY_BYTES};

pub use writer::{build, BuildOptions, BuildReport};

/// Where the index lives inside a dataset folder.
pub const INDEX_PATH: &str = ".datahelix/index";

/// The environment variable naming an index folder for every command ([`index_file`]).
pub const INDEX_DIR_ENV: &str = "DATAHELIX_INDEX_DIR";

/// Where the index of dataset `dir` lives: `INDEX_DIR/index` for an index folder given
/// (`--index-dir`, `index_dir`), else in `DATAHELIX_INDEX_DIR`, else `DIR/.datahelix/index` —
/// or, where that does not exist, the index [`build`] wrote to [`cache_index_dir`] because `dir`
/// could not be written. An index folder holds one dataset's index: give each dataset its own.
///
/// ```
/// use std::path::Path;
/// use datahelix::index::index_file;
///
/// let inside = index_file(Path::new("/data/clips"), None);
/// assert!(inside.ends_with(".datahelix/index") || std::env::var_os("DATAHELIX_INDEX_DIR").is_some());
/// let elsewhere = index_file(Path::new("/data/clips"), Some(Path::new("/scratch/clips-index")));
/// assert_eq!(elsewhere, Path::new("/scratch/clips-index/index"));
/// ```
pub fn index_file(dir: &Path, index_dir: Option<&Path>) -> PathBuf {
    let from_env = || std::env::var_os(INDEX_DIR_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
    match index_dir.map(Path::to_path_buf).or_else(from_env) {
        Some(folder) => folder.join("index"),
        None => {
            // A brace pattern of shards has an index of its own in its folder, one a pattern.
            let inside = match crate::shard::pattern::split(dir) {
                Some((folder, pattern)) => folder.join(".datahelix").join(pattern).join("index"),
                None => dir.join(INDEX_PATH),
            };
            let cached = || cache_index_dir(dir).map(|c| c.join("index")).filter(|f| f.is_file());
            if inside.exists() {
                inside
            } else {
                cached().unwrap_or(inside)
            }
        }
    }
}

/// The index folder of a dataset folder that cannot be written, when no index folder is given:
/// `$XDG_CACHE_HOME/datahelix/indexes/HASH` (else `~/.cache/...`), HASH the first 16 hex digits
/// of the SHA-256 of `dir`'s canonical path. `None` where `dir` or the cache cannot be found.
pub fn cache_index_dir(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let base = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
    let (folder, pattern) =
        crate::shard::pattern::split(dir).map_or((dir.to_path_buf(), None), |(f, p)| (f, Some(p)));
    let mut canonical = std::fs::canonicalize(folder).ok()?.into_os_string();
    if let Some(p) = pattern {
        canonical.push("/");
        canonical.push(p);
    }
    let digest = sha2::Sha256::digest(canonical.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Some(base.join("datahelix/indexes").join(hash))
}

/// Why an index could not be opened or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The file could not be read.
    #[error("cannot read index {path}: {source}; run `datahelix index DIR` to (re)build it")]
    Io {
        /// The index file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not start with the index magic.
    #[error("not a DataHelix index (wrong magic); run `datahelix index DIR` to build one")]
    NotAnIndex,
    /// Written by another version of the format.
    #[error(
        "index format version {found}, this build reads {supported}; run `datahelix index DIR` to rebuild it"
    )]
    Version {
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The file is shorter than its header says.
    #[error(
        "index truncated: {actual} bytes, header says {expected}; run `datahelix index DIR` to rebuild it"
    )]
    Truncated {
        /// Bytes the header describes.
        expected: u64,
        /// Bytes in the file.
        actual: u64,
    },
    /// Something inside the file is inconsistent.
    #[error("index corrupt: {0}; run `datahelix index DIR` to rebuild it")]
    Corrupt(String),
    /// The manifest changed since the index was built.
    #[error("{manifest} changed since the index was built; run `datahelix index {dir}` to update it")]
    Stale {
        /// The manifest file.
        manifest: PathBuf,
        /// The dataset folder.
        dir: PathBuf,
    },
    /// A sample position beyond the index.
    #[error("sample position {index} is out of range (the index holds {len})")]
    OutOfRange {
        /// Requested position.
        index: usize,
        /// Samples in the index.
        len: usize,
    },
}

/// A memory-mapped descriptor index.
pub struct Index {
    map: Mmap,
    header: Header,
    len: usize,
    dir: PathBuf,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index").field("dir", &self.dir).field("len", &self.len).finish()
    }
}

/// SHA-256 of a file's bytes.
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    let bytes = std::fs::read(path)?;
    Ok(Sha256::digest(&bytes).into())
}

impl Index {
    /// Opens `DIR/.datahelix/index` (or the index `DATAHELIX_INDEX_DIR` names: [`index_file`])
    /// and checks that the dataset's manifest (`manifest.jsonl`, `.csv` or `.parquet`) has not
    /// changed since.
    pub fn open(dir: &Path) -> Result<Index, IndexError> {
        Index::open_in(dir, None)
    }

    /// [`Index::open`] of the index in `index_dir` when given ([`index_file`]).
    pub fn open_in(dir: &Path, index_dir: Option<&Path>) -> Result<Index, IndexError> {
        let index = Index::open_file(&index_file(dir, index_dir))?.with_dir(&crate::shard::folder_of(dir));
        let h = &index.header;
        let found = source::Source::find(dir);
        let listed_in = found.as_ref().map_or_else(|_| dir.join(MANIFEST_FILE), |s| s.name(dir));
        let stale = || IndexError::Stale { manifest: listed_in.clone(), dir: dir.to_path_buf() };
        if let Ok(source::Source::Shards(shards)) = &found {
            let (len, sha) = crate::shard::fingerprint(shards);
            return if (len, sha) == (h.manifest_len, h.manifest_sha256) { Ok(index) } else { Err(stale()) };
        }
        let manifest = &listed_in;
        let (len, mtime) = crate::probe::stat(manifest).map_err(|_| stale())?;
        if (len, mtime) != (h.manifest_len, h.manifest_mtime_ns) {
            // Touched: compare contents before calling it stale.
            let sha = sha256_file(manifest).map_err(|_| stale())?;
            if len != h.manifest_len || sha != h.manifest_sha256 {
                return Err(stale());
            }
        }
        Ok(index)
    }

    /// Opens an index file without looking at any manifest.
    pub fn open_file(path: &Path) -> Result<Index, IndexError> {
        let io = |source| IndexError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only. The index is replaced by rename, never rewritten in place,
        // so a concurrent rebuild leaves this mapping's file intact; a file truncated under us by
        // some other program could raise SIGBUS, which the header's size check cannot rule out.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Index::from_map(map, path.parent().and_then(Path::parent).unwrap_or(Path::new(".")))
    }

    fn from_map(map: Mmap, dir: &Path) -> Result<Index, IndexError> {
        let header = Header::decode(&map)?;
        let len = usize::try_from(header.count)
            .map_err(|_| IndexError::Corrupt(format!("{} samples do not fit this machine", header.count)))?;
        Ok(Index { map, header, len, dir: dir.to_path_buf() })
    }

    fn with_dir(mut self, dir: &Path) -> Index {
        self.dir = dir.to_path_buf();
        self
    }

    /// SHA-256 of what the index says about the dataset: every descriptor and path, in order,
    /// without the files' modification times (and not the header, which holds the manifest's):
    /// equal for one dataset indexed in two places, different when any sample differs.
    pub fn content_sha256(&self) -> Result<[u8; 32], IndexError> {
        use crate::descriptor::record::{encode, PathRef, RECORD_BYTES};
        let mut h = Sha256::new();
        let mut buf = [0u8; RECORD_BYTES];
        for i in 0..self.len {
            let mut d = self.get(i)?;
            d.mtime_ns = 0;
            let path = self.path(i)?;
            encode(&d, PathRef { offset: 0, len: path.len() as u32 }, &mut buf);
            h.update(buf);
            h.update(path.as_bytes());
        }
        Ok(h.finalize().into())
    }

    /// The dataset folder (of a brace pattern of shards: the folder holding them).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Number of samples (manifest entries, usable or not).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the index holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The SHA-256 of the manifest the index was built from.
    pub fn manifest_sha256(&self) -> [u8; 32] {
        self.header.manifest_sha256
    }

    fn record(&self, i: usize) -> Result<&[u8; RECORD_BYTES], IndexError> {
        record_at(&self.map, &self.header, i, self.len)
    }

    /// The descriptor of sample `i` (0-based manifest order).
    pub fn get(&self, i: usize) -> Result<Descriptor, IndexError> {
        let (d, _) = decode_record(self.record(i)?, i)?;
        Ok(d)
    }

    /// The path of sample `i`, relative to the dataset folder.
    pub fn path(&self, i: usize) -> Result<&str, IndexError> {
        let (_, p) = decode_record(self.record(i)?, i)?;
        path_in(&self.map, &self.header, p.offset, p.len, i)
    }

    /// Position of the sample with this id, by binary search of the sorted id table.
    pub fn position_of(&self, id: u64) -> Option<usize> {
        let ids = self.id_table();
        let (mut lo, mut hi) = (0usize, self.len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (mid_id, pos) = id_entry(ids, mid);
            match mid_id.cmp(&id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    // Duplicate ids sort by position: step back to the first occurrence.
                    let (mut k, mut pos) = (mid, pos);
                    while k > 0 && id_entry(ids, k - 1).0 == id {
                        k -= 1;
                        pos = id_entry(ids, k).1;
                    }
                    return usize::try_from(pos).ok().filter(|&p| p < self.len);
                }
            }
        }
        None
    }

    fn id_table(&self) -> &[u8] {
        let start = self.header.ids_off as usize;
        &self.map[start..start + self.len * ID_ENTRY_BYTES]
    }

    /// Every descriptor in order (stops at the first corrupt record, yielding its error).
    pub fn iter(&self) -> impl Iterator<Item = Result<Descriptor, IndexError>> + '_ {
        (0..self.len).map(move |i| self.get(i))
    }
}

fn record_at<'a>(
    map: &'a [u8],
    h: &Header,
    i: usize,
    len: usize,
) -> Result<&'a [u8; RECORD_BYTES], IndexError> {
    if i >= len {
        return Err(IndexError::OutOfRange { index: i, len });
    }
    let start = h.records_off as usize + i * RECORD_BYTES;
    map[start..start + RECORD_BYTES]
        .try_into()
        .map_err(|_| IndexError::Corrupt(format!("record {i} out of bounds")))
}

fn decode_record(b: &[u8; RECORD_BYTES], i: usize) -> Result<(Descriptor, record::PathRef), IndexError> {
    record::decode(b).map_err(|e| IndexError::Corrupt(format!("record {i}: {e}")))
}

fn path_in<'a>(map: &'a [u8], h: &Header, off: u64, len: u32, i: usize) -> Result<&'a str, IndexError> {
    let end = off.checked_add(len as u64).filter(|&e| e <= h.paths_len);
    let Some(end) = end else {
        return Err(IndexError::Corrupt(format!("record {i}: path lies outside the path table")));
    };
    let base = h.paths_off as usize;
    std::str::from_utf8(&map[base + off as usize..base + end as usize])
        .map_err(|_| IndexError::Corrupt(format!("record {i}: path is not UTF-8")))
}

fn id_entry(ids: &[u8], k: usize) -> (u64, u64) {
    let at = k * ID_ENTRY_BYTES;
    let mut a = [0u8; 8];
    a.copy_from_slice(&ids[at..at + 8]);
    let id = u64::from_le_bytes(a);
    a.copy_from_slice(&ids[at + 8..at + 16]);
    (id, u64::from_le_bytes(a))
}

/// Reads every record of an index held in memory, checking each (for tests and fuzzing): the
/// same code paths as [`Index::get`] and [`Index::path`].
pub fn read_all_bytes(bytes: &[u8]) -> Result<Vec<(Descriptor, String)>, IndexError> {
    let h = Header::decode(bytes)?;
    let len = usize::try_from(h.count).map_err(|_| IndexError::Corrupt("count too large".into()))?;
    (0..len)
        .map(|i| {
            let (d, p) = decode_record(record_at(bytes, &h, i, len)?, i)?;
            Ok((d, path_in(bytes, &h, p.offset, p.len, i)?.to_owned()))
        })
        .collect()
}
