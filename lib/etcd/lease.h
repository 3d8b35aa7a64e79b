/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Leases: thin Grant/Revoke/TimeToLive wrappers and a keepalive machine made
 * for fencing: a node must know, from its own clock alone, a moment by which
 * etcd cannot yet have expired its lease.
 *
 * A keepalive set (struct efs_etcd_keepalive) owns one LeaseKeepAlive stream
 * on the priority channel and carries every lease kept alive through it;
 * make one per client. Each lease (struct efs_etcd_lease) is renewed at its
 * own interval from a timer on the loop. Its deadline is timed from the
 * *send* time of its last acknowledged renewal: etcd answers the renewals of
 * one stream in order, so the reply for lease X acknowledges the oldest
 * outstanding renewal of X on that stream. The send time kept is the moment
 * the renewal was queued on the stream, which is never later than the moment
 * it reached the socket, so the deadline computed from it is never later
 * than the server's.
 *
 * When no renewal is acknowledged for |failover_ms|, renewals also go out on
 * a second keepalive stream on the bulk channel (which prefers another
 * endpoint); when the oldest renewal on the priority stream is older than
 * |at_risk_ms| the priority channel is failed over to the next endpoint.
 * Streams that end are reopened with backoff and renewing goes on.
 *
 * Everything runs on the client's loop thread. Callbacks never run inline
 * from the call that registered them.
 */

#include <stdbool.h>
#include <stdint.h>

#include "etcd/etcd.h"

/* ---- Thin wrappers ---- */

struct efs_etcd_lease_grant_info {
	int64_t id;       /* the lease id */
	int64_t ttl_s;    /* the TTL etcd granted (may be above the request) */
	uint64_t sent_ns; /* mono time the grant was sent: the first deadline base */
};

/* |status| is 0 or the call's -errno; |info| is NULL unless status is 0. */
typedef void (*efs_etcd_lease_grant_cb)(int status, const struct efs_etcd_lease_grant_info *info,
					void *arg);
typedef void (*efs_etcd_lease_status_cb)(int status, void *arg);
/* |ttl_s| is the remaining TTL, -1 when etcd does not know the lease (the
 * status is still 0 then); |granted_ttl_s| is the TTL it was granted with. */
typedef void (*efs_etcd_lease_ttl_cb)(int status, int64_t ttl_s, int64_t granted_ttl_s, void *arg);

/*
 * Grants a lease of |ttl_s| seconds, with id |id| (0: etcd picks one). The
 * callback gets the granted id and TTL. Errors now: -EINVAL (ttl_s <= 0),
 * -ENOMEM, -ESHUTDOWN; later, the call's status (a grant without an id whose
 * outcome is unknown reports -ETIMEDOUT or the transport's error).
 */
int efs_etcd_lease_grant(struct efs_etcd *c, int64_t ttl_s, int64_t id,
			 efs_etcd_lease_grant_cb cb, void *arg);

/* Revokes lease |id|, deleting its keys. Later status: 0, or the call's error
 * (etcd's "requested lease not found" is NOT_FOUND, mapped by grpc.c). */
int efs_etcd_lease_revoke(struct efs_etcd *c, int64_t id, efs_etcd_lease_status_cb cb, void *arg);

/* Asks etcd for lease |id|'s remaining TTL (on the bulk channel). */
int efs_etcd_lease_time_to_live(struct efs_etcd *c, int64_t id, efs_etcd_lease_ttl_cb cb,
				void *arg);

/* ---- Keepalive ---- */

struct efs_etcd_keepalive;
struct efs_etcd_lease;

enum efs_etcd_lease_event {
	/* No renewal acknowledged for |at_risk_ms| after the send time of the
	 * last acknowledged one; |at_ns| is that moment (last acked send +
	 * at_risk_ms). From now on etcd is also asked TimeToLive. */
	EFS_ETCD_LEASE_AT_RISK = 1,
	/* Renewals are acknowledged again after AT_RISK; |at_ns| is the send
	 * time of the renewal that was acknowledged. */
	EFS_ETCD_LEASE_RECOVERED,
	/* etcd says the lease no longer exists: a keepalive reply with TTL 0,
	 * or TimeToLive -1. Status is -ENOENT. Final: no event follows and
	 * renewing has stopped; only efs_etcd_lease_free remains. |at_ns| is
	 * when it was learnt. */
	EFS_ETCD_LEASE_GONE,
};

