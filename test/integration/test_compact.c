/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd maintenance (lib/maint/maint.h) against a real etcd started as Debian
 * starts it (no auto-compaction) with a 16 MiB backend quota: overwriting
 * a few keys with 64 KiB values writes several quotas' worth while the
 * elected node compacts, and every put succeeds; only one of two nodes
 * compacts, the other takes over when the first session ends; a pin holds
 * compaction back until it is deleted. The control runs the same load
 * without maintenance and hits etcd's NOSPACE alarm.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "maint/maint.h"
#include "harness.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "util/mem.h"
#include "util/metrics.h"

#include "../support/leak.h"
#include "../support/loop.h"

#define QUOTA	    (16LL << 20)
#define VALUE_SIZE  (64 * 1024)
#define NKEYS	    4
#define RETAIN	    8
#define INTERVAL_MS 100
/* Pace of the load: at most about 150 puts (10 MiB) a second. */
#define GAP_MS 5
/* Three quotas' worth of puts. */
#define NPUTS ((int)(3 * QUOTA / VALUE_SIZE))

static struct efs_harness *h;
static struct efs_meta_ns ns;

static void start_cluster(void)
{
	struct efs_harness_opts o = {.quota_bytes = QUOTA};
	int r;

	r = efs_harness_start(&h, &o);
	cr_assert_eq(r, 0, "harness start: %d", r);
	cr_assert_eq(efs_meta_ns_init(&ns, "tcompact"), 0);
	efs_test_loop_init();
}

/* Each test calls it before its leak check, and .fini again. */
static void teardown(void)
{
	efs_test_loop_fini();
	h = efs_harness_free(h);
}

TestSuite(compact, .fini = teardown, .timeout = 120);

/* ---- etcd helpers ---- */

struct op_res {
	bool done;
	int err;
	int64_t revision;
	char value[64];
	bool found;
};

static void put_done(struct efs_etcd_result *r, Etcdserverpb__PutResponse *resp, void *arg)
{
	struct op_res *o = arg;

	o->done = true;
	o->err = r->err;
	if (resp && resp->header)
		o->revision = resp->header->revision;
}

static void delete_done(struct efs_etcd_result *r, Etcdserverpb__DeleteRangeResponse *resp,
			void *arg)
{
	struct op_res *o = arg;

	o->done = true;
	o->err = r->err;
	if (resp && resp->header)
		o->revision = resp->header->revision;
}

static void range_done(struct efs_etcd_result *r, Etcdserverpb__RangeResponse *resp, void *arg)
{
	struct op_res *o = arg;

	o->done = true;
	o->err = r->err;
	if (resp && resp->n_kvs == 1) {
		size_t n = resp->kvs[0]->value.len;

		if (n >= sizeof(o->value))
			n = sizeof(o->value) - 1;
		memcpy(o->value, resp->kvs[0]->value.data, n);
		o->value[n] = '\0';
		o->found = true;
	}
}

/* Puts |key| = |len| bytes of |value|; returns the call's result. */
static struct op_res put(struct efs_etcd *c, const void *key, size_t keylen, const char *value,
			 size_t len)
{
	struct op_res o = {0};

	cr_assert_eq(efs_etcd_put(c, key, keylen, value, len, NULL, NULL, put_done, &o), 0);
	cr_assert(efs_test_run_until(&o.done, 15000), "put timed out");
	return o;
}

static void del(struct efs_etcd *c, const void *key, size_t keylen)
{
	struct op_res o = {0};

	cr_assert_eq(efs_etcd_delete(c, key, keylen, NULL, NULL, delete_done, &o), 0);
	cr_assert(efs_test_run_until(&o.done, 15000), "delete timed out");
	cr_assert_eq(o.err, 0, "delete: %d", o.err);
}

static struct op_res get(struct efs_etcd *c, const void *key, size_t keylen)
{
	struct op_res o = {0};

	cr_assert_eq(efs_etcd_range(c, key, keylen, NULL, NULL, range_done, &o), 0);
	cr_assert(efs_test_run_until(&o.done, 15000), "range timed out");
	cr_assert_eq(o.err, 0, "range: %d", o.err);
	return o;
}

/* Overwrites load/0..NKEYS-1 round robin |n| times with |len| bytes, one
 * put every |gap_ms| at most; returns the first error (0: every put
 * succeeded) and the index it failed at. */
