/* SPDX-License-Identifier: Apache-2.0 */
#include "space/quarantine.h"

#include <assert.h>
#include <errno.h>
#include <string.h>

#include "util/mem.h"

/*
 * Epochs: efs_quar_add tags its run with the current epoch and then moves
 * the epoch on, so a read's ticket is not newer than a run's epoch exactly
 * when the read began before the run was added. Reads in flight are
 * counted per ticket in a ring ordered by ticket (tickets only grow, so a
 * new one goes at the back); the oldest ticket in flight is its front once
 * entries that dropped to zero are popped. Runs wait in a second ring in
 * the order they were added, which is also epoch order, so the releasable
 * runs are always a prefix of it: those whose epoch is older than the
 * oldest ticket in flight.
 *
 * efs_quar_read_begin cannot fail: a new ticket entry is only needed after
 * the epoch moved, which only efs_quar_add does, and efs_quar_add reserves
 * that entry before it moves the epoch.
 */

struct reader {
	uint64_t epoch;
	uint64_t count; /* reads in flight with this ticket (0: ended, not yet popped) */
};

struct qrun {
	uint64_t epoch;
	uint64_t start, len;
	uint32_t group;
};

/* A ring buffer of |cap| (a power of two, or 0) elements of |size| bytes. */
struct ring {
	void *v;
	size_t head, n, cap;
};

struct efs_quarantine {
	uint64_t epoch;	 /* the ticket of a read beginning now */
	uint64_t reads;	 /* reads in flight */
	uint64_t blocks; /* blocks waiting */
	struct ring readers; /* struct reader, by ticket */
	struct ring runs;    /* struct qrun, in insertion order */
};

static void *ring_at(const struct ring *r, size_t size, size_t i)
{
	return (char *)r->v + ((r->head + i) & (r->cap - 1)) * size;
}

/* Room for |n| elements. 0 or -ENOMEM (|r| unchanged). */
static int ring_reserve(struct ring *r, size_t size, size_t n)
{
	size_t cap = r->cap ? r->cap : 8, first;
	char *v;

	if (n <= r->cap)
		return 0;
	while (cap < n)
		cap *= 2;
	if (cap > SIZE_MAX / size)
		return -ENOMEM;
	v = efs_mem_malloc(cap * size);
	if (!v)
		return -ENOMEM;
	/* Unwrap: the elements from head to the end of storage, then the rest. */
	first = r->cap - r->head < r->n ? r->cap - r->head : r->n;
	if (r->n) {
		memcpy(v, (char *)r->v + r->head * size, first * size);
		memcpy(v + first * size, r->v, (r->n - first) * size);
	}
	efs_mem_free(r->v);
	r->v = v;
	r->head = 0;
	r->cap = cap;
	return 0;
}

static void ring_pop(struct ring *r)
{
	r->head = (r->head + 1) & (r->cap - 1);
	r->n--;
}

int efs_quar_new(struct efs_quarantine **ret)
{
	struct efs_quarantine *q = efs_mem_calloc(1, sizeof(*q));

	if (!q)
		return -ENOMEM;
	/* The first ticket entry, for reads that begin before any add. */
	if (ring_reserve(&q->readers, sizeof(struct reader), 1) < 0) {
		efs_mem_free(q);
		return -ENOMEM;
	}
	*ret = q;
	return 0;
}

struct efs_quarantine *efs_quar_free(struct efs_quarantine *q)
{
	if (!q)
		return NULL;
	efs_mem_free(q->readers.v);
	efs_mem_free(q->runs.v);
	efs_mem_free(q);
	return NULL;
}

uint64_t efs_quar_read_begin(struct efs_quarantine *q)
{
	struct ring *r = &q->readers;
	struct reader *back = r->n ? ring_at(r, sizeof(*back), r->n - 1) : NULL;

	if (!back || back->epoch != q->epoch) {
		/* Reserved by efs_quar_new or by the efs_quar_add that moved the epoch. */
		assert(r->n < r->cap);
		back = ring_at(r, sizeof(*back), r->n++);
		back->epoch = q->epoch;
		back->count = 0;
	}
	back->count++;
	q->reads++;
	return q->epoch;
}

void efs_quar_read_end(struct efs_quarantine *q, uint64_t ticket)
{
	struct ring *r = &q->readers;
	size_t lo = 0, hi = r->n;
	struct reader *x;

	/* Binary search: the ring is sorted by ticket. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (((struct reader *)ring_at(r, sizeof(*x), mid))->epoch < ticket)
			lo = mid + 1;
		else
			hi = mid;
	}
	x = lo < r->n ? ring_at(r, sizeof(*x), lo) : NULL;
	assert(x && x->epoch == ticket && x->count > 0);
	if (!x || x->epoch != ticket || x->count == 0)
		return;
	x->count--;
	q->reads--;
	while (r->n && ((struct reader *)ring_at(r, sizeof(*x), 0))->count == 0)
		ring_pop(r);
}

uint64_t efs_quar_reads(const struct efs_quarantine *q)
{
	return q->reads;
}

int efs_quar_add(struct efs_quarantine *q, uint32_t group, uint64_t start, uint64_t len)
{
	struct qrun *x;

	if (ring_reserve(&q->runs, sizeof(*x), q->runs.n + 1) < 0)
		return -ENOMEM;
	/* The ticket entry of reads at the next epoch (see the top of the file). */
	if (ring_reserve(&q->readers, sizeof(struct reader), q->readers.n + 1) < 0)
		return -ENOMEM;
	x = ring_at(&q->runs, sizeof(*x), q->runs.n++);
	x->epoch = q->epoch;
	x->group = group;
	x->start = start;
	x->len = len;
	q->blocks += len;
	q->epoch++;
	return 0;
}

size_t efs_quar_release(struct efs_quarantine *q,
			void (*cb)(uint32_t group, uint64_t start, uint64_t len, void *arg),
			void *arg)
{
	size_t released = 0;

	for (;;) {
		const struct reader *oldest =
			q->readers.n ? ring_at(&q->readers, sizeof(*oldest), 0) : NULL;
		struct qrun x;

		if (!q->runs.n)
			break;
		x = *(struct qrun *)ring_at(&q->runs, sizeof(x), 0);
		if (oldest && oldest->epoch <= x.epoch)
			break;
		/* Forget it before the callback, which may add runs. */
		ring_pop(&q->runs);
		q->blocks -= x.len;
		released++;
		cb(x.group, x.start, x.len, arg);
	}
	return released;
}

uint64_t efs_quar_blocks(const struct efs_quarantine *q)
{
	return q->blocks;
}
