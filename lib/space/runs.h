/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Lists of block runs [start, start + len), the currency of the space code:
 * free maps, buried and freed blocks, allocations. Pure; all memory through
 * efs_mem. A zero-initialised struct efs_runs is an empty list.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct efs_run {
	uint64_t start;
	uint64_t len; /* >= 1 */
};

struct efs_runs {
	struct efs_run *v;
	size_t n, cap;
};

/* Empties |r| and frees its storage (the list stays usable). */
void efs_runs_done(struct efs_runs *r);
/*
 * Makes room for |n| runs in |r| (its capacity; the runs stay). 0 or
 * -ENOMEM (|r| unchanged). With room for r->n + k runs, removing k runs
 * (efs_runs_remove_all of a k-run list, k efs_runs_subtract calls) never
 * allocates: each removal splits at most one run in two.
 */
int efs_runs_reserve(struct efs_runs *r, size_t n);
/* Empties |r|, keeping its storage. */
static inline void efs_runs_clear(struct efs_runs *r)
{
	r->n = 0;
}
/*
 * Appends [start, start + len) (len 0: nothing), merged into the last run
 * when it continues it. 0, -EINVAL (wraps past 2^64), -ENOMEM (|r| unchanged).
 */
int efs_runs_add(struct efs_runs *r, uint64_t start, uint64_t len);
/* Appends every run of |src|. 0 or -ENOMEM (|r| may hold a prefix). */
int efs_runs_append(struct efs_runs *r, const struct efs_runs *src);
/*
 * Sorts by start and merges adjacent runs. -EUCLEAN (and |r| sorted but
 * unmerged) when two runs overlap: a block listed twice.
 */
int efs_runs_normalize(struct efs_runs *r);
/* Sum of the lengths. */
uint64_t efs_runs_total(const struct efs_runs *r);
/*
 * Removes from |r| (normalized) every block of [start, start + len); the
 * removed blocks are appended to |cut| when not NULL. 0 or -ENOMEM (a run
 * split in two needs room).
 */
int efs_runs_subtract(struct efs_runs *r, uint64_t start, uint64_t len, struct efs_runs *cut);
/* True when some block of [start, start + len) is in |r| (normalized). */
bool efs_runs_overlaps(const struct efs_runs *r, uint64_t start, uint64_t len);
/* Index of the first run of |r| (normalized) ending after |start|: |r|->n
 * when none does. O(log n). */
size_t efs_runs_first_after(const struct efs_runs *r, uint64_t start);
/*
 * Inserts [start, start + len) (len 0: nothing) into the normalized |r|,
 * merged with the runs it touches; it must not overlap them. 0 or -ENOMEM
 * (|r| unchanged; a merge never allocates).
 */
int efs_runs_insert(struct efs_runs *r, uint64_t start, uint64_t len);
/* Inserts every run of |src| into the normalized |r|. 0 or -ENOMEM (|r|
 * may hold a prefix of |src|). */
int efs_runs_insert_all(struct efs_runs *r, const struct efs_runs *src);
/*
 * Removes every block of |src| from the normalized |r|; the removed blocks
 * are appended to |cut| when not NULL. 0 or -ENOMEM (|r| may have lost a
 * prefix of |src|, and |cut| holds what was removed).
 */
int efs_runs_remove_all(struct efs_runs *r, const struct efs_runs *src, struct efs_runs *cut);
/*
 * Splits [start, start + len) by the normalized |set|: the blocks in it are
 * appended to |in|, the others to |out|, in address order. 0 or -ENOMEM
 * (|in| and |out| may hold a prefix).
 */
int efs_runs_split(const struct efs_runs *set, uint64_t start, uint64_t len, struct efs_runs *in,
		   struct efs_runs *out);
