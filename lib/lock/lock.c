/* SPDX-License-Identifier: Apache-2.0 */
#include "lock/lock.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "etcd/kv.h"
#include "etcd/txn.h"
#include "etcd/watch.h"
#include "lock/deaths.h"
#include "lock/heat.h"
#include "lock/lock-int.h"
#include "lock/locktab.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"

/*
 * How the etcd side works (the key layout is in docs/FORMAT.md section 4).
 *
 * Acquire of one inode I in mode M is one transaction:
 *   compares  the session guard (n/<node> on our lease, g/<node> as written)
 *   success   a nested transaction:
 *     compares  no conflicting holder: M = S: no key in l/<I>X...; M = X:
 *               no key in l/<I> except our own S key (an upgrade);
 *               no older recall key: no key in w/<I> at all, or, once we
 *               wait with our own recall key created at revision C, every
 *               key of w/<I> created at C or later (FIFO by commit order);
 *     success   [delete our S key (upgrade)], put l/<I><M><node>
 *               (LockHolder, on the session lease), [delete our recall
 *               key], range i/<I> (the record comes with the lock);
 *     failure   [put our recall key w/<I><seq><node> (LockWaiter, on the
 *               lease)], range l/<I>, range w/<I>, range i/<I>;
 *   failure   range n/<node> (the guard failed: the session is lost).
 * On a conflict we watch l/<I> and w/<I> for deletes only (puts never
 * clear a conflict) from the failed transaction's revision + 1, so no
 * release is missed, and retry at the first delete.
 *
 * Recall keys: |seq| is the highest etcd revision this node has read (the
 * "revision-ordered counter the waiter read" of FORMAT.md), so keys list
 * roughly in arrival order; the order that counts is the recall key's
 * create_revision, which etcd assigns in commit order, compared as above.
 * One acquisition keeps its seq across retries, so a retry after an
 * unknown outcome overwrites its own key (same name, same create
 * revision) instead of queueing behind itself.
 *
 * Unknown outcomes: a retried transaction finds our own holder key in the
 * failure branch's holder range (on our lease) and adopts it.
 *
 * Several inodes (n > 1 not yet held): one transaction for all of them,
 * all or nothing, with no recall keys; when it fails, they are taken one
 * by one in inode order, waiting as needed. Ordered acquisition cannot
 * deadlock among acquirers; a holder that keeps a lock pinned while it
 * waits for a higher inode delays recalls of the lower one only until
 * that wait ends.
 *
 * Recall: peers ask for a lock by putting a recall key; every node watches
 * w/ and, when a key of another node asks for a lock it holds, calls
 * efs_lock_release_now (see "Recall" below), which waits for the pins,
 * runs the lock's ops and releases; a node never recalls from itself.
 *
 * Upgrades: an upgrade S -> X is first tried in place (the S key deleted
 * and the X key put in one transaction). When another holder blocks it,
 * both nodes could hold S and wait for each other forever; so a blocked
 * upgrade marks the entry draining (no new local cache hits), waits for
 * the entry's pins to go and the kernel caches granted under S to expire,
 * and then yields: its next attempts delete our S key in both branches
 * (compared as an upgrade, so a leftover S key of ours never blocks us),
 * and the failure branch queues our recall key in the same transaction.
 * Among yielding nodes the oldest recall key wins, as for any waiter.
 */

/*
 * Cleanups (every one a transaction carrying the session guard):
 *   recall   deletes our recall key w/<I><seq><node> once the acquisition
 *            that put it is done with it;
 *   settle   ends an acquisition that failed (cancelled, timed out, an
 *            error) after one of its transactions had an unknown outcome:
 *            the holder key it put may have committed. With no lock held
 *            before, it deletes both of our holder keys of I; after an
 *            upgrade from shared, if our exclusive key exists it deletes
 *            it and puts the shared one back (what the table holds). The
 *            entry stays busy (ACQUIRING, owned by the cleanup) meanwhile,
 *            so no other acquisition of this node touches those keys.
 * A cleanup that cannot be sent or answered (the session not ACTIVE, a
 * transient error, an unknown outcome: both are idempotent) is sent again
 * from the retry timer; it is dropped once the session is replaced or
 * closed, since its keys went with the lease.
 */
enum cleanup_kind {
	CL_NONE = 0,
	CL_RECALL,
	CL_SETTLE,
	CL_GIVE_BACK,
};

/* Retry delay after a transient etcd error. */
#define RETRY_MS 50
/* The idle-release timer period bounds. */
#define TICK_MIN_MS 20
#define TICK_MAX_MS 250

struct lref {
	struct efs_lockcache *lc;
	unsigned refs;
};

enum acq_wait {
	AW_KICK = 0, /* runs at the next kick */
	AW_SESSION,  /* waits for the session */
	AW_ENTRY,    /* waits for another local acquisition or a release */
	AW_TXN,	     /* a transaction is in flight */
	AW_WATCH,    /* waits for a conflicting holder or recall key to go */
	AW_BACKOFF,  /* retries after a transient error */
	AW_DONE,     /* finished with 0: holds pins until efs_lock_put */
};

struct acq {
	struct efs_lock_req *req;
	struct efs_lockcache *lc;
	struct efs_list link; /* lc->acqs */
	enum acq_wait wait;
	bool cancelled;
	bool batch_tried;
	unsigned pass; /* kick pass it was queued for */
	/* The batch in flight: request indices, and which were upgrades. */
	size_t batch[EFS_LOCK_REQ_MAX];
	bool batch_up[EFS_LOCK_REQ_MAX];
	size_t batch_n;
	uint64_t gen; /* session generation the acquisition works under */
	size_t order[EFS_LOCK_REQ_MAX];
	bool dup[EFS_LOCK_REQ_MAX];			 /* same inode as an earlier index */
	enum efs_lock_mode want[EFS_LOCK_REQ_MAX];	 /* merged over duplicates */
	struct efs_locktab_entry *pinned[EFS_LOCK_REQ_MAX];
	Etcdserverpb__TxnResponse *resps[EFS_LOCK_REQ_MAX]; /* keep recs alive */
	size_t n_resps;
	/* The one-by-one acquisition in progress. */
	size_t cur;	     /* request index */
	uint64_t recall_seq; /* 0: none chosen yet */
	int64_t recall_rev;  /* create revision of our recall key (0: unknown) */
	uint64_t recall_ns;  /* when we learnt that our recall key exists (0: not yet) */
	bool counted_wait;
	uint64_t wait_deadline_ns;
	bool up_blocked; /* the upgrade of |cur| found another holder */
	bool yielding;	 /* ... and gives our shared hold of |cur| up */
	/* Our shared holder key of |cur| exists while the table holds
	 * nothing (a release granted it to a wait of ours that had ended,
	 * and this acquisition took the entry before the give-back): the
	 * next attempt deletes it in both branches, as a yielding upgrade
	 * does, or the exclusive wait would wait behind our own key. */
	bool stray_shared;
	struct efs_locktab_entry *blocked_on; /* AW_ENTRY: compared, never used */
	/* It waits for another acquisition or a release of this node, with
	 * no recall key of its own: it gives way to any recall of its pins. */
	bool local_wait;
	/* A lock it pinned was recalled while it still waited for another:
	 * it gives every pin up (yield_asked) and then waits for the release
	 * of |yield_ino| before it takes that lock again, drain or not. */
	uint64_t yield_ino;
	bool yield_asked;
	/* Per request index: the mode an attempt with an unknown outcome may
	 * have put a holder key for (NONE: no doubt). */
	enum efs_lock_mode doubt[EFS_LOCK_REQ_MAX];
	struct efs_etcd_watcher *wl, *ww;
	struct efs_session_waiter sw;
};

/* Argument of one etcd call. */
struct lcall {
	struct lref *ref;
	struct acq *acq; /* NULL for releases */
	uint64_t gen;
	bool batch;
	/* Response layout of a single acquire. */
	size_t s_rec; /* success: index of the i/ range */
	size_t f_l, f_w, f_i;
	bool up_plain; /* an in-place upgrade attempt (not yielding) */
	/* Accepting a direct grant: the mode of the holder key a release put
	 * for us (the transaction only reads the record). */
	bool accept;
	enum efs_lock_mode acc_mode;
	/* Cleanups (kind != CL_NONE), listed in lc->cleanups until ended. */
	enum cleanup_kind kind;
	bool waiting;		 /* to be sent again from the retry timer */
	unsigned c_pass;	 /* retry pass that last tried it */
	uint64_t c_ino;
	uint64_t c_seq;		 /* CL_RECALL: the recall key's seq */
	enum efs_lock_mode keep; /* CL_SETTLE: NONE or SHARED (after an upgrade);
				  * CL_GIVE_BACK: the mode of the key */
	int64_t c_rev;		 /* CL_GIVE_BACK: the key's create revision */
	struct lcall *c_next;
	/* Releases. */
	bool no_grant; /* sent again without direct grants (after an error) */
	size_t n;
	uint64_t ino[];
};

/* A caller of efs_lock_release_now. */
struct rwait {
	uint64_t ino;
	enum efs_lock_mode to;
	int status; /* nonzero: ends with this (the session was lost) */
	uint64_t start_ns; /* mono time of the request */
	efs_lock_release_cb cb;
	void *arg;
	struct efs_list link; /* lc->rwaiters */
};

static struct rwait *rwait_of(struct efs_list *n)
{
	return efs_list_entry(n, struct rwait, link);
}

/* The ops preparation (invalidate, then sync) of one lock's release. */
struct prep {
	struct lref *ref;
	uint64_t ino;
	uint64_t grant; /* the hold it prepares the release of */
	enum efs_lock_mode to;
	bool inval; /* run the invalidate op (else only sync) */
	int step;   /* 0: invalidate next, 1: sync next, 2: done */
};

struct efs_lockcache {
	uv_loop_t *loop;
	efs_lock_recall_wait_cb recall_wait_cb; /* a recall wait ended in a grant */
	efs_lock_recall_wait_cb handover_cb;	/* a forced release completed */
	void *handover_arg;
	void *recall_wait_arg;
	struct efs_etcd *c;
	struct efs_session *s;
	struct lref *ref;
	struct efs_meta_ns ns;
	size_t max_cached;
	uint32_t idle_ms;
	size_t release_batch;
	uint32_t wait_timeout_ms;
	uint32_t recall_bound_ms;
	struct {
		const struct efs_lock_ops *ops;
		void *arg;
	} ops[EFS_LOCK_KINDS];
	efs_lock_kind_fn kind_fn;
	void *kind_arg;
	efs_lock_wanted_fn wanted_fn;
	void *wanted_arg;
	uint64_t grant_seq;	/* last grant id handed out */
	size_t n_draining;	/* entries with |draining| set */
	struct efs_list rwaiters; /* efs_lock_release_now callers (rwait.link), newest first */
	uv_timer_t *rwake;	/* ends the waits of rwaiters that are satisfied */

	struct efs_locktab tab;
	uint64_t gen; /* session generation the table belongs to */
	struct efs_list acqs; /* acquisitions (acq.link) */
	uv_timer_t *tick;
	uv_timer_t *kick;
	uv_timer_t *retry;
	struct efs_etcd_watch_stream *ws;
	int64_t last_rev;    /* highest header revision seen */
	uint64_t token_seq;
	unsigned pass;
	uint64_t period_ms; /* tick period */
	struct lcall *rel_retry; /* a release to send again */
	bool releasing;	     /* a release transaction is in flight */
	bool release_all;
	struct lcall *cleanups; /* in flight or waiting */
	unsigned cpass;
	void (*release_all_done)(int status, void *arg);
	void *release_all_arg;
	struct efs_lockcache_stats stats;
	/* Recall keys of other nodes (struct recall), kept current by one
	 * prefix watch on w/ (|rw|) after one listing (|rw_listing|). */
	struct efs_list recalls;
	uint64_t recalls_due_ns; /* recalls_check has work then (UINT64_MAX: none) */
	struct efs_etcd_watcher *rw;
	bool rw_listing;
	bool recall_off; /* test switch: recall keys are not answered */
	bool grant_off;	 /* test switch: releases grant to no waiter */
	struct efs_deaths *deaths; /* peers' session ends (copy-on-write after takeover) */
	struct efs_heat heat;	   /* recall history: minimum holds, contention */
	uv_timer_t *hold_timer;	   /* recalls waiting for a minimum hold, again */
	uv_timer_t *yield_timer;   /* blocked upgrades whose kernel caches time out */
	uint64_t yield_due_ns;	   /* ... then (UINT64_MAX: none waits) */
	uint64_t hold_due_ns;	   /* ... at this time (UINT64_MAX: none waits) */
};

static struct acq *acq_of(struct efs_list *n)
{
	return efs_list_entry(n, struct acq, link);
}

static void kick_soon(struct efs_lockcache *lc);
static void release_start(struct efs_lockcache *lc);
static void tick_cb(uv_timer_t *t);
static void rwake_soon(struct efs_lockcache *lc);
static void cleanup_start(struct efs_lockcache *lc, struct lcall *k);
static void cleanup_retry(struct efs_lockcache *lc, struct lcall *k);
static int put_holder(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
		      enum efs_lock_mode m, uint64_t *ret_token);
static void recall_apply(struct efs_lockcache *lc, uint64_t ino);
static void recall_watch_start(struct efs_lockcache *lc);

/* ---- Small helpers ---- */

static struct lref *lref_get(struct lref *r)
{
	r->refs++;
	return r;
}

static struct efs_lockcache *lref_put(struct lref *r)
{
	struct efs_lockcache *lc = r->lc;

	if (--r->refs == 0)
		efs_mem_free(r);
	return lc;
}

static struct lcall *lcall_new(struct efs_lockcache *lc, struct acq *a, size_t n)
{
	struct lcall *k = efs_mem_calloc(1, sizeof(*k) + n * sizeof(uint64_t));

	if (!k)
		return NULL;
	k->ref = lref_get(lc->ref);
	k->acq = a;
	k->gen = lc->gen;
	k->n = n;
	return k;
}

static struct efs_lockcache *lcall_end(struct lcall *k)
{
	struct efs_lockcache *lc = lref_put(k->ref);

	efs_mem_free(k);
	return lc;
}

static int meta_mode(enum efs_lock_mode m)
{
	return m == EFS_LOCK_EXCLUSIVE ? EFS_META_LOCK_EXCLUSIVE : EFS_META_LOCK_SHARED;
}

static uint64_t now_ns(void)
{
	return efs_clock_mono_ns();
}

static void note_rev(struct efs_lockcache *lc, const Etcdserverpb__ResponseHeader *h)
{
	if (h && h->revision > lc->last_rev)
		lc->last_rev = h->revision;
}

static bool is_transient(int err)
{
	return err == -ETIMEDOUT || err == -EAGAIN || err == -ENOTCONN || err == -ECONNRESET ||
	       err == -ECONNREFUSED || err == -EHOSTUNREACH || err == -ENETUNREACH ||
	       err == -EPIPE;
}

/* |e| starts a new continuous hold: caches of the old grant are void. */
static void new_grant(struct efs_lockcache *lc, struct efs_locktab_entry *e)
{
	e->grant = ++lc->grant_seq;
	e->granted_ns = now_ns();
	e->heat_noted = false;
	e->hold_deferred = false;
	e->prepared = false;
	e->voided_ns = 0;
	e->recalled = false;
	e->inval_serving = false;
	e->prep_keeps = false;
}

/* The ops of |e|'s kind: a kind set on the entry wins over the classifier. */
static unsigned kind_of(const struct efs_lockcache *lc, const struct efs_locktab_entry *e)
{
	unsigned k = e->kind;

	if (k == 0 && lc->kind_fn) {
		k = lc->kind_fn(lc->kind_arg, e->ino);
		if (k >= EFS_LOCK_KINDS)
			k = 0;
	}
	return k;
}

/* Whether a cache hit on |e| may serve |a| (|e| holds the mode wanted):
 * not while an upgrade drains it, and while a forced release drains it
 * only for writeback and for acquisitions that pin other locks already. */
static bool drain_exempt(const struct acq *a)
{
	if (a->req->flags & (EFS_LOCK_F_WRITEBACK | EFS_LOCK_F_NESTED | EFS_LOCK_F_PAGES))
		return true;
	for (size_t i = 0; i < a->req->n; i++)
		if (a->pinned[i])
			return true;
	return false;
}

static bool hit_ok(const struct acq *a, const struct efs_locktab_entry *e)
{
	return e->state != EFS_LOCKTAB_RELEASING && !e->draining &&
	       (!e->recalled || e->inval_serving || drain_exempt(a));
}

static void set_draining(struct efs_lockcache *lc, struct efs_locktab_entry *e, bool on)
{
	if (e->draining == on)
		return;
	e->draining = on;
	if (on)
		lc->n_draining++;
	else
		lc->n_draining--;
}

/* A blocked upgrade may give its shared hold up: no operation is in
 * flight under it and the kernel caches it granted have expired. */
static bool yieldable(const struct efs_locktab_entry *e, uint64_t now)
{
	return e->pins == 0 && e->kcache_until_ns <= now;
}

/* Runs the tick (releases, forced releases, blocked upgrades) soon. */
static void release_kick(struct efs_lockcache *lc)
{
	if (lc->tick)
		uv_timer_start(lc->tick, tick_cb, 0, lc->period_ms);
}

static void yield_timer_cb(uv_timer_t *t)
{
	struct efs_lockcache *lc = t->data;

	if (!lc)
		return;
	lc->yield_due_ns = UINT64_MAX;
	release_kick(lc);
}

/*
 * An upgrade of |e| is blocked by another holder. Its shared hold goes
 * once the kernel caches granted under it time out (they cannot be
 * invalidated: the kernel holds the directory's lock across the very
 * request that waits for the upgrade), so the tick is run right then,
 * not up to a period later; and |e| counts as contended for a while, so
 * that the kernel caches nothing more under it and the next handover
 * does not wait at all.
 */
