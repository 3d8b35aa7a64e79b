/* SPDX-License-Identifier: Apache-2.0 */
#include "space/freemap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/records.h"
#include "util/mem.h"

/* True when [start, start + len) is a non-empty run inside the group. */
static bool in_group(const struct efs_freemap *fm, uint64_t start, uint64_t len)
{
	return len >= 1 && start < fm->group_blocks && len <= fm->group_blocks - start;
}

int efs_freemap_init(struct efs_freemap *fm, uint64_t group_blocks)
{
	if (group_blocks == 0)
		return -EINVAL;
	memset(fm, 0, sizeof(*fm));
	fm->group_blocks = group_blocks;
	return 0;
}

void efs_freemap_done(struct efs_freemap *fm)
{
	efs_runs_done(&fm->free);
	fm->nfree = 0;
}

int efs_freemap_copy(struct efs_freemap *dst, const struct efs_freemap *src)
{
	struct efs_runs r = {0};

	if (efs_runs_reserve(&r, src->free.n) < 0)
		return -ENOMEM;
	if (src->free.n)
		memcpy(r.v, src->free.v, src->free.n * sizeof(*r.v));
	r.n = src->free.n;
	dst->group_blocks = src->group_blocks;
	dst->nfree = src->nfree;
	dst->free = r;
	return 0;
}

int efs_freemap_from_msg(struct efs_freemap *fm, const Etcfs__AgMap *msg)
{
	struct efs_runs r = {0};
	uint64_t prev_end = 0, nfree = 0;

	if (msg->group_blocks == 0)
		return -EUCLEAN;
	for (size_t i = 0; i < msg->n_free; i++) {
		const Etcfs__Run *x = msg->free[i];

		if (x->len == 0 || x->start >= msg->group_blocks ||
		    x->len > msg->group_blocks - x->start)
			return -EUCLEAN;
		/* Sorted, disjoint and never adjacent: strictly after the last end. */
		if (i > 0 && x->start <= prev_end)
			return -EUCLEAN;
		prev_end = x->start + x->len;
		nfree += x->len;
	}
	if (efs_runs_reserve(&r, msg->n_free) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < msg->n_free; i++) {
		r.v[i].start = msg->free[i]->start;
		r.v[i].len = msg->free[i]->len;
	}
	r.n = msg->n_free;
	fm->group_blocks = msg->group_blocks;
	fm->nfree = nfree;
	fm->free = r;
	return 0;
}

int efs_freemap_pb_runs(const struct efs_runs *runs, Etcfs__Run ***ret)
{
	Etcfs__Run **ptrs = NULL, *v = NULL;

	if (runs->n) {
		/* The pointers first, then the runs: both 8-byte aligned. */
		ptrs = efs_mem_calloc(runs->n, sizeof(*ptrs) + sizeof(*v));
		if (!ptrs)
			return -ENOMEM;
		v = (Etcfs__Run *)(ptrs + runs->n);
	}
	for (size_t i = 0; i < runs->n; i++) {
		etcfs__run__init(&v[i]);
		v[i].start = runs->v[i].start;
		v[i].len = runs->v[i].len;
		ptrs[i] = &v[i];
	}
	*ret = ptrs;
	return 0;
}

int efs_freemap_pack(const struct efs_freemap *fm, ProtobufCBinaryData *ret)
{
	Etcfs__AgMap msg = ETCFS__AG_MAP__INIT;
	int err;

	err = efs_freemap_pb_runs(&fm->free, &msg.free);
	if (err < 0)
		return err;
	msg.group_blocks = fm->group_blocks;
	msg.n_free = fm->free.n;
	err = efs_meta_pack(&msg.base, ret);
	efs_mem_free(msg.free);
	return err;
}

/*
 * Removes [start, start + len), which lies inside run |i|, from the map.
 * Needs room for one more run when it splits run |i|: 0 or -ENOMEM (map
 * unchanged).
 */
static int cut(struct efs_freemap *fm, size_t i, uint64_t start, uint64_t len)
{
	struct efs_runs *r = &fm->free;
	struct efs_run *x = &r->v[i];
	uint64_t xe = x->start + x->len, end = start + len;

	if (x->start < start && end < xe) {
		if (efs_runs_reserve(r, r->n + 1) < 0)
			return -ENOMEM;
		x = &r->v[i];
		memmove(&r->v[i + 2], &r->v[i + 1], (r->n - i - 1) * sizeof(*x));
		x->len = start - x->start;
		r->v[i + 1].start = end;
		r->v[i + 1].len = xe - end;
		r->n++;
	} else if (x->start < start) {
		x->len = start - x->start;
	} else if (end < xe) {
		x->start = end;
		x->len = xe - end;
	} else {
		memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof(*x));
		r->n--;
	}
	fm->nfree -= len;
	return 0;
}

