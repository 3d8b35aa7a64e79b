/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Block I/O of file data (fs/file/file-int.h): device reads of file blocks,
 * copy-on-write device writes and the map updates that follow them, the
 * burying of replaced blocks, and the run-list helpers they use.
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

/* ---- Device reads ---- */

static void read_end(struct efs_fs *fs, uint64_t ticket)
{
	if (fs->alloc)
		efs_alloc_read_end(fs->alloc, ticket);
}

/* The file blocks [fblk, fblk + n) of a device read or write in flight,
 * on one of its file's lists. */
struct span {
	uint64_t fblk, n;
	struct efs_list link;
};

/* Whether a span on |list| overlaps [fblk, fblk + n). */
static bool spans_overlap(const struct efs_list *list, uint64_t fblk, uint64_t n)
{
	const struct efs_list *l;

	efs_list_for_each(l, list) {
		const struct span *x = efs_list_entry(l, const struct span, link);

		if (x->fblk < fblk + n && fblk < x->fblk + x->n)
			return true;
	}
	return false;
}

struct rb {
	struct efs_fs *fs;
	struct efs_fs_data *d; /* nref held */
	struct span sp;	       /* on d->rds */
	uint64_t ticket;
	size_t pending;
	int err;
	void (*cb)(void *arg, int err);
	void (*wcb)(void *arg); /* worker side, one I/O only */
	void *arg;
	size_t nio;
	struct efs_io io[];
};

/* A read waiting for the in-place overwrites it overlaps (d->rdefer). */
struct rdefer {
	struct efs_list link;
	uint64_t fblk, n;
	uint8_t *buf;
	void (*cb)(void *arg, int err);
	void (*wcb)(void *arg);
	void *arg;
};

static void rb_io_cb(struct efs_io *io, ssize_t res)
{
	struct rb *j = io->arg;
	struct efs_fs_data *d = j->d;

	if (res < 0 && j->err == 0)
		j->err = (int)res;
	else if (res >= 0 && (size_t)res != io->len && j->err == 0)
		j->err = -EIO;
	if (res > 0 && efs_file_ctl_of(j->fs)->c_rbytes)
		efs_counter_add(efs_file_ctl_of(j->fs)->c_rbytes, (uint64_t)res);
	if (--j->pending)
		return;
	efs_list_del(&j->sp.link);
	read_end(j->fs, j->ticket);
	j->cb(j->arg, j->err < 0 ? -EIO : 0);
	efs_mem_free(j);
	d->nref--;
	efs_file_state_maybe_free(d);
}

/* The whole read was one device I/O, and it is done: the buffer is
 * complete (holes were zeroed before it went out). */
static void rb_io_wcb(struct efs_io *io, ssize_t res)
{
	struct rb *j = io->arg;

	if (res >= 0 && (size_t)res == io->len)
		j->wcb(j->arg);
}

int efs_file_read_blocks(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			 void (*cb)(void *arg, int err), void *arg)
{
	return efs_file_read_blocks_w(d, fblk, n, buf, cb, NULL, arg);
}

/* Reads waiting for in-place overwrites of |d|: those no overwrite in
 * flight overlaps any more go out (their callbacks run, as promised,
 * also when the read ends at once). */
static void rdefer_run(struct efs_fs_data *d)
{
	struct efs_list *n, *tmp;

	efs_list_for_each_safe(n, tmp, &d->rdefer) {
		struct rdefer *w = efs_list_entry(n, struct rdefer, link);
		int r;

		if (spans_overlap(&d->ipw, w->fblk, w->n))
			continue;
		efs_list_del(&w->link);
		r = d->broken || d->dropped || !d->map
			    ? -EIO
			    : efs_file_read_blocks_w(d, w->fblk, w->n, w->buf, w->cb, w->wcb, w->arg);
		if (r != 0)
			w->cb(w->arg, r < 0 ? r : 0);
		efs_mem_free(w);
		d->nref--;
	}
}

