//! The HCCL backend: [`HcclCollective`] implements [`Collective`] with HCCL collectives on ACL
//! device buffers, for Ascend NPUs (feature `hccl`).
//!
//! Bootstrap (the one every HCCL program uses, `shared/reference/hccl-api.md`): MPI is started
//! (`comm::mpi`), every rank calls `aclInit` and `aclrtSetDevice(local_rank % device_count)`, rank 0
//! calls `HcclGetRootInfo`, the 4108 bytes are broadcast with MPI, and every rank calls
//! `HcclCommInitRootInfo`. Failures of any rank during set-up are agreed on with MPI so that
//! every rank returns an error instead of hanging. Without a launcher the world has one rank and
//! MPI is not used.
//!
//! | API | buffers | use |
//! |---|---|---|
//! | [`Collective`] methods | host slices, staged through cached device buffers (H2D copy, collective, polled to completion under the watchdog, D2H copy of the received ranges) | planner records, checks, tests |
//! | [`HcclCollective::all_to_all_v_device`] and friends | [`DeviceBuffer`]s, element counts | rebalancing decoded tensors on device (executor) |
//!
//! Every return code becomes an [`HcclError`] naming the call. As in the MPI backend, a
//! collective that fails after it started (a lost peer, ranks that disagree) cannot be recovered:
//! the trait methods report it and end the job with [`EXIT_ABORTED`]; the device-buffer methods
//! return it and leave the decision to the caller.
//!
//! The trait methods wait under the MPI backend's watchdog: they poll the stream
//! (`aclrtStreamQuery`) and meanwhile answer peers' "where are you?" over the bootstrap world; past
//! [`Config::timeout`] (`DATAHELIX_COLLECTIVE_TIMEOUT`) they ask the peers, print which have not
//! arrived and what they are doing instead (in another collective, decoding, silent), and end
//! the job. The device-buffer methods synchronise with that timeout instead.
//!
//! Byte-level methods move `HCCL_DATA_TYPE_UINT8` elements, so `HcclAlltoAllV`'s uint64 element
//! counts are byte counts there. All `unsafe` lives in [`raw`].

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Instant;

use crate::collective::{check_layout, Collective, CollectiveError, CollectiveOp, ReduceOp, Result, Site};
use crate::comm::mpi::{self, MpiWorld};
use crate::comm::watchdog;
use crate::comm::{launched_by_mpi, Config, EXIT_ABORTED};

pub mod raw;

pub use raw::{AclCode, AllToAllVLayout, DataType, DeviceBuffer, HcclCode, HcclError, InFlight, Reduce};
use raw::{Comm, Device, RootInfo, Runtime, Stream};

/// Whether this build links the host-memory emulator instead of a CANN install.
pub const EMULATOR: bool = hccl_sys::LINKED_EMULATOR;

/// The HCCL backend could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// MPI (the bootstrap) could not be started.
    #[error("HCCL bootstrap: {0}")]
    Mpi(#[from] mpi::InitError),
    /// An ACL or HCCL call on this rank failed.
    #[error(
        "HCCL set-up on rank {rank}: {source}. On Ascend: source CANN's set_env.sh, check npu-smi; \
             see docs/hccl.md"
    )]
    Call {
        /// This rank.
        rank: usize,
        /// The failed call.
        #[source]
        source: HcclError,
    },
    /// Other ranks failed during set-up (their own messages say why).
    #[error("HCCL set-up on rank {rank}: ranks {failed:?} failed during {stage}")]
    Peers {
        /// This rank.
        rank: usize,
        /// The stage (`device selection`, `communicator creation`).
        stage: &'static str,
        /// Ranks that failed.
        failed: Vec<usize>,
    },
    /// An MPI collective of the bootstrap failed.
    #[error("HCCL bootstrap: {0}")]
    Bootstrap(#[from] CollectiveError),
}

/// Grow-only device buffers of the host-slice API.
#[derive(Default)]
struct Scratch {
    send: Option<DeviceBuffer>,
    recv: Option<DeviceBuffer>,
}

