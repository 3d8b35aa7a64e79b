/* SPDX-License-Identifier: Apache-2.0 */
#include "lock/session.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "config.h"
#include "etcd/kv.h"
#include "etcd/lease.h"
#include "etcd/txn.h"
#include "lock/session-fsm.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"

/* Registration attempts at start before giving up (races, unknown outcomes). */
#define REG_START_ATTEMPTS 4
/* Delay between re-registration attempts after GONE. */
#define REG_RETRY_MS 200
/* How often acknowledged renewals are looked for while suspended. */
#define SUSPENDED_POLL_MS 100

/*
 * Pending etcd calls and timers point at this, not at the session, so that
 * efs_session_free can return at once: it clears |s| and the callbacks that
 * come later see NULL and only release their reference.
 */
struct sref {
	struct efs_session *s;
	unsigned refs;
};

/* Argument of one etcd call. */
struct scall {
	struct sref *ref;
	int64_t lease; /* the lease the call is about */
	bool from_lease; /* confirm_gone: the lease module reported GONE */
};

struct efs_session {
	uv_loop_t *loop;
	struct efs_etcd *c;
	struct sref *ref;
	struct efs_meta_ns ns;
	char node[EFS_META_NODE_MAX + 1];
	char *machine_id;
	char *boot_id; /* "" when unreadable */
	uint64_t pid_start; /* our start time (0: unknown) */
	uint64_t pid_ns;    /* our pid namespace (0: unknown) */
	int32_t pid;	    /* ours: the process never forks after the start */
	char *hostname;
	char *metrics_addr;
	bool cow;
	int64_t ttl_s;
	uint32_t suspend_ms;
	uint32_t quorum_loss_ms;

	struct efs_session_fsm fsm;
	enum efs_session_state state; /* as last reported */
	efs_session_state_cb state_cb;
	efs_session_done_cb done; /* start */
	void *arg;
	efs_session_done_cb leave_done;
	void *leave_arg;

	struct efs_etcd_keepalive *ka;
	struct efs_etcd_lease *lease;
	int64_t lease_id;
	int64_t lease_ttl_s; /* granted TTL of |lease_id| (0: none yet) */
	uint64_t generation;
	int64_t gen_mod_rev;
	uint64_t started_ns;
	uint64_t last_ack_seen_ns;
	/* Send time of the last acknowledged renewal of a lease the lease
	 * module reported gone, while that report is being checked. */
	uint64_t lost_last_ack_ns;

	/* Registration in progress. */
	bool registering;
	bool reregister; /* after GONE (retries forever) rather than at start */
	int reg_attempts;
	int64_t pending_lease; /* granted, not yet registered (0: none) */
	uint64_t pending_sent_ns;
	int64_t pending_ttl_s;
	uint64_t read_gen;
	int64_t read_gen_mod;

	uv_timer_t *tick;  /* fsm deadlines */
	uv_timer_t *retry; /* re-registration backoff */
	uv_timer_t *kick;  /* deferred waiter callbacks */

	struct efs_list waiters; /* efs_session_waiter.link */
	struct efs_list failed;  /* answered -EIO on the next kick */
	struct efs_session_stats stats;
};

static void reg_begin(struct efs_session *s);
static void reschedule(struct efs_session *s);

/* ---- References ---- */

static struct sref *ref_get(struct sref *r)
{
	r->refs++;
	return r;
}

/* Drops a reference; returns the session, NULL when it was freed. */
static struct efs_session *ref_put(struct sref *r)
{
	struct efs_session *s = r->s;

	if (--r->refs == 0)
		efs_mem_free(r);
	return s;
}

static struct scall *scall_new(struct efs_session *s, int64_t lease)
{
	struct scall *sc = efs_mem_calloc(1, sizeof(*sc));

	if (!sc)
		return NULL;
	sc->ref = ref_get(s->ref);
	sc->lease = lease;
	return sc;
}

/* Ends a call argument; returns its session or NULL when freed. */
static struct efs_session *scall_end(struct scall *sc)
{
	struct efs_session *s = ref_put(sc->ref);

	efs_mem_free(sc);
	return s;
}

/* ---- Waiters ---- */

/*
 * Answers every waiter of |h| with |status|. Waiter callbacks may free the
 * session: returns false then (stop touching |s|).
 */
static bool answer_all(struct efs_session *s, struct efs_list *h, int status)
{
	struct sref *r = ref_get(s->ref);
	bool alive = true;

	while (alive && !efs_list_empty(h)) {
		struct efs_session_waiter *w =
			efs_list_entry(efs_list_pop(h), struct efs_session_waiter, link);
		bool changed = status == 0 && w->generation != s->generation;

		if (status == -EIO)
			s->stats.waits_failed++;
		w->cb(w, status, changed);
		alive = r->s != NULL;
	}
	return ref_put(r) != NULL;
}

static void kick_cb(uv_timer_t *t)
{
	struct efs_session *s = t->data;

	if (!s)
		return;
	answer_all(s, &s->failed, s->state == EFS_SESSION_CLOSED ? -ESHUTDOWN : -EIO);
}

/* ---- State ---- */

/* Reports a state change; false when the callback freed the session. */
static bool set_state(struct efs_session *s, enum efs_session_state st)
{
	enum efs_session_state old = s->state;
	struct sref *r;

	if (old == st)
		return true;
	s->state = st;
	efs_log_debug("session %s: %s -> %s", s->node, efs_session_state_name(old),
		      efs_session_state_name(st));
	if (!s->state_cb)
		return true;
	r = ref_get(s->ref);
	s->state_cb(s, old, st, s->arg);
	return ref_put(r) != NULL;
}

static void drop_lease(struct efs_session *s)
{
	if (s->lease) {
		struct efs_session_stats st;

		/* Keep the lease's renewal gaps in the session's counters. */
		efs_session_get_stats(s, &st);
		s->stats.renew_max_gap_ns = st.renew_max_gap_ns;
	}
	s->lease = efs_etcd_lease_free(s->lease);
}

