//! The decode worker pool: a fixed number of threads (the CPU budget), a queue ordered by
//! deadline (earliest first; ties by sample id, then submission order), and reusable tensor
//! buffers bounded by a byte budget.
//!
//! A worker opens a file, learns its output size, then takes a buffer: when the budget is
//! reached it waits for buffers to come back (a [`Tensor`] returns its buffer when dropped); a
//! sample larger than the whole budget is a per-sample error. A decode the caller waits for
//! ([`Pool::exempt_below`]) never waits for bytes only the caller can give back: when nothing
//! but the tensors it holds takes the budget, it goes past it ([`Pool::overdrafts`]) instead of
//! waiting forever. Every failure (missing or changed
//! file, damaged data, even a panic) becomes an [`Outcome`] with a [`SampleError`] naming the id,
//! the path and the reason; the pool goes on.
//!
//! ```no_run
//! use datahelix::decode::pool::{Job, Pool, PoolConfig};
//!
//! let pool = Pool::new(PoolConfig { workers: 2, budget_bytes: 64 << 20, ..PoolConfig::default() });
//! pool.submit(Job::sampled(7, "clip.mp4".into(), 0));
//! let outcome = pool.recv().expect("one outcome per job");
//! match outcome.result {
//!     Ok(out) => println!("{:?}", out.shape()),
//!     Err(e) => eprintln!("{e}"),
//! }
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use super::clock::thread_cpu_seconds;
use super::{AllFrames, DecodeError, Decoded, Decoder, FrameRange, Params, Strategy};
use crate::descriptor::Descriptor;
use crate::shard::location::{MemberPath, Part};

/// What to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The protocol's sampled frames, RGB24.
    Sampled,
    /// Every frame, native format, kept nowhere (`ffmpeg -f null` work).
    AllFrames,
}

/// One sample to decode.
#[derive(Clone, Debug)]
pub struct Job {
    /// Sample id.
    pub id: u64,
    /// File path.
    pub path: PathBuf,
    /// Deadline (any monotone unit; smaller is earlier).
    pub deadline: u64,
    /// The sample's descriptor from the index: its size and mtime are checked against the file
    /// (a changed file is an error), its keyframe interval chooses seek or scan.
    pub descriptor: Option<Descriptor>,
    /// What to decode.
    pub mode: Mode,
    /// Force a strategy (otherwise chosen from the descriptor, or scan without one).
    pub strategy: Option<Strategy>,
    /// Decode only these target frames (a piece of the sample, from
    /// [`split_targets`](super::split::split_targets)); `None` decodes the whole sample. Sampled
    /// mode only: [`Mode::AllFrames`] decodes every frame whatever this says.
    pub frames: Option<FrameRange>,
    /// The dataset folder (canonical) and the manifest path within it: when set, the file is
    /// resolved beneath the folder when the job runs, and one that a link now leads out of (or
    /// an unsafe path from the index) is refused, not opened.
    pub beneath: Option<(PathBuf, String)>,
}

impl Job {
    /// A sampled decode of the whole of `path`, with no descriptor.
    pub fn sampled(id: u64, path: PathBuf, deadline: u64) -> Job {
        Job {
            id,
            path,
            deadline,
            descriptor: None,
            mode: Mode::Sampled,
            strategy: None,
            frames: None,
            beneath: None,
        }
    }
}

/// Why one sample failed (the pool layer's error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The file is not there or cannot be read.
    #[error("missing or unreadable file: {0}")]
    Missing(std::io::Error),
    /// The path is not one to open: it leaves the dataset folder (a symbolic link, an absolute
    /// path or `..` written into the index) or cannot be resolved.
    #[error("path refused ({0}): it must lead to a file inside the dataset folder; fix the manifest or the link, then re-run `datahelix index`")]
    Refused(crate::descriptor::Status),
    /// The file's size or modification time differs from the index.
    #[error("file changed since indexing ({0}); re-run `datahelix index`")]
    Changed(String),
    /// The output tensor and FFmpeg's own memory for the decode are more than the pool's whole
    /// byte budget.
    #[error("decoding needs {}{} MiB of FFmpeg pictures and packets, more than the pool's whole budget of {} MiB; raise the budget (--budget-mib, budget_mib) or leave the sample out", if *need > 0 { format!("{} MiB of output tensor and ", mib(*need)) } else { String::new() }, mib(*working), mib(*budget))]
    TooLarge {
        /// Bytes the tensor needs.
        need: usize,
        /// Bytes FFmpeg holds while decoding ([`Decoder::working_bytes`]).
        working: usize,
        /// The pool's budget.
        budget: usize,
    },
    /// FFmpeg could not decode it.
    #[error("{0}")]
    Decode(#[from] DecodeError),
    /// The decoder panicked (a bug); caught so the pool goes on.
    #[error("decoder panicked: {0}")]
    Panicked(String),
}

