/* SPDX-License-Identifier: Apache-2.0 */
/* Free maps of lib/space/freemap.h, against a bitmap model. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "meta/records.h"
#include "space/freemap.h"
#include "util/mem.h"

TestSuite(freemap, .fini = efs_mem_fail_reset, .timeout = 60);

/* ---- Helpers ---- */

/* xorshift64*: reproducible from the seed printed on failure. */
static uint64_t rnd_state;

static uint64_t rnd(void)
{
	rnd_state ^= rnd_state >> 12;
	rnd_state ^= rnd_state << 25;
	rnd_state ^= rnd_state >> 27;
	return rnd_state * 2685821657736338717ull;
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* The map's runs are normalized, inside the group, and sum to nfree. */
static void check_normalized(const struct efs_freemap *fm, uint64_t seed)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < fm->free.n; i++) {
		const struct efs_run *x = &fm->free.v[i];

		cr_assert_geq(x->len, 1, "seed %llu: empty run %zu", (unsigned long long)seed, i);
		cr_assert_leq(x->start + x->len, fm->group_blocks, "seed %llu: run %zu outside",
			      (unsigned long long)seed, i);
		if (i > 0)
			cr_assert_gt(x->start, fm->free.v[i - 1].start + fm->free.v[i - 1].len,
				     "seed %llu: runs %zu, %zu unsorted, overlapping or adjacent",
				     (unsigned long long)seed, i - 1, i);
		sum += x->len;
	}
	cr_assert_eq(sum, fm->nfree, "seed %llu: nfree %llu, runs hold %llu",
		     (unsigned long long)seed, (unsigned long long)fm->nfree,
		     (unsigned long long)sum);
}

/* The map holds exactly the free blocks of |model| (true: free). */
static void check_model(const struct efs_freemap *fm, const bool *model, uint64_t seed)
{
	size_t k = 0;

	check_normalized(fm, seed);
	for (uint64_t b = 0; b < fm->group_blocks;) {
		uint64_t e = b;

		if (!model[b]) {
			b++;
			continue;
		}
		while (e < fm->group_blocks && model[e])
			e++;
		cr_assert_lt(k, fm->free.n, "seed %llu: free run at %llu missing",
			     (unsigned long long)seed, (unsigned long long)b);
		cr_assert(fm->free.v[k].start == b && fm->free.v[k].len == e - b,
			  "seed %llu: run %zu is [%llu,+%llu), model [%llu,+%llu)",
			  (unsigned long long)seed, k, (unsigned long long)fm->free.v[k].start,
			  (unsigned long long)fm->free.v[k].len, (unsigned long long)b,
			  (unsigned long long)(e - b));
		k++;
		b = e;
	}
	cr_assert_eq(k, fm->free.n, "seed %llu: extra runs", (unsigned long long)seed);
}

static bool fm_equal(const struct efs_freemap *a, const struct efs_freemap *b)
{
	return a->group_blocks == b->group_blocks && a->nfree == b->nfree &&
	       a->free.n == b->free.n &&
	       (a->free.n == 0 || !memcmp(a->free.v, b->free.v, a->free.n * sizeof(*a->free.v)));
}

/* pack -> efs_meta_ag_map_decode -> from_msg gives the same map. */
static void check_round_trip(const struct efs_freemap *fm, uint64_t seed)
{
	ProtobufCBinaryData buf;
	Etcfs__AgMap *msg;
	struct efs_freemap back;
	const char *why = NULL;

	cr_assert_eq(efs_freemap_pack(fm, &buf), 0);
	cr_assert_eq(efs_meta_ag_map_decode(buf.data, buf.len, &msg, &why), 0,
		     "seed %llu: %s", (unsigned long long)seed, why);
	cr_assert_eq(efs_freemap_from_msg(&back, msg), 0);
	cr_assert(fm_equal(fm, &back), "seed %llu: round trip differs", (unsigned long long)seed);
	efs_freemap_done(&back);
	efs_meta_record_free(msg);
	efs_mem_free(buf.data);
}

/* A map of |gb| blocks whose free runs are the pairs of |runs|. */
static void make(struct efs_freemap *fm, uint64_t gb, const uint64_t *runs, size_t n)
{
	cr_assert_eq(efs_freemap_init(fm, gb), 0);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(efs_freemap_put(fm, runs[2 * i], runs[2 * i + 1]), 0);
}

