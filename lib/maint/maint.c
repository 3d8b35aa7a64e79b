/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcd maintenance by one elected node: one timer, at most one call in
 * flight, a Txn per step (election or holder check plus the pins), then a
 * Compact and a size reading for the holder. See maint.h.
 */
#include "maint/maint.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "etcd/grpc.h"
#include "etcd/kv.h"
#include "etcd/txn.h"
#include "maint/capacity.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/metrics.h"
#include "util/timer.h"

/* Deadline of a physical compaction (it answers once the space is freed). */
#define COMPACT_TIMEOUT_MS 30000

/*
 * The argument of the call in flight. The call points at this, not at the
 * object, so that efs_maint_free can return at once: it clears |mt|, and
 * the callback later only frees this.
 */
struct pending {
	struct efs_maint *mt;
	bool holder_txn; /* the Txn was the holder's check (else an election) */
	int64_t target;	 /* the compaction's revision */
};

struct efs_maint {
	uv_loop_t *loop;
	struct efs_etcd *c;
	struct efs_session *s;
	struct efs_meta_ns ns;
	struct efs_capacity *cap;
	uint32_t interval_ms;
	uint32_t elect_ms;
	int64_t retain;
	unsigned defrag_pct;
	uint64_t defrag_min;

	uv_timer_t *timer;
	struct pending *inflight;
	bool started;
	int64_t lease; /* the lease the role was won with (0: not holder) */
	struct efs_maint_stats st;

	struct efs_gauge *g_leader;
	struct efs_gauge *g_compacted;
	struct efs_gauge *g_defrag;
	struct efs_counter *n_compactions;
};

static void timer_cb(uv_timer_t *t);

/* ---- The decision ---- */

int64_t efs_maint_target(int64_t rev, int64_t retain, int64_t min_pin, int64_t done)
{
	int64_t t = rev - retain;

	if (min_pin > 0 && min_pin < t)
		t = min_pin;
	return t > 0 && t > done ? t : 0;
}

bool efs_maint_defrag_wanted(uint64_t db_size, uint64_t in_use, unsigned pct,
			     uint64_t min_bytes)
{
	uint64_t free_bytes = db_size > in_use ? db_size - in_use : 0;

	/* free * 100 > db * pct, without overflow: for db = 100 q + r, an
	 * integer exceeds db * pct / 100 exactly when it exceeds its floor,
	 * q * pct + r * pct / 100 (pct <= 100). */
	return free_bytes > min_bytes &&
	       free_bytes > db_size / 100 * pct + db_size % 100 * pct / 100;
}

int efs_maint_parse_pin(const void *value, size_t len, int64_t *ret)
{
	const char *p = value;
	int64_t v = 0;

	if (!p || len == 0 || len > 19)
		return -EBADMSG;
	for (size_t i = 0; i < len; i++) {
		if (p[i] < '0' || p[i] > '9' || v > (INT64_MAX - (p[i] - '0')) / 10)
			return -EBADMSG;
		v = v * 10 + (p[i] - '0');
	}
	if (v <= 0)
		return -EBADMSG;
	*ret = v;
	return 0;
}

/* ---- Role ---- */

static void set_leader(struct efs_maint *mt, int64_t lease)
{
	bool was = mt->lease != 0;

	mt->lease = lease;
	mt->st.leader = lease != 0;
	efs_gauge_set(mt->g_leader, lease ? 1 : 0);
	if (lease && !was) {
		mt->st.elections_won++;
		efs_log_info("maintenance: this node (%s) now compacts etcd (lease %" PRIx64 ")",
			     efs_session_node(mt->s), (uint64_t)lease);
	} else if (!lease && was) {
		efs_log_info("maintenance: this node (%s) no longer compacts etcd",
			     efs_session_node(mt->s));
	}
}

static void note_error(struct efs_maint *mt, int err, const char *what, const char *msg)
{
	mt->st.errors++;
	mt->st.last_err = err;
	efs_log_debug("maintenance: %s failed: %s (%d)", what, msg ? msg : strerror(-err), err);
}

/* Next step after |ms| (none while a call is in flight: its end schedules). */
static void schedule(struct efs_maint *mt, uint64_t ms)
{
	if (!mt->inflight)
		uv_timer_start(mt->timer, timer_cb, ms, 0);
}

static void schedule_next(struct efs_maint *mt)
{
	schedule(mt, mt->lease ? mt->interval_ms : mt->elect_ms);
}

static struct pending *pending_new(struct efs_maint *mt)
{
	struct pending *p = efs_mem_calloc(1, sizeof(*p));

