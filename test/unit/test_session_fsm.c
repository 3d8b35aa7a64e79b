/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The session timing state machine with a fake clock: TTL 2 s, suspension
 * at TTL/2, quorum-loss bound 5 s.
 */
#include <stdint.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "lock/session-fsm.h"
#include "util/clock.h"

TestSuite(session_fsm, .timeout = 10);

#define MS(x) ((uint64_t)(x) * EFS_NSEC_PER_MSEC)
#define T0    MS(1000000) /* an arbitrary mono start */

static struct efs_session_fsm f;

static void start(void)
{
	efs_session_fsm_init(&f, MS(2000), MS(1000), MS(5000));
	cr_assert_eq(f.state, EFS_SESSION_STARTING);
	cr_assert_eq(efs_session_fsm_registered(&f, T0, T0), EFS_SFSM_A_ACTIVATED);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
}

/* Suspends at T0 + 1 s (no ack after the grant). */
static void suspend(void)
{
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(1000));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(999)), 0);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(1000)), EFS_SFSM_A_SUSPEND);
	cr_assert_eq(f.state, EFS_SESSION_SUSPENDED);
}

Test(session_fsm, renewals_keep_it_active)
{
	start();
	for (int i = 1; i <= 20; i++) {
		uint64_t now = T0 + MS(333 * i);

		cr_assert_eq(efs_session_fsm_acked(&f, now, now - MS(5)), 0);
		cr_assert_eq(efs_session_fsm_tick(&f, now + MS(100)), 0);
	}
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	cr_assert_eq(efs_session_fsm_deadline_ns(&f), T0 + MS(333 * 20 - 5 + 2000));
	efs_test_assert_no_leaks();
}

Test(session_fsm, renewal_acked_just_in_time_stays_active)
{
	start();
	/* Acked at T0 + 999 ms for a renewal sent at T0 + 300 ms. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(999), T0 + MS(300)), 0);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(1000)), 0);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(1300));
	/* An older ack arriving late does not move the deadline back. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1001), T0 + MS(100)), 0);
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(1300));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(1300)), EFS_SFSM_A_SUSPEND);
	efs_test_assert_no_leaks();
}

Test(session_fsm, at_risk_suspends_then_expires)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(2000));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(1999)), 0);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2000)), EFS_SFSM_A_EXPIRE);
	cr_assert_eq(f.state, EFS_SESSION_EXPIRED);
	cr_assert_eq(efs_session_fsm_deadline_ns(&f), T0 + MS(2000));
	efs_test_assert_no_leaks();
}

Test(session_fsm, late_tick_suspends_and_expires_at_once)
{
	start();
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2500)),
		     EFS_SFSM_A_SUSPEND | EFS_SFSM_A_EXPIRE);
	cr_assert_eq(f.state, EFS_SESSION_EXPIRED);
	efs_test_assert_no_leaks();
}

Test(session_fsm, resumes_when_the_lease_lives)
{
	start();
	suspend();
	/* etcd answers again: a renewal sent at 1.2 s is acknowledged. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1250), T0 + MS(1200)), EFS_SFSM_A_ASK_TTL);
	/* One TimeToLive at a time. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1300), T0 + MS(1280)), 0);
	cr_assert_eq(f.state, EFS_SESSION_SUSPENDED);
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(1320), true), EFS_SFSM_A_RESUME);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(2280));
	efs_test_assert_no_leaks();
}

Test(session_fsm, resumes_after_expiry_when_the_lease_lives)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2100)), EFS_SFSM_A_EXPIRE);
	/* A leader election outlasting the deadline: the new leader extended
	 * the lease, so it lives. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(3000), T0 + MS(2900)), EFS_SFSM_A_ASK_TTL);
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(3010), true), EFS_SFSM_A_RESUME);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	efs_test_assert_no_leaks();
}

Test(session_fsm, alive_answer_with_stale_renewals_stays_suspended)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_reachable(&f, T0 + MS(1100)), EFS_SFSM_A_ASK_TTL);
	/* Alive, but no renewal acknowledged since T0: resuming would
	 * suspend again at once. */
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(1150), true), 0);
	cr_assert_eq(f.state, EFS_SESSION_SUSPENDED);
	/* The next ack asks again and resumes. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1300), T0 + MS(1290)), EFS_SFSM_A_ASK_TTL);
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(1310), true), EFS_SFSM_A_RESUME);
	efs_test_assert_no_leaks();
}

Test(session_fsm, gone_then_reregistered)
{
	unsigned a;

	start();
	suspend();
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2000)), EFS_SFSM_A_EXPIRE);
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(4000), T0 + MS(3990)), EFS_SFSM_A_ASK_TTL);
	a = efs_session_fsm_ttl(&f, T0 + MS(4010), false);
	cr_assert_eq(a, EFS_SFSM_A_GONE | EFS_SFSM_A_REREGISTER);
	cr_assert_eq(f.state, EFS_SESSION_GONE);
	/* Late answers about the old lease change nothing. */
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(4020), true), 0);
	cr_assert_eq(efs_session_fsm_lost(&f, T0 + MS(4030)), 0);
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(4040), T0 + MS(4000)), 0);
	cr_assert_eq(f.state, EFS_SESSION_GONE);
	/* The new session. */
	cr_assert_eq(efs_session_fsm_registered(&f, T0 + MS(4200), T0 + MS(4100)),
		     EFS_SFSM_A_ACTIVATED);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	cr_assert_eq(efs_session_fsm_deadline_ns(&f), T0 + MS(6100));
	efs_test_assert_no_leaks();
}

