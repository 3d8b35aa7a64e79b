/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The publisher (fs/file/file-int.h): publication transactions of dirty
 * inodes, their outcomes, the interval sweep, sync of every dirty inode,
 * and the setup of the data path.
 */
#include "fs/file/file-int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
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
		e = efs_runs_split(&d->apend, px[k].dblk, px[k].count, use, &out);
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
	if (!efs_file_state_dirty(d) && !P->trunc)
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
		if (!s->nch && !s->freed.n && !efs_file_state_dirty(d))
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
	/* Room for the commit's removals (efs_file_pend_reserve). */
	e = efs_runs_reserve(&d->apend, d->apend.n + s->use.n);
	if (e == 0)
		e = efs_runs_reserve(&d->fpend, d->fpend.n + s->freed.n);
	if (e < 0)
		goto fail;
	rec = efs_fs_rec_dup(in->rec);
	if (!rec) {
		e = -ENOMEM;
		goto fail;
	}
	if (s->partial) {
		/* Some published chunks may reach beyond the merged size (a
		 * truncate's deletions not in this part): never publish a size
		 * below published extents: a record in etcd never has a
		 * size below the extents etcd holds for it. */
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
		efs_file_ctl_of(fs)->again = true;
	}
	return 1;
skip:
	snap_release(s);
	return 0;
fail:
	snap_release(s);
	return e;
}

void efs_file_writes_inflight(struct efs_fs *fs, int delta)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!c)
		return;
	if (delta < 0) {
		c->writes_inflight--;
		return;
	}
	if (++c->writes_inflight > c->writes_inflight_max) {
		c->writes_inflight_max = c->writes_inflight;
		if (c->g_writes_max)
			efs_gauge_set(c->g_writes_max, (double)c->writes_inflight_max);
	}
}

#if EFS_FAULT_HOOKS
void efs_file_synchk_mapped(struct dctl *c, const struct efs_runs *r)
{
	for (size_t i = 0; i < r->n; i++) {
		if (c->nunsynced == c->unsynced_cap) {
			size_t cap = c->unsynced_cap ? 2 * c->unsynced_cap : 64;
			/* Plain realloc: the memory fault hook must not fail
			 * the check's own bookkeeping. */
			struct synchk *v = realloc(c->unsynced, cap * sizeof(*v));

			if (!v)
				abort();
			c->unsynced = v;
			c->unsynced_cap = cap;
		}
		c->unsynced[c->nunsynced++] =
			(struct synchk){r->v[i].start, r->v[i].len, atomic_load(&c->writes_done)};
	}
}

void efs_file_synchk_synced(struct dctl *c, uint64_t mark)
{
	size_t k = 0;

	for (size_t i = 0; i < c->nunsynced; i++)
		if (c->unsynced[i].seq > mark)
			c->unsynced[k++] = c->unsynced[i];
	c->nunsynced = k;
}

void efs_file_synchk_commit(struct dctl *c, uint64_t ino, const struct efs_runs *use)
{
	for (size_t i = 0; i < use->n; i++)
		for (size_t k = 0; k < c->nunsynced; k++) {
			const struct synchk *u = &c->unsynced[k];

			if (u->start < use->v[i].start + use->v[i].len &&
			    use->v[i].start < u->start + u->len) {
				efs_log_err("data: inode %llu: a publication committed blocks "
					    "%llu+%llu that no finished fdatasync covers",
					    (unsigned long long)ino,
					    (unsigned long long)u->start,
					    (unsigned long long)u->len);
				abort();
			}
		}
}
#else
void efs_file_synchk_mapped(struct dctl *c, const struct efs_runs *r)
{
	(void)c;
	(void)r;
}

void efs_file_synchk_synced(struct dctl *c, uint64_t mark)
{
	(void)c;
	(void)mark;
}

void efs_file_synchk_commit(struct dctl *c, uint64_t ino, const struct efs_runs *use)
{
	(void)c;
	(void)ino;
	(void)use;
}
#endif

/* ---- The device flush ---- */

struct dswait {
	struct efs_list link;
	void (*done)(void *arg, int err);
	void *arg;
	uint64_t mark; /* |writes_done| when it came */
};

