/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The extent map (extmap.h). Chunks live in an array of pointers sorted by
 * key; each chunk holds a sorted array of extents. Every change works on the
 * chunks whose ranges meet the changed range: it computes their new contents
 * in scratch buffers, reserves every byte the commit needs (chunk capacity,
 * split chunks, the pointer array, deletions, buried runs), and only then
 * commits, so that -ENOMEM leaves the map as it was.
 *
 * Rules beyond the header: a set that reaches below the first chunk's key
 * (or into an empty map) creates a chunk with key 0 rather than moving a
 * key; a set over several chunks keeps their keys and cuts the new extent at
 * their boundaries. A chunk's key leaves the deletion list when a new chunk
 * takes that key again (the new chunk inherits the published state).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "meta/records.h"
#include "space/extmap.h"
#include "util/mem.h"

#define NONE SIZE_MAX

struct chunk {
	uint64_t key;
	struct efs_ext *v; /* sorted, non-overlapping, inside [key, next key) */
	size_t n, cap;
	uint64_t ver;	 /* bumped by every change (map-wide sequence) */
	uint64_t pubver; /* ver last published; dirty when != ver */
	bool persisted;	 /* the key may exist in etcd */
	bool snapped;	 /* was in a snapshot: may exist in etcd once it commits */
	uint64_t pend;	 /* one past the last block of the published value */
};

struct del {
	uint64_t key;
	uint64_t pend; /* published end of the key still stored */
	bool gone;     /* published (only inside efs_extmap_published) */
};

struct efs_extmap {
	struct chunk **c;
	size_t n, cap;
	struct del *d; /* pending deletions */
	size_t nd, dcap;
	uint32_t chunk_max;
	uint64_t seq;
	uint64_t blocks;
};

enum op { OP_SET, OP_PUNCH, OP_CLEAR };

static inline uint64_t ext_end(const struct efs_ext *x)
{
	return x->fblk + x->count;
}

static bool ext_eq(const struct efs_ext *a, const struct efs_ext *b)
{
	return a->fblk == b->fblk && a->dblk == b->dblk && a->count == b->count &&
	       a->flags == b->flags;
}

static struct chunk *chunk_new(uint64_t key, size_t cap)
{
	struct chunk *ch = efs_mem_calloc(1, sizeof(*ch));

	if (!ch)
		return NULL;
	if (cap) {
		ch->v = efs_mem_malloc(cap * sizeof(*ch->v));
		if (!ch->v) {
			efs_mem_free(ch);
			return NULL;
		}
	}
	ch->key = key;
	ch->cap = cap;
	return ch;
}

static void chunk_free(struct chunk *ch)
{
	if (!ch)
		return;
	efs_mem_free(ch->v);
	efs_mem_free(ch);
}

static int chunk_reserve(struct chunk *ch, size_t n)
{
	return efs_mem_reserve_exact(&ch->v, &ch->cap, n, sizeof(*ch->v));
}

static int ptrs_reserve(struct efs_extmap *m, size_t n)
{
	return efs_mem_reserve(&m->c, &m->cap, n, sizeof(*m->c));
}

static int dels_reserve(struct efs_extmap *m, size_t n)
{
	return efs_mem_reserve(&m->d, &m->dcap, n, sizeof(*m->d));
}

static int runs_room(struct efs_runs *r, size_t n)
{
	return efs_mem_reserve_exact(&r->v, &r->cap, n, sizeof(*r->v));
}

/* Index of |key| in the deletion list (sorted by key), NONE when absent. */
static size_t del_find(const struct efs_extmap *m, uint64_t key)
{
	size_t lo = 0, hi = m->nd;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->d[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < m->nd && m->d[lo].key == key ? lo : NONE;
}

static void del_remove(struct efs_extmap *m, size_t i)
{
	memmove(&m->d[i], &m->d[i + 1], (m->nd - i - 1) * sizeof(*m->d));
	m->nd--;
}

/*
 * Merges |add| (|n| deletions ascending, none listed already: a live chunk's
 * key is never listed) into the sorted list, from the back; room reserved.
 */
static void del_merge(struct efs_extmap *m, const struct del *add, size_t n)
{
	size_t i = m->nd, j = n, k = m->nd + n;

	while (j > 0) {
		if (i > 0 && m->d[i - 1].key > add[j - 1].key)
			m->d[--k] = m->d[--i];
		else
			m->d[--k] = add[--j];
	}
	m->nd += n;
}

/* A chunk that takes a key again inherits the state of its deletion. */
static void chunk_take_key(struct efs_extmap *m, struct chunk *ch)
{
	size_t i = del_find(m, ch->key);

	ch->ver = ++m->seq;
	ch->pubver = 0;
	if (i == NONE)
		return;
	ch->persisted = true;
	ch->pend = m->d[i].pend;
	del_remove(m, i);
}

/* Index of the last chunk with key <= |fblk|, NONE when there is none. */
static size_t chunk_find(const struct efs_extmap *m, uint64_t fblk)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m->c[mid]->key <= fblk)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? lo - 1 : NONE;
}

