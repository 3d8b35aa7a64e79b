/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The data path of regular files (fs/data.h): per-inode data states, the
 * file handlers, the publisher and the glue to the allocator, the extent
 * maps and the device pool.
 *
 * Shape (details next to each part):
 *  - struct efs_fs_data (in->data) is created by the first open, create or
 *    request that needs the inode's data. It holds the extent map loaded
 *    from e/<ino> under the inode's lock (valid while the inode's lock_gen
 *    and the fs epoch are those of the load), the runs allocated, written
 *    and mapped but not yet published (|apend|, sorted and merged), the
 *    published runs buried by later writes or punches and not yet freed in
 *    etcd (|fpend|), the record fields changed and not yet published
 *    (|pf| and the p_* values; in->rec is always the merged record), a
 *    version |ver| bumped by every change and the version last published
 *    completely (|ver_pub|: the state is dirty while they differ).
 *  - Every request first makes sure that the node holds the inode's lock
 *    in the mode it needs and that the state is valid ("prepare"): when
 *    the lock is cached, the record trusted and the map valid, it pins the
 *    lock with a cache hit and goes on at once (the fast path); otherwise
 *    an engine operation acquires the lock and loads the record, its build
 *    loads the map when needed, and then hands the request over to the
 *    same continuation.
 *  - Writes go copy-on-write to fresh blocks (in place only into
 *    preallocated extents), under a block-range lock of the state that
 *    serialises overlapping writes, truncates and punches (and with them
 *    partial-block read-merge-write); the map is updated on completion.
 *  - Publication is an engine operation (EFS_FS_OP_PUBLISH), one at a time:
 *    it takes the allocator's map token, fdatasyncs the device, snapshots
 *    the dirty chunks, allocations and frees of up to EFS_LOCK_REQ_MAX
 *    dirty inodes (within etcd's 128 operations) and commits them with
 *    the merged records. Truncates publish their inode in their own
 *    operation with the same code. A publication starts when a full
 *    batch is dirty (KICK_*; counted again when the running one ends, so
 *    batches stay full), on the interval sweep, or when something waits
 *    (fsync, O_SYNC, a buffer limit: those inodes are "urgent"). Writes
 *    wait only at node-wide bounds (dirty chunks, dirty inodes) or when
 *    one inode holds too many buried blocks (WAIT_FPEND_BLOCKS).
 *  - ENOSPC on a write step: the inode's pending frees are published and
 *    the step retried, then retried in halves (a large overwrite needs
 *    its new blocks before the old ones are freed; the reserve may be
 *    smaller than one request); pieces already written give a short
 *    write.
 *  - Known limits: an inode whose changes exceed one transaction is
 *    published in parts whose frees wait for the part that completes its
 *    chunk changes; if it is dropped (unlinked and closed) in between,
 *    those buried blocks stay allocated (fsck reports them). A state whose
 *    publication outcome stays unknown is discarded (its unpublished
 *    allocations are forgotten in memory; they are free in etcd).
 *
 * Everything runs on the loop thread.
 */
#include "fs/data.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "dev/iopool.h"
#include "etcd/kv.h"
#include "alloc/alloc.h"
#include "space/extmap.h"
#include "space/runs.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#if EFS_HAVE_PLOCK
#include "fs/plock.h"
#endif

#if EFS_HAVE_DATAPATH

/* ---- Limits ---- */

/* Operations and compares one publication puts in a transaction (etcd's
 * cap is 128; the rest is margin for estimates). */
#define PUB_BUDGET 120
/* Dirty chunks of one inode that start a publication now (about what one
 * transaction holds with the allocator's contribution). Writes do not wait
 * on one inode's count: an inode with more is published in parts, several
 * transactions back to back (see snap_build). */
#define KICK_CHUNKS 96
/* Dirty chunks of the node (counted on the dirty list) that start a
 * publication now, and beyond which writes wait: the memory bound of the
 * pending extent state. */
#define KICK_NODE_CHUNKS 110
#define WAIT_NODE_CHUNKS 65536
/* Buried blocks of one inode beyond which its writes wait for a complete
 * publication: an inode published in parts frees its buried blocks only
 * with the part that completes it (a crash or a drop in between leaks
 * them), and they are space the filesystem does not have meanwhile. */
#define WAIT_FPEND_BLOCKS 16384
/* Dirty inodes of the node that start a publication now, and beyond which
 * writes wait. */
#define KICK_INODES 4096
#define WAIT_INODES 8192
/* Largest step of copy_file_range. */
#define CFR_STEP (1u << 20)
/* fdatasyncs repeated while writes completed during the previous one. */
#define SYNC_TRIES 3

/* Pending record fields. */
#define PF_SIZE	  0x01u
#define PF_BLOCKS 0x02u
#define PF_MTIME  0x04u
#define PF_CTIME  0x08u
#define PF_ATIME  0x10u
#define PF_MODE	  0x20u
#define PF_UID	  0x40u
#define PF_GID	  0x80u

struct dsnap;
struct dreq;

/* A block-range lock [start, end) of one state. */
struct rlock {
	uint64_t start, end;
	struct rlock *next;
	bool held;
	void (*cb)(void *arg);
	void *arg;
};

/* An fsync (or O_SYNC write) waiting for version |ver| to be published. */
struct fwait {
	struct fwait *next;
	uint64_t ver;
	void (*cb)(void *arg, int err);
	void *arg;
};

/* An engine operation waiting for the map load. */
struct lwait {
	struct lwait *next;
	struct efs_fs_op *op;
};

struct efs_fs_data {
	struct efs_fs *fs;
	struct efs_fs_inode *in; /* ref held */
	uint64_t ino;
	uint64_t sid; /* state id: handles of a discarded state fail */
	struct efs_extmap *map;
	uint64_t map_gen, map_epoch;
	bool loading;
	struct lwait *lw;
	struct efs_runs apend; /* allocated, written, mapped, unpublished */
	struct efs_runs fpend; /* published (or in flight), buried, not freed */
	unsigned pf;
	uint64_t p_size, p_blocks;
	int64_t p_atime, p_mtime, p_ctime;
	uint32_t p_mode, p_uid, p_gid;
	uint64_t ver, ver_pub;
	bool listed; /* on the dirty list */
	size_t nd_acct; /* dirty chunks counted in struct dctl's nchunks */
	bool urgent; /* wanted by an fsync, a buffer limit */
	struct efs_fs_data *dnext, *dprev;
	int err;     /* latched publication error */
	bool broken; /* discarded: requests fail, reloaded on next use */
	bool dropped;
	struct efs_lock_req lr;
	bool pinned, pinning;
	uint32_t writers;
	uint32_t nref; /* requests, writes and snapshots in flight */
	struct rlock *rl_held, *rl_wait;
	struct fwait *fw;
	struct dsnap *snap; /* in-flight publication of this inode */
	uint64_t cache_gen, cache_epoch; /* page cache valid under this hold */
	bool cache_ok;
	uint64_t last_dblk; /* allocation goal */
};

/* The publisher (fs->data_priv). */
struct dctl {
	struct efs_fs *fs;
	uv_timer_t *sweep;
	uv_timer_t *kick;
	struct efs_fs_data *dhead; /* dirty states */
	size_t ndirty;
	size_t nchunks; /* dirty chunks of the listed states (as last counted) */
	struct efs_fs_op *running;
	bool again;
	bool stalled; /* the last publication found nothing it could publish */
	uint64_t sid_seq;
	uint64_t writes_done; /* device writes completed (sync ordering) */
	/* Publications holding completed writes back (not mapped, not
	 * answered) while their last fdatasync runs and they snapshot: what
	 * they publish is then covered by that sync. */
	int hold;
	struct wb *held;
	struct dreq *bp_head, *bp_tail; /* writes waiting on buffer limits */
	void (*sync_cb)(int status, void *arg);
	void *sync_arg;
	int sync_err;
	struct efs_gauge *g_dirty;
	struct efs_counter *c_txns, *c_inodes, *c_fsyncs, *c_wbytes, *c_rbytes;
	struct efs_histogram *h_pub;
};

/* One inode of a publication. */
struct dsnap {
	struct efs_fs_data *d; /* nref held */
	bool included;	       /* in the current attempt */
	bool tried;	       /* in some attempt */
	bool partial;
	uint64_t ver;
	struct efs_extmap_change *ch;
	size_t nch;
	struct efs_runs use, freed;
};

/* op->dpub of a publishing operation (sweep, fsync, truncate). */
struct dpub {
	struct efs_fs *fs;
	struct efs_alloc_txn *t;
	bool synced, syncing;
	int sync_tries;
	bool holding; /* counted in struct dctl's hold */
	bool dev_err; /* the fdatasync or the allocator's begin failed */
	bool left_partial; /* a committed inode was published only in part */
	uint64_t sync_mark;
	struct efs_io sio;
	bool unknown;
	bool committed;
	bool publisher; /* the one sweep operation (struct dctl's running) */
	uint64_t start_ns;
	size_t n;
	struct dsnap s[EFS_LOCK_REQ_MAX];
	struct dreq *trunc; /* truncate: its request */
};

/* ---- Request contexts ---- */

enum rkind {
	RK_OPEN = 0,
	RK_READ,
	RK_WRITE,
	RK_FSYNC,
	RK_FALLOC,
	RK_LSEEK,
	RK_CFR,
	RK_SETATTR,
	RK_NKINDS,
};

struct dreq {
	struct efs_fs *fs;
	fuse_req_t req;
	enum rkind kind;
	enum efs_fs_opcode code;
	uint64_t start_ns;
	bool replied;
	bool handed; /* the prepare operation handed the request over */
	/* Current inode being prepared / worked on. */
	uint64_t ino;
	enum efs_lock_mode mode;
	struct efs_fs_data *d; /* nref held */
	struct efs_fs_handle *h;
	struct efs_lock_req lr;
	bool pinned;
	void (*cont)(struct dreq *r);
	struct dreq *bp_next;
	/* Arguments. */
	size_t size;
	off_t off;
	char *data; /* bytes to write (efs_mem): the caller's copy, a copy step */
	size_t doff; /* offset in |data| of the current step */
	bool append;
	bool sync;
	bool nospc_pub; /* ENOSPC: this step already waited for a publication */
	int fmode; /* fallocate mode, lseek whence, fsync datasync */
	off_t len;
	struct fuse_file_info fi;
	struct stat attr;
	int to_set;
	/* copy_file_range: the source (the destination is the main inode). */
	uint64_t ino_in, ino_out;
	struct efs_fs_data *d_in;
	struct efs_lock_req lr_in;
	bool pinned_in;
	off_t off_in;
	size_t total; /* bytes copied so far */
	int phase;
	/* Work. */
	struct rlock rl;
	uint8_t *buf;	   /* aligned */
	uint8_t *edge[2];  /* partial head/tail blocks (aligned) */
	uint64_t b0, nb;   /* block range */
	size_t wbytes;	   /* bytes of the current write step */
	off_t woff;	   /* offset of the current write step */
	int err;
};

static struct dctl *ctl_of(struct efs_fs *fs)
{
	return fs->data_priv;
}

static struct efs_fs_handle *fh_of(const struct fuse_file_info *fi)
{
	return fi ? (struct efs_fs_handle *)(uintptr_t)fi->fh : NULL;
}

/* Per-handle state: the id of the data state it was opened against. */
struct hpriv {
	uint64_t sid;
};

static void pub_kick(struct efs_fs *fs);
static void state_check_clean(struct efs_fs_data *d);
static void state_maybe_free(struct efs_fs_data *d);

/* ---- Runs helpers ---- */

/* Inserts [start, start + len) into the sorted, merged list |r|, merging
 * with neighbours. 0 or -ENOMEM. */
static int runs_insert(struct efs_runs *r, uint64_t start, uint64_t len)
{
	size_t lo = 0, hi = r->n;

	if (len == 0)
		return 0;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (r->v[mid].start < start)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* lo: first run starting at or after |start|. */
	if (lo > 0 && r->v[lo - 1].start + r->v[lo - 1].len == start) {
		r->v[lo - 1].len += len;
		if (lo < r->n && r->v[lo - 1].start + r->v[lo - 1].len == r->v[lo].start) {
			r->v[lo - 1].len += r->v[lo].len;
			memmove(&r->v[lo], &r->v[lo + 1], (r->n - lo - 1) * sizeof(r->v[0]));
			r->n--;
		}
		return 0;
	}
	if (lo < r->n && start + len == r->v[lo].start) {
		r->v[lo].start = start;
		r->v[lo].len += len;
		return 0;
	}
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 16;
		struct efs_run *v = efs_mem_realloc(r->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		r->v = v;
		r->cap = cap;
	}
	memmove(&r->v[lo + 1], &r->v[lo], (r->n - lo) * sizeof(r->v[0]));
	r->v[lo].start = start;
	r->v[lo].len = len;
	r->n++;
	return 0;
}

static int runs_insert_all(struct efs_runs *r, const struct efs_runs *src)
{
	for (size_t i = 0; i < src->n; i++) {
		int e = runs_insert(r, src->v[i].start, src->v[i].len);

		if (e < 0)
			return e;
	}
	return 0;
}

/* Removes every block of |src| from |r| (normalized); removed blocks go to
 * |cut| when not NULL. */
static int runs_remove_all(struct efs_runs *r, const struct efs_runs *src, struct efs_runs *cut)
{
	for (size_t i = 0; i < src->n && r->n; i++) {
		int e = efs_runs_subtract(r, src->v[i].start, src->v[i].len, cut);

		if (e < 0)
			return e;
	}
	return 0;
}

/*
 * Splits [start, start + len) by the normalized set |set|: the blocks in
 * it are appended to |in|, the others to |out|.
 */
static int runs_split(const struct efs_runs *set, uint64_t start, uint64_t len,
		      struct efs_runs *in, struct efs_runs *out)
{
	uint64_t pos = start, end = start + len;
	size_t lo = 0, hi = set->n;
	int e = 0;

	/* First run that ends after |start|. */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (set->v[mid].start + set->v[mid].len <= start)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < set->n && pos < end && e == 0; i++) {
		uint64_t s = set->v[i].start, t = s + set->v[i].len;

		if (s >= end)
			break;
		if (s > pos) {
			e = efs_runs_add(out, pos, s - pos);
			pos = s;
		}
		if (e == 0) {
			uint64_t stop = t < end ? t : end;

			e = efs_runs_add(in, pos, stop - pos);
			pos = stop;
		}
	}
	if (e == 0 && pos < end)
		e = efs_runs_add(out, pos, end - pos);
	return e;
}

