/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Applying the repairs: one transaction per finding, comparing the
 * mod_revision of every key it reads or writes and that no node key was
 * created or changed since the check.
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "etcd/txn.h"
#include "meta/records.h"
#include "space/freemap.h"
#include "space/runs.h"
#include "util/mem.h"
#include "etcfs.pb-c.h"
#include "kv.pb-c.h"
#include "rpc.pb-c.h"

__attribute__((format(printf, 3, 4))) static void
repair_failed(struct efs_check_finding *f, int err, const char *fmt, ...)
{
	va_list ap;

	f->state = EFS_CHECK_REPAIR_FAILED;
	f->repair_err = err;
	efs_mem_free(f->repair_message);
	va_start(ap, fmt);
	f->repair_message = efs_check__vfmt(fmt, ap);
	va_end(ap);
}

/* Reads |key| for a read-modify-write; -ESTALE when it is gone or its
 * mod_revision is not |mod|. */
static int fetch(struct efs_etcd_sync *s, const struct efs_meta_key *key, int64_t mod,
		 Mvccpb__KeyValue **ret)
{
	Mvccpb__KeyValue *kv = NULL;
	int r;

	r = efs_etcd_sync_get(s, key->buf, key->len, &kv, NULL);
	if (r == -ENOENT)
		return -ESTALE;
	if (r < 0)
		return r;
	if (kv->mod_revision != mod) {
		protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
		return -ESTALE;
	}
	*ret = kv;
	return 0;
}

/* Builds the value of a patch; -ESTALE, -EUCLEAN (the result would still be
 * invalid), -ENOMEM, or the etcd error. */
static int build_patch(struct efs_etcd_sync *s, state_t *st, struct efs_check_op *op,
		       int64_t mod, ProtobufCBinaryData *ret, const char **reason)
{
	Mvccpb__KeyValue *kv;
	int r;

	r = fetch(s, &op->key, mod, &kv);
	if (r < 0)
		return r;
	if (op->kind == OP_INODE_PATCH) {
		Etcfs__Inode *in = etcfs__inode__unpack(efs_mem_protobuf(), kv->value.len,
							kv->value.data);

		r = -EUCLEAN;
		*reason = "the inode record does not decode";
		if (in) {
			struct ino_ent *e = efs_check__find_ino(st, op->ino);

			if (op->set_nlink)
				in->nlink = op->nlink;
			if (op->set_parent)
				in->parent = op->parent;
			/*
			 * Every decided change of this inode at once: a record
			 * the lenient decode let through (a directory with one
			 * link) may need two of them to become valid.
			 */
			if (e) {
				in->nlink = e->hyp_nlink;
				in->parent = e->hyp_parent;
			}
			r = efs_meta_inode_check(in, reason);
			if (r == 0)
				r = efs_meta_pack(&in->base, ret);
			efs_meta_record_free(in);
		}
	} else {
		Etcfs__Dirent *de = etcfs__dirent__unpack(efs_mem_protobuf(), kv->value.len,
							  kv->value.data);

		r = -EUCLEAN;
		*reason = "the entry does not decode";
		if (de) {
			de->type = op->type;
			r = efs_meta_dirent_check(de, reason);
			if (r == 0)
				r = efs_meta_pack(&de->base, ret);
			efs_meta_record_free(de);
		}
	}
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	return r;
}

/*
 * Builds the patched map of an OP_MAP_PATCH from the map as it is now:
 * -ESTALE (it changed since the check), -EUCLEAN (a block to take is no
 * longer free, or one to put back is free already), -ENOMEM, or the etcd
 * error. *|count| is the patched map's free blocks.
 */
static int build_map_patch(struct efs_etcd_sync *s, struct efs_check_op *op, int64_t mod,
			   ProtobufCBinaryData *ret, uint64_t *count, const char **reason)
{
	Etcfs__AgMap *m = NULL, nm = ETCFS__AG_MAP__INIT;
	struct efs_runs runs = {0}, cut = {0};
	Mvccpb__KeyValue *kv;
	int r;

	r = fetch(s, &op->key, mod, &kv);
	if (r < 0)
		return r;
	r = efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m, reason);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	if (r < 0)
		return r == -ENOMEM ? r : -EUCLEAN;
	for (size_t i = 0; i < m->n_free && r == 0; i++)
		r = efs_runs_add(&runs, m->free[i]->start, m->free[i]->len);
	for (size_t i = 0; i < op->n_take && r == 0; i++) {
		efs_runs_clear(&cut);
		r = efs_runs_subtract(&runs, op->take[i].start, op->take[i].len, &cut);
		if (r == 0 && efs_runs_total(&cut) != op->take[i].len) {
			*reason = "some of the blocks to take are no longer free";
			r = -EUCLEAN;
		}
	}
	for (size_t i = 0; i < op->n_put && r == 0; i++) {
		if (efs_runs_overlaps(&runs, op->put[i].start, op->put[i].len) ||
		    op->put[i].start + op->put[i].len > m->group_blocks) {
			*reason = "some of the blocks to free are free already";
			r = -EUCLEAN;
			break;
		}
		r = efs_runs_add(&runs, op->put[i].start, op->put[i].len);
	}
	if (r == 0)
		r = efs_runs_normalize(&runs);
	if (r == 0)
		r = efs_freemap_pb_runs(&runs, &nm.free);
	if (r == 0) {
		nm.n_free = runs.n;
		nm.group_blocks = m->group_blocks;
		*count = efs_runs_total(&runs);
		r = efs_meta_pack(&nm.base, ret);
	}
	efs_mem_free(nm.free);
	efs_runs_done(&runs);
	efs_runs_done(&cut);
	efs_meta_record_free(m);
	return r;
}

