//! Manifests as metadata tables: `manifest.csv` and `manifest.parquet`, with columns `id`,
//! `path` and (optionally) `text_tokens`, in any order among any others.
//!
//! ```
//! use datahelix::manifest::{parse_as, Format};
//!
//! let csv = "caption,id,path,text_tokens\n\"a cat, sleeping\",7,v/a.mp4,12\nx,-1,v/b.mp4,3\n";
//! let m = parse_as(Format::Csv, csv.as_bytes()).unwrap();
//! assert_eq!((m.entries[0].id, m.entries[0].path.as_str(), m.entries[0].text_tokens), (7, "v/a.mp4", 12));
//! assert_eq!(m.entries[0].line, 2);
//! assert_eq!(m.errors[0].line, 3);
//! ```

use parquet::file::reader::FileReader;
use parquet::record::Field;

use super::{Entry, Format, LineError, Manifest};

/// The columns a manifest table is read from.
const ID: &str = "id";
const PATH: &str = "path";
const TEXT_TOKENS: &str = "text_tokens";

/// One row's cells of the three columns, as text or numbers, before checking.
enum Cell<'a> {
    Missing,
    Text(&'a str),
    Unsigned(u64),
    Signed(i64),
    Other(&'a str),
}

/// The entry of one row, or why it is not one.
fn entry(id: Cell, path: Cell, tokens: Cell, line: u32) -> Result<Entry, String> {
    let unsigned = |c: Cell, what: &str, max: u64| -> Result<Option<u64>, String> {
        let v = match c {
            Cell::Missing => return Ok(None),
            Cell::Text(t) if t.trim().is_empty() => return Ok(None),
            Cell::Text(t) => {
                t.trim().parse::<u64>().map_err(|_| format!("{what} {t:?} is not an unsigned integer"))?
            }
            Cell::Unsigned(u) => u,
            Cell::Signed(i) => u64::try_from(i).map_err(|_| format!("{what} {i} is negative"))?,
            Cell::Other(kind) => return Err(format!("{what} is a {kind}, not an integer")),
        };
        if v > max {
            return Err(format!("{what} {v} is larger than {max}"));
        }
        Ok(Some(v))
    };
    let id = unsigned(id, ID, u64::MAX)?.ok_or_else(|| format!("{ID} is empty"))?;
    let path = match path {
        Cell::Text(t) if !t.is_empty() => t.to_owned(),
        Cell::Missing | Cell::Text(_) => return Err(format!("{PATH} is empty")),
        Cell::Unsigned(_) | Cell::Signed(_) => return Err(format!("{PATH} is a number, not a path")),
        Cell::Other(kind) => return Err(format!("{PATH} is a {kind}, not a string")),
    };
    let text_tokens = unsigned(tokens, TEXT_TOKENS, u32::MAX as u64)?.unwrap_or(0) as u32;
    Ok(Entry { id, path, text_tokens, line, extra: None })
}

fn push(out: &mut Manifest, format: Format, line: u32, row: Result<Entry, String>) {
    match row {
        Ok(e) => out.entries.push(e),
        Err(reason) => out.errors.push(LineError { format, line, reason }),
    }
}

/// Where each of the three columns is among `names`; an error without `id` or `path`.
fn columns<'a>(names: impl Iterator<Item = &'a str>, file: &str) -> Result<[Option<usize>; 3], String> {
    let mut at = [None; 3];
    for (i, name) in names.enumerate() {
        for (k, want) in [ID, PATH, TEXT_TOKENS].iter().enumerate() {
            if name.trim() == *want && at[k].is_none() {
                at[k] = Some(i);
            }
        }
    }
    if at[0].is_none() || at[1].is_none() {
        return Err(format!("{file} needs columns named {ID} and {PATH} (and optionally {TEXT_TOKENS})"));
    }
    Ok(at)
}

