/* SPDX-License-Identifier: Apache-2.0 */
/* Block-range locks (lib/fs/file/rangelock.h). */
#include <stdbool.h>
#include <stdint.h>

#include <criterion/criterion.h>

#include "fs/file/rangelock.h"

TestSuite(rangelock, .timeout = 30);

/* A request under test: counts its grants and records their order. */
struct req {
	struct efs_rangelock_req l;
	int granted;
	int order;
};

static int seq;

static void grant_cb(void *arg)
{
	struct req *q = arg;

	q->granted++;
	q->order = ++seq;
}

static int take(struct efs_rangelock *s, struct req *q, uint64_t start, uint64_t end)
{
	q->granted = 0;
	q->order = 0;
	return efs_rangelock_take(s, &q->l, start, end, grant_cb, q);
}

Test(rangelock, disjoint_ranges_are_held_together)
{
	struct efs_rangelock s = {0};
	struct req a, b, c;

	cr_assert_not(efs_rangelock_busy(&s));
	cr_assert_eq(take(&s, &a, 0, 10), 1);
	cr_assert_eq(take(&s, &b, 10, 20), 1); /* [0, 10) and [10, 20) touch only */
	cr_assert_eq(take(&s, &c, 100, UINT64_MAX), 1);
	cr_assert(a.l.held && b.l.held && c.l.held);
	cr_assert_eq(a.granted + b.granted + c.granted, 0); /* granted now: no callback */
	cr_assert(efs_rangelock_busy(&s));
	efs_rangelock_drop(&s, &b.l);
	efs_rangelock_drop(&s, &a.l);
	efs_rangelock_drop(&s, &c.l);
	cr_assert_not(efs_rangelock_busy(&s));
}

Test(rangelock, an_overlapping_request_waits_and_its_release_wakes_it)
{
	struct efs_rangelock s = {0};
	struct req a, b;

	seq = 0;
	cr_assert_eq(take(&s, &a, 0, 10), 1);
	cr_assert_eq(take(&s, &b, 9, 12), 0);
	cr_assert_not(b.l.held);
	cr_assert_eq(b.granted, 0);
	efs_rangelock_drop(&s, &a.l);
	cr_assert_eq(b.granted, 1);
	cr_assert(b.l.held);
	efs_rangelock_drop(&s, &b.l);
	cr_assert_not(efs_rangelock_busy(&s));
	/* Dropping a range that is not held does nothing. */
	efs_rangelock_drop(&s, &b.l);
	cr_assert_eq(b.granted, 1);
}

Test(rangelock, a_request_never_passes_an_earlier_overlapping_waiter)
{
	struct efs_rangelock s = {0};
	struct req a, w1, w2, d;

	seq = 0;
	cr_assert_eq(take(&s, &a, 0, 10), 1);
	cr_assert_eq(take(&s, &w1, 5, 30), 0); /* waits for a */
	/* Overlaps no holder, but the earlier waiter w1: waits behind it. */
	cr_assert_eq(take(&s, &w2, 20, 40), 0);
	/* Overlaps neither: granted at once, passing nobody. */
	cr_assert_eq(take(&s, &d, 50, 60), 1);
	efs_rangelock_drop(&s, &d.l);
	cr_assert_eq(w1.granted + w2.granted, 0);
	efs_rangelock_drop(&s, &a.l);
	cr_assert_eq(w1.granted, 1);
	cr_assert_eq(w2.granted, 0); /* now overlaps the holder w1 */
	efs_rangelock_drop(&s, &w1.l);
	cr_assert_eq(w2.granted, 1);
	cr_assert_lt(w1.order, w2.order);
	efs_rangelock_drop(&s, &w2.l);
	cr_assert_not(efs_rangelock_busy(&s));
}

Test(rangelock, one_release_wakes_every_waiter_it_frees_in_order)
{
	struct efs_rangelock s = {0};
	struct req a, w[3];

	seq = 0;
	cr_assert_eq(take(&s, &a, 0, 100), 1);
	cr_assert_eq(take(&s, &w[0], 0, 10), 0);
	cr_assert_eq(take(&s, &w[1], 10, 20), 0);
	cr_assert_eq(take(&s, &w[2], 90, 100), 0);
	efs_rangelock_drop(&s, &a.l);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(w[i].granted, 1, "waiter %d", i);
		cr_assert_eq(w[i].order, i + 1, "waiter %d granted out of order", i);
		cr_assert(w[i].l.held);
	}
	for (int i = 0; i < 3; i++)
		efs_rangelock_drop(&s, &w[i].l);
	cr_assert_not(efs_rangelock_busy(&s));
}

/* A waiter granted by a drop may take and drop ranges in its callback. */
static struct efs_rangelock *cb_set;
static struct req cb_inner;

static void reentrant_cb(void *arg)
{
	struct req *q = arg;

	q->granted++;
	cr_assert_eq(take(cb_set, &cb_inner, 200, 210), 1);
	efs_rangelock_drop(cb_set, &cb_inner.l);
	efs_rangelock_drop(cb_set, &q->l);
}

Test(rangelock, a_granted_callback_may_take_and_drop_ranges)
{
	struct efs_rangelock s = {0};
	struct req a, b, c;

	cb_set = &s;
	cr_assert_eq(take(&s, &a, 0, 10), 1);
	b.granted = 0;
	cr_assert_eq(efs_rangelock_take(&s, &b.l, 0, 10, reentrant_cb, &b), 0);
	cr_assert_eq(take(&s, &c, 5, 15), 0); /* behind b */
	efs_rangelock_drop(&s, &a.l);
	cr_assert_eq(b.granted, 1);
	cr_assert_not(b.l.held); /* dropped by its own callback */
	cr_assert_eq(c.granted, 1); /* woken by that drop */
	efs_rangelock_drop(&s, &c.l);
	cr_assert_not(efs_rangelock_busy(&s));
}