static void ttl_done(int status, int64_t ttl_s, int64_t granted_ttl_s, void *arg);
static void confirm_gone(struct efs_session *s, bool from_lease);
static void lease_event(struct efs_etcd_lease *l, int status, enum efs_etcd_lease_event ev,
			uint64_t at_ns, void *arg);

/* Carries out the actions |a| of the state machine. */
static void act(struct efs_session *s, unsigned a)
{
	uint64_t now = efs_clock_mono_ns();

	if (a & EFS_SFSM_A_GONE) {
		s->stats.losses++;
		drop_lease(s);
		if (!set_state(s, EFS_SESSION_GONE))
			return;
	}
	if (a & EFS_SFSM_A_SUSPEND) {
		s->stats.suspends++;
		if (!set_state(s, EFS_SESSION_SUSPENDED))
			return;
	}
	if (a & EFS_SFSM_A_EXPIRE) {
		if (!set_state(s, EFS_SESSION_EXPIRED))
			return;
	}
	if (a & EFS_SFSM_A_ASK_TTL) {
		struct scall *sc = scall_new(s, s->lease_id);
		int r = sc ? efs_etcd_lease_time_to_live(s->c, s->lease_id, ttl_done, sc) : -ENOMEM;

		if (r < 0) {
			if (sc)
				scall_end(sc);
			efs_session_fsm_unreachable(&s->fsm, now);
		}
	}
	if (a & (EFS_SFSM_A_RESUME | EFS_SFSM_A_ACTIVATED)) {
		if (a & EFS_SFSM_A_RESUME)
			s->stats.resumes++;
		if (!set_state(s, EFS_SESSION_ACTIVE))
			return;
		if (!answer_all(s, &s->waiters, 0))
			return;
	}
	if (a & EFS_SFSM_A_FAIL_WAITERS) {
		if (!answer_all(s, &s->waiters, -EIO))
			return;
	}
	reschedule(s);
	if ((a & EFS_SFSM_A_REREGISTER) && !s->registering && s->state == EFS_SESSION_GONE) {
		s->reregister = true;
		s->reg_attempts = 0;
		reg_begin(s);
	}
}

static void poll_lease(struct efs_session *s, uint64_t now)
{
	uint64_t ack;

	if (!s->lease)
		return;
	ack = efs_etcd_lease_last_ack_send_ns(s->lease);
	if (ack <= s->last_ack_seen_ns)
		return; /* nothing new: only a new ack says etcd answers */
	s->last_ack_seen_ns = ack;
	act(s, efs_session_fsm_acked(&s->fsm, now, ack));
}

static void tick_cb(uv_timer_t *t)
{
	struct efs_session *s = t->data;
	struct sref *r;
	uint64_t now;

	if (!s)
		return;
	r = ref_get(s->ref);
	now = efs_clock_mono_ns();
	/* An ack seen at the deadline moves it: only then does time tell.
	 * While suspended, acks after the lease module's one RECOVERED
	 * event are seen here too (a TimeToLive that found the renewals
	 * still stale asks again at the next one). */
	if (s->lease && !efs_etcd_lease_is_gone(s->lease))
		poll_lease(s, now);
	if (r->s)
		act(s, efs_session_fsm_tick(&s->fsm, now));
	ref_put(r);
}

static void reschedule(struct efs_session *s)
{
	uint64_t next = efs_session_fsm_next_ns(&s->fsm), now = efs_clock_mono_ns();
	bool polling = s->state == EFS_SESSION_SUSPENDED || s->state == EFS_SESSION_EXPIRED;
	uint64_t ms = UINT64_MAX;

	/* Round up, so that the tick is not a millisecond early. */
	if (next != UINT64_MAX)
		ms = next > now ? (next - now + EFS_NSEC_PER_MSEC - 1) / EFS_NSEC_PER_MSEC : 0;
	if (polling && ms > SUSPENDED_POLL_MS)
		ms = SUSPENDED_POLL_MS;
	if (s->state == EFS_SESSION_CLOSED || ms == UINT64_MAX) {
		uv_timer_stop(s->tick);
		return;
	}
	uv_timer_start(s->tick, tick_cb, ms, 0);
}

static void ttl_done(int status, int64_t ttl_s, int64_t granted_ttl_s, void *arg)
{
	struct scall *sc = arg;
	int64_t lease = sc->lease;
	struct efs_session *s = scall_end(sc);
	uint64_t now = efs_clock_mono_ns();

	(void)granted_ttl_s;
	if (!s || lease != s->lease_id || s->state == EFS_SESSION_CLOSED)
		return;
	if (status < 0) {
		efs_log_debug("session %s: TimeToLive: %s", s->node, strerror(-status));
		act(s, efs_session_fsm_unreachable(&s->fsm, now));
		return;
	}
	/* etcd answers -1 for a lease it no longer has; a live one with less
	 * than a second left reads 0 (the remaining TTL is rounded down). But
	 * a negative answer is not proof: the leader computes the remaining
	 * time as expiry - now, so a lease past its expiry on that member and
	 * not yet revoked reads -1 or less too (a leader that was stopped and
	 * resumes, before it learns that it lost the leadership and the new
	 * leader extended every lease). Only a revocation removes the lease,
	 * and it deletes n/<node> with it: ask that (confirm_gone). */
	if (ttl_s >= 0) {
		act(s, efs_session_fsm_ttl(&s->fsm, now, true));
		return;
	}
	confirm_gone(s, false);
}

/*
 * Settles "the lease is gone" (a negative TimeToLive, or the lease
 * module's GONE, which a negative TimeToLive also raises) by a
 * linearizable read of n/<node>: etcd deletes the keys of a lease in the
 * same step that revokes it, so n/<node> still on the lease means the
 * lease exists. Then a TimeToLive counts as "alive" (resuming still needs
 * a fresh acknowledged renewal), and a lease the lease module gave up is
 * kept alive again by a new lease object from its last acknowledged send
 * time. Otherwise the session is lost.
 */
