/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fallocate and copy_file_range of regular files (fs/data.h).
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

/* ---- fallocate ---- */

static void fa_locked(void *arg);
static void fa_edges(struct dreq *r);
static void fa_edge_read(void *arg, int err);
static void fa_edge_written(void *arg, int err);
static void fa_prealloc(struct dreq *r);
static void fa_finish(struct dreq *r);

static void falloc_cont(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	uint64_t bs = fs->blksize, b0, b1;
	int e;

	if (r->d->broken) {
		efs_file_dreq_end(r, -EIO);
		return;
	}
	b0 = (uint64_t)r->off / bs;
	b1 = ((uint64_t)r->off + (uint64_t)r->len + bs - 1) / bs;
	e = efs_rangelock_take(&r->d->ranges, &r->rl, b0, b1, fa_locked, r);
	if (e == 1)
		fa_locked(r);
}

static void fa_locked(void *arg)
{
	struct dreq *r = arg;
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->off, end = off + (uint64_t)r->len;
	uint64_t p0 = (off + bs - 1) / bs, p1 = end / bs; /* whole blocks */

	if (d->broken || d->dropped) {
		efs_file_dreq_end(r, -EIO);
		return;
	}
	if (r->fmode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
		struct efs_runs buried = {0};
		int e = 0;

		if (p1 > p0)
			e = efs_extmap_punch(d->map, p0, p1 - p0, &buried);
		if (e == 0 && buried.n)
			e = efs_file_bury(d, &buried);
		efs_runs_done(&buried);
		if (e < 0) {
			efs_file_dreq_end(r, e);
			return;
		}
		if (p1 > p0) {
			efs_file_pf_set_blocks(d);
			efs_file_state_changed(d);
		}
		r->phase = 0;
		fa_edges(r);
		return;
	}
	fa_prealloc(r);
}

/* Zeroes the partial blocks at both ends (copy-on-write), one at a time. */
static void fa_edges(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->off, end = off + (uint64_t)r->len;
	uint64_t size = d->in->rec->size;
	struct efs_ext px;
	uint64_t blk;
	int e;

	while (r->phase < 2) {
		int i = r->phase++;

		if (i == 0 && off % bs == 0)
			continue;
		if (i == 1 && (end % bs == 0 || (off / bs == end / bs && off % bs)))
			continue; /* aligned, or the same block as the head (done) */
		blk = i == 0 ? off / bs : end / bs;
		if (blk * bs >= size)
			continue;
		if (efs_extmap_lookup(d->map, blk, 1, &px, 1) != 1 ||
		    (px.flags & EFS_META_EXTENT_F_PREALLOC))
			continue; /* reads as zeroes already */
		r->b0 = blk;
		r->buf = efs_io_buf_alloc(bs);
		if (!r->buf) {
			efs_file_dreq_end(r, -ENOMEM);
			return;
		}
		e = efs_file_read_blocks(d, blk, 1, r->buf, fa_edge_read, r);
		if (e == 1)
			fa_edge_read(r, 0);
		else if (e < 0)
			efs_file_dreq_end(r, e);
		return;
	}
	if (r->fmode & FALLOC_FL_ZERO_RANGE) {
		fa_prealloc(r);
		return;
	}
	fa_finish(r);
}

static void fa_edge_read(void *arg, int err)
{
	struct dreq *r = arg;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->off, end = off + (uint64_t)r->len;
	uint64_t s = r->b0 * bs, zs, ze;
	int e;

	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	zs = off > s ? off - s : 0;
	ze = end < s + bs ? end - s : bs;
	memset(r->buf + zs, 0, ze - zs);
	e = efs_file_write_blocks(r->d, r->b0, 1, r->buf, 0, fa_edge_written, r);
	if (e < 0)
		efs_file_dreq_end(r, e);
}

static void fa_edge_written(void *arg, int err)
{
	struct dreq *r = arg;

	efs_io_buf_free(r->buf);
	r->buf = NULL;
	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	fa_edges(r);
}

static void fa_prealloc_done(void *arg, int err);

