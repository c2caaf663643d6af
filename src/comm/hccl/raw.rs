//! The thin safe layer over `hccl-sys`: owns every `unsafe` of the HCCL backend and maps every
//! return code to [`HcclError`], naming the call. Handles own their foreign resources
//! (`NonNull` + `Drop`) and keep their parents alive ([`Device`] → [`Runtime`]).
//!
//! API facts: the project's `shared/reference/hccl-api.md` (HCCL and ACL runtime signatures,
//! enum values, `HcclRootInfo` = 4108 bytes, uint64 element counts of `HcclAlltoAllV`).

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hccl_sys as sys;

/// An HCCL result code other than success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HcclCode {
    /// `HCCL_E_PARA` (1): an invalid parameter.
    Para,
    /// `HCCL_E_PTR` (2): a null or invalid pointer / handle.
    Ptr,
    /// `HCCL_E_MEMORY` (3).
    Memory,
    /// `HCCL_E_INTERNAL` (4).
    Internal,
    /// `HCCL_E_NOT_SUPPORT` (5): e.g. a data type the operation does not support.
    NotSupport,
    /// `HCCL_E_NOT_FOUND` (6).
    NotFound,
    /// `HCCL_E_UNAVAIL` (7).
    Unavail,
    /// `HCCL_E_SYSCALL` (8).
    Syscall,
    /// `HCCL_E_TIMEOUT` (9): e.g. ranks did not connect within `HCCL_CONNECT_TIMEOUT`.
    Timeout,
    /// `HCCL_E_TCP_CONNECT` (11).
    TcpConnect,
    /// `HCCL_E_RUNTIME` (15): the ACL runtime failed (no device set?).
    Runtime,
    /// `HCCL_E_NETWORK` (19).
    Network,
    /// `HCCL_E_REMOTE` (21).
    Remote,
    /// Any other code.
    Other {
        /// The raw `HcclResult`.
        code: i32,
    },
}

impl HcclCode {
    /// The code for a non-zero `HcclResult`.
    pub fn from_raw(code: i32) -> HcclCode {
        match code {
            1 => HcclCode::Para,
            2 => HcclCode::Ptr,
            3 => HcclCode::Memory,
            4 => HcclCode::Internal,
            5 => HcclCode::NotSupport,
            6 => HcclCode::NotFound,
            7 => HcclCode::Unavail,
            8 => HcclCode::Syscall,
            9 => HcclCode::Timeout,
            11 => HcclCode::TcpConnect,
            15 => HcclCode::Runtime,
            19 => HcclCode::Network,
            21 => HcclCode::Remote,
            code => HcclCode::Other { code },
        }
    }

    /// The raw `HcclResult`.
    pub fn code(self) -> i32 {
        match self {
            HcclCode::Para => 1,
            HcclCode::Ptr => 2,
            HcclCode::Memory => 3,
            HcclCode::Internal => 4,
            HcclCode::NotSupport => 5,
            HcclCode::NotFound => 6,
            HcclCode::Unavail => 7,
            HcclCode::Syscall => 8,
            HcclCode::Timeout => 9,
            HcclCode::TcpConnect => 11,
            HcclCode::Runtime => 15,
            HcclCode::Network => 19,
            HcclCode::Remote => 21,
            HcclCode::Other { code } => code,
        }
    }

    fn name(self) -> &'static str {
        match self {
            HcclCode::Para => "HCCL_E_PARA",
            HcclCode::Ptr => "HCCL_E_PTR",
            HcclCode::Memory => "HCCL_E_MEMORY",
            HcclCode::Internal => "HCCL_E_INTERNAL",
            HcclCode::NotSupport => "HCCL_E_NOT_SUPPORT",
            HcclCode::NotFound => "HCCL_E_NOT_FOUND",
            HcclCode::Unavail => "HCCL_E_UNAVAIL",
            HcclCode::Syscall => "HCCL_E_SYSCALL",
            HcclCode::Timeout => "HCCL_E_TIMEOUT",
            HcclCode::TcpConnect => "HCCL_E_TCP_CONNECT",
            HcclCode::Runtime => "HCCL_E_RUNTIME",
            HcclCode::Network => "HCCL_E_NETWORK",
            HcclCode::Remote => "HCCL_E_REMOTE",
            HcclCode::Other { .. } => "HCCL error",
        }
    }
}

