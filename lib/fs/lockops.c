/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which lock ops an inode's lock uses, the lock ops of directories, and
 * the kernel's entries each directory has handed out.
 *
 * Kinds: regular files (their ops are the data path's, file/lockops.c)
 * and directories. The lock cache asks the classifier here when it
 * prepares a release; it never learns what an inode is.
 *
 * A directory's lock covers its names. Every change of a name commits in
 * its operation's own transaction, so a release has nothing to publish:
 * its only op is invalidate, which drops what the kernel caches under the
 * lock: the directory's attributes and every name of it that was handed
 * out with a nonzero entry timeout, positive or negative. Invalidating the
 * directory inode alone would not drop its children's dentries, so each
 * such name is recorded here (efs_fs_entry_timeout) until its timeout
 * passes. A directory with EFS_FS_KNAMES_MAX names recorded hands out new
 * names with a zero entry timeout.
 *
 * To drop an entry the kernel takes the directory's own lock, which it
 * may hold while it waits for a request on the directory (a lookup, a
 * create): the invalidation therefore runs with every request served
 * (serve_while_invalidating), and replies under a lock whose release is
 * prepared carry zero timeouts.
 *
 * Fault-hook builds (tests): setting the xattr EFS_FS_FAULT_RELEASE_XATTR
 * to "0" (or "1") on any inode force-releases (or downgrades) its lock
 * after the reply, through efs_lock_release_now: the entry point a peer's
 * recall calls.
 */
#include "fs/fs-int.h"

#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "kchan/inval.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"

/* One name of a directory the kernel may cache until |until_ns|. */
struct efs_fs_kname {
	struct efs_fs_kname *next;
	uint64_t until_ns;
	size_t len;
	char name[]; /* |len| bytes, NUL-terminated */
};

struct efs_fs_knames {
	size_t n, nbuckets;
	uint64_t until_ns;  /* the latest of all */
	uint64_t oldest_ns; /* no name times out before (as of the last prune) */
	struct efs_fs_kname **b;
};

static uint64_t name_hash(const char *name, size_t len)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (size_t i = 0; i < len; i++) {
		h ^= (unsigned char)name[i];
		h *= 1099511628211ull;
	}
	return h;
}

static void knames_clear(struct efs_fs_inode *dir)
{
	struct efs_fs_knames *kn = dir->kn;

	if (!kn)
		return;
	for (size_t i = 0; i < kn->nbuckets; i++) {
		while (kn->b[i]) {
			struct efs_fs_kname *k = kn->b[i];

			kn->b[i] = k->next;
			efs_mem_free(k);
		}
	}
	efs_mem_free(kn->b);
	efs_mem_free(kn);
	dir->kn = NULL;
}

/* Drops the names whose timeout has passed. */
static void knames_prune(struct efs_fs_knames *kn, uint64_t now)
{
	kn->oldest_ns = UINT64_MAX;
	for (size_t i = 0; i < kn->nbuckets; i++) {
		struct efs_fs_kname **pp = &kn->b[i];

		while (*pp) {
			struct efs_fs_kname *k = *pp;

			if (k->until_ns > now) {
				if (k->until_ns < kn->oldest_ns)
					kn->oldest_ns = k->until_ns;
				pp = &k->next;
				continue;
			}
			*pp = k->next;
			efs_mem_free(k);
			kn->n--;
		}
	}
}

/* Records that the kernel may cache |name| of |dir| until |until|; false
 * when it cannot be recorded (no memory, too many names). */
