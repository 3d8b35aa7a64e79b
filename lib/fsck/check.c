/* SPDX-License-Identifier: Apache-2.0 */
#include "fsck/check.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "etcd/kv.h"
#include "etcd/txn.h"
#include "meta/records.h"
#include "space/runs.h"
#include "util/mem.h"
#include "etcfs.pb-c.h"
#include "kv.pb-c.h"
#include "rpc.pb-c.h"

#define NONE SIZE_MAX
/*
 * Keys per Range call. etcd 3.4 walks the rest of the range's index for
 * every page (to count it), so pages cost O(remaining keys): fewer, larger
 * pages keep a big keyspace's scan from going quadratic.
 */
#define CHECK_PAGE_DEFAULT 10000
/* Operations per repair transaction, leaving room for the guards. */
#define OPS_PER_FINDING 100

/* One inode record, as read and as the decided repairs leave it. */
struct ino_ent {
	uint64_t ino;
	int64_t mod; /* mod_revision of i/<ino>, kept current by the repairs */
	uint32_t mode;
	uint32_t nlink;	   /* stored */
	uint32_t hyp_nlink; /* after the repairs decided so far */
	uint64_t parent;
	uint64_t hyp_parent;
	uint64_t size;
	uint32_t names;	  /* live entries naming it */
	uint32_t subdirs; /* live subdirectories (directories only) */
	size_t name_idx;  /* the entry naming it (directories: the one kept) */
	uint64_t walk;	  /* cycle detection */
	bool removed;	  /* the repairs delete it */
	bool has_orphan, has_reclaim, has_open, has_extents;
	bool has_children; /* directories: a live entry inside */
	int32_t sub_delta;  /* subdirectories the decided repairs add (- remove) */
	bool reached;
};

/* One directory entry. */
struct de_ent {
	uint64_t parent;
	char *name; /* NUL-terminated copy (names hold no NUL) */
	size_t name_len;
	uint64_t ino;
	uint32_t type;
	int64_t mod;
	bool removed; /* the repairs delete it */
};

/* Any other key. */
struct key_ent {
	enum efs_meta_family family;
	uint8_t *key;
	size_t keylen;
	int64_t mod;
	int64_t lease;
	uint64_t ino;
	uint32_t group;
	char mode;
	char node[EFS_META_NODE_MAX + 1];
	/* extents: end block, chunk; map: free sum, group blocks; free: count;
	 * free intents: session, sequence. */
	uint64_t a, b;
	bool bad;      /* the value did not decode */
	bool removed;  /* the repairs delete it */
};

enum op_kind {
	OP_DEL,		 /* delete |key|, comparing |mod| */
	OP_PUT,		 /* put |key| = |value|, comparing |mod| (0: must not exist) */
	OP_INODE_PATCH,	 /* read-modify-write i/<ino>: nlink, parent */
	OP_DIRENT_PATCH, /* read-modify-write a dirent's type */
	OP_COUNTER,	 /* ino = {next: counter}, comparing the counter's mod */
	OP_REQUIRE_INODE, /* compare only: i/<ino> is as the check saw it (and exists) */
	OP_MAP_PATCH,	  /* read-modify-write ag/<g>/map (take, put), and its free count */
	OP_CHUNK_TRIM,	  /* read-modify-write e/<ino><chunk>: cut extents at |limit| */
};

/* A run of a group's free map or of a free intent, group-relative. */
struct sp_run {
	uint64_t start, len;
	uint32_t group;
	bool intent;
	size_t key; /* index in |keys| */
};

/* One extent of an extent chunk that decoded. */
struct ext_ent {
	uint64_t ino, chunk; /* of the chunk key */
	uint64_t fb, dev, count;
	uint32_t flags;
	size_t key; /* index in |keys| */
	/* Blocks the repair of invariant 5 cuts off its end (count: all), and
	 * that repair's finding (NONE: none). */
	uint64_t cut;
	size_t fix;
};

struct efs_check_op {
	enum op_kind kind;
	struct efs_meta_key key;
	int64_t mod;
	uint8_t *value;
	size_t vallen;
	uint64_t ino; /* inode whose mod to track (OP_PUT of an inode, patches, require) */
	size_t de;    /* dirent whose mod to track (NONE: none) */
	bool set_nlink, set_parent;
	uint32_t nlink;
	uint64_t parent;
	uint32_t type;
	uint64_t counter;
	/* OP_MAP_PATCH: the map key is |key| (tracked as keys[kidx]); the free
	 * count |key2| (keys[kidx2], NONE: not written) becomes the new sum. */
	size_t kidx, kidx2;
	struct efs_meta_key key2;
	struct efs_run *take, *put; /* group-relative */
	size_t n_take, n_put;
	uint64_t limit; /* OP_CHUNK_TRIM: first file block cut (tracked as keys[kidx]) */
	/* Findings whose repairs must have happened first (indices). */
	size_t *deps;
	size_t n_deps;
};

struct efs_check_state_priv {
	struct efs_meta_ns ns;
	int64_t rev;
	struct ino_ent *inos;
	size_t n_inos, cap_inos;
	struct de_ent *des;
	size_t n_des, cap_des;
	struct key_ent *keys;
	size_t n_keys, cap_keys;
	Etcfs__FsInfo *fi;
	bool counter_present, counter_bad;
	uint64_t counter_next, hyp_counter;
	int64_t counter_mod;
	bool renameseq_present;
	uint64_t max_ino;
	int64_t *leases;
	bool *lease_live;
	size_t n_leases;
	uint64_t lf;	 /* lost+found's inode (0: none) */
	bool namespace_ok; /* root usable: the namespace stages run */
	uint64_t walk;
	size_t cap_findings;
	size_t n_des_loaded; /* entries read (sorted by key); added ones follow */
	size_t *by_ino;	     /* indices of |keys| sorted by inode */
	struct sp_run *runs; /* free map and free intent runs */
	size_t n_runs, cap_runs;
	struct ext_ent *exts; /* extents, in key order */
	size_t n_exts, cap_exts;
	/* An extent chunk or free intent did not decode: the blocks it names
	 * are unknown, so leaked blocks are not freed (key index, NONE: none). */
	size_t blind;
	int err; /* first allocation failure */
	struct efs_check_report *rep;
};

typedef struct efs_check_state_priv state_t;

/* ---- Small helpers ---- */

static void *grow(void *arr, size_t *cap, size_t n, size_t size)
{
	size_t ncap;
	void *p;

	if (n < *cap)
		return arr;
	ncap = *cap ? *cap * 2 : 64;
	p = efs_mem_realloc(arr, ncap * size);
	if (!p)
		return NULL;
	*cap = ncap;
	return p;
}

__attribute__((format(printf, 1, 0))) static char *vfmt(const char *fmt, va_list ap)
{
	va_list aq;
	char *s;
	int n;

	va_copy(aq, ap);
	n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0)
		return NULL;
	s = efs_mem_malloc((size_t)n + 1);
	if (s)
		vsnprintf(s, (size_t)n + 1, fmt, ap);
	return s;
}

/* Key bytes after the prefix, printable (non-printing bytes as \xNN). */
static void key_text(const state_t *st, const uint8_t *key, size_t len, char *buf, size_t size)
{
	size_t i = 0, o = 0;

	if (len >= st->ns.len && memcmp(key, st->ns.prefix, st->ns.len) == 0)
		i = st->ns.len;
	for (; i < len && o + 5 < size; i++) {
		if (key[i] >= 0x21 && key[i] < 0x7f && key[i] != '\\')
			buf[o++] = (char)key[i];
		else
			o += (size_t)snprintf(buf + o, size - o, "\\x%02x", key[i]);
	}
	buf[o] = '\0';
}

