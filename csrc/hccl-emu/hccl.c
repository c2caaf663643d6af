/*
 * libhccl.so of the DataHelix HCCL/ACL emulator: the HCCL calls hccl-sys declares, for ranks of
 * one host launched by mpirun (or any launcher), on host memory.
 *
 * Rendezvous: HcclGetRootInfo writes into the 4108-byte root info a magic, a random job nonce and
 * the name of a POSIX shared-memory segment; the caller broadcasts it (DataHelix: MPI_Bcast from
 * rank 0). In HcclCommInitRootInfo rank 0 creates the segment, the others open it, and the last to
 * attach unlinks the name. Only shared memory: no network address is ever used.
 *
 * Execution: every collective checks its arguments when called (real HCCL error codes), poisons
 * its receive ranges with DHEMU_POISON and is enqueued on the stream; it runs when the stream is
 * synchronised. Running moves the data through each rank's slot of the segment in rounds:
 * publish my chunk(s), barrier, read the peers' chunks, barrier. Round 0 also checks that every
 * rank is in the same collective with consistent arguments (kind, sequence number, counts, type,
 * root, reduction; all-to-all-v: what each peer sends me equals what I expect, in uint64 ELEMENT
 * counts); a mismatch fails the collective on every rank at synchronisation
 * (ACL_ERROR_RT_INTERNAL_ERROR) instead of corrupting memory. Barriers are futexes on the shared
 * segment and notice peers that died. A collective whose peers have not all arrived when
 * aclrtStreamQuery asks stays queued and goes on at the next query or synchronisation; a timeout
 * (the stream's or HCCL_EXEC_TIMEOUT), a dead peer or inconsistent arguments fail it and leave the
 * communicator unusable.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "emu.h"

#define ROOT_MAGIC "DHEMU-HCCL-ROOT"
#define SEG_MAGIC 0x44484543434c5345ull /* "DHECCLSE" */
#define COMM_MAGIC 0x44484343434f4d4dull
#define HDR_BYTES 4096
#define CTRL_BYTES 128
#define DEFAULT_SLOT (4u << 20)

enum kind { K_ALLGATHER = 1, K_ALLREDUCE, K_BROADCAST, K_ALLTOALLV, K_BARRIER };
static const char *kind_name(uint32_t k) {
    switch (k) {
    case K_ALLGATHER: return "HcclAllGather";
    case K_ALLREDUCE: return "HcclAllReduce";
    case K_BROADCAST: return "HcclBroadcast";
    case K_ALLTOALLV: return "HcclAlltoAllV";
    case K_BARRIER: return "HcclBarrier";
    default: return "an unknown collective";
    }
}

struct root_wire {
    char magic[16];
    uint32_t version;
    uint32_t slot_bytes;
    uint64_t nonce;
    int32_t creator_pid;
    char shm_name[64];
};

struct seg_hdr {
    uint64_t magic;
    uint64_t nonce;
    uint32_t nranks;
    uint32_t slot_data;
    uint64_t slot_stride;
    _Atomic uint32_t ready;
    _Atomic uint32_t attached;
    _Atomic uint32_t bar_count;
    _Atomic uint32_t bar_gen;
};

/* At the start of each rank's slot. */
struct ctrl {
    _Atomic int32_t pid;
    uint32_t kind, dtype, redop, root, more;
    uint64_t seq, count;
    _Atomic uint64_t err_seq; /* seq + 1 of a collective this rank found inconsistent */
};

/* After ctrl: per destination, the total bytes this rank sends it in the current collective. */
struct meta {
    uint64_t total;
};

