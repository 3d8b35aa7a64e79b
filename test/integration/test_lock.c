/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The lock cache against a real etcd: acquisition in both modes with the
 * inode record read in the same transaction, cache hits with no etcd
 * traffic, upgrade, several inodes at once, waiting for a holder of another
 * node and FIFO order among waiters, idle release in batches and kernel
 * cache deadlines, the cache bound, grant and drop inside a caller's
 * transaction, holder guards, cancellation, wait timeouts, session loss and
 * release of everything; cancellation after an acquire whose outcome is
 * unknown (no orphaned holder key), recall keys deleted only under the
 * session guard.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "config.h"
#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "fs/fs-int.h"
#include "harness.h"
#include "lock/lock.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;
static struct efs_etcd *c, *c2;
static struct efs_etcd_sync *sc;
static struct efs_meta_ns ns;
static struct efs_session *s, *s2;

static void session_done(struct efs_session *ss, int status, void *arg)
{
	int *st = arg;

	(void)ss;
	*st = status;
}

static struct efs_session *start_session(struct efs_etcd *cl, const char *node)
{
	struct efs_session_opts o = {.ns = &ns, .node = node, .machine_id = "m", .ttl_s = 2};
	struct efs_session *ss = NULL;
	int st = 1;
	uint64_t end = efs_test_now_ms() + 10000;

	cr_assert_eq(efs_session_start(&ss, &efs_test_loop, cl, &o, NULL, session_done, &st), 0);
	while (st == 1 && efs_test_now_ms() < end)
		efs_test_run_for(5);
	cr_assert_eq(st, 0, "session start: %d", st);
	return ss;
}

static void setup(void)
{
	struct efs_harness_opts o = {.members = 1};
	struct efs_etcd_opts eo = {0};
	int r;

	r = efs_harness_start(&h, &o);
	cr_assert_eq(r, 0, "harness start: %d", r);
	efs_test_loop_init();
	c = efs_test_client_new(efs_harness_endpoints(h));
	eo.endpoints = efs_harness_endpoints(h);
	cr_assert_eq(efs_etcd_sync_new(&sc, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&ns, "lk"), 0);
	s = start_session(c, "node1");
}

static void teardown(void)
{
	s = efs_session_free(s);
	s2 = efs_session_free(s2);
	if (c2) {
		efs_test_client_free(c2);
		c2 = NULL;
	}
	if (c) {
		efs_test_client_free(c);
		c = NULL;
	}
	sc = efs_etcd_sync_free(sc);
	efs_test_loop_fini();
	h = efs_harness_free(h);
}

TestSuite(lock, .init = setup, .fini = teardown, .timeout = 60);

/* ---- Helpers ---- */

static int done_seq;

struct lres {
	struct efs_lock_req req;
	bool done;
	int status;
	int seq; /* completion order */
};

static void on_lock(struct efs_lock_req *req, int status)
{
	struct lres *x = req->arg;

	x->done = true;
	x->status = status;
	x->seq = ++done_seq;
}

static struct efs_lockcache *new_lc(struct efs_session *ss, struct efs_etcd *cl, size_t max,
				    uint32_t idle_ms, size_t batch, uint32_t wait_ms)
{
	struct efs_lockcache_opts o = {
		.ns = &ns,
		.max_cached = max,
		.idle_ms = idle_ms,
		.release_batch = batch,
		.wait_timeout_ms = wait_ms,
	};
	struct efs_lockcache *lc = NULL;

	cr_assert_eq(efs_lockcache_new(&lc, &efs_test_loop, cl, ss, &o), 0);
	return lc;
}

/* Starts an acquisition of the |n| inode/mode pairs with request flags
 * (EFS_LOCK_F_*); returns acquire's value. */
static int acquire_fl(struct efs_lockcache *lc, struct lres *x, size_t n, const uint64_t *ino,
		      const enum efs_lock_mode *mode, unsigned flags)
{
	int r;

	*x = (struct lres){0};
	x->req.flags = flags;
	x->req.n = n;
	for (size_t i = 0; i < n; i++) {
		x->req.ino[i] = ino[i];
		x->req.mode[i] = mode[i];
	}
	x->req.cb = on_lock;
	x->req.arg = x;
	r = efs_lock_acquire(lc, &x->req);
	cr_assert_geq(r, 0, "acquire: %d", r);
	cr_assert_not(x->done, "callback ran inline");
	return r;
}

static int acquire(struct efs_lockcache *lc, struct lres *x, size_t n, const uint64_t *ino,
		   const enum efs_lock_mode *mode)
{
	return acquire_fl(lc, x, n, ino, mode, 0);
}

static int acquire1(struct efs_lockcache *lc, struct lres *x, uint64_t ino, enum efs_lock_mode m)
{
	return acquire(lc, x, 1, &ino, &m);
}

static int acquire1f(struct efs_lockcache *lc, struct lres *x, uint64_t ino, enum efs_lock_mode m,
		     unsigned flags)
{
	return acquire_fl(lc, x, 1, &ino, &m, flags);
}

/* Acquires and waits; asserts success. */
static void take(struct efs_lockcache *lc, struct lres *x, uint64_t ino, enum efs_lock_mode m)
{
	if (acquire1(lc, x, ino, m) == 1)
		return;
	cr_assert(efs_test_run_until(&x->done, 5000), "acquire of %" PRIu64 " timed out", ino);
	cr_assert_eq(x->status, 0, "acquire of %" PRIu64 ": %d", ino, x->status);
}

static struct efs_meta_key holder_key(uint64_t ino, int mode, const char *node)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_holder(&ns, ino, mode, node, &k), 0);
	return k;
}

/* The lease of key |k|, -1 when absent. */
static int64_t key_lease(const struct efs_meta_key *k)
{
	Mvccpb__KeyValue *kv = NULL;
	int64_t lease;
	int r = efs_etcd_sync_get(sc, k->buf, k->len, &kv, NULL);

	if (r == -ENOENT)
		return -1;
	cr_assert_eq(r, 0);
	lease = kv->lease;
	efs_test_pb_free(kv);
	return lease;
}

static bool holder_exists(uint64_t ino, int mode, const char *node)
{
	struct efs_meta_key k = holder_key(ino, mode, node);

	return key_lease(&k) >= 0;
}

static void put_key(const struct efs_meta_key *k, const char *v)
{
	cr_assert_eq(efs_etcd_sync_put(sc, k->buf, k->len, v, strlen(v), 0, NULL), 0);
}

static void del_key(const struct efs_meta_key *k)
{
	int64_t n = 0;

	cr_assert_eq(efs_etcd_sync_delete(sc, k->buf, k->len, false, &n), 0);
	cr_assert_eq(n, 1);
}

/* A holder key of "another node" (no session of ours). */
static struct efs_meta_key put_foreign_holder(uint64_t ino, int mode)
{
	struct efs_meta_key k = holder_key(ino, mode, "other");

	put_key(&k, "foreign");
	return k;
}

/* Number of keys in family |fam| of |ino|. */
static int64_t count_keys(enum efs_meta_family fam, uint64_t ino)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *resp = NULL;
	struct efs_meta_range rg;
	int64_t n;

	cr_assert_eq(efs_meta_range_ino(&ns, fam, ino, &rg), 0);
	req.key.data = rg.key.buf;
	req.key.len = rg.key.len;
	req.range_end.data = rg.end.buf;
	req.range_end.len = rg.end.len;
	req.count_only = true;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_RANGE, &req.base, (ProtobufCMessage **)&resp,
					NULL),
		     0);
	n = resp->count;
	efs_test_pb_free(resp);
	return n;
}

static bool txn_ok(struct efs_etcd_txn *t)
{
	Etcdserverpb__TxnResponse *resp = NULL;
	bool ok;

	cr_assert_eq(efs_etcd_sync_txn(sc, efs_etcd_txn_request(t), &resp), 0);
	ok = resp->succeeded;
	efs_test_pb_free(resp);
	return ok;
}

static uint64_t calls(struct efs_etcd *cl)
{
	struct efs_etcd_stats st;

	efs_etcd_get_stats(cl, &st);
	return st.calls_started;
}

static struct efs_lockcache_stats lstats(struct efs_lockcache *lc)
{
	struct efs_lockcache_stats st;

	efs_lockcache_get_stats(lc, &st);
	return st;
}

static bool run_until_held(struct efs_lockcache *lc, uint64_t held, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (lstats(lc).held != held && efs_test_now_ms() < end)
		efs_test_run_for(10);
	return lstats(lc).held == held;
}

static void finish(struct efs_lockcache *lc)
{
	efs_lockcache_free(lc);
	teardown();
}

/* ---- Tests ---- */

