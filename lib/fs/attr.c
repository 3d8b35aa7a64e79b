/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Attribute operations: getattr, setattr, readlink, statfs, and the
 * permission check of a caller against an inode record. Size changes go
 * to the data path (file/truncate.c); open handles and atime are in
 * handle.c.
 */
#include <errno.h>
#include <string.h>

#include "fs/fs-int.h"
#include "alloc/alloc.h"
#include "fs/data.h"
#include "util/clock.h"
#include "util/mem.h"
#include "util/timer.h"

#define ACL_ACCESS "system.posix_acl_access"

/* ---- getattr ---- */

/*
 * Whether a read's GETATTR may pass a drain of the lock: always while
 * the lock is cacheable (no recall known, so no drain either), else once
 * per grant, so that threads reading cached pages without a gap cannot
 * hold a recall back for ever (the READs still pass, as they always did).
 */
static bool readpin_may_pass(struct efs_fs *fs, uint64_t ino)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, ino);
	uint64_t g;

	if (!in || !fs->lc)
		return false;
	if (efs_lock_may_cache(fs->lc, ino))
		return true;
	g = efs_fs_grant(fs, in);
	if (!g || in->rd_pass_grant == g)
		return false;
	in->rd_pass_grant = g;
	return true;
}

struct getattr_op {
	struct efs_fs_op op;
	uint64_t fh; /* the handle a read revalidates through; 0: a stat */
	uint32_t pid;
};

static int getattr_plan(struct efs_fs_op *op)
{
	struct getattr_op *gop = (struct getattr_op *)op; /* op is the first member */
	const Etcfs__Inode *rec = NULL;
	int r = efs_fs_plan_shared(op, &rec);

	if (r <= 0)
		return r;
	efs_fs_reply_attr(op, op->ino, rec);
	if (gop->fh && S_ISREG(rec->mode) && op->lock_pinned)
		efs_fs_readpin_take(op->fs, &op->lr, op->ino, gop->pid, gop->fh);
	return EFS_FS_DONE;
}

static const struct efs_fs_opdesc getattr_desc = {
	.code = EFS_FS_OP_GETATTR,
	.size = sizeof(struct getattr_op),
	.plan = getattr_plan,
	.build = efs_fs_no_build,
	.done = efs_fs_no_done,
};

void efs_fs_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct efs_fs *fs = fuse_req_userdata(req);
	uint32_t pid = (uint32_t)fuse_req_ctx(req)->pid;
	uint64_t seq = fs->readpin_seq;
	struct efs_fs_op *op;

	op = efs_fs_op_start(req, &getattr_desc, ino);
	if (!op)
		return;
	if (fi && fi->fh && efs_fs_handle_check(op->fs, efs_fs_fh_of(fi)) < 0) {
		efs_fs_op_finish(op, -EIO);
		return;
	}
	if (fi && fi->fh) {
		struct getattr_op *gop = (struct getattr_op *)op;

		gop->fh = fi->fh;
		gop->pid = pid;
		if (readpin_may_pass(fs, ino))
			op->lock_flags |= EFS_LOCK_F_PAGES;
	}
	efs_fs_op_run(op);
	/* The thread's earlier read (or open) is over; its pin goes only
	 * now, once this GETATTR pinned the lock or waits for it, so that
	 * no release slips in between. */
	if (fi && fi->fh)
		efs_fs_readpins_drop_upto(fs, ino, pid, 0, seq);
}

/* ---- setattr ---- */

/* A setattr's record (one that neither truncates nor is deferred by the
 * data path): the engine's base (op.ino the inode) and the attributes. */
struct setattr_op {
	struct efs_fs_op op;
	struct stat attr;
	int to_set; /* FUSE_SET_ATTR_* */
};

static struct setattr_op *sop_of(struct efs_fs_op *op)
{
	return (struct setattr_op *)op; /* op is the first member */
}

static int setattr_plan(struct efs_fs_op *op)
{
	struct setattr_op *sop = sop_of(op);
	const Etcfs__Inode *rec;
	struct efs_fs_kv *kv;

	if (op->loads_done == 0)
		return efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
	rec = efs_fs_rec(op, op->ino);
	if (!rec)
		return EFS_FS_GONE;
	/* chmod rewrites the access ACL's mask (or group) entry too. */
	if ((sop->to_set & FUSE_SET_ATTR_MODE) && op->fs->posix_acl && rec->xattr_count > 0 &&
	    op->nkv == 0) {
		kv = efs_fs_want_kv(op);
		if (!kv)
			return -E2BIG;
		return efs_meta_key_xattr(&op->fs->ns, op->ino, ACL_ACCESS, strlen(ACL_ACCESS),
					  &kv->key);
	}
	return EFS_FS_CONT;
}

