/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fs object: the FUSE operation table, metrics, and the lifecycle
 * (start, session changes, the clean leave).
 */
#include "fs/fs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "config.h"
#include "fs/fs-int.h"
#include "dev/iopool.h"
#include "alloc/alloc.h"
#include "fs/data.h"
#include "fs/plock.h"
#include "kchan/inval.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

static const char *const origin_names[EFS_FS_NORIGINS] = {
	[EFS_FS_ORIG_CREATE] = "create",   [EFS_FS_ORIG_MKDIR] = "mkdir",
	[EFS_FS_ORIG_MKNOD] = "mknod",	   [EFS_FS_ORIG_SYMLINK] = "symlink",
	[EFS_FS_ORIG_LINK] = "link",	   [EFS_FS_ORIG_UNLINK] = "unlink",
	[EFS_FS_ORIG_RMDIR] = "rmdir",	   [EFS_FS_ORIG_RENAME] = "rename",
	[EFS_FS_ORIG_SETATTR] = "setattr", [EFS_FS_ORIG_XATTR] = "xattr",
	[EFS_FS_ORIG_INO] = "ino",	   [EFS_FS_ORIG_LOCK] = "lock",
	[EFS_FS_ORIG_RECLAIM] = "reclaim", [EFS_FS_ORIG_ATIME] = "atime",
	[EFS_FS_ORIG_PUBLISH] = "publish", [EFS_FS_ORIG_TRUNCATE] = "truncate",
	[EFS_FS_ORIG_FALLOCATE] = "fallocate", [EFS_FS_ORIG_PLOCK] = "plock",
	[EFS_FS_ORIG_SPACE] = "space", [EFS_FS_ORIG_OPENREF] = "openref",
};

static const char *const outcome_names[EFS_FS_NOUTCOMES] = {
	[EFS_FS_TXN_OK] = "ok",
	[EFS_FS_TXN_CONFLICT] = "conflict",
	[EFS_FS_TXN_ERROR] = "error",
	[EFS_FS_TXN_UNKNOWN] = "unknown",
};
/* ---- FUSE glue ---- */

static void fs_init(void *userdata, struct fuse_conn_info *conn)
{
	struct efs_fs *fs = userdata;

	if (conn->capable & FUSE_CAP_POSIX_ACL) {
		conn->want |= FUSE_CAP_POSIX_ACL;
		fs->posix_acl = true;
		/* With ACLs the umask is ours to apply (default ACLs replace it). */
		if (conn->capable & FUSE_CAP_DONT_MASK)
			conn->want |= FUSE_CAP_DONT_MASK;
	}
	/* Always readdirplus: its entries come locked, four to a transaction,
	 * with their attributes, so a tree walk (du, ls -l, find) needs no
	 * lookup per name. */
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS;
	conn->want &= ~(unsigned)FUSE_CAP_READDIRPLUS_AUTO;
	/* No writeback cache: a write reaches the daemon (and the device)
	 * before write(2) returns, and the page cache is kept only under a
	 * held lock (open's keep_cache). */
	conn->want &= ~(unsigned)FUSE_CAP_WRITEBACK_CACHE;
	/* Deep asynchronous I/O reaches the daemon in parallel, in
	 * requests of up to 1 MiB. */
	conn->max_background = 128;
	conn->congestion_threshold = 96;
	conn->max_write = 1u << 20;
	conn->max_readahead = 1u << 20;
	/* No splicing: write_buf gets the bytes in libfuse's buffer and
	 * copies them once into the aligned device buffer; a pipe would cost
	 * a second syscall per request. */
	if (conn->capable & FUSE_CAP_SPLICE_READ)
		conn->want &= ~(unsigned)FUSE_CAP_SPLICE_READ;
	/* A read of cached pages revalidates the attributes once their
	 * timeout has passed, and attribute timeouts end before the session
	 * could suspend (efs_fs_cache_bound): so read(2) never serves pages
	 * from the page cache past the point where the lock might be lost
	 * without asking the daemon, which waits for the session. */
	if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA)
		conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
	else
		efs_log_warn("fs: the kernel cannot revalidate cached pages on read "
			     "(no FUSE_AUTO_INVAL_DATA): a suspended node relies on its "
			     "invalidations alone");
	/* fcntl and flock locks live in etcd. */
	if (conn->capable & FUSE_CAP_POSIX_LOCKS)
		conn->want |= FUSE_CAP_POSIX_LOCKS;
	if (conn->capable & FUSE_CAP_FLOCK_LOCKS)
		conn->want |= FUSE_CAP_FLOCK_LOCKS;
	/* O_TRUNC arrives as a setattr (size 0, mtime now) rather than an
	 * open flag, so truncation has one code path. */
	conn->want &= ~(unsigned)FUSE_CAP_ATOMIC_O_TRUNC;
	efs_counter_inc(fs->m_ops[EFS_FS_OP_INIT]);
}