/* ---- Metrics ---- */

static void gauge_dirty(struct dctl *c)
{
	if (c->g_dirty)
		efs_gauge_set(c->g_dirty, (double)c->ndirty);
}

/* ---- States ---- */

static bool state_dirty(const struct efs_fs_data *d)
{
	return d->ver != d->ver_pub;
}

static void dlist_add(struct efs_fs_data *d)
{
	struct dctl *c = ctl_of(d->fs);

	if (d->listed)
		return;
	d->listed = true;
	d->dprev = NULL;
	d->dnext = c->dhead;
	if (c->dhead)
		c->dhead->dprev = d;
	c->dhead = d;
	c->ndirty++;
	gauge_dirty(c);
}

static void dlist_del(struct efs_fs_data *d)
{
	struct dctl *c = ctl_of(d->fs);

	if (!d->listed)
		return;
	d->listed = false;
	if (d->dprev)
		d->dprev->dnext = d->dnext;
	else
		c->dhead = d->dnext;
	if (d->dnext)
		d->dnext->dprev = d->dprev;
	d->dnext = d->dprev = NULL;
	c->ndirty--;
	c->nchunks -= d->nd_acct;
	d->nd_acct = 0;
	gauge_dirty(c);
}

/* Counts d's dirty chunks again in the node's total (listed states only). */
static void dacct(struct efs_fs_data *d)
{
	struct dctl *c = ctl_of(d->fs);
	size_t n = d->listed && d->map ? efs_extmap_ndirty(d->map) : 0;

	c->nchunks = c->nchunks - d->nd_acct + n;
	d->nd_acct = n;
}

/* Recounts the node's total exactly (before writes are made to wait). */
static size_t dacct_all(struct dctl *c)
{
	for (struct efs_fs_data *d = c->dhead; d; d = d->dnext)
		dacct(d);
	return c->nchunks;
}

static void pin_cb(struct efs_lock_req *lr, int status)
{
	struct efs_fs_data *d = lr->arg;

	d->pinning = false;
	if (status == 0) {
		d->pinned = true;
		if (d->broken || d->dropped || (!state_dirty(d) && d->writers == 0)) {
			efs_lock_put(d->fs->lc, &d->lr);
			d->pinned = false;
		}
	}
	d->nref--;
	state_maybe_free(d);
}

/* Pins the exclusive lock for the state (a cache hit when the caller holds
 * it, which every caller does). */
static void state_pin(struct efs_fs_data *d)
{
	int r;

	if (d->pinned || d->pinning || d->broken || d->dropped)
		return;
	memset(&d->lr, 0, sizeof(d->lr));
	d->lr.n = 1;
	d->lr.ino[0] = d->ino;
	d->lr.mode[0] = EFS_LOCK_EXCLUSIVE;
	d->lr.cb = pin_cb;
	d->lr.arg = d;
	r = efs_lock_acquire(d->fs->lc, &d->lr);
	if (r == 1) {
		d->pinned = true;
	} else if (r == 0) {
		d->pinning = true;
		d->nref++;
	} else {
		efs_log_warn("data: inode %llu: cannot pin its lock: %s",
			     (unsigned long long)d->ino, strerror(-r));
	}
}

static void state_unpin(struct efs_fs_data *d)
{
	if (!d->pinned)
		return;
	efs_lock_put(d->fs->lc, &d->lr);
	d->pinned = false;
}

static void fw_fail_all(struct efs_fs_data *d, int err)
{
	struct fwait *w = d->fw;

	d->fw = NULL;
	while (w) {
		struct fwait *n = w->next;

		w->cb(w->arg, err);
		efs_mem_free(w);
		w = n;
	}
}

/* Wakes the waiters whose version is published (ver_pub), or all with
 * |err| when |upto| covers them. */
static void fw_wake(struct efs_fs_data *d, uint64_t upto, int err)
{
	struct fwait **pp = &d->fw, *done = NULL, **dt = &done;

	while (*pp) {
		struct fwait *w = *pp;

		if (w->ver <= upto) {
			*pp = w->next;
			w->next = NULL;
			*dt = w;
			dt = &w->next;
		} else {
			pp = &w->next;
		}
	}
	while (done) {
		struct fwait *n = done->next;

		done->cb(done->arg, err);
		efs_mem_free(done);
		done = n;
	}
}

static void state_free(struct efs_fs_data *d)
{
	struct efs_fs *fs = d->fs;
	struct efs_fs_inode *in = d->in;

	dlist_del(d);
	state_unpin(d);
	efs_extmap_free(d->map);
	efs_runs_done(&d->apend);
	efs_runs_done(&d->fpend);
	if (in && in->data == d)
		in->data = NULL;
	efs_mem_free(d);
	if (in)
		efs_fs_iput(fs, in);
}

/* Frees a state nothing uses: clean (or discarded), no handle, nothing in
 * flight. */
static bool state_busy(const struct efs_fs_data *d)
{
	return d->nref || d->pinning || d->loading || d->rl_held || d->rl_wait || d->snap ||
	       d->fw;
}

/* Clean, without writers, nothing in flight. */
static bool state_idle(const struct efs_fs_data *d)
{
	return !state_busy(d) && !state_dirty(d) && !d->writers;
}

static void state_maybe_free(struct efs_fs_data *d)
{
	if (state_busy(d))
		return;
	if (d->broken || d->dropped || !d->in) {
		state_free(d);
		return;
	}
	if (!state_idle(d) || d->in->opens)
		return;
	state_free(d);
}

/* A clean state without writers gives its lock pin back. */
static void state_check_clean(struct efs_fs_data *d)
{
	if (state_dirty(d))
		return;
	d->urgent = false;
	dlist_del(d);
	if (d->writers == 0)
		state_unpin(d);
}

static struct efs_fs_data *state_get(struct efs_fs *fs, struct efs_fs_inode *in)
{
	struct dctl *c = ctl_of(fs);
	struct efs_fs_data *d = in->data;

	if (d && d->broken) {
		/* Discarded: detach it, a fresh state reloads from etcd. */
		in->data = NULL;
		d->in = NULL;
		efs_fs_iput(fs, in);
		state_maybe_free(d);
		d = NULL;
	}
	if (d)
		return d;
	d = efs_mem_calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->fs = fs;
	d->in = in;
	d->ino = in->ino;
	d->sid = ++c->sid_seq;
	in->refs++;
	in->data = d;
	return d;
}

static bool map_valid(const struct efs_fs *fs, const struct efs_fs_data *d)
{
	return d->map && d->in && d->map_gen == d->in->lock_gen && d->map_epoch == fs->epoch;
}

/* Marks a change: a new version, on the dirty list, limits checked. */
static void state_changed(struct efs_fs_data *d)
{
	struct dctl *c = ctl_of(d->fs);

	d->ver++;
	dlist_add(d);
	dacct(d);
	state_pin(d);
	/* A full batch is ready: publish it (while one runs, its end counts
	 * again: the chunks it carries no longer count then). */
	if ((d->nd_acct >= KICK_CHUNKS || c->ndirty > KICK_INODES ||
	     c->nchunks >= KICK_NODE_CHUNKS) && !c->running)
		pub_kick(d->fs);
}

/* ---- Pending record fields ---- */

static void pf_set_size(struct efs_fs_data *d, uint64_t size)
{
	d->pf |= PF_SIZE;
	d->p_size = size;
	if (d->in && d->in->rec)
		d->in->rec->size = size;
}

static void pf_set_blocks(struct efs_fs_data *d)
{
	uint64_t b = efs_extmap_blocks(d->map) * (d->fs->blksize / 512);

	d->pf |= PF_BLOCKS;
	d->p_blocks = b;
	if (d->in && d->in->rec)
		d->in->rec->blocks = b;
}

static void pf_set_mctime(struct efs_fs_data *d, int64_t now)
{
	d->pf |= PF_MTIME | PF_CTIME;
	d->p_mtime = d->p_ctime = now;
	if (d->in && d->in->rec)
		d->in->rec->mtime_ns = d->in->rec->ctime_ns = now;
}

/* Takes every field of the merged record that |to_set| names. */
static void pf_from_rec(struct efs_fs_data *d, int to_set)
{
	const Etcfs__Inode *rec = d->in->rec;

	if (to_set & FUSE_SET_ATTR_MODE || to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
		d->pf |= PF_MODE;
		d->p_mode = rec->mode;
	}
	if (to_set & FUSE_SET_ATTR_UID) {
		d->pf |= PF_UID;
		d->p_uid = rec->uid;
	}
	if (to_set & FUSE_SET_ATTR_GID) {
		d->pf |= PF_GID;
		d->p_gid = rec->gid;
	}
	if (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_ATIME_NOW)) {
		d->pf |= PF_ATIME;
		d->p_atime = rec->atime_ns;
	}
	if (to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)) {
		d->pf |= PF_MTIME;
		d->p_mtime = rec->mtime_ns;
	}
	if (to_set & FUSE_SET_ATTR_SIZE) {
		d->pf |= PF_SIZE;
		d->p_size = rec->size;
	}
	d->pf |= PF_CTIME;
	d->p_ctime = rec->ctime_ns;
}

void efs_fs_data_apply(struct efs_fs *fs, struct efs_fs_inode *in)
{
	struct efs_fs_data *d = in->data;
	Etcfs__Inode *rec = in->rec;

	(void)fs;
	if (!d || !rec || d->broken || !d->pf)
		return;
	if (d->pf & PF_SIZE)
		rec->size = d->p_size;
	if (d->pf & PF_BLOCKS)
		rec->blocks = d->p_blocks;
	if (d->pf & PF_MTIME)
		rec->mtime_ns = d->p_mtime;
	if (d->pf & PF_CTIME)
		rec->ctime_ns = d->p_ctime;
	if (d->pf & PF_ATIME)
		rec->atime_ns = d->p_atime;
	if (d->pf & PF_MODE)
		rec->mode = (rec->mode & S_IFMT) | (d->p_mode & 07777);
	if (d->pf & PF_UID)
		rec->uid = d->p_uid;
	if (d->pf & PF_GID)
		rec->gid = d->p_gid;
}

bool efs_fs_data_dirty(const struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind((struct efs_fs *)fs, ino);

	return in && in->data && !in->data->broken && state_dirty(in->data);
}

/* ---- Block-range locks ---- */

static bool rl_overlaps(const struct rlock *a, uint64_t s, uint64_t e)
{
	return a->start < e && s < a->end;
}

/* Takes [start, end): 1 now, 0 (|cb| later). Waiters are served in order;
 * a request never passes an earlier overlapping waiter. */
static int rl_take(struct efs_fs_data *d, struct rlock *l, uint64_t start, uint64_t end,
		   void (*cb)(void *arg), void *arg)
{
	l->start = start;
	l->end = end;
	l->cb = cb;
	l->arg = arg;
	l->held = false;
	l->next = NULL;
	for (struct rlock *x = d->rl_held; x; x = x->next)
		if (rl_overlaps(x, start, end))
			goto wait;
	for (struct rlock *x = d->rl_wait; x; x = x->next)
		if (rl_overlaps(x, start, end))
			goto wait;
	l->held = true;
	l->next = d->rl_held;
	d->rl_held = l;
	return 1;
wait: {
	struct rlock **pp = &d->rl_wait;

	while (*pp)
		pp = &(*pp)->next;
	*pp = l;
	return 0;
}
}

