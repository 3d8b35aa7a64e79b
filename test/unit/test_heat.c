/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The recall history of the lock cache (lock/heat.h): the adaptive
 * minimum hold (doubling, keeping, halving, the cap, zero), when a recall
 * is due, and contention (the threshold and its expiry).
 */
#include <stdint.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "lock/heat.h"
#include "util/clock.h"

TestSuite(heat, .timeout = 10);

#define MS(x) ((uint64_t)(x) * EFS_NSEC_PER_MSEC)
#define T0    MS(100000) /* an arbitrary start of the monotonic clock */

static struct efs_heat h;

/* A recall of |ino| |after_ms| after its grant at |*now|, which moves on
 * by that much (and as much again, for the next grant). */
static void recall_after(uint64_t ino, uint64_t *now, uint64_t after_ms, bool busy)
{
	efs_heat_note_recall(&h, ino, *now, *now + MS(after_ms), busy);
	*now += 2 * MS(after_ms);
}

Test(heat, a_busy_recall_soon_after_the_grant_doubles_the_hold_up_to_the_cap)
{
	uint64_t now = T0;

	efs_heat_init(&h, MS(20), 0);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(1), "the hold starts at 1 ms");
	recall_after(7, &now, 2, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(2));
	recall_after(7, &now, 2, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(4));
	for (int i = 0; i < 5; i++)
		recall_after(7, &now, 2, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(20), "capped at the maximum");
	/* The window grows with the hold: 2 x 20 ms, at least 50 ms. */
	recall_after(7, &now, 49, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(20));
	cr_assert_eq(efs_heat_hold_ns(&h, 8), MS(1), "another inode keeps its own");
	efs_test_assert_no_leaks();
}

Test(heat, an_idle_recall_within_the_window_keeps_the_hold)
{
	uint64_t now = T0;

	efs_heat_init(&h, MS(20), 0);
	recall_after(7, &now, 1, true);
	recall_after(7, &now, 1, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(4));
	recall_after(7, &now, 30, false);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(4));
	efs_test_assert_no_leaks();
}

Test(heat, a_late_recall_halves_the_hold_and_below_250_us_it_is_zero)
{
	uint64_t now = T0;

	efs_heat_init(&h, MS(20), 0);
	recall_after(7, &now, 1, true);
	recall_after(7, &now, 1, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(4));
	recall_after(7, &now, 51, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(2), "late, even busy: halved");
	recall_after(7, &now, 60, false);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(1));
	recall_after(7, &now, 60, false);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), 500000);
	recall_after(7, &now, 60, false);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), 250000);
	recall_after(7, &now, 60, false);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), 0, "under 250 us: no hold");
	cr_assert_eq(efs_heat_recall_due(&h, 7, now, now, true, now), 0);
	/* A busy recall soon after the grant starts it again at 1 ms. */
	recall_after(7, &now, 1, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(1));
	efs_test_assert_no_leaks();
}

Test(heat, a_recall_is_due_after_the_hold_or_once_the_lock_is_idle)
{
	uint64_t now = T0, g;

	efs_heat_init(&h, MS(20), 0);
	for (int i = 0; i < 3; i++)
		recall_after(7, &now, 1, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), MS(8));
	g = now;
	cr_assert_eq(efs_heat_recall_due(&h, 7, g, g + MS(5), true, g + MS(6)), g + MS(8),
		     "pinned: the whole hold");
	cr_assert_eq(efs_heat_recall_due(&h, 7, g, g + MS(2), false, g + MS(6)), g + MS(3),
		     "idle: 1 ms after its last use");
	cr_assert_eq(efs_heat_recall_due(&h, 7, g, g + 7500000, false, g + MS(8)), g + MS(8),
		     "the hold ends first");
	/* Holds off: always at once. */
	efs_heat_init(&h, 0, 0);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), 0);
	recall_after(7, &now, 1, true);
	cr_assert_eq(efs_heat_hold_ns(&h, 7), 0);
	cr_assert_eq(efs_heat_recall_due(&h, 7, now, now, true, now), 0);
	efs_test_assert_no_leaks();
}

Test(heat, an_inode_recalled_often_within_a_second_is_contended_for_two_seconds)
{
	uint64_t now = T0;

	efs_heat_init(&h, MS(20), 4);
	for (int i = 0; i < 3; i++)
		recall_after(7, &now, 10, false);
	cr_assert_not(efs_heat_contended(&h, 7, now), "3 recalls: not yet");
	recall_after(7, &now, 10, false);
	cr_assert(efs_heat_contended(&h, 7, now), "4 recalls within 1 s");
	cr_assert_eq(efs_heat_count_contended(&h, now), 1);
	cr_assert_eq(efs_heat_recall_due(&h, 7, now, now, true, now), 0,
		     "a contended lock gets no hold");
	cr_assert_not(efs_heat_contended(&h, 8, now));
	/* Each recall renews it, however rare. */
	now += MS(1900);
	recall_after(7, &now, 10, false);
	now += MS(1900);
	cr_assert(efs_heat_contended(&h, 7, now), "renewed by the last recall");
	now += MS(200);
	cr_assert_not(efs_heat_contended(&h, 7, now), "2 s after the last recall it ends");
	cr_assert_eq(efs_heat_count_contended(&h, now), 0);
	efs_test_assert_no_leaks();
}

Test(heat, recalls_spread_over_more_than_a_second_do_not_make_it_contended)
{
	uint64_t now = T0;

	efs_heat_init(&h, MS(20), 4);
	for (int i = 0; i < 12; i++) {
		recall_after(7, &now, 10, false);
		now += MS(400);
	}
	cr_assert_not(efs_heat_contended(&h, 7, now));
	/* Tracking off: never contended. */
	efs_heat_init(&h, MS(20), 0);
	for (int i = 0; i < 40; i++)
		recall_after(7, &now, 1, false);
	cr_assert_not(efs_heat_contended(&h, 7, now));
	efs_test_assert_no_leaks();
}

Test(heat, an_inode_marked_contended_is_so_for_two_seconds_and_keeps_its_hold)
{
	uint64_t now = T0;

	efs_heat_init(&h, MS(20), 16);
	recall_after(9, &now, 10, true); /* busy soon after the grant: 2 ms */
	cr_assert_eq(efs_heat_hold_ns(&h, 9), MS(2));
	efs_heat_mark_contended(&h, 9, now);
	cr_assert(efs_heat_contended(&h, 9, now), "one mark is enough");
	cr_assert_eq(efs_heat_hold_ns(&h, 9), MS(2), "the mark reset the hold");
	cr_assert(efs_heat_contended(&h, 9, now + MS(1999)));
	cr_assert_not(efs_heat_contended(&h, 9, now + MS(2000)));
	cr_assert_not(efs_heat_contended(&h, 10, now), "only the inode marked");
	/* Tracking off: marks do nothing. */
	efs_heat_init(&h, MS(20), 0);
	efs_heat_mark_contended(&h, 9, now);
	cr_assert_not(efs_heat_contended(&h, 9, now));
	efs_test_assert_no_leaks();
}