int efs_file_read_blocks_w(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			   void (*cb)(void *arg, int err), void (*wcb)(void *arg), void *arg)
{
	struct efs_fs *fs = d->fs;
	uint64_t bs = fs->blksize, pos = fblk;
	uint64_t ticket;
	struct efs_ext *px = NULL;
	size_t cnt, nio = 0;
	struct rb *j;
	int r = 0;

	if (spans_overlap(&d->ipw, fblk, n)) {
		/* Blocks being rewritten in place: the read goes out after
		 * them, and sees the new bytes whole. */
		struct rdefer *w = efs_mem_calloc(1, sizeof(*w));

		if (!w)
			return -ENOMEM;
		*w = (struct rdefer){.fblk = fblk, .n = n, .buf = buf, .cb = cb, .wcb = wcb,
				     .arg = arg};
		efs_list_add_tail(&d->rdefer, &w->link);
		d->nref++;
		return 0;
	}
	ticket = fs->alloc ? efs_alloc_read_begin(fs->alloc) : 0;
	cnt = efs_extmap_lookup(d->map, fblk, n, NULL, 0);
	if (cnt) {
		px = efs_mem_malloc(cnt * sizeof(*px));
		if (!px) {
			read_end(fs, ticket);
			return -ENOMEM;
		}
		efs_extmap_lookup(d->map, fblk, n, px, cnt);
	}
	for (size_t i = 0; i < cnt; i++)
		if (!(px[i].flags & EFS_META_EXTENT_F_PREALLOC))
			nio++;
	j = efs_mem_calloc(1, sizeof(*j) + (nio ? nio : 1) * sizeof(j->io[0]));
	if (!j) {
		efs_mem_free(px);
		read_end(fs, ticket);
		return -ENOMEM;
	}
	j->fs = fs;
	j->d = d;
	j->sp.fblk = fblk;
	j->sp.n = n;
	j->ticket = ticket;
	j->cb = cb;
	j->arg = arg;
	nio = 0;
	for (size_t i = 0; i < cnt; i++) {
		const struct efs_ext *x = &px[i];

		if (x->fblk > pos)
			memset(buf + (pos - fblk) * bs, 0, (x->fblk - pos) * bs);
		if (x->flags & EFS_META_EXTENT_F_PREALLOC) {
			memset(buf + (x->fblk - fblk) * bs, 0, x->count * bs);
		} else {
			struct efs_io *io = &j->io[nio++];

			io->op = EFS_IO_READ;
			io->buf = buf + (x->fblk - fblk) * bs;
			io->len = x->count * bs;
			io->off = x->dblk * bs;
			io->cb = rb_io_cb;
			io->arg = j;
		}
		pos = x->fblk + x->count;
	}
	if (pos < fblk + n)
		memset(buf + (pos - fblk) * bs, 0, (fblk + n - pos) * bs);
	efs_mem_free(px);
	if (nio == 0) {
		read_end(fs, ticket);
		efs_mem_free(j);
		return 1;
	}
	j->nio = nio;
	if (wcb && nio == 1) {
		j->wcb = wcb;
		j->io[0].wcb = rb_io_wcb;
	}
	j->pending = 1; /* held while submitting */
	for (size_t i = 0; i < nio; i++) {
		r = efs_iopool_submit(fs->pool, &j->io[i]);
		if (r < 0) {
			j->err = -EIO;
			break;
		}
		j->pending++;
	}
	if (j->pending == 1) {
		/* Nothing went out. */
		read_end(fs, ticket);
		efs_mem_free(j);
		return r < 0 ? -EIO : 1;
	}
	/* Drop the submission hold: never completes inline (callbacks come
	 * from the loop later). */
	j->pending--;
	efs_list_add_tail(&d->rds, &j->sp.link);
	d->nref++;
	return 0;
}

/* ---- Device writes and the map ---- */

/*
 * Buried runs of a change: blocks allocated here and never published go
 * back to the allocator, unless an in-flight publication carries them
 * (then they are published-and-buried: freed by the next publication, or
 * given back if that one fails); published blocks wait in |fpend|.
 */