static struct ino_ent *find_ino(state_t *st, uint64_t ino)
{
	size_t lo = 0, hi = st->n_inos;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (st->inos[mid].ino == ino)
			return &st->inos[mid];
		if (st->inos[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static struct ino_ent *live_ino(state_t *st, uint64_t ino)
{
	struct ino_ent *e = find_ino(st, ino);

	return e && !e->removed ? e : NULL;
}

static bool is_dir(const struct ino_ent *e)
{
	return S_ISDIR(e->mode);
}

static const char *type_word(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFDIR:
		return "directory";
	case S_IFREG:
		return "file";
	case S_IFLNK:
		return "symlink";
	case S_IFCHR:
		return "character device";
	case S_IFBLK:
		return "block device";
	case S_IFIFO:
		return "fifo";
	case S_IFSOCK:
		return "socket";
	}
	return "inode";
}

static const char *dt_word(uint32_t dt)
{
	switch (dt) {
	case DT_DIR:
		return "directory";
	case DT_REG:
		return "file";
	case DT_LNK:
		return "symlink";
	case DT_CHR:
		return "character device";
	case DT_BLK:
		return "block device";
	case DT_FIFO:
		return "fifo";
	case DT_SOCK:
		return "socket";
	}
	return "unknown type";
}

/*
 * The path of |ino| as the repairs leave the tree ("/a/b"), or "" when it
 * has no name or its chain of names does not reach the root.
 */
static void path_of(state_t *st, uint64_t ino, char *buf, size_t size)
{
	const struct de_ent *parts[64];
	size_t n = 0, o = 0;
	struct ino_ent *e;

	buf[0] = '\0';
	if (ino == EFS_META_ROOT_INO) {
		snprintf(buf, size, "/");
		return;
	}
	while (ino != EFS_META_ROOT_INO) {
		e = find_ino(st, ino);
		if (!e || e->name_idx == NONE || n == 64)
			return;
		parts[n++] = &st->des[e->name_idx];
		ino = st->des[e->name_idx].parent;
		for (size_t i = 0; i + 1 < n; i++)
			if (parts[i]->parent == ino)
				return; /* a cycle */
	}
	while (n-- > 0 && o + 1 < size)
		o += (size_t)snprintf(buf + o, size - o, "/%s", parts[n]->name);
}

/* "file /a/b (inode 7)" or "file inode 7" when it has no path. */
static void ino_desc(state_t *st, uint64_t ino, char *buf, size_t size)
{
	struct ino_ent *e = find_ino(st, ino);
	char path[512];

	path_of(st, ino, path, sizeof(path));
	if (path[0])
		snprintf(buf, size, "%s %s (inode %" PRIu64 ")", e ? type_word(e->mode) : "inode",
			 path, ino);
	else
		snprintf(buf, size, "%s inode %" PRIu64, e ? type_word(e->mode) : "inode", ino);
}

/* "entry "x" in directory /a (inode 5)". */
static void de_desc(state_t *st, const struct de_ent *d, char *buf, size_t size)
{
	char path[512];

	path_of(st, d->parent, path, sizeof(path));
	if (path[0])
		snprintf(buf, size, "entry \"%s\" in directory %s (inode %" PRIu64 ")", d->name,
			 path, d->parent);
	else
		snprintf(buf, size, "entry \"%s\" in directory inode %" PRIu64, d->name, d->parent);
}

/* ---- Findings and their repairs ---- */

__attribute__((format(printf, 4, 5))) static struct efs_check_finding *
finding(state_t *st, enum efs_check_inv inv, enum efs_check_severity sev, const char *fmt, ...)
{
	struct efs_check_report *rep = st->rep;
	struct efs_check_finding *f, *arr;
	va_list ap;

	if (st->err)
		return NULL;
	arr = grow(rep->findings, &st->cap_findings, rep->n_findings, sizeof(*arr));
	if (!arr) {
		st->err = -ENOMEM;
		return NULL;
	}
	rep->findings = arr;
	f = &rep->findings[rep->n_findings];
	memset(f, 0, sizeof(*f));
	f->inv = inv;
	f->severity = sev;
	va_start(ap, fmt);
	f->message = vfmt(fmt, ap);
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

__attribute__((format(printf, 3, 4))) static void set_repair(state_t *st,
							      struct efs_check_finding *f,
							      const char *fmt, ...)
{
	va_list ap;

	if (!f)
		return;
	va_start(ap, fmt);
	f->repair = vfmt(fmt, ap);
	va_end(ap);
	if (!f->repair)
		st->err = -ENOMEM;
}

static struct efs_check_op *add_op(state_t *st, struct efs_check_finding *f, enum op_kind kind)
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

static void op_del(state_t *st, struct efs_check_finding *f, const uint8_t *key, size_t len,
		   int64_t mod)
{
	struct efs_check_op *op = add_op(st, f, OP_DEL);

	if (!op)
		return;
	memcpy(op->key.buf, key, len);
	op->key.len = len;
	op->mod = mod;
}

static void op_del_inode(state_t *st, struct efs_check_finding *f, uint64_t ino, int64_t mod)
{
	struct efs_meta_key k;

	if (efs_meta_key_inode(&st->ns, ino, &k) == 0)
		op_del(st, f, k.buf, k.len, mod);
}

static void op_del_dirent(state_t *st, struct efs_check_finding *f, size_t di)
{
	struct de_ent *d = &st->des[di];
	struct efs_meta_key k;

	if (efs_meta_key_dirent(&st->ns, d->parent, d->name, d->name_len, &k) == 0)
		op_del(st, f, k.buf, k.len, d->mod);
}

/* Puts a packed |msg| at |key|, which must have |mod| (0: must not exist). */
static struct efs_check_op *op_put(state_t *st, struct efs_check_finding *f,
				   const struct efs_meta_key *key, const ProtobufCMessage *msg,
				   int64_t mod)
{
	struct efs_check_op *op = add_op(st, f, OP_PUT);
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

static void op_patch(state_t *st, struct efs_check_finding *f, struct ino_ent *e, bool set_nlink,
		     uint32_t nlink, bool set_parent, uint64_t parent)
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
	op = add_op(st, f, OP_INODE_PATCH);
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

static void op_require(state_t *st, struct efs_check_finding *f, uint64_t ino)
{
	struct efs_check_op *op = add_op(st, f, OP_REQUIRE_INODE);

	if (!op)
		return;
	if (efs_meta_key_inode(&st->ns, ino, &op->key) < 0)
		st->err = -EINVAL;
	op->ino = ino;
}

/* Adds a (hypothetical) dirent; returns its index or NONE. */
static size_t add_de(state_t *st, uint64_t parent, const char *name, size_t len, uint64_t ino,
		     uint32_t type, int64_t mod)
{
	struct de_ent *arr, *d;

	arr = grow(st->des, &st->cap_des, st->n_des, sizeof(*arr));
	if (!arr) {
		st->err = -ENOMEM;
		return NONE;
	}
	st->des = arr;
	d = &arr[st->n_des];
	memset(d, 0, sizeof(*d));
	d->name = efs_mem_strndup(name, len);
	if (!d->name) {
		st->err = -ENOMEM;
		return NONE;
	}
	d->name_len = len;
	d->parent = parent;
	d->ino = ino;
	d->type = type;
	d->mod = mod;
	return st->n_des++;
}

static struct key_ent *add_key(state_t *st, const Mvccpb__KeyValue *kv,
			       const struct efs_meta_key_info *ki)
{
	struct key_ent *arr, *k;

	arr = grow(st->keys, &st->cap_keys, st->n_keys, sizeof(*arr));
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
	struct sp_run *arr = grow(st->runs, &st->cap_runs, st->n_runs, sizeof(*arr));

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

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- Loading ---- */

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
		key_text(st, kv->key.data, kv->key.len, kt, sizeof(kt));
		break;
	}
	f = finding(st, EFS_CHECK_INV_RECORD, EFS_CHECK_ERROR, "%s %s cannot be decoded: %s",
		    family_word(ki->family), kt,
		    r == -EBADMSG ? "not a valid record" : (reason ? reason : strerror(-r)));
	if (del) {
		set_repair(st, f, "delete it");
		op_del(st, f, kv->key.data, kv->key.len, kv->mod_revision);
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
		set_repair(st, f,
			   "delete it (names that point to it are then removed, and its other "
			   "keys with it)");
		op_del(st, f, kv->key.data, kv->key.len, kv->mod_revision);
		return 0;
	}
	arr = grow(st->inos, &st->cap_inos, st->n_inos, sizeof(*arr));
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
		f = finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
			    "%s inode %" PRIu64 " has a parent pointer (%" PRIu64
			    "), which only directories have",
			    type_word(in->mode), ki->ino, in->parent);
		set_repair(st, f, "clear it");
		op_patch(st, f, e, false, 0, true, 0);
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
	add_de(st, ki->ino, (const char *)ki->name, ki->name_len, de->ino, de->type,
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
		key_text(st, kv->key.data, kv->key.len, kt, sizeof(kt));
		f = finding(st, EFS_CHECK_INV_RECORD, EFS_CHECK_ERROR,
			    "key %s is not a key of any etcfs family (format version 1)", kt);
		set_repair(st, f, "delete it");
		op_del(st, f, kv->key.data, kv->key.len, kv->mod_revision);
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
			set_repair(st, f, "rewrite it as sequence 0 (any value works: "
					  "renames compare its revision)");
			memcpy(key.buf, kv->key.data, kv->key.len);
			key.len = kv->key.len;
			op_put(st, f, &key, &nrs.base, kv->mod_revision);
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
			xa = grow(st->exts, &st->cap_exts, st->n_exts, sizeof(*xa));
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

static int load(struct efs_etcd_sync *s, state_t *st, const struct efs_check_opts *o, char *err,
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

/* ---- Leases ---- */

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static bool lease_live(const state_t *st, int64_t lease)
{
	const int64_t *p;

	if (lease == 0)
		return false;
	p = bsearch(&lease, st->leases, st->n_leases, sizeof(*st->leases), cmp_i64);
	return p && st->lease_live[p - st->leases];
}

static int query_leases(struct efs_etcd_sync *s, state_t *st, char *err, size_t err_size)
{
	size_t n = 0;

	for (size_t i = 0; i < st->n_keys; i++)
		if (st->keys[i].lease)
			n++;
	if (!n)
		return 0;
	st->leases = efs_mem_calloc(n, sizeof(*st->leases));
	st->lease_live = efs_mem_calloc(n, sizeof(*st->lease_live));
	if (!st->leases || !st->lease_live)
		return -ENOMEM;
	n = 0;
	for (size_t i = 0; i < st->n_keys; i++)
		if (st->keys[i].lease)
			st->leases[n++] = st->keys[i].lease;
	qsort(st->leases, n, sizeof(*st->leases), cmp_i64);
	st->n_leases = 0;
	for (size_t i = 0; i < n; i++)
		if (st->n_leases == 0 || st->leases[st->n_leases - 1] != st->leases[i])
			st->leases[st->n_leases++] = st->leases[i];
	for (size_t i = 0; i < st->n_leases; i++) {
		Etcdserverpb__LeaseTimeToLiveRequest req =
			ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
		Etcdserverpb__LeaseTimeToLiveResponse *resp;
		ProtobufCMessage *m;
		char *msg = NULL;
		int r;

		req.id = st->leases[i];
		r = efs_etcd_sync_call(s, EFS_ETCD_LEASE_TIME_TO_LIVE, &req.base, &m, &msg);
		if (r == -ENOENT) {
			/* Some versions answer "lease not found" as an error. */
			efs_mem_free(msg);
			st->lease_live[i] = false;
			continue;
		}
		if (r < 0) {
			snprintf(err, err_size, "asking the TTL of lease %" PRIx64 ": %s",
				 (uint64_t)st->leases[i], msg ? msg : strerror(-r));
			efs_mem_free(msg);
			return r;
		}
		resp = (Etcdserverpb__LeaseTimeToLiveResponse *)m;
		st->lease_live[i] = resp->ttl >= 0;
		protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	}
	return 0;
}

static void lease_key_desc(state_t *st, const struct key_ent *k, char *buf, size_t size)
{
	switch (k->family) {
	case EFS_META_K_HOLDER:
		snprintf(buf, size, "%s lock holder key of inode %" PRIu64 " for node %s",
			 k->mode == EFS_META_LOCK_EXCLUSIVE ? "exclusive" : "shared", k->ino,
			 k->node);
		break;
	case EFS_META_K_RECALL:
		snprintf(buf, size, "lock recall key of inode %" PRIu64 " for node %s", k->ino,
			 k->node);
		break;
	case EFS_META_K_OPEN:
		snprintf(buf, size, "open reference of inode %" PRIu64 " on node %s", k->ino,
			 k->node);
		break;
	case EFS_META_K_PLOCK:
		snprintf(buf, size, "byte-range lock record of inode %" PRIu64 " on node %s",
			 k->ino, k->node);
		break;
	case EFS_META_K_NODE:
		snprintf(buf, size, "node record of node %s", k->node);
		break;
	default:
		snprintf(buf, size, "owner key of allocation group %" PRIu32, k->group);
		break;
	}
}

static void stage_leases(state_t *st)
{
	struct efs_check_report *rep = st->rep;
	struct efs_check_finding *f;
	char desc[256];

	for (size_t i = 0; i < st->n_keys; i++) {
		struct key_ent *k = &st->keys[i];

		switch (k->family) {
		case EFS_META_K_HOLDER:
		case EFS_META_K_RECALL:
		case EFS_META_K_OPEN:
		case EFS_META_K_PLOCK:
		case EFS_META_K_NODE:
		case EFS_META_K_AG_OWNER:
			break;
		default:
			continue;
		}
		if (k->removed && !(k->family == EFS_META_K_NODE && k->bad))
			continue;
		if (lease_live(st, k->lease)) {
			if (k->family == EFS_META_K_NODE) {
				char **arr = efs_mem_realloc(rep->mounted, (rep->n_mounted + 1) *
									   sizeof(*arr));

				if (!arr) {
					st->err = -ENOMEM;
					return;
				}
				rep->mounted = arr;
				arr[rep->n_mounted] = efs_mem_strdup(k->node);
				if (!arr[rep->n_mounted]) {
					st->err = -ENOMEM;
					return;
				}
				rep->n_mounted++;
			}
			continue;
		}
		if (k->removed)
			continue;
		lease_key_desc(st, k, desc, sizeof(desc));
		if (k->lease == 0)
			f = finding(st, EFS_CHECK_INV_LOCKS, EFS_CHECK_ERROR,
				    "the %s is not attached to a lease, so it never goes away when "
				    "the node does",
				    desc);
		else
			f = finding(st, EFS_CHECK_INV_LOCKS, EFS_CHECK_ERROR,
				    "the %s rides lease %" PRIx64 ", which has expired", desc,
				    (uint64_t)k->lease);
		set_repair(st, f, "delete it");
		op_del(st, f, k->key, k->keylen, k->mod);
		k->removed = true;
	}
}

/* ---- Namespace ---- */

static void mark_inode_keys(state_t *st)
{
	for (size_t i = 0; i < st->n_keys; i++) {
		struct key_ent *k = &st->keys[i];
		struct ino_ent *e;

		if (k->removed)
			continue;
		e = find_ino(st, k->ino);
		if (!e)
			continue;
		switch (k->family) {
		case EFS_META_K_ORPHAN:
			e->has_orphan = true;
			break;
		case EFS_META_K_RECLAIM:
			e->has_reclaim = true;
			break;
		case EFS_META_K_OPEN:
			e->has_open = true;
			break;
		case EFS_META_K_EXTENT:
			e->has_extents = true;
			break;
		default:
			break;
		}
	}
}

static bool stage_root(state_t *st)
{
	struct ino_ent *root = find_ino(st, EFS_META_ROOT_INO);
	struct efs_check_finding *f;

	if (!root) {
		finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
			"the root directory (inode 1) does not exist; fsck cannot rebuild it, so "
			"the name and link checks are skipped");
		return false;
	}
	if (!is_dir(root)) {
		finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
			"the root inode 1 is a %s, not a directory; fsck cannot repair that, so "
			"the name and link checks are skipped",
			type_word(root->mode));
		return false;
	}
	if (root->parent != EFS_META_ROOT_INO) {
		f = finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
			    "the root directory's parent pointer is %" PRIu64 " instead of 1",
			    root->parent);
		set_repair(st, f, "set it to 1");
		op_patch(st, f, root, false, 0, true, EFS_META_ROOT_INO);
		root->hyp_parent = EFS_META_ROOT_INO;
	}
	root->reached = true;
	return true;
}

/* Entries that cannot stand: in a missing or non-directory parent, naming
 * nothing, or naming the root. */
static void stage_dirents(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700];

	/* Provisional names, only for the paths in messages; stage_names
	 * chooses the real ones. */
	for (size_t i = 0; i < st->n_des; i++) {
		struct ino_ent *t = live_ino(st, st->des[i].ino);

		if (t && t->name_idx == NONE && t->ino != EFS_META_ROOT_INO)
			t->name_idx = i;
	}

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *p = live_ino(st, d->parent), *t = live_ino(st, d->ino);

		de_desc(st, d, desc, sizeof(desc));
		if (!p)
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s: the directory does not exist", desc);
		else if (!is_dir(p))
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s: inode %" PRIu64 " is a %s, not a directory", desc, p->ino,
				    type_word(p->mode));
		else if (d->ino == EFS_META_ROOT_INO)
			f = finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
				    "%s names the root directory, which has no name", desc);
		else if (!t)
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s names inode %" PRIu64 ", which does not exist", desc,
				    d->ino);
		else
			continue;
		set_repair(st, f, "delete the entry");
		op_del_dirent(st, f, i);
		d->removed = true;
	}
	for (size_t i = 0; i < st->n_inos; i++)
		st->inos[i].name_idx = NONE;
}