/// Bytes in MiB, rounded up, for messages.
fn mib(bytes: usize) -> usize {
    bytes.div_ceil(1 << 20)
}

/// A failed sample: which, where, why.
#[derive(Debug)]
pub struct SampleError {
    /// Sample id.
    pub id: u64,
    /// File path.
    pub path: PathBuf,
    /// The reason.
    pub reason: Failure,
}

impl fmt::Display for SampleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sample {} ({}): {}", self.id, self.path.display(), self.reason)
    }
}

impl std::error::Error for SampleError {}

/// A decoded tensor in a pooled buffer; the buffer returns to the pool on drop.
pub struct Tensor {
    buf: Vec<u8>,
    pool: Arc<Buffers>,
}

impl std::ops::Deref for Tensor {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for Tensor {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Tensor {
    /// Takes the bytes out of the pool without copying them: the buffer stops counting in the
    /// pool's byte budget (decoding goes on as if it had been dropped) and is freed, not reused,
    /// when the returned vector is. For callers that keep tensors for as long as they like (the
    /// Python package), where a kept tensor must not stall decoding.
    pub fn detach(mut self) -> Vec<u8> {
        let buf = std::mem::take(&mut self.buf);
        self.pool.forget(buf.capacity());
        buf
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({} bytes)", self.buf.len())
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        self.pool.release(std::mem::take(&mut self.buf));
    }
}

/// What a successful job produced.
#[derive(Debug)]
pub enum Output {
    /// Sampled frames: the tensor and how it was made.
    Sampled {
        /// Packed RGB24 `[F, H', W', 3]` (`F` the job's range of target frames, when it has one).
        tensor: Tensor,
        /// Shape, timestamps, work counters.
        decoded: Decoded,
    },
    /// Every frame, native format.
    AllFrames(AllFrames),
}

impl Output {
    /// `[F, H, W, C]` (for all frames: `[frames, H, W, 0]`, the frames being in a native planar
    /// format that has no channel axis).
    pub fn shape(&self) -> [usize; 4] {
        match self {
            Output::Sampled { decoded, .. } => decoded.shape.dims(),
            Output::AllFrames(a) => [a.frames as usize, a.height as usize, a.width as usize, 0],
        }
    }
}

/// One finished job.
#[derive(Debug)]
pub struct Outcome {
    /// Sample id.
    pub id: u64,
    /// The job's deadline.
    pub deadline: u64,
    /// The tensor, or why there is none.
    pub result: Result<Output, SampleError>,
    /// Wall seconds from the worker taking the job to its end (buffer waits excluded).
    pub seconds: f64,
    /// CPU seconds of the worker thread on the job.
    pub cpu_seconds: f64,
    /// When the worker finished it.
    pub finished: std::time::Instant,
}

/// Pool settings.
#[derive(Clone, Copy, Debug)]
pub struct PoolConfig {
    /// Decode threads.
    pub workers: usize,
    /// Most bytes of tensor buffers alive at once (in use and free).
    pub budget_bytes: usize,
    /// Preprocessing parameters.
    pub params: Params,
    /// The most one decode may take ([`DEFAULT_DECODE_TIMEOUT`] by default; `None`: no limit).
    /// A decode past it fails with a reason and the sample is skipped, so one pathological file
    /// cannot hold a rank until the other ranks' watchdog ends the job.
    pub decode_timeout: Option<std::time::Duration>,
}

/// [`PoolConfig::decode_timeout`]'s default: 60 s, far above any sample of the benchmarks
/// (a second at most) and well below the collectives' watchdog (300 s).
pub const DEFAULT_DECODE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            workers: 1,
            budget_bytes: 256 << 20,
            params: Params::default(),
            decode_timeout: Some(DEFAULT_DECODE_TIMEOUT),
        }
    }
}

struct Buffers {
    budget: usize,
    state: Mutex<BufState>,
    returned: Condvar,
}

struct BufState {
    free: Vec<Vec<u8>>,
    /// Capacity of every live buffer, free or in use.
    allocated: usize,
    /// Bytes held outside the pool's buffers that count in its budget: tensors received from
    /// other ranks ([`Pool::charge`]). They are never waited for (they arrive in a collective);
    /// decodes wait for them instead, except those the caller waits for ([`Pool::exempt_below`]).
    charged: usize,
    /// Jobs with deadlines below this are not held back by `charged` bytes.
    exempt_below: u64,
    /// Bytes of FFmpeg working memory held by running decodes ([`Reservation`]s): the only
    /// part of `allocated` that comes back without the caller taking tensors.
    reserved: usize,
    /// Times a decode the caller waits for went past the budget ([`BufState::must_overdraw`]).
    overdrafts: u64,
    closed: bool,
}