static void gone_read_done(struct efs_etcd_result *res, Etcdserverpb__RangeResponse *resp,
			   void *arg)
{
	struct scall *sc = arg;
	int64_t lease = sc->lease;
	bool from_lease = sc->from_lease;
	struct efs_session *s = scall_end(sc);
	uint64_t now = efs_clock_mono_ns();
	struct efs_etcd_lease_opts lo = {0};
	bool ours;
	int r;

	if (!s || lease != s->lease_id || s->state == EFS_SESSION_CLOSED ||
	    s->state == EFS_SESSION_GONE)
		return;
	if (res->err < 0) {
		efs_log_debug("session %s: reading n/%s: %s", s->node, s->node, res->message);
		if (from_lease)
			act(s, efs_session_fsm_lost(&s->fsm, now));
		else
			act(s, efs_session_fsm_unreachable(&s->fsm, now));
		return;
	}
	ours = resp->n_kvs > 0 && resp->kvs[0]->lease == lease;
	if (!from_lease) {
		act(s, efs_session_fsm_ttl(&s->fsm, now, ours));
		return;
	}
	if (!ours || s->lease) {
		if (!ours)
			act(s, efs_session_fsm_lost(&s->fsm, now));
		return;
	}
	lo.id = lease;
	lo.ttl_s = s->lease_ttl_s;
	lo.granted_ns = s->lost_last_ack_ns;
	lo.at_risk_ms = s->suspend_ms;
	if ((uint64_t)lo.ttl_s * 1000 / 4 > s->suspend_ms)
		lo.failover_ms = s->suspend_ms / 2;
	r = efs_etcd_lease_new(&s->lease, s->ka, &lo, lease_event, s);
	if (r < 0) {
		efs_log_err("session %s: renewing lease %" PRId64 " again: %s", s->node, lease,
			    strerror(-r));
		act(s, efs_session_fsm_lost(&s->fsm, now));
		return;
	}
	efs_log_info("session %s: lease %" PRIx64 " was reported gone but n/%s is still on it: "
		     "renewing it again", s->node, (uint64_t)lease, s->node);
	act(s, efs_session_fsm_reachable(&s->fsm, now));
}

static void confirm_gone(struct efs_session *s, bool from_lease)
{
	struct efs_meta_key nk;
	struct scall *sc = NULL;
	uint64_t now = efs_clock_mono_ns();
	int r;

	r = efs_meta_key_node(&s->ns, s->node, &nk);
	if (r == 0) {
		sc = scall_new(s, s->lease_id);
		r = -ENOMEM;
	}
	if (sc) {
		sc->from_lease = from_lease;
		r = efs_etcd_range(s->c, nk.buf, nk.len, NULL, NULL, gone_read_done, sc);
		if (r < 0)
			scall_end(sc);
	}
	if (r >= 0)
		return;
	efs_log_debug("session %s: reading n/%s: %s", s->node, s->node, strerror(-r));
	if (from_lease)
		act(s, efs_session_fsm_lost(&s->fsm, now));
	else
		act(s, efs_session_fsm_unreachable(&s->fsm, now));
}

static void lease_event(struct efs_etcd_lease *l, int status, enum efs_etcd_lease_event ev,
			uint64_t at_ns, void *arg)
{
	struct efs_session *s = arg;
	uint64_t now = efs_clock_mono_ns();

	(void)status;
	switch (ev) {
	case EFS_ETCD_LEASE_AT_RISK:
		act(s, efs_session_fsm_tick(&s->fsm, now));
		break;
	case EFS_ETCD_LEASE_RECOVERED:
		s->last_ack_seen_ns = at_ns > s->last_ack_seen_ns ? at_ns : s->last_ack_seen_ns;
		act(s, efs_session_fsm_acked(&s->fsm, now, at_ns));
		break;
	case EFS_ETCD_LEASE_GONE:
		/* The lease object stops renewing for good: drop it (allowed
		 * from its own callback) and check the report (confirm_gone). */
		efs_log_debug("session %s: lease %" PRId64 " gone?", s->node, s->lease_id);
		s->lost_last_ack_ns = efs_etcd_lease_last_ack_send_ns(l);
		drop_lease(s);
		confirm_gone(s, true);
		break;
	}
}

/* ---- Registration ---- */

static void start_finish(struct efs_session *s, int status)
{
	efs_session_done_cb done = s->done;

	s->done = NULL;
	if (done)
		done(s, status, s->arg);
}

static void revoke_quietly(struct efs_session *s, int64_t lease);

static void retry_cb(uv_timer_t *t)
{
	struct efs_session *s = t->data;

	if (s && s->state != EFS_SESSION_CLOSED)
		reg_begin(s);
}

/*
 * A registration attempt failed with |err|. At start: give up (CLOSED, the
 * start callback gets the error) for good errors, retry a few times for
 * races and transient ones. After GONE: retry until it works, except when
 * the node id was taken meanwhile.
 */
static void reg_fail(struct efs_session *s, int err, bool retryable)
{
	s->registering = false;
	if (s->reregister) {
		if (retryable) {
			uv_timer_start(s->retry, retry_cb, REG_RETRY_MS, 0);
			return;
		}
		efs_log_err("session %s: re-registration failed: %s", s->node, strerror(-err));
		revoke_quietly(s, s->pending_lease);
		s->pending_lease = 0;
		efs_session_fsm_close(&s->fsm);
		if (!set_state(s, EFS_SESSION_CLOSED))
			return;
		answer_all(s, &s->waiters, -ESHUTDOWN);
		return;
	}
	if (retryable && ++s->reg_attempts < REG_START_ATTEMPTS) {
		uv_timer_start(s->retry, retry_cb, REG_RETRY_MS / 4, 0);
		return;
	}
	revoke_quietly(s, s->pending_lease);
	s->pending_lease = 0;
	efs_session_fsm_close(&s->fsm);
	s->state = EFS_SESSION_CLOSED;
	start_finish(s, err);
}

