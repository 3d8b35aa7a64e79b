/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The node's block allocator (fs/alloc.h). Decisions beyond the header:
 *
 *  - Group discovery reads the whole ag/ family once per claim round (owner
 *    keys, maps and free counts of every group): one round trip, then one
 *    claim transaction per group taken. A round that finds no group to take
 *    is remembered for a second (allocations answer ENOSPC meanwhile
 *    without asking etcd again).
 *  - Per owned group the available set is recomputed as committed free
 *    minus pending (allocated, unpublished) minus quarantined runs whenever
 *    one of those changes outside allocation itself.
 *  - efs_alloc_unuse goes through quarantine: a local read may have looked
 *    the unpublished extent up (the file's merged extent map, lib/fs/file/)
 *    and still be reading.
 *  - A use whose blocks the committed map already shows as used (the map
 *    was re-read after an unknown outcome that did apply) is taken as
 *    already applied; a free of blocks already free in an owned group is a
 *    double free: -EUCLEAN from the build, logged with the inode and run.
 *  - This node's own free intents wait in the same quarantine under a
 *    sentinel group (INTENT_GROUP, start = intent id): their release means
 *    every read begun before the free has ended, and the intent is then
 *    marked drained by the periodic sweep.
 *  - A COMMITTED after an UNKNOWN re-reads the touched maps (the revision
 *    handed over may not be the map keys' mod_revision).
 *  - Orphan groups: free intents in a group that no node owns (its owner
 *    left, or was killed and its lease revoked by the restart's takeover)
 *    would wait for the next claim of that group. Every sweep tick, and
 *    right after a commit that made an intent in a group not seen owned by
 *    another node, a keys-only probe of the ag/ family looks for groups
 *    with intents and no owner key; an orphan round then claims them all
 *    (any node may) and folds their intents at once. Intents of groups
 *    owned by other nodes are left to those owners. The start's claim
 *    prefers this node's previous-session groups, then groups with intents.
 *    Claiming before building (so that no intent is made) is not done: the
 *    frees of a contribution are known only between efs_alloc_txn_free and
 *    the synchronous efs_alloc_txn_build, where no round trip fits.
 *  - This node's own intents of the current session are folded, once the
 *    group is ours, as soon as their quarantine released them (no drained
 *    mark needed first); the fold then forgets them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <linux/fs.h>

#include "config.h"
#include "etcd/kv.h"
#include "etcd/watch.h"
#include "alloc/alloc.h"
#include "meta/records.h"
#include "space/freemap.h"
#include "space/quarantine.h"
#include "lock/session-fsm.h"
#include "util/clock.h"
#include "util/list.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/timer.h"

#define INTENT_GROUP	 UINT32_MAX
#define RESCAN_NS	 (1000ull * 1000 * 1000)
#define BATCH_MAX	 60 /* keys compared/changed per internal transaction */
#define TOKEN_INTERNAL	 ((struct efs_alloc_txn *)1)
#define HO_POLL_MS	 250u /* claim rounds while a hand-over request is out */
#define HO_QUEUE	 8    /* requests of other nodes waiting for an answer */

struct grp {
	uint32_t g;
	bool owned;
	bool stale; /* committed map and owner to re-read before the next grant */
	bool dirty; /* avail to recompute */
	uint64_t start, blocks;
	struct efs_freemap committed, avail;
	struct efs_runs pending, quar; /* group-relative, normalized */
	/* Blocks freed by a map transaction that saw a backup pin: not
	 * allocated until one sees none (group-relative, normalized). */
	struct efs_runs held;
	int64_t map_rev, owner_rev;
	bool has_intents; /* the last read saw free intents: fold soon */
	bool other_owner; /* the last scan saw an owner key not ours */
	/* Dead-node grace (not owned groups): when this node first saw the
	 * group without an owner key (0: it has one, or not seen yet), what
	 * the last scan made of its last owner, and its free count then. */
	uint64_t ownerless_ns;
	uint8_t verdict; /* V_* */
	uint64_t seen_free;
	int64_t free_rev; /* mod revision of ag/<g>/free as last read (0: not read) */
	bool unsure; /* at leave: the committed map may be behind etcd's */
	bool giving; /* owned, in a hand-over transaction: not allocated from */
};

/* A hand-over request of another node, waiting for an answer. */
struct horeq {
	char node[EFS_META_NODE_MAX + 1];
	uint64_t want;
	int64_t mod_rev; /* of its ho/<node> key: the answer compares it */
};

/* What the last scan made of a group's last owner (AgFree.last). */
enum {
	V_UNKNOWN = 0, /* not scanned since it last had an owner key */
	V_NOW,	       /* none recorded, released, or our own gone process: claimable */
	V_GRACE,       /* a process that may still write: claimable after the grace */
};

/* Blocks a committed transaction freed, waiting for the death hold:
 * [start, start + len) of |group|, or the free intent |start| when
 * |group| is INTENT_GROUP. */
struct dheld {
	uint32_t group;
	uint64_t start, len;
	uint64_t blocks;	 /* held: |len|, or the intent's blocks */
	int64_t rev;	 /* the commit revision (0: not known) */
	uint64_t ask_ns; /* when to ask the hold again (0: at once) */
};

/* A session of another node (or an earlier one of ours) seen ended, for
 * the grace of its undrained free intents. */
struct deadsess {
	struct deadsess *next;
	char node[EFS_META_NODE_MAX + 1];
	uint64_t session;
	uint64_t since_ns; /* first seen ended, by this node's clock */
};

struct intent {
	struct intent *next;
	uint64_t id;
	uint32_t group;
	uint64_t ino;
	struct efs_meta_key key;
	int64_t mod_rev; /* 0: unknown (compare existence instead) */
	struct efs_runs runs;
	bool ready;
};

struct tokw {
	struct efs_list link; /* a->tokw */
	void (*fn)(struct efs_alloc *a, void *arg);
	void *arg;
};

struct getw {
	struct efs_list link; /* a->getw */
	uint64_t want, goal;
	unsigned flags;
	struct efs_runs *out;
	void (*cb)(int status, void *arg);
	void *arg;
};

struct tgrp {
	uint32_t g;
	bool as_owner; /* built as the owner (map put), else as a free intent */
	uint64_t seq;  /* intent sequence (0: none yet) */
	struct efs_runs use, fre;
	struct efs_freemap built;
	bool has_built;
};

struct efs_alloc_txn {
	struct efs_alloc *a;
	uint64_t epoch;
	uint64_t ino; /* last ino seen by txn_free (intents) */
	struct tgrp *v;
	size_t n, cap;
	bool unknown;
	/* The backup hold: whether the built request reads pin/backup. (at
	 * |hold_idx| of its success branch), a->held_gen then, and what the
	 * response said (hold_in: 0 no pin, else a pin; -1 until told). */
	bool hold_asked;
	size_t hold_idx;
	uint64_t hold_gen;
	int64_t hold;
	/* The death hold: whether the built request reads n/ and g/ (at
	 * |dh_idx| and the next), and what the hold said of its response
	 * (dh_known; 0: its frees go to the quarantine at once). */
	bool dh_asked, dh_known;
	size_t dh_idx;
	uint64_t dh_until;
	void (*cb)(int status, void *arg);
	void *arg;
};

struct acall;
typedef void (*acall_fn)(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
			 Etcdserverpb__TxnResponse *resp);

struct acall {
	struct efs_list link; /* on a->calls until it completes */
	struct efs_alloc *a;
	uint64_t epoch;
	acall_fn fn;
	uint64_t u; /* per call */
	void *p;
};

struct efs_alloc {
	uv_loop_t *loop;
	struct efs_etcd *c;
	struct efs_session *s;
	struct efs_meta_ns ns;
	const Etcfs__FsInfo *fi;
	char node[EFS_META_NODE_MAX + 1];
	uint32_t ngroups;
	uint64_t data_start, ag_blocks, total_blocks;
	uint32_t groups_initial;
	uint64_t reserve;
	uint32_t fold_ms;
	uint64_t grace_ns;		/* dead-node grace */
	uint32_t block_size;
	struct efs_session_owner self; /* what AgFree.last names while we own a group */
	bool prev_gone; /* a previous process of this node was found gone */
	struct deadsess *dead;
	uint64_t grace_blocks; /* free blocks of groups waiting out a grace */
	struct grp *groups;
	uint64_t epoch;
	struct efs_quarantine *q;
	struct efs_list calls; /* of acall, in flight */
	uv_timer_t *kick, *tick;
	struct efs_session_waiter sw;
	bool sw_queued;

	/* Token. */
	struct efs_alloc_txn *token; /* NULL: free; TOKEN_INTERNAL: an internal task */
	struct efs_list tokw; /* token waiters, FIFO */
	bool rereading;

	/* Start and claims. */
	bool started, starting, left;
	void (*start_cb)(int status, void *arg);
	void *start_arg;
	bool claim_busy;
	bool claim_has_token; /* the round runs for the start, under the token */
	bool orphan_round;    /* the round claims groups with intents and no owner */
	bool probe_busy, probe_want;
	uint32_t claim_need;
	uint64_t nofree_until;
	uint64_t others_free; /* free blocks of groups not ours, at the last scan */
	struct efs_list getw; /* allocation waiters, FIFO */
	Etcdserverpb__TxnResponse *scan_resp; /* owned during a claim round */
	Etcdserverpb__RangeResponse *scan;    /* its range (borrowed) */
	int32_t *scan_owner, *scan_map;	   /* kv index per group (-1: none) */
	uint32_t *cand;
	size_t ncand, icand;

	/* Intents, folds. */
	struct intent *intents;
	uint64_t intent_id, intent_seq;
	bool fold_busy, drain_busy;
	bool fold_again; /* asked for while a fold ran */
	struct fold *fold; /* in flight */

	/* Hand-over (docs/DESIGN.md, issue 12). */
	uint64_t ho_wait_ns; /* how long a request waits for an answer */
	struct efs_etcd_watch_stream *ho_ws;
	struct efs_etcd_watcher *ho_w; /* on ho/ */
	uv_timer_t *ho_timer;	       /* while asking: a claim round every HO_POLL_MS */
	bool ho_asking;		       /* our ho/<node> request is out */
	uint64_t ho_deadline;	       /* asking: ENOSPC from then on */
	uint64_t ho_start_ns;	       /* when the request went out (0: none to time) */
	struct efs_histogram *h_ho_wait;
	uint64_t ho_quiet_until;       /* a request went unanswered: do not ask until then */
	struct horeq ho_q[HO_QUEUE];   /* other nodes' requests, FIFO */
	size_t ho_nq;
	bool give_busy;	   /* an answer waits for the token or is in flight */
	uint32_t *give_sel; /* the groups of the answer in flight */

	/* Growth (docs/DESIGN.md, "Online growth"). */
	const int *dev_fd;
	void (*grown)(void *arg, uint64_t device_size, uint32_t ag_count);
	void *grown_arg;
	void (*inode_limit)(void *arg, uint64_t inode_limit);
	bool reserve_default; /* the reserve follows the data area's size */
	uint64_t device_size; /* bytes the geometry spans now */
	struct efs_etcd_watcher *sb_w; /* on "sb", on ho_ws */
	bool sb_reading;	       /* a catch-up read of "sb" is in flight */
	uint64_t grow_size;	       /* "sb" says this many bytes (0: no growth seen) */
	uint32_t grow_count;	       /* ... in this many groups */
	uint64_t grow_warned;	       /* grow_size last logged as not visible yet */

	/* The backup hold (docs/DESIGN.md, "Backup and restore"). */
	uint64_t held_gen;    /* bumped whenever blocks join a group's held list */
	bool hold_probe_busy; /* the sweep's read of pin/backup. is in flight */
	bool hold_off;	      /* fault hook: nothing is held */

	/* The death hold (efs_alloc_set_death_hold). */
	efs_alloc_hold_fn dh_fn;
	void *dh_arg;
	struct dheld *dh;
	size_t ndh, capdh;
	uint64_t dh_blocks; /* the sum of their |blocks| */
	uv_timer_t *dh_timer;

	/* Leave. */
	void (*leave_cb)(int status, void *arg);
	void *leave_arg;

	/* Figures. */
	uint64_t double_frees, claims, given;
	struct efs_gauge *g_owned, *g_avail, *g_pending, *g_quar, *g_grace, *g_held, *g_dheld;
	struct efs_counter *c_double, *c_claims, *c_given, *c_dh_waits;
	struct efs_counter *c_txn[4]; /* etcfs_etcd_txns_total{origin="space"}: ok, conflict,
				       * error, unknown (fs.c's outcome names) */
};

static void grant_next(struct efs_alloc *a);
static void serve_getters(struct efs_alloc *a);
static void claim_round(struct efs_alloc *a);
struct fold;
static void fold_all(struct efs_alloc *a, bool from_start);
static void fold_free(struct fold *f);
static void tick_cb(uv_timer_t *t);
static void orphan_probe(struct efs_alloc *a);
static void fold_soon(struct efs_alloc *a);
static void ho_watch_start(struct efs_alloc *a);
static void ho_stop(struct efs_alloc *a);
static void give_soon(struct efs_alloc *a);
static void sb_watch_start(struct efs_alloc *a);
static void grow_try(struct efs_alloc *a);
static void kick(struct efs_alloc *a);

/* ---- Small helpers ---- */

static uint64_t grp_start(const struct efs_alloc *a, uint32_t g)
{
	return a->data_start + (uint64_t)g * a->ag_blocks;
}

static uint64_t grp_blocks(const struct efs_alloc *a, uint32_t g)
{
	uint64_t off = (uint64_t)g * a->ag_blocks;

	if (g >= a->ngroups || off >= a->total_blocks)
		return 0;
	return a->total_blocks - off < a->ag_blocks ? a->total_blocks - off : a->ag_blocks;
}

static void update_gauges(struct efs_alloc *a)
{
	struct efs_alloc_stats st;

	efs_alloc_get_stats(a, &st);
	if (a->g_owned)
		efs_gauge_set(a->g_owned, st.groups_owned);
	if (a->g_avail)
		efs_gauge_set(a->g_avail, (double)st.avail_blocks);
	if (a->g_pending)
		efs_gauge_set(a->g_pending, (double)st.pending_blocks);
	if (a->g_quar)
		efs_gauge_set(a->g_quar, (double)st.quarantine_blocks);
	if (a->g_grace)
		efs_gauge_set(a->g_grace, (double)st.grace_blocks * a->block_size);
	if (a->g_held)
		efs_gauge_set(a->g_held, (double)st.held_blocks * a->block_size);
	if (a->g_dheld)
		efs_gauge_set(a->g_dheld, (double)st.death_held_blocks * a->block_size);
}

static void grp_forget(struct grp *g)
{
	efs_freemap_done(&g->committed);
	efs_freemap_done(&g->avail);
	efs_runs_done(&g->pending);
	efs_runs_done(&g->quar);
	efs_runs_done(&g->held);
	g->owned = false;
	g->stale = false;
	g->dirty = false;
	g->has_intents = false;
	g->unsure = false;
	g->giving = false;
	g->map_rev = g->owner_rev = 0;
}

/* avail = committed free - pending - quarantined - held. */
static int avail_recompute(struct grp *g)
{
	struct efs_freemap n;
	int r;

	r = efs_freemap_copy(&n, &g->committed);
	if (r < 0)
		return r;
	for (size_t i = 0; i < g->pending.n && r == 0; i++)
		r = efs_runs_subtract(&n.free, g->pending.v[i].start, g->pending.v[i].len, NULL);
	for (size_t i = 0; i < g->quar.n && r == 0; i++)
		r = efs_runs_subtract(&n.free, g->quar.v[i].start, g->quar.v[i].len, NULL);
	for (size_t i = 0; i < g->held.n && r == 0; i++)
		r = efs_runs_subtract(&n.free, g->held.v[i].start, g->held.v[i].len, NULL);
	/* A grown last group's map may be longer than this node's view of the
	 * device (docs/DESIGN.md, "Online growth"): its tail is not ours to
	 * hand out until this node takes the new geometry. */
	if (r == 0 && n.group_blocks > g->blocks)
		r = efs_runs_subtract(&n.free, g->blocks, n.group_blocks - g->blocks, NULL);
	if (r < 0) {
		efs_freemap_done(&n);
		return r;
	}
	n.nfree = efs_runs_total(&n.free);
	efs_freemap_done(&g->avail);
	g->avail = n;
	g->dirty = false;
	return 0;
}

static int runs_add_norm(struct efs_runs *r, uint64_t start, uint64_t len)
{
	int e = efs_runs_add(r, start, len);

	if (e == 0)
		e = efs_runs_normalize(r);
	return e;
}

/* Splits absolute run [start, start + len) by group and calls |fn| for each
 * piece with group-relative coordinates. -EINVAL outside the data area. */
static int split_runs(const struct efs_alloc *a, uint64_t start, uint64_t len,
		      int (*fn)(void *arg, uint32_t g, uint64_t rs, uint64_t rl), void *arg)
{
	while (len) {
		uint64_t off, g, rs, rl;
		int r;

		if (start < a->data_start || start - a->data_start >= a->total_blocks)
			return -EINVAL;
		off = start - a->data_start;
		g = off / a->ag_blocks;
		rs = off % a->ag_blocks;
		rl = grp_blocks(a, (uint32_t)g) - rs;
		if (rl > len)
			rl = len;
		r = fn(arg, (uint32_t)g, rs, rl);
		if (r < 0)
			return r;
		start += rl;
		len -= rl;
	}
	return 0;
}

static bool session_ok(const struct efs_alloc *a)
{
	return efs_session_is_active(a->s);
}

/* ---- etcd calls ---- */

static void acall_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct acall *c = arg;
	struct efs_alloc *a = c->a;

	if (a) {
		efs_list_del(&c->link);
		c->fn(a, c, r, resp);
	}
	efs_mem_free(c);
}

/* Sends |t| (freed here); |fn| runs unless the allocator is freed first. */
static int send_txn(struct efs_alloc *a, struct efs_etcd_txn *t, acall_fn fn, uint64_t u,
		    void *p)
{
	struct acall *c = efs_mem_calloc(1, sizeof(*c));
	int r;

	if (!c) {
		efs_etcd_txn_free(t);
		return -ENOMEM;
	}
	c->a = a;
	c->epoch = a->epoch;
	c->fn = fn;
	c->u = u;
	c->p = p;
	r = efs_etcd_txn(a->c, efs_etcd_txn_request(t), NULL, acall_cb, c);
	efs_etcd_txn_free(t);
	if (r < 0) {
		efs_mem_free(c);
		return r;
	}
	efs_list_add_head(&a->calls, &c->link);
	return 0;
}


/* Counts one of this module's mutating transactions under origin "space". */
static void count_txn(struct efs_alloc *a, const struct efs_etcd_result *r,
		      const Etcdserverpb__TxnResponse *resp)
{
	int k = r->err == 0 ? (resp->succeeded ? 0 : 1)
			    : (r->outcome_unknown || r->err == -ETIMEDOUT ? 3 : 2);

	if (a->c_txn[k])
		efs_counter_inc(a->c_txn[k]);
}

/* ---- The backup hold ---- */

/*
 * A backup copies the blocks its revision R references after it took R; a
 * block freed after R must not be handed out again before the copy ends.
 * The backup's pin (pin/backup.*, put at R) is the hold: every map
 * transaction reads that prefix (keys only, one key), and etcd serialises
 * transactions, so one committed after R sees the pin in its own response.
 * Blocks a transaction frees while it sees a pin (or cannot tell) join
 * their group's held list, which allocation leaves alone. A transaction
 * that sees none releases every held block, provided none joined since it
 * was built: those were all freed by transactions committed before it, so
 * before any backup still running took its revision, and a snapshot never
 * references a block that was free at its revision.
 */

/* Adds the read of pin/backup. (the oldest pin: its create revision is
 * the revision of the longest-running backup) to the success branch of |t|
 * and sets *ret_idx to its index there. 0, -E2BIG, -ENOMEM. */
static int hold_read(struct efs_alloc *a, struct efs_etcd_txn *t, size_t *ret_idx)
{
	Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;
	size_t idx = efs_etcd_txn_request(t)->n_success;
	struct efs_meta_range rg;
	struct efs_etcd_range_opts ro = {.limit = 1, .keys_only = true};
	int r;

	r = efs_meta_range_backup_pins(&a->ns, &rg);
	if (r < 0)
		return r;
	ro.range_end = rg.end.buf;
	ro.range_end_len = rg.end.len;
	r = efs_etcd_range_fill(&rq, rg.key.buf, rg.key.len, &ro, NULL);
	if (r < 0)
		return r;
	rq.sort_order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND;
	rq.sort_target = ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE;
	r = efs_etcd_txn_range_req(t, EFS_ETCD_TXN_SUCCESS, &rq);
	if (r == 0)
		*ret_idx = idx;
	return r;
}

/* What the read at |idx| of |resp| says: 0 no backup pin; the revision
 * of the oldest one (its put); -1 no answer (no response, the other
 * branch ran), which callers take as a pin of an unknown revision. */
static int64_t hold_in(const Etcdserverpb__TxnResponse *resp, size_t idx)
{
	Etcdserverpb__RangeResponse *rr = NULL;

	if (!resp || !resp->succeeded || efs_etcd_txn_resp_range(resp, idx, &rr) < 0)
		return -1;
	if (rr->n_kvs > 0)
		return rr->kvs[0]->create_revision > 0 ? rr->kvs[0]->create_revision : -1;
	return rr->count > 0 ? -1 : 0;
}

/* Holds [s, s + l) of group |g| (it may hold part of it already). */
static void hold_add(struct efs_alloc *a, struct grp *g, uint64_t s, uint64_t l)
{
	int r;

	if (a->hold_off)
		return;
	r = efs_runs_subtract(&g->held, s, l, NULL);
	if (r == 0)
		r = efs_runs_insert(&g->held, s, l);
	if (r < 0)
		efs_log_err("alloc: out of memory holding %" PRIu64 " freed blocks of group %" PRIu32
			    " for a running backup: they may be reused before it copies them "
			    "(its check after the copy fails it if they were)",
			    l, g->g);
	a->held_gen++;
	g->dirty = true;
}

/* Holds the blocks free in |now| that were not free in |was| (a map read
 * again, or folded, while a pin was seen). */
static void hold_newly_free(struct efs_alloc *a, struct grp *g, const struct efs_runs *now,
			    const struct efs_runs *was)
{
	struct efs_runs nf = {0};
	int r = efs_runs_append(&nf, now);

	if (r == 0)
		r = efs_runs_remove_all(&nf, was, NULL);
	if (r < 0) {
		/* Cannot tell which: every free block of the group. */
		efs_runs_done(&nf);
		for (size_t i = 0; i < now->n; i++)
			hold_add(a, g, now->v[i].start, now->v[i].len);
		return;
	}
	for (size_t i = 0; i < nf.n; i++)
		hold_add(a, g, nf.v[i].start, nf.v[i].len);
	efs_runs_done(&nf);
}

static uint64_t held_blocks(const struct efs_alloc *a)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < a->ngroups; i++)
		n += efs_runs_total(&a->groups[i].held);
	return n;
}

