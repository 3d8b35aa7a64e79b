/* SPDX-License-Identifier: Apache-2.0 */
/*
 * watch.c's bookkeeping against a fake transport: this file defines the
 * efs_etcd_* stream and call functions watch.c uses, so the linker takes
 * these instead of client.c (which nothing here pulls in). The tests play
 * etcd: they read the requests watch.c sent and inject responses and stream
 * ends.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/grpc.h"
#include "etcd/watch.h"
#include "util/mem.h"

#include "../support/leak.h"

/* ---- The fake transport ---- */

#define MAX_SENT 64

struct efs_etcd {
	uv_loop_t *loop;
};

struct efs_etcd_stream {
	enum efs_etcd_stream_kind kind;
	enum efs_etcd_channel channel;
	efs_etcd_stream_msg_cb msg_cb;
	efs_etcd_stream_close_cb close_cb;
	void *arg;
	bool closed_by_caller;
	size_t n_sent;
	Etcdserverpb__WatchRequest *sent[MAX_SENT];
};

#define MAX_STREAMS 16
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
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = malloc(len + 1);

	cr_assert_eq(msg->descriptor, &etcdserverpb__watch_request__descriptor);
	cr_assert_lt(s->n_sent, MAX_SENT);
	protobuf_c_message_pack(msg, buf);
	s->sent[s->n_sent++] = etcdserverpb__watch_request__unpack(NULL, len, buf);
	free(buf);
	return 0;
}

static void stream_release(struct efs_etcd_stream *s)
{
	for (size_t i = 0; i < s->n_sent; i++)
		etcdserverpb__watch_request__free_unpacked(s->sent[i], NULL);
	s->n_sent = 0;
}

void efs_etcd_stream_close(struct efs_etcd_stream *s)
{
	s->closed_by_caller = true;
}

uint64_t efs_etcd_stream_last_send_ns(const struct efs_etcd_stream *s)
{
	(void)s;
	return 0;
}

uint32_t efs_etcd_watch_delay_ms(const struct efs_etcd *c)
{
	(void)c;
	return 0;
}

struct fake_call {
	efs_etcd_call_cb cb;
	void *arg;
	bool done;
};
static struct fake_call calls[8];
static size_t n_calls;

int efs_etcd_call(struct efs_etcd *c, enum efs_etcd_method method, const ProtobufCMessage *req,
		  const struct efs_etcd_callopts *co, efs_etcd_call_cb cb, void *arg,
		  struct efs_etcd_call **ret_call)
{
	(void)c;
	(void)method;
	(void)req;
	(void)co;
	cr_assert_lt(n_calls, 8);
	calls[n_calls].cb = cb;
	calls[n_calls].arg = arg;
	if (ret_call)
		*ret_call = (struct efs_etcd_call *)&calls[n_calls];
	n_calls++;
	return 0;
}

void efs_etcd_call_cancel(struct efs_etcd_call *call)
{
	struct fake_call *fc = (struct fake_call *)call;
	struct efs_etcd_result r = {.err = -ECANCELED, .grpc_status = -1, .message = "canceled"};

	/* Real calls complete later; the tests only cancel from teardown. */
	fc->done = true;
	fc->cb(&r, fc->arg);
}

/* ---- Test helpers ---- */

static bool loop_open;

static void setup(void)
{
	cr_assert_eq(uv_loop_init(&loop), 0);
	loop_open = true;
}

/*
 * Closes the loop and frees the fake streams. Each test calls it before its
 * leak check, and .fini again for a test that failed first: the second call
 * does nothing.
 */
static void teardown(void)
{
	if (loop_open) {
		uv_run(&loop, UV_RUN_DEFAULT);
		cr_expect_eq(uv_loop_close(&loop), 0);
		loop_open = false;
	}
	for (size_t i = 0; i < n_streams; i++) {
		stream_release(streams[i]);
		free(streams[i]);
	}
	n_streams = 0;
}

static struct efs_etcd_stream *last_stream(void)
{
	cr_assert_gt(n_streams, 0);
	return streams[n_streams - 1];
}

/* Runs the loop until a new stream has been opened (a reopen). */
static struct efs_etcd_stream *wait_reopen(size_t before)
{
	for (int i = 0; i < 200 && n_streams == before; i++)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_gt(n_streams, before, "the stream was not reopened");
	return last_stream();
}

static void inject(struct efs_etcd_stream *s, Etcdserverpb__WatchResponse *resp)
{
	s->msg_cb(s, &resp->base, s->arg);
}

