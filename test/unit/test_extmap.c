/* SPDX-License-Identifier: Apache-2.0 */
/* The extent map of lib/space/extmap.h, against a per-block model. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "meta/records.h"
#include "space/extmap.h"
#include "space/runs.h"
#include "util/mem.h"

TestSuite(extmap, .timeout = 60);

#define PRE EFS_META_EXTENT_F_PREALLOC

/* ---- Helpers ---- */

static struct efs_extmap *map_new(uint32_t chunk_max)
{
	struct efs_extmap *m = NULL;

	cr_assert_eq(efs_extmap_new(&m, chunk_max), 0);
	cr_assert_not_null(m);
	return m;
}

static void set(struct efs_extmap *m, uint64_t f, uint64_t d, uint64_t n, uint32_t fl,
		struct efs_runs *buried)
{
	struct efs_ext x = {f, d, n, fl};

	cr_assert_eq(efs_extmap_set(m, &x, buried), 0);
}

static void assert_ext(const struct efs_ext *x, uint64_t f, uint64_t d, uint64_t n, uint32_t fl)
{
	cr_assert(x->fblk == f && x->dblk == d && x->count == n && x->flags == fl,
		  "extent {%lu, %lu, %lu, %u} != {%lu, %lu, %lu, %u}", (unsigned long)x->fblk,
		  (unsigned long)x->dblk, (unsigned long)x->count, x->flags, (unsigned long)f,
		  (unsigned long)d, (unsigned long)n, fl);
}

/* A chunk message built in memory (extents in e[], pointers in p[]). */
struct msg {
	Etcfs__ExtentChunk ch;
	Etcfs__Extent e[8];
	Etcfs__Extent *p[8];
};

static void msg_init(struct msg *mg, const uint64_t (*x)[3], size_t n)
{
	etcfs__extent_chunk__init(&mg->ch);
	for (size_t i = 0; i < n; i++) {
		etcfs__extent__init(&mg->e[i]);
		mg->e[i].file_block = x[i][0];
		mg->e[i].dev_block = x[i][1];
		mg->e[i].count = x[i][2];
		mg->p[i] = &mg->e[i];
	}
	mg->ch.n_extents = n;
	mg->ch.extents = mg->p;
}

/* ---- Targeted tests ---- */

Test(extmap, set_splits_an_extent_in_three)
{
	struct efs_extmap *m = map_new(0);
	struct efs_runs b = {0};
	struct efs_ext out[4];

	set(m, 0, 1000, 100, 0, &b);
	cr_assert_eq(b.n, 0);
	set(m, 40, 5000, 10, 0, &b);
	cr_assert_eq(efs_extmap_lookup(m, 0, 200, out, 4), 3);
	assert_ext(&out[0], 0, 1000, 40, 0);
	assert_ext(&out[1], 40, 5000, 10, 0);
	assert_ext(&out[2], 50, 1050, 50, 0);
	cr_assert_eq(b.n, 1);
	cr_assert(b.v[0].start == 1040 && b.v[0].len == 10);
	cr_assert_eq(efs_extmap_blocks(m), 100);
	cr_assert_eq(efs_extmap_end(m), 100);
	/* Clipped lookups and a short output array. */
	cr_assert_eq(efs_extmap_lookup(m, 45, 10, out, 1), 2);
	assert_ext(&out[0], 45, 5005, 5, 0);
	efs_runs_done(&b);
	m = efs_extmap_free(m);
	cr_assert_null(m);
	efs_test_assert_no_leaks();
}

