/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the etcd client's call layer (client.c, conn.c) without
 * network or etcd: the client's bulk channel talks to an in-memory peer
 * (efs_etcd_test_new) and the test plays etcd with nghttp2's own server
 * session. Client output is fed to the server session, the test scripts
 * the server's answers (HEADERS, DATA split anywhere, trailers,
 * trailers-only, RST_STREAM, GOAWAY, PING, SETTINGS) and the server's output
 * is fed back to the client, running the uv loop with UV_RUN_NOWAIT between
 * steps.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <nghttp2/nghttp2.h>
#include <uv.h>

#include "config.h"
#include "etcd/client-int.h"
#include "etcd/etcd.h"
#include "etcd/grpc.h"
#include "rpc.pb-c.h"
#include "util/mem.h"

#include "../support/leak.h"

#define ENDPOINT  "http://127.0.0.1:2379"
#define AUTHORITY "127.0.0.1:2379"

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define PREFACE_LEN (sizeof(preface) - 1)

/* ---- The fake etcd: nghttp2 server sessions ---- */

#define MAXREQ  64
#define MAXHDR  16
#define MAXGEN  8
#define MAXBODY (256 * 1024)

/* One request stream as the server saw it. */
struct sreq {
	int gen; /* server session (one per client connection) */
	int32_t id;
	int nhdr;
	char name[MAXHDR][32];
	char value[MAXHDR][160];
	uint8_t *body;
	size_t blen;
	bool ended;    /* END_STREAM from the client */
	bool rst;      /* RST_STREAM from the client */
	uint32_t rst_code;
};

/* A DATA payload the server sends; lives in the fixture until teardown. */
struct chunk {
	const uint8_t *p;
	size_t len, off;
};

static struct fixture {
	uv_loop_t loop;
	bool loop_up;
	struct efs_etcd *c;
	bool freed;
	int done_runs;

	nghttp2_session *s[MAXGEN];
	int nsess;
	int feed_gen; /* the session whose output goes to the client */
	bool hold;    /* keep feeding the older session after a new preface */
	size_t feed_piece; /* feed server bytes in pieces of this size (0: whole) */
	size_t unfed;      /* server bytes that found no live connection */

	struct sreq req[MAXREQ];
	int nreq;
	struct chunk chunks[256];
	int nchunks;
	uint8_t chunkbuf[256][512];
	int ping_acks;
	int settings_acks;
	int client_goaways;
} F;

static struct sreq *req_of(int gen, int32_t id)
{
	for (int i = 0; i < F.nreq; i++)
		if (F.req[i].gen == gen && F.req[i].id == id)
			return &F.req[i];
	return NULL;
}

static int srv_begin_headers(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct sreq *q;

	if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	cr_assert_lt(F.nreq, MAXREQ, "too many requests for the fixture");
	q = &F.req[F.nreq++];
	memset(q, 0, sizeof(*q));
	q->gen = (int)(intptr_t)ud;
	q->id = f->hd.stream_id;
	q->body = malloc(MAXBODY);
	cr_assert(q->body);
	return 0;
}

static int srv_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
		      size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags, void *ud)
{
	struct sreq *q = req_of((int)(intptr_t)ud, f->hd.stream_id);

	if (!q)
		return 0;
	cr_assert_lt(q->nhdr, MAXHDR);
	cr_assert_lt(namelen, sizeof(q->name[0]));
	cr_assert_lt(valuelen, sizeof(q->value[0]));
	memcpy(q->name[q->nhdr], name, namelen);
	q->name[q->nhdr][namelen] = '\0';
	memcpy(q->value[q->nhdr], value, valuelen);
	q->value[q->nhdr][valuelen] = '\0';
	q->nhdr++;
	return 0;
}

static int srv_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
		    size_t len, void *ud)
{
	struct sreq *q = req_of((int)(intptr_t)ud, id);

	if (!q)
		return 0;
	cr_assert_leq(q->blen + len, MAXBODY);
	memcpy(q->body + q->blen, data, len);
	q->blen += len;
	return 0;
}

static int srv_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct sreq *q = req_of((int)(intptr_t)ud, f->hd.stream_id);

	switch (f->hd.type) {
	case NGHTTP2_HEADERS:
	case NGHTTP2_DATA:
		if (q && (f->hd.flags & NGHTTP2_FLAG_END_STREAM))
			q->ended = true;
		break;
	case NGHTTP2_RST_STREAM:
		if (q) {
			q->rst = true;
			q->rst_code = f->rst_stream.error_code;
		}
		break;
	case NGHTTP2_PING:
		if (f->hd.flags & NGHTTP2_FLAG_ACK)
			F.ping_acks++;
		break;
	case NGHTTP2_SETTINGS:
		if (f->hd.flags & NGHTTP2_FLAG_ACK)
			F.settings_acks++;
		break;
	case NGHTTP2_GOAWAY:
		F.client_goaways++;
		break;
	default:
		break;
	}
	return 0;
}

static void srv_new_session(void)
{
	nghttp2_session_callbacks *cbs;
	int gen = F.nsess;

	cr_assert_lt(gen, MAXGEN);
	cr_assert_eq(nghttp2_session_callbacks_new(&cbs), 0);
	nghttp2_session_callbacks_set_on_begin_headers_callback(cbs, srv_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(cbs, srv_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, srv_data);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, srv_frame_recv);
	cr_assert_eq(nghttp2_session_server_new(&F.s[gen], cbs, (void *)(intptr_t)gen), 0);
	nghttp2_session_callbacks_del(cbs);
	/* The server's SETTINGS make the client's connection usable. */
	cr_assert_eq(nghttp2_submit_settings(F.s[gen], NGHTTP2_FLAG_NONE, NULL, 0), 0);
	F.nsess++;
	if (!F.hold)
		F.feed_gen = gen;
}

/* Hands what the client wrote to the server session of its connection; a
 * client preface starts a new session (a new connection). */
static void client_to_server(void)
{
	const uint8_t *out;
	uint8_t *buf;
	size_t len, off = 0;

	out = efs_etcd_test_output(F.c, &len);
	if (!len)
		return;
	buf = malloc(len);
	cr_assert(buf);
	memcpy(buf, out, len);
	efs_etcd_test_output_clear(F.c);
	while (off < len) {
		size_t end = len;
		ssize_t n;

		if (len - off >= PREFACE_LEN && !memcmp(buf + off, preface, PREFACE_LEN)) {
			srv_new_session();
		} else {
			cr_assert_gt(F.nsess, 0, "client wrote before its preface");
		}
		/* A later preface belongs to the next connection. */
		for (size_t i = off + 1; i + PREFACE_LEN <= len; i++) {
			if (!memcmp(buf + i, preface, PREFACE_LEN)) {
				end = i;
				break;
			}
		}
		n = nghttp2_session_mem_recv(F.s[F.nsess - 1], buf + off, end - off);
		cr_assert_eq(n, (ssize_t)(end - off), "server session rejected client bytes: %s",
			     nghttp2_strerror((int)n));
		off = end;
	}
	free(buf);
}

/* Feeds the server's pending output to the client. */
static void server_to_client(void)
{
	nghttp2_session *s;

	if (!F.nsess)
		return;
	s = F.s[F.feed_gen];
	for (;;) {
		const uint8_t *data;
		ssize_t n = nghttp2_session_mem_send(s, &data);

		cr_assert_geq(n, 0);
		if (n == 0)
			break;
		for (size_t off = 0; off < (size_t)n;) {
			size_t piece = (size_t)n - off;

			if (F.feed_piece && piece > F.feed_piece)
				piece = F.feed_piece;
			if (efs_etcd_test_feed(F.c, data + off, piece) != 0)
				F.unfed += piece;
			off += piece;
		}
	}
}