static bool knames_note(struct efs_fs_inode *dir, const char *name, size_t len, uint64_t now,
			uint64_t until)
{
	struct efs_fs_knames *kn = dir->kn;
	struct efs_fs_kname **slot, *k;

	if (!kn) {
		kn = efs_mem_calloc(1, sizeof(*kn));
		if (!kn)
			return false;
		kn->nbuckets = 64;
		kn->b = efs_mem_calloc(kn->nbuckets, sizeof(*kn->b));
		if (!kn->b) {
			efs_mem_free(kn);
			return false;
		}
		dir->kn = kn;
	}
	if (kn->until_ns <= now && kn->n) {
		/* Every name timed out: start afresh. */
		knames_prune(kn, now);
	}
	slot = &kn->b[name_hash(name, len) & (kn->nbuckets - 1)];
	for (k = *slot; k; k = k->next) {
		if (k->len == len && memcmp(k->name, name, len) == 0) {
			if (k->until_ns < until)
				k->until_ns = until;
			goto noted;
		}
	}
	if (kn->n >= EFS_FS_KNAMES_MAX) {
		/* Full: a walk frees something only once the oldest name
		 * timed out, so a lookup storm does not walk every time. */
		if (kn->oldest_ns > now)
			return false;
		knames_prune(kn, now);
		if (kn->n >= EFS_FS_KNAMES_MAX)
			return false;
	}
	if (kn->n >= kn->nbuckets * 2 && kn->nbuckets < EFS_FS_KNAMES_MAX) {
		size_t nb = kn->nbuckets * 4;
		struct efs_fs_kname **b = efs_mem_calloc(nb, sizeof(*b));

		if (b) {
			for (size_t i = 0; i < kn->nbuckets; i++) {
				while (kn->b[i]) {
					struct efs_fs_kname *x = kn->b[i];
					size_t j = name_hash(x->name, x->len) & (nb - 1);

					kn->b[i] = x->next;
					x->next = b[j];
					b[j] = x;
				}
			}
			efs_mem_free(kn->b);
			kn->b = b;
			kn->nbuckets = nb;
			slot = &kn->b[name_hash(name, len) & (nb - 1)];
		}
	}
	k = efs_mem_malloc(sizeof(*k) + len + 1);
	if (!k)
		return false;
	k->until_ns = until;
	k->len = len;
	memcpy(k->name, name, len);
	k->name[len] = '\0';
	k->next = *slot;
	*slot = k;
	kn->n++;
	if (until < kn->oldest_ns)
		kn->oldest_ns = until;
noted:
	if (kn->until_ns < until)
		kn->until_ns = until;
	return true;
}

double efs_fs_entry_timeout(struct efs_fs *fs, uint64_t parent, const char *name, size_t len)
{
	struct efs_fs_inode *dir;
	uint64_t now;
	double t;

	if (!parent || !name)
		return 0;
	t = efs_fs_attr_timeout(fs, parent);
	if (t <= 0)
		return 0;
	dir = efs_fs_ifind(fs, parent);
	now = efs_clock_mono_ns();
	if (!dir || !knames_note(dir, name, len, now, now + (uint64_t)(t * EFS_NSEC_PER_SEC) + 1))
		return 0;
	return t;
}

/*
 * Names of one file the kernel may hold at once.
 *
 * A rename looks its source name up, then its target, holding the
 * directory's i_rwsem, and if both dentries name the same inode the VFS
 * answers success without asking us (they are hard links, as far as it
 * knows). Between the two lookups our lock on the directory may go to a
 * peer that renames the source over the target; the invalidation of the
 * source's entry we send on that recall waits for the i_rwsem the rename
 * holds, so the kernel looks the target up, gets the same inode, and the
 * rename "succeeds" on a name that no longer exists. The same stale
 * source dentry can outlive its timeout in any task that holds it.
 *
 * So a positive lookup that hands out a file (one link) under a name other
 * than the last one it was handed out under in that directory, under an
 * older grant of the directory's lock, answers ESTALE once: the system
 * call fails its lookup, and the VFS retries it once with LOOKUP_REVAL,
 * which makes FUSE ask about every name of the path again, the stale
 * source included (answered ENOENT: the rename fails as it must); the
 * retry's lookup of the new name is answered. A call whose path does not
 * include the old name (a stat of the new one) costs one round trip more.
 * Once only: a second ESTALE would reach the caller. A lookup of the old
 * name clears the record.
 *
 * Where the kernel may still have a dentry for the new name (its entry
 * was handed out and has not timed out, or its invalidation is still
 * waiting for the directory's kernel lock, as it does behind the rename
 * above), the lookup is a revalidation: the kernel takes the ESTALE as
 * "drop it and look it up afresh", and that fresh lookup reaches the
 * system call. So such a name gets an ESTALE of its own, once, and is no
 * longer counted as held; the fresh lookup still gets the one above.
 */
/* in->kal_estales: which ESTALEs the current name had (each at most once). */
#define KAL_FRESH 1u /* a fresh lookup's: the system call retries */
#define KAL_HELD 2u  /* a revalidation's: the kernel looks up afresh */

