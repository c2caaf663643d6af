/*
 * Internal interface between the emulator's two libraries (libascendcl.so exports these for
 * libhccl.so). Not part of the HCCL/ACL API; every name starts with dhemu_.
 */
#ifndef DHEMU_EMU_H
#define DHEMU_EMU_H

#include <stddef.h>
#include <stdint.h>

#include "dh_hccl.h"

#define DHEMU_API __attribute__((visibility("default")))

/* Device memory starts out, and receive ranges of an enqueued collective stay, filled with this
 * byte until the stream is synchronised. */
#define DHEMU_POISON 0xEE

/* A task on a stream: run() executes it when the stream is synchronised or queried and returns an
 * aclError; deadline_ns is absolute CLOCK_MONOTONIC (INT64_MAX: none). aclrtStreamQuery passes 0:
 * run() must then not wait, and returns DHEMU_PENDING if it cannot finish yet; it stays first on
 * its stream and goes on where it stopped at the next call. drop() frees it (after run, or unrun). */
#define DHEMU_PENDING (-1)

typedef aclError (*dhemu_run_fn)(void *arg, int64_t deadline_ns);
typedef void (*dhemu_drop_fn)(void *arg);

DHEMU_API aclError dhemu_stream_enqueue(aclrtStream stream, dhemu_run_fn run, dhemu_drop_fn drop, void *arg);
/* 1 if stream is a live stream of this process. */
DHEMU_API int dhemu_stream_valid(aclrtStream stream);
/* 1 if [p, p+len) lies inside one aclrtMalloc allocation (len 0: p inside or at its end). */
DHEMU_API int dhemu_device_range(const void *p, size_t len);
/* The device aclrtSetDevice bound to this thread, or -1. */
DHEMU_API int32_t dhemu_current_device(void);
/* CLOCK_MONOTONIC in nanoseconds. */
DHEMU_API int64_t dhemu_now_ns(void);
/* One line on stderr, prefixed "hccl-emu[pid]: " (silenced by DHEMU_QUIET=1). */
DHEMU_API void dhemu_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