impl fmt::Display for HcclCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// An `aclError` other than success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AclCode {
    /// `ACL_ERROR_INVALID_PARAM` (100000), e.g. `aclrtMemcpy` with `count > destMax`.
    InvalidParam,
    /// `ACL_ERROR_UNINITIALIZE` (100001): `aclInit` was not called.
    Uninitialize,
    /// `ACL_ERROR_REPEAT_INITIALIZE` (100002).
    RepeatInitialize,
    /// `ACL_ERROR_RT_CONTEXT_NULL` (107002): no device set on this thread.
    ContextNull,
    /// `ACL_ERROR_BAD_ALLOC` (200000): out of device memory.
    BadAlloc,
    /// `ACL_ERROR_INVALID_DEVICE` (200002).
    InvalidDevice,
    /// `ACL_ERROR_INTERNAL_ERROR` (500000).
    Internal,
    /// `ACL_ERROR_RT_INTERNAL_ERROR` (507000): a task on the stream (a collective) failed.
    RtInternal,
    /// `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` (507046).
    StreamSyncTimeout,
    /// `ACL_ERROR_RT_SUSPECT_REMOTE_ERROR` (507057): a peer failed or vanished.
    SuspectRemote,
    /// Any other code.
    Other {
        /// The raw `aclError`.
        code: i32,
    },
}

impl AclCode {
    /// The code for a non-zero `aclError`.
    pub fn from_raw(code: i32) -> AclCode {
        match code {
            sys::ACL_ERROR_INVALID_PARAM => AclCode::InvalidParam,
            sys::ACL_ERROR_UNINITIALIZE => AclCode::Uninitialize,
            sys::ACL_ERROR_REPEAT_INITIALIZE => AclCode::RepeatInitialize,
            sys::ACL_ERROR_RT_CONTEXT_NULL => AclCode::ContextNull,
            sys::ACL_ERROR_BAD_ALLOC => AclCode::BadAlloc,
            sys::ACL_ERROR_INVALID_DEVICE => AclCode::InvalidDevice,
            sys::ACL_ERROR_INTERNAL_ERROR => AclCode::Internal,
            sys::ACL_ERROR_RT_INTERNAL_ERROR => AclCode::RtInternal,
            sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT => AclCode::StreamSyncTimeout,
            sys::ACL_ERROR_RT_SUSPECT_REMOTE_ERROR => AclCode::SuspectRemote,
            code => AclCode::Other { code },
        }
    }

    /// The raw `aclError`.
    pub fn code(self) -> i32 {
        match self {
            AclCode::InvalidParam => sys::ACL_ERROR_INVALID_PARAM,
            AclCode::Uninitialize => sys::ACL_ERROR_UNINITIALIZE,
            AclCode::RepeatInitialize => sys::ACL_ERROR_REPEAT_INITIALIZE,
            AclCode::ContextNull => sys::ACL_ERROR_RT_CONTEXT_NULL,
            AclCode::BadAlloc => sys::ACL_ERROR_BAD_ALLOC,
            AclCode::InvalidDevice => sys::ACL_ERROR_INVALID_DEVICE,
            AclCode::Internal => sys::ACL_ERROR_INTERNAL_ERROR,
            AclCode::RtInternal => sys::ACL_ERROR_RT_INTERNAL_ERROR,
            AclCode::StreamSyncTimeout => sys::ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            AclCode::SuspectRemote => sys::ACL_ERROR_RT_SUSPECT_REMOTE_ERROR,
            AclCode::Other { code } => code,
        }
    }

    fn name(self) -> &'static str {
        match self {
            AclCode::InvalidParam => "ACL_ERROR_INVALID_PARAM",
            AclCode::Uninitialize => "ACL_ERROR_UNINITIALIZE",
            AclCode::RepeatInitialize => "ACL_ERROR_REPEAT_INITIALIZE",
            AclCode::ContextNull => "ACL_ERROR_RT_CONTEXT_NULL",
            AclCode::BadAlloc => "ACL_ERROR_BAD_ALLOC",
            AclCode::InvalidDevice => "ACL_ERROR_INVALID_DEVICE",
            AclCode::Internal => "ACL_ERROR_INTERNAL_ERROR",
            AclCode::RtInternal => "ACL_ERROR_RT_INTERNAL_ERROR",
            AclCode::StreamSyncTimeout => "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT",
            AclCode::SuspectRemote => "ACL_ERROR_RT_SUSPECT_REMOTE_ERROR",
            AclCode::Other { .. } => "ACL error",
        }
    }
}

