/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The inode cache: inode number -> record, its mod_revision and the
 * kernel's lookup count. A record is trusted only while this node holds a
 * lock on the inode and no session loss happened since it was read;
 * entries live while the kernel, a handle or an operation references them.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "fs/fs-int.h"
#include "kchan/inval.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

#define HASH_INIT 1024

static size_t hash_ino(uint64_t ino, size_t size)
{
	ino ^= ino >> 33;
	ino *= 0xff51afd7ed558ccdull;
	ino ^= ino >> 33;
	return (size_t)(ino & (size - 1));
}

int efs_fs_icache_init(struct efs_fs *fs)
{
	fs->htab = efs_mem_calloc(HASH_INIT, sizeof(*fs->htab));
	if (!fs->htab)
		return -ENOMEM;
	fs->hsize = HASH_INIT;
	fs->ninodes = 0;
	return 0;
}

static size_t hash_name(const char *s, size_t len, size_t size)
{
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < len; i++) {
		h ^= (uint8_t)s[i];
		h *= 1099511628211ull;
	}
	return (size_t)(h & (size - 1));
}

void efs_fs_dcache_clear(struct efs_fs_inode *dir)
{
	struct efs_fs_dcache *dc = dir->dc;

	if (!dc)
		return;
	for (size_t i = 0; i < dc->nbuckets; i++) {
		struct efs_fs_dent *d = dc->b[i];

		while (d) {
			struct efs_fs_dent *next = d->next;

			efs_mem_free(d);
			d = next;
		}
	}
	efs_mem_free(dc->b);
	efs_mem_free(dc);
	dir->dc = NULL;
}

static bool dcache_valid(struct efs_fs *fs, struct efs_fs_inode *dir)
{
	return dir->dc && efs_fs_grant_current(fs, dir, dir->dc->gen) && efs_fs_inode_valid(fs, dir) &&
	       dir->rec && S_ISDIR(dir->rec->mode);
}

int efs_fs_dcache_get(struct efs_fs *fs, struct efs_fs_inode *dir, const char *name, size_t len,
		      uint64_t *ino, uint32_t *type)
{
	if (!dcache_valid(fs, dir))
		return 0;
	for (struct efs_fs_dent *d = dir->dc->b[hash_name(name, len, dir->dc->nbuckets)]; d;
	     d = d->next) {
		if (d->len == len && memcmp(d->name, name, len) == 0) {
			*ino = d->ino;
			*type = d->type;
			return 1;
		}
	}
	if (dir->dc->complete) {
		*ino = 0;
		*type = 0;
		return 1;
	}
	return 0;
}

bool efs_fs_dir_current(struct efs_fs *fs, struct efs_fs_inode *dir, uint64_t gen)
{
	return dir && efs_fs_grant_current(fs, dir, gen) && efs_fs_inode_valid(fs, dir) &&
	       dir->rec && S_ISDIR(dir->rec->mode);
}

bool efs_fs_dcache_current(struct efs_fs *fs, struct efs_fs_inode *dir, uint64_t gen,
			   uint64_t mseq)
{
	return dir && !dir->mx_owner && dir->mseq == mseq && efs_fs_dir_current(fs, dir, gen);
}

bool efs_fs_dcache_complete(struct efs_fs *fs, struct efs_fs_inode *dir)
{
	return dcache_valid(fs, dir) && dir->dc->complete;
}

static struct efs_fs_dcache *dcache_new(struct efs_fs *fs, struct efs_fs_inode *dir);

/* The caller read every name under the current grant. A listing of an
 * empty directory put no name, so the cache may not exist yet (or be one
 * of an older grant): it starts here, empty and complete. */
void efs_fs_dcache_set_complete(struct efs_fs *fs, struct efs_fs_inode *dir)
{
	if (dir->dc && !efs_fs_grant_current(fs, dir, dir->dc->gen))
		efs_fs_dcache_clear(dir);
	if (!dir->dc && efs_fs_dir_current(fs, dir, dir->grant))
		dcache_new(fs, dir);
	if (dcache_valid(fs, dir) && dir->dc->n < EFS_FS_DCACHE_MAX)
		dir->dc->complete = true;
}

