/* SPDX-License-Identifier: Apache-2.0 */
/*
 * truncate and deferred setattr of regular files (fs/data.h).
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

/* ---- truncate (setattr with a size) ---- */

/*
 * A truncate is an engine operation whose build cuts the map and then is
 * the publication build of its inode (never left pending: a record put by
 * another operation must never carry a size below published extents).
 * Steps of the build, re-entered after each wait: 0 take the block-range
 * lock from the new last block on; 2 rewrite the partial last block with
 * zeroes past the size (copy-on-write), cut the map, set the fields; 3
 * publish. A cut freeing more chunks than one transaction holds is done
 * in several operations, each ending at an intermediate size taken from
 * the chunk keys (from the end backwards), each a consistent publication.
 */
struct tr {
	struct dreq *r; /* NULL once handed to the next step or ended */
	struct efs_fs_op *op;
	int step;
	bool tail_done;
	uint64_t target; /* size of this step */
	bool final;
};

static int tr_plan(struct efs_fs_op *op)
{
	struct tr *x = op->priv;

	return efs_file_plan_regular(op, x->r->ino, EFS_LOCK_EXCLUSIVE);
}

/* Picks the size of this step: the requested one, or a chunk boundary when
 * the cut changes more chunks than one transaction holds. */
static uint64_t tr_step_size(struct efs_fs_data *d, uint64_t want, bool *final)
{
	struct efs_fs *fs = d->fs;
	uint64_t bs = fs->blksize, wantb = (want + bs - 1) / bs;
	size_t n = efs_extmap_nchunks(d->map), dirty = efs_extmap_ndirty(d->map);
	size_t budget = PUB_BUDGET / 2;
	uint64_t *keys, k;
	size_t cut = 0, keep;

	*final = true;
	if (n == 0 || dirty >= budget)
		return want;
	keys = efs_mem_malloc(n * sizeof(*keys));
	if (!keys)
		return want;
	efs_extmap_chunk_keys(d->map, keys, n);
	for (size_t i = 0; i < n; i++)
		if (keys[i] >= wantb)
			cut++;
	if (cut + dirty <= budget) {
		efs_mem_free(keys);
		return want;
	}
	/* Cut only the last (budget - dirty) chunks this time. */
	keep = n - (budget - dirty);
	k = keys[keep];
	efs_mem_free(keys);
	if (k * bs <= want)
		return want;
	*final = false;
	return k * bs;
}

static void tr_resume(struct tr *x, int err)
{
	efs_fs_op_resume_prepare(x->op, err);
}

static void tr_locked_cb(void *arg)
{
	struct tr *x = arg;

	x->step = 2;
	tr_resume(x, 0);
}

static void tr_tail_written(void *arg, int err)
{
	struct tr *x = arg;

	efs_io_buf_free(x->r->buf);
	x->r->buf = NULL;
	x->tail_done = true;
	tr_resume(x, err);
}

static void tr_tail_read(void *arg, int err)
{
	struct tr *x = arg;
	struct dreq *r = x->r;
	uint64_t bs = r->fs->blksize;
	int e;

	if (err < 0) {
		tr_resume(x, err);
		return;
	}
	memset(r->buf + x->target % bs, 0, bs - x->target % bs);
	e = efs_file_write_blocks(r->d, x->target / bs, 1, r->buf, 0, tr_tail_written, x);
	if (e < 0)
		tr_resume(x, e);
}

/* The partial last block keeps zeroes past the new size: rewrite it when
 * it holds data and the file shrinks. 1 nothing to do, 0 resumed later,
 * or a negative errno. */
