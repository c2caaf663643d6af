//! The thin safe layer over the MPI C API (`mpi::ffi`, i.e. `mpi-sys`): it owns every `unsafe` of
//! the MPI backend and maps every return code through [`check`]. Above it, `comm::mpi` builds the
//! `Collective` implementation and the watchdog without any `unsafe`.
//!
//! Two traps of the C API are handled here and nowhere else:
//! - An empty Rust slice's pointer is dangling (`0x1` for bytes), and Open MPI defines
//!   `MPI_IN_PLACE` as `(void *) 1`: an empty send buffer would silently become an in-place
//!   operation. Every buffer pointer goes through [`send_ptr`] / `Pending::recv_ptr`, which
//!   substitute a real (unused) scratch allocation for empty slices.
//! - Counts and displacements are C `int`: [`to_c_int`] refuses anything beyond `i32::MAX`; the
//!   caller chunks (point-to-point messages of at most `max_message` bytes).
//!
//! Non-blocking operations (MPI-3.1 §5.12) borrow their buffers and count arrays until they
//! complete. [`Pending`] ties them to its lifetime and owns the count arrays; dropping an
//! incomplete [`Pending`] aborts the job, because MPI could otherwise write into freed memory.

use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::marker::PhantomData;

use mpi::ffi;

/// A raw communicator handle (`MPI_Comm`).
pub type RawComm = ffi::MPI_Comm;

/// A communicator the caller owns and vouches for: the one point where a handle from outside
/// (C's `MPI_Comm`, an rsmpi communicator) is trusted. [`OwnedComm::start_dup_caller`] duplicates it;
/// the caller's handle is never freed here.
#[derive(Clone, Copy, Debug)]
pub struct CallerComm(RawComm);

impl CallerComm {
    /// Trusts `raw`.
    ///
    /// # Safety
    /// MPI is initialised and not finalised, and `raw` is `MPI_COMM_NULL` or a communicator
    /// handle of this process, valid until the duplicate [`OwnedComm::start_dup_caller`] starts has completed.
    pub unsafe fn new(raw: RawComm) -> CallerComm {
        CallerComm(raw)
    }

    /// The communicator of an rsmpi object (valid while it lives; rsmpi exists only while MPI
    /// is initialised).
    pub fn of_rsmpi(comm: &impl mpi::raw::AsRaw<Raw = RawComm>) -> CallerComm {
        CallerComm(comm.as_raw())
    }
}

/// What [`OwnedComm::start_dup_caller`] refuses.
#[derive(Debug, thiserror::Error)]
pub enum CallerCommError {
    /// `MPI_COMM_NULL`.
    #[error("the communicator is MPI_COMM_NULL (a rank outside the group of an MPI_Comm_split with MPI_UNDEFINED?)")]
    Null,
    /// An inter-communicator.
    #[error("the communicator is an inter-communicator; pass an intra-communicator (MPI_Intercomm_merge)")]
    Inter,
    /// MPI rejected it.
    #[error(transparent)]
    Mpi(#[from] MpiError),
}

/// What an MPI error code means, for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MpiErrorKind {
    /// A message was longer than the receive buffer (`MPI_ERR_TRUNCATE`): ranks disagree on sizes
    /// or issued different collectives.
    Truncate,
    /// A count, rank, root or buffer argument was rejected.
    Argument,
    /// Anything else (network failure, internal error).
    Other,
}

/// A non-`MPI_SUCCESS` return code and the call that returned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MpiError {
    /// The MPI function.
    pub call: &'static str,
    /// The return code.
    pub code: i32,
}

impl MpiError {
    /// The error class of the code (`MPI_Error_class`).
    pub fn class(&self) -> i32 {
        let mut class: c_int = 0;
        // SAFETY: MPI_Error_class only writes the class into the provided int.
        let ret = unsafe { ffi::MPI_Error_class(self.code, &mut class) };
        if ret == ffi::MPI_SUCCESS as c_int {
            class
        } else {
            self.code
        }
    }

    /// Classifies the code.
    pub fn kind(&self) -> MpiErrorKind {
        let class = self.class() as u32;
        match class {
            ffi::MPI_ERR_TRUNCATE => MpiErrorKind::Truncate,
            ffi::MPI_ERR_COUNT
            | ffi::MPI_ERR_BUFFER
            | ffi::MPI_ERR_RANK
            | ffi::MPI_ERR_ROOT
            | ffi::MPI_ERR_ARG
            | ffi::MPI_ERR_TYPE
            | ffi::MPI_ERR_OP => MpiErrorKind::Argument,
            _ => MpiErrorKind::Other,
        }
    }

