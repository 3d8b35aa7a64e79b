/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Watch streams against real etcd members started by the harness: resumption
 * across a member kill with no event lost or repeated, several watchers and
 * streams, replay, prev_kv, fragments, compaction, cancel, creation failures,
 * wait_rev and barriers, and the delivery-delay fault hook.
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
#include "etcd/watch.h"
#include "harness.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;

static void start_cluster(int members, const struct efs_harness_opts *o)
{
	struct efs_harness_opts def = {0};
	int r;

	if (!o)
		o = &def;
	def.members = members;
	r = efs_harness_start(&h, o);
	cr_assert_eq(r, 0, "harness start: %d", r);
	efs_test_loop_init();
}

/* Each test calls it before its leak check, and .fini again. */
static void teardown(void)
{
	efs_test_loop_fini();
	h = efs_harness_free(h);
}

/* ---- Unary helpers ---- */

struct call_res {
	bool done;
	int err;
	int64_t rev;
};

static void call_done(struct efs_etcd_result *r, void *arg)
{
	struct call_res *cr = arg;
	const ProtobufCMessage *m = r->resp;

	cr->done = true;
	cr->err = r->err;
	if (r->err || !m)
		return;
	if (m->descriptor == &etcdserverpb__put_response__descriptor) {
		const Etcdserverpb__PutResponse *p = (const void *)m;

		cr->rev = p->header ? p->header->revision : 0;
	} else if (m->descriptor == &etcdserverpb__txn_response__descriptor) {
		const Etcdserverpb__TxnResponse *p = (const void *)m;

		cr->rev = p->header ? p->header->revision : 0;
	} else if (m->descriptor == &etcdserverpb__delete_range_response__descriptor) {
		const Etcdserverpb__DeleteRangeResponse *p = (const void *)m;

		cr->rev = p->header ? p->header->revision : 0;
	} else if (m->descriptor == &etcdserverpb__compaction_response__descriptor) {
		const Etcdserverpb__CompactionResponse *p = (const void *)m;

		cr->rev = p->header ? p->header->revision : 0;
	}
}

static int put_async(struct efs_etcd *c, const char *key, const void *val, size_t len,
		     struct call_res *cr)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;

	memset(cr, 0, sizeof(*cr));
	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	req.value.data = (uint8_t *)val;
	req.value.len = len;
	return efs_etcd_call(c, EFS_ETCD_PUT, &req.base, NULL, call_done, cr, NULL);
}

static int64_t put(struct efs_etcd *c, const char *key, const char *val)
{
	struct call_res cr;
	int r = put_async(c, key, val, strlen(val), &cr);

	cr_assert_eq(r, 0, "put: %d", r);
	cr_assert(efs_test_run_until(&cr.done, 15000), "put %s timed out", key);
	cr_assert_eq(cr.err, 0, "put %s: %d", key, cr.err);
	return cr.rev;
}

static void compact(struct efs_etcd *c, int64_t rev)
{
	Etcdserverpb__CompactionRequest req = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
	struct call_res cr = {0};

	req.revision = rev;
	req.physical = true;
	cr_assert_eq(efs_etcd_call(c, EFS_ETCD_COMPACT, &req.base, NULL, call_done, &cr, NULL), 0);
	cr_assert(efs_test_run_until(&cr.done, 15000));
	cr_assert_eq(cr.err, 0, "compact: %d", cr.err);
}

/* ---- Recording watcher updates ---- */

#define MAX_EV 4096

struct ev {
	int type;
	char key[64];
	char val[32];
	char prev[32];
	bool has_prev;
	int64_t rev;
	size_t vlen;
};

struct rec {
	const char *name;
	bool created;
	int64_t created_rev;
	bool ended;
	enum efs_etcd_watch_kind end_kind;
	int end_status;
	int64_t compact_rev;
	char reason[256];
	size_t n;
	struct ev ev[MAX_EV];
	size_t updates;
	size_t progress;
	uint64_t first_ev_ns;
	bool bad_order; /* an update had a revision at or below a previous one */
	bool after_end; /* an update came after the final one */
};

