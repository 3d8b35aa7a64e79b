/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Namespace operations: lookup, which only reads, and create, mknod,
 * mkdir, symlink, link, unlink, rmdir and rename, each one transaction
 * built by the engine (engine.c): the session and lock guards, a mod_revision
 * compare on every inode record it rewrites (parents included: their times
 * and link counts change), create_revision == 0 on every new name, and the
 * operation id on every record and dirent it writes.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <string.h>

#include "etcd/kv.h"
#include "fs/fs-int.h"
#include "fs/data.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

/* Longest ancestor chain a directory rename walks before giving up. */
#define WALK_MAX 4096

/* What each kind of namespace operation keeps between its steps. */
struct mk_priv {
	int dirent_kv; /* 1-based index of the dirent read after a conflict */
	int acl_kv;    /* 1-based index of the parent's default ACL */
};

struct rm_priv {
	int empty_kv; /* 1-based: the child directory's first dirent */
	int oref_kv;  /* 1-based: the child file's open references */
	uint64_t oref_ino; /* ... the inode that read was for */
};

struct rn_priv {
	int seq_kv;    /* 1-based: renameseq */
	int empty_kv;  /* 1-based: the replaced directory's first dirent */
	int oref_kv;   /* 1-based: the replaced file's open references */
	uint64_t oref_ino; /* ... the inode that read was for */
	bool walk;     /* a cross-directory directory move: walk ancestors */
	bool walked;   /* the walk found no cycle */
	uint64_t cur;  /* walk position */
	int phase;     /* 0: S against ino2's chain; 1: T against ino's */
	int depth;
};

/* A namespace operation's record: the engine's base (op.ino is the parent,
 * or the inode a link names), then the names, what the plan found under
 * them, and the arguments of the create-like operations. */
struct ns_op {
	struct efs_fs_op op;
	uint64_t ino2; /* the new parent (rename, link) */
	char name[EFS_META_NAME_MAX + 1];
	size_t name_len;
	char name2[EFS_META_NAME_MAX + 1];
	size_t name2_len;
	mode_t mode;
	dev_t rdev;
	unsigned flags;		/* open flags (create), RENAME_* (rename) */
	char *link;		/* symlink target (efs_mem) */
	size_t link_len;
	struct fuse_file_info fi; /* create */
	uint64_t child;		  /* inode found under |name| */
	uint64_t child2;	  /* inode found under |name2| */
	uint32_t child_type, child2_type;
	uint64_t dc_mseq; /* lookup: the directory's mseq when its dirent read left */
	uint64_t oref_gone; /* an inode deleted with this node's open reference */
	union {
		struct mk_priv mk; /* create-like operations, link */
		struct rm_priv rm;
		struct rn_priv rn;
	} u;
};

static struct ns_op *nop_of(struct efs_fs_op *op)
{
	return (struct ns_op *)op; /* op is the first member */
}

/*
 * After a commit, before the reply: the name cache takes what the commit
 * made true under the directory's exclusive lock (a created name and its
 * inode, an unlinked name absent), so that a directory this node fills
 * keeps answering its lookups, misses included, without etcd; links and
 * renames forget the names they touch. Each parent's listing sequence
 * moves on, so that listings and lookups read before the change are read
 * again.
 */
static void ns_committed(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct efs_fs_inode *pin = efs_fs_ifind(op->fs, op->ino);

	if (nop->oref_gone) {
		struct efs_fs_inode *in = efs_fs_ifind(op->fs, nop->oref_gone);

		if (in)
			in->oref_epoch = 0;
	}
	switch (op->d->code) {
	case EFS_FS_OP_CREATE:
	case EFS_FS_OP_MKNOD:
	case EFS_FS_OP_MKDIR:
	case EFS_FS_OP_SYMLINK:
		/* A name the cache could not take must void listings read
		 * before it (dir.c's fill would complete the cache without
		 * it). */
		if (pin && !efs_fs_dcache_put(op->fs, pin, nop->name, nop->name_len, op->new_ino,
					      efs_meta_dt_from_mode(nop->mode)))
			pin->rmseq++;
		if (op->d->code == EFS_FS_OP_MKDIR) {
			struct efs_fs_inode *nin = efs_fs_ifind(op->fs, op->new_ino);

			if (nin)
				efs_fs_dcache_new_empty(op->fs, nin);
		}
		break;
	case EFS_FS_OP_UNLINK:
	case EFS_FS_OP_RMDIR:
		if (pin)
			efs_fs_dcache_put(op->fs, pin, nop->name, nop->name_len, 0, 0);
		break;
	default:
		if (nop->name_len)
			efs_fs_dcache_forget(op->fs, op->ino, nop->name, nop->name_len);
		if (nop->name2_len)
			efs_fs_dcache_forget(op->fs, nop->ino2, nop->name2, nop->name2_len);
		break;
	}
	for (int i = 0; i < 2; i++) {
		struct efs_fs_inode *d = efs_fs_ifind(op->fs, i ? nop->ino2 : op->ino);

		if (!d)
			continue;
		d->mseq++;
		/* A listing read meanwhile still holds every name but the new
		 * one, which the cache has: it may still make the cache whole
		 * (dir.c's fill). Other changes void it. */
		if (!op->d->new_inode)
			d->rmseq++;
	}
}

/* Delegation (batch.c): a create-like operation is decided knowing every
 * name of its directory: the name cache is complete and says it is absent. */
static bool mk_batchable(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct efs_fs_inode *pin = efs_fs_ifind(op->fs, op->ino);
	const Etcfs__Inode *prec = efs_fs_rec(op, op->ino);
	uint64_t child = 1;
	uint32_t type;

	/* A default ACL to inherit is read in the plan: not batched. */
	if (!pin || !prec || (op->fs->posix_acl && prec->xattr_count > 0) ||
	    !efs_fs_dcache_complete(op->fs, pin))
		return false;
	return efs_fs_dcache_get(op->fs, pin, nop->name, nop->name_len, &child, &type) == 1 &&
	       child == 0;
}

static void ns_release(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);

	/* A commit whose outcome stayed unknown may have changed the names:
	 * none of them is known any more. */
	if (op->unsettled && !op->committed) {
		struct efs_fs_inode *d;

		if (nop->name_len)
			efs_fs_dcache_forget(op->fs, op->ino, nop->name, nop->name_len);
		if (nop->name2_len)
			efs_fs_dcache_forget(op->fs, nop->ino2, nop->name2, nop->name2_len);
		/* A listing read meanwhile may or may not hold the name:
		 * for lookups (rmseq) and for readdir (mseq). */
		if ((d = efs_fs_ifind(op->fs, op->ino))) {
			d->rmseq++;
			d->mseq++;
		}
		if (nop->ino2 && (d = efs_fs_ifind(op->fs, nop->ino2))) {
			d->rmseq++;
			d->mseq++;
		}
	}
	efs_mem_free(nop->link);
}

