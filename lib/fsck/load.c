/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading the keyspace of one filesystem at one revision, in pages, into the
 * checker's state: each key is parsed and its value decoded by the handler
 * of its family's row in |families|, and what does not decode is reported
 * here.
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
	struct key_ent *k;

	k = efs_check__slot(st, &st->keys, &st->cap_keys, st->n_keys, sizeof(*k));
	if (!k)
		return NULL;
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

/* Reports an undecodable value; with |del| its repair deletes the key. */
static struct efs_check_finding *bad_record(state_t *st, const struct efs_check__family *fam,
					    const Mvccpb__KeyValue *kv,
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
			       "%s %s cannot be decoded: %s", fam->name, kt,
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

/*
 * The handlers below load one key of the family |fam| names, parsed into
 * |ki|, into |st|. Each returns 0 or -ENOMEM (an allocation failure may
 * instead be left in st->err alone); what does not decode is a finding,
 * never an error.
 */

static int load_inode(state_t *st, const struct efs_check__family *fam,
		      const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	struct ino_ent *arr, *e;
	Etcfs__Inode *in = NULL;
	struct efs_check_finding *f;
	int r;

	/* Inode records, even undecodable ones: their numbers were used. */
	if (ki->ino > st->max_ino)
		st->max_ino = ki->ino;
	r = efs_meta_inode_decode(kv->value.data, kv->value.len, &in, &reason);
	if (r == -ENOMEM)
		return r;
	if (r == -EUCLEAN)
		in = inode_lenient(kv);
	if (!in) {
		f = bad_record(st, fam, kv, ki, r, reason, false);
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

static int load_dirent(state_t *st, const struct efs_check__family *fam,
		       const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
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
		bad_record(st, fam, kv, ki, r, reason, true);
		return 0;
	}
	efs_check__add_de(st, ki->ino, (const char *)ki->name, ki->name_len, de->ino, de->type,
			  kv->mod_revision);
	efs_meta_record_free(de);
	return st->err;
}

static int load_sb(state_t *st, const struct efs_check__family *fam, const Mvccpb__KeyValue *kv,
		   const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	Etcfs__FsInfo *fi = NULL;
	int r;

	r = efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		bad_record(st, fam, kv, ki, r, reason, false);
		return st->err;
	}
	st->fi = fi;
	return 0;
}

static int load_counter(state_t *st, const struct efs_check__family *fam,
			const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	Etcfs__InoCounter *c = NULL;
	int r;

	st->counter_present = true;
	st->counter_mod = kv->mod_revision;
	r = efs_meta_ino_counter_decode(kv->value.data, kv->value.len, &c, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		/* The counter stage rewrites it. */
		bad_record(st, fam, kv, ki, r, reason, false);
		st->counter_bad = true;
		return st->err;
	}
	st->counter_next = st->hyp_counter = c->next;
	efs_meta_record_free(c);
	return 0;
}

static int load_renameseq(state_t *st, const struct efs_check__family *fam,
			  const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	Etcfs__RenameSeq *rs = NULL, nrs = ETCFS__RENAME_SEQ__INIT;
	const char *reason = NULL;
	struct efs_check_finding *f;
	struct efs_meta_key key;
	int r;

	st->renameseq_present = true;
	r = efs_meta_renameseq_decode(kv->value.data, kv->value.len, &rs, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		f = bad_record(st, fam, kv, ki, r, reason, false);
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

/* A key whose value the checker does not read (extended attributes). */
static int load_key(state_t *st, const struct efs_check__family *fam, const Mvccpb__KeyValue *kv,
		    const struct efs_meta_key_info *ki)
{
	add_key(st, kv, ki);
	return st->err;
}

/*
 * A space record (extent chunk, free intent) that does not decode: the key
 * is kept and marked bad, and the first such key makes the checker blind:
 * the blocks it names are unknown, so leaked blocks are not freed.
 */
static int bad_space_record(state_t *st, const struct efs_check__family *fam,
			    const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki,
			    struct key_ent *k, int r, const char *reason)
{
	k->bad = true;
	if (st->blind == NONE)
		st->blind = st->n_keys - 1;
	bad_record(st, fam, kv, ki, r, reason, false);
	return st->err;
}

static int load_extent(state_t *st, const struct efs_check__family *fam,
		       const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	Etcfs__ExtentChunk *ch = NULL;
	const char *reason = NULL;
	struct key_ent *k;
	int r;

	k = add_key(st, kv, ki);
	if (!k)
		return st->err;
	k->b = ki->num;
	r = efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		return bad_space_record(st, fam, kv, ki, k, r, reason);
	for (size_t i = 0; i < ch->n_extents; i++) {
		const Etcfs__Extent *x = ch->extents[i];
		struct ext_ent *xa;

		if (!(x->flags & EFS_META_EXTENT_F_PREALLOC) && x->file_block + x->count > k->a)
			k->a = x->file_block + x->count;
		xa = efs_check__grow(st->exts, &st->cap_exts, st->n_exts, sizeof(*xa));
		if (!xa) {
			efs_meta_record_free(ch);
			return -ENOMEM;
		}
		st->exts = xa;
		xa[st->n_exts++] = (struct ext_ent){
			.ino = ki->ino,
			.chunk = ki->num,
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

/*
 * Decodes |kv|'s value with |fam|'s decoder only to check it: 0, -ENOMEM,
 * or the decoder's error (with |reason|) for a value that does not decode.
 */
static int check_value(const struct efs_check__family *fam, const Mvccpb__KeyValue *kv,
		       const char **reason)
{
	void *msg = NULL;
	int r;

	r = fam->decode(kv->value.data, kv->value.len, &msg, reason);
	if (r >= 0)
		efs_meta_record_free(msg);
	return r;
}

/* Orphan and reclaim records: |fam|'s decoder checks the value. */
static int load_orphan(state_t *st, const struct efs_check__family *fam,
		       const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	struct key_ent *k;
	int r;

	k = add_key(st, kv, ki);
	if (!k)
		return st->err;
	r = check_value(fam, kv, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		/* The orphan stage rewrites or deletes it. */
		k->bad = true;
		k->b = r == -EBADMSG ? 0 : 1;
	}
	return 0;
}

/*
 * Lock holders, recalls, open references, byte-range locks, node records
 * and group owners: |fam|'s decoder checks the value, and one that does not
 * decode is deleted.
 */
static int load_leased(state_t *st, const struct efs_check__family *fam,
		       const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	struct key_ent *k;
	int r;

	k = add_key(st, kv, ki);
	if (!k)
		return st->err;
	r = check_value(fam, kv, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		/* Keys riding a session lease are rebuilt by their node. */
		bad_record(st, fam, kv, ki, r, reason, true);
		k->bad = true;
		k->removed = true;
		return st->err;
	}
	return 0;
}

/* A record that is only checked (node generations): |fam|'s decoder. */
static int load_checked(state_t *st, const struct efs_check__family *fam,
			const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	int r;

	r = check_value(fam, kv, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		bad_record(st, fam, kv, ki, r, reason, false);
		return st->err;
	}
	return 0;
}

static int load_ag_map(state_t *st, const struct efs_check__family *fam,
		       const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	Etcfs__AgMap *m = NULL;
	struct key_ent *k;
	int r;

	k = add_key(st, kv, ki);
	if (!k)
		return st->err;
	r = efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		k->bad = true;
		bad_record(st, fam, kv, ki, r, reason, false);
		return st->err;
	}
	for (size_t i = 0; i < m->n_free; i++) {
		k->a += m->free[i]->len;
		if (add_sp_run(st, m->free[i]->start, m->free[i]->len, ki->group, false) < 0) {
			efs_meta_record_free(m);
			return -ENOMEM;
		}
	}
	k->b = m->group_blocks;
	efs_meta_record_free(m);
	return 0;
}

static int load_ag_free(state_t *st, const struct efs_check__family *fam,
			const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	const char *reason = NULL;
	Etcfs__AgFree *af = NULL;
	struct key_ent *k;
	int r;

	k = add_key(st, kv, ki);
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

static int load_free_intent(state_t *st, const struct efs_check__family *fam,
			    const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	Etcfs__FreeIntent *fi = NULL;
	const char *reason = NULL;
	struct key_ent *k;
	int r;

	k = add_key(st, kv, ki);
	if (!k)
		return st->err;
	k->a = ki->session;
	k->b = ki->num;
	r = efs_meta_free_intent_decode(kv->value.data, kv->value.len, &fi, &reason);
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		return bad_space_record(st, fam, kv, ki, k, r, reason);
	for (size_t i = 0; i < fi->n_runs; i++) {
		if (add_sp_run(st, fi->runs[i]->start, fi->runs[i]->len, ki->group, true) < 0) {
			efs_meta_record_free(fi);
			return -ENOMEM;
		}
	}
	efs_meta_record_free(fi);
	return 0;
}

/*
 * Maintenance keys (lib/maint/maint.h): not records; a bad pin value is
 * the maintenance node's to report.
 */
static int load_ignored(state_t *st, const struct efs_check__family *fam,
			const Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki)
{
	return 0;
}

/*
 * The decoders of the shared handlers, under one signature: calling
 * efs_meta_*_decode through a cast function pointer would be undefined.
 * The cast of |ret| is the one meta/records.c makes itself.
 */
#define GENERIC_DECODER(name, decoder, type)                                             \
	static int name(const uint8_t *buf, size_t len, void **ret, const char **reason) \
	{                                                                                \
		return decoder(buf, len, (type **)ret, reason);                          \
	}

GENERIC_DECODER(decode_holder, efs_meta_holder_decode, Etcfs__LockHolder)
GENERIC_DECODER(decode_waiter, efs_meta_waiter_decode, Etcfs__LockWaiter)
GENERIC_DECODER(decode_openref, efs_meta_openref_decode, Etcfs__OpenRef)
GENERIC_DECODER(decode_plocks, efs_meta_plocks_decode, Etcfs__ByteRangeLocks)
GENERIC_DECODER(decode_nodeinfo, efs_meta_nodeinfo_decode, Etcfs__NodeInfo)
GENERIC_DECODER(decode_generation, efs_meta_generation_decode, Etcfs__Generation)
GENERIC_DECODER(decode_ag_owner, efs_meta_ag_owner_decode, Etcfs__AgOwner)
GENERIC_DECODER(decode_orphan, efs_meta_orphan_decode, Etcfs__Orphan)
GENERIC_DECODER(decode_reclaim, efs_meta_reclaim_decode, Etcfs__Reclaim)

#undef GENERIC_DECODER

/*
 * One row per family of meta/keys.h, indexed by the family: adding a
 * family is adding a row (test/unit/test_fsck_keys.c checks that none is
 * missing).
 */
static const struct efs_check__family families[] = {
#define ROW(f, n, l, d) [f] = {.family = f, .name = n, .load = l, .decode = d}
	ROW(EFS_META_K_SB, "filesystem record (sb)", load_sb, NULL),
	ROW(EFS_META_K_INODE, "inode record", load_inode, NULL),
	ROW(EFS_META_K_DIRENT, "directory entry", load_dirent, NULL),
	ROW(EFS_META_K_XATTR, "extended attribute", load_key, NULL),
	ROW(EFS_META_K_EXTENT, "extent chunk", load_extent, NULL),
	ROW(EFS_META_K_HOLDER, "lock holder key", load_leased, decode_holder),
	ROW(EFS_META_K_RECALL, "lock recall key", load_leased, decode_waiter),
	ROW(EFS_META_K_OPEN, "open reference", load_leased, decode_openref),
	ROW(EFS_META_K_PLOCK, "byte-range lock record", load_leased, decode_plocks),
	ROW(EFS_META_K_NODE, "node record", load_leased, decode_nodeinfo),
	ROW(EFS_META_K_GEN, "node generation record", load_checked, decode_generation),
	ROW(EFS_META_K_AG_OWNER, "allocation group owner key", load_leased, decode_ag_owner),
	ROW(EFS_META_K_AG_MAP, "allocation group free map", load_ag_map, NULL),
	ROW(EFS_META_K_AG_FREE, "allocation group free count", load_ag_free, NULL),
	ROW(EFS_META_K_FREE_INTENT, "free intent", load_free_intent, NULL),
	ROW(EFS_META_K_ORPHAN, "orphan record", load_orphan, decode_orphan),
	ROW(EFS_META_K_RECLAIM, "reclaim record", load_orphan, decode_reclaim),
	ROW(EFS_META_K_INO_COUNTER, "inode counter (ino)", load_counter, NULL),
	ROW(EFS_META_K_RENAMESEQ, "rename guard (renameseq)", load_renameseq, NULL),
	ROW(EFS_META_K_MAINT, "maintenance election key (maint)", load_ignored, NULL),
	ROW(EFS_META_K_PIN, "revision pin", load_ignored, NULL),
	ROW(EFS_META_K_HANDOVER, "group hand-over request", load_ignored, NULL),
	ROW(EFS_META_K_SYNC, "publication request (sync)", load_ignored, NULL),
	ROW(EFS_META_K_SYNC_ACK, "publication answer (sync)", load_ignored, NULL),
#undef ROW
};

const struct efs_check__family *efs_check__family_of(enum efs_meta_family f)
{
	/* The cast sends negative values (if the enum is signed) out of range too. */
	if ((size_t)f >= sizeof(families) / sizeof(families[0]) || !families[f].load)
		return NULL;
	return &families[f];
}

int efs_check__load_kv(state_t *st, const Mvccpb__KeyValue *kv)
{
	const struct efs_check__family *fam;
	struct efs_meta_key_info ki;
	struct efs_check_finding *f;
	char kt[700];
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
	fam = efs_check__family_of(ki.family);
	/* Not reached while every family has a row (the unit test checks it). */
	if (!fam)
		return 0;
	return fam->load(st, fam, kv, &ki);
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
			r = efs_check__load_kv(st, resp->kvs[i]);
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
