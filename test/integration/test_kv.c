/* SPDX-License-Identifier: Apache-2.0 */
/*
 * KV, Maintenance and Cluster RPCs through the typed wrappers of kv.h,
 * against real etcd members started by the harness: every option of every
 * KV call, the Txn compare semantics etcd documents, paging, compaction, and
 * what a cluster without quorum does to a call.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/grpc.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "harness.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

/* ---- a loop, a client, and a way to wait for one callback ---- */

static uv_loop_t loop;
static struct efs_etcd *cli;
static struct efs_harness *h;

struct got {
	bool done;
	int err;
	int grpc_status;
	bool outcome_unknown;
	char msg[512];
	ProtobufCMessage *resp; /* owned while set */
};
static struct got got;

static void capture(struct efs_etcd_result *r)
{
	cr_assert(!got.done, "a callback ran twice");
	got.done = true;
	got.err = r->err;
	got.grpc_status = r->grpc_status;
	got.outcome_unknown = r->outcome_unknown;
	cr_assert_not_null(r->message);
	snprintf(got.msg, sizeof(got.msg), "%s", r->message);
	if (r->err == 0) {
		cr_assert_not_null(r->resp);
		got.resp = r->resp;
		r->resp = NULL;
	} else {
		cr_assert_null(r->resp);
	}
}

#define TYPED_CB(name, T)                                                                  \
	static void name(struct efs_etcd_result *r, T *resp, void *arg)                    \
	{                                                                                  \
		cr_assert_eq((void *)resp, r->err ? NULL : (void *)r->resp);               \
		capture(r);                                                                \
	}
TYPED_CB(range_cb, Etcdserverpb__RangeResponse)
TYPED_CB(put_cb, Etcdserverpb__PutResponse)
TYPED_CB(delete_cb, Etcdserverpb__DeleteRangeResponse)
TYPED_CB(txn_cb, Etcdserverpb__TxnResponse)
TYPED_CB(compact_cb, Etcdserverpb__CompactionResponse)
TYPED_CB(status_cb, Etcdserverpb__StatusResponse)
TYPED_CB(member_list_cb, Etcdserverpb__MemberListResponse)

static void raw_cb(struct efs_etcd_result *r, void *arg)
{
	capture(r);
}

static void got_clear(void)
{
	efs_test_pb_free(got.resp);
	memset(&got, 0, sizeof(got));
}

/* Starts nothing; waits for the callback of what the caller started (|r|
 * is the start function's return value). Bounded so a hang fails. */
static void wait_got(int r)
{
	uint64_t t0 = efs_clock_mono_ns();

	cr_assert_eq(r, 0, "call did not start: %s", strerror(-r));
	while (!got.done) {
		uv_run(&loop, UV_RUN_ONCE);
		cr_assert(efs_clock_mono_ns() - t0 < 30 * EFS_NSEC_PER_SEC, "callback never ran");
	}
}

static struct efs_etcd *client_new(const char *endpoints, uint32_t timeout_ms)
{
	struct efs_etcd_opts o = {.endpoints = endpoints, .call_timeout_ms = timeout_ms};
	struct efs_etcd *c;

	cr_assert_eq(efs_etcd_new(&c, &loop, &o), 0);
	return c;
}

static void client_free(struct efs_etcd *c)
{
	bool done = false;

	efs_etcd_free(c, efs_test_freed_cb, &done);
	while (!done)
		uv_run(&loop, UV_RUN_ONCE);
}

static bool loop_open;

static void setup_n(int members)
{
	struct efs_harness_opts ho = {.members = members};

	cr_assert_eq(uv_loop_init(&loop), 0);
	loop_open = true;
	cr_assert_eq(efs_harness_start(&h, &ho), 0, "cannot start etcd");
	cli = client_new(efs_harness_endpoints(h), 0);
}

static void setup1(void)
{
	setup_n(1);
}

static void setup3(void)
{
	setup_n(3);
}

/*
 * Frees the client, the loop and the cluster. Each test calls it before its
 * leak check, and .fini again for a test that failed first: the second call
 * does nothing.
 */
static void teardown(void)
{
	got_clear();
	if (cli)
		client_free(cli);
	cli = NULL;
	if (loop_open) {
		uv_run(&loop, UV_RUN_NOWAIT);
		cr_expect_eq(uv_loop_close(&loop), 0, "handles left open on the loop");
		loop_open = false;
	}
	h = efs_harness_free(h);
}

/* ---- blocking helpers over the typed wrappers ---- */

static Etcdserverpb__RangeResponse *range_ok(const char *key, const struct efs_etcd_range_opts *o)
{
	Etcdserverpb__RangeResponse *resp;

	got_clear();
	wait_got(efs_etcd_range(cli, key, strlen(key), o, NULL, range_cb, NULL));
	cr_assert_eq(got.err, 0, "Range %s: %s", key, got.msg);
	resp = (Etcdserverpb__RangeResponse *)got.resp;
	got.resp = NULL;
	return resp;
}

static int64_t put_ok(const char *key, const char *value)
{
	Etcdserverpb__PutResponse *resp;
	int64_t rev;

	got_clear();
	wait_got(efs_etcd_put(cli, key, strlen(key), value, strlen(value), NULL, NULL, put_cb,
			      NULL));
	cr_assert_eq(got.err, 0, "Put %s: %s", key, got.msg);
	resp = (Etcdserverpb__PutResponse *)got.resp;
	cr_assert_not_null(resp->header);
	rev = resp->header->revision;
	got_clear();
	return rev;
}

static Etcdserverpb__TxnResponse *txn_run(const Etcdserverpb__TxnRequest *req)
{
	Etcdserverpb__TxnResponse *resp;

	got_clear();
	wait_got(efs_etcd_txn(cli, req, NULL, txn_cb, NULL));
	if (got.err)
		return NULL;
	resp = (Etcdserverpb__TxnResponse *)got.resp;
	got.resp = NULL;
	return resp;
}