/*
 * A namespace descriptor: its record (struct ns_op, freed by ns_release),
 * opcode, origin, flags (mutates, reserves a new inode, grows the
 * metadata) and steps.
 */
#define NS_DESC_B(var, opc, orig, mut, newi, grow, plan_, prepare_, build_, done_, batchable_)      \
	static const struct efs_fs_opdesc var = {                                                  \
		.code = opc,                                                                       \
		.size = sizeof(struct ns_op),                                                      \
		.origin = orig,                                                                    \
		.mutates = mut,                                                                    \
		.new_inode = newi,                                                                 \
		.grows = grow,                                                                     \
		.plan = plan_,                                                                     \
		.prepare = prepare_,                                                               \
		.build = build_,                                                                   \
		.done = done_,                                                                     \
		.batchable = batchable_,                                                           \
		.release = ns_release,                                                             \
	}
#define NS_DESC(var, opc, orig, mut, newi, grow, plan_, prepare_, build_, done_)                    \
	NS_DESC_B(var, opc, orig, mut, newi, grow, plan_, prepare_, build_, done_, NULL)

/* The |done| of operations that reply success without data. */
static void ns_ok_done(struct efs_fs_op *op)
{
	ns_committed(op);
	efs_fs_ok_done(op);
}

static int set_name(struct efs_fs_op *op, const char *name, bool second)
{
	struct ns_op *nop = nop_of(op);
	size_t len = strlen(name);
	int r = efs_meta_name_check(name, len);

	if (r < 0)
		return r;
	if (second) {
		memcpy(nop->name2, name, len + 1);
		nop->name2_len = len;
	} else {
		memcpy(nop->name, name, len + 1);
		nop->name_len = len;
	}
	return 0;
}

/* The entry a plan read: -ENOENT when there is none, -EIO when it is
 * corrupt. */
static int decode_dirent(const struct efs_fs_kv *kv, uint64_t *ino, uint32_t *type)
{
	Etcfs__Dirent *de = NULL;

	if (!kv->found)
		return -ENOENT;
	if (efs_meta_dirent_decode(kv->val, kv->val_len, &de, NULL) < 0)
		return -EIO;
	*ino = de->ino;
	*type = de->type;
	efs_meta_record_free(de);
	return 0;
}

static int dir_check(const Etcfs__Inode *rec)
{
	if (!rec || rec->nlink == 0)
		return -ENOENT;
	if (!S_ISDIR(rec->mode))
		return -ENOTDIR;
	return 0;
}

static bool slot_ready(const struct efs_fs_op *op, uint64_t ino)
{
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].ino == ino)
			return op->slots[i].in && op->slots[i].locked >= op->slots[i].mode;
	return false;
}

/* Puts the orphan record of an inode whose last name goes while it is open. */
static int put_orphan(struct efs_fs_op *op, uint64_t ino)
{
	Etcfs__Orphan o = ETCFS__ORPHAN__INIT;
	struct efs_meta_key k;
	int r;

	o.since_ns = efs_fs_now();
	o.op_id.data = op->op_id;
	o.op_id.len = op->op_id_len;
	r = efs_meta_key_orphan(&op->fs->ns, ino, &k);
	if (r < 0)
		return r;
	return efs_meta_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, &k, &o.base, 0);
}

/*
 * The last link of |ino| (record |rec|, nlink already 0) goes: delete it,
 * or keep it as an orphan while a handle of this node or an open
 * reference of another node (|oref_kv|, 1-based, the r/<ino> read; 0 for
 * none: directories) has it open. The orphan compares that the other
 * nodes' references it saw are still there (one that went meanwhile makes
 * the unlink plan again); the delete compares that no other node holds
 * one, and deletes this node's own cached reference. An orphan is turned
 * into a reclaim record by the last node to drop its reference
 * (reclaim.c); the other nodes learn of it from their o/ watch.
 */
static int drop_or_orphan(struct efs_fs_op *op, uint64_t ino, Etcfs__Inode *rec, int oref_kv)
{
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, ino);
	const struct efs_fs_kv *kv = oref_kv ? &op->kv[oref_kv - 1] : NULL;
	struct efs_meta_key k;
	size_t others = 0;
	bool mine = false;
	int r;

	if (kv)
		efs_fs_oref_count(op->fs, kv, ino, &mine, &others);
	if (efs_fs_live_opens(op->fs, in) > 0 || others) {
		r = efs_fs_put_inode(op, ino, rec, false);
		if (r == 0)
			r = put_orphan(op, ino);
		for (size_t i = 0; r == 0 && kv && i < kv->nkvs; i++)
			r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
						 kv->kvs[i]->key.data, kv->kvs[i]->key.len,
						 kv->kvs[i]->mod_revision);
		return r;
	}
	r = efs_fs_del_inode(op, ino);
	if (r == 0)
		r = efs_fs_drop_inode_keys(op, ino, rec);
	if (r == 0 && kv)
		r = efs_fs_oref_cmp_alone(op->fs, op->txn, ino);
	if (r == 0 && mine)
		r = efs_meta_key_open(&op->fs->ns, ino, efs_session_node(op->fs->s), &k);
	if (r == 0 && mine) {
		r = efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
					false);
		nop_of(op)->oref_gone = ino;
	}
	return r;
}

/* "The directory |ino| is empty" as a compare: no dirent key under it. */
static int cmp_empty(struct efs_fs_op *op, uint64_t ino)
{
	struct efs_meta_range rg;
	struct efs_etcd_cmp c = {0};
	int r;

	r = efs_meta_range_ino(&op->fs->ns, EFS_META_K_DIRENT, ino, &rg);
	if (r < 0)
		return r;
	c.target = EFS_ETCD_CMP_CREATE;
	c.result = EFS_ETCD_CMP_EQUAL;
	c.key = rg.key.buf;
	c.key_len = rg.key.len;
	c.range_end = rg.end.buf;
	c.range_end_len = rg.end.len;
	c.num = 0;
	return efs_etcd_txn_compare_ex(op->txn, &c);
}

static int want_empty_kv(struct efs_fs_op *op, uint64_t ino, int *idx)
{
	int r;

	if (*idx)
		return 0;
	r = efs_fs_want_keys(op, EFS_META_K_DIRENT, ino, 1);
	if (r < 0)
		return r;
	*idx = r; /* 1-based */
	return 0;
}

/* ---- lookup ---- */

static struct efs_fs_inode *slot_inode(struct efs_fs_op *op, uint64_t ino)
{
	for (size_t i = 0; i < op->nslots; i++)
		if (op->slots[i].ino == ino)
			return op->slots[i].in;
	return NULL;
}

