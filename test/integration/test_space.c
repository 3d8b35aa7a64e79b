/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Space against a real etcd. The allocator alone (fs/alloc.h) on a keyspace
 * laid out as mkfs does: claims spread over groups, allocation and
 * publication through map transactions, frees through quarantine, double
 * frees refused, free intents for groups owned by another node (marked
 * drained, left to that owner), intents in groups nobody owns (claimed and
 * folded by the sweep, or by a start, which prefers such groups), takeover
 * of this node's groups from a previous session, on-demand claims and
 * ENOSPC with the reserve, a lost session
 * (everything forgotten, groups claimed again), re-reads after an unknown
 * outcome, clean leave.
 * With the data path built: the mounted filesystem (after mount this node
 * owns groups; an unlinked file's reclaim record goes and free space returns
 * to the mkfs value; an orphan left by kill -9 is reclaimed after remount;
 * after kill -9, deleting files whose blocks lie in the old session's groups
 * returns all space and leaves no free intent).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "config.h"
#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "alloc/alloc.h"
#include "meta/layout.h"
#include "harness.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "space/runs.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"
#include "../support/mount.h"

static struct efs_harness *h;
static struct efs_etcd *c;
static struct efs_etcd_sync *sc;
static struct efs_meta_ns ns;
static struct efs_layout lay;
static Etcfs__FsInfo fi;
static uint8_t uuid[16];

/* ---- Keyspace ---- */

/* Writes ag/<g>/map and /free of every group, as mkfs does. */
static void write_groups(void)
{
	for (uint32_t g = 0; g < lay.ag_count; g++) {
		struct efs_layout_agmap m;
		Etcfs__AgFree af;
		ProtobufCBinaryData b;
		struct efs_meta_key k;

		efs_layout_ag_map(&lay, g, &m);
		cr_assert_eq(efs_meta_pack(&m.map.base, &b), 0);
		cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_MAP, &k), 0);
		cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, b.data, b.len, 0, NULL), 0);
		efs_mem_free(b.data);
		efs_layout_ag_free(&lay, g, &af);
		cr_assert_eq(efs_meta_pack(&af.base, &b), 0);
		cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_FREE, &k), 0);
		cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, b.data, b.len, 0, NULL), 0);
		efs_mem_free(b.data);
	}
}

static void layout_init(uint64_t dev_bytes)
{
	char why[EFS_LAYOUT_REASON_MAX];

	cr_assert_eq(efs_layout_compute(dev_bytes, 4096, 0, &lay, why, sizeof(why)), 0, "%s",
		     why);
	memset(uuid, 7, sizeof(uuid));
	efs_layout_fsinfo(&lay, uuid, "space", 1, &fi);
	write_groups();
}

static void setup(void)
{
	struct efs_harness_opts o = {.members = 1};
	struct efs_etcd_opts eo = {0};

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	efs_test_loop_init();
	c = efs_test_client_new(efs_harness_endpoints(h));
	eo.endpoints = efs_harness_endpoints(h);
	cr_assert_eq(efs_etcd_sync_new(&sc, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&ns, "space"), 0);
}

static void teardown(void)
{
	if (c) {
		efs_test_client_free(c);
		c = NULL;
	}
	sc = efs_etcd_sync_free(sc);
	efs_test_loop_fini();
	h = efs_harness_free(h);
}

TestSuite(alloc, .init = setup, .fini = teardown, .timeout = 90);

/* Every key of the ag/ family (caller frees). */
static Etcdserverpb__TxnResponse *read_family(enum efs_meta_family fam,
					      Etcdserverpb__RangeResponse **rr)
{
	struct efs_meta_range rg;
	struct efs_etcd_txn *t;
	Etcdserverpb__TxnResponse *resp = NULL;

	cr_assert_eq(efs_meta_range_family(&ns, fam, &rg), 0);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
					rg.end.buf, rg.end.len),
		     0);
	cr_assert_eq(efs_etcd_sync_txn(sc, efs_etcd_txn_request(t), &resp), 0);
	efs_etcd_txn_free(t);
	cr_assert_eq(efs_etcd_txn_resp_range(resp, 0, rr), 0);
	return resp;
}

struct agview {
	uint64_t free_sum;
	uint32_t owned_by[256]; /* 1: owner key names |node| */
	uint32_t nowned;
	uint64_t free[256];
	uint64_t mapfree[256];
	bool has_map[256];
	size_t intents;
	size_t drained;
};

static void view(const char *node, struct agview *v)
{
	Etcdserverpb__RangeResponse *rr;
	Etcdserverpb__TxnResponse *resp = read_family(EFS_META_K_AG_OWNER, &rr);

	memset(v, 0, sizeof(*v));
	for (size_t i = 0; i < rr->n_kvs; i++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = rr->kvs[i];

		cr_assert_eq(efs_meta_key_parse(&ns, kv->key.data, kv->key.len, &ki), 0);
		cr_assert_lt(ki.group, 256);
		if (ki.family == EFS_META_K_AG_FREE) {
			Etcfs__AgFree *af;

			cr_assert_eq(efs_meta_ag_free_decode(kv->value.data, kv->value.len, &af,
							     NULL),
				     0);
			v->free_sum += af->free_blocks;
			v->free[ki.group] = af->free_blocks;
			efs_meta_record_free(af);
		} else if (ki.family == EFS_META_K_AG_OWNER) {
			Etcfs__AgOwner *ow;

			cr_assert_eq(efs_meta_ag_owner_decode(kv->value.data, kv->value.len, &ow,
							      NULL),
				     0);
			if (node && !strcmp(ow->node, node)) {
				v->owned_by[ki.group] = 1;
				v->nowned++;
			}
			efs_meta_record_free(ow);
		} else if (ki.family == EFS_META_K_FREE_INTENT) {
			Etcfs__FreeIntent *in;

			cr_assert_eq(efs_meta_free_intent_decode(kv->value.data, kv->value.len,
								 &in, NULL),
				     0);
			v->intents++;
			v->drained += in->drained;
			efs_meta_record_free(in);
		} else if (ki.family == EFS_META_K_AG_MAP) {
			Etcfs__AgMap *m;
			uint64_t n = 0;

			cr_assert_eq(efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m,
							    NULL),
				     0);
			for (size_t j = 0; j < m->n_free; j++)
				n += m->free[j]->len;
			cr_assert_eq(m->group_blocks, efs_layout_group_blocks(&lay, ki.group));
			efs_meta_record_free(m);
			v->mapfree[ki.group] = n;
			v->has_map[ki.group] = true;
		}
	}
	efs_test_pb_free(resp);
	for (uint32_t g = 0; g < 256; g++)
		if (v->has_map[g])
			cr_assert_eq(v->free[g], v->mapfree[g], "group %u: free count off its map",
				     g);
}

/* ---- Sessions and allocators ---- */

struct done {
	bool done;
	int status;
};

static void sess_done(struct efs_session *s, int status, void *arg)
{
	struct done *d = arg;

	(void)s;
	d->done = true;
	d->status = status;
}

static struct efs_session *session(const char *node)
{
	struct efs_session_opts o = {
		.ns = &ns, .node = node, .machine_id = "m1", .hostname = "h", .ttl_s = 2,
	};
	struct efs_session *s = NULL;
	struct done d = {0};

	cr_assert_eq(efs_session_start(&s, &efs_test_loop, c, &o, NULL, sess_done, &d), 0);
	cr_assert(efs_test_run_until(&d.done, 15000));
	cr_assert_eq(d.status, 0, "session: %d", d.status);
	return s;
}

static void session_end(struct efs_session *s)
{
	struct done d = {0};

	cr_assert_eq(efs_session_leave(s, sess_done, &d), 0);
	cr_assert(efs_test_run_until(&d.done, 10000));
	efs_session_free(s);
}

static void cb_done(int status, void *arg)
{
	struct done *d = arg;

	d->done = true;
	d->status = status;
}

/* The dead-node grace and the hand-over bound of the allocators
 * alloc_start makes. */
static uint32_t grace_ms = 300;
static uint32_t ho_wait_ms = 600;

static struct efs_alloc *alloc_start(struct efs_session *s, uint32_t initial)
{
	struct efs_alloc_opts o = {
		.ns = &ns,
		.fi = &fi,
		.groups_initial = initial,
		.fold_interval_ms = 200,
		.dead_grace_ms = grace_ms,
		.handover_wait_ms = ho_wait_ms,
	};
	struct efs_alloc *a = NULL;
	struct done d = {0};