Test(lock, acquire_reads_the_record_and_caches_with_no_etcd_traffic)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct efs_meta_key ik, hk;
	struct lres a, b, hit;
	uint64_t inos[2] = {10, 11}, before;
	enum efs_lock_mode shared2[2] = {EFS_LOCK_SHARED, EFS_LOCK_SHARED};
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__LockHolder *lh = NULL;

	cr_assert_eq(efs_meta_key_inode(&ns, 11, &ik), 0);
	put_key(&ik, "record-of-11");

	cr_assert_eq(acquire1(lc, &a, 10, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert_eq(efs_lock_held(lc, 10), EFS_LOCK_NONE);
	cr_assert(efs_test_run_until(&a.done, 5000));
	cr_assert_eq(a.status, 0);
	cr_assert_null(a.req.recs[0], "no i/10 record exists");
	cr_assert_eq(efs_lock_held(lc, 10), EFS_LOCK_EXCLUSIVE);
	hk = holder_key(10, EFS_META_LOCK_EXCLUSIVE, "node1");
	cr_assert_eq(efs_etcd_sync_get(sc, hk.buf, hk.len, &kv, NULL), 0);
	cr_assert_eq(kv->lease, efs_session_lease_id(s), "holder key not on the session lease");
	cr_assert_eq(efs_meta_holder_decode(kv->value.data, kv->value.len, &lh, NULL), 0);
	cr_assert_str_eq(lh->node, "node1");
	cr_assert_eq(lh->mode, EFS_META_LOCK_EXCLUSIVE);
	cr_assert_eq(lh->session_generation, efs_session_generation(s));
	cr_assert_eq(lh->lease_id, efs_session_lease_id(s));
	cr_assert_neq(lh->token, 0);
	efs_meta_record_free(lh);
	efs_test_pb_free(kv);

	take(lc, &b, 11, EFS_LOCK_SHARED);
	cr_assert_not_null(b.req.recs[0]);
	cr_assert_eq(b.req.recs[0]->key.len, ik.len);
	cr_assert_eq(memcmp(b.req.recs[0]->key.data, ik.buf, ik.len), 0);
	cr_assert_eq(b.req.recs[0]->value.len, strlen("record-of-11"));
	cr_assert(holder_exists(11, EFS_META_LOCK_SHARED, "node1"));
	cr_assert_eq(efs_lock_held(lc, 11), EFS_LOCK_SHARED);
	efs_lock_put(lc, &a.req);
	efs_lock_put(lc, &b.req);
	cr_assert_null(a.req.priv);
	cr_assert_null(a.req.recs[0]);

	/* Both cached: X covers S. No etcd call at all. */
	before = calls(c);
	cr_assert_eq(acquire(lc, &hit, 2, inos, shared2), 1);
	cr_assert_null(hit.req.recs[0]);
	cr_assert_null(hit.req.recs[1]);
	efs_test_run_for(50);
	cr_assert_not(hit.done, "a cache hit must not call back");
	cr_assert_eq(calls(c), before, "a cache hit talked to etcd");
	cr_assert_eq(lstats(lc).hits, 1);
	cr_assert_eq(lstats(lc).acquires, 2);
	cr_assert_eq(lstats(lc).held, 2);
	cr_assert_eq(lstats(lc).waits, 0);
	efs_lock_put(lc, &hit.req);
	cr_assert_eq(efs_lock_held(lc, 12), EFS_LOCK_NONE);
	/* Bad requests. */
	{
		struct efs_lock_req bad = {.n = 1, .ino = {0}, .mode = {EFS_LOCK_SHARED},
					   .cb = on_lock};

		cr_assert_eq(efs_lock_acquire(lc, &bad), -EINVAL);
		bad.ino[0] = 5;
		bad.mode[0] = EFS_LOCK_NONE;
		cr_assert_eq(efs_lock_acquire(lc, &bad), -EINVAL);
		bad.n = EFS_LOCK_REQ_MAX + 1;
		cr_assert_eq(efs_lock_acquire(lc, &bad), -EINVAL);
	}
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, upgrade_and_several_inodes)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct lres a, b, m;
	uint64_t inos[4] = {32, 30, 31, 30}, before;
	enum efs_lock_mode modes[4] = {EFS_LOCK_EXCLUSIVE, EFS_LOCK_SHARED, EFS_LOCK_EXCLUSIVE,
				       EFS_LOCK_EXCLUSIVE};
	struct efs_meta_key fk;

	/* Upgrade S -> X: the S key goes, the X key comes, in one txn. */
	take(lc, &a, 20, EFS_LOCK_SHARED);
	efs_lock_put(lc, &a.req);
	cr_assert_eq(acquire1(lc, &b, 20, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&b.done, 5000));
	cr_assert_eq(b.status, 0);
	cr_assert_eq(efs_lock_held(lc, 20), EFS_LOCK_EXCLUSIVE);
	cr_assert_not(holder_exists(20, EFS_META_LOCK_SHARED, "node1"));
	cr_assert(holder_exists(20, EFS_META_LOCK_EXCLUSIVE, "node1"));
	efs_lock_put(lc, &b.req);

	/* Several inodes, out of order, one twice (merged to X): one txn. */
	before = calls(c);
	cr_assert_eq(acquire(lc, &m, 4, inos, modes), 0);
	cr_assert(efs_test_run_until(&m.done, 5000));
	cr_assert_eq(m.status, 0);
	cr_assert_eq(calls(c) - before, 1, "not one transaction");
	cr_assert_eq(efs_lock_held(lc, 30), EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(efs_lock_held(lc, 31), EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(efs_lock_held(lc, 32), EFS_LOCK_EXCLUSIVE);
	cr_assert(holder_exists(30, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_not(holder_exists(30, EFS_META_LOCK_SHARED, "node1"));
	efs_lock_put(lc, &m.req);

	/* A conflict on one of them: one by one, waiting for it. */
	fk = put_foreign_holder(41, EFS_META_LOCK_EXCLUSIVE);
	inos[0] = 42;
	inos[1] = 41;
	inos[2] = 40;
	modes[1] = EFS_LOCK_SHARED;
	cr_assert_eq(acquire(lc, &m, 3, inos, modes), 0);
	efs_test_run_for(400);
	cr_assert_not(m.done);
	cr_assert_eq(efs_lock_held(lc, 40), EFS_LOCK_EXCLUSIVE, "inode order: 40 first");
	cr_assert_eq(efs_lock_held(lc, 41), EFS_LOCK_NONE);
	cr_assert_eq(efs_lock_held(lc, 42), EFS_LOCK_NONE);
	del_key(&fk);
	cr_assert(efs_test_run_until(&m.done, 3000));
	cr_assert_eq(m.status, 0);
	cr_assert_eq(efs_lock_held(lc, 41), EFS_LOCK_SHARED);
	cr_assert_eq(efs_lock_held(lc, 42), EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 41), 0, "recall key left behind");
	efs_lock_put(lc, &m.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, conflicting_holder_of_another_node_is_waited_for)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct efs_meta_key fk = put_foreign_holder(50, EFS_META_LOCK_EXCLUSIVE);
	struct efs_meta_key sk = put_foreign_holder(51, EFS_META_LOCK_SHARED);
	struct lres a, b, x;
	uint64_t t0;

	/* Shared with a foreign shared holder: no conflict. */
	take(lc, &b, 51, EFS_LOCK_SHARED);
	efs_lock_put(lc, &b.req);
	/* Exclusive with a foreign shared holder: waits. */
	cr_assert_eq(acquire1(lc, &x, 51, EFS_LOCK_EXCLUSIVE), 0);

	cr_assert_eq(acquire1(lc, &a, 50, EFS_LOCK_SHARED), 0);
	efs_test_run_for(500);
	cr_assert_not(a.done);
	cr_assert_not(x.done);
	cr_assert_eq(lstats(lc).waits, 2);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 50), 1, "no recall key");
	cr_assert_eq(efs_lock_held(lc, 50), EFS_LOCK_NONE);
	t0 = efs_test_now_ms();
	del_key(&fk);
	cr_assert(efs_test_run_until(&a.done, 3000));
	cr_assert_eq(a.status, 0);
	cr_assert_lt(efs_test_now_ms() - t0, 500, "not woken by the delete");
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 50), 0, "recall key left behind");
	cr_assert(holder_exists(50, EFS_META_LOCK_SHARED, "node1"));
	efs_lock_put(lc, &a.req);
	cr_assert_not(x.done);
	del_key(&sk);
	cr_assert(efs_test_run_until(&x.done, 3000));
	cr_assert_eq(x.status, 0);
	cr_assert(holder_exists(51, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_not(holder_exists(51, EFS_META_LOCK_SHARED, "node1"));
	efs_lock_put(lc, &x.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, waiters_are_served_in_arrival_order)
{
	struct efs_lockcache *lc1, *lc2;
	struct efs_meta_key fk = put_foreign_holder(60, EFS_META_LOCK_EXCLUSIVE);
	struct lres a, b;

	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	lc1 = new_lc(s, c, 0, 300, 0, 0);
	lc2 = new_lc(s2, c2, 0, 300, 0, 0);
	done_seq = 0;
	/* node1 wants X first, node2 then wants S: S would be compatible once
	 * the foreign holder goes, but node1's older recall comes first. */
	cr_assert_eq(acquire1(lc1, &a, 60, EFS_LOCK_EXCLUSIVE), 0);
	efs_test_run_for(300);
	cr_assert_eq(acquire1(lc2, &b, 60, EFS_LOCK_SHARED), 0);
	efs_test_run_for(300);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 60), 2);
	cr_assert_not(a.done);
	cr_assert_not(b.done);
	del_key(&fk);
	cr_assert(efs_test_run_until(&a.done, 3000));
	cr_assert_eq(a.status, 0);
	efs_test_run_for(300);
	cr_assert_not(b.done, "the younger waiter overtook");
	cr_assert(holder_exists(60, EFS_META_LOCK_EXCLUSIVE, "node1"));
	/* node1 is done with it: released idle, node2 gets it. */
	efs_lock_put(lc1, &a.req);
	cr_assert(efs_test_run_until(&b.done, 3000));
	cr_assert_eq(b.status, 0);
	cr_assert_lt(a.seq, b.seq);
	cr_assert_not(holder_exists(60, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert(holder_exists(60, EFS_META_LOCK_SHARED, "node2"));
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 60), 0);
	efs_lock_put(lc2, &b.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

Test(lock, idle_locks_are_released_in_batches_after_kernel_caches)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 200, 3, 0);
	struct lres x[8];
	struct efs_lockcache_stats st;
	uint64_t t0;

	for (int i = 0; i < 8; i++)
		take(lc, &x[i], 70 + (uint64_t)i, EFS_LOCK_EXCLUSIVE);
	/* The kernel may cache under 77 for 900 ms. */
	efs_lock_note_kernel_cache(lc, 77, efs_clock_mono_ns() + 900 * EFS_NSEC_PER_MSEC);
	for (int i = 0; i < 8; i++)
		efs_lock_put(lc, &x[i].req);
	t0 = efs_test_now_ms();
	efs_test_run_for(120);
	cr_assert_eq(lstats(lc).held, 8, "released before idle");
	cr_assert(run_until_held(lc, 1, 1000), "idle locks not released");
	st = lstats(lc);
	cr_assert_eq(st.releases, 7);
	cr_assert_eq(st.release_txns, 3, "7 locks in batches of 3: %" PRIu64, st.release_txns);
	for (uint64_t ino = 70; ino < 77; ino++)
		cr_assert_not(holder_exists(ino, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_eq(efs_lock_held(lc, 77), EFS_LOCK_EXCLUSIVE);
	cr_assert(holder_exists(77, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert(run_until_held(lc, 0, 2000));
	cr_assert_geq(efs_test_now_ms() - t0, 880, "released under a kernel cache");
	cr_assert_not(holder_exists(77, EFS_META_LOCK_EXCLUSIVE, "node1"));
	/* A released lock is taken again from etcd. */
	cr_assert_eq(acquire1(lc, &x[0], 70, EFS_LOCK_SHARED), 0);
	cr_assert(efs_test_run_until(&x[0].done, 3000));
	efs_lock_put(lc, &x[0].req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, the_cache_bound_releases_the_oldest)
{
	struct efs_lockcache *lc = new_lc(s, c, 4, 60000, 0, 0);
	struct lres x[6], y;

	for (int i = 0; i < 6; i++) {
		take(lc, &x[i], 80 + (uint64_t)i, EFS_LOCK_EXCLUSIVE);
		efs_lock_put(lc, &x[i].req);
	}
	cr_assert(run_until_held(lc, 4, 2000), "bound not enforced");
	cr_assert_not(holder_exists(80, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_not(holder_exists(81, EFS_META_LOCK_EXCLUSIVE, "node1"));
	for (uint64_t ino = 82; ino < 86; ino++)
		cr_assert_eq(efs_lock_held(lc, ino), EFS_LOCK_EXCLUSIVE);
	/* Pinned locks are never released, even over the bound. */
	take(lc, &y, 90, EFS_LOCK_EXCLUSIVE);
	cr_assert(run_until_held(lc, 4, 2000));
	cr_assert_eq(efs_lock_held(lc, 90), EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &y.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, grant_and_drop_in_the_callers_transaction)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key ik;
	struct lres x;

	cr_assert_eq(efs_meta_key_inode(&ns, 100, &ik), 0);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, ik.buf, ik.len, "new", 3, 0), 0);
	cr_assert_eq(efs_lock_grant_in_txn(lc, t, 100), 0);
	cr_assert_eq(efs_lock_held(lc, 100), EFS_LOCK_NONE, "held before the commit");
	cr_assert(txn_ok(t));
	t = efs_etcd_txn_free(t);
	efs_lock_grant_committed(lc, 100, true);
	cr_assert_eq(efs_lock_held(lc, 100), EFS_LOCK_EXCLUSIVE);
	{
		struct efs_meta_key hk = holder_key(100, EFS_META_LOCK_EXCLUSIVE, "node1");

		cr_assert_eq(key_lease(&hk), efs_session_lease_id(s));
	}
	cr_assert_eq(acquire1(lc, &x, 100, EFS_LOCK_EXCLUSIVE), 1, "granted lock not cached");
	efs_lock_put(lc, &x.req);

	/* A creating transaction that did not commit. */
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_lock_grant_in_txn(lc, t, 101), 0);
	cr_assert_eq(efs_lock_grant_in_txn(lc, t, 100), -EEXIST);
	t = efs_etcd_txn_free(t);
	efs_lock_grant_committed(lc, 101, false);
	cr_assert_eq(efs_lock_held(lc, 101), EFS_LOCK_NONE);
	cr_assert_eq(lstats(lc).held, 1);

	/* Deleting the inode drops its holder keys in the same txn. */
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), 0);
	cr_assert_eq(efs_lock_guard(lc, t, 100, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert_eq(efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, ik.buf, ik.len, NULL, 0, false),
		     0);
	cr_assert_eq(efs_lock_drop_in_txn(lc, t, 100), 0);
	cr_assert(txn_ok(t));
	t = efs_etcd_txn_free(t);
	efs_lock_forget(lc, 100);
	cr_assert_eq(efs_lock_held(lc, 100), EFS_LOCK_NONE);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 100), 0);
	cr_assert_eq(lstats(lc).held, 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, guard_fails_once_the_holder_key_is_gone)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct efs_meta_key hk = holder_key(110, EFS_META_LOCK_EXCLUSIVE, "node1");
	struct efs_etcd_txn *t = NULL;
	struct lres x;

	take(lc, &x, 110, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_lock_guard(lc, t, 111, EFS_LOCK_SHARED), -ENOLCK);
	cr_assert_eq(efs_lock_guard(lc, t, 110, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert_eq(efs_lock_guard(lc, t, 110, EFS_LOCK_SHARED), 0); /* X covers S */
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, "k", 1, "v", 1, 0), 0);
	cr_assert(txn_ok(t));
	del_key(&hk);
	cr_assert_not(txn_ok(t), "holder guard passed without the holder key");
	/* A key of the same name on another lease does not pass either. */
	put_key(&hk, "impostor");
	cr_assert_not(txn_ok(t));
	t = efs_etcd_txn_free(t);
	efs_lock_put(lc, &x.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, cancel_and_wait_timeout)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 400);
	struct lres a, b;
	uint64_t t0;

	put_foreign_holder(120, EFS_META_LOCK_EXCLUSIVE);
	cr_assert_eq(acquire1(lc, &a, 120, EFS_LOCK_EXCLUSIVE), 0);
	efs_test_run_for(150);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 120), 1);
	efs_lock_cancel(lc, &a.req);
	cr_assert_not(a.done, "cancel called back inline");
	cr_assert(efs_test_run_until(&a.done, 1000));
	cr_assert_eq(a.status, -EINTR);
	cr_assert_null(a.req.priv);
	efs_test_run_for(100);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 120), 0, "recall key of a cancelled wait");
	cr_assert_eq(efs_lock_held(lc, 120), EFS_LOCK_NONE);

	t0 = efs_test_now_ms();
	cr_assert_eq(acquire1(lc, &b, 120, EFS_LOCK_SHARED), 0);
	cr_assert(efs_test_run_until(&b.done, 2000));
	cr_assert_eq(b.status, -ETIMEDOUT);
	cr_assert_geq(efs_test_now_ms() - t0, 380);
	efs_test_run_for(100);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 120), 0);
	cr_assert_eq(lstats(lc).held, 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

#if EFS_FAULT_HOOKS
/* Runs the loop until the cache retried an acquire transaction |n| times. */
static bool run_until_retries(struct efs_lockcache *lc, uint64_t n, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (lstats(lc).txn_retries < n && efs_test_now_ms() < end)
		efs_test_run_for(1);
	return lstats(lc).txn_retries >= n;
}
#endif

/* Runs the loop until |ino| has |n| keys of family |fam|. */
static bool run_until_keys(enum efs_meta_family fam, uint64_t ino, int64_t n, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (count_keys(fam, ino) != n && efs_test_now_ms() < end)
		efs_test_run_for(20);
	return count_keys(fam, ino) == n;
}

#if EFS_FAULT_HOOKS
Test(lock, cancel_after_an_unknown_outcome_leaves_no_holder_key)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct lres a, b;

	/* The acquire transaction commits but its answer is lost. */
	efs_etcd_fault_drop_reply(c, EFS_ETCD_TXN, 1);
	cr_assert_eq(acquire1(lc, &a, 140, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(run_until_retries(lc, 1, 10000), "no unknown outcome");
	cr_assert(holder_exists(140, EFS_META_LOCK_EXCLUSIVE, "node1"), "the put did not commit");
	/* Cancelled before the retry could adopt the key. */
	efs_lock_cancel(lc, &a.req);
	cr_assert(efs_test_run_until(&a.done, 1000));
	cr_assert_eq(a.status, -EINTR);
	cr_assert_eq(efs_lock_held(lc, 140), EFS_LOCK_NONE);
	cr_assert(run_until_keys(EFS_META_K_HOLDER, 140, 0, 2000),
		  "orphaned holder key after a cancelled acquisition");
	cr_assert(run_until_held(lc, 0, 1000));
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 140), 0);
	/* The inode is free for anyone, and for us again. */
	take(lc, &b, 140, EFS_LOCK_SHARED);
	cr_assert_eq(efs_lock_held(lc, 140), EFS_LOCK_SHARED);
	efs_lock_put(lc, &b.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, cancelled_upgrade_after_an_unknown_outcome_goes_back_to_shared)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct lres a, b;

	take(lc, &a, 141, EFS_LOCK_SHARED);
	efs_lock_put(lc, &a.req);
	efs_etcd_fault_drop_reply(c, EFS_ETCD_TXN, 1);
	cr_assert_eq(acquire1(lc, &b, 141, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(run_until_retries(lc, 1, 10000), "no unknown outcome");
	cr_assert(holder_exists(141, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_not(holder_exists(141, EFS_META_LOCK_SHARED, "node1"));
	efs_lock_cancel(lc, &b.req);
	cr_assert(efs_test_run_until(&b.done, 1000));
	cr_assert_eq(b.status, -EINTR);
	/* Settled back to what the cache holds: our shared key. */
	cr_assert(run_until_keys(EFS_META_K_HOLDER, 141, 1, 2000));
	efs_test_run_for(100);
	cr_assert(holder_exists(141, EFS_META_LOCK_SHARED, "node1"));
	cr_assert_not(holder_exists(141, EFS_META_LOCK_EXCLUSIVE, "node1"));
	{
		struct efs_meta_key hk = holder_key(141, EFS_META_LOCK_SHARED, "node1");

		cr_assert_eq(key_lease(&hk), efs_session_lease_id(s));
	}
	cr_assert_eq(efs_lock_held(lc, 141), EFS_LOCK_SHARED);
	/* The upgrade works afterwards. */
	take(lc, &b, 141, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(efs_lock_held(lc, 141), EFS_LOCK_EXCLUSIVE);
	cr_assert_not(holder_exists(141, EFS_META_LOCK_SHARED, "node1"));
	efs_lock_put(lc, &b.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, cancelled_batch_after_an_unknown_outcome_leaves_no_holder_keys)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	uint64_t inos[2] = {142, 143};
	enum efs_lock_mode x2[2] = {EFS_LOCK_EXCLUSIVE, EFS_LOCK_EXCLUSIVE};
	struct lres a;

	efs_etcd_fault_drop_reply(c, EFS_ETCD_TXN, 1);
	cr_assert_eq(acquire(lc, &a, 2, inos, x2), 0);
	cr_assert(run_until_retries(lc, 1, 10000), "no unknown outcome");
	cr_assert(holder_exists(142, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert(holder_exists(143, EFS_META_LOCK_EXCLUSIVE, "node1"));
	efs_lock_cancel(lc, &a.req);
	cr_assert(efs_test_run_until(&a.done, 1000));
	cr_assert_eq(a.status, -EINTR);
	cr_assert(run_until_keys(EFS_META_K_HOLDER, 142, 0, 2000));
	cr_assert(run_until_keys(EFS_META_K_HOLDER, 143, 0, 2000));
	cr_assert(run_until_held(lc, 0, 1000));
	finish(lc);
	efs_test_assert_no_leaks();
}
#endif

Test(lock, recall_key_is_deleted_only_while_the_session_is_active)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	int64_t lease = efs_session_lease_id(s);
	uint64_t end;
	struct lres a;

	put_foreign_holder(144, EFS_META_LOCK_EXCLUSIVE);
	cr_assert_eq(acquire1(lc, &a, 144, EFS_LOCK_SHARED), 0);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 144, 1, 2000));
	/* Renewals stop: the session suspends; no mutation may go out now. */
	efs_session_fault_pause(s, true);
	end = efs_test_now_ms() + 2000;
	while (efs_session_state(s) != EFS_SESSION_SUSPENDED && efs_test_now_ms() < end)
		efs_test_run_for(5);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_SUSPENDED);
	efs_lock_cancel(lc, &a.req);
	cr_assert(efs_test_run_until(&a.done, 500));
	cr_assert_eq(a.status, -EINTR);
	efs_test_run_for(100);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 144), 1, "deleted without the session guard");
	/* The lease lives: once ACTIVE again, the key must go (it would block
	 * every other node's acquisitions of 144 otherwise). */
	efs_session_fault_pause(s, false);
	end = efs_test_now_ms() + 3000;
	while (!efs_session_is_active(s) && efs_test_now_ms() < end)
		efs_test_run_for(5);
	cr_assert(efs_session_is_active(s));
	cr_assert_eq(efs_session_lease_id(s), lease);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 144, 0, 2000), "stale recall key");
	cr_assert_eq(lstats(lc).held, 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

static void on_released(int status, void *arg)
{
	int *st = arg;

	*st = status;
}

Test(lock, session_loss_forgets_locks_and_release_all_empties_the_cache)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct lres x, y;
	int64_t old_lease = efs_session_lease_id(s);
	uint64_t end;
	int st = 1;

	take(lc, &x, 130, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &x.req);
	take(lc, &x, 131, EFS_LOCK_SHARED);
	/* The lease is revoked behind our back: every holder key goes. */
	{
		Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

		req.id = old_lease;
		cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_REVOKE, &req.base, NULL, NULL),
			     0);
	}
	end = efs_test_now_ms() + 6000;
	while ((efs_session_generation(s) != 2 || !efs_session_is_active(s)) &&
	       efs_test_now_ms() < end)
		efs_test_run_for(10);
	cr_assert_eq(efs_session_generation(s), 2, "session not re-registered");
	cr_assert_eq(efs_lock_held(lc, 130), EFS_LOCK_NONE, "lock survived the session");
	/* Taken again from etcd, on the new lease. */
	cr_assert_eq(acquire1(lc, &y, 130, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&y.done, 3000));
	cr_assert_eq(y.status, 0);
	{
		struct efs_meta_key hk = holder_key(130, EFS_META_LOCK_EXCLUSIVE, "node1");

		cr_assert_eq(key_lease(&hk), efs_session_lease_id(s));
	}
	/* The pin of the lost 131 is void but harmless. */
	cr_assert_eq(efs_lock_guard(lc, NULL, 131, EFS_LOCK_SHARED), -ENOLCK);
	efs_lock_put(lc, &x.req);
	efs_lock_put(lc, &y.req);
	take(lc, &x, 132, EFS_LOCK_SHARED);
	efs_lock_put(lc, &x.req);
	cr_assert_eq(lstats(lc).held, 2);

	cr_assert_eq(efs_lockcache_release_all(lc, on_released, &st), 0);
	cr_assert_eq(st, 1, "release_all called back inline");
	end = efs_test_now_ms() + 3000;
	while (st == 1 && efs_test_now_ms() < end)
		efs_test_run_for(10);
	cr_assert_eq(st, 0, "release_all: %d", st);
	cr_assert_eq(lstats(lc).held, 0);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 130), 0);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 132), 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