/* A transaction built when a->held_gen was |gen| saw no backup pin:
 * releases every held block, unless some joined since. */
static void hold_release(struct efs_alloc *a, uint64_t gen)
{
	uint64_t n = 0;

	if (gen != a->held_gen)
		return;
	for (uint32_t i = 0; i < a->ngroups; i++) {
		struct grp *g = &a->groups[i];

		if (!g->held.n)
			continue;
		n += efs_runs_total(&g->held);
		efs_runs_clear(&g->held);
		if (g->owned && avail_recompute(g) < 0)
			g->dirty = true;
	}
	if (!n)
		return;
	efs_log_info("alloc: no backup pin left: %" PRIu64 " held blocks released", n);
	update_gauges(a);
	if (!efs_list_empty(&a->getw))
		kick(a);
}

static void hold_probe_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
			  Etcdserverpb__TxnResponse *resp)
{
	a->hold_probe_busy = false;
	if (c->epoch != a->epoch)
		return;
	if (r->err < 0) {
		efs_log_warn("alloc: reading backup pins failed: %s", r->message);
		return; /* the next tick reads again */
	}
	if (hold_in(resp, 0) == 0)
		hold_release(a, c->u);
}

/* The sweep's read of pin/backup. while blocks are held, so that a node
 * with no map transaction to make releases them once the backup ended. */
static void hold_probe(struct efs_alloc *a)
{
	struct efs_etcd_txn *t = NULL;
	size_t idx;
	int r;

	if (a->hold_probe_busy || !held_blocks(a))
		return;
	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = hold_read(a, t, &idx);
	if (r == 0) {
		r = send_txn(a, t, hold_probe_cb, a->held_gen, NULL);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r == 0)
		a->hold_probe_busy = true;
	else
		efs_log_warn("alloc: reading backup pins: %s", strerror(-r));
}

/* Compare "ag/<g>/owner is on our lease" and "ag/<g>/map unchanged". */
static int owner_compares(struct efs_alloc *a, struct efs_etcd_txn *t, struct grp *g)
{
	struct efs_meta_key k;
	int r;

	r = efs_meta_key_ag(&a->ns, g->g, EFS_META_K_AG_OWNER, &k);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 efs_session_lease_id(a->s));
	if (r == 0)
		r = efs_meta_key_ag(&a->ns, g->g, EFS_META_K_AG_MAP, &k);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 g->map_rev);
	return r;
}

/*
 * Puts ag/<g>/free: |nfree| and this node as the group's last owner
 * (|released| at a clean leave). Every writer of the owner's map writes
 * it, so the record always names who may still have writes in flight
 * into the group.
 */
static int put_free(struct efs_alloc *a, struct efs_etcd_txn *t, uint32_t gi, uint64_t nfree,
		    bool released)
{
	Etcfs__AgFree af = ETCFS__AG_FREE__INIT;
	Etcfs__AgLastOwner lo = ETCFS__AG_LAST_OWNER__INIT;
	struct efs_meta_key k;
	int r;

	lo.node = a->node;
	lo.session_generation = efs_session_generation(a->s);
	lo.released = released;
	lo.machine_id = (char *)(a->self.machine_id ? a->self.machine_id : "");
	lo.boot_id = (char *)(a->self.boot_id ? a->self.boot_id : "");
	lo.pid_ns = a->self.pid_ns;
	lo.pid = a->self.pid;
	lo.pid_start = a->self.pid_start;
	af.free_blocks = nfree;
	af.last = &lo;
	r = efs_meta_key_ag(&a->ns, gi, EFS_META_K_AG_FREE, &k);
	if (r == 0)
		r = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &k, &af.base, 0);
	return r;
}

/* Puts ag/<g>/map and ag/<g>/free from |fm|. */
static int put_map(struct efs_alloc *a, struct efs_etcd_txn *t, uint32_t gi,
		   const struct efs_freemap *fm)
{
	ProtobufCBinaryData b;
	struct efs_meta_key k;
	int r;

	r = efs_freemap_pack(fm, &b);
	if (r < 0)
		return r;
	r = efs_meta_key_ag(&a->ns, gi, EFS_META_K_AG_MAP, &k);
	if (r == 0)
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, b.data, b.len, 0);
	efs_mem_free(b.data);
	if (r < 0)
		return r;
	return put_free(a, t, gi, fm->nfree, false);
}

/* Loads a group's map from a kv: -EUCLEAN when it does not fit the group. */
static int load_map(struct efs_alloc *a, struct grp *g, const Mvccpb__KeyValue *kv)
{
	Etcfs__AgMap *m = NULL;
	struct efs_freemap fm;
	const char *why = NULL;
	int r;

	r = efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m, &why);
	if (r < 0) {
		efs_log_err("alloc: group %" PRIu32 ": bad map (%s)", g->g, why ? why : "?");
		return r;
	}
	/* The old last group of a growth this node has seen but not taken
	 * (its device is not as large yet): grow lengthened its map, and
	 * avail_recompute() leaves the new tail alone. */
	if (m->group_blocks > grp_blocks(a, g->g) && g->g + 1 == a->ngroups &&
	    a->grow_size > a->device_size && m->group_blocks <= a->ag_blocks) {
		efs_log_info("alloc: group %" PRIu32 " was lengthened to %" PRIu64
			     " blocks by a growth this node has not taken yet: its tail waits",
			     g->g, (uint64_t)m->group_blocks);
	} else if (m->group_blocks != grp_blocks(a, g->g)) {
		efs_log_err("alloc: group %" PRIu32 ": map of %" PRIu64
			    " blocks, expected %" PRIu64,
			    g->g, (uint64_t)m->group_blocks, grp_blocks(a, g->g));
		efs_meta_record_free(m);
		return -EUCLEAN;
	}
	r = efs_freemap_from_msg(&fm, m);
	efs_meta_record_free(m);
	if (r < 0)
		return r;
	efs_freemap_done(&g->committed);
	g->committed = fm;
	g->map_rev = kv->mod_revision;
	return avail_recompute(g);
}

/* ---- Token ---- */

static void kick_cb(uv_timer_t *t)
{
	struct efs_alloc *a = t->data;

	if (!a)
		return;
	if (a->grow_size > a->device_size)
		grow_try(a); /* before the token goes out again */
	grant_next(a);
	serve_getters(a);
}

static void kick(struct efs_alloc *a)
{
	uv_timer_start(a->kick, kick_cb, 0, 0);
}

static void token_release(struct efs_alloc *a)
{
	a->token = NULL;
	kick(a);
}

static int token_wait(struct efs_alloc *a, void (*fn)(struct efs_alloc *a, void *arg), void *arg)
{
	struct tokw *w = efs_mem_calloc(1, sizeof(*w));

	if (!w)
		return -ENOMEM;
	w->fn = fn;
	w->arg = arg;
	efs_list_add_tail(&a->tokw, &w->link);
	kick(a);
	return 0;
}

static bool any_stale(const struct efs_alloc *a)
{
	for (uint32_t i = 0; i < a->ngroups; i++)
		if (a->groups[i].owned && a->groups[i].stale)
			return true;
	return false;
}

static void reread_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		      Etcdserverpb__TxnResponse *resp)
{
	size_t k = 1; /* after the read of pin/backup. */
	int64_t hold;

	a->rereading = false;
	a->token = NULL;
	if (c->epoch != a->epoch) {
		kick(a);
		return;
	}
	if (r->err < 0) {
		efs_log_warn("alloc: re-reading maps failed: %s", r->message);
		/* Retried on the next grant (from the tick, or a waiter's kick). */
		return;
	}
	/* A map read again may show blocks freed by a transaction whose
	 * outcome was unknown, after a backup took its revision. */
	hold = hold_in(resp, 0);
	if (hold == 0)
		hold_release(a, c->u);
	for (uint32_t i = 0; i < a->ngroups; i++) {
		struct grp *g = &a->groups[i];
		Etcdserverpb__RangeResponse *ro = NULL, *rm = NULL;
		Etcfs__AgOwner *ow = NULL;
		struct efs_runs was = {0};
		bool ok = false;

		if (!g->owned || !g->stale)
			continue;
		if (efs_etcd_txn_resp_range(resp, k++, &ro) < 0 ||
		    efs_etcd_txn_resp_range(resp, k++, &rm) < 0)
			break;
		if (ro->n_kvs == 1 &&
		    efs_meta_ag_owner_decode(ro->kvs[0]->value.data, ro->kvs[0]->value.len, &ow,
					     NULL) == 0) {
			ok = !strcmp(ow->node, a->node) &&
			     ow->session_generation == efs_session_generation(a->s) &&
			     ro->kvs[0]->lease == efs_session_lease_id(a->s);
			efs_meta_record_free(ow);
		}
		if (ok && hold != 0 && efs_runs_append(&was, &g->committed.free) < 0) {
			efs_runs_done(&was);
			continue; /* stays stale: read again before the next grant */
		}
		if (ok && rm->n_kvs == 1 && load_map(a, g, rm->kvs[0]) == 0) {
			g->owner_rev = ro->kvs[0]->mod_revision;
			g->stale = false;
			if (hold != 0) {
				hold_newly_free(a, g, &g->committed.free, &was);
				if (avail_recompute(g) < 0)
					g->dirty = true;
			}
		} else {
			efs_log_warn("alloc: group %" PRIu32 " is no longer ours", g->g);
			grp_forget(g);
		}
		efs_runs_done(&was);
	}
	update_gauges(a);
	kick(a);
}

static int start_reread(struct efs_alloc *a)
{
	struct efs_etcd_txn *t;
	struct efs_meta_key k;
	size_t idx;
	int r;

	r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	r = hold_read(a, t, &idx); /* first: reread_cb reads it at 0 */
	for (uint32_t i = 0; i < a->ngroups && r == 0; i++) {
		struct grp *g = &a->groups[i];

		if (!g->owned || !g->stale)
			continue;
		r = efs_meta_key_ag(&a->ns, g->g, EFS_META_K_AG_OWNER, &k);
		if (r == 0)
			r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0);
		if (r == 0)
			r = efs_meta_key_ag(&a->ns, g->g, EFS_META_K_AG_MAP, &k);
		if (r == 0)
			r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0);
	}
	if (r < 0) {
		efs_etcd_txn_free(t);
		return r;
	}
	r = send_txn(a, t, reread_cb, a->held_gen, NULL);
	if (r == 0) {
		a->rereading = true;
		a->token = TOKEN_INTERNAL;
	}
	return r;
}

