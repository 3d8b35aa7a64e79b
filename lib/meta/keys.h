/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The etcd key schema of one filesystem (docs/FORMAT.md), pure: no I/O. Every
 * key lives under "/etcfs/<fsname>/"; integers inside keys are fixed-width
 * big-endian so that range scans come back in numeric order; variable-length
 * parts (file and xattr names, node ids) come last or are followed by a '/'
 * that they cannot contain.
 *
 * Builders fill a caller-owned struct efs_meta_key and return 0, -EINVAL
 * (a malformed argument: inode 0, an invalid node id, a bad name or lock
 * mode) or -ENAMETOOLONG (a name over 255 bytes); the key is untouched on
 * failure. Parsers never trust their input and return -EINVAL for any key
 * that is not exactly one of the families below.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest filesystem name and node id ([A-Za-z0-9._-]). */
#define EFS_META_FSNAME_MAX 64
#define EFS_META_NODE_MAX   64
/* Longest file name in a directory (NAME_MAX) and xattr name (XATTR_NAME_MAX). */
#define EFS_META_NAME_MAX       255
#define EFS_META_XATTR_NAME_MAX 255
/* Room for the longest key of any family. */
#define EFS_META_KEY_MAX 512
/* Inode number of the root directory; 0 is never a valid inode. */
#define EFS_META_ROOT_INO 1

/* Key families (docs/FORMAT.md gives each one's key and rules). */
enum efs_meta_family {
	EFS_META_K_SB = 1,	/* sb */
	EFS_META_K_INODE,	/* i/<ino> */
	EFS_META_K_DIRENT,	/* d/<parent><name> */
	EFS_META_K_XATTR,	/* x/<ino><name> */
	EFS_META_K_EXTENT,	/* e/<ino><chunk> */
	EFS_META_K_HOLDER,	/* l/<ino><mode><node> */
	EFS_META_K_RECALL,	/* w/<ino><seq><node> */
	EFS_META_K_OPEN,	/* r/<ino><node> */
	EFS_META_K_PLOCK,	/* p/<ino><node>/<owner> */
	EFS_META_K_NODE,	/* n/<node> */
	EFS_META_K_GEN,		/* g/<node> */
	EFS_META_K_AG_OWNER,	/* ag/<group>/owner */
	EFS_META_K_AG_MAP,	/* ag/<group>/map */
	EFS_META_K_AG_FREE,	/* ag/<group>/free */
	EFS_META_K_FREE_INTENT, /* ag/<group>/fi/<node>/<session><seq> */
	EFS_META_K_ORPHAN,	/* o/<ino> */
	EFS_META_K_RECLAIM,	/* rc/<ino> */
	EFS_META_K_INO_COUNTER, /* ino */
	EFS_META_K_RENAMESEQ,	/* renameseq */
	/* Of the maintenance node (lib/maint/maint.h). */
	EFS_META_K_MAINT,	/* maint: the elected maintenance node */
	EFS_META_K_PIN,		/* pin/<name>: a revision compaction keeps (name in |node|) */
	/* Of the allocators (lib/alloc/alloc.h). */
	EFS_META_K_HANDOVER,	/* ho/<node>: a node short of space asks owners for groups */
	/* Of the publication request (etcfsctl backup and sync). */
	EFS_META_K_SYNC,	/* sync/<id>: publish what you buffer (id in |node|) */
	EFS_META_K_SYNC_ACK,	/* sync/<id>/<node>: |node| did (id in |name|) */
};

/* Lock modes, one byte inside holder keys ('S' sorts before 'X'). */
enum efs_meta_lock_mode {
	EFS_META_LOCK_SHARED = 'S',
	EFS_META_LOCK_EXCLUSIVE = 'X',
};

/* The key prefix of one filesystem, "/etcfs/<fsname>/". */
struct efs_meta_ns {
	char name[EFS_META_FSNAME_MAX + 1]; /* NUL-terminated fsname */
	uint8_t prefix[EFS_META_FSNAME_MAX + 8];
	size_t len; /* bytes of |prefix| */
};

/* A built key; |buf| is not NUL-terminated. */
struct efs_meta_key {
	size_t len;
	uint8_t buf[EFS_META_KEY_MAX];
};

/* A range request: keys >= |key| and < |end| (etcd's range_end). */
struct efs_meta_range {
	struct efs_meta_key key;
	struct efs_meta_key end;
};

/*
 * A parsed key. Which fields are meaningful depends on |family| (see each
 * family above): |ino| is the inode (the parent for dirents), |num| the
 * chunk, recall sequence, byte-range lock owner or free-intent sequence,
 * |session| the free intent's session. |name| points into the parsed key
 * (borrowed: valid as long as the key is); |node| is a copy.
 */