static void inject_created(struct efs_etcd_stream *s, int64_t id, int64_t rev)
{
	Etcdserverpb__ResponseHeader hdr = ETCDSERVERPB__RESPONSE_HEADER__INIT;
	Etcdserverpb__WatchResponse resp = ETCDSERVERPB__WATCH_RESPONSE__INIT;

	hdr.revision = rev;
	resp.header = &hdr;
	resp.watch_id = id;
	resp.created = true;
	inject(s, &resp);
}

/* Events for |id| at revisions |revs| (0-terminated), keys "/a/<rev>". */
static void inject_events(struct efs_etcd_stream *s, int64_t id, const int64_t *revs,
			  bool fragment)
{
	Etcdserverpb__ResponseHeader hdr = ETCDSERVERPB__RESPONSE_HEADER__INIT;
	Etcdserverpb__WatchResponse resp = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	Mvccpb__Event ev[8], *evp[8];
	Mvccpb__KeyValue kv[8];
	char keys[8][16];
	size_t n = 0;

	for (; revs[n]; n++) {
		mvccpb__event__init(&ev[n]);
		mvccpb__key_value__init(&kv[n]);
		snprintf(keys[n], sizeof(keys[n]), "/a/%ld", (long)revs[n]);
		kv[n].key.data = (uint8_t *)keys[n];
		kv[n].key.len = strlen(keys[n]);
		kv[n].mod_revision = revs[n];
		ev[n].kv = &kv[n];
		evp[n] = &ev[n];
	}
	hdr.revision = revs[n - 1];
	resp.header = &hdr;
	resp.watch_id = id;
	resp.fragment = fragment;
	resp.n_events = n;
	resp.events = evp;
	inject(s, &resp);
}

static void inject_close(struct efs_etcd_stream *s, int err)
{
	struct efs_etcd_result r = {.err = err, .grpc_status = -1, .message = "connection lost"};

	s->close_cb(s, &r, s->arg);
}

static const Etcdserverpb__WatchCreateRequest *sent_create(struct efs_etcd_stream *s, size_t i)
{
	cr_assert_lt(i, s->n_sent, "only %zu requests sent", s->n_sent);
	cr_assert_eq(s->sent[i]->request_union_case,
		     ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST);
	return s->sent[i]->create_request;
}

struct rec {
	int created, updates, progress;
	int64_t revs[64];
	size_t n;
	int final_status;
	enum efs_etcd_watch_kind final_kind;
	bool ended;
	int64_t compact_rev;
};

static void rec_cb(struct efs_etcd_watcher *w, int status, const struct efs_etcd_watch_update *u,
		   void *arg)
{
	struct rec *r = arg;

	(void)w;
	switch (u->kind) {
	case EFS_ETCD_WATCH_CREATED:
		r->created++;
		break;
	case EFS_ETCD_WATCH_EVENTS:
		r->updates++;
		for (size_t i = 0; i < u->n_events && r->n < 64; i++)
			r->revs[r->n++] = u->events[i]->kv->mod_revision;
		break;
	case EFS_ETCD_WATCH_PROGRESS:
		r->progress++;
		break;
	case EFS_ETCD_WATCH_COMPACTED:
	case EFS_ETCD_WATCH_CANCELED:
		r->ended = true;
		r->final_kind = u->kind;
		r->final_status = status;
		r->compact_rev = u->compact_revision;
		break;
	}
}

static struct efs_etcd_watcher *new_watcher(struct efs_etcd_watch_stream *ws, int64_t start,
					    struct rec *r)
{
	struct efs_etcd_watch_opts o = {.key = "/a/", .key_len = 3, .prefix = true,
					.start_revision = start};
	struct efs_etcd_watcher *w;

	cr_assert_eq(efs_etcd_watcher_new(&w, ws, &o, rec_cb, r), 0);
	return w;
}

static void wait_cb(struct efs_etcd_watcher *w, int status, void *arg)
{
	int *res = arg;

	(void)w;
	*res = status == 0 ? 1 : status;
}

TestSuite(watch, .init = setup, .fini = teardown, .timeout = 20);

