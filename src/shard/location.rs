//! Where a sample inside a shard lives, as the index writes it, and a file read through a window.
//!
//! A sample from a tar or zip shard is indexed with a path of the form `SHARD#MEMBER@OFFSET+LEN`:
//! the shard's path in the dataset folder, the media member's name in it (for people reading
//! it), and the member's byte range, so that decoding it is one read of the shard. A deflated
//! zip member adds how to inflate it and check it, `:deflate:SIZE:CRC32` ([`Coding`]).
//!
//! ```
//! use datahelix::shard::location::{ByteRange, Coding, MemberPath, Part};
//!
//! let text = MemberPath::format("train-000000.tar", "clip/0017.mp4", Part::stored(1536, 20480));
//! assert_eq!(text, "train-000000.tar#clip/0017.mp4@1536+20480");
//! let m = MemberPath::parse(&text).unwrap();
//! assert_eq!((m.shard, m.member, m.part.range.end()), ("train-000000.tar", "clip/0017.mp4", Some(22016)));
//! assert!(MemberPath::parse("videos/a.mp4").is_none());
//!
//! let deflated = Part { range: ByteRange { offset: 64, len: 900 }, coding: Coding::Deflated { size: 1200, crc32: 0xbeef } };
//! let text = MemberPath::format("clips.zip", "v/1.mp4", deflated);
//! assert_eq!(text, "clips.zip#v/1.mp4@64+900:deflate:1200:0000beef");
//! assert_eq!(MemberPath::parse(&text).unwrap().part, deflated);
//! assert_eq!(deflated.bytes(), 1200);
//! ```

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, PoisonError};

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

/// How a member's bytes are kept in its shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coding {
    /// As they are (every tar member; a zip member stored with `zip -0`).
    Stored,
    /// Deflated (a zip member): `size` bytes once inflated, whose CRC-32 is `crc32`.
    Deflated {
        /// Bytes once inflated.
        size: u64,
        /// The CRC-32 of the inflated bytes, checked after inflating.
        crc32: u32,
    },
}

/// A member's bytes in its shard and how they are coded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Part {
    /// Where its bytes lie in the shard.
    pub range: ByteRange,
    /// How they are kept.
    pub coding: Coding,
}

impl Part {
    /// `len` bytes at `offset`, kept as they are.
    pub fn stored(offset: u64, len: u64) -> Part {
        Part { range: ByteRange { offset, len }, coding: Coding::Stored }
    }

    /// The member's size as a file: its range's length, or its inflated size.
    pub fn bytes(&self) -> u64 {
        match self.coding {
            Coding::Stored => self.range.len,
            Coding::Deflated { size, .. } => size,
        }
    }

    /// Memory reading it takes beyond the file: a deflated member is inflated whole.
    pub fn inflated_bytes(&self) -> u64 {
        match self.coding {
            Coding::Stored => 0,
            Coding::Deflated { size, .. } => size,
        }
    }
}

/// Shard file names the index paths may name: tar and zip.
pub const SHARD_EXTENSIONS: [&str; 2] = [".tar", ".zip"];

/// A media member of a shard, as named by an index path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberPath<'a> {
    /// The shard's path, relative to the dataset folder (ends in `.tar` or `.zip`, holds no `#`).
    pub shard: &'a str,
    /// The member's name inside the shard.
    pub member: &'a str,
    /// The member's bytes in the shard.
    pub part: Part,
}

impl<'a> MemberPath<'a> {
    /// The index path of a member.
    pub fn format(shard: &str, member: &str, part: Part) -> String {
        let ByteRange { offset, len } = part.range;
        match part.coding {
            Coding::Stored => format!("{shard}#{member}@{offset}+{len}"),
            Coding::Deflated { size, crc32 } => {
                format!("{shard}#{member}@{offset}+{len}:deflate:{size}:{crc32:08x}")
            }
        }
    }

