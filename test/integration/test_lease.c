/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Leases against real etcd members started by the harness: the thin
 * wrappers, keepalive across a leader kill, the renewal interval under bulk
 * load on the same loop, expiry, at-risk/recovered around a stopped member,
 * and revocation by another client.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/lease.h"
#include "harness.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;

static void start_cluster(int members)
{
	struct efs_harness_opts o = {.members = members};
	int r;

	r = efs_harness_start(&h, &o);
	cr_assert_eq(r, 0, "harness start: %d", r);
	efs_test_loop_init();
}

/* Each test calls it before its leak check, and .fini again. */
static void teardown(void)
{
	efs_test_loop_fini();
	h = efs_harness_free(h);
}

static int member_of_url(const char *url)
{
	for (int i = 0; i < efs_harness_members(h); i++)
		if (strcmp(efs_harness_member_url(h, i), url) == 0)
			return i;
	return -1;
}

/* ---- Wrapper helpers ---- */

struct grant_res {
	bool done;
	int status;
	struct efs_etcd_lease_grant_info info;
};

static void grant_done(int status, const struct efs_etcd_lease_grant_info *info, void *arg)
{
	struct grant_res *g = arg;

	g->done = true;
	g->status = status;
	if (info)
		g->info = *info;
}

static struct efs_etcd_lease_grant_info grant(struct efs_etcd *c, int64_t ttl)
{
	struct grant_res g = {0};

	cr_assert_eq(efs_etcd_lease_grant(c, ttl, 0, grant_done, &g), 0);
	cr_assert(efs_test_run_until(&g.done, 15000), "grant timed out");
	cr_assert_eq(g.status, 0, "grant: %d", g.status);
	cr_assert_gt(g.info.id, 0);
	cr_assert_gt(g.info.sent_ns, 0);
	return g.info;
}

struct status_res {
	bool done;
	int status;
};

static void status_done(int status, void *arg)
{
	struct status_res *s = arg;

	s->done = true;
	s->status = status;
}

static int revoke_lease(struct efs_etcd *c, int64_t id)
{
	struct status_res s = {0};

	cr_assert_eq(efs_etcd_lease_revoke(c, id, status_done, &s), 0);
	cr_assert(efs_test_run_until(&s.done, 15000), "revoke timed out");
	return s.status;
}

struct ttl_res {
	bool done;
	int status;
	int64_t ttl, granted;
};

static void ttl_done(int status, int64_t ttl, int64_t granted, void *arg)
{
	struct ttl_res *t = arg;

	t->done = true;
	t->status = status;
	t->ttl = ttl;
	t->granted = granted;
}

static struct ttl_res time_to_live(struct efs_etcd *c, int64_t id)
{
	struct ttl_res t = {0};

	cr_assert_eq(efs_etcd_lease_time_to_live(c, id, ttl_done, &t), 0);
	cr_assert(efs_test_run_until(&t.done, 15000), "TimeToLive timed out");
	cr_assert_eq(t.status, 0, "TimeToLive: %d", t.status);
	return t;
}

struct call_res {
	bool done;
	int err;
	int64_t count;
	unsigned *counter;
	unsigned *errors;
};

static void call_done(struct efs_etcd_result *r, void *arg)
{
	struct call_res *cr = arg;

	cr->done = true;
	cr->err = r->err;
	if (!r->err && r->resp &&
	    r->resp->descriptor == &etcdserverpb__range_response__descriptor)
		cr->count = ((const Etcdserverpb__RangeResponse *)(const void *)r->resp)->count;
	if (cr->counter)
		(*cr->counter)++;
	if (r->err && cr->errors)
		(*cr->errors)++;
}

static void put_leased(struct efs_etcd *c, const char *key, int64_t lease)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
	struct call_res cr = {0};

	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	req.lease = lease;
	cr_assert_eq(efs_etcd_call(c, EFS_ETCD_PUT, &req.base, NULL, call_done, &cr, NULL), 0);
	cr_assert(efs_test_run_until(&cr.done, 15000));
	cr_assert_eq(cr.err, 0, "put: %d", cr.err);
}

static int64_t count_keys(struct efs_etcd *c, const char *key)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct call_res cr = {0};

	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	req.count_only = true;
	cr_assert_eq(efs_etcd_call(c, EFS_ETCD_RANGE, &req.base, NULL, call_done, &cr, NULL), 0);
	cr_assert(efs_test_run_until(&cr.done, 15000));
	cr_assert_eq(cr.err, 0, "range: %d", cr.err);
	return cr.count;
}

/* ---- Recording lease events ---- */

struct lrec {
	int at_risk, recovered, gone;
	int gone_status;
	char order[64]; /* one letter per event: R(isk), O(k again), G(one) */
	uint64_t at_risk_at, gone_at;
};

