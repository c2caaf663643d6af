//! `dh_loader` (one rank's loader, owning its world) and `dh_batch` (one step's samples).
//!
//! Ownership: the handle owns a [`crate::exec::loader::Loader`], which owns its world (and drops
//! its decode workers before it), or with `replica_ranks` its rank's part of a replica group
//! (`crate::exec::driver`). The step sequence is the loader's own
//! ([`crate::exec::loader::Loader::train_step`],
//! `dh_loader_step`); the functions here only check arguments, map errors and keep metrics.

use std::ffi::{c_char, c_void};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::config::dh_config;
use super::{dh_result, ffi_boundary, out_arg, Error};
use crate::collective::ReduceOp;
use crate::comm;
use crate::comm::mpi::raw::RawComm;
use crate::comm::mpi::{CallerComm, MpiWorld};
use crate::exec::driver::Driver;
use crate::exec::loader::{Accelerator, Batch, Counters, ExecError};
use crate::metrics::{summarize, RankStep, RunShape};

/// `dh_tensor.dtype`: unsigned 8-bit integers (packed RGB24 frames).
pub const DH_DTYPE_U8: u8 = 0;
/// `dh_tensor.device`: host memory.
pub const DH_DEVICE_HOST: u8 = 0;

/// A view of one sample's decoded tensor: `shape[0..ndim]` = `[frames, height, width, 3]`,
/// `dtype` `DH_DTYPE_U8`, C-contiguous, `nbytes` bytes at `data` on `device` (`DH_DEVICE_HOST`).
/// The memory belongs to the batch: it is valid, and must not be written, until the batch is
/// released with `dh_batch_release`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct dh_tensor {
    /// First byte (read-only). Not NULL when `nbytes > 0`.
    pub data: *const u8,
    /// Extent of each dimension; entries past `ndim` are 0.
    pub shape: [u64; 4],
    /// Dimensions used in `shape` (4).
    pub ndim: u32,
    /// Element type (`DH_DTYPE_U8`).
    pub dtype: u8,
    /// Where `data` lives (`DH_DEVICE_HOST`).
    pub device: u8,
    /// Zero; reserved.
    pub reserved: u16,
    /// Bytes at `data` (the product of the shape times the element size).
    pub nbytes: u64,
}

/// What the loader measured on this rank, over the delivered steps from `warmup` on.
/// A step's wait is the time `dh_loader_next` blocked; a step is a miss when it waited more
/// than 1 ms (`miss_rate`) or 10 ms (`miss_rate_10ms`); a step ends when it is reported with
/// `dh_loader_report_step` (or, if never reported, when the next one is asked for). On the ranks
/// of a replica group (`replica_ranks`) that receive their batch from its first rank, the wait
/// includes that transfer and the loader's own counters (`rebalances_*`, `late_steps`) are 0.
///
/// The struct grows at its end between versions: set `struct_size = sizeof(dh_metrics)` before
/// calling `dh_loader_metrics`, which writes only the fields that fit in both the caller's and
/// the library's struct and sets `struct_size` to the bytes it wrote.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct dh_metrics {
    /// Set by the caller to `sizeof(dh_metrics)`; on return, the bytes the library wrote.
    pub struct_size: usize,
    /// Steps measured.
    pub steps: u64,
    /// Samples delivered on this rank in those steps.
    pub samples: u64,
    /// Samples of this rank skipped (undecodable) in those steps.
    pub skipped: u64,
    /// Samples per second on this rank (delivered / wall).
    pub throughput: f64,
    /// Fraction of steps that waited more than 1 ms.
    pub miss_rate: f64,
    /// Fraction of steps that waited more than 10 ms.
    pub miss_rate_10ms: f64,
    /// Median wait, seconds.
    pub p50_wait_s: f64,
    /// 95th-percentile wait, seconds.
    pub p95_wait_s: f64,
    /// Longest wait, seconds.
    pub max_wait_s: f64,
    /// Sum of the waits, seconds.
    pub total_wait_s: f64,
    /// Sum of the reported accelerator seconds.
    pub accel_s: f64,
    /// From the first measured step's request to the last one's end, seconds.
    pub wall_s: f64,
    /// Bytes of tensors received from other ranks in those steps.
    pub bytes_in: u64,
    /// After-decode rebalances run (whole run).
    pub rebalances_run: u64,
    /// After-decode rebalances skipped by the cost gate (whole run).
    pub rebalances_skipped: u64,
    /// Steps planned so far with late ranks (whole run; the same on every rank): steps where
    /// some rank must wait whatever the schedule and the last ranks (of each planning group)
    /// take the wait (the `late_pieces` setting).
    pub late_steps: u64,
}

/// One step's batch on this rank: an opaque handle owned by the caller from `dh_loader_next`
/// until `dh_batch_release`. Its ids and tensor views stay valid until then, even past
/// `dh_loader_close`/`dh_loader_free` of its loader. Read-only functions on one batch may be
/// called from any thread, but not concurrently with its release.
pub struct dh_batch {
    batch: Batch,
    ids: Vec<u64>,
    tensors: Vec<dh_tensor>,
    /// Each sample's metadata, NUL-terminated for C (`dh_batch_meta`).
    meta: Vec<std::ffi::CString>,
}

enum State {
    Open(Driver),
    Failed(String),
    Closed,
}

/// One rank's loader: an opaque handle owned by the caller from `dh_loader_new` until
/// `dh_loader_free`. It owns this rank's decode workers and its MPI communicators. **Not
/// thread-safe**: call every function on a loader from the thread that created it (MPI is used
/// at `MPI_THREAD_FUNNELED`), never concurrently; a call from another thread returns
/// `DH_WRONG_THREAD` and does nothing. It fails closed: after a call fails once its work began
/// (`DH_INDEX`, `DH_COLLECTIVE`, `DH_LOADER`...) or panicked (`DH_PANIC`), every later call
/// returns `DH_CLOSED` (metrics and world stay readable); free it then.
pub struct dh_loader {
    state: State,
    rank: usize,
    size: usize,
    mpi: bool,
    watchdog_s: f64,
    steps: u64,
    warmup: u64,
    cores: f64,
    lookahead: u64,
    delivered: u64,
    t0: Instant,
    history: Vec<RankStep>,
    /// Whether the last delivered step is not reported yet.
    unreported: bool,
    counters: Counters,
    /// Steps planned with late ranks, as of the last delivered batch.
    late_steps: u64,
    /// The thread that created the loader: the only one that may call it.
    owner: std::thread::ThreadId,
    /// Set while a call runs ([`dh_loader::guarded`]); found set when the next call starts, the
    /// last one never finished (a panic unwound out of it).
    in_call: bool,
}