    /// Reads an index path written by [`MemberPath::format`]; `None` for any other path (a
    /// loose file).
    pub fn parse(text: &'a str) -> Option<MemberPath<'a>> {
        let (left, numbers) = text.rsplit_once('@')?;
        let mut fields = numbers.split(':');
        let (offset, len) = fields.next()?.split_once('+')?;
        let number =
            |s: &str| (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?;
        let range = ByteRange { offset: number(offset)?, len: number(len)? };
        let coding = match (fields.next(), fields.next(), fields.next(), fields.next()) {
            (None, ..) => Coding::Stored,
            (Some("deflate"), Some(size), Some(crc), None) if crc.len() == 8 => {
                Coding::Deflated { size: number(size)?, crc32: u32::from_str_radix(crc, 16).ok()? }
            }
            _ => return None,
        };
        let (shard, member) = left.split_once('#')?;
        let tar = shard.ends_with(".tar");
        let known = tar && coding == Coding::Stored || shard.ends_with(".zip");
        (known && !member.is_empty()).then_some(MemberPath { shard, member, part: Part { range, coding } })
    }
}

/// A window of a file, read as if it were the whole file: reads stop at the window's end and
/// seeks are relative to its start. A deflated member's window holds its inflated bytes.
#[derive(Debug)]
pub struct Window {
    bytes: Bytes,
    len: u64,
    pos: u64,
}

/// Where a window's bytes come from.
#[derive(Debug)]
enum Bytes {
    /// A range of a file, read in place.
    File { file: File, offset: u64 },
    /// Inflated into memory (shared by the windows [`Window::try_clone`] makes).
    Memory(Arc<Inflated>),
}

/// A deflated member's bytes, counted in [`INFLATED`] while they live.
#[derive(Debug)]
struct Inflated {
    bytes: Vec<u8>,
    _held: Held<'static>,
}

/// The most bytes of inflated members the process holds at once: indexing a folder of large
/// deflated videos on many cores would otherwise inflate one per probing thread at once.
pub const MAX_INFLATED_HELD: u64 = 2 << 30;

/// Inflated bytes held by every [`Window`] of the process ([`MAX_INFLATED_HELD`]).
static INFLATED: HeldBytes = HeldBytes::new(MAX_INFLATED_HELD);

/// A count of bytes held against a cap: [`HeldBytes::hold`] waits while the new bytes would pass
/// the cap and others are held (bytes more than the cap are held alone).
#[derive(Debug)]
pub struct HeldBytes {
    cap: u64,
    held: Mutex<u64>,
    freed: Condvar,
}

/// Bytes held until dropped.
#[derive(Debug)]
pub struct Held<'a> {
    from: &'a HeldBytes,
    bytes: u64,
}

impl HeldBytes {
    /// Nothing held yet, against `cap`.
    pub const fn new(cap: u64) -> HeldBytes {
        HeldBytes { cap, held: Mutex::new(0), freed: Condvar::new() }
    }

    /// Holds `bytes`, first waiting until they fit under the cap or nothing else is held.
    pub fn hold(&self, bytes: u64) -> Held<'_> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        while *held > 0 && held.saturating_add(bytes) > self.cap {
            held = self.freed.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        *held += bytes;
        Held { from: self, bytes }
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.from.held.lock().unwrap_or_else(PoisonError::into_inner);
        *held -= self.bytes;
        self.from.freed.notify_all();
    }
}

impl Window {
    /// The whole of `file`.
    pub fn whole(file: File) -> std::io::Result<Window> {
        let len = file.metadata()?.len();
        Ok(Window { bytes: Bytes::File { file, offset: 0 }, len, pos: 0 })
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
        Ok(Window { bytes: Bytes::File { file, offset: range.offset }, len: range.len, pos: 0 })
    }

