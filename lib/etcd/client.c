/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/etcd.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>
#include <uv.h>

#include "config.h"
#include "etcd/client-int.h"
#include "etcd/conn.h"
#include "etcd/grpc.h"
#include "etcd/tls.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

#define DEFAULT_PORT "2379"
/* Calls kept for reuse, so that steady traffic allocates no call structs. */
#define CALL_POOL_MAX 1024
#define NO_HEAP       SIZE_MAX
/* Streams in flight per connection; more wait on the channel. etcd answers
 * "too many requests" once its apply lags commit by 5000 entries, and a
 * bounded window keeps a burst of calls from getting there. */
#define MAX_INFLIGHT 1024
/* A pooled call keeps its request buffer up to this size, so that steady
 * traffic of small requests frames them without a malloc. */
#define REQ_KEEP_MAX 4096

struct method_info {
	const char *name;
	const char *path;
	const ProtobufCMessageDescriptor *req;
	const ProtobufCMessageDescriptor *resp;
	/* Safe to resend after UNAVAILABLE or a lost connection. */
	bool idempotent;
	/* Changes state: a sent attempt that gets no answer leaves the outcome
	 * unknown. */
	bool mutation;
};

static const struct method_info methods[EFS_ETCD_NMETHODS] = {
	[EFS_ETCD_RANGE] = { "Range", "/etcdserverpb.KV/Range",
			     &etcdserverpb__range_request__descriptor,
			     &etcdserverpb__range_response__descriptor, true, false },
	[EFS_ETCD_PUT] = { "Put", "/etcdserverpb.KV/Put", &etcdserverpb__put_request__descriptor,
			   &etcdserverpb__put_response__descriptor, false, true },
	[EFS_ETCD_DELETE_RANGE] = { "DeleteRange", "/etcdserverpb.KV/DeleteRange",
				    &etcdserverpb__delete_range_request__descriptor,
				    &etcdserverpb__delete_range_response__descriptor, false, true },
	[EFS_ETCD_TXN] = { "Txn", "/etcdserverpb.KV/Txn", &etcdserverpb__txn_request__descriptor,
			   &etcdserverpb__txn_response__descriptor, false, true },
	[EFS_ETCD_COMPACT] = { "Compact", "/etcdserverpb.KV/Compact",
			       &etcdserverpb__compaction_request__descriptor,
			       &etcdserverpb__compaction_response__descriptor, false, true },
	/* LeaseGrant is decided per call: idempotent with our own id. */
	[EFS_ETCD_LEASE_GRANT] = { "LeaseGrant", "/etcdserverpb.Lease/LeaseGrant",
				   &etcdserverpb__lease_grant_request__descriptor,
				   &etcdserverpb__lease_grant_response__descriptor, false, true },
	[EFS_ETCD_LEASE_REVOKE] = { "LeaseRevoke", "/etcdserverpb.Lease/LeaseRevoke",
				    &etcdserverpb__lease_revoke_request__descriptor,
				    &etcdserverpb__lease_revoke_response__descriptor, true, false },
	[EFS_ETCD_LEASE_TIME_TO_LIVE] = { "LeaseTimeToLive", "/etcdserverpb.Lease/LeaseTimeToLive",
					  &etcdserverpb__lease_time_to_live_request__descriptor,
					  &etcdserverpb__lease_time_to_live_response__descriptor,
					  true, false },
	[EFS_ETCD_LEASE_LEASES] = { "LeaseLeases", "/etcdserverpb.Lease/LeaseLeases",
				    &etcdserverpb__lease_leases_request__descriptor,
				    &etcdserverpb__lease_leases_response__descriptor, true, false },
	[EFS_ETCD_STATUS] = { "Status", "/etcdserverpb.Maintenance/Status",
			      &etcdserverpb__status_request__descriptor,
			      &etcdserverpb__status_response__descriptor, true, false },
	[EFS_ETCD_MEMBER_LIST] = { "MemberList", "/etcdserverpb.Cluster/MemberList",
				   &etcdserverpb__member_list_request__descriptor,
				   &etcdserverpb__member_list_response__descriptor, true, false },
	[EFS_ETCD_AUTHENTICATE] = { "Authenticate", "/etcdserverpb.Auth/Authenticate",
				    &etcdserverpb__authenticate_request__descriptor,
				    &etcdserverpb__authenticate_response__descriptor, true, false },
};

static const struct {
	const char *path;
	const ProtobufCMessageDescriptor *req;
	const ProtobufCMessageDescriptor *resp;
} stream_kinds[] = {
	[EFS_ETCD_STREAM_WATCH] = { "/etcdserverpb.Watch/Watch",
				    &etcdserverpb__watch_request__descriptor,
				    &etcdserverpb__watch_response__descriptor },
	[EFS_ETCD_STREAM_LEASE_KEEPALIVE] = {
		"/etcdserverpb.Lease/LeaseKeepAlive",
		&etcdserverpb__lease_keep_alive_request__descriptor,
		&etcdserverpb__lease_keep_alive_response__descriptor,
	},
};

struct efs_etcd_call {
	struct efs_rpc rpc; /* first: conn.c hands us rpc pointers */
	struct efs_list done_link;
	struct efs_etcd *c;
	enum efs_etcd_method m;
	bool idempotent;
	bool mutation;
	bool no_retry;
	bool finished;     /* result decided, callback queued or run */
	/* The callback has returned. Not set while it runs: a connection
	 * failed under it (efs_etcd_free() or efs_etcd_channel_failover()
	 * from the callback) only detaches the call, and call_run_cb() frees
	 * it once the callback is done. */
	bool cb_ran;
	bool ever_sent;    /* some attempt's HEADERS went out */
	bool reauthed;     /* the one re-authentication retry is used */
	bool retry_pending;
	bool drop_reply;   /* fault hook armed for this call */
	bool internal_auth;
	struct efs_conn *auth_conn; /* internal Authenticate: its connection */
	uint8_t *req;
	size_t req_len, req_off, req_cap;
	uint32_t timeout_ms;
	uint64_t deadline_ns;
	uint64_t wake_ns;  /* heap key: retry time or deadline */
	size_t heap_idx;
	unsigned attempts;
	struct efs_backoff bo;
	ProtobufCMessage *resp;
	struct efs_etcd_result res;
	char timeout_hdr[16];
	char msg[EFS_GRPC_MESSAGE_MAX];
	efs_etcd_call_cb cb;
	void *arg;
	struct efs_etcd_call *pool_next; /* free list: a LIFO needs only one link */
};

struct sendq_item {
	struct efs_list link; /* in the stream's sendq */
	size_t len, off;
	uint8_t *buf;
};

struct efs_etcd_stream {
	struct efs_rpc rpc; /* first */
	struct efs_list done_link;
	struct efs_etcd *c;
	enum efs_etcd_stream_kind kind;
	efs_etcd_stream_msg_cb msg_cb;
	efs_etcd_stream_close_cb close_cb;
	void *arg;
	struct efs_list sendq; /* framed messages not yet handed to nghttp2 */
	uint64_t last_send_ns;
	bool finished; /* close queued */
	bool in_close_cb;
	/* Inside efs_grpc_reader_feed(), i.e. maybe inside msg_cb: the
	 * reader and the struct are in use, so a release is deferred. */
	bool in_feed;
	bool release_deferred;
	struct efs_etcd_result res;
	char msg[EFS_GRPC_MESSAGE_MAX];
};

struct channel {
	struct efs_etcd *c;
	int idx;
	size_t ep;            /* endpoint in use or next */
	struct efs_conn *conn; /* current connection, or NULL */
	struct efs_list waiting;
	unsigned fails;       /* connect failures since the last success */
	bool ever_connected;
	bool mem_peer;
	bool timer_armed;
	uv_timer_t timer; /* reconnect after backoff */
	struct efs_backoff bo;
	char last_err[256];
};

struct efs_etcd {
	uv_loop_t *loop;
	struct efs_endpoint *eps;
	size_t neps;
	char *server_name;
	char *user;
	char *password;
	uint32_t call_timeout_ms;
	uint32_t connect_timeout_ms;
	uint32_t ping_interval_ms;
	uint32_t ping_timeout_ms;
	uint32_t backoff_base_ms;
	uint32_t backoff_max_ms;
	size_t max_recv_msg;
	struct efs_tls_ctx *tls;

	struct channel ch[EFS_ETCD_NCHANNELS];
	struct efs_list conns;
	struct efs_list dirty;
	struct efs_list done;  /* calls and streams whose callback is due */

	uv_idle_t idle;   /* keeps the loop from blocking while work is queued */
	uv_check_t check; /* flushes after the poll phase */
	uv_timer_t timer; /* earliest call deadline or retry */
	uint64_t timer_at;
	bool idle_on;
	unsigned handles;

	struct efs_etcd_call **heap;
	size_t nheap, heapcap;

	struct efs_etcd_call *pool;
	unsigned npool;
	uint64_t nlive; /* calls and streams not yet completed */
	uint64_t seed;

	bool closing;
	bool handles_closing;
	void (*done_cb)(void *arg);
	void *done_arg;

	struct efs_etcd_stats stats;
	efs_etcd_call_observer observe;
	void *observe_arg;

	enum efs_etcd_method drop_method;
	unsigned drop_nth;
	uint32_t stall_ms;
	uint32_t watch_delay_ms; /* given to every watch stream opened later */

	uint8_t *cap;
	size_t caplen, capcap;
};