/// Whether a failed call leaves the loader failed: every failure once the call's work began. An
/// argument refused before anything ran (and the end of the steps) leaves it as it was.
fn fails_the_loader(code: dh_result) -> bool {
    !matches!(
        code,
        dh_result::DH_NULL_PARAMETER
            | dh_result::DH_INVALID_PARAMETER
            | dh_result::DH_UNSUPPORTED
            | dh_result::DH_END
            | dh_result::DH_CLOSED
            | dh_result::DH_WRONG_THREAD
            | dh_result::DH_OUT_OF_RANGE
    )
}

/// MPI initialised by this library (finalised at process exit).
static UNIVERSE: Mutex<Option<::mpi::environment::Universe>> = Mutex::new(None);

/// The longest collective timeout of this process's loaders, in milliseconds; the exit's
/// `MPI_Finalize` may wait twice as long for the other ranks (`finalize_at_exit`).
static FINALIZE_WAIT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Finalises the MPI this library initialised. `MPI_Finalize` waits for every rank; a rank that
/// exits while the others are still inside a collective (it failed on its own, say, and the C
/// program called `exit(1)`) would wait for them for good, and they for it. So the wait is
/// bounded; past it the process says why and exits with the watchdog's status, which makes
/// `mpirun` end the job. The bound is twice the collective timeout: the ranks left inside a
/// collective reach their own timeout first and abort the job through the launcher, one event
/// at a time (a rank's exit and another's `MPI_Abort` within the same instant once left Open
/// MPI 4.1's `mpirun` waiting on a futex for good, the job's processes all gone).
extern "C" fn finalize_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let u = UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()).take();
        if u.is_none() {
            return;
        }
        let wait_ms = 2 * FINALIZE_WAIT_MS.load(std::sync::atomic::Ordering::Relaxed).max(1000);
        let _ = std::thread::Builder::new().name("datahelix-finalize-watch".into()).spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            comm::say_whole(&format!(
                "datahelix: MPI_Finalize at exit did not return within {:.1} s (twice the collective timeout): \
                 another rank is still inside a loader call or never reached its exit. Exiting with \
                 status {} instead of waiting.",
                wait_ms as f64 / 1e3,
                comm::EXIT_ABORTED
            ));
            // SAFETY: _exit ends the process at once; nothing of this process runs after it.
            unsafe { libc::_exit(comm::EXIT_ABORTED) };
        });
        drop(u);
    });
}

/// Initialises MPI when a launcher started the process and the caller has not.
fn ensure_mpi() -> Result<(), Error> {
    if !comm::launched_by_mpi() {
        return Ok(());
    }
    if ::mpi::environment::is_initialized() {
        if ::mpi::environment::is_finalized() {
            return Err(Error::new(dh_result::DH_MPI_INIT, "MPI was already finalised"));
        }
        return Ok(());
    }
    let (u, _) = ::mpi::environment::initialize_with_threading(::mpi::environment::Threading::Funneled)
        .ok_or_else(|| Error::new(dh_result::DH_MPI_INIT, "MPI_Init_thread failed"))?;
    *UNIVERSE.lock().unwrap_or_else(|e| e.into_inner()) = Some(u);
    // SAFETY: atexit takes a function pointer with C linkage and no arguments; the handler
    // cannot unwind (it catches panics).
    if unsafe { libc::atexit(finalize_at_exit) } != 0 {
        return Err(Error::new(dh_result::DH_MPI_INIT, "cannot register MPI finalisation at exit"));
    }
    Ok(())
}

fn exec_error(e: ExecError) -> Error {
    let code = match &e {
        ExecError::Index(_) => dh_result::DH_INDEX,
        ExecError::Collective(_) => dh_result::DH_COLLECTIVE,
        _ => dh_result::DH_LOADER,
    };
    Error::new(code, e.to_string())
}

/// Opens a loader on `MPI_COMM_WORLD` (`comm` None) or on the caller's communicator.
fn open_loader(config: &dh_config, comm: Option<CallerComm>) -> Result<dh_loader, Error> {
    let cfg = config.loader.clone();
    if cfg.data.as_os_str().is_empty() {
        return Err(Error::new(
            dh_result::DH_INVALID_PARAMETER,
            "the configuration has no \"data\" (the dataset folder)",
        ));
    }
    // Alone, a missing dataset is refused before MPI is touched. Under a launcher every rank
    // goes on to the loader's fingerprint all-gather, where one rank's missing dataset stops all
    // of them at once (checked here, it would leave the others waiting for it until the watchdog).
    if comm.is_none() && !comm::launched_by_mpi() {
        crate::index::Index::open_in(&cfg.data, cfg.index_dir.as_deref())
            .map_err(|e| Error::new(dh_result::DH_INDEX, format!("{}: {e}", cfg.data.display())))?;
    }
    let timeout_ms = config.comm.timeout.as_millis().min(u64::MAX as u128) as u64;
    FINALIZE_WAIT_MS.fetch_max(timeout_ms, std::sync::atomic::Ordering::Relaxed);
    let backend = config.backend;
    let cannot = |e: comm::InitError| {
        Error::new(dh_result::DH_MPI_INIT, format!("cannot start the {} backend: {e}", backend.name()))
    };
    let world = match comm {
        None => {
            ensure_mpi()?;
            comm::init_backend(config.comm.clone(), backend).map_err(cannot)?
        }
        Some(c) => {
            let mpi = MpiWorld::with_comm(config.comm.clone(), &c).map_err(|e| {
                Error::new(dh_result::DH_MPI_INIT, format!("cannot use the communicator passed: {e}"))
            })?;
            comm::over_mpi(mpi, backend).map_err(cannot)?
        }
    };
    let mpi = world.mpi_world().is_some();
    let (rank, size) = (world.collective().rank(), world.collective().size());
    let (cores, steps, lookahead) = (cfg.cores, cfg.steps, cfg.lookahead as u64);
    let loader =
        Driver::open(world, cfg, config.resume.as_ref(), config.replica_ranks).map_err(exec_error)?;
    Ok(dh_loader {
        state: State::Open(loader),
        rank,
        size,
        mpi,
        watchdog_s: config.comm.timeout.as_secs_f64(),
        steps,
        warmup: config.warmup,
        cores: if cores > 0.0 {
            cores
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
        },
        lookahead,
        // Steps count globally: a resumed loader has delivered those before its state's next.
        delivered: config.resume.as_ref().map_or(0, |s| s.next_step),
        t0: Instant::now(),
        history: Vec::new(),
        unreported: false,
        counters: Counters::default(),
        late_steps: 0,
        owner: std::thread::current().id(),
        in_call: false,
    })
}

