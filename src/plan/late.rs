//! Which ranks a step leaves waiting for their input, when some rank must wait whatever the
//! schedule: without making the step longer than its balanced split, the planner puts the wait
//! on as few ranks as it can, the last ones ([`crate::plan::Plan::late_ranks`]), and then ends
//! the step as soon as that many allow. The other ranks' batches are then ready when they ask,
//! and the pieces decoded for the waiting ranks reach them after the step's collection
//! (`crate::step`, "A late rank").
//!
//! Two causes, two rules:
//!
//! - **Chains** ([`group_late`]): a sample whose longest run of frames decoded in order (from a
//!   keyframe to its last target: its piece's decode on one worker) outlasts the time until its
//!   batch is due is late wherever it is decoded. Spread over the ranks by accelerator balance
//!   alone, such samples hold nearly every rank's batch (camera originals: 4K clips whose
//!   targets sit ~250 frames past their keyframes, 6–8 s of decoding begun two steps ahead).
//!   Grouped on the last ranks, in order of their chains, they hold only those. Where decode
//!   work is placed within groups of ranks (`crate::plan::groups`, from 1024 ranks), each
//!   group's late samples wait on the group's own last ranks (`group_late_within`): grouped
//!   over the whole step instead, the groups of late ranks trained up to 5/2 of their share of
//!   the step and their CPUs had its decode work to do alone (egoexo4d-4k at 4096 ranks, 12
//!   steps: 5814 samples/s at 0.590 of the bound, 0.286 of rank-steps missed; without late
//!   ranks 8365, 0.848, 0.287; grouped within groups 8033, 0.815, 0.186).
//! - **The CPUs' pace** (`falls_short`): a step whose decode work the CPUs take longer over
//!   than any split keeps an accelerator busy leaves its most loaded rank waiting; it becomes
//!   the last rank (`as_last_rank`) and its decode jobs queue behind the next step's.
//!
//! ```
//! use datahelix::plan::batching::Items;
//! use datahelix::plan::late::group_late;
//!
//! // Four ranks, eight samples of equal accelerator work (1): four are ready at once, four
//! // only 10 after their batch is due (the deadline: 5).
//! let (weight, id) = ([1u64; 8], [0, 1, 2, 3, 4, 5, 6, 7]);
//! let items = Items { weight: &weight, mem: &[0; 8], id: &id };
//! let release = [0, 10, 0, 10, 0, 10, 0, 10];
//! // Balanced two a rank, one slow sample each: every rank waits.
//! let mut owner = vec![0, 0, 1, 1, 2, 2, 3, 3];
//! let late = group_late(&items, &release, 5, 0, 0, &[0; 4], &mut owner);
//! // Grouped: the slow samples on the last two ranks, which still end at 12 as before.
//! assert_eq!(late, Some(2));
//! assert_eq!(owner.iter().filter(|&&o| o >= 2).count(), 4);
//! assert!((0..8).filter(|&i| release[i] > 5).all(|i| owner[i] >= 2));
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::batching::{self, Items};
use super::groups::Groups;
use super::{ns, PieceIn, PlanInput};

/// How far short of the CPUs' pace a stretched step's most loaded rank must stay for the step
/// to get a late rank: below this share of it. Nearer the pace the wait left is short and
/// spread over every rank costs little; a late rank then only delays the batch it holds (the
/// suite's workloads reach 0.94–1.0 of the pace where they fall short; the CPU-bound
/// validation data at 4 ranks 0.02–0.76, median 0.48).
pub const LATE_BELOW_PACE: f64 = 0.75;

/// Bisection steps of [`group_late`]'s search for the soonest step end (its precision: 2⁻²⁰
/// of the interval searched).
const SEARCH_STEPS: u32 = 20;