static void copy_str(char *dst, size_t size, const ProtobufCBinaryData *b)
{
	size_t n = b->len < size - 1 ? b->len : size - 1;

	if (n)
		memcpy(dst, b->data, n);
	dst[n] = '\0';
}

static void rec_cb(struct efs_etcd_watcher *w, int status, const struct efs_etcd_watch_update *u,
		   void *arg)
{
	struct rec *r = arg;

	(void)w;
	if (r->ended)
		r->after_end = true;
	switch (u->kind) {
	case EFS_ETCD_WATCH_CREATED:
		r->created = true;
		r->created_rev = u->revision;
		break;
	case EFS_ETCD_WATCH_EVENTS:
		r->updates++;
		if (!r->first_ev_ns)
			r->first_ev_ns = efs_clock_mono_ns();
		for (size_t i = 0; i < u->n_events; i++) {
			const Mvccpb__Event *e = u->events[i];
			struct ev *d;

			if (r->n && e->kv->mod_revision < r->ev[r->n - 1].rev)
				r->bad_order = true;
			if (r->n == MAX_EV)
				continue;
			d = &r->ev[r->n++];
			d->type = e->type;
			d->rev = e->kv->mod_revision;
			copy_str(d->key, sizeof(d->key), &e->kv->key);
			copy_str(d->val, sizeof(d->val), &e->kv->value);
			d->vlen = e->kv->value.len;
			d->has_prev = e->prev_kv != NULL;
			if (e->prev_kv)
				copy_str(d->prev, sizeof(d->prev), &e->prev_kv->value);
		}
		break;
	case EFS_ETCD_WATCH_PROGRESS:
		r->progress++;
		break;
	case EFS_ETCD_WATCH_COMPACTED:
	case EFS_ETCD_WATCH_CANCELED:
		r->ended = true;
		r->end_kind = u->kind;
		r->end_status = status;
		r->compact_rev = u->compact_revision;
		snprintf(r->reason, sizeof(r->reason), "%s", u->reason);
		break;
	}
}

static struct efs_etcd_watcher *watch(struct efs_etcd_watch_stream *ws, const char *key,
				      bool prefix, int64_t start, struct rec *r)
{
	struct efs_etcd_watch_opts o = {
		.key = key,
		.key_len = strlen(key),
		.prefix = prefix,
		.start_revision = start,
	};
	struct efs_etcd_watcher *w;
	int err = efs_etcd_watcher_new(&w, ws, &o, rec_cb, r);

	cr_assert_eq(err, 0, "watcher_new: %d", err);
	return w;
}

struct wait_res {
	bool done;
	int status;
	struct efs_etcd_watcher *w;
	size_t n_at_done; /* events the watcher had delivered then */
	struct rec *r;
};

static void wait_done(struct efs_etcd_watcher *w, int status, void *arg)
{
	struct wait_res *wr = arg;

	wr->done = true;
	wr->status = status;
	wr->w = w;
	if (wr->r)
		wr->n_at_done = wr->r->n;
}

/* Waits until |w| has delivered everything up to |rev|. */
static void wait_rev(struct efs_etcd_watcher *w, int64_t rev, uint64_t ms)
{
	struct wait_res wr = {0};

	cr_assert_eq(efs_etcd_watch_wait_rev(w, rev, wait_done, &wr), 0);
	cr_assert(efs_test_run_until(&wr.done, ms), "watcher did not reach revision %" PRId64
		  " (next %" PRId64 ")", rev, efs_etcd_watcher_next_rev(w));
	cr_assert_eq(wr.status, 0);
}

static void wait_created(struct rec *r)
{
	cr_assert(efs_test_run_until(&r->created, 10000), "watcher %s not created",
		  r->name ? r->name : "");
}

static struct rec *rec_new(const char *name)
{
	struct rec *r = calloc(1, sizeof(*r));

	cr_assert_not_null(r);
	r->name = name;
	return r;
}

/* ---- Tests ---- */

TestSuite(watch, .fini = teardown, .timeout = 120);

/* Writer state for the kill test: puts /w/<i> one after the other,
 * retrying failures, from a client that talks to the other members. */