/// The safe methods behind the `dh_loader_*` functions, for Rust bindings (the Python package):
/// the same checks, errors and metrics as C. Not thread-safe, as the C handle.
impl dh_loader {
    /// Opens this rank's loader on `MPI_COMM_WORLD` (see `dh_loader_new`). **Collective.**
    pub fn open(config: &dh_config) -> Result<dh_loader, Error> {
        open_loader(config, None)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Refuses a call from another thread than the loader's (`DH_WRONG_THREAD`).
    pub fn check_thread(&self) -> Result<(), Error> {
        let here = std::thread::current().id();
        if here != self.owner {
            return Err(Error::new(
                dh_result::DH_WRONG_THREAD,
                format!(
                    "the loader was created on thread {:?} and called from {here:?}: call it only from the thread \
                     that created it (MPI runs at MPI_THREAD_FUNNELED)",
                    self.owner
                ),
            ));
        }
        Ok(())
    }

    /// Every call that can change the loader runs through here, so that it fails closed: a call
    /// from another thread is refused; a loader whose last call never finished (a panic, caught
    /// at the boundary as `DH_PANIC`) is failed before anything else runs; and a call that fails
    /// once its work began fails the loader. A failed loader answers `DH_CLOSED` from then on.
    fn guarded<T>(&mut self, call: impl FnOnce(&mut Self) -> Result<T, Error>) -> Result<T, Error> {
        self.check_thread()?;
        if std::mem::replace(&mut self.in_call, true) && matches!(self.state, State::Open(_)) {
            self.state = State::Failed("an earlier call panicked before it finished (DH_PANIC)".into());
        }
        let result = call(self);
        self.in_call = false;
        if let Err(e) = &result {
            if fails_the_loader(e.code()) && matches!(self.state, State::Open(_)) {
                self.state = State::Failed(e.message().to_string());
            }
        }
        result
    }

    /// The open loader, or why there is none.
    fn live(&mut self) -> Result<&mut Driver, Error> {
        match &mut self.state {
            State::Open(loader) => Ok(loader),
            State::Failed(why) => Err(Error::new(
                dh_result::DH_CLOSED,
                format!("the loader failed earlier ({why}); it can only be freed"),
            )),
            State::Closed => Err(Error::new(dh_result::DH_CLOSED, "the loader is closed")),
        }
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn next(&mut self, timeout_ms: u32) -> Result<dh_batch, Error> {
        self.live()?;
        if self.delivered < self.steps
            && timeout_ms != 0
            && self.mpi
            && (timeout_ms as f64) < self.watchdog_s * 1e3
        {
            return Err(Error::new(
                dh_result::DH_UNSUPPORTED,
                format!(
                    "a timeout of {timeout_ms} ms, shorter than the collectives' watchdog ({:.0} ms), is not supported: \
                     a step cannot be left while other ranks are in it; pass 0 or set collective_timeout_s",
                    self.watchdog_s * 1e3
                ),
            ));
        }
        let batch = self.next_unguarded()?.ok_or_else(|| {
            Error::new(dh_result::DH_END, format!("all {} configured steps were delivered", self.steps))
        })?;
        let ids: Vec<u64> = batch.samples.iter().map(|s| s.id).collect();
        let tensors = batch
            .samples
            .iter()
            .map(|s| dh_tensor {
                data: s.data.as_ptr(),
                shape: s.shape.map(|d| d as u64),
                ndim: 4,
                dtype: DH_DTYPE_U8,
                device: DH_DEVICE_HOST,
                reserved: 0,
                nbytes: s.data.len() as u64,
            })
            .collect();
        // JSON text has no NUL bytes (they are escaped); a damaged metadata file's are dropped.
        let meta = batch
            .samples
            .iter()
            .map(|s| std::ffi::CString::new(s.meta.replace('\0', "")).unwrap_or_default())
            .collect();
        Ok(dh_batch { batch, ids, tensors, meta })
    }

    /// Blocks until this rank's batch of the next step is ready (see `dh_loader_next`); `None`
    /// once the configured steps were delivered. **Collective.** A failure fails the loader.
    pub fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        self.guarded(|l| l.next_unguarded())
    }

    fn next_unguarded(&mut self) -> Result<Option<Batch>, Error> {
        self.live()?;
        if self.delivered >= self.steps {
            return Ok(None);
        }
        let start_s = self.now();
        if let (true, Some(last)) = (std::mem::take(&mut self.unreported), self.history.last_mut()) {
            last.end_s = start_s;
        }
        let result = self.live()?.next_batch();
        let batch = match result {
            Ok(b) => b,
            Err(e) => {
                let e = exec_error(e);
                self.state = State::Failed(e.message.clone());
                return Err(e);
            }
        };
        self.delivered += 1;
        self.counters = self.live()?.counters();
        self.late_steps = self.live()?.late_steps();
        let charged = self.live()?.charged_bytes() as u64;
        let now = self.now();
        self.history.push(RankStep {
            rank: self.rank as u32,
            step: batch.step,
            input_wait_s: batch.input_wait_s,
            gpu_s: 0.0,
            ids: batch.samples.iter().map(|s| s.id).collect(),
            skipped: batch.skipped.clone(),
            start_s,
            end_s: now,
            max_sample_gpu_s: 0.0,
            sample_chain_s: Vec::new(),
            sample_gpu_s: Vec::new(),
            accel: None,
            decode_cpu_s: batch.decode_cpu_s,
            tokens: batch.samples.iter().map(|s| s.tokens).sum(),
            bytes_in: batch.bytes_in,
            tensor_checksum: None,
            charged_bytes: Some(charged),
        });
        self.unreported = true;
        Ok(Some(batch))
    }

    /// Plans ahead and sends what others still need of the step just delivered (see
    /// `dh_loader_prepare_ahead`). **Collective.** A failure fails the loader.
    pub fn prepare_ahead(&mut self) -> Result<(), Error> {
        self.guarded(|l| l.ahead(|l| l.prepare_ahead()))
    }

    /// Ships the next step's tensors before the accelerator step ends, `seconds_to_step_end`
    /// from now (see `dh_loader_ship_ahead`). **Collective.** A failure fails the loader.
    pub fn ship_ahead(&mut self, seconds_to_step_end: f64) -> Result<(), Error> {
        if !(seconds_to_step_end.is_finite() && seconds_to_step_end >= 0.0) {
            return Err(Error::new(
                dh_result::DH_INVALID_PARAMETER,
                format!("seconds to the step's end {seconds_to_step_end} must be finite and non-negative"),
            ));
        }
        // A day bounds the wait (and keeps the instant representable).
        let step_end = Instant::now() + Duration::from_secs_f64(seconds_to_step_end.min(86_400.0));
        self.guarded(|l| l.ahead(|l| l.ship_ahead(step_end)))
    }

    /// Where the run stands, as the JSON document of `dh_loader_state` (the `resume` setting).
    pub fn state_json(&mut self) -> Result<String, Error> {
        self.guarded(|l| Ok(l.live()?.state().to_json()))
    }

    /// Sums `values` over all ranks in place (see `dh_loader_all_reduce_sum`). **Collective.**
    pub fn all_reduce_sum(&mut self, values: &mut [f64]) -> Result<(), Error> {
        self.guarded(|l| {
            let world = l.live()?.world();
            world
                .all_reduce_f64(values, ReduceOp::Sum)
                .map_err(|e| Error::new(dh_result::DH_COLLECTIVE, e.to_string()))
        })
    }

    /// Stops the loader (see `dh_loader_close`). **Collective.** A no-op when closed or failed.
    pub fn close(&mut self) -> Result<(), Error> {
        self.guarded(|l| {
            if let State::Open(_) = l.state {
                l.state = State::Closed;
            }
            Ok(())
        })
    }

    /// Runs one of the loader's collective steps; a failure fails the loader, as in `next`.
    fn ahead(&mut self, work: impl FnOnce(&mut Driver) -> Result<(), ExecError>) -> Result<(), Error> {
        let result = work(self.live()?);
        if let Err(e) = result {
            let e = exec_error(e);
            self.state = State::Failed(e.message.clone());
            return Err(e);
        }
        Ok(())
    }

    /// Reports the accelerator seconds of the step delivered last (see `dh_loader_report_step`).
    pub fn report_step(&mut self, accel_s: f64) -> Result<(), Error> {
        self.guarded(|l| l.report_unguarded(accel_s))
    }

    fn report_unguarded(&mut self, accel_s: f64) -> Result<(), Error> {
        if !(accel_s.is_finite() && accel_s >= 0.0) {
            return Err(Error::new(
                dh_result::DH_INVALID_PARAMETER,
                format!("accelerator seconds {accel_s} must be finite and non-negative"),
            ));
        }
        self.live()?;
        if !std::mem::take(&mut self.unreported) {
            return Err(Error::new(
                dh_result::DH_INVALID_PARAMETER,
                "no step to report: each step is reported once, after dh_loader_next returned its batch",
            ));
        }
        let result = self.live()?.report_step(accel_s);
        result.map_err(exec_error)?;
        let now = self.now();
        if let Some(last) = self.history.last_mut() {
            last.gpu_s = accel_s;
            last.end_s = now;
        }
        Ok(())
    }

    /// What the loader measured on this rank (see `dh_metrics`). Works in any state.
    pub fn metrics(&self) -> dh_metrics {
        let mut history = self.history.clone();
        if self.unreported {
            if let Some(last) = history.last_mut() {
                last.end_s = self.now();
            }
        }
        let shape = RunShape { warmup: self.warmup, ranks: 1, cores: self.cores, lookahead: self.lookahead };
        let s = summarize(&history, shape);
        let measured = history.iter().filter(|r| r.step >= self.warmup);
        let (mut total_wait_s, mut accel_s, mut bytes_in) = (0.0, 0.0, 0);
        for r in measured {
            total_wait_s += r.input_wait_s.max(0.0);
            accel_s += r.gpu_s;
            bytes_in += r.bytes_in;
        }
        dh_metrics {
            struct_size: std::mem::size_of::<dh_metrics>(),
            steps: s.steps,
            samples: s.delivered,
            skipped: s.skipped,
            throughput: s.throughput,
            miss_rate: s.miss_rate,
            miss_rate_10ms: s.miss_rate_10ms,
            p50_wait_s: s.p50_wait_s,
            p95_wait_s: s.p95_wait_s,
            max_wait_s: s.max_wait_s,
            total_wait_s,
            accel_s,
            wall_s: if s.steps > 0 { s.wall_s } else { 0.0 },
            bytes_in,
            rebalances_run: self.counters.rebalances_run,
            rebalances_skipped: self.counters.rebalances_skipped,
            late_steps: self.late_steps,
        }
    }
}

/// Creates this rank's loader on `MPI_COMM_WORLD` (duplicated: the caller's use of MPI is not
/// disturbed). **Collective**: every rank of the job calls it with the same configuration.
///
/// MPI: when the process was started by an MPI launcher (`mpirun`, Slurm...) and MPI is not
/// initialised yet, the library initialises it (`MPI_THREAD_FUNNELED`, on the calling thread)
/// and finalises it at process exit; when the caller initialised MPI, the library uses it and
/// never finalises it (free every loader before your `MPI_Finalize`). Without a launcher the
/// loader runs as a one-rank job without MPI.
///
/// Without a launcher the dataset is opened first (before MPI is touched); under one, every rank
/// opens it and all fail together (`DH_INDEX` on a rank whose dataset is missing, `DH_LOADER` on
/// the others, naming that rank) when any cannot. On success writes a new loader to
/// `*loader_out`, owned by the caller (`dh_loader_free`); `config` is not retained. Fails with
/// `DH_NULL_PARAMETER`, `DH_INVALID_PARAMETER` (no `data`, or a bad setting), `DH_INDEX`
/// (missing or unindexed dataset), `DH_MPI_INIT` or `DH_COLLECTIVE`; nothing is written then.
#[no_mangle]
pub extern "C" fn dh_loader_new(config: *const dh_config, loader_out: *mut *mut dh_loader) -> dh_result {
    ffi_boundary!({
        // SAFETY: config is NULL or a live configuration (header contract), only read here.
        let config = unsafe { config.as_ref() }.ok_or_else(|| Error::null("config"))?;
        let loader_out = out_arg(loader_out, "loader_out")?;
        let loader = Box::new(open_loader(config, None)?);
        // SAFETY: loader_out is not NULL and points to writable storage for one pointer.
        unsafe { loader_out.write(Box::into_raw(loader)) };
        Ok(())
    })
}

/// Creates this rank's loader on a communicator the caller owns: `comm` points to the caller's
/// `MPI_Comm` (e.g. `&dp_comm`, a data-parallel group from `MPI_Comm_split`). The library
/// duplicates it (`MPI_Comm_dup`, so the caller's traffic on it never mixes with the loader's)
/// and never frees it; the loader's ranks are the communicator's. MPI must be initialised by the
/// caller (and is never finalised here: free every loader before `MPI_Finalize`).
/// **Collective** over `comm`: every rank of it calls this with the same configuration. Several
/// loaders on disjoint communicators run at once in one job. Fails as `dh_loader_new`, and with
/// `DH_MPI_INIT` when MPI is not initialised, or `*comm` is `MPI_COMM_NULL` or an
/// inter-communicator; nothing is written then.
#[no_mangle]
pub extern "C" fn dh_loader_new_with_comm(
    config: *const dh_config,
    comm: *const c_void,
    loader_out: *mut *mut dh_loader,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: config is NULL or a live configuration (header contract), only read here.
        let config = unsafe { config.as_ref() }.ok_or_else(|| Error::null("config"))?;
        if comm.is_null() {
            return Err(Error::null("comm"));
        }
        let loader_out = out_arg(loader_out, "loader_out")?;
        if !::mpi::environment::is_initialized() || ::mpi::environment::is_finalized() {
            return Err(Error::new(
                dh_result::DH_MPI_INIT,
                "MPI is not initialised (or already finalised): call MPI_Init before passing a communicator",
            ));
        }
        // SAFETY: comm points to the caller's MPI_Comm (header contract), read once here; MPI is
        // initialised (checked above), and the handle is one of this process's communicators
        // or MPI_COMM_NULL (which dup_caller refuses).
        let caller = unsafe { CallerComm::new(comm.cast::<RawComm>().read()) };
        let loader = Box::new(open_loader(config, Some(caller))?);
        // SAFETY: loader_out is not NULL and points to writable storage for one pointer.
        unsafe { loader_out.write(Box::into_raw(loader)) };
        Ok(())
    })
}