impl fmt::Display for AclCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.code())
    }
}

/// An error of the HCCL/ACL layer: which call, and what it returned (or why it was not made).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HcclError {
    /// An HCCL call returned an error.
    #[error("{call} returned {code}")]
    Hccl {
        /// The HCCL function.
        call: &'static str,
        /// Its result.
        code: HcclCode,
    },
    /// An ACL runtime call returned an error.
    #[error("{call} returned {code}")]
    Acl {
        /// The ACL function.
        call: &'static str,
        /// Its result.
        code: AclCode,
    },
    /// A call reported success but returned a null handle.
    #[error("{call} reported success but returned a null handle")]
    Null {
        /// The function.
        call: &'static str,
    },
    /// The arguments were rejected before the call was made (out of bounds, aliasing, overflow).
    #[error("{call}: {what}")]
    Invalid {
        /// The function that was not called.
        call: &'static str,
        /// What is wrong, with the numbers.
        what: String,
    },
}

impl HcclError {
    /// The ACL code, if an ACL call failed.
    pub fn acl_code(&self) -> Option<AclCode> {
        match self {
            HcclError::Acl { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The HCCL code, if an HCCL call failed.
    pub fn hccl_code(&self) -> Option<HcclCode> {
        match self {
            HcclError::Hccl { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Result of this layer.
pub type Result<T, E = HcclError> = std::result::Result<T, E>;

/// Maps an `HcclResult`.
pub fn check_hccl(ret: sys::HcclResult, call: &'static str) -> Result<()> {
    if ret == sys::HCCL_SUCCESS {
        Ok(())
    } else {
        Err(HcclError::Hccl { call, code: HcclCode::from_raw(ret) })
    }
}

/// Maps an `aclError`.
pub fn check_acl(ret: sys::aclError, call: &'static str) -> Result<()> {
    if ret == sys::ACL_SUCCESS {
        Ok(())
    } else {
        Err(HcclError::Acl { call, code: AclCode::from_raw(ret) })
    }
}

/// HCCL element types (`HcclDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataType {
    /// `HCCL_DATA_TYPE_INT8`.
    I8,
    /// `HCCL_DATA_TYPE_UINT8`.
    U8,
    /// `HCCL_DATA_TYPE_INT16`.
    I16,
    /// `HCCL_DATA_TYPE_UINT16`.
    U16,
    /// `HCCL_DATA_TYPE_FP16`.
    F16,
    /// `HCCL_DATA_TYPE_BFP16`.
    Bf16,
    /// `HCCL_DATA_TYPE_INT32`.
    I32,
    /// `HCCL_DATA_TYPE_UINT32`.
    U32,
    /// `HCCL_DATA_TYPE_FP32`.
    F32,
    /// `HCCL_DATA_TYPE_INT64`.
    I64,
    /// `HCCL_DATA_TYPE_UINT64`.
    U64,
    /// `HCCL_DATA_TYPE_FP64`.
    F64,
}

impl DataType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::I16 | DataType::U16 | DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    fn raw(self) -> sys::HcclDataType {
        match self {
            DataType::I8 => sys::HCCL_DATA_TYPE_INT8,
            DataType::U8 => sys::HCCL_DATA_TYPE_UINT8,
            DataType::I16 => sys::HCCL_DATA_TYPE_INT16,
            DataType::U16 => sys::HCCL_DATA_TYPE_UINT16,
            DataType::F16 => sys::HCCL_DATA_TYPE_FP16,
            DataType::Bf16 => sys::HCCL_DATA_TYPE_BFP16,
            DataType::I32 => sys::HCCL_DATA_TYPE_INT32,
            DataType::U32 => sys::HCCL_DATA_TYPE_UINT32,
            DataType::F32 => sys::HCCL_DATA_TYPE_FP32,
            DataType::I64 => sys::HCCL_DATA_TYPE_INT64,
            DataType::U64 => sys::HCCL_DATA_TYPE_UINT64,
            DataType::F64 => sys::HCCL_DATA_TYPE_FP64,
        }
    }
}

/// HCCL reductions (`HcclReduceOp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// `HCCL_REDUCE_SUM`.
    Sum,
    /// `HCCL_REDUCE_PROD`.
    Prod,
    /// `HCCL_REDUCE_MAX`.
    Max,
    /// `HCCL_REDUCE_MIN`.
    Min,
}

impl Reduce {
    fn raw(self) -> sys::HcclReduceOp {
        match self {
            Reduce::Sum => sys::HCCL_REDUCE_SUM,
            Reduce::Prod => sys::HCCL_REDUCE_PROD,
            Reduce::Max => sys::HCCL_REDUCE_MAX,
            Reduce::Min => sys::HCCL_REDUCE_MIN,
        }
    }
}

// ---- ACL runtime ----

/// `aclInit`, once per process; `aclFinalize` when the last [`Runtime`] is dropped (only if this
/// process's DataHelix called `aclInit`: an embedding application's initialisation is left alone).
#[derive(Debug)]
pub struct Runtime {
    _private: (),
}

/// (live runtimes, whether DataHelix called aclInit)
static RUNTIME: Mutex<(usize, bool)> = Mutex::new((0, false));

impl Runtime {
    /// Initialises the ACL runtime (or joins the initialisation already in force).
    pub fn init() -> Result<Arc<Runtime>> {
        let mut g = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
        if g.0 == 0 {
            // SAFETY: aclInit accepts a null config path (no configuration file).
            let ret = unsafe { sys::aclInit(std::ptr::null()) };
            match ret {
                sys::ACL_SUCCESS => g.1 = true,
                sys::ACL_ERROR_REPEAT_INITIALIZE => g.1 = false,
                r => check_acl(r, "aclInit")?,
            }
        }
        g.0 += 1;
        Ok(Arc::new(Runtime { _private: () }))
    }

    /// `aclrtGetDeviceCount`.
    pub fn device_count(&self) -> Result<u32> {
        let mut n = 0u32;
        // SAFETY: `n` is a valid, writable u32.
        check_acl(unsafe { sys::aclrtGetDeviceCount(&mut n) }, "aclrtGetDeviceCount")?;
        Ok(n)
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let mut g = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
        g.0 -= 1;
        if g.0 == 0 && g.1 {
            g.1 = false;
            // SAFETY: every handle DataHelix made holds a Runtime, so none is left to use ACL.
            let ret = unsafe { sys::aclFinalize() };
            if let Err(e) = check_acl(ret, "aclFinalize") {
                tracing::warn!(target: "datahelix::comm", "{e}");
            }
        }
    }
}

/// A device bound to the calling thread by `aclrtSetDevice`; `aclrtResetDevice` on drop. ACL's
/// device context is per thread, so a `Device` (and everything holding one) is neither `Send`
/// nor `Sync`.
#[derive(Debug)]
pub struct Device {
    id: i32,
    _rt: Arc<Runtime>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Device {
    /// `aclrtSetDevice(id)`.
    pub fn set(rt: Arc<Runtime>, id: u32) -> Result<std::rc::Rc<Device>> {
        let id = i32::try_from(id)
            .map_err(|_| HcclError::Invalid { call: "aclrtSetDevice", what: format!("device id {id}") })?;
        // SAFETY: plain integer argument; ACL validates the id.
        check_acl(unsafe { sys::aclrtSetDevice(id) }, "aclrtSetDevice")?;
        Ok(std::rc::Rc::new(Device { id, _rt: rt, _not_send: std::marker::PhantomData }))
    }

    /// The device id.
    pub fn id(&self) -> i32 {
        self.id
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the id was set by this Device; streams and buffers hold an Rc to it, so they are
        // already gone.
        let ret = unsafe { sys::aclrtResetDevice(self.id) };
        if let Err(e) = check_acl(ret, "aclrtResetDevice") {
            tracing::warn!(target: "datahelix::comm", "{e}");
        }
    }
}

/// An ACL stream (`aclrtCreateStream` / `aclrtDestroyStream`).
#[derive(Debug)]
pub struct Stream {
    raw: NonNull<c_void>,
    _dev: std::rc::Rc<Device>,
}

impl Stream {
    /// `aclrtCreateStream` on `dev` (which must be the calling thread's device).
    pub fn new(dev: std::rc::Rc<Device>) -> Result<Stream> {
        let mut raw: sys::aclrtStream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check_acl(unsafe { sys::aclrtCreateStream(&mut raw) }, "aclrtCreateStream")?;
        let raw = NonNull::new(raw).ok_or(HcclError::Null { call: "aclrtCreateStream" })?;
        Ok(Stream { raw, _dev: dev })
    }

    /// Waits for every task on the stream (`aclrtSynchronizeStreamWithTimeout`; `None` waits forever).
    /// Results of enqueued collectives are valid only after this returns `Ok`.
    pub fn synchronize(&self, timeout: Option<Duration>) -> Result<()> {
        let ms = timeout.map_or(-1, |t| i32::try_from(t.as_millis().max(1)).unwrap_or(i32::MAX));
        // SAFETY: `raw` is a live stream owned by self.
        let ret = unsafe { sys::aclrtSynchronizeStreamWithTimeout(self.raw.as_ptr(), ms) };
        check_acl(ret, "aclrtSynchronizeStreamWithTimeout")
    }

    /// Whether every task on the stream has finished (`aclrtStreamQuery`), without waiting. A task
    /// that failed may report its error here or only at [`Stream::synchronize`].
    pub fn query(&self) -> Result<bool> {
        let mut status: sys::aclrtStreamStatus = sys::ACL_STREAM_STATUS_NOT_READY;
        // SAFETY: `raw` is a live stream owned by self; `status` is a valid out-pointer.
        let ret = unsafe { sys::aclrtStreamQuery(self.raw.as_ptr(), &mut status) };
        check_acl(ret, "aclrtStreamQuery")?;
        Ok(status == sys::ACL_STREAM_STATUS_COMPLETE)
    }

    fn as_raw(&self) -> sys::aclrtStream {
        self.raw.as_ptr()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: `raw` came from aclrtCreateStream and is destroyed once, here.
        let ret = unsafe { sys::aclrtDestroyStream(self.raw.as_ptr()) };
        if let Err(e) = check_acl(ret, "aclrtDestroyStream") {
            tracing::warn!(target: "datahelix::comm", "{e}");
        }
    }
}

/// Device memory from `aclrtMalloc`, freed with `aclrtFree`. Its contents are reachable only
/// through ACL copies ([`DeviceBuffer::write`], [`DeviceBuffer::read`]) and HCCL collectives;
/// [`DeviceBuffer::as_ptr`] exposes the device address for device-side consumers.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: NonNull<c_void>,
    len: usize,
    _dev: std::rc::Rc<Device>,
}

impl DeviceBuffer {
    /// `aclrtMalloc(len)` (at least one byte: ACL rejects zero-size allocations).
    pub fn alloc(dev: std::rc::Rc<Device>, len: usize) -> Result<DeviceBuffer> {
        let len = len.max(1);
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; the policy is a documented enum value.
        let ret = unsafe { sys::aclrtMalloc(&mut p, len, sys::ACL_MEM_MALLOC_HUGE_FIRST) };
        check_acl(ret, "aclrtMalloc")?;
        let ptr = NonNull::new(p).ok_or(HcclError::Null { call: "aclrtMalloc" })?;
        Ok(DeviceBuffer { ptr, len, _dev: dev })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty (never: allocations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address, for device-side consumers (kernels, the executor's batches). Reading
    /// it from the host is not possible on real hardware.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr.as_ptr()
    }

    fn range(&self, call: &'static str, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(HcclError::Invalid {
                call,
                what: format!("{offset}+{len} bytes is beyond the {}-byte device buffer", self.len),
            }),
        }
    }

    /// Copies `src` to the device at `offset` (synchronous `aclrtMemcpy`, host to device).
    pub fn write(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.range("aclrtMemcpy", offset, src.len())?;
        let dest_max = self.len - offset;
        // SAFETY: offset + src.len() <= len (checked), so the destination lies in this
        // allocation; `src` is a live host slice of src.len() bytes.
        let ret = unsafe {
            sys::aclrtMemcpy(
                self.ptr.as_ptr().cast::<u8>().add(offset).cast(),
                dest_max,
                src.as_ptr().cast(),
                src.len(),
                sys::ACL_MEMCPY_HOST_TO_DEVICE,
            )
        };
        check_acl(ret, "aclrtMemcpy")
    }

    /// Copies device bytes from `offset` into `dst` (synchronous `aclrtMemcpy`, device to host).
    /// Only meaningful after the stream that wrote them was synchronised.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.range("aclrtMemcpy", offset, dst.len())?;
        // SAFETY: offset + dst.len() <= len (checked); `dst` is a live, writable host slice.
        let ret = unsafe {
            sys::aclrtMemcpy(
                dst.as_mut_ptr().cast(),
                dst.len(),
                self.ptr.as_ptr().cast::<u8>().add(offset).cast_const().cast(),
                dst.len(),
                sys::ACL_MEMCPY_DEVICE_TO_HOST,
            )
        };
        check_acl(ret, "aclrtMemcpy")
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from aclrtMalloc and is freed once, here. Collectives that use it
        // borrow the buffer until their stream is synchronised (see `InFlight`), so no task still
        // refers to it.
        let ret = unsafe { sys::aclrtFree(self.ptr.as_ptr()) };
        if let Err(e) = check_acl(ret, "aclrtFree") {
            tracing::warn!(target: "datahelix::comm", "{e}");
        }
    }
}

// ---- HCCL ----

/// The 4108-byte `HcclRootInfo` one rank makes and every rank needs.
#[derive(Clone)]
pub struct RootInfo(pub [u8; sys::HCCL_ROOT_INFO_BYTES]);

impl RootInfo {
    /// `HcclGetRootInfo` (call on one rank, after [`Device::set`]).
    pub fn new(_dev: &Device) -> Result<RootInfo> {
        let mut info = sys::HcclRootInfo { internal: [0; sys::HCCL_ROOT_INFO_BYTES] };
        // SAFETY: `info` is a valid, writable HcclRootInfo.
        check_hccl(unsafe { sys::HcclGetRootInfo(&mut info) }, "HcclGetRootInfo")?;
        Ok(RootInfo(info.internal.map(|c| c as u8)))
    }

    /// Zeroes, to be filled by a broadcast.
    pub fn empty() -> RootInfo {
        RootInfo([0; sys::HCCL_ROOT_INFO_BYTES])
    }
}

/// An HCCL communicator (`HcclCommInitRootInfo` / `HcclCommDestroy`).
#[derive(Debug)]
pub struct Comm {
    raw: NonNull<c_void>,
    rank: usize,
    size: usize,
    _dev: std::rc::Rc<Device>,
}

/// The counts and displacements of one all-to-all-v, in elements, one entry per rank.
#[derive(Clone, Copy, Debug)]
pub struct AllToAllVLayout<'a> {
    /// Elements sent to each rank.
    pub send_counts: &'a [u64],
    /// Element offset in the send buffer of each rank's block.
    pub send_displs: &'a [u64],
    /// Elements received from each rank.
    pub recv_counts: &'a [u64],
    /// Element offset in the receive buffer of each rank's block.
    pub recv_displs: &'a [u64],
}

impl Comm {
    /// `HcclCommInitRootInfo(size, root, rank)`, then checks `HcclGetRankSize` / `HcclGetRankId`.
    pub fn init(dev: std::rc::Rc<Device>, size: usize, root: &RootInfo, rank: usize) -> Result<Comm> {
        let n = u32::try_from(size).map_err(|_| HcclError::Invalid {
            call: "HcclCommInitRootInfo",
            what: format!("{size} ranks"),
        })?;
        let r = u32::try_from(rank)
            .map_err(|_| HcclError::Invalid { call: "HcclCommInitRootInfo", what: format!("rank {rank}") })?;
        let info = sys::HcclRootInfo { internal: root.0.map(|b| b as std::ffi::c_char) };
        let mut raw: sys::HcclComm = std::ptr::null_mut();
        // SAFETY: `info` is a valid root info for the duration of the call; `raw` is a valid
        // out-pointer.
        check_hccl(unsafe { sys::HcclCommInitRootInfo(n, &info, r, &mut raw) }, "HcclCommInitRootInfo")?;
        let raw = NonNull::new(raw).ok_or(HcclError::Null { call: "HcclCommInitRootInfo" })?;
        let comm = Comm { raw, rank, size, _dev: dev };
        let (mut got_n, mut got_r) = (0u32, 0u32);
        // SAFETY: `raw` is a live communicator; the out-pointers are valid u32s.
        check_hccl(unsafe { sys::HcclGetRankSize(comm.raw.as_ptr(), &mut got_n) }, "HcclGetRankSize")?;
        // SAFETY: as above.
        check_hccl(unsafe { sys::HcclGetRankId(comm.raw.as_ptr(), &mut got_r) }, "HcclGetRankId")?;
        if (got_n, got_r) != (n, r) {
            return Err(HcclError::Invalid {
                call: "HcclCommInitRootInfo",
                what: format!("asked for rank {r} of {n}, the communicator says rank {got_r} of {got_n}"),
            });
        }
        Ok(comm)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    fn bytes(call: &'static str, count: u64, dtype: DataType) -> Result<usize> {
        usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(dtype.size()))
            .ok_or_else(|| HcclError::Invalid { call, what: format!("{count} elements overflow") })
    }