/* |status| is 0 for AT_RISK and RECOVERED and -ENOENT for GONE. */
typedef void (*efs_etcd_lease_cb)(struct efs_etcd_lease *l, int status,
				  enum efs_etcd_lease_event ev, uint64_t at_ns, void *arg);

struct efs_etcd_lease_opts {
	int64_t id;          /* required: a granted lease */
	int64_t ttl_s;       /* required: its granted TTL */
	/* Mono time the grant (or the last renewal known to be acknowledged)
	 * was sent; the first deadline is this + ttl_s. 0 (or a time in the
	 * future): now, which is only right when the grant was sent just
	 * before. */
	uint64_t granted_ns;
	uint32_t interval_ms; /* renewal interval (0: TTL/6) */
	uint32_t failover_ms; /* also renew via the bulk channel after this
			       * long without an ack (0: TTL/4) */
	uint32_t at_risk_ms;  /* AT_RISK after this long (0: TTL/2) */
};

/* Counters of one lease, for metrics and tests. */
struct efs_etcd_lease_stats {
	uint64_t renewals_sent;       /* on either stream */
	uint64_t renewals_acked;
	uint64_t acks_bulk;           /* of those, acknowledged on the bulk stream */
	uint64_t prio_failovers;      /* efs_etcd_channel_failover calls made */
	uint64_t stream_reopens;      /* keepalive streams opened after the first */
	/* Largest gap between consecutive renewals queued on the priority
	 * stream, and between consecutive changes of that stream's last send
	 * time (efs_etcd_stream_last_send_ns, sampled on every tick, so
	 * accurate to one tick of at most 50 ms). */
	uint64_t max_queue_gap_ns;
	uint64_t max_wire_gap_ns;
};

/*
 * Creates a keepalive set for client |c|. The stream is opened when the
 * first lease is added. Errors: -ENOMEM.
 */
int efs_etcd_keepalive_new(struct efs_etcd_keepalive **ret, struct efs_etcd *c);

/*
 * Closes the streams and frees |ka| and every lease still in it (their
 * callbacks do not run). Must be called before the client is freed and not
 * from inside one of its callbacks. Accepts NULL; returns NULL.
 */
struct efs_etcd_keepalive *efs_etcd_keepalive_free(struct efs_etcd_keepalive *ka);

/*
 * Starts keeping lease |o->id| alive in |ka|. The first renewal is sent on
 * the next loop iteration. |cb| reports AT_RISK, RECOVERED and GONE.
 * Errors: -EINVAL (no id, ttl_s <= 0, at_risk_ms < failover_ms when both are
 * given), -EEXIST (the id is already kept alive in |ka|), -ENOMEM.
 */
int efs_etcd_lease_new(struct efs_etcd_lease **ret, struct efs_etcd_keepalive *ka,
		       const struct efs_etcd_lease_opts *o, efs_etcd_lease_cb cb, void *arg);

/* Stops renewing (the lease lives on in etcd until its TTL runs out) and
 * frees |l|; no callback runs after this. May be called from |l|'s own
 * callback. Accepts NULL; returns NULL. */
struct efs_etcd_lease *efs_etcd_lease_free(struct efs_etcd_lease *l);

int64_t efs_etcd_lease_id(const struct efs_etcd_lease *l);
/* The TTL granted by the last acknowledged renewal (seconds). */
int64_t efs_etcd_lease_ttl(const struct efs_etcd_lease *l);
/* Mono send time of the last acknowledged renewal (or the grant). */
uint64_t efs_etcd_lease_last_ack_send_ns(const struct efs_etcd_lease *l);
/* That + the granted TTL: etcd cannot expire the lease before this. */
uint64_t efs_etcd_lease_deadline_ns(const struct efs_etcd_lease *l);
bool efs_etcd_lease_is_at_risk(const struct efs_etcd_lease *l);
bool efs_etcd_lease_is_gone(const struct efs_etcd_lease *l);
void efs_etcd_lease_get_stats(const struct efs_etcd_lease *l, struct efs_etcd_lease_stats *ret);

/*
 * Fault hook (compiled in when EFS_FAULT_HOOKS): while |paused|, |l| sends no
 * renewals, as a node whose keepalive is stuck; the risk checks and the
 * TimeToLive probes go on, so the lease ends with GONE once etcd expires it.
 */
void efs_etcd_lease_fault_pause(struct efs_etcd_lease *l, bool paused);