static void pump(void)
{
	for (int i = 0; i < 8; i++) {
		uv_run(&F.loop, UV_RUN_NOWAIT);
		if (F.c && !F.freed) {
			client_to_server();
			server_to_client();
		}
	}
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Pumps until |*flag| becomes true or |ms| pass; returns the flag. */
static bool pump_until(const bool *flag, unsigned ms)
{
	uint64_t end = now_ms() + ms;

	for (;;) {
		pump();
		if (*flag || now_ms() >= end)
			return *flag;
		usleep(500);
	}
}

static void pump_for(unsigned ms)
{
	bool never = false;

	pump_until(&never, ms);
}

/* ---- Server responses ---- */

static nghttp2_session *sess_of(const struct sreq *q)
{
	return F.s[q->gen];
}

static void flush_if_fed(const struct sreq *q)
{
	if (q->gen == F.feed_gen)
		server_to_client();
}

/* |kv| is a NULL-terminated list of name, value pairs. */
static size_t make_nv(nghttp2_nv *nv, const char *const *kv)
{
	size_t n = 0;

	for (; kv[0]; kv += 2, n++) {
		nv[n].name = (uint8_t *)(uintptr_t)kv[0];
		nv[n].value = (uint8_t *)(uintptr_t)kv[1];
		nv[n].namelen = strlen(kv[0]);
		nv[n].valuelen = strlen(kv[1]);
		nv[n].flags = NGHTTP2_NV_FLAG_NONE;
	}
	return n;
}

static const char *const resp_hdrs[] = { ":status", "200", "content-type", "application/grpc",
					 NULL };
static const char *const ok_trailers[] = { "grpc-status", "0", NULL };

/* Response HEADERS without END_STREAM. */
static void srv_headers(const struct sreq *q, const char *const *kv)
{
	nghttp2_nv nv[16];
	size_t n = make_nv(nv, kv);

	cr_assert_eq(nghttp2_submit_headers(sess_of(q), NGHTTP2_FLAG_NONE, q->id, NULL, nv, n,
					    NULL), 0);
	flush_if_fed(q);
}

/* A single HEADERS with END_STREAM (trailers-only). */
static void srv_trailers_only(const struct sreq *q, const char *const *kv)
{
	nghttp2_nv nv[16];
	size_t n = make_nv(nv, kv);

	cr_assert_eq(nghttp2_submit_response(sess_of(q), q->id, nv, n, NULL), 0);
	flush_if_fed(q);
}

static void srv_trailers(const struct sreq *q, const char *const *kv)
{
	nghttp2_nv nv[16];
	size_t n = make_nv(nv, kv);

	cr_assert_eq(nghttp2_submit_trailer(sess_of(q), q->id, nv, n), 0);
	flush_if_fed(q);
}

static ssize_t chunk_read(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
			  uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct chunk *ch = src->ptr;
	size_t n = ch->len - ch->off;

	if (n > len)
		n = len;
	memcpy(buf, ch->p + ch->off, n);
	ch->off += n;
	if (ch->off == ch->len)
		*flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
	return (ssize_t)n;
}

/* One DATA frame (or several if |len| exceeds the frame size) carrying
 * |data|, without END_STREAM, sent at once when |q| is fed. */
static void srv_data_frame(const struct sreq *q, const uint8_t *data, size_t len)
{
	struct chunk *ch;
	nghttp2_data_provider prd;

	cr_assert_lt(F.nchunks, 256);
	cr_assert_leq(len, sizeof(F.chunkbuf[0]));
	memcpy(F.chunkbuf[F.nchunks], data, len);
	ch = &F.chunks[F.nchunks];
	ch->p = F.chunkbuf[F.nchunks];
	ch->len = len;
	ch->off = 0;
	F.nchunks++;
	prd.source.ptr = ch;
	prd.read_callback = chunk_read;
	cr_assert_eq(nghttp2_submit_data(sess_of(q), NGHTTP2_FLAG_NONE, q->id, &prd), 0);
	flush_if_fed(q);
}

static void srv_rst(const struct sreq *q, uint32_t code)
{
	cr_assert_eq(nghttp2_submit_rst_stream(sess_of(q), NGHTTP2_FLAG_NONE, q->id, code), 0);
	flush_if_fed(q);
}

/* Packs |m| behind a gRPC prefix into |buf|; returns the frame length. */
static size_t grpc_frame_of(const ProtobufCMessage *m, uint8_t *buf, size_t size)
{
	size_t n = protobuf_c_message_get_packed_size(m);

	cr_assert_leq(n + 5, size);
	buf[0] = 0;
	buf[1] = (uint8_t)(n >> 24);
	buf[2] = (uint8_t)(n >> 16);
	buf[3] = (uint8_t)(n >> 8);
	buf[4] = (uint8_t)n;
	cr_assert_eq(protobuf_c_message_pack(m, buf + 5), n);
	return n + 5;
}

/* Full normal reply: HEADERS, one message in one DATA, OK trailers. */
static void srv_reply(const struct sreq *q, const ProtobufCMessage *m)
{
	uint8_t buf[512];
	size_t n = grpc_frame_of(m, buf, sizeof(buf));

	srv_headers(q, resp_hdrs);
	srv_data_frame(q, buf, n);
	srv_trailers(q, ok_trailers);
}

/* RangeResponse{header{revision 5}, kvs[{key "k", value "v", mod 5}], count 1}. */
static size_t range_response(uint8_t *buf, size_t size)
{
	Etcdserverpb__ResponseHeader h = ETCDSERVERPB__RESPONSE_HEADER__INIT;
	Etcdserverpb__RangeResponse r = ETCDSERVERPB__RANGE_RESPONSE__INIT;
	Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT;
	Mvccpb__KeyValue *kvs[1] = { &kv };

	h.revision = 5;
	kv.key.data = (uint8_t *)"k";
	kv.key.len = 1;
	kv.value.data = (uint8_t *)"v";
	kv.value.len = 1;
	kv.mod_revision = 5;
	r.header = &h;
	r.n_kvs = 1;
	r.kvs = kvs;
	r.count = 1;
	return grpc_frame_of(&r.base, buf, size);
}

static void srv_reply_range(const struct sreq *q)
{
	uint8_t buf[128];
	size_t n = range_response(buf, sizeof(buf));

	srv_headers(q, resp_hdrs);
	srv_data_frame(q, buf, n);
	srv_trailers(q, ok_trailers);
}

static void srv_reply_empty(const struct sreq *q, const ProtobufCMessageDescriptor *d)
{
	uint64_t mem[64];

	protobuf_c_message_init(d, mem);
	srv_reply(q, (const ProtobufCMessage *)mem);
}

static const char *hdr(const struct sreq *q, const char *name)
{
	for (int i = 0; i < q->nhdr; i++)
		if (!strcmp(q->name[i], name))
			return q->value[i];
	return NULL;
}

static int hdr_count(const struct sreq *q, const char *name)
{
	int n = 0;

	for (int i = 0; i < q->nhdr; i++)
		n += !strcmp(q->name[i], name);
	return n;
}

/* ---- Client side ---- */

struct res {
	int n;            /* callback runs */
	bool started;     /* efs_etcd_call returned */
	bool inline_run;  /* the callback ran before efs_etcd_call returned */
	bool done;
	int err;
	int gs;
	bool unknown;
	char msg[EFS_GRPC_MESSAGE_MAX + 64];
	ProtobufCMessage *resp;
	bool consistent;  /* err == 0 exactly when resp != NULL; message set */
};

static void on_result(struct efs_etcd_result *r, void *arg)
{
	struct res *x = arg;

	x->n++;
	cr_assert_eq(x->n, 1, "a call callback ran twice");
	x->inline_run |= !x->started;
	x->done = true;
	x->err = r->err;
	x->gs = r->grpc_status;
	x->unknown = r->outcome_unknown;
	x->consistent = r->message && (r->err == 0) == (r->resp != NULL);
	snprintf(x->msg, sizeof(x->msg), "%s", r->message ? r->message : "(null)");
	if (x->resp)
		protobuf_c_message_free_unpacked(x->resp, efs_mem_protobuf());
	x->resp = r->resp;
	r->resp = NULL;
}

static void res_done(struct res *x)
{
	if (x->resp)
		protobuf_c_message_free_unpacked(x->resp, efs_mem_protobuf());
	x->resp = NULL;
}

static struct efs_etcd_call *start_co(enum efs_etcd_method m, const ProtobufCMessage *req,
				      const struct efs_etcd_callopts *co, struct res *x)
{
	struct efs_etcd_call *call = NULL;

	memset(x, 0, sizeof(*x));
	cr_assert_eq(efs_etcd_call(F.c, m, req, co, on_result, x, &call), 0);
	x->started = true;
	cr_assert_not_null(call);
	return call;
}

static Etcdserverpb__RangeRequest range_req = ETCDSERVERPB__RANGE_REQUEST__INIT;
static Etcdserverpb__PutRequest put_req = ETCDSERVERPB__PUT_REQUEST__INIT;

static struct efs_etcd_call *start_range(struct res *x)
{
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	return start_co(EFS_ETCD_RANGE, &range_req.base, NULL, x);
}

static struct efs_etcd_call *start_put(struct res *x)
{
	put_req.key.data = (uint8_t *)"pk";
	put_req.key.len = 2;
	put_req.value.data = (uint8_t *)"pv";
	put_req.value.len = 2;
	return start_co(EFS_ETCD_PUT, &put_req.base, NULL, x);
}

static void expect_once(const struct res *x)
{
	cr_assert_eq(x->n, 1, "callback ran %d times", x->n);
	cr_assert(!x->inline_run, "callback ran inline");
	cr_assert(x->consistent, "inconsistent result (err %d, resp %p)", x->err,
		  (void *)x->resp);
}

static void setup_opts(const struct efs_etcd_opts *o)
{
	struct efs_etcd_opts d = { .endpoints = ENDPOINT, .call_timeout_ms = 3000,
				   .backoff_base_ms = 1, .backoff_max_ms = 4 };

	memset(&F, 0, sizeof(F));
	cr_assert_eq(uv_loop_init(&F.loop), 0);
	F.loop_up = true;
	cr_assert_eq(efs_etcd_test_new(&F.c, &F.loop, o ? o : &d), 0);
}

static void setup(void)
{
	setup_opts(NULL);
}

static void on_freed(void *arg)
{
	(void)arg;
	F.freed = true;
	F.done_runs++;
}

static void free_sessions(void)
{
	for (int i = 0; i < F.nsess; i++)
		nghttp2_session_del(F.s[i]);
	F.nsess = 0;
	for (int i = 0; i < F.nreq; i++)
		free(F.req[i].body);
	F.nreq = 0;
}

/* Frees the client, waits for its done callback, closes the loop. */
static void teardown_client(void)
{
	uint64_t end;

	if (F.c && !F.freed) {
		efs_etcd_free(F.c, on_freed, NULL);
		end = now_ms() + 3000;
		while (!F.freed && now_ms() < end) {
			uv_run(&F.loop, UV_RUN_NOWAIT);
			usleep(200);
		}
		cr_assert(F.freed, "efs_etcd_free never finished");
		cr_assert_eq(F.done_runs, 1);
	}
	if (F.loop_up) {
		uv_run(&F.loop, UV_RUN_NOWAIT);
		cr_assert_eq(uv_loop_close(&F.loop), 0, "handles left on the loop");
		F.loop_up = false;
	}
	free_sessions();
}

/* Ends a test: frees everything, then checks for leaks. A macro, so that
 * the check runs in the test's own frame (see leak.h). */
#define finish()                                                                                  \
	do {                                                                                      \
		teardown_client();                                                                \
		efs_test_assert_no_leaks();                                                       \
	} while (0)

static void fini(void)
{
	efs_mem_fail_reset();
	if (F.loop_up && F.c && !F.freed) {
		efs_etcd_free(F.c, on_freed, NULL);
		for (int i = 0; i < 2000 && !F.freed; i++)
			uv_run(&F.loop, UV_RUN_NOWAIT);
	}
	free_sessions();
}

TestSuite(client, .fini = fini, .timeout = 60);

/* Waits for the next request to appear on the server; returns it. */
static struct sreq *wait_req(int idx)
{
	uint64_t end = now_ms() + 2000;

	while (F.nreq <= idx && now_ms() < end) {
		pump();
		usleep(200);
	}
	cr_assert_gt(F.nreq, idx, "request %d never reached the server", idx);
	/* Let the body arrive too. */
	for (int i = 0; i < 50 && !F.req[idx].ended && !F.req[idx].rst; i++)
		pump();
	return &F.req[idx];
}

/* ---- Request headers and body ---- */

static const struct {
	enum efs_etcd_method m;
	const char *path;
	const ProtobufCMessageDescriptor *req;
} method_table[] = {
	{ EFS_ETCD_RANGE, "/etcdserverpb.KV/Range", &etcdserverpb__range_request__descriptor },
	{ EFS_ETCD_PUT, "/etcdserverpb.KV/Put", &etcdserverpb__put_request__descriptor },
	{ EFS_ETCD_DELETE_RANGE, "/etcdserverpb.KV/DeleteRange",
	  &etcdserverpb__delete_range_request__descriptor },
	{ EFS_ETCD_TXN, "/etcdserverpb.KV/Txn", &etcdserverpb__txn_request__descriptor },
	{ EFS_ETCD_COMPACT, "/etcdserverpb.KV/Compact",
	  &etcdserverpb__compaction_request__descriptor },
	{ EFS_ETCD_LEASE_GRANT, "/etcdserverpb.Lease/LeaseGrant",
	  &etcdserverpb__lease_grant_request__descriptor },
	{ EFS_ETCD_LEASE_REVOKE, "/etcdserverpb.Lease/LeaseRevoke",
	  &etcdserverpb__lease_revoke_request__descriptor },
	{ EFS_ETCD_LEASE_TIME_TO_LIVE, "/etcdserverpb.Lease/LeaseTimeToLive",
	  &etcdserverpb__lease_time_to_live_request__descriptor },
	{ EFS_ETCD_LEASE_LEASES, "/etcdserverpb.Lease/LeaseLeases",
	  &etcdserverpb__lease_leases_request__descriptor },
	{ EFS_ETCD_STATUS, "/etcdserverpb.Maintenance/Status",
	  &etcdserverpb__status_request__descriptor },
	{ EFS_ETCD_MEMBER_LIST, "/etcdserverpb.Cluster/MemberList",
	  &etcdserverpb__member_list_request__descriptor },
	{ EFS_ETCD_AUTHENTICATE, "/etcdserverpb.Auth/Authenticate",
	  &etcdserverpb__authenticate_request__descriptor },
};
#define NMETHODS (sizeof(method_table) / sizeof(method_table[0]))

static const ProtobufCMessageDescriptor *const resp_desc[] = {
	&etcdserverpb__range_response__descriptor,
	&etcdserverpb__put_response__descriptor,
	&etcdserverpb__delete_range_response__descriptor,
	&etcdserverpb__txn_response__descriptor,
	&etcdserverpb__compaction_response__descriptor,
	&etcdserverpb__lease_grant_response__descriptor,
	&etcdserverpb__lease_revoke_response__descriptor,
	&etcdserverpb__lease_time_to_live_response__descriptor,
	&etcdserverpb__lease_leases_response__descriptor,
	&etcdserverpb__status_response__descriptor,
	&etcdserverpb__member_list_response__descriptor,
	&etcdserverpb__authenticate_response__descriptor,
};

/* grpc-timeout: 1-8 digits and a unit; returns the value in ms. */
static long parse_timeout(const char *v)
{
	size_t n = strspn(v, "0123456789");
	long val;

	cr_assert(n >= 1 && n <= 8, "grpc-timeout '%s' needs 1-8 digits", v);
	cr_assert(v[n] && strchr("HMSmun", v[n]) && !v[n + 1], "grpc-timeout '%s' unit", v);
	val = strtol(v, NULL, 10);
	switch (v[n]) {
	case 'H': return val * 3600000;
	case 'M': return val * 60000;
	case 'S': return val * 1000;
	case 'm': return val;
	case 'u': return val / 1000;
	default: return val / 1000000;
	}
}

Test(client, every_method_sends_the_request_headers_of_the_spec, .init = setup)
{
	struct res x[NMETHODS];
	uint64_t mem[NMETHODS][64];
	static const char *const expected[] = { ":method", ":scheme", ":path", ":authority",
						"content-type", "te", "grpc-timeout" };
	struct efs_etcd_callopts co = { .timeout_ms = 1500 };

	cr_assert_eq(NMETHODS, EFS_ETCD_NMETHODS);
	for (size_t i = 0; i < NMETHODS; i++) {
		protobuf_c_message_init(method_table[i].req, mem[i]);
		start_co(method_table[i].m, (ProtobufCMessage *)mem[i], &co, &x[i]);
	}
	wait_req((int)NMETHODS - 1);
	cr_assert_eq(F.nreq, (int)NMETHODS);
	for (size_t i = 0; i < NMETHODS; i++) {
		struct sreq *q = &F.req[i];
		long t;

		/* Exactly these headers, each once, nothing else. */
		cr_assert_eq(q->nhdr, (int)(sizeof(expected) / sizeof(expected[0])),
			     "%s: %d headers", method_table[i].path, q->nhdr);
		for (size_t k = 0; k < sizeof(expected) / sizeof(expected[0]); k++)
			cr_assert_eq(hdr_count(q, expected[k]), 1, "%s: header %s",
				     method_table[i].path, expected[k]);
		cr_assert_str_eq(hdr(q, ":method"), "POST");
		cr_assert_str_eq(hdr(q, ":scheme"), "http");
		cr_assert_str_eq(hdr(q, ":path"), method_table[i].path);
		cr_assert_str_eq(hdr(q, ":authority"), AUTHORITY);
		cr_assert_str_eq(hdr(q, "content-type"), "application/grpc");
		cr_assert_str_eq(hdr(q, "te"), "trailers");
		t = parse_timeout(hdr(q, "grpc-timeout"));
		cr_assert(t > 1000 && t <= 1500, "grpc-timeout %s for a 1500 ms call",
			  hdr(q, "grpc-timeout"));
		/* Pseudo-headers come first (nghttp2 would refuse otherwise). */
		cr_assert_eq(q->name[0][0], ':');
		cr_assert(q->ended, "%s: request not ended", method_table[i].path);
		cr_assert_eq(efs_etcd_method_name(method_table[i].m)[0],
			     strrchr(method_table[i].path, '/')[1]);
	}
	/* Answer every call so that each completes with its response type. */
	for (size_t i = 0; i < NMETHODS; i++)
		srv_reply_empty(&F.req[i], resp_desc[i]);
	pump();
	for (size_t i = 0; i < NMETHODS; i++) {
		expect_once(&x[i]);
		cr_assert_eq(x[i].err, 0, "%s: %d %s", method_table[i].path, x[i].err, x[i].msg);
		cr_assert_eq(x[i].resp->descriptor, resp_desc[i]);
		res_done(&x[i]);
	}
	finish();
}

Test(client, default_timeout_is_sent_as_grpc_timeout, .init = setup)
{
	struct res x;
	long t;

	start_range(&x);
	t = parse_timeout(hdr(wait_req(0), "grpc-timeout"));
	cr_assert(t > 2000 && t <= 3000, "grpc-timeout %ld for the 3000 ms default", t);
	finish();
}

Test(client, a_wrong_request_type_is_einval_and_no_callback, .init = setup)
{
	struct res x = { 0 };

	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_PUT, &range_req.base, NULL, on_result, &x,
				   NULL), -EINVAL);
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_NMETHODS, &range_req.base, NULL, on_result, &x,
				   NULL), -EINVAL);
	pump();
	cr_assert_eq(x.n, 0);
	cr_assert_eq(F.nreq, 0);
	finish();
	cr_assert_eq(x.n, 0);
}

