/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The file handlers (fs/data.h): open and the open half of create, read,
 * write, fsync, flush, release and lseek.
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
#include "fs/plock.h"

/* ---- open, create ---- */

static void handle_setup(struct efs_fs *fs, struct efs_fs_data *d, struct efs_fs_handle *h,
			 struct fuse_file_info *fi, bool created)
{
	struct hpriv *hp = h->dpriv;
	int acc = fi->flags & O_ACCMODE;
	bool keep;

	h->oflags = fi->flags;
	h->writable = acc == O_WRONLY || acc == O_RDWR;
	h->append = (fi->flags & O_APPEND) != 0;
	/*
	 * A descriptor that created the file and is open for writing only
	 * bypasses the page cache (a direct_io handle), as O_DIRECT does: it
	 * can neither read nor be mapped, and a write through the page cache
	 * costs the kernel a security.capability getxattr round trip before
	 * every write (FUSE never marks an inode S_NOSEC) and splits writes
	 * at page boundaries. Only a new file: a direct write does not make
	 * the kernel remove file capabilities (only set-user-ID, which the
	 * daemon clears), and a new file has none; and only a file no other
	 * descriptor had cached pages of.
	 */
	h->direct = (fi->flags & O_DIRECT) != 0 || (acc == O_WRONLY && created);
	if (hp)
		hp->sid = d->sid;
	if (h->writable) {
		d->writers++;
		d->in->wopens++;
	}
	fi->direct_io = h->direct || h->append;
	/* The page cache is kept only when this node held the lock without a
	 * break since the last open that let the kernel cache: another
	 * node may have written the file during a break. */
	keep = !created && d->cache_ok && efs_fs_grant_current(fs, d->in, d->cache_gen) &&
	       d->cache_epoch == fs->epoch;
	fi->keep_cache = keep ? 1 : 0;
	if (!fi->direct_io) {
		d->cache_ok = true;
		d->cache_gen = efs_fs_grant(fs, d->in);
		d->cache_epoch = fs->epoch;
	}
}

static struct efs_fs_handle *handle_make(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_handle *h = efs_fs_handle_new(fs, ino, false);

	if (!h)
		return NULL;
	h->dpriv = efs_mem_calloc(1, sizeof(struct hpriv));
	if (!h->dpriv) {
		efs_fs_handle_free(fs, h);
		return NULL;
	}
	return h;
}

static void open_finish(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_handle *h;

	h = handle_make(fs, r->ino);
	if (!h) {
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	handle_setup(fs, r->d, h, &r->fi, false);
	r->fi.fh = (uint64_t)(uintptr_t)h;
	/* An open for reading through the page cache is followed by the
	 * read's GETATTR: the lock must not be released (and the kernel's
	 * attributes invalidated) between the two, or that GETATTR's reply
	 * is dropped and the read cuts at a size of an older grant. */
	if (!r->fi.direct_io && (r->fi.flags & O_ACCMODE) != O_WRONLY && r->pinned && r->rq.req)
		efs_fs_readpin_take(fs, &r->lr, r->ino, (uint32_t)fuse_req_ctx(r->rq.req)->pid,
				    r->fi.fh);
	if (efs_fs_rq_open(&r->rq, &r->fi) != 0) {
		efs_fs_readpins_drop(fs, r->ino, 0, r->fi.fh);
		efs_fs_handle_free(fs, h);
	}
	efs_file_dreq_end(r, 0);
}

static void open_oref_cb(void *arg, int status)
{
	struct dreq *r = arg;
	struct efs_fs_inode *in = efs_fs_ifind(r->fs, r->ino);

	if (in && in->opening)
		in->opening--;
	if (status < 0) {
		efs_file_dreq_end(r, status);
		return;
	}
	open_finish(r);
}

/*
 * The open reference first (reclaim.c): an unlink on another node must
 * find it before this open is answered. The request keeps the inode's
 * lock pinned meanwhile, so an unlink, which takes the exclusive lock
 * before it reads the references, sees it. A reference this node already
 * holds (kept past the last close while the inode stays cached) costs
 * nothing.
 */
static void open_cont(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_inode *in = efs_fs_ifind(fs, r->ino);
	int e;

	if (!fs->reclaim_priv || efs_fs_oref_held(fs, in)) {
		open_finish(r);
		return;
	}
	/* The engine's mutex is no longer held: an unlink of this node may
	 * run before the handle exists, and must count this open. */
	if (in)
		in->opening++;
	e = efs_fs_oref_take(fs, r->ino, open_oref_cb, r);
	if (e < 0) {
		if (in && in->opening)
			in->opening--;
		efs_file_dreq_end(r, e == -ENOMEM ? e : -EIO);
	}
}

void efs_fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	int acc = fi->flags & O_ACCMODE;
	bool wr = acc == O_WRONLY || acc == O_RDWR;
	struct dreq *r;

	if (wr && (fs->read_only || !fs->alloc)) {
		efs_fs_reply_now(fs, req, EFS_FS_OP_OPEN, -EROFS);
		return;
	}
	r = efs_file_dreq_new(req, RK_OPEN, EFS_FS_OP_OPEN, ino);
	if (!r)
		return;
	r->fi = *fi;
	/* Always through the engine: its mutex keeps an open from overlapping
	 * an unlink of this node (orphan or delete). */
	r->mode = wr ? EFS_LOCK_EXCLUSIVE : EFS_LOCK_SHARED;
	r->cont = open_cont;
	efs_file_prep_engine(r);
}