static void expect_runs(const struct efs_runs *r, const uint64_t *want, size_t n)
{
	cr_assert_eq(r->n, n, "%zu runs, expected %zu", r->n, n);
	for (size_t i = 0; i < n; i++)
		cr_assert(r->v[i].start == want[2 * i] && r->v[i].len == want[2 * i + 1],
			  "run %zu is [%llu,+%llu), expected [%llu,+%llu)", i,
			  (unsigned long long)r->v[i].start, (unsigned long long)r->v[i].len,
			  (unsigned long long)want[2 * i], (unsigned long long)want[2 * i + 1]);
}

/* ---- The model ---- */

/*
 * The allocation rule computed from the bitmap: the free blocks at or after
 * |goal| in address order, wrapping, the first stretch holding |want|
 * (from |goal| when |goal| is inside a free stretch); else the longest
 * stretch, the first of equals in the same order (whole stretches).
 */
static bool model_alloc(const bool *m, uint64_t gb, uint64_t want, uint64_t goal,
			struct efs_run *got)
{
	uint64_t best_s = 0, best_l = 0;

	if (goal >= gb)
		goal = 0;
	/* The stretches, in address order from |goal| (tail first). */
	/* The tail from |goal|, then the stretches after it, then from 0. */
	for (int pass = 0; pass < 2; pass++) {
		for (uint64_t b = pass ? 0 : goal; b < gb;) {
			uint64_t e = b;

			if (!m[b]) {
				b++;
				continue;
			}
			while (e < gb && m[e])
				e++;
			if (e - b >= want) {
				got->start = b;
				got->len = want;
				return true;
			}
			b = e;
		}
	}
	/* From the stretch holding or following |goal|, wrapping. */
	while (m[goal] && goal > 0 && m[goal - 1])
		goal--;
	for (uint64_t k = 0, b; k < gb;) {
		uint64_t e;

		b = (goal + k) % gb;
		if (!m[b] || (b > 0 && m[b - 1] && k > 0)) {
			k++;
			continue;
		}
		e = b;
		while (e < gb && m[e])
			e++;
		if (e - b > best_l) {
			best_s = b;
			best_l = e - b;
		}
		k += e - b;
	}
	if (!best_l)
		return false;
	got->start = best_s;
	got->len = best_l;
	return true;
}

static void random_run(uint64_t gb, uint64_t *s, uint64_t *l)
{
	*s = rnd_below(gb + gb / 8 + 1);
	*l = 1 + rnd_below(rnd_below(4) ? 8 : gb / 3 + 1);
}