int efs_freemap_alloc(struct efs_freemap *fm, uint64_t want, uint64_t goal, struct efs_run *got)
{
	const struct efs_runs *r = &fm->free;
	size_t n = r->n, first, best, idx;
	uint64_t start;
	int err;

	if (want == 0)
		return -EINVAL;
	if (n == 0)
		return -ENOSPC;
	if (goal >= fm->group_blocks)
		goal = 0;
	first = efs_runs_first_after(r, goal);
	best = first % n;
	/*
	 * The free blocks at or after |goal| in address order, wrapping: the
	 * tail of the run holding |goal| first, then the runs after it, then
	 * those before it, and last the run holding |goal| again, whole.
	 */
	for (size_t k = 0; k <= n; k++) {
		size_t i = (first + k) % n;
		const struct efs_run *x = &r->v[i];

		idx = i;
		start = x->start;
		if (k == 0 && first < n && x->start < goal)
			start = goal;
		if (x->start + x->len - start >= want)
			goto found;
		if (x->len > r->v[best].len)
			best = i;
	}
	/* No run holds |want|: the longest, the first of equals from |goal| on. */
	want = r->v[best].len;
	start = r->v[best].start;
	idx = best;
found:
	err = cut(fm, idx, start, want);
	if (err < 0)
		return err;
	got->start = start;
	got->len = want;
	return 0;
}

bool efs_freemap_all_free(const struct efs_freemap *fm, uint64_t start, uint64_t len)
{
	size_t i;

	if (len == 0)
		return true;
	if (!in_group(fm, start, len))
		return false;
	i = efs_runs_first_after(&fm->free, start);
	return i < fm->free.n && fm->free.v[i].start <= start &&
	       start + len <= fm->free.v[i].start + fm->free.v[i].len;
}

bool efs_freemap_any_free(const struct efs_freemap *fm, uint64_t start, uint64_t len)
{
	if (len == 0 || start >= fm->group_blocks)
		return false;
	if (len > fm->group_blocks - start)
		len = fm->group_blocks - start;
	return efs_runs_overlaps(&fm->free, start, len);
}

int efs_freemap_take(struct efs_freemap *fm, uint64_t start, uint64_t len)
{
	if (len == 0)
		return -EINVAL;
	if (!efs_freemap_all_free(fm, start, len))
		return -EUCLEAN;
	return cut(fm, efs_runs_first_after(&fm->free, start), start, len);
}

int efs_freemap_put(struct efs_freemap *fm, uint64_t start, uint64_t len)
{
	struct efs_runs *r = &fm->free;
	uint64_t end = start + len;
	bool left, right;
	size_t i;

	if (len == 0)
		return -EINVAL;
	if (!in_group(fm, start, len) || efs_runs_overlaps(r, start, len))
		return -EUCLEAN;
	/* Run |i| is the first after the new one; |i - 1| ends at or before it. */
	i = efs_runs_first_after(r, start);
	left = i > 0 && r->v[i - 1].start + r->v[i - 1].len == start;
	right = i < r->n && r->v[i].start == end;
	if (left && right) {
		r->v[i - 1].len += len + r->v[i].len;
		memmove(&r->v[i], &r->v[i + 1], (r->n - i - 1) * sizeof(*r->v));
		r->n--;
	} else if (left) {
		r->v[i - 1].len += len;
	} else if (right) {
		r->v[i].start = start;
		r->v[i].len += len;
	} else {
		if (efs_runs_reserve(r, r->n + 1) < 0)
			return -ENOMEM;
		memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof(*r->v));
		r->v[i].start = start;
		r->v[i].len = len;
		r->n++;
	}
	fm->nfree += len;
	return 0;
}

static int run_cmp(const void *a, const void *b)
{
	const struct efs_run *x = a, *y = b;

	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	return x->len < y->len ? -1 : x->len > y->len;
}

/*
 * Sorts |r| and merges overlapping and adjacent runs: the union of its
 * blocks, normalized. Cannot fail.
 */
static void union_runs(struct efs_runs *r)
{
	size_t o = 0;

	if (r->n < 2)
		return;
	qsort(r->v, r->n, sizeof(*r->v), run_cmp);
	for (size_t i = 1; i < r->n; i++) {
		uint64_t oe = r->v[o].start + r->v[o].len;
		uint64_t ie = r->v[i].start + r->v[i].len;

		if (r->v[i].start <= oe) {
			if (ie > oe)
				r->v[o].len = ie - r->v[o].start;
		} else {
			r->v[++o] = r->v[i];
		}
	}
	r->n = o + 1;
}