static void tick(struct efs_etcd *c);
static void on_idle(uv_idle_t *h);
static void channel_kick(struct channel *ch);
static void call_start_attempt(struct efs_etcd_call *call);
static void stream_finish(struct efs_etcd_stream *s, int err, int gs, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void maybe_destroy(struct efs_etcd *c);

/* ---- Small helpers ---- */

const char *efs_etcd_method_name(enum efs_etcd_method m)
{
	if ((unsigned)m >= EFS_ETCD_NMETHODS)
		return "?";
	return methods[m].name;
}

uv_loop_t *efs_etcd_loop(const struct efs_etcd *c)
{
	return c->loop;
}

uv_loop_t *efs_client_loop(const struct efs_etcd *c)
{
	return c->loop;
}

struct efs_etcd_stats *efs_client_stats(struct efs_etcd *c)
{
	return &c->stats;
}

const struct efs_endpoint *efs_client_endpoint(const struct efs_etcd *c, size_t ep)
{
	return &c->eps[ep];
}

struct efs_tls_ctx *efs_client_tls_ctx(const struct efs_etcd *c)
{
	return c->tls;
}

const char *efs_client_server_name(const struct efs_etcd *c, size_t ep)
{
	return c->server_name ? c->server_name : c->eps[ep].host;
}

uint32_t efs_client_ping_interval_ms(const struct efs_etcd *c)
{
	return c->ping_interval_ms;
}

uint32_t efs_client_ping_timeout_ms(const struct efs_etcd *c)
{
	return c->ping_timeout_ms;
}

uint32_t efs_client_connect_timeout_ms(const struct efs_etcd *c)
{
	return c->connect_timeout_ms;
}

void efs_etcd_get_stats(const struct efs_etcd *c, struct efs_etcd_stats *ret)
{
	*ret = c->stats;
}

void efs_etcd_set_call_observer(struct efs_etcd *c, efs_etcd_call_observer fn, void *arg)
{
	c->observe = fn;
	c->observe_arg = arg;
}

const char *efs_etcd_channel_endpoint(const struct efs_etcd *c, enum efs_etcd_channel ch)
{
	if ((unsigned)ch >= EFS_ETCD_NCHANNELS)
		return NULL;
	if (c->ch[ch].conn)
		return c->eps[c->ch[ch].conn->ep].url;
	return c->eps[c->ch[ch].ep].url;
}

static void wake(struct efs_etcd *c)
{
	if (c->idle_on)
		return;
	c->idle_on = true;
	uv_idle_start(&c->idle, on_idle);
}

void efs_client_mark_dirty(struct efs_etcd *c, struct efs_conn *conn)
{
	efs_list_add_tail(&c->dirty, &conn->dirty_link);
	wake(c);
}

void efs_client_mem_peer_write(struct efs_etcd *c, const uint8_t *data, size_t len)
{
	size_t ncap;
	uint8_t *n;

	if (c->caplen + len > c->capcap) {
		ncap = c->capcap ? c->capcap : 4096;
		while (ncap < c->caplen + len)
			ncap *= 2;
		/* Bound what a long fuzz run keeps: older bytes are dropped. */
		if (ncap > (1u << 20)) {
			c->caplen = 0;
			if (len > c->capcap)
				return;
			ncap = c->capcap;
		}
		if (ncap > c->capcap) {
			n = efs_mem_realloc(c->cap, ncap);
			if (!n)
				return;
			c->cap = n;
			c->capcap = ncap;
		}
	}
	memcpy(c->cap + c->caplen, data, len);
	c->caplen += len;
}

/* Live calls and streams keep the loop running through the sockets. */
static void live_inc(struct efs_etcd *c)
{
	struct efs_list *l;

	if (c->nlive++ != 0)
		return;
	efs_list_for_each(l, &c->conns)
		efs_conn_set_ref(efs_list_entry(l, struct efs_conn, link), true);
}

static void live_dec(struct efs_etcd *c)
{
	struct efs_list *l;

	if (--c->nlive != 0)
		return;
	efs_list_for_each(l, &c->conns)
		efs_conn_set_ref(efs_list_entry(l, struct efs_conn, link), false);
}

/* ---- Deadline heap ---- */

static bool heap_less(struct efs_etcd_call *a, struct efs_etcd_call *b)
{
	return a->wake_ns < b->wake_ns;
}

static void heap_set(struct efs_etcd *c, size_t i, struct efs_etcd_call *call)
{
	c->heap[i] = call;
	call->heap_idx = i;
}

static void heap_up(struct efs_etcd *c, size_t i)
{
	struct efs_etcd_call *call = c->heap[i];

	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (!heap_less(call, c->heap[p]))
			break;
		heap_set(c, i, c->heap[p]);
		i = p;
	}
	heap_set(c, i, call);
}

static void heap_down(struct efs_etcd *c, size_t i)
{
	struct efs_etcd_call *call = c->heap[i];

	for (;;) {
		size_t l = 2 * i + 1, m = i;
		struct efs_etcd_call *best = call;

		if (l < c->nheap && heap_less(c->heap[l], best)) {
			m = l;
			best = c->heap[l];
		}
		if (l + 1 < c->nheap && heap_less(c->heap[l + 1], best))
			m = l + 1;
		if (m == i)
			break;
		heap_set(c, i, c->heap[m]);
		i = m;
	}
	heap_set(c, i, call);
}

static void on_timer(uv_timer_t *t);

