/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lease.c's keepalive machine against a fake transport: this file defines
 * the efs_etcd_* stream and call functions lease.c uses, so the linker takes
 * these instead of client.c (which nothing here pulls in). The tests play
 * etcd with millisecond-scale thresholds on the real clock; every wait is
 * bounded and generous.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/lease.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"

/* ---- The fake transport ---- */

#define MAX_SENT    256
#define MAX_STREAMS 16
#define MAX_CALLS   64

struct efs_etcd {
	uv_loop_t *loop;
	unsigned failovers[EFS_ETCD_NCHANNELS];
};

struct efs_etcd_stream {
	enum efs_etcd_stream_kind kind;
	enum efs_etcd_channel channel;
	efs_etcd_stream_msg_cb msg_cb;
	efs_etcd_stream_close_cb close_cb;
	void *arg;
	bool closed;
	size_t n_sent;
	int64_t sent_id[MAX_SENT];
	uint64_t sent_ns[MAX_SENT];
};

static struct efs_etcd_stream *streams[MAX_STREAMS];
static size_t n_streams;
static uv_loop_t loop;
static struct efs_etcd client = {.loop = &loop};

uv_loop_t *efs_etcd_loop(const struct efs_etcd *c)
{
	return c->loop;
}

int efs_etcd_stream_open(struct efs_etcd *c, enum efs_etcd_stream_kind kind,
			 enum efs_etcd_channel channel, efs_etcd_stream_msg_cb msg_cb,
			 efs_etcd_stream_close_cb close_cb, void *arg,
			 struct efs_etcd_stream **ret)
{
	struct efs_etcd_stream *s;

	(void)c;
	if (n_streams == MAX_STREAMS)
		return -ENOMEM;
	s = calloc(1, sizeof(*s));
	s->kind = kind;
	s->channel = channel;
	s->msg_cb = msg_cb;
	s->close_cb = close_cb;
	s->arg = arg;
	streams[n_streams++] = s;
	*ret = s;
	return 0;
}

int efs_etcd_stream_send(struct efs_etcd_stream *s, const ProtobufCMessage *msg)
{
	const Etcdserverpb__LeaseKeepAliveRequest *req = (const void *)msg;

	cr_assert_eq(msg->descriptor, &etcdserverpb__lease_keep_alive_request__descriptor);
	cr_assert_not(s->closed, "send on a closed stream");
	if (s->n_sent == MAX_SENT)
		return -ENOMEM;
	s->sent_id[s->n_sent] = req->id;
	s->sent_ns[s->n_sent++] = efs_clock_mono_ns();
	return 0;
}

void efs_etcd_stream_close(struct efs_etcd_stream *s)
{
	s->closed = true;
}

uint64_t efs_etcd_stream_last_send_ns(const struct efs_etcd_stream *s)
{
	return s->n_sent ? s->sent_ns[s->n_sent - 1] : 0;
}

void efs_etcd_channel_failover(struct efs_etcd *c, enum efs_etcd_channel channel)
{
	c->failovers[channel]++;
}

struct fake_call {
	enum efs_etcd_method method;
	int64_t id;
	efs_etcd_call_cb cb;
	void *arg;
	bool done;
};
static struct fake_call calls[MAX_CALLS];
static size_t n_calls;

int efs_etcd_call(struct efs_etcd *c, enum efs_etcd_method method, const ProtobufCMessage *req,
		  const struct efs_etcd_callopts *co, efs_etcd_call_cb cb, void *arg,
		  struct efs_etcd_call **ret_call)
{
	(void)c;
	(void)co;
	if (n_calls == MAX_CALLS)
		return -ENOMEM;
	cr_assert_eq(method, EFS_ETCD_LEASE_TIME_TO_LIVE);
	calls[n_calls].method = method;
	calls[n_calls].id = ((const Etcdserverpb__LeaseTimeToLiveRequest *)(const void *)req)->id;
	calls[n_calls].cb = cb;
	calls[n_calls].arg = arg;
	if (ret_call)
		*ret_call = (struct efs_etcd_call *)&calls[n_calls];
	n_calls++;
	return 0;
}

