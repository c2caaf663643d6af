//! The MPI backend: [`MpiWorld`] implements [`Collective`] over rsmpi and the system MPI, with
//! every collective under a watchdog.
//!
//! Each collective is started non-blocking (`MPI_I*`, MPI-3.1 §5.12) on a private duplicate of
//! `MPI_COMM_WORLD` and polled with `MPI_Test` against a deadline ([`Config::timeout`]). While it
//! polls, a rank also answers "where are you?" queries on a second private communicator. When the
//! deadline passes, the rank asks every peer where it is, waits a short grace period, prints which
//! peers have not arrived (and which collective they are in instead), and calls `MPI_Abort`, which
//! ends every rank with [`EXIT_ABORTED`]. A rank that dies makes the launcher end the job; the
//! SIGTERM reporter makes the survivors name the collective they were in.
//!
//! All-to-all-v runs as a point-to-point exchange (every receive posted, then every send: the
//! linear algorithm of Open MPI's `libnbc` `MPI_Ialltoallv`). Its message sizes are known to both
//! ends of each pair, so messages beyond [`Config::max_message_bytes`] are chunked without any
//! agreement between ranks — a single `MPI_Ialltoallv` could not be, since whether some rank's
//! counts or displacements exceed a C `int` is known only to that rank. Zero-byte blocks send no
//! message at all, and the watchdog can name the peers whose data has not arrived. The other
//! collectives use `MPI_I*` directly, chunked where the (globally known) sizes exceed a C `int`.
//!
//! All `unsafe` lives in [`raw`].

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};

use crate::collective::{check_layout, Collective, CollectiveError, CollectiveOp, ReduceOp, Result, Site};
use crate::comm::watchdog::{self, PeerState};
use crate::comm::{Config, EXIT_ABORTED};

pub mod raw;

pub use raw::{CallerComm, CallerCommError};
use raw::{MpiError, OwnedComm, Pending};

/// How long a collective polls without giving the core away: long enough for its own bytes to
/// move at [`SPIN_BYTES_PER_S`] (a transfer in flight needs the poll calls: they drive MPI's
/// progress engine), plus [`SPIN_MIN`]; at most [`SPIN_MAX`]. Past that the rank is waiting for a
/// slower peer, and polls between pauses instead.
pub(crate) fn spin_for(bytes: usize) -> Duration {
    (SPIN_MIN + Duration::from_secs_f64(bytes as f64 / SPIN_BYTES_PER_S)).min(SPIN_MAX)
}
const SPIN_MIN: Duration = Duration::from_millis(2);
const SPIN_MAX: Duration = Duration::from_millis(50);
/// Below the shared-memory bandwidth measured on a 2-core host (2.4–2.5 GB/s at 1–16 MiB per
/// peer, `datahelix perf alltoallv`), so that a transfer at full speed finishes while spinning.
const SPIN_BYTES_PER_S: f64 = 1.0e9;
/// Pause between poll rounds of a longer wait (a rank waiting for a slower peer).
pub(crate) const LONG_WAIT_PAUSE: Duration = Duration::from_micros(200);

const TAG_QUERY: i32 = 1;
const TAG_REPLY: i32 = 2;

/// The longest watchdog query read (they are [`watchdog::encode`]'s four words).
const MAX_QUERY_WORDS: usize = 16;

/// Collectives a point-to-point tag tells apart by sequence number ([`bulk_tag`]).
const TAG_SEQS: i32 = 4096;

/// Tag of the point-to-point messages of a collective: its kind and its sequence number (mod
/// [`TAG_SEQS`]), so that ranks that issued different collectives never match each other's
/// messages (they time out and report instead), and a stale message of an earlier collective
/// is never taken for this one's. At most 64 + 7 × 4096 − 1 = 28 735, within the 32 767 every
/// MPI allows (`MPI_TAG_UB`).
fn bulk_tag(site: Site) -> i32 {
    64 + site.op.code() as i32 * TAG_SEQS + (site.seq % TAG_SEQS as u64) as i32
}

