//! The protocol's sampler (`shared/bench/PROTOCOL.md` v1.3, "Sampler"): which sample ids form the
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
//! // Position 5 is the first of epoch 1, which has an order of its own.
//! assert_eq!(sampler.global_batch(5, 1)[0], sampler.epoch_order(1)[0]);
//! ```
//!
//! A [`mix::Mix`] draws the batches from a dataset's groups at chosen rates instead
//! ([`Sampler::mixed`]): outside the protocol, which draws uniformly.
//!
//! Every policy sees the same global batches; policies change only how a batch is split across
//! ranks and where its samples are decoded. The batches depend only on the ids, the seed and the
//! step, so a run resumed at step s (at any world size) continues with the batches of a run that
//! never stopped.

pub mod mix;

use std::sync::{Arc, Mutex, PoisonError};

/// The sampler's protocol version, as `train` results carry it.
pub const PROTOCOL: &str = "1.3";

/// The protocol's mixing function (Steele, Lea and Flood's SplitMix64 finaliser), all mod 2^64.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash of `bytes` built on [`splitmix64`], eight bytes at a time (an index of a million
/// samples is hundreds of MiB): dataset fingerprints and state checksums. Not a defence against
/// deliberate collisions.
pub fn words_hash(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    let mut h = splitmix64(bytes.len() as u64);
    for c in &mut chunks {
        h = splitmix64(h ^ u64::from_le_bytes(c.try_into().expect("8 bytes")));
    }
    let mut tail = [0u8; 8];
    tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    splitmix64(h ^ u64::from_le_bytes(tail))
}

/// The epoch that global-batch position `position` lies in, for a dataset of `samples` ids
/// (0 for an empty one).
pub fn epoch_of(position: u64, samples: u64) -> u64 {
    position.checked_div(samples).unwrap_or(0)
}

/// The seed of epoch `e`: the run's seed for epoch 0, `splitmix64(seed + e)` after (v1.3).
pub fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    if epoch == 0 {
        seed
    } else {
        splitmix64(seed.wrapping_add(epoch))
    }
}

/// `ids` ordered by `(splitmix64(seed XOR id), id)`.
fn ordered(ids: &[u64], seed: u64) -> Arc<[u64]> {
    let mut keyed: Vec<(u64, u64)> = ids.iter().map(|&id| (splitmix64(seed ^ id), id)).collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, id)| id).collect()
}

/// The epoch orders of a dataset's ids for a seed.
///
/// Epoch 0's order is computed once; a later epoch's when first asked for (the most recent one is
/// kept). Clones share the orders.
#[derive(Debug)]
pub struct Sampler {
    seed: u64,
    /// Epoch 0's order.
    first: Arc<[u64]>,
    /// The last later epoch asked for, and its order.
    recent: Mutex<Option<(u64, Arc<[u64]>)>>,
    /// The weighted mixture of groups the batches are drawn from, if any ([`Sampler::mixed`]).
    mixture: Option<Arc<mix::Mixture>>,
}

impl Clone for Sampler {
    fn clone(&self) -> Sampler {
        Sampler {
            seed: self.seed,
            first: self.first.clone(),
            recent: Mutex::new(self.recent_order()),
            mixture: self.mixture.clone(),
        }
    }
}

impl PartialEq for Sampler {
    fn eq(&self, other: &Sampler) -> bool {
        self.seed == other.seed && self.first == other.first && self.mixture == other.mixture
    }
}

impl Eq for Sampler {}

impl Sampler {
    /// The sampler of `ids` (in any order; duplicates are kept) under `seed`.
    pub fn new(ids: &[u64], seed: u64) -> Sampler {
        Sampler { seed, first: ordered(ids, seed), recent: Mutex::new(None), mixture: None }
    }

    /// The sampler drawing from the groups `groups` (name, ids) as `mix` weights them
    /// ([`mix`]); an error naming a group of the mix that `groups` lacks. Its epoch (its
    /// [`Sampler::len`]) is the named groups' samples, nominally: each group cycles on its own.
    pub fn mixed(mix: &mix::Mix, groups: &[(String, Vec<u64>)], seed: u64) -> Result<Sampler, String> {
        let mixture = mix::Mixture::new(mix, groups, seed)?;
        let named: Vec<u64> = groups
            .iter()
            .filter(|(name, _)| mix.weights().iter().any(|(n, _)| n == name))
            .flat_map(|(_, ids)| ids.iter().copied())
            .collect();
        Ok(Sampler { mixture: Some(Arc::new(mixture)), ..Sampler::new(&named, seed) })
    }