    /// The MPI library's text for the code (`MPI_Error_string`).
    pub fn message(&self) -> String {
        let mut buf = [0 as std::ffi::c_char; ffi::MPI_MAX_ERROR_STRING as usize + 1];
        let mut len: c_int = 0;
        // SAFETY: MPI_Error_string writes at most MPI_MAX_ERROR_STRING characters plus a NUL into
        // buf, which is one longer than that, and the length into len.
        let ret = unsafe { ffi::MPI_Error_string(self.code, buf.as_mut_ptr(), &mut len) };
        if ret != ffi::MPI_SUCCESS as c_int {
            return format!("unknown MPI error {}", self.code);
        }
        // SAFETY: on success the buffer holds a NUL-terminated string (the array was zeroed and
        // is longer than the longest string MPI writes).
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }
}

impl fmt::Display for MpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} (code {})", self.call, self.message(), self.code)
    }
}

impl std::error::Error for MpiError {}

/// Maps an MPI return code: `MPI_SUCCESS` is `Ok`, anything else an error naming `call`.
pub fn check(ret: c_int, call: &'static str) -> Result<(), MpiError> {
    if ret == ffi::MPI_SUCCESS as c_int {
        Ok(())
    } else {
        Err(MpiError { call, code: ret })
    }
}

/// Converts a byte count or displacement to a C `int`, or says which one is too large.
pub fn to_c_int(v: usize, call: &'static str) -> Result<c_int, MpiError> {
    c_int::try_from(v).map_err(|_| MpiError { call, code: ffi::MPI_ERR_COUNT as i32 })
}

fn to_c_ints(v: &[usize], call: &'static str) -> Result<Vec<c_int>, MpiError> {
    v.iter().map(|&x| to_c_int(x, call)).collect()
}

/// Scratch that stands in for an empty buffer: a real, aligned allocation MPI may be pointed at
/// (and never reads or writes, since the counts are zero).
#[repr(align(16))]
struct Scratch([u8; 16]);

static SEND_SCRATCH: Scratch = Scratch([0; 16]);

/// A pointer MPI may read `buf.len()` bytes from; never the dangling pointer of an empty slice.
pub fn send_ptr<T>(buf: &[T]) -> *const c_void {
    if buf.is_empty() {
        SEND_SCRATCH.0.as_ptr().cast()
    } else {
        buf.as_ptr().cast()
    }
}

fn world() -> RawComm {
    // SAFETY: RSMPI_COMM_WORLD is an immutable handle initialised by mpi-sys's C shim; reading it
    // is a plain load of a constant.
    unsafe { ffi::RSMPI_COMM_WORLD }
}

fn byte_type() -> ffi::MPI_Datatype {
    // SAFETY: as for world(): a constant handle exported by mpi-sys.
    unsafe { ffi::RSMPI_UINT8_T }
}

fn u64_type() -> ffi::MPI_Datatype {
    // SAFETY: a constant handle exported by mpi-sys.
    unsafe { ffi::RSMPI_UINT64_T }
}

fn f64_type() -> ffi::MPI_Datatype {
    // SAFETY: a constant handle exported by mpi-sys.
    unsafe { ffi::RSMPI_DOUBLE }
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: a constant handle exported by mpi-sys.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

/// Element types the reductions support.
pub trait ReduceElem: Copy + Default + 'static {
    /// The MPI datatype.
    fn datatype() -> ffi::MPI_Datatype;
}
impl ReduceElem for f64 {
    fn datatype() -> ffi::MPI_Datatype {
        f64_type()
    }
}
impl ReduceElem for u64 {
    fn datatype() -> ffi::MPI_Datatype {
        u64_type()
    }
}

/// A reduction operator handle.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `MPI_SUM`.
    Sum,
    /// `MPI_MAX`.
    Max,
    /// `MPI_MIN`.
    Min,
}

impl Op {
    fn raw(self) -> ffi::MPI_Op {
        // SAFETY: constant handles exported by mpi-sys.
        unsafe {
            match self {
                Op::Sum => ffi::RSMPI_SUM,
                Op::Max => ffi::RSMPI_MAX,
                Op::Min => ffi::RSMPI_MIN,
            }
        }
    }
}

/// Whether MPI has been initialised and not yet finalised.
pub fn is_active() -> bool {
    mpi::environment::is_initialized() && !mpi::environment::is_finalized()
}

