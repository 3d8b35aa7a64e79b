/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Extended attributes: x/<ino><name> = the raw value (at most 64 KiB).
 * The inode record counts them (xattr_count, xattr_bytes), so an inode
 * with none answers getxattr/listxattr from the cache with no etcd read,
 * and every change rewrites the record (its ctime changes anyway).
 * POSIX ACLs are the system.posix_acl_* attributes; with
 * FUSE_CAP_POSIX_ACL the kernel parses, caches and enforces them and keeps
 * the mode in sync through setattr.
 */
#include <errno.h>
#include <string.h>
#include <sys/xattr.h>

#include "fs/fs-int.h"

#include "config.h"
#include "util/mem.h"

/* An xattr operation's record: the engine's base (op.ino the inode), the
 * name, and setxattr's value and flags or the reply size asked. */
struct xattr_op {
	struct efs_fs_op op;
	char name[EFS_META_XATTR_NAME_MAX + 1];
	size_t name_len;
	unsigned flags;	 /* XATTR_CREATE, XATTR_REPLACE */
	uint8_t *value;	 /* efs_mem */
	size_t value_len;
	size_t size;	 /* getxattr, listxattr: the caller's buffer */
	/* efs_fs_xattr_kill_caps: told the outcome once the op is over. */
	void (*kill_cb)(void *arg, int err);
	void *kill_arg;
	int kill_err;
	/* A setxattr of security.capability counted in the inode's
	 * caps_setting; a getxattr of it: the inode's caps_seq when its
	 * read left. */
	bool caps_counted;
	uint64_t caps_seq;
};

static struct xattr_op *xop_of(struct efs_fs_op *op)
{
	return (struct xattr_op *)op; /* op is the first member */
}

/* The file capabilities a write removes. */
static const char caps_name[] = "security.capability";

static bool is_caps(const struct xattr_op *xop)
{
	return xop->name_len == sizeof(caps_name) - 1 &&
	       memcmp(xop->name, caps_name, sizeof(caps_name) - 1) == 0;
}

/*
 * The grant under which |op|'s inode had no security.capability, noted
 * while its lock is pinned; |seen| the inode's caps_seq when the answer's
 * |read| left (none: answered from the cached record now). Not while a
 * setxattr of it by this node is in flight, nor when one started or
 * ended since the read: a getxattr does not take the inode's mutex, so
 * its "none" may predate that setxattr's commit under the same grant.
 */
static void note_no_caps(struct efs_fs_op *op, bool read, uint64_t seen)
{
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

	if (in && in->caps_setting == 0 && (!read || seen == in->caps_seq))
		in->nocaps_grant = efs_fs_grant(op->fs, in);
}

bool efs_fs_known_no_caps(const struct efs_fs *fs, const struct efs_fs_inode *in)
{
	return in && efs_fs_grant_current(fs, in, in->nocaps_grant);
}

static void xattr_release(struct efs_fs_op *op)
{
	struct xattr_op *xop = xop_of(op);

	if (xop->caps_counted) {
		struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

		if (in) {
			in->caps_setting--;
			in->caps_seq++;
			in->nocaps_grant = 0;
		}
	}
	efs_mem_free(xop->value);
}

/* An xattr descriptor: its record (struct xattr_op, freed by
 * xattr_release), opcode, whether it writes, its steps and its end. */
#define XATTR_DESC_DONE(var, opc, mut, plan_, build_, done_)                                       \
	static const struct efs_fs_opdesc var = {                                                  \
		.code = opc,                                                                       \
		.size = sizeof(struct xattr_op),                                                   \
		.origin = EFS_FS_ORIG_XATTR,                                                       \
		.mutates = mut,                                                                    \
		.plan = plan_,                                                                     \
		.build = build_,                                                                   \
		.done = done_,                                                                     \
		.release = xattr_release,                                                          \
	}
#define XATTR_DESC(var, opc, mut, plan_, build_)                                                   \
	XATTR_DESC_DONE(var, opc, mut, plan_, build_, efs_fs_ok_done)

#define P_USER	   "user."
#define P_TRUSTED  "trusted."
#define P_SECURITY "security."
#define P_SYSTEM   "system."

static bool has_prefix(const char *s, const char *p)
{
	return strncmp(s, p, strlen(p)) == 0;
}