/* ---- Grants, ops, forced releases, upgrades across nodes ---- */

/* Runs the loop until |cond| holds or |ms| pass. */
#define RUN_UNTIL(cond, ms)                                                                        \
	do {                                                                                       \
		uint64_t end_ = efs_test_now_ms() + (ms);                                          \
		while (!(cond) && efs_test_now_ms() < end_)                                        \
			efs_test_run_for(5);                                                       \
	} while (0)

/* Ops that record their calls and complete when the test says so. */
struct fake_ops {
	int invalidates, syncs;
	enum efs_lock_mode last_to;
	bool hold_sync;	 /* keep sync's completion pending */
	int sync_status; /* what a completed sync reports */
	efs_lock_done_cb pending;
	void *pending_arg;
};

static void fake_invalidate(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
			    void *darg)
{
	struct fake_ops *f = arg;

	(void)ino;
	f->invalidates++;
	f->last_to = to;
	done(darg, 0);
}

static void fake_sync(void *arg, uint64_t ino, enum efs_lock_mode to, efs_lock_done_cb done,
		      void *darg)
{
	struct fake_ops *f = arg;

	(void)ino;
	f->syncs++;
	f->last_to = to;
	if (f->hold_sync) {
		f->pending = done;
		f->pending_arg = darg;
		return;
	}
	done(darg, f->sync_status);
}

static void fake_complete(struct fake_ops *f, int status)
{
	efs_lock_done_cb cb = f->pending;

	cr_assert(cb, "no sync pending");
	f->pending = NULL;
	cb(f->pending_arg, status);
}

static const struct efs_lock_ops fake_lock_ops = {
	.invalidate = fake_invalidate,
	.sync = fake_sync,
};

struct rel {
	bool done;
	int status;
};

static void on_forced(void *arg, int status)
{
	struct rel *x = arg;

	x->done = true;
	x->status = status;
}

Test(lock, grant_ids_change_with_every_new_hold)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct lres a, b;
	struct rel f = {0};
	uint64_t g1, g2;

	cr_assert_eq(efs_lock_grant(lc, 200), 0);
	take(lc, &a, 200, EFS_LOCK_SHARED);
	g1 = a.req.grant[0];
	cr_assert_neq(g1, 0);
	cr_assert_eq(efs_lock_grant(lc, 200), g1);
	efs_lock_put(lc, &a.req);
	/* A cache hit: the same hold. */
	cr_assert_eq(acquire1(lc, &a, 200, EFS_LOCK_SHARED), 1);
	cr_assert_eq(a.req.grant[0], g1);
	efs_lock_put(lc, &a.req);
	/* An upgrade in place keeps the grant. */
	take(lc, &b, 200, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(b.req.grant[0], g1, "in-place upgrade changed the grant");
	efs_lock_put(lc, &b.req);
	/* A downgrade is a new hold. */
	cr_assert_eq(efs_lock_release_now(lc, 200, EFS_LOCK_SHARED, on_forced, &f), 0);
	cr_assert_not(f.done, "called back inline");
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert_eq(f.status, 0);
	cr_assert_eq(efs_lock_held(lc, 200), EFS_LOCK_SHARED);
	cr_assert(holder_exists(200, EFS_META_LOCK_SHARED, "node1"));
	cr_assert_not(holder_exists(200, EFS_META_LOCK_EXCLUSIVE, "node1"));
	g2 = efs_lock_grant(lc, 200);
	cr_assert(g2 != 0 && g2 != g1, "downgrade kept grant %" PRIu64, g2);
	/* Released: no grant; taken again: another one. */
	f = (struct rel){0};
	cr_assert_eq(efs_lock_release_now(lc, 200, EFS_LOCK_NONE, on_forced, &f), 0);
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert_eq(f.status, 0);
	cr_assert_eq(efs_lock_grant(lc, 200), 0);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 200), 0);
	cr_assert_eq(efs_lock_release_now(lc, 200, EFS_LOCK_NONE, on_forced, &f), 1,
		     "nothing held, yet a release was queued");
	take(lc, &a, 200, EFS_LOCK_EXCLUSIVE);
	cr_assert(a.req.grant[0] != 0 && a.req.grant[0] != g1 && a.req.grant[0] != g2);
	efs_lock_put(lc, &a.req);
	finish(lc);
	efs_test_assert_no_leaks();
}

/* A directory's record, allocated as a decoded one is. */
static Etcfs__Inode *dir_record(void)
{
	Etcfs__Inode r = ETCFS__INODE__INIT;
	ProtobufCBinaryData b;
	Etcfs__Inode *out = NULL;
	const char *why = NULL;

	r.mode = S_IFDIR | 0755;
	r.nlink = 2;
	r.parent = 1;
	cr_assert_eq(efs_meta_pack(&r.base, &b), 0);
	cr_assert_eq(efs_meta_inode_decode(b.data, b.len, &out, &why), 0, "%s", why ? why : "");
	efs_mem_free(b.data);
	return out;
}

static void release_to(struct efs_lockcache *lc, uint64_t ino, enum efs_lock_mode to)
{
	struct rel f = {0};

	cr_assert_eq(efs_lock_release_now(lc, ino, to, on_forced, &f), 0);
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert_eq(f.status, 0);
}

/*
 * The filesystem's caches are keyed by grant: an inode record and a
 * directory's names filled under one hold are not used under the next,
 * though a lock is held again (a peer may have changed both in between).
 */
