/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The namespace: the root and lost+found, directory entries, the tree of
 * directories, link counts, unnamed inodes, orphan and reclaim records, and
 * per-inode keys of inodes that do not exist.
 */
#include "fsck/check-int.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "meta/records.h"
#include "util/mem.h"
#include "etcfs.pb-c.h"

void efs_check__mark_inode_keys(state_t *st)
{
	for (size_t i = 0; i < st->n_keys; i++) {
		struct key_ent *k = &st->keys[i];
		struct ino_ent *e;

		if (k->removed)
			continue;
		e = efs_check__find_ino(st, k->ino);
		if (!e)
			continue;
		switch (k->family) {
		case EFS_META_K_ORPHAN:
			e->has_orphan = true;
			break;
		case EFS_META_K_RECLAIM:
			e->has_reclaim = true;
			break;
		case EFS_META_K_OPEN:
			e->has_open = true;
			break;
		case EFS_META_K_EXTENT:
			e->has_extents = true;
			break;
		default:
			break;
		}
	}
}

bool efs_check__stage_root(state_t *st)
{
	struct ino_ent *root = efs_check__find_ino(st, EFS_META_ROOT_INO);
	struct efs_check_finding *f;

	if (!root) {
		efs_check__finding(
		    st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
		    "the root directory (inode 1) does not exist; fsck cannot rebuild it, so "
		    "the name and link checks are skipped");
		return false;
	}
	if (!efs_check__is_dir(root)) {
		efs_check__finding(
		    st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
		    "the root inode 1 is a %s, not a directory; fsck cannot repair that, so "
		    "the name and link checks are skipped",
		    efs_check__type_word(root->mode));
		return false;
	}
	if (root->parent != EFS_META_ROOT_INO) {
		f = efs_check__finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
				       "the root directory's parent pointer is %" PRIu64
				       " instead of 1",
				       root->parent);
		efs_check__set_repair(st, f, "set it to 1");
		efs_check__op_patch(st, f, root, false, 0, true, EFS_META_ROOT_INO);
		root->hyp_parent = EFS_META_ROOT_INO;
	}
	root->reached = true;
	return true;
}

/* Entries that cannot stand: in a missing or non-directory parent, naming
 * nothing, or naming the root. */
void efs_check__stage_dirents(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700];

	/* Provisional names, only for the paths in messages; stage_names
	 * chooses the real ones. */
	for (size_t i = 0; i < st->n_des; i++) {
		struct ino_ent *t = efs_check__live_ino(st, st->des[i].ino);

		if (t && t->name_idx == NONE && t->ino != EFS_META_ROOT_INO)
			t->name_idx = i;
	}

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *p = efs_check__live_ino(st, d->parent),
			       *t = efs_check__live_ino(st, d->ino);

		efs_check__de_desc(st, d, desc, sizeof(desc));
		if (!p)
			f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
					       "%s: the directory does not exist", desc);
		else if (!efs_check__is_dir(p))
			f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
					       "%s: inode %" PRIu64 " is a %s, not a directory",
					       desc, p->ino, efs_check__type_word(p->mode));
		else if (d->ino == EFS_META_ROOT_INO)
			f = efs_check__finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
					       "%s names the root directory, which has no name",
					       desc);
		else if (!t)
			f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
					       "%s names inode %" PRIu64 ", which does not exist",
					       desc, d->ino);
		else
			continue;
		efs_check__set_repair(st, f, "delete the entry");
		efs_check__op_del_dirent(st, f, i);
		d->removed = true;
	}
	for (size_t i = 0; i < st->n_inos; i++)
		st->inos[i].name_idx = NONE;
}

/* Counts names, picks each directory's one name, removes the others and
 * fixes entry types. */