impl BufState {
    /// The budget a job of `deadline` finds taken: the pool's buffers, and the charged bytes
    /// unless it is exempt.
    fn taken_for(&self, deadline: u64) -> usize {
        self.allocated + if deadline < self.exempt_below { 0 } else { self.charged }
    }

    /// Whether a job of `deadline` that does not fit must go past the budget rather than wait:
    /// the caller waits for it (it is exempt), and no other decode holds working memory
    /// (`others_reserved` is 0), so only tensors the caller holds take the budget — they come
    /// back once the caller has this job's batch, which waits for this job. The batches the
    /// caller waits for need more than the whole budget; going past it ends the wait.
    fn must_overdraw(&self, deadline: u64, others_reserved: usize) -> bool {
        deadline < self.exempt_below && others_reserved == 0
    }

    /// Drops every free buffer (before going past the budget: they would only add to it).
    fn drop_free(&mut self) {
        let free: usize = self.free.drain(..).map(|b| b.capacity()).sum();
        self.allocated -= free;
        self.overdrafts += 1;
    }
}

impl Buffers {
    /// Empty buffers of `budget` bytes in all.
    fn new(budget: usize) -> Buffers {
        let state = BufState {
            free: Vec::new(),
            allocated: 0,
            charged: 0,
            exempt_below: 0,
            reserved: 0,
            overdrafts: 0,
            closed: false,
        };
        Buffers { budget, state: Mutex::new(state), returned: Condvar::new() }
    }