static void yield_wake(struct efs_lockcache *lc, const struct efs_locktab_entry *e)
{
	uint64_t now = now_ns();
	uint64_t due = e->kcache_until_ns;

	if (due <= now)
		return;
	efs_heat_mark_contended(&lc->heat, e->ino, now);
	if (due >= lc->yield_due_ns)
		return;
	lc->yield_due_ns = due;
	uv_timer_start(lc->yield_timer, yield_timer_cb,
		       (due - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC, 0);
}

/* Acquisitions blocked on |e| (or on anything, e == NULL) run again. */
static void entry_changed(struct efs_lockcache *lc, const struct efs_locktab_entry *e)
{
	struct efs_list *n;

	efs_list_for_each(n, &lc->acqs) {
		struct acq *a = acq_of(n);

		if (a->wait == AW_ENTRY && (!e || a->blocked_on == e)) {
			a->blocked_on = NULL;
			a->wait = AW_KICK;
			kick_soon(lc);
		}
	}
}

static void remove_entry(struct efs_lockcache *lc, struct efs_locktab_entry *e)
{
	struct acq *owner = e->owner;

	/* An acquisition waiting on a watch for the entry tries again: it
	 * re-reads the keys rather than wait for events that may never come. */
	if (owner && owner->wait == AW_WATCH) {
		owner->wait = AW_KICK;
		kick_soon(lc);
	}
	entry_changed(lc, e);
	set_draining(lc, e, false);
	efs_locktab_remove(&lc->tab, e);
	rwake_soon(lc);
}

/*
 * The session was replaced (GONE, then registered anew) since the table
 * was filled: every holder key went with the old lease.
 */
static void check_generation(struct efs_lockcache *lc)
{
	uint64_t g = efs_session_generation(lc->s);

	if (g != lc->gen) {
		if (lc->gen)
			efs_lockcache_forget_all(lc);
		lc->gen = g;
	}
}

/* ---- Watchers ---- */

static void watchers_free(struct acq *a)
{
	a->wl = efs_etcd_watcher_free(a->wl);
	a->ww = efs_etcd_watcher_free(a->ww);
}

static int accept_start(struct acq *a, enum efs_lock_mode mode, int64_t rev);

/*
 * What event |ev| on l/<I> or w/<I> means to |a|, waiting for request
 * index |cur|: 1, a release granted us the lock (the put of our holder
 * key, on our lease, after our recall key: *|ret_mode|, *|ret_rev|); 0, a
 * delete that may end the conflict (try again); -1, nothing (another
 * node's put never clears a conflict; our own recall key is deleted only
 * by the grant, whose put of our holder key the other watch brings, or
 * with our lease, which the session handles).
 */
static int watch_event(const struct acq *a, const Mvccpb__Event *ev, enum efs_lock_mode *ret_mode,
		       int64_t *ret_rev)
{
	struct efs_lockcache *lc = a->lc;
	const Mvccpb__KeyValue *kv = ev->kv;
	struct efs_meta_key_info ki;
	bool put = ev->type == MVCCPB__EVENT__EVENT_TYPE__PUT;
	bool ours;

	if (!kv || efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0)
		return put ? -1 : 0;
	ours = strcmp(ki.node, efs_session_node(lc->s)) == 0;
	if (!put)
		return ki.family == EFS_META_K_RECALL && ours && ki.num == a->recall_seq ? -1 : 0;
	if (ki.family != EFS_META_K_HOLDER || !ours || a->recall_rev <= 0 ||
	    kv->lease != efs_session_lease_id(lc->s) || kv->create_revision <= a->recall_rev)
		return -1;
	*ret_mode = ki.mode == EFS_META_LOCK_EXCLUSIVE ? EFS_LOCK_EXCLUSIVE : EFS_LOCK_SHARED;
	*ret_rev = kv->create_revision;
	return *ret_mode >= a->want[a->cur] ? 1 : -1;
}

static void watch_cb(struct efs_etcd_watcher *w, int status, const struct efs_etcd_watch_update *u,
		     void *arg)
{
	struct acq *a = arg;
	enum efs_lock_mode mode = EFS_LOCK_NONE;
	int64_t rev = 0;
	bool again = u->kind != EFS_ETCD_WATCH_EVENTS;

	(void)w;
	(void)status;
	/* After a delete the watchers stay until the retry runs (acq_step
	 * frees them): the put of our holder key by the same transaction may
	 * come on the other watcher right after, and is then taken instead. */
	if (a->wait != AW_WATCH && !(a->wait == AW_KICK && (a->wl || a->ww)))
		return;
	if (u->kind == EFS_ETCD_WATCH_CREATED || u->kind == EFS_ETCD_WATCH_PROGRESS)
		return;
	for (size_t i = 0; i < u->n_events && mode == EFS_LOCK_NONE; i++) {
		int v = watch_event(a, u->events[i], &mode, &rev);

		if (v == 0)
			again = true;
		else if (v < 0)
			mode = EFS_LOCK_NONE;
	}
	if (!again && mode == EFS_LOCK_NONE)
		return;
	if (mode == EFS_LOCK_NONE && u->kind == EFS_ETCD_WATCH_EVENTS) {
		/* A delete: try again at the next kick. */
		a->wait = AW_KICK;
		kick_soon(a->lc);
		return;
	}
	/* Our grant, or the watch ended: accept, or try again (a new watch
	 * follows a failure). Freeing our own watcher from its callback is
	 * allowed. */
	watchers_free(a);
	a->wait = AW_KICK;
	if (mode != EFS_LOCK_NONE) {
		/* From now on a failing end settles the key granted to us. */
		a->doubt[a->cur] = mode;
		if (accept_start(a, mode, rev) == 0)
			return;
		a->wait = AW_KICK; /* its next transaction finds the key ours */
	}
	kick_soon(a->lc);
}

int efs_lock__watch_range(struct efs_etcd *c, struct efs_etcd_watch_stream **ws,
			  const struct efs_meta_range *rg, int64_t from, bool no_put,
			  efs_etcd_watch_cb cb, void *arg, struct efs_etcd_watcher **ret)
{
	struct efs_etcd_watch_opts o = {
		.key = rg->key.buf,
		.key_len = rg->key.len,
		.range_end = rg->end.buf,
		.range_end_len = rg->end.len,
		.start_revision = from,
		.no_put = no_put,
	};
	int r;

	if (!*ws) {
		r = efs_etcd_watch_stream_new(ws, c, EFS_ETCD_CH_PRIO);
		if (r < 0)
			return r;
	}
	return efs_etcd_watcher_new(ret, *ws, &o, cb, arg);
}

static int watch_range(struct acq *a, const struct efs_meta_range *rg, int64_t from, bool no_put,
		       struct efs_etcd_watcher **ret)
{
	return efs_lock__watch_range(a->lc->c, &a->lc->ws, rg, from, no_put, watch_cb, a, ret);
}

/* ---- Finishing ---- */

static void acq_release_resources(struct acq *a, bool unpin)
{
	struct efs_lockcache *lc = a->lc;
	uint64_t now = now_ns();

	watchers_free(a);
	efs_session_wait_cancel(lc->s, &a->sw);
	for (size_t i = 0; i < EFS_LOCK_REQ_MAX; i++) {
		if (unpin && a->pinned[i])
			efs_locktab_unpin(&lc->tab, a->pinned[i], now);
		a->pinned[i] = NULL;
		a->req->recs[i] = NULL;
	}
	for (size_t i = 0; i < a->n_resps; i++)
		protobuf_c_message_free_unpacked(&a->resps[i]->base, efs_mem_protobuf());
	a->n_resps = 0;
}

/* Deletes our recall key of the current inode, if we may have put one. */
static void recall_drop(struct acq *a)
{
	struct efs_lockcache *lc = a->lc;
	struct lcall *k;

	if (!a->recall_seq)
		return;
	k = lcall_new(lc, NULL, 0);
	if (k) {
		k->kind = CL_RECALL;
		k->c_ino = a->req->ino[a->cur];
		k->c_seq = a->recall_seq;
		cleanup_start(lc, k);
	} else {
		efs_log_err("lock: no memory to delete the recall key of inode %" PRIu64
			    ": it stays until the session ends",
			    a->req->ino[a->cur]);
	}
	a->recall_seq = 0;
	a->recall_rev = 0;
	a->recall_ns = 0;
}

/* Entries this acquisition made busy go back to what they were. */
static void revert_busy(struct acq *a)
{
	struct efs_lockcache *lc = a->lc;

	for (size_t i = 0; i < a->req->n; i++) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, a->req->ino[i]);

		if (!e || e->owner != a || e->state != EFS_LOCKTAB_ACQUIRING)
			continue;
		e->owner = NULL;
		set_draining(lc, e, false);
		if (e->mode == EFS_LOCK_NONE) {
			remove_entry(lc, e);
		} else {
			e->state = EFS_LOCKTAB_HELD;
			entry_changed(lc, e);
		}
	}
}

/*
 * A failing acquisition whose attempts had unknown outcomes: settle each
 * inode whose holder key may have been put (see cleanups above), unless
 * another acquisition or a held entry of this node accounts for it now.
 */
static void settle_doubts(struct acq *a)
{
	struct efs_lockcache *lc = a->lc;

	for (size_t i = 0; i < a->req->n; i++) {
		uint64_t ino = a->req->ino[i];
		struct efs_locktab_entry *e;
		struct lcall *k;

		if (a->doubt[i] == EFS_LOCK_NONE)
			continue;
		a->doubt[i] = EFS_LOCK_NONE;
		e = efs_locktab_find(&lc->tab, ino);
		if (e && e->owner != a)
			continue; /* its own transactions read our holder keys */
		k = lcall_new(lc, NULL, 0);
		if (k && !e && efs_locktab_add(&lc->tab, ino, now_ns(), &e) < 0) {
			lcall_end(k);
			k = NULL;
		}
		if (!k) {
			efs_log_err("lock: no memory to settle the holder key of inode %" PRIu64
				    ": it may stay until the session ends",
				    ino);
			continue;
		}
		k->kind = CL_SETTLE;
		k->c_ino = ino;
		k->keep = e->mode == EFS_LOCK_SHARED ? EFS_LOCK_SHARED : EFS_LOCK_NONE;
		e->mode = k->keep;
		e->state = EFS_LOCKTAB_ACQUIRING;
		e->owner = k;
		cleanup_start(lc, k);
	}
}

/*
 * Ends an acquisition: the callback runs now (we are always in a callback
 * of our own here, never inside efs_lock_acquire). Returns false when the
 * callback freed the lock cache.
 */
static bool acq_finish(struct acq *a, int status)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_lock_req *req = a->req;
	struct lref *r;

	if (status < 0) {
		settle_doubts(a);
		recall_drop(a);
		revert_busy(a);
		acq_release_resources(a, true);
		efs_list_del(&a->link);
		efs_mem_free(a);
		req->priv = NULL;
	} else {
		watchers_free(a);
		a->wait = AW_DONE;
		for (size_t i = 0; i < req->n; i++) {
			struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, req->ino[i]);

			req->grant[i] = e ? e->grant : 0;
		}
	}
	r = lref_get(lc->ref);
	req->cb(req, status);
	return lref_put(r) != NULL;
}

/* ---- Transactions ---- */

/*
 * Puts the holder key of |node| (session generation |gen|, on |lease|) for
 * |ino| in mode |m|: this node's own, or a waiter's that a release grants
 * the lock to (the same key and record its own acquisition would put).
 */
static int holder_put(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
		      enum efs_lock_mode m, const char *node, uint64_t gen, int64_t lease,
		      uint64_t *ret_token)
{
	Etcfs__LockHolder h = ETCFS__LOCK_HOLDER__INIT;
	struct efs_meta_key k;
	int r;

	r = efs_meta_key_holder(&lc->ns, ino, meta_mode(m), node, &k);
	if (r < 0)
		return r;
	h.node = (char *)node;
	h.mode = (uint32_t)meta_mode(m);
	h.session_generation = gen;
	h.token = (efs_session_generation(lc->s) << 40) ^ ++lc->token_seq;
	h.lease_id = lease;
	h.granted_ns = (int64_t)efs_clock_real_ns();
	r = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &k, &h.base, h.lease_id);
	if (r == 0 && ret_token)
		*ret_token = h.token;
	return r;
}

static int put_holder(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
		      enum efs_lock_mode m, uint64_t *ret_token)
{
	return holder_put(lc, t, ino, m, efs_session_node(lc->s), efs_session_generation(lc->s),
			  efs_session_lease_id(lc->s), ret_token);
}

static int cmp_none(struct efs_etcd_txn *t, const void *key, size_t klen, const void *end,
		    size_t elen)
{
	struct efs_etcd_cmp c = {
		.target = EFS_ETCD_CMP_CREATE,
		.result = EFS_ETCD_CMP_EQUAL,
		.key = key,
		.key_len = klen,
		.range_end = end,
		.range_end_len = elen,
		.num = 0,
	};

	return efs_etcd_txn_compare_ex(t, &c);
}

/*
 * Adds the compares that no holder conflicts with taking |ino| in |want|
 * while this node holds |held| (NONE or SHARED).
 */
static int add_holder_compares(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
			       enum efs_lock_mode want, enum efs_lock_mode held)
{
	struct efs_meta_range all, xr;
	struct efs_meta_key mine;
	int r;

	if (want == EFS_LOCK_SHARED) {
		r = efs_meta_range_holders(&lc->ns, ino, EFS_META_LOCK_EXCLUSIVE, &xr);
		return r < 0 ? r : cmp_none(t, xr.key.buf, xr.key.len, xr.end.buf, xr.end.len);
	}
	r = efs_meta_range_ino(&lc->ns, EFS_META_K_HOLDER, ino, &all);
	if (r < 0)
		return r;
	if (held != EFS_LOCK_SHARED)
		return cmp_none(t, all.key.buf, all.key.len, all.end.buf, all.end.len);
	/* Upgrade: every holder but our own S key. */
	r = efs_meta_key_holder(&lc->ns, ino, EFS_META_LOCK_SHARED, efs_session_node(lc->s),
				&mine);
	if (r < 0)
		return r;
	r = cmp_none(t, all.key.buf, all.key.len, mine.buf, mine.len);
	if (r < 0)
		return r;
	if (mine.len + 1 > sizeof(mine.buf))
		return -ENAMETOOLONG;
	mine.buf[mine.len++] = '\0';
	return cmp_none(t, mine.buf, mine.len, all.end.buf, all.end.len);
}

static int add_recall_compare(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
			      int64_t own_rev)
{
	struct efs_meta_range w;
	struct efs_etcd_cmp c = {.target = EFS_ETCD_CMP_CREATE};
	int r;

	r = efs_meta_range_ino(&lc->ns, EFS_META_K_RECALL, ino, &w);
	if (r < 0)
		return r;
	if (!own_rev)
		return cmp_none(t, w.key.buf, w.key.len, w.end.buf, w.end.len);
	c.result = EFS_ETCD_CMP_GREATER;
	c.key = w.key.buf;
	c.key_len = w.key.len;
	c.range_end = w.end.buf;
	c.range_end_len = w.end.len;
	c.num = own_rev - 1;
	return efs_etcd_txn_compare_ex(t, &c);
}

static size_t n_ops(struct efs_etcd_txn *t, enum efs_etcd_txn_branch b)
{
	Etcdserverpb__TxnRequest *req = efs_etcd_txn_request(t);

	return b == EFS_ETCD_TXN_SUCCESS ? req->n_success : req->n_failure;
}

static int add_range(struct efs_etcd_txn *t, enum efs_etcd_txn_branch b,
		     const struct efs_meta_range *rg)
{
	return efs_etcd_txn_range(t, b, rg->key.buf, rg->key.len, rg->end.buf, rg->end.len);
}

static int add_inode_range(struct efs_lockcache *lc, struct efs_etcd_txn *t,
			   enum efs_etcd_txn_branch b, uint64_t ino)
{
	struct efs_meta_key k;
	int r = efs_meta_key_inode(&lc->ns, ino, &k);

	return r < 0 ? r : efs_etcd_txn_range(t, b, k.buf, k.len, NULL, 0);
}

/* The outer transaction: session guard, the failure branch reads n/<node>. */
static int outer_new(struct efs_lockcache *lc, struct efs_etcd_txn **ret,
		     struct efs_etcd_txn **ret_inner)
{
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key nk;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	r = efs_session_guard(lc->s, t);
	if (r == 0)
		r = efs_meta_key_node(&lc->ns, efs_session_node(lc->s), &nk);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, nk.buf, nk.len, NULL, 0);
	if (r == 0)
		r = efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, ret_inner);
	if (r < 0) {
		efs_etcd_txn_free(t);
		return r;
	}
	*ret = t;
	return 0;
}

static void acq_txn_done(struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp, void *arg);

static int send_txn(struct acq *a, struct efs_etcd_txn *t, struct lcall *k)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO};
	int r;

	r = efs_etcd_txn(lc->c, efs_etcd_txn_request(t), &co, acq_txn_done, k);
	if (r < 0)
		return r;
	a->wait = AW_TXN;
	return 0;
}

/* Marks |ino|'s entry busy for |a| (creating it when absent). */
static int entry_claim(struct acq *a, uint64_t ino, struct efs_locktab_entry **ret)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino);
	int r;

	if (!e) {
		r = efs_locktab_add(&lc->tab, ino, now_ns(), &e);
		if (r < 0)
			return r;
		e->mode = EFS_LOCK_NONE;
	}
	e->state = EFS_LOCKTAB_ACQUIRING;
	e->owner = a;
	*ret = e;
	return 0;
}

/* One transaction for every inode of |need| (all or nothing, no waiting). */
static int start_batch(struct acq *a, const size_t *need, size_t n_need)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_etcd_txn *t = NULL, *in = NULL;
	struct efs_meta_key sk;
	struct lcall *k;
	int r;

	k = lcall_new(lc, a, 0);
	if (!k)
		return -ENOMEM;
	k->batch = true;
	r = outer_new(lc, &t, &in);
	for (size_t j = 0; r == 0 && j < n_need; j++) {
		size_t i = need[j];
		uint64_t ino = a->req->ino[i];
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino);
		enum efs_lock_mode held = e ? (enum efs_lock_mode)e->mode : EFS_LOCK_NONE;

		r = add_holder_compares(lc, in, ino, a->want[i], held);
		if (r == 0)
			r = add_recall_compare(lc, in, ino, 0);
		if (r == 0 && held == EFS_LOCK_SHARED) {
			r = efs_meta_key_holder(&lc->ns, ino, EFS_META_LOCK_SHARED,
						efs_session_node(lc->s), &sk);
			if (r == 0)
				r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, sk.buf, sk.len,
							NULL, 0, false);
		}
		if (r == 0)
			r = put_holder(lc, in, ino, a->want[i], NULL);
		if (r == 0)
			r = add_inode_range(lc, in, EFS_ETCD_TXN_SUCCESS, ino);
		a->batch[j] = i;
		a->batch_up[j] = held == EFS_LOCK_SHARED;
	}
	a->batch_n = n_need;
	if (r == 0) {
		for (size_t j = 0; r == 0 && j < n_need; j++) {
			struct efs_locktab_entry *e;

			r = entry_claim(a, a->req->ino[need[j]], &e);
		}
		if (r == 0)
			r = send_txn(a, t, k);
		if (r < 0)
			revert_busy(a);
	}
	efs_etcd_txn_free(t);
	if (r < 0)
		lcall_end(k);
	return r;
}

/* A delete of our recall key w/<ino><seq><node> is pending. */
static bool recall_pending(const struct efs_lockcache *lc, uint64_t ino, uint64_t seq)
{
	for (const struct lcall *c = lc->cleanups; c; c = c->c_next)
		if (c->kind == CL_RECALL && c->c_ino == ino && c->c_seq == seq)
			return true;
	return false;
}

/* Our holder key of |ino| granted after its wait ended is being deleted. */
static bool give_back_pending(const struct efs_lockcache *lc, uint64_t ino)
{
	for (const struct lcall *c = lc->cleanups; c; c = c->c_next)
		if (c->kind == CL_GIVE_BACK && c->c_ino == ino)
			return true;
	return false;
}

/* One transaction for request index |i| (may wait). */
static int start_single(struct acq *a, size_t i)
{
	struct efs_lockcache *lc = a->lc;
	uint64_t ino = a->req->ino[i];
	struct efs_etcd_txn *t = NULL, *in = NULL;
	struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino);
	enum efs_lock_mode held = e ? (enum efs_lock_mode)e->mode : EFS_LOCK_NONE;
	const char *node = efs_session_node(lc->s);
	struct efs_meta_range hr, wr;
	struct efs_meta_key sk, wk;
	struct lcall *k;
	int r;

	bool yield_now, yield;
	enum efs_lock_mode cmp;

	if (a->cur != i) {
		recall_drop(a);
		a->cur = i;
		a->counted_wait = false;
		a->wait_deadline_ns = 0;
		a->up_blocked = false;
		a->yielding = false;
		a->stray_shared = false;
	}
	/* A blocked upgrade gives its shared hold up once it can (see the
	 * top of this file); every attempt after that is compared as an
	 * upgrade and deletes our S key, which may or may not be there. */
	yield_now = held == EFS_LOCK_SHARED && a->up_blocked && !a->yielding &&
		    yieldable(e, now_ns());
	yield = a->yielding || yield_now || (a->stray_shared && held == EFS_LOCK_NONE);
	cmp = yield ? EFS_LOCK_SHARED : held;
	if (!a->recall_seq) {
		a->recall_seq = lc->last_rev > 0 ? (uint64_t)lc->last_rev : 1;
		/* Never the name of a recall key whose delete is pending: that
		 * delete would remove ours. */
		while (recall_pending(lc, ino, a->recall_seq))
			a->recall_seq++;
	}
	k = lcall_new(lc, a, 0);
	if (!k)
		return -ENOMEM;
	k->up_plain = held == EFS_LOCK_SHARED && !yield;
	r = outer_new(lc, &t, &in);
	if (r == 0)
		r = add_holder_compares(lc, in, ino, a->want[i], cmp);
	if (r == 0)
		r = add_recall_compare(lc, in, ino, a->recall_rev);
	/* Success branch. */
	if (r == 0 && cmp == EFS_LOCK_SHARED) {
		r = efs_meta_key_holder(&lc->ns, ino, EFS_META_LOCK_SHARED, node, &sk);
		if (r == 0)
			r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, sk.buf, sk.len, NULL, 0,
						false);
	}
	if (r == 0)
		r = put_holder(lc, in, ino, a->want[i], NULL);
	if (r == 0)
		r = efs_meta_key_recall(&lc->ns, ino, a->recall_seq, node, &wk);
	if (r == 0)
		r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, wk.buf, wk.len, NULL, 0, false);
	if (r == 0) {
		k->s_rec = n_ops(in, EFS_ETCD_TXN_SUCCESS);
		r = add_inode_range(lc, in, EFS_ETCD_TXN_SUCCESS, ino);
	}
	/* Failure branch. */
	if (r == 0 && yield)
		r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_FAILURE, sk.buf, sk.len, NULL, 0, false);
	if (r == 0) {
		Etcfs__LockWaiter w = ETCFS__LOCK_WAITER__INIT;

		w.node = (char *)node;
		w.mode = (uint32_t)meta_mode(a->want[i]);
		w.session_generation = efs_session_generation(lc->s);
		w.lease_id = efs_session_lease_id(lc->s);
		w.since_ns = (int64_t)efs_clock_real_ns();
		r = efs_meta_txn_put(in, EFS_ETCD_TXN_FAILURE, &wk, &w.base, w.lease_id);
	}
	if (r == 0)
		r = efs_meta_range_ino(&lc->ns, EFS_META_K_HOLDER, ino, &hr);
	if (r == 0)
		r = efs_meta_range_ino(&lc->ns, EFS_META_K_RECALL, ino, &wr);
	if (r == 0) {
		k->f_l = n_ops(in, EFS_ETCD_TXN_FAILURE);
		r = add_range(in, EFS_ETCD_TXN_FAILURE, &hr);
	}
	if (r == 0) {
		k->f_w = n_ops(in, EFS_ETCD_TXN_FAILURE);
		r = add_range(in, EFS_ETCD_TXN_FAILURE, &wr);
	}
	if (r == 0) {
		k->f_i = n_ops(in, EFS_ETCD_TXN_FAILURE);
		r = add_inode_range(lc, in, EFS_ETCD_TXN_FAILURE, ino);
	}
	if (r == 0) {
		r = entry_claim(a, ino, &e);
		if (r == 0)
			r = send_txn(a, t, k);
		if (r < 0)
			revert_busy(a);
	}
	if (r == 0 && yield_now) {
		/* From now on this node does not hold S: no hits, no guard.
		 * A failing end settles (deletes) whatever keys are left. */
		a->yielding = true;
		e->mode = EFS_LOCK_NONE;
		e->grant = 0;
		e->prepared = false;
		if (a->doubt[i] == EFS_LOCK_NONE)
			a->doubt[i] = EFS_LOCK_SHARED;
		lc->stats.upgrade_yields++;
	}
	efs_etcd_txn_free(t);
	if (r < 0)
		lcall_end(k);
	return r;
}