/* Maps fresh preallocated blocks into the holes of the range, one hole at a
 * time (r->b0: where to look next). */
static void fa_prealloc_next(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->off, end = off + (uint64_t)r->len;
	uint64_t b1 = (end + bs - 1) / bs;
	bool zr = (r->fmode & FALLOC_FL_ZERO_RANGE) != 0;
	uint64_t lo = zr ? (off + bs - 1) / bs : off / bs, hi = zr ? end / bs : b1;
	int e;

	if (r->b0 < lo)
		r->b0 = lo;
	while (r->b0 < hi) {
		struct efs_ext px;
		uint64_t h0 = r->b0, h1;

		if (efs_extmap_lookup(d->map, h0, hi - h0, &px, 1) > 0 && px.fblk == h0) {
			r->b0 = px.fblk + px.count;
			continue;
		}
		if (efs_extmap_lookup(d->map, h0, hi - h0, &px, 1) > 0)
			h1 = px.fblk;
		else
			h1 = hi;
		if (h1 - h0 > 8192)
			h1 = h0 + 8192; /* bounded steps */
		r->nb = h1 - h0;
		r->b0 = h1;
		e = efs_file_write_blocks(d, h0, h1 - h0, NULL, EFS_META_EXTENT_F_PREALLOC, fa_prealloc_done,
				 r);
		if (e < 0)
			efs_file_dreq_end(r, e);
		return;
	}
	fa_finish(r);
}

static void fa_prealloc_done(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	fa_prealloc_next(r);
}

static void fa_prealloc(struct dreq *r)
{
	r->b0 = 0;
	fa_prealloc_next(r);
}

static void fa_finish(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t end = (uint64_t)r->off + (uint64_t)r->len;
	Etcfs__Inode *rec = d->in->rec;

	if (!(r->fmode & FALLOC_FL_KEEP_SIZE) && end > rec->size)
		efs_file_pf_set_size(d, end);
	if (r->fmode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
		efs_file_pf_set_mctime(d, efs_fs_now());
	else {
		d->pf |= PF_CTIME;
		d->p_ctime = rec->ctime_ns = efs_fs_now();
	}
	efs_file_pf_set_blocks(d);
	efs_file_state_changed(d);
	efs_rangelock_drop(&d->ranges, &r->rl);
	if (r->h && r->h->oflags & O_DSYNC) {
		int e = efs_file_fsync_wait(d, efs_file_fsync_done, r);

		if (e == 1)
			efs_file_fsync_done(r, 0);
		else if (e < 0)
			efs_file_dreq_end(r, e);
		return;
	}
	efs_fs_rq_err(&r->rq, 0);
	efs_file_dreq_end(r, 0);
}

void efs_fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
		      struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = efs_file_fh_of(fi);
	int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
	struct dreq *r;
	int e = efs_file_handle_ok(fs, h);

	if (e == 0 && (mode & ~known))
		e = -EOPNOTSUPP;
	if (e == 0 && (mode & FALLOC_FL_PUNCH_HOLE) &&
	    (!(mode & FALLOC_FL_KEEP_SIZE) || (mode & FALLOC_FL_ZERO_RANGE)))
		e = -EOPNOTSUPP;
	if (e == 0 && (offset < 0 || length <= 0))
		e = -EINVAL;
	if (e == 0 && (uint64_t)offset + (uint64_t)length > (uint64_t)INT64_MAX)
		e = -EFBIG;
	if (e == 0 && !h->writable)
		e = -EBADF;
	if (e == 0 && (!fs->alloc || fs->read_only))
		e = -EROFS;
	r = efs_file_dreq_checked(req, e, RK_FALLOC, EFS_FS_OP_FALLOCATE, ino);
	if (!r)
		return;
	r->h = h;
	r->fmode = mode;
	r->off = offset;
	r->len = length;
	efs_file_prep(r, EFS_LOCK_EXCLUSIVE, falloc_cont);
}


/* ---- copy_file_range ---- */

static void cfr_read_done(void *arg, int err);