Test(extmap, contiguous_extents_merge_unless_flags_differ)
{
	struct efs_extmap *m = map_new(0);
	struct efs_runs b = {0};
	struct efs_ext out[4];

	set(m, 10, 110, 10, 0, &b);
	set(m, 0, 100, 10, 0, &b);
	set(m, 20, 120, 5, 0, &b);
	cr_assert_eq(efs_extmap_lookup(m, 0, 100, out, 4), 1);
	assert_ext(&out[0], 0, 100, 25, 0);
	set(m, 25, 125, 5, PRE, &b);
	set(m, 30, 999, 5, 0, &b);
	cr_assert_eq(efs_extmap_lookup(m, 0, 100, out, 4), 3);
	assert_ext(&out[1], 25, 125, 5, PRE);
	/* Clearing the flag merges it into its neighbour. */
	cr_assert_eq(efs_extmap_clear_flags(m, 0, 100, PRE), 0);
	cr_assert_eq(efs_extmap_lookup(m, 0, 100, out, 4), 2);
	assert_ext(&out[0], 0, 100, 30, 0);
	cr_assert_eq(b.n, 0);
	/* Seeks: data at 0, hole at 35; preallocated blocks are holes. */
	set(m, 40, 2000, 10, PRE, &b);
	set(m, 50, 3000, 1, 0, &b);
	uint64_t r = 0;

	cr_assert_eq(efs_extmap_seek_data(m, 31, &r), 0);
	cr_assert_eq(r, 31);
	cr_assert_eq(efs_extmap_seek_data(m, 35, &r), 0);
	cr_assert_eq(r, 50);
	cr_assert_eq(efs_extmap_seek_data(m, 51, &r), -ENXIO);
	cr_assert_eq(efs_extmap_seek_hole(m, 0), 35);
	cr_assert_eq(efs_extmap_seek_hole(m, 42), 42);
	cr_assert_eq(efs_extmap_seek_hole(m, 50), 51);
	cr_assert_eq(efs_extmap_seek_hole(m, 70), 70);
	efs_runs_done(&b);
	efs_extmap_free(m);
	efs_test_assert_no_leaks();
}

Test(extmap, invalid_and_empty_arguments)
{
	struct efs_extmap *m = map_new(0);
	struct efs_runs b = {0};
	struct efs_ext x = {UINT64_MAX - 2, 0, 5, 0}, out[1];
	uint64_t r;

	cr_assert_eq(efs_extmap_set(m, &x, &b), -EINVAL);
	x = (struct efs_ext){0, UINT64_MAX - 2, 5, 0};
	cr_assert_eq(efs_extmap_set(m, &x, &b), -EINVAL);
	x = (struct efs_ext){0, 0, 0, 0};
	cr_assert_eq(efs_extmap_set(m, &x, &b), -EINVAL);
	cr_assert_eq(efs_extmap_punch(m, 0, UINT64_MAX, &b), 0);
	cr_assert_eq(efs_extmap_nchunks(m), 0);
	cr_assert_eq(efs_extmap_lookup(m, 0, UINT64_MAX, out, 1), 0);
	cr_assert_eq(efs_extmap_seek_data(m, 0, &r), -ENXIO);
	cr_assert_eq(efs_extmap_seek_hole(m, 7), 7);
	cr_assert_eq(efs_extmap_end(m), 0);
	/* The first chunk has key 0; punching to the end drops it. */
	set(m, 1000, 1, 3, 0, &b);
	uint64_t key = 99;

	cr_assert_eq(efs_extmap_chunk_keys(m, &key, 1), 1);
	cr_assert_eq(key, 0);
	cr_assert_eq(efs_extmap_punch(m, 500, UINT64_MAX - 500, &b), 0);
	cr_assert_eq(efs_extmap_nchunks(m), 0);
	cr_assert_eq(efs_extmap_blocks(m), 0);
	cr_assert(b.n == 1 && b.v[0].start == 1 && b.v[0].len == 3);
	efs_runs_done(&b);
	efs_extmap_free(m);
	efs_test_assert_no_leaks();
}

