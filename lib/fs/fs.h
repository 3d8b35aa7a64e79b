/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The filesystem on the loop, the one thread that owns it: the inode
 * cache, the namespace and attribute operations as libfuse3 low-level
 * handlers, each an operation record with continuation steps that
 * compose the lock, session and etcd steps and send exactly one reply.
 *
 * Everything here runs on the loop thread. The daemon (etcfsd/etcfsd.c)
 * creates the session, lock cache and metrics, then the fs, then the FUSE
 * session with efs_fs_ops() and |fs| as userdata, and pumps it with
 * lib/kchan/fuseloop.h.
 */

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "etcd/etcd.h"
#include "lock/lock.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "meta/sb.h"
#include "util/metrics.h"
#include "etcfs.pb-c.h"

struct efs_fs;

#define EFS_FS_NO_KERNEL_CACHE UINT32_MAX

struct efs_fs_opts {
	const struct efs_meta_ns *ns;
	const struct efs_sb *sb;
	const Etcfs__FsInfo *fi; /* copied */
	bool read_only;		 /* -o ro */
	bool noatime;		 /* -o noatime */
	/* -o cow: every overwrite goes to fresh blocks (a crash never leaves
	 * one half written); otherwise an overwrite of blocks the file maps
	 * goes in place. */
	bool cow;
	/* -o delegate: creates under a directory this node holds exclusively
	 * are answered at once and committed in batches (fs/batch.c). */
	bool delegate;
	uint32_t batch_ms; /* a batch goes this long after its first change (0: 20) */
	/* Entry/attr timeout given to the kernel under a held lock (0: 500 ms,
	 * a quarter of the default 2 s session TTL, so that caches granted
	 * before a suspension time out before the lease deadline; pass
	 * TTL / 4 for longer TTLs). */
	uint32_t cache_timeout_ms; /* EFS_FS_NO_KERNEL_CACHE: zero timeouts */
	uint32_t ino_batch; /* inode numbers reserved at once (0: 1024) */
	/* The data path (issue 4): the device opened for data I/O
	 * (dev/iopool.h efs_dev_open_data; not owned, closed by the caller
	 * after efs_fs_free); <= 0 (or read_only): no allocator, writes fail
	 * with EROFS. */
	int dev_fd;
	bool dev_direct;	    /* |dev_fd| was opened with O_DIRECT */
	uint32_t io_threads;	    /* device workers (0: 16) */
	uint32_t flush_interval_ms; /* deferred publication sweep (0: 1000) */
	uint32_t dead_grace_ms;	    /* alloc/alloc.h (0: its default) */
	/* Inodes whose pages the kernel may cache at once (0: 16384); a
	 * suspension drops them all before the lease's deadline. */
	uint32_t max_cached_files;
};

/*
 * Creates the fs over a started session and lock cache (both must outlive
 * it). |m| may be NULL (no metrics); with it, the etcfs_fuse_* and
 * etcfs_etcd_txns_total families and etcfs_op_retries_total are
 * registered. |o->fi| is copied. Errors: -EINVAL (missing argument),
 * -ENOMEM, and uv_idle_init's.
 */
int efs_fs_new(struct efs_fs **ret, uv_loop_t *loop, struct efs_etcd *c,
	       struct efs_session *s, struct efs_lockcache *lc, struct efs_metrics *m,
	       const struct efs_fs_opts *o);
/* The handlers; userdata of the FUSE session must be the struct efs_fs. */
const struct fuse_lowlevel_ops *efs_fs_ops(void);
/* The FUSE session, for notifications (set once it exists). NULL: the
 * connection is gone (after the unmount, before the session is
 * destroyed): the invalidation threads stop. */
void efs_fs_set_fuse(struct efs_fs *fs, struct fuse_session *se);
/* The etcd capacity guard (fs/capacity.h; NULL: none): operations that add
 * metadata (create, mkdir, mknod, symlink, link, setxattr, rename onto a
 * new name) answer ENOSPC while it refuses growth, and commit errors are
 * fed to it. It must outlive the fs or be cleared first. */
struct efs_capacity;
void efs_fs_set_capacity(struct efs_fs *fs, struct efs_capacity *cap);
/* Session state changes (forward the efs_session state callback here). On
 * GONE the inode cache stops being trusted and every open handle fails
 * its later operations with EIO (release still succeeds). */
void efs_fs_session_changed(struct efs_fs *fs, enum efs_session_state old,
			    enum efs_session_state new_state);
/*
 * Clean leave, before the lock cache releases: publishes every dirty inode
 * and hands the allocation groups back. Returns 1 when there is nothing
 * to do (|cb| never runs), 0 (|cb| later, once, with 0 or the first
 * error: the daemon goes on leaving either way), or a negative errno.
 */
int efs_fs_leave(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg);
/*
 * Stops the device worker pool once its requests are done: 1 when there
 * is none (|cb| never runs), 0 (|cb| later, once), or a negative errno.
 * Call after the last FUSE request and before efs_fs_free.
 */
int efs_fs_stop_io(struct efs_fs *fs, void (*cb)(void *arg), void *arg);
/* Operations in flight (the daemon waits for 0 before leaving). */
uint64_t efs_fs_inflight(const struct efs_fs *fs);
/* Logs (warning) each operation in flight: what it is and what it waits
 * for, for a drain that did not end. */
void efs_fs_log_inflight(struct efs_fs *fs);
/*
 * Publishes every inode with unpublished data or fields (a sync request:
 * etcfsctl backup, etcfsctl sync); |cb| with 0 or the first error. Returns
 * 1 when nothing was dirty (|cb| does not run), 0 when |cb| will run,
 * -EBUSY while another such publication or the leave's runs. A leave asked
 * meanwhile starts when this one ends.
 */
int efs_fs_publish_all(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg);
/*
 * In-place overwrites, for a backup's copy (a block rewritten in place
 * while it is copied would be torn in the copy): efs_fs_inplace_stop
 * sends every later overwrite copy-on-write until as many
 * efs_fs_inplace_allow calls; efs_fs_inplace_drain returns 1 when no
 * in-place overwrite is in flight, else 0 and runs |cb| once the last
 * ends (one waiter at a time: -EBUSY). Loop thread only.
 */
void efs_fs_inplace_stop(struct efs_fs *fs);
void efs_fs_inplace_allow(struct efs_fs *fs);
int efs_fs_inplace_drain(struct efs_fs *fs, void (*cb)(void *arg), void *arg);
/* The inode limit in force (the mount's, or a later one from "sb"). */
uint64_t efs_fs_inode_limit(const struct efs_fs *fs);
/* Bytes of the blocks this node allocated for writes and has not published
 * yet (0 on a read-only mount). */
uint64_t efs_fs_pending_bytes(const struct efs_fs *fs);
/*
 * The daemon leaves with operations still in flight and will not free the
 * fs (their continuations point into it), while the lock cache and the
 * etcd client go: from now on nothing of the fs runs on its own (the
 * publisher's sweep, reclaim passes, fault-hook timers stop) and it no
 * longer uses the lock cache (operations that still end find none).
 */
void efs_fs_abandon(struct efs_fs *fs);
/* Frees the fs: no operation may be in flight. One idle handle is closed
 * (and freed by its close callback), so run the loop once more before
 * closing it. Accepts NULL; returns NULL. */
struct efs_fs *efs_fs_free(struct efs_fs *fs);