static int load(struct efs_etcd *c, int n, size_t len, uint64_t gap_ms, int *ret_failed_at)
{
	char *value = efs_mem_malloc(len);
	char key[16];
	int i, err = 0;

	cr_assert(value);
	for (i = 0; i < n && err == 0; i++) {
		memset(value, 'a' + i % 26, len);
		snprintf(key, sizeof(key), "load/%d", i % NKEYS);
		err = put(c, key, strlen(key), value, len).err;
		if (gap_ms)
			efs_test_run_for(gap_ms);
	}
	efs_mem_free(value);
	if (ret_failed_at)
		*ret_failed_at = i - 1;
	return err;
}

/* ---- Sessions with their maintenance objects ---- */

struct node {
	struct efs_etcd *c;
	struct efs_session *s;
	struct efs_maint *mt;
	struct efs_metrics *m;
	bool done, left;
	int status;
};

static void on_state(struct efs_session *s, enum efs_session_state old,
		     enum efs_session_state new_state, void *arg)
{
	struct node *n = arg;

	(void)s;
	(void)old;
	(void)new_state;
	efs_maint_session_changed(n->mt);
}

static void on_done(struct efs_session *s, int status, void *arg)
{
	struct node *n = arg;

	(void)s;
	n->done = true;
	n->status = status;
}

static void on_left(struct efs_session *s, int status, void *arg)
{
	struct node *n = arg;

	(void)s;
	n->left = true;
	n->status = status;
}

static void node_start(struct node *n, const char *id)
{
	struct efs_session_opts so = {
		.ns = &ns,
		.node = id,
		.machine_id = id,
		.hostname = "testhost",
		.ttl_s = 2,
	};
	struct efs_maint_opts mo = {
		.interval_ms = INTERVAL_MS,
		.elect_ms = INTERVAL_MS,
		.retain_revs = RETAIN,
	};
	int r;

	*n = (struct node){0};
	n->c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_metrics_new(&n->m), 0);
	r = efs_session_start(&n->s, &efs_test_loop, n->c, &so, on_state, on_done, n);
	cr_assert_eq(r, 0, "session start: %d", r);
	cr_assert(efs_test_run_until(&n->done, 15000), "session start timed out");
	cr_assert_eq(n->status, 0, "session start: %d", n->status);
	r = efs_maint_new(&n->mt, &efs_test_loop, n->c, n->s, &ns, n->m, &mo);
	cr_assert_eq(r, 0, "maint new: %d", r);
	cr_assert_eq(efs_maint_start(n->mt), 0);
	cr_assert_eq(efs_maint_start(n->mt), -EALREADY);
}

static void node_leave(struct node *n)
{
	cr_assert_eq(efs_session_leave(n->s, on_left, n), 0);
	cr_assert(efs_test_run_until(&n->left, 10000), "leave timed out");
	cr_assert_eq(n->status, 0, "leave: %d", n->status);
}

static void node_free(struct node *n)
{
	n->mt = efs_maint_free(n->mt);
	n->s = efs_session_free(n->s);
	efs_test_client_free(n->c);
	n->m = efs_metrics_free(n->m);
}

static struct efs_maint_stats stats(const struct node *n)
{
	struct efs_maint_stats st;

	efs_maint_get_stats(n->mt, &st);
	return st;
}

static void wait_leader(struct node *n, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (!stats(n).leader) {
		cr_assert_lt(efs_test_now_ms(), end, "not elected within %" PRIu64 " ms", ms);
		efs_test_run_for(10);
	}
}

/* Runs the loop until |n| compacted to at least |rev|. */
static void wait_compacted(struct node *n, int64_t rev, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (stats(n).compacted_rev < rev) {
		struct efs_maint_stats st = stats(n);

		cr_assert_lt(efs_test_now_ms(), end,
			     "compacted to %" PRId64 ", wanted %" PRId64
			     " (leader %d, last rev %" PRId64 ", errors %" PRIu64 ", last error %d)",
			     st.compacted_rev, rev, st.leader, st.last_rev, st.errors, st.last_err);
		efs_test_run_for(10);
	}
}

static double metric(struct node *n, const char *name)
{
	char *text = NULL, *p;
	size_t len;
	double v;

	cr_assert_eq(efs_metrics_render(n->m, &text, &len), 0);
	p = strstr(text, name);
	while (p && (p[strlen(name)] != ' ' || (p > text && p[-1] != '\n')))
		p = strstr(p + 1, name);
	cr_assert(p, "metric %s missing", name);
	v = strtod(p + strlen(name), NULL);
	efs_mem_free(text);
	return v;
}

