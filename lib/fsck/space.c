/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Space: extents against file sizes and chunks, extents against the data
 * area and each other, every block against the free maps, free intents and
 * extents, and the allocation groups' maps and free counts.
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta/records.h"
#include "space/runs.h"
#include "util/mem.h"
#include "etcfs.pb-c.h"

/* Invariant 5: a file's extents lie within its size rounded up to a block. */
/* The first extent of the chunk that is keys[key] (exts are in key order). */
static size_t first_ext(const state_t *st, size_t key)
{
	size_t lo = 0, hi = st->n_exts;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (st->exts[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void efs_check__stage_extents(state_t *st)
{
	uint32_t bs = st->fi ? st->fi->block_size : 4096;
	struct efs_check_finding *f;
	struct efs_check_op *op;

	for (size_t i = 0; i < st->n_keys && !st->err; i++) {
		struct key_ent *k = &st->keys[i];
		struct ino_ent *e;
		uint64_t blocks;
		char desc[700];

		if (k->family != EFS_META_K_EXTENT || k->removed || k->bad)
			continue;
		e = efs_check__live_ino(st, k->ino);
		if (!e)
			continue;
		blocks = e->size / bs + (e->size % bs != 0);
		if (k->a <= blocks)
			continue;
		efs_check__ino_desc(st, e->ino, desc, sizeof(desc));
		f = efs_check__finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
				       "%s has extents up to block %" PRIu64 " in chunk %" PRIu64
				       ", but its size %" PRIu64 " bytes covers %" PRIu64 " blocks",
				       desc, k->a, k->b, e->size, blocks);
		efs_check__set_repair(
		    st, f,
		    "cut the chunk's extents at file block %" PRIu64 " (preallocated "
		    "ones stay; an emptied chunk is deleted); the blocks cut off go back "
		    "to the free maps (below)",
		    blocks);
		efs_check__op_require(st, f, e->ino);
		op = efs_check__add_op(st, f, OP_CHUNK_TRIM);
		if (!op)
			return;
		memcpy(op->key.buf, k->key, k->keylen);
		op->key.len = k->keylen;
		op->kidx = i;
		op->limit = blocks;
		/* The extents as the repair leaves them. */
		for (size_t j = first_ext(st, i); j < st->n_exts && st->exts[j].key == i; j++) {
			struct ext_ent *x = &st->exts[j];

			if (x->flags & EFS_META_EXTENT_F_PREALLOC || x->fb + x->count <= blocks)
				continue;
			x->cut = x->fb >= blocks ? x->count : x->fb + x->count - blocks;
			x->fix = (size_t)(f - st->rep->findings);
		}
		k->a = blocks;
	}
}

/* ---- Space: invariants 1 and 2 ---- */

/* The data area and its groups, from the sb record. */
struct geo {
	uint64_t ds, de; /* data area: device blocks [ds, de) */
	uint64_t agb;	 /* blocks per group */
	uint32_t agc;	 /* groups */
};

static bool geo_of(const state_t *st, struct geo *g)
{
	const Etcfs__FsInfo *fi = st->fi;

	if (!fi || !fi->block_size || !fi->ag_blocks || !fi->ag_count)
		return false;
	g->ds = fi->data_start;
	g->de = fi->device_size / fi->block_size;
	g->agb = fi->ag_blocks;
	g->agc = fi->ag_count;
	return g->de > g->ds;
}

/* First block and size of group |g|. */
static uint64_t group_start(const struct geo *g, uint32_t grp)
{
	return g->ds + (uint64_t)grp * g->agb;
}

static uint64_t group_size(const struct geo *g, uint32_t grp)
{
	uint64_t s = group_start(g, grp);

	return g->de - s < g->agb ? g->de - s : g->agb;
}

/* "device blocks 5-9" or "device block 5", for [start, end). */
static void blocks_text(uint64_t start, uint64_t end, char *buf, size_t size)
{
	if (end - start == 1)
		snprintf(buf, size, "device block %" PRIu64, start);
	else
		snprintf(buf, size, "device blocks %" PRIu64 "-%" PRIu64, start, end - 1);
}

/* "file /f (inode 7), chunk 0, file blocks 0-3" for extent |x|. */
static void ext_desc(state_t *st, const struct ext_ent *x, char *buf, size_t size)
{
	char who[600];

	if (efs_check__live_ino(st, x->ino))
		efs_check__ino_desc(st, x->ino, who, sizeof(who));
	else if (efs_check__has_reclaim(st, x->ino))
		snprintf(who, sizeof(who), "inode %" PRIu64 " (being reclaimed)", x->ino);
	else
		snprintf(who, sizeof(who), "missing inode %" PRIu64, x->ino);
	if (x->count == 1)
		snprintf(buf, size, "%s, chunk %" PRIu64 ", file block %" PRIu64, who, x->chunk,
			 x->fb);
	else
		snprintf(buf, size, "%s, chunk %" PRIu64 ", file blocks %" PRIu64 "-%" PRIu64,
			 who, x->chunk, x->fb, x->fb + x->count - 1);
}

/* "the free intent of node n1 (session 1, sequence 2)". */
static void intent_desc(const state_t *st, size_t key, char *buf, size_t size)
{
	const struct key_ent *k = &st->keys[key];

	snprintf(buf, size,
		 "the free intent of node %s (session %" PRIu64 ", sequence %" PRIu64 ")",
		 k->node, k->a, k->b);
}

/* Blocks of |x| the repairs keep, and the end of those (clamped). */
static uint64_t ext_len(const struct ext_ent *x)
{
	return x->count - x->cut;
}

static uint64_t ext_end(const struct ext_ent *x)
{
	return x->dev > UINT64_MAX - ext_len(x) ? UINT64_MAX : x->dev + ext_len(x);
}

/*
 * Within one file: every extent of chunk C lies in [C, next chunk), so
 * chunks never overlap in file blocks. (The decoder already checked that a
 * chunk's extents are sorted and do not overlap.)
 */
static void stage_chunks(state_t *st)
{
	size_t last = NONE;
	char desc[700];

	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[i];
		const struct key_ent *nk;
		uint64_t bound = UINT64_MAX;

		if (x->key == last)
			continue;
		if (x->key + 1 < st->n_keys) {
			nk = &st->keys[x->key + 1];
			if (nk->family == EFS_META_K_EXTENT && nk->ino == x->ino)
				bound = nk->b;
		}
		if (x->fb >= x->chunk && x->fb + x->count <= bound)
			continue;
		ext_desc(st, x, desc, sizeof(desc));
		if (x->fb < x->chunk)
			efs_check__finding(
			    st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
			    "extent chunk %" PRIu64 " of inode %" PRIu64
			    " holds an extent (%s) that starts before the chunk's first block "
			    "%" PRIu64,
			    x->chunk, x->ino, desc, x->chunk);
		else
			efs_check__finding(
			    st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
			    "extent chunk %" PRIu64 " of inode %" PRIu64
			    " holds an extent (%s) that reaches into the next chunk, which "
			    "starts at file block %" PRIu64,
			    x->chunk, x->ino, desc, bound);
		last = x->key; /* one finding per chunk */
	}
}

static int cmp_ext_dev(const void *a, const void *b, void *arg)
{
	const state_t *st = arg;
	const struct ext_ent *x = &st->exts[*(const size_t *)a];
	const struct ext_ent *y = &st->exts[*(const size_t *)b];

	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/*
 * Invariant 2: every extent lies inside the data area, and no two extents
 * (of any files, or of one) share a device block. Sorted by first device
 * block, an extent overlaps an earlier one exactly when it starts before the
 * largest end seen so far; it is reported against the extent with that end.
 */
static void stage_overlaps(state_t *st, const struct geo *g)
{
	size_t *order, m = NONE;
	uint64_t maxend = 0;
	char d1[800], d2[800], bt[64];

	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[i];

		if (!ext_len(x) ||
		    (x->dev >= g->ds && ext_end(x) <= g->de && x->dev <= UINT64_MAX - ext_len(x)))
			continue;
		ext_desc(st, x, d1, sizeof(d1));
		if (x->dev > UINT64_MAX - ext_len(x))
			efs_check__finding(st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
					   "the extent of %s starts at device block %" PRIu64
					   " and runs past the largest block number",
					   d1, x->dev);
		else
			efs_check__finding(
			    st, EFS_CHECK_INV_EXTENTS, EFS_CHECK_ERROR,
			    "the extent of %s uses device blocks %" PRIu64 "-%" PRIu64
			    ", outside the data area (device blocks %" PRIu64 "-%" PRIu64 ")",
			    d1, x->dev, x->dev + ext_len(x) - 1, g->ds, g->de - 1);
	}
	order = efs_mem_malloc((st->n_exts + 1) * sizeof(*order));
	if (!order) {
		st->err = -ENOMEM;
		return;
	}
	for (size_t i = 0; i < st->n_exts; i++)
		order[i] = i;
	qsort_r(order, st->n_exts, sizeof(*order), cmp_ext_dev, st);
	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[order[i]];
		uint64_t end = ext_end(x);

		if (!ext_len(x))
			continue;
		if (m != NONE && x->dev < maxend) {
			uint64_t oe = end < maxend ? end : maxend;

			ext_desc(st, &st->exts[m], d1, sizeof(d1));
			ext_desc(st, x, d2, sizeof(d2));
			blocks_text(x->dev, oe, bt, sizeof(bt));
			efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					   "%s %s used by two extents: %s; and %s", bt,
					   oe - x->dev == 1 ? "is" : "are", d1, d2);
		}
		if (m == NONE || end > maxend) {
			m = order[i];
			maxend = end;
		}
	}
	efs_mem_free(order);
}

