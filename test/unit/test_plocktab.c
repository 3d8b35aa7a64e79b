/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fcntl/flock lock set rules: range conversion and overflow, merging,
 * splitting, type changes, conflicts, and a randomised comparison against
 * a per-byte model on a small range.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "fs/plocktab.h"
#include "util/mem.h"

TestSuite(plocktab, .fini = efs_mem_fail_reset, .timeout = 20);

static void expect(const struct efs_plock_set *s, size_t i, uint64_t start, uint64_t end,
		   int type)
{
	cr_assert_lt(i, s->n);
	cr_expect_eq(s->v[i].start, start, "range %zu start %lu", i, (unsigned long)s->v[i].start);
	cr_expect_eq(s->v[i].end, end, "range %zu end %lu", i, (unsigned long)s->v[i].end);
	cr_expect_eq(s->v[i].type, type, "range %zu type", i);
}

Test(plocktab, span_conversion_and_overflow)
{
	uint64_t s = 7, e = 7;

	cr_assert_eq(efs_plock_span(10, 5, &s, &e), 0);
	cr_expect_eq(s, 10);
	cr_expect_eq(e, 14);
	cr_assert_eq(efs_plock_span(10, 0, &s, &e), 0);
	cr_expect_eq(s, 10);
	cr_expect_eq(e, UINT64_MAX);
	cr_assert_eq(efs_plock_span(10, -4, &s, &e), 0);
	cr_expect_eq(s, 6);
	cr_expect_eq(e, 9);
	cr_assert_eq(efs_plock_span(10, -10, &s, &e), 0);
	cr_expect_eq(s, 0);
	cr_expect_eq(e, 9);
	s = e = 3;
	cr_expect_eq(efs_plock_span(10, -11, &s, &e), -EINVAL);
	cr_expect_eq(efs_plock_span(-1, 5, &s, &e), -EINVAL);
	cr_expect_eq(efs_plock_span(0, INT64_MIN, &s, &e), -EINVAL);
	cr_expect_eq(efs_plock_span(INT64_MAX, 2, &s, &e), -EOVERFLOW);
	cr_expect_eq(efs_plock_span(2, INT64_MAX, &s, &e), -EOVERFLOW);
	cr_expect(s == 3 && e == 3, "untouched on failure");
	cr_assert_eq(efs_plock_span(INT64_MAX, 1, &s, &e), 0);
	cr_expect_eq(e, (uint64_t)INT64_MAX);
	cr_assert_eq(efs_plock_span(0, INT64_MAX, &s, &e), 0);
	cr_expect_eq(e, (uint64_t)INT64_MAX - 1);

	cr_expect_eq(efs_plock_len(10, 14), 5);
	cr_expect_eq(efs_plock_len(10, UINT64_MAX), 0);
	cr_expect_eq(efs_plock_len(10, (uint64_t)INT64_MAX + 1), 0);
	efs_test_assert_no_leaks();
}

