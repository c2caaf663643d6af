//! Weighted mixtures of a dataset's groups: a video set, an image set and a text set drawn at
//! chosen rates, one of them up-sampled, as multimodal training mixes its data.
//!
//! ```
//! use datahelix::sampler::mix::{group_of, Mix};
//! use datahelix::sampler::Sampler;
//!
//! let mix: Mix = "video=3,image=1".parse().unwrap();
//! assert_eq!(mix.to_string(), "image=1,video=3");
//! assert_eq!(group_of("video/clips/0017.mp4"), "video");
//! assert_eq!(group_of("image/laion-000003.tar#0042.jpg@1536+20480"), "image");
//! let groups = vec![("image".to_string(), vec![1, 2]), ("video".to_string(), (10..16).collect())];
//! let s = Sampler::mixed(&mix, &groups, 7).unwrap();
//! // Every batch of 4 holds 3 videos and 1 image; the two images repeat every 8 positions,
//! // the six videos every 8 too.
//! for step in 0..10 {
//!     assert_eq!(s.global_batch(step, 4).iter().filter(|&&id| id < 10).count(), 1);
//! }
//! ```
//!
//! A sample's group is the first folder of its path in the dataset (a shard member's: of its
//! shard's path), `.` for a sample at the top ([`group_of`]); a mix names groups with positive
//! integer weights ([`Mix`]). Global-batch positions are dealt to the groups in blocks of
//! `Σ weights` positions, each group getting exactly its weight's positions in every block, spread
//! through the block by a smooth weighted round-robin (the same every block). Each group walks
//! its own orders: position `q` of group `g` is element `q mod n_g` of the protocol's order
//! ([`super::Sampler`]) of its ids for cycle `q div n_g`, under a seed of its own
//! (`splitmix64(seed XOR words_hash(name))`), so a group up-sampled past its size repeats its
//! samples in a new order each cycle, and one down-sampled reaches each sample once per its own
//! cycle. Position `p` needs no earlier position: a run resumed at any step, at any world size,
//! draws the batches of one that never stopped. Groups the mix does not name are left out.

use std::fmt;
use std::str::FromStr;

use super::{splitmix64, words_hash, Sampler};
use crate::shard::location::MemberPath;

/// The largest weight of one group.
pub const MAX_WEIGHT: u64 = 1000;

/// The most groups a mix names.
pub const MAX_GROUPS: usize = 64;

/// Groups and their integer weights, sorted by name and reduced by their greatest common divisor
/// (`video=6,image=2` is `image=1,video=3`). Written `name=weight,name=weight`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mix {
    weights: Vec<(String, u64)>,
}

impl Mix {
    /// The groups and weights, by name.
    pub fn weights(&self) -> &[(String, u64)] {
        &self.weights
    }
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(text: &str) -> Result<Mix, String> {
        let mut weights: Vec<(String, u64)> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not name=weight (e.g. video=3,image=1)"))?;
            let name = name.trim();
            if name.is_empty() || name.contains(['/', '=', '#']) {
                return Err(format!("{name:?} is not a group name (the first folder of the samples' paths)"));
            }
            let weight: u64 =
                weight.trim().parse().ok().filter(|w| (1..=MAX_WEIGHT).contains(w)).ok_or_else(|| {
                    format!(
                        "{part:?}: a weight is an integer from 1 to {MAX_WEIGHT} (write 0.6/0.4 as 3 and 2)"
                    )
                })?;
            if weights.iter().any(|(n, _)| n == name) {
                return Err(format!("group {name:?} is named twice"));
            }
            weights.push((name.to_owned(), weight));
        }
        if weights.is_empty() {
            return Err("a mix names at least one group: name=weight,name=weight".into());
        }
        if weights.len() > MAX_GROUPS {
            return Err(format!("{} groups: a mix names at most {MAX_GROUPS}", weights.len()));
        }
        weights.sort();
        let gcd = weights.iter().fold(0, |g, &(_, w)| gcd(g, w));
        for (_, w) in &mut weights {
            *w /= gcd;
        }
        Ok(Mix { weights })
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, w)) in self.weights.iter().enumerate() {
            write!(f, "{}{name}={w}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The group of a sample by its index path: the first folder of the path (of a shard member, of
/// its shard's path), `.` for a sample at the dataset's top.
pub fn group_of(path: &str) -> &str {
    let path = MemberPath::parse(path).map_or(path, |m| m.shard);
    path.split_once('/').map_or(".", |(first, _)| first)
}

/// The groups of `paths` (index paths, each with its id) with their ids, by name.
pub fn groups_of<'a>(samples: impl IntoIterator<Item = (u64, &'a str)>) -> Vec<(String, Vec<u64>)> {
    let mut by_name: std::collections::BTreeMap<&str, Vec<u64>> = std::collections::BTreeMap::new();
    for (id, path) in samples {
        by_name.entry(group_of(path)).or_default().push(id);
    }
    by_name.into_iter().map(|(name, ids)| (name.to_owned(), ids)).collect()
}

/// The drawing of a [`Mix`] over groups of ids ([`Sampler::mixed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mixture {
    /// Each group's weight, in the mix's order.
    weights: Vec<u64>,
    /// The group of each position of a block.
    pattern: Vec<u32>,
    /// For each position of a block, the positions of its group earlier in the block.
    before: Vec<u32>,
    /// Each group's own orders.
    groups: Vec<Sampler>,
}