Test(compact, elected_node_keeps_etcd_below_its_quota)
{
	struct efs_maint_stats st1, st2;
	struct efs_meta_key mkey, pkey;
	struct node n1, n2;
	struct op_res o;
	int64_t pin_rev, rev;
	char pinval[32];
	int r, at;

	start_cluster();
	cr_assert_eq(efs_meta_key_maint(&ns, &mkey), 0);
	cr_assert_eq(efs_meta_key_pin(&ns, "backup", &pkey), 0);

	/* n1 is elected; n2, started later, is not. */
	node_start(&n1, "n1");
	wait_leader(&n1, 5000);
	node_start(&n2, "n2");
	cr_assert_eq(metric(&n1, "etcfs_maint_leader"), 1);

	/* Three quotas' worth of 64 KiB puts on four keys: all succeed. */
	r = load(n1.c, NPUTS, VALUE_SIZE, GAP_MS, &at);
	st1 = stats(&n1);
	cr_assert_eq(r, 0,
		     "put %d of %d failed: %d (maintenance keeps etcd under its quota; %" PRIu64
		     " compactions, to %" PRId64 " at %" PRId64 ", db %" PRIu64 ", in use %" PRIu64
		     ", errors %" PRIu64 ", last %d)",
		     at, NPUTS, r, st1.compactions, st1.compacted_rev, st1.last_rev, st1.db_size,
		     st1.in_use, st1.errors, st1.last_err);
	o = put(n1.c, "load/x", 6, "x", 1);
	cr_assert_eq(o.err, 0);
	wait_compacted(&n1, o.revision - RETAIN, 10000);
	st1 = stats(&n1);
	st2 = stats(&n2);
	cr_assert(st1.leader);
	cr_assert_gt(st1.compactions, 10, "only %" PRIu64 " compactions", st1.compactions);
	cr_assert_gt(st1.steps, 10);
	cr_assert_geq(st1.compacted_rev, NPUTS - RETAIN);
	cr_assert_gt(st1.db_size, 0, "the holder reads the database size");
	cr_assert_lt(st1.db_size, (uint64_t)QUOTA);
	cr_assert_not(st2.leader);
	cr_assert_eq(st2.elections_won, 0);
	cr_assert_eq(st2.compactions, 0);
	cr_assert_eq(st2.steps, 0);
	cr_assert_eq(metric(&n1, "etcfs_maint_compactions_total"), (double)st1.compactions);
	cr_assert_eq(metric(&n1, "etcfs_maint_compacted_revision"), (double)st1.compacted_rev);
	cr_assert_eq(metric(&n2, "etcfs_maint_leader"), 0);
	o = get(n1.c, mkey.buf, mkey.len);
	cr_assert(o.found);
	cr_assert_str_eq(o.value, "n1");

	/* The first session ends: n1 stops at once, n2 takes over. */
	node_leave(&n1);
	cr_assert_not(stats(&n1).leader);
	cr_assert_eq(metric(&n1, "etcfs_maint_leader"), 0);
	wait_leader(&n2, 5000);
	o = get(n2.c, mkey.buf, mkey.len);
	cr_assert_str_eq(o.value, "n2");
	st1 = stats(&n1);

	/* A pin holds n2's compaction back; deleting it lets it go on. */
	o = put(n2.c, pkey.buf, pkey.len, "0", 1);
	cr_assert_eq(o.err, 0);
	pin_rev = o.revision;
	snprintf(pinval, sizeof(pinval), "%" PRId64, pin_rev);
	o = put(n2.c, pkey.buf, pkey.len, pinval, strlen(pinval));
	cr_assert_eq(o.err, 0);
	r = load(n2.c, 200, 1024, 0, &at);
	cr_assert_eq(r, 0, "put %d failed: %d", at, r);
	efs_test_run_for(5 * INTERVAL_MS);
	st2 = stats(&n2);
	cr_assert_geq(st2.steps, 2);
	cr_assert_eq(st2.min_pin, pin_rev);
	cr_assert_leq(st2.compacted_rev, pin_rev);
	cr_assert_gt(st2.last_rev, pin_rev + 200);
	del(n2.c, pkey.buf, pkey.len);
	o = put(n2.c, "load/x", 6, "y", 1);
	wait_compacted(&n2, o.revision - RETAIN, 5000);
	st2 = stats(&n2);
	cr_assert_geq(st2.compacted_rev, o.revision - RETAIN);
	cr_assert_gt(st2.compacted_rev, pin_rev + 100);
	cr_assert_eq(st2.min_pin, 0);
	/* n1 did nothing after it left. */
	cr_assert_eq(stats(&n1).compactions, st1.compactions);

	/* A pin that holds no revision stops compaction. */
	o = put(n2.c, pkey.buf, pkey.len, "oops", 4);
	cr_assert_eq(o.err, 0);
	rev = stats(&n2).compacted_rev;
	r = load(n2.c, 50, 1024, 0, &at);
	cr_assert_eq(r, 0);
	efs_test_run_for(5 * INTERVAL_MS);
	cr_assert_eq(stats(&n2).compacted_rev, rev);
	cr_assert_eq(stats(&n2).last_err, -EBADMSG);

	node_leave(&n2);
	node_free(&n2);
	node_free(&n1);
	teardown();
	efs_test_assert_no_leaks();
}