/// How long [`abort`] lets `MPI_Abort` end the process before ending it itself.
const ABORT_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Ends every process of the job with `code` (`MPI_Abort` on the world communicator).
///
/// `MPI_Abort` need not return, and need not end this process promptly either: seen here once
/// under load, a job in which one rank called it while its peer exited at the same moment
/// never ended (CI's `a_rank_failing_before_its_loader_ends_the_job_not_hangs`). So a thread
/// ends this process with `code` after `ABORT_GRACE` (10 s) whatever MPI does; the launcher then sees
/// a rank exit with an error and ends the others.
pub fn abort(code: i32) -> ! {
    if is_active() {
        std::thread::spawn(move || {
            std::thread::sleep(ABORT_GRACE);
            // SAFETY: _exit ends the process at once; nothing of this process runs after it.
            unsafe { libc::_exit(code) };
        });
        // SAFETY: MPI is initialised; MPI_Abort takes a valid communicator and an int.
        unsafe { ffi::MPI_Abort(world(), code) };
    }
    std::process::exit(code)
}

/// A communicator this process duplicated and owns (freed on drop while MPI is active), with
/// errors returned rather than fatal.
pub struct OwnedComm {
    raw: RawComm,
    rank: usize,
    size: usize,
}

impl OwnedComm {
    /// Starts duplicating the world communicator (`MPI_Comm_idup`; collective): poll the
    /// returned [`PendingDup`] until it yields the duplicate, which has `MPI_ERRORS_RETURN` set.
    pub fn start_dup_world() -> Result<PendingDup, MpiError> {
        // SAFETY: MPI is initialised (the caller holds the Universe); MPI_COMM_WORLD is valid.
        unsafe { PendingDup::start(world()) }
    }

    /// Starts duplicating the caller's communicator (`MPI_Comm_idup`; the caller's is never
    /// freed here, and must stay valid until the [`PendingDup`] completes).
    pub fn start_dup_caller(of: &CallerComm) -> Result<PendingDup, CallerCommError> {
        // SAFETY: CallerComm::new's contract: MPI is up and the handle is valid or null.
        if of.0 == unsafe { ffi::RSMPI_COMM_NULL } {
            return Err(CallerCommError::Null);
        }
        let mut flag: c_int = 0;
        // SAFETY: a valid communicator (CallerComm's contract); the call writes one int.
        let ret = unsafe { ffi::MPI_Comm_test_inter(of.0, &mut flag) };
        check(ret, "MPI_Comm_test_inter")?;
        if flag != 0 {
            return Err(CallerCommError::Inter);
        }
        // SAFETY: as above.
        Ok(unsafe { PendingDup::start(of.0) }?)
    }

    /// Takes ownership of `raw`, a communicator MPI just made for us (freed on drop): sets
    /// `MPI_ERRORS_RETURN` on it and reads its rank and size.
    fn adopt(raw: RawComm) -> Result<Self, MpiError> {
        // Owned from here: dropped (freed) on any error below.
        let mut comm = OwnedComm { raw, rank: 0, size: 0 };
        // SAFETY: raw is a valid communicator; RSMPI_ERRORS_RETURN is a constant handle.
        let ret = unsafe { ffi::MPI_Comm_set_errhandler(raw, ffi::RSMPI_ERRORS_RETURN) };
        check(ret, "MPI_Comm_set_errhandler")?;
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: valid communicator; the calls write one int each.
        let ret = unsafe { ffi::MPI_Comm_rank(raw, &mut rank) };
        check(ret, "MPI_Comm_rank")?;
        // SAFETY: as above.
        let ret = unsafe { ffi::MPI_Comm_size(raw, &mut size) };
        check(ret, "MPI_Comm_size")?;
        comm.rank = rank as usize;
        comm.size = size as usize;
        Ok(comm)
    }