/*
 * Builds an extent chunk cut at file block |op->limit|: extents wholly
 * beyond it go, one across it ends there, preallocated ones stay. *|empty|:
 * nothing is left (the key is deleted). -ESTALE, -EUCLEAN (does not
 * decode), -ENOMEM, or the etcd error.
 */
static int build_chunk_trim(struct efs_etcd_sync *s, struct efs_check_op *op, int64_t mod,
			    ProtobufCBinaryData *ret, bool *empty)
{
	Etcfs__ExtentChunk *ch = NULL;
	Mvccpb__KeyValue *kv;
	const char *reason;
	size_t n = 0;
	int r;

	r = fetch(s, &op->key, mod, &kv);
	if (r < 0)
		return r;
	r = efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, &reason);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	if (r < 0)
		return r == -ENOMEM ? r : -EUCLEAN;
	for (size_t i = 0; i < ch->n_extents; i++) {
		Etcfs__Extent *x = ch->extents[i];

		if (!(x->flags & EFS_META_EXTENT_F_PREALLOC) && x->file_block >= op->limit) {
			/* Dropped: freed with the message by efs_meta_record_free. */
			continue;
		}
		if (!(x->flags & EFS_META_EXTENT_F_PREALLOC) &&
		    x->file_block + x->count > op->limit)
			x->count = op->limit - x->file_block;
		/* Keep |x|: swap it forward so the dropped ones stay owned. */
		ch->extents[i] = ch->extents[n];
		ch->extents[n++] = x;
	}
	{
		size_t all = ch->n_extents;

		ch->n_extents = n;
		*empty = n == 0;
		r = n ? efs_meta_pack(&ch->base, ret) : 0;
		ch->n_extents = all;
	}
	efs_meta_record_free(ch);
	return r;
}

/* Puts |v|, a value just built when |r| is 0, at |key| in the success
 * branch of |t|, and frees it either way. Returns |r|, or the put's error. */
static int put_built(struct efs_etcd_txn *t, int r, const struct efs_meta_key *key,
		     ProtobufCBinaryData *v)
{
	if (r == 0)
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key->buf, key->len, v->data, v->len,
				     0);
	efs_mem_free(v->data);
	v->data = NULL;
	return r;
}

static int64_t op_expected_mod(state_t *st, const struct efs_check_op *op)
{
	struct ino_ent *e;

	switch (op->kind) {
	case OP_INODE_PATCH:
	case OP_REQUIRE_INODE:
		e = efs_check__find_ino(st, op->ino);
		return e ? e->mod : 0;
	case OP_DIRENT_PATCH:
		return op->de != NONE ? st->des[op->de].mod : op->mod;
	case OP_COUNTER:
		return st->counter_mod;
	case OP_MAP_PATCH:
	case OP_CHUNK_TRIM:
		return st->keys[op->kidx].mod;
	default:
		return op->mod;
	}
}