static void random_sequence(uint64_t seed)
{
	uint64_t gb = 1 + (seed % 3 == 0 ? rnd_below(20) : rnd_below(400));
	bool *m = calloc(gb, sizeof(*m));
	bool *dm = calloc(gb, sizeof(*dm));
	struct efs_freemap fm;
	struct efs_runs dbl = {0};

	cr_assert(m && dm);
	cr_assert_eq(efs_freemap_init(&fm, gb), 0);
	for (int op = 0; op < 600; op++) {
		uint64_t s, l, out = 0;
		int kind = (int)rnd_below(10), e;
		bool allfree = true, anyfree = false, inside;

		random_run(gb, &s, &l);
		inside = s < gb && l <= gb - s;
		for (uint64_t b = s; b < s + l && b < gb; b++) {
			allfree &= m[b];
			anyfree |= m[b];
		}
		allfree &= inside;
		cr_assert_eq(efs_freemap_all_free(&fm, s, l), allfree, "seed %llu op %d",
			     (unsigned long long)seed, op);
		cr_assert_eq(efs_freemap_any_free(&fm, s, l), anyfree, "seed %llu op %d",
			     (unsigned long long)seed, op);
		if (kind < 3) {
			e = efs_freemap_put(&fm, s, l);
			cr_assert_eq(e, inside && !anyfree ? 0 : -EUCLEAN, "seed %llu op %d: put %d",
				     (unsigned long long)seed, op, e);
			if (!e)
				for (uint64_t b = s; b < s + l; b++)
					m[b] = true;
		} else if (kind < 5) {
			e = efs_freemap_take(&fm, s, l);
			cr_assert_eq(e, allfree ? 0 : -EUCLEAN, "seed %llu op %d: take %d",
				     (unsigned long long)seed, op, e);
			if (!e)
				for (uint64_t b = s; b < s + l; b++)
					m[b] = false;
		} else if (kind < 8) {
			struct efs_run got = {0}, want;
			uint64_t goal = rnd_below(gb + 2);
			bool any = model_alloc(m, gb, l, goal, &want);

			e = efs_freemap_alloc(&fm, l, goal, &got);
			cr_assert_eq(e, any ? 0 : -ENOSPC, "seed %llu op %d: alloc %d",
				     (unsigned long long)seed, op, e);
			if (!e) {
				cr_assert(got.start == want.start && got.len == want.len,
					  "seed %llu op %d: alloc %llu at %llu got [%llu,+%llu), "
					  "model [%llu,+%llu)",
					  (unsigned long long)seed, op, (unsigned long long)l,
					  (unsigned long long)goal, (unsigned long long)got.start,
					  (unsigned long long)got.len, (unsigned long long)want.start,
					  (unsigned long long)want.len);
				for (uint64_t b = got.start; b < got.start + got.len; b++)
					m[b] = false;
			}
		} else {
			/* A fold of intents whose runs may repeat and leave the group. */
			struct efs_run runs[8];
			size_t n = 1 + rnd_below(8);
			uint64_t freed = 0, pre;
			int64_t r;

			memset(dm, 0, gb * sizeof(*dm));
			for (size_t i = 0; i < n; i++) {
				if (i > 0 && rnd_below(4) == 0) {
					runs[i] = runs[rnd_below(i)];
				} else {
					random_run(gb, &runs[i].start, &runs[i].len);
				}
				for (uint64_t b = runs[i].start; b < runs[i].start + runs[i].len; b++) {
					if (b >= gb)
						out++;
					else if (m[b])
						dm[b] = true;
					else {
						m[b] = true;
						freed++;
					}
				}
			}
			efs_runs_clear(&dbl);
			pre = 0;
			r = efs_freemap_fold(&fm, runs, n, &dbl);
			cr_assert_eq(r, (int64_t)freed, "seed %llu op %d: fold freed %lld, model %llu",
				     (unsigned long long)seed, op, (long long)r,
				     (unsigned long long)freed);
			/* double_freed: normalized, the model's double frees exactly. */
			for (size_t i = 0; i < dbl.n; i++) {
				if (i > 0)
					cr_assert_gt(dbl.v[i].start,
						     dbl.v[i - 1].start + dbl.v[i - 1].len);
				for (uint64_t b = dbl.v[i].start;
				     b < dbl.v[i].start + dbl.v[i].len && b < gb; b++) {
					cr_assert(dm[b], "seed %llu op %d: %llu not a double free",
						  (unsigned long long)seed, op,
						  (unsigned long long)b);
					dm[b] = false;
					pre++;
				}
			}
			for (uint64_t b = 0; b < gb; b++)
				cr_assert(!dm[b], "seed %llu op %d: double free of %llu missed",
					  (unsigned long long)seed, op, (unsigned long long)b);
			/* Blocks outside the group are reported once each. */
			cr_assert_leq(efs_runs_total(&dbl) - pre, out);
			cr_assert_eq(efs_runs_total(&dbl) - pre == 0, out == 0,
				     "seed %llu op %d", (unsigned long long)seed, op);
		}
		check_model(&fm, m, seed);
		if (op % 50 == 0)
			check_round_trip(&fm, seed);
	}
	check_round_trip(&fm, seed);
	efs_runs_done(&dbl);
	efs_freemap_done(&fm);
	free(dm);
	free(m);
}

/* ---- Tests ---- */

Test(freemap, random_sequences_match_a_bitmap_model)
{
	uint64_t base = 0x5eed0000ull + (uint64_t)getpid();

	for (uint64_t i = 0; i < 60; i++) {
		uint64_t seed = base + i;

		rnd_state = seed * 0x9e3779b97f4a7c15ull | 1;
		random_sequence(seed);
	}
	efs_test_assert_no_leaks();
}

