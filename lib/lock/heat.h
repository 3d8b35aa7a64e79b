/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The recall history of the locks of one lock cache (lock.h), pure: no
 * I/O, no clock of its own (every call is told the time). It decides two
 * things per inode:
 *
 *  - the minimum hold: how long after a grant a peer's recall is answered
 *    at the earliest while this node still uses the lock, so that a lock
 *    is not handed back and forth once per operation (ping-pong). It
 *    starts at EFS_HEAT_HOLD_START_NS and adapts to what recalls find:
 *    a recall answered while the lock is busy (pinned, or used within
 *    the last EFS_HEAT_IDLE_GAP_NS) within the window of the grant (the
 *    larger of EFS_HEAT_WINDOW_MIN_NS and twice the hold) doubles it, up
 *    to the cache's maximum; one answered idle within the window keeps
 *    it; one that comes later than the window halves it, and below
 *    EFS_HEAT_HOLD_FLOOR_NS it is 0.
 *  - contention: an inode recalled at least |contended_recalls| times
 *    within EFS_HEAT_RATE_NS is contended for EFS_HEAT_CONTENDED_NS after
 *    its last recall. A contended lock gets no hold and the kernel caches
 *    nothing under it (lock.c).
 *
 * The table is direct-mapped (EFS_HEAT_SLOTS slots keyed by inode): an
 * inode that lands on a slot another inode used starts afresh, so its
 * memory is fixed whatever the number of locks held. Loop thread only.
 */

#include <stdbool.h>
#include <stdint.h>

#define EFS_HEAT_SLOTS		 512
#define EFS_HEAT_HOLD_START_NS	 1000000ull    /* 1 ms */
#define EFS_HEAT_IDLE_GAP_NS	 1000000ull    /* unused this long: idle */
#define EFS_HEAT_WINDOW_MIN_NS	 50000000ull   /* 50 ms */
#define EFS_HEAT_HOLD_FLOOR_NS	 250000ull     /* 250 us: below it, no hold */
#define EFS_HEAT_RATE_NS	 1000000000ull /* 1 s: recalls counted over it */
#define EFS_HEAT_CONTENDED_NS	 2000000000ull /* 2 s after the last recall */

struct efs_heat_slot {
	uint64_t ino;		   /* 0: unused */
	uint64_t hold_ns;	   /* the minimum hold now */
	uint64_t rate_start_ns;	   /* start of the period recalls are counted in */
	uint32_t rate_recalls;	   /* recalls since |rate_start_ns| */
	uint64_t contended_until_ns; /* contended before then (0: never was) */
};

struct efs_heat {
	uint64_t max_hold_ns;	    /* 0: no minimum hold at all */
	uint32_t contended_recalls; /* 0: never contended */
	struct efs_heat_slot slots[EFS_HEAT_SLOTS];
};

/* |max_hold_ns| caps the hold (0: holds are off); |contended_recalls|
 * recalls within EFS_HEAT_RATE_NS make an inode contended (0: off). */
void efs_heat_init(struct efs_heat *h, uint64_t max_hold_ns, uint32_t contended_recalls);

/* The minimum hold of |ino| now (0 when holds are off). */
uint64_t efs_heat_hold_ns(const struct efs_heat *h, uint64_t ino);

/*
 * Notes a recall of |ino| that this node answers at |now|, for the hold
 * granted at |granted_ns|; |busy|: the lock was pinned or used within
 * EFS_HEAT_IDLE_GAP_NS. Adapts the hold and counts the recall towards
 * contention.
 */
void efs_heat_note_recall(struct efs_heat *h, uint64_t ino, uint64_t granted_ns, uint64_t now,
			  bool busy);

/*
 * When a recall of |ino| may be answered at the earliest: |granted_ns| +
 * the hold, or, for a lock nobody pins (|pinned| false), |last_used_ns| +
 * EFS_HEAT_IDLE_GAP_NS when that is earlier (an idle lock is not kept
 * for the hold's sake). 0 when it may be answered at once (holds off, or
 * |ino| contended at |now|).
 */
uint64_t efs_heat_recall_due(const struct efs_heat *h, uint64_t ino, uint64_t granted_ns,
			     uint64_t last_used_ns, bool pinned, uint64_t now);

/*
 * Makes |ino| contended from |now| for EFS_HEAT_CONTENDED_NS (when
 * contention tracking is on): for a lock whose handover had to wait for
 * the kernel caches granted under it to time out.
 */
void efs_heat_mark_contended(struct efs_heat *h, uint64_t ino, uint64_t now);

/* Whether |ino| is contended at |now|. */
bool efs_heat_contended(const struct efs_heat *h, uint64_t ino, uint64_t now);

/* The number of inodes contended at |now|. */
uint64_t efs_heat_count_contended(const struct efs_heat *h, uint64_t now);
