//! `datahelix._native`: the Rust half of the Python package (the pure-Python half, in
//! `python/datahelix/`, is what users import).
//!
//! ```python
//! from datahelix import _native
//! loader = _native.Loader([("data", "data/tiny"), ("steps", "4")])
//! while (batch := loader.next()) is not None:
//!     frames = memoryview(batch.tensor(0))     # uint8 [F, H, W, 3], no copy
//!     loader.report_step(0.01)
//! loader.close()
//! ```
//!
//! The loader is the C ABI's handle ([`dh_loader`]) used through its safe Rust methods, so Python
//! gets C's checks, errors and metrics. A delivered batch leaves the loader's decode pool at once
//! (its buffers stop counting in the byte budget, without a copy): Python may keep its arrays for
//! as long as it likes without stalling decoding, and the memory is freed when the last array,
//! memoryview or DLPack tensor of the batch goes. All `unsafe` of the package is here: the
//! buffer protocol and the DLPack capsule, each block with its `SAFETY:`.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datahelix::exec::loader::Batch as LoadedBatch;
use datahelix::ffi::config::dh_config;
use datahelix::ffi::loader::dh_loader;
use datahelix::ffi::Error;
use pyo3::exceptions::{PyBufferError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{ffi, IntoPyObjectExt};

/// Batches alive (delivered and not yet freed), for tests of ownership.
static LIVE_BATCHES: AtomicUsize = AtomicUsize::new(0);

/// A library error as `datahelix.Error(message, code, name)` (defined in Python, so that it
/// pickles and subclasses like any exception).
fn raise(py: Python<'_>, e: Error) -> PyErr {
    let code = e.code();
    let made = py
        .import("datahelix._errors")
        .and_then(|m| m.getattr("Error"))
        .and_then(|cls| cls.call1((e.message(), code as u32, format!("{code:?}"))));
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(_) => PyRuntimeError::new_err(format!("{code:?}: {}", e.message())),
    }
}

/// One sample's bytes. Python writes to them through the buffer protocol and DLPack, so Rust
/// holds only the raw parts of the vector (never a reference that such a write could alias).
struct Bytes {
    ptr: *mut u8,
    len: usize,
    capacity: usize,
}

// SAFETY: `Bytes` owns its allocation exclusively (a vector taken apart); moving or sharing the
// raw parts between threads is as safe as for `Vec<u8>`. Rust never reads or writes the bytes
// after construction; what Python does with them (through views it was given) is Python's, as
// for any buffer-exporting object.
unsafe impl Send for Bytes {}
// SAFETY: see `Send`: no `&self` method of `Bytes` touches the bytes.
unsafe impl Sync for Bytes {}

impl Bytes {
    fn new(v: Vec<u8>) -> Bytes {
        let mut v = ManuallyDrop::new(v);
        Bytes { ptr: v.as_mut_ptr(), len: v.len(), capacity: v.capacity() }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        // SAFETY: the parts came from a vector in `Bytes::new`, which gave up ownership
        // (ManuallyDrop), and are rebuilt exactly once, here.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.capacity) });
    }
}

/// One delivered batch, shared by its `Batch` object and every view of its tensors.
struct BatchData {
    step: u64,
    ids: Vec<u64>,
    skipped: Vec<u64>,
    tokens: Vec<u64>,
    meta: Vec<String>,
    timestamps: Vec<Vec<f64>>,
    input_wait_s: f64,
    shapes: Vec<[usize; 4]>,
    bytes: Vec<Bytes>,
}

impl BatchData {
    fn new(b: LoadedBatch) -> BatchData {
        let (mut ids, mut tokens, mut shapes, mut bytes) = (vec![], vec![], vec![], vec![]);
        let (mut meta, mut timestamps) = (vec![], vec![]);
        for s in b.samples {
            ids.push(s.id);
            tokens.push(s.tokens);
            meta.push(s.meta);
            timestamps.push(s.timestamps_s);
            shapes.push(s.shape);
            bytes.push(Bytes::new(s.data.into_vec()));
        }
        LIVE_BATCHES.fetch_add(1, Ordering::SeqCst);
        BatchData {
            step: b.step,
            ids,
            skipped: b.skipped,
            tokens,
            meta,
            timestamps,
            input_wait_s: b.input_wait_s,
            shapes,
            bytes,
        }
    }
}

