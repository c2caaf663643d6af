//! Raw bindings to Huawei's HCCL collective library and the ACL runtime: exactly the calls
//! DataHelix's HCCL backend uses, declared by hand from the project's own header
//! `include/dh_hccl.h` (Huawei's headers need C++ mode and carry a licence that forbids vendoring
//! them). Nothing here is safe to call directly; `datahelix::comm::hccl` wraps every call.
//!
//! This crate is the bottom of DataHelix's three layers at the Ascend edge
//! (`hccl-sys` → `datahelix::comm::hccl::raw` → `HcclCollective`), in the manner of
//! `zstd-sys` / `zstd-safe` / `zstd`.
//!
//! | what | linked from |
//! |---|---|
//! | a CANN install (`DATAHELIX_CANN_HOME`, `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME`, `/usr/local/Ascend/cann`, `/usr/local/Ascend/ascend-toolkit/latest`) | `$ROOT/lib64/libhccl.so`, `$ROOT/lib64/libascendcl.so` |
//! | no CANN found, or `DATAHELIX_HCCL_EMULATOR=1` | the host-memory emulator built from `csrc/hccl-emu/` (one `cargo:warning` says so) |
//!
//! [`LINKED_EMULATOR`] and [`LINKED_FROM`] tell at run time which one this build uses.
//!
//! Facts (types, enum values, parameter orders) follow the public HCCL/ACL API as collected in the
//! project's `shared/reference/hccl-api.md`. All enums are 4-byte C ints; counts and displacements
//! of [`HcclAlltoAllV`] are `uint64_t` **element** counts.
#![cfg_attr(not(test), no_std)]
#![allow(non_camel_case_types, non_snake_case)]

use core::ffi::{c_char, c_int, c_void};

/// Whether this build links the host-memory emulator (`csrc/hccl-emu/`) instead of CANN.
pub const LINKED_EMULATOR: bool = cfg!(hccl_emulator);

/// The directory the libraries were linked from (a CANN `lib64` or the emulator's build folder).
pub const LINKED_FROM: &str = env!("HCCL_SYS_LINKED_FROM");

// ---- ACL runtime ----

/// `aclError`: 0 is success.
pub type aclError = c_int;
/// `aclrtStream`: an opaque stream handle.
pub type aclrtStream = *mut c_void;
/// `aclrtMemMallocPolicy` (a C enum).
pub type aclrtMemMallocPolicy = c_int;
/// `aclrtMemcpyKind` (a C enum).
pub type aclrtMemcpyKind = c_int;
/// `aclrtStreamStatus` (a C enum).
pub type aclrtStreamStatus = c_int;

/// `ACL_SUCCESS`.
pub const ACL_SUCCESS: aclError = 0;
/// `ACL_ERROR_INVALID_PARAM`.
pub const ACL_ERROR_INVALID_PARAM: aclError = 100_000;
/// `ACL_ERROR_UNINITIALIZE`.
pub const ACL_ERROR_UNINITIALIZE: aclError = 100_001;
/// `ACL_ERROR_REPEAT_INITIALIZE`.
pub const ACL_ERROR_REPEAT_INITIALIZE: aclError = 100_002;
/// `ACL_ERROR_BAD_ALLOC`.
pub const ACL_ERROR_BAD_ALLOC: aclError = 200_000;
/// `ACL_ERROR_INVALID_DEVICE`.
pub const ACL_ERROR_INVALID_DEVICE: aclError = 200_002;
/// `ACL_ERROR_INTERNAL_ERROR`.
pub const ACL_ERROR_INTERNAL_ERROR: aclError = 500_000;
/// `ACL_ERROR_RT_CONTEXT_NULL`: no device set on this thread.
pub const ACL_ERROR_RT_CONTEXT_NULL: aclError = 107_002;
/// `ACL_ERROR_RT_INTERNAL_ERROR`: a task on the stream failed.
pub const ACL_ERROR_RT_INTERNAL_ERROR: aclError = 507_000;
/// `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT`.
pub const ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: aclError = 507_046;
/// `ACL_ERROR_RT_SUSPECT_REMOTE_ERROR`: a peer of a collective failed or vanished.
pub const ACL_ERROR_RT_SUSPECT_REMOTE_ERROR: aclError = 507_057;

/// `ACL_MEM_MALLOC_HUGE_FIRST`.
pub const ACL_MEM_MALLOC_HUGE_FIRST: aclrtMemMallocPolicy = 0;
/// `ACL_MEM_MALLOC_NORMAL_ONLY`.
pub const ACL_MEM_MALLOC_NORMAL_ONLY: aclrtMemMallocPolicy = 2;

/// `ACL_MEMCPY_HOST_TO_HOST`.
pub const ACL_MEMCPY_HOST_TO_HOST: aclrtMemcpyKind = 0;
/// `ACL_MEMCPY_HOST_TO_DEVICE`.
pub const ACL_MEMCPY_HOST_TO_DEVICE: aclrtMemcpyKind = 1;
/// `ACL_MEMCPY_DEVICE_TO_HOST`.
pub const ACL_MEMCPY_DEVICE_TO_HOST: aclrtMemcpyKind = 2;
/// `ACL_MEMCPY_DEVICE_TO_DEVICE`.
pub const ACL_MEMCPY_DEVICE_TO_DEVICE: aclrtMemcpyKind = 3;