/// Copies the loader's state — where the run stands, a JSON document of a few KiB —
/// into `buf` (truncated to `len - 1` bytes and NUL-terminated when `len > 0`; nothing is written
/// when `buf` is NULL or `len` is 0) and writes the length the whole document needs, NUL
/// included, to `*needed_out`. Save it with the model's checkpoint after a step's update; a new
/// loader continues from it with the configuration key `resume`: its first batch is the step
/// after the one delivered last, every global batch is the one an uninterrupted run delivers
/// (at any world size), it plans with the cost models this run learned, and its skip budget
/// counts on from this run's failed samples. Not collective.
/// Fails with `DH_NULL_PARAMETER` or `DH_CLOSED`.
#[no_mangle]
pub extern "C" fn dh_loader_state(
    loader: *mut dh_loader,
    buf: *mut c_char,
    len: usize,
    needed_out: *mut usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        let needed_out = out_arg(needed_out, "needed_out")?;
        let text = loader.state_json()?;
        let bytes = text.as_bytes();
        if !buf.is_null() && len > 0 {
            let n = bytes.len().min(len - 1);
            // SAFETY: the caller promises buf holds len writable bytes; n + 1 <= len, and the
            // source is a distinct Rust allocation.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        // SAFETY: needed_out is not NULL and points to writable size_t storage.
        unsafe { needed_out.write(bytes.len() + 1) };
        Ok(())
    })
}