struct comm {
    uint64_t magic;
    uint32_t rank, n;
    char *base;
    size_t map_bytes;
    size_t data; /* slot data bytes */
    size_t sub;  /* all-to-all-v sub-slot per destination */
    uint64_t exec_seq;
    int broken;
    int refs;
    int destroyed;
    struct comm *next_live;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct comm *g_comms;

static size_t align64(size_t v) { return (v + 63) & ~(size_t)63; }
static struct seg_hdr *hdr(const struct comm *c) { return (struct seg_hdr *)c->base; }
static size_t meta_off(void) { return CTRL_BYTES; }
static size_t data_off(uint32_t n) { return align64(CTRL_BYTES + (size_t)n * sizeof(struct meta)); }
static char *slot(const struct comm *c, uint32_t r) { return c->base + HDR_BYTES + (size_t)r * hdr(c)->slot_stride; }
static struct ctrl *ctrl_of(const struct comm *c, uint32_t r) { return (struct ctrl *)slot(c, r); }
static struct meta *meta_of(const struct comm *c, uint32_t r) { return (struct meta *)(slot(c, r) + meta_off()); }
static char *data_of(const struct comm *c, uint32_t r) { return slot(c, r) + data_off(c->n); }

static size_t dtype_size(int t) {
    switch (t) {
    case DH_HCCL_DATA_TYPE_INT8: case DH_HCCL_DATA_TYPE_UINT8: return 1;
    case DH_HCCL_DATA_TYPE_INT16: case DH_HCCL_DATA_TYPE_UINT16: case DH_HCCL_DATA_TYPE_FP16:
    case DH_HCCL_DATA_TYPE_BFP16: return 2;
    case DH_HCCL_DATA_TYPE_INT32: case DH_HCCL_DATA_TYPE_UINT32: case DH_HCCL_DATA_TYPE_FP32: return 4;
    case DH_HCCL_DATA_TYPE_INT64: case DH_HCCL_DATA_TYPE_UINT64: case DH_HCCL_DATA_TYPE_FP64: return 8;
    default: return 0;
    }
}

static int64_t env_seconds(const char *var, int64_t dflt) {
    const char *v = getenv(var);
    if (v && *v) {
        long s = strtol(v, NULL, 10);
        if (s > 0) return s;
    }
    return dflt;
}

static void futex_wait(_Atomic uint32_t *a, uint32_t v, long ns) {
    struct timespec ts = {0, ns};
    syscall(SYS_futex, (uint32_t *)a, FUTEX_WAIT, v, &ts, NULL, 0);
}
static void futex_wake(_Atomic uint32_t *a) { syscall(SYS_futex, (uint32_t *)a, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

static int peer_dead(const struct comm *c, uint32_t *who) {
    for (uint32_t r = 0; r < c->n; r++) {
        int32_t pid = atomic_load(&ctrl_of(c, r)->pid);
        if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
            *who = r;
            return 1;
        }
    }
    return 0;
}

/* A rank's passage through one barrier, which may take several calls (a synchronisation that
 * times out, a query that cannot wait): arrive once, then wait for the generation to move on. */
struct passage {
    int arrived;
    uint32_t gen;       /* the generation this rank arrived in */
    int64_t next_check; /* when to look for dead peers next */
};

/* Waits until every rank has arrived. Returns DH_ACL_SUCCESS; for a query (`deadline` 0) that
 * finds peers missing, DHEMU_PENDING (call again to go on waiting); or the aclError of a timeout
 * (the stream's, or HCCL_EXEC_TIMEOUT: `exec`) or a dead peer, after which the communicator is
 * unusable. */
static aclError barrier(struct comm *c, struct passage *p, int64_t deadline, int64_t exec, const char *what) {
    struct seg_hdr *h = hdr(c);
    if (!p->arrived) {
        p->arrived = 1;
        p->gen = atomic_load(&h->bar_gen);
        p->next_check = dhemu_now_ns() + 100000000ll;
        if (atomic_fetch_add(&h->bar_count, 1) == c->n - 1) {
            atomic_store(&h->bar_count, 0);
            atomic_fetch_add(&h->bar_gen, 1);
            futex_wake(&h->bar_gen);
            *p = (struct passage){0};
            return DH_ACL_SUCCESS;
        }
        /* Spin, then yield the core for up to 200 us (peers are usually close behind). */
        for (int i = 0; i < 256; i++)
            if (atomic_load(&h->bar_gen) != p->gen) goto passed;
        int64_t spin_end = dhemu_now_ns() + 200000ll;
        if (spin_end > deadline) spin_end = deadline;
        while (dhemu_now_ns() < spin_end) {
            sched_yield();
            if (atomic_load(&h->bar_gen) != p->gen) goto passed;
        }
    }
    for (;;) {
        if (atomic_load(&h->bar_gen) != p->gen) goto passed;
        int64_t now = dhemu_now_ns();
        if (now >= exec || (deadline > 0 && now >= deadline)) {
            dhemu_log("rank %u: %s: peers did not arrive before the timeout (stream timeout or "
                      "HCCL_EXEC_TIMEOUT); the communicator is unusable now", c->rank, what);
            return DH_ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
        }
        if (now >= p->next_check) {
            uint32_t who;
            if (peer_dead(c, &who)) {
                dhemu_log("rank %u: %s: rank %u's process is gone", c->rank, what, who);
                return DH_ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
            }
            p->next_check = now + 100000000ll;
        }
        if (deadline == 0) return DHEMU_PENDING;
        futex_wait(&h->bar_gen, p->gen, 2000000);
    }
passed:
    *p = (struct passage){0};
    return DH_ACL_SUCCESS;
}

/* ---- root info and communicators ---- */

static uint64_t random64(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    return v ^ (uint64_t)dhemu_now_ns() ^ ((uint64_t)getpid() << 32);
}

DHEMU_API HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
    if (!rootInfo) return DH_HCCL_E_PTR;
    if (dhemu_current_device() < 0) {
        dhemu_log("HcclGetRootInfo: no device set on this thread (call aclrtSetDevice first)");
        return DH_HCCL_E_RUNTIME;
    }
    struct root_wire w;
    memset(&w, 0, sizeof w);
    memcpy(w.magic, ROOT_MAGIC, sizeof ROOT_MAGIC);
    w.version = 1;
    uint64_t slot_bytes = DEFAULT_SLOT;
    const char *s = getenv("DHEMU_SLOT_BYTES");
    if (s && *s) {
        long long v = strtoll(s, NULL, 10);
        if (v >= 4096 && v <= (1ll << 30)) slot_bytes = (uint64_t)v;
    }
    w.slot_bytes = (uint32_t)(slot_bytes & ~(uint64_t)63);
    w.nonce = random64();
    w.creator_pid = (int32_t)getpid();
    snprintf(w.shm_name, sizeof w.shm_name, "/dhemu-hccl-%d-%016llx", (int)getpid(), (unsigned long long)w.nonce);
    memset(rootInfo, 0, sizeof *rootInfo);
    memcpy(rootInfo->internal, &w, sizeof w);
    return DH_HCCL_SUCCESS;
}

static struct comm *live_comm(HcclComm h) {
    pthread_mutex_lock(&g_lock);
    struct comm *c = g_comms;
    while (c && (void *)c != h) c = c->next_live;
    if (c && (c->magic != COMM_MAGIC || c->destroyed)) c = NULL;
    pthread_mutex_unlock(&g_lock);
    return c;
}

static void comm_free(struct comm *c) {
    munmap(c->base, c->map_bytes);
    c->magic = 0;
    free(c);
}

/* Drops one reference; frees a destroyed communicator with none left. */
static void comm_unref(struct comm *c) {
    pthread_mutex_lock(&g_lock);
    int gone = --c->refs == 0 && c->destroyed;
    if (gone) {
        for (struct comm **pp = &g_comms; *pp; pp = &(*pp)->next_live)
            if (*pp == c) {
                *pp = c->next_live;
                break;
            }
    }
    pthread_mutex_unlock(&g_lock);
    if (gone) comm_free(c);
}

DHEMU_API HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                          HcclComm *comm) {
    if (!rootInfo || !comm) return DH_HCCL_E_PTR;
    if (nRanks == 0 || rank >= nRanks || nRanks > 65536) {
        dhemu_log("HcclCommInitRootInfo: rank %u of %u ranks", rank, nRanks);
        return DH_HCCL_E_PARA;
    }
    if (dhemu_current_device() < 0) {
        dhemu_log("HcclCommInitRootInfo: no device set on this thread (call aclrtSetDevice first)");
        return DH_HCCL_E_RUNTIME;
    }
    struct root_wire w;
    memcpy(&w, rootInfo->internal, sizeof w);
    if (memcmp(w.magic, ROOT_MAGIC, sizeof ROOT_MAGIC) != 0 || w.version != 1 || w.slot_bytes < 4096 ||
        memchr(w.shm_name, 0, sizeof w.shm_name) == NULL) {
        dhemu_log("HcclCommInitRootInfo: the root info was not made by this emulator's HcclGetRootInfo "
                  "(was it broadcast from rank 0 in full, 4108 bytes?)");
        return DH_HCCL_E_PARA;
    }
    size_t data = w.slot_bytes;
    if (data < 64 * (size_t)nRanks) data = 64 * (size_t)nRanks;
    size_t stride = data_off(nRanks) + data;
    size_t total = HDR_BYTES + stride * nRanks;
    int64_t deadline = dhemu_now_ns() + env_seconds("HCCL_CONNECT_TIMEOUT", 120) * 1000000000ll;
    char *base = MAP_FAILED;
    if (rank == 0) {
        int fd = shm_open(w.shm_name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0) {
            dhemu_log("HcclCommInitRootInfo: shm_open(%s): %s", w.shm_name, strerror(errno));
            return errno == EEXIST ? DH_HCCL_E_PARA : DH_HCCL_E_SYSCALL;
        }
        if (ftruncate(fd, (off_t)total) != 0) {
            dhemu_log("HcclCommInitRootInfo: cannot size %s to %zu bytes: %s", w.shm_name, total, strerror(errno));
            close(fd);
            shm_unlink(w.shm_name);
            return DH_HCCL_E_MEMORY;
        }
        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (base == MAP_FAILED) {
            shm_unlink(w.shm_name);
            return DH_HCCL_E_MEMORY;
        }
        struct seg_hdr *h = (struct seg_hdr *)base;
        h->magic = SEG_MAGIC;
        h->nonce = w.nonce;
        h->nranks = nRanks;
        h->slot_data = (uint32_t)data;
        h->slot_stride = stride;
        atomic_store(&h->ready, 1);
    } else {
        for (;;) {
            int fd = shm_open(w.shm_name, O_RDWR, 0600);
            struct stat st;
            if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= HDR_BYTES) {
                char *m = mmap(NULL, HDR_BYTES, PROT_READ, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) {
                    struct seg_hdr *h = (struct seg_hdr *)m;
                    if (atomic_load(&h->ready)) {
                        int same = h->magic == SEG_MAGIC && h->nonce == w.nonce;
                        uint32_t their_n = h->nranks;
                        munmap(m, HDR_BYTES);
                        if (!same || their_n != nRanks || (size_t)st.st_size != total) {
                            close(fd);
                            dhemu_log("HcclCommInitRootInfo: rank %u: rank 0 created a communicator of %u ranks, "
                                      "this rank asked for %u", rank, their_n, nRanks);
                            return DH_HCCL_E_PARA;
                        }
                        base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                        close(fd);
                        if (base == MAP_FAILED) return DH_HCCL_E_MEMORY;
                        break;
                    }
                    munmap(m, HDR_BYTES);
                }
            }
            if (fd >= 0) close(fd);
            if (dhemu_now_ns() >= deadline) {
                dhemu_log("HcclCommInitRootInfo: rank %u: rank 0 did not create %s within HCCL_CONNECT_TIMEOUT",
                          rank, w.shm_name);
                return DH_HCCL_E_TIMEOUT;
            }
            usleep(1000);
        }
    }
    struct seg_hdr *h = (struct seg_hdr *)base;
    struct ctrl *mine = (struct ctrl *)(base + HDR_BYTES + rank * stride);
    int32_t zero = 0;
    if (!atomic_compare_exchange_strong(&mine->pid, &zero, (int32_t)getpid())) {
        dhemu_log("HcclCommInitRootInfo: rank %u claimed twice (also by pid %d)", rank, zero);
        munmap(base, total);
        return DH_HCCL_E_PARA;
    }
    if (atomic_fetch_add(&h->attached, 1) + 1 == nRanks) shm_unlink(w.shm_name);
    while (atomic_load(&h->attached) < nRanks) {
        if (dhemu_now_ns() >= deadline) {
            dhemu_log("HcclCommInitRootInfo: rank %u: only %u of %u ranks attached within HCCL_CONNECT_TIMEOUT",
                      rank, atomic_load(&h->attached), nRanks);
            if (rank == 0) shm_unlink(w.shm_name);
            munmap(base, total);
            return DH_HCCL_E_TIMEOUT;
        }
        usleep(200);
    }
    struct comm *c = calloc(1, sizeof *c);
    if (!c) {
        munmap(base, total);
        return DH_HCCL_E_MEMORY;
    }
    c->magic = COMM_MAGIC;
    c->rank = rank;
    c->n = nRanks;
    c->base = base;
    c->map_bytes = total;
    c->data = data;
    c->sub = (data / nRanks) & ~(size_t)63;
    pthread_mutex_lock(&g_lock);
    c->next_live = g_comms;
    g_comms = c;
    pthread_mutex_unlock(&g_lock);
    *comm = c;
    return DH_HCCL_SUCCESS;
}