void efs_check__stage_names(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700], idesc[700];

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t;

		if (d->removed)
			continue;
		t = efs_check__live_ino(st, d->ino);
		efs_check__live_ino(st, d->parent)->has_children = true;
		t->names++;
		if (t->name_idx == NONE)
			t->name_idx = i;
		else if (efs_check__is_dir(t) && st->des[t->name_idx].parent != t->parent &&
			 d->parent == t->parent)
			t->name_idx = i;
	}
	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t;
		uint32_t dt;

		if (d->removed)
			continue;
		t = efs_check__live_ino(st, d->ino);
		if (efs_check__is_dir(t) && t->name_idx != i) {
			efs_check__de_desc(st, d, desc, sizeof(desc));
			efs_check__ino_desc(st, t->ino, idesc, sizeof(idesc));
			f = efs_check__finding(
			    st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
			    "%s is a second name of %s (a directory has exactly one name)", desc,
			    idesc);
			efs_check__set_repair(st, f, "delete this entry");
			efs_check__op_del_dirent(st, f, i);
			d->removed = true;
			t->names--;
			continue;
		}
		dt = efs_meta_dt_from_mode(t->mode);
		if (d->type != dt) {
			struct efs_check_op *op;

			efs_check__de_desc(st, d, desc, sizeof(desc));
			f = efs_check__finding(
			    st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
			    "%s says it names a %s, but inode %" PRIu64 " is a %s", desc,
			    efs_check__dt_word(d->type), t->ino, efs_check__type_word(t->mode));
			efs_check__set_repair(st, f, "set the entry's type to %s",
					      efs_check__dt_word(dt));
			op = efs_check__add_op(st, f, OP_DIRENT_PATCH);
			if (op) {
				if (efs_meta_key_dirent(&st->ns, d->parent, d->name, d->name_len,
							&op->key) < 0)
					st->err = -EINVAL;
				op->de = i;
				op->type = dt;
			}
			d->type = dt;
		}
	}
}

/* Whether a live entry |name| exists in |parent|: a binary search of the
 * entries read (in key order: parent, then name bytes), then the added ones. */
static bool find_de(const state_t *st, uint64_t parent, const char *name)
{
	size_t len = strlen(name), lo = 0, hi = st->n_des_loaded;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct de_ent *d = &st->des[mid];
		int c;

		if (d->parent != parent) {
			c = d->parent < parent ? -1 : 1;
		} else {
			c = memcmp(d->name, name, d->name_len < len ? d->name_len : len);
			if (c == 0)
				c = d->name_len < len ? -1 : d->name_len > len;
		}
		if (c == 0)
			return !d->removed;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = st->n_des_loaded; i < st->n_des; i++)
		if (st->des[i].parent == parent && !st->des[i].removed &&
		    strcmp(st->des[i].name, name) == 0)
			return true;
	return false;
}

/* Links |e| into lost+found as "#<ino>" (with |del|, in the same
 * transaction, the entry that named it is deleted). */
