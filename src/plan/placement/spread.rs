//! Where the pieces of split samples start: side by side on the ranks that free up first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::Problem;

/// The starting decoder of every job: its owner, except the pieces of split samples. A sample
/// is split because one worker would not decode it in time, so its pieces start side by side:
/// the largest first, each on the rank whose workers free up first (backlog, the whole samples it
/// decodes, and the pieces given so far, per worker; ties to the lower rank), never two pieces
/// of one sample on one rank while another rank has none of it. The search then moves them on.
pub(super) fn spread_pieces(p: &Problem, ranks: usize) -> Vec<u32> {
    let mut decoder = p.owner.clone();
    let mut busy: Vec<i64> = p.backlog_ns.clone();
    for i in (0..p.owner.len()).filter(|&i| !p.pinned[i]) {
        busy[p.owner[i] as usize] += p.decode_ns[i];
    }
    // (when rank h frees up, h) packed in one u128 (the time's sign bit flipped: unsigned order
    // is then signed order), compared in one instruction pair: the heap's sifts were most of this.
    let key = |busy: &[i64], h: usize| {
        let free = busy[h] / p.workers[h].max(1) as i64;
        Reverse((((free as u64 ^ (1 << 63)) as u128) << 64) | h as u128)
    };
    let rank_of = |k: u128| (k as u64) as usize;
    // The ranks by when they free up, first first (a binary heap: at thousands of ranks and a
    // hundred thousand pieces, an ordered set's updates were most of the planning time).
    let mut free_first: BinaryHeap<Reverse<u128>> = (0..ranks).map(|h| key(&busy, h)).collect();
    let mut keyed: Vec<(Reverse<i64>, u64, usize)> =
        (0..p.owner.len()).filter(|&i| p.pinned[i]).map(|i| (Reverse(p.decode_ns[i]), p.id[i], i)).collect();
    keyed.sort_unstable();
    let pieces: Vec<usize> = keyed.iter().map(|&(_, _, i)| i).collect();
    let mut taken = RanksTaken::new(p, &pieces);
    // Ranks taken off the heap while looking for one this sample has no piece on yet.
    let mut passed: Vec<usize> = Vec::new();
    // Each piece's decode time read beside it, in the order taken (read from the problem's
    // array, in that order, it was a cache miss a piece: a fifth of a plan of miradata_long).
    for (k, &(Reverse(decode_ns), _, i)) in keyed.iter().enumerate() {
        let mine = taken.of(k);
        let mut first = free_first.peek_mut().expect("at least one rank");
        let h = if !mine.contains(&rank_of(first.0)) {
            // The usual case: the rank that frees up first has no piece of this sample. Its key
            // grows in place (one sift instead of a pop and a push).
            let h = rank_of(first.0);
            busy[h] += decode_ns;
            *first = key(&busy, h);
            h
        } else {
            drop(first);
            passed.clear();
            let h = loop {
                match free_first.pop() {
                    Some(Reverse(k)) if mine.contains(&rank_of(k)) => passed.push(rank_of(k)),
                    Some(Reverse(k)) => break rank_of(k),
                    // Every rank holds a piece of it already: the one that frees up first.
                    None => break passed.remove(0),
                }
            };
            for &q in &passed {
                free_first.push(key(&busy, q));
            }
            busy[h] += decode_ns;
            free_first.push(key(&busy, h));
            h
        };
        decoder[i] = h as u32;
        taken.add(k, h);
    }
    decoder
}

/// The ranks each split sample's pieces were given so far, side by side in one array (a hash
/// map of lists per sample cost a quarter of a plan at a hundred thousand pieces).
struct RanksTaken {
    /// Per piece (in the order given): its sample's first slot in `ranks`.
    start: Vec<u32>,
    /// Per sample (dense, by first appearance): slots filled.
    filled: Vec<u32>,
    /// Per piece: its sample's dense index.
    group: Vec<u32>,
    ranks: Vec<usize>,
}

impl RanksTaken {
    /// For `pieces` (job indices), grouped by sample id.
    fn new(p: &Problem, pieces: &[usize]) -> RanksTaken {
        let mut dense: std::collections::HashMap<u64, u32, IdHash> =
            std::collections::HashMap::with_capacity_and_hasher(pieces.len(), IdHash);
        let group: Vec<u32> = pieces
            .iter()
            .map(|&i| {
                let next = dense.len() as u32;
                *dense.entry(p.id[i]).or_insert(next)
            })
            .collect();
        let mut first = vec![0u32; dense.len() + 1];
        for &g in &group {
            first[g as usize + 1] += 1;
        }
        for g in 1..first.len() {
            first[g] += first[g - 1];
        }
        let start = group.iter().map(|&g| first[g as usize]).collect();
        RanksTaken { start, filled: vec![0; dense.len()], group, ranks: vec![0; pieces.len()] }
    }

    /// The ranks given to the sample of piece `k` so far.
    fn of(&self, k: usize) -> &[usize] {
        let s = self.start[k] as usize;
        &self.ranks[s..s + self.filled[self.group[k] as usize] as usize]
    }

    /// Piece `k` went to rank `h`.
    fn add(&mut self, k: usize, h: usize) {
        let g = self.group[k] as usize;
        self.ranks[self.start[k] as usize + self.filled[g] as usize] = h;
        self.filled[g] += 1;
    }
}

/// Hashes a sample id by one multiplication (ids are already well spread; SipHash's resistance
/// to chosen keys buys nothing for a plan's own ids).
#[derive(Clone, Copy, Default)]
struct IdHash;

impl std::hash::BuildHasher for IdHash {
    type Hasher = IdHasher;
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

#[derive(Clone, Copy, Default)]
struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}