	cr_assert_eq(efs_alloc_new(&a, &efs_test_loop, c, s, &o), 0);
	cr_assert_eq(efs_alloc_start(a, cb_done, &d), 0);
	cr_assert(efs_test_run_until(&d.done, 10000));
	cr_assert_eq(d.status, 0, "start: %d", d.status);
	return a;
}

static void alloc_leave(struct efs_alloc *a)
{
	struct done d = {0};
	int r = efs_alloc_leave(a, cb_done, &d);

	cr_assert_geq(r, 0);
	if (r == 0) {
		cr_assert(efs_test_run_until(&d.done, 10000));
		cr_assert_eq(d.status, 0);
	}
	efs_alloc_free(a);
}

struct txn_ctx {
	bool done;
	bool ok;
	int64_t rev;
	Etcdserverpb__TxnResponse *resp; /* kept (caller frees) */
};

static void txn_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct txn_ctx *x = arg;

	x->done = true;
	x->ok = r->err == 0 && resp->succeeded;
	x->rev = r->err == 0 && resp->header ? resp->header->revision : 0;
	if (r->err == 0) {
		x->resp = resp;
		r->resp = NULL;
	}
}

/* One map transaction: |use| published, |fre| freed. Returns the build
 * result (0: committed). */
static int publish(struct efs_alloc *a, struct efs_session *s, const struct efs_runs *use,
		   const struct efs_runs *fre)
{
	struct efs_alloc_txn *t = NULL;
	struct efs_etcd_txn *et = NULL;
	struct done d = {0};
	struct txn_ctx x = {0};
	int r;

	r = efs_alloc_txn_begin(a, &t, cb_done, &d);
	cr_assert_geq(r, 0);
	if (r == 0) {
		cr_assert(efs_test_run_until(&d.done, 10000));
		cr_assert_eq(d.status, 0);
	}
	if (use)
		cr_assert_eq(efs_alloc_txn_use(t, use), 0);
	if (fre)
		cr_assert_eq(efs_alloc_txn_free(t, fre, 42), 0);
	cr_assert_eq(efs_etcd_txn_new(&et, 0), 0);
	cr_assert_eq(efs_session_guard(s, et), 0);
	r = efs_alloc_txn_build(t, et);
	if (r < 0) {
		efs_etcd_txn_free(et);
		efs_alloc_txn_end(t, EFS_ALLOC_FAILED, 0);
		return r;
	}
	cr_assert_eq(efs_etcd_txn_request(et)->n_compare, 2 + efs_alloc_txn_nops(t) / 2);
	cr_assert_eq(efs_etcd_txn(c, efs_etcd_txn_request(et), NULL, txn_cb, &x), 0);
	efs_etcd_txn_free(et);
	cr_assert(efs_test_run_until(&x.done, 10000));
	cr_assert(x.ok);
	efs_alloc_txn_result(t, x.resp);
	efs_alloc_txn_end(t, EFS_ALLOC_COMMITTED, x.rev);
	efs_test_pb_free(x.resp);
	return 0;
}

static uint32_t group_of(uint64_t block)
{
	return (uint32_t)((block - lay.data_start) / lay.ag_blocks);
}

/* ---- Tests ---- */

Test(alloc, claim_publish_free)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_alloc_stats st;
	struct efs_runs got = {0};
	struct agview v0, v;
	uint64_t total;

	layout_init(64ull << 20);
	total = efs_layout_total_blocks(&lay);
	s = session("n1");
	a = alloc_start(s, 2);
	view("n1", &v0);
	cr_assert_eq(v0.nowned, 2, "groups owned: %u", v0.nowned);
	cr_assert_eq(v0.free_sum, total);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.groups_owned, 2);
	cr_assert_eq(st.avail_blocks, 2 * lay.ag_blocks);

	/* Allocate 10 blocks: owned groups only, pending until published. */
	cr_assert_eq(efs_alloc_get(a, 10, 0, EFS_ALLOC_NEW, &got, cb_done, NULL), 1);
	cr_assert_eq(efs_runs_total(&got), 10);
	for (size_t i = 0; i < got.n; i++)
		cr_assert(v0.owned_by[group_of(got.v[i].start)]);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.pending_blocks, 10);
	cr_assert_eq(st.avail_blocks, 2 * lay.ag_blocks - 10);

	/* A use of blocks never allocated is refused. */
	{
		struct efs_runs bogus = {0};
		struct efs_alloc_txn *t = NULL;
		struct done d = {0};

		cr_assert_eq(efs_runs_add(&bogus, got.v[0].start + 10, 1), 0);
		cr_assert_eq(efs_alloc_txn_begin(a, &t, cb_done, &d), 1);
		cr_assert_eq(efs_alloc_txn_use(t, &bogus), -EINVAL);
		efs_alloc_txn_end(t, EFS_ALLOC_FAILED, 0);
		efs_runs_done(&bogus);
	}

	cr_assert_eq(publish(a, s, &got, NULL), 0);
	view("n1", &v);
	cr_assert_eq(v.free_sum, total - 10);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.pending_blocks, 0);

	/* Freeing it: quarantine, then back (no read in flight). */
	{
		uint64_t tk = efs_alloc_read_begin(a);

		cr_assert_eq(publish(a, s, NULL, &got), 0);
		efs_alloc_get_stats(a, &st);
		cr_assert_eq(st.quarantine_blocks, 10);
		cr_assert_eq(st.avail_blocks, 2 * lay.ag_blocks - 10);
		efs_alloc_read_end(a, tk);
		efs_alloc_get_stats(a, &st);
		cr_assert_eq(st.quarantine_blocks, 0);
		cr_assert_eq(st.avail_blocks, 2 * lay.ag_blocks);
	}
	view("n1", &v);
	cr_assert_eq(v.free_sum, total);

	/* A double free is refused by the build. */
	cr_assert_eq(publish(a, s, NULL, &got), -EUCLEAN);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.double_frees, 10);

	/* Unuse: through quarantine, back to the available set. */
	efs_runs_clear(&got);
	cr_assert_eq(efs_alloc_get(a, 5, 0, 0, &got, cb_done, NULL), 1);
	efs_alloc_unuse(a, &got);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.pending_blocks, 0);
	cr_assert_eq(st.avail_blocks, 2 * lay.ag_blocks);

	alloc_leave(a);
	view("n1", &v);
	cr_assert_eq(v.nowned, 0);
	cr_assert_eq(v.free_sum, total);
	efs_runs_done(&got);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

/* The end of a test: the client goes, and nothing may be left allocated. */
static void client_end(void)
{
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

/* Puts (|put|) or deletes the backup pin pin/backup.test. */
static void backup_pin(bool put)
{
	struct efs_meta_key k;

	cr_assert_eq(efs_meta_key_pin(&ns, EFS_META_PIN_BACKUP "test", &k), 0);
	if (put)
		cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, "1", 1, 0, NULL), 0);
	else
		cr_assert_eq(efs_etcd_sync_delete(sc, k.buf, k.len, false, NULL), 0);
}

/* Whether any block of |r| is in |got|. */
static bool runs_meet(const struct efs_runs *r, const struct efs_runs *got)
{
	for (size_t i = 0; i < r->n; i++)
		for (size_t j = 0; j < got->n; j++)
			if (r->v[i].start < got->v[j].start + got->v[j].len &&
			    got->v[j].start < r->v[i].start + r->v[i].len)
				return true;
	return false;
}

/* Node |node| on a 64 MiB layout, owning one group, with 10 blocks
 * published (in |got|). */
static struct efs_alloc *one_group_in_use(const char *node, struct efs_session **ret_s,
					  struct efs_runs *got)
{
	struct efs_session *s = session(node);
	struct efs_alloc *a = alloc_start(s, 1);

	cr_assert_eq(efs_alloc_get(a, 10, 0, 0, got, cb_done, NULL), 1);
	cr_assert_eq(publish(a, s, got, NULL), 0);
	*ret_s = s;
	return a;
}

