/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading the keyspace of one filesystem at one revision, in pages, into the
 * checker's state: each key is parsed and its value decoded, and what does
 * not decode is reported here.
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "etcd/kv.h"
#include "meta/records.h"
#include "util/mem.h"
#include "etcfs.pb-c.h"
#include "kv.pb-c.h"
#include "rpc.pb-c.h"

/*
 * Keys per Range call. etcd 3.4 walks the rest of the range's index for
 * every page (to count it), so pages cost O(remaining keys): fewer, larger
 * pages keep a big keyspace's scan from going quadratic.
 */
#define CHECK_PAGE_DEFAULT 10000

static struct key_ent *add_key(state_t *st, const Mvccpb__KeyValue *kv,
			       const struct efs_meta_key_info *ki)
{
	struct key_ent *arr, *k;

	arr = efs_check__grow(st->keys, &st->cap_keys, st->n_keys, sizeof(*arr));
	if (!arr) {
		st->err = -ENOMEM;
		return NULL;
	}
	st->keys = arr;
	k = &arr[st->n_keys];
	memset(k, 0, sizeof(*k));
	k->key = efs_mem_memdup(kv->key.data, kv->key.len);
	if (!k->key) {
		st->err = -ENOMEM;
		return NULL;
	}
	st->n_keys++;
	k->keylen = kv->key.len;
	k->family = ki->family;
	k->mod = kv->mod_revision;
	k->lease = kv->lease;
	k->ino = ki->ino;
	k->group = ki->group;
	k->mode = ki->mode;
	memcpy(k->node, ki->node, sizeof(k->node));
	return k;
}

/* Appends a map or intent run read from the key just added (|keys|' last). */
static int add_sp_run(state_t *st, uint64_t start, uint64_t len, uint32_t group, bool intent)
{
	struct sp_run *arr = efs_check__grow(st->runs, &st->cap_runs, st->n_runs, sizeof(*arr));

	if (!arr)
		return -ENOMEM;
	st->runs = arr;
	arr[st->n_runs++] = (struct sp_run){
		.start = start,
		.len = len,
		.group = group,
		.intent = intent,
		.key = st->n_keys - 1,
	};
	return 0;
}


static const char *family_word(enum efs_meta_family f)
{
	switch (f) {
	case EFS_META_K_SB:
		return "filesystem record (sb)";
	case EFS_META_K_INODE:
		return "inode record";
	case EFS_META_K_DIRENT:
		return "directory entry";
	case EFS_META_K_XATTR:
		return "extended attribute";
	case EFS_META_K_EXTENT:
		return "extent chunk";
	case EFS_META_K_HOLDER:
		return "lock holder key";
	case EFS_META_K_RECALL:
		return "lock recall key";
	case EFS_META_K_OPEN:
		return "open reference";
	case EFS_META_K_PLOCK:
		return "byte-range lock record";
	case EFS_META_K_NODE:
		return "node record";
	case EFS_META_K_GEN:
		return "node generation record";
	case EFS_META_K_AG_OWNER:
		return "allocation group owner key";
	case EFS_META_K_AG_MAP:
		return "allocation group free map";
	case EFS_META_K_AG_FREE:
		return "allocation group free count";
	case EFS_META_K_FREE_INTENT:
		return "free intent";
	case EFS_META_K_ORPHAN:
		return "orphan record";
	case EFS_META_K_RECLAIM:
		return "reclaim record";
	case EFS_META_K_INO_COUNTER:
		return "inode counter (ino)";
	case EFS_META_K_RENAMESEQ:
		return "rename guard (renameseq)";
	case EFS_META_K_MAINT:
		return "maintenance election key (maint)";
	case EFS_META_K_PIN:
		return "revision pin";
	}
	return "key";
}

