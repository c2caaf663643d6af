//! Reading the member list of a zip archive (PKZIP, with ZIP64), without reading the members:
//! the central directory at its end, each entry checked against the local header it points to.
//!
//! ```
//! use datahelix::shard::location::Coding;
//! use datahelix::shard::zip::members;
//!
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("a.txt"), "hello hello hello hello").unwrap();
//! let status = std::process::Command::new("zip")
//!     .current_dir(dir.path())
//!     .args(["-q", "-X", "a.zip", "a.txt"])
//!     .status()
//!     .unwrap();
//! assert!(status.success());
//! let listing = members(&std::fs::File::open(dir.path().join("a.zip")).unwrap()).unwrap();
//! assert_eq!(listing.members[0].name, "a.txt");
//! assert!(matches!(listing.members[0].part.coding, Coding::Deflated { size: 23, .. }));
//! assert!(listing.damaged.is_empty());
//! ```
//!
//! Nothing is believed before it is checked: the end record's counts and offsets against the
//! file, each entry's fixed fields and lengths against the directory's bounds, and each member's
//! local header (its signature, and its data inside the part of the file before the central
//! directory). An archive whose directory cannot be found or read is an error; an entry that
//! cannot be used (encrypted, compressed with a method other than store or deflate, larger
//! inflated than [`MAX_INFLATED`], a name that is not UTF-8, data outside the file, bytes shared
//! with another member as in an overlapping zip bomb) is listed in
//! [`Listing::damaged`] with why and what to do, and the other members stay usable. Folders and
//! links are not members (as in a tar, regular files only). Archives split over several files
//! (`.z01`, …) are refused with the command that joins them.

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::location::{ByteRange, Coding, Part};

/// The largest member inflated into memory to be read (a deflated video is decoded from memory:
/// FFmpeg seeks in it). Media stored uncompressed (`zip -0`, or `zip -n .mp4:.mkv:.webm`) have
/// no limit: they are read in place, like a tar member.
pub const MAX_INFLATED: u64 = 1 << 30;

/// The most central-directory entries read (a count beyond it is damage, not an archive).
const MAX_ENTRIES: u64 = 1 << 24;

const EOCD: u32 = 0x0605_4b50;
const EOCD_LEN: u64 = 22;
const ZIP64_LOCATOR: u32 = 0x0706_4b50;
const ZIP64_LOCATOR_LEN: u64 = 20;
const ZIP64_EOCD: u32 = 0x0606_4b50;
const ZIP64_EOCD_LEN: u64 = 56;
const CENTRAL: u32 = 0x0201_4b50;
const CENTRAL_LEN: usize = 46;
const LOCAL: u32 = 0x0403_4b50;
const LOCAL_LEN: usize = 30;

/// One regular file inside a zip.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its name in the archive (`/`-separated).
    pub name: String,
    /// Its data in the archive and how it is coded.
    pub part: Part,
}

/// The usable members of a zip, in central-directory order, and the entries that are not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Regular files that can be read.
    pub members: Vec<Member>,
    /// Entries that cannot be read, by name (or by entry number when the name is unreadable),
    /// each with why and what to do.
    pub damaged: Vec<String>,
}

/// Why a zip's member list cannot be read at all.
#[derive(Debug, thiserror::Error)]
pub enum ZipError {
    /// The file could not be read.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The end record or the central directory is missing or does not make sense.
    #[error("{0}")]
    Damaged(String),
}