static int64_t lease_grant(int64_t ttl)
{
	Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	int64_t id;

	req.ttl = ttl;
	got_clear();
	wait_got(efs_etcd_call(cli, EFS_ETCD_LEASE_GRANT, &req.base, NULL, raw_cb, NULL, NULL));
	cr_assert_eq(got.err, 0, "LeaseGrant: %s", got.msg);
	id = ((Etcdserverpb__LeaseGrantResponse *)got.resp)->id;
	cr_assert_gt(id, 0);
	got_clear();
	return id;
}

static bool kv_is(const Mvccpb__KeyValue *kv, const char *key, const char *value)
{
	return kv->key.len == strlen(key) && !memcmp(kv->key.data, key, kv->key.len) &&
	       (!value || (kv->value.len == strlen(value) &&
			   !memcmp(kv->value.data, value, kv->value.len)));
}

/* ---- Range ---- */

TestSuite(kv, .init = setup1, .fini = teardown, .timeout = 60);

Test(kv, range_one_key_prefix_and_explicit_range_end)
{
	struct efs_etcd_range_opts o = {.prefix = true};
	Etcdserverpb__RangeResponse *r;

	put_ok("p/a", "1");
	put_ok("p/b", "2");
	put_ok("p/c", "3");
	put_ok("p0", "outside");
	put_ok("o", "before");

	r = range_ok("p/b", NULL);
	cr_assert_eq(r->n_kvs, 1);
	cr_assert(kv_is(r->kvs[0], "p/b", "2"));
	cr_assert_eq(r->count, 1);
	cr_assert_gt(r->header->revision, 0);
	efs_test_pb_free(r);

	r = range_ok("p/", &o);
	cr_assert_eq(r->n_kvs, 3);
	cr_assert(kv_is(r->kvs[0], "p/a", "1"));
	cr_assert(kv_is(r->kvs[1], "p/b", "2"));
	cr_assert(kv_is(r->kvs[2], "p/c", "3"));
	efs_test_pb_free(r);

	o = (struct efs_etcd_range_opts){.range_end = "p/c", .range_end_len = 3};
	r = range_ok("p/a", &o);
	cr_assert_eq(r->n_kvs, 2, "range end is exclusive");
	efs_test_pb_free(r);

	/* A single "\0" as range end: every key from |key| on. */
	o = (struct efs_etcd_range_opts){.range_end = "", .range_end_len = 1};
	r = range_ok("p/c", &o);
	cr_assert_eq(r->n_kvs, 2);
	cr_assert(kv_is(r->kvs[1], "p0", "outside"));
	efs_test_pb_free(r);

	r = range_ok("missing", NULL);
	cr_assert_eq(r->n_kvs, 0);
	cr_assert_eq(r->count, 0);
	efs_test_pb_free(r);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, range_rejects_bad_arguments_without_calling_back)
{
	struct efs_etcd_range_opts both = {.prefix = true, .range_end = "z", .range_end_len = 1};
	struct efs_etcd_range_opts neg = {.limit = -1};

	cr_assert_eq(efs_etcd_range(cli, "", 0, NULL, NULL, range_cb, NULL), -EINVAL);
	cr_assert_eq(efs_etcd_range(cli, "a", 1, &both, NULL, range_cb, NULL), -EINVAL);
	cr_assert_eq(efs_etcd_range(cli, "a", 1, &neg, NULL, range_cb, NULL), -EINVAL);
	cr_assert_eq(efs_etcd_put(cli, "", 0, "v", 1, NULL, NULL, put_cb, NULL), -EINVAL);
	cr_assert_eq(efs_etcd_compact(cli, 0, false, NULL, compact_cb, NULL), -EINVAL);
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert(!got.done);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, prefix_of_0xff_bytes_covers_the_rest_of_the_keyspace)
{
	struct efs_etcd_range_opts o = {.prefix = true};
	Etcdserverpb__RangeResponse *r;

	put_ok("a\xff", "1");
	put_ok("a\xff\xff", "2");
	put_ok("b", "3");
	put_ok("\xff\xff", "4");
	r = range_ok("a\xff", &o);
	cr_assert_eq(r->n_kvs, 2, "a\\xff... must not include b");
	efs_test_pb_free(r);
	r = range_ok("\xff", &o);
	cr_assert_eq(r->n_kvs, 1);
	cr_assert(kv_is(r->kvs[0], "\xff\xff", "4"));
	efs_test_pb_free(r);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, range_limit_sets_more_and_count_counts_everything)
{
	struct efs_etcd_range_opts o = {.prefix = true, .limit = 2};
	Etcdserverpb__RangeResponse *r;
	char key[16];

	for (int i = 0; i < 5; i++) {
		snprintf(key, sizeof(key), "l/%d", i);
		put_ok(key, "x");
	}
	r = range_ok("l/", &o);
	cr_assert_eq(r->n_kvs, 2);
	cr_assert(r->more);
	cr_assert_eq(r->count, 5);
	efs_test_pb_free(r);
	o.limit = 5;
	r = range_ok("l/", &o);
	cr_assert_eq(r->n_kvs, 5);
	cr_assert(!r->more);
	efs_test_pb_free(r);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, range_at_an_old_revision_sees_old_values)
{
	struct efs_etcd_range_opts o = {0};
	Etcdserverpb__RangeResponse *r;
	int64_t r1, r2;

	r1 = put_ok("rev", "one");
	r2 = put_ok("rev", "two");
	cr_assert_gt(r2, r1);
	o.revision = r1;
	r = range_ok("rev", &o);
	cr_assert(kv_is(r->kvs[0], "rev", "one"));
	cr_assert_eq(r->kvs[0]->version, 1);
	cr_assert_eq(r->kvs[0]->mod_revision, r1);
	efs_test_pb_free(r);
	o.revision = r2;
	r = range_ok("rev", &o);
	cr_assert(kv_is(r->kvs[0], "rev", "two"));
	cr_assert_eq(r->kvs[0]->version, 2);
	cr_assert_eq(r->kvs[0]->create_revision, r1);
	efs_test_pb_free(r);

	/* A future revision is its own error. */
	got_clear();
	o.revision = r2 + 1000;
	wait_got(efs_etcd_range(cli, "rev", 3, &o, NULL, range_cb, NULL));
	cr_assert_eq(got.err, EFS_ETCD_EFUTUREREV, "%d %s", got.err, got.msg);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, keys_only_count_only_and_serializable)
{
	struct efs_etcd_range_opts o = {.prefix = true, .keys_only = true};
	Etcdserverpb__RangeResponse *r;

	put_ok("k/1", "value1");
	put_ok("k/2", "value2");
	r = range_ok("k/", &o);
	cr_assert_eq(r->n_kvs, 2);
	cr_assert(kv_is(r->kvs[0], "k/1", NULL));
	cr_assert_eq(r->kvs[0]->value.len, 0, "keys_only returns no values");
	cr_assert_gt(r->kvs[0]->mod_revision, 0);
	efs_test_pb_free(r);

	o = (struct efs_etcd_range_opts){.prefix = true, .count_only = true};
	r = range_ok("k/", &o);
	cr_assert_eq(r->n_kvs, 0);
	cr_assert_eq(r->count, 2);
	efs_test_pb_free(r);

	o = (struct efs_etcd_range_opts){.serializable = true};
	r = range_ok("k/2", &o);
	cr_assert_eq(r->n_kvs, 1);
	cr_assert(kv_is(r->kvs[0], "k/2", "value2"));
	efs_test_pb_free(r);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- paged range ---- */

struct pages {
	unsigned npages;
	size_t nkeys;
	int64_t revision;
	char last[32];
	bool sorted;
	int stop_after; /* return an error after this many pages (0: never) */
	bool compact_in_between;
	bool put_in_between;
	bool done;
	int err;
	char msg[512];
	Etcdserverpb__RangeResponse *all;
};

/* Writes through a blocking client on its own loop, so that the paged
 * range's next page is sent only after the write has applied. */
static void side_write(bool compact)
{
	struct efs_etcd_opts o = {.endpoints = efs_harness_endpoints(h)};
	Etcdserverpb__CompactionRequest req = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
	struct efs_etcd_sync *s;
	int64_t rev;

	cr_assert_eq(efs_etcd_sync_new(&s, &o), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "pg/0050x", 8, "new", 3, 0, &rev), 0);
	if (compact) {
		req.revision = rev;
		req.physical = true;
		cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_COMPACT, &req.base, NULL, NULL), 0);
	}
	cr_assert_eq(efs_etcd_sync_close(s), 0);
}

