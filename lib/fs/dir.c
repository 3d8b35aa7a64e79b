/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Directories: opendir, readdir, readdirplus, releasedir, fsyncdir.
 *
 * An open directory handle keeps the entries it has returned, read in
 * name order a page at a time; the offset (cookie) of an entry is its
 * position in that list ("." is 0, ".." is 1), so any offset the kernel
 * hands back resumes exactly, and a page continues after the last name
 * read (efs_meta_range_dirents_after). Entries created before the last
 * name read are not seen by this handle and removed ones are still
 * returned, which POSIX allows; offset 0 starts a fresh listing
 * (rewinddir).
 */
#include <errno.h>
#include <string.h>

#include "etcd/kv.h"
#include "fs/fs-int.h"
#include "util/log.h"
#include "util/mem.h"

/* Shared locks readdirplus takes on the entries of a reply,
 * EFS_LOCK_REQ_MAX per transaction, so that the kernel may cache what it
 * returns. */
struct plus_lock {
	struct efs_lock_req lr;
	struct efs_fs_op *op;
	struct efs_fs_inode *in[EFS_LOCK_REQ_MAX]; /* refs held */
	bool pinned;
};

struct dir_state {
	bool started;
	bool plus;
	char *buf;
	size_t used;
	off_t pos;
	size_t attr_from; /* readdirplus: first entry being prepared still without attributes */
	size_t page_first; /* readdirplus: first entry being prepared */
	size_t attr_to;	   /* readdirplus: end of the entries being prepared */
	size_t aidx[EFS_FS_PLUS_BATCH]; /* readdirplus: the entries of the record read in flight */
	size_t naidx;
	size_t attr_scan; /* readdirplus: where that read's scan of the entries stopped */
	size_t prep_to;	   /* readdirplus: entries below it were prepared by this op */
	struct efs_fs_inode **pins; /* refs held on the prepared entries until the op ends */
	size_t npins;
	bool in_list; /* plus_lock_page() runs inside dir_list(): no resume from there */
	bool reread;   /* readdirplus: stale names were read again once by this op */
	struct plus_lock **locks;
	size_t nlocks, pending;
	uint64_t fetch_mseq, fetch_gen; /* the directory's when the page read left */
};

/* A directory operation's record (opendir, readdir, readdirplus): the
 * engine's base (op.ino the directory), the open handle, and what the
 * caller asked. */
struct dir_op {
	struct efs_fs_op op;
	struct efs_fs_handle *h;
	size_t size;		  /* the reply buffer */
	off_t off;		  /* the listing position */
	struct fuse_file_info fi; /* opendir: the handle to reply with */
	struct dir_state st;	  /* readdir, readdirplus */
};

static struct dir_op *dop_of(struct efs_fs_op *op)
{
	return (struct dir_op *)op; /* op is the first member */
}

long efs_fs_dir_index(off_t off, size_t nents)
{
	(void)nents;
	if (off <= 0)
		return -1;
	if (off == 1)
		return -2;
	return (long)(off - 2);
}

/* ---- opendir ---- */

static int opendir_plan(struct efs_fs_op *op)
{
	struct dir_op *dop = dop_of(op);
	const Etcfs__Inode *rec;
	struct efs_fs_handle *h;
	int r;

	if (op->loads_done == 0) {
		r = efs_fs_want(op, op->ino, EFS_LOCK_SHARED);
		return r;
	}
	rec = efs_fs_rec(op, op->ino);
	if (!rec || rec->nlink == 0)
		return -ENOENT;
	if (!S_ISDIR(rec->mode))
		return -ENOTDIR;
	h = efs_fs_handle_new(op->fs, op->ino, true);
	if (!h)
		return -ENOMEM;
	h->parent = rec->parent ? rec->parent : EFS_META_ROOT_INO;
	dop->fi.fh = (uint64_t)(uintptr_t)h;
	dop->fi.keep_cache = 0;
	dop->fi.cache_readdir = 0;
	if (efs_fs_rq_open(op->rq, &dop->fi) != 0)
		efs_fs_handle_free(op->fs, h);
	return EFS_FS_DONE;
}

static const struct efs_fs_opdesc opendir_desc = {
	.code = EFS_FS_OP_OPENDIR,
	.size = sizeof(struct dir_op),
	.plan = opendir_plan,
	.build = efs_fs_no_build,
	.done = efs_fs_no_done,
};

void efs_fs_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_op *op = efs_fs_op_new(fs, req, &opendir_desc);
	struct dir_op *dop = dop_of(op);

	if (!op) {
		efs_fs_reply_now(fs, req, EFS_FS_OP_OPENDIR, -ENOMEM);
		return;
	}
	op->ino = ino;
	dop->fi = *fi;
	efs_fs_op_run(op);
}

/* ---- readdir ---- */