static void rl_drop(struct efs_fs_data *d, struct rlock *l)
{
	struct rlock **pp;
	struct rlock *grant = NULL, **gt = &grant;

	if (!l->held)
		return;
	for (pp = &d->rl_held; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	}
	l->held = false;
	l->next = NULL;
	/* Grant, in order, the waiters that overlap neither a holder nor an
	 * earlier waiter that stays; their callbacks run once the lists are
	 * consistent (they may take or drop locks themselves). */
	pp = &d->rl_wait;
	while (*pp) {
		struct rlock *w = *pp;
		bool ok = true;

		for (struct rlock *x = d->rl_held; x && ok; x = x->next)
			if (rl_overlaps(x, w->start, w->end))
				ok = false;
		for (struct rlock *x = d->rl_wait; x != w && ok; x = x->next)
			if (rl_overlaps(x, w->start, w->end))
				ok = false;
		for (struct rlock *x = grant; x && ok; x = x->next)
			if (rl_overlaps(x, w->start, w->end))
				ok = false;
		if (!ok) {
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		w->next = NULL;
		*gt = w;
		gt = &w->next;
	}
	/* Move the granted ones to the held list, then call them. */
	{
		struct rlock *cbs[64];
		size_t n = 0;

		while (grant) {
			struct rlock *w = grant;

			grant = w->next;
			w->held = true;
			w->next = d->rl_held;
			d->rl_held = w;
			if (n < 64) {
				cbs[n++] = w;
			} else {
				/* Not called now: back to waiting (granted later). */
				w->held = false;
				d->rl_held = w->next;
				w->next = d->rl_wait;
				d->rl_wait = w;
			}
		}
		for (size_t i = 0; i < n; i++)
			cbs[i]->cb(cbs[i]->arg);
	}
}

/* ---- Device reads ---- */

static void read_end(struct efs_fs *fs, uint64_t ticket)
{
	if (fs->alloc)
		efs_alloc_read_end(fs->alloc, ticket);
}

struct rb {
	struct efs_fs *fs;
	uint64_t ticket;
	size_t pending;
	int err;
	void (*cb)(void *arg, int err);
	void *arg;
	size_t nio;
	struct efs_io io[];
};

static void rb_io_cb(struct efs_io *io, ssize_t res)
{
	struct rb *j = io->arg;

	if (res < 0 && j->err == 0)
		j->err = (int)res;
	else if (res >= 0 && (size_t)res != io->len && j->err == 0)
		j->err = -EIO;
	if (res > 0 && ctl_of(j->fs)->c_rbytes)
		efs_counter_add(ctl_of(j->fs)->c_rbytes, (uint64_t)res);
	if (--j->pending)
		return;
	read_end(j->fs, j->ticket);
	j->cb(j->arg, j->err < 0 ? -EIO : 0);
	efs_mem_free(j);
}

/*
 * Reads file blocks [fblk, fblk + n) of |d| into |buf| (n blocks, aligned):
 * holes and preallocated extents give zeroes. 1 when done now (no device
 * read), 0 (|cb| later with 0 or -EIO), or a negative errno.
 */
static int read_blocks(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
		       void (*cb)(void *arg, int err), void *arg)
{
	struct efs_fs *fs = d->fs;
	uint64_t bs = fs->blksize, pos = fblk;
	uint64_t ticket = fs->alloc ? efs_alloc_read_begin(fs->alloc) : 0;
	struct efs_ext *px = NULL;
	size_t cnt, nio = 0;
	struct rb *j;
	int r = 0;

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
	return 0;
}

/* ---- Device writes and the map ---- */

/*
 * Buried runs of a change: blocks allocated here and never published go
 * back to the allocator, unless an in-flight publication carries them
 * (then they are published-and-buried: freed by the next publication, or
 * given back if that one fails); published blocks wait in |fpend|.
 */
static int bury(struct efs_fs_data *d, const struct efs_runs *buried)
{
	struct efs_runs pend = {0}, pub = {0}, unuse = {0};
	int e = 0;

	for (size_t i = 0; i < buried->n && e == 0; i++)
		e = runs_split(&d->apend, buried->v[i].start, buried->v[i].len, &pend, &pub);
	if (e == 0 && pend.n) {
		e = efs_runs_normalize(&pend);
		if (e == 0)
			e = runs_remove_all(&d->apend, &pend, NULL);
		for (size_t i = 0; i < pend.n && e == 0; i++) {
			if (d->snap)
				e = runs_split(&d->snap->use, pend.v[i].start, pend.v[i].len, &pub,
					       &unuse);
			else
				e = efs_runs_add(&unuse, pend.v[i].start, pend.v[i].len);
		}
	}
	if (e == 0)
		e = runs_insert_all(&d->fpend, &pub);
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
	void *arg;
	struct efs_io *io;
	size_t nio;
	struct wb *hnext; /* on struct dctl's held list */
};

static void wb_end(struct wb *j, int err)
{
	struct efs_fs_data *d = j->d;

	j->cb(j->arg, err);
	efs_runs_done(&j->runs);
	efs_mem_free(j->px);
	efs_mem_free(j->io);
	efs_mem_free(j);
	d->nref--;
	state_maybe_free(d);
}

/* The blocks are on the device: map them. */
static int wb_apply(struct wb *j)
{
	struct efs_fs_data *d = j->d;
	struct efs_runs buried = {0};
	uint64_t fpos = j->fblk;
	size_t i;
	int e = 0;

	if (j->inplace) {
		e = efs_extmap_clear_flags(d->map, j->fblk, j->n, EFS_META_EXTENT_F_PREALLOC);
		if (e == 0)
			state_changed(d);
		return e;
	}
	for (i = 0; i < j->runs.n && e == 0; i++) {
		struct efs_ext x = {.fblk = fpos, .dblk = j->runs.v[i].start,
				    .count = j->runs.v[i].len, .flags = j->xflags};

		e = efs_extmap_set(d->map, &x, &buried);
		if (e == 0)
			e = runs_insert(&d->apend, x.dblk, x.count);
		fpos += x.count;
	}
	if (e < 0 && i > 0) {
		/* Runs before the failure are mapped; give back the rest. */
		struct efs_runs rest = {0};

		for (size_t k = i; k < j->runs.n; k++)
			efs_runs_add(&rest, j->runs.v[k].start, j->runs.v[k].len);
		efs_alloc_unuse(d->fs->alloc, &rest);
		efs_runs_done(&rest);
		j->runs.n = 0;
	}
	if (buried.n)
		bury(d, &buried);
	efs_runs_done(&buried);
	if (i > 0 || e == 0) {
		d->last_dblk = j->runs.n ? j->runs.v[j->runs.n - 1].start +
						   j->runs.v[j->runs.n - 1].len
					 : d->last_dblk;
		pf_set_blocks(d);
		state_changed(d);
	}
	return e;
}

static void wb_finish(struct wb *j);

/* A publication stops holding writes back: map the held ones (in the
 * order they completed). */
static void wb_release_held(struct dctl *c, struct dpub *P)
{
	struct wb *l = NULL;

	if (!P->holding)
		return;
	P->holding = false;
	if (--c->hold > 0)
		return;
	while (c->held) {
		struct wb *j = c->held;

		c->held = j->hnext;
		j->hnext = l;
		l = j;
	}
	while (l) {
		struct wb *j = l;

		l = j->hnext;
		j->hnext = NULL;
		wb_finish(j);
	}
}

static void wb_io_cb(struct efs_io *io, ssize_t res)
{
	struct wb *j = io->arg;
	struct dctl *c = ctl_of(j->d->fs);

	if (res < 0 && j->err == 0)
		j->err = (int)res;
	else if (res >= 0 && (size_t)res != io->len && j->err == 0)
		j->err = -EIO;
	if (res > 0 && c->c_wbytes)
		efs_counter_add(c->c_wbytes, (uint64_t)res);
	c->writes_done++;
	if (--j->pending)
		return;
	if (c->hold) {
		/* A publication's last fdatasync runs: map it after the
		 * snapshot (wb_release_held). */
		j->hnext = c->held;
		c->held = j;
		return;
	}
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
 * Writes the n blocks of |buf| as file blocks [fblk, fblk + n) of |d|
 * (copy-on-write; in place when the whole range is preallocated), or maps
 * fresh preallocated blocks there without I/O (|xflags| PREALLOC). The
 * caller holds the block-range lock. |cb| runs once, later (also on
 * errors: -ENOSPC with nothing written, -EIO), after the map is updated.
 * Returns 0 or a negative errno (|cb| never runs).
 */
static int write_blocks(struct efs_fs_data *d, uint64_t fblk, uint64_t n, uint8_t *buf,
			uint32_t xflags, void (*cb)(void *arg, int err), void *arg)
{
	struct efs_fs *fs = d->fs;
	struct wb *j;
	size_t cnt;
	uint64_t mapped = 0, goal = 0;
	bool all_prealloc = true;
	unsigned aflags = 0;
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
	for (size_t i = 0; i < cnt; i++) {
		mapped += j->px[i].count;
		if (!(j->px[i].flags & EFS_META_EXTENT_F_PREALLOC))
			all_prealloc = false;
	}
	if (mapped == n && all_prealloc && !(xflags & EFS_META_EXTENT_F_PREALLOC)) {
		j->inplace = true;
		d->nref++;
		return wb_issue(j);
	}
	efs_mem_free(j->px);
	j->px = NULL;
	j->npx = 0;
	if (mapped < n || (xflags & EFS_META_EXTENT_F_PREALLOC))
		aflags |= EFS_ALLOC_NEW;
	if (fblk > 0) {
		struct efs_ext prev;

		if (efs_extmap_lookup(d->map, fblk - 1, 1, &prev, 1) == 1)
			goal = prev.dblk + 1;
	}
	if (!goal)
		goal = d->last_dblk;
	d->nref++;
	r = efs_alloc_get(fs->alloc, n, goal, aflags, &j->runs, wb_alloc_cb, j);
	if (r == 1)
		return wb_issue(j);
	if (r == 0)
		return 0;
	d->nref--;
	efs_runs_done(&j->runs);
	efs_mem_free(j);
	return r;
}

/* ---- Requests ---- */

static struct dreq *dreq_new(fuse_req_t req, enum rkind kind, enum efs_fs_opcode code,
			     uint64_t ino)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct dreq *r = efs_mem_calloc(1, sizeof(*r));

	if (!r) {
		efs_counter_inc(fs->m_ops[code]);
		efs_counter_inc(fs->m_errs[code]);
		fuse_reply_err(req, ENOMEM);
		return NULL;
	}
	r->fs = fs;
	r->req = req;
	r->kind = kind;
	r->code = code;
	r->ino = ino;
	r->start_ns = efs_clock_mono_ns();
	fs->inflight++;
	return r;
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
static void dreq_end(struct dreq *r, int err)
{
	struct efs_fs *fs = r->fs;

	if (!r->replied && r->req) {
		fuse_reply_err(r->req, err < 0 ? -err : EIO);
		r->replied = true;
		if (err == 0)
			err = -EIO;
	}
	if (err < 0)
		efs_counter_inc(fs->m_errs[r->code]);
	efs_histogram_observe_ns(fs->m_lat[r->code], efs_clock_mono_ns() - r->start_ns);
	dreq_unpin(r);
	if (r->rl.held && r->d)
		rl_drop(r->d, &r->rl);
	efs_io_buf_free(r->buf);
	efs_io_buf_free(r->edge[0]);
	efs_io_buf_free(r->edge[1]);
	efs_mem_free(r->data);
	if (r->d) {
		struct efs_fs_data *d = r->d;

		r->d = NULL;
		d->nref--;
		state_maybe_free(d);
	}
	if (r->d_in) {
		struct efs_fs_data *d = r->d_in;

		r->d_in = NULL;
		d->nref--;
		state_maybe_free(d);
	}
	fs->inflight--;
	efs_mem_free(r);
}

/* ---- Map loading ---- */

struct mload {
	struct efs_fs_data *d; /* nref held */
	struct efs_extmap *m;
	uint64_t gen, epoch;
	int err;
};

static int mload_page(const Etcdserverpb__RangeResponse *page, int64_t revision, void *arg)
{
	struct mload *l = arg;
	struct efs_fs *fs = l->d->fs;

	(void)revision;
	for (size_t i = 0; i < page->n_kvs; i++) {
		const Mvccpb__KeyValue *kv = page->kvs[i];
		struct efs_meta_key_info ki;
		Etcfs__ExtentChunk *ch = NULL;
		const char *reason = NULL;
		int r;

		r = efs_meta_key_parse(&fs->ns, kv->key.data, kv->key.len, &ki);
		if (r < 0 || ki.family != EFS_META_K_EXTENT || ki.ino != l->d->ino) {
			efs_log_warn("data: inode %llu: unexpected key in its extent range",
				     (unsigned long long)l->d->ino);
			return -EIO;
		}
		r = efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, &reason);
		if (r < 0) {
			efs_log_warn("data: inode %llu: bad extent chunk %llu: %s",
				     (unsigned long long)l->d->ino, (unsigned long long)ki.num,
				     reason ? reason : "?");
			return -EIO;
		}
		r = efs_extmap_load_chunk(l->m, ki.num, ch);
		efs_meta_record_free(ch);
		if (r < 0) {
			efs_log_warn("data: inode %llu: inconsistent extent chunk %llu (%s)",
				     (unsigned long long)l->d->ino, (unsigned long long)ki.num,
				     strerror(-r));
			return r == -ENOMEM ? r : -EIO;
		}
	}
	return 0;
}

static void mload_done(struct efs_etcd_result *res, Etcdserverpb__RangeResponse *all, void *arg)
{
	struct mload *l = arg;
	struct efs_fs_data *d = l->d;
	struct efs_fs *fs = d->fs;
	struct lwait *w = d->lw;
	int err = res->err ? (res->err == -ENOMEM ? -ENOMEM : -EIO) : 0;

	(void)all;
	d->loading = false;
	d->lw = NULL;
	if (err == 0 && !d->broken && !d->dropped && !state_dirty(d) && l->epoch == fs->epoch) {
		efs_extmap_free(d->map);
		d->map = l->m;
		l->m = NULL;
		d->map_gen = l->gen;
		d->map_epoch = l->epoch;
	} else if (err == 0 && !map_valid(fs, d)) {
		err = -EIO;
	}
	if (res->err)
		efs_log_debug("data: inode %llu: reading extents failed: %s",
			      (unsigned long long)d->ino, res->message ? res->message : "?");
	efs_extmap_free(l->m);
	efs_mem_free(l);
	while (w) {
		struct lwait *n = w->next;

		efs_fs_op_resume_build(w->op, err);
		efs_mem_free(w);
		w = n;
	}
	d->nref--;
	state_maybe_free(d);
}

/* Loads |d|'s map for |op| (which holds the lock): EFS_FS_WAIT (resumed
 * later) or a negative errno. */
static int map_load(struct efs_fs_op *op, struct efs_fs_data *d)
{
	struct efs_fs *fs = d->fs;
	struct efs_etcd_paged_opts po = {0};
	struct efs_meta_range rg;
	struct lwait *w;
	struct mload *l;
	int r;

	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->op = op;
	if (d->loading) {
		w->next = d->lw;
		d->lw = w;
		return EFS_FS_WAIT;
	}
	l = efs_mem_calloc(1, sizeof(*l));
	if (!l) {
		efs_mem_free(w);
		return -ENOMEM;
	}
	r = efs_extmap_new(&l->m, 0);
	if (r == 0)
		r = efs_meta_range_ino(&fs->ns, EFS_META_K_EXTENT, d->ino, &rg);
	if (r < 0) {
		efs_extmap_free(l->m);
		efs_mem_free(l);
		efs_mem_free(w);
		return r;
	}
	l->d = d;
	l->gen = d->in->lock_gen;
	l->epoch = fs->epoch;
	po.range_end = rg.end.buf;
	po.range_end_len = rg.end.len;
	po.page_size = 256;
	r = efs_etcd_range_paged(fs->c, rg.key.buf, rg.key.len, &po, NULL, mload_page, mload_done,
				 l, NULL);
	if (r < 0) {
		efs_extmap_free(l->m);
		efs_mem_free(l);
		efs_mem_free(w);
		return -EIO;
	}
	d->nref++;
	d->loading = true;
	w->next = d->lw;
	d->lw = w;
	return EFS_FS_WAIT;
}

/* ---- Prepare: lock, record and map ---- */

static bool state_ready(struct efs_fs *fs, uint64_t ino, enum efs_lock_mode mode)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct efs_fs_data *d = in ? in->data : NULL;

	if (!d || d->broken || !map_valid(fs, d))
		return false;
	if (!in->rec || in->gone || !efs_fs_inode_valid(fs, in))
		return false;
	return efs_lock_held(fs->lc, ino) >= mode;
}