int efs_file_bury(struct efs_fs_data *d, const struct efs_runs *buried)
{
	struct efs_runs pend = {0}, pub = {0}, unuse = {0};
	int e = 0;

	for (size_t i = 0; i < buried->n && e == 0; i++)
		e = efs_runs_split(&d->apend, buried->v[i].start, buried->v[i].len, &pend, &pub);
	if (e == 0 && pend.n) {
		e = efs_runs_normalize(&pend);
		if (e == 0)
			e = efs_file_pend_reserve(d, &d->apend, pend.n);
		if (e == 0)
			e = efs_runs_remove_all(&d->apend, &pend, NULL);
		for (size_t i = 0; i < pend.n && e == 0; i++) {
			if (d->snap)
				e = efs_runs_split(&d->snap->use, pend.v[i].start, pend.v[i].len, &pub,
					       &unuse);
			else
				e = efs_runs_add(&unuse, pend.v[i].start, pend.v[i].len);
		}
	}
	if (e == 0)
		e = efs_file_pend_reserve(d, &d->fpend, pub.n);
	if (e == 0)
		e = efs_runs_insert_all(&d->fpend, &pub);
	if (e == 0 && unuse.n)
		efs_alloc_unuse(d->fs->alloc, &unuse);
	efs_runs_done(&pend);
	efs_runs_done(&pub);
	efs_runs_done(&unuse);
	if (e < 0)
		efs_log_warn("data: inode %llu: out of memory burying blocks (leaked until restart)",
			     (unsigned long long)d->ino);
	return e;
}

struct wb {
	struct efs_fs_data *d; /* nref held */
	uint64_t fblk, n;
	uint8_t *buf;
	bool inplace;
	uint32_t xflags; /* extent flags of the new mapping (PREALLOC: no I/O) */
	struct efs_runs runs;
	struct efs_ext *px; /* in place: the preallocated pieces */
	size_t npx;
	size_t pending;
	int err;
	void (*cb)(void *arg, int err);
	void (*wcb)(void *arg); /* worker side: see wb_issue */
	void *arg;
	struct efs_io *io;
	size_t nio;
	/* In place over blocks not all preallocated (an overwrite): |sp| on
	 * d->ipw, counted in struct dctl's inplace_inflight. */
	bool ov;
	struct span sp;
};

/* |j| goes out in place over blocks the file maps. */
static void ov_begin(struct wb *j)
{
	struct dctl *c = efs_file_ctl_of(j->d->fs);

	j->ov = true;
	j->sp = (struct span){.fblk = j->fblk, .n = j->n};
	efs_list_add_tail(&j->d->ipw, &j->sp.link);
	c->inplace_inflight++;
	if (c->c_inplace)
		efs_counter_inc(c->c_inplace);
}

/* |j|'s in-place overwrite ended (mapped, or failed): the reads it held
 * back go out. */
static void ov_end(struct wb *j)
{
	struct dctl *c = efs_file_ctl_of(j->d->fs);

	j->ov = false;
	efs_list_del(&j->sp.link);
	c->inplace_inflight--;
	rdefer_run(j->d);
}

/* A drain waiting for the last in-place overwrite ends (called once the
 * write's own completion is done, outside it). */
static void ov_drained(struct dctl *c)
{
	void (*cb)(void *) = c->inplace_drain_cb;

	if (c->inplace_inflight || !cb)
		return;
	c->inplace_drain_cb = NULL;
	cb(c->inplace_drain_arg);
}

static void wb_end(struct wb *j, int err)
{
	struct efs_fs_data *d = j->d;
	struct dctl *c = efs_file_ctl_of(d->fs);
	bool ov = j->ov;

	if (ov)
		ov_end(j);
	j->cb(j->arg, err);
	efs_runs_done(&j->runs);
	efs_mem_free(j->px);
	efs_mem_free(j->io);
	efs_mem_free(j);
	d->nref--;
	efs_file_state_maybe_free(d);
	if (ov)
		ov_drained(c);
}

