/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd capacity guard: a Status poll on the loop feeding a pure decision
 * (efs_capacity_decide), and a state the filesystem reads before growing
 * metadata. See capacity.h.
 */
#include "maint/capacity.h"

#include <errno.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"
#include "util/metrics.h"

/* Shortest time between two Status calls asked for by errors or rechecks. */
#define RECHECK_GAP_MS 200

/*
 * The argument of the Status call in flight. The call points at this, not
 * at the monitor, so that efs_capacity_free can return at once: it clears
 * |cap| and cancels the call, whose callback later only frees this.
 */
struct pending {
	struct efs_capacity *cap;
};

struct efs_capacity {
	uv_loop_t *loop;
	struct efs_etcd *c;
	struct efs_capacity_limits lim;
	uint32_t interval_ms;
	efs_capacity_state_cb state_cb;
	void *arg;

	enum efs_capacity_state state;
	uv_timer_t *timer;
	struct pending *inflight;    /* the Status call in flight, or NULL */
	struct efs_etcd_call *call;  /* its handle */
	uint64_t call_start_ns;	     /* when it was started */
	uint64_t last_start_ms;	     /* uv_now() of the last start (rate of rechecks) */
	bool started;		     /* a Status call was ever started */
	bool recheck;		     /* ask again soon after the call in flight */
	uint64_t nospace_ns;	     /* last note_error(-ENOSPC), mono ns (0: none) */
	struct efs_capacity_stats st; /* |state| is kept in st.state as well */
};

static void timer_cb(uv_timer_t *t);

/* ---- The decision ---- */

/*
 * The smallest size s with s * 100 >= quota * pct, for pct <= 100, without
 * overflow: quota = 100 q + r gives quota * pct / 100 = q pct + r pct / 100.
 */
static uint64_t threshold(uint64_t quota, unsigned pct)
{
	return quota / 100 * pct + (quota % 100 * pct + 99) / 100;
}

enum efs_capacity_state efs_capacity_decide(enum efs_capacity_state prev,
					    const struct efs_capacity_limits *l,
					    const struct efs_capacity_sample *s)
{
	if (s->nospace_alarm)
		return EFS_CAPACITY_FULL;
	if (s->in_use >= threshold(l->quota, l->low_pct) ||
	    s->db_size >= threshold(l->quota, l->db_pct))
		return EFS_CAPACITY_LOW;
	if (prev != EFS_CAPACITY_OK && s->in_use >= threshold(l->quota, l->ok_pct))
		return EFS_CAPACITY_LOW;
	return EFS_CAPACITY_OK;
}

enum efs_capacity_state efs_capacity_decide_error(enum efs_capacity_state prev, int err)
{
	return err == -ENOSPC ? EFS_CAPACITY_FULL : prev;
}

void efs_capacity_sample_from_status(const Etcdserverpb__StatusResponse *resp,
				     struct efs_capacity_sample *ret)
{
	struct efs_capacity_sample s = {0};

	s.db_size = resp->dbsize > 0 ? (uint64_t)resp->dbsize : 0;
	s.in_use = resp->dbsizeinuse > 0 ? (uint64_t)resp->dbsizeinuse : s.db_size;
	/* etcd 3.4 lists each alarm as "memberID:<id> alarm:NOSPACE ". */
	for (size_t i = 0; i < resp->n_errors; i++)
		if (resp->errors[i] && strstr(resp->errors[i], "alarm:NOSPACE"))
			s.nospace_alarm = true;
	*ret = s;
}

const char *efs_capacity_state_name(enum efs_capacity_state st)
{
	switch (st) {
	case EFS_CAPACITY_OK:
		return "ok";
	case EFS_CAPACITY_LOW:
		return "low";
	case EFS_CAPACITY_FULL:
		return "full";
	}
	return "?";
}

/* ---- The monitor ---- */

/*
 * Reports a change. The callback may free the monitor, so every caller does
 * this last.
 */
static void set_state(struct efs_capacity *cap, enum efs_capacity_state st)
{
	enum efs_capacity_state old = cap->state;

	if (st == old)
		return;
	cap->state = st;
	cap->st.state = st;
	if (cap->state_cb)
		cap->state_cb(cap, old, st, cap->arg);
}

/* Delay before a recheck may start: RECHECK_GAP_MS (at most the interval)
 * after the last start. */