/// A world of ranks, one Ascend device each, with HCCL collectives. Use from the thread that
/// created it (ACL binds devices to threads).
pub struct HcclCollective {
    // Field order is drop order: HCCL and ACL resources first, MPI last.
    scratch: RefCell<Scratch>,
    comm: Comm,
    stream: Stream,
    device: Rc<Device>,
    config: Config,
    seq: Cell<u64>,
    step: Cell<Option<u64>>,
    mpi: Option<MpiWorld>,
}

/// The node-local rank from the launcher's environment (Open MPI, MPICH/Hydra, Slurm), if any.
pub fn local_rank_from_env() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

impl HcclCollective {
    /// Starts MPI (when launched by mpirun) and sets up HCCL on this rank's device.
    pub fn init(config: Config) -> std::result::Result<Self, InitError> {
        let mpi = if launched_by_mpi() { Some(MpiWorld::init(config.clone())?) } else { None };
        Self::over(mpi, config)
    }

    /// Sets up HCCL on this rank's device for the ranks of `mpi` (the job's world, or a
    /// communicator the caller made; `None`: one rank without a launcher). Collective over `mpi`.
    pub fn over(mpi: Option<MpiWorld>, config: Config) -> std::result::Result<Self, InitError> {
        let rank = mpi.as_ref().map_or(0, |m| m.rank());
        let selected = (|| -> raw::Result<Rc<Device>> {
            let rt = Runtime::init()?;
            let count = rt.device_count()?;
            if count == 0 {
                return Err(HcclError::Invalid { call: "aclrtGetDeviceCount", what: "no devices".into() });
            }
            let local = local_rank_from_env().unwrap_or(rank);
            Device::set(rt, (local % count as usize) as u32)
        })();
        let failed = agree_failures(mpi.as_ref(), selected.is_err())?;
        let device = selected.map_err(|source| InitError::Call { rank, source })?;
        if !failed.is_empty() {
            return Err(InitError::Peers { rank, stage: "device selection", failed });
        }
        Self::on_device(device, mpi, config)
    }

    /// A world of the ranks of `mpi` (a communicator split from this world's bootstrap, e.g. a
    /// replica group: `exec::replica`) on this rank's device, with its own HCCL communicator
    /// and stream. Collective over `mpi`.
    pub fn join(&self, mpi: MpiWorld) -> std::result::Result<Self, InitError> {
        Self::on_device(self.device.clone(), Some(mpi), self.config.clone())
    }

    /// The rest of the bootstrap once this rank's device is set: rank 0's root info broadcast
    /// over `mpi`, then the communicator and a stream, each stage's failures agreed on.
    fn on_device(
        device: Rc<Device>,
        mpi: Option<MpiWorld>,
        config: Config,
    ) -> std::result::Result<Self, InitError> {
        let (rank, size) = mpi.as_ref().map_or((0, 1), |m| (m.rank(), m.size()));
        let call = |source: HcclError| InitError::Call { rank, source };
        let root = if rank == 0 { RootInfo::new(&device).map(Some) } else { Ok(None) };
        let failed = agree_failures(mpi.as_ref(), root.is_err())?;
        let root = root.map_err(call)?;
        if !failed.is_empty() {
            return Err(InitError::Peers { rank, stage: "root info", failed });
        }
        let mut root = root.unwrap_or_else(RootInfo::empty);
        if let Some(m) = &mpi {
            m.broadcast(0, &mut root.0)?;
        }
        let made = Comm::init(device.clone(), size, &root, rank)
            .and_then(|comm| Ok((comm, Stream::new(device.clone())?)));
        let failed = agree_failures(mpi.as_ref(), made.is_err())?;
        let (comm, stream) = made.map_err(call)?;
        if !failed.is_empty() {
            return Err(InitError::Peers { rank, stage: "communicator creation", failed });
        }
        tracing::debug!(
            target: "datahelix::comm",
            "hccl: rank {rank}/{size} on device {} ({})",
            device.id(),
            if EMULATOR { "emulator" } else { hccl_sys::LINKED_FROM }
        );
        Ok(HcclCollective {
            scratch: RefCell::new(Scratch::default()),
            comm,
            stream,
            device,
            config,
            seq: Cell::new(0),
            step: Cell::new(None),
            mpi,
        })
    }