	if (p)
		p->mt = mt;
	return p;
}

/* Takes the object back from a finished call; NULL when it was freed. */
static struct efs_maint *pending_end(struct pending *p)
{
	struct efs_maint *mt = p->mt;

	efs_mem_free(p);
	if (mt)
		mt->inflight = NULL;
	return mt;
}

/* ---- Sizes ---- */

static void sizes_known(struct efs_maint *mt, uint64_t db, uint64_t in_use)
{
	bool want = efs_maint_defrag_wanted(db, in_use, mt->defrag_pct, mt->defrag_min);

	mt->st.db_size = db;
	mt->st.in_use = in_use;
	if (want && !mt->st.defrag_wanted)
		efs_log_warn("maintenance: etcd database %" PRIu64 " bytes, %" PRIu64
			     " in use: defragment it, one member at a time "
			     "(etcdctl --endpoints=<member> defrag)",
			     db, in_use);
	mt->st.defrag_wanted = want;
	efs_gauge_set(mt->g_defrag, want ? 1 : 0);
}

static void status_done(struct efs_etcd_result *r, Etcdserverpb__StatusResponse *resp, void *arg)
{
	struct efs_maint *mt = pending_end(arg);
	struct efs_capacity_sample s;

	if (!mt)
		return;
	if (r->err) {
		note_error(mt, r->err, "Status", r->message);
	} else {
		efs_capacity_sample_from_status(resp, &s);
		sizes_known(mt, s.db_size, s.in_use);
	}
	schedule_next(mt);
}

/* After sending the call |what| for |p| (|r| its result; NULL |p|: no
 * memory): the call is in flight (0), or |p| is freed and the error noted
 * (the negative errno). */
static int in_flight(struct efs_maint *mt, struct pending *p, int r, const char *what)
{
	if (r == 0) {
		mt->inflight = p;
		return 0;
	}
	efs_mem_free(p);
	note_error(mt, r, what, NULL);
	return r;
}

/* The holder's last part of a step: the sizes, then the next step. */
static void check_sizes(struct efs_maint *mt)
{
	struct efs_capacity_stats cs;
	struct pending *p;
	int r;

	if (mt->cap) {
		efs_capacity_get_stats(mt->cap, &cs);
		if (cs.known)
			sizes_known(mt, cs.db_size, cs.in_use);
		schedule_next(mt);
		return;
	}
	p = pending_new(mt);
	r = p ? efs_etcd_status(mt->c, NULL, status_done, p) : -ENOMEM;
	if (in_flight(mt, p, r, "Status") < 0)
		schedule_next(mt);
}

/* ---- Compaction ---- */

static void compact_done(struct efs_etcd_result *r, Etcdserverpb__CompactionResponse *resp,
			 void *arg)
{
	struct pending *p = arg;
	int64_t target = p->target;
	struct efs_maint *mt = pending_end(p);

	(void)resp;
	if (!mt)
		return;
	if (r->err == 0 || r->err == EFS_ETCD_ECOMPACTED) {
		if (r->err == 0) {
			mt->st.compactions++;
			efs_counter_inc(mt->n_compactions);
			efs_log_debug("maintenance: compacted etcd to revision %" PRId64, target);
		} else {
			mt->st.compact_skips++;
		}
		if (target > mt->st.compacted_rev) {
			mt->st.compacted_rev = target;
			efs_gauge_set(mt->g_compacted, (double)target);
		}
		efs_capacity_recheck(mt->cap);
	} else {
		note_error(mt, r->err, "Compact", r->message);
	}
	check_sizes(mt);
}

static void compact(struct efs_maint *mt, int64_t target)
{
	struct efs_etcd_callopts co = {.timeout_ms = COMPACT_TIMEOUT_MS};
	struct pending *p;
	int r;

	p = pending_new(mt);
	if (p)
		p->target = target;
	r = p ? efs_etcd_compact(mt->c, target, true, &co, compact_done, p) : -ENOMEM;
	if (in_flight(mt, p, r, "Compact") < 0)
		check_sizes(mt);
}

/* The smallest pinned revision in |pins| into *|ret| (0: no pin). */
static int min_pin(const Etcdserverpb__RangeResponse *pins, int64_t *ret)
{
	int64_t min = 0, v;

	for (size_t i = 0; i < pins->n_kvs; i++) {
		const Mvccpb__KeyValue *kv = pins->kvs[i];

		if (efs_maint_parse_pin(kv->value.data, kv->value.len, &v) < 0) {
			efs_log_warn("maintenance: pin %.*s holds no revision (\"%.*s\"): "
				     "not compacting until it is fixed",
				     (int)kv->key.len, (const char *)kv->key.data,
				     (int)(kv->value.len > 40 ? 40 : kv->value.len),
				     (const char *)kv->value.data);
			return -EBADMSG;
		}
		if (min == 0 || v < min)
			min = v;
	}
	*ret = min;
	return 0;
}