static int tr_tail(struct tr *x)
{
	struct dreq *r = x->r;
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, size = d->in->rec->size, lastb;
	struct efs_ext px;
	int e;

	if (x->tail_done || x->target % bs == 0 || x->target >= size)
		return 1;
	lastb = x->target / bs;
	if (efs_extmap_lookup(d->map, lastb, 1, &px, 1) != 1 ||
	    (px.flags & EFS_META_EXTENT_F_PREALLOC))
		return 1;
	efs_io_buf_free(r->buf);
	r->buf = efs_io_buf_alloc(bs);
	if (!r->buf)
		return -ENOMEM;
	e = efs_file_read_blocks(d, lastb, 1, r->buf, tr_tail_read, x);
	if (e == 1) {
		memset(r->buf + x->target % bs, 0, bs - x->target % bs);
		e = efs_file_write_blocks(d, lastb, 1, r->buf, 0, tr_tail_written, x);
	}
	return e < 0 ? e : 0;
}

/* Cuts the map and sets the fields. */
static int tr_apply(struct tr *x)
{
	struct dreq *r = x->r;
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;
	struct efs_runs buried = {0};
	uint64_t bs = fs->blksize, newb = (x->target + bs - 1) / bs;
	int64_t now = efs_fs_now();
	int e;

	e = efs_extmap_punch(d->map, newb, UINT64_MAX - newb, &buried);
	if (e == 0 && buried.n)
		e = efs_file_bury(d, &buried);
	efs_runs_done(&buried);
	if (e < 0)
		return e;
	if (x->final) {
		e = efs_fs_setattr_apply(d->in->rec, &r->attr, r->to_set, now);
		if (e < 0)
			return e;
		efs_file_pf_from_rec(d, r->to_set);
		efs_file_pf_set_size(d, x->target);
	} else {
		efs_file_pf_set_size(d, x->target);
		efs_file_pf_set_mctime(d, now);
	}
	efs_file_pf_set_blocks(d);
	d->ver++;
	efs_file_dlist_add(d);
	return 0;
}

/* Map, range lock, tail block, cut, then the publication's own waits. */
static int tr_prepare(struct efs_fs_op *op)
{
	struct dpub *P = op->hook_state;
	struct tr *x = op->priv;
	struct dreq *r = x->r;
	struct efs_fs *fs = op->fs;
	struct efs_fs_inode *in = efs_fs_ifind(fs, r->ino);
	struct efs_fs_data *d;
	int e;

	if (!in || !in->rec)
		return EFS_FS_GONE;
	if (!r->d) {
		d = efs_file_state_get(fs, in);
		if (!d)
			return -ENOMEM;
		r->d = d;
		d->nref++;
	}
	d = r->d;
	if (d->broken || d->dropped)
		return -EIO;
	if (P->n == 0) {
		P->s[0].d = d;
		d->nref++;
		P->n = 1;
	}
	if (!efs_file_map_valid(fs, d)) {
		if (efs_file_state_dirty(d))
			return -EIO;
		return efs_file_map_load(op, d);
	}
	if (x->step == 0) {
		x->target = tr_step_size(d, (uint64_t)r->attr.st_size, &x->final);
		x->step = 1;
		e = efs_rangelock_take(&d->ranges, &r->rl, x->target / fs->blksize, UINT64_MAX, tr_locked_cb, x);
		if (e == 0)
			return EFS_FS_WAIT;
		x->step = 2;
	}
	if (x->step == 1)
		return EFS_FS_WAIT;
	if (x->step == 2) {
		e = tr_tail(x);
		if (e < 0)
			return e;
		if (e == 0)
			return EFS_FS_WAIT;
		e = tr_apply(x);
		if (e < 0)
			return e;
		x->step = 3;
	}
	return efs_file_pub_prepare(op, P);
}

static int tr_build(struct efs_fs_op *op)
{
	struct tr *x = op->priv;
	struct efs_fs_data *d = x->r->d;

	if (x->step != 3 || !d || d->broken || d->dropped)
		return -EIO;
	return efs_file_pub_build(op, op->hook_state);
}

static int tr_seal(struct efs_fs_op *op)
{
	return efs_file_pub_seal(op, op->hook_state);
}

static void tr_start(struct dreq *r);