/// The most accelerator work a late rank may take, as a fraction (numerator, denominator) of
/// the balanced split's busiest rank. Chains are predictions: on the camera originals they err
/// by a fifth or more, and a rank filled to the step's end on the strength of a short predicted
/// chain ends past it when the chain runs long; a rank allowed more holds more late samples, and
/// fewer ranks wait. egoexo4d-4k at 64 ranks (its file's budget): 0.843 of the bound and 0.506
/// of rank-steps missed before grouping; grouped with a cap of 3, 0.733 and 0.170; of 2, 0.775
/// and 0.192; of 1.5, 0.809 and 0.296 (and at 8 ranks above rank-local's misses). At 512 ranks
/// (X = 0.5, 0.75, 1.0, 1.25; rank-local 0.156) a cap of 2 left 0.146, 0.161, 0.146 and 0.176
/// of rank-steps missed at 0.77–0.78 of the bound; 5/2 leaves 0.155, 0.138, 0.145 and 0.145 at
/// 0.75 of it (3% less throughput); 3 leaves 0.143 at 0.71 (X = 0.75). At 64 ranks 5/2 costs 2%
/// (misses 0.167–0.200, rank-local 0.227); at 8 ranks it changes nothing.
const LATE_LOAD_CAP: (i64, i64) = (5, 2);

/// The rank a stretched step leaves waiting for its input: the most loaded (lowest index among
/// equals) when even its load stays below [`LATE_BELOW_PACE`] of `target`, the CPUs' pace less
/// the accelerator's constant; `None` when the stretch came that close, or the step carries no
/// accelerator work the model knows of.
pub(crate) fn falls_short(items: &Items, split: &[u32], ranks: usize, target: u64) -> Option<u32> {
    let loads = batching::loads(items, split, ranks);
    let top = (0..ranks).fold(0, |a, q| if loads[q] > loads[a] { q } else { a });
    let short = loads[top] > 0 && (loads[top] as f64) < LATE_BELOW_PACE * target as f64;
    (ranks > 1 && short).then_some(top as u32)
}

/// Hands rank `top`'s batch to the last rank and the last rank's to `top` (where their memory
/// caps are the same) and returns the rank that trains it. A late step's waiting rank is then
/// the same every time: the rank that waited last step is the one whose decodes are behind,
/// and the others' stay a step ahead (validation data at 4 ranks under a 100-ms CPU quota,
/// simulated with a first version of late ranks: 0.386 of rank-steps missed with the stretched
/// rank late wherever the split put it, 0.333 with it on the last rank).
pub(crate) fn as_last_rank(split: &mut [u32], used: &mut [u64], caps: &[u64], top: u32) -> u32 {
    let last = (used.len() - 1) as u32;
    if caps[top as usize] != caps[last as usize] {
        return top;
    }
    for o in split.iter_mut() {
        if *o == top {
            *o = last;
        } else if *o == last {
            *o = top;
        }
    }
    used.swap(top as usize, last as usize);
    last
}

/// Each sample's earliest decode end from now, ns: its longest piece on one worker, or its
/// whole decode when it is not split.
pub(crate) fn chains(input: &PlanInput, pieces: &[PieceIn]) -> Vec<i64> {
    let mut chain: Vec<i64> = input.samples.iter().map(|s| ns(s.decode_s)).collect();
    let mut seen = vec![false; chain.len()];
    for pc in pieces {
        let i = pc.sample as usize;
        let d = ns(pc.decode_s);
        chain[i] = if seen[i] { chain[i].max(d) } else { d };
        seen[i] = true;
    }
    chain
}