Test(freemap, alloc_takes_from_goal_then_wraps_then_falls_back_to_the_longest)
{
	static const uint64_t runs[] = {10, 5, 30, 20, 70, 10};
	struct efs_freemap fm;
	struct efs_run got;

	make(&fm, 100, runs, 3);
	/* Goal inside a run with room: from the goal. */
	cr_assert_eq(efs_freemap_alloc(&fm, 4, 35, &got), 0);
	cr_assert(got.start == 35 && got.len == 4);
	/* Goal inside a run without room after it: the next run that holds it. */
	cr_assert_eq(efs_freemap_alloc(&fm, 3, 13, &got), 0);
	cr_assert(got.start == 30 && got.len == 3, "got %llu", (unsigned long long)got.start);
	/* Goal in a hole: the next run, from its start. */
	cr_assert_eq(efs_freemap_alloc(&fm, 2, 60, &got), 0);
	cr_assert(got.start == 70 && got.len == 2);
	/* Nothing after the goal holds it: wraps to the start. */
	cr_assert_eq(efs_freemap_alloc(&fm, 5, 90, &got), 0);
	cr_assert(got.start == 10 && got.len == 5);
	/* Free now: [33,35) [39,50) [72,80). A goal past the group counts as 0. */
	cr_assert_eq(efs_freemap_alloc(&fm, 1, 1000, &got), 0);
	cr_assert(got.start == 33 && got.len == 1);
	/* No run holds 12: the longest, whole (11 at 39); the caller asks again. */
	cr_assert_eq(efs_freemap_alloc(&fm, 12, 0, &got), 0);
	cr_assert(got.start == 39 && got.len == 11);
	cr_assert_eq(efs_freemap_alloc(&fm, 1, 0, &got), 0);
	cr_assert(got.start == 34 && got.len == 1);
	/* Wrapping back into the goal's own run, from its start. */
	{
		static const uint64_t one[] = {10, 10};
		struct efs_freemap g;

		make(&g, 20, one, 1);
		cr_assert_eq(efs_freemap_alloc(&g, 6, 15, &got), 0);
		cr_assert(got.start == 10 && got.len == 6);
		cr_assert_eq(efs_freemap_alloc(&g, 4, 19, &got), 0);
		cr_assert(got.start == 16 && got.len == 4);
		cr_assert_eq(efs_freemap_alloc(&g, 1, 0, &got), -ENOSPC);
		cr_assert_eq(g.nfree, 0);
		efs_freemap_done(&g);
	}
	cr_assert_eq(efs_freemap_alloc(&fm, 0, 0, &got), -EINVAL);
	cr_assert_eq(fm.nfree, 8);
	check_normalized(&fm, 0);
	efs_freemap_done(&fm);
	efs_test_assert_no_leaks();
}

Test(freemap, take_and_put_refuse_blocks_in_the_wrong_state)
{
	static const uint64_t runs[] = {10, 10};
	static const uint64_t after[] = {0, 20, 25, 5};
	struct efs_freemap fm, before;

	make(&fm, 30, runs, 1);
	cr_assert_eq(efs_freemap_copy(&before, &fm), 0);
	cr_assert_eq(efs_freemap_take(&fm, 5, 6), -EUCLEAN, "block 5 is in use");
	cr_assert_eq(efs_freemap_take(&fm, 19, 2), -EUCLEAN);
	cr_assert_eq(efs_freemap_take(&fm, 30, 1), -EUCLEAN, "outside the group");
	cr_assert_eq(efs_freemap_take(&fm, UINT64_MAX, 2), -EUCLEAN, "wraps");
	cr_assert_eq(efs_freemap_put(&fm, 19, 2), -EUCLEAN, "block 19 is free");
	cr_assert_eq(efs_freemap_put(&fm, 5, 5), 0);
	cr_assert_eq(efs_freemap_put(&fm, 5, 1), -EUCLEAN, "double free");
	cr_assert_eq(efs_freemap_put(&fm, 29, 2), -EUCLEAN, "leaves the group");
	cr_assert_eq(efs_freemap_put(&fm, UINT64_MAX - 1, 4), -EUCLEAN, "wraps");
	cr_assert_eq(efs_freemap_put(&fm, 0, 0), -EINVAL);
	cr_assert_eq(efs_freemap_take(&fm, 0, 0), -EINVAL);
	cr_assert_eq(efs_freemap_put(&fm, 0, 5), 0);
	cr_assert_eq(efs_freemap_put(&fm, 25, 5), 0);
	cr_assert_eq(efs_freemap_put(&fm, 29, 1), -EUCLEAN);
	expect_runs(&fm.free, after, 2);
	cr_assert_eq(fm.nfree, 25);
	cr_assert(!fm_equal(&fm, &before));
	efs_freemap_done(&before);
	efs_freemap_done(&fm);
	efs_test_assert_no_leaks();
}