static const struct fuse_lowlevel_ops ops = {
	.init = fs_init,
	.lookup = efs_fs_lookup,
	.forget = efs_fs_forget,
	.forget_multi = efs_fs_forget_multi,
	.getattr = efs_fs_getattr,
	.setattr = efs_fs_setattr,
	.readlink = efs_fs_readlink,
	.mknod = efs_fs_mknod,
	.mkdir = efs_fs_mkdir,
	.unlink = efs_fs_unlink,
	.rmdir = efs_fs_rmdir,
	.symlink = efs_fs_symlink,
	.rename = efs_fs_rename,
	.link = efs_fs_link,
	.open = efs_fs_open,
	.read = efs_fs_read,
	.release = efs_fs_release,
	.opendir = efs_fs_opendir,
	.readdir = efs_fs_readdir,
	.readdirplus = efs_fs_readdirplus,
	.releasedir = efs_fs_releasedir,
	.fsyncdir = efs_fs_fsyncdir,
	.statfs = efs_fs_statfs,
	.setxattr = efs_fs_setxattr,
	.getxattr = efs_fs_getxattr,
	.listxattr = efs_fs_listxattr,
	.removexattr = efs_fs_removexattr,
	.create = efs_fs_create,
	.write_buf = efs_fs_write_buf,
	.flush = efs_fs_flush,
	.fsync = efs_fs_fsync,
	.fallocate = efs_fs_fallocate,
	.lseek = efs_fs_lseek,
	.copy_file_range = efs_fs_copy_file_range,
	.getlk = efs_fs_getlk,
	.setlk = efs_fs_setlk,
	.flock = efs_fs_flock,
};

const struct fuse_lowlevel_ops *efs_fs_ops(void)
{
	return &ops;
}

/* ---- Lifecycle ---- */

