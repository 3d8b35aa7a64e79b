/* SPDX-License-Identifier: Apache-2.0 */
#include "lock/deaths.h"
#include "lock/lock-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "etcd/kv.h"
#include "etcd/txn.h"
#include "etcd/watch.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/log.h"
#include "util/mem.h"

/* A catch-up read is not sent again sooner than this after the last one. */
#define CATCHUP_GAP_NS (100ull * 1000 * 1000)
/* A catch-up read not answered by then answers its checks copy-on-write. */
#define CATCHUP_TIMEOUT_MS 2000
/* A free hold asked about a revision the watch has not reached yet asks
 * again after this (a catch-up read is on its way). */
#define FREE_RECHECK_NS (100ull * 1000 * 1000)
/* Holder keys per page of the read at a death's revision - 1. */
#define HOLDER_PAGE 1000

/* Calls in flight hold one of these, so that the tracker may go first. */
struct dref {
	struct efs_deaths *d;
	unsigned refs;
};

struct member {
	char node[EFS_META_NODE_MAX + 1];
	int64_t create_rev;
};

struct mark {
	uint64_t ino;
	uint64_t until_ns;
};

struct death {
	char node[EFS_META_NODE_MAX + 1];
	int64_t rev; /* the revision its node key was deleted at */
};

struct dwait {
	struct efs_list link; /* efs_deaths.waits, or a list being answered */
	uint64_t ino;
	int64_t rev;
	efs_deaths_cb cb;
	void *arg;
	uint64_t since_ns;
};

struct efs_deaths {
	uv_loop_t *loop;
	struct efs_etcd *c;
	struct efs_meta_ns ns;
	char self[EFS_META_NODE_MAX + 1];
	uint64_t grace_ns;
	struct dref *ref;

	/* The members as of |watch_rev| (node keys and their create revisions). */
	struct member *members;
	size_t n_members, cap_members;
	int64_t watch_rev; /* every n/ event up to here has been delivered */
	bool listing;	   /* the n/ listing is in flight */
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;

	/* Deaths whose holders are still to be read, oldest first. */
	struct death *pending;
	size_t n_pending, cap_pending;
	bool reading; /* the read of pending[0]'s holders is in flight */

	/* Inodes marked until a time: the first |n_sorted| sorted by inode,
	 * then those of the death being read. */
	struct mark *marks;
	size_t n_marks, n_sorted, cap_marks;
	uint64_t all_until_ns; /* every inode is marked until then */
	uint64_t death_until_ns; /* the latest grace end of the deaths seen */

	struct efs_list waits; /* checks waiting for the known revision (dwait.link), newest first */
	bool catching_up;
	int64_t catchup_base; /* |watch_rev| when the catch-up was sent */
	uint64_t catchup_ns;  /* when the last one was sent */

	efs_deaths_peer_cb peer_cb;
	void *peer_arg;

	struct efs_deaths_stats stats;
};

static struct dref *dref_get(struct efs_deaths *d)
{
	d->ref->refs++;
	return d->ref;
}

static struct efs_deaths *dref_put(struct dref *r)
{
	struct efs_deaths *d = r->d;

	if (--r->refs == 0)
		efs_mem_free(r);
	return d;
}

static uint64_t now_ns(void)
{
	return efs_clock_mono_ns();
}

static int64_t known_rev(const struct efs_deaths *d)
{
	if (d->n_pending)
		return d->pending[0].rev - 1;
	return d->watch_rev;
}

static bool is_marked(const struct efs_deaths *d, uint64_t ino, uint64_t now);
static void catchup_start(struct efs_deaths *d);
static bool unchanged_since(const struct efs_deaths *d, const Etcdserverpb__RangeResponse *nodes,
			    const Etcdserverpb__RangeResponse *gens, int64_t base);

/*
 * Answers the checks that can be answered: those whose grant is known now,
 * and with |fail| every one (copy-on-write). A check still waiting sends
 * the next catch-up. Callbacks may call in again.
 */
