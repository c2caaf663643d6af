//! Moving decoded tensors between ranks: a self-describing message per sample, or per piece of a
//! sample decoded in parts (header + raw or zstd-compressed bytes), packed per destination for
//! one exchange.
//!
//! ```
//! use datahelix::exec::exchange::{pack, unpack, Piece};
//!
//! let piece = Piece {
//!     step: 7, index: 3, part: 1, id: 99, shape: [2, 28, 28, 3], tokens: 7, ok: true,
//!     timestamps_s: vec![0.5, 1.5], data: vec![5u8; 2 * 28 * 28 * 3],
//! };
//! let mut buf = Vec::new();
//! pack(&mut buf, &piece, true).unwrap();        // compressed with zstd level 1
//! let back = unpack(&buf, 1 << 20).unwrap();
//! assert_eq!(back, vec![piece]);
//! ```

/// One sample, or one piece of a split sample, on the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct Piece {
    /// The training step it belongs to.
    pub step: u64,
    /// Index of the sample in its step's batch.
    pub index: u32,
    /// Which piece of the sample (0 for a whole sample).
    pub part: u16,
    /// Sample id.
    pub id: u64,
    /// `[F, H, W, 3]` of these bytes (a piece's frames only).
    pub shape: [usize; 4],
    /// Tokens it gives the accelerator.
    pub tokens: u64,
    /// False when decoding failed (then `data` is empty): the owner learns of the skip.
    pub ok: bool,
    /// Each frame's presentation time in seconds (`shape[0]` of them; none when failed).
    pub timestamps_s: Vec<f64>,
    /// Packed RGB24 bytes.
    pub data: Vec<u8>,
}

/// Bytes of a piece's header on the wire. A decoded piece's `shape[0]` frame times (f64) follow
/// it, then its (possibly compressed) bytes.
pub const HEADER: usize = 64;

/// Where each field of a header sits (little-endian): `index` u32 at 0, `ok` u8 at 4, the
/// compressed flag u8 at 5, `part` u16 at 6, `id` u64 at 8, the four dimensions u32 from 16,
/// `tokens` u64 at 32, the uncompressed length u64 at 40, the wire length u64 at 48, `step` u64
/// at 56. The fault injection of the tests (`src/exec/fault.rs`) writes through these too.
pub(crate) mod at {
    pub const COMPRESSED: usize = 5;
    pub const SHAPE: usize = 16;
    pub const RAW_LEN: usize = 40;
    pub const WIRE_LEN: usize = 48;
    pub const STEP: usize = 56;
}

/// A malformed message (a peer running another build, or memory corruption).
#[derive(Debug, thiserror::Error)]
#[error("tensor message from a peer is malformed: {0}; every rank must run the same DataHelix build")]
pub struct ExchangeError(pub String);

/// Appends `piece` to `out`, zstd-compressed (level 1) when `compress`.
pub fn pack(out: &mut Vec<u8>, piece: &Piece, compress: bool) -> Result<(), ExchangeError> {
    pack_data(out, piece, &piece.data, compress)
}

