/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The rules of fcntl and flock locks, pure: no I/O.
 *
 * A lock set is what one lock owner holds in one lock namespace on one
 * inode: its ranges sorted by start, never overlapping, and never two
 * adjacent ranges of the same type (they are merged). Ranges are
 * inclusive: [start, end], end UINT64_MAX meaning "to the end of the file,
 * however it grows". Linux keeps fcntl (POSIX and OFD) locks and flock
 * locks apart: they never conflict with each other, so a caller keeps one
 * set per namespace (a flock lock is the whole range [0, UINT64_MAX]).
 *
 * Lock types are F_RDLCK, F_WRLCK and F_UNLCK (<fcntl.h>). Two locks of
 * different owners conflict when their ranges overlap and one of them is
 * F_WRLCK; the locks of one owner never conflict with each other: a new
 * request of the owner replaces what it held on its range (merging,
 * splitting, or changing the type of a sub-range).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* One held range. */
struct efs_plock {
	uint64_t start;
	uint64_t end; /* inclusive; UINT64_MAX: to EOF */
	int type;     /* F_RDLCK or F_WRLCK */
	int32_t pid;  /* process that took it, as the kernel reported it */
};

/* The ranges of one owner in one namespace (efs_mem). Zero-initialise. */
struct efs_plock_set {
	struct efs_plock *v;
	size_t n, cap;
};

/*
 * Converts an fcntl range (absolute |start|, |len| as in struct flock
 * after l_whence was applied: 0 means to EOF, a negative length covers
 * [start + len, start - 1]) into [*ret_start, *ret_end]. -EINVAL for a
 * start before 0 (also after a negative length), -EOVERFLOW when the end
 * does not fit an off_t. Nothing is written on failure.
 */
int efs_plock_span(int64_t start, int64_t len, uint64_t *ret_start, uint64_t *ret_end);

/*
 * The fcntl length of [start, end] (0 for a range to EOF, which is any end
 * past INT64_MAX, the kernel's OFFSET_MAX).
 */
int64_t efs_plock_len(uint64_t start, uint64_t end);

/*
 * Applies a request of the set's owner: |type| F_UNLCK removes [start, end]
 * from the set (splitting a range that straddles it; unlocking what is not
 * held is no error); F_RDLCK or F_WRLCK makes [start, end] held with that
 * type (replacing what was held there, then merging with adjacent or
 * overlapping ranges of the same type). The new range carries |pid|; a
 * merged one takes it too. 0, -EINVAL (bad type, start > end), -ENOMEM
 * (the set is unchanged then).
 */
int efs_plock_set_apply(struct efs_plock_set *s, uint64_t start, uint64_t end, int type,
			int32_t pid);

/*
 * The first range of |s| (lowest start) that conflicts with a request of
 * another owner for [start, end] of |type| (F_RDLCK/F_WRLCK), or NULL.
 */
const struct efs_plock *efs_plock_set_conflict(const struct efs_plock_set *s, uint64_t start,
					       uint64_t end, int type);

/* True when both sets hold the same ranges with the same types and pids. */
bool efs_plock_set_equal(const struct efs_plock_set *a, const struct efs_plock_set *b);

/* Copies |src| into |dst| (replacing it). 0 or -ENOMEM (|dst| unchanged). */
int efs_plock_set_copy(struct efs_plock_set *dst, const struct efs_plock_set *src);

/*
 * Appends a range as read from a stored record (no merging): 0, -EINVAL
 * when it is malformed (bad type, start > end) or overlaps or precedes the
 * last range (records are written sorted), -ENOMEM.
 */
int efs_plock_set_append(struct efs_plock_set *s, uint64_t start, uint64_t end, int type,
			 int32_t pid);

/* Empties the set and frees its memory. */
void efs_plock_set_clear(struct efs_plock_set *s);