struct writer {
	struct efs_etcd *c;
	int next, total;
	struct call_res cr;
	uv_timer_t retry;
	bool done;
	int failures;
	int64_t last_rev;
	int kill_at;
	bool kill_now;
};

static void writer_step(struct writer *wr);

static void writer_retry(uv_timer_t *t)
{
	writer_step(t->data);
}

static void writer_done(struct efs_etcd_result *r, void *arg)
{
	struct writer *wr = arg;

	call_done(r, &wr->cr);
	if (r->err) {
		wr->failures++;
		uv_timer_start(&wr->retry, writer_retry, 50, 0);
		return;
	}
	wr->last_rev = wr->cr.rev;
	wr->next++;
	if (wr->next == wr->kill_at)
		wr->kill_now = true;
	writer_step(wr);
}

static void writer_step(struct writer *wr)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
	char key[32], val[32];
	int r;

	if (wr->next == wr->total) {
		wr->done = true;
		return;
	}
	snprintf(key, sizeof(key), "/w/%05d", wr->next);
	snprintf(val, sizeof(val), "v%d", wr->next);
	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	req.value.data = (uint8_t *)val;
	req.value.len = strlen(val);
	r = efs_etcd_call(wr->c, EFS_ETCD_PUT, &req.base, NULL, writer_done, wr, NULL);
	if (r < 0) {
		wr->failures++;
		uv_timer_start(&wr->retry, writer_retry, 50, 0);
	}
}

static int member_of_url(const char *url)
{
	for (int i = 0; i < efs_harness_members(h); i++)
		if (strcmp(efs_harness_member_url(h, i), url) == 0)
			return i;
	return -1;
}