static int register_metrics(struct efs_fs *fs)
{
	char lab[128];

	for (int i = 0; i < EFS_FS_NOPS; i++) {
		snprintf(lab, sizeof(lab), "op=\"%s\"", efs_fs_op_names[i]);
		fs->m_ops[i] = efs_metrics_counter(fs->m, "etcfs_fuse_ops_total",
						   "FUSE requests by operation", lab);
		fs->m_errs[i] = efs_metrics_counter(fs->m, "etcfs_fuse_errors_total",
						    "FUSE requests answered with an error", lab);
		fs->m_lat[i] = efs_metrics_histogram(fs->m, "etcfs_fuse_op_seconds",
						     "FUSE request latency", lab);
		if (!fs->m_ops[i] || !fs->m_errs[i] || !fs->m_lat[i])
			return -ENOMEM;
	}
	for (int o = 0; o < EFS_FS_NORIGINS; o++) {
		for (int x = 0; x < EFS_FS_NOUTCOMES; x++) {
			snprintf(lab, sizeof(lab), "origin=\"%s\",outcome=\"%s\"", origin_names[o],
				 outcome_names[x]);
			fs->m_txns[o][x] = efs_metrics_counter(
				fs->m, "etcfs_etcd_txns_total",
				"etcd transactions by origin and outcome", lab);
			if (!fs->m_txns[o][x])
				return -ENOMEM;
		}
	}
	fs->m_susp_invals = efs_metrics_counter(
		fs->m, "etcfs_suspend_invalidations_total",
		"Open files whose kernel pages were invalidated because the session suspended",
		NULL);
	fs->m_susp_inval_ms = efs_metrics_gauge(
		fs->m, "etcfs_suspend_invalidation_seconds",
		"How long the last suspension's invalidation of every open file's pages took",
		NULL);
	fs->m_kal_estales = efs_metrics_counter(
		fs->m, "etcfs_lookup_alias_estales_total",
		"Lookups answered ESTALE because the kernel may still hold the file under the "
		"name a peer renamed it from",
		NULL);
	fs->m_mx_yields = efs_metrics_counter(
		fs->m, "etcfs_mutex_yields_total",
		"Lock waits cancelled and started again because a publication a release waits "
		"for needed a node-local mutex the waiting operation held",
		NULL);
	fs->m_kpages = efs_metrics_gauge(fs->m, "etcfs_kernel_cached_files",
					 "Inodes whose pages the kernel may cache (capped by "
					 "--max-cached-files)",
					 NULL);
	fs->m_kpages_evicted = efs_metrics_counter(
		fs->m, "etcfs_kernel_cached_files_dropped_total",
		"Inodes whose kernel pages were dropped to keep under --max-cached-files", NULL);
	fs->m_lookup_cached = efs_metrics_counter(
		fs->m, "etcfs_lookup_cache_answers_total",
		"Lookups answered from the directory name cache, absent names included", NULL);
	fs->m_lookup_read = efs_metrics_counter(fs->m, "etcfs_lookup_reads_total",
						"Lookups that read the name from etcd", NULL);
	fs->m_batches = efs_metrics_counter(
		fs->m, "etcfs_delegated_batches_total",
		"Transactions that committed a batch of delegated namespace changes (-o delegate)",
		NULL);
	fs->m_batch_ops = efs_metrics_counter(
		fs->m, "etcfs_delegated_ops_total",
		"Namespace changes answered at once under a held lock and committed in a batch",
		NULL);
	fs->m_batch_failures = efs_metrics_counter(
		fs->m, "etcfs_delegated_batch_failures_total",
		"Batches of delegated changes that failed (their changes lost, as in a crash)",
		NULL);
	fs->m_retries = efs_metrics_counter(
		fs->m, "etcfs_op_retries_total",
		"Operations that read again and retried after a conflict or an unknown outcome "
		"(namespace and attribute commits, inode number reservations, reads)",
		NULL);
	return fs->m_retries ? 0 : -ENOMEM;
}

/* Frees a handle of the fs's own (|idle|, |retry_timer|) once closed. */
static void handle_close_cb(uv_handle_t *h)
{
	efs_mem_free(h);
}

static void alloc_started(int status, void *arg)
{
	(void)arg;
	if (status < 0)
		efs_log_warn("fs: claiming allocation groups failed (%s); allocations will retry",
			     strerror(-status));
}

#if EFS_FAULT_HOOKS
/* ETCFS_FAULT_IO_LATE_MS=<ms> delays the loop's completions behind the
 * workers' answers (tests). */
static void io_late_from_env(struct efs_fs *fs)
{
	const char *v = getenv("ETCFS_FAULT_IO_LATE_MS");
	unsigned long long n;
	char *end;

	if (!v || !*v)
		return;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno || end == v || *end || n > 10000) {
		efs_log_err("ETCFS_FAULT_IO_LATE_MS='%s' ignored: expected 0..10000", v);
		return;
	}
	efs_iopool_fault_late(fs->pool, (unsigned)n);
	efs_log_warn("fault injection: I/O completions reach the loop %llu ms after the "
		     "worker's answer",
		     n);
}

/* ETCFS_FAULT_DEV=<read|write|sync>:<n>[:<errno>] fails that device request
 * type with errno (default EIO) after n more succeed (tests). */