/* ---- The acquisition state machine ---- */

static void session_ready(struct efs_session_waiter *w, int status, bool generation_changed)
{
	struct acq *a = w->arg;

	(void)generation_changed;
	if (status < 0) {
		a->wait = AW_KICK;
		acq_finish(a, status);
		return;
	}
	a->wait = AW_KICK;
	kick_soon(a->lc);
}

/* Pins |e| for request index |i| and records the lock as used. */
/* Every pin goes through here: exclusive ones are counted apart. */
static void pin_mode(struct efs_lockcache *lc, struct efs_locktab_entry *e,
		     enum efs_lock_mode mode, uint64_t now)
{
	efs_locktab_pin(&lc->tab, e, now);
	if (mode == EFS_LOCK_EXCLUSIVE)
		e->xpin_seq++;
}

static void pin_for(struct acq *a, size_t i, struct efs_locktab_entry *e)
{
	pin_mode(a->lc, e, a->req->mode[i], now_ns());
	a->pinned[i] = e;
}

/*
 * Whether the operations that pinned |e| since its preparation began left
 * it prepared. For a downgrade to shared only exclusive ones count: what a
 * shared operation caches or reads (pages, attributes) stays valid under
 * the shared lock kept, so a reader on this node never makes the
 * downgrade invalidate again; and each invalidation it would repeat
 * bumps the kernel's attribute version, which makes the kernel drop the
 * attributes that reader's own requests fetch (a read then stops at a
 * size the kernel cached before).
 */
static bool pins_kept_prep(const struct efs_locktab_entry *e)
{
	if (e->prep_to == EFS_LOCK_SHARED)
		return e->xpin_seq == e->prep_xseq;
	return e->pin_seq == e->prep_seq;
}

/* The lowest mode a forced release of |ino| asks for (EXCLUSIVE: none). */
static enum efs_lock_mode forced_target(const struct efs_lockcache *lc, uint64_t ino)
{
	enum efs_lock_mode to = EFS_LOCK_EXCLUSIVE;
	const struct efs_list *n;

	efs_list_for_each(n, &lc->rwaiters) {
		const struct rwait *w = efs_list_entry(n, struct rwait, link);

		if (w->ino == ino && w->to < to)
			to = w->to;
	}
	return to;
}

/* The lowest mode a forced release of |ino| asks for (NONE when none). */
static enum efs_lock_mode forced_to(const struct efs_lockcache *lc, uint64_t ino)
{
	enum efs_lock_mode to = forced_target(lc, ino);

	return to == EFS_LOCK_EXCLUSIVE ? EFS_LOCK_NONE : to;
}

static int64_t oldest_recall_rev(const struct efs_lockcache *lc, uint64_t ino);

/*
 * A lock |a| pins that it must give up: a peer recalls it, and that peer
 * began waiting (its recall key was created) before |a| began waiting for
 * the lock it wants next. Its inode, or 0. Only the younger of two
 * waiters gives way, so that two nodes never take turns giving way to
 * each other.
 */
static uint64_t pinned_recalled(const struct acq *a)
{
	bool any = a->local_wait && a->recall_rev <= 0;

	if (a->recall_rev <= 0 && !any)
		return 0; /* not waiting (yet) */
	for (size_t i = 0; i < a->req->n; i++) {
		const struct efs_locktab_entry *e = a->pinned[i];
		int64_t rev;

		if (!e || !e->recalled)
			continue;
		/* Waiting for its own node only, it has no turn to keep:
		 * what it waits for may itself wait for the recalling peer. */
		if (any)
			return e->ino;
		rev = oldest_recall_rev(a->lc, e->ino);
		if (rev > 0 && rev < a->recall_rev)
			return e->ino;
	}
	return 0;
}

/*
 * Ends what |a| waits for (session, watch, a local entry) so that its next
 * step runs soon, from the loop. Not while a transaction is in flight: its
 * answer runs the next step.
 */
static void acq_wake(struct efs_lockcache *lc, struct acq *a)
{
	switch (a->wait) {
	case AW_TXN:
		return;
	case AW_SESSION:
		efs_session_wait_cancel(lc->s, &a->sw);
		break;
	case AW_WATCH:
		watchers_free(a);
		break;
	case AW_ENTRY:
		a->blocked_on = NULL;
		break;
	default:
		break;
	}
	a->wait = AW_KICK;
	kick_soon(lc);
}

/* Whether |a| pins |e|. */
static bool acq_pins(const struct acq *a, const struct efs_locktab_entry *e)
{
	for (size_t i = 0; i < a->req->n; i++)
		if (a->pinned[i] == e)
			return true;
	return false;
}

/*
 * |e| is being recalled: every acquisition still in progress that pins it
 * gives way at its next step (at once unless a transaction is in flight),
 * since it may wait for a lock the recalling node holds. Runs when |e|
 * becomes recalled (recall_mark) and when another recall of it arrives
 * (one older than those known may now pass pinned_recalled); an
 * acquisition that starts waiting with such a pin, or gets its own recall
 * key, asks pinned_recalled itself (acq_step, single_done).
 */
static void yield_scan(struct efs_lockcache *lc, const struct efs_locktab_entry *e)
{
	struct efs_list *n;

	efs_list_for_each(n, &lc->acqs) {
		struct acq *a = acq_of(n);

		if (a->wait == AW_DONE || a->yield_asked)
			continue;
		if (!acq_pins(a, e) || pinned_recalled(a) == 0)
			continue;
		a->yield_asked = true;
		acq_wake(lc, a);
	}
}

/*
 * A forced release of |e| below the mode it holds is asked for: |e| is
 * drained from this moment (see Forced releases in lock.h), not from the
 * release's next attempt, which waits while another release transaction
 * is in flight. So every reply from now on carries zero kernel timeouts
 * (efs_lock_may_cache), no change is deferred under it (efs_lock_touch),
 * and acquisitions that pin it while they wait for another lock give way.
 * An entry being upgraded (ACQUIRING) is drained too: it is still held.
 */
static void recall_mark(struct efs_lockcache *lc, struct efs_locktab_entry *e)
{
	if (e->recalled || (e->state != EFS_LOCKTAB_HELD && e->state != EFS_LOCKTAB_ACQUIRING) ||
	    e->mode <= (int)forced_target(lc, e->ino))
		return;
	e->recalled = true;
	yield_scan(lc, e);
}

static bool acq_step(struct acq *a);

/*
 * A lock |a| pins (that of |ino|) is recalled while |a| still waits for
 * others: it gives every pin and its recall key up, so that the recall is
 * answered, and starts again in inode order once that release is done
 * (the lock is then taken anew, drain or not). With EFS_LOCK_F_RESTART it
 * ends with -EAGAIN instead, for a caller that must drop what it holds
 * too. Returns false when a callback freed the lock cache.
 */
static bool acq_yield(struct acq *a, uint64_t ino)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_lock_req *req = a->req;

	a->yield_asked = false;
	lc->stats.acq_yields++;
	efs_log_debug("lock: inode %" PRIu64 ": recalled while its acquisition waits for "
		      "others: every pin given up",
		      ino);
	if (req->flags & EFS_LOCK_F_RESTART) {
		req->yield_ino = ino;
		req->yield_to = forced_to(lc, ino);
		return acq_finish(a, -EAGAIN);
	}
	recall_drop(a);
	revert_busy(a);
	acq_release_resources(a, true); /* watchers, pins, kept records */
	a->cur = SIZE_MAX;
	a->up_blocked = false;
	a->yielding = false;
	a->yield_ino = ino;
	a->wait = AW_KICK;
	release_kick(lc);
	kick_soon(lc);
	return true;
}

/*
 * Takes the next step of |a|. Returns false when a callback freed the lock
 * cache. Runs only from the loop (kick, etcd and watch callbacks).
 */
static bool acq_step(struct acq *a)
{
	struct efs_lockcache *lc = a->lc;
	size_t need[EFS_LOCK_REQ_MAX], n_need = 0;
	int r;

	watchers_free(a); /* kept after a delete woke it (watch_cb) */
	if (a->cancelled)
		return acq_finish(a, -EINTR);
	if (!efs_session_is_active(lc->s)) {
		if (a->req->flags & EFS_LOCK_F_TRY)
			return acq_finish(a, -EWOULDBLOCK);
		r = efs_session_wait(lc->s, &a->sw, session_ready, a);
		if (r == 0) {
			a->wait = AW_SESSION;
			return true;
		}
		if (r < 0)
			return acq_finish(a, r);
	}
	check_generation(lc);
	if (a->gen != lc->gen) {
		/* The session was replaced: pins on forgotten locks are void
		 * and any recall key went with the old lease. */
		for (size_t i = 0; i < a->req->n; i++) {
			if (a->pinned[i]) {
				efs_locktab_unpin(&lc->tab, a->pinned[i], now_ns());
				a->pinned[i] = NULL;
			}
			a->req->recs[i] = NULL;
		}
		for (size_t i = 0; i < a->n_resps; i++)
			protobuf_c_message_free_unpacked(&a->resps[i]->base, efs_mem_protobuf());
		a->n_resps = 0;
		a->batch_tried = false;
		a->recall_seq = 0;
		a->recall_rev = 0;
		a->recall_ns = 0;
		for (size_t i = 0; i < EFS_LOCK_REQ_MAX; i++)
			a->doubt[i] = EFS_LOCK_NONE; /* its keys went with the lease */
		a->gen = lc->gen;
	}
	if (a->yield_asked) {
		uint64_t ino = pinned_recalled(a);

		a->yield_asked = false;
		if (ino)
			return acq_yield(a, ino);
	}
	for (size_t j = 0; j < a->req->n; j++) {
		size_t i = a->order[j];
		struct efs_locktab_entry *e;

		if (a->dup[i])
			continue;
		if (a->pinned[i] && a->pinned[i]->dead) {
			efs_locktab_unpin(&lc->tab, a->pinned[i], now_ns());
			a->pinned[i] = NULL;
		}
		if (a->pinned[i])
			continue;
		e = efs_locktab_find(&lc->tab, a->req->ino[i]);
		if (a->yield_ino == a->req->ino[i]) {
			/* It gave way to this recall: the release goes first. */
			if (e && e->recalled && e->state == EFS_LOCKTAB_HELD) {
				a->wait = AW_ENTRY;
				a->blocked_on = e;
				return true;
			}
			a->yield_ino = 0;
		}
		if (e && e->mode >= (int)a->want[i] && hit_ok(a, e)) {
			pin_for(a, i, e);
			continue;
		}
		if (e && ((e->state != EFS_LOCKTAB_HELD && e->owner != a) ||
			  (e->state == EFS_LOCKTAB_HELD && e->recalled && !e->inval_serving &&
			   !drain_exempt(a)))) {
			/* Another local acquisition or a release is on it:
			 * its end decides (they share the node's lock). */
			uint64_t yino;

			if (a->req->flags & EFS_LOCK_F_TRY)
				return acq_finish(a, -EWOULDBLOCK);
			a->local_wait = true;
			yino = pinned_recalled(a);
			if (yino)
				return acq_yield(a, yino);
			a->wait = AW_ENTRY;
			a->blocked_on = e;
			return true;
		}
		if (give_back_pending(lc, a->req->ino[i])) {
			/* Our own key of it is being deleted: an acquisition
			 * now would put that key again and lose it. */
			if (a->req->flags & EFS_LOCK_F_TRY)
				return acq_finish(a, -EWOULDBLOCK);
			a->wait = AW_ENTRY;
			a->blocked_on = NULL;
			return true;
		}
		need[n_need++] = i;
	}
	a->local_wait = false;
	if (n_need == 0) {
		recall_drop(a);
		return acq_finish(a, 0);
	}
	uint64_t yino = pinned_recalled(a);

	if (yino)
		return acq_yield(a, yino);
	if ((n_need > 1 || (a->req->flags & EFS_LOCK_F_TRY)) && !a->batch_tried)
		r = start_batch(a, need, n_need);
	else
		r = start_single(a, need[0]);
	if (r < 0) {
		if (r == -EIO && !efs_session_is_active(lc->s)) {
			a->wait = AW_KICK;
			kick_soon(lc);
			return true;
		}
		return acq_finish(a, r);
	}
	return true;
}

static void kick_cb(uv_timer_t *t)
{
	struct efs_lockcache *lc = t->data;
	struct efs_list *n;
	struct lref *ref;

	if (!lc)
		return;
	ref = lref_get(lc->ref);
	/* Only those queued before this pass run now; a step that queues
	 * itself again runs at the next pass (no busy loop). */
	lc->pass++;
	efs_list_for_each(n, &lc->acqs)
		if (acq_of(n)->wait == AW_KICK)
			acq_of(n)->pass = lc->pass;
	for (;;) {
		struct acq *a = NULL;

		efs_list_for_each(n, &lc->acqs) {
			if (acq_of(n)->wait == AW_KICK && acq_of(n)->pass == lc->pass) {
				a = acq_of(n);
				break;
			}
		}
		if (!a)
			break;
		a->pass = 0;
		if (!acq_step(a) || !ref->lc)
			break;
	}
	lref_put(ref);
}

static void kick_soon(struct efs_lockcache *lc)
{
	if (lc->kick && !uv_is_active((uv_handle_t *)lc->kick))
		uv_timer_start(lc->kick, kick_cb, 0, 0);
}

static void retry_cb(uv_timer_t *t)
{
	struct efs_lockcache *lc = t->data;
	struct efs_list *n;
	struct lcall *k;

	if (!lc)
		return;
	efs_list_for_each(n, &lc->acqs)
		if (acq_of(n)->wait == AW_BACKOFF)
			acq_of(n)->wait = AW_KICK;
	kick_soon(lc);
	/* One waiting cleanup at a time (a retry may end one and change the
	 * list); one that waits again is left for the next timer. */
	lc->cpass++;
	for (;;) {
		for (k = lc->cleanups; k; k = k->c_next)
			if (k->waiting && k->c_pass != lc->cpass)
				break;
		if (!k)
			break;
		k->c_pass = lc->cpass;
		cleanup_retry(lc, k);
	}
}

static void backoff(struct acq *a)
{
	struct efs_lockcache *lc = a->lc;

	a->wait = AW_BACKOFF;
	lc->stats.txn_retries++;
	if (!uv_is_active((uv_handle_t *)lc->retry))
		uv_timer_start(lc->retry, retry_cb, RETRY_MS, 0);
}

/* |ino|'s lock is ours now in |mode|: record it and pin it for index |i|. */
/*
 * |floor|: the grant's transaction compared that every recall key of the
 * inode was created at this revision or later (none at all without a
 * recall key of ours: the revision after the grant), so a recall key we
 * still know of from before it was deleted already, its delete event not
 * here yet (a late watch). 0: unknown.
 */
static void granted(struct acq *a, size_t i, enum efs_lock_mode mode,
		    const Etcdserverpb__RangeResponse *rec, int64_t floor)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, a->req->ino[i]);

	if (!e || e->owner != a) {
		/* Forgotten meanwhile (efs_lock_forget): the inode is gone. */
		return;
	}
	/* An upgrade in place keeps the grant: the hold never lapsed. */
	if (!(e->grant && e->mode == EFS_LOCK_SHARED && mode == EFS_LOCK_EXCLUSIVE))
		new_grant(lc, e);
	e->mode = mode;
	e->state = EFS_LOCKTAB_HELD;
	e->owner = NULL;
	e->token = lc->token_seq;
	e->recall_floor = floor;
	/* The reply granting it is noted already: a revision at or after the
	 * grant, so a death before it is never taken as later. */
	e->grant_rev = lc->last_rev;
	set_draining(lc, e, false);
	a->up_blocked = false;
	a->yielding = false;
	a->doubt[i] = EFS_LOCK_NONE;
	pin_for(a, i, e);
	a->req->recs[i] = rec && rec->n_kvs > 0 ? rec->kvs[0] : NULL;
	/* A forced release asked for before the grant (the new hold starts
	 * undrained), or a recall key of another node that came while we
	 * were acquiring. */
	recall_mark(lc, e);
	entry_changed(lc, e);
	recall_apply(lc, e->ino);
}

/*
 * Other recall keys of ours for the inode |a| waits for (|wait|: the
 * range its failed transaction read). Each belongs to another acquisition
 * of this node, which orders itself by it and retries on the watch events
 * it gets; one that waits on a watch while the inode's entry is no longer
 * its own (the inode was deleted here and its entry forgotten) may have
 * missed the events that would let it go on, and the key then holds every
 * later waiter back, ours included: it is told to try again. A key no
 * acquisition of ours owns (and whose delete is not pending) is a stray:
 * it is deleted, as an ended acquisition's key is (which gives back a
 * grant that came to it). Nothing else would ever remove it before the
 * session ends.
 */
static void own_recalls_check(struct acq *a, const Etcdserverpb__RangeResponse *wait)
{
	struct efs_lockcache *lc = a->lc;
	uint64_t ino = a->req->ino[a->cur];

	for (size_t j = 0; j < wait->n_kvs; j++) {
		const Mvccpb__KeyValue *kv = wait->kvs[j];
		struct efs_meta_key_info ki;
		struct acq *owner = NULL;
		struct efs_list *n;
		struct lcall *k;

		if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_RECALL || ki.num == a->recall_seq ||
		    strcmp(ki.node, efs_session_node(lc->s)) != 0 ||
		    kv->lease != efs_session_lease_id(lc->s) || recall_pending(lc, ino, ki.num) ||
		    (a->recall_rev > 0 && kv->create_revision >= a->recall_rev))
			continue; /* only older keys hold |a| back */
		efs_list_for_each(n, &lc->acqs) {
			struct acq *b = acq_of(n);

			if (b != a && b->recall_seq == ki.num && b->req->ino[b->cur] == ino)
				owner = b;
		}
		if (owner) {
			const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino);

			if (owner->wait == AW_WATCH && (!e || e->owner != owner)) {
				efs_log_debug("lock: inode %" PRIu64 ": our acquisition of recall key "
					      "%" PRIu64 " lost its entry: it tries again",
					      ino, ki.num);
				owner->wait = AW_KICK;
				kick_soon(lc);
			}
			continue;
		}
		k = lcall_new(lc, NULL, 0);
		if (!k)
			continue;
		efs_log_warn("lock: inode %" PRIu64 ": recall key %" PRIu64
			     " of this node belongs to no acquisition: deleting it",
			     ino, ki.num);
		lc->stats.stray_recalls++;
		k->kind = CL_RECALL;
		k->c_ino = ino;
		k->c_seq = ki.num;
		cleanup_start(lc, k);
	}
}