static uint64_t kal_hash(const char *name, size_t len)
{
	return name_hash(name, len) | 1; /* never 0: 0 means none */
}

static void knames_forget(struct efs_fs_inode *dir, const char *name, size_t len);
static bool kname_maybe_held(struct efs_fs *fs, uint64_t parent, const char *name, size_t len);

int efs_fs_kalias_check(struct efs_fs *fs, uint64_t parent, const char *name, size_t len,
			uint64_t ino, const Etcfs__Inode *rec)
{
	uint64_t h = kal_hash(name, len);
	struct efs_fs_inode *in;
	bool first;

	for (unsigned i = 0; i < sizeof(fs->kal_ring) / sizeof(fs->kal_ring[0]); i++) {
		if (fs->kal_ring[i].parent != parent || fs->kal_ring[i].name != h)
			continue;
		/* The kernel asks about the old name: it drops what it held. */
		in = efs_fs_ifind(fs, fs->kal_ring[i].ino);
		if (in && in->kal_parent == parent && in->kal_name == h)
			in->kal_parent = 0;
		fs->kal_ring[i].parent = 0;
	}
	if (!ino || !rec || S_ISDIR(rec->mode) || rec->nlink > 1)
		return 0;
	in = efs_fs_ifind(fs, ino);
	if (!in || !in->nlookup || in->kal_parent != parent || in->kal_name == h ||
	    in->kal_grant == efs_lock_grant(fs->lc, parent))
		return 0;
	if (!(in->kal_estales & KAL_HELD) && kname_maybe_held(fs, parent, name, len)) {
		struct efs_fs_inode *dir = efs_fs_ifind(fs, parent);

		/* A revalidation: its ESTALE never reaches the caller. */
		if (dir)
			knames_forget(dir, name, len);
		first = !in->kal_estales;
		in->kal_estales |= KAL_HELD;
	} else if (!(in->kal_estales & KAL_FRESH)) {
		first = !in->kal_estales;
		in->kal_estales |= KAL_FRESH;
	} else {
		return 0;
	}
	if (first) {
		unsigned k = fs->kal_next++ % (sizeof(fs->kal_ring) / sizeof(fs->kal_ring[0]));

		fs->kal_ring[k].parent = parent;
		fs->kal_ring[k].name = in->kal_name;
		fs->kal_ring[k].ino = ino;
	}
	efs_counter_inc(fs->m_kal_estales);
	efs_log_debug("fs: inode %" PRIu64 " looked up under a new name in %" PRIu64
		      " while the kernel may hold its old one: ESTALE",
		      ino, parent);
	return -ESTALE;
}

/* Records the name |ino| is handed out under (see above). */
static void kalias_note(struct efs_fs *fs, uint64_t parent, const char *name, size_t len,
			uint64_t ino, const Etcfs__Inode *rec)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	uint64_t h;

	if (!in || !parent || !name || S_ISDIR(rec->mode))
		return;
	h = kal_hash(name, len);
	if (in->kal_parent == parent && in->kal_name == h) {
		in->kal_grant = efs_lock_grant(fs->lc, parent);
		return;
	}
	in->kal_parent = parent;
	in->kal_name = h;
	in->kal_grant = efs_lock_grant(fs->lc, parent);
	in->kal_estales = 0;
}

void efs_fs_fill_entry(struct efs_fs *fs, uint64_t parent, const char *name, size_t len,
		       uint64_t ino, const Etcfs__Inode *rec, bool versioned,
		       struct fuse_entry_param *e)
{
	const struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	bool known = in && in->nlookup, invalidated = S_ISREG(rec->mode) || S_ISDIR(rec->mode);