DHEMU_API HcclResult HcclCommDestroy(HcclComm comm) {
    struct comm *c = live_comm(comm);
    if (!c) return DH_HCCL_E_PTR;
    pthread_mutex_lock(&g_lock);
    c->destroyed = 1;
    int gone = c->refs == 0;
    if (gone) {
        for (struct comm **pp = &g_comms; *pp; pp = &(*pp)->next_live)
            if (*pp == c) {
                *pp = c->next_live;
                break;
            }
    }
    pthread_mutex_unlock(&g_lock);
    if (gone) comm_free(c);
    return DH_HCCL_SUCCESS;
}

DHEMU_API HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) {
    struct comm *c = live_comm(comm);
    if (!c || !rankSize) return DH_HCCL_E_PTR;
    *rankSize = c->n;
    return DH_HCCL_SUCCESS;
}

DHEMU_API HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) {
    struct comm *c = live_comm(comm);
    if (!c || !rank) return DH_HCCL_E_PTR;
    *rank = c->rank;
    return DH_HCCL_SUCCESS;
}

/* ---- collectives ---- */

struct op {
    uint32_t kind;
    struct comm *c;
    char *send, *recv;
    uint64_t count; /* elements: per rank (allgather), total (allreduce, broadcast) */
    int dtype, redop;
    uint32_t root;
    size_t es;
    uint64_t *sc, *sd, *rc, *rd; /* all-to-all-v, elements */
    /* Progress, kept across calls (run_op may stop at a barrier and go on at the next call). */
    int started;
    uint64_t seq, k; /* sequence number on the communicator; round */
    int64_t exec;    /* HCCL_EXEC_TIMEOUT's deadline, from the first run */
    enum { PUBLISH, PUBLISHED, CONSUMED } phase;
    int ok, more;
    struct passage at;
};