void efs_fs_dcache_incomplete(struct efs_fs *fs, uint64_t dir)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, dir);

	if (in && in->dc)
		in->dc->complete = false;
}

/* Doubles the buckets of |dc| when its chains grow long (best effort). */
static void dcache_grow(struct efs_fs_dcache *dc)
{
	size_t nb = dc->nbuckets * 2;
	struct efs_fs_dent **b;

	if (dc->n < dc->nbuckets * 2)
		return;
	b = efs_mem_calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i < dc->nbuckets; i++) {
		struct efs_fs_dent *d = dc->b[i];

		while (d) {
			struct efs_fs_dent *next = d->next;
			size_t h = hash_name(d->name, d->len, nb);

			d->next = b[h];
			b[h] = d;
			d = next;
		}
	}
	efs_mem_free(dc->b);
	dc->b = b;
	dc->nbuckets = nb;
}

static struct efs_fs_dcache *dcache_new(struct efs_fs *fs, struct efs_fs_inode *dir)
{
	struct efs_fs_dcache *dc = efs_mem_calloc(1, sizeof(*dc));

	if (!dc)
		return NULL;
	dc->nbuckets = 256;
	dc->b = efs_mem_calloc(dc->nbuckets, sizeof(*dc->b));
	if (!dc->b) {
		efs_mem_free(dc);
		return NULL;
	}
	dc->gen = efs_fs_grant(fs, dir);
	dir->dc = dc;
	return dc;
}

void efs_fs_dcache_new_empty(struct efs_fs *fs, struct efs_fs_inode *dir)
{
	if (!efs_fs_inode_valid(fs, dir) || !dir->rec || !S_ISDIR(dir->rec->mode))
		return;
	efs_fs_dcache_clear(dir);
	if (dcache_new(fs, dir))
		dir->dc->complete = true;
}

bool efs_fs_dcache_put(struct efs_fs *fs, struct efs_fs_inode *dir, const char *name, size_t len,
		       uint64_t ino, uint32_t type)
{
	struct efs_fs_dcache *dc = dir->dc;
	struct efs_fs_dent *d;
	size_t h;

	if (!efs_fs_inode_valid(fs, dir)) {
		/* Its record is being read again (after an unknown outcome,
		 * an upgrade) under the same grant: the cache is valid again
		 * after that, so what it says of this name goes, and it is no
		 * longer complete. */
		efs_fs_dcache_forget(fs, dir->ino, name, len);
		return false;
	}
	if (dc && !efs_fs_grant_current(fs, dir, dc->gen)) {
		efs_fs_dcache_clear(dir);
		dc = NULL;
	}
	if (!dc) {
		dc = dcache_new(fs, dir);
		if (!dc)
			return false;
	}
	h = hash_name(name, len, dc->nbuckets);
	for (struct efs_fs_dent **pp = &dc->b[h]; (d = *pp); pp = &d->next) {
		if (d->len == len && memcmp(d->name, name, len) == 0) {
			if (ino == 0 && dc->complete) {
				/* absent names of a complete cache are not kept */
				*pp = d->next;
				efs_mem_free(d);
				dc->n--;
				return true;
			}
			d->ino = ino;
			d->type = type;
			return true;
		}
	}
	if (ino == 0 && dc->complete)
		return true;
	if (dc->n >= EFS_FS_DCACHE_MAX) {
		dc->complete = false; /* a name it cannot take */
		return false;
	}
	d = efs_mem_malloc(sizeof(*d) + len + 1);
	if (!d) {
		dc->complete = false;
		return false; /* a cache: the next lookup reads etcd */
	}
	d->ino = ino;
	d->type = type;
	d->len = len;
	memcpy(d->name, name, len);
	d->name[len] = 0;
	d->next = dc->b[h];
	dc->b[h] = d;
	dc->n++;
	dcache_grow(dc);
	return true;
}

void efs_fs_dcache_forget(struct efs_fs *fs, uint64_t dir, const char *name, size_t len)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, dir);
	struct efs_fs_dent **pp;

	if (!in || !in->dc)
		return;
	in->dc->complete = false; /* the name is unknown now, not absent */
	for (pp = &in->dc->b[hash_name(name, len, in->dc->nbuckets)]; *pp; pp = &(*pp)->next) {
		if ((*pp)->len == len && memcmp((*pp)->name, name, len) == 0) {
			struct efs_fs_dent *d = *pp;

			*pp = d->next;
			efs_mem_free(d);
			in->dc->n--;
			return;
		}
	}
}