/* Counts names, picks each directory's one name, removes the others and
 * fixes entry types. */
static void stage_names(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700], idesc[700];

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t;

		if (d->removed)
			continue;
		t = live_ino(st, d->ino);
		live_ino(st, d->parent)->has_children = true;
		t->names++;
		if (t->name_idx == NONE)
			t->name_idx = i;
		else if (is_dir(t) && st->des[t->name_idx].parent != t->parent &&
			 d->parent == t->parent)
			t->name_idx = i;
	}
	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t;
		uint32_t dt;

		if (d->removed)
			continue;
		t = live_ino(st, d->ino);
		if (is_dir(t) && t->name_idx != i) {
			de_desc(st, d, desc, sizeof(desc));
			ino_desc(st, t->ino, idesc, sizeof(idesc));
			f = finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
				    "%s is a second name of %s (a directory has exactly one name)",
				    desc, idesc);
			set_repair(st, f, "delete this entry");
			op_del_dirent(st, f, i);
			d->removed = true;
			t->names--;
			continue;
		}
		dt = efs_meta_dt_from_mode(t->mode);
		if (d->type != dt) {
			struct efs_check_op *op;

			de_desc(st, d, desc, sizeof(desc));
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s says it names a %s, but inode %" PRIu64 " is a %s", desc,
				    dt_word(d->type), t->ino, type_word(t->mode));
			set_repair(st, f, "set the entry's type to %s", dt_word(dt));
			op = add_op(st, f, OP_DIRENT_PATCH);
			if (op) {
				if (efs_meta_key_dirent(&st->ns, d->parent, d->name, d->name_len,
							&op->key) < 0)
					st->err = -EINVAL;
				op->de = i;
				op->type = dt;
			}
			d->type = dt;
		}
	}
}

/* Whether a live entry |name| exists in |parent|: a binary search of the
 * entries read (in key order: parent, then name bytes), then the added ones. */
static bool find_de(const state_t *st, uint64_t parent, const char *name)
{
	size_t len = strlen(name), lo = 0, hi = st->n_des_loaded;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct de_ent *d = &st->des[mid];
		int c;

		if (d->parent != parent) {
			c = d->parent < parent ? -1 : 1;
		} else {
			c = memcmp(d->name, name, d->name_len < len ? d->name_len : len);
			if (c == 0)
				c = d->name_len < len ? -1 : d->name_len > len;
		}
		if (c == 0)
			return !d->removed;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = st->n_des_loaded; i < st->n_des; i++)
		if (st->des[i].parent == parent && !st->des[i].removed &&
		    strcmp(st->des[i].name, name) == 0)
			return true;
	return false;
}

/* Links |e| into lost+found as "#<ino>" (with |del|, in the same
 * transaction, the entry that named it is deleted). */
static void relink(state_t *st, struct efs_check_finding *f, struct ino_ent *e, size_t del)
{
	char name[32];
	struct efs_meta_key key;
	Etcfs__Dirent de = ETCFS__DIRENT__INIT;
	struct efs_check_op *op;
	struct ino_ent *lf = live_ino(st, st->lf);
	char pre[320] = "";
	size_t di;
	int n = 0;

	/* Without a lost+found the finding stays without a repair. */
	if (!lf || !f)
		return;
	for (;;) {
		bool taken = false;

		if (n == 0)
			snprintf(name, sizeof(name), "#%" PRIu64, e->ino);
		else
			snprintf(name, sizeof(name), "#%" PRIu64 ".%d", e->ino, n);
		taken = find_de(st, lf->ino, name);
		if (!taken)
			break;
		n++;
	}
	if (del != NONE) {
		struct ino_ent *old = live_ino(st, st->des[del].parent);

		if (old && is_dir(e))
			old->sub_delta--;
		op_del_dirent(st, f, del);
		st->des[del].removed = true;
		snprintf(pre, sizeof(pre),
			 "delete the entry \"%s\" in directory inode %" PRIu64 " and ",
			 st->des[del].name, st->des[del].parent);
	}
	de.ino = e->ino;
	de.type = efs_meta_dt_from_mode(e->mode);
	if (efs_meta_key_dirent(&st->ns, lf->ino, name, strlen(name), &key) < 0) {
		st->err = -EINVAL;
		return;
	}
	op_require(st, f, lf->ino);
	di = add_de(st, lf->ino, name, strlen(name), e->ino, de.type, 0);
	if (di == NONE)
		return;
	op = op_put(st, f, &key, &de.base, 0);
	if (op)
		op->de = di;
	if (del == NONE)
		e->names++;
	e->name_idx = di;
	if (is_dir(e)) {
		lf->sub_delta++;
		if (e->hyp_parent != lf->ino)
			op_patch(st, f, e, false, 0, true, lf->ino);
		e->hyp_parent = lf->ino;
		set_repair(st, f, "%slink it into /lost+found as \"%s\"", pre, name);
	} else if (e->hyp_nlink != e->names) {
		op_patch(st, f, e, true, e->names, false, 0);
		set_repair(st, f,
			   "%slink it into /lost+found as \"%s\" with link count %" PRIu32, pre,
			   name, e->names);
		e->hyp_nlink = e->names;
	} else {
		set_repair(st, f, "%slink it into /lost+found as \"%s\"", pre, name);
	}
}

static void stage_lost_found(state_t *st)
{
	struct efs_check_finding *f;
	struct ino_ent *two;
	struct efs_meta_key key;
	const char *lfn = "lost+found";

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t;

		if (d->removed || d->parent != EFS_META_ROOT_INO || strcmp(d->name, lfn) != 0)
			continue;
		t = live_ino(st, d->ino);
		if (is_dir(t)) {
			st->lf = t->ino;
			return;
		}
		finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
			"/lost+found is a %s (inode %" PRIu64
			"), not a directory; fsck will not replace it, so unnamed inodes cannot "
			"be linked anywhere",
			type_word(t->mode), t->ino);
		return;
	}
	if (efs_meta_key_dirent(&st->ns, EFS_META_ROOT_INO, lfn, strlen(lfn), &key) < 0) {
		st->err = -EINVAL;
		return;
	}
	two = live_ino(st, 2);
	if (two && is_dir(two) && two->names == 0) {
		Etcfs__Dirent de = ETCFS__DIRENT__INIT;
		struct efs_check_op *op;
		size_t di;

		f = finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
			    "/lost+found is missing; directory inode 2 (the lost+found mkfs made) "
			    "has no name");
		set_repair(st, f, "link inode 2 into / as lost+found");
		de.ino = 2;
		de.type = DT_DIR;
		op_require(st, f, EFS_META_ROOT_INO);
		di = add_de(st, EFS_META_ROOT_INO, lfn, strlen(lfn), 2, DT_DIR, 0);
		op = op_put(st, f, &key, &de.base, 0);
		if (op)
			op->de = di;
		if (two->hyp_parent != EFS_META_ROOT_INO)
			op_patch(st, f, two, false, 0, true, EFS_META_ROOT_INO);
		two->hyp_parent = EFS_META_ROOT_INO;
		two->names = 1;
		two->name_idx = di;
		st->lf = 2;
		return;
	}
	{
		Etcfs__Inode in = ETCFS__INODE__INIT;
		Etcfs__Dirent de = ETCFS__DIRENT__INIT;
		struct efs_meta_key ikey;
		struct efs_check_op *op;
		struct ino_ent *arr, *e;
		uint64_t ino = st->max_ino + 1;
		size_t di;

		if (!st->counter_bad && st->counter_present && st->hyp_counter > ino)
			ino = st->hyp_counter;
		f = finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR, "there is no /lost+found");
		set_repair(st, f, "create it (as inode %" PRIu64 ")", ino);
		in.mode = S_IFDIR | 0700;
		in.nlink = 2;
		in.parent = EFS_META_ROOT_INO;
		in.atime_ns = in.mtime_ns = in.ctime_ns = in.btime_ns = now_ns();
		de.ino = ino;
		de.type = DT_DIR;
		if (efs_meta_key_inode(&st->ns, ino, &ikey) < 0) {
			st->err = -EINVAL;
			return;
		}
		op_require(st, f, EFS_META_ROOT_INO);
		op = op_put(st, f, &ikey, &in.base, 0);
		if (op)
			op->ino = ino;
		di = add_de(st, EFS_META_ROOT_INO, lfn, strlen(lfn), ino, DT_DIR, 0);
		op = op_put(st, f, &key, &de.base, 0);
		if (op)
			op->de = di;
		op = add_op(st, f, OP_COUNTER);
		if (op) {
			if (efs_meta_key_ino_counter(&st->ns, &op->key) < 0)
				st->err = -EINVAL;
			op->counter = ino + 1;
		}
		st->hyp_counter = ino + 1;
		st->counter_bad = false;
		st->counter_present = true;
		st->max_ino = ino;
		arr = grow(st->inos, &st->cap_inos, st->n_inos, sizeof(*arr));
		if (!arr) {
			st->err = -ENOMEM;
			return;
		}
		st->inos = arr;
		e = &arr[st->n_inos++];
		memset(e, 0, sizeof(*e));
		e->ino = ino;
		e->mode = in.mode;
		e->nlink = e->hyp_nlink = 2;
		e->parent = e->hyp_parent = EFS_META_ROOT_INO;
		e->names = 1;
		e->name_idx = di;
		st->lf = ino;
	}
}