static void waits_run(struct efs_deaths *d, bool fail)
{
	struct efs_list ready, *n, *tmp;

	/* Answered oldest first. */
	efs_list_init(&ready);
	efs_list_for_each_safe(n, tmp, &d->waits) {
		struct dwait *w = efs_list_entry(n, struct dwait, link);

		if (fail || w->rev <= known_rev(d)) {
			efs_list_del(n);
			efs_list_add_head(&ready, n);
		}
	}
	while ((n = efs_list_pop(&ready))) {
		struct dwait *w = efs_list_entry(n, struct dwait, link);
		bool ok = !fail && !is_marked(d, w->ino, now_ns());

		if (!ok)
			d->stats.cow++;
		w->cb(w->arg, ok);
		efs_mem_free(w);
	}
	if (!efs_list_empty(&d->waits))
		catchup_start(d);
}

/* ---- Marks ---- */

static void mark_all(struct efs_deaths *d, const char *why)
{
	uint64_t until = now_ns() + d->grace_ns;

	efs_log_warn("deaths: %s: every file is written copy-on-write for %" PRIu64 " s", why,
		     (uint64_t)(d->grace_ns / 1000000000u));
	if (until > d->all_until_ns)
		d->all_until_ns = until;
}

static int mark_cmp(const void *a, const void *b)
{
	const struct mark *x = a, *y = b;

	return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* Drops expired marks and sorts the rest (after a death's marks came). */
static void marks_settle(struct efs_deaths *d)
{
	uint64_t now = now_ns();
	size_t k = 0;

	for (size_t i = 0; i < d->n_marks; i++)
		if (d->marks[i].until_ns > now)
			d->marks[k++] = d->marks[i];
	d->n_marks = k;
	if (k > 1) /* |marks| is NULL until the first mark, and qsort's base may not be */
		qsort(d->marks, d->n_marks, sizeof(*d->marks), mark_cmp);
	d->n_sorted = k;
}

static int mark_add(struct efs_deaths *d, uint64_t ino, uint64_t until)
{
	if (efs_mem_reserve(&d->marks, &d->cap_marks, d->n_marks + 1, sizeof(*d->marks)) < 0)
		return -ENOMEM;
	d->marks[d->n_marks++] = (struct mark){ino, until};
	return 0;
}

static bool is_marked(const struct efs_deaths *d, uint64_t ino, uint64_t now)
{
	size_t lo = 0, hi = d->n_sorted;

	if (now < d->all_until_ns)
		return true;
	for (size_t i = d->n_sorted; i < d->n_marks; i++)
		if (d->marks[i].ino == ino && d->marks[i].until_ns > now)
			return true;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (d->marks[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	/* Several deaths may mark one inode: the sort keeps them together. */
	for (; lo < d->n_sorted && d->marks[lo].ino == ino; lo++)
		if (d->marks[lo].until_ns > now)
			return true;
	return false;
}

/* ---- Members ---- */

static struct member *member_find(struct efs_deaths *d, const char *node)
{
	for (size_t i = 0; i < d->n_members; i++)
		if (strcmp(d->members[i].node, node) == 0)
			return &d->members[i];
	return NULL;
}

static int member_set(struct efs_deaths *d, const char *node, int64_t create_rev)
{
	struct member *m = member_find(d, node);

	if (!m) {
		if (efs_mem_reserve(&d->members, &d->cap_members, d->n_members + 1,
				    sizeof(*d->members)) < 0)
			return -ENOMEM;
		m = &d->members[d->n_members++];
		snprintf(m->node, sizeof(m->node), "%s", node);
	}
	m->create_rev = create_rev;
	return 0;
}

static void member_del(struct efs_deaths *d, const char *node)
{
	struct member *m = member_find(d, node);

	if (m)
		*m = d->members[--d->n_members];
}

/* ---- Reading a dead node's holders ---- */

static void read_next(struct efs_deaths *d);

static void death_done(struct efs_deaths *d)
{
	char node[EFS_META_NODE_MAX + 1];
	struct dref *ref;

	snprintf(node, sizeof(node), "%s", d->pending[0].node);
	memmove(d->pending, d->pending + 1, (d->n_pending - 1) * sizeof(*d->pending));
	d->n_pending--;
	d->reading = false;
	marks_settle(d);
	ref = dref_get(d);
	if (d->peer_cb)
		d->peer_cb(d->peer_arg, node);
	if (dref_put(ref)) {
		read_next(d);
		waits_run(d, false);
	}
}

struct hread {
	struct dref *ref;
	struct death who;
	uint64_t until_ns;
	uint64_t n;
	bool nomem;
};

static int holders_page(const Etcdserverpb__RangeResponse *page, int64_t revision, void *arg)
{
	struct hread *h = arg;
	struct efs_deaths *d = h->ref->d;

	(void)revision;
	if (!d)
		return -ECANCELED;
	for (size_t i = 0; i < page->n_kvs; i++) {
		const Mvccpb__KeyValue *kv = page->kvs[i];
		struct efs_meta_key_info ki;

		if (efs_meta_key_parse(&d->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_HOLDER || ki.mode != EFS_META_LOCK_EXCLUSIVE ||
		    strcmp(ki.node, h->who.node) != 0)
			continue;
		if (mark_add(d, ki.ino, h->until_ns) < 0) {
			h->nomem = true;
			return -ENOMEM;
		}
		h->n++;
	}
	return 0;
}

static void holders_done(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *all, void *arg)
{
	struct hread *h = arg;
	struct efs_deaths *d = dref_put(h->ref);

	(void)all;
	if (d) {
		if (r->err < 0) {
			char why[160];

			snprintf(why, sizeof(why),
				 "the locks node %s held when its session ended (revision %" PRId64
				 ") cannot be read: %s",
				 h->who.node, h->who.rev, r->message);
			d->stats.unknown++;
			mark_all(d, why);
		} else {
			d->stats.marked += h->n;
			efs_log_info("deaths: node %s's session ended at revision %" PRId64
				     " holding %" PRIu64 " inodes exclusively: they are written "
				     "copy-on-write for %" PRIu64 " s",
				     h->who.node, h->who.rev, h->n, (uint64_t)(d->grace_ns / 1000000000u));
		}
		death_done(d);
	}
	efs_mem_free(h);
}

static void read_next(struct efs_deaths *d)
{
	struct efs_meta_range rg;
	struct efs_etcd_paged_opts o = {.page_size = HOLDER_PAGE, .keys_only = true};
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO};
	struct hread *h;
	int r;

	if (d->reading || !d->n_pending)
		return;
	h = efs_mem_calloc(1, sizeof(*h));
	r = h ? efs_meta_range_family(&d->ns, EFS_META_K_HOLDER, &rg) : -ENOMEM;
	if (r == 0) {
		h->who = d->pending[0];
		/* The grace runs from when we learn of the death: later than
		 * the death itself, so never shorter. */
		h->until_ns = now_ns() + d->grace_ns;
		h->ref = dref_get(d);
		o.range_end = rg.end.buf;
		o.range_end_len = rg.end.len;
		o.revision = h->who.rev - 1;
		d->reading = true;
		r = efs_etcd_range_paged(d->c, rg.key.buf, rg.key.len, &o, &co, holders_page,
					 holders_done, h, NULL);
		if (r < 0) {
			d->reading = false;
			dref_put(h->ref);
		}
	}
	if (r == 0)
		return;
	efs_mem_free(h);
	d->stats.unknown++;
	mark_all(d, "the locks of a node whose session ended cannot be read");
	d->reading = true; /* death_done clears it */
	death_done(d);
}

static int death_add(struct efs_deaths *d, const char *node, int64_t rev)
{
	if (efs_mem_reserve(&d->pending, &d->cap_pending, d->n_pending + 1, sizeof(*d->pending)) < 0)
		return -ENOMEM;
	snprintf(d->pending[d->n_pending].node, sizeof(d->pending[0].node), "%s", node);
	d->pending[d->n_pending].rev = rev;
	d->n_pending++;
	d->stats.deaths++;
	if (now_ns() + d->grace_ns > d->death_until_ns)
		d->death_until_ns = now_ns() + d->grace_ns;
	return 0;
}

/* ---- The watch ---- */

static void restart(struct efs_deaths *d, const char *why)
{
	d->w = efs_etcd_watcher_free(d->w);
	d->n_members = 0;
	mark_all(d, why);
	/* efs_deaths_start lists again (the lock cache's tick calls it). */
}

static void node_event(struct efs_deaths *d, const Mvccpb__Event *ev)
{
	const Mvccpb__KeyValue *kv = ev->kv;
	struct efs_meta_key_info ki;

	if (!kv || efs_meta_key_parse(&d->ns, kv->key.data, kv->key.len, &ki) < 0 ||
	    ki.family != EFS_META_K_NODE)
		return;
	if (ev->type == MVCCPB__EVENT__EVENT_TYPE__PUT) {
		if (member_set(d, ki.node, kv->create_revision) < 0)
			restart(d, "out of memory tracking the nodes");
		return;
	}
	member_del(d, ki.node);
	if (strcmp(ki.node, d->self) == 0)
		return; /* our own locks went with our lease: nothing to take over */
	if (death_add(d, ki.node, kv->mod_revision) < 0)
		mark_all(d, "out of memory noting a node's death");
}

static void watch_cb(struct efs_etcd_watcher *w, int status, const struct efs_etcd_watch_update *u,
		     void *arg)
{
	struct efs_deaths *d = arg;

	(void)w;
	if (u->kind == EFS_ETCD_WATCH_EVENTS) {
		for (size_t i = 0; i < u->n_events && d->w; i++) {
			const Mvccpb__Event *ev = u->events[i];

			node_event(d, ev);
			if (ev->kv && ev->kv->mod_revision > d->watch_rev)
				d->watch_rev = ev->kv->mod_revision;
		}
		read_next(d);
		waits_run(d, false);
		return;
	}
	if (u->kind == EFS_ETCD_WATCH_PROGRESS) {
		if (u->revision > d->watch_rev)
			d->watch_rev = u->revision;
		waits_run(d, false);
		return;
	}
	if (u->kind != EFS_ETCD_WATCH_COMPACTED && u->kind != EFS_ETCD_WATCH_CANCELED)
		return;
	efs_log_debug("deaths: the n/ watch ended (%d)", status);
	restart(d, "the watch of the node keys ended, deaths may have been missed");
	waits_run(d, true);
}

static void list_done(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct efs_deaths *d = dref_put(arg);
	struct efs_meta_range rg;
	int e;

	if (!d)
		return;
	d->listing = false;
	if (r->err < 0) {
		efs_log_debug("deaths: listing the node keys: %s", r->message);
		waits_run(d, true);
		return; /* efs_deaths_start tries again */
	}
	d->n_members = 0;
	for (size_t i = 0; i < resp->n_kvs; i++) {
		struct efs_meta_key_info ki;

		if (efs_meta_key_parse(&d->ns, resp->kvs[i]->key.data, resp->kvs[i]->key.len,
				       &ki) == 0 &&
		    ki.family == EFS_META_K_NODE && member_set(d, ki.node, resp->kvs[i]->create_revision) < 0)
			return;
	}
	if (resp->header && resp->header->revision > d->watch_rev)
		d->watch_rev = resp->header->revision;
	e = efs_meta_range_family(&d->ns, EFS_META_K_NODE, &rg);
	if (e == 0)
		e = efs_lock__watch_range(d->c, &d->ws, &rg,
					  resp->header ? resp->header->revision + 1 : 0, false,
					  watch_cb, d, &d->w);
	if (e < 0) {
		efs_log_warn("deaths: cannot watch the node keys: %s", strerror(-e));
		waits_run(d, true);
		return;
	}
	/* The watch starts after the listing: what waits needs a catch-up. */
	waits_run(d, false);
}

void efs_deaths_start(struct efs_deaths *d)
{
	struct efs_meta_range rg;
	struct efs_etcd_range_opts o = {.keys_only = true};
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO};
	struct dref *ref;

	if (!d || d->w || d->listing || efs_meta_range_family(&d->ns, EFS_META_K_NODE, &rg) < 0)
		return;
	o.range_end = rg.end.buf;
	o.range_end_len = rg.end.len;
	ref = dref_get(d);
	if (efs_etcd_range(d->c, rg.key.buf, rg.key.len, &o, &co, list_done, ref) < 0) {
		dref_put(ref);
		return;
	}
	d->listing = true;
}

/* ---- Catching up with a grant newer than the watch ---- */

static bool unchanged_since(const struct efs_deaths *d, const Etcdserverpb__RangeResponse *nodes,
			    const Etcdserverpb__RangeResponse *gens, int64_t base)
{
	size_t found = 0;

	for (size_t i = 0; i < gens->n_kvs; i++)
		if (gens->kvs[i]->mod_revision > base)
			return false; /* a registration since: it may have died too */
	for (size_t i = 0; i < nodes->n_kvs; i++) {
		struct efs_meta_key_info ki;
		const struct member *m = NULL;

		if (efs_meta_key_parse(&d->ns, nodes->kvs[i]->key.data, nodes->kvs[i]->key.len,
				       &ki) < 0 ||
		    ki.family != EFS_META_K_NODE)
			continue;
		for (size_t k = 0; k < d->n_members && !m; k++)
			if (strcmp(d->members[k].node, ki.node) == 0)
				m = &d->members[k];
		if (!m || m->create_rev != nodes->kvs[i]->create_revision)
			return false;
		found++;
	}
	return found == d->n_members; /* else a known member's key went */
}

static void catchup_done(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_deaths *d = dref_put(arg);
	Etcdserverpb__RangeResponse *nodes = NULL, *gens = NULL;

	if (!d)
		return;
	d->catching_up = false;
	if (r->err < 0 || efs_etcd_txn_resp_range(resp, 0, &nodes) < 0 ||
	    efs_etcd_txn_resp_range(resp, 1, &gens) < 0 || !resp->header) {
		waits_run(d, true);
		return;
	}
	/* Unless the watch moved meanwhile (then the next catch-up reads
	 * again), n/ and g/ unchanged since the watch's revision prove that
	 * no session ended up to this reply's revision. */
	if (d->w && !d->n_pending && d->watch_rev == d->catchup_base &&
	    unchanged_since(d, nodes, gens, d->catchup_base) &&
	    resp->header->revision > d->watch_rev) {
		d->watch_rev = resp->header->revision;
		d->stats.catchups++;
	}
	/* What still waits sends the next one (or waits for the watch). */
	d->catchup_ns = 0;
	waits_run(d, false);
}

static void catchup_start(struct efs_deaths *d)
{
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO, .timeout_ms = CATCHUP_TIMEOUT_MS};
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_range rn, rgn;
	struct dref *ref;
	uint64_t now = now_ns();
	int r;

	if (d->catching_up || !d->w || d->n_pending || now - d->catchup_ns < CATCHUP_GAP_NS)
		return;
	r = efs_meta_range_family(&d->ns, EFS_META_K_NODE, &rn);
	if (r == 0)
		r = efs_meta_range_family(&d->ns, EFS_META_K_GEN, &rgn);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rn.key.buf, rn.key.len, rn.end.buf,
				       rn.end.len);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rgn.key.buf, rgn.key.len,
				       rgn.end.buf, rgn.end.len);
	if (r == 0) {
		ref = dref_get(d);
		r = efs_etcd_txn(d->c, efs_etcd_txn_request(t), &co, catchup_done, ref);
		if (r < 0)
			dref_put(ref);
	}
	efs_etcd_txn_free(t);
	if (r < 0)
		return;
	d->catching_up = true;
	d->catchup_base = d->watch_rev;
	d->catchup_ns = now;
}