static void relink(state_t *st, struct efs_check_finding *f, struct ino_ent *e, size_t del)
{
	char name[32];
	struct efs_meta_key key;
	Etcfs__Dirent de = ETCFS__DIRENT__INIT;
	struct efs_check_op *op;
	struct ino_ent *lf = efs_check__live_ino(st, st->lf);
	char pre[320] = "";
	size_t di;
	int n = 0;

	/* Without a lost+found the finding stays without a repair. */
	if (!lf || !f)
		return;
	for (;;) {
		bool taken = false;

		if (n == 0)
			snprintf(name, sizeof(name), "#%" PRIu64, e->ino);
		else
			snprintf(name, sizeof(name), "#%" PRIu64 ".%d", e->ino, n);
		taken = find_de(st, lf->ino, name);
		if (!taken)
			break;
		n++;
	}
	if (del != NONE) {
		struct ino_ent *old = efs_check__live_ino(st, st->des[del].parent);

		if (old && efs_check__is_dir(e))
			old->sub_delta--;
		efs_check__op_del_dirent(st, f, del);
		st->des[del].removed = true;
		snprintf(pre, sizeof(pre),
			 "delete the entry \"%s\" in directory inode %" PRIu64 " and ",
			 st->des[del].name, st->des[del].parent);
	}
	de.ino = e->ino;
	de.type = efs_meta_dt_from_mode(e->mode);
	if (efs_meta_key_dirent(&st->ns, lf->ino, name, strlen(name), &key) < 0) {
		st->err = -EINVAL;
		return;
	}
	efs_check__op_require(st, f, lf->ino);
	di = efs_check__add_de(st, lf->ino, name, strlen(name), e->ino, de.type, 0);
	if (di == NONE)
		return;
	op = efs_check__op_put(st, f, &key, &de.base, 0);
	if (op)
		op->de = di;
	if (del == NONE)
		e->names++;
	e->name_idx = di;
	if (efs_check__is_dir(e)) {
		lf->sub_delta++;
		if (e->hyp_parent != lf->ino)
			efs_check__op_patch(st, f, e, false, 0, true, lf->ino);
		e->hyp_parent = lf->ino;
		efs_check__set_repair(st, f, "%slink it into /lost+found as \"%s\"", pre, name);
	} else if (e->hyp_nlink != e->names) {
		efs_check__op_patch(st, f, e, true, e->names, false, 0);
		efs_check__set_repair(
		    st, f, "%slink it into /lost+found as \"%s\" with link count %" PRIu32, pre,
		    name, e->names);
		e->hyp_nlink = e->names;
	} else {
		efs_check__set_repair(st, f, "%slink it into /lost+found as \"%s\"", pre, name);
	}
}

void efs_check__stage_lost_found(state_t *st)
{
	struct efs_check_finding *f;
	struct ino_ent *two;
	struct efs_meta_key key;
	const char *lfn = "lost+found";

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t;

		if (d->removed || d->parent != EFS_META_ROOT_INO || strcmp(d->name, lfn) != 0)
			continue;
		t = efs_check__live_ino(st, d->ino);
		if (efs_check__is_dir(t)) {
			st->lf = t->ino;
			return;
		}
		efs_check__finding(
		    st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
		    "/lost+found is a %s (inode %" PRIu64
		    "), not a directory; fsck will not replace it, so unnamed inodes cannot "
		    "be linked anywhere",
		    efs_check__type_word(t->mode), t->ino);
		return;
	}
	if (efs_meta_key_dirent(&st->ns, EFS_META_ROOT_INO, lfn, strlen(lfn), &key) < 0) {
		st->err = -EINVAL;
		return;
	}
	two = efs_check__live_ino(st, 2);
	if (two && efs_check__is_dir(two) && two->names == 0) {
		Etcfs__Dirent de = ETCFS__DIRENT__INIT;
		struct efs_check_op *op;
		size_t di;

		f = efs_check__finding(
		    st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
		    "/lost+found is missing; directory inode 2 (the lost+found mkfs made) "
		    "has no name");
		efs_check__set_repair(st, f, "link inode 2 into / as lost+found");
		de.ino = 2;
		de.type = DT_DIR;
		efs_check__op_require(st, f, EFS_META_ROOT_INO);
		di = efs_check__add_de(st, EFS_META_ROOT_INO, lfn, strlen(lfn), 2, DT_DIR, 0);
		op = efs_check__op_put(st, f, &key, &de.base, 0);
		if (op)
			op->de = di;
		if (two->hyp_parent != EFS_META_ROOT_INO)
			efs_check__op_patch(st, f, two, false, 0, true, EFS_META_ROOT_INO);
		two->hyp_parent = EFS_META_ROOT_INO;
		two->names = 1;
		two->name_idx = di;
		st->lf = 2;
		return;
	}
	{
		Etcfs__Inode in = ETCFS__INODE__INIT;
		Etcfs__Dirent de = ETCFS__DIRENT__INIT;
		struct efs_meta_key ikey;
		struct efs_check_op *op;
		struct ino_ent *e;
		uint64_t ino = st->max_ino + 1;
		size_t di;

		if (!st->counter_bad && st->counter_present && st->hyp_counter > ino)
			ino = st->hyp_counter;
		f = efs_check__finding(st, EFS_CHECK_INV_ROOT, EFS_CHECK_ERROR,
				       "there is no /lost+found");
		efs_check__set_repair(st, f, "create it (as inode %" PRIu64 ")", ino);
		in.mode = S_IFDIR | 0700;
		in.nlink = 2;
		in.parent = EFS_META_ROOT_INO;
		in.atime_ns = in.mtime_ns = in.ctime_ns = in.btime_ns = efs_check__now_ns();
		de.ino = ino;
		de.type = DT_DIR;
		if (efs_meta_key_inode(&st->ns, ino, &ikey) < 0) {
			st->err = -EINVAL;
			return;
		}
		efs_check__op_require(st, f, EFS_META_ROOT_INO);
		op = efs_check__op_put(st, f, &ikey, &in.base, 0);
		if (op)
			op->ino = ino;
		di = efs_check__add_de(st, EFS_META_ROOT_INO, lfn, strlen(lfn), ino, DT_DIR, 0);
		op = efs_check__op_put(st, f, &key, &de.base, 0);
		if (op)
			op->de = di;
		efs_check__op_counter(st, f, ino + 1);
		st->counter_bad = false;
		st->counter_present = true;
		st->max_ino = ino;
		e = efs_check__slot(st, &st->inos, &st->cap_inos, st->n_inos, sizeof(*e));
		if (!e)
			return;
		st->n_inos++;
		e->ino = ino;
		e->mode = in.mode;
		e->nlink = e->hyp_nlink = 2;
		e->parent = e->hyp_parent = EFS_META_ROOT_INO;
		e->names = 1;
		e->name_idx = di;
		st->lf = ino;
	}
}