Test(alloc, blocks_freed_under_a_backup_pin_are_held_until_a_transaction_sees_none)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_alloc_stats st;
	struct efs_runs got = {0}, more = {0}, rest = {0};
	uint64_t all = 0;

	layout_init(64ull << 20);
	a = one_group_in_use("n1", &s, &got);

	/* Freed while a backup pin exists: held, not available. */
	backup_pin(true);
	cr_assert_eq(publish(a, s, NULL, &got), 0);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.held_blocks, 10);
	cr_assert_eq(st.quarantine_blocks, 0, "no read was in flight");
	cr_assert_eq(st.avail_blocks, lay.ag_blocks - 10);
	all = st.avail_blocks;
	/* Everything allocatable, and none of it held. */
	cr_assert_eq(efs_alloc_get(a, all, 0, 0, &rest, cb_done, NULL), 1);
	cr_assert_not(runs_meet(&rest, &got), "a held block was allocated");
	efs_alloc_unuse(a, &rest);
	efs_runs_clear(&rest);
	/* A transaction that still sees the pin keeps them held. */
	cr_assert_eq(efs_alloc_get(a, 2, 0, 0, &more, cb_done, NULL), 1);
	cr_assert_eq(publish(a, s, &more, NULL), 0);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.held_blocks, 10);

	/* The pin is gone: the next map transaction releases them. */
	backup_pin(false);
	cr_assert_eq(publish(a, s, NULL, &more), 0);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.held_blocks, 0, "still held after a transaction saw no pin");
	cr_assert_eq(st.avail_blocks, lay.ag_blocks);

	/* With no transaction to make, the sweep releases them. */
	backup_pin(true);
	cr_assert_eq(efs_alloc_get(a, 3, 0, 0, &rest, cb_done, NULL), 1);
	cr_assert_eq(publish(a, s, &rest, NULL), 0);
	cr_assert_eq(publish(a, s, NULL, &rest), 0);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.held_blocks, 3);
	efs_test_run_for(1000); /* sweeps every 200 ms: the pin is still there */
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.held_blocks, 3);
	backup_pin(false);
	for (int i = 0; i < 50 && st.held_blocks; i++) {
		efs_test_run_for(100);
		efs_alloc_get_stats(a, &st);
	}
	cr_assert_eq(st.held_blocks, 0, "the sweep did not release the held blocks");
	cr_assert_eq(st.avail_blocks, lay.ag_blocks);

	alloc_leave(a);
	efs_runs_done(&got);
	efs_runs_done(&more);
	efs_runs_done(&rest);
	session_end(s);
	client_end();
}

/* A group claimed while a backup runs holds its free blocks only when its
 * map changed after the backup's revision. */
Test(alloc, a_group_claimed_under_a_backup_pin_holds_what_its_map_freed_since)
{
	struct efs_session *s1, *s2;
	struct efs_alloc *a1, *a2;
	struct efs_alloc_stats st;
	struct efs_runs got = {0};
	uint64_t total, g1_blocks;
	uint32_t g1;

	layout_init(64ull << 20);
	total = efs_layout_total_blocks(&lay);
	a1 = one_group_in_use("n1", &s1, &got);
	g1 = group_of(got.v[0].start);
	g1_blocks = g1 + 1 < lay.ag_count ? lay.ag_blocks : total - (uint64_t)g1 * lay.ag_blocks;
	/* A backup starts; n1 then frees the 10 blocks and leaves its group. */
	backup_pin(true);
	cr_assert_eq(publish(a1, s1, NULL, &got), 0);
	alloc_leave(a1);
	/* n2 claims every group: n1's (its map changed since the pin: held)
	 * and the others, untouched since (nothing held). */
	s2 = session("n2");
	a2 = alloc_start(s2, lay.ag_count);
	efs_alloc_get_stats(a2, &st);
	cr_assert_eq(st.groups_owned, lay.ag_count);
	cr_assert_eq(st.held_blocks, g1_blocks, "held %llu blocks, group %u has %llu",
		     (unsigned long long)st.held_blocks, g1, (unsigned long long)g1_blocks);
	cr_assert_eq(st.avail_blocks, total - g1_blocks);
	backup_pin(false);
	for (int i = 0; i < 50 && st.held_blocks; i++) {
		efs_test_run_for(100);
		efs_alloc_get_stats(a2, &st);
	}
	cr_assert_eq(st.held_blocks, 0);
	cr_assert_eq(st.avail_blocks, total);
	alloc_leave(a2);
	efs_runs_done(&got);
	session_end(s1);
	session_end(s2);
	client_end();
}

/* Owner key of group |g| for a node of another process, on a lease of its
 * own (returned, to revoke). */
static int64_t fake_owner(uint32_t g, const char *node)
{
	Etcfs__AgOwner ow = ETCFS__AG_OWNER__INIT;
	Etcdserverpb__LeaseGrantRequest lg = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	Etcdserverpb__LeaseGrantResponse *lr = NULL;
	struct efs_meta_key k;
	ProtobufCBinaryData b;
	int64_t id;

	lg.ttl = 60;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_GRANT, &lg.base,
				       (ProtobufCMessage **)&lr, NULL),
		     0);
	id = lr->id;
	efs_test_pb_free(lr);
	ow.node = (char *)node;
	ow.session_generation = 1;
	ow.lease_id = id;
	cr_assert_eq(efs_meta_pack(&ow.base, &b), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_OWNER, &k), 0);
	cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, b.data, b.len, id, NULL), 0);
	efs_mem_free(b.data);
	return id;
}

static void lease_revoke(int64_t id)
{
	Etcdserverpb__LeaseRevokeRequest rq = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;

	rq.id = id;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_REVOKE, &rq.base, &resp, NULL), 0);
	efs_test_pb_free(resp);
}

Test(alloc, intents_drained_and_folded)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_runs got[2] = {{0}};
	struct agview v0, v;
	uint32_t gs[2], n = 0;
	uint64_t total;
	int64_t lease;

	layout_init(64ull << 20);
	total = efs_layout_total_blocks(&lay);
	s = session("n1");
	a = alloc_start(s, 2);
	view("n1", &v0);
	for (uint32_t g = 0; g < lay.ag_count; g++)
		if (v0.owned_by[g] && n < 2)
			gs[n++] = g;
	cr_assert_eq(n, 2);
	/* 20 blocks in each group, published. */
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(efs_alloc_get(a, 20, efs_layout_group_start(&lay, gs[i]), 0, &got[i],
					   cb_done, NULL),
			     1);
		cr_assert_eq(group_of(got[i].v[0].start), gs[i]);
		cr_assert_eq(publish(a, s, &got[i], NULL), 0);
	}
	alloc_leave(a);

	/* Another node ("n2", its own lease) owns gs[1]; an allocator of n1
	 * owning gs[0] frees both: one free intent, left to n2. */
	lease = fake_owner(gs[1], "n2");
	a = alloc_start(s, 1);
	view("n1", &v);
	cr_assert_eq(v.nowned, 1);
	cr_assert(v.owned_by[gs[0]]);
	cr_assert_eq(publish(a, s, NULL, &got[0]), 0);
	cr_assert_eq(publish(a, s, NULL, &got[1]), 0);
	view("n1", &v);
	cr_assert_eq(v.intents, 1);
	cr_assert_eq(v.free[gs[1]], lay.ag_blocks - 20);
	cr_assert_eq(v.free_sum, total - 20);
	/* Quarantine releases at once (no read): the sweep marks it drained;
	 * the group stays n2's (sweeps do not claim owned groups). */
	for (int i = 0; i < 50 && v.drained == 0; i++) {
		efs_test_run_for(100);
		view("n1", &v);
	}
	cr_assert_eq(v.drained, 1);
	efs_test_run_for(500);
	view("n1", &v);
	cr_assert_eq(v.intents, 1);
	cr_assert_not(v.owned_by[gs[1]]);

	/* n2 goes without folding: the group has an intent and no owner, and
	 * the sweep claims it and folds the intent. */
	lease_revoke(lease);
	for (int i = 0; i < 50 && (v.intents || v.free_sum != total); i++) {
		efs_test_run_for(100);
		view("n1", &v);
	}
	cr_assert_eq(v.intents, 0);
	cr_assert_eq(v.free_sum, total);
	cr_assert(v.owned_by[gs[1]]);
	alloc_leave(a);

	/* Intents left in a group nobody owns (its owner left cleanly) are
	 * folded by the next start, which prefers such groups. */
	a = alloc_start(s, 2);
	{
		struct efs_runs more = {0};
		uint32_t gm;

		cr_assert_eq(efs_alloc_get(a, 7, 0, 0, &more, cb_done, NULL), 1);
		gm = group_of(more.v[0].start);
		cr_assert_eq(publish(a, s, &more, NULL), 0);
		alloc_leave(a);
		/* Another node frees them while n3 owns the group, then both go:
		 * an intent of an ended session in a group nobody owns. */
		lease = fake_owner(gm, "n3");
		{
			struct efs_session *s4 = session("n4");

			a = alloc_start(s4, 1);
			cr_assert_eq(publish(a, s4, NULL, &more), 0);
			alloc_leave(a);
			session_end(s4);
		}
		lease_revoke(lease);
		view("n1", &v);
		cr_assert_eq(v.intents, 1);
		cr_assert_eq(v.free_sum, total - 7);
		a = alloc_start(s, 1);
		view("n1", &v);
		cr_assert(v.owned_by[gm], "the start did not prefer the group with intents");
		/* n4's intent is not drained: it is folded once the grace has
		 * passed since n1 saw n4's session ended. */
		for (int i = 0; i < 50 && v.intents; i++) {
			efs_test_run_for(100);
			view("n1", &v);
		}
		cr_assert_eq(v.intents, 0);
		cr_assert_eq(v.free_sum, total);
		alloc_leave(a);
		efs_runs_done(&more);
	}
	efs_runs_done(&got[0]);
	efs_runs_done(&got[1]);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