int efs_fs_data_open_handle(struct efs_fs *fs, uint64_t ino, struct fuse_file_info *fi,
			    bool created)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct efs_fs_handle *h;
	struct efs_fs_data *d;
	int r;

	if (!in)
		return -EIO;
	d = efs_file_state_get(fs, in);
	if (!d)
		return -ENOMEM;
	if (!efs_file_map_valid(fs, d) && !efs_file_state_dirty(d)) {
		if (!created) {
			efs_file_state_maybe_free(d);
			return -EIO;
		}
		/* A new inode has no extents: its map is empty. */
		efs_extmap_free(d->map);
		d->map = NULL;
		r = efs_extmap_new(&d->map, 0);
		if (r < 0) {
			efs_file_state_maybe_free(d);
			return r;
		}
		d->map_gen = efs_fs_grant(fs, in);
		d->map_epoch = fs->epoch;
	}
	h = handle_make(fs, ino);
	if (!h) {
		efs_file_state_maybe_free(d);
		return -ENOMEM;
	}
	handle_setup(fs, d, h, fi, created);
	fi->fh = (uint64_t)(uintptr_t)h;
	return 0;
}

void efs_fs_data_handle_free(struct efs_fs *fs, struct efs_fs_handle *h)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, h->ino);
	struct hpriv *hp = h->dpriv;
	struct efs_fs_data *d = in ? in->data : NULL;

	if (d && hp && hp->sid == d->sid && h->writable) {
		if (d->writers)
			d->writers--;
		if (!d->writers) {
			efs_io_buf_free(d->tail);
			d->tail = NULL;
			d->tail_ok = false;
		}
	}
	if (in && h->writable && in->wopens)
		in->wopens--;
	efs_mem_free(hp);
	h->dpriv = NULL;
	/* The caller drops the open count next: the last handle frees a
	 * clean, idle state now. */
	if (d && in->opens <= 1 && !efs_file_state_busy(d) && (efs_file_state_idle(d) || d->broken))
		efs_file_state_free(d);
}

/* True when |h| may be used on the current state of its inode. */
int efs_file_handle_ok(struct efs_fs *fs, struct efs_fs_handle *h)
{
	struct efs_fs_inode *in;
	struct hpriv *hp;

	if (!h || efs_fs_handle_check(fs, h) < 0)
		return -EIO;
	in = efs_fs_ifind(fs, h->ino);
	hp = h->dpriv;
	if (!in || !hp || !hp->sid)
		return 0;
	/* The state the handle was opened against was discarded (its
	 * unpublished writes are lost): EIO for the life of the handle, also
	 * once another request detached it and a fresh state replaced it (a
	 * state with open handles is freed only when discarded). */
	if (!in->data || in->data->sid != hp->sid || in->data->broken)
		return -EIO;
	return 0;
}

/* ---- read ---- */

/* On the I/O worker: the bytes are in, the kernel gets them now (libfuse's
 * replies are thread-safe, and |r|'s fields were set before the I/O was
 * submitted). What the loop does after (kernel page note, atime, the end of
 * the request with its lock pin) follows in read_io_done; until then the
 * request counts as in flight, so a recall still waits for it. */
static void read_wreply(void *arg)
{
	struct dreq *r = arg;
	struct dctl *c = efs_file_ctl_of(r->fs);

	if (c->c_wreplies)
		efs_counter_inc(c->c_wreplies);
	efs_fs_rq_buf(&r->rq, (const char *)r->buf + (uint64_t)r->off % r->fs->blksize,
		      r->wbytes);
}

static void read_io_done(void *arg, int err)
{
	struct dreq *r = arg;
	struct efs_fs *fs = r->fs;

	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	if (!efs_fs_rq_replied(&r->rq))
		efs_fs_rq_buf(&r->rq, (const char *)r->buf + (uint64_t)r->off % fs->blksize,
			      r->wbytes);
	if (r->d && r->d->in)
		efs_fs_note_kpages(fs, r->d->in);
	efs_file_dreq_end(r, 0);
}

/*
 * Relatime, written only by an exclusive holder (the read pins the lock, so
 * it is held until the request ends): a pending field that the lock's sync
 * publishes. A reader under a shared lock leaves atime alone. Decided when
 * the read goes out, not when it is answered: the worker may answer it, and
 * a stat after the read must see the new atime.
 */
static void read_atime(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;

	if (!d || !d->in || !d->in->rec || fs->noatime || fs->read_only ||
	    efs_lock_held(fs->lc, r->ino) != EFS_LOCK_EXCLUSIVE ||
	    !efs_fs_atime_due(d->in->rec, efs_fs_now()))
		return;
	d->in->rec->atime_ns = efs_fs_now();
	d->pf |= PF_ATIME;
	d->p_atime = d->in->rec->atime_ns;
	efs_file_state_changed(d);
}

static void read_cont(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;
	uint64_t bs = fs->blksize, size = d->in->rec->size, end;
	int e;

	if (r->off < 0) {
		efs_file_dreq_end(r, -EINVAL);
		return;
	}
	if ((uint64_t)r->off >= size || r->size == 0) {
		efs_fs_rq_buf(&r->rq, NULL, 0);
		efs_file_dreq_end(r, 0);
		return;
	}
	end = (uint64_t)r->off + r->size;
	if (end > size)
		end = size;
	r->wbytes = end - (uint64_t)r->off;
	r->b0 = (uint64_t)r->off / bs;
	r->nb = (end + bs - 1) / bs - r->b0;
	r->buf = efs_io_buf_get(r->nb * bs);
	if (!r->buf) {
		efs_file_dreq_end(r, -ENOMEM);
		return;
	}
	read_atime(r);
	e = efs_file_read_blocks_w(d, r->b0, r->nb, r->buf, read_io_done, read_wreply, r);
	if (e == 1)
		read_io_done(r, 0);
	else if (e < 0)
		efs_file_dreq_end(r, e);
}