    /// Enqueues `HcclAllGather` of `count` elements per rank on `stream`.
    pub fn all_gather<'a>(
        &self,
        stream: &'a Stream,
        send: &'a DeviceBuffer,
        recv: &'a mut DeviceBuffer,
        count: u64,
        dtype: DataType,
    ) -> Result<InFlight<'a>> {
        const CALL: &str = "HcclAllGather";
        let b = Self::bytes(CALL, count, dtype)?;
        send.range(CALL, 0, b)?;
        recv.range(CALL, 0, b.saturating_mul(self.size))?;
        // SAFETY: both buffers are live device allocations large enough (checked) and distinct
        // (`recv` is borrowed mutably); InFlight keeps them borrowed until the stream is synced.
        let ret = unsafe {
            sys::HcclAllGather(
                send.ptr.as_ptr(),
                recv.ptr.as_ptr(),
                count,
                dtype.raw(),
                self.raw.as_ptr(),
                stream.as_raw(),
            )
        };
        check_hccl(ret, CALL)?;
        Ok(InFlight { stream, done: false })
    }

    /// Enqueues `HcclAllReduce` of `count` elements from `send` into `recv`.
    pub fn all_reduce<'a>(
        &self,
        stream: &'a Stream,
        send: &'a DeviceBuffer,
        recv: &'a mut DeviceBuffer,
        count: u64,
        dtype: DataType,
        op: Reduce,
    ) -> Result<InFlight<'a>> {
        const CALL: &str = "HcclAllReduce";
        let b = Self::bytes(CALL, count, dtype)?;
        send.range(CALL, 0, b)?;
        recv.range(CALL, 0, b)?;
        // SAFETY: as in all_gather.
        let ret = unsafe {
            sys::HcclAllReduce(
                send.ptr.as_ptr(),
                recv.ptr.as_ptr(),
                count,
                dtype.raw(),
                op.raw(),
                self.raw.as_ptr(),
                stream.as_raw(),
            )
        };
        check_hccl(ret, CALL)?;
        Ok(InFlight { stream, done: false })
    }

    /// Enqueues `HcclBroadcast` of `count` elements of `buf` from `root` (in place).
    pub fn broadcast<'a>(
        &self,
        stream: &'a Stream,
        buf: &'a mut DeviceBuffer,
        count: u64,
        dtype: DataType,
        root: usize,
    ) -> Result<InFlight<'a>> {
        const CALL: &str = "HcclBroadcast";
        let b = Self::bytes(CALL, count, dtype)?;
        buf.range(CALL, 0, b)?;
        let root = u32::try_from(root).ok().filter(|&r| (r as usize) < self.size).ok_or_else(|| {
            HcclError::Invalid { call: CALL, what: format!("root {root} of {} ranks", self.size) }
        })?;
        // SAFETY: `buf` is a live device allocation of at least b bytes, borrowed until synced.
        let ret = unsafe {
            sys::HcclBroadcast(buf.ptr.as_ptr(), count, dtype.raw(), root, self.raw.as_ptr(), stream.as_raw())
        };
        check_hccl(ret, CALL)?;
        Ok(InFlight { stream, done: false })
    }

    /// Enqueues `HcclAlltoAllV`: counts and displacements in elements of `dtype` (uint64, as HCCL
    /// takes them), one entry per rank, every block inside its buffer.
    pub fn all_to_all_v<'a>(
        &self,
        stream: &'a Stream,
        send: &'a DeviceBuffer,
        recv: &'a mut DeviceBuffer,
        layout: AllToAllVLayout<'_>,
        dtype: DataType,
    ) -> Result<InFlight<'a>> {
        const CALL: &str = "HcclAlltoAllV";
        let n = self.size;
        let arrays = [layout.send_counts, layout.send_displs, layout.recv_counts, layout.recv_displs];
        if arrays.iter().any(|a| a.len() != n) {
            return Err(HcclError::Invalid {
                call: CALL,
                what: format!(
                    "count/displacement arrays have {:?} entries, expected {n}",
                    arrays.map(<[u64]>::len)
                ),
            });
        }
        for p in 0..n {
            let sb = Self::bytes(CALL, layout.send_counts[p], dtype)?;
            let so = Self::bytes(CALL, layout.send_displs[p], dtype)?;
            let rb = Self::bytes(CALL, layout.recv_counts[p], dtype)?;
            let ro = Self::bytes(CALL, layout.recv_displs[p], dtype)?;
            send.range(CALL, so, sb)?;
            recv.range(CALL, ro, rb)?;
        }
        // SAFETY: every block lies inside its live device buffer (checked above); the buffers are
        // distinct allocations (`recv` is borrowed mutably, so it cannot alias `send`); the four
        // arrays hold n uint64 each and HCCL reads them during the call. InFlight keeps the
        // buffers borrowed until the stream is synced.
        let ret = unsafe {
            sys::HcclAlltoAllV(
                send.ptr.as_ptr(),
                layout.send_counts.as_ptr().cast(),
                layout.send_displs.as_ptr().cast(),
                dtype.raw(),
                recv.ptr.as_ptr(),
                layout.recv_counts.as_ptr().cast(),
                layout.recv_displs.as_ptr().cast(),
                dtype.raw(),
                self.raw.as_ptr(),
                stream.as_raw(),
            )
        };
        check_hccl(ret, CALL)?;
        Ok(InFlight { stream, done: false })
    }

    /// Enqueues `HcclBarrier`.
    pub fn barrier<'a>(&self, stream: &'a Stream) -> Result<InFlight<'a>> {
        // SAFETY: live communicator and stream.
        check_hccl(unsafe { sys::HcclBarrier(self.raw.as_ptr(), stream.as_raw()) }, "HcclBarrier")?;
        Ok(InFlight { stream, done: false })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: `raw` came from HcclCommInitRootInfo and is destroyed once, here.
        let ret = unsafe { sys::HcclCommDestroy(self.raw.as_ptr()) };
        if let Err(e) = check_hccl(ret, "HcclCommDestroy") {
            tracing::warn!(target: "datahelix::comm", "{e}");
        }
    }
}