Test(freemap, fold_reports_every_kind_of_double_free)
{
	static const uint64_t runs[] = {10, 10};
	/* Intent 1: [0,5) [3,7); intent 2: [4,6) [8,12) [25,40) (group of 30). */
	static const struct efs_run fold[] = {{0, 5}, {3, 4}, {4, 2}, {8, 4}, {25, 15}};
	static const uint64_t dbl_want[] = {3, 3, 10, 2, 30, 10};
	struct efs_freemap fm;
	struct efs_runs dbl = {0};

	make(&fm, 30, runs, 1);
	/* Freed: [0,7) [8,10) [25,30): 7 + 2 + 5. Doubles: [3,5) [4,6) listed
	 * again, [10,12) already free, [30,40) outside. */
	cr_assert_eq(efs_freemap_fold(&fm, fold, 5, &dbl), 14);
	expect_runs(&dbl, dbl_want, 3);
	/* Block 7 stays in use. */
	{
		static const uint64_t f[] = {0, 7, 8, 12, 25, 5};

		expect_runs(&fm.free, f, 3);
	}
	cr_assert_eq(fm.nfree, 24);
	/* A second fold adds to |double_freed| and keeps it normalized. */
	{
		static const struct efs_run again[] = {{7, 1}, {6, 1}, {7, 1}, {UINT64_MAX - 1, 5}};
		static const uint64_t dbl2[] = {3, 5, 10, 2, 30, 10, UINT64_MAX - 1, 1};

		cr_assert_eq(efs_freemap_fold(&fm, again, 4, &dbl), 1);
		expect_runs(&dbl, dbl2, 4);
	}
	cr_assert_eq(fm.nfree, 25);
	cr_assert(efs_freemap_all_free(&fm, 0, 20));
	/* Nothing to fold: nothing changes. */
	cr_assert_eq(efs_freemap_fold(&fm, NULL, 0, &dbl), 0);
	cr_assert_eq(dbl.n, 4);
	check_normalized(&fm, 0);
	efs_runs_done(&dbl);
	efs_freemap_done(&fm);
	efs_test_assert_no_leaks();
}

Test(freemap, from_msg_refuses_maps_that_break_the_rules)
{
	static const struct {
		uint64_t gb;
		size_t n;
		uint64_t runs[6];
	} bad[] = {
		{0, 0, {0}},		       /* empty group */
		{10, 1, {0, 0}},	       /* empty run */
		{10, 1, {5, 6}},	       /* outside */
		{10, 1, {10, 1}},	       /* outside */
		{10, 1, {UINT64_MAX, 2}},      /* wraps */
		{10, 2, {5, 2, 1, 2}},	       /* unsorted */
		{10, 2, {1, 3, 3, 2}},	       /* overlapping */
		{10, 2, {1, 2, 3, 2}},	       /* adjacent */
		{10, 3, {0, 1, 2, 1, 2, 1}},   /* repeated */
	};
	struct efs_freemap fm;

	for (size_t t = 0; t < sizeof(bad) / sizeof(bad[0]); t++) {
		Etcfs__AgMap msg = ETCFS__AG_MAP__INIT;
		Etcfs__Run r[3], *p[3];

		for (size_t i = 0; i < bad[t].n; i++) {
			etcfs__run__init(&r[i]);
			r[i].start = bad[t].runs[2 * i];
			r[i].len = bad[t].runs[2 * i + 1];
			p[i] = &r[i];
		}
		msg.group_blocks = bad[t].gb;
		msg.n_free = bad[t].n;
		msg.free = p;
		cr_assert_eq(efs_freemap_from_msg(&fm, &msg), -EUCLEAN, "case %zu", t);
	}
	/* A full group (no run) and a wholly free one are fine. */
	{
		Etcfs__AgMap msg = ETCFS__AG_MAP__INIT;
		Etcfs__Run r = ETCFS__RUN__INIT, *p = &r;

		msg.group_blocks = 7;
		cr_assert_eq(efs_freemap_from_msg(&fm, &msg), 0);
		cr_assert(fm.nfree == 0 && fm.free.n == 0 && fm.group_blocks == 7);
		check_round_trip(&fm, 0);
		efs_freemap_done(&fm);
		r.len = 7;
		msg.n_free = 1;
		msg.free = &p;
		cr_assert_eq(efs_freemap_from_msg(&fm, &msg), 0);
		cr_assert_eq(fm.nfree, 7);
		check_round_trip(&fm, 0);
		efs_freemap_done(&fm);
	}
	cr_assert_eq(efs_freemap_init(&fm, 0), -EINVAL);
	efs_test_assert_no_leaks();
}