static void grant_next(struct efs_alloc *a)
{
	struct tokw *w;

	if (a->token || efs_list_empty(&a->tokw))
		return;
	if (any_stale(a)) {
		if (session_ok(a) && start_reread(a) == 0)
			return;
		return; /* retried by the tick */
	}
	w = efs_list_entry(efs_list_pop(&a->tokw), struct tokw, link);
	a->token = TOKEN_INTERNAL; /* the waiter sets its own */
	w->fn(a, w->arg);
	efs_mem_free(w);
}

/* ---- Quarantine ---- */

static struct intent *intent_find(struct efs_alloc *a, uint64_t id)
{
	for (struct intent *i = a->intents; i; i = i->next)
		if (i->id == id)
			return i;
	return NULL;
}

static struct intent *intent_by_key(struct efs_alloc *a, const ProtobufCBinaryData *key)
{
	for (struct intent *i = a->intents; i; i = i->next)
		if (i->key.len == key->len && !memcmp(i->key.buf, key->data, key->len))
			return i;
	return NULL;
}

static void intent_drop(struct efs_alloc *a, struct intent *in);

static void released(uint32_t group, uint64_t start, uint64_t len, void *arg)
{
	struct efs_alloc *a = arg;
	struct grp *g;

	if (group == INTENT_GROUP) {
		struct intent *in = intent_find(a, start);

		if (in)
			in->ready = true;
		return;
	}
	if (group >= a->ngroups)
		return;
	g = &a->groups[group];
	if (!g->owned)
		return;
	if (efs_runs_subtract(&g->quar, start, len, NULL) < 0)
		efs_log_warn("alloc: out of memory releasing quarantine");
	g->dirty = true;
}

static void quar_release(struct efs_alloc *a)
{
	bool any = false;

	if (efs_quar_release(a->q, released, a) == 0)
		return;
	for (uint32_t i = 0; i < a->ngroups; i++) {
		struct grp *g = &a->groups[i];

		if (g->owned && g->dirty) {
			if (avail_recompute(g) < 0)
				efs_log_warn("alloc: out of memory recomputing group %" PRIu32, i);
			any = true;
		}
	}
	update_gauges(a);
	if (any && !efs_list_empty(&a->getw))
		kick(a);
}

uint64_t efs_alloc_read_begin(struct efs_alloc *a)
{
	return efs_quar_read_begin(a->q);
}

void efs_alloc_read_end(struct efs_alloc *a, uint64_t ticket)
{
	efs_quar_read_end(a->q, ticket);
	quar_release(a);
}

/* ---- Creation ---- */

static uint32_t hash_node(const char *s)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 16777619u;
	return h;
}

static uint32_t gcd32(uint32_t x, uint32_t y)
{
	while (y) {
		uint32_t t = x % y;

		x = y;
		y = t;
	}
	return x;
}

int efs_alloc_new(struct efs_alloc **ret, uv_loop_t *loop, struct efs_etcd *c,
		  struct efs_session *s, const struct efs_alloc_opts *o)
{
	struct efs_alloc *a;
	uint64_t nblk, dev = 0;

	if (!o || !o->ns || !o->fi || !c || !s || !loop)
		return -EINVAL;
	if (!o->fi->ag_count || !o->fi->ag_blocks || !o->fi->block_size)
		return -EINVAL;
	nblk = o->fi->device_size / o->fi->block_size;
	if (nblk <= o->fi->data_start)
		return -EINVAL;
	a = efs_mem_calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	efs_list_init(&a->tokw);
	efs_list_init(&a->getw);
	efs_list_init(&a->calls);
	a->loop = loop;
	a->c = c;
	a->s = s;
	a->ns = *o->ns;
	a->fi = o->fi;
	snprintf(a->node, sizeof(a->node), "%s", efs_session_node(s));
	a->ngroups = o->fi->ag_count;
	a->data_start = o->fi->data_start;
	a->ag_blocks = o->fi->ag_blocks;
	a->total_blocks = nblk - o->fi->data_start;
	a->groups_initial = o->groups_initial ? o->groups_initial : 2;
	a->reserve = o->reserve_blocks ? o->reserve_blocks
				       : (a->total_blocks / 100 > 64 ? a->total_blocks / 100 : 64);
	a->reserve_default = !o->reserve_blocks;
	a->device_size = o->fi->device_size;
	a->dev_fd = o->dev_fd;
	a->grown = o->grown;
	a->grown_arg = o->grown_arg;
	a->inode_limit = o->inode_limit;
	if (o->dev_fd && efs_alloc_device_bytes(*o->dev_fd, &dev) == 0 &&
	    dev < o->fi->device_size) {
		/* Mounted after a growth this host's device does not show yet:
		 * the visible part only, the rest once it does (grow_try). */
		if (dev / o->fi->block_size <= a->data_start) {
			efs_mem_free(a);
			return -ENXIO;
		}
		a->grow_size = o->fi->device_size;
		a->grow_count = o->fi->ag_count;
		a->grow_warned = a->grow_size;
		a->device_size = dev;
		a->total_blocks = dev / o->fi->block_size - a->data_start;
		a->ngroups = (uint32_t)((a->total_blocks + a->ag_blocks - 1) / a->ag_blocks);
		if (a->reserve_default)
			a->reserve = a->total_blocks / 100 > 64 ? a->total_blocks / 100 : 64;
		efs_log_warn("alloc: the filesystem has %" PRIu64 " bytes but this node's device "
			     "has %" PRIu64 ": using groups 0-%" PRIu32
			     " until it sees the whole size",
			     o->fi->device_size, dev, a->ngroups - 1);
	}
	a->fold_ms = o->fold_interval_ms ? o->fold_interval_ms : 5000;
	a->grace_ns = (uint64_t)(o->dead_grace_ms ? o->dead_grace_ms : EFS_ALLOC_DEAD_GRACE_MS) *
		      1000000ull;
	a->block_size = o->fi->block_size;
	a->ho_wait_ns = (uint64_t)(o->handover_wait_ms ? o->handover_wait_ms
						       : (uint32_t)efs_session_ttl_s(s) * 1000u) *
			1000000ull;
	if (!a->ho_wait_ns)
		a->ho_wait_ns = 2000ull * 1000000;
	efs_session_owner_self(s, &a->self);
#if EFS_FAULT_HOOKS
	/* ETCFS_FAULT_NO_BACKUP_HOLD=1 (tests): freed blocks are never held,
	 * as on a node without the hold, to show what it prevents. */
	if (getenv("ETCFS_FAULT_NO_BACKUP_HOLD")) {
		a->hold_off = true;
		efs_log_warn("alloc: ETCFS_FAULT_NO_BACKUP_HOLD: blocks freed during a backup "
			     "are not held");
	}
#endif
	a->groups = efs_mem_calloc(a->ngroups, sizeof(*a->groups));
	if (!a->groups)
		goto fail;
	for (uint32_t i = 0; i < a->ngroups; i++) {
		a->groups[i].g = i;
		a->groups[i].start = grp_start(a, i);
		a->groups[i].blocks = grp_blocks(a, i);
	}
	if (efs_quar_new(&a->q) < 0)
		goto fail;
	a->kick = efs_timer_new(loop, a);
	a->tick = efs_timer_new(loop, a);
	a->ho_timer = efs_timer_new(loop, a);
	a->dh_timer = efs_timer_new(loop, a);
	a->give_sel = efs_mem_calloc(BATCH_MAX / 3, sizeof(*a->give_sel));
	if (!a->kick || !a->tick || !a->ho_timer || !a->dh_timer || !a->give_sel)
		goto fail;
	if (o->m) {
		a->g_owned = efs_metrics_gauge(o->m, "etcfs_space_groups_owned",
					       "Allocation groups this node owns", NULL);
		a->g_avail = efs_metrics_gauge(o->m, "etcfs_space_avail_blocks",
					       "Blocks allocatable now in owned groups", NULL);
		a->g_pending = efs_metrics_gauge(o->m, "etcfs_space_pending_blocks",
						 "Blocks allocated and not yet published", NULL);
		a->g_quar = efs_metrics_gauge(o->m, "etcfs_space_quarantine_blocks",
					      "Freed blocks waiting for older reads", NULL);
		a->g_grace = efs_metrics_gauge(o->m, "etcfs_space_grace_bytes",
					       "Free space of dead nodes' groups waiting out the "
					       "dead-node grace",
					       NULL);
		a->g_held = efs_metrics_gauge(o->m, "etcfs_space_held_bytes",
					      "Freed space held back from allocation while a backup "
					      "runs",
					      NULL);
		a->g_dheld = efs_metrics_gauge(o->m, "etcfs_space_death_held_bytes",
					       "Freed space held back from allocation while a node "
					       "whose session ended may still write to it",
					       NULL);
		a->c_dh_waits = efs_metrics_counter(
			o->m, "etcfs_space_death_hold_waits_total",
			"Freed runs that waited for the death hold (a dead node's grace, or "
			"a session end not known yet) instead of joining the quarantine at "
			"commit",
			NULL);
		a->c_double = efs_metrics_counter(o->m, "etcfs_space_double_frees_total",
						  "Double frees found and refused", NULL);
		a->c_claims = efs_metrics_counter(o->m, "etcfs_space_claims_total",
						  "Allocation groups claimed", NULL);
		a->c_given = efs_metrics_counter(o->m, "etcfs_space_groups_given_total",
						 "Allocation groups handed over to a node short of "
						 "space",
						 NULL);
		a->h_ho_wait = efs_metrics_histogram(
			o->m, "etcfs_space_handover_wait_seconds",
			"From a hand-over request (this node short of space) to the first "
			"allocation it let through",
			NULL);
		if (!a->g_owned || !a->g_avail || !a->g_pending || !a->g_quar || !a->g_grace ||
		    !a->g_held ||
		    !a->c_double || !a->c_claims || !a->c_given || !a->h_ho_wait)
			goto fail;
		for (int k = 0; k < 4; k++) {
			static const char *const oc[4] = {"ok", "conflict", "error", "unknown"};
			char lab[64];

			snprintf(lab, sizeof(lab), "origin=\"space\",outcome=\"%s\"", oc[k]);
			a->c_txn[k] = efs_metrics_counter(o->m, "etcfs_etcd_txns_total",
							  "etcd transactions by origin and outcome",
							  lab);
			if (!a->c_txn[k])
				goto fail;
		}
	}
	*ret = a;
	return 0;
fail:
	efs_alloc_free(a);
	return -ENOMEM;
}

/* ---- Claims ---- */

static void scan_free(struct efs_alloc *a)
{
	if (a->scan_resp)
		protobuf_c_message_free_unpacked(&a->scan_resp->base, efs_mem_protobuf());
	a->scan_resp = NULL;
	a->scan = NULL;
	efs_mem_free(a->scan_owner);
	efs_mem_free(a->scan_map);
	efs_mem_free(a->cand);
	a->scan_owner = a->scan_map = NULL;
	a->cand = NULL;
	a->ncand = a->icand = 0;
}

static void fail_getters(struct efs_alloc *a, int err)
{
	while (!efs_list_empty(&a->getw)) {
		struct getw *w = efs_list_entry(efs_list_pop(&a->getw), struct getw, link);

		w->cb(err, w->arg);
		efs_mem_free(w);
	}
}

static void start_finish(struct efs_alloc *a, int status)
{
	void (*cb)(int, void *) = a->start_cb;

	if (!a->starting)
		return;
	a->starting = false;
	a->start_cb = NULL;
	if (status == 0) {
		a->started = true;
		uv_timer_start(a->tick, tick_cb, a->fold_ms, a->fold_ms);
	}
	token_release(a);
	if (status == 0) {
		orphan_probe(a); /* intents in groups nobody owns */
		ho_watch_start(a);
	}
	if (cb)
		cb(status, a->start_arg);
	if (!efs_list_empty(&a->getw))
		kick(a);
}

/* The claim round is over (claimed what it could). */
static void claim_done(struct efs_alloc *a, int err)
{
	/* Every candidate of the scan tried (or taken): nothing left to claim
	 * for a while. */
	bool exhausted = a->icand >= a->ncand;
	bool orphans = a->orphan_round;

	scan_free(a);
	a->claim_busy = false;
	a->orphan_round = false;
	if (err == 0 && !orphans && (exhausted || a->claim_need > 0))
		a->nofree_until = efs_clock_mono_ns() + RESCAN_NS;
	a->claim_need = 0;
	if (orphans && err == 0)
		fold_soon(a); /* the claimed groups' intents */
	if (a->probe_want && err == 0)
		orphan_probe(a);
	update_gauges(a);
	if (err == 0 && !a->starting && !a->started) {
		/* Started again after a lost session (the first claim round of
		 * the new one): the sweep was stopped with it. */
		a->started = true;
		uv_timer_start(a->tick, tick_cb, a->fold_ms, a->fold_ms);
	}
	if (a->claim_has_token) {
		a->claim_has_token = false;
		if (!a->starting) {
			token_release(a); /* the session was lost meanwhile */
		} else if (err < 0) {
			start_finish(a, err);
			fail_getters(a, err);
			return;
		} else {
			fold_all(a, true); /* ends the start */
			return;
		}
	}
	if (err < 0)
		fail_getters(a, err);
	else
		serve_getters(a);
}

static void claim_next(struct efs_alloc *a);

static void claim_txn_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
			 Etcdserverpb__TxnResponse *resp)
{
	struct grp *g = &a->groups[c->u];
	int64_t hold;

	count_txn(a, r, resp);
	if (c->epoch != a->epoch) {
		claim_done(a, -EIO);
		return;
	}
	if (r->err < 0) {
		efs_log_warn("alloc: claiming group %" PRIu32 " failed: %s", g->g, r->message);
		claim_done(a, -EIO);
		return;
	}
	if (!resp->succeeded) {
		a->icand++;
		claim_next(a);
		return;
	}
	/* The map kv of the scan is current (compared). */
	if (load_map(a, g, a->scan->kvs[a->scan_map[g->g]]) < 0) {
		a->icand++;
		claim_next(a);
		return;
	}
	/* Claimed while a backup runs, with a map that changed since that
	 * backup's revision: its previous owner's frees since then are not
	 * told apart from older ones, so every free block starts held. A map
	 * unchanged since has freed nothing the backup references. */
	hold = hold_in(resp, 0);
	if (hold != 0 && (hold < 0 || g->map_rev > hold) && !a->hold_off) {
		for (size_t i = 0; i < g->committed.free.n; i++)
			hold_add(a, g, g->committed.free.v[i].start, g->committed.free.v[i].len);
		if (avail_recompute(g) < 0)
			g->dirty = true;
		efs_log_info("alloc: group %" PRIu32 " claimed while a backup runs: its free "
			     "blocks are held until it ends",
			     g->g);
	}
	g->owned = true;
	g->stale = false;
	g->owner_rev = resp->header ? resp->header->revision : 0;
	a->claims++;
	if (a->c_claims)
		efs_counter_inc(a->c_claims);
	if (a->others_free >= g->committed.nfree)
		a->others_free -= g->committed.nfree;
	else
		a->others_free = 0;
	efs_log_info("alloc: claimed group %" PRIu32 " (%" PRIu64 " free blocks)", g->g,
		     g->committed.nfree);
	a->icand++;
	if (a->claim_need)
		a->claim_need--;
	claim_next(a);
}

static void claim_next(struct efs_alloc *a)
{
	Etcfs__AgOwner ow = ETCFS__AG_OWNER__INIT;
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	const Mvccpb__KeyValue *okv, *mkv;
	struct grp *g;
	size_t idx;
	int r;

	if (a->claim_need == 0 || a->icand >= a->ncand) {
		claim_done(a, 0);
		return;
	}
	if (!session_ok(a)) {
		claim_done(a, -EIO);
		return;
	}
	g = &a->groups[a->cand[a->icand]];
	okv = a->scan_owner[g->g] >= 0 ? a->scan->kvs[a->scan_owner[g->g]] : NULL;
	mkv = a->scan->kvs[a->scan_map[g->g]];
	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_meta_key_ag(&a->ns, g->g, EFS_META_K_AG_OWNER, &k);
	if (r == 0 && okv)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 okv->mod_revision);
	else if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 0);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, mkv->key.data,
					 mkv->key.len, mkv->mod_revision);
	if (r == 0)
		r = efs_session_guard(a->s, t);
	if (r == 0)
		r = hold_read(a, t, &idx); /* first: claim_txn_cb reads it at 0 */
	if (r == 0)
		r = put_free(a, t, g->g, g->seen_free, false);
	ow.node = a->node;
	ow.session_generation = efs_session_generation(a->s);
	ow.lease_id = efs_session_lease_id(a->s);
	if (r == 0)
		r = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &k, &ow.base, ow.lease_id);
	if (r < 0) {
		efs_etcd_txn_free(t);
		claim_done(a, r);
		return;
	}
	r = send_txn(a, t, claim_txn_cb, g->g, NULL);
	if (r < 0)
		claim_done(a, r);
}

/*
 * May a group with no owner key whose AgFree.last is |lo| be claimed at
 * once? Yes when nothing is recorded (mkfs, fsck, older writers), when its
 * last owner released it at a clean leave, or when the last owner was a
 * process of this node that is gone (a restart on the same machine: no
 * write of it can still be in flight). Any other last owner may be a
 * process that is cut off, not dead, with device writes still queued:
 * its group waits out the grace.
 */