/* Finds our own holder key of |ino| in |hold| (a failure branch's range). */
static enum efs_lock_mode own_holder(struct efs_lockcache *lc,
				     const Etcdserverpb__RangeResponse *hold)
{
	enum efs_lock_mode best = EFS_LOCK_NONE;

	for (size_t j = 0; j < hold->n_kvs; j++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = hold->kvs[j];

		if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_HOLDER || strcmp(ki.node, efs_session_node(lc->s)) ||
		    kv->lease != efs_session_lease_id(lc->s))
			continue;
		if (ki.mode == EFS_META_LOCK_EXCLUSIVE)
			best = EFS_LOCK_EXCLUSIVE;
		else if (best == EFS_LOCK_NONE)
			best = EFS_LOCK_SHARED;
	}
	return best;
}

/* For the debug log of a wait: who holds the lock and whose recall keys
 * are queued on it ("node1:x node3:s / node1@2870 node2@2876"). */
static void wait_describe(struct efs_lockcache *lc, const Etcdserverpb__RangeResponse *hold,
			  const Etcdserverpb__RangeResponse *wait, char *buf, size_t size)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int pass = 0; pass < 2; pass++) {
		const Etcdserverpb__RangeResponse *r = pass ? wait : hold;

		if (pass && n < size)
			n += (size_t)snprintf(buf + n, size - n, " /");
		for (size_t j = 0; r && j < r->n_kvs && n < size; j++) {
			struct efs_meta_key_info ki;
			const Mvccpb__KeyValue *kv = r->kvs[j];

			if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0)
				continue;
			if (pass)
				n += (size_t)snprintf(buf + n, size - n, " %s@%" PRId64, ki.node,
						      kv->create_revision);
			else
				n += (size_t)snprintf(buf + n, size - n, " %s:%s", ki.node,
						      ki.mode == EFS_META_LOCK_EXCLUSIVE ? "x" : "s");
		}
	}
}

/* Keeps the response that |recs| will point into; false when it cannot
 * (then no record is handed out). */
static bool keep_resp(struct acq *a, struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp)
{
	if (!res->resp)
		return true; /* kept already (a batch) */
	if (a->n_resps >= EFS_LOCK_REQ_MAX)
		return false;
	a->resps[a->n_resps++] = resp;
	res->resp = NULL;
	return true;
}

/*
 * The lock of |cur| is ours in |mode| and our recall key, if any, is gone
 * (deleted by the transaction that granted it): the wait ends, the next
 * step follows. Returns acq_step's value.
 */
static bool granted_after_wait(struct acq *a, enum efs_lock_mode mode,
			       const Etcdserverpb__RangeResponse *rec, int64_t floor)
{
	struct efs_lockcache *lc = a->lc;

	if (a->recall_ns && lc->recall_wait_cb)
		lc->recall_wait_cb(lc->recall_wait_arg, now_ns() - a->recall_ns);
	if (a->counted_wait)
		efs_log_debug("lock: inode %" PRIu64 ": granted %s after a wait (our recall key @%" PRId64
			      ")",
			      a->req->ino[a->cur], mode == EFS_LOCK_EXCLUSIVE ? "exclusive" : "shared",
			      a->recall_rev);
	a->recall_seq = 0;
	a->recall_rev = 0;
	a->recall_ns = 0;
	lc->stats.acquires++;
	granted(a, a->cur, mode, rec, floor);
	return acq_step(a);
}

/*
 * Whether a holder key or an older recall key of someone else stands in
 * the way of |a|'s request for |cur| (from a failed attempt's reads). Our
 * own keys never do: what is left of ours is given up or compared as ours
 * by the next attempt.
 */
static bool blocked_by_others(struct efs_lockcache *lc, const struct acq *a,
			      const Etcdserverpb__RangeResponse *hold,
			      const Etcdserverpb__RangeResponse *wait)
{
	const char *node = efs_session_node(lc->s);
	int64_t lease = efs_session_lease_id(lc->s);

	for (size_t j = 0; j < hold->n_kvs; j++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = hold->kvs[j];

		/* A key we cannot read failed the compare all the same. */
		if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_HOLDER)
			return true;
		if (strcmp(ki.node, node) == 0 && kv->lease == lease)
			continue;
		if (a->want[a->cur] == EFS_LOCK_EXCLUSIVE || ki.mode == EFS_META_LOCK_EXCLUSIVE)
			return true;
	}
	for (size_t j = 0; j < wait->n_kvs; j++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = wait->kvs[j];

		if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.family != EFS_META_K_RECALL)
			return true;
		if (strcmp(ki.node, node) == 0 && ki.num == a->recall_seq)
			continue;
		if (a->recall_rev <= 0 || kv->create_revision < a->recall_rev)
			return true;
	}
	return false;
}

static bool single_done(struct acq *a, struct lcall *k, struct efs_etcd_result *res,
			Etcdserverpb__TxnResponse *outer, Etcdserverpb__TxnResponse *inner)
{
	struct efs_lockcache *lc = a->lc;
	size_t i = a->cur;
	Etcdserverpb__RangeResponse *rec = NULL, *hold = NULL, *wait = NULL;
	enum efs_lock_mode own;
	int r;

	if (inner->succeeded) {
		r = efs_etcd_txn_resp_range(inner, k->s_rec, &rec);
		if (r < 0)
			return acq_finish(a, r);
		int64_t floor = a->recall_rev ? a->recall_rev
				 : outer->header ? outer->header->revision + 1
						 : 0;

		return granted_after_wait(a, a->want[i], keep_resp(a, res, outer) ? rec : NULL,
					  floor);
	}
	r = efs_etcd_txn_resp_range(inner, k->f_l, &hold);
	if (r == 0)
		r = efs_etcd_txn_resp_range(inner, k->f_w, &wait);
	if (r == 0)
		r = efs_etcd_txn_resp_range(inner, k->f_i, &rec);
	if (r < 0)
		return acq_finish(a, r);
	own = own_holder(lc, hold);
	if (own >= a->want[i]) {
		/* An earlier attempt with an unknown outcome took it. */
		lc->stats.acquires++;
		recall_drop(a);
		granted(a, i, own, keep_resp(a, res, outer) ? rec : NULL, 0);
		return acq_step(a);
	}
	/* Our recall key: its create revision orders us among waiters. */
	for (size_t j = 0; j < wait->n_kvs; j++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = wait->kvs[j];

		if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) == 0 &&
		    ki.family == EFS_META_K_RECALL && ki.num == a->recall_seq &&
		    strcmp(ki.node, efs_session_node(lc->s)) == 0)
			a->recall_rev = kv->create_revision;
	}
	own_recalls_check(a, wait);
	if (a->recall_rev > 0 && !a->recall_ns)
		a->recall_ns = now_ns();
	/* That attempt deleted the stray key in its failure branch: from
	 * now on a plain acquisition. */
	if (a->stray_shared && own == EFS_LOCK_NONE)
		a->stray_shared = false;
	if (own == EFS_LOCK_SHARED && !a->stray_shared) {
		const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, a->req->ino[i]);

		if (!e || e->mode == EFS_LOCK_NONE) {
			efs_log_debug("lock: inode %" PRIu64 ": our shared key was granted to a "
				      "wait that ended: given up with the next attempt",
				      a->req->ino[i]);
			a->stray_shared = true;
			a->wait = AW_KICK;
			kick_soon(lc);
			return true;
		}
	}
	if (!blocked_by_others(lc, a, hold, wait)) {
		/* Only our own keys failed the compares (our recall key,
		 * which the attempt had not known yet): nothing will change
		 * for a watch to see, so try again now. */
		a->wait = AW_KICK;
		kick_soon(lc);
		return true;
	}
	if (k->up_plain) {
		/* Another holder blocks our upgrade: stop new local hits and
		 * give the shared hold up as soon as its pins are gone. */
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, a->req->ino[i]);

		a->up_blocked = true;
		if (e && e->owner == a) {
			set_draining(lc, e, true);
			yield_wake(lc, e);
		}
	}
	if (!a->counted_wait) {
		a->counted_wait = true;
		lc->stats.waits++;
		efs_log_debug("lock: inode %" PRIu64 ": waiting for another holder (%s%s)",
			      a->req->ino[i], k->up_plain ? "upgrade, " : "",
			      a->req->mode[i] == EFS_LOCK_EXCLUSIVE ? "exclusive" : "shared");
		if (lc->wait_timeout_ms)
			a->wait_deadline_ns = now_ns() + (uint64_t)lc->wait_timeout_ms *
								    EFS_NSEC_PER_MSEC;
	}
	if (efs_log_get_level() >= EFS_LOG_DEBUG) {
		char who[256];

		wait_describe(lc, hold, wait, who, sizeof(who));
		efs_log_debug("lock: inode %" PRIu64 ": waits behind holders%s (ours @%" PRId64 ")",
			      a->req->ino[i], who, a->recall_rev);
	}
	if (pinned_recalled(a)) {
		/* The next step gives way (after its cancel and session
		 * checks). */
		a->wait = AW_KICK;
		a->yield_asked = true;
		kick_soon(lc);
		return true;
	}
	if (k->up_plain) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, a->req->ino[i]);

		if (e && e->owner == a && yieldable(e, now_ns())) {
			a->wait = AW_KICK;
			kick_soon(lc);
			return true;
		}
	}
	{
		struct efs_meta_range hr, wr;
		int64_t from = outer->header ? outer->header->revision + 1 : 0;

		r = efs_meta_range_ino(&lc->ns, EFS_META_K_HOLDER, a->req->ino[i], &hr);
		if (r == 0)
			r = efs_meta_range_ino(&lc->ns, EFS_META_K_RECALL, a->req->ino[i], &wr);
		/* Puts of holder keys too: a release may grant us the lock. */
		if (r == 0)
			r = watch_range(a, &hr, from, false, &a->wl);
		if (r == 0)
			r = watch_range(a, &wr, from, true, &a->ww);
		if (r < 0) {
			watchers_free(a);
			return acq_finish(a, r);
		}
	}
	a->wait = AW_WATCH;
	return true;
}

/*
 * A release granted us the lock of |cur| (its transaction put our holder
 * key on our lease and deleted our recall key, add_grant): one read-only
 * transaction confirms the key is the one we saw and reads the inode
 * record with it, as an acquisition's own transaction does; the grant is a
 * new hold like any other (new_grant). |rev|: the key's create revision.
 */
static int accept_start(struct acq *a, enum efs_lock_mode mode, int64_t rev)
{
	struct efs_lockcache *lc = a->lc;
	uint64_t ino = a->req->ino[a->cur];
	struct efs_etcd_txn *t = NULL, *in = NULL;
	struct efs_meta_key hk;
	struct lcall *k;
	int r;

	k = lcall_new(lc, a, 0);
	if (!k)
		return -ENOMEM;
	k->accept = true;
	k->acc_mode = mode;
	r = outer_new(lc, &t, &in);
	if (r == 0)
		r = efs_meta_key_holder(&lc->ns, ino, meta_mode(mode), efs_session_node(lc->s),
					&hk);
	if (r == 0)
		r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, hk.buf,
					 hk.len, rev);
	if (r == 0)
		r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, hk.buf, hk.len,
					 efs_session_lease_id(lc->s));
	if (r == 0) {
		k->s_rec = n_ops(in, EFS_ETCD_TXN_SUCCESS);
		r = add_inode_range(lc, in, EFS_ETCD_TXN_SUCCESS, ino);
	}
	if (r == 0)
		r = send_txn(a, t, k);
	efs_etcd_txn_free(t);
	if (r < 0)
		lcall_end(k);
	return r;
}

static bool accept_done(struct acq *a, struct lcall *k, struct efs_etcd_result *res,
			Etcdserverpb__TxnResponse *outer, Etcdserverpb__TxnResponse *inner)
{
	Etcdserverpb__RangeResponse *rec = NULL;
	int r;

	if (!inner->succeeded) {
		/* Not the key we saw any more: ask as any acquisition does
		 * (its transaction finds a key of ours, if there is one). */
		return acq_step(a);
	}
	r = efs_etcd_txn_resp_range(inner, k->s_rec, &rec);
	if (r < 0)
		return acq_finish(a, r);
	/* The release granted the oldest waiter: every other recall key of
	 * the inode was created after ours. */
	return granted_after_wait(a, k->acc_mode, keep_resp(a, res, outer) ? rec : NULL,
				  a->recall_rev);
}

static bool batch_done(struct acq *a, struct efs_etcd_result *res,
		       Etcdserverpb__TxnResponse *outer, Etcdserverpb__TxnResponse *inner)
{
	struct efs_lockcache *lc = a->lc;
	size_t idx = 0;
	bool kept;

	if (!inner->succeeded) {
		/* Some conflict: take them one by one, waiting as needed
		 * (a try ends here: it never queues nor recalls). */
		a->batch_tried = true;
		revert_busy(a);
		if (a->req->flags & EFS_LOCK_F_TRY)
			return acq_finish(a, -EWOULDBLOCK);
		return acq_step(a);
	}
	kept = keep_resp(a, res, outer);
	for (size_t j = 0; j < a->batch_n; j++) {
		size_t i = a->batch[j];
		Etcdserverpb__RangeResponse *rec = NULL;

		idx += a->batch_up[j] ? 3 : 2; /* [delete S], put, range i/ */
		if (!kept || efs_etcd_txn_resp_range(inner, idx - 1, &rec) < 0)
			rec = NULL;
		lc->stats.acquires++;
		/* A batch compares that no recall key exists at all. */
		granted(a, i, a->want[i], rec, outer->header ? outer->header->revision + 1 : 0);
	}
	a->batch_n = 0;
	return acq_step(a);
}

static void acq_txn_result(struct efs_lockcache *lc, struct lcall *k,
			   struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp)
{
	struct acq *a = k->acq;
	Etcdserverpb__TxnResponse *inner = NULL;

	a->wait = AW_KICK;
	if (res->err < 0) {
		efs_log_debug("lock: acquire txn: %s", res->message);
		if (res->outcome_unknown && k->gen == a->gen) {
			/* Its holder keys may have been put: the entries stay
			 * ours until a retry or a settle tells (settle_doubts). */
			if (k->batch) {
				for (size_t j = 0; j < a->batch_n; j++)
					a->doubt[a->batch[j]] = a->want[a->batch[j]];
			} else if (a->cur < a->req->n) {
				a->doubt[a->cur] = a->want[a->cur];
			}
		} else if (k->batch) {
			revert_busy(a);
		}
		if (a->cancelled) {
			acq_finish(a, -EINTR);
			return;
		}
		if (is_transient(res->err) || res->outcome_unknown) {
			backoff(a);
			return;
		}
		acq_finish(a, res->err);
		return;
	}
	note_rev(lc, resp->header);
	if (k->gen != efs_session_generation(lc->s) || k->gen != lc->gen) {
		/* Answered for a session that is no more: start again. */
		check_generation(lc);
		kick_soon(lc);
		return;
	}
	if (!resp->succeeded) {
		/* The session guard failed: our node key is not on our lease
		 * or g/<node> moved. Wait for the session if it noticed. */
		if (k->batch)
			revert_busy(a);
		if (!efs_session_is_active(lc->s)) {
			kick_soon(lc);
			return;
		}
		efs_log_err("lock: session guard of node %s failed: session lost",
			    efs_session_node(lc->s));
		acq_finish(a, -EIO);
		return;
	}
	if (efs_etcd_txn_resp_txn(resp, 0, &inner) < 0) {
		if (k->batch)
			revert_busy(a);
		acq_finish(a, -EBADMSG);
		return;
	}
	if (k->batch)
		batch_done(a, res, resp, inner);
	else if (k->accept)
		accept_done(a, k, res, resp, inner);
	else
		single_done(a, k, res, resp, inner);
}

static void acq_txn_done(struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct lcall *k = arg;

	if (k->ref->lc)
		acq_txn_result(k->ref->lc, k, res, resp);
	lcall_end(k);
}

/* ---- Cleanups ---- */

/* Unlinks and frees cleanup |k|; a settle's entry becomes what it keeps. */
static void cleanup_end(struct efs_lockcache *lc, struct lcall *k)
{
	for (struct lcall **pp = &lc->cleanups; *pp; pp = &(*pp)->c_next) {
		if (*pp == k) {
			*pp = k->c_next;
			break;
		}
	}
	if (k->kind == CL_GIVE_BACK)
		entry_changed(lc, NULL); /* acquisitions of it may go on */
	if (k->kind == CL_SETTLE) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, k->c_ino);

		if (e && e->owner == k) {
			e->owner = NULL;
			if (k->keep == EFS_LOCK_NONE) {
				remove_entry(lc, e);
			} else {
				e->state = EFS_LOCKTAB_HELD;
				entry_changed(lc, e);
				rwake_soon(lc); /* a downgrade may be waited for */
			}
		}
	}
	lcall_end(k);
}

static void orphan_grant(struct efs_lockcache *lc, uint64_t ino,
			 const Etcdserverpb__TxnResponse *resp);

static void cleanup_wait(struct efs_lockcache *lc, struct lcall *k)
{
	k->waiting = true;
	if (!uv_is_active((uv_handle_t *)lc->retry))
		uv_timer_start(lc->retry, retry_cb, RETRY_MS, 0);
}

static void cleanup_done(struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct lcall *k = arg;
	struct efs_lockcache *lc = k->ref->lc;

	if (!lc) {
		lcall_end(k);
		return;
	}
	if (res->err < 0 && k->gen == efs_session_generation(lc->s) &&
	    efs_session_state(lc->s) != EFS_SESSION_CLOSED) {
		/* Both kinds are idempotent: send it again. */
		efs_log_debug("lock: cleanup txn: %s", res->message);
		cleanup_wait(lc, k);
		return;
	}
	if (res->err == 0) {
		note_rev(lc, resp->header);
		if (!resp->succeeded)
			efs_log_debug("lock: cleanup of inode %" PRIu64 ": session guard failed",
				      k->c_ino);
		else if (k->kind == CL_RECALL)
			orphan_grant(lc, k->c_ino, resp);
	}
	/* Done, or the session that owned the keys is no more. */
	cleanup_end(lc, k);
	release_start(lc); /* a release_all may wait for the entry */
}