static void stream_msg(struct efs_etcd_stream *s, const ProtobufCMessage *m, void *arg)
{
}

static void stream_closed(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg)
{
	struct res *x = arg;

	x->n++;
	x->err = r->err;
	x->done = true;
}

Test(client, streams_send_hasleader_and_no_grpc_timeout, .init = setup)
{
	struct efs_etcd_stream *s;
	struct res x = { 0 };
	struct sreq *q;

	cr_assert_eq(efs_etcd_stream_open(F.c, EFS_ETCD_STREAM_WATCH, EFS_ETCD_CH_BULK,
					  stream_msg, stream_closed, &x, &s), 0);
	q = wait_req(0);
	cr_assert_str_eq(hdr(q, ":path"), "/etcdserverpb.Watch/Watch");
	cr_assert_str_eq(hdr(q, ":method"), "POST");
	cr_assert_str_eq(hdr(q, "te"), "trailers");
	cr_assert_str_eq(hdr(q, "content-type"), "application/grpc");
	cr_assert_eq(hdr_count(q, "hasleader"), 1);
	cr_assert_str_eq(hdr(q, "hasleader"), "true");
	cr_assert_null(hdr(q, "grpc-timeout"));
	cr_assert(!q->ended, "a bidi stream must stay open");
	efs_etcd_stream_close(s);
	pump();
	cr_assert_eq(x.n, 0, "close callback must not run after efs_etcd_stream_close");
	finish();
}

