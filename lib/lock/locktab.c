/* SPDX-License-Identifier: Apache-2.0 */
#include "lock/locktab.h"

#include <errno.h>
#include <stdint.h>

#include "util/mem.h"

#define INITIAL_BUCKETS 64

static size_t bucket_of(const struct efs_locktab *t, uint64_t ino)
{
	/* Fibonacci hashing: inode numbers are often consecutive. */
	return (size_t)((ino * 0x9E3779B97F4A7C15ull) >> 32) & (t->nbuckets - 1);
}

static void list_init(struct efs_locktab_entry *h)
{
	h->lnext = h->lprev = h;
}

static void list_del(struct efs_locktab_entry *e)
{
	e->lprev->lnext = e->lnext;
	e->lnext->lprev = e->lprev;
	e->lnext = e->lprev = e;
}

static void list_add_tail(struct efs_locktab_entry *h, struct efs_locktab_entry *e)
{
	e->lprev = h->lprev;
	e->lnext = h;
	h->lprev->lnext = e;
	h->lprev = e;
}

int efs_locktab_init(struct efs_locktab *t, size_t max_cached)
{
	*t = (struct efs_locktab){0};
	t->max_cached = max_cached;
	t->nbuckets = INITIAL_BUCKETS;
	t->buckets = efs_mem_calloc(t->nbuckets, sizeof(*t->buckets));
	if (!t->buckets)
		return -ENOMEM;
	list_init(&t->lru);
	list_init(&t->dead);
	return 0;
}

static void free_list(struct efs_locktab_entry *h)
{
	while (h->lnext != h) {
		struct efs_locktab_entry *e = h->lnext;

		list_del(e);
		efs_mem_free(e);
	}
}

void efs_locktab_done(struct efs_locktab *t)
{
	if (!t->buckets)
		return;
	free_list(&t->lru);
	free_list(&t->dead);
	efs_mem_free(t->buckets);
	t->buckets = NULL;
	t->count = 0;
}

struct efs_locktab_entry *efs_locktab_find(const struct efs_locktab *t, uint64_t ino)
{
	struct efs_locktab_entry *e;

	if (!t->buckets)
		return NULL;
	for (e = t->buckets[bucket_of(t, ino)]; e; e = e->hnext)
		if (e->ino == ino)
			return e;
	return NULL;
}

/* Doubles the buckets; on -ENOMEM the table keeps working, only slower. */
static void grow(struct efs_locktab *t)
{
	size_t old_n = t->nbuckets, n = old_n * 2;
	struct efs_locktab_entry **old = t->buckets, **nb;

	nb = efs_mem_calloc(n, sizeof(*nb));
	if (!nb)
		return;
	t->buckets = nb;
	t->nbuckets = n;
	for (size_t i = 0; i < old_n; i++) {
		while (old[i]) {
			struct efs_locktab_entry *e = old[i];
			size_t b = bucket_of(t, e->ino);

			old[i] = e->hnext;
			e->hnext = nb[b];
			nb[b] = e;
		}
	}
	efs_mem_free(old);
}

int efs_locktab_add(struct efs_locktab *t, uint64_t ino, uint64_t now,
		    struct efs_locktab_entry **ret)
{
	struct efs_locktab_entry *e;
	size_t b;

	if (efs_locktab_find(t, ino))
		return -EEXIST;
	e = efs_mem_calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	if (t->count + 1 > t->nbuckets)
		grow(t);
	e->ino = ino;
	e->state = EFS_LOCKTAB_ACQUIRING;
	e->last_used_ns = now;
	b = bucket_of(t, ino);
	e->hnext = t->buckets[b];
	t->buckets[b] = e;
	list_add_tail(&t->lru, e);
	t->count++;
	*ret = e;
	return 0;
}

static void unhash(struct efs_locktab *t, struct efs_locktab_entry *e)
{
	struct efs_locktab_entry **pp = &t->buckets[bucket_of(t, e->ino)];

	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = e->hnext;
	e->hnext = NULL;
}

