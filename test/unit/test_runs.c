/* SPDX-License-Identifier: Apache-2.0 */
/* Block run lists (lib/space/runs.h), targeted and against a bitmap. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "space/runs.h"
#include "util/mem.h"

TestSuite(runs, .timeout = 30);

static void assert_runs(const struct efs_runs *r, const uint64_t (*want)[2], size_t n)
{
	cr_assert_eq(r->n, n, "%zu runs, want %zu", r->n, n);
	for (size_t i = 0; i < n; i++)
		cr_assert(r->v[i].start == want[i][0] && r->v[i].len == want[i][1],
			  "run %zu: [%lu, +%lu), want [%lu, +%lu)", i, (unsigned long)r->v[i].start,
			  (unsigned long)r->v[i].len, (unsigned long)want[i][0],
			  (unsigned long)want[i][1]);
}

Test(runs, add_merges_into_the_last_run_only)
{
	static const uint64_t want[][2] = {{10, 10}, {5, 5}, {30, 1}};
	struct efs_runs r = {0};

	cr_assert_eq(efs_runs_add(&r, 10, 5), 0);
	cr_assert_eq(efs_runs_add(&r, 15, 5), 0); /* continues: merged */
	cr_assert_eq(efs_runs_add(&r, 7, 0), 0);  /* nothing */
	cr_assert_eq(efs_runs_add(&r, 5, 5), 0);  /* before: not merged */
	cr_assert_eq(efs_runs_add(&r, 30, 1), 0);
	cr_assert_eq(efs_runs_add(&r, UINT64_MAX - 1, 5), -EINVAL);
	assert_runs(&r, want, 3);
	cr_assert_eq(efs_runs_total(&r), 16);
	efs_runs_clear(&r);
	cr_assert_eq(r.n, 0);
	cr_assert_eq(efs_runs_total(&r), 0);
	efs_runs_done(&r);
	cr_assert(r.v == NULL && r.n == 0 && r.cap == 0);
	efs_test_assert_no_leaks();
}

Test(runs, append_and_normalize)
{
	static const uint64_t want[][2] = {{0, 20}, {30, 5}};
	struct efs_runs a = {0}, b = {0};

	cr_assert_eq(efs_runs_add(&a, 10, 5), 0);
	cr_assert_eq(efs_runs_add(&a, 0, 10), 0);
	cr_assert_eq(efs_runs_add(&b, 30, 5), 0);
	cr_assert_eq(efs_runs_add(&b, 15, 5), 0);
	cr_assert_eq(efs_runs_append(&a, &b), 0);
	cr_assert_eq(a.n, 4);
	cr_assert_eq(efs_runs_normalize(&a), 0);
	assert_runs(&a, want, 2);
	/* A block listed twice. */
	cr_assert_eq(efs_runs_add(&a, 19, 2), 0);
	cr_assert_eq(efs_runs_normalize(&a), -EUCLEAN);
	cr_assert_eq(a.n, 3);
	cr_assert(a.v[0].start == 0 && a.v[1].start == 19 && a.v[2].start == 30);
	efs_runs_done(&a);
	efs_runs_done(&b);
	efs_test_assert_no_leaks();
}

Test(runs, subtract_splits_trims_and_removes)
{
	static const uint64_t split[][2] = {{0, 4}, {6, 4}, {20, 10}, {40, 10}};
	static const uint64_t trimmed[][2] = {{0, 4}, {6, 2}, {25, 5}, {40, 10}};
	static const uint64_t removed[][2] = {{0, 4}, {45, 5}};
	static const uint64_t cut[][2] = {{4, 2}, {8, 2}, {20, 5}, {6, 2}, {25, 5}, {40, 5}};
	struct efs_runs r = {0}, c = {0};

	cr_assert_eq(efs_runs_add(&r, 0, 10), 0);
	cr_assert_eq(efs_runs_add(&r, 20, 10), 0);
	cr_assert_eq(efs_runs_add(&r, 40, 10), 0);
	cr_assert_eq(efs_runs_subtract(&r, 4, 2, &c), 0);
	assert_runs(&r, split, 4);
	cr_assert_eq(efs_runs_subtract(&r, 8, 17, &c), 0); /* tail of one, head of next */
	assert_runs(&r, trimmed, 4);
	cr_assert_eq(efs_runs_subtract(&r, 5, 40, &c), 0); /* removes two, trims one */
	assert_runs(&r, removed, 2);
	cr_assert_eq(efs_runs_subtract(&r, 100, 10, NULL), 0);
	cr_assert_eq(efs_runs_subtract(&r, 0, 0, NULL), 0);
	assert_runs(&r, removed, 2);
	assert_runs(&c, cut, 6);
	cr_assert(efs_runs_overlaps(&r, 3, 1));
	cr_assert(!efs_runs_overlaps(&r, 4, 41));
	cr_assert(efs_runs_overlaps(&r, 4, 42));
	cr_assert(!efs_runs_overlaps(&r, 0, 0));
	cr_assert(!efs_runs_overlaps(&r, 50, 100));
	efs_runs_done(&r);
	efs_runs_done(&c);
	efs_test_assert_no_leaks();
}

