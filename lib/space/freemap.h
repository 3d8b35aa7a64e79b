/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * One allocation group's free space as run-length runs, group-relative (the
 * AgMap record of docs/FORMAT.md: runs sorted, disjoint, never adjacent,
 * inside [0, group_blocks)), plus the rules for folding free intents. Pure: no
 * I/O, all memory through efs_mem; a failing call leaves the map unchanged.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "space/runs.h"
#include "etcfs.pb-c.h"

struct efs_freemap {
	uint64_t group_blocks;
	uint64_t nfree;	      /* sum of the runs */
	struct efs_runs free; /* normalized, group-relative */
};

/* An empty map (no free block) of |group_blocks| blocks: -EINVAL when 0. */
int efs_freemap_init(struct efs_freemap *fm, uint64_t group_blocks);
/* Frees the runs; the map is then an empty one of the same group. */
void efs_freemap_done(struct efs_freemap *fm);
/* Fills |dst| (not initialised; set only on success) with a deep copy. 0 or -ENOMEM. */
int efs_freemap_copy(struct efs_freemap *dst, const struct efs_freemap *src);

/*
 * Fills |fm| (not initialised; set only on success) from a decoded record:
 * -EUCLEAN when it breaks the AgMap rules (group_blocks 0, a run empty,
 * wrapping or leaving the group, runs unsorted, overlapping or adjacent;
 * no run at all is a full group), -ENOMEM.
 */
int efs_freemap_from_msg(struct efs_freemap *fm, const Etcfs__AgMap *msg);
/* Packs the AgMap (efs_mem buffer in *ret). 0 or -ENOMEM. */
int efs_freemap_pack(const struct efs_freemap *fm, ProtobufCBinaryData *ret);
/*
 * Sets *|ret| to |runs| as a record's repeated Run field (AgMap free,
 * FreeIntent runs): runs->n pointers to copies of the runs held in the same
 * allocation, one efs_mem_free for all; NULL when |runs| is empty. 0 or
 * -ENOMEM (*|ret| untouched).
 */
int efs_freemap_pb_runs(const struct efs_runs *runs, Etcfs__Run ***ret);

/*
 * Takes up to |want| (>= 1) free blocks as one run: the first free run at or
 * after |goal| (group-relative; wrapping to the start) holding |want| blocks,
 * else the longest run (so the caller asks again for the rest). *got is set
 * and the blocks are no longer free. -ENOSPC when nothing is free.
 *
 * Precisely: candidates are visited in address order from |goal|: the part
 * of the run holding |goal| from |goal| on, the runs after it, wrapping to
 * the runs before it and last the run holding |goal| again, whole; the
 * first holding |want| gives its first |want| blocks. When none does, the
 * longest run is taken whole (the first of equals in the same order). A
 * |goal| outside the group counts as 0. -EINVAL when |want| is 0, -ENOMEM
 * (splitting a run needs room; map unchanged).
 */
int efs_freemap_alloc(struct efs_freemap *fm, uint64_t want, uint64_t goal, struct efs_run *got);
/*
 * Marks [start, start + len) used: -EUCLEAN when some block is not free (or
 * outside the group), -EINVAL when |len| is 0, -ENOMEM; nothing applied on
 * failure.
 */
int efs_freemap_take(struct efs_freemap *fm, uint64_t start, uint64_t len);
/* Marks [start, start + len) free: -EUCLEAN when some block is already free
 * or the run leaves the group (a double free: nothing applied); -EINVAL
 * when |len| is 0, -ENOMEM (nothing applied). */
int efs_freemap_put(struct efs_freemap *fm, uint64_t start, uint64_t len);
/* True when every block of the run is free / when any block is (blocks
 * outside the group are not free; an empty run: true / false). */
bool efs_freemap_all_free(const struct efs_freemap *fm, uint64_t start, uint64_t len);
bool efs_freemap_any_free(const struct efs_freemap *fm, uint64_t start, uint64_t len);

/*
 * Folds free intents: every block of |runs| (group-relative, any order,
 * possibly repeating across intents) that is in use becomes free; a block that
 * is already free — or listed twice — is a double free: it is appended to
 * |double_freed| (normalized on return) and not applied. Runs leaving the
 * group count as double frees too. Returns the number of blocks freed, or
 * -ENOMEM (map unchanged).
 *
 * Precisely: the first listing of an in-use block frees it; every later
 * listing of it, and every listing of a block free before the fold, is a
 * double free. On return |double_freed| is the union of what it held and
 * the new double frees, sorted and merged (a block at most once, however
 * often it was listed); the part of a run past 2^64 - 1 cannot be named
 * and is dropped. Runs of length 0 are ignored. -ENOMEM leaves
 * |double_freed| unchanged too. O((n + runs) log n).
 */
int64_t efs_freemap_fold(struct efs_freemap *fm, const struct efs_run *runs, size_t n,
			 struct efs_runs *double_freed);
