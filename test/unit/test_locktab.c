/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock table: lookup, pins, LRU order, the cache bound, batch
 * selection of idle locks and kernel-cache deadlines, detached entries.
 */
#include <errno.h>
#include <stdint.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "lock/locktab.h"
#include "util/clock.h"
#include "util/mem.h"

TestSuite(locktab, .fini = efs_mem_fail_reset, .timeout = 10);

#define MS(x) ((uint64_t)(x) * EFS_NSEC_PER_MSEC)
#define IDLE  MS(5000)

static struct efs_locktab_entry *add_held(struct efs_locktab *t, uint64_t ino, uint64_t now)
{
	struct efs_locktab_entry *e = NULL;

	cr_assert_eq(efs_locktab_add(t, ino, now, &e), 0);
	cr_assert_eq(e->state, EFS_LOCKTAB_ACQUIRING);
	e->state = EFS_LOCKTAB_HELD;
	e->mode = 2;
	return e;
}

static size_t sel(struct efs_locktab *t, uint64_t now, struct efs_locktab_entry **out, size_t max)
{
	struct efs_locktab_sel s = {.now = now, .idle_ns = IDLE};

	return efs_locktab_select(t, &s, out, max);
}

Test(locktab, add_find_remove_and_grow)
{
	struct efs_locktab t;
	struct efs_locktab_entry *e;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	for (uint64_t ino = 1; ino <= 1000; ino++)
		add_held(&t, ino * 7, ino);
	cr_assert_eq(t.count, 1000);
	cr_assert_geq(t.nbuckets, 1000);
	cr_assert_eq(efs_locktab_add(&t, 7, 0, &e), -EEXIST);
	for (uint64_t ino = 1; ino <= 1000; ino++) {
		e = efs_locktab_find(&t, ino * 7);
		cr_assert_not_null(e);
		cr_assert_eq(e->ino, ino * 7);
		cr_assert_null(efs_locktab_find(&t, ino * 7 + 1));
	}
	for (uint64_t ino = 1; ino <= 1000; ino += 2)
		efs_locktab_remove(&t, efs_locktab_find(&t, ino * 7));
	cr_assert_eq(t.count, 500);
	cr_assert_null(efs_locktab_find(&t, 7));
	cr_assert_not_null(efs_locktab_find(&t, 14));
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, add_fails_cleanly_without_memory)
{
	struct efs_locktab t;
	struct efs_locktab_entry *e = NULL;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_locktab_add(&t, 5, 0, &e), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_null(e);
	cr_assert_eq(t.count, 0);
	cr_assert_null(efs_locktab_find(&t, 5));
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, idle_unpinned_are_chosen_oldest_first)
{
	struct efs_locktab t;
	struct efs_locktab_entry *out[8];
	struct efs_locktab_entry *a, *b, *c;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	a = add_held(&t, 10, MS(0));
	b = add_held(&t, 11, MS(100));
	c = add_held(&t, 12, MS(200));
	cr_assert_eq(sel(&t, MS(4999), out, 8), 0);
	cr_assert_eq(sel(&t, MS(5100), out, 8), 2);
	cr_assert_eq(out[0], a);
	cr_assert_eq(out[1], b);
	/* A use moves it to the newest end. */
	efs_locktab_touch(&t, a, MS(3000));
	cr_assert_eq(sel(&t, MS(5300), out, 8), 2);
	cr_assert_eq(out[0], b);
	cr_assert_eq(out[1], c);
	cr_assert_eq(efs_locktab_first(&t), b);
	cr_assert_eq(efs_locktab_next(&t, b), c);
	cr_assert_eq(efs_locktab_next(&t, c), a);
	cr_assert_null(efs_locktab_next(&t, a));
	/* Batches are bounded. */
	cr_assert_eq(sel(&t, MS(9000), out, 2), 2);
	cr_assert_eq(out[0], b);
	cr_assert_eq(out[1], c);
	cr_assert_eq(efs_locktab_next_idle_ns(&t, IDLE, MS(5300)), MS(5300));
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, pinned_and_busy_are_never_chosen)
{
	struct efs_locktab t;
	struct efs_locktab_entry *out[8];
	struct efs_locktab_entry *a, *b, *c;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	a = add_held(&t, 1, MS(0));
	b = add_held(&t, 2, MS(0));
	c = add_held(&t, 3, MS(0));
	efs_locktab_pin(&t, a, MS(0));
	efs_locktab_pin(&t, a, MS(0));
	b->state = EFS_LOCKTAB_ACQUIRING;
	cr_assert_eq(sel(&t, MS(6000), out, 8), 1);
	cr_assert_eq(out[0], c);
	/* Unpinned: it was used at the unpin, so idle from then on. */
	efs_locktab_unpin(&t, a, MS(1000));
	cr_assert_eq(a->pins, 1);
	efs_locktab_unpin(&t, a, MS(2000));
	cr_assert_eq(a->pins, 0);
	cr_assert_eq(sel(&t, MS(6500), out, 8), 1);
	cr_assert_eq(out[0], c);
	cr_assert_eq(sel(&t, MS(7000), out, 8), 2);
	cr_assert_eq(out[0], c);
	cr_assert_eq(out[1], a);
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, kernel_cache_deadline_is_respected)
{
	struct efs_locktab t;
	struct efs_locktab_entry *out[8];
	struct efs_locktab_entry *a, *b;
	struct efs_locktab_sel all = {.now = MS(6000), .idle_ns = IDLE, .ignore_kcache = true};

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	a = add_held(&t, 1, MS(0));
	b = add_held(&t, 2, MS(0));
	efs_locktab_note_kcache(a, MS(8000));
	efs_locktab_note_kcache(a, MS(7000)); /* an earlier one does not shorten it */
	cr_assert_eq(a->kcache_until_ns, MS(8000));
	cr_assert_eq(sel(&t, MS(6000), out, 8), 1);
	cr_assert_eq(out[0], b);
	cr_assert_eq(sel(&t, MS(7999), out, 8), 1);
	cr_assert_eq(sel(&t, MS(8000), out, 8), 2);
	cr_assert_eq(out[0], a);
	/* After invalidation the deadline no longer holds a release back. */
	cr_assert_eq(efs_locktab_select(&t, &all, out, 8), 2);
	/* The timer: a waits for its kernel cache, b is idle at 5 s. */
	b->state = EFS_LOCKTAB_RELEASING;
	cr_assert_eq(efs_locktab_next_idle_ns(&t, IDLE, MS(1000)), MS(8000));
	b->state = EFS_LOCKTAB_HELD;
	cr_assert_eq(efs_locktab_next_idle_ns(&t, IDLE, MS(1000)), MS(5000));
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, over_the_bound_releases_the_oldest_even_if_not_idle)
{
	struct efs_locktab t;
	struct efs_locktab_entry *out[8];
	struct efs_locktab_entry *e[6];

	cr_assert_eq(efs_locktab_init(&t, 4), 0);
	for (int i = 0; i < 6; i++)
		e[i] = add_held(&t, 100 + (uint64_t)i, MS(i * 10));
	/* Nothing idle, two over the bound: the two oldest. */
	cr_assert_eq(sel(&t, MS(100), out, 8), 2);
	cr_assert_eq(out[0], e[0]);
	cr_assert_eq(out[1], e[1]);
	/* The oldest is pinned: the next ones cover the excess. */
	efs_locktab_pin(&t, e[0], MS(1));
	cr_assert_eq(sel(&t, MS(100), out, 8), 2);
	cr_assert_eq(out[0], e[1]);
	cr_assert_eq(out[1], e[2]);
	/* A kernel-cache deadline also holds one back. */
	efs_locktab_note_kcache(e[1], MS(1000));
	cr_assert_eq(sel(&t, MS(100), out, 8), 2);
	cr_assert_eq(out[0], e[2]);
	cr_assert_eq(out[1], e[3]);
	/* With everything idle, the idle ones all go (bounded by |max|). */
	cr_assert_eq(sel(&t, MS(20000), out, 8), 5);
	cr_assert_eq(sel(&t, MS(20000), out, 3), 3);
	/* Within the bound and not idle: nothing. */
	efs_locktab_remove(&t, e[4]);
	efs_locktab_remove(&t, e[5]);
	cr_assert_eq(t.count, 4);
	cr_assert_eq(sel(&t, MS(100), out, 8), 0);
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, release_all_selection)
{
	struct efs_locktab t;
	struct efs_locktab_entry *out[8];
	struct efs_locktab_sel all = {.now = MS(1), .idle_ns = IDLE, .all = true};
	struct efs_locktab_entry *a, *b;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	a = add_held(&t, 1, MS(0));
	b = add_held(&t, 2, MS(0));
	efs_locktab_pin(&t, b, MS(0));
	cr_assert_eq(efs_locktab_select(&t, &all, out, 8), 1);
	cr_assert_eq(out[0], a);
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, removed_pinned_entry_lives_until_its_last_unpin)
{
	struct efs_locktab t;
	struct efs_locktab_entry *a, *b, *n;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	a = add_held(&t, 1, MS(0));
	b = add_held(&t, 2, MS(0));
	efs_locktab_pin(&t, a, MS(0));
	efs_locktab_pin(&t, a, MS(0));
	efs_locktab_remove_all(&t);
	cr_assert_eq(t.count, 0);
	cr_assert_null(efs_locktab_find(&t, 1));
	cr_assert_null(efs_locktab_find(&t, 2));
	cr_assert_null(efs_locktab_first(&t));
	(void)b; /* freed: it had no pin */
	cr_assert(a->dead);
	/* A new lock on the same inode is a new entry. */
	n = add_held(&t, 1, MS(1));
	cr_assert_neq(n, a);
	efs_locktab_unpin(&t, a, MS(2));
	cr_assert(a->dead);
	cr_assert_eq(a->pins, 1);
	efs_locktab_unpin(&t, a, MS(3)); /* frees it */
	cr_assert_eq(efs_locktab_find(&t, 1), n);
	cr_assert_eq(t.count, 1);
	/* done() also frees dead entries still pinned. */
	efs_locktab_pin(&t, n, MS(4));
	efs_locktab_remove(&t, n);
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}

Test(locktab, entries_whose_ops_run_are_never_chosen_and_pins_are_counted)
{
	struct efs_locktab t;
	struct efs_locktab_entry *out[8];
	struct efs_locktab_entry *a, *b;
	uint32_t seq;

	cr_assert_eq(efs_locktab_init(&t, 0), 0);
	a = add_held(&t, 1, MS(0));
	b = add_held(&t, 2, MS(0));
	a->prep = true;
	cr_assert_eq(sel(&t, MS(6000), out, 8), 1);
	cr_assert_eq(out[0], b);
	a->prep = false;
	cr_assert_eq(sel(&t, MS(6000), out, 8), 2);
	/* Every pin moves pin_seq, so a preparation can tell it was used. */
	seq = b->pin_seq;
	efs_locktab_pin(&t, b, MS(6000));
	efs_locktab_unpin(&t, b, MS(6000));
	cr_assert_eq(b->pin_seq, seq + 1);
	cr_assert_eq(b->pins, 0);
	efs_locktab_done(&t);
	efs_test_assert_no_leaks();
}