static int ents_add(struct efs_fs_handle *h, const uint8_t *name, size_t len, uint64_t ino,
		    uint32_t type)
{
	struct efs_fs_dirent_ent *e;

	if (h->nents == h->cap) {
		size_t ncap = h->cap ? h->cap * 2 : 64;
		struct efs_fs_dirent_ent *n = efs_mem_realloc(h->ents, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		h->ents = n;
		h->cap = ncap;
	}
	e = &h->ents[h->nents];
	memset(e, 0, sizeof(*e));
	e->name = efs_mem_strndup((const char *)name, len);
	if (!e->name)
		return -ENOMEM;
	e->ino = ino;
	e->type = type;
	h->nents++;
	return 0;
}

static void page_attr_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg);
static int dir_list(struct efs_fs_op *op);
static int fetch_attrs(struct efs_fs_op *op);

/* True when entry |i| needs its record read for readdirplus: not the
 * directory itself, and not cached under a lock (emit takes those from the
 * cache; a lock transaction of this listing brings the records of the
 * locks it takes). */
static bool needs_attr(struct efs_fs_op *op, size_t i)
{
	struct efs_fs_handle *h = dop_of(op)->h;
	const struct efs_fs_inode *in = efs_fs_ifind(op->fs, h->ents[i].ino);

	if (h->ents[i].ino == h->ino)
		return false;
	return !(in && efs_fs_inode_valid(op->fs, in) && in->rec);
}

/*
 * Reads the records of the entries in [attr_from, attr_to) that still need
 * them (needs_attr), EFS_FS_PLUS_BATCH per transaction: 0 when a read went
 * out (page_attr_cb resumes), 1 when none is needed, or a negative errno.
 */
static int fetch_attrs(struct efs_fs_op *op)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;
	struct efs_etcd_txn *t = NULL;
	size_t i;
	int r;

	st->naidx = 0;
	for (i = st->attr_from; i < st->attr_to && st->naidx < EFS_FS_PLUS_BATCH; i++) {
		if (needs_attr(op, i))
			st->aidx[st->naidx++] = i;
	}
	st->attr_scan = i;
	if (st->naidx == 0) {
		st->attr_from = i;
		return 1;
	}
	r = efs_etcd_txn_new(&t, 0);
	for (size_t k = 0; r == 0 && k < st->naidx; k++)
		r = efs_fs_txn_read_inode(op->fs, t, h->ents[st->aidx[k]].ino);
	r = efs_fs_read_txn(op->fs, t, r, page_attr_cb, op);
	return r < 0 ? r : 0;
}

/* fetch_attrs again from |attr_from| until every entry is read: resumes
 * the listing once none is left. */
static void attrs_next(struct efs_fs_op *op)
{
	int e = fetch_attrs(op);

	if (e < 0)
		efs_fs_op_resume_prepare(op, -EIO);
	else if (e == 1)
		efs_fs_op_resume_prepare(op, 0);
}

static void page_attr_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;

	if (r->err) {
		/* A read changes nothing: after a lost reply, read again. */
		efs_fs_op_note(op, r->err, "attribute read", r->message);
		if ((r->outcome_unknown || r->err == -ETIMEDOUT) &&
		    ++op->read_tries <= EFS_FS_RETRY_MAX) {
			int e = fetch_attrs(op);

			if (e >= 0) {
				efs_counter_inc(op->fs->m_retries);
				/* 1: cached meanwhile, nothing left to read. */
				if (e == 1)
					efs_fs_op_resume_prepare(op, 0);
				return;
			}
		}
		efs_fs_op_resume_prepare(op, -EIO);
		return;
	}
	for (size_t j = 0; j < resp->n_responses && j < st->naidx; j++) {
		size_t i = st->aidx[j];
		Etcdserverpb__RangeResponse *rr = NULL;
		Etcfs__Inode *rec = NULL;

		if (efs_etcd_txn_resp_range(resp, j, &rr) < 0 || rr->n_kvs == 0)
			continue;
		if (efs_meta_inode_decode(rr->kvs[0]->value.data, rr->kvs[0]->value.len, &rec,
					  NULL) < 0)
			continue;
		efs_meta_inode_to_stat(rec, h->ents[i].ino, op->fs->blksize, &h->ents[i].st);
		h->ents[i].has_attr = true;
		{
			/* Under a lock the record becomes the cached one. */
			struct efs_fs_inode *in = efs_fs_ifind(op->fs, h->ents[i].ino);

			if (in && (in->refs || in->nlookup) &&
			    efs_lock_held(op->fs->lc, in->ino) != EFS_LOCK_NONE &&
			    !(efs_fs_inode_valid(op->fs, in) &&
			      in->mod_rev >= rr->kvs[0]->mod_revision)) {
				efs_fs_inode_set(op->fs, in, rec, rr->kvs[0]->mod_revision, true);
				rec = NULL;
			}
		}
		efs_meta_record_free(rec);
	}
	st->attr_from = st->attr_scan;
	attrs_next(op);
}

static void plus_locks_done(struct efs_fs_op *op)
{
	struct dir_state *st = &dop_of(op)->st;

	if (st->pending || st->in_list)
		return;
	attrs_next(op);
}

