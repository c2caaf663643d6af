//! Shards named by a brace pattern, as WebDataset names them: `train-{000000..000127}.tar`.
//!
//! ```
//! use datahelix::shard::pattern::{expand, split};
//!
//! assert_eq!(expand("s-{08..11}.tar").unwrap(), ["s-08.tar", "s-09.tar", "s-10.tar", "s-11.tar"]);
//! assert_eq!(expand("{train,val}-{0..1}.tar").unwrap(), ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]);
//! let (folder, pattern) = split(std::path::Path::new("data/wds/train-{000000..000003}.tar")).unwrap();
//! assert_eq!((folder.to_str().unwrap(), pattern.as_str()), ("data/wds", "train-{000000..000003}.tar"));
//! assert!(split(std::path::Path::new("data/wds")).is_none());
//! // Braces in folders too: the pattern starts at the first component holding a group.
//! let (folder, pattern) = split(std::path::Path::new("data/wds/{train,val}/{0..1}.tar")).unwrap();
//! assert_eq!((folder.to_str().unwrap(), pattern.as_str()), ("data/wds", "{train,val}/{0..1}.tar"));
//! assert_eq!(expand(&pattern).unwrap(), ["train/0.tar", "train/1.tar", "val/0.tar", "val/1.tar"]);
//! ```
//!
//! A range `{A..B}` counts from A to B (either way), each number as wide as the wider of A and B
//! when either is written with a leading zero; a list `{x,y}` takes each; several groups make
//! every combination, in order. A pattern starts at the first component of the path holding a
//! brace group and may span folders (`{train,val}/shard-{0..9}.tar`); a folder whose name merely
//! holds braces (`clips{2024}`) is a plain folder unless the path's last component is a pattern.

use std::path::{Path, PathBuf};

/// The most names one pattern may expand to.
pub const MAX_NAMES: usize = 1_000_000;

/// The folder and the pattern of a data path that names shards by a brace pattern; `None` for a
/// plain path (a dataset folder). The pattern starts at the first component holding a brace
/// group where what follows expands ([`expand`]); else a last component holding one is the
/// pattern (and [`expand`] says what is wrong with it).
pub fn split(path: &Path) -> Option<(PathBuf, String)> {
    let parts: Vec<&str> = path.iter().map(|c| c.to_str()).collect::<Option<_>>()?;
    let has_group = |c: &str| c.find('{').is_some_and(|open| c[open..].contains('}'));
    let at = |k: usize| {
        let folder: PathBuf = parts[..k].iter().collect();
        let folder = if folder.as_os_str().is_empty() { PathBuf::from(".") } else { folder };
        (folder, parts[k..].join("/"))
    };
    let last = parts.len().checked_sub(1)?;
    for k in (0..last).filter(|&k| has_group(parts[k])) {
        let (folder, pattern) = at(k);
        if expand(&pattern).is_ok() {
            return Some((folder, pattern));
        }
    }
    has_group(parts[last]).then(|| at(last))
}

/// The names `pattern` stands for, in order; an error saying why for a malformed pattern or one
/// of more than [`MAX_NAMES`] names.
pub fn expand(pattern: &str) -> Result<Vec<String>, String> {
    let mut names = vec![String::new()];
    let mut rest = pattern;
    while let Some(open) = rest.find('{') {
        let close =
            open + rest[open..].find('}').ok_or_else(|| format!("{pattern}: a '{{' without its '}}'"))?;
        let choices = group(&rest[open + 1..close]).map_err(|e| format!("{pattern}: {e}"))?;
        if names.len().saturating_mul(choices.len()) > MAX_NAMES {
            return Err(format!("{pattern}: more than {MAX_NAMES} names"));
        }
        let prefix = &rest[..open];
        names = names.iter().flat_map(|n| choices.iter().map(move |c| format!("{n}{prefix}{c}"))).collect();
        rest = &rest[close + 1..];
    }
    if rest.contains('}') {
        return Err(format!("{pattern}: a '}}' without its '{{'"));
    }
    Ok(names.into_iter().map(|n| n + rest).collect())
}

/// One brace group's choices: `A..B` or `x,y,...`.
fn group(body: &str) -> Result<Vec<String>, String> {
    if let Some((a, b)) = body.split_once("..") {
        let number = |s: &str| {
            (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())).then(|| s.parse::<u64>().ok())?
        };
        let (Some(x), Some(y)) = (number(a), number(b)) else {
            return Err(format!("{{{body}}} is not a range of two numbers"));
        };
        if x.abs_diff(y) >= MAX_NAMES as u64 {
            return Err(format!("{{{body}}} holds more than {MAX_NAMES} names"));
        }
        let padded = (a.len() > 1 && a.starts_with('0')) || (b.len() > 1 && b.starts_with('0'));
        let width = if padded { a.len().max(b.len()) } else { 0 };
        let range: Box<dyn Iterator<Item = u64>> =
            if x <= y { Box::new(x..=y) } else { Box::new((y..=x).rev()) };
        return Ok(range.map(|v| format!("{v:0width$}")).collect());
    }
    if body.contains(',') {
        return Ok(body.split(',').map(str::to_owned).collect());
    }
    Err(format!("{{{body}}} is neither a range A..B nor a list x,y"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_and_huge_patterns_are_errors() {
        for bad in ["a-{1..}.tar", "a-{x..3}.tar", "a-{3}.tar", "a-{1..3.tar", "a-1..3}.tar"] {
            assert!(expand(bad).is_err(), "{bad}");
        }
        assert!(expand("{0..999}-{0..999}-{0..9}.tar").unwrap_err().contains("more than"));
        assert_eq!(expand("a.tar").unwrap(), ["a.tar"]);
        assert_eq!(expand("{3..1}").unwrap(), ["3", "2", "1"]);
        assert_eq!(expand("{0..10}").unwrap().last().unwrap(), "10");
    }

    #[test]
    fn a_pattern_starts_at_its_first_component_with_a_group() {
        let split = |p: &str| split(Path::new(p)).map(|(f, p)| (f.to_str().unwrap().to_owned(), p));
        let pair = |f: &str, p: &str| Some((f.to_owned(), p.to_owned()));
        assert_eq!(split("d/s-{0..3}.tar"), pair("d", "s-{0..3}.tar"));
        assert_eq!(split("s-{0..3}.tar"), pair(".", "s-{0..3}.tar"));
        assert_eq!(split("/d/{a,b}/s-{0..3}.tar"), pair("/d", "{a,b}/s-{0..3}.tar"));
        assert_eq!(split("{a,b}/s.tar"), pair(".", "{a,b}/s.tar"));
        // A folder named with braces is a folder; a malformed last component is still a pattern.
        assert_eq!(split("d/clips{2024}/s-{0..1}.tar"), pair("d/clips{2024}", "s-{0..1}.tar"));
        assert_eq!(split("d/clips{2024}"), pair("d", "clips{2024}"));
        assert_eq!(split("d/clips{2024}/x"), None);
        assert_eq!(split("d/wds"), None);
    }
}