static void lrec_cb(struct efs_etcd_lease *l, int status, enum efs_etcd_lease_event ev,
		    uint64_t at_ns, void *arg)
{
	struct lrec *r = arg;
	size_t n = strlen(r->order);
	char c = '?';

	(void)l;
	switch (ev) {
	case EFS_ETCD_LEASE_AT_RISK:
		r->at_risk++;
		r->at_risk_at = at_ns;
		c = 'R';
		break;
	case EFS_ETCD_LEASE_RECOVERED:
		r->recovered++;
		c = 'O';
		break;
	case EFS_ETCD_LEASE_GONE:
		r->gone++;
		r->gone_status = status;
		r->gone_at = at_ns;
		c = 'G';
		break;
	}
	if (n < sizeof(r->order) - 1)
		r->order[n] = c;
}

static struct efs_etcd_lease *keep(struct efs_etcd_keepalive *ka,
				   const struct efs_etcd_lease_grant_info *g, struct lrec *r)
{
	struct efs_etcd_lease_opts o = {.id = g->id, .ttl_s = g->ttl_s, .granted_ns = g->sent_ns};
	struct efs_etcd_lease *l;
	int err = efs_etcd_lease_new(&l, ka, &o, lrec_cb, r);

	cr_assert_eq(err, 0, "lease_new: %d", err);
	return l;
}

TestSuite(lease, .fini = teardown, .timeout = 150);

Test(lease, grant_time_to_live_and_revoke)
{
	struct efs_etcd *c;
	struct efs_etcd_lease_grant_info g;
	struct ttl_res t;
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l, *l2;
	struct efs_etcd_lease_opts o = {0};

	start_cluster(1);
	c = efs_test_client_new(efs_harness_endpoints(h));
	g = grant(c, 5);
	cr_assert_eq(g.ttl_s, 5);
	t = time_to_live(c, g.id);
	cr_assert_gt(t.ttl, 0);
	cr_assert_leq(t.ttl, 5);
	cr_assert_eq(t.granted, 5);

	/* Argument checks of the keepalive set. */
	cr_assert_eq(efs_etcd_keepalive_new(&ka, c), 0);
	cr_assert_eq(efs_etcd_lease_new(&l, ka, &o, lrec_cb, NULL), -EINVAL);
	o.id = g.id;
	o.ttl_s = 5;
	o.failover_ms = 2000;
	o.at_risk_ms = 1000;
	cr_assert_eq(efs_etcd_lease_new(&l, ka, &o, lrec_cb, NULL), -EINVAL);
	o.failover_ms = o.at_risk_ms = 0;
	cr_assert_eq(efs_etcd_lease_new(&l, ka, &o, lrec_cb, NULL), 0);
	cr_assert_eq(efs_etcd_lease_new(&l2, ka, &o, lrec_cb, NULL), -EEXIST);
	cr_assert_eq(efs_etcd_lease_id(l), g.id);
	cr_assert_eq(efs_etcd_lease_ttl(l), 5);
	cr_assert_eq(efs_etcd_lease_deadline_ns(l) - efs_etcd_lease_last_ack_send_ns(l),
		     5 * EFS_NSEC_PER_SEC);
	efs_etcd_lease_free(l);
	efs_etcd_keepalive_free(ka);

	cr_assert_eq(revoke_lease(c, g.id), 0);
	t = time_to_live(c, g.id);
	cr_assert_eq(t.ttl, -1);
	cr_assert_eq(revoke_lease(c, g.id), -ENOENT);
	efs_test_client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, kept_alive_across_a_leader_kill)
{
	struct efs_etcd *c;
	struct efs_etcd_lease_grant_info g;
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_lease_stats before, after;
	struct lrec r = {0};
	struct ttl_res t;
	int leader;

	start_cluster(3);
	c = efs_test_client_new(efs_harness_endpoints(h));
	g = grant(c, 3);
	cr_assert_eq(efs_etcd_keepalive_new(&ka, c), 0);
	l = keep(ka, &g, &r);
	efs_test_run_for(1500);
	efs_etcd_lease_get_stats(l, &before);
	cr_assert_gt(before.renewals_acked, 0);
	leader = efs_harness_leader(h);
	cr_assert_geq(leader, 0, "no leader: %d", leader);
	cr_assert_eq(efs_harness_kill(h, leader), 0);
	efs_test_run_for(8000);
	cr_assert_eq(r.gone, 0, "lease reported gone (events %s)", r.order);
	efs_etcd_lease_get_stats(l, &after);
	cr_assert_gt(after.renewals_acked, before.renewals_acked + 5,
		     "renewals stopped after the kill (%" PRIu64 " -> %" PRIu64 ")",
		     before.renewals_acked, after.renewals_acked);
	cr_assert_eq(efs_etcd_lease_is_at_risk(l), false, "still at risk (events %s)", r.order);
	cr_assert_gt(efs_etcd_lease_deadline_ns(l), efs_clock_mono_ns());
	t = time_to_live(c, g.id);
	cr_assert_gt(t.ttl, 0, "etcd says the lease is gone");
	efs_etcd_keepalive_free(ka);
	efs_test_client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}

