//! Building the index: probe every manifest entry in parallel, write the file atomically.
//!
//! A rebuild re-probes only the files whose size or modification time changed since the last
//! index; every other descriptor is copied from it.
//!
//! ```no_run
//! use datahelix::index::{build, BuildOptions};
//!
//! let report = build(std::path::Path::new("data/tiny"), &BuildOptions::default())?;
//! println!("{} samples, {} ok, {} re-probed", report.count, report.ok, report.probed);
//! # Ok::<(), datahelix::index::writer::BuildError>(())
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use sha2::Digest;

use super::format::{Header, ID_ENTRY_BYTES};
use super::source::Source;
use super::Index;
use crate::descriptor::record::{self, PathRef, RECORD_BYTES};
use crate::descriptor::{Container, Descriptor, Modality, Status};
use crate::manifest::{self, Entry, LineError, Manifest};
use crate::probe;
use crate::shard::{self, location::MemberPath};

/// How to build.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Probe threads (0: one per core).
    pub workers: usize,
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Re-probe every file, ignoring an existing index.
    pub force: bool,
    /// Where to write the index ([`super::index_file`]); `None`: `DATAHELIX_INDEX_DIR`, else
    /// inside the dataset folder.
    pub index_dir: Option<PathBuf>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions { workers: 0, progress: true, force: false, index_dir: None }
    }
}

/// What a build did.
#[derive(Clone, Debug, Default)]
pub struct BuildReport {
    /// Manifest entries (records written) plus malformed lines.
    pub count: usize,
    /// Usable samples.
    pub ok: usize,
    /// `count - ok`.
    pub bad: usize,
    /// Bad entries by reason word (`missing`, `truncated`, ..., `malformed_line`).
    pub by_status: BTreeMap<String, usize>,
    /// Malformed manifest lines, each naming its line.
    pub manifest_errors: Vec<LineError>,
    /// Files probed this time.
    pub probed: usize,
    /// Descriptors copied unchanged from the previous index.
    pub reused: usize,
    /// Wall seconds.
    pub seconds: f64,
    /// The index file written.
    pub path: PathBuf,
    /// Where the index could not be written (the dataset folder is read-only or not ours), when
    /// it was written to the cache ([`super::cache_index_dir`]) instead.
    pub could_not_write: Option<PathBuf>,
}

