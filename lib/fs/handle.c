/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the attribute, directory and file handlers share: open handles,
 * applying a setattr to an inode record, and the atime update after a
 * read.
 */
#include "fs/fs-int.h"

#include <errno.h>

#include "util/mem.h"

/* ---- Handles ---- */

struct efs_fs_handle *efs_fs_handle_new(struct efs_fs *fs, uint64_t ino, bool dir)
{
	struct efs_fs_handle *h = efs_mem_calloc(1, sizeof(*h));
	struct efs_fs_inode *in;

	if (!h)
		return NULL;
	in = efs_fs_iget(fs, ino);
	if (!in) {
		efs_mem_free(h);
		return NULL;
	}
	in->opens++;
	if (in->live_epoch != fs->epoch) {
		in->live_epoch = fs->epoch;
		in->live_opens = 0;
	}
	in->live_opens++;
	h->ino = ino;
	h->dir = dir;
	h->epoch = fs->epoch;
	efs_list_add_head(&fs->handles, &h->link);
	return h;
}

static void handle_clear_ents(struct efs_fs_handle *h)
{
	for (size_t i = 0; i < h->nents; i++)
		efs_mem_free(h->ents[i].name);
	efs_mem_free(h->ents);
	h->ents = NULL;
	h->nents = h->cap = 0;
	h->complete = false;
}

void efs_fs_handle_free(struct efs_fs *fs, struct efs_fs_handle *h)
{
	struct efs_fs_inode *in = efs_fs_ifind(fs, h->ino);

	efs_list_del(&h->link);
	handle_clear_ents(h);
	if (!h->dir) {
		for (size_t i = 0; i < EFS_FS_NIHOOKS; i++) {
			const struct efs_fs_inode_hooks *hk = fs->ihooks[i];

			if (hk && hk->handle_freed)
				hk->handle_freed(fs, h);
		}
	}
	if (in) {
		in->refs++;
		if (in->opens)
			in->opens--;
		if (h->epoch == in->live_epoch && in->live_opens)
			in->live_opens--;
		efs_fs_iput(fs, in);
	}
	efs_mem_free(h);
}

uint32_t efs_fs_live_opens(const struct efs_fs *fs, const struct efs_fs_inode *in)
{
	if (!in)
		return 0;
	return (in->live_epoch == fs->epoch ? in->live_opens : 0) + in->opening;
}

int efs_fs_handle_check(const struct efs_fs *fs, const struct efs_fs_handle *h)
{
	return h && h->epoch == fs->epoch ? 0 : -EIO;
}

/* ---- setattr, applied to a record ---- */

int efs_fs_setattr_apply(Etcfs__Inode *rec, const struct stat *attr, int to_set, int64_t now)
{
	bool changed = false;
	uint32_t type = rec->mode & S_IFMT;

	if (to_set & FUSE_SET_ATTR_SIZE) {
		if (type == S_IFDIR)
			return -EISDIR;
		if (type != S_IFREG)
			return -EINVAL;
		if (attr->st_size < 0)
			return -EINVAL;
		/* truncate(2) marks mtime when the size changes (the kernel
		 * sends no time for it; ftruncate and O_TRUNC send MTIME_NOW). */
		if (rec->size != (uint64_t)attr->st_size &&
		    !(to_set & (FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW)))
			rec->mtime_ns = now;
		rec->size = (uint64_t)attr->st_size;
		changed = true;
	}
	if (to_set & FUSE_SET_ATTR_MODE) {
		rec->mode = type | ((uint32_t)attr->st_mode & 07777);
		changed = true;
	}
	if (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
		if (to_set & FUSE_SET_ATTR_UID)
			rec->uid = (uint32_t)attr->st_uid;
		if (to_set & FUSE_SET_ATTR_GID)
			rec->gid = (uint32_t)attr->st_gid;
		/* chown clears set-user-ID, and set-group-ID when it means
		 * "setgid" (group-executable), on everything but directories;
		 * a mode in the same request is the kernel's verdict. */
		if (type != S_IFDIR && !(to_set & FUSE_SET_ATTR_MODE)) {
			rec->mode &= ~(uint32_t)S_ISUID;
			if (rec->mode & S_IXGRP)
				rec->mode &= ~(uint32_t)S_ISGID;
		}
		changed = true;
	}
	if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
		rec->atime_ns = now;
		changed = true;
	} else if (to_set & FUSE_SET_ATTR_ATIME) {
		rec->atime_ns = efs_meta_ns_from_timespec(&attr->st_atim);
		changed = true;
	}
	if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
		rec->mtime_ns = now;
		changed = true;
	} else if (to_set & FUSE_SET_ATTR_MTIME) {
		rec->mtime_ns = efs_meta_ns_from_timespec(&attr->st_mtim);
		changed = true;
	}
	if (to_set & FUSE_SET_ATTR_CTIME)
		rec->ctime_ns = efs_meta_ns_from_timespec(&attr->st_ctim);
	else if (changed || to_set)
		rec->ctime_ns = now;
	return 0;
}