impl Drop for BatchData {
    fn drop(&mut self) {
        LIVE_BATCHES.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One step's batch on this rank.
#[pyclass(frozen, module = "datahelix._native")]
struct Batch {
    data: Arc<BatchData>,
}

#[pymethods]
impl Batch {
    /// The step (0, 1, ...).
    #[getter]
    fn step(&self) -> u64 {
        self.data.step
    }

    /// Delivered sample ids, in batch order.
    #[getter]
    fn ids(&self) -> Vec<u64> {
        self.data.ids.clone()
    }

    /// Ids of this rank's samples that could not be decoded this step.
    #[getter]
    fn skipped(&self) -> Vec<u64> {
        self.data.skipped.clone()
    }

    /// Each delivered sample's tokens (decoded shape and text tokens).
    #[getter]
    fn tokens(&self) -> Vec<u64> {
        self.data.tokens.clone()
    }

    /// Each delivered sample's metadata as JSON text: `path` and the manifest row's other
    /// fields (caption, label, ...).
    #[getter]
    fn meta_json(&self) -> Vec<String> {
        self.data.meta.clone()
    }

    /// Each delivered sample's frame times, seconds from its stream's start (one per frame).
    #[getter]
    fn timestamps(&self) -> Vec<Vec<f64>> {
        self.data.timestamps.clone()
    }

    /// Seconds `next` waited for this batch.
    #[getter]
    fn input_wait_s(&self) -> f64 {
        self.data.input_wait_s
    }

    fn __len__(&self) -> usize {
        self.data.ids.len()
    }

    /// The `index`-th sample's tensor (an exporter of the buffer protocol and DLPack).
    fn tensor(&self, index: usize) -> PyResult<Tensor> {
        if index >= self.data.ids.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "tensor {index} of a batch of {} samples",
                self.data.ids.len()
            )));
        }
        Ok(Tensor { batch: Arc::clone(&self.data), index })
    }
}

/// One sample's frames, `uint8 [F, H, W, 3]`, C-contiguous, in host memory; keeps its batch alive.
#[pyclass(frozen, module = "datahelix._native")]
struct Tensor {
    batch: Arc<BatchData>,
    index: usize,
}

/// The shape and strides a buffer view points to, alive until the view is released.
struct ViewLayout {
    shape: [ffi::Py_ssize_t; 4],
    strides: [ffi::Py_ssize_t; 4],
}

const FORMAT_U8: &CStr = c"B";

impl Tensor {
    fn shape(&self) -> [usize; 4] {
        self.batch.shapes[self.index]
    }

    fn bytes(&self) -> &Bytes {
        &self.batch.bytes[self.index]
    }
}

#[pymethods]
impl Tensor {
    /// `(F, H, W, 3)`.
    #[getter(shape)]
    fn py_shape(&self) -> (usize, usize, usize, usize) {
        let [f, h, w, c] = self.shape();
        (f, h, w, c)
    }