/* ---- The clients' hooks ---- */

void efs_fs_ihooks_add(struct efs_fs *fs, const struct efs_fs_inode_hooks *h)
{
	size_t i = 0;

	while (i < EFS_FS_NIHOOKS && fs->ihooks[i])
		i++;
	assert(i < EFS_FS_NIHOOKS);
	if (i < EFS_FS_NIHOOKS)
		fs->ihooks[i] = h;
}

void efs_fs_ihooks_del(struct efs_fs *fs, const struct efs_fs_inode_hooks *h)
{
	for (size_t i = 0; i < EFS_FS_NIHOOKS; i++) {
		if (fs->ihooks[i] == h)
			fs->ihooks[i] = NULL;
	}
}

/* Runs the statement that follows for each registered table with |fn|. */
#define for_each_ihook(fs, hk, fn)                        \
	for (size_t i_ = 0; i_ < EFS_FS_NIHOOKS; i_++)    \
		if (!((hk) = (fs)->ihooks[i_]) || !(hk)->fn) \
			;                                 \
		else

static void inode_free(struct efs_fs *fs, struct efs_fs_inode *in)
{
	const struct efs_fs_inode_hooks *hk;

	efs_fs_dcache_clear(in);
	efs_fs_forget_kpages(fs, in);
	for_each_ihook (fs, hk, freed)
		hk->freed(fs, in);
	if (in->rec)
		protobuf_c_message_free_unpacked(&in->rec->base, efs_mem_protobuf());
	efs_mem_free(in);
}

void efs_fs_ahead_keep(struct efs_fs *fs, struct efs_fs_inode *in)
{
	struct efs_fs_inode *old;

	if (!fs->ahead) {
		fs->ahead = efs_mem_calloc(EFS_FS_AHEAD_MAX, sizeof(*fs->ahead));
		if (!fs->ahead)
			return;
	}
	old = fs->ahead[fs->ahead_pos];
	in->refs++;
	fs->ahead[fs->ahead_pos] = in;
	fs->ahead_pos = (fs->ahead_pos + 1) % EFS_FS_AHEAD_MAX;
	efs_fs_iput(fs, old);
}

void efs_fs_icache_done(struct efs_fs *fs)
{
	efs_mem_free(fs->ahead); /* its inodes go with the table below */
	fs->ahead = NULL;
	if (!fs->htab)
		return;
	for (size_t i = 0; i < fs->hsize; i++) {
		struct efs_fs_inode *in = fs->htab[i];

		while (in) {
			struct efs_fs_inode *next = in->hnext;

			inode_free(fs, in);
			in = next;
		}
	}
	efs_mem_free(fs->htab);
	fs->htab = NULL;
	fs->hsize = fs->ninodes = 0;
}

struct efs_fs_inode *efs_fs_ifind(struct efs_fs *fs, uint64_t ino)
{
	for (struct efs_fs_inode *in = fs->htab[hash_ino(ino, fs->hsize)]; in; in = in->hnext)
		if (in->ino == ino)
			return in;
	return NULL;
}

static void grow(struct efs_fs *fs)
{
	size_t nsize = fs->hsize * 2;
	struct efs_fs_inode **nt = efs_mem_calloc(nsize, sizeof(*nt));

	if (!nt)
		return; /* longer chains, still correct */
	for (size_t i = 0; i < fs->hsize; i++) {
		struct efs_fs_inode *in = fs->htab[i];

		while (in) {
			struct efs_fs_inode *next = in->hnext;
			size_t h = hash_ino(in->ino, nsize);

			in->hnext = nt[h];
			nt[h] = in;
			in = next;
		}
	}
	efs_mem_free(fs->htab);
	fs->htab = nt;
	fs->hsize = nsize;
}

