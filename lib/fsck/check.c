/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The checker's driver: it loads the keyspace, runs the passes in order and
 * hands out the report; the passes live in the other files of lib/fsck.
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "meta/records.h"
#include "util/mem.h"

static void state_free(state_t *st)
{
	if (!st)
		return;
	efs_mem_free(st->inos);
	for (size_t i = 0; i < st->n_des; i++)
		efs_mem_free(st->des[i].name);
	efs_mem_free(st->des);
	for (size_t i = 0; i < st->n_keys; i++)
		efs_mem_free(st->keys[i].key);
	efs_mem_free(st->keys);
	efs_mem_free(st->by_ino);
	efs_mem_free(st->runs);
	efs_mem_free(st->exts);
	efs_meta_record_free(st->fi);
	efs_mem_free(st->leases);
	efs_mem_free(st->lease_live);
	efs_mem_free(st);
}

struct efs_check_report *efs_check_report_free(struct efs_check_report *rep)
{
	if (!rep)
		return NULL;
	for (size_t i = 0; i < rep->n_findings; i++) {
		struct efs_check_finding *f = &rep->findings[i];

		efs_mem_free(f->message);
		efs_mem_free(f->repair);
		efs_mem_free(f->repair_message);
		for (size_t j = 0; j < f->n_ops; j++) {
			efs_mem_free(f->ops[j].value);
			efs_mem_free(f->ops[j].take);
			efs_mem_free(f->ops[j].put);
			efs_mem_free(f->ops[j].deps);
		}
		efs_mem_free(f->ops);
	}
	efs_mem_free(rep->findings);
	for (size_t i = 0; i < rep->n_mounted; i++)
		efs_mem_free(rep->mounted[i]);
	efs_mem_free(rep->mounted);
	state_free(rep->priv);
	efs_mem_free(rep);
	return NULL;
}

int efs_check_run(struct efs_etcd_sync *s, const struct efs_meta_ns *ns,
		  const struct efs_check_opts *o, struct efs_check_report **ret, char *err,
		  size_t err_size)
{
	struct efs_check_report *rep;
	state_t *st;
	int r;

	snprintf(err, err_size, "out of memory");
	rep = efs_mem_calloc(1, sizeof(*rep));
	if (!rep)
		return -ENOMEM;
	st = efs_mem_calloc(1, sizeof(*st));
	if (!st) {
		efs_mem_free(rep);
		return -ENOMEM;
	}
	rep->priv = st;
	st->rep = rep;
	st->blind = NONE;
	st->ns = *ns;
	r = efs_check__load(s, st, o, err, err_size);
	if (r < 0)
		goto out_free;
	rep->revision = st->rev;
	st->n_des_loaded = st->n_des;
	r = efs_check__index_keys(st);
	if (r < 0)
		goto out_free;
	r = efs_check__query_leases(s, st, err, err_size);
	if (r < 0)
		goto out_free;
	efs_check__stage_sb(st);
	efs_check__stage_leases(st);
	efs_check__mark_inode_keys(st);
	st->namespace_ok = efs_check__stage_root(st);
	if (st->namespace_ok) {
		efs_check__stage_dirents(st);
		efs_check__stage_names(st);
		efs_check__stage_lost_found(st);
		efs_check__stage_tree(st);
		efs_check__stage_unnamed(st);
		efs_check__stage_nlink(st);
	}
	efs_check__stage_orphans(st);
	efs_check__stage_strays(st);
	efs_check__stage_holders(st);
	efs_check__stage_extents(st);
	efs_check__stage_space_blocks(st);
	efs_check__stage_counter(st);
	efs_check__stage_space(st);
	r = st->err;
	if (r < 0) {
		snprintf(err, err_size, "checking the keyspace: %s", strerror(-r));
		goto out_free;
	}
	for (size_t i = 0; i < st->n_inos; i++)
		rep->inodes += !st->inos[i].removed;
	for (size_t i = 0; i < st->n_des; i++)
		rep->dirents += !st->des[i].removed;
	err[0] = '\0';
	*ret = rep;
	return 0;
out_free:
	efs_check_report_free(rep);
	return r;
}

const char *efs_check_inv_name(enum efs_check_inv inv)
{
	switch (inv) {
	case EFS_CHECK_INV_RECORD:
		return "record";
	case EFS_CHECK_INV_SB:
		return "sb";
	case EFS_CHECK_INV_ROOT:
		return "root";
	case EFS_CHECK_INV_LINKS:
		return "links";
	case EFS_CHECK_INV_TREE:
		return "tree";
	case EFS_CHECK_INV_EXTENTS:
		return "extents";
	case EFS_CHECK_INV_LOCKS:
		return "locks";
	case EFS_CHECK_INV_SPACE:
		return "space";
	case EFS_CHECK_INV_STRAY:
		return "stray";
	}
	return "?";
}
