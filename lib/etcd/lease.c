/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/lease.h"

#include <errno.h>
#include <string.h>

#include "config.h"
#include "etcd/grpc.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/mem.h"

/* Renewals outstanding per lease and stream; when full no more are sent on
 * that stream (a member that leaves 16 renewals unanswered is not
 * answering), so a reply is never matched to a send later than its own. */
#define FIFO_LEN 16

#define BACKOFF_BASE_MS 25
#define BACKOFF_MAX_MS  1000
#define TICK_MAX_MS     50

enum { ST_PRIO = 0, ST_BULK = 1, NSTREAMS = 2 };

struct ka_stream {
	struct efs_etcd_keepalive *ka;
	enum efs_etcd_channel channel;
	struct efs_etcd_stream *s; /* NULL while closed */
	uv_timer_t reopen;         /* backoff before the next open */
	bool reopen_armed;
	bool opened_once;
	struct efs_backoff backoff; /* reset by a reply */
};

struct efs_etcd_keepalive {
	struct efs_etcd *c;
	uv_loop_t *loop;
	struct ka_stream st[NSTREAMS];
	struct efs_list leases; /* of efs_etcd_lease, newest first */
	uint64_t last_failover_ns;
	unsigned handles_open;
	bool freeing;
	bool dead; /* the client is shutting down: no more opens */
};

struct fifo {
	uint64_t t[FIFO_LEN];
	unsigned head, n;
};

struct efs_etcd_lease {
	struct efs_etcd_keepalive *ka; /* NULL once freed or detached */
	struct efs_list link; /* on ka->leases while ka is set */
	int64_t id;
	uint64_t ttl_ns;
	uint64_t interval_ns, failover_ns, at_risk_ns;
	uint64_t last_ack_send_ns;
	uint64_t next_send_ns;
	uint64_t next_probe_ns;
	uint64_t last_prio_queue_ns;
	uint64_t last_wire_seen_ns;
	struct fifo fifo[NSTREAMS];
	uv_timer_t tick;
	struct efs_etcd_call *probe;
	unsigned refs; /* the tick handle, an outstanding probe */
	bool at_risk, gone, degraded, freed, paused;
	efs_etcd_lease_cb cb;
	void *arg;
	struct efs_etcd_lease_stats stats;
};

static struct efs_etcd_lease *lease_of(struct efs_list *n)
{
	return efs_list_entry(n, struct efs_etcd_lease, link);
}

/* ---- Thin wrappers ---- */

struct unary_ctx {
	union unary_cb {
		efs_etcd_lease_grant_cb grant;
		efs_etcd_lease_status_cb status;
		efs_etcd_lease_ttl_cb ttl;
	} cb;
	void *arg;
	uint64_t sent_ns; /* when the call started: a grant's deadline counts from it */
};

/*
 * Starts |method| with |req|; |done| runs with a context holding |cb| (the
 * member that |done| calls) and |arg|, and frees it. Returns -ENOMEM or
 * efs_etcd_call()'s result: on an error |done| never runs.
 */
static int unary_start(struct efs_etcd *c, enum efs_etcd_method method,
		       const ProtobufCMessage *req, efs_etcd_call_cb done, union unary_cb cb,
		       void *arg)
{
	struct unary_ctx *u = efs_mem_calloc(1, sizeof(*u));
	int r;

	if (!u)
		return -ENOMEM;
	u->cb = cb;
	u->arg = arg;
	u->sent_ns = efs_clock_mono_ns();
	r = efs_etcd_call(c, method, req, NULL, done, u, NULL);
	if (r < 0)
		efs_mem_free(u);
	return r;
}

static void grant_done(struct efs_etcd_result *r, void *arg)
{
	struct unary_ctx *u = arg;
	struct efs_etcd_lease_grant_info info = {0};
	int err = r->err;

	if (!err) {
		const Etcdserverpb__LeaseGrantResponse *resp = (const void *)r->resp;

		info.id = resp->id;
		info.ttl_s = resp->ttl;
		info.sent_ns = u->sent_ns;
		if (info.id == 0 || info.ttl_s <= 0)
			err = -EPROTO;
	}
	u->cb.grant(err, err ? NULL : &info, u->arg);
	efs_mem_free(u);
}