/* The keys of inode |ino| (any per-inode family): by_ino[*lo .. *hi). */
static void keys_of(const state_t *st, uint64_t ino, size_t *lo, size_t *hi)
{
	size_t a = 0, b = st->n_keys;

	while (a < b) {
		size_t mid = a + (b - a) / 2;

		if (st->keys[st->by_ino[mid]].ino < ino)
			a = mid + 1;
		else
			b = mid;
	}
	*lo = a;
	while (a < st->n_keys && st->keys[st->by_ino[a]].ino == ino)
		a++;
	*hi = a;
}

static int cmp_key_ino(const void *a, const void *b, void *arg)
{
	const state_t *st = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	if (st->keys[x].ino != st->keys[y].ino)
		return st->keys[x].ino < st->keys[y].ino ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int index_keys(state_t *st)
{
	st->by_ino = efs_mem_malloc((st->n_keys + 1) * sizeof(*st->by_ino));
	if (!st->by_ino)
		return -ENOMEM;
	for (size_t i = 0; i < st->n_keys; i++)
		st->by_ino[i] = i;
	qsort_r(st->by_ino, st->n_keys, sizeof(*st->by_ino), cmp_key_ino, st);
	return 0;
}

/* An inode no entry names and whose link count is 0 without an orphan or
 * reclaim record. */
static void unreachable_zero(state_t *st, struct ino_ent *e)
{
	struct efs_check_finding *f;
	struct efs_meta_key key;
	char node[EFS_META_NODE_MAX + 1] = "";
	size_t lo, hi;

	if (e->has_open) {
		Etcfs__Orphan o = ETCFS__ORPHAN__INIT;

		keys_of(st, e->ino, &lo, &hi);
		for (size_t i = lo; i < hi; i++) {
			const struct key_ent *k = &st->keys[st->by_ino[i]];

			if (k->family == EFS_META_K_OPEN && !k->removed)
				memcpy(node, k->node, sizeof(node));
		}
		f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
			    "%s inode %" PRIu64 " has link count 0 and no name but no orphan "
			    "record, while node %s has it open",
			    type_word(e->mode), e->ino, node);
		set_repair(st, f, "make it an orphan (freed when its last opener closes it)");
		o.since_ns = now_ns();
		if (efs_meta_key_orphan(&st->ns, e->ino, &key) == 0)
			op_put(st, f, &key, &o.base, 0);
		e->has_orphan = true;
		return;
	}
	if (e->has_extents) {
		Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT;

		f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
			    "%s inode %" PRIu64 " has link count 0, no name and no orphan or "
			    "reclaim record: nothing can reach or free it",
			    type_word(e->mode), e->ino);
		set_repair(st, f, "give it a reclaim record, so that a node frees its blocks");
		rc.since_ns = now_ns();
		if (efs_meta_key_reclaim(&st->ns, e->ino, &key) == 0)
			op_put(st, f, &key, &rc.base, 0);
		e->has_reclaim = true;
		return;
	}
	f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
		    "%s inode %" PRIu64 " has link count 0, no name and no orphan or reclaim "
		    "record: nothing can reach or free it",
		    type_word(e->mode), e->ino);
	set_repair(st, f, "delete it with its extended attributes and lock keys");
	op_del_inode(st, f, e->ino, e->mod);
	keys_of(st, e->ino, &lo, &hi);
	for (size_t i = lo; i < hi; i++) {
		struct key_ent *k = &st->keys[st->by_ino[i]];

		if (k->removed)
			continue;
		if (k->family == EFS_META_K_XATTR || k->family == EFS_META_K_HOLDER ||
		    k->family == EFS_META_K_RECALL || k->family == EFS_META_K_PLOCK) {
			if (f && f->n_ops >= OPS_PER_FINDING)
				break; /* the stray stage takes the rest */
			op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
		}
	}
	e->removed = true;
}

static void reach_from(state_t *st, uint64_t start, size_t *order, size_t n_order)
{
	uint64_t *queue;
	size_t head = 0, tail = 0, cap = 64;

	queue = efs_mem_malloc(cap * sizeof(*queue));
	if (!queue) {
		st->err = -ENOMEM;
		return;
	}
	queue[tail++] = start;
	while (head < tail) {
		uint64_t dir = queue[head++];
		size_t lo = 0, hi = n_order;

		/* |order| holds live entries sorted by parent. */
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (st->des[order[mid]].parent < dir)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (size_t i = lo; i < n_order && st->des[order[i]].parent == dir; i++) {
			struct de_ent *d = &st->des[order[i]];
			struct ino_ent *t = live_ino(st, d->ino);

			if (d->removed || !t || t->reached)
				continue;
			if (is_dir(t) && t->name_idx != order[i])
				continue;
			t->reached = true;
			if (!is_dir(t))
				continue;
			if (tail == cap) {
				uint64_t *q = efs_mem_realloc(queue, cap * 2 * sizeof(*q));

				if (!q) {
					st->err = -ENOMEM;
					break;
				}
				queue = q;
				cap *= 2;
			}
			queue[tail++] = t->ino;
		}
	}
	efs_mem_free(queue);
}

static int cmp_de_parent(const void *a, const void *b, void *arg)
{
	const state_t *st = arg;
	const struct de_ent *x = &st->des[*(const size_t *)a];
	const struct de_ent *y = &st->des[*(const size_t *)b];

	if (x->parent != y->parent)
		return x->parent < y->parent ? -1 : 1;
	return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static size_t *order_by_parent(state_t *st, size_t *ret_n)
{
	size_t *order = efs_mem_malloc((st->n_des + 1) * sizeof(*order));
	size_t n = 0;

	if (!order) {
		st->err = -ENOMEM;
		return NULL;
	}
	for (size_t i = 0; i < st->n_des; i++)
		if (!st->des[i].removed)
			order[n++] = i;
	qsort_r(order, n, sizeof(*order), cmp_de_parent, st);
	*ret_n = n;
	return order;
}

/* Directories: parent pointers, unnamed directories, cycles. */
static void stage_tree(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700], pdesc[700];
	size_t *order, n_order;

	for (size_t i = 0; i < st->n_inos; i++) {
		struct ino_ent *e = &st->inos[i];

		if (e->removed || !is_dir(e) || e->ino == EFS_META_ROOT_INO)
			continue;
		if (e->names == 0) {
			if (e->hyp_nlink == 0 && (e->has_orphan || e->has_reclaim))
				continue; /* removed while open: an orphan */
			if (e->hyp_nlink == 0 && !e->has_children) {
				unreachable_zero(st, e);
				continue;
			}
			f = finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
				    "directory inode %" PRIu64 " has no name in any directory",
				    e->ino);
			relink(st, f, e, NONE);
			continue;
		}
		{
			const struct de_ent *d = &st->des[e->name_idx];

			if (e->hyp_parent != d->parent) {
				ino_desc(st, e->ino, desc, sizeof(desc));
				ino_desc(st, d->parent, pdesc, sizeof(pdesc));
				f = finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
					    "%s says its parent is inode %" PRIu64
					    ", but it is named in %s",
					    desc, e->hyp_parent, pdesc);
				set_repair(st, f, "set its parent to %" PRIu64, d->parent);
				op_patch(st, f, e, false, 0, true, d->parent);
				e->hyp_parent = d->parent;
			}
		}
	}
	if (st->err)
		return;
	order = order_by_parent(st, &n_order);
	if (!order)
		return;
	reach_from(st, EFS_META_ROOT_INO, order, n_order);
	for (size_t i = 0; i < st->n_inos && !st->err; i++) {
		struct ino_ent *e = &st->inos[i], *x, *m;
		char names[600];
		size_t o = 0;
		uint64_t id = ++st->walk;

		if (e->removed || !is_dir(e) || e->reached || e->names == 0)
			continue;
		/* Follow the names up: it cannot reach the root, so it ends in a cycle. */
		x = e;
		while (x && !x->reached && x->walk != id && x->name_idx != NONE) {
			x->walk = id;
			x = live_ino(st, st->des[x->name_idx].parent);
		}
		if (!x || x->reached || x->name_idx == NONE || x->walk != id)
			continue;
		/* |x| is on the cycle: find its smallest member and name them all. */
		m = x;
		names[0] = '\0';
		for (struct ino_ent *y = x;;) {
			const struct de_ent *d = &st->des[y->name_idx];

			if (y->ino < m->ino)
				m = y;
			if (o + 1 < sizeof(names))
				o += (size_t)snprintf(
					names + o, sizeof(names) - o,
					"%s\"%s\" (inode %" PRIu64 ", in %" PRIu64 ")",
					o ? ", " : "", d->name, y->ino, d->parent);
			y = live_ino(st, d->parent);
			if (!y || y == x)
				break;
		}
		f = finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
			    "directories %s name each other in a cycle that the root does not "
			    "reach",
			    names);
		relink(st, f, m, m->name_idx);
		/* The entry list grew: rebuild the order and go on from |m|. */
		efs_mem_free(order);
		order = order_by_parent(st, &n_order);
		if (!order)
			return;
		m->reached = true;
		reach_from(st, m->ino, order, n_order);
	}
	efs_mem_free(order);
}

/* Non-directories that no entry names. */
static void stage_unnamed(state_t *st)
{
	struct efs_check_finding *f;

	for (size_t i = 0; i < st->n_inos && !st->err; i++) {
		struct ino_ent *e = &st->inos[i];

		if (e->removed || is_dir(e) || e->names != 0)
			continue;
		if (e->hyp_nlink == 0) {
			if (e->has_orphan || e->has_reclaim)
				continue;
			unreachable_zero(st, e);
			continue;
		}
		f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
			    "%s inode %" PRIu64 " (link count %" PRIu32
			    ") has no name in any directory",
			    type_word(e->mode), e->ino, e->hyp_nlink);
		relink(st, f, e, NONE);
	}
}

static void stage_nlink(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700];

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t, *p;

		if (d->removed)
			continue;
		t = live_ino(st, d->ino);
		p = live_ino(st, d->parent);
		if (t && p && is_dir(t) && t->name_idx == i)
			p->subdirs++;
	}
	for (size_t i = 0; i < st->n_inos && !st->err; i++) {
		struct ino_ent *e = &st->inos[i];
		uint32_t want;

		if (e->removed)
			continue;
		if (e->names == 0 && e->ino != EFS_META_ROOT_INO)
			continue; /* orphans, and what could not be linked */
		want = is_dir(e) ? 2 + e->subdirs : e->names;
		if (e->hyp_nlink == want)
			continue;
		ino_desc(st, e->ino, desc, sizeof(desc));
		if (is_dir(e) && e->sub_delta && (int64_t)e->hyp_nlink + e->sub_delta == want)
			/* Right before the repairs above moved directories. */
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_NOTE,
				    "%s needs link count %" PRIu32 " after the repairs above move "
				    "directories (it has %" PRIu32 ")",
				    desc, want, e->hyp_nlink);
		else if (is_dir(e))
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s has link count %" PRIu32 ", but with %" PRIu32
				    " subdirector%s it should be %" PRIu32,
				    desc, e->hyp_nlink, e->subdirs, e->subdirs == 1 ? "y" : "ies",
				    want);
		else
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s has link count %" PRIu32 ", but %" PRIu32 " name%s %s it",
				    desc, e->hyp_nlink, want, want == 1 ? "" : "s",
				    want == 1 ? "names" : "name");
		if (want > EFS_META_LINK_MAX)
			continue; /* more names than the link limit: no safe repair */
		set_repair(st, f, "set it to %" PRIu32, want);
		op_patch(st, f, e, true, want, false, 0);
		e->hyp_nlink = want;
	}
}