static void dsync_cb(struct efs_io *io, ssize_t res);

static int dsync_issue(struct dctl *c)
{
	memset(&c->ds_io, 0, sizeof(c->ds_io));
	c->ds_io.op = EFS_IO_SYNC;
	c->ds_io.cb = dsync_cb;
	c->ds_io.arg = c;
	c->ds_mark = atomic_load(&c->writes_done);
	if (efs_iopool_submit(c->fs->pool, &c->ds_io) < 0)
		return -EIO;
	c->ds_busy = true;
	c->fs->inflight++; /* teardown waits for the flush */
	if (c->c_syncs)
		efs_counter_inc(c->c_syncs);
	return 0;
}

static void dsync_run(struct efs_list *list, int err)
{
	struct efs_list *n;

	while ((n = efs_list_pop(list))) {
		struct dswait *w = efs_list_entry(n, struct dswait, link);

		w->done(w->arg, err);
		efs_mem_free(w);
	}
}

static void dsync_cb(struct efs_io *io, ssize_t res)
{
	struct dctl *c = io->arg;
	uint64_t mark = c->ds_mark;
	struct efs_list ready, failed, *n, *tmp;
	int err = 0;

	c->ds_busy = false;
	c->fs->inflight--;
	if (res < 0) {
		efs_log_warn("data: fdatasync of the device failed: %s", strerror((int)-res));
		err = -EIO;
	} else {
		if (mark > c->synced_mark)
			c->synced_mark = mark;
		efs_file_synchk_synced(c, mark);
	}
	efs_list_init(&ready);
	efs_list_init(&failed);
	efs_list_for_each_safe(n, tmp, &c->ds_waiters) {
		struct dswait *w = efs_list_entry(n, struct dswait, link);

		if (err == 0 && w->mark > mark)
			continue; /* came after the flush was issued: the next one */
		efs_list_del(n);
		efs_list_add_tail(&ready, n);
	}
	if (!efs_list_empty(&c->ds_waiters) && dsync_issue(c) < 0)
		efs_list_splice_tail(&failed, &c->ds_waiters);
	dsync_run(&ready, err);
	dsync_run(&failed, -EIO);
}

int efs_file_dev_sync(struct efs_fs *fs, void (*done)(void *arg, int err), void *arg)
{
	struct dctl *c = efs_file_ctl_of(fs);
	uint64_t mark = atomic_load(&c->writes_done);
	struct dswait *w;

	if (mark == c->synced_mark) {
		efs_file_synchk_synced(c, c->synced_mark);
		return 1;
	}
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	if (!c->ds_busy && dsync_issue(c) < 0) {
		efs_mem_free(w);
		return -EIO;
	}
	w->done = done;
	w->arg = arg;
	w->mark = mark; /* a flush issued from now on covers it */
	efs_list_add_tail(&c->ds_waiters, &w->link);
	return 0;
}

static void pub_synced(void *arg, int err)
{
	struct efs_fs_op *op = arg;
	struct dpub *P = op->hook_state;

	P->syncing = false;
	if (err < 0) {
		P->dev_err = true;
		efs_fs_op_resume_seal(op, -EIO);
		return;
	}
	P->synced = true;
	efs_fs_op_resume_seal(op, 0);
}

static void pub_begin_cb(int status, void *arg)
{
	struct efs_fs_op *op = arg;
	struct dpub *P = op->hook_state;

	if (status < 0 && P)
		P->dev_err = true;
	efs_fs_op_resume_prepare(op, status < 0 ? -EIO : 0);
}

#if EFS_FAULT_HOOKS
/*
 * ETCFS_FAULT_PUB_UNSETTLED=N (tests): the Nth publication transaction sent
 * from the mount on has its reply dropped (efs_etcd_fault_drop_reply: etcd
 * applies it, the commit reports an unknown outcome) and its outcome then
 * stays unknown to the data path: the engine's verdict after verifying by
 * op id is not heard, as when that verification cannot reach etcd and the
 * operation ends unsettled.
 */