int efs_etcd_lease_grant(struct efs_etcd *c, int64_t ttl_s, int64_t id,
			 efs_etcd_lease_grant_cb cb, void *arg)
{
	Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;

	if (ttl_s <= 0 || id < 0 || !cb)
		return -EINVAL;
	req.ttl = ttl_s;
	req.id = id;
	return unary_start(c, EFS_ETCD_LEASE_GRANT, &req.base, grant_done,
			   (union unary_cb){.grant = cb}, arg);
}

static void revoke_done(struct efs_etcd_result *r, void *arg)
{
	struct unary_ctx *u = arg;

	u->cb.status(r->err, u->arg);
	efs_mem_free(u);
}

int efs_etcd_lease_revoke(struct efs_etcd *c, int64_t id, efs_etcd_lease_status_cb cb, void *arg)
{
	Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

	if (id <= 0 || !cb)
		return -EINVAL;
	req.id = id;
	return unary_start(c, EFS_ETCD_LEASE_REVOKE, &req.base, revoke_done,
			   (union unary_cb){.status = cb}, arg);
}

static void ttl_done(struct efs_etcd_result *r, void *arg)
{
	struct unary_ctx *u = arg;
	const Etcdserverpb__LeaseTimeToLiveResponse *resp = (const void *)r->resp;

	if (r->err)
		u->cb.ttl(r->err, 0, 0, u->arg);
	else
		u->cb.ttl(0, resp->ttl, resp->grantedttl, u->arg);
	efs_mem_free(u);
}

int efs_etcd_lease_time_to_live(struct efs_etcd *c, int64_t id, efs_etcd_lease_ttl_cb cb,
				void *arg)
{
	Etcdserverpb__LeaseTimeToLiveRequest req = ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;

	if (id <= 0 || !cb)
		return -EINVAL;
	req.id = id;
	return unary_start(c, EFS_ETCD_LEASE_TIME_TO_LIVE, &req.base, ttl_done,
			   (union unary_cb){.ttl = cb}, arg);
}

/* ---- Keepalive ---- */

static void fifo_push(struct fifo *f, uint64_t t)
{
	f->t[(f->head + f->n) % FIFO_LEN] = t;
	f->n++;
}

static uint64_t fifo_pop(struct fifo *f)
{
	uint64_t t;

	if (!f->n)
		return 0;
	t = f->t[f->head];
	f->head = (f->head + 1) % FIFO_LEN;
	f->n--;
	return t;
}

static uint64_t fifo_oldest(const struct fifo *f)
{
	return f->n ? f->t[f->head] : 0;
}

static bool stream_wanted(struct efs_etcd_keepalive *ka, int i)
{
	struct efs_list *n;

	if (ka->dead || ka->freeing)
		return false;
	efs_list_for_each(n, &ka->leases) {
		struct efs_etcd_lease *l = lease_of(n);

		if (l->gone)
			continue;
		if (i == ST_PRIO || l->degraded)
			return true;
	}
	return false;
}

static void stream_open(struct ka_stream *st);

static void reopen_fire(uv_timer_t *t)
{
	struct ka_stream *st = t->data;

	st->reopen_armed = false;
	stream_open(st);
}

static void arm_reopen(struct ka_stream *st, uint32_t delay_ms)
{
	struct efs_etcd_keepalive *ka = st->ka;

	if (st->reopen_armed || st->s || !stream_wanted(ka, (int)(st - ka->st)))
		return;
	st->reopen_armed = true;
	uv_timer_start(&st->reopen, reopen_fire, delay_ms, 0);
}

static int send_renewal(struct efs_etcd_lease *l, int i, uint64_t now);

static void on_msg(struct efs_etcd_stream *s, const ProtobufCMessage *msg, void *arg);
static void on_close(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg);