Test(extmap, load_chunk_rejects_inconsistent_chunks)
{
	static const uint64_t unsorted[][3] = {{20, 1, 5}, {10, 100, 5}};
	static const uint64_t overlap[][3] = {{10, 1, 5}, {14, 100, 5}};
	static const uint64_t before_key[][3] = {{5, 1, 5}};
	static const uint64_t wraps[][3] = {{10, UINT64_MAX - 1, 5}};
	static const uint64_t empty_ext[][3] = {{10, 1, 0}};
	static const uint64_t good[][3] = {{10, 1, 5}, {20, 100, 5}};
	static const uint64_t into_next[][3] = {{0, 500, 11}};
	static const uint64_t from_prev[][3] = {{30, 600, 1}};
	struct efs_extmap *m = map_new(4);
	struct efs_ext out[4];
	struct msg mg;

	msg_init(&mg, unsorted, 2);
	cr_assert_eq(efs_extmap_load_chunk(m, 0, &mg.ch), -EUCLEAN);
	msg_init(&mg, overlap, 2);
	cr_assert_eq(efs_extmap_load_chunk(m, 0, &mg.ch), -EUCLEAN);
	msg_init(&mg, before_key, 1);
	cr_assert_eq(efs_extmap_load_chunk(m, 10, &mg.ch), -EUCLEAN);
	msg_init(&mg, wraps, 1);
	cr_assert_eq(efs_extmap_load_chunk(m, 0, &mg.ch), -EUCLEAN);
	msg_init(&mg, empty_ext, 1);
	cr_assert_eq(efs_extmap_load_chunk(m, 0, &mg.ch), -EUCLEAN);
	msg_init(&mg, good, 0);
	cr_assert_eq(efs_extmap_load_chunk(m, 0, &mg.ch), -EUCLEAN);
	cr_assert_eq(efs_extmap_nchunks(m), 0);

	msg_init(&mg, good, 2);
	cr_assert_eq(efs_extmap_load_chunk(m, 10, &mg.ch), 0);
	cr_assert_eq(efs_extmap_load_chunk(m, 10, &mg.ch), -EUCLEAN);	 /* same key */
	cr_assert_eq(efs_extmap_load_chunk(m, 3, &mg.ch), -EUCLEAN);	 /* overlaps */
	msg_init(&mg, into_next, 1);
	cr_assert_eq(efs_extmap_load_chunk(m, 0, &mg.ch), -EUCLEAN);	 /* reaches 10 */
	msg_init(&mg, from_prev, 1);
	cr_assert_eq(efs_extmap_load_chunk(m, 22, &mg.ch), -EUCLEAN); /* 20..25 in it */
	cr_assert_eq(efs_extmap_load_chunk(m, 25, &mg.ch), 0);
	cr_assert_eq(efs_extmap_nchunks(m), 2);
	cr_assert_eq(efs_extmap_ndirty(m), 0);
	cr_assert_eq(efs_extmap_blocks(m), 11);
	cr_assert_eq(efs_extmap_end(m), 31);
	cr_assert_eq(efs_extmap_published_end(m), 31);
	cr_assert_eq(efs_extmap_lookup(m, 0, 100, out, 4), 3);
	assert_ext(&out[2], 30, 600, 1, 0);
	efs_extmap_free(m);
	efs_test_assert_no_leaks();
}

Test(extmap, publication_keeps_chunks_changed_meanwhile_dirty)
{
	struct efs_extmap *m = map_new(4);
	struct efs_runs b = {0};
	struct efs_extmap_change *v;
	size_t n;

	for (uint64_t i = 0; i < 20; i++)
		set(m, i * 10, 1000 + i * 100, 5, 0, &b);
	cr_assert_gt(efs_extmap_nchunks(m), 4);
	cr_assert_eq(efs_extmap_ndirty(m), efs_extmap_nchunks(m));
	cr_assert_eq(efs_extmap_published_end(m), 0);
	cr_assert_eq(efs_extmap_changes(m, 1000, &v, &n), 0);
	cr_assert_eq(n, efs_extmap_nchunks(m));
	for (size_t i = 0; i < n; i++) {
		Etcfs__ExtentChunk *ch = NULL;
		const char *why = NULL;

		cr_assert(!v[i].del);
		cr_assert(i == 0 || v[i - 1].key < v[i].key);
		cr_assert_eq(efs_meta_extent_chunk_decode(v[i].val.data, v[i].val.len, &ch, &why),
			     0, "%s", why);
		cr_assert_leq(ch->n_extents, 4);
		cr_assert_eq(ch->extents[ch->n_extents - 1]->file_block +
				     ch->extents[ch->n_extents - 1]->count,
			     v[i].end);
		efs_meta_record_free(ch);
	}
	set(m, 3, 7, 1, 0, &b); /* changes chunk 0 after the snapshot */
	efs_extmap_published(m, v, n);
	efs_extmap_changes_free(v, n);
	cr_assert_eq(efs_extmap_ndirty(m), 1);
	cr_assert_eq(efs_extmap_published_end(m), 195);
	/* Punch everything: every key becomes a deletion, listed first. */
	cr_assert_eq(efs_extmap_punch(m, 0, UINT64_MAX, &b), 0);
	cr_assert_eq(efs_extmap_nchunks(m), 0);
	cr_assert_eq(efs_extmap_published_end(m), 195);
	cr_assert_eq(efs_extmap_changes(m, 2, &v, &n), 0);
	cr_assert_eq(n, 2);
	cr_assert(v[0].del && v[1].del);
	efs_extmap_published(m, v, n);
	efs_extmap_changes_free(v, n);
	cr_assert_eq(efs_extmap_changes(m, 1000, &v, &n), 0);
	efs_extmap_published(m, v, n);
	efs_extmap_changes_free(v, n);
	cr_assert_eq(efs_extmap_ndirty(m), 0);
	cr_assert_eq(efs_extmap_published_end(m), 0);
	cr_assert_eq(efs_extmap_changes(m, 1000, &v, &n), 0);
	cr_assert(n == 0 && v == NULL);
	cr_assert_eq(efs_runs_total(&b), 101);
	efs_runs_done(&b);
	efs_extmap_free(m);
	efs_test_assert_no_leaks();
}