static void fault_unsettled_from_env(struct dctl *c)
{
	const char *v = getenv("ETCFS_FAULT_PUB_UNSETTLED");
	unsigned long n;
	char *end;

	if (!v || !*v)
		return;
	errno = 0;
	n = strtoul(v, &end, 10);
	if (errno || *end || n == 0 || n > UINT32_MAX) {
		efs_log_err("ETCFS_FAULT_PUB_UNSETTLED='%s' ignored: expected N > 0", v);
		return;
	}
	c->fault_unsettled_nth = (uint32_t)n;
	efs_log_warn("fault hook: publication transaction #%lu is left unsettled", n);
}

/* Called as |P|'s transaction is about to be sent (the next Txn call). */
static void fault_arm(struct efs_fs *fs, struct dctl *c, struct dpub *P)
{
	if (!c->fault_unsettled_nth || --c->fault_unsettled_nth)
		return;
	efs_etcd_fault_drop_reply(fs->c, EFS_ETCD_TXN, 1);
	P->fault_unsettled = true;
}

/* ETCFS_FAULT_MEM=map|settle (efs_file_fault_mem_enter). */
static void fault_mem_from_env(struct dctl *c)
{
	static const char *const names[] = {
		[EFS_FILE_FAULT_MEM_MAP] = "map",
		[EFS_FILE_FAULT_MEM_SETTLE] = "settle",
	};
	const char *v = getenv("ETCFS_FAULT_MEM");

	if (!v || !*v)
		return;
	for (int i = EFS_FILE_FAULT_MEM_MAP; i <= EFS_FILE_FAULT_MEM_SETTLE; i++) {
		if (strcmp(v, names[i]) == 0) {
			c->fault_mem_site = i;
			efs_log_warn("fault hook: allocations fail in section '%s'", v);
			return;
		}
	}
	efs_log_err("ETCFS_FAULT_MEM='%s' ignored: expected map or settle", v);
}

static void fault_from_env(struct dctl *c)
{
	fault_unsettled_from_env(c);
	fault_mem_from_env(c);
}

void efs_file_fault_mem_enter(struct dctl *c, enum efs_file_fault_mem site)
{
	if ((int)site != c->fault_mem_site)
		return;
	c->fault_mem_on = true;
	efs_mem_fail_after(site == EFS_FILE_FAULT_MEM_MAP ? c->fault_mem_from : 0);
}

void efs_file_fault_mem_leave(struct dctl *c, enum efs_file_fault_mem site)
{
	long n;

	if ((int)site != c->fault_mem_site || !c->fault_mem_on)
		return;
	n = efs_mem_count();
	efs_mem_fail_reset();
	c->fault_mem_on = false;
	if (site == EFS_FILE_FAULT_MEM_SETTLE) {
		if (n > 0)
			efs_log_warn("fault hook: %ld allocations failed settling a publication", n);
		return;
	}
	if (n > c->fault_mem_from) {
		efs_log_warn("fault hook: map: run failed from allocation %ld of %ld",
			     c->fault_mem_from, n);
		c->fault_mem_from++;
		return;
	}
	efs_log_warn("fault hook: map: sweep complete (%ld allocations, each failed in turn)",
		     c->fault_mem_from);
	c->fault_mem_site = EFS_FILE_FAULT_MEM_NONE;
}
#else
static void fault_from_env(struct dctl *c)
{
	(void)c;
}

void efs_file_fault_mem_enter(struct dctl *c, enum efs_file_fault_mem site)
{
	(void)c;
	(void)site;
}

void efs_file_fault_mem_leave(struct dctl *c, enum efs_file_fault_mem site)
{
	(void)c;
	(void)site;
}

static void fault_arm(struct efs_fs *fs, struct dctl *c, struct dpub *P)
{
	(void)fs;
	(void)c;
	(void)P;
}
#endif

/*
 * What a publication waits for before its build: the map token.
 * EFS_FS_CONT, EFS_FS_WAIT (resumed through the engine) or a negative
 * errno.
 */
int efs_file_pub_prepare(struct efs_fs_op *op, struct dpub *P)
{
	struct efs_fs *fs = op->fs;
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
	return EFS_FS_CONT;
}

