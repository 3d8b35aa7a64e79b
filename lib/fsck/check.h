/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The filesystem checker behind fsck.etcfs (the keys and records it reads
 * are those of docs/FORMAT.md), as a library: it reads the whole keyspace of
 * one filesystem at one revision (paged ranges through the blocking client),
 * builds in-memory indexes, runs the checks and produces findings, each with
 * a plain-words message and, when a safe repair exists, what --repair does.
 * efs_check_repair() then applies those repairs, one transaction per
 * finding, each comparing the mod_revision of every key it reads or writes
 * (and that no node key was created or changed since the check), so a
 * concurrent change or a node mounting meanwhile aborts that repair instead
 * of overwriting it.
 *
 * The analysis works on the state the repairs would produce: a dangling
 * entry that --repair deletes no longer counts toward a link count, an inode
 * linked into lost+found counts as named, and so on, so that one repair pass
 * normally leaves a clean filesystem. Callers still check again after
 * repairing (fsck.etcfs does, up to a few passes).
 *
 * What is checked, and what --repair does (nothing where none is listed):
 *  - every key parses (efs_meta_key_parse) and every value decodes with its
 *    validating decoder: an unknown key, an undecodable dirent or inode
 *    record, or an undecodable key riding a session lease is deleted; an
 *    undecodable counter, renameseq, orphan or reclaim record is rewritten;
 *    a directory inode refused only for one link or no parent is kept and
 *    its link count and parent are fixed below. sb, g/, e/, ag/ maps and
 *    free intents that do not decode are reported only;
 *  - sb present and naming this filesystem (report only); renameseq present
 *    (created); the number of inodes within the inode limit (warning);
 *  - root inode 1 exists and is a directory (else the namespace checks are
 *    skipped), its parent is 1 (fixed); /lost+found exists (inode 2 relinked
 *    when unnamed, else a new directory from the inode counter);
 *  - invariant 3: an entry in a missing or non-directory parent, naming a
 *    missing inode or the root is deleted; an entry's type follows the
 *    inode's mode; link counts are set to the names (files) or 2 plus the
 *    subdirectories (directories); an unnamed inode with links is linked
 *    into lost+found as "#<ino>"; one with link count 0 and no orphan or
 *    reclaim record becomes an orphan when open somewhere, gets a reclaim
 *    record when it has extents, and is deleted (with its xattrs and lock
 *    keys) otherwise; an orphan record of a linked or missing inode is
 *    deleted (a reclaim record of a linked inode is reported only);
 *  - invariant 4: a directory has one name (others deleted), its parent
 *    pointer names the directory holding that name (fixed), and it is
 *    reachable from the root: a cycle is broken at its smallest inode,
 *    which moves to lost+found;
 *  - invariant 5: extents within the size rounded up to a block, except
 *    preallocated ones: the chunk is cut at the size (read-modify-write
 *    comparing the chunk's and the inode's mod_revisions; an emptied chunk
 *    is deleted), and the blocks cut off that nothing else uses go back to
 *    their maps in a later transaction (a note per group, which is not
 *    tried unless the cut committed); within one file, every extent of
 *    chunk C lies in file blocks [C, next chunk), so chunks never overlap
 *    (report only);
 *  - invariant 2: every extent lies inside the data area, and no two
 *    extents (of any inodes, or of one) share a device block (report only:
 *    fsck cannot tell which file owns the block);
 *  - invariant 1: every block of the data area is exactly one of: free in
 *    its group's map, in a pending free intent, or used by one extent.
 *    Extents of every inode count: those with a reclaim record, and the
 *    stray chunks of missing inodes. A block free in the map and used by an
 *    extent is taken out of the map (the file keeps it); a leaked block
 *    (none of the three) is put back into the map; both also set the
 *    group's free count to the patched map's sum, and are one
 *    read-modify-write of the map per group and kind, comparing the map's
 *    and the count's mod_revisions. Leaked blocks are not freed while any
 *    extent chunk or free intent does not decode (the blocks it names are
 *    unknown). A free intent of blocks that are free already, used by an
 *    extent, or in another intent (a double free pending) is reported
 *    only. These are errors whether or not nodes are mounted: a node
 *    changes a map in the same transaction that publishes the extents or
 *    writes the free intents, and blocks it allocated but has not
 *    published stay free in the map, so no committed revision shows a
 *    leaked, doubly used or free-and-used block. Groups whose map is
 *    missing, undecodable or of the wrong size are left out. The check
 *    sorts the runs of the maps, intents and extents and sweeps them once:
 *    O(n log n) in the number of runs, whatever the device's size;
 *  - invariant 6: holder, recall, open, byte-range lock, node and group
 *    owner keys ride a live lease (LeaseTimeToLive per distinct lease),
 *    else they are deleted; an exclusive holder together with any other
 *    live holder is reported only;
 *  - xattrs of a missing inode are deleted (extent chunks reported, lock
 *    keys on live leases warned about); the inode counter is above every
 *    inode number (raised);
 *  - every allocation group 0..ag_count-1 has a well-formed map of the
 *    geometry's size and a free count equal to the map's sum (the count is
 *    rewritten; the rest is reported).
 * A node is mounted while its n/ key rides a live lease; n/ keys without
 * one are stale and deleted like the other lease-bound keys.
 *
 * Blocking; not thread-safe; runs on the calling thread with the sync
 * client's private loop.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd/sync.h"