    fn lock(&self) -> MutexGuard<'_, BufState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `bytes` of the budget for a job of `deadline`, waiting until they fit. `None` when
    /// the pool is shutting down.
    fn reserve(self: &Arc<Self>, bytes: usize, deadline: u64) -> Option<Reservation> {
        let mut st = self.lock();
        loop {
            if st.closed {
                return None;
            }
            let charged = st.taken_for(deadline) - st.allocated;
            let fits = self.make_room(&mut st, bytes + charged);
            if fits || st.must_overdraw(deadline, st.reserved) {
                if !fits {
                    st.drop_free();
                }
                st.allocated += bytes;
                st.reserved += bytes;
                return Some(Reservation { bytes, pool: Arc::clone(self) });
            }
            st = self.returned.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A buffer of `len` bytes and, in the same wait, `working` bytes of the budget held for
    /// FFmpeg's own memory while the decode runs (released when the returned [`Reservation`]
    /// drops), for a worker that already holds `held` of it. While it must wait, it gives `held`
    /// back and waits for the whole amount: a worker holding part of what it needs while it
    /// waits for the rest could starve another doing the same. `None` when the pool is
    /// shutting down.
    fn acquire_with_held(
        self: &Arc<Self>,
        len: usize,
        working: usize,
        mut held: Reservation,
        deadline: u64,
    ) -> Option<(Vec<u8>, Reservation)> {
        let mut st = self.lock();
        loop {
            if st.closed {
                return None;
            }
            let more = working.saturating_sub(held.bytes);
            let charged = st.taken_for(deadline) - st.allocated;
            let mut got = self.take(&mut st, len, more + charged);
            if got.is_none() && st.must_overdraw(deadline, st.reserved - held.bytes) {
                st.drop_free();
                let b = vec![0u8; len];
                st.allocated += b.capacity();
                got = Some(b);
            }
            if let Some(b) = got {
                st.allocated += more;
                st.reserved += more;
                held.bytes += more;
                return Some((b, held));
            }
            let given_back = std::mem::take(&mut held.bytes);
            st.allocated -= given_back;
            st.reserved -= given_back;
            self.returned.notify_all();
            st = self.returned.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A buffer of `len` bytes if it fits beside `extra` more bytes of the budget: the best
    /// fitting free buffer, or a new one after dropping free buffers, largest first.
    fn take(&self, st: &mut BufState, len: usize, extra: usize) -> Option<Vec<u8>> {
        let best = (0..st.free.len())
            .filter(|&i| st.free[i].capacity() >= len)
            .min_by_key(|&i| (st.free[i].capacity(), i));
        if let Some(i) = best {
            if st.allocated + extra <= self.budget {
                let mut b = st.free.swap_remove(i);
                b.clear();
                b.resize(len, 0);
                return Some(b);
            }
        }
        if self.make_room(st, len + extra) {
            let b = vec![0u8; len];
            st.allocated += b.capacity();
            return Some(b);
        }
        None
    }

    /// Whether `bytes` more fit the budget, after dropping free buffers (largest first) where
    /// that is what makes them fit. Free buffers count in `allocated` but nobody will give them
    /// back: a wait that they alone block never ends. Drops none when even dropping all would
    /// not be enough (they stay for reuse).
    fn make_room(&self, st: &mut BufState, bytes: usize) -> bool {
        let free: usize = st.free.iter().map(Vec::capacity).sum();
        if (st.allocated - free).saturating_add(bytes) > self.budget {
            return false;
        }
        while st.allocated + bytes > self.budget {
            let i = (0..st.free.len()).max_by_key(|&i| (st.free[i].capacity(), i)).unwrap_or(0);
            let b = st.free.swap_remove(i);
            st.allocated -= b.capacity();
        }
        true
    }

    /// Counts `bytes` in the budget without waiting, until the returned charge drops.
    fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        self.lock().charged += bytes;
        Charge { bytes, pool: Arc::clone(self) }
    }

    /// Lets jobs with deadlines below `deadline` go ahead of the charged bytes (never lowered).
    fn exempt_below(&self, deadline: u64) {
        let mut st = self.lock();
        if deadline > st.exempt_below {
            st.exempt_below = deadline;
            drop(st);
            self.returned.notify_all();
        }
    }

    /// Changes the state to give budget back, and wakes every waiter to look again.
    fn give_back(&self, change: impl FnOnce(&mut BufState)) {
        change(&mut self.lock());
        self.returned.notify_all();
    }

    /// A buffer of `capacity` bytes left the pool for good ([`Tensor::detach`]).
    fn forget(&self, capacity: usize) {
        self.give_back(|st| st.allocated = st.allocated.saturating_sub(capacity));
    }

    fn release(&self, buf: Vec<u8>) {
        self.give_back(|st| {
            if buf.capacity() > 0 {
                st.free.push(buf);
            }
        });
    }

    fn close(&self) {
        self.lock().closed = true;
        self.returned.notify_all();
    }
}

/// Bytes held outside the pool that count in its budget ([`Pool::charge`]); given back on drop.
pub struct Charge {
    bytes: usize,
    pool: Arc<Buffers>,
}

impl fmt::Debug for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Charge({} bytes)", self.bytes)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.pool.give_back(|st| st.charged = st.charged.saturating_sub(bytes));
    }
}

/// Bytes of the budget held for FFmpeg's memory during one decode; given back on drop.
struct Reservation {
    bytes: usize,
    pool: Arc<Buffers>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let bytes = self.bytes;
        self.pool.give_back(|st| {
            st.allocated = st.allocated.saturating_sub(bytes);
            st.reserved = st.reserved.saturating_sub(bytes);
        });
    }
}

struct Queued {
    key: (u64, u64, u64),
    job: Job,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.key.cmp(&o.key)
    }
}

struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

struct QueueState {
    heap: BinaryHeap<Reverse<Queued>>,
    seq: u64,
    closed: bool,
    /// Workers hold off while paused (tests use it to fill the queue before work starts).
    paused: bool,
}

/// The worker pool. Dropping it stops the workers after their current job.
pub struct Pool {
    queue: Arc<Queue>,
    buffers: Arc<Buffers>,
    results: Mutex<mpsc::Receiver<Outcome>>,
    threads: Vec<JoinHandle<()>>,
    pending: AtomicU64,
}

impl Pool {
    /// Starts `config.workers` (at least one) decode threads.
    pub fn new(config: PoolConfig) -> Pool {
        Pool::start(config, false)
    }

    /// Starts the pool paused: jobs queue up until [`Pool::resume`] (so their order is decided
    /// by deadline alone, not by submission timing).
    pub fn new_paused(config: PoolConfig) -> Pool {
        Pool::start(config, true)
    }

