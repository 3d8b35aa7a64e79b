/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/watch.h"

#include <errno.h>
#include <string.h>

#include "config.h"
#include "etcd/grpc.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/mem.h"

#define BACKOFF_BASE_MS 25
#define BACKOFF_MAX_MS  1000

enum wstate {
	W_NEW,       /* to be (re)created when the stream is open */
	W_CREATING,  /* create sent, created reply awaited */
	W_ACTIVE,
	W_CANCELING, /* cancel sent, confirmation awaited */
	W_DONE,      /* ended; only efs_etcd_watcher_free remains */
};

/* On one list at a time: its watcher's waits, the stream's barriers (Put
 * in flight) or the stream's ready list. */
struct wait_req {
	struct efs_list link;
	struct efs_etcd_watcher *w;       /* NULL once the watcher is freed */
	struct efs_etcd_watch_stream *ws; /* NULL once the stream is freed */
	int64_t rev;
	int status;
	efs_etcd_watch_wait_cb cb;
	void *arg;
	struct efs_etcd_call *put; /* a barrier's Put in flight */
};

struct refresh {
	struct efs_etcd_watch_stream *ws; /* NULL once the stream is freed */
	struct efs_etcd_call *call;
};

struct held {
	struct efs_list link; /* in the stream's held list */
	uint64_t due_ns;
	size_t len;
	uint8_t data[];
};

struct efs_etcd_watcher {
	struct efs_etcd_watch_stream *ws;
	struct efs_list link; /* in the stream's watchers */
	int64_t id;
	uint8_t *key, *range_end;
	size_t key_len, range_end_len;
	bool prev_kv, progress_notify, no_put, no_delete;
	/* The next revision to deliver: where a re-create starts. */
	int64_t next_rev;
	enum wstate state;
	bool created_reported;
	/* A create refused for a token error was retried on a fresh stream;
	 * cleared once a create succeeds. */
	bool auth_retried;
	/* A final update to deliver from the deferred pass. */
	bool final_pending;
	enum efs_etcd_watch_kind final_kind;
	int final_status;
	/* Events of a fragment group received so far (deep copies). */
	Mvccpb__Event **frag;
	size_t n_frag, cap_frag;
	struct efs_list waits; /* of wait_req, newest first */
	efs_etcd_watch_cb cb;
	void *arg;
};

struct efs_etcd_watch_stream {
	struct efs_etcd *c;
	uv_loop_t *loop;
	enum efs_etcd_channel channel;
	struct efs_etcd_stream *s; /* NULL while closed */
	uv_timer_t reopen;
	uv_timer_t defer;
	bool reopen_armed;
	struct efs_backoff backoff; /* reset by a create that succeeds */
	int64_t next_id;
	struct efs_list watchers; /* newest first */
	/* Ids of the creates sent and not yet answered, in order: a failed
	 * create is answered with id -1, in request order. An array, not a
	 * list: it holds plain ids and is emptied whole when the stream goes. */
	int64_t *cq;
	size_t cq_head, cq_len, cq_cap;
	/* Fault hook: responses held back, oldest first. */
	uint32_t delay_ms;
	struct efs_list held;	  /* of struct held */
	struct efs_list ready;	  /* of wait_req whose callback is due, FIFO */
	struct efs_list barriers; /* of wait_req whose Put is in flight */
	/* A unary call in flight that makes the client renew its token. */
	struct refresh *refresh;
	unsigned handles_open;
	bool freeing;
	bool dead;
	struct efs_etcd_watch_stream_stats stats;
};

static void kick_defer(struct efs_etcd_watch_stream *ws, uint64_t delay_ms);
static int refresh_token(struct efs_etcd_watch_stream *ws, struct efs_etcd_watcher *w);

/* ---- Small helpers ---- */

static struct efs_etcd_watcher *watcher_of(struct efs_list *n)
{
	return efs_list_entry(n, struct efs_etcd_watcher, link);
}

static struct wait_req *wait_req_of(struct efs_list *n)
{
	return efs_list_entry(n, struct wait_req, link);
}

static struct efs_etcd_watcher *find_watcher(struct efs_etcd_watch_stream *ws, int64_t id)
{
	struct efs_list *n;

	efs_list_for_each(n, &ws->watchers)
		if (watcher_of(n)->id == id)
			return watcher_of(n);
	return NULL;
}

