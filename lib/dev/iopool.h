/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Device I/O on a worker pool: the loop submits reads, writes and fdatasyncs
 * of the shared device; worker threads run pread/pwrite/fdatasync on a
 * descriptor opened with O_DIRECT (where the device allows it) and hand
 * completions back to the loop through one uv_async, in batches. Many requests
 * are in flight at once (a queue-depth-32 job is a normal load); the pool
 * reports the depth it sees (etcfs_dev_inflight gauge, etcfs_dev_inflight_max
 * gauge, etcfs_dev_ios_total{op}, etcfs_dev_errors_total{op},
 * etcfs_dev_bytes_total{op}, etcfs_dev_latency_seconds{op}).
 *
 * Fencing: a node that may have lost its lease must not write the shared
 * device, so workers check the pool's fence flag before every write and fail
 * it with -EIO once set. Short transfers are continued; EINTR is retried; any
 * other error is the request's result.
 *
 * Callback rule (libuv's): efs_iopool_submit returns an error now (the
 * callback never runs) or 0, and the callback runs exactly once later on
 * the loop thread, never inline.
 *
 * Threads: every function here is called on the loop thread (the buffer
 * functions and efs_dev_open_data from any thread). Requests run in no
 * particular order: two in flight over the same bytes may land either
 * way round, and a SYNC covers the writes whose callbacks ran before it
 * was submitted, not the ones still in flight beside it.
 *
 * Reads past the end of the file (or device) are not errors: the bytes
 * beyond the end read as zeros and the read still reports its full
 * length.
 *
 * The pool keeps its loop alive (its uv_async is referenced) only while a
 * request is in flight or a close is under way, like a libuv request.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "util/list.h"
#include "util/metrics.h"

/* Alignment of buffers and offsets for O_DIRECT descriptors. */
#define EFS_IO_ALIGN 4096

enum efs_io_op {
	EFS_IO_READ = 0,
	EFS_IO_WRITE,
	EFS_IO_SYNC, /* fdatasync of the descriptor (buf, len, off unused) */
	EFS_IO_NOPS,
};

struct efs_io;
/* |res|: bytes transferred (always the full length on success, zeros
 * filling whatever lies past the end of the file), 0 for SYNC, or a
 * negative errno. */
typedef void (*efs_io_cb)(struct efs_io *io, ssize_t res);

/* A request, owned by the caller until its callback. */
struct efs_io {
	enum efs_io_op op;
	void *buf;    /* EFS_IO_ALIGN-aligned when the pool is direct */
	size_t len;   /* multiple of EFS_IO_ALIGN when direct */
	uint64_t off; /* bytes; multiple of EFS_IO_ALIGN when direct */
	efs_io_cb cb;
	void *arg;
	/* Optional: runs on the worker thread right after the transfer, with
	 * the |res| that |cb| gets later on the loop; thread-safe and never
	 * blocking (a read's reply to the kernel, sent without a trip
	 * through the loop). */
	efs_io_cb wcb;
	/* private */
	struct efs_list link; /* in the pool's submission or completion FIFO */
	ssize_t res;
	uint64_t start_ns;
	bool fenced; /* refused by the fence or the write deadline */
	uint64_t epoch; /* the pool's submission epoch */
};

struct efs_iopool;

struct efs_iopool_opts {
	unsigned threads;	 /* workers (0: 16; at most 1024) */
	struct efs_metrics *m;	 /* may be NULL */
};

/*
 * Opens |path| for data I/O: O_DIRECT (plus O_RDWR or O_RDONLY, O_CLOEXEC)
 * where the file system or device accepts it, else buffered; *direct tells
 * which. O_DIRECT counts as refused when open fails with EINVAL or when an
 * aligned one-block read at offset 0 then does. Returns the descriptor or
 * a negative errno (*direct untouched).
 */
int efs_dev_open_data(const char *path, bool rw, bool *direct);

/*
 * A pool over |fd| (not owned: the caller closes it after the pool) with
 * its workers started; |direct| says whether to check alignment (it
 * should match how |fd| was opened). 0, -EINVAL, -ENOMEM, or the error of
 * uv_async_init or pthread_create. Metrics are registered when |o->m| is
 * set (a failed registration only loses that metric).
 */
