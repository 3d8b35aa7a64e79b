/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Data requests (fs/file/file-int.h): their contexts and the prepare
 * step that makes sure the node holds the inode's lock in the mode a
 * request needs and that the data state is valid, by the fast path or
 * through an engine operation.
 */
#include "fs/file/file-int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dev/iopool.h"
#include "etcd/kv.h"
#include "alloc/alloc.h"
#include "space/extmap.h"
#include "space/runs.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

/* ---- Requests ---- */

struct dreq *efs_file_dreq_new(fuse_req_t req, enum rkind kind, enum efs_fs_opcode code,
			       uint64_t ino)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct dreq *r = efs_mem_calloc(1, sizeof(*r));

	if (!r) {
		efs_fs_reply_now(fs, req, code, -ENOMEM);
		return NULL;
	}
	r->fs = fs;
	efs_fs_rq_start(&r->rq, fs, req, code);
	r->kind = kind;
	r->ino = ino;
	fs->inflight++;
	if (kind == RK_WRITE)
		efs_file_writes_inflight(fs, 1);
	return r;
}

struct dreq *efs_file_dreq_checked(fuse_req_t req, int err, enum rkind kind,
				   enum efs_fs_opcode code, uint64_t ino)
{
	if (err < 0) {
		efs_fs_reply_now(fuse_req_userdata(req), req, code, err);
		return NULL;
	}
	return efs_file_dreq_new(req, kind, code, ino);
}

static void dreq_unpin(struct dreq *r)
{
	if (r->pinned) {
		efs_lock_put(r->fs->lc, &r->lr);
		r->pinned = false;
	}
	if (r->pinned_in) {
		efs_lock_put(r->fs->lc, &r->lr_in);
		r->pinned_in = false;
	}
}

/* Ends a request: replies |err| when it has not replied (0: the caller
 * forgot, EIO), drops everything. */
void efs_file_dreq_end(struct dreq *r, int err)
{
	struct efs_fs *fs = r->fs;

	if (r->rq.req && !efs_fs_rq_replied(&r->rq)) {
		/* 0: a path that did not answer: never leave the kernel
		 * hanging. */
		if (err == 0)
			efs_log_warn("data: %s ended without an answer: EIO",
				     efs_fs_op_names[r->rq.code]);
		efs_fs_rq_err(&r->rq, err < 0 ? err : -EIO);
	}
	dreq_unpin(r);
	if (r->rl.held && r->d)
		efs_rangelock_drop(&r->d->ranges, &r->rl);
	if (r->buf != r->wbuf)
		efs_io_buf_free(r->buf);
	efs_io_buf_free(r->edge[0]);
	efs_io_buf_free(r->edge[1]);
	if (r->wbuf)
		efs_io_buf_free(r->wbuf); /* r->data points into it */
	else
		efs_mem_free(r->data);
	if (r->d) {
		struct efs_fs_data *d = r->d;

		r->d = NULL;
		d->nref--;
		efs_file_state_maybe_free(d);
	}
	if (r->d_in) {
		struct efs_fs_data *d = r->d_in;

		r->d_in = NULL;
		d->nref--;
		efs_file_state_maybe_free(d);
	}
	fs->inflight--;
	if (r->kind == RK_WRITE)
		efs_file_writes_inflight(fs, -1);
	efs_mem_free(r);
}


/* ---- Prepare: lock, record and map ---- */

bool efs_file_state_ready(struct efs_fs *fs, uint64_t ino, enum efs_lock_mode mode)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct efs_fs_data *d = in ? in->data : NULL;

	if (!d || d->broken || !efs_file_map_valid(fs, d))
		return false;
	if (!in->rec || in->gone || !efs_fs_inode_valid(fs, in))
		return false;
	return efs_lock_held(fs->lc, ino) >= mode;
}


/* The flags of r's next lock request: the kernel's writeback passes a
 * drain, and so does the second lock of a copy whose first one is pinned
 * (lock.h). */
unsigned efs_file_lock_flags(const struct dreq *r)
{
	unsigned f = r->lock_flags;

	if (r->kind == RK_CFR && (r->phase == 0 ? r->pinned : r->pinned_in))
		f |= EFS_LOCK_F_NESTED;
	return f;
}