/*
 * What a built publication waits for before it goes out: one fdatasync of
 * the device, issued after the snapshot, so it covers every write the
 * snapshot maps (each completed before the snapshot was taken). Writes
 * that complete meanwhile are mapped and answered as usual: they are not
 * in this snapshot and wait for the next publication. No sync at all when
 * a finished one was issued after the last write completed.
 * EFS_FS_CONT, EFS_FS_WAIT (resumed with efs_fs_op_resume_seal) or a
 * negative errno.
 */
int efs_file_pub_seal(struct efs_fs_op *op, struct dpub *P)
{
	struct efs_fs *fs = op->fs;
	int e;

	if (P->synced)
		return EFS_FS_CONT;
	if (P->syncing)
		return EFS_FS_WAIT;
	e = efs_file_dev_sync(fs, pub_synced, op);
	if (e == 1) {
		P->synced = true;
		return EFS_FS_CONT;
	}
	if (e < 0) {
		P->dev_err = true;
		return -EIO;
	}
	P->syncing = true;
	return EFS_FS_WAIT;
}

/*
 * A lock whose release (or downgrade) waits for this publication goes in
 * the same transaction when nothing else took it meanwhile (lock.h): the
 * next holder waits for one commit, not two. Only for complete snapshots,
 * and only the publisher's (a truncate or fsync has work of its own left
 * under the lock after its commit).
 */
static void rel_add(struct efs_fs *fs, struct efs_fs_op *op, struct dpub *P)
{
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];
		bool was = s->rel;
		int e = 0;

		if (s->included && !s->partial && s->d)
			e = efs_lock_release_in_txn(fs->lc, op->txn, s->d->ino);
		s->rel = e == 1;
		if (was && !s->rel && s->d)
			efs_lock_release_in_txn_outcome(fs->lc, s->d->ino, EFS_LOCK_TXN_FAILED, 0);
	}
}

/* Tells the lock cache what became of the releases riding |P|. */
static void rel_outcome(struct efs_fs *fs, struct dpub *P, enum efs_lock_txn_outcome oc,
			int64_t rev)
{
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];

		if (!s->rel || !s->d)
			continue;
		s->rel = false;
		efs_lock_release_in_txn_outcome(fs->lc, s->d->ino, oc, rev);
	}
}

/*
 * The publication part of a build, once prepared: snapshots of the op's
 * inodes and the allocator's contribution. EFS_FS_CONT (commit),
 * EFS_FS_DONE (nothing to publish) or a negative errno.
 */
int efs_file_pub_build(struct efs_fs_op *op, struct dpub *P)
{
	struct efs_fs *fs = op->fs;
	struct dctl *c = efs_file_ctl_of(fs);
	struct budget b = {0};
	size_t added = 0;
	int e;

	b.cmps = 2 + op->nslots; /* session guard, lock guards */
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];

		if (s->included)
			snap_release(s);
		e = snap_build(op, P, s, &b, added == 0);
		if (e < 0)
			return e;
		added += (size_t)e;
	}
	/* A new snapshot: the seal syncs for it. */
	P->synced = false;
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
	if (P->publisher)
		rel_add(fs, op, P);
	if (c->c_txns)
		efs_counter_inc(c->c_txns);
	fault_arm(fs, c, P);
	return EFS_FS_CONT;
}

/* The inodes a publication's transaction carries. */
static uint64_t snaps_included(const struct dpub *P)
{
	uint64_t n = 0;

	for (size_t i = 0; i < P->n; i++)
		n += P->s[i].included;
	return n;
}