/* Reports an undecodable value; with |del| its repair deletes the key. */
static struct efs_check_finding *bad_record(state_t *st, const Mvccpb__KeyValue *kv,
					    const struct efs_meta_key_info *ki, int r,
					    const char *reason, bool del)
{
	struct efs_check_finding *f;
	char kt[700];

	switch (ki->family) {
	case EFS_META_K_INODE:
		snprintf(kt, sizeof(kt), "of inode %" PRIu64, ki->ino);
		break;
	case EFS_META_K_DIRENT:
		snprintf(kt, sizeof(kt), "\"%.*s\" in directory inode %" PRIu64,
			 (int)ki->name_len, (const char *)ki->name, ki->ino);
		break;
	default:
		efs_check__key_text(st, kv->key.data, kv->key.len, kt, sizeof(kt));
		break;
	}
	f = efs_check__finding(st, EFS_CHECK_INV_RECORD, EFS_CHECK_ERROR,
			       "%s %s cannot be decoded: %s", family_word(ki->family), kt,
			       r == -EBADMSG ? "not a valid record"
					     : (reason ? reason : strerror(-r)));
	if (del) {
		efs_check__set_repair(st, f, "delete it");
		efs_check__op_del(st, f, kv->key.data, kv->key.len, kv->mod_revision);
	}
	return f;
}

/*
 * An inode the validating decoder refuses only for a link count or parent
 * pointer that the link and tree checks repair anyway: unpacked raw.
 */
static Etcfs__Inode *inode_lenient(const Mvccpb__KeyValue *kv)
{
	Etcfs__Inode *in, tmp;
	const char *reason;

	in = etcfs__inode__unpack(efs_mem_protobuf(), kv->value.len, kv->value.data);
	if (!in)
		return NULL;
	tmp = *in;
	if (tmp.nlink > EFS_META_LINK_MAX)
		tmp.nlink = 1;
	if (S_ISDIR(tmp.mode)) {
		if (tmp.nlink == 1)
			tmp.nlink = 2;
		if (tmp.parent == 0)
			tmp.parent = EFS_META_ROOT_INO;
	}
	if (efs_meta_inode_check(&tmp, &reason) < 0) {
		efs_meta_record_free(in);
		return NULL;
	}
	return in;
}

static int load_inode(state_t *st, const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	struct ino_ent *arr, *e;
	Etcfs__Inode *in = NULL;
	struct efs_check_finding *f;
	int r;

	r = efs_meta_inode_decode(kv->value.data, kv->value.len, &in, &reason);
	if (r == -ENOMEM)
		return r;
	if (r == -EUCLEAN)
		in = inode_lenient(kv);
	if (!in) {
		f = bad_record(st, kv, ki, r, reason, false);
		efs_check__set_repair(
		    st, f,
		    "delete it (names that point to it are then removed, and its other "
		    "keys with it)");
		efs_check__op_del(st, f, kv->key.data, kv->key.len, kv->mod_revision);
		return 0;
	}
	arr = efs_check__grow(st->inos, &st->cap_inos, st->n_inos, sizeof(*arr));
	if (!arr) {
		efs_meta_record_free(in);
		return -ENOMEM;
	}
	st->inos = arr;
	e = &arr[st->n_inos++];
	memset(e, 0, sizeof(*e));
	e->ino = ki->ino;
	e->mod = kv->mod_revision;
	e->mode = in->mode;
	e->nlink = e->hyp_nlink = in->nlink;
	e->parent = e->hyp_parent = in->parent;
	e->size = in->size;
	e->name_idx = NONE;
	if (!S_ISDIR(in->mode) && in->parent != 0) {
		/* The lenient decode let this through; the patch clears it. */
		f = efs_check__finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
				       "%s inode %" PRIu64 " has a parent pointer (%" PRIu64
				       "), which only directories have",
				       efs_check__type_word(in->mode), ki->ino, in->parent);
		efs_check__set_repair(st, f, "clear it");
		efs_check__op_patch(st, f, e, false, 0, true, 0);
		e->hyp_parent = 0;
	}
	efs_meta_record_free(in);
	return 0;
}

