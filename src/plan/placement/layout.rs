//! The jobs of a placement problem renumbered pool by pool, for locality: simulating a pool
//! then reads its jobs' fields side by side instead of at random across arrays of a hundred
//! thousand entries (at 4096 ranks, laying out the first schedule was then most of a plan).

use super::Problem;

/// A renumbering of jobs: `old_of[new]` is the job's index in the caller's problem.
pub(super) struct Layout {
    pub(super) old_of: Vec<u32>,
}

impl Layout {
    /// Jobs grouped by `decoder` (rank by rank), each rank's in their old order.
    pub(super) fn by_pool(decoder: &[u32], ranks: usize) -> Layout {
        let mut first = vec![0usize; ranks + 1];
        for &d in decoder {
            first[d as usize + 1] += 1;
        }
        for r in 0..ranks {
            first[r + 1] += first[r];
        }
        let mut old_of = vec![0u32; decoder.len()];
        for (i, &d) in decoder.iter().enumerate() {
            old_of[first[d as usize]] = i as u32;
            first[d as usize] += 1;
        }
        Layout { old_of }
    }

    /// `v` (indexed by old job) in the new numbering.
    pub(super) fn gather<T: Copy>(&self, v: &[T]) -> Vec<T> {
        self.old_of.iter().map(|&i| v[i as usize]).collect()
    }

    /// `v` (indexed by new job) back in the old numbering.
    pub(super) fn scatter<T: Copy + Default>(&self, v: &[T]) -> Vec<T> {
        let mut out = vec![T::default(); v.len()];
        for (k, &i) in self.old_of.iter().enumerate() {
            out[i as usize] = v[k];
        }
        out
    }

    /// The problem with its jobs renumbered (per-rank and per-batch fields as they are).
    pub(super) fn problem(&self, p: &Problem) -> Problem {
        Problem {
            steps: p.steps,
            step: self.gather(&p.step),
            owner: self.gather(&p.owner),
            accel_ns: self.gather(&p.accel_ns),
            max_load_ns: p.max_load_ns.clone(),
            decode_ns: self.gather(&p.decode_ns),
            transfer_ns: self.gather(&p.transfer_ns),
            transfer_far_ns: if p.transfer_far_ns.is_empty() {
                Vec::new()
            } else {
                self.gather(&p.transfer_far_ns)
            },
            node: p.node.clone(),
            bytes: self.gather(&p.bytes),
            mem_cap: p.mem_cap.clone(),
            id: self.gather(&p.id),
            pinned: self.gather(&p.pinned),
            workers: p.workers.clone(),
            backlog_ns: p.backlog_ns.clone(),
            late: p.late.clone(),
            deadline_ns: p.deadline_ns.clone(),
            exchange_ns: p.exchange_ns.clone(),
            tolerance_ns: p.tolerance_ns,
            guard_ns: p.guard_ns.clone(),
        }
    }
}