Test(runs, enomem_leaves_lists_unchanged)
{
	struct efs_runs r = {0};

	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_add(&r, 1, 1), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(r.n, 0);
	cr_assert_eq(efs_runs_add(&r, 0, 10), 0);
	while (r.n < r.cap)
		cr_assert_eq(efs_runs_add(&r, r.v[r.n - 1].start + 20, 1), 0);
	size_t n = r.n;

	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_subtract(&r, 2, 2, NULL), -ENOMEM); /* needs room to split */
	cr_assert_eq(efs_runs_add(&r, 1000, 1), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(r.n, n);
	cr_assert(r.v[0].start == 0 && r.v[0].len == 10);
	efs_runs_done(&r);
	efs_test_assert_no_leaks();
}

/* ---- Sorted insertion, removal and splitting ---- */

Test(runs, first_after_finds_the_run_ending_past_a_block)
{
	struct efs_runs r = {0};

	cr_assert_eq(efs_runs_first_after(&r, 0), 0);
	cr_assert_eq(efs_runs_add(&r, 10, 5), 0);
	cr_assert_eq(efs_runs_add(&r, 20, 5), 0);
	cr_assert_eq(efs_runs_first_after(&r, 0), 0);
	cr_assert_eq(efs_runs_first_after(&r, 14), 0);
	cr_assert_eq(efs_runs_first_after(&r, 15), 1); /* run 0 ends at 15 */
	cr_assert_eq(efs_runs_first_after(&r, 24), 1);
	cr_assert_eq(efs_runs_first_after(&r, 25), 2);
	efs_runs_done(&r);
	efs_test_assert_no_leaks();
}

Test(runs, insert_keeps_order_and_merges_both_sides)
{
	static const uint64_t want1[][2] = {{0, 5}, {10, 5}, {20, 5}};
	static const uint64_t want2[][2] = {{0, 25}};
	struct efs_runs r = {0}, src = {0};

	cr_assert_eq(efs_runs_insert(&r, 20, 5), 0);
	cr_assert_eq(efs_runs_insert(&r, 0, 5), 0);
	cr_assert_eq(efs_runs_insert(&r, 10, 5), 0);
	cr_assert_eq(efs_runs_insert(&r, 99, 0), 0); /* nothing */
	assert_runs(&r, want1, 3);
	cr_assert_eq(efs_runs_add(&src, 15, 5), 0); /* joins runs 1 and 2 */
	cr_assert_eq(efs_runs_add(&src, 5, 5), 0);  /* joins runs 0 and 1 */
	cr_assert_eq(efs_runs_insert_all(&r, &src), 0);
	assert_runs(&r, want2, 1);
	efs_runs_done(&r);
	efs_runs_done(&src);
	efs_test_assert_no_leaks();
}

Test(runs, insert_enomem_leaves_the_list_unchanged_and_merges_need_no_memory)
{
	static const uint64_t want[][2] = {{0, 10}};
	struct efs_runs r = {0};

	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_insert(&r, 5, 5), -ENOMEM);
	cr_assert_eq(r.n, 0);
	efs_mem_fail_reset();
	cr_assert_eq(efs_runs_insert(&r, 5, 5), 0);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_insert(&r, 0, 5), 0); /* a merge */
	assert_runs(&r, want, 1);
	while (r.n < r.cap) {
		efs_mem_fail_reset();
		cr_assert_eq(efs_runs_insert(&r, r.v[r.n - 1].start + 20, 1), 0);
	}
	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_insert(&r, 100000, 1), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(r.n, r.cap);
	cr_assert(r.v[0].start == 0 && r.v[0].len == 10);
	efs_runs_done(&r);
	efs_test_assert_no_leaks();
}