static bool last_lets_claim(struct efs_alloc *a, const Etcfs__AgLastOwner *lo)
{
	struct efs_session_owner old;

	if (!lo || !lo->node || !lo->node[0] || lo->released)
		return true;
	if (strcmp(lo->node, a->node) != 0)
		return false;
	old = (struct efs_session_owner){
		.machine_id = lo->machine_id,
		.boot_id = lo->boot_id,
		.pid_ns = lo->pid_ns,
		.pid = lo->pid,
		.pid_start = lo->pid_start,
	};
	if (!efs_session_owner_gone(a->s, &old))
		return false;
	a->prev_gone = true;
	return true;
}

/*
 * Notes the mod revision of ag/<g>/free that a read of group |g| saw. Only
 * an owner (or a claimer) writes that key, so a new revision means the
 * group had an owner since this node last read it, one whose owner key may
 * have come and gone between two reads: the grace clock starts again.
 */
static void free_rev_seen(struct grp *g, int64_t rev)
{
	if (g->free_rev != rev)
		g->ownerless_ns = 0;
	g->free_rev = rev;
}

/* Has |g|, seen without an owner key now, been ownerless for the grace?
 * The clock starts when this node first saw it so: a death this node
 * learnt of late only waits longer. */
static bool grace_over(const struct efs_alloc *a, struct grp *g, uint64_t now)
{
	if (!g->ownerless_ns)
		g->ownerless_ns = now;
	return now - g->ownerless_ns >= a->grace_ns;
}

/* Notes what a scan or probe saw of group |g| not owned by us: an owner
 * key or none. Returns true when it may be claimed now (no owner key, and
 * its last owner lets it or its grace is over). */
static bool grp_seen(struct efs_alloc *a, struct grp *g, bool has_owner, uint64_t now)
{
	if (has_owner) {
		g->ownerless_ns = 0;
		g->verdict = V_UNKNOWN;
		return false;
	}
	if (g->verdict != V_GRACE) {
		if (!g->ownerless_ns)
			g->ownerless_ns = now;
		return true;
	}
	return grace_over(a, g, now);
}

/* Free blocks of the groups waiting out a grace, as last seen. */
static void grace_sum(struct efs_alloc *a, uint64_t now)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < a->ngroups; i++) {
		struct grp *g = &a->groups[i];

		if (!g->owned && g->verdict == V_GRACE && g->ownerless_ns &&
		    now - g->ownerless_ns < a->grace_ns)
			n += g->seen_free;
	}
	a->grace_blocks = n;
}

static void scan_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		    Etcdserverpb__TxnResponse *resp)
{
	uint64_t now = efs_clock_mono_ns();
	Etcdserverpb__RangeResponse *rr = NULL;
	uint32_t n = a->ngroups, start, stride;
	uint64_t others = 0;
	uint8_t *taken;

	if (c->epoch != a->epoch) {
		claim_done(a, -EIO);
		return;
	}
	if (r->err < 0 || efs_etcd_txn_resp_range(resp, 0, &rr) < 0) {
		efs_log_warn("alloc: reading allocation groups failed: %s", r->message);
		claim_done(a, -EIO);
		return;
	}
	/* Keep the range response for the claim transactions. */
	a->scan = rr;
	a->scan_resp = resp;
	r->resp = NULL;
	a->scan_owner = efs_mem_malloc(n * sizeof(int32_t));
	a->scan_map = efs_mem_malloc(n * sizeof(int32_t));
	a->cand = efs_mem_malloc(n * sizeof(uint32_t));
	taken = efs_mem_calloc(n, 1); /* 1: ours (previous session), 2: someone's; | 4: intents */
	if (!a->scan_owner || !a->scan_map || !a->cand || !taken) {
		efs_mem_free(taken);
		claim_done(a, -ENOMEM);
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		a->scan_owner[i] = a->scan_map[i] = -1;
		a->groups[i].verdict = V_NOW; /* unless its AgFree says otherwise */
		a->groups[i].seen_free = 0;
	}
	for (size_t i = 0; i < rr->n_kvs; i++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = rr->kvs[i];

		if (efs_meta_key_parse(&a->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.group >= n)
			continue;
		if (ki.family == EFS_META_K_AG_OWNER) {
			Etcfs__AgOwner *ow = NULL;

			a->scan_owner[ki.group] = (int32_t)i;
			taken[ki.group] = 2;
			if (efs_meta_ag_owner_decode(kv->value.data, kv->value.len, &ow, NULL) ==
			    0) {
				if (!strcmp(ow->node, a->node))
					taken[ki.group] = 1;
				efs_meta_record_free(ow);
			}
		} else if (ki.family == EFS_META_K_AG_MAP) {
			a->scan_map[ki.group] = (int32_t)i;
		} else if (ki.family == EFS_META_K_AG_FREE) {
			Etcfs__AgFree *af = NULL;

			free_rev_seen(&a->groups[ki.group], kv->mod_revision);
			if (!a->groups[ki.group].owned &&
			    efs_meta_ag_free_decode(kv->value.data, kv->value.len, &af,
						    NULL) == 0) {
				struct grp *g = &a->groups[ki.group];

				others += af->free_blocks;
				g->seen_free = af->free_blocks;
				g->verdict = last_lets_claim(a, af->last) ? V_NOW : V_GRACE;
				efs_meta_record_free(af);
			}
		} else if (ki.family == EFS_META_K_FREE_INTENT) {
			a->groups[ki.group].has_intents = true;
			taken[ki.group] |= 4;
		}
	}
	a->others_free = others;
	for (uint32_t i = 0; i < n; i++) {
		struct grp *g = &a->groups[i];

		g->other_owner = !g->owned && (taken[i] & 3) == 2;
		if (!g->owned && !grp_seen(a, g, (taken[i] & 3) != 0, now))
			taken[i] |= 8; /* not claimable now */
	}
	grace_sum(a, now);
	/* Candidates, in the spread order hash(node) + k * stride: ours from a
	 * previous session first, then free groups with intents (their blocks
	 * come back with the claim's fold), then the other free groups. An
	 * orphan round takes only the first two kinds, all of them. */
	start = hash_node(a->node) % n;
	stride = n / (a->groups_initial ? a->groups_initial : 1);
	if (stride == 0)
		stride = 1;
	while (gcd32(stride, n) != 1)
		stride++;
	for (int pass = 0; pass < 3; pass++) {
		for (uint32_t k = 0; k < n; k++) {
			uint32_t g = (uint32_t)((start + (uint64_t)k * stride) % n);
			uint8_t o = taken[g] & 3;
			bool in = taken[g] & 4;

			if (a->groups[g].owned || a->scan_map[g] < 0 ||
			    (o == 0 && (taken[g] & 8)))
				continue;
			if ((pass == 0 && o == 1) || (pass == 1 && o == 0 && in) ||
			    (pass == 2 && o == 0 && !in && !a->orphan_round))
				a->cand[a->ncand++] = g;
		}
	}
	if (a->orphan_round)
		a->claim_need = (uint32_t)a->ncand;
	efs_mem_free(taken);
	claim_next(a);
}

static void claim_session_cb(struct efs_session_waiter *w, int status, bool gen_changed)
{
	struct efs_alloc *a = w->arg;

	(void)gen_changed;
	a->sw_queued = false;
	if (status < 0) {
		claim_done(a, -EIO);
		return;
	}
	a->claim_busy = false;
	claim_round(a);
}

static void claim_round(struct efs_alloc *a)
{
	struct efs_meta_range rg;
	struct efs_etcd_txn *t;
	int r;

	if (a->claim_busy)
		return;
	a->claim_busy = true;
	if (!session_ok(a)) {
		r = efs_session_wait(a->s, &a->sw, claim_session_cb, a);
		if (r == 0) {
			a->sw_queued = true;
			return;
		}
	}
	r = efs_meta_range_family(&a->ns, EFS_META_K_AG_OWNER, &rg);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0) {
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len, rg.end.buf,
				       rg.end.len);
		if (r < 0)
			efs_etcd_txn_free(t);
		else
			r = send_txn(a, t, scan_cb, 0, NULL);
	}
	if (r < 0)
		claim_done(a, r);
}

/* ---- Orphan groups ---- */

static void probe_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		     Etcdserverpb__TxnResponse *resp)
{
	Etcdserverpb__RangeResponse *rr = NULL;
	uint8_t *seen; /* 1: owner key, 2: intents */
	uint32_t orphans = 0;
	bool again = a->probe_want; /* intents made while it ran */
	bool census = false;	    /* a group lost its owner since the last scan */
	uint64_t now = efs_clock_mono_ns();

	a->probe_busy = false;
	a->probe_want = false;
	if (c->epoch != a->epoch)
		return;
	if (r->err < 0 || efs_etcd_txn_resp_range(resp, 0, &rr) < 0) {
		efs_log_warn("alloc: probing for orphan groups failed: %s", r->message);
		a->probe_want = true; /* the next tick retries */
		return;
	}
	seen = efs_mem_calloc(a->ngroups, 1);
	if (!seen) {
		a->probe_want = true;
		return;
	}
	for (size_t i = 0; i < rr->n_kvs; i++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = rr->kvs[i];

		if (efs_meta_key_parse(&a->ns, kv->key.data, kv->key.len, &ki) < 0 ||
		    ki.group >= a->ngroups)
			continue;
		if (ki.family == EFS_META_K_AG_OWNER)
			seen[ki.group] |= 1;
		else if (ki.family == EFS_META_K_FREE_INTENT)
			seen[ki.group] |= 2;
		else if (ki.family == EFS_META_K_AG_FREE)
			free_rev_seen(&a->groups[ki.group], kv->mod_revision);
	}
	for (uint32_t i = 0; i < a->ngroups; i++) {
		struct grp *g = &a->groups[i];
		bool now_ok;

		g->other_owner = !g->owned && (seen[i] & 1);
		if (g->owned)
			continue;
		census |= !(seen[i] & 1) && g->verdict == V_UNKNOWN;
		now_ok = grp_seen(a, g, seen[i] & 1, now);
		if (seen[i] == 2 && now_ok)
			orphans++;
	}
	efs_mem_free(seen);
	grace_sum(a, now);
	update_gauges(a);
	if (!orphans && !census) {
		if (again)
			orphan_probe(a);
		return;
	}
	if (a->left || a->leave_cb)
		return;
	if (a->claim_busy || a->starting || !a->started) {
		a->probe_want = true;
		return;
	}
	efs_log_debug("alloc: %" PRIu32 " group(s) with free intents and no owner: claiming%s",
		      orphans, census ? " (and reading groups that lost their owner)" : "");
	a->orphan_round = true;
	a->claim_need = orphans;
	claim_round(a);
}

/*
 * Looks for groups holding free intents with no owner key (keys only), and
 * claims them when there are. Coalesced: one probe at a time.
 */
static void orphan_probe(struct efs_alloc *a)
{
	struct efs_meta_range rg;
	struct efs_etcd_txn *t = NULL;
	int r;

	if (a->left || a->leave_cb)
		return;
	if (a->probe_busy || a->claim_busy || !a->started || a->starting || !session_ok(a)) {
		a->probe_want = true;
		return;
	}
	a->probe_want = false;
	r = efs_meta_range_family(&a->ns, EFS_META_K_AG_OWNER, &rg);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_etcd_txn_range_keys(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
					    rg.end.buf, rg.end.len);
	if (r == 0) {
		r = send_txn(a, t, probe_cb, 0, NULL);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r == 0) {
		a->probe_busy = true;
	} else {
		efs_log_warn("alloc: probing for orphan groups: %s", strerror(-r));
		a->probe_want = true;
	}
}

static void start_token(struct efs_alloc *a, void *arg)
{
	(void)arg;
	if (!a->starting) {
		token_release(a);
		return;
	}
	a->claim_has_token = true;
	a->claim_need = a->groups_initial;
	claim_round(a);
}

int efs_alloc_start(struct efs_alloc *a, void (*cb)(int status, void *arg), void *arg)
{
	int r;

	if (a->starting || a->started || a->left)
		return -EALREADY;
	if (!session_ok(a))
		return -EIO;
	r = token_wait(a, start_token, NULL);
	if (r < 0)
		return r;
	a->starting = true;
	a->start_cb = cb;
	a->start_arg = arg;
	return 0;
}

/* ---- Free-intent folds ---- */

struct fold {
	bool from_start;
	Etcdserverpb__TxnResponse *resp; /* owned */
	uint32_t *grps;			 /* owned groups, in the order of the ranges */
	size_t ngrps, igrp;
	size_t from; /* next kv of the current group's range */
	size_t bfrom; /* first kv of the batch in flight */
	uint64_t held_gen; /* a->held_gen when the batch in flight was built */
	struct efs_freemap built;
	bool has_built;
};

static void fold_free(struct fold *f)
{
	if (f->resp)
		protobuf_c_message_free_unpacked(&f->resp->base, efs_mem_protobuf());
	if (f->has_built)
		efs_freemap_done(&f->built);
	efs_mem_free(f->grps);
	efs_mem_free(f);
}

static void fold_end(struct efs_alloc *a, struct fold *f)
{
	bool from_start = f->from_start;

	fold_free(f);
	a->fold = NULL;
	a->fold_busy = false;
	update_gauges(a);
	if (from_start && a->starting)
		start_finish(a, 0);
	else
		token_release(a);
	if (a->fold_again) {
		a->fold_again = false;
		fold_soon(a);
	}
}

/*
 * Has the grace passed since this node first saw session |session| of
 * |node| ended? Its undrained free intents wait for it: the node may be
 * cut off rather than dead, with reads of those blocks still in flight.
 * An earlier session of this node whose process was found gone need not
 * wait. Entries go once twice the grace has passed (their intents are
 * folded by then, or will wait once more).
 */
static bool dead_grace_over(struct efs_alloc *a, const char *node, uint64_t session)
{
	uint64_t now = efs_clock_mono_ns();
	struct deadsess **pp = &a->dead, *d;

	if (a->prev_gone && !strcmp(node, a->node))
		return true;
	while ((d = *pp)) {
		if (!strcmp(d->node, node) && d->session == session)
			return now - d->since_ns >= a->grace_ns;
		if (now - d->since_ns >= 2 * a->grace_ns) {
			*pp = d->next;
			efs_mem_free(d);
			continue;
		}
		pp = &d->next;
	}
	d = efs_mem_calloc(1, sizeof(*d));
	if (!d)
		return false; /* asked again at the next fold */
	snprintf(d->node, sizeof(d->node), "%s", node);
	d->session = session;
	d->since_ns = now;
	d->next = a->dead;
	a->dead = d;
	return false;
}

/* Is the intent |kv| foldable: drained, or its session is over (and the
 * grace has passed since)? */
static bool intent_foldable(struct efs_alloc *a, const Mvccpb__KeyValue *kv,
			    const Etcdserverpb__RangeResponse *nodes, Etcfs__FreeIntent **ret)
{
	struct efs_meta_key_info ki;
	Etcfs__FreeIntent *fi = NULL;
	bool live = false;

	if (efs_meta_key_parse(&a->ns, kv->key.data, kv->key.len, &ki) < 0 ||
	    ki.family != EFS_META_K_FREE_INTENT)
		return false;
	if (efs_meta_free_intent_decode(kv->value.data, kv->value.len, &fi, NULL) < 0) {
		efs_log_err("alloc: undecodable free intent in group %" PRIu32 " (left alone)",
			    ki.group);
		return false;
	}
	if (!strcmp(ki.node, a->node)) {
		live = ki.session == efs_session_generation(a->s);
		if (live) {
			/* Ours, and its blocks left quarantine: no drained mark
			 * needed before the fold. */
			const struct intent *in = intent_by_key(a, &kv->key);

			live = !(in && in->ready);
		}
	} else {
		for (size_t i = 0; nodes && i < nodes->n_kvs; i++) {
			struct efs_meta_key_info ni;
			Etcfs__NodeInfo *n = NULL;

			if (efs_meta_key_parse(&a->ns, nodes->kvs[i]->key.data,
					       nodes->kvs[i]->key.len, &ni) < 0 ||
			    ni.family != EFS_META_K_NODE || strcmp(ni.node, ki.node))
				continue;
			live = true; /* undecodable record: assume alive */
			if (efs_meta_nodeinfo_decode(nodes->kvs[i]->value.data,
						     nodes->kvs[i]->value.len, &n, NULL) == 0) {
				live = n->session_generation == ki.session;
				efs_meta_record_free(n);
			}
		}
	}
	if (!fi->drained && (live || !dead_grace_over(a, ki.node, ki.session))) {
		efs_meta_record_free(fi);
		return false;
	}
	*ret = fi;
	return true;
}

static void fold_step(struct efs_alloc *a, struct fold *f);

