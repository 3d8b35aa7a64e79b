/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The one place that answers the kernel.
 *
 * Every kernel request has one request base (struct efs_fs_rq), embedded
 * in the record that serves it (an engine operation, a data request, a
 * byte-range lock request) or shared by the records it passes through (a
 * data request and the engine operation that prepares it). The base is
 * started once, which counts the request; it is answered once, through
 * the functions here, which turn a negative errno into the reply, count
 * an error and record the latency. A second answer is a bug: test builds
 * (fault hooks) abort, packaged builds log it and drop it (libfuse must
 * never see a request twice).
 *
 * Answering is safe from any thread (an I/O worker may answer a read):
 * the counters and the latency histogram are atomic and |replied| is set
 * by exchange. Answering frees nothing: the record's bookkeeping (locks,
 * range locks, quarantine tickets) is released by its owner on the loop,
 * after the answer.
 */
#include "fs/fs-int.h"

#include <errno.h>
#include <stdlib.h>

#include "config.h"

#include "util/clock.h"
#include "util/log.h"

const char *const efs_fs_op_names[EFS_FS_NOPS] = {
	[EFS_FS_OP_INIT] = "init",
	[EFS_FS_OP_LOOKUP] = "lookup",
	[EFS_FS_OP_FORGET] = "forget",
	[EFS_FS_OP_GETATTR] = "getattr",
	[EFS_FS_OP_SETATTR] = "setattr",
	[EFS_FS_OP_READLINK] = "readlink",
	[EFS_FS_OP_MKNOD] = "mknod",
	[EFS_FS_OP_MKDIR] = "mkdir",
	[EFS_FS_OP_UNLINK] = "unlink",
	[EFS_FS_OP_RMDIR] = "rmdir",
	[EFS_FS_OP_SYMLINK] = "symlink",
	[EFS_FS_OP_RENAME] = "rename",
	[EFS_FS_OP_LINK] = "link",
	[EFS_FS_OP_OPEN] = "open",
	[EFS_FS_OP_READ] = "read",
	[EFS_FS_OP_RELEASE] = "release",
	[EFS_FS_OP_OPENDIR] = "opendir",
	[EFS_FS_OP_READDIR] = "readdir",
	[EFS_FS_OP_READDIRPLUS] = "readdirplus",
	[EFS_FS_OP_RELEASEDIR] = "releasedir",
	[EFS_FS_OP_FSYNCDIR] = "fsyncdir",
	[EFS_FS_OP_STATFS] = "statfs",
	[EFS_FS_OP_SETXATTR] = "setxattr",
	[EFS_FS_OP_GETXATTR] = "getxattr",
	[EFS_FS_OP_LISTXATTR] = "listxattr",
	[EFS_FS_OP_REMOVEXATTR] = "removexattr",
	[EFS_FS_OP_CREATE] = "create",
	[EFS_FS_OP_RECLAIM] = "reclaim",
	[EFS_FS_OP_ATIME] = "atime",
	[EFS_FS_OP_WRITE] = "write",
	[EFS_FS_OP_FLUSH] = "flush",
	[EFS_FS_OP_FSYNC] = "fsync",
	[EFS_FS_OP_FALLOCATE] = "fallocate",
	[EFS_FS_OP_LSEEK] = "lseek",
	[EFS_FS_OP_COPY_FILE_RANGE] = "copy_file_range",
	[EFS_FS_OP_GETLK] = "getlk",
	[EFS_FS_OP_SETLK] = "setlk",
	[EFS_FS_OP_FLOCK] = "flock",
	[EFS_FS_OP_PUBLISH] = "publish",
};

void efs_fs_rq_start(struct efs_fs_rq *rq, struct efs_fs *fs, fuse_req_t req,
		     enum efs_fs_opcode code)
{
	rq->fs = fs;
	rq->req = req;
	rq->code = code;
	rq->start_ns = efs_clock_mono_ns();
	atomic_init(&rq->replied, false);
	if (req)
		efs_counter_inc(fs->m_ops[code]);
}