static int repair_one(struct efs_etcd_sync *s, state_t *st, struct efs_check_finding *f)
{
	struct efs_etcd_txn *t = NULL;
	Etcdserverpb__TxnResponse *resp = NULL;
	struct efs_meta_range nodes;
	const char *reason = NULL;
	int64_t rev;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	/* No node key created or changed since the check: no node mounted. */
	r = efs_meta_range_family(&st->ns, EFS_META_K_NODE, &nodes);
	if (r == 0) {
		struct efs_etcd_cmp c = {
			.target = EFS_ETCD_CMP_MOD,
			.result = EFS_ETCD_CMP_LESS,
			.key = nodes.key.buf,
			.key_len = nodes.key.len,
			.range_end = nodes.end.buf,
			.range_end_len = nodes.end.len,
			.num = st->rev + 1,
		};

		r = efs_etcd_txn_compare_ex(t, &c);
	}
	for (size_t i = 0; i < f->n_ops && r == 0; i++) {
		struct efs_check_op *op = &f->ops[i];
		int64_t mod = op_expected_mod(st, op);
		ProtobufCBinaryData v = {0};

		for (size_t j = 0; j < op->n_deps; j++) {
			if (st->rep->findings[op->deps[j]].state == EFS_CHECK_REPAIRED)
				continue;
			repair_failed(f, -ESTALE,
				      "not repaired: it needs the repair of \"%s\", which did not "
				      "happen",
				      st->rep->findings[op->deps[j]].message);
			goto out;
		}

		if (op->kind == OP_REQUIRE_INODE && mod == 0) {
			repair_failed(f, -ESTALE, "inode %" PRIu64 " it depends on does not exist "
				      "(an earlier repair failed?)", op->ino);
			goto out;
		}
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, op->key.buf,
					 op->key.len, mod);
		if (r < 0)
			break;
		switch (op->kind) {
		case OP_DEL:
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, op->key.buf, op->key.len,
						NULL, 0, false);
			break;
		case OP_PUT:
			r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, op->key.buf, op->key.len,
					     op->value, op->vallen, 0);
			break;
		case OP_COUNTER: {
			Etcfs__InoCounter c = ETCFS__INO_COUNTER__INIT;

			c.next = op->counter;
			r = efs_meta_pack(&c.base, &v);
			r = put_built(t, r, &op->key, &v);
			break;
		}
		case OP_INODE_PATCH:
		case OP_DIRENT_PATCH:
			r = build_patch(s, st, op, mod, &v, &reason);
			if (r == -ESTALE) {
				repair_failed(f, r,
					      "not repaired: the record changed since the check");
				r = 0;
				goto out;
			}
			if (r == -EUCLEAN) {
				repair_failed(f, r,
					      "not repaired: the result would be invalid (%s)",
					      reason ? reason : "?");
				r = 0;
				goto out;
			}
			r = put_built(t, r, &op->key, &v);
			break;
		case OP_REQUIRE_INODE:
			break;
		case OP_CHUNK_TRIM: {
			bool empty = false;

			r = build_chunk_trim(s, op, mod, &v, &empty);
			if (r == -ESTALE || r == -EUCLEAN) {
				repair_failed(f, r, "not repaired: the extent chunk changed since "
						    "the check");
				r = 0;
				goto out;
			}
			if (r == 0 && empty)
				r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, op->key.buf,
							op->key.len, NULL, 0, false);
			else
				r = put_built(t, r, &op->key, &v);
			efs_mem_free(v.data);
			break;
		}
		case OP_MAP_PATCH: {
			uint64_t count = 0;

			r = build_map_patch(s, op, mod, &v, &count, &reason);
			if (r == -ESTALE || r == -EUCLEAN) {
				if (r == -ESTALE)
					repair_failed(f, r, "not repaired: the group's map changed "
							    "since the check");
				else
					repair_failed(f, r, "not repaired: %s",
						      reason ? reason : "the map does not decode");
				r = 0;
				goto out;
			}
			r = put_built(t, r, &op->key, &v);
			if (r == 0 && op->kidx2 != NONE) {
				Etcfs__AgFree af = ETCFS__AG_FREE__INIT;

				r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
							 op->key2.buf, op->key2.len,
							 st->keys[op->kidx2].mod);
				af.free_blocks = count;
				if (r == 0)
					r = efs_meta_pack(&af.base, &v);
				r = put_built(t, r, &op->key2, &v);
			}
			break;
		}
		}
	}
	if (r < 0) {
		repair_failed(f, r, "not repaired: %s", strerror(-r));
		r = r == -ENOMEM ? r : 0;
		goto out;
	}
	r = efs_etcd_sync_txn(s, efs_etcd_txn_request(t), &resp);
	if (r < 0) {
		repair_failed(f, r, "not repaired: %s", efs_etcd_sync_last_message(s));
		r = r == -ENOMEM ? r : 0;
		goto out;
	}
	if (!resp->succeeded) {
		repair_failed(f, -ESTALE,
			      "not repaired: something changed since the check, or a node mounted");
		goto out;
	}
	rev = resp->header ? resp->header->revision : 0;
	for (size_t i = 0; i < f->n_ops; i++) {
		struct efs_check_op *op = &f->ops[i];
		struct ino_ent *e;

		if (op->kind == OP_INODE_PATCH || (op->kind == OP_PUT && op->ino)) {
			e = efs_check__find_ino(st, op->ino);
			if (e)
				e->mod = rev;
		}
		if ((op->kind == OP_DIRENT_PATCH || op->kind == OP_PUT) && op->de != NONE)
			st->des[op->de].mod = rev;
		if (op->kind == OP_COUNTER)
			st->counter_mod = rev;
		if (op->kidx != NONE)
			st->keys[op->kidx].mod = rev;
		if (op->kidx2 != NONE)
			st->keys[op->kidx2].mod = rev;
	}
	f->state = EFS_CHECK_REPAIRED;
out:
	if (resp)
		protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	efs_etcd_txn_free(t);
	return r;
}

int efs_check_repair(struct efs_etcd_sync *s, struct efs_check_report *rep)
{
	state_t *st = rep->priv;
	int n = 0, r;

	if (rep->n_mounted)
		return -EBUSY;
	for (size_t i = 0; i < rep->n_findings; i++) {
		struct efs_check_finding *f = &rep->findings[i];

		if (f->state != EFS_CHECK_OPEN || !f->repair || !f->n_ops)
			continue;
		r = repair_one(s, st, f);
		if (r < 0)
			return r;
		if (f->state == EFS_CHECK_REPAIRED)
			n++;
	}
	return n;
}
