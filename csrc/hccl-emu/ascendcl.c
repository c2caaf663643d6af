/*
 * libascendcl.so of the DataHelix HCCL/ACL emulator: the ACL runtime calls hccl-sys declares,
 * on host memory. "Device" memory is page-aligned host memory filled with DHEMU_POISON; streams are
 * FIFO task queues run by aclrtSynchronizeStream[WithTimeout] and aclrtStreamQuery (a collective
 * that cannot finish at once for a query stays queued and goes on at the next call); aclrtMemcpy is synchronous and
 * enforces destMax; errors are the real ACL codes. Single process; the multi-process part lives in
 * hccl.c. See docs/hccl.md for what is and is not modelled.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

#define MAX_DEVICES 64
#define STREAM_MAGIC 0x53545245414d4555ull /* "STREAMEU" */

struct task {
    dhemu_run_fn run;
    dhemu_drop_fn drop;
    void *arg;
    struct task *next;
};

struct stream {
    uint64_t magic;
    int32_t device;
    struct task *head, *tail;
    struct stream *next_live;
};

struct alloc {
    char *base;
    size_t size;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_inited;
static int g_dev_refs[MAX_DEVICES];
static __thread int32_t t_device = -1;
static struct stream *g_streams;
static struct alloc *g_allocs;
static size_t g_nallocs, g_cap;

DHEMU_API void dhemu_log(const char *fmt, ...) {
    const char *q = getenv("DHEMU_QUIET");
    if (q && q[0] == '1') return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "hccl-emu[%d]: %s\n", (int)getpid(), line);
}

DHEMU_API int64_t dhemu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

DHEMU_API int32_t dhemu_current_device(void) { return t_device; }

static uint32_t device_count(void) {
    const char *vis = getenv("ASCEND_RT_VISIBLE_DEVICES");
    if (vis && *vis) {
        uint32_t n = 1;
        for (const char *p = vis; *p; p++) n += (*p == ',');
        return n < MAX_DEVICES ? n : MAX_DEVICES;
    }
    const char *c = getenv("DHEMU_DEVICE_COUNT");
    if (c && *c) {
        long v = strtol(c, NULL, 10);
        if (v >= 0 && v <= MAX_DEVICES) return (uint32_t)v; /* 0: a host without devices */
    }
    return 8;
}

DHEMU_API aclError aclInit(const char *configPath) {
    (void)configPath;
    pthread_mutex_lock(&g_lock);
    aclError r = g_inited ? DH_ACL_ERROR_REPEAT_INITIALIZE : DH_ACL_SUCCESS;
    g_inited = 1;
    pthread_mutex_unlock(&g_lock);
    return r;
}

DHEMU_API aclError aclFinalize(void) {
    pthread_mutex_lock(&g_lock);
    aclError r = g_inited ? DH_ACL_SUCCESS : DH_ACL_ERROR_UNINITIALIZE;
    g_inited = 0;
    pthread_mutex_unlock(&g_lock);
    return r;
}

DHEMU_API aclError aclrtGetDeviceCount(uint32_t *count) {
    if (!count) return DH_ACL_ERROR_INVALID_PARAM;
    if (!g_inited) return DH_ACL_ERROR_UNINITIALIZE;
    *count = device_count();
    return DH_ACL_SUCCESS;
}

DHEMU_API aclError aclrtSetDevice(int32_t deviceId) {
    if (!g_inited) return DH_ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || (uint32_t)deviceId >= device_count()) {
        dhemu_log("aclrtSetDevice(%d): %u devices", deviceId, device_count());
        return DH_ACL_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&g_lock);
    g_dev_refs[deviceId]++;
    pthread_mutex_unlock(&g_lock);
    t_device = deviceId;
    return DH_ACL_SUCCESS;
}

DHEMU_API aclError aclrtResetDevice(int32_t deviceId) {
    if (deviceId < 0 || deviceId >= MAX_DEVICES) return DH_ACL_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    aclError r = DH_ACL_SUCCESS;
    if (g_dev_refs[deviceId] == 0)
        r = DH_ACL_ERROR_INVALID_DEVICE;
    else
        g_dev_refs[deviceId]--;
    pthread_mutex_unlock(&g_lock);
    if (t_device == deviceId) t_device = -1;
    return r;
}

/* ---- memory ---- */

DHEMU_API int dhemu_device_range(const void *p, size_t len) {
    const char *c = p;
    int ok = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nallocs && !ok; i++) {
        const struct alloc *a = &g_allocs[i];
        ok = c >= a->base && c <= a->base + a->size && len <= (size_t)(a->base + a->size - c);
    }
    pthread_mutex_unlock(&g_lock);
    return ok;
}

