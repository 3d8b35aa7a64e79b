/* SPDX-License-Identifier: Apache-2.0 */
/* The intrusive list (lib/util/list.h), targeted and against an array model. */
#include <stdint.h>
#include <string.h>

#include <criterion/criterion.h>

#include "util/list.h"

TestSuite(list, .timeout = 30);

struct item {
	int v;
	struct efs_list link;
};

/* The values of |h| front to back, checking both directions agree. */
static size_t values(const struct efs_list *h, int *out, size_t max)
{
	size_t n = 0, back = 0;

	for (const struct efs_list *p = h->next; p != h; p = p->next) {
		cr_assert_eq(p->next->prev, p, "broken link after node %zu", n);
		cr_assert_lt(n, max, "list longer than expected");
		out[n++] = efs_list_entry(p, struct item, link)->v;
	}
	for (const struct efs_list *p = h->prev; p != h; p = p->prev)
		back++;
	cr_assert_eq(back, n, "%zu nodes forward, %zu backward", n, back);
	return n;
}

Test(list, fifo_order_pop_and_delete_anywhere)
{
	struct item it[5];
	struct efs_list h, *n;
	int got[8];

	efs_list_init(&h);
	cr_assert(efs_list_empty(&h));
	cr_assert_null(efs_list_first(&h));
	cr_assert_null(efs_list_pop(&h));
	memset(it, 0, sizeof(it));
	for (int i = 0; i < 5; i++) {
		it[i].v = i;
		cr_assert_not(efs_list_linked(&it[i].link), "a zeroed node counts as unlinked");
		efs_list_add_tail(&h, &it[i].link);
		cr_assert(efs_list_linked(&it[i].link));
	}
	cr_assert_eq(values(&h, got, 8), 5);
	for (int i = 0; i < 5; i++)
		cr_assert_eq(got[i], i);
	/* Middle, head and tail deletions; deleting twice does nothing. */
	efs_list_del(&it[2].link);
	efs_list_del(&it[2].link);
	cr_assert_not(efs_list_linked(&it[2].link));
	efs_list_del(&it[0].link);
	efs_list_del(&it[4].link);
	cr_assert_eq(values(&h, got, 8), 2);
	cr_assert(got[0] == 1 && got[1] == 3);
	efs_list_add_head(&h, &it[4].link);
	n = efs_list_pop(&h);
	cr_assert_eq(efs_list_entry(n, struct item, link)->v, 4);
	cr_assert_not(efs_list_linked(n));
	cr_assert_eq(values(&h, got, 8), 2);
}

Test(list, splice_moves_everything_and_empties_the_source)
{
	struct item it[6];
	struct efs_list a, b, *n, *tmp;
	int got[8];

	efs_list_init(&a);
	efs_list_init(&b);
	memset(it, 0, sizeof(it));
	for (int i = 0; i < 6; i++) {
		it[i].v = i;
		efs_list_add_tail(i < 2 ? &a : &b, &it[i].link);
	}
	efs_list_splice_tail(&a, &b);
	cr_assert(efs_list_empty(&b));
	cr_assert_eq(values(&a, got, 8), 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(got[i], i);
	efs_list_splice_tail(&a, &b); /* an empty source: nothing moves */
	cr_assert_eq(values(&a, got, 8), 6);
	efs_list_splice_tail(&b, &a); /* into an empty list */
	cr_assert(efs_list_empty(&a));
	cr_assert_eq(values(&b, got, 8), 6);
	/* The safe walk may take off the node it stands on. */
	efs_list_for_each_safe(n, tmp, &b)
		if (efs_list_entry(n, struct item, link)->v % 2)
			efs_list_del(n);
	cr_assert_eq(values(&b, got, 8), 3);
	cr_assert(got[0] == 0 && got[1] == 2 && got[2] == 4);
}

/* Random operations against an array of the expected order. */
Test(list, random_operations_match_a_model)
{
	enum { N = 64 };
	struct item it[N];
	struct efs_list h;
	int model[N], nm = 0, got[N];
	uint64_t s = 0x1234567u;

	efs_list_init(&h);
	memset(it, 0, sizeof(it));
	for (int i = 0; i < N; i++)
		it[i].v = i;
	for (int step = 0; step < 20000; step++) {
		int i, k;

		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		i = (int)(s % N);
		switch ((s >> 8) % 4) {
		case 0: /* add at the tail, if not on the list */
			if (efs_list_linked(&it[i].link))
				break;
			efs_list_add_tail(&h, &it[i].link);
			model[nm++] = i;
			break;
		case 1: /* add at the head */
			if (efs_list_linked(&it[i].link))
				break;
			efs_list_add_head(&h, &it[i].link);
			memmove(model + 1, model, (size_t)nm * sizeof(model[0]));
			model[0] = i;
			nm++;
			break;
		case 2: /* delete (linked or not) */
			efs_list_del(&it[i].link);
			for (k = 0; k < nm && model[k] != i; k++)
				;
			if (k < nm) {
				memmove(model + k, model + k + 1, (size_t)(nm - k - 1) * sizeof(model[0]));
				nm--;
			}
			break;
		default: { /* pop */
			struct efs_list *n = efs_list_pop(&h);

			if (nm == 0) {
				cr_assert_null(n);
				break;
			}
			cr_assert_eq(efs_list_entry(n, struct item, link)->v, model[0]);
			memmove(model, model + 1, (size_t)(nm - 1) * sizeof(model[0]));
			nm--;
			break;
		}
		}
		if (step % 97 == 0 || step == 19999) {
			size_t n = values(&h, got, N);

			cr_assert_eq(n, (size_t)nm, "step %d: %zu nodes, model %d", step, n, nm);
			cr_assert_eq(memcmp(got, model, n * sizeof(got[0])), 0, "step %d: order differs",
				     step);
		}
	}
}