void efs_locktab_remove(struct efs_locktab *t, struct efs_locktab_entry *e)
{
	if (e->dead)
		return;
	unhash(t, e);
	list_del(e);
	t->count--;
	if (e->pins == 0) {
		efs_mem_free(e);
		return;
	}
	e->dead = true;
	list_add_tail(&t->dead, e);
}

void efs_locktab_remove_all(struct efs_locktab *t)
{
	while (t->lru.lnext != &t->lru)
		efs_locktab_remove(t, t->lru.lnext);
}

void efs_locktab_touch(struct efs_locktab *t, struct efs_locktab_entry *e, uint64_t now)
{
	if (now > e->last_used_ns)
		e->last_used_ns = now;
	if (e->dead)
		return;
	list_del(e);
	list_add_tail(&t->lru, e);
}

void efs_locktab_pin(struct efs_locktab *t, struct efs_locktab_entry *e, uint64_t now)
{
	e->pins++;
	e->pin_seq++;
	efs_locktab_touch(t, e, now);
}

void efs_locktab_unpin(struct efs_locktab *t, struct efs_locktab_entry *e, uint64_t now)
{
	if (e->pins > 0)
		e->pins--;
	if (e->dead) {
		if (e->pins == 0) {
			list_del(e);
			efs_mem_free(e);
		}
		return;
	}
	efs_locktab_touch(t, e, now);
}

void efs_locktab_note_kcache(struct efs_locktab_entry *e, uint64_t until_ns)
{
	if (until_ns > e->kcache_until_ns)
		e->kcache_until_ns = until_ns;
}

static bool releasable(const struct efs_locktab_entry *e, const struct efs_locktab_sel *sel)
{
	if (e->pins || e->state != EFS_LOCKTAB_HELD || e->prep)
		return false;
	return sel->ignore_kcache || e->kcache_until_ns <= sel->now;
}

size_t efs_locktab_select(const struct efs_locktab *t, const struct efs_locktab_sel *sel,
			  struct efs_locktab_entry **out, size_t max)
{
	size_t n = 0, excess = 0;
	struct efs_locktab_entry *e;

	if (t->max_cached && t->count > t->max_cached)
		excess = t->count - t->max_cached;
	for (e = t->lru.lnext; e != &t->lru && n < max; e = e->lnext) {
		bool idle = e->last_used_ns + sel->idle_ns <= sel->now;

		/* LRU order: once one is not idle, none after it is. */
		if (!sel->all && !idle && excess == 0)
			break;
		if (!releasable(e, sel))
			continue;
		out[n++] = e;
		if (!idle && excess > 0)
			excess--;
		else if (idle && excess > 0)
			excess--;
	}
	return n;
}

uint64_t efs_locktab_next_idle_ns(const struct efs_locktab *t, uint64_t idle_ns, uint64_t now)
{
	uint64_t best = UINT64_MAX;
	struct efs_locktab_entry *e;

	for (e = t->lru.lnext; e != &t->lru; e = e->lnext) {
		uint64_t at;

		if (e->pins || e->state != EFS_LOCKTAB_HELD)
			continue;
		at = e->last_used_ns + idle_ns;
		if (e->kcache_until_ns > at)
			at = e->kcache_until_ns;
		if (at < best)
			best = at;
		/* Entries later in LRU order become idle later; only a kernel
		 * cache deadline can make an older one later still. */
		if (e->last_used_ns + idle_ns > best)
			break;
	}
	return best < now ? now : best;
}

struct efs_locktab_entry *efs_locktab_first(const struct efs_locktab *t)
{
	return t->lru.lnext == &t->lru ? NULL : t->lru.lnext;
}

struct efs_locktab_entry *efs_locktab_next(const struct efs_locktab *t,
					   const struct efs_locktab_entry *e)
{
	return e->lnext == &t->lru ? NULL : e->lnext;
}