static void fold_txn_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
			Etcdserverpb__TxnResponse *resp)
{
	struct fold *f = c->p;
	struct grp *g = &a->groups[f->grps[f->igrp]];

	count_txn(a, r, resp);
	if (c->epoch != a->epoch) {
		fold_end(a, f);
		return;
	}
	if (r->err < 0 || !resp->succeeded) {
		efs_log_warn("alloc: folding free intents of group %" PRIu32 " failed: %s", g->g,
			     r->err < 0 ? r->message : "map or owner changed");
		g->stale = true;
		f->igrp++;
		f->from = 0;
	} else {
		Etcdserverpb__RangeResponse *rr = NULL;
		int64_t hold = hold_in(resp, 0);

		if (hold == 0)
			hold_release(a, f->held_gen);
		if (g->owned) {
			/* The blocks it folds in are freed now, as far as a
			 * backup's snapshot can tell. */
			if (hold != 0)
				hold_newly_free(a, g, &f->built.free, &g->committed.free);
			efs_freemap_done(&g->committed);
			g->committed = f->built;
			f->has_built = false;
			g->map_rev = resp->header ? resp->header->revision : 0;
			if (avail_recompute(g) < 0)
				g->dirty = true;
		}
		/* Our own intents folded by this batch are done with. */
		if (efs_etcd_txn_resp_range(f->resp, f->igrp, &rr) == 0) {
			for (size_t i = f->bfrom; i < f->from && i < rr->n_kvs; i++) {
				struct intent *in = intent_by_key(a, &rr->kvs[i]->key);

				if (in && in->ready)
					intent_drop(a, in);
			}
		}
	}
	fold_step(a, f);
}

static void fold_step(struct efs_alloc *a, struct fold *f)
{
	Etcdserverpb__RangeResponse *nodes = NULL, *rr = NULL;

	efs_etcd_txn_resp_range(f->resp, f->ngrps, &nodes);
	while (f->igrp < f->ngrps) {
		struct grp *g = &a->groups[f->grps[f->igrp]];
		struct efs_runs all = {0}, dbl = {0};
		struct efs_etcd_txn *t = NULL;
		size_t nint = 0, idx;
		int64_t freed;
		int r = 0;

		if (!g->owned || g->stale || efs_etcd_txn_resp_range(f->resp, f->igrp, &rr) < 0 ||
		    f->from >= rr->n_kvs) {
			f->igrp++;
			f->from = 0;
			continue;
		}
		r = efs_etcd_txn_new(&t, 0);
		if (r == 0)
			r = owner_compares(a, t, g);
		if (r == 0)
			r = efs_session_guard(a->s, t);
		if (r == 0)
			r = hold_read(a, t, &idx); /* first: fold_txn_cb reads it at 0 */
		f->held_gen = a->held_gen;
		f->bfrom = f->from;
		for (; r == 0 && f->from < rr->n_kvs && nint < BATCH_MAX; f->from++) {
			const Mvccpb__KeyValue *kv = rr->kvs[f->from];
			Etcfs__FreeIntent *fi = NULL;

			if (!intent_foldable(a, kv, nodes, &fi))
				continue;
			for (size_t i = 0; r == 0 && i < fi->n_runs; i++)
				r = efs_runs_add(&all, fi->runs[i]->start, fi->runs[i]->len);
			efs_meta_record_free(fi);
			if (r == 0)
				r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL,
							 kv->key.data, kv->key.len,
							 kv->mod_revision);
			if (r == 0)
				r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, kv->key.data,
							kv->key.len, NULL, 0, false);
			nint++;
		}
		if (r == 0 && nint == 0) {
			efs_etcd_txn_free(t);
			efs_runs_done(&all);
			continue; /* nothing foldable left in this group */
		}
		if (f->has_built)
			efs_freemap_done(&f->built);
		f->has_built = false;
		if (r == 0)
			r = efs_freemap_copy(&f->built, &g->committed);
		if (r == 0) {
			f->has_built = true;
			freed = efs_freemap_fold(&f->built, all.v, all.n, &dbl);
			if (freed < 0)
				r = (int)freed;
		}
		if (r == 0 && dbl.n) {
			uint64_t nd = efs_runs_total(&dbl);

			efs_log_err("alloc: DOUBLE FREE: free intents of group %" PRIu32
				    " free %" PRIu64 " blocks already free (first run %" PRIu64
				    "+%" PRIu64 "); not applied",
				    g->g, nd, dbl.v[0].start, dbl.v[0].len);
			a->double_frees += nd;
			if (a->c_double)
				efs_counter_add(a->c_double, nd);
		}
		efs_runs_done(&all);
		efs_runs_done(&dbl);
		if (r == 0)
			r = put_map(a, t, g->g, &f->built);
		if (r == 0) {
			r = send_txn(a, t, fold_txn_cb, 0, f);
			t = NULL;
		}
		efs_etcd_txn_free(t);
		if (r == 0)
			return;
		efs_log_warn("alloc: folding free intents of group %" PRIu32 ": %s", g->g,
			     strerror(-r));
		f->igrp++;
		f->from = 0;
	}
	fold_end(a, f);
}

static void fold_read_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
			 Etcdserverpb__TxnResponse *resp)
{
	struct fold *f = c->p;

	if (c->epoch != a->epoch || r->err < 0) {
		if (r->err < 0)
			efs_log_warn("alloc: reading free intents failed: %s", r->message);
		fold_end(a, f);
		return;
	}
	f->resp = resp;
	r->resp = NULL;
	for (size_t i = 0; i < f->ngrps; i++)
		a->groups[f->grps[i]].has_intents = false;
	fold_step(a, f);
}

/* Reads the intents of every owned group (and the n/ keys), then folds
 * what may be folded, group by group. The token is held. */
static void fold_all(struct efs_alloc *a, bool from_start)
{
	struct efs_meta_range rg;
	struct efs_etcd_txn *t = NULL;
	struct fold *f;
	int r;

	f = efs_mem_calloc(1, sizeof(*f));
	if (!f)
		goto nomem;
	f->from_start = from_start;
	a->fold_busy = true;
	a->fold = f;
	f->grps = efs_mem_malloc((a->ngroups ? a->ngroups : 1) * sizeof(uint32_t));
	if (!f->grps)
		goto nomem;
	for (uint32_t i = 0; i < a->ngroups && f->ngrps < EFS_ETCD_TXN_MAX_OPS - 2; i++)
		if (a->groups[i].owned)
			f->grps[f->ngrps++] = i;
	if (f->ngrps == 0 || !session_ok(a)) {
		fold_end(a, f);
		return;
	}
	r = efs_etcd_txn_new(&t, 0);
	for (size_t i = 0; r == 0 && i < f->ngrps; i++) {
		r = efs_meta_range_free_intents(&a->ns, f->grps[i], &rg);
		if (r == 0)
			r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
					       rg.end.buf, rg.end.len);
	}
	if (r == 0)
		r = efs_meta_range_family(&a->ns, EFS_META_K_NODE, &rg);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len, rg.end.buf,
				       rg.end.len);
	if (r == 0) {
		r = send_txn(a, t, fold_read_cb, 0, f);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r == 0)
		return;
	efs_log_warn("alloc: reading free intents: %s", strerror(-r));
	fold_end(a, f);
	return;
nomem:
	if (f)
		efs_mem_free(f);
	a->fold = NULL;
	a->fold_busy = false;
	if (from_start && a->starting)
		start_finish(a, 0);
	else
		token_release(a);
}

static void fold_token(struct efs_alloc *a, void *arg)
{
	(void)arg;
	fold_all(a, false);
}

/* A fold of every owned group, as soon as the token is free. */
static void fold_soon(struct efs_alloc *a)
{
	if (a->fold_busy) {
		a->fold_again = true;
		return;
	}
	if (!a->started || a->left || !session_ok(a))
		return;
	if (token_wait(a, fold_token, NULL) == 0)
		a->fold_busy = true;
}

/* ---- Own intents: drained marks ---- */

static void intent_drop(struct efs_alloc *a, struct intent *in)
{
	struct intent **pp = &a->intents;

	while (*pp && *pp != in)
		pp = &(*pp)->next;
	if (*pp)
		*pp = in->next;
	efs_runs_done(&in->runs);
	efs_mem_free(in);
}

static void drain_next(struct efs_alloc *a);

static void drain_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		     Etcdserverpb__TxnResponse *resp)
{
	struct intent *in;

	a->drain_busy = false;
	count_txn(a, r, resp);
	if (c->epoch != a->epoch)
		return;
	in = intent_find(a, c->u);
	if (r->err < 0) {
		efs_log_warn("alloc: marking a free intent drained failed: %s", r->message);
		return; /* the next tick retries */
	}
	if (in) {
		if (!resp->succeeded)
			efs_log_info("alloc: free intent of group %" PRIu32 " already gone",
				     in->group);
		intent_drop(a, in);
	}
	drain_next(a);
}

static void drain_next(struct efs_alloc *a)
{
	Etcfs__FreeIntent fi = ETCFS__FREE_INTENT__INIT;
	struct efs_etcd_txn *t = NULL;
	struct intent *in;
	int r;

	if (a->drain_busy || !session_ok(a))
		return;
	for (in = a->intents; in && !in->ready; in = in->next)
		;
	if (!in)
		return;
	r = efs_freemap_pb_runs(&in->runs, &fi.runs);
	fi.n_runs = in->runs.n;
	fi.drained = true;
	fi.ino = in->ino;
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_session_guard(a->s, t);
	if (r == 0 && in->mod_rev)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, in->key.buf,
					 in->key.len, in->mod_rev);
	else if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_VERSION, EFS_ETCD_CMP_GREATER,
					 in->key.buf, in->key.len, 0);
	if (r == 0)
		r = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &in->key, &fi.base, 0);
	efs_mem_free(fi.runs);
	if (r == 0) {
		r = send_txn(a, t, drain_cb, in->id, NULL);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r == 0)
		a->drain_busy = true;
}

static void tick_cb(uv_timer_t *t)
{
	struct efs_alloc *a = t->data;

	if (!a)
		return;
	grow_try(a);
	quar_release(a);
	drain_next(a);
	hold_probe(a);
	if (a->started && !a->fold_busy && session_ok(a)) {
		bool owned = false;

		for (uint32_t i = 0; i < a->ngroups && !owned; i++)
			owned = a->groups[i].owned;
		if (owned && token_wait(a, fold_token, NULL) == 0)
			a->fold_busy = true;
	}
	if (a->started && !a->starting && session_ok(a)) {
		orphan_probe(a);
		ho_watch_start(a); /* after a final update of the watcher */
		sb_watch_start(a);
		grow_try(a);
	}
	kick(a);
}

/* ---- Hand-over ---- */

/*
 * Free blocks of groups other live nodes own, as the last scan saw them:
 * what a hand-over request could bring.
 */
static uint64_t others_spare(const struct efs_alloc *a)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < a->ngroups; i++)
		if (!a->groups[i].owned && a->groups[i].other_owner)
			n += a->groups[i].seen_free;
	return n;
}

/* May this node ask now (something to ask for, not just refused)? */
static bool ho_could_ask(const struct efs_alloc *a)
{
	return a->ho_asking || (efs_clock_mono_ns() >= a->ho_quiet_until && others_spare(a) > 0);
}

/* Short of space itself: a node that waits for space gives none away. */
static bool is_short(const struct efs_alloc *a)
{
	return a->ho_asking || !efs_list_empty(&a->getw);
}

static void ho_call_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		       Etcdserverpb__TxnResponse *resp)
{
	count_txn(a, r, resp);
	if (r->err < 0 && c->epoch == a->epoch)
		efs_log_warn("alloc: %s the hand-over request failed: %s",
			     c->u ? "putting" : "deleting", r->message);
}

/* Puts (|want| > 0) or deletes (0) ho/<node> on our lease. */
static int ho_key_send(struct efs_alloc *a, uint64_t want)
{
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	char v[24];
	int r;

	r = efs_meta_key_handover(&a->ns, a->node, &k);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r < 0)
		return r;
	if (want) {
		snprintf(v, sizeof(v), "%" PRIu64, want);
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, v, strlen(v),
				     efs_session_lease_id(a->s));
	} else {
		r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0, false);
	}
	if (r < 0) {
		efs_etcd_txn_free(t);
		return r;
	}
	return send_txn(a, t, ho_call_cb, want ? 1 : 0, NULL);
}

static void ho_timer_cb(uv_timer_t *t)
{
	struct efs_alloc *a = t->data;

	if (!a)
		return;
	a->nofree_until = 0; /* a claim round: released groups are claimable */
	kick(a);
}

/* The request is answered, or no longer wanted: delete it. */
static void ho_stop(struct efs_alloc *a)
{
	if (!a->ho_asking)
		return;
	a->ho_asking = false;
	uv_timer_stop(a->ho_timer);
	if (session_ok(a) && ho_key_send(a, 0) < 0)
		efs_log_warn("alloc: could not delete the hand-over request (it goes with the "
			     "lease)");
}

/*
 * The head allocation waiter found no group to claim. Returns true while
 * it should wait for a hand-over (a request is out, before its deadline, or
 * was put now), false when the answer is ENOSPC.
 */
static bool ho_wait(struct efs_alloc *a, uint64_t want)
{
	uint64_t now = efs_clock_mono_ns();
	uint64_t poll;

	if (a->ho_asking) {
		if (now < a->ho_deadline)
			return true;
		efs_log_info("alloc: no owner handed a group over within %" PRIu64
			     " ms: the filesystem is full",
			     a->ho_wait_ns / 1000000);
		a->ho_quiet_until = now + a->ho_wait_ns;
		a->ho_start_ns = 0;
		ho_stop(a);
		return false;
	}
	if (a->left || a->leave_cb || !ho_could_ask(a))
		return false;
	if (ho_key_send(a, want) < 0)
		return false;
	efs_log_info("alloc: short of space (%" PRIu64 " blocks wanted, %" PRIu64
		     " free in other nodes' groups): asking for a hand-over",
		     want, others_spare(a));
	a->ho_asking = true;
	a->ho_start_ns = now;
	a->ho_deadline = now + a->ho_wait_ns;
	poll = a->ho_wait_ns / 1000000 / 4;
	if (poll > HO_POLL_MS)
		poll = HO_POLL_MS;
	uv_timer_start(a->ho_timer, ho_timer_cb, poll ? poll : 1, poll ? poll : 1);
	return true;
}

/*
 * Picks groups to hand over for |want| blocks, most free first, into
 * a->give_sel (marked giving): groups with no unpublished allocation, no
 * quarantined block (a read here may still use them) and free blocks.
 * While this node has allocations pending it keeps one group with free
 * space. Returns how many.
 */
static size_t give_pick(struct efs_alloc *a, uint64_t want)
{
	bool pending = false;
	size_t n = 0, withfree = 0;
	uint64_t got = 0;

	for (uint32_t i = 0; i < a->ngroups; i++) {
		const struct grp *g = &a->groups[i];

		if (!g->owned)
			continue;
		pending |= g->pending.n > 0;
		withfree += !g->stale && g->avail.nfree > 0;
	}
	while (n < BATCH_MAX / 3 && got < (want ? want : 1)) {
		struct grp *best = NULL;

		if (pending && withfree - n <= 1)
			break;
		for (uint32_t i = 0; i < a->ngroups; i++) {
			struct grp *g = &a->groups[i];

			if (!g->owned || g->stale || g->giving || g->pending.n || g->quar.n ||
			    !g->committed.nfree)
				continue;
			if (!best || g->committed.nfree > best->committed.nfree)
				best = g;
		}
		if (!best)
			break;
		best->giving = true;
		a->give_sel[n++] = best->g;
		got += best->committed.nfree;
	}
	return n;
}

static void give_end(struct efs_alloc *a)
{
	a->give_busy = false;
	token_release(a);
	update_gauges(a);
	give_soon(a);
}

static void give_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		    Etcdserverpb__TxnResponse *resp)
{
	bool ok = c->epoch == a->epoch && r->err == 0 && resp->succeeded;
	bool unknown = c->epoch == a->epoch && r->err < 0;

	count_txn(a, r, resp);
	for (size_t i = 0; i < c->u; i++) {
		struct grp *g = &a->groups[a->give_sel[i]];

		if (!g->owned)
			continue; /* the session was lost meanwhile */
		g->giving = false;
		if (ok) {
			efs_log_info("alloc: handed group %" PRIu32 " over (%" PRIu64
				     " free blocks)",
				     g->g, g->committed.nfree);
			a->others_free += g->committed.nfree;
			g->seen_free = g->committed.nfree;
			grp_forget(g);
			g->verdict = V_NOW;
			g->ownerless_ns = 0;
			a->given++;
			if (a->c_given)
				efs_counter_inc(a->c_given);
		} else if (unknown) {
			g->stale = true; /* the re-read tells whether it is still ours */
		}
	}
	if (r->err < 0 && c->epoch == a->epoch)
		efs_log_warn("alloc: handing groups over failed: %s", r->message);
	give_end(a);
}

