//! The protocol's sampler (`shared/bench/PROTOCOL.md`, "Sampler"): which sample ids form the
//! global batch of each step, and the rank-local (DistributedSampler) split of a batch.
//!
//! ```
//! use datahelix::sampler::{rank_local_split, Sampler};
//!
//! let sampler = Sampler::new(&[10, 11, 12, 13, 14], 7);
//! let batch = sampler.global_batch(0, 4);
//! assert_eq!(batch.len(), 4);
//! // Rank 1 of 2 takes positions 1 and 3 of the global batch.
//! assert_eq!(rank_local_split(&batch, 1, 2), vec![batch[1], batch[3]]);
//! // A run longer than the dataset wraps around the same order.
//! assert_eq!(sampler.global_batch(5, 4)[0], sampler.order()[(5 * 4) % 5]);
//! ```
//!
//! Every policy sees the same global batches; policies change only how a batch is split across
//! ranks and where its samples are decoded.

/// The protocol's mixing function (Steele, Lea and Flood's SplitMix64 finaliser), all mod 2^64.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The epoch order of a dataset's ids for a seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sampler {
    order: Vec<u64>,
}

impl Sampler {
    /// Orders `ids` by `(splitmix64(seed XOR id), id)`.
    pub fn new(ids: &[u64], seed: u64) -> Sampler {
        let mut keyed: Vec<(u64, u64)> = ids.iter().map(|&id| (splitmix64(seed ^ id), id)).collect();
        keyed.sort_unstable();
        Sampler { order: keyed.into_iter().map(|(_, id)| id).collect() }
    }

    /// The ordered ids.
    pub fn order(&self) -> &[u64] {
        &self.order
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when there are no ids.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The global batch of `step`: positions `step·G .. step·G + G − 1`, position p taking
    /// `order[p mod N]`. Empty when the dataset is.
    pub fn global_batch(&self, step: u64, global_batch: usize) -> Vec<u64> {
        let n = self.order.len() as u64;
        if n == 0 {
            return Vec::new();
        }
        let g = global_batch as u64;
        (0..g).map(|k| self.order[(step.wrapping_mul(g).wrapping_add(k) % n) as usize]).collect()
    }
}

/// DistributedSampler semantics: rank `r` of `ranks` takes positions r, r+R, r+2R, … of the batch.
pub fn rank_local_split(batch: &[u64], rank: usize, ranks: usize) -> Vec<u64> {
    if ranks == 0 {
        return Vec::new();
    }
    batch.iter().skip(rank).step_by(ranks).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_known_values() {
        // Reference values of SplitMix64 (Vigna's splitmix64.c, first outputs from state 0 and 1).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(splitmix64(1), 0x910A_2DEC_8902_5CC1);
    }

    #[test]
    fn order_is_by_mixed_key_then_id() {
        let ids = [5u64, 1, u64::MAX, 0, 42];
        let s = Sampler::new(&ids, 3);
        let mut expect = ids.to_vec();
        expect.sort_by_key(|&id| (splitmix64(3 ^ id), id));
        assert_eq!(s.order(), expect.as_slice());
        // Another seed, another order (for these ids).
        assert_ne!(Sampler::new(&ids, 4).order(), s.order());
        // Input order does not matter.
        let mut rev = ids.to_vec();
        rev.reverse();
        assert_eq!(Sampler::new(&rev, 3), s);
    }

    #[test]
    fn batches_tile_the_order_and_wrap() {
        let ids: Vec<u64> = (100..110).collect();
        let s = Sampler::new(&ids, 9);
        let b0 = s.global_batch(0, 4);
        let b1 = s.global_batch(1, 4);
        let b2 = s.global_batch(2, 4);
        assert_eq!(&b0[..], &s.order()[0..4]);
        assert_eq!(&b1[..], &s.order()[4..8]);
        assert_eq!(&b2[..], &[s.order()[8], s.order()[9], s.order()[0], s.order()[1]]);
        assert!(Sampler::new(&[], 1).global_batch(3, 4).is_empty());
    }

    #[test]
    fn rank_split_is_strided_and_exact() {
        let batch: Vec<u64> = (0..10).collect();
        assert_eq!(rank_local_split(&batch, 0, 3), vec![0, 3, 6, 9]);
        assert_eq!(rank_local_split(&batch, 2, 3), vec![2, 5, 8]);
        let mut all: Vec<u64> = (0..3).flat_map(|r| rank_local_split(&batch, r, 3)).collect();
        all.sort();
        assert_eq!(all, batch);
    }
}
