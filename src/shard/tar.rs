//! Reading the member list of a tar file (POSIX ustar, GNU and pax), without reading the members.
//!
//! ```
//! use datahelix::shard::tar::members;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("a.tar");
//! let status = std::process::Command::new("tar")
//!     .current_dir(dir.path())
//!     .args(["--format=ustar", "-cf", "a.tar", "--files-from=/dev/null"])
//!     .status()
//!     .unwrap();
//! assert!(status.success());
//! let listing = members(&std::fs::File::open(&path).unwrap()).unwrap();
//! assert!(listing.members.is_empty() && listing.damage.is_none());
//! ```
//!
//! Every header is checked before it is believed: its checksum, its size field, and that the
//! member it describes lies inside the file. The first header that fails ends the listing with
//! [`Damage`] saying where and why; the members before it stay usable. Links, folders and
//! devices are not members (WebDataset reads regular files only); GNU long names (`L`) and pax
//! `path` / `size` records (`x`) are honoured.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes of a tar block (headers and member data are padded to it).
pub const BLOCK: u64 = 512;

/// The longest long-name or pax record block read (a name is never this long in practice).
const MAX_EXTENDED: u64 = 1 << 20;

/// One regular file inside a tar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its name in the tar (`/`-separated, as written).
    pub name: String,
    /// Byte offset of its first data byte in the tar.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// Where a tar stops making sense.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// Byte offset of the header that could not be read.
    pub offset: u64,
    /// Why.
    pub reason: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tar header at byte {}: {}", self.offset, self.reason)
    }
}

/// The members of a tar, in order, and the damage that ended the listing early, if any.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Regular files, in the order they appear.
    pub members: Vec<Member>,
    /// Why the listing stopped before the tar's end marker, when it did.
    pub damage: Option<Damage>,
}

/// Lists the regular files of the tar `file`. `Err` only when the file cannot be read at all.
pub fn members(file: &File) -> std::io::Result<Listing> {
    let len = file.metadata()?.len();
    let mut out = Listing::default();
    let mut at = 0u64;
    let mut long_name: Option<String> = None;
    let mut pax: Pax = Pax::default();
    let mut header = [0u8; BLOCK as usize];
    while at + BLOCK <= len {
        file.read_exact_at(&mut header, at)?;
        if header.iter().all(|&b| b == 0) {
            return Ok(out); // the end marker (a second zero block follows; not required)
        }
        let damaged = |reason: String| Damage { offset: at, reason };
        if let Err(reason) = checksum_ok(&header) {
            out.damage = Some(damaged(reason));
            return Ok(out);
        }
        let stated = match octal_or_binary(&header[124..136]) {
            Some(s) => s,
            None => {
                out.damage = Some(damaged("its size field is not a number".into()));
                return Ok(out);
            }
        };
        let size = pax.size.take().unwrap_or(stated);
        let data = at + BLOCK;
        let Some(end) = data.checked_add(size).filter(|&e| e <= len) else {
            out.damage = Some(damaged(format!(
                "its member of {size} bytes runs past the end of the file ({len} bytes): the tar is truncated"
            )));
            return Ok(out);
        };
        let typeflag = header[156];
        match typeflag {
            b'L' | b'x' => {
                if size > MAX_EXTENDED {
                    out.damage = Some(damaged(format!("an extended header of {size} bytes")));
                    return Ok(out);
                }
                let mut bytes = vec![0u8; size as usize];
                file.read_exact_at(&mut bytes, data)?;
                if typeflag == b'L' {
                    let name = bytes.split(|&b| b == 0).next().unwrap_or_default();
                    long_name = Some(String::from_utf8_lossy(name).into_owned());
                } else {
                    match Pax::parse(&bytes) {
                        Ok(p) => pax = p,
                        Err(reason) => {
                            out.damage = Some(damaged(format!("pax header: {reason}")));
                            return Ok(out);
                        }
                    }
                }
            }
            b'0' | 0 | b'7' => {
                let name = match pax.path.take().or_else(|| long_name.take()) {
                    Some(n) => n,
                    None => header_name(&header),
                };
                out.members.push(Member { name, offset: data, size });
                long_name = None;
            }
            _ => {
                // A folder, link, device or global pax header: not a member.
                long_name = None;
                pax = Pax::default();
            }
        }
        at = end.div_ceil(BLOCK) * BLOCK;
    }
    if at < len && at + BLOCK > len {
        out.damage =
            Some(Damage { offset: at, reason: "the file ends inside a header: the tar is truncated".into() });
    }
    Ok(out)
}