static void plus_lock_cb(struct efs_lock_req *req, int status)
{
	struct plus_lock *pl = req->arg;
	struct efs_fs_op *op = pl->op;
	struct dir_state *st = &dop_of(op)->st;

	/* Without the locks the entries simply go out uncached. */
	pl->pinned = status == 0;
	if (status == 0)
		efs_fs_count_txn(op->fs, EFS_FS_ORIG_LOCK, EFS_FS_TXN_OK);
	for (size_t i = 0; status == 0 && i < req->n; i++) {
		struct efs_fs_inode *in = pl->in[i];
		const Mvccpb__KeyValue *kv = req->recs[i];
		Etcfs__Inode *rec = NULL;

		if (!in)
			continue;
		/* Newly taken: the transaction that took the lock read the
		 * record too, which is then the cached one (names cached
		 * under an older grant are void by their grant id). Without
		 * it (the lock was cached meanwhile, the inode is gone), what
		 * was cached before is read again (fetch_attrs). */
		if (kv && efs_meta_inode_decode(kv->value.data, kv->value.len, &rec, NULL) == 0) {
			if (efs_fs_inode_valid(op->fs, in) && in->mod_rev >= kv->mod_revision)
				efs_meta_record_free(rec);
			else
				efs_fs_inode_set(op->fs, in, rec, kv->mod_revision, true);
			continue;
		}
		in->epoch = 0;
	}
	st->pending--;
	plus_locks_done(op);
}

/* Takes shared locks on the entries [page_first, attr_to) not held yet,
 * then reads their records (fetch_attrs). */
static void plus_lock_page(struct efs_fs_op *op)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;
	struct efs_fs *fs = op->fs;
	struct plus_lock *pl = NULL;

	st->pending = 1; /* held until every request is out */
	for (size_t i = st->page_first; i < st->attr_to; i++) {
		uint64_t ino = h->ents[i].ino;
		struct plus_lock **nl;
		int r;

		if (efs_lock_held(fs->lc, ino) != EFS_LOCK_NONE || ino == h->ino)
			continue;
		if (!pl) {
			nl = efs_mem_realloc(st->locks, (st->nlocks + 1) * sizeof(*nl));
			if (!nl)
				break;
			st->locks = nl;
			pl = efs_mem_calloc(1, sizeof(*pl));
			if (!pl)
				break;
			pl->op = op;
			pl->lr.cb = plus_lock_cb;
			pl->lr.arg = pl;
			st->locks[st->nlocks++] = pl;
		}
		pl->in[pl->lr.n] = efs_fs_iget(fs, ino);
		if (pl->in[pl->lr.n])
			pl->in[pl->lr.n]->refs++;
		pl->lr.ino[pl->lr.n] = ino;
		pl->lr.mode[pl->lr.n] = EFS_LOCK_SHARED;
		pl->lr.n++;
		if (pl->lr.n < EFS_LOCK_REQ_MAX && i + 1 < st->attr_to)
			continue;
		st->pending++;
		r = efs_lock_acquire(fs->lc, &pl->lr);
		if (r == 1) {
			pl->pinned = true;
			st->pending--;
		} else if (r < 0) {
			st->pending--;
		}
		pl = NULL;
	}
	if (pl && pl->lr.n) {
		st->pending++;
		int r = efs_lock_acquire(fs->lc, &pl->lr);

		if (r == 1) {
			pl->pinned = true;
			st->pending--;
		} else if (r < 0) {
			st->pending--;
		}
	}
	st->pending--;
	plus_locks_done(op);
}

/* Unpins the page locks (they stay cached) and drops the entry refs. */
static void plus_unlock(struct efs_fs_op *op)
{
	struct dir_state *st = &dop_of(op)->st;

	for (size_t i = 0; i < st->nlocks; i++) {
		struct plus_lock *pl = st->locks[i];

		if (pl->pinned)
			efs_lock_put(op->fs->lc, &pl->lr);
		for (size_t j = 0; j < pl->lr.n; j++)
			efs_fs_iput(op->fs, pl->in[j]);
		efs_mem_free(pl);
	}
	efs_mem_free(st->locks);
	st->locks = NULL;
	st->nlocks = 0;
}

/*
 * A listing read whole, every page under the grant and mseq the last one
 * was read under (no name change of this node, nor of any other, between
 * its first page and its last) and put into the name cache as it came
 * (h->dc_put), is every name of the directory: the cache answers misses
 * too.
 */
static void listing_complete(struct efs_fs *fs, const struct efs_fs_handle *h,
			     struct efs_fs_inode *din, uint64_t gen, uint64_t mseq)
{
	if (!h->dc_put)
		return;
	for (size_t i = 0; i < h->nents; i++) {
		if (h->ents[i].dir_gen != gen || h->ents[i].dir_mseq != mseq)
			return;
	}
	efs_fs_dcache_set_complete(fs, din);
}

/* The name and dirent of a listing's |kv|: 0, or -1 when it is not a
 * dirent or does not decode. */
static int kv_dirent(struct efs_fs *fs, const Mvccpb__KeyValue *kv, struct efs_meta_key_info *info,
		     Etcfs__Dirent **de)
{
	if (efs_meta_key_parse(&fs->ns, kv->key.data, kv->key.len, info) < 0 ||
	    info->family != EFS_META_K_DIRENT)
		return -1;
	return efs_meta_dirent_decode(kv->value.data, kv->value.len, de, NULL) < 0 ? -1 : 0;
}