	kalias_note(fs, parent, name, len, ino, rec);
	memset(e, 0, sizeof(*e));
	e->ino = ino;
	e->generation = rec->generation;
	efs_meta_inode_to_stat(rec, ino, fs->blksize, &e->attr);
	/*
	 * An inode the kernel creates for this reply gets its attributes
	 * unversioned. After a lookup or a readdirplus (|versioned|) the
	 * kernel checks the version it took before the request, which a
	 * release's invalidation bumps once it finds the inode, and that
	 * invalidation is issued again while it finds none and we count the
	 * reference (kernel_referenced in fs.c): those keep their timeout
	 * for files and directories, whose releases invalidate. A create,
	 * mkdir, mknod, symlink or link reply is applied with no version at
	 * all (the invalidation may land just before it): no timeout for
	 * those new inodes, nor for new inodes of other kinds (their
	 * releases invalidate attributes too, file/lockops.c, but nothing
	 * measured needs more than their GETATTR replies' timeout).
	 */
	e->attr_timeout = known || (versioned && invalidated) ? efs_fs_attr_timeout(fs, ino)
							       : EFS_FS_UNVERSIONED_ATTR_TIMEOUT;
	e->entry_timeout = efs_fs_entry_timeout(fs, parent, name, len);
}

void efs_fs_reply_entry(struct efs_fs_op *op, uint64_t parent, const char *name, size_t len,
			uint64_t ino, const Etcfs__Inode *rec, bool versioned)
{
	struct fuse_entry_param e;

	efs_fs_fill_entry(op->fs, parent, name, len, ino, rec, versioned, &e);
	if (efs_fs_rq_entry(op->rq, &e) == 0)
		efs_fs_inode_ref_kernel(op->fs, ino);
}

size_t efs_fs_knames_count(const struct efs_fs_inode *dir)
{
	return dir->kn ? dir->kn->n : 0;
}

/* ---- The kind classifier ---- */

static unsigned lock_kind(void *arg, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(arg, ino);

	if (!in)
		return 0;
	if (in->data || (in->rec && S_ISREG(in->rec->mode)))
		return EFS_FS_LOCK_FILE;
	if (in->rec && S_ISDIR(in->rec->mode))
		return EFS_FS_LOCK_DIR;
	if (in->rec)
		return EFS_FS_LOCK_SPECIAL;
	return EFS_FS_LOCK_OTHER;
}

/* ---- Directories ---- */

/* The invalidations of one directory's release. */
struct efs_fs_dinval {
	struct efs_fs *fs;
	efs_lock_done_cb done;
	void *darg;
	size_t n, left;
	size_t nreq; /* req[]'s entries */
	int status;
	bool reported;	  /* |done| ran (the names timed out first) */
	uv_timer_t *expiry; /* fires when every name submitted has timed out */
	uint64_t wait_ms;   /* ... this long after the invalidation began */
	struct efs_list link; /* fs->dinvals, for a kernel that goes */
	struct efs_inval_req req[]; /* [0] attributes, then one per name */
};

/* Drops |name| from what |dir| records as handed out, if it is there. */
static void knames_forget(struct efs_fs_inode *dir, const char *name, size_t len)
{
	struct efs_fs_knames *kn = dir->kn;
	struct efs_fs_kname **pp;

	if (!kn)
		return;
	for (pp = &kn->b[name_hash(name, len) & (kn->nbuckets - 1)]; *pp; pp = &(*pp)->next) {
		struct efs_fs_kname *k = *pp;

		if (k->len == len && memcmp(k->name, name, len) == 0) {
			*pp = k->next;
			efs_mem_free(k);
			kn->n--;
			return;
		}
	}
}

/* Whether the kernel may hold a dentry for |name| of |parent|: handed out
 * with a timeout not yet passed, or its invalidation still pending. */
static bool kname_maybe_held(struct efs_fs *fs, uint64_t parent, const char *name, size_t len)
{
	struct efs_fs_inode *dir = efs_fs_ifind(fs, parent);
	struct efs_list *it;

	if (dir && dir->kn) {
		struct efs_fs_knames *kn = dir->kn;
		uint64_t now = efs_clock_mono_ns();

		for (struct efs_fs_kname *k = kn->b[name_hash(name, len) & (kn->nbuckets - 1)]; k;
		     k = k->next)
			if (k->len == len && memcmp(k->name, name, len) == 0 && k->until_ns > now)
				return true;
	}
	efs_list_for_each(it, &fs->dinvals)
	{
		struct efs_fs_dinval *v = efs_list_entry(it, struct efs_fs_dinval, link);

		for (size_t i = 1; i < v->nreq; i++) {
			const char *pn = efs_inval_req_pending_name(&v->req[i]);

			if (pn && v->req[i].ino == parent && v->req[i].name_len == len &&
			    memcmp(pn, name, len) == 0)
				return true;
		}
	}
	return false;
}