/* Builds and sends cleanup |k|: 0, or -EIO (session not ACTIVE), ... */
static int cleanup_send(struct efs_lockcache *lc, struct lcall *k)
{
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO};
	const char *node = efs_session_node(lc->s);
	struct efs_etcd_txn *t = NULL, *in = NULL;
	struct efs_meta_key sk, xk, wk;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	r = efs_session_guard(lc->s, t);
	if (r == 0 && k->kind == CL_RECALL) {
		r = efs_meta_key_recall(&lc->ns, k->c_ino, k->c_seq, node, &wk);
		if (r == 0)
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, wk.buf, wk.len, NULL, 0,
						false);
		/* A release may have granted the lock to the key first: our
		 * holder keys, exclusive then shared (orphan_grant). */
		for (int m = 0; r == 0 && m < 2; m++) {
			r = efs_meta_key_holder(&lc->ns, k->c_ino,
						m ? EFS_META_LOCK_SHARED : EFS_META_LOCK_EXCLUSIVE,
						node, &xk);
			if (r == 0)
				r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, xk.buf, xk.len,
						       NULL, 0);
		}
	} else if (r == 0 && k->kind == CL_GIVE_BACK) {
		/* Only that very grant: a key put since is another hold. */
		r = efs_meta_key_holder(&lc->ns, k->c_ino, meta_mode(k->keep), node, &xk);
		if (r == 0)
			r = efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &in);
		if (r == 0)
			r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL,
						 xk.buf, xk.len, k->c_rev);
		if (r == 0)
			r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL,
						 xk.buf, xk.len, efs_session_lease_id(lc->s));
		if (r == 0)
			r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, xk.buf, xk.len, NULL,
						0, false);
	} else if (r == 0) {
		r = efs_meta_key_holder(&lc->ns, k->c_ino, EFS_META_LOCK_SHARED, node, &sk);
		if (r == 0)
			r = efs_meta_key_holder(&lc->ns, k->c_ino, EFS_META_LOCK_EXCLUSIVE, node,
						&xk);
		if (r == 0 && k->keep == EFS_LOCK_NONE) {
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, sk.buf, sk.len, NULL, 0,
						false);
			if (r == 0)
				r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, xk.buf, xk.len,
							NULL, 0, false);
		} else if (r == 0) {
			/* Undo an upgrade that may have committed. */
			r = efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &in);
			if (r == 0)
				r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_LEASE,
							 EFS_ETCD_CMP_EQUAL, xk.buf, xk.len,
							 efs_session_lease_id(lc->s));
			if (r == 0)
				r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, xk.buf, xk.len,
							NULL, 0, false);
			if (r == 0)
				r = put_holder(lc, in, k->c_ino, EFS_LOCK_SHARED, NULL);
		}
	}
	if (r == 0)
		r = efs_etcd_txn(lc->c, efs_etcd_txn_request(t), &co, cleanup_done, k);
	efs_etcd_txn_free(t);
	return r;
}

static void cleanup_retry(struct efs_lockcache *lc, struct lcall *k)
{
	int r;

	k->waiting = false;
	if (k->gen != efs_session_generation(lc->s) ||
	    efs_session_state(lc->s) == EFS_SESSION_CLOSED) {
		cleanup_end(lc, k); /* the keys went with the lease */
		return;
	}
	r = efs_session_is_active(lc->s) ? cleanup_send(lc, k) : -EIO;
	if (r == 0)
		return;
	if (r == -EIO || is_transient(r)) {
		cleanup_wait(lc, k);
		return;
	}
	efs_log_err("lock: cannot clean up after inode %" PRIu64 " (%s): a key of ours may "
		    "stay until the session ends",
		    k->c_ino, strerror(-r));
	cleanup_end(lc, k);
}

/* Takes |k| (kind, inode and seq/keep set) and sends it now or later. */
static void cleanup_start(struct efs_lockcache *lc, struct lcall *k)
{
	k->c_next = lc->cleanups;
	lc->cleanups = k;
	cleanup_retry(lc, k);
}

/* ---- Forced releases: the callers of efs_lock_release_now ---- */

/* The wait of |w| is over once the lock is no longer held above its
 * target (or the session was lost first). */
static bool rwait_over(const struct efs_lockcache *lc, const struct rwait *w)
{
	const struct efs_locktab_entry *e;

	if (w->status)
		return true;
	e = efs_locktab_find(&lc->tab, w->ino);
	if (!e)
		return true;
	if (e->state == EFS_LOCKTAB_RELEASING || e->state == EFS_LOCKTAB_GRANTING)
		return false;
	return e->mode <= (int)w->to;
}

/* Ends every wait that is over; callbacks may free |lc|. */
static void rwaiters_check(struct efs_lockcache *lc)
{
	struct lref *ref = lref_get(lc->ref);

	while (ref->lc) {
		struct rwait *w = NULL;
		struct efs_list *n;

		efs_list_for_each(n, &lc->rwaiters) {
			if (rwait_over(lc, rwait_of(n))) {
				w = rwait_of(n);
				break;
			}
		}
		if (!w)
			break;
		efs_list_del(&w->link);
		if (w->status == 0) {
			lc->stats.forced++;
			if (lc->handover_cb)
				lc->handover_cb(lc->handover_arg, now_ns() - w->start_ns);
		}
		w->cb(w->arg, w->status);
		efs_mem_free(w);
	}
	lref_put(ref);
}

static void rwake_cb(uv_timer_t *t)
{
	struct efs_lockcache *lc = t->data;

	if (lc)
		rwaiters_check(lc);
}

static void rwake_soon(struct efs_lockcache *lc)
{
	if (!efs_list_empty(&lc->rwaiters) && lc->rwake && !uv_is_active((uv_handle_t *)lc->rwake))
		uv_timer_start(lc->rwake, rwake_cb, 0, 0);
}

/* ---- Preparing a release: the lock's ops ---- */

static void prep_step(struct prep *p, int status);

static void prep_done(void *darg, int status)
{
	prep_step(darg, status);
}

/*
 * Runs the next op of |p|'s preparation. Ops may complete inline; nothing
 * here touches |p| after handing it to an op.
 */
static void prep_step(struct prep *p, int status)
{
	struct efs_lockcache *lc = p->ref->lc;
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, p->ino) : NULL;
	const struct efs_lock_ops *ops;
	unsigned kind;
	void *arg;

	if (!e || !e->prep)
		goto out; /* the hold it prepared for is gone */
	if (e->grant != p->grant) {
		/* A new hold began meanwhile (an upgrade that gave its shared
		 * hold up, a downgrade): this preparation is void, and its
		 * flag, which keeps a second one from starting, must go with
		 * it or the entry would never be released again. */
		e->prep = false;
		e->prep_stage = 0;
		e->inval_serving = false;
		release_kick(lc);
		goto out;
	}
	if (status < 0) {
		efs_log_warn("lock: inode %" PRIu64 ": preparing its release: %s; kept, tried "
			     "again later",
			     p->ino, strerror(-status));
		e->prep = false;
		e->prep_stage = 0;
		e->inval_serving = false;
		if (e->recalled) {
			/* Operations go on meanwhile; the next attempt drains
			 * again. */
			e->recalled = false;
			entry_changed(lc, e);
		}
		goto out;
	}
	kind = kind_of(lc, e); /* asks the classifier: once per step */
	ops = lc->ops[kind].ops;
	arg = lc->ops[kind].arg;
	if (p->step == 0) {
		p->step = 1;
		e->prep_keeps = ops && ops->serve_while_invalidating;
		if (ops && ops->invalidate && p->inval) {
			if (ops->serve_while_invalidating) {
				/* Requests the drain holds back may be what
				 * the kernel's lock waits for. */
				e->inval_serving = true;
				entry_changed(lc, e);
			}
			e->prep_stage = 1;
			ops->invalidate(arg, p->ino, p->to, prep_done, p);
			return;
		}
	}
	if (p->step == 1) {
		p->step = 2;
		e->inval_serving = false;
		if (ops && ops->sync) {
			e->prep_stage = 2;
			ops->sync(arg, p->ino, p->to, prep_done, p);
			return;
		}
	}
	/* Valid only if no operation took the lock meanwhile: one that did
	 * may have cached or buffered more, so the release prepares again
	 * once its pins are gone. */
	e->prep = false;
	e->prep_stage = 0;
	e->prepared = e->prep_keeps || (e->pins == 0 && pins_kept_prep(e));
	if (e->prepared)
		e->voided_ns = 0;
	else if (!e->voided_ns)
		e->voided_ns = now_ns();
	efs_log_debug("lock: inode %" PRIu64 ": release prepared%s", p->ino,
		      e->prepared ? "" : " but pinned meanwhile: again");
	release_kick(lc);
out:
	lref_put(p->ref);
	efs_mem_free(p);
}

/* Caches granted under an ended hold are void by their grant id, so the
 * invalidate op runs only while the kernel may still cache under the lock
 * or the release cannot wait for that (|urgent|). */
static bool needs_inval(const struct efs_lockcache *lc, const struct efs_locktab_entry *e,
			bool urgent, uint64_t now)
{
	unsigned k = kind_of(lc, e);
	const struct efs_lock_ops *ops = lc->ops[k].ops;

	if (urgent || e->kcache_until_ns > now)
		return true;
	return ops && ops->cached && ops->cached(lc->ops[k].arg, e->ino);
}

/* Whether the kind of |e| forbids keeping it shared (ops->no_shared). */
static bool no_shared(const struct efs_lockcache *lc, const struct efs_locktab_entry *e)
{
	unsigned k = kind_of(lc, e);
	const struct efs_lock_ops *ops = lc->ops[k].ops;

	return ops && ops->no_shared && ops->no_shared(lc->ops[k].arg, e->ino);
}

static int prep_start(struct efs_lockcache *lc, struct efs_locktab_entry *e,
		      enum efs_lock_mode to, bool inval)
{
	struct prep *p = efs_mem_calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	p->ref = lref_get(lc->ref);
	p->ino = e->ino;
	p->grant = e->grant;
	p->to = to;
	p->inval = inval;
	e->prep = true;
	e->prepared = false;
	e->prep_seq = e->pin_seq;
	e->prep_xseq = e->xpin_seq;
	e->prep_to = (uint8_t)to;
	lc->stats.preps++;
	prep_step(p, 0);
	return 0;
}

/* Whether releasing |e| must run its ops first. */
static bool needs_prep(const struct efs_lockcache *lc, const struct efs_locktab_entry *e,
		       bool urgent, uint64_t now)
{
	const struct efs_lock_ops *ops = lc->ops[kind_of(lc, e)].ops;

	if (!ops)
		return false;
	if (ops->sync)
		return true;
	return ops->invalidate && needs_inval(lc, e, urgent, now);
}

static bool is_prepared(const struct efs_locktab_entry *e, enum efs_lock_mode to)
{
	return e->prepared && e->pins == 0 && (pins_kept_prep(e) || e->prep_keeps) &&
	       e->prep_to <= to;
}

/* ---- Releases ---- */

static void release_send(struct efs_lockcache *lc, struct lcall *k);
static int add_grant(struct efs_lockcache *lc, struct efs_etcd_txn *t,
		     const struct efs_locktab_entry *e, enum efs_lock_mode to, size_t room);
static void grants_count(struct efs_lockcache *lc, const Etcdserverpb__TxnResponse *resp);

/* |e|'s release to SHARED committed: a new, shared hold. */
static void downgraded(struct efs_lockcache *lc, struct efs_locktab_entry *e)
{
	e->mode = EFS_LOCK_SHARED;
	e->state = EFS_LOCKTAB_HELD;
	e->rel_to = EFS_LOCK_NONE;
	e->token = lc->token_seq;
	e->grant_rev = lc->last_rev;
	new_grant(lc, e);
	recall_mark(lc, e); /* a release to NONE may be asked for too */
	entry_changed(lc, e);
}

static void release_txn_done(struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp,
			     void *arg)
{
	struct lcall *k = arg;
	struct efs_lockcache *lc = k->ref->lc;
	bool ok = res->err == 0 && resp->succeeded;

	if (!lc) {
		lcall_end(k);
		return;
	}
	lc->releasing = false;
	if (res->err < 0) {
		/* Deleting is idempotent: send the same deletes again (the
		 * locks stay RELEASING, unusable, until then). */
		efs_log_debug("lock: release txn: %s", res->message);
		lc->stats.txn_retries++;
		/* Without grants: a waiter's put is what may have failed it
		 * (a lease etcd no longer knows), and the release must go. */
		k->no_grant = true;
		lc->rel_retry = k;
		return;
	}
	note_rev(lc, resp->header);
	if (ok)
		grants_count(lc, resp);
	for (size_t j = 0; j < k->n; j++) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, k->ino[j]);

		if (!e || e->state != EFS_LOCKTAB_RELEASING)
			continue;
		if (ok && e->rel_to == EFS_LOCK_SHARED) {
			downgraded(lc, e);
		} else if (ok) {
			efs_log_debug("lock: inode %" PRIu64 ": released", e->ino);
			remove_entry(lc, e);
			lc->stats.releases++;
		} else {
			/* The guard failed: the session is being replaced and
			 * forgets every lock; until then, nothing changes. */
			e->state = EFS_LOCKTAB_HELD;
			entry_changed(lc, e);
		}
	}
	if (ok)
		lc->stats.release_txns++;
	lcall_end(k);
	if (ok) {
		struct lref *ref = lref_get(lc->ref);

		release_start(lc);
		if (ref->lc)
			rwaiters_check(lc);
		lref_put(ref);
	}
}

static void release_all_check(struct efs_lockcache *lc, int status)
{
	void (*done)(int, void *) = lc->release_all_done;

	if (!lc->release_all)
		return;
	if (status == 0 && lc->tab.count > 0)
		return;
	lc->release_all = false;
	lc->release_all_done = NULL;
	if (done)
		done(status, lc->release_all_arg);
}

/*
 * Adds the direct grants of release |k| to |t| once every release of the
 * batch is in it: each grant is a nested transaction, which may use what
 * the outer one leaves of etcd's operation budget, and the outer one grows
 * by one operation per grant.
 */
static int release_grants(struct efs_lockcache *lc, struct efs_etcd_txn *t,
			  const struct lcall *k)
{
	const Etcdserverpb__TxnRequest *req = efs_etcd_txn_request(t);
	size_t g = 0, used;

	for (size_t j = 0; j < k->n; j++) {
		const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, k->ino[j]);

		if (e && e->state == EFS_LOCKTAB_RELEASING && e->mode == EFS_LOCK_EXCLUSIVE)
			g++;
	}
	used = req->n_success + g;
	if (used < req->n_compare)
		used = req->n_compare;
	if (g == 0 || used >= EFS_ETCD_TXN_MAX_OPS)
		return 0;
	for (size_t j = 0; j < k->n; j++) {
		const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, k->ino[j]);
		int r;

		if (!e || e->state != EFS_LOCKTAB_RELEASING || e->mode != EFS_LOCK_EXCLUSIVE)
			continue;
		r = add_grant(lc, t, e, (enum efs_lock_mode)e->rel_to, EFS_ETCD_TXN_MAX_OPS - used);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Sends the deletes of |k| (its inodes still RELEASING); takes |k|. A
 * downgrade replaces the exclusive key by a shared one. */
static void release_send(struct efs_lockcache *lc, struct lcall *k)
{
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO};
	struct efs_etcd_txn *t = NULL;
	size_t n = 0;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_session_guard(lc->s, t);
	for (size_t j = 0; r == 0 && j < k->n; j++) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, k->ino[j]);
		struct efs_meta_key hk;

		if (!e || e->state != EFS_LOCKTAB_RELEASING)
			continue;
		r = efs_meta_key_holder(&lc->ns, e->ino, meta_mode(e->mode),
					efs_session_node(lc->s), &hk);
		if (r == 0)
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, hk.buf, hk.len, NULL, 0,
						false);
		if (r == 0 && e->rel_to == EFS_LOCK_SHARED)
			r = put_holder(lc, t, e->ino, EFS_LOCK_SHARED, NULL);
		n++;
	}
	if (r == 0 && n > 0 && !k->no_grant)
		r = release_grants(lc, t, k);
	if (r == 0 && n == 0) {
		efs_etcd_txn_free(t);
		lcall_end(k);
		return;
	}
	if (r == 0)
		r = efs_etcd_txn(lc->c, efs_etcd_txn_request(t), &co, release_txn_done, k);
	efs_etcd_txn_free(t);
	if (r < 0) {
		/* Try again at the next tick (without grants). */
		efs_log_debug("lock: release: %s", strerror(-r));
		k->no_grant = true;
		lc->rel_retry = k;
		return;
	}
	lc->releasing = true;
}

/* The inodes and targets one release transaction carries. */
struct rel_batch {
	size_t n, ops, max_ops;
	uint64_t ino[EFS_ETCD_TXN_MAX_OPS]; /* each entry's target is its rel_to */
};

/*
 * Puts |e| into |b| to go down to |to| when it is ready, or starts its
 * preparation. |e| may be gone when this returns (ops run inline).
 */
/*
 * A preparation voided by this node's own operations is started again
 * only once they pause (PREP_QUIET_MS without a pin), for at most
 * PREP_QUIET_MAX_MS after the first was voided. Each preparation
 * invalidates the kernel's caches of the inode, and an invalidation that
 * lands while the kernel fetches attributes for a read makes it drop them
 * (its attribute version moved): the read then stops at the size the
 * kernel cached before. Repeating the invalidation after every request of
 * a reader on this node did exactly that, for as long as it read.
 */
#define PREP_QUIET_MS	  10
#define PREP_QUIET_MAX_MS 200

static bool prep_defer(struct efs_lockcache *lc, const struct efs_locktab_entry *e, uint64_t now)
{
	if (!e->voided_ns || now - e->voided_ns >= PREP_QUIET_MAX_MS * EFS_NSEC_PER_MSEC ||
	    now - e->last_used_ns >= PREP_QUIET_MS * EFS_NSEC_PER_MSEC)
		return false;
	/* The tick comes back when the pause would be long enough. */
	uv_timer_start(lc->tick, tick_cb, PREP_QUIET_MS, lc->period_ms);
	return true;
}

static void release_consider(struct efs_lockcache *lc, struct rel_batch *b,
			     struct efs_locktab_entry *e, enum efs_lock_mode to, bool urgent,
			     uint64_t now)
{
	size_t cost = to == EFS_LOCK_SHARED ? 2 : 1;

	if (e->state != EFS_LOCKTAB_HELD || e->pins || e->prep || e->mode <= (int)to)
		return;
	if (needs_prep(lc, e, urgent, now) && !is_prepared(e, to)) {
		if (prep_defer(lc, e, now))
			return;
		if (prep_start(lc, e, to, needs_inval(lc, e, urgent, now)) < 0)
			efs_log_debug("lock: inode %" PRIu64 ": no memory to prepare its release",
				      e->ino);
		return;
	}
	if (b->n >= EFS_ETCD_TXN_MAX_OPS || b->ops + cost > b->max_ops)
		return;
	b->ino[b->n] = e->ino;
	b->n++;
	b->ops += cost;
	e->state = EFS_LOCKTAB_RELEASING;
	e->rel_to = (uint8_t)to;
}

/* Starts one batched release if anything is due and none is in flight:
 * forced releases first, then idle locks and those over the bound. */
static void release_start(struct efs_lockcache *lc)
{
	struct efs_locktab_entry *sel[EFS_ETCD_TXN_MAX_OPS];
	uint64_t cand[EFS_ETCD_TXN_MAX_OPS];
	struct efs_locktab_sel s = {
		.now = now_ns(),
		.idle_ns = (uint64_t)lc->idle_ms * EFS_NSEC_PER_MSEC,
		.all = lc->release_all,
		.ignore_kcache = lc->release_all,
	};
	struct rel_batch b = {.max_ops = lc->release_batch};
	struct lref *ref;
	struct lcall *k;
	size_t n;

	if (lc->releasing)
		return;
	if (!efs_session_is_active(lc->s)) {
		if (lc->release_all && efs_session_state(lc->s) != EFS_SESSION_STARTING)
			release_all_check(lc, -EIO);
		return;
	}
	check_generation(lc);
	if (lc->rel_retry) {
		k = lc->rel_retry;
		lc->rel_retry = NULL;
		if (k->gen == lc->gen) {
			release_send(lc, k);
			return;
		}
		lcall_end(k);
	}
	ref = lref_get(lc->ref);
	/* Forced: the lowest target asked for each inode wins. Ops may run
	 * inline and change the table, so entries are found again by inode
	 * number after each step. */
	for (struct efs_list *wn = lc->rwaiters.next; wn != &lc->rwaiters && ref->lc;
	     wn = wn->next) {
		struct rwait *w = rwait_of(wn);
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, w->ino);

		if (e)
			recall_mark(lc, e); /* again after a failed preparation */
		if (e)
			release_consider(lc, &b, e, forced_target(lc, w->ino), true, s.now);
		/* An op run inline may have freed the cache (and |w|). */
		if (!ref->lc || b.ops >= b.max_ops)
			break;
	}
	if (!ref->lc) {
		lref_put(ref);
		return;
	}
	n = efs_locktab_select(&lc->tab, &s, sel, lc->release_batch);
	for (size_t j = 0; j < n; j++)
		cand[j] = sel[j]->ino;
	for (size_t j = 0; j < n && ref->lc && b.ops < b.max_ops; j++) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, cand[j]);

		if (e)
			release_consider(lc, &b, e, EFS_LOCK_NONE, lc->release_all, s.now);
	}
	if (!lref_put(ref))
		return;
	if (b.n == 0) {
		release_all_check(lc, 0);
		return;
	}
	k = lcall_new(lc, NULL, b.n);
	if (!k) {
		for (size_t j = 0; j < b.n; j++) {
			struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, b.ino[j]);

			if (e && e->state == EFS_LOCKTAB_RELEASING)
				e->state = EFS_LOCKTAB_HELD;
		}
		return;
	}
	for (size_t j = 0; j < b.n; j++)
		k->ino[j] = b.ino[j];
	release_send(lc, k);
}

