/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * etcd maintenance by one elected node: etcd capacity is the filesystem's
 * to manage (operators: docs/OPERATIONS.md "etcd"). Debian's etcd runs without auto-compaction, and etcfs
 * rewrites chunk and map values continuously: without compaction every old
 * value stays in the database until the quota is reached.
 *
 * Election. Every daemon runs one maintenance object. The key maint
 * (efs_meta_key_maint) names the elected node: it is created with compare
 * create_revision == 0 (and the session's guard) on the session lease,
 * value the node id. A node that does not hold it retries every |elect_ms|
 * (one small Txn); the holder keeps it as long as its session lease lives,
 * so a node that leaves, dies or loses its session hands the role over
 * within the lease TTL plus |elect_ms|. The election is for economy, not
 * for safety: two compactors at once would be harmless (etcd refuses a
 * compaction at or below the current one).
 *
 * Compaction (the holder, every |interval_ms|). One Txn compares that maint
 * is still on this session's lease and reads every pin/<name> key; its
 * header gives the current revision R. The target is R - |retain_revs|,
 * lowered to the smallest pinned revision; nothing happens when the target
 * is not above the last compaction done. etcd's "required revision has been
 * compacted" (the server, an operator or an earlier holder compacted
 * further already) counts as done. Retention is by revisions, not time: it
 * bounds the history's size whatever the write rate. A reader that needs an
 * older revision for longer (a paged read of the whole keyspace, a backup)
 * pins it: it puts pin/<name> = the revision in decimal ASCII, taking a
 * revision not older than the one its pin's put returned (that revision is
 * always above any target computed before: put a placeholder first, then
 * the revision that put returned), and deletes the pin when done. A pin
 * whose value is not a positive decimal revision stops compaction (logged)
 * until it is fixed. fsck does not pin yet.
 *
 * Size and defragmentation. After each compaction step the holder reads the
 * database size (from |capacity| when given, else its own Status call): when
 * dbSize - dbSizeInUse exceeds both |defrag_pct| percent of dbSize and
 * |defrag_min_bytes|, the database wants defragmentation. lib/etcd has no
 * Maintenance.Defragment call yet, so the holder only reports it (warning
 * in the log, gauge etcfs_maint_defrag_wanted) and the operator runs
 * `etcdctl --endpoints=<member> defrag` one member at a time
 * (docs/OPERATIONS.md).
 *
 * Metrics (when |m| is given): etcfs_maint_leader (1 on the elected node),
 * etcfs_maint_compactions_total, etcfs_maint_compacted_revision,
 * etcfs_maint_defrag_wanted.
 *
 * Threads: everything runs on the loop thread of the client's loop.
 */

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "etcd/etcd.h"
#include "lock/session.h"
#include "meta/keys.h"

struct efs_maint;
struct efs_metrics;
struct efs_capacity;

#define EFS_MAINT_INTERVAL_DEFAULT_MS	60000
#define EFS_MAINT_ELECT_DEFAULT_MS	5000
#define EFS_MAINT_RETAIN_DEFAULT	1000
#define EFS_MAINT_DEFRAG_PCT_DEFAULT	25
#define EFS_MAINT_DEFRAG_MIN_DEFAULT	(64ULL << 20)

struct efs_maint_opts {
	/* Time between two compaction steps of the holder (0: 60 s). */
	uint32_t interval_ms;
	/* Time between two election attempts of a node that does not hold
	 * the role (0: 5 s). */
	uint32_t elect_ms;
	/* Revisions kept behind the current one (0: 1000). */
	int64_t retain_revs;
	/* Defragmentation wanted when dbSize - dbSizeInUse exceeds both
	 * (0: 25 % and 64 MiB). */
	unsigned defrag_pct;
	uint64_t defrag_min_bytes;
	/* The daemon's capacity monitor, optional: its sizes are used instead
	 * of a Status call of our own, and it is asked to recheck after each
	 * compaction so that the growth guard sees the space freed soon. It
	 * must outlive the maintenance object. */
	struct efs_capacity *capacity;
};

/*
 * Creates the maintenance object (idle until efs_maint_start). |s| is the
 * node's session (its node id and lease), |ns| the filesystem (copied), |m|
 * may be NULL (no metrics; else the metrics above are registered on it, and
 * |m| must outlive the object), |o| may be NULL (defaults). |c| and |s| must
 * outlive the object. Errors: -EINVAL (NULL loop, client, session or ns; a
 * client of another loop; defrag_pct above 100; negative retain_revs),
 * -ENOMEM.
 */
int efs_maint_new(struct efs_maint **ret, uv_loop_t *loop, struct efs_etcd *c,
		  struct efs_session *s, const struct efs_meta_ns *ns, struct efs_metrics *m,
		  const struct efs_maint_opts *o);

/* Starts the first election attempt at once. -EALREADY when started. */
int efs_maint_start(struct efs_maint *mt);

/*
 * Tells the object the session's state changed (call it from the session's
 * state callback). Leaving ACTIVE ends the role at once (the next ACTIVE
 * session must win the election again: a new lease has lost the key);
 * entering ACTIVE starts an election attempt now. Accepts NULL.
 */
void efs_maint_session_changed(struct efs_maint *mt);

/*
 * Frees the object at once: a call in flight is left to finish (its
 * callback only frees its own record; the client completes it, with
 * -ECANCELED if the client is freed first), no callback of this module runs
 * afterwards. The maint key is not deleted (it goes with the session's
 * lease; free the object before leaving the session). Accepts NULL;
 * returns NULL.
 */
struct efs_maint *efs_maint_free(struct efs_maint *mt);

/* Figures for status output and tests. */
struct efs_maint_stats {
	bool leader;		 /* this node holds the role now */
	uint64_t elections_won;	 /* times the role was taken */
	uint64_t steps;		 /* holder steps (Txn answered while holding) */
	uint64_t compactions;	 /* compactions that succeeded */
	uint64_t compact_skips;	 /* compactions etcd found done already */
	int64_t compacted_rev;	 /* last revision compacted to (0: none) */
	int64_t last_rev;	 /* current revision seen last */
	int64_t min_pin;	 /* smallest pinned revision at the last step (0: none) */
	uint64_t errors;	 /* failed calls and bad pins */
	int last_err;		 /* error of the last failure (0: none) */
	uint64_t db_size;	 /* last sizes read by the holder */
	uint64_t in_use;
	bool defrag_wanted;
};
void efs_maint_get_stats(const struct efs_maint *mt, struct efs_maint_stats *ret);

/* ---- The decision, pure (unit-testable) ---- */

/*
 * The revision to compact to: |rev| - |retain|, lowered to |min_pin| when
 * that is not 0; 0 (nothing to do) when the result is not above |done| (the
 * last compaction) or not positive.
 */
int64_t efs_maint_target(int64_t rev, int64_t retain, int64_t min_pin, int64_t done);

/* Whether a database of |db_size| bytes with |in_use| in use wants
 * defragmentation: the difference exceeds both |pct| percent of |db_size|
 * and |min_bytes|. */
bool efs_maint_defrag_wanted(uint64_t db_size, uint64_t in_use, unsigned pct,
			     uint64_t min_bytes);

/* Parses a pin's value: 1 to 19 decimal digits, a revision > 0. -EBADMSG
 * otherwise. */
int efs_maint_parse_pin(const void *value, size_t len, int64_t *ret);