/* The step committed (or had nothing to publish): reply, or the next step. */
static void tr_next(struct efs_fs_op *op)
{
	struct tr *x = op->priv;
	struct dreq *r = x ? x->r : NULL;
	struct efs_fs_inode *in;
	struct dpub *P = op->hook_state;

	if (!r)
		return;
	x->r = NULL;
	op->handed_on = true; /* the request goes on, or is answered here */
	if (r->rl.held && r->d)
		efs_rangelock_drop(&r->d->ranges, &r->rl);
	if (!x->final || (P && P->left_partial)) {
		/* More of the cut to publish (the last step too may have gone
		 * out in parts): answered once all of it is published. */
		tr_start(r);
		return;
	}
	in = efs_fs_ifind(r->fs, r->ino);
	if (in && in->rec) {
		struct stat st;

		efs_meta_inode_to_stat(in->rec, r->ino, r->fs->blksize, &st);
		efs_fs_rq_attr(&r->rq, &st, efs_fs_setattr_timeout(r->fs, r->ino, st.st_mode));
	}
	efs_file_dreq_end(r, in && in->rec ? 0 : -EIO);
}

static void tr_done(struct efs_fs_op *op)
{
	tr_next(op);
}

static void tr_free(struct efs_fs_op *op)
{
	struct tr *x = op->priv;
	struct dreq *r = x ? x->r : NULL;

	/* op->priv itself is freed by the engine. */
	if (!r)
		return;
	x->r = NULL;
	if (r->rl.held && r->d)
		efs_rangelock_drop(&r->d->ranges, &r->rl);
	if (x->step >= 3 && r->d && !r->d->broken && !r->d->dropped) {
		/* The map is cut in memory and not published: discard the
		 * state, it is reloaded from etcd. */
		struct efs_fs_data *d = r->d;

		efs_log_warn("data: inode %llu: truncate failed after its cut; state discarded",
			     (unsigned long long)d->ino);
		efs_file_state_discard(d);
	}
	/* The engine answered the error through the request's base. */
	efs_file_dreq_end(r, -EIO);
}

#define TR_DESC(var, opcode)                                                                       \
	static const struct efs_fs_opdesc var = {                                                  \
		.code = opcode,                                                                    \
		.origin = EFS_FS_ORIG_TRUNCATE,                                                    \
		.mutates = true,                                                                   \
		.plan = tr_plan,                                                                   \
		.prepare = tr_prepare,                                                             \
		.build = tr_build,                                                                 \
		.seal = tr_seal,                                                                   \
		.done = tr_done,                                                                   \
		.outcome = efs_file_pub_outcome,                                                   \
		.release = efs_file_pub_release,                                                   \
	}

TR_DESC(tr_desc, EFS_FS_OP_SETATTR);
/* The steps after the first of a truncate cut in several publications:
 * publications of the rest of the cut, counted as such, so that the
 * request is counted once under setattr (by its first operation). */
TR_DESC(tr_more_desc, EFS_FS_OP_PUBLISH);