    /// `MPI_Comm_split` of this communicator: the processes that pass the same `color` form one
    /// new communicator, ordered by `key` then by rank here; `None` as color takes no part
    /// (`MPI_UNDEFINED`) and gets `None` back. Collective over this communicator.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<OwnedComm>, MpiError> {
        let color = match color {
            // SAFETY: reads a constant mpi-sys exports.
            None => unsafe { ffi::RSMPI_UNDEFINED },
            Some(c) => to_c_int(c as usize, "MPI_Comm_split")?,
        };
        let mut raw = std::mem::MaybeUninit::<RawComm>::uninit();
        // SAFETY: self.raw is a valid communicator; MPI_Comm_split writes the new handle (or
        // MPI_COMM_NULL) into raw on success, which check() confirms before raw is read.
        let ret = unsafe {
            ffi::MPI_Comm_split(self.raw, color, to_c_int(key as usize, "MPI_Comm_split")?, raw.as_mut_ptr())
        };
        check(ret, "MPI_Comm_split")?;
        // SAFETY: initialised by the successful call above.
        let raw = unsafe { raw.assume_init() };
        // SAFETY: reads a constant handle mpi-sys exports.
        if raw == unsafe { ffi::RSMPI_COMM_NULL } {
            return Ok(None);
        }
        Self::adopt(raw).map(Some)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// `MPI_Iprobe` for a message with `tag` from any source: its source and length in `u64`s.
    pub fn iprobe(&self, tag: i32) -> Result<Option<(usize, usize)>, MpiError> {
        let mut flag: c_int = 0;
        let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::zeroed();
        // SAFETY: valid communicator; flag and status are writable locals.
        let ret =
            unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, tag, self.raw, &mut flag, status.as_mut_ptr()) };
        check(ret, "MPI_Iprobe")?;
        if flag == 0 {
            return Ok(None);
        }
        // SAFETY: zero-initialised and, with flag set, filled by MPI_Iprobe.
        let status = unsafe { status.assume_init() };
        let mut count: c_int = 0;
        // SAFETY: status describes a matched message; count is a writable local.
        let ret = unsafe { ffi::MPI_Get_count(&status, u64_type(), &mut count) };
        check(ret, "MPI_Get_count")?;
        Ok(Some((status.MPI_SOURCE as usize, count.max(0) as usize)))
    }

    /// Receives a message of at most `max` `u64`s from `source` with `tag` that [`Self::iprobe`]
    /// reported (so the call does not block).
    pub fn recv_u64s(&self, source: usize, tag: i32, max: usize) -> Result<Vec<u64>, MpiError> {
        let mut buf = vec![0u64; max.max(1)];
        let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::zeroed();
        let n = to_c_int(buf.len(), "MPI_Recv")?;
        // SAFETY: buf has room for n u64s; source/tag/communicator are valid; status is writable.
        let ret = unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                n,
                u64_type(),
                source as c_int,
                tag,
                self.raw,
                status.as_mut_ptr(),
            )
        };
        check(ret, "MPI_Recv")?;
        // SAFETY: filled by the successful MPI_Recv.
        let status = unsafe { status.assume_init() };
        let mut count: c_int = 0;
        // SAFETY: as in iprobe.
        let ret = unsafe { ffi::MPI_Get_count(&status, u64_type(), &mut count) };
        check(ret, "MPI_Get_count")?;
        buf.truncate(count.max(0) as usize);
        Ok(buf)
    }

    /// Starts sending `data` to `dest` with `tag`; the returned [`Pending`] owns the buffer.
    pub fn isend_owned(&self, dest: usize, tag: i32, data: Vec<u64>) -> Result<Pending<'static>, MpiError> {
        let mut p = Pending::new();
        let n = to_c_int(data.len(), "MPI_Isend")?;
        let ptr = send_ptr(&data);
        p.owned.push(Owned::U64(data));
        let mut req = null_request();
        // SAFETY: ptr points into a Vec now owned by p (its heap buffer does not move), which
        // keeps it alive until the request completes (Pending's contract).
        let ret = unsafe { ffi::MPI_Isend(ptr, n, u64_type(), dest as c_int, tag, self.raw, &mut req) };
        check(ret, "MPI_Isend")?;
        p.push(req);
        Ok(p)
    }

    /// Starts `MPI_Iallgather` of `send.len()` bytes per rank into `recv`.
    pub fn iallgather<'b>(&self, send: &'b [u8], recv: &'b mut [u8]) -> Result<Pending<'b>, MpiError> {
        const CALL: &str = "MPI_Iallgather";
        if send.len().checked_mul(self.size) != Some(recv.len()) {
            return Err(MpiError { call: CALL, code: ffi::MPI_ERR_COUNT as i32 });
        }
        let n = to_c_int(send.len(), CALL)?;
        let mut p = Pending::new();
        let rptr = p.recv_ptr(recv);
        let mut req = null_request();
        // SAFETY: recv holds size × n bytes (checked above); buffers outlive the request ('b).
        let ret = unsafe {
            ffi::MPI_Iallgather(send_ptr(send), n, byte_type(), rptr, n, byte_type(), self.raw, &mut req)
        };
        check(ret, CALL)?;
        p.push(req);
        Ok(p)
    }

    /// Starts `MPI_Iallgatherv` of bytes.
    pub fn iallgatherv<'b>(
        &self,
        send: &'b [u8],
        counts: &[usize],
        displs: &[usize],
        recv: &'b mut [u8],
    ) -> Result<Pending<'b>, MpiError> {
        const CALL: &str = "MPI_Iallgatherv";
        self.check_ranges(recv.len(), counts, displs, CALL)?;
        if counts[self.rank] != send.len() {
            return Err(MpiError { call: CALL, code: ffi::MPI_ERR_COUNT as i32 });
        }
        let n = to_c_int(send.len(), CALL)?;
        let arrays = [to_c_ints(counts, CALL)?, to_c_ints(displs, CALL)?];
        let mut p = Pending::new();
        let rptr = p.recv_ptr(recv);
        let mut req = null_request();
        // SAFETY: ranges checked to lie in recv; buffers outlive the request; count arrays move
        // into p.
        let ret = unsafe {
            ffi::MPI_Iallgatherv(
                send_ptr(send),
                n,
                byte_type(),
                rptr,
                arrays[0].as_ptr(),
                arrays[1].as_ptr(),
                byte_type(),
                self.raw,
                &mut req,
            )
        };
        check(ret, CALL)?;
        p.owned_ints.extend(arrays);
        p.push(req);
        Ok(p)
    }

    /// Starts `MPI_Iallreduce` of `data` into itself (through a private copy of the input, so no
    /// `MPI_IN_PLACE` is involved).
    pub fn iallreduce<'b, T: ReduceElem>(&self, data: &'b mut [T], op: Op) -> Result<Pending<'b>, MpiError>
    where
        Vec<T>: Into<Owned>,
    {
        const CALL: &str = "MPI_Iallreduce";
        let n = to_c_int(data.len(), CALL)?;
        let input: Vec<T> = data.to_vec();
        let sptr = send_ptr(&input);
        let mut p = Pending::new();
        let rptr = p.recv_ptr(data);
        p.owned.push(input.into());
        let mut req = null_request();
        // SAFETY: input (moved into p, heap buffer unmoved) and data hold n elements of T, whose
        // MPI datatype is T::datatype(); both outlive the request.
        let ret = unsafe { ffi::MPI_Iallreduce(sptr, rptr, n, T::datatype(), op.raw(), self.raw, &mut req) };
        check(ret, CALL)?;
        p.push(req);
        Ok(p)
    }

    /// Starts `MPI_Ibcast` of bytes from `root`.
    pub fn ibcast<'b>(&self, root: usize, data: &'b mut [u8]) -> Result<Pending<'b>, MpiError> {
        const CALL: &str = "MPI_Ibcast";
        if root >= self.size {
            return Err(MpiError { call: CALL, code: ffi::MPI_ERR_ROOT as i32 });
        }
        let n = to_c_int(data.len(), CALL)?;
        let mut p = Pending::new();
        let ptr = p.recv_ptr(data);
        let mut req = null_request();
        // SAFETY: data holds n bytes and outlives the request.
        let ret = unsafe { ffi::MPI_Ibcast(ptr, n, byte_type(), root as c_int, self.raw, &mut req) };
        check(ret, CALL)?;
        p.push(req);
        Ok(p)
    }

    /// Starts `MPI_Ibarrier`.
    pub fn ibarrier(&self) -> Result<Pending<'static>, MpiError> {
        let mut p = Pending::new();
        let mut req = null_request();
        // SAFETY: valid communicator; req is writable.
        let ret = unsafe { ffi::MPI_Ibarrier(self.raw, &mut req) };
        check(ret, "MPI_Ibarrier")?;
        p.push(req);
        Ok(p)
    }

    /// Starts a point-to-point exchange: for each `(peer, offset, len)` of `sends`, `len` bytes of
    /// `send` go to `peer`; for each of `recvs`, `len` bytes from `peer` land at `offset` of
    /// `recv`. Messages longer than `max_message` bytes are split; chunks between a pair match
    /// in order (MPI's non-overtaking rule). Request `i` of the result belongs to `peer_of[i]`.
    pub fn iexchange<'b>(
        &self,
        tag: i32,
        send: &'b [u8],
        sends: &[(usize, usize, usize)],
        recv: &'b mut [u8],
        recvs: &[(usize, usize, usize)],
        max_message: usize,
    ) -> Result<(Pending<'b>, Vec<usize>), MpiError> {
        const CALL: &str = "MPI_Isend/MPI_Irecv";
        let max_message = max_message.clamp(1, i32::MAX as usize);
        let in_bounds = |len: usize, &(peer, off, n): &(usize, usize, usize)| {
            peer < self.size && off.checked_add(n).is_some_and(|e| e <= len)
        };
        if !sends.iter().all(|r| in_bounds(send.len(), r)) || !recvs.iter().all(|r| in_bounds(recv.len(), r))
        {
            return Err(MpiError { call: CALL, code: ffi::MPI_ERR_COUNT as i32 });
        }
        let mut sorted: Vec<(usize, usize)> =
            recvs.iter().map(|&(_, o, n)| (o, o + n)).filter(|r| r.1 > r.0).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err(MpiError { call: CALL, code: ffi::MPI_ERR_BUFFER as i32 });
        }
        let mut p = Pending::new();
        let mut peer_of = Vec::new();
        let rbase = recv.as_mut_ptr();
        // Receives first, so that sends find them posted.
        for &(peer, off, n) in recvs {
            let mut at = off;
            while at < off + n {
                let len = max_message.min(off + n - at);
                let mut req = null_request();
                // SAFETY: at..at+len lies inside recv (bounds checked above) and no two receive
                // ranges overlap (checked above), so MPI writes disjoint parts of a buffer borrowed
                // mutably for 'b, which outlives the request; len ≤ i32::MAX.
                let ret = unsafe {
                    ffi::MPI_Irecv(
                        rbase.add(at).cast(),
                        len as c_int,
                        byte_type(),
                        peer as c_int,
                        tag,
                        self.raw,
                        &mut req,
                    )
                };
                if let Err(e) = check(ret, "MPI_Irecv") {
                    p.cancel_all();
                    return Err(e);
                }
                p.push_recv(req, len);
                peer_of.push(peer);
                at += len;
            }
        }
        for &(peer, off, n) in sends {
            let mut at = off;
            while at < off + n {
                let len = max_message.min(off + n - at);
                let mut req = null_request();
                // SAFETY: at..at+len lies inside send, borrowed for 'b; len ≤ i32::MAX.
                let ret = unsafe {
                    ffi::MPI_Isend(
                        send.as_ptr().add(at).cast(),
                        len as c_int,
                        byte_type(),
                        peer as c_int,
                        tag,
                        self.raw,
                        &mut req,
                    )
                };
                if let Err(e) = check(ret, "MPI_Isend") {
                    p.cancel_all();
                    return Err(e);
                }
                p.push(req);
                peer_of.push(peer);
                at += len;
            }
        }
        Ok((p, peer_of))
    }

    fn check_ranges(
        &self,
        len: usize,
        counts: &[usize],
        displs: &[usize],
        call: &'static str,
    ) -> Result<(), MpiError> {
        let ok = counts.len() == self.size
            && displs.len() == self.size
            && counts.iter().zip(displs).all(|(&c, &d)| d.checked_add(c).is_some_and(|e| e <= len));
        if ok {
            Ok(())
        } else {
            Err(MpiError { call, code: ffi::MPI_ERR_COUNT as i32 })
        }
    }

    // ---- blocking calls, for the `--raw` reference of `datahelix perf` ----

    /// Blocking `MPI_Alltoallv` (the reference the layer is measured against).
    pub fn alltoallv_blocking(
        &self,
        send: &[u8],
        send_counts: &[i32],
        send_displs: &[i32],
        recv: &mut [u8],
        recv_counts: &[i32],
        recv_displs: &[i32],
    ) -> Result<(), MpiError> {
        let all_in = |len: usize, c: &[i32], d: &[i32]| {
            c.len() == self.size
                && d.len() == self.size
                && c.iter().zip(d).all(|(&c, &d)| c >= 0 && d >= 0 && (c as usize + d as usize) <= len)
        };
        if !all_in(send.len(), send_counts, send_displs) || !all_in(recv.len(), recv_counts, recv_displs) {
            return Err(MpiError { call: "MPI_Alltoallv", code: ffi::MPI_ERR_COUNT as i32 });
        }
        let mut scratch = Scratch([0; 16]);
        let rptr = if recv.is_empty() { scratch.0.as_mut_ptr() } else { recv.as_mut_ptr() };
        // SAFETY: all ranges lie inside their buffers (checked); pointers are never dangling.
        let ret = unsafe {
            ffi::MPI_Alltoallv(
                send_ptr(send),
                send_counts.as_ptr(),
                send_displs.as_ptr(),
                byte_type(),
                rptr.cast(),
                recv_counts.as_ptr(),
                recv_displs.as_ptr(),
                byte_type(),
                self.raw,
            )
        };
        check(ret, "MPI_Alltoallv")
    }

    /// Blocking `MPI_Allgather` of `send.len()` bytes per rank.
    pub fn allgather_blocking(&self, send: &[u8], recv: &mut [u8]) -> Result<(), MpiError> {
        if send.len().checked_mul(self.size) != Some(recv.len()) || recv.is_empty() {
            return Err(MpiError { call: "MPI_Allgather", code: ffi::MPI_ERR_COUNT as i32 });
        }
        let n = to_c_int(send.len(), "MPI_Allgather")?;
        // SAFETY: recv holds size × n bytes and is not empty; send holds n bytes.
        let ret = unsafe {
            ffi::MPI_Allgather(
                send_ptr(send),
                n,
                byte_type(),
                recv.as_mut_ptr().cast(),
                n,
                byte_type(),
                self.raw,
            )
        };
        check(ret, "MPI_Allgather")
    }

    /// Blocking `MPI_Allreduce` (sum) of `f64`s from `send` into `recv` (same length, non-empty).
    pub fn allreduce_blocking(&self, send: &[f64], recv: &mut [f64]) -> Result<(), MpiError> {
        if send.len() != recv.len() || recv.is_empty() {
            return Err(MpiError { call: "MPI_Allreduce", code: ffi::MPI_ERR_COUNT as i32 });
        }
        let n = to_c_int(send.len(), "MPI_Allreduce")?;
        // SAFETY: both buffers hold n doubles and are not empty.
        let ret = unsafe {
            ffi::MPI_Allreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                n,
                f64_type(),
                Op::Sum.raw(),
                self.raw,
            )
        };
        check(ret, "MPI_Allreduce")
    }

    /// Blocking `MPI_Bcast` of bytes from `root` (non-empty buffer).
    pub fn bcast_blocking(&self, root: usize, data: &mut [u8]) -> Result<(), MpiError> {
        if data.is_empty() || root >= self.size {
            return Err(MpiError { call: "MPI_Bcast", code: ffi::MPI_ERR_COUNT as i32 });
        }
        let n = to_c_int(data.len(), "MPI_Bcast")?;
        // SAFETY: data holds n bytes and is not empty; root is a valid rank.
        let ret =
            unsafe { ffi::MPI_Bcast(data.as_mut_ptr().cast(), n, byte_type(), root as c_int, self.raw) };
        check(ret, "MPI_Bcast")
    }
}