Test(watch, delivers_every_event_in_order_across_a_member_kill)
{
	struct efs_etcd *c, *wc;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec *r = rec_new("all");
	struct writer wr = {.total = 2000, .kill_at = 1000};
	struct efs_etcd_watch_stream_stats st;
	char others[512] = "";
	int victim;
	int64_t expect;

	start_cluster(3, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/w/", true, 0, r);
	wait_created(r);
	victim = member_of_url(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_BULK));
	cr_assert(victim >= 0, "channel endpoint %s is no member",
		  efs_etcd_channel_endpoint(c, EFS_ETCD_CH_BULK));
	for (int i = 0; i < 3; i++) {
		if (i == victim)
			continue;
		if (others[0])
			strcat(others, ",");
		strcat(others, efs_harness_member_url(h, i));
	}
	wc = efs_test_client_new(others);
	wr.c = wc;
	uv_timer_init(&efs_test_loop, &wr.retry);
	wr.retry.data = &wr;
	writer_step(&wr);
	cr_assert(efs_test_run_until(&wr.kill_now, 60000), "writer stuck at %d", wr.next);
	cr_assert_eq(efs_harness_kill(h, victim), 0);
	cr_assert(efs_test_run_until(&wr.done, 60000), "writer stuck at %d after the kill",
		  wr.next);
	wait_rev(w, wr.last_rev, 30000);

	/* Only the writer writes: the watcher must have seen every revision
	 * from its creation to the last put exactly once, in order. */
	cr_assert_eq(r->ended, false, "watcher ended: %d %s", r->end_status, r->reason);
	cr_assert_eq(r->bad_order, false);
	expect = r->created_rev + 1;
	cr_assert_eq((int64_t)r->n, wr.last_rev - r->created_rev,
		     "%zu events for revisions %" PRId64 "..%" PRId64, r->n, expect, wr.last_rev);
	for (size_t i = 0; i < r->n; i++)
		cr_assert_eq(r->ev[i].rev, expect + (int64_t)i, "event %zu has revision %" PRId64
			     ", expected %" PRId64, i, r->ev[i].rev, expect + (int64_t)i);
	/* Every key was written at least once (retries may write twice). */
	for (int k = 0, i = 0; k < wr.total; k++) {
		char key[32];

		snprintf(key, sizeof(key), "/w/%05d", k);
		while (i < (int)r->n && strcmp(r->ev[i].key, key) != 0)
			i++;
		cr_assert_lt(i, (int)r->n, "key %s never seen in order", key);
	}
	efs_etcd_watch_stream_get_stats(ws, &st);
	cr_assert_geq(st.opens, 2, "the stream was not reopened (opens %" PRIu64 ")", st.opens);

	uv_close((uv_handle_t *)&wr.retry, NULL);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(wc);
	efs_test_client_free(c);
	free(r);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, many_watchers_on_one_stream_and_on_two_streams)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws1, *ws2;
	struct efs_etcd_watcher *wa, *wb, *wa2;
	struct rec *ra = rec_new("a"), *rb = rec_new("b"), *ra2 = rec_new("a2");
	int64_t last;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws1, c, EFS_ETCD_CH_PRIO), 0);
	cr_assert_eq(efs_etcd_watch_stream_new(&ws2, c, EFS_ETCD_CH_BULK), 0);
	wa = watch(ws1, "/a/", true, 0, ra);
	wb = watch(ws1, "/b/k", false, 0, rb);
	wa2 = watch(ws2, "/a/", true, 0, ra2);
	cr_assert_neq(efs_etcd_watcher_id(wa), 0);
	cr_assert_neq(efs_etcd_watcher_id(wa), efs_etcd_watcher_id(wb));
	wait_created(ra);
	wait_created(rb);
	wait_created(ra2);
	put(c, "/a/1", "x1");
	put(c, "/b/k", "y");
	put(c, "/b/other", "z");
	put(c, "/c", "q");
	last = put(c, "/a/2", "x2");
	wait_rev(wa, last, 10000);
	wait_rev(wa2, last, 10000);
	/* wb sees nothing at |last|: make it advance with its own key. */
	last = put(c, "/b/k", "y2");
	wait_rev(wb, last, 10000);

	cr_assert_eq(ra->n, 2);
	cr_assert_str_eq(ra->ev[0].key, "/a/1");
	cr_assert_str_eq(ra->ev[1].key, "/a/2");
	cr_assert_eq(ra2->n, 2);
	cr_assert_str_eq(ra2->ev[0].key, "/a/1");
	cr_assert_str_eq(ra2->ev[1].key, "/a/2");
	cr_assert_eq(rb->n, 2);
	cr_assert_str_eq(rb->ev[0].key, "/b/k");
	cr_assert_str_eq(rb->ev[0].val, "y");
	cr_assert_str_eq(rb->ev[1].val, "y2");

	efs_etcd_watcher_free(wa);
	efs_etcd_watcher_free(wb);
	efs_etcd_watcher_free(wa2);
	efs_etcd_watch_stream_free(ws1);
	efs_etcd_watch_stream_free(ws2);
	efs_test_client_free(c);
	free(ra);
	free(rb);
	free(ra2);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, start_revision_replays_history_and_prev_kv_carries_old_values)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w, *wp;
	struct rec *r = rec_new("replay"), *rp = rec_new("prev");
	struct efs_etcd_watch_opts o = {.key = "/k", .key_len = 2, .prev_kv = true};
	int64_t r1, r3;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	r1 = put(c, "/k", "one");
	put(c, "/other", "x");
	put(c, "/k", "two");
	r3 = put(c, "/k", "three");
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/k", false, r1, r);
	wait_rev(w, r3, 10000);
	cr_assert_eq(r->n, 3);
	cr_assert_str_eq(r->ev[0].val, "one");
	cr_assert_eq(r->ev[0].rev, r1);
	cr_assert_str_eq(r->ev[1].val, "two");
	cr_assert_str_eq(r->ev[2].val, "three");
	cr_assert_eq(r->ev[2].rev, r3);
	cr_assert_eq(r->ev[0].has_prev, false);

	cr_assert_eq(efs_etcd_watcher_new(&wp, ws, &o, rec_cb, rp), 0);
	wait_created(rp);
	r3 = put(c, "/k", "four");
	wait_rev(wp, r3, 10000);
	cr_assert_eq(rp->n, 1);
	cr_assert(rp->ev[0].has_prev);
	cr_assert_str_eq(rp->ev[0].prev, "three");
	cr_assert_str_eq(rp->ev[0].val, "four");

	efs_etcd_watcher_free(w);
	efs_etcd_watcher_free(wp);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	free(rp);
	teardown();
	efs_test_assert_no_leaks();
}