Test(lock, caches_filled_under_one_grant_are_not_used_under_the_next)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct efs_fs fs = {.lc = lc, .epoch = 1};
	struct efs_fs_inode dir = {.ino = 300};
	struct lres a;
	uint64_t ino = 0;
	uint32_t type = 0;

	take(lc, &a, 300, EFS_LOCK_EXCLUSIVE);
	efs_fs_inode_set(&fs, &dir, dir_record(), 7, true);
	efs_fs_dcache_put(&fs, &dir, "x", 1, 301, DT_REG);
	cr_assert(efs_fs_inode_valid(&fs, &dir));
	cr_assert_eq(efs_fs_dcache_get(&fs, &dir, "x", 1, &ino, &type), 1);
	cr_assert_eq(ino, 301);
	efs_lock_put(lc, &a.req);
	release_to(lc, 300, EFS_LOCK_NONE);
	cr_assert_not(efs_fs_inode_valid(&fs, &dir), "trusted without a lock");
	take(lc, &a, 300, EFS_LOCK_EXCLUSIVE);
	cr_assert_not(efs_fs_inode_valid(&fs, &dir), "the record of the last grant was trusted");
	cr_assert_eq(efs_fs_dcache_get(&fs, &dir, "x", 1, &ino, &type), 0,
		     "a name of the last grant was used");
	/* Filled again under this grant: trusted until a downgrade, which
	 * ends the grant though a shared hold goes on. */
	efs_fs_inode_set(&fs, &dir, dir_record(), 9, true);
	cr_assert(efs_fs_inode_valid(&fs, &dir));
	efs_lock_put(lc, &a.req);
	release_to(lc, 300, EFS_LOCK_SHARED);
	cr_assert_eq(efs_lock_held(lc, 300), EFS_LOCK_SHARED);
	cr_assert_not(efs_fs_inode_valid(&fs, &dir), "the record of the exclusive grant was trusted");
	efs_fs_dcache_clear(&dir);
	efs_fs_inode_set(&fs, &dir, NULL, 0, false);
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, forced_release_waits_for_pins_and_publishes_through_the_ops)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct fake_ops fo = {.hold_sync = true};
	struct lres a, b;
	struct rel f = {0};

	cr_assert_eq(efs_lockcache_set_ops(lc, 1, &fake_lock_ops, &fo), 0);
	cr_assert_eq(efs_lockcache_set_ops(lc, EFS_LOCK_KINDS, &fake_lock_ops, &fo), -EINVAL);
	take(lc, &a, 210, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, 210, 1);
	/* An operation in flight: nothing happens until it ends. */
	cr_assert_eq(efs_lock_release_now(lc, 210, EFS_LOCK_NONE, on_forced, &f), 0);
	efs_test_run_for(300);
	cr_assert_not(f.done);
	cr_assert_eq(fo.invalidates + fo.syncs, 0, "ops ran under a pin");
	cr_assert(holder_exists(210, EFS_META_LOCK_EXCLUSIVE, "node1"));
	efs_lock_put(lc, &a.req);
	/* Invalidate, then sync; the lock is still usable meanwhile. */
	RUN_UNTIL(fo.syncs == 1, 2000);
	cr_assert(fo.syncs == 1, "sync not called");
	cr_assert_eq(fo.invalidates, 1);
	cr_assert_eq(fo.last_to, EFS_LOCK_NONE);
	cr_assert_eq(efs_lock_held(lc, 210), EFS_LOCK_EXCLUSIVE);
	/* A writeback takes it while sync runs (a forced release drains
	 * every other request): the preparation is void. */
	cr_assert_eq(acquire1f(lc, &b, 210, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 1);
	fake_complete(&fo, 0);
	efs_test_run_for(300);
	cr_assert_not(f.done, "released after an operation used it during sync");
	cr_assert(holder_exists(210, EFS_META_LOCK_EXCLUSIVE, "node1"));
	efs_lock_put(lc, &b.req);
	/* Prepared again, this time undisturbed: released. */
	RUN_UNTIL(fo.syncs == 2, 2000);
	cr_assert(fo.syncs == 2, "sync not called again");
	cr_assert_eq(fo.invalidates, 2);
	/* A failing sync keeps the lock; the release is tried again. */
	fake_complete(&fo, -EIO);
	efs_test_run_for(100);
	cr_assert_not(f.done);
	cr_assert(holder_exists(210, EFS_META_LOCK_EXCLUSIVE, "node1"));
	fo.hold_sync = false;
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert_eq(f.status, 0);
	cr_assert_geq(fo.syncs, 3);
	cr_assert_eq(efs_lock_held(lc, 210), EFS_LOCK_NONE);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 210), 0);
	cr_assert_eq(lstats(lc).forced, 1);
	/* Ops of kind 1 do not apply to locks of kind 0. */
	take(lc, &a, 211, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &a.req);
	f = (struct rel){0};
	fo.syncs = 0;
	cr_assert_eq(efs_lock_release_now(lc, 211, EFS_LOCK_NONE, on_forced, &f), 0);
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert_eq(fo.syncs, 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

/*
 * A forced release drains the lock: from the moment it is asked for,
 * operations wait and take the lock anew after it went (so a steady stream
 * of them cannot starve it), while writeback and nested requests are still
 * served from the cache. Negative control: with the drain gone, the plain
 * acquisition below is a cache hit (acquire returns 1) and the test fails.
 */
Test(lock, forced_release_drains_the_lock_but_serves_writeback)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct fake_ops fo = {.hold_sync = true};
	struct lres a, w, n, plain;
	struct rel f = {0};
	uint64_t g;

	cr_assert_eq(efs_lockcache_set_ops(lc, 1, &fake_lock_ops, &fo), 0);
	take(lc, &a, 230, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, 230, 1);
	g = a.req.grant[0];
	cr_assert_eq(efs_lock_release_now(lc, 230, EFS_LOCK_NONE, on_forced, &f), 0);
	efs_test_run_for(50);
	/* Drained while the operation in flight still pins it. */
	cr_assert_eq(acquire1(lc, &plain, 230, EFS_LOCK_SHARED), 0,
		     "a plain request was served from a lock being force-released");
	efs_lock_put(lc, &a.req);
	RUN_UNTIL(fo.syncs == 1, 2000);
	cr_assert_eq(fo.syncs, 1, "sync not called");
	cr_assert_not(plain.done, "the waiting request ran before the release");
	/* What the preparation itself needs is served. */
	cr_assert_eq(acquire1f(lc, &w, 230, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 1);
	cr_assert_eq(w.req.grant[0], g);
	cr_assert_eq(acquire1f(lc, &n, 230, EFS_LOCK_SHARED, EFS_LOCK_F_NESTED), 1);
	efs_lock_put(lc, &n.req);
	efs_lock_put(lc, &w.req);
	fo.hold_sync = false;
	fake_complete(&fo, 0);
	cr_assert(efs_test_run_until(&f.done, 3000), "the forced release never ended");
	cr_assert_eq(f.status, 0);
	cr_assert_geq(fo.syncs, 2, "not prepared again after the writeback used the lock");
	/* The waiting request took the lock anew: another hold. */
	cr_assert(efs_test_run_until(&plain.done, 3000), "the drained request never ran");
	cr_assert_eq(plain.status, 0);
	cr_assert(plain.req.grant[0] != 0 && plain.req.grant[0] != g,
		  "the drained request kept the released grant");
	cr_assert(holder_exists(230, EFS_META_LOCK_SHARED, "node1"));
	cr_assert_not(holder_exists(230, EFS_META_LOCK_EXCLUSIVE, "node1"));
	efs_lock_put(lc, &plain.req);
	/* A failing preparation ends the drain: operations go on. */
	f = (struct rel){0};
	fo.hold_sync = true;
	take(lc, &a, 231, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, 231, 1);
	efs_lock_put(lc, &a.req);
	cr_assert_eq(efs_lock_release_now(lc, 231, EFS_LOCK_NONE, on_forced, &f), 0);
	RUN_UNTIL(fo.syncs == 3, 2000);
	cr_assert_eq(fo.syncs, 3);
	cr_assert_eq(acquire1(lc, &plain, 231, EFS_LOCK_EXCLUSIVE), 0);
	fake_complete(&fo, -EIO);
	cr_assert(efs_test_run_until(&plain.done, 2000), "a failed preparation kept the drain");
	cr_assert_eq(plain.status, 0);
	cr_assert_eq(plain.req.grant[0], efs_lock_grant(lc, 231), "not the same hold");
	cr_assert_not(f.done);
	fo.hold_sync = false;
	efs_lock_put(lc, &plain.req);
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert_eq(f.status, 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

/*
 * A forced release (what a recall calls) drains the lock the moment it is
 * asked for, also while another release transaction is in flight: every
 * reply from then on carries zero kernel timeouts (efs_lock_may_cache),
 * no change is deferred under it (efs_lock_touch) and a plain request
 * waits. Negative control: with the drain left to the release's next
 * attempt (which waits for the transaction in flight), the lock may still
 * be cached right after the call and the test fails.
 */
Test(lock, a_recall_drains_at_once_while_another_release_is_in_flight)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 60000, 0, 0);
	struct lres a, plain;
	struct rel f1 = {0}, f2 = {0};
	uint64_t end;

	take(lc, &a, 250, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &a.req);
	take(lc, &a, 251, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &a.req);
	cr_assert(efs_lock_may_cache(lc, 251));
	/* 250's release transaction goes out and stays unanswered: etcd is
	 * paused. */
	cr_assert_eq(efs_lock_release_now(lc, 250, EFS_LOCK_NONE, on_forced, &f1), 0);
	cr_assert_eq(efs_harness_pause(h, 0), 0);
	end = efs_test_now_ms() + 3000;
	while (efs_lock_held(lc, 250) != EFS_LOCK_NONE && efs_test_now_ms() < end)
		efs_test_run_for(5);
	efs_test_run_for(50);
	cr_assert_eq(efs_lock_held(lc, 250), EFS_LOCK_NONE, "250 was never being released");
	cr_assert_not(f1.done, "250's release ended while etcd was paused");
	/* 251 is recalled meanwhile: drained at once. */
	cr_assert_eq(efs_lock_release_now(lc, 251, EFS_LOCK_NONE, on_forced, &f2), 0);
	cr_assert_not(efs_lock_may_cache(lc, 251),
		      "replies under a recalled lock still carry kernel timeouts");
	cr_assert_not(efs_lock_touch(lc, 251, EFS_LOCK_EXCLUSIVE),
		      "a change was deferred under a recalled lock");
	cr_assert_eq(acquire1(lc, &plain, 251, EFS_LOCK_SHARED), 0,
		     "a plain request was served from a recalled lock");
	efs_test_run_for(50);
	cr_assert_not(efs_lock_may_cache(lc, 251));
	cr_assert_eq(efs_harness_resume(h, 0), 0);
	cr_assert(efs_test_run_until(&f1.done, 3000));
	cr_assert(efs_test_run_until(&f2.done, 3000), "251's release never ended");
	cr_assert_eq(f2.status, 0);
	cr_assert(efs_test_run_until(&plain.done, 3000), "the drained request never ran");
	cr_assert_eq(plain.status, 0);
	efs_lock_put(lc, &plain.req);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 250), 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

/*
 * A downgrade to shared is prepared once however many reads this node
 * serves meanwhile (what they cache stays valid under the shared lock,
 * and every repeated invalidation would make the kernel drop the
 * attributes those reads fetch); an exclusive use meanwhile (writeback)
 * still makes it prepare again. A release to none counts every pin.
 */
Test(lock, reads_during_a_downgrade_do_not_make_it_prepare_again)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct fake_ops fo = {.hold_sync = true};
	struct lres a, r, w;
	struct rel f = {0};

	cr_assert_eq(efs_lockcache_set_ops(lc, 1, &fake_lock_ops, &fo), 0);
	take(lc, &a, 234, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, 234, 1);
	efs_lock_put(lc, &a.req);
	cr_assert_eq(efs_lock_release_now(lc, 234, EFS_LOCK_SHARED, on_forced, &f), 0);
	RUN_UNTIL(fo.syncs == 1, 2000);
	cr_assert_eq(fo.invalidates, 1);
	/* A read (it pins the pages it fills) while the publication runs. */
	cr_assert_eq(acquire1f(lc, &r, 234, EFS_LOCK_SHARED, EFS_LOCK_F_PAGES), 1);
	efs_lock_put(lc, &r.req);
	fo.hold_sync = false;
	fake_complete(&fo, 0);
	cr_assert(efs_test_run_until(&f.done, 3000), "the downgrade never ended");
	cr_assert_eq(f.status, 0);
	cr_assert_eq(efs_lock_held(lc, 234), EFS_LOCK_SHARED);
	cr_assert_eq(fo.invalidates, 1, "a read made the downgrade invalidate again (%d)",
		     fo.invalidates);
	cr_assert_eq(fo.syncs, 1);

	/* The same with a writeback meanwhile: prepared again. */
	f = (struct rel){0};
	fo = (struct fake_ops){.hold_sync = true};
	take(lc, &a, 235, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, 235, 1);
	efs_lock_put(lc, &a.req);
	cr_assert_eq(efs_lock_release_now(lc, 235, EFS_LOCK_SHARED, on_forced, &f), 0);
	RUN_UNTIL(fo.syncs == 1, 2000);
	cr_assert_eq(acquire1f(lc, &w, 235, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 1);
	efs_lock_put(lc, &w.req);
	fo.hold_sync = false;
	fake_complete(&fo, 0);
	cr_assert(efs_test_run_until(&f.done, 3000), "the downgrade never ended");
	cr_assert_geq(fo.syncs, 2, "not prepared again after a writeback used the lock");

	/* A release to none: a read meanwhile does make it prepare again. */
	f = (struct rel){0};
	fo = (struct fake_ops){.hold_sync = true};
	take(lc, &a, 236, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, 236, 1);
	efs_lock_put(lc, &a.req);
	cr_assert_eq(efs_lock_release_now(lc, 236, EFS_LOCK_NONE, on_forced, &f), 0);
	RUN_UNTIL(fo.syncs == 1, 2000);
	cr_assert_eq(acquire1f(lc, &r, 236, EFS_LOCK_SHARED, EFS_LOCK_F_PAGES), 1);
	efs_lock_put(lc, &r.req);
	fo.hold_sync = false;
	fake_complete(&fo, 0);
	cr_assert(efs_test_run_until(&f.done, 3000), "the release never ended");
	cr_assert_geq(fo.invalidates, 2, "a release kept pages a read filled meanwhile");
	finish(lc);
	efs_test_assert_no_leaks();
}

Test(lock, idle_release_publishes_through_the_ops_first)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 200, 0, 0);
	struct fake_ops fo = {0};
	struct lres a;

	cr_assert_eq(efs_lockcache_set_ops(lc, 0, &fake_lock_ops, &fo), 0);
	take(lc, &a, 215, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &a.req);
	cr_assert(run_until_held(lc, 0, 3000), "not released idle");
	cr_assert_eq(fo.syncs, 1);
	/* The kernel caches had expired: nothing to invalidate. */
	cr_assert_eq(fo.invalidates, 0);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 215), 0);
	finish(lc);
	efs_test_assert_no_leaks();
}

/* What a publisher does from within the sync op: a transaction that
 * publishes (a put of inode |ino|'s record here) under the lock's guard,
 * carrying the release when the lock cache allows it. Returns what
 * efs_lock_release_in_txn said; *ok: whether it committed. */
static int publish_with_release(struct efs_lockcache *lc, uint64_t ino, bool send, bool *ok)
{
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key ik;
	int r;

	cr_assert_eq(efs_meta_key_inode(&ns, ino, &ik), 0);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, ik.buf, ik.len, "pub", 3, 0), 0);
	r = efs_lock_release_in_txn(lc, t, ino);
	/* The engine adds the lock guards after the build. */
	cr_assert_eq(efs_lock_guard(lc, t, ino, EFS_LOCK_EXCLUSIVE), 0,
		     "the guard of a lock whose release rides the transaction");
	if (send)
		*ok = txn_ok(t);
	efs_etcd_txn_free(t);
	return r;
}

/*
 * Takes |ino| exclusive (ops of kind 1) and asks for its release to |to|;
 * once the preparation's sync op runs (the |syncs|th call), pins the lock
 * as the publisher does, after another operation's pin when |other|.
 */
static void at_sync(struct efs_lockcache *lc, struct fake_ops *fo, struct lres *w, uint64_t ino,
		    enum efs_lock_mode to, struct rel *f, int syncs, bool other)
{
	struct lres o;

