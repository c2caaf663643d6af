//! The byte pattern that collective checks use (`datahelix perf -c 1`, the multi-rank tests): the
//! byte at offset `o` of rank `s`'s send buffer is a function of `(s, o)` only, so a receiver can
//! tell for every received byte whether it came from the right rank and the right offset.
//! (nccl-tests fills buffers the same way, from the rank and the element index.)

/// SplitMix64's finaliser: a cheap bijective mix of 64 bits.
const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 8 pattern bytes of word `w` (offsets `8w..8w+8`) of rank `rank`'s buffer.
fn word(rank: usize, w: u64) -> [u8; 8] {
    mix(((rank as u64) << 48) ^ w).to_le_bytes()
}

/// The pattern byte at `offset` of rank `rank`'s send buffer.
pub fn byte(rank: usize, offset: usize) -> u8 {
    word(rank, (offset / 8) as u64)[offset % 8]
}

/// Writes the pattern of rank `rank`'s buffer, starting at `offset`, into `out`.
pub fn fill(rank: usize, offset: usize, out: &mut [u8]) {
    fill_xor(rank, offset, out, 0);
}

/// [`fill`], with every pattern word XOR-ed with `xor` (whole words at a time: this runs over
/// buffers of hundreds of MiB in unoptimised test builds).
fn fill_xor(rank: usize, offset: usize, out: &mut [u8], xor: u64) {
    let head = ((8 - offset % 8) % 8).min(out.len());
    for (i, b) in out[..head].iter_mut().enumerate() {
        *b = ((mix(((rank as u64) << 48) ^ ((offset + i) / 8) as u64) ^ xor).to_le_bytes())[(offset + i) % 8];
    }
    let mut w = ((offset + head) / 8) as u64;
    let mut chunks = out[head..].chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&(mix(((rank as u64) << 48) ^ w) ^ xor).to_le_bytes());
        w += 1;
    }
    let tail = chunks.into_remainder();
    let bytes = (mix(((rank as u64) << 48) ^ w) ^ xor).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&bytes[..n]);
}

/// Counts the bytes of `got` that differ from rank `rank`'s pattern starting at `offset`, and
/// returns the index of the first one.
pub fn mismatches(rank: usize, offset: usize, got: &[u8]) -> (u64, Option<usize>) {
    let mut expected = [0u8; 1 << 16];
    let mut wrong = 0u64;
    let mut first = None;
    for (k, chunk) in got.chunks(expected.len()).enumerate() {
        let base = k * expected.len();
        let exp = &mut expected[..chunk.len()];
        fill(rank, offset + base, exp);
        if exp != chunk {
            for (j, (a, b)) in exp.iter().zip(chunk).enumerate() {
                if a != b {
                    wrong += 1;
                    first.get_or_insert(base + j);
                }
            }
        }
    }
    (wrong, first)
}

/// Overwrites `buf` with bytes that differ from the pattern of `rank` at `offset` in every
/// position, so a byte a collective fails to write is always counted wrong.
pub fn poison(rank: usize, offset: usize, buf: &mut [u8]) {
    fill_xor(rank, offset, buf, u64::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_matches_byte_at_any_alignment() {
        for off in [0usize, 1, 7, 8, 13, 4095] {
            let mut v = vec![0u8; 9000];
            fill(3, off, &mut v);
            for (i, b) in v.iter().enumerate() {
                assert_eq!(*b, byte(3, off + i));
            }
            assert_eq!(mismatches(3, off, &v), (0, None));
            assert_ne!(mismatches(2, off, &v).0, 0, "another rank's pattern differs");
            assert_ne!(mismatches(3, off + 1, &v).0, 0, "a shifted offset differs");
            let mut p = v.clone();
            poison(3, off, &mut p);
            assert_eq!(mismatches(3, off, &p).0, 9000);
            p[5000] = byte(3, off + 5000);
            assert_eq!(mismatches(3, off, &p), (8999, Some(0)));
        }
    }
}