void efs_file_pub_outcome(struct efs_fs_op *op, enum efs_fs_commit oc, int64_t rev)
{
	struct dpub *P = op->hook_state;
	struct efs_fs *fs = op->fs;
	struct dctl *c = efs_file_ctl_of(fs);
	bool after_unknown;

	if (!P)
		return;
	if (oc == EFS_FS_UNKNOWN) {
		rel_outcome(fs, P, EFS_LOCK_TXN_UNKNOWN, 0);
		P->unknown = true;
		if (P->t)
			efs_alloc_txn_end(P->t, EFS_ALLOC_UNKNOWN, 0);
		return;
	}
	if (P->unknown && P->fault_unsettled)
		return; /* fault hook: the verdict is not heard */
	after_unknown = P->unknown;
	P->unknown = false;
	if (oc == EFS_FS_FAILED) {
		rel_outcome(fs, P, EFS_LOCK_TXN_FAILED, 0);
		if (P->t)
			efs_alloc_txn_end(P->t, EFS_ALLOC_FAILED, 0);
		P->t = NULL;
		P->synced = false;
		for (size_t i = 0; i < P->n; i++) {
			struct dsnap *s = &P->s[i];
			struct efs_fs_data *d = s->d;
			struct efs_runs back = {0};

			if (!s->included)
				continue;
			/* Allocations of the snapshot dropped or buried
			 * meanwhile were never published: give them back.
			 * Except for a dropped inode whose verdict follows an
			 * unknown outcome: the verification looks for our op
			 * id in the inode's record, which the drop deleted, so
			 * FAILED tells nothing there. Those stay allocated
			 * (leaked until restart) rather than go back while
			 * extents in etcd may hold them (the reclaim record
			 * frees what etcd holds). */
			if (d && !d->broken && s->use.n && d->dropped) {
				if (!after_unknown)
					efs_alloc_unuse(fs->alloc, &s->use);
				else
					efs_log_warn("data: inode %llu: dropped while its "
						     "publication's outcome was unknown; its "
						     "allocations are leaked until restart",
						     (unsigned long long)d->ino);
			} else if (d && !d->broken && s->use.n &&
				   efs_runs_remove_all(&d->fpend, &s->use, &back) == 0 && back.n) {
				efs_alloc_unuse(fs->alloc, &back);
			}
			efs_runs_done(&back);
			snap_release(s);
		}
		return;
	}
	/* Committed. */
	rel_outcome(fs, P, EFS_LOCK_TXN_COMMITTED, rev);
	efs_histogram_observe(c->h_batch, snaps_included(P));
	for (size_t i = 0; i < P->n; i++) {
		struct dsnap *s = &P->s[i];
		struct efs_fs_data *d = s->d;

		if (!s->included)
			continue;
		if (s->partial)
			P->left_partial = true;
		efs_file_synchk_commit(c, s->d ? s->d->ino : 0, &s->use);
		if (d && !d->broken && !d->dropped) {
			bool settled;

			efs_file_fault_mem_enter(c, EFS_FILE_FAULT_MEM_SETTLE);
			efs_extmap_published(d->map, s->ch, s->nch);
			efs_file_dacct(d);
			/* Room reserved by snap_build and kept since
			 * (efs_file_pend_reserve): these cannot fail. If they
			 * did, published blocks would stay pending (a drop
			 * would give them back while extents reference them)
			 * and freed ones would be freed again: the state is
			 * discarded instead, its pending runs forgotten
			 * (leaked until restart). */
			settled = efs_runs_remove_all(&d->apend, &s->use, NULL) == 0 &&
				  efs_runs_remove_all(&d->fpend, &s->freed, NULL) == 0;
			efs_file_fault_mem_leave(c, EFS_FILE_FAULT_MEM_SETTLE);
			if (!settled) {
				efs_log_warn("data: inode %llu: out of memory settling a "
					     "publication; state discarded",
					     (unsigned long long)d->ino);
				efs_runs_clear(&d->apend);
				efs_runs_clear(&d->fpend);
				efs_file_state_discard(d);
				snap_release(s);
				continue;
			}
			if (!s->partial) {
				/* What made it urgent (a part left, an fsync, a
				 * buffer limit, a sync of everything) is
				 * published; fsync waiters of later versions,
				 * writes waiting on limits and a sync of
				 * everything keep the publisher going on their
				 * own. Still urgent, an inode written without a
				 * pause was published back to back forever, a
				 * handful of chunks per transaction. */
				d->urgent = false;
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
			efs_file_fw_wake(d, d->ver_pub, 0);
			efs_file_state_check_clean(d);
		}
	}
	efs_alloc_txn_result(P->t, op->commit_resp);
	if (P->t)
		efs_alloc_txn_end(P->t, EFS_ALLOC_COMMITTED, rev);
	P->t = NULL;
	P->committed = true;
	fs->statfs_ns = 0; /* free counts changed: statfs reads them again */
}

static void pub_next_cb(uv_timer_t *t);

/* Forgets the runs of |s|, whose outcome stays unknown, from |d|'s pending
 * lists, so that nothing gives them back or frees them again (what stays
 * in |apend| was never sent: a drop may give it back). The removals have
 * their room reserved (efs_file_pend_reserve); if one failed, every
 * pending run is forgotten instead. */
static void snap_forget(struct efs_fs_data *d, const struct dsnap *s)
{
	if (efs_runs_remove_all(&d->apend, &s->use, NULL) == 0 &&
	    efs_runs_remove_all(&d->fpend, &s->freed, NULL) == 0)
		return;
	efs_runs_clear(&d->apend);
	efs_runs_clear(&d->fpend);
}

void efs_file_pub_release(struct efs_fs_op *op)
{
	struct dpub *P = op->hook_state;
	struct efs_fs *fs = op->fs;
	struct dctl *c = efs_file_ctl_of(fs);

	if (!P)
		return;
	op->hook_state = NULL;
	if (P->syncing) {
		/* Cannot happen: the op waits for its sync. */
		efs_log_warn("data: publication freed with a sync in flight");
	}
	/* Built into a transaction never answered: settled by the lock
	 * cache. */
	rel_outcome(fs, P, EFS_LOCK_TXN_UNKNOWN, 0);
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
			/* Whether it applied is unknown: its allocations may
			 * now be extents in etcd and its frees done, so they
			 * leave the pending runs (a drop would give the first
			 * back to the allocator, a publication would free the
			 * second again): leaked in memory until restart, free
			 * in etcd unless published. The state is discarded,
			 * and reloaded from etcd. */
			efs_log_warn("data: inode %llu: publication outcome unknown; state "
				     "discarded",
				     (unsigned long long)d->ino);
			snap_forget(d, s);
			efs_file_state_discard(d);
		} else if (!P->committed && (s->tried || P->dev_err)) {
			d->err = -EIO;
			efs_file_fw_fail_all(d, -EIO);
			if (P->dev_err)
				d->urgent = false; /* retried by the sweep */
		}
		snap_release(s);
		s->d = NULL;
		d->nref--;
		efs_file_state_maybe_free(d);
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
	struct dpub *P = op->hook_state;
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

static int pub_prepare(struct efs_fs_op *op)
{
	return efs_file_pub_prepare(op, op->hook_state);
}

static int pub_build(struct efs_fs_op *op)
{
	return efs_file_pub_build(op, op->hook_state);
}

static int pub_seal(struct efs_fs_op *op)
{
	return efs_file_pub_seal(op, op->hook_state);
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
	.prepare = pub_prepare,
	.build = pub_build,
	.seal = pub_seal,
	.done = pub_done,
	.outcome = efs_file_pub_outcome,
	.release = efs_file_pub_release,
};

/* Starts one publication of dirty inodes (urgent ones first) unless one
 * runs. */
static void pub_start(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);
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
	op->hook_state = P;
	/* It writes back what the locks cover: a release draining one of
	 * them waits for it (lockops.c). */
	op->lock_flags = EFS_LOCK_F_WRITEBACK;
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
	bool more = c->again || c->sync_cb || !efs_list_empty(&c->bp_waiters) || c->ndirty > KICK_INODES ||
		    c->nchunks >= KICK_NODE_CHUNKS;

	if (c->stalled)
		more = c->again;

	for (struct efs_fs_data *d = c->dhead; d && !more; d = d->dnext)
		if (d->urgent || !efs_list_empty(&d->fw))
			more = true;
	if (c->sync_cb && c->sync_err && !c->running) {
		void (*cb)(int, void *) = c->sync_cb;

		c->sync_cb = NULL;
		cb(c->sync_err, c->sync_arg);
	}
	if (more)
		pub_start(c->fs);
	if (!c->stalled)
		efs_file_bp_resume(c->fs);
}