Test(client, the_token_is_sent_after_authentication)
{
	struct efs_etcd_opts o = { .endpoints = ENDPOINT, .user = "alice", .password = "pw",
				   .backoff_base_ms = 1, .backoff_max_ms = 4 };
	Etcdserverpb__AuthenticateResponse ar = ETCDSERVERPB__AUTHENTICATE_RESPONSE__INIT;
	Etcdserverpb__AuthenticateRequest *areq;
	struct sreq *a, *q;
	struct res x;

	setup_opts(&o);
	start_range(&x);
	a = wait_req(0);
	cr_assert_str_eq(hdr(a, ":path"), "/etcdserverpb.Auth/Authenticate");
	cr_assert_null(hdr(a, "token"));
	cr_assert_geq(a->blen, 5);
	areq = etcdserverpb__authenticate_request__unpack(NULL, a->blen - 5, a->body + 5);
	cr_assert_not_null(areq);
	cr_assert_str_eq(areq->name, "alice");
	cr_assert_str_eq(areq->password, "pw");
	etcdserverpb__authenticate_request__free_unpacked(areq, NULL);
	pump();
	cr_assert_eq(F.nreq, 1, "the Range must wait for the token");
	ar.token = (char *)"tok-42.7";
	srv_reply(a, &ar.base);
	q = wait_req(1);
	cr_assert_str_eq(hdr(q, ":path"), "/etcdserverpb.KV/Range");
	cr_assert_eq(hdr_count(q, "token"), 1);
	cr_assert_str_eq(hdr(q, "token"), "tok-42.7");
	srv_reply_range(q);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	res_done(&x);
	finish();
}

Test(client, the_body_is_one_framed_message_equal_to_the_request, .init = setup)
{
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__PutRequest *got;
	static uint8_t big[100000];
	uint8_t *want;
	size_t wlen;
	struct sreq *q;
	struct res x;

	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7 + 3);
	p.key.data = (uint8_t *)"k\0x";
	p.key.len = 3;
	p.value.data = big;
	p.value.len = sizeof(big);
	p.lease = 77;
	p.prev_kv = true;
	wlen = protobuf_c_message_get_packed_size(&p.base);
	want = malloc(wlen);
	cr_assert(want);
	protobuf_c_message_pack(&p.base, want);

	start_co(EFS_ETCD_PUT, &p.base, NULL, &x);
	/* Spans several DATA frames and a server flow-control window. */
	q = wait_req(0);
	cr_assert(q->ended, "request body not ended with END_STREAM");
	cr_assert_eq(q->blen, wlen + 5);
	cr_assert_eq(q->body[0], 0, "compressed flag");
	cr_assert_eq(((size_t)q->body[1] << 24 | (size_t)q->body[2] << 16 |
		      (size_t)q->body[3] << 8 | q->body[4]), wlen);
	cr_assert_eq(memcmp(q->body + 5, want, wlen), 0);
	got = etcdserverpb__put_request__unpack(NULL, q->blen - 5, q->body + 5);
	cr_assert_not_null(got);
	cr_assert_eq(got->key.len, 3);
	cr_assert_eq(memcmp(got->key.data, "k\0x", 3), 0);
	cr_assert_eq(got->lease, 77);
	cr_assert(got->prev_kv);
	etcdserverpb__put_request__free_unpacked(got, NULL);
	free(want);
	srv_reply_empty(q, &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	res_done(&x);
	finish();
}

Test(client, an_empty_request_is_five_zero_bytes, .init = setup)
{
	Etcdserverpb__StatusRequest sr = ETCDSERVERPB__STATUS_REQUEST__INIT;
	static const uint8_t zeros[5];
	struct sreq *q;
	struct res x;

	start_co(EFS_ETCD_STATUS, &sr.base, NULL, &x);
	q = wait_req(0);
	cr_assert(q->ended);
	cr_assert_eq(q->blen, 5);
	cr_assert_eq(memcmp(q->body, zeros, 5), 0);
	finish();
	expect_once(&x);
	cr_assert_eq(x.err, -ECANCELED);
}

/* ---- Responses ---- */

static void check_range_resp(const struct res *x)
{
	const Etcdserverpb__RangeResponse *r = (const Etcdserverpb__RangeResponse *)x->resp;

	cr_assert_eq(x->err, 0, "%d %s", x->err, x->msg);
	cr_assert_eq(x->gs, 0);
	cr_assert(!x->unknown);
	cr_assert_not_null(r);
	cr_assert_eq(r->base.descriptor, &etcdserverpb__range_response__descriptor);
	cr_assert_not_null(r->header);
	cr_assert_eq(r->header->revision, 5);
	cr_assert_eq(r->n_kvs, 1);
	cr_assert_eq(r->kvs[0]->key.len, 1);
	cr_assert_eq(r->kvs[0]->key.data[0], 'k');
	cr_assert_eq(r->kvs[0]->value.len, 1);
	cr_assert_eq(r->kvs[0]->value.data[0], 'v');
	cr_assert_eq(r->kvs[0]->mod_revision, 5);
	cr_assert_eq(r->count, 1);
}

Test(client, a_reply_split_across_data_frames_at_every_byte_decodes, .init = setup)
{
	uint8_t buf[128];
	size_t n = range_response(buf, sizeof(buf));

	for (size_t split = 0; split <= n; split++) {
		struct res x;
		struct sreq *q;

		start_range(&x);
		q = wait_req((int)split);
		srv_headers(q, resp_hdrs);
		srv_data_frame(q, buf, split);
		pump();
		cr_assert_eq(x.n, 0, "split %zu: completed before the trailers", split);
		srv_data_frame(q, buf + split, n - split);
		pump();
		cr_assert_eq(x.n, 0, "split %zu: completed before the trailers", split);
		srv_trailers(q, ok_trailers);
		pump();
		expect_once(&x);
		check_range_resp(&x);
		res_done(&x);
	}
	finish();
}

Test(client, server_bytes_fed_one_at_a_time_still_decode, .init = setup)
{
	struct res x;
	struct sreq *q;

	start_range(&x);
	q = wait_req(0);
	F.feed_piece = 1;
	srv_reply_range(q);
	pump();
	expect_once(&x);
	check_range_resp(&x);
	res_done(&x);
	finish();
}

Test(client, ping_and_settings_during_a_call_are_acked_and_harmless, .init = setup)
{
	static const nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 32768 },
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20 },
	};
	uint8_t opaque[8] = "etcfs-ok";
	struct res x;
	struct sreq *q;
	int acks;

	start_range(&x);
	q = wait_req(0);
	acks = F.settings_acks;
	srv_headers(q, resp_hdrs);
	cr_assert_eq(nghttp2_submit_ping(F.s[0], NGHTTP2_FLAG_NONE, opaque), 0);
	cr_assert_eq(nghttp2_submit_settings(F.s[0], NGHTTP2_FLAG_NONE, iv, 2), 0);
	server_to_client();
	pump();
	cr_assert_eq(F.ping_acks, 1, "PING not acknowledged");
	cr_assert_gt(F.settings_acks, acks, "SETTINGS not acknowledged");
	cr_assert_eq(x.n, 0);
	{
		uint8_t buf[128];
		size_t n = range_response(buf, sizeof(buf));

		srv_data_frame(q, buf, n);
		srv_trailers(q, ok_trailers);
	}
	pump();
	expect_once(&x);
	check_range_resp(&x);
	res_done(&x);
	finish();
}

Test(client, a_trailers_only_error_maps_status_and_decodes_the_message, .init = setup)
{
	static const char *const err[] = {
		":status", "200", "content-type", "application/grpc", "grpc-status", "3",
		"grpc-message", "etcdserver%3A key is not provided %25 caf%C3%A9 %zz", NULL
	};
	struct res x, y;

	start_range(&x);
	srv_trailers_only(wait_req(0), err);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -EINVAL, "err %d", x.err);
	cr_assert_eq(x.gs, 3);
	cr_assert(!x.unknown);
	cr_assert_str_eq(x.msg, "etcdserver: key is not provided % caf\xc3\xa9 %zz");
	cr_assert_eq(F.nreq, 1, "INVALID_ARGUMENT must not be retried");

	/* The same for a mutation: known not applied. */
	start_put(&y);
	srv_trailers_only(wait_req(1), err);
	pump();
	expect_once(&y);
	cr_assert_eq(y.err, -EINVAL);
	cr_assert(!y.unknown);
	cr_assert_eq(F.nreq, 2);
	finish();
}

Test(client, an_error_in_separate_trailers_after_headers, .init = setup)
{
	static const char *const tr[] = { "grpc-status", "5", "grpc-message",
					  "etcdserver: requested lease not found", NULL };
	struct res x;
	struct sreq *q;

	start_range(&x);
	q = wait_req(0);
	srv_headers(q, resp_hdrs);
	pump();
	srv_trailers(q, tr);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -ENOENT);
	cr_assert_eq(x.gs, 5);
	cr_assert_str_eq(x.msg, "etcdserver: requested lease not found");
	finish();
}

Test(client, ok_status_without_a_message_is_eproto, .init = setup)
{
	static const char *const okonly[] = { ":status", "200", "content-type",
					      "application/grpc", "grpc-status", "0", NULL };
	struct res x;

	start_range(&x);
	srv_trailers_only(wait_req(0), okonly);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -EPROTO);
	finish();
}

static const char *const http503[] = { ":status", "503", "content-type", "text/plain", NULL };

Test(client, http_503_without_grpc_status_is_unavailable, .init = setup)
{
	struct efs_etcd_callopts nr = { .no_retry = true };
	struct res x, y;

	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	start_co(EFS_ETCD_RANGE, &range_req.base, &nr, &x);
	srv_trailers_only(wait_req(0), http503);
	pump();
	expect_once(&x);
	cr_assert_eq(x.gs, 14, "grpc status %d", x.gs);
	cr_assert_eq(x.err, -ENOTCONN, "err %d", x.err);
	cr_assert(!x.unknown);
	pump_for(20);
	cr_assert_eq(F.nreq, 1, "no_retry call was retried");

	/* A sent Put: UNAVAILABLE leaves its outcome unknown, no retry. */
	start_put(&y);
	srv_trailers_only(wait_req(1), http503);
	pump();
	expect_once(&y);
	cr_assert_eq(y.gs, 14);
	cr_assert_eq(y.err, -ENOTCONN);
	cr_assert(y.unknown, "a sent Put that got UNAVAILABLE has an unknown outcome");
	pump_for(20);
	cr_assert_eq(F.nreq, 2, "Put was retried after UNAVAILABLE");
	finish();
}