bool efs_fs_rq_replied(const struct efs_fs_rq *rq)
{
	return atomic_load_explicit(&((struct efs_fs_rq *)rq)->replied, memory_order_relaxed);
}

/* Marks |rq| answered and counts it; false when there is no one to
 * answer or it was answered already. */
static bool answer(struct efs_fs_rq *rq, int err)
{
	struct efs_fs *fs = rq->fs;

	if (!rq->req)
		return false;
	if (atomic_exchange_explicit(&rq->replied, true, memory_order_relaxed)) {
		efs_log_err("fs: a %s request answered twice (dropped)", efs_fs_op_names[rq->code]);
#if EFS_FAULT_HOOKS
		abort(); /* test builds: a bug to find, not to survive */
#endif
		return false;
	}
	if (err)
		efs_counter_inc(fs->m_errs[rq->code]);
	efs_histogram_observe_ns(fs->m_lat[rq->code], efs_clock_mono_ns() - rq->start_ns);
	return true;
}

void efs_fs_rq_err(struct efs_fs_rq *rq, int err)
{
	if (err > 0)
		err = -EIO; /* not an errno this code produces: never answer success */
	if (answer(rq, err))
		fuse_reply_err(rq->req, -err);
}

int efs_fs_rq_entry(struct efs_fs_rq *rq, const struct fuse_entry_param *e)
{
	return answer(rq, 0) ? fuse_reply_entry(rq->req, e) : -EALREADY;
}

int efs_fs_rq_create(struct efs_fs_rq *rq, const struct fuse_entry_param *e,
		     const struct fuse_file_info *fi)
{
	return answer(rq, 0) ? fuse_reply_create(rq->req, e, fi) : -EALREADY;
}

void efs_fs_rq_attr(struct efs_fs_rq *rq, const struct stat *st, double timeout)
{
	if (answer(rq, 0))
		fuse_reply_attr(rq->req, st, timeout);
}

int efs_fs_rq_open(struct efs_fs_rq *rq, const struct fuse_file_info *fi)
{
	return answer(rq, 0) ? fuse_reply_open(rq->req, fi) : -EALREADY;
}

void efs_fs_rq_buf(struct efs_fs_rq *rq, const void *buf, size_t size)
{
	if (answer(rq, 0))
		fuse_reply_buf(rq->req, buf, size);
}

void efs_fs_rq_write(struct efs_fs_rq *rq, size_t count)
{
	if (answer(rq, 0))
		fuse_reply_write(rq->req, count);
}

void efs_fs_rq_statfs(struct efs_fs_rq *rq, const struct statvfs *st)
{
	if (answer(rq, 0))
		fuse_reply_statfs(rq->req, st);
}

void efs_fs_rq_readlink(struct efs_fs_rq *rq, const char *link)
{
	if (answer(rq, 0))
		fuse_reply_readlink(rq->req, link);
}

void efs_fs_rq_xattr(struct efs_fs_rq *rq, size_t size)
{
	if (answer(rq, 0))
		fuse_reply_xattr(rq->req, size);
}

void efs_fs_rq_lock(struct efs_fs_rq *rq, const struct flock *fl)
{
	if (answer(rq, 0))
		fuse_reply_lock(rq->req, fl);
}

void efs_fs_rq_lseek(struct efs_fs_rq *rq, off_t off)
{
	if (answer(rq, 0))
		fuse_reply_lseek(rq->req, off);
}

void efs_fs_rq_none(struct efs_fs_rq *rq)
{
	if (answer(rq, 0))
		fuse_reply_none(rq->req);
}

void efs_fs_reply_now(struct efs_fs *fs, fuse_req_t req, enum efs_fs_opcode code, int err)
{
	struct efs_fs_rq rq;

	efs_fs_rq_start(&rq, fs, req, code);
	efs_fs_rq_err(&rq, err);
}

void efs_fs_reply_write_now(struct efs_fs *fs, fuse_req_t req, enum efs_fs_opcode code, int err)
{
	struct efs_fs_rq rq;

	efs_fs_rq_start(&rq, fs, req, code);
	if (err < 0)
		efs_fs_rq_err(&rq, err);
	else
		efs_fs_rq_write(&rq, 0);
}
