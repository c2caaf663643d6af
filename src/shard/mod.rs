//! WebDataset shards as a dataset: a folder of `*.tar` (or `*.zip`) files, in it or its
//! subfolders ([`list`]), or a brace pattern of them (`data/train-{000000..000127}.tar`,
//! [`pattern`]), one sample a group of members sharing a key (`000017.mp4`, `000017.json`,
//! `000017.txt`, `000017.cls`), read in place.
//!
//! ```no_run
//! use datahelix::shard::{entries, list};
//!
//! let dir = std::path::Path::new("data/shards");
//! let shards = list(dir)?;
//! let m = entries(dir, &shards);
//! for e in &m.entries {
//!     println!("{} {} {}", e.id, e.path, e.extra.as_deref().unwrap_or("{}"));
//! }
//! for bad in &m.errors {
//!     eprintln!("{bad}");
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Samples are grouped as WebDataset groups them: a member's key is its name up to the first
//! dot of its last path component, its extension the rest (lower-cased), and consecutive members
//! with one key make a sample. A sample's media member is its first `.mp4`/`.m4v`/`.mov`/
//! `.mkv`/`.webm`/`.jpg`/`.jpeg`/`.png`; it is indexed by its byte range in the shard
//! ([`location::MemberPath`]) and probed and decoded straight from there, never extracted. The
//! `.json` member's fields, the `.txt` member (as `caption`) and the `.cls` member (as `label`)
//! become the sample's metadata, with `__key__` and `__shard__`; the json's `id` and
//! `text_tokens` are the sample's, else the id is a hash of shard name and key ([`id_of`]) and
//! `text_tokens` the caption's words.
//!
//! Zip archives, as several public video sets ship them (a folder of clips zipped whole), are
//! read the same way ([`zip`]): a clip with no json, txt or cls beside it is a sample of its
//! own, keyed by its path. A member stored uncompressed (`zip -0`) is read in place like a tar
//! member; a deflated one (`zip`'s default) is inflated into memory and checked (its size and
//! CRC-32) each time it is probed or decoded, so media are best stored (`zip -n .mp4:.mkv:.webm`).
//!
//! Nothing in a shard is trusted: a damaged header ends that shard's listing with an error
//! naming the shard and byte ([`tar::Damage`]), and the samples before it are indexed (a zip's
//! damaged entries are named one by one, [`zip::Listing::damaged`]); a sample
//! without a media member, with a metadata member that is not what its extension says, or with
//! one larger than [`MAX_META_BYTES`] is an error naming shard and key; a media member that does
//! not decode is the probe's to report, like a loose file.

pub mod location;
pub mod pattern;
pub mod tar;
pub mod zip;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::Digest;

use crate::manifest::{Entry, Format, LineError, Manifest};
use location::{MemberPath, Part, Window, SHARD_EXTENSIONS};

/// Extensions of media members, in the order a sample's media member is chosen.
pub const MEDIA: [&str; 8] = ["mp4", "m4v", "mov", "mkv", "webm", "jpg", "jpeg", "png"];

/// The largest `.json` / `.txt` / `.cls` member read as metadata.
pub const MAX_META_BYTES: u64 = 1 << 20;

/// One shard of a dataset folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    /// Its path relative to the dataset folder.
    pub rel: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// How many folders deep below the dataset folder [`list`] looks for shards.
pub const MAX_DEPTH: usize = 8;

/// Endings of compressed tars, named when met (they are not read: [`list`]).
const COMPRESSED_TARS: [&str; 8] =
    [".tar.gz", ".tgz", ".tar.zst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.lz4"];

/// Whether `name` is a shard's file name: it ends in `.tar` or `.zip`.
pub fn is_shard_name(name: &str) -> bool {
    SHARD_EXTENSIONS.iter().any(|e| name.ends_with(e))
}