/* A holder that dies without leaving hands over once its lease expires. */
Test(compact, dead_holder_hands_over_after_its_lease)
{
	struct efs_meta_key mkey;
	struct node n1, n2;
	struct op_res o;
	uint64_t t0;

	start_cluster();
	cr_assert_eq(efs_meta_key_maint(&ns, &mkey), 0);
	node_start(&n1, "n1");
	wait_leader(&n1, 5000);
	node_start(&n2, "n2");
	efs_test_run_for(3 * INTERVAL_MS);
	cr_assert_not(stats(&n2).leader);

	/* As after a kill -9: nothing revokes n1's lease (TTL 2 s). */
	node_free(&n1);
	t0 = efs_test_now_ms();
	wait_leader(&n2, 8000);
	cr_assert_geq(efs_test_now_ms() - t0, 500, "taken over before the lease expired");
	o = get(n2.c, mkey.buf, mkey.len);
	cr_assert_str_eq(o.value, "n2");
	cr_assert_eq(load(n2.c, 3 * RETAIN, 16, 0, NULL), 0);
	o = put(n2.c, "load/x", 6, "x", 1);
	cr_assert_gt(o.revision - RETAIN, 2 * RETAIN);
	wait_compacted(&n2, o.revision - RETAIN, 5000);

	node_leave(&n2);
	node_free(&n2);
	teardown();
	efs_test_assert_no_leaks();
}

Test(compact, without_maintenance_the_load_fills_etcd)
{
	struct efs_etcd *c;
	int r, at;

	start_cluster();
	c = efs_test_client_new(efs_harness_endpoints(h));
	r = load(c, NPUTS, VALUE_SIZE, GAP_MS, &at);
	cr_assert_eq(r, -ENOSPC, "the load without compaction ended with %d", r);
	cr_assert_lt(at, NPUTS / 2, "NOSPACE only at put %d", at);
	efs_test_client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}

/* The pure parts. */
Test(compact, target_pins_and_defrag_decision)
{
	int64_t v;

	cr_assert_eq(efs_maint_target(2000, 1000, 0, 0), 1000);
	cr_assert_eq(efs_maint_target(2000, 1000, 500, 0), 500);
	cr_assert_eq(efs_maint_target(2000, 1000, 1500, 0), 1000);
	cr_assert_eq(efs_maint_target(2000, 1000, 0, 1000), 0);
	cr_assert_eq(efs_maint_target(2000, 1000, 400, 500), 0);
	cr_assert_eq(efs_maint_target(900, 1000, 0, 0), 0);
	cr_assert_eq(efs_maint_target(1001, 1000, 0, 0), 1);

	cr_assert(efs_maint_defrag_wanted(400ULL << 20, 200ULL << 20, 25, 64ULL << 20));
	cr_assert_not(efs_maint_defrag_wanted(400ULL << 20, 300ULL << 20, 25, 64ULL << 20));
	cr_assert_not(efs_maint_defrag_wanted(100ULL << 20, 40ULL << 20, 25, 64ULL << 20));
	cr_assert_not(efs_maint_defrag_wanted(100, 75, 25, 0));
	cr_assert(efs_maint_defrag_wanted(100, 74, 25, 0));
	cr_assert_not(efs_maint_defrag_wanted(10, 20, 25, 0));
	cr_assert(efs_maint_defrag_wanted(UINT64_MAX, 0, 100, 0) == false);
	cr_assert(efs_maint_defrag_wanted(UINT64_MAX, 1, 99, 0));

	cr_assert_eq(efs_maint_parse_pin("12345", 5, &v), 0);
	cr_assert_eq(v, 12345);
	cr_assert_eq(efs_maint_parse_pin("0", 1, &v), -EBADMSG);
	cr_assert_eq(efs_maint_parse_pin("", 0, &v), -EBADMSG);
	cr_assert_eq(efs_maint_parse_pin("12a", 3, &v), -EBADMSG);
	cr_assert_eq(efs_maint_parse_pin("-5", 2, &v), -EBADMSG);
	cr_assert_eq(efs_maint_parse_pin("9223372036854775807", 19, &v), 0);
	cr_assert_eq(v, INT64_MAX);
	cr_assert_eq(efs_maint_parse_pin("9999999999999999999", 19, &v), -EBADMSG);
}