static void stream_open(struct ka_stream *st)
{
	struct efs_etcd_keepalive *ka = st->ka;
	int i = (int)(st - ka->st);
	struct efs_list *n;
	uint64_t now;
	int r;

	if (st->s || !stream_wanted(ka, i))
		return;
	r = efs_etcd_stream_open(ka->c, EFS_ETCD_STREAM_LEASE_KEEPALIVE, st->channel, on_msg,
				 on_close, st, &st->s);
	if (r == -ESHUTDOWN) {
		ka->dead = true;
		return;
	}
	if (r < 0) {
		st->s = NULL;
		arm_reopen(st, efs_backoff_next(&st->backoff));
		return;
	}
	now = efs_clock_mono_ns();
	efs_list_for_each(n, &ka->leases) {
		struct efs_etcd_lease *l = lease_of(n);

		if (st->opened_once)
			l->stats.stream_reopens++;
		if (l->gone || l->paused || (i == ST_BULK && !l->degraded))
			continue;
		(void)send_renewal(l, i, now);
		if (i == ST_PRIO)
			l->next_send_ns = now + l->interval_ns;
	}
	st->opened_once = true;
}

/* Queues one renewal of |l| on stream |i| and remembers when. */
static int send_renewal(struct efs_etcd_lease *l, int i, uint64_t now)
{
	Etcdserverpb__LeaseKeepAliveRequest req = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
	struct ka_stream *st = &l->ka->st[i];
	int r;

	if (!st->s) {
		arm_reopen(st, 0);
		return -ENOTCONN;
	}
	if (l->fifo[i].n == FIFO_LEN)
		return -EBUSY;
	req.id = l->id;
	r = efs_etcd_stream_send(st->s, &req.base);
	if (r < 0)
		return r;
	fifo_push(&l->fifo[i], now);
	l->stats.renewals_sent++;
	if (i == ST_PRIO) {
		uint64_t gap = now - l->last_prio_queue_ns;

		if (l->last_prio_queue_ns && gap > l->stats.max_queue_gap_ns)
			l->stats.max_queue_gap_ns = gap;
		l->last_prio_queue_ns = now;
	}
	return 0;
}

static void lease_unref(struct efs_etcd_lease *l)
{
	if (--l->refs == 0)
		efs_mem_free(l);
}

static void emit(struct efs_etcd_lease *l, int status, enum efs_etcd_lease_event ev,
		 uint64_t at_ns)
{
	if (l->cb && !l->freed)
		l->cb(l, status, ev, at_ns, l->arg);
}

static void mark_gone(struct efs_etcd_lease *l)
{
	l->gone = true;
	uv_timer_stop(&l->tick);
	emit(l, -ENOENT, EFS_ETCD_LEASE_GONE, efs_clock_mono_ns());
}

static struct efs_etcd_lease *find_lease(struct efs_etcd_keepalive *ka, int64_t id)
{
	struct efs_list *n;

	efs_list_for_each(n, &ka->leases)
		if (lease_of(n)->id == id)
			return lease_of(n);
	return NULL;
}

static void on_msg(struct efs_etcd_stream *s, const ProtobufCMessage *msg, void *arg)
{
	struct ka_stream *st = arg;
	struct efs_etcd_keepalive *ka = st->ka;
	const Etcdserverpb__LeaseKeepAliveResponse *resp = (const void *)msg;
	int i = (int)(st - ka->st);
	struct efs_etcd_lease *l;
	uint64_t sent;

	efs_backoff_reset(&st->backoff);
	l = find_lease(ka, resp->id);
	if (!l || l->gone)
		return;
	sent = fifo_pop(&l->fifo[i]);
	if (resp->ttl <= 0) {
		mark_gone(l);
		return;
	}
	l->stats.renewals_acked++;
	if (i == ST_BULK)
		l->stats.acks_bulk++;
	else
		l->degraded = false;
	if (sent > l->last_ack_send_ns) {
		l->last_ack_send_ns = sent;
		l->ttl_ns = (uint64_t)resp->ttl * EFS_NSEC_PER_SEC;
	}
	if (l->at_risk && sent && efs_clock_mono_ns() - sent < l->at_risk_ns) {
		l->at_risk = false;
		emit(l, 0, EFS_ETCD_LEASE_RECOVERED, sent);
	}
}