void efs_fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		 struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	uint32_t pid = (uint32_t)fuse_req_ctx(req)->pid;
	struct dreq *r;
	int e = efs_file_handle_ok(fs, efs_file_fh_of(fi));

	if (e < 0 || !fs->pool) {
		efs_fs_readpins_drop(fs, ino, pid, 0);
		efs_fs_reply_now(fs, req, EFS_FS_OP_READ, e < 0 ? e : -EIO);
		return;
	}
	r = efs_file_dreq_new(req, RK_READ, EFS_FS_OP_READ, ino);
	if (!r) {
		efs_fs_readpins_drop(fs, ino, pid, 0);
		return;
	}
	r->h = efs_file_fh_of(fi);
	r->size = size;
	r->off = off;
	/* A read may fill the page cache (also on a direct_io handle: a
	 * private mapping faults its pages in through it), with the pages
	 * locked until the reply, which a release's invalidate waits for:
	 * every read passes a drain. */
	r->lock_flags = EFS_LOCK_F_PAGES;
	efs_file_prep(r, EFS_LOCK_SHARED, read_cont);
	/* The READ has pinned the lock by now, under the grant its GETATTR
	 * was answered under, unless a local upgrade drains the lock: then
	 * the GETATTR's pin would only keep the upgrade, which this READ
	 * waits for with its pages locked, from going on. */
	efs_fs_readpins_drop(fs, ino, pid, 0);
}

/* ---- write ---- */

static void write_finish(struct dreq *r);

/* Backpressure: over the hard buffer limits, writes wait for publication. */
static bool bp_over(struct efs_fs *fs, struct efs_fs_data *d)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (d && d->fpend.n && efs_runs_total(&d->fpend) >= WAIT_FPEND_BLOCKS)
		return true;
	if (c->nchunks >= WAIT_NODE_CHUNKS && efs_file_dacct_all(c) >= WAIT_NODE_CHUNKS)
		return true;
	return c->ndirty > WAIT_INODES;
}

static void bp_wait(struct dreq *r)
{
	struct dctl *c = efs_file_ctl_of(r->fs);

	efs_list_add_tail(&c->bp_waiters, &r->bp_link);
	if (r->d)
		r->d->urgent = true;
	efs_file_pub_kick(r->fs);
}

void efs_file_bp_resume(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);
	struct efs_list list, *n;

	/* Only those waiting now: one that waits again runs next time. */
	efs_list_init(&list);
	efs_list_splice_tail(&list, &c->bp_waiters);
	while ((n = efs_list_pop(&list))) {
		struct dreq *r = efs_list_entry(n, struct dreq, bp_link);

		/* Prepared again: the state may have changed meanwhile. */
		r->cont(r);
	}
}

static void wr_written(void *arg, int err);
static void wr_changed(struct dreq *r);
static bool wr_early(const struct dreq *r);
static void write_wreply(void *arg);
static void wr_edges_read(void *arg, int err);

/*
 * The tail block. A writer that appends in pieces that are not
 * block-aligned (tar's 10 KiB records, cp or a log with odd buffer sizes)
 * starts each write inside the block the previous one ended in, whose
 * head it must merge: a device read, as long as the write itself, on
 * every piece. So a write that ends inside a block keeps that block as it
 * wrote it (tail_copy, tail_kept) and the next write that needs it as an edge takes
 * it from there (tail_take). It is good only while nothing changed the
 * file since: every change bumps the state's version (a write, truncate,
 * punch, setattr, atime), and a map loaded under another grant or
 * session has another generation; either makes it unusable.
 */
static bool tail_take(struct efs_fs_data *d, uint64_t blk, uint8_t *buf)
{
	struct dctl *c = efs_file_ctl_of(d->fs);

	if (!d->tail || !d->tail_ok || d->tail_blk != blk || d->tail_ver != d->ver ||
	    d->tail_gen != d->map_gen || d->tail_epoch != d->map_epoch)
		return false;
	memcpy(buf, d->tail, d->fs->blksize);
	if (c->c_tail_hits)
		efs_counter_inc(c->c_tail_hits);
	return true;
}

/* Before r's buffers go: copy its last block if the write ended inside
 * it (true: tail_kept makes it usable once the write's changes are in). */
static bool tail_copy(struct dreq *r, int err)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, end = (uint64_t)r->woff + r->wbytes;

	d->tail_ok = false;
	if (err < 0 || !r->buf || !r->nb || end % bs == 0 || d->dropped || d->broken)
		return false;
	if (!d->tail) {
		d->tail = efs_io_buf_get(bs);
		if (!d->tail)
			return false;
	}
	memcpy(d->tail, r->buf + (r->nb - 1) * bs, bs);
	return true;
}

static void tail_kept(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize;

	d->tail_ok = true;
	d->tail_blk = ((uint64_t)r->woff + r->wbytes - 1) / bs;
	d->tail_ver = d->ver;
	d->tail_gen = d->map_gen;
	d->tail_epoch = d->map_epoch;
}

