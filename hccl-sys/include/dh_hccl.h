/*
 * dh_hccl.h: the HCCL and ACL runtime calls DataHelix uses, declared by the project itself.
 *
 * Written from the published API facts (shared/reference/hccl-api.md): type sizes, enum values and
 * parameter orders of HCCL (hccl.h, hccl_types.h) and the ACL runtime (acl_rt.h, acl_base.h). It is
 * not Huawei's header: it declares only what hccl-sys binds, in plain C11, so that both the Rust
 * declarations in hccl-sys/src/lib.rs and the host-memory emulator in csrc/hccl-emu/ are checked
 * against one text. Against a real CANN install the same symbols resolve in libhccl.so and
 * libascendcl.so.
 */
#ifndef DH_HCCL_H
#define DH_HCCL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- ACL runtime ---- */

typedef int aclError;                 /* ACL_SUCCESS = 0 */
typedef void *aclrtStream;

#define DH_ACL_SUCCESS 0
#define DH_ACL_ERROR_INVALID_PARAM 100000
#define DH_ACL_ERROR_UNINITIALIZE 100001
#define DH_ACL_ERROR_REPEAT_INITIALIZE 100002
#define DH_ACL_ERROR_BAD_ALLOC 200000
#define DH_ACL_ERROR_INVALID_DEVICE 200002
#define DH_ACL_ERROR_INTERNAL_ERROR 500000
#define DH_ACL_ERROR_RT_CONTEXT_NULL 107002
#define DH_ACL_ERROR_RT_INTERNAL_ERROR 507000
#define DH_ACL_ERROR_RT_STREAM_SYNC_TIMEOUT 507046
#define DH_ACL_ERROR_RT_SUSPECT_REMOTE_ERROR 507057

typedef enum {
    DH_ACL_MEM_MALLOC_HUGE_FIRST = 0,
    DH_ACL_MEM_MALLOC_HUGE_ONLY = 1,
    DH_ACL_MEM_MALLOC_NORMAL_ONLY = 2,
    DH_ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3,
    DH_ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4,
    DH_ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5
} aclrtMemMallocPolicy;

typedef enum {
    DH_ACL_MEMCPY_HOST_TO_HOST = 0,
    DH_ACL_MEMCPY_HOST_TO_DEVICE = 1,
    DH_ACL_MEMCPY_DEVICE_TO_HOST = 2,
    DH_ACL_MEMCPY_DEVICE_TO_DEVICE = 3
} aclrtMemcpyKind;

typedef enum {
    DH_ACL_STREAM_STATUS_COMPLETE = 0,  /* every task on the stream has finished */
    DH_ACL_STREAM_STATUS_NOT_READY = 1, /* at least one has not */
    DH_ACL_STREAM_STATUS_RESERVED = 0xFFFF
} aclrtStreamStatus;

aclError aclInit(const char *configPath);
aclError aclFinalize(void);
aclError aclrtGetDeviceCount(uint32_t *count);
aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtResetDevice(int32_t deviceId);
aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
/* timeout in milliseconds, -1 = wait forever; ACL_ERROR_RT_STREAM_SYNC_TIMEOUT when it passes. */
aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);
/* Does not wait: *status says whether every task on the stream has finished. */
aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status);
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream);

/* ---- HCCL ---- */

typedef void *HcclComm;

#define DH_HCCL_ROOT_INFO_BYTES 4108
typedef struct {
    char internal[DH_HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

typedef enum {
    DH_HCCL_SUCCESS = 0,
    DH_HCCL_E_PARA = 1,
    DH_HCCL_E_PTR = 2,
    DH_HCCL_E_MEMORY = 3,
    DH_HCCL_E_INTERNAL = 4,
    DH_HCCL_E_NOT_SUPPORT = 5,
    DH_HCCL_E_NOT_FOUND = 6,
    DH_HCCL_E_UNAVAIL = 7,
    DH_HCCL_E_SYSCALL = 8,
    DH_HCCL_E_TIMEOUT = 9,
    DH_HCCL_E_OPEN_FILE_FAILURE = 10,
    DH_HCCL_E_TCP_CONNECT = 11,
    DH_HCCL_E_ROCE_CONNECT = 12,
    DH_HCCL_E_TCP_TRANSFER = 13,
    DH_HCCL_E_ROCE_TRANSFER = 14,
    DH_HCCL_E_RUNTIME = 15,
    DH_HCCL_E_DRV = 16,
    DH_HCCL_E_PROFILING = 17,
    DH_HCCL_E_CCE = 18,
    DH_HCCL_E_NETWORK = 19,
    DH_HCCL_E_AGAIN = 20,
    DH_HCCL_E_REMOTE = 21
} HcclResult;

typedef enum {
    DH_HCCL_DATA_TYPE_INT8 = 0,
    DH_HCCL_DATA_TYPE_INT16 = 1,
    DH_HCCL_DATA_TYPE_INT32 = 2,
    DH_HCCL_DATA_TYPE_FP16 = 3,
    DH_HCCL_DATA_TYPE_FP32 = 4,
    DH_HCCL_DATA_TYPE_INT64 = 5,
    DH_HCCL_DATA_TYPE_UINT64 = 6,
    DH_HCCL_DATA_TYPE_UINT8 = 7,
    DH_HCCL_DATA_TYPE_UINT16 = 8,
    DH_HCCL_DATA_TYPE_UINT32 = 9,
    DH_HCCL_DATA_TYPE_FP64 = 10,
    DH_HCCL_DATA_TYPE_BFP16 = 11
} HcclDataType;

typedef enum {
    DH_HCCL_REDUCE_SUM = 0,
    DH_HCCL_REDUCE_PROD = 1,
    DH_HCCL_REDUCE_MAX = 2,
    DH_HCCL_REDUCE_MIN = 3
} HcclReduceOp;

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm);
HcclResult HcclCommDestroy(HcclComm comm);
HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                         aclrtStream stream);
HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                         HcclComm comm, aclrtStream stream);
HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                         aclrtStream stream);
/* Counts and displacements: arrays of nRanks uint64_t, in ELEMENTS of the data type. */
HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls, HcclDataType sendType,
                         const void *recvBuf, const void *recvCounts, const void *rdispls, HcclDataType recvType,
                         HcclComm comm, aclrtStream stream);
HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);

#ifdef __cplusplus
}
#endif
#endif /* DH_HCCL_H */