/// The shards of dataset folder `dir`: its `*.tar` / `*.zip` files and those of its subfolders (as public
/// datasets ship them: `train/000000.tar`, `val/000000.tar`), up to [`MAX_DEPTH`] folders
/// down, sorted by path. Hidden files and folders are left out, and links to folders are not
/// followed (a link cannot make the walk loop); names holding `#` cannot be indexed and are
/// left out with a warning, as are subfolders that cannot be read and those too deep.
pub fn list(dir: &Path) -> std::io::Result<Vec<Shard>> {
    let mut out = Vec::new();
    list_into(dir, "", 0, &mut out)?;
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(out)
}

/// The shards of `folder` (`prefix` its path in the dataset folder, `depth` its depth) and of
/// its subfolders, into `out`.
fn list_into(folder: &Path, prefix: &str, depth: usize, out: &mut Vec<Shard>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(folder)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') {
            continue;
        }
        let rel = format!("{prefix}{name}");
        // The entry itself: a link is a link here, never the folder it points to.
        if entry.file_type()?.is_dir() {
            let sub = entry.path();
            if depth + 1 > MAX_DEPTH {
                tracing::warn!(
                    "{}: more than {MAX_DEPTH} folders below the dataset folder; shards there are \
                     left out (give the folder holding them as the dataset)",
                    sub.display()
                );
            } else if let Err(e) = list_into(&sub, &format!("{rel}/"), depth + 1, out) {
                tracing::warn!(
                    "{}: {e}; its shards are left out (make it readable and index again)",
                    sub.display()
                );
            }
            continue;
        }
        if !is_shard_name(name) {
            if COMPRESSED_TARS.iter().any(|e| name.ends_with(e)) {
                tracing::warn!(
                    "{}: a compressed tar cannot be read in place (a member is reached only by \
                     decompressing all before it); decompress it (`gunzip -k`, `zstd -d`, `xz -dk`) \
                     and index again — left out",
                    entry.path().display()
                );
            }
            continue;
        }
        if rel.contains('#') {
            tracing::warn!(
                "{}: a shard path holding '#' cannot be indexed; rename it",
                entry.path().display()
            );
            continue;
        }
        match std::fs::metadata(entry.path()) {
            Ok(meta) if meta.is_file() => out.push(Shard { rel, bytes: meta.len() }),
            Ok(_) => {} // a folder named *.tar (through a link)
            // A link to nothing, or a file that cannot be read: listed, so that indexing names
            // it ([`entries`]) instead of the folder seeming to hold no shards.
            Err(_) => out.push(Shard { rel, bytes: 0 }),
        }
    }
    Ok(())
}

/// The shards a brace pattern names in `folder` ([`pattern::expand`]), in the pattern's order;
/// an error naming the first one that is not there (or the pattern's fault).
pub fn list_pattern(folder: &Path, pattern: &str) -> Result<Vec<Shard>, String> {
    let names = pattern::expand(pattern)?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        // Names stay beneath the folder: no empty, `.` or `..` component.
        let beneath = name.split('/').all(|c| !matches!(c, "" | "." | ".."));
        if name.contains('#') || !is_shard_name(&name) || !beneath {
            return Err(format!(
                "{pattern}: {name} is not a shard name (it must end in .tar or .zip, hold no '#' and stay inside \
                 the folder: no '.', '..' or empty components)"
            ));
        }
        let path = folder.join(&name);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => out.push(Shard { rel: name, bytes: m.len() }),
            Ok(_) => return Err(format!("{}: not a file", path.display())),
            Err(e) => return Err(format!("{} (from {pattern}): {e}", path.display())),
        }
    }
    Ok(out)
}

/// The folder holding a dataset given as `data`: `data` itself, or the folder of a brace
/// pattern of shards ([`pattern::split`]).
pub fn folder_of(data: &Path) -> PathBuf {
    pattern::split(data).map_or_else(|| data.to_path_buf(), |(folder, _)| folder)
}