/* Computes the block range of the current step and fills the buffer. */
static void wr_locked(void *arg)
{
	struct dreq *r = arg;
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;
	uint64_t bs = fs->blksize, size, off, end, head, tailb;
	int pending = 0, e;

	if (d->broken || d->dropped || !d->map || !d->in || !d->in->rec) {
		efs_file_dreq_end(r, -EIO);
		return;
	}
	size = d->in->rec->size;
	if (r->append)
		r->woff = (off_t)size;
	off = (uint64_t)r->woff;
	end = off + r->wbytes;
	r->b0 = off / bs;
	r->nb = (end + bs - 1) / bs - r->b0;
	head = off % bs;
	if (r->wbuf && r->doff == 0 && r->wbytes == r->size && head == r->wbuf_head) {
		/* The whole write where write_buf put it: no copy. */
		r->buf = r->wbuf;
	} else {
		r->buf = efs_io_buf_alloc(r->nb * bs); /* zeroed: as wbuf */
		if (!r->buf) {
			efs_file_dreq_end(r, -ENOMEM);
			return;
		}
		memcpy(r->buf + head, r->data + r->doff, r->wbytes);
	}
	/* Partial blocks: the old bytes around the new ones (zeroes beyond
	 * the size, in holes and in preallocated blocks). */
	if (head && r->b0 * bs < size) {
		r->edge[0] = efs_io_buf_get(bs);
		if (!r->edge[0]) {
			efs_file_dreq_end(r, -ENOMEM);
			return;
		}
	}
	tailb = r->b0 + r->nb - 1;
	if (end % bs && tailb * bs < size && (tailb != r->b0 || !r->edge[0])) {
		r->edge[1] = efs_io_buf_get(bs);
		if (!r->edge[1]) {
			efs_file_dreq_end(r, -ENOMEM);
			return;
		}
	}
	r->err = 0;
	r->phase = 1; /* outstanding edge reads + 1 */
	for (int i = 0; i < 2; i++) {
		if (!r->edge[i] || tail_take(d, i ? tailb : r->b0, r->edge[i]))
			continue;
		r->phase++;
		e = efs_file_read_blocks(d, i ? tailb : r->b0, 1, r->edge[i], wr_edges_read, r);
		if (e == 1) {
			r->phase--;
		} else if (e < 0) {
			r->phase--;
			r->err = e;
		} else {
			pending++;
		}
	}
	(void)pending;
	wr_edges_read(r, 0);
}

static void wr_edges_read(void *arg, int err)
{
	struct dreq *r = arg;
	struct efs_fs *fs = r->fs;
	uint64_t bs = fs->blksize, off = (uint64_t)r->woff, end = off + r->wbytes;
	uint64_t head = off % bs;
	int e;

	if (err < 0 && r->err == 0)
		r->err = err;
	if (--r->phase)
		return;
	if (r->err < 0) {
		efs_file_dreq_end(r, r->err);
		return;
	}
	if (r->edge[0])
		memcpy(r->buf, r->edge[0], head);
	if (end % bs) {
		uint64_t tail = end % bs;
		uint8_t *last = r->buf + (r->nb - 1) * bs;
		const uint8_t *src = r->edge[1] ? r->edge[1] : (r->nb == 1 ? r->edge[0] : NULL);

		if (src)
			memcpy(last + tail, src + tail, bs - tail);
		else
			memset(last + tail, 0, bs - tail);
	}
	if (!r->edge[0] && head)
		memset(r->buf, 0, head);
	r->early = wr_early(r);
	if (r->early && !r->early_attrs) {
		wr_changed(r);
		r->early_attrs = true;
	}
	e = efs_file_write_blocks_w(r->d, r->b0, r->nb, r->buf, 0, wr_written,
				    r->early ? write_wreply : NULL, r);
	if (e < 0)
		wr_written(r, e);
}

/* ---- fdatasync by a device flush alone ---- */

/*
 * fdatasync asks for what reading the data back needs: the blocks and
 * the extents and size that find them, not the times or the mode. A file
 * whose unpublished changes are attributes only (in-place overwrites of
 * blocks it has, which change nothing but the times; a deferred setattr)
 * is answered by the device flush that covers every write completed so
 * far (efs_file_dev_sync, shared with the publications' seal), without a
 * publication; the attributes go with the next one.
 */
static bool datasync_device_only(const struct efs_fs_data *d)
{
	return !d->broken && !d->err && !d->snap && !d->loading && d->apend.n == 0 &&
	       !(d->pf & (PF_SIZE | PF_BLOCKS)) && (!d->map || efs_extmap_ndirty(d->map) == 0);
}

/* 1: answered (or being answered) by a device flush; 0: not eligible. */
/* The device flush covering every write counted so far, then |cb|: at
 * once when nothing was written since the last flush. */
static void dev_sync_then(struct efs_fs *fs, void (*cb)(void *arg, int err), void *arg)
{
	int e = efs_file_dev_sync(fs, cb, arg);

	if (e != 0)
		cb(arg, e < 0 ? e : 0);
}

/* Answers an fsync request by the device flush alone. */
static void fsync_by_flush(struct efs_fs *fs, fuse_req_t req, fuse_ino_t ino)
{
	struct dreq *r = efs_file_dreq_checked(req, 0, RK_FSYNC, EFS_FS_OP_FSYNC, ino);

	if (r)
		dev_sync_then(fs, efs_file_fsync_done, r);
}

static int datasync_start(struct efs_fs *fs, fuse_req_t req, fuse_ino_t ino,
			  struct efs_fs_data *d)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!datasync_device_only(d) || !fs->pool)
		return 0;
	if (c->c_fsyncs)
		efs_counter_inc(c->c_fsyncs);
	fsync_by_flush(fs, req, ino);
	return 1;
}

static void wsync_done(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	write_finish(r);
}


static void wr_complete(struct dreq *r);

static void wr_retry_cb(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		if (r->total)
			wr_complete(r);
		else
			efs_file_dreq_end(r, err);
		return;
	}
	efs_file_write_step(r);
}

/*
 * A write step found no space. Copy-on-write needs the new blocks of an
 * overwrite before the publication frees the old ones, so on a nearly
 * full filesystem one large overwrite can need more than the reserve
 * holds: publish what the inode buried (its frees make room) and retry
 * the step, and once nothing is left to publish, retry it in halves down
 * to one block. Returns true when the request goes on (the block-range
 * lock is dropped); false: the caller fails it.
 */