/* The holder, with the pins read at revision |rev|. */
static void holder_step(struct efs_maint *mt, const Etcdserverpb__RangeResponse *pins, int64_t rev)
{
	int64_t pin = 0, target;
	int r;

	mt->st.steps++;
	mt->st.last_rev = rev;
	r = min_pin(pins, &pin);
	if (r < 0) {
		note_error(mt, r, "reading the pins", NULL);
		check_sizes(mt);
		return;
	}
	mt->st.min_pin = pin;
	target = efs_maint_target(rev, mt->retain, pin, mt->st.compacted_rev);
	if (target == 0) {
		check_sizes(mt);
		return;
	}
	compact(mt, target);
}

/* ---- Steps ---- */

/* The maint key's lease in |resp| (the failure branch's range), 0 if none. */
static int64_t holder_lease(const Etcdserverpb__TxnResponse *resp)
{
	Etcdserverpb__RangeResponse *rr;

	if (efs_etcd_txn_resp_range(resp, 0, &rr) < 0 || rr->n_kvs == 0)
		return 0;
	return rr->kvs[0]->lease;
}

static void txn_done(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct pending *p = arg;
	bool holder_txn = p->holder_txn;
	struct efs_maint *mt = pending_end(p);
	Etcdserverpb__RangeResponse *pins;
	int64_t lease, rev;
	int e;

	if (!mt)
		return;
	lease = efs_session_lease_id(mt->s);
	if (r->err) {
		note_error(mt, r->err, holder_txn ? "holder check" : "election", r->message);
		/* The role is kept only while a check confirms it. */
		set_leader(mt, 0);
		schedule(mt, mt->elect_ms);
		return;
	}
	rev = resp->header ? resp->header->revision : 0;
	if (!resp->succeeded) {
		/* Someone holds it: maybe us (an election whose answer was
		 * lost, or whose guard compare failed after all). */
		if (lease && holder_lease(resp) == lease && efs_session_is_active(mt->s)) {
			set_leader(mt, lease);
			schedule(mt, 0);
			return;
		}
		set_leader(mt, 0);
		schedule(mt, mt->elect_ms);
		return;
	}
	e = efs_etcd_txn_resp_range(resp, holder_txn ? 0 : 1, &pins);
	if (e < 0) {
		note_error(mt, e, "reading the pins", NULL);
		schedule_next(mt);
		return;
	}
	set_leader(mt, lease);
	holder_step(mt, pins, rev);
}

/* Builds the step's Txn: the holder's check (maint still on our lease) or
 * an election (maint absent: create it on our lease); both read the pins on
 * success and the maint key on failure. */
static int build_txn(struct efs_maint *mt, bool holder, int64_t lease, struct efs_etcd_txn **ret)
{
	struct efs_meta_key key;
	struct efs_meta_range pins;
	struct efs_etcd_txn *t;
	const char *node = efs_session_node(mt->s);
	int r;

	r = efs_meta_key_maint(&mt->ns, &key);
	if (r < 0)
		return r;
	r = efs_meta_range_pins(&mt->ns, &pins);
	if (r < 0)
		return r;
	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	if (holder) {
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, key.buf,
					 key.len, lease);
	} else {
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, key.buf,
					 key.len, 0);
		if (r == 0)
			r = efs_session_guard(mt->s, t);
		if (r == 0)
			r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, key.buf, key.len, node,
					     strlen(node), lease);
	}
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, pins.key.buf, pins.key.len,
				       pins.end.buf, pins.end.len);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_FAILURE, key.buf, key.len, NULL, 0);
	if (r < 0) {
		efs_etcd_txn_free(t);
		return r;
	}
	*ret = t;
	return 0;
}