static void dev_fault_from_env(struct efs_fs *fs)
{
	static const char *const names[EFS_IO_NOPS] = {"read", "write", "sync"};
	const char *v = getenv("ETCFS_FAULT_DEV");
	unsigned long long n;
	int err = EIO, op;
	char *end;

	if (!v || !*v)
		return;
	for (op = 0; op < EFS_IO_NOPS; op++) {
		size_t l = strlen(names[op]);

		if (strncmp(v, names[op], l) == 0 && v[l] == ':') {
			v += l + 1;
			break;
		}
	}
	if (op == EFS_IO_NOPS)
		goto bad;
	errno = 0;
	n = strtoull(v, &end, 10);
	if (errno || end == v || (*end && *end != ':'))
		goto bad;
	if (*end == ':') {
		long e = strtol(end + 1, &end, 10);

		if (*end || e <= 0 || e > 4095)
			goto bad;
		err = (int)e;
	}
	efs_iopool_fault(fs->pool, (enum efs_io_op)op, n, err);
	efs_log_warn("fault injection: device %s fails with errno %d after %llu more", names[op],
		     err, n);
	return;
bad:
	efs_log_err("ETCFS_FAULT_DEV='%s' ignored: expected read|write|sync:N[:ERRNO]",
		    getenv("ETCFS_FAULT_DEV"));
}
#else
static void io_late_from_env(struct efs_fs *fs)
{
	(void)fs;
}

static void dev_fault_from_env(struct efs_fs *fs)
{
	(void)fs;
}
#endif

/* The allocator took a grown geometry (docs/DESIGN.md, "Online growth"):
 * statfs counts the new groups from now on. */
static void fs_grown(void *arg, uint64_t device_size, uint32_t ag_count)
{
	struct efs_fs *fs = arg;

	fs->fi->device_size = device_size;
	fs->fi->ag_count = ag_count;
}

/* etcfsctl grow set an inode limit: statfs and the create-time check use it
 * from now on. */
static void fs_inode_limit(void *arg, uint64_t inode_limit)
{
	struct efs_fs *fs = arg;

	if (inode_limit == fs->fi->inode_limit)
		return;
	efs_log_info("the inode limit is now %" PRIu64 " (was %" PRIu64 ")", inode_limit,
		     fs->fi->inode_limit);
	fs->fi->inode_limit = inode_limit;
}

/* Blocks freed while a dead peer's grace runs stay unallocated until it
 * ends: it may still land an in-place write in them. */
static uint64_t death_hold(void *arg, int64_t rev, const Etcdserverpb__RangeResponse *nodes,
			   const Etcdserverpb__RangeResponse *gens)
{
	struct efs_fs *fs = arg;

	return fs->lc ? efs_lock_free_hold(fs->lc, rev, nodes, gens) : 0;
}

/* The device pool and the data path; read-write mounts also get the
 * allocator and the reclaimer. */
static int data_path_new(struct efs_fs *fs, const struct efs_fs_opts *o)
{
	struct efs_iopool_opts po = {.threads = o->io_threads, .m = fs->m};
	struct efs_alloc_opts ao = {
		.ns = &fs->ns, .fi = fs->fi, .m = fs->m, .dead_grace_ms = o->dead_grace_ms,
		.dev_fd = &fs->dev_fd, .grown = fs_grown, .grown_arg = fs,
		.inode_limit = fs_inode_limit,
	};
	int r;

	if (fs->dev_fd < 0)
		return 0;
	fs->dead_grace_ms = o->dead_grace_ms ? o->dead_grace_ms : EFS_ALLOC_DEAD_GRACE_MS;
	r = efs_iopool_new(&fs->pool, fs->loop, fs->dev_fd, fs->dev_direct, &po);
	if (r < 0)
		return r;
	dev_fault_from_env(fs);
	io_late_from_env(fs);
	r = efs_fs_data_init(fs);
	if (r < 0 || fs->read_only)
		return r;
	r = efs_alloc_new(&fs->alloc, fs->loop, fs->c, fs->s, &ao);
	if (r < 0)
		return r;
	efs_alloc_set_death_hold(fs->alloc, death_hold, fs);
	r = efs_fs_reclaim_init(fs);
	if (r < 0)
		return r;
	r = efs_alloc_start(fs->alloc, alloc_started, fs);
	if (r == 1)
		r = 0;
	return r;
}