/* The pin of the fast path was not a cache hit: it was cancelled. */
static void fast_pin_cb(struct efs_lock_req *lr, int status)
{
	struct dreq *r = lr->arg;

	if (status == 0) {
		/* Granted before the cancel: newly taken behind the engine's
		 * back, so make the engine reload what it caches. */
		struct efs_fs_inode *in = efs_fs_ifind(r->fs, r->ino);

		if (in)
			in->epoch = 0;
		efs_lock_put(r->fs->lc, lr);
	}
	efs_file_prep_engine(r);
}

static void prep_go(struct dreq *r)
{
	struct efs_fs_inode *in = efs_fs_ifind(r->fs, r->ino);
	struct efs_fs_data *d = in ? in->data : NULL;
	struct efs_fs_data **slot = r->kind == RK_CFR && r->phase == 0 ? &r->d_in : &r->d;

	if (!d) {
		efs_file_dreq_end(r, -EIO);
		return;
	}
	if (*slot != d) {
		if (*slot) {
			(*slot)->nref--;
			efs_file_state_maybe_free(*slot);
		}
		*slot = d;
		d->nref++;
	}
	r->cont(r);
}

/* Pins the lock of r->ino in r->mode (a cache hit), or sends the request
 * through the engine. */
void efs_file_prep(struct dreq *r, enum efs_lock_mode mode, void (*cont)(struct dreq *r))
{
	struct efs_fs *fs = r->fs;
	struct efs_lock_req *lr = r->kind == RK_CFR && r->phase == 0 ? &r->lr_in : &r->lr;
	bool *pinned = r->kind == RK_CFR && r->phase == 0 ? &r->pinned_in : &r->pinned;
	int e;

	/* Shared becomes exclusive on a file open for writing here, except
	 * under a shared hold: the kernel may keep pages locked for this very
	 * request (readahead), and an upgrade must never wait with them. */
	if (efs_lock_held(fs->lc, r->ino) != EFS_LOCK_SHARED)
		mode = efs_fs_lock_mode(fs, r->ino, mode);
	r->mode = mode;
	r->cont = cont;
	if (!efs_file_state_ready(fs, r->ino, mode)) {
		efs_file_prep_engine(r);
		return;
	}
	if (*pinned) {
		prep_go(r);
		return;
	}
	memset(lr, 0, sizeof(*lr));
	lr->n = 1;
	lr->ino[0] = r->ino;
	lr->mode[0] = mode;
	lr->flags = efs_file_lock_flags(r);
	lr->cb = fast_pin_cb;
	lr->arg = r;
	e = efs_lock_acquire(fs->lc, lr);
	if (e == 1) {
		*pinned = true;
		prep_go(r);
		return;
	}
	if (e == 0) {
		efs_lock_cancel(fs->lc, lr);
		return;
	}
	efs_file_prep_engine(r);
}

int efs_file_plan_regular(struct efs_fs_op *op, uint64_t ino, enum efs_lock_mode mode)
{
	const Etcfs__Inode *rec;

	/* |mode| is what the request settled (efs_file_prep: shared stays
	 * shared under a shared hold, since the kernel may keep pages locked
	 * for the request and an upgrade must never wait with them). */
	if (op->loads_done == 0)
		return efs_fs_want_exact(op, ino, mode);
	rec = efs_fs_rec(op, ino);
	if (!rec)
		return EFS_FS_GONE;
	if (S_ISDIR(rec->mode))
		return -EISDIR;
	if (!S_ISREG(rec->mode))
		return -EINVAL;
	return EFS_FS_CONT;
}

static int prep_plan(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;

	return efs_file_plan_regular(op, r->ino, r->mode);
}

/* The in-core state and a map valid under the grant held. */
static int prep_prepare(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;
	struct efs_fs *fs = op->fs;
	struct efs_fs_inode *in = efs_fs_ifind(fs, r->ino);
	struct efs_fs_data *d;

	if (!in || !in->rec)
		return EFS_FS_GONE;
	d = efs_file_state_get(fs, in);
	if (!d)
		return -ENOMEM;
	if (efs_file_map_valid(fs, d))
		return EFS_FS_CONT;
	if (efs_file_state_dirty(d)) {
		/* Cannot be: a release publishes the state first
		 * (lockops.c) and every change is made under a pin. */
		efs_log_warn("data: inode %llu: dirty state lost its lock",
			     (unsigned long long)r->ino);
		d->broken = true;
		return -EIO;
	}
	return efs_file_map_load(op, d);
}