    /// The MPI world of the bootstrap (`None` for a one-rank world without launcher), e.g. for a
    /// raw-MPI reference measured in the same run.
    pub fn mpi(&self) -> Option<&MpiWorld> {
        self.mpi.as_ref()
    }

    /// The device this rank uses.
    pub fn device_id(&self) -> i32 {
        self.device.id()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Allocates device memory on this rank's device (`aclrtMalloc`; at least one byte).
    pub fn alloc(&self, len: usize) -> raw::Result<DeviceBuffer> {
        DeviceBuffer::alloc(self.device.clone(), len)
    }

    /// Enqueues an all-to-all-v of device buffers without waiting: counts and displacements in
    /// elements of `dtype`, one per rank. The receive buffer stays borrowed until
    /// [`InFlight::wait`].
    pub fn all_to_all_v_device_async<'a>(
        &'a self,
        send: &'a DeviceBuffer,
        recv: &'a mut DeviceBuffer,
        layout: AllToAllVLayout<'_>,
        dtype: DataType,
    ) -> raw::Result<InFlight<'a>> {
        self.comm.all_to_all_v(&self.stream, send, recv, layout, dtype)
    }

    /// All-to-all-v of device buffers (rebalancing decoded tensors on device). Waits as the host
    /// collectives do: answering the watchdog, and past [`Config::timeout`] naming the ranks that
    /// have not arrived and ending the job. A failure is returned; it leaves the communicator
    /// unusable.
    pub fn all_to_all_v_device(
        &self,
        send: &DeviceBuffer,
        recv: &mut DeviceBuffer,
        layout: AllToAllVLayout<'_>,
        dtype: DataType,
    ) -> raw::Result<()> {
        let site = self.enter(CollectiveOp::AllToAllV);
        let bytes = send.len() + recv.len();
        let r = self
            .all_to_all_v_device_async(send, recv, layout, dtype)
            .and_then(|pending| self.settle_device(site, bytes, pending));
        watchdog::note_leave();
        r
    }

    /// All-gather of `count` elements per rank between device buffers; waits and fails as
    /// [`HcclCollective::all_to_all_v_device`].
    pub fn all_gather_device(
        &self,
        send: &DeviceBuffer,
        recv: &mut DeviceBuffer,
        count: u64,
        dtype: DataType,
    ) -> raw::Result<()> {
        let site = self.enter(CollectiveOp::AllGather);
        let bytes = send.len() + recv.len();
        let r = self
            .comm
            .all_gather(&self.stream, send, recv, count, dtype)
            .and_then(|pending| self.settle_device(site, bytes, pending));
        watchdog::note_leave();
        r
    }

    fn timeout(&self) -> Option<std::time::Duration> {
        Some(self.config.timeout)
    }

    fn enter(&self, op: CollectiveOp) -> Site {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let site = Site { rank: self.comm.rank(), op, seq, step: self.step.get() };
        watchdog::note_enter(&site);
        site
    }

    fn invalid(site: Site, what: String) -> CollectiveError {
        CollectiveError::InvalidArgument { site, what }
    }

    fn backend_err(site: Site, e: HcclError) -> CollectiveError {
        CollectiveError::Backend { site, backend: "hccl", message: e.to_string() }
    }

    /// A collective failed at synchronisation: the ranks can no longer agree, so end the job.
    fn fail(&self, site: Site, e: &HcclError) -> ! {
        let hint = match e.acl_code() {
            Some(AclCode::StreamSyncTimeout) => format!(
                " — not every rank reached it within {:.1} s (a rank skipped a collective, died, or is slow: \
                 raise DATAHELIX_COLLECTIVE_TIMEOUT)",
                self.config.timeout.as_secs_f64()
            ),
            Some(AclCode::RtInternal) => {
                " — the ranks disagree on sizes or issued different collectives (see the HCCL log above)"
                    .into()
            }
            Some(AclCode::SuspectRemote) => " — a peer failed or exited".into(),
            _ => String::new(),
        };
        // In one write: the other ranks print theirs at the same moment.
        crate::comm::say_whole(&format!(
            "datahelix: {site} failed (hccl): {e}{hint}. Aborting the job (exit {EXIT_ABORTED})."
        ));
        if self.mpi.is_some() {
            mpi::raw::abort(EXIT_ABORTED)
        }
        std::process::exit(EXIT_ABORTED)
    }

    /// Grows the scratch buffers to at least `send` / `recv` bytes.
    fn scratch(&self, site: Site, send: usize, recv: usize) -> Result<std::cell::RefMut<'_, Scratch>> {
        let mut s = self.scratch.borrow_mut();
        let grow = |b: &mut Option<DeviceBuffer>, len: usize| -> raw::Result<()> {
            if b.as_ref().is_none_or(|b| b.len() < len) {
                *b = None;
                *b = Some(self.alloc(len.max(4096).next_power_of_two())?);
            }
            Ok(())
        };
        grow(&mut s.send, send)
            .and_then(|()| grow(&mut s.recv, recv))
            .map_err(|e| Self::backend_err(site, e))?;
        Ok(s)
    }

    /// Runs one staged collective: `stage` copies in and enqueues, then the stream is synchronised
    /// (a failure there ends the job), then `unstage` copies out.
    fn staged(
        &self,
        site: Site,
        send_len: usize,
        recv_len: usize,
        stage: impl FnOnce(&Comm, &Stream, &mut DeviceBuffer, &mut DeviceBuffer) -> raw::Result<()>,
        unstage: impl FnOnce(&DeviceBuffer, &DeviceBuffer) -> raw::Result<()>,
    ) -> Result<()> {
        let mut s = self.scratch(site, send_len, recv_len)?;
        let Scratch { send, recv } = &mut *s;
        let (Some(send), Some(recv)) = (send.as_mut(), recv.as_mut()) else {
            return Err(Self::invalid(site, "device scratch buffers missing".into()));
        };
        stage(&self.comm, &self.stream, send, recv).map_err(|e| Self::backend_err(site, e))?;
        self.settle(site, send_len + recv_len);
        unstage(send, recv).map_err(|e| Self::backend_err(site, e))
    }

    /// Waits for the collective `site` enqueued on the stream, moving `bytes` in and out of this
    /// rank, under the watchdog of the MPI backend ([`HcclCollective::poll`]). A failure ends the
    /// job too. Without MPI (one rank) it synchronises with the timeout.
    fn settle(&self, site: Site, bytes: usize) {
        if let Some(world) = &self.mpi {
            self.poll(world, site, bytes, || self.stream.query().unwrap_or_else(|e| self.fail(site, &e)));
        }
        // Finished: a runtime that reports a task's failure only at synchronisation says it here.
        if let Err(e) = self.stream.synchronize(self.timeout()) {
            self.fail(site, &e);
        }
    }

    /// [`HcclCollective::settle`] for a device-buffer collective the caller enqueued: a failure
    /// is returned, not the end of the job (the timeout still ends it, naming the late ranks).
    fn settle_device(&self, site: Site, bytes: usize, pending: InFlight<'_>) -> raw::Result<()> {
        let Some(world) = &self.mpi else { return pending.wait(self.timeout()) };
        let mut failed = None;
        self.poll(world, site, bytes, || {
            pending.is_done().unwrap_or_else(|e| {
                failed = Some(e);
                true
            })
        });
        let waited = pending.wait(self.timeout());
        // The query's error first: a synchronisation after a failed task may only repeat it
        // (it is still awaited, so that no task outlives the buffers the caller may now free).
        match failed {
            Some(e) => Err(e),
            None => waited,
        }
    }

    /// Polls `complete` until it holds, answering peers' "where are you?" over the bootstrap
    /// world meanwhile; past the timeout asks them where they are, prints which have not arrived
    /// and ends the job (returning only if `complete` turned true during the grace period).
    fn poll(&self, world: &MpiWorld, site: Site, bytes: usize, mut complete: impl FnMut() -> bool) {
        let start = Instant::now();
        let deadline = start + self.config.timeout;
        let spin = mpi::spin_for(bytes);
        let mut polls: u32 = 0;
        while !complete() {
            polls = polls.wrapping_add(1);
            if polls % 32 != 0 {
                continue;
            }
            world.answer_for(&site, start);
            let now = Instant::now();
            if now >= deadline && world.expire_foreign(site, "hccl", start, &mut complete) {
                break;
            }
            // As the MPI backend: past the time its own bytes need, a wait is for a slower peer,
            // and sleeping gives this node's decode workers the core.
            if now - start > spin {
                std::thread::sleep(mpi::LONG_WAIT_PAUSE);
            }
        }
    }

    fn all_reduce<T: Copy>(&self, data: &mut [T], op: ReduceOp, dtype: DataType) -> Result<()> {
        let site = self.enter(CollectiveOp::AllReduce);
        let r = if data.is_empty() {
            Ok(())
        } else {
            let bytes = std::mem::size_of_val(data);
            let hop = match op {
                ReduceOp::Sum => Reduce::Sum,
                ReduceOp::Max => Reduce::Max,
                ReduceOp::Min => Reduce::Min,
            };
            let count = data.len() as u64;
            let input = as_bytes(data);
            let mut out = vec![0u8; bytes];
            let r = self.staged(
                site,
                bytes,
                bytes,
                |comm, stream, send, recv| {
                    send.write(0, input)?;
                    comm.all_reduce(stream, send, recv, count, dtype, hop)?.forget();
                    Ok(())
                },
                |_, recv| recv.read(0, &mut out),
            );
            if r.is_ok() {
                from_bytes(&out, data);
            }
            r
        };
        watchdog::note_leave();
        r
    }
}