/* ---- A directory's names read for its lookups ---- */

/* Most names a read for lookups asks for (a larger directory's first
 * names are still put, without completeness). */
#define FILL_MAX 8192
/* Listings for lookups a grant may send again after one came back voided
 * (see fill_cb). */
#define FILL_VOIDS_MAX 4

struct dfill {
	struct efs_fs *fs;
	struct efs_fs_inode *din; /* referenced until the reply */
	uint64_t grant, rmseq;	  /* the directory's when the read left */
};

static void fill_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct dfill *f = arg;
	struct efs_fs *fs = f->fs;
	struct efs_fs_inode *din = f->din;
	/* Names this node added since are in the cache already: only other
	 * changes void the listing. So does an operation holding the
	 * directory now if it only adds a name (a create committing): its
	 * name goes into the cache when it ends, listed here or not. */
	const struct efs_fs_op *mx = din->mx_owner;
	bool adding = mx && mx->d->new_inode && efs_fs_dir_current(fs, din, f->grant);
	bool voided = din->rmseq != f->rmseq ||
		      !(adding || efs_fs_dcache_current(fs, din, f->grant, din->mseq));
	bool ok = !r->err && !voided;

	for (size_t i = 0; ok && i < resp->n_kvs; i++) {
		struct efs_meta_key_info info;
		Etcfs__Dirent *de = NULL;

		if (kv_dirent(fs, resp->kvs[i], &info, &de) < 0) {
			efs_meta_record_free(de);
			ok = false; /* a name it cannot read: not complete */
			break;
		}
		ok = efs_fs_dcache_put(fs, din, (const char *)info.name, info.name_len, de->ino,
				       de->type);
		efs_meta_record_free(de);
	}
	if (ok && !resp->more) {
		efs_fs_dcache_set_complete(fs, din);
	} else if (!r->err && voided && din->dc_fill_grant == f->grant) {
		/* Voided by a change of this node that overlapped it (the
		 * create that the lookup's miss was for, committing on its
		 * own because the cache was not whole yet): one listing per
		 * grant would leave the directory without delegation for the
		 * whole grant, so a few more may go. */
		if (din->dc_void_grant != f->grant) {
			din->dc_void_grant = f->grant;
			din->dc_voids = 0;
		}
		if (++din->dc_voids <= FILL_VOIDS_MAX)
			din->dc_fill_grant = 0;
	}
	efs_fs_iput(fs, din);
	efs_mem_free(f);
	fs->inflight--;
}

void efs_fs_dcache_fill(struct efs_fs *fs, struct efs_fs_inode *dir)
{
	uint64_t grant = efs_fs_grant(fs, dir);
	struct efs_etcd_range_opts o = {0};
	struct efs_meta_range rg;
	struct dfill *f;

	/* Not while names it made wait in the batch of delegated changes
	 * (batch.c): one the cache could not take would be missing. */
	if (!grant || dir->dc_fill_grant == grant || !dir->rec || !S_ISDIR(dir->rec->mode) ||
	    dir->mx_owner || efs_fs_dcache_complete(fs, dir) || dir->batched)
		return;
	if (efs_meta_range_ino(&fs->ns, EFS_META_K_DIRENT, dir->ino, &rg) < 0)
		return;
	f = efs_mem_calloc(1, sizeof(*f));
	if (!f)
		return;
	f->fs = fs;
	f->din = dir;
	f->grant = grant;
	f->rmseq = dir->rmseq;
	o.range_end = rg.end.buf;
	o.range_end_len = rg.end.len;
	o.limit = FILL_MAX;
	dir->refs++;
	dir->dc_fill_grant = grant;
	fs->inflight++; /* the fs outlives the reply (teardown waits for it) */
	if (efs_etcd_range(fs->c, rg.key.buf, rg.key.len, &o, NULL, fill_cb, f) < 0) {
		efs_fs_iput(fs, dir);
		efs_mem_free(f);
		fs->inflight--;
	}
}

/* ---- Locks and records taken ahead of lookups ---- */

/* A directory with fewer names is not read ahead. */
#define AHEAD_MIN 32
/* Most cached names one read ahead looks at for locks not held. */
#define AHEAD_SCAN 1024

struct ahead {
	struct efs_lock_req lr;
	struct efs_fs *fs;
	struct efs_fs_inode *dir; /* referenced */
	struct efs_fs_inode *in[EFS_LOCK_REQ_MAX];
};

static void ahead_send(struct efs_fs *fs, struct efs_fs_inode *dir, const uint64_t *ino, size_t n);

static void ahead_free(struct ahead *ah)
{
	struct efs_fs *fs = ah->fs;

	for (size_t i = 0; i < ah->lr.n; i++)
		efs_fs_iput(fs, ah->in[i]);
	ah->dir->ahead_inflight--;
	efs_fs_iput(fs, ah->dir);
	efs_mem_free(ah);
	fs->inflight--;
}