/// The name of a ustar header: `prefix/name` when a prefix is stated.
fn header_name(h: &[u8; BLOCK as usize]) -> String {
    let field =
        |b: &[u8]| String::from_utf8_lossy(b.split(|&c| c == 0).next().unwrap_or_default()).into_owned();
    let name = field(&h[0..100]);
    let ustar = &h[257..262] == b"ustar";
    let prefix = if ustar { field(&h[345..500]) } else { String::new() };
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    }
}

/// The header's checksum: the sum of its bytes with the checksum field read as spaces, unsigned
/// (POSIX) or signed (old Sun tars).
fn checksum_ok(h: &[u8; BLOCK as usize]) -> Result<(), String> {
    let Some(stated) = octal_or_binary(&h[148..156]) else {
        return Err("its checksum field is not a number: not a tar, or damaged".into());
    };
    let spaces = 8 * b' ' as u64;
    let unsigned: u64 = h.iter().map(|&b| b as u64).sum::<u64>()
        - h[148..156].iter().map(|&b| b as u64).sum::<u64>()
        + spaces;
    let signed: i64 = h.iter().map(|&b| b as i8 as i64).sum::<i64>()
        - h[148..156].iter().map(|&b| b as i8 as i64).sum::<i64>()
        + spaces as i64;
    if stated == unsigned || stated as i64 == signed {
        Ok(())
    } else {
        Err(format!("checksum {stated} does not match the header's bytes ({unsigned}): damaged"))
    }
}

/// A numeric header field: octal digits (space- or NUL-padded), or GNU's base-256 (high bit set).
fn octal_or_binary(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        let mut v: u64 = (field[0] & 0x7f) as u64;
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(b as u64)?;
        }
        return Some(v);
    }
    let text = field.iter().skip_while(|&&b| b == b' ' || b == 0).take_while(|&&b| b != b' ' && b != 0);
    let mut v: u64 = 0;
    let mut digits = 0;
    for &b in text {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add((b - b'0') as u64)?;
        digits += 1;
    }
    (digits > 0 || field.iter().all(|&b| b == 0 || b == b' ')).then_some(v)
}

/// The pax records DataHelix uses from an `x` header: the next member's path and size.
#[derive(Default)]
struct Pax {
    path: Option<String>,
    size: Option<u64>,
}