static bool wr_nospc(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->woff, b0, nb;
	int e;

	if (r->kind != RK_WRITE || d->broken || d->dropped || !d->map)
		return false;
	if (!r->nospc_pub && (efs_file_state_dirty(d) || d->snap)) {
		r->nospc_pub = true;
		efs_rangelock_drop(&d->ranges, &r->rl);
		e = efs_file_fsync_wait(d, wr_retry_cb, r);
		if (e == 1)
			efs_file_write_step(r);
		else if (e < 0)
			wr_retry_cb(r, e);
		return true;
	}
	b0 = off / bs;
	nb = (off + r->wbytes + bs - 1) / bs - b0;
	if (nb <= 1)
		return false;
	r->wbytes = (size_t)((b0 + nb / 2) * bs - off);
	r->nospc_pub = false;
	efs_rangelock_drop(&d->ranges, &r->rl);
	efs_file_write_step(r);
	return true;
}

/* What a write changes besides its bytes: the size, the times, the
 * set-user-ID bit, the state's version, the kernel's pages. */
static void wr_changed(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	Etcfs__Inode *rec = d->in ? d->in->rec : NULL;
	uint64_t end = (uint64_t)r->woff + r->wbytes;

	if (!rec || d->dropped)
		return;
	if (end > rec->size)
		efs_file_pf_set_size(d, end);
	efs_file_pf_set_mctime(d, efs_fs_now());
	/* A write by anyone but root clears set-user-ID, and set-group-ID
	 * when it means setgid (group-executable). */
	if ((rec->mode & S_ISUID) || ((rec->mode & S_ISGID) && (rec->mode & S_IXGRP))) {
		const struct fuse_ctx *ctx = r->rq.req ? fuse_req_ctx(r->rq.req) : NULL;

		if (ctx && ctx->uid != 0) {
			rec->mode &= ~(uint32_t)S_ISUID;
			if (rec->mode & S_IXGRP)
				rec->mode &= ~(uint32_t)S_ISGID;
			d->pf |= PF_MODE;
			d->p_mode = rec->mode;
		}
	}
	efs_file_state_changed(d);
	if (r->h && r->h->direct)
		d->cache_ok = false; /* the kernel's pages may be stale */
}

/*
 * May the I/O worker answer this write step the moment its device write
 * returns (efs_file_write_blocks_w lets it only for an overwrite in place
 * of written blocks in one device write): a whole-block write on a
 * direct_io handle, in one step, inside the size, neither O_SYNC nor
 * O_DSYNC, on a file with no set-user-ID or set-group-ID to clear. Its
 * times and version then change before it goes out (wr_changed), not at
 * the answer: a utimensat or an fdatasync the answer lets through comes
 * to the loop before the write's completion may, and must find them done
 * (the device write itself is counted by the worker, in writes_done).
 */
static bool wr_early(const struct dreq *r)
{
	const struct efs_fs_data *d = r->d;
	const Etcfs__Inode *rec = d->in ? d->in->rec : NULL;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->woff, end = off + r->wbytes;

	return rec && !d->dropped && r->kind == RK_WRITE && !r->sync && r->h && r->h->direct &&
	       !r->append && r->total == 0 && r->wbytes == r->size && off % bs == 0 &&
	       end % bs == 0 && end <= rec->size && !(rec->mode & S_ISUID) &&
	       !((rec->mode & S_ISGID) && (rec->mode & S_IXGRP));
}

/* On the I/O worker: the write is on the device, the kernel hears it now.
 * The loop's completion (wr_written) follows and ends the request, so a
 * recall or a read of the range still waits for it. */
static void write_wreply(void *arg)
{
	struct dreq *r = arg;
	struct dctl *c = efs_file_ctl_of(r->fs);

	if (c->c_wwreplies)
		efs_counter_inc(c->c_wwreplies);
	efs_fs_rq_write(&r->rq, r->wbytes);
}

static void wr_written(void *arg, int err)
{
	struct dreq *r = arg;
	struct efs_fs_data *d = r->d;
	struct efs_fs *fs = r->fs;
	Etcfs__Inode *rec = d->in ? d->in->rec : NULL;
	bool tail = tail_copy(r, err);

	/* The write_buf buffer stays: a retried step copies from it. */
	if (r->buf != r->wbuf)
		efs_io_buf_free(r->buf);
	r->buf = NULL;
	efs_io_buf_free(r->edge[0]);
	efs_io_buf_free(r->edge[1]);
	r->edge[0] = r->edge[1] = NULL;
	if (err == -ENOSPC && wr_nospc(r))
		return;
	if (err < 0) {
		if (r->total && r->kind == RK_WRITE) {
			/* Earlier pieces are written: a short write. */
			efs_rangelock_drop(&d->ranges, &r->rl);
			wr_complete(r);
			return;
		}
		efs_file_dreq_end(r, err);
		return;
	}
	if (rec && !d->dropped) {
		if (!r->early_attrs)
			wr_changed(r);
		if (tail)
			tail_kept(r);
	}
	efs_rangelock_drop(&d->ranges, &r->rl);
	r->total += r->wbytes;
	if (r->kind == RK_WRITE && r->total < r->size) {
		/* A piece of a write split by wr_nospc: the next one, of
		 * the same size at most. */
		r->doff += r->wbytes;
		r->woff += (off_t)r->wbytes;
		if (r->wbytes > r->size - r->total)
			r->wbytes = r->size - r->total;
		r->nospc_pub = false;
		efs_file_write_step(r);
		return;
	}
	wr_complete(r);
	(void)fs;
}

/* The write's bytes are mapped: O_SYNC/O_DSYNC waits for the publication,
 * then the reply. */