Test(client, http_503_on_an_idempotent_range_is_retried, .init = setup)
{
	struct res x;

	start_range(&x);
	srv_trailers_only(wait_req(0), http503);
	pump();
	cr_assert_eq(x.n, 0);
	srv_reply_range(wait_req(1));
	pump();
	expect_once(&x);
	check_range_resp(&x);
	cr_assert_str_eq(hdr(&F.req[1], ":path"), "/etcdserverpb.KV/Range");
	res_done(&x);
	finish();
}

/*
 * A refusal before proposing (|hdrs|, trailers-only, saying |what|) is
 * safe to resend even for a mutation: a Put refused twice, then answered,
 * succeeds; with no retries asked it fails at once with -EAGAIN, known not
 * applied.
 */
static void refusal_is_resent(const char *const *hdrs, const char *what)
{
	struct efs_etcd_callopts nr = { .no_retry = true };
	struct res x, y;

	start_put(&x);
	srv_trailers_only(wait_req(0), hdrs);
	pump();
	cr_assert_eq(x.n, 0, "a Put refused with '%s' was failed at once", what);
	srv_trailers_only(wait_req(1), hdrs);
	pump();
	cr_assert_eq(x.n, 0, "a second '%s' was failed at once", what);
	srv_reply_empty(wait_req(2), &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "err %d", x.err);
	cr_assert_str_eq(hdr(&F.req[2], ":path"), "/etcdserverpb.KV/Put");
	res_done(&x);

	start_co(EFS_ETCD_PUT, &put_req.base, &nr, &y);
	srv_trailers_only(wait_req(3), hdrs);
	pump();
	expect_once(&y);
	cr_assert_eq(y.err, -EAGAIN, "%s: err %d", what, y.err);
	cr_assert(!y.unknown, "%s: outcome unknown", what);
	pump_for(20);
	cr_assert_eq(F.nreq, 4, "a no_retry Put was resent");
	finish();
}

Test(client, no_leader_on_a_sent_put_is_resent_within_its_deadline, .init = setup)
{
	static const char *const noleader[] = { ":status", "200", "content-type",
						"application/grpc", "grpc-status", "14",
						"grpc-message", "etcdserver: no leader", NULL };

	refusal_is_resent(noleader, "no leader");
}

/* etcd 3.4 sends raft's ErrProposalDropped raw (UNKNOWN): a member without
 * a leader, or a leader handing over, refused it before it entered the
 * log. Answered at once through an election, it used to fail at once and
 * the filesystem spent its retries in milliseconds (bursts of EIO while a
 * member was SIGSTOPped, test_session_faults). */
Test(client, proposal_dropped_on_a_sent_put_is_resent_within_its_deadline, .init = setup)
{
	static const char *const dropped[] = { ":status", "200", "content-type",
					       "application/grpc", "grpc-status", "2",
					       "grpc-message", "raft proposal dropped", NULL };

	refusal_is_resent(dropped, "raft proposal dropped");
}

Test(client, http_404_is_unimplemented, .init = setup)
{
	static const char *const h404[] = { ":status", "404", NULL };
	struct res x;

	start_range(&x);
	srv_trailers_only(wait_req(0), h404);
	pump();
	expect_once(&x);
	cr_assert_eq(x.gs, 12);
	cr_assert_eq(x.err, -ENOSYS);
	finish();
}

Test(client, rst_refused_stream_resends_a_put_on_the_wire, .init = setup)
{
	struct efs_etcd_stats st;
	struct sreq *a, *b;
	struct res x;

	start_put(&x);
	a = wait_req(0);
	srv_rst(a, NGHTTP2_REFUSED_STREAM);
	pump();
	cr_assert_eq(x.n, 0, "a refused stream must be retried, not failed");
	b = wait_req(1);
	cr_assert_neq(b->id, a->id);
	cr_assert_str_eq(hdr(b, ":path"), "/etcdserverpb.KV/Put");
	cr_assert_eq(b->blen, a->blen);
	cr_assert_eq(memcmp(a->body, b->body, a->blen), 0, "resent body differs");
	srv_reply_empty(b, &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	efs_etcd_get_stats(F.c, &st);
	cr_assert_geq(st.calls_retried, 1);
	res_done(&x);
	finish();
}

Test(client, rst_stream_codes_map_to_errnos, .init = setup)
{
	static const struct {
		uint32_t h2;
		int gs;
		int err;
	} t[] = {
		{ NGHTTP2_CANCEL, 1, -ECANCELED },
		{ NGHTTP2_ENHANCE_YOUR_CALM, 8, -ENOBUFS },
		{ NGHTTP2_INTERNAL_ERROR, 13, -EPROTO },
		{ NGHTTP2_PROTOCOL_ERROR, 13, -EPROTO },
	};

	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct res x;

		start_range(&x);
		srv_rst(wait_req((int)i), t[i].h2);
		pump();
		expect_once(&x);
		cr_assert_eq(x.gs, t[i].gs, "RST %u: grpc status %d", t[i].h2, x.gs);
		cr_assert_eq(x.err, t[i].err, "RST %u: err %d", t[i].h2, x.err);
		cr_assert_eq(F.nreq, (int)i + 1, "RST %u was retried", t[i].h2);
	}
	finish();
}

Test(client, goaway_below_an_inflight_put_resends_it_on_a_new_connection, .init = setup)
{
	struct efs_etcd_stats st;
	struct sreq *r, *p, *p2;
	struct res xr, xp;

	start_range(&xr);
	r = wait_req(0);
	start_put(&xp);
	p = wait_req(1);
	cr_assert_gt(p->id, r->id);
	/* Keep feeding the old connection until the Range is answered. */
	F.hold = true;
	cr_assert_eq(nghttp2_submit_goaway(F.s[0], NGHTTP2_FLAG_NONE, r->id, NGHTTP2_NO_ERROR,
					   NULL, 0), 0);
	server_to_client();
	pump();
	cr_assert_eq(xp.n, 0, "the Put above last_stream_id must be retried, not failed");
	cr_assert_eq(F.nsess, 2, "no new connection after GOAWAY");
	/* The stream below last_stream_id still completes on the old one. */
	srv_reply_range(r);
	pump();
	expect_once(&xr);
	check_range_resp(&xr);
	F.hold = false;
	F.feed_gen = 1;
	server_to_client();
	p2 = wait_req(2);
	cr_assert_eq(p2->gen, 1);
	cr_assert_str_eq(hdr(p2, ":path"), "/etcdserverpb.KV/Put");
	cr_assert_eq(p2->blen, p->blen);
	cr_assert_eq(memcmp(p2->body, p->body, p->blen), 0);
	srv_reply_empty(p2, &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&xp);
	cr_assert_eq(xp.err, 0, "%s", xp.msg);
	cr_assert(!xp.unknown);
	efs_etcd_get_stats(F.c, &st);
	cr_assert_eq(st.goaways, 1);
	cr_assert_eq(F.nreq, 3);
	res_done(&xr);
	res_done(&xp);
	finish();
}

/* ---- Lost connections ---- */

static void drop_failover(void)
{
	efs_etcd_channel_failover(F.c, EFS_ETCD_CH_BULK);
}

/* A DATA frame on stream 0 is a connection error: the client gives up the
 * connection as if the server had broken it. */
static void drop_protocol_error(void)
{
	static const uint8_t bad[] = { 0, 0, 1, 0, 0, 0, 0, 0, 0, 'x' };

	cr_assert_eq(efs_etcd_test_feed(F.c, bad, sizeof(bad)), 0);
}

static void sent_put_then_drop(void (*drop)(void))
{
	struct res x;
	int nsess;

	start_put(&x);
	wait_req(0);
	nsess = F.nsess;
	drop();
	pump();
	expect_once(&x);
	cr_assert_lt(x.err, 0);
	cr_assert(x.unknown, "a sent Put whose connection dropped has an unknown outcome");
	cr_assert_eq(x.gs, -1);
	pump_for(50);
	cr_assert_eq(F.nreq, 1, "a sent Put was resent after its connection dropped");
	cr_assert_eq(F.nsess, nsess, "a connection was made for nothing");
}

Test(client, a_sent_put_on_a_failed_over_connection_is_unknown_not_resent, .init = setup)
{
	sent_put_then_drop(drop_failover);
	finish();
}

Test(client, a_sent_put_on_a_broken_connection_is_unknown_not_resent, .init = setup)
{
	sent_put_then_drop(drop_protocol_error);
	finish();
}

static void sent_range_then_drop(void (*drop)(void))
{
	struct res x;
	struct sreq *q;

	start_range(&x);
	wait_req(0);
	drop();
	pump();
	cr_assert_eq(x.n, 0, "an idempotent Range must be retried");
	q = wait_req(1);
	cr_assert_eq(q->gen, 1, "retry not on a new connection");
	cr_assert_str_eq(hdr(q, ":path"), "/etcdserverpb.KV/Range");
	srv_reply_range(q);
	pump();
	expect_once(&x);
	check_range_resp(&x);
	res_done(&x);
}

Test(client, a_sent_range_on_a_failed_over_connection_is_retried, .init = setup)
{
	sent_range_then_drop(drop_failover);
	finish();
}

Test(client, a_sent_range_on_a_broken_connection_is_retried, .init = setup)
{
	sent_range_then_drop(drop_protocol_error);
	finish();
}

/* A call of |m| that reached the server loses its connection: a mutation
 * ends with an unknown outcome and is not resent; an idempotent call is
 * sent again on a new connection. */
