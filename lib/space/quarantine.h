/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Quarantine of freed blocks: a block freed by a publication may still be
 * under a device read that started before the publication (a reader that
 * looked the old extent up). Reads take an epoch ticket when they look extents
 * up and return it when the device read ends; a freed run waits until every
 * read whose ticket is not newer than the free has ended, then it is handed
 * back. Pure and single-threaded (the loop's), all memory through efs_mem.
 */

#include <stddef.h>
#include <stdint.h>

struct efs_quarantine;

/* 0 or -ENOMEM (*ret set only on success). */
int efs_quar_new(struct efs_quarantine **ret);
/* Frees the quarantine and the runs still in it. Accepts NULL; returns NULL. */
struct efs_quarantine *efs_quar_free(struct efs_quarantine *q);

/*
 * A read starts (before it looks up extents): returns its ticket. Never
 * fails and never allocates (efs_quar_add reserves what the next epoch's
 * first read needs). Tickets never decrease; reads begun with no
 * efs_quar_add in between share one. O(1).
 */
uint64_t efs_quar_read_begin(struct efs_quarantine *q);
/*
 * The read with |ticket| ended (its device I/O completed or failed); reads
 * may end in any order. Ending a ticket that has no read in flight is a
 * programmer error (asserted; ignored without assertions). O(log reads).
 */
void efs_quar_read_end(struct efs_quarantine *q, uint64_t ticket);
/* Reads in flight. */
uint64_t efs_quar_reads(const struct efs_quarantine *q);

/*
 * Blocks [start, start + len) of |group| are free as of now: they are
 * released once every read begun before this call has ended (at once when
 * none is in flight: the next efs_quar_release returns them). 0 or -ENOMEM.
 */
int efs_quar_add(struct efs_quarantine *q, uint32_t group, uint64_t start, uint64_t len);
/*
 * Hands every releasable run to |cb| (in the order they were added) and
 * forgets it; returns the number of runs released. A run is forgotten
 * before |cb| sees it, and |cb| may call efs_quar_add (a run it adds is
 * released in this same call when it is already releasable) and
 * efs_quar_read_begin/_end. O(1) per run released.
 */
size_t efs_quar_release(struct efs_quarantine *q,
			void (*cb)(uint32_t group, uint64_t start, uint64_t len, void *arg),
			void *arg);
/* Blocks waiting. */
uint64_t efs_quar_blocks(const struct efs_quarantine *q);