struct efs_meta_key_info {
	enum efs_meta_family family;
	uint64_t ino;
	uint64_t num;
	uint64_t session;
	uint32_t group;
	char mode; /* enum efs_meta_lock_mode */
	const uint8_t *name;
	size_t name_len;
	char node[EFS_META_NODE_MAX + 1];
};

/* ---- Validation ---- */

/* True for 1..EFS_META_FSNAME_MAX bytes of [A-Za-z0-9._-], not "." or "..". */
bool efs_meta_fsname_is_valid(const char *s);

/* True for 1..EFS_META_NODE_MAX bytes of [A-Za-z0-9._-], not "." or "..". */
bool efs_meta_node_is_valid(const char *s);

/*
 * Checks a directory entry name of |len| bytes (not NUL-terminated):
 * -ENAMETOOLONG beyond EFS_META_NAME_MAX; -EINVAL when empty, holding '/'
 * or NUL, or "." or ".." (never stored); else 0.
 */
int efs_meta_name_check(const void *name, size_t len);

/* Checks an xattr name: 1..EFS_META_XATTR_NAME_MAX bytes, no NUL ('/' is
 * allowed). -ERANGE beyond the maximum (as setxattr(2) reports), -EINVAL. */
int efs_meta_xattr_name_check(const void *name, size_t len);

/* ---- Namespace ---- */

/* Sets up the prefix of filesystem |fsname|. -EINVAL when the name is not
 * valid (efs_meta_fsname_is_valid), |ns| untouched then. */
int efs_meta_ns_init(struct efs_meta_ns *ns, const char *fsname);

/* ---- Key builders ---- */

int efs_meta_key_sb(const struct efs_meta_ns *ns, struct efs_meta_key *ret);
int efs_meta_key_ino_counter(const struct efs_meta_ns *ns, struct efs_meta_key *ret);
int efs_meta_key_renameseq(const struct efs_meta_ns *ns, struct efs_meta_key *ret);
int efs_meta_key_inode(const struct efs_meta_ns *ns, uint64_t ino, struct efs_meta_key *ret);
int efs_meta_key_orphan(const struct efs_meta_ns *ns, uint64_t ino, struct efs_meta_key *ret);
int efs_meta_key_reclaim(const struct efs_meta_ns *ns, uint64_t ino, struct efs_meta_key *ret);

/* d/<parent><name>: |name| is checked with efs_meta_name_check(). */
int efs_meta_key_dirent(const struct efs_meta_ns *ns, uint64_t parent, const void *name,
			size_t len, struct efs_meta_key *ret);

/* x/<ino><name>: |name| is checked with efs_meta_xattr_name_check(). */
int efs_meta_key_xattr(const struct efs_meta_ns *ns, uint64_t ino, const void *name, size_t len,
		       struct efs_meta_key *ret);

/* e/<ino><chunk>: |chunk| is the first logical block the chunk covers. */
int efs_meta_key_extent(const struct efs_meta_ns *ns, uint64_t ino, uint64_t chunk,
			struct efs_meta_key *ret);

/* l/<ino><mode><node>: |mode| is an enum efs_meta_lock_mode. */
int efs_meta_key_holder(const struct efs_meta_ns *ns, uint64_t ino, int mode, const char *node,
			struct efs_meta_key *ret);

/* w/<ino><seq><node>: recall keys of one inode sort in |seq| order. */
int efs_meta_key_recall(const struct efs_meta_ns *ns, uint64_t ino, uint64_t seq,
			const char *node, struct efs_meta_key *ret);

/* r/<ino><node>. */
int efs_meta_key_open(const struct efs_meta_ns *ns, uint64_t ino, const char *node,
		      struct efs_meta_key *ret);

/* p/<ino><node>/<owner>: the fcntl/flock locks of one lock owner. */
int efs_meta_key_plock(const struct efs_meta_ns *ns, uint64_t ino, const char *node,
		       uint64_t owner, struct efs_meta_key *ret);

/* n/<node> and g/<node>. */
int efs_meta_key_node(const struct efs_meta_ns *ns, const char *node, struct efs_meta_key *ret);
int efs_meta_key_gen(const struct efs_meta_ns *ns, const char *node, struct efs_meta_key *ret);

/* ag/<group>/owner, /map or /free: |family| is EFS_META_K_AG_OWNER, _MAP or
 * _FREE (else -EINVAL). */
int efs_meta_key_ag(const struct efs_meta_ns *ns, uint32_t group, enum efs_meta_family family,
		    struct efs_meta_key *ret);

/* ag/<group>/fi/<node>/<session><seq>. */
int efs_meta_key_free_intent(const struct efs_meta_ns *ns, uint32_t group, const char *node,
			     uint64_t session, uint64_t seq, struct efs_meta_key *ret);

/* maint: the maintenance election key (value: the holder's node id, on
 * its session lease; lib/maint/maint.h). */