static int page_cb(const Etcdserverpb__RangeResponse *page, int64_t revision, void *arg)
{
	struct pages *p = arg;

	if (p->npages == 0)
		p->revision = revision;
	cr_assert_eq(revision, p->revision, "every page at the pinned revision");
	/* header.revision is the store's current revision, which a write
	 * between pages moves past the pinned one. */
	cr_assert_geq(page->header->revision, revision);
	for (size_t i = 0; i < page->n_kvs; i++) {
		char k[32];

		snprintf(k, sizeof(k), "%.*s", (int)page->kvs[i]->key.len,
			 (const char *)page->kvs[i]->key.data);
		if (strcmp(k, p->last) <= 0)
			p->sorted = false;
		snprintf(p->last, sizeof(p->last), "%s", k);
	}
	p->nkeys += page->n_kvs;
	p->npages++;
	if (p->npages == 1 && (p->put_in_between || p->compact_in_between))
		side_write(p->compact_in_between);
	if (p->stop_after && (int)p->npages == p->stop_after)
		return -ECANCELED;
	return 0;
}

static void paged_done(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *all, void *arg)
{
	struct pages *p = arg;

	cr_assert(!p->done);
	p->done = true;
	p->err = r->err;
	snprintf(p->msg, sizeof(p->msg), "%s", r->message);
	cr_assert_eq((void *)all, (void *)r->resp);
	p->all = all;
	r->resp = NULL;
}

static void wait_pages(struct pages *p)
{
	while (!p->done)
		uv_run(&loop, UV_RUN_ONCE);
}