impl Drop for OwnedComm {
    fn drop(&mut self) {
        if is_active() {
            // SAFETY: raw is a communicator this struct duplicated and nobody else frees.
            unsafe { ffi::MPI_Comm_free(&mut self.raw) };
        }
    }
}

/// A communicator duplicate under way (`MPI_Comm_idup`). Unlike a blocking `MPI_Comm_dup`, its
/// wait can be bounded: a rank that never joins (it failed before creating its loader, and its
/// exit now waits in `MPI_Finalize`) must not hang the others. Dropping it before it completes
/// aborts the job: MPI would later write the new handle into freed memory.
pub struct PendingDup {
    req: ffi::MPI_Request,
    /// Where MPI writes the new handle; boxed, so it does not move while the request is active.
    new: Box<std::mem::MaybeUninit<RawComm>>,
}

impl PendingDup {
    /// # Safety
    /// MPI is initialised and not finalised, and `of` is a valid intra-communicator handle of this
    /// process (not `MPI_COMM_NULL`) that stays valid until the duplicate completes.
    unsafe fn start(of: RawComm) -> Result<Self, MpiError> {
        let mut p = PendingDup { req: null_request(), new: Box::new(std::mem::MaybeUninit::uninit()) };
        // SAFETY: the caller guarantees MPI is up and `of` is valid; MPI writes the new handle
        // into the boxed slot, which lives (unmoved) in `p` until the request completes.
        let ret = unsafe { ffi::MPI_Comm_idup(of, p.new.as_mut_ptr(), &mut p.req) };
        check(ret, "MPI_Comm_idup")?;
        Ok(p)
    }