/// What the index records of a shard listing to notice a change: the listing's text (names and
/// sizes) and its SHA-256. Modification times are not in it; the index's descriptors carry each
/// shard's, and a touched shard is re-probed ([`crate::index::writer::changed_since_indexing`]).
pub fn fingerprint(shards: &[Shard]) -> (u64, [u8; 32]) {
    let text: String = shards.iter().map(|s| format!("{}\t{}\n", s.rel, s.bytes)).collect();
    (text.len() as u64, sha2::Sha256::digest(text.as_bytes()).into())
}

/// The id of the sample `key` of `shard` when its json gives none: the first 8 bytes of a
/// SHA-256 of both, the same on every machine and in every order the shards are listed.
pub fn id_of(shard: &str, key: &str) -> u64 {
    let digest = sha2::Sha256::digest(format!("datahelix-webdataset\0{shard}\0{key}").as_bytes());
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The samples of every shard, in shard order then tar order, with `line` the 1-based sample
/// number over all shards; what cannot be a sample is in `errors`, named by shard and key.
pub fn entries(dir: &Path, shards: &[Shard]) -> Manifest {
    let root = std::fs::canonicalize(dir);
    let per_shard: Vec<Manifest> = shards
        .par_iter()
        .map(|s| match &root {
            Ok(root) => shard_entries(root, s),
            Err(e) => one_error(&s.rel, format!("cannot resolve the dataset folder: {e}")),
        })
        .collect();
    let mut out = Manifest::default();
    for mut m in per_shard {
        for e in &mut m.entries {
            e.line = u32::try_from(out.entries.len() + 1).unwrap_or(u32::MAX);
            out.entries.push(std::mem::take(e));
        }
        out.errors.append(&mut m.errors);
    }
    out
}

fn one_error(shard: &str, reason: String) -> Manifest {
    Manifest { entries: Vec::new(), errors: vec![error(shard, None, reason)] }
}

fn error(shard: &str, key: Option<&str>, reason: String) -> LineError {
    let at = key.map_or_else(|| shard.to_owned(), |k| format!("{shard}, sample {k}"));
    LineError { format: Format::WebDataset, line: 0, reason: format!("{at}: {reason}") }
}

fn shard_entries(root: &Path, shard: &Shard) -> Manifest {
    let path = match crate::probe::resolve_beneath(root, &shard.rel) {
        Ok(p) => p,
        Err(status) => return one_error(&shard.rel, format!("cannot be used: {status}")),
    };
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) => return one_error(&shard.rel, format!("cannot be read: {e}")),
    };
    let (items, mut damage) = match items_of(&file, &shard.rel) {
        Ok(listed) => listed,
        Err(reason) => return one_error(&shard.rel, reason),
    };
    let mut out = Manifest::default();
    for group in group_by_key(&items) {
        match sample_of(&file, &shard.rel, &group) {
            Ok(e) => out.entries.push(e),
            Err(reason) => out.errors.push(error(&shard.rel, Some(group.key), reason)),
        }
    }
    // What the listing itself found damaged, named after the samples' own errors.
    out.errors.append(&mut damage);
    out
}

/// A regular file of a shard, tar or zip.
struct Item {
    name: String,
    part: Part,
}

/// The regular files of the shard `file` (named `rel`), tar or zip by its name, and the damage
/// its listing met (the members before it, or beside it in a zip, are listed); `Err` when the
/// shard cannot be read at all.
fn items_of(file: &File, rel: &str) -> Result<(Vec<Item>, Vec<LineError>), String> {
    if rel.ends_with(".zip") {
        let l = zip::members(file).map_err(|e| format!("cannot be read as a zip archive: {e}"))?;
        let damage = l
            .damaged
            .into_iter()
            .map(|d| error(rel, None, format!("{d}; the rest of the archive is indexed")))
            .collect();
        return Ok((l.members.into_iter().map(|m| Item { name: m.name, part: m.part }).collect(), damage));
    }
    let l = tar::members(file).map_err(|e| format!("cannot be read: {e}"))?;
    let damage = l.damage.into_iter().map(|d| {
        let reason = format!(
            "{d}; the samples before it are indexed, the rest of the shard is not (rewrite the shard)"
        );
        error(rel, None, reason)
    });
    let items = l.members.into_iter().map(|m| Item { name: m.name, part: Part::stored(m.offset, m.size) });
    Ok((items.collect(), damage.collect()))
}