/// This rank and the number of ranks. Works in any state (also after close). Fails with
/// `DH_NULL_PARAMETER` only.
#[no_mangle]
pub extern "C" fn dh_loader_world(
    loader: *const dh_loader,
    rank_out: *mut usize,
    size_out: *mut usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_ref() }.ok_or_else(|| Error::null("loader"))?;
        let rank_out = out_arg(rank_out, "rank_out")?;
        let size_out = out_arg(size_out, "size_out")?;
        // SAFETY: both are non-NULL and point to writable size_t storage (header contract).
        unsafe {
            rank_out.write(loader.rank);
            size_out.write(loader.size);
        }
        Ok(())
    })
}

/// Blocks until this rank's batch of the next step is ready and writes it to `*batch_out`,
/// owned by the caller until `dh_batch_release`. **Collective**: every rank calls it once per
/// step. Runs on the calling thread (decoding runs on the loader's worker threads meanwhile).
///
/// Timeout: the loader cannot leave a step that other ranks are in, so there is no per-call
/// deadline of its own. Every collective inside is bounded by the watchdog
/// (`collective_timeout_s`, default `DATAHELIX_COLLECTIVE_TIMEOUT` or 300 s): when one rank
/// stops answering, the watchdog aborts the whole job with a report naming the collective
/// (exit status 3) instead of hanging; decoding is local and finite. `timeout_ms` = 0 accepts
/// that bound; a value at least the watchdog's is accepted too; a shorter non-zero value fails
/// with `DH_UNSUPPORTED` (under MPI; without MPI any value is accepted).
///
/// Fails with `DH_NULL_PARAMETER`, `DH_CLOSED` (closed, or an earlier call failed), `DH_END`
/// (the configured `steps` were delivered), `DH_UNSUPPORTED`, or `DH_INDEX`/`DH_COLLECTIVE`/
/// `DH_LOADER` (the loader is then failed: free it); nothing is written then.
#[no_mangle]
pub extern "C" fn dh_loader_next(
    loader: *mut dh_loader,
    timeout_ms: u32,
    batch_out: *mut *mut dh_batch,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        let batch_out = out_arg(batch_out, "batch_out")?;
        let batch = Box::new(loader.guarded(|l| l.next(timeout_ms))?);
        // SAFETY: batch_out is not NULL and points to writable storage for one pointer.
        unsafe { batch_out.write(Box::into_raw(batch)) };
        Ok(())
    })
}

/// Plans the coming steps and sends what other ranks still need of the step just handed over,
/// while the accelerator runs: call it right after `dh_loader_next`, once the step is launched
/// (without it, `dh_loader_next` does this work on the input-wait path). **Collective**: call
/// it on every rank at every step, or never. With `replica_ranks`, a group's first rank then
/// sends its group what it holds of the next batch, which the others receive here, off their
/// next `dh_loader_next`. Called before the first `dh_loader_next`, it plans the first steps and
/// starts decoding them: call it right after `dh_loader_new`, then load the model. Fails with
/// `DH_NULL_PARAMETER`, `DH_CLOSED`, or `DH_COLLECTIVE`/`DH_LOADER` (the loader is then failed:
/// free it).
#[no_mangle]
pub extern "C" fn dh_loader_prepare_ahead(loader: *mut dh_loader) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        loader.prepare_ahead()
    })
}

/// Near the end of the accelerator step in training — `seconds_to_step_end` before it ends, about
/// 0.1 s — sends the next step's tensors decoded here for other ranks and receives theirs, waits
/// (at most until shortly before the slowest rank is predicted to end its step) for the ones
/// still decoding and sends them too, and puts split samples together: that work then stays
/// off the next `dh_loader_next`. Call it after `dh_loader_prepare_ahead`. **Collective**: call
/// it on every rank at every step, or never. With `replica_ranks`, a group's first rank then
/// sends its group what more it holds of the next batch (as `dh_loader_prepare_ahead`). Fails with `DH_NULL_PARAMETER`, `DH_CLOSED`,
/// `DH_INVALID_PARAMETER` (negative or non-finite seconds), or `DH_COLLECTIVE`/`DH_LOADER` (the
/// loader is then failed: free it).
#[no_mangle]
pub extern "C" fn dh_loader_ship_ahead(loader: *mut dh_loader, seconds_to_step_end: f64) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        loader.ship_ahead(seconds_to_step_end)
    })
}

