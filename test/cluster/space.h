/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Space across nodes: a node that has used up its groups and every
 * unowned one takes groups the idle nodes hand over, instead of answering
 * ENOSPC, and gets ENOSPC within a few seconds once the device is really
 * full. Works in |dir| (relative to every mount point, made by the
 * caller), fails through CL_CHECK and deletes what it wrote.
 */

#include "cluster.h"

void efs_space_handover(struct efs_cl *c, const char *dir);