static int lookup_plan(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct efs_fs *fs = op->fs;
	struct efs_fs_inode *pin;
	const Etcfs__Inode *prec, *crec;
	struct efs_fs_kv *kv;
	uint32_t type = 0;
	bool cacheable;
	int r;

	if (op->loads_done == 0)
		return efs_fs_want(op, op->ino, EFS_LOCK_SHARED);
	prec = efs_fs_rec(op, op->ino);
	if (!prec)
		return -ENOENT;
	if (!S_ISDIR(prec->mode))
		return -ENOTDIR;
	pin = slot_inode(op, op->ino);
	if (op->nkv == 0) {
		/* The name cache first; a miss reads the dirent. Asked again
		 * after every load: taking the child's lock may have let the
		 * directory's lock go and come back (a recall while it waited),
		 * and a name learnt under the old grant may be gone. */
		if (pin && efs_fs_dcache_get(fs, pin, nop->name, nop->name_len, &nop->child, &type)) {
			if (op->loads_done == 1)
				efs_counter_inc(fs->m_lookup_cached);
			if (!nop->child)
				goto negative;
		} else {
			efs_counter_inc(fs->m_lookup_read);
			kv = efs_fs_want_kv(op);
			if (!kv)
				return -E2BIG;
			r = efs_meta_key_dirent(&fs->ns, op->ino, nop->name, nop->name_len,
						&kv->key);
			nop->dc_mseq = pin ? pin->mseq : 0;
			return r < 0 ? r : EFS_FS_CONT;
		}
	}
	if (op->nkv) {
		kv = &op->kv[0];
		/* The directory's names for the lookups after this one, read
		 * once its own dirent read is answered: sent beside it, the
		 * longer listing read made it wait. */
		if (pin)
			efs_fs_dcache_fill(fs, pin);
		/* Cached only if no name change of this node overlapped the read. */
		cacheable = pin && !pin->mx_owner && pin->mseq == nop->dc_mseq;
		if (!kv->found) {
			if (cacheable)
				efs_fs_dcache_put(fs, pin, nop->name, nop->name_len, 0, 0);
			goto negative;
		}
		Etcfs__Dirent *de = NULL;

		r = efs_meta_dirent_decode(kv->val, kv->val_len, &de, NULL);
		if (r < 0)
			return -EIO;
		nop->child = de->ino;
		type = de->type;
		efs_meta_record_free(de);
		if (cacheable)
			efs_fs_dcache_put(fs, pin, nop->name, nop->name_len, nop->child, type);
	}
	if (pin && fs->lc && efs_lock_held(fs->lc, nop->child) == EFS_LOCK_NONE)
		efs_fs_read_ahead(fs, pin, nop->child);
	r = efs_fs_want(op, nop->child, EFS_LOCK_SHARED);
	if (r < 0)
		return r;
	for (size_t i = 0; i < op->nslots; i++) {
		if (op->slots[i].ino != nop->child || !op->slots[i].in ||
		    op->slots[i].locked < EFS_LOCK_SHARED)
			continue;
		crec = efs_fs_rec(op, nop->child);
		if (!crec) {
			efs_log_debug("fs: dirent %s in %llu names missing inode %llu (dirent rev "
				      "%lld, load %d at %lld, inode rev %lld, gone %d, loaded %d)",
				      nop->name, (unsigned long long)op->ino,
				      (unsigned long long)nop->child,
				      op->nkv ? (long long)op->kv[0].mod_rev : -1LL, op->loads_done,
				      (long long)op->load_rev, (long long)op->slots[i].in->mod_rev,
				      op->slots[i].in->gone, op->slots[i].loading);
			efs_fs_dcache_forget(fs, op->ino, nop->name, nop->name_len);
			return -ENOENT;
		}
		r = efs_fs_kalias_check(fs, op->ino, nop->name, nop->name_len, nop->child, crec);
		if (r < 0)
			return r;
		efs_fs_reply_entry(op, op->ino, nop->name, nop->name_len, nop->child, crec, true);
		return EFS_FS_DONE;
	}
	return EFS_FS_CONT;
negative: {
	struct fuse_entry_param e;

	efs_fs_kalias_check(fs, op->ino, nop->name, nop->name_len, 0, NULL);
	memset(&e, 0, sizeof(e));
	e.entry_timeout = efs_fs_entry_timeout(fs, op->ino, nop->name, nop->name_len);
	efs_fs_rq_entry(op->rq, &e);
	return EFS_FS_DONE;
}
}

NS_DESC(lookup_desc, EFS_FS_OP_LOOKUP, 0, false, false, false, lookup_plan, NULL,
	efs_fs_no_build, efs_fs_no_done);

void efs_fs_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	size_t len = strlen(name);
	struct efs_fs_op *op;
	int r = efs_meta_name_check(name, len);

	if (r == -EINVAL && (strcmp(name, ".") == 0 || strcmp(name, "..") == 0))
		r = -ENOENT; /* the kernel resolves these itself */
	op = efs_fs_op_start(req, &lookup_desc, parent);
	if (!op)
		return;
	if (r < 0) {
		efs_fs_op_finish(op, r);
		return;
	}
	memcpy(nop_of(op)->name, name, len + 1);
	nop_of(op)->name_len = len;
	efs_fs_op_run(op);
}

/* ---- Create-like operations ---- */

#define ACL_ACCESS  "system.posix_acl_access"
#define ACL_DEFAULT "system.posix_acl_default"

static int put_xattr(struct efs_fs_op *op, uint64_t ino, const char *name, const void *val,
		     size_t len)
{
	struct efs_meta_key k;
	int r = efs_meta_key_xattr(&op->fs->ns, ino, name, strlen(name), &k);

	if (r < 0)
		return r;
	return efs_etcd_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, val, len, 0);
}

void efs_fs_new_owner(const Etcfs__Inode *parent, uid_t uid, gid_t gid, mode_t mode,
		      mode_t umask, bool apply_umask, uint32_t *ret_mode, uint32_t *ret_uid,
		      uint32_t *ret_gid)
{
	uint32_t type = (uint32_t)mode & S_IFMT;
	uint32_t perm = (uint32_t)mode & 07777;

	if (type == S_IFLNK)
		perm = 0777;
	else if (apply_umask)
		perm &= ~((uint32_t)umask & 0777);
	*ret_uid = (uint32_t)uid;
	*ret_gid = (uint32_t)gid;
	if (parent && (parent->mode & S_ISGID)) {
		*ret_gid = parent->gid;
		if (type == S_IFDIR)
			perm |= S_ISGID;
	}
	*ret_mode = type | perm;
}

/* The plan's last step for an operation that makes the name |name| in
 * |parent| (create-like operations, link): after a conflict or any other
 * retry, reads that dirent once, and fails -EEXIST when the name is taken. */
