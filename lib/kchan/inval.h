/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Kernel cache invalidations off the loop.
 * fuse_lowlevel_notify_inval_inode() and friends can block while the
 * kernel waits for pages or requests that the loop itself must serve
 * (writeback of dirty pages, a lookup racing the invalidation), so they
 * never run on the loop thread: requests queue here and helper threads
 * issue them; each completion comes back to the loop through a uv_async.
 *
 * Two classes with threads of their own, so that invalidations a lock
 * release waits for (EFS_INVAL_GATING) never queue behind best-effort ones
 * (EFS_INVAL_BEST_EFFORT: directory entries of a peer's change, attribute
 * refreshes). Within the gating class, inode invalidations have threads
 * of their own too: an entry invalidation may wait for a directory lock
 * the kernel holds, and a file's release must not queue behind it.
 * Within a queue, requests start in submission order; with several
 * threads they may finish in any order.
 *
 * ENOENT from the kernel (it does not cache the inode or entry) counts as
 * done: the status is 0. ENOSYS (a kernel without notifications) and
 * ENODEV / EBADF (the session is gone) are reported as they are.
 *
 * The request is caller-owned (embed it in the operation or lock record)
 * and must stay valid until its callback; the name of an entry request is
 * copied at submission. Submission and callbacks are on the loop thread;
 * the worker threads only call libfuse.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "util/list.h"

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

struct efs_inval;

enum efs_inval_kind {
	/* fuse_lowlevel_notify_inval_inode(ino, off, len): attributes, and
	 * the page cache in [off, off + len) (len 0: to the end; off < 0:
	 * attributes only). */
	EFS_INVAL_INODE = 0,
	/* fuse_lowlevel_notify_inval_entry(parent = ino, name). */
	EFS_INVAL_ENTRY,
	/* fuse_lowlevel_notify_delete(parent = ino, child, name): the entry is
	 * gone and the kernel may also drop |child|'s dentry aliases. */
	EFS_INVAL_DELETE,
};

enum efs_inval_class {
	EFS_INVAL_GATING = 0,
	EFS_INVAL_BEST_EFFORT,
};

struct efs_inval_req;
/* Done: 0 (also when the kernel had nothing cached) or a negative errno;
 * -ECANCELED when the queue was stopped first. Runs on the loop, never
 * inline from efs_inval_submit(). */
typedef void (*efs_inval_cb)(struct efs_inval_req *req, int status);

struct efs_inval_req {
	/* filled by the caller */
	enum efs_inval_kind kind;
	enum efs_inval_class cls;
	uint64_t ino;	/* the inode, or the parent for ENTRY and DELETE */
	uint64_t child; /* DELETE only */
	off_t off;	/* INODE only */
	off_t len;	/* INODE only */
	const char *name; /* ENTRY/DELETE: copied by efs_inval_submit() */
	size_t name_len;
	efs_inval_cb cb;
	void *arg;
	/* private */
	struct efs_list link;
	char *name_copy;
	int status;
	uint64_t submit_ns;
	bool absent;	       /* INODE: the kernel had no such inode */
	uint32_t absent_tries; /* INODE: issued again for that */
};

struct efs_inval_opts {
	unsigned gating_threads;      /* 0: 4 (an entry invalidation can wait for a
				       * directory lock the kernel holds across a
				       * request: room for the others) */
	unsigned best_effort_threads; /* 0: 1 */
};

struct efs_inval_stats {
	uint64_t submitted;
	uint64_t done;	    /* finished with status 0 (ENOENT included) */
	uint64_t failed;    /* finished with another error */
	uint64_t pending;   /* queued or running now */
	uint64_t max_ns;    /* longest submit-to-completion */
	uint64_t absent_retries; /* INODE requests issued again (efs_inval_set_referenced) */
};

/*
 * Creates the queues and starts the threads. Notifications need the FUSE
 * session: requests submitted before efs_inval_set_session() complete with
 * -ENOTCONN. -ENOMEM, or the errno of thread or async creation.
 */
int efs_inval_new(struct efs_inval **ret, uv_loop_t *loop, const struct efs_inval_opts *o);

/* Sets the FUSE session the notifications go to (loop thread; before
 * requests that need it are submitted). NULL detaches it. */
void efs_inval_set_session(struct efs_inval *iv, struct fuse_session *se);

/*
 * An INODE invalidation that finds no inode may have come between a reply
 * that hands the inode to the kernel (a lookup, a readdirplus entry) and
 * the kernel creating the inode from it, in the requester's
 * context after the reply is written: the reply's attributes, applied to
 * a new inode without the version check an invalidation defeats, would
 * outlive it. So while |referenced|(arg, ino) (loop thread) says the
 * daemon counts kernel references to the inode, such a request is issued
 * again, EFS_INVAL_ABSENT_RETRY_US apart, until it finds the inode or
 * |referenced| turns false (the kernel's FORGET came, or the bound the
 * caller counts from the reply passed: a reply the kernel dropped leaves
 * a count with no inode). Without it ENOENT is simply done.
 */
#define EFS_INVAL_ABSENT_RETRY_US 200
void efs_inval_set_referenced(struct efs_inval *iv, bool (*referenced)(void *arg, uint64_t ino),
			      void *arg);

/*
 * Queues |req| (see the fields above). 0: |req->cb| runs once, later, on
 * the loop. -EINVAL (no callback, or no name for ENTRY/DELETE),
 * -ESHUTDOWN (stopping), -ENOMEM; the callback never runs then.
 */
int efs_inval_submit(struct efs_inval *iv, struct efs_inval_req *req);
/* The name of an ENTRY or DELETE request that is still pending (submitted,
 * its callback not yet run), NUL-terminated; NULL otherwise (loop thread). */
const char *efs_inval_req_pending_name(const struct efs_inval_req *req);
/* A completion status as a lock release sees it: a kernel connection
 * that is gone (unmounted, stopping, cancelled) or never had
 * notifications caches nothing that could go stale, so those are 0. */
int efs_inval_release_status(int status);

/*
 * Stops: requests still queued complete with -ECANCELED, the ones being
 * issued finish, the threads exit and are joined, and |done| (may be NULL)
 * runs once on the loop. Keep serving FUSE requests meanwhile: an issued
 * invalidation may wait for the loop. Call it before the FUSE session is
 * unmounted. Then free with efs_inval_free().
 */
void efs_inval_stop(struct efs_inval *iv, void (*done)(void *arg), void *arg);

/*
 * Frees |iv|. After efs_inval_stop() has completed this releases memory
 * only; otherwise it stops first and joins the threads synchronously (which
 * blocks while a notification is stuck in the kernel: only when the FUSE
 * connection is gone or nothing is pending). Queued requests' callbacks do
 * not run. Accepts NULL; returns NULL.
 */
struct efs_inval *efs_inval_free(struct efs_inval *iv);

void efs_inval_get_stats(const struct efs_inval *iv, struct efs_inval_stats *ret);

/*
 * Fault hook (EFS_FAULT_HOOKS; negative controls in tests): while |off|,
 * every invalidation of the process reports success without telling the
 * kernel, which keeps what it cached until its timeouts pass. Any thread.
 */
void efs_inval_fault_no_kernel(bool off);