static int load_dirent(state_t *st, const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	Etcfs__Dirent *de = NULL;
	int r;

	r = efs_meta_dirent_decode(kv->value.data, kv->value.len, &de, &reason);
	if (r == -ENOMEM)
		return r;
	if (r == -EUCLEAN) {
		/* A bad type alone is fixed by the type check. */
		de = etcfs__dirent__unpack(efs_mem_protobuf(), kv->value.len, kv->value.data);
		if (de && de->ino == 0) {
			efs_meta_record_free(de);
			de = NULL;
		}
	}
	if (!de) {
		bad_record(st, kv, ki, r, reason, true);
		return 0;
	}
	efs_check__add_de(st, ki->ino, (const char *)ki->name, ki->name_len, de->ino, de->type,
			  kv->mod_revision);
	efs_meta_record_free(de);
	return st->err;
}

static int load_kv(state_t *st, const Mvccpb__KeyValue *kv)
{
	struct efs_meta_key_info ki;
	const char *reason = NULL;
	struct efs_check_finding *f;
	struct key_ent *k;
	char kt[700];
	void *msg = NULL;
	int r;

	r = efs_meta_key_parse(&st->ns, kv->key.data, kv->key.len, &ki);
	if (r < 0) {
		efs_check__key_text(st, kv->key.data, kv->key.len, kt, sizeof(kt));
		f = efs_check__finding(st, EFS_CHECK_INV_RECORD, EFS_CHECK_ERROR,
				       "key %s is not a key of any etcfs family (format version 1)",
				       kt);
		efs_check__set_repair(st, f, "delete it");
		efs_check__op_del(st, f, kv->key.data, kv->key.len, kv->mod_revision);
		return st->err;
	}
	/* Inode records, even undecodable ones: their numbers were used. */
	if (ki.family == EFS_META_K_INODE && ki.ino > st->max_ino)
		st->max_ino = ki.ino;
	switch (ki.family) {
	case EFS_META_K_INODE:
		return load_inode(st, kv, &ki);
	case EFS_META_K_DIRENT:
		return load_dirent(st, kv, &ki);
	case EFS_META_K_SB: {
		Etcfs__FsInfo *fi = NULL;

		r = efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			f = bad_record(st, kv, &ki, r, reason, false);
			return st->err;
		}
		st->fi = fi;
		return 0;
	}
	case EFS_META_K_INO_COUNTER: {
		Etcfs__InoCounter *c = NULL;

		st->counter_present = true;
		st->counter_mod = kv->mod_revision;
		r = efs_meta_ino_counter_decode(kv->value.data, kv->value.len, &c, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			/* The counter stage rewrites it. */
			bad_record(st, kv, &ki, r, reason, false);
			st->counter_bad = true;
			return st->err;
		}
		st->counter_next = st->hyp_counter = c->next;
		efs_meta_record_free(c);
		return 0;
	}
	case EFS_META_K_RENAMESEQ: {
		Etcfs__RenameSeq *rs = NULL, nrs = ETCFS__RENAME_SEQ__INIT;
		struct efs_meta_key key;

		st->renameseq_present = true;
		r = efs_meta_renameseq_decode(kv->value.data, kv->value.len, &rs, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			f = bad_record(st, kv, &ki, r, reason, false);
			efs_check__set_repair(st, f,
					      "rewrite it as sequence 0 (any value works: "
					      "renames compare its revision)");
			memcpy(key.buf, kv->key.data, kv->key.len);
			key.len = kv->key.len;
			efs_check__op_put(st, f, &key, &nrs.base, kv->mod_revision);
			return st->err;
		}
		efs_meta_record_free(rs);
		return 0;
	}
	case EFS_META_K_XATTR:
		add_key(st, kv, &ki);
		return st->err;
	case EFS_META_K_EXTENT: {
		Etcfs__ExtentChunk *ch = NULL;

		k = add_key(st, kv, &ki);
		if (!k)
			return st->err;
		k->b = ki.num;
		r = efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			k->bad = true;
			if (st->blind == NONE)
				st->blind = st->n_keys - 1;
			f = bad_record(st, kv, &ki, r, reason, false);
			return st->err;
		}
		for (size_t i = 0; i < ch->n_extents; i++) {
			const Etcfs__Extent *x = ch->extents[i];
			struct ext_ent *xa;

			if (!(x->flags & EFS_META_EXTENT_F_PREALLOC) &&
			    x->file_block + x->count > k->a)
				k->a = x->file_block + x->count;
			xa = efs_check__grow(st->exts, &st->cap_exts, st->n_exts, sizeof(*xa));
			if (!xa) {
				efs_meta_record_free(ch);
				return -ENOMEM;
			}
			st->exts = xa;
			xa[st->n_exts++] = (struct ext_ent){
				.ino = ki.ino,
				.chunk = ki.num,
				.fb = x->file_block,
				.dev = x->dev_block,
				.count = x->count,
				.flags = x->flags,
				.key = st->n_keys - 1,
				.fix = NONE,
			};
		}
		efs_meta_record_free(ch);
		return 0;
	}
	case EFS_META_K_ORPHAN:
	case EFS_META_K_RECLAIM: {
		k = add_key(st, kv, &ki);
		if (!k)
			return st->err;
		if (ki.family == EFS_META_K_ORPHAN)
			r = efs_meta_orphan_decode(kv->value.data, kv->value.len,
						   (Etcfs__Orphan **)&msg, &reason);
		else
			r = efs_meta_reclaim_decode(kv->value.data, kv->value.len,
						    (Etcfs__Reclaim **)&msg, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			/* The orphan stage rewrites or deletes it. */
			k->bad = true;
			k->b = r == -EBADMSG ? 0 : 1;
			return 0;
		}
		efs_meta_record_free(msg);
		return 0;
	}
	case EFS_META_K_HOLDER:
	case EFS_META_K_RECALL:
	case EFS_META_K_OPEN:
	case EFS_META_K_PLOCK:
	case EFS_META_K_NODE:
	case EFS_META_K_AG_OWNER:
		k = add_key(st, kv, &ki);
		if (!k)
			return st->err;
		switch (ki.family) {
		case EFS_META_K_HOLDER:
			r = efs_meta_holder_decode(kv->value.data, kv->value.len,
						   (Etcfs__LockHolder **)&msg, &reason);
			break;
		case EFS_META_K_RECALL:
			r = efs_meta_waiter_decode(kv->value.data, kv->value.len,
						   (Etcfs__LockWaiter **)&msg, &reason);
			break;
		case EFS_META_K_OPEN:
			r = efs_meta_openref_decode(kv->value.data, kv->value.len,
						    (Etcfs__OpenRef **)&msg, &reason);
			break;
		case EFS_META_K_PLOCK:
			r = efs_meta_plocks_decode(kv->value.data, kv->value.len,
						   (Etcfs__ByteRangeLocks **)&msg, &reason);
			break;
		case EFS_META_K_NODE:
			r = efs_meta_nodeinfo_decode(kv->value.data, kv->value.len,
						     (Etcfs__NodeInfo **)&msg, &reason);
			break;
		default:
			r = efs_meta_ag_owner_decode(kv->value.data, kv->value.len,
						     (Etcfs__AgOwner **)&msg, &reason);
			break;
		}
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			/* Keys riding a session lease are rebuilt by their node. */
			bad_record(st, kv, &ki, r, reason, true);
			k->bad = true;
			k->removed = true;
			return st->err;
		}
		efs_meta_record_free(msg);
		return 0;
	case EFS_META_K_GEN: {
		Etcfs__Generation *g = NULL;

		r = efs_meta_generation_decode(kv->value.data, kv->value.len, &g, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			f = bad_record(st, kv, &ki, r, reason, false);
			return st->err;
		}
		efs_meta_record_free(g);
		return 0;
	}
	case EFS_META_K_AG_MAP: {
		Etcfs__AgMap *m = NULL;

		k = add_key(st, kv, &ki);
		if (!k)
			return st->err;
		r = efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			k->bad = true;
			bad_record(st, kv, &ki, r, reason, false);
			return st->err;
		}
		for (size_t i = 0; i < m->n_free; i++) {
			k->a += m->free[i]->len;
			if (add_sp_run(st, m->free[i]->start, m->free[i]->len, ki.group, false) <
			    0) {
				efs_meta_record_free(m);
				return -ENOMEM;
			}
		}
		k->b = m->group_blocks;
		efs_meta_record_free(m);
		return 0;
	}
	case EFS_META_K_AG_FREE: {
		Etcfs__AgFree *af = NULL;

		k = add_key(st, kv, &ki);
		if (!k)
			return st->err;
		r = efs_meta_ag_free_decode(kv->value.data, kv->value.len, &af, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			/* The space stage rewrites it from the map. */
			k->bad = true;
			return 0;
		}
		k->a = af->free_blocks;
		efs_meta_record_free(af);
		return 0;
	}
	case EFS_META_K_FREE_INTENT: {
		Etcfs__FreeIntent *fi = NULL;

		k = add_key(st, kv, &ki);
		if (!k)
			return st->err;
		k->a = ki.session;
		k->b = ki.num;
		r = efs_meta_free_intent_decode(kv->value.data, kv->value.len, &fi, &reason);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			k->bad = true;
			if (st->blind == NONE)
				st->blind = st->n_keys - 1;
			bad_record(st, kv, &ki, r, reason, false);
			return st->err;
		}
		for (size_t i = 0; i < fi->n_runs; i++) {
			if (add_sp_run(st, fi->runs[i]->start, fi->runs[i]->len, ki.group, true) <
			    0) {
				efs_meta_record_free(fi);
				return -ENOMEM;
			}
		}
		efs_meta_record_free(fi);
		return 0;
	}
	case EFS_META_K_MAINT:
	case EFS_META_K_PIN:
		/* Maintenance keys (lib/maint/maint.h): not records; a bad pin
		 * value is the maintenance node's to report. */
		return 0;
	}
	return 0;
}