Test(alloc, takeover_of_previous_session)
{
	Etcfs__AgOwner ow = ETCFS__AG_OWNER__INIT;
	Etcdserverpb__LeaseGrantRequest lg = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	Etcdserverpb__LeaseGrantResponse *lr = NULL;
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_meta_key k;
	ProtobufCBinaryData b;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__AgOwner *got = NULL;
	struct agview v;
	uint32_t g0;

	layout_init(64ull << 20);
	s = session("n1");
	/* Learn which group n1 claims first, then give it back. */
	a = alloc_start(s, 1);
	view("n1", &v);
	for (g0 = 0; g0 < lay.ag_count && !v.owned_by[g0]; g0++)
		;
	cr_assert_lt(g0, lay.ag_count);
	alloc_leave(a);

	/* A previous session of n1 (generation 0, its own live lease) owns g0
	 * and g0 + 1 (which the spread order would not pick first). */
	lg.ttl = 60;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_GRANT, &lg.base,
				       (ProtobufCMessage **)&lr, NULL),
		     0);
	ow.node = (char *)"n1";
	ow.session_generation = 0;
	ow.lease_id = lr->id;
	cr_assert_eq(efs_meta_pack(&ow.base, &b), 0);
	for (uint32_t g = g0; g <= g0 + 1 && g < lay.ag_count; g++) {
		cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_OWNER, &k), 0);
		cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, b.data, b.len, lr->id, NULL), 0);
	}
	efs_mem_free(b.data);

	a = alloc_start(s, 1);
	cr_assert_eq(efs_meta_key_ag(&ns, g0, EFS_META_K_AG_OWNER, &k), 0);
	cr_assert_eq(efs_etcd_sync_get(sc, k.buf, k.len, &kv, NULL), 0);
	cr_assert_eq(efs_meta_ag_owner_decode(kv->value.data, kv->value.len, &got, NULL), 0);
	cr_assert_str_eq(got->node, "n1");
	cr_assert_eq(got->session_generation, efs_session_generation(s));
	cr_assert_eq(kv->lease, efs_session_lease_id(s));
	efs_meta_record_free(got);
	efs_test_pb_free(kv);
	efs_test_pb_free(lr);
	alloc_leave(a);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

Test(alloc, claims_on_demand_and_enospc)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_runs got = {0};
	struct efs_alloc_stats st;
	struct done d = {0};
	struct agview v;
	uint64_t total;
	int r;

	/* 4 MiB: 3 groups of 256 blocks; reserve max(1%, 64) = 64. */
	layout_init(4ull << 20);
	cr_assert_eq(lay.ag_count, 3);
	total = efs_layout_total_blocks(&lay);
	s = session("n1");
	a = alloc_start(s, 2);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.groups_owned, 2);
	cr_assert_eq(st.reserve_blocks, 64);

	/* New space may not eat the reserve. */
	cr_assert_eq(efs_alloc_get(a, total - 63, 0, EFS_ALLOC_NEW, &got, cb_done, &d), -ENOSPC);
	/* Without the flag: a third group is claimed (async). */
	r = efs_alloc_get(a, 600, 0, 0, &got, cb_done, &d);
	cr_assert_eq(r, 0, "get: %d", r);
	cr_assert(efs_test_run_until(&d.done, 10000));
	cr_assert_eq(d.status, 0);
	cr_assert_eq(efs_runs_total(&got), 600);
	view("n1", &v);
	cr_assert_eq(v.nowned, 3);
	/* Everything owned, the rest too small: ENOSPC now. */
	d = (struct done){0};
	cr_assert_eq(efs_alloc_get(a, total - 600 + 1, 0, 0, &got, cb_done, &d), -ENOSPC);
	cr_assert_eq(efs_runs_total(&got), 600);
	/* But exactly what is left works. */
	cr_assert_eq(efs_alloc_get(a, total - 600, 0, 0, &got, cb_done, &d), 1);
	efs_alloc_unuse(a, &got);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.avail_blocks, total);
	alloc_leave(a);
	efs_runs_done(&got);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

/* Keys of ho/ (hand-over requests) now. */
static size_t handover_keys(void)
{
	Etcdserverpb__RangeResponse *rr;
	Etcdserverpb__TxnResponse *resp = read_family(EFS_META_K_HANDOVER, &rr);
	size_t n = rr->n_kvs;

	efs_test_pb_free(resp);
	return n;
}

/* Two nodes leave cleanly; the test's client goes and nothing leaks. */
static void pair_end(struct efs_alloc *a1, struct efs_session *s1, struct efs_alloc *a2,
		     struct efs_session *s2)
{
	alloc_leave(a1);
	alloc_leave(a2);
	session_end(s1);
	session_end(s2);
	client_end();
}

Test(alloc, short_node_takes_an_idle_owners_group_then_enospc_within_the_bound)
{
	struct efs_session *s1, *s2;
	struct efs_alloc *a1, *a2;
	struct efs_runs got1 = {0}, more = {0}, got2 = {0}, last = {0};
	struct efs_alloc_stats st1, st2;
	struct agview v2;
	struct done d = {0};
	uint64_t t0, ms;
	int r;

	/* 4 MiB: 3 groups of 256 blocks. n1 owns one, n2 the two others. */
	layout_init(4ull << 20);
	cr_assert_eq(lay.ag_count, 3);
	s1 = session("n1");
	a1 = alloc_start(s1, 1);
	s2 = session("n2");
	a2 = alloc_start(s2, 2);
	view("n2", &v2);
	cr_assert_eq(v2.nowned, 2);
	efs_test_run_for(200); /* n2's watch of ho/ is in place */

	/* n1 uses all of its group; more is handed over by the idle n2. */
	efs_alloc_get_stats(a1, &st1);
	cr_assert_eq(efs_alloc_get(a1, st1.avail_blocks, 0, 0, &got1, cb_done, &d), 1);
	r = efs_alloc_get(a1, 10, 0, 0, &more, cb_done, &d);
	cr_assert_eq(r, 0, "get: %d", r);
	cr_assert(efs_test_run_until(&d.done, 5000));
	cr_assert_eq(d.status, 0, "hand-over: %d", d.status);
	cr_assert_eq(efs_runs_total(&more), 10);
	cr_assert(v2.owned_by[group_of(more.v[0].start)], "not one of n2's groups");
	efs_alloc_get_stats(a1, &st1);
	efs_alloc_get_stats(a2, &st2);
	cr_assert_eq(st1.groups_owned, 2);
	cr_assert_eq(st2.groups_owned, 1);
	cr_assert_eq(st2.groups_given, 1);
	efs_test_run_for(100);
	cr_assert_eq(handover_keys(), 0, "the answered request is deleted");

	/* n2 now has allocations pending in its last group: it keeps it, and
	 * n1 gets ENOSPC once the bound has passed. */
	cr_assert_eq(efs_alloc_get(a2, st2.avail_blocks, 0, 0, &got2, cb_done, NULL), 1);
	efs_alloc_get_stats(a1, &st1);
	cr_assert_eq(efs_alloc_get(a1, st1.avail_blocks, 0, 0, &last, cb_done, NULL), 1);
	d = (struct done){0};
	t0 = efs_test_now_ms();
	r = efs_alloc_get(a1, 10, 0, 0, &more, cb_done, &d);
	if (r == 0) {
		cr_assert(efs_test_run_until(&d.done, 10000));
		r = d.status;
	}
	ms = efs_test_now_ms() - t0;
	cr_assert_eq(r, -ENOSPC, "get: %d", r);
	cr_assert_geq(ms, ho_wait_ms / 2, "ENOSPC after %" PRIu64 " ms", ms);
	cr_assert_leq(ms, ho_wait_ms + 3000, "ENOSPC after %" PRIu64 " ms", ms);
	efs_alloc_get_stats(a2, &st2);
	cr_assert_eq(st2.groups_owned, 1);
	efs_test_run_for(100);
	cr_assert_eq(handover_keys(), 0, "the timed-out request is deleted");
	/* Right after, no wait: the cluster is full. */
	d = (struct done){0};
	r = efs_alloc_get(a1, 10, 0, 0, &more, cb_done, &d);
	if (r == 0) {
		cr_assert(efs_test_run_until(&d.done, 500));
		r = d.status;
	}
	cr_assert_eq(r, -ENOSPC);

	efs_alloc_unuse(a1, &got1);
	efs_alloc_unuse(a1, &more);
	efs_alloc_unuse(a1, &last);
	efs_alloc_unuse(a2, &got2);
	efs_runs_done(&got1);
	efs_runs_done(&more);
	efs_runs_done(&got2);
	efs_runs_done(&last);
	pair_end(a1, s1, a2, s2);
}