/* Whether the running kernel versions SETATTR replies (read once). */
static bool kernel_versions_setattr(void)
{
	struct utsname u;
	bool known = uname(&u) == 0, v = known && efs_fs_kernel_versions_setattr(u.release);

	efs_log_debug("fs: SETATTR replies %s (kernel %s)",
		      v ? "keep their attribute timeout" : "carry no attribute timeout",
		      known ? u.release : "unknown");
	return v;
}

int efs_fs_new(struct efs_fs **ret, uv_loop_t *loop, struct efs_etcd *c,
	       struct efs_session *s, struct efs_lockcache *lc, struct efs_metrics *m,
	       const struct efs_fs_opts *o)
{
	struct efs_fs *fs;
	ProtobufCBinaryData b = {0};
	int r;

	if (!o || !o->ns || !o->fi || !c || !s || !lc || !loop)
		return -EINVAL;
	fs = efs_mem_calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	efs_list_init(&fs->ready);
	efs_list_init(&fs->delayed);
	efs_list_init(&fs->ino_waiters);
	efs_list_init(&fs->count_waiters);
	efs_list_init(&fs->ops);
	efs_list_init(&fs->dinvals);
	efs_list_init(&fs->readpins);
	efs_list_init(&fs->handles);
	efs_list_init(&fs->kpages);
	fs->max_kpages = o->max_cached_files ? o->max_cached_files : 16384;
	fs->loop = loop;
	fs->c = c;
	fs->s = s;
	fs->lc = lc;
	fs->m = m;
	fs->ns = *o->ns;
	fs->read_only = o->read_only;
	fs->noatime = o->noatime;
	fs->cow = o->cow;
	fs->delegate = o->delegate && !o->read_only;
	fs->batch_ms = o->batch_ms ? o->batch_ms : 20;
	fs->cache_timeout_ms = o->cache_timeout_ms == EFS_FS_NO_KERNEL_CACHE ? 0
			       : o->cache_timeout_ms		    ? o->cache_timeout_ms
								    : 500;
	fs->ino_batch = o->ino_batch ? o->ino_batch : 1024;
	fs->setattr_versioned = kernel_versions_setattr();
	fs->epoch = 1;
	fs->dev_fd = o->dev_fd > 0 ? o->dev_fd : -1;
	fs->dev_direct = o->dev_direct;
	fs->flush_interval_ms = o->flush_interval_ms ? o->flush_interval_ms : 1000;
	r = efs_meta_pack(&o->fi->base, &b);
	if (r < 0)
		goto fail;
	r = efs_meta_fsinfo_decode(b.data, b.len, &fs->fi, NULL);
	efs_mem_free(b.data);
	if (r < 0)
		goto fail;
	fs->blksize = fs->fi->block_size ? fs->fi->block_size : 4096;
	if (o->sb && o->sb->block_size)
		fs->blksize = o->sb->block_size;
	r = efs_fs_icache_init(fs);
	if (r < 0)
		goto fail;
	fs->idle = efs_mem_calloc(1, sizeof(*fs->idle));
	if (!fs->idle) {
		r = -ENOMEM;
		goto fail;
	}
	r = uv_idle_init(loop, fs->idle);
	if (r < 0) {
		efs_mem_free(fs->idle);
		fs->idle = NULL;
		goto fail;
	}
	fs->idle->data = fs;
	fs->retry_timer = efs_mem_calloc(1, sizeof(*fs->retry_timer));
	if (!fs->retry_timer) {
		r = -ENOMEM;
		goto fail;
	}
	r = uv_timer_init(loop, fs->retry_timer);
	if (r < 0) {
		efs_mem_free(fs->retry_timer);
		fs->retry_timer = NULL;
		goto fail;
	}
	fs->retry_timer->data = fs;
	r = efs_fs_batch_init(fs);
	if (r < 0)
		goto fail;
	if (m) {
		r = register_metrics(fs);
		if (r < 0)
			goto fail;
	}
	r = efs_fs_plock_init(fs);
	if (r < 0)
		goto fail;
	efs_fs_lockops_init(fs);
	r = data_path_new(fs, o);
	if (r < 0)
		goto fail;
	*ret = fs;
	return 0;
fail:
	efs_fs_free(fs);
	return r;
}