/// Parses `manifest.csv`: a header row, then one sample a row (RFC 4180 quoting; rows may have
/// more or fewer cells than the header). Blank rows are ignored.
pub(super) fn parse_csv(bytes: &[u8]) -> Result<Manifest, String> {
    let file = Format::Csv.file_name();
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(bytes);
    let header =
        reader.byte_headers().map_err(|e| format!("{file}: cannot read its header row: {e}"))?.clone();
    let names: Vec<String> = header.iter().map(|h| String::from_utf8_lossy(h).into_owned()).collect();
    let [id, path, tokens] = columns(names.iter().map(|n| n.trim_start_matches('\u{feff}')), file)?;
    let mut out = Manifest::default();
    let mut record = csv::ByteRecord::new();
    // The file's line a byte offset is on (the reader's own line count is not that of the file).
    let newlines: Vec<usize> =
        bytes.iter().enumerate().filter(|(_, &b)| b == b'\n').map(|(i, _)| i).collect();
    let line_of = |p: &csv::Position| {
        // A record's position may be that of the line ending before it.
        let mut byte = usize::try_from(p.byte()).unwrap_or(usize::MAX).min(bytes.len());
        while bytes.get(byte).is_some_and(|b| matches!(b, b'\r' | b'\n')) {
            byte += 1;
        }
        u32::try_from(newlines.partition_point(|&n| n < byte) + 1).unwrap_or(u32::MAX)
    };
    loop {
        let start = reader.position().clone();
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {
                if record.iter().all(|c| c.iter().all(u8::is_ascii_whitespace)) {
                    continue;
                }
                let line = line_of(record.position().unwrap_or(&start));
                let cell = |k: Option<usize>| match k.and_then(|k| record.get(k)) {
                    None => Ok(Cell::Missing),
                    Some(c) => std::str::from_utf8(c)
                        .map(Cell::Text)
                        .map_err(|_| "a cell is not UTF-8 text".to_owned()),
                };
                let row = (|| {
                    let mut e = entry(cell(id)?, cell(path)?, cell(tokens)?, line)?;
                    e.extra = csv_extra(&names, [id, path, tokens], &record);
                    Ok(e)
                })();
                push(&mut out, Format::Csv, line, row);
            }
            Err(e) => {
                let line = line_of(e.position().unwrap_or(&start));
                out.errors.push(LineError { format: Format::Csv, line, reason: e.to_string() });
                if !matches!(e.kind(), csv::ErrorKind::UnequalLengths { .. } | csv::ErrorKind::Utf8 { .. }) {
                    break;
                }
            }
        }
    }
    Ok(out)
}

/// A CSV row's other non-empty cells, by their header's names, as strings.
fn csv_extra(names: &[String], used: [Option<usize>; 3], record: &csv::ByteRecord) -> Option<Box<str>> {
    let mut object = serde_json::Map::new();
    for (k, cell) in record.iter().enumerate() {
        let Some(name) = names.get(k) else { continue };
        if used.contains(&Some(k)) || cell.is_empty() {
            continue;
        }
        let text = String::from_utf8_lossy(cell).into_owned();
        object.entry(name.trim().to_owned()).or_insert(serde_json::Value::String(text));
    }
    super::extra_object(object)
}

/// Parses `manifest.parquet` (any compression the reader was built with: Snappy, zstd, gzip,
/// LZ4). A file the Parquet reader cannot read is an error; so is a row group it fails on part
/// way, after the rows before it (named by row).
pub(super) fn parse_parquet(bytes: &[u8]) -> Result<Manifest, String> {
    let file = Format::Parquet.file_name();
    // The Parquet reader is a large body of code reading an untrusted file: a panic in it must
    // become this file's error, not end the program.
    let parsed = std::panic::catch_unwind(|| parse_parquet_unguarded(bytes, file));
    parsed.unwrap_or_else(|_| {
        Err(format!("{file}: the Parquet reader failed on this file (damaged?); rewrite it"))
    })
}

