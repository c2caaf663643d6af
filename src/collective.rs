//! The collectives every rank-symmetric decision rests on, as a trait the core defines and the
//! backends (`comm::mpi`, later `comm::hccl`) implement. Nothing here touches FFI.
//!
//! | collective | use in DataHelix | MPI-3.1 section |
//! |---|---|---|
//! | [`Collective::all_gather`] | fixed-size per-rank records every step | 5.7 `MPI_Allgather` |
//! | [`Collective::all_gather_v`] | decoded sizes, skip lists | 5.7 `MPI_Allgatherv` |
//! | [`Collective::all_to_all_v`] | rebalancing decoded tensors | 5.8 `MPI_Alltoallv` |
//! | [`Collective::all_reduce_f64`] / [`Collective::all_reduce_u64`] | step sync, plan-hash check | 5.9.6 `MPI_Allreduce` |
//! | [`Collective::broadcast`] | root info, configs | 5.4 `MPI_Bcast` |
//! | [`Collective::barrier`] | start/end of a run | 5.3 `MPI_Barrier` |
//!
//! Every method is called by every rank in the same order (the MPI rule). Sizes and displacements
//! are bytes; any of them may be zero. A world of one rank ([`LocalWorld`]) needs no launcher.
//!
//! ```
//! use datahelix::collective::{Collective, LocalWorld, ReduceOp};
//! let world = LocalWorld::new();
//! let mut x = [1.5, 2.0];
//! world.all_reduce_f64(&mut x, ReduceOp::Sum).unwrap();
//! assert_eq!(world.all_gather_vec(b"rec").unwrap(), b"rec");
//! ```

use std::cell::Cell;
use std::fmt;

pub mod check;
pub mod cost;
pub mod reference;

/// Which collective an error or a watchdog report is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CollectiveOp {
    /// [`Collective::all_gather`].
    AllGather,
    /// [`Collective::all_gather_v`].
    AllGatherV,
    /// [`Collective::all_to_all_v`].
    AllToAllV,
    /// [`Collective::all_reduce_f64`] and [`Collective::all_reduce_u64`].
    AllReduce,
    /// [`Collective::broadcast`].
    Broadcast,
    /// [`Collective::barrier`].
    Barrier,
    /// The barrier a backend runs when a world is closed, so that a rank that finishes early waits
    /// under the watchdog instead of hanging in the MPI library's finalisation.
    Finalize,
}

impl CollectiveOp {
    /// Every op, in code order (see [`CollectiveOp::code`]).
    pub const ALL: [CollectiveOp; 7] = [
        CollectiveOp::AllGather,
        CollectiveOp::AllGatherV,
        CollectiveOp::AllToAllV,
        CollectiveOp::AllReduce,
        CollectiveOp::Broadcast,
        CollectiveOp::Barrier,
        CollectiveOp::Finalize,
    ];

    /// The name used in logs and errors (the method name).
    pub const fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::AllGatherV => "all_gather_v",
            CollectiveOp::AllToAllV => "all_to_all_v",
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::Barrier => "barrier",
            CollectiveOp::Finalize => "finalize barrier",
        }
    }

    /// A small stable number, for wire messages between ranks.
    pub const fn code(self) -> u64 {
        match self {
            CollectiveOp::AllGather => 0,
            CollectiveOp::AllGatherV => 1,
            CollectiveOp::AllToAllV => 2,
            CollectiveOp::AllReduce => 3,
            CollectiveOp::Broadcast => 4,
            CollectiveOp::Barrier => 5,
            CollectiveOp::Finalize => 6,
        }
    }

    /// The op with this [`CollectiveOp::code`].
    pub fn from_code(code: u64) -> Option<CollectiveOp> {
        CollectiveOp::ALL.get(usize::try_from(code).ok()?).copied()
    }
}

impl fmt::Display for CollectiveOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element-wise reduction of [`Collective::all_reduce_f64`] and [`Collective::all_reduce_u64`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for `u64`, as MPI's `MPI_SUM` on `uint64_t`).
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

/// Where in the job an error happened: rank, collective, its sequence number on this world and the
/// training step last set with [`Collective::set_step`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// This rank.
    pub rank: usize,
    /// The collective.
    pub op: CollectiveOp,
    /// How many collectives this world had issued before this one (0-based).
    pub seq: u64,
    /// The training step, if the caller set one.
    pub step: Option<u64>,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}: {} #{}", self.rank, self.op, self.seq)?;
        if let Some(step) = self.step {
            write!(f, " (step {step})")?;
        }
        Ok(())
    }
}

