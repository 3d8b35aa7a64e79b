/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * What real clusters do to the file system: an etcd leader killed while
 * two nodes untar trees, a node killed under a write load. Nothing an
 * fsync acknowledged may be lost, and the cluster is left whole for the
 * next check (the etcd member running again with a leader, every node
 * mounted).
 *
 * Each check works in |dir| (relative to every mount point), which the
 * caller has made, and fails through CL_CHECK. What a check starts (its
 * processes, a dead etcd member, its temporary directory) is recorded
 * here: efs_faults_cleanup() stops it after a failure.
 */

#include "cluster.h"

/* node1 and node3 untar one tarball into dir/a and dir/b while the etcd
 * leader is killed; both trees are whole, seen from every node. */
void efs_faults_untar_leader_kill(struct efs_cl *c, const char *dir);
/* Writers on three nodes fsync records; node3 is killed; the survivors
 * keep writing, node1 takes node3's file over, every acknowledged record
 * is read back, and the space comes back after |grace_s| (--dead-grace). */
void efs_faults_node_kill_under_load(struct efs_cl *c, const char *dir, unsigned grace_s);
/* After a failed check: kills and reaps the processes a check of this
 * file left, restarts an etcd member it left dead, removes its files. */
void efs_faults_cleanup(struct efs_cl *c);