/* What a stretch of blocks was found to be. */
enum sp_class {
	SPC_TAKE = 0, /* free in the map and used by an extent */
	SPC_LEAK,     /* neither free, nor in an intent, nor used */
	SPC_TRIMMED,  /* like SPC_LEAK once invariant 5's repair cut an extent */
	SPC_INT_FREE, /* in a free intent and free in the map */
	SPC_INT_EXT,  /* in a free intent and used by an extent */
	SPC_INT_INT,  /* in two free intents */
	SPC_N,
};

/* A stretch [start, end) of one group, with what it is named by. */
struct sp_hit {
	uint32_t group;
	uint64_t start, end;
	size_t ext, intent; /* indices in |exts| and |keys|, NONE: none */
	size_t dep;	    /* SPC_TRIMMED: the finding cutting the extent */
};

struct sp_hits {
	struct sp_hit *v;
	size_t n, cap;
};

enum { SPT_FREE = 0, SPT_INTENT, SPT_EXT, SPT_TRIM, SPT_N };

/* An item starts (delta 1) or ends (-1) at |pos|; ends sort first. */
struct sp_ev {
	uint64_t pos;
	int delta;
	int type; /* SPT_* */
	size_t idx; /* |runs| (free, intent) or |exts| */
	uint64_t end; /* the item's end (starts) */
};

