/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A node cut off from etcd (its veth down: packets lost silently, as in a
 * real partition) while it is alive: it suspends, its waiting operations
 * fail with EIO once its --quorum-timeout has passed, it serves no stale
 * data while a peer changes a file it had read, nothing it wrote after the
 * cut becomes visible to anyone, and it serves again once the link
 * returns.
 *
 * Works in |dir| (relative to every mount point, made by the caller) on a
 * cluster started with opts.netns; node 2 is the one cut off (remounted
 * with a short --quorum-timeout, and mounted again as before at the end).
 * Fails through CL_CHECK; prints the measured times as TAP comments.
 */

#include "cluster.h"

void efs_part_cut_off_node(struct efs_cl *c, const char *dir);