/* An inode no entry names and whose link count is 0 without an orphan or
 * reclaim record. */
static void unreachable_zero(state_t *st, struct ino_ent *e)
{
	struct efs_check_finding *f;
	struct efs_meta_key key;
	char node[EFS_META_NODE_MAX + 1] = "";
	size_t lo, hi;

	if (e->has_open) {
		Etcfs__Orphan o = ETCFS__ORPHAN__INIT;

		efs_check__keys_of(st, e->ino, &lo, &hi);
		for (size_t i = lo; i < hi; i++) {
			const struct key_ent *k = &st->keys[st->by_ino[i]];

			if (k->family == EFS_META_K_OPEN && !k->removed)
				memcpy(node, k->node, sizeof(node));
		}
		f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				       "%s inode %" PRIu64
				       " has link count 0 and no name but no orphan "
				       "record, while node %s has it open",
				       efs_check__type_word(e->mode), e->ino, node);
		efs_check__set_repair(st, f,
				      "make it an orphan (freed when its last opener closes it)");
		o.since_ns = efs_check__now_ns();
		if (efs_meta_key_orphan(&st->ns, e->ino, &key) == 0)
			efs_check__op_put(st, f, &key, &o.base, 0);
		e->has_orphan = true;
		return;
	}
	if (e->has_extents) {
		Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT;

		f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				       "%s inode %" PRIu64
				       " has link count 0, no name and no orphan or "
				       "reclaim record: nothing can reach or free it",
				       efs_check__type_word(e->mode), e->ino);
		efs_check__set_repair(st, f,
				      "give it a reclaim record, so that a node frees its blocks");
		rc.since_ns = efs_check__now_ns();
		if (efs_meta_key_reclaim(&st->ns, e->ino, &key) == 0)
			efs_check__op_put(st, f, &key, &rc.base, 0);
		e->has_reclaim = true;
		return;
	}
	f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
			       "%s inode %" PRIu64
			       " has link count 0, no name and no orphan or reclaim "
			       "record: nothing can reach or free it",
			       efs_check__type_word(e->mode), e->ino);
	efs_check__set_repair(st, f, "delete it with its extended attributes and lock keys");
	efs_check__op_del_inode(st, f, e->ino, e->mod);
	efs_check__keys_of(st, e->ino, &lo, &hi);
	for (size_t i = lo; i < hi; i++) {
		struct key_ent *k = &st->keys[st->by_ino[i]];

		if (k->removed)
			continue;
		if (k->family == EFS_META_K_XATTR || k->family == EFS_META_K_HOLDER ||
		    k->family == EFS_META_K_RECALL || k->family == EFS_META_K_PLOCK) {
			if (f && f->n_ops >= OPS_PER_FINDING)
				break; /* the stray stage takes the rest */
			efs_check__op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
		}
	}
	e->removed = true;
}