static int check_new_name(struct efs_fs_op *op, struct mk_priv *p, uint64_t parent,
			  const char *name, size_t len)
{
	int r;

	if ((op->retries > 0 || op->conflicts > 0) && !p->dirent_kv) {
		struct efs_fs_kv *kv = efs_fs_want_kv(op);

		if (!kv)
			return -E2BIG;
		r = efs_meta_key_dirent(&op->fs->ns, parent, name, len, &kv->key);
		if (r < 0)
			return r;
		p->dirent_kv = (int)op->nkv;
		return EFS_FS_CONT; /* the engine reads it before building */
	}
	if (p->dirent_kv && op->nkv_loaded >= (size_t)p->dirent_kv &&
	    op->kv[p->dirent_kv - 1].found)
		return -EEXIST;
	return EFS_FS_CONT;
}

static int mk_plan(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct mk_priv *p = &nop_of(op)->u.mk;
	const Etcfs__Inode *prec;
	int r;

	if (op->loads_done == 0)
		return efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
	prec = efs_fs_rec(op, op->ino);
	r = dir_check(prec);
	if (r < 0)
		return r;
	if (op->fs->posix_acl && prec->xattr_count > 0 && !p->acl_kv &&
	    ((uint32_t)nop->mode & S_IFMT) != S_IFLNK) {
		struct efs_fs_kv *kv = efs_fs_want_kv(op);

		if (!kv)
			return -E2BIG;
		r = efs_meta_key_xattr(&op->fs->ns, op->ino, ACL_DEFAULT, strlen(ACL_DEFAULT),
				       &kv->key);
		if (r < 0)
			return r;
		p->acl_kv = (int)op->nkv;
		return EFS_FS_CONT;
	}
	r = check_new_name(op, p, op->ino, nop->name, nop->name_len);
	/*
	 * The kernel sends a create only for a name it believes absent, so a
	 * create without O_EXCL that finds the name taken lost a race with
	 * another node, and open(2) must open what the winner made. -ESTALE
	 * does it: the kernel walks the path again, every entry looked up
	 * afresh (LOOKUP_REVAL), and opens the name it now finds as any open
	 * does, with its own permission check, O_TRUNC, EISDIR for a
	 * directory, a fifo opened and a symlink followed. Answering the
	 * create with the existing inode would skip all of that (the kernel
	 * takes a created file for new) and could open regular files only.
	 * The kernel retries once: a name removed and made again by other
	 * nodes between its two walks leaves ESTALE to the caller.
	 */
	if (r == -EEXIST && op->d->code == EFS_FS_OP_CREATE && !(nop->fi.flags & O_EXCL))
		r = -ESTALE;
	return r;
}

static int mk_build(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct efs_fs *fs = op->fs;
	const Etcfs__Inode *prec = efs_fs_rec(op, op->ino);
	Etcfs__Inode *pr = NULL;
	Etcfs__Inode nr = ETCFS__INODE__INIT;
	uint32_t type = (uint32_t)nop->mode & S_IFMT;
	bool dir = type == S_IFDIR;
	int64_t now = efs_fs_now();
	int r;

	struct mk_priv *p = &nop_of(op)->u.mk;
	const struct efs_fs_kv *akv = NULL;
	uint8_t *acc = NULL;
	bool store_acc = false;

	r = dir_check(prec);
	if (r < 0)
		return r;
	if (dir && prec->nlink >= EFS_META_LINK_MAX)
		return -EMLINK;
	if (p->acl_kv && op->nkv_loaded >= (size_t)p->acl_kv && op->kv[p->acl_kv - 1].found &&
	    type != S_IFLNK)
		akv = &op->kv[p->acl_kv - 1];
	/* With a default ACL the umask does not apply (POSIX 1003.1e). */
	efs_fs_new_owner(prec, op->uid, op->gid, nop->mode, op->umask, !akv, &nr.mode, &nr.uid,
			 &nr.gid);
	if (akv) {
		acc = efs_mem_memdup(akv->val, akv->val_len);
		if (!acc)
			return -ENOMEM;
		r = efs_fs_acl_inherit(acc, akv->val_len, &nr.mode);
		if (r < 0) {
			efs_log_debug("fs: bad default ACL on %llu ignored",
				      (unsigned long long)op->ino);
			efs_mem_free(acc);
			acc = NULL;
			akv = NULL;
		} else {
			store_acc = r == 1;
		}
		if (store_acc) {
			nr.xattr_count++;
			nr.xattr_bytes += strlen(ACL_ACCESS) + akv->val_len;
		}
		if (akv && dir) {
			nr.xattr_count++;
			nr.xattr_bytes += strlen(ACL_DEFAULT) + akv->val_len;
		}
	}
	nr.nlink = dir ? 2 : 1;
	nr.atime_ns = nr.mtime_ns = nr.ctime_ns = nr.btime_ns = now;
	nr.generation = 1;
	if (dir)
		nr.parent = op->ino;
	if (type == S_IFLNK) {
		nr.symlink.data = (uint8_t *)nop->link;
		nr.symlink.len = nop->link_len;
		nr.size = nop->link_len;
	}
	if (type == S_IFCHR || type == S_IFBLK)
		nr.rdev = nop->rdev;

	pr = efs_fs_rec_dup(prec);
	if (!pr) {
		efs_mem_free(acc);
		return -ENOMEM;
	}
	pr->mtime_ns = pr->ctime_ns = now;
	if (dir)
		pr->nlink++;
	r = efs_fs_put_inode(op, op->ino, pr, false);
	if (r == 0)
		r = efs_fs_put_inode(op, op->new_ino, &nr, true);
	if (r == 0)
		r = efs_fs_put_dirent(op, op->ino, nop->name, nop->name_len, op->new_ino,
				      efs_meta_dt_from_mode(nr.mode), true, 0);
	/* A created file is open: its reference rides the create. */
	if (r == 0 && op->d->code == EFS_FS_OP_CREATE && fs->reclaim_priv)
		r = efs_fs_oref_put_txn(fs, op->txn, op->new_ino);
	if (r == 0 && store_acc)
		r = put_xattr(op, op->new_ino, ACL_ACCESS, acc, akv->val_len);
	if (r == 0 && akv && dir)
		r = put_xattr(op, op->new_ino, ACL_DEFAULT, akv->val, akv->val_len);
	protobuf_c_message_free_unpacked(&pr->base, efs_mem_protobuf());
	efs_mem_free(acc);
	(void)fs;
	return r;
}