int efs_iopool_new(struct efs_iopool **ret, uv_loop_t *loop, int fd, bool direct,
		   const struct efs_iopool_opts *o);
/* Queues |io|: 0, or -ESHUTDOWN (closing), -EINVAL (no callback, unknown
 * op; for a transfer: no buffer, len 0, off + len beyond INT64_MAX, or
 * misaligned for a direct pool). */
int efs_iopool_submit(struct efs_iopool *p, struct efs_io *io);
/* Requests submitted and not yet called back. */
uint64_t efs_iopool_inflight(const struct efs_iopool *p);
/* Sets or clears the fence: writes fail with -EIO from the next pwrite on
 * (a write under way is cut short there); reads and SYNC go on. */
void efs_iopool_set_fence(struct efs_iopool *p, bool fenced);
/* Sets or clears (0) the write deadline, a CLOCK_MONOTONIC time in ns: no
 * pwrite starts at or after it (-EIO, as fenced). A node whose session is
 * suspended sets it short of its lease's deadline, so that writes already
 * past their checks may finish while the lease surely lives and none
 * starts after; etcfs_dev_fenced_writes_total counts the refused ones. */
void efs_iopool_set_write_deadline(struct efs_iopool *p, uint64_t mono_ns);
/* Writes submitted before this call never start (-EIO, counted as
 * fenced); later ones are not affected. */
void efs_iopool_refuse_submitted(struct efs_iopool *p);
/* Whether a write starting now would be refused. */
bool efs_iopool_fenced(struct efs_iopool *p);
bool efs_iopool_direct(const struct efs_iopool *p);
/*
 * Fault injection for tests (ETCFS_FAULT_DEV=<op>:<n>[:<errno>] in the
 * daemon): after |after| more requests of |op| succeed, every later one
 * fails with -|err| (a positive errno; a negative one is taken as its
 * absolute value) without touching the device, until cleared (err 0
 * clears). It applies to requests that start on a worker after the call,
 * queued ones included; exactly |after| succeed even with many in flight
 * (a let-through request that fails by itself does not count). When no
 * fault is set the workers pay one relaxed atomic load per request.
 */
void efs_iopool_fault(struct efs_iopool *p, enum efs_io_op op, uint64_t after, int err);
/*
 * Fault injection for tests (ETCFS_FAULT_IO_LATE_MS=<ms> in the daemon):
 * a worker that ran a request's worker-side callback (|wcb|) waits |ms|
 * before it hands the completion to the loop, so that whatever that
 * callback answered runs well ahead of the loop's completion (0: off).
 */
void efs_iopool_fault_late(struct efs_iopool *p, unsigned ms);
/*
 * Stops: refuses new requests, lets the workers finish what is queued,
 * delivers every callback, joins the threads, then calls |done| on the
 * loop (once, never inline; |done| may be NULL). Callbacks that run during
 * the close get -ESHUTDOWN if they submit. Returns 0 or -EALREADY.
 */
int efs_iopool_close(struct efs_iopool *p, void (*done)(void *arg), void *arg);
/*
 * Frees a closed pool (after |done|), or one never closed that has nothing
 * in flight (callbacks of requests still in flight then never run): it
 * joins the workers and closes the uv_async, which the loop finishes (run
 * it once more before uv_loop_close). Accepts NULL; returns NULL.
 */
struct efs_iopool *efs_iopool_free(struct efs_iopool *p);

/*
 * Aligned buffers for direct I/O (EFS_IO_ALIGN, zero-filled); NULL on
 * ENOMEM. These come from posix_memalign, not efs_mem (efs_mem_fail_after
 * does not reach them): free them with efs_io_buf_free only, which keeps
 * a few large ones (8 MiB in all) for the next allocations. Thread-safe.
 */
void *efs_io_buf_alloc(size_t len);
/*
 * The same without zeroing, for a buffer the caller fills whole before
 * any byte of it leaves (a device read, which zeroes holes and short
 * reads itself; a copy of a whole block). Sanitizer builds fill it with
 * 0xa5 instead, so that a byte sent unfilled shows in the tests.
 */
void *efs_io_buf_get(size_t len);
void efs_io_buf_free(void *buf);