static void on_close(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg)
{
	struct ka_stream *st = arg;
	struct efs_etcd_keepalive *ka = st->ka;
	int i = (int)(st - ka->st);
	struct efs_list *n;

	st->s = NULL;
	/* Renewals in flight on a dead stream are never answered. */
	efs_list_for_each(n, &ka->leases)
		memset(&lease_of(n)->fifo[i], 0, sizeof(lease_of(n)->fifo[i]));
	arm_reopen(st, efs_backoff_next(&st->backoff));
}

static void probe_done(int status, int64_t ttl_s, int64_t granted, void *arg)
{
	struct efs_etcd_lease *l = arg;

	l->probe = NULL;
	if (!l->freed && !l->gone && status == 0 && ttl_s < 0)
		mark_gone(l);
	lease_unref(l);
}

static void probe_cb(struct efs_etcd_result *r, void *arg)
{
	const Etcdserverpb__LeaseTimeToLiveResponse *resp = (const void *)r->resp;

	probe_done(r->err, r->err ? 0 : resp->ttl, r->err ? 0 : resp->grantedttl, arg);
}

static void start_probe(struct efs_etcd_lease *l)
{
	Etcdserverpb__LeaseTimeToLiveRequest req = ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
	struct efs_etcd_callopts co = {
		.timeout_ms = (uint32_t)(l->at_risk_ns / EFS_NSEC_PER_MSEC) + 500,
		.channel = EFS_ETCD_CH_BULK,
		.no_retry = true,
	};

	req.id = l->id;
	if (efs_etcd_call(l->ka->c, EFS_ETCD_LEASE_TIME_TO_LIVE, &req.base, &co, probe_cb, l,
			  &l->probe) == 0)
		l->refs++;
	else
		l->probe = NULL;
}

static void tick(uv_timer_t *t);

static void tick_once(struct efs_etcd_lease *l)
{
	struct efs_etcd_keepalive *ka = l->ka;
	struct ka_stream *prio = &ka->st[ST_PRIO];
	uint64_t now = efs_clock_mono_ns();
	uint64_t since, wire;

	if (l->gone || l->freed)
		return;
	if (prio->s) {
		wire = efs_etcd_stream_last_send_ns(prio->s);
		if (wire && wire != l->last_wire_seen_ns) {
			uint64_t gap = wire - l->last_wire_seen_ns;

			if (l->last_wire_seen_ns && gap > l->stats.max_wire_gap_ns)
				l->stats.max_wire_gap_ns = gap;
			l->last_wire_seen_ns = wire;
		}
	}
	if (!l->paused && now >= l->next_send_ns) {
		l->next_send_ns = now + l->interval_ns;
		(void)send_renewal(l, ST_PRIO, now);
		if (l->degraded)
			(void)send_renewal(l, ST_BULK, now);
	}
	since = now - l->last_ack_send_ns;
	if (!l->paused && !l->degraded && since > l->failover_ns) {
		l->degraded = true;
		(void)send_renewal(l, ST_BULK, now);
	}
	if (l->at_risk && !l->probe && now >= l->next_probe_ns) {
		l->next_probe_ns = now + l->interval_ns;
		start_probe(l);
	}
	if (!l->at_risk && since > l->at_risk_ns) {
		l->at_risk = true;
		l->next_probe_ns = now + l->interval_ns;
		start_probe(l);
		emit(l, 0, EFS_ETCD_LEASE_AT_RISK, l->last_ack_send_ns + l->at_risk_ns);
		return;
	}
	/* The priority member has left a renewal unanswered for as long as
	 * the lease may go at risk: move the channel to another endpoint. Not
	 * before, because that drops the lock watches on the same connection.
	 * This may run the stream's close callback; nothing follows. */
	if (prio->s && !l->paused && fifo_oldest(&l->fifo[ST_PRIO]) &&
	    now - fifo_oldest(&l->fifo[ST_PRIO]) > l->at_risk_ns &&
	    now - ka->last_failover_ns > l->at_risk_ns) {
		ka->last_failover_ns = now;
		l->stats.prio_failovers++;
		efs_etcd_channel_failover(ka->c, EFS_ETCD_CH_PRIO);
	}
}