static void wr_complete(struct dreq *r)
{
	if (r->sync && r->kind == RK_WRITE) {
		int e;

		/* O_DSYNC (not O_SYNC) after an in-place overwrite: the
		 * device flush alone, as fdatasync. */
		if (r->h && (r->wflags & O_SYNC) != O_SYNC && datasync_device_only(r->d))
			e = efs_file_dev_sync(r->fs, wsync_done, r);
		else
			e = efs_file_fsync_wait(r->d, wsync_done, r);

		if (e < 0)
			efs_file_dreq_end(r, e);
		else if (e == 1)
			write_finish(r);
		return;
	}
	write_finish(r);
}


static void write_finish(struct dreq *r)
{
	if (r->kind == RK_CFR) {
		efs_file_cfr_next(r);
		return;
	}
	if (!efs_fs_rq_replied(&r->rq))
		efs_fs_rq_write(&r->rq, r->total);
	/* A write through the page cache leaves its pages there. (Not
	 * after the worker answered: the handle may be released since.) */
	if (!r->early && r->d && r->d->in && r->h && !r->h->direct)
		efs_fs_note_kpages(r->fs, r->d->in);
	efs_file_dreq_end(r, 0);
}

/* Writes r->wbytes of r->data + r->total at r->woff (or at the end). */
void efs_file_write_step(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;
	uint64_t bs = fs->blksize;
	int e;

	if (bp_over(fs, d)) {
		bp_wait(r);
		return;
	}
	if (r->append)
		e = efs_rangelock_take(&d->ranges, &r->rl, 0, UINT64_MAX, wr_locked, r);
	else
		e = efs_rangelock_take(&d->ranges, &r->rl, (uint64_t)r->woff / bs,
			    ((uint64_t)r->woff + r->wbytes + bs - 1) / bs, wr_locked, r);
	if (e == 1)
		wr_locked(r);
}

static void write_cont(struct dreq *r);

static void caps_killed(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		/* Answered already, with the operation's own error (an
		 * interrupted lock wait: EINTR). */
		efs_file_dreq_end(r, err);
		return;
	}
	efs_file_prep(r, r->mode, write_cont);
}

/*
 * A write removes the file's capabilities (security.capability). The
 * kernel does it before a write through the page cache; on a direct_io
 * handle (O_DIRECT, O_APPEND, a created write-only file) it leaves it to
 * us. Only a record that counts xattrs may have one, and none is there
 * while the grant under which the last look found none is held (a peer's
 * setxattr recalls the lock first; ours resets it). The request gives
 * its pin up while the removal runs (the removal's own acquisition must
 * not wait for a drain behind that pin) and is prepared again after it.
 */
static bool kill_caps_first(struct dreq *r)
{
	const Etcfs__Inode *rec = r->d->in ? r->d->in->rec : NULL;
	int e;

	if (r->caps_done || !r->h || !(r->h->direct || r->h->append) || !rec ||
	    rec->xattr_count == 0 || efs_fs_known_no_caps(r->fs, r->d->in))
		return false;
	r->caps_done = true;
	if (r->pinned) {
		efs_lock_put(r->fs->lc, &r->lr);
		r->pinned = false;
	}
	e = efs_fs_xattr_kill_caps(r->fs, &r->rq, r->ino, caps_killed, r);
	if (e < 0)
		efs_file_dreq_end(r, e);
	return true;
}

static void write_cont(struct dreq *r)
{
	r->cont = write_cont; /* for the backpressure resume */
	if (r->d->broken) {
		efs_file_dreq_end(r, -EIO);
		return;
	}
	if (kill_caps_first(r))
		return;
	efs_file_write_step(r);
}

/*
 * Writes arrive through write_buf: the kernel's bytes are copied once,
 * from libfuse's buffer straight into an aligned block buffer at their
 * offset in the first block, which the device write then uses as it is
 * (partial edge blocks are merged around them in place).
 */
void efs_fs_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
		      struct fuse_file_info *fi)
{
	size_t size = fuse_buf_size(bufv);
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = efs_file_fh_of(fi);
	struct dreq *r;
	int e = efs_file_handle_ok(fs, h);

	if (e == 0 && !h->writable && !fi->writepage)
		e = -EBADF;
	if (e == 0 && (!fs->alloc || fs->read_only))
		e = -EROFS;
	if (e == 0 && off < 0)
		e = -EINVAL;
	if (e == 0 && (uint64_t)off + size > (uint64_t)INT64_MAX)
		e = -EFBIG;
	if (e < 0 || size == 0) {
		efs_fs_reply_write_now(fs, req, EFS_FS_OP_WRITE, e);
		return;
	}
	r = efs_file_dreq_new(req, RK_WRITE, EFS_FS_OP_WRITE, ino);
	if (!r)
		return;
	{
		uint64_t bs = fs->blksize, head = h->append ? 0 : (uint64_t)off % bs;
		struct fuse_bufvec dst = FUSE_BUFVEC_INIT(size);
		ssize_t n;

		/* Zeroed, though every byte of it is written before it goes
		 * out: without the zeroing, 128 KiB sequential writes ran
		 * slower on the VM we measure on, in every alternated pair
		 * (docs/DESIGN.md, on the data path's buffers). */
		r->wbuf = efs_io_buf_alloc((head + size + bs - 1) / bs * bs);
		if (!r->wbuf) {
			efs_file_dreq_end(r, -ENOMEM);
			return;
		}
		r->wbuf_head = head;
		dst.buf[0].mem = r->wbuf + head;
		n = fuse_buf_copy(&dst, bufv, 0);
		if (n != (ssize_t)size) {
			efs_file_dreq_end(r, n < 0 ? (int)n : -EIO);
			return;
		}
		r->data = (char *)r->wbuf + head;
	}
	r->h = h;
	r->size = size;
	r->wbytes = size;
	r->woff = off;
	r->append = h->append;
	/* The write's own flags add RWF_DSYNC / RWF_SYNC (pwritev2), which
	 * on a direct_io handle the kernel leaves to us. */
	r->wflags = h->oflags | fi->flags;
	r->sync = (r->wflags & O_DSYNC) != 0;
	/* The kernel writing its dirty pages back (a shared mapping), which
	 * it also does while a release invalidates them, and a write through
	 * the page cache, whose pages it keeps locked meanwhile: both pass a
	 * drain (lock.h). */
	if (fi->writepage)
		r->lock_flags = EFS_LOCK_F_WRITEBACK;
	else if (!h->direct && !h->append)
		r->lock_flags = EFS_LOCK_F_PAGES;
	efs_file_prep(r, EFS_LOCK_EXCLUSIVE, write_cont);
}