static int cq_push(struct efs_etcd_watch_stream *ws, int64_t id)
{
	if (ws->cq_head == ws->cq_len)
		ws->cq_head = ws->cq_len = 0;
	if (ws->cq_len == ws->cq_cap) {
		size_t cap = ws->cq_cap ? ws->cq_cap * 2 : 16;
		int64_t *n = efs_mem_realloc(ws->cq, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		ws->cq = n;
		ws->cq_cap = cap;
	}
	ws->cq[ws->cq_len++] = id;
	return 0;
}

static int64_t cq_pop(struct efs_etcd_watch_stream *ws)
{
	if (ws->cq_head == ws->cq_len)
		return 0;
	return ws->cq[ws->cq_head++];
}

static void free_frag(struct efs_etcd_watcher *w)
{
	for (size_t i = 0; i < w->n_frag; i++)
		mvccpb__event__free_unpacked(w->frag[i], efs_mem_protobuf());
	efs_mem_free(w->frag);
	w->frag = NULL;
	w->n_frag = w->cap_frag = 0;
}

static Mvccpb__Event *copy_event(const Mvccpb__Event *e)
{
	size_t len = mvccpb__event__get_packed_size(e);
	uint8_t *buf = efs_mem_malloc(len);
	Mvccpb__Event *copy;

	if (!buf)
		return NULL;
	mvccpb__event__pack(e, buf);
	copy = mvccpb__event__unpack(efs_mem_protobuf(), len, buf);
	efs_mem_free(buf);
	return copy;
}

static int reason_errno(const char *reason)
{
	/* The same errnos as grpc.c's table gives the unary calls. */
	if (strstr(reason, "permission denied"))
		return -EPERM;
	if (strstr(reason, "invalid auth token") || strstr(reason, "auth store is old") ||
	    strstr(reason, "user name is empty"))
		return -EACCES;
	if (strstr(reason, "range is empty") || strstr(reason, "duplicate watch ID"))
		return -EINVAL;
	return -EIO;
}

static void ready_push(struct efs_etcd_watch_stream *ws, struct wait_req *wr, int status)
{
	wr->status = status;
	efs_list_add_tail(&ws->ready, &wr->link);
	kick_defer(ws, 0);
}

/* Readies |wr| now when |w| has delivered past wr->rev, else parks it on
 * |w| until check_waits() sees that happen. */
static void wait_on_rev(struct efs_etcd_watcher *w, struct wait_req *wr)
{
	if (w->next_rev > wr->rev) {
		ready_push(w->ws, wr, 0);
	} else {
		efs_list_add_head(&w->waits, &wr->link);
	}
}

/*
 * A new wait on |w| that will call |cb| with |arg|, in |*ret|. -ECANCELED
 * once |w| is done (nothing can satisfy a wait any more), -ENOMEM.
 */
static int wait_req_new(struct efs_etcd_watcher *w, efs_etcd_watch_wait_cb cb, void *arg,
			struct wait_req **ret)
{
	struct wait_req *wr;

	if (w->state == W_DONE)
		return -ECANCELED;
	wr = efs_mem_calloc(1, sizeof(*wr));
	if (!wr)
		return -ENOMEM;
	wr->w = w;
	wr->ws = w->ws;
	wr->cb = cb;
	wr->arg = arg;
	*ret = wr;
	return 0;
}

/* Moves the waits |w| has satisfied (or all of them, with |status|, when
 * |all|) to the ready list. */
static void check_waits(struct efs_etcd_watcher *w, bool all, int status)
{
	struct efs_list *n, *tmp;

	efs_list_for_each_safe(n, tmp, &w->waits) {
		struct wait_req *wr = wait_req_of(n);

		if (all || w->next_rev > wr->rev) {
			efs_list_del(&wr->link);
			ready_push(w->ws, wr, all ? status : 0);
		}
	}
}

/* ---- Sending ---- */

static int send_create(struct efs_etcd_watcher *w)
{
	struct efs_etcd_watch_stream *ws = w->ws;
	Etcdserverpb__WatchRequest req = ETCDSERVERPB__WATCH_REQUEST__INIT;
	Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
	Etcdserverpb__WatchCreateRequest__FilterType filters[2];
	int r;

	cr.key.data = w->key;
	cr.key.len = w->key_len;
	cr.range_end.data = w->range_end;
	cr.range_end.len = w->range_end_len;
	cr.start_revision = w->next_rev;
	cr.progress_notify = w->progress_notify;
	cr.prev_kv = w->prev_kv;
	cr.watch_id = w->id;
	cr.fragment = true;
	if (w->no_put)
		filters[cr.n_filters++] = ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NOPUT;
	if (w->no_delete)
		filters[cr.n_filters++] = ETCDSERVERPB__WATCH_CREATE_REQUEST__FILTER_TYPE__NODELETE;
	cr.filters = cr.n_filters ? filters : NULL;
	req.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
	req.create_request = &cr;
	r = cq_push(ws, w->id);
	if (r < 0)
		return r;
	r = efs_etcd_stream_send(ws->s, &req.base);
	if (r < 0) {
		ws->cq_len--;
		return r;
	}
	w->state = W_CREATING;
	return 0;
}

static int send_cancel(struct efs_etcd_watch_stream *ws, int64_t id)
{
	Etcdserverpb__WatchRequest req = ETCDSERVERPB__WATCH_REQUEST__INIT;
	Etcdserverpb__WatchCancelRequest cr = ETCDSERVERPB__WATCH_CANCEL_REQUEST__INIT;

	if (!ws->s)
		return -ENOTCONN;
	cr.watch_id = id;
	req.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CANCEL_REQUEST;
	req.cancel_request = &cr;
	return efs_etcd_stream_send(ws->s, &req.base);
}

/* ---- Delivery ---- */

static void deliver(struct efs_etcd_watcher *w, int status, const struct efs_etcd_watch_update *u)
{
	if (w->cb)
		w->cb(w, status, u, w->arg);
}

/* Ends |w| and delivers its final update now; nothing touches |w| after. */
static void finish(struct efs_etcd_watcher *w, enum efs_etcd_watch_kind kind, int status,
		   int64_t revision, int64_t compact_revision, const char *reason)
{
	struct efs_etcd_watch_update u = {
		.kind = kind,
		.revision = revision,
		.compact_revision = compact_revision,
		.reason = reason ? reason : "",
	};

	w->state = W_DONE;
	w->final_pending = false;
	free_frag(w);
	check_waits(w, true, -ECANCELED);
	deliver(w, status, &u);
}

/* Ends |w| from a context where the caller may not be called back now. */
static void finish_later(struct efs_etcd_watcher *w, enum efs_etcd_watch_kind kind, int status)
{
	w->state = W_DONE;
	w->final_pending = true;
	w->final_kind = kind;
	w->final_status = status;
	free_frag(w);
	check_waits(w, true, -ECANCELED);
	kick_defer(w->ws, 0);
}

static void handle_created(struct efs_etcd_watch_stream *ws,
			   const Etcdserverpb__WatchResponse *resp, int64_t rev)
{
	int64_t head = cq_pop(ws);
	struct efs_etcd_watcher *w;

	if (resp->watch_id == -1 || resp->canceled) {
		int err = reason_errno(resp->cancel_reason);

		w = find_watcher(ws, resp->watch_id != -1 ? resp->watch_id : head);
		if (!w || w->state != W_CREATING)
			return;
		/* etcd checks the stream's token at every create, and a simple
		 * token expires after --auth-token-ttl without use: a stream
		 * opened long ago refuses new watchers with "invalid auth
		 * token". Renew the token and retry once on a new stream. */
		if (err == -EACCES && !w->auth_retried && refresh_token(ws, w) == 0) {
			w->auth_retried = true;
			w->state = W_NEW;
			return;
		}
		finish(w, EFS_ETCD_WATCH_CANCELED, err, rev, 0, resp->cancel_reason);
		return;
	}
	w = find_watcher(ws, resp->watch_id);
	if (!w || w->state != W_CREATING)
		return;
	w->state = W_ACTIVE;
	w->auth_retried = false;
	efs_backoff_reset(&ws->backoff);
	if (w->next_rev == 0) {
		w->next_rev = rev + 1;
		check_waits(w, false, 0);
	}
	if (!w->created_reported) {
		struct efs_etcd_watch_update u = {
			.kind = EFS_ETCD_WATCH_CREATED,
			.revision = rev,
			.reason = "",
		};

		w->created_reported = true;
		deliver(w, 0, &u);
	}
}

static void handle_resp(struct efs_etcd_watch_stream *ws, const Etcdserverpb__WatchResponse *resp)
{
	int64_t rev = resp->header ? resp->header->revision : 0;
	struct efs_etcd_watch_update u = {.revision = rev, .reason = ""};
	struct efs_etcd_watcher *w;
	Mvccpb__Event **all = NULL;
	size_t n;

	ws->stats.responses++;
	if (resp->created) {
		handle_created(ws, resp, rev);
		return;
	}
	w = find_watcher(ws, resp->watch_id);
	if (resp->canceled) {
		if (!w || w->state == W_DONE || w->state == W_NEW)
			return;
		if (resp->compact_revision > 0)
			finish(w, EFS_ETCD_WATCH_COMPACTED, EFS_ETCD_ECOMPACTED, rev,
			       resp->compact_revision, resp->cancel_reason);
		else if (w->state == W_CANCELING)
			finish(w, EFS_ETCD_WATCH_CANCELED, 0, rev, 0, resp->cancel_reason);
		else
			finish(w, EFS_ETCD_WATCH_CANCELED, reason_errno(resp->cancel_reason), rev,
			       0, resp->cancel_reason);
		return;
	}
	/* Id -1 is the stream-wide progress reply; on 3.4.23 it can run ahead
	 * of queued events, so it never advances a watcher. */
	if (!w || w->state != W_ACTIVE)
		return;
	if (resp->fragment) {
		ws->stats.fragments++;
		if (w->n_frag + resp->n_events > w->cap_frag) {
			size_t cap = (w->n_frag + resp->n_events) * 2;
			Mvccpb__Event **f = efs_mem_realloc(w->frag, cap * sizeof(*f));

			if (!f)
				goto fail_nomem;
			w->frag = f;
			w->cap_frag = cap;
		}
		for (size_t i = 0; i < resp->n_events; i++) {
			Mvccpb__Event *e = copy_event(resp->events[i]);

			if (!e)
				goto fail_nomem;
			w->frag[w->n_frag++] = e;
		}
		return;
	}
	n = w->n_frag + resp->n_events;
	if (w->n_frag) {
		all = efs_mem_malloc(n * sizeof(*all));
		if (!all)
			goto fail_nomem;
		memcpy(all, w->frag, w->n_frag * sizeof(*all));
		memcpy(all + w->n_frag, resp->events, resp->n_events * sizeof(*all));
		u.events = all;
	} else {
		u.events = resp->events;
	}
	u.n_events = n;
	if (n == 0) {
		u.kind = EFS_ETCD_WATCH_PROGRESS;
		if (rev + 1 > w->next_rev)
			w->next_rev = rev + 1;
	} else {
		const Mvccpb__KeyValue *kv = u.events[n - 1]->kv;

		u.kind = EFS_ETCD_WATCH_EVENTS;
		if (kv && kv->mod_revision + 1 > w->next_rev)
			w->next_rev = kv->mod_revision + 1;
		ws->stats.events += n;
	}
	check_waits(w, false, 0);
	/* The frag copies must outlive the callback, which may free |w|:
	 * detach them first. */
	{
		Mvccpb__Event **frag = w->frag;
		size_t n_frag = w->n_frag;

		w->frag = NULL;
		w->n_frag = w->cap_frag = 0;
		deliver(w, 0, &u);
		for (size_t i = 0; i < n_frag; i++)
			mvccpb__event__free_unpacked(frag[i], efs_mem_protobuf());
		efs_mem_free(frag);
	}
	efs_mem_free(all);
	return;

fail_nomem:
	/* We cannot deliver what we cannot hold; the watcher must not skip
	 * events silently, so it ends and the caller re-lists. */
	finish(w, EFS_ETCD_WATCH_CANCELED, -ENOMEM, rev, 0, "out of memory");
}

/* ---- The HTTP/2 stream ---- */

static void on_msg(struct efs_etcd_stream *s, const ProtobufCMessage *msg, void *arg);
static void on_close(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg);

static void reopen_fire(uv_timer_t *t);

/* Streams of the process opened again (loop thread only; one loop per
 * process in etcfsd). */
static uint64_t watch_reopens;

uint64_t efs_etcd_watch_reopens(void)
{
	return watch_reopens;
}

static void arm_reopen(struct efs_etcd_watch_stream *ws, uint32_t delay_ms)
{
	if (ws->reopen_armed || ws->s || ws->freeing || ws->dead)
		return;
	ws->reopen_armed = true;
	uv_timer_start(&ws->reopen, reopen_fire, delay_ms, 0);
}

static int stream_open(struct efs_etcd_watch_stream *ws)
{
	struct efs_list *n;
	int r;

	if (ws->s || ws->freeing || ws->dead)
		return 0;
	r = efs_etcd_stream_open(ws->c, EFS_ETCD_STREAM_WATCH, ws->channel, on_msg, on_close, ws,
				 &ws->s);
	if (r < 0) {
		ws->s = NULL;
		if (r == -ESHUTDOWN) {
			ws->dead = true;
			efs_list_for_each(n, &ws->watchers)
				if (watcher_of(n)->state != W_DONE)
					finish_later(watcher_of(n), EFS_ETCD_WATCH_CANCELED,
						     -ESHUTDOWN);
			return r;
		}
		arm_reopen(ws, efs_backoff_next(&ws->backoff));
		return r;
	}
	if (ws->stats.opens++)
		watch_reopens++;
	efs_list_for_each(n, &ws->watchers)
		if (watcher_of(n)->state == W_NEW)
			(void)send_create(watcher_of(n));
	return 0;
}

static void reopen_fire(uv_timer_t *t)
{
	struct efs_etcd_watch_stream *ws = t->data;

	ws->reopen_armed = false;
	(void)stream_open(ws);
}

static void drop_held(struct efs_etcd_watch_stream *ws)
{
	struct efs_list *n;

	while ((n = efs_list_pop(&ws->held)))
		efs_mem_free(efs_list_entry(n, struct held, link));
}

/* The HTTP/2 stream is gone: what it carried must be recreated. */
static void stream_reset(struct efs_etcd_watch_stream *ws)
{
	struct efs_list *n;

	ws->s = NULL;
	ws->cq_head = ws->cq_len = 0;
	/* What was held back was not delivered; the re-creates replay it. */
	drop_held(ws);
	efs_list_for_each(n, &ws->watchers) {
		struct efs_etcd_watcher *w = watcher_of(n);

		free_frag(w);
		if (w->state == W_CANCELING)
			finish_later(w, EFS_ETCD_WATCH_CANCELED, 0);
		else if (w->state == W_CREATING || w->state == W_ACTIVE)
			w->state = W_NEW;
	}
}

static void on_close(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg)
{
	struct efs_etcd_watch_stream *ws = arg;

	stream_reset(ws);
	arm_reopen(ws, efs_backoff_next(&ws->backoff));
}

static void refresh_done(struct efs_etcd_result *r, void *arg)
{
	struct refresh *rf = arg;
	struct efs_etcd_watch_stream *ws = rf->ws;

	efs_mem_free(rf);
	if (!ws)
		return;
	ws->refresh = NULL;
	/* Whatever the Range says (the user may not read the key), the
	 * client has renewed its token if it had to. A new stream carries
	 * it; every watcher resumes from its next revision. */
	if (ws->s) {
		efs_etcd_stream_close(ws->s);
		stream_reset(ws);
	}
	if (!ws->reopen_armed)
		(void)stream_open(ws);
}

/* Starts one small unary call (a count-only Range of |w|'s key), whose
 * token error makes the client authenticate again. */
static int refresh_token(struct efs_etcd_watch_stream *ws, struct efs_etcd_watcher *w)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct refresh *rf;
	int r;

	if (ws->refresh)
		return 0;
	rf = efs_mem_calloc(1, sizeof(*rf));
	if (!rf)
		return -ENOMEM;
	rf->ws = ws;
	req.key.data = w->key;
	req.key.len = w->key_len;
	req.count_only = true;
	r = efs_etcd_call(ws->c, EFS_ETCD_RANGE, &req.base, NULL, refresh_done, rf, &rf->call);
	if (r < 0) {
		efs_mem_free(rf);
		return r;
	}
	ws->refresh = rf;
	return 0;
}