	take(lc, w, ino, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc, ino, 1);
	efs_lock_put(lc, &w->req);
	*f = (struct rel){0};
	fo->hold_sync = true;
	cr_assert_eq(efs_lock_release_now(lc, ino, to, on_forced, f), 0);
	RUN_UNTIL(fo->syncs == syncs, 2000);
	cr_assert_eq(fo->syncs, syncs, "sync not called");
	if (other) {
		cr_assert_eq(acquire1f(lc, &o, ino, EFS_LOCK_SHARED, EFS_LOCK_F_NESTED), 1);
		efs_lock_put(lc, &o.req);
	}
	cr_assert_eq(acquire1f(lc, w, ino, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 1);
}

/* The publisher's operation ends, then its sync: the release is over. */
static void sync_ends(struct efs_lockcache *lc, struct fake_ops *fo, struct lres *w, struct rel *f)
{
	efs_lock_put(lc, &w->req);
	fo->hold_sync = false;
	fake_complete(fo, 0);
	cr_assert(efs_test_run_until(&f->done, 3000), "the forced release never ended");
	cr_assert_eq(f->status, 0);
}

/*
 * The transaction that publishes what a lock covers also gives the lock
 * up (one commit per handover, not two), but only while the publisher's
 * own pin is the only one taken since the preparation began; a downgrade
 * puts the shared key in the same transaction; a failed one keeps the
 * lock; an unknown one is settled by the lock cache. Negative control:
 * efs_lock_release_in_txn returning 0 always fails the first assertion.
 */
Test(lock, a_release_rides_the_transaction_that_publishes_for_it)
{
	struct efs_lockcache *lc = new_lc(s, c, 0, 0, 0, 0);
	struct fake_ops fo = {0};
	struct lres w, w2;
	struct rel f;
	uint64_t txns, g;
	bool ok = false;

	cr_assert_eq(efs_lockcache_set_ops(lc, 1, &fake_lock_ops, &fo), 0);
	cr_assert_eq(efs_lock_release_in_txn(lc, NULL, 250), -EINVAL);
	at_sync(lc, &fo, &w, 250, EFS_LOCK_NONE, &f, 1, false);
	g = efs_lock_grant(lc, 250);
	txns = lstats(lc).release_txns;
	cr_assert_eq(publish_with_release(lc, 250, false, NULL), 1,
		     "the release did not ride the publication");
	/* From now on nothing is served from the entry, writeback neither. */
	cr_assert_eq(efs_lock_held(lc, 250), EFS_LOCK_NONE);
	cr_assert_eq(acquire1f(lc, &w2, 250, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 0,
		     "served from a lock whose release is in flight");
	/* Built again (a rebuild): the same operations again. */
	cr_assert_eq(publish_with_release(lc, 250, true, &ok), 1);
	cr_assert(ok, "the publication failed");
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 250), 0, "the holder key outlived the commit");
	efs_lock_release_in_txn_outcome(lc, 250, EFS_LOCK_TXN_COMMITTED, 0);
	sync_ends(lc, &fo, &w, &f);
	cr_assert_eq(lstats(lc).release_txns, txns, "a release transaction of its own was sent");
	cr_assert_eq(lstats(lc).releases_in_txn, 1);
	cr_assert_eq(fo.syncs, 1, "prepared again");
	/* The waiting writeback took the lock anew. */
	cr_assert(efs_test_run_until(&w2.done, 3000));
	cr_assert_eq(w2.status, 0);
	cr_assert(w2.req.grant[0] != g, "the released grant was kept");
	efs_lock_put(lc, &w2.req);

	/* Another pin since the preparation began: not riding; the release
	 * goes its old way (and prepares again). */
	at_sync(lc, &fo, &w, 250, EFS_LOCK_NONE, &f, 2, true);
	cr_assert_eq(publish_with_release(lc, 250, true, &ok), 0,
		     "rode although another operation used the lock during its sync");
	cr_assert(ok);
	cr_assert_eq(efs_lock_held(lc, 250), EFS_LOCK_EXCLUSIVE);
	sync_ends(lc, &fo, &w, &f);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 250), 0);
	cr_assert_eq(fo.syncs, 3);

	/* A downgrade: the shared key comes in the same transaction. */
	at_sync(lc, &fo, &w, 251, EFS_LOCK_SHARED, &f, 4, false);
	g = efs_lock_grant(lc, 251);
	cr_assert_eq(publish_with_release(lc, 251, true, &ok), 1);
	cr_assert(ok);
	efs_lock_release_in_txn_outcome(lc, 251, EFS_LOCK_TXN_COMMITTED, 0);
	cr_assert(holder_exists(251, EFS_META_LOCK_SHARED, "node1"));
	cr_assert_not(holder_exists(251, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_eq(efs_lock_held(lc, 251), EFS_LOCK_SHARED);
	cr_assert(efs_lock_grant(lc, 251) != g, "a downgrade kept the grant");
	sync_ends(lc, &fo, &w, &f);

	/* Failed: still held and usable; the release goes on its old way. */
	at_sync(lc, &fo, &w, 252, EFS_LOCK_NONE, &f, 5, false);
	cr_assert_eq(publish_with_release(lc, 252, false, NULL), 1);
	efs_lock_release_in_txn_outcome(lc, 252, EFS_LOCK_TXN_FAILED, 0);
	cr_assert_eq(efs_lock_held(lc, 252), EFS_LOCK_EXCLUSIVE, "a failed one gave the lock up");
	cr_assert(holder_exists(252, EFS_META_LOCK_EXCLUSIVE, "node1"));
	sync_ends(lc, &fo, &w, &f);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 252), 0);

	/* Unknown (here: never sent): the lock cache settles the keys. */
	at_sync(lc, &fo, &w, 253, EFS_LOCK_NONE, &f, 7, false);
	cr_assert_eq(publish_with_release(lc, 253, false, NULL), 1);
	efs_lock_release_in_txn_outcome(lc, 253, EFS_LOCK_TXN_UNKNOWN, 0);
	cr_assert(run_until_keys(EFS_META_K_HOLDER, 253, 0, 3000), "an unknown one left the key");
	sync_ends(lc, &fo, &w, &f);
	cr_assert_eq(efs_lock_held(lc, 253), EFS_LOCK_NONE);
	finish(lc);
	efs_test_assert_no_leaks();
}

/* A second node (session "node2" on its own client) and a lock cache on
 * each node whose idle locks stay cached for a minute, so that only a
 * forced release or a recall gives them up; node2 waits at most
 * |wait2_ms| (0: no bound) for a lock. */
static void two_nodes(struct efs_lockcache **lc1, struct efs_lockcache **lc2, uint32_t wait2_ms)
{
	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	*lc1 = new_lc(s, c, 0, 60000, 0, 0);
	*lc2 = new_lc(s2, c2, 0, 60000, 0, wait2_ms);
}

Test(lock, two_nodes_upgrading_a_shared_lock_never_deadlock)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2, x1, x2;
	uint64_t end;

	two_nodes(&lc1, &lc2, 0);
	take(lc1, &a1, 220, EFS_LOCK_SHARED);
	take(lc2, &a2, 220, EFS_LOCK_SHARED);
	efs_lock_put(lc1, &a1.req);
	efs_lock_put(lc2, &a2.req);
	/* Both ask for X while both hold S. */
	cr_assert_eq(acquire1(lc1, &x1, 220, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert_eq(acquire1(lc2, &x2, 220, EFS_LOCK_EXCLUSIVE), 0);
	end = efs_test_now_ms() + 5000;
	while (!x1.done && !x2.done && efs_test_now_ms() < end)
		efs_test_run_for(10);
	cr_assert(x1.done || x2.done, "deadlock: neither upgrade was granted");
	{
		struct lres *won = x1.done ? &x1 : &x2, *lost = x1.done ? &x2 : &x1;
		struct efs_lockcache *wlc = x1.done ? lc1 : lc2, *llc = x1.done ? lc2 : lc1;
		struct rel f = {0};

		cr_assert_eq(won->status, 0);
		cr_assert_not(lost->done);
		cr_assert_geq(lstats(lc1).upgrade_yields + lstats(lc2).upgrade_yields, 1);
		/* The winner gives it up (a recall will do this): the other
		 * gets it. */
		efs_lock_put(wlc, &won->req);
		cr_assert_eq(efs_lock_release_now(wlc, 220, EFS_LOCK_NONE, on_forced, &f), 0);
		cr_assert(efs_test_run_until(&f.done, 3000));
		cr_assert(efs_test_run_until(&lost->done, 5000), "the waiting upgrade never ran");
		cr_assert_eq(lost->status, 0);
		cr_assert_eq(efs_lock_held(llc, 220), EFS_LOCK_EXCLUSIVE);
		efs_lock_put(llc, &lost->req);
	}
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 220), 1);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 220), 0);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/*
 * A release being prepared for a shared hold that an upgrade then gives up
 * and takes again as exclusive (a new grant) must not stay "preparing"
 * for ever: the cluster suite's namespace races hung this way, with the
 * directory never released again. Negative control: without clearing the
 * void preparation, the forced release below never completes.
 */
Test(lock, a_preparation_made_void_by_a_new_hold_lets_the_release_go_on)
{
	struct efs_lockcache *lc1, *lc2;
	struct fake_ops fo = {.hold_sync = true};
	struct lres a1, a2, x1;
	struct rel f = {0};

	two_nodes(&lc1, &lc2, 0);
	cr_assert_eq(efs_lockcache_set_ops(lc1, 1, &fake_lock_ops, &fo), 0);
	take(lc1, &a1, 233, EFS_LOCK_SHARED);
	efs_lock_set_kind(lc1, 233, 1);
	take(lc2, &a2, 233, EFS_LOCK_SHARED); /* pinned until node 1 yields */
	efs_lock_put(lc1, &a1.req);
	/* Node 1's release of its shared hold waits in sync ... */
	cr_assert_eq(efs_lock_release_now(lc1, 233, EFS_LOCK_NONE, on_forced, &f), 0);
	RUN_UNTIL(fo.syncs == 1, 3000);
	cr_assert_eq(fo.syncs, 1, "sync not called");
	/* ... while an upgrade that passes the drain gives the shared hold
	 * up behind node 2's and, once node 2 goes, holds it exclusive. */
	cr_assert_eq(acquire1f(lc1, &x1, 233, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 0);
	RUN_UNTIL(lstats(lc1).upgrade_yields == 1, 5000);
	cr_assert_eq(lstats(lc1).upgrade_yields, 1, "the upgrade did not give its hold up");
	efs_lock_put(lc2, &a2.req); /* node 2 answers node 1's recall */
	cr_assert(efs_test_run_until(&x1.done, 5000), "the upgrade was never granted");
	cr_assert_eq(x1.status, 0);
	cr_assert_eq(efs_lock_held(lc1, 233), EFS_LOCK_EXCLUSIVE);
	/* The old preparation ends now; the release must still happen. */
	fo.hold_sync = false;
	fake_complete(&fo, 0);
	efs_lock_put(lc1, &x1.req);
	cr_assert(efs_test_run_until(&f.done, 5000), "the release stayed preparing for ever");
	cr_assert_eq(f.status, 0);
	cr_assert_eq(efs_lock_held(lc1, 233), EFS_LOCK_NONE);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 233), 0);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/*
 * An acquisition that pins X and waits for Y, which another acquisition of
 * the same node is taking (from a peer), has no recall key of its own:
 * a peer's recall of X must still not wait for it, or a peer that holds Y
 * while it waits for X deadlocks both nodes. Negative control: with the
 * yield limited to acquisitions that wait behind a recall key of their
 * own, node 2 gets X only once node 1's acquisition is done.
 */
Test(lock, a_wait_for_a_local_acquisition_never_delays_a_recall)
{
	static const uint64_t xy[2] = {240, 241};
	static const enum efs_lock_mode ex2[2] = {EFS_LOCK_EXCLUSIVE, EFS_LOCK_EXCLUSIVE};
	struct efs_lockcache *lc1, *lc2;
	struct lres x1, y2, b1, a1, q2;

	two_nodes(&lc1, &lc2, 0);
	take(lc1, &x1, 240, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &x1.req); /* node 1 caches X */
	take(lc2, &y2, 241, EFS_LOCK_EXCLUSIVE); /* node 2 pins Y */
	cr_assert_eq(acquire1(lc1, &b1, 241, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 241, 1, 3000), "no recall key for Y");
	/* Node 1's second acquisition pins X and waits for the first. */
	cr_assert_eq(acquire(lc1, &a1, 2, xy, ex2), 0);
	efs_test_run_for(200);
	cr_assert_not(a1.done);
	cr_assert_not(b1.done);
	/* Node 2 recalls X. */
	cr_assert_eq(acquire1(lc2, &q2, 240, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&q2.done, 5000),
		  "a wait for a local acquisition kept a peer's recall waiting");
	cr_assert_eq(q2.status, 0);
	cr_assert_geq(lstats(lc1).acq_yields, 1);
	cr_assert_not(a1.done);
	/* Everything then goes through. */
	efs_lock_put(lc2, &q2.req);
	efs_lock_put(lc2, &y2.req);
	cr_assert(efs_test_run_until(&b1.done, 5000), "Y never came to node 1");
	cr_assert_eq(b1.status, 0);
	efs_lock_put(lc1, &b1.req);
	cr_assert(efs_test_run_until(&a1.done, 5000), "the waiting acquisition never ended");
	cr_assert_eq(a1.status, 0);
	cr_assert_eq(efs_lock_held(lc1, 240), EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(efs_lock_held(lc1, 241), EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &a1.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/* Waits (bounded) until |lc| holds |ino| in exactly |m|. */
static bool run_until_mode(struct efs_lockcache *lc, uint64_t ino, enum efs_lock_mode m,
			   uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (efs_lock_held(lc, ino) != m && efs_test_now_ms() < end)
		efs_test_run_for(10);
	return efs_lock_held(lc, ino) == m;
}

struct recall_waits {
	int n;
	uint64_t ns;
};

static void on_recall_wait(void *arg, uint64_t wait_ns)
{
	struct recall_waits *w = arg;

	w->n++;
	w->ns = wait_ns;
}

Test(lock, a_recall_key_of_another_node_releases_an_idle_lock)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;
	struct recall_waits rw1 = {0}, rw2 = {0};
	uint64_t t0;

	two_nodes(&lc1, &lc2, 20000);
	efs_lockcache_set_recall_wait_cb(lc1, on_recall_wait, &rw1);
	efs_lockcache_set_recall_wait_cb(lc2, on_recall_wait, &rw2);
	take(lc1, &a1, 230, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &a1.req);
	t0 = efs_test_now_ms();
	cr_assert_eq(acquire1(lc2, &a2, 230, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&a2.done, 10000), "the recall was not answered");
	cr_assert_eq(a2.status, 0);
	cr_assert_lt(efs_test_now_ms() - t0, 10000);
	cr_assert_eq(efs_lock_held(lc1, 230), EFS_LOCK_NONE);
	cr_assert_geq(lstats(lc1).recalls, 1);
	cr_assert_eq(lstats(lc2).recalls, 0, "a node answered its own recall key");
	/* The waiter measured its wait, from its recall key to the grant. */
	cr_assert_eq(rw2.n, 1, "recall waits reported: %d", rw2.n);
	cr_assert(rw2.ns > 0 && rw2.ns < 10000 * 1000000ull, "recall wait %" PRIu64 " ns", rw2.ns);
	cr_assert_eq(rw1.n, 0, "the holder reported a wait");
	/* And back: node1's recall key makes node2 give it up while node2's
	 * own operation still pins it, once the pin goes. */
	cr_assert_eq(acquire1(lc1, &a1, 230, EFS_LOCK_EXCLUSIVE), 0);
	efs_test_run_for(300);
	cr_assert_not(a1.done, "granted while the other node pinned the lock");
	efs_lock_put(lc2, &a2.req);
	cr_assert(efs_test_run_until(&a1.done, 10000), "the recall was not answered after the pin");
	cr_assert_eq(a1.status, 0);
	efs_lock_put(lc1, &a1.req);
	cr_assert(run_until_mode(lc2, 230, EFS_LOCK_NONE, 3000));
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 230), 1);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 230, 0, 3000), "recall keys left behind");
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