/// An error from a collective. Errors are detected before anything is sent where possible (so all
/// ranks that pass the same bad arguments fail the same way); a collective that fails after it
/// started is not returned but ends the job (see `comm::mpi`), since the ranks can no longer agree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectiveError {
    /// The arguments do not describe a valid call; nothing was sent.
    #[error("{site}: invalid arguments: {what}. Fix the caller: every rank must pass consistent sizes")]
    InvalidArgument {
        /// Where.
        site: Site,
        /// What is wrong, with the numbers.
        what: String,
    },
    /// The backend refused the call; nothing was sent.
    #[error("{site}: {backend} error: {message}")]
    Backend {
        /// Where.
        site: Site,
        /// Backend name (`mpi`, `hccl`).
        backend: &'static str,
        /// The backend's own description, with its code.
        message: String,
    },
}

/// Result of a collective.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;

/// The collectives a backend provides. The planner and executor see only this trait.
///
/// Methods take `&self`; a world is used from one thread (MPI's `FUNNELED` level), so
/// implementations keep counters in `Cell`s and are not `Sync`.
pub trait Collective {
    /// This rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Backend name as in `shared/CLI.md` (`mpi`, `hccl`, or `local` for a one-rank world).
    fn backend(&self) -> &'static str;
    /// Sets the training step that logs and watchdog reports name; `None` clears it.
    fn set_step(&self, step: Option<u64>);
    /// Answers peers' watchdog queries while this rank is busy outside collectives (waiting for
    /// its decodes), so that a peer whose collective times out learns this rank is alive and
    /// decoding rather than silent. Not a collective; a no-op where there is no watchdog.
    fn serve_watchdog(&self) {}

    /// Every rank contributes `send` (same length on every rank); `recv` receives rank `r`'s block
    /// at `r * send.len()` and must be `size() * send.len()` long.
    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()>;

    /// Rank `r` contributes `counts[r]` bytes (`send.len()` on rank `r`), placed at `displs[r]` of
    /// `recv`. `counts` and `displs` are the same on every rank; ranges in `recv` must not overlap.
    fn all_gather_v(&self, send: &[u8], counts: &[usize], displs: &[usize], recv: &mut [u8]) -> Result<()>;

    /// This rank sends `send[send_displs[p]..][..send_counts[p]]` to rank `p` and receives rank `p`'s
    /// block into `recv[recv_displs[p]..][..recv_counts[p]]`. `recv_counts[p]` on this rank must equal
    /// `send_counts[self]` on rank `p`. Receive ranges must not overlap.
    fn all_to_all_v(
        &self,
        send: &[u8],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()>;

    /// Element-wise reduction over all ranks, in place; `data.len()` is the same on every rank.
    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp) -> Result<()>;

    /// Element-wise reduction over all ranks, in place; `data.len()` is the same on every rank.
    fn all_reduce_u64(&self, data: &mut [u64], op: ReduceOp) -> Result<()>;

    /// Copies `data` on rank `root` into `data` on every rank (same length everywhere).
    fn broadcast(&self, root: usize, data: &mut [u8]) -> Result<()>;

    /// Returns once every rank has entered it.
    fn barrier(&self) -> Result<()>;

    // ---- provided helpers (one default implementation over the required methods) ----

    /// [`Collective::all_gather`] into a new buffer.
    fn all_gather_vec(&self, send: &[u8]) -> Result<Vec<u8>> {
        let mut recv = vec![0u8; send.len() * self.size()];
        self.all_gather(send, &mut recv)?;
        Ok(recv)
    }