void efs_file_pub_kick(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

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
		efs_file_pub_kick(c->fs);
}


int efs_fs_data_sync_all(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!c || (!c->dhead && !c->running))
		return 1;
	if (c->sync_cb)
		return -EBUSY;
	c->sync_cb = cb;
	c->sync_arg = arg;
	c->sync_err = 0;
	for (struct efs_fs_data *d = c->dhead; d; d = d->dnext)
		d->urgent = true;
	efs_file_pub_kick(fs);
	return 0;
}


/* ---- Setup ---- */

static void timer_close_cb(uv_handle_t *h)
{
	efs_mem_free(h);
}

static const struct efs_fs_inode_hooks file_inode_hooks = {
	.reloaded = efs_file_state_reloaded,
	.dropped = efs_file_state_dropped,
	.handle_freed = efs_fs_data_handle_free,
};

int efs_fs_data_init(struct efs_fs *fs)
{
	struct dctl *c = efs_mem_calloc(1, sizeof(*c));
	int r;

	if (!c)
		return -ENOMEM;
	c->fs = fs;
	efs_list_init(&c->linvals);
	efs_list_init(&c->bp_waiters);
	efs_list_init(&c->ds_waiters);
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
		c->g_writes_max = efs_metrics_gauge(fs->m, "etcfs_data_writes_inflight_max",
						    "Most write requests in the daemon at once",
						    NULL);
		c->c_wreplies = efs_metrics_counter(fs->m, "etcfs_data_worker_read_replies_total",
						    "Reads answered from the I/O worker "
						    "(one device read filled them)",
						    NULL);
		c->c_wwreplies = efs_metrics_counter(
			fs->m, "etcfs_data_worker_write_replies_total",
			"Writes answered from the I/O worker (whole blocks overwritten in "
			"place by one device write)",
			NULL);
		c->c_tail_hits = efs_metrics_counter(
			fs->m, "etcfs_data_tail_block_hits_total",
			"Partial blocks a write merged from the previous write's last "
			"block instead of reading the device",
			NULL);
		c->c_inplace = efs_metrics_counter(fs->m, "etcfs_data_inplace_writes_total",
						   "Writes that overwrote blocks the file maps in "
						   "place (no new extent)",
						   NULL);
		c->c_syncs = efs_metrics_counter(fs->m, "etcfs_data_device_syncs_total",
						 "Device fdatasyncs issued by publications",
						 NULL);
		c->h_pub = efs_metrics_histogram(fs->m, "etcfs_data_publish_seconds",
						 "Publication latency (token, sync, commit)", NULL);
		c->h_batch = efs_metrics_histogram_counts(
			fs->m, "etcfs_data_publish_batch_inodes",
			"Inodes per committed publication transaction", NULL);
	}
	fault_from_env(c);
	efs_fs_ihooks_add(fs, &file_inode_hooks);
	fs->data_priv = c;
	efs_file_lockops_init(c);
	uv_timer_start(c->sweep, sweep_cb, fs->flush_interval_ms, fs->flush_interval_ms);
	return 0;
}