static int64_t del(struct efs_etcd *c, const char *key)
{
	Etcdserverpb__DeleteRangeRequest req = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	struct call_res cr = {0};

	req.key.data = (uint8_t *)key;
	req.key.len = strlen(key);
	cr_assert_eq(efs_etcd_call(c, EFS_ETCD_DELETE_RANGE, &req.base, NULL, call_done, &cr, NULL),
		     0);
	cr_assert(efs_test_run_until(&cr.done, 15000));
	cr_assert_eq(cr.err, 0, "delete %s: %d", key, cr.err);
	return cr.rev;
}

Test(watch, filters_drop_puts_or_deletes)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *wnp, *wnd;
	struct rec *rnp = rec_new("noput"), *rnd = rec_new("nodelete");
	struct efs_etcd_watch_opts o = {.key = "/f/", .key_len = 3, .prefix = true};
	int64_t last;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	o.no_put = true;
	cr_assert_eq(efs_etcd_watcher_new(&wnp, ws, &o, rec_cb, rnp), 0);
	o.no_put = false;
	o.no_delete = true;
	cr_assert_eq(efs_etcd_watcher_new(&wnd, ws, &o, rec_cb, rnd), 0);
	cr_assert_eq(efs_etcd_watch_barrier(wnp, "/f/x", 4, wait_done, NULL), -EINVAL);
	wait_created(rnp);
	wait_created(rnd);
	put(c, "/f/1", "a");
	put(c, "/f/2", "b");
	del(c, "/f/1");
	last = put(c, "/f/3", "c");
	wait_rev(wnd, last, 10000);
	last = del(c, "/f/2");
	wait_rev(wnp, last, 10000);
	cr_assert_eq(rnd->n, 3);
	for (size_t i = 0; i < rnd->n; i++)
		cr_assert_eq(rnd->ev[i].type, MVCCPB__EVENT__EVENT_TYPE__PUT);
	cr_assert_eq(rnp->n, 2);
	cr_assert_eq(rnp->ev[0].type, MVCCPB__EVENT__EVENT_TYPE__DELETE);
	cr_assert_str_eq(rnp->ev[0].key, "/f/1");
	cr_assert_str_eq(rnp->ev[1].key, "/f/2");
	efs_etcd_watcher_free(wnp);
	efs_etcd_watcher_free(wnd);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(rnp);
	free(rnd);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, a_txn_larger_than_a_fragment_arrives_whole)
{
	enum { NKEYS = 100, VLEN = 12000 };
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec *r = rec_new("frag");
	struct efs_etcd_watch_opts o = {.key = "/f/", .key_len = 3, .prefix = true,
					.prev_kv = true};
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__RequestOp ops[NKEYS], *opp[NKEYS];
	Etcdserverpb__PutRequest puts[NKEYS];
	char keys[NKEYS][16];
	struct efs_etcd_watch_stream_stats st;
	struct call_res cr = {0};
	char *val = malloc(VLEN);

	cr_assert_not_null(val);
	memset(val, 'a', VLEN);
	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	for (int i = 0; i < NKEYS; i++) {
		struct call_res pc;

		snprintf(keys[i], sizeof(keys[i]), "/f/%03d", i);
		cr_assert_eq(put_async(c, keys[i], val, VLEN, &pc), 0);
		cr_assert(efs_test_run_until(&pc.done, 15000));
		cr_assert_eq(pc.err, 0);
	}
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	cr_assert_eq(efs_etcd_watcher_new(&w, ws, &o, rec_cb, r), 0);
	wait_created(r);
	/* One revision whose response (values plus previous values) exceeds
	 * etcd's 1.5 MiB fragment size. */
	memset(val, 'b', VLEN);
	for (int i = 0; i < NKEYS; i++) {
		etcdserverpb__put_request__init(&puts[i]);
		puts[i].key.data = (uint8_t *)keys[i];
		puts[i].key.len = strlen(keys[i]);
		puts[i].value.data = (uint8_t *)val;
		puts[i].value.len = VLEN;
		etcdserverpb__request_op__init(&ops[i]);
		ops[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
		ops[i].request_put = &puts[i];
		opp[i] = &ops[i];
	}
	txn.n_success = NKEYS;
	txn.success = opp;
	cr_assert_eq(efs_etcd_call(c, EFS_ETCD_TXN, &txn.base, NULL, call_done, &cr, NULL), 0);
	cr_assert(efs_test_run_until(&cr.done, 15000));
	cr_assert_eq(cr.err, 0, "txn: %d", cr.err);
	wait_rev(w, cr.rev, 15000);
	efs_etcd_watch_stream_get_stats(ws, &st);
	cr_assert_gt(st.fragments, 0, "etcd did not fragment the response");
	cr_assert_eq(r->updates, 1, "%zu updates for one revision", r->updates);
	cr_assert_eq(r->n, NKEYS);
	for (int i = 0; i < NKEYS; i++) {
		cr_assert_eq(r->ev[i].rev, cr.rev);
		cr_assert_eq(r->ev[i].vlen, VLEN);
		cr_assert_eq(r->ev[i].val[0], 'b');
		cr_assert(r->ev[i].has_prev);
		cr_assert_eq(r->ev[i].prev[0], 'a');
	}
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	free(val);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, a_compacted_start_revision_is_reported_as_compacted)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec *r = rec_new("compacted");
	int64_t r1, r3;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	r1 = put(c, "/k", "1");
	put(c, "/k", "2");
	r3 = put(c, "/k", "3");
	compact(c, r3);
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/k", false, r1, r);
	cr_assert(efs_test_run_until(&r->ended, 10000));
	cr_assert_eq(r->end_kind, EFS_ETCD_WATCH_COMPACTED);
	cr_assert_eq(r->end_status, EFS_ETCD_ECOMPACTED);
	cr_assert_eq(r->compact_rev, r3);
	cr_assert_eq(r->n, 0);
	cr_assert_eq(efs_etcd_watch_wait_rev(w, r3, wait_done, NULL), -ECANCELED);
	/* The stream itself goes on serving other watchers. */
	efs_etcd_watcher_free(w);
	memset(r, 0, sizeof(*r));
	w = watch(ws, "/k", false, 0, r);
	wait_created(r);
	r3 = put(c, "/k", "4");
	wait_rev(w, r3, 10000);
	cr_assert_eq(r->n, 1);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, cancel_is_confirmed_and_nothing_follows)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w, *w2;
	struct rec *r = rec_new("cancel"), *r2 = rec_new("other");
	int64_t rev;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/k", false, 0, r);
	w2 = watch(ws, "/k", false, 0, r2);
	wait_created(r);
	wait_created(r2);
	put(c, "/k", "1");
	cr_assert_eq(efs_etcd_watcher_cancel(w), 0);
	cr_assert_eq(efs_etcd_watcher_cancel(w), -EALREADY);
	cr_assert(efs_test_run_until(&r->ended, 10000));
	cr_assert_eq(r->end_kind, EFS_ETCD_WATCH_CANCELED);
	cr_assert_eq(r->end_status, 0);
	rev = put(c, "/k", "2");
	wait_rev(w2, rev, 10000);
	cr_assert_eq(r2->n, 2);
	cr_assert_leq(r->n, 1);
	cr_assert_eq(r->after_end, false);
	efs_etcd_watcher_free(w);
	efs_etcd_watcher_free(w2);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	free(r2);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, an_empty_range_is_refused_at_creation)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w, *ok;
	struct rec *r = rec_new("empty"), *rok = rec_new("ok");
	struct efs_etcd_watch_opts o = {.key = "/z", .key_len = 2, .range_end = "/a",
					.range_end_len = 2};

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	cr_assert_eq(efs_etcd_watcher_new(&w, ws, &o, rec_cb, r), 0);
	ok = watch(ws, "/k", false, 0, rok);
	cr_assert(efs_test_run_until(&r->ended, 10000));
	cr_assert_eq(r->created, false);
	cr_assert_eq(r->end_kind, EFS_ETCD_WATCH_CANCELED);
	cr_assert_eq(r->end_status, -EINVAL, "status %d (%s)", r->end_status, r->reason);
	wait_created(rok);
	efs_etcd_watcher_free(w);
	efs_etcd_watcher_free(ok);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	free(rok);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, permission_denied_is_reported_at_creation)
{
	struct efs_harness_opts ho = {.members = 1, .auth = true, .user = "u",
				      .user_prefix = "/mine/"};
	struct efs_etcd_opts co = {0};
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w, *ok;
	struct rec *r = rec_new("denied"), *rok = rec_new("allowed");
	int64_t rev;

	start_cluster(1, &ho);
	co.endpoints = efs_harness_endpoints(h);
	co.user = efs_harness_user(h);
	co.password = efs_harness_user_password(h);
	cr_assert_eq(efs_etcd_new(&c, &efs_test_loop, &co), 0);
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/theirs/", true, 0, r);
	ok = watch(ws, "/mine/", true, 0, rok);
	cr_assert(efs_test_run_until(&r->ended, 10000));
	cr_assert_eq(r->end_kind, EFS_ETCD_WATCH_CANCELED);
	cr_assert_eq(r->end_status, -EPERM, "status %d (%s)", r->end_status, r->reason);
	wait_created(rok);
	rev = put(c, "/mine/x", "1");
	wait_rev(ok, rev, 10000);
	cr_assert_eq(rok->n, 1);
	efs_etcd_watcher_free(w);
	efs_etcd_watcher_free(ok);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	free(rok);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, barrier_and_wait_rev_mean_everything_before_was_delivered)
{
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec *r = rec_new("barrier");
	struct call_res cr[10];
	struct wait_res b = {.r = r}, early = {.r = r}, now = {0};
	int64_t rev;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/s/", true, 0, r);
	wait_created(r);
	for (int i = 0; i < 10; i++) {
		char key[16];

		snprintf(key, sizeof(key), "/s/%d", i);
		cr_assert_eq(put_async(c, key, "v", 1, &cr[i]), 0);
	}
	for (int i = 0; i < 10; i++) {
		cr_assert(efs_test_run_until(&cr[i].done, 15000));
		cr_assert_eq(cr[i].err, 0);
	}
	/* All ten are committed; the watcher may not have delivered them. */
	cr_assert_eq(efs_etcd_watch_barrier(w, "/s/~sentinel", 12, wait_done, &b), 0);
	cr_assert(efs_test_run_until(&b.done, 15000), "barrier did not complete");
	cr_assert_eq(b.status, 0);
	cr_assert_eq(b.w, w);
	cr_assert_eq(b.n_at_done, 11, "%zu events delivered at the barrier", b.n_at_done);
	cr_assert_str_eq(r->ev[10].key, "/s/~sentinel");

	/* A revision already delivered completes, but not inline. */
	cr_assert_eq(efs_etcd_watch_wait_rev(w, r->ev[3].rev, wait_done, &now), 0);
	cr_assert_eq(now.done, false);
	cr_assert(efs_test_run_until(&now.done, 5000));
	cr_assert_eq(now.status, 0);
	/* A future revision completes once its event is delivered. */
	rev = r->ev[10].rev;
	cr_assert_eq(efs_etcd_watch_wait_rev(w, rev + 2, wait_done, &early), 0);
	put(c, "/s/a", "1");
	efs_test_run_for(300);
	cr_assert_eq(early.done, false, "wait_rev completed before its revision");
	put(c, "/s/b", "2");
	cr_assert(efs_test_run_until(&early.done, 10000));
	cr_assert_eq(early.status, 0);
	cr_assert_eq(early.n_at_done, 13);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, the_delay_fault_delays_delivery_but_loses_nothing)
{
	enum { N = 50 };
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec *r = rec_new("delay");
	int64_t first = 0, last = 0;
	uint64_t t_put;

	start_cluster(1, NULL);
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w = watch(ws, "/d/", true, 0, r);
	wait_created(r);
	efs_etcd_watch_stream_fault_delay(ws, 1500);
	t_put = efs_clock_mono_ns();
	for (int i = 0; i < N; i++) {
		char key[16];

		snprintf(key, sizeof(key), "/d/%02d", i);
		last = put(c, key, "v");
		if (!first)
			first = last;
	}
	/* Generous: the event of the first put must not be delivered within
	 * half the delay after that put was sent. */
	if (efs_clock_mono_ns() - t_put < 750 * EFS_NSEC_PER_MSEC)
		efs_test_run_for(750 - (efs_clock_mono_ns() - t_put) / EFS_NSEC_PER_MSEC);
	cr_assert_eq(r->n, 0, "events delivered despite the delay");
	wait_rev(w, last, 15000);
	cr_assert_geq(r->first_ev_ns - t_put, 1500 * EFS_NSEC_PER_MSEC - 50 * EFS_NSEC_PER_MSEC);
	efs_etcd_watch_stream_fault_delay(ws, 0);
	last = put(c, "/d/after", "v");
	wait_rev(w, last, 10000);
	cr_assert_eq(r->n, N + 1);
	for (int i = 0; i < N + 1; i++)
		cr_assert_eq(r->ev[i].rev, first + i);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r);
	teardown();
	efs_test_assert_no_leaks();
}