    fn start(config: PoolConfig, paused: bool) -> Pool {
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState { heap: BinaryHeap::new(), seq: 0, closed: false, paused }),
            ready: Condvar::new(),
        });
        let buffers = Arc::new(Buffers::new(config.budget_bytes));
        let (tx, results) = mpsc::channel();
        let threads = (0..config.workers.max(1))
            .map(|i| {
                let (q, b, tx) = (queue.clone(), buffers.clone(), tx.clone());
                std::thread::Builder::new()
                    .name(format!("dh-decode-{i}"))
                    .spawn(move || worker(q, b, tx, config.params, config.decode_timeout))
                    .expect("spawn decode worker")
            })
            .collect();
        Pool { queue, buffers, results: Mutex::new(results), threads, pending: AtomicU64::new(0) }
    }

    /// Lets a paused pool's workers start.
    pub fn resume(&self) {
        self.queue.state.lock().unwrap_or_else(|e| e.into_inner()).paused = false;
        self.queue.ready.notify_all();
    }

    /// Queues a job.
    pub fn submit(&self, job: Job) {
        let mut st = self.queue.state.lock().unwrap_or_else(|e| e.into_inner());
        let seq = st.seq;
        st.seq += 1;
        st.heap.push(Reverse(Queued { key: (job.deadline, job.id, seq), job }));
        drop(st);
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.queue.ready.notify_one();
    }

    /// The next finished job, waiting for it; `None` when every submitted job has been returned.
    pub fn recv(&self) -> Option<Outcome> {
        if self.pending.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let o = self.results.lock().unwrap_or_else(|e| e.into_inner()).recv().ok()?;
        self.pending.fetch_sub(1, Ordering::SeqCst);
        Some(o)
    }

    /// The next finished job, waiting at most `limit` for it; `None` when none came by then or
    /// every submitted job has been returned.
    pub fn recv_timeout(&self, limit: std::time::Duration) -> Option<Outcome> {
        if self.pending.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let o = self.results.lock().unwrap_or_else(|e| e.into_inner()).recv_timeout(limit).ok()?;
        self.pending.fetch_sub(1, Ordering::SeqCst);
        Some(o)
    }

    /// Whether every submitted job has been returned ([`Pool::recv`] would return `None`).
    pub fn is_idle(&self) -> bool {
        self.pending.load(Ordering::SeqCst) == 0
    }

    /// A finished job if one is waiting, without blocking.
    pub fn try_recv(&self) -> Option<Outcome> {
        let o = self.results.lock().unwrap_or_else(|e| e.into_inner()).try_recv().ok()?;
        self.pending.fetch_sub(1, Ordering::SeqCst);
        Some(o)
    }

    /// The byte budget.
    pub fn budget_bytes(&self) -> usize {
        self.buffers.budget
    }

    /// Counts `bytes` held elsewhere — a tensor received from another rank — in the byte
    /// budget until the returned [`Charge`] drops. Never waits (what arrives in a collective
    /// cannot be refused there): decodes wait for the budget instead, except those whose
    /// deadlines are below [`Pool::exempt_below`].
    ///
    /// ```
    /// use datahelix::decode::pool::{Pool, PoolConfig};
    ///
    /// let pool = Pool::new(PoolConfig { workers: 1, budget_bytes: 1 << 20, ..PoolConfig::default() });
    /// let received = pool.charge(3 << 20); // three times the budget: counted, not refused
    /// assert_eq!(pool.charged_bytes(), 3 << 20);
    /// drop(received);
    /// assert_eq!(pool.charged_bytes(), 0);
    /// ```
    pub fn charge(&self, bytes: usize) -> Charge {
        self.buffers.charge(bytes)
    }

    /// Bytes charged now ([`Pool::charge`]).
    pub fn charged_bytes(&self) -> usize {
        self.buffers.lock().charged
    }

    /// Times a decode the caller waited for went past the byte budget, because the tensors the
    /// caller held took all of it: the budget is smaller than the batches it waits for.
    pub fn overdrafts(&self) -> u64 {
        self.buffers.lock().overdrafts
    }

    /// Jobs with deadlines below `deadline` go ahead of the charged bytes: the jobs the caller
    /// waits for, so that a decode never waits for bytes only the caller's progress frees (the
    /// loader passes the step it is about to wait for). Never lowered.
    pub fn exempt_below(&self, deadline: u64) {
        self.buffers.exempt_below(deadline);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.queue.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.queue.ready.notify_all();
        self.buffers.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn worker(
    queue: Arc<Queue>,
    buffers: Arc<Buffers>,
    tx: mpsc::Sender<Outcome>,
    params: Params,
    timeout: Option<std::time::Duration>,
) {
    loop {
        let job = {
            let mut st = queue.state.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if st.closed {
                    return;
                }
                if !st.paused {
                    if let Some(Reverse(q)) = st.heap.pop() {
                        break q.job;
                    }
                }
                st = queue.ready.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        };
        let (id, deadline, path) = (job.id, job.deadline, job.path.clone());
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_job(&job, &buffers, &params, timeout)
        }));
        let (result, seconds, cpu_seconds) = match run {
            Ok(Some(r)) => r,
            Ok(None) => return, // shutting down
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                (Err(Failure::Panicked(msg)), 0.0, 0.0)
            }
        };
        let result = result.map_err(|reason| SampleError { id, path, reason });
        let finished = std::time::Instant::now();
        if tx.send(Outcome { id, deadline, result, seconds, cpu_seconds, finished }).is_err() {
            return;
        }
    }
}

