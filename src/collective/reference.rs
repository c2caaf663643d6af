//! An offline model of the `v` collectives' semantics, the way HCCL's own tests check them: virtual
//! per-rank buffers and, for every receiving rank, a record of which rank and offset each range of
//! its receive buffer comes from. The multi-rank tests compare the real backend against it byte by
//! byte (with the [`check`] pattern, which encodes sender and offset in every byte).

use super::check;

/// One range of a receive buffer and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Offset in the receiving rank's buffer.
    pub dst_offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// The sending rank.
    pub src_rank: usize,
    /// Offset in the sending rank's send buffer.
    pub src_offset: usize,
}

/// One rank's arguments to an all-to-all-v.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllToAllVArgs {
    /// Bytes sent to each rank.
    pub send_counts: Vec<usize>,
    /// Where each rank's block starts in the send buffer.
    pub send_displs: Vec<usize>,
    /// Bytes received from each rank.
    pub recv_counts: Vec<usize>,
    /// Where each rank's block goes in the receive buffer.
    pub recv_displs: Vec<usize>,
    /// Send buffer length.
    pub send_len: usize,
    /// Receive buffer length.
    pub recv_len: usize,
}

/// Where each byte of rank `rank`'s receive buffer comes from, given every rank's arguments.
pub fn all_to_all_v_sources(args: &[AllToAllVArgs], rank: usize) -> Vec<Segment> {
    (0..args.len())
        .filter(|&p| args[rank].recv_counts[p] > 0)
        .map(|p| Segment {
            dst_offset: args[rank].recv_displs[p],
            len: args[rank].recv_counts[p],
            src_rank: p,
            src_offset: args[p].send_displs[rank],
        })
        .collect()
}

/// Where each byte of every rank's all-gather-v receive buffer comes from (the same on all ranks).
pub fn all_gather_v_sources(counts: &[usize], displs: &[usize]) -> Vec<Segment> {
    (0..counts.len())
        .filter(|&p| counts[p] > 0)
        .map(|p| Segment { dst_offset: displs[p], len: counts[p], src_rank: p, src_offset: 0 })
        .collect()
}

/// Runs an all-to-all-v on virtual buffers: `sends[p]` is rank `p`'s send buffer; returns every
/// rank's receive buffer (bytes no segment covers are zero).
pub fn simulate_all_to_all_v(args: &[AllToAllVArgs], sends: &[Vec<u8>]) -> Vec<Vec<u8>> {
    (0..args.len())
        .map(|r| {
            let mut recv = vec![0u8; args[r].recv_len];
            for s in all_to_all_v_sources(args, r) {
                recv[s.dst_offset..s.dst_offset + s.len]
                    .copy_from_slice(&sends[s.src_rank][s.src_offset..s.src_offset + s.len]);
            }
            recv
        })
        .collect()
}

/// Checks a receive buffer filled from [`check`]-pattern send buffers against `segments`: every
/// byte of a segment must be the sender's pattern byte at the recorded offset, and every byte
/// outside all segments must still hold the poison written by [`poison_outside`]. Returns the
/// number of wrong bytes and a description of the first one.
pub fn verify(rank: usize, recv: &[u8], segments: &[Segment]) -> (u64, Option<String>) {
    let mut wrong = 0;
    let mut first = None;
    for s in segments {
        let (w, at) = check::mismatches(s.src_rank, s.src_offset, &recv[s.dst_offset..s.dst_offset + s.len]);
        wrong += w;
        if let (None, Some(i)) = (&first, at) {
            first = Some(format!(
                "rank {rank}: receive byte {} should be rank {}'s send byte {} (0x{:02x}) but is 0x{:02x}",
                s.dst_offset + i,
                s.src_rank,
                s.src_offset + i,
                check::byte(s.src_rank, s.src_offset + i),
                recv[s.dst_offset + i]
            ));
        }
    }
    let mut covered: Vec<(usize, usize)> =
        segments.iter().map(|s| (s.dst_offset, s.dst_offset + s.len)).collect();
    covered.sort_unstable();
    let mut at = 0;
    for (start, end) in covered.into_iter().chain([(recv.len(), recv.len())]) {
        for (i, b) in recv.iter().enumerate().take(start.max(at)).skip(at) {
            if *b != GAP {
                wrong += 1;
                first.get_or_insert_with(|| {
                    format!("rank {rank}: receive byte {i} lies outside every block but was overwritten (0x{b:02x})")
                });
            }
        }
        at = at.max(end);
    }
    (wrong, first)
}