/// Groups a step's unavoidably late samples on its last ranks. `release[i]` is the earliest
/// item `i` can be decoded (its longest chain, ns from now), `due` when every rank's batch is
/// due, `c0` the accelerator's constant; a rank ends at `max(due, its latest release) + c0 +`
/// its load. Items released more than `tolerance` past `due` are late wherever they go.
///
/// The late items, latest first, fill the last ranks one after another, each rank while it
/// still ends by a step end `T` and carries at most 5/2 of the busiest load of `owner`'s split
/// (`LATE_LOAD_CAP`); the others go by weight (heaviest first, to the rank with the most
/// room) to the on-time ranks and what the late ranks leave. At `T` = the end of `owner`'s
/// split, that leaves the fewest late ranks this filling finds without lengthening the step;
/// then a bisection finds the soonest `T` that keeps that many. Replaces `owner` with that split
/// and returns how many ranks it leaves late, when that is fewer than `owner`'s split leaves or
/// the step ends sooner; `None` (nothing changed) when no item is late, a memory cap is set
/// (caps are not modelled here), or nothing fits.
pub fn group_late(
    items: &Items,
    release: &[i64],
    due: i64,
    c0: u64,
    tolerance: i64,
    caps: &[u64],
    owner: &mut [u32],
) -> Option<u32> {
    group_late_with(items, release, due, c0, tolerance, caps, owner, &mut Buffers::default())
}

/// Room for [`group_late_with`]'s working lists, kept from one call to the next (one a group).
#[derive(Default)]
struct Buffers {
    start: Vec<i64>,
    load: Vec<i64>,
    late: Vec<usize>,
    on_time: Vec<usize>,
    best: Vec<u32>,
    probe: Vec<u32>,
    fill: FillBuffers,
}

/// [`Filling::fill`]'s working lists.
#[derive(Default)]
struct FillBuffers {
    room: Vec<i64>,
    heap: BinaryHeap<(i64, Reverse<usize>)>,
    trains: Vec<bool>,
}

/// [`group_late`] in `buffers`' room.
#[allow(clippy::too_many_arguments)]
fn group_late_with(
    items: &Items,
    release: &[i64],
    due: i64,
    c0: u64,
    tolerance: i64,
    caps: &[u64],
    owner: &mut [u32],
    buffers: &mut Buffers,
) -> Option<u32> {
    let ranks = caps.len();
    let n = items.weight.len();
    let late_after = due.saturating_add(tolerance);
    if ranks < 2 || n < ranks || caps.iter().any(|&c| c != 0) || !release.iter().any(|&c| c > late_after) {
        return None;
    }
    let c0 = c0 as i64;
    let weight = |i: usize| items.weight[i] as i64;
    // The split as it is: its end, how many ranks it leaves late, its busiest rank's load.
    let Buffers { start, load, late, on_time, best, probe, fill: fill_buffers } = buffers;
    start.clear();
    start.resize(ranks, due);
    load.clear();
    load.resize(ranks, 0);
    for i in 0..n {
        let q = owner[i] as usize;
        start[q] = start[q].max(release[i]);
        load[q] += weight(i);
    }
    let before_end = (0..ranks).map(|q| start[q] + c0 + load[q]).max().unwrap_or(0);
    let before_late = (0..ranks).filter(|&q| start[q] > late_after).count() as u32;
    late.clear();
    late.extend((0..n).filter(|&i| release[i] > late_after));
    late.sort_unstable_by_key(|&i| (Reverse(release[i]), items.id[i], i));
    on_time.clear();
    on_time.extend((0..n).filter(|&i| release[i] <= late_after));
    on_time.sort_unstable_by_key(|&i| (Reverse(items.weight[i]), items.id[i], i));
    let filling = Filling {
        late,
        on_time,
        release,
        weight: items.weight,
        due,
        c0,
        ranks,
        most: load.iter().copied().max().unwrap_or(0).saturating_mul(LATE_LOAD_CAP.0) / LATE_LOAD_CAP.1,
    };
    let fewest = filling.fill(before_end, best, fill_buffers)?;
    let mut lo = late.iter().map(|&i| release[i] + c0 + weight(i)).max().unwrap_or(0).min(before_end);
    let mut hi = before_end;
    for _ in 0..SEARCH_STEPS {
        if hi - lo <= 1 {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if filling.fill(mid, probe, fill_buffers).is_some_and(|m| m <= fewest) {
            hi = mid;
            std::mem::swap(best, probe);
        } else {
            lo = mid;
        }
    }
    if fewest >= before_late && hi >= before_end {
        return None;
    }
    owner.copy_from_slice(best);
    Some(fewest)
}

/// [`group_late`] within each placement group ([`Groups`]): each group's late samples wait on
/// the group's own last ranks, so that no group's ranks train (and its CPUs decode) more of the
/// step than the balanced split gave the group. Returns the late ranks, ascending; `owner` is
/// changed only in the groups that get late ranks. At 4096 ranks (512 groups of 64 samples,
/// the camera originals) ~6 ms of a plan, ~0.01 ms where no sample is late.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_late_within(
    items: &Items,
    release: &[i64],
    due: i64,
    c0: u64,
    tolerance: i64,
    caps: &[u64],
    owner: &mut [u32],
    groups: &Groups,
) -> Vec<u32> {
    // What `group_late` would refuse in every group: nothing late, or memory caps.
    let late_after = due.saturating_add(tolerance);
    if caps.iter().any(|&c| c != 0) || !release.iter().any(|&c| c > late_after) {
        return Vec::new();
    }
    let mut of_group: Vec<Vec<usize>> = vec![Vec::new(); groups.members.len()];
    for (j, &q) in owner.iter().enumerate() {
        of_group[groups.of[q as usize] as usize].push(j);
    }
    let mut late = Vec::new();
    let mut buffers = Buffers::default();
    let (mut weight, mut id, mut group_release, mut local) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let no_caps = vec![0u64; groups.members.iter().map(Vec::len).max().unwrap_or(0)];
    for (js, members) in of_group.iter().zip(&groups.members) {
        weight.clear();
        weight.extend(js.iter().map(|&j| items.weight[j]));
        id.clear();
        id.extend(js.iter().map(|&j| items.id[j]));
        group_release.clear();
        group_release.extend(js.iter().map(|&j| release[j]));
        local.clear();
        local.extend(
            js.iter().map(|&j| members.binary_search(&owner[j]).expect("an owner is in its group") as u32),
        );
        let group_items = Items { weight: &weight, mem: &[], id: &id };
        let caps = &no_caps[..members.len()];
        let found =
            group_late_with(&group_items, &group_release, due, c0, tolerance, caps, &mut local, &mut buffers);
        if let Some(m) = found {
            for (&j, &l) in js.iter().zip(&local) {
                owner[j] = members[l as usize];
            }
            late.extend_from_slice(&members[members.len() - m as usize..]);
        }
    }
    late.sort_unstable();
    late
}