static void drop_op(void *arg) {
    struct op *o = arg;
    comm_unref(o->c);
    free(o->sc);
    free(o);
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* Bytes of chunk k of a stream of `total` bytes cut in `unit` pieces (0 past the end). */
static size_t chunk(uint64_t total, size_t unit, uint64_t k, uint64_t *off) {
    *off = k * unit;
    return *off < total ? min_sz(unit, total - *off) : 0;
}

/* Writes this rank's round-k contribution into its slot; returns whether it has more after it. */
static int publish(struct op *o, uint64_t k) {
    struct comm *c = o->c;
    char *mine = data_of(c, c->rank);
    uint64_t off, total = o->count * o->es;
    size_t len;
    switch (o->kind) {
    case K_BROADCAST:
        if (c->rank != o->root) return 0;
        /* fallthrough */
    case K_ALLGATHER:
    case K_ALLREDUCE:
        len = chunk(total, c->data, k, &off);
        if (len) memcpy(mine, (o->kind == K_BROADCAST ? o->recv : o->send) + off, len);
        return off + len < total;
    case K_ALLTOALLV: {
        int more = 0;
        for (uint32_t p = 0; p < c->n; p++) {
            uint64_t tot = o->sc[p] * o->es;
            meta_of(c, c->rank)[p].total = tot;
            if (p == c->rank) continue;
            len = chunk(tot, c->sub, k, &off);
            if (len) memcpy(mine + p * c->sub, o->send + o->sd[p] * o->es + off, len);
            more |= off + len < tot;
        }
        return more;
    }
    default:
        return 0;
    }
}

/* Round 0: is every rank in the same collective with consistent arguments? */
static int consistent(struct op *o, uint64_t seq) {
    struct comm *c = o->c;
    for (uint32_t q = 0; q < c->n; q++) {
        const struct ctrl *t = ctrl_of(c, q);
        const char *why = NULL;
        if (t->seq != seq || t->kind != o->kind)
            why = "is in a different collective";
        else if (o->kind != K_BARRIER && t->dtype != (uint32_t)o->dtype)
            why = "passed a different data type";
        else if ((o->kind == K_ALLGATHER || o->kind == K_ALLREDUCE || o->kind == K_BROADCAST) && t->count != o->count)
            why = "passed a different count";
        else if (o->kind == K_ALLREDUCE && t->redop != (uint32_t)o->redop)
            why = "passed a different reduction";
        else if (o->kind == K_BROADCAST && t->root != o->root)
            why = "passed a different root";
        if (why) {
            dhemu_log("rank %u: %s #%llu (count %llu, type %d): rank %u %s: %s #%llu (count %llu, type %d)",
                      c->rank, kind_name(o->kind), (unsigned long long)seq, (unsigned long long)o->count, o->dtype,
                      q, why, kind_name(t->kind), (unsigned long long)t->seq, (unsigned long long)t->count,
                      (int)t->dtype);
            return 0;
        }
    }
    if (o->kind == K_ALLTOALLV) {
        for (uint32_t q = 0; q < c->n; q++) {
            uint64_t theirs = meta_of(c, q)[c->rank].total, want = o->rc[q] * o->es;
            if (theirs != want) {
                dhemu_log("rank %u: HcclAlltoAllV #%llu: rank %u sends this rank %llu elements but recvCounts[%u] "
                          "is %llu (counts are uint64 element counts)",
                          c->rank, (unsigned long long)seq, q, (unsigned long long)(theirs / o->es), q,
                          (unsigned long long)o->rc[q]);
                return 0;
            }
        }
    }
    return 1;
}

#define REDUCE(T, EXPR)                                                                                    \
    do {                                                                                                   \
        T *a = (T *)out;                                                                                   \
        const T *b = (const T *)in;                                                                        \
        for (size_t i = 0; i < len / sizeof(T); i++) a[i] = (EXPR);                                        \
    } while (0)
#define REDUCE_ALL(TS, TU)                                                                                 \
    switch (op) {                                                                                          \
    case DH_HCCL_REDUCE_SUM: REDUCE(TU, (TU)(a[i] + b[i])); break;                                         \
    case DH_HCCL_REDUCE_PROD: REDUCE(TU, (TU)(a[i] * b[i])); break;                                        \
    case DH_HCCL_REDUCE_MAX: REDUCE(TS, a[i] > b[i] ? a[i] : b[i]); break;                                 \
    default: REDUCE(TS, a[i] < b[i] ? a[i] : b[i]); break;                                                 \
    }

static void reduce(void *out, const void *in, size_t len, int dtype, int op) {
    switch (dtype) {
    case DH_HCCL_DATA_TYPE_INT8: REDUCE_ALL(int8_t, uint8_t); break;
    case DH_HCCL_DATA_TYPE_UINT8: REDUCE_ALL(uint8_t, uint8_t); break;
    case DH_HCCL_DATA_TYPE_INT16: REDUCE_ALL(int16_t, uint16_t); break;
    case DH_HCCL_DATA_TYPE_UINT16: REDUCE_ALL(uint16_t, uint16_t); break;
    case DH_HCCL_DATA_TYPE_INT32: REDUCE_ALL(int32_t, uint32_t); break;
    case DH_HCCL_DATA_TYPE_UINT32: REDUCE_ALL(uint32_t, uint32_t); break;
    case DH_HCCL_DATA_TYPE_INT64: REDUCE_ALL(int64_t, uint64_t); break;
    case DH_HCCL_DATA_TYPE_UINT64: REDUCE_ALL(uint64_t, uint64_t); break;
    case DH_HCCL_DATA_TYPE_FP32: REDUCE_ALL(float, float); break;
    case DH_HCCL_DATA_TYPE_FP64: REDUCE_ALL(double, double); break;
    default: break; /* rejected when enqueued */
    }
}

/* Reads the peers' round-k contributions. */
static void consume(struct op *o, uint64_t k) {
    struct comm *c = o->c;
    uint64_t off, total = o->count * o->es;
    size_t len;
    switch (o->kind) {
    case K_BROADCAST:
        len = chunk(total, c->data, k, &off);
        if (c->rank != o->root && len) memcpy(o->recv + off, data_of(c, o->root), len);
        break;
    case K_ALLGATHER:
        len = chunk(total, c->data, k, &off);
        for (uint32_t q = 0; q < c->n && len; q++)
            memcpy(o->recv + q * total + off, q == c->rank ? o->send + off : data_of(c, q), len);
        break;
    case K_ALLREDUCE:
        len = chunk(total, c->data, k, &off);
        if (!len) break;
        memcpy(o->recv + off, data_of(c, 0), len);
        for (uint32_t q = 1; q < c->n; q++) reduce(o->recv + off, data_of(c, q), len, o->dtype, o->redop);
        break;
    case K_ALLTOALLV:
        if (k == 0 && o->sc[c->rank])
            memcpy(o->recv + o->rd[c->rank] * o->es, o->send + o->sd[c->rank] * o->es, o->sc[c->rank] * o->es);
        for (uint32_t q = 0; q < c->n; q++) {
            if (q == c->rank) continue;
            len = chunk(o->rc[q] * o->es, c->sub, k, &off);
            if (len) memcpy(o->recv + o->rd[q] * o->es + off, data_of(c, q) + c->rank * c->sub, len);
        }
        break;
    default:
        break;
    }
}

/* Passes a barrier of o's; a hard failure (not DHEMU_PENDING) breaks the communicator. */
static aclError pass(struct op *o, int64_t deadline) {
    aclError r = barrier(o->c, &o->at, deadline, o->exec, kind_name(o->kind));
    if (r != DH_ACL_SUCCESS && r != DHEMU_PENDING) o->c->broken = 1;
    return r;
}

/* Round k: publish, barrier, check (round 0) and consume, barrier. Resumable at either barrier. */
static aclError run_op(void *arg, int64_t deadline) {
    struct op *o = arg;
    struct comm *c = o->c;
    struct ctrl *me = ctrl_of(c, c->rank);
    if (!o->started) {
        if (c->broken) {
            dhemu_log("rank %u: %s: the communicator is unusable after an earlier failure or lost peer",
                      c->rank, kind_name(o->kind));
            return DH_ACL_ERROR_RT_INTERNAL_ERROR;
        }
        o->started = 1;
        o->exec = dhemu_now_ns() + env_seconds("HCCL_EXEC_TIMEOUT", 1836) * 1000000000ll;
        o->seq = c->exec_seq++;
        o->k = 0;
        o->phase = PUBLISH;
        me->kind = o->kind;
        me->seq = o->seq;
        me->count = o->count;
        me->dtype = (uint32_t)o->dtype;
        me->redop = (uint32_t)o->redop;
        me->root = o->root;
    }
    for (;;) {
        if (o->phase == PUBLISH) {
            me->more = (uint32_t)publish(o, o->k);
            o->phase = PUBLISHED;
        }
        if (o->phase == PUBLISHED) {
            aclError r = pass(o, deadline);
            if (r != DH_ACL_SUCCESS) return r;
            o->ok = o->k > 0 || consistent(o, o->seq);
            if (o->ok)
                consume(o, o->k);
            else
                atomic_store(&me->err_seq, o->seq + 1);
            o->more = 0;
            for (uint32_t q = 0; q < c->n; q++) o->more |= ctrl_of(c, q)->more != 0;
            o->phase = CONSUMED;
        }
        aclError r = pass(o, deadline);
        if (r != DH_ACL_SUCCESS) return r;
        for (uint32_t q = 0; q < c->n; q++) {
            if (atomic_load(&ctrl_of(c, q)->err_seq) == o->seq + 1) {
                if (o->ok)
                    dhemu_log("rank %u: %s #%llu failed: rank %u found the ranks' arguments inconsistent",
                              c->rank, kind_name(o->kind), (unsigned long long)o->seq, q);
                return DH_ACL_ERROR_RT_INTERNAL_ERROR;
            }
        }
        if (!o->more) return DH_ACL_SUCCESS;
        o->k++;
        o->phase = PUBLISH;
    }
}

/* Common checks; on success returns the live communicator with a reference taken. */
static HcclResult begin(const char *call, HcclComm comm, aclrtStream stream, int dtype, struct comm **out) {
    struct comm *c = live_comm(comm);
    if (!c) {
        dhemu_log("%s: not a live communicator", call);
        return DH_HCCL_E_PTR;
    }
    if (!stream || !dhemu_stream_valid(stream)) {
        dhemu_log("%s: not a live stream", call);
        return DH_HCCL_E_PTR;
    }
    if (dtype >= 0 && dtype_size(dtype) == 0) {
        dhemu_log("%s: unknown data type %d", call, dtype);
        return DH_HCCL_E_PARA;
    }
    pthread_mutex_lock(&g_lock);
    c->refs++;
    pthread_mutex_unlock(&g_lock);
    *out = c;
    return DH_HCCL_SUCCESS;
}

static int bytes_of(uint64_t count, size_t es, uint64_t *bytes) {
    return !__builtin_mul_overflow(count, (uint64_t)es, bytes) && *bytes <= (uint64_t)SIZE_MAX / 2;
}

static HcclResult device_range(const char *call, const char *what, const void *p, uint64_t bytes) {
    if (bytes == 0) return DH_HCCL_SUCCESS;
    if (!p) {
        dhemu_log("%s: %s is NULL", call, what);
        return DH_HCCL_E_PTR;
    }
    if (!dhemu_device_range(p, (size_t)bytes)) {
        dhemu_log("%s: %s %p+%llu bytes is not inside device memory from aclrtMalloc", call, what, p,
                  (unsigned long long)bytes);
        return DH_HCCL_E_PARA;
    }
    return DH_HCCL_SUCCESS;
}

static int overlap(const char *a, uint64_t alen, const char *b, uint64_t blen) {
    return alen && blen && a < b + blen && b < a + alen;
}

static HcclResult finish(struct op *o, aclrtStream stream) {
    aclError r = dhemu_stream_enqueue(stream, run_op, drop_op, o);
    if (r != DH_ACL_SUCCESS) {
        drop_op(o);
        return DH_HCCL_E_RUNTIME;
    }
    return DH_HCCL_SUCCESS;
}

static HcclResult fail(struct comm *c, HcclResult r) {
    comm_unref(c);
    return r;
}

DHEMU_API HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType,
                                   HcclComm comm, aclrtStream stream) {
    struct comm *c;
    HcclResult r = begin("HcclAllGather", comm, stream, (int)dataType, &c);
    if (r) return r;
    size_t es = dtype_size(dataType);
    uint64_t sb, rb;
    if (!bytes_of(sendCount, es, &sb) || !bytes_of(sb, c->n, &rb)) return fail(c, DH_HCCL_E_PARA);
    if ((r = device_range("HcclAllGather", "sendBuf", sendBuf, sb)) ||
        (r = device_range("HcclAllGather", "recvBuf", recvBuf, rb)))
        return fail(c, r);
    if (overlap(sendBuf, sb, recvBuf, rb) && (char *)sendBuf != (char *)recvBuf + c->rank * sb) {
        dhemu_log("HcclAllGather: sendBuf overlaps recvBuf");
        return fail(c, DH_HCCL_E_PARA);
    }
    struct op *o = calloc(1, sizeof *o);
    if (!o) return fail(c, DH_HCCL_E_MEMORY);
    *o = (struct op){.kind = K_ALLGATHER, .c = c, .send = sendBuf, .recv = recvBuf, .count = sendCount,
                     .dtype = dataType, .es = es};
    if (rb && !overlap(sendBuf, sb, recvBuf, rb)) memset(recvBuf, DHEMU_POISON, rb);
    return finish(o, stream);
}