void efs_fs_set_capacity(struct efs_fs *fs, struct efs_capacity *cap)
{
	fs->cap = cap;
}

static void kernel_gone(struct efs_fs *fs);

/*
 * Whether an inode invalidation that found no inode must be issued again
 * (efs_inval_set_referenced): while this node counts kernel references to
 * it (an entry reply was written and no FORGET came back) and what that
 * reply let the kernel cache has not timed out (the deadline the lock
 * cache notes for every reply with a timeout; past it, nothing it gave
 * is cached, and a reply the kernel dropped leaves a count forever).
 */
#define REFERENCED_SLACK_MS 20

static bool kernel_referenced(void *arg, uint64_t ino)
{
	struct efs_fs *fs = arg;
	const struct efs_fs_inode *in = efs_fs_ifind(fs, ino);

	/* The kernel counts a timeout from when the requester applies the
	 * reply, a little after we noted it. */
	return in && in->nlookup > 0 && fs->lc &&
	       efs_clock_mono_ns() < efs_lock_kernel_cache_until(fs->lc, ino) +
					     REFERENCED_SLACK_MS * EFS_NSEC_PER_MSEC;
}

void efs_fs_set_fuse(struct efs_fs *fs, struct fuse_session *se)
{
	int r;

	fs->se = se;
	if (se && !fs->inval) {
		r = efs_inval_new(&fs->inval, fs->loop, NULL);
		if (r < 0) {
			efs_log_warn("fs: no kernel invalidations (%s): a lock given up while a "
				     "file is open leaves its pages to the kernel",
				     strerror(-r));
			fs->inval = NULL;
		} else {
			efs_inval_set_referenced(fs->inval, kernel_referenced, fs);
		}
	}
	if (fs->inval)
		efs_inval_set_session(fs->inval, se);
	if (!se)
		kernel_gone(fs);
}

/* Stops the kernel channel: nothing is left to invalidate. Its threads
 * are joined here (the FUSE connection is gone, so no notification can
 * be stuck), and what waited for them completes. */
static void kernel_gone(struct efs_fs *fs)
{
	if (!fs->inval)
		return;
	fs->inval = efs_inval_free(fs->inval);
	efs_fs_lockops_kernel_gone(fs);
	if (fs->data_priv)
		efs_fs_data_kernel_gone(fs);
}

/* How long before the lease's deadline a suspended node's device writes
 * stop: a write that started before may still be under way at the
 * deadline, so the margin is what such a write may take (an eighth of
 * the TTL, between 50 ms and 1 s). */
static uint64_t write_margin_ns(struct efs_fs *fs)
{
	int64_t ttl = efs_session_ttl_s(fs->s);
	uint64_t m = ttl > 0 ? (uint64_t)ttl * EFS_NSEC_PER_SEC / 8 : 250 * EFS_NSEC_PER_MSEC;

	if (m < 50 * EFS_NSEC_PER_MSEC)
		m = 50 * EFS_NSEC_PER_MSEC;
	if (m > EFS_NSEC_PER_SEC)
		m = EFS_NSEC_PER_SEC;
	return m;
}