static void arm_timer(struct efs_etcd *c)
{
	uint64_t now, at, ms;

	if (!c->nheap) {
		if (c->timer_at) {
			uv_timer_stop(&c->timer);
			c->timer_at = 0;
		}
		return;
	}
	at = c->heap[0]->wake_ns;
	if (c->timer_at && c->timer_at <= at)
		return;
	now = efs_clock_mono_ns();
	ms = at > now ? (at - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC : 0;
	c->timer_at = at;
	uv_timer_start(&c->timer, on_timer, ms, 0);
}

static int heap_push(struct efs_etcd *c, struct efs_etcd_call *call)
{
	if (c->nheap == c->heapcap) {
		size_t ncap = c->heapcap ? c->heapcap * 2 : 64;
		struct efs_etcd_call **n = efs_mem_realloc(c->heap, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->heap = n;
		c->heapcap = ncap;
	}
	heap_set(c, c->nheap++, call);
	heap_up(c, call->heap_idx);
	arm_timer(c);
	return 0;
}

static void heap_remove(struct efs_etcd *c, struct efs_etcd_call *call)
{
	size_t i = call->heap_idx;
	struct efs_etcd_call *last;

	if (i == NO_HEAP)
		return;
	call->heap_idx = NO_HEAP;
	last = c->heap[--c->nheap];
	if (i == c->nheap)
		return;
	heap_set(c, i, last);
	heap_up(c, i);
	heap_down(c, last->heap_idx);
}

/* Moves |call| to a new wake time (it stays in the heap). */
static void heap_update(struct efs_etcd *c, struct efs_etcd_call *call, uint64_t wake_ns)
{
	call->wake_ns = wake_ns;
	heap_up(c, call->heap_idx);
	heap_down(c, call->heap_idx);
	arm_timer(c);
}

/* ---- Call completion ---- */

static void call_free(struct efs_etcd_call *call)
{
	struct efs_etcd *c = call->c;

	efs_grpc_reader_done(&call->rpc.reader);
	if (call->resp)
		protobuf_c_message_free_unpacked(call->resp, efs_mem_protobuf());
	if (call->req_cap > REQ_KEEP_MAX || c->npool >= CALL_POOL_MAX) {
		efs_mem_free(call->req);
		call->req = NULL;
		call->req_cap = 0;
	}
	if (c->npool < CALL_POOL_MAX) {
		call->pool_next = c->pool;
		c->pool = call;
		c->npool++;
		return;
	}
	efs_mem_free(call);
}

static void auth_done(struct efs_etcd_call *call);

/* Takes an ending call's or stream's attempt off the channel's wait list,
 * or resets its stream on the wire (the connection keeps it as an orphan
 * until the stream ends). Shared by call_finish and stream_finish. */
static void rpc_detach(struct efs_rpc *rpc)
{
	if (rpc->waiting) {
		efs_list_del(&rpc->link);
		rpc->waiting = false;
	}
	if (rpc->conn)
		efs_conn_reset(rpc->conn, rpc, NGHTTP2_CANCEL);
}

/*
 * Fills the result of a finished call or stream but its response: the
 * message is formatted into |msg| from |fmt|, and a NULL |fmt| keeps the
 * message already there.
 */
static void result_set(struct efs_etcd_result *res, char msg[EFS_GRPC_MESSAGE_MAX], int err,
		       int gs, bool unknown, const char *fmt, va_list ap)
	__attribute__((format(printf, 6, 0)));

static void result_set(struct efs_etcd_result *res, char msg[EFS_GRPC_MESSAGE_MAX], int err,
		       int gs, bool unknown, const char *fmt, va_list ap)
{
	if (fmt)
		vsnprintf(msg, EFS_GRPC_MESSAGE_MAX, fmt, ap);
	res->err = err;
	res->grpc_status = gs;
	res->message = msg;
	res->outcome_unknown = unknown;
}

/* Decides |call|'s result: its callback is queued and it leaves every list
 * but the connection's (an attempt on the wire is reset and kept as an
 * orphan until its stream ends). */
static void call_finish(struct efs_etcd_call *call, int err, int gs, bool unknown,
			const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void call_finish(struct efs_etcd_call *call, int err, int gs, bool unknown,
			const char *fmt, ...)
{
	struct efs_etcd *c = call->c;
	va_list ap;

	if (call->finished)
		return;
	call->finished = true;
	call->retry_pending = false;
	heap_remove(c, call);
	arm_timer(c);
	rpc_detach(&call->rpc);
	va_start(ap, fmt);
	result_set(&call->res, call->msg, err, gs, unknown, fmt, ap);
	va_end(ap);
	call->res.resp = err ? NULL : call->resp;
	if (c->observe && !call->internal_auth) {
		uint64_t now = efs_clock_mono_ns();
		uint64_t start = call->deadline_ns - (uint64_t)call->timeout_ms * EFS_NSEC_PER_MSEC;

		c->observe(c->observe_arg, call->m, now > start ? now - start : 0, err);
	}
	if (err) {
		c->stats.calls_failed++;
		if (call->resp) {
			protobuf_c_message_free_unpacked(call->resp, efs_mem_protobuf());
			call->resp = NULL;
		}
	} else {
		call->resp = NULL; /* now owned by res */
	}
	if (call->internal_auth)
		auth_done(call);
	efs_list_add_tail(&c->done, &call->done_link);
	wake(c);
}

static void call_run_cb(struct efs_etcd_call *call)
{
	struct efs_etcd *c = call->c;

	if (call->cb)
		call->cb(&call->res, call->arg);
	call->cb_ran = true;
	if (call->res.resp)
		protobuf_c_message_free_unpacked(call->res.resp, efs_mem_protobuf());
	call->res.resp = NULL;
	if (!call->internal_auth)
		live_dec(c);
	if (!call->rpc.conn)
		call_free(call);
}

/* ---- Retry decisions ---- */

static void call_schedule_retry(struct efs_etcd_call *call)
{
	struct efs_etcd *c = call->c;
	uint64_t now = efs_clock_mono_ns();
	uint64_t delay = efs_backoff_next(&call->bo) * EFS_NSEC_PER_MSEC;

	c->stats.calls_retried++;
	if (now + delay >= call->deadline_ns) {
		/* No attempt fits before the deadline; the deadline fires. */
		return;
	}
	call->retry_pending = true;
	heap_update(c, call, now + delay);
}

/* The attempt failed before reaching the server: go again at once. */
static void call_requeue(struct efs_etcd_call *call)
{
	call->c->stats.calls_retried++;
	call_start_attempt(call);
}

static bool mutation_sent(const struct efs_etcd_call *call)
{
	return call->mutation && call->ever_sent;
}

/* The attempt's connection died under it. */
static void call_conn_lost(struct efs_etcd_call *call, struct efs_conn *conn, int err)
{
	struct efs_etcd *c = call->c;

	if (call->finished)
		return;
	if (c->closing) {
		call_finish(call, -ECANCELED, -1, mutation_sent(call), "client closing");
		return;
	}
	if (call->internal_auth) {
		call_finish(call, err ? err : -ECONNRESET, -1, false, "%s", conn->err);
		return;
	}
	snprintf(call->msg, sizeof(call->msg), "connection to %s lost: %s",
		 c->eps[conn->ep].url, conn->err);
	if (!call->rpc.sent) {
		call_requeue(call);
		return;
	}
	if (call->idempotent && !call->no_retry) {
		call_schedule_retry(call);
		return;
	}
	call_finish(call, -ECONNRESET, -1, call->mutation,
		    "connection to %s lost after sending: %s", c->eps[conn->ep].url, conn->err);
}

static void conn_reauth(struct efs_conn *conn);

/* The attempt's stream ended with |h2_error|; decide the call's fate. */
static void call_attempt_end(struct efs_etcd_call *call, struct efs_conn *conn, uint32_t h2_error)
{
	struct efs_etcd *c = call->c;
	struct efs_rpc *rpc = &call->rpc;
	bool unknown = false;
	int code, err;

	if (rpc->local_err) {
		/* The server answered something we could not take (undecodable
		 * or oversized reply, malformed header): a mutation on the wire
		 * may well have been applied. */
		err = rpc->local_err;
		call_finish(call, err, -1, mutation_sent(call), NULL);
		return;
	}
	if (call->drop_reply) {
		call_finish(call, -ETIMEDOUT, -1, call->mutation,
			    "reply to %s dropped (fault hook): outcome unknown",
			    methods[call->m].name);
		return;
	}
	if (rpc->st.code < 0 && h2_error != NGHTTP2_NO_ERROR) {
		code = efs_grpc_code_from_rst(h2_error);
		if (h2_error == NGHTTP2_REFUSED_STREAM) {
			/* Never processed (GOAWAY or REFUSED_STREAM): safe. */
			snprintf(call->msg, sizeof(call->msg), "stream refused by %s",
				 c->eps[conn->ep].url);
			call_requeue(call);
			return;
		}
		snprintf(rpc->st.message, sizeof(rpc->st.message),
			 "stream reset by server (HTTP/2 error %u)", h2_error);
	} else {
		code = efs_grpc_status_finish(&rpc->st);
	}
	if (code == EFS_GRPC_OK) {
		if (!call->resp) {
			call_finish(call, -EPROTO, EFS_GRPC_INTERNAL, false,
				    "%s reply without a response message", methods[call->m].name);
			return;
		}
		call->msg[0] = '\0';
		call_finish(call, 0, 0, false, NULL);
		return;
	}
	if (call->resp) {
		protobuf_c_message_free_unpacked(call->resp, efs_mem_protobuf());
		call->resp = NULL;
	}
	if (c->user && !call->internal_auth && !call->reauthed &&
	    efs_grpc_is_auth_retry(code, rpc->st.message)) {
		call->reauthed = true;
		c->stats.reauths++;
		snprintf(call->msg, sizeof(call->msg), "%s", rpc->st.message);
		if (conn->state == EFS_CONN_READY)
			conn_reauth(conn);
		call_requeue(call);
		return;
	}
	/* etcd refuses with "too many requests" before proposing anything
	 * (apply lags commit): safe to resend any call after a pause. 3.4
	 * sends it as RESOURCE_EXHAUSTED or, raw, as UNKNOWN. */
	if ((code == EFS_GRPC_RESOURCE_EXHAUSTED || code == EFS_GRPC_UNKNOWN) && !call->no_retry &&
	    strstr(rpc->st.message, "too many requests")) {
		snprintf(call->msg, sizeof(call->msg), "%s", rpc->st.message);
		call_schedule_retry(call);
		return;
	}
	if (code == EFS_GRPC_UNAVAILABLE && call->idempotent && !call->no_retry &&
	    !call->internal_auth) {
		snprintf(call->msg, sizeof(call->msg), "%s", rpc->st.message);
		call_schedule_retry(call);
		return;
	}
	err = efs_grpc_status_to_errno(code, rpc->st.message, mutation_sent(call), &unknown);
	/* "no leader", "leader changed", "raft proposal dropped" (a member
	 * without a leader, or a leader handing over, as 3.4's raw UNKNOWN):
	 * the member refused before proposing anything, so even a mutation
	 * is resent, with backoff, within its deadline: an election takes a
	 * second or two, and a caller handed -EAGAIN at once would retry it
	 * away in milliseconds. */
	if ((code == EFS_GRPC_UNAVAILABLE || code == EFS_GRPC_UNKNOWN) && err == -EAGAIN &&
	    !unknown && !call->no_retry && !call->internal_auth) {
		snprintf(call->msg, sizeof(call->msg), "%s", rpc->st.message);
		call_schedule_retry(call);
		return;
	}
	call_finish(call, err, code, unknown, "%s", rpc->st.message);
}

/* ---- Deadlines ---- */

static void call_expire(struct efs_etcd_call *call)
{
	struct channel *ch = &call->c->ch[call->rpc.ch];

	if (call->rpc.waiting && ch->last_err[0] && !call->msg[0])
		snprintf(call->msg, sizeof(call->msg), "%s", ch->last_err);
	if (call->retry_pending) {
		call->retry_pending = false;
		call->wake_ns = call->deadline_ns;
		heap_down(call->c, call->heap_idx);
		call_start_attempt(call);
		return;
	}
	if (call->msg[0]) {
		char last[EFS_GRPC_MESSAGE_MAX];

		/* call_finish() writes call->msg: format from a copy. */
		memcpy(last, call->msg, sizeof(last));
		call_finish(call, -ETIMEDOUT, -1, mutation_sent(call),
			    "%s deadline of %u ms exceeded (last error: %.400s)",
			    methods[call->m].name, call->timeout_ms, last);
	}
	else {
		call_finish(call, -ETIMEDOUT, -1, mutation_sent(call),
			    "%s deadline of %u ms exceeded", methods[call->m].name,
			    call->timeout_ms);
	}
}

static void on_timer(uv_timer_t *t)
{
	struct efs_etcd *c = t->data;
	uint64_t now = efs_clock_mono_ns();

	c->timer_at = 0;
	while (c->nheap && c->heap[0]->wake_ns <= now + EFS_NSEC_PER_MSEC / 2)
		call_expire(c->heap[0]);
	arm_timer(c);
}

/* ---- Headers ---- */

#define NV(n, v, vl)                                                                              \
	((nghttp2_nv){ (uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, (vl),                       \
		       NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE })

/* Fills |nv| with a request's headers; returns their number. Values with
 * NO_COPY flags outlive the stream; the token is copied. */
static size_t build_headers(nghttp2_nv *nv, struct efs_conn *conn, const char *path,
			    const char *timeout, bool stream)
{
	const struct efs_endpoint *ep = &conn->c->eps[conn->ep];
	size_t n = 0;

	nv[n++] = NV(":method", "POST", 4);
	nv[n++] = ep->tls ? NV(":scheme", "https", 5) : NV(":scheme", "http", 4);
	nv[n++] = NV(":path", path, strlen(path));
	nv[n++] = NV(":authority", ep->authority, strlen(ep->authority));
	nv[n++] = NV("content-type", "application/grpc", 16);
	nv[n++] = NV("te", "trailers", 8);
	if (timeout) {
		/* The value changes with nearly every call: indexing it would
		 * add (malloc) and evict an HPACK dynamic-table entry per call
		 * on both sides, for nothing. */
		nv[n] = NV("grpc-timeout", timeout, strlen(timeout));
		nv[n++].flags |= NGHTTP2_NV_FLAG_NO_INDEX;
	}
	if (conn->token) {
		nv[n] = NV("token", conn->token, strlen(conn->token));
		nv[n++].flags = NGHTTP2_NV_FLAG_NO_COPY_NAME;
	}
	if (stream)
		nv[n++] = NV("hasleader", "true", 4);
	return n;
}

/* ---- Putting rpcs on connections ---- */

static void rpc_reset_attempt(struct efs_rpc *rpc, size_t max_msg)
{
	efs_grpc_reader_done(&rpc->reader);
	efs_grpc_reader_init(&rpc->reader, max_msg);
	efs_grpc_status_init(&rpc->st);
	rpc->local_err = 0;
	rpc->sent = false;
}

static void channel_wait(struct channel *ch, struct efs_rpc *rpc)
{
	rpc->waiting = true;
	efs_list_add_tail(&ch->waiting, &rpc->link);
}

/* Submits |rpc| on |conn|. Returns 0, or -EAGAIN when |conn| takes no more
 * streams (then it has been drained), or another -errno. */
static int rpc_submit(struct efs_conn *conn, struct efs_rpc *rpc)
{
	struct efs_etcd *c = conn->c;
	nghttp2_nv nv[10];
	size_t n;
	int r;

	if (rpc->is_stream) {
		struct efs_etcd_stream *s = (struct efs_etcd_stream *)rpc;

		rpc_reset_attempt(rpc, c->max_recv_msg);
		n = build_headers(nv, conn, stream_kinds[s->kind].path, NULL, true);
	} else {
		struct efs_etcd_call *call = (struct efs_etcd_call *)rpc;
		uint64_t now = efs_clock_mono_ns();
		uint64_t left = call->deadline_ns > now ? call->deadline_ns - now : 0;

		rpc_reset_attempt(rpc, c->max_recv_msg);
		call->req_off = 0;
		call->attempts++;
		efs_grpc_format_timeout((left + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC,
					call->timeout_hdr);
		n = build_headers(nv, conn, methods[call->m].path, call->timeout_hdr, false);
	}
	r = efs_conn_submit(conn, rpc, nv, n);
	if (r == -EAGAIN) {
		struct channel *ch = &c->ch[conn->ch];

		/* Stream ids ran out or a GOAWAY came: a fresh connection
		 * takes this and every later rpc. */
		if (ch->conn == conn) {
			ch->conn = NULL;
			efs_conn_drain(conn);
		}
	}
	return r;
}

/* Sends what waits on |ch| once its connection is ready. */
static void channel_submit_waiting(struct channel *ch)
{
	while (!efs_list_empty(&ch->waiting) && ch->conn && ch->conn->state == EFS_CONN_READY &&
	       ch->conn->nrpcs < MAX_INFLIGHT) {
		struct efs_rpc *rpc = efs_list_entry(efs_list_first(&ch->waiting), struct efs_rpc,
						     link);
		int r;

		efs_list_del(&rpc->link);
		rpc->waiting = false;
		r = rpc_submit(ch->conn, rpc);
		if (r == 0)
			continue;
		if (r == -EAGAIN) {
			channel_wait(ch, rpc);
			channel_kick(ch);
			return;
		}
		if (rpc->is_stream)
			stream_finish((struct efs_etcd_stream *)rpc, r, -1,
				      "cannot open stream: %s", strerror(-r));
		else
			call_finish((struct efs_etcd_call *)rpc, r, -1, false,
				    "cannot start call: %s", strerror(-r));
	}
}

static void on_channel_timer(uv_timer_t *t)
{
	struct channel *ch = t->data;

	ch->timer_armed = false;
	channel_kick(ch);
}

static void channel_connect(struct channel *ch)
{
	struct efs_etcd *c = ch->c;
	struct efs_conn *conn;
	int r;

	r = efs_conn_new(&conn, c, ch->idx, ch->ep, ch->mem_peer);
	if (r < 0) {
		snprintf(ch->last_err, sizeof(ch->last_err), "cannot connect to %s: %s",
			 c->eps[ch->ep].url, strerror(-r));
		ch->fails++;
		ch->ep = (ch->ep + 1) % c->neps;
		ch->timer_armed = true;
		uv_timer_start(&ch->timer, on_channel_timer, efs_backoff_next(&ch->bo), 0);
		return;
	}
	if (ch->ever_connected)
		c->stats.reconnects++;
	ch->ever_connected = true;
	ch->conn = conn;
	efs_list_add_tail(&c->conns, &conn->link);
	efs_conn_set_ref(conn, c->nlive > 0);
}

/* Makes progress for what waits on |ch|: connect, authenticate or send. */
static void channel_kick(struct channel *ch)
{
	struct efs_etcd *c = ch->c;

	if (c->closing || efs_list_empty(&ch->waiting))
		return;
	if (ch->conn) {
		if (ch->conn->state == EFS_CONN_READY)
			channel_submit_waiting(ch);
		else if (ch->conn->state == EFS_CONN_AUTH_FAILED)
			conn_reauth(ch->conn);
		return;
	}
	if (ch->timer_armed)
		return;
	channel_connect(ch);
}

static void rpc_enqueue(struct efs_etcd *c, struct efs_rpc *rpc)
{
	struct channel *ch = &c->ch[rpc->ch];

	if (ch->conn && ch->conn->state == EFS_CONN_READY && efs_list_empty(&ch->waiting) &&
	    ch->conn->nrpcs < MAX_INFLIGHT) {
		int r = rpc_submit(ch->conn, rpc);

		if (r == 0)
			return;
		if (r != -EAGAIN) {
			if (rpc->is_stream)
				stream_finish((struct efs_etcd_stream *)rpc, r, -1,
					      "cannot open stream: %s", strerror(-r));
			else
				call_finish((struct efs_etcd_call *)rpc, r, -1, false,
					    "cannot start call: %s", strerror(-r));
			return;
		}
	}
	channel_wait(ch, rpc);
	channel_kick(ch);
}

static void call_start_attempt(struct efs_etcd_call *call)
{
	if (call->internal_auth) {
		/* Authenticate runs on the connection it unlocks. */
		struct efs_conn *conn = call->auth_conn;
		int r = conn ? rpc_submit(conn, &call->rpc) : -ECONNRESET;

		if (r < 0)
			call_finish(call, r, -1, false, "cannot authenticate: %s", strerror(-r));
		return;
	}
	rpc_enqueue(call->c, &call->rpc);
}

/* ---- Authentication ---- */

static struct efs_etcd_call *call_alloc(struct efs_etcd *c)
{
	struct efs_etcd_call *call = c->pool;
	uint8_t *req = NULL;
	size_t req_cap = 0;

	if (call) {
		c->pool = call->pool_next;
		c->npool--;
		req = call->req; /* kept by call_free() for reuse */
		req_cap = call->req_cap;
	} else {
		call = efs_mem_malloc(sizeof(*call));
		if (!call)
			return NULL;
	}
	/* The message buffer is big and needs no clearing. */
	memset(call, 0, offsetof(struct efs_etcd_call, msg));
	call->req = req;
	call->req_cap = req_cap;
	call->msg[0] = '\0';
	call->cb = NULL;
	call->arg = NULL;
	call->c = c;
	call->heap_idx = NO_HEAP;
	efs_grpc_reader_init(&call->rpc.reader, c->max_recv_msg);
	return call;
}

static void fail_waiting(struct channel *ch, int err, const char *msg)
{
	struct efs_list *l;

	while ((l = efs_list_pop(&ch->waiting))) {
		struct efs_rpc *rpc = efs_list_entry(l, struct efs_rpc, link);

		rpc->waiting = false;
		if (rpc->is_stream)
			stream_finish((struct efs_etcd_stream *)rpc, err, -1, "%s", msg);
		else
			call_finish((struct efs_etcd_call *)rpc, err, -1, false, "%s", msg);
	}
}

/* Authenticates on |conn|; rpcs of its channel wait meanwhile. */
static void conn_reauth(struct efs_conn *conn)
{
	struct efs_etcd *c = conn->c;
	Etcdserverpb__AuthenticateRequest req = ETCDSERVERPB__AUTHENTICATE_REQUEST__INIT;
	struct efs_etcd_call *call;
	int r;

	if (conn->auth_in_flight || conn->state == EFS_CONN_DEAD ||
	    conn->state == EFS_CONN_DRAINING)
		return;
	conn->state = EFS_CONN_AUTH;
	efs_mem_free(conn->token);
	conn->token = NULL;
	r = -ENOMEM;
	call = call_alloc(c);
	if (!call)
		goto out_fail;
	req.name = c->user;
	req.password = c->password ? c->password : (char *)"";
	r = efs_grpc_frame_into(&req.base, &call->req, &call->req_cap, &call->req_len);
	if (r < 0) {
		call_free(call);
		goto out_fail;
	}
	call->m = EFS_ETCD_AUTHENTICATE;
	call->internal_auth = true;
	call->auth_conn = conn;
	call->idempotent = true;
	call->timeout_ms = c->call_timeout_ms;
	call->deadline_ns = efs_clock_mono_ns() + (uint64_t)c->call_timeout_ms * EFS_NSEC_PER_MSEC;
	call->wake_ns = call->deadline_ns;
	call->rpc.ch = (uint8_t)conn->ch;
	efs_backoff_init(&call->bo, c->backoff_base_ms, c->backoff_max_ms, ++c->seed);
	r = heap_push(c, call);
	if (r < 0) {
		call_free(call);
		goto out_fail;
	}
	conn->auth_in_flight = true;
	call_start_attempt(call);
	return;

out_fail:
	efs_conn_fail(conn, r, "cannot authenticate: %s", strerror(-r));
}

/* The internal Authenticate of |call| ended (called from call_finish). */
static void auth_done(struct efs_etcd_call *call)
{
	struct efs_etcd *c = call->c;
	struct efs_conn *conn = call->auth_conn;
	struct channel *ch;
	char msg[EFS_GRPC_MESSAGE_MAX + 64];
	int code = call->res.grpc_status;

	if (!conn)
		return;
	conn->auth_in_flight = false;
	call->auth_conn = NULL;
	if (conn->state == EFS_CONN_DEAD || conn->state == EFS_CONN_DRAINING)
		return;
	ch = &c->ch[conn->ch];
	if (call->res.err == 0) {
		Etcdserverpb__AuthenticateResponse *resp =
			(Etcdserverpb__AuthenticateResponse *)call->res.resp;

		if (resp->token && resp->token[0]) {
			conn->token = efs_mem_strdup(resp->token);
			if (!conn->token) {
				efs_conn_fail(conn, -ENOMEM, "out of memory");
				return;
			}
		}
		conn->state = EFS_CONN_READY;
		if (ch->conn == conn)
			channel_submit_waiting(ch);
		return;
	}
	if (code == EFS_GRPC_FAILED_PRECONDITION && strstr(call->msg, "not enabled")) {
		/* Auth is off on this cluster: go on without a token. */
		conn->state = EFS_CONN_READY;
		if (ch->conn == conn)
			channel_submit_waiting(ch);
		return;
	}
	if (code == EFS_GRPC_INVALID_ARGUMENT || code == EFS_GRPC_PERMISSION_DENIED ||
	    code == EFS_GRPC_UNAUTHENTICATED || call->res.err == -EACCES ||
	    call->res.err == -EPERM) {
		/* Wrong credentials: what waits fails now, each later call
		 * tries again (the password may be fixed meanwhile). */
		conn->state = EFS_CONN_AUTH_FAILED;
		snprintf(msg, sizeof(msg), "authentication as user '%s' failed: %s", c->user,
			 call->msg);
		if (ch->conn == conn)
			fail_waiting(ch, -EACCES, msg);
		return;
	}
	efs_conn_fail(conn, call->res.err, "authentication failed: %s", call->msg);
}

/* ---- Connection events ---- */

void efs_client_conn_up(struct efs_conn *conn)
{
	struct efs_etcd *c = conn->c;
	struct channel *ch = &c->ch[conn->ch];

	if (ch->conn != conn) {
		/* The channel moved on while this one connected. */
		efs_conn_drain(conn);
		return;
	}
	ch->fails = 0;
	efs_backoff_reset(&ch->bo);
	if (c->user) {
		conn_reauth(conn);
		return;
	}
	conn->state = EFS_CONN_READY;
	if (ch->conn == conn)
		channel_submit_waiting(ch);
}

static void stream_conn_lost(struct efs_etcd_stream *s, struct efs_conn *conn);
static void stream_release(struct efs_etcd_stream *s);

void efs_client_conn_down(struct efs_conn *conn, int err)
{
	struct efs_etcd *c = conn->c;
	struct channel *ch = &c->ch[conn->ch];
	bool current = ch->conn == conn;
	struct efs_list *l;

	if (current) {
		ch->conn = NULL;
		snprintf(ch->last_err, sizeof(ch->last_err), "%.100s: %.150s", c->eps[conn->ep].url,
			 conn->err);
		if (!conn->settings_seen)
			ch->fails++;
		/* Move on: the member may be down, partitioned or stopped. */
		ch->ep = (conn->ep + 1) % c->neps;
	}
	while ((l = efs_list_pop(&conn->rpcs))) {
		struct efs_rpc *rpc = efs_list_entry(l, struct efs_rpc, link);

		rpc->conn = NULL;
		conn->nrpcs--;
		if (rpc->is_stream) {
			struct efs_etcd_stream *s = (struct efs_etcd_stream *)rpc;

			if (rpc->orphan)
				stream_release(s);
			else
				stream_conn_lost(s, conn);
		} else {
			struct efs_etcd_call *call = (struct efs_etcd_call *)rpc;

			if (call->finished) {
				if (call->cb_ran)
					call_free(call);
				continue;
			}
			call_conn_lost(call, conn, err);
		}
	}
	if (current && !efs_list_empty(&ch->waiting) && !c->closing && !ch->timer_armed) {
		/* A fresh endpoint is tried at once; after a whole round of
		 * failures, back off. */
		uint64_t delay = 0;

		if (ch->fails && ch->fails % c->neps == 0)
			delay = efs_backoff_next(&ch->bo);
		ch->timer_armed = true;
		uv_timer_start(&ch->timer, on_channel_timer, delay, 0);
	}
}

void efs_client_conn_goaway(struct efs_conn *conn, uint32_t error_code, const uint8_t *data,
			    size_t len)
{
	struct efs_etcd *c = conn->c;
	struct channel *ch = &c->ch[conn->ch];

	efs_log_debug("etcd: GOAWAY from %s: error %u, last stream %d, \"%.*s\"",
		      c->eps[conn->ep].url, error_code, conn->goaway_last_id,
		      (int)(len > 64 ? 64 : len), (const char *)data);
	if (error_code == NGHTTP2_ENHANCE_YOUR_CALM && len >= 14 &&
	    memmem(data, len, "too_many_pings", 14)) {
		if (c->ping_interval_ms < 3600u * 1000)
			c->ping_interval_ms *= 2;
	}
	if (ch->conn == conn) {
		ch->conn = NULL;
		ch->ep = (conn->ep + 1) % c->neps;
	}
	efs_conn_drain(conn);
	if (!efs_list_empty(&ch->waiting))
		channel_kick(ch);
}

void efs_client_conn_gone(struct efs_conn *conn)
{
	struct efs_etcd *c = conn->c;

	efs_list_del(&conn->link);
	if (c->closing)
		maybe_destroy(c);
}

/* ---- rpc hooks from conn.c ---- */

static int call_on_msg(const uint8_t *msg, size_t len, void *arg)
{
	struct efs_etcd_call *call = arg;

	if (call->resp) {
		call->rpc.local_err = -EPROTO;
		snprintf(call->msg, sizeof(call->msg), "%s reply has more than one message",
			 methods[call->m].name);
		return -EPROTO;
	}
	unsigned long failures = efs_mem_failures();

	call->resp = protobuf_c_message_unpack(methods[call->m].resp, efs_mem_protobuf(), len, msg);
	if (!call->resp && efs_mem_failures() != failures) {
		/* protobuf-c says NULL for both: an allocation failed. */
		call->rpc.local_err = -ENOMEM;
		snprintf(call->msg, sizeof(call->msg), "out of memory decoding the %s reply",
			 methods[call->m].name);
		return -ENOMEM;
	}
	if (!call->resp) {
		call->rpc.local_err = -EBADMSG;
		snprintf(call->msg, sizeof(call->msg), "%s reply does not decode",
			 methods[call->m].name);
		return -EBADMSG;
	}
	return 0;
}

static int stream_on_msg(const uint8_t *msg, size_t len, void *arg)
{
	struct efs_etcd_stream *s = arg;
	unsigned long failures = efs_mem_failures();
	ProtobufCMessage *m;

	m = protobuf_c_message_unpack(stream_kinds[s->kind].resp, efs_mem_protobuf(), len, msg);
	if (!m && efs_mem_failures() != failures) {
		s->rpc.local_err = -ENOMEM;
		snprintf(s->msg, sizeof(s->msg), "out of memory decoding a stream message");
		return -ENOMEM;
	}
	if (!m) {
		s->rpc.local_err = -EBADMSG;
		snprintf(s->msg, sizeof(s->msg), "stream message does not decode");
		return -EBADMSG;
	}
	s->msg_cb(s, m, s->arg);
	protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	/* The callback may have closed the stream or the client. */
	if (s->rpc.reset || !s->rpc.conn)
		return -ECANCELED;
	return 0;
}

int efs_rpc_on_header(struct efs_rpc *rpc, const uint8_t *name, size_t namelen,
		      const uint8_t *value, size_t valuelen)
{
	if (rpc->reset)
		return 0;
	if (efs_grpc_status_header(&rpc->st, name, namelen, value, valuelen) < 0) {
		rpc->local_err = -EPROTO;
		snprintf(rpc->is_stream ? ((struct efs_etcd_stream *)rpc)->msg
					: ((struct efs_etcd_call *)rpc)->msg,
			 EFS_GRPC_MESSAGE_MAX, "malformed response header %.*s",
			 (int)(namelen > 64 ? 64 : namelen), (const char *)name);
		return -EPROTO;
	}
	return 0;
}

int efs_rpc_on_data(struct efs_rpc *rpc, const uint8_t *data, size_t len)
{
	char *msg;
	int r;

	if (rpc->reset)
		return 0;
	/* nghttp2 runs without HTTP messaging checks (conn.c, h2_start), so
	 * this is where a body is refused unless a "200, application/grpc"
	 * response header block came first. Such a body (a proxy's error page,
	 * the JSON gateway) is dropped, and the stream's end reports the
	 * status synthesised from :status (efs_grpc_status_finish). */
	if (rpc->st.http_status != 200 || !rpc->st.content_type_ok)
		return 0;
	if (rpc->is_stream) {
		struct efs_etcd_stream *s = (struct efs_etcd_stream *)rpc;

		s->in_feed = true;
		r = efs_grpc_reader_feed(&rpc->reader, data, len, stream_on_msg, rpc);
		s->in_feed = false;
		if (s->release_deferred) {
			/* Released while in use; conn.c sees the connection
			 * dead and touches |rpc| no more. */
			stream_release(s);
			return 0;
		}
	} else {
		r = efs_grpc_reader_feed(&rpc->reader, data, len, call_on_msg, rpc);
	}
	if (r >= 0 || r == -ECANCELED)
		return 0;
	if (rpc->local_err)
		return r;
	rpc->local_err = r;
	msg = rpc->is_stream ? ((struct efs_etcd_stream *)rpc)->msg
			     : ((struct efs_etcd_call *)rpc)->msg;
	if (r == -EMSGSIZE)
		snprintf(msg, EFS_GRPC_MESSAGE_MAX,
			 "response message larger than the limit of %zu bytes",
			 rpc->reader.max_msg);
	else if (r == -EPROTO)
		snprintf(msg, EFS_GRPC_MESSAGE_MAX, "compressed response message");
	else
		snprintf(msg, EFS_GRPC_MESSAGE_MAX, "cannot receive message: %s", strerror(-r));
	return r;
}

void efs_rpc_on_sent(struct efs_rpc *rpc)
{
	rpc->sent = true;
	if (!rpc->is_stream)
		((struct efs_etcd_call *)rpc)->ever_sent = true;
}

static void stream_attempt_end(struct efs_etcd_stream *s, struct efs_conn *conn,
			       uint32_t h2_error);
static void stream_release(struct efs_etcd_stream *s);

void efs_rpc_on_close(struct efs_rpc *rpc, struct efs_conn *conn, uint32_t h2_error)
{
	struct channel *ch = &conn->c->ch[conn->ch];

	/* A slot is free on the connection: let the next waiting rpc in. */
	if (ch->conn == conn && !efs_list_empty(&ch->waiting) && conn->state == EFS_CONN_READY)
		channel_submit_waiting(ch);
	if (rpc->is_stream) {
		struct efs_etcd_stream *s = (struct efs_etcd_stream *)rpc;

		if (rpc->orphan)
			stream_release(s);
		else if (!s->finished)
			stream_attempt_end(s, conn, h2_error);
		return;
	}
	struct efs_etcd_call *call = (struct efs_etcd_call *)rpc;

	if (call->finished) {
		if (call->cb_ran)
			call_free(call);
		return;
	}
	call_attempt_end(call, conn, h2_error);
}

ssize_t efs_rpc_read_body(struct efs_rpc *rpc, uint8_t *buf, size_t len, uint32_t *flags)
{
	if (rpc->is_stream) {
		struct efs_etcd_stream *s = (struct efs_etcd_stream *)rpc;
		struct efs_list *first = efs_list_first(&s->sendq);
		struct sendq_item *it;
		size_t n;

		if (!first)
			return NGHTTP2_ERR_DEFERRED;
		it = efs_list_entry(first, struct sendq_item, link);
		n = it->len - it->off;
		if (n > len)
			n = len;
		memcpy(buf, it->buf + it->off, n);
		it->off += n;
		if (it->off == it->len) {
			efs_list_del(&it->link);
			efs_mem_free(it->buf);
			efs_mem_free(it);
			/* The frame is handed to the socket within this flush. */
			s->last_send_ns = efs_clock_mono_ns();
		}
		return (ssize_t)n;
	} else {
		struct efs_etcd_call *call = (struct efs_etcd_call *)rpc;
		size_t n = call->req_len - call->req_off;

		if (n > len)
			n = len;
		memcpy(buf, call->req + call->req_off, n);
		call->req_off += n;
		if (call->req_off == call->req_len)
			*flags |= NGHTTP2_DATA_FLAG_EOF;
		return (ssize_t)n;
	}
}

/* ---- Unary calls ---- */

int efs_etcd_call(struct efs_etcd *c, enum efs_etcd_method m, const ProtobufCMessage *req,
		  const struct efs_etcd_callopts *co, efs_etcd_call_cb cb, void *arg,
		  struct efs_etcd_call **ret_call)
{
	struct efs_etcd_call *call;
	enum efs_etcd_channel chn = co ? co->channel : EFS_ETCD_CH_BULK;
	int r;

	if ((unsigned)m >= EFS_ETCD_NMETHODS || !req || req->descriptor != methods[m].req ||
	    (unsigned)chn >= EFS_ETCD_NCHANNELS)
		return -EINVAL;
	if (c->closing)
		return -ESHUTDOWN;
	call = call_alloc(c);
	if (!call)
		return -ENOMEM;
	r = efs_grpc_frame_into(req, &call->req, &call->req_cap, &call->req_len);
	if (r < 0) {
		call_free(call);
		return r;
	}
	call->m = m;
	call->idempotent = methods[m].idempotent;
	call->mutation = methods[m].mutation;
	if (m == EFS_ETCD_LEASE_GRANT) {
		bool own_id = ((const Etcdserverpb__LeaseGrantRequest *)req)->id != 0;

		call->idempotent = own_id;
		call->mutation = !own_id;
	}
	call->no_retry = co && co->no_retry;
	call->timeout_ms = co && co->timeout_ms ? co->timeout_ms : c->call_timeout_ms;
	call->deadline_ns = efs_clock_mono_ns() + (uint64_t)call->timeout_ms * EFS_NSEC_PER_MSEC;
	call->wake_ns = call->deadline_ns;
	call->rpc.ch = (uint8_t)chn;
	call->cb = cb;
	call->arg = arg;
	efs_backoff_init(&call->bo, c->backoff_base_ms, c->backoff_max_ms, ++c->seed);
	r = heap_push(c, call);
	if (r < 0) {
		call_free(call);
		return r;
	}
#if EFS_FAULT_HOOKS
	if (c->drop_nth && c->drop_method == m && --c->drop_nth == 0)
		call->drop_reply = true;
#endif
	c->stats.calls_started++;
	live_inc(c);
	if (ret_call)
		*ret_call = call;
	call_start_attempt(call);
	return 0;
}

void efs_etcd_call_cancel(struct efs_etcd_call *call)
{
	if (!call || call->finished)
		return;
	call_finish(call, -ECANCELED, -1, mutation_sent(call), "%s cancelled",
		    methods[call->m].name);
}

/* ---- Streams ---- */

static void sendq_clear(struct efs_etcd_stream *s)
{
	struct efs_list *n;

	while ((n = efs_list_pop(&s->sendq))) {
		struct sendq_item *it = efs_list_entry(n, struct sendq_item, link);

		efs_mem_free(it->buf);
		efs_mem_free(it);
	}
}

static void stream_finish(struct efs_etcd_stream *s, int err, int gs, const char *fmt, ...)
{
	struct efs_etcd *c = s->c;
	va_list ap;

	if (s->finished)
		return;
	s->finished = true;
	rpc_detach(&s->rpc);
	va_start(ap, fmt);
	result_set(&s->res, s->msg, err, gs, false, fmt, ap);
	va_end(ap);
	s->res.resp = NULL;
	efs_list_add_tail(&c->done, &s->done_link);
	wake(c);
}

static void stream_release(struct efs_etcd_stream *s)
{
	/* An orphan's connection can die while its message callback runs
	 * (the callback closed the stream and then failed the connection,
	 * e.g. through efs_etcd_channel_failover() or efs_etcd_free()):
	 * efs_rpc_on_data() frees it once the reader has returned. */
	if (s->in_feed) {
		s->release_deferred = true;
		return;
	}
	efs_grpc_reader_done(&s->rpc.reader);
	sendq_clear(s);
	efs_mem_free(s);
}

/* The owner is done with |s|. A stream still on a connection is reset and
 * freed when nghttp2 reports its close: its body source points at it, and
 * a message callback may be running inside the reader. */
static void stream_free(struct efs_etcd_stream *s)
{
	if (s->rpc.conn) {
		s->rpc.orphan = true;
		efs_conn_reset(s->rpc.conn, &s->rpc, NGHTTP2_CANCEL);
		return;
	}
	stream_release(s);
}

static void stream_conn_lost(struct efs_etcd_stream *s, struct efs_conn *conn)
{
	struct efs_etcd *c = s->c;

	if (s->finished)
		return;
	if (c->closing) {
		stream_finish(s, -ECANCELED, -1, "client closing");
		return;
	}
	if (!s->rpc.sent) {
		rpc_enqueue(c, &s->rpc);
		return;
	}
	stream_finish(s, -ECONNRESET, -1, "connection to %s lost: %s", c->eps[conn->ep].url,
		      conn->err);
}

static void stream_attempt_end(struct efs_etcd_stream *s, struct efs_conn *conn,
			       uint32_t h2_error)
{
	struct efs_etcd *c = s->c;
	struct efs_rpc *rpc = &s->rpc;
	bool unknown;
	int code;

	if (s->finished)
		return;
	if (rpc->local_err) {
		stream_finish(s, rpc->local_err, -1, NULL);
		return;
	}
	if (rpc->st.code < 0 && h2_error != NGHTTP2_NO_ERROR) {
		if (h2_error == NGHTTP2_REFUSED_STREAM && !rpc->sent) {
			/* Never processed: open it again elsewhere. */
			rpc_enqueue(c, rpc);
			return;
		}
		code = efs_grpc_code_from_rst(h2_error);
		stream_finish(s, efs_grpc_status_to_errno(code, "", false, &unknown), code,
			      "stream reset by server (HTTP/2 error %u)", h2_error);
		return;
	}
	code = efs_grpc_status_finish(&rpc->st);
	if (code != EFS_GRPC_OK && c->user && efs_grpc_is_auth_retry(code, rpc->st.message)) {
		struct efs_conn *cur = c->ch[rpc->ch].conn;

		if (cur && cur->state == EFS_CONN_READY)
			conn_reauth(cur);
	}
	stream_finish(s, code == EFS_GRPC_OK ? 0 :
		      efs_grpc_status_to_errno(code, rpc->st.message, false, &unknown),
		      code, "%s", rpc->st.message);
}

int efs_etcd_stream_open(struct efs_etcd *c, enum efs_etcd_stream_kind kind,
			 enum efs_etcd_channel channel, efs_etcd_stream_msg_cb msg_cb,
			 efs_etcd_stream_close_cb close_cb, void *arg,
			 struct efs_etcd_stream **ret)
{
	struct efs_etcd_stream *s;

	if ((unsigned)kind > EFS_ETCD_STREAM_LEASE_KEEPALIVE ||
	    (unsigned)channel >= EFS_ETCD_NCHANNELS || !msg_cb || !close_cb || !ret)
		return -EINVAL;
	if (c->closing)
		return -ESHUTDOWN;
	s = efs_mem_calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->c = c;
	s->kind = kind;
	s->msg_cb = msg_cb;
	s->close_cb = close_cb;
	s->arg = arg;
	s->rpc.is_stream = true;
	s->rpc.ch = (uint8_t)channel;
	efs_list_init(&s->sendq);
	efs_grpc_reader_init(&s->rpc.reader, c->max_recv_msg);
	efs_grpc_status_init(&s->rpc.st);
	live_inc(c);
	*ret = s;
	rpc_enqueue(c, &s->rpc);
	return 0;
}

int efs_etcd_stream_send(struct efs_etcd_stream *s, const ProtobufCMessage *msg)
{
	struct sendq_item *it;
	int r;

	if (!msg || msg->descriptor != stream_kinds[s->kind].req)
		return -EINVAL;
	if (s->finished || s->rpc.orphan)
		return -EPIPE;
	it = efs_mem_malloc(sizeof(*it));
	if (!it)
		return -ENOMEM;
	r = efs_grpc_frame(msg, &it->buf, &it->len);
	if (r < 0) {
		efs_mem_free(it);
		return r;
	}
	it->off = 0;
	efs_list_add_tail(&s->sendq, &it->link);
	if (s->rpc.conn)
		efs_conn_resume(s->rpc.conn, &s->rpc);
	return 0;
}

void efs_etcd_stream_close(struct efs_etcd_stream *s)
{
	struct efs_etcd *c;

	if (!s)
		return;
	c = s->c;
	if (s->in_close_cb)
		return;
	if (s->finished) {
		/* Its close callback was queued; it must not run now. */
		efs_list_del(&s->done_link);
	} else {
		if (s->rpc.waiting) {
			efs_list_del(&s->rpc.link);
			s->rpc.waiting = false;
		}
	}
	live_dec(c);
	stream_free(s);
}

uint64_t efs_etcd_stream_last_send_ns(const struct efs_etcd_stream *s)
{
	return s->last_send_ns;
}

/* ---- Loop integration ---- */

_Static_assert(offsetof(struct efs_etcd_call, done_link) ==
		       offsetof(struct efs_etcd_stream, done_link),
	       "run_done() finds the rpc from done_link");

static void run_done(struct efs_etcd *c)
{
	struct efs_list *l;

	while ((l = efs_list_pop(&c->done))) {
		struct efs_rpc *rpc;

		/* done_link directly follows rpc in both structs. */
		rpc = (struct efs_rpc *)(void *)((char *)l - offsetof(struct efs_etcd_call,
								     done_link));
		if (rpc->is_stream) {
			struct efs_etcd_stream *s = (struct efs_etcd_stream *)rpc;

			live_dec(c);
			s->in_close_cb = true;
			s->close_cb(s, &s->res, s->arg);
			stream_free(s);
		} else {
			call_run_cb((struct efs_etcd_call *)rpc);
		}
	}
}

/* Flushes each connection queued so far once; one that queues itself again
 * meanwhile waits for the next turn, so that no peer can livelock us. */
static void flush_dirty(struct efs_etcd *c)
{
	struct efs_list batch;

	if (efs_list_empty(&c->dirty))
		return;
	efs_list_init(&batch);
	efs_list_splice_tail(&batch, &c->dirty);
	while (!efs_list_empty(&batch)) {
		struct efs_conn *conn = efs_list_entry(efs_list_first(&batch), struct efs_conn,
						       dirty_link);

		efs_conn_flush(conn);
	}
}

static void tick(struct efs_etcd *c)
{
#if EFS_FAULT_HOOKS
	if (c->stall_ms) {
		uint32_t ms = c->stall_ms;

		c->stall_ms = 0;
		usleep(ms * 1000u);
	}
#endif
	/* Callbacks may queue output or more callbacks; loop to a fixpoint. */
	for (int i = 0; i < 8; i++) {
		run_done(c);
		flush_dirty(c);
		if (efs_list_empty(&c->done))
			break;
	}
	if (efs_list_empty(&c->done) && efs_list_empty(&c->dirty) && c->idle_on) {
		c->idle_on = false;
		uv_idle_stop(&c->idle);
	}
	if (c->closing)
		maybe_destroy(c);
}

static void on_idle(uv_idle_t *h)
{
	tick(h->data);
}

static void on_check(uv_check_t *h)
{
	struct efs_etcd *c = h->data;

	if (c->idle_on)
		tick(c);
}

/* ---- Endpoints ---- */

static void endpoints_free(struct efs_endpoint *eps, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		efs_mem_free(eps[i].url);
		efs_mem_free(eps[i].host);
		efs_mem_free(eps[i].port);
		efs_mem_free(eps[i].authority);
	}
	efs_mem_free(eps);
}

static int parse_endpoint(const char *s, size_t len, struct efs_endpoint *ep)
{
	const char *host, *port = NULL, *end = s + len;
	size_t hostlen, portlen;
	bool v6 = false;
	char buf[600];

	while (s < end && isspace((unsigned char)*s))
		s++;
	while (end > s && isspace((unsigned char)end[-1]))
		end--;
	if (end - s >= 7 && !strncasecmp(s, "http://", 7)) {
		s += 7;
	} else if (end - s >= 8 && !strncasecmp(s, "https://", 8)) {
		s += 8;
		ep->tls = true;
	} else if (memmem(s, (size_t)(end - s), "://", 3)) {
		return -EINVAL;
	}
	if (end > s && end[-1] == '/')
		end--;
	if (s == end)
		return -EINVAL;
	if (*s == '[') {
		const char *rb = memchr(s, ']', (size_t)(end - s));

		if (!rb || rb == s + 1)
			return -EINVAL;
		host = s + 1;
		hostlen = (size_t)(rb - host);
		v6 = true;
		if (rb + 1 < end) {
			if (rb[1] != ':')
				return -EINVAL;
			port = rb + 2;
		}
	} else {
		const char *colon = memchr(s, ':', (size_t)(end - s));

		host = s;
		hostlen = colon ? (size_t)(colon - s) : (size_t)(end - s);
		if (colon)
			port = colon + 1;
		if (!hostlen || memchr(host, '/', hostlen) || memchr(host, '[', hostlen))
			return -EINVAL;
	}
	if (port) {
		unsigned long v = 0;

		portlen = (size_t)(end - port);
		if (!portlen || portlen > 5)
			return -EINVAL;
		for (size_t i = 0; i < portlen; i++) {
			if (!isdigit((unsigned char)port[i]))
				return -EINVAL;
			v = v * 10 + (unsigned long)(port[i] - '0');
		}
		if (v == 0 || v > 65535)
			return -EINVAL;
	} else {
		port = DEFAULT_PORT;
		portlen = strlen(DEFAULT_PORT);
	}
	if (hostlen > 255)
		return -EINVAL;
	ep->host = efs_mem_strndup(host, hostlen);
	ep->port = efs_mem_strndup(port, portlen);
	snprintf(buf, sizeof(buf), v6 ? "[%.*s]:%.*s" : "%.*s:%.*s", (int)hostlen, host,
		 (int)portlen, port);
	ep->authority = efs_mem_strdup(buf);
	snprintf(buf, sizeof(buf), "%s://%s", ep->tls ? "https" : "http", ep->authority ?
		 ep->authority : "");
	ep->url = efs_mem_strdup(buf);
	if (!ep->host || !ep->port || !ep->authority || !ep->url)
		return -ENOMEM;
	return 0;
}

static int parse_endpoints(const char *list, struct efs_endpoint **ret, size_t *ret_n)
{
	struct efs_endpoint *eps;
	size_t n = 1, i = 0;
	const char *p;
	int r;

	if (!list)
		return -EINVAL;
	for (p = list; *p; p++)
		n += *p == ',';
	eps = efs_mem_calloc(n, sizeof(*eps));
	if (!eps)
		return -ENOMEM;
	for (p = list;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);

		r = parse_endpoint(p, len, &eps[i++]);
		if (r < 0) {
			endpoints_free(eps, i);
			return r;
		}
		if (!comma)
			break;
		p = comma + 1;
	}
	*ret = eps;
	*ret_n = i;
	return 0;
}

/* ---- Lifecycle ---- */

static void on_client_handle_closed(uv_handle_t *h)
{
	struct efs_etcd *c = h->data;

	c->handles--;
	maybe_destroy(c);
}

static void on_channel_timer_closed(uv_handle_t *h)
{
	struct channel *ch = h->data;

	ch->c->handles--;
	maybe_destroy(ch->c);
}

static void client_free_mem(struct efs_etcd *c)
{
	while (c->pool) {
		struct efs_etcd_call *call = c->pool;

		c->pool = call->pool_next;
		efs_mem_free(call->req);
		efs_mem_free(call);
	}
	efs_tls_ctx_free(c->tls);
	endpoints_free(c->eps, c->neps);
	efs_mem_free(c->server_name);
	efs_mem_free(c->user);
	efs_mem_free(c->password);
	efs_mem_free(c->heap);
	efs_mem_free(c->cap);
	efs_mem_free(c);
}

/* Finishes efs_etcd_free() once every callback ran and every handle closed. */
static void maybe_destroy(struct efs_etcd *c)
{
	void (*done)(void *);
	void *arg;

	if (!c->closing || !efs_list_empty(&c->conns) || !efs_list_empty(&c->done) ||
	    c->nheap)
		return;
	if (!c->handles_closing) {
		c->handles_closing = true;
		uv_close((uv_handle_t *)&c->idle, on_client_handle_closed);
		uv_close((uv_handle_t *)&c->check, on_client_handle_closed);
		uv_close((uv_handle_t *)&c->timer, on_client_handle_closed);
		for (int i = 0; i < EFS_ETCD_NCHANNELS; i++)
			uv_close((uv_handle_t *)&c->ch[i].timer, on_channel_timer_closed);
		return;
	}
	if (c->handles)
		return;
	done = c->done_cb;
	arg = c->done_arg;
	client_free_mem(c);
	if (done)
		done(arg);
}

void efs_etcd_free(struct efs_etcd *c, void (*done)(void *arg), void *arg)
{
	struct efs_list *l, *next;

	if (!c || c->closing)
		return;
	c->closing = true;
	c->done_cb = done;
	c->done_arg = arg;
	for (int i = 0; i < EFS_ETCD_NCHANNELS; i++) {
		struct channel *ch = &c->ch[i];

		if (ch->timer_armed) {
			uv_timer_stop(&ch->timer);
			ch->timer_armed = false;
		}
		fail_waiting(ch, -ECANCELED, "client closing");
		ch->conn = NULL;
	}
	efs_list_for_each_safe(l, next, &c->conns)
		efs_conn_fail(efs_list_entry(l, struct efs_conn, link), -ECANCELED,
			      "client closing");
	/* Calls waiting for a retry are in no list but the heap. */
	while (c->nheap)
		call_finish(c->heap[0], -ECANCELED, -1, mutation_sent(c->heap[0]),
			    "client closing");
	wake(c);
}

int efs_etcd_new(struct efs_etcd **ret, uv_loop_t *loop, const struct efs_etcd_opts *opts)
{
	struct efs_etcd *c;
	char err[256] = "";
	bool any_tls = false;
	int r;

	if (!opts || !opts->endpoints || !loop)
		return -EINVAL;
	if (!opts->cert != !opts->key)
		return -EINVAL;
	c = efs_mem_calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->loop = loop;
	r = parse_endpoints(opts->endpoints, &c->eps, &c->neps);
	if (r < 0) {
		efs_mem_free(c);
		return r;
	}
	r = -ENOMEM;
	if (opts->server_name && !(c->server_name = efs_mem_strdup(opts->server_name)))
		goto out_free;
	if (opts->user && !(c->user = efs_mem_strdup(opts->user)))
		goto out_free;
	if (opts->password && !(c->password = efs_mem_strdup(opts->password)))
		goto out_free;
	for (size_t i = 0; i < c->neps; i++)
		any_tls |= c->eps[i].tls;
	if (any_tls || opts->cacert || opts->cert) {
		r = efs_tls_ctx_new(&c->tls, opts->cacert, opts->cert, opts->key, err,
				    sizeof(err));
		if (r < 0) {
			efs_log_debug("etcd: TLS setup failed: %s", err);
			goto out_free;
		}
	}
	c->call_timeout_ms = opts->call_timeout_ms ? opts->call_timeout_ms : 5000;
	c->connect_timeout_ms = opts->connect_timeout_ms ? opts->connect_timeout_ms : 2000;
	c->ping_interval_ms = opts->ping_interval_ms ? opts->ping_interval_ms : 10000;
	if (c->ping_interval_ms < 5000)
		c->ping_interval_ms = 5000;
	c->ping_timeout_ms = opts->ping_timeout_ms ? opts->ping_timeout_ms : 4000;
	c->backoff_base_ms = opts->backoff_base_ms ? opts->backoff_base_ms : 25;
	c->backoff_max_ms = opts->backoff_max_ms ? opts->backoff_max_ms : 2000;
	if (c->backoff_max_ms < c->backoff_base_ms)
		c->backoff_max_ms = c->backoff_base_ms;
	c->max_recv_msg = opts->max_recv_msg ? opts->max_recv_msg : (size_t)256 << 20;
	c->seed = efs_clock_mono_ns() ^ ((uint64_t)(uintptr_t)c << 16) ^ (uint64_t)getpid();
	efs_list_init(&c->conns);
	efs_list_init(&c->dirty);
	efs_list_init(&c->done);

	uv_idle_init(loop, &c->idle);
	c->idle.data = c;
	uv_check_init(loop, &c->check);
	c->check.data = c;
	uv_check_start(&c->check, on_check);
	uv_unref((uv_handle_t *)&c->check);
	uv_timer_init(loop, &c->timer);
	c->timer.data = c;
	c->handles = 3;
	for (int i = 0; i < EFS_ETCD_NCHANNELS; i++) {
		struct channel *ch = &c->ch[i];

		ch->c = c;
		ch->idx = i;
		ch->ep = (size_t)i % c->neps;
		efs_list_init(&ch->waiting);
		efs_backoff_init(&ch->bo, c->backoff_base_ms, c->backoff_max_ms, ++c->seed);
		uv_timer_init(loop, &ch->timer);
		ch->timer.data = ch;
		c->handles++;
	}
	*ret = c;
	return 0;

out_free:
	client_free_mem(c);
	return r;
}

/* ---- Fault hooks ---- */

#if EFS_FAULT_HOOKS
void efs_etcd_fault_drop_reply(struct efs_etcd *c, enum efs_etcd_method m, unsigned nth)
{
	c->drop_method = m;
	c->drop_nth = nth;
}

void efs_etcd_fault_stall_loop(struct efs_etcd *c, uint32_t ms)
{
	c->stall_ms = ms;
	wake(c);
}

void efs_etcd_fault_watch_delay(struct efs_etcd *c, uint32_t ms)
{
	c->watch_delay_ms = ms;
}
#endif

uint32_t efs_etcd_watch_delay_ms(const struct efs_etcd *c)
{
#if EFS_FAULT_HOOKS
	return c->watch_delay_ms;
#else
	(void)c;
	return 0;
#endif
}

void efs_etcd_channel_failover(struct efs_etcd *c, enum efs_etcd_channel chn)
{
	struct channel *ch;

	if ((unsigned)chn >= EFS_ETCD_NCHANNELS || c->closing)
		return;
	ch = &c->ch[chn];
	if (ch->conn)
		efs_conn_fail(ch->conn, -ETIMEDOUT, "failover requested");
	else
		ch->ep = (ch->ep + 1) % c->neps;
}

/* ---- Test hooks ---- */

int efs_etcd_test_new(struct efs_etcd **ret, uv_loop_t *loop, const struct efs_etcd_opts *opts)
{
	int r = efs_etcd_new(ret, loop, opts);

	if (r == 0)
		(*ret)->ch[EFS_ETCD_CH_BULK].mem_peer = true;
	return r;
}

int efs_etcd_test_feed(struct efs_etcd *c, const uint8_t *data, size_t len)
{
	struct efs_list *l;

	efs_list_for_each(l, &c->conns) {
		struct efs_conn *conn = efs_list_entry(l, struct efs_conn, link);

		if (conn->mem_peer && conn->state != EFS_CONN_DEAD) {
			if (len)
				efs_conn_feed(conn, data, len);
			return 0;
		}
	}
	return -ENOTCONN;
}

const uint8_t *efs_etcd_test_output(const struct efs_etcd *c, size_t *ret_len)
{
	*ret_len = c->caplen;
	return c->cap;
}

void efs_etcd_test_output_clear(struct efs_etcd *c)
{
	c->caplen = 0;
}