/* Under the token: answers the oldest request, releasing groups. */
static void give_token(struct efs_alloc *a, void *arg)
{
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	struct horeq q;
	size_t n;
	int r;

	(void)arg;
	if (!a->ho_nq || !session_ok(a) || a->left || a->leave_cb || !a->started ||
	    is_short(a)) {
		a->ho_nq = 0;
		give_end(a);
		return;
	}
	q = a->ho_q[0];
	memmove(&a->ho_q[0], &a->ho_q[1], (a->ho_nq - 1) * sizeof(a->ho_q[0]));
	a->ho_nq--;
	n = give_pick(a, q.want);
	if (n == 0) {
		efs_log_debug("alloc: node %s asks for space; no group to spare", q.node);
		a->ho_nq = 0; /* the same answer for every other request */
		give_end(a);
		return;
	}
	/* The request must still be the one seen: a dead asker's vanished
	 * with its lease, and an answer of another owner deleted it. */
	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_session_guard(a->s, t);
	if (r == 0)
		r = efs_meta_key_handover(&a->ns, q.node, &k);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, k.buf, k.len,
					 q.mod_rev);
	if (r == 0)
		r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0, false);
	for (size_t i = 0; r == 0 && i < n; i++) {
		struct grp *g = &a->groups[a->give_sel[i]];

		r = owner_compares(a, t, g);
		if (r == 0)
			r = efs_meta_key_ag(&a->ns, g->g, EFS_META_K_AG_OWNER, &k);
		if (r == 0)
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
						false);
		/* Released: the asker (or anyone) may claim it at once. */
		if (r == 0)
			r = put_free(a, t, g->g, g->committed.nfree, true);
	}
	if (r == 0) {
		r = send_txn(a, t, give_cb, n, NULL);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r < 0) {
		for (size_t i = 0; i < n; i++)
			a->groups[a->give_sel[i]].giving = false;
		efs_log_warn("alloc: answering a hand-over request: %s", strerror(-r));
		give_end(a);
	}
}

static void give_soon(struct efs_alloc *a)
{
	if (a->give_busy || !a->ho_nq)
		return;
	if (is_short(a) || a->left || a->leave_cb) {
		a->ho_nq = 0;
		return;
	}
	if (token_wait(a, give_token, NULL) == 0)
		a->give_busy = true;
}

/* A request of another node (put): queued for an answer. */
static void ho_request(struct efs_alloc *a, const char *node, const Mvccpb__KeyValue *kv)
{
	char v[24];
	size_t len = kv->value.len < sizeof(v) - 1 ? kv->value.len : sizeof(v) - 1;
	size_t i;

	memcpy(v, kv->value.data, len);
	v[len] = 0;
	for (i = 0; i < a->ho_nq && strcmp(a->ho_q[i].node, node); i++)
		;
	if (i == HO_QUEUE)
		return; /* unanswered: the asker times out */
	if (i == a->ho_nq)
		a->ho_nq++;
	snprintf(a->ho_q[i].node, sizeof(a->ho_q[i].node), "%s", node);
	a->ho_q[i].want = strtoull(v, NULL, 10);
	a->ho_q[i].mod_rev = kv->mod_revision;
	give_soon(a);
}

static void ho_watch_cb(struct efs_etcd_watcher *w, int status,
			const struct efs_etcd_watch_update *u, void *arg)
{
	struct efs_alloc *a = arg;

	(void)status;
	if (u->kind == EFS_ETCD_WATCH_CANCELED || u->kind == EFS_ETCD_WATCH_COMPACTED) {
		/* Made again by the tick; requests put meanwhile time out. */
		a->ho_w = efs_etcd_watcher_free(w);
		return;
	}
	if (u->kind != EFS_ETCD_WATCH_EVENTS)
		return;
	for (size_t i = 0; i < u->n_events; i++) {
		const Mvccpb__Event *ev = u->events[i];
		struct efs_meta_key_info ki;

		if (!ev->kv || efs_meta_key_parse(&a->ns, ev->kv->key.data, ev->kv->key.len,
						  &ki) < 0 ||
		    ki.family != EFS_META_K_HANDOVER)
			continue;
		if (!strcmp(ki.node, a->node)) {
			/* Our request deleted by an owner's answer: claim now. The
			 * request is gone: another node may claim the answer's
			 * group first, and a claim round that finds nothing then
			 * puts a new request (with a new bound) instead of waiting
			 * out this one's, which no owner can answer any more. */
			if (ev->type == MVCCPB__EVENT__EVENT_TYPE__DELETE && a->ho_asking) {
				a->ho_asking = false;
				uv_timer_stop(a->ho_timer);
				a->nofree_until = 0;
				kick(a);
			}
		} else if (ev->type == MVCCPB__EVENT__EVENT_TYPE__PUT && a->started) {
			ho_request(a, ki.node, ev->kv);
		}
	}
}

/* One watcher on ho/ (no other watch of the node covers it). */
static void ho_watch_start(struct efs_alloc *a)
{
	struct efs_meta_range rg;
	struct efs_etcd_watch_opts o = {0};
	int r;

	if (a->ho_w || a->left || a->leave_cb)
		return;
	r = efs_meta_range_handovers(&a->ns, &rg);
	if (r == 0 && !a->ho_ws)
		r = efs_etcd_watch_stream_new(&a->ho_ws, a->c, EFS_ETCD_CH_BULK);
	if (r == 0) {
		o.key = rg.key.buf;
		o.key_len = rg.key.len;
		o.range_end = rg.end.buf;
		o.range_end_len = rg.end.len;
		r = efs_etcd_watcher_new(&a->ho_w, a->ho_ws, &o, ho_watch_cb, a);
	}
	if (r < 0)
		efs_log_warn("alloc: watching hand-over requests: %s (retried)", strerror(-r));
}

/* ---- Growth ---- */

/*
 * docs/DESIGN.md, "Online growth": etcfsctl grow writes the larger "sb"
 * record, the new groups' maps and the old last group's longer map in one
 * transaction. The node learns of it from a watch on "sb" (plus a read of
 * it whenever the watcher is made, for what a dead watcher missed) and
 * takes the new geometry only once its own view of the device is as large:
 * until then it leaves the new groups alone, says so in the log, and looks
 * again on every tick.
 */

int efs_alloc_device_bytes(int fd, uint64_t *ret)
{
	struct stat st;
	uint64_t n;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (S_ISBLK(st.st_mode)) {
		if (ioctl(fd, BLKGETSIZE64, &n) < 0)
			return -errno;
	} else if (S_ISREG(st.st_mode)) {
		n = (uint64_t)st.st_size;
	} else {
		return -ENOTBLK;
	}
	*ret = n;
	return 0;
}

void efs_alloc_geometry(const struct efs_alloc *a, uint64_t *ret_device_size,
			uint32_t *ret_ag_count)
{
	if (ret_device_size)
		*ret_device_size = a->device_size;
	if (ret_ag_count)
		*ret_ag_count = a->ngroups;
}

/* A value of "sb": remembers a larger geometry than ours, if it is one. */
static void sb_seen(struct efs_alloc *a, const Mvccpb__KeyValue *kv)
{
	Etcfs__FsInfo *fi = NULL;
	const char *why = NULL;
	uint64_t nblk;

	if (efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, &why) < 0) {
		efs_log_warn("alloc: the \"sb\" record cannot be decoded (%s), ignoring",
			     why ? why : "?");
		return;
	}
	nblk = fi->block_size ? fi->device_size / fi->block_size : 0;
	if (fi->block_size != a->block_size || fi->ag_blocks != a->ag_blocks ||
	    fi->data_start != a->data_start || nblk <= a->data_start) {
		efs_log_warn("alloc: the \"sb\" record changed its geometry beyond a growth, "
			     "ignoring");
	} else if (nblk - a->data_start > a->total_blocks && fi->device_size > a->grow_size &&
		   fi->device_size > a->device_size && fi->ag_count >= a->ngroups) {
		struct grp *last = &a->groups[a->ngroups - 1];

		a->grow_size = fi->device_size;
		a->grow_count = fi->ag_count;
		efs_log_info("alloc: the filesystem grew to %" PRIu64 " bytes (%" PRIu32
			     " groups)", a->grow_size, a->grow_count);
		/* A short last group of ours got a longer map in the same
		 * transaction: re-read it before the next map transaction,
		 * whether or not this node can take the new geometry yet. */
		if (last->owned && last->blocks < a->ag_blocks)
			last->stale = true;
		grow_try(a);
		kick(a);
	}
	/* The inode limit needs no device: it holds from the record on. */
	if (a->inode_limit)
		a->inode_limit(a->grown_arg, fi->inode_limit);
	efs_meta_record_free(fi);
}

static void sb_watch_cb(struct efs_etcd_watcher *w, int status,
			const struct efs_etcd_watch_update *u, void *arg)
{
	struct efs_alloc *a = arg;

	(void)status;
	if (u->kind == EFS_ETCD_WATCH_CANCELED || u->kind == EFS_ETCD_WATCH_COMPACTED) {
		a->sb_w = efs_etcd_watcher_free(w); /* made again (and "sb" read) by the tick */
		return;
	}
	if (u->kind != EFS_ETCD_WATCH_EVENTS)
		return;
	for (size_t i = 0; i < u->n_events; i++)
		if (u->events[i]->kv && u->events[i]->type == MVCCPB__EVENT__EVENT_TYPE__PUT)
			sb_seen(a, u->events[i]->kv);
}

static void sb_read_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		       Etcdserverpb__TxnResponse *resp)
{
	Etcdserverpb__RangeResponse *rr = NULL;

	(void)c;
	a->sb_reading = false;
	if (r->err < 0 || efs_etcd_txn_resp_range(resp, 0, &rr) < 0)
		return;
	if (rr->n_kvs == 1)
		sb_seen(a, rr->kvs[0]);
}

/* One watcher on "sb" (on the hand-over stream), and a read of "sb" each
 * time it is made. Only nodes that can check their device watch. */
static void sb_watch_start(struct efs_alloc *a)
{
	struct efs_etcd_watch_opts o = {0};
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	int r;

	if (a->sb_w || !a->dev_fd || a->left || a->leave_cb)
		return;
	r = efs_meta_key_sb(&a->ns, &k);
	if (r == 0 && !a->ho_ws)
		r = efs_etcd_watch_stream_new(&a->ho_ws, a->c, EFS_ETCD_CH_BULK);
	if (r == 0) {
		o.key = k.buf;
		o.key_len = k.len;
		r = efs_etcd_watcher_new(&a->sb_w, a->ho_ws, &o, sb_watch_cb, a);
	}
	if (r == 0 && !a->sb_reading) {
		r = efs_etcd_txn_new(&t, 0);
		if (r == 0)
			r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0);
		if (r == 0) {
			r = send_txn(a, t, sb_read_cb, 0, NULL);
			t = NULL;
		}
		efs_etcd_txn_free(t);
		if (r == 0)
			a->sb_reading = true;
	}
	if (r < 0)
		efs_log_warn("alloc: watching the \"sb\" record: %s (retried)", strerror(-r));
}

/* Work that holds arrays sized by the group table (a claim round's scan)
 * or the token (a map transaction being built from the groups). */
static bool groups_busy(const struct efs_alloc *a)
{
	return a->token || a->rereading || a->claim_busy || a->starting || !a->started;
}

/* Takes the geometry of "sb" once this node's device is as large. */
static void grow_try(struct efs_alloc *a)
{
	uint64_t dev = 0, nblk, old_last;
	uint32_t old_n = a->ngroups;
	struct grp *ng;
	int r;

	if (a->grow_size <= a->device_size || !a->dev_fd || a->left)
		return;
	r = efs_alloc_device_bytes(*a->dev_fd, &dev);
	if (r < 0 || dev < a->grow_size) {
		if (a->grow_warned != a->grow_size) {
			a->grow_warned = a->grow_size;
			if (r < 0)
				efs_log_warn("alloc: the filesystem grew to %" PRIu64
					     " bytes but this node cannot read its device's "
					     "size (%s): leaving the space past %" PRIu64
					     " bytes alone (groups %" PRIu32 "-%" PRIu32 ")",
					     a->grow_size, strerror(-r), a->device_size,
					     old_n - 1, a->grow_count - 1);
			else
				efs_log_warn("alloc: the filesystem grew to %" PRIu64
					     " bytes but this node's device has %" PRIu64
					     ": leaving groups %" PRIu32 "-%" PRIu32
					     " alone until it sees the new size",
					     a->grow_size, dev,
					     a->grow_count > old_n ? old_n : old_n - 1,
					     a->grow_count - 1);
		}
		return;
	}
	if (groups_busy(a))
		return; /* the next tick */
	ng = a->groups;
	if (a->grow_count > old_n) {
		ng = efs_mem_realloc(a->groups, (size_t)a->grow_count * sizeof(*ng));
		if (!ng) {
			efs_log_warn("alloc: out of memory taking the grown geometry (retried)");
			return;
		}
		a->groups = ng;
		memset(ng + old_n, 0, (size_t)(a->grow_count - old_n) * sizeof(*ng));
	}
	old_last = grp_blocks(a, old_n - 1);
	nblk = a->grow_size / a->block_size;
	a->ngroups = a->grow_count;
	a->total_blocks = nblk - a->data_start;
	a->device_size = a->grow_size;
	if (a->reserve_default)
		a->reserve = a->total_blocks / 100 > 64 ? a->total_blocks / 100 : 64;
	for (uint32_t i = old_n; i < a->ngroups; i++) {
		ng[i].g = i;
		ng[i].start = grp_start(a, i);
		ng[i].blocks = grp_blocks(a, i);
	}
	/* The old last group was short: grow wrote its longer map, which an
	 * owner re-reads before its next map transaction. */
	if (grp_blocks(a, old_n - 1) != old_last) {
		ng[old_n - 1].blocks = grp_blocks(a, old_n - 1);
		if (ng[old_n - 1].owned)
			ng[old_n - 1].stale = true;
	}
	a->nofree_until = 0;
	a->ho_quiet_until = 0;
	efs_log_info("alloc: the filesystem grew to %" PRIu64 " bytes (%" PRIu32
		     " groups, was %" PRIu32 "); this node's device has %" PRIu64
		     " bytes: allocating in the new groups",
		     a->device_size, a->ngroups, old_n, dev);
	if (a->grown)
		a->grown(a->grown_arg, a->device_size, a->ngroups);
	update_gauges(a);
	kick(a);
}

/* ---- Allocation ---- */

static uint64_t fs_free(const struct efs_alloc *a)
{
	uint64_t n = a->others_free;

	for (uint32_t i = 0; i < a->ngroups; i++) {
		const struct grp *g = &a->groups[i];
		uint64_t p;

		if (!g->owned)
			continue;
		p = efs_runs_total(&g->pending) + efs_runs_total(&g->held);
		n += g->committed.nfree > p ? g->committed.nfree - p : 0;
	}
	return n;
}

static int unpend_piece(void *arg, uint32_t gi, uint64_t rs, uint64_t rl)
{
	struct efs_alloc *a = arg;
	struct grp *g = &a->groups[gi];

	if (!g->owned)
		return 0;
	if (efs_runs_subtract(&g->pending, rs, rl, NULL) < 0)
		return -ENOMEM;
	g->dirty = true;
	return 0;
}

/* Undoes a partial allocation (its runs in |tmp|). */
static void alloc_rollback(struct efs_alloc *a, struct efs_runs *tmp)
{
	for (size_t i = 0; i < tmp->n; i++)
		if (split_runs(a, tmp->v[i].start, tmp->v[i].len, unpend_piece, a) < 0)
			efs_log_warn("alloc: out of memory undoing an allocation");
	for (uint32_t i = 0; i < a->ngroups; i++)
		if (a->groups[i].owned && a->groups[i].dirty)
			avail_recompute(&a->groups[i]);
}

/* 1: allocated; 0: not enough in owned groups; negative errno. */
static int try_alloc(struct efs_alloc *a, uint64_t want, uint64_t goal, unsigned flags,
		     struct efs_runs *out)
{
	struct efs_runs tmp = {0};
	uint64_t total = 0, left = want;
	uint32_t gstart = 0;
	int r = 0;