/*
 * A try that found a lock not free is tried again in halves, so that the
 * one a peer holds is found in a few transactions and left out (the
 * directory's name cache remembers it) while the others are taken.
 */
static void ahead_split(struct ahead *ah)
{
	struct efs_fs_dcache *dc = ah->dir->dc;
	size_t n = ah->lr.n, h = n / 2;

	if (!efs_fs_dcache_complete(ah->fs, ah->dir) || !efs_session_is_active(ah->fs->s))
		return;
	if (n == 1) {
		if (dc->nbusy < EFS_FS_AHEAD_BUSY)
			dc->busy[dc->nbusy++] = ah->lr.ino[0];
		return;
	}
	ahead_send(ah->fs, ah->dir, ah->lr.ino, h);
	ahead_send(ah->fs, ah->dir, ah->lr.ino + h, n - h);
}

static void ahead_cb(struct efs_lock_req *req, int status)
{
	struct ahead *ah = req->arg;
	struct efs_fs *fs = ah->fs;

	if (status == -EWOULDBLOCK)
		ahead_split(ah);
	if (status == 0) {
		efs_fs_count_txn(fs, EFS_FS_ORIG_LOCK, EFS_FS_TXN_OK);
		for (size_t i = 0; i < req->n; i++) {
			struct efs_fs_inode *in = ah->in[i];
			const Mvccpb__KeyValue *kv = req->recs[i];
			Etcfs__Inode *rec = NULL;

			if (!in || !kv ||
			    efs_meta_inode_decode(kv->value.data, kv->value.len, &rec, NULL) < 0)
				continue;
			if (efs_fs_inode_valid(fs, in) && in->mod_rev >= kv->mod_revision) {
				efs_meta_record_free(rec);
				continue;
			}
			efs_fs_inode_set(fs, in, rec, kv->mod_revision, true);
			efs_fs_ahead_keep(fs, in);
		}
		efs_lock_put(fs->lc, req);
	}
	ahead_free(ah);
}

static void ahead_send(struct efs_fs *fs, struct efs_fs_inode *dir, const uint64_t *ino, size_t n)
{
	struct ahead *ah = efs_mem_calloc(1, sizeof(*ah));
	int r;

	if (!ah)
		return;
	ah->fs = fs;
	ah->dir = dir;
	dir->refs++;
	dir->ahead_inflight++;
	fs->inflight++; /* the fs outlives the reply (teardown waits for it) */
	for (size_t i = 0; i < n; i++) {
		struct efs_fs_inode *in = efs_fs_iget(fs, ino[i]);

		if (!in)
			continue;
		in->refs++;
		ah->in[ah->lr.n] = in;
		ah->lr.ino[ah->lr.n] = ino[i];
		ah->lr.mode[ah->lr.n] = EFS_LOCK_SHARED;
		ah->lr.n++;
	}
	if (ah->lr.n == 0) {
		ahead_free(ah);
		return;
	}
	ah->lr.cb = ahead_cb;
	ah->lr.arg = ah;
	ah->lr.flags = EFS_LOCK_F_TRY;
	r = efs_lock_acquire(fs->lc, &ah->lr);
	if (r == 1)
		ahead_cb(&ah->lr, 0);
	else if (r < 0)
		ahead_free(ah);
}

static bool ahead_busy(const struct efs_fs_dcache *dc, uint64_t ino)
{
	for (size_t i = 0; i < dc->nbusy; i++)
		if (dc->busy[i] == ino)
			return true;
	return false;
}

void efs_fs_read_ahead(struct efs_fs *fs, struct efs_fs_inode *dir, uint64_t child)
{
	struct efs_fs_dcache *dc = dir->dc;
	uint64_t ino[EFS_LOCK_REQ_MAX];
	size_t n = 0, b = 0, seen = 0;

	/* One read ahead of a directory at a time: a second one would ask
	 * for the locks the first is taking, find them taken by this node,
	 * and leave them out as if a peer held them. */
	if (!fs->lc || dir->ahead_inflight || !efs_fs_dcache_complete(fs, dir) ||
	    dc->n < AHEAD_MIN)
		return;
	/* On the loop thread, under a lookup: a bounded look, continued by
	 * the next read ahead from where this one stopped. */
	for (size_t k = 0; k < dc->nbuckets && n < EFS_LOCK_REQ_MAX && seen < AHEAD_SCAN; k++) {
		b = (dc->ahead_from + k) % dc->nbuckets;
		for (struct efs_fs_dent *d = dc->b[b]; d && n < EFS_LOCK_REQ_MAX; d = d->next) {
			seen++;
			if (!d->ino || d->ino == child || d->ino == dir->ino ||
			    efs_lock_held(fs->lc, d->ino) != EFS_LOCK_NONE || ahead_busy(dc, d->ino))
				continue;
			ino[n++] = d->ino;
		}
	}
	dc->ahead_from = b;
	if (n)
		ahead_send(fs, dir, ino, n);
}