/*
 * etcd 3.4.23 checks a watch stream's token at each create, and answers an
 * expired simple token with "permission denied" like a real denial. A
 * watcher created long after the stream opened must still work.
 */
Test(watch, a_watcher_created_after_the_token_expired_is_not_denied)
{
	struct efs_harness_opts ho = {.members = 1, .auth = true, .user = "u",
				      .user_prefix = "/mine/", .auth_token_ttl_s = 2};
	struct efs_etcd_opts co = {0};
	struct efs_etcd *c;
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w1, *w2, *denied;
	struct rec *r1 = rec_new("first"), *r2 = rec_new("late"), *rd = rec_new("denied");
	struct efs_etcd_watch_stream_stats st;
	int64_t rev;

	start_cluster(1, &ho);
	co.endpoints = efs_harness_endpoints(h);
	co.user = efs_harness_user(h);
	co.password = efs_harness_user_password(h);
	cr_assert_eq(efs_etcd_new(&c, &efs_test_loop, &co), 0);
	cr_assert_eq(efs_etcd_watch_stream_new(&ws, c, EFS_ETCD_CH_BULK), 0);
	w1 = watch(ws, "/mine/a/", true, 0, r1);
	wait_created(r1);
	/* Idle past the token TTL (etcd's token sweep runs every second). */
	efs_test_run_for(4500);
	w2 = watch(ws, "/mine/b/", true, 0, r2);
	denied = watch(ws, "/theirs/", true, 0, rd);
	cr_assert(efs_test_run_until(&r2->created, 15000) || r2->ended, "late watcher not created");
	cr_assert_eq(r2->ended, false, "late watcher ended: %d %s", r2->end_status, r2->reason);
	/* It took a new stream with a renewed token. */
	efs_etcd_watch_stream_get_stats(ws, &st);
	cr_assert_geq(st.opens, 2);
	cr_assert(efs_test_run_until(&rd->ended, 15000));
	cr_assert_eq(rd->end_status, -EPERM, "status %d (%s)", rd->end_status, rd->reason);
	rev = put(c, "/mine/a/x", "1");
	put(c, "/mine/b/x", "1");
	wait_rev(w1, rev, 10000);
	wait_rev(w2, rev + 1, 10000);
	cr_assert_eq(r1->n, 1);
	cr_assert_eq(r2->n, 1);
	efs_etcd_watcher_free(w1);
	efs_etcd_watcher_free(w2);
	efs_etcd_watcher_free(denied);
	efs_etcd_watch_stream_free(ws);
	efs_test_client_free(c);
	free(r1);
	free(r2);
	free(rd);
	teardown();
	efs_test_assert_no_leaks();
}