static void put_many(const char *prefix, int n)
{
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__RequestOp ops[100], *opp[100];
	Etcdserverpb__PutRequest puts[100];
	char keys[100][32];
	Etcdserverpb__TxnResponse *resp;

	for (int base = 0; base < n; base += 100) {
		int m = n - base < 100 ? n - base : 100;

		for (int i = 0; i < m; i++) {
			etcdserverpb__put_request__init(&puts[i]);
			etcdserverpb__request_op__init(&ops[i]);
			snprintf(keys[i], sizeof(keys[i]), "%s%04d", prefix, base + i);
			puts[i].key.data = (uint8_t *)keys[i];
			puts[i].key.len = strlen(keys[i]);
			puts[i].value.data = (uint8_t *)"v";
			puts[i].value.len = 1;
			ops[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
			ops[i].request_put = &puts[i];
			opp[i] = &ops[i];
		}
		txn.n_success = (size_t)m;
		txn.success = opp;
		resp = txn_run(&txn);
		cr_assert_not_null(resp, "bulk put: %s", got.msg);
		efs_test_pb_free(resp);
	}
}

Test(kv, paged_range_delivers_pages_in_order_at_one_revision)
{
	struct efs_etcd_paged_opts o = {.prefix = true, .page_size = 7};
	struct pages p = {.sorted = true, .put_in_between = true};

	put_many("pg/", 100);
	put_ok("ph", "outside");
	cr_assert_eq(efs_etcd_range_paged(cli, "pg/", 3, &o, NULL, page_cb, paged_done, &p, NULL),
		     0);
	wait_pages(&p);
	cr_assert_eq(p.err, 0, "%s", p.msg);
	cr_assert_null(p.all);
	/* The key written after page 1 is not seen: the revision is pinned. */
	cr_assert_eq(p.nkeys, 100);
	cr_assert_eq(p.npages, 15);
	cr_assert(p.sorted);
	cr_assert_str_eq(p.last, "pg/0099");
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, paged_range_collects_the_whole_result)
{
	struct efs_etcd_paged_opts o = {.prefix = true, .page_size = 10, .keys_only = true};
	struct pages p = {0};

	put_many("pg/", 95);
	cr_assert_eq(efs_etcd_range_paged(cli, "pg/", 3, &o, NULL, NULL, paged_done, &p, NULL), 0);
	wait_pages(&p);
	cr_assert_eq(p.err, 0, "%s", p.msg);
	cr_assert_not_null(p.all);
	cr_assert_eq(p.all->n_kvs, 95);
	cr_assert_eq(p.all->count, 95);
	cr_assert(!p.all->more);
	for (size_t i = 0; i < 95; i++) {
		char k[16];

		snprintf(k, sizeof(k), "pg/%04zu", i);
		cr_assert(kv_is(p.all->kvs[i], k, NULL), "key %zu out of order", i);
		cr_assert_eq(p.all->kvs[i]->value.len, 0);
	}
	efs_test_pb_free(p.all);

	/* An empty range and an exact page multiple end cleanly too. */
	memset(&p, 0, sizeof(p));
	cr_assert_eq(efs_etcd_range_paged(cli, "none/", 5, &o, NULL, NULL, paged_done, &p, NULL),
		     0);
	wait_pages(&p);
	cr_assert_eq(p.err, 0);
	cr_assert_eq(p.all->n_kvs, 0);
	efs_test_pb_free(p.all);
	memset(&p, 0, sizeof(p));
	o.page_size = 19;
	cr_assert_eq(efs_etcd_range_paged(cli, "pg/", 3, &o, NULL, NULL, paged_done, &p, NULL), 0);
	wait_pages(&p);
	cr_assert_eq(p.all->n_kvs, 95);
	efs_test_pb_free(p.all);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, paged_range_stops_on_page_callback_error)
{
	struct efs_etcd_paged_opts o = {.prefix = true, .page_size = 10};
	struct pages p = {.sorted = true, .stop_after = 2};

	put_many("pg/", 50);
	cr_assert_eq(efs_etcd_range_paged(cli, "pg/", 3, &o, NULL, page_cb, paged_done, &p, NULL),
		     0);
	wait_pages(&p);
	cr_assert_eq(p.err, -ECANCELED);
	cr_assert_eq(p.npages, 2);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, paged_range_reports_compaction_of_the_pinned_revision)
{
	struct efs_etcd_paged_opts o = {.prefix = true, .page_size = 10};
	struct pages p = {.sorted = true, .compact_in_between = true};

	put_many("pg/", 50);
	cr_assert_eq(efs_etcd_range_paged(cli, "pg/", 3, &o, NULL, page_cb, paged_done, &p, NULL),
		     0);
	wait_pages(&p);
	cr_assert_eq(p.err, EFS_ETCD_ECOMPACTED, "err %d: %s", p.err, p.msg);
	cr_assert_eq(p.npages, 1);
	cr_assert(strstr(p.msg, "compacted while paging"), "%s", p.msg);
	cr_assert(strstr(p.msg, "latest revision"), "%s", p.msg);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- Put ---- */

Test(kv, put_with_lease_and_prev_kv)
{
	struct efs_etcd_put_opts po = {0};
	Etcdserverpb__RangeResponse *r;
	Etcdserverpb__PutResponse *pr;
	int64_t lease = lease_grant(30);

	po.lease = lease;
	got_clear();
	wait_got(efs_etcd_put(cli, "lk", 2, "v1", 2, &po, NULL, put_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	pr = (Etcdserverpb__PutResponse *)got.resp;
	cr_assert_null(pr->prev_kv, "no prev_kv unless asked");
	r = range_ok("lk", NULL);
	cr_assert_eq(r->kvs[0]->lease, lease);
	efs_test_pb_free(r);

	po = (struct efs_etcd_put_opts){.prev_kv = true, .ignore_lease = true};
	got_clear();
	wait_got(efs_etcd_put(cli, "lk", 2, "v2", 2, &po, NULL, put_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	pr = (Etcdserverpb__PutResponse *)got.resp;
	cr_assert_not_null(pr->prev_kv);
	cr_assert(kv_is(pr->prev_kv, "lk", "v1"));
	cr_assert_eq(pr->prev_kv->lease, lease);
	r = range_ok("lk", NULL);
	cr_assert(kv_is(r->kvs[0], "lk", "v2"));
	cr_assert_eq(r->kvs[0]->lease, lease, "ignore_lease keeps the lease");
	efs_test_pb_free(r);

	/* ignore_value keeps the value; a plain Put detaches the lease. */
	po = (struct efs_etcd_put_opts){.ignore_value = true, .ignore_lease = false};
	got_clear();
	wait_got(efs_etcd_put(cli, "lk", 2, NULL, 0, &po, NULL, put_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	r = range_ok("lk", NULL);
	cr_assert(kv_is(r->kvs[0], "lk", "v2"));
	cr_assert_eq(r->kvs[0]->lease, 0);
	efs_test_pb_free(r);

	/* An unknown lease is -ENOENT; ignore_value on a missing key is -EINVAL. */
	po = (struct efs_etcd_put_opts){.lease = lease + 12345};
	got_clear();
	wait_got(efs_etcd_put(cli, "lk", 2, "x", 1, &po, NULL, put_cb, NULL));
	cr_assert_eq(got.err, -ENOENT, "%d %s", got.err, got.msg);
	cr_assert(strstr(got.msg, "lease not found"), "%s", got.msg);
	po = (struct efs_etcd_put_opts){.ignore_value = true};
	got_clear();
	wait_got(efs_etcd_put(cli, "nokey", 5, NULL, 0, &po, NULL, put_cb, NULL));
	cr_assert_eq(got.err, -EINVAL, "%d %s", got.err, got.msg);
	cr_assert(strstr(got.msg, "key not found"), "%s", got.msg);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- DeleteRange ---- */

Test(kv, delete_one_key_a_prefix_and_prev_kv)
{
	struct efs_etcd_delete_opts o = {.prev_kv = true};
	Etcdserverpb__DeleteRangeResponse *d;
	Etcdserverpb__RangeResponse *r;

	put_ok("d/1", "a");
	put_ok("d/2", "b");
	put_ok("d/3", "c");
	put_ok("e", "keep");

	got_clear();
	wait_got(efs_etcd_delete(cli, "d/1", 3, NULL, NULL, delete_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	d = (Etcdserverpb__DeleteRangeResponse *)got.resp;
	cr_assert_eq(d->deleted, 1);
	cr_assert_eq(d->n_prev_kvs, 0);

	o.prefix = true;
	got_clear();
	wait_got(efs_etcd_delete(cli, "d/", 2, &o, NULL, delete_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	d = (Etcdserverpb__DeleteRangeResponse *)got.resp;
	cr_assert_eq(d->deleted, 2);
	cr_assert_eq(d->n_prev_kvs, 2);
	cr_assert(kv_is(d->prev_kvs[0], "d/2", "b"));
	cr_assert(kv_is(d->prev_kvs[1], "d/3", "c"));

	got_clear();
	wait_got(efs_etcd_delete(cli, "d/", 2, &o, NULL, delete_cb, NULL));
	cr_assert_eq(((Etcdserverpb__DeleteRangeResponse *)got.resp)->deleted, 0);

	o = (struct efs_etcd_delete_opts){.range_end = "f", .range_end_len = 1};
	got_clear();
	wait_got(efs_etcd_delete(cli, "e", 1, &o, NULL, delete_cb, NULL));
	cr_assert_eq(((Etcdserverpb__DeleteRangeResponse *)got.resp)->deleted, 1);
	r = range_ok("e", NULL);
	cr_assert_eq(r->n_kvs, 0);
	efs_test_pb_free(r);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- Compact ---- */

Test(kv, compacted_revisions_cannot_be_read)
{
	struct efs_etcd_range_opts o = {0};
	Etcdserverpb__RangeResponse *r;
	int64_t r1, r2;

	r1 = put_ok("c", "1");
	put_ok("c", "2");
	r2 = put_ok("c", "3");
	got_clear();
	wait_got(efs_etcd_compact(cli, r2, true, NULL, compact_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	cr_assert_not_null(((Etcdserverpb__CompactionResponse *)got.resp)->header);

	o.revision = r1;
	got_clear();
	wait_got(efs_etcd_range(cli, "c", 1, &o, NULL, range_cb, NULL));
	cr_assert_eq(got.err, EFS_ETCD_ECOMPACTED, "%d %s", got.err, got.msg);
	cr_assert_eq(got.grpc_status, EFS_GRPC_OUT_OF_RANGE);
	cr_assert(strstr(got.msg, "compacted"), "%s", got.msg);

	/* The compaction revision itself is still readable. */
	o.revision = r2;
	r = range_ok("c", &o);
	cr_assert(kv_is(r->kvs[0], "c", "3"));
	efs_test_pb_free(r);

	/* Compacting again at or below it fails the same way. */
	got_clear();
	wait_got(efs_etcd_compact(cli, r1, false, NULL, compact_cb, NULL));
	cr_assert_eq(got.err, EFS_ETCD_ECOMPACTED, "%d %s", got.err, got.msg);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- Txn ---- */

static Etcdserverpb__Compare *cmp_new(Etcdserverpb__Compare *c, const char *key, int target,
				      int result, int64_t n, const char *value)
{
	etcdserverpb__compare__init(c);
	c->key.data = (uint8_t *)key;
	c->key.len = strlen(key);
	c->target = target;
	c->result = result;
	switch (target) {
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION:
		c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION;
		c->version = n;
		break;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE:
		c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
		c->create_revision = n;
		break;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD:
		c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
		c->mod_revision = n;
		break;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE:
		c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
		c->value.data = (uint8_t *)value;
		c->value.len = strlen(value);
		break;
	case ETCDSERVERPB__COMPARE__COMPARE_TARGET__LEASE:
		c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE;
		c->lease = n;
		break;
	}
	return c;
}

/* Runs a txn of one compare and no ops; returns whether it succeeded. */
static bool compare1(Etcdserverpb__Compare *c)
{
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__TxnResponse *resp;
	bool ok;

	txn.n_compare = 1;
	txn.compare = &c;
	resp = txn_run(&txn);
	cr_assert_not_null(resp, "txn failed: %s", got.msg);
	ok = resp->succeeded;
	cr_assert_eq(resp->n_responses, 0);
	efs_test_pb_free(resp);
	return ok;
}

static const char *const target_names[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
static const char *const result_names[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};

static bool expect_cmp(int result, int sign)
{
	switch (result) {
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL:
		return sign == 0;
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__GREATER:
		return sign > 0;
	case ETCDSERVERPB__COMPARE__COMPARE_RESULT__LESS:
		return sign < 0;
	default:
		return sign != 0;
	}
}

Test(kv, txn_every_compare_target_with_every_result)
{
	Etcdserverpb__RangeResponse *r;
	Etcdserverpb__Compare c;
	int64_t lease = lease_grant(60), actual[5];
	struct efs_etcd_put_opts po = {.lease = lease};

	put_ok("other", "x");
	put_ok("t", "m");
	put_ok("other", "y");
	got_clear();
	wait_got(efs_etcd_put(cli, "t", 1, "m", 1, &po, NULL, put_cb, NULL));
	cr_assert_eq(got.err, 0);
	r = range_ok("t", NULL);
	actual[0] = r->kvs[0]->version;
	actual[1] = r->kvs[0]->create_revision;
	actual[2] = r->kvs[0]->mod_revision;
	actual[4] = r->kvs[0]->lease;
	cr_assert_eq(actual[0], 2);
	cr_assert_lt(actual[1], actual[2]);
	cr_assert_eq(actual[4], lease);
	efs_test_pb_free(r);

	for (int t = 0; t < 5; t++) {
		for (int res = 0; res < 4; res++) {
			for (int d = -1; d <= 1; d++) {
				/* |d| is operand minus actual: the key's value
				 * compares as -d against the operand. */
				static const char *const vals[] = {"l", "m", "n"};
				bool want = expect_cmp(res, -d);
				bool ok = compare1(cmp_new(&c, "t", t, res, actual[t] + d,
							   vals[d + 1]));

				cr_assert_eq(ok, want, "%s %s (operand %+d): got %d",
					     target_names[t], result_names[res], d, ok);
			}
		}
	}
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, txn_missing_key_compares_as_zero_and_value_never_matches)
{
	Etcdserverpb__Compare c;

	for (int t = 0; t < 5; t++) {
		if (t == ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE)
			continue;
		cr_assert(compare1(cmp_new(&c, "absent", t, 0, 0, NULL)), "%s == 0",
			  target_names[t]);
		cr_assert(!compare1(cmp_new(&c, "absent", t, 1, 0, NULL)), "%s > 0",
			  target_names[t]);
		cr_assert(compare1(cmp_new(&c, "absent", t, 2, 1, NULL)), "%s < 1",
			  target_names[t]);
		cr_assert(compare1(cmp_new(&c, "absent", t, 3, 5, NULL)), "%s != 5",
			  target_names[t]);
	}
	for (int res = 0; res < 4; res++) {
		cr_assert(!compare1(cmp_new(&c, "absent", 3, res, 0, "")), "VALUE %s \"\"",
			  result_names[res]);
		cr_assert(!compare1(cmp_new(&c, "absent", 3, res, 0, "x")), "VALUE %s x",
			  result_names[res]);
	}
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, txn_range_end_compare_needs_every_key_to_match)
{
	Etcdserverpb__Compare c;

	put_ok("r/1", "a");
	put_ok("r/2", "a");
	put_ok("r/2", "b");
	/* version(r/1) = 1, version(r/2) = 2 */
	cmp_new(&c, "r/", 0, ETCDSERVERPB__COMPARE__COMPARE_RESULT__GREATER, 0, NULL);
	c.range_end.data = (uint8_t *)"r0";
	c.range_end.len = 2;
	cr_assert(compare1(&c), "every version > 0");
	c.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	c.version = 1;
	cr_assert(!compare1(&c), "not every version == 1");
	c.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__LESS;
	c.version = 3;
	cr_assert(compare1(&c), "every version < 3");
	c.version = 2;
	cr_assert(!compare1(&c), "not every version < 2");
	cmp_new(&c, "r/", 3, ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL, 0, "a");
	c.range_end.data = (uint8_t *)"r0";
	c.range_end.len = 2;
	cr_assert(!compare1(&c), "not every value == a");
	c.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__NOT_EQUAL;
	c.value.data = (uint8_t *)"z";
	cr_assert(compare1(&c), "every value != z");
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, txn_branches_and_nested_txn)
{
	Etcdserverpb__Compare c, c2, *cp = &c, *cp2 = &c2;
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__PutRequest put2 = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__RangeRequest get = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__TxnRequest inner = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__RequestOp op_put = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp op_put2 = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp op_get = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp op_txn = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp *succ[1] = {&op_put}, *fail[2] = {&op_get, &op_txn};
	Etcdserverpb__RequestOp *inner_succ[1] = {&op_put2};
	Etcdserverpb__TxnResponse *resp;
	Etcdserverpb__RangeResponse *r;
	int64_t rev_before;

	rev_before = put_ok("n/x", "old");
	put.key.data = (uint8_t *)"n/x";
	put.key.len = 3;
	put.value.data = (uint8_t *)"new";
	put.value.len = 3;
	op_put.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	op_put.request_put = &put;
	get.key = put.key;
	op_get.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	op_get.request_range = &get;
	put2.key.data = (uint8_t *)"n/y";
	put2.key.len = 3;
	put2.value = put.value;
	op_put2.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	op_put2.request_put = &put2;
	inner.n_compare = 1;
	inner.compare = &cp2;
	inner.n_success = 1;
	inner.success = inner_succ;
	op_txn.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_TXN;
	op_txn.request_txn = &inner;
	txn.n_compare = 1;
	txn.compare = &cp;
	txn.n_success = 1;
	txn.success = succ;
	txn.n_failure = 2;
	txn.failure = fail;

	/* Compare fails: the failure branch runs a Range and a nested txn
	 * whose own compare (n/y absent) holds. */
	cmp_new(&c, "n/x", ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE, 0, 0, "wrong");
	cmp_new(&c2, "n/y", ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION, 0, 0, NULL);
	resp = txn_run(&txn);
	cr_assert_not_null(resp, "%s", got.msg);
	cr_assert(!resp->succeeded);
	cr_assert_eq(resp->n_responses, 2);
	cr_assert_eq(resp->responses[0]->response_case,
		     ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE);
	cr_assert(kv_is(resp->responses[0]->response_range->kvs[0], "n/x", "old"));
	cr_assert_eq(resp->responses[1]->response_case,
		     ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_TXN);
	cr_assert(resp->responses[1]->response_txn->succeeded);
	cr_assert_eq(resp->responses[1]->response_txn->n_responses, 1);
	cr_assert_eq(resp->header->revision, rev_before + 1, "one txn, one revision");
	efs_test_pb_free(resp);
	r = range_ok("n/y", NULL);
	cr_assert(kv_is(r->kvs[0], "n/y", "new"));
	efs_test_pb_free(r);

	/* Compare holds: the success branch runs. */
	cmp_new(&c, "n/x", ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE, 0, 0, "old");
	resp = txn_run(&txn);
	cr_assert_not_null(resp, "%s", got.msg);
	cr_assert(resp->succeeded);
	cr_assert_eq(resp->n_responses, 1);
	cr_assert_eq(resp->responses[0]->response_case,
		     ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT);
	efs_test_pb_free(resp);
	r = range_ok("n/x", NULL);
	cr_assert(kv_is(r->kvs[0], "n/x", "new"));
	efs_test_pb_free(r);

	/* A read-only txn does not move the revision. */
	txn.n_compare = 0;
	txn.success = fail;
	txn.n_success = 1;
	resp = txn_run(&txn);
	cr_assert_not_null(resp);
	rev_before = resp->header->revision;
	efs_test_pb_free(resp);
	resp = txn_run(&txn);
	cr_assert_eq(resp->header->revision, rev_before);
	efs_test_pb_free(resp);
	teardown();
	efs_test_assert_no_leaks();
}

Test(kv, txn_from_the_builder_runs_through_the_wrapper)
{
	struct efs_etcd_txn *t, *inner;
	Etcdserverpb__TxnResponse *resp, *nested;
	Etcdserverpb__RangeResponse *rr;
	int64_t rev = put_ok("b/x", "1");

	/* if mod(b/x) == rev: put b/x = 2, and (if b/y absent) put b/y;
	 * else: read b/x */
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, "b/x", 3, rev),
		     0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, "b/x", 3, "2", 1, 0), 0);
	cr_assert_eq(efs_etcd_txn_nested(t, EFS_ETCD_TXN_SUCCESS, &inner), 0);
	cr_assert_eq(efs_etcd_txn_compare(inner, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_EQUAL, "b/y",
					  3, 0),
		     0);
	cr_assert_eq(efs_etcd_txn_put(inner, EFS_ETCD_TXN_SUCCESS, "b/y", 3, "y", 1, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, "b/x", 3, NULL, 0), 0);

	resp = txn_run(efs_etcd_txn_request(t));
	cr_assert_not_null(resp, "%s", got.msg);
	cr_assert(resp->succeeded);
	cr_assert_eq(efs_etcd_txn_resp_txn(resp, 1, &nested), 0);
	cr_assert(nested->succeeded);
	efs_test_pb_free(resp);

	/* Run again: the compare now fails and the failure branch reads. */
	resp = txn_run(efs_etcd_txn_request(t));
	cr_assert_not_null(resp, "%s", got.msg);
	cr_assert(!resp->succeeded);
	cr_assert_eq(efs_etcd_txn_resp_range(resp, 0, &rr), 0);
	cr_assert(kv_is(rr->kvs[0], "b/x", "2"));
	efs_test_pb_free(resp);
	efs_etcd_txn_free(t);
	teardown();
	efs_test_assert_no_leaks();
}

static Etcdserverpb__TxnResponse *txn_puts(int n, bool same_key)
{
	static Etcdserverpb__RequestOp ops[200], *opp[200];
	static Etcdserverpb__PutRequest puts[200];
	static char keys[200][16];
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;

	for (int i = 0; i < n; i++) {
		etcdserverpb__put_request__init(&puts[i]);
		etcdserverpb__request_op__init(&ops[i]);
		snprintf(keys[i], sizeof(keys[i]), "big/%d", same_key ? 0 : i);
		puts[i].key.data = (uint8_t *)keys[i];
		puts[i].key.len = strlen(keys[i]);
		ops[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
		ops[i].request_put = &puts[i];
		opp[i] = &ops[i];
	}
	txn.n_success = (size_t)n;
	txn.success = opp;
	return txn_run(&txn);
}

Test(kv, txn_limits_too_many_ops_and_duplicate_keys)
{
	Etcdserverpb__TxnResponse *resp;
	struct efs_etcd_range_opts o = {.prefix = true, .count_only = true};
	Etcdserverpb__RangeResponse *r;

	resp = txn_puts(128, false);
	cr_assert_not_null(resp, "128 ops are allowed: %s", got.msg);
	cr_assert_eq(resp->n_responses, 128);
	efs_test_pb_free(resp);

	resp = txn_puts(129, false);
	cr_assert_null(resp);
	cr_assert_eq(got.err, -E2BIG, "%d %s", got.err, got.msg);
	cr_assert_eq(got.grpc_status, EFS_GRPC_INVALID_ARGUMENT);
	cr_assert(strstr(got.msg, "too many operations"), "%s", got.msg);
	cr_assert(!got.outcome_unknown);

	resp = txn_puts(2, true);
	cr_assert_null(resp);
	cr_assert_eq(got.err, -EINVAL, "%d %s", got.err, got.msg);
	cr_assert(strstr(got.msg, "duplicate key"), "%s", got.msg);

	/* Neither rejected txn wrote anything. */
	r = range_ok("big/", &o);
	cr_assert_eq(r->count, 128);
	efs_test_pb_free(r);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- Status, MemberList, quorum loss: 3 members ---- */

TestSuite(cluster, .init = setup3, .fini = teardown, .timeout = 90);

Test(cluster, member_list_and_status_of_each_member)
{
	Etcdserverpb__MemberListResponse *ml;
	uint64_t leader = 0, cluster_id;
	char urls[3][256];

	got_clear();
	wait_got(efs_etcd_member_list(cli, NULL, member_list_cb, NULL));
	cr_assert_eq(got.err, 0, "%s", got.msg);
	ml = (Etcdserverpb__MemberListResponse *)got.resp;
	got.resp = NULL;
	cr_assert_eq(ml->n_members, 3);
	cluster_id = ml->header->cluster_id;
	cr_assert_neq(cluster_id, 0);
	for (size_t i = 0; i < 3; i++) {
		cr_assert_neq(ml->members[i]->id, 0);
		cr_assert(ml->members[i]->name && ml->members[i]->name[0]);
		cr_assert_eq(ml->members[i]->n_clienturls, 1);
		cr_assert_eq(ml->members[i]->n_peerurls, 1);
		cr_assert(!ml->members[i]->islearner);
		snprintf(urls[i], sizeof(urls[i]), "%s", ml->members[i]->clienturls[0]);
	}

	for (size_t i = 0; i < 3; i++) {
		struct efs_etcd *c = client_new(urls[i], 0);
		Etcdserverpb__StatusResponse *st;

		got_clear();
		wait_got(efs_etcd_status(c, NULL, status_cb, NULL));
		cr_assert_eq(got.err, 0, "%s: %s", urls[i], got.msg);
		st = (Etcdserverpb__StatusResponse *)got.resp;
		cr_assert_str_eq(st->version, "3.4.23");
		cr_assert_gt(st->dbsize, 0);
		cr_assert_gt(st->dbsizeinuse, 0);
		cr_assert_gt(st->raftindex, 0);
		cr_assert_gt(st->raftterm, 0);
		cr_assert_eq(st->header->cluster_id, cluster_id);
		cr_assert_eq(st->header->member_id, ml->members[i]->id,
			     "Status answers for the member the client talks to");
		cr_assert_neq(st->leader, 0);
		if (leader)
			cr_assert_eq(st->leader, leader, "members agree on the leader");
		leader = st->leader;
		got_clear();
		client_free(c);
	}
	efs_test_pb_free(ml);
	teardown();
	efs_test_assert_no_leaks();
}

Test(cluster, call_without_quorum_fails_within_its_deadline)
{
	struct efs_etcd *c;
	uint64_t t0, ms;
	char url[256];

	/* A client of the survivor only, with a 2 s deadline. */
	snprintf(url, sizeof(url), "%s", efs_harness_member_url(h, 0));
	c = client_new(url, 2000);
	cr_assert_eq(efs_harness_kill(h, 1), 0);
	cr_assert_eq(efs_harness_kill(h, 2), 0);

	got_clear();
	t0 = efs_clock_mono_ns();
	wait_got(efs_etcd_put(c, "q", 1, "v", 1, NULL, NULL, put_cb, NULL));
	ms = (efs_clock_mono_ns() - t0) / EFS_NSEC_PER_MSEC;
	cr_assert_neq(got.err, 0, "a put without quorum cannot succeed");
	cr_assert(got.err == -ETIMEDOUT || got.err == -EAGAIN, "err %d (%s): %s", got.err,
		  strerror(-got.err), got.msg);
	cr_assert_leq(ms, 2000 + 1500, "took %" PRIu64 " ms", ms);

	/* A linearizable read cannot be served either. When etcd's copy of
	 * our deadline fires first it answers UNKNOWN "context deadline
	 * exceeded", which the status table also maps to -ETIMEDOUT. */
	got_clear();
	t0 = efs_clock_mono_ns();
	wait_got(efs_etcd_range(c, "q", 1, NULL, NULL, range_cb, NULL));
	ms = (efs_clock_mono_ns() - t0) / EFS_NSEC_PER_MSEC;
	cr_assert(got.err == -ETIMEDOUT || got.err == -EAGAIN, "err %d (%s): %s", got.err,
		  strerror(-got.err), got.msg);
	cr_assert_leq(ms, 2000 + 1500, "took %" PRIu64 " ms", ms);

	/* ...but a serializable one is, from the survivor's own state. */
	{
		struct efs_etcd_range_opts o = {.serializable = true};

		got_clear();
		wait_got(efs_etcd_range(c, "q", 1, &o, NULL, range_cb, NULL));
		cr_assert_eq(got.err, 0, "%s", got.msg);
	}
	got_clear();
	client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- allocation failures ---- */

/*
 * Fails each allocation of a collected paged range in turn (after the
 * client is connected): it either refuses to start with -ENOMEM, or ends
 * once with an error, or delivers the whole range; nothing leaks (ASan).
 */
Test(kv, paged_range_survives_every_allocation_failure)
{
	struct efs_etcd_paged_opts o = {.prefix = true, .page_size = 10};
	struct efs_etcd *c = client_new(efs_harness_endpoints(h), 0);
	/* Once allocation fails, every later one fails too, so most runs
	 * end at their deadline: keep it short. */
	struct efs_etcd_callopts co = {.timeout_ms = 100};
	struct pages p = {0};
	long total, n;
	int r;

	put_many("pg/", 30);
	/* Connect first so that the sweep covers the paging itself. */
	cr_assert_eq(efs_etcd_range_paged(c, "pg/", 3, &o, NULL, NULL, paged_done, &p, NULL), 0);
	wait_pages(&p);
	efs_test_pb_free(p.all);
	memset(&p, 0, sizeof(p));
	efs_mem_fail_after(-1);
	cr_assert_eq(efs_etcd_range_paged(c, "pg/", 3, &o, NULL, NULL, paged_done, &p, NULL), 0);
	wait_pages(&p);
	total = efs_mem_count();
	cr_assert_eq(p.err, 0);
	cr_assert_eq(p.all->n_kvs, 30);
	efs_test_pb_free(p.all);

	for (n = 0; n < total; n++) {
		memset(&p, 0, sizeof(p));
		efs_mem_fail_after(n);
		r = efs_etcd_range_paged(c, "pg/", 3, &o, &co, NULL, paged_done, &p, NULL);
		if (r < 0) {
			efs_mem_fail_reset();
			cr_assert_eq(r, -ENOMEM, "start at %ld: %d", n, r);
			continue;
		}
		wait_pages(&p);
		efs_mem_fail_reset();
		if (p.err == 0)
			cr_assert_eq(p.all->n_kvs, 30, "allocation %ld", n);
		else
			cr_assert_null(p.all);
		efs_test_pb_free(p.all);
	}
	client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}