Test(plocktab, merge_split_and_type_change)
{
	struct efs_plock_set s = {0};

	/* Adjacent and overlapping ranges of one type merge. */
	cr_assert_eq(efs_plock_set_apply(&s, 0, 9, F_RDLCK, 1), 0);
	cr_assert_eq(efs_plock_set_apply(&s, 10, 19, F_RDLCK, 1), 0);
	cr_assert_eq(s.n, 1);
	expect(&s, 0, 0, 19, F_RDLCK);
	cr_assert_eq(efs_plock_set_apply(&s, 30, 39, F_RDLCK, 1), 0);
	cr_assert_eq(efs_plock_set_apply(&s, 15, 35, F_RDLCK, 1), 0);
	cr_assert_eq(s.n, 1);
	expect(&s, 0, 0, 39, F_RDLCK);

	/* A partial unlock splits. */
	cr_assert_eq(efs_plock_set_apply(&s, 10, 19, F_UNLCK, 0), 0);
	cr_assert_eq(s.n, 2);
	expect(&s, 0, 0, 9, F_RDLCK);
	expect(&s, 1, 20, 39, F_RDLCK);

	/* A type change of a sub-range: three pieces. */
	cr_assert_eq(efs_plock_set_apply(&s, 25, 29, F_WRLCK, 2), 0);
	cr_assert_eq(s.n, 4);
	expect(&s, 1, 20, 24, F_RDLCK);
	expect(&s, 2, 25, 29, F_WRLCK);
	expect(&s, 3, 30, 39, F_RDLCK);
	cr_expect_eq(s.v[2].pid, 2);

	/* Different types next to each other do not merge; back to read they do. */
	cr_assert_eq(efs_plock_set_apply(&s, 25, 29, F_RDLCK, 1), 0);
	cr_assert_eq(s.n, 2);
	expect(&s, 1, 20, 39, F_RDLCK);

	/* To EOF, then unlock all of it. */
	cr_assert_eq(efs_plock_set_apply(&s, 40, UINT64_MAX, F_WRLCK, 1), 0);
	cr_assert_eq(s.n, 3);
	expect(&s, 2, 40, UINT64_MAX, F_WRLCK);
	cr_assert_eq(efs_plock_set_apply(&s, 100, UINT64_MAX, F_UNLCK, 1), 0);
	expect(&s, 2, 40, 99, F_WRLCK);
	cr_assert_eq(efs_plock_set_apply(&s, 50, UINT64_MAX, F_WRLCK, 1), 0);
	expect(&s, 2, 40, UINT64_MAX, F_WRLCK);
	cr_assert_eq(efs_plock_set_apply(&s, 0, UINT64_MAX, F_UNLCK, 1), 0);
	cr_expect_eq(s.n, 0);

	/* Unlocking what is not held is no error. */
	cr_expect_eq(efs_plock_set_apply(&s, 5, 6, F_UNLCK, 1), 0);
	cr_expect_eq(s.n, 0);
	cr_expect_eq(efs_plock_set_apply(&s, 6, 5, F_RDLCK, 1), -EINVAL);
	cr_expect_eq(efs_plock_set_apply(&s, 0, 5, 77, 1), -EINVAL);
	efs_plock_set_clear(&s);
	efs_test_assert_no_leaks();
}

Test(plocktab, conflicts)
{
	struct efs_plock_set s = {0};
	const struct efs_plock *c;

	cr_assert_eq(efs_plock_set_apply(&s, 10, 19, F_RDLCK, 1), 0);
	cr_assert_eq(efs_plock_set_apply(&s, 30, 39, F_WRLCK, 1), 0);
	cr_expect_null(efs_plock_set_conflict(&s, 0, 29, F_RDLCK));
	c = efs_plock_set_conflict(&s, 0, 29, F_WRLCK);
	cr_assert_not_null(c);
	cr_expect_eq(c->start, 10);
	c = efs_plock_set_conflict(&s, 0, UINT64_MAX, F_RDLCK);
	cr_assert_not_null(c);
	cr_expect_eq(c->start, 30);
	cr_expect_null(efs_plock_set_conflict(&s, 20, 29, F_WRLCK));
	cr_expect_null(efs_plock_set_conflict(&s, 40, UINT64_MAX, F_WRLCK));
	cr_expect_not_null(efs_plock_set_conflict(&s, 39, 39, F_RDLCK));
	efs_plock_set_clear(&s);
	efs_test_assert_no_leaks();
}

Test(plocktab, append_copy_equal)
{
	struct efs_plock_set a = {0}, b = {0};

	cr_assert_eq(efs_plock_set_append(&a, 0, 4, F_RDLCK, 3), 0);
	cr_assert_eq(efs_plock_set_append(&a, 8, UINT64_MAX, F_WRLCK, 3), 0);
	cr_expect_eq(efs_plock_set_append(&a, 8, 9, F_WRLCK, 3), -EINVAL);
	cr_expect_eq(efs_plock_set_append(&a, 20, 10, F_WRLCK, 3), -EINVAL);
	cr_expect_eq(efs_plock_set_append(&a, 30, 40, F_UNLCK, 3), -EINVAL);
	cr_assert_eq(efs_plock_set_copy(&b, &a), 0);
	cr_expect(efs_plock_set_equal(&a, &b));
	cr_assert_eq(efs_plock_set_apply(&b, 2, 2, F_UNLCK, 3), 0);
	cr_expect_not(efs_plock_set_equal(&a, &b));
	efs_plock_set_clear(&a);
	efs_plock_set_clear(&b);
	efs_test_assert_no_leaks();
}