    /// The member `part` of the shard `file`: its range, or its bytes inflated into memory and
    /// checked (exactly the stated size, the stated CRC-32); an error naming what differs. The
    /// inflated bytes count against [`MAX_INFLATED_HELD`] from before inflating until the last
    /// window over them is dropped: past it, this waits for others to be dropped.
    pub fn open(file: File, part: Part) -> std::io::Result<Window> {
        let stored = Window::range(file, part.range)?;
        let Coding::Deflated { size, crc32 } = part.coding else { return Ok(stored) };
        let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
        let capacity = usize::try_from(size).map_err(|_| bad(format!("{size} bytes inflated: too large")))?;
        let held = INFLATED.hold(size);
        let mut inflated = Vec::new();
        inflated
            .try_reserve_exact(capacity)
            .map_err(|_| bad(format!("no memory for {size} inflated bytes")))?;
        // One byte more than stated is read, to notice a member that inflates to more.
        flate2::read::DeflateDecoder::new(stored)
            .take(size.saturating_add(1))
            .read_to_end(&mut inflated)
            .map_err(|e| bad(format!("it does not inflate ({e}): the archive is damaged")))?;
        if inflated.len() as u64 != size {
            let more = if inflated.len() as u64 > size { "more than" } else { "only" };
            return Err(bad(format!(
                "it inflates to {more} {} bytes, its header says {size}: damaged",
                inflated.len()
            )));
        }
        let mut crc = flate2::Crc::new();
        crc.update(&inflated);
        if crc.sum() != crc32 {
            return Err(bad(format!(
                "its CRC-32 is {:08x}, its header says {crc32:08x}: damaged",
                crc.sum()
            )));
        }
        Ok(Window {
            bytes: Bytes::Memory(Arc::new(Inflated { bytes: inflated, _held: held })),
            len: size,
            pos: 0,
        })
    }

    /// A second window over the same bytes, at its start (inflated bytes are shared, not copied).
    pub fn try_clone(&self) -> std::io::Result<Window> {
        let bytes = match &self.bytes {
            Bytes::File { file, offset } => Bytes::File { file: file.try_clone()?, offset: *offset },
            Bytes::Memory(m) => Bytes::Memory(Arc::clone(m)),
        };
        Ok(Window { bytes, len: self.len, pos: 0 })
    }

    /// Bytes in the window.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the window holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Read for Window {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let k = match &self.bytes {
            Bytes::File { file, offset } => file.read_at(&mut buf[..n], offset + self.pos)?,
            Bytes::Memory(m) => {
                let at = self.pos as usize;
                buf[..n].copy_from_slice(&m.bytes[at..at + n]);
                n
            }
        };
        self.pos += k as u64;
        Ok(k)
    }
}

impl Seek for Window {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
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
            "a.tgz#m@1+2",
            "a.tar#@1+2",
            "a.tar#m@1+2:deflate:3:00000000",
            "a.zip#m@1+2:deflate:3",
            "a.zip#m@1+2:deflate:3:0000000g",
            "a.zip#m@1+2:inflate:3:00000000",
            "a.zip#m@1+2:deflate:3:00000000:x",
        ] {
            assert!(MemberPath::parse(p).is_none(), "{p}");
        }
        let m = MemberPath::parse("s/a.tar#x@y.mp4@0+5").unwrap();
        assert_eq!((m.shard, m.member, m.part), ("s/a.tar", "x@y.mp4", Part::stored(0, 5)));
        let z = MemberPath::parse("a.zip#m@1+2").unwrap();
        assert_eq!(z.part, Part::stored(1, 2));
    }

    /// Bytes past the cap wait for others to be dropped; bytes over the cap alone do not wait.
    #[test]
    fn held_bytes_wait_under_their_cap() {
        static BUDGET: HeldBytes = HeldBytes::new(100);
        let alone = BUDGET.hold(150);
        drop(alone);
        let first = BUDGET.hold(80);
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let second = BUDGET.hold(50);
            tx.send(BUDGET.held()).unwrap();
            drop(second);
        });
        let timeout = std::time::Duration::from_millis(200);
        assert!(rx.recv_timeout(timeout).is_err(), "50 more bytes passed a cap of 100 with 80 held");
        drop(first);
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap(), 50);
        waiter.join().unwrap();
        assert_eq!(BUDGET.held(), 0);
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
