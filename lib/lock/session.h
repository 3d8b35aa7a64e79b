/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The node's session: the session lease, the
 * node key n/<node> (NodeInfo on the lease), the fencing generation
 * g/<node>, and the two-phase fence.
 *
 * States (enum efs_session_state):
 *   ACTIVE     renewals acknowledged; mutations allowed.
 *   SUSPENDED  no acknowledged renewal for |suspend_ms| (default TTL/2)
 *              after the send time of the last acknowledged one: no device
 *              writes, no etcd mutations, new operations wait
 *              (efs_session_wait); the owner invalidates kernel caches and
 *              keeps its buffers. Left for ACTIVE when etcd answers and
 *              TimeToLive says the lease lives, or for GONE.
 *   EXPIRED    SUSPENDED and past the deadline (last acked send + TTL):
 *              nothing may be served from caches any more; operations
 *              still wait for etcd's answer, up to |quorum_loss_ms| after
 *              the suspension, then fail with EIO.
 *   GONE       etcd says the lease no longer exists: every lock, open
 *              reference and buffer of that session is lost (the owner
 *              discards them and fails affected descriptors with EIO).
 *              The session re-registers by itself (new lease, generation
 *              + 1) and goes ACTIVE again; waiting operations then resume.
 *   CLOSED     after efs_session_leave or a fatal error.
 * Every change is reported through the state callback.
 *
 * The timing decisions live in a pure state machine (session-fsm.h,
 * unit-tested with a fake clock); this module feeds it lease events and
 * timer ticks and carries out its actions against etcd.
 */

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/txn.h"
#include "meta/keys.h"
#include "util/list.h"

struct efs_session_owner; /* lock/session-fsm.h */

struct efs_session;

enum efs_session_state {
	EFS_SESSION_STARTING = 0,
	EFS_SESSION_ACTIVE,
	EFS_SESSION_SUSPENDED,
	EFS_SESSION_EXPIRED,
	EFS_SESSION_GONE,
	EFS_SESSION_CLOSED,
};

struct efs_session_opts {
	const struct efs_meta_ns *ns;
	const char *node;	  /* node id (valid per efs_meta_node_is_valid) */
	const char *machine_id;	  /* NULL: read /etc/machine-id (hostname if none) */
	const char *hostname;	  /* NULL: gethostname() */
	const char *metrics_addr; /* published in NodeInfo; may be NULL */
	bool cow;		  /* published in NodeInfo: -o cow */
	int64_t ttl_s;		  /* session lease TTL (0: 2 s) */
	uint32_t suspend_ms;	  /* 0: TTL/2 */
	uint32_t quorum_loss_ms;  /* how long operations wait while suspended before
				   * EIO (0: 30 s) */
};

/* State changes; |old| and |new| differ. Runs on the loop. */
typedef void (*efs_session_state_cb)(struct efs_session *s, enum efs_session_state old,
				     enum efs_session_state new_state, void *arg);
/* End of efs_session_start or efs_session_leave: 0 or a negative errno. */
typedef void (*efs_session_done_cb)(struct efs_session *s, int status, void *arg);

/*
 * Registers the node: reads n/<node> and g/<node>; if n/<node> exists
 * with this machine id and boot id, and its pid is not running here or
 * runs with another start time than the recorded one (the pid was reused),
 * revokes its lease (a restart after kill -9); a record without a boot id
 * (an older writer) is taken over when the machine id matches and the pid
 * is not running (efs_session_may_take_over). If it exists otherwise,
 * fails with -EBUSY ("node id in use", logged with the holder's hostname
 * and pid). Then grants the
 * lease, and in one transaction (n/<node> absent, g/<node> unchanged) puts
 * n/<node> on the lease and g/<node> = generation + 1, and starts renewing.
 * |done| runs once with 0 (ACTIVE) or an error (the session is then
 * CLOSED; free it). -ENOMEM/-EINVAL now, |done| never runs then.
 */
int efs_session_start(struct efs_session **ret, uv_loop_t *loop, struct efs_etcd *c,
		      const struct efs_session_opts *o, efs_session_state_cb state_cb,
		      efs_session_done_cb done, void *arg);

/*
 * Clean leave: stops renewing and revokes the lease (every key on it —
 * node key, holders, open references, group owners — goes with it). The
 * caller publishes and releases what it wants explicitly before. |done|
 * runs once (0, or the revoke's error: the lease then ends with its TTL);
 * the session is CLOSED at once and its waiters get -ESHUTDOWN. Errors now:
 * -EALREADY (closed, leaving, or still starting: free it instead),
 * -EINVAL, -ENOMEM, -ESHUTDOWN (client closing).
 */
int efs_session_leave(struct efs_session *s, efs_session_done_cb done, void *arg);

/* Frees |s| (no callback runs afterwards; the lease lives on in etcd until
 * its TTL ends unless left first). Accepts NULL; returns NULL. */