Test(plocktab, enomem_leaves_the_set)
{
	struct efs_plock_set s = {0};

	cr_assert_eq(efs_plock_set_apply(&s, 0, 9, F_RDLCK, 1), 0);
	efs_mem_fail_after(0);
	cr_expect_eq(efs_plock_set_apply(&s, 3, 5, F_WRLCK, 1), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(s.n, 1);
	expect(&s, 0, 0, 9, F_RDLCK);
	efs_plock_set_clear(&s);
	efs_test_assert_no_leaks();
}

/* Per-byte model: owner 0's type of each byte of [0, N), and the byte
 * beyond N standing for "N and after" (to-EOF requests end there). */
#define N 48

static void check_invariants(const struct efs_plock_set *s)
{
	for (size_t i = 0; i < s->n; i++) {
		cr_assert_leq(s->v[i].start, s->v[i].end);
		if (i == 0)
			continue;
		cr_assert_gt(s->v[i].start, s->v[i - 1].end, "sorted, no overlap");
		if (s->v[i].type == s->v[i - 1].type)
			cr_assert_gt(s->v[i].start, s->v[i - 1].end + 1, "same type not merged");
	}
}

static int model_type_at(const struct efs_plock_set *s, uint64_t b)
{
	for (size_t i = 0; i < s->n; i++) {
		if (s->v[i].start <= b && b <= s->v[i].end)
			return s->v[i].type;
	}
	return F_UNLCK;
}

Test(plocktab, randomised_against_byte_model)
{
	static const int types[] = { F_UNLCK, F_RDLCK, F_WRLCK };
	struct efs_plock_set s = {0}, other = {0};
	int model[N + 1], omodel[N + 1];

	srand(12345);
	for (int i = 0; i <= N; i++)
		model[i] = omodel[i] = F_UNLCK;
	for (int iter = 0; iter < 20000; iter++) {
		uint64_t a = (uint64_t)(rand() % N), b = (uint64_t)(rand() % N), lo, hi;
		int t = types[rand() % 3];
		bool to_eof = rand() % 8 == 0;
		bool on_other = rand() % 4 == 0;
		int *m = on_other ? omodel : model;
		struct efs_plock_set *set = on_other ? &other : &s;

		lo = a < b ? a : b;
		hi = to_eof ? UINT64_MAX : (a < b ? b : a);
		cr_assert_eq(efs_plock_set_apply(set, lo, hi, t, 1), 0);
		for (uint64_t x = lo; x <= N && x <= hi; x++)
			m[x] = t;
		check_invariants(set);
		for (int x = 0; x <= N; x++)
			cr_assert_eq(model_type_at(set, (uint64_t)x), m[x], "iter %d byte %d", iter, x);
		/* Beyond N the set must agree with byte N (only to-EOF reaches there). */
		cr_assert_eq(model_type_at(set, UINT64_MAX), m[N]);

		/* Conflict of a random request against the other set, by bytes. */
		a = (uint64_t)(rand() % N);
		b = (uint64_t)(rand() % N);
		lo = a < b ? a : b;
		hi = a < b ? b : a;
		t = types[1 + rand() % 2];
		{
			int first = -1;
			const struct efs_plock *c;

			for (uint64_t x = lo; x <= hi; x++) {
				if (omodel[x] != F_UNLCK && (t == F_WRLCK || omodel[x] == F_WRLCK)) {
					first = (int)x;
					break;
				}
			}
			c = efs_plock_set_conflict(&other, lo, hi, t);
			if (first < 0) {
				cr_assert_null(c, "iter %d", iter);
			} else {
				cr_assert_not_null(c, "iter %d", iter);
				/* The reported range holds the first conflicting byte. */
				cr_assert(c->start <= (uint64_t)first && (uint64_t)first <= c->end,
					  "iter %d", iter);
			}
		}
	}
	efs_plock_set_clear(&s);
	efs_plock_set_clear(&other);
	efs_test_assert_no_leaks();
}