/* Orphan and reclaim records against their inodes' link counts. */
static void stage_orphans(state_t *st)
{
	struct efs_check_finding *f;

	for (size_t i = 0; i < st->n_keys && !st->err; i++) {
		struct key_ent *k = &st->keys[i];
		bool orphan = k->family == EFS_META_K_ORPHAN;
		const char *what = orphan ? "orphan record" : "reclaim record";
		struct ino_ent *e;

		if ((!orphan && k->family != EFS_META_K_RECLAIM) || k->removed)
			continue;
		e = live_ino(st, k->ino);
		if (e && e->hyp_nlink > 0) {
			f = finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				    "%s of inode %" PRIu64 ", which still has link count %" PRIu32,
				    what, k->ino, e->hyp_nlink);
			if (!orphan)
				continue; /* freeing a linked file: no safe repair */
			set_repair(st, f, "delete the orphan record");
			op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
			continue;
		}
		if (!e && orphan) {
			f = finding(st, EFS_CHECK_INV_STRAY, EFS_CHECK_ERROR,
				    "orphan record of inode %" PRIu64 ", which does not exist",
				    k->ino);
			set_repair(st, f, "delete it");
			op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
			continue;
		}
		/* A reclaim record may outlive its inode record; an orphan of an
		 * inode with link count 0 is as it should be. Only its value may
		 * be wrong. */
		if (k->bad) {
			struct efs_meta_key key;
			Etcfs__Orphan o = ETCFS__ORPHAN__INIT;
			Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT;

			f = finding(st, EFS_CHECK_INV_RECORD, EFS_CHECK_ERROR,
				    "%s of inode %" PRIu64 " cannot be decoded: %s", what, k->ino,
				    k->b ? "impossible contents" : "not a valid record");
			memcpy(key.buf, k->key, k->keylen);
			key.len = k->keylen;
			o.since_ns = rc.since_ns = now_ns();
			if (orphan) {
				set_repair(st, f, "rewrite it as a new orphan record");
				op_put(st, f, &key, &o.base, k->mod);
			} else {
				set_repair(st, f,
					   "rewrite it as a reclaim record that starts again "
					   "from the first chunk");
				op_put(st, f, &key, &rc.base, k->mod);
			}
		}
	}
}

static const char *stray_word(enum efs_meta_family f)
{
	switch (f) {
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
	default:
		return "byte-range lock record";
	}
}

static bool has_reclaim(const state_t *st, uint64_t ino)
{
	size_t lo, hi;

	keys_of(st, ino, &lo, &hi);
	for (size_t j = lo; j < hi; j++)
		if (st->keys[st->by_ino[j]].family == EFS_META_K_RECLAIM)
			return true;
	return false;
}

/* Per-inode keys of inodes that do not exist. */
static void stage_strays(state_t *st)
{
	struct efs_check_finding *f;
	size_t fi = NONE, f_count = 0;
	uint64_t f_ino = 0;

	for (size_t i = 0; i < st->n_keys && !st->err; i++) {
		struct key_ent *k = &st->keys[i];

		if (k->removed || live_ino(st, k->ino))
			continue;
		switch (k->family) {
		case EFS_META_K_XATTR:
			break;
		case EFS_META_K_EXTENT:
			if (has_reclaim(st, k->ino))
				continue; /* being freed in batches */
			finding(st, EFS_CHECK_INV_STRAY, EFS_CHECK_ERROR,
				"extent chunk %" PRIu64 " of inode %" PRIu64
				", which does not exist: its blocks stay allocated (fsck does not "
				"free extents)",
				k->b, k->ino);
			continue;
		case EFS_META_K_HOLDER:
		case EFS_META_K_RECALL:
		case EFS_META_K_OPEN:
		case EFS_META_K_PLOCK:
			if (has_reclaim(st, k->ino))
				continue;
			/* On a live lease: a node may be deleting it right now. */
			finding(st, EFS_CHECK_INV_STRAY, EFS_CHECK_WARNING,
				"%s of inode %" PRIu64 " for node %s, whose inode does not exist "
				"(an operation in flight on a mounted node?)",
				stray_word(k->family), k->ino, k->node);
			continue;
		default:
			continue;
		}
		/* Extended attributes: one finding per inode (split when large). */
		if (fi == NONE || f_ino != k->ino || f_count >= OPS_PER_FINDING) {
			f = finding(st, EFS_CHECK_INV_STRAY, EFS_CHECK_ERROR,
				    "extended attributes of inode %" PRIu64
				    ", which does not exist",
				    k->ino);
			set_repair(st, f, "delete them");
			if (!f)
				return;
			fi = (size_t)(f - st->rep->findings);
			f_ino = k->ino;
			f_count = 0;
		}
		/* By index: the warnings above may move the findings array. */
		op_del(st, &st->rep->findings[fi], k->key, k->keylen, k->mod);
		f_count++;
		k->removed = true;
	}
}

/* Invariant 6: an exclusive holder excludes every other holder. */
static void stage_holders(state_t *st)
{
	for (size_t i = 0; i < st->n_keys && !st->err;) {
		size_t j = i, n = 0, x = NONE;
		char others[400];
		size_t o = 0;

		if (st->keys[i].family != EFS_META_K_HOLDER) {
			i++;
			continue;
		}
		/* Holder keys of one inode are adjacent (key order). */
		while (j < st->n_keys && st->keys[j].family == EFS_META_K_HOLDER &&
		       st->keys[j].ino == st->keys[i].ino)
			j++;
		others[0] = '\0';
		for (size_t k = i; k < j; k++) {
			if (st->keys[k].removed)
				continue;
			n++;
			if (st->keys[k].mode == EFS_META_LOCK_EXCLUSIVE && x == NONE) {
				x = k;
				continue;
			}
			if (o + 1 < sizeof(others))
				o += (size_t)snprintf(others + o, sizeof(others) - o, "%s%s (%s)",
						      o ? ", " : "", st->keys[k].node,
						      st->keys[k].mode == EFS_META_LOCK_EXCLUSIVE
							      ? "exclusive"
							      : "shared");
		}
		if (x != NONE && n > 1)
			finding(st, EFS_CHECK_INV_LOCKS, EFS_CHECK_ERROR,
				"inode %" PRIu64 " has an exclusive holder, node %s, together with "
				"other holders: %s. All ride live leases, so fsck does not choose "
				"between them; the nodes' sessions must end",
				st->keys[i].ino, st->keys[x].node, others);
		i = j;
	}
}

/* Invariant 5: a file's extents lie within its size rounded up to a block. */
/* The first extent of the chunk that is keys[key] (exts are in key order). */
static size_t first_ext(const state_t *st, size_t key)
{
	size_t lo = 0, hi = st->n_exts;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (st->exts[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void stage_extents(state_t *st)
{
	uint32_t bs = st->fi ? st->fi->block_size : 4096;
	struct efs_check_finding *f;
	struct efs_check_op *op;

	for (size_t i = 0; i < st->n_keys && !st->err; i++) {
		struct key_ent *k = &st->keys[i];
		struct ino_ent *e;
		uint64_t blocks;
		char desc[700];

		if (k->family != EFS_META_K_EXTENT || k->removed || k->bad)
			continue;
		e = live_ino(st, k->ino);
		if (!e)
			continue;
		blocks = e->size / bs + (e->size % bs != 0);
		if (k->a <= blocks)
			continue;
		ino_desc(st, e->ino, desc, sizeof(desc));
		f = finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
			    "%s has extents up to block %" PRIu64 " in chunk %" PRIu64
			    ", but its size %" PRIu64 " bytes covers %" PRIu64 " blocks",
			    desc, k->a, k->b, e->size, blocks);
		set_repair(st, f,
			   "cut the chunk's extents at file block %" PRIu64 " (preallocated "
			   "ones stay; an emptied chunk is deleted); the blocks cut off go back "
			   "to the free maps (below)",
			   blocks);
		op_require(st, f, e->ino);
		op = add_op(st, f, OP_CHUNK_TRIM);
		if (!op)
			return;
		memcpy(op->key.buf, k->key, k->keylen);
		op->key.len = k->keylen;
		op->kidx = i;
		op->limit = blocks;
		/* The extents as the repair leaves them. */
		for (size_t j = first_ext(st, i); j < st->n_exts && st->exts[j].key == i; j++) {
			struct ext_ent *x = &st->exts[j];

			if (x->flags & EFS_META_EXTENT_F_PREALLOC || x->fb + x->count <= blocks)
				continue;
			x->cut = x->fb >= blocks ? x->count : x->fb + x->count - blocks;
			x->fix = (size_t)(f - st->rep->findings);
		}
		k->a = blocks;
	}
}

/* ---- Space: invariants 1 and 2 ---- */

/* The data area and its groups, from the sb record. */
struct geo {
	uint64_t ds, de; /* data area: device blocks [ds, de) */
	uint64_t agb;	 /* blocks per group */
	uint32_t agc;	 /* groups */
};

static bool geo_of(const state_t *st, struct geo *g)
{
	const Etcfs__FsInfo *fi = st->fi;

	if (!fi || !fi->block_size || !fi->ag_blocks || !fi->ag_count)
		return false;
	g->ds = fi->data_start;
	g->de = fi->device_size / fi->block_size;
	g->agb = fi->ag_blocks;
	g->agc = fi->ag_count;
	return g->de > g->ds;
}

/* First block and size of group |g|. */
static uint64_t group_start(const struct geo *g, uint32_t grp)
{
	return g->ds + (uint64_t)grp * g->agb;
}

static uint64_t group_size(const struct geo *g, uint32_t grp)
{
	uint64_t s = group_start(g, grp);

	return g->de - s < g->agb ? g->de - s : g->agb;
}

/* "device blocks 5-9" or "device block 5", for [start, end). */
static void blocks_text(uint64_t start, uint64_t end, char *buf, size_t size)
{
	if (end - start == 1)
		snprintf(buf, size, "device block %" PRIu64, start);
	else
		snprintf(buf, size, "device blocks %" PRIu64 "-%" PRIu64, start, end - 1);
}

/* "file /f (inode 7), chunk 0, file blocks 0-3" for extent |x|. */
static void ext_desc(state_t *st, const struct ext_ent *x, char *buf, size_t size)
{
	char who[600];

	if (live_ino(st, x->ino))
		ino_desc(st, x->ino, who, sizeof(who));
	else if (has_reclaim(st, x->ino))
		snprintf(who, sizeof(who), "inode %" PRIu64 " (being reclaimed)", x->ino);
	else
		snprintf(who, sizeof(who), "missing inode %" PRIu64, x->ino);
	if (x->count == 1)
		snprintf(buf, size, "%s, chunk %" PRIu64 ", file block %" PRIu64, who, x->chunk,
			 x->fb);
	else
		snprintf(buf, size, "%s, chunk %" PRIu64 ", file blocks %" PRIu64 "-%" PRIu64,
			 who, x->chunk, x->fb, x->fb + x->count - 1);
}

/* "the free intent of node n1 (session 1, sequence 2)". */
static void intent_desc(const state_t *st, size_t key, char *buf, size_t size)
{
	const struct key_ent *k = &st->keys[key];

	snprintf(buf, size,
		 "the free intent of node %s (session %" PRIu64 ", sequence %" PRIu64 ")",
		 k->node, k->a, k->b);
}

/* Blocks of |x| the repairs keep, and the end of those (clamped). */
static uint64_t ext_len(const struct ext_ent *x)
{
	return x->count - x->cut;
}

static uint64_t ext_end(const struct ext_ent *x)
{
	return x->dev > UINT64_MAX - ext_len(x) ? UINT64_MAX : x->dev + ext_len(x);
}

/*
 * Within one file: every extent of chunk C lies in [C, next chunk), so
 * chunks never overlap in file blocks. (The decoder already checked that a
 * chunk's extents are sorted and do not overlap.)
 */
static void stage_chunks(state_t *st)
{
	size_t last = NONE;
	char desc[700];

	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[i];
		const struct key_ent *nk;
		uint64_t bound = UINT64_MAX;

		if (x->key == last)
			continue;
		if (x->key + 1 < st->n_keys) {
			nk = &st->keys[x->key + 1];
			if (nk->family == EFS_META_K_EXTENT && nk->ino == x->ino)
				bound = nk->b;
		}
		if (x->fb >= x->chunk && x->fb + x->count <= bound)
			continue;
		ext_desc(st, x, desc, sizeof(desc));
		if (x->fb < x->chunk)
			finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
				"extent chunk %" PRIu64 " of inode %" PRIu64
				" holds an extent (%s) that starts before the chunk's first block "
				"%" PRIu64,
				x->chunk, x->ino, desc, x->chunk);
		else
			finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
				"extent chunk %" PRIu64 " of inode %" PRIu64
				" holds an extent (%s) that reaches into the next chunk, which "
				"starts at file block %" PRIu64,
				x->chunk, x->ino, desc, bound);
		last = x->key; /* one finding per chunk */
	}
}