/// Checks the file against its descriptor (present, same size, same modification time) and
/// says what to open: the file, and the part of it when the job's path names a member of a
/// tar or zip shard ([`MemberPath`]: the shard is checked, and the member must lie inside it).
pub fn check_file(job: &Job) -> Result<(PathBuf, Option<Part>), Failure> {
    let member = job.beneath.as_ref().and_then(|(_, rel)| MemberPath::parse(rel));
    let path = match &job.beneath {
        Some((root, rel)) => crate::probe::resolve_beneath(root, member.map_or(rel.as_str(), |m| m.shard))
            .map_err(Failure::Refused)?,
        None => job.path.clone(),
    };
    let meta = std::fs::metadata(&path).map_err(Failure::Missing)?;
    let part = member.map(|m| m.part);
    if let Some(r) = part.map(|p| p.range) {
        if r.end().is_none_or(|e| e > meta.len()) {
            return Err(Failure::Changed(format!(
                "the shard is {} bytes, the member the index names ends at byte {}",
                meta.len(),
                r.offset.saturating_add(r.len)
            )));
        }
    }
    if let Some(d) = &job.descriptor {
        let len = part.map_or(meta.len(), |p| p.bytes());
        if d.bytes != 0 && len != d.bytes {
            return Err(Failure::Changed(format!("{len} bytes, index says {}", d.bytes)));
        }
        if d.mtime_ns != 0 {
            let m = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|t| t.as_nanos() as i64);
            if let Some(m) = m {
                if m != d.mtime_ns {
                    return Err(Failure::Changed(format!("modified at {m} ns, index says {}", d.mtime_ns)));
                }
            }
        }
    }
    Ok((path, part))
}

type JobResult = (Result<Output, Failure>, f64, f64);

/// [`Decoder::working_bytes`] reckoned from the index's descriptor alone, before FFmpeg opens
/// the file: a picture at three bytes a pixel (a video decoder holds at least three of at least
/// 1.5 bytes a pixel) and an image's whole file, twice, as its packet.
fn index_working_bytes(d: &crate::descriptor::Descriptor) -> usize {
    let picture = (d.width as usize).saturating_mul(d.height as usize).saturating_mul(3);
    match d.modality {
        crate::descriptor::Modality::Image => picture.saturating_add((d.bytes as usize).saturating_mul(2)),
        _ => picture,
    }
}