static int cmp_ev(const void *a, const void *b)
{
	const struct sp_ev *x = a, *y = b;

	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return x->delta < y->delta ? -1 : x->delta > y->delta;
}

struct sweep {
	state_t *st;
	const struct geo *g;
	const bool *usable;
	struct sp_hits hits[SPC_N];
	size_t cnt[SPT_N];
	size_t best[SPT_N]; /* started item of each type with the largest end */
	uint64_t best_end[SPT_N];
};

static void hit(struct sweep *w, enum sp_class c, uint32_t grp, uint64_t s, uint64_t e, size_t ext,
		size_t intent)
{
	struct sp_hits *h = &w->hits[c];
	struct sp_hit *last = h->n ? &h->v[h->n - 1] : NULL, *arr;
	size_t dep = c == SPC_TRIMMED ? w->st->exts[ext].fix : NONE;

	if (last && last->group == grp && last->end == s && last->ext == ext &&
	    last->intent == intent && last->dep == dep) {
		last->end = e;
		return;
	}
	arr = efs_check__grow(h->v, &h->cap, h->n, sizeof(*arr));
	if (!arr) {
		w->st->err = -ENOMEM;
		return;
	}
	h->v = arr;
	arr[h->n++] = (struct sp_hit){.group = grp, .start = s, .end = e, .ext = ext,
				      .intent = intent, .dep = dep};
}

