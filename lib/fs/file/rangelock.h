/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Block-range locks of one file's data state: a request takes [start, end)
 * of the file's blocks before it rewrites, truncates or punches them, so
 * that overlapping writes, truncates and punches (and with them the
 * read-merge-write of partial blocks) are serialised while disjoint ones
 * run concurrently. Waiters are served in order: a request never passes
 * an earlier overlapping waiter. The module allocates nothing; the caller
 * owns every struct efs_rangelock_req until it is dropped (or, for a
 * waiter, until its callback has run and it is dropped).
 *
 * Loop thread only.
 */

#include <stdbool.h>
#include <stdint.h>

/* One range [start, end), held or waiting. */
struct efs_rangelock_req {
	uint64_t start, end;
	struct efs_rangelock_req *next;
	bool held; /* granted and not yet dropped */
	void (*cb)(void *arg);
	void *arg;
};

/* The locks of one owner; zero-initialised is empty. */
struct efs_rangelock {
	struct efs_rangelock_req *held; /* granted ranges */
	struct efs_rangelock_req *wait; /* waiting ranges, in request order */
};

/*
 * Takes [|start|, |end|) with |l|: 1 when granted now (|cb| never runs),
 * 0 when it waits (|cb| with |arg| runs once it is granted, from a later
 * efs_rangelock_drop).
 */
int efs_rangelock_take(struct efs_rangelock *s, struct efs_rangelock_req *l, uint64_t start,
		       uint64_t end, void (*cb)(void *arg), void *arg);
/*
 * Drops the held range |l| (nothing when it is not held) and grants, in
 * order, the waiters that now overlap neither a holder nor an earlier
 * waiter; their callbacks run before it returns, once the lists are
 * consistent (they may take or drop ranges themselves).
 */
void efs_rangelock_drop(struct efs_rangelock *s, struct efs_rangelock_req *l);
/* True when a range is held or waiting. */
bool efs_rangelock_busy(const struct efs_rangelock *s);