static void tr_start(struct dreq *r)
{
	struct efs_fs_op *op = efs_fs_op_new_for(r->fs, &r->rq, r->tr_more ? &tr_more_desc : &tr_desc);
	struct dpub *P;
	struct tr *x;

	if (!op) {
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	r->tr_more = true;
	P = efs_mem_calloc(1, sizeof(*P));
	x = efs_mem_calloc(1, sizeof(*x));
	if (!P || !x) {
		efs_mem_free(P);
		efs_mem_free(x);
		op->handed_on = true;
		efs_fs_op_finish(op, 0);
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	P->fs = r->fs;
	P->trunc = r;
	P->start_ns = efs_clock_mono_ns();
	x->r = r;
	x->op = op;
	op->ino = r->ino;
	op->hook_state = P;
	op->priv = x;
	op->priv_free = tr_free;
	efs_fs_op_run(op);
}

/* A deferred setattr: applied to the merged record and the pending
 * fields under the held exclusive lock; |st| gets the attributes. */
static int defer_apply(struct efs_fs_data *d, struct stat *attr, int to_set, struct stat *st)
{
	Etcfs__Inode *rec = d->in->rec;
	int e = efs_fs_setattr_apply(rec, attr, to_set, efs_fs_now());

	if (e < 0)
		return e;
	efs_file_pf_from_rec(d, to_set);
	d->ver++;
	efs_file_dlist_add(d);
	efs_meta_inode_to_stat(rec, d->ino, d->fs->blksize, st);
	return 0;
}

/* A deferred setattr that waited for a release: the lock is held and
 * pinned by the request again. */
static void defer_cont(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	struct stat st;
	int e;

	if (d->broken || d->dropped || !d->in || !d->in->rec) {
		efs_file_dreq_end(r, -EIO);
		return;
	}
	e = defer_apply(d, &r->attr, r->to_set, &st);
	if (e < 0) {
		efs_file_dreq_end(r, e);
		return;
	}
	efs_fs_rq_attr(&r->rq, &st, efs_fs_setattr_timeout(r->fs, r->ino, st.st_mode));
	efs_file_dreq_end(r, 0);
}

bool efs_fs_data_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			 struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct efs_fs_data *d = in ? in->data : NULL;
	struct dreq *r;

	if (!fs->alloc)
		return false;
	if (to_set & FUSE_SET_ATTR_SIZE) {
		int e = fi && fi->fh ? efs_file_handle_ok(fs, efs_file_fh_of(fi)) : 0;

		if (in && in->rec && !in->gone && !S_ISREG(in->rec->mode))
			return false;
		if (e == 0 && fs->read_only)
			e = -EROFS;
		if (e == 0 && attr->st_size < 0)
			e = -EINVAL;
		r = efs_file_dreq_checked(req, e, RK_SETATTR, EFS_FS_OP_SETATTR, ino);
		if (!r)
			return true;
		r->attr = *attr;
		r->to_set = to_set;
		tr_start(r);
		return true;
	}
	/* Deferred attributes under our exclusive lock: applied to the merged
	 * record and published with the data (by the next publication, or by
	 * the lock's sync before it goes), for a file being written (open for
	 * writing or dirty; others commit at once). The change is made at
	 * once, so a cache hit stands in for the request's pin. */
	if (!d || d->broken || (!d->writers && !efs_file_state_dirty(d)) ||
	    !efs_file_state_ready(fs, ino, EFS_LOCK_EXCLUSIVE))
		return false;
	if ((to_set & FUSE_SET_ATTR_MODE) && fs->posix_acl && in->rec->xattr_count > 0)
		return false; /* chmod rewrites the ACL: the engine's path */
	if (fi && fi->fh && efs_file_handle_ok(fs, efs_file_fh_of(fi)) < 0)
		return false;
	if (!efs_lock_touch(fs->lc, ino, EFS_LOCK_EXCLUSIVE)) {
		/* A release drains the lock: wait for it as a data request
		 * (the engine's setattr holds the inode's mutex, so a drain
		 * serves it, and the pending fields re-applied to what it
		 * committed would undo it); the state is published and
		 * clean by the time the request has the lock again. */
		r = efs_file_dreq_new(req, RK_SETATTR, EFS_FS_OP_SETATTR, ino);
		if (!r)
			return true;
		r->attr = *attr;
		r->to_set = to_set;
		efs_file_prep(r, EFS_LOCK_EXCLUSIVE, defer_cont);
		return true;
	}
	{
		struct efs_fs_rq rq;
		struct stat st;
		int e;

		efs_fs_rq_start(&rq, fs, req, EFS_FS_OP_SETATTR);
		e = defer_apply(d, attr, to_set, &st);
		if (e < 0)
			efs_fs_rq_err(&rq, e);
		else
			efs_fs_rq_attr(&rq, &st, efs_fs_setattr_timeout(fs, ino, st.st_mode));
	}
	return true;
}