    /// Bytes of the tensor.
    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes().len
    }

    /// The sample id.
    #[getter]
    fn id(&self) -> u64 {
        self.batch.ids[self.index]
    }

    /// The buffer protocol: a 4-dimensional, writable `B` (uint8) view of the frames.
    ///
    /// # Safety
    /// Called by the interpreter with a `view` to fill, as the buffer protocol says.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer view is NULL"));
        }
        let t = slf.get();
        let shape = t.shape();
        let bytes = t.bytes();
        let mut layout = Box::new(ViewLayout { shape: [0; 4], strides: [0; 4] });
        let mut stride = 1usize;
        for d in (0..4).rev() {
            layout.shape[d] = shape[d] as ffi::Py_ssize_t;
            layout.strides[d] = stride as ffi::Py_ssize_t;
            stride *= shape[d];
        }
        if stride != bytes.len {
            return Err(PyBufferError::new_err(format!(
                "sample {}: shape {shape:?} does not match its {} bytes",
                t.batch.ids[t.index], bytes.len
            )));
        }
        let want = |f: c_int| flags & f == f;
        let (buf, len) = (bytes.ptr, bytes.len);
        let layout = Box::into_raw(layout);
        // SAFETY: view is a non-NULL Py_buffer for this call to fill (buffer protocol). The
        // pointers stored outlive the view: `buf` is owned by the batch, kept alive by the
        // reference to `slf` stored in `obj` until the view is released; `shape`/`strides`
        // point into `layout`, freed in __releasebuffer__; `format` is a static string that
        // consumers only read.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = buf.cast::<c_void>();
            (*view).len = len as ffi::Py_ssize_t;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if want(ffi::PyBUF_FORMAT) {
                FORMAT_U8.as_ptr() as *mut c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 4;
            (*view).shape =
                if want(ffi::PyBUF_ND) { (*layout).shape.as_mut_ptr() } else { std::ptr::null_mut() };
            (*view).strides =
                if want(ffi::PyBUF_STRIDES) { (*layout).strides.as_mut_ptr() } else { std::ptr::null_mut() };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = layout.cast::<c_void>();
        }
        Ok(())
    }

    /// Frees the layout `__getbuffer__` gave the view.
    ///
    /// # Safety
    /// Called by the interpreter once per view filled by `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        // SAFETY: `internal` is the ViewLayout box made for this view in __getbuffer__, freed
        // only here, once.
        unsafe {
            let layout = (*view).internal.cast::<ViewLayout>();
            if !layout.is_null() {
                drop(Box::from_raw(layout));
                (*view).internal = std::ptr::null_mut();
            }
        }
    }

    /// DLPack (`torch.from_dlpack(tensor)`): a `dltensor` capsule viewing the frames without a
    /// copy (with `copy=True`, a copy); the capsule, and the tensor made from it, keep the batch
    /// alive. Host memory only: `stream` must be None, `dl_device` the CPU.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        // A producer of the unversioned capsule answers every max_version with it (DLPack spec).
        let _ = max_version;
        if stream.is_some_and(|s| !s.is_none()) {
            return Err(PyBufferError::new_err("a host-memory tensor takes no stream (pass stream=None)"));
        }
        if dl_device.is_some_and(|d| d != (DL_CPU, 0)) {
            return Err(PyBufferError::new_err(format!(
                "the tensor is in host memory (device {:?}); ask for ({DL_CPU}, 0) and copy it yourself",
                dl_device
            )));
        }
        let owner = if copy == Some(true) {
            let b = self.bytes();
            // SAFETY: ptr/len describe the batch's live allocation (kept alive by self).
            let copied = unsafe { std::slice::from_raw_parts(b.ptr, b.len) }.to_vec();
            Owner::Copy(Bytes::new(copied))
        } else {
            Owner::Batch(Arc::clone(&self.batch))
        };
        dlpack::capsule(py, owner, self.index, self.shape())
    }

    /// `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DL_CPU, 0)
    }
}

/// DLPack's device type of host memory.
const DL_CPU: i32 = 1;

/// What keeps a DLPack tensor's bytes alive.
enum Owner {
    Batch(Arc<BatchData>),
    Copy(Bytes),
}

/// The unversioned DLPack ABI (`dlpack.h`, `DLManagedTensor`) and its `dltensor` capsule.
mod dlpack {
    use super::*;

    #[repr(C)]
    struct DLDevice {
        device_type: i32,
        device_id: i32,
    }

    #[repr(C)]
    struct DLDataType {
        code: u8,
        bits: u8,
        lanes: u16,
    }

    #[repr(C)]
    struct DLTensor {
        data: *mut c_void,
        device: DLDevice,
        ndim: i32,
        dtype: DLDataType,
        shape: *mut i64,
        strides: *mut i64,
        byte_offset: u64,
    }

    #[repr(C)]
    struct DLManagedTensor {
        dl_tensor: DLTensor,
        manager_ctx: *mut c_void,
        deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
    }

    /// The managed tensor and what it points to, in one allocation.
    struct Managed {
        tensor: DLManagedTensor,
        shape: [i64; 4],
        _owner: Owner,
    }

    const NAME: &CStr = c"dltensor";
    const DL_UINT: u8 = 1;

    /// DLPack's deleter: frees the managed tensor (and drops its share of the batch).
    unsafe extern "C" fn deleter(t: *mut DLManagedTensor) {
        if t.is_null() {
            return;
        }
        // SAFETY: t is the `tensor` field of a Box<Managed> leaked in `capsule`, whose
        // manager_ctx points to that box; the consumer (or the capsule's destructor, never
        // both: DLPack's protocol renames a consumed capsule) calls this once. Dropping touches
        // only Rust memory, so the GIL is not needed.
        unsafe {
            let managed = (*t).manager_ctx.cast::<Managed>();
            drop(Box::from_raw(managed));
        }
    }