static void prep_engine(struct dreq *r);

/* The pin of the fast path was not a cache hit: it was cancelled. */
static void fast_pin_cb(struct efs_lock_req *lr, int status)
{
	struct dreq *r = lr->arg;

	if (status == 0) {
		/* Granted before the cancel: newly taken behind the engine's
		 * back, so make the engine reload what it caches. */
		struct efs_fs_inode *in = efs_fs_ifind(r->fs, r->ino);

		if (in) {
			in->lock_gen++;
			in->epoch = 0;
		}
		efs_lock_put(r->fs->lc, lr);
	}
	prep_engine(r);
}

static void prep_go(struct dreq *r)
{
	struct efs_fs_inode *in = efs_fs_ifind(r->fs, r->ino);
	struct efs_fs_data *d = in ? in->data : NULL;
	struct efs_fs_data **slot = r->kind == RK_CFR && r->phase == 0 ? &r->d_in : &r->d;

	if (!d) {
		dreq_end(r, -EIO);
		return;
	}
	if (*slot != d) {
		if (*slot) {
			(*slot)->nref--;
			state_maybe_free(*slot);
		}
		*slot = d;
		d->nref++;
	}
	r->cont(r);
}

/* Pins the lock of r->ino in r->mode (a cache hit), or sends the request
 * through the engine. */
static void prep(struct dreq *r, enum efs_lock_mode mode, void (*cont)(struct dreq *r))
{
	struct efs_fs *fs = r->fs;
	struct efs_lock_req *lr = r->kind == RK_CFR && r->phase == 0 ? &r->lr_in : &r->lr;
	bool *pinned = r->kind == RK_CFR && r->phase == 0 ? &r->pinned_in : &r->pinned;
	int e;

	r->mode = mode;
	r->cont = cont;
	if (!state_ready(fs, r->ino, mode)) {
		prep_engine(r);
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
	lr->cb = fast_pin_cb;
	lr->arg = r;
	e = efs_lock_acquire(fs->lc, lr);
	if (e == 1) {
		*pinned = true;
		efs_counter_inc(fs->m_ops[r->code]);
		prep_go(r);
		return;
	}
	if (e == 0) {
		efs_lock_cancel(fs->lc, lr);
		return;
	}
	prep_engine(r);
}

static int prep_plan(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;
	const Etcfs__Inode *rec;

	if (op->loads_done == 0)
		return efs_fs_want(op, r->ino, r->mode);
	rec = efs_fs_rec(op, r->ino);
	if (!rec)
		return -ENOENT;
	if (S_ISDIR(rec->mode))
		return -EISDIR;
	if (!S_ISREG(rec->mode))
		return -EINVAL;
	return EFS_FS_CONT;
}

static int prep_build(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;
	struct efs_fs *fs = op->fs;
	struct efs_fs_inode *in = efs_fs_ifind(fs, r->ino);
	struct efs_lock_req *lr = r->kind == RK_CFR && r->phase == 0 ? &r->lr_in : &r->lr;
	bool *pinned = r->kind == RK_CFR && r->phase == 0 ? &r->pinned_in : &r->pinned;
	struct efs_fs_data *d;
	int e;

	if (!in || !in->rec)
		return -ENOENT;
	d = state_get(fs, in);
	if (!d)
		return -ENOMEM;
	if (!map_valid(fs, d)) {
		if (state_dirty(d)) {
			/* Dirty without its lock: cannot be (pinned). */
			efs_log_warn("data: inode %llu: dirty state lost its lock",
				     (unsigned long long)r->ino);
			d->broken = true;
			return -EIO;
		}
		return map_load(op, d);
	}
	if (!*pinned) {
		memset(lr, 0, sizeof(*lr));
		lr->n = 1;
		lr->ino[0] = r->ino;
		lr->mode[0] = r->mode;
		lr->cb = fast_pin_cb;
		lr->arg = r;
		e = efs_lock_acquire(fs->lc, lr);
		if (e != 1) {
			/* The operation holds it pinned: always a hit. */
			if (e == 0)
				efs_lock_cancel(fs->lc, lr);
			return -EIO;
		}
		*pinned = true;
	}
	r->handed = true;
	op->replied = true;
	op->priv = NULL; /* the request may end inside its continuation */
	prep_go(r);
	return EFS_FS_DONE;
}

static void prep_free(struct efs_fs_op *op)
{
	struct dreq *r = op->priv;

	op->priv = NULL;
	if (r && !r->handed) {
		/* The engine answered the error (and counted it). */
		r->replied = true;
		dreq_end(r, 0);
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

static void prep_engine(struct dreq *r)
{
	struct efs_fs_op *op = efs_fs_op_new(r->fs, r->req, prep_descs[r->kind]);

	if (!op) {
		dreq_end(r, -ENOMEM);
		return;
	}
	op->ino = r->ino;
	op->priv = r;
	op->priv_free = prep_free;
	r->handed = false;
	efs_fs_op_run(op);
}

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
	h->direct = (fi->flags & O_DIRECT) != 0;
	if (hp)
		hp->sid = d->sid;
	if (h->writable) {
		d->writers++;
		state_pin(d);
	}
	fi->direct_io = h->direct || h->append;
	/* The page cache is kept only when this node held the lock without a
	 * break since the last open that let the kernel cache (7.3). */
	keep = !created && d->cache_ok && d->cache_gen == d->in->lock_gen &&
	       d->cache_epoch == fs->epoch;
	fi->keep_cache = keep ? 1 : 0;
	if (!fi->direct_io) {
		d->cache_ok = true;
		d->cache_gen = d->in->lock_gen;
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

static void open_cont(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_handle *h;

	h = handle_make(fs, r->ino);
	if (!h) {
		dreq_end(r, -ENOMEM);
		return;
	}
	handle_setup(fs, r->d, h, &r->fi, false);
	r->fi.fh = (uint64_t)(uintptr_t)h;
	r->replied = true;
	if (fuse_reply_open(r->req, &r->fi) != 0)
		efs_fs_handle_free(fs, h);
	dreq_end(r, 0);
}

void efs_fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	int acc = fi->flags & O_ACCMODE;
	bool wr = acc == O_WRONLY || acc == O_RDWR;
	struct dreq *r;

	if (wr && (fs->read_only || !fs->alloc)) {
		efs_counter_inc(fs->m_ops[EFS_FS_OP_OPEN]);
		efs_counter_inc(fs->m_errs[EFS_FS_OP_OPEN]);
		fuse_reply_err(req, EROFS);
		return;
	}
	r = dreq_new(req, RK_OPEN, EFS_FS_OP_OPEN, ino);
	if (!r)
		return;
	r->fi = *fi;
	/* Always through the engine: its mutex keeps an open from overlapping
	 * an unlink of this node (orphan or delete). */
	r->mode = wr ? EFS_LOCK_EXCLUSIVE : EFS_LOCK_SHARED;
	r->cont = open_cont;
	prep_engine(r);
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
	d = state_get(fs, in);
	if (!d)
		return -ENOMEM;
	if (!map_valid(fs, d) && !state_dirty(d)) {
		if (!created) {
			state_maybe_free(d);
			return -EIO;
		}
		/* A new inode has no extents: its map is empty. */
		efs_extmap_free(d->map);
		d->map = NULL;
		r = efs_extmap_new(&d->map, 0);
		if (r < 0) {
			state_maybe_free(d);
			return r;
		}
		d->map_gen = in->lock_gen;
		d->map_epoch = fs->epoch;
	}
	h = handle_make(fs, ino);
	if (!h) {
		state_maybe_free(d);
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
		if (d->writers == 0 && !state_dirty(d))
			state_unpin(d);
	}
	efs_mem_free(hp);
	h->dpriv = NULL;
	/* The caller drops the open count next: the last handle frees a
	 * clean, idle state now. */
	if (d && in->opens <= 1 && !state_busy(d) && (state_idle(d) || d->broken))
		state_free(d);
}

/* True when |h| may be used on the current state of its inode. */
static int handle_ok(struct efs_fs *fs, struct efs_fs_handle *h)
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

static void read_io_done(void *arg, int err)
{
	struct dreq *r = arg;
	struct efs_fs *fs = r->fs;
	uint64_t bs = fs->blksize;

	if (err < 0) {
		dreq_end(r, err);
		return;
	}
	r->replied = true;
	fuse_reply_buf(r->req, (const char *)r->buf + (uint64_t)r->off % bs, r->wbytes);
	if (r->d && r->d->in && r->d->in->rec) {
		struct efs_fs_data *d = r->d;

		if (!fs->noatime && !fs->read_only && d->pinned &&
		    efs_fs_atime_due(d->in->rec, efs_fs_now())) {
			/* Under our pinned exclusive lock: a pending field. */
			d->in->rec->atime_ns = efs_fs_now();
			d->pf |= PF_ATIME;
			d->p_atime = d->in->rec->atime_ns;
			state_changed(d);
		} else if (!d->pinned) {
			efs_fs_touch_atime(fs, r->ino, d->in->rec);
		}
	}
	dreq_end(r, 0);
}

static void read_cont(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;
	uint64_t bs = fs->blksize, size = d->in->rec->size, end;
	int e;

	if (r->off < 0) {
		dreq_end(r, -EINVAL);
		return;
	}
	if ((uint64_t)r->off >= size || r->size == 0) {
		r->replied = true;
		fuse_reply_buf(r->req, NULL, 0);
		dreq_end(r, 0);
		return;
	}
	end = (uint64_t)r->off + r->size;
	if (end > size)
		end = size;
	r->wbytes = end - (uint64_t)r->off;
	r->b0 = (uint64_t)r->off / bs;
	r->nb = (end + bs - 1) / bs - r->b0;
	r->buf = efs_io_buf_alloc(r->nb * bs);
	if (!r->buf) {
		dreq_end(r, -ENOMEM);
		return;
	}
	e = read_blocks(d, r->b0, r->nb, r->buf, read_io_done, r);
	if (e == 1)
		read_io_done(r, 0);
	else if (e < 0)
		dreq_end(r, e);
}

void efs_fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		 struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct dreq *r;
	int e = handle_ok(fs, fh_of(fi));

	if (e < 0 || !fs->pool) {
		efs_counter_inc(fs->m_ops[EFS_FS_OP_READ]);
		efs_counter_inc(fs->m_errs[EFS_FS_OP_READ]);
		fuse_reply_err(req, e < 0 ? -e : EIO);
		return;
	}
	r = dreq_new(req, RK_READ, EFS_FS_OP_READ, ino);
	if (!r)
		return;
	r->h = fh_of(fi);
	r->size = size;
	r->off = off;
	prep(r, EFS_LOCK_SHARED, read_cont);
}

/* ---- write ---- */

static void write_finish(struct dreq *r);

/* Backpressure: over the hard buffer limits, writes wait for publication. */
static bool bp_over(struct efs_fs *fs, struct efs_fs_data *d)
{
	struct dctl *c = ctl_of(fs);

	if (d && d->fpend.n && efs_runs_total(&d->fpend) >= WAIT_FPEND_BLOCKS)
		return true;
	if (c->nchunks >= WAIT_NODE_CHUNKS && dacct_all(c) >= WAIT_NODE_CHUNKS)
		return true;
	return c->ndirty > WAIT_INODES;
}

static void bp_wait(struct dreq *r)
{
	struct dctl *c = ctl_of(r->fs);

	r->bp_next = NULL;
	if (c->bp_tail)
		c->bp_tail->bp_next = r;
	else
		c->bp_head = r;
	c->bp_tail = r;
	if (r->d)
		r->d->urgent = true;
	pub_kick(r->fs);
}

static void bp_resume(struct efs_fs *fs)
{
	struct dctl *c = ctl_of(fs);
	struct dreq *list = c->bp_head;

	c->bp_head = c->bp_tail = NULL;
	while (list) {
		struct dreq *r = list;

		list = r->bp_next;
		r->bp_next = NULL;
		/* Prepared again: the state may have changed meanwhile. */
		r->cont(r);
	}
}

static void wr_written(void *arg, int err);
static void wr_edges_read(void *arg, int err);

/* Computes the block range of the current step and fills the buffer. */
static void wr_locked(void *arg)
{
	struct dreq *r = arg;
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *d = r->d;
	uint64_t bs = fs->blksize, size, off, end, head, tailb;
	int pending = 0, e;

	if (d->broken || d->dropped || !d->map || !d->in || !d->in->rec) {
		dreq_end(r, -EIO);
		return;
	}
	size = d->in->rec->size;
	if (r->append)
		r->woff = (off_t)size;
	off = (uint64_t)r->woff;
	end = off + r->wbytes;
	r->b0 = off / bs;
	r->nb = (end + bs - 1) / bs - r->b0;
	r->buf = efs_io_buf_alloc(r->nb * bs);
	if (!r->buf) {
		dreq_end(r, -ENOMEM);
		return;
	}
	head = off % bs;
	memcpy(r->buf + head, r->data + r->doff, r->wbytes);
	/* Partial blocks: the old bytes around the new ones (zeroes beyond
	 * the size, in holes and in preallocated blocks). */
	if (head && r->b0 * bs < size) {
		r->edge[0] = efs_io_buf_alloc(bs);
		if (!r->edge[0]) {
			dreq_end(r, -ENOMEM);
			return;
		}
	}
	tailb = r->b0 + r->nb - 1;
	if (end % bs && tailb * bs < size && (tailb != r->b0 || !r->edge[0])) {
		r->edge[1] = efs_io_buf_alloc(bs);
		if (!r->edge[1]) {
			dreq_end(r, -ENOMEM);
			return;
		}
	}
	r->err = 0;
	r->phase = 1; /* outstanding edge reads + 1 */
	for (int i = 0; i < 2; i++) {
		if (!r->edge[i])
			continue;
		r->phase++;
		e = read_blocks(d, i ? tailb : r->b0, 1, r->edge[i], wr_edges_read, r);
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
		dreq_end(r, r->err);
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
	e = write_blocks(r->d, r->b0, r->nb, r->buf, 0, wr_written, r);
	if (e < 0)
		wr_written(r, e);
}

static void wsync_done(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		dreq_end(r, err);
		return;
	}
	write_finish(r);
}

static int fsync_wait(struct efs_fs_data *d, void (*cb)(void *arg, int err), void *arg);

static void write_step(struct dreq *r);
static void wr_complete(struct dreq *r);

static void wr_retry_cb(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		if (r->total)
			wr_complete(r);
		else
			dreq_end(r, err);
		return;
	}
	write_step(r);
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
	if (!r->nospc_pub && (state_dirty(d) || d->snap)) {
		r->nospc_pub = true;
		rl_drop(d, &r->rl);
		e = fsync_wait(d, wr_retry_cb, r);
		if (e == 1)
			write_step(r);
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
	rl_drop(d, &r->rl);
	write_step(r);
	return true;
}

static void wr_written(void *arg, int err)
{
	struct dreq *r = arg;
	struct efs_fs_data *d = r->d;
	struct efs_fs *fs = r->fs;
	uint64_t end = (uint64_t)r->woff + r->wbytes;
	Etcfs__Inode *rec = d->in ? d->in->rec : NULL;

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
			rl_drop(d, &r->rl);
			wr_complete(r);
			return;
		}
		dreq_end(r, err);
		return;
	}
	if (rec && !d->dropped) {
		if (end > rec->size)
			pf_set_size(d, end);
		pf_set_mctime(d, efs_fs_now());
		/* A write by anyone but root clears set-user-ID, and
		 * set-group-ID when it means setgid (group-executable). */
		if ((rec->mode & S_ISUID) || ((rec->mode & S_ISGID) && (rec->mode & S_IXGRP))) {
			const struct fuse_ctx *ctx = r->req ? fuse_req_ctx(r->req) : NULL;

			if (ctx && ctx->uid != 0) {
				rec->mode &= ~(uint32_t)S_ISUID;
				if (rec->mode & S_IXGRP)
					rec->mode &= ~(uint32_t)S_ISGID;
				d->pf |= PF_MODE;
				d->p_mode = rec->mode;
			}
		}
		state_changed(d);
		if (r->h && r->h->direct)
			d->cache_ok = false; /* the kernel's pages may be stale */
	}
	rl_drop(d, &r->rl);
	r->total += r->wbytes;
	if (r->kind == RK_WRITE && r->total < r->size) {
		/* A piece of a write split by wr_nospc: the next one, of
		 * the same size at most. */
		r->doff += r->wbytes;
		r->woff += (off_t)r->wbytes;
		if (r->wbytes > r->size - r->total)
			r->wbytes = r->size - r->total;
		r->nospc_pub = false;
		write_step(r);
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
		int e = fsync_wait(r->d, wsync_done, r);

		if (e < 0)
			dreq_end(r, e);
		else if (e == 1)
			write_finish(r);
		return;
	}
	write_finish(r);
}

