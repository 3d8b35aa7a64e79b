/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Filesystem-wide records: the filesystem record (sb), the rename guard
 * (renameseq), the inode limit and the inode counter (ino).
 */
#include "fsck/check-int.h"

#include <inttypes.h>
#include <string.h>

#include "meta/records.h"
#include "etcfs.pb-c.h"

void efs_check__stage_counter(state_t *st)
{
	struct efs_check_finding *f;
	uint64_t max = 0;

	for (size_t i = 0; i < st->n_inos; i++)
		if (st->inos[i].ino > max)
			max = st->inos[i].ino;
	if (st->max_ino > max)
		max = st->max_ino;
	if (max < 2)
		max = 2;
	if (st->counter_present && !st->counter_bad && st->hyp_counter > max)
		return;
	if (!st->counter_present)
		f = efs_check__finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
				       "the inode counter (ino) is missing");
	else if (st->counter_bad)
		f = efs_check__finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
				       "the inode counter (ino) cannot be decoded");
	else
		f = efs_check__finding(st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
				       "the inode counter says %" PRIu64
				       " is the next free inode number, but inode %" PRIu64
				       " exists: new files would reuse numbers",
				       st->hyp_counter, max);
	efs_check__set_repair(st, f, "set it to %" PRIu64, max + 1);
	efs_check__op_counter(st, f, max + 1);
}

void efs_check__stage_sb(state_t *st)
{
	struct efs_check_finding *f;
	Etcfs__RenameSeq rs = ETCFS__RENAME_SEQ__INIT;
	struct efs_meta_key key;
	uint64_t live = 0;

	if (!st->fi) {
		efs_check__finding(
		    st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
		    "the filesystem record (sb) is missing or unreadable; fsck cannot rebuild "
		    "it (run mkfs.etcfs again, or restore it from a backup)");
	} else if (strcmp(st->fi->name, st->ns.name) != 0) {
		efs_check__finding(
		    st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
		    "the filesystem record (sb) names filesystem \"%s\", but it lives under "
		    "/etcfs/%s/",
		    st->fi->name, st->ns.name);
	}
	if (!st->renameseq_present) {
		f = efs_check__finding(
		    st, EFS_CHECK_INV_SB, EFS_CHECK_ERROR,
		    "the rename guard (renameseq) is missing: directory renames across "
		    "directories fail");
		efs_check__set_repair(st, f, "create it");
		if (efs_meta_key_renameseq(&st->ns, &key) == 0)
			efs_check__op_put(st, f, &key, &rs.base, 0);
	}
	for (size_t i = 0; i < st->n_inos; i++)
		if (!st->inos[i].removed)
			live++;
	if (st->fi && live > st->fi->inode_limit)
		efs_check__finding(
		    st, EFS_CHECK_INV_SB, EFS_CHECK_WARNING,
		    "%" PRIu64 " inodes exist, more than the inode limit %" PRIu64
		    " (creates fail with ENOSPC until some are removed or the limit is raised)",
		    live, st->fi->inode_limit);
}