static void complete_ttl(struct fake_call *fc, int err, int64_t ttl)
{
	Etcdserverpb__LeaseTimeToLiveResponse resp;
	struct efs_etcd_result r = {.err = err, .grpc_status = err ? -1 : 0, .message = ""};

	etcdserverpb__lease_time_to_live_response__init(&resp);
	resp.id = fc->id;
	resp.ttl = ttl;
	r.resp = err ? NULL : &resp.base;
	fc->done = true;
	fc->cb(&r, fc->arg);
}

/* A real cancel completes later; here at once, which lease.c must bear. */
void efs_etcd_call_cancel(struct efs_etcd_call *call)
{
	struct fake_call *fc = (struct fake_call *)call;

	if (!fc->done)
		complete_ttl(fc, -ECANCELED, 0);
}

/* ---- Helpers ---- */

static uv_timer_t ticker;

static void on_tick(uv_timer_t *t)
{
	(void)t;
}

static bool loop_open;

static void setup(void)
{
	cr_assert_eq(uv_loop_init(&loop), 0);
	loop_open = true;
	uv_timer_init(&loop, &ticker);
	uv_timer_start(&ticker, on_tick, 1, 1);
}

/*
 * Closes the loop and frees the fake streams. Each test calls it before its
 * leak check, and .fini again for a test that failed first: the second call
 * does nothing.
 */
static void teardown(void)
{
	if (loop_open) {
		uv_close((uv_handle_t *)&ticker, NULL);
		uv_run(&loop, UV_RUN_DEFAULT);
		cr_expect_eq(uv_loop_close(&loop), 0);
		loop_open = false;
	}
	for (size_t i = 0; i < n_streams; i++)
		free(streams[i]);
	n_streams = 0;
}

static uint64_t now_ms(void)
{
	return efs_clock_mono_ns() / EFS_NSEC_PER_MSEC;
}