/// The accelerator side of one training step, for `dh_loader_step`: callbacks the library calls
/// on the calling thread, each given `user`.
#[repr(C)]
pub struct dh_accelerator {
    /// Starts the step on `batch` (asynchronously where the accelerator can; the batch stays
    /// valid until the caller releases it); returns 0, or non-zero to fail the step. Required.
    pub launch: Option<unsafe extern "C" fn(user: *mut c_void, batch: *const dh_batch) -> i32>,
    /// Seconds until the step ends, or a negative value when unknown (the loader then predicts
    /// it). May be NULL (unknown).
    pub seconds_left: Option<unsafe extern "C" fn(user: *mut c_void) -> f64>,
    /// Waits for the step to end; returns its accelerator seconds, or a negative value to fail
    /// the step. Required.
    pub wait: Option<unsafe extern "C" fn(user: *mut c_void) -> f64>,
    /// Passed to every callback.
    pub user: *mut c_void,
}

/// `dh_accelerator`'s waiting side as the loader's step driver sees it.
struct Callbacks<'a> {
    accel: &'a dh_accelerator,
    seconds: f64,
}

impl Accelerator for Callbacks<'_> {
    fn launch(&mut self, _batch: &Batch) -> Result<(), String> {
        Err("dh_loader_step launches the step itself".into())
    }

    fn seconds_left(&self) -> Option<f64> {
        let f = self.accel.seconds_left?;
        // SAFETY: f is the caller's callback, called with the caller's user pointer as the
        // header's contract for dh_accelerator says.
        let left = unsafe { f(self.accel.user) };
        (left.is_finite() && left >= 0.0).then_some(left)
    }

    fn wait(&mut self) -> Result<f64, String> {
        let f = self.accel.wait.ok_or("the accelerator has no wait callback")?;
        // SAFETY: as in seconds_left.
        let seconds = unsafe { f(self.accel.user) };
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(format!("its wait callback returned {seconds}"));
        }
        self.seconds = seconds;
        Ok(seconds)
    }
}

/// One whole training step, driven by the library: the next batch (as `dh_loader_next`), the
/// accelerator's step launched on it through `accel->launch`, the coming steps planned while it
/// runs (`dh_loader_prepare_ahead`), the next step's tensors shipped shortly before it ends
/// (`dh_loader_ship_ahead`, timed by `accel->seconds_left`), `accel->wait`, and the measured
/// seconds reported (`dh_loader_report_step`). Writes the batch to `*batch_out`, owned by the
/// caller until `dh_batch_release`. The step's gradient all-reduce is the caller's, after it
/// returns. **Collective**, like the calls it makes; the callbacks may run the caller's own
/// collectives. Fails with `DH_NULL_PARAMETER` (also a NULL `launch` or `wait`), `DH_CLOSED`,
/// `DH_END`, or `DH_LOADER`/`DH_COLLECTIVE`/`DH_INDEX` (a callback failed, or the step could not
/// go on; the loader is then failed: free it); nothing is written then.
#[no_mangle]
pub extern "C" fn dh_loader_step(
    loader: *mut dh_loader,
    accel: *const dh_accelerator,
    batch_out: *mut *mut dh_batch,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        // SAFETY: accel is NULL or points to a dh_accelerator the caller keeps alive for the call.
        let accel = unsafe { accel.as_ref() }.ok_or_else(|| Error::null("accel"))?;
        let batch_out = out_arg(batch_out, "batch_out")?;
        let launch = accel.launch.ok_or_else(|| Error::null("accel->launch"))?;
        if accel.wait.is_none() {
            return Err(Error::null("accel->wait"));
        }
        let batch = loader.guarded(|loader| {
            let batch = Box::new(loader.next(0)?);
            let launched = Instant::now();
            // SAFETY: launch is the caller's callback, given its user pointer and a live batch.
            let rc = unsafe { launch(accel.user, &*batch) };
            if rc != 0 {
                return Err(Error::new(
                    dh_result::DH_LOADER,
                    format!("the accelerator's launch callback returned {rc} at step {}", batch.batch.step),
                ));
            }
            let mut callbacks = Callbacks { accel, seconds: 0.0 };
            loader.ahead(|l| l.finish_step(&mut callbacks, launched))?;
            loader.unreported = false;
            let now = loader.now();
            if let Some(last) = loader.history.last_mut() {
                last.gpu_s = callbacks.seconds;
                last.end_s = now;
            }
            Ok(batch)
        })?;
        // SAFETY: batch_out is not NULL and points to writable storage for one pointer.
        unsafe { batch_out.write(Box::into_raw(batch)) };
        Ok(())
    })
}

/// Reports the measured accelerator seconds of the step whose batch `dh_loader_next` returned
/// last (call it once per step, before the next `dh_loader_next`; the batch may already be
/// released). The loader learns each rank's accelerator speed from these reports at the next
/// step. Fails with `DH_NULL_PARAMETER`, `DH_CLOSED`, or `DH_INVALID_PARAMETER` (negative or
/// non-finite seconds, or no unreported step).
#[no_mangle]
pub extern "C" fn dh_loader_report_step(loader: *mut dh_loader, accel_seconds: f64) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        loader.report_step(accel_seconds)
    })
}

/// Sums `count` doubles over all ranks, in place (e.g. an emulated gradient all-reduce).
/// **Collective**: every rank calls it with the same `count`. `values` may be NULL only when
/// `count` is 0. Fails with `DH_NULL_PARAMETER`, `DH_CLOSED` or `DH_COLLECTIVE`; `values` is
/// unchanged then.
#[no_mangle]
pub extern "C" fn dh_loader_all_reduce_sum(
    loader: *mut dh_loader,
    values: *mut f64,
    count: usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        if values.is_null() && count > 0 {
            return Err(Error::null("values"));
        }
        let mut buf = vec![0.0; count];
        if count > 0 {
            // SAFETY: values is not NULL and holds count readable doubles (header contract).
            buf.copy_from_slice(unsafe { std::slice::from_raw_parts(values, count) });
        }
        loader.all_reduce_sum(&mut buf)?;
        if count > 0 {
            // SAFETY: values holds count writable doubles; buf is a distinct allocation.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), values, count) };
        }
        Ok(())
    })
}

/// The smallest `dh_metrics` a caller may pass: the struct as it was when `struct_size` came
/// (through `rebalances_skipped`). Later versions only add fields after it.
const METRICS_MIN_SIZE: usize = std::mem::offset_of!(dh_metrics, rebalances_skipped) + 8;