    /// Gathers a variable-size contribution from every rank without knowing sizes in advance (an
    /// all-gather of the sizes, then [`Collective::all_gather_v`]). Returns one buffer per rank.
    /// A size a rank announces above `max_per_rank` is an error before anything is allocated
    /// (sizes come from peers: nothing is allocated as announced unchecked).
    fn all_gather_v_vec(&self, send: &[u8], max_per_rank: usize) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        let sizes = self.all_gather_vec(&(send.len() as u64).to_le_bytes())?;
        let counts: Vec<usize> = sizes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as usize)
            .collect();
        announced_within(self, CollectiveOp::AllGather, &counts, max_per_rank)?;
        let displs = prefix_sums(&counts);
        let mut recv = vec![0u8; counts.iter().sum()];
        self.all_gather_v(send, &counts, &displs, &mut recv)?;
        Ok((0..n).map(|r| recv[displs[r]..displs[r] + counts[r]].to_vec()).collect())
    }

    /// Sends `blocks[p]` to rank `p` and returns the block each rank sent here, in rank order.
    /// Exchanges the sizes first (an all-gather of one row per rank).
    /// A block a rank announces above `max_per_rank` is an error before anything is allocated.
    fn all_to_all_v_vec(&self, blocks: &[Vec<u8>], max_per_rank: usize) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        if blocks.len() != n {
            return Err(CollectiveError::InvalidArgument {
                site: self.site_now(CollectiveOp::AllToAllV),
                what: format!("{} blocks for {} ranks", blocks.len(), n),
            });
        }
        let row: Vec<u8> = blocks.iter().flat_map(|b| (b.len() as u64).to_le_bytes()).collect();
        let matrix = self.all_gather_vec(&row)?;
        let me = self.rank();
        let recv_counts: Vec<usize> = (0..n)
            .map(|p| {
                let at = (p * n + me) * 8;
                u64::from_le_bytes(matrix[at..at + 8].try_into().unwrap_or([0; 8])) as usize
            })
            .collect();
        announced_within(self, CollectiveOp::AllToAllV, &recv_counts, max_per_rank)?;
        let send_counts: Vec<usize> = blocks.iter().map(Vec::len).collect();
        all_to_all_blocks(self, &blocks.concat(), &send_counts, &recv_counts)
    }

    /// Sends `blocks[p]` to every rank `p` with `send[p]` and receives one block from every rank
    /// `p` with `expect[p]`, in rank order (empty where nothing was expected; this rank's own block
    /// is passed through). [`Collective::exchange_packed`] with the blocks in separate buffers
    /// (and its `max_in`).
    fn exchange_vec(
        &self,
        blocks: &[Vec<u8>],
        send: &[bool],
        expect: &[bool],
        max_in: usize,
    ) -> Result<Vec<Vec<u8>>> {
        let me = self.rank();
        let counts: Vec<usize> =
            blocks.iter().enumerate().map(|(p, b)| if p == me { 0 } else { b.len() }).collect();
        let mut data = Vec::with_capacity(counts.iter().sum());
        for (_, b) in blocks.iter().enumerate().filter(|&(p, _)| p != me) {
            data.extend_from_slice(b);
        }
        let packed = self.exchange_packed(&data, &counts, send, expect, max_in)?;
        let mut out: Vec<Vec<u8>> = (0..packed.counts.len()).map(|p| packed.block(p).to_vec()).collect();
        if let (Some(mine), Some(block)) = (out.get_mut(me), blocks.get(me)) {
            mine.clone_from(block);
        }
        Ok(out)
    }

    /// A sparse all-to-all where both sides already know who sends to whom (e.g. from a plan every
    /// rank holds) but not the sizes, which may be zero: rank `p`'s block is
    /// `send[displ(p)..][..send_counts[p]]` (blocks back to back in rank order), sent when
    /// `to[p]`; a block comes from every rank `p` with `from[p]`. The sizes travel first, then the
    /// data, each in one [`Collective::all_to_all_v`] with zero counts between pairs that exchange
    /// nothing — which MPI carries point to point, so a rank waits only for its own partners, not
    /// for the slowest rank of the job. Every rank must call it. The received blocks come back in
    /// one buffer ([`Packed`]): the bytes are copied once on each side, beyond what the backend
    /// copies.
    ///
    /// The two sides must agree (`to[q]` on rank `p` equals `from[p]` on rank `q`): a rank
    /// expecting a block that never comes is a bug that ends in the collective watchdog. A block
    /// for this rank itself or for a rank without `to` is an error (it would be dropped). A block
    /// size a peer announces above `max_in` is an error before anything is allocated.
    fn exchange_packed(
        &self,
        send: &[u8],
        send_counts: &[usize],
        to: &[bool],
        from: &[bool],
        max_in: usize,
    ) -> Result<Packed> {
        let n = self.size();
        let me = self.rank();
        let invalid = |what: String| CollectiveError::InvalidArgument {
            site: self.site_now(CollectiveOp::AllToAllV),
            what,
        };
        if send_counts.len() != n || to.len() != n || from.len() != n {
            return Err(invalid(format!(
                "{} send counts, {} send flags and {} expectations for {} ranks",
                send_counts.len(),
                to.len(),
                from.len(),
                n
            )));
        }
        if send_counts.iter().sum::<usize>() != send.len() {
            return Err(invalid(format!(
                "send counts add up to {} bytes but the send buffer holds {}",
                send_counts.iter().sum::<usize>(),
                send.len()
            )));
        }
        if let Some(p) = (0..n).find(|&p| send_counts[p] > 0 && (p == me || !to[p])) {
            return Err(invalid(format!(
                "{} bytes for rank {p}, which this exchange does not send to",
                send_counts[p]
            )));
        }
        let words: Vec<usize> = (0..n).map(|p| if p != me && to[p] { 8 } else { 0 }).collect();
        let expect: Vec<usize> = (0..n).map(|p| if p != me && from[p] { 8 } else { 0 }).collect();
        let sizes: Vec<u8> =
            (0..n).filter(|&p| words[p] > 0).flat_map(|p| (send_counts[p] as u64).to_le_bytes()).collect();
        let mut got = vec![0u8; expect.iter().sum()];
        self.all_to_all_v(&sizes, &words, &prefix_sums(&words), &mut got, &expect, &prefix_sums(&expect))?;
        let got_displs = prefix_sums(&expect);
        let counts: Vec<usize> = (0..n)
            .map(|p| {
                if expect[p] == 0 {
                    return 0;
                }
                let at = got_displs[p];
                u64::from_le_bytes(got[at..at + 8].try_into().unwrap_or([0; 8])) as usize
            })
            .collect();
        announced_within(self, CollectiveOp::AllToAllV, &counts, max_in)?;
        let total = counts
            .iter()
            .try_fold(0usize, |a, &c| a.checked_add(c))
            .ok_or_else(|| invalid(format!("the block sizes the peers announced overflow: {counts:?}")))?;
        let displs = prefix_sums(&counts);
        let mut data = vec![0u8; total];
        self.all_to_all_v(send, send_counts, &prefix_sums(send_counts), &mut data, &counts, &displs)?;
        Ok(Packed { data, counts, displs })
    }

    /// Checks that every rank holds the same `value` (e.g. a plan hash); `Ok(false)` if any differs.
    fn agree(&self, value: u64) -> Result<bool> {
        let (mut hi, mut lo) = ([value], [value]);
        self.all_reduce_u64(&mut hi, ReduceOp::Max)?;
        self.all_reduce_u64(&mut lo, ReduceOp::Min)?;
        Ok(hi == lo)
    }

    /// The [`Site`] a new collective of kind `op` would have (for errors raised by helpers).
    fn site_now(&self, op: CollectiveOp) -> Site {
        Site { rank: self.rank(), op, seq: 0, step: None }
    }
}