struct efs_fs_inode *efs_fs_iget(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	size_t h;

	if (in)
		return in;
	in = efs_mem_calloc(1, sizeof(*in));
	if (!in)
		return NULL;
	in->ino = ino;
	efs_list_init(&in->mx_waiters);
	if (fs->ninodes + 1 > fs->hsize)
		grow(fs);
	h = hash_ino(ino, fs->hsize);
	in->hnext = fs->htab[h];
	fs->htab[h] = in;
	fs->ninodes++;
	return in;
}

static void maybe_drop(struct efs_fs *fs, struct efs_fs_inode *in)
{
	struct efs_fs_inode **pp;

	if (in->nlookup || in->opens || in->refs || in->mx_owner || !efs_list_empty(&in->mx_waiters))
		return;
	/* The root stays: the kernel never looks it up. */
	if (in->ino == EFS_META_ROOT_INO)
		return;
	for (pp = &fs->htab[hash_ino(in->ino, fs->hsize)]; *pp; pp = &(*pp)->hnext) {
		if (*pp == in) {
			*pp = in->hnext;
			fs->ninodes--;
			inode_free(fs, in);
			return;
		}
	}
}

void efs_fs_iput(struct efs_fs *fs, struct efs_fs_inode *in)
{
	if (!in)
		return;
	if (in->refs)
		in->refs--;
	maybe_drop(fs, in);
}

uint64_t efs_fs_grant(const struct efs_fs *fs, const struct efs_fs_inode *in)
{
	return efs_lock_grant(fs->lc, in->ino);
}

bool efs_fs_grant_current(const struct efs_fs *fs, const struct efs_fs_inode *in, uint64_t grant)
{
	return grant != 0 && grant == efs_lock_grant(fs->lc, in->ino);
}

bool efs_fs_inode_valid(const struct efs_fs *fs, const struct efs_fs_inode *in)
{
	if (!in || in->epoch == 0 || in->epoch != fs->epoch)
		return false;
	if (!in->rec && !in->gone)
		return false;
	/* Not merely while *a* lock is held: a release and a new hold in
	 * between (a recall, a downgrade, an upgrade that yielded) let a peer
	 * change the record. */
	return efs_fs_grant_current(fs, in, in->grant);
}

void efs_fs_inode_set(struct efs_fs *fs, struct efs_fs_inode *in, Etcfs__Inode *rec,
		      int64_t mod_rev, bool trusted)
{
	const struct efs_fs_inode_hooks *hk;

	if (in->rec)
		protobuf_c_message_free_unpacked(&in->rec->base, efs_mem_protobuf());
	in->rec = rec;
	in->gone = rec == NULL;
	in->mod_rev = mod_rev;
	in->epoch = trusted ? fs->epoch : 0;
	in->grant = trusted ? efs_fs_grant(fs, in) : 0;
	if (!rec)
		return;
	for_each_ihook (fs, hk, reloaded)
		hk->reloaded(fs, in); /* pending fields stay in the merged view */
}

void efs_fs_inode_dropped(struct efs_fs *fs, uint64_t ino)
{
	const struct efs_fs_inode_hooks *hk;

	for_each_ihook (fs, hk, dropped)
		hk->dropped(fs, ino);
}

void efs_fs_inode_ref_kernel(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_iget(fs, ino);

	/* Without memory the count is lost: the entry is then simply dropped
	 * early and re-read on the next use. */
	if (in)
		in->nlookup++;
}

static void forget_one(struct efs_fs *fs, uint64_t ino, uint64_t n)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);

	if (!in)
		return;
	in->nlookup = in->nlookup > n ? in->nlookup - n : 0;
	maybe_drop(fs, in);
}

void efs_fs_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_rq rq;

	efs_fs_rq_start(&rq, fs, req, EFS_FS_OP_FORGET);
	forget_one(fs, ino, nlookup);
	efs_fs_rq_none(&rq);
}

void efs_fs_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	struct efs_fs_rq rq;

	/* One request, counted as the |count| forgets it carries. */
	efs_fs_rq_start(&rq, fs, req, EFS_FS_OP_FORGET);
	if (count > 1)
		efs_counter_add(fs->m_ops[EFS_FS_OP_FORGET], count - 1);
	for (size_t i = 0; i < count; i++)
		forget_one(fs, forgets[i].ino, forgets[i].nlookup);
	efs_fs_rq_none(&rq);
}

/* ---- Pages the kernel may cache ---- */