static void cfr_next(struct dreq *r);

static void write_finish(struct dreq *r)
{
	if (r->kind == RK_CFR) {
		cfr_next(r);
		return;
	}
	r->replied = true;
	fuse_reply_write(r->req, r->total);
	dreq_end(r, 0);
}

/* Writes r->wbytes of r->data + r->total at r->woff (or at the end). */
static void write_step(struct dreq *r)
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
		e = rl_take(d, &r->rl, 0, UINT64_MAX, wr_locked, r);
	else
		e = rl_take(d, &r->rl, (uint64_t)r->woff / bs,
			    ((uint64_t)r->woff + r->wbytes + bs - 1) / bs, wr_locked, r);
	if (e == 1)
		wr_locked(r);
}

static void write_cont(struct dreq *r)
{
	r->cont = write_cont; /* for the backpressure resume */
	if (r->d->broken) {
		dreq_end(r, -EIO);
		return;
	}
	write_step(r);
}

void efs_fs_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		  struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = fh_of(fi);
	struct dreq *r;
	int e = handle_ok(fs, h);

	if (e == 0 && !h->writable && !fi->writepage)
		e = -EBADF;
	if (e == 0 && (!fs->alloc || fs->read_only))
		e = -EROFS;
	if (e == 0 && off < 0)
		e = -EINVAL;
	if (e == 0 && (uint64_t)off + size > (uint64_t)INT64_MAX)
		e = -EFBIG;
	if (e < 0 || size == 0) {
		efs_counter_inc(fs->m_ops[EFS_FS_OP_WRITE]);
		if (e < 0) {
			efs_counter_inc(fs->m_errs[EFS_FS_OP_WRITE]);
			fuse_reply_err(req, -e);
		} else {
			fuse_reply_write(req, 0);
		}
		return;
	}
	r = dreq_new(req, RK_WRITE, EFS_FS_OP_WRITE, ino);
	if (!r)
		return;
	r->data = efs_mem_malloc(size);
	if (!r->data) {
		dreq_end(r, -ENOMEM);
		return;
	}
	memcpy(r->data, buf, size);
	r->h = h;
	r->size = size;
	r->wbytes = size;
	r->woff = off;
	r->append = h->append;
	r->sync = (h->oflags & O_DSYNC) != 0;
	prep(r, EFS_LOCK_EXCLUSIVE, write_cont);
}

/* ---- fsync ---- */

/* Waits until d's current version is published: 1 (already), 0 (|cb|
 * later), or a negative errno. */
static int fsync_wait(struct efs_fs_data *d, void (*cb)(void *arg, int err), void *arg)
{
	struct fwait *w;

	if (!state_dirty(d) && !d->snap && d->err == 0)
		return 1;
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->ver = d->ver;
	w->cb = cb;
	w->arg = arg;
	w->next = d->fw;
	d->fw = w;
	if (!state_dirty(d) && !d->snap) {
		/* Clean but with a latched error: one more publication of the
		 * inode (with nothing new) clears it. */
		d->ver++;
		w->ver = d->ver;
		dlist_add(d);
	}
	d->urgent = true;
	pub_kick(d->fs);
	return 0;
}

static void fsync_done(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		dreq_end(r, err);
		return;
	}
	r->replied = true;
	fuse_reply_err(r->req, 0);
	dreq_end(r, 0);
}

static void fsync_cont(struct dreq *r)
{
	struct dctl *c = ctl_of(r->fs);
	int e;

	if (c->c_fsyncs)
		efs_counter_inc(c->c_fsyncs);
	e = fsync_wait(r->d, fsync_done, r);
	if (e == 1)
		fsync_done(r, 0);
	else if (e < 0)
		dreq_end(r, e);
}

void efs_fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct dreq *r;
	int e = handle_ok(fs, fh_of(fi));

	(void)datasync;
	if (e == 0 && (!in || !in->data || !fs->alloc ||
		       (!in->data->broken && !state_dirty(in->data) && !in->data->snap &&
			!in->data->err))) {
		/* Nothing of ours to publish. */
		efs_counter_inc(fs->m_ops[EFS_FS_OP_FSYNC]);
		fuse_reply_err(req, 0);
		return;
	}
	if (e < 0) {
		efs_counter_inc(fs->m_ops[EFS_FS_OP_FSYNC]);
		efs_counter_inc(fs->m_errs[EFS_FS_OP_FSYNC]);
		fuse_reply_err(req, -e);
		return;
	}
	r = dreq_new(req, RK_FSYNC, EFS_FS_OP_FSYNC, ino);
	if (!r)
		return;
	r->h = fh_of(fi);
	/* A dirty state holds its exclusive lock pinned: the fast path. */
	prep(r, EFS_LOCK_SHARED, fsync_cont);
}

/* ---- flush, release ---- */

#if EFS_HAVE_PLOCK
static void flush_plock_cb(int status, void *arg)
{
	fuse_req_t req = arg;

	fuse_reply_err(req, status < 0 ? -status : 0);
}
#endif

void efs_fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);

	efs_counter_inc(fs->m_ops[EFS_FS_OP_FLUSH]);
#if EFS_HAVE_PLOCK
	{
		int r = efs_fs_plock_flush(fs, ino, fi->lock_owner, flush_plock_cb, req);

		if (r == 0)
			return;
		if (r < 0) {
			efs_counter_inc(fs->m_errs[EFS_FS_OP_FLUSH]);
			fuse_reply_err(req, -r);
			return;
		}
	}
#else
	(void)ino;
	(void)fi;
#endif
	fuse_reply_err(req, 0);
}

struct rel_ctx {
	struct efs_fs *fs;
	fuse_req_t req;
	struct efs_fs_handle *h;
	uint64_t ino;
};

static void release_finish(struct rel_ctx *x)
{
	struct efs_fs *fs = x->fs;
	struct efs_fs_handle *h = x->h;
	struct efs_fs_inode *in = efs_fs_ifind(fs, x->ino);
	bool reclaim;

	reclaim = in && in->opens == 1 && in->rec && !in->gone && in->rec->nlink == 0 &&
		  h->epoch == fs->epoch;
	efs_fs_handle_free(fs, h);
	fuse_reply_err(x->req, 0);
	if (reclaim)
		efs_fs_reclaim(fs, x->ino);
	efs_mem_free(x);
}

#if EFS_HAVE_PLOCK
static void release_plock_cb(int status, void *arg)
{
	(void)status;
	release_finish(arg);
}
#endif

void efs_fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = fh_of(fi);
	struct rel_ctx *x;

	efs_counter_inc(fs->m_ops[EFS_FS_OP_RELEASE]);
	if (!h) {
		fuse_reply_err(req, 0);
		return;
	}
	x = efs_mem_calloc(1, sizeof(*x));
	if (!x) {
		/* Release cannot fail: free the handle, no reclaim (fsck's). */
		efs_fs_handle_free(fs, h);
		fuse_reply_err(req, 0);
		return;
	}
	x->fs = fs;
	x->req = req;
	x->h = h;
	x->ino = ino;
#if EFS_HAVE_PLOCK
	{
		int r = efs_fs_plock_release(fs, h, fi->flock_release ? fi->lock_owner : 0,
					     release_plock_cb, x);

		if (r == 0)
			return;
	}
#endif
	release_finish(x);
}

/* ---- Publication ---- */

static uint32_t group_of(const struct efs_fs *fs, uint64_t blk)
{
	uint64_t ds = fs->fi->data_start, ag = fs->fi->ag_blocks ? fs->fi->ag_blocks : 1;

	return blk < ds ? 0 : (uint32_t)((blk - ds) / ag);
}

/*
 * What a publication transaction has used of etcd's per-transaction caps
 * (compares and operations count separately; PUB_BUDGET each), and the
 * allocation groups its allocator contribution touches (2 compares and 2
 * puts per group at most).
 */
#define PUB_GMAX 128
struct budget {
	size_t ops, cmps;
	uint32_t g[PUB_GMAX];
	size_t ng;
};

/* Groups of |r| not yet in |b| nor in |g2| (n2 of them); appends the new
 * ones to |g2| when |add2| (up to PUB_GMAX). Returns how many are new. */
static size_t groups_new(const struct efs_fs *fs, const struct efs_runs *r, const struct budget *b,
			 uint32_t *g2, size_t *n2)
{
	size_t added = 0;

	for (size_t i = 0; i < r->n; i++) {
		uint32_t a = group_of(fs, r->v[i].start);
		uint32_t z = group_of(fs, r->v[i].start + r->v[i].len - 1);

		for (uint32_t x = a; x <= z; x++) {
			bool seen = false;

			for (size_t k = 0; k < b->ng && !seen; k++)
				seen = b->g[k] == x;
			for (size_t k = 0; k < *n2 && !seen; k++)
				seen = g2[k] == x;
			if (seen)
				continue;
			added++;
			if (*n2 < PUB_GMAX)
				g2[(*n2)++] = x;
		}
	}
	return added;
}

static bool budget_fits(const struct budget *b, size_t ops, size_t cmps, size_t groups)
{
	return b->ops + ops + 2 * groups <= PUB_BUDGET && b->cmps + cmps + 2 * groups <= PUB_BUDGET;
}

static void budget_take(struct budget *b, size_t ops, size_t cmps, const uint32_t *g2, size_t n2)
{
	b->ops += ops + 2 * n2;
	b->cmps += cmps + 2 * n2;
	for (size_t i = 0; i < n2 && b->ng < PUB_GMAX; i++)
		b->g[b->ng++] = g2[i];
}

static void snap_release(struct dsnap *s)
{
	struct efs_fs_data *d = s->d;

	efs_extmap_changes_free(s->ch, s->nch);
	s->ch = NULL;
	s->nch = 0;
	efs_runs_done(&s->use);
	efs_runs_done(&s->freed);
	s->included = false;
	s->partial = false;
	if (d && d->snap == s)
		d->snap = NULL;
}

/* The pending runs that chunk change |c| maps (none for a deletion),
 * appended to |use|. */
static int change_use(struct efs_fs_data *d, const struct efs_extmap_change *c,
		      struct efs_runs *use)
{
	struct efs_runs out = {0};
	struct efs_ext *px;
	size_t cnt;
	int e = 0;

