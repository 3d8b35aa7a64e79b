/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The node's block allocator, on the loop.
 *
 * Groups. The node allocates only from allocation groups it owns: an
 * ag/<g>/owner key (AgOwner) on the session lease, created with a compare
 * "absent" (create_revision 0) plus the session guard. At start it claims
 * |groups_initial| groups (spread: group = hash(node) + k * stride), loads
 * their map and free count, and folds their free intents; when its groups
 * cannot satisfy an allocation it claims another unowned group (async).
 * When none is left it asks the other owners: a hand-over request
 * ho/<node> on its lease, which owners watch and answer by releasing idle
 * groups (no unpublished allocation, no quarantined block; most free
 * first; one with free space kept while they have allocations pending;
 * nothing given by an owner short itself), deleting the request in the
 * same transaction. The asker claims them and retries; it answers ENOSPC
 * when no other node's group has free blocks, or when no answer came
 * within |handover_wait_ms| (docs/DESIGN.md, issue 12).
 *
 * In memory, per owned group: the committed map (as in etcd, with its
 * mod_revision) and the available set = committed free minus blocks
 * allocated but not yet published, minus quarantined blocks. Allocation
 * is synchronous from the available set (no etcd round trip) once a group
 * is owned.
 *
 * Map transactions. A transaction that changes maps (a publication, a
 * truncate, a reclaim batch) holds the node's map token for its whole
 * life: efs_alloc_txn_begin() waits for it, so at most one map-changing
 * transaction is in flight and it is built from the last committed maps
 * plus its own changes. Its contribution (efs_alloc_txn_build) puts
 * ag/<g>/map and ag/<g>/free for every owned group it changes, comparing
 * the map's mod_revision and that ag/<g>/owner's lease is ours; blocks
 * freed in a group the node does not own become a free intent
 * ag/<g>/fi/<node>/<session><seq> (FreeIntent, drained false) created with
 * create_revision == 0, so a retry cannot apply it twice. After commit
 * (efs_alloc_txn_end COMMITTED) the committed maps advance (mod_revision =
 * the response's header revision), published allocations leave the
 * "allocated" set, and freed blocks enter quarantine (they become
 * available once reads begun before the free have ended). After an
 * UNKNOWN outcome the maps (and owner keys) are re-read before the next
 * map transaction builds; the caller learns from its own verification
 * (op id) whether it applied and says so with efs_alloc_txn_end again
 * (COMMITTED or FAILED).
 *
 * Free intents: the owner folds intents of its groups (at claim and on a
 * periodic sweep) whose |drained| flag is set or whose node's n/ key is
 * gone, in one transaction per group (map + free put, intent deletes,
 * comparing their mod_revisions), reporting double frees in the log and
 * etcfs_space_double_frees_total instead of applying them. This node
 * marks its own intents drained once its quarantine released those blocks.
 * Groups that hold intents but have no owner key (their owner's session
 * ended) are claimed by any node's sweep — or right after it made such an
 * intent — and folded; a start prefers them.
 *
 * Dead-node grace: ag/<g>/free names the group's last owner (written by
 * the claim and every map change, marked released by the clean leave in
 * the transaction that deletes the owner key). A group with no owner key
 * is claimed at once when its last owner released it, when none is
 * recorded, or when it was an earlier process of this node found gone (a
 * restart on the same machine); otherwise only once |dead_grace_ms| has
 * passed since this node first saw it without an owner, so that no device
 * write of a cut-off owner can still land in blocks handed out again.
 * Undrained free intents of an ended session wait out the same grace
 * before they are folded. etcfs_space_grace_bytes is the free space of
 * groups waiting so.
 *
 * Backup hold: a block a backup's snapshot references may be freed after
 * the backup took its revision and must not be handed out again before it
 * is copied. Every map transaction (publication, truncate, reclaim batch,
 * fold, claim, the re-read after an unknown outcome) also reads the
 * pin/backup. prefix (keys only, one key); blocks it frees, folds in or
 * claims while a pin exists (or when its response is not known) join a
 * per-group held list that allocation leaves alone, and the first one that
 * sees no pin releases them all. While blocks are held the sweep reads the
 * prefix too, so that an idle node releases them. etcfs_space_held_bytes
 * is the space held; statfs and the reserve count it as used.
 *
 * Reserve: allocations with EFS_ALLOC_NEW (extending writes, hole fills,
 * fallocate) fail with ENOSPC when the filesystem's free blocks would fall
 * below |reserve_blocks|; overwrites (copy-on-write of blocks already
 * mapped) and the partial-block rewrites of punch/truncate may use it, so
 * deletes and overwrites keep working on a nearly full filesystem.
 *
 * Every function runs on the loop thread. Callback rule (libuv's): a
 * function taking a callback returns an error now (callback never runs),
 * 1 when done now (callback never runs), or 0 and the callback runs once,
 * later.
 */

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/txn.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "space/runs.h"
#include "util/metrics.h"
#include "etcfs.pb-c.h"

struct efs_alloc;
struct efs_alloc_txn;

struct efs_alloc_opts {
	const struct efs_meta_ns *ns;
	const Etcfs__FsInfo *fi;      /* geometry (borrowed; outlives the allocator) */
	struct efs_metrics *m;	      /* may be NULL */
	uint32_t groups_initial;      /* groups claimed at start (0: 2) */
	uint64_t reserve_blocks;      /* 0: max(1% of the data blocks, 64) */
	uint32_t fold_interval_ms;    /* free-intent sweep (0: 5000) */
	uint32_t dead_grace_ms;	      /* dead-node grace (0: EFS_ALLOC_DEAD_GRACE_MS) */
	uint32_t handover_wait_ms;    /* a hand-over request's bound (0: the session TTL) */
	/* Growth (docs/DESIGN.md, "Online growth"): the device, whose size is
	 * re-read when the "sb" record grows (borrowed; NULL: this node never
	 * allocates beyond the geometry it started with), and who to tell once
	 * the node allocates in the grown area (may be NULL). */
	const int *dev_fd;
	void (*grown)(void *arg, uint64_t device_size, uint32_t ag_count);
	void *grown_arg;
	/* Told every inode limit an "sb" value carries (etcfsctl grow sets it
	 * with or without a growth), with |grown_arg|; may be NULL. */
	void (*inode_limit)(void *arg, uint64_t inode_limit);
};

/* Default dead-node grace: see docs/DESIGN.md on dead nodes' space. */
#define EFS_ALLOC_DEAD_GRACE_MS 300000u

int efs_alloc_new(struct efs_alloc **ret, uv_loop_t *loop, struct efs_etcd *c,
		  struct efs_session *s, const struct efs_alloc_opts *o);
/*
 * Claims the initial groups and loads them (the session must be ACTIVE).
 * Groups owned by this node's previous session (a restart after kill -9:
 * their owner key names this node with an older generation or a lease
 * that is gone) are taken back first. Calls |cb| with 0 or a negative
 * errno (-EIO: etcd unreachable; not finding a free group is not an
 * error, allocations will then answer ENOSPC).
 */
int efs_alloc_start(struct efs_alloc *a, void (*cb)(int status, void *arg), void *arg);

/* Allocation flags. */
#define EFS_ALLOC_NEW 0x1u /* new space: keeps the reserve */

/*
 * Allocates |want| blocks (absolute device blocks), contiguous where
 * possible and near |goal| (an absolute block, 0: none), appending the
 * runs to |out| (their total is exactly |want| on success). Returns 1
 * when done now, 0 when it waits for a group claim (|cb| later with 0 and
 * the runs appended, or a negative errno and nothing appended), -ENOSPC,
 * -EIO (session not active), -ENOMEM. Allocated blocks stay the caller's
 * until efs_alloc_txn_use publishes them or efs_alloc_unuse returns them.
 */
int efs_alloc_get(struct efs_alloc *a, uint64_t want, uint64_t goal, unsigned flags,
		  struct efs_runs *out, void (*cb)(int status, void *arg), void *arg);
/*
 * Blocks allocated and never published that are no longer wanted (a failed
 * write, an overwrite before publication, a file dropped with unpublished
 * data): back to the available set through quarantine.
 */
void efs_alloc_unuse(struct efs_alloc *a, const struct efs_runs *runs);

/* Reads of the device take a quarantine ticket before looking extents up
 * and give it back when the device read ends (fs/space/quarantine.h). */
uint64_t efs_alloc_read_begin(struct efs_alloc *a);
void efs_alloc_read_end(struct efs_alloc *a, uint64_t ticket);

/* ---- Map transactions ---- */

/*
 * Takes the map token and starts a contribution: 1 (now), 0 (|cb| later
 * with 0 or a negative errno), or a negative errno. *ret is set before
 * the return (1) or the callback (0).
 */
int efs_alloc_txn_begin(struct efs_alloc *a, struct efs_alloc_txn **ret,
			void (*cb)(int status, void *arg), void *arg);
/* Newly published allocations (blocks from efs_alloc_get). -EINVAL when a
 * block was not allocated by this node; -ENOMEM. */
int efs_alloc_txn_use(struct efs_alloc_txn *t, const struct efs_runs *runs);
/* Blocks that stop being referenced with this transaction (|ino| for the
 * intent's diagnostics). -ENOMEM. */
int efs_alloc_txn_free(struct efs_alloc_txn *t, const struct efs_runs *runs, uint64_t ino);
/* Operations and compares the contribution will add (for the caller's
 * budget under etcd's 128 per transaction). */
size_t efs_alloc_txn_nops(const struct efs_alloc_txn *t);
/* Adds the map/free puts, owner and mod_revision compares, intents and the
 * read of pin/backup. to |txn| (success branch and compares); |txn| must
 * be the root builder of the request. May be called again after a reset
 * of |txn| (a rebuild). 0, -ENOMEM, -EUCLEAN (a free of blocks that are
 * already free in an owned group: reported, the transaction must not go). */
int efs_alloc_txn_build(struct efs_alloc_txn *t, struct efs_etcd_txn *txn);
/*
 * The response of the transaction that committed (before
 * efs_alloc_txn_end COMMITTED): whether it saw a backup pin. A contribution
 * ended COMMITTED without it (settled after an unknown outcome) holds what
 * it freed as if it had seen one. |resp| NULL: the same; |t| NULL:
 * nothing.
 */
void efs_alloc_txn_result(struct efs_alloc_txn *t, const Etcdserverpb__TxnResponse *resp);

enum efs_alloc_outcome {
	EFS_ALLOC_COMMITTED = 0, /* applied: |rev| is the commit revision */
	EFS_ALLOC_FAILED,	 /* not applied; the contribution may be rebuilt or ended again */
	EFS_ALLOC_UNKNOWN,	 /* maps re-read before the next begin; end it again later */
};
/*
 * Reports the outcome. COMMITTED and FAILED end the contribution (frees
 * |t|, releases the token); UNKNOWN keeps |t| (re-reading maps) and must be
 * followed by COMMITTED or FAILED once the caller knows.
 */
void efs_alloc_txn_end(struct efs_alloc_txn *t, enum efs_alloc_outcome oc, int64_t rev);

/*
 * The death hold: a node whose session ended may still land an in-place
 * write it queued before its deadline, for the dead-node grace, so blocks
 * freed while such a grace runs must not be handed to another file before
 * it ends. Blocks a committed map transaction frees in owned groups, and
 * the drained mark of the free intents it makes, reach the quarantine only
 * once |fn|(|arg|, rev, nodes, gens) (rev the commit revision, 0 when not
 * known) answers 0; a nonzero answer is the monotonic time (ns) at which
 * to ask again. A transaction that frees reads n/ and g/ (keys only) and
 * hands them to |fn| with its commit revision, so that a session end
 * since the tracker last knew shows without a round trip more; later
 * asks pass NULL. Groups this node sees ownerless and waiting out their grace hold
 * the same way (a death before this node started). A group holding such
 * blocks is not marked released at a clean leave. etcfs_space_death_held_bytes
 * is the space held. NULL: no hold but the groups' (the default).
 */
typedef uint64_t (*efs_alloc_hold_fn)(void *arg, int64_t rev,
				      const Etcdserverpb__RangeResponse *nodes,
				      const Etcdserverpb__RangeResponse *gens);
void efs_alloc_set_death_hold(struct efs_alloc *a, efs_alloc_hold_fn fn, void *arg);

/* ---- Figures ---- */

struct efs_alloc_stats {
	uint32_t groups_owned;
	uint64_t avail_blocks;	   /* allocatable now in owned groups */
	uint64_t pending_blocks;   /* allocated, not published */
	uint64_t quarantine_blocks;
	uint64_t held_blocks; /* freed while a backup runs: not allocatable until it ends */
	uint64_t death_held_blocks; /* freed while a dead node's grace runs (the death hold) */
	uint64_t reserve_blocks;
	uint64_t double_frees;
	uint64_t grace_blocks; /* free blocks of dead nodes' groups waiting out the grace */
	uint64_t groups_given; /* handed over to nodes short of space */
};
void efs_alloc_get_stats(const struct efs_alloc *a, struct efs_alloc_stats *ret);

/*
 * Clean leave: waits for the map token, deletes this node's owner keys
 * (blocks allocated and never published stay free in the maps), then
 * |cb|. Same return convention.
 */
int efs_alloc_leave(struct efs_alloc *a, void (*cb)(int status, void *arg), void *arg);
/* The session was lost: forget ownership and every in-memory allocation
 * (nothing was published from them). */
void efs_alloc_session_lost(struct efs_alloc *a);
/*
 * The size in bytes of the device open at |fd| (a regular file's size or a
 * block device's, BLKGETSIZE64). 0 or -errno; *ret untouched on failure.
 */
int efs_alloc_device_bytes(int fd, uint64_t *ret);

/*
 * Geometry the allocator uses now: |ret_ag_count| groups over
 * |ret_device_size| bytes (larger than at start once a growth was seen and
 * the device checked). Either pointer may be NULL.
 */
void efs_alloc_geometry(const struct efs_alloc *a, uint64_t *ret_device_size,
			uint32_t *ret_ag_count);

/* Frees; no map transaction may be open. Accepts NULL; returns NULL. */
struct efs_alloc *efs_alloc_free(struct efs_alloc *a);