#if EFS_FAULT_HOOKS
/*
 * n1's hand-over request is deleted without a group n1 can claim (as when
 * an owner's answer released a group and a third node claimed it first):
 * n1 puts a new request, which n2 answers, instead of waiting out the
 * first one's bound and answering ENOSPC. n2's watch is 1 s late, so the
 * test deletes the first request before n2 sees it (n2's answer to it then
 * fails its compare).
 */
Test(alloc, an_asker_whose_answer_went_elsewhere_asks_again)
{
	struct efs_session *s1, *s2;
	struct efs_alloc *a1, *a2;
	struct efs_etcd *c1, *c2;
	struct efs_runs got1 = {0}, more = {0};
	struct efs_alloc_stats st1, st2;
	struct efs_meta_key k;
	struct done d = {0};
	uint64_t t0;
	int r;

	layout_init(4ull << 20);
	cr_assert_eq(lay.ag_count, 3);
	ho_wait_ms = 3000;
	s1 = session("n1");
	a1 = alloc_start(s1, 1);
	/* n2 on a client of its own whose watches are 1 s late. */
	c1 = c;
	c2 = efs_test_client_new(efs_harness_endpoints(h));
	efs_etcd_fault_watch_delay(c2, 1000);
	c = c2;
	s2 = session("n2");
	a2 = alloc_start(s2, 2);
	c = c1;
	efs_test_run_for(1200); /* n2's watch of ho/ is in place */

	efs_alloc_get_stats(a1, &st1);
	cr_assert_eq(efs_alloc_get(a1, st1.avail_blocks, 0, 0, &got1, cb_done, &d), 1);
	t0 = efs_test_now_ms();
	r = efs_alloc_get(a1, 10, 0, 0, &more, cb_done, &d);
	cr_assert_eq(r, 0, "get: %d", r);
	while (!handover_keys() && efs_test_now_ms() - t0 < 2000)
		efs_test_run_for(2);
	cr_assert_eq(handover_keys(), 1, "n1 put no hand-over request");
	cr_assert_eq(efs_meta_key_handover(&ns, "n1", &k), 0);
	cr_assert_eq(efs_etcd_sync_delete(sc, k.buf, k.len, false, NULL), 0);
	cr_assert(efs_test_run_until(&d.done, 10000));
	cr_assert_eq(d.status, 0, "get after a request deleted unanswered: %d (%" PRIu64 " ms)",
		     d.status, efs_test_now_ms() - t0);
	cr_assert_eq(efs_runs_total(&more), 10);
	efs_alloc_get_stats(a2, &st2);
	cr_assert_eq(st2.groups_given, 1);
	cr_assert_lt(efs_test_now_ms() - t0, ho_wait_ms, "the get took %" PRIu64 " ms",
		     efs_test_now_ms() - t0);

	efs_alloc_unuse(a1, &got1);
	efs_alloc_unuse(a1, &more);
	efs_runs_done(&got1);
	efs_runs_done(&more);
	ho_wait_ms = 600;
	alloc_leave(a1);
	alloc_leave(a2);
	session_end(s1);
	session_end(s2);
	efs_test_client_free(c2);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}
#endif

Test(alloc, two_short_nodes_give_each_other_nothing)
{
	struct efs_session *s1, *s2;
	struct efs_alloc *a1, *a2;
	struct efs_runs got1 = {0}, got2 = {0}, more1 = {0}, more2 = {0};
	struct efs_alloc_stats st1, st2;
	struct done d1 = {0}, d2 = {0};
	int r1, r2;

	/* 4 MiB: 3 groups; n1 owns one, n2 two. Both use all they have
	 * (pending, unpublished) and both want more at once. */
	layout_init(4ull << 20);
	s1 = session("n1");
	a1 = alloc_start(s1, 1);
	s2 = session("n2");
	a2 = alloc_start(s2, 2);
	efs_test_run_for(200);
	efs_alloc_get_stats(a1, &st1);
	efs_alloc_get_stats(a2, &st2);
	cr_assert_eq(efs_alloc_get(a1, st1.avail_blocks, 0, 0, &got1, cb_done, NULL), 1);
	cr_assert_eq(efs_alloc_get(a2, st2.avail_blocks, 0, 0, &got2, cb_done, NULL), 1);
	r1 = efs_alloc_get(a1, 10, 0, 0, &more1, cb_done, &d1);
	r2 = efs_alloc_get(a2, 10, 0, 0, &more2, cb_done, &d2);
	if (r1 == 0)
		cr_assert(efs_test_run_until(&d1.done, 10000));
	if (r2 == 0)
		cr_assert(efs_test_run_until(&d2.done, 10000));
	cr_assert_eq(r1 == 0 ? d1.status : r1, -ENOSPC);
	cr_assert_eq(r2 == 0 ? d2.status : r2, -ENOSPC);
	efs_alloc_get_stats(a1, &st1);
	efs_alloc_get_stats(a2, &st2);
	cr_assert_eq(st1.groups_owned, 1);
	cr_assert_eq(st2.groups_owned, 2);
	cr_assert_eq(st1.groups_given + st2.groups_given, 0);
	efs_test_run_for(100);
	cr_assert_eq(handover_keys(), 0);

	efs_alloc_unuse(a1, &got1);
	efs_alloc_unuse(a2, &got2);
	efs_runs_done(&got1);
	efs_runs_done(&got2);
	efs_runs_done(&more1);
	efs_runs_done(&more2);
	pair_end(a1, s1, a2, s2);
}

Test(alloc, session_lost_forgets_and_reclaims)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_alloc_stats st;
	struct efs_alloc_txn *t = NULL;
	struct efs_runs got = {0};
	struct done d = {0};
	struct agview v;
	uint64_t total;

	layout_init(64ull << 20);
	total = efs_layout_total_blocks(&lay);
	s = session("n1");
	a = alloc_start(s, 2);
	cr_assert_eq(efs_alloc_get(a, 10, 0, 0, &got, cb_done, NULL), 1);
	cr_assert_eq(efs_alloc_txn_begin(a, &t, cb_done, NULL), 1);
	/* Lost: every group and allocation forgotten; the open contribution
	 * can only be ended. */
	efs_alloc_session_lost(a);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.groups_owned, 0);
	cr_assert_eq(st.pending_blocks, 0);
	cr_assert_eq(efs_alloc_txn_build(t, NULL), -EIO);
	efs_alloc_txn_end(t, EFS_ALLOC_FAILED, 0);
	/* The next allocation claims groups again (async). */
	efs_runs_clear(&got);
	cr_assert_eq(efs_alloc_get(a, 10, 0, 0, &got, cb_done, &d), 0);
	cr_assert(efs_test_run_until(&d.done, 10000));
	cr_assert_eq(d.status, 0);
	cr_assert_eq(efs_runs_total(&got), 10);
	efs_alloc_get_stats(a, &st);
	cr_assert_eq(st.groups_owned, 2);
	cr_assert_eq(publish(a, s, &got, NULL), 0);
	view("n1", &v);
	cr_assert_eq(v.nowned, 2);
	cr_assert_eq(v.free_sum, total - 10);
	cr_assert_eq(publish(a, s, NULL, &got), 0);
	alloc_leave(a);
	efs_runs_done(&got);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