Test(runs, remove_all_cuts_what_it_removes)
{
	static const uint64_t want_r[][2] = {{0, 2}, {4, 4}, {12, 3}};
	static const uint64_t want_cut[][2] = {{2, 2}, {8, 2}, {20, 5}};
	struct efs_runs r = {0}, src = {0}, cut = {0};

	cr_assert_eq(efs_runs_add(&r, 0, 10), 0);
	cr_assert_eq(efs_runs_add(&r, 12, 3), 0);
	cr_assert_eq(efs_runs_add(&r, 20, 5), 0);
	cr_assert_eq(efs_runs_add(&src, 2, 2), 0);
	cr_assert_eq(efs_runs_add(&src, 8, 3), 0); /* 10 is not in |r| */
	cr_assert_eq(efs_runs_add(&src, 18, 10), 0);
	cr_assert_eq(efs_runs_remove_all(&r, &src, &cut), 0);
	assert_runs(&r, want_r, 3);
	assert_runs(&cut, want_cut, 3);
	cr_assert_eq(efs_runs_remove_all(&r, &src, NULL), 0); /* already gone */
	assert_runs(&r, want_r, 3);
	efs_runs_done(&r);
	efs_runs_done(&src);
	efs_runs_done(&cut);
	efs_test_assert_no_leaks();
}

Test(runs, split_sorts_a_range_into_in_and_out)
{
	static const uint64_t want_in[][2] = {{5, 5}, {20, 2}};
	static const uint64_t want_out[][2] = {{3, 2}, {10, 10}};
	struct efs_runs set = {0}, in = {0}, out = {0};

	cr_assert_eq(efs_runs_add(&set, 0, 10), 0);
	cr_assert_eq(efs_runs_add(&set, 20, 10), 0);
	cr_assert_eq(efs_runs_split(&set, 5, 17, &in, &out), 0);
	cr_assert_eq(efs_runs_split(&set, 3, 2, &out, &out), 0);
	cr_assert_eq(efs_runs_normalize(&out), 0);
	assert_runs(&in, want_in, 2);
	assert_runs(&out, want_out, 2);
	efs_runs_clear(&in);
	cr_assert_eq(efs_runs_split(&set, 40, 5, &in, &in), 0); /* past the set: out */
	cr_assert_eq(in.n, 1);
	cr_assert(in.v[0].start == 40 && in.v[0].len == 5);
	efs_runs_done(&set);
	efs_runs_done(&in);
	efs_runs_done(&out);
	efs_test_assert_no_leaks();
}

/* The data path reserves room so that settling a committed publication
 * (removing its runs from the pending lists) cannot fail: with room for
 * n + k runs, inserting up to the room and removing k runs allocate nothing. */
Test(runs, reserved_room_makes_inserts_and_removals_non_allocating)
{
	struct efs_runs r = {0}, src = {0};
	unsigned long failed;

	cr_assert_eq(efs_runs_add(&r, 0, 100), 0);
	cr_assert_eq(efs_runs_add(&r, 200, 100), 0);
	for (uint64_t b = 10; b < 100; b += 20)
		cr_assert_eq(efs_runs_add(&src, b, 5), 0); /* each splits a run */
	cr_assert_eq(efs_runs_reserve(&r, r.n + 3 + src.n), 0);
	cr_assert_eq(efs_runs_reserve(&r, 1), 0); /* never shrinks */
	cr_assert_geq(r.cap, 2 + 3 + src.n);
	failed = efs_mem_failures();
	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_insert(&r, 1000, 1), 0);
	cr_assert_eq(efs_runs_insert(&r, 2000, 1), 0);
	cr_assert_eq(efs_runs_insert(&r, 3000, 1), 0);
	cr_assert_eq(efs_runs_remove_all(&r, &src, NULL), 0);
	efs_mem_fail_reset();
	cr_assert_eq(efs_mem_failures(), failed, "an allocation was tried");
	cr_assert_eq(r.n, 2 + 3 + src.n);
	cr_assert_eq(efs_runs_total(&r), 200 + 3 - 5 * src.n);
	/* Without the room, the same removal reports ENOMEM. */
	efs_runs_done(&r);
	cr_assert_eq(efs_runs_add(&r, 0, 100), 0);
	while (r.n < r.cap)
		cr_assert_eq(efs_runs_add(&r, r.v[r.n - 1].start + 200, 1), 0);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_runs_remove_all(&r, &src, NULL), -ENOMEM);
	efs_mem_fail_reset();
	efs_runs_done(&r);
	efs_runs_done(&src);
	efs_test_assert_no_leaks();
}