Test(watch, create_request_carries_id_range_and_fragment)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	const Etcdserverpb__WatchCreateRequest *cr;
	struct rec r = {0};

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_PRIO), 0);
	cr_assert_eq(last_stream()->channel, EFS_ETCD_CH_PRIO);
	cr_assert_eq(last_stream()->kind, EFS_ETCD_STREAM_WATCH);
	w = new_watcher(ws, 0, &r);
	cr = sent_create(last_stream(), 0);
	cr_assert_eq(cr->watch_id, efs_etcd_watcher_id(w));
	cr_assert_neq(cr->watch_id, 0);
	cr_assert_eq(cr->key.len, 3);
	cr_assert_eq(memcmp(cr->range_end.data, "/a0", 3), 0);
	cr_assert(cr->fragment);
	cr_assert_eq(cr->start_revision, 0);
	/* Created is delivered from the stream, never inline. */
	cr_assert_eq(r.created, 0);
	inject_created(last_stream(), cr->watch_id, 10);
	cr_assert_eq(r.created, 1);
	cr_assert_eq(efs_etcd_watcher_next_rev(w), 11);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, a_reconnect_resumes_after_the_last_delivered_revision)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct efs_etcd_stream *s;
	struct rec r = {0};
	int64_t id;

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w = new_watcher(ws, 0, &r);
	id = efs_etcd_watcher_id(w);
	s = last_stream();
	inject_created(s, id, 10);
	inject_events(s, id, (int64_t[]){11, 11, 0}, false);
	inject_events(s, id, (int64_t[]){12, 0}, false);
	/* Half a fragment group of revision 13, then the stream dies. */
	inject_events(s, id, (int64_t[]){13, 0}, true);
	cr_assert_eq(r.n, 3);
	inject_close(s, -ENOTCONN);
	s = wait_reopen(1);
	cr_assert_eq(sent_create(s, 0)->start_revision, 13);
	cr_assert_eq(sent_create(s, 0)->watch_id, id);
	inject_created(s, id, 20);
	cr_assert_eq(r.created, 1, "CREATED delivered again on resume");
	inject_events(s, id, (int64_t[]){13, 0}, true);
	inject_events(s, id, (int64_t[]){13, 14, 0}, false);
	cr_assert_eq(r.n, 6);
	cr_assert_eq(r.updates, 3);
	cr_assert_eq(r.revs[3], 13);
	cr_assert_eq(r.revs[4], 13);
	cr_assert_eq(r.revs[5], 14);
	cr_assert_eq(efs_etcd_watcher_next_rev(w), 15);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, a_failed_create_is_matched_in_request_order)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w1, *w2;
	struct rec r1 = {0}, r2 = {0};
	Etcdserverpb__WatchResponse resp = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	char reason[] = "rpc error: code = PermissionDenied desc = etcdserver: permission denied";

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w1 = new_watcher(ws, 0, &r1);
	w2 = new_watcher(ws, 0, &r2);
	resp.watch_id = -1;
	resp.created = true;
	resp.canceled = true;
	resp.cancel_reason = reason;
	inject(last_stream(), &resp);
	cr_assert(r1.ended);
	cr_assert_eq(r1.final_kind, EFS_ETCD_WATCH_CANCELED);
	cr_assert_eq(r1.final_status, -EPERM);
	cr_assert_not(r2.ended);
	inject_created(last_stream(), efs_etcd_watcher_id(w2), 5);
	cr_assert_eq(r2.created, 1);
	cr_assert_eq(efs_etcd_watch_wait_rev(w1, 1, wait_cb, NULL), -ECANCELED);
	efs_etcd_watcher_free(w1);
	efs_etcd_watcher_free(w2);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, compaction_ends_the_watcher_with_its_revision)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec r = {0};
	Etcdserverpb__WatchResponse resp = ETCDSERVERPB__WATCH_RESPONSE__INIT;

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w = new_watcher(ws, 3, &r);
	cr_assert_eq(sent_create(last_stream(), 0)->start_revision, 3);
	inject_created(last_stream(), efs_etcd_watcher_id(w), 50);
	cr_assert_eq(efs_etcd_watcher_next_rev(w), 3);
	resp.watch_id = efs_etcd_watcher_id(w);
	resp.canceled = true;
	resp.compact_revision = 40;
	inject(last_stream(), &resp);
	cr_assert(r.ended);
	cr_assert_eq(r.final_kind, EFS_ETCD_WATCH_COMPACTED);
	cr_assert_eq(r.final_status, EFS_ETCD_ECOMPACTED);
	cr_assert_eq(r.compact_rev, 40);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, a_cancel_pending_at_a_reconnect_is_confirmed_and_waits_fail)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec r = {0};
	int waited = 0;

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w = new_watcher(ws, 0, &r);
	inject_created(last_stream(), efs_etcd_watcher_id(w), 10);
	cr_assert_eq(efs_etcd_watch_wait_rev(w, 100, wait_cb, &waited), 0);
	cr_assert_eq(efs_etcd_watcher_cancel(w), 0);
	cr_assert_eq(last_stream()->sent[1]->request_union_case,
		     ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST);
	/* An event already queued by etcd is not delivered after cancel. */
	inject_events(last_stream(), efs_etcd_watcher_id(w), (int64_t[]){11, 0}, false);
	cr_assert_eq(r.n, 0);
	inject_close(last_stream(), -ENOTCONN);
	cr_assert_not(r.ended, "final update delivered inline from the stream end");
	for (int i = 0; i < 50 && (!r.ended || !waited); i++)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert(r.ended);
	cr_assert_eq(r.final_kind, EFS_ETCD_WATCH_CANCELED);
	cr_assert_eq(r.final_status, 0);
	cr_assert_eq(waited, -ECANCELED);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, wait_rev_completes_later_and_progress_advances)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec r = {0};
	int now = 0, later = 0;
	Etcdserverpb__ResponseHeader hdr = ETCDSERVERPB__RESPONSE_HEADER__INIT;
	Etcdserverpb__WatchResponse resp = ETCDSERVERPB__WATCH_RESPONSE__INIT;

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w = new_watcher(ws, 0, &r);
	inject_created(last_stream(), efs_etcd_watcher_id(w), 10);
	cr_assert_eq(efs_etcd_watch_wait_rev(w, 10, wait_cb, &now), 0);
	cr_assert_eq(efs_etcd_watch_wait_rev(w, 30, wait_cb, &later), 0);
	cr_assert_eq(now, 0, "wait_rev completed inline");
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert_eq(now, 1);
	/* The stream-wide progress reply (id -1) does not advance a watcher
	 * on 3.4.23; its own progress notice does. */
	hdr.revision = 40;
	resp.header = &hdr;
	resp.watch_id = -1;
	inject(last_stream(), &resp);
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert_eq(later, 0);
	resp.watch_id = efs_etcd_watcher_id(w);
	inject(last_stream(), &resp);
	cr_assert_eq(r.progress, 1);
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert_eq(later, 1);
	cr_assert_eq(efs_etcd_watcher_next_rev(w), 41);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, the_delay_hook_holds_responses_in_order)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct rec r = {0};
	int64_t id;

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w = new_watcher(ws, 0, &r);
	id = efs_etcd_watcher_id(w);
	efs_etcd_watch_stream_fault_delay(ws, 100);
	inject_created(last_stream(), id, 10);
	inject_events(last_stream(), id, (int64_t[]){11, 0}, false);
	efs_etcd_watch_stream_fault_delay(ws, 0);
	/* Behind held ones even with the delay off again. */
	inject_events(last_stream(), id, (int64_t[]){12, 0}, false);
	cr_assert_eq(r.created, 0);
	cr_assert_eq(r.n, 0);
	for (int i = 0; i < 100 && r.n < 2; i++)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(r.created, 1);
	cr_assert_eq(r.n, 2);
	cr_assert_eq(r.revs[0], 11);
	cr_assert_eq(r.revs[1], 12);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}