static void on_msg(struct efs_etcd_stream *s, const ProtobufCMessage *msg, void *arg)
{
	struct efs_etcd_watch_stream *ws = arg;

	if (ws->delay_ms || !efs_list_empty(&ws->held)) {
		size_t len = protobuf_c_message_get_packed_size(msg);
		struct held *h = efs_mem_malloc(sizeof(*h) + len);

		if (h) {
			h->len = len;
			h->due_ns = efs_clock_mono_ns() + ws->delay_ms * EFS_NSEC_PER_MSEC;
			protobuf_c_message_pack(msg, h->data);
			efs_list_add_tail(&ws->held, &h->link);
			kick_defer(ws, ws->delay_ms);
			return;
		}
		/* Out of memory: handle it now rather than lose it. Order
		 * with held ones is broken, so end the stream instead. */
		efs_etcd_stream_close(ws->s);
		stream_reset(ws);
		arm_reopen(ws, efs_backoff_next(&ws->backoff));
		return;
	}
	handle_resp(ws, (const Etcdserverpb__WatchResponse *)msg);
}

/* ---- Deferred work: held responses, final updates, waits ---- */

/* The oldest held response, or NULL. */
static struct held *first_held(struct efs_etcd_watch_stream *ws)
{
	struct efs_list *n = efs_list_first(&ws->held);