DHEMU_API aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
    if (!devPtr || size == 0 || (int)policy < 0 || (int)policy > 5) return DH_ACL_ERROR_INVALID_PARAM;
    if (!g_inited) return DH_ACL_ERROR_UNINITIALIZE;
    if (t_device < 0) return DH_ACL_ERROR_RT_CONTEXT_NULL;
    void *p = NULL;
    if (posix_memalign(&p, 4096, size) != 0) return DH_ACL_ERROR_BAD_ALLOC;
    memset(p, DHEMU_POISON, size);
    pthread_mutex_lock(&g_lock);
    if (g_nallocs == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 64;
        struct alloc *n = realloc(g_allocs, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g_lock);
            free(p);
            return DH_ACL_ERROR_BAD_ALLOC;
        }
        g_allocs = n;
        g_cap = cap;
    }
    g_allocs[g_nallocs++] = (struct alloc){p, size};
    pthread_mutex_unlock(&g_lock);
    *devPtr = p;
    return DH_ACL_SUCCESS;
}

DHEMU_API aclError aclrtFree(void *devPtr) {
    if (!devPtr) return DH_ACL_ERROR_INVALID_PARAM;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nallocs; i++) {
        if (g_allocs[i].base == devPtr) {
            g_allocs[i] = g_allocs[--g_nallocs];
            pthread_mutex_unlock(&g_lock);
            free(devPtr);
            return DH_ACL_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    dhemu_log("aclrtFree(%p): not an address aclrtMalloc returned", devPtr);
    return DH_ACL_ERROR_INVALID_PARAM;
}

static aclError check_copy(const char *call, void *dst, size_t destMax, const void *src, size_t count,
                           aclrtMemcpyKind kind) {
    if (!dst || !src) {
        dhemu_log("%s: null pointer (dst %p, src %p)", call, dst, src);
        return DH_ACL_ERROR_INVALID_PARAM;
    }
    if (count > destMax) {
        dhemu_log("%s: count %zu exceeds destMax %zu", call, count, destMax);
        return DH_ACL_ERROR_INVALID_PARAM;
    }
    if ((int)kind < 0 || (int)kind > 3) {
        dhemu_log("%s: invalid kind %d", call, (int)kind);
        return DH_ACL_ERROR_INVALID_PARAM;
    }
    int dst_dev = kind == DH_ACL_MEMCPY_HOST_TO_DEVICE || kind == DH_ACL_MEMCPY_DEVICE_TO_DEVICE;
    int src_dev = kind == DH_ACL_MEMCPY_DEVICE_TO_HOST || kind == DH_ACL_MEMCPY_DEVICE_TO_DEVICE;
    if (dst_dev && !dhemu_device_range(dst, count)) {
        dhemu_log("%s: destination %p+%zu is not inside device memory from aclrtMalloc", call, dst, count);
        return DH_ACL_ERROR_INVALID_PARAM;
    }
    if (src_dev && !dhemu_device_range(src, count)) {
        dhemu_log("%s: source %p+%zu is not inside device memory from aclrtMalloc", call, src, count);
        return DH_ACL_ERROR_INVALID_PARAM;
    }
    return DH_ACL_SUCCESS;
}

DHEMU_API aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
    aclError r = check_copy("aclrtMemcpy", dst, destMax, src, count, kind);
    if (r != DH_ACL_SUCCESS) return r;
    if (count) memmove(dst, src, count);
    return DH_ACL_SUCCESS;
}

struct copy_task {
    void *dst;
    const void *src;
    size_t count;
};

static aclError run_copy(void *arg, int64_t deadline_ns) {
    (void)deadline_ns;
    struct copy_task *t = arg;
    if (t->count) memmove(t->dst, t->src, t->count);
    return DH_ACL_SUCCESS;
}

DHEMU_API aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count,
                                    aclrtMemcpyKind kind, aclrtStream stream) {
    aclError r = check_copy("aclrtMemcpyAsync", dst, destMax, src, count, kind);
    if (r != DH_ACL_SUCCESS) return r;
    struct copy_task *t = malloc(sizeof *t);
    if (!t) return DH_ACL_ERROR_BAD_ALLOC;
    *t = (struct copy_task){dst, src, count};
    r = dhemu_stream_enqueue(stream, run_copy, free, t);
    if (r != DH_ACL_SUCCESS) free(t);
    return r;
}

/* ---- streams ---- */

static struct stream *find_stream_locked(aclrtStream s) {
    for (struct stream *p = g_streams; p; p = p->next_live)
        if (p == s && p->magic == STREAM_MAGIC) return p;
    return NULL;
}

DHEMU_API int dhemu_stream_valid(aclrtStream stream) {
    pthread_mutex_lock(&g_lock);
    int ok = find_stream_locked(stream) != NULL;
    pthread_mutex_unlock(&g_lock);
    return ok;
}

DHEMU_API aclError aclrtCreateStream(aclrtStream *stream) {
    if (!stream) return DH_ACL_ERROR_INVALID_PARAM;
    if (!g_inited) return DH_ACL_ERROR_UNINITIALIZE;
    if (t_device < 0) return DH_ACL_ERROR_RT_CONTEXT_NULL;
    struct stream *s = calloc(1, sizeof *s);
    if (!s) return DH_ACL_ERROR_BAD_ALLOC;
    s->magic = STREAM_MAGIC;
    s->device = t_device;
    pthread_mutex_lock(&g_lock);
    s->next_live = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_lock);
    *stream = s;
    return DH_ACL_SUCCESS;
}

