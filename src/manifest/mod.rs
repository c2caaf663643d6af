//! The dataset manifest: one sample a row — `manifest.jsonl` (`shared/bench/PROTOCOL.md`,
//! "Dataset"), or the same columns as a metadata table, `manifest.csv` or `manifest.parquet`, as
//! public datasets ship their metadata (Panda-70M, OpenVid, WebVid). A folder holds exactly one.
//!
//! ```
//! use datahelix::manifest::parse;
//!
//! let text = "{\"id\": 18446744073709551615, \"path\": \"v/a.mp4\", \"text_tokens\": 12}\n\
//!             not json\n";
//! let m = parse(text.as_bytes());
//! assert_eq!(m.entries.len(), 1);
//! assert_eq!(m.entries[0].id, u64::MAX);
//! assert_eq!(m.errors.len(), 1);
//! assert_eq!(m.errors[0].line, 2);
//! ```
//!
//! A malformed row never stops the parse: it becomes a [`LineError`] naming the row, and the
//! rest of the manifest is read. Columns other than `id`, `path` and `text_tokens` (captions,
//! labels, ...) are ignored.

use std::path::{Path, PathBuf};

use serde::Deserialize;

mod scan;
mod table;

pub use scan::{id_of_path, write_from_media, ScanOptions, ScanReport};

/// The JSON-lines manifest's file name inside a dataset folder.
pub const MANIFEST_FILE: &str = "manifest.jsonl";

/// The manifest formats a dataset folder may hold, by file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `manifest.jsonl`: one JSON object a line.
    Jsonl,
    /// `manifest.csv`: a header row naming the columns, then one sample a row.
    Csv,
    /// `manifest.parquet`: a Parquet table with those columns.
    Parquet,
    /// No manifest file: WebDataset `*.tar` (or `*.zip`) shards, whose samples are read from
    /// the shards ([`crate::shard`]).
    WebDataset,
}

impl Format {
    /// Every manifest file format, in the order [`find`] looks for them.
    pub const ALL: [Format; 3] = [Format::Jsonl, Format::Csv, Format::Parquet];

    /// The manifest's file name in this format.
    pub fn file_name(self) -> &'static str {
        match self {
            Format::Jsonl => MANIFEST_FILE,
            Format::Csv => "manifest.csv",
            Format::Parquet => "manifest.parquet",
            Format::WebDataset => "*.tar / *.zip",
        }
    }

    /// What a row is called in this format's error messages.
    fn row_word(self) -> &'static str {
        match self {
            Format::Jsonl | Format::Csv => "line",
            Format::Parquet | Format::WebDataset => "row",
        }
    }
}

/// Why a dataset folder has no single manifest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FindError {
    /// None of the manifest files is there.
    #[error("{dir} has no manifest (manifest.jsonl, manifest.csv or manifest.parquet; see PROTOCOL.md, \"Dataset\") and no WebDataset *.tar or *.zip shards; make a manifest from a folder of media with `datahelix manifest {dir}`")]
    None {
        /// The dataset folder.
        dir: PathBuf,
    },
    /// A brace pattern of shards that cannot be used: malformed, or naming a shard not there.
    #[error("{0}")]
    Shards(String),
    /// More than one is there: which one is meant cannot be guessed.
    #[error("{dir} holds more than one manifest ({found}); keep one of them")]
    Several {
        /// The dataset folder.
        dir: PathBuf,
        /// The file names found.
        found: String,
    },
}

/// The manifest of dataset `dir` and its format: the one of `manifest.jsonl`, `manifest.csv`
/// and `manifest.parquet` that is there.
pub fn find(dir: &Path) -> Result<(PathBuf, Format), FindError> {
    let present: Vec<Format> =
        Format::ALL.into_iter().filter(|f| dir.join(f.file_name()).symlink_metadata().is_ok()).collect();
    match present.as_slice() {
        [] => Err(FindError::None { dir: dir.to_path_buf() }),
        [one] => Ok((dir.join(one.file_name()), *one)),
        several => Err(FindError::Several {
            dir: dir.to_path_buf(),
            found: several.iter().map(|f| f.file_name()).collect::<Vec<_>>().join(", "),
        }),
    }
}

/// Parses a manifest's bytes in `format`. `Err` only when the whole file cannot be read as
/// that format (no `id` or `path` column, not a Parquet file): then it says why.
pub fn parse_as(format: Format, bytes: &[u8]) -> Result<Manifest, String> {
    match format {
        Format::Jsonl => Ok(parse(bytes)),
        Format::Csv => table::parse_csv(bytes),
        Format::Parquet => table::parse_parquet(bytes),
        Format::WebDataset => {
            Err("WebDataset shards are read by datahelix::shard, not parsed as a manifest".into())
        }
    }
}