static int setattr_build(struct efs_fs_op *op)
{
	struct setattr_op *sop = sop_of(op);
	const Etcfs__Inode *cur = efs_fs_rec(op, op->ino);
	Etcfs__Inode *rec;
	int r;

	if (!cur)
		return EFS_FS_GONE;
	rec = efs_fs_rec_dup(cur);
	if (!rec)
		return -ENOMEM;
	r = efs_fs_setattr_apply(rec, &sop->attr, sop->to_set, efs_fs_now());
	if (r == 0)
		r = efs_fs_put_inode(op, op->ino, rec, false);
	if (r == 0 && op->nkv && op->nkv_loaded && op->kv[0].found) {
		uint8_t *acl = efs_mem_memdup(op->kv[0].val, op->kv[0].val_len);
		struct efs_meta_key k;

		r = acl ? 0 : -ENOMEM;
		if (r == 0 && efs_fs_acl_chmod(acl, op->kv[0].val_len, rec->mode) == 0) {
			r = efs_meta_key_xattr(&op->fs->ns, op->ino, ACL_ACCESS, strlen(ACL_ACCESS),
					       &k);
			if (r == 0)
				r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD,
							 EFS_ETCD_CMP_EQUAL, k.buf, k.len,
							 op->kv[0].mod_rev);
			if (r == 0)
				r = efs_etcd_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len,
						     acl, op->kv[0].val_len, 0);
		}
		efs_mem_free(acl);
	}
	protobuf_c_message_free_unpacked(&rec->base, efs_mem_protobuf());
	return r;
}

static void setattr_done(struct efs_fs_op *op)
{
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

	if (in && in->rec) {
		struct stat st;

		efs_meta_inode_to_stat(in->rec, op->ino, op->fs->blksize, &st);
		efs_fs_rq_attr(op->rq, &st, efs_fs_setattr_timeout(op->fs, op->ino, st.st_mode));
	}
}

static const struct efs_fs_opdesc setattr_desc = {
	.code = EFS_FS_OP_SETATTR,
	.size = sizeof(struct setattr_op),
	.origin = EFS_FS_ORIG_SETATTR,
	.mutates = true,
	.plan = setattr_plan,
	.build = setattr_build,
	.done = setattr_done,
};

void efs_fs_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		    struct fuse_file_info *fi)
{
	struct efs_fs_op *op;

	/* Truncates, and deferred attributes of files this node is writing. */
	if (efs_fs_data_setattr(req, ino, attr, to_set, fi))
		return;
	op = efs_fs_op_start(req, &setattr_desc, ino);
	if (!op)
		return;
	if (fi && fi->fh && efs_fs_handle_check(op->fs, efs_fs_fh_of(fi)) < 0) {
		efs_fs_op_finish(op, -EIO);
		return;
	}
	sop_of(op)->attr = *attr;
	sop_of(op)->to_set = to_set;
	efs_fs_op_run(op);
}

/* ---- readlink ---- */

static int readlink_plan(struct efs_fs_op *op)
{
	const Etcfs__Inode *rec = NULL;
	char *buf;
	int r = efs_fs_plan_shared(op, &rec);

	if (r <= 0)
		return r;
	if (!S_ISLNK(rec->mode) || rec->symlink.len == 0)
		return -EINVAL;
	buf = efs_mem_malloc(rec->symlink.len + 1);
	if (!buf)
		return -ENOMEM;
	memcpy(buf, rec->symlink.data, rec->symlink.len);
	buf[rec->symlink.len] = 0;
	efs_fs_rq_readlink(op->rq, buf);
	efs_mem_free(buf);
	return EFS_FS_DONE;
}

static const struct efs_fs_opdesc readlink_desc = {
	.code = EFS_FS_OP_READLINK,
	.plan = readlink_plan,
	.build = efs_fs_no_build,
	.done = efs_fs_no_done,
};

void efs_fs_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct efs_fs_op *op = efs_fs_op_start(req, &readlink_desc, ino);

	if (op)
		efs_fs_op_run(op);
}

/* ---- access ---- */

static bool in_groups(gid_t g, gid_t gid, const gid_t *groups, size_t n)
{
	if (g == gid)
		return true;
	for (size_t i = 0; i < n; i++)
		if (groups[i] == g)
			return true;
	return false;
}

int efs_fs_access_check(const Etcfs__Inode *rec, int mask, uid_t uid, gid_t gid,
			const gid_t *groups, size_t ngroups)
{
	unsigned want = 0, have;

	if (mask == F_OK)
		return 0;
	if (mask & R_OK)
		want |= 4;
	if (mask & W_OK)
		want |= 2;
	if (mask & X_OK)
		want |= 1;
	if (uid == 0) {
		/* Root may read and write anything; execute needs one x bit
		 * (directories are always searchable). */
		if ((want & 1) && !S_ISDIR(rec->mode) && !(rec->mode & 0111))
			return -EACCES;
		return 0;
	}
	if (rec->uid == uid)
		have = (rec->mode >> 6) & 7;
	else if (in_groups(rec->gid, gid, groups, ngroups))
		have = (rec->mode >> 3) & 7;
	else
		have = rec->mode & 7;
	return (want & ~have) ? -EACCES : 0;
}


/* ---- statfs ---- */

struct statfs_state {
	uint32_t batch_start; /* first group of the read in flight */
	uint32_t next_group;
	uint64_t free_sum;
	bool counted;
};