static void reach_from(state_t *st, uint64_t start, size_t *order, size_t n_order)
{
	uint64_t *queue;
	size_t head = 0, tail = 0, cap = 64;

	queue = efs_mem_malloc(cap * sizeof(*queue));
	if (!queue) {
		st->err = -ENOMEM;
		return;
	}
	queue[tail++] = start;
	while (head < tail) {
		uint64_t dir = queue[head++];
		size_t lo = 0, hi = n_order;

		/* |order| holds live entries sorted by parent. */
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (st->des[order[mid]].parent < dir)
				lo = mid + 1;
			else
				hi = mid;
		}
		for (size_t i = lo; i < n_order && st->des[order[i]].parent == dir; i++) {
			struct de_ent *d = &st->des[order[i]];
			struct ino_ent *t = efs_check__live_ino(st, d->ino);

			if (d->removed || !t || t->reached)
				continue;
			if (efs_check__is_dir(t) && t->name_idx != order[i])
				continue;
			t->reached = true;
			if (!efs_check__is_dir(t))
				continue;
			if (tail == cap) {
				uint64_t *q = efs_mem_realloc(queue, cap * 2 * sizeof(*q));

				if (!q) {
					st->err = -ENOMEM;
					break;
				}
				queue = q;
				cap *= 2;
			}
			queue[tail++] = t->ino;
		}
	}
	efs_mem_free(queue);
}