    /// The capsule's destructor: frees the tensor unless a consumer took it (renamed the
    /// capsule to `used_dltensor` and became responsible for calling the deleter).
    unsafe extern "C" fn destructor(capsule: *mut ffi::PyObject) {
        // SAFETY: called by the interpreter with the capsule being destroyed (GIL held);
        // PyCapsule_IsValid and GetPointer only read it; the pointer is our DLManagedTensor.
        unsafe {
            if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
                let t = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
                deleter(t);
            }
        }
    }

    pub(super) fn capsule(
        py: Python<'_>,
        owner: Owner,
        index: usize,
        shape: [usize; 4],
    ) -> PyResult<Py<PyAny>> {
        let data = match &owner {
            Owner::Batch(b) => b.bytes[index].ptr,
            Owner::Copy(c) => c.ptr,
        };
        let mut managed = Box::new(Managed {
            tensor: DLManagedTensor {
                dl_tensor: DLTensor {
                    data: data.cast::<c_void>(),
                    device: DLDevice { device_type: DL_CPU, device_id: 0 },
                    ndim: 4,
                    dtype: DLDataType { code: DL_UINT, bits: 8, lanes: 1 },
                    shape: std::ptr::null_mut(),
                    // NULL strides: compact and row-major (DLPack's convention).
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(deleter),
            },
            shape: shape.map(|d| d as i64),
            _owner: owner,
        });
        managed.tensor.dl_tensor.shape = managed.shape.as_mut_ptr();
        let raw = Box::into_raw(managed);
        // SAFETY: raw is a live Box<Managed>; its tensor's manager_ctx points back to it (the
        // box never moves), so the deleter can free it.
        let tensor = unsafe {
            (*raw).tensor.manager_ctx = raw.cast::<c_void>();
            std::ptr::addr_of_mut!((*raw).tensor)
        };
        // SAFETY: PyCapsule_New with a non-NULL pointer, a static name and a destructor that
        // follows the DLPack protocol; the GIL is held (py).
        let cap = unsafe { ffi::PyCapsule_New(tensor.cast::<c_void>(), NAME.as_ptr(), Some(destructor)) };
        if cap.is_null() {
            // SAFETY: the capsule was not made, so nothing else owns the tensor.
            unsafe { deleter(tensor) };
            return Err(PyErr::fetch(py));
        }
        // SAFETY: cap is a new, owned reference.
        Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
    }
}

/// The loader handle. It may reach other threads (a Python object goes where its references
/// go), but it works only on the thread that made it (MPI runs at `MPI_THREAD_FUNNELED`): every
/// call from elsewhere is refused with `DH_WRONG_THREAD`, and a drop elsewhere leaks it rather
/// than running MPI there.
struct Handle(ManuallyDrop<dh_loader>);

// SAFETY: the loader's MPI state must only be used from the thread that created it, and it is:
// every method that reaches MPI or the decode pool runs through `dh_loader::guarded`, which
// refuses other threads (`DH_WRONG_THREAD`) before doing anything; the read-only accessors used
// here (rank, size, metrics) are checked the same way; PyO3's borrow flags keep two threads from
// holding the handle at once; and `Drop` below never closes the loader on another thread.
unsafe impl Send for Handle {}
// SAFETY: shared access (`&Handle`) only reaches `rank`, `size`, `metrics` and `check_thread`,
// which read plain values, after the thread check; PyO3 never hands out `&Handle` while a
// `&mut Handle` exists (its borrow flag).
unsafe impl Sync for Handle {}

impl Handle {
    /// The loader. Closures passed to `Python::detach` call this, so that they capture the whole
    /// (`Send`) handle rather than its field.
    fn get(&mut self) -> &mut dh_loader {
        &mut self.0
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        match self.0.check_thread() {
            // SAFETY: the loader is dropped once, here, and never used after.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.0) },
            Err(e) => eprintln!(
                "datahelix: a Loader dropped on another thread is not closed (leaked): {}",
                e.message()
            ),
        }
    }
}

/// One rank's loader (see `datahelix.Loader`); used from the thread that made it.
#[pyclass(module = "datahelix._native")]
struct Loader {
    handle: Handle,
}

#[pymethods]
impl Loader {
    /// Opens this rank's loader from `(key, value)` settings (the keys of `dh_config_set`).
    /// **Collective** under MPI: every rank opens its loader with the same settings.
    #[new]
    fn new(py: Python<'_>, settings: Vec<(String, String)>) -> PyResult<Loader> {
        let mut config = dh_config::new().map_err(|e| raise(py, e))?;
        for (key, value) in &settings {
            config.set(key, value).map_err(|e| raise(py, e))?;
        }
        let opened = py.detach(|| dh_loader::open(&config).map(|l| Handle(ManuallyDrop::new(l))));
        Ok(Loader { handle: opened.map_err(|e| raise(py, e))? })
    }

