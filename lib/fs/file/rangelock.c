/* SPDX-License-Identifier: Apache-2.0 */
/* Block-range locks (fs/file/rangelock.h). */
#include "fs/file/rangelock.h"

#include <stddef.h>

static bool rl_overlaps(const struct efs_rangelock_req *a, uint64_t s, uint64_t e)
{
	return a->start < e && s < a->end;
}

int efs_rangelock_take(struct efs_rangelock *s, struct efs_rangelock_req *l, uint64_t start,
		       uint64_t end, void (*cb)(void *arg), void *arg)
{
	l->start = start;
	l->end = end;
	l->cb = cb;
	l->arg = arg;
	l->held = false;
	l->next = NULL;
	for (struct efs_rangelock_req *x = s->held; x; x = x->next)
		if (rl_overlaps(x, start, end))
			goto wait;
	for (struct efs_rangelock_req *x = s->wait; x; x = x->next)
		if (rl_overlaps(x, start, end))
			goto wait;
	l->held = true;
	l->next = s->held;
	s->held = l;
	return 1;
wait: {
	struct efs_rangelock_req **pp = &s->wait;

	while (*pp)
		pp = &(*pp)->next;
	*pp = l;
	return 0;
}
}

void efs_rangelock_drop(struct efs_rangelock *s, struct efs_rangelock_req *l)
{
	struct efs_rangelock_req **pp;
	struct efs_rangelock_req *grant = NULL, **gt = &grant;

	if (!l->held)
		return;
	for (pp = &s->held; *pp; pp = &(*pp)->next) {
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	}
	l->held = false;
	l->next = NULL;
	/* Grant, in order, the waiters that overlap neither a holder nor an
	 * earlier waiter that stays; their callbacks run once the lists are
	 * consistent (they may take or drop locks themselves). */
	pp = &s->wait;
	while (*pp) {
		struct efs_rangelock_req *w = *pp;
		bool ok = true;

		for (struct efs_rangelock_req *x = s->held; x && ok; x = x->next)
			if (rl_overlaps(x, w->start, w->end))
				ok = false;
		for (struct efs_rangelock_req *x = s->wait; x != w && ok; x = x->next)
			if (rl_overlaps(x, w->start, w->end))
				ok = false;
		for (struct efs_rangelock_req *x = grant; x && ok; x = x->next)
			if (rl_overlaps(x, w->start, w->end))
				ok = false;
		if (!ok) {
			pp = &w->next;
			continue;
		}
		*pp = w->next;
		w->next = NULL;
		*gt = w;
		gt = &w->next;
	}
	/* Move the granted ones to the held list, then call them. */
	{
		struct efs_rangelock_req *cbs[64];
		size_t n = 0;

		while (grant) {
			struct efs_rangelock_req *w = grant;

			grant = w->next;
			w->held = true;
			w->next = s->held;
			s->held = w;
			if (n < 64) {
				cbs[n++] = w;
			} else {
				/* Not called now: back to waiting (granted later). */
				w->held = false;
				s->held = w->next;
				w->next = s->wait;
				s->wait = w;
			}
		}
		for (size_t i = 0; i < n; i++)
			cbs[i]->cb(cbs[i]->arg);
	}
}

bool efs_rangelock_busy(const struct efs_rangelock *s)
{
	return s->held || s->wait;
}