/* The blocks are on the device: map them. */
static int wb_map(struct wb *j)
{
	struct efs_fs_data *d = j->d;
	struct efs_runs buried = {0};
	uint64_t fpos = j->fblk;
	size_t i;
	int e = 0;

	if (j->inplace) {
		bool pre = false;

		/* An overwrite of written blocks changes no extent. */
		for (size_t k = 0; k < j->npx; k++)
			pre |= (j->px[k].flags & EFS_META_EXTENT_F_PREALLOC) != 0;
		if (!pre)
			return 0;
		e = efs_extmap_clear_flags(d->map, j->fblk, j->n, EFS_META_EXTENT_F_PREALLOC);
		if (e == 0)
			efs_file_state_changed(d);
		return e;
	}
	/* Room first: the pending list then takes every mapped run without
	 * allocating (a mapped run missing from it would be published as
	 * used by nobody, and given back while mapped). */
	e = efs_file_pend_reserve(d, &d->apend, j->runs.n);
	if (e < 0) {
		efs_alloc_unuse(d->fs->alloc, &j->runs);
		j->runs.n = 0;
		return e;
	}
	for (i = 0; i < j->runs.n; i++) {
		struct efs_ext x = {.fblk = fpos, .dblk = j->runs.v[i].start,
				    .count = j->runs.v[i].len, .flags = j->xflags};

		e = efs_extmap_set(d->map, &x, &buried);
		if (e < 0)
			break;
		e = efs_runs_insert(&d->apend, x.dblk, x.count); /* room reserved */
		fpos += x.count;
		if (e < 0) {
			/* Cannot happen (room reserved): the run stays mapped
			 * and is leaked rather than given back while mapped. */
			efs_log_warn("data: inode %llu: mapped blocks not recorded as pending "
				     "(leaked until restart)",
				     (unsigned long long)d->ino);
			i++;
			break;
		}
	}
	if (e < 0) {
		/* Runs before the failure are mapped and pending; the rest
		 * goes back. */
		struct efs_runs rest = {.v = j->runs.v + i, .n = j->runs.n - i, .cap = j->runs.n - i};

		if (rest.n)
			efs_alloc_unuse(d->fs->alloc, &rest);
		j->runs.n = i;
	}
	if (buried.n)
		efs_file_bury(d, &buried);
	efs_runs_done(&buried);
	if (i > 0 && !(j->xflags & EFS_META_EXTENT_F_PREALLOC)) /* no data: nothing to sync */
		efs_file_synchk_mapped(efs_file_ctl_of(d->fs), &j->runs);
	if (i > 0 || e == 0) {
		d->last_dblk = j->runs.n ? j->runs.v[j->runs.n - 1].start +
						   j->runs.v[j->runs.n - 1].len
					 : d->last_dblk;
		efs_file_pf_set_blocks(d);
		efs_file_state_changed(d);
	}
	return e;
}

/* wb_map inside the fault hook's "map" section (efs_file_fault_mem_enter). */
static int wb_apply(struct wb *j)
{
	struct dctl *c = efs_file_ctl_of(j->d->fs);
	int e;

	efs_file_fault_mem_enter(c, EFS_FILE_FAULT_MEM_MAP);
	e = wb_map(j);
	efs_file_fault_mem_leave(c, EFS_FILE_FAULT_MEM_MAP);
	return e;
}

static void wb_finish(struct wb *j);

static void wb_io_cb(struct efs_io *io, ssize_t res)
{
	struct wb *j = io->arg;
	struct dctl *c = efs_file_ctl_of(j->d->fs);

	if (res < 0 && j->err == 0)
		j->err = (int)res;
	else if (res >= 0 && (size_t)res != io->len && j->err == 0)
		j->err = -EIO;
	if (res > 0 && c->c_wbytes)
		efs_counter_add(c->c_wbytes, (uint64_t)res);
	if (--j->pending)
		return;
	wb_finish(j);
}

/* Every I/O of |j| completed: map it (or give its blocks back). */
static void wb_finish(struct wb *j)
{
	if (j->err == 0 && (j->d->broken || j->d->dropped || !j->d->map))
		j->err = j->d->dropped ? 0 : -EIO;
	if (j->err < 0 || j->d->dropped || j->d->broken) {
		if (!j->inplace && j->runs.n && !j->d->broken)
			efs_alloc_unuse(j->d->fs->alloc, &j->runs);
		wb_end(j, j->err < 0 ? -EIO : 0);
		return;
	}
	wb_end(j, wb_apply(j));
}

/*
 * On the I/O worker, as each device write of |j| returns: counted for the
 * device flushes before anything can answer it; and the answer itself,
 * when wb_issue left |j| a worker callback.
 */
static void wb_io_wcb(struct efs_io *io, ssize_t res)
{
	struct wb *j = io->arg;

	atomic_fetch_add(&efs_file_ctl_of(j->d->fs)->writes_done, 1);
	if (j->wcb && res >= 0 && (size_t)res == io->len)
		j->wcb(j->arg);
}

