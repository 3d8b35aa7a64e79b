/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rules of fcntl and flock lock sets (plocktab.h).
 */
#include "fs/plocktab.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "util/mem.h"

int efs_plock_span(int64_t start, int64_t len, uint64_t *ret_start, uint64_t *ret_end)
{
	uint64_t s, e;

	if (start < 0)
		return -EINVAL;
	if (len > 0) {
		/* The last byte, start + len - 1, must fit an off_t. */
		if (len - 1 > INT64_MAX - start)
			return -EOVERFLOW;
		s = (uint64_t)start;
		e = (uint64_t)start + (uint64_t)len - 1;
	} else if (len == 0) {
		s = (uint64_t)start;
		e = UINT64_MAX;
	} else {
		/* [start + len, start - 1]; len == INT64_MIN cannot be negated. */
		if (len == INT64_MIN || -len > start)
			return -EINVAL;
		s = (uint64_t)(start + len);
		e = (uint64_t)start - 1;
	}
	*ret_start = s;
	*ret_end = e;
	return 0;
}

int64_t efs_plock_len(uint64_t start, uint64_t end)
{
	if (end > (uint64_t)INT64_MAX || start > end)
		return 0;
	return (int64_t)(end - start + 1);
}

static bool type_ok(int type)
{
	return type == F_RDLCK || type == F_WRLCK;
}

static int reserve(struct efs_plock_set *s, size_t n)
{
	struct efs_plock *v;
	size_t cap;

	if (n <= s->cap)
		return 0;
	cap = s->cap ? s->cap : 4;
	while (cap < n)
		cap *= 2;
	v = efs_mem_realloc(s->v, cap * sizeof(*v));
	if (!v)
		return -ENOMEM;
	s->v = v;
	s->cap = cap;
	return 0;
}

int efs_plock_set_apply(struct efs_plock_set *s, uint64_t start, uint64_t end, int type,
			int32_t pid)
{
	struct efs_plock *out;
	size_t n = 0, i, outcap;

	if ((type != F_UNLCK && !type_ok(type)) || start > end)
		return -EINVAL;
	/* Every old range gives at most two pieces, plus the new one. */
	outcap = 2 * s->n + 1;
	out = efs_mem_malloc(outcap * sizeof(*out));
	if (!out)
		return -ENOMEM;
	for (i = 0; i < s->n; i++) {
		const struct efs_plock *r = &s->v[i];

		if (r->end < start || r->start > end) {
			out[n++] = *r;
			continue;
		}
		if (r->start < start) {
			out[n] = *r;
			out[n++].end = start - 1;
		}
		if (r->end > end) {
			out[n] = *r;
			out[n++].start = end + 1;
		}
	}
	if (type != F_UNLCK) {
		/* Insert in start order (the pieces are sorted and none overlaps
		 * [start, end]). */
		for (i = n; i > 0 && out[i - 1].start > start; i--)
			out[i] = out[i - 1];
		out[i] = (struct efs_plock){ .start = start, .end = end, .type = type, .pid = pid };
		n++;
		/* Merge with same-type neighbours that touch it. */
		if (i + 1 < n && out[i].type == out[i + 1].type && out[i].end != UINT64_MAX &&
		    out[i].end + 1 == out[i + 1].start) {
			out[i].end = out[i + 1].end;
			memmove(&out[i + 1], &out[i + 2], (n - i - 2) * sizeof(*out));
			n--;
		}
		if (i > 0 && out[i - 1].type == out[i].type && out[i - 1].end + 1 == out[i].start) {
			out[i - 1].end = out[i].end;
			out[i - 1].pid = pid;
			memmove(&out[i], &out[i + 1], (n - i - 1) * sizeof(*out));
			n--;
		}
	}
	efs_mem_free(s->v);
	s->v = out;
	s->n = n;
	s->cap = outcap;
	return 0;
}

const struct efs_plock *efs_plock_set_conflict(const struct efs_plock_set *s, uint64_t start,
					       uint64_t end, int type)
{
	for (size_t i = 0; i < s->n; i++) {
		const struct efs_plock *r = &s->v[i];

		if (r->start > end)
			break;
		if (r->end < start)
			continue;
		if (type == F_WRLCK || r->type == F_WRLCK)
			return r;
	}
	return NULL;
}

bool efs_plock_set_equal(const struct efs_plock_set *a, const struct efs_plock_set *b)
{
	if (a->n != b->n)
		return false;
	for (size_t i = 0; i < a->n; i++) {
		if (a->v[i].start != b->v[i].start || a->v[i].end != b->v[i].end ||
		    a->v[i].type != b->v[i].type || a->v[i].pid != b->v[i].pid)
			return false;
	}
	return true;
}

int efs_plock_set_copy(struct efs_plock_set *dst, const struct efs_plock_set *src)
{
	int r = reserve(dst, src->n);

	if (r < 0)
		return r;
	if (src->n)
		memcpy(dst->v, src->v, src->n * sizeof(*src->v));
	dst->n = src->n;
	return 0;
}

int efs_plock_set_append(struct efs_plock_set *s, uint64_t start, uint64_t end, int type,
			 int32_t pid)
{
	int r;

	if (!type_ok(type) || start > end)
		return -EINVAL;
	if (s->n && s->v[s->n - 1].end >= start)
		return -EINVAL;
	r = reserve(s, s->n + 1);
	if (r < 0)
		return r;
	s->v[s->n++] = (struct efs_plock){ .start = start, .end = end, .type = type, .pid = pid };
	return 0;
}

void efs_plock_set_clear(struct efs_plock_set *s)
{
	efs_mem_free(s->v);
	s->v = NULL;
	s->n = 0;
	s->cap = 0;
}