/// The byte [`poison_outside`] writes where no segment lands.
pub const GAP: u8 = 0xA5;

/// Prepares a receive buffer for [`verify`]: bytes inside segments get a value that differs from
/// the expected one, bytes outside get [`GAP`].
pub fn poison_outside(recv: &mut [u8], segments: &[Segment]) {
    recv.fill(GAP);
    for s in segments {
        check::poison(s.src_rank, s.src_offset, &mut recv[s.dst_offset..s.dst_offset + s.len]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::prefix_sums;

    fn uneven(n: usize) -> Vec<AllToAllVArgs> {
        let count = |s: usize, d: usize| if s == 1 { 0 } else { (s * 7 + d * 13) % 11 };
        (0..n)
            .map(|r| {
                let send_counts: Vec<usize> = (0..n).map(|d| count(r, d)).collect();
                let recv_counts: Vec<usize> = (0..n).map(|s| count(s, r)).collect();
                // Receive blocks in reverse rank order with a 3-byte gap between them.
                let mut recv_displs = vec![0; n];
                let mut at = 0;
                for p in (0..n).rev() {
                    recv_displs[p] = at;
                    at += recv_counts[p] + 3;
                }
                AllToAllVArgs {
                    send_len: send_counts.iter().sum(),
                    send_displs: prefix_sums(&send_counts),
                    send_counts,
                    recv_counts,
                    recv_displs,
                    recv_len: at,
                }
            })
            .collect()
    }

    #[test]
    fn simulated_exchange_verifies_and_mistakes_are_found() {
        let args = uneven(4);
        let sends: Vec<Vec<u8>> = args
            .iter()
            .enumerate()
            .map(|(r, a)| {
                let mut v = vec![0; a.send_len];
                check::fill(r, 0, &mut v);
                v
            })
            .collect();
        let mut recvs = simulate_all_to_all_v(&args, &sends);
        for (r, recv) in recvs.iter_mut().enumerate() {
            let segs = all_to_all_v_sources(&args, r);
            let mut poisoned = vec![0; recv.len()];
            poison_outside(&mut poisoned, &segs);
            for s in &segs {
                poisoned[s.dst_offset..s.dst_offset + s.len]
                    .copy_from_slice(&recv[s.dst_offset..s.dst_offset + s.len]);
            }
            assert_eq!(verify(r, &poisoned, &segs), (0, None));
            assert!(segs.iter().all(|s| s.src_rank != 1), "rank 1 sends nothing");
            if let Some(s) = segs.first() {
                poisoned[s.dst_offset] ^= 1;
                let (w, msg) = verify(r, &poisoned, &segs);
                assert_eq!(w, 1);
                assert!(msg.unwrap().contains(&format!("rank {}'s send byte {}", s.src_rank, s.src_offset)));
            }
        }
    }

    #[test]
    fn local_world_matches_the_model() {
        use crate::collective::{Collective, LocalWorld};
        let args = vec![AllToAllVArgs {
            send_counts: vec![5],
            send_displs: vec![2],
            recv_counts: vec![5],
            recv_displs: vec![1],
            send_len: 9,
            recv_len: 8,
        }];
        let mut send = vec![0; 9];
        check::fill(0, 0, &mut send);
        let segs = all_to_all_v_sources(&args, 0);
        let mut recv = vec![0; 8];
        poison_outside(&mut recv, &segs);
        let a = &args[0];
        LocalWorld::new()
            .all_to_all_v(&send, &a.send_counts, &a.send_displs, &mut recv, &a.recv_counts, &a.recv_displs)
            .unwrap();
        assert_eq!(verify(0, &recv, &segs), (0, None));
        assert_eq!(
            recv,
            simulate_all_to_all_v(&args, &[send])[0]
                .iter()
                .enumerate()
                .map(|(i, b)| if (1..6).contains(&i) { *b } else { GAP })
                .collect::<Vec<_>>()
        );
    }
}