/*
 * After a lost session the allocator starts again at its next allocation,
 * sweep included: an intent it leaves in another node's group is marked
 * drained by the sweep, and once that node is gone the sweep claims the
 * group and folds it.
 */
Test(alloc, the_sweep_runs_again_after_a_lost_session)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_runs got = {0}, more = {0};
	struct done d = {0};
	struct agview v0, v;
	uint32_t g1 = UINT32_MAX;
	uint64_t total;
	int64_t lease;

	layout_init(64ull << 20);
	total = efs_layout_total_blocks(&lay);
	s = session("n1");
	a = alloc_start(s, 2);
	view("n1", &v0);
	for (uint32_t g = 0; g < lay.ag_count && g1 == UINT32_MAX; g++)
		if (v0.owned_by[g])
			g1 = g;
	cr_assert_eq(efs_alloc_get(a, 20, efs_layout_group_start(&lay, g1), 0, &got, cb_done, NULL),
		     1);
	cr_assert_eq(group_of(got.v[0].start), g1);
	cr_assert_eq(publish(a, s, &got, NULL), 0);
	alloc_leave(a);
	/* g1 is another node's now; n1 loses its session and allocates again. */
	lease = fake_owner(g1, "n2");
	a = alloc_start(s, 1);
	efs_alloc_session_lost(a);
	cr_assert_eq(efs_alloc_get(a, 10, 0, 0, &more, cb_done, &d), 0);
	cr_assert(efs_test_run_until(&d.done, 10000));
	cr_assert_eq(d.status, 0);
	cr_assert_eq(publish(a, s, &more, &got), 0);
	view("n1", &v);
	cr_assert_eq(v.intents, 1);
	/* The sweep marks it drained (its quarantine has no read)... */
	for (int i = 0; i < 50 && v.drained == 0; i++) {
		efs_test_run_for(100);
		view("n1", &v);
	}
	cr_assert_eq(v.drained, 1, "no sweep after the lost session");
	/* ... and folds it once n2 is gone. */
	lease_revoke(lease);
	for (int i = 0; i < 50 && v.intents; i++) {
		efs_test_run_for(100);
		view("n1", &v);
	}
	cr_assert_eq(v.intents, 0);
	cr_assert_eq(publish(a, s, NULL, &more), 0);
	for (int i = 0; i < 50 && (v.intents || v.free_sum != total); i++) {
		efs_test_run_for(100);
		view("n1", &v);
	}
	cr_assert_eq(v.free_sum, total);
	alloc_leave(a);
	efs_runs_done(&got);
	efs_runs_done(&more);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

#if EFS_FAULT_HOOKS
Test(alloc, unknown_outcome_rereads_maps)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct efs_alloc_txn *t = NULL;
	struct efs_etcd_txn *et = NULL;
	struct efs_runs got = {0}, more = {0};
	struct txn_ctx x = {0};
	struct agview v;
	uint64_t total;

	layout_init(64ull << 20);
	total = efs_layout_total_blocks(&lay);
	s = session("n1");
	a = alloc_start(s, 2);
	cr_assert_eq(efs_alloc_get(a, 10, 0, 0, &got, cb_done, NULL), 1);
	cr_assert_eq(efs_alloc_txn_begin(a, &t, cb_done, NULL), 1);
	cr_assert_eq(efs_alloc_txn_use(t, &got), 0);
	cr_assert_eq(efs_etcd_txn_new(&et, 0), 0);
	cr_assert_eq(efs_session_guard(s, et), 0);
	cr_assert_eq(efs_alloc_txn_build(t, et), 0);
	/* Applied by etcd, reply lost. */
	efs_etcd_fault_drop_reply(c, EFS_ETCD_TXN, 1);
	cr_assert_eq(efs_etcd_txn(c, efs_etcd_txn_request(et), NULL, txn_cb, &x), 0);
	efs_etcd_txn_free(et);
	cr_assert(efs_test_run_until(&x.done, 10000));
	cr_assert_not(x.ok);
	efs_test_pb_free(x.resp);
	efs_alloc_txn_end(t, EFS_ALLOC_UNKNOWN, 0);
	view("n1", &v);
	cr_assert_eq(v.free_sum, total - 10);
	/* The caller found it applied (no usable revision). */
	efs_alloc_txn_end(t, EFS_ALLOC_COMMITTED, 0);
	/* The next contribution is built from re-read maps, and commits. */
	cr_assert_eq(efs_alloc_get(a, 5, 0, 0, &more, cb_done, NULL), 1);
	cr_assert_eq(publish(a, s, &more, NULL), 0);
	view("n1", &v);
	cr_assert_eq(v.free_sum, total - 15);
	cr_assert_eq(publish(a, s, NULL, &got), 0);
	cr_assert_eq(publish(a, s, NULL, &more), 0);
	view("n1", &v);
	cr_assert_eq(v.free_sum, total);
	alloc_leave(a);
	efs_runs_done(&got);
	efs_runs_done(&more);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}
#endif

/* ---- The mounted filesystem ---- */

static struct efs_test_fs mfs;

static void mount_fini(void)
{
	efs_test_fs_stop(&mfs);
}

TestSuite(space_mount, .fini = mount_fini, .timeout = 240);

/* Sum of ag/<g>/free, the groups whose owner names |node| and the free
 * intents (|intents| may be NULL). */
static uint64_t mnt_view2(const char *node, uint32_t *owned, size_t *intents)
{
	Etcdserverpb__RangeResponse *rr;
	Etcdserverpb__TxnResponse *resp;
	struct efs_etcd_opts eo = {0};
	struct efs_meta_ns mns;
	struct efs_meta_range rg;
	struct efs_etcd_txn *t;
	struct efs_etcd_sync *s;
	uint64_t sum = 0;

	eo.endpoints = mfs.endpoints;
	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&mns, "testfs"), 0);
	cr_assert_eq(efs_meta_range_family(&mns, EFS_META_K_AG_OWNER, &rg), 0);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
					rg.end.buf, rg.end.len),
		     0);
	cr_assert_eq(efs_etcd_sync_txn(s, efs_etcd_txn_request(t), &resp), 0);
	efs_etcd_txn_free(t);
	cr_assert_eq(efs_etcd_txn_resp_range(resp, 0, &rr), 0);
	*owned = 0;
	if (intents)
		*intents = 0;
	for (size_t i = 0; i < rr->n_kvs; i++) {
		struct efs_meta_key_info ki;
		const Mvccpb__KeyValue *kv = rr->kvs[i];

		cr_assert_eq(efs_meta_key_parse(&mns, kv->key.data, kv->key.len, &ki), 0);
		if (ki.family == EFS_META_K_AG_FREE) {
			Etcfs__AgFree *af;

			cr_assert_eq(efs_meta_ag_free_decode(kv->value.data, kv->value.len, &af,
							     NULL),
				     0);
			sum += af->free_blocks;
			efs_meta_record_free(af);
		} else if (ki.family == EFS_META_K_AG_OWNER) {
			Etcfs__AgOwner *ow;

			cr_assert_eq(efs_meta_ag_owner_decode(kv->value.data, kv->value.len, &ow,
							      NULL),
				     0);
			*owned += !strcmp(ow->node, node);
			efs_meta_record_free(ow);
		} else if (ki.family == EFS_META_K_FREE_INTENT && intents) {
			(*intents)++;
		}
	}
	efs_test_pb_free(resp);
	efs_etcd_sync_free(s);
	return sum;
}

static uint64_t mnt_view(const char *node, uint32_t *owned)
{
	return mnt_view2(node, owned, NULL);
}

/* Keys of the rc/ (or o/) family. */
static size_t mnt_count(enum efs_meta_family fam)
{
	Etcdserverpb__RangeResponse *rr;
	Etcdserverpb__TxnResponse *resp;
	struct efs_etcd_opts eo = {0};
	struct efs_meta_ns mns;
	struct efs_meta_range rg;
	struct efs_etcd_txn *t;
	struct efs_etcd_sync *s;
	size_t n;

	eo.endpoints = mfs.endpoints;
	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&mns, "testfs"), 0);
	cr_assert_eq(efs_meta_range_family(&mns, fam, &rg), 0);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, rg.key.buf, rg.key.len,
					rg.end.buf, rg.end.len),
		     0);
	cr_assert_eq(efs_etcd_sync_txn(s, efs_etcd_txn_request(t), &resp), 0);
	efs_etcd_txn_free(t);
	cr_assert_eq(efs_etcd_txn_resp_range(resp, 0, &rr), 0);
	n = rr->n_kvs;
	efs_test_pb_free(resp);
	efs_etcd_sync_free(s);
	return n;
}