static void sent_call_then_drop(enum efs_etcd_method m, const ProtobufCMessage *req,
				const ProtobufCMessageDescriptor *resp, bool mutation)
{
	struct res x;

	start_co(m, req, NULL, &x);
	wait_req(0);
	drop_failover();
	pump();
	if (mutation) {
		expect_once(&x);
		cr_assert_eq(x.err, -ECONNRESET, "err %d", x.err);
		cr_assert(x.unknown);
		pump_for(30);
		cr_assert_eq(F.nreq, 1, "a sent mutation was resent");
		return;
	}
	cr_assert_eq(x.n, 0);
	srv_reply_empty(wait_req(1), resp);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	cr_assert(!x.unknown);
	res_done(&x);
}

Test(client, a_lease_grant_without_an_id_is_a_mutation, .init = setup)
{
	Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;

	g.ttl = 2;
	sent_call_then_drop(EFS_ETCD_LEASE_GRANT, &g.base,
			    &etcdserverpb__lease_grant_response__descriptor, true);
	finish();
}

Test(client, a_lease_grant_with_our_own_id_is_retried, .init = setup)
{
	Etcdserverpb__LeaseGrantRequest g = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;

	g.ttl = 2;
	g.id = 0x1234;
	sent_call_then_drop(EFS_ETCD_LEASE_GRANT, &g.base,
			    &etcdserverpb__lease_grant_response__descriptor, false);
	finish();
}

Test(client, a_sent_txn_on_a_dropped_connection_is_unknown, .init = setup)
{
	Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;

	sent_call_then_drop(EFS_ETCD_TXN, &t.base, &etcdserverpb__txn_response__descriptor,
			    true);
	finish();
}

Test(client, a_sent_lease_revoke_on_a_dropped_connection_is_retried, .init = setup)
{
	Etcdserverpb__LeaseRevokeRequest r = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

	r.id = 9;
	sent_call_then_drop(EFS_ETCD_LEASE_REVOKE, &r.base,
			    &etcdserverpb__lease_revoke_response__descriptor, false);
	finish();
}

Test(client, goaway_at_or_above_a_put_lets_it_finish_on_the_old_connection, .init = setup)
{
	struct sreq *p;
	struct res x;

	start_put(&x);
	p = wait_req(0);
	F.hold = true;
	cr_assert_eq(nghttp2_submit_goaway(F.s[0], NGHTTP2_FLAG_NONE, p->id, NGHTTP2_NO_ERROR,
					   NULL, 0), 0);
	server_to_client();
	pump();
	cr_assert_eq(x.n, 0);
	srv_reply_empty(p, &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	pump_for(20);
	cr_assert_eq(F.nreq, 1, "a processed Put was resent");
	res_done(&x);
	finish();
}

Test(client, an_early_status_before_our_end_stream_resets_with_no_error, .init = setup)
{
	static const char *const big[] = {
		":status", "200", "content-type", "application/grpc", "grpc-status", "8",
		"grpc-message", "grpc: received message larger than max (200000 vs. 100)", NULL
	};
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	static uint8_t val[200000];
	struct sreq *q;
	struct res x;

	p.key.data = (uint8_t *)"k";
	p.key.len = 1;
	p.value.data = val;
	p.value.len = sizeof(val);
	start_co(EFS_ETCD_PUT, &p.base, NULL, &x);
	/* Stop at the first request bytes: the server's window (64 KiB)
	 * holds the rest back. */
	for (int i = 0; i < 20 && F.nreq == 0; i++) {
		uv_run(&F.loop, UV_RUN_NOWAIT);
		client_to_server();
		server_to_client();
	}
	cr_assert_eq(F.nreq, 1);
	q = &F.req[0];
	cr_assert(!q->ended);
	srv_trailers_only(q, big);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -EMSGSIZE, "err %d %s", x.err, x.msg);
	cr_assert_eq(x.gs, 8);
	cr_assert(!x.unknown);
	cr_assert(q->rst, "no RST_STREAM after an early status");
	cr_assert_eq(q->rst_code, NGHTTP2_NO_ERROR);
	cr_assert(!q->ended, "the body went on after the server's status");
	cr_assert_lt(q->blen, sizeof(val));
	finish();
}

static struct res chained;

static void on_result_chain(struct efs_etcd_result *r, void *arg)
{
	on_result(r, arg);
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	memset(&chained, 0, sizeof(chained));
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result,
				   &chained, NULL), 0);
	chained.started = true;
}

Test(client, a_call_started_from_a_callback_runs, .init = setup)
{
	struct res x;

	memset(&x, 0, sizeof(x));
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result_chain,
				   &x, NULL), 0);
	x.started = true;
	srv_reply_range(wait_req(0));
	pump();
	expect_once(&x);
	srv_reply_range(wait_req(1));
	pump();
	expect_once(&chained);
	check_range_resp(&chained);
	res_done(&x);
	res_done(&chained);
	finish();
}

static struct res other;

static void on_result_free(struct efs_etcd_result *r, void *arg)
{
	on_result(r, arg);
	efs_etcd_free(F.c, on_freed, NULL);
	cr_assert_eq(other.n, 0, "efs_etcd_free ran a callback inline");
	cr_assert_eq(F.done_runs, 0, "done ran inside efs_etcd_free");
}

Test(client, free_from_a_callback_cancels_the_rest, .init = setup)
{
	struct res x;

	memset(&x, 0, sizeof(x));
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result_free,
				   &x, NULL), 0);
	x.started = true;
	start_put(&other);
	wait_req(1);
	srv_reply_range(&F.req[0]);
	for (int i = 0; i < 1000 && !F.freed; i++)
		uv_run(&F.loop, UV_RUN_NOWAIT);
	cr_assert(F.freed);
	expect_once(&x);
	check_range_resp(&x);
	expect_once(&other);
	cr_assert_eq(other.err, -ECANCELED);
	cr_assert(other.unknown);
	res_done(&x);
	finish();
}

/*
 * A call that fails while its attempt is still on the wire (its deadline
 * passes while etcd is paused, or it is cancelled) is reset but stays on the
 * connection until the stream ends. Freeing the client from its callback
 * fails that connection under the running callback: the call must still be
 * freed exactly once, and every other pending call completes once.
 */
Test(client, free_from_the_callback_of_a_timed_out_call_on_the_wire, .init = setup)
{
	Etcdserverpb__LeaseRevokeRequest revoke = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	/* Long enough that the third request reaches the server first on a
	 * busy machine (40 ms did not always: the client was then freed
	 * while the test still served it). */
	struct efs_etcd_callopts co = { .timeout_ms = 500 };
	struct res x, w;

	memset(&x, 0, sizeof(x));
	revoke.id = 7;
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_LEASE_REVOKE, &revoke.base, &co, on_result_free,
				   &x, NULL), 0);
	x.started = true;
	start_put(&other);
	/* A third call that is retried after UNAVAILABLE, unanswered since. */
	start_range(&w);
	wait_req(2);
	cr_assert_not(x.done, "the call timed out before the test could serve the others");
	srv_trailers_only(&F.req[2], http503);
	/* The server answers nothing more, as a paused etcd. */
	cr_assert(pump_until(&F.freed, 5000), "efs_etcd_free never finished");
	expect_once(&x);
	cr_assert_eq(x.err, -ETIMEDOUT, "err %d: %s", x.err, x.msg);
	expect_once(&other);
	cr_assert_eq(other.err, -ECANCELED);
	cr_assert(other.unknown);
	expect_once(&w);
	cr_assert_eq(w.err, -ECANCELED);
	cr_assert_eq(F.done_runs, 1);
	finish();
}

Test(client, free_from_the_callback_of_a_cancelled_call_on_the_wire, .init = setup)
{
	struct efs_etcd_call *call;
	struct res x;

	memset(&x, 0, sizeof(x));
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result_free,
				   &x, &call), 0);
	x.started = true;
	start_put(&other);
	wait_req(1);
	efs_etcd_call_cancel(call);
	cr_assert(pump_until(&F.freed, 2000), "efs_etcd_free never finished");
	expect_once(&x);
	cr_assert_eq(x.err, -ECANCELED);
	expect_once(&other);
	cr_assert_eq(other.err, -ECANCELED);
	cr_assert_eq(F.done_runs, 1);
	finish();
}

/* Two calls on the wire fail in the same loop turn; the first one's callback
 * frees the client while the second's callback is queued and its attempt
 * still on the wire: the second keeps its own result and runs once. */
Test(client, free_from_a_callback_with_another_failed_call_queued, .init = setup)
{
	struct efs_etcd_call *cx, *cy;
	struct res x, y;

	memset(&x, 0, sizeof(x));
	memset(&other, 0, sizeof(other));
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result_free,
				   &x, &cx), 0);
	x.started = true;
	cy = start_range(&y);
	wait_req(1);
	efs_etcd_call_cancel(cx);
	efs_etcd_call_cancel(cy);
	cr_assert(pump_until(&F.freed, 2000), "efs_etcd_free never finished");
	expect_once(&x);
	cr_assert_eq(x.err, -ECANCELED);
	expect_once(&y);
	cr_assert_eq(y.err, -ECANCELED);
	cr_assert_str_eq(y.msg, "Range cancelled");
	cr_assert_eq(F.done_runs, 1);
	finish();
}

static void stream_closed_free(struct efs_etcd_stream *s, const struct efs_etcd_result *r,
			       void *arg)
{
	stream_closed(s, r, arg);
	efs_etcd_free(F.c, on_freed, NULL);
	cr_assert_eq(other.n, 0, "efs_etcd_free ran a callback inline");
	cr_assert_eq(F.done_runs, 0, "done ran inside efs_etcd_free");
}

/* A stream's close callback frees the client while a call on the wire is
 * pending and another call's failure is queued behind the stream's end. */