static int wb_issue(struct wb *j)
{
	struct efs_fs *fs = j->d->fs;
	uint64_t bs = fs->blksize, boff = 0;
	int r = 0;

	if (j->xflags & EFS_META_EXTENT_F_PREALLOC) {
		/* Preallocation: nothing to write. */
		r = wb_apply(j);
		wb_end(j, r);
		return 0;
	}
	j->nio = j->inplace ? j->npx : j->runs.n;
	/* The worker may answer only an overwrite in place of written
	 * blocks in one device write: the answer then changes nothing the
	 * loop still has to do before a reader finds the bytes (no extent,
	 * no flag). Copy-on-write blocks are found once mapped, on the loop. */
	if (!j->inplace || j->nio != 1 || (j->px[0].flags & EFS_META_EXTENT_F_PREALLOC))
		j->wcb = NULL;
	j->io = efs_mem_calloc(j->nio, sizeof(*j->io));
	if (!j->io) {
		r = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < j->nio; i++) {
		struct efs_io *io = &j->io[i];

		io->op = EFS_IO_WRITE;
		if (j->inplace) {
			io->buf = j->buf + (j->px[i].fblk - j->fblk) * bs;
			io->len = j->px[i].count * bs;
			io->off = j->px[i].dblk * bs;
		} else {
			io->buf = j->buf + boff * bs;
			io->len = j->runs.v[i].len * bs;
			io->off = j->runs.v[i].start * bs;
			boff += j->runs.v[i].len;
		}
		io->cb = wb_io_cb;
		io->wcb = wb_io_wcb;
		io->arg = j;
	}
	j->pending = 1;
	for (size_t i = 0; i < j->nio; i++) {
		r = efs_iopool_submit(fs->pool, &j->io[i]);
		if (r < 0) {
			j->err = -EIO;
			break;
		}
		j->pending++;
	}
	if (--j->pending == 0) {
		if (!j->inplace)
			efs_alloc_unuse(fs->alloc, &j->runs);
		wb_end(j, -EIO);
	}
	return 0;
fail:
	if (!j->inplace)
		efs_alloc_unuse(fs->alloc, &j->runs);
	wb_end(j, r);
	return 0;
}

static void wb_alloc_cb(int status, void *arg)
{
	struct wb *j = arg;

	if (status < 0) {
		wb_end(j, status);
		return;
	}
	wb_issue(j);
}

/*
 * Copy-on-write: fresh blocks for all of |j| (its in-place pieces
 * dropped). Returns 0 (|j|'s callback runs) or a negative errno (|j| is
 * freed, its callback never runs).
 */
static int wb_cow(struct wb *j)
{
	struct efs_fs_data *d = j->d;
	uint64_t mapped = 0, goal = 0;
	unsigned aflags = 0;
	int r;

	for (size_t i = 0; i < j->npx; i++)
		mapped += j->px[i].count;
	efs_mem_free(j->px);
	j->px = NULL;
	j->npx = 0;
	if (mapped < j->n || (j->xflags & EFS_META_EXTENT_F_PREALLOC))
		aflags |= EFS_ALLOC_NEW;
	if (j->fblk > 0) {
		struct efs_ext prev;

		if (efs_extmap_lookup(d->map, j->fblk - 1, 1, &prev, 1) == 1)
			goal = prev.dblk + 1;
	}
	if (!goal)
		goal = d->last_dblk;
	d->nref++;
	r = efs_alloc_get(d->fs->alloc, j->n, goal, aflags, &j->runs, wb_alloc_cb, j);
	if (r == 1)
		return wb_issue(j);
	if (r == 0)
		return 0;
	d->nref--;
	efs_runs_done(&j->runs);
	efs_mem_free(j);
	return r;
}

/* Some block of |j|'s range holds written data (not only preallocated). */
static bool wb_overwrites(const struct wb *j)
{
	for (size_t i = 0; i < j->npx; i++)
		if (!(j->px[i].flags & EFS_META_EXTENT_F_PREALLOC))
			return true;
	return false;
}

/*
 * May |j| overwrite written blocks in place now: not on a copy-on-write
 * mount, not while a backup stops it, and not while a device read of
 * this node is reading any of them (that read would see them part old,
 * part new; copy-on-write leaves it the old blocks whole).
 */
static bool ov_allowed(const struct wb *j)
{
	struct efs_fs *fs = j->d->fs;

	return !fs->cow && !efs_file_ctl_of(fs)->inplace_stops &&
	       !spans_overlap(&j->d->rds, j->fblk, j->n);
}