impl Mixture {
    /// The mixture of `mix` over `groups` (name, ids); an error naming a group the mix names and
    /// the dataset does not hold, with the groups it does.
    pub(super) fn new(mix: &Mix, groups: &[(String, Vec<u64>)], seed: u64) -> Result<Mixture, String> {
        let mut samplers = Vec::with_capacity(mix.weights.len());
        for (name, _) in &mix.weights {
            match groups.iter().find(|(n, ids)| n == name && !ids.is_empty()) {
                Some((_, ids)) => {
                    samplers.push(Sampler::new(ids, splitmix64(seed ^ words_hash(name.as_bytes()))))
                }
                None => {
                    let held: Vec<String> =
                        groups.iter().map(|(n, ids)| format!("{n} ({} samples)", ids.len())).collect();
                    return Err(format!(
                        "the mix names group {name:?}, which holds no samples; the dataset's groups (the first \
                         folders of its samples' paths) are: {}",
                        held.join(", ")
                    ));
                }
            }
        }
        let weights: Vec<u64> = mix.weights.iter().map(|(_, w)| *w).collect();
        let total: u64 = weights.iter().sum();
        // Smooth weighted round-robin: each position goes to the group furthest behind its share.
        let mut credit = vec![0i64; weights.len()];
        let mut dealt = vec![0u32; weights.len()];
        let (mut pattern, mut before) =
            (Vec::with_capacity(total as usize), Vec::with_capacity(total as usize));
        for _ in 0..total {
            for (c, w) in credit.iter_mut().zip(&weights) {
                *c += *w as i64;
            }
            let g = (0..weights.len()).max_by_key(|&g| (credit[g], std::cmp::Reverse(g))).expect("a group");
            credit[g] -= total as i64;
            pattern.push(g as u32);
            before.push(dealt[g]);
            dealt[g] += 1;
        }
        Ok(Mixture { weights, pattern, before, groups: samplers })
    }

    /// The id at global position `p`.
    pub(super) fn at(&self, p: u64) -> u64 {
        let block_len = self.pattern.len() as u64;
        let (block, offset) = (p / block_len, (p % block_len) as usize);
        let g = self.pattern[offset] as usize;
        self.groups[g].at(block * self.weights[g] + self.before[offset] as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<(String, Vec<u64>)> {
        vec![
            ("image".into(), (0..5).collect()),
            ("text".into(), (100..103).collect()),
            ("video".into(), (1000..1040).collect()),
        ]
    }

    #[test]
    fn mixes_parse_to_one_form() {
        let m: Mix = " video=6, image=2 ,".parse().unwrap();
        assert_eq!(m.to_string(), "image=1,video=3");
        for bad in ["", "video", "video=0", "video=1001", "video=0.6", "a/b=1", "v=1,v=2", "=3"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad:?}");
        }
    }

    /// Every block of Σw positions holds each group exactly its weight's times; each group runs
    /// through all its ids before it repeats one; and any position is the same asked alone.
    #[test]
    fn each_block_holds_each_group_by_weight_and_each_group_cycles_its_ids() {
        let mix: Mix = "video=5,image=2,text=1".parse().unwrap();
        let s = Sampler::mixed(&mix, &groups(), 11).unwrap();
        let drawn = s.global_batch(0, 8 * 40);
        let group = |id: u64| match id {
            0..100 => 0,
            100..1000 => 1,
            _ => 2,
        };
        for block in drawn.chunks(8) {
            let mut count = [0; 3];
            block.iter().for_each(|&id| count[group(id)] += 1);
            assert_eq!(count, [2, 1, 5], "{block:?}");
        }
        for (g, (_, ids)) in groups().iter().enumerate() {
            let seq: Vec<u64> = drawn.iter().copied().filter(|&id| group(id) == g).collect();
            for cycle in seq.chunks(ids.len()).filter(|c| c.len() == ids.len()) {
                let mut c = cycle.to_vec();
                c.sort_unstable();
                assert_eq!(&c, ids, "group {g}: a cycle is a permutation of its ids");
            }
            let n = ids.len();
            if seq.len() >= 2 * n {
                assert_ne!(seq[..n], seq[n..2 * n], "group {g}: a new order every cycle");
            }
        }
        let again = Sampler::mixed(&mix, &groups(), 11).unwrap();
        assert_eq!(again.global_batch(37, 3), drawn[111..114]);
        assert_ne!(Sampler::mixed(&mix, &groups(), 12).unwrap().global_batch(0, 40), drawn[..40]);
        // Groups the mix does not name are left out; the nominal epoch is the named groups' size.
        let only: Mix = "video=1,text=1".parse().unwrap();
        let s = Sampler::mixed(&only, &groups(), 11).unwrap();
        assert!(s.global_batch(0, 200).iter().all(|&id| group(id) != 0));
        assert_eq!(s.len(), 43);
    }

    #[test]
    fn a_group_the_dataset_lacks_is_named_with_the_groups_it_has() {
        let e = Sampler::mixed(&"audio=1".parse().unwrap(), &groups(), 1).unwrap_err();
        assert!(e.contains("\"audio\"") && e.contains("video (40 samples)"), "{e}");
    }

    #[test]
    fn groups_are_first_folders_of_paths_and_shards() {
        let samples = [
            (1, "a/x.mp4"),
            (2, "b/c/y.mp4"),
            (3, "z.mp4"),
            (4, "s.tar#a/m.mp4@0+1"),
            (5, "a/s.zip#m.mp4@0+1"),
        ];
        let g = groups_of(samples);
        assert_eq!(
            g,
            vec![(".".to_owned(), vec![3, 4]), ("a".to_owned(), vec![1, 5]), ("b".to_owned(), vec![2])]
        );
    }
}