/// Consecutive members sharing a key.
struct Group<'a> {
    key: &'a str,
    members: Vec<(&'a str, &'a Item)>,
}

/// WebDataset's `base_plus_ext`: `dir/stem` up to the first dot of the last component, and the
/// rest; `None` for a name without a dot there.
fn key_and_ext(name: &str) -> Option<(&str, &str)> {
    let base_start = name.rfind('/').map_or(0, |i| i + 1);
    let dot = base_start + name[base_start..].find('.')?;
    (dot > base_start).then(|| (&name[..dot], &name[dot + 1..]))
}

fn group_by_key(members: &[Item]) -> Vec<Group<'_>> {
    let mut groups: Vec<Group<'_>> = Vec::new();
    for m in members {
        let Some((key, ext)) = key_and_ext(&m.name) else { continue };
        match groups.last_mut() {
            Some(g) if g.key == key => g.members.push((ext, m)),
            _ => groups.push(Group { key, members: vec![(ext, m)] }),
        }
    }
    groups
}

fn sample_of(file: &File, shard: &str, g: &Group<'_>) -> Result<Entry, String> {
    let lower: Vec<String> = g.members.iter().map(|(ext, _)| ext.to_ascii_lowercase()).collect();
    for (i, ext) in lower.iter().enumerate() {
        if lower[..i].contains(ext) {
            return Err(format!(
                "two members with the extension .{ext} (each sample's files need distinct names)"
            ));
        }
    }
    let media = lower
        .iter()
        .position(|ext| MEDIA.iter().any(|m| ext == m || ext.ends_with(&format!(".{m}"))))
        .ok_or_else(|| {
            format!(
                "no media member among .{} (a sample needs one of .{})",
                lower.join(", ."),
                MEDIA.join(", .")
            )
        })?;
    let read = |ext: &str| -> Result<Option<String>, String> {
        let Some(k) = lower.iter().position(|e| e == ext) else { return Ok(None) };
        let m = g.members[k].1;
        let size = m.part.bytes();
        if size > MAX_META_BYTES || m.part.range.len > MAX_META_BYTES {
            return Err(format!(
                "{} is {size} bytes, more than the {MAX_META_BYTES} read as metadata",
                m.name
            ));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        file.try_clone()
            .and_then(|f| Window::open(f, m.part))
            .and_then(|mut w| w.read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read {}: {e}", m.name))?;
        String::from_utf8(bytes).map(Some).map_err(|_| format!("{} is not UTF-8 text", m.name))
    };
    let mut object = match read("json")? {
        Some(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(o)) => o,
            Ok(_) => return Err(format!("{}.json is JSON but not an object", g.key)),
            Err(e) => return Err(format!("{}.json is not JSON: {e}", g.key)),
        },
        None => serde_json::Map::new(),
    };
    let id = match object.remove("id") {
        None => id_of(shard, g.key),
        Some(v) => {
            v.as_u64().ok_or_else(|| format!("{}.json's id {v} is not an unsigned 64-bit integer", g.key))?
        }
    };
    let stated_tokens =
        match object.remove("text_tokens") {
            None => None,
            Some(v) => Some(v.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| {
                format!("{}.json's text_tokens {v} is not an unsigned 32-bit integer", g.key)
            })?),
        };
    let caption = read("txt")?.map(|t| t.trim().to_owned());
    if let Some(c) = &caption {
        object.entry("caption").or_insert_with(|| c.clone().into());
    }
    if let Some(cls) = read("cls")? {
        let cls = cls.trim();
        let label = cls.parse::<i64>().map_or_else(|_| serde_json::Value::from(cls), serde_json::Value::from);
        object.entry("label").or_insert(label);
    }
    object.insert("__key__".into(), g.key.into());
    object.insert("__shard__".into(), shard.into());
    let words = caption.as_deref().map_or(0, |c| c.split_whitespace().count());
    let m = g.members[media].1;
    Ok(Entry {
        id,
        path: MemberPath::format(shard, &m.name, m.part),
        text_tokens: stated_tokens.unwrap_or(u32::try_from(words).unwrap_or(u32::MAX)),
        line: 0,
        extra: crate::manifest::extra_object(object),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_as_webdataset_splits_them() {
        assert_eq!(key_and_ext("a/b/0017.mp4"), Some(("a/b/0017", "mp4")));
        assert_eq!(key_and_ext("0017.seg.MP4"), Some(("0017", "seg.MP4")));
        assert_eq!(key_and_ext("d.x/0017"), None);
        assert_eq!(key_and_ext(".hidden"), None);
    }

    /// A dangling link among the shards is named at indexing; the other shards are read.
    #[test]
    fn a_shard_that_cannot_be_read_is_named_and_the_others_are_indexed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.mp4"), b"not really a video").unwrap();
        let tar = std::process::Command::new("tar").current_dir(d).args(["-cf", "s0.tar", "a.mp4"]).status();
        assert!(tar.unwrap().success());
        std::os::unix::fs::symlink(d.join("gone.tar"), d.join("s1.tar")).unwrap();
        let shards = list(d).unwrap();
        assert_eq!(shards.iter().map(|s| s.rel.as_str()).collect::<Vec<_>>(), ["s0.tar", "s1.tar"]);
        let m = entries(d, &shards);
        assert_eq!(m.entries.len(), 1, "{:?}", m.errors);
        assert!(m.errors.len() == 1 && m.errors[0].to_string().contains("s1.tar"), "{:?}", m.errors);
    }

    /// Shards in subfolders are listed by their path, hidden ones and linked folders are not,
    /// and a `#` in a folder's name leaves its shards out as in a file's.
    #[test]
    fn shards_in_subfolders_are_listed_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for rel in
            ["top.tar", "train/a/0.tar", "train/1.tar", "val/0.tar", ".cache/x.tar", "x#y/0.tar", "notes.txt"]
        {
            let path = d.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"0123").unwrap();
        }
        std::os::unix::fs::symlink(d, d.join("train/loop")).unwrap();
        std::os::unix::fs::symlink(d.join("val/0.tar"), d.join("train/linked.tar")).unwrap();
        let mut deep = d.join("deep");
        for _ in 0..MAX_DEPTH {
            deep = deep.join("d");
        }
        std::fs::create_dir_all(&deep).unwrap();
        std::fs::write(deep.join("too-deep.tar"), b"0123").unwrap();
        std::fs::write(deep.parent().unwrap().join("deep-enough.tar"), b"0123").unwrap();
        let shards = list(d).unwrap();
        let deep_enough = format!("deep/{}deep-enough.tar", "d/".repeat(MAX_DEPTH - 1));
        assert_eq!(
            shards.iter().map(|s| s.rel.as_str()).collect::<Vec<_>>(),
            [
                deep_enough.as_str(),
                "top.tar",
                "train/1.tar",
                "train/a/0.tar",
                "train/linked.tar",
                "val/0.tar"
            ]
        );
        assert!(shards.iter().all(|s| s.bytes == 4), "{shards:?}");
    }

    #[test]
    fn ids_are_stable_and_distinct() {
        assert_eq!(id_of("s0.tar", "k"), id_of("s0.tar", "k"));
        assert_ne!(id_of("s0.tar", "k"), id_of("s1.tar", "k"));
    }
}