/* ---- atime ---- */

static void atime_free(struct efs_fs_op *op)
{
	struct efs_fs_inode *in = efs_fs_ifind(op->fs, op->ino);

	if (in)
		in->atime_busy = false;
}

#define ATIME_DAY_NS (24ll * 3600 * 1000000000)

bool efs_fs_atime_due(const Etcfs__Inode *rec, int64_t now)
{
	return rec->atime_ns <= rec->mtime_ns || rec->atime_ns <= rec->ctime_ns ||
	       now - rec->atime_ns >= ATIME_DAY_NS;
}

static int atime_plan(struct efs_fs_op *op)
{
	const Etcfs__Inode *rec;

	if (op->loads_done == 0)
		return efs_fs_want(op, op->ino, EFS_LOCK_EXCLUSIVE);
	rec = efs_fs_rec(op, op->ino);
	if (!rec || !efs_fs_atime_due(rec, efs_fs_now()))
		return EFS_FS_DONE;
	return EFS_FS_CONT;
}

static int atime_build(struct efs_fs_op *op)
{
	Etcfs__Inode *rec = efs_fs_rec_dup(efs_fs_rec(op, op->ino));
	int r;

	if (!rec)
		return -ENOMEM;
	rec->atime_ns = efs_fs_now(); /* atime alone: ctime stays */
	r = efs_fs_put_inode(op, op->ino, rec, false);
	protobuf_c_message_free_unpacked(&rec->base, efs_mem_protobuf());
	return r;
}

static const struct efs_fs_opdesc atime_desc = {
	.code = EFS_FS_OP_ATIME,
	.origin = EFS_FS_ORIG_ATIME,
	.mutates = true,
	.plan = atime_plan,
	.build = atime_build,
	.done = efs_fs_no_done,
};

void efs_fs_touch_atime(struct efs_fs *fs, uint64_t ino, const Etcfs__Inode *rec)
{
	struct efs_fs_inode *in;
	struct efs_fs_op *op;

	if (fs->noatime || fs->read_only || !rec || !efs_fs_atime_due(rec, efs_fs_now()))
		return;
	/* Only an exclusive holder writes atime: a reader under a shared
	 * lock leaves it alone rather than recall every peer's shared hold
	 * (relatime is kept where a holder is around to write it). */
	if (efs_lock_held(fs->lc, ino) != EFS_LOCK_EXCLUSIVE)
		return;
	/* One update in flight per inode is plenty. */
	in = efs_fs_ifind(fs, ino);
	if (!in || in->atime_busy)
		return;
	op = efs_fs_op_new(fs, NULL, &atime_desc);
	if (!op)
		return; /* atime is best effort */
	op->ino = ino;
	in->atime_busy = true;
	op->priv_free = atime_free;
	efs_fs_op_run(op);
}