static void recalls_check(struct efs_lockcache *lc, uint64_t now);

static void tick_cb(uv_timer_t *t)
{
	struct efs_lockcache *lc = t->data;
	struct efs_list *n;
	uint64_t now;
	struct lref *ref;

	if (!lc)
		return;
	recall_watch_start(lc);
	if (efs_session_is_active(lc->s))
		efs_deaths_tick(lc->deaths);
	now = now_ns();
	ref = lref_get(lc->ref);
	for (n = lc->acqs.next; n != &lc->acqs && ref->lc; n = n->next) {
		struct acq *a = acq_of(n);

		if (a->wait == AW_WATCH && a->wait_deadline_ns && now >= a->wait_deadline_ns) {
			efs_log_warn("lock: inode %" PRIu64 ": no holder answered our recall within "
				     "%" PRIu32 " ms: the operation fails (etcfsctl locks shows "
				     "who holds it)",
				     a->cur < a->req->n ? a->req->ino[a->cur] : 0,
				     lc->wait_timeout_ms);
			watchers_free(a);
			a->wait = AW_KICK;
			acq_finish(a, -ETIMEDOUT);
			break; /* the list may have changed: the next tick goes on */
		}
	}
	/* Blocked upgrades whose shared hold can now be given up. */
	for (n = lc->acqs.next; n != &lc->acqs && ref->lc && lc->n_draining; n = n->next) {
		struct acq *a = acq_of(n);
		struct efs_locktab_entry *e;

		if (a->wait != AW_WATCH || !a->up_blocked || a->yielding || a->cur >= a->req->n)
			continue;
		e = efs_locktab_find(&lc->tab, a->req->ino[a->cur]);
		if (e && e->owner == a && yieldable(e, now)) {
			watchers_free(a);
			a->wait = AW_KICK;
			kick_soon(lc);
		}
	}
	if (ref->lc)
		release_start(lc);
	if (ref->lc)
		recalls_check(lc, now);
	lref_put(ref);
}

/* ---- Recall: answering the recall keys of other nodes ---- */

/*
 * Every recall key of another node is kept here while it exists: a
 * listing of w/ when the watch starts, then one prefix watch on w/ for
 * puts and deletes, resumed by the stream after a reconnect, and listed
 * again after a compaction or a failed watch. A lock this node holds in a
 * mode that a recall key's waiter cannot share is released (or, for a
 * shared waiter, downgraded) through efs_lock_release_now, when the key
 * appears and whenever the lock is granted while keys for it exist: the
 * forced release then drains the lock, runs its ops and deletes the holder
 * key. Our own recall keys are never answered.
 */
struct recall {
	struct efs_list link;
	uint64_t ino;
	uint64_t seq;
	char node[EFS_META_NODE_MAX + 1];
	enum efs_lock_mode want;
	int64_t create_rev; /* orders its waiter among every node's */
	int64_t lease;	    /* the key's lease: the waiter's session */
	uint64_t gen;	    /* the waiter's session generation (its record) */
	uint64_t seen_ns;   /* when this node first saw it (monotonic) */
	bool reported;	    /* logged and counted as unanswered */
};

/* The create revision of the oldest recall key of a peer on |ino| (0:
 * none known). */
/*
 * A recall key created before the hold's grant compared every such key
 * away: it is gone, only its delete event is late. Answering it anyway
 * released the lock again and again to this node's own next requests
 * (each release invalidating the kernel's caches) until the event came.
 */
static bool recall_stale(const struct efs_locktab_entry *e, const struct recall *rc)
{
	return rc->create_rev > 0 && rc->create_rev < e->recall_floor;
}

static int64_t oldest_recall_rev(const struct efs_lockcache *lc, uint64_t ino)
{
	const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino);
	const struct efs_list *n;
	int64_t best = 0;

	efs_list_for_each(n, &lc->recalls) {
		const struct recall *rc = efs_list_entry(n, struct recall, link);

		if (rc->ino == ino && rc->create_rev > 0 && !(e && recall_stale(e, rc)) &&
		    (!best || rc->create_rev < best))
			best = rc->create_rev;
	}
	return best;
}

/* When recall |rc| is past the bound (recall_bound_ms). */
static uint64_t recall_due(const struct efs_lockcache *lc, const struct recall *rc)
{
	return rc->seen_ns + (uint64_t)lc->recall_bound_ms * EFS_NSEC_PER_MSEC;
}

/* recalls_check looks again at |due| (now: at the next tick). */
static void recalls_due_at(struct efs_lockcache *lc, uint64_t due)
{
	if (due < lc->recalls_due_ns)
		lc->recalls_due_ns = due;
}

/* Logs the acquisitions that pin |e| while they wait for another lock
 * (what keeps a recall of |e| from being answered). */
static void pinners_log(const struct efs_lockcache *lc, const struct efs_locktab_entry *e)
{
	const struct efs_list *n;

	efs_list_for_each(n, &lc->acqs) {
		const struct acq *a = efs_list_entry(n, struct acq, link);

		if (!acq_pins(a, e))
			continue;
		efs_log_warn("lock: inode %" PRIu64 ": pinned by an acquisition waiting (%d) for "
			     "inode %" PRIu64 " (its recall key revision %" PRId64 "%s%s), the oldest "
			     "recall of the pinned lock at revision %" PRId64,
			     e->ino, (int)a->wait,
			     a->cur < a->req->n ? a->req->ino[a->cur] : (uint64_t)0, a->recall_rev,
			     a->local_wait ? ", a local wait" : "",
			     a->yield_asked ? ", asked to give way" : "",
			     oldest_recall_rev(lc, e->ino));
	}
}

/*
 * A recall of a lock this node still holds in a mode the waiter cannot
 * share, past the bound (recall_bound_ms): logged once
 * with what keeps it, and counted (etcfs_lock_recalls_unanswered_total).
 * The release goes on; this only says that a peer waits for us.
 * Walks the recalls only when one comes due (recalls_due_ns); one past the
 * bound on a lock this node does not hold then is looked at again when
 * this node is granted that lock (recall_apply).
 */
static void recalls_check(struct efs_lockcache *lc, uint64_t now)
{
	struct efs_list *n;

	if (now < lc->recalls_due_ns)
		return;
	lc->recalls_due_ns = UINT64_MAX;
	efs_list_for_each(n, &lc->recalls) {
		struct recall *rc = efs_list_entry(n, struct recall, link);
		const struct efs_locktab_entry *e;

		if (rc->reported)
			continue;
		if (now < recall_due(lc, rc)) {
			recalls_due_at(lc, recall_due(lc, rc));
			continue;
		}
		e = efs_locktab_find(&lc->tab, rc->ino);
		if (!e || e->mode == EFS_LOCK_NONE || recall_stale(e, rc) ||
		    (rc->want == EFS_LOCK_SHARED && e->mode == EFS_LOCK_SHARED))
			continue;
		rc->reported = true;
		lc->stats.recalls_unanswered++;
		efs_log_warn("lock: inode %" PRIu64 ": node %s's recall is not answered after %" PRIu64
			     " s (key revision %" PRId64 ", held %s, kind %u, %" PRIu32
			     " pins, state %d%s%s%s)",
			     rc->ino, rc->node, (uint64_t)((now - rc->seen_ns) / EFS_NSEC_PER_SEC),
			     rc->create_rev,
			     e->mode == EFS_LOCK_EXCLUSIVE ? "exclusive" : "shared", kind_of(lc, e),
			     e->pins, (int)e->state,
			     !e->prep		     ? ""
			     : e->prep_stage == 1 ? ", its kernel invalidation waits"
			     : e->prep_stage == 2 ? ", its publication waits"
						  : ", preparing",
			     e->recalled ? ", drained" : "", e->prepared ? ", prepared" : "");
		pinners_log(lc, e);
	}
}

static struct recall *recall_find(struct efs_lockcache *lc, const struct efs_meta_key_info *ki)
{
	struct efs_list *n;

	efs_list_for_each (n, &lc->recalls) {
		struct recall *rc = efs_list_entry(n, struct recall, link);

		if (rc->ino == ki->ino && rc->seq == ki->num && strcmp(rc->node, ki->node) == 0)
			return rc;
	}
	return NULL;
}

static void recalls_clear(struct efs_lockcache *lc)
{
	struct efs_list *n;

	while ((n = efs_list_pop(&lc->recalls)))
		efs_mem_free(efs_list_entry(n, struct recall, link));
}

static void recall_done(void *arg, int status)
{
	(void)arg;
	(void)status;
}

/* ---- The minimum hold (lock/heat.h) ---- */

static void hold_timer_cb(uv_timer_t *t)
{
	struct efs_lockcache *lc = t->data;
	struct efs_list *n;
	struct lref *ref;

	if (!lc)
		return;
	lc->hold_due_ns = UINT64_MAX;
	ref = lref_get(lc->ref);
	for (n = lc->recalls.next; n != &lc->recalls;) {
		uint64_t ino = efs_list_entry(n, struct recall, link)->ino;

		n = n->next;
		recall_apply(lc, ino);
		if (!ref->lc)
			break;
	}
	lref_put(ref);
}

/* recall_apply runs again for every known recall at |due| (or earlier). */
static void recall_hold_at(struct efs_lockcache *lc, uint64_t due)
{
	uint64_t now = now_ns();

	if (due >= lc->hold_due_ns)
		return;
	lc->hold_due_ns = due;
	uv_timer_start(lc->hold_timer, hold_timer_cb,
		       due > now ? (due - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC : 0, 0);
}

/* A lock was unpinned: one whose recall waits for its hold is idle after
 * the idle gap, and an idle lock is not kept for the hold's sake. */
static void recall_hold_again(struct efs_lockcache *lc)
{
	if (lc->hold_due_ns != UINT64_MAX)
		recall_hold_at(lc, now_ns() + EFS_HEAT_IDLE_GAP_NS);
}

/*
 * Whether the recall of |e| waits for the minimum hold of its grant: until
 * then the lock is neither drained nor released, so this node's next
 * operations still find it (a lock handed over once per operation costs
 * each side a commit per operation). The hold never passes max_hold_ms
 * after the grant, so a peer's wait stays bounded, and the timer answers
 * the recall when it ends; a contended lock gets none.
 */
static bool hold_defers(struct efs_lockcache *lc, struct efs_locktab_entry *e, uint64_t now)
{
	uint64_t due = efs_heat_recall_due(&lc->heat, e->ino, e->granted_ns, e->last_used_ns,
					   e->pins > 0, now);

	if (e->recalled || now >= due) {
		e->hold_deferred = false;
		return false;
	}
	if (!e->hold_deferred)
		lc->stats.recalls_deferred++;
	e->hold_deferred = true;
	recall_hold_at(lc, due);
	return true;
}

/* Releases or downgrades |ino|'s lock when a recall key asks for it. */
static void recall_apply(struct efs_lockcache *lc, uint64_t ino)
{
	enum efs_lock_mode to = EFS_LOCK_EXCLUSIVE;
	struct efs_locktab_entry *e;
	struct efs_list *n;
	uint64_t now = now_ns();

	e = efs_locktab_find(&lc->tab, ino);
	if (!e || e->mode == EFS_LOCK_NONE)
		return;
	efs_list_for_each (n, &lc->recalls) {
		struct recall *rc = efs_list_entry(n, struct recall, link);

		if (rc->ino != ino || recall_stale(e, rc))
			continue;
		if (!rc->reported && now >= recall_due(lc, rc))
			recalls_due_at(lc, now); /* held now: reported if it stays */
		if (rc->want == EFS_LOCK_EXCLUSIVE)
			to = EFS_LOCK_NONE;
		else if (to == EFS_LOCK_EXCLUSIVE)
			to = EFS_LOCK_SHARED;
	}
	if (to == EFS_LOCK_SHARED && no_shared(lc, e))
		to = EFS_LOCK_NONE;
	if (e->mode <= (int)to)
		e->hold_deferred = false; /* the recall went (cancelled, say) */
	if (lc->recall_off || e->mode <= (int)to)
		return;
	efs_list_for_each(n, &lc->rwaiters)
		if (rwait_of(n)->ino == ino && rwait_of(n)->to <= to)
			return; /* asked already */
	if (!e->heat_noted) {
		e->heat_noted = true;
		efs_heat_note_recall(&lc->heat, ino, e->granted_ns, now,
				     e->pins > 0 || now < e->last_used_ns + EFS_HEAT_IDLE_GAP_NS);
	}
	if (hold_defers(lc, e, now))
		return;
	lc->stats.recalls++;
	efs_log_debug("lock: inode %" PRIu64 ": recalled, %s", ino,
		      to == EFS_LOCK_NONE ? "releasing" : "downgrading");
	if (efs_lock_release_now(lc, ino, to, recall_done, NULL) < 0)
		efs_log_warn("lock: inode %" PRIu64 ": no memory to answer a recall", ino);
}

/* A put (|put|) or delete of key |kv| under w/. */
static void recall_event(struct efs_lockcache *lc, const Mvccpb__KeyValue *kv, bool put)
{
	struct efs_meta_key_info ki;
	Etcfs__LockWaiter *w = NULL;
	struct efs_locktab_entry *e;
	struct recall *rc;

	if (efs_meta_key_parse(&lc->ns, kv->key.data, kv->key.len, &ki) < 0 ||
	    ki.family != EFS_META_K_RECALL || strcmp(ki.node, efs_session_node(lc->s)) == 0)
		return;
	rc = recall_find(lc, &ki);
	if (!put) {
		if (rc) {
			efs_list_del(&rc->link);
			efs_mem_free(rc);
			e = efs_locktab_find(&lc->tab, ki.ino);
			if (e && e->hold_deferred)
				recall_apply(lc, ki.ino); /* caching may resume */
		}
		return;
	}
	if (!rc) {
		rc = efs_mem_calloc(1, sizeof(*rc));
		if (!rc) {
			efs_log_warn("lock: no memory to note a recall of inode %" PRIu64, ki.ino);
			return;
		}
		rc->ino = ki.ino;
		rc->seq = ki.num;
		rc->create_rev = kv->create_revision;
		rc->lease = kv->lease;
		rc->seen_ns = now_ns();
		memcpy(rc->node, ki.node, sizeof(rc->node));
		efs_list_add_tail(&lc->recalls, &rc->link);
		recalls_due_at(lc, recall_due(lc, rc));
	}
	/* A waiter record that does not decode asks for everything. */
	rc->want = EFS_LOCK_EXCLUSIVE;
	if (efs_meta_waiter_decode(kv->value.data, kv->value.len, &w, NULL) == 0) {
		rc->gen = w->session_generation;
		if (w->mode == EFS_META_LOCK_SHARED)
			rc->want = EFS_LOCK_SHARED;
	}
	efs_meta_record_free(w);
	/* Recalled already: this recall may be older than those known, and
	 * an acquisition that pins the lock gives way to an older one only
	 * (pinned_recalled). Else recall_apply marks it, which scans. */
	e = efs_locktab_find(&lc->tab, ki.ino);
	if (e && e->recalled)
		yield_scan(lc, e);
	if (e && e->pins && lc->wanted_fn)
		lc->wanted_fn(lc->wanted_arg, ki.ino); /* may not touch |e| */
	recall_apply(lc, ki.ino);
}

static void recall_watch_cb(struct efs_etcd_watcher *w, int status,
			    const struct efs_etcd_watch_update *u, void *arg)
{
	struct efs_lockcache *lc = arg;

	(void)w;
	if (u->kind == EFS_ETCD_WATCH_EVENTS) {
		for (size_t i = 0; i < u->n_events; i++) {
			const Mvccpb__Event *ev = u->events[i];

			if (ev->kv)
				recall_event(lc, ev->kv, ev->type == MVCCPB__EVENT__EVENT_TYPE__PUT);
		}
		return;
	}
	if (u->kind != EFS_ETCD_WATCH_COMPACTED && u->kind != EFS_ETCD_WATCH_CANCELED)
		return;
	/* Events were lost (or the watch ended): list again from the tick. */
	efs_log_debug("lock: the recall watch ended (%d): listing recall keys again", status);
	lc->rw = efs_etcd_watcher_free(lc->rw);
	recalls_clear(lc);
}

static void recall_list_cb(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp,
			   void *arg)
{
	struct lcall *k = arg;
	struct efs_lockcache *lc = lcall_end(k);
	struct efs_meta_range rg;
	int e;

	if (!lc)
		return;
	lc->rw_listing = false;
	if (r->err < 0) {
		efs_log_debug("lock: listing recall keys: %s", r->message);
		return; /* the tick tries again */
	}
	recalls_clear(lc);
	for (size_t i = 0; i < resp->n_kvs; i++)
		recall_event(lc, resp->kvs[i], true);
	e = efs_meta_range_family(&lc->ns, EFS_META_K_RECALL, &rg);
	if (e == 0)
		e = efs_lock__watch_range(lc->c, &lc->ws, &rg,
					  resp->header ? resp->header->revision + 1 : 0, false,
					  recall_watch_cb, lc, &lc->rw);
	if (e < 0) {
		efs_log_warn("lock: cannot watch recall keys: %s", strerror(-e));
		recalls_clear(lc);
	}
}

/* Lists the recall keys and starts the watch, unless it runs. */
static void recall_watch_start(struct efs_lockcache *lc)
{
	struct efs_meta_range rg;
	struct efs_etcd_range_opts o = {0};
	struct efs_etcd_callopts co = {.channel = EFS_ETCD_CH_PRIO};
	struct lcall *k;
	int r;

	if (lc->rw || lc->rw_listing || !efs_session_is_active(lc->s))
		return;
	r = efs_meta_range_family(&lc->ns, EFS_META_K_RECALL, &rg);
	if (r < 0)
		return;
	k = lcall_new(lc, NULL, 0);
	if (!k)
		return;
	o.range_end = rg.end.buf;
	o.range_end_len = rg.end.len;
	r = efs_etcd_range(lc->c, rg.key.buf, rg.key.len, &o, &co, recall_list_cb, k);
	if (r < 0) {
		lcall_end(k);
		return;
	}
	lc->rw_listing = true;
}

/* ---- Direct grant ---- */

/*
 * A transaction that gives up an exclusive hold (a release, a downgrade,
 * or either riding a publication) also grants the lock to the oldest
 * waiter of another node, so a handover costs one commit, not two (the
 * release, then the waiter's acquisition). It adds to its success branch:
 *   a nested transaction
 *     compares  per waiter granted: its recall key still has the create
 *               revision and the lease we saw (it still waits, on that
 *               lease; a revoked lease took the key with it);
 *     success   per waiter: put its holder key (the key and record its
 *               own acquisition would put, on its lease), delete its
 *               recall key;
 *     failure   nothing: the release commits alone, and the waiters
 *               retry at the delete of our holder key, as without grants.
 * etcd checks a put's lease only on the branch that runs, so a waiter
 * whose session ended never fails the release. Whom: the waiter with the
 * oldest recall key (the order its acquisition compares); when it wants
 * a shared lock, every shared waiter queued before the first exclusive
 * one too, as far as |room| (etcd's operation budget left to the nested
 * transaction) goes. An exclusive waiter is granted only by a release to
 * none, shared ones by a release or a downgrade: what our holder key
 * after the transaction allows. Our own node's recall keys are not in
 * the list (never answered, never granted). The waiter learns it from
 * the put of its holder key (watch_cb), or hands it back (cleanup_done).
 * Returns how many waiters it granted (their recall keys' create
 * revisions are compared, so none twice).
 */
#define GRANT_MAX 32

static bool grant_candidate(const struct efs_locktab_entry *e, const struct recall *rc)
{
	return rc->ino == e->ino && rc->create_rev > 0 && rc->lease != 0 && !recall_stale(e, rc);
}

static bool grant_picked(const struct recall *const *pick, size_t np, const struct recall *rc)
{
	for (size_t j = 0; j < np; j++)
		if (strcmp(pick[j]->node, rc->node) == 0)
			return true;
	return false;
}

static int add_grant(struct efs_lockcache *lc, struct efs_etcd_txn *t,
		     const struct efs_locktab_entry *e, enum efs_lock_mode to, size_t room)
{
	const struct recall *pick[GRANT_MAX];
	const struct recall *first = NULL;
	int64_t x_rev = INT64_MAX;
	struct efs_etcd_txn *in = NULL;
	struct efs_meta_key wk;
	const struct efs_list *n;
	size_t np = 0, max = room > 0 ? (room - 1) / 2 : 0;
	int r;

	if (lc->grant_off || e->mode != EFS_LOCK_EXCLUSIVE || to == EFS_LOCK_EXCLUSIVE)
		return 0;
	if (max > GRANT_MAX)
		max = GRANT_MAX;
	efs_list_for_each(n, &lc->recalls) {
		const struct recall *rc = efs_list_entry(n, struct recall, link);

		if (!grant_candidate(e, rc))
			continue;
		if (!first || rc->create_rev < first->create_rev)
			first = rc;
		if (rc->want == EFS_LOCK_EXCLUSIVE && rc->create_rev < x_rev)
			x_rev = rc->create_rev;
	}
	if (!first || max == 0 || (first->want == EFS_LOCK_EXCLUSIVE && to != EFS_LOCK_NONE))
		return 0;
	pick[np++] = first;
	while (first->want == EFS_LOCK_SHARED && np < max) {
		const struct recall *next = NULL;

		efs_list_for_each(n, &lc->recalls) {
			const struct recall *rc = efs_list_entry(n, struct recall, link);

			if (grant_candidate(e, rc) && rc->want == EFS_LOCK_SHARED &&
			    rc->create_rev > pick[np - 1]->create_rev && rc->create_rev < x_rev &&
			    !grant_picked(pick, np, rc) &&
			    (!next || rc->create_rev < next->create_rev))
				next = rc;
		}
		if (!next)
			break;
		pick[np++] = next;
	}
	r = efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &in);
	/* Only a lock we hold when the transaction applies (compares see the
	 * state before any of its operations): our exclusive key. */
	if (r == 0)
		r = efs_meta_key_holder(&lc->ns, e->ino, EFS_META_LOCK_EXCLUSIVE,
					efs_session_node(lc->s), &wk);
	if (r == 0)
		r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, wk.buf, wk.len,
					 efs_session_lease_id(lc->s));
	/* Every compare first: a failure part way leaves a guarded remnant. */
	for (size_t j = 0; r == 0 && j < np; j++) {
		r = efs_meta_key_recall(&lc->ns, e->ino, pick[j]->seq, pick[j]->node, &wk);
		if (r == 0)
			r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL,
						 wk.buf, wk.len, pick[j]->create_rev);
		if (r == 0)
			r = efs_etcd_txn_compare(in, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, wk.buf,
						 wk.len, pick[j]->lease);
	}
	for (size_t j = 0; r == 0 && j < np; j++) {
		/* The put first: one the caller's transaction refuses (a
		 * delete of the inode's holder keys in it) leaves nothing. */
		r = holder_put(lc, in, e->ino, pick[j]->want, pick[j]->node, pick[j]->gen,
			       pick[j]->lease, NULL);
		if (r == 0)
			r = efs_meta_key_recall(&lc->ns, e->ino, pick[j]->seq, pick[j]->node, &wk);
		if (r == 0)
			r = efs_etcd_txn_delete(in, EFS_ETCD_TXN_SUCCESS, wk.buf, wk.len, NULL, 0,
						false);
	}
	if (r < 0) {
		efs_log_debug("lock: inode %" PRIu64 ": no direct grant: %s", e->ino, strerror(-r));
		return r;
	}
	efs_log_debug("lock: inode %" PRIu64 ": its release grants it to %zu waiter(s), first %s",
		      e->ino, np, first->node);
	return (int)np;
}