/// [`Collective::all_to_all_v`] of blocks packed back to back in `send` (`send_counts[p]` bytes
/// for rank `p`), returning the block received from each rank.
fn all_to_all_blocks<C: Collective + ?Sized>(
    c: &C,
    send: &[u8],
    send_counts: &[usize],
    recv_counts: &[usize],
) -> Result<Vec<Vec<u8>>> {
    let recv_displs = prefix_sums(recv_counts);
    let mut recv = vec![0u8; recv_counts.iter().sum()];
    c.all_to_all_v(send, send_counts, &prefix_sums(send_counts), &mut recv, recv_counts, &recv_displs)?;
    Ok((0..recv_counts.len())
        .map(|p| recv[recv_displs[p]..recv_displs[p] + recv_counts[p]].to_vec())
        .collect())
}

/// The blocks an [`Collective::exchange_packed`] received, back to back in rank order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Packed {
    /// Every block, in rank order.
    pub data: Vec<u8>,
    /// Bytes from each rank (0 where nothing came).
    pub counts: Vec<usize>,
    /// Where each rank's block starts in `data`.
    pub displs: Vec<usize>,
}

impl Packed {
    /// The block rank `p` sent (empty for a rank outside the world).
    pub fn block(&self, p: usize) -> &[u8] {
        match (self.displs.get(p), self.counts.get(p)) {
            (Some(&d), Some(&c)) => &self.data[d..d + c],
            _ => &[],
        }
    }
}

/// Refuses sizes that peers announced above `max` (before the caller allocates by them), naming
/// the first rank that did.
fn announced_within<C: Collective + ?Sized>(
    c: &C,
    op: CollectiveOp,
    counts: &[usize],
    max: usize,
) -> Result<()> {
    match counts.iter().position(|&n| n > max) {
        None => Ok(()),
        Some(r) => Err(CollectiveError::InvalidArgument {
            site: c.site_now(op),
            what: format!(
                "rank {r} announced {} bytes, more than the {max} this collective carries from one rank; every rank must run the same build",
                counts[r]
            ),
        }),
    }
}