	if (c->del || c->end <= c->key || !d->apend.n)
		return 0;
	cnt = efs_extmap_lookup(d->map, c->key, c->end - c->key, NULL, 0);
	if (!cnt)
		return 0;
	px = efs_mem_malloc(cnt * sizeof(*px));
	if (!px)
		return -ENOMEM;
	efs_extmap_lookup(d->map, c->key, c->end - c->key, px, cnt);
	for (size_t k = 0; k < cnt && e == 0; k++)
		e = runs_split(&d->apend, px[k].dblk, px[k].count, use, &out);
	efs_mem_free(px);
	efs_runs_done(&out);
	return e;
}

/*
 * Adds one inode's publication to op's transaction: 1 added, 0 skipped (it
 * does not fit next to what is there; it stays dirty), or a negative errno.
 *
 * Complete when everything fits: every dirty chunk, every pending
 * allocation, every buried block freed, the record. Otherwise (an inode
 * alone too large for one transaction) a part: the first chunk changes
 * that fit with the allocations they map; frees only once every chunk
 * change is in (then the published map no longer references any buried
 * block), as many as fit. The state stays dirty until a complete one.
 */
/* The first index of v[lo, hi) (sorted by key) whose key is >= |key|. */
static size_t keys_lower(const struct efs_extmap_change *v, size_t lo, size_t hi, uint64_t key)
{
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* True when the first |k| of the |n| changes |v| (deletions, then chunks,
 * each sorted by key) may go without the rest: no excluded key lies in
 * the stored range of an included one. */
static bool cut_ok(const struct efs_extmap_change *v, size_t n, size_t k)
{
	size_t nd = 0;

	while (nd < n && v[nd].del)
		nd++;
	for (size_t i = 0; i < k; i++) {
		size_t j;

		if (v[i].pend <= v[i].key)
			continue;
		if (k < nd) {
			j = keys_lower(v, k, nd, v[i].key);
			if (j < nd && v[j].key < v[i].pend)
				return false;
		}
		j = keys_lower(v, k > nd ? k : nd, n, v[i].key);
		if (j < n && v[j].key < v[i].pend)
			return false;
	}
	return true;
}

static int snap_build(struct efs_fs_op *op, struct dpub *P, struct dsnap *s, struct budget *b,
		      bool first)
{
	struct efs_fs *fs = op->fs;
	struct efs_fs_data *d = s->d;
	struct efs_fs_inode *in = d->in;
	uint32_t g2[PUB_GMAX];
	size_t n2 = 0, nd, gn;
	Etcfs__Inode *rec;
	int e;

	if (d->broken || d->dropped || !d->map || !in || !efs_fs_rec(op, d->ino))
		return 0;
	if (!state_dirty(d) && !P->trunc)
		return 0;
	nd = efs_extmap_ndirty(d->map);
	gn = groups_new(fs, &d->apend, b, g2, &n2);
	gn += groups_new(fs, &d->fpend, b, g2, &n2);
	if (budget_fits(b, 1 + nd, 1, gn)) {
		/* Complete. */
		e = efs_extmap_changes(d->map, nd, &s->ch, &s->nch);
		if (e == 0)
			e = efs_runs_append(&s->use, &d->apend);
		if (e == 0)
			e = efs_runs_append(&s->freed, &d->fpend);
		if (e < 0)
			goto fail;
		if (s->nch < nd)
			s->partial = true;
	} else {
		size_t k = 0, ops = 1, cmps = 1;

		if (!first)
			return 0; /* next time, alone */
		s->partial = true;
		e = efs_extmap_changes(d->map, nd, &s->ch, &s->nch);
		if (e < 0)
			goto fail;
		n2 = 0;
		for (k = 0; k < s->nch; k++) {
			struct efs_runs cu = {0};
			uint32_t g3[PUB_GMAX];
			size_t n3 = n2, gk;

			memcpy(g3, g2, n2 * sizeof(g2[0]));
			e = change_use(d, &s->ch[k], &cu);
			if (e < 0) {
				efs_runs_done(&cu);
				goto fail;
			}
			gk = groups_new(fs, &cu, b, g3, &n3);
			if (!budget_fits(b, ops + 1, cmps, n2 + gk)) {
				efs_runs_done(&cu);
				break;
			}
			ops++;
			memcpy(g2, g3, n3 * sizeof(g2[0]));
			n2 = n3;
			e = efs_runs_append(&s->use, &cu);
			efs_runs_done(&cu);
			if (e < 0)
				goto fail;
		}
		if (k == s->nch) {
			/* Every change is in: frees may go, as many as fit. */
			for (size_t i = 0; i < d->fpend.n; i++) {
				struct efs_runs one = {0};
				uint32_t g3[PUB_GMAX];
				size_t n3 = n2, gk;

				memcpy(g3, g2, n2 * sizeof(g2[0]));
				e = efs_runs_add(&one, d->fpend.v[i].start, d->fpend.v[i].len);
				gk = e == 0 ? groups_new(fs, &one, b, g3, &n3) : 0;
				efs_runs_done(&one);
				if (e < 0)
					goto fail;
				if (!budget_fits(b, ops, cmps, n2 + gk))
					continue;
				memcpy(g2, g3, n3 * sizeof(g2[0]));
				n2 = n3;
				e = efs_runs_add(&s->freed, d->fpend.v[i].start, d->fpend.v[i].len);
				if (e < 0)
					goto fail;
			}
			if (efs_runs_total(&s->freed) == efs_runs_total(&d->fpend))
				s->partial = false; /* all of it after all */
		} else {
			/* The first k changes only, cut where no included key's
			 * value in etcd covers an excluded key (a chunk split
			 * since: its upper half would be in no stored value
			 * until the next part, lost to a crash in between). */
			size_t kk = k;

			while (kk > 0 && !cut_ok(s->ch, s->nch, kk))
				kk--;
			if (kk > 0 && kk < k) {
				efs_runs_done(&s->use);
				memset(&s->use, 0, sizeof(s->use));
				for (size_t i = 0; i < kk && e == 0; i++)
					e = change_use(d, &s->ch[i], &s->use);
				if (e < 0)
					goto fail;
				k = kk;
			} else if (kk == 0 && k > 0) {
				efs_log_warn("data: inode %llu: no safe cut for a publication in "
					     "parts; cut at %zu changes",
					     (unsigned long long)d->ino, k);
			}
			efs_extmap_changes_free(s->ch, s->nch);
			s->ch = NULL;
			s->nch = 0;
			if (k == 0) {
				efs_log_warn("data: inode %llu: one extent chunk does not fit a "
					     "transaction (too many allocation groups)",
					     (unsigned long long)d->ino);
				goto skip;
			}
			e = efs_extmap_changes(d->map, k, &s->ch, &s->nch);
			if (e < 0)
				goto fail;
		}
		if (e == 0)
			e = efs_runs_normalize(&s->use);
		if (e < 0)
			goto fail;
		if (!s->nch && !s->freed.n && !state_dirty(d))
			goto skip;
	}
	for (size_t i = 0; i < s->nch; i++) {
		const struct efs_extmap_change *c = &s->ch[i];
		struct efs_meta_key k;

		e = efs_meta_key_extent(&fs->ns, d->ino, c->key, &k);
		if (e < 0)
			goto fail;
		if (c->del)
			e = efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
						false);
		else
			e = efs_etcd_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len,
					     c->val.data, c->val.len, 0);
		if (e < 0)
			goto fail;
	}
	if (s->use.n) {
		e = efs_alloc_txn_use(P->t, &s->use);
		if (e < 0)
			goto fail;
	}
	if (s->freed.n) {
		e = efs_alloc_txn_free(P->t, &s->freed, d->ino);
		if (e < 0)
			goto fail;
	}
	rec = efs_fs_rec_dup(in->rec);
	if (!rec) {
		e = -ENOMEM;
		goto fail;
	}
	if (s->partial) {
		/* Some published chunks may reach beyond the merged size (a
		 * truncate's deletions not in this part): never publish a size
		 * below published extents (invariant 5). */
		uint64_t endb = efs_extmap_published_end(d->map);

		for (size_t i = 0; i < s->nch; i++)
			if (s->ch[i].end > endb)
				endb = s->ch[i].end;
		if (endb * fs->blksize > rec->size)
			rec->size = endb * fs->blksize;
	}
	rec->blocks = efs_extmap_blocks(d->map) * (fs->blksize / 512);
	e = efs_fs_put_inode(op, d->ino, rec, false);
	protobuf_c_message_free_unpacked(&rec->base, efs_mem_protobuf());
	if (e < 0)
		goto fail;
	s->ver = d->ver;
	s->included = true;
	s->tried = true;
	d->snap = s;
	budget_take(b, 1 + s->nch, 1, g2, n2);
	if (s->partial) {
		/* More to publish after this one. */
		d->urgent = true;
		ctl_of(fs)->again = true;
	}
	return 1;
skip:
	snap_release(s);
	return 0;
fail:
	snap_release(s);
	return e;
}

static void pub_sync_cb(struct efs_io *io, ssize_t res)
{
	struct efs_fs_op *op = io->arg;
	struct dpub *P = op->dpub;
	struct dctl *c = ctl_of(P->fs);

	P->syncing = false;
	if (res < 0) {
		efs_log_warn("data: fdatasync of the device failed: %s", strerror((int)-res));
		P->dev_err = true;
		wb_release_held(c, P);
		efs_fs_op_resume_build(op, -EIO);
		return;
	}
	/* Writes that completed while the sync ran may not be covered by it:
	 * sync again; after SYNC_TRIES, once more with completed writes held
	 * back (not mapped) until the snapshot is taken. */
	if (P->holding || c->writes_done == P->sync_mark) {
		P->synced = true;
	} else {
		P->synced = false;
		if (++P->sync_tries >= SYNC_TRIES) {
			P->holding = true;
			c->hold++;
		}
	}
	efs_fs_op_resume_build(op, 0);
}

static void pub_begin_cb(int status, void *arg)
{
	struct efs_fs_op *op = arg;
	struct dpub *P = op->dpub;

	if (status < 0 && P)
		P->dev_err = true;
	efs_fs_op_resume_build(op, status < 0 ? -EIO : 0);
}

/*
 * The publication part of a build: token, fdatasync, snapshots of the
 * op's inodes, the allocator's contribution. EFS_FS_CONT (commit),
 * EFS_FS_WAIT, EFS_FS_DONE (nothing to publish) or a negative errno.
 */
static int pub_common(struct efs_fs_op *op, struct dpub *P)
{
	struct efs_fs *fs = op->fs;
	struct dctl *c = ctl_of(fs);
	struct budget b = {0};
	size_t added = 0;
	int e;

	if (!P->t) {
		e = efs_alloc_txn_begin(fs->alloc, &P->t, pub_begin_cb, op);
		if (e == 0)
			return EFS_FS_WAIT;
		if (e < 0) {
			P->dev_err = true;
			return e == -ENOMEM ? e : -EIO;
		}
	}
	if (!P->synced) {
		if (P->syncing)
			return EFS_FS_WAIT;
		memset(&P->sio, 0, sizeof(P->sio));
		P->sio.op = EFS_IO_SYNC;
		P->sio.cb = pub_sync_cb;
		P->sio.arg = op;
		P->sync_mark = c->writes_done;
		e = efs_iopool_submit(fs->pool, &P->sio);
		if (e < 0) {
			P->dev_err = true;
			wb_release_held(c, P);
			return -EIO;
		}
		P->syncing = true;
		return EFS_FS_WAIT;
	}
	b.cmps = 2 + op->nslots; /* session guard, lock guards */
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];

		if (s->included)
			snap_release(s);
		e = snap_build(op, P, s, &b, added == 0);
		if (e < 0) {
			wb_release_held(c, P);
			return e;
		}
		added += (size_t)e;
	}
	/* The snapshot is taken: writes held back during the last sync may
	 * be mapped now (a rebuild syncs again). */
	wb_release_held(c, P);
	if (!added) {
		efs_alloc_txn_end(P->t, EFS_ALLOC_FAILED, 0);
		P->t = NULL;
		if (P->trunc)
			return -EIO; /* its inode must go in: does not fit */
		if (P->publisher) {
			/* Retried by the sweep, not in a loop. */
			c->stalled = true;
			c->again = false;
		}
		P->committed = true; /* nothing to publish is success */
		return EFS_FS_DONE;
	}
	e = efs_alloc_txn_build(P->t, op->txn);
	if (e < 0) {
		efs_log_warn("data: publication refused by the allocator: %s", strerror(-e));
		return e == -ENOMEM ? e : -EIO;
	}
	if (c->c_txns)
		efs_counter_inc(c->c_txns);
	return EFS_FS_CONT;
}

void efs_fs_data_outcome(struct efs_fs_op *op, enum efs_fs_data_outcome oc, int64_t rev)
{
	struct dpub *P = op->dpub;
	struct efs_fs *fs = op->fs;
	struct dctl *c = ctl_of(fs);

	if (!P)
		return;
	if (oc == EFS_FS_DATA_UNKNOWN) {
		P->unknown = true;
		if (P->t)
			efs_alloc_txn_end(P->t, EFS_ALLOC_UNKNOWN, 0);
		return;
	}
	P->unknown = false;
	if (oc == EFS_FS_DATA_FAILED) {
		if (P->t)
			efs_alloc_txn_end(P->t, EFS_ALLOC_FAILED, 0);
		P->t = NULL;
		P->synced = false;
		P->sync_tries = 0;
		for (size_t i = 0; i < P->n; i++) {
			struct dsnap *s = &P->s[i];
			struct efs_fs_data *d = s->d;
			struct efs_runs back = {0};

			if (!s->included)
				continue;
			/* Allocations of the snapshot buried meanwhile were
			 * never published: give them back. */
			if (d && d->dropped && !d->broken && s->use.n)
				efs_alloc_unuse(fs->alloc, &s->use);
			else if (d && !d->broken && s->use.n &&
				 runs_remove_all(&d->fpend, &s->use, &back) == 0 && back.n)
				efs_alloc_unuse(fs->alloc, &back);
			efs_runs_done(&back);
			snap_release(s);
		}
		return;
	}
	/* Committed. */
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];
		struct efs_fs_data *d = s->d;

		if (!s->included)
			continue;
		if (s->partial)
			P->left_partial = true;
		if (d && !d->broken && !d->dropped) {
			efs_extmap_published(d->map, s->ch, s->nch);
			dacct(d);
			runs_remove_all(&d->apend, &s->use, NULL);
			runs_remove_all(&d->fpend, &s->freed, NULL);
			if (!s->partial) {
				if (d->ver == s->ver)
					d->pf = 0;
				if (s->ver > d->ver_pub)
					d->ver_pub = s->ver;
			}
			d->err = 0;
			if (c->c_inodes)
				efs_counter_inc(c->c_inodes);
		}
		snap_release(s);
		if (d) {
			fw_wake(d, d->ver_pub, 0);
			state_check_clean(d);
		}
	}
	if (P->t)
		efs_alloc_txn_end(P->t, EFS_ALLOC_COMMITTED, rev);
	P->t = NULL;
	P->committed = true;
	fs->statfs_ns = 0; /* free counts changed: statfs reads them again */
}

