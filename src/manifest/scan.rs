//! `datahelix manifest DIR`: a `manifest.jsonl` for a folder of media that has none, with each
//! file's sidecar caption (`NAME.txt`, or `NAME.json`'s `caption` or `text`).
//!
//! ```
//! use datahelix::manifest::{parse, write_from_media, ScanOptions};
//!
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::create_dir(dir.path().join("clips")).unwrap();
//! std::fs::write(dir.path().join("clips/a.mp4"), b"(a video)").unwrap();
//! std::fs::write(dir.path().join("clips/a.txt"), "a cat on a mat\n").unwrap();
//! std::fs::write(dir.path().join("b.png"), b"(an image)").unwrap();
//! let report = write_from_media(dir.path(), &ScanOptions::default()).unwrap();
//! assert_eq!((report.samples, report.with_caption), (2, 1));
//! let m = parse(&std::fs::read(dir.path().join("manifest.jsonl")).unwrap());
//! assert_eq!(m.entries[0].path, "b.png");
//! assert_eq!((m.entries[1].path.as_str(), m.entries[1].text_tokens), ("clips/a.mp4", 5));
//! ```

use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::Digest;

use super::{find, FindError, MANIFEST_FILE};

/// File name endings taken as media (case-insensitive).
const MEDIA: [&str; 8] = ["mp4", "m4v", "mov", "mkv", "webm", "jpg", "jpeg", "png"];

/// The longest sidecar caption file read; longer ones are refused by name.
const MAX_CAPTION_BYTES: u64 = 1 << 20;

/// How [`write_from_media`] works.
#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    /// Replace an existing `manifest.jsonl`.
    pub force: bool,
}

/// What [`write_from_media`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct ScanReport {
    /// The manifest written.
    pub manifest: PathBuf,
    /// Media files listed.
    pub samples: usize,
    /// Of those, files with a sidecar caption.
    pub with_caption: usize,
}

#[derive(Serialize)]
struct Line<'a> {
    id: u64,
    path: &'a str,
    text_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    caption: Option<&'a str>,
}

/// The id of the file at `path` (relative, `/`-separated): the first 8 bytes of its SHA-256, so
/// the same folder gets the same ids on every machine and a file keeps its id when others come.
pub fn id_of_path(path: &str) -> u64 {
    let digest = sha2::Sha256::digest(format!("datahelix-manifest\0{path}").as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Writes `dir/manifest.jsonl` listing every media file beneath `dir` (by name ending; sorted by
/// path; hidden folders and symbolically linked folders are not entered), with an id from its
/// path ([`id_of_path`]), its sidecar caption and `text_tokens` = the caption's
/// whitespace-separated words (a tokenizer's count differs: write your own `text_tokens` where
/// it matters).
pub fn write_from_media(dir: &Path, opts: &ScanOptions) -> Result<ScanReport, String> {
    match find(dir) {
        Err(FindError::None { .. }) => {}
        Ok((path, _)) if opts.force && path.ends_with(MANIFEST_FILE) => {}
        Ok((path, _)) => {
            return Err(format!(
                "{} exists; leave it, or replace it with --force (only a manifest.jsonl is replaced)",
                path.display()
            ))
        }
        Err(e) => return Err(e.to_string()),
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    let mut text = String::new();
    let mut with_caption = 0;
    for rel in &files {
        let caption = caption_of(dir, rel)?;
        with_caption += caption.is_some() as usize;
        let words = caption.as_deref().map_or(0, |c| c.split_whitespace().count());
        let line = Line {
            id: id_of_path(rel),
            path: rel,
            text_tokens: u32::try_from(words).unwrap_or(u32::MAX),
            caption: caption.as_deref(),
        };
        text.push_str(&serde_json::to_string(&line).map_err(|e| e.to_string())?);
        text.push('\n');
    }
    let manifest = dir.join(MANIFEST_FILE);
    let partial = dir.join(format!(".{MANIFEST_FILE}.partial"));
    std::fs::write(&partial, text).and_then(|()| std::fs::rename(&partial, &manifest)).map_err(|e| {
        format!("cannot write {}: {e}; check that the folder is writable", manifest.display())
    })?;
    Ok(ScanReport { manifest, samples: files.len(), with_caption })
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            eprintln!("datahelix manifest: skipping {} (its name is not UTF-8)", entry.path().display());
            continue;
        };
        let kind = entry.file_type().map_err(|e| format!("cannot stat {}: {e}", entry.path().display()))?;
        if kind.is_dir() {
            if !name.starts_with('.') {
                walk(root, &entry.path(), out)?;
            }
            continue;
        }
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
        if ext.is_some_and(|e| MEDIA.contains(&e.as_str())) {
            let rel = entry.path().strip_prefix(root).expect("beneath the root").to_owned();
            let parts: Vec<&str> = rel.iter().filter_map(|p| p.to_str()).collect();
            out.push(parts.join("/"));
        }
    }
    Ok(())
}

/// The caption of media file `rel`: `STEM.txt`, else `STEM.json`'s `caption` or `text` string.
fn caption_of(root: &Path, rel: &str) -> Result<Option<String>, String> {
    let stem = rel.rsplit_once('.').map_or(rel, |(s, _)| s);
    for ext in ["txt", "json"] {
        let path = root.join(format!("{stem}.{ext}"));
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if !meta.is_file() {
            continue;
        }
        if meta.len() > MAX_CAPTION_BYTES {
            return Err(format!(
                "{}: a caption of {} bytes (at most {MAX_CAPTION_BYTES}); shorten or remove it",
                path.display(),
                meta.len()
            ));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
        if ext == "txt" {
            return Ok(Some(text.trim().to_owned()));
        }
        let doc: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
        let caption = ["caption", "text"].iter().find_map(|k| doc.get(*k).and_then(|v| v.as_str()));
        return Ok(caption.map(|c| c.trim().to_owned()));
    }
    Ok(None)
}