static void mk_done(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct efs_fs *fs = op->fs;
	struct efs_fs_inode *in = efs_fs_ifind(fs, op->new_ino);
	struct efs_fs_handle *h;
	struct fuse_entry_param e;

	ns_committed(op);
	if (!in || !in->rec) {
		/* Committed, yet the record did not decode into the cache
		 * (ENOMEM): the kernel will look the name up again. */
		efs_fs_rq_err(op->rq, -ENOMEM);
		return;
	}
	if (op->d->code != EFS_FS_OP_CREATE) {
		efs_fs_reply_entry(op, op->ino, nop->name, nop->name_len, op->new_ino, in->rec,
				   false);
		return;
	}
	if (fs->reclaim_priv)
		efs_fs_oref_set(fs, op->new_ino, op->commit_rev);
	{
		int r = efs_fs_data_open_handle(fs, op->new_ino, &nop->fi, true);

		if (r < 0) {
			efs_fs_rq_err(op->rq, r);
			return;
		}
		h = (struct efs_fs_handle *)(uintptr_t)nop->fi.fh;
	}
	efs_fs_fill_entry(fs, op->ino, nop->name, nop->name_len, op->new_ino, in->rec, false, &e);
	if (efs_fs_rq_create(op->rq, &e, &nop->fi) == 0)
		efs_fs_inode_ref_kernel(fs, op->new_ino);
	else
		efs_fs_handle_free(fs, h);
}

#define MK_DESC(var, opc, orig)                                                                    \
	NS_DESC_B(var, opc, orig, true, true, true, mk_plan, NULL, mk_build, mk_done, mk_batchable)

MK_DESC(create_desc, EFS_FS_OP_CREATE, EFS_FS_ORIG_CREATE);
MK_DESC(mknod_desc, EFS_FS_OP_MKNOD, EFS_FS_ORIG_MKNOD);
MK_DESC(mkdir_desc, EFS_FS_OP_MKDIR, EFS_FS_ORIG_MKDIR);
MK_DESC(symlink_desc, EFS_FS_OP_SYMLINK, EFS_FS_ORIG_SYMLINK);

static void mk_start(fuse_req_t req, const struct efs_fs_opdesc *d, fuse_ino_t parent,
		     const char *name, mode_t mode, dev_t rdev, const char *link,
		     struct fuse_file_info *fi)
{
	struct efs_fs_op *op = efs_fs_op_start(req, d, parent);
	struct ns_op *nop = nop_of(op);
	int r;

	if (!op)
		return;
	r = set_name(op, name, false);
	if (r < 0)
		goto fail;
	nop->mode = mode;
	nop->rdev = rdev;
	if (fi)
		nop->fi = *fi;
	if (link) {
		nop->link_len = strlen(link);
		if (nop->link_len == 0) {
			r = -ENOENT;
			goto fail;
		}
		if (nop->link_len > EFS_META_SYMLINK_MAX) {
			r = -ENAMETOOLONG;
			goto fail;
		}
		nop->link = efs_mem_strdup(link);
		if (!nop->link) {
			r = -ENOMEM;
			goto fail;
		}
	}
	if (op->fs->read_only) {
		r = -EROFS;
		goto fail;
	}
	efs_fs_op_run(op);
	return;
fail:
	efs_fs_op_finish(op, r);
}

void efs_fs_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		   struct fuse_file_info *fi)
{
	mk_start(req, &create_desc, parent, name, (mode & 07777) | S_IFREG, 0, NULL, fi);
}

void efs_fs_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	switch (mode & S_IFMT) {
	case 0:
		mode |= S_IFREG;
		break;
	case S_IFREG:
	case S_IFIFO:
	case S_IFSOCK:
	case S_IFCHR:
	case S_IFBLK:
		break;
	default: {
		struct efs_fs *fs = fuse_req_userdata(req);

		efs_fs_reply_now(fs, req, EFS_FS_OP_MKNOD, -EINVAL);
		return;
	}
	}
	mk_start(req, &mknod_desc, parent, name, mode, rdev, NULL, NULL);
}

void efs_fs_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	mk_start(req, &mkdir_desc, parent, name, (mode & 07777) | S_IFDIR, 0, NULL, NULL);
}

void efs_fs_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	mk_start(req, &symlink_desc, parent, name, S_IFLNK | 0777, 0, link, NULL);
}

/* ---- link ---- */

static int link_plan(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct mk_priv *p = &nop_of(op)->u.mk;
	const Etcfs__Inode *rec, *prec;
	int r;

	if (op->loads_done == 0) {
		r = efs_fs_want(op, nop->ino2, EFS_LOCK_EXCLUSIVE);
		if (r == 0)
			r = efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
		return r;
	}
	rec = efs_fs_rec(op, op->ino);
	prec = efs_fs_rec(op, nop->ino2);
	if (!rec || rec->nlink == 0)
		return -ENOENT;
	if (S_ISDIR(rec->mode))
		return -EPERM;
	r = dir_check(prec);
	if (r < 0)
		return r;
	if (rec->nlink >= EFS_META_LINK_MAX)
		return -EMLINK;
	return check_new_name(op, p, nop->ino2, nop->name2, nop->name2_len);
}

static int link_build(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	Etcfs__Inode *pr = NULL, *ir = NULL;
	int64_t now = efs_fs_now();
	int r = -ENOMEM;

	pr = efs_fs_rec_dup(efs_fs_rec(op, nop->ino2));
	ir = efs_fs_rec_dup(efs_fs_rec(op, op->ino));
	if (!pr || !ir)
		goto out;
	pr->mtime_ns = pr->ctime_ns = now;
	ir->nlink++;
	ir->ctime_ns = now;
	r = efs_fs_put_inode(op, nop->ino2, pr, false);
	if (r == 0)
		r = efs_fs_put_inode(op, op->ino, ir, false);
	if (r == 0)
		r = efs_fs_put_dirent(op, nop->ino2, nop->name2, nop->name2_len, op->ino,
				      efs_meta_dt_from_mode(ir->mode), true, 0);
out:
	if (pr)
		protobuf_c_message_free_unpacked(&pr->base, efs_mem_protobuf());
	if (ir)
		protobuf_c_message_free_unpacked(&ir->base, efs_mem_protobuf());
	return r;
}

static void link_done(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

	ns_committed(op);
	if (in && in->rec)
		efs_fs_reply_entry(op, nop->ino2, nop->name2, nop->name2_len, op->ino, in->rec, false);
}

NS_DESC(link_desc, EFS_FS_OP_LINK, EFS_FS_ORIG_LINK, true, false, true, link_plan, NULL, link_build,
	link_done);

void efs_fs_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct efs_fs_op *op = efs_fs_op_start(req, &link_desc, ino);
	struct ns_op *nop = nop_of(op);
	int r;

	if (!op)
		return;
	nop->ino2 = newparent;
	r = set_name(op, newname, true);
	if (r < 0) {
		efs_fs_op_finish(op, r);
		return;
	}
	efs_fs_op_run(op);
}

/* ---- unlink and rmdir ---- */

