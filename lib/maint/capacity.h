/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * etcd capacity guard: etcd's
 * backend has a quota (--quota-backend-bytes, 2 GiB by default and in
 * Debian's package); once a member's database reaches it, etcd raises the
 * NOSPACE alarm and refuses every request that writes anything until an
 * operator (or the elected maintenance node) compacts, defragments and
 * disarms. To keep deletes working, the filesystem refuses metadata growth
 * itself, earlier, with ENOSPC.
 *
 * The monitor asks etcd's Maintenance Status every |interval_ms| and keeps
 * one of three states:
 *   OK    growth allowed.
 *   LOW   the database size in use (Status dbSizeInUse: the pages bbolt
 *         holds live data in; dbSize itself only shrinks by defragmentation)
 *         is at least |low_pct| (80) percent of the quota, or dbSize is at
 *         least |db_pct| (90) percent of it: growth refused. Left for OK
 *         when in use drops below |ok_pct| (75) percent and dbSize below
 *         |db_pct| (hysteresis, so the state does not flap at the boundary).
 *         Why dbSize too: etcd's own quota check is dbSize + the request's
 *         cost against the quota, and while a database only grows, dbSize
 *         runs 15-20 % ahead of the size in use (pages freed by bbolt's
 *         copy-on-write, measured with etcd 3.4.23): at 80 % in use etcd
 *         may already refuse. dbSize stays high after a compaction until
 *         the member is defragmented (the maintenance node, or the
 *         operator); |db_pct| 100 turns this criterion off.
 *   FULL  the NOSPACE alarm is active (Status lists "alarm:NOSPACE" among
 *         its errors), or an operation got etcd's "database space exceeded"
 *         (-ENOSPC from lib/etcd) and no later Status said otherwise: growth
 *         refused. Left when a Status no longer lists the alarm (an operator
 *         ran `etcdctl alarm disarm`), for LOW or OK by the sizes.
 * Before the first answer the state is OK (nothing is refused on a guess);
 * when Status fails the state and sizes stay as last known (etcd down is
 * the session's business, not the capacity guard's).
 *
 * Which member: Status is asked of the member the client's bulk channel
 * reaches (it moves on failover), not of each member. The alarm list is
 * raft state, so every member reports a NOSPACE alarm raised by any of
 * them; the size in use follows the applied data and the compactions, which
 * all members share, so it is close on every member. dbSize differs more
 * (each member is defragmented on its own), and it is the member that
 * serves our writes whose quota check refuses them. Asking one member keeps
 * this to one cheap call per interval on the client the filesystem already
 * has; a member defragmented later than the others can show LOW late, and
 * the NOSPACE path (note_error) covers what that misses.
 *
 * Threads: everything runs on the loop thread of |client|'s loop.
 */

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "etcd/etcd.h"
#include "rpc.pb-c.h"

struct efs_capacity;
struct efs_metrics;

/* etcd's default --quota-backend-bytes (and Debian's): 2 GiB. */
#define EFS_CAPACITY_QUOTA_DEFAULT (2ULL << 30)
#define EFS_CAPACITY_INTERVAL_DEFAULT_MS 5000
#define EFS_CAPACITY_LOW_PCT_DEFAULT 80
#define EFS_CAPACITY_OK_PCT_DEFAULT 75
#define EFS_CAPACITY_DB_PCT_DEFAULT 90

enum efs_capacity_state {
	EFS_CAPACITY_OK = 0,
	EFS_CAPACITY_LOW,
	EFS_CAPACITY_FULL,
};

/* State changes; |old| and |new_state| differ. Runs on the loop thread,
 * after a Status answer or from inside efs_capacity_note_error (never from
 * efs_capacity_check_growth); it may free the monitor. */
typedef void (*efs_capacity_state_cb)(struct efs_capacity *cap, enum efs_capacity_state old,
				      enum efs_capacity_state new_state, void *arg);

struct efs_capacity_opts {
	/* The cluster's --quota-backend-bytes (0: EFS_CAPACITY_QUOTA_DEFAULT). */
	uint64_t quota_bytes;
	/* Time between Status calls (0: 5000 ms). */
	uint32_t interval_ms;
	/* Enter LOW at |low_pct| percent of the quota in use or |db_pct|
	 * percent of it as dbSize, leave it below |ok_pct| in use and |db_pct|
	 * dbSize (0: 80, 75, 90); 0 < ok_pct < low_pct <= 100, db_pct <= 100. */
	unsigned low_pct;
	unsigned ok_pct;
	unsigned db_pct;
	/* Optional. */
	efs_capacity_state_cb state_cb;
	void *arg;
};

/*
 * Creates the monitor and starts its first Status call at once. |opts| may
 * be NULL (defaults). |client| must outlive the monitor: free the monitor
 * first. Errors: -EINVAL (NULL loop or client, thresholds out of order or
 * above 100), -ENOMEM.
 */
int efs_capacity_new(struct efs_capacity **ret, uv_loop_t *loop, struct efs_etcd *client,
		     const struct efs_capacity_opts *opts);

/* Stops the monitor: a Status call in flight is cancelled, and no callback
 * runs afterwards. Accepts NULL; returns NULL. */
struct efs_capacity *efs_capacity_free(struct efs_capacity *cap);

/*
 * The guard, called before every operation that adds metadata (create,
 * mkdir, mknod, symlink, link, setxattr, rename onto a new name): 0 when the
 * state is OK, -ENOSPC when it is LOW or FULL. No I/O, O(1). Accepts NULL
 * (no monitor: 0).
 */
int efs_capacity_check_growth(const struct efs_capacity *cap);

/*
 * Feeds an operation's etcd error to the monitor. -ENOSPC (etcd's "database
 * space exceeded": the NOSPACE alarm is up) makes the state FULL at once
 * and asks Status again soon (at once, or at most every 200 ms while errors
 * keep coming) to confirm; any other value, 0 included, is ignored. Accepts
 * NULL.
 */
void efs_capacity_note_error(struct efs_capacity *cap, int err);

/* Asks Status again now (or right after the call in flight), e.g. after a
 * compaction or defragmentation. Accepts NULL. */
void efs_capacity_recheck(struct efs_capacity *cap);

enum efs_capacity_state efs_capacity_state(const struct efs_capacity *cap);
/* "ok", "low", "full" ("?" for an unknown value). */
const char *efs_capacity_state_name(enum efs_capacity_state st);

/* Figures for metrics, status output and tests. */
struct efs_capacity_stats {
	enum efs_capacity_state state;
	uint64_t quota;		/* configured quota, bytes */
	uint64_t db_size;	/* Status dbSize of the last answer (0 before one) */
	uint64_t in_use;	/* Status dbSizeInUse (dbSize if the member sent 0) */
	bool known;		/* at least one Status answered */
	bool alarm;		/* the last answer listed the NOSPACE alarm */
	uint64_t checks;	/* Status answers */
	uint64_t check_failures; /* Status calls that failed */
	int last_err;		/* error of the last failed Status call (0: none yet) */
	uint64_t nospace_errors; /* efs_capacity_note_error(-ENOSPC) calls */
	uint64_t last_check_ns;	/* mono time of the last answer (0: none) */
};
void efs_capacity_get_stats(const struct efs_capacity *cap, struct efs_capacity_stats *ret);

/*
 * Registers the gauges etcfs_etcd_db_bytes, etcfs_etcd_db_in_use_bytes,
 * etcfs_etcd_quota_bytes, etcfs_metadata_space_low (1 in LOW or FULL) and
 * etcfs_etcd_nospace_alarm (1 in FULL) on |m|. They read the monitor at
 * *|slot| at render time (all 0 while *|slot| is NULL), so the caller may
 * free and clear the monitor before the registry; |slot| itself (e.g. a
 * field of the daemon's state) must outlive |m|. Errors: -ENOMEM (or a
 * name clash in |m|).
 */
int efs_capacity_register_metrics(struct efs_capacity *const *slot, struct efs_metrics *m);

/* ---- The decision, pure (unit-tested) ---- */

/* What one Status answer says. */
struct efs_capacity_sample {
	uint64_t db_size;
	uint64_t in_use;
	bool nospace_alarm;
};

/*
 * Extracts a sample from a Status answer: sizes (negative ones as 0; an
 * in-use size of 0, as members before etcd 3.4 send, is replaced by dbSize)
 * and whether any entry of |errors| names the NOSPACE alarm.
 */
void efs_capacity_sample_from_status(const Etcdserverpb__StatusResponse *resp,
				     struct efs_capacity_sample *ret);

/* The thresholds, as in efs_capacity_opts (all set, none 0 but |quota|). */
struct efs_capacity_limits {
	uint64_t quota;
	unsigned low_pct;
	unsigned ok_pct;
	unsigned db_pct;
};

/*
 * The next state from the current one and a sample: FULL while the alarm is
 * listed; LOW when in_use * 100 >= quota * low_pct or db_size * 100 >=
 * quota * db_pct, or when |prev| is LOW or FULL and in_use * 100 >= quota *
 * ok_pct; OK otherwise. Exact (no overflow) for every uint64_t input;
 * |quota| 0 counts as always LOW.
 */
enum efs_capacity_state efs_capacity_decide(enum efs_capacity_state prev,
					    const struct efs_capacity_limits *l,
					    const struct efs_capacity_sample *s);

/* The state after an operation failed with |err|: FULL for -ENOSPC, |prev|
 * otherwise. */
enum efs_capacity_state efs_capacity_decide_error(enum efs_capacity_state prev, int err);