static int cmp_ext_dev(const void *a, const void *b, void *arg)
{
	const state_t *st = arg;
	const struct ext_ent *x = &st->exts[*(const size_t *)a];
	const struct ext_ent *y = &st->exts[*(const size_t *)b];

	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/*
 * Invariant 2: every extent lies inside the data area, and no two extents
 * (of any files, or of one) share a device block. Sorted by first device
 * block, an extent overlaps an earlier one exactly when it starts before the
 * largest end seen so far; it is reported against the extent with that end.
 */
static void stage_overlaps(state_t *st, const struct geo *g)
{
	size_t *order, m = NONE;
	uint64_t maxend = 0;
	char d1[800], d2[800], bt[64];

	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[i];

		if (!ext_len(x) ||
		    (x->dev >= g->ds && ext_end(x) <= g->de && x->dev <= UINT64_MAX - ext_len(x)))
			continue;
		ext_desc(st, x, d1, sizeof(d1));
		if (x->dev > UINT64_MAX - ext_len(x))
			finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
				"the extent of %s starts at device block %" PRIu64
				" and runs past the largest block number",
				d1, x->dev);
		else
			finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
				"the extent of %s uses device blocks %" PRIu64 "-%" PRIu64
				", outside the data area (device blocks %" PRIu64 "-%" PRIu64 ")",
				d1, x->dev, x->dev + ext_len(x) - 1, g->ds, g->de - 1);
	}
	order = efs_mem_malloc((st->n_exts + 1) * sizeof(*order));
	if (!order) {
		st->err = -ENOMEM;
		return;
	}
	for (size_t i = 0; i < st->n_exts; i++)
		order[i] = i;
	qsort_r(order, st->n_exts, sizeof(*order), cmp_ext_dev, st);
	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[order[i]];
		uint64_t end = ext_end(x);

		if (!ext_len(x))
			continue;
		if (m != NONE && x->dev < maxend) {
			uint64_t oe = end < maxend ? end : maxend;

			ext_desc(st, &st->exts[m], d1, sizeof(d1));
			ext_desc(st, x, d2, sizeof(d2));
			blocks_text(x->dev, oe, bt, sizeof(bt));
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"%s %s used by two extents: %s; and %s", bt,
				oe - x->dev == 1 ? "is" : "are", d1, d2);
		}
		if (m == NONE || end > maxend) {
			m = order[i];
			maxend = end;
		}
	}
	efs_mem_free(order);
}

/* What a stretch of blocks was found to be. */
enum sp_class {
	SPC_TAKE = 0, /* free in the map and used by an extent */
	SPC_LEAK,     /* neither free, nor in an intent, nor used */
	SPC_TRIMMED,  /* like SPC_LEAK once invariant 5's repair cut an extent */
	SPC_INT_FREE, /* in a free intent and free in the map */
	SPC_INT_EXT,  /* in a free intent and used by an extent */
	SPC_INT_INT,  /* in two free intents */
	SPC_N,
};

/* A stretch [start, end) of one group, with what it is named by. */
struct sp_hit {
	uint32_t group;
	uint64_t start, end;
	size_t ext, intent; /* indices in |exts| and |keys|, NONE: none */
	size_t dep;	    /* SPC_TRIMMED: the finding cutting the extent */
};

struct sp_hits {
	struct sp_hit *v;
	size_t n, cap;
};

enum { SPT_FREE = 0, SPT_INTENT, SPT_EXT, SPT_TRIM, SPT_N };

/* An item starts (delta 1) or ends (-1) at |pos|; ends sort first. */
struct sp_ev {
	uint64_t pos;
	int delta;
	int type; /* SPT_* */
	size_t idx; /* |runs| (free, intent) or |exts| */
	uint64_t end; /* the item's end (starts) */
};

static int cmp_ev(const void *a, const void *b)
{
	const struct sp_ev *x = a, *y = b;

	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return x->delta < y->delta ? -1 : x->delta > y->delta;
}

struct sweep {
	state_t *st;
	const struct geo *g;
	const bool *usable;
	struct sp_hits hits[SPC_N];
	size_t cnt[SPT_N];
	size_t best[SPT_N]; /* started item of each type with the largest end */
	uint64_t best_end[SPT_N];
};

static void hit(struct sweep *w, enum sp_class c, uint32_t grp, uint64_t s, uint64_t e, size_t ext,
		size_t intent)
{
	struct sp_hits *h = &w->hits[c];
	struct sp_hit *last = h->n ? &h->v[h->n - 1] : NULL, *arr;
	size_t dep = c == SPC_TRIMMED ? w->st->exts[ext].fix : NONE;

	if (last && last->group == grp && last->end == s && last->ext == ext &&
	    last->intent == intent && last->dep == dep) {
		last->end = e;
		return;
	}
	arr = grow(h->v, &h->cap, h->n, sizeof(*arr));
	if (!arr) {
		w->st->err = -ENOMEM;
		return;
	}
	h->v = arr;
	arr[h->n++] = (struct sp_hit){.group = grp, .start = s, .end = e, .ext = ext,
				      .intent = intent, .dep = dep};
}

/* Classifies [s, e), where the counts of |w| hold, one group at a time. */
static void classify(struct sweep *w, uint64_t s, uint64_t e)
{
	const struct geo *g = w->g;
	size_t nf = w->cnt[SPT_FREE], ni = w->cnt[SPT_INTENT], nx = w->cnt[SPT_EXT];
	size_t xe = nx ? w->best[SPT_EXT] : NONE;
	size_t ik = ni ? w->st->runs[w->best[SPT_INTENT]].key : NONE;

	while (s < e) {
		uint32_t grp = (uint32_t)((s - g->ds) / g->agb);
		uint64_t ge = group_start(g, grp) + group_size(g, grp);

		if (ge > e)
			ge = e;
		if (w->usable[grp]) {
			if (!nf && !ni && !nx && w->cnt[SPT_TRIM])
				hit(w, SPC_TRIMMED, grp, s, ge, w->best[SPT_TRIM], NONE);
			else if (!nf && !ni && !nx)
				hit(w, SPC_LEAK, grp, s, ge, NONE, NONE);
			if (nf && nx)
				hit(w, SPC_TAKE, grp, s, ge, xe, NONE);
			if (ni && nf)
				hit(w, SPC_INT_FREE, grp, s, ge, NONE, ik);
			if (ni && nx)
				hit(w, SPC_INT_EXT, grp, s, ge, xe, ik);
			if (ni >= 2)
				hit(w, SPC_INT_INT, grp, s, ge, NONE, ik);
		}
		s = ge;
	}
}