/* Appends [s, e) unless empty; room must have been reserved. */
static void push(struct efs_runs *r, uint64_t s, uint64_t e)
{
	if (e <= s)
		return;
	if (r->n && r->v[r->n - 1].start + r->v[r->n - 1].len == s) {
		r->v[r->n - 1].len += e - s;
		return;
	}
	r->v[r->n].start = s;
	r->v[r->n].len = e - s;
	r->n++;
}

/*
 * The fold works on copies so that -ENOMEM leaves the map and
 * |double_freed| as they were: the listed blocks inside the group are
 * sorted; a sweep splits them into their union (first occurrences) and
 * repeats (double frees); the union is then split against the free runs
 * into blocks in use (freed) and blocks already free (double frees); the
 * new free list is the merge of the old one and the freed blocks. Time
 * O((n + runs) log), memory O(n + runs).
 */
int64_t efs_freemap_fold(struct efs_freemap *fm, const struct efs_run *runs, size_t n,
			 struct efs_runs *double_freed)
{
	struct efs_runs in = {0}, uni = {0}, dbl = {0}, freed = {0}, nf = {0};
	const struct efs_runs *old = &fm->free;
	uint64_t gb = fm->group_blocks, cover = 0, total = 0;
	size_t j;
	int64_t ret = -ENOMEM;

	/*
	 * Every run gives at most one piece inside and one outside the group,
	 * and at most one repeat; the already-free pieces are bounded below.
	 */
	if (efs_runs_reserve(&in, n) < 0 || efs_runs_reserve(&dbl, 3 * n + old->n + 1) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		uint64_t s = runs[i].start, len = runs[i].len, e;

		if (len == 0)
			continue;
		e = len > UINT64_MAX - s ? UINT64_MAX : s + len;
		if (s < gb)
			push(&in, s, e < gb ? e : gb);
		if (e > gb)
			push(&dbl, s > gb ? s : gb, e);
	}
	if (in.n > 1)
		qsort(in.v, in.n, sizeof(*in.v), run_cmp);
	if (efs_runs_reserve(&uni, in.n) < 0)
		goto out;
	for (size_t i = 0; i < in.n; i++) {
		uint64_t s = in.v[i].start, e = s + in.v[i].len;

		if (i > 0 && s < cover) {
			push(&dbl, s, e < cover ? e : cover);
			push(&uni, cover, e);
		} else {
			push(&uni, s, e);
		}
		if (e > cover)
			cover = e;
	}
	/*
	 * A union run overlapping k free runs leaves at most k + 1 used pieces,
	 * and there are at most uni.n + old->n overlapping pairs.
	 */
	if (efs_runs_reserve(&freed, 2 * uni.n + old->n + 1) < 0 ||
	    efs_runs_reserve(&nf, 2 * uni.n + 2 * old->n + 1) < 0)
		goto out;
	j = 0;
	for (size_t i = 0; i < uni.n; i++) {
		uint64_t s = uni.v[i].start, e = s + uni.v[i].len;

		while (j < old->n && old->v[j].start + old->v[j].len <= s)
			j++;
		for (size_t k = j; k < old->n && old->v[k].start < e && s < e; k++) {
			uint64_t fs = old->v[k].start, fe = fs + old->v[k].len;

			push(&freed, s, fs > s ? (fs < e ? fs : e) : s);
			push(&dbl, fs > s ? fs : s, fe < e ? fe : e);
			s = fe > s ? fe : s;
		}
		push(&freed, s, e);
	}
	if (dbl.n && efs_runs_reserve(double_freed, double_freed->n + dbl.n) < 0)
		goto out;
	/* Merge the old free runs and the freed ones (disjoint, both sorted). */
	j = 0;
	for (size_t i = 0; i < old->n || j < freed.n;) {
		const struct efs_run *x;

		if (j >= freed.n || (i < old->n && old->v[i].start < freed.v[j].start))
			x = &old->v[i++];
		else
			x = &freed.v[j++];
		push(&nf, x->start, x->start + x->len);
	}
	for (size_t i = 0; i < freed.n; i++)
		total += freed.v[i].len;
	for (size_t i = 0; i < dbl.n; i++)
		double_freed->v[double_freed->n++] = dbl.v[i];
	union_runs(double_freed);
	efs_runs_done(&fm->free);
	fm->free = nf;
	nf = (struct efs_runs){0};
	fm->nfree += total;
	ret = (int64_t)total;
out:
	efs_runs_done(&nf);
	efs_runs_done(&freed);
	efs_runs_done(&dbl);
	efs_runs_done(&uni);
	efs_runs_done(&in);
	return ret;
}