/* ---- Randomised against a bitmap ---- */

#define NB 2048

static uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* |r| is normalized and lists exactly the set bits of |bm|. */
static void check_bitmap(const struct efs_runs *r, const bool *bm, unsigned seed)
{
	size_t k = 0;
	uint64_t total = 0;

	for (size_t i = 0; i < r->n; i++) {
		cr_assert_gt(r->v[i].len, 0, "seed %u", seed);
		cr_assert(i == 0 || r->v[i - 1].start + r->v[i - 1].len < r->v[i].start,
			  "seed %u: runs %zu, %zu not sorted and merged", seed, i - 1, i);
	}
	for (uint64_t b = 0; b < NB; b++) {
		while (k < r->n && r->v[k].start + r->v[k].len <= b)
			k++;
		cr_assert_eq(k < r->n && r->v[k].start <= b, bm[b], "seed %u: block %lu", seed,
			     (unsigned long)b);
		total += bm[b];
	}
	cr_assert_eq(efs_runs_total(r), total, "seed %u", seed);
}

static void run_random(unsigned seed)
{
	static bool bm[NB], cutbm[NB];
	struct efs_runs r = {0}, cut = {0}, add = {0};
	uint64_t s = 0x2545f4914f6cdd1dull ^ seed;

	memset(bm, 0, sizeof(bm));
	for (int it = 0; it < 2000; it++) {
		uint64_t st = xs(&s) % NB, len = 1 + xs(&s) % 64;
		bool overlap = false;

		if (st + len > NB)
			len = NB - st;
		if (xs(&s) % 2) {
			/* Add unsorted runs, then normalize. */
			efs_runs_clear(&add);
			for (int k = 0; k < 3; k++) {
				uint64_t a = xs(&s) % NB, n = 1 + xs(&s) % 16;

				if (a + n > NB)
					n = NB - a;
				cr_assert_eq(efs_runs_add(&add, a, n), 0);
			}
			for (size_t k = 0; k < add.n; k++)
				for (uint64_t b = add.v[k].start; b < add.v[k].start + add.v[k].len;
				     b++) {
					overlap |= bm[b];
					for (size_t q = 0; q < k; q++)
						overlap |= b >= add.v[q].start &&
							   b < add.v[q].start + add.v[q].len;
				}
			cr_assert_eq(efs_runs_append(&r, &add), 0);
			int e = efs_runs_normalize(&r);

			if (overlap) {
				cr_assert_eq(e, -EUCLEAN, "seed %u op %d", seed, it);
				/* Start over from the bitmap minus what we added. */
				efs_runs_clear(&r);
				for (uint64_t b = 0; b < NB; b++)
					if (bm[b])
						cr_assert_eq(efs_runs_add(&r, b, 1), 0);
			} else {
				cr_assert_eq(e, 0, "seed %u op %d", seed, it);
				for (size_t k = 0; k < add.n; k++)
					for (uint64_t b = add.v[k].start;
					     b < add.v[k].start + add.v[k].len; b++)
						bm[b] = true;
			}
		} else {
			bool any = false;

			for (uint64_t b = st; b < st + len; b++)
				any |= bm[b];
			cr_assert_eq(efs_runs_overlaps(&r, st, len), any, "seed %u op %d", seed,
				     it);
			efs_runs_clear(&cut);
			cr_assert_eq(efs_runs_subtract(&r, st, len, &cut), 0);
			memset(cutbm, 0, sizeof(cutbm));
			for (uint64_t b = st; b < st + len; b++) {
				cutbm[b] = bm[b];
				bm[b] = false;
			}
			check_bitmap(&cut, cutbm, seed);
		}
		check_bitmap(&r, bm, seed);
	}
	efs_runs_done(&r);
	efs_runs_done(&cut);
	efs_runs_done(&add);
}

Test(runs, random_against_a_bitmap)
{
	run_random(1);
	run_random(2);
	run_random((unsigned)time(NULL));
	efs_test_assert_no_leaks();
}
