/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-core data state of a regular file (fs/file/file-int.h): the
 * dirty list, fsync waiters, the pending record fields,
 * loading the extent map, and the engine hooks that drop or discard states.
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

/* ---- Metrics ---- */

static void gauge_dirty(struct dctl *c)
{
	if (c->g_dirty)
		efs_gauge_set(c->g_dirty, (double)c->ndirty);
}

/* ---- States ---- */

bool efs_file_state_dirty(const struct efs_fs_data *d)
{
	return d->ver != d->ver_pub;
}

void efs_file_dlist_add(struct efs_fs_data *d)
{
	struct dctl *c = efs_file_ctl_of(d->fs);

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

void efs_file_dlist_del(struct efs_fs_data *d)
{
	struct dctl *c = efs_file_ctl_of(d->fs);

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
void efs_file_dacct(struct efs_fs_data *d)
{
	struct dctl *c = efs_file_ctl_of(d->fs);
	size_t n = d->listed && d->map ? efs_extmap_ndirty(d->map) : 0;

	c->nchunks = c->nchunks - d->nd_acct + n;
	d->nd_acct = n;
}

/* Recounts the node's total exactly (before writes are made to wait). */
size_t efs_file_dacct_all(struct dctl *c)
{
	for (struct efs_fs_data *d = c->dhead; d; d = d->dnext)
		efs_file_dacct(d);
	return c->nchunks;
}

/* Calls and frees every waiter of |done|, in order: waiters added by the
 * callbacks go on the state's list, for a later wake. */
static void fw_call(struct efs_list *done, int err)
{
	struct efs_list *n;

	while ((n = efs_list_pop(done))) {
		struct fwait *w = efs_list_entry(n, struct fwait, link);

		w->cb(w->arg, err);
		efs_mem_free(w);
	}
}

void efs_file_fw_fail_all(struct efs_fs_data *d, int err)
{
	struct efs_list done;

	efs_list_init(&done);
	efs_list_splice_tail(&done, &d->fw);
	fw_call(&done, err);
}

/* Wakes the waiters whose version is published (ver_pub), or all with
 * |err| when |upto| covers them. */
void efs_file_fw_wake(struct efs_fs_data *d, uint64_t upto, int err)
{
	struct efs_list done, *n, *tmp;

	efs_list_init(&done);
	efs_list_for_each_safe(n, tmp, &d->fw) {
		if (efs_list_entry(n, struct fwait, link)->ver <= upto) {
			efs_list_del(n);
			efs_list_add_tail(&done, n);
		}
	}
	fw_call(&done, err);
}

void efs_file_state_free(struct efs_fs_data *d)
{
	struct efs_fs *fs = d->fs;
	struct efs_fs_inode *in = d->in;

	efs_file_dlist_del(d);
	efs_extmap_free(d->map);
	efs_io_buf_free(d->tail);
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
bool efs_file_state_busy(const struct efs_fs_data *d)
{
	return d->nref || d->loading || efs_rangelock_busy(&d->ranges) || d->snap ||
	       !efs_list_empty(&d->fw);
}

/* Clean, without writers, nothing in flight. */
bool efs_file_state_idle(const struct efs_fs_data *d)
{
	return !efs_file_state_busy(d) && !efs_file_state_dirty(d) && !d->writers;
}

void efs_file_state_maybe_free(struct efs_fs_data *d)
{
	if (efs_file_state_busy(d))
		return;
	if (d->broken || d->dropped || !d->in) {
		efs_file_state_free(d);
		return;
	}
	if (!efs_file_state_idle(d) || d->in->opens)
		return;
	efs_file_state_free(d);
}

/* A clean state leaves the dirty list. */
void efs_file_state_check_clean(struct efs_fs_data *d)
{
	if (efs_file_state_dirty(d))
		return;
	d->urgent = false;
	efs_file_dlist_del(d);
}

struct efs_fs_data *efs_file_state_get(struct efs_fs *fs, struct efs_fs_inode *in)
{
	struct dctl *c = efs_file_ctl_of(fs);
	struct efs_fs_data *d = in->data;

	if (d && d->broken) {
		/* Discarded: detach it, a fresh state reloads from etcd. */
		in->data = NULL;
		d->in = NULL;
		efs_fs_iput(fs, in);
		efs_file_state_maybe_free(d);
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
	efs_list_init(&d->fw);
	efs_list_init(&d->lw);
	efs_list_init(&d->ipw);
	efs_list_init(&d->rds);
	efs_list_init(&d->rdefer);
	in->refs++;
	in->data = d;
	return d;
}

bool efs_file_map_valid(const struct efs_fs *fs, const struct efs_fs_data *d)
{
	return d->map && d->in && efs_fs_grant_current(fs, d->in, d->map_gen) &&
	       d->map_epoch == fs->epoch;
}

/* Marks a change: a new version, on the dirty list, limits checked. */
void efs_file_state_changed(struct efs_fs_data *d)
{
	struct dctl *c = efs_file_ctl_of(d->fs);

	d->ver++;
	/* Whatever pinned the lock for it, the change is an exclusive use:
	 * a downgrade prepared before it must publish it first (a read's
	 * atime comes under a shared pin; lock.h). */
	if (d->in)
		efs_lock_note_change(d->fs->lc, d->ino);
	efs_file_dlist_add(d);
	efs_file_dacct(d);
	/* A full batch is ready: publish it (while one runs, its end counts
	 * again: the chunks it carries no longer count then). */
	if ((d->nd_acct >= KICK_CHUNKS || c->ndirty > KICK_INODES ||
	     c->nchunks >= KICK_NODE_CHUNKS) && !c->running)
		efs_file_pub_kick(d->fs);
}

/* ---- Pending record fields ---- */

void efs_file_pf_set_size(struct efs_fs_data *d, uint64_t size)
{
	d->pf |= PF_SIZE;
	d->p_size = size;
	if (d->in && d->in->rec)
		d->in->rec->size = size;
}

void efs_file_pf_set_blocks(struct efs_fs_data *d)
{
	uint64_t b = efs_extmap_blocks(d->map) * (d->fs->blksize / 512);

	d->pf |= PF_BLOCKS;
	d->p_blocks = b;
	if (d->in && d->in->rec)
		d->in->rec->blocks = b;
}

void efs_file_pf_set_mctime(struct efs_fs_data *d, int64_t now)
{
	d->pf |= PF_MTIME | PF_CTIME;
	d->p_mtime = d->p_ctime = now;
	if (d->in && d->in->rec)
		d->in->rec->mtime_ns = d->in->rec->ctime_ns = now;
}

/* Takes every field of the merged record that |to_set| names. */
void efs_file_pf_from_rec(struct efs_fs_data *d, int to_set)
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

void efs_file_state_reloaded(struct efs_fs *fs, struct efs_fs_inode *in)
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

	return in && in->data && !in->data->broken && efs_file_state_dirty(in->data);
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
	struct efs_list waiting, *n;
	int err = res->err ? (res->err == -ENOMEM ? -ENOMEM : -EIO) : 0;

	(void)all;
	d->loading = false;
	efs_list_init(&waiting);
	efs_list_splice_tail(&waiting, &d->lw);
	if (err == 0 && !d->broken && !d->dropped && !efs_file_state_dirty(d) && l->epoch == fs->epoch) {
		efs_extmap_free(d->map);
		d->map = l->m;
		l->m = NULL;
		d->map_gen = l->gen;
		d->map_epoch = l->epoch;
	} else if (err == 0 && !efs_file_map_valid(fs, d)) {
		err = -EIO;
	}
	if (res->err)
		efs_log_debug("data: inode %llu: reading extents failed: %s",
			      (unsigned long long)d->ino, res->message ? res->message : "?");
	efs_extmap_free(l->m);
	efs_mem_free(l);
	while ((n = efs_list_pop(&waiting))) {
		struct lwait *w = efs_list_entry(n, struct lwait, link);

		efs_fs_op_resume_prepare(w->op, err);
		efs_mem_free(w);
	}
	d->nref--;
	efs_file_state_maybe_free(d);
}

/* Loads |d|'s map for |op| (which holds the lock), from its prepare:
 * EFS_FS_WAIT (the prepare is resumed) or a negative errno. */
int efs_file_map_load(struct efs_fs_op *op, struct efs_fs_data *d)
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
		efs_list_add_head(&d->lw, &w->link);
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
	l->gen = efs_fs_grant(fs, d->in);
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
	efs_list_add_head(&d->lw, &w->link);
	return EFS_FS_WAIT;
}


/* ---- Engine hooks ---- */

/*
 * While a publication of the state is in flight (d->snap), its commit
 * removes the snapshot's runs from |apend| and |fpend| and must not fail:
 * each list keeps room for as many more runs as the snapshot removes from
 * it (each removed run splits at most one run in two). Every change that
 * may add runs to either list reserves here first.
 */
int efs_file_pend_reserve(struct efs_fs_data *d, struct efs_runs *list, size_t more)
{
	size_t keep = 0;

	if (d->snap)
		keep = list == &d->apend ? d->snap->use.n : d->snap->freed.n;
	return efs_runs_reserve(list, list->n + more + keep);
}

/* Discards |d| (its requests fail, it is reloaded on next use): nothing
 * of it is published any more and its fsync waiters fail with EIO. */
void efs_file_state_discard(struct efs_fs_data *d)
{
	d->broken = true;
	efs_file_dlist_del(d);
	efs_file_fw_fail_all(d, -EIO);
}

void efs_file_state_dropped(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	struct efs_fs_data *d = in ? in->data : NULL;

	if (!d)
		return;
	d->dropped = true;
	/* Unpublished allocations go back; published blocks (including the
	 * buried ones) are freed through the reclaim record. */
	if (d->snap && d->snap->use.n &&
	    efs_runs_remove_all(&d->apend, &d->snap->use, NULL) < 0) {
		/* In flight: given back only if that publication fails
		 * (efs_file_pub_outcome); committed, they are the inode's
		 * published extents, freed by reclaim. The removal has its
		 * room reserved (efs_file_pend_reserve) and cannot fail; if
		 * it did, nothing is given back (leaked until restart) rather
		 * than blocks the publication may commit. */
		efs_log_warn("data: inode %llu: dropped with its pending runs unsorted; "
			     "unpublished blocks leaked until restart",
			     (unsigned long long)d->ino);
		efs_runs_clear(&d->apend);
	}
	if (d->apend.n)
		efs_alloc_unuse(fs->alloc, &d->apend);
	efs_runs_clear(&d->apend);
	efs_runs_clear(&d->fpend);
	d->pf = 0;
	d->ver_pub = d->ver;
	efs_file_dlist_del(d);
	efs_file_fw_fail_all(d, 0);
	in->data = NULL;
	d->in = NULL;
	efs_fs_iput(fs, in);
	efs_file_state_maybe_free(d);
}

void efs_fs_data_session_lost(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!c)
		return;
	while (c->dhead) {
		struct efs_fs_data *d = c->dhead;

		efs_file_dlist_del(d);
		d->broken = true;
		efs_runs_clear(&d->apend);
		efs_runs_clear(&d->fpend);
		efs_file_fw_fail_all(d, -EIO);
	}
	/* Clean states: their maps are stale (the lock went with the lease);
	 * they reload on next use (efs_file_map_valid checks the epoch). */
}