/* ---- -ENOMEM: a failed call leaves the map as it was ---- */

struct snap {
	struct efs_ext pieces[256];
	size_t n, nchunks, ndirty, nruns;
	uint64_t blocks, end, pend, keys[256];
};

static void take(const struct efs_extmap *m, const struct efs_runs *b, struct snap *s)
{
	memset(s, 0, sizeof(*s));
	s->n = efs_extmap_lookup(m, 0, UINT64_MAX, s->pieces, 256);
	cr_assert_leq(s->n, 256);
	s->nchunks = efs_extmap_chunk_keys(m, s->keys, 256);
	s->ndirty = efs_extmap_ndirty(m);
	s->blocks = efs_extmap_blocks(m);
	s->end = efs_extmap_end(m);
	s->pend = efs_extmap_published_end(m);
	s->nruns = b ? b->n : 0;
}

static bool snap_eq(const struct snap *a, const struct snap *b)
{
	if (a->n != b->n || a->nchunks != b->nchunks || a->ndirty != b->ndirty ||
	    a->blocks != b->blocks || a->end != b->end || a->pend != b->pend ||
	    a->nruns != b->nruns)
		return false;
	for (size_t i = 0; i < a->n; i++)
		if (a->pieces[i].fblk != b->pieces[i].fblk ||
		    a->pieces[i].dblk != b->pieces[i].dblk ||
		    a->pieces[i].count != b->pieces[i].count ||
		    a->pieces[i].flags != b->pieces[i].flags)
			return false;
	return memcmp(a->keys, b->keys, a->nchunks * sizeof(a->keys[0])) == 0;
}

/* A map with a few published chunks, one deletion pending, dirty chunks. */
static struct efs_extmap *nomem_map(struct efs_runs *b)
{
	struct efs_extmap *m = map_new(4);
	struct efs_extmap_change *v;
	size_t n;

	for (uint64_t i = 0; i < 24; i++)
		set(m, 100 + i * 10, 1000 + i * 100, 5, i % 3 ? 0 : PRE, b);
	cr_assert_eq(efs_extmap_changes(m, 1000, &v, &n), 0);
	efs_extmap_published(m, v, n);
	efs_extmap_changes_free(v, n);
	cr_assert_eq(efs_extmap_punch(m, 100, 25, b), 0);
	cr_assert_eq(efs_extmap_punch(m, 150, 30, b), 0);
	set(m, 300, 77, 4, 0, b);
	return m;
}

enum nomem_op { NM_SET_WIDE, NM_SET_LOW, NM_SET_SPLIT, NM_PUNCH, NM_CLEAR, NM_CHANGES, NM_LOAD };

static int nomem_call(struct efs_extmap *m, enum nomem_op op, struct efs_runs *b)
{
	struct efs_extmap_change *v = NULL;
	struct efs_ext x;
	size_t n = 0;
	int r;

	switch (op) {
	case NM_SET_WIDE:
		x = (struct efs_ext){103, 50000, 200, 0};
		return efs_extmap_set(m, &x, b);
	case NM_SET_LOW:
		x = (struct efs_ext){5, 60000, 100, PRE};
		return efs_extmap_set(m, &x, b);
	case NM_SET_SPLIT:
		x = (struct efs_ext){211, 70000, 1, 0};
		return efs_extmap_set(m, &x, b);
	case NM_PUNCH:
		return efs_extmap_punch(m, 102, 120, b);
	case NM_CLEAR:
		return efs_extmap_clear_flags(m, 0, UINT64_MAX, PRE);
	case NM_CHANGES:
		r = efs_extmap_changes(m, 1000, &v, &n);
		if (r == 0) {
			cr_assert_gt(n, 0);
			efs_extmap_changes_free(v, n);
		}
		return r;
	case NM_LOAD: {
		static const uint64_t x1[][3] = {{1000, 5, 3}, {1010, 9, 3}};
		struct msg mg;

		msg_init(&mg, x1, 2);
		return efs_extmap_load_chunk(m, 1000, &mg.ch);
	}
	}
	return -EINVAL;
}