/* ---- Public ---- */

int efs_deaths_check(struct efs_deaths *d, uint64_t ino, int64_t grant_rev, efs_deaths_cb cb,
		     void *arg)
{
	struct dwait *w;

	if (d->w && grant_rev <= known_rev(d)) {
		if (!is_marked(d, ino, now_ns()))
			return 1;
		d->stats.cow++;
		return 0;
	}
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->ino = ino;
	w->rev = grant_rev;
	w->cb = cb;
	w->arg = arg;
	w->since_ns = now_ns();
	efs_list_add_head(&d->waits, &w->link);
	efs_deaths_start(d);
	catchup_start(d);
	return -EINPROGRESS;
}

uint64_t efs_deaths_free_hold(struct efs_deaths *d, int64_t rev,
			      const Etcdserverpb__RangeResponse *nodes,
			      const Etcdserverpb__RangeResponse *gens)
{
	uint64_t now = now_ns();
	uint64_t until = d->death_until_ns > d->all_until_ns ? d->death_until_ns : d->all_until_ns;

	if (rev <= 0)
		return now + d->grace_ns; /* when it committed is not known */
	/* n/ and g/ as of |rev|, unchanged since the watch's revision: no
	 * session ended up to |rev| (as a catch-up read proves). */
	if (d->w && rev > d->watch_rev && nodes && gens && !d->n_pending &&
	    unchanged_since(d, nodes, gens, d->watch_rev))
		d->watch_rev = rev;
	if (d->w && rev <= d->watch_rev)
		return until > now ? until : 0;
	/* A death before |rev| may not have reached us yet: a catch-up read
	 * (or the watch) tells. While a grace runs anyway, ask at its end. */
	efs_deaths_start(d);
	catchup_start(d);
	if (until > now)
		return until;
	return now + FREE_RECHECK_NS;
}