/* Classifies [s, e), where the counts of |w| hold, one group at a time. */
static void classify(struct sweep *w, uint64_t s, uint64_t e)
{
	const struct geo *g = w->g;
	size_t nf = w->cnt[SPT_FREE], ni = w->cnt[SPT_INTENT], nx = w->cnt[SPT_EXT];
	size_t xe = nx ? w->best[SPT_EXT] : NONE;
	size_t ik = ni ? w->st->runs[w->best[SPT_INTENT]].key : NONE;

	while (s < e) {
		uint32_t grp = (uint32_t)((s - g->ds) / g->agb);
		uint64_t ge = group_start(g, grp) + group_size(g, grp);

		if (ge > e)
			ge = e;
		if (w->usable[grp]) {
			if (!nf && !ni && !nx && w->cnt[SPT_TRIM])
				hit(w, SPC_TRIMMED, grp, s, ge, w->best[SPT_TRIM], NONE);
			else if (!nf && !ni && !nx)
				hit(w, SPC_LEAK, grp, s, ge, NONE, NONE);
			if (nf && nx)
				hit(w, SPC_TAKE, grp, s, ge, xe, NONE);
			if (ni && nf)
				hit(w, SPC_INT_FREE, grp, s, ge, NONE, ik);
			if (ni && nx)
				hit(w, SPC_INT_EXT, grp, s, ge, xe, ik);
			if (ni >= 2)
				hit(w, SPC_INT_INT, grp, s, ge, NONE, ik);
		}
		s = ge;
	}
}