static void pub_next_cb(uv_timer_t *t);

void efs_fs_data_op_free(struct efs_fs_op *op)
{
	struct dpub *P = op->dpub;
	struct efs_fs *fs = op->fs;
	struct dctl *c = ctl_of(fs);

	if (!P)
		return;
	op->dpub = NULL;
	if (P->syncing) {
		/* Cannot happen: the op waits for its sync. */
		efs_log_warn("data: publication freed with a sync in flight");
	}
	if (c)
		wb_release_held(c, P);
	if (P->t) {
		/* Never settled (or ended before its commit): the allocator
		 * re-reads its maps after an unknown outcome. */
		efs_alloc_txn_end(P->t, EFS_ALLOC_FAILED, 0);
		P->t = NULL;
	}
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];
		struct efs_fs_data *d = s->d;

		if (!d)
			continue;
		if (P->unknown && s->included) {
			/* Whether it applied is unknown: discard the state, it is
			 * reloaded from etcd (its allocations stay leaked in
			 * memory; they are free in etcd unless published). */
			efs_log_warn("data: inode %llu: publication outcome unknown; state "
				     "discarded",
				     (unsigned long long)d->ino);
			d->broken = true;
			dlist_del(d);
			state_unpin(d);
			fw_fail_all(d, -EIO);
		} else if (!P->committed && (s->tried || P->dev_err)) {
			d->err = -EIO;
			fw_fail_all(d, -EIO);
			if (P->dev_err)
				d->urgent = false; /* retried by the sweep */
		}
		snap_release(s);
		s->d = NULL;
		d->nref--;
		state_maybe_free(d);
	}
	if (c && c->h_pub)
		efs_histogram_observe_ns(c->h_pub, efs_clock_mono_ns() - P->start_ns);
	if (c && P->publisher && c->running == op) {
		c->running = NULL;
		if (!P->committed && c->sync_cb && c->sync_err == 0)
			c->sync_err = -EIO;
		if (P->dev_err) {
			/* The device or the allocator fails: retried by the
			 * sweep (or a new fsync), not in a loop. */
			c->stalled = true;
			c->again = false;
		}
		uv_timer_start(c->kick, pub_next_cb, 0, 0);
	}
	efs_mem_free(P);
}

static int pub_plan(struct efs_fs_op *op)
{
	struct dpub *P = op->dpub;
	int e;

	if (op->loads_done == 0) {
		for (size_t i = 0; i < P->n; i++) {
			e = efs_fs_want(op, P->s[i].d->ino, EFS_LOCK_EXCLUSIVE);
			if (e < 0)
				return e;
		}
		return 0;
	}
	return EFS_FS_CONT;
}

static int pub_build(struct efs_fs_op *op)
{
	return pub_common(op, op->dpub);
}

static void pub_done(struct efs_fs_op *op)
{
	(void)op;
}

static const struct efs_fs_opdesc pub_desc = {
	.code = EFS_FS_OP_PUBLISH,
	.origin = EFS_FS_ORIG_PUBLISH,
	.mutates = true,
	.plan = pub_plan,
	.build = pub_build,
	.done = pub_done,
};

/* Starts one publication of dirty inodes (urgent ones first) unless one
 * runs. */
static void pub_start(struct efs_fs *fs)
{
	struct dctl *c = ctl_of(fs);
	struct efs_fs_op *op;
	struct dpub *P;
	size_t est = 2 + 8; /* the session guard, about two groups */

	if (c->running) {
		c->again = true;
		return;
	}
	c->again = false;
	if (!c->dhead)
		goto idle;
	P = efs_mem_calloc(1, sizeof(*P));
	if (!P)
		return;
	P->fs = fs;
	P->publisher = true;
	P->start_ns = efs_clock_mono_ns();
	for (int pass = 0; pass < 2 && P->n < EFS_LOCK_REQ_MAX; pass++) {
		for (struct efs_fs_data *d = c->dhead; d && P->n < EFS_LOCK_REQ_MAX; d = d->dnext) {
			size_t cost;

			if ((pass == 0) != d->urgent || d->snap || d->broken || d->dropped)
				continue;
			/* Rough cost (compares and operations count
			 * apart; the groups are shared, snap_build checks
			 * exactly): the lock guard and the record compare,
			 * the record put and the chunks. */
			cost = 2 + efs_extmap_ndirty(d->map);
			if (P->n && est + cost > PUB_BUDGET)
				continue;
			est += cost;
			P->s[P->n].d = d;
			d->nref++;
			P->n++;
		}
	}
	if (!P->n) {
		efs_mem_free(P);
		goto idle;
	}
	op = efs_fs_op_new(fs, NULL, &pub_desc);
	if (!op) {
		for (size_t i = 0; i < P->n; i++)
			P->s[i].d->nref--;
		efs_mem_free(P);
		return;
	}
	op->dpub = P;
	c->running = op;
	efs_fs_op_run(op);
	return;
idle:
	if (!c->dhead && c->sync_cb && !c->running) {
		void (*cb)(int, void *) = c->sync_cb;

		c->sync_cb = NULL;
		cb(c->sync_err, c->sync_arg);
	}
}

static void pub_next_cb(uv_timer_t *t)
{
	struct dctl *c = t->data;
	bool more = c->again || c->sync_cb || c->bp_head || c->ndirty > KICK_INODES ||
		    c->nchunks >= KICK_NODE_CHUNKS;

	if (c->stalled)
		more = c->again;

	for (struct efs_fs_data *d = c->dhead; d && !more; d = d->dnext)
		if (d->urgent || d->fw)
			more = true;
	if (c->sync_cb && c->sync_err && !c->running) {
		void (*cb)(int, void *) = c->sync_cb;

		c->sync_cb = NULL;
		cb(c->sync_err, c->sync_arg);
	}
	if (more)
		pub_start(c->fs);
	if (!c->stalled)
		bp_resume(c->fs);
}

static void pub_kick(struct efs_fs *fs)
{
	struct dctl *c = ctl_of(fs);

	if (c->running) {
		c->again = true;
		return;
	}
	if (!uv_is_active((uv_handle_t *)c->kick))
		uv_timer_start(c->kick, pub_next_cb, 0, 0);
	c->again = true;
}

static void sweep_cb(uv_timer_t *t)
{
	struct dctl *c = t->data;

	c->stalled = false;
	if (c->dhead)
		pub_kick(c->fs);
}

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
	const Etcfs__Inode *rec;

	if (op->loads_done == 0)
		return efs_fs_want(op, x->r->ino, EFS_LOCK_EXCLUSIVE);
	rec = efs_fs_rec(op, x->r->ino);
	if (!rec)
		return -ENOENT;
	if (S_ISDIR(rec->mode))
		return -EISDIR;
	if (!S_ISREG(rec->mode))
		return -EINVAL;
	return EFS_FS_CONT;
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
	efs_fs_op_resume_build(x->op, err);
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
	e = write_blocks(r->d, x->target / bs, 1, r->buf, 0, tr_tail_written, x);
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
	e = read_blocks(d, lastb, 1, r->buf, tr_tail_read, x);
	if (e == 1) {
		memset(r->buf + x->target % bs, 0, bs - x->target % bs);
		e = write_blocks(d, lastb, 1, r->buf, 0, tr_tail_written, x);
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
		e = bury(d, &buried);
	efs_runs_done(&buried);
	if (e < 0)
		return e;
	if (x->final) {
		e = efs_fs_setattr_apply(d->in->rec, &r->attr, r->to_set, now);
		if (e < 0)
			return e;
		pf_from_rec(d, r->to_set);
		pf_set_size(d, x->target);
	} else {
		pf_set_size(d, x->target);
		pf_set_mctime(d, now);
	}
	pf_set_blocks(d);
	d->ver++;
	dlist_add(d);
	state_pin(d);
	return 0;
}

static int tr_build(struct efs_fs_op *op)
{
	struct dpub *P = op->dpub;
	struct tr *x = op->priv;
	struct dreq *r = x->r;
	struct efs_fs *fs = op->fs;
	struct efs_fs_inode *in = efs_fs_ifind(fs, r->ino);
	struct efs_fs_data *d;
	int e;

	if (!in || !in->rec)
		return -ENOENT;
	if (!r->d) {
		d = state_get(fs, in);
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
	if (!map_valid(fs, d)) {
		if (state_dirty(d))
			return -EIO;
		return map_load(op, d);
	}
	if (x->step == 0) {
		x->target = tr_step_size(d, (uint64_t)r->attr.st_size, &x->final);
		x->step = 1;
		e = rl_take(d, &r->rl, x->target / fs->blksize, UINT64_MAX, tr_locked_cb, x);
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
	return pub_common(op, P);
}

static void tr_start(struct dreq *r);

/* The step committed (or had nothing to publish): reply, or the next step. */
static void tr_next(struct efs_fs_op *op)
{
	struct tr *x = op->priv;
	struct dreq *r = x ? x->r : NULL;
	struct efs_fs_inode *in;
	struct dpub *P = op->dpub;

	if (!r)
		return;
	x->r = NULL;
	op->replied = true; /* the request goes on, or is answered here */
	if (r->rl.held && r->d)
		rl_drop(r->d, &r->rl);
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
		r->replied = true;
		fuse_reply_attr(r->req, &st, efs_fs_attr_timeout(r->fs, r->ino));
	}
	dreq_end(r, 0);
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
		rl_drop(r->d, &r->rl);
	if (x->step >= 3 && r->d && !r->d->broken && !r->d->dropped) {
		/* The map is cut in memory and not published: discard the
		 * state, it is reloaded from etcd. */
		struct efs_fs_data *d = r->d;

		efs_log_warn("data: inode %llu: truncate failed after its cut; state discarded",
			     (unsigned long long)d->ino);
		d->broken = true;
		dlist_del(d);
		state_unpin(d);
		fw_fail_all(d, -EIO);
	}
	/* The engine answered the error. */
	r->replied = true;
	dreq_end(r, 0);
}

static const struct efs_fs_opdesc tr_desc = {
	.code = EFS_FS_OP_SETATTR,
	.origin = EFS_FS_ORIG_TRUNCATE,
	.mutates = true,
	.plan = tr_plan,
	.build = tr_build,
	.done = tr_done,
};

static void tr_start(struct dreq *r)
{
	struct efs_fs_op *op = efs_fs_op_new(r->fs, r->req, &tr_desc);
	struct dpub *P;
	struct tr *x;

	if (!op) {
		dreq_end(r, -ENOMEM);
		return;
	}
	P = efs_mem_calloc(1, sizeof(*P));
	x = efs_mem_calloc(1, sizeof(*x));
	if (!P || !x) {
		efs_mem_free(P);
		efs_mem_free(x);
		op->replied = true;
		efs_fs_op_finish(op, 0);
		dreq_end(r, -ENOMEM);
		return;
	}
	P->fs = r->fs;
	P->trunc = r;
	P->start_ns = efs_clock_mono_ns();
	x->r = r;
	x->op = op;
	op->ino = r->ino;
	op->dpub = P;
	op->priv = x;
	op->priv_free = tr_free;
	efs_fs_op_run(op);
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
		int e = fi && fi->fh ? handle_ok(fs, fh_of(fi)) : 0;

		if (in && in->rec && !in->gone && !S_ISREG(in->rec->mode))
			return false;
		if (e < 0) {
			efs_counter_inc(fs->m_ops[EFS_FS_OP_SETATTR]);
			efs_counter_inc(fs->m_errs[EFS_FS_OP_SETATTR]);
			fuse_reply_err(req, -e);
			return true;
		}
		if (fs->read_only) {
			efs_counter_inc(fs->m_ops[EFS_FS_OP_SETATTR]);
			efs_counter_inc(fs->m_errs[EFS_FS_OP_SETATTR]);
			fuse_reply_err(req, EROFS);
			return true;
		}
		if (attr->st_size < 0) {
			efs_counter_inc(fs->m_ops[EFS_FS_OP_SETATTR]);
			efs_counter_inc(fs->m_errs[EFS_FS_OP_SETATTR]);
			fuse_reply_err(req, EINVAL);
			return true;
		}
		r = dreq_new(req, RK_SETATTR, EFS_FS_OP_SETATTR, ino);
		if (!r)
			return true;
		r->attr = *attr;
		r->to_set = to_set;
		tr_start(r);
		return true;
	}
	/* Deferred attributes under our pinned exclusive lock (section 11). */
	if (!d || d->broken || !d->pinned || !state_ready(fs, ino, EFS_LOCK_EXCLUSIVE))
		return false;
	if ((to_set & FUSE_SET_ATTR_MODE) && fs->posix_acl && in->rec->xattr_count > 0)
		return false; /* chmod rewrites the ACL: the engine's path */
	if (fi && fi->fh && handle_ok(fs, fh_of(fi)) < 0)
		return false;
	{
		Etcfs__Inode *rec = in->rec;
		struct stat st;
		int e;

		efs_counter_inc(fs->m_ops[EFS_FS_OP_SETATTR]);
		e = efs_fs_setattr_apply(rec, attr, to_set, efs_fs_now());
		if (e < 0) {
			efs_counter_inc(fs->m_errs[EFS_FS_OP_SETATTR]);
			fuse_reply_err(req, -e);
			return true;
		}
		pf_from_rec(d, to_set);
		d->ver++;
		dlist_add(d);
		efs_meta_inode_to_stat(rec, ino, fs->blksize, &st);
		fuse_reply_attr(req, &st, efs_fs_attr_timeout(fs, ino));
	}
	return true;
}

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
		dreq_end(r, -EIO);
		return;
	}
	b0 = (uint64_t)r->off / bs;
	b1 = ((uint64_t)r->off + (uint64_t)r->len + bs - 1) / bs;
	e = rl_take(r->d, &r->rl, b0, b1, fa_locked, r);
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
		dreq_end(r, -EIO);
		return;
	}
	if (r->fmode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
		struct efs_runs buried = {0};
		int e = 0;

		if (p1 > p0)
			e = efs_extmap_punch(d->map, p0, p1 - p0, &buried);
		if (e == 0 && buried.n)
			e = bury(d, &buried);
		efs_runs_done(&buried);
		if (e < 0) {
			dreq_end(r, e);
			return;
		}
		if (p1 > p0) {
			pf_set_blocks(d);
			state_changed(d);
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
			dreq_end(r, -ENOMEM);
			return;
		}
		e = read_blocks(d, blk, 1, r->buf, fa_edge_read, r);
		if (e == 1)
			fa_edge_read(r, 0);
		else if (e < 0)
			dreq_end(r, e);
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
		dreq_end(r, err);
		return;
	}
	zs = off > s ? off - s : 0;
	ze = end < s + bs ? end - s : bs;
	memset(r->buf + zs, 0, ze - zs);
	e = write_blocks(r->d, r->b0, 1, r->buf, 0, fa_edge_written, r);
	if (e < 0)
		dreq_end(r, e);
}