Test(session_fsm, lease_gone_event_while_active)
{
	start();
	cr_assert_eq(efs_session_fsm_lost(&f, T0 + MS(100)),
		     EFS_SFSM_A_GONE | EFS_SFSM_A_REREGISTER);
	cr_assert_eq(f.state, EFS_SESSION_GONE);
	/* The waiting bound starts at the loss. */
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(5100));
	efs_test_assert_no_leaks();
}

Test(session_fsm, quorum_loss_fails_waiters_then_fails_fast)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2000)), EFS_SFSM_A_EXPIRE);
	cr_assert_not(efs_session_fsm_fail_fast(&f));
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(6000));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(5999)), 0);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(6000)), EFS_SFSM_A_FAIL_WAITERS);
	cr_assert(efs_session_fsm_fail_fast(&f));
	/* Once: later ticks do not fail again, and there is nothing to time. */
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(9000)), 0);
	cr_assert_eq(efs_session_fsm_next_ns(&f), UINT64_MAX);
	/* A failed TimeToLive (etcd still away) keeps failing fast. */
	cr_assert_eq(efs_session_fsm_unreachable(&f, T0 + MS(9100)), 0);
	cr_assert(efs_session_fsm_fail_fast(&f));
	/* etcd answers: new operations wait again, for a fresh bound. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(10000), T0 + MS(9990)), EFS_SFSM_A_ASK_TTL);
	cr_assert_not(efs_session_fsm_fail_fast(&f));
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(15000));
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(10010), true), EFS_SFSM_A_RESUME);
	cr_assert_not(efs_session_fsm_fail_fast(&f));
	efs_test_assert_no_leaks();
}

Test(session_fsm, gone_waiters_fail_after_the_bound_from_suspension)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_lost(&f, T0 + MS(2500)),
		     EFS_SFSM_A_GONE | EFS_SFSM_A_REREGISTER);
	/* Re-registration keeps failing: the bound still counts from the
	 * suspension at 1 s. */
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(6000)), EFS_SFSM_A_FAIL_WAITERS);
	cr_assert(efs_session_fsm_fail_fast(&f));
	cr_assert_eq(efs_session_fsm_registered(&f, T0 + MS(7000), T0 + MS(6900)),
		     EFS_SFSM_A_ACTIVATED);
	cr_assert_not(efs_session_fsm_fail_fast(&f));
	efs_test_assert_no_leaks();
}

Test(session_fsm, closed_is_final)
{
	start();
	efs_session_fsm_close(&f);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(10000)), 0);
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(10000), T0 + MS(9999)), 0);
	cr_assert_eq(efs_session_fsm_lost(&f, T0 + MS(10000)), 0);
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(10000), true), 0);
	cr_assert_eq(efs_session_fsm_registered(&f, T0 + MS(10000), T0), 0);
	cr_assert_eq(f.state, EFS_SESSION_CLOSED);
	cr_assert_eq(efs_session_fsm_next_ns(&f), UINT64_MAX);
	efs_test_assert_no_leaks();
}