    /// Tests the duplicate once (`MPI_Test`): the communicator once every rank has joined.
    pub fn test(&mut self) -> Result<Option<OwnedComm>, MpiError> {
        if self.req == null_request() {
            return Err(MpiError { call: "MPI_Comm_idup", code: ffi::MPI_ERR_REQUEST as i32 });
        }
        let mut flag: c_int = 0;
        // SAFETY: req is the active request of this duplicate; MPI_Test sets it to
        // MPI_REQUEST_NULL on completion; status is ignored.
        let ret = unsafe { ffi::MPI_Test(&mut self.req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        check(ret, "MPI_Test")?;
        if flag == 0 {
            return Ok(None);
        }
        // SAFETY: the request completed, so MPI wrote the new handle into the slot.
        let raw = unsafe { self.new.assume_init_read() };
        OwnedComm::adopt(raw).map(Some)
    }
}

impl Drop for PendingDup {
    fn drop(&mut self) {
        if self.req != null_request() && is_active() {
            eprintln!(
                "datahelix: a communicator duplicate was abandoned while still in flight; aborting the \
                 job because MPI could otherwise write into freed memory (this is a DataHelix bug)"
            );
            abort(crate::comm::EXIT_ABORTED);
        }
    }
}

/// Buffers a [`Pending`] keeps alive on behalf of its requests.
pub enum Owned {
    /// `u64` data.
    U64(Vec<u64>),
    /// `f64` data.
    F64(Vec<f64>),
}
impl From<Vec<u64>> for Owned {
    fn from(v: Vec<u64>) -> Self {
        Owned::U64(v)
    }
}
impl From<Vec<f64>> for Owned {
    fn from(v: Vec<f64>) -> Self {
        Owned::F64(v)
    }
}

/// [`Pending`]'s mark for a request whose received count is not checked.
const NO_COUNT_CHECK: usize = usize::MAX;

/// In-flight MPI requests that borrow buffers for `'b`. Complete them with [`Pending::test`]
/// until it returns `true`; dropping an incomplete `Pending` aborts the job (see module docs).
pub struct Pending<'b> {
    reqs: Vec<ffi::MPI_Request>,
    /// Per request: the bytes a point-to-point receive must bring, checked on completion
    /// ([`NO_COUNT_CHECK`] for the rest: collectives match counts on both sides by contract).
    expect: Vec<usize>,
    owned_ints: Vec<Vec<c_int>>,
    owned: Vec<Owned>,
    scratch: Box<Scratch>,
    _buffers: PhantomData<&'b mut [u8]>,
}

impl<'b> Pending<'b> {
    fn new() -> Self {
        Pending {
            reqs: Vec::new(),
            expect: Vec::new(),
            owned_ints: Vec::new(),
            owned: Vec::new(),
            scratch: Box::new(Scratch([0; 16])),
            _buffers: PhantomData,
        }
    }