/* Index of the first extent of |ch| ending after |fblk|. */
static size_t ext_find(const struct chunk *ch, uint64_t fblk)
{
	size_t lo = 0, hi = ch->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (ext_end(&ch->v[mid]) <= fblk)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int efs_extmap_new(struct efs_extmap **ret, uint32_t chunk_max)
{
	struct efs_extmap *m = efs_mem_calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	if (chunk_max == 0)
		chunk_max = EFS_EXTMAP_CHUNK_MAX;
	m->chunk_max = chunk_max < 4 ? 4 : chunk_max;
	*ret = m;
	return 0;
}

struct efs_extmap *efs_extmap_free(struct efs_extmap *m)
{
	if (!m)
		return NULL;
	for (size_t i = 0; i < m->n; i++)
		chunk_free(m->c[i]);
	efs_mem_free(m->c);
	efs_mem_free(m->d);
	efs_mem_free(m);
	return NULL;
}

int efs_extmap_load_chunk(struct efs_extmap *m, uint64_t key, const Etcfs__ExtentChunk *chv)
{
	struct chunk *ch;
	uint64_t prev_end = key, sum = 0;
	size_t pos;

	if (chv->n_extents == 0)
		return -EUCLEAN;
	for (size_t i = 0; i < chv->n_extents; i++) {
		const Etcfs__Extent *e = chv->extents[i];

		if (e->count == 0 || e->file_block + e->count < e->file_block ||
		    e->dev_block + e->count < e->dev_block || e->file_block < prev_end)
			return -EUCLEAN;
		prev_end = e->file_block + e->count;
		sum += e->count;
	}
	pos = chunk_find(m, key);
	pos = pos == NONE ? 0 : pos + 1;
	if (pos > 0) {
		const struct chunk *p = m->c[pos - 1];

		if (p->key == key || ext_end(&p->v[p->n - 1]) > key)
			return -EUCLEAN;
	}
	if (pos < m->n && prev_end > m->c[pos]->key)
		return -EUCLEAN;
	if (ptrs_reserve(m, m->n + 1) < 0)
		return -ENOMEM;
	ch = chunk_new(key, chv->n_extents);
	if (!ch)
		return -ENOMEM;
	for (size_t i = 0; i < chv->n_extents; i++) {
		const Etcfs__Extent *e = chv->extents[i];

		ch->v[i] = (struct efs_ext){e->file_block, e->dev_block, e->count, e->flags};
	}
	ch->n = chv->n_extents;
	ch->ver = ch->pubver = ++m->seq;
	ch->persisted = true;
	ch->pend = prev_end;
	memmove(&m->c[pos + 1], &m->c[pos], (m->n - pos) * sizeof(*m->c));
	m->c[pos] = ch;
	m->n++;
	m->blocks += sum;
	return 0;
}

size_t efs_extmap_lookup(const struct efs_extmap *m, uint64_t fblk, uint64_t count,
			 struct efs_ext *out, size_t max)
{
	uint64_t end = fblk + count < fblk ? UINT64_MAX : fblk + count;
	size_t ci, n = 0;

	if (!count || !m->n)
		return 0;
	ci = chunk_find(m, fblk);
	if (ci == NONE)
		ci = 0;
	for (size_t xi = ext_find(m->c[ci], fblk); ci < m->n; ci++, xi = 0) {
		const struct chunk *ch = m->c[ci];

		if (ch->key >= end)
			break;
		for (; xi < ch->n && ch->v[xi].fblk < end; xi++) {
			const struct efs_ext *x = &ch->v[xi];
			uint64_t s = x->fblk > fblk ? x->fblk : fblk;
			uint64_t e = ext_end(x) < end ? ext_end(x) : end;

			if (n < max)
				out[n] = (struct efs_ext){s, x->dblk + (s - x->fblk), e - s,
							  x->flags};
			n++;
		}
	}
	return n;
}

/* The boundary above chunk |i| (UINT64_MAX: none; no extent ends past it). */
static uint64_t chunk_limit(const struct efs_extmap *m, size_t i)
{
	return i + 1 < m->n ? m->c[i + 1]->key : UINT64_MAX;
}

static void emit(struct efs_ext *w, size_t *nw, uint64_t f, uint64_t d, uint64_t n, uint32_t fl)
{
	if (n)
		w[(*nw)++] = (struct efs_ext){f, d, n, fl};
}

/*
 * The new contents of chunks a..b after the operation, in file order,
 * before the cut at chunk boundaries (at most total + 2 pieces).
 */
static size_t region_apply(const struct efs_extmap *m, size_t a, size_t b, enum op op,
			   uint64_t s, uint64_t e, const struct efs_ext *x, uint32_t flags,
			   struct efs_ext *w)
{
	size_t nw = 0;

	for (size_t i = a; i <= b; i++)
		for (size_t j = 0; j < m->c[i]->n && m->c[i]->v[j].fblk < s; j++) {
			const struct efs_ext *y = &m->c[i]->v[j];
			uint64_t ye = ext_end(y) < s ? ext_end(y) : s;

			emit(w, &nw, y->fblk, y->dblk, ye - y->fblk, y->flags);
		}
	if (op == OP_SET)
		w[nw++] = *x;
	else if (op == OP_CLEAR)
		for (size_t i = a; i <= b; i++)
			for (size_t j = ext_find(m->c[i], s);
			     j < m->c[i]->n && m->c[i]->v[j].fblk < e; j++) {
				const struct efs_ext *y = &m->c[i]->v[j];
				uint64_t cs = y->fblk > s ? y->fblk : s;
				uint64_t ce = ext_end(y) < e ? ext_end(y) : e;

				emit(w, &nw, cs, y->dblk + (cs - y->fblk), ce - cs,
				     y->flags & ~flags);
			}
	for (size_t i = a; i <= b; i++)
		for (size_t j = ext_find(m->c[i], e); j < m->c[i]->n; j++) {
			const struct efs_ext *y = &m->c[i]->v[j];
			uint64_t cs = y->fblk > e ? y->fblk : e;

			emit(w, &nw, cs, y->dblk + (cs - y->fblk), ext_end(y) - cs, y->flags);
		}
	return nw;
}

/*
 * Cuts |w| at the boundaries of chunks a..b and merges neighbours inside
 * each chunk into |o|; start[k] is the first piece of chunk a + k
 * (start[b - a + 1] the total).
 */
static void region_cut(const struct efs_extmap *m, size_t a, size_t b, const struct efs_ext *w,
		       size_t nw, struct efs_ext *o, size_t *start)
{
	size_t ci = a, no = 0;

	start[0] = 0;
	for (size_t i = 0; i < nw; i++) {
		struct efs_ext p = w[i];

		while (p.count) {
			uint64_t lim, take;

			while (ci < b && chunk_limit(m, ci) <= p.fblk) {
				ci++;
				start[ci - a] = no;
			}
			lim = chunk_limit(m, ci);
			take = ext_end(&p) <= lim || lim == UINT64_MAX ? p.count : lim - p.fblk;
			struct efs_ext *q = no > start[ci - a] ? &o[no - 1] : NULL;

			if (q && ext_end(q) == p.fblk && q->dblk + q->count == p.dblk &&
			    q->flags == p.flags)
				q->count += take;
			else
				o[no++] = (struct efs_ext){p.fblk, p.dblk, take, p.flags};
			p.fblk += take;
			p.dblk += take;
			p.count -= take;
		}
	}
	while (ci <= b) {
		ci++;
		start[ci - a] = no;
	}
}

static int extmap_apply(struct efs_extmap *m, enum op op, uint64_t s, uint64_t e,
			const struct efs_ext *x, uint32_t flags, struct efs_runs *buried)
{
	struct chunk *virt = NULL, **spl = NULL, **seg = NULL;
	struct efs_ext *w = NULL, *o;
	struct del *drop = NULL;
	size_t a, b, nb, total = 0, nw, nsplit = 0, nseg = 0, ndrop = 0;
	size_t *start = NULL;
	uint64_t oldb = 0, newb = 0;
	int r = -ENOMEM;

	if (op == OP_SET && (m->n == 0 || s < m->c[0]->key)) {
		if (ptrs_reserve(m, m->n + 1) < 0)
			return -ENOMEM;
		virt = chunk_new(0, 0);
		if (!virt)
			return -ENOMEM;
		memmove(&m->c[1], &m->c[0], m->n * sizeof(*m->c));
		m->c[0] = virt;
		m->n++;
	}
	if (m->n == 0)
		return 0;
	a = chunk_find(m, s);
	if (a == NONE)
		a = 0;
	b = chunk_find(m, e - 1);
	if (b == NONE)
		return 0; /* before the first chunk: nothing mapped (not a set) */
	nb = b - a + 1;
	for (size_t i = a; i <= b; i++)
		total += m->c[i]->n;

	w = efs_mem_malloc(2 * (total + 2 + nb) * sizeof(*w));
	start = efs_mem_malloc((nb + 1) * sizeof(*start));
	seg = efs_mem_malloc(2 * nb * sizeof(*seg));
	spl = efs_mem_calloc(nb, sizeof(*spl));
	drop = efs_mem_malloc(nb * sizeof(*drop));
	if (!w || !start || !seg || !spl || !drop)
		goto fail;
	o = w + total + 2 + nb;
	nw = region_apply(m, a, b, op, s, e, x, flags, w);
	region_cut(m, a, b, w, nw, o, start);

	for (size_t i = a; i <= b; i++) {
		size_t nn = start[i - a + 1] - start[i - a];

		if (chunk_reserve(m->c[i], nn) < 0)
			goto fail;
		if (nn > m->chunk_max) {
			spl[i - a] = chunk_new(0, nn - nn / 2);
			if (!spl[i - a])
				goto fail;
			nsplit++;
		}
	}
	if (ptrs_reserve(m, m->n + nsplit) < 0 || dels_reserve(m, m->nd + nb) < 0)
		goto fail;
	if (op != OP_CLEAR && runs_room(buried, buried->n + total) < 0)
		goto fail;

	/* Commit: nothing fails from here on. */
	for (size_t i = a; i <= b; i++) {
		const struct chunk *ch = m->c[i];

		for (size_t j = 0; j < ch->n; j++)
			oldb += ch->v[j].count;
		if (op == OP_CLEAR)
			continue;
		for (size_t j = ext_find(ch, s); j < ch->n && ch->v[j].fblk < e; j++) {
			const struct efs_ext *y = &ch->v[j];
			uint64_t cs = y->fblk > s ? y->fblk : s;
			uint64_t ce = ext_end(y) < e ? ext_end(y) : e;

			(void)efs_runs_add(buried, y->dblk + (cs - y->fblk), ce - cs);
		}
	}
	if (virt)
		chunk_take_key(m, virt);
	for (size_t i = a; i <= b; i++) {
		struct chunk *ch = m->c[i], *sp = spl[i - a];
		const struct efs_ext *nv = &o[start[i - a]];
		size_t nn = start[i - a + 1] - start[i - a];
		bool changed = nn != ch->n;

		for (size_t j = 0; j < nn; j++) {
			newb += nv[j].count;
			if (!changed && !ext_eq(&ch->v[j], &nv[j]))
				changed = true;
		}
		if (!changed) {
			seg[nseg++] = ch;
			continue;
		}
		if (nn == 0) {
			if (ch->persisted || ch->snapped)
				drop[ndrop++] = (struct del){ch->key, ch->pend, false};
			chunk_free(ch);
			continue;
		}
		memcpy(ch->v, nv, nn * sizeof(*nv));
		ch->n = nn;
		ch->ver = ++m->seq;
		seg[nseg++] = ch;
		if (sp) {
			size_t h = nn / 2;

			sp->key = ch->v[h].fblk;
			memcpy(sp->v, &ch->v[h], (nn - h) * sizeof(*sp->v));
			sp->n = nn - h;
			ch->n = h;
			sp->ver = 0; /* takes its key below */
			seg[nseg++] = sp;
			spl[i - a] = NULL;
		}
	}
	del_merge(m, drop, ndrop);
	for (size_t i = 0; i < nseg; i++)
		if (seg[i]->ver == 0)
			chunk_take_key(m, seg[i]);
	if (nseg != nb)
		memmove(&m->c[a + nseg], &m->c[b + 1], (m->n - b - 1) * sizeof(*m->c));
	memcpy(&m->c[a], seg, nseg * sizeof(*seg));
	m->n = m->n - nb + nseg;
	m->blocks = m->blocks - oldb + newb;
	r = 0;
	goto out;

fail:
	for (size_t i = 0; spl && i < nb; i++)
		chunk_free(spl[i]);
	if (virt) {
		memmove(&m->c[0], &m->c[1], (m->n - 1) * sizeof(*m->c));
		m->n--;
		chunk_free(virt);
	}
out:
	efs_mem_free(w);
	efs_mem_free(start);
	efs_mem_free(seg);
	efs_mem_free(spl);
	efs_mem_free(drop);
	return r;
}

int efs_extmap_set(struct efs_extmap *m, const struct efs_ext *x, struct efs_runs *buried)
{
	if (x->count == 0 || x->fblk + x->count < x->fblk || x->dblk + x->count < x->dblk)
		return -EINVAL;
	return extmap_apply(m, OP_SET, x->fblk, x->fblk + x->count, x, 0, buried);
}

int efs_extmap_punch(struct efs_extmap *m, uint64_t fblk, uint64_t count,
		     struct efs_runs *buried)
{
	uint64_t end = fblk + count < fblk ? UINT64_MAX : fblk + count;

	if (count == 0)
		return 0;
	return extmap_apply(m, OP_PUNCH, fblk, end, NULL, 0, buried);
}

int efs_extmap_clear_flags(struct efs_extmap *m, uint64_t fblk, uint64_t count, uint32_t flags)
{
	uint64_t end = fblk + count < fblk ? UINT64_MAX : fblk + count;

	if (count == 0 || flags == 0)
		return 0;
	return extmap_apply(m, OP_CLEAR, fblk, end, NULL, flags, NULL);
}

uint64_t efs_extmap_blocks(const struct efs_extmap *m)
{
	return m->blocks;
}

uint64_t efs_extmap_end(const struct efs_extmap *m)
{
	const struct chunk *ch;

	if (!m->n)
		return 0;
	ch = m->c[m->n - 1];
	return ext_end(&ch->v[ch->n - 1]);
}

size_t efs_extmap_nchunks(const struct efs_extmap *m)
{
	return m->n;
}

size_t efs_extmap_ndirty(const struct efs_extmap *m)
{
	size_t n = m->nd;

	for (size_t i = 0; i < m->n; i++)
		n += m->c[i]->ver != m->c[i]->pubver;
	return n;
}

size_t efs_extmap_chunk_keys(const struct efs_extmap *m, uint64_t *keys, size_t max)
{
	for (size_t i = 0; i < m->n && i < max; i++)
		keys[i] = m->c[i]->key;
	return m->n;
}

int efs_extmap_seek_data(const struct efs_extmap *m, uint64_t fblk, uint64_t *ret)
{
	size_t ci = chunk_find(m, fblk);

	if (!m->n)
		return -ENXIO;
	if (ci == NONE)
		ci = 0;
	for (size_t xi = ext_find(m->c[ci], fblk); ci < m->n; ci++, xi = 0)
		for (; xi < m->c[ci]->n; xi++) {
			const struct efs_ext *x = &m->c[ci]->v[xi];

			if (x->flags & EFS_META_EXTENT_F_PREALLOC)
				continue;
			*ret = x->fblk > fblk ? x->fblk : fblk;
			return 0;
		}
	return -ENXIO;
}

uint64_t efs_extmap_seek_hole(const struct efs_extmap *m, uint64_t fblk)
{
	size_t ci = chunk_find(m, fblk);
	uint64_t pos = fblk;

	if (!m->n)
		return fblk;
	if (ci == NONE)
		ci = 0;
	for (size_t xi = ext_find(m->c[ci], fblk); ci < m->n; ci++, xi = 0)
		for (; xi < m->c[ci]->n; xi++) {
			const struct efs_ext *x = &m->c[ci]->v[xi];

			if (x->fblk > pos || (x->flags & EFS_META_EXTENT_F_PREALLOC))
				return pos;
			pos = ext_end(x);
		}
	return pos;
}

/* ---- Publication ---- */

static int chunk_pack(const struct chunk *ch, ProtobufCBinaryData *val)
{
	Etcfs__ExtentChunk msg = ETCFS__EXTENT_CHUNK__INIT;
	Etcfs__Extent *ex = efs_mem_calloc(ch->n, sizeof(*ex));
	Etcfs__Extent **pp = efs_mem_calloc(ch->n, sizeof(*pp));
	int r = -ENOMEM;

	if (!ex || !pp)
		goto out;
	for (size_t i = 0; i < ch->n; i++) {
		etcfs__extent__init(&ex[i]);
		ex[i].file_block = ch->v[i].fblk;
		ex[i].dev_block = ch->v[i].dblk;
		ex[i].count = ch->v[i].count;
		ex[i].flags = ch->v[i].flags;
		pp[i] = &ex[i];
	}
	msg.n_extents = ch->n;
	msg.extents = pp;
	r = efs_meta_pack(&msg.base, val);
out:
	efs_mem_free(ex);
	efs_mem_free(pp);
	return r;
}

int efs_extmap_changes(struct efs_extmap *m, size_t max, struct efs_extmap_change **ret,
		       size_t *n)
{
	size_t want = efs_extmap_ndirty(m), k = 0;
	struct efs_extmap_change *v;

	if (want > max)
		want = max;
	*ret = NULL;
	*n = 0;
	if (want == 0)
		return 0;
	v = efs_mem_calloc(want, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < m->nd && k < want; i++, k++) { /* sorted by key */
		v[k].key = m->d[i].key;
		v[k].del = true;
		v[k].pend = m->d[i].pend;
	}
	for (size_t i = 0; i < m->n && k < want; i++) {
		struct chunk *ch = m->c[i];

		if (ch->ver == ch->pubver)
			continue;
		if (chunk_pack(ch, &v[k].val) < 0) {
			efs_extmap_changes_free(v, k);
			return -ENOMEM;
		}
		v[k].key = ch->key;
		v[k].end = ext_end(&ch->v[ch->n - 1]);
		v[k].pend = ch->persisted ? ch->pend : 0;
		v[k].ver = ch->ver;
		k++;
	}
	for (size_t i = 0; i < k; i++)
		if (!v[i].del) {
			size_t ci = chunk_find(m, v[i].key);

			m->c[ci]->snapped = true;
		}
	*ret = v;
	*n = k;
	return 0;
}

void efs_extmap_changes_free(struct efs_extmap_change *v, size_t n)
{
	if (!v)
		return;
	for (size_t i = 0; i < n; i++)
		efs_mem_free(v[i].val.data);
	efs_mem_free(v);
}

static struct chunk *chunk_by_key(const struct efs_extmap *m, uint64_t key)
{
	size_t ci = chunk_find(m, key);

	return ci != NONE && m->c[ci]->key == key ? m->c[ci] : NULL;
}

void efs_extmap_published(struct efs_extmap *m, const struct efs_extmap_change *v, size_t n)
{
	size_t o = 0;
	bool gone = false;

	for (size_t i = 0; i < n; i++) {
		struct chunk *ch = chunk_by_key(m, v[i].key);
		size_t di = del_find(m, v[i].key);

		if (v[i].del) {
			if (di != NONE) {
				m->d[di].gone = true; /* removed below, in one pass */
				gone = true;
			} else if (ch) {
				ch->persisted = false;
				ch->pend = 0;
			}
			continue;
		}
		if (ch) {
			ch->persisted = true;
			ch->pend = v[i].end;
			if (ch->ver == v[i].ver)
				ch->pubver = v[i].ver;
		} else if (di != NONE) {
			/* Dropped after the snapshot: its deletion is pending. */
			m->d[di].pend = v[i].end;
		}
		/*
		 * Otherwise the chunk was dropped and its deletion already
		 * published: only an out-of-order publication gets here.
		 */
	}
	if (!gone)
		return;
	for (size_t i = 0; i < m->nd; i++)
		if (!m->d[i].gone)
			m->d[o++] = m->d[i];
	m->nd = o;
}

uint64_t efs_extmap_published_end(const struct efs_extmap *m)
{
	uint64_t end = 0;

	for (size_t i = 0; i < m->n; i++)
		if (m->c[i]->persisted && m->c[i]->pend > end)
			end = m->c[i]->pend;
	for (size_t i = 0; i < m->nd; i++)
		if (m->d[i].pend > end)
			end = m->d[i].pend;
	return end;
}

void efs_extmap_mark_all_dirty(struct efs_extmap *m)
{
	for (size_t i = 0; i < m->n; i++)
		m->c[i]->ver = ++m->seq;
}