/// A collective enqueued on a stream. It borrows the buffers it uses until [`InFlight::wait`]
/// synchronises the stream, so safe code cannot read a receive buffer before the result is valid
/// (on the emulator such a read sees poison). Dropping it unwaited synchronises without a timeout.
#[must_use = "a collective's results are valid only after wait()"]
pub struct InFlight<'a> {
    stream: &'a Stream,
    done: bool,
}

impl InFlight<'_> {
    /// Releases the borrows without synchronising. The caller must synchronise the stream before
    /// it touches or drops the buffers of the collective (the backend's staged path does).
    pub(super) fn forget(mut self) {
        self.done = true;
    }

    /// Whether the stream's tasks, this collective's included, have finished (`aclrtStreamQuery`),
    /// without waiting. The results are valid only after [`InFlight::wait`].
    pub fn is_done(&self) -> Result<bool> {
        self.stream.query()
    }

    /// `aclrtSynchronizeStreamWithTimeout`; the results are valid once this returns `Ok`.
    pub fn wait(mut self, timeout: Option<Duration>) -> Result<()> {
        self.done = true;
        self.stream.synchronize(timeout)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.stream.synchronize(None) {
                tracing::warn!(target: "datahelix::comm", "collective dropped unwaited: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for c in 1..=25 {
            assert_eq!(HcclCode::from_raw(c).code(), c);
        }
        for c in
            [100_000, 100_001, 100_002, 107_002, 200_000, 200_002, 500_000, 507_000, 507_046, 507_057, 42]
        {
            assert_eq!(AclCode::from_raw(c).code(), c);
        }
        let e = check_acl(100_000, "aclrtMemcpy").unwrap_err();
        assert_eq!(e.acl_code(), Some(AclCode::InvalidParam));
        assert_eq!(e.to_string(), "aclrtMemcpy returned ACL_ERROR_INVALID_PARAM (100000)");
        let e = check_hccl(1, "HcclAlltoAllV").unwrap_err();
        assert_eq!(e.to_string(), "HcclAlltoAllV returned HCCL_E_PARA (1)");
    }
}