int efs_fs_xattr_check(const char *name, size_t value_len, uid_t uid, bool write)
{
	size_t len = strlen(name);
	int r = efs_meta_xattr_name_check(name, len);

	if (r < 0)
		return r;
	if (value_len > EFS_META_XATTR_VALUE_MAX)
		return -E2BIG;
	if (has_prefix(name, P_TRUSTED)) {
		if (uid != 0)
			return write ? -EPERM : -ENODATA;
		return len > strlen(P_TRUSTED) ? 0 : -EINVAL;
	}
	if (has_prefix(name, P_USER) || has_prefix(name, P_SECURITY))
		return len > (size_t)(strchr(name, '.') - name) + 1 ? 0 : -EINVAL;
	if (strcmp(name, "system.posix_acl_access") == 0 ||
	    strcmp(name, "system.posix_acl_default") == 0)
		return 0;
	return -EOPNOTSUPP;
}

/* ---- POSIX ACLs (the posix_acl_xattr format: a little-endian version
 * 2 header, then {tag u16, perm u16, id u32} entries) ---- */

#define ACL_VERSION   2
#define ACL_USER_OBJ  0x01
#define ACL_USER      0x02
#define ACL_GROUP_OBJ 0x04
#define ACL_GROUP     0x08
#define ACL_MASK      0x10
#define ACL_OTHER     0x20

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static void le16_put(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static int acl_count(const uint8_t *v, size_t len)
{
	if (len < 4 || (len - 4) % 8 != 0)
		return -EINVAL;
	if ((v[0] | v[1] << 8 | v[2] << 16 | (uint32_t)v[3] << 24) != ACL_VERSION)
		return -EINVAL;
	return (int)((len - 4) / 8);
}

int efs_fs_acl_to_mode(const uint8_t *v, size_t len, uint32_t *perm, bool *minimal)
{
	int n = acl_count(v, len);
	int u = -1, g = -1, m = -1, o = -1;
	bool ext = false;

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		const uint8_t *e = v + 4 + 8 * i;
		int p = le16(e + 2) & 7;

		switch (le16(e)) {
		case ACL_USER_OBJ:
			u = p;
			break;
		case ACL_GROUP_OBJ:
			g = p;
			break;
		case ACL_MASK:
			m = p;
			break;
		case ACL_OTHER:
			o = p;
			break;
		case ACL_USER:
		case ACL_GROUP:
			ext = true;
			break;
		default:
			return -EINVAL;
		}
	}
	if (u < 0 || g < 0 || o < 0 || (ext && m < 0))
		return -EINVAL;
	*perm = (uint32_t)(u << 6 | (m >= 0 ? m : g) << 3 | o);
	*minimal = !ext && m < 0;
	return 0;
}

int efs_fs_acl_chmod(uint8_t *v, size_t len, uint32_t mode)
{
	int n = acl_count(v, len);
	uint8_t *gobj = NULL;
	bool mask = false;

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		uint8_t *e = v + 4 + 8 * i;

		switch (le16(e)) {
		case ACL_USER_OBJ:
			le16_put(e + 2, (uint16_t)((mode >> 6) & 7));
			break;
		case ACL_GROUP_OBJ:
			gobj = e;
			break;
		case ACL_MASK:
			mask = true;
			le16_put(e + 2, (uint16_t)((mode >> 3) & 7));
			break;
		case ACL_OTHER:
			le16_put(e + 2, (uint16_t)(mode & 7));
			break;
		default:
			break;
		}
	}
	if (!mask && gobj)
		le16_put(gobj + 2, (uint16_t)((mode >> 3) & 7));
	return 0;
}

int efs_fs_acl_inherit(uint8_t *v, size_t len, uint32_t *mode)
{
	uint8_t *gobj = NULL, *mask = NULL;
	uint32_t perm;
	bool minimal;
	int n = acl_count(v, len);

	if (n < 0)
		return n;
	for (int i = 0; i < n; i++) {
		uint8_t *e = v + 4 + 8 * i;
		uint16_t p = le16(e + 2);

		switch (le16(e)) {
		case ACL_USER_OBJ:
			le16_put(e + 2, p & ((*mode >> 6) & 7));
			break;
		case ACL_GROUP_OBJ:
			gobj = e;
			break;
		case ACL_MASK:
			mask = e;
			break;
		case ACL_OTHER:
			le16_put(e + 2, p & (*mode & 7));
			break;
		default:
			break;
		}
	}
	if (mask)
		le16_put(mask + 2, le16(mask + 2) & ((*mode >> 3) & 7));
	else if (gobj)
		le16_put(gobj + 2, le16(gobj + 2) & ((*mode >> 3) & 7));
	if (efs_fs_acl_to_mode(v, len, &perm, &minimal) < 0)
		return -EINVAL;
	*mode = (*mode & ~0777u) | perm;
	return minimal ? 0 : 1;
}

