/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock ops of regular files (lock/lock.h): what a release or a
 * downgrade of a file's lock asks of the data path and of the kernel.
 *
 * A file's exclusive lock is never pinned for an open handle or for dirty
 * data: between operations the lock cache may give it up at any moment
 * (idle, over its bound, or forced: a peer's recall). Before it does:
 *  - invalidate: the kernel drops the file's pages and attributes (and,
 *    for a file mapped shared, writes its dirty pages back first: those
 *    writes arrive as writepage writes, served while the lock drains);
 *  - sync: every change of the data state up to now is published (the
 *    extents, size, times and deferred attributes), so that the next
 *    holder, here or on a peer, reads it all from etcd.
 * The caches the node filled under the lock (record, map, keep_cache) are
 * void by grant id once the hold ends; nothing here has to drop them.
 *
 * ETCFS_FAULT_RECALL=MS (fault hooks builds, tests): every 1..MS ms the
 * exclusive lock of every file with a data state is force-released or
 * downgraded, and the lock of every directory held force-released,
 * through efs_lock_release_now, the entry point a peer's recall calls.
 */
#include "fs/file/file-int.h"

#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kchan/inval.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

/* An invalidation a release waits for. */
struct linval {
	struct efs_inval_req req;
	struct dctl *c;
	efs_lock_done_cb done;
	void *darg;
	struct efs_list link; /* c->linvals */
};

/* A publication a release waits for. */
struct lsync {
	efs_lock_done_cb done;
	void *darg;
};

/* A file open on this node may have pages in the kernel, whatever the
 * entry and attribute timeouts say. */
static bool file_cached(void *arg, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(arg, ino);

	return in && in->opens > 0;
}

static void linval_done(struct efs_inval_req *req, int status)
{
	struct linval *v = req->arg;
	efs_lock_done_cb done = v->done;
	void *darg = v->darg;

	efs_list_del(&v->link);
	efs_mem_free(v);
	status = efs_inval_release_status(status);
	if (status < 0)
		efs_log_warn("data: invalidating the kernel's cache of inode %" PRIu64 ": %s",
			     req->ino, strerror(-status));
	done(darg, status);
}

static void file_invalidate(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
			    void *darg)
{
	struct efs_fs *fs = arg;
	struct dctl *c = efs_file_ctl_of(fs);
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct linval *v;
	int r;

	(void)to;
	if (!c || !fs->inval) {
		done(darg, 0);
		return;
	}
	v = efs_mem_calloc(1, sizeof(*v));
	if (!v) {
		done(darg, -ENOMEM);
		return;
	}
	v->c = c;
	v->done = done;
	v->darg = darg;
	v->req.kind = EFS_INVAL_INODE;
	v->req.cls = EFS_INVAL_GATING;
	v->req.ino = ino;
	/* Pages only where a handle can have them; attributes always. */
	v->req.off = in && in->opens > 0 ? 0 : -1;
	v->req.len = 0;
	v->req.cb = linval_done;
	v->req.arg = v;
	r = efs_inval_submit(fs->inval, &v->req);
	if (r < 0) {
		efs_mem_free(v);
		done(darg, r == -ESHUTDOWN ? 0 : r);
		return;
	}
	efs_list_add_tail(&c->linvals, &v->link);
}

static void lsync_done(void *arg, int err)
{
	struct lsync *x = arg;
	efs_lock_done_cb done = x->done;
	void *darg = x->darg;

	efs_mem_free(x);
	done(darg, err < 0 ? err : 0);
}

static void file_sync(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
		      void *darg)
{
	struct efs_fs_inode *in = efs_fs_ifind(arg, ino);
	struct efs_fs_data *d = in ? in->data : NULL;
	struct lsync *x;
	int r;

	(void)to;
	/* A discarded or dropped state has nothing left to publish. */
	if (!d || d->broken || d->dropped) {
		done(darg, 0);
		return;
	}
	x = efs_mem_calloc(1, sizeof(*x));
	if (!x) {
		done(darg, -ENOMEM);
		return;
	}
	x->done = done;
	x->darg = darg;
	r = efs_file_publish_wait(d, lsync_done, x);
	if (r != 0) {
		efs_mem_free(x);
		done(darg, r < 0 ? r : 0);
	}
}

/* A file open for writing here is never kept shared (efs_fs_lock_mode). */
static bool file_no_shared(void *arg, uint64_t ino)
{
	const struct efs_fs_inode *in = efs_fs_ifind(arg, ino);

	return in && in->wopens > 0;
}

static const struct efs_lock_ops file_lock_ops = {
	.invalidate = file_invalidate,
	.sync = file_sync,
	.cached = file_cached,
	.no_shared = file_no_shared,
};