#include "meta/keys.h"

/* Which rule a finding is about. */
enum efs_check_inv {
	EFS_CHECK_INV_RECORD = 0, /* a key that does not parse or a value that does not decode */
	EFS_CHECK_INV_SB,	  /* the sb record, the inode counter, renameseq, the inode limit */
	EFS_CHECK_INV_ROOT,	  /* root inode 1 and lost+found */
	EFS_CHECK_INV_LINKS,	  /* invariant 3: names, link counts, orphans */
	EFS_CHECK_INV_TREE,	  /* invariant 4: directories form a tree rooted at 1 */
	EFS_CHECK_INV_EXTENTS,	  /* invariant 5: extents within the size */
	EFS_CHECK_INV_LOCKS,	  /* invariant 6 and every other lease-bound key */
	EFS_CHECK_INV_SPACE,	  /* allocation group maps and free counts */
	EFS_CHECK_INV_STRAY,	  /* keys of an inode that does not exist */
};

enum efs_check_severity {
	EFS_CHECK_NOTE = 0, /* informative, not an error */
	EFS_CHECK_WARNING,  /* suspicious but allowed (e.g. while mounted) */
	EFS_CHECK_ERROR,    /* breaks an invariant: counts for the exit code */
};

enum efs_check_state {
	EFS_CHECK_OPEN = 0,	/* not repaired (yet, or no repair exists) */
	EFS_CHECK_REPAIRED,	/* the repair transaction committed */
	EFS_CHECK_REPAIR_FAILED, /* the repair was tried and did not happen */
};

struct efs_check_op;

/* One finding. Strings are owned by the report. */
struct efs_check_finding {
	enum efs_check_inv inv;
	enum efs_check_severity severity;
	char *message; /* plain words, no trailing newline */
	char *repair;  /* what --repair does ("delete the entry"); NULL: no safe repair */
	enum efs_check_state state;
	/* After a failed repair: -errno and why in plain words. */
	int repair_err;
	char *repair_message;
	/* Private: the repair's operations. */
	struct efs_check_op *ops;
	size_t n_ops;
};

/* What one check found. */
struct efs_check_report {
	struct efs_check_finding *findings;
	size_t n_findings;
	int64_t revision; /* store revision the keyspace was read at */
	uint64_t keys;	  /* keys read */
	uint64_t inodes;  /* inode records, as the repairs leave them */
	uint64_t dirents; /* directory entries, likewise */
	size_t errors;	 /* findings of severity EFS_CHECK_ERROR */
	size_t warnings; /* findings of severity EFS_CHECK_WARNING */
	/* Nodes whose n/ key rides a live lease (mounted), NUL-terminated ids. */
	char **mounted;
	size_t n_mounted;
	/* Private state the repairs need. */
	struct efs_check_state_priv *priv;
};

/* Progress: |keys| read so far, called every |progress_every| keys. */
typedef void (*efs_check_progress_cb)(uint64_t keys, void *arg);

struct efs_check_opts {
	uint32_t page_size; /* keys per Range call (0: 10,000) */
	efs_check_progress_cb progress;
	uint64_t progress_every; /* 0: 10,000 */
	void *progress_arg;
};

/*
 * Reads filesystem |ns| through |s| and checks it. On success returns 0 and
 * a report in *|ret| (free with efs_check_report_free), whatever it found.
 * Errors (nothing is returned then, |err| says why): the etcd call's
 * -errno (the compacted errno when the pinned revision is compacted
 * between pages: check again), -EUCLEAN (a key longer than any etcfs key),
 * -ENOMEM. |o| may be NULL.
 */
int efs_check_run(struct efs_etcd_sync *s, const struct efs_meta_ns *ns,
		  const struct efs_check_opts *o, struct efs_check_report **ret, char *err,
		  size_t err_size);

/*
 * Applies the repair of every open finding that has one, in order, each in
 * its own transaction. Returns the number of findings repaired (>= 0); a
 * repair that does not happen (a compare failed because something changed
 * since the check or a node mounted, or an etcd error) marks its finding
 * EFS_CHECK_REPAIR_FAILED with a message and the others go on. A negative
 * return is an error that stops everything (-ENOMEM, or -EBUSY when the
 * report lists mounted nodes: nothing is written then). |s| must reach the
 * same etcd the report was read from.
 */
int efs_check_repair(struct efs_etcd_sync *s, struct efs_check_report *rep);

/* Frees a report. Accepts NULL; returns NULL. */
struct efs_check_report *efs_check_report_free(struct efs_check_report *rep);

/* A short name of |inv| ("links", "tree", ...) for output. */
const char *efs_check_inv_name(enum efs_check_inv inv);