/// `ACL_STREAM_STATUS_COMPLETE`: every task on the stream has finished.
pub const ACL_STREAM_STATUS_COMPLETE: aclrtStreamStatus = 0;
/// `ACL_STREAM_STATUS_NOT_READY`: at least one task on the stream has not.
pub const ACL_STREAM_STATUS_NOT_READY: aclrtStreamStatus = 1;

// ---- HCCL ----

/// `HcclComm`: an opaque communicator handle.
pub type HcclComm = *mut c_void;
/// `HcclResult` (a C enum).
pub type HcclResult = c_int;
/// `HcclDataType` (a C enum).
pub type HcclDataType = c_int;
/// `HcclReduceOp` (a C enum).
pub type HcclReduceOp = c_int;

/// `HCCL_ROOT_INFO_BYTES`.
pub const HCCL_ROOT_INFO_BYTES: usize = 4108;

/// `HcclRootInfo`: 4108 opaque bytes, alignment 1, produced by [`HcclGetRootInfo`] on one rank
/// and handed to every rank's [`HcclCommInitRootInfo`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HcclRootInfo {
    /// The opaque bytes.
    pub internal: [c_char; HCCL_ROOT_INFO_BYTES],
}

/// `HCCL_SUCCESS` and the error codes, in order (`HCCL_E_PARA` = 1 … `HCCL_E_REMOTE` = 21).
pub const HCCL_SUCCESS: HcclResult = 0;
/// `HCCL_E_PARA`.
pub const HCCL_E_PARA: HcclResult = 1;
/// `HCCL_E_PTR`.
pub const HCCL_E_PTR: HcclResult = 2;
/// `HCCL_E_NOT_SUPPORT`.
pub const HCCL_E_NOT_SUPPORT: HcclResult = 5;
/// `HCCL_E_TIMEOUT`.
pub const HCCL_E_TIMEOUT: HcclResult = 9;

/// `HCCL_DATA_TYPE_INT8`.
pub const HCCL_DATA_TYPE_INT8: HcclDataType = 0;
/// `HCCL_DATA_TYPE_INT16`.
pub const HCCL_DATA_TYPE_INT16: HcclDataType = 1;
/// `HCCL_DATA_TYPE_INT32`.
pub const HCCL_DATA_TYPE_INT32: HcclDataType = 2;
/// `HCCL_DATA_TYPE_FP16`.
pub const HCCL_DATA_TYPE_FP16: HcclDataType = 3;
/// `HCCL_DATA_TYPE_FP32`.
pub const HCCL_DATA_TYPE_FP32: HcclDataType = 4;
/// `HCCL_DATA_TYPE_INT64`.
pub const HCCL_DATA_TYPE_INT64: HcclDataType = 5;
/// `HCCL_DATA_TYPE_UINT64`.
pub const HCCL_DATA_TYPE_UINT64: HcclDataType = 6;
/// `HCCL_DATA_TYPE_UINT8`.
pub const HCCL_DATA_TYPE_UINT8: HcclDataType = 7;
/// `HCCL_DATA_TYPE_UINT16`.
pub const HCCL_DATA_TYPE_UINT16: HcclDataType = 8;
/// `HCCL_DATA_TYPE_UINT32`.
pub const HCCL_DATA_TYPE_UINT32: HcclDataType = 9;
/// `HCCL_DATA_TYPE_FP64`.
pub const HCCL_DATA_TYPE_FP64: HcclDataType = 10;
/// `HCCL_DATA_TYPE_BFP16`.
pub const HCCL_DATA_TYPE_BFP16: HcclDataType = 11;

/// `HCCL_REDUCE_SUM`.
pub const HCCL_REDUCE_SUM: HcclReduceOp = 0;
/// `HCCL_REDUCE_PROD`.
pub const HCCL_REDUCE_PROD: HcclReduceOp = 1;
/// `HCCL_REDUCE_MAX`.
pub const HCCL_REDUCE_MAX: HcclReduceOp = 2;
/// `HCCL_REDUCE_MIN`.
pub const HCCL_REDUCE_MIN: HcclReduceOp = 3;