static void timer_cb(uv_timer_t *tm)
{
	struct efs_maint *mt = tm->data;
	struct efs_etcd_txn *t = NULL;
	struct pending *p;
	int64_t lease;
	bool holder;
	int r;

	if (!mt || mt->inflight)
		return;
	lease = efs_session_lease_id(mt->s);
	if (!efs_session_is_active(mt->s) || lease == 0) {
		set_leader(mt, 0);
		uv_timer_start(mt->timer, timer_cb, mt->elect_ms, 0);
		return;
	}
	/* A new lease (the session was re-registered) lost the key. */
	if (mt->lease && mt->lease != lease)
		set_leader(mt, 0);
	holder = mt->lease != 0;
	r = build_txn(mt, holder, lease, &t);
	p = r == 0 ? pending_new(mt) : NULL;
	if (p)
		p->holder_txn = holder;
	if (r == 0)
		r = p ? efs_etcd_txn(mt->c, efs_etcd_txn_request(t), NULL, txn_done, p) : -ENOMEM;
	efs_etcd_txn_free(t);
	if (in_flight(mt, p, r, holder ? "holder check" : "election") < 0) {
		set_leader(mt, 0);
		uv_timer_start(mt->timer, timer_cb, mt->elect_ms, 0);
	}
}

/* ---- Lifecycle ---- */

static int register_metrics(struct efs_maint *mt, struct efs_metrics *m)
{
	mt->g_leader = efs_metrics_gauge(m, "etcfs_maint_leader",
					 "1 on the node elected to compact etcd", NULL);
	mt->n_compactions = efs_metrics_counter(m, "etcfs_maint_compactions_total",
						"etcd compactions done by this node", NULL);
	mt->g_compacted = efs_metrics_gauge(m, "etcfs_maint_compacted_revision",
					    "revision this node last compacted etcd to", NULL);
	mt->g_defrag = efs_metrics_gauge(m, "etcfs_maint_defrag_wanted",
					 "1 when the etcd database wants defragmentation "
					 "(seen by the elected node)",
					 NULL);
	if (!mt->g_leader || !mt->n_compactions || !mt->g_compacted || !mt->g_defrag)
		return -ENOMEM;
	return 0;
}

int efs_maint_new(struct efs_maint **ret, uv_loop_t *loop, struct efs_etcd *c,
		  struct efs_session *s, const struct efs_meta_ns *ns, struct efs_metrics *m,
		  const struct efs_maint_opts *o)
{
	static const struct efs_maint_opts defaults;
	struct efs_maint *mt;
	int r;

	if (!o)
		o = &defaults;
	if (!ret || !loop || !c || !s || !ns || efs_etcd_loop(c) != loop ||
	    o->defrag_pct > 100 || o->retain_revs < 0)
		return -EINVAL;
	mt = efs_mem_calloc(1, sizeof(*mt));
	if (!mt)
		return -ENOMEM;
	mt->loop = loop;
	mt->c = c;
	mt->s = s;
	mt->ns = *ns;
	mt->cap = o->capacity;
	mt->interval_ms = o->interval_ms ? o->interval_ms : EFS_MAINT_INTERVAL_DEFAULT_MS;
	mt->elect_ms = o->elect_ms ? o->elect_ms : EFS_MAINT_ELECT_DEFAULT_MS;
	mt->retain = o->retain_revs ? o->retain_revs : EFS_MAINT_RETAIN_DEFAULT;
	mt->defrag_pct = o->defrag_pct ? o->defrag_pct : EFS_MAINT_DEFRAG_PCT_DEFAULT;
	mt->defrag_min = o->defrag_min_bytes ? o->defrag_min_bytes : EFS_MAINT_DEFRAG_MIN_DEFAULT;
	if (m) {
		r = register_metrics(mt, m);
		if (r < 0)
			goto out_free;
	}
	r = -ENOMEM;
	mt->timer = efs_timer_new(loop, mt);
	if (!mt->timer)
		goto out_free;
	*ret = mt;
	return 0;

out_free:
	efs_mem_free(mt);
	return r;
}

int efs_maint_start(struct efs_maint *mt)
{
	if (!mt)
		return -EINVAL;
	if (mt->started)
		return -EALREADY;
	mt->started = true;
	uv_timer_start(mt->timer, timer_cb, 0, 0);
	return 0;
}

void efs_maint_session_changed(struct efs_maint *mt)
{
	if (!mt || !mt->started)
		return;
	if (!efs_session_is_active(mt->s)) {
		set_leader(mt, 0);
		return;
	}
	schedule(mt, 0);
}

struct efs_maint *efs_maint_free(struct efs_maint *mt)
{
	if (!mt)
		return NULL;
	if (mt->inflight)
		mt->inflight->mt = NULL;
	efs_gauge_set(mt->g_leader, 0);
	mt->timer = efs_timer_free(mt->timer);
	efs_mem_free(mt);
	return NULL;
}

void efs_maint_get_stats(const struct efs_maint *mt, struct efs_maint_stats *ret)
{
	*ret = mt->st;
}