static void page_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;
	struct efs_fs_inode *din;
	bool cur;
	int e;

	if (r->err) {
		efs_fs_op_note(op, r->err, "listing read", r->message);
		efs_fs_op_resume_prepare(op, -EIO);
		return;
	}
	din = efs_fs_ifind(op->fs, h->ino);
	cur = efs_fs_dcache_current(op->fs, din, st->fetch_gen, st->fetch_mseq);
	if (h->nents == 0)
		h->dc_put = true; /* a first page: a listing from the start */
	if (!cur)
		h->dc_put = false;
	for (size_t i = 0; i < resp->n_kvs; i++) {
		struct efs_meta_key_info info;
		Etcfs__Dirent *de = NULL;

		if (kv_dirent(op->fs, resp->kvs[i], &info, &de) < 0) {
			efs_log_debug("fs: bad dirent in directory %llu, skipped",
				      (unsigned long long)h->ino);
			h->dc_put = false;
			efs_meta_record_free(de);
			continue;
		}
		e = ents_add(h, info.name, info.name_len, de->ino, de->type);
		if (e == 0 && cur &&
		    !efs_fs_dcache_put(op->fs, din, (const char *)info.name, info.name_len, de->ino,
				       de->type))
			h->dc_put = false;
		efs_meta_record_free(de);
		if (e < 0) {
			efs_fs_op_resume_prepare(op, e);
			return;
		}
		h->ents[h->nents - 1].dir_mseq = st->fetch_mseq;
		h->ents[h->nents - 1].dir_gen = st->fetch_gen;
	}
	if (!resp->more || resp->n_kvs == 0) {
		h->complete = true;
		if (cur)
			listing_complete(op->fs, h, din, st->fetch_gen, st->fetch_mseq);
	}
	/* readdirplus prepares the entries when it is about to emit them. */
	efs_fs_op_resume_prepare(op, 0);
}

static int fetch_page(struct efs_fs_op *op)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;
	struct efs_fs_inode *din = efs_fs_ifind(op->fs, h->ino);
	struct efs_meta_range rg;
	struct efs_etcd_range_opts o = {0};
	int r;

	/* A name change of this node that ends after the read left makes the
	 * page's names suspect: seen at emit time through the changed mseq. */
	st->fetch_mseq = din ? din->mseq : 0;
	st->fetch_gen = din ? efs_fs_grant(op->fs, din) : 0;

	if (h->nents == 0)
		r = efs_meta_range_ino(&op->fs->ns, EFS_META_K_DIRENT, h->ino, &rg);
	else
		r = efs_meta_range_dirents_after(&op->fs->ns, h->ino, h->ents[h->nents - 1].name,
						 strlen(h->ents[h->nents - 1].name), &rg);
	if (r < 0)
		return r;
	o.range_end = rg.end.buf;
	o.range_end_len = rg.end.len;
	o.limit = EFS_FS_DIR_PAGE;
	return efs_etcd_range(op->fs->c, rg.key.buf, rg.key.len, &o, NULL, page_cb, op);
}

/*
 * True when the listing of |ent| still stands for the directory's names:
 * its lock has been held without a break and this node changed no name in
 * it since the page was asked for, and no name change is in flight.
 */
static bool entry_current(struct efs_fs *fs, const struct efs_fs_handle *h,
			  const struct efs_fs_dirent_ent *ent)
{
	const struct efs_fs_inode *din = efs_fs_ifind(fs, h->ino);

	return din && !din->mx_owner && din->mseq == ent->dir_mseq &&
	       efs_fs_grant_current(fs, din, ent->dir_gen) && efs_fs_inode_valid(fs, din);
}

/* Adds one entry at position |pos| to the reply buffer; false when full. */
static bool emit(struct efs_fs_op *op, const char *name, uint64_t ino, uint32_t type,
		 const struct efs_fs_dirent_ent *ent, bool dot)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs *fs = op->fs;
	size_t room = dop->size - st->used, need;

	if (!st->plus) {
		struct stat s;

		memset(&s, 0, sizeof(s));
		s.st_ino = ino;
		s.st_mode = (mode_t)(type << 12);
		need = fuse_add_direntry(op->rq->req, st->buf + st->used, room, name, &s, st->pos + 1);
		if (need > room)
			return false;
	} else {
		struct fuse_entry_param e;
		struct efs_fs_inode *in = dot ? NULL : efs_fs_ifind(fs, ino);

		memset(&e, 0, sizeof(e));
		if (ent && !entry_current(fs, dop->h, ent)) {
			/* The name may be gone (this node renamed or unlinked it,
			 * or the lock was let go since the page was read): list
			 * it, but give the kernel no dentry to cache. */
			e.attr.st_ino = ino;
			e.attr.st_mode = (mode_t)(type << 12);
		} else if (in && efs_fs_inode_valid(fs, in) && in->rec) {
			efs_fs_fill_entry(fs, op->ino, name, strlen(name), ino, in->rec, true, &e);
		} else if (ent && ent->has_attr) {
			e.ino = ino;
			e.attr = ent->st;
		} else {
			e.attr.st_ino = ino;
			e.attr.st_mode = (mode_t)(type << 12);
		}
		if (dot)
			e.ino = 0;
		need = fuse_add_direntry_plus(op->rq->req, st->buf + st->used, room, name, &e,
					      st->pos + 1);
		if (need > room)
			return false;
		if (e.ino)
			efs_fs_inode_ref_kernel(fs, ino);
	}
	st->used += need;
	st->pos++;
	return true;
}