/* Runs the loop until |cond| holds, at most 3 s. */
#define RUN_UNTIL(cond)                                                                    \
	do {                                                                               \
		uint64_t end_ = now_ms() + 3000;                                          \
		while (!(cond) && now_ms() < end_)                                         \
			uv_run(&loop, UV_RUN_ONCE);                                        \
		cr_assert(cond, "timed out waiting for " #cond);                           \
	} while (0)

static struct efs_etcd_stream *find_stream(enum efs_etcd_channel ch, size_t nth)
{
	for (size_t i = 0; i < n_streams; i++)
		if (streams[i]->channel == ch &&
		    streams[i]->kind == EFS_ETCD_STREAM_LEASE_KEEPALIVE && nth-- == 0)
			return streams[i];
	return NULL;
}

static void reply(struct efs_etcd_stream *s, int64_t id, int64_t ttl)
{
	Etcdserverpb__LeaseKeepAliveResponse resp = ETCDSERVERPB__LEASE_KEEP_ALIVE_RESPONSE__INIT;

	resp.id = id;
	resp.ttl = ttl;
	s->msg_cb(s, &resp.base, s->arg);
}

struct lrec {
	char order[32];
	uint64_t at[32];
	int status[32];
	bool free_on_gone;
};

static void lrec_cb(struct efs_etcd_lease *l, int status, enum efs_etcd_lease_event ev,
		    uint64_t at_ns, void *arg)
{
	struct lrec *r = arg;
	size_t n = strlen(r->order);

	cr_assert_lt(n, 31);
	if (ev == EFS_ETCD_LEASE_AT_RISK)
		r->order[n] = 'R';
	else if (ev == EFS_ETCD_LEASE_RECOVERED)
		r->order[n] = 'O';
	else
		r->order[n] = 'G';
	r->at[n] = at_ns;
	r->status[n] = status;
	if (ev == EFS_ETCD_LEASE_GONE && r->free_on_gone)
		efs_etcd_lease_free(l);
}

/* TTL 1 s, renewals every 20 ms, the thresholds |failover_ms| and
 * |at_risk_ms| (tens of ms where a test waits for them, seconds where a
 * slow machine must not reach them). */
static struct efs_etcd_lease *new_lease_t(struct efs_etcd_keepalive *ka, int64_t id,
					  uint64_t granted, struct lrec *r, uint32_t failover_ms,
					  uint32_t at_risk_ms)
{
	struct efs_etcd_lease_opts o = {
		.id = id, .ttl_s = 1, .granted_ns = granted,
		.interval_ms = 20, .failover_ms = failover_ms, .at_risk_ms = at_risk_ms,
	};
	struct efs_etcd_lease *l;

	cr_assert_eq(efs_etcd_lease_new(&l, ka, &o, lrec_cb, r), 0);
	return l;
}

static struct efs_etcd_lease *new_lease(struct efs_etcd_keepalive *ka, int64_t id,
					uint64_t granted, struct lrec *r)
{
	return new_lease_t(ka, id, granted, r, 60, 120);
}

static struct efs_etcd_lease *new_calm_lease(struct efs_etcd_keepalive *ka, int64_t id,
					     uint64_t granted, struct lrec *r)
{
	return new_lease_t(ka, id, granted, r, 5000, 9000);
}

TestSuite(lease, .init = setup, .fini = teardown, .timeout = 20);

Test(lease, a_reply_acknowledges_the_oldest_outstanding_renewal)
{
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_stream *s;
	struct lrec r = {0};
	uint64_t granted = efs_clock_mono_ns();

	cr_assert_eq(efs_etcd_keepalive_new(&ka, &client), 0);
	l = new_calm_lease(ka, 7, granted, &r);
	cr_assert_eq(n_streams, 0, "opened inline");
	cr_assert_eq(efs_etcd_lease_last_ack_send_ns(l), granted);
	RUN_UNTIL((s = find_stream(EFS_ETCD_CH_PRIO, 0)) && s->n_sent >= 3);
	cr_assert_eq(s->sent_id[0], 7);
	/* The first reply is for the first renewal: its time is when the
	 * renewal was queued, never later than the send the fake saw. */
	reply(s, 7, 9);
	cr_assert_leq(efs_etcd_lease_last_ack_send_ns(l), s->sent_ns[0]);
	cr_assert_gt(efs_etcd_lease_last_ack_send_ns(l), granted);
	cr_assert_eq(efs_etcd_lease_ttl(l), 9);
	cr_assert_eq(efs_etcd_lease_deadline_ns(l),
		     efs_etcd_lease_last_ack_send_ns(l) + 9 * EFS_NSEC_PER_SEC);
	reply(s, 7, 9);
	cr_assert_gt(efs_etcd_lease_last_ack_send_ns(l), s->sent_ns[0]);
	cr_assert_leq(efs_etcd_lease_last_ack_send_ns(l), s->sent_ns[1]);
	/* A reply for an unknown lease changes nothing. */
	reply(s, 8, 9);
	cr_assert_leq(efs_etcd_lease_last_ack_send_ns(l), s->sent_ns[1]);
	cr_assert_str_eq(r.order, "");
	efs_etcd_keepalive_free(ka);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, without_acks_it_renews_via_bulk_goes_at_risk_and_recovers)
{
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_stream *prio, *bulk;
	struct efs_etcd_lease_stats st;
	struct lrec r = {0};
	uint64_t granted = efs_clock_mono_ns();

	cr_assert_eq(efs_etcd_keepalive_new(&ka, &client), 0);
	l = new_lease(ka, 7, granted, &r);
	RUN_UNTIL((bulk = find_stream(EFS_ETCD_CH_BULK, 0)) && bulk->n_sent >= 1);
	prio = find_stream(EFS_ETCD_CH_PRIO, 0);
	cr_assert_not_null(prio);
	/* Not before failover_ms without an ack. */
	cr_assert_geq(bulk->sent_ns[0], granted + 60 * EFS_NSEC_PER_MSEC);
	cr_assert_str_eq(r.order, "");
	RUN_UNTIL(r.order[0] == 'R');
	cr_assert_eq(r.at[0], granted + 120 * EFS_NSEC_PER_MSEC);
	cr_assert_eq(r.status[0], 0);
	cr_assert(efs_etcd_lease_is_at_risk(l));
	/* At risk: etcd is asked whether the lease still exists. */
	RUN_UNTIL(n_calls >= 1);
	cr_assert_eq(calls[0].id, 7);
	complete_ttl(&calls[0], 0, 1);
	cr_assert_str_eq(r.order, "R");
	/* The bulk member answers the newest bulk renewal's predecessors in
	 * order; the first reply acknowledges the first bulk send. */
	reply(bulk, 7, 1);
	RUN_UNTIL(strlen(r.order) == 2);
	cr_assert_str_eq(r.order, "RO");
	cr_assert_leq(r.at[1], bulk->sent_ns[0]);
	cr_assert_not(efs_etcd_lease_is_at_risk(l));
	efs_etcd_lease_get_stats(l, &st);
	cr_assert_eq(st.acks_bulk, 1);
	cr_assert_eq(st.renewals_acked, 1);
	efs_etcd_keepalive_free(ka);
	/* The outstanding probe of a later at-risk phase, if any, was
	 * cancelled by the free. */
	for (size_t i = 0; i < n_calls; i++)
		cr_assert(calls[i].done || i == 0);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, the_priority_channel_fails_over_when_a_renewal_stays_unanswered)
{
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct lrec r = {0};

	cr_assert_eq(efs_etcd_keepalive_new(&ka, &client), 0);
	l = new_lease(ka, 7, efs_clock_mono_ns(), &r);
	RUN_UNTIL(client.failovers[EFS_ETCD_CH_PRIO] == 1);
	cr_assert_eq(client.failovers[EFS_ETCD_CH_BULK], 0);
	(void)l;
	efs_etcd_keepalive_free(ka);
	for (size_t i = 0; i < n_calls; i++)
		cr_assert(calls[i].done, "probe %zu left running", i);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, a_ttl_zero_reply_is_gone_and_renewing_stops)
{
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_stream *s;
	struct lrec r = {.free_on_gone = true};
	size_t sent;

	cr_assert_eq(efs_etcd_keepalive_new(&ka, &client), 0);
	l = new_calm_lease(ka, 7, efs_clock_mono_ns(), &r);
	RUN_UNTIL((s = find_stream(EFS_ETCD_CH_PRIO, 0)) && s->n_sent >= 1);
	reply(s, 7, 0);
	cr_assert_str_eq(r.order, "G");
	cr_assert_eq(r.status[0], -ENOENT);
	/* Freed from its own callback; nothing is sent for it any more. */
	(void)l;
	sent = s->n_sent;
	for (int i = 0; i < 10; i++)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(s->n_sent, sent);
	efs_etcd_keepalive_free(ka);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, time_to_live_minus_one_is_gone)
{
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct lrec r = {0};

	cr_assert_eq(efs_etcd_keepalive_new(&ka, &client), 0);
	l = new_lease(ka, 7, efs_clock_mono_ns(), &r);
	RUN_UNTIL(n_calls >= 1);
	cr_assert_str_eq(r.order, "R");
	complete_ttl(&calls[0], 0, -1);
	cr_assert_str_eq(r.order, "RG");
	cr_assert(efs_etcd_lease_is_gone(l));
	efs_etcd_lease_free(l);
	efs_etcd_keepalive_free(ka);
	teardown();
	efs_test_assert_no_leaks();
}

Test(lease, a_stream_that_ends_is_reopened_and_renewing_goes_on)
{
	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *l;
	struct efs_etcd_stream *s, *s2;
	struct efs_etcd_result res = {.err = -ENOTCONN, .grpc_status = -1, .message = "lost"};
	struct efs_etcd_lease_stats st;
	struct lrec r = {0};
	uint64_t acked;

	cr_assert_eq(efs_etcd_keepalive_new(&ka, &client), 0);
	l = new_calm_lease(ka, 7, efs_clock_mono_ns(), &r);
	RUN_UNTIL((s = find_stream(EFS_ETCD_CH_PRIO, 0)) && s->n_sent >= 2);
	reply(s, 7, 1);
	acked = efs_etcd_lease_last_ack_send_ns(l);
	s->closed = true;
	s->close_cb(s, &res, s->arg);
	RUN_UNTIL((s2 = find_stream(EFS_ETCD_CH_PRIO, 1)) && s2->n_sent >= 1);
	/* The renewal outstanding on the dead stream is forgotten: the
	 * next reply acknowledges the new stream's first renewal. */
	reply(s2, 7, 1);
	cr_assert_gt(efs_etcd_lease_last_ack_send_ns(l), acked);
	cr_assert_leq(efs_etcd_lease_last_ack_send_ns(l), s2->sent_ns[0]);
	cr_assert_gt(efs_etcd_lease_last_ack_send_ns(l), s->sent_ns[s->n_sent - 1]);
	efs_etcd_lease_get_stats(l, &st);
	cr_assert_eq(st.stream_reopens, 1);
	efs_etcd_keepalive_free(ka);
	teardown();
	efs_test_assert_no_leaks();
}