Test(watch, a_token_error_at_create_is_retried_once_on_a_new_stream)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_etcd_watcher *w;
	struct efs_etcd_stream *old;
	struct rec r = {0};
	Etcdserverpb__WatchResponse resp = ETCDSERVERPB__WATCH_RESPONSE__INIT;
	struct efs_etcd_result ok = {.err = 0, .grpc_status = 0, .message = ""};
	char reason[] = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token";

	cr_assert_eq(efs_etcd_watch_stream_new(&ws, &client, EFS_ETCD_CH_BULK), 0);
	w = new_watcher(ws, 0, &r);
	old = last_stream();
	resp.watch_id = -1;
	resp.created = true;
	resp.canceled = true;
	resp.cancel_reason = reason;
	inject(old, &resp);
	cr_assert_not(r.ended, "a token error ended the watcher at once");
	cr_assert_eq(n_calls, 1, "no call renews the token");
	calls[0].cb(&ok, calls[0].arg);
	cr_assert(old->closed_by_caller);
	cr_assert_eq(n_streams, 2);
	cr_assert_eq(sent_create(last_stream(), 0)->watch_id, efs_etcd_watcher_id(w));
	/* Refused again on the fresh stream: reported. */
	inject(last_stream(), &resp);
	cr_assert(r.ended);
	cr_assert_eq(r.final_status, -EACCES);
	cr_assert_eq(n_calls, 1);
	efs_etcd_watcher_free(w);
	efs_etcd_watch_stream_free(ws);
	teardown();
	efs_test_assert_no_leaks();
}