static void revoke_done(int status, void *arg)
{
	struct scall *sc = arg;
	struct efs_session *s = scall_end(sc);

	if (s && status < 0 && status != -ENOENT)
		efs_log_debug("session %s: revoke: %s", s->node, strerror(-status));
}

/* Revokes |lease| without waiting for the answer (it expires anyway). */
static void revoke_quietly(struct efs_session *s, int64_t lease)
{
	struct scall *sc;

	if (!lease)
		return;
	sc = scall_new(s, lease);
	if (!sc)
		return;
	if (efs_etcd_lease_revoke(s->c, lease, revoke_done, sc) < 0)
		scall_end(sc);
}

/* The session was left or failed while a registration step was pending. */
static bool reg_cancelled(struct efs_session *s)
{
	if (s->state != EFS_SESSION_CLOSED)
		return false;
	s->registering = false;
	revoke_quietly(s, s->pending_lease);
	s->pending_lease = 0;
	return true;
}

static bool pid_is_alive(int32_t pid)
{
	if (pid <= 0)
		return false;
	return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/* Inode of our pid namespace (/proc/self/ns/pid), 0 when unknown. */
static uint64_t pid_namespace(void)
{
	struct stat st;

	if (stat("/proc/self/ns/pid", &st) < 0)
		return 0;
	return (uint64_t)st.st_ino;
}

/* Start time of |pid| (field 22 of /proc/<pid>/stat), 0 when unknown. */
static uint64_t pid_start_time(int32_t pid)
{
	char path[64], buf[1024];
	unsigned long long v;
	const char *p;
	size_t n;
	FILE *f;

	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The command name (field 2) may hold spaces and parentheses: the
	 * fields after it start after the last ')', at field 3. */
	p = strrchr(buf, ')');
	if (!p)
		return 0;
	for (int field = 3; field <= 22; field++) {
		p = strchr(p + 1, ' ');
		if (!p)
			return 0;
	}
	if (sscanf(p + 1, "%llu", &v) != 1)
		return 0;
	return (uint64_t)v;
}

static bool str_eq(const char *a, const char *b)
{
	return a && b && strcmp(a, b) == 0;
}

/*
 * Is the n/<node> record |ni|, on lease |held|, this very session's own
 * earlier one? It is when it names or is on the lease this session last
 * held, or when this process
 * wrote it (pid, machine, boot, pid namespace and start time are ours)
 * for this session (same start time of the session). Its lease may
 * still live in etcd after the session was reported lost (a false
 * report, or a lease about to expire): a lost session must always be able
 * to re-register, so such a record is taken over, never refused.
 */
static bool record_is_ours(const struct efs_session *s, const Etcfs__NodeInfo *ni, int64_t held)
{
	if (s->lease_id && (ni->lease_id == s->lease_id || held == s->lease_id))
		return true;
	return ni->pid == s->pid && str_eq(ni->machine_id, s->machine_id) &&
	       str_eq(ni->boot_id, s->boot_id) && ni->pid_ns == s->pid_ns &&
	       ni->pid_start == s->pid_start && ni->started_ns == (int64_t)s->started_ns;
}

static bool is_retryable(int err)
{
	return err == -ETIMEDOUT || err == -EAGAIN || err == -ENOTCONN || err == -ECONNRESET ||
	       err == -ECONNREFUSED || err == -ECANCELED || err == -EHOSTUNREACH ||
	       err == -ENETUNREACH || err == -EPIPE || err == -EIO;
}

static int build_keys(struct efs_session *s, struct efs_meta_key *nk, struct efs_meta_key *gk)
{
	int r = efs_meta_key_node(&s->ns, s->node, nk);

	return r < 0 ? r : efs_meta_key_gen(&s->ns, s->node, gk);
}

void efs_session_owner_self(const struct efs_session *s, struct efs_session_owner *ret)
{
	ret->machine_id = s->machine_id;
	ret->boot_id = s->boot_id;
	ret->pid_ns = s->pid_ns;
	ret->pid = s->pid;
	ret->pid_start = s->pid_start;
}

bool efs_session_owner_gone(const struct efs_session *s, const struct efs_session_owner *old)
{
	struct efs_session_owner me;
	bool running = pid_is_alive(old->pid);

	efs_session_owner_self(s, &me);
	if (old->pid == me.pid && old->pid_start == me.pid_start && str_eq(old->boot_id, me.boot_id))
		return false; /* this very process */
	return efs_session_may_take_over(old, &me, running,
					 running ? pid_start_time(old->pid) : 0);
}

/* The registration succeeded: start renewing and go ACTIVE. */
static void reg_complete(struct efs_session *s, uint64_t generation, int64_t gen_mod)
{
	struct efs_etcd_lease_opts lo = {
		.id = s->pending_lease,
		.ttl_s = s->pending_ttl_s,
		.granted_ns = s->pending_sent_ns,
		.at_risk_ms = s->suspend_ms,
	};
	uint64_t now = efs_clock_mono_ns();
	int r;

	if ((uint64_t)lo.ttl_s * 1000 / 4 > s->suspend_ms)
		lo.failover_ms = s->suspend_ms / 2;
	r = efs_etcd_lease_new(&s->lease, s->ka, &lo, lease_event, s);
	if (r < 0) {
		reg_fail(s, r, r == -ENOMEM ? false : true);
		return;
	}
	s->registering = false;
	s->lease_id = s->pending_lease;
	s->lease_ttl_s = s->pending_ttl_s;
	s->pending_lease = 0;
	s->generation = generation;
	s->gen_mod_rev = gen_mod;
	s->last_ack_seen_ns = s->pending_sent_ns;
	s->stats.registrations++;
	efs_log_debug("session %s: registered, lease %" PRId64 ", generation %" PRIu64, s->node,
		      s->lease_id, s->generation);
	if (!s->reregister) {
		struct sref *ref = ref_get(s->ref);
		unsigned a = efs_session_fsm_registered(&s->fsm, now, s->pending_sent_ns);

		s->state = EFS_SESSION_ACTIVE;
		start_finish(s, 0);
		if (ref_put(ref))
			act(s, a);
		return;
	}
	act(s, efs_session_fsm_registered(&s->fsm, now, s->pending_sent_ns));
}

static void reg_txn_done(struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct efs_session *s = scall_end(arg);

	if (!s || reg_cancelled(s))
		return;
	if (res->err < 0) {
		/* An unknown outcome is settled by the next read: n/<node> on
		 * our pending lease means it was applied. */
		efs_log_debug("session %s: register txn: %s", s->node, res->message);
		reg_fail(s, res->err, is_retryable(res->err) || res->outcome_unknown);
		return;
	}
	if (!resp->succeeded) {
		/* Someone registered the node id, or bumped g/<node>, since we
		 * read: read again (and refuse there if it is in use). */
		reg_fail(s, -EBUSY, true);
		return;
	}
	if (!resp->header) {
		reg_fail(s, -EBADMSG, false);
		return;
	}
	reg_complete(s, s->read_gen + 1, resp->header->revision);
}

static int reg_put(struct efs_session *s)
{
	Etcfs__NodeInfo ni = ETCFS__NODE_INFO__INIT;
	Etcfs__Generation g = ETCFS__GENERATION__INIT;
	ProtobufCBinaryData nb = {0}, gb = {0};
	struct efs_meta_key nk, gk;
	struct efs_etcd_txn *t = NULL;
	struct scall *sc = NULL;
	int r;

	r = build_keys(s, &nk, &gk);
	if (r < 0)
		return r;
	ni.machine_id = s->machine_id;
	ni.boot_id = s->boot_id;
	ni.pid_start = s->pid_start;
	ni.pid_ns = s->pid_ns;
	ni.hostname = s->hostname;
	ni.pid = s->pid;
	ni.version = (char *)ETCFS_VERSION;
	ni.wall_clock_ns = (int64_t)efs_clock_real_ns();
	ni.metrics_addr = s->metrics_addr;
	ni.cow = s->cow;
	ni.session_generation = s->read_gen + 1;
	ni.lease_id = s->pending_lease;
	ni.started_ns = (int64_t)s->started_ns;
	g.generation = s->read_gen + 1;
	r = efs_meta_pack(&ni.base, &nb);
	if (r < 0)
		goto out;
	r = efs_meta_pack(&g.base, &gb);
	if (r < 0)
		goto out;
	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		goto out;
	r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, nk.buf, nk.len, 0);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, gk.buf, gk.len,
					 s->read_gen_mod);
	if (r == 0)
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, nk.buf, nk.len, nb.data, nb.len,
				     s->pending_lease);
	if (r == 0)
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, gk.buf, gk.len, gb.data, gb.len, 0);
	if (r < 0)
		goto out;
	r = -ENOMEM;
	sc = scall_new(s, s->pending_lease);
	if (!sc)
		goto out;
	r = efs_etcd_txn(s->c, efs_etcd_txn_request(t), NULL, reg_txn_done, sc);
	if (r < 0)
		scall_end(sc);