static void dinval_finish(struct efs_fs_dinval *v)
{
	efs_lock_done_cb done = v->reported ? NULL : v->done;
	void *darg = v->darg;
	int status = v->status;

	v->expiry = efs_timer_free(v->expiry);
	efs_list_del(&v->link);
	efs_mem_free(v);
	if (done)
		done(darg, status);
}

/*
 * Everything the invalidation drops has timed out in the kernel: the
 * release no longer needs the kernel's answer. An entry invalidation
 * waits for the directory's kernel lock, which the kernel holds while a
 * request on the directory (a rename waiting for a lock this release
 * frees, perhaps on another node) is in flight: so the release goes on
 * and the invalidation finishes whenever the kernel lets it.
 */
static void dinval_expired(uv_timer_t *t)
{
	struct efs_fs_dinval *v = t->data;

	if (!v || v->reported)
		return;
	v->reported = true;
	efs_log_debug("fs: directory %" PRIu64 ": its kernel caches timed out (%" PRIu64
		      " ms) before the kernel dropped them: the release goes on",
		      v->req[0].ino, v->wait_ms);
	v->done(v->darg, 0);
}

static void dinval_one_done(struct efs_inval_req *req, int status)
{
	struct efs_fs_dinval *v = req->arg;

	status = efs_inval_release_status(status);
	if (status < 0 && v->status == 0) {
		efs_log_warn("fs: invalidating the kernel's entries of directory %" PRIu64 ": %s",
			     req->ino, strerror(-status));
		v->status = status;
	}
	if (--v->left == 0)
		dinval_finish(v);
}

/*
 * The kernel counts a timeout in jiffies from when the request's caller
 * resumes, rounded up: past our clock's deadline by up to two jiffies (20
 * ms at HZ=100) plus that wake-up.
 */
#define DINVAL_SLACK_MS 20

/* Milliseconds from |now| until every kernel cache noted up to |until|
 * has timed out (0: none can still be valid). */