static struct efs_fs_op *op_start(fuse_req_t req, const struct efs_fs_opdesc *d, uint64_t ino,
				  const char *name, size_t value_len, bool write)
{
	struct efs_fs_op *op = efs_fs_op_start(req, d, ino);
	struct xattr_op *xop = xop_of(op);
	int r;

	if (!op)
		return NULL;
	if (name) {
		r = efs_fs_xattr_check(name, value_len, op->uid, write);
		if (r == 0 && write && op->fs->read_only)
			r = -EROFS;
		if (r < 0) {
			efs_fs_op_finish(op, r);
			return NULL;
		}
		xop->name_len = strlen(name);
		memcpy(xop->name, name, xop->name_len + 1);
	}
	return op;
}

static int want_xattr_kv(struct efs_fs_op *op)
{
	struct xattr_op *xop = xop_of(op);
	struct efs_fs_kv *kv = efs_fs_want_kv(op);

	if (!kv)
		return -E2BIG;
	return efs_meta_key_xattr(&op->fs->ns, op->ino, xop->name, xop->name_len, &kv->key);
}

/* ---- setxattr / removexattr ---- */

static int set_plan(struct efs_fs_op *op)
{
	struct xattr_op *xop = xop_of(op);
	bool remove = op->d->code == EFS_FS_OP_REMOVEXATTR;
	bool found;
	int r;

	if (op->loads_done == 0) {
		r = efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
		return r < 0 ? r : want_xattr_kv(op);
	}
	if (!efs_fs_rec(op, op->ino))
		return EFS_FS_GONE;
	found = op->kv[0].found;
	if (remove && !found)
		return -ENODATA;
	if (!remove && (xop->flags & XATTR_CREATE) && found)
		return -EEXIST;
	if (!remove && (xop->flags & XATTR_REPLACE) && !found)
		return -ENODATA;
	return EFS_FS_CONT;
}

static int set_build(struct efs_fs_op *op)
{
	struct xattr_op *xop = xop_of(op);
	bool remove = op->d->code == EFS_FS_OP_REMOVEXATTR;
	const struct efs_fs_kv *kv = &op->kv[0];
	Etcfs__Inode *rec;
	struct efs_meta_key k;
	uint64_t old = kv->found ? xop->name_len + kv->val_len : 0;
	int r;

	if (!remove && efs_capacity_check_growth(op->fs->cap) < 0)
		return -ENOSPC;
	if (!remove && is_caps(xop)) {
		struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

		if (in) {
			if (!xop->caps_counted) {
				xop->caps_counted = true;
				in->caps_setting++;
			}
			in->caps_seq++;
			in->nocaps_grant = 0;
		}
	}
	rec = efs_fs_rec_dup(efs_fs_rec(op, op->ino));
	if (!rec)
		return -ENOMEM;
	if (!remove && strcmp(xop->name, "system.posix_acl_access") == 0) {
		/* The mode follows the ACL (the daemon's job since Linux 6.2),
		 * and an ACL the mode says all of is not stored. */
		uint32_t perm;
		bool minimal;

		r = efs_fs_acl_to_mode(xop->value, xop->value_len, &perm, &minimal);
		if (r < 0) {
			protobuf_c_message_free_unpacked(&rec->base, efs_mem_protobuf());
			return -EINVAL;
		}
		rec->mode = (rec->mode & ~0777u) | perm;
		if (minimal) {
			if (!kv->found) {
				rec->ctime_ns = efs_fs_now();
				r = efs_fs_put_inode(op, op->ino, rec, false);
				protobuf_c_message_free_unpacked(&rec->base, efs_mem_protobuf());
				return r;
			}
			remove = true;
		}
	}
	if (kv->found && rec->xattr_count > 0)
		rec->xattr_count--;
	rec->xattr_bytes = rec->xattr_bytes > old ? rec->xattr_bytes - old : 0;
	if (!remove) {
		rec->xattr_count++;
		rec->xattr_bytes += xop->name_len + xop->value_len;
	}
	if (rec->xattr_count == 0)
		rec->xattr_bytes = 0;
	rec->ctime_ns = efs_fs_now();
	r = efs_fs_put_inode(op, op->ino, rec, false);
	protobuf_c_message_free_unpacked(&rec->base, efs_mem_protobuf());
	if (r == 0)
		r = efs_meta_key_xattr(&op->fs->ns, op->ino, xop->name, xop->name_len, &k);
	if (r < 0)
		return r;
	if (kv->found)
		r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf,
					 k.len, kv->mod_rev);
	else
		r = efs_etcd_txn_compare(op->txn, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, k.buf,
					 k.len, 0);
	if (r < 0)
		return r;
	if (remove)
		return efs_etcd_txn_delete(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
					   false);
	return efs_etcd_txn_put(op->txn, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, xop->value,
				xop->value_len, 0);
}