out:
	efs_etcd_txn_free(t);
	efs_mem_free(nb.data);
	efs_mem_free(gb.data);
	return r;
}

static void grant_done(int status, const struct efs_etcd_lease_grant_info *info, void *arg)
{
	struct efs_session *s = scall_end(arg);
	int r;

	if (s && s->state == EFS_SESSION_CLOSED && status == 0)
		revoke_quietly(s, info->id);
	if (!s || reg_cancelled(s))
		return;
	if (status < 0) {
		reg_fail(s, status, is_retryable(status));
		return;
	}
	s->pending_lease = info->id;
	s->pending_ttl_s = info->ttl_s;
	s->pending_sent_ns = info->sent_ns;
	r = reg_put(s);
	if (r < 0)
		reg_fail(s, r, false);
}

static int reg_grant_or_put(struct efs_session *s)
{
	struct scall *sc;
	int r;

	/* A lease granted by an earlier attempt is reused while it lives:
	 * its grant's send time bounds its deadline. */
	if (s->pending_lease &&
	    efs_clock_mono_ns() < s->pending_sent_ns + (uint64_t)s->pending_ttl_s *
								   EFS_NSEC_PER_SEC / 2)
		return reg_put(s);
	if (s->pending_lease) {
		revoke_quietly(s, s->pending_lease);
		s->pending_lease = 0;
	}
	sc = scall_new(s, 0);
	if (!sc)
		return -ENOMEM;
	r = efs_etcd_lease_grant(s->c, s->ttl_s, 0, grant_done, sc);
	if (r < 0)
		scall_end(sc);
	return r;
}

static void old_revoked(int status, void *arg)
{
	struct efs_session *s = scall_end(arg);

	if (!s || reg_cancelled(s))
		return;
	if (status < 0 && status != -ENOENT) {
		reg_fail(s, status, is_retryable(status));
		return;
	}
	/* Read again: the old n/<node> is gone with its lease. */
	s->registering = false;
	reg_begin(s);
}

/* Revokes |held| (the lease of the record |ni| that is taken over);
 * old_revoked reads n/<node> again. Consumes |ni|. */
static void reg_take_over(struct efs_session *s, Etcfs__NodeInfo *ni, int64_t held)
{
	struct scall *sc = scall_new(s, held);
	int r = sc ? efs_etcd_lease_revoke(s->c, held, old_revoked, sc) : -ENOMEM;

	efs_meta_record_free(ni);
	if (r < 0) {
		if (sc)
			scall_end(sc);
		reg_fail(s, r, false);
	}
}