static int add_ev(struct sp_ev **ev, size_t *n, size_t *cap, int type, size_t idx, uint64_t s,
		  uint64_t e)
{
	struct sp_ev *arr;

	if (s >= e)
		return 0;
	arr = efs_check__grow(*ev, cap, *n + 1, sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	*ev = arr;
	arr[(*n)++] = (struct sp_ev){.pos = s, .delta = 1, .type = type, .idx = idx, .end = e};
	arr[(*n)++] = (struct sp_ev){.pos = e, .delta = -1, .type = type, .idx = idx};
	return 0;
}

/* Appends "device blocks a-b (who)" items of hits [lo, hi) to |buf|. */
static void hits_text(state_t *st, const struct sp_hit *v, size_t lo, size_t hi, char *buf,
		      size_t size)
{
	size_t o = 0, shown = 0;
	char bt[64], d1[800], d2[300];

	buf[0] = '\0';
	for (size_t i = lo; i < hi && o + 1 < size; i++) {
		if (shown == 6) {
			snprintf(buf + o, size - o, "; and %zu more", hi - i);
			return;
		}
		blocks_text(v[i].start, v[i].end, bt, sizeof(bt));
		d1[0] = d2[0] = '\0';
		if (v[i].ext != NONE)
			ext_desc(st, &st->exts[v[i].ext], d1, sizeof(d1));
		if (v[i].intent != NONE)
			intent_desc(st, v[i].intent, d2, sizeof(d2));
		o += (size_t)snprintf(buf + o, size - o, "%s%s%s%s%s%s%s", shown ? "; " : "", bt,
				      d1[0] || d2[0] ? " (" : "", d2, d1[0] && d2[0] ? ", " : "",
				      d1, d1[0] || d2[0] ? ")" : "");
		shown++;
	}
}

/* A patch of group |grp|'s map that takes (|take|) or puts back the runs
 * of hits [lo, hi). */
static void op_map_patch(state_t *st, struct efs_check_finding *f, const struct geo *g,
			 uint32_t grp, size_t mk, size_t ck, bool take, const struct sp_hit *v,
			 size_t lo, size_t hi)
{
	struct efs_check_op *op = efs_check__add_op(st, f, OP_MAP_PATCH);
	struct efs_run *runs;
	uint64_t base = group_start(g, grp);

	if (!op)
		return;
	runs = efs_mem_malloc((hi - lo) * sizeof(*runs));
	if (!runs) {
		st->err = -ENOMEM;
		return;
	}
	for (size_t i = lo; i < hi; i++) {
		runs[i - lo] = (struct efs_run){.start = v[i].start - base,
						.len = v[i].end - v[i].start};
		if (v[i].dep == NONE ||
		    (op->n_deps && op->deps[op->n_deps - 1] == v[i].dep))
			continue;
		{
			size_t *d = efs_mem_realloc(op->deps, (op->n_deps + 1) * sizeof(*d));

			if (!d) {
				st->err = -ENOMEM;
				break;
			}
			op->deps = d;
			d[op->n_deps++] = v[i].dep;
		}
	}
	if (take) {
		op->take = runs;
		op->n_take = hi - lo;
	} else {
		op->put = runs;
		op->n_put = hi - lo;
	}
	if (efs_meta_key_ag(&st->ns, grp, EFS_META_K_AG_MAP, &op->key) < 0)
		st->err = -EINVAL;
	op->kidx = mk;
	if (ck != NONE) {
		op->kidx2 = ck;
		if (efs_meta_key_ag(&st->ns, grp, EFS_META_K_AG_FREE, &op->key2) < 0)
			st->err = -EINVAL;
	}
}

/* The repair of group |grp|'s map for hits [lo, hi) of |h|, |n| blocks:
 * takes them out of the map (|take|) or puts them back, moves the group's
 * free count with them, and says so: |what|, then, where the group has a
 * free count, its new value (|exact|) or that it is fixed. */
static void map_repair(state_t *st, struct efs_check_finding *f, const struct geo *g,
		       uint32_t grp, const size_t *mapk, const size_t *cntk, bool take,
		       const struct sp_hits *h, size_t lo, size_t hi, uint64_t n, const char *what,
		       bool exact)
{
	struct key_ent *m = &st->keys[mapk[grp]];
	struct key_ent *cn = cntk[grp] != NONE ? &st->keys[cntk[grp]] : NULL;

	if (take)
		m->a -= n;
	else
		m->a += n;
	if (cn)
		cn->a = m->a;
	if (!cn)
		efs_check__set_repair(st, f, "%s", what);
	else if (exact)
		efs_check__set_repair(st, f, "%s and set its free count to %" PRIu64, what, m->a);
	else
		efs_check__set_repair(st, f, "%s and fix its free count", what);
	op_map_patch(st, f, g, grp, mapk[grp], cntk[grp], take, h->v, lo, hi);
}

/* Findings of one class, one per group. */
static void report_hits(state_t *st, const struct geo *g, enum sp_class c,
			const struct sp_hits *h, const size_t *mapk, const size_t *cntk)
{
	struct efs_check_finding *f;
	char text[2048], blind[300] = "", head[96], what[128];

	if (st->blind != NONE) {
		const struct key_ent *b = &st->keys[st->blind];

		if (b->family == EFS_META_K_EXTENT)
			snprintf(blind, sizeof(blind),
				 "; not freed because extent chunk %" PRIu64 " of inode %" PRIu64
				 " cannot be decoded, so the blocks it uses are unknown",
				 b->b, b->ino);
		else
			snprintf(blind, sizeof(blind),
				 "; not freed because a free intent of node %s in group %" PRIu32
				 " cannot be decoded, so the blocks it frees are unknown",
				 b->node, b->group);
	}
	for (size_t lo = 0, hi; lo < h->n && !st->err; lo = hi) {
		uint32_t grp = h->v[lo].group;
		uint64_t n = 0;
		const char *them;

		for (hi = lo; hi < h->n && h->v[hi].group == grp; hi++)
			n += h->v[hi].end - h->v[hi].start;
		hits_text(st, h->v, lo, hi, text, sizeof(text));
		them = n == 1 ? "it" : "them";
		snprintf(head, sizeof(head), "allocation group %" PRIu32 ": %" PRIu64 " block%s",
			 grp, n, n == 1 ? " is" : "s are");
		switch (c) {
		case SPC_TAKE:
			f = efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					       "%s free in the group's map but used by a file (a "
					       "new file could be given %s): %s",
					       head, them, text);
			snprintf(what, sizeof(what),
				 "take %s out of the group's free map (the file keeps %s)", them,
				 them);
			map_repair(st, f, g, grp, mapk, cntk, true, h, lo, hi, n, what, true);
			break;
		case SPC_LEAK:
		case SPC_TRIMMED:
			if (c == SPC_LEAK)
				f = efs_check__finding(
				    st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
				    "%s neither free in the group's map, nor in a free intent, "
				    "nor used by any file (leaked): %s%s",
				    head, text, blind);
			else
				f = efs_check__finding(
				    st, EFS_CHECK_INV_SPACE, EFS_CHECK_NOTE,
				    "%s used only beyond a file's size, so no longer used once "
				    "the extents are cut: %s%s",
				    head, text, blind);
			if (blind[0])
				break;
			snprintf(what, sizeof(what), "put %s back into the group's free map", them);
			map_repair(st, f, g, grp, mapk, cntk, false, h, lo, hi, n, what,
				   c == SPC_LEAK);
			break;
		case SPC_INT_FREE:
			efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					   "%s in a free intent but already free in the group's "
					   "map (a double free pending): %s",
					   head, text);
			break;
		case SPC_INT_EXT:
			efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					   "%s in a free intent but still used by a file (folding "
					   "the intent would free them under it): %s",
					   head, text);
			break;
		default:
			efs_check__finding(
			    st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
			    "%s in more than one free intent (a double free pending): %s", head,
			    text);
			break;
		}
	}
}