/* The lock cache's answer for a write waiting to go in place. */
static void wb_placed(void *arg, bool inplace)
{
	struct wb *j = arg;
	struct efs_fs_data *d = j->d;
	void (*cb)(void *, int) = j->cb;
	void *cb_arg = j->arg;
	bool ov = wb_overwrites(j);
	int r;

	if (inplace && !d->dropped && !d->broken && (!ov || ov_allowed(j))) {
		j->inplace = true;
		if (ov)
			ov_begin(j);
		wb_issue(j); /* takes over the reference the wait held */
		return;
	}
	r = wb_cow(j);
	d->nref--;
	if (r < 0)
		cb(cb_arg, r);
	efs_file_state_maybe_free(d);
}

/*
 * Writes the n blocks of |buf| as file blocks [fblk, fblk + n) of |d|,
 * or maps fresh preallocated blocks there without I/O (|xflags|
 * PREALLOC). In place when the file maps the whole range (written or
 * preallocated blocks) and the lock cache allows it (not after a
 * takeover from a peer whose session ended, during its grace period);
 * an overwrite of written blocks goes in place only as ov_allowed says.
 * Everything else is copy-on-write. A crash during an in-place overwrite
 * may leave its range part old, part new (as on ext4); a copy-on-write
 * mount (-o cow) keeps every overwrite whole or absent. The caller holds
 * the block-range lock and has merged partial edge blocks into |buf|
 * (every block of it is whole). |cb| runs once, later (also on errors:
 * -ENOSPC with nothing written, -EIO), after the map is updated. Returns
 * 0 or a negative errno (|cb| never runs).
 */
int efs_file_write_blocks(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			  uint32_t xflags, void (*cb)(void *arg, int err), void *arg)
{
	return efs_file_write_blocks_w(d, fblk, n, buf, xflags, cb, NULL, arg);
}

int efs_file_write_blocks_w(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			    uint32_t xflags, void (*cb)(void *arg, int err),
			    void (*wcb)(void *arg), void *arg)
{
	struct efs_fs *fs = d->fs;
	struct wb *j;
	size_t cnt;
	uint64_t mapped = 0;
	bool ov;
	int r;

	if (!fs->alloc || !fs->pool)
		return -EROFS;
	j = efs_mem_calloc(1, sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->d = d;
	j->fblk = fblk;
	j->n = n;
	j->buf = buf;
	j->xflags = xflags;
	j->cb = cb;
	j->wcb = wcb;
	j->arg = arg;
	cnt = efs_extmap_lookup(d->map, fblk, n, NULL, 0);
	if (cnt) {
		j->px = efs_mem_malloc(cnt * sizeof(*j->px));
		if (!j->px) {
			efs_mem_free(j);
			return -ENOMEM;
		}
		efs_extmap_lookup(d->map, fblk, n, j->px, cnt);
		j->npx = cnt;
	}
	for (size_t i = 0; i < cnt; i++)
		mapped += j->px[i].count;
	ov = wb_overwrites(j);
	if (mapped == n && !(xflags & EFS_META_EXTENT_F_PREALLOC) && (!ov || ov_allowed(j))) {
		/* In place only while no peer that held the file exclusively
		 * when its session ended may still land a queued write there
		 * (lock.h); while that is being read, the write waits. */
		r = fs->lc ? efs_lock_inplace_check(fs->lc, d->ino, wb_placed, j) : 1;
		if (r == -EINPROGRESS) {
			d->nref++;
			return 0;
		}
		if (r == 1) {
			j->inplace = true;
			if (ov)
				ov_begin(j);
			d->nref++;
			return wb_issue(j);
		}
		if (r < 0) {
			efs_mem_free(j->px);
			efs_mem_free(j);
			return r;
		}
	}
	return wb_cow(j);
}

/* ---- In-place overwrites and backups ---- */

void efs_fs_inplace_stop(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (c)
		c->inplace_stops++;
}

void efs_fs_inplace_allow(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (c && c->inplace_stops)
		c->inplace_stops--;
}

int efs_fs_inplace_drain(struct efs_fs *fs, void (*cb)(void *arg), void *arg)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!c || !c->inplace_inflight)
		return 1;
	if (c->inplace_drain_cb)
		return -EBUSY;
	c->inplace_drain_cb = cb;
	c->inplace_drain_arg = arg;
	return 0;
}