/*
 * Takes over n/<node>, record |ni| on lease |held|, when its owner is
 * gone (|running_start|: the start time of the process that now runs
 * under its pid, 0 when none or not read), else refuses the node id.
 * Consumes |ni|.
 */
static void reg_decide(struct efs_session *s, Etcfs__NodeInfo *ni, int64_t held,
		       uint64_t running_start)
{
	struct efs_session_owner old = {
		.machine_id = ni->machine_id,
		.boot_id = ni->boot_id,
		.pid_ns = ni->pid_ns,
		.pid = ni->pid,
		.pid_start = ni->pid_start,
	};
	struct efs_session_owner me = {
		.machine_id = s->machine_id,
		.boot_id = s->boot_id,
		.pid_ns = s->pid_ns,
	};

	if (ni->lease_id == 0 ||
	    !efs_session_may_take_over(&old, &me, pid_is_alive(ni->pid), running_start)) {
		efs_log_err("session %s: node id in use by host %s (machine %s, boot %s) pid %d",
			    s->node, ni->hostname, ni->machine_id,
			    ni->boot_id[0] ? ni->boot_id : "unknown", (int)ni->pid);
		efs_meta_record_free(ni);
		reg_fail(s, -EBUSY, false);
		return;
	}
	/* A previous daemon of this machine died (kill -9): take over. */
	efs_log_info("session %s: taking over from dead pid %d (lease %" PRId64 ")", s->node,
		     (int)ni->pid, ni->lease_id);
	reg_take_over(s, ni, held);
}

/* A start-time read on the thread pool. */
struct start_read {
	uv_work_t work;
	struct scall *sc;
	Etcfs__NodeInfo *ni;
	int64_t held;
	uint64_t start; /* result, 0 when unknown */
};

static void start_read_work(uv_work_t *w)
{
	struct start_read *sr = (struct start_read *)w;

	sr->start = pid_start_time(sr->ni->pid);
}

static void start_read_done(uv_work_t *w, int status)
{
	struct start_read *sr = (struct start_read *)w;
	struct efs_session *s = scall_end(sr->sc);
	Etcfs__NodeInfo *ni = sr->ni;
	int64_t held = sr->held;
	uint64_t start = status == 0 ? sr->start : 0;

	efs_mem_free(sr);
	if (!s || reg_cancelled(s)) {
		efs_meta_record_free(ni);
		return;
	}
	reg_decide(s, ni, held, start);
}

/* Reads the start time of |ni|'s pid off the loop, then decides. Takes
 * |ni| on success. */
static int reg_read_start_time(struct efs_session *s, Etcfs__NodeInfo *ni, int64_t held)
{
	struct start_read *sr = efs_mem_calloc(1, sizeof(*sr));
	int r;

	if (!sr)
		return -ENOMEM;
	sr->sc = scall_new(s, held);
	if (!sr->sc) {
		efs_mem_free(sr);
		return -ENOMEM;
	}
	sr->ni = ni;
	sr->held = held;
	r = uv_queue_work(s->loop, &sr->work, start_read_work, start_read_done);
	if (r < 0) {
		scall_end(sr->sc);
		efs_mem_free(sr);
	}
	return r;
}

static void reg_read_done(struct efs_etcd_result *res, Etcdserverpb__TxnResponse *resp,
			  void *arg)
{
	struct efs_session *s = scall_end(arg);
	Etcdserverpb__RangeResponse *nr, *gr;
	Etcfs__NodeInfo *ni = NULL;
	Etcfs__Generation *g = NULL;
	const char *why = NULL;
	int64_t held;
	int r;

	if (!s || reg_cancelled(s))
		return;
	if (res->err < 0) {
		reg_fail(s, res->err, is_retryable(res->err));
		return;
	}
	r = efs_etcd_txn_resp_range(resp, 0, &nr);
	if (r == 0)
		r = efs_etcd_txn_resp_range(resp, 1, &gr);
	if (r < 0) {
		reg_fail(s, r, false);
		return;
	}
	s->read_gen = 0;
	s->read_gen_mod = 0;
	if (gr->n_kvs > 0) {
		r = efs_meta_generation_decode(gr->kvs[0]->value.data, gr->kvs[0]->value.len, &g,
					       &why);
		if (r < 0) {
			efs_log_err("session %s: g/%s is not a Generation record (%s)", s->node,
				    s->node, why ? why : strerror(-r));
			reg_fail(s, r, false);
			return;
		}
		s->read_gen = g->generation;
		s->read_gen_mod = gr->kvs[0]->mod_revision;
		efs_meta_record_free(g);
	}
	if (nr->n_kvs == 0) {
		r = reg_grant_or_put(s);
		if (r < 0)
			reg_fail(s, r, false);
		return;
	}
	r = efs_meta_nodeinfo_decode(nr->kvs[0]->value.data, nr->kvs[0]->value.len, &ni, &why);
	if (r < 0) {
		efs_log_err("session %s: n/%s is not a NodeInfo record (%s): node id in use?",
			    s->node, s->node, why ? why : strerror(-r));
		reg_fail(s, -EBUSY, false);
		return;
	}
	if (s->pending_lease && ni->lease_id == s->pending_lease) {
		/* Our own registration, applied although its answer was lost. */
		efs_meta_record_free(ni);
		reg_complete(s, s->read_gen, s->read_gen_mod);
		return;
	}
	/* The lease the key is on is what to revoke; the record names the
	 * same one unless someone rewrote the key. */
	held = nr->kvs[0]->lease ? nr->kvs[0]->lease : ni->lease_id;
	if (held != 0 && record_is_ours(s, ni, held)) {
		efs_log_info("session %s: n/%s is this session's own earlier record (lease %" PRIx64
			     "): revoking that lease", s->node, s->node, (uint64_t)held);
		reg_take_over(s, ni, held);
		return;
	}
	/* /proc/<pid>/stat is read only when the start time decides: the
	 * record is of this machine, boot and pid namespace, its pid runs and
	 * the record knows the start time it had. It is read on a worker
	 * thread, never on the loop. */
	if (pid_is_alive(ni->pid) && ni->pid_start != 0 && str_eq(ni->machine_id, s->machine_id) &&
	    str_eq(ni->boot_id, s->boot_id) && ni->pid_ns == s->pid_ns) {
		r = reg_read_start_time(s, ni, held);
		if (r < 0) {
			efs_meta_record_free(ni);
			reg_fail(s, r, r == -ENOMEM ? false : true);
		}
		return;
	}
	reg_decide(s, ni, held, 0);
}

