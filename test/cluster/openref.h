/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Open files across nodes (docs/DESIGN.md "Open files across nodes"): an
 * unlink on one node of a file another node has open leaves it readable
 * and writable there, its space pinned until the last close anywhere, or
 * until the opener's lease and the dead-node grace are gone; a reference
 * only cached (the file closed) does not pin it.
 *
 * Each check works in |dir| (relative to every mount point), which the
 * caller has made, and fails through CL_CHECK. |grace_s| is the nodes'
 * --dead-grace.
 */

#include "cluster.h"

/* node2 reads and writes a file node1 unlinks; space back after its close. */
void efs_oref_open_elsewhere(struct efs_cl *c, const char *dir);
/* node2 opened and closed it (reference cached); node1's unlink frees it. */
void efs_oref_cached_reference(struct efs_cl *c, const char *dir);
/* node2 is killed with the unlinked file open; a survivor frees it. */
void efs_oref_killed_opener(struct efs_cl *c, const char *dir, unsigned grace_s);
/* node2's first open of a file node1 created races node1's unlink. */
void efs_oref_first_open_races_unlink(struct efs_cl *c, const char *dir);
/* A create-write-close loop sends no open-reference commit. */
void efs_oref_create_loop_costs_nothing(struct efs_cl *c, const char *dir);
/* |nfiles| created on node1, each opened once on node1 and node2, then
 * forgotten (drop_caches): the drops go in batches. */
void efs_oref_forgotten_tree(struct efs_cl *c, const char *dir, int nfiles);