Test(client, free_from_a_stream_close_callback_with_calls_pending, .init = setup)
{
	struct efs_etcd_stream *s;
	struct efs_etcd_call *cy;
	struct res xs = { 0 }, y;

	cr_assert_eq(efs_etcd_stream_open(F.c, EFS_ETCD_STREAM_WATCH, EFS_ETCD_CH_BULK,
					  stream_msg, stream_closed_free, &xs, &s), 0);
	start_put(&other);
	cy = start_range(&y);
	wait_req(2);
	srv_rst(&F.req[0], NGHTTP2_INTERNAL_ERROR);
	efs_etcd_call_cancel(cy);
	cr_assert(pump_until(&F.freed, 2000), "efs_etcd_free never finished");
	cr_assert_eq(xs.n, 1);
	cr_assert_neq(xs.err, 0);
	expect_once(&other);
	cr_assert_eq(other.err, -ECANCELED);
	cr_assert(other.unknown);
	expect_once(&y);
	cr_assert_eq(y.err, -ECANCELED);
	cr_assert_str_eq(y.msg, "Range cancelled");
	cr_assert_eq(F.done_runs, 1);
	finish();
}

static int msgs_seen;

static void stream_msg_free(struct efs_etcd_stream *s, const ProtobufCMessage *m, void *arg)
{
	msgs_seen++;
	efs_etcd_free(F.c, on_freed, NULL);
	cr_assert_eq(other.n, 0, "efs_etcd_free ran a callback inline");
}

/* A stream's message callback frees the client: the rest of the DATA frame
 * is dropped, the stream closes with -ECANCELED, the other calls complete. */
Test(client, free_from_a_stream_message_callback, .init = setup)
{
	Etcdserverpb__WatchResponse w = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	struct efs_etcd_stream *s;
	struct res xs = { 0 };
	uint8_t buf[256];
	size_t n;

	msgs_seen = 0;
	cr_assert_eq(efs_etcd_stream_open(F.c, EFS_ETCD_STREAM_WATCH, EFS_ETCD_CH_BULK,
					  stream_msg_free, stream_closed, &xs, &s), 0);
	start_put(&other);
	wait_req(1);
	w.created = true;
	n = grpc_frame_of(&w.base, buf, sizeof(buf));
	n += grpc_frame_of(&w.base, buf + n, sizeof(buf) - n);
	srv_headers(&F.req[0], resp_hdrs);
	srv_data_frame(&F.req[0], buf, n);
	cr_assert(pump_until(&F.freed, 2000), "efs_etcd_free never finished");
	cr_assert_eq(msgs_seen, 1);
	cr_assert_eq(xs.n, 1);
	cr_assert_eq(xs.err, -ECANCELED);
	expect_once(&other);
	cr_assert_eq(other.err, -ECANCELED);
	cr_assert_eq(F.done_runs, 1);
	finish();
}

Test(client, cancel_of_a_sent_put_is_unknown, .init = setup)
{
	struct efs_etcd_call *call;
	struct sreq *q;
	struct res x;

	call = start_put(&x);
	q = wait_req(0);
	efs_etcd_call_cancel(call);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -ECANCELED);
	cr_assert(x.unknown, "a cancelled Put that was sent has an unknown outcome");
	cr_assert(q->rst);
	cr_assert_eq(q->rst_code, NGHTTP2_CANCEL);
	finish();
}

/* ---- Deadlines and cancellation ---- */

Test(client, a_local_deadline_is_etimedout_and_resets_the_stream, .init = setup)
{
	struct efs_etcd_callopts co = { .timeout_ms = 40 };
	uint64_t t0 = now_ms();
	struct sreq *q;
	struct res x, y;

	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	start_co(EFS_ETCD_RANGE, &range_req.base, &co, &x);
	q = wait_req(0);
	cr_assert(pump_until(&x.done, 2000));
	cr_assert_geq(now_ms() - t0, 39);
	expect_once(&x);
	cr_assert_eq(x.err, -ETIMEDOUT);
	cr_assert_eq(x.gs, -1);
	cr_assert(!x.unknown);
	pump();
	cr_assert(q->rst, "no RST_STREAM after the deadline");
	cr_assert_eq(q->rst_code, NGHTTP2_CANCEL);
	pump_for(10);
	cr_assert_eq(x.n, 1);

	/* A Put past its deadline: outcome unknown. */
	put_req.key.data = (uint8_t *)"pk";
	put_req.key.len = 2;
	start_co(EFS_ETCD_PUT, &put_req.base, &co, &y);
	q = wait_req(1);
	cr_assert(pump_until(&y.done, 2000));
	expect_once(&y);
	cr_assert_eq(y.err, -ETIMEDOUT);
	cr_assert(y.unknown);
	pump();
	cr_assert(q->rst);
	cr_assert_eq(q->rst_code, NGHTTP2_CANCEL);
	finish();
}

Test(client, cancel_is_ecanceled_later_and_resets_the_stream, .init = setup)
{
	struct efs_etcd_call *call;
	struct sreq *q;
	struct res x;

	call = start_range(&x);
	q = wait_req(0);
	efs_etcd_call_cancel(call);
	cr_assert_eq(x.n, 0, "callback ran inside efs_etcd_call_cancel");
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -ECANCELED);
	cr_assert(q->rst, "no RST_STREAM after cancel");
	cr_assert_eq(q->rst_code, NGHTTP2_CANCEL);
	pump_for(10);
	cr_assert_eq(x.n, 1);
	finish();
}

Test(client, cancel_before_sending_puts_nothing_on_the_wire, .init = setup)
{
	struct efs_etcd_call *call;
	struct res x;

	/* No server SETTINGS yet: the call waits for the connection. */
	call = start_range(&x);
	uv_run(&F.loop, UV_RUN_NOWAIT);
	efs_etcd_call_cancel(call);
	cr_assert_eq(x.n, 0);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, -ECANCELED);
	cr_assert(!x.unknown);
	pump_for(10);
	cr_assert_eq(F.nreq, 0, "a cancelled call went out");
	finish();
}

Test(client, cancel_after_the_reply_arrived_keeps_the_reply, .init = setup)
{
	struct efs_etcd_call *call;
	struct res x;

	call = start_range(&x);
	/* srv_reply_range feeds the client synchronously: the result is
	 * decided but the callback has not run (no loop turn yet). */
	srv_reply_range(wait_req(0));
	cr_assert_eq(x.n, 0, "callback ran inside efs_etcd_test_feed");
	efs_etcd_call_cancel(call);
	pump();
	expect_once(&x);
	check_range_resp(&x);
	res_done(&x);
	finish();
}

Test(client, a_reply_above_max_recv_msg_is_emsgsize)
{
	struct efs_etcd_opts o = { .endpoints = ENDPOINT, .max_recv_msg = 64,
				   .backoff_base_ms = 1, .backoff_max_ms = 4 };
	Etcdserverpb__RangeResponse r = ETCDSERVERPB__RANGE_RESPONSE__INIT;
	Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT;
	Mvccpb__KeyValue *kvs[1] = { &kv };
	static uint8_t val[200];
	uint8_t buf[300];
	struct sreq *q;
	struct res x, y;
	size_t n;

	setup_opts(&o);
	r.n_kvs = 1;
	r.kvs = kvs;
	kv.key.data = (uint8_t *)"k";
	kv.key.len = 1;
	kv.value.data = val;
	/* Exactly at the limit: accepted. */
	for (kv.value.len = 0; protobuf_c_message_get_packed_size(&r.base) < 64; kv.value.len++)
		;
	cr_assert_eq(protobuf_c_message_get_packed_size(&r.base), 64);
	start_range(&x);
	q = wait_req(0);
	srv_reply(q, &r.base);
	pump();
	expect_once(&x);
	cr_assert_eq(x.err, 0, "a message of exactly max_recv_msg failed: %s", x.msg);
	res_done(&x);

	/* One byte more: -EMSGSIZE and the stream is reset. */
	kv.value.len++;
	n = grpc_frame_of(&r.base, buf, sizeof(buf));
	cr_assert_eq(n, 65 + 5);
	start_range(&y);
	q = wait_req(1);
	srv_headers(q, resp_hdrs);
	srv_data_frame(q, buf, n);
	srv_trailers(q, ok_trailers);
	pump();
	expect_once(&y);
	cr_assert_eq(y.err, -EMSGSIZE, "err %d %s", y.err, y.msg);
	cr_assert(q->rst, "no RST_STREAM for an oversized message");
	cr_assert_eq(F.nreq, 2, "an oversized reply was retried");
	finish();
}

/* ---- Closing the client ---- */

static int order_log[8];
static int norder;

static void on_freed_order(void *arg)
{
	order_log[norder++] = 100;
	on_freed(arg);
}

static void on_result_order(struct efs_etcd_result *r, void *arg)
{
	on_result(r, arg);
	order_log[norder++] = 1;
}

Test(client, free_with_calls_pending_cancels_each_once_then_runs_done)
{
	struct efs_etcd_opts o = { .endpoints = ENDPOINT, .backoff_base_ms = 1000,
				   .backoff_max_ms = 1000, .call_timeout_ms = 10000 };
	struct efs_etcd_stream *s;
	struct res xr, xp, xb, xs = { 0 }, late = { 0 };
	struct efs_etcd_call *call;

	setup_opts(&o);
	norder = 0;
	/* A Range on the wire, a Put on the wire, a Range waiting for a retry
	 * after UNAVAILABLE, and a Watch stream. */
	memset(&xr, 0, sizeof(xr));
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result_order,
				   &xr, &call), 0);
	xr.started = true;
	start_put(&xp);
	start_range(&xb);
	cr_assert_eq(efs_etcd_stream_open(F.c, EFS_ETCD_STREAM_WATCH, EFS_ETCD_CH_BULK,
					  stream_msg, stream_closed, &xs, &s), 0);
	wait_req(3);
	srv_trailers_only(&F.req[2], http503);
	pump();
	cr_assert_eq(xb.n, 0);

	efs_etcd_free(F.c, on_freed_order, NULL);
	cr_assert_eq(xr.n + xp.n + xb.n + xs.n, 0, "callbacks ran inside efs_etcd_free");
	cr_assert_eq(F.done_runs, 0);
	cr_assert_eq(efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result, &late,
				   NULL), -ESHUTDOWN);
	teardown_client();
	expect_once(&xr);
	expect_once(&xp);
	expect_once(&xb);
	cr_assert_eq(xr.err, -ECANCELED);
	cr_assert_eq(xp.err, -ECANCELED);
	cr_assert_eq(xb.err, -ECANCELED);
	cr_assert(xp.unknown, "a sent Put cancelled by free has an unknown outcome");
	cr_assert(!xr.unknown);
	cr_assert_eq(xs.n, 1);
	cr_assert_eq(xs.err, -ECANCELED);
	cr_assert_eq(late.n, 0);
	cr_assert_eq(F.done_runs, 1);
	cr_assert_eq(order_log[norder - 1], 100, "done ran before a call callback");
	efs_test_assert_no_leaks();
}