/* Pins the lock for the request and hands the request over. */
static int prep_build(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;
	struct efs_fs *fs = op->fs;
	struct efs_lock_req *lr = r->kind == RK_CFR && r->phase == 0 ? &r->lr_in : &r->lr;
	bool *pinned = r->kind == RK_CFR && r->phase == 0 ? &r->pinned_in : &r->pinned;
	int e;

	if (!*pinned) {
		memset(lr, 0, sizeof(*lr));
		lr->n = 1;
		lr->ino[0] = r->ino;
		lr->mode[0] = r->mode;
		lr->flags = efs_file_lock_flags(r);
		lr->cb = fast_pin_cb;
		lr->arg = r;
		/* Pinned under the operation's own pin, never as a new
		 * acquisition: that is no cache hit while a local upgrade of
		 * the lock drains it (which it may have started while this
		 * operation loaded the map), and the request would fail with
		 * its lock held all along. */
		e = efs_lock_acquire_under(fs->lc, &op->lr, lr);
		if (e != 1) {
			efs_fs_op_note(op, e < 0 ? e : -EIO, "request pin",
				       e == -EINVAL ? "not covered by the operation's pin" : NULL);
			return -EIO;
		}
		*pinned = true;
	}
	r->handed = true;
	op->handed_on = true;
	op->priv = NULL; /* the request may end inside its continuation */
	prep_go(r);
	return EFS_FS_DONE;
}

static void prep_free(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;

	op->priv = NULL;
	if (r && !r->handed) {
		/* The engine answered the error through the request's base. */
		efs_file_dreq_end(r, -EIO);
	}
}

static void prep_done(struct efs_fs_op *op)
{
	(void)op;
}

#define PREP_DESC(name, opcode, mx)                                                         \
	static const struct efs_fs_opdesc name = {                                          \
		.code = opcode,                                                             \
		.mx_all = mx,                                                               \
		.plan = prep_plan,                                                          \
		.prepare = prep_prepare,                                                    \
		.build = prep_build,                                                        \
		.done = prep_done,                                                          \
	}

PREP_DESC(prep_open_desc, EFS_FS_OP_OPEN, true);
PREP_DESC(prep_read_desc, EFS_FS_OP_READ, false);
PREP_DESC(prep_write_desc, EFS_FS_OP_WRITE, false);
PREP_DESC(prep_fsync_desc, EFS_FS_OP_FSYNC, false);
PREP_DESC(prep_falloc_desc, EFS_FS_OP_FALLOCATE, false);
PREP_DESC(prep_lseek_desc, EFS_FS_OP_LSEEK, false);
PREP_DESC(prep_cfr_desc, EFS_FS_OP_COPY_FILE_RANGE, false);
PREP_DESC(prep_setattr_desc, EFS_FS_OP_SETATTR, false);

static const struct efs_fs_opdesc *const prep_descs[RK_NKINDS] = {
	[RK_OPEN] = &prep_open_desc,	 [RK_READ] = &prep_read_desc,
	[RK_WRITE] = &prep_write_desc,	 [RK_FSYNC] = &prep_fsync_desc,
	[RK_FALLOC] = &prep_falloc_desc, [RK_LSEEK] = &prep_lseek_desc,
	[RK_CFR] = &prep_cfr_desc,	 [RK_SETATTR] = &prep_setattr_desc,
};

void efs_file_prep_engine(struct dreq *r)
{
	struct efs_fs_op *op = efs_fs_op_new_for(r->fs, &r->rq, prep_descs[r->kind]);

	if (!op) {
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	op->lock_flags = efs_file_lock_flags(r);
	op->ino = r->ino;
	op->priv = r;
	op->priv_free = prep_free;
	r->handed = false;
	efs_fs_op_run(op);
}