static int cmp_de_parent(const void *a, const void *b, void *arg)
{
	const state_t *st = arg;
	const struct de_ent *x = &st->des[*(const size_t *)a];
	const struct de_ent *y = &st->des[*(const size_t *)b];

	if (x->parent != y->parent)
		return x->parent < y->parent ? -1 : 1;
	return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

static size_t *order_by_parent(state_t *st, size_t *ret_n)
{
	size_t *order = efs_mem_malloc((st->n_des + 1) * sizeof(*order));
	size_t n = 0;

	if (!order) {
		st->err = -ENOMEM;
		return NULL;
	}
	for (size_t i = 0; i < st->n_des; i++)
		if (!st->des[i].removed)
			order[n++] = i;
	qsort_r(order, n, sizeof(*order), cmp_de_parent, st);
	*ret_n = n;
	return order;
}

/* Directories: parent pointers, unnamed directories, cycles. */
void efs_check__stage_tree(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700], pdesc[700];
	size_t *order, n_order;

	for (size_t i = 0; i < st->n_inos; i++) {
		struct ino_ent *e = &st->inos[i];

		if (e->removed || !efs_check__is_dir(e) || e->ino == EFS_META_ROOT_INO)
			continue;
		if (e->names == 0) {
			if (e->hyp_nlink == 0 && (e->has_orphan || e->has_reclaim))
				continue; /* removed while open: an orphan */
			if (e->hyp_nlink == 0 && !e->has_children) {
				unreachable_zero(st, e);
				continue;
			}
			f = efs_check__finding(
			    st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
			    "directory inode %" PRIu64 " has no name in any directory", e->ino);
			relink(st, f, e, NONE);
			continue;
		}
		{
			const struct de_ent *d = &st->des[e->name_idx];

			if (e->hyp_parent != d->parent) {
				efs_check__ino_desc(st, e->ino, desc, sizeof(desc));
				efs_check__ino_desc(st, d->parent, pdesc, sizeof(pdesc));
				f = efs_check__finding(st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
						       "%s says its parent is inode %" PRIu64
						       ", but it is named in %s",
						       desc, e->hyp_parent, pdesc);
				efs_check__set_repair(st, f, "set its parent to %" PRIu64,
						      d->parent);
				efs_check__op_patch(st, f, e, false, 0, true, d->parent);
				e->hyp_parent = d->parent;
			}
		}
	}
	if (st->err)
		return;
	order = order_by_parent(st, &n_order);
	if (!order)
		return;
	reach_from(st, EFS_META_ROOT_INO, order, n_order);
	for (size_t i = 0; i < st->n_inos && !st->err; i++) {
		struct ino_ent *e = &st->inos[i], *x, *m;
		char names[600];
		size_t o = 0;
		uint64_t id = ++st->walk;

		if (e->removed || !efs_check__is_dir(e) || e->reached || e->names == 0)
			continue;
		/* Follow the names up: it cannot reach the root, so it ends in a cycle. */
		x = e;
		while (x && !x->reached && x->walk != id && x->name_idx != NONE) {
			x->walk = id;
			x = efs_check__live_ino(st, st->des[x->name_idx].parent);
		}
		if (!x || x->reached || x->name_idx == NONE || x->walk != id)
			continue;
		/* |x| is on the cycle: find its smallest member and name them all. */
		m = x;
		names[0] = '\0';
		for (struct ino_ent *y = x;;) {
			const struct de_ent *d = &st->des[y->name_idx];

			if (y->ino < m->ino)
				m = y;
			if (o + 1 < sizeof(names))
				o += (size_t)snprintf(
					names + o, sizeof(names) - o,
					"%s\"%s\" (inode %" PRIu64 ", in %" PRIu64 ")",
					o ? ", " : "", d->name, y->ino, d->parent);
			y = efs_check__live_ino(st, d->parent);
			if (!y || y == x)
				break;
		}
		f = efs_check__finding(
		    st, EFS_CHECK_INV_TREE, EFS_CHECK_ERROR,
		    "directories %s name each other in a cycle that the root does not "
		    "reach",
		    names);
		relink(st, f, m, m->name_idx);
		/* The entry list grew: rebuild the order and go on from |m|. */
		efs_mem_free(order);
		order = order_by_parent(st, &n_order);
		if (!order)
			return;
		m->reached = true;
		reach_from(st, m->ino, order, n_order);
	}
	efs_mem_free(order);
}

/* Non-directories that no entry names. */
void efs_check__stage_unnamed(state_t *st)
{
	struct efs_check_finding *f;

	for (size_t i = 0; i < st->n_inos && !st->err; i++) {
		struct ino_ent *e = &st->inos[i];

		if (e->removed || efs_check__is_dir(e) || e->names != 0)
			continue;
		if (e->hyp_nlink == 0) {
			if (e->has_orphan || e->has_reclaim)
				continue;
			unreachable_zero(st, e);
			continue;
		}
		f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
				       "%s inode %" PRIu64 " (link count %" PRIu32
				       ") has no name in any directory",
				       efs_check__type_word(e->mode), e->ino, e->hyp_nlink);
		relink(st, f, e, NONE);
	}
}