fn run_job(
    job: &Job,
    buffers: &Arc<Buffers>,
    params: &Params,
    timeout: Option<std::time::Duration>,
) -> Option<JobResult> {
    let (t0, c0) = (Instant::now(), thread_cpu_seconds());
    let mut waited = 0.0;
    let result = (|| -> Result<Option<Output>, Failure> {
        let (path, part) = check_file(job)?;
        // FFmpeg's memory as the index reckons it is held before FFmpeg opens the file (probing
        // an image decodes it whole), with a deflated member's inflated bytes; a sample that
        // cannot fit is refused unread.
        let inflated = part.map_or(0, |p| usize::try_from(p.inflated_bytes()).unwrap_or(usize::MAX));
        let least = job.descriptor.as_ref().map_or(0, index_working_bytes).saturating_add(inflated);
        if least > buffers.budget {
            return Err(Failure::TooLarge { need: 0, working: least, budget: buffers.budget });
        }
        let w0 = Instant::now();
        let Some(held) = buffers.reserve(least, job.deadline) else { return Ok(None) };
        waited += w0.elapsed().as_secs_f64();
        // FFmpeg refuses any picture that could not fit the whole budget as 8-bit RGB.
        let mut dec = Decoder::open_part_within(&path, part, Some(buffers.budget as u64 / 3))?;
        if let Some(t) = timeout {
            dec.set_deadline(t);
        }
        let working = dec.working_bytes().saturating_add(inflated).max(least);
        if job.mode == Mode::AllFrames {
            if working > buffers.budget {
                return Err(Failure::TooLarge { need: 0, working, budget: buffers.budget });
            }
            let w0 = Instant::now();
            let Some((buf, reservation)) = buffers.acquire_with_held(0, working, held, job.deadline) else {
                return Ok(None);
            };
            waited += w0.elapsed().as_secs_f64();
            let all = dec.decode_all_frames();
            drop((reservation, buf));
            return Ok(Some(Output::AllFrames(all?)));
        }
        let shape = dec.shape(params)?;
        let range = job.frames.unwrap_or(FrameRange::whole(shape.frames));
        if range.is_empty() || range.end > shape.frames {
            let (start, end, frames) = (range.start, range.end, shape.frames);
            return Err(DecodeError::BadRange { start, end, frames }.into());
        }
        let need = range.len() as usize * shape.frame_bytes();
        if need.saturating_add(working) > buffers.budget {
            return Err(Failure::TooLarge { need, working, budget: buffers.budget });
        }
        let strategy = job.strategy.unwrap_or_else(|| match &job.descriptor {
            Some(d) => Strategy::for_range(d, params, range),
            None => Strategy::Scan,
        });
        let w0 = Instant::now();
        let Some((mut buf, reservation)) = buffers.acquire_with_held(need, working, held, job.deadline)
        else {
            return Ok(None);
        };
        waited += w0.elapsed().as_secs_f64();
        let decoded = dec.decode_range_into(params, strategy, range, &mut buf);
        drop(reservation);
        match decoded {
            Ok(decoded) => {
                Ok(Some(Output::Sampled { tensor: Tensor { buf, pool: buffers.clone() }, decoded }))
            }
            Err(e) => {
                buffers.release(buf);
                Err(e.into())
            }
        }
    })();
    let seconds = (t0.elapsed().as_secs_f64() - waited).max(0.0);
    let cpu = (thread_cpu_seconds() - c0).max(0.0);
    match result {
        Ok(Some(o)) => Some((Ok(o), seconds, cpu)),
        Ok(None) => None,
        Err(e) => Some((Err(e), seconds, cpu)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffers(budget: usize) -> Arc<Buffers> {
        Arc::new(Buffers::new(budget))
    }

    impl Buffers {
        fn acquire(self: &Arc<Self>, len: usize) -> Option<Vec<u8>> {
            self.acquire_with(len, 0).map(|(b, _)| b)
        }

        fn acquire_with(self: &Arc<Self>, len: usize, working: usize) -> Option<(Vec<u8>, Reservation)> {
            self.acquire_at(len, working, 1 << 32)
        }

        /// For a job of `deadline` (step 1 unless said).
        fn acquire_at(
            self: &Arc<Self>,
            len: usize,
            working: usize,
            deadline: u64,
        ) -> Option<(Vec<u8>, Reservation)> {
            self.acquire_with_held(len, working, Reservation { bytes: 0, pool: Arc::clone(self) }, deadline)
        }
    }

    /// Received tensors count in the budget (issue 18): a decode of a later step waits while
    /// they hold it, one the caller waits for goes ahead, and neither waits for a charge.
    #[test]
    fn received_bytes_hold_back_decodes_except_those_waited_for() {
        let b = buffers(300);
        let received = b.charge(250); // never waits, even past the budget
        let more = b.charge(100);
        assert_eq!(b.lock().charged, 350);
        drop(more);
        let step = |t: u64| t << 32;
        let later = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.acquire_at(100, 0, step(3)).map(|(x, _)| x.len()))
        };
        let now = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.acquire_at(100, 0, step(2)).map(|(x, _)| x.len()))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!later.is_finished() && !now.is_finished(), "250 received + 100 > 300: both wait");
        b.exempt_below(step(3)); // the loader now waits for step 2
        assert_eq!(now.join().unwrap(), Some(100), "a decode the caller waits for goes ahead");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!later.is_finished(), "a later step's decode still waits for the received bytes");
        drop(received);
        assert_eq!(later.join().unwrap(), Some(100), "and goes once they are delivered");
        b.exempt_below(step(1));
        assert_eq!(b.lock().exempt_below, step(3), "never lowered");
    }

    /// A decode the caller waits for, blocked only by tensors the caller holds (no decode
    /// running that could give bytes back), goes past the budget instead of waiting forever;
    /// one of a later step still waits, and one blocked by a running decode waits for it.
    #[test]
    fn a_waited_for_decode_blocked_only_by_held_tensors_goes_past_the_budget() {
        let b = buffers(300);
        let step = |t: u64| t << 32;
        let (held, _) = b.acquire_at(250, 0, step(2)).unwrap(); // a decoded tensor the caller holds
        b.exempt_below(step(3)); // the caller waits for step 2
        let later = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.acquire_at(100, 0, step(3)).map(|(x, _)| x.len()))
        };
        let (now, _) = b.acquire_at(100, 0, step(2)).expect("past the budget, not a wait");
        let (allocated, overdrafts) = {
            let st = b.lock();
            (st.allocated, st.overdrafts)
        };
        assert_eq!((now.len(), allocated, overdrafts), (100, 350, 1));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!later.is_finished(), "a later step's decode waits for the budget");
        b.release(held); // the caller took its batch
        b.release(now);
        assert_eq!(later.join().unwrap(), Some(100));

        // A running decode's working memory comes back by itself: wait for it instead.
        let b = buffers(300);
        let (_tensor, _) = b.acquire_at(150, 0, step(2)).unwrap();
        let running = b.reserve(100, step(2)).unwrap();
        b.exempt_below(step(3));
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.acquire_at(100, 0, step(2)).map(|(x, _)| x.len()))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "100 reserved by a running decode: it comes back");
        drop(running);
        assert_eq!(waiter.join().unwrap(), Some(100));
        assert_eq!(b.lock().overdrafts, 0);
    }

    #[test]
    fn buffers_are_reused_and_evicted_within_the_budget() {
        let b = buffers(250);
        let x = b.acquire(100).unwrap();
        assert_eq!(x.len(), 100);
        b.release(x);
        let y = b.acquire(50).unwrap();
        assert_eq!((y.len(), b.lock().allocated), (50, 100), "reused, not reallocated");
        b.release(y);
        // 100 free + 200 new > 250: the free buffer is dropped to make room.
        let z = b.acquire(200).unwrap();
        assert_eq!(b.lock().allocated, 200);
        assert!(b.lock().free.is_empty());
        b.close();
        assert!(b.acquire(100).is_none(), "closed pools hand out nothing");
        drop(z);
    }

    /// Free buffers count in the budget until dropped: a decode's FFmpeg memory, reserved
    /// before its buffer, must drop them too. It waited for ever once (a 4-rank run at 4 MiB:
    /// one worker, its step's decode blocked by buffers of tensors already delivered).
    #[test]
    fn reserving_working_memory_drops_free_buffers_that_hold_the_budget() {
        let b = buffers(250);
        let (x, y) = (b.acquire(100).unwrap(), b.acquire(100).unwrap());
        b.release(x);
        b.release(y);
        let reserving = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.reserve(200, 1 << 32))
        };
        let t0 = Instant::now();
        while !reserving.is_finished() && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(reserving.is_finished(), "200 bytes wait for ever behind 200 bytes of free buffers");
        let held = reserving.join().unwrap().expect("two free buffers dropped make room");
        let st = b.lock();
        assert_eq!((st.allocated, st.free.len()), (200, 0));
        drop(st);
        drop(held);
        let z = b.acquire(100).unwrap();
        b.release(z);
        let _received = b.charge(200);
        // 100 free + 200 charged + 100 > 250, and dropping the free buffer would not be enough:
        // it stays for reuse while the reservation waits.
        let waiting = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.reserve(100, 1 << 32).map(|r| r.bytes))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiting.is_finished());
        assert_eq!(b.lock().free.len(), 1, "not dropped in vain");
        drop(_received);
        assert_eq!(waiting.join().unwrap(), Some(100));
    }

    #[test]
    fn ffmpeg_memory_is_held_in_the_budget_for_the_decode_and_given_back() {
        let b = buffers(300);
        let (out, working) = b.acquire_with(100, 150).unwrap();
        assert_eq!(b.lock().allocated, 250, "the tensor and FFmpeg's share");
        // 100 more does not fit beside them: the waiter gets it once the decode ends.
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.acquire_with(100, 0).map(|(x, _)| x.len()))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the budget is spent while the decode runs");
        drop(working);
        assert_eq!(waiter.join().unwrap(), Some(100));
        assert_eq!(b.lock().allocated, 200, "FFmpeg's share given back, the tensors kept");
        drop(out);
    }

    #[test]
    fn a_detached_tensor_leaves_the_budget_and_keeps_its_bytes() {
        let b = buffers(150);
        let mut buf = b.acquire(100).unwrap();
        buf.fill(7);
        let kept = Tensor { buf, pool: Arc::clone(&b) }.detach();
        assert_eq!(b.lock().allocated, 0, "the detached buffer no longer counts");
        // The budget is free again while the detached bytes live on (no wait here).
        let again = b.acquire(100).unwrap();
        assert_eq!(b.lock().allocated, 100);
        assert!(kept.len() == 100 && kept.iter().all(|&x| x == 7));
        b.release(again);
        drop(kept);
        assert_eq!(b.lock().free.len(), 1, "only the pooled buffer returned");
    }
}