    /// This rank.
    #[getter]
    fn rank(&self, py: Python<'_>) -> PyResult<usize> {
        self.handle.0.check_thread().map_err(|e| raise(py, e))?;
        Ok(self.handle.0.rank())
    }

    /// The number of ranks.
    #[getter]
    fn size(&self, py: Python<'_>) -> PyResult<usize> {
        self.handle.0.check_thread().map_err(|e| raise(py, e))?;
        Ok(self.handle.0.size())
    }

    /// The next step's batch, or None after the configured steps. **Collective.** Releases the
    /// GIL while it waits.
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<Batch>> {
        let handle = &mut self.handle;
        let got = py.detach(|| handle.get().next_batch().map(|b| b.map(BatchData::new)));
        Ok(got.map_err(|e| raise(py, e))?.map(|data| Batch { data: Arc::new(data) }))
    }

    /// Plans ahead while the step runs. **Collective.**
    fn prepare_ahead(&mut self, py: Python<'_>) -> PyResult<()> {
        let handle = &mut self.handle;
        py.detach(|| handle.get().prepare_ahead()).map_err(|e| raise(py, e))
    }

    /// Ships the next step's tensors, `seconds_to_step_end` before the step ends. **Collective.**
    fn ship_ahead(&mut self, py: Python<'_>, seconds_to_step_end: f64) -> PyResult<()> {
        let handle = &mut self.handle;
        py.detach(|| handle.get().ship_ahead(seconds_to_step_end)).map_err(|e| raise(py, e))
    }

    /// Reports the accelerator seconds of the step delivered last.
    fn report_step(&mut self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        self.handle.0.report_step(seconds).map_err(|e| raise(py, e))
    }

    /// Sums the values over all ranks. **Collective.**
    fn all_reduce_sum(&mut self, py: Python<'_>, mut values: Vec<f64>) -> PyResult<Vec<f64>> {
        let handle = &mut self.handle;
        py.detach(|| handle.get().all_reduce_sum(&mut values)).map_err(|e| raise(py, e))?;
        Ok(values)
    }

    /// Where the run stands: the resume state's JSON text.
    fn state(&mut self, py: Python<'_>) -> PyResult<String> {
        self.handle.0.state_json().map_err(|e| raise(py, e))
    }

    /// What the loader measured on this rank (the fields of `dh_metrics`).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.handle.0.check_thread().map_err(|e| raise(py, e))?;
        let m = self.handle.0.metrics();
        let d = PyDict::new(py);
        let fields: [(&str, Py<PyAny>); 16] = [
            ("steps", m.steps.into_py_any(py)?),
            ("samples", m.samples.into_py_any(py)?),
            ("skipped", m.skipped.into_py_any(py)?),
            ("throughput", m.throughput.into_py_any(py)?),
            ("miss_rate", m.miss_rate.into_py_any(py)?),
            ("miss_rate_10ms", m.miss_rate_10ms.into_py_any(py)?),
            ("p50_wait_s", m.p50_wait_s.into_py_any(py)?),
            ("p95_wait_s", m.p95_wait_s.into_py_any(py)?),
            ("max_wait_s", m.max_wait_s.into_py_any(py)?),
            ("total_wait_s", m.total_wait_s.into_py_any(py)?),
            ("accel_s", m.accel_s.into_py_any(py)?),
            ("wall_s", m.wall_s.into_py_any(py)?),
            ("bytes_in", m.bytes_in.into_py_any(py)?),
            ("rebalances_run", m.rebalances_run.into_py_any(py)?),
            ("rebalances_skipped", m.rebalances_skipped.into_py_any(py)?),
            ("late_steps", m.late_steps.into_py_any(py)?),
        ];
        for (k, v) in fields {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Stops the loader (joins its workers). **Collective.** Batches stay valid.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let handle = &mut self.handle;
        py.detach(|| handle.get().close()).map_err(|e| raise(py, e))
    }
}

/// Batches delivered and not yet freed in this process (for tests of ownership).
#[pyfunction]
fn live_batches() -> usize {
    LIVE_BATCHES.load(Ordering::SeqCst)
}

/// The library's version, `(major, minor, patch)`.
#[pyfunction]
fn version(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    use datahelix::ffi::{DH_VERSION_MAJOR, DH_VERSION_MINOR, DH_VERSION_PATCH};
    PyTuple::new(py, [DH_VERSION_MAJOR, DH_VERSION_MINOR, DH_VERSION_PATCH])
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Loader>()?;
    m.add_class::<Batch>()?;
    m.add_class::<Tensor>()?;
    m.add_function(wrap_pyfunction!(live_batches, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    Ok(())
}