    /// A pointer MPI may write `buf.len()` elements to; the private scratch for an empty slice.
    fn recv_ptr<T>(&mut self, buf: &'b mut [T]) -> *mut c_void {
        if buf.is_empty() {
            self.scratch.0.as_mut_ptr().cast()
        } else {
            buf.as_mut_ptr().cast()
        }
    }

    fn push(&mut self, req: ffi::MPI_Request) {
        self.reqs.push(req);
        self.expect.push(NO_COUNT_CHECK);
    }

    /// A point-to-point receive that must bring exactly `bytes` (a shorter message — a peer
    /// that sent less than it announced, or a stale message of another size — is an error).
    fn push_recv(&mut self, req: ffi::MPI_Request, bytes: usize) {
        self.reqs.push(req);
        self.expect.push(bytes);
    }

    /// Number of requests (completed ones included).
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    /// Whether there are no requests at all.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether request `i` has completed (its handle is `MPI_REQUEST_NULL`).
    pub fn is_done(&self, i: usize) -> bool {
        self.reqs.get(i).is_none_or(|r| *r == null_request())
    }

    /// Tests every incomplete request once (`MPI_Test`); `Ok(true)` when all are complete. An
    /// error completes the failed request (MPI frees it), so the rest can still be waited on.
    pub fn test(&mut self) -> Result<bool, MpiError> {
        let null = null_request();
        let mut all = true;
        let mut first_err = None;
        for (req, &expect) in self.reqs.iter_mut().zip(&self.expect) {
            if *req == null {
                continue;
            }
            let mut flag: c_int = 0;
            let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::zeroed();
            // SAFETY: req is an active request created by this struct; MPI_Test sets it to
            // MPI_REQUEST_NULL on completion and fills status (zero-initialised, writable).
            let ret = unsafe { ffi::MPI_Test(req, &mut flag, status.as_mut_ptr()) };
            if let Err(e) = check(ret, "MPI_Test") {
                first_err.get_or_insert(e);
                *req = null;
                continue;
            }
            if flag == 0 {
                all = false;
            } else if expect != NO_COUNT_CHECK {
                let mut count: c_int = 0;
                // SAFETY: status was filled by the completed MPI_Test above.
                let ret = unsafe { ffi::MPI_Get_count(status.as_ptr(), byte_type(), &mut count) };
                if check(ret, "MPI_Get_count").is_err() || usize::try_from(count).ok() != Some(expect) {
                    first_err.get_or_insert(MpiError {
                        call: "MPI_Irecv (a message shorter than announced)",
                        code: ffi::MPI_ERR_COUNT as i32,
                    });
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(all),
        }
    }

    fn cancel_all(&mut self) {
        let null = null_request();
        for req in &mut self.reqs {
            if *req != null {
                // SAFETY: an active request of this struct; cancel then wait completes it (a
                // cancelled or finished request completes promptly), after which it is NULL.
                unsafe {
                    ffi::MPI_Cancel(req);
                    ffi::MPI_Wait(req, ffi::RSMPI_STATUS_IGNORE);
                }
                *req = null;
            }
        }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        let null = null_request();
        if self.reqs.iter().any(|r| *r != null) && is_active() {
            eprintln!(
                "datahelix: an MPI operation was abandoned while still in flight; aborting the job \
                 because MPI could otherwise write into freed memory (this is a DataHelix bug)"
            );
            abort(crate::comm::EXIT_ABORTED);
        }
    }
}