void efs_fs_data_kernel_gone(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (c)
		efs_file_kernel_gone(c);
}

void efs_fs_data_abandon(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!c)
		return;
	uv_timer_stop(c->sweep);
	uv_timer_stop(c->kick);
	if (c->frecall)
		uv_timer_stop(c->frecall);
}

void efs_fs_data_done(struct efs_fs *fs)
{
	struct dctl *c = efs_file_ctl_of(fs);

	if (!c)
		return;
	efs_file_lockops_done(c);
	efs_fs_ihooks_del(fs, &file_inode_hooks);
	/* Every state still attached to a cached inode (nothing is in flight:
	 * no waiter, no request, no publication). */
	for (size_t i = 0; i < fs->hsize; i++) {
		for (struct efs_fs_inode *in = fs->htab[i], *next; in; in = next) {
			struct efs_fs_data *d = in->data;

			next = in->hnext;
			if (!d)
				continue;
			for (struct efs_list *n; (n = efs_list_pop(&d->fw));)
				efs_mem_free(efs_list_entry(n, struct fwait, link));
			efs_file_state_free(d);
		}
	}
	uv_timer_stop(c->sweep);
	uv_timer_stop(c->kick);
	uv_close((uv_handle_t *)c->sweep, timer_close_cb);
	uv_close((uv_handle_t *)c->kick, timer_close_cb);
	fs->data_priv = NULL;
	free(c->unsynced);
	efs_mem_free(c);
}