/*
 * The recall key of an acquisition that ended (cancelled, interrupted,
 * timed out, given way) is deleted by a CL_RECALL cleanup, which also reads
 * our holder keys of |ino| (|resp|: its reply): a release may have granted
 * us the lock before the delete (after it, the grant's compare fails).
 * Unless an acquisition of ours is in progress (it owns the inode's entry,
 * and its transaction finds the key ours) or our entry holds that mode
 * already (the key is the one it holds), nothing here will ever use the
 * key: so it is deleted at once (a CL_GIVE_BACK cleanup), never left on
 * our lease unused while a peer may wait behind it; the peer's watch sees
 * the delete. An entry that holds less counts as none: an upgrade that
 * gave way keeps its shared hold and entry, and an exclusive key granted
 * to it then was never released by anything (recalls ask the entry for
 * what it holds), so the peers behind it waited until their own timeout.
 * What the reply read may be old by the time it arrives: the grant may
 * have been accepted, used and released meanwhile, and a new hold put a
 * key again. So the delete compares the key's create revision (the grant
 * it saw) and nothing else is done in our lock table: turning that read
 * into a held entry made a release of a key already gone, whose
 * publication failed its guard and left the entry held here for ever
 * (the three-node ping-pong hung on it).
 */
static void orphan_grant(struct efs_lockcache *lc, uint64_t ino,
			 const Etcdserverpb__TxnResponse *resp)
{
	for (size_t i = 1; i <= 2; i++) {
		Etcdserverpb__RangeResponse *rg = NULL;

		if (efs_etcd_txn_resp_range(resp, i, &rg) < 0)
			continue;
		enum efs_lock_mode keep = i == 1 ? EFS_LOCK_EXCLUSIVE : EFS_LOCK_SHARED;

		for (size_t j = 0; j < rg->n_kvs; j++) {
			const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino);
			struct lcall *k;

			if (rg->kvs[j]->lease != efs_session_lease_id(lc->s) ||
			    (e && (e->owner || e->mode >= (int)keep)))
				continue;
			k = lcall_new(lc, NULL, 0);
			if (!k) {
				efs_log_err("lock: no memory to give back the lock of inode %" PRIu64
					    " granted after its wait ended: it stays until the "
					    "session ends",
					    ino);
				return;
			}
			k->kind = CL_GIVE_BACK;
			k->c_ino = ino;
			k->keep = keep;
			k->c_rev = rg->kvs[j]->create_revision;
			lc->stats.grants_returned++;
			efs_log_debug("lock: inode %" PRIu64 ": granted after its wait ended "
				      "(key revision %" PRId64 "): giving it back",
				      ino, k->c_rev);
			cleanup_start(lc, k);
		}
	}
}

/* Counts the waiters that |resp|'s nested grants (add_grant) granted. */
static void grants_count(struct efs_lockcache *lc, const Etcdserverpb__TxnResponse *resp)
{
	for (size_t i = 0; i < resp->n_responses; i++) {
		const Etcdserverpb__ResponseOp *op = resp->responses[i];

		if (op->response_case == ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN &&
		    op->response_txn && op->response_txn->succeeded)
			lc->stats.direct_grants += op->response_txn->n_responses / 2;
	}
}

#if EFS_FAULT_HOOKS
void efs_lockcache_fault_no_recall(struct efs_lockcache *lc, bool off)
{
	lc->recall_off = off;
}

void efs_lockcache_fault_no_grant(struct efs_lockcache *lc, bool off)
{
	lc->grant_off = off;
}
#endif

/* ---- Public ---- */

void efs_lockcache_set_handover_cb(struct efs_lockcache *lc, efs_lock_recall_wait_cb cb,
				   void *arg)
{
	lc->handover_cb = cb;
	lc->handover_arg = arg;
}

void efs_lockcache_set_recall_wait_cb(struct efs_lockcache *lc, efs_lock_recall_wait_cb cb,
				      void *arg)
{
	lc->recall_wait_cb = cb;
	lc->recall_wait_arg = arg;
}

void efs_lockcache_set_peer_gone_cb(struct efs_lockcache *lc, efs_lock_peer_gone_cb cb,
				    void *arg)
{
	efs_deaths_set_peer_cb(lc->deaths, cb, arg);
}

int efs_lockcache_new(struct efs_lockcache **ret, uv_loop_t *loop, struct efs_etcd *c,
		      struct efs_session *s, const struct efs_lockcache_opts *o)
{
	struct efs_lockcache *lc;
	uint64_t period;
	int r;

	if (!ret || !loop || !c || !s || !o)
		return -EINVAL;
	lc = efs_mem_calloc(1, sizeof(*lc));
	if (!lc)
		return -ENOMEM;
	lc->loop = loop;
	lc->c = c;
	lc->s = s;
	lc->ns = o->ns ? *o->ns : *efs_session_ns(s);
	lc->max_cached = o->max_cached ? o->max_cached : 65536;
	lc->idle_ms = o->idle_ms ? o->idle_ms : 30000;
	lc->release_batch = o->release_batch ? o->release_batch : 64;
	if (lc->release_batch > EFS_ETCD_TXN_MAX_OPS - 2)
		lc->release_batch = EFS_ETCD_TXN_MAX_OPS - 2;
	lc->wait_timeout_ms = o->wait_timeout_ms;
	lc->recall_bound_ms = o->recall_bound_ms ? o->recall_bound_ms : 30000;
	efs_heat_init(&lc->heat,
		      o->max_hold_ms == EFS_LOCK_HOLD_OFF ? 0
		      : (uint64_t)(o->max_hold_ms ? o->max_hold_ms : EFS_LOCK_HOLD_DEFAULT_MS) *
			      EFS_NSEC_PER_MSEC,
		      o->contended_recalls == EFS_LOCK_HOLD_OFF ? 0
		      : o->contended_recalls			? o->contended_recalls
								: EFS_LOCK_CONTENDED_DEFAULT);
	lc->hold_due_ns = UINT64_MAX;
	lc->yield_due_ns = UINT64_MAX;
	{
		struct efs_deaths_opts dopts = {
			.ns = &lc->ns,
			.self = efs_session_node(s),
			.grace_ms = o->takeover_grace_ms,
		};

		r = efs_deaths_new(&lc->deaths, loop, c, &dopts);
		if (r < 0) {
			efs_mem_free(lc);
			return r;
		}
		/* Now rather than at the first tick: the first frees ask it. */
		if (efs_session_is_active(s))
			efs_deaths_start(lc->deaths);
	}
	efs_list_init(&lc->acqs);
	efs_list_init(&lc->recalls);
	efs_list_init(&lc->rwaiters);
	lc->recalls_due_ns = UINT64_MAX;
	lc->gen = efs_session_generation(s);
	r = efs_locktab_init(&lc->tab, lc->max_cached);
	if (r < 0)
		goto fail;
	r = -ENOMEM;
	lc->ref = efs_mem_calloc(1, sizeof(*lc->ref));
	if (!lc->ref)
		goto fail;
	lc->ref->lc = lc;
	lc->ref->refs = 1;
	lc->tick = efs_timer_new(lc->loop, lc);
	lc->kick = efs_timer_new(lc->loop, lc);
	lc->retry = efs_timer_new(lc->loop, lc);
	lc->rwake = efs_timer_new(lc->loop, lc);
	lc->hold_timer = efs_timer_new(lc->loop, lc);
	lc->yield_timer = efs_timer_new(lc->loop, lc);
	if (!lc->tick || !lc->kick || !lc->retry || !lc->rwake || !lc->hold_timer ||
	    !lc->yield_timer)
		goto fail;
	period = lc->idle_ms / 4;
	if (period < TICK_MIN_MS)
		period = TICK_MIN_MS;
	if (period > TICK_MAX_MS)
		period = TICK_MAX_MS;
	lc->period_ms = period;
	uv_timer_start(lc->tick, tick_cb, period, period);
	*ret = lc;
	return 0;
fail:
	efs_lockcache_free(lc);
	return r;
}

int efs_lockcache_release_all(struct efs_lockcache *lc, void (*done)(int status, void *arg),
			      void *arg)
{
	if (!lc || !done)
		return -EINVAL;
	if (lc->release_all)
		return -EALREADY;
	lc->release_all = true;
	lc->release_all_done = done;
	lc->release_all_arg = arg;
	/* Runs from the timer, so |done| is never called inline. */
	uv_timer_start(lc->tick, tick_cb, 0, lc->period_ms);
	return 0;
}

void efs_lockcache_forget_all(struct efs_lockcache *lc)
{
	struct efs_list *n;

	if (!lc)
		return;
	efs_locktab_remove_all(&lc->tab);
	lc->n_draining = 0;
	/* Forced releases end: the locks went with the session. */
	efs_list_for_each(n, &lc->rwaiters)
		rwait_of(n)->status = -EIO;
	rwake_soon(lc);
	efs_list_for_each(n, &lc->acqs) {
		struct acq *a = acq_of(n);

		if (a->wait == AW_WATCH) {
			/* Our recall key went with the lease. */
			watchers_free(a);
			a->recall_seq = 0;
			a->recall_rev = 0;
			a->recall_ns = 0;
			a->wait = AW_KICK;
		}
	}
	entry_changed(lc, NULL);
	kick_soon(lc);
}

struct efs_lockcache *efs_lockcache_free(struct efs_lockcache *lc)
{
	if (!lc)
		return NULL;
	while (lc->acqs.next && !efs_list_empty(&lc->acqs)) {
		struct acq *a = acq_of(lc->acqs.next);

		acq_release_resources(a, false);
		a->req->priv = NULL;
		efs_list_del(&a->link);
		efs_mem_free(a);
	}
	if (lc->rel_retry)
		lcall_end(lc->rel_retry);
	/* Cleanups in flight end in their callbacks (they see no cache). */
	while (lc->cleanups) {
		struct lcall *k = lc->cleanups;

		lc->cleanups = k->c_next;
		if (k->waiting)
			lcall_end(k);
	}
	lc->rw = efs_etcd_watcher_free(lc->rw);
	recalls_clear(lc);
	lc->ws = efs_etcd_watch_stream_free(lc->ws);
	lc->deaths = efs_deaths_free(lc->deaths);
	lc->tick = efs_timer_free(lc->tick);
	lc->kick = efs_timer_free(lc->kick);
	lc->retry = efs_timer_free(lc->retry);
	lc->rwake = efs_timer_free(lc->rwake);
	lc->hold_timer = efs_timer_free(lc->hold_timer);
	lc->yield_timer = efs_timer_free(lc->yield_timer);
	while (lc->rwaiters.next && !efs_list_empty(&lc->rwaiters))
		efs_mem_free(rwait_of(efs_list_pop(&lc->rwaiters)));
	efs_locktab_done(&lc->tab);
	if (lc->ref) {
		lc->ref->lc = NULL;
		lref_put(lc->ref);
	}
	efs_mem_free(lc);
	return NULL;
}

static int check_req(const struct efs_lock_req *req)
{
	if (!req || !req->cb || req->n == 0 || req->n > EFS_LOCK_REQ_MAX)
		return -EINVAL;
	for (size_t i = 0; i < req->n; i++) {
		if (req->ino[i] == 0)
			return -EINVAL;
		if (req->mode[i] != EFS_LOCK_SHARED && req->mode[i] != EFS_LOCK_EXCLUSIVE)
			return -EINVAL;
	}
	return 0;
}

/* A new acquisition of |req|, listed: inodes in order, duplicates merged
 * into their first index with the stronger mode. */
static struct acq *acq_new(struct efs_lockcache *lc, struct efs_lock_req *req)
{
	struct acq *a = efs_mem_calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	a->req = req;
	a->lc = lc;
	a->cur = SIZE_MAX;
	for (size_t i = 0; i < req->n; i++) {
		req->recs[i] = NULL;
		a->order[i] = i;
		a->want[i] = req->mode[i];
	}
	/* Inode order: an insertion sort of at most EFS_LOCK_REQ_MAX. */
	for (size_t i = 1; i < req->n; i++) {
		size_t v = a->order[i], j = i;

		while (j > 0 && req->ino[a->order[j - 1]] > req->ino[v]) {
			a->order[j] = a->order[j - 1];
			j--;
		}
		a->order[j] = v;
	}
	for (size_t j = 0, first = a->order[0]; j < req->n; j++) {
		size_t i = a->order[j];

		if (j == 0 || req->ino[i] != req->ino[first]) {
			first = i;
			continue;
		}
		a->dup[i] = true;
		if (a->want[i] > a->want[first])
			a->want[first] = a->want[i];
	}
	efs_list_add_head(&lc->acqs, &a->link);
	req->priv = a;
	return a;
}

/* |a| is served from the cache: every entry is held in the mode wanted. */
static int acq_hit(struct acq *a, uint64_t now)
{
	struct efs_lockcache *lc = a->lc;
	struct efs_lock_req *req = a->req;

	for (size_t i = 0; i < req->n; i++)
		if (!a->dup[i])
			pin_mode(lc, efs_locktab_find(&lc->tab, req->ino[i]), req->mode[i], now);
	for (size_t i = 0; i < req->n; i++)
		if (!a->dup[i])
			a->pinned[i] = efs_locktab_find(&lc->tab, req->ino[i]);
	for (size_t i = 0; i < req->n; i++)
		req->grant[i] = efs_locktab_find(&lc->tab, req->ino[i])->grant;
	a->wait = AW_DONE;
	lc->stats.hits++;
	return 1;
}

int efs_lock_acquire(struct efs_lockcache *lc, struct efs_lock_req *req)
{
	struct acq *a;
	bool hit = true;
	uint64_t now = now_ns();
	int r;

	r = check_req(req);
	if (r < 0 || !lc)
		return r < 0 ? r : -EINVAL;
	a = acq_new(lc, req);
	if (!a)
		return -ENOMEM;
	if (efs_session_is_active(lc->s)) {
		check_generation(lc);
		a->gen = lc->gen;
		for (size_t i = 0; i < req->n && hit; i++) {
			struct efs_locktab_entry *e;

			if (a->dup[i])
				continue;
			e = efs_locktab_find(&lc->tab, req->ino[i]);
			hit = e && e->mode >= (int)a->want[i] && hit_ok(a, e);
		}
	} else {
		hit = false;
	}
	if (hit)
		return acq_hit(a, now);
	a->gen = lc->gen;
	a->wait = AW_KICK;
	kick_soon(lc);
	return 0;
}

int efs_lock_acquire_under(struct efs_lockcache *lc, const struct efs_lock_req *held,
			   struct efs_lock_req *req)
{
	const struct acq *h = held ? held->priv : NULL;
	struct acq *a;
	int r;

	r = check_req(req);
	if (r < 0 || !lc || !h || h->wait != AW_DONE)
		return r < 0 ? r : -EINVAL;
	/* A session lost since |held| was pinned took its locks along. */
	if (!efs_session_is_active(lc->s))
		return -EIO;
	check_generation(lc);
	if (h->gen != lc->gen)
		return -EIO;
	for (size_t i = 0; i < req->n; i++) {
		const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, req->ino[i]);
		bool covered = false;

		/* A pinned entry keeps its mode: a release or downgrade waits
		 * for the pins. */
		for (size_t j = 0; e && j < held->n && !covered; j++)
			covered = h->pinned[j] == e && h->want[j] >= req->mode[i] &&
				  e->mode >= (int)req->mode[i];
		if (!covered)
			return -EINVAL;
	}
	a = acq_new(lc, req);
	if (!a)
		return -ENOMEM;
	a->gen = lc->gen;
	for (size_t i = 0; i < req->n; i++) {
		const struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, req->ino[i]);

		if (e->draining)
			efs_log_debug("lock: inode %" PRIu64 ": pinned again under a pin while "
				      "an upgrade drains it", e->ino);
	}
	return acq_hit(a, now_ns());
}

int efs_lock_withdraw(struct efs_lockcache *lc, struct efs_lock_req *req)
{
	struct acq *a = req ? req->priv : NULL;

	if (!lc || !a)
		return -EINVAL;
	if (a->wait != AW_KICK || a->cur != SIZE_MAX || a->recall_seq || a->cancelled)
		return -EBUSY;
	for (size_t i = 0; i < EFS_LOCK_REQ_MAX; i++)
		if (a->pinned[i])
			return -EBUSY;
	efs_list_del(&a->link);
	efs_mem_free(a);
	req->priv = NULL;
	return 0;
}

void efs_lock_cancel(struct efs_lockcache *lc, struct efs_lock_req *req)
{
	struct acq *a = req ? req->priv : NULL;

	if (!lc || !a || a->wait == AW_DONE || a->cancelled)
		return;
	a->cancelled = true;
	acq_wake(lc, a); /* in a transaction: its answer sees the cancel */
}