/* ---- fsync ---- */

/* Waits for the publication of d's current version (one more publication
 * of the inode when |clear_err| and it is clean with a latched error: it
 * clears the error). */
static int pub_wait(struct efs_fs_data *d, bool clear_err, void (*cb)(void *arg, int err),
		    void *arg)
{
	bool clean = !efs_file_state_dirty(d) && !d->snap;
	struct fwait *w;

	if (clean && (!clear_err || d->err == 0))
		return 1;
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	if (clean) {
		d->ver++;
		efs_file_dlist_add(d);
	}
	w->ver = d->ver;
	w->cb = cb;
	w->arg = arg;
	efs_list_add_head(&d->fw, &w->link);
	d->urgent = true;
	efs_file_pub_kick(d->fs);
	return 0;
}

int efs_file_publish_wait(struct efs_fs_data *d, void (*cb)(void *arg, int err), void *arg)
{
	return pub_wait(d, false, cb, arg);
}

/* An fsync waiting for a publication, then for the device flush. */
struct fsync_flush {
	struct efs_fs *fs;
	void (*cb)(void *arg, int err);
	void *arg;
};

static void fsync_published(void *arg, int err)
{
	struct fsync_flush w = *(struct fsync_flush *)arg;

	efs_mem_free(arg);
	if (err < 0)
		w.cb(w.arg, err);
	else
		dev_sync_then(w.fs, w.cb, w.arg);
}

/*
 * Waits until d's current version is published and its writes are
 * durable: 1 (already), 0 (|cb| later), or a negative errno.
 *
 * A published version does not prove its writes flushed: a write the
 * worker answers changes the version when it goes out, not when it
 * lands, so the publication that took that version may have flushed the
 * device before the write landed. Once the version is published, the
 * flush that covers every write counted so far follows (it costs nothing
 * when nothing was written since the last one).
 */
int efs_file_fsync_wait(struct efs_fs_data *d, void (*cb)(void *arg, int err), void *arg)
{
	struct fsync_flush *w;
	int e;

	if (!d->fs->pool)
		return pub_wait(d, true, cb, arg);
	w = efs_mem_malloc(sizeof(*w));
	if (!w)
		return -ENOMEM;
	*w = (struct fsync_flush){.fs = d->fs, .cb = cb, .arg = arg};
	e = pub_wait(d, true, fsync_published, w);
	if (e == 0)
		return 0;
	efs_mem_free(w);
	if (e == 1)
		return efs_file_dev_sync(d->fs, cb, arg);
	return e;
}

void efs_file_fsync_done(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		efs_file_dreq_end(r, err);
		return;
	}
	efs_fs_rq_err(&r->rq, 0);
	efs_file_dreq_end(r, 0);
}

static void fsync_cont(struct dreq *r)
{
	struct dctl *c = efs_file_ctl_of(r->fs);
	int e;

	if (c->c_fsyncs)
		efs_counter_inc(c->c_fsyncs);
	e = efs_file_fsync_wait(r->d, efs_file_fsync_done, r);
	if (e == 1)
		efs_file_fsync_done(r, 0);
	else if (e < 0)
		efs_file_dreq_end(r, e);
}

/* An fsync of a file whose create waits in the batch of delegated changes
 * (fs/batch.c): the batch first (its name, and its directories made in the
 * batch too), then the fsync itself. */
struct fsync_after_batch {
	fuse_req_t req;
	fuse_ino_t ino;
	int datasync;
	struct fuse_file_info fi;
};

static void fsync_batch_synced(void *arg, int status)
{
	struct fsync_after_batch w = *(struct fsync_after_batch *)arg;

	efs_mem_free(arg);
	if (status < 0) {
		efs_fs_reply_now(fuse_req_userdata(w.req), w.req, EFS_FS_OP_FSYNC, status);
		return;
	}
	efs_fs_fsync(w.req, w.ino, w.datasync, &w.fi);
}

void efs_fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct dreq *r;
	int e = efs_file_handle_ok(fs, efs_file_fh_of(fi));

	if (e == 0 && in && in->batch_lost) {
		/* Its create or attributes were in a batch of delegated
		 * changes that failed. */
		efs_fs_reply_now(fs, req, EFS_FS_OP_FSYNC, -EIO);
		return;
	}
	if (e == 0 && in && in->batched) {
		struct fsync_after_batch *w = efs_mem_calloc(1, sizeof(*w));
		int b;

		if (!w) {
			efs_fs_reply_now(fs, req, EFS_FS_OP_FSYNC, -ENOMEM);
			return;
		}
		*w = (struct fsync_after_batch){.req = req, .ino = ino, .datasync = datasync,
						.fi = *fi};
		b = efs_fs_batch_sync(fs, fsync_batch_synced, w);
		if (b == 0)
			return;
		efs_mem_free(w);
		if (b < 0) {
			efs_fs_reply_now(fs, req, EFS_FS_OP_FSYNC, b);
			return;
		}
	}

	if (e == 0 && datasync && in && in->data && fs->alloc &&
	    datasync_start(fs, req, ino, in->data))
		return;
	if (e == 0 && (!in || !in->data || !fs->alloc ||
		       (!in->data->broken && !efs_file_state_dirty(in->data) && !in->data->snap &&
			!in->data->err))) {
		/* Nothing of ours to publish; the device flush still, for
		 * writes answered before they were published
		 * (efs_file_fsync_wait). */
		if (fs->pool)
			fsync_by_flush(fs, req, ino);
		else
			efs_fs_reply_now(fs, req, EFS_FS_OP_FSYNC, 0);
		return;
	}
	r = efs_file_dreq_checked(req, e, RK_FSYNC, EFS_FS_OP_FSYNC, ino);
	if (!r)
		return;
	r->h = efs_file_fh_of(fi);
	efs_file_prep(r, EFS_LOCK_SHARED, fsync_cont);
}