DHEMU_API HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                   HcclReduceOp op, HcclComm comm, aclrtStream stream) {
    struct comm *c;
    HcclResult r = begin("HcclAllReduce", comm, stream, (int)dataType, &c);
    if (r) return r;
    if ((int)op < 0 || (int)op > 3) {
        dhemu_log("HcclAllReduce: unknown reduction %d", (int)op);
        return fail(c, DH_HCCL_E_PARA);
    }
    if (dataType == DH_HCCL_DATA_TYPE_FP16 || dataType == DH_HCCL_DATA_TYPE_BFP16) {
        dhemu_log("HcclAllReduce: the emulator does not reduce 16-bit floating point");
        return fail(c, DH_HCCL_E_NOT_SUPPORT);
    }
    size_t es = dtype_size(dataType);
    uint64_t b;
    if (!bytes_of(count, es, &b)) return fail(c, DH_HCCL_E_PARA);
    if ((r = device_range("HcclAllReduce", "sendBuf", sendBuf, b)) ||
        (r = device_range("HcclAllReduce", "recvBuf", recvBuf, b)))
        return fail(c, r);
    if (overlap(sendBuf, b, recvBuf, b) && sendBuf != recvBuf) {
        dhemu_log("HcclAllReduce: sendBuf and recvBuf partly overlap");
        return fail(c, DH_HCCL_E_PARA);
    }
    struct op *o = calloc(1, sizeof *o);
    if (!o) return fail(c, DH_HCCL_E_MEMORY);
    *o = (struct op){.kind = K_ALLREDUCE, .c = c, .send = sendBuf, .recv = recvBuf, .count = count,
                     .dtype = dataType, .redop = op, .es = es};
    if (b && sendBuf != recvBuf) memset(recvBuf, DHEMU_POISON, b);
    return finish(o, stream);
}