/* Submits the puts in slices of 500 per loop iteration, so that the test's
 * own submission does not hold the loop for long at a time. */
struct feeder {
	struct efs_etcd *c;
	struct call_res *cr;
	const char *val;
	size_t vlen;
	int next, total;
	unsigned completed, errors;
	int submit_err;
};

static void feed(uv_timer_t *t)
{
	struct feeder *f = t->data;

	for (int n = 0; n < 500 && f->next < f->total; n++, f->next++) {
		Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
		char key[32];
		int r;

		snprintf(key, sizeof(key), "/load/%05d", f->next);
		req.key.data = (uint8_t *)key;
		req.key.len = strlen(key);
		req.value.data = (uint8_t *)f->val;
		req.value.len = f->vlen;
		f->cr[f->next].counter = &f->completed;
		f->cr[f->next].errors = &f->errors;
		r = efs_etcd_call(f->c, EFS_ETCD_PUT, &req.base, NULL, call_done, &f->cr[f->next],
				  NULL);
		if (r < 0 && !f->submit_err)
			f->submit_err = r;
	}
	if (f->next == f->total)
		uv_timer_stop(t);
}

Test(lease, renewals_keep_their_interval_under_10000_puts_on_the_same_loop)
{
	enum { NPUTS = 10000, VLEN = 1024 };
	struct efs_etcd *c;
	struct efs_etcd_lease_grant_info g;
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_lease_stats st;
	struct lrec r = {0};
	struct feeder f = {.total = NPUTS, .vlen = VLEN};
	uv_timer_t feeder;
	char *val = malloc(VLEN);
	uint64_t t0, elapsed;

	f.cr = calloc(NPUTS, sizeof(*f.cr));
	cr_assert_not_null(f.cr);
	cr_assert_not_null(val);
	memset(val, 'x', VLEN);
	f.val = val;
	start_cluster(1);
	c = efs_test_client_new(efs_harness_endpoints(h));
	f.c = c;
	g = grant(c, 2);
	cr_assert_eq(efs_etcd_keepalive_new(&ka, c), 0);
	l = keep(ka, &g, &r);
	efs_test_run_for(1000);
	t0 = efs_clock_mono_ns();
	uv_timer_init(&efs_test_loop, &feeder);
	feeder.data = &f;
	uv_timer_start(&feeder, feed, 0, 1);
	while (f.completed < NPUTS && efs_test_now_ms() < t0 / EFS_NSEC_PER_MSEC + 120000)
		uv_run(&efs_test_loop, UV_RUN_ONCE);
	elapsed = efs_clock_mono_ns() - t0;
	uv_close((uv_handle_t *)&feeder, NULL);
	efs_etcd_lease_get_stats(l, &st);
	cr_log_info("%u puts in %" PRIu64 " ms; renewals sent %" PRIu64 ", acked %" PRIu64
		    "; max gap queued %" PRIu64 " ms, on the wire %" PRIu64 " ms; errors %u",
		    f.completed, (uint64_t)(elapsed / EFS_NSEC_PER_MSEC), st.renewals_sent,
		    st.renewals_acked, (uint64_t)(st.max_queue_gap_ns / EFS_NSEC_PER_MSEC),
		    (uint64_t)(st.max_wire_gap_ns / EFS_NSEC_PER_MSEC), f.errors);
	cr_assert_eq(f.submit_err, 0, "efs_etcd_call: %d", f.submit_err);
	cr_assert_eq(f.completed, NPUTS, "only %u of %d puts completed", f.completed, NPUTS);
	cr_assert_eq(f.errors, 0);
	cr_assert_eq(r.gone, 0);
	cr_assert_lt(st.max_queue_gap_ns, 500 * EFS_NSEC_PER_MSEC,
		     "renewals queued %" PRIu64 " ms apart", st.max_queue_gap_ns / 1000000);
	cr_assert_gt(st.max_wire_gap_ns, 0);
	cr_assert_lt(st.max_wire_gap_ns, 500 * EFS_NSEC_PER_MSEC,
		     "renewals sent %" PRIu64 " ms apart", st.max_wire_gap_ns / 1000000);
	efs_etcd_keepalive_free(ka);
	efs_test_client_free(c);
	free(f.cr);
	free(val);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, expiry_deletes_its_keys_and_reports_gone)
{
	struct efs_etcd *c;
	struct efs_etcd_lease_grant_info g;
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct lrec r = {0};
	bool gone = false;
	uint64_t end;

	start_cluster(1);
	c = efs_test_client_new(efs_harness_endpoints(h));
	g = grant(c, 2);
	put_leased(c, "/leased/a", g.id);
	put_leased(c, "/leased/b", g.id);
	cr_assert_eq(efs_etcd_keepalive_new(&ka, c), 0);
	l = keep(ka, &g, &r);
	efs_test_run_for(3000);
	cr_assert_eq(count_keys(c, "/leased/a"), 1, "key gone while renewed");
	efs_etcd_lease_fault_pause(l, true);
	end = efs_test_now_ms() + 15000;
	while (!gone && efs_test_now_ms() < end) {
		uv_run(&efs_test_loop, UV_RUN_ONCE);
		gone = r.gone > 0;
	}
	cr_assert(gone, "no gone event (events %s)", r.order);
	cr_assert_eq(r.gone_status, -ENOENT);
	cr_assert_str_eq(r.order, "RG");
	cr_assert(efs_etcd_lease_is_gone(l));
	/* etcd never expires a lease before the deadline we computed. */
	cr_assert_geq(r.gone_at, efs_etcd_lease_deadline_ns(l));
	cr_assert_eq(count_keys(c, "/leased/a"), 0);
	cr_assert_eq(count_keys(c, "/leased/b"), 0);
	efs_etcd_lease_free(l);
	efs_etcd_keepalive_free(ka);
	efs_test_client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, at_risk_then_recovered_or_moved_when_its_member_is_stopped)
{
	struct efs_etcd *c;
	struct efs_etcd_lease_grant_info g;
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_lease_stats before, st;
	struct lrec r = {0};
	struct ttl_res t;
	int victim;

	start_cluster(3);
	c = efs_test_client_new(efs_harness_endpoints(h));
	g = grant(c, 2);
	cr_assert_eq(efs_etcd_keepalive_new(&ka, c), 0);
	l = keep(ka, &g, &r);
	efs_test_run_for(1500);
	efs_etcd_lease_get_stats(l, &before);
	cr_assert_gt(before.renewals_acked, 0);
	victim = member_of_url(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_PRIO));
	cr_assert_geq(victim, 0);
	cr_assert_eq(efs_harness_pause(h, victim), 0);
	efs_test_run_for(1500);
	cr_assert_eq(efs_harness_resume(h, victim), 0);
	efs_test_run_for(5000);
	efs_etcd_lease_get_stats(l, &st);
	cr_log_info("events %s; acks %" PRIu64 " (bulk %" PRIu64 "), prio failovers %" PRIu64,
		    r.order, st.renewals_acked, st.acks_bulk, st.prio_failovers);
	cr_assert_eq(r.gone, 0, "lease reported gone (events %s)", r.order);
	/* Either renewals moved to another member in time, or the lease went
	 * at risk and recovered. */
	cr_assert(st.acks_bulk > before.acks_bulk || (r.at_risk > 0 && r.recovered == r.at_risk),
		  "events %s, bulk acks %" PRIu64, r.order, st.acks_bulk);
	cr_assert_eq(r.at_risk, r.recovered, "events %s", r.order);
	cr_assert_eq(efs_etcd_lease_is_at_risk(l), false);
	cr_assert_gt(st.renewals_acked, before.renewals_acked + 5);
	t = time_to_live(c, g.id);
	cr_assert_gt(t.ttl, 0, "etcd says the lease is gone");
	efs_etcd_keepalive_free(ka);
	efs_test_client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, revoke_by_another_client_reports_gone)
{
	struct efs_etcd *c, *other;
	struct efs_etcd_lease_grant_info g;
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct lrec r = {0};
	bool gone = false;
	uint64_t end;

	start_cluster(1);
	c = efs_test_client_new(efs_harness_endpoints(h));
	other = efs_test_client_new(efs_harness_endpoints(h));
	g = grant(c, 5);
	cr_assert_eq(efs_etcd_keepalive_new(&ka, c), 0);
	l = keep(ka, &g, &r);
	efs_test_run_for(1000);
	cr_assert_eq(revoke_lease(other, g.id), 0);
	end = efs_test_now_ms() + 10000;
	while (!gone && efs_test_now_ms() < end) {
		uv_run(&efs_test_loop, UV_RUN_ONCE);
		gone = r.gone > 0;
	}
	cr_assert(gone, "no gone event (events %s)", r.order);
	cr_assert_eq(r.gone_status, -ENOENT);
	cr_assert_str_eq(r.order, "G");
	/* Freeing from outside after gone, and freeing the set after. */
	efs_etcd_lease_free(l);
	efs_etcd_keepalive_free(ka);
	efs_test_client_free(other);
	efs_test_client_free(c);
	teardown();
	efs_test_assert_no_leaks();
}