fn parse_parquet_unguarded(bytes: &[u8], file: &str) -> Result<Manifest, String> {
    let unreadable = |e: parquet::errors::ParquetError| format!("{file} is not a readable Parquet file: {e}");
    let reader = parquet::file::reader::SerializedFileReader::new(bytes::Bytes::copy_from_slice(bytes))
        .map_err(unreadable)?;
    let schema = reader.metadata().file_metadata().schema();
    let fields = schema.get_fields();
    columns(fields.iter().map(|f| f.name()), file)?;
    let rows = reader.get_row_iter(None).map_err(unreadable)?;
    let mut out = Manifest::default();
    for (i, row) in rows.enumerate() {
        let line = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let row = match row {
            Ok(r) => r,
            Err(e) => {
                out.errors.push(LineError {
                    format: Format::Parquet,
                    line,
                    reason: format!("unreadable: {e}"),
                });
                break;
            }
        };
        let cell = |name: &str| {
            row.get_column_iter()
                .find(|(n, _)| n.as_str() == name)
                .map_or(Cell::Missing, |(_, f)| field_cell(f))
        };
        let parsed = entry(cell(ID), cell(PATH), cell(TEXT_TOKENS), line).map(|mut e| {
            let others = row
                .get_column_iter()
                .filter(|(n, f)| ![ID, PATH, TEXT_TOKENS].contains(&n.as_str()) && !matches!(f, Field::Null));
            e.extra = super::extra_object(others.map(|(n, f)| (n.clone(), f.to_json_value())).collect());
            e
        });
        push(&mut out, Format::Parquet, line, parsed);
    }
    Ok(out)
}

fn field_cell(f: &Field) -> Cell<'_> {
    match f {
        Field::Null => Cell::Missing,
        Field::Str(s) => Cell::Text(s),
        Field::Bytes(b) => b.as_utf8().map_or(Cell::Other("byte string that is not UTF-8"), Cell::Text),
        Field::UByte(v) => Cell::Unsigned(*v as u64),
        Field::UShort(v) => Cell::Unsigned(*v as u64),
        Field::UInt(v) => Cell::Unsigned(*v as u64),
        Field::ULong(v) => Cell::Unsigned(*v),
        Field::Byte(v) => Cell::Signed(*v as i64),
        Field::Short(v) => Cell::Signed(*v as i64),
        Field::Int(v) => Cell::Signed(*v as i64),
        Field::Long(v) => Cell::Signed(*v),
        Field::Float(_) | Field::Double(_) | Field::Float16(_) | Field::Decimal(_) => {
            Cell::Other("fractional number")
        }
        Field::Bool(_) => Cell::Other("boolean"),
        _ => Cell::Other("date, time, list or map"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_rows_quoting_and_bad_cells() {
        let csv = "\u{feff}path,text_tokens,id,caption\r\n\
                   v/a.mp4,3,1,\"said \"\"hi\"\", left\"\r\n\
                   \r\n\
                   v/b.mp4,,2\n\
                   v/c.mp4,x,3,\n\
                   ,1,4,\n\
                   v/e.mp4,1,99999999999999999999,\n\
                   v/f.mp4,5000000000,6,\n";
        let m = parse_csv(csv.as_bytes()).unwrap();
        let got: Vec<_> = m.entries.iter().map(|e| (e.id, e.path.as_str(), e.text_tokens, e.line)).collect();
        assert_eq!(got, vec![(1, "v/a.mp4", 3, 2), (2, "v/b.mp4", 0, 4)]);
        let lines: Vec<u32> = m.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![5, 6, 7, 8]);
        assert!(
            m.errors[0].to_string().starts_with("manifest.csv line 5: text_tokens \"x\""),
            "{}",
            m.errors[0]
        );
    }

    #[test]
    fn a_table_without_the_columns_says_which() {
        let e = parse_csv(b"file,tokens\na.mp4,3\n").unwrap_err();
        assert!(e.contains("id") && e.contains("path"), "{e}");
        let e = parse_parquet(b"PAR1 not really").unwrap_err();
        assert!(e.contains("manifest.parquet"), "{e}");
    }
}