/* Reads n/<node> and g/<node> and goes on from what it finds. */
static void reg_begin(struct efs_session *s)
{
	struct efs_meta_key nk, gk;
	struct efs_etcd_txn *t = NULL;
	struct scall *sc = NULL;
	int r;

	s->registering = true;
	r = build_keys(s, &nk, &gk);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, nk.buf, nk.len, NULL, 0);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, gk.buf, gk.len, NULL, 0);
	if (r == 0) {
		sc = scall_new(s, 0);
		r = sc ? efs_etcd_txn(s->c, efs_etcd_txn_request(t), NULL, reg_read_done, sc)
		       : -ENOMEM;
		if (r < 0 && sc)
			scall_end(sc);
	}
	efs_etcd_txn_free(t);
	if (r < 0)
		reg_fail(s, r, is_retryable(r));
}

/* ---- Public ---- */

static char *read_id_file(const char *path)
{
	char buf[128];
	FILE *f = fopen(path, "re");
	size_t n;

	if (!f)
		return NULL;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n \t")] = '\0';
	return buf[0] ? efs_mem_strdup(buf) : NULL;
}

int efs_session_start(struct efs_session **ret, uv_loop_t *loop, struct efs_etcd *c,
		      const struct efs_session_opts *o, efs_session_state_cb state_cb,
		      efs_session_done_cb done, void *arg)
{
	struct efs_session *s;
	char host[256];
	uint64_t ttl_ns;
	int r;

	if (!ret || !loop || !c || !o || !o->ns || !o->node || !efs_meta_node_is_valid(o->node) ||
	    o->ttl_s < 0 || !done)
		return -EINVAL;
	s = efs_mem_calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->loop = loop;
	s->c = c;
	s->ns = *o->ns;
	snprintf(s->node, sizeof(s->node), "%s", o->node);
	s->ttl_s = o->ttl_s ? o->ttl_s : 2;
	ttl_ns = (uint64_t)s->ttl_s * EFS_NSEC_PER_SEC;
	s->suspend_ms = o->suspend_ms ? o->suspend_ms : (uint32_t)(s->ttl_s * 1000 / 2);
	if ((uint64_t)s->suspend_ms * EFS_NSEC_PER_MSEC >= ttl_ns) {
		efs_mem_free(s);
		return -EINVAL;
	}
	s->quorum_loss_ms = o->quorum_loss_ms ? o->quorum_loss_ms : 30000;
	s->state_cb = state_cb;
	s->done = done;
	s->arg = arg;
	s->started_ns = efs_clock_real_ns();
	efs_list_init(&s->waiters);
	efs_list_init(&s->failed);
	efs_session_fsm_init(&s->fsm, ttl_ns, (uint64_t)s->suspend_ms * EFS_NSEC_PER_MSEC,
			     (uint64_t)s->quorum_loss_ms * EFS_NSEC_PER_MSEC);
	r = -ENOMEM;
	s->ref = efs_mem_calloc(1, sizeof(*s->ref));
	if (!s->ref)
		goto fail;
	s->ref->s = s;
	s->ref->refs = 1;
	if (o->hostname) {
		s->hostname = efs_mem_strdup(o->hostname);
	} else {
		if (gethostname(host, sizeof(host)) < 0)
			snprintf(host, sizeof(host), "unknown");
		host[sizeof(host) - 1] = '\0';
		s->hostname = efs_mem_strdup(host);
	}
	if (!s->hostname)
		goto fail;
	s->machine_id = o->machine_id ? efs_mem_strdup(o->machine_id)
				       : read_id_file("/etc/machine-id");
	if (!s->machine_id)
		s->machine_id = efs_mem_strdup(s->hostname);
	s->boot_id = read_id_file("/proc/sys/kernel/random/boot_id");
	if (!s->boot_id)
		s->boot_id = efs_mem_strdup("");
	if (!s->boot_id)
		goto fail;
	s->pid = (int32_t)getpid();
	s->pid_start = pid_start_time(s->pid);
	s->pid_ns = pid_namespace();
	s->metrics_addr = efs_mem_strdup(o->metrics_addr ? o->metrics_addr : "");
	s->cow = o->cow;
	if (!s->machine_id || !s->metrics_addr)
		goto fail;
	s->tick = efs_timer_new(s->loop, s);
	s->retry = efs_timer_new(s->loop, s);
	s->kick = efs_timer_new(s->loop, s);
	if (!s->tick || !s->retry || !s->kick)
		goto fail;
	r = efs_etcd_keepalive_new(&s->ka, c);
	if (r < 0)
		goto fail;
	/* Begin on the next loop iteration, so that even an immediate
	 * failure reaches |done| later, never inline. */
	s->registering = true;
	uv_timer_start(s->retry, retry_cb, 0, 0);
	*ret = s;
	return 0;
fail:
	efs_session_free(s);
	return r;
}

static void leave_done_cb(int status, void *arg)
{
	struct efs_session *s = scall_end(arg);
	efs_session_done_cb done;

	if (!s)
		return;
	if (status == -ENOENT)
		status = 0; /* already gone: nothing of ours is left */
	done = s->leave_done;
	s->leave_done = NULL;
	s->lease_id = 0;
	if (done)
		done(s, status, s->leave_arg);
}