/* Phase 0: the source is prepared (shared); phase 1: the destination
 * (exclusive); then steps. */
static void cfr_src_ready(struct dreq *r);
static void cfr_dst_ready(struct dreq *r);

static void cfr_src_ready(struct dreq *r)
{
	r->phase = 1;
	r->ino = r->ino_out;
	efs_file_prep(r, EFS_LOCK_EXCLUSIVE, cfr_dst_ready);
}

static void cfr_dst_ready(struct dreq *r)
{
	r->phase = 2;
	efs_file_cfr_next(r);
}

/* One step: read the next piece of the source, then write it. */
void efs_file_cfr_next(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *src = r->d_in;
	uint64_t bs = fs->blksize, size, off, n, end;
	int e;

	efs_mem_free(r->data);
	r->data = NULL;
	if (r->d->broken || src->broken || !src->in || !src->in->rec) {
		if (r->total)
			efs_fs_rq_write(&r->rq, r->total);
		efs_file_dreq_end(r, r->total ? 0 : -EIO);
		return;
	}
	size = src->in->rec->size;
	off = (uint64_t)r->off_in + r->total;
	if (r->total >= r->size || off >= size || !efs_file_map_valid(fs, src)) {
		efs_fs_rq_write(&r->rq, r->total);
		efs_file_dreq_end(r, 0);
		return;
	}
	n = r->size - r->total;
	if (n > CFR_STEP)
		n = CFR_STEP;
	if (off + n > size)
		n = size - off;
	end = off + n;
	r->wbytes = n;
	r->woff = (off_t)((uint64_t)r->off + r->total);
	r->b0 = off / bs;
	r->nb = (end + bs - 1) / bs - r->b0;
	efs_io_buf_free(r->buf);
	r->buf = efs_io_buf_alloc(r->nb * bs);
	if (!r->buf) {
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	e = efs_file_read_blocks(src, r->b0, r->nb, r->buf, cfr_read_done, r);
	if (e == 1)
		cfr_read_done(r, 0);
	else if (e < 0)
		efs_file_dreq_end(r, e);
}

static void cfr_read_done(void *arg, int err)
{
	struct dreq *r = arg;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->off_in + r->total;

	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	r->data = efs_mem_malloc(r->wbytes);
	if (!r->data) {
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	memcpy(r->data, r->buf + off % bs, r->wbytes);
	r->doff = 0;
	efs_io_buf_free(r->buf);
	r->buf = NULL;
	efs_file_write_step(r);
}

void efs_fs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			    struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			    struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *hi = efs_file_fh_of(fi_in), *ho = efs_file_fh_of(fi_out);
	struct dreq *r;
	int e = efs_file_handle_ok(fs, hi);

	if (e == 0)
		e = efs_file_handle_ok(fs, ho);
	if (e == 0 && flags)
		e = -EINVAL;
	if (e == 0 && (off_in < 0 || off_out < 0))
		e = -EINVAL;
	if (e == 0 && !ho->writable)
		e = -EBADF;
	if (e == 0 && (!fs->alloc || fs->read_only))
		e = -EROFS;
	if (e == 0 && ino_in == ino_out && (uint64_t)off_in < (uint64_t)off_out + len &&
	    (uint64_t)off_out < (uint64_t)off_in + len)
		e = -EINVAL;
	if (e == 0 && ho->append)
		e = -EBADF;
	if (e < 0 || len == 0) {
		efs_fs_reply_write_now(fs, req, EFS_FS_OP_COPY_FILE_RANGE, e);
		return;
	}
	r = efs_file_dreq_new(req, RK_CFR, EFS_FS_OP_COPY_FILE_RANGE, ino_in);
	if (!r)
		return;
	r->h = ho;
	r->ino_in = ino_in;
	r->off_in = off_in;
	r->off = off_out;
	r->size = len;
	r->ino_out = ino_out;
	r->phase = 0;
	/* Phase 0 prepares the source (r->ino) into d_in / lr_in. */
	efs_file_prep(r, EFS_LOCK_SHARED, cfr_src_ready);
}