static void write_file(const char *path, size_t bytes, bool keep_open, int *fdp)
{
	char buf[65536];
	int fd = open(path, O_CREAT | O_RDWR | O_TRUNC, 0644);

	cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
	memset(buf, 'x', sizeof(buf));
	for (size_t done = 0; done < bytes; done += sizeof(buf))
		cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	cr_assert_eq(fsync(fd), 0);
	if (keep_open)
		*fdp = fd;
	else
		close(fd);
}

/* True when the daemon's log holds |needle|. */
static bool log_has(const char *needle)
{
	char line[1024];
	bool found = false;
	FILE *fp = fopen(mfs.log, "r");
	/* EFS_TEST_SPACE_LOG=<file>: the space lines of the daemon's log go there. */
	const char *dump = getenv("EFS_TEST_SPACE_LOG");
	FILE *out = dump ? fopen(dump, "a") : NULL;

	cr_assert(fp, "open %s", mfs.log);
	while (fgets(line, sizeof(line), fp)) {
		if (strstr(line, needle))
			found = true;
		if (out && (strstr(line, "alloc:") || strstr(line, "reclaim:")))
			fprintf(out, "%s", line);
	}
	fclose(fp);
	if (out)
		fclose(out);
	return found;
}

/* Waits until the sum of free counts is |want| and no rc/ key is left. */
static bool wait_space(uint64_t want, uint64_t *now)
{
	uint32_t owned;

	for (int i = 0; i < 100; i++) {
		*now = mnt_view("node1", &owned);
		if (*now == want && mnt_count(EFS_META_K_RECLAIM) == 0)
			return true;
		usleep(100 * 1000);
	}
	return false;
}

Test(space_mount, owns_groups_and_reclaims_unlinked)
{
	struct efs_test_fs_opts o = {.image_size = 64ull << 20, .metrics = true};
	char path[400];
	uint64_t mkfs_free, now;
	uint32_t owned;

	efs_test_fs_start(&mfs, &o);
	mkfs_free = mnt_view("node1", &owned);
	cr_assert_geq(owned, 1, "no group owned after mount");
	snprintf(path, sizeof(path), "%s/f", mfs.mnt);
	write_file(path, 4 << 20, false, NULL);
	now = mnt_view("node1", &owned);
	cr_assert_lt(now, mkfs_free, "published blocks are not used in the maps");
	cr_assert_eq(unlink(path), 0);
	cr_assert(wait_space(mkfs_free, &now), "free %" PRIu64 ", mkfs %" PRIu64, now, mkfs_free);
	cr_assert_geq(efs_test_fs_metric(&mfs, "etcfs_space_groups_owned"), 1);
	cr_assert_geq(efs_test_fs_metric(&mfs, "etcfs_space_claims_total"), 1);
	cr_assert_eq(efs_test_fs_metric(&mfs, "etcfs_space_double_frees_total"), 0);
	cr_assert_geq(efs_test_fs_metric(&mfs, "etcfs_etcd_txns_total{origin=\"space\","
					       "outcome=\"ok\"}"),
		      1);
	cr_assert_geq(efs_test_fs_metric(&mfs, "etcfs_etcd_txns_total{origin=\"reclaim\","
					       "outcome=\"ok\"}"),
		      1);
	/* A clean unmount gives the groups back (and exits 0). */
	efs_test_fs_unmount(&mfs);
	now = mnt_view("node1", &owned);
	cr_assert_eq(owned, 0);
	cr_assert_eq(now, mkfs_free);
	cr_assert_not(log_has("DOUBLE FREE"));
	cr_assert_not(log_has("Sanitizer"));
}

Test(space_mount, orphan_reclaimed_after_kill)
{
	struct efs_test_fs_opts o = {.image_size = 64ull << 20};
	char path[400];
	uint64_t mkfs_free, now;
	uint32_t owned;
	int fd = -1;

	efs_test_fs_start(&mfs, &o);
	mkfs_free = mnt_view("node1", &owned);
	snprintf(path, sizeof(path), "%s/orphan", mfs.mnt);
	write_file(path, 2 << 20, true, &fd);
	cr_assert_eq(unlink(path), 0);
	cr_assert_eq(mnt_count(EFS_META_K_ORPHAN), 1);
	efs_test_fs_kill(&mfs);
	close(fd);
	efs_test_fs_mount(&mfs, NULL);
	cr_assert(wait_space(mkfs_free, &now), "free %" PRIu64 ", mkfs %" PRIu64, now, mkfs_free);
	cr_assert_eq(mnt_count(EFS_META_K_ORPHAN), 0);
	cr_assert(log_has("reclaim: orphan inode"), "the orphan was not adopted by the reclaimer");
	efs_test_fs_unmount(&mfs);
	cr_assert_not(log_has("DOUBLE FREE"));
	cr_assert_not(log_has("Sanitizer"));
}

/*
 * kill -9 with files spread over more groups than a mount claims at first:
 * after the restart (the takeover revoked the old lease, so the old owner
 * keys are gone) deleting everything frees blocks in groups nobody owns.
 * Their free intents are claimed and folded: within 15 s (the default
 * sweep is 5 s) the free counts are mkfs's and no intent is left.
 */
Test(space_mount, intents_of_unowned_groups_folded_after_kill)
{
	struct efs_test_fs_opts o = {.image_size = 64ull << 20};
	char path[400];
	uint64_t mkfs_free, now = 0;
	uint32_t owned;
	size_t intents = 0, rc = 0;
	bool ok = false;
	int nfiles = 8;

	efs_test_fs_start(&mfs, &o);
	mkfs_free = mnt_view("node1", &owned);
	for (int i = 0; i < nfiles; i++) {
		snprintf(path, sizeof(path), "%s/f%d", mfs.mnt, i);
		write_file(path, 1 << 20, false, NULL);
	}
	now = mnt_view("node1", &owned);
	cr_assert_lt(now, mkfs_free);
	/* 8 MiB over 1 MiB groups: more groups than the 2 of a start. */
	cr_assert_geq(owned, 4, "only %u groups owned before the kill", owned);
	efs_test_fs_kill(&mfs);
	efs_test_fs_mount(&mfs, NULL);
	for (int i = 0; i < nfiles; i++) {
		snprintf(path, sizeof(path), "%s/f%d", mfs.mnt, i);
		cr_assert_eq(unlink(path), 0, "unlink %s: %s", path, strerror(errno));
	}
	for (int i = 0; i < 150 && !ok; i++) {
		now = mnt_view2("node1", &owned, &intents);
		rc = mnt_count(EFS_META_K_RECLAIM);
		ok = now == mkfs_free && intents == 0 && rc == 0;
		if (!ok)
			usleep(100 * 1000);
	}
	cr_assert(ok, "after 15 s: free %" PRIu64 " (mkfs %" PRIu64 "), %zu intents, %zu rc/",
		  now, mkfs_free, intents, rc);
	efs_test_fs_unmount(&mfs);
	now = mnt_view2("node1", &owned, &intents);
	cr_assert_eq(owned, 0);
	cr_assert_eq(now, mkfs_free);
	cr_assert_eq(intents, 0);
	cr_assert_not(log_has("DOUBLE FREE"));
	cr_assert_not(log_has("Sanitizer"));
}

/* ---- Dead-node grace ---- */

/* The group whose owner key names |node| (the first), or UINT32_MAX. */
static uint32_t owned_group(const char *node)
{
	struct agview v;

	view(node, &v);
	for (uint32_t g = 0; g < lay.ag_count; g++)
		if (v.owned_by[g])
			return g;
	return UINT32_MAX;
}

/* A node dies: its lease goes without a leave (what kill -9 and the TTL
 * do), and its allocator and session are dropped. */
static void die(struct efs_alloc *a, struct efs_session *s)
{
	lease_revoke(efs_session_lease_id(s));
	efs_alloc_free(a);
	efs_session_free(s);
}

/* efs_alloc_get of |n| blocks into |got|, waited for: its status. */
static int get_waited(struct efs_alloc *a, uint64_t n, struct efs_runs *got)
{
	struct done d = {0};
	int r = efs_alloc_get(a, n, 0, 0, got, cb_done, &d);

	if (r == 0) {
		cr_assert(efs_test_run_until(&d.done, 10000));
		r = d.status;
	}
	return r;
}