DHEMU_API HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                                   aclrtStream stream) {
    struct comm *c;
    HcclResult r = begin("HcclBroadcast", comm, stream, (int)dataType, &c);
    if (r) return r;
    if (root >= c->n) {
        dhemu_log("HcclBroadcast: root %u of %u ranks", root, c->n);
        return fail(c, DH_HCCL_E_PARA);
    }
    size_t es = dtype_size(dataType);
    uint64_t b;
    if (!bytes_of(count, es, &b)) return fail(c, DH_HCCL_E_PARA);
    if ((r = device_range("HcclBroadcast", "buf", buf, b))) return fail(c, r);
    struct op *o = calloc(1, sizeof *o);
    if (!o) return fail(c, DH_HCCL_E_MEMORY);
    *o = (struct op){.kind = K_BROADCAST, .c = c, .recv = buf, .count = count, .dtype = dataType, .root = root,
                     .es = es};
    if (b && c->rank != root) memset(buf, DHEMU_POISON, b);
    return finish(o, stream);
}

DHEMU_API HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls,
                                   HcclDataType sendType, const void *recvBuf, const void *recvCounts,
                                   const void *rdispls, HcclDataType recvType, HcclComm comm, aclrtStream stream) {
    static const char *call = "HcclAlltoAllV";
    struct comm *c;
    HcclResult r = begin(call, comm, stream, (int)sendType, &c);
    if (r) return r;
    if (!sendCounts || !sdispls || !recvCounts || !rdispls) {
        dhemu_log("%s: a count or displacement array is NULL", call);
        return fail(c, DH_HCCL_E_PTR);
    }
    if (recvType != sendType) {
        dhemu_log("%s: sendType %d differs from recvType %d", call, (int)sendType, (int)recvType);
        return fail(c, DH_HCCL_E_PARA);
    }
    uint32_t n = c->n;
    size_t es = dtype_size(sendType);
    struct op *o = calloc(1, sizeof *o);
    uint64_t *arr = malloc(4 * n * sizeof(uint64_t));
    if (!o || !arr) {
        free(o);
        free(arr);
        return fail(c, DH_HCCL_E_MEMORY);
    }
    *o = (struct op){.kind = K_ALLTOALLV, .c = c, .send = (char *)sendBuf, .recv = (char *)recvBuf,
                     .dtype = sendType, .es = es, .sc = arr, .sd = arr + n, .rc = arr + 2 * n, .rd = arr + 3 * n};
    memcpy(o->sc, sendCounts, n * sizeof(uint64_t));
    memcpy(o->sd, sdispls, n * sizeof(uint64_t));
    memcpy(o->rc, recvCounts, n * sizeof(uint64_t));
    memcpy(o->rd, rdispls, n * sizeof(uint64_t));
    /* Byte ranges, checked for size, device memory, overlap among receives and with the sends. */
    for (uint32_t p = 0; p < n && !r; p++) {
        uint64_t sb, so, rb, ro, e;
        if (!bytes_of(o->sc[p], es, &sb) || !bytes_of(o->sd[p], es, &so) || !bytes_of(o->rc[p], es, &rb) ||
            !bytes_of(o->rd[p], es, &ro) || __builtin_add_overflow(so, sb, &e) || __builtin_add_overflow(ro, rb, &e)) {
            dhemu_log("%s: counts/displacements for rank %u overflow", call, p);
            r = DH_HCCL_E_PARA;
            break;
        }
        char what[64];
        snprintf(what, sizeof what, "the send block for rank %u", p);
        if (sb) r = device_range(call, what, (const char *)sendBuf + so, sb);
        snprintf(what, sizeof what, "the receive block from rank %u", p);
        if (!r && rb) r = device_range(call, what, (const char *)recvBuf + ro, rb);
    }
    if (!r && o->sc[c->rank] != o->rc[c->rank]) {
        dhemu_log("%s: rank %u sends itself %llu elements but expects %llu", call, c->rank,
                  (unsigned long long)o->sc[c->rank], (unsigned long long)o->rc[c->rank]);
        r = DH_HCCL_E_PARA;
    }
    for (uint32_t p = 0; p < n && !r; p++) {
        const char *rp = (const char *)recvBuf + o->rd[p] * es;
        uint64_t rl = o->rc[p] * es;
        for (uint32_t q = 0; q < n && !r; q++) {
            if (overlap(rp, rl, (const char *)sendBuf + o->sd[q] * es, o->sc[q] * es)) {
                dhemu_log("%s: the receive block from rank %u overlaps the send block for rank %u (recvBuf must "
                          "not alias sendBuf)", call, p, q);
                r = DH_HCCL_E_PARA;
            } else if (q > p && overlap(rp, rl, (const char *)recvBuf + o->rd[q] * es, o->rc[q] * es)) {
                dhemu_log("%s: the receive blocks from ranks %u and %u overlap", call, p, q);
                r = DH_HCCL_E_PARA;
            }
        }
    }
    if (r) {
        drop_op(o);
        return r;
    }
    for (uint32_t p = 0; p < n; p++)
        if (o->rc[p]) memset(o->recv + o->rd[p] * es, DHEMU_POISON, o->rc[p] * es);
    return finish(o, stream);
}

DHEMU_API HcclResult HcclBarrier(HcclComm comm, aclrtStream stream) {
    struct comm *c;
    HcclResult r = begin("HcclBarrier", comm, stream, -1, &c);
    if (r) return r;
    struct op *o = calloc(1, sizeof *o);
    if (!o) return fail(c, DH_HCCL_E_MEMORY);
    *o = (struct op){.kind = K_BARRIER, .c = c, .dtype = -1, .es = 1};
    return finish(o, stream);
}