static int add_ev(struct sp_ev **ev, size_t *n, size_t *cap, int type, size_t idx, uint64_t s,
		  uint64_t e)
{
	struct sp_ev *arr;

	if (s >= e)
		return 0;
	arr = grow(*ev, cap, *n + 1, sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	*ev = arr;
	arr[(*n)++] = (struct sp_ev){.pos = s, .delta = 1, .type = type, .idx = idx, .end = e};
	arr[(*n)++] = (struct sp_ev){.pos = e, .delta = -1, .type = type, .idx = idx};
	return 0;
}

/* Appends "device blocks a-b (who)" items of hits [lo, hi) to |buf|. */
static void hits_text(state_t *st, const struct sp_hit *v, size_t lo, size_t hi, char *buf,
		      size_t size)
{
	size_t o = 0, shown = 0;
	char bt[64], d1[800], d2[300];

	buf[0] = '\0';
	for (size_t i = lo; i < hi && o + 1 < size; i++) {
		if (shown == 6) {
			snprintf(buf + o, size - o, "; and %zu more", hi - i);
			return;
		}
		blocks_text(v[i].start, v[i].end, bt, sizeof(bt));
		d1[0] = d2[0] = '\0';
		if (v[i].ext != NONE)
			ext_desc(st, &st->exts[v[i].ext], d1, sizeof(d1));
		if (v[i].intent != NONE)
			intent_desc(st, v[i].intent, d2, sizeof(d2));
		o += (size_t)snprintf(buf + o, size - o, "%s%s%s%s%s%s%s", shown ? "; " : "", bt,
				      d1[0] || d2[0] ? " (" : "", d2, d1[0] && d2[0] ? ", " : "",
				      d1, d1[0] || d2[0] ? ")" : "");
		shown++;
	}
}

/* A patch of group |grp|'s map that takes (|take|) or puts back the runs
 * of hits [lo, hi). */
static void op_map_patch(state_t *st, struct efs_check_finding *f, const struct geo *g,
			 uint32_t grp, size_t mk, size_t ck, bool take, const struct sp_hit *v,
			 size_t lo, size_t hi)
{
	struct efs_check_op *op = add_op(st, f, OP_MAP_PATCH);
	struct efs_run *runs;
	uint64_t base = group_start(g, grp);

	if (!op)
		return;
	runs = efs_mem_malloc((hi - lo) * sizeof(*runs));
	if (!runs) {
		st->err = -ENOMEM;
		return;
	}
	for (size_t i = lo; i < hi; i++) {
		runs[i - lo] = (struct efs_run){.start = v[i].start - base,
						.len = v[i].end - v[i].start};
		if (v[i].dep == NONE ||
		    (op->n_deps && op->deps[op->n_deps - 1] == v[i].dep))
			continue;
		{
			size_t *d = efs_mem_realloc(op->deps, (op->n_deps + 1) * sizeof(*d));

			if (!d) {
				st->err = -ENOMEM;
				break;
			}
			op->deps = d;
			d[op->n_deps++] = v[i].dep;
		}
	}
	if (take) {
		op->take = runs;
		op->n_take = hi - lo;
	} else {
		op->put = runs;
		op->n_put = hi - lo;
	}
	if (efs_meta_key_ag(&st->ns, grp, EFS_META_K_AG_MAP, &op->key) < 0)
		st->err = -EINVAL;
	op->kidx = mk;
	if (ck != NONE) {
		op->kidx2 = ck;
		if (efs_meta_key_ag(&st->ns, grp, EFS_META_K_AG_FREE, &op->key2) < 0)
			st->err = -EINVAL;
	}
}

/* Findings of one class, one per group. */
static void report_hits(state_t *st, const struct geo *g, enum sp_class c,
			const struct sp_hits *h, const size_t *mapk, const size_t *cntk)
{
	struct efs_check_finding *f;
	char text[2048], blind[300] = "";

	if (st->blind != NONE) {
		const struct key_ent *b = &st->keys[st->blind];

		if (b->family == EFS_META_K_EXTENT)
			snprintf(blind, sizeof(blind),
				 "; not freed because extent chunk %" PRIu64 " of inode %" PRIu64
				 " cannot be decoded, so the blocks it uses are unknown",
				 b->b, b->ino);
		else
			snprintf(blind, sizeof(blind),
				 "; not freed because a free intent of node %s in group %" PRIu32
				 " cannot be decoded, so the blocks it frees are unknown",
				 b->node, b->group);
	}
	for (size_t lo = 0, hi; lo < h->n && !st->err; lo = hi) {
		uint32_t grp = h->v[lo].group;
		uint64_t n = 0;
		struct key_ent *m = &st->keys[mapk[grp]];
		struct key_ent *cn = cntk[grp] != NONE ? &st->keys[cntk[grp]] : NULL;

		for (hi = lo; hi < h->n && h->v[hi].group == grp; hi++)
			n += h->v[hi].end - h->v[hi].start;
		hits_text(st, h->v, lo, hi, text, sizeof(text));
		switch (c) {
		case SPC_TAKE:
			f = finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				    "allocation group %" PRIu32 ": %" PRIu64 " block%s free in the "
				    "group's map but used by a file (a new file could be given "
				    "%s): %s",
				    grp, n, n == 1 ? " is" : "s are", n == 1 ? "it" : "them", text);
			m->a -= n;
			if (cn)
				cn->a = m->a;
			if (cn)
				set_repair(st, f,
					   "take %s out of the group's free map (the file keeps "
					   "%s) and set its free count to %" PRIu64,
					   n == 1 ? "it" : "them", n == 1 ? "it" : "them", m->a);
			else
				set_repair(st, f,
					   "take %s out of the group's free map (the file keeps "
					   "%s)",
					   n == 1 ? "it" : "them", n == 1 ? "it" : "them");
			op_map_patch(st, f, g, grp, mapk[grp], cntk[grp], true, h->v, lo, hi);
			break;
		case SPC_LEAK:
			f = finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				    "allocation group %" PRIu32 ": %" PRIu64 " block%s neither "
				    "free in the group's map, nor in a free intent, nor used by "
				    "any file (leaked): %s%s",
				    grp, n, n == 1 ? " is" : "s are", text, blind);
			if (blind[0])
				break;
			m->a += n;
			if (cn)
				cn->a = m->a;
			if (cn)
				set_repair(st, f,
					   "put %s back into the group's free map and set its "
					   "free count to %" PRIu64,
					   n == 1 ? "it" : "them", m->a);
			else
				set_repair(st, f, "put %s back into the group's free map",
					   n == 1 ? "it" : "them");
			op_map_patch(st, f, g, grp, mapk[grp], cntk[grp], false, h->v, lo, hi);
			break;
		case SPC_TRIMMED:
			f = finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_NOTE,
				    "allocation group %" PRIu32 ": %" PRIu64 " block%s used only "
				    "beyond a file's size, so no longer used once the extents are "
				    "cut: %s%s",
				    grp, n, n == 1 ? " is" : "s are", text, blind);
			if (blind[0])
				break;
			m->a += n;
			if (cn)
				cn->a = m->a;
			set_repair(st, f, "put %s back into the group's free map%s",
				   n == 1 ? "it" : "them", cn ? " and fix its free count" : "");
			op_map_patch(st, f, g, grp, mapk[grp], cntk[grp], false, h->v, lo, hi);
			break;
		case SPC_INT_FREE:
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"allocation group %" PRIu32 ": %" PRIu64
				" block%s in a free intent but already free in the group's map (a "
				"double free pending): %s",
				grp, n, n == 1 ? " is" : "s are", text);
			break;
		case SPC_INT_EXT:
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"allocation group %" PRIu32 ": %" PRIu64
				" block%s in a free intent but still used by a file (folding the "
				"intent would free them under it): %s",
				grp, n, n == 1 ? " is" : "s are", text);
			break;
		default:
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"allocation group %" PRIu32 ": %" PRIu64
				" block%s in more than one free intent (a double free pending): %s",
				grp, n, n == 1 ? " is" : "s are", text);
			break;
		}
	}
}

/*
 * Invariant 1: every block of the data area is exactly one of free in its
 * group's map, in a pending free intent, or used by one extent (of any
 * inode: with a reclaim record, or missing). One sweep over the sorted
 * starts and ends of every run: O(n log n) in the number of runs, whatever
 * the device's size. Groups whose map is missing, undecodable or of the
 * wrong size are left out (stage_space reports them).
 */
static void stage_blocks(state_t *st, const struct geo *g)
{
	struct sweep w = {.st = st, .g = g};
	struct sp_ev *ev = NULL;
	size_t n_ev = 0, cap_ev = 0;
	size_t *mapk = NULL, *cntk = NULL;
	bool *usable = NULL, any = false;
	uint64_t prev;
	char it[300];

	mapk = efs_mem_malloc(((size_t)g->agc + 1) * sizeof(*mapk));
	cntk = efs_mem_malloc(((size_t)g->agc + 1) * sizeof(*cntk));
	usable = efs_mem_calloc((size_t)g->agc + 1, sizeof(*usable));
	if (!mapk || !cntk || !usable) {
		st->err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < g->agc; i++)
		mapk[i] = cntk[i] = NONE;
	for (size_t i = 0; i < st->n_keys; i++) {
		const struct key_ent *k = &st->keys[i];

		if (k->group >= g->agc)
			continue;
		if (k->family == EFS_META_K_AG_MAP)
			mapk[k->group] = i;
		else if (k->family == EFS_META_K_AG_FREE && !k->bad)
			cntk[k->group] = i;
	}
	for (uint32_t i = 0; i < g->agc; i++) {
		usable[i] = mapk[i] != NONE && !st->keys[mapk[i]].bad &&
			    st->keys[mapk[i]].b == group_size(g, i);
		any |= usable[i];
	}
	if (!any)
		goto out;
	w.usable = usable;
	for (size_t i = 0; i < st->n_runs && !st->err; i++) {
		const struct sp_run *r = &st->runs[i];
		uint64_t gs, s, e;

		if (r->group >= g->agc || (!r->intent && !usable[r->group]))
			continue;
		gs = group_size(g, r->group);
		s = r->start;
		e = r->start > UINT64_MAX - r->len ? UINT64_MAX : r->start + r->len;
		if (r->intent && e > gs) {
			intent_desc(st, r->key, it, sizeof(it));
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"%s in allocation group %" PRIu32 " frees group blocks %" PRIu64
				"-%" PRIu64 ", beyond the group's %" PRIu64 " blocks",
				it, r->group, s, r->len ? e - 1 : s, gs);
			e = gs;
		}
		if (s >= e)
			continue;
		s += group_start(g, r->group);
		e += group_start(g, r->group);
		if (add_ev(&ev, &n_ev, &cap_ev, r->intent ? SPT_INTENT : SPT_FREE, i, s, e) < 0)
			st->err = -ENOMEM;
	}
	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[i];
		uint64_t s = x->dev < g->ds ? g->ds : x->dev, e = ext_end(x);

		if (e > g->de)
			e = g->de;
		if (add_ev(&ev, &n_ev, &cap_ev, SPT_EXT, i, s, e) < 0)
			st->err = -ENOMEM;
		if (!x->cut || st->err)
			continue;
		/* The part invariant 5's repair cuts off: used by nothing after it. */
		s = ext_end(x) < g->ds ? g->ds : ext_end(x);
		e = x->dev > UINT64_MAX - x->count ? UINT64_MAX : x->dev + x->count;
		if (e > g->de)
			e = g->de;
		if (add_ev(&ev, &n_ev, &cap_ev, SPT_TRIM, i, s, e) < 0)
			st->err = -ENOMEM;
	}
	if (st->err)
		goto out;
	qsort(ev, n_ev, sizeof(*ev), cmp_ev);
	prev = g->ds;
	for (size_t i = 0; i < n_ev && !st->err; i++) {
		const struct sp_ev *e = &ev[i];

		if (e->pos > prev) {
			classify(&w, prev, e->pos);
			prev = e->pos;
		}
		if (e->delta < 0) {
			w.cnt[e->type]--;
			continue;
		}
		w.cnt[e->type]++;
		if (w.cnt[e->type] == 1 || e->end > w.best_end[e->type]) {
			w.best[e->type] = e->idx;
			w.best_end[e->type] = e->end;
		}
	}
	if (!st->err && prev < g->de)
		classify(&w, prev, g->de);
	for (int c = 0; c < SPC_N && !st->err; c++)
		report_hits(st, g, (enum sp_class)c, &w.hits[c], mapk, cntk);
out:
	for (int c = 0; c < SPC_N; c++)
		efs_mem_free(w.hits[c].v);
	efs_mem_free(ev);
	efs_mem_free(mapk);
	efs_mem_free(cntk);
	efs_mem_free(usable);
}

static void stage_space_blocks(state_t *st)
{
	struct geo g;

	if (!geo_of(st, &g))
		return;
	stage_chunks(st);
	stage_overlaps(st, &g);
	if (!st->err)
		stage_blocks(st, &g);
}

static void stage_counter(state_t *st)
{
	struct efs_check_finding *f;
	struct efs_check_op *op;
	uint64_t max = 0;

	for (size_t i = 0; i < st->n_inos; i++)
		if (st->inos[i].ino > max)
			max = st->inos[i].ino;
	if (st->max_ino > max)
		max = st->max_ino;
	if (max < 2)
		max = 2;
	if (st->counter_present && !st->counter_bad && st->hyp_counter > max)
		return;
	if (!st->counter_present)
		f = finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
			    "the inode counter (ino) is missing");
	else if (st->counter_bad)
		f = finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
			    "the inode counter (ino) cannot be decoded");
	else
		f = finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
			    "the inode counter says %" PRIu64
			    " is the next free inode number, but inode %" PRIu64
			    " exists: new files would reuse numbers",
			    st->hyp_counter, max);
	set_repair(st, f, "set it to %" PRIu64, max + 1);
	op = add_op(st, f, OP_COUNTER);
	if (op) {
		if (efs_meta_key_ino_counter(&st->ns, &op->key) < 0)
			st->err = -EINVAL;
		op->counter = max + 1;
	}
	st->hyp_counter = max + 1;
}