/// Exclusive prefix sums: the displacements of blocks of `counts` packed back to back.
pub fn prefix_sums(counts: &[usize]) -> Vec<usize> {
    let mut acc = 0usize;
    counts
        .iter()
        .map(|c| {
            let d = acc;
            acc += c;
            d
        })
        .collect()
}

/// Checks one side of a `v` collective: `counts` and `displs` have `n` entries, every range fits in
/// a buffer of `buf_len` bytes, and (for receive sides, `disjoint`) no two ranges overlap.
/// `side` names the side in the message ("receive", "send").
pub fn check_layout(
    site: Site,
    side: &str,
    n: usize,
    counts: &[usize],
    displs: &[usize],
    buf_len: usize,
    disjoint: bool,
) -> Result<()> {
    let bad = |what: String| Err(CollectiveError::InvalidArgument { site, what });
    if counts.len() != n || displs.len() != n {
        return bad(format!(
            "{side} counts has {} entries and {side} displacements {}, expected one per rank ({n})",
            counts.len(),
            displs.len()
        ));
    }
    for p in 0..n {
        match displs[p].checked_add(counts[p]) {
            Some(end) if end <= buf_len => {}
            _ => {
                return bad(format!(
                    "{side} range of rank {p} is {}..{}+{}, beyond the {buf_len}-byte {side} buffer",
                    displs[p], displs[p], counts[p]
                ))
            }
        }
    }
    if disjoint {
        let mut ranges: Vec<(usize, usize, usize)> =
            (0..n).filter(|&p| counts[p] > 0).map(|p| (displs[p], displs[p] + counts[p], p)).collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return bad(format!(
                    "{side} ranges of ranks {} ({}..{}) and {} ({}..{}) overlap",
                    w[0].2, w[0].0, w[0].1, w[1].2, w[1].0, w[1].1
                ));
            }
        }
    }
    Ok(())
}

/// A world of one rank: every collective is a local copy. Needs no launcher; used when a process
/// is started without `mpirun` and in single-process tests.
#[derive(Debug, Default)]
pub struct LocalWorld {
    seq: Cell<u64>,
    step: Cell<Option<u64>>,
}

impl LocalWorld {
    /// A one-rank world.
    pub fn new() -> Self {
        LocalWorld::default()
    }

    fn enter(&self, op: CollectiveOp) -> Site {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        Site { rank: 0, op, seq, step: self.step.get() }
    }
}