Test(client, free_null_is_a_noop)
{
	efs_etcd_free(NULL, on_freed, NULL);
	cr_assert_eq(F.done_runs, 0);
}

/* ---- Fault hooks ---- */

#if EFS_FAULT_HOOKS
Test(client, drop_reply_fails_the_nth_call_as_unknown_after_the_server_got_it, .init = setup)
{
	struct res a, b, c;

	efs_etcd_fault_drop_reply(F.c, EFS_ETCD_PUT, 2);
	start_put(&a);
	srv_reply_empty(wait_req(0), &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&a);
	cr_assert_eq(a.err, 0, "first Put: %s", a.msg);
	res_done(&a);

	start_put(&b);
	srv_reply_empty(wait_req(1), &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&b);
	cr_assert_eq(b.err, -ETIMEDOUT);
	cr_assert(b.unknown);
	cr_assert_null(b.resp);
	cr_assert(F.req[1].ended, "the dropped Put must have been sent whole");
	pump_for(20);
	cr_assert_eq(F.nreq, 2, "the dropped Put was resent");

	start_put(&c);
	srv_reply_empty(wait_req(2), &etcdserverpb__put_response__descriptor);
	pump();
	expect_once(&c);
	cr_assert_eq(c.err, 0, "the hook fired twice");
	res_done(&c);
	finish();
}

Test(client, drop_reply_on_a_range_is_not_unknown, .init = setup)
{
	struct res a;

	efs_etcd_fault_drop_reply(F.c, EFS_ETCD_RANGE, 1);
	start_range(&a);
	srv_reply_range(wait_req(0));
	pump();
	expect_once(&a);
	cr_assert_eq(a.err, -ETIMEDOUT);
	cr_assert(!a.unknown);
	finish();
}
#endif

/* ---- Failmalloc ---- */

/*
 * New client, one Range, the reply, free; with allocation |fail_at| and
 * every later one failing (-1: none). Returns the allocations it made.
 */
static char last_msg[EFS_GRPC_MESSAGE_MAX + 64];

static long range_scenario(long fail_at, int *ret_err, uint32_t wait_ms)
{
	struct efs_etcd_opts o = { .endpoints = ENDPOINT, .call_timeout_ms = 3000,
				   .backoff_base_ms = 1, .backoff_max_ms = 2 };
	struct res x = { 0 };
	long count;
	int r;

	if (wait_ms)
		o.call_timeout_ms = 30;
	memset(&F, 0, sizeof(F));
	cr_assert_eq(uv_loop_init(&F.loop), 0);
	F.loop_up = true;
	*ret_err = 1;
	efs_mem_fail_after(fail_at);
	r = efs_etcd_test_new(&F.c, &F.loop, &o);
	if (r < 0) {
		cr_assert_eq(r, -ENOMEM, "efs_etcd_test_new: %d", r);
		F.c = NULL;
		goto out;
	}
	range_req.key.data = (uint8_t *)"k";
	range_req.key.len = 1;
	r = efs_etcd_call(F.c, EFS_ETCD_RANGE, &range_req.base, NULL, on_result, &x, NULL);
	if (r < 0) {
		cr_assert_eq(r, -ENOMEM, "efs_etcd_call: %d", r);
		*ret_err = r;
		goto out;
	}
	x.started = true;
	for (int i = 0; i < 3 && F.nreq == 0; i++)
		pump();
	if (F.nreq > 0 && F.req[0].ended) {
		srv_reply_range(&F.req[0]);
		pump();
	}
	/* Optionally let the call end by itself (its deadline) before free. */
	if (wait_ms)
		pump_until(&x.done, wait_ms);
out:
	teardown_client();
	count = efs_mem_count();
	efs_mem_fail_reset();
	if (x.started) {
		cr_assert_eq(x.n, 1, "fail_at %ld: callback ran %d times", fail_at, x.n);
		cr_assert(!x.inline_run);
		cr_assert(x.consistent, "fail_at %ld: err %d resp %p", fail_at, x.err,
			  (void *)x.resp);
		*ret_err = x.err;
		snprintf(last_msg, sizeof(last_msg), "%s", x.msg);
		res_done(&x);
	}
	return count;
}

Test(client, failmalloc_sweep_new_range_reply_free)
{
	int err, seen_ok = 0, seen_enomem = 0, counts[4] = { 0 };
	long n = range_scenario(-1, &err, 0);

	cr_assert_eq(err, 0, "scenario without failures: %d", err);
	cr_assert_gt(n, 10);
	for (long i = 0; i <= n; i++) {
		range_scenario(i, &err, 0);
		if (getenv("CT_DEBUG"))
			cr_log_info("fail_at %ld: err %d", i, err);
		/* Acceptable ends: success, or a clean error. A failed
		 * connection leaves the Range waiting until free cancels it. */
		cr_assert(err == 0 || err == 1 || err == -ENOMEM || err == -ECANCELED,
			  "fail_at %ld: callback err %d", i, err);
		counts[err == 0 ? 0 : err == 1 ? 1 : err == -ENOMEM ? 2 : 3]++;
		seen_ok += err == 0;
		seen_enomem += err == -ENOMEM || err == 1;
	}
	cr_log_info("failmalloc: %ld allocations; ok %d, new failed %d, -ENOMEM %d, "
		    "-ECANCELED %d", n, counts[0], counts[1], counts[2], counts[3]);
	cr_assert_gt(seen_enomem, 0);
	cr_assert_gt(seen_ok, 0, "a failure in the last allocations should not matter");
	efs_test_assert_no_leaks();
}

/*
 * The same sweep with a 30 ms deadline, letting each call end by itself before
 * free: a Range whose connection cannot be made or dies for lack of memory is
 * retried and ends at its deadline with -ETIMEDOUT (failures before sending
 * are retried until the deadline); otherwise it ends with -ENOMEM or succeeds.
 * Its last-error text is not checked: with the in-memory peer, a failed
 * allocation of the capture buffer drops output silently (a hook artifact),
 * and a HEADERS that nghttp2 could not allocate is reported as "stream
 * refused".
 */
Test(client, failmalloc_sweep_calls_end_by_themselves)
{
	int err, counts[3] = { 0 };
	long n = range_scenario(-1, &err, 0);

	cr_assert_eq(err, 0);
	for (long i = 0; i <= n; i++) {
		range_scenario(i, &err, 400);
		if (getenv("CT_DEBUG"))
			cr_log_info("fail_at %ld: err %d (%s)", i, err, last_msg);
		cr_assert(err == 0 || err == 1 || err == -ENOMEM || err == -ETIMEDOUT,
			  "fail_at %ld: callback err %d (%s)", i, err, last_msg);
		if (err == -ETIMEDOUT)
			cr_assert(strstr(last_msg, "deadline of 30 ms exceeded"),
				  "fail_at %ld: %s", i, last_msg);
		counts[err == 0 ? 0 : err == -ETIMEDOUT ? 2 : 1]++;
	}
	cr_log_info("failmalloc until deadline: ok %d, -ENOMEM %d, -ETIMEDOUT %d", counts[0],
		    counts[1], counts[2]);
	efs_test_assert_no_leaks();
}

/*
 * Allocation failures from the moment the reply's DATA arrives (reader
 * buffer, protobuf unpack, nghttp2 internals): the Range ends with its
 * reply, with -ENOMEM, or is retried on a new connection and then answered;
 * an allocation failure must never be reported as a malformed reply.
 */
Test(client, allocation_failures_while_receiving_the_reply_are_enomem, .init = setup)
{
	uint8_t buf[128];
	size_t n = range_response(buf, sizeof(buf));
	int outcomes[3] = { 0 };

	for (long k = 0; k < 12; k++) {
		struct res x;
		struct sreq *q;
		int before;

		start_range(&x);
		q = wait_req(F.nreq);
		srv_headers(q, resp_hdrs);
		pump();
		before = F.nreq;
		efs_mem_fail_after(k);
		srv_data_frame(q, buf, n);
		srv_trailers(q, ok_trailers);
		efs_mem_fail_reset();
		/* A retry (after a connection error) gets its reply too. */
		for (uint64_t end = now_ms() + 1000; !x.done && now_ms() < end; usleep(500)) {
			pump();
			if (F.nreq > before && F.req[F.nreq - 1].ended) {
				srv_reply_range(&F.req[F.nreq - 1]);
				before = F.nreq;
			}
		}
		cr_assert(x.done, "k %ld: the Range never ended (requests %d, sessions %d, "
			  "unfed %zu)", k, F.nreq, F.nsess, F.unfed);
		expect_once(&x);
		if (getenv("CT_DEBUG"))
			cr_log_info("k %ld: err %d (%s)", k, x.err, x.msg);
		else
			cr_assert(x.err == 0 || x.err == -ENOMEM,
				  "k %ld: allocation failure reported as err %d (%s)", k, x.err,
				  x.msg);
		outcomes[x.err == 0 ? 0 : 1]++;
		res_done(&x);
	}
	cr_log_info("reply-side failmalloc: ok %d, -ENOMEM %d", outcomes[0], outcomes[1]);
	finish();
}