void efs_check__stage_nlink(state_t *st)
{
	struct efs_check_finding *f;
	char desc[700];

	for (size_t i = 0; i < st->n_des; i++) {
		struct de_ent *d = &st->des[i];
		struct ino_ent *t, *p;

		if (d->removed)
			continue;
		t = efs_check__live_ino(st, d->ino);
		p = efs_check__live_ino(st, d->parent);
		if (t && p && efs_check__is_dir(t) && t->name_idx == i)
			p->subdirs++;
	}
	for (size_t i = 0; i < st->n_inos && !st->err; i++) {
		struct ino_ent *e = &st->inos[i];
		uint32_t want;

		if (e->removed)
			continue;
		if (e->names == 0 && e->ino != EFS_META_ROOT_INO)
			continue; /* orphans, and what could not be linked */
		want = efs_check__is_dir(e) ? 2 + e->subdirs : e->names;
		if (e->hyp_nlink == want)
			continue;
		efs_check__ino_desc(st, e->ino, desc, sizeof(desc));
		if (efs_check__is_dir(e) && e->sub_delta &&
		    (int64_t)e->hyp_nlink + e->sub_delta == want)
			/* Right before the repairs above moved directories. */
			f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_NOTE,
					       "%s needs link count %" PRIu32
					       " after the repairs above move "
					       "directories (it has %" PRIu32 ")",
					       desc, want, e->hyp_nlink);
		else if (efs_check__is_dir(e))
			f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
					       "%s has link count %" PRIu32 ", but with %" PRIu32
					       " subdirector%s it should be %" PRIu32,
					       desc, e->hyp_nlink, e->subdirs,
					       e->subdirs == 1 ? "y" : "ies", want);
		else
			f = efs_check__finding(
			    st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
			    "%s has link count %" PRIu32 ", but %" PRIu32 " name%s %s it", desc,
			    e->hyp_nlink, want, want == 1 ? "" : "s", want == 1 ? "names" : "name");
		if (want > EFS_META_LINK_MAX)
			continue; /* more names than the link limit: no safe repair */
		efs_check__set_repair(st, f, "set it to %" PRIu32, want);
		efs_check__op_patch(st, f, e, true, want, false, 0);
		e->hyp_nlink = want;
	}
}


/* Orphan and reclaim records against their inodes' link counts. */
void efs_check__stage_orphans(state_t *st)
{
	struct efs_check_finding *f;

	for (size_t i = 0; i < st->n_keys && !st->err; i++) {
		struct key_ent *k = &st->keys[i];
		bool orphan = k->family == EFS_META_K_ORPHAN;
		const char *what = orphan ? "orphan record" : "reclaim record";
		struct ino_ent *e;

		if ((!orphan && k->family != EFS_META_K_RECLAIM) || k->removed)
			continue;
		e = efs_check__live_ino(st, k->ino);
		if (e && e->hyp_nlink > 0) {
			f = efs_check__finding(st, EFS_CHECK_INV_LINKS, EFS_CHECK_ERROR,
					       "%s of inode %" PRIu64
					       ", which still has link count %" PRIu32,
					       what, k->ino, e->hyp_nlink);
			if (!orphan)
				continue; /* freeing a linked file: no safe repair */
			efs_check__set_repair(st, f, "delete the orphan record");
			efs_check__op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
			continue;
		}
		if (e && orphan && !e->has_open && S_ISREG(e->mode)) {
			/* Files only (directories have no open references).
			 * Its last opener closed it or its lease ended: a node
			 * turns it into a reclaim record, at once or (a dead
			 * opener) after the dead-node grace. While mounted that
			 * may still be under way. */
			bool mounted = st->rep->n_mounted > 0;

			f = efs_check__finding(st, EFS_CHECK_INV_LINKS,
					       mounted ? EFS_CHECK_WARNING : EFS_CHECK_ERROR,
					       "orphan record of inode %" PRIu64
					       ", which no node has open%s",
					       k->ino, mounted ? " (a node may be freeing it)" : "");
			if (mounted)
				continue;
			efs_check__set_repair(st, f, "delete it, and free the inode as unnamed");
			efs_check__op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
			e->has_orphan = false;
			unreachable_zero(st, e);
			continue;
		}
		if (!e && orphan) {
			f = efs_check__finding(
			    st, EFS_CHECK_INV_STRAY, EFS_CHECK_ERROR,
			    "orphan record of inode %" PRIu64 ", which does not exist", k->ino);
			efs_check__set_repair(st, f, "delete it");
			efs_check__op_del(st, f, k->key, k->keylen, k->mod);
			k->removed = true;
			continue;
		}
		/* A reclaim record may outlive its inode record; an orphan of an
		 * inode with link count 0 is as it should be. Only its value may
		 * be wrong. */
		if (k->bad) {
			struct efs_meta_key key;
			Etcfs__Orphan o = ETCFS__ORPHAN__INIT;
			Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT;

			f = efs_check__finding(st, EFS_CHECK_INV_RECORD, EFS_CHECK_ERROR,
					       "%s of inode %" PRIu64 " cannot be decoded: %s",
					       what, k->ino,
					       k->b ? "impossible contents" : "not a valid record");
			memcpy(key.buf, k->key, k->keylen);
			key.len = k->keylen;
			o.since_ns = rc.since_ns = efs_check__now_ns();
			if (orphan) {
				efs_check__set_repair(st, f, "rewrite it as a new orphan record");
				efs_check__op_put(st, f, &key, &o.base, k->mod);
			} else {
				efs_check__set_repair(
				    st, f,
				    "rewrite it as a reclaim record that starts again "
				    "from the first chunk");
				efs_check__op_put(st, f, &key, &rc.base, k->mod);
			}
		}
	}
}