static uint64_t dinval_wait_ms(uint64_t until, uint64_t now)
{
	if (!until)
		return 0;
	until += DINVAL_SLACK_MS * EFS_NSEC_PER_MSEC;
	return until <= now ? 0 : (until - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC;
}

static void dir_invalidate(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
			   void *darg)
{
	struct efs_fs *fs = arg;
	struct efs_fs_inode *dir = efs_fs_ifind(fs, ino);
	uint64_t now = efs_clock_mono_ns();
	struct efs_fs_knames *kn;
	struct efs_fs_dinval *v;
	size_t n = 1, i = 1;
	uint64_t until;

	(void)to;
	if (!fs->inval) {
		/* No kernel to tell (or no notifications). */
		if (dir)
			knames_clear(dir);
		done(darg, 0);
		return;
	}
	kn = dir ? dir->kn : NULL;
	/* The directory's attributes (each entry handed out notes them too)
	 * and its names. */
	until = efs_lock_kernel_cache_until(fs->lc, ino);
	if (kn) {
		if (kn->until_ns > until)
			until = kn->until_ns;
		knames_prune(kn, now);
		n += kn->n;
	}
	v = efs_mem_calloc(1, sizeof(*v) + n * sizeof(v->req[0]));
	if (!v) {
		done(darg, -ENOMEM);
		return;
	}
	v->fs = fs;
	v->nreq = n;
	v->done = done;
	v->darg = darg;
	v->req[0].kind = EFS_INVAL_INODE;
	v->req[0].ino = ino;
	v->req[0].off = -1; /* attributes only: readdir is never cached */
	for (size_t b = 0; kn && b < kn->nbuckets; b++) {
		for (struct efs_fs_kname *k = kn->b[b]; k; k = k->next, i++) {
			v->req[i].kind = EFS_INVAL_ENTRY;
			v->req[i].ino = ino;
			v->req[i].name = k->name;
			v->req[i].name_len = k->len;
		}
	}
	efs_list_add_tail(&fs->dinvals, &v->link);
	/* Whatever the kernel caches under the lock was granted before now
	 * (from the recall on, or from this preparation on, replies carry
	 * zero timeouts) and times out by the latest deadline noted for it:
	 * the release never goes before that, and waits no longer either. */
	v->expiry = efs_timer_new(fs->loop, v);
	v->wait_ms = dinval_wait_ms(until, now);
	if (v->expiry)
		uv_timer_start(v->expiry, dinval_expired, v->wait_ms, 0);
	/* Counted before the first submission: completions never run inline,
	 * but a failed submission ends its part at once. */
	v->n = v->left = n + 1;
	for (i = 0; i < n; i++) {
		int r;

		v->req[i].cls = EFS_INVAL_GATING;
		v->req[i].cb = dinval_one_done;
		v->req[i].arg = v;
		r = efs_inval_submit(fs->inval, &v->req[i]);
		if (r < 0) {
			if (r != -ESHUTDOWN && v->status == 0)
				v->status = r;
			v->left--;
		}
	}
	/* The names are copied at submission; the kernel's entries of them
	 * are being dropped. */
	if (dir)
		knames_clear(dir);
	if (--v->left == 0)
		dinval_finish(v);
}

static const struct efs_lock_ops dir_lock_ops = {
	.invalidate = dir_invalidate,
	.serve_while_invalidating = true,
};

/* ---- The forced-release test hook ---- */

#if EFS_FAULT_HOOKS
static void fault_release_done(void *arg, int status)
{
	uint64_t ino = (uint64_t)(uintptr_t)arg;

	if (status < 0)
		efs_log_warn("fault injection: forced release of inode %" PRIu64 ": %s", ino,
			     strerror(-status));
	else
		efs_log_debug("fault injection: inode %" PRIu64 " force-released", ino);
}

bool efs_fs_fault_release(fuse_req_t req, uint64_t ino, const char *name, const char *value,
			  size_t size)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	enum efs_lock_mode to;
	int r;

	if (strcmp(name, EFS_FS_FAULT_RELEASE_XATTR) != 0)
		return false;
	if (size == 1 && value[0] == '0')
		to = EFS_LOCK_NONE;
	else if (size == 1 && value[0] == '1')
		to = EFS_LOCK_SHARED;
	else {
		efs_fs_reply_now(fs, req, EFS_FS_OP_SETXATTR, -EINVAL);
		return true;
	}
	/* Answered first: the kernel holds the inode's lock until then,
	 * and the release's invalidations may need it. */
	efs_fs_reply_now(fs, req, EFS_FS_OP_SETXATTR, 0);
	r = efs_lock_release_now(fs->lc, ino, to, fault_release_done, (void *)(uintptr_t)ino);
	if (r < 0)
		efs_log_warn("fault injection: forced release of inode %" PRIu64 ": %s", ino,
			     strerror(-r));
	return true;
}
#endif

/* ---- Setup ---- */

/* The names a directory handed out die with its cached inode. */
static void inode_freed(struct efs_fs *fs, struct efs_fs_inode *in)
{
	knames_clear(in);
}

static const struct efs_fs_inode_hooks dir_inode_hooks = {
	.freed = inode_freed,
};

void efs_fs_lockops_init(struct efs_fs *fs)
{
	/* Registered for the fs's whole life: the inode cache, freed last,
	 * frees the names of every directory it still holds. */
	efs_fs_ihooks_add(fs, &dir_inode_hooks);
	if (!fs->lc)
		return;
	efs_lockcache_set_kind_fn(fs->lc, lock_kind, fs);
	efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_DIR, &dir_lock_ops, fs);
}

void efs_fs_lockops_kernel_gone(struct efs_fs *fs)
{
	/* The queue is stopped and its requests are done: what waited on
	 * it completes, with nothing left in the kernel to invalidate. */
	while (!efs_list_empty(&fs->dinvals)) {
		struct efs_fs_dinval *v =
			efs_list_entry(efs_list_first(&fs->dinvals), struct efs_fs_dinval, link);

		v->status = 0;
		dinval_finish(v);
	}
}

void efs_fs_lockops_done(struct efs_fs *fs)
{
	efs_fs_lockops_kernel_gone(fs);
	if (!fs->lc)
		return;
	efs_lockcache_set_ops(fs->lc, EFS_FS_LOCK_DIR, NULL, NULL);
	efs_lockcache_set_kind_fn(fs->lc, NULL, NULL);
}