/// Writes what the loader measured on this rank (see `dh_metrics`) to `*metrics_out`, whose
/// `struct_size` the caller set to `sizeof(dh_metrics)`: the fields that fit in both its struct
/// and this library's are written and `struct_size` becomes the bytes written (a caller built
/// against a newer, longer header keeps its extra fields untouched). Works in any state, also
/// after close or a failure. Fails with `DH_NULL_PARAMETER`, or `DH_INVALID_PARAMETER` when
/// `struct_size` is smaller than the first `dh_metrics` with that field (e.g. left unset).
#[no_mangle]
pub extern "C" fn dh_loader_metrics(loader: *const dh_loader, metrics_out: *mut dh_metrics) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_ref() }.ok_or_else(|| Error::null("loader"))?;
        let metrics_out = out_arg(metrics_out, "metrics_out")?.as_ptr();
        loader.check_thread()?;
        // SAFETY: metrics_out is not NULL and points to a dh_metrics of at least METRICS_MIN_SIZE
        // bytes whose leading `struct_size` the caller set (header contract); only that field is
        // read before its value is checked.
        let asked = unsafe { std::ptr::addr_of!((*metrics_out).struct_size).read_unaligned() };
        if asked < METRICS_MIN_SIZE {
            return Err(Error::new(
                dh_result::DH_INVALID_PARAMETER,
                format!(
                    "dh_metrics.struct_size is {asked}; set it to sizeof(dh_metrics) ({} in this build) before dh_loader_metrics",
                    std::mem::size_of::<dh_metrics>()
                ),
            ));
        }
        let mut m = loader.metrics();
        let n = asked.min(std::mem::size_of::<dh_metrics>());
        m.struct_size = n;
        // SAFETY: the caller's struct holds `asked >= n` writable bytes; `m` is a plain-old-data
        // repr(C) value of at least `n` bytes; the two do not overlap (m is on this stack).
        unsafe {
            std::ptr::copy_nonoverlapping((&m as *const dh_metrics).cast::<u8>(), metrics_out.cast::<u8>(), n)
        };
        Ok(())
    })
}

/// Stops the loader: joins its decode workers and frees its communicators (a barrier under the
/// watchdog). **Collective**: every rank closes (or frees) its loader. Afterwards
/// `dh_loader_next` fails with `DH_CLOSED`; metrics and world stay readable; outstanding batches
/// stay valid. Closing a closed or failed loader is a no-op. Fails with `DH_NULL_PARAMETER` only.
#[no_mangle]
pub extern "C" fn dh_loader_close(loader: *mut dh_loader) -> dh_result {
    ffi_boundary!({
        // SAFETY: loader is NULL or a live loader used from its own thread (header contract).
        let loader = unsafe { loader.as_mut() }.ok_or_else(|| Error::null("loader"))?;
        loader.close()
    })
}

/// Frees a loader, closing it first if it is open (then **collective**, as `dh_loader_close`).
/// NULL is a no-op. Freeing twice, or using the loader afterwards, is undefined behaviour (as
/// with `free`). Batches it returned stay valid until released. From another thread than the
/// loader's, nothing is freed (closing would run MPI there): a message on stderr says so.
#[no_mangle]
pub extern "C" fn dh_loader_free(loader: *mut dh_loader) {
    ffi_boundary!(() => {
        if !loader.is_null() {
            // SAFETY: loader came from Box::into_raw in dh_loader_new and, by the header's
            // contract, is freed once.
            let loader = unsafe { Box::from_raw(loader) };
            if let Err(e) = loader.check_thread() {
                // Closing runs MPI on this thread, which MPI_THREAD_FUNNELED forbids: the loader
                // is left as it is (leaked), and the mistake is said where it can be seen.
                eprintln!("dh_loader_free: not freed: {}", e.message());
                std::mem::forget(loader);
            }
        }
    })
}

/// Borrows a batch argument.
///
/// # Safety
/// `batch` is NULL or a live batch (not released).
unsafe fn batch_ref<'a>(batch: *const dh_batch) -> Result<&'a dh_batch, Error> {
    // SAFETY: by this function's contract batch is NULL or live for 'a.
    unsafe { batch.as_ref() }.ok_or_else(|| Error::null("batch"))
}

/// The batch's step (0, 1, ...). Fails with `DH_NULL_PARAMETER` only.
#[no_mangle]
pub extern "C" fn dh_batch_step(batch: *const dh_batch, step_out: *mut u64) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let step_out = out_arg(step_out, "step_out")?;
        // SAFETY: step_out is not NULL and points to a writable uint64_t.
        unsafe { step_out.write(b.batch.step) };
        Ok(())
    })
}

/// The number of samples delivered to this rank in the batch (may be 0). Fails with
/// `DH_NULL_PARAMETER` only.
#[no_mangle]
pub extern "C" fn dh_batch_len(batch: *const dh_batch, len_out: *mut usize) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let len_out = out_arg(len_out, "len_out")?;
        // SAFETY: len_out is not NULL and points to a writable size_t.
        unsafe { len_out.write(b.ids.len()) };
        Ok(())
    })
}

/// The sample ids, in batch order: writes a pointer to `len` ids owned by the batch (valid until
/// `dh_batch_release`; NULL when `len` is 0) and their count. Fails with `DH_NULL_PARAMETER`.
#[no_mangle]
pub extern "C" fn dh_batch_ids(
    batch: *const dh_batch,
    ids_out: *mut *const u64,
    len_out: *mut usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let ids_out = out_arg(ids_out, "ids_out")?;
        let len_out = out_arg(len_out, "len_out")?;
        let p = if b.ids.is_empty() { std::ptr::null() } else { b.ids.as_ptr() };
        // SAFETY: both outputs are non-NULL and writable (header contract).
        unsafe {
            ids_out.write(p);
            len_out.write(b.ids.len());
        }
        Ok(())
    })
}

/// Ids of this rank's samples of the step that could not be delivered (undecodable), owned by
/// the batch like `dh_batch_ids`. Fails with `DH_NULL_PARAMETER`.
#[no_mangle]
pub extern "C" fn dh_batch_skipped(
    batch: *const dh_batch,
    ids_out: *mut *const u64,
    len_out: *mut usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let ids_out = out_arg(ids_out, "ids_out")?;
        let len_out = out_arg(len_out, "len_out")?;
        let s = &b.batch.skipped;
        let p = if s.is_empty() { std::ptr::null() } else { s.as_ptr() };
        // SAFETY: both outputs are non-NULL and writable (header contract).
        unsafe {
            ids_out.write(p);
            len_out.write(s.len());
        }
        Ok(())
    })
}

/// The tensor of sample `index` (`0 <= index < dh_batch_len`): a view into memory owned by the
/// batch, valid until `dh_batch_release` (zero-copy). Fails with `DH_NULL_PARAMETER` or
/// `DH_OUT_OF_RANGE`.
#[no_mangle]
pub extern "C" fn dh_batch_tensor(
    batch: *const dh_batch,
    index: usize,
    tensor_out: *mut dh_tensor,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let tensor_out = out_arg(tensor_out, "tensor_out")?;
        let t = *b.tensors.get(index).ok_or_else(|| {
            Error::new(
                dh_result::DH_OUT_OF_RANGE,
                format!("sample {index} of a batch of {}", b.tensors.len()),
            )
        })?;
        // SAFETY: tensor_out is not NULL and points to a writable dh_tensor.
        unsafe { tensor_out.write(t) };
        Ok(())
    })
}

