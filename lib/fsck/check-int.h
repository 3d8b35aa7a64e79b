/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * What the parts of the checker (the files of lib/fsck) share: the state
 * built from the keyspace, the planned repair operations, and the helpers
 * and passes that more than one part calls. Private to lib/fsck.
 */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsck/check.h"
#include "meta/keys.h"
#include "space/runs.h"
#include "etcfs.pb-c.h"

#define NONE SIZE_MAX
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

/* state.c: the state read, lookups and descriptions. */

/* |arr|, holding |n| elements of |size| bytes in a capacity of *|cap|, with
 * room for one more (efs_mem_reserve()'s growth): itself or its new address.
 * NULL on -ENOMEM, |arr| and *|cap| untouched. */
void *efs_check__grow(void *arr, size_t *cap, size_t n, size_t size);
/* A zeroed element |n| (the caller counts it) of the array that |arrp|
 * points to, grown like efs_mem_reserve() does. NULL with st->err = -ENOMEM. */
void *efs_check__slot(state_t *st, void *arrp, size_t *cap, size_t n, size_t size);
__attribute__((format(printf, 1, 0))) char *efs_check__vfmt(const char *fmt, va_list ap);
void efs_check__key_text(const state_t *st, const uint8_t *key, size_t len, char *buf, size_t size);
struct ino_ent *efs_check__find_ino(state_t *st, uint64_t ino);
struct ino_ent *efs_check__live_ino(state_t *st, uint64_t ino);
bool efs_check__is_dir(const struct ino_ent *e);
const char *efs_check__type_word(uint32_t mode);
const char *efs_check__dt_word(uint32_t dt);
void efs_check__ino_desc(state_t *st, uint64_t ino, char *buf, size_t size);
void efs_check__de_desc(state_t *st, const struct de_ent *d, char *buf, size_t size);
size_t efs_check__add_de(state_t *st, uint64_t parent, const char *name, size_t len, uint64_t ino,
			 uint32_t type, int64_t mod);
int64_t efs_check__now_ns(void);
void efs_check__keys_of(const state_t *st, uint64_t ino, size_t *lo, size_t *hi);
int efs_check__index_keys(state_t *st);
bool efs_check__has_reclaim(const state_t *st, uint64_t ino);

/* findings.c: findings and the operations of their repairs. */

__attribute__((format(printf, 4, 5))) struct efs_check_finding *
efs_check__finding(state_t *st, enum efs_check_inv inv, enum efs_check_severity sev,
		   const char *fmt, ...);
__attribute__((format(printf, 3, 4))) void
efs_check__set_repair(state_t *st, struct efs_check_finding *f, const char *fmt, ...);
struct efs_check_op *efs_check__add_op(state_t *st, struct efs_check_finding *f, enum op_kind kind);
void efs_check__op_del(state_t *st, struct efs_check_finding *f, const uint8_t *key, size_t len,
		       int64_t mod);
void efs_check__op_del_inode(state_t *st, struct efs_check_finding *f, uint64_t ino, int64_t mod);
void efs_check__op_del_dirent(state_t *st, struct efs_check_finding *f, size_t di);
struct efs_check_op *efs_check__op_put(state_t *st, struct efs_check_finding *f,
				       const struct efs_meta_key *key, const ProtobufCMessage *msg,
				       int64_t mod);
void efs_check__op_patch(state_t *st, struct efs_check_finding *f, struct ino_ent *e,
			 bool set_nlink, uint32_t nlink, bool set_parent, uint64_t parent);
void efs_check__op_require(state_t *st, struct efs_check_finding *f, uint64_t ino);
/* Adds to |f| the op that sets the inode counter to |next|, and makes |next|
 * the counter the later stages see (st->hyp_counter). */
void efs_check__op_counter(state_t *st, struct efs_check_finding *f, uint64_t next);

/* load.c: reading the keyspace. */

struct Mvccpb__KeyValue;

/*
 * One key family as the checker reads it: a row of the table in load.c.
 * |load| reads a key of the family (|ki| is the key parsed, |fam| this row)
 * into |st|: it returns 0 or -ENOMEM, or leaves -ENOMEM in st->err, and
 * reports a value that does not decode as a finding. |decode|, for the
 * handlers several families share, decodes and checks a value as the
 * efs_meta_*_decode of meta/records.h do (NULL: |load| calls its own).
 */
struct efs_check__family {
	enum efs_meta_family family;
	const char *name; /* for messages: "inode record", ... */
	int (*load)(state_t *st, const struct efs_check__family *fam,
		    const struct Mvccpb__KeyValue *kv, const struct efs_meta_key_info *ki);
	int (*decode)(const uint8_t *buf, size_t len, void **ret, const char **reason);
};

/* The row of family |f|; NULL for a value that is not a family. */
const struct efs_check__family *efs_check__family_of(enum efs_meta_family f);

/*
 * Parses one key/value pair of the keyspace and loads it into |st| through
 * its family's row. A key that does not parse, or a value that does not
 * decode, is a finding. Returns 0 or -ENOMEM (check st->err too).
 */
int efs_check__load_kv(state_t *st, const struct Mvccpb__KeyValue *kv);

int efs_check__load(struct efs_etcd_sync *s, state_t *st, const struct efs_check_opts *o, char *err,
		    size_t err_size);

/* leases.c: keys riding session leases, and lock holders. */

int efs_check__query_leases(struct efs_etcd_sync *s, state_t *st, char *err, size_t err_size);
void efs_check__stage_leases(state_t *st);
void efs_check__stage_holders(state_t *st);

/* namespace.c: names, links, the tree, orphans and stray per-inode keys. */

void efs_check__mark_inode_keys(state_t *st);
bool efs_check__stage_root(state_t *st);
void efs_check__stage_dirents(state_t *st);
void efs_check__stage_names(state_t *st);
void efs_check__stage_lost_found(state_t *st);
void efs_check__stage_tree(state_t *st);
void efs_check__stage_unnamed(state_t *st);
void efs_check__stage_nlink(state_t *st);
void efs_check__stage_orphans(state_t *st);
void efs_check__stage_strays(state_t *st);

/* space.c: extents, blocks and allocation groups. */

void efs_check__stage_extents(state_t *st);
void efs_check__stage_space_blocks(state_t *st);
void efs_check__stage_space(state_t *st);

/* sb.c: filesystem-wide records. */

void efs_check__stage_counter(state_t *st);
void efs_check__stage_sb(state_t *st);