impl Pax {
    /// Parses `"LEN key=value\n"` records.
    fn parse(mut bytes: &[u8]) -> Result<Pax, String> {
        let mut pax = Pax::default();
        while !bytes.is_empty() && bytes[0] != 0 {
            let space = bytes.iter().position(|&b| b == b' ').ok_or("a record without a length")?;
            let len: usize = std::str::from_utf8(&bytes[..space])
                .ok()
                .and_then(|s| s.parse().ok())
                .filter(|&l| l > space + 1 && l <= bytes.len())
                .ok_or("a record length that does not fit")?;
            let record = &bytes[space + 1..len];
            let record = record.strip_suffix(b"\n").ok_or("a record not ended by a newline")?;
            let eq = record.iter().position(|&b| b == b'=').ok_or("a record without '='")?;
            let (key, value) = (&record[..eq], &record[eq + 1..]);
            match key {
                b"path" => pax.path = Some(String::from_utf8_lossy(value).into_owned()),
                b"size" => {
                    let size = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok());
                    pax.size = Some(size.ok_or("a size that is not a number")?);
                }
                _ => {}
            }
            bytes = &bytes[len..];
        }
        Ok(pax)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn tar_of(args: &[&str], files: &[(&str, &[u8])]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            let p = dir.path().join("in").join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
        }
        let tar = dir.path().join("t.tar");
        let mut cmd = std::process::Command::new("tar");
        cmd.current_dir(dir.path().join("in")).args(args).arg("-cf").arg(&tar);
        cmd.args(files.iter().map(|(n, _)| *n));
        assert!(cmd.status().unwrap().success());
        (dir, tar)
    }

    fn contents(tar: &std::path::Path, m: &Member) -> Vec<u8> {
        let mut b = vec![0; m.size as usize];
        File::open(tar).unwrap().read_exact_at(&mut b, m.offset).unwrap();
        b
    }

    #[test]
    fn members_of_every_format_gnu_tar_writes() {
        let long = format!("{}/k.json", "d".repeat(150));
        let files: [(&str, &[u8]); 3] = [("a.mp4", b"video bytes"), ("a.txt", b"a cat"), (&long, b"{}")];
        for format in ["--format=ustar", "--format=gnu", "--format=pax"] {
            let args: &[&str] = &[format];
            let files = if format == "--format=ustar" { &files[..2] } else { &files[..] };
            let (_d, tar) = tar_of(args, files);
            let listing = members(&File::open(&tar).unwrap()).unwrap();
            assert_eq!(listing.damage, None, "{format}");
            let names: Vec<&str> = listing.members.iter().map(|m| m.name.as_str()).collect();
            assert_eq!(names, files.iter().map(|f| f.0).collect::<Vec<_>>(), "{format}");
            for (m, (_, bytes)) in listing.members.iter().zip(files) {
                assert_eq!(contents(&tar, m), *bytes, "{format} {}", m.name);
            }
        }
    }

    #[test]
    fn damage_keeps_what_came_before_and_says_where() {
        let (_d, tar) = tar_of(&["--format=ustar"], &[("a.mp4", &[7u8; 700]), ("b.mp4", b"b")]);
        let mut bytes = std::fs::read(&tar).unwrap();
        // The second header starts after the first member's 700 bytes, padded to 1024.
        bytes[512 + 1024 + 10] ^= 0x55;
        std::fs::write(&tar, &bytes).unwrap();
        let listing = members(&File::open(&tar).unwrap()).unwrap();
        assert_eq!(listing.members.len(), 1);
        let damage = listing.damage.unwrap();
        assert_eq!(damage.offset, 1536);
        assert!(damage.reason.contains("checksum"), "{damage}");

        // Cut inside the first member: truncated, nothing listed.
        std::fs::write(&tar, &bytes[..900]).unwrap();
        let listing = members(&File::open(&tar).unwrap()).unwrap();
        assert!(listing.members.is_empty());
        assert!(listing.damage.unwrap().reason.contains("truncated"));
    }

    #[test]
    fn a_file_that_is_not_a_tar_is_damage_at_byte_zero() {
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), vec![b'x'; 2048]).unwrap();
        let listing = members(&File::open(t.path()).unwrap()).unwrap();
        assert_eq!(listing.damage.map(|d| d.offset), Some(0));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Whatever bytes a damaged or hostile shard holds, listing it never panics, and every
        /// member it lists lies inside the file.
        #[test]
        fn damaged_shards_list_only_members_inside_the_file(
            flips in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..12),
            cut in 0usize..4096,
        ) {
            static TAR: std::sync::OnceLock<(tempfile::TempDir, Vec<u8>)> = std::sync::OnceLock::new();
            let (_dir, good) = TAR.get_or_init(|| {
                let long = format!("{}/k.json", "d".repeat(120));
                let files: [(&str, &[u8]); 3] = [("a.mp4", &[1u8; 900]), ("a.txt", b"a cat"), (&long, b"{}")];
                let (d, tar) = tar_of(&["--format=pax"], &files);
                let bytes = std::fs::read(tar).unwrap();
                (d, bytes)
            });
            let mut bytes = good.clone();
            for (at, v) in flips {
                let at = at % bytes.len();
                bytes[at] = v;
            }
            bytes.truncate(cut.max(1).min(bytes.len()));
            let t = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(t.path(), &bytes).unwrap();
            let listing = members(&File::open(t.path()).unwrap()).unwrap();
            for m in &listing.members {
                proptest::prop_assert!(m.offset + m.size <= bytes.len() as u64, "{m:?} past {}", bytes.len());
            }
        }
    }

    #[test]
    fn numeric_fields() {
        assert_eq!(octal_or_binary(b"0000644\0"), Some(0o644));
        assert_eq!(octal_or_binary(b"   17 \0"), Some(0o17));
        assert_eq!(octal_or_binary(&[0x80, 0, 0, 0, 0, 0, 1, 0]), Some(256));
        assert_eq!(octal_or_binary(b"12x4\0"), None);
        assert_eq!(octal_or_binary(b"\0\0\0\0"), Some(0));
    }
}
