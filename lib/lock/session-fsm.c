/* SPDX-License-Identifier: Apache-2.0 */
#include "lock/session-fsm.h"

#include <stdint.h>
#include <string.h>

void efs_session_fsm_init(struct efs_session_fsm *f, uint64_t ttl_ns, uint64_t suspend_ns,
			  uint64_t quorum_loss_ns)
{
	*f = (struct efs_session_fsm){0};
	f->state = EFS_SESSION_STARTING;
	f->ttl_ns = ttl_ns;
	f->suspend_ns = suspend_ns < ttl_ns ? suspend_ns : ttl_ns / 2;
	f->quorum_loss_ns = quorum_loss_ns;
}

static bool is_waiting_state(enum efs_session_state st)
{
	return st == EFS_SESSION_SUSPENDED || st == EFS_SESSION_EXPIRED || st == EFS_SESSION_GONE;
}

unsigned efs_session_fsm_registered(struct efs_session_fsm *f, uint64_t now, uint64_t granted_ns)
{
	if (f->state != EFS_SESSION_STARTING && f->state != EFS_SESSION_GONE)
		return 0;
	f->state = EFS_SESSION_ACTIVE;
	f->last_ack_ns = granted_ns;
	f->ttl_pending = false;
	f->failing = false;
	return EFS_SFSM_A_ACTIVATED;
}

/*
 * etcd answered: while not ACTIVE this ends failing fast (the bound starts
 * again from now) and, while SUSPENDED or EXPIRED, asks whether the lease
 * still lives.
 */
static unsigned heard_from_etcd(struct efs_session_fsm *f, uint64_t now)
{
	unsigned a = 0;

	if (!is_waiting_state(f->state))
		return 0;
	if (f->failing) {
		f->failing = false;
		f->wait_from_ns = now;
	}
	if (f->state != EFS_SESSION_GONE && !f->ttl_pending) {
		f->ttl_pending = true;
		a |= EFS_SFSM_A_ASK_TTL;
	}
	return a;
}

unsigned efs_session_fsm_acked(struct efs_session_fsm *f, uint64_t now, uint64_t send_ns)
{
	if (f->state == EFS_SESSION_CLOSED || f->state == EFS_SESSION_STARTING ||
	    f->state == EFS_SESSION_GONE)
		return 0;
	if (send_ns > f->last_ack_ns)
		f->last_ack_ns = send_ns;
	return heard_from_etcd(f, now);
}

unsigned efs_session_fsm_reachable(struct efs_session_fsm *f, uint64_t now)
{
	return heard_from_etcd(f, now);
}

unsigned efs_session_fsm_unreachable(struct efs_session_fsm *f, uint64_t now)
{
	(void)now;
	f->ttl_pending = false;
	return 0;
}

static unsigned go_gone(struct efs_session_fsm *f, uint64_t now)
{
	if (f->state == EFS_SESSION_GONE || f->state == EFS_SESSION_CLOSED ||
	    f->state == EFS_SESSION_STARTING)
		return 0;
	if (f->state == EFS_SESSION_ACTIVE) {
		/* Lost without a suspension first (revoked by someone): the
		 * waiting bound starts now. */
		f->wait_from_ns = now;
	}
	f->state = EFS_SESSION_GONE;
	f->ttl_pending = false;
	return EFS_SFSM_A_GONE | EFS_SFSM_A_REREGISTER;
}

unsigned efs_session_fsm_ttl(struct efs_session_fsm *f, uint64_t now, bool alive)
{
	unsigned a;

	f->ttl_pending = false;
	if (!alive)
		return go_gone(f, now);
	if (f->state != EFS_SESSION_SUSPENDED && f->state != EFS_SESSION_EXPIRED)
		return 0;
	a = heard_from_etcd(f, now);
	/* heard_from_etcd asks again since none is pending now; drop that. */
	f->ttl_pending = false;
	a &= ~EFS_SFSM_A_ASK_TTL;
	if (now >= f->last_ack_ns + f->suspend_ns) {
		/* Alive, but renewals are still not acknowledged: resuming
		 * now would suspend again at once. Ask again on the next ack. */
		return a;
	}
	f->state = EFS_SESSION_ACTIVE;
	f->failing = false;
	return a | EFS_SFSM_A_RESUME;
}

unsigned efs_session_fsm_lost(struct efs_session_fsm *f, uint64_t now)
{
	return go_gone(f, now);
}

unsigned efs_session_fsm_tick(struct efs_session_fsm *f, uint64_t now)
{
	unsigned a = 0;

	if (f->state == EFS_SESSION_ACTIVE && now >= f->last_ack_ns + f->suspend_ns) {
		f->state = EFS_SESSION_SUSPENDED;
		f->wait_from_ns = now;
		f->failing = false;
		a |= EFS_SFSM_A_SUSPEND;
	}
	if (f->state == EFS_SESSION_SUSPENDED && now >= f->last_ack_ns + f->ttl_ns) {
		f->state = EFS_SESSION_EXPIRED;
		a |= EFS_SFSM_A_EXPIRE;
	}
	if (is_waiting_state(f->state) && !f->failing &&
	    now >= f->wait_from_ns + f->quorum_loss_ns) {
		f->failing = true;
		a |= EFS_SFSM_A_FAIL_WAITERS;
	}
	return a;
}

void efs_session_fsm_close(struct efs_session_fsm *f)
{
	f->state = EFS_SESSION_CLOSED;
	f->ttl_pending = false;
	f->failing = false;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

uint64_t efs_session_fsm_next_ns(const struct efs_session_fsm *f)
{
	uint64_t next = UINT64_MAX;

	if (f->state == EFS_SESSION_ACTIVE)
		return f->last_ack_ns + f->suspend_ns;
	if (!is_waiting_state(f->state))
		return UINT64_MAX;
	if (f->state == EFS_SESSION_SUSPENDED)
		next = f->last_ack_ns + f->ttl_ns;
	if (!f->failing)
		next = min_u64(next, f->wait_from_ns + f->quorum_loss_ns);
	return next;
}

uint64_t efs_session_fsm_deadline_ns(const struct efs_session_fsm *f)
{
	return f->last_ack_ns + f->ttl_ns;
}

bool efs_session_fsm_fail_fast(const struct efs_session_fsm *f)
{
	return f->failing && is_waiting_state(f->state);
}

bool efs_session_may_take_over(const struct efs_session_owner *old,
			       const struct efs_session_owner *me, bool pid_running,
			       uint64_t running_start)
{
	if (!old->machine_id || !me->machine_id || strcmp(old->machine_id, me->machine_id) != 0)
		return false;
	if (old->pid <= 0)
		return false;
	if (!old->boot_id || !old->boot_id[0])
		return !pid_running; /* written by an older version */
	if (!me->boot_id || strcmp(old->boot_id, me->boot_id) != 0)
		return false;
	if (old->pid_ns != me->pid_ns)
		return false; /* the pid names a process of another namespace */
	if (!pid_running)
		return true;
	/* The pid runs: a different process only when both start times are
	 * known and differ. */
	return old->pid_start != 0 && running_start != 0 && old->pid_start != running_start;
}