fn damaged<T>(reason: impl Into<String>) -> Result<T, ZipError> {
    Err(ZipError::Damaged(reason.into()))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Where the central directory lies, as the end record (or its ZIP64 form) states it.
#[derive(Debug)]
struct Directory {
    entries: u64,
    offset: u64,
    size: u64,
}

/// Lists the members of the zip `file`. `Err` when its central directory cannot be read.
pub fn members(file: &File) -> Result<Listing, ZipError> {
    let len = file.metadata()?.len();
    let dir = directory(file, len)?;
    if dir.size > len
        || dir.entries > MAX_ENTRIES
        || dir.entries.saturating_mul(CENTRAL_LEN as u64) > dir.size
    {
        return damaged(format!(
            "its end record states {} entries in {} bytes of central directory, which a {len}-byte file cannot hold: damaged",
            dir.entries, dir.size
        ));
    }
    let mut bytes = vec![0u8; dir.size as usize];
    file.read_exact_at(&mut bytes, dir.offset)?;
    let mut out = Listing::default();
    let mut at = 0usize;
    for n in 0..dir.entries {
        let Some(head) = bytes.get(at..at + CENTRAL_LEN) else {
            return damaged(format!("central directory entry {n} runs past the directory's end: damaged"));
        };
        if u32_at(head, 0) != CENTRAL {
            return damaged(format!("central directory entry {n} has no entry signature: damaged"));
        }
        let (name_len, extra_len, comment_len) =
            (u16_at(head, 28) as usize, u16_at(head, 30) as usize, u16_at(head, 32) as usize);
        let next = at + CENTRAL_LEN + name_len + extra_len + comment_len;
        let Some(entry) = bytes.get(at..next) else {
            return damaged(format!("central directory entry {n} runs past the directory's end: damaged"));
        };
        at = next;
        match member_of(file, entry, name_len, extra_len, dir.offset) {
            Ok(Some(m)) => out.members.push(m),
            Ok(None) => {}
            Err(reason) => {
                let raw = &entry[CENTRAL_LEN..CENTRAL_LEN + name_len];
                let name = std::str::from_utf8(raw).map_or_else(|_| format!("entry {n}"), str::to_owned);
                out.damaged.push(format!("{name}: {reason}"));
            }
        }
    }
    refuse_overlaps(&mut out);
    Ok(out)
}

/// Moves the members whose bytes overlap another member's to [`Listing::damaged`]: members of a
/// zip never share bytes, and a zip bomb of overlapping members makes one deflated stream count
/// as thousands of members, each inflated again when probed.
fn refuse_overlaps(listing: &mut Listing) {
    let mut order: Vec<usize> = (0..listing.members.len()).collect();
    order.sort_by_key(|&i| (listing.members[i].part.range.offset, i));
    let mut overlapping = vec![false; listing.members.len()];
    // The furthest end of the members seen so far, and whose it is.
    let mut reach: Option<(u64, usize)> = None;
    for &i in &order {
        let range = listing.members[i].part.range;
        let end = range.offset.saturating_add(range.len);
        if let Some((furthest, j)) = reach {
            if range.len > 0 && range.offset < furthest {
                overlapping[i] = true;
                overlapping[j] = true;
            }
        }
        if reach.is_none_or(|(furthest, _)| end > furthest) {
            reach = Some((end, i));
        }
    }
    if !overlapping.contains(&true) {
        return;
    }
    let members = std::mem::take(&mut listing.members);
    for (m, bad) in members.into_iter().zip(overlapping) {
        if bad {
            listing.damaged.push(format!(
                "{}: its bytes ({}..+{}) overlap another member's: a zip bomb, or damaged (left out; re-zip the files)",
                m.name, m.part.range.offset, m.part.range.len
            ));
        } else {
            listing.members.push(m);
        }
    }
}

/// The central directory's place, checked to lie before the end records.
fn directory(file: &File, len: u64) -> Result<Directory, ZipError> {
    if len < EOCD_LEN {
        return damaged(format!("{len} bytes: too short to be a zip archive"));
    }
    // The end record is the last 22 bytes, followed by a comment of up to 64 KiB.
    let tail_len = len.min(EOCD_LEN + u16::MAX as u64);
    let mut tail = vec![0u8; tail_len as usize];
    file.read_exact_at(&mut tail, len - tail_len)?;
    let found = (0..=tail.len() - EOCD_LEN as usize).rev().find(|&i| {
        u32_at(&tail, i) == EOCD && i + EOCD_LEN as usize + u16_at(&tail, i + 20) as usize == tail.len()
    });
    let Some(i) = found else {
        return damaged("no end-of-central-directory record: not a zip archive, or truncated");
    };
    let eocd_at = len - tail_len + i as u64;
    let e = &tail[i..i + EOCD_LEN as usize];
    let (disk, dir_disk) = (u16_at(e, 4), u16_at(e, 6));
    let (on_disk, entries) = (u16_at(e, 8), u16_at(e, 10));
    let (size, offset) = (u32_at(e, 12), u32_at(e, 16));
    let zip64 = entries == u16::MAX || size == u32::MAX || offset == u32::MAX;
    let dir = if zip64 {
        zip64_directory(file, eocd_at)?
    } else {
        if disk != 0 || dir_disk != 0 || on_disk != entries {
            return split_archive();
        }
        Directory { entries: entries as u64, offset: offset as u64, size: size as u64 }
    };
    let dir_end = if zip64 { eocd_at.saturating_sub(ZIP64_LOCATOR_LEN) } else { eocd_at };
    if dir.offset.checked_add(dir.size).is_none_or(|e| e > dir_end) {
        return damaged(format!(
            "its central directory ({} bytes at byte {}) does not lie before its end record at byte {eocd_at}: damaged, or data was prepended",
            dir.size, dir.offset
        ));
    }
    Ok(dir)
}

fn split_archive<T>() -> Result<T, ZipError> {
    damaged(
        "a zip archive split over several files (.z01, .z02, …): join the parts into one with \
         `zip -s 0 PART.zip --out WHOLE.zip` and index that",
    )
}

/// The ZIP64 end record, through its locator just before the end record at `eocd_at`.
fn zip64_directory(file: &File, eocd_at: u64) -> Result<Directory, ZipError> {
    let Some(loc_at) = eocd_at.checked_sub(ZIP64_LOCATOR_LEN) else {
        return damaged("its end record asks for a ZIP64 record the file has no room for: damaged");
    };
    let mut loc = [0u8; ZIP64_LOCATOR_LEN as usize];
    file.read_exact_at(&mut loc, loc_at)?;
    if u32_at(&loc, 0) != ZIP64_LOCATOR {
        return damaged("its end record asks for a ZIP64 record, and none precedes it: damaged");
    }
    if u32_at(&loc, 4) != 0 || u32_at(&loc, 16) > 1 {
        return split_archive();
    }
    let at = u64_at(&loc, 8);
    if at.checked_add(ZIP64_EOCD_LEN).is_none_or(|e| e > loc_at) {
        return damaged(format!("its ZIP64 end record at byte {at} is not before its locator: damaged"));
    }
    let mut e = [0u8; ZIP64_EOCD_LEN as usize];
    file.read_exact_at(&mut e, at)?;
    if u32_at(&e, 0) != ZIP64_EOCD {
        return damaged(format!("no ZIP64 end record at byte {at}, where its locator points: damaged"));
    }
    if u32_at(&e, 16) != 0 || u32_at(&e, 20) != 0 || u64_at(&e, 24) != u64_at(&e, 32) {
        return split_archive();
    }
    Ok(Directory { entries: u64_at(&e, 32), size: u64_at(&e, 40), offset: u64_at(&e, 48) })
}

/// The member a central-directory entry describes, `None` for a folder or a link, or why it
/// cannot be read. `data_end` is where members must end (the central directory's start).
fn member_of(
    file: &File,
    entry: &[u8],
    name_len: usize,
    extra_len: usize,
    data_end: u64,
) -> Result<Option<Member>, String> {
    let name = &entry[CENTRAL_LEN..CENTRAL_LEN + name_len];
    let extra = &entry[CENTRAL_LEN + name_len..CENTRAL_LEN + name_len + extra_len];
    let name = std::str::from_utf8(name)
        .map_err(|_| "its name is not UTF-8 (re-zip with UTF-8 names, `zip` 3.0 writes them)".to_owned())?;
    let made_by_unix = entry[5] == 3;
    let mode = u32_at(entry, 38) >> 16;
    let is_link = made_by_unix && mode & 0o170000 == 0o120000;
    if name.ends_with('/') || is_link {
        return Ok(None);
    }
    let flags = u16_at(entry, 8);
    if flags & 0x41 != 0 {
        return Err(
            "encrypted: DataHelix reads unencrypted archives only (unzip it, or re-zip without -e)".into()
        );
    }
    let method = u16_at(entry, 10);
    let crc32 = u32_at(entry, 16);
    let mut compressed = u32_at(entry, 20) as u64;
    let mut size = u32_at(entry, 24) as u64;
    let mut local = u32_at(entry, 42) as u64;
    let disk = u16_at(entry, 34);
    zip64_fields(extra, &mut size, &mut compressed, &mut local, disk)?;
    let coding = match method {
        0 if compressed == size => Coding::Stored,
        0 => return Err(format!("stored, but its sizes differ ({compressed} and {size} bytes): damaged")),
        8 if size > MAX_INFLATED => {
            return Err(format!(
            "deflated, {size} bytes inflated: more than the {MAX_INFLATED} DataHelix inflates into memory \
                 (store media uncompressed: `zip -0`, or `zip -n .mp4:.mkv:.webm`)"
        ))
        }
        8 => Coding::Deflated { size, crc32 },
        m => {
            return Err(format!(
                "compressed with method {m} ({}); DataHelix reads stored and deflated members \
                 (re-zip with `zip`, or `zip -0` for media)",
                method_name(m)
            ))
        }
    };
    let mut head = [0u8; LOCAL_LEN];
    if local.checked_add(LOCAL_LEN as u64).is_none_or(|e| e > data_end) {
        return Err(format!("its local header at byte {local} is not before the central directory: damaged"));
    }
    file.read_exact_at(&mut head, local).map_err(|e| format!("its local header cannot be read: {e}"))?;
    if u32_at(&head, 0) != LOCAL {
        return Err(format!("no local header at byte {local}, where the central directory points: damaged"));
    }
    let offset = local + LOCAL_LEN as u64 + u16_at(&head, 26) as u64 + u16_at(&head, 28) as u64;
    let range = ByteRange { offset, len: compressed };
    if range.end().is_none_or(|e| e > data_end) {
        return Err(format!(
            "its {compressed} bytes at byte {offset} run into the central directory at byte {data_end}: damaged, or truncated"
        ));
    }
    Ok(Some(Member { name: name.to_owned(), part: Part { range, coding } }))
}

/// Reads the ZIP64 extended-information field (id 1) of an entry's extra data: the 64-bit
/// values of the fields whose 32-bit forms are all ones, in the order the format fixes.
fn zip64_fields(
    extra: &[u8],
    size: &mut u64,
    compressed: &mut u64,
    local: &mut u64,
    disk: u16,
) -> Result<(), String> {
    let needed = [*size == u32::MAX as u64, *compressed == u32::MAX as u64, *local == u32::MAX as u64];
    let mut at = 0;
    let mut field: Option<&[u8]> = None;
    while at + 4 <= extra.len() {
        let (id, len) = (u16_at(extra, at), u16_at(extra, at + 2) as usize);
        let Some(data) = extra.get(at + 4..at + 4 + len) else { break };
        if id == 1 {
            field = Some(data);
            break;
        }
        at += 4 + len;
    }
    if needed.iter().any(|&n| n) || disk == u16::MAX {
        let data = field.ok_or("its sizes need a ZIP64 field and it has none: damaged")?;
        let mut read = 0usize;
        for (need, value) in needed.into_iter().zip([size, compressed, local]) {
            if need {
                let bytes = data.get(read..read + 8).ok_or("its ZIP64 field is too short: damaged")?;
                *value = u64_at(bytes, 0);
                read += 8;
            }
        }
    }
    if disk != 0 && disk != u16::MAX {
        return Err("on another disk of a split archive (join the parts with `zip -s 0`)".into());
    }
    Ok(())
}

fn method_name(m: u16) -> &'static str {
    match m {
        1..=6 => "an old PKZIP method",
        9 => "deflate64",
        12 => "bzip2",
        14 => "LZMA",
        93 => "Zstandard",
        95 => "XZ",
        98 => "PPMd",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn zip(dir: &std::path::Path, args: &[&str]) {
        let status = Command::new("zip").current_dir(dir).arg("-q").args(args).status().unwrap();
        assert!(status.success(), "zip {args:?}");
    }

    fn listing(path: &std::path::Path) -> Result<Listing, ZipError> {
        members(&File::open(path).unwrap())
    }

    /// Stored and deflated members, a folder and a link, in ZIP and forced ZIP64 form: the
    /// same members, their bytes where the listing says.
    #[test]
    fn members_of_stored_deflated_and_zip64_archives() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/a.bin"), (0..5000u32).map(|i| (i * 7 % 251) as u8).collect::<Vec<_>>())
            .unwrap();
        std::fs::write(d.join("b.txt"), "words ".repeat(1000)).unwrap();
        std::os::unix::fs::symlink("b.txt", d.join("link.txt")).unwrap();
        zip(d, &["-0", "-r", "-y", "stored.zip", "sub", "b.txt", "link.txt"]);
        zip(d, &["-r", "-y", "deflated.zip", "sub", "b.txt", "link.txt"]);
        zip(d, &["-fz", "-r", "-y", "zip64.zip", "sub", "b.txt", "link.txt"]);
        for (archive, deflated) in [("stored.zip", false), ("deflated.zip", true), ("zip64.zip", true)] {
            let l = listing(&d.join(archive)).unwrap();
            assert!(l.damaged.is_empty(), "{archive}: {:?}", l.damaged);
            let names: Vec<_> = l.members.iter().map(|m| m.name.as_str()).collect();
            assert_eq!(names, ["sub/a.bin", "b.txt"], "{archive}");
            let file = File::open(d.join(archive)).unwrap();
            for m in &l.members {
                let want = std::fs::read(d.join(&m.name)).unwrap();
                let mut w = crate::shard::location::Window::open(file.try_clone().unwrap(), m.part).unwrap();
                let mut got = Vec::new();
                std::io::Read::read_to_end(&mut w, &mut got).unwrap();
                assert_eq!(got, want, "{archive} {}", m.name);
                assert_eq!(
                    matches!(m.part.coding, Coding::Deflated { .. }),
                    deflated,
                    "{archive} {}",
                    m.name
                );
            }
        }
    }

    /// Encrypted and bzip2 members are named with what to do; the others stay usable.
    #[test]
    fn members_that_cannot_be_read_are_named_and_the_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.txt"), "a ".repeat(500)).unwrap();
        std::fs::write(d.join("b.txt"), "b ".repeat(500)).unwrap();
        zip(d, &["-P", "secret", "enc.zip", "a.txt"]);
        zip(d, &["enc.zip", "b.txt"]);
        let l = listing(&d.join("enc.zip")).unwrap();
        assert_eq!(l.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["b.txt"]);
        assert!(l.damaged.len() == 1 && l.damaged[0].starts_with("a.txt: encrypted"), "{:?}", l.damaged);
        zip(d, &["-Z", "bzip2", "bz.zip", "a.txt"]);
        let l = listing(&d.join("bz.zip")).unwrap();
        assert!(l.members.is_empty() && l.damaged[0].contains("bzip2"), "{:?}", l.damaged);
    }

    /// Damage anywhere in the directory or end record is an error or a named entry, never a
    /// panic or a read past the file: every byte of the archive's tail flipped in turn, and every
    /// truncation.
    #[test]
    fn damaged_archives_are_refused_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.txt"), "a ".repeat(300)).unwrap();
        std::fs::write(d.join("b.txt"), "b ".repeat(300)).unwrap();
        zip(d, &["-X", "ok.zip", "a.txt", "b.txt"]);
        let good = std::fs::read(d.join("ok.zip")).unwrap();
        let bad = d.join("bad.zip");
        let mut refused = 0;
        for cut in 0..good.len() {
            std::fs::write(&bad, &good[..cut]).unwrap();
            refused += usize::from(listing(&bad).is_err());
        }
        assert_eq!(refused, good.len(), "every truncation loses the end record");
        let tail = good.len() - 200;
        for i in tail..good.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] ^= flip;
                std::fs::write(&bad, &b).unwrap();
                if let Ok(l) = listing(&bad) {
                    for m in &l.members {
                        assert!(m.part.range.end().unwrap() <= good.len() as u64, "byte {i}");
                    }
                }
            }
        }
        std::fs::write(&bad, b"PK\x05\x06 not an archive at all, just text").unwrap();
        assert!(listing(&bad).is_err());
    }

    /// Two directory entries naming the same bytes (the trick of overlapping-member zip bombs)
    /// are both refused; the archive's other members stay.
    #[test]
    fn members_sharing_bytes_are_refused_as_a_bomb() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.txt"), "a".repeat(100)).unwrap();
        std::fs::write(d.join("c.txt"), "c".repeat(100)).unwrap();
        zip(d, &["-0", "-X", "one.zip", "a.txt", "c.txt"]);
        let good = std::fs::read(d.join("one.zip")).unwrap();
        let eocd = good.len() - EOCD_LEN as usize;
        let (cd_size, cd_offset) = (u32_at(&good, eocd + 12) as usize, u32_at(&good, eocd + 16) as usize);
        let central = &good[cd_offset..cd_offset + cd_size];
        let first_len = CENTRAL_LEN
            + u16_at(central, 28) as usize
            + u16_at(central, 30) as usize
            + u16_at(central, 32) as usize;
        let mut twin = central[..first_len].to_vec();
        twin[CENTRAL_LEN] = b'b'; // "b.txt": another name, the same local header and bytes
        let mut bomb = good[..cd_offset + cd_size].to_vec();
        bomb.extend_from_slice(&twin);
        let mut end = good[eocd..].to_vec();
        end[8..10].copy_from_slice(&3u16.to_le_bytes());
        end[10..12].copy_from_slice(&3u16.to_le_bytes());
        end[12..16].copy_from_slice(&((cd_size + first_len) as u32).to_le_bytes());
        bomb.extend_from_slice(&end);
        std::fs::write(d.join("bomb.zip"), &bomb).unwrap();
        let l = listing(&d.join("bomb.zip")).unwrap();
        assert_eq!(l.members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["c.txt"]);
        assert_eq!(l.damaged.len(), 2, "{:?}", l.damaged);
        assert!(l.damaged.iter().all(|e| e.contains("overlap another member's")), "{:?}", l.damaged);
        assert_eq!(listing(&d.join("one.zip")).unwrap().members.len(), 2);
    }

    /// A split archive is refused with the command that joins it.
    #[test]
    fn a_split_archive_is_refused_with_the_join_command() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let noise: Vec<u8> = (0..200_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        std::fs::write(d.join("n.bin"), noise).unwrap();
        zip(d, &["-0", "-s", "64k", "split.zip", "n.bin"]);
        let e = listing(&d.join("split.zip")).unwrap_err().to_string();
        assert!(e.contains("zip -s 0"), "{e}");
    }
}
