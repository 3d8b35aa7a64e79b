/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Device I/O on a worker pool (ARCHITECTURE.md section 2): the loop
 * submits reads, writes and fdatasyncs of the shared device; worker
 * threads run pread/pwrite/fdatasync on a descriptor opened with O_DIRECT
 * (where the device allows it) and hand completions back to the loop
 * through one uv_async, in batches. Many requests are in flight at once
 * (a queue-depth-32 job is a normal load); the pool reports the depth it
 * sees (etcfs_dev_inflight gauge, etcfs_dev_inflight_max gauge,
 * etcfs_dev_ios_total{op}, etcfs_dev_errors_total{op},
 * etcfs_dev_bytes_total{op}, etcfs_dev_latency_seconds{op}).
 *
 * Fencing (section 6): workers check the pool's fence flag before every
 * write and fail it with -EIO once set. Short transfers are continued;
 * EINTR is retried; any other error is the request's result.
 *
 * Callback rule (libuv's): efs_iopool_submit returns an error now (the
 * callback never runs) or 0, and the callback runs exactly once later on
 * the loop thread, never inline.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

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
/* |res|: bytes transferred (always the full length on success), 0 for
 * SYNC, or a negative errno. */
typedef void (*efs_io_cb)(struct efs_io *io, ssize_t res);

/* A request, owned by the caller until its callback. */
struct efs_io {
	enum efs_io_op op;
	void *buf;    /* EFS_IO_ALIGN-aligned when the pool is direct */
	size_t len;   /* multiple of EFS_IO_ALIGN when direct */
	uint64_t off; /* bytes; multiple of EFS_IO_ALIGN when direct */
	efs_io_cb cb;
	void *arg;
	/* private */
	struct efs_io *next;
	ssize_t res;
	uint64_t start_ns;
};

struct efs_iopool;

struct efs_iopool_opts {
	unsigned threads;	 /* workers (0: 16) */
	struct efs_metrics *m;	 /* may be NULL */
};

/*
 * Opens |path| for data I/O: O_DIRECT (plus O_RDWR or O_RDONLY, O_CLOEXEC)
 * where the file system or device accepts it, else buffered; *direct tells
 * which. Returns the descriptor or a negative errno.
 */
int efs_dev_open_data(const char *path, bool rw, bool *direct);

/* A pool over |fd| (not owned: the caller closes it after the pool). */
int efs_iopool_new(struct efs_iopool **ret, uv_loop_t *loop, int fd, bool direct,
		   const struct efs_iopool_opts *o);
/* Queues |io|: 0, or -EINVAL (misaligned for a direct pool, len 0 for a
 * transfer), -ESHUTDOWN (closing). */
int efs_iopool_submit(struct efs_iopool *p, struct efs_io *io);
/* Requests submitted and not yet called back. */
uint64_t efs_iopool_inflight(const struct efs_iopool *p);
/* Sets or clears the fence: later writes fail with -EIO. */
void efs_iopool_set_fence(struct efs_iopool *p, bool fenced);
bool efs_iopool_direct(const struct efs_iopool *p);
/*
 * Fault injection for tests (ETCFS_FAULT_DEV=<op>:<n>[:<errno>] in the
 * daemon): after |after| more requests of |op| succeed, every later one
 * fails with -|err| until cleared (err 0 clears).
 */
void efs_iopool_fault(struct efs_iopool *p, enum efs_io_op op, uint64_t after, int err);
/*
 * Stops: refuses new requests, lets the workers finish what is queued,
 * delivers every callback, joins the threads, then calls |done| on the
 * loop (once). Returns 0 or -EALREADY.
 */
int efs_iopool_close(struct efs_iopool *p, void (*done)(void *arg), void *arg);
/* Frees a closed pool (or one never started). Accepts NULL; returns NULL. */
struct efs_iopool *efs_iopool_free(struct efs_iopool *p);

/* Aligned buffers for direct I/O (zero-filled); NULL on ENOMEM. */
void *efs_io_buf_alloc(size_t len);
void efs_io_buf_free(void *buf);