    /// The id at global-batch position `p` of the uniform draw: element `p mod N` of epoch
    /// `p div N`'s order (the dataset must not be empty).
    fn at(&self, p: u64) -> u64 {
        let n = self.first.len() as u64;
        self.epoch_order(p / n)[(p % n) as usize]
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Epoch 0's order.
    pub fn order(&self) -> &[u64] {
        &self.first
    }

    /// The order of epoch `epoch`.
    pub fn epoch_order(&self, epoch: u64) -> Arc<[u64]> {
        if epoch == 0 {
            return self.first.clone();
        }
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, order)) = recent.as_ref().filter(|(e, _)| *e == epoch) {
            return order.clone();
        }
        let order = ordered(&self.first, epoch_seed(self.seed, epoch));
        *recent = Some((epoch, order.clone()));
        order
    }

    fn recent_order(&self) -> Option<(u64, Arc<[u64]>)> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Number of ids (an epoch's length).
    pub fn len(&self) -> usize {
        self.first.len()
    }

    /// True when there are no ids.
    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// The epoch that global-batch position `position` lies in.
    pub fn epoch_of(&self, position: u64) -> u64 {
        epoch_of(position, self.first.len() as u64)
    }

    /// The global batch of `step`: positions `step·G .. step·G + G − 1`, position p taking element
    /// `p mod N` of epoch `p div N`'s order. Empty when the dataset is.
    /// With a mixture, position p is drawn from the groups instead ([`mix`]).
    pub fn global_batch(&self, step: u64, global_batch: usize) -> Vec<u64> {
        let n = self.first.len() as u64;
        if n == 0 {
            return Vec::new();
        }
        let start = step.wrapping_mul(global_batch as u64);
        if let Some(m) = &self.mixture {
            return (0..global_batch as u64).map(|k| m.at(start.wrapping_add(k))).collect();
        }
        let mut batch = Vec::with_capacity(global_batch);
        let mut epoch = u64::MAX;
        let mut order = self.first.clone();
        for p in (0..global_batch as u64).map(|k| start.wrapping_add(k)) {
            if p / n != epoch {
                epoch = p / n;
                order = self.epoch_order(epoch);
            }
            batch.push(order[(p % n) as usize]);
        }
        batch
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
    fn words_hash_sees_every_byte() {
        let data: Vec<u8> = (0..100u8).collect();
        let h = words_hash(&data);
        for i in [0, 7, 8, 95, 99] {
            let mut d = data.clone();
            d[i] ^= 1;
            assert_ne!(words_hash(&d), h, "byte {i}");
        }
        assert_ne!(words_hash(&data[..99]), h, "length");
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
    fn batches_tile_the_order_and_wrap_into_the_next_epoch() {
        let ids: Vec<u64> = (100..110).collect();
        let s = Sampler::new(&ids, 9);
        let b0 = s.global_batch(0, 4);
        let b1 = s.global_batch(1, 4);
        let b2 = s.global_batch(2, 4);
        let e1 = s.epoch_order(1);
        assert_eq!(&b0[..], &s.order()[0..4]);
        assert_eq!(&b1[..], &s.order()[4..8]);
        assert_eq!(&b2[..], &[s.order()[8], s.order()[9], e1[0], e1[1]]);
        assert!(Sampler::new(&[], 1).global_batch(3, 4).is_empty());
    }

    #[test]
    fn every_epoch_visits_each_id_once_in_a_new_order() {
        let ids: Vec<u64> = (0..1000).map(|i| i * 7 + 3).collect();
        let s = Sampler::new(&ids, 42);
        let mut seen = Vec::new();
        for e in 0..4u64 {
            let order = s.epoch_order(e);
            let mut want = ids.clone();
            want.sort_by_key(|&id| (splitmix64(epoch_seed(42, e) ^ id), id));
            assert_eq!(&order[..], &want[..], "epoch {e}");
            let mut sorted = order.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, ids, "epoch {e} is a permutation");
            assert!(!seen.contains(&order.to_vec()), "epoch {e} repeats an earlier order");
            seen.push(order.to_vec());
        }
        assert_eq!(epoch_seed(42, 0), 42);
        assert_eq!(epoch_seed(42, 3), splitmix64(45));
        // Batches of 300 over 1000 ids: step 3 holds positions 900..1200 (epoch 0 then epoch 1).
        let b = s.global_batch(3, 300);
        assert_eq!(&b[..100], &s.order()[900..]);
        assert_eq!(&b[100..], &s.epoch_order(1)[..200]);
        // Asking for epochs out of order gives the same answers (the cache is only a cache).
        let again = s.clone();
        assert_eq!(again.global_batch(7, 300), s.global_batch(7, 300));
        assert_eq!(s.epoch_order(2), again.epoch_order(2));
        assert_eq!(s.epoch_of(999), 0);
        assert_eq!(s.epoch_of(1000), 1);
    }

    #[test]
    fn a_batch_larger_than_the_dataset_spans_epochs() {
        let s = Sampler::new(&[1, 2, 3], 5);
        let b = s.global_batch(1, 7); // positions 7..14: epochs 2, 3 and 4
        assert_eq!(b.len(), 7);
        assert_eq!(b[0], s.epoch_order(2)[1]);
        assert_eq!(b[2], s.epoch_order(3)[0]);
        assert_eq!(b[6], s.epoch_order(4)[1]);
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