void efs_fs_session_changed(struct efs_fs *fs, enum efs_session_state old,
			    enum efs_session_state new_state)
{
	if (new_state == EFS_SESSION_SUSPENDED && fs->pool && fs->s) {
		/* No device write starts past the lease's deadline (less the
		 * margin): requests already past their checks may finish
		 * before it, new ones wait for the session. */
		uint64_t dl = efs_session_deadline_ns(fs->s);
		uint64_t m = write_margin_ns(fs);

		efs_iopool_set_write_deadline(fs->pool, dl > m ? dl - m : 1);
	}
	if (new_state == EFS_SESSION_SUSPENDED ||
	    (new_state == EFS_SESSION_GONE && old == EFS_SESSION_ACTIVE))
		/* A peer may take this node's locks once the lease's deadline
		 * passes. Entries and attributes time out before the session
		 * suspends (efs_fs_cache_bound) and read(2) revalidates them;
		 * the pages a mapping reads without asking are dropped here,
		 * every page-cached inode's (at most --max-cached-files). */
		efs_fs_kpages_drop_all(fs);
	if (new_state == EFS_SESSION_GONE && fs->pool) {
		/* Writes queued under the lost lease never start: their blocks
		 * may be another node's by now. */
		efs_iopool_refuse_submitted(fs->pool);
		efs_iopool_set_write_deadline(fs->pool, 1);
	}
	if (new_state == EFS_SESSION_ACTIVE && fs->pool)
		efs_iopool_set_write_deadline(fs->pool, 0);
	if (new_state == EFS_SESSION_GONE) {
		/* Every lock and open reference went with the lease: nothing
		 * cached is trustworthy, and handles opened before fail. (The
		 * lock cache forgets its locks by itself when it sees the new
		 * generation.) */
		fs->epoch++;
		fs->ino_next = fs->ino_end; /* reserve afresh under the new generation */
		if (fs->data_priv)
			efs_fs_data_session_lost(fs);
		if (fs->alloc)
			efs_alloc_session_lost(fs->alloc);
		efs_fs_plock_session_lost(fs);
		/* Orphans this node's references or handles held may now
		 * wait for nobody: the next pass (once a session is back)
		 * reads them all. */
		efs_fs_reclaim_rescan(fs);
	}
}

struct leave_state {
	struct efs_fs *fs;
	void (*cb)(int status, void *arg);
	void *arg;
	int err;
};

static void leave_alloc_done(int status, void *arg)
{
	struct leave_state *ls = arg;

	if (status < 0 && ls->err == 0)
		ls->err = status;
	ls->cb(ls->err, ls->arg);
	efs_mem_free(ls);
}

static void leave_synced(int status, void *arg)
{
	struct leave_state *ls = arg;
	int r;

	if (status < 0) {
		efs_log_warn("fs: publishing at unmount failed: %s", strerror(-status));
		ls->err = status;
	}
	r = efs_alloc_leave(ls->fs->alloc, leave_alloc_done, ls);
	if (r == 1)
		leave_alloc_done(0, ls);
	else if (r < 0)
		leave_alloc_done(r, ls);
}

/* The publication for a request ended: a leave that came meanwhile starts
 * (its callback runs in every case, perhaps at once), then the request's
 * caller is told, so that it cannot start another publication first. */
static void fs_published(int status, void *arg)
{
	struct efs_fs *fs = arg;
	void (*cb)(int status, void *arg) = fs->pub_cb;
	void *cb_arg = fs->pub_arg;
	struct leave_state *ls = fs->leave_next;
	int r;

	fs->pub_cb = NULL;
	fs->leave_next = NULL;
	if (ls) {
		r = efs_fs_data_sync_all(fs, leave_synced, ls);
		if (r == 1)
			leave_synced(0, ls);
		else if (r < 0)
			leave_synced(r, ls);
	}
	cb(status, cb_arg);
}

/*
 * A sync request or a leave finds the batch of delegated changes busy: it
 * runs again once the batch committed (a leave goes on after a failed
 * batch too, a sync request answers its error).
 */
struct batch_then {
	struct efs_fs *fs;
	int (*fn)(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg);
	void (*cb)(int status, void *arg);
	void *arg;
	bool go_on;
};

static void batch_then_cb(void *arg, int status)
{
	struct batch_then t = *(struct batch_then *)arg;
	int r;

	efs_mem_free(arg);
	if (status < 0 && !t.go_on) {
		t.cb(status, t.arg);
		return;
	}
	r = t.fn(t.fs, t.cb, t.arg);
	if (r != 0)
		t.cb(r == 1 ? 0 : r, t.arg);
}

static int after_batch(struct efs_fs *fs,
		       int (*fn)(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg),
		       void (*cb)(int status, void *arg), void *arg, bool go_on)
{
	struct batch_then *t = efs_mem_calloc(1, sizeof(*t));
	int r;

	if (!t)
		return -ENOMEM;
	*t = (struct batch_then){.fs = fs, .fn = fn, .cb = cb, .arg = arg, .go_on = go_on};
	r = efs_fs_batch_sync(fs, batch_then_cb, t);
	if (r != 0)
		efs_mem_free(t);
	return r == 1 ? fn(fs, cb, arg) : r;
}