	if (flags & EFS_ALLOC_NEW) {
		uint64_t fr = fs_free(a);

		if (fr < want || fr - want < a->reserve)
			return -ENOSPC;
	}
	for (uint32_t i = 0; i < a->ngroups; i++)
		if (a->groups[i].owned && !a->groups[i].stale && !a->groups[i].giving)
			total += a->groups[i].avail.nfree;
	if (total < want)
		return 0;
	if (goal >= a->data_start && goal - a->data_start < a->total_blocks)
		gstart = (uint32_t)((goal - a->data_start) / a->ag_blocks);
	for (uint32_t k = 0; k < a->ngroups && left && r == 0; k++) {
		struct grp *g = &a->groups[(gstart + k) % a->ngroups];
		uint64_t gg = 0;

		if (!g->owned || g->stale || g->giving)
			continue;
		if (k == 0 && goal >= g->start && goal < g->start + g->blocks)
			gg = goal - g->start;
		while (left && g->avail.nfree && r == 0) {
			struct efs_run got;

			r = efs_freemap_alloc(&g->avail, left, gg, &got);
			if (r < 0)
				break;
			r = runs_add_norm(&g->pending, got.start, got.len);
			if (r == 0)
				r = efs_runs_add(&tmp, g->start + got.start, got.len);
			if (r < 0) {
				efs_freemap_put(&g->avail, got.start, got.len);
				efs_runs_subtract(&g->pending, got.start, got.len, NULL);
				break;
			}
			left -= got.len;
			gg = got.start + got.len;
		}
	}
	if (r == 0 && left)
		r = -ENOSPC; /* cannot happen: total covered it */
	if (r == 0)
		r = efs_runs_append(out, &tmp);
	if (r < 0) {
		alloc_rollback(a, &tmp);
		efs_runs_done(&tmp);
		return r == -ENOSPC ? 0 : r;
	}
	efs_runs_done(&tmp);
	update_gauges(a);
	return 1;
}

static void serve_getters(struct efs_alloc *a)
{
	while (!efs_list_empty(&a->getw)) {
		struct getw *w = efs_list_entry(efs_list_first(&a->getw), struct getw, link);
		int r;

		if (a->starting || a->claim_busy)
			return;
		if (!session_ok(a)) {
			r = -EIO;
		} else if (!a->started) {
			a->claim_need = a->groups_initial;
			claim_round(a);
			return;
		} else {
			r = try_alloc(a, w->want, w->goal, w->flags, w->out);
			if (r > 0 && a->ho_start_ns) {
				/* The first allocation a hand-over let through. */
				efs_histogram_observe_ns(a->h_ho_wait,
							 efs_clock_mono_ns() - a->ho_start_ns);
				a->ho_start_ns = 0;
			}
			if (r == 0) {
				if (efs_clock_mono_ns() >= a->nofree_until) {
					a->claim_need = 1;
					claim_round(a);
					return;
				}
				if (ho_wait(a, w->want))
					return;
				r = -ENOSPC;
			}
		}
		efs_list_del(&w->link);
		w->cb(r > 0 ? 0 : r, w->arg);
		efs_mem_free(w);
	}
	ho_stop(a); /* nobody waits any more */
	give_soon(a);
}

int efs_alloc_get(struct efs_alloc *a, uint64_t want, uint64_t goal, unsigned flags,
		  struct efs_runs *out, void (*cb)(int status, void *arg), void *arg)
{
	struct getw *w;
	int r;

	if (a->left || !session_ok(a))
		return -EIO;
	if (want == 0)
		return 1;
	if (a->started && efs_list_empty(&a->getw)) {
		r = try_alloc(a, want, goal, flags, out);
		if (r != 0)
			return r;
		if (efs_clock_mono_ns() < a->nofree_until && !ho_could_ask(a))
			return -ENOSPC;
	}
	w = efs_mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->want = want;
	w->goal = goal;
	w->flags = flags;
	w->out = out;
	w->cb = cb;
	w->arg = arg;
	efs_list_add_tail(&a->getw, &w->link);
	kick(a);
	return 0;
}

static int unuse_piece(void *arg, uint32_t gi, uint64_t rs, uint64_t rl)
{
	struct efs_alloc *a = arg;
	struct grp *g = &a->groups[gi];
	struct efs_runs cut = {0};
	int r;

	if (!g->owned)
		return 0;
	r = efs_runs_subtract(&g->pending, rs, rl, &cut);
	for (size_t i = 0; r == 0 && i < cut.n; i++) {
		r = efs_quar_add(a->q, gi, cut.v[i].start, cut.v[i].len);
		if (r == 0)
			r = runs_add_norm(&g->quar, cut.v[i].start, cut.v[i].len);
	}
	if (r == 0 && efs_runs_total(&cut) != rl)
		efs_log_warn("alloc: unuse of blocks of group %" PRIu32 " never allocated", gi);
	efs_runs_done(&cut);
	g->dirty = true;
	return r;
}

void efs_alloc_unuse(struct efs_alloc *a, const struct efs_runs *runs)
{
	for (size_t i = 0; i < runs->n; i++)
		if (split_runs(a, runs->v[i].start, runs->v[i].len, unuse_piece, a) < 0)
			efs_log_warn("alloc: giving back %" PRIu64 "+%" PRIu64 " failed",
				     runs->v[i].start, runs->v[i].len);
	for (uint32_t i = 0; i < a->ngroups; i++)
		if (a->groups[i].owned && a->groups[i].dirty)
			avail_recompute(&a->groups[i]);
	quar_release(a);
	update_gauges(a);
}

/* ---- Map transactions ---- */

static void begin_token(struct efs_alloc *a, void *arg)
{
	struct efs_alloc_txn *t = arg;

	a->token = t;
	t->epoch = a->epoch;
	t->cb(0, t->arg);
}

int efs_alloc_txn_begin(struct efs_alloc *a, struct efs_alloc_txn **ret,
			void (*cb)(int status, void *arg), void *arg)
{
	struct efs_alloc_txn *t;
	int r;

	t = efs_mem_calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->a = a;
	t->epoch = a->epoch;
	t->hold = -1;
	t->cb = cb;
	t->arg = arg;
	*ret = t;
	if (!a->token && efs_list_empty(&a->tokw) && !a->starting && !any_stale(a)) {
		a->token = t;
		return 1;
	}
	r = token_wait(a, begin_token, t);
	if (r < 0) {
		efs_mem_free(t);
		*ret = NULL;
		return r;
	}
	return 0;
}

static struct tgrp *tgrp_get(struct efs_alloc_txn *t, uint32_t g)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].g == g)
			return &t->v[i];
	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 4;
		struct tgrp *v = efs_mem_realloc(t->v, nc * sizeof(*v));

		if (!v)
			return NULL;
		t->v = v;
		t->cap = nc;
	}
	memset(&t->v[t->n], 0, sizeof(t->v[0]));
	t->v[t->n].g = g;
	return &t->v[t->n++];
}

/* True when [s, s + l) lies inside one run of normalized |r|. */
static bool runs_contain(const struct efs_runs *r, uint64_t s, uint64_t l)
{
	size_t lo = 0, hi = r->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (r->v[mid].start + r->v[mid].len <= s)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < r->n && r->v[lo].start <= s && s + l <= r->v[lo].start + r->v[lo].len;
}

static int use_piece(void *arg, uint32_t gi, uint64_t rs, uint64_t rl)
{
	struct efs_alloc_txn *t = arg;
	struct grp *g = &t->a->groups[gi];
	struct tgrp *tg;

	if (!g->owned || !runs_contain(&g->pending, rs, rl))
		return -EINVAL;
	tg = tgrp_get(t, gi);
	if (!tg)
		return -ENOMEM;
	return efs_runs_add(&tg->use, rs, rl);
}

int efs_alloc_txn_use(struct efs_alloc_txn *t, const struct efs_runs *runs)
{
	for (size_t i = 0; i < runs->n; i++) {
		int r = split_runs(t->a, runs->v[i].start, runs->v[i].len, use_piece, t);

		if (r < 0)
			return r;
	}
	return 0;
}

static int free_piece(void *arg, uint32_t gi, uint64_t rs, uint64_t rl)
{
	struct efs_alloc_txn *t = arg;
	struct tgrp *tg = tgrp_get(t, gi);

	if (!tg)
		return -ENOMEM;
	return efs_runs_add(&tg->fre, rs, rl);
}

int efs_alloc_txn_free(struct efs_alloc_txn *t, const struct efs_runs *runs, uint64_t ino)
{
	if (ino)
		t->ino = ino;
	for (size_t i = 0; i < runs->n; i++) {
		int r = split_runs(t->a, runs->v[i].start, runs->v[i].len, free_piece, t);

		if (r == -EINVAL) {
			efs_log_err("alloc: inode %" PRIu64 " frees blocks %" PRIu64 "+%" PRIu64
				    " outside the data area",
				    ino, runs->v[i].start, runs->v[i].len);
			return -EUCLEAN;
		}
		if (r < 0)
			return r;
	}
	return 0;
}

size_t efs_alloc_txn_nops(const struct efs_alloc_txn *t)
{
	size_t n = 0;

	for (size_t i = 0; i < t->n; i++) {
		const struct tgrp *tg = &t->v[i];

		if (t->a->groups[tg->g].owned && (tg->use.n || tg->fre.n))
			n += 4; /* 2 compares, 2 puts */
		else if (tg->fre.n)
			n += 2; /* compare, put */
	}
	if (!n)
		return 0;
	n++; /* the read of pin/backup. */
	for (size_t i = 0; i < t->n && t->a->dh_fn; i++)
		if (t->v[i].fre.n)
			return n + 2; /* the reads of n/ and g/ (the death hold) */
	return n;
}

/* Takes the blocks of |s|+|l| that are still free in |fm| (uses already
 * applied by a commit whose outcome was unknown are no-ops). */
static int take_use(struct efs_freemap *fm, uint64_t s, uint64_t l)
{
	struct efs_runs part = {0};
	int r = 0;

	if (efs_freemap_all_free(fm, s, l))
		return efs_freemap_take(fm, s, l);
	if (!efs_freemap_any_free(fm, s, l))
		return 0;
	for (size_t i = 0; i < fm->free.n && r == 0; i++) {
		uint64_t a0 = fm->free.v[i].start, a1 = a0 + fm->free.v[i].len;
		uint64_t b0 = a0 > s ? a0 : s, b1 = a1 < s + l ? a1 : s + l;

		if (b0 < b1)
			r = efs_runs_add(&part, b0, b1 - b0);
	}
	for (size_t i = 0; i < part.n && r == 0; i++)
		r = efs_freemap_take(fm, part.v[i].start, part.v[i].len);
	efs_runs_done(&part);
	return r;
}

static int build_owned(struct efs_alloc_txn *t, struct tgrp *tg, struct grp *g,
		       struct efs_etcd_txn *txn)
{
	struct efs_alloc *a = t->a;
	struct efs_freemap fm;
	int r;

	r = efs_runs_normalize(&tg->fre);
	if (r == -EUCLEAN) {
		efs_log_err("alloc: DOUBLE FREE: inode %" PRIu64 " frees blocks of group %" PRIu32
			    " twice in one transaction",
			    t->ino, g->g);
		return r;
	}
	if (r == 0)
		r = efs_runs_normalize(&tg->use);
	if (r < 0)
		return r;
	r = efs_freemap_copy(&fm, &g->committed);
	if (r < 0)
		return r;
	for (size_t i = 0; r == 0 && i < tg->use.n; i++)
		r = take_use(&fm, tg->use.v[i].start, tg->use.v[i].len);
	for (size_t i = 0; r == 0 && i < tg->fre.n; i++) {
		r = efs_freemap_put(&fm, tg->fre.v[i].start, tg->fre.v[i].len);
		if (r == -EUCLEAN) {
			efs_log_err("alloc: DOUBLE FREE: inode %" PRIu64 " frees blocks %" PRIu64
				    "+%" PRIu64 " (group %" PRIu32 " relative %" PRIu64
				    ") that are already free; transaction refused",
				    t->ino, g->start + tg->fre.v[i].start, tg->fre.v[i].len, g->g,
				    tg->fre.v[i].start);
			a->double_frees += tg->fre.v[i].len;
			if (a->c_double)
				efs_counter_add(a->c_double, tg->fre.v[i].len);
		}
	}
	if (r == 0)
		r = owner_compares(a, txn, g);
	if (r == 0)
		r = put_map(a, txn, g->g, &fm);
	if (r < 0) {
		efs_freemap_done(&fm);
		return r;
	}
	if (tg->has_built)
		efs_freemap_done(&tg->built);
	tg->built = fm;
	tg->has_built = true;
	tg->as_owner = true;
	return 0;
}

static int build_intent(struct efs_alloc_txn *t, struct tgrp *tg, struct efs_etcd_txn *txn)
{
	struct efs_alloc *a = t->a;
	Etcfs__FreeIntent fi = ETCFS__FREE_INTENT__INIT;
	int r;

	r = efs_runs_normalize(&tg->fre);
	if (r < 0)
		return r;
	if (!tg->seq)
		tg->seq = ++a->intent_seq;
	r = efs_freemap_pb_runs(&tg->fre, &fi.runs);
	fi.n_runs = tg->fre.n;
	fi.ino = t->ino;
	if (r == 0) {
		struct efs_meta_key k;

		r = efs_meta_key_free_intent(&a->ns, tg->g, a->node, efs_session_generation(a->s),
					     tg->seq, &k);
		if (r == 0)
			r = efs_etcd_txn_compare(txn, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL,
						 k.buf, k.len, 0);
		if (r == 0)
			r = efs_meta_txn_put(txn, EFS_ETCD_TXN_SUCCESS, &k, &fi.base, 0);
	}
	efs_mem_free(fi.runs);
	if (r == 0)
		tg->as_owner = false;
	return r;
}

static uint64_t grace_groups_until(const struct efs_alloc *a, uint64_t now)
{
	uint64_t until = 0;

	for (uint32_t i = 0; i < a->ngroups; i++) {
		const struct grp *g = &a->groups[i];

		if (!g->owned && g->verdict == V_GRACE && g->ownerless_ns &&
		    g->ownerless_ns + a->grace_ns > now && g->ownerless_ns + a->grace_ns > until)
			until = g->ownerless_ns + a->grace_ns;
	}
	return until;
}

/* The death hold's answer for frees committed at |rev| (|nodes| and
 * |gens|: n/ and g/ read by that transaction, or NULL; |groups|:
 * grace_groups_until now): 0 when they may go to the quarantine now,
 * else when to ask again. */
static uint64_t dh_ask(struct efs_alloc *a, int64_t rev, const Etcdserverpb__RangeResponse *nodes,
		       const Etcdserverpb__RangeResponse *gens, uint64_t groups, uint64_t now)
{
	uint64_t u = a->dh_fn ? a->dh_fn(a->dh_arg, rev, nodes, gens) : 0;

	if (groups > u)
		u = groups;
	return u > now ? u : 0;
}

/* For the death hold of a transaction that frees: reads of n/ and g/
 * (keys only) in its success branch, so that its response tells whether
 * a session ended since the death tracker last knew (no round trip more). */
static int dh_reads(struct efs_alloc_txn *t, struct efs_etcd_txn *txn)
{
	struct efs_alloc *a = t->a;
	struct efs_meta_range rn, rg;
	size_t idx = efs_etcd_txn_request(txn)->n_success;
	bool frees = false;
	int r;

	for (size_t i = 0; i < t->n; i++)
		frees |= t->v[i].fre.n > 0;
	if (!a->dh_fn || !frees)
		return 0;
	r = efs_meta_range_family(&a->ns, EFS_META_K_NODE, &rn);
	if (r == 0)
		r = efs_meta_range_family(&a->ns, EFS_META_K_GEN, &rg);
	if (r == 0)
		r = efs_etcd_txn_range(txn, EFS_ETCD_TXN_SUCCESS, rn.key.buf, rn.key.len,
				       rn.end.buf, rn.end.len);
	if (r == 0)
		r = efs_etcd_txn_range(txn, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
				       rg.end.buf, rg.end.len);
	if (r < 0)
		return r;
	t->dh_asked = true;
	t->dh_idx = idx;
	return 0;
}

int efs_alloc_txn_build(struct efs_alloc_txn *t, struct efs_etcd_txn *txn)
{
	struct efs_alloc *a = t->a;
	bool any = false;
	int r;

	if (t->epoch != a->epoch)
		return -EIO;
	t->hold_asked = false;
	t->hold = -1;
	t->dh_asked = t->dh_known = false;
	for (size_t i = 0; i < t->n; i++) {
		struct tgrp *tg = &t->v[i];
		struct grp *g = &a->groups[tg->g];

		r = 0;
		if (!g->owned && tg->use.n) {
			/* Its ownership went (a lost session): publishing extents
			 * in it cannot be made safe. */
			efs_log_warn("alloc: group %" PRIu32
				     " is no longer ours: publication refused",
				     g->g);
			return -EIO;
		}
		any |= tg->use.n || tg->fre.n;
		if (g->owned && (tg->use.n || tg->fre.n))
			r = build_owned(t, tg, g, txn);
		else if (tg->fre.n)
			r = build_intent(t, tg, txn);
		if (r < 0)
			return r;
	}
	if (!any)
		return 0;
	r = hold_read(a, txn, &t->hold_idx);
	if (r == -E2BIG)
		return 0; /* no room: its frees are held as if it saw a pin */
	if (r < 0)
		return r;
	t->hold_asked = true;
	t->hold_gen = a->held_gen;
	r = dh_reads(t, txn);
	return r == -E2BIG ? 0 : r; /* no room: the hold asks after the commit */
}