/// The tokens the loader counts for sample `index` (what balances accelerator work). Fails with
/// `DH_NULL_PARAMETER` or `DH_OUT_OF_RANGE`.
#[no_mangle]
pub extern "C" fn dh_batch_tokens(batch: *const dh_batch, index: usize, tokens_out: *mut u64) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let tokens_out = out_arg(tokens_out, "tokens_out")?;
        let s = b.batch.samples.get(index).ok_or_else(|| {
            Error::new(dh_result::DH_OUT_OF_RANGE, format!("sample {index} of a batch of {}", b.ids.len()))
        })?;
        // SAFETY: tokens_out is not NULL and points to a writable uint64_t.
        unsafe { tokens_out.write(s.tokens) };
        Ok(())
    })
}

/// The metadata of sample `index`: a JSON object (UTF-8, `*len_out` bytes, also NUL-terminated)
/// with its `path` and its manifest row's other fields (caption, label, ...), e.g.
/// `{"path":"videos/a.mp4","caption":"a cat"}`. The text stays valid until the batch is released.
/// Fails with `DH_NULL_PARAMETER` or `DH_OUT_OF_RANGE`.
#[no_mangle]
pub extern "C" fn dh_batch_meta(
    batch: *const dh_batch,
    index: usize,
    json_out: *mut *const c_char,
    len_out: *mut usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let json_out = out_arg(json_out, "json_out")?;
        let len_out = out_arg(len_out, "len_out")?;
        let text = b.meta.get(index).ok_or_else(|| {
            Error::new(dh_result::DH_OUT_OF_RANGE, format!("sample {index} of a batch of {}", b.ids.len()))
        })?;
        // SAFETY: both pointers are not NULL and point to writable values; the text lives in the
        // batch, which outlives the caller's use (header contract).
        unsafe {
            json_out.write(text.as_ptr());
            len_out.write(text.as_bytes().len());
        }
        Ok(())
    })
}

/// Each delivered frame's presentation time of sample `index`, in seconds from its stream's start
/// (`*len_out` = the tensor's `shape[0]` values; 0 for an image), valid until the batch is
/// released. Fails with `DH_NULL_PARAMETER` or `DH_OUT_OF_RANGE`.
#[no_mangle]
pub extern "C" fn dh_batch_timestamps(
    batch: *const dh_batch,
    index: usize,
    seconds_out: *mut *const f64,
    len_out: *mut usize,
) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let seconds_out = out_arg(seconds_out, "seconds_out")?;
        let len_out = out_arg(len_out, "len_out")?;
        let s = b.batch.samples.get(index).ok_or_else(|| {
            Error::new(dh_result::DH_OUT_OF_RANGE, format!("sample {index} of a batch of {}", b.ids.len()))
        })?;
        // SAFETY: both pointers are not NULL and point to writable values; the times live in the
        // batch, which outlives the caller's use (header contract).
        unsafe {
            seconds_out.write(s.timestamps_s.as_ptr());
            len_out.write(s.timestamps_s.len());
        }
        Ok(())
    })
}

/// Seconds `dh_loader_next` blocked for this batch. Fails with `DH_NULL_PARAMETER` only.
#[no_mangle]
pub extern "C" fn dh_batch_input_wait(batch: *const dh_batch, seconds_out: *mut f64) -> dh_result {
    ffi_boundary!({
        // SAFETY: batch is NULL or live (header contract).
        let b = unsafe { batch_ref(batch) }?;
        let seconds_out = out_arg(seconds_out, "seconds_out")?;
        // SAFETY: seconds_out is not NULL and points to a writable double.
        unsafe { seconds_out.write(b.batch.input_wait_s) };
        Ok(())
    })
}

/// Releases the batch in `*batch` (its ids and tensor memory go back to the loader's pool) and
/// sets `*batch` to NULL, so that releasing the same variable twice is a no-op. `batch` NULL or
/// `*batch` NULL is a no-op. Releasing a copy of an already released pointer is undefined
/// behaviour (as with `free`). May be called from any thread, also after the loader was freed.
#[no_mangle]
pub extern "C" fn dh_batch_release(batch: *mut *mut dh_batch) {
    ffi_boundary!(() => {
        if batch.is_null() {
            return;
        }
        // SAFETY: batch is not NULL and points to a readable and writable dh_batch pointer.
        let b = unsafe { std::mem::replace(&mut *batch, std::ptr::null_mut()) };
        if !b.is_null() {
            // SAFETY: b came from Box::into_raw in dh_loader_next and was not released before
            // (the caller's variable is cleared on release).
            drop(unsafe { Box::from_raw(b) });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny dataset of `scripts/specs/tiny.json`, generated and indexed in `dir`.
    fn tiny(dir: &std::path::Path) {
        let spec = crate::gen::Spec::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/specs/tiny.json"),
        )
        .expect("the tiny spec");
        crate::gen::generate(&spec, dir, &crate::gen::GenOptions { workers: 0, force: false, ffmpeg: None })
            .expect("generating the tiny dataset (ffmpeg on PATH)");
        crate::index::writer::build(dir, &crate::index::writer::BuildOptions::default())
            .expect("indexing it");
    }

    #[test]
    fn a_call_that_panicked_fails_the_loader_closed() {
        let dir = tempfile::tempdir().unwrap();
        tiny(dir.path());
        let mut config = dh_config::new().unwrap();
        for (k, v) in
            [("data", dir.path().to_str().unwrap()), ("steps", "4"), ("global_batch", "4"), ("workers", "1")]
        {
            config.set(k, v).unwrap();
        }
        let mut loader = dh_loader::open(&config).unwrap();
        assert!(loader.next_batch().unwrap().is_some(), "the loader works before");
        loader.report_step(0.01).unwrap();
        // A bug panics in the middle of a call; the boundary catches it (DH_PANIC in C).
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _: Result<(), Error> = loader.guarded(|_| panic!("a bug half-way through a call"));
        }));
        assert!(caught.is_err());
        // Every later call is refused instead of going on from a half-finished state.
        let e = loader.next_batch().err().expect("next after a panic must fail");
        assert_eq!(e.code(), dh_result::DH_CLOSED, "{e}");
        assert!(e.message().contains("panicked"), "{e}");
        assert_eq!(loader.report_step(0.01).unwrap_err().code(), dh_result::DH_CLOSED);
        assert_eq!(loader.metrics().steps, 1, "metrics stay readable");
    }
}