/// Why the index could not be built at all (bad samples never cause this).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No single manifest in the folder.
    #[error(transparent)]
    NoManifest(#[from] manifest::FindError),
    /// The manifest could not be read.
    #[error("cannot read {path}: {source}")]
    Manifest {
        /// The manifest path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The manifest is not a table of its format at all (no `id` or `path` column, not Parquet).
    #[error("{path}: {reason}")]
    ManifestFormat {
        /// The manifest path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The index could not be written.
    #[error("cannot write the index at {path}: {source}; check that the folder is writable, or index a read-only dataset elsewhere (--index-dir FOLDER, or DATAHELIX_INDEX_DIR=FOLDER)")]
    Write {
        /// The index path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The probe thread pool could not start.
    #[error("cannot start {workers} probe threads: {reason}")]
    Threads {
        /// Requested threads.
        workers: usize,
        /// Why.
        reason: String,
    },
}

/// Builds (or updates) `dir/.datahelix/index` (or the index of [`BuildOptions::index_dir`])
/// from the dataset's manifest (`manifest.jsonl`, `.csv` or `.parquet`: [`manifest::find`]),
/// or from its WebDataset shards ([`crate::shard`]) when it has no manifest.
pub fn build(dir: &Path, opts: &BuildOptions) -> Result<BuildReport, BuildError> {
    let started = Instant::now();
    let listed = read_listing(dir)?;
    // The data path may be a brace pattern of shards: files are found in its folder.
    let data = dir;
    let dir = &shard::folder_of(data);
    let manifest = listed.manifest;

    let index_path = super::index_file(data, opts.index_dir.as_deref());
    let previous = if opts.force { HashMap::new() } else { previous_descriptors(&index_path) };
    let mut seen = HashSet::with_capacity(manifest.entries.len());
    let duplicate: Vec<bool> = manifest.entries.iter().map(|e| !seen.insert(e.id)).collect();

    let progress = progress_bar(opts.progress, manifest.entries.len() as u64);
    let probe_one = |(e, dup): (&Entry, &bool)| -> (Descriptor, bool) {
        let d = if *dup {
            Descriptor {
                id: e.id,
                text_tokens: e.text_tokens,
                manifest_line: e.line,
                status: Status::DuplicateId,
                ..Default::default()
            }
        } else if let Some(d) = reusable(&previous, dir, e) {
            progress.inc(1);
            return (d, true);
        } else {
            probe::probe(dir, e)
        };
        progress.inc(1);
        (d, false)
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.workers)
        .build()
        .map_err(|e| BuildError::Threads { workers: opts.workers, reason: e.to_string() })?;
    let results: Vec<(Descriptor, bool)> =
        pool.install(|| manifest.entries.par_iter().zip(duplicate.par_iter()).map(probe_one).collect());
    progress.finish_and_clear();

    let descriptors: Vec<Descriptor> = results.iter().map(|(d, _)| *d).collect();
    let paths: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    let manifest_sha256 = listed.sha256;
    // The metadata first: an index never stands beside metadata older than itself (metadata
    // newer than its index names another manifest, and is refused as stale at open).
    let meta_bytes = {
        let texts: Vec<String> = manifest.entries.iter().map(manifest::meta_json).collect();
        super::meta::encode(&texts, manifest_sha256)
    };
    let index_bytes = encode_index(&descriptors, &paths, listed.len, listed.mtime_ns, manifest_sha256);
    let write = |index_path: &Path| {
        let meta_path = super::meta::meta_file(index_path);
        write_atomically(&meta_path, &meta_bytes)
            .map_err(|source| BuildError::Write { path: meta_path, source })?;
        write_atomically(index_path, &index_bytes)
            .map_err(|source| BuildError::Write { path: index_path.to_path_buf(), source })
    };
    let mut index_path = index_path;
    let mut read_only = None;
    if let Err(e) = write(&index_path) {
        // A dataset folder that cannot be written, with no index folder given: indexed in the
        // cache instead, where every command finds it (super::index_file).
        let chosen =
            opts.index_dir.is_some() || std::env::var_os(super::INDEX_DIR_ENV).is_some_and(|v| !v.is_empty());
        let unwritable = matches!(&e, BuildError::Write { source, .. }
            if matches!(source.kind(), std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied));
        let cache =
            super::cache_index_dir(data).filter(|_| unwritable && !chosen && index_path.starts_with(dir));
        let Some(cache) = cache else { return Err(e) };
        let fallback = cache.join("index");
        write(&fallback)?;
        tracing::warn!(
            "{} cannot be written; indexed in {} instead (every command on this machine finds it there; give --index-dir to choose the place)",
            dir.display(),
            cache.display()
        );
        read_only = Some(index_path);
        index_path = fallback;
    }

    let mut report = BuildReport {
        count: descriptors.len() + manifest.errors.len(),
        ok: descriptors.iter().filter(|d| d.status.is_ok()).count(),
        reused: results.iter().filter(|(_, r)| *r).count(),
        probed: results.iter().filter(|(d, r)| !*r && d.status != Status::DuplicateId).count(),
        seconds: started.elapsed().as_secs_f64(),
        path: index_path,
        could_not_write: read_only,
        ..Default::default()
    };
    for d in descriptors.iter().filter(|d| !d.status.is_ok()) {
        *report.by_status.entry(d.status.name().to_string()).or_default() += 1;
    }
    if !manifest.errors.is_empty() {
        report.by_status.insert("malformed_line".into(), manifest.errors.len());
    }
    report.bad = report.count - report.ok;
    report.manifest_errors = manifest.errors;
    Ok(report)
}

/// A dataset's entries and what the index header records to notice that they changed.
struct Listed {
    manifest: Manifest,
    /// The manifest's size (the shard listing's, [`shard::fingerprint`]).
    len: u64,
    /// The manifest's modification time (0 for shards).
    mtime_ns: i64,
    /// The manifest's SHA-256 (the shard listing's).
    sha256: [u8; 32],
}

/// Reads the entries of `dir`'s manifest, or of its shards ([`Source::find`]).
fn read_listing(dir: &Path) -> Result<Listed, BuildError> {
    let (manifest_path, format) = match Source::find(dir)? {
        Source::Shards(shards) => {
            let (len, sha256) = shard::fingerprint(&shards);
            let manifest = shard::entries(&shard::folder_of(dir), &shards);
            return Ok(Listed { manifest, len, mtime_ns: 0, sha256 });
        }
        Source::Manifest { path, format } => (path, format),
    };
    let manifest_err = |source| BuildError::Manifest { path: manifest_path.clone(), source };
    let bytes = std::fs::read(&manifest_path).map_err(manifest_err)?;
    let (len, mtime_ns) = probe::stat(&manifest_path)
        .map_err(|s| manifest_err(std::io::Error::other(format!("manifest is {s}"))))?;
    let manifest = manifest::parse_as(format, &bytes)
        .map_err(|reason| BuildError::ManifestFormat { path: manifest_path.clone(), reason })?;
    Ok(Listed { manifest, len, mtime_ns, sha256: sha2::Sha256::digest(&bytes).into() })
}

/// Descriptors of the previous index at `index_path` keyed by (id, path), when one can be read.
fn previous_descriptors(index_path: &Path) -> HashMap<(u64, String), Descriptor> {
    let Ok(old) = Index::open_file(index_path) else { return HashMap::new() };
    (0..old.len())
        .filter_map(|i| Some(((old.get(i).ok()?.id, old.path(i).ok()?.to_owned()), old.get(i).ok()?)))
        .collect()
}

/// The previous descriptor of `e`, when its file's size and mtime are unchanged.
fn reusable(previous: &HashMap<(u64, String), Descriptor>, dir: &Path, e: &Entry) -> Option<Descriptor> {
    let old = previous.get(&(e.id, e.path.clone()))?;
    let root = std::fs::canonicalize(dir).ok()?;
    unchanged(&root, &e.path, old).then_some(Descriptor {
        text_tokens: e.text_tokens,
        manifest_line: e.line,
        ..*old
    })
}

/// Whether the file of `old` (at `path` beneath `root`, canonical) still has the size and
/// modification time it was indexed with. Descriptors that are always re-probed (no file, a
/// bad path, a duplicate id, unreadable) never count as unchanged, nor Matroska videos without
/// a keyframe interval: probes before 2026-12-06 did not read their cues (a rebuild now does).
fn unchanged(root: &Path, path: &str, old: &Descriptor) -> bool {
    if old.bytes == 0 || matches!(old.status, Status::DuplicateId | Status::BadPath | Status::Unreadable) {
        return false;
    }
    if old.container == Container::Mkv && old.modality == Modality::Video && old.keyint == 0 {
        return false;
    }
    // The path is resolved again: a link swapped to a file outside the folder is re-probed
    // (and refused), even when the file it now leads to has the same size and time.
    let member = MemberPath::parse(path);
    let Ok(file) = probe::resolve_beneath(root, member.map_or(path, |m| m.shard)) else { return false };
    let Ok((bytes, mtime_ns)) = probe::stat(&file) else { return false };
    match member {
        // A shard member: the shard unchanged since (its time), the range still inside it.
        Some(m) => {
            mtime_ns == old.mtime_ns
                && m.part.bytes() == old.bytes
                && m.part.range.end().is_some_and(|e| e <= bytes)
        }
        None => (bytes, mtime_ns) == (old.bytes, old.mtime_ns),
    }
}

/// How many files of `dir`'s index changed since indexing (size or modification time, or
/// gone): what a rebuild ([`build`]) would re-probe. The loader asks at open and re-probes them
/// instead of skipping them at every epoch (a dataset copied with new modification times).
pub fn changed_since_indexing(
    dir: &Path,
    index_dir: Option<&Path>,
) -> Result<usize, crate::index::IndexError> {
    let index = Index::open_in(dir, index_dir)?;
    let Ok(root) = std::fs::canonicalize(index.dir()) else { return Ok(0) };
    let mut changed = 0;
    for i in 0..index.len() {
        let d = index.get(i)?;
        let always_probed =
            d.bytes == 0 || matches!(d.status, Status::DuplicateId | Status::BadPath | Status::Unreadable);
        if !always_probed && !unchanged(&root, index.path(i)?, &d) {
            changed += 1;
        }
    }
    Ok(changed)
}

/// The index file's bytes for these descriptors and paths (same order).
pub fn encode_index(
    descriptors: &[Descriptor],
    paths: &[&str],
    manifest_len: u64,
    manifest_mtime_ns: i64,
    manifest_sha256: [u8; 32],
) -> Vec<u8> {
    let paths_len: u64 = paths.iter().map(|p| p.len() as u64).sum();
    let mut header = Header::layout(descriptors.len() as u64, paths_len);
    header.manifest_len = manifest_len;
    header.manifest_mtime_ns = manifest_mtime_ns;
    header.manifest_sha256 = manifest_sha256;
    let mut out = Vec::with_capacity(header.file_len() as usize);
    out.extend_from_slice(&header.encode());
    let mut offset = 0u64;
    for (d, p) in descriptors.iter().zip(paths) {
        let mut rec = [0u8; RECORD_BYTES];
        record::encode(d, PathRef { offset, len: p.len() as u32 }, &mut rec);
        out.extend_from_slice(&rec);
        offset += p.len() as u64;
    }
    let mut ids: Vec<(u64, u64)> = descriptors.iter().enumerate().map(|(i, d)| (d.id, i as u64)).collect();
    ids.sort_unstable();
    for (id, pos) in ids {
        let mut e = [0u8; ID_ENTRY_BYTES];
        e[..8].copy_from_slice(&id.to_le_bytes());
        e[8..].copy_from_slice(&pos.to_le_bytes());
        out.extend_from_slice(&e);
    }
    for p in paths {
        out.extend_from_slice(p.as_bytes());
    }
    out
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("index");
    let tmp = parent.join(format!(".{name}.tmp.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

fn progress_bar(wanted: bool, len: u64) -> indicatif::ProgressBar {
    if !wanted || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("probing {bar:40} {pos}/{len} files  {per_sec}  eta {eta}")
    {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Indexes written before the probe read Matroska's cues hold keyint 0 for every MKV and
    /// WebM: a rebuild re-probes those, and only those, of the unchanged files.
    #[test]
    fn matroska_videos_without_a_keyframe_interval_are_probed_again() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.mkv"), b"0123456789").unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let (bytes, mtime_ns) = probe::stat(&root.join("a.mkv")).unwrap();
        let old = Descriptor {
            modality: Modality::Video,
            container: Container::Mkv,
            status: Status::Ok,
            bytes,
            mtime_ns,
            keyint: 25,
            ..Descriptor::default()
        };
        assert!(unchanged(&root, "a.mkv", &old));
        assert!(!unchanged(&root, "a.mkv", &Descriptor { keyint: 0, ..old }));
        assert!(unchanged(&root, "a.mkv", &Descriptor { keyint: 0, container: Container::Mp4, ..old }));
        assert!(unchanged(&root, "a.mkv", &Descriptor { keyint: 0, modality: Modality::Image, ..old }));
        assert!(!unchanged(&root, "a.mkv", &Descriptor { bytes: bytes + 1, ..old }));
    }
}
