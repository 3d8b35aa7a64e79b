/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Checks that many nodes behave as one file system: randomised histories
 * of several processes on every node, checked for linearizability
 * (history.h), with the negative controls that must make them fail, and
 * lock ping-pong under load (several nodes writing one file, or creating
 * and unlinking in one directory) checked for lost and torn updates.
 *
 * Each check works in |dir| (relative to every mount point), which the
 * caller has made, and fails through CL_CHECK; whatever it started is
 * stopped before it fails. The history checks take their seed from
 * ETCFS_HIST_SEED (else from the clock) and print it.
 */

#include "cluster.h"

/* Histories of data and attributes (names are only created). */
void efs_proof_history(struct efs_cl *c, const char *dir);
/* The same with unlinks. */
void efs_proof_history_with_unlinks(struct efs_cl *c, const char *dir);
/* The same with unlinks and renames between the paths of each pair. */
void efs_proof_history_with_renames(struct efs_cl *c, const char *dir);
void efs_proof_history_without_invalidations(struct efs_cl *c, const char *dir);
void efs_proof_history_without_recall_answers(struct efs_cl *c, const char *dir);
/* |nodes| (2 or 3) nodes write one file for a few seconds. */
void efs_proof_file_ping_pong(struct efs_cl *c, const char *dir, int nodes);
/* |nodes| (2 or 3) nodes create and unlink in one directory. */
void efs_proof_dir_ping_pong(struct efs_cl *c, const char *dir, int nodes);