static int rm_plan(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	bool rmdir = op->d->code == EFS_FS_OP_RMDIR;
	struct rm_priv *p = &nop_of(op)->u.rm;
	const Etcfs__Inode *crec;
	struct efs_fs_kv *kv;
	int r;

	if (op->loads_done == 0) {
		r = efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
		if (r < 0)
			return r;
		kv = efs_fs_want_kv(op);
		return efs_meta_key_dirent(&op->fs->ns, op->ino, nop->name, nop->name_len, &kv->key);
	}
	r = dir_check(efs_fs_rec(op, op->ino));
	if (r < 0)
		return r;
	r = decode_dirent(&op->kv[0], &nop->child, &nop->child_type);
	if (r < 0)
		return r;
	if (!rmdir && nop->child_type == DT_DIR)
		return -EISDIR;
	if (rmdir && nop->child_type != DT_DIR)
		return -ENOTDIR;
	if (nop->child == EFS_META_ROOT_INO)
		return -EBUSY;
	r = efs_fs_want(op, nop->child, EFS_LOCK_EXCLUSIVE);
	if (r < 0)
		return r;
	if (rmdir) {
		r = want_empty_kv(op, nop->child, &p->empty_kv);
		if (r < 0)
			return r;
	} else if ((!p->oref_kv || p->oref_ino != nop->child) && op->fs->reclaim_priv) {
		/* Again when a replan found another child under the name. */
		r = efs_fs_want_keys(op, EFS_META_K_OPEN, nop->child, 0);
		if (r < 0)
			return r;
		p->oref_kv = r;
		p->oref_ino = nop->child;
	}
	if (!slot_ready(op, nop->child) || op->nkv_loaded < op->nkv)
		return EFS_FS_CONT;
	crec = efs_fs_rec(op, nop->child);
	if (crec && rmdir && !S_ISDIR(crec->mode))
		return -ENOTDIR;
	if (crec && !rmdir && S_ISDIR(crec->mode))
		return -EISDIR;
	if (rmdir && op->kv[p->empty_kv - 1].found)
		return -ENOTEMPTY;
	return EFS_FS_CONT;
}

static int rm_build(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	bool rmdir = op->d->code == EFS_FS_OP_RMDIR;
	const Etcfs__Inode *crec = efs_fs_rec(op, nop->child);
	Etcfs__Inode *pr = NULL, *cr = NULL;
	int64_t now = efs_fs_now();
	int r = -ENOMEM;

	pr = efs_fs_rec_dup(efs_fs_rec(op, op->ino));
	if (!pr)
		goto out;
	pr->mtime_ns = pr->ctime_ns = now;
	if (rmdir && pr->nlink > 2)
		pr->nlink--;
	r = efs_fs_put_inode(op, op->ino, pr, false);
	if (r == 0)
		r = efs_fs_del_dirent(op, op->ino, nop->name, nop->name_len, op->kv[0].mod_rev);
	if (r < 0 || !crec)
		goto out; /* a dangling name: removing it is all there is to do */
	r = -ENOMEM;
	cr = efs_fs_rec_dup(crec);
	if (!cr)
		goto out;
	cr->ctime_ns = now;
	if (rmdir) {
		cr->nlink = 0;
		r = cmp_empty(op, nop->child);
	} else {
		cr->nlink = cr->nlink ? cr->nlink - 1 : 0;
		r = 0;
	}
	if (r < 0)
		goto out;
	if (cr->nlink == 0)
		r = drop_or_orphan(op, nop->child, cr, rmdir ? 0 : nop->u.rm.oref_kv);
	else
		r = efs_fs_put_inode(op, nop->child, cr, false);
out:
	if (pr)
		protobuf_c_message_free_unpacked(&pr->base, efs_mem_protobuf());
	if (cr)
		protobuf_c_message_free_unpacked(&cr->base, efs_mem_protobuf());
	return r;
}

NS_DESC(unlink_desc, EFS_FS_OP_UNLINK, EFS_FS_ORIG_UNLINK, true, false, false, rm_plan, NULL, rm_build,
	ns_ok_done);
NS_DESC(rmdir_desc, EFS_FS_OP_RMDIR, EFS_FS_ORIG_RMDIR, true, false, false, rm_plan, NULL, rm_build,
	ns_ok_done);

/* Runs |op| once its arguments checked out (|r| == 0) and the filesystem
 * is writable; else ends it with the first error. */
static void run_writer(struct efs_fs_op *op, int r)
{
	if (r == 0 && op->fs->read_only)
		r = -EROFS;
	if (r < 0) {
		efs_fs_op_finish(op, r);
		return;
	}
	efs_fs_op_run(op);
}

static void rm_start(fuse_req_t req, const struct efs_fs_opdesc *d, fuse_ino_t parent,
		     const char *name)
{
	struct efs_fs_op *op = efs_fs_op_start(req, d, parent);
	int r;

	if (!op)
		return;
	r = set_name(op, name, false);
	if (r == -EINVAL && strcmp(name, ".") == 0)
		r = -EINVAL;
	else if (r == -EINVAL && strcmp(name, "..") == 0)
		r = -ENOTEMPTY;
	run_writer(op, r);
}

void efs_fs_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	rm_start(req, &unlink_desc, parent, name);
}

void efs_fs_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	rm_start(req, &rmdir_desc, parent, name);
}

/* ---- rename ---- */

static bool rn_cross_dir(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);

	if (op->ino == nop->ino2)
		return false;
	if (nop->child_type == DT_DIR)
		return true;
	return (nop->flags & RENAME_EXCHANGE) && nop->child2 && nop->child2_type == DT_DIR;
}