/// Ranks whose `failed` was true, agreed over MPI (empty without MPI).
fn agree_failures(mpi: Option<&MpiWorld>, failed: bool) -> std::result::Result<Vec<usize>, InitError> {
    let Some(m) = mpi else { return Ok(Vec::new()) };
    let flags = m.all_gather_vec(&[u8::from(failed)])?;
    Ok(flags.iter().enumerate().filter(|(_, &f)| f != 0).map(|(r, _)| r).collect())
}

fn as_bytes<T: Copy>(data: &[T]) -> &[u8] {
    // SAFETY: T is f64 or u64 here (plain old data without padding); the byte view covers exactly
    // the slice's memory and lives no longer than the borrow.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn from_bytes<T: Copy>(bytes: &[u8], data: &mut [T]) {
    // SAFETY: as in as_bytes; every bit pattern is a valid f64 / u64, and `bytes` has exactly
    // size_of_val(data) bytes (both come from the same slice).
    let dst = unsafe {
        std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(data))
    };
    dst.copy_from_slice(bytes);
}

impl Collective for HcclCollective {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn backend(&self) -> &'static str {
        "hccl"
    }

    fn serve_watchdog(&self) {
        if let Some(world) = &self.mpi {
            world.serve_watchdog();
        }
    }

    fn set_step(&self, step: Option<u64>) {
        self.step.set(step);
        if let Some(world) = &self.mpi {
            world.set_step(step);
        }
    }

    fn site_now(&self, op: CollectiveOp) -> Site {
        Site { rank: self.comm.rank(), op, seq: self.seq.get(), step: self.step.get() }
    }

    fn all_gather(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let n = self.size();
        let site = self.enter(CollectiveOp::AllGather);
        let r = if send.len().checked_mul(n) != Some(recv.len()) {
            Err(Self::invalid(
                site,
                format!("receive buffer is {} bytes, expected {n} ranks x {} bytes", recv.len(), send.len()),
            ))
        } else if send.is_empty() {
            Ok(())
        } else {
            self.staged(
                site,
                send.len(),
                recv.len(),
                |comm, stream, dsend, drecv| {
                    dsend.write(0, send)?;
                    comm.all_gather(stream, dsend, drecv, send.len() as u64, DataType::U8)?.forget();
                    Ok(())
                },
                |_, drecv| drecv.read(0, recv),
            )
        };
        watchdog::note_leave();
        r
    }

    fn all_gather_v(&self, send: &[u8], counts: &[usize], displs: &[usize], recv: &mut [u8]) -> Result<()> {
        // HCCL has no all-gather-v: an all-to-all-v that sends this rank's block to every rank.
        let (n, me) = (self.size(), self.rank());
        let site = self.enter(CollectiveOp::AllGatherV);
        let checked = check_layout(site, "receive", n, counts, displs, recv.len(), true).and_then(|()| {
            if counts[me] == send.len() {
                Ok(())
            } else {
                Err(Self::invalid(
                    site,
                    format!("counts[{me}] is {} but this rank sends {} bytes", counts[me], send.len()),
                ))
            }
        });
        let r = checked.and_then(|()| {
            let send_counts = vec![send.len() as u64; n];
            let send_displs = vec![0u64; n];
            let recv_counts: Vec<u64> = counts.iter().map(|&c| c as u64).collect();
            let recv_displs: Vec<u64> = displs.iter().map(|&d| d as u64).collect();
            let layout = AllToAllVLayout {
                send_counts: &send_counts,
                send_displs: &send_displs,
                recv_counts: &recv_counts,
                recv_displs: &recv_displs,
            };
            self.staged(
                site,
                send.len(),
                recv.len(),
                |comm, stream, dsend, drecv| {
                    dsend.write(0, send)?;
                    comm.all_to_all_v(stream, dsend, drecv, layout, DataType::U8)?.forget();
                    Ok(())
                },
                |_, drecv| {
                    (0..n)
                        .try_for_each(|p| drecv.read(displs[p], &mut recv[displs[p]..displs[p] + counts[p]]))
                },
            )
        });
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
        let (n, me) = (self.size(), self.rank());
        let site = self.enter(CollectiveOp::AllToAllV);
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
        let r = checked.and_then(|()| {
            let u = |v: &[usize]| -> Vec<u64> { v.iter().map(|&x| x as u64).collect() };
            let (sc, sd, rc, rd) = (u(send_counts), u(send_displs), u(recv_counts), u(recv_displs));
            let layout =
                AllToAllVLayout { send_counts: &sc, send_displs: &sd, recv_counts: &rc, recv_displs: &rd };
            self.staged(
                site,
                send.len(),
                recv.len(),
                |comm, stream, dsend, drecv| {
                    dsend.write(0, send)?;
                    comm.all_to_all_v(stream, dsend, drecv, layout, DataType::U8)?.forget();
                    Ok(())
                },
                |_, drecv| {
                    (0..n).try_for_each(|p| {
                        let (d, c) = (recv_displs[p], recv_counts[p]);
                        drecv.read(d, &mut recv[d..d + c])
                    })
                },
            )
        });
        watchdog::note_leave();
        r
    }

    fn all_reduce_f64(&self, data: &mut [f64], op: ReduceOp) -> Result<()> {
        self.all_reduce(data, op, DataType::F64)
    }

    fn all_reduce_u64(&self, data: &mut [u64], op: ReduceOp) -> Result<()> {
        self.all_reduce(data, op, DataType::U64)
    }

    fn broadcast(&self, root: usize, data: &mut [u8]) -> Result<()> {
        let site = self.enter(CollectiveOp::Broadcast);
        let me = self.rank();
        let r = if root >= self.size() {
            Err(Self::invalid(site, format!("root {root} in a world of {} ranks", self.size())))
        } else if data.is_empty() {
            Ok(())
        } else {
            let len = data.len();
            let mut out = vec![0u8; if me == root { 0 } else { len }];
            let input: &[u8] = data;
            let r = self.staged(
                site,
                0,
                len,
                |comm, stream, _, buf| {
                    if me == root {
                        buf.write(0, input)?;
                    }
                    comm.broadcast(stream, buf, len as u64, DataType::U8, root)?.forget();
                    Ok(())
                },
                |_, buf| buf.read(0, &mut out),
            );
            if r.is_ok() && me != root {
                data.copy_from_slice(&out);
            }
            r
        };
        watchdog::note_leave();
        r
    }

    fn barrier(&self) -> Result<()> {
        let site = self.enter(CollectiveOp::Barrier);
        let r = self.comm.barrier(&self.stream).map_err(|e| Self::backend_err(site, e)).map(InFlight::forget);
        if r.is_ok() {
            self.settle(site, 0);
        }
        watchdog::note_leave();
        r
    }
}