void efs_deaths_set_peer_cb(struct efs_deaths *d, efs_deaths_peer_cb cb, void *arg)
{
	d->peer_cb = cb;
	d->peer_arg = arg;
}

void efs_deaths_tick(struct efs_deaths *d)
{
	uint64_t now = now_ns();
	bool late = false;
	struct efs_list *n;

	efs_deaths_start(d);
	efs_list_for_each(n, &d->waits)
		late = late || now - efs_list_entry(n, struct dwait, link)->since_ns >
				       (uint64_t)CATCHUP_TIMEOUT_MS * 1000000u;
	if (late) {
		efs_log_warn("deaths: the node keys could not be read for %d ms: writes waiting "
			     "for them go copy-on-write",
			     CATCHUP_TIMEOUT_MS);
		waits_run(d, true);
	}
}

void efs_deaths_get_stats(const struct efs_deaths *d, struct efs_deaths_stats *ret)
{
	*ret = d->stats;
	ret->known_rev = known_rev(d);
}

int efs_deaths_new(struct efs_deaths **ret, uv_loop_t *loop, struct efs_etcd *c,
		   const struct efs_deaths_opts *o)
{
	struct efs_deaths *d;

	if (!ret || !loop || !c || !o || !o->ns || !o->self || !efs_meta_node_is_valid(o->self))
		return -EINVAL;
	d = efs_mem_calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->ref = efs_mem_calloc(1, sizeof(*d->ref));
	if (!d->ref) {
		efs_mem_free(d);
		return -ENOMEM;
	}
	d->ref->d = d;
	d->ref->refs = 1;
	efs_list_init(&d->waits);
	d->loop = loop;
	d->c = c;
	d->ns = *o->ns;
	snprintf(d->self, sizeof(d->self), "%s", o->self);
	d->grace_ns = (uint64_t)(o->grace_ms ? o->grace_ms : 60000) * 1000000ull;
	*ret = d;
	return 0;
}

struct efs_deaths *efs_deaths_free(struct efs_deaths *d)
{
	if (!d)
		return NULL;
	d->w = efs_etcd_watcher_free(d->w);
	d->ws = efs_etcd_watch_stream_free(d->ws);
	waits_run(d, true);
	d->ref->d = NULL;
	dref_put(d->ref);
	efs_mem_free(d->members);
	efs_mem_free(d->pending);
	efs_mem_free(d->marks);
	efs_mem_free(d);
	return NULL;
}