int efs_check__load(struct efs_etcd_sync *s, state_t *st, const struct efs_check_opts *o, char *err,
		    size_t err_size)
{
	struct efs_meta_range range;
	uint8_t start[EFS_META_KEY_MAX + 1];
	size_t start_len;
	uint64_t every = o && o->progress_every ? o->progress_every : 10000;
	uint64_t next_progress = every;
	int r;

	r = efs_meta_range_fs(&st->ns, &range);
	if (r < 0)
		return r;
	memcpy(start, range.key.buf, range.key.len);
	start_len = range.key.len;
	for (;;) {
		Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
		struct efs_etcd_range_opts ro = {
			.range_end = range.end.buf,
			.range_end_len = range.end.len,
			.limit = o && o->page_size ? o->page_size : CHECK_PAGE_DEFAULT,
			.revision = st->rev,
		};
		Etcdserverpb__RangeResponse *resp;
		ProtobufCMessage *m;
		char *msg = NULL;

		r = efs_etcd_range_fill(&req, start, start_len, &ro, NULL);
		if (r < 0)
			return r;
		r = efs_etcd_sync_call(s, EFS_ETCD_RANGE, &req.base, &m, &msg);
		if (r < 0) {
			snprintf(err, err_size, "reading the keyspace%s: %s",
				 st->rev ? " (compacted while it was read? run fsck again)" : "",
				 msg ? msg : strerror(-r));
			efs_mem_free(msg);
			return r;
		}
		resp = (Etcdserverpb__RangeResponse *)m;
		if (!st->rev)
			st->rev = resp->header ? resp->header->revision : 0;
		for (size_t i = 0; i < resp->n_kvs; i++) {
			r = load_kv(st, resp->kvs[i]);
			if (!r)
				r = st->err;
			if (r < 0) {
				protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
				snprintf(err, err_size, "checking the keyspace: %s", strerror(-r));
				return r;
			}
			st->rep->keys++;
			if (o && o->progress && st->rep->keys >= next_progress) {
				o->progress(st->rep->keys, o->progress_arg);
				next_progress += every;
			}
		}
		if (!resp->more || resp->n_kvs == 0) {
			protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
			break;
		}
		{
			const Mvccpb__KeyValue *last = resp->kvs[resp->n_kvs - 1];

			if (last->key.len > EFS_META_KEY_MAX) {
				protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
				snprintf(err, err_size, "a key longer than %d bytes",
					 EFS_META_KEY_MAX);
				return -EUCLEAN;
			}
			memcpy(start, last->key.data, last->key.len);
			start[last->key.len] = 0;
			start_len = last->key.len + 1;
		}
		protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	}
	return 0;
}