/// What [`group_late`] fills ranks with, sorted: the late items (latest release first) and the
/// on-time ones (heaviest first).
struct Filling<'a> {
    late: &'a [usize],
    on_time: &'a [usize],
    release: &'a [i64],
    weight: &'a [u64],
    due: i64,
    c0: i64,
    ranks: usize,
    /// The most load a late rank takes.
    most: i64,
}

impl Filling<'_> {
    /// The split at step end `end` in `out` and how many ranks it leaves late; `None` when
    /// something does not fit or an on-time rank would train nothing.
    fn fill(&self, end: i64, out: &mut Vec<u32>, buffers: &mut FillBuffers) -> Option<u32> {
        let (ranks, w) = (self.ranks, |i: usize| self.weight[i] as i64);
        let FillBuffers { room, heap, trains } = buffers;
        out.clear();
        out.resize(self.release.len(), u32::MAX);
        // Late ranks from the last one down: each opened by the latest item left, filled while
        // it still ends by `end` (later items are released no later than its first).
        room.clear();
        for &i in self.late {
            if room.last().is_none_or(|&r| r < w(i)) {
                let r = (end - self.release[i] - self.c0).min(self.most);
                if r < w(i) || room.len() == ranks {
                    return None;
                }
                room.push(r);
            }
            let k = room.len() - 1;
            room[k] -= w(i);
            out[i] = (ranks - 1 - k) as u32;
        }
        let m = room.len();
        // On-time items, heaviest first, to the rank with the most room: the on-time ranks,
        // then what the late ranks leave.
        let on_room = end - self.due - self.c0;
        heap.clear();
        heap.extend((0..ranks - m).map(|q| (on_room, Reverse(q))));
        heap.extend((0..m).map(|k| (room[k], Reverse(ranks - 1 - k))));
        for &i in self.on_time {
            let (r, Reverse(q)) = heap.pop()?;
            if r < w(i) {
                return None;
            }
            out[i] = q as u32;
            heap.push((r - w(i), Reverse(q)));
        }
        // An on-time rank left with nothing would hold an empty batch: not taken.
        trains.clear();
        trains.resize(ranks, false);
        for &o in out.iter() {
            trains[o as usize] = true;
        }
        trains.iter().all(|&t| t).then_some(m as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items<'a>(weight: &'a [u64], id: &'a [u64]) -> Items<'a> {
        Items { weight, mem: &[], id }
    }

    #[test]
    fn nothing_late_or_a_cap_changes_nothing() {
        let (weight, id) = ([1u64; 4], [0, 1, 2, 3]);
        let mut owner = vec![0, 1, 0, 1];
        assert_eq!(group_late(&items(&weight, &id), &[0, 1, 2, 3], 3, 0, 0, &[0; 2], &mut owner), None);
        assert_eq!(group_late(&items(&weight, &id), &[0, 9, 0, 9], 3, 0, 0, &[1, 1], &mut owner), None);
        assert_eq!(owner, vec![0, 1, 0, 1]);
    }

    #[test]
    fn the_latest_sample_gets_the_least_work_and_the_step_ends_sooner() {
        // Two ranks: one sample released at 10 (deadline 0), three ready; weights 1, 2, 2, 2.
        // Balanced, the late sample shares a rank with a weight-2 sample: that rank ends at 13.
        // Alone on its rank it ends at 11, and the other rank at 6.
        let (weight, id) = ([1u64, 2, 2, 2], [0, 1, 2, 3]);
        let release = [10, 0, 0, 0];
        let mut owner = vec![0, 0, 1, 1];
        let late = group_late(&items(&weight, &id), &release, 0, 0, 0, &[0; 2], &mut owner);
        assert_eq!(late, Some(1));
        assert_eq!(owner, vec![1, 0, 0, 0]);
    }

    #[test]
    fn every_rank_keeps_a_sample_and_no_split_ends_later() {
        // Eight ranks, 64 samples of mixed chains (a camera-originals step): the grouped split
        // ends no later than the balanced one, leaves fewer ranks waiting, and every rank
        // trains something.
        let n = 64;
        let weight: Vec<u64> = (0..n).map(|i| 200 + (i * 37 % 50) as u64).collect();
        let id: Vec<u64> = (0..n as u64).collect();
        let release: Vec<i64> = (0..n).map(|i| [1000, 6500, 7600][i % 3] + (i as i64 * 13 % 90)).collect();
        let mut owner: Vec<u32> = (0..n).map(|i| (i % 8) as u32).collect();
        let end_of = |owner: &[u32]| {
            (0..8)
                .map(|q| {
                    let mine: Vec<usize> = (0..n).filter(|&i| owner[i] == q).collect();
                    let start = mine.iter().map(|&i| release[i]).max().unwrap_or(0).max(5000);
                    (
                        start + 120 + mine.iter().map(|&i| weight[i] as i64).sum::<i64>(),
                        start > 5000,
                        mine.len(),
                    )
                })
                .collect::<Vec<_>>()
        };
        let before = end_of(&owner);
        let late = group_late(&items(&weight, &id), &release, 5000, 120, 0, &[0; 8], &mut owner).unwrap();
        let after = end_of(&owner);
        assert!(after.iter().map(|x| x.0).max() <= before.iter().map(|x| x.0).max());
        assert_eq!(after.iter().filter(|x| x.1).count() as u32, late);
        assert!(late < before.iter().filter(|x| x.1).count() as u32, "{late} late ranks");
        assert!(after.iter().all(|x| x.2 > 0));
        // The late ones are the last ranks.
        assert!(after.iter().skip(8 - late as usize).all(|x| x.1));
    }
}