static uint64_t recheck_delay(const struct efs_capacity *cap)
{
	uint64_t gap = cap->interval_ms < RECHECK_GAP_MS ? cap->interval_ms : RECHECK_GAP_MS;
	uint64_t now = uv_now(cap->loop);

	if (!cap->started || now >= cap->last_start_ms + gap)
		return 0;
	return cap->last_start_ms + gap - now;
}

/* Asks Status again soon: after the call in flight, or once the gap since
 * the last start has passed (replacing the regular timer). */
static void request_check(struct efs_capacity *cap)
{
	if (cap->inflight) {
		cap->recheck = true;
		return;
	}
	uv_timer_start(cap->timer, timer_cb, recheck_delay(cap), 0);
}

static void status_done(struct efs_etcd_result *r, void *arg)
{
	struct pending *p = arg;
	struct efs_capacity *cap = p->cap;
	enum efs_capacity_state next;
	struct efs_capacity_sample s;

	efs_mem_free(p);
	if (!cap)
		return;
	cap->inflight = NULL;
	cap->call = NULL;
	next = cap->state;
	if (r->err) {
		cap->st.check_failures++;
		cap->st.last_err = r->err;
		efs_log_debug("capacity: Status failed: %s (%d), state stays %s", r->message,
			      r->err, efs_capacity_state_name(cap->state));
	} else {
		efs_capacity_sample_from_status((const Etcdserverpb__StatusResponse *)r->resp, &s);
		cap->st.checks++;
		cap->st.known = true;
		cap->st.db_size = s.db_size;
		cap->st.in_use = s.in_use;
		cap->st.alarm = s.nospace_alarm;
		cap->st.last_check_ns = efs_clock_mono_ns();
		/* An answer to a call sent before the last "database space
		 * exceeded" may predate the alarm: it cannot end FULL. The
		 * recheck that error asked for decides. */
		if (cap->state == EFS_CAPACITY_FULL && cap->call_start_ns <= cap->nospace_ns)
			s.nospace_alarm = true;
		next = efs_capacity_decide(cap->state, &cap->lim, &s);
	}
	if (cap->recheck) {
		cap->recheck = false;
		uv_timer_start(cap->timer, timer_cb, recheck_delay(cap), 0);
	} else {
		uv_timer_start(cap->timer, timer_cb, cap->interval_ms, 0);
	}
	set_state(cap, next);
}

static void timer_cb(uv_timer_t *t)
{
	Etcdserverpb__StatusRequest req = ETCDSERVERPB__STATUS_REQUEST__INIT;
	struct efs_capacity *cap = t->data;
	struct pending *p;
	int r;

	if (!cap || cap->inflight)
		return;
	cap->started = true;
	cap->last_start_ms = uv_now(cap->loop);
	cap->call_start_ns = efs_clock_mono_ns();
	r = -ENOMEM;
	p = efs_mem_calloc(1, sizeof(*p));
	if (!p)
		goto out_fail;
	p->cap = cap;
	r = efs_etcd_call(cap->c, EFS_ETCD_STATUS, &req.base, NULL, status_done, p, &cap->call);
	if (r < 0)
		goto out_free_p;
	cap->inflight = p;
	return;

out_free_p:
	efs_mem_free(p);
out_fail:
	cap->call = NULL;
	cap->st.check_failures++;
	cap->st.last_err = r;
	efs_log_debug("capacity: cannot start Status: %s", strerror(-r));
	uv_timer_start(cap->timer, timer_cb, cap->interval_ms, 0);
}