/// One sample of the manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Sample id (any u64).
    pub id: u64,
    /// File path relative to the dataset folder.
    pub path: String,
    /// Text tokens of the sample.
    pub text_tokens: u32,
    /// 1-based line of the manifest (`manifest.jsonl`, `manifest.csv`: the file's line the row
    /// starts on) or row (`manifest.parquet`).
    pub line: u32,
    /// The row's other fields (caption, label, any JSON) as a JSON object's text; `None` when
    /// it has none. CSV cells are strings; Parquet's typed values keep their JSON types.
    pub extra: Option<Box<str>>,
}

/// A row that could not be read as a manifest entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// The manifest it is in.
    pub format: Format,
    /// 1-based line (or row: [`Entry::line`]).
    pub line: u32,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.format == Format::WebDataset {
            // The reason names the shard and the sample's key.
            return write!(f, "{} (fix or rewrite that sample in its shard)", self.reason);
        }
        let expected = match self.format {
            Format::Jsonl => "{\"id\": <u64>, \"path\": \"<relative path>\", \"text_tokens\": <u32>}",
            Format::Csv | Format::Parquet | Format::WebDataset => {
                "columns id (u64), path (relative path), text_tokens (u32, optional)"
            }
        };
        write!(
            f,
            "{} {row} {}: {} (expected {expected}; fix or delete the {row})",
            self.format.file_name(),
            self.line,
            self.reason,
            row = self.format.row_word(),
        )
    }
}

/// A parsed manifest: the good entries in file order, and the rows that were not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Entries in file order.
    pub entries: Vec<Entry>,
    /// Malformed rows.
    pub errors: Vec<LineError>,
}

#[derive(Deserialize)]
struct RawEntry {
    id: u64,
    path: String,
    #[serde(default)]
    text_tokens: u32,
}

/// Parses `manifest.jsonl` bytes. Blank lines are ignored; every other line is an entry or an
/// error.
pub fn parse(bytes: &[u8]) -> Manifest {
    let mut out = Manifest::default();
    for (i, raw_line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let raw_line = raw_line.strip_suffix(b"\r").unwrap_or(raw_line);
        if raw_line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        match serde_json::from_slice::<RawEntry>(raw_line) {
            Ok(r) => {
                let extra = extra_fields(raw_line);
                out.entries.push(Entry { id: r.id, path: r.path, text_tokens: r.text_tokens, line, extra })
            }
            Err(e) => out.errors.push(LineError { format: Format::Jsonl, line, reason: e.to_string() }),
        }
    }
    out
}

/// The fields of a JSON-lines row other than `id`, `path` and `text_tokens`, as an object's text.
fn extra_fields(line: &[u8]) -> Option<Box<str>> {
    let mut object: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(line).ok()?;
    for key in ["id", "path", "text_tokens"] {
        object.remove(key);
    }
    extra_object(object)
}

/// `object`'s text, `None` when it is empty.
pub(crate) fn extra_object(object: serde_json::Map<String, serde_json::Value>) -> Option<Box<str>> {
    (!object.is_empty()).then(|| serde_json::Value::Object(object).to_string().into_boxed_str())
}

/// A sample's metadata: its `path` first, then the manifest row's other fields.
///
/// ```
/// use datahelix::manifest::{meta_json, parse};
///
/// let m = parse(br#"{"id": 1, "path": "a.mp4", "caption": "a cat", "label": 3}"#);
/// assert_eq!(meta_json(&m.entries[0]), r#"{"path":"a.mp4","caption":"a cat","label":3}"#);
/// ```
pub fn meta_json(e: &Entry) -> String {
    let path = serde_json::Value::String(e.path.clone()).to_string();
    match e.extra.as_deref() {
        Some(extra) if extra.len() > 2 => format!("{{\"path\":{path},{}", &extra[1..]),
        _ => format!("{{\"path\":{path}}}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_bad_and_blank_lines() {
        let text = b"{\"id\":1,\"path\":\"a.mp4\",\"text_tokens\":3}\r\n\n  \n{\"id\":-1,\"path\":\"b\"}\n{\"id\":2,\"path\":\"c.png\"}\n{\"id\":3}\n\xff\xfe\n";
        let m = parse(text);
        assert_eq!(
            m.entries,
            vec![
                Entry { id: 1, path: "a.mp4".into(), text_tokens: 3, line: 1, extra: None },
                Entry { id: 2, path: "c.png".into(), text_tokens: 0, line: 5, extra: None },
            ]
        );
        assert_eq!(m.errors.iter().map(|e| e.line).collect::<Vec<_>>(), vec![4, 6, 7]);
        assert!(m.errors[0].to_string().contains("line 4"));
    }

    #[test]
    fn extra_keys_such_as_captions_are_ignored() {
        let m = parse(b"{\"id\":1,\"path\":\"a.mp4\",\"caption\":\"a cat\",\"text_tokens\":3}");
        assert_eq!(m.entries.len(), 1);
        assert_eq!(m.entries[0].text_tokens, 3);
        assert_eq!(m.entries[0].extra.as_deref(), Some(r#"{"caption":"a cat"}"#));
    }
}