/*
 * Symlinks, devices, FIFOs and sockets: the kernel caches only their
 * attributes (a symlink's target is not cached: no FUSE_CAP_CACHE_SYMLINKS),
 * and a release drops those as a file's release does (file_invalidate:
 * no open handle, attributes only), or a GETATTR reply cached before a
 * peer's chmod or chown would outlive the lock by up to the cache timeout.
 */
static const struct efs_lock_ops special_lock_ops = {
	.invalidate = file_invalidate,
	.serve_while_invalidating = true,
};

/* ---- ETCFS_FAULT_RECALL ---- */

#if EFS_FAULT_HOOKS
/* Forced releases asked for and not yet done (bounded). */
static unsigned frecall_out;

static void frecall_done(void *arg, int status)
{
	(void)arg;
	if (frecall_out)
		frecall_out--;
	if (status < 0)
		efs_log_debug("fault injection: forced release: %s", strerror(-status));
}

static uint64_t frecall_rand(struct dctl *c)
{
	/* xorshift64*: reproducible from the seed logged at start. */
	c->frecall_rng ^= c->frecall_rng >> 12;
	c->frecall_rng ^= c->frecall_rng << 25;
	c->frecall_rng ^= c->frecall_rng >> 27;
	return c->frecall_rng * 2685821657736338717ull;
}

static void frecall_tick(uv_timer_t *t)
{
	struct dctl *c = t->data;
	struct efs_fs *fs = c->fs;

	for (size_t i = 0; i < fs->hsize && frecall_out < 256; i++) {
		for (struct efs_fs_inode *in = fs->htab[i]; in; in = in->hnext) {
			enum efs_lock_mode to;
			int r;

			bool dir = in->rec && S_ISDIR(in->rec->mode);
			enum efs_lock_mode held = efs_lock_held(fs->lc, in->ino);

			/* Files held exclusive, directories held at all. */
			if (dir ? held == EFS_LOCK_NONE
				: !in->data || held != EFS_LOCK_EXCLUSIVE)
				continue;
			to = !dir && frecall_rand(c) % 4 == 0 ? EFS_LOCK_SHARED : EFS_LOCK_NONE;
			r = efs_lock_release_now(fs->lc, in->ino, to, frecall_done, NULL);
			if (r == 0)
				frecall_out++;
		}
	}
	uv_timer_start(t, frecall_tick, 1 + frecall_rand(c) % c->frecall_ms, 0);
}

static void frecall_from_env(struct dctl *c)
{
	const char *v = getenv("ETCFS_FAULT_RECALL");
	unsigned long ms;
	char *end;

	if (!v || !*v)
		return;
	errno = 0;
	ms = strtoul(v, &end, 10);
	if (errno || *end || ms == 0 || ms > 60000) {
		efs_log_err("ETCFS_FAULT_RECALL='%s' ignored: expected milliseconds 1..60000", v);
		return;
	}
	c->frecall = efs_mem_calloc(1, sizeof(*c->frecall));
	if (!c->frecall || uv_timer_init(c->fs->loop, c->frecall) < 0) {
		efs_mem_free(c->frecall);
		c->frecall = NULL;
		return;
	}
	c->frecall->data = c;
	c->frecall_ms = (uint32_t)ms;
	c->frecall_rng = efs_clock_mono_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ull;
	efs_log_warn("fault injection: file and directory locks force-released every 1..%lu ms (seed %" PRIu64
		     ")",
		     ms, c->frecall_rng);
	uv_timer_start(c->frecall, frecall_tick, 1 + frecall_rand(c) % c->frecall_ms, 0);
}
#endif

static void frecall_close_cb(uv_handle_t *h)
{
	efs_mem_free(h);
}

/* ---- Setup ---- */

void efs_file_lockops_init(struct dctl *c)
{
	struct efs_fs *fs = c->fs;

	efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_FILE, &file_lock_ops, fs);
	efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_SPECIAL, &special_lock_ops, fs);
#if EFS_FAULT_HOOKS
	frecall_from_env(c);
#endif
}

void efs_file_kernel_gone(struct dctl *c)
{
	/* The queue is stopped: what waited on it completes, with nothing
	 * left in the kernel to invalidate. */
	while (!efs_list_empty(&c->linvals)) {
		struct linval *v = efs_list_entry(efs_list_first(&c->linvals), struct linval, link);
		efs_lock_done_cb done = v->done;
		void *darg = v->darg;

		efs_list_del(&v->link);
		efs_mem_free(v);
		done(darg, 0);
	}
}

void efs_file_lockops_done(struct dctl *c)
{
	struct efs_fs *fs = c->fs;

	efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_FILE, NULL, NULL);
	efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_SPECIAL, NULL, NULL);
	efs_file_kernel_gone(c);
	if (c->frecall) {
		uv_timer_stop(c->frecall);
		uv_close((uv_handle_t *)c->frecall, frecall_close_cb);
		c->frecall = NULL;
	}
}