static void statfs_reply(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	struct statvfs st;
	uint64_t total = 0, limit = fs->fi->inode_limit;

	memset(&st, 0, sizeof(st));
	if (fs->fi->block_size && fs->fi->device_size / fs->fi->block_size > fs->fi->data_start)
		total = fs->fi->device_size / fs->fi->block_size - fs->fi->data_start;
	st.f_bsize = fs->blksize;
	st.f_frsize = fs->blksize;
	st.f_blocks = total;
	st.f_bfree = fs->free_blocks < total ? fs->free_blocks : total;
	st.f_bavail = st.f_bfree;
	if (fs->alloc) {
		/* Blocks this node allocated and has not published yet, and
		 * those it holds for a running backup, are free in the group
		 * maps; and the reserve is not for new data. */
		struct efs_alloc_stats as;
		uint64_t busy;

		efs_alloc_get_stats(fs->alloc, &as);
		busy = as.pending_blocks + as.held_blocks;
		st.f_bfree = st.f_bfree > busy ? st.f_bfree - busy : 0;
		st.f_bavail = st.f_bfree > as.reserve_blocks ? st.f_bfree - as.reserve_blocks : 0;
	}
	st.f_files = limit;
	/* Below zero, the estimate (see count_check) says only that this
	 * node deleted more than its last count knew of. */
	st.f_ffree = fs->icount < 0			 ? limit
		     : limit > (uint64_t)fs->icount ? limit - (uint64_t)fs->icount
						     : 0;
	st.f_favail = st.f_ffree;
	st.f_namemax = EFS_META_NAME_MAX;
	st.f_fsid = 0;
	efs_fs_rq_statfs(op->rq, &st);
	efs_fs_op_finish(op, 0);
}

static void statfs_next(struct efs_fs_op *op);

static void statfs_count_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp,
			    void *arg)
{
	struct efs_fs_op *op = arg;
	struct efs_fs *fs = op->fs;

	if (r->err) {
		efs_fs_op_finish(op, -EIO);
		return;
	}
	fs->icount = resp->count;
	fs->count_known = true;
	fs->icount_ns = efs_clock_mono_ns();
	fs->statfs_ns = fs->icount_ns;
	statfs_reply(op);
}

static void statfs_ag_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_fs_op *op = arg;
	struct statfs_state *ss = op->priv;

	if (r->err) {
		if ((r->outcome_unknown || r->err == -ETIMEDOUT) &&
		    ++op->read_tries <= EFS_FS_RETRY_MAX) {
			efs_counter_inc(op->fs->m_retries);
			ss->next_group = ss->batch_start;
			statfs_next(op);
			return;
		}
		efs_fs_op_finish(op, -EIO);
		return;
	}
	ss->free_sum += efs_meta_ag_free_sum(resp);
	statfs_next(op);
}

static void statfs_after_batch(void *arg, int status)
{
	(void)status; /* a failed batch's inodes are not there: count what is */
	statfs_next(arg);
}

static void statfs_next(struct efs_fs_op *op)
{
	struct efs_fs *fs = op->fs;
	struct statfs_state *ss = op->priv;
	struct efs_etcd_txn *t = NULL;
	int r;

	if (ss->next_group >= fs->fi->ag_count) {
		fs->free_blocks = ss->free_sum;
		/* The inodes of creates answered already count: the batch
		 * of delegated changes commits first. */
		if (efs_fs_batch_busy(fs) && efs_fs_batch_sync(fs, statfs_after_batch, op) == 0)
			return;
		r = efs_fs_count_inodes(fs, statfs_count_cb, op);
		if (r < 0)
			efs_fs_op_finish(op, -EIO);
		return;
	}
	ss->batch_start = ss->next_group;
	r = efs_etcd_txn_new(&t, 0);
	for (uint32_t n = 0; r == 0 && n < 100 && ss->next_group < fs->fi->ag_count; n++) {
		struct efs_meta_key k;

		r = efs_meta_key_ag(&fs->ns, ss->next_group++, EFS_META_K_AG_FREE, &k);
		if (r == 0)
			r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0);
	}
	r = efs_fs_read_txn(fs, t, r, statfs_ag_cb, op);
	if (r < 0)
		efs_fs_op_finish(op, r == -ENOMEM ? -ENOMEM : -EIO);
}

static const struct efs_fs_opdesc statfs_desc = {
	.code = EFS_FS_OP_STATFS,
	.plan = efs_fs_no_build,
	.build = efs_fs_no_build,
	.done = efs_fs_no_done,
};

void efs_fs_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct efs_fs_op *op = efs_fs_op_start(req, &statfs_desc, ino);
	struct efs_fs *fs;

	if (!op)
		return;
	fs = op->fs;
	if (fs->statfs_ns && efs_clock_mono_ns() - fs->statfs_ns < EFS_FS_STATFS_CACHE_NS) {
		statfs_reply(op);
		return;
	}
	op->priv = efs_mem_calloc(1, sizeof(struct statfs_state));
	if (!op->priv) {
		efs_fs_op_finish(op, -ENOMEM);
		return;
	}
	statfs_next(op);
}