impl Collective for LocalWorld {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "local"
    }
    fn set_step(&self, step: Option<u64>) {
        self.step.set(step);
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let site = self.enter(CollectiveOp::AllGather);
        if recv.len() != send.len() {
            return Err(CollectiveError::InvalidArgument {
                site,
                what: format!(
                    "receive buffer is {} bytes, expected 1 rank x {} bytes",
                    recv.len(),
                    send.len()
                ),
            });
        }
        recv.copy_from_slice(send);
        Ok(())
    }

    fn all_gather_v(&self, send: &[u8], counts: &[usize], displs: &[usize], recv: &mut [u8]) -> Result<()> {
        let site = self.enter(CollectiveOp::AllGatherV);
        check_layout(site, "receive", 1, counts, displs, recv.len(), true)?;
        if counts[0] != send.len() {
            return Err(CollectiveError::InvalidArgument {
                site,
                what: format!("counts[0] is {} but this rank sends {} bytes", counts[0], send.len()),
            });
        }
        recv[displs[0]..displs[0] + counts[0]].copy_from_slice(send);
        Ok(())
    }

    fn all_to_all_v(
        &self,
        send: &[u8],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let site = self.enter(CollectiveOp::AllToAllV);
        check_layout(site, "send", 1, send_counts, send_displs, send.len(), false)?;
        check_layout(site, "receive", 1, recv_counts, recv_displs, recv.len(), true)?;
        if send_counts[0] != recv_counts[0] {
            return Err(CollectiveError::InvalidArgument {
                site,
                what: format!("sends {} bytes to itself but expects {}", send_counts[0], recv_counts[0]),
            });
        }
        recv[recv_displs[0]..recv_displs[0] + recv_counts[0]]
            .copy_from_slice(&send[send_displs[0]..send_displs[0] + send_counts[0]]);
        Ok(())
    }

    fn all_reduce_f64(&self, _data: &mut [f64], _op: ReduceOp) -> Result<()> {
        self.enter(CollectiveOp::AllReduce);
        Ok(())
    }

    fn all_reduce_u64(&self, _data: &mut [u64], _op: ReduceOp) -> Result<()> {
        self.enter(CollectiveOp::AllReduce);
        Ok(())
    }

    fn broadcast(&self, root: usize, _data: &mut [u8]) -> Result<()> {
        let site = self.enter(CollectiveOp::Broadcast);
        if root != 0 {
            return Err(CollectiveError::InvalidArgument {
                site,
                what: format!("root {root} in a world of 1 rank"),
            });
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.enter(CollectiveOp::Barrier);
        Ok(())
    }

    fn site_now(&self, op: CollectiveOp) -> Site {
        Site { rank: 0, op, seq: self.seq.get(), step: self.step.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_world_copies_and_validates() {
        let w = LocalWorld::new();
        assert_eq!(w.all_gather_vec(&[]).unwrap(), Vec::<u8>::new());
        assert_eq!(w.all_gather_v_vec(b"abc", 3).unwrap(), vec![b"abc".to_vec()]);
        let e = w.all_gather_v_vec(b"abc", 2).unwrap_err().to_string();
        assert!(e.contains("rank 0 announced 3 bytes, more than the 2"), "{e}");
        assert_eq!(w.all_to_all_v_vec(&[b"xy".to_vec()], 2).unwrap(), vec![b"xy".to_vec()]);
        let mut recv = [0u8; 4];
        w.all_to_all_v(b"abcd", &[2], &[1], &mut recv, &[2], &[2]).unwrap();
        assert_eq!(&recv, b"\0\0bc");
        let err = w.all_to_all_v(b"abcd", &[2], &[3], &mut recv, &[2], &[0]).unwrap_err();
        assert!(err.to_string().contains("all_to_all_v"), "{err}");
        assert!(w.agree(7).unwrap());
        assert!(w.broadcast(1, &mut []).is_err());
        w.barrier().unwrap();
    }

    #[test]
    fn packed_exchange_refuses_bytes_it_would_drop() {
        let w = LocalWorld::new();
        // One rank: nothing to send or receive; its own block passes through exchange_vec.
        let got = w.exchange_packed(&[], &[0], &[false], &[false], 0).unwrap();
        assert_eq!(got.block(0), b"");
        assert_eq!(got.block(7), b"", "a rank outside the world has no block");
        assert_eq!(w.exchange_vec(&[b"me".to_vec()], &[false], &[false], 0).unwrap(), vec![b"me".to_vec()]);
        // Bytes for this rank itself, counts that do not cover the buffer, wrong lengths.
        let e = w.exchange_packed(b"ab", &[2], &[true], &[false], 0).unwrap_err().to_string();
        assert!(e.contains("2 bytes for rank 0") && e.contains("all_to_all_v"), "{e}");
        let e = w.exchange_packed(b"abc", &[0], &[false], &[false], 0).unwrap_err().to_string();
        assert!(e.contains("add up to 0 bytes but the send buffer holds 3"), "{e}");
        let e = w.exchange_packed(&[], &[0, 0], &[false], &[false], 0).unwrap_err().to_string();
        assert!(e.contains("2 send counts, 1 send flags and 1 expectations for 1 ranks"), "{e}");
    }

    #[test]
    fn layout_rejects_overlap_and_overflow() {
        let site = Site { rank: 1, op: CollectiveOp::AllGatherV, seq: 3, step: Some(9) };
        assert!(check_layout(site, "receive", 2, &[4, 4], &[0, 4], 8, true).is_ok());
        let e = check_layout(site, "receive", 2, &[4, 4], &[0, 3], 8, true).unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains("rank 1: all_gather_v #3 (step 9)"), "{e}");
        assert!(
            check_layout(site, "receive", 2, &[0, 4], &[0, 0], 4, true).is_ok(),
            "empty ranges never overlap"
        );
        assert!(check_layout(site, "send", 2, &[usize::MAX, 1], &[1, 0], 8, false).is_err());
        assert!(check_layout(site, "send", 2, &[1], &[0], 8, false).is_err());
    }

    #[test]
    fn op_codes_round_trip() {
        for op in CollectiveOp::ALL {
            assert_eq!(CollectiveOp::from_code(op.code()), Some(op));
        }
        assert_eq!(CollectiveOp::from_code(99), None);
    }
}