/*
 * True when readdirplus should read the names from entry |i| on again
 * before emitting it: the page holding it was read before the directory's
 * lock was re-taken (e.g. upgraded by a relatime update) or before a name
 * change of this node, so it would go out without a dentry, but neither
 * it nor any entry after it was handed to the kernel yet: reading them
 * again changes no offset the kernel knows. Once per operation, and only
 * when a fresh read can be current (no name change in flight, lock held).
 */
static bool needs_reread(struct efs_fs_op *op, size_t i)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	const struct efs_fs_dirent_ent *ent = &dop->h->ents[i];
	const struct efs_fs_inode *din = efs_fs_ifind(op->fs, dop->h->ino);

	if (!st->plus || st->reread || entry_current(op->fs, dop->h, ent))
		return false;
	/* A seek past unsent names (lseek of the directory) may have sent later ones. */
	for (size_t k = i; k < dop->h->nents; k++) {
		if (dop->h->ents[k].sent)
			return false;
	}
	return din && !din->mx_owner && efs_fs_inode_valid(op->fs, din);
}

/* Forgets the entries from |i| on, so that the next page read continues
 * after entry i - 1 with the directory's current mseq and lock grant. */
static void drop_from(struct efs_fs_op *op, size_t i)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;

	for (size_t k = i; k < h->nents; k++)
		efs_mem_free(h->ents[k].name);
	h->nents = i;
	h->complete = false;
	h->dc_put = false; /* read again: no completeness from this handle */
	if (st->prep_to > i)
		st->prep_to = i;
	st->reread = true;
}

/* True when readdirplus must lock and read entry |i| before emitting it:
 * it may be given a dentry but its record is not cached under a lock. */
static bool needs_prep(struct efs_fs_op *op, size_t i)
{
	struct dir_op *dop = dop_of(op);
	const struct efs_fs_dirent_ent *ent = &dop->h->ents[i];
	const struct efs_fs_inode *in = efs_fs_ifind(op->fs, ent->ino);

	if (!entry_current(op->fs, dop->h, ent) || ent->ino == dop->h->ino)
		return false;
	return !(in && efs_fs_inode_valid(op->fs, in) && in->rec);
}

/*
 * Prepares the entries from |i| on that fit in what is left of the reply
 * (at most EFS_FS_DIR_PAGE): pins their inodes for the rest of the
 * operation, takes the shared locks not held yet and reads their records,
 * so that each goes out with a cacheable dentry. Entries prepared by
 * an earlier reply lost their inodes when it ended, hence once per reply.
 * Returns 1 when the listing resumes later, 0 when nothing needs doing.
 */
static int prep_entries(struct efs_fs_op *op, size_t i)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;
	struct efs_fs_inode **np;
	struct fuse_entry_param dummy;
	size_t end = i, used = st->used;

	memset(&dummy, 0, sizeof(dummy));
	while (end < h->nents && end - i < EFS_FS_DIR_PAGE) {
		size_t need = fuse_add_direntry_plus(op->rq->req, NULL, 0, h->ents[end].name, &dummy, 0);

		if (used + need > dop->size)
			break;
		used += need;
		end++;
	}
	st->prep_to = end > i ? end : i + 1;
	if (end == i)
		return 0;
	np = efs_mem_realloc(st->pins, (st->npins + (end - i)) * sizeof(*np));
	if (!np)
		return 0; /* the entries simply go out uncached */
	st->pins = np;
	for (size_t k = i; k < end; k++) {
		struct efs_fs_inode *in = efs_fs_iget(op->fs, h->ents[k].ino);

		if (!in)
			continue;
		in->refs++;
		st->pins[st->npins++] = in;
	}
	st->page_first = i;
	st->attr_from = i;
	st->attr_to = end;
	st->in_list = true;
	plus_lock_page(op);
	st->in_list = false;
	/* Locks all cached already: read the records they lack now (none: the
	 * entries go out at once). Should the read not go out, the entries go
	 * out uncached. */
	if (st->pending == 0 && fetch_attrs(op) != 0)
		return 0;
	return 1;
}

/* The listing is the prepare step: it waits for pages of names and for
 * the locks and records of the entries readdirplus sends, and answers. */