XATTR_DESC(setxattr_desc, EFS_FS_OP_SETXATTR, true, set_plan, set_build);
XATTR_DESC(removexattr_desc, EFS_FS_OP_REMOVEXATTR, true, set_plan, set_build);

void efs_fs_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
		     size_t size, int flags)
{
	struct efs_fs_op *op;
	struct xattr_op *xop;

#if EFS_FAULT_HOOKS
	if (efs_fs_fault_release(req, ino, name, value, size))
		return;
#endif
	op = op_start(req, &setxattr_desc, ino, name, size, true);
	if (!op)
		return;
	if (flags & ~(XATTR_CREATE | XATTR_REPLACE)) {
		efs_fs_op_finish(op, -EINVAL);
		return;
	}
	xop = xop_of(op);
	xop->flags = (unsigned)flags;
	xop->value = efs_mem_memdup(size ? value : "", size ? size : 1);
	if (!xop->value) {
		efs_fs_op_finish(op, -ENOMEM);
		return;
	}
	xop->value_len = size;
	efs_fs_op_run(op);
}

void efs_fs_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct efs_fs_op *op = op_start(req, &removexattr_desc, ino, name, 0, true);

	if (op)
		efs_fs_op_run(op);
}

/* ---- A write's removal of file capabilities ---- */

/* None now, under the grant held: the next writes need not look. The
 * write's request goes on (no answer from here). */
static void kill_done(struct efs_fs_op *op)
{
	xop_of(op)->kill_err = 0;
	op->handed_on = true;
	note_no_caps(op, false, 0);
}

/* removexattr's plan, except that nothing to remove is done, not ENODATA. */
static int kill_plan(struct efs_fs_op *op)
{
	if (op->loads_done > 0 && efs_fs_rec(op, op->ino) && !op->kv[0].found) {
		kill_done(op);
		return EFS_FS_DONE;
	}
	return set_plan(op);
}

/* After the op let its locks and mutexes go: the continuation may take them. */
static void kill_over(struct efs_fs_op *op)
{
	struct xattr_op *xop = xop_of(op);

	xop->kill_cb(xop->kill_arg, xop->kill_err);
}

XATTR_DESC_DONE(kill_caps_desc, EFS_FS_OP_REMOVEXATTR, true, kill_plan, set_build, kill_done);

int efs_fs_xattr_kill_caps(struct efs_fs *fs, struct efs_fs_rq *rq, uint64_t ino,
			   void (*cb)(void *arg, int err), void *arg)
{
	struct efs_fs_op *op = efs_fs_op_new_for(fs, rq, &kill_caps_desc);
	struct xattr_op *xop;

	if (!op)
		return -ENOMEM;
	op->ino = ino;
	xop = xop_of(op);
	memcpy(xop->name, caps_name, sizeof(caps_name));
	xop->name_len = sizeof(caps_name) - 1;
	xop->kill_cb = cb;
	xop->kill_arg = arg;
	xop->kill_err = -EIO;
	op->priv_free = kill_over;
	efs_fs_op_run(op);
	return 0;
}

/* ---- getxattr / listxattr ---- */

static int reply_sized(struct efs_fs_op *op, const void *buf, size_t len)
{
	struct xattr_op *xop = xop_of(op);

	if (xop->size == 0) {
		efs_fs_rq_xattr(op->rq, len);
		return EFS_FS_DONE;
	}
	if (len > xop->size)
		return -ERANGE;
	efs_fs_rq_buf(op->rq, buf, len);
	return EFS_FS_DONE;
}

/*
 * The plan of getxattr and listxattr: a shared lock, then the read |want|
 * adds, then |answer| once it is loaded; an inode without xattrs is
 * answered at once (|none| true).
 */