void efs_alloc_txn_result(struct efs_alloc_txn *t, const Etcdserverpb__TxnResponse *resp)
{
	Etcdserverpb__RangeResponse *nodes = NULL, *gens = NULL;
	struct efs_alloc *a;
	uint64_t now;

	if (!t)
		return;
	a = t->a;
	if (t->hold_asked)
		t->hold = hold_in(resp, t->hold_idx);
	if (!t->dh_asked || !resp || !resp->succeeded || !resp->header || !a->dh_fn ||
	    efs_etcd_txn_resp_range(resp, t->dh_idx, &nodes) < 0 ||
	    efs_etcd_txn_resp_range(resp, t->dh_idx + 1, &gens) < 0)
		return;
	now = efs_clock_mono_ns();
	t->dh_until = dh_ask(a, resp->header->revision, nodes, gens, grace_groups_until(a, now), now);
	t->dh_known = true;
}

static void txn_free(struct efs_alloc_txn *t)
{
	struct efs_alloc *a = t->a;

	for (size_t i = 0; i < t->n; i++) {
		efs_runs_done(&t->v[i].use);
		efs_runs_done(&t->v[i].fre);
		if (t->v[i].has_built)
			efs_freemap_done(&t->v[i].built);
	}
	efs_mem_free(t->v);
	if (a->token == t)
		token_release(a);
	efs_mem_free(t);
}

/* ---- The death hold ---- */

/*
 * A node whose session ended may still land an in-place write it queued
 * before its deadline, for the grace period: a block a survivor frees in
 * that time (a copy-on-write rewrite, a truncate, a reclaim of the file
 * the dead node wrote) must not be handed to another file before the
 * grace ends. So the blocks a committed transaction frees (and the
 * drained mark of the free intents it makes) reach the quarantine only
 * once the hold says so: the fs layer's |dh_fn| (the lock cache's death
 * tracker: any grace running since a death before the commit) and the
 * groups this node saw ownerless and waiting out their grace (a death
 * before this node started, which the tracker never saw).
 */

static void dh_timer_cb(uv_timer_t *t);

/* Hands what the hold lets go to the quarantine; arms the timer for the
 * rest. */
static void dh_run(struct efs_alloc *a)
{
	uint64_t now = efs_clock_mono_ns(), next = 0, groups = 0;
	bool any = false;
	size_t k = 0;

	if (a->ndh)
		groups = grace_groups_until(a, now); /* once: the groups' part is the same for all */

	for (size_t i = 0; i < a->ndh; i++) {
		struct dheld e = a->dh[i];

		if (e.ask_ns <= now) {
			uint64_t u = dh_ask(a, e.rev, NULL, NULL, groups, now);

			if (u == 0) {
				if (efs_quar_add(a->q, e.group, e.start, e.len) == 0) {
					a->dh_blocks -= e.blocks;
					any = true;
					continue;
				}
				u = now + RESCAN_NS; /* out of memory: later */
			}
			e.ask_ns = u;
		}
		if (!next || e.ask_ns < next)
			next = e.ask_ns;
		a->dh[k++] = e;
	}
	a->ndh = k;
	if (next)
		uv_timer_start(a->dh_timer, dh_timer_cb, (next - now) / 1000000u + 1, 0);
	else
		uv_timer_stop(a->dh_timer);
	if (any)
		quar_release(a);
}

static void dh_timer_cb(uv_timer_t *t)
{
	struct efs_alloc *a = t->data;

	if (a) {
		dh_run(a);
		update_gauges(a);
	}
}

/* Whether the death hold keeps blocks of group |g|: at a clean leave
 * the group is then not marked released, so that it waits out the grace
 * for whoever claims it. */
static bool dh_in_group(const struct efs_alloc *a, uint32_t g)
{
	for (size_t i = 0; i < a->ndh; i++)
		if (a->dh[i].group == g)
			return true;
	return false;
}

/* Freed by |t| (committed at |rev|): to the quarantine at once when its
 * response showed no grace running, else through the death hold. |blocks|:
 * the blocks it frees (an intent's [start, start + len) is its id). */
static int free_add(struct efs_alloc_txn *t, uint32_t group, uint64_t start, uint64_t len,
		    uint64_t blocks, int64_t rev)
{
	struct efs_alloc *a = t->a;

	if (t->dh_known && t->dh_until == 0)
		return efs_quar_add(a->q, group, start, len);
	if (efs_mem_reserve(&a->dh, &a->capdh, a->ndh + 1, sizeof(*a->dh)) < 0)
		return -ENOMEM;
	if (a->c_dh_waits)
		efs_counter_inc(a->c_dh_waits);
	a->dh[a->ndh++] =
		(struct dheld){group, start, len, blocks, rev, t->dh_known ? t->dh_until : 0};
	a->dh_blocks += blocks;
	return 0;
}

void efs_alloc_set_death_hold(struct efs_alloc *a, efs_alloc_hold_fn fn, void *arg)
{
	a->dh_fn = fn;
	a->dh_arg = arg;
	dh_run(a);
}

static void commit_group(struct efs_alloc_txn *t, struct tgrp *tg, int64_t rev)
{
	struct efs_alloc *a = t->a;
	struct grp *g = &a->groups[tg->g];
	int r = 0;

	if (tg->as_owner) {
		if (!g->owned)
			return;
		if (t->unknown || !tg->has_built) {
			g->stale = true;
		} else {
			efs_freemap_done(&g->committed);
			g->committed = tg->built;
			tg->has_built = false;
			g->map_rev = rev;
		}
		for (size_t i = 0; i < tg->use.n; i++)
			efs_runs_subtract(&g->pending, tg->use.v[i].start, tg->use.v[i].len, NULL);
		for (size_t i = 0; r == 0 && i < tg->fre.n; i++) {
			r = free_add(t, tg->g, tg->fre.v[i].start, tg->fre.v[i].len,
				     tg->fre.v[i].len, rev);
			if (r == 0)
				r = runs_add_norm(&g->quar, tg->fre.v[i].start, tg->fre.v[i].len);
			if (r == 0 && t->hold != 0)
				hold_add(a, g, tg->fre.v[i].start, tg->fre.v[i].len);
		}
		if (r == 0)
			r = avail_recompute(g);
	} else if (tg->fre.n) {
		struct intent *in = efs_mem_calloc(1, sizeof(*in));

		r = in ? 0 : -ENOMEM;
		if (r == 0)
			r = efs_meta_key_free_intent(&a->ns, tg->g, a->node,
						     efs_session_generation(a->s), tg->seq,
						     &in->key);
		if (r == 0)
			r = efs_runs_append(&in->runs, &tg->fre);
		if (r == 0) {
			in->id = ++a->intent_id;
			r = free_add(t, INTENT_GROUP, in->id, 1, efs_runs_total(&in->runs), rev);
		}
		if (r < 0) {
			if (in)
				efs_runs_done(&in->runs);
			efs_mem_free(in);
		} else {
			in->group = tg->g;
			in->ino = t->ino;
			in->mod_rev = t->unknown ? 0 : rev;
			in->next = a->intents;
			a->intents = in;
			if (!g->other_owner)
				a->probe_want = true; /* nobody may own it: claim it */
		}
	}
	if (r < 0)
		efs_log_warn("alloc: bookkeeping after a commit in group %" PRIu32 ": %s", tg->g,
			     strerror(-r));
}

void efs_alloc_txn_end(struct efs_alloc_txn *t, enum efs_alloc_outcome oc, int64_t rev)
{
	struct efs_alloc *a = t->a;

	if (t->epoch != a->epoch) {
		txn_free(t); /* the session was lost: nothing of it is kept */
		return;
	}
	switch (oc) {
	case EFS_ALLOC_UNKNOWN:
		t->unknown = true;
		for (size_t i = 0; i < t->n; i++)
			if (t->v[i].as_owner && a->groups[t->v[i].g].owned)
				a->groups[t->v[i].g].stale = true;
		return;
	case EFS_ALLOC_FAILED:
		break;
	case EFS_ALLOC_COMMITTED:
		/* First: what it freed itself is not older than its read. */
		if (t->hold == 0)
			hold_release(a, t->hold_gen);
		for (size_t i = 0; i < t->n; i++)
			commit_group(t, &t->v[i], t->unknown ? 0 : rev);
		break;
	}
	txn_free(t);
	dh_run(a);
	quar_release(a);
	update_gauges(a);
	if (a->probe_want)
		orphan_probe(a);
}

/* ---- Figures ---- */

void efs_alloc_get_stats(const struct efs_alloc *a, struct efs_alloc_stats *ret)
{
	memset(ret, 0, sizeof(*ret));
	for (uint32_t i = 0; i < a->ngroups; i++) {
		const struct grp *g = &a->groups[i];

		if (!g->owned)
			continue;
		ret->groups_owned++;
		ret->avail_blocks += g->avail.nfree;
		ret->pending_blocks += efs_runs_total(&g->pending);
		ret->quarantine_blocks += efs_runs_total(&g->quar);
		ret->held_blocks += efs_runs_total(&g->held);
	}
	for (const struct intent *in = a->intents; in; in = in->next)
		if (!in->ready)
			ret->quarantine_blocks += efs_runs_total(&in->runs);
	ret->death_held_blocks = a->dh_blocks;
	ret->reserve_blocks = a->reserve;
	ret->double_frees = a->double_frees;
	ret->grace_blocks = a->grace_blocks;
	ret->groups_given = a->given;
}

/* ---- Leave, loss, free ---- */

static void leave_step(struct efs_alloc *a);

static void leave_end(struct efs_alloc *a, int err)
{
	void (*cb)(int, void *) = a->leave_cb;

	a->leave_cb = NULL;
	a->left = true;
	uv_timer_stop(a->tick);
	ho_stop(a);
	a->ho_w = efs_etcd_watcher_free(a->ho_w);
	a->sb_w = efs_etcd_watcher_free(a->sb_w);
	a->ho_nq = 0;
	token_release(a);
	fail_getters(a, -EIO);
	update_gauges(a);
	if (cb)
		cb(err, a->leave_arg);
}

static void leave_cb(struct efs_alloc *a, struct acall *c, struct efs_etcd_result *r,
		     Etcdserverpb__TxnResponse *resp)
{
	count_txn(a, r, resp);
	if (c->epoch != a->epoch) {
		leave_end(a, 0); /* the lease and its owner keys are gone */
		return;
	}
	if (r->err < 0) {
		leave_end(a, -EIO);
		return;
	}
	if (!resp->succeeded) {
		leave_end(a, -EIO);
		return;
	}
	/* leave_step deleted the first c->u owned groups. */
	for (uint32_t i = 0, n = 0; i < a->ngroups && n < c->u; i++) {
		if (a->groups[i].owned) {
			grp_forget(&a->groups[i]);
			n++;
		}
	}
	leave_step(a);
}

static void leave_step(struct efs_alloc *a)
{
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key k;
	size_t n = 0;
	int r;

	/* Every owned group is dropped from memory at once; stale flags are
	 * irrelevant to a delete compared on our lease. */
	for (uint32_t i = 0; i < a->ngroups; i++) {
		a->groups[i].unsure |= a->groups[i].stale;
		a->groups[i].stale = false;
	}
	if (!session_ok(a)) {
		leave_end(a, -EIO);
		return;
	}
	r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_session_guard(a->s, t);
	/* The owner key goes with the mark that the group was handed back, in
	 * one transaction: a group without an owner key is claimable at once
	 * exactly when its last owner released it. */
	for (uint32_t i = 0; r == 0 && i < a->ngroups && n < BATCH_MAX / 2; i++) {
		if (!a->groups[i].owned)
			continue;
		r = efs_meta_key_ag(&a->ns, i, EFS_META_K_AG_OWNER, &k);
		if (r == 0)
			r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_LEASE, EFS_ETCD_CMP_EQUAL, k.buf,
						 k.len, efs_session_lease_id(a->s));
		if (r == 0)
			r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, k.buf, k.len, NULL, 0,
						false);
		/* A group whose map we may not know (an unknown outcome not
		 * re-read) is left unreleased rather than given a wrong count:
		 * it then waits out the grace, as does one whose freed
		 * blocks the death hold keeps. */
		if (r == 0 && !a->groups[i].unsure && !dh_in_group(a, i))
			r = put_free(a, t, i, a->groups[i].committed.nfree, true);
		n++;
	}
	if (r == 0 && n == 0) {
		efs_etcd_txn_free(t);
		leave_end(a, 0);
		return;
	}
	if (r == 0) {
		r = send_txn(a, t, leave_cb, n, NULL);
		t = NULL;
	}
	efs_etcd_txn_free(t);
	if (r < 0)
		leave_end(a, r);
}

static void leave_token(struct efs_alloc *a, void *arg)
{
	(void)arg;
	leave_step(a);
}

int efs_alloc_leave(struct efs_alloc *a, void (*cb)(int status, void *arg), void *arg)
{
	bool owned = false;
	int r;

	if (a->left || a->leave_cb)
		return -EALREADY;
	for (uint32_t i = 0; i < a->ngroups && !owned; i++)
		owned = a->groups[i].owned;
	if (!owned && !a->token && efs_list_empty(&a->tokw) && !a->starting) {
		a->left = true;
		uv_timer_stop(a->tick);
		ho_stop(a);
		a->ho_w = efs_etcd_watcher_free(a->ho_w);
		a->ho_nq = 0;
		fail_getters(a, -EIO);
		return 1;
	}
	r = token_wait(a, leave_token, NULL);
	if (r < 0)
		return r;
	a->leave_cb = cb;
	a->leave_arg = arg;
	return 0;
}

void efs_alloc_session_lost(struct efs_alloc *a)
{
	a->epoch++;
	/* The groups and intents go: what the death hold kept goes too (the
	 * groups wait out the grace for whoever claims them, the intents
	 * stay undrained). */
	a->ndh = 0;
	a->dh_blocks = 0;
	uv_timer_stop(a->dh_timer);
	for (uint32_t i = 0; i < a->ngroups; i++)
		grp_forget(&a->groups[i]);
	while (a->intents)
		intent_drop(a, a->intents);
	a->started = false;
	a->nofree_until = 0;
	a->ho_asking = false; /* the request went with the lease */
	uv_timer_stop(a->ho_timer);
	a->ho_nq = 0;
	if (a->sw_queued) {
		efs_session_wait_cancel(a->s, &a->sw);
		a->sw_queued = false;
		a->claim_busy = false;
	}
	uv_timer_stop(a->tick);
	if (a->claim_has_token && !a->claim_busy) {
		a->claim_has_token = false;
		token_release(a);
	}
	if (a->starting) {
		/* Whatever holds the token (the start's claim round or fold)
		 * releases it when its call returns (epoch changed). */
		void (*cb)(int, void *) = a->start_cb;

		a->starting = false;
		a->start_cb = NULL;
		if (cb)
			cb(-EIO, a->start_arg);
	}
	fail_getters(a, -EIO);
	update_gauges(a);
	kick(a); /* token waiters held back by stale groups may go now */
}

struct efs_alloc *efs_alloc_free(struct efs_alloc *a)
{
	struct efs_list *n;

	if (!a)
		return NULL;
	/* Calls in flight are let go: their callbacks only free themselves. */
	while ((n = efs_list_pop(&a->calls)))
		efs_list_entry(n, struct acall, link)->a = NULL;
	if (a->fold)
		fold_free(a->fold);
	if (a->sw_queued)
		efs_session_wait_cancel(a->s, &a->sw);
	a->kick = efs_timer_free(a->kick);
	a->tick = efs_timer_free(a->tick);
	a->ho_timer = efs_timer_free(a->ho_timer);
	a->dh_timer = efs_timer_free(a->dh_timer);
	efs_mem_free(a->dh);
	a->ho_w = efs_etcd_watcher_free(a->ho_w);
	a->sb_w = efs_etcd_watcher_free(a->sb_w);
	a->ho_ws = efs_etcd_watch_stream_free(a->ho_ws);
	efs_mem_free(a->give_sel);
	while (a->tokw.next && !efs_list_empty(&a->tokw)) {
		struct tokw *w = efs_list_entry(efs_list_pop(&a->tokw), struct tokw, link);

		if (w->fn == begin_token)
			efs_mem_free(w->arg);
		efs_mem_free(w);
	}
	while (a->getw.next && !efs_list_empty(&a->getw)) {
		struct getw *w = efs_list_entry(efs_list_pop(&a->getw), struct getw, link);

		efs_mem_free(w);
	}
	scan_free(a);
	while (a->intents)
		intent_drop(a, a->intents);
	while (a->dead) {
		struct deadsess *d = a->dead;

		a->dead = d->next;
		efs_mem_free(d);
	}
	if (a->groups)
		for (uint32_t i = 0; i < a->ngroups; i++)
			grp_forget(&a->groups[i]);
	efs_mem_free(a->groups);
	a->q = efs_quar_free(a->q);
	efs_mem_free(a);
	return NULL;
}