/// MPI could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// `MPI_Init_thread` failed or MPI was already initialised by someone else and then finalised.
    #[error("MPI could not be initialised (is this process started by mpirun, and is MPI installed? run scripts/setup.sh)")]
    Init,
    /// An MPI call during set-up failed.
    #[error("MPI set-up: {0}")]
    Mpi(#[from] MpiError),
    /// The caller's communicator cannot be used.
    #[error("the caller's communicator: {0}")]
    Comm(#[from] CallerCommError),
}

/// A world of MPI ranks. Use from one thread. Dropping it runs a watched barrier (so that a rank
/// that finishes early waits under the watchdog) and finalises MPI if this world initialised it.
pub struct MpiWorld {
    data: OwnedComm,
    ctl: OwnedComm,
    config: Config,
    seq: Cell<u64>,
    step: Cell<Option<u64>>,
    parked: RefCell<Vec<Pending<'static>>>,
    closed: Cell<bool>,
    /// Since when this rank has answered the watchdog from outside collectives
    /// ([`Collective::serve_watchdog`]); cleared by the next collective.
    busy_since: Cell<Option<Instant>>,
    // Last field: dropped after the communicators above are freed.
    _universe: Option<mpi::environment::Universe>,
}

impl MpiWorld {
    /// Initialises MPI (or attaches to an MPI the host application initialised) and duplicates
    /// the world communicator twice (collectives, watchdog control).
    pub fn init(config: Config) -> std::result::Result<Self, InitError> {
        let universe = if mpi::environment::is_initialized() {
            if mpi::environment::is_finalized() {
                return Err(InitError::Init);
            }
            None
        } else {
            match mpi::environment::initialize_with_threading(mpi::environment::Threading::Funneled) {
                Some((u, _)) => Some(u),
                None => return Err(InitError::Init),
            }
        };
        let data = join_dup(OwnedComm::start_dup_world()?, &config, "MPI_COMM_WORLD")?;
        let ctl = join_dup(OwnedComm::start_dup_world()?, &config, "MPI_COMM_WORLD")?;
        Ok(MpiWorld::of(data, ctl, config, universe))
    }

    /// The world of two communicators of ours (collectives, watchdog control).
    fn of(
        data: OwnedComm,
        ctl: OwnedComm,
        config: Config,
        universe: Option<mpi::environment::Universe>,
    ) -> MpiWorld {
        if config.report_sigterm {
            watchdog::install_sigterm_reporter();
        }
        MpiWorld {
            data,
            ctl,
            config,
            seq: Cell::new(0),
            step: Cell::new(None),
            parked: RefCell::new(Vec::new()),
            closed: Cell::new(false),
            busy_since: Cell::new(None),
            _universe: universe,
        }
    }

    /// A world over a communicator the caller owns, in a process where the caller initialised
    /// MPI: the world's two communicators (collectives, watchdog) are duplicates of it, so the
    /// caller's traffic on its own never mixes with the loader's. The caller's communicator is
    /// never freed here and MPI never finalised. Collective over `comm` (`MPI_Comm_dup`).
    ///
    /// ```no_run
    /// use datahelix::comm::mpi::{CallerComm, MpiWorld};
    /// use mpi::topology::Communicator;
    ///
    /// let universe = mpi::initialize().unwrap();
    /// let world = universe.world();
    /// // Data-parallel groups of 2 ranks: a loader per group.
    /// let group = world.split_by_color(mpi::topology::Color::with_value(world.rank() / 2)).unwrap();
    /// let dp = MpiWorld::with_comm(Default::default(), &CallerComm::of_rsmpi(&group)).unwrap();
    /// ```
    pub fn with_comm(config: Config, comm: &CallerComm) -> std::result::Result<Self, InitError> {
        if !mpi::environment::is_initialized() || mpi::environment::is_finalized() {
            return Err(InitError::Init);
        }
        let data = join_dup(OwnedComm::start_dup_caller(comm)?, &config, "the caller's communicator")?;
        let ctl = join_dup(OwnedComm::start_dup_caller(comm)?, &config, "the caller's communicator")?;
        Ok(MpiWorld::of(data, ctl, config, None))
    }

    /// Splits the world (`MPI_Comm_split`, collective over it): the ranks passing the same
    /// `color` form a new world, ordered by their rank here; `None` takes no part and gets
    /// `None`. The new world has the settings of this one and frees its communicators itself.
    pub fn split(&self, color: Option<u32>) -> std::result::Result<Option<MpiWorld>, InitError> {
        let key = self.data.rank() as u32;
        let (Some(data), Some(ctl)) = (self.data.split(color, key)?, self.ctl.split(color, key)?) else {
            return Ok(None);
        };
        Ok(Some(MpiWorld::of(data, ctl, self.config.clone(), None)))
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes the largest single message (bytes, clamped to `1..=i32::MAX`); the chunked path is
    /// taken for anything larger. Tests use a small value to exercise chunking cheaply.
    pub fn set_max_message_bytes(&mut self, bytes: usize) {
        self.config.max_message_bytes = bytes.clamp(1, i32::MAX as usize);
    }

    /// Changes the watchdog timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.config.timeout = timeout;
    }

    /// The raw collectives communicator, for the `--raw` reference of `datahelix perf` (blocking
    /// MPI calls, no watchdog). Every rank must use it in the same order as the trait methods.
    pub fn raw(&self) -> &OwnedComm {
        &self.data
    }

    /// Gives up on this world without its closing barrier: the ranks no longer agree on what
    /// comes next (a peer broke the protocol, and another rank may still be inside a collective
    /// that this one will not join), so a barrier at drop would meet that collective instead
    /// and MPI would end the job on a truncated message before the caller could say why.
    pub fn abandon(&self) {
        self.closed.set(true);
    }

    /// Runs the closing barrier now and reports its failure, instead of at drop.
    pub fn close(self) -> Result<()> {
        self.closed.set(true);
        self.run(CollectiveOp::Finalize, 0, |c| c.ibarrier().map(|p| (p, None)))
    }

    fn enter(&self, op: CollectiveOp) -> Site {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let site = Site { rank: self.data.rank(), op, seq, step: self.step.get() };
        watchdog::note_enter(&site);
        self.busy_since.set(None);
        site
    }

    fn backend_err(site: Site, e: MpiError) -> CollectiveError {
        CollectiveError::Backend { site, backend: "mpi", message: e.to_string() }
    }

    /// Enters a collective, starts it with `start`, and waits for it under the watchdog.
    fn run<'b>(
        &self,
        op: CollectiveOp,
        bytes: usize,
        start: impl FnOnce(&OwnedComm) -> std::result::Result<(Pending<'b>, Option<Vec<usize>>), MpiError>,
    ) -> Result<()> {
        let site = self.enter(op);
        let r = self.run_at(site, bytes, start);
        watchdog::note_leave();
        r
    }

    fn run_at<'b>(
        &self,
        site: Site,
        bytes: usize,
        start: impl FnOnce(&OwnedComm) -> std::result::Result<(Pending<'b>, Option<Vec<usize>>), MpiError>,
    ) -> Result<()> {
        let (mut pending, peer_of) = start(&self.data).map_err(|e| Self::backend_err(site, e))?;
        self.wait(site, bytes, &mut pending, peer_of.as_deref());
        Ok(())
    }

    /// Polls `pending`, which moves `bytes` in and out of this rank, until it completes; on
    /// timeout or failure reports and aborts the job.
    fn wait(&self, site: Site, bytes: usize, pending: &mut Pending<'_>, peer_of: Option<&[usize]>) {
        let start = Instant::now();
        let spin = spin_for(bytes);
        let deadline = start + self.config.timeout;
        let mut polls: u32 = 0;
        loop {
            match pending.test() {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => self.fail(site, e),
            }
            polls = polls.wrapping_add(1);
            if polls % 32 == 0 {
                self.serve_queries(&watchdog::encode(&site, start.elapsed()));
                let now = Instant::now();
                if now >= deadline && self.expire(site, start, pending, peer_of) {
                    return;
                }
                // Spin like a blocking MPI call would (MPI_Test drives the progress engine)
                // while this collective's own bytes may still be moving; a longer wait — for a
                // slower peer, e.g. at the gradient sync — sleeps between poll rounds, so that
                // this node's decode workers get the core: a yield still spun, and on a node with
                // fewer cores than threads the waiting ranks took CPU from the decodes the slow
                // rank was waiting for. Costs ≤ 0.2 ms of latency.
                if now - start > spin {
                    std::thread::sleep(LONG_WAIT_PAUSE);
                }
            }
        }
    }

    /// A collective failed after it started: the ranks can no longer agree, so end the job.
    fn fail(&self, site: Site, e: MpiError) -> ! {
        let hint = match e.kind() {
            raw::MpiErrorKind::Truncate => {
                " — a message was longer than its receive buffer: the ranks disagree on sizes or issued \
                 different collectives"
            }
            _ if e.code == mpi::ffi::MPI_ERR_COUNT as i32 && e.call.starts_with("MPI_Irecv") => {
                " — a peer sent fewer bytes than the collective announced: the ranks disagree on sizes"
            }
            _ => "",
        };
        // In one write: the other ranks print theirs at the same moment.
        crate::comm::say_whole(&format!(
            "datahelix: {site} failed: {e}{hint}. Aborting the job (exit {EXIT_ABORTED})."
        ));
        raw::abort(EXIT_ABORTED)
    }

    /// Answers queued "where are you?" queries with `reply` and forgets finished replies. A
    /// query longer than any this library sends is left unread (it is not ours to size).
    fn serve_queries(&self, reply: &[u64]) {
        while let Ok(Some((src, n))) = self.ctl.iprobe(TAG_QUERY) {
            if n > MAX_QUERY_WORDS || self.ctl.recv_u64s(src, TAG_QUERY, n).is_err() {
                break;
            }
            if let Ok(p) = self.ctl.isend_owned(src, TAG_REPLY, reply.to_vec()) {
                self.parked.borrow_mut().push(p);
            }
        }
        self.parked.borrow_mut().retain_mut(|p| !matches!(p.test(), Ok(true) | Err(_)));
    }

    /// The deadline passed: ask the peers, report, abort. Returns `true` only if the collective
    /// completed during the grace period after all (then the job goes on).
    fn expire(
        &self,
        site: Site,
        start: Instant,
        pending: &mut Pending<'_>,
        peer_of: Option<&[usize]>,
    ) -> bool {
        let Some(peers) = self.ask_peers(site, start, || matches!(pending.test(), Ok(true))) else {
            return true;
        };
        let missing: Option<Vec<usize>> = peer_of.map(|peer_of| {
            let mut m: Vec<usize> =
                (0..peer_of.len()).filter(|&i| !pending.is_done(i)).map(|i| peer_of[i]).collect();
            m.sort_unstable();
            m.dedup();
            m
        });
        self.report_expired(site, None, start, &peers, missing.as_deref())
    }

    /// Asks every peer where it is and collects the answers for a grace period, answering their
    /// own queries meanwhile. `None` if `done` turned true during it (the collective completed
    /// after all); else every peer's state, [`PeerState::Silent`] for those that did not answer.
    fn ask_peers(
        &self,
        site: Site,
        start: Instant,
        mut done: impl FnMut() -> bool,
    ) -> Option<Vec<(usize, PeerState)>> {
        let n = self.data.size();
        let me = self.data.rank();
        let query = watchdog::encode(&site, start.elapsed());
        for p in (0..n).filter(|&p| p != me) {
            if let Ok(req) = self.ctl.isend_owned(p, TAG_QUERY, query.clone()) {
                self.parked.borrow_mut().push(req);
            }
        }
        let mut states: Vec<Option<PeerState>> = vec![None; n];
        let t0 = Instant::now();
        while t0.elapsed() < self.grace() && (0..n).any(|p| p != me && states[p].is_none()) {
            if done() {
                eprintln!(
                    "datahelix: {site} completed after {:.1} s, beyond the {:.1} s timeout; continuing",
                    start.elapsed().as_secs_f64(),
                    self.config.timeout.as_secs_f64()
                );
                return None;
            }
            self.serve_queries(&watchdog::encode(&site, start.elapsed()));
            while let Ok(Some((src, len))) = self.ctl.iprobe(TAG_REPLY) {
                match self.ctl.recv_u64s(src, TAG_REPLY, len) {
                    Ok(words) => states[src] = Some(watchdog::decode(&words)),
                    Err(_) => break,
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Some((0..n).filter(|&p| p != me).map(|p| (p, states[p].unwrap_or(PeerState::Silent))).collect())
    }

    /// How long a timed-out rank waits for its peers' answers.
    fn grace(&self) -> Duration {
        (self.config.timeout / 4).clamp(Duration::from_millis(300), Duration::from_secs(5))
    }

    /// Prints the watchdog's report of `site` and ends the job.
    fn report_expired(
        &self,
        site: Site,
        backend: Option<&str>,
        start: Instant,
        peers: &[(usize, PeerState)],
        missing: Option<&[usize]>,
    ) -> ! {
        let text = watchdog::report(
            &site,
            backend,
            start.elapsed(),
            self.config.timeout,
            peers,
            missing,
            self.grace(),
            EXIT_ABORTED,
        );
        eprint!("{text}");
        tracing::error!(target: "datahelix::comm", "{}", text.lines().next().unwrap_or(""));
        raw::abort(EXIT_ABORTED)
    }

    /// For a collective of another backend on the same ranks (the HCCL backend's, which
    /// bootstraps from this world): answers peers' "where are you?" with `site`, entered at
    /// `start`. Call it while polling that collective.
    #[cfg(feature = "hccl")]
    pub(crate) fn answer_for(&self, site: &Site, start: Instant) {
        self.busy_since.set(None);
        self.serve_queries(&watchdog::encode(site, start.elapsed()));
    }

    /// `backend`'s collective `site`, entered at `start`, passed its deadline: asks the peers over
    /// this world's control communicator, reports which have not arrived and ends the job, as for
    /// this world's own collectives. Returns `true` only if `done` turned true during the grace
    /// period (the collective completed after all).
    #[cfg(feature = "hccl")]
    pub(crate) fn expire_foreign(
        &self,
        site: Site,
        backend: &str,
        start: Instant,
        done: impl FnMut() -> bool,
    ) -> bool {
        match self.ask_peers(site, start, done) {
            None => true,
            Some(peers) => self.report_expired(site, Some(backend), start, &peers, None),
        }
    }

    fn invalid(site: Site, what: String) -> CollectiveError {
        CollectiveError::InvalidArgument { site, what }
    }

    fn fits(&self, counts: &[usize], displs: &[usize]) -> bool {
        counts.iter().all(|&c| c <= self.config.max_message_bytes)
            && displs.iter().all(|&d| d <= i32::MAX as usize)
    }
}

impl Collective for MpiWorld {
    fn rank(&self) -> usize {
        self.data.rank()
    }

    fn size(&self) -> usize {
        self.data.size()
    }

    fn backend(&self) -> &'static str {
        "mpi"
    }

    fn serve_watchdog(&self) {
        let since = self.busy_since.get().unwrap_or_else(Instant::now);
        self.busy_since.set(Some(since));
        self.serve_queries(&watchdog::encode_decoding(self.step.get(), since.elapsed()));
    }

    fn set_step(&self, step: Option<u64>) {
        self.step.set(step);
    }

    fn site_now(&self, op: CollectiveOp) -> Site {
        Site { rank: self.data.rank(), op, seq: self.seq.get(), step: self.step.get() }
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = self.size();
        if send.len().checked_mul(n) != Some(recv.len()) {
            let site = self.enter(CollectiveOp::AllGather);
            watchdog::note_leave();
            return Err(Self::invalid(
                site,
                format!("receive buffer is {} bytes, expected {n} ranks x {} bytes", recv.len(), send.len()),
            ));
        }
        if send.len() <= self.config.max_message_bytes && recv.len() <= i32::MAX as usize {
            return self
                .run(CollectiveOp::AllGather, recv.len(), |c| c.iallgather(send, recv).map(|p| (p, None)));
        }
        let counts = vec![send.len(); n];
        let displs: Vec<usize> = (0..n).map(|r| r * send.len()).collect();
        let site = self.enter(CollectiveOp::AllGather);
        let r = self.gather_p2p(site, send, &counts, &displs, recv);
        watchdog::note_leave();
        r
    }

    fn all_gather_v(&self, send: &[u8], counts: &[usize], displs: &[usize], recv: &mut [u8]) -> Result<()> {
        let n = self.size();
        let me = self.rank();
        if let Err(e) = check_layout(
            self.site_now(CollectiveOp::AllGatherV),
            "receive",
            n,
            counts,
            displs,
            recv.len(),
            true,
        )
        .and_then(|()| {
            if counts[me] == send.len() {
                Ok(())
            } else {
                Err(Self::invalid(
                    self.site_now(CollectiveOp::AllGatherV),
                    format!("counts[{me}] is {} but this rank sends {} bytes", counts[me], send.len()),
                ))
            }
        }) {
            self.enter(CollectiveOp::AllGatherV);
            watchdog::note_leave();
            return Err(e);
        }
        if self.fits(counts, displs) {
            return self.run(CollectiveOp::AllGatherV, recv.len(), |c| {
                c.iallgatherv(send, counts, displs, recv).map(|p| (p, None))
            });
        }
        let site = self.enter(CollectiveOp::AllGatherV);
        let r = self.gather_p2p(site, send, counts, displs, recv);
        watchdog::note_leave();
        r
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
        let n = self.size();
        let me = self.rank();
        let site = self.site_now(CollectiveOp::AllToAllV);
        let checked = check_layout(site, "send", n, send_counts, send_displs, send.len(), false)
            .and_then(|()| check_layout(site, "receive", n, recv_counts, recv_displs, recv.len(), true))
            .and_then(|()| {
                if send_counts[me] == recv_counts[me] {
                    Ok(())
                } else {
                    Err(Self::invalid(
                        site,
                        format!("sends {} bytes to itself but expects {}", send_counts[me], recv_counts[me]),
                    ))
                }
            });
        if let Err(e) = checked {
            self.enter(CollectiveOp::AllToAllV);
            watchdog::note_leave();
            return Err(e);
        }
        let site = self.enter(CollectiveOp::AllToAllV);
        recv[recv_displs[me]..recv_displs[me] + recv_counts[me]]
            .copy_from_slice(&send[send_displs[me]..send_displs[me] + send_counts[me]]);
        let sends: Vec<(usize, usize, usize)> = (0..n)
            .filter(|&p| p != me && send_counts[p] > 0)
            .map(|p| (p, send_displs[p], send_counts[p]))
            .collect();
        let recvs: Vec<(usize, usize, usize)> = (0..n)
            .filter(|&p| p != me && recv_counts[p] > 0)
            .map(|p| (p, recv_displs[p], recv_counts[p]))
            .collect();
        let max = self.config.max_message_bytes;
        let bytes = send.len() + recv.len();
        let r = self.run_at(site, bytes, |c| {
            c.iexchange(bulk_tag(site), send, &sends, recv, &recvs, max).map(|(p, o)| (p, Some(o)))
        });
        watchdog::note_leave();
        r
    }

    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp) -> Result<()> {
        let chunk = (self.config.max_message_bytes / 8).max(1);
        let site = self.enter(CollectiveOp::AllReduce);
        let mut r = if data.is_empty() {
            self.run_at(site, 0, |c| c.iallreduce(data, raw_op(op)).map(|p| (p, None)))
        } else {
            Ok(())
        };
        for part in data.chunks_mut(chunk) {
            if r.is_ok() {
                r = self
                    .run_at(site, 2 * 8 * part.len(), |c| c.iallreduce(part, raw_op(op)).map(|p| (p, None)));
            }
        }
        watchdog::note_leave();
        r
    }

    fn all_reduce_u64(&self, data: &mut [u64], op: ReduceOp) -> Result<()> {
        let chunk = (self.config.max_message_bytes / 8).max(1);
        let site = self.enter(CollectiveOp::AllReduce);
        let mut r = if data.is_empty() {
            self.run_at(site, 0, |c| c.iallreduce(data, raw_op(op)).map(|p| (p, None)))
        } else {
            Ok(())
        };
        for part in data.chunks_mut(chunk) {
            if r.is_ok() {
                r = self
                    .run_at(site, 2 * 8 * part.len(), |c| c.iallreduce(part, raw_op(op)).map(|p| (p, None)));
            }
        }
        watchdog::note_leave();
        r
    }

    fn broadcast(&self, root: usize, data: &mut [u8]) -> Result<()> {
        let site = self.enter(CollectiveOp::Broadcast);
        if root >= self.size() {
            watchdog::note_leave();
            return Err(Self::invalid(site, format!("root {root} in a world of {} ranks", self.size())));
        }
        let chunk = self.config.max_message_bytes;
        let mut r = if data.is_empty() {
            self.run_at(site, 0, |c| c.ibcast(root, data).map(|p| (p, None)))
        } else {
            Ok(())
        };
        for part in data.chunks_mut(chunk) {
            if r.is_ok() {
                r = self.run_at(site, part.len(), |c| c.ibcast(root, part).map(|p| (p, None)));
            }
        }
        watchdog::note_leave();
        r
    }

    fn barrier(&self) -> Result<()> {
        self.run(CollectiveOp::Barrier, 0, |c| c.ibarrier().map(|p| (p, None)))
    }
}

impl MpiWorld {
    /// All-gather-v as a point-to-point exchange (transfers beyond a C `int`).
    fn gather_p2p(
        &self,
        site: Site,
        send: &[u8],
        counts: &[usize],
        displs: &[usize],
        recv: &mut [u8],
    ) -> Result<()> {
        let n = self.size();
        let me = self.rank();
        recv[displs[me]..displs[me] + counts[me]].copy_from_slice(send);
        let sends: Vec<(usize, usize, usize)> =
            (0..n).filter(|&p| p != me && !send.is_empty()).map(|p| (p, 0, send.len())).collect();
        let recvs: Vec<(usize, usize, usize)> =
            (0..n).filter(|&p| p != me && counts[p] > 0).map(|p| (p, displs[p], counts[p])).collect();
        let max = self.config.max_message_bytes;
        self.run_at(site, send.len() * sends.len() + recv.len(), |c| {
            c.iexchange(bulk_tag(site), send, &sends, recv, &recvs, max).map(|(p, o)| (p, Some(o)))
        })
    }
}

/// Waits for a communicator duplicate under the collective timeout. Past it, some rank never
/// started creating its world — it failed before (its error is above), or its exit waits in
/// `MPI_Finalize` — and a blocking `MPI_Comm_dup` would have hung both for good: say so and
/// abort the job, as the watchdog does for a collective.
fn join_dup(
    mut pending: raw::PendingDup,
    config: &Config,
    of: &str,
) -> std::result::Result<OwnedComm, MpiError> {
    let start = Instant::now();
    loop {
        if let Some(comm) = pending.test()? {
            return Ok(comm);
        }
        if start.elapsed() > config.timeout {
            crate::comm::say_whole(&format!(
                "datahelix: creating the loader's communicators (MPI_Comm_idup of {of}) did not complete \
                 within the {:.1} s collective timeout: some rank never started creating its loader — it \
                 failed before (look for its error above), exited, or is stuck elsewhere. Aborting the \
                 job (exit {EXIT_ABORTED}).",
                config.timeout.as_secs_f64()
            ));
            raw::abort(EXIT_ABORTED);
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn raw_op(op: ReduceOp) -> raw::Op {
    match op {
        ReduceOp::Sum => raw::Op::Sum,
        ReduceOp::Max => raw::Op::Max,
        ReduceOp::Min => raw::Op::Min,
    }
}

impl Drop for MpiWorld {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "datahelix: rank {} panicked (message above); aborting the job (exit {EXIT_ABORTED})",
                self.data.rank()
            );
            raw::abort(EXIT_ABORTED);
        }
        if !self.closed.get() {
            self.closed.set(true);
            if let Err(e) = self.run(CollectiveOp::Finalize, 0, |c| c.ibarrier().map(|p| (p, None))) {
                eprintln!("datahelix: {e}");
            }
        }
        // Control replies still in flight would be abandoned: wait for them (they are tiny and
        // their receivers either took them or are gone, in which case the job is ending anyway).
        let t0 = Instant::now();
        let mut parked = self.parked.borrow_mut();
        while !parked.is_empty() && t0.elapsed() < Duration::from_secs(1) {
            parked.retain_mut(|p| !matches!(p.test(), Ok(true) | Err(_)));
        }
        if !parked.is_empty() {
            // Abandoning them would abort; leak them instead (the process is shutting down MPI).
            std::mem::forget(std::mem::take(&mut *parked));
        }
    }
}