/*
 * Invariant 1: every block of the data area is exactly one of free in its
 * group's map, in a pending free intent, or used by one extent (of any
 * inode: with a reclaim record, or missing). One sweep over the sorted
 * starts and ends of every run: O(n log n) in the number of runs, whatever
 * the device's size. Groups whose map is missing, undecodable or of the
 * wrong size are left out (stage_space reports them).
 */
static void stage_blocks(state_t *st, const struct geo *g)
{
	struct sweep w = {.st = st, .g = g};
	struct sp_ev *ev = NULL;
	size_t n_ev = 0, cap_ev = 0;
	size_t *mapk = NULL, *cntk = NULL;
	bool *usable = NULL, any = false;
	uint64_t prev;
	char it[300];

	mapk = efs_mem_malloc(((size_t)g->agc + 1) * sizeof(*mapk));
	cntk = efs_mem_malloc(((size_t)g->agc + 1) * sizeof(*cntk));
	usable = efs_mem_calloc((size_t)g->agc + 1, sizeof(*usable));
	if (!mapk || !cntk || !usable) {
		st->err = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < g->agc; i++)
		mapk[i] = cntk[i] = NONE;
	for (size_t i = 0; i < st->n_keys; i++) {
		const struct key_ent *k = &st->keys[i];

		if (k->group >= g->agc)
			continue;
		if (k->family == EFS_META_K_AG_MAP)
			mapk[k->group] = i;
		else if (k->family == EFS_META_K_AG_FREE && !k->bad)
			cntk[k->group] = i;
	}
	for (uint32_t i = 0; i < g->agc; i++) {
		usable[i] = mapk[i] != NONE && !st->keys[mapk[i]].bad &&
			    st->keys[mapk[i]].b == group_size(g, i);
		any |= usable[i];
	}
	if (!any)
		goto out;
	w.usable = usable;
	for (size_t i = 0; i < st->n_runs && !st->err; i++) {
		const struct sp_run *r = &st->runs[i];
		uint64_t gs, s, e;

		if (r->group >= g->agc || (!r->intent && !usable[r->group]))
			continue;
		gs = group_size(g, r->group);
		s = r->start;
		e = r->start > UINT64_MAX - r->len ? UINT64_MAX : r->start + r->len;
		if (r->intent && e > gs) {
			intent_desc(st, r->key, it, sizeof(it));
			efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					   "%s in allocation group %" PRIu32
					   " frees group blocks %" PRIu64 "-%" PRIu64
					   ", beyond the group's %" PRIu64 " blocks",
					   it, r->group, s, r->len ? e - 1 : s, gs);
			e = gs;
		}
		if (s >= e)
			continue;
		s += group_start(g, r->group);
		e += group_start(g, r->group);
		if (add_ev(&ev, &n_ev, &cap_ev, r->intent ? SPT_INTENT : SPT_FREE, i, s, e) < 0)
			st->err = -ENOMEM;
	}
	for (size_t i = 0; i < st->n_exts && !st->err; i++) {
		const struct ext_ent *x = &st->exts[i];
		uint64_t s = x->dev < g->ds ? g->ds : x->dev, e = ext_end(x);

		if (e > g->de)
			e = g->de;
		if (add_ev(&ev, &n_ev, &cap_ev, SPT_EXT, i, s, e) < 0)
			st->err = -ENOMEM;
		if (!x->cut || st->err)
			continue;
		/* The part invariant 5's repair cuts off: used by nothing after it. */
		s = ext_end(x) < g->ds ? g->ds : ext_end(x);
		e = x->dev > UINT64_MAX - x->count ? UINT64_MAX : x->dev + x->count;
		if (e > g->de)
			e = g->de;
		if (add_ev(&ev, &n_ev, &cap_ev, SPT_TRIM, i, s, e) < 0)
			st->err = -ENOMEM;
	}
	if (st->err)
		goto out;
	qsort(ev, n_ev, sizeof(*ev), cmp_ev);
	prev = g->ds;
	for (size_t i = 0; i < n_ev && !st->err; i++) {
		const struct sp_ev *e = &ev[i];

		if (e->pos > prev) {
			classify(&w, prev, e->pos);
			prev = e->pos;
		}
		if (e->delta < 0) {
			w.cnt[e->type]--;
			continue;
		}
		w.cnt[e->type]++;
		if (w.cnt[e->type] == 1 || e->end > w.best_end[e->type]) {
			w.best[e->type] = e->idx;
			w.best_end[e->type] = e->end;
		}
	}
	if (!st->err && prev < g->de)
		classify(&w, prev, g->de);
	for (int c = 0; c < SPC_N && !st->err; c++)
		report_hits(st, g, (enum sp_class)c, &w.hits[c], mapk, cntk);