#[link(name = "ascendcl")]
extern "C" {
    /// `aclInit(const char *configPath)`; `configPath` may be NULL.
    pub fn aclInit(configPath: *const c_char) -> aclError;
    /// `aclFinalize(void)`.
    pub fn aclFinalize() -> aclError;
    /// `aclrtGetDeviceCount(uint32_t *count)`.
    pub fn aclrtGetDeviceCount(count: *mut u32) -> aclError;
    /// `aclrtSetDevice(int32_t deviceId)`: binds the calling thread to the device.
    pub fn aclrtSetDevice(deviceId: i32) -> aclError;
    /// `aclrtResetDevice(int32_t deviceId)`.
    pub fn aclrtResetDevice(deviceId: i32) -> aclError;
    /// `aclrtCreateStream(aclrtStream *stream)`.
    pub fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError;
    /// `aclrtDestroyStream(aclrtStream stream)`.
    pub fn aclrtDestroyStream(stream: aclrtStream) -> aclError;
    /// `aclrtSynchronizeStream(aclrtStream stream)`: waits for every task on the stream.
    pub fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError;
    /// `aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout)`: `timeout` in ms,
    /// -1 for none; `ACL_ERROR_RT_STREAM_SYNC_TIMEOUT` when it passes.
    pub fn aclrtSynchronizeStreamWithTimeout(stream: aclrtStream, timeout: i32) -> aclError;
    /// `aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status)`: does not wait.
    pub fn aclrtStreamQuery(stream: aclrtStream, status: *mut aclrtStreamStatus) -> aclError;
    /// `aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)`.
    pub fn aclrtMalloc(devPtr: *mut *mut c_void, size: usize, policy: aclrtMemMallocPolicy) -> aclError;
    /// `aclrtFree(void *devPtr)`.
    pub fn aclrtFree(devPtr: *mut c_void) -> aclError;
    /// `aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)`:
    /// synchronous; fails if `count > destMax`.
    pub fn aclrtMemcpy(
        dst: *mut c_void,
        destMax: usize,
        src: *const c_void,
        count: usize,
        kind: aclrtMemcpyKind,
    ) -> aclError;
    /// `aclrtMemcpyAsync(…, aclrtStream stream)`: as [`aclrtMemcpy`], enqueued on `stream`.
    pub fn aclrtMemcpyAsync(
        dst: *mut c_void,
        destMax: usize,
        src: *const c_void,
        count: usize,
        kind: aclrtMemcpyKind,
        stream: aclrtStream,
    ) -> aclError;
}

#[link(name = "hccl")]
extern "C" {
    /// `HcclGetRootInfo(HcclRootInfo *rootInfo)`: called by one rank, after `aclrtSetDevice`.
    pub fn HcclGetRootInfo(rootInfo: *mut HcclRootInfo) -> HcclResult;
    /// `HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm)`.
    pub fn HcclCommInitRootInfo(
        nRanks: u32,
        rootInfo: *const HcclRootInfo,
        rank: u32,
        comm: *mut HcclComm,
    ) -> HcclResult;
    /// `HcclCommDestroy(HcclComm comm)`.
    pub fn HcclCommDestroy(comm: HcclComm) -> HcclResult;
    /// `HcclGetRankSize(HcclComm comm, uint32_t *rankSize)`.
    pub fn HcclGetRankSize(comm: HcclComm, rankSize: *mut u32) -> HcclResult;
    /// `HcclGetRankId(HcclComm comm, uint32_t *rank)`.
    pub fn HcclGetRankId(comm: HcclComm, rank: *mut u32) -> HcclResult;
    /// `HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType, HcclComm, aclrtStream)`.
    pub fn HcclAllGather(
        sendBuf: *mut c_void,
        recvBuf: *mut c_void,
        sendCount: u64,
        dataType: HcclDataType,
        comm: HcclComm,
        stream: aclrtStream,
    ) -> HcclResult;
    /// `HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType, HcclReduceOp, HcclComm, aclrtStream)`.
    pub fn HcclAllReduce(
        sendBuf: *mut c_void,
        recvBuf: *mut c_void,
        count: u64,
        dataType: HcclDataType,
        op: HcclReduceOp,
        comm: HcclComm,
        stream: aclrtStream,
    ) -> HcclResult;
    /// `HcclBroadcast(void *buf, uint64_t count, HcclDataType, uint32_t root, HcclComm, aclrtStream)`.
    pub fn HcclBroadcast(
        buf: *mut c_void,
        count: u64,
        dataType: HcclDataType,
        root: u32,
        comm: HcclComm,
        stream: aclrtStream,
    ) -> HcclResult;
    /// `HcclAlltoAllV(sendBuf, sendCounts, sdispls, sendType, recvBuf, recvCounts, rdispls, recvType, comm, stream)`:
    /// the count and displacement arrays hold `nRanks` `uint64_t` element counts; `recvBuf` is
    /// written (it is declared `const` in Huawei's header) and must not alias `sendBuf`.
    pub fn HcclAlltoAllV(
        sendBuf: *const c_void,
        sendCounts: *const c_void,
        sdispls: *const c_void,
        sendType: HcclDataType,
        recvBuf: *const c_void,
        recvCounts: *const c_void,
        rdispls: *const c_void,
        recvType: HcclDataType,
        comm: HcclComm,
        stream: aclrtStream,
    ) -> HcclResult;
    /// `HcclBarrier(HcclComm comm, aclrtStream stream)`.
    pub fn HcclBarrier(comm: HcclComm, stream: aclrtStream) -> HcclResult;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_info_is_4108_bytes_alignment_1() {
        assert_eq!(core::mem::size_of::<HcclRootInfo>(), 4108);
        assert_eq!(core::mem::align_of::<HcclRootInfo>(), 1);
    }
}