struct efs_session *efs_session_free(struct efs_session *s);

enum efs_session_state efs_session_state(const struct efs_session *s);
const char *efs_session_state_name(enum efs_session_state st);
int64_t efs_session_lease_id(const struct efs_session *s);
/* The TTL etcd granted to the session's lease (seconds; it may exceed the
 * requested one), 0 before the first registration. After a re-registration
 * it is the new lease's; while GONE it is still the lost lease's. */
int64_t efs_session_ttl_s(const struct efs_session *s);
uint64_t efs_session_generation(const struct efs_session *s);
const char *efs_session_node(const struct efs_session *s);
/* Mono deadline of the current lease (last acked renewal send + TTL). */
uint64_t efs_session_deadline_ns(const struct efs_session *s);
/* How long operations wait while the session is suspended (the
 * quorum-loss bound of efs_session_opts). */
uint32_t efs_session_quorum_loss_ms(const struct efs_session *s);
/* True only when ACTIVE: mutations and cached answers are allowed. */
bool efs_session_is_active(const struct efs_session *s);
/* mod_revision of g/<node> as this session wrote it (what the guard
 * compares), and the namespace the session was started with. */
int64_t efs_session_gen_mod_revision(const struct efs_session *s);
const struct efs_meta_ns *efs_session_ns(const struct efs_session *s);
/* This process as a session owner (strings borrowed from |s|): what a
 * record written now names, for a later start's takeover check. */
void efs_session_owner_self(const struct efs_session *s, struct efs_session_owner *ret);
/* Is the process |old| names gone, so that this process may take over what
 * it held (efs_session_may_take_over on the pid as it runs now)? Reads
 * /proc/<pid>/stat when that pid runs: a /proc read, never the disk. */
bool efs_session_owner_gone(const struct efs_session *s, const struct efs_session_owner *old);

/*
 * Adds to |t| the compares every mutation carries: n/<node> is on this
 * session's lease, and g/<node> still holds this session's generation
 * (mod_revision as written at registration). 2 compares. -EIO when the
 * session is not ACTIVE, -E2BIG when |t| is full (the first compare may
 * then be in |t| already: throw the builder away).
 */
int efs_session_guard(const struct efs_session *s, struct efs_etcd_txn *t);

/*
 * Waiting for the session: operations that arrive while SUSPENDED, EXPIRED
 * or GONE queue here. The callback runs once: 0 when the session is ACTIVE
 * again (for GONE: once re-registered; |generation_changed| tells the
 * caller that its locks and handles are gone), -EIO when |quorum_loss_ms|
 * passed since the suspension, -ESHUTDOWN when the session is closed
 * (left, or a re-registration failed for good). efs_session_wait returns 1
 * when the session is ACTIVE now (the callback never runs), 0 when queued.
 * The waiter is caller-owned (embed it in the operation record) and may be
 * cancelled; cancel after the callback is a no-op.
 *
 * Failing fast: once the waiters of a suspension have been failed with
 * -EIO (quorum_loss_ms passed), operations that arrive while the session is
 * still not ACTIVE are not made to wait the whole bound again: they are
 * queued and answered -EIO on the next loop iteration, until etcd answers
 * again (a renewal acknowledged, a TimeToLive answered); from then on new
 * waiters wait again, for at most quorum_loss_ms from that answer. So a
 * long quorum loss costs each operation one loop iteration, not 30 s, and
 * service resumes as soon as etcd does. After efs_session_leave (CLOSED)
 * waiters are answered -ESHUTDOWN, also on the next iteration.
 */
struct efs_session_waiter;
typedef void (*efs_session_wait_cb)(struct efs_session_waiter *w, int status,
				    bool generation_changed);
struct efs_session_waiter {
	struct efs_list link; /* private */
	uint64_t generation;  /* private */
	efs_session_wait_cb cb;
	void *arg;
};
int efs_session_wait(struct efs_session *s, struct efs_session_waiter *w, efs_session_wait_cb cb,
		     void *arg);
void efs_session_wait_cancel(struct efs_session *s, struct efs_session_waiter *w);

/* Counters for metrics and status. */
struct efs_session_stats {
	uint64_t suspends;	/* entries into SUSPENDED */
	uint64_t resumes;	/* SUSPENDED/EXPIRED -> ACTIVE with the lease alive */
	uint64_t losses;	/* -> GONE */
	uint64_t registrations; /* sessions registered (1 + re-registrations) */
	uint64_t waits_failed;	/* waiters answered -EIO */
	uint64_t renew_max_gap_ns; /* largest gap between consecutive renewals sent
				    * (the lease module's queue and wire gaps) */
};
void efs_session_get_stats(const struct efs_session *s, struct efs_session_stats *ret);

/* Fault hook (EFS_FAULT_HOOKS): stop/resume renewals as if stuck. */
void efs_session_fault_pause(struct efs_session *s, bool paused);