static int read_plan(struct efs_fs_op *op, enum efs_lock_mode mode,
		     int (*want)(struct efs_fs_op *op),
		     int (*answer)(struct efs_fs_op *op, bool none))
{
	const Etcfs__Inode *rec = NULL;
	int r;

	if (mode == EFS_LOCK_EXCLUSIVE && op->loads_done == 0) {
		r = efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
		return r < 0 ? r : 0;
	}
	r = efs_fs_plan_shared(op, &rec);
	if (r <= 0)
		return r;
	if (op->nkv == 0)
		return rec->xattr_count == 0 ? answer(op, true) : want(op);
	if (op->nkv_loaded < op->nkv)
		return EFS_FS_CONT;
	return answer(op, false);
}

static int get_answer(struct efs_fs_op *op, bool none)
{
	if (none || !op->kv[0].found) {
		if (is_caps(xop_of(op)))
			note_no_caps(op, !none, xop_of(op)->caps_seq);
		return -ENODATA;
	}
	return reply_sized(op, op->kv[0].val, op->kv[0].val_len);
}

/* The kernel's question before every write through the page cache needs
 * no read while the answer is known under the grant held. */
static int want_get_kv(struct efs_fs_op *op)
{
	struct xattr_op *xop = xop_of(op);

	if (is_caps(xop)) {
		const struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

		if (efs_fs_known_no_caps(op->fs, in))
			return -ENODATA;
		if (in)
			xop->caps_seq = in->caps_seq;
	}
	return want_xattr_kv(op);
}

/*
 * The kernel asks for security.capability before every write, to drop
 * privileges. On a node that has the file open for writing the write
 * comes next and takes the exclusive lock, so the question takes it now:
 * under a shared lock it would recall the last writer's exclusive hold
 * only for the write to recall that shared hold again, two handovers
 * where one does.
 */
static enum efs_lock_mode get_mode(struct efs_fs_op *op)
{
	const struct efs_fs_inode *in;

	if (!is_caps(xop_of(op)))
		return EFS_LOCK_SHARED;
	in = efs_fs_ifind(op->fs, op->ino);
	if (in && in->wopens > 0)
		return EFS_LOCK_EXCLUSIVE;
	return EFS_LOCK_SHARED;
}

static int get_plan(struct efs_fs_op *op)
{
	return read_plan(op, get_mode(op), want_get_kv, get_answer);
}

/* Every xattr key of the inode, names only. */
static int want_names(struct efs_fs_op *op)
{
	int r = efs_fs_want_keys(op, EFS_META_K_XATTR, op->ino, 0);

	return r < 0 ? r : EFS_FS_CONT;
}

static int list_answer(struct efs_fs_op *op, bool none)
{
	struct efs_fs_kv *kv = &op->kv[0];
	size_t total = 0;
	char *buf;
	int r;

	if (none)
		return reply_sized(op, "", 0);
	buf = efs_mem_malloc(kv->nkvs * (EFS_META_XATTR_NAME_MAX + 1) + 1);
	if (!buf)
		return -ENOMEM;
	for (size_t i = 0; i < kv->nkvs; i++) {
		struct efs_meta_key_info info;

		if (efs_meta_key_parse(&op->fs->ns, kv->kvs[i]->key.data, kv->kvs[i]->key.len,
				       &info) < 0 ||
		    info.family != EFS_META_K_XATTR)
			continue;
		if (op->uid != 0 && info.name_len >= strlen(P_TRUSTED) &&
		    memcmp(info.name, P_TRUSTED, strlen(P_TRUSTED)) == 0)
			continue;
		memcpy(buf + total, info.name, info.name_len);
		total += info.name_len;
		buf[total++] = 0;
	}
	r = reply_sized(op, buf, total);
	efs_mem_free(buf);
	return r;
}

static int list_plan(struct efs_fs_op *op)
{
	return read_plan(op, EFS_LOCK_SHARED, want_names, list_answer);
}

/* The plans answer. */
XATTR_DESC(getxattr_desc, EFS_FS_OP_GETXATTR, false, get_plan, efs_fs_no_build);
XATTR_DESC(listxattr_desc, EFS_FS_OP_LISTXATTR, false, list_plan, efs_fs_no_build);

/* getxattr (|name|) and listxattr (NULL) into a buffer of |size|. */
static void read_start(fuse_req_t req, const struct efs_fs_opdesc *d, fuse_ino_t ino,
		       const char *name, size_t size)
{
	struct efs_fs_op *op = op_start(req, d, ino, name, 0, false);

	if (!op)
		return;
	xop_of(op)->size = size;
	efs_fs_op_run(op);
}

void efs_fs_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	read_start(req, &getxattr_desc, ino, name, size);
}

void efs_fs_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	read_start(req, &listxattr_desc, ino, NULL, size);
}