/* One invalidation of a page-cached inode's pages (a suspension, the cap). */
struct kinval {
	struct efs_inval_req req;
	struct efs_fs *fs;
	bool suspension; /* counts toward the suspension's round */
};

static void kinval_done(struct efs_inval_req *req, int status)
{
	struct kinval *v = req->arg;
	struct efs_fs *fs = v->fs;
	bool susp = v->suspension;

	if (status < 0 && status != -ECANCELED && status != -ENODEV && status != -EBADF)
		efs_log_warn("fs: dropping inode %" PRIu64 "'s kernel pages: %s", req->ino,
			     strerror(-status));
	efs_mem_free(v);
	if (susp && --fs->susp_pending == 0 && fs->susp_start_ns) {
		uint64_t ns = efs_clock_mono_ns() - fs->susp_start_ns;

		efs_gauge_set(fs->m_susp_inval_ms, (double)ns / 1e9);
		efs_log_info("fs: the kernel dropped the pages of %" PRIu64
			     " files in %.1f ms (session not active)",
			     fs->susp_count, (double)ns / 1e6);
		fs->susp_start_ns = 0;
	}
}

/* Takes |in| off the page-cached list and asks the kernel to drop its
 * pages (and attributes); best effort, off the loop. */
static void kpages_drop(struct efs_fs *fs, struct efs_fs_inode *in, bool suspension)
{
	struct kinval *v;

	efs_fs_forget_kpages(fs, in);
	if (!fs->inval)
		return;
	v = efs_mem_calloc(1, sizeof(*v));
	if (!v) {
		efs_log_err("fs: no memory to drop inode %" PRIu64 "'s kernel pages", in->ino);
		return;
	}
	v->fs = fs;
	v->suspension = suspension;
	v->req.kind = EFS_INVAL_INODE;
	v->req.cls = EFS_INVAL_BEST_EFFORT;
	v->req.ino = in->ino;
	v->req.off = 0;
	v->req.len = 0;
	v->req.cb = kinval_done;
	v->req.arg = v;
	if (efs_inval_submit(fs->inval, &v->req) < 0) {
		efs_mem_free(v);
		return;
	}
	if (suspension) {
		if (!fs->susp_start_ns) {
			fs->susp_start_ns = efs_clock_mono_ns();
			fs->susp_count = 0;
		}
		fs->susp_pending++;
		fs->susp_count++;
		efs_counter_inc(fs->m_susp_invals);
	}
}

void efs_fs_forget_kpages(struct efs_fs *fs, struct efs_fs_inode *in)
{
	if (!efs_list_linked(&in->klink))
		return;
	efs_list_del(&in->klink);
	fs->nkpages--;
	efs_gauge_set(fs->m_kpages, (double)fs->nkpages);
}

void efs_fs_note_kpages(struct efs_fs *fs, struct efs_fs_inode *in)
{
	if (!fs->se || !fs->inval)
		return;
	if (!efs_session_is_active(fs->s)) {
		/* A reply that left the loop while the session suspends: the
		 * suspension's round may already have passed this inode. */
		kpages_drop(fs, in, true);
		return;
	}
	if (efs_list_linked(&in->klink)) {
		efs_list_del(&in->klink);
		efs_list_add_tail(&fs->kpages, &in->klink);
		return;
	}
	efs_list_add_tail(&fs->kpages, &in->klink);
	fs->nkpages++;
	while (fs->nkpages > fs->max_kpages) {
		struct efs_fs_inode *old =
			efs_list_entry(efs_list_first(&fs->kpages), struct efs_fs_inode, klink);

		kpages_drop(fs, old, false);
		efs_counter_inc(fs->m_kpages_evicted);
	}
	efs_gauge_set(fs->m_kpages, (double)fs->nkpages);
}

/* Drops the pages of every inode the kernel may cache, as one round of a
 * suspension (timed and counted). */
void efs_fs_kpages_drop_all(struct efs_fs *fs)
{
	struct efs_list *n;

	while ((n = efs_list_first(&fs->kpages)))
		kpages_drop(fs, efs_list_entry(n, struct efs_fs_inode, klink), true);
	efs_gauge_set(fs->m_kpages, 0);
}
