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

/* Restart takeover: machine id, boot id and pid namespace, then the pid
 * and its start time. */
static bool may(const char *machine, const char *boot, uint64_t pidns, int32_t pid,
		uint64_t start, bool running, uint64_t running_start)
{
	struct efs_session_owner old = {
		.machine_id = machine,
		.boot_id = boot,
		.pid_ns = pidns,
		.pid = pid,
		.pid_start = start,
	};
	struct efs_session_owner me = {
		.machine_id = "m1",
		.boot_id = "b1",
		.pid_ns = 7,
		.pid = 1234, /* unused */
		.pid_start = 999,
	};

	return efs_session_may_take_over(&old, &me, running, running_start);
}

Test(session_fsm, takeover_needs_same_machine_boot_and_pid_namespace)
{
	/* Another machine: never, even when the pid is not running here. */
	cr_assert_not(may("m2", "b1", 7, 42, 100, false, 0));
	/* Same machine id, another boot id (a host cloned from one image, or
	 * rebooted): never. */
	cr_assert_not(may("m1", "b2", 7, 42, 100, false, 0));
	/* Same machine and boot, another pid namespace (another container of
	 * one image on this host): its pid means nothing here. */
	cr_assert_not(may("m1", "b1", 8, 42, 100, false, 0));
	cr_assert_not(may("m1", "b1", 0, 42, 100, false, 0));
	/* All match and the pid is gone. */
	cr_assert(may("m1", "b1", 7, 42, 100, false, 0));
	/* The pid runs with the recorded start time: the daemon lives. */
	cr_assert_not(may("m1", "b1", 7, 42, 100, true, 100));
	/* The pid was reused by another process. */
	cr_assert(may("m1", "b1", 7, 42, 100, true, 101));
	/* A start time unknown on either side: assume the daemon lives. */
	cr_assert_not(may("m1", "b1", 7, 42, 0, true, 100));
	cr_assert_not(may("m1", "b1", 7, 42, 100, true, 0));
	/* An invalid pid in the record is never taken over. */
	cr_assert_not(may("m1", "b1", 7, 0, 100, false, 0));
	efs_test_assert_no_leaks();
}

Test(session_fsm, takeover_of_an_old_record_keeps_the_old_rule)
{
	struct efs_session_owner me = {.machine_id = "m1", .boot_id = "", .pid_ns = 0};
	struct efs_session_owner old = {.machine_id = "m1", .boot_id = "b1", .pid = 42};

	/* No boot id: written by an older version; machine id + pid only. */
	cr_assert(may("m1", "", 0, 42, 0, false, 0));
	cr_assert(may("m1", NULL, 0, 42, 0, false, 0));
	cr_assert(may("m1", "", 99, 42, 0, false, 0));
	cr_assert_not(may("m1", "", 0, 42, 0, true, 7));
	cr_assert_not(may("m2", "", 0, 42, 0, false, 0));
	/* This daemon cannot read its boot id: a record with one is not its. */
	cr_assert_not(efs_session_may_take_over(&old, &me, false, 0));
	efs_test_assert_no_leaks();
}

/*
 * After a resume the fence re-arms from the send time of the last
 * acknowledged renewal, not from the resume: when renewals stop being
 * acknowledged again the session suspends at last ack + TTL/2 and expires
 * at last ack + TTL, however late the resume came.
 */
Test(session_fsm, resume_rearms_the_fence_from_the_last_acked_send)
{
	start();
	suspend();
	/* Renewal sent at T0 + 1400 ms acknowledged at T0 + 1500 ms. */
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1500), T0 + MS(1400)), EFS_SFSM_A_ASK_TTL);
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(1600), true), EFS_SFSM_A_RESUME);
	cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	/* Nothing acknowledged since: suspend at 1400 + 1000, not 1600 + 1000. */
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(2400));
	cr_assert_eq(efs_session_fsm_deadline_ns(&f), T0 + MS(3400));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2399)), 0);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2400)), EFS_SFSM_A_SUSPEND);
	cr_assert_eq(f.state, EFS_SESSION_SUSPENDED);
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(3400));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(3400)), EFS_SFSM_A_EXPIRE);
	cr_assert_eq(f.state, EFS_SESSION_EXPIRED);
	efs_test_assert_no_leaks();
}

/* A resume that comes just before the fresh ack goes stale leaves the
 * session ACTIVE for the rest of that window only: never past the last
 * acknowledged send + TTL/2, so never serving past the deadline. */
Test(session_fsm, late_resume_is_active_only_until_the_old_ack_goes_stale)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1200), T0 + MS(1100)), EFS_SFSM_A_ASK_TTL);
	/* The TimeToLive answer comes late, 50 ms before the ack goes stale. */
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(2050), true), EFS_SFSM_A_RESUME);
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(2100));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2100)), EFS_SFSM_A_SUSPEND);
	cr_assert(efs_session_fsm_next_ns(&f) <= efs_session_fsm_deadline_ns(&f));
	efs_test_assert_no_leaks();
}

/* Suspend, resume, suspend again, resume again: each cycle measured from
 * its own last acknowledged send; the suspension counters of a second
 * stall are not shortened or lengthened by the first. */
Test(session_fsm, repeated_stalls_each_suspend_on_time)
{
	uint64_t ack = T0;

	start();
	for (int i = 0; i < 3; i++) {
		uint64_t stall = ack + MS(1000);

		cr_assert_eq(efs_session_fsm_next_ns(&f), stall, "cycle %d", i);
		cr_assert_eq(efs_session_fsm_tick(&f, stall - MS(1)), 0, "cycle %d", i);
		cr_assert_eq(efs_session_fsm_tick(&f, stall), EFS_SFSM_A_SUSPEND, "cycle %d", i);
		ack = stall + MS(300);
		cr_assert_eq(efs_session_fsm_acked(&f, ack + MS(50), ack), EFS_SFSM_A_ASK_TTL);
		cr_assert_eq(efs_session_fsm_ttl(&f, ack + MS(100), true), EFS_SFSM_A_RESUME);
		cr_assert_eq(f.state, EFS_SESSION_ACTIVE);
	}
	efs_test_assert_no_leaks();
}

/* Acks that arrive while ACTIVE after a resume move the fence; one that
 * stops leaves the session suspending at that ack + TTL/2. */
Test(session_fsm, acks_after_resume_move_the_fence_then_it_fires)
{
	start();
	suspend();
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1300), T0 + MS(1250)), EFS_SFSM_A_ASK_TTL);
	cr_assert_eq(efs_session_fsm_ttl(&f, T0 + MS(1350), true), EFS_SFSM_A_RESUME);
	cr_assert_eq(efs_session_fsm_acked(&f, T0 + MS(1700), T0 + MS(1600)), 0);
	cr_assert_eq(efs_session_fsm_next_ns(&f), T0 + MS(2600));
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2599)), 0);
	cr_assert_eq(efs_session_fsm_tick(&f, T0 + MS(2600)), EFS_SFSM_A_SUSPEND);
	efs_test_assert_no_leaks();
}