Test(lock, a_shared_recall_downgrades_an_exclusive_holder)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;

	two_nodes(&lc1, &lc2, 20000);
	take(lc1, &a1, 231, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &a1.req);
	cr_assert_eq(acquire1(lc2, &a2, 231, EFS_LOCK_SHARED), 0);
	cr_assert(efs_test_run_until(&a2.done, 10000), "the shared recall was not answered");
	cr_assert_eq(a2.status, 0);
	/* Downgraded, not released: both read under a shared lock. The
	 * waiter may learn of the downgrade from its watch before the holder
	 * has the reply of its own transaction, so wait for the holder too. */
	cr_assert(run_until_mode(lc1, 231, EFS_LOCK_SHARED, 3000),
		  "the holder is not left shared: %d", efs_lock_held(lc1, 231));
	cr_assert_eq(efs_lock_held(lc2, 231), EFS_LOCK_SHARED);
	efs_lock_put(lc2, &a2.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

static bool never_shared(void *arg, uint64_t ino)
{
	(void)arg;
	return ino == 232;
}

static const struct efs_lock_ops no_shared_ops = {
	.invalidate = fake_invalidate,
	.sync = fake_sync,
	.no_shared = never_shared,
};

/*
 * A kind whose locks must not be kept shared (a file this node has open
 * for writing: its next page-cache write could not wait for an upgrade)
 * answers a recall for shared access by releasing the lock wholly.
 * Negative control: inode 233 of the same kind is downgraded as usual.
 */
Test(lock, a_shared_recall_releases_a_lock_that_must_not_be_kept_shared)
{
	struct efs_lockcache *lc1, *lc2;
	struct fake_ops fo = {0};
	struct lres a1, a2;

	two_nodes(&lc1, &lc2, 20000);
	cr_assert_eq(efs_lockcache_set_ops(lc1, 1, &no_shared_ops, &fo), 0);
	for (uint64_t ino = 232; ino <= 233; ino++) {
		take(lc1, &a1, ino, EFS_LOCK_EXCLUSIVE);
		efs_lock_set_kind(lc1, ino, 1);
		efs_lock_put(lc1, &a1.req);
		cr_assert_eq(acquire1(lc2, &a2, ino, EFS_LOCK_SHARED), 0);
		cr_assert(efs_test_run_until(&a2.done, 10000), "the shared recall was not answered");
		cr_assert_eq(a2.status, 0);
		cr_assert_eq(efs_lock_held(lc2, ino), EFS_LOCK_SHARED);
		efs_lock_put(lc2, &a2.req);
	}
	cr_assert_eq(efs_lock_held(lc1, 232), EFS_LOCK_NONE, "kept shared though it must not be");
	cr_assert_not(holder_exists(232, EFS_META_LOCK_SHARED, "node1"));
	/* The waiter may learn of the downgrade before node1 has its reply. */
	cr_assert(run_until_mode(lc1, 233, EFS_LOCK_SHARED, 3000), "the control was not downgraded");
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

#if EFS_FAULT_HOOKS
/*
 * A recall key this node still sees only because its delete event is
 * late (a slow watch) was compared away by the transaction that granted
 * the lock anew: it must not release the fresh hold. Answering it
 * released the lock to this node's own next requests, over and over,
 * each release invalidating the kernel's caches.
 */
Test(lock, a_recall_key_deleted_before_the_grant_does_not_release_it)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;
	struct rel f = {0};
	uint64_t forced;

	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	/* node1's watch events arrive 1 s late (streams opened from now). */
	efs_etcd_fault_watch_delay(c, 1000);
	lc1 = new_lc(s, c, 0, 60000, 0, 0);
	lc2 = new_lc(s2, c2, 0, 60000, 0, 20000);
	take(lc1, &a1, 237, EFS_LOCK_SHARED);
	efs_lock_put(lc1, &a1.req);
	efs_test_run_for(1500); /* node1's recall watch runs */
	/* node2's recall key: node1 answers it 1 s late; node2's grant then
	 * deletes the key, which node1 learns another second later. */
	cr_assert_eq(acquire1(lc2, &a2, 237, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&a2.done, 10000), "the recall was not answered");
	cr_assert_eq(a2.status, 0);
	efs_lock_put(lc2, &a2.req);
	cr_assert_eq(efs_lock_release_now(lc2, 237, EFS_LOCK_NONE, on_forced, &f), 0);
	cr_assert(efs_test_run_until(&f.done, 3000), "node2's release never ended");
	/* node1 takes it again, with no conflict, within that second. */
	take(lc1, &a1, 237, EFS_LOCK_SHARED);
	forced = lstats(lc1).forced;
	efs_lock_put(lc1, &a1.req);
	efs_test_run_for(300);
	cr_assert_eq(efs_lock_held(lc1, 237), EFS_LOCK_SHARED,
		     "node1 gave its new hold up to a recall key deleted before it was granted");
	cr_assert_eq(lstats(lc1).forced, forced);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/* The negative control of the recall tests above: with recall handling off
 * the waiter is not served within its wait bound. */
Test(lock, without_recall_handling_a_waiter_times_out)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;

	two_nodes(&lc1, &lc2, 1500);
	efs_lockcache_fault_no_recall(lc1, true);
	take(lc1, &a1, 232, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &a1.req);
	cr_assert_eq(acquire1(lc2, &a2, 232, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&a2.done, 10000));
	cr_assert_eq(a2.status, -ETIMEDOUT);
	cr_assert_eq(efs_lock_held(lc1, 232), EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(lstats(lc1).recalls, 0);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}
#endif

/*
 * A recall this node does not answer within the bound (here its operation
 * keeps the lock pinned) is counted once, when it comes due: the check
 * looks only when a recall is due, so a regression that never schedules
 * it leaves the count at 0.
 */
Test(lock, a_recall_not_answered_within_the_bound_is_counted_once)
{
	struct efs_lockcache_opts o = {.ns = &ns, .idle_ms = 60000, .recall_bound_ms = 400};
	struct efs_lockcache *lc1 = NULL, *lc2;
	struct lres a1, a2;

	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	cr_assert_eq(efs_lockcache_new(&lc1, &efs_test_loop, c, s, &o), 0);
	lc2 = new_lc(s2, c2, 0, 60000, 0, 0);
	take(lc1, &a1, 262, EFS_LOCK_EXCLUSIVE); /* pinned: the recall waits */
	cr_assert_eq(acquire1(lc2, &a2, 262, EFS_LOCK_EXCLUSIVE), 0);
	RUN_UNTIL(lstats(lc1).recalls == 1, 3000);
	cr_assert_eq(lstats(lc1).recalls, 1, "the recall never came");
	efs_test_run_for(150);
	cr_assert_eq(lstats(lc1).recalls_unanswered, 0, "counted before the bound");
	RUN_UNTIL(lstats(lc1).recalls_unanswered == 1, 3000);
	cr_assert_eq(lstats(lc1).recalls_unanswered, 1, "never counted");
	efs_test_run_for(600);
	cr_assert_eq(lstats(lc1).recalls_unanswered, 1, "counted again");
	efs_lock_put(lc1, &a1.req);
	cr_assert(efs_test_run_until(&a2.done, 5000));
	cr_assert_eq(a2.status, 0);
	efs_lock_put(lc2, &a2.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/* ---- Takeover from a peer whose session ended ---- */

struct placed {
	bool done, inplace;
};

static void on_placed(void *arg, bool inplace)
{
	struct placed *p = arg;

	p->done = true;
	p->inplace = inplace;
}

/* Asks whether a write of |ino| may go in place now: 1 or 0 (-1: no answer). */
static int placed(struct efs_lockcache *lc, uint64_t ino)
{
	struct placed p = {0};
	int r = efs_lock_inplace_check(lc, ino, on_placed, &p);

	if (r != -EINPROGRESS)
		return r;
	cr_assert_not(p.done, "the answer came inline");
	if (!efs_test_run_until(&p.done, 5000))
		return -1;
	return p.inplace;
}

Test(lock, a_takeover_from_a_peer_whose_session_ended_writes_copy_on_write_for_the_grace)
{
	struct efs_lockcache_opts o = {.ns = &ns, .idle_ms = 60000, .takeover_grace_ms = 3000};
	struct efs_lockcache *lc1, *lc2 = NULL;
	struct lres a1, a2, b2, c2x, d2;
	uint64_t t0;

	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	lc1 = new_lc(s, c, 0, 60000, 0, 0);
	cr_assert_eq(efs_lockcache_new(&lc2, &efs_test_loop, c2, s2, &o), 0);
	efs_test_run_for(300); /* both watch the node keys */

	/* Shared, or not held at all: never in place. */
	take(lc2, &d2, 243, EFS_LOCK_SHARED);
	cr_assert_eq(placed(lc2, 243), 0, "in place under a shared lock");
	cr_assert_eq(placed(lc2, 244), 0, "in place without a lock");

	/* A clean handover (a recall answered) is no death: in place. */
	take(lc1, &a1, 241, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &a1.req);
	take(lc2, &b2, 241, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(placed(lc2, 241), 1, "a write after a clean handover went copy-on-write");
	/* Never held by anyone else: in place. */
	take(lc2, &c2x, 242, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(placed(lc2, 242), 1, "a write of a lock no peer held went copy-on-write");

	/* node1 holds 240 exclusively, pinned, when its lease is revoked
	 * behind its back (as a cut-off node's lease expires). */
	take(lc1, &a1, 240, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(acquire1(lc2, &a2, 240, EFS_LOCK_EXCLUSIVE), 0);
	efs_test_run_for(200);
	cr_assert_not(a2.done, "granted while node1 held it");
	{
		Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

		req.id = efs_session_lease_id(s);
		cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_REVOKE, &req.base, NULL, NULL),
			     0);
	}
	cr_assert(efs_test_run_until(&a2.done, 10000), "node1's lock did not pass to node2");
	cr_assert_eq(a2.status, 0);
	t0 = efs_test_now_ms();
	cr_assert_eq(placed(lc2, 240), 0, "a write after the takeover went in place");
	cr_assert_geq(lstats(lc2).peer_deaths, 1);
	cr_assert_geq(lstats(lc2).takeover_marked, 1);
	cr_assert_geq(lstats(lc2).takeover_cow, 1);
	/* Only what the dead session held is marked. */
	cr_assert_eq(placed(lc2, 242), 1, "a lock the dead node never held went copy-on-write");
	cr_assert_eq(placed(lc2, 241), 1, "a lock handed over cleanly went copy-on-write");
	/* Still marked within the grace, in place after it. */
	efs_test_run_for(1000);
	if (efs_test_now_ms() - t0 < 2500)
		cr_assert_eq(placed(lc2, 240), 0, "in place within the grace period");
	RUN_UNTIL(efs_test_now_ms() - t0 > 3500, 5000);
	cr_assert_eq(placed(lc2, 240), 1, "still copy-on-write after the grace period");

	efs_lock_put(lc1, &a1.req);
	efs_lock_put(lc2, &a2.req);
	efs_lock_put(lc2, &b2.req);
	efs_lock_put(lc2, &c2x.req);
	efs_lock_put(lc2, &d2.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/* ---- Minimum holds and contended locks (lock/heat.h) ---- */

/* Two lock caches on two sessions (as two_nodes) with the hold options. */
static void two_nodes_hold(struct efs_lockcache **lc1, struct efs_lockcache **lc2,
			   uint32_t max_hold_ms, uint32_t contended_recalls)
{
	struct efs_lockcache_opts o = {
		.ns = &ns,
		.idle_ms = 60000,
		.max_hold_ms = max_hold_ms,
		.contended_recalls = contended_recalls,
	};

	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	cr_assert_eq(efs_lockcache_new(lc1, &efs_test_loop, c, s, &o), 0);
	cr_assert_eq(efs_lockcache_new(lc2, &efs_test_loop, c2, s2, &o), 0);
}

static void finish_two(struct efs_lockcache *lc1, struct efs_lockcache *lc2)
{
	efs_lockcache_free(lc2);
	finish(lc1);
}

/* Recalls of other nodes |lc| answered or let wait for a hold. */
static uint64_t recalls_seen(struct efs_lockcache *lc)
{
	struct efs_lockcache_stats st = lstats(lc);

	return st.recalls + st.recalls_deferred;
}

/*
 * One round of |ino| between two nodes: |lc1| takes it exclusively and is
 * still using it (pinned) when |lc2| asks for it; once |lc1| has seen the
 * recall, its operation ends and its next one starts at once. Returns
 * whether that next operation found the lock still cached (a hit rather
 * than a wait for |lc2|'s turn). Every pin is put before it returns.
 */
static bool bounce_round(struct efs_lockcache *lc1, struct efs_lockcache *lc2, uint64_t ino)
{
	struct lres a1, b1, a2;
	uint64_t seen = recalls_seen(lc1), end = efs_test_now_ms() + 5000;
	bool hit;

	take(lc1, &a1, ino, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(acquire1(lc2, &a2, ino, EFS_LOCK_EXCLUSIVE), 0);
	while (recalls_seen(lc1) == seen && efs_test_now_ms() < end)
		efs_test_run_for(1);
	cr_assert_gt(recalls_seen(lc1), seen, "node 1 never saw node 2's recall");
	efs_lock_put(lc1, &a1.req);
	hit = acquire1(lc1, &b1, ino, EFS_LOCK_EXCLUSIVE) == 1;
	if (hit)
		efs_lock_put(lc1, &b1.req);
	cr_assert(efs_test_run_until(&a2.done, 5000), "node 2 was never granted the lock");
	cr_assert_eq(a2.status, 0);
	efs_lock_put(lc2, &a2.req);
	if (!hit) {
		cr_assert(efs_test_run_until(&b1.done, 5000), "node 1 never got the lock back");
		cr_assert_eq(b1.status, 0);
		efs_lock_put(lc1, &b1.req);
	}
	return hit;
}

Test(lock, a_lock_recalled_in_use_again_and_again_is_held_a_minimum_time)
{
	struct efs_lockcache *lc1, *lc2;
	int hits = 0;
	bool last = false;

	/* A cap well above a recall's round trip here, even under the
	 * sanitizers (the default, 20 ms, is about one); contention off, so
	 * that the rounds keep their hold. */
	two_nodes_hold(&lc1, &lc2, 400, EFS_LOCK_HOLD_OFF);
	for (int i = 0; i < 12; i++) {
		last = bounce_round(lc1, lc2, 240);
		hits += last;
	}
	cr_assert(last,
		  "node 1's operation right after node 2's recall waited for the lock (hits in "
		  "12 rounds: %d)",
		  hits);
	cr_assert_geq(lstats(lc1).recalls_deferred, 1);
	cr_assert_eq(lstats(lc1).contended, 0);
	/* The hold ended: node 2 was granted it every round (bounce_round). */
	cr_assert(run_until_keys(EFS_META_K_RECALL, 240, 0, 3000), "recall keys left behind");
	finish_two(lc1, lc2);
	efs_test_assert_no_leaks();
}

Test(lock, without_a_minimum_hold_the_holders_next_operation_waits_for_the_recall)
{
	struct efs_lockcache *lc1, *lc2;

	two_nodes_hold(&lc1, &lc2, EFS_LOCK_HOLD_OFF, EFS_LOCK_HOLD_OFF);
	for (int i = 0; i < 4; i++)
		cr_assert_not(bounce_round(lc1, lc2, 241),
			      "round %d: node 1's next operation found the recalled lock cached", i);
	cr_assert_eq(lstats(lc1).recalls_deferred, 0);
	cr_assert_geq(lstats(lc1).recalls, 4);
	finish_two(lc1, lc2);
	efs_test_assert_no_leaks();
}

Test(lock, a_lock_recalled_again_and_again_is_contended_and_not_cached_by_the_kernel)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, o1;
	uint64_t deferred;
	int rounds = 0;

	two_nodes_hold(&lc1, &lc2, 0, 4);
	while (lstats(lc1).contended == 0 && rounds < 40) {
		bounce_round(lc1, lc2, 250);
		rounds++;
	}
	cr_assert_eq(lstats(lc1).contended, 1, "not contended after %d rounds", rounds);
	/* Held, and nobody asks for it now: still no kernel caching. */
	take(lc1, &a1, 250, EFS_LOCK_EXCLUSIVE);
	take(lc1, &o1, 251, EFS_LOCK_EXCLUSIVE);
	cr_assert_not(efs_lock_may_cache(lc1, 250), "a contended lock let the kernel cache");
	cr_assert(efs_lock_may_cache(lc1, 251), "a quiet lock did not let the kernel cache");
	efs_lock_put(lc1, &a1.req);
	efs_lock_put(lc1, &o1.req);
	/* Its recall is answered at once: no hold. */
	deferred = lstats(lc1).recalls_deferred;
	cr_assert_not(bounce_round(lc1, lc2, 250), "a contended lock was held for its next operation");
	cr_assert_eq(lstats(lc1).recalls_deferred, deferred);
	finish_two(lc1, lc2);
	efs_test_assert_no_leaks();
}

Test(lock, with_contention_tracking_off_such_a_lock_stays_cached)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1;

	two_nodes_hold(&lc1, &lc2, 0, EFS_LOCK_HOLD_OFF);
	for (int i = 0; i < 12; i++)
		bounce_round(lc1, lc2, 252);
	take(lc1, &a1, 252, EFS_LOCK_EXCLUSIVE);
	cr_assert(efs_lock_may_cache(lc1, 252));
	cr_assert_eq(lstats(lc1).contended, 0);
	efs_lock_put(lc1, &a1.req);
	finish_two(lc1, lc2);
	efs_test_assert_no_leaks();
}

/* ---- Early cancel: idle releases ride other transactions ---- */

/* Sends |t| (freed) through the test's own client; its revision, and
 * whether it succeeded in |ok|. */
static int64_t send_txn_rev(struct efs_etcd_txn *t, bool *ok)
{
	Etcdserverpb__TxnResponse *resp = NULL;
	int64_t rev;

	cr_assert_eq(efs_etcd_sync_txn(sc, efs_etcd_txn_request(t), &resp), 0);
	*ok = resp->succeeded;
	rev = resp->header ? resp->header->revision : 0;
	efs_test_pb_free(resp);
	efs_etcd_txn_free(t);
	return rev;
}

/* A transaction of this node's own (the session guard and a put), as the
 * engine sends for a create or a setattr; with |fail| its compare fails. */
static struct efs_etcd_txn *own_txn(bool fail)
{
	static const char key[] = "lk-unrelated";
	struct efs_etcd_txn *t = NULL;

	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), 0);
	if (fail)
		cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_EQUAL, key,
						  strlen(key), 99),
			     0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key, strlen(key), "x", 1, 0), 0);
	return t;
}

Test(lock, an_idle_release_rides_a_transaction_that_goes_out_anyway)
{
	/* Idle after 4 s: riding from 3 s on (three quarters), the tick's
	 * own release from 4 s on. */
	struct efs_lockcache *lc = new_lc(s, c, 0, 4000, 0, 0);
	uint64_t ino[EFS_LOCK_RIDE_MAX], t0;
	struct lres a;
	int64_t rev0, rev;
	bool ok;
	int n;

	take(lc, &a, 270, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc, &a.req);
	t0 = efs_test_now_ms();
	{
		struct efs_etcd_txn *t = own_txn(false);

		cr_assert_eq(efs_lock_ride_idle(lc, t, ino, EFS_LOCK_RIDE_MAX), 0,
			     "a lock just used rode a transaction");
		efs_etcd_txn_free(t);
	}
	while (efs_test_now_ms() < t0 + 3300)
		efs_test_run_for(10);
	take(lc, &a, 271, EFS_LOCK_EXCLUSIVE); /* used now: not due */
	efs_lock_put(lc, &a.req);
	{
		struct efs_etcd_txn *t = own_txn(false);

		rev0 = send_txn_rev(own_txn(false), &ok);
		n = efs_lock_ride_idle(lc, t, ino, EFS_LOCK_RIDE_MAX);
		cr_assert_eq(n, 1, "%d idle releases rode the transaction", n);
		cr_assert_eq(ino[0], 270);
		cr_assert_eq(efs_lock_held(lc, 270), EFS_LOCK_NONE, "served while its release rides");
		rev = send_txn_rev(t, &ok);
	}
	cr_assert(ok);
	efs_lock_ride_outcome(lc, ino, (size_t)n, EFS_LOCK_TXN_COMMITTED, rev);
	/* One commit did both: the transaction's own put and the release. */
	cr_assert_eq(rev, rev0 + 1);
	cr_assert_not(holder_exists(270, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert(holder_exists(271, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_eq(lstats(lc).releases_early, 1);
	cr_assert_eq(lstats(lc).held, 1);
	/* Past the time the tick would have released it: no release commit of
	 * its own came. */
	while (efs_test_now_ms() < t0 + 4600)
		efs_test_run_for(10);
	cr_assert_eq(lstats(lc).release_txns, 0);

	/* A transaction that fails leaves the lock held; the tick releases
	 * it the usual way later. */
	while (efs_test_now_ms() < t0 + 3300 + 3300)
		efs_test_run_for(10);
	{
		struct efs_etcd_txn *t = own_txn(true);

		n = efs_lock_ride_idle(lc, t, ino, EFS_LOCK_RIDE_MAX);
		cr_assert_eq(n, 1);
		cr_assert_eq(ino[0], 271);
		send_txn_rev(t, &ok);
	}
	cr_assert_not(ok);
	efs_lock_ride_outcome(lc, ino, (size_t)n, EFS_LOCK_TXN_FAILED, 0);
	cr_assert_eq(efs_lock_held(lc, 271), EFS_LOCK_EXCLUSIVE, "not held after a failed ride");
	cr_assert(holder_exists(271, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert(run_until_held(lc, 0, 3000), "the failed ride's lock was never released");
	cr_assert_eq(lstats(lc).release_txns, 1);
	cr_assert_eq(lstats(lc).releases_early, 1);
	finish(lc);
	efs_test_assert_no_leaks();
}

/* ---- Direct grant (issue 11) ---- */

/* etcd's current revision: every commit moves it by one. */
static int64_t etcd_rev(void)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *resp = NULL;
	int64_t rev;

	req.key.data = (uint8_t *)"\0";
	req.key.len = 1;
	req.count_only = true;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_RANGE, &req.base, (ProtobufCMessage **)&resp,
					NULL),
		     0);
	cr_assert_not_null(resp->header);
	rev = resp->header->revision;
	efs_test_pb_free(resp);
	return rev;
}

#if EFS_FAULT_HOOKS
/*
 * node1 holds |ino| exclusively and idle; node2 asks for it. Returns the
 * commits from before node2's request to its grant: its recall key, then
 * node1's release, which grants it to node2 in the same transaction; without
 * the grant (|grant| false) node2's own acquisition follows the release.
 */
static int64_t handover_commits(uint64_t ino, bool grant)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;
	int64_t rev0, n;

	two_nodes(&lc1, &lc2, 20000);
	efs_lockcache_fault_no_grant(lc1, !grant);
	take(lc1, &a1, ino, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &a1.req);
	efs_test_run_for(500); /* both recall watches run */
	rev0 = etcd_rev();
	cr_assert_eq(acquire1(lc2, &a2, ino, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&a2.done, 10000), "the recall was not answered");
	cr_assert_eq(a2.status, 0);
	n = etcd_rev() - rev0;
	cr_assert_eq(efs_lock_held(lc2, ino), EFS_LOCK_EXCLUSIVE);
	cr_assert(run_until_mode(lc1, ino, EFS_LOCK_NONE, 3000));
	/* node2 may learn of its grant (its holder key's put) before node1
	 * reads its release's response, which counts the grant. */
	cr_assert(run_until_held(lc1, 0, 3000), "node1's release never completed");
	cr_assert_eq(lstats(lc1).direct_grants, grant ? 1 : 0);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, ino), 1);
	cr_assert(holder_exists(ino, EFS_META_LOCK_EXCLUSIVE, "node2"));
	cr_assert(run_until_keys(EFS_META_K_RECALL, ino, 0, 3000), "recall keys left behind");
	/* The granted hold is an ordinary one: it goes back on a recall. */
	cr_assert_eq(acquire1(lc1, &a1, ino, EFS_LOCK_EXCLUSIVE), 0);
	efs_lock_put(lc2, &a2.req);
	cr_assert(efs_test_run_until(&a1.done, 10000), "the granted lock was not recalled");
	cr_assert_eq(a1.status, 0);
	efs_lock_put(lc1, &a1.req);
	efs_lockcache_free(lc2);
	efs_lockcache_free(lc1);
	return n;
}

Test(lock, a_release_grants_the_lock_to_the_waiter_in_one_commit)
{
	int64_t n = handover_commits(250, true);

	cr_assert_eq(n, 2, "commits from the recall key to the grant: %" PRId64 " (want the "
			   "recall key and the releasing transaction)",
		     n);
	teardown();
	efs_test_assert_no_leaks();
}

/* The negative control of the one above: without the grant a handover
 * takes the recall key, the release and the waiter's acquisition. */
Test(lock, without_direct_grant_a_handover_takes_two_commits)
{
	int64_t n = handover_commits(251, false);

	cr_assert_eq(n, 3, "commits from the recall key to the grant: %" PRId64, n);
	teardown();
	efs_test_assert_no_leaks();
}

/* two_nodes, with the watch events of node |late| (1 or 2) 1 s late. */
static void two_nodes_late(struct efs_lockcache **lc1, struct efs_lockcache **lc2, int late,
			   uint32_t wait2_ms)
{
	c2 = efs_test_client_new(efs_harness_endpoints(h));
	s2 = start_session(c2, "node2");
	efs_etcd_fault_watch_delay(late == 1 ? c : c2, 1000);
	*lc1 = new_lc(s, c, 0, 60000, 0, 0);
	*lc2 = new_lc(s2, c2, 0, 60000, 0, wait2_ms);
}

/*
 * node1 holds |ino| exclusively and idle; node2, whose watch events are
 * late, waits for it in mode |m| (its request in |a2|) until node1's
 * release has put node2's holder key (a grant node2 does not know of yet).
 */
static void grant_to_a_late_waiter(struct efs_lockcache **lc1, struct efs_lockcache **lc2,
				   struct lres *a1, struct lres *a2, uint64_t ino,
				   enum efs_lock_mode m)
{
	int km = m == EFS_LOCK_EXCLUSIVE ? EFS_META_LOCK_EXCLUSIVE : EFS_META_LOCK_SHARED;

	two_nodes_late(lc1, lc2, 2, 0);
	take(*lc1, a1, ino, EFS_LOCK_EXCLUSIVE);
	efs_lock_put(*lc1, &a1->req);
	efs_test_run_for(500);
	cr_assert_eq(acquire1(*lc2, a2, ino, m), 0);
	RUN_UNTIL(holder_exists(ino, km, "node2"), 5000);
	cr_assert(holder_exists(ino, km, "node2"), "node1 granted nothing");
}

/*
 * node2 stops waiting (cancelled) after node1's release granted it the
 * lock but before node2 learnt of it (its watch events are late): node2
 * gives the grant back at once, no holder key of node2 stays, and the
 * next acquirer gets the lock without waiting for node2's lease.
 */
Test(lock, a_grant_to_a_waiter_that_stopped_waiting_is_given_back)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;

	grant_to_a_late_waiter(&lc1, &lc2, &a1, &a2, 252, EFS_LOCK_EXCLUSIVE);
	/* etcd has the grant; node1 counts it when its reply arrives. */
	RUN_UNTIL(lstats(lc1).direct_grants == 1, 3000);
	cr_assert_eq(lstats(lc1).direct_grants, 1);
	cr_assert_not(a2.done, "node2 saw its grant before its late watch could tell it");
	efs_lock_cancel(lc2, &a2.req);
	cr_assert(efs_test_run_until(&a2.done, 1000));
	cr_assert_eq(a2.status, -EINTR);
	/* Given back: its holder key goes. */
	RUN_UNTIL(!holder_exists(252, EFS_META_LOCK_EXCLUSIVE, "node2"), 3000);
	cr_assert_not(holder_exists(252, EFS_META_LOCK_EXCLUSIVE, "node2"),
		      "the grant stayed on node2's lease");
	cr_assert_eq(lstats(lc2).grants_returned, 1);
	cr_assert_eq(efs_lock_held(lc2, 252), EFS_LOCK_NONE);
	/* node2's lease lives on: only the give-back lets node1 in. */
	take(lc1, &a1, 252, EFS_LOCK_EXCLUSIVE);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 252), 1);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 252, 0, 3000), "recall keys left behind");
	efs_lock_put(lc1, &a1.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/*
 * node1 downgrades for node2's shared wait and grants node2 the shared
 * key, but node2 (its watch events late) stopped waiting and at once asks
 * for the lock exclusively: that acquisition holds the entry, so the
 * give-back of the stray grant leaves the key to it, and it must give the
 * key up itself rather than wait behind its own shared key for ever (the
 * renames history hung so, until the runner's watchdog).
 */
Test(lock, an_exclusive_wait_gives_up_a_shared_key_granted_to_an_ended_wait)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2, a3;

	grant_to_a_late_waiter(&lc1, &lc2, &a1, &a2, 257, EFS_LOCK_SHARED);
	cr_assert_not(a2.done, "node2 saw its grant before its late watch could tell it");
	efs_lock_cancel(lc2, &a2.req);
	cr_assert(efs_test_run_until(&a2.done, 1000));
	cr_assert_eq(a2.status, -EINTR);
	/* At once, before the give-back's reply. */
	cr_assert_eq(acquire1(lc2, &a3, 257, EFS_LOCK_EXCLUSIVE), 0);
	cr_assert(efs_test_run_until(&a3.done, 8000),
		  "the exclusive acquisition waits behind node2's own shared key");
	cr_assert_eq(a3.status, 0);
	cr_assert_eq(efs_lock_held(lc2, 257), EFS_LOCK_EXCLUSIVE);
	cr_assert_not(holder_exists(257, EFS_META_LOCK_SHARED, "node2"));
	cr_assert(run_until_mode(lc1, 257, EFS_LOCK_NONE, 3000));
	efs_lock_put(lc2, &a3.req);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 257, 0, 3000), "recall keys left behind");
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/*
 * node2's session ends (its lease revoked) while it waits and before
 * node1, whose watch events are late, releases: the grant's compare fails
 * (the recall key went with the lease) and the release commits alone.
 */