/*
 * Runs |op| on a copy of |fm| failing the i-th allocation, for every i until
 * it succeeds: each failure is -ENOMEM and leaves the copy (and the
 * double-free list) as it was.
 */
enum op { OP_ALLOC, OP_TAKE, OP_PUT, OP_FOLD, OP_PACK, OP_COPY, OP_FROM_MSG };

static void sweep(const struct efs_freemap *fm, enum op op)
{
	static const struct efs_run fold[] = {{1, 1}, {3, 1}, {5, 3}, {6, 1}, {200, 3}};
	bool done = false;

	for (long i = 0; !done; i++) {
		struct efs_freemap w, before, other;
		struct efs_runs dbl = {0};
		struct efs_run got;
		ProtobufCBinaryData buf;
		Etcfs__AgMap msg = ETCFS__AG_MAP__INIT;
		Etcfs__Run r[2] = {ETCFS__RUN__INIT, ETCFS__RUN__INIT}, *p[2] = {&r[0], &r[1]};
		int64_t e = 0;

		cr_assert_lt(i, 100, "op %d never succeeds", op);
		cr_assert_eq(efs_freemap_copy(&w, fm), 0);
		cr_assert_eq(efs_freemap_copy(&before, fm), 0);
		cr_assert_eq(efs_runs_add(&dbl, 500, 1), 0);
		r[0].start = 2;
		r[0].len = 3;
		r[1].start = 9;
		r[1].len = 1;
		msg.group_blocks = 100;
		msg.n_free = 2;
		msg.free = p;
		efs_mem_fail_after(i);
		switch (op) {
		case OP_ALLOC:
			e = efs_freemap_alloc(&w, 1, 21, &got);
			break;
		case OP_TAKE:
			e = efs_freemap_take(&w, 21, 1);
			break;
		case OP_PUT:
			e = efs_freemap_put(&w, 60, 2);
			break;
		case OP_FOLD:
			e = efs_freemap_fold(&w, fold, 5, &dbl);
			break;
		case OP_PACK:
			e = efs_freemap_pack(&w, &buf);
			break;
		case OP_COPY:
			e = efs_freemap_copy(&other, &w);
			break;
		case OP_FROM_MSG:
			e = efs_freemap_from_msg(&other, &msg);
			break;
		}
		efs_mem_fail_reset();
		if (e == -ENOMEM) {
			cr_assert(fm_equal(&w, &before), "op %d failing at %ld changed the map", op,
				  i);
			cr_assert(dbl.n == 1 && dbl.v[0].start == 500 && dbl.v[0].len == 1,
				  "op %d failing at %ld changed the double frees", op, i);
		} else {
			cr_assert_geq(e, 0, "op %d: %lld", op, (long long)e);
			done = true;
			if (op == OP_PACK)
				efs_mem_free(buf.data);
			if (op == OP_COPY || op == OP_FROM_MSG)
				efs_freemap_done(&other);
			if (op == OP_FOLD)
				cr_assert_eq(e, 5);
		}
		efs_runs_done(&dbl);
		efs_freemap_done(&before);
		efs_freemap_done(&w);
	}
}

Test(freemap, out_of_memory_leaves_maps_unchanged)
{
	struct efs_freemap fm;

	/* Eight runs exactly, so that any split needs the list to grow. */
	cr_assert_eq(efs_freemap_init(&fm, 100), 0);
	for (uint64_t i = 0; i < 8; i++)
		cr_assert_eq(efs_freemap_put(&fm, 20 + 4 * i, 3), 0);
	cr_assert_eq(fm.free.n, 8);
	for (int op = OP_ALLOC; op <= OP_FROM_MSG; op++)
		sweep(&fm, (enum op)op);
	efs_freemap_done(&fm);
	efs_test_assert_no_leaks();
}