int efs_capacity_new(struct efs_capacity **ret, uv_loop_t *loop, struct efs_etcd *client,
		     const struct efs_capacity_opts *opts)
{
	static const struct efs_capacity_opts defaults;
	const struct efs_capacity_opts *o = opts ? opts : &defaults;
	struct efs_capacity *cap;
	unsigned low, ok, db;
	int r;

	if (!ret || !loop || !client || efs_etcd_loop(client) != loop)
		return -EINVAL;
	low = o->low_pct ? o->low_pct : EFS_CAPACITY_LOW_PCT_DEFAULT;
	ok = o->ok_pct ? o->ok_pct : EFS_CAPACITY_OK_PCT_DEFAULT;
	db = o->db_pct ? o->db_pct : EFS_CAPACITY_DB_PCT_DEFAULT;
	if (low > 100 || ok >= low || db > 100)
		return -EINVAL;
	cap = efs_mem_calloc(1, sizeof(*cap));
	if (!cap)
		return -ENOMEM;
	cap->loop = loop;
	cap->c = client;
	cap->lim.quota = o->quota_bytes ? o->quota_bytes : EFS_CAPACITY_QUOTA_DEFAULT;
	cap->lim.low_pct = low;
	cap->lim.ok_pct = ok;
	cap->lim.db_pct = db;
	cap->interval_ms = o->interval_ms ? o->interval_ms : EFS_CAPACITY_INTERVAL_DEFAULT_MS;
	cap->state_cb = o->state_cb;
	cap->arg = o->arg;
	cap->state = EFS_CAPACITY_OK;
	cap->st.state = EFS_CAPACITY_OK;
	cap->st.quota = cap->lim.quota;
	r = -ENOMEM;
	cap->timer = efs_timer_new(loop, cap);
	if (!cap->timer)
		goto out_free_cap;
	uv_timer_start(cap->timer, timer_cb, 0, 0);
	*ret = cap;
	return 0;

out_free_cap:
	efs_mem_free(cap);
	return r;
}

struct efs_capacity *efs_capacity_free(struct efs_capacity *cap)
{
	if (!cap)
		return NULL;
	if (cap->inflight) {
		cap->inflight->cap = NULL;
		efs_etcd_call_cancel(cap->call);
	}
	cap->timer = efs_timer_free(cap->timer);
	efs_mem_free(cap);
	return NULL;
}

int efs_capacity_check_growth(const struct efs_capacity *cap)
{
	return cap && cap->state != EFS_CAPACITY_OK ? -ENOSPC : 0;
}

void efs_capacity_note_error(struct efs_capacity *cap, int err)
{
	if (!cap || err != -ENOSPC)
		return;
	cap->st.nospace_errors++;
	cap->nospace_ns = efs_clock_mono_ns();
	request_check(cap);
	set_state(cap, efs_capacity_decide_error(cap->state, err));
}

void efs_capacity_recheck(struct efs_capacity *cap)
{
	if (cap)
		request_check(cap);
}

enum efs_capacity_state efs_capacity_state(const struct efs_capacity *cap)
{
	return cap->state;
}

void efs_capacity_get_stats(const struct efs_capacity *cap, struct efs_capacity_stats *ret)
{
	*ret = cap->st;
}

/* ---- Metrics ---- */

static const struct efs_capacity *slot_get(void *arg)
{
	struct efs_capacity *const *slot = arg;

	return *slot;
}

static double gauge_db(void *arg)
{
	const struct efs_capacity *cap = slot_get(arg);

	return cap ? (double)cap->st.db_size : 0;
}

static double gauge_in_use(void *arg)
{
	const struct efs_capacity *cap = slot_get(arg);

	return cap ? (double)cap->st.in_use : 0;
}

static double gauge_quota(void *arg)
{
	const struct efs_capacity *cap = slot_get(arg);

	return cap ? (double)cap->lim.quota : 0;
}

static double gauge_low(void *arg)
{
	const struct efs_capacity *cap = slot_get(arg);

	return cap && cap->state != EFS_CAPACITY_OK ? 1 : 0;
}

static double gauge_full(void *arg)
{
	const struct efs_capacity *cap = slot_get(arg);

	return cap && cap->state == EFS_CAPACITY_FULL ? 1 : 0;
}

int efs_capacity_register_metrics(struct efs_capacity *const *slot, struct efs_metrics *m)
{
	static const struct {
		const char *name;
		const char *help;
		efs_gauge_fn fn;
	} gauges[] = {
		{"etcfs_etcd_db_bytes", "etcd database size (Status dbSize)", gauge_db},
		{"etcfs_etcd_db_in_use_bytes", "etcd database size in use (Status dbSizeInUse)",
		 gauge_in_use},
		{"etcfs_etcd_quota_bytes", "etcd backend quota the daemon was told", gauge_quota},
		{"etcfs_metadata_space_low",
		 "1 when metadata growth is refused with ENOSPC (etcd near its quota or full)",
		 gauge_low},
		{"etcfs_etcd_nospace_alarm", "1 when etcd's NOSPACE alarm is up", gauge_full},
	};

	if (!slot || !m)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(gauges) / sizeof(gauges[0]); i++)
		if (!efs_metrics_gauge_fn(m, gauges[i].name, gauges[i].help, NULL, gauges[i].fn,
					  (void *)slot))
			return -ENOMEM;
	return 0;
}