static int rn_plan(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct rn_priv *p = &nop_of(op)->u.rn;
	bool exch = nop->flags & RENAME_EXCHANGE;
	const Etcfs__Inode *srec, *trec;
	struct efs_fs_kv *kv;
	int r;

	if (op->loads_done == 0) {
		r = efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
		if (r == 0)
			r = efs_fs_want(op, nop->ino2, EFS_LOCK_EXCLUSIVE);
		if (r < 0)
			return r;
		kv = efs_fs_want_kv(op);
		r = efs_meta_key_dirent(&op->fs->ns, op->ino, nop->name, nop->name_len, &kv->key);
		if (r < 0)
			return r;
		kv = efs_fs_want_kv(op);
		return efs_meta_key_dirent(&op->fs->ns, nop->ino2, nop->name2, nop->name2_len,
					   &kv->key);
	}
	r = dir_check(efs_fs_rec(op, op->ino));
	if (r == 0)
		r = dir_check(efs_fs_rec(op, nop->ino2));
	if (r < 0)
		return r;
	r = decode_dirent(&op->kv[0], &nop->child, &nop->child_type);
	if (r < 0)
		return r;
	nop->child2 = 0;
	nop->child2_type = 0;
	if (op->kv[1].found) {
		r = decode_dirent(&op->kv[1], &nop->child2, &nop->child2_type);
		if (r < 0)
			return r;
	}
	if (exch && !nop->child2)
		return -ENOENT;
	if ((nop->flags & RENAME_NOREPLACE) && nop->child2)
		return -EEXIST;
	if (nop->child2 == nop->child) {
		efs_log_debug("fs: rename %s -> %s in %llu: one inode %llu (dirent revs %lld %lld, "
			      "load %d at %lld)",
			      nop->name, nop->name2, (unsigned long long)op->ino,
			      (unsigned long long)nop->child, (long long)op->kv[0].mod_rev,
			      (long long)op->kv[1].mod_rev, op->loads_done, (long long)op->load_rev);
		/* Two names of one inode (or one name): POSIX says do nothing. */
		efs_fs_rq_err(op->rq, 0);
		return EFS_FS_DONE;
	}
	if (!exch && nop->child2) {
		if (nop->child_type == DT_DIR && nop->child2_type != DT_DIR)
			return -ENOTDIR;
		if (nop->child_type != DT_DIR && nop->child2_type == DT_DIR)
			return -EISDIR;
	}
	if (nop->child == EFS_META_ROOT_INO || nop->child2 == EFS_META_ROOT_INO)
		return -EBUSY;
	r = efs_fs_want(op, nop->child, EFS_LOCK_EXCLUSIVE);
	if (r == 0 && nop->child2)
		r = efs_fs_want(op, nop->child2, EFS_LOCK_EXCLUSIVE);
	if (r < 0)
		return r;
	if (!exch && nop->child2 && nop->child2_type == DT_DIR) {
		r = want_empty_kv(op, nop->child2, &p->empty_kv);
		if (r < 0)
			return r;
	} else if (!exch && nop->child2 && (!p->oref_kv || p->oref_ino != nop->child2) &&
		   op->fs->reclaim_priv) {
		/* Again when a replan found another inode under the name. */
		r = efs_fs_want_keys(op, EFS_META_K_OPEN, nop->child2, 0);
		if (r < 0)
			return r;
		p->oref_kv = r;
		p->oref_ino = nop->child2;
	}
	if (rn_cross_dir(op) && !p->seq_kv) {
		kv = efs_fs_want_kv(op);
		if (!kv)
			return -E2BIG;
		r = efs_meta_key_renameseq(&op->fs->ns, &kv->key);
		if (r < 0)
			return r;
		p->seq_kv = (int)op->nkv;
		p->walked = false;
	}
	if (!slot_ready(op, nop->child) || (nop->child2 && !slot_ready(op, nop->child2)) ||
	    op->nkv_loaded < op->nkv)
		return EFS_FS_CONT;
	srec = efs_fs_rec(op, nop->child);
	trec = nop->child2 ? efs_fs_rec(op, nop->child2) : NULL;
	if (!srec) {
		efs_log_debug("fs: rename: dirent %s in %llu names missing inode %llu (dirent rev "
			      "%lld, load %d at %lld, inode rev %lld)",
			      nop->name, (unsigned long long)op->ino, (unsigned long long)nop->child,
			      (long long)op->kv[0].mod_rev, op->loads_done, (long long)op->load_rev,
			      (long long)efs_fs_rec_rev(op, nop->child));
		return -ENOENT;
	}
	if (nop->child2 && !trec && exch)
		return -ENOENT;
	if (p->empty_kv && op->kv[p->empty_kv - 1].found)
		return -ENOTEMPTY;
	p->walk = rn_cross_dir(op);
	return EFS_FS_CONT;
}

/* The ancestor walk of a cross-directory directory rename: no moved
 * directory may become its own ancestor. Records are read linearizably;
 * renameseq, read before and compared in the transaction, makes the walk's
 * answer hold at commit time. */
static void walk_step(struct efs_fs_op *op);

static void walk_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;
	struct rn_priv *p = &nop_of(op)->u.rn;
	Etcfs__Inode *rec = NULL;

	if (r->err) {
		efs_fs_op_note(op, r->err, "ancestor walk read", r->message);
		efs_fs_op_resume_prepare(op, -EIO);
		return;
	}
	if (resp->n_kvs == 0 ||
	    efs_meta_inode_decode(resp->kvs[0]->value.data, resp->kvs[0]->value.len, &rec,
				  NULL) < 0 ||
	    !S_ISDIR(rec->mode)) {
		efs_meta_record_free(rec);
		/* An ancestor vanished or is not a directory (a peer moved or
		 * removed it meanwhile): reload, plan and walk again. */
		p->walked = false;
		efs_fs_op_restart(op);
		return;
	}
	p->cur = rec->parent;
	efs_meta_record_free(rec);
	walk_step(op);
}

static uint64_t walk_parent_cached(struct efs_fs_op *op, uint64_t ino, bool *found)
{
	const Etcfs__Inode *rec;

	for (size_t i = 0; i < op->nslots; i++) {
		if (op->slots[i].ino != ino)
			continue;
		rec = efs_fs_rec(op, ino);
		if (rec) {
			*found = true;
			return rec->parent;
		}
	}
	*found = false;
	return 0;
}

static void walk_step(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct rn_priv *p = &nop_of(op)->u.rn;
	bool exch = nop->flags & RENAME_EXCHANGE;
	struct efs_meta_key k;
	bool found;
	int r;

	for (;;) {
		uint64_t target = p->phase == 0 ? nop->child : nop->child2;
		uint64_t par;

		if (p->cur == target) {
			efs_fs_op_resume_prepare(op, -EINVAL);
			return;
		}
		if (p->cur == EFS_META_ROOT_INO || p->cur == 0) {
			if (p->phase == 0 && exch && nop->child2_type == DT_DIR) {
				p->phase = 1;
				p->cur = op->ino;
				p->depth = 0;
				continue;
			}
			p->walked = true;
			efs_fs_op_resume_prepare(op, 0);
			return;
		}
		if (++p->depth > WALK_MAX) {
			efs_fs_op_resume_prepare(op, -ELOOP);
			return;
		}
		par = walk_parent_cached(op, p->cur, &found);
		if (!found)
			break;
		p->cur = par;
	}
	r = efs_meta_key_inode(&op->fs->ns, p->cur, &k);
	if (r == 0)
		r = efs_etcd_range(op->fs->c, k.buf, k.len, NULL, NULL, walk_cb, op);
	if (r < 0)
		efs_fs_op_resume_prepare(op, -EIO);
}

/* One modified copy per distinct inode of the rename. */
struct rn_recs {
	uint64_t ino[4];
	Etcfs__Inode *rec[4];
	size_t n;
};