/*
 * Three groups of 256 blocks: n2 owns one (returned) and dies; then n1,
 * with a grace of |grace| ms, wants every group and gets the two others,
 * not n2's, whose space it counts as waiting out the grace.
 */
static uint32_t n2_dies_then_n1_starts(uint32_t grace, struct efs_session **s1,
				       struct efs_alloc **a1)
{
	struct efs_session *s2;
	struct efs_alloc *a2;
	struct efs_alloc_stats st;
	struct agview v;
	uint32_t gd;

	layout_init(4ull << 20);
	cr_assert_eq(lay.ag_count, 3);
	s2 = session("n2");
	a2 = alloc_start(s2, 1);
	gd = owned_group("n2");
	cr_assert_lt(gd, lay.ag_count);
	die(a2, s2);
	grace_ms = grace;
	*s1 = session("n1");
	*a1 = alloc_start(*s1, 3);
	view("n1", &v);
	cr_assert_eq(v.nowned, 2);
	cr_assert_not(v.owned_by[gd], "a dead node's group was claimed before the grace");
	efs_alloc_get_stats(*a1, &st);
	cr_assert_eq(st.grace_blocks, efs_layout_group_blocks(&lay, gd));
	return gd;
}

/* Past its grace: a get larger than n1's two groups claims n2's group
 * |gd| for it; then n1 leaves and the test ends. */
static void claimed_for_n1_then_leave(struct efs_session *s1, struct efs_alloc *a1, uint32_t gd)
{
	struct efs_alloc_stats st;
	struct efs_runs got = {0};
	struct agview v;
	int r;

	r = get_waited(a1, 600, &got);
	cr_assert_geq(r, 0, "get after the grace: %d", r);
	cr_assert_eq(efs_runs_total(&got), 600);
	view("n1", &v);
	cr_assert(v.owned_by[gd], "the dead node's group was not claimed after the grace");
	efs_alloc_get_stats(a1, &st);
	cr_assert_eq(st.grace_blocks, 0);
	efs_alloc_unuse(a1, &got);
	efs_runs_done(&got);
	alloc_leave(a1);
	session_end(s1);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

Test(alloc, dead_nodes_group_waits_out_the_grace)
{
	struct efs_session *s1;
	struct efs_alloc *a1;
	struct efs_runs got = {0};
	uint32_t gd;
	int r;

	gd = n2_dies_then_n1_starts(3000, &s1, &a1);
	/* An allocation larger than the two groups: ENOSPC now (at once, or
	 * after a claim round that finds nothing it may take)... */
	r = get_waited(a1, 600, &got);
	cr_assert_eq(r, -ENOSPC, "get before the grace: %d", r);
	/* ...and once the grace has passed, the group is claimed for it. */
	efs_test_run_for(3200);
	claimed_for_n1_then_leave(s1, a1, gd);
}

/*
 * A group n1 saw without an owner has had an owner since, unseen (its
 * owner key came and went between two of n1's reads, as when a node
 * claims a dead node's group back, writes into it and is killed or
 * evicted soon after): only its ag/<g>/free changed. The grace counts
 * again from the read that shows that write, not from the first time n1
 * saw the group ownerless (the cluster's evict check saw a peer claim
 * such a group two seconds after the eviction, with a 5 s grace).
 */
Test(alloc, a_group_owned_again_unseen_waits_a_new_grace)
{
	Etcfs__AgLastOwner lo = ETCFS__AG_LAST_OWNER__INIT;
	char n3[] = "n3";
	struct efs_session *s1;
	struct efs_alloc *a1;
	struct efs_alloc_stats st;
	struct efs_runs got = {0};
	struct efs_meta_key k;
	ProtobufCBinaryData b;
	Etcfs__AgFree af;
	struct agview v;
	uint32_t gd;
	int r;

	gd = n2_dies_then_n1_starts(2000, &s1, &a1);
	/* n1's grace for gd passes... */
	efs_test_run_for(2300);
	/* ...and n3 has owned gd meanwhile and published into it: its last
	 * write names it, not released (it may still have writes queued). */
	efs_layout_ag_free(&lay, gd, &af);
	lo.node = n3;
	lo.session_generation = 1;
	lo.released = false;
	af.last = &lo;
	cr_assert_eq(efs_meta_pack(&af.base, &b), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, gd, EFS_META_K_AG_FREE, &k), 0);
	cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, b.data, b.len, 0, NULL), 0);
	efs_mem_free(b.data);
	/* More than n1's two groups: gd must not be claimed for it yet. */
	r = get_waited(a1, 600, &got);
	cr_assert_eq(r, -ENOSPC, "get right after n3's write: %d", r);
	view("n1", &v);
	cr_assert_not(v.owned_by[gd], "a group n3 wrote just now was claimed within the grace");
	efs_alloc_get_stats(a1, &st);
	cr_assert_eq(st.grace_blocks, efs_layout_group_blocks(&lay, gd));
	/* A whole grace after that write, it is. */
	efs_test_run_for(2300);
	claimed_for_n1_then_leave(s1, a1, gd);
}

Test(alloc, clean_leave_groups_claimable_at_once)
{
	struct efs_session *s1, *s2;
	struct efs_alloc *a1, *a2;
	struct agview v;
	uint32_t gl;

	layout_init(4ull << 20);
	s2 = session("n2");
	a2 = alloc_start(s2, 1);
	gl = owned_group("n2");
	cr_assert_lt(gl, lay.ag_count);
	alloc_leave(a2);
	session_end(s2);

	grace_ms = 600000; /* nothing here may wait for it */
	s1 = session("n1");
	a1 = alloc_start(s1, 3);
	view("n1", &v);
	cr_assert_eq(v.nowned, 3);
	cr_assert(v.owned_by[gl], "a group handed back at a clean leave was not claimed");
	alloc_leave(a1);
	session_end(s1);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}

/* Puts ag/<g>/free as a previous process of n1 left it: |pid| on this
 * machine ("m1", as session() says), this boot and pid namespace. */
static void put_last_owner(uint32_t g, int32_t pid)
{
	Etcfs__AgFree af = ETCFS__AG_FREE__INIT;
	Etcfs__AgLastOwner lo = ETCFS__AG_LAST_OWNER__INIT;
	struct efs_meta_key k;
	ProtobufCBinaryData b;
	char boot[64] = "";
	struct stat sb;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	cr_assert(f);
	cr_assert(fgets(boot, sizeof(boot), f));
	fclose(f);
	boot[strcspn(boot, "\n")] = '\0';
	cr_assert_eq(stat("/proc/self/ns/pid", &sb), 0);
	lo.node = (char *)"n1";
	lo.session_generation = 1;
	lo.machine_id = (char *)"m1";
	lo.boot_id = boot;
	lo.pid_ns = sb.st_ino;
	lo.pid = pid;
	af.free_blocks = efs_layout_group_blocks(&lay, g);
	af.last = &lo;
	cr_assert_eq(efs_meta_pack(&af.base, &b), 0);
	cr_assert_eq(efs_meta_key_ag(&ns, g, EFS_META_K_AG_FREE, &k), 0);
	cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, b.data, b.len, 0, NULL), 0);
	efs_mem_free(b.data);
}

Test(alloc, restart_takes_its_own_groups_back_once_its_old_process_is_gone)
{
	struct efs_session *s;
	struct efs_alloc *a;
	struct agview v;
	pid_t dead;
	int st;

	layout_init(4ull << 20);
	grace_ms = 600000;
	/* A process of n1 that still runs (our parent) last owned group 0: a
	 * restart must not take it. */
	put_last_owner(0, (int32_t)getppid());
	s = session("n1");
	a = alloc_start(s, 3);
	view("n1", &v);
	cr_assert_eq(v.nowned, 2);
	cr_assert_not(v.owned_by[0], "a group of a running process of this node was claimed");
	alloc_leave(a);
	session_end(s);

	/* Its last owner is a process that has exited: claimed at once. */
	dead = fork();
	cr_assert_geq(dead, 0);
	if (dead == 0)
		_exit(0);
	cr_assert_eq(waitpid(dead, &st, 0), dead);
	put_last_owner(0, (int32_t)dead);
	s = session("n1");
	a = alloc_start(s, 3);
	view("n1", &v);
	cr_assert_eq(v.nowned, 3);
	cr_assert(v.owned_by[0], "this node's own group was not taken back after a restart");
	alloc_leave(a);
	session_end(s);
	efs_test_client_free(c);
	c = NULL;
	efs_test_assert_no_leaks();
}
