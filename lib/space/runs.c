/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "space/runs.h"
#include "util/mem.h"

void efs_runs_done(struct efs_runs *r)
{
	efs_mem_free(r->v);
	r->v = NULL;
	r->n = r->cap = 0;
}

int efs_runs_reserve(struct efs_runs *r, size_t n)
{
	return efs_mem_reserve(&r->v, &r->cap, n, sizeof(*r->v));
}

int efs_runs_add(struct efs_runs *r, uint64_t start, uint64_t len)
{
	struct efs_run *last;

	if (len == 0)
		return 0;
	if (start + len < start)
		return -EINVAL;
	last = r->n ? &r->v[r->n - 1] : NULL;
	if (last && last->start + last->len == start) {
		last->len += len;
		return 0;
	}
	if (efs_runs_reserve(r, r->n + 1) < 0)
		return -ENOMEM;
	r->v[r->n].start = start;
	r->v[r->n].len = len;
	r->n++;
	return 0;
}

/* Adds every run of |src| to |r| with |add|, in order, stopping at the
 * first error. */
static int add_each(struct efs_runs *r, const struct efs_runs *src,
		    int (*add)(struct efs_runs *r, uint64_t start, uint64_t len))
{
	for (size_t i = 0; i < src->n; i++) {
		int e = add(r, src->v[i].start, src->v[i].len);

		if (e < 0)
			return e;
	}
	return 0;
}

int efs_runs_append(struct efs_runs *r, const struct efs_runs *src)
{
	return add_each(r, src, efs_runs_add);
}

static int run_cmp(const void *a, const void *b)
{
	const struct efs_run *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

int efs_runs_normalize(struct efs_runs *r)
{
	size_t o = 0;

	if (r->n < 2)
		return 0;
	qsort(r->v, r->n, sizeof(*r->v), run_cmp);
	for (size_t i = 1; i < r->n; i++)
		if (r->v[i - 1].start + r->v[i - 1].len > r->v[i].start)
			return -EUCLEAN;
	for (size_t i = 1; i < r->n; i++) {
		if (r->v[o].start + r->v[o].len == r->v[i].start)
			r->v[o].len += r->v[i].len;
		else
			r->v[++o] = r->v[i];
	}
	r->n = o + 1;
	return 0;
}

uint64_t efs_runs_total(const struct efs_runs *r)
{
	uint64_t t = 0;

	for (size_t i = 0; i < r->n; i++)
		t += r->v[i].len;
	return t;
}

size_t efs_runs_first_after(const struct efs_runs *r, uint64_t start)
{
	size_t lo = 0, hi = r->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (r->v[mid].start + r->v[mid].len <= start)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int efs_runs_subtract(struct efs_runs *r, uint64_t start, uint64_t len, struct efs_runs *cut)
{
	uint64_t end = start + len;
	size_t i;

	if (len == 0)
		return 0;
	if (efs_runs_reserve(r, r->n + 1) < 0)
		return -ENOMEM;
	i = efs_runs_first_after(r, start);
	while (i < r->n && r->v[i].start < end) {
		struct efs_run *x = &r->v[i];
		uint64_t xs = x->start, xe = x->start + x->len;
		uint64_t cs = xs > start ? xs : start, ce = xe < end ? xe : end;

		if (cut && efs_runs_add(cut, cs, ce - cs) < 0)
			return -ENOMEM;
		if (xs < cs && xe > ce) { /* split in two */
			memmove(&r->v[i + 2], &r->v[i + 1], (r->n - i - 1) * sizeof(*x));
			r->v[i].len = cs - xs;
			r->v[i + 1].start = ce;
			r->v[i + 1].len = xe - ce;
			r->n++;
			return 0;
		}
		if (xs < cs) {
			x->len = cs - xs;
			i++;
		} else if (xe > ce) {
			x->start = ce;
			x->len = xe - ce;
			i++;
		} else {
			memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof(*x));
			r->n--;
		}
	}
	return 0;
}

bool efs_runs_overlaps(const struct efs_runs *r, uint64_t start, uint64_t len)
{
	size_t i = efs_runs_first_after(r, start);

	return len && i < r->n && r->v[i].start < start + len;
}

int efs_runs_insert(struct efs_runs *r, uint64_t start, uint64_t len)
{
	size_t lo = 0, hi = r->n;

	if (len == 0)
		return 0;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (r->v[mid].start < start)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* lo: first run starting at or after |start|. */
	if (lo > 0 && r->v[lo - 1].start + r->v[lo - 1].len == start) {
		r->v[lo - 1].len += len;
		if (lo < r->n && r->v[lo - 1].start + r->v[lo - 1].len == r->v[lo].start) {
			r->v[lo - 1].len += r->v[lo].len;
			memmove(&r->v[lo], &r->v[lo + 1], (r->n - lo - 1) * sizeof(r->v[0]));
			r->n--;
		}
		return 0;
	}
	if (lo < r->n && start + len == r->v[lo].start) {
		r->v[lo].start = start;
		r->v[lo].len += len;
		return 0;
	}
	if (efs_runs_reserve(r, r->n + 1) < 0)
		return -ENOMEM;
	memmove(&r->v[lo + 1], &r->v[lo], (r->n - lo) * sizeof(r->v[0]));
	r->v[lo].start = start;
	r->v[lo].len = len;
	r->n++;
	return 0;
}

int efs_runs_insert_all(struct efs_runs *r, const struct efs_runs *src)
{
	return add_each(r, src, efs_runs_insert);
}

int efs_runs_remove_all(struct efs_runs *r, const struct efs_runs *src, struct efs_runs *cut)
{
	for (size_t i = 0; i < src->n && r->n; i++) {
		int e = efs_runs_subtract(r, src->v[i].start, src->v[i].len, cut);

		if (e < 0)
			return e;
	}
	return 0;
}

int efs_runs_split(const struct efs_runs *set, uint64_t start, uint64_t len, struct efs_runs *in,
		   struct efs_runs *out)
{
	uint64_t pos = start, end = start + len;
	int e = 0;

	for (size_t i = efs_runs_first_after(set, start); i < set->n && pos < end && e == 0; i++) {
		uint64_t s = set->v[i].start, t = s + set->v[i].len;

		if (s >= end)
			break;
		if (s > pos) {
			e = efs_runs_add(out, pos, s - pos);
			pos = s;
		}
		if (e == 0) {
			uint64_t stop = t < end ? t : end;

			e = efs_runs_add(in, pos, stop - pos);
			pos = stop;
		}
	}
	if (e == 0 && pos < end)
		e = efs_runs_add(out, pos, end - pos);
	return e;
}