static int dir_list(struct efs_fs_op *op)
{
	struct dir_op *dop = dop_of(op);
	struct dir_state *st = &dop_of(op)->st;
	struct efs_fs_handle *h = dop->h;
	bool at_end = false;
	int r;

	if (efs_fs_handle_check(op->fs, h) < 0)
		return -EIO;
	if (!st->started) {
		st->started = true;
		if (dop->off == 0) {
			for (size_t i = 0; i < h->nents; i++)
				efs_mem_free(h->ents[i].name);
			h->nents = 0;
			h->complete = false;
		}
		st->pos = dop->off;
		st->buf = efs_mem_malloc(dop->size ? dop->size : 1);
		if (!st->buf)
			return -ENOMEM;
	}
	for (;;) {
		long i = efs_fs_dir_index(st->pos, h->nents);
		bool ok;

		at_end = false;
		if (i == -1) {
			ok = emit(op, ".", h->ino, DT_DIR, NULL, true);
		} else if (i == -2) {
			ok = emit(op, "..", h->parent, DT_DIR, NULL, true);
		} else if ((size_t)i >= h->nents) {
			at_end = h->complete;
			if (h->complete)
				break;
			r = fetch_page(op);
			if (r < 0)
				return r == -ENOMEM ? r : -EIO;
			return EFS_FS_WAIT;
		} else {
			struct efs_fs_dirent_ent *e = &h->ents[i];

			if (needs_reread(op, (size_t)i)) {
				drop_from(op, (size_t)i);
				continue;
			}
			if (st->plus && (size_t)i >= st->prep_to && needs_prep(op, (size_t)i) &&
			    prep_entries(op, (size_t)i) == 1)
				return EFS_FS_WAIT;
			ok = emit(op, e->name, e->ino, e->type, e, false);
			if (ok)
				e->sent = true;
		}
		if (!ok)
			break;
	}
	efs_fs_rq_buf(op->rq, st->buf, st->used);
	/* Once the listing reached its end: the update takes the directory's
	 * lock exclusive, which would leave the names read before it without
	 * dentries for the rest of the listing. */
	if (at_end)
		efs_fs_touch_atime(op->fs, op->ino, efs_fs_rec(op, op->ino));
	return EFS_FS_DONE;
}

static int readdir_plan(struct efs_fs_op *op)
{
	struct dir_op *dop = dop_of(op);

	if (efs_fs_handle_check(op->fs, dop->h) < 0)
		return -EIO;
	if (op->loads_done == 0)
		return efs_fs_want(op, op->ino, EFS_LOCK_SHARED);
	return EFS_FS_CONT;
}

static void dir_state_free(struct efs_fs_op *op)
{
	struct dir_state *st = &dop_of(op)->st;

	plus_unlock(op);
	for (size_t i = 0; i < st->npins; i++)
		efs_fs_iput(op->fs, st->pins[i]);
	efs_mem_free(st->pins);
	efs_mem_free(st->buf);
}

static void readdir_done(struct efs_fs_op *op)
{
}

/* The listing is all prepare: it answers from there. */
#define LIST_DESC(var, opcode)                                                                     \
	static const struct efs_fs_opdesc var = {                                                  \
		.code = opcode,                                                                    \
		.size = sizeof(struct dir_op),                                                     \
		.plan = readdir_plan,                                                              \
		.prepare = dir_list,                                                               \
		.build = efs_fs_no_build,                                                          \
		.done = readdir_done,                                                              \
		.release = dir_state_free,                                                         \
	}

LIST_DESC(readdir_desc, EFS_FS_OP_READDIR);
LIST_DESC(readdirplus_desc, EFS_FS_OP_READDIRPLUS);

static void readdir_start(fuse_req_t req, const struct efs_fs_opdesc *d, fuse_ino_t ino,
			  size_t size, off_t off, struct fuse_file_info *fi, bool plus)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_op *op = efs_fs_op_new(fs, req, d);
	struct dir_op *dop = dop_of(op);

	if (!op) {
		efs_fs_reply_now(fs, req, d->code, -ENOMEM);
		return;
	}
	op->ino = ino;
	dop->h = efs_fs_fh_of(fi);
	dop->size = size;
	dop->off = off;
	if (!dop->h) {
		efs_fs_op_finish(op, -EBADF);
		return;
	}
	dop->st.plus = plus;
	efs_fs_op_run(op);
}

void efs_fs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	readdir_start(req, &readdir_desc, ino, size, off, fi, false);
}

void efs_fs_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			struct fuse_file_info *fi)
{
	readdir_start(req, &readdirplus_desc, ino, size, off, fi, true);
}

void efs_fs_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_handle *h = efs_fs_fh_of(fi);

	if (h)
		efs_fs_handle_free(fs, h);
	efs_fs_reply_now(fs, req, EFS_FS_OP_RELEASEDIR, 0);
}

static void fsyncdir_synced(void *arg, int status)
{
	fuse_req_t req = arg;

	efs_fs_reply_now(fuse_req_userdata(req), req, EFS_FS_OP_FSYNCDIR, status < 0 ? status : 0);
}

void efs_fs_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	int r = efs_fs_handle_check(fs, efs_fs_fh_of(fi));

	(void)ino;
	(void)datasync;
	/* Every namespace change commits before its reply, except delegated
	 * ones (batch.c): they are durable once the batch is. */
	if (r == 0) {
		r = efs_fs_batch_sync(fs, fsyncdir_synced, req);
		if (r == 0)
			return;
		if (r == 1)
			r = 0;
	}
	efs_fs_reply_now(fs, req, EFS_FS_OP_FSYNCDIR, r);
}
