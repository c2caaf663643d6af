//! The dataset manifest: `manifest.jsonl`, one sample a line (`shared/bench/PROTOCOL.md`, "Dataset").
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
//! A malformed line never stops the parse: it becomes a [`LineError`] naming the line, and the
//! rest of the manifest is read.

use serde::Deserialize;

/// The manifest's file name inside a dataset folder.
pub const MANIFEST_FILE: &str = "manifest.jsonl";

/// One sample of the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Sample id (any u64).
    pub id: u64,
    /// File path relative to the dataset folder.
    pub path: String,
    /// Text tokens of the sample.
    pub text_tokens: u32,
    /// 1-based line number in the manifest.
    pub line: u32,
}

/// A line that could not be read as a manifest entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number.
    pub line: u32,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{MANIFEST_FILE} line {}: {} (expected {{\"id\": <u64>, \"path\": \"<relative path>\", \"text_tokens\": <u32>}}; fix or delete the line)",
            self.line, self.reason
        )
    }
}

/// A parsed manifest: the good entries in file order, and the lines that were not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Entries in file order.
    pub entries: Vec<Entry>,
    /// Malformed lines.
    pub errors: Vec<LineError>,
}

#[derive(Deserialize)]
struct RawEntry {
    id: u64,
    path: String,
    #[serde(default)]
    text_tokens: u32,
}

/// Parses manifest bytes. Blank lines are ignored; every other line is an entry or an error.
pub fn parse(bytes: &[u8]) -> Manifest {
    let mut out = Manifest::default();
    for (i, raw_line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let raw_line = raw_line.strip_suffix(b"\r").unwrap_or(raw_line);
        if raw_line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        match serde_json::from_slice::<RawEntry>(raw_line) {
            Ok(r) => out.entries.push(Entry { id: r.id, path: r.path, text_tokens: r.text_tokens, line }),
            Err(e) => out.errors.push(LineError { line, reason: e.to_string() }),
        }
    }
    out
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
                Entry { id: 1, path: "a.mp4".into(), text_tokens: 3, line: 1 },
                Entry { id: 2, path: "c.png".into(), text_tokens: 0, line: 5 },
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
    }
}
