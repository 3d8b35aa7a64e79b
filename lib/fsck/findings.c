/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Findings and the operations of their repairs, as the passes decide them
 * (repair.c applies them).
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

#include "meta/records.h"
#include "util/mem.h"

__attribute__((format(printf, 4, 5))) struct efs_check_finding *
efs_check__finding(state_t *st, enum efs_check_inv inv, enum efs_check_severity sev,
		   const char *fmt, ...)
{
	struct efs_check_report *rep = st->rep;
	struct efs_check_finding *f;
	va_list ap;

	if (st->err)
		return NULL;
	f = efs_check__slot(st, &rep->findings, &st->cap_findings, rep->n_findings, sizeof(*f));
	if (!f)
		return NULL;
	f->inv = inv;
	f->severity = sev;
	va_start(ap, fmt);
	f->message = efs_check__vfmt(fmt, ap);
	va_end(ap);
	if (!f->message) {
		st->err = -ENOMEM;
		return NULL;
	}
	rep->n_findings++;
	if (sev == EFS_CHECK_ERROR)
		rep->errors++;
	else if (sev == EFS_CHECK_WARNING)
		rep->warnings++;
	return f;
}

__attribute__((format(printf, 3, 4))) void
efs_check__set_repair(state_t *st, struct efs_check_finding *f, const char *fmt, ...)
{
	va_list ap;

	if (!f)
		return;
	va_start(ap, fmt);
	f->repair = efs_check__vfmt(fmt, ap);
	va_end(ap);
	if (!f->repair)
		st->err = -ENOMEM;
}

struct efs_check_op *efs_check__add_op(state_t *st, struct efs_check_finding *f, enum op_kind kind)
{
	struct efs_check_op *ops, *op;

	if (!f || st->err)
		return NULL;
	ops = efs_mem_realloc(f->ops, (f->n_ops + 1) * sizeof(*ops));
	if (!ops) {
		st->err = -ENOMEM;
		return NULL;
	}
	f->ops = ops;
	op = &ops[f->n_ops++];
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->de = NONE;
	op->kidx = op->kidx2 = NONE;
	return op;
}

void efs_check__op_del(state_t *st, struct efs_check_finding *f, const uint8_t *key, size_t len,
		       int64_t mod)
{
	struct efs_check_op *op = efs_check__add_op(st, f, OP_DEL);

	if (!op)
		return;
	memcpy(op->key.buf, key, len);
	op->key.len = len;
	op->mod = mod;
}

void efs_check__op_del_inode(state_t *st, struct efs_check_finding *f, uint64_t ino, int64_t mod)
{
	struct efs_meta_key k;

	if (efs_meta_key_inode(&st->ns, ino, &k) == 0)
		efs_check__op_del(st, f, k.buf, k.len, mod);
}

void efs_check__op_del_dirent(state_t *st, struct efs_check_finding *f, size_t di)
{
	struct de_ent *d = &st->des[di];
	struct efs_meta_key k;

	if (efs_meta_key_dirent(&st->ns, d->parent, d->name, d->name_len, &k) == 0)
		efs_check__op_del(st, f, k.buf, k.len, d->mod);
}

void efs_check__op_counter(state_t *st, struct efs_check_finding *f, uint64_t next)
{
	struct efs_check_op *op = efs_check__add_op(st, f, OP_COUNTER);

	if (op) {
		if (efs_meta_key_ino_counter(&st->ns, &op->key) < 0)
			st->err = -EINVAL;
		op->counter = next;
	}
	st->hyp_counter = next;
}

/* Puts a packed |msg| at |key|, which must have |mod| (0: must not exist). */
struct efs_check_op *efs_check__op_put(state_t *st, struct efs_check_finding *f,
				       const struct efs_meta_key *key, const ProtobufCMessage *msg,
				       int64_t mod)
{
	struct efs_check_op *op = efs_check__add_op(st, f, OP_PUT);
	ProtobufCBinaryData b;

	if (!op)
		return NULL;
	op->key = *key;
	op->mod = mod;
	if (efs_meta_pack(msg, &b) < 0) {
		st->err = -ENOMEM;
		return NULL;
	}
	op->value = b.data;
	op->vallen = b.len;
	return op;
}

void efs_check__op_patch(state_t *st, struct efs_check_finding *f, struct ino_ent *e,
			 bool set_nlink, uint32_t nlink, bool set_parent, uint64_t parent)
{
	struct efs_check_op *op;

	/* One patch per inode per transaction: merge into an earlier one. */
	for (size_t i = 0; f && i < f->n_ops; i++) {
		op = &f->ops[i];
		if (op->kind == OP_INODE_PATCH && op->ino == e->ino) {
			if (set_nlink) {
				op->set_nlink = true;
				op->nlink = nlink;
			}
			if (set_parent) {
				op->set_parent = true;
				op->parent = parent;
			}
			return;
		}
	}
	op = efs_check__add_op(st, f, OP_INODE_PATCH);
	if (!op)
		return;
	if (efs_meta_key_inode(&st->ns, e->ino, &op->key) < 0)
		st->err = -EINVAL;
	op->ino = e->ino;
	op->set_nlink = set_nlink;
	op->nlink = nlink;
	op->set_parent = set_parent;
	op->parent = parent;
}

void efs_check__op_require(state_t *st, struct efs_check_finding *f, uint64_t ino)
{
	struct efs_check_op *op = efs_check__add_op(st, f, OP_REQUIRE_INODE);

	if (!op)
		return;
	if (efs_meta_key_inode(&st->ns, ino, &op->key) < 0)
		st->err = -EINVAL;
	op->ino = ino;
}