static const char *stray_word(enum efs_meta_family f)
{
	switch (f) {
	case EFS_META_K_XATTR:
		return "extended attribute";
	case EFS_META_K_EXTENT:
		return "extent chunk";
	case EFS_META_K_HOLDER:
		return "lock holder key";
	case EFS_META_K_RECALL:
		return "lock recall key";
	case EFS_META_K_OPEN:
		return "open reference";
	default:
		return "byte-range lock record";
	}
}

/* Per-inode keys of inodes that do not exist. */
void efs_check__stage_strays(state_t *st)
{
	struct efs_check_finding *f;
	size_t fi = NONE, f_count = 0;
	uint64_t f_ino = 0;

	for (size_t i = 0; i < st->n_keys && !st->err; i++) {
		struct key_ent *k = &st->keys[i];

		if (k->removed || efs_check__live_ino(st, k->ino))
			continue;
		switch (k->family) {
		case EFS_META_K_XATTR:
			break;
		case EFS_META_K_EXTENT:
			if (efs_check__has_reclaim(st, k->ino))
				continue; /* being freed in batches */
			efs_check__finding(
			    st, EFS_CHECK_INV_STRAY, EFS_CHECK_ERROR,
			    "extent chunk %" PRIu64 " of inode %" PRIu64
			    ", which does not exist: its blocks stay allocated (fsck does not "
			    "free extents)",
			    k->b, k->ino);
			continue;
		case EFS_META_K_HOLDER:
		case EFS_META_K_RECALL:
		case EFS_META_K_OPEN:
		case EFS_META_K_PLOCK:
			if (efs_check__has_reclaim(st, k->ino))
				continue;
			/* On a live lease: a node may be deleting it right now. */
			efs_check__finding(st, EFS_CHECK_INV_STRAY, EFS_CHECK_WARNING,
					   "%s of inode %" PRIu64
					   " for node %s, whose inode does not exist "
					   "(an operation in flight on a mounted node?)",
					   stray_word(k->family), k->ino, k->node);
			continue;
		default:
			continue;
		}
		/* Extended attributes: one finding per inode (split when large). */
		if (fi == NONE || f_ino != k->ino || f_count >= OPS_PER_FINDING) {
			f = efs_check__finding(st, EFS_CHECK_INV_STRAY, EFS_CHECK_ERROR,
					       "extended attributes of inode %" PRIu64
					       ", which does not exist",
					       k->ino);
			efs_check__set_repair(st, f, "delete them");
			if (!f)
				return;
			fi = (size_t)(f - st->rep->findings);
			f_ino = k->ino;
			f_count = 0;
		}
		/* By index: the warnings above may move the findings array. */
		efs_check__op_del(st, &st->rep->findings[fi], k->key, k->keylen, k->mod);
		f_count++;
		k->removed = true;
	}
}