	return n ? efs_list_entry(n, struct held, link) : NULL;
}

static void defer_fire(uv_timer_t *t)
{
	struct efs_etcd_watch_stream *ws = t->data;
	uint64_t now = efs_clock_mono_ns();
	struct efs_list *n;
	struct held *h;

	while ((h = first_held(ws)) && h->due_ns <= now) {
		Etcdserverpb__WatchResponse *resp;

		efs_list_del(&h->link);
		resp = etcdserverpb__watch_response__unpack(efs_mem_protobuf(), h->len, h->data);
		efs_mem_free(h);
		if (!resp)
			continue;
		handle_resp(ws, resp);
		etcdserverpb__watch_response__free_unpacked(resp, efs_mem_protobuf());
	}
again:
	efs_list_for_each(n, &ws->watchers) {
		struct efs_etcd_watcher *w = watcher_of(n);

		if (w->final_pending) {
			finish(w, w->final_kind, w->final_status, 0, 0,
			       w->final_status == -ESHUTDOWN ? "client closing" : "");
			goto again;
		}
	}
	while ((n = efs_list_pop(&ws->ready))) {
		struct wait_req *wr = wait_req_of(n);

		wr->cb(wr->w, wr->status, wr->arg);
		efs_mem_free(wr);
	}
	if ((h = first_held(ws))) {
		uint64_t due = h->due_ns, ms = 0;

		now = efs_clock_mono_ns();
		if (due > now)
			ms = (due - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC;
		uv_timer_start(&ws->defer, defer_fire, ms, 0);
	}
}

static void kick_defer(struct efs_etcd_watch_stream *ws, uint64_t delay_ms)
{
	uint64_t due = uv_now(ws->loop) + delay_ms;

	if (ws->freeing)
		return;
	if (uv_is_active((uv_handle_t *)&ws->defer) &&
	    uv_timer_get_due_in(&ws->defer) + uv_now(ws->loop) <= due)
		return;
	uv_timer_start(&ws->defer, defer_fire, delay_ms, 0);
}

/* ---- Public API ---- */

int efs_etcd_watch_stream_new(struct efs_etcd_watch_stream **ret, struct efs_etcd *c,
			      enum efs_etcd_channel channel)
{
	struct efs_etcd_watch_stream *ws;
	int r;

	if (!ret || !c || (unsigned)channel >= EFS_ETCD_NCHANNELS)
		return -EINVAL;
	ws = efs_mem_calloc(1, sizeof(*ws));
	if (!ws)
		return -ENOMEM;
	efs_list_init(&ws->watchers);
	efs_list_init(&ws->held);
	efs_list_init(&ws->ready);
	efs_list_init(&ws->barriers);
	ws->c = c;
	ws->loop = efs_etcd_loop(c);
	ws->channel = channel;
	efs_backoff_init(&ws->backoff, BACKOFF_BASE_MS, BACKOFF_MAX_MS, efs_clock_mono_ns());
	ws->next_id = 1;
	ws->delay_ms = efs_etcd_watch_delay_ms(c);
	r = efs_etcd_stream_open(c, EFS_ETCD_STREAM_WATCH, channel, on_msg, on_close, ws, &ws->s);
	if (r < 0) {
		efs_mem_free(ws);
		return r;
	}
	ws->stats.opens = 1;
	uv_timer_init(ws->loop, &ws->reopen);
	uv_timer_init(ws->loop, &ws->defer);
	ws->reopen.data = ws;
	ws->defer.data = ws;
	ws->handles_open = 2;
	*ret = ws;
	return 0;
}

static void ws_handle_closed(uv_handle_t *h)
{
	struct efs_etcd_watch_stream *ws = h->data;

	if (--ws->handles_open == 0)
		efs_mem_free(ws);
}

static void free_waits(struct efs_list *waits)
{
	struct efs_list *n;

	while ((n = efs_list_pop(waits)))
		efs_mem_free(wait_req_of(n));
}

static void watcher_release(struct efs_etcd_watcher *w)
{
	free_frag(w);
	efs_mem_free(w->key);
	efs_mem_free(w->range_end);
	efs_mem_free(w);
}

struct efs_etcd_watch_stream *efs_etcd_watch_stream_free(struct efs_etcd_watch_stream *ws)
{
	struct efs_list *n;

	if (!ws)
		return NULL;
	ws->freeing = true;
	while ((n = efs_list_pop(&ws->watchers))) {
		struct efs_etcd_watcher *w = watcher_of(n);

		free_waits(&w->waits);
		watcher_release(w);
	}
	free_waits(&ws->ready);
	while ((n = efs_list_pop(&ws->barriers))) {
		struct wait_req *wr = wait_req_of(n);

		/* The Put callback frees it. */
		wr->ws = NULL;
		efs_etcd_call_cancel(wr->put);
	}
	if (ws->refresh) {
		ws->refresh->ws = NULL;
		efs_etcd_call_cancel(ws->refresh->call);
		ws->refresh = NULL;
	}
	drop_held(ws);
	efs_mem_free(ws->cq);
	if (ws->s) {
		efs_etcd_stream_close(ws->s);
		ws->s = NULL;
	}
	uv_close((uv_handle_t *)&ws->reopen, ws_handle_closed);
	uv_close((uv_handle_t *)&ws->defer, ws_handle_closed);
	return NULL;
}

static int set_range(struct efs_etcd_watcher *w, const struct efs_etcd_watch_opts *o)
{
	w->key = efs_mem_memdup(o->key, o->key_len);
	if (!w->key)
		return -ENOMEM;
	w->key_len = o->key_len;
	if (o->prefix) {
		size_t n = o->key_len;

		w->range_end = efs_mem_memdup(o->key, n);
		if (!w->range_end)
			return -ENOMEM;
		while (n > 0 && w->range_end[n - 1] == 0xff)
			n--;
		if (n == 0) {
			w->range_end[0] = 0;
			w->range_end_len = 1;
		} else {
			w->range_end[n - 1]++;
			w->range_end_len = n;
		}
	} else if (o->range_end && o->range_end_len) {
		w->range_end = efs_mem_memdup(o->range_end, o->range_end_len);
		if (!w->range_end)
			return -ENOMEM;
		w->range_end_len = o->range_end_len;
	}
	return 0;
}

int efs_etcd_watcher_new(struct efs_etcd_watcher **ret, struct efs_etcd_watch_stream *ws,
			 const struct efs_etcd_watch_opts *o, efs_etcd_watch_cb cb, void *arg)
{
	struct efs_etcd_watcher *w;
	int r;

	if (!ret || !ws || !o || !o->key || !o->key_len || o->start_revision < 0 || ws->freeing)
		return -EINVAL;
	if (o->prefix && o->range_end)
		return -EINVAL;
	if (ws->dead)
		return -ESHUTDOWN;
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	efs_list_init(&w->waits);
	r = set_range(w, o);
	if (r < 0) {
		watcher_release(w);
		return r;
	}
	w->ws = ws;
	w->id = ws->next_id++;
	w->prev_kv = o->prev_kv;
	w->progress_notify = o->progress_notify;
	w->no_put = o->no_put;
	w->no_delete = o->no_delete;
	w->next_rev = o->start_revision;
	w->state = W_NEW;
	w->cb = cb;
	w->arg = arg;
	efs_list_add_head(&ws->watchers, &w->link);
	if (ws->s)
		(void)send_create(w);
	else
		arm_reopen(ws, 0);
	*ret = w;
	return 0;
}

int efs_etcd_watcher_cancel(struct efs_etcd_watcher *w)
{
	struct efs_etcd_watch_stream *ws = w->ws;

	switch (w->state) {
	case W_DONE:
	case W_CANCELING:
		return -EALREADY;
	case W_NEW:
		/* Not on the server: confirm locally, later. */
		finish_later(w, EFS_ETCD_WATCH_CANCELED, 0);
		return 0;
	case W_CREATING:
	case W_ACTIVE:
		break;
	}
	w->state = W_CANCELING;
	free_frag(w);
	if (send_cancel(ws, w->id) < 0)
		finish_later(w, EFS_ETCD_WATCH_CANCELED, 0);
	return 0;
}

/* Clears the watcher of the wait_reqs of |list| that are |w|'s. */
static void forget_watcher(struct efs_list *list, const struct efs_etcd_watcher *w)
{
	struct efs_list *n;

	efs_list_for_each(n, list)
		if (wait_req_of(n)->w == w)
			wait_req_of(n)->w = NULL;
}

struct efs_etcd_watcher *efs_etcd_watcher_free(struct efs_etcd_watcher *w)
{
	struct efs_etcd_watch_stream *ws;
	struct efs_list *n;

	if (!w)
		return NULL;
	ws = w->ws;
	if (w->state == W_CREATING || w->state == W_ACTIVE)
		(void)send_cancel(ws, w->id);
	efs_list_del(&w->link);
	/* Pending waits complete with -ECANCELED and no watcher. */
	while ((n = efs_list_pop(&w->waits))) {
		struct wait_req *wr = wait_req_of(n);

		wr->w = NULL;
		ready_push(ws, wr, -ECANCELED);
	}
	forget_watcher(&ws->ready, w);
	forget_watcher(&ws->barriers, w);
	watcher_release(w);
	return NULL;
}

int64_t efs_etcd_watcher_id(const struct efs_etcd_watcher *w)
{
	return w->id;
}

int64_t efs_etcd_watcher_next_rev(const struct efs_etcd_watcher *w)
{
	return w->next_rev;
}

int efs_etcd_watch_wait_rev(struct efs_etcd_watcher *w, int64_t rev, efs_etcd_watch_wait_cb cb,
			    void *arg)
{
	struct wait_req *wr;
	int r;

	if (!w || !cb || rev < 0)
		return -EINVAL;
	r = wait_req_new(w, cb, arg, &wr);
	if (r < 0)
		return r;
	wr->rev = rev;
	wait_on_rev(w, wr);
	return 0;
}

static void barrier_put_done(struct efs_etcd_result *r, void *arg)
{
	struct wait_req *wr = arg;
	struct efs_etcd_watch_stream *ws = wr->ws;
	struct efs_etcd_watcher *w = wr->w;
	const Etcdserverpb__PutResponse *resp = (const void *)r->resp;

	if (!ws) {
		efs_mem_free(wr);
		return;
	}
	efs_list_del(&wr->link);
	wr->put = NULL;
	if (r->err) {
		ready_push(ws, wr, r->err);
	} else if (!w || w->state == W_DONE) {
		ready_push(ws, wr, -ECANCELED);
	} else {
		wr->rev = resp->header ? resp->header->revision : 0;
		wait_on_rev(w, wr);
	}
}

int efs_etcd_watch_barrier(struct efs_etcd_watcher *w, const void *key, size_t key_len,
			   efs_etcd_watch_wait_cb cb, void *arg)
{
	Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
	struct wait_req *wr;
	int r;

	if (!w || !key || !key_len || !cb || w->no_put)
		return -EINVAL;
	r = wait_req_new(w, cb, arg, &wr);
	if (r < 0)
		return r;
	req.key.data = (uint8_t *)key;
	req.key.len = key_len;
	r = efs_etcd_call(w->ws->c, EFS_ETCD_PUT, &req.base, NULL, barrier_put_done, wr, &wr->put);
	if (r < 0) {
		efs_mem_free(wr);
		return r;
	}
	efs_list_add_head(&w->ws->barriers, &wr->link);
	return 0;
}

void efs_etcd_watch_stream_get_stats(const struct efs_etcd_watch_stream *ws,
				     struct efs_etcd_watch_stream_stats *ret)
{
	*ret = ws->stats;
}

void efs_etcd_watch_stream_fault_delay(struct efs_etcd_watch_stream *ws, uint32_t ms)
{
#if EFS_FAULT_HOOKS
	ws->delay_ms = ms;
#else
	(void)ws;
	(void)ms;
#endif
}