int efs_fs_publish_all(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg)
{
	int r;

	if (efs_fs_batch_busy(fs))
		return after_batch(fs, efs_fs_publish_all, cb, arg, false);
	if (fs->batch_err) {
		/* A batch of delegated changes failed since the last sync. */
		r = fs->batch_err;
		fs->batch_err = 0;
		return r;
	}
	if (fs->pub_cb)
		return -EBUSY;
	r = efs_fs_data_sync_all(fs, fs_published, fs);
	if (r == 0) {
		fs->pub_cb = cb;
		fs->pub_arg = arg;
	}
	return r;
}

int efs_fs_leave(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg)
{
	struct leave_state *ls;
	int r;

	if (efs_fs_batch_busy(fs))
		return after_batch(fs, efs_fs_leave, cb, arg, true);
	if (!fs->alloc)
		return 1;
	ls = efs_mem_calloc(1, sizeof(*ls));
	if (!ls)
		return -ENOMEM;
	ls->fs = fs;
	ls->cb = cb;
	ls->arg = arg;
	if (fs->pub_cb) {
		fs->leave_next = ls;
		return 0;
	}
	r = efs_fs_data_sync_all(fs, leave_synced, ls);
	if (r == 1) {
		/* Nothing to publish: give the groups back (may finish now). */
		r = efs_alloc_leave(fs->alloc, leave_alloc_done, ls);
		if (r != 0)
			efs_mem_free(ls);
		return r;
	}
	if (r < 0)
		efs_mem_free(ls);
	return r;
}

int efs_fs_stop_io(struct efs_fs *fs, void (*cb)(void *arg), void *arg)
{
	if (fs->pool) {
		int r = efs_iopool_close(fs->pool, cb, arg);

		return r == -EALREADY ? 1 : r;
	}
	return 1;
}

uint64_t efs_fs_inflight(const struct efs_fs *fs)
{
	return fs->inflight;
}

uint64_t efs_fs_inode_limit(const struct efs_fs *fs)
{
	return fs->fi->inode_limit;
}

uint64_t efs_fs_pending_bytes(const struct efs_fs *fs)
{
	struct efs_alloc_stats as;

	if (!fs->alloc)
		return 0;
	efs_alloc_get_stats(fs->alloc, &as);
	return as.pending_blocks * fs->blksize;
}

void efs_fs_abandon(struct efs_fs *fs)
{
	if (!fs)
		return;
	if (fs->data_priv)
		efs_fs_data_abandon(fs);
	if (fs->alloc)
		efs_fs_reclaim_abandon(fs);
	efs_fs_batch_abandon(fs);
	if (fs->lc) {
		efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_DIR, NULL, NULL);
		efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_FILE, NULL, NULL);
		efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_SPECIAL, NULL, NULL);
	}
	fs->lc = NULL;
}

struct efs_fs *efs_fs_free(struct efs_fs *fs)
{
	if (!fs)
		return NULL;
	kernel_gone(fs);
	efs_fs_readpins_drop_all(fs);
	efs_fs_batch_free(fs);
	while (fs->handles.next && !efs_list_empty(&fs->handles))
		efs_fs_handle_free(fs, efs_list_entry(fs->handles.next, struct efs_fs_handle, link));
	if (fs->alloc)
		efs_fs_reclaim_done(fs);
	if (fs->data_priv)
		efs_fs_data_done(fs);
	efs_fs_lockops_done(fs);
	fs->alloc = efs_alloc_free(fs->alloc);
	fs->pool = efs_iopool_free(fs->pool);
	efs_fs_plock_done(fs);
	efs_fs_icache_done(fs);
	if (fs->fi)
		efs_meta_record_free(fs->fi);
	if (fs->idle) {
		uv_idle_stop(fs->idle);
		uv_close((uv_handle_t *)fs->idle, handle_close_cb);
	}
	if (fs->retry_timer) {
		uv_timer_stop(fs->retry_timer);
		uv_close((uv_handle_t *)fs->retry_timer, handle_close_cb);
	}
	efs_mem_free(fs);
	return NULL;
}