Test(extmap, enomem_leaves_the_map_unchanged)
{
	for (int op = NM_SET_WIDE; op <= NM_LOAD; op++) {
		struct efs_runs b = {0};
		struct efs_extmap *m = nomem_map(&b);
		struct snap before, after;
		int r = -ENOMEM;
		long fails = 0;

		take(m, &b, &before);
		for (long k = 0; r == -ENOMEM; k++) {
			efs_mem_fail_after(k);
			r = nomem_call(m, op, &b);
			efs_mem_fail_reset();
			if (r == -ENOMEM) {
				take(m, &b, &after);
				cr_assert(snap_eq(&before, &after), "op %d changed the map at %ld",
					  op, k);
				fails++;
			}
			cr_assert_lt(k, 100);
		}
		cr_assert_eq(r, 0, "op %d: %d", op, r);
		cr_assert_gt(fails, 0, "op %d never allocated", op);
		take(m, &b, &after);
		cr_assert(op == NM_CHANGES || !snap_eq(&before, &after));
		efs_runs_done(&b);
		efs_extmap_free(m);
	}
	efs_test_assert_no_leaks();
}

/* ---- Randomised test against a per-block model ---- */

#define NBLK 4096
#define MBLK (NBLK + 600)
#define DMAX 4096

struct model {
	bool mapped[MBLK];
	uint64_t d[MBLK];
	uint32_t fl[MBLK];
};

struct pchunk {
	uint64_t key;
	Etcfs__ExtentChunk *ch;
};

/* What etcd holds: key -> decoded chunk, sorted by key. */
struct dict {
	struct pchunk e[DMAX];
	size_t n;
};

struct rnd {
	uint64_t s;
	unsigned seed;
};

