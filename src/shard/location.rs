//! Where a sample inside a shard lives, as the index writes it, and a file read through a window.
//!
//! A sample from a tar shard is indexed with a path of the form `SHARD#MEMBER@OFFSET+LEN`: the
//! shard's path in the dataset folder, the media member's name in the tar (for people reading
//! it), and the member's byte range, so that decoding it is one read of the shard.
//!
//! ```
//! use datahelix::shard::location::{ByteRange, MemberPath};
//!
//! let text = MemberPath::format("train-000000.tar", "clip/0017.mp4", ByteRange { offset: 1536, len: 20480 });
//! assert_eq!(text, "train-000000.tar#clip/0017.mp4@1536+20480");
//! let m = MemberPath::parse(&text).unwrap();
//! assert_eq!((m.shard, m.member, m.range.end()), ("train-000000.tar", "clip/0017.mp4", Some(22016)));
//! assert!(MemberPath::parse("videos/a.mp4").is_none());
//! ```

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;

/// A byte range of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ByteRange {
    /// The first byte.
    pub offset: u64,
    /// Bytes in the range.
    pub len: u64,
}

impl ByteRange {
    /// The byte just past the range (`None` when that overflows).
    pub fn end(self) -> Option<u64> {
        self.offset.checked_add(self.len)
    }
}

/// A media member of a shard, as named by an index path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberPath<'a> {
    /// The shard's path, relative to the dataset folder (ends in `.tar`, holds no `#`).
    pub shard: &'a str,
    /// The member's name inside the tar.
    pub member: &'a str,
    /// The member's bytes in the shard.
    pub range: ByteRange,
}

impl<'a> MemberPath<'a> {
    /// The index path of a member.
    pub fn format(shard: &str, member: &str, range: ByteRange) -> String {
        format!("{shard}#{member}@{}+{}", range.offset, range.len)
    }

    /// Reads an index path written by [`MemberPath::format`]; `None` for any other path (a
    /// loose file).
    pub fn parse(text: &'a str) -> Option<MemberPath<'a>> {
        let (left, numbers) = text.rsplit_once('@')?;
        let (offset, len) = numbers.split_once('+')?;
        let number =
            |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?;
        let range = ByteRange { offset: number(offset)?, len: number(len)? };
        let (shard, member) = left.split_once('#')?;
        (shard.ends_with(".tar") && !member.is_empty()).then_some(MemberPath { shard, member, range })
    }
}

/// A window of a file, read as if it were the whole file: reads stop at the window's end and
/// seeks are relative to its start.
#[derive(Debug)]
pub struct Window {
    file: File,
    range: ByteRange,
    pos: u64,
}

impl Window {
    /// The whole of `file`.
    pub fn whole(file: File) -> std::io::Result<Window> {
        let len = file.metadata()?.len();
        Ok(Window { file, range: ByteRange { offset: 0, len }, pos: 0 })
    }

    /// `range` of `file`; an error when the range runs past the file's end.
    pub fn range(file: File, range: ByteRange) -> std::io::Result<Window> {
        let len = file.metadata()?.len();
        if range.end().is_none_or(|e| e > len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("bytes {}..+{} lie past the file's end ({len} bytes)", range.offset, range.len),
            ));
        }
        Ok(Window { file, range, pos: 0 })
    }

    /// Bytes in the window.
    pub fn len(&self) -> u64 {
        self.range.len
    }

    /// True when the window holds no byte.
    pub fn is_empty(&self) -> bool {
        self.range.len == 0
    }

    /// The range of the underlying file.
    pub fn byte_range(&self) -> ByteRange {
        self.range
    }
}

impl Read for Window {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.range.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let k = self.file.read_at(&mut buf[..n], self.range.offset + self.pos)?;
        self.pos += k as u64;
        Ok(k)
    }
}

impl Seek for Window {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.range.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let target = target.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        self.pos = target;
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_are_not_members() {
        for p in [
            "a.mp4",
            "a.tar",
            "a.tar#m",
            "a.tar#m@1",
            "a.tar#m@1+",
            "a.tar#m@x+1",
            "a.zip#m@1+2",
            "a.tar#@1+2",
        ] {
            assert!(MemberPath::parse(p).is_none(), "{p}");
        }
        let m = MemberPath::parse("s/a.tar#x@y.mp4@0+5").unwrap();
        assert_eq!((m.shard, m.member, m.range), ("s/a.tar", "x@y.mp4", ByteRange { offset: 0, len: 5 }));
    }

    #[test]
    fn a_window_reads_only_its_range() {
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), b"0123456789").unwrap();
        let mut w = Window::range(File::open(t.path()).unwrap(), ByteRange { offset: 3, len: 4 }).unwrap();
        let mut all = Vec::new();
        w.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"3456");
        assert_eq!(w.seek(SeekFrom::End(-1)).unwrap(), 3);
        let mut one = [0u8; 4];
        assert_eq!(w.read(&mut one).unwrap(), 1);
        assert_eq!(one[0], b'6');
        assert!(Window::range(File::open(t.path()).unwrap(), ByteRange { offset: 8, len: 3 }).is_err());
    }
}