/* ---- flush, release ---- */

struct flush_ctx {
	struct efs_fs_rq rq;
};

static void flush_plock_cb(int status, void *arg)
{
	struct flush_ctx *x = arg;

	efs_fs_rq_err(&x->rq, status < 0 ? status : 0);
	efs_mem_free(x);
}

void efs_fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct flush_ctx *x = efs_mem_malloc(sizeof(*x));
	int r;

	if (!x) {
		efs_fs_reply_now(fs, req, EFS_FS_OP_FLUSH, -ENOMEM);
		return;
	}
	efs_fs_rq_start(&x->rq, fs, req, EFS_FS_OP_FLUSH);
	/* A close: the thread's read is over. */
	efs_fs_readpins_drop(fs, ino, (uint32_t)fuse_req_ctx(req)->pid, 0);
	r = efs_fs_plock_flush(fs, ino, fi->lock_owner, flush_plock_cb, x);
	if (r == 0)
		return;
	efs_fs_rq_err(&x->rq, r < 0 ? r : 0);
	efs_mem_free(x);
}

struct rel_ctx {
	struct efs_fs *fs;
	struct efs_fs_rq rq;
	struct efs_fs_handle *h;
	uint64_t ino;
};

static void release_finish(struct rel_ctx *x)
{
	struct efs_fs *fs = x->fs;
	struct efs_fs_handle *h = x->h;
	struct efs_fs_inode *in = efs_fs_ifind(fs, x->ino);
	bool reclaim;

	bool unlinked = in && (in->orphan_seen || (in->rec && !in->gone && in->rec->nlink == 0));
	bool stale = h->epoch != fs->epoch;

	/* Only handles of the current session count: an older one's
	 * reference went with the lost lease. */
	reclaim = unlinked && !stale && efs_fs_live_opens(fs, in) == 1;
	efs_fs_handle_free(fs, h);
	efs_fs_rq_err(&x->rq, 0);
	if (reclaim)
		efs_fs_reclaim(fs, x->ino);
	else if (unlinked && stale)
		efs_fs_reclaim_rescan(fs); /* the orphan may wait for nobody now */
	efs_mem_free(x);
}

static void release_plock_cb(int status, void *arg)
{
	(void)status;
	release_finish(arg);
}

void efs_fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = efs_file_fh_of(fi);
	struct rel_ctx *x;

	if (!h) {
		efs_fs_reply_now(fs, req, EFS_FS_OP_RELEASE, 0);
		return;
	}
	x = efs_mem_calloc(1, sizeof(*x));
	if (!x) {
		/* Release cannot fail: free the handle, no reclaim (fsck's). */
		efs_fs_handle_free(fs, h);
		efs_fs_reply_now(fs, req, EFS_FS_OP_RELEASE, 0);
		return;
	}
	x->fs = fs;
	efs_fs_rq_start(&x->rq, fs, req, EFS_FS_OP_RELEASE);
	efs_fs_readpins_drop(fs, ino, 0, fi->fh);
	x->h = h;
	x->ino = ino;
	if (efs_fs_plock_release(fs, h, fi->flock_release ? fi->lock_owner : 0, release_plock_cb,
				 x) == 0)
		return;
	release_finish(x);
}


/* ---- lseek ---- */

static void lseek_cont(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, size = d->in->rec->size, off = (uint64_t)r->off, res;
	uint64_t blk;

	if (r->off < 0) {
		efs_file_dreq_end(r, -ENXIO);
		return;
	}
	if (off >= size) {
		efs_file_dreq_end(r, -ENXIO);
		return;
	}
	if (r->fmode == SEEK_DATA) {
		if (efs_extmap_seek_data(d->map, off / bs, &blk) < 0) {
			efs_file_dreq_end(r, -ENXIO);
			return;
		}
		res = blk * bs > off ? blk * bs : off;
		if (res >= size) {
			efs_file_dreq_end(r, -ENXIO);
			return;
		}
	} else {
		blk = efs_extmap_seek_hole(d->map, off / bs);
		res = blk * bs > off ? blk * bs : off;
		if (res > size)
			res = size;
	}
	efs_fs_rq_lseek(&r->rq, (off_t)res);
	efs_file_dreq_end(r, 0);
}

void efs_fs_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		  struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct dreq *r;
	int e = efs_file_handle_ok(fs, efs_file_fh_of(fi));

	if (e == 0 && whence != SEEK_DATA && whence != SEEK_HOLE)
		e = -EINVAL; /* the kernel does the others */
	if (e == 0 && !fs->alloc)
		e = -EIO;
	r = efs_file_dreq_checked(req, e, RK_LSEEK, EFS_FS_OP_LSEEK, ino);
	if (!r)
		return;
	r->off = off;
	r->fmode = whence;
	efs_file_prep(r, EFS_LOCK_SHARED, lseek_cont);
}