DHEMU_API aclError dhemu_stream_enqueue(aclrtStream stream, dhemu_run_fn run, dhemu_drop_fn drop, void *arg) {
    struct task *t = malloc(sizeof *t);
    if (!t) return DH_ACL_ERROR_BAD_ALLOC;
    *t = (struct task){run, drop, arg, NULL};
    pthread_mutex_lock(&g_lock);
    struct stream *s = find_stream_locked(stream);
    if (!s) {
        pthread_mutex_unlock(&g_lock);
        free(t);
        return DH_ACL_ERROR_INVALID_PARAM;
    }
    if (s->tail)
        s->tail->next = t;
    else
        s->head = t;
    s->tail = t;
    pthread_mutex_unlock(&g_lock);
    return DH_ACL_SUCCESS;
}

/* Takes the stream's queue (NULL and *found = 0 if the stream is not live). */
static struct task *take_queue(aclrtStream stream, int unlink, int *found) {
    pthread_mutex_lock(&g_lock);
    struct stream *s = find_stream_locked(stream);
    struct task *q = NULL;
    *found = s != NULL;
    if (s) {
        q = s->head;
        s->head = s->tail = NULL;
        if (unlink) {
            for (struct stream **pp = &g_streams; *pp; pp = &(*pp)->next_live) {
                if (*pp == s) {
                    *pp = s->next_live;
                    break;
                }
            }
            s->magic = 0;
            free(s);
        }
    }
    pthread_mutex_unlock(&g_lock);
    return q;
}

static void drop_all(struct task *t) {
    while (t) {
        struct task *next = t->next;
        if (t->drop) t->drop(t->arg);
        free(t);
        t = next;
    }
}

DHEMU_API aclError aclrtDestroyStream(aclrtStream stream) {
    int found;
    struct task *q = take_queue(stream, 1, &found);
    if (!found) return DH_ACL_ERROR_INVALID_PARAM;
    if (q) dhemu_log("aclrtDestroyStream: dropping tasks never synchronised");
    drop_all(q);
    return DH_ACL_SUCCESS;
}

/* Puts unfinished tasks back in front of the stream's queue (a stream destroyed meanwhile: drops them). */
static void requeue(aclrtStream stream, struct task *q) {
    struct task *last = q;
    while (last->next) last = last->next;
    pthread_mutex_lock(&g_lock);
    struct stream *s = find_stream_locked(stream);
    if (s) {
        last->next = s->head;
        s->head = q;
        if (!s->tail) s->tail = last;
        q = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    drop_all(q);
}

/* Runs the stream's tasks in order until one fails or cannot finish before deadline_ns: returns
 * DH_ACL_SUCCESS (all done), DHEMU_PENDING (the rest requeued) or the failed task's aclError. */
static aclError run_queue(aclrtStream stream, int64_t deadline_ns) {
    int found;
    struct task *q = take_queue(stream, 0, &found);
    if (!found) return DH_ACL_ERROR_INVALID_PARAM;
    aclError r = DH_ACL_SUCCESS;
    while (q) {
        r = q->run(q->arg, deadline_ns);
        if (r == DHEMU_PENDING) {
            requeue(stream, q);
            return r;
        }
        struct task *t = q;
        q = t->next;
        if (t->drop) t->drop(t->arg);
        free(t);
        if (r != DH_ACL_SUCCESS) break;
    }
    if (q) dhemu_log("stream task failed with %d: dropping the tasks queued after it", r);
    drop_all(q);
    return r;
}

/* A collective that times out here fails (its communicator is unusable after it, and the tasks
 * queued after it are dropped), so that no task can write into buffers freed after the timeout. */
DHEMU_API aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
    if (timeout < -1) return DH_ACL_ERROR_INVALID_PARAM;
    int64_t deadline = timeout < 0 ? INT64_MAX : dhemu_now_ns() + (int64_t)timeout * 1000000ll;
    if (deadline < 1) deadline = 1; /* 0 is the query's "do not wait" */
    return run_queue(stream, deadline);
}

/* Runs what can run without waiting: a collective whose peers have not all arrived stays queued and
 * goes on at the next query or synchronisation. A failed task's error is returned here, as there. */
DHEMU_API aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status) {
    if (!status) return DH_ACL_ERROR_INVALID_PARAM;
    aclError r = run_queue(stream, 0);
    if (r == DHEMU_PENDING) {
        *status = DH_ACL_STREAM_STATUS_NOT_READY;
        return DH_ACL_SUCCESS;
    }
    if (r == DH_ACL_SUCCESS) *status = DH_ACL_STREAM_STATUS_COMPLETE;
    return r;
}

DHEMU_API aclError aclrtSynchronizeStream(aclrtStream stream) {
    return aclrtSynchronizeStreamWithTimeout(stream, -1);
}