/// Appends `piece`'s header with `data` as its bytes (`piece.data` is not read): one copy of a
/// tensor that lives elsewhere, e.g. in a pool buffer.
pub fn pack_data(out: &mut Vec<u8>, piece: &Piece, data: &[u8], compress: bool) -> Result<(), ExchangeError> {
    let frames = if piece.ok { piece.shape[0] } else { 0 };
    if piece.timestamps_s.len() != frames {
        return Err(ExchangeError(format!(
            "a piece of {frames} frames with {} frame times",
            piece.timestamps_s.len()
        )));
    }
    let compressed;
    let payload: &[u8] = if compress && !data.is_empty() {
        compressed = zstd::bulk::compress(data, 1).map_err(|e| ExchangeError(format!("zstd: {e}")))?;
        &compressed
    } else {
        data
    };
    let mut h = [0u8; HEADER];
    h[0..4].copy_from_slice(&piece.index.to_le_bytes());
    h[4] = piece.ok as u8;
    h[at::COMPRESSED] = (compress && !data.is_empty()) as u8;
    h[6..8].copy_from_slice(&piece.part.to_le_bytes());
    h[8..16].copy_from_slice(&piece.id.to_le_bytes());
    for (k, d) in piece.shape.iter().enumerate() {
        h[at::SHAPE + 4 * k..at::SHAPE + 4 + 4 * k].copy_from_slice(&(*d as u32).to_le_bytes());
    }
    h[32..40].copy_from_slice(&piece.tokens.to_le_bytes());
    h[at::RAW_LEN..at::RAW_LEN + 8].copy_from_slice(&(data.len() as u64).to_le_bytes());
    h[at::WIRE_LEN..at::WIRE_LEN + 8].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[at::STEP..at::STEP + 8].copy_from_slice(&piece.step.to_le_bytes());
    out.extend_from_slice(&h);
    for t in &piece.timestamps_s {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(payload);
    Ok(())
}

/// Reads every piece of a received block. Nothing in a header is trusted before it is checked:
/// a decoded piece must announce exactly `∏shape` bytes, and no more than `max_bytes` (the
/// largest tensor the run's preprocessing can produce), before anything is allocated or
/// decompressed; a failed piece carries none.
pub fn unpack(mut block: &[u8], max_bytes: usize) -> Result<Vec<Piece>, ExchangeError> {
    let mut out = Vec::new();
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    while !block.is_empty() {
        if block.len() < HEADER {
            return Err(ExchangeError("truncated header".into()));
        }
        let h = &block[..HEADER];
        let raw_len = u64_at(h, at::RAW_LEN) as usize;
        let wire_len = u64_at(h, at::WIRE_LEN) as usize;
        let dim = |k: usize| {
            u32::from_le_bytes(h[at::SHAPE + 4 * k..at::SHAPE + 4 + 4 * k].try_into().unwrap_or([0; 4]))
                as usize
        };
        let shape = [dim(0), dim(1), dim(2), dim(3)];
        let ok = h[4] == 1;
        let announced = if ok { shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) } else { Some(0) };
        if announced != Some(raw_len) || raw_len > max_bytes {
            return Err(ExchangeError(format!(
                "a piece of step {} announces {raw_len} bytes for shape {shape:?} (at most {max_bytes} here)",
                u64_at(h, at::STEP)
            )));
        }
        // Frame times: one f64 a frame, read only from bytes the block holds.
        let frames = if ok { shape[0] } else { 0 };
        let times_len = frames.saturating_mul(8);
        if (block.len() - HEADER) < times_len.saturating_add(wire_len) {
            return Err(ExchangeError("payload shorter than its header says".into()));
        }
        let times = &block[HEADER..HEADER + times_len];
        let timestamps_s: Vec<f64> =
            times.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        if timestamps_s.iter().any(|t| !t.is_finite()) {
            return Err(ExchangeError(format!(
                "a piece of step {} has a frame time that is not finite",
                u64_at(h, at::STEP)
            )));
        }
        let payload = &block[HEADER + times_len..HEADER + times_len + wire_len];
        let data = if h[at::COMPRESSED] == 1 {
            zstd::bulk::decompress(payload, raw_len).map_err(|e| ExchangeError(format!("zstd: {e}")))?
        } else {
            payload.to_vec()
        };
        if data.len() != raw_len {
            return Err(ExchangeError("decompressed size differs from the header".into()));
        }
        out.push(Piece {
            step: u64_at(h, at::STEP),
            index: u32::from_le_bytes(h[0..4].try_into().unwrap_or([0; 4])),
            part: u16::from_le_bytes([h[6], h[7]]),
            ok,
            id: u64_at(h, 8),
            shape,
            tokens: u64_at(h, 32),
            timestamps_s,
            data,
        });
        block = &block[HEADER + times_len + wire_len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_failed_and_garbage() {
        let ok = Piece {
            step: u64::MAX,
            index: 1,
            part: 2,
            id: u64::MAX,
            shape: [1, 28, 56, 3],
            tokens: 2,
            ok: true,
            timestamps_s: vec![0.04],
            data: (0..4704u32).map(|x| x as u8).collect(),
        };
        let failed = Piece {
            step: 0,
            index: 2,
            part: 0,
            id: 5,
            shape: [0; 4],
            tokens: 0,
            ok: false,
            timestamps_s: vec![],
            data: vec![],
        };
        let mut buf = Vec::new();
        pack(&mut buf, &ok, false).unwrap();
        pack(&mut buf, &failed, true).unwrap();
        assert_eq!(unpack(&buf, 1 << 20).unwrap(), vec![ok, failed]);
        assert!(unpack(&buf[..buf.len() - 1], 1 << 20).is_err());
        assert!(unpack(&[1, 2, 3], 1 << 20).is_err());
        assert!(unpack(&buf, 4703).is_err(), "larger than the run's largest tensor");
    }

    /// Lengths in a header are checked before anything is allocated: without the check, the
    /// first of these asks zstd for a 2^50-byte buffer (the process aborts).
    #[test]
    fn announced_lengths_are_bounded_before_allocating() {
        let piece = Piece {
            step: 3,
            index: 0,
            part: 0,
            id: 9,
            shape: [1, 28, 28, 3],
            tokens: 1,
            ok: true,
            timestamps_s: vec![1.0],
            data: vec![7; 2352],
        };
        let mut good = Vec::new();
        pack(&mut good, &piece, true).unwrap();
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        };
        let huge = with(at::RAW_LEN, &(1u64 << 50).to_le_bytes());
        let e = unpack(&huge, 1 << 30).unwrap_err().to_string();
        assert!(e.contains("announces 1125899906842624 bytes"), "{e}");
        // Another shape with the same number of bytes passes here (the plan catches it, in the
        // engine); a shape whose product overflows does not.
        let overflow = with(at::SHAPE, &[0xff; 16]);
        assert!(unpack(&overflow, usize::MAX).is_err());
        let failed_with_bytes = with(4, &[0]);
        assert!(unpack(&failed_with_bytes, 1 << 30).is_err(), "a failed piece carries no bytes");
    }

    /// A decoded piece carries one time per frame; a time that is not a number is refused, and
    /// a piece cannot be packed with the wrong count.
    #[test]
    fn frame_times_travel_with_their_frames() {
        let piece = Piece {
            step: 1,
            index: 0,
            part: 0,
            id: 4,
            shape: [3, 2, 2, 3],
            tokens: 1,
            ok: true,
            timestamps_s: vec![0.0, 1.0 / 3.0, 2.5],
            data: vec![1; 36],
        };
        let mut buf = Vec::new();
        pack(&mut buf, &piece, true).unwrap();
        assert_eq!(unpack(&buf, 1 << 20).unwrap()[0].timestamps_s, piece.timestamps_s);
        buf[HEADER + 8..HEADER + 16].copy_from_slice(&f64::NAN.to_le_bytes());
        assert!(unpack(&buf, 1 << 20).unwrap_err().to_string().contains("not finite"));
        let short = Piece { timestamps_s: vec![0.0], ..piece };
        assert!(pack(&mut Vec::new(), &short, false).is_err());
    }
}