static Etcfs__Inode *rn_get(struct efs_fs_op *op, struct rn_recs *rs, uint64_t ino)
{
	for (size_t i = 0; i < rs->n; i++)
		if (rs->ino[i] == ino)
			return rs->rec[i];
	if (rs->n == 4)
		return NULL;
	rs->rec[rs->n] = efs_fs_rec_dup(efs_fs_rec(op, ino));
	if (!rs->rec[rs->n])
		return NULL;
	rs->ino[rs->n] = ino;
	return rs->rec[rs->n++];
}

/* The growth guard for a new name, and the ancestor walk. */
static int rn_prepare(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct rn_priv *p = &nop_of(op)->u.rn;
	bool exch = nop->flags & RENAME_EXCHANGE;

	if (!exch && !op->kv[1].found && efs_capacity_check_growth(op->fs->cap) < 0)
		return -ENOSPC; /* a new name: metadata growth */
	if (p->walk && !p->walked) {
		/* S moves under ino2: S may not be ino2 or above it; for an
		 * exchange, T moves under ino likewise. */
		p->phase = nop->child_type == DT_DIR ? 0 : 1;
		p->cur = p->phase == 0 ? nop->ino2 : op->ino;
		p->depth = 0;
		walk_step(op);
		return EFS_FS_WAIT;
	}
	return EFS_FS_CONT;
}

static int rn_build(struct efs_fs_op *op)
{
	struct ns_op *nop = nop_of(op);
	struct rn_priv *p = &nop_of(op)->u.rn;
	bool exch = nop->flags & RENAME_EXCHANGE;
	bool cross = op->ino != nop->ino2;
	struct rn_recs rs = {0};
	Etcfs__Inode *pr, *npr, *sr, *tr = NULL;
	int64_t now = efs_fs_now();
	int r = -ENOMEM;

	pr = rn_get(op, &rs, op->ino);
	npr = rn_get(op, &rs, nop->ino2);
	sr = rn_get(op, &rs, nop->child);
	if (nop->child2 && efs_fs_rec(op, nop->child2))
		tr = rn_get(op, &rs, nop->child2);
	if (!pr || !npr || !sr || (nop->child2 && efs_fs_rec(op, nop->child2) && !tr))
		goto out;
	pr->mtime_ns = pr->ctime_ns = now;
	npr->mtime_ns = npr->ctime_ns = now;
	sr->ctime_ns = now;
	if (exch) {
		if (tr)
			tr->ctime_ns = now;
		if (cross && S_ISDIR(sr->mode)) {
			sr->parent = nop->ino2;
			pr->nlink--;
			npr->nlink++;
		}
		if (cross && tr && S_ISDIR(tr->mode)) {
			tr->parent = op->ino;
			npr->nlink--;
			pr->nlink++;
		}
		r = efs_fs_put_dirent(op, op->ino, nop->name, nop->name_len, nop->child2,
				      nop->child2_type, false, op->kv[0].mod_rev);
		if (r == 0)
			r = efs_fs_put_dirent(op, nop->ino2, nop->name2, nop->name2_len, nop->child,
					      nop->child_type, false, op->kv[1].mod_rev);
	} else {
		if (cross && S_ISDIR(sr->mode)) {
			sr->parent = nop->ino2;
			pr->nlink--;
			npr->nlink++;
		}
		if (tr) {
			tr->ctime_ns = now;
			if (S_ISDIR(tr->mode)) {
				tr->nlink = 0;
				npr->nlink--;
				r = cmp_empty(op, nop->child2);
				if (r < 0)
					goto out;
			} else if (tr->nlink) {
				tr->nlink--;
			}
		}
		if (npr->nlink > EFS_META_LINK_MAX) {
			r = -EMLINK;
			goto out;
		}
		r = efs_fs_del_dirent(op, op->ino, nop->name, nop->name_len, op->kv[0].mod_rev);
		if (r == 0)
			r = efs_fs_put_dirent(op, nop->ino2, nop->name2, nop->name2_len, nop->child,
					      nop->child_type, !op->kv[1].found, op->kv[1].mod_rev);
	}
	if (r < 0)
		goto out;
	if (npr->nlink > EFS_META_LINK_MAX || pr->nlink > EFS_META_LINK_MAX) {
		r = -EMLINK;
		goto out;
	}
	/* Inode writes, the source parent first (its op_id tells "applied"). */
	r = efs_fs_put_inode(op, op->ino, pr, false);
	if (r == 0 && cross)
		r = efs_fs_put_inode(op, nop->ino2, npr, false);
	if (r == 0 && nop->child != op->ino && nop->child != nop->ino2)
		r = efs_fs_put_inode(op, nop->child, sr, false);
	if (r == 0 && tr && nop->child2 != op->ino && nop->child2 != nop->ino2) {
		if (tr->nlink == 0)
			r = drop_or_orphan(op, nop->child2, tr,
					   S_ISDIR(tr->mode) ? 0 : p->oref_kv);
		else
			r = efs_fs_put_inode(op, nop->child2, tr, false);
	}
	if (r == 0 && p->walk) {
		struct efs_fs_kv *kv = &op->kv[p->seq_kv - 1];
		Etcfs__RenameSeq *seq = NULL;
		Etcfs__RenameSeq ns = ETCFS__RENAME_SEQ__INIT;
		struct efs_meta_key k;

		if (kv->found &&
		    efs_meta_renameseq_decode(kv->val, kv->val_len, &seq, NULL) == 0) {
			ns.seq = seq->seq + 1;
			efs_meta_record_free(seq);
		} else {
			ns.seq = 1;
		}
		r = efs_meta_key_renameseq(&op->fs->ns, &k);
		if (r == 0)
			r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
						 k.buf, k.len, kv->found ? kv->mod_rev : 0);
		if (r == 0)
			r = efs_meta_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, &k, &ns.base, 0);
		p->walked = false; /* a retry walks again */
	}
out:
	for (size_t i = 0; i < rs.n; i++)
		protobuf_c_message_free_unpacked(&rs.rec[i]->base, efs_mem_protobuf());
	return r;
}

NS_DESC(rename_desc, EFS_FS_OP_RENAME, EFS_FS_ORIG_RENAME, true, false, false, rn_plan, rn_prepare,
	rn_build, ns_ok_done);

void efs_fs_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		   const char *newname, unsigned int flags)
{
	struct efs_fs_op *op = efs_fs_op_start(req, &rename_desc, parent);
	struct ns_op *nop = nop_of(op);
	int r;

	if (!op)
		return;
	nop->ino2 = newparent;
	nop->flags = flags;
	r = set_name(op, name, false);
	if (r == 0)
		r = set_name(op, newname, true);
	if (r == 0 && (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)))
		r = -EINVAL;
	if (r == 0 && (flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		r = -EINVAL;
	run_writer(op, r);
}