Test(lock, a_release_whose_waiter_is_gone_still_releases)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2;

	two_nodes_late(&lc1, &lc2, 1, 20000);
	take(lc1, &a1, 253, EFS_LOCK_EXCLUSIVE); /* pinned until node2's lease goes */
	efs_test_run_for(1500);			 /* node1's recall watch runs */
	cr_assert_eq(acquire1(lc2, &a2, 253, EFS_LOCK_EXCLUSIVE), 0);
	RUN_UNTIL(lstats(lc1).recalls >= 1, 5000);
	cr_assert_geq(lstats(lc1).recalls, 1, "node1 never saw node2's recall");
	{
		Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

		req.id = efs_session_lease_id(s2);
		cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_REVOKE, &req.base, NULL, NULL),
			     0);
	}
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 253), 0);
	efs_lock_put(lc1, &a1.req);
	RUN_UNTIL(lstats(lc1).releases >= 1, 3000);
	cr_assert_eq(lstats(lc1).releases, 1, "the release did not commit");
	cr_assert_eq(efs_lock_held(lc1, 253), EFS_LOCK_NONE);
	cr_assert_not(holder_exists(253, EFS_META_LOCK_EXCLUSIVE, "node1"));
	cr_assert_eq(lstats(lc1).direct_grants, 0);
	/* node2's wait ends: with its session (-EIO), or granted once it
	 * registered anew, whichever came first. */
	cr_assert(efs_test_run_until(&a2.done, 15000), "node2's wait never ended");
	cr_assert(a2.status == -EIO || a2.status == 0, "node2: %d", a2.status);
	if (a2.status == 0)
		efs_lock_put(lc2, &a2.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}
