/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * One allocation group's free space as run-length runs, group-relative
 * (ARCHITECTURE.md section 6; the AgMap record of docs/FORMAT.md: runs
 * sorted, disjoint, never adjacent, inside [0, group_blocks)), plus the
 * rules for folding free intents. Pure: no I/O, all memory through
 * efs_mem; a failing call leaves the map unchanged.
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

/* An empty map (no free block) of |group_blocks| blocks (>= 1). */
int efs_freemap_init(struct efs_freemap *fm, uint64_t group_blocks);
void efs_freemap_done(struct efs_freemap *fm);
int efs_freemap_copy(struct efs_freemap *dst, const struct efs_freemap *src);

/* From a decoded record: -EUCLEAN when it breaks the AgMap rules. */
int efs_freemap_from_msg(struct efs_freemap *fm, const Etcfs__AgMap *msg);
/* Packs the AgMap (efs_mem buffer in *ret). 0 or -ENOMEM. */
int efs_freemap_pack(const struct efs_freemap *fm, ProtobufCBinaryData *ret);

/*
 * Takes up to |want| (>= 1) free blocks as one run: the first free run at or
 * after |goal| (group-relative; wrapping to the start) holding |want| blocks,
 * else the longest run (so the caller asks again for the rest). *got is set
 * and the blocks are no longer free. -ENOSPC when nothing is free.
 */
int efs_freemap_alloc(struct efs_freemap *fm, uint64_t want, uint64_t goal, struct efs_run *got);
/* Marks [start, start + len) used: -EUCLEAN when some block is not free. */
int efs_freemap_take(struct efs_freemap *fm, uint64_t start, uint64_t len);
/* Marks [start, start + len) free: -EUCLEAN when some block is already free
 * or the run leaves the group (a double free: nothing applied). */
int efs_freemap_put(struct efs_freemap *fm, uint64_t start, uint64_t len);
/* True when every block of the run is free / when any block is. */
bool efs_freemap_all_free(const struct efs_freemap *fm, uint64_t start, uint64_t len);
bool efs_freemap_any_free(const struct efs_freemap *fm, uint64_t start, uint64_t len);

/*
 * Folds free intents (section 6): every block of |runs| (group-relative,
 * any order, possibly repeating across intents) that is in use becomes
 * free; a block that is already free — or listed twice — is a double free:
 * it is appended to |double_freed| (normalized on return) and not applied.
 * Runs leaving the group count as double frees too. Returns the number of
 * blocks freed, or -ENOMEM (map unchanged).
 */
int64_t efs_freemap_fold(struct efs_freemap *fm, const struct efs_run *runs, size_t n,
			 struct efs_runs *double_freed);