int efs_session_leave(struct efs_session *s, efs_session_done_cb done, void *arg)
{
	struct scall *sc;
	int64_t lease;
	int r;

	if (!s || !done)
		return -EINVAL;
	if (s->state == EFS_SESSION_CLOSED || s->state == EFS_SESSION_STARTING)
		return -EALREADY;
	if (s->leave_done)
		return -EALREADY;
	lease = s->lease_id;
	sc = scall_new(s, lease);
	if (!sc)
		return -ENOMEM;
	r = efs_etcd_lease_revoke(s->c, lease, leave_done_cb, sc);
	if (r < 0) {
		scall_end(sc);
		return r;
	}
	s->leave_done = done;
	s->leave_arg = arg;
	drop_lease(s);
	uv_timer_stop(s->tick);
	uv_timer_stop(s->retry);
	if (s->registering) {
		s->registering = false;
		revoke_quietly(s, s->pending_lease);
		s->pending_lease = 0;
	}
	efs_session_fsm_close(&s->fsm);
	/* Waiters learn it on the next iteration (-ESHUTDOWN), never inline. */
	efs_list_splice_tail(&s->failed, &s->waiters);
	uv_timer_start(s->kick, kick_cb, 0, 0);
	set_state(s, EFS_SESSION_CLOSED);
	return 0;
}

struct efs_session *efs_session_free(struct efs_session *s)
{
	if (!s)
		return NULL;
	drop_lease(s);
	s->ka = efs_etcd_keepalive_free(s->ka);
	s->tick = efs_timer_free(s->tick);
	s->retry = efs_timer_free(s->retry);
	s->kick = efs_timer_free(s->kick);
	if (s->ref) {
		s->ref->s = NULL;
		ref_put(s->ref);
	}
	efs_mem_free(s->machine_id);
	efs_mem_free(s->boot_id);
	efs_mem_free(s->hostname);
	efs_mem_free(s->metrics_addr);
	efs_mem_free(s);
	return NULL;
}

enum efs_session_state efs_session_state(const struct efs_session *s)
{
	return s->state;
}

const char *efs_session_state_name(enum efs_session_state st)
{
	switch (st) {
	case EFS_SESSION_STARTING:
		return "starting";
	case EFS_SESSION_ACTIVE:
		return "active";
	case EFS_SESSION_SUSPENDED:
		return "suspended";
	case EFS_SESSION_EXPIRED:
		return "expired";
	case EFS_SESSION_GONE:
		return "gone";
	case EFS_SESSION_CLOSED:
		return "closed";
	}
	return "unknown";
}

int64_t efs_session_lease_id(const struct efs_session *s)
{
	return s->lease_id;
}

int64_t efs_session_ttl_s(const struct efs_session *s)
{
	return s->lease_ttl_s;
}

uint64_t efs_session_generation(const struct efs_session *s)
{
	return s->generation;
}

int64_t efs_session_gen_mod_revision(const struct efs_session *s)
{
	return s->gen_mod_rev;
}

const char *efs_session_node(const struct efs_session *s)
{
	return s->node;
}

uint64_t efs_session_deadline_ns(const struct efs_session *s)
{
	if (s->lease)
		return efs_etcd_lease_deadline_ns(s->lease);
	return efs_session_fsm_deadline_ns(&s->fsm);
}

uint32_t efs_session_quorum_loss_ms(const struct efs_session *s)
{
	return s->quorum_loss_ms;
}

bool efs_session_is_active(const struct efs_session *s)
{
	return s && s->state == EFS_SESSION_ACTIVE;
}

const struct efs_meta_ns *efs_session_ns(const struct efs_session *s)
{
	return &s->ns;
}

int efs_session_guard(const struct efs_session *s, struct efs_etcd_txn *t)
{
	struct efs_meta_key nk, gk;
	int r;

	if (!efs_session_is_active(s))
		return -EIO;
	r = efs_meta_key_node(&s->ns, s->node, &nk);
	if (r == 0)
		r = efs_meta_key_gen(&s->ns, s->node, &gk);
	if (r < 0)
		return r;
	r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, nk.buf, nk.len,
				 s->lease_id);
	if (r < 0)
		return r;
	r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, gk.buf, gk.len,
				 s->gen_mod_rev);
	if (r < 0) {
		/* The builder keeps what was added: a half guard must never go
		 * out, so the caller is told to throw the builder away. */
		return r;
	}
	return 0;
}

int efs_session_wait(struct efs_session *s, struct efs_session_waiter *w, efs_session_wait_cb cb,
		     void *arg)
{
	if (!s || !w || !cb)
		return -EINVAL;
	w->cb = cb;
	w->arg = arg;
	w->generation = s->generation;
	w->link.next = w->link.prev = NULL;
	if (s->state == EFS_SESSION_ACTIVE)
		return 1;
	if (s->state == EFS_SESSION_CLOSED || efs_session_fsm_fail_fast(&s->fsm)) {
		efs_list_add_tail(&s->failed, &w->link);
		uv_timer_start(s->kick, kick_cb, 0, 0);
		return 0;
	}
	efs_list_add_tail(&s->waiters, &w->link);
	return 0;
}

void efs_session_wait_cancel(struct efs_session *s, struct efs_session_waiter *w)
{
	(void)s;
	if (w)
		efs_list_del(&w->link);
}

void efs_session_get_stats(const struct efs_session *s, struct efs_session_stats *ret)
{
	*ret = s->stats;
	if (s->lease) {
		struct efs_etcd_lease_stats ls;

		efs_etcd_lease_get_stats(s->lease, &ls);
		if (ls.max_queue_gap_ns > ret->renew_max_gap_ns)
			ret->renew_max_gap_ns = ls.max_queue_gap_ns;
		if (ls.max_wire_gap_ns > ret->renew_max_gap_ns)
			ret->renew_max_gap_ns = ls.max_wire_gap_ns;
	}
}

void efs_session_fault_pause(struct efs_session *s, bool paused)
{
	if (s->lease)
		efs_etcd_lease_fault_pause(s->lease, paused);
}