static uint64_t rnd(struct rnd *r, uint64_t n)
{
	r->s ^= r->s << 13;
	r->s ^= r->s >> 7;
	r->s ^= r->s << 17;
	return n ? r->s % n : 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t model_end(const struct model *md)
{
	for (uint64_t i = MBLK; i > 0; i--)
		if (md->mapped[i - 1])
			return i;
	return 0;
}

/* The map's pieces of [s, s + n) agree block by block with the model. */
static void check_range(const struct efs_extmap *m, const struct model *md, uint64_t s,
			uint64_t n, unsigned seed)
{
	static struct efs_ext out[MBLK];
	size_t np = efs_extmap_lookup(m, s, n, out, MBLK), k = 0;
	uint64_t e = s + n > MBLK ? MBLK : s + n;

	cr_assert_leq(np, MBLK, "seed %u", seed);
	if (np > 0) {
		struct efs_ext one;

		cr_assert_eq(efs_extmap_lookup(m, s, n, &one, 1), np, "seed %u", seed);
	}
	for (size_t i = 0; i < np; i++) {
		cr_assert(out[i].count > 0 && out[i].fblk >= s && out[i].fblk + out[i].count <= e,
			  "seed %u: piece outside the range", seed);
		cr_assert(i == 0 || out[i - 1].fblk + out[i - 1].count <= out[i].fblk,
			  "seed %u: pieces unsorted", seed);
	}
	for (uint64_t b = s; b < e; b++) {
		while (k < np && out[k].fblk + out[k].count <= b)
			k++;
		if (k < np && out[k].fblk <= b) {
			cr_assert(md->mapped[b], "seed %u: block %lu mapped, model hole", seed,
				  (unsigned long)b);
			cr_assert(md->d[b] == out[k].dblk + (b - out[k].fblk) &&
					  md->fl[b] == out[k].flags,
				  "seed %u: block %lu differs", seed, (unsigned long)b);
		} else {
			cr_assert(!md->mapped[b], "seed %u: block %lu is a hole, model mapped",
				  seed, (unsigned long)b);
		}
	}
}

static void check_all(const struct efs_extmap *m, const struct model *md, struct rnd *r)
{
	uint64_t blocks = 0, end = model_end(md), x;

	for (uint64_t b = 0; b < MBLK; b++)
		blocks += md->mapped[b];
	cr_assert_eq(efs_extmap_blocks(m), blocks, "seed %u", r->seed);
	cr_assert_eq(efs_extmap_end(m), end, "seed %u", r->seed);
	check_range(m, md, 0, UINT64_MAX, r->seed);
	for (int i = 0; i < 3; i++) {
		uint64_t s = rnd(r, MBLK), n = 1 + rnd(r, 300);

		check_range(m, md, s, n, r->seed);
	}
	for (int i = 0; i < 3; i++) {
		uint64_t s = rnd(r, MBLK + 10), data = UINT64_MAX, hole = s;

		for (uint64_t b = s; b < MBLK; b++)
			if (md->mapped[b] && !(md->fl[b] & PRE)) {
				data = b;
				break;
			}
		while (hole < MBLK && md->mapped[hole] && !(md->fl[hole] & PRE))
			hole++;
		if (data == UINT64_MAX) {
			cr_assert_eq(efs_extmap_seek_data(m, s, &x), -ENXIO, "seed %u", r->seed);
		} else {
			cr_assert_eq(efs_extmap_seek_data(m, s, &x), 0, "seed %u", r->seed);
			cr_assert_eq(x, data, "seed %u: seek_data(%lu)", r->seed, (unsigned long)s);
		}
		cr_assert_eq(efs_extmap_seek_hole(m, s), hole, "seed %u: seek_hole(%lu)", r->seed,
			     (unsigned long)s);
	}
}

/* Applies a snapshot to the dict, checking its order and values. */
static void dict_apply(struct dict *dc, const struct efs_extmap_change *v, size_t n,
		       uint32_t chunk_max, unsigned seed)
{
	bool puts = false;

	for (size_t i = 0; i < n; i++) {
		size_t j = 0;

		cr_assert(!(v[i].del && puts), "seed %u: deletion after a put", seed);
		cr_assert(i == 0 || v[i - 1].del != v[i].del || v[i - 1].key < v[i].key,
			  "seed %u: changes not sorted", seed);
		puts = !v[i].del;
		for (size_t k = 0; k < i; k++)
			cr_assert_neq(v[k].key, v[i].key, "seed %u: key twice in one snapshot",
				      seed);
		while (j < dc->n && dc->e[j].key < v[i].key)
			j++;
		if (v[i].del) {
			if (j < dc->n && dc->e[j].key == v[i].key) {
				efs_meta_record_free(dc->e[j].ch);
				memmove(&dc->e[j], &dc->e[j + 1],
					(dc->n - j - 1) * sizeof(dc->e[0]));
				dc->n--;
			}
			continue;
		}
		Etcfs__ExtentChunk *ch = NULL;
		const char *why = NULL;

		cr_assert_eq(efs_meta_extent_chunk_decode(v[i].val.data, v[i].val.len, &ch, &why),
			     0, "seed %u: %s", seed, why);
		cr_assert(ch->n_extents > 0 && ch->n_extents <= chunk_max, "seed %u: %zu extents",
			  seed, ch->n_extents);
		cr_assert_geq(ch->extents[0]->file_block, v[i].key, "seed %u", seed);
		cr_assert_eq(ch->extents[ch->n_extents - 1]->file_block +
				     ch->extents[ch->n_extents - 1]->count,
			     v[i].end, "seed %u", seed);
		if (j < dc->n && dc->e[j].key == v[i].key) {
			efs_meta_record_free(dc->e[j].ch);
		} else {
			cr_assert_lt(dc->n, DMAX);
			memmove(&dc->e[j + 1], &dc->e[j], (dc->n - j) * sizeof(dc->e[0]));
			dc->n++;
		}
		dc->e[j].key = v[i].key;
		dc->e[j].ch = ch;
	}
}

static uint64_t dict_end(const struct dict *dc)
{
	uint64_t end = 0;

	for (size_t i = 0; i < dc->n; i++) {
		const Etcfs__ExtentChunk *ch = dc->e[i].ch;
		uint64_t e = ch->extents[ch->n_extents - 1]->file_block +
			     ch->extents[ch->n_extents - 1]->count;

		if (e > end)
			end = e;
	}
	return end;
}

static void dict_free(struct dict *dc)
{
	for (size_t i = 0; i < dc->n; i++)
		efs_meta_record_free(dc->e[i].ch);
	dc->n = 0;
}

/* One publication: snapshot, maybe a change meanwhile, commit. */
static void publish(struct efs_extmap *m, struct dict *dc, size_t max, uint32_t chunk_max,
		    unsigned seed)
{
	struct efs_extmap_change *v;
	size_t n;

	cr_assert_eq(efs_extmap_changes(m, max, &v, &n), 0, "seed %u", seed);
	cr_assert_leq(n, max, "seed %u", seed);
	dict_apply(dc, v, n, chunk_max, seed);
	efs_extmap_published(m, v, n);
	efs_extmap_changes_free(v, n);
	cr_assert_eq(efs_extmap_published_end(m), dict_end(dc), "seed %u: published end", seed);
}

/* Publishes everything, then the dict must be the map: same keys, chunk
 * invariants, and a fresh map loaded from it in random order agrees. */
static void drain_and_compare(struct efs_extmap *m, struct dict *dc, uint32_t chunk_max,
			      const struct model *md, struct rnd *r)
{
	static uint64_t keys[DMAX];
	static size_t order[DMAX];
	struct efs_extmap *f;
	size_t nk;

	for (int i = 0; efs_extmap_ndirty(m) > 0; i++) {
		cr_assert_lt(i, 10000, "seed %u", r->seed);
		publish(m, dc, 1 + rnd(r, 8), chunk_max, r->seed);
	}
	nk = efs_extmap_chunk_keys(m, keys, DMAX);
	cr_assert_eq(nk, dc->n, "seed %u: %zu chunks, %zu keys stored", r->seed, nk, dc->n);
	cr_assert_eq(efs_extmap_published_end(m), efs_extmap_end(m), "seed %u", r->seed);
	for (size_t i = 0; i < nk; i++) {
		const Etcfs__ExtentChunk *ch = dc->e[i].ch;
		uint64_t lim = i + 1 < nk ? keys[i + 1] : UINT64_MAX;

		cr_assert_eq(keys[i], dc->e[i].key, "seed %u", r->seed);
		cr_assert(i == 0 || keys[i - 1] < keys[i], "seed %u", r->seed);
		cr_assert_leq(ch->extents[ch->n_extents - 1]->file_block +
				      ch->extents[ch->n_extents - 1]->count,
			      lim, "seed %u: chunk %lu reaches past its range", r->seed,
			      (unsigned long)keys[i]);
		order[i] = i;
	}
	for (size_t i = nk; i > 1; i--) {
		size_t j = rnd(r, i), t = order[i - 1];

		order[i - 1] = order[j];
		order[j] = t;
	}
	cr_assert_eq(efs_extmap_new(&f, chunk_max), 0);
	for (size_t i = 0; i < nk; i++)
		cr_assert_eq(efs_extmap_load_chunk(f, dc->e[order[i]].key, dc->e[order[i]].ch), 0,
			     "seed %u", r->seed);
	cr_assert_eq(efs_extmap_ndirty(f), 0);
	cr_assert_eq(efs_extmap_published_end(f), efs_extmap_end(m), "seed %u", r->seed);
	check_all(f, md, r);
	efs_extmap_free(f);
}

struct rstate {
	struct model *md;
	struct dict *dc;
	struct rnd r;
	struct efs_runs buried;
	uint64_t next_dev, nblk;
	uint32_t chunk_max;
};

/* One random set, punch or clear_flags, checked against the model. */
static void random_op(struct efs_extmap *m, struct rstate *st, int it)
{
	static uint64_t got[MBLK], want[MBLK];
	struct model *md = st->md;
	struct rnd *r = &st->r;
	unsigned seed = r->seed;
	int kind = (int)rnd(r, 8);
	uint64_t s = rnd(r, st->nblk), n = rnd(r, 10) ? 1 + rnd(r, 24) : 1 + rnd(r, 500);
	size_t nw = 0, ng = 0;

	efs_runs_clear(&st->buried);
	if (kind < 4) { /* set */
		uint32_t fl = rnd(r, 4) ? 0 : PRE;
		uint64_t d;

		if (s > 0 && md->mapped[s - 1] && rnd(r, 3) == 0) {
			d = md->d[s - 1] + 1; /* continues its left neighbour */
			fl = md->fl[s - 1];
		} else {
			d = st->next_dev;
			st->next_dev += n + rnd(r, 2);
		}
		for (uint64_t b = s; b < s + n; b++) {
			if (md->mapped[b])
				want[nw++] = md->d[b];
			md->mapped[b] = true;
			md->d[b] = d + (b - s);
			md->fl[b] = fl;
		}
		set(m, s, d, n, fl, &st->buried);
	} else if (kind < 6) { /* punch, sometimes to the end */
		bool to_end = rnd(r, 6) == 0;
		uint64_t e = to_end ? MBLK : (s + n > MBLK ? MBLK : s + n);

		for (uint64_t b = s; b < e; b++) {
			if (md->mapped[b])
				want[nw++] = md->d[b];
			md->mapped[b] = false;
		}
		cr_assert_eq(efs_extmap_punch(m, s, to_end ? UINT64_MAX - s : n, &st->buried), 0);
	} else { /* clear flags */
		for (uint64_t b = s; b < s + n && b < MBLK; b++)
			md->fl[b] = 0;
		cr_assert_eq(efs_extmap_clear_flags(m, s, n, PRE), 0);
	}
	/* Buried: exactly the blocks that lost their reference. */
	for (size_t i = 0; i < st->buried.n; i++)
		for (uint64_t b = 0; b < st->buried.v[i].len; b++) {
			cr_assert_lt(ng, MBLK, "seed %u: too many buried blocks", seed);
			got[ng++] = st->buried.v[i].start + b;
		}
	cr_assert_eq(ng, nw, "seed %u op %d: %zu buried, want %zu", seed, it, ng, nw);
	qsort(got, ng, sizeof(got[0]), cmp_u64);
	qsort(want, nw, sizeof(want[0]), cmp_u64);
	cr_assert(memcmp(got, want, ng * sizeof(got[0])) == 0, "seed %u op %d: buried", seed,
		  it);
	check_all(m, md, r);
}

/* |ops| random operations on a file of about |nblk| blocks, with publications
 * (snapshots taken before and committed after further operations). */
static void run_random(unsigned seed, uint32_t chunk_max, uint64_t nblk, int ops)
{
	struct rstate st = {
		.md = calloc(1, sizeof(*st.md)),
		.dc = calloc(1, sizeof(*st.dc)),
		.r = {.s = 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed * 0x100000001b3ull),
		      .seed = seed},
		.next_dev = 1000000,
		.nblk = nblk,
		.chunk_max = chunk_max,
	};
	struct efs_extmap *m = map_new(chunk_max);
	struct rnd *r = &st.r;

	cr_assert(st.md && st.dc);
	cr_assert_leq(nblk, NBLK);
	rnd(r, 1);
	for (int it = 0; it < ops; it++) {
		random_op(m, &st, it);
		if (rnd(r, 3) == 0) {
			struct efs_extmap_change *v;
			size_t nv;

			cr_assert_eq(efs_extmap_changes(m, 1 + rnd(r, 6), &v, &nv), 0);
			dict_apply(st.dc, v, nv, chunk_max, seed);
			for (uint64_t k = rnd(r, 4); k > 0; k--)
				random_op(m, &st, it);
			efs_extmap_published(m, v, nv);
			efs_extmap_changes_free(v, nv);
			cr_assert_eq(efs_extmap_published_end(m), dict_end(st.dc),
				     "seed %u op %d: published end", seed, it);
		}
		if (it % 16 == 15)
			drain_and_compare(m, st.dc, chunk_max, st.md, r);
	}
	drain_and_compare(m, st.dc, chunk_max, st.md, r);
	dict_free(st.dc);
	efs_runs_done(&st.buried);
	efs_extmap_free(m);
	free(st.md);
	free(st.dc);
}

Test(extmap, random_against_model_chunk_max_4)
{
	run_random(1, 4, NBLK, 1500);
	run_random(2, 4, 64, 1500);
	efs_test_assert_no_leaks();
}

Test(extmap, random_against_model_chunk_max_8)
{
	run_random(3, 8, NBLK, 1500);
	run_random(4, 6, 200, 1500);
	run_random((unsigned)time(NULL), 5, 1 + (unsigned)time(NULL) % NBLK, 1500);
	efs_test_assert_no_leaks();
}
