/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The timing of a node session (session.h) as a pure state machine: no I/O, no
 * clock of its own. Every input carries the mono time |now| (ns) and returns a
 * set of actions (EFS_SFSM_A_*) that the caller carries out (session.c) or
 * checks (unit tests with a fake clock).
 *
 * Timeline of one session, all from T = the send time of the last
 * acknowledged renewal:
 *   T + suspend_ns   ACTIVE -> SUSPENDED (action SUSPEND)
 *   T + ttl_ns       SUSPENDED -> EXPIRED (action EXPIRE)
 * While SUSPENDED or EXPIRED, any sign that etcd answers (an acknowledged
 * renewal, or efs_session_fsm_reachable) asks TimeToLive (ASK_TTL, one at a
 * time). The answer "alive" resumes (ACTIVE, RESUME) provided the last
 * acknowledged renewal is still fresh (sent less than suspend_ns ago),
 * "gone" loses the session (GONE: actions GONE and REREGISTER); so does a
 * GONE event of the lease module (efs_session_fsm_lost). A successful
 * re-registration makes it ACTIVE again (ACTIVATED).
 *
 * Waiters: from the moment the session stops being ACTIVE, operations wait
 * at most quorum_loss_ns; then FAIL_WAITERS is returned once and the
 * machine "fails fast" (efs_session_fsm_fail_fast): new operations that
 * arrive while it is still not ACTIVE fail at once with EIO instead of
 * each waiting the whole bound again. The first answer from etcd after
 * that (an ack, reachable, a TimeToLive answer) ends failing fast and
 * restarts the bound from that moment, since etcd is evidently back and a
 * resume or re-registration is imminent.
 */

#include <stdbool.h>
#include <stdint.h>

#include "lock/session.h"

/* Actions, or-ed into the return value of every input. */
#define EFS_SFSM_A_SUSPEND	(1u << 0) /* entered SUSPENDED: stop mutations, invalidate */
#define EFS_SFSM_A_EXPIRE	(1u << 1) /* entered EXPIRED: serve nothing from caches */
#define EFS_SFSM_A_ASK_TTL	(1u << 2) /* send a TimeToLive for the lease */
#define EFS_SFSM_A_RESUME	(1u << 3) /* ACTIVE again, lease alive: wake waiters */
#define EFS_SFSM_A_GONE		(1u << 4) /* entered GONE: every lock and buffer is lost */
#define EFS_SFSM_A_REREGISTER	(1u << 5) /* register a new session (new lease, gen + 1) */
#define EFS_SFSM_A_FAIL_WAITERS (1u << 6) /* answer every waiter -EIO */
#define EFS_SFSM_A_ACTIVATED	(1u << 7) /* registered: ACTIVE (waiters: generation changed) */

struct efs_session_fsm {
	enum efs_session_state state;
	uint64_t ttl_ns;
	uint64_t suspend_ns;
	uint64_t quorum_loss_ns;
	uint64_t last_ack_ns; /* send time of the last acknowledged renewal (or grant) */
	uint64_t wait_from_ns; /* base of the quorum-loss bound while not ACTIVE */
	bool ttl_pending;      /* a TimeToLive is outstanding */
	bool failing;	       /* waiters were failed: fail new ones at once */
};

/* Starts in STARTING. |suspend_ns| must be below |ttl_ns| (clamped). */
void efs_session_fsm_init(struct efs_session_fsm *f, uint64_t ttl_ns, uint64_t suspend_ns,
			  uint64_t quorum_loss_ns);

/* A session was registered; its grant (the first deadline base) was sent at
 * |granted_ns|. STARTING or GONE -> ACTIVE (ACTIVATED). */
unsigned efs_session_fsm_registered(struct efs_session_fsm *f, uint64_t now, uint64_t granted_ns);

/* A renewal sent at |send_ns| was acknowledged (etcd is reachable). */
unsigned efs_session_fsm_acked(struct efs_session_fsm *f, uint64_t now, uint64_t send_ns);

/* etcd answered something else (a call succeeded): reachable. */
unsigned efs_session_fsm_reachable(struct efs_session_fsm *f, uint64_t now);

/* The TimeToLive asked for failed (etcd unreachable): ask again on the
 * next sign of life. */
unsigned efs_session_fsm_unreachable(struct efs_session_fsm *f, uint64_t now);

/* TimeToLive answered: the lease is |alive| or gone. */
unsigned efs_session_fsm_ttl(struct efs_session_fsm *f, uint64_t now, bool alive);

/* The lease module reported GONE: -> GONE (GONE, REREGISTER). */
unsigned efs_session_fsm_lost(struct efs_session_fsm *f, uint64_t now);

/* Time passed. */
unsigned efs_session_fsm_tick(struct efs_session_fsm *f, uint64_t now);

/* Left, or failed for good: CLOSED; no action ever again. */
void efs_session_fsm_close(struct efs_session_fsm *f);

/* The next mono time at which efs_session_fsm_tick may act (UINT64_MAX:
 * none: only an input can change anything). */
uint64_t efs_session_fsm_next_ns(const struct efs_session_fsm *f);

/* Deadline of the lease: last acknowledged send + TTL. */
uint64_t efs_session_fsm_deadline_ns(const struct efs_session_fsm *f);

/* True when new operations should fail at once with EIO (see above). */
bool efs_session_fsm_fail_fast(const struct efs_session_fsm *f);

/*
 * Restart takeover (efs_session_start): may this daemon revoke the lease of
 * an n/<node> record it found? |old| comes from the record, |me| from this
 * process (its pid and pid_start unused); |pid_running| says whether the
 * record's pid runs here and |running_start| is that process's start time
 * (0: unknown). True only when the machine ids match and:
 *   - the record has no boot id (an older writer): the pid is not running;
 *   - else the boot ids match, the pid namespaces match (containers of one
 *     image on one host share machine id and boot id, not pid numbers),
 *     and the pid is not running or runs with a start time that differs
 *     from the recorded one (both known: the pid was reused).
 * Pure: no I/O.
 */
struct efs_session_owner {
	const char *machine_id;
	const char *boot_id; /* "" or NULL: unknown (an older writer) */
	uint64_t pid_ns;     /* inode of /proc/<pid>/ns/pid (0: unknown) */
	int32_t pid;
	uint64_t pid_start; /* field 22 of /proc/<pid>/stat (0: unknown) */
};
bool efs_session_may_take_over(const struct efs_session_owner *old,
			       const struct efs_session_owner *me, bool pid_running,
			       uint64_t running_start);