out:
	for (int c = 0; c < SPC_N; c++)
		efs_mem_free(w.hits[c].v);
	efs_mem_free(ev);
	efs_mem_free(mapk);
	efs_mem_free(cntk);
	efs_mem_free(usable);
}

void efs_check__stage_space_blocks(state_t *st)
{
	struct geo g;

	if (!geo_of(st, &g))
		return;
	stage_chunks(st);
	stage_overlaps(st, &g);
	if (!st->err)
		stage_blocks(st, &g);
}

/* Allocation groups: every group has a well-formed map and a free count
 * equal to the map's sum; no group beyond the geometry. */
void efs_check__stage_space(state_t *st)
{
	const Etcfs__FsInfo *fi = st->fi;
	size_t *map, *fre;
	uint64_t data, want;
	struct efs_check_finding *f;

	if (!fi)
		return;
	map = efs_mem_malloc((size_t)fi->ag_count * sizeof(*map) + 1);
	fre = efs_mem_malloc((size_t)fi->ag_count * sizeof(*fre) + 1);
	if (!map || !fre) {
		efs_mem_free(map);
		efs_mem_free(fre);
		st->err = -ENOMEM;
		return;
	}
	for (uint32_t g = 0; g < fi->ag_count; g++)
		map[g] = fre[g] = NONE;
	for (size_t i = 0; i < st->n_keys; i++) {
		struct key_ent *k = &st->keys[i];

		if (k->family != EFS_META_K_AG_MAP && k->family != EFS_META_K_AG_FREE)
			continue;
		if (k->group >= fi->ag_count) {
			efs_check__finding(
			    st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
			    "allocation group %" PRIu32 " has a %s, but the filesystem "
			    "has only %" PRIu32 " groups",
			    k->group, k->family == EFS_META_K_AG_MAP ? "free map" : "free count",
			    fi->ag_count);
			continue;
		}
		if (k->family == EFS_META_K_AG_MAP)
			map[k->group] = i;
		else
			fre[k->group] = i;
	}
	data = fi->device_size / fi->block_size - fi->data_start;
	for (uint32_t g = 0; g < fi->ag_count && !st->err; g++) {
		struct key_ent *m = map[g] == NONE ? NULL : &st->keys[map[g]];
		struct key_ent *c = fre[g] == NONE ? NULL : &st->keys[fre[g]];
		Etcfs__AgFree af = ETCFS__AG_FREE__INIT;
		struct efs_meta_key key;

		want = g + 1 < fi->ag_count ? fi->ag_blocks : data - (uint64_t)g * fi->ag_blocks;
		if (!m) {
			efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					   "allocation group %" PRIu32
					   " has no free map (space repair comes "
					   "with the data path)",
					   g);
			continue;
		}
		if (m->bad)
			continue; /* reported when read */
		if (m->b != want)
			efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					   "allocation group %" PRIu32
					   "'s free map says the group has %" PRIu64
					   " blocks, but the geometry gives %" PRIu64,
					   g, m->b, want);
		if (c && !c->bad && c->a == m->a)
			continue;
		af.free_blocks = m->a;
		if (efs_meta_key_ag(&st->ns, g, EFS_META_K_AG_FREE, &key) < 0) {
			st->err = -EINVAL;
			break;
		}
		if (!c)
			f = efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					       "allocation group %" PRIu32 " has no free count", g);
		else if (c->bad)
			f = efs_check__finding(
			    st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
			    "allocation group %" PRIu32 "'s free count cannot be decoded", g);
		else
			f = efs_check__finding(st, EFS_CHECK_INV_SPACE, EFS_CHECK_ERROR,
					       "allocation group %" PRIu32
					       "'s free count is %" PRIu64
					       ", but its free map holds %" PRIu64 " free blocks",
					       g, c->a, m->a);
		efs_check__set_repair(st, f, "set it to %" PRIu64, m->a);
		efs_check__op_put(st, f, &key, &af.base, c ? c->mod : 0);
	}
	efs_mem_free(map);
	efs_mem_free(fre);
}