/* Pins went (a request's, or one of efs_lock_pin_held): what waited for
 * them may go on. */
static void pins_dropped(struct efs_lockcache *lc)
{
	recall_hold_again(lc);
	if (!efs_list_empty(&lc->rwaiters) || lc->n_draining)
		release_kick(lc); /* a forced release or an upgrade may wait for this */
	else if (lc->max_cached && lc->tab.count > lc->max_cached)
		release_start(lc);
}

void efs_lock_put(struct efs_lockcache *lc, struct efs_lock_req *req)
{
	struct acq *a = req ? req->priv : NULL;

	if (!lc || !a || a->wait != AW_DONE)
		return;
	acq_release_resources(a, true);
	efs_list_del(&a->link);
	efs_mem_free(a);
	req->priv = NULL;
	pins_dropped(lc);
}

/* The entry of a lock usable now (see efs_lock_held), or NULL. */
static const struct efs_locktab_entry *usable_entry(const struct efs_lockcache *lc, uint64_t ino)
{
	const struct efs_locktab_entry *e;

	if (!lc || !efs_session_is_active(lc->s) || efs_session_generation(lc->s) != lc->gen)
		return NULL;
	e = efs_locktab_find(&lc->tab, ino);
	if (!e || e->state == EFS_LOCKTAB_RELEASING || e->state == EFS_LOCKTAB_GRANTING)
		return NULL;
	return e;
}

enum efs_lock_mode efs_lock_held(const struct efs_lockcache *lc, uint64_t ino)
{
	const struct efs_locktab_entry *e = usable_entry(lc, ino);

	return e ? (enum efs_lock_mode)e->mode : EFS_LOCK_NONE;
}

bool efs_lock_may_cache(const struct efs_lockcache *lc, uint64_t ino)
{
	const struct efs_locktab_entry *e = usable_entry(lc, ino);

	if (!e || e->mode == EFS_LOCK_NONE || e->recalled || e->hold_deferred)
		return false;
	/* Recalled again and again: each operation takes the lock anew and
	 * nothing is cached past it (lock/heat.h). */
	if (efs_heat_contended(&lc->heat, ino, now_ns()))
		return false;
	/* A preparation that pins do not void runs its invalidation once:
	 * nothing may be cached under it from then on. Other preparations
	 * are voided by the pin of the request asking (and invalidate
	 * again while the kernel may cache), so caching under them stays. */
	return !(e->prep_keeps && (e->prep || e->prepared));
}

bool efs_lock_may_defer(const struct efs_lockcache *lc, uint64_t ino)
{
	const struct efs_locktab_entry *e = usable_entry(lc, ino);

	return e && e->state == EFS_LOCKTAB_HELD && e->mode == EFS_LOCK_EXCLUSIVE &&
	       !e->recalled && !e->hold_deferred && !e->draining && !e->prep && !e->prepared;
}

int efs_lock_inplace_check(struct efs_lockcache *lc, uint64_t ino, efs_lock_inplace_cb cb,
			   void *arg)
{
	const struct efs_locktab_entry *e = usable_entry(lc, ino);

	if (!e || e->mode != EFS_LOCK_EXCLUSIVE)
		return 0;
	return efs_deaths_check(lc->deaths, ino, e->grant_rev, cb, arg);
}

uint64_t efs_lock_free_hold(struct efs_lockcache *lc, int64_t rev,
			    const Etcdserverpb__RangeResponse *nodes,
			    const Etcdserverpb__RangeResponse *gens)
{
	return efs_deaths_free_hold(lc->deaths, rev, nodes, gens);
}

uint64_t efs_lock_grant(const struct efs_lockcache *lc, uint64_t ino)
{
	/* On every request's cache check: one table lookup. */
	const struct efs_locktab_entry *e = usable_entry(lc, ino);

	return e && e->mode != EFS_LOCK_NONE ? e->grant : 0;
}

bool efs_lock_touch(struct efs_lockcache *lc, uint64_t ino, enum efs_lock_mode mode)
{
	struct efs_locktab_entry *e;
	uint64_t now;

	if (!lc || !efs_session_is_active(lc->s))
		return false;
	check_generation(lc);
	e = efs_locktab_find(&lc->tab, ino);
	if (!e || e->state != EFS_LOCKTAB_HELD || e->mode < (int)mode || e->draining ||
	    e->recalled)
		return false;
	now = now_ns();
	pin_mode(lc, e, mode, now);
	efs_locktab_unpin(&lc->tab, e, now);
	lc->stats.hits++;
	return true;
}

void efs_lock_note_change(struct efs_lockcache *lc, uint64_t ino)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	if (e && e->mode == EFS_LOCK_EXCLUSIVE)
		e->xpin_seq++;
}

void efs_lock_set_kind(struct efs_lockcache *lc, uint64_t ino, unsigned kind)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	if (e && kind < EFS_LOCK_KINDS)
		e->kind = (uint8_t)kind;
}

void efs_lockcache_set_wanted_fn(struct efs_lockcache *lc, efs_lock_wanted_fn fn, void *arg)
{
	if (!lc)
		return;
	lc->wanted_fn = fn;
	lc->wanted_arg = arg;
}

void efs_lockcache_set_kind_fn(struct efs_lockcache *lc, efs_lock_kind_fn fn, void *arg)
{
	if (!lc)
		return;
	lc->kind_fn = fn;
	lc->kind_arg = arg;
}

int efs_lockcache_set_ops(struct efs_lockcache *lc, unsigned kind, const struct efs_lock_ops *ops,
			  void *arg)
{
	if (!lc || kind >= EFS_LOCK_KINDS)
		return -EINVAL;
	lc->ops[kind].ops = ops;
	lc->ops[kind].arg = arg;
	return 0;
}

int efs_lock_release_now(struct efs_lockcache *lc, uint64_t ino, enum efs_lock_mode to,
			 efs_lock_release_cb done, void *arg)
{
	struct efs_locktab_entry *e;
	struct rwait *w;

	if (!lc || !done || (to != EFS_LOCK_NONE && to != EFS_LOCK_SHARED))
		return -EINVAL;
	e = efs_locktab_find(&lc->tab, ino);
	if (!e || e->mode <= (int)to)
		return 1;
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->ino = ino;
	w->to = to;
	w->start_ns = now_ns();
	w->cb = done;
	w->arg = arg;
	efs_list_add_head(&lc->rwaiters, &w->link);
	recall_mark(lc, e);
	/* From the timer, so |done| never runs inline. */
	release_kick(lc);
	return 0;
}

/*
 * The direct grant of a release riding a publication (add_grant): the
 * engine adds its guards (compares) and further releases after this, so
 * the grant leaves PUB_GRANT_SPARE of etcd's budget to them and grants at
 * most PUB_GRANT_MAX waiters. Returns how many it granted (0 on an error:
 * the release goes on alone).
 */
#define PUB_GRANT_SPARE 32
#define PUB_GRANT_MAX	8

static int publication_grant(struct efs_lockcache *lc, struct efs_etcd_txn *t,
			     const struct efs_locktab_entry *e, enum efs_lock_mode to)
{
	const Etcdserverpb__TxnRequest *req = efs_etcd_txn_request(t);
	size_t used = req->n_success + 1;
	int r;

	if (used < req->n_compare)
		used = req->n_compare;
	if (used < req->n_failure)
		used = req->n_failure;
	used += PUB_GRANT_SPARE;
	if (used >= EFS_ETCD_TXN_MAX_OPS)
		return 0;
	r = add_grant(lc, t, e, to,
		      EFS_ETCD_TXN_MAX_OPS - used < 2 * PUB_GRANT_MAX ? EFS_ETCD_TXN_MAX_OPS - used
								 : 2 * PUB_GRANT_MAX);
	return r < 0 ? 0 : r;
}

int efs_lock_release_in_txn(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino)
{
	struct efs_locktab_entry *e;
	enum efs_lock_mode to;
	struct efs_meta_key hk;
	int r;

	if (!lc || !t)
		return -EINVAL;
	e = efs_locktab_find(&lc->tab, ino);
	if (!e || !efs_session_is_active(lc->s) || efs_session_generation(lc->s) != lc->gen)
		return 0;
	to = (enum efs_lock_mode)(e->rel_txn ? e->rel_to : e->prep_to);
	if (!e->rel_txn) {
		/* At its sync, with the caller's pin the only one taken since
		 * the preparation began: pins are never left at its start, so
		 * any other would have run an operation that may have cached
		 * or buffered more than this transaction publishes. */
		if (e->state != EFS_LOCKTAB_HELD || !e->prep || e->prep_stage != 2 ||
		    e->prep_keeps || e->mode != EFS_LOCK_EXCLUSIVE || to >= EFS_LOCK_EXCLUSIVE ||
		    e->pins != 1 || e->pin_seq != e->prep_seq + 1)
			return 0;
	}
	if (n_ops(t, EFS_ETCD_TXN_SUCCESS) + (to == EFS_LOCK_SHARED ? 2 : 1) > EFS_ETCD_TXN_MAX_OPS)
		return 0;
	r = efs_meta_key_holder(&lc->ns, ino, meta_mode(EFS_LOCK_EXCLUSIVE),
				efs_session_node(lc->s), &hk);
	if (r == 0)
		r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, hk.buf, hk.len, NULL, 0, false);
	if (r == 0 && to == EFS_LOCK_SHARED)
		r = put_holder(lc, t, ino, EFS_LOCK_SHARED, NULL);
	if (r < 0)
		return r;
	e->rel_grants = (uint8_t)publication_grant(lc, t, e, to);
	if (!e->rel_txn) {
		e->rel_txn = true;
		e->state = EFS_LOCKTAB_RELEASING; /* no cache hits until the outcome */
		e->rel_to = (uint8_t)to;
	}
	return 1;
}

void efs_lock_release_in_txn_outcome(struct efs_lockcache *lc, uint64_t ino,
				     enum efs_lock_txn_outcome oc, int64_t rev)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;
	struct lcall *k;

	/* A new entry of the inode (the old one forgotten) is not ours. */
	if (!e || !e->rel_txn || e->state != EFS_LOCKTAB_RELEASING)
		return;
	switch (oc) {
	case EFS_LOCK_TXN_FAILED:
		e->rel_txn = false;
		e->state = EFS_LOCKTAB_HELD;
		e->rel_to = EFS_LOCK_NONE;
		entry_changed(lc, e);
		release_kick(lc);
		return;
	case EFS_LOCK_TXN_COMMITTED:
		if (rev > lc->last_rev)
			lc->last_rev = rev;
		e->rel_txn = false;
		if (e->rel_early)
			lc->stats.releases_early++;
		else
			lc->stats.releases_in_txn++;
		/* The waiter's nested compare is not seen here: a grant to a
		 * waiter gone meanwhile is counted too (rare). */
		lc->stats.direct_grants += e->rel_grants;
		if (e->rel_to == EFS_LOCK_SHARED) {
			/* The publication's pin goes with its operation. */
			downgraded(lc, e);
			rwake_soon(lc);
		} else {
			efs_log_debug("lock: inode %" PRIu64 ": released with %s", e->ino,
				      e->rel_early ? "another transaction" : "its publication");
			remove_entry(lc, e); /* freed with the publication's pin */
			lc->stats.releases++;
		}
		release_kick(lc);
		return;
	case EFS_LOCK_TXN_UNKNOWN:
		break;
	}
	/* Not known: the holder keys may be either way. Settle them
	 * (idempotent deletes; a downgrade keeps the shared key) before the
	 * entry is usable or gone. */
	e->rel_txn = false;
	k = lcall_new(lc, NULL, 0);
	if (!k) {
		efs_log_err("lock: no memory to settle the holder key of inode %" PRIu64
			    ": it may stay until the session ends",
			    ino);
		e->state = EFS_LOCKTAB_HELD;
		entry_changed(lc, e);
		return;
	}
	k->kind = CL_SETTLE;
	k->c_ino = ino;
	k->keep = e->rel_to == EFS_LOCK_SHARED ? EFS_LOCK_SHARED : EFS_LOCK_NONE;
	e->mode = k->keep;
	if (k->keep == EFS_LOCK_SHARED)
		new_grant(lc, e);
	e->rel_to = EFS_LOCK_NONE;
	e->state = EFS_LOCKTAB_ACQUIRING;
	e->owner = k;
	cleanup_start(lc, k);
}

/*
 * Early cancel (Lustre's name): an idle lock due for release, or nearly,
 * gives its holder key up in a transaction the node sends anyway, instead
 * of costing a commit of its own. Only locks nobody here
 * wants (no pin, no waiting acquisition, no forced release) and whose
 * release needs no preparation or was prepared since their last use: a
 * ride never runs the ops, so it never releases a lock whose kernel
 * caches or unpublished changes have not been dealt with. The outcome is
 * that of a release riding its publication.
 */
int efs_lock_ride_idle(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t *ret_ino,
		       size_t max)
{
	struct efs_locktab_entry *sel[2 * EFS_LOCK_RIDE_MAX];
	struct efs_locktab_sel s = {.idle_ns = 0};
	uint64_t now = now_ns();
	size_t n, k = 0;

	if (!lc || !t || !ret_ino)
		return -EINVAL;
	if (max > EFS_LOCK_RIDE_MAX)
		max = EFS_LOCK_RIDE_MAX;
	if (!max || lc->release_all || !efs_session_is_active(lc->s) ||
	    efs_session_generation(lc->s) != lc->gen)
		return 0;
	/* Nearly due: within the next tick, or unused for three quarters of
	 * the idle time. A lock that idle is rarely used in the last quarter,
	 * and riding now saves the commit the tick would spend on it. */
	s.idle_ns = (uint64_t)lc->idle_ms * EFS_NSEC_PER_MSEC;
	s.now = now + (lc->period_ms * EFS_NSEC_PER_MSEC > s.idle_ns / 4
			       ? lc->period_ms * EFS_NSEC_PER_MSEC
			       : s.idle_ns / 4);
	n = efs_locktab_select(&lc->tab, &s, sel, 2 * max);
	for (size_t j = 0; j < n && k < max; j++) {
		struct efs_locktab_entry *e = sel[j];
		struct efs_meta_key hk;

		if (e->state != EFS_LOCKTAB_HELD || e->pins || e->prep || e->owner ||
		    e->recalled || e->draining || e->rel_txn || e->mode == EFS_LOCK_NONE ||
		    e->kcache_until_ns > now ||
		    (needs_prep(lc, e, false, now) && !is_prepared(e, EFS_LOCK_NONE)))
			continue;
		if (n_ops(t, EFS_ETCD_TXN_SUCCESS) + 1 > EFS_ETCD_TXN_MAX_OPS)
			break;
		if (efs_meta_key_holder(&lc->ns, e->ino, meta_mode(e->mode),
					efs_session_node(lc->s), &hk) < 0 ||
		    efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, hk.buf, hk.len, NULL, 0,
					false) < 0)
			break;
		e->state = EFS_LOCKTAB_RELEASING;
		e->rel_to = EFS_LOCK_NONE;
		e->rel_txn = true;
		e->rel_early = true;
		e->rel_grants = 0; /* an idle lock has no waiter to grant */
		ret_ino[k++] = e->ino;
	}
	return (int)k;
}

void efs_lock_ride_outcome(struct efs_lockcache *lc, const uint64_t *ino, size_t n,
			   enum efs_lock_txn_outcome oc, int64_t rev)
{
	for (size_t j = 0; lc && j < n; j++) {
		struct efs_locktab_entry *e = efs_locktab_find(&lc->tab, ino[j]);

		if (!e || !e->rel_early)
			continue; /* forgotten meanwhile: not ours */
		if (oc != EFS_LOCK_TXN_COMMITTED)
			e->rel_early = false;
		efs_lock_release_in_txn_outcome(lc, ino[j], oc, rev);
	}
}

int efs_lock_guard(const struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino,
		   enum efs_lock_mode mode)
{
	enum efs_lock_mode held = efs_lock_held(lc, ino);
	const struct efs_locktab_entry *e;
	struct efs_meta_key k;
	int r;

	if (held == EFS_LOCK_NONE && lc && efs_session_is_active(lc->s) &&
	    efs_session_generation(lc->s) == lc->gen) {
		/* The transaction that carries its release still needs it. */
		e = efs_locktab_find(&lc->tab, ino);
		if (e && e->rel_txn)
			held = (enum efs_lock_mode)e->mode;
	}
	if (held == EFS_LOCK_NONE || held < mode)
		return -ENOLCK;
	r = efs_meta_key_holder(&lc->ns, ino, meta_mode(held), efs_session_node(lc->s), &k);
	if (r < 0)
		return r;
	return efs_etcd_txn_compare(t, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
				    efs_session_lease_id(lc->s));
}

int efs_lock_grant_in_txn(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino)
{
	struct efs_locktab_entry *e;
	int r;

	if (!lc || !t || ino == 0)
		return -EINVAL;
	if (!efs_session_is_active(lc->s))
		return -EIO;
	check_generation(lc);
	if (efs_locktab_find(&lc->tab, ino))
		return -EEXIST;
	r = put_holder(lc, t, ino, EFS_LOCK_EXCLUSIVE, NULL);
	if (r < 0)
		return r;
	r = efs_locktab_add(&lc->tab, ino, now_ns(), &e);
	if (r < 0)
		return r;
	e->state = EFS_LOCKTAB_GRANTING;
	e->mode = EFS_LOCK_NONE;
	return 0;
}

void efs_lock_grant_committed(struct efs_lockcache *lc, uint64_t ino, bool committed)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	if (!e || e->state != EFS_LOCKTAB_GRANTING)
		return;
	if (!committed) {
		remove_entry(lc, e);
		return;
	}
	e->state = EFS_LOCKTAB_HELD;
	e->mode = EFS_LOCK_EXCLUSIVE;
	e->token = lc->token_seq;
	/* A new inode: no peer ever held it, whatever the revision says. */
	e->grant_rev = lc->last_rev;
	new_grant(lc, e);
	efs_locktab_touch(&lc->tab, e, now_ns());
	entry_changed(lc, e);
}

void *efs_lock_pin_held(struct efs_lockcache *lc, uint64_t ino)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	if (!e || e->state != EFS_LOCKTAB_HELD || e->mode != EFS_LOCK_EXCLUSIVE)
		return NULL;
	pin_mode(lc, e, EFS_LOCK_EXCLUSIVE, now_ns());
	return e;
}

void efs_lock_unpin_held(struct efs_lockcache *lc, void *pin)
{
	if (!lc || !pin)
		return;
	/* A removed entry (a lost session) is freed with its last pin. */
	efs_locktab_unpin(&lc->tab, pin, now_ns());
	pins_dropped(lc);
}

int efs_lock_drop_in_txn(struct efs_lockcache *lc, struct efs_etcd_txn *t, uint64_t ino)
{
	struct efs_meta_range rg;
	int r;

	if (!lc || !t)
		return -EINVAL;
	r = efs_meta_range_ino(&lc->ns, EFS_META_K_HOLDER, ino, &rg);
	if (r < 0)
		return r;
	return efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len, rg.end.buf,
				   rg.end.len, false);
}

void efs_lock_forget(struct efs_lockcache *lc, uint64_t ino)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	if (e)
		remove_entry(lc, e);
}

void efs_lock_note_kernel_cache(struct efs_lockcache *lc, uint64_t ino, uint64_t until_ns)
{
	struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	if (e)
		efs_locktab_note_kcache(e, until_ns);
}

uint64_t efs_lock_kernel_cache_until(const struct efs_lockcache *lc, uint64_t ino)
{
	const struct efs_locktab_entry *e = lc ? efs_locktab_find(&lc->tab, ino) : NULL;

	return e ? e->kcache_until_ns : 0;
}

void efs_lockcache_get_stats(const struct efs_lockcache *lc, struct efs_lockcache_stats *ret)
{
	struct efs_deaths_stats ds;

	*ret = lc->stats;
	ret->held = lc->tab.count;
	efs_deaths_get_stats(lc->deaths, &ds);
	ret->peer_deaths = ds.deaths;
	ret->takeover_marked = ds.marked;
	ret->takeover_cow = ds.cow;
	ret->contended = efs_heat_count_contended(&lc->heat, now_ns());
}