/* The next moment something is due: a renewal, the failover or at-risk
 * threshold, a probe; at most TICK_MAX_MS away so that the wire gap is
 * sampled. A timer rearmed for that moment, rather than a fixed tick, sends
 * each renewal on time. */
static void wake_at(uint64_t *wake, uint64_t t, uint64_t now)
{
	if (t > now && t < *wake)
		*wake = t;
}

static void schedule(struct efs_etcd_lease *l)
{
	uint64_t now = efs_clock_mono_ns();
	uint64_t wake = now + TICK_MAX_MS * EFS_NSEC_PER_MSEC;
	uint64_t ms;

	/* Only moments still ahead count: one that has passed was handled by
	 * this tick or cannot be acted on (paused, probe in flight). A 0 ms
	 * timer restarted from its own callback would spin inside libuv's
	 * timer phase without the loop time advancing. */
	if (!l->paused)
		wake_at(&wake, l->next_send_ns, now);
	if (!l->degraded)
		wake_at(&wake, l->last_ack_send_ns + l->failover_ns + 1, now);
	if (!l->at_risk)
		wake_at(&wake, l->last_ack_send_ns + l->at_risk_ns + 1, now);
	else
		wake_at(&wake, l->next_probe_ns, now);
	ms = (wake - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC;
	uv_timer_start(&l->tick, tick, ms ? ms : 1, 0);
}

static void tick(uv_timer_t *t)
{
	struct efs_etcd_lease *l = t->data;

	tick_once(l);
	/* |l| stays allocated until its timer handle is closed, even when
	 * the callback freed it. */
	if (!l->freed && !l->gone)
		schedule(l);
}

int efs_etcd_keepalive_new(struct efs_etcd_keepalive **ret, struct efs_etcd *c)
{
	struct efs_etcd_keepalive *ka;

	if (!c || !ret)
		return -EINVAL;
	ka = efs_mem_calloc(1, sizeof(*ka));
	if (!ka)
		return -ENOMEM;
	ka->c = c;
	ka->loop = efs_etcd_loop(c);
	efs_list_init(&ka->leases);
	for (int i = 0; i < NSTREAMS; i++) {
		struct ka_stream *st = &ka->st[i];

		st->ka = ka;
		st->channel = i == ST_PRIO ? EFS_ETCD_CH_PRIO : EFS_ETCD_CH_BULK;
		efs_backoff_init(&st->backoff, BACKOFF_BASE_MS, BACKOFF_MAX_MS,
				 efs_clock_mono_ns() + (uint64_t)i);
		uv_timer_init(ka->loop, &st->reopen);
		st->reopen.data = st;
		ka->handles_open++;
	}
	*ret = ka;
	return 0;
}

static void ka_handle_closed(uv_handle_t *h)
{
	struct ka_stream *st = h->data;
	struct efs_etcd_keepalive *ka = st->ka;

	if (--ka->handles_open == 0)
		efs_mem_free(ka);
}

struct efs_etcd_keepalive *efs_etcd_keepalive_free(struct efs_etcd_keepalive *ka)
{
	struct efs_list *n;

	if (!ka)
		return NULL;
	ka->freeing = true;
	while ((n = efs_list_first(&ka->leases)))
		efs_etcd_lease_free(lease_of(n));
	for (int i = 0; i < NSTREAMS; i++) {
		struct ka_stream *st = &ka->st[i];

		if (st->s) {
			efs_etcd_stream_close(st->s);
			st->s = NULL;
		}
		uv_close((uv_handle_t *)&st->reopen, ka_handle_closed);
	}
	return NULL;
}

int efs_etcd_lease_new(struct efs_etcd_lease **ret, struct efs_etcd_keepalive *ka,
		       const struct efs_etcd_lease_opts *o, efs_etcd_lease_cb cb, void *arg)
{
	struct efs_etcd_lease *l;
	uint64_t ttl_ns;

	if (!ret || !ka || !o || o->id <= 0 || o->ttl_s <= 0 || ka->freeing)
		return -EINVAL;
	if (o->failover_ms && o->at_risk_ms && o->at_risk_ms < o->failover_ms)
		return -EINVAL;
	if (find_lease(ka, o->id))
		return -EEXIST;
	l = efs_mem_calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	ttl_ns = (uint64_t)o->ttl_s * EFS_NSEC_PER_SEC;
	l->ka = ka;
	l->id = o->id;
	l->ttl_ns = ttl_ns;
	l->interval_ns = o->interval_ms ? o->interval_ms * EFS_NSEC_PER_MSEC : ttl_ns / 6;
	l->failover_ns = o->failover_ms ? o->failover_ms * EFS_NSEC_PER_MSEC : ttl_ns / 4;
	l->at_risk_ns = o->at_risk_ms ? o->at_risk_ms * EFS_NSEC_PER_MSEC : ttl_ns / 2;
	l->last_ack_send_ns = efs_clock_mono_ns();
	if (o->granted_ns && o->granted_ns < l->last_ack_send_ns)
		l->last_ack_send_ns = o->granted_ns;
	l->next_send_ns = 0;
	l->cb = cb;
	l->arg = arg;
	uv_timer_init(ka->loop, &l->tick);
	l->tick.data = l;
	l->refs = 1;
	efs_list_add_head(&ka->leases, &l->link);
	/* The first tick runs on the next loop iteration and sends the first
	 * renewal (opening the stream if needed). */
	uv_timer_start(&l->tick, tick, 0, 0);
	*ret = l;
	return 0;
}

static void lease_tick_closed(uv_handle_t *h)
{
	lease_unref(h->data);
}

struct efs_etcd_lease *efs_etcd_lease_free(struct efs_etcd_lease *l)
{
	struct efs_etcd_keepalive *ka;

	if (!l || l->freed)
		return NULL;
	ka = l->ka;
	l->freed = true;
	if (ka) {
		efs_list_del(&l->link);
		l->ka = NULL;
	}
	if (l->probe)
		efs_etcd_call_cancel(l->probe);
	uv_close((uv_handle_t *)&l->tick, lease_tick_closed);
	return NULL;
}

int64_t efs_etcd_lease_id(const struct efs_etcd_lease *l)
{
	return l->id;
}

int64_t efs_etcd_lease_ttl(const struct efs_etcd_lease *l)
{
	return (int64_t)(l->ttl_ns / EFS_NSEC_PER_SEC);
}

uint64_t efs_etcd_lease_last_ack_send_ns(const struct efs_etcd_lease *l)
{
	return l->last_ack_send_ns;
}

uint64_t efs_etcd_lease_deadline_ns(const struct efs_etcd_lease *l)
{
	return l->last_ack_send_ns + l->ttl_ns;
}

bool efs_etcd_lease_is_at_risk(const struct efs_etcd_lease *l)
{
	return l->at_risk;
}

bool efs_etcd_lease_is_gone(const struct efs_etcd_lease *l)
{
	return l->gone;
}

void efs_etcd_lease_get_stats(const struct efs_etcd_lease *l, struct efs_etcd_lease_stats *ret)
{
	*ret = l->stats;
}

void efs_etcd_lease_fault_pause(struct efs_etcd_lease *l, bool paused)
{
#if EFS_FAULT_HOOKS
	l->paused = paused;
	if (!paused)
		l->next_send_ns = 0;
#else
	(void)l;
	(void)paused;
#endif
}