static void stage_sb(state_t *st)
{
	struct efs_check_finding *f;
	Etcfs__RenameSeq rs = ETCFS__RENAME_SEQ__INIT;
	struct efs_meta_key key;
	uint64_t live = 0;

	if (!st->fi) {
		finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
			"the filesystem record (sb) is missing or unreadable; fsck cannot rebuild "
			"it (run mkfs.etcfs again, or restore it from a backup)");
	} else if (strcmp(st->fi->name, st->ns.name) != 0) {
		finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
			"the filesystem record (sb) names filesystem \"%s\", but it lives under "
			"/etcfs/%s/",
			st->fi->name, st->ns.name);
	}
	if (!st->renameseq_present) {
		f = finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
			    "the rename guard (renameseq) is missing: directory renames across "
			    "directories fail");
		set_repair(st, f, "create it");
		if (efs_meta_key_renameseq(&st->ns, &key) == 0)
			op_put(st, f, &key, &rs.base, 0);
	}
	for (size_t i = 0; i < st->n_inos; i++)
		if (!st->inos[i].removed)
			live++;
	if (st->fi && live > st->fi->inode_limit)
		finding(st, EFS_CHECK_INV_SB, EFS_CHECK_WARNING,
			"%" PRIu64 " inodes exist, more than the inode limit %" PRIu64
			" (creates fail with ENOSPC until some are removed or the limit is raised)",
			live, st->fi->inode_limit);
}

/* Allocation groups: every group has a well-formed map and a free count
 * equal to the map's sum; no group beyond the geometry. */
static void stage_space(state_t *st)
{
	const Etcfs__FsInfo *fi = st->fi;
	size_t *map, *fre;
	uint64_t data, want;
	struct efs_check_finding *f;

	if (!fi)
		return;
	map = efs_mem_malloc((size_t)fi->ag_count * sizeof(*map) + 1);
	fre = efs_mem_malloc((size_t)fi->ag_count * sizeof(*fre) + 1);
	if (!map || !fre) {
		efs_mem_free(map);
		efs_mem_free(fre);
		st->err = -ENOMEM;
		return;
	}
	for (uint32_t g = 0; g < fi->ag_count; g++)
		map[g] = fre[g] = NONE;
	for (size_t i = 0; i < st->n_keys; i++) {
		struct key_ent *k = &st->keys[i];

		if (k->family != EFS_META_K_AG_MAP && k->family != EFS_META_K_AG_FREE)
			continue;
		if (k->group >= fi->ag_count) {
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"allocation group %" PRIu32 " has a %s, but the filesystem "
				"has only %" PRIu32 " groups",
				k->group,
				k->family == EFS_META_K_AG_MAP ? "free map" : "free count",
				fi->ag_count);
			continue;
		}
		if (k->family == EFS_META_K_AG_MAP)
			map[k->group] = i;
		else
			fre[k->group] = i;
	}
	data = fi->device_size / fi->block_size - fi->data_start;
	for (uint32_t g = 0; g < fi->ag_count && !st->err; g++) {
		struct key_ent *m = map[g] == NONE ? NULL : &st->keys[map[g]];
		struct key_ent *c = fre[g] == NONE ? NULL : &st->keys[fre[g]];
		Etcfs__AgFree af = ETCFS__AG_FREE__INIT;
		struct efs_meta_key key;

		want = g + 1 < fi->ag_count ? fi->ag_blocks : data - (uint64_t)g * fi->ag_blocks;
		if (!m) {
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"allocation group %" PRIu32 " has no free map (space repair comes "
				"with the data path)",
				g);
			continue;
		}
		if (m->bad)
			continue; /* reported when read */
		if (m->b != want)
			finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				"allocation group %" PRIu32
				"'s free map says the group has %" PRIu64
				" blocks, but the geometry gives %" PRIu64,
				g, m->b, want);
		if (c && !c->bad && c->a == m->a)
			continue;
		af.free_blocks = m->a;
		if (efs_meta_key_ag(&st->ns, g, EFS_META_K_AG_FREE, &key) < 0) {
			st->err = -EINVAL;
			break;
		}
		if (!c)
			f = finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				    "allocation group %" PRIu32 " has no free count", g);
		else if (c->bad)
			f = finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				    "allocation group %" PRIu32 "'s free count cannot be decoded",
				    g);
		else
			f = finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				    "allocation group %" PRIu32 "'s free count is %" PRIu64
				    ", but its free map holds %" PRIu64 " free blocks",
				    g, c->a, m->a);
		set_repair(st, f, "set it to %" PRIu64, m->a);
		op_put(st, f, &key, &af.base, c ? c->mod : 0);
	}
	efs_mem_free(map);
	efs_mem_free(fre);
}

/* ---- Running ---- */

static void state_free(state_t *st)
{
	if (!st)
		return;
	efs_mem_free(st->inos);
	for (size_t i = 0; i < st->n_des; i++)
		efs_mem_free(st->des[i].name);
	efs_mem_free(st->des);
	for (size_t i = 0; i < st->n_keys; i++)
		efs_mem_free(st->keys[i].key);
	efs_mem_free(st->keys);
	efs_mem_free(st->by_ino);
	efs_mem_free(st->runs);
	efs_mem_free(st->exts);
	efs_meta_record_free(st->fi);
	efs_mem_free(st->leases);
	efs_mem_free(st->lease_live);
	efs_mem_free(st);
}

struct efs_check_report *efs_check_report_free(struct efs_check_report *rep)
{
	if (!rep)
		return NULL;
	for (size_t i = 0; i < rep->n_findings; i++) {
		struct efs_check_finding *f = &rep->findings[i];

		efs_mem_free(f->message);
		efs_mem_free(f->repair);
		efs_mem_free(f->repair_message);
		for (size_t j = 0; j < f->n_ops; j++) {
			efs_mem_free(f->ops[j].value);
			efs_mem_free(f->ops[j].take);
			efs_mem_free(f->ops[j].put);
			efs_mem_free(f->ops[j].deps);
		}
		efs_mem_free(f->ops);
	}
	efs_mem_free(rep->findings);
	for (size_t i = 0; i < rep->n_mounted; i++)
		efs_mem_free(rep->mounted[i]);
	efs_mem_free(rep->mounted);
	state_free(rep->priv);
	efs_mem_free(rep);
	return NULL;
}

int efs_check_run(struct efs_etcd_sync *s, const struct efs_meta_ns *ns,
		  const struct efs_check_opts *o, struct efs_check_report **ret, char *err,
		  size_t err_size)
{
	struct efs_check_report *rep;
	state_t *st;
	int r;

	snprintf(err, err_size, "out of memory");
	rep = efs_mem_calloc(1, sizeof(*rep));
	if (!rep)
		return -ENOMEM;
	st = efs_mem_calloc(1, sizeof(*st));
	if (!st) {
		efs_mem_free(rep);
		return -ENOMEM;
	}
	rep->priv = st;
	st->rep = rep;
	st->blind = NONE;
	st->ns = *ns;
	r = load(s, st, o, err, err_size);
	if (r < 0)
		goto out_free;
	rep->revision = st->rev;
	st->n_des_loaded = st->n_des;
	r = index_keys(st);
	if (r < 0)
		goto out_free;
	r = query_leases(s, st, err, err_size);
	if (r < 0)
		goto out_free;
	stage_sb(st);
	stage_leases(st);
	mark_inode_keys(st);
	st->namespace_ok = stage_root(st);
	if (st->namespace_ok) {
		stage_dirents(st);
		stage_names(st);
		stage_lost_found(st);
		stage_tree(st);
		stage_unnamed(st);
		stage_nlink(st);
	}
	stage_orphans(st);
	stage_strays(st);
	stage_holders(st);
	stage_extents(st);
	stage_space_blocks(st);
	stage_counter(st);
	stage_space(st);
	r = st->err;
	if (r < 0) {
		snprintf(err, err_size, "checking the keyspace: %s", strerror(-r));
		goto out_free;
	}
	for (size_t i = 0; i < st->n_inos; i++)
		rep->inodes += !st->inos[i].removed;
	for (size_t i = 0; i < st->n_des; i++)
		rep->dirents += !st->des[i].removed;
	err[0] = '\0';
	*ret = rep;
	return 0;
out_free:
	efs_check_report_free(rep);
	return r;
}

/* ---- Repairing ---- */

__attribute__((format(printf, 3, 4))) static void
repair_failed(struct efs_check_finding *f, int err, const char *fmt, ...)
{
	va_list ap;

	f->state = EFS_CHECK_REPAIR_FAILED;
	f->repair_err = err;
	efs_mem_free(f->repair_message);
	va_start(ap, fmt);
	f->repair_message = vfmt(fmt, ap);
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
			struct ino_ent *e = find_ino(st, op->ino);

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
	Etcfs__Run *rv = NULL, **rp = NULL;
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
	if (r == 0) {
		rv = efs_mem_calloc(runs.n + 1, sizeof(*rv));
		rp = efs_mem_calloc(runs.n + 1, sizeof(*rp));
		if (!rv || !rp)
			r = -ENOMEM;
	}
	if (r == 0) {
		for (size_t i = 0; i < runs.n; i++) {
			etcfs__run__init(&rv[i]);
			rv[i].start = runs.v[i].start;
			rv[i].len = runs.v[i].len;
			rp[i] = &rv[i];
		}
		nm.free = rp;
		nm.n_free = runs.n;
		nm.group_blocks = m->group_blocks;
		*count = efs_runs_total(&runs);
		r = efs_meta_pack(&nm.base, ret);
	}
	efs_mem_free(rv);
	efs_mem_free(rp);
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

static int64_t op_expected_mod(state_t *st, const struct efs_check_op *op)
{
	struct ino_ent *e;

	switch (op->kind) {
	case OP_INODE_PATCH:
	case OP_REQUIRE_INODE:
		e = find_ino(st, op->ino);
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
			if (r == 0)
				r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, op->key.buf,
						     op->key.len, v.data, v.len, 0);
			efs_mem_free(v.data);
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
			if (r == 0)
				r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, op->key.buf,
						     op->key.len, v.data, v.len, 0);
			efs_mem_free(v.data);
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
			else if (r == 0)
				r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, op->key.buf,
						     op->key.len, v.data, v.len, 0);
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
			if (r == 0)
				r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, op->key.buf,
						     op->key.len, v.data, v.len, 0);
			efs_mem_free(v.data);
			v.data = NULL;
			if (r == 0 && op->kidx2 != NONE) {
				Etcfs__AgFree af = ETCFS__AG_FREE__INIT;

				r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
							 op->key2.buf, op->key2.len,
							 st->keys[op->kidx2].mod);
				af.free_blocks = count;
				if (r == 0)
					r = efs_meta_pack(&af.base, &v);
				if (r == 0)
					r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, op->key2.buf,
							     op->key2.len, v.data, v.len, 0);
				efs_mem_free(v.data);
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
			e = find_ino(st, op->ino);
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

const char *efs_check_inv_name(enum efs_check_inv inv)
{
	switch (inv) {
	case EFS_CHECK_INV_RECORD:
		return "record";
	case EFS_CHECK_INV_SB:
		return "sb";
	case EFS_CHECK_INV_ROOT:
		return "root";
	case EFS_CHECK_INV_LINKS:
		return "links";
	case EFS_CHECK_INV_TREE:
		return "tree";
	case EFS_CHECK_INV_EXTENTS:
		return "extents";
	case EFS_CHECK_INV_LOCKS:
		return "locks";
	case EFS_CHECK_INV_SPACE:
		return "space";
	case EFS_CHECK_INV_STRAY:
		return "stray";
	}
	return "?";
}