static void fa_edge_written(void *arg, int err)
{
	struct dreq *r = arg;

	efs_io_buf_free(r->buf);
	r->buf = NULL;
	if (err < 0) {
		dreq_end(r, err);
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
		e = write_blocks(d, h0, h1 - h0, NULL, EFS_META_EXTENT_F_PREALLOC, fa_prealloc_done,
				 r);
		if (e < 0)
			dreq_end(r, e);
		return;
	}
	fa_finish(r);
}

static void fa_prealloc_done(void *arg, int err)
{
	struct dreq *r = arg;

	if (err < 0) {
		dreq_end(r, err);
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
		pf_set_size(d, end);
	if (r->fmode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE))
		pf_set_mctime(d, efs_fs_now());
	else {
		d->pf |= PF_CTIME;
		d->p_ctime = rec->ctime_ns = efs_fs_now();
	}
	pf_set_blocks(d);
	state_changed(d);
	rl_drop(d, &r->rl);
	if (r->h && r->h->oflags & O_DSYNC) {
		int e = fsync_wait(d, fsync_done, r);

		if (e == 1)
			fsync_done(r, 0);
		else if (e < 0)
			dreq_end(r, e);
		return;
	}
	r->replied = true;
	fuse_reply_err(r->req, 0);
	dreq_end(r, 0);
}

void efs_fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
		      struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = fh_of(fi);
	int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
	struct dreq *r;
	int e = handle_ok(fs, h);

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
	if (e < 0) {
		efs_counter_inc(fs->m_ops[EFS_FS_OP_FALLOCATE]);
		efs_counter_inc(fs->m_errs[EFS_FS_OP_FALLOCATE]);
		fuse_reply_err(req, -e);
		return;
	}
	r = dreq_new(req, RK_FALLOC, EFS_FS_OP_FALLOCATE, ino);
	if (!r)
		return;
	r->h = h;
	r->fmode = mode;
	r->off = offset;
	r->len = length;
	prep(r, EFS_LOCK_EXCLUSIVE, falloc_cont);
}

/* ---- lseek ---- */

static void lseek_cont(struct dreq *r)
{
	struct efs_fs_data *d = r->d;
	uint64_t bs = r->fs->blksize, size = d->in->rec->size, off = (uint64_t)r->off, res;
	uint64_t blk;

	if (r->off < 0) {
		dreq_end(r, -ENXIO);
		return;
	}
	if (off >= size) {
		dreq_end(r, -ENXIO);
		return;
	}
	if (r->fmode == SEEK_DATA) {
		if (efs_extmap_seek_data(d->map, off / bs, &blk) < 0) {
			dreq_end(r, -ENXIO);
			return;
		}
		res = blk * bs > off ? blk * bs : off;
		if (res >= size) {
			dreq_end(r, -ENXIO);
			return;
		}
	} else {
		blk = efs_extmap_seek_hole(d->map, off / bs);
		res = blk * bs > off ? blk * bs : off;
		if (res > size)
			res = size;
	}
	r->replied = true;
	fuse_reply_lseek(r->req, (off_t)res);
	dreq_end(r, 0);
}

void efs_fs_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		  struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct dreq *r;
	int e = handle_ok(fs, fh_of(fi));

	if (e == 0 && whence != SEEK_DATA && whence != SEEK_HOLE)
		e = -EINVAL; /* the kernel does the others */
	if (e == 0 && !fs->alloc)
		e = -EIO;
	if (e < 0) {
		efs_counter_inc(fs->m_ops[EFS_FS_OP_LSEEK]);
		efs_counter_inc(fs->m_errs[EFS_FS_OP_LSEEK]);
		fuse_reply_err(req, -e);
		return;
	}
	r = dreq_new(req, RK_LSEEK, EFS_FS_OP_LSEEK, ino);
	if (!r)
		return;
	r->off = off;
	r->fmode = whence;
	prep(r, EFS_LOCK_SHARED, lseek_cont);
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
	prep(r, EFS_LOCK_EXCLUSIVE, cfr_dst_ready);
}

static void cfr_dst_ready(struct dreq *r)
{
	r->phase = 2;
	cfr_next(r);
}

/* One step: read the next piece of the source, then write it. */
static void cfr_next(struct dreq *r)
{
	struct efs_fs *fs = r->fs;
	struct efs_fs_data *src = r->d_in;
	uint64_t bs = fs->blksize, size, off, n, end;
	int e;

	efs_mem_free(r->data);
	r->data = NULL;
	if (r->d->broken || src->broken || !src->in || !src->in->rec) {
		if (r->total) {
			r->replied = true;
			fuse_reply_write(r->req, r->total);
		}
		dreq_end(r, r->total ? 0 : -EIO);
		return;
	}
	size = src->in->rec->size;
	off = (uint64_t)r->off_in + r->total;
	if (r->total >= r->size || off >= size || !map_valid(fs, src)) {
		r->replied = true;
		fuse_reply_write(r->req, r->total);
		dreq_end(r, 0);
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
		dreq_end(r, -ENOMEM);
		return;
	}
	e = read_blocks(src, r->b0, r->nb, r->buf, cfr_read_done, r);
	if (e == 1)
		cfr_read_done(r, 0);
	else if (e < 0)
		dreq_end(r, e);
}

static void cfr_read_done(void *arg, int err)
{
	struct dreq *r = arg;
	uint64_t bs = r->fs->blksize, off = (uint64_t)r->off_in + r->total;

	if (err < 0) {
		dreq_end(r, err);
		return;
	}
	r->data = efs_mem_malloc(r->wbytes);
	if (!r->data) {
		dreq_end(r, -ENOMEM);
		return;
	}
	memcpy(r->data, r->buf + off % bs, r->wbytes);
	r->doff = 0;
	efs_io_buf_free(r->buf);
	r->buf = NULL;
	write_step(r);
}

void efs_fs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			    struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			    struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *hi = fh_of(fi_in), *ho = fh_of(fi_out);
	struct dreq *r;
	int e = handle_ok(fs, hi);

	if (e == 0)
		e = handle_ok(fs, ho);
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
		efs_counter_inc(fs->m_ops[EFS_FS_OP_COPY_FILE_RANGE]);
		if (e < 0) {
			efs_counter_inc(fs->m_errs[EFS_FS_OP_COPY_FILE_RANGE]);
			fuse_reply_err(req, -e);
		} else {
			fuse_reply_write(req, 0);
		}
		return;
	}
	r = dreq_new(req, RK_CFR, EFS_FS_OP_COPY_FILE_RANGE, ino_in);
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
	prep(r, EFS_LOCK_SHARED, cfr_src_ready);
}

/* ---- Engine hooks ---- */

void efs_fs_data_dropped(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct efs_fs_data *d = in ? in->data : NULL;

	if (!d)
		return;
	d->dropped = true;
	/* Unpublished allocations go back; published blocks (including the
	 * buried ones) are freed through the reclaim record. */
	if (d->snap && d->snap->use.n)
		/* In flight: given back only if that publication fails
		 * (efs_fs_data_outcome); committed, they are the inode's
		 * published extents, freed by reclaim. */
		runs_remove_all(&d->apend, &d->snap->use, NULL);
	if (d->apend.n)
		efs_alloc_unuse(fs->alloc, &d->apend);
	efs_runs_clear(&d->apend);
	efs_runs_clear(&d->fpend);
	d->pf = 0;
	d->ver_pub = d->ver;
	dlist_del(d);
	state_unpin(d);
	fw_fail_all(d, 0);
	in->data = NULL;
	d->in = NULL;
	efs_fs_iput(fs, in);
	state_maybe_free(d);
}

void efs_fs_data_session_lost(struct efs_fs *fs)
{
	struct dctl *c = ctl_of(fs);

	if (!c)
		return;
	while (c->dhead) {
		struct efs_fs_data *d = c->dhead;

		dlist_del(d);
		d->broken = true;
		efs_runs_clear(&d->apend);
		efs_runs_clear(&d->fpend);
		state_unpin(d);
		fw_fail_all(d, -EIO);
	}
	/* Clean states: their maps are stale (the lock went with the lease);
	 * they reload on next use (map_valid checks the epoch). */
}

int efs_fs_data_sync_all(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg)
{
	struct dctl *c = ctl_of(fs);

	if (!c || (!c->dhead && !c->running))
		return 1;
	if (c->sync_cb)
		return -EBUSY;
	c->sync_cb = cb;
	c->sync_arg = arg;
	c->sync_err = 0;
	for (struct efs_fs_data *d = c->dhead; d; d = d->dnext)
		d->urgent = true;
	pub_kick(fs);
	return 0;
}

/* ---- Setup ---- */

static void timer_close_cb(uv_handle_t *h)
{
	efs_mem_free(h);
}

int efs_fs_data_init(struct efs_fs *fs)
{
	struct dctl *c = efs_mem_calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->fs = fs;
	c->sweep = efs_mem_calloc(1, sizeof(*c->sweep));
	c->kick = efs_mem_calloc(1, sizeof(*c->kick));
	if (!c->sweep || !c->kick) {
		efs_mem_free(c->sweep);
		efs_mem_free(c->kick);
		efs_mem_free(c);
		return -ENOMEM;
	}
	r = uv_timer_init(fs->loop, c->sweep);
	if (r == 0)
		r = uv_timer_init(fs->loop, c->kick);
	if (r < 0) {
		efs_mem_free(c->sweep);
		efs_mem_free(c->kick);
		efs_mem_free(c);
		return r;
	}
	c->sweep->data = c;
	c->kick->data = c;
	if (fs->m) {
		c->g_dirty = efs_metrics_gauge(fs->m, "etcfs_data_dirty_inodes",
					       "Inodes with unpublished data or fields", NULL);
		c->c_txns = efs_metrics_counter(fs->m, "etcfs_data_publish_txns_total",
						"Publication transactions sent", NULL);
		c->c_inodes = efs_metrics_counter(fs->m, "etcfs_data_published_inodes_total",
						  "Inodes published by committed transactions",
						  NULL);
		c->c_fsyncs = efs_metrics_counter(fs->m, "etcfs_data_fsyncs_total",
						  "fsync and fdatasync requests", NULL);
		c->c_wbytes = efs_metrics_counter(fs->m, "etcfs_data_write_bytes_total",
						  "Bytes written to the device by file writes",
						  NULL);
		c->c_rbytes = efs_metrics_counter(fs->m, "etcfs_data_read_bytes_total",
						  "Bytes read from the device by file reads", NULL);
		c->h_pub = efs_metrics_histogram(fs->m, "etcfs_data_publish_seconds",
						 "Publication latency (token, sync, commit)", NULL);
	}
	fs->data_priv = c;
	uv_timer_start(c->sweep, sweep_cb, fs->flush_interval_ms, fs->flush_interval_ms);
	return 0;
}

void efs_fs_data_done(struct efs_fs *fs)
{
	struct dctl *c = ctl_of(fs);

	if (!c)
		return;
	/* Every state still attached to a cached inode (nothing is in flight:
	 * no waiter, no request, no publication). */
	for (size_t i = 0; i < fs->hsize; i++) {
		for (struct efs_fs_inode *in = fs->htab[i], *next; in; in = next) {
			struct efs_fs_data *d = in->data;

			next = in->hnext;
			if (!d)
				continue;
			while (d->fw) {
				struct fwait *w = d->fw;

				d->fw = w->next;
				efs_mem_free(w);
			}
			state_free(d);
		}
	}
	uv_timer_stop(c->sweep);
	uv_timer_stop(c->kick);
	uv_close((uv_handle_t *)c->sweep, timer_close_cb);
	uv_close((uv_handle_t *)c->kick, timer_close_cb);
	fs->data_priv = NULL;
	efs_mem_free(c);
}

#endif /* EFS_HAVE_DATAPATH */