#endif

/*
 * Two shared waiters (node2, node3) queued behind node1's exclusive hold:
 * node1's downgrade grants both in its own transaction, keeping its shared
 * hold: three commits in all (two recall keys, the downgrade).
 */
Test(lock, a_downgrade_grants_every_shared_waiter)
{
	struct efs_lockcache *lc1, *lc2, *lc3;
	struct efs_session *s3;
	struct efs_etcd *c3;
	struct lres a1, a2, a3;
	int64_t rev0;

	two_nodes(&lc1, &lc2, 20000);
	c3 = efs_test_client_new(efs_harness_endpoints(h));
	s3 = start_session(c3, "node3");
	lc3 = new_lc(s3, c3, 0, 60000, 0, 20000);
	take(lc1, &a1, 254, EFS_LOCK_EXCLUSIVE); /* pinned until both wait */
	efs_test_run_for(500);
	rev0 = etcd_rev();
	cr_assert_eq(acquire1(lc2, &a2, 254, EFS_LOCK_SHARED), 0);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 254, 1, 3000));
	cr_assert_eq(acquire1(lc3, &a3, 254, EFS_LOCK_SHARED), 0);
	cr_assert(run_until_keys(EFS_META_K_RECALL, 254, 2, 3000));
	efs_test_run_for(300); /* node1 sees both */
	efs_lock_put(lc1, &a1.req);
	cr_assert(efs_test_run_until(&a2.done, 10000), "node2 was not granted");
	cr_assert(efs_test_run_until(&a3.done, 10000), "node3 was not granted");
	cr_assert_eq(a2.status, 0);
	cr_assert_eq(a3.status, 0);
	/* The waiters learn of their grants from their watches, node1 from
	 * its transaction's reply, which may come later. */
	RUN_UNTIL(lstats(lc1).direct_grants == 2, 3000);
	cr_assert_eq(lstats(lc1).direct_grants, 2);
	cr_assert_eq(etcd_rev() - rev0, 3, "commits: %" PRId64, etcd_rev() - rev0);
	cr_assert(run_until_mode(lc1, 254, EFS_LOCK_SHARED, 3000));
	cr_assert_eq(efs_lock_held(lc2, 254), EFS_LOCK_SHARED);
	cr_assert_eq(efs_lock_held(lc3, 254), EFS_LOCK_SHARED);
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 254), 3);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 254), 0);
	efs_lock_put(lc2, &a2.req);
	efs_lock_put(lc3, &a3.req);
	efs_lockcache_free(lc3);
	efs_session_free(s3);
	efs_test_client_free(c3);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/*
 * A release riding the publication that answers a recall grants the lock
 * to the waiter in that same transaction: the recall key and the
 * publication are the only commits of the handover.
 */
Test(lock, a_release_riding_a_publication_grants_the_waiter)
{
	struct efs_lockcache *lc1, *lc2;
	struct fake_ops fo = {0};
	struct lres w, a2;
	bool ok = false;
	int64_t rev0;

	two_nodes(&lc1, &lc2, 20000);
	cr_assert_eq(efs_lockcache_set_ops(lc1, 1, &fake_lock_ops, &fo), 0);
	take(lc1, &w, 255, EFS_LOCK_EXCLUSIVE);
	efs_lock_set_kind(lc1, 255, 1);
	efs_lock_put(lc1, &w.req);
	fo.hold_sync = true;
	efs_test_run_for(500); /* both recall watches run */
	rev0 = etcd_rev();
	cr_assert_eq(acquire1(lc2, &a2, 255, EFS_LOCK_EXCLUSIVE), 0);
	/* node2's recall key makes node1 release: its sync publishes. */
	RUN_UNTIL(fo.syncs == 1, 5000);
	cr_assert_eq(fo.syncs, 1, "the recall did not reach the sync op");
	cr_assert_eq(acquire1f(lc1, &w, 255, EFS_LOCK_EXCLUSIVE, EFS_LOCK_F_WRITEBACK), 1);
	cr_assert_eq(publish_with_release(lc1, 255, true, &ok), 1,
		     "the release did not ride the publication");
	cr_assert(ok, "the publication failed");
	efs_lock_release_in_txn_outcome(lc1, 255, EFS_LOCK_TXN_COMMITTED, 0);
	efs_lock_put(lc1, &w.req);
	fo.hold_sync = false;
	fake_complete(&fo, 0);
	cr_assert(efs_test_run_until(&a2.done, 5000), "node2 was not granted");
	cr_assert_eq(a2.status, 0);
	cr_assert_eq(etcd_rev() - rev0, 2, "commits: %" PRId64, etcd_rev() - rev0);
	cr_assert_eq(lstats(lc1).direct_grants, 1);
	cr_assert_eq(lstats(lc1).releases_in_txn, 1);
	cr_assert(holder_exists(255, EFS_META_LOCK_EXCLUSIVE, "node2"));
	cr_assert_eq(count_keys(EFS_META_K_HOLDER, 255), 1);
	cr_assert_eq(count_keys(EFS_META_K_RECALL, 255), 0);
	efs_lock_put(lc2, &a2.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/* Node 2 gives up the shared hold |a2| pins (a recall would): node 1's
 * upgrade |x1| is granted. */
static void peer_gives_way(struct efs_lockcache *lc2, struct lres *a2, uint64_t ino,
			   struct lres *x1)
{
	struct rel f = {0};

	efs_lock_put(lc2, &a2->req);
	cr_assert_eq(efs_lock_release_now(lc2, ino, EFS_LOCK_NONE, on_forced, &f), 0);
	cr_assert(efs_test_run_until(&f.done, 3000));
	cr_assert(efs_test_run_until(&x1->done, 5000), "the upgrade never ran");
	cr_assert_eq(x1->status, 0);
}

/*
 * An upgrade blocked by another node waits for the kernel caches granted
 * under its shared hold to time out before it yields (the kernel may hold
 * the directory across the request that waits, so they cannot be
 * invalidated): that makes the inode contended, so that nothing more is
 * cached under it and the next handover does not wait again. Negative
 * control: without yield_wake's mark the inode is not contended.
 */
Test(lock, an_upgrade_waiting_for_kernel_caches_makes_the_lock_contended)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2, x1;

	two_nodes(&lc1, &lc2, 0);
	take(lc1, &a1, 236, EFS_LOCK_SHARED);
	take(lc2, &a2, 236, EFS_LOCK_SHARED); /* pinned: node 1's upgrade is blocked */
	efs_lock_note_kernel_cache(lc1, 236, efs_clock_mono_ns() + 400 * EFS_NSEC_PER_MSEC);
	efs_lock_put(lc1, &a1.req);
	cr_assert(efs_lock_may_cache(lc1, 236));
	cr_assert_eq(acquire1(lc1, &x1, 236, EFS_LOCK_EXCLUSIVE), 0);
	RUN_UNTIL(lstats(lc1).upgrade_yields == 1, 5000);
	cr_assert_eq(lstats(lc1).contended, 1, "the lock is not contended after such a wait");
	peer_gives_way(lc2, &a2, 236, &x1);
	cr_assert_not(efs_lock_may_cache(lc1, 236), "a contended lock let the kernel cache");
	efs_lock_put(lc1, &x1.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}

/* Fills |x| for one inode (efs_lock_acquire_under takes no wait). */
static struct efs_lock_req *req1(struct lres *x, uint64_t ino, enum efs_lock_mode m)
{
	*x = (struct lres){0};
	x->req.n = 1;
	x->req.ino[0] = ino;
	x->req.mode[0] = m;
	x->req.cb = on_lock;
	x->req.arg = x;
	return &x->req;
}

/*
 * An operation that pins a lock gives the request it served a pin of its
 * own under that pin (efs_lock_acquire_under): served at once, also while
 * an upgrade of this node drains the lock, and the drain then waits for
 * that pin too. The history checks of the cluster suite saw an open
 * answer EIO: its operation pinned the shared lock and loaded the extent
 * map, a truncate on the same node started an upgrade that another
 * node's shared hold blocked, and the open's pin, asked as a new
 * acquisition, was no cache hit. Negative control: that new acquisition,
 * nested or not, is not served.
 */
Test(lock, a_pin_under_a_pin_held_is_served_while_an_upgrade_drains)
{
	struct efs_lockcache *lc1, *lc2;
	struct lres a1, a2, x1, n1, u1, o1;
	uint64_t waits;

	two_nodes(&lc1, &lc2, 0);
	take(lc1, &a1, 264, EFS_LOCK_SHARED); /* the operation's pin */
	take(lc2, &a2, 264, EFS_LOCK_SHARED); /* pinned: node 1's upgrade is blocked */
	waits = lstats(lc1).waits;
	cr_assert_eq(acquire1(lc1, &x1, 264, EFS_LOCK_EXCLUSIVE), 0);
	RUN_UNTIL(lstats(lc1).waits > waits, 5000);
	cr_assert_gt(lstats(lc1).waits, waits, "the upgrade never waited for node 2");
	cr_assert_eq(acquire1f(lc1, &n1, 264, EFS_LOCK_SHARED, EFS_LOCK_F_NESTED), 0,
		     "a new acquisition was served during the upgrade's drain");
	cr_assert_eq(efs_lock_withdraw(lc1, &n1.req), 0);
	cr_assert_eq(efs_lock_acquire_under(lc1, &a1.req, req1(&u1, 264, EFS_LOCK_SHARED)), 1,
		     "a pin under the operation's pin was not served during the drain");
	cr_assert_eq(u1.req.grant[0], a1.req.grant[0]);
	/* Only what |held| pins, in at most its mode. */
	cr_assert_eq(efs_lock_acquire_under(lc1, &a1.req, req1(&o1, 265, EFS_LOCK_SHARED)),
		     -EINVAL);
	cr_assert_eq(efs_lock_acquire_under(lc1, &a1.req, req1(&o1, 264, EFS_LOCK_EXCLUSIVE)),
		     -EINVAL);
	/* The operation ends: the request's pin still holds the shared hold. */
	efs_lock_put(lc1, &a1.req);
	efs_test_run_for(300);
	cr_assert_eq(lstats(lc1).upgrade_yields, 0, "the upgrade gave a pinned hold up");
	cr_assert_eq(efs_lock_held(lc1, 264), EFS_LOCK_SHARED);
	efs_lock_put(lc1, &u1.req);
	RUN_UNTIL(lstats(lc1).upgrade_yields == 1, 5000);
	cr_assert_eq(lstats(lc1).upgrade_yields, 1, "the upgrade never gave its hold up");
	peer_gives_way(lc2, &a2, 264, &x1);
	cr_assert_eq(efs_lock_held(lc1, 264), EFS_LOCK_EXCLUSIVE);
	efs_lock_put(lc1, &x1.req);
	efs_lockcache_free(lc2);
	finish(lc1);
	efs_test_assert_no_leaks();
}