int efs_meta_key_maint(const struct efs_meta_ns *ns, struct efs_meta_key *ret);

/* pin/<name>: a revision pin (value: the revision as decimal ASCII) that
 * the maintenance node does not compact past; |name| is checked like a
 * node id (efs_meta_node_is_valid); the parser returns it in |node|. */
int efs_meta_key_pin(const struct efs_meta_ns *ns, const char *name, struct efs_meta_key *ret);
/* The names of the pins etcfsctl backup puts start so; while one exists the
 * allocators hold the blocks they free (lib/alloc/alloc.h). */
#define EFS_META_PIN_BACKUP "backup."

/* ho/<node>: a hand-over request of node |node| (value: the blocks it
 * wants, decimal ASCII), on its session lease (lib/alloc/alloc.h). */
int efs_meta_key_handover(const struct efs_meta_ns *ns, const char *node,
			  struct efs_meta_key *ret);

/* sync/<id>: a request that every node publish what it buffers (value:
 * empty), on the requester's lease; |id| is checked like a node id. */
int efs_meta_key_sync(const struct efs_meta_ns *ns, const char *id, struct efs_meta_key *ret);

/* sync/<id>/<node>: node |node| published everything it had buffered when
 * it saw request |id| (value: "ok", or "error: ..." when the publication
 * failed), on its session lease. The parser returns |id| in |name|. */
int efs_meta_key_sync_ack(const struct efs_meta_ns *ns, const char *id, const char *node,
			  struct efs_meta_key *ret);

/* ---- Parser ---- */

/*
 * Parses a key of filesystem |ns| into |ret|. -EINVAL when the key is
 * outside the prefix, of no known family, truncated, carries trailing
 * bytes, inode 0, an invalid name or node id, or a bad lock mode.
 */
int efs_meta_key_parse(const struct efs_meta_ns *ns, const uint8_t *key, size_t len,
		       struct efs_meta_key_info *ret);

/* ---- Ranges ---- */

/* Every key of the filesystem. */
int efs_meta_range_fs(const struct efs_meta_ns *ns, struct efs_meta_range *ret);

/*
 * Every key of one family, for scans (fsck): the per-inode families, n/, g/,
 * o/, rc/ and, for any EFS_META_K_AG_* or EFS_META_K_FREE_INTENT, every
 * ag/ key, pin/. The single keys (sb, ino, renameseq, maint) give a range
 * of that key alone (|end| empty). -EINVAL for an unknown family.
 */
int efs_meta_range_family(const struct efs_meta_ns *ns, enum efs_meta_family family,
			  struct efs_meta_range *ret);

/*
 * The keys of one inode in a per-inode family: dirents of a directory
 * (readdir, in name order), xattrs (listxattr), extent chunks, holders,
 * recalls (arrival order), open references and byte-range locks.
 * -EINVAL for inode 0 or another family.
 */
int efs_meta_range_ino(const struct efs_meta_ns *ns, enum efs_meta_family family, uint64_t ino,
		       struct efs_meta_range *ret);

/* Holders of |ino| in one |mode| (e.g. "is there an exclusive holder"). */
int efs_meta_range_holders(const struct efs_meta_ns *ns, uint64_t ino, int mode,
			   struct efs_meta_range *ret);

/* Byte-range lock owners of |node| on |ino|. */
int efs_meta_range_plocks_of_node(const struct efs_meta_ns *ns, uint64_t ino, const char *node,
				  struct efs_meta_range *ret);

/*
 * Dirents of |parent| whose names sort strictly after |name| (a readdir
 * that resumes after the last name it returned). The name is checked.
 */
int efs_meta_range_dirents_after(const struct efs_meta_ns *ns, uint64_t parent, const void *name,
				 size_t len, struct efs_meta_range *ret);

/* Every hand-over request (ho/<node>). */
int efs_meta_range_handovers(const struct efs_meta_ns *ns, struct efs_meta_range *ret);

/* Every publication request and answer (sync/), and the answers to request
 * |id| alone (sync/<id>/). */
int efs_meta_range_syncs(const struct efs_meta_ns *ns, struct efs_meta_range *ret);
int efs_meta_range_sync_acks(const struct efs_meta_ns *ns, const char *id,
			     struct efs_meta_range *ret);

/* Every revision pin (pin/<name>). */
int efs_meta_range_pins(const struct efs_meta_ns *ns, struct efs_meta_range *ret);
/* Every backup pin (pin/backup.*). */
int efs_meta_range_backup_pins(const struct efs_meta_ns *ns, struct efs_meta_range *ret);

/* Every key of allocation group |group|, and its free intents alone. */
int efs_meta_range_group(const struct efs_meta_ns *ns, uint32_t group, struct efs_meta_range *ret);
int efs_meta_range_free_intents(const struct efs_meta_ns *ns, uint32_t group,
				struct efs_meta_range *ret);
