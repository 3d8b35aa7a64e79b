/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Node sessions against a real etcd: registration and the node record,
 * generations across sessions, takeover after a kill -9, refusal of a node
 * id in use, the session guard, suspension and loss with automatic
 * re-registration, the quorum-loss bound, and a clean leave.
 */
#include <errno.h>
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
#include "harness.h"
#include "lock/session.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;
static struct efs_etcd *c;
static struct efs_etcd_sync *sc;
static struct efs_meta_ns ns;

static void setup(void)
{
	struct efs_harness_opts o = {.members = 1};
	struct efs_etcd_opts eo = {0};
	int r;

	r = efs_harness_start(&h, &o);
	cr_assert_eq(r, 0, "harness start: %d", r);
	efs_test_loop_init();
	c = efs_test_client_new(efs_harness_endpoints(h));
	eo.endpoints = efs_harness_endpoints(h);
	cr_assert_eq(efs_etcd_sync_new(&sc, &eo), 0);
	cr_assert_eq(efs_meta_ns_init(&ns, "sess"), 0);
}

/* Each test calls it before its leak check, and .fini again. */
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

TestSuite(session, .init = setup, .fini = teardown, .timeout = 60);

/* ---- Helpers ---- */

struct sctx {
	bool done;
	int status;
	bool left;
	int leave_status;
	enum efs_session_state states[64];
	int nstates;
};

static void on_state(struct efs_session *s, enum efs_session_state old,
		     enum efs_session_state new_state, void *arg)
{
	struct sctx *x = arg;

	(void)s;
	(void)old;
	if (x->nstates < 64)
		x->states[x->nstates++] = new_state;
}

static void on_done(struct efs_session *s, int status, void *arg)
{
	struct sctx *x = arg;

	(void)s;
	x->done = true;
	x->status = status;
}

static void on_left(struct efs_session *s, int status, void *arg)
{
	struct sctx *x = arg;

	(void)s;
	x->left = true;
	x->leave_status = status;
}

static int start_session(struct efs_session **ret, const char *node, const char *machine,
			 uint32_t quorum_loss_ms, struct sctx *x)
{
	struct efs_session_opts o = {
		.ns = &ns,
		.node = node,
		.machine_id = machine,
		.hostname = "testhost",
		.metrics_addr = "127.0.0.1:9999",
		.ttl_s = 2,
		.quorum_loss_ms = quorum_loss_ms,
	};
	int r;

	*x = (struct sctx){0};
	r = efs_session_start(ret, &efs_test_loop, c, &o, on_state, on_done, x);
	cr_assert_eq(r, 0, "start: %d", r);
	cr_assert_not(x->done, "start callback ran inline");
	cr_assert(efs_test_run_until(&x->done, 15000), "start timed out");
	return x->status;
}

static void leave_session(struct efs_session *s, struct sctx *x)
{
	cr_assert_eq(efs_session_leave(s, on_left, x), 0);
	cr_assert_not(x->left);
	cr_assert(efs_test_run_until(&x->left, 10000), "leave timed out");
	cr_assert_eq(x->leave_status, 0, "leave: %d", x->leave_status);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_CLOSED);
}

static Mvccpb__KeyValue *get_key(const struct efs_meta_key *k)
{
	Mvccpb__KeyValue *kv = NULL;
	int r = efs_etcd_sync_get(sc, k->buf, k->len, &kv, NULL);

	if (r == -ENOENT)
		return NULL;
	cr_assert_eq(r, 0, "get: %d", r);
	return kv;
}

static Etcfs__NodeInfo *get_nodeinfo(const char *node, int64_t *ret_lease)
{
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv;
	Etcfs__NodeInfo *ni = NULL;

	cr_assert_eq(efs_meta_key_node(&ns, node, &k), 0);
	kv = get_key(&k);
	if (!kv)
		return NULL;
	cr_assert_eq(efs_meta_nodeinfo_decode(kv->value.data, kv->value.len, &ni, NULL), 0);
	if (ret_lease)
		*ret_lease = kv->lease;
	efs_test_pb_free(kv);
	return ni;
}

static uint64_t get_generation(const char *node, int64_t *ret_mod)
{
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv;
	Etcfs__Generation *g = NULL;
	uint64_t gen;

	cr_assert_eq(efs_meta_key_gen(&ns, node, &k), 0);
	kv = get_key(&k);
	cr_assert_not_null(kv, "no g/ key");
	cr_assert_eq(efs_meta_generation_decode(kv->value.data, kv->value.len, &g, NULL), 0);
	gen = g->generation;
	if (ret_mod)
		*ret_mod = kv->mod_revision;
	efs_meta_record_free(g);
	efs_test_pb_free(kv);
	return gen;
}

static void put_nodeinfo_ex(const char *node, const char *machine, const char *boot,
			    uint64_t pidns, int32_t pid, uint64_t pid_start, int64_t lease)
{
	Etcfs__NodeInfo ni = ETCFS__NODE_INFO__INIT;
	ProtobufCBinaryData v;
	struct efs_meta_key k;

	ni.machine_id = (char *)machine;
	ni.boot_id = (char *)boot;
	ni.pid_start = pid_start;
	ni.pid_ns = pidns;
	ni.hostname = (char *)"otherhost";
	ni.pid = pid;
	ni.version = (char *)"0";
	ni.lease_id = lease;
	cr_assert_eq(efs_meta_pack(&ni.base, &v), 0);
	cr_assert_eq(efs_meta_key_node(&ns, node, &k), 0);
	cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, v.data, v.len, lease, NULL), 0);
	efs_mem_free(v.data);
}

/* A record as written by a version without boot id and start time. */
static void put_nodeinfo(const char *node, const char *machine, int32_t pid, int64_t lease)
{
	put_nodeinfo_ex(node, machine, "", 0, pid, 0, lease);
}

/* This host's boot id (the test fails when it cannot be read). */
static void my_boot_id(char *buf, size_t size)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	size_t n;

	cr_assert_not_null(f);
	n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = '\0';
	buf[strcspn(buf, "\r\n")] = '\0';
	cr_assert_gt(strlen(buf), 0);
}

/* Our pid namespace's inode. */
static uint64_t my_pid_ns(void)
{
	struct stat st;

	cr_assert_eq(stat("/proc/self/ns/pid", &st), 0);
	return (uint64_t)st.st_ino;
}

/* Field 22 of /proc/<pid>/stat. */
static uint64_t start_time_of(int pid)
{
	char path[64], buf[1024];
	unsigned long long v = 0;
	const char *p;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "re");
	cr_assert_not_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	p = strrchr(buf, ')');
	cr_assert_not_null(p);
	cr_assert_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
				    "%*d %*d %*d %*d %llu",
			    &v),
		     1);
	cr_assert_gt(v, 0);
	return (uint64_t)v;
}

static int64_t grant_lease(int64_t ttl)
{
	Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	Etcdserverpb__LeaseGrantResponse *resp = NULL;
	int64_t id;

	req.ttl = ttl;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_GRANT, &req.base,
					(ProtobufCMessage **)&resp, NULL),
		     0);
	id = resp->id;
	efs_test_pb_free(resp);
	return id;
}

static void revoke_lease(int64_t id)
{
	Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;

	req.id = id;
	cr_assert_eq(efs_etcd_sync_call(sc, EFS_ETCD_LEASE_REVOKE, &req.base, NULL, NULL), 0);
}

static int32_t dead_pid(void)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0)
		_exit(0);
	cr_assert_eq(waitpid(pid, NULL, 0), pid);
	return (int32_t)pid;
}

static bool saw_state(const struct sctx *x, enum efs_session_state st)
{
	for (int i = 0; i < x->nstates; i++)
		if (x->states[i] == st)
			return true;
	return false;
}

static bool state_is(struct efs_session *s, enum efs_session_state st, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (efs_session_state(s) != st && efs_test_now_ms() < end)
		efs_test_run_for(10);
	return efs_session_state(s) == st;
}

struct wres {
	bool done;
	int status;
	bool changed;
	struct efs_session_waiter w;
};

static void on_wait(struct efs_session_waiter *w, int status, bool generation_changed)
{
	struct wres *x = w->arg;

	x->done = true;
	x->status = status;
	x->changed = generation_changed;
}

/* Runs a guarded txn that puts key "k"; returns whether it succeeded. */
static bool guarded_put(struct efs_etcd_txn *t)
{
	Etcdserverpb__TxnResponse *resp = NULL;
	bool ok;

	cr_assert_eq(efs_etcd_sync_txn(sc, efs_etcd_txn_request(t), &resp), 0);
	ok = resp->succeeded;
	efs_test_pb_free(resp);
	return ok;
}

/* ---- Tests ---- */

Test(session, registers_publishes_node_record_and_leaves_cleanly)
{
	struct efs_session *s = NULL;
	struct efs_session_stats st;
	Etcfs__NodeInfo *ni;
	int64_t lease = 0, mod = 0;
	struct sctx x;

	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), 0);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_ACTIVE);
	cr_assert(efs_session_is_active(s));
	cr_assert_str_eq(efs_session_node(s), "node1");
	cr_assert_eq(efs_session_generation(s), 1);
	cr_assert_gt(efs_session_lease_id(s), 0);
	cr_assert_gt(efs_session_deadline_ns(s), efs_clock_mono_ns());

	ni = get_nodeinfo("node1", &lease);
	cr_assert_not_null(ni);
	cr_assert_str_eq(ni->machine_id, "machineA");
	cr_assert_str_eq(ni->hostname, "testhost");
	cr_assert_str_eq(ni->metrics_addr, "127.0.0.1:9999");
	cr_assert_eq(ni->pid, getpid());
	cr_assert_str_eq(ni->version, ETCFS_VERSION);
	cr_assert_eq(ni->session_generation, 1);
	cr_assert_eq(ni->lease_id, efs_session_lease_id(s));
	cr_assert_gt(ni->started_ns, 0);
	cr_assert_gt(ni->wall_clock_ns, 0);
	{
		char boot[128];

		my_boot_id(boot, sizeof(boot));
		cr_assert_str_eq(ni->boot_id, boot);
		cr_assert_eq(ni->pid_start, start_time_of(getpid()));
		cr_assert_eq(ni->pid_ns, my_pid_ns());
	}
	/* The granted TTL of the lease (the test asks for etcd's floor). */
	cr_assert_geq(efs_session_ttl_s(s), 2);
	cr_assert_eq(lease, efs_session_lease_id(s), "n/ key not on the session lease");
	efs_meta_record_free(ni);
	cr_assert_eq(get_generation("node1", &mod), 1);
	cr_assert_eq(mod, efs_session_gen_mod_revision(s));

	/* Renewals keep it active well past the TTL. */
	efs_test_run_for(2600);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_ACTIVE);
	efs_session_get_stats(s, &st);
	cr_assert_eq(st.registrations, 1);
	cr_assert_eq(st.suspends, 0);
	cr_assert_gt(st.renew_max_gap_ns, 0);
	cr_assert_lt(st.renew_max_gap_ns, 1000 * EFS_NSEC_PER_MSEC);

	leave_session(s, &x);
	cr_assert(saw_state(&x, EFS_SESSION_CLOSED));
	cr_assert_null(get_nodeinfo("node1", NULL), "n/ key survived the leave");
	cr_assert_eq(get_generation("node1", NULL), 1, "g/ is permanent");
	/* Waiting on a closed session: -ESHUTDOWN, later. */
	{
		struct wres w = {0};

		cr_assert_eq(efs_session_wait(s, &w.w, on_wait, &w), 0);
		cr_assert_not(w.done);
		cr_assert(efs_test_run_until(&w.done, 1000));
		cr_assert_eq(w.status, -ESHUTDOWN);
	}
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, generation_grows_with_each_session)
{
	struct efs_session *s1 = NULL, *s2 = NULL;
	int64_t mod1, mod2;
	struct sctx x1, x2;

	cr_assert_eq(start_session(&s1, "node1", "machineA", 0, &x1), 0);
	cr_assert_eq(efs_session_generation(s1), 1);
	mod1 = efs_session_gen_mod_revision(s1);
	leave_session(s1, &x1);
	s1 = efs_session_free(s1);

	cr_assert_eq(start_session(&s2, "node1", "machineA", 0, &x2), 0);
	cr_assert_eq(efs_session_generation(s2), 2);
	mod2 = efs_session_gen_mod_revision(s2);
	cr_assert_gt(mod2, mod1);
	cr_assert_eq(get_generation("node1", NULL), 2);
	leave_session(s2, &x2);
	s2 = efs_session_free(s2);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, restart_after_kill_9_takes_over)
{
	struct efs_session *s1 = NULL, *s2 = NULL;
	int64_t old_lease, lease = 0;
	uint64_t t0;
	struct sctx x1, x2;
	Etcfs__NodeInfo *ni;

	/* A daemon that dies without leaving: its lease lives on. */
	cr_assert_eq(start_session(&s1, "node1", "machineA", 0, &x1), 0);
	old_lease = efs_session_lease_id(s1);
	s1 = efs_session_free(s1);
	/* Its record names a pid that is no longer running on this machine. */
	put_nodeinfo("node1", "machineA", dead_pid(), old_lease);

	t0 = efs_test_now_ms();
	cr_assert_eq(start_session(&s2, "node1", "machineA", 0, &x2), 0);
	/* It revoked the old lease instead of waiting for it to expire. */
	cr_assert_lt(efs_test_now_ms() - t0, 1500);
	cr_assert_eq(efs_session_generation(s2), 2);
	cr_assert_neq(efs_session_lease_id(s2), old_lease);
	ni = get_nodeinfo("node1", &lease);
	cr_assert_not_null(ni);
	cr_assert_eq(ni->pid, getpid());
	cr_assert_eq(lease, efs_session_lease_id(s2));
	efs_meta_record_free(ni);
	leave_session(s2, &x2);
	s2 = efs_session_free(s2);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, takeover_checks_boot_id_pid_namespace_and_start_time)
{
	struct efs_session *s = NULL;
	int64_t lease = grant_lease(30), lease2 = 0;
	uint64_t init_start = start_time_of(1), pidns = my_pid_ns();
	char boot[128];
	struct sctx x;

	my_boot_id(boot, sizeof(boot));
	/* Same machine id, another boot id: another container of the same
	 * image (its own pid namespace) or host; a pid dead here says
	 * nothing about it. */
	put_nodeinfo_ex("node1", "machineA", "another-boot", pidns, dead_pid(), 1, lease);
	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), -EBUSY);
	s = efs_session_free(s);
	/* Same machine and boot, another pid namespace: a daemon in another
	 * container of the same image on this host. */
	put_nodeinfo_ex("node1", "machineA", boot, pidns + 1, dead_pid(), 1, lease);
	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), -EBUSY);
	s = efs_session_free(s);
	/* Same boot, the pid runs with the recorded start time: it lives. */
	put_nodeinfo_ex("node1", "machineA", boot, pidns, 1, init_start, lease);
	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), -EBUSY);
	s = efs_session_free(s);
	/* Same boot, the pid runs but started at another time: the pid was
	 * reused after the daemon died, so take over. */
	put_nodeinfo_ex("node1", "machineA", boot, pidns, 1, init_start + 1, lease);
	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), 0);
	cr_assert_eq(efs_session_generation(s), 1);
	cr_assert_neq(efs_session_lease_id(s), lease);
	{
		Etcfs__NodeInfo *ni = get_nodeinfo("node1", &lease2);

		cr_assert_not_null(ni);
		cr_assert_eq(ni->pid, getpid());
		cr_assert_eq(lease2, efs_session_lease_id(s));
		efs_meta_record_free(ni);
	}
	leave_session(s, &x);
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, node_id_in_use_is_refused)
{
	struct efs_session *s = NULL;
	int64_t lease = grant_lease(30);
	struct sctx x;

	/* A live pid of this machine (pid 1 always runs). */
	put_nodeinfo("node1", "machineA", 1, lease);
	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), -EBUSY);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_CLOSED);
	s = efs_session_free(s);
	/* Another machine, even with a pid that is dead here. */
	put_nodeinfo("node1", "machineB", dead_pid(), lease);
	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), -EBUSY);
	s = efs_session_free(s);
	/* Our own live session: the same process starting it twice. */
	revoke_lease(lease);
	{
		struct efs_session *s1 = NULL;
		struct sctx x1;

		cr_assert_eq(start_session(&s1, "node1", "machineA", 0, &x1), 0);
		cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), -EBUSY);
		s = efs_session_free(s);
		leave_session(s1, &x1);
		s1 = efs_session_free(s1);
	}
	/* Nothing of the refused sessions stayed: the generation is 1. */
	cr_assert_eq(get_generation("node1", NULL), 1);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, guard_fails_once_the_lease_is_revoked_then_reregisters)
{
	struct efs_session *s = NULL;
	struct efs_session_stats st;
	struct efs_etcd_txn *t = NULL;
	int64_t lease;
	struct sctx x;

	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), 0);
	lease = efs_session_lease_id(s);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), 0);
	cr_assert_eq(efs_etcd_txn_request(t)->n_compare, 2);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, "k", 1, "v", 1, 0), 0);
	cr_assert(guarded_put(t));

	revoke_lease(lease);
	cr_assert_not(guarded_put(t), "guard passed after the lease was revoked");
	t = efs_etcd_txn_free(t);

	/* The session learns it (the next renewal), re-registers by itself. */
	cr_assert(state_is(s, EFS_SESSION_GONE, 3000) || saw_state(&x, EFS_SESSION_GONE));
	cr_assert(state_is(s, EFS_SESSION_ACTIVE, 5000), "not re-registered");
	cr_assert(saw_state(&x, EFS_SESSION_GONE));
	cr_assert_eq(efs_session_generation(s), 2);
	cr_assert_neq(efs_session_lease_id(s), lease);
	efs_session_get_stats(s, &st);
	cr_assert_eq(st.losses, 1);
	cr_assert_eq(st.registrations, 2);
	/* The new guard works. */
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), 0);
	cr_assert_eq(efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, "k", 1, "v", 1, 0), 0);
	cr_assert(guarded_put(t));
	t = efs_etcd_txn_free(t);
	leave_session(s, &x);
	/* Not ACTIVE: no guard. */
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_session_guard(s, t), -EIO);
	t = efs_etcd_txn_free(t);
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, stuck_renewals_suspend_then_lose_and_reregister)
{
	struct efs_session *s = NULL;
	struct efs_session_stats st;
	struct wres w = {0};
	uint64_t t0;
	struct sctx x;

	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), 0);
	cr_assert_eq(efs_session_wait(s, &w.w, on_wait, &w), 1);
	efs_session_fault_pause(s, true);
	t0 = efs_test_now_ms();
	cr_assert(state_is(s, EFS_SESSION_SUSPENDED, 2000));
	/* TTL/2 after the last acknowledged renewal (sent up to TTL/6 before
	 * the pause). */
	cr_assert_lt(efs_test_now_ms() - t0, 1100);
	cr_assert_eq(efs_session_wait(s, &w.w, on_wait, &w), 0);
	cr_assert_not(efs_session_is_active(s));
	cr_assert(state_is(s, EFS_SESSION_EXPIRED, 2000) || saw_state(&x, EFS_SESSION_EXPIRED));
	/* etcd expires the lease; the session re-registers by itself. */
	cr_assert(efs_test_run_until(&w.done, 8000), "waiter not answered");
	cr_assert_eq(w.status, 0);
	cr_assert(w.changed, "generation_changed not reported");
	cr_assert_eq(efs_session_state(s), EFS_SESSION_ACTIVE);
	cr_assert(saw_state(&x, EFS_SESSION_GONE));
	cr_assert_eq(efs_session_generation(s), 2);
	cr_assert_eq(get_generation("node1", NULL), 2);
	efs_session_get_stats(s, &st);
	cr_assert_eq(st.suspends, 1);
	cr_assert_eq(st.losses, 1);
	cr_assert_eq(st.registrations, 2);
	cr_assert_eq(st.resumes, 0);
	/* The new lease is renewed (the pause was the old lease's). */
	efs_test_run_for(1500);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_ACTIVE);
	leave_session(s, &x);
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, short_stall_suspends_then_resumes_with_the_same_lease)
{
	struct efs_session *s = NULL;
	struct efs_session_stats st;
	struct wres w = {0};
	int64_t lease;
	struct sctx x;

	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), 0);
	lease = efs_session_lease_id(s);
	efs_session_fault_pause(s, true);
	cr_assert(state_is(s, EFS_SESSION_SUSPENDED, 2000));
	cr_assert_eq(efs_session_wait(s, &w.w, on_wait, &w), 0);
	/* Renewals flow again well before the lease could expire. */
	efs_session_fault_pause(s, false);
	cr_assert(efs_test_run_until(&w.done, 3000), "waiter not resumed");
	cr_assert_eq(w.status, 0);
	cr_assert_not(w.changed, "a resume is not a new generation");
	cr_assert_eq(efs_session_state(s), EFS_SESSION_ACTIVE);
	cr_assert_eq(efs_session_lease_id(s), lease);
	cr_assert_eq(efs_session_generation(s), 1);
	cr_assert_not(saw_state(&x, EFS_SESSION_GONE));
	efs_session_get_stats(s, &st);
	cr_assert_eq(st.suspends, 1);
	cr_assert_eq(st.resumes, 1);
	cr_assert_eq(st.losses, 0);
	efs_test_run_for(1200);
	cr_assert_eq(efs_session_state(s), EFS_SESSION_ACTIVE);
	leave_session(s, &x);
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, quorum_loss_fails_waiters_with_eio_then_recovers)
{
	struct efs_session *s = NULL;
	struct efs_session_stats st;
	struct wres w1 = {0}, w2 = {0}, w3 = {0};
	uint64_t t0;
	struct sctx x;

	cr_assert_eq(start_session(&s, "node1", "machineA", 1200, &x), 0);
	cr_assert_eq(efs_harness_pause(h, 0), 0);
	t0 = efs_test_now_ms();
	cr_assert(state_is(s, EFS_SESSION_SUSPENDED, 2000));
	cr_assert_eq(efs_session_wait(s, &w1.w, on_wait, &w1), 0);
	cr_assert(efs_test_run_until(&w1.done, 4000));
	cr_assert_eq(w1.status, -EIO);
	/* Suspension (<= ~1 s) + the 1.2 s bound. */
	cr_assert_geq(efs_test_now_ms() - t0, 1200);
	cr_assert_lt(efs_test_now_ms() - t0, 3000);
	/* Failing fast now: the next operation gets EIO at once. */
	t0 = efs_test_now_ms();
	cr_assert_eq(efs_session_wait(s, &w2.w, on_wait, &w2), 0);
	cr_assert_not(w2.done);
	cr_assert(efs_test_run_until(&w2.done, 500));
	cr_assert_eq(w2.status, -EIO);
	cr_assert_lt(efs_test_now_ms() - t0, 200);
	efs_session_get_stats(s, &st);
	cr_assert_eq(st.waits_failed, 2);

	/* etcd comes back: the session resumes or re-registers. */
	cr_assert_eq(efs_harness_resume(h, 0), 0);
	cr_assert(state_is(s, EFS_SESSION_ACTIVE, 10000), "no recovery after quorum returned");
	cr_assert_eq(efs_session_wait(s, &w3.w, on_wait, &w3), 1);
	leave_session(s, &x);
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}

Test(session, start_arguments_are_checked)
{
	struct efs_session *s = NULL;
	struct efs_session_opts o = {.ns = &ns, .node = "bad/node"};
	struct sctx x = {0};

	cr_assert_eq(efs_session_start(&s, &efs_test_loop, c, &o, NULL, on_done, &x), -EINVAL);
	o.node = "ok";
	o.ttl_s = 2;
	o.suspend_ms = 2000;
	cr_assert_eq(efs_session_start(&s, &efs_test_loop, c, &o, NULL, on_done, &x), -EINVAL);
	o.suspend_ms = 0;
	cr_assert_eq(efs_session_start(&s, &efs_test_loop, c, &o, NULL, NULL, &x), -EINVAL);
	cr_assert_null(s);
	cr_assert_str_eq(efs_session_state_name(EFS_SESSION_EXPIRED), "expired");
	teardown();
	efs_test_assert_no_leaks();
}

/*
 * A lost session must always be able to re-register, even when n/<node>
 * still holds a record this very session wrote, on a lease that etcd
 * still has (here: the session's lease is revoked and its exact record is
 * put back at once on another live lease, as if the old lease had
 * survived). The record is recognised as ours (pid, boot, pid namespace,
 * start times), its lease revoked, and the session registers again
 * instead of refusing with "node id in use" and closing for good.
 */
Test(session, own_earlier_record_does_not_block_reregistration)
{
	struct efs_session *s = NULL;
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv;
	Etcfs__NodeInfo *ni;
	int64_t lease, other, now_lease = 0;
	struct sctx x;

	cr_assert_eq(start_session(&s, "node1", "machineA", 0, &x), 0);
	lease = efs_session_lease_id(s);
	cr_assert_eq(efs_meta_key_node(&ns, "node1", &k), 0);
	kv = get_key(&k);
	cr_assert_not_null(kv);
	other = grant_lease(30);
	/* The session's loop does not run during these blocking calls. */
	revoke_lease(lease);
	cr_assert_eq(efs_etcd_sync_put(sc, k.buf, k.len, kv->value.data, kv->value.len, other,
				       NULL),
		     0);
	efs_test_pb_free(kv);

	cr_assert(state_is(s, EFS_SESSION_GONE, 3000) || saw_state(&x, EFS_SESSION_GONE),
		  "the revoked lease was not noticed");
	cr_assert(state_is(s, EFS_SESSION_ACTIVE, 5000), "not re-registered (state %s)",
		  efs_session_state_name(efs_session_state(s)));
	cr_assert_not(saw_state(&x, EFS_SESSION_CLOSED));
	cr_assert_eq(efs_session_generation(s), 2);
	cr_assert_neq(efs_session_lease_id(s), lease);
	cr_assert_neq(efs_session_lease_id(s), other);
	ni = get_nodeinfo("node1", &now_lease);
	cr_assert_not_null(ni);
	cr_assert_eq(now_lease, efs_session_lease_id(s));
	cr_assert_eq(ni->pid, (int32_t)getpid());
	cr_assert_eq(ni->session_generation, 2);
	efs_meta_record_free(ni);
	leave_session(s, &x);
	s = efs_session_free(s);
	teardown();
	efs_test_assert_no_leaks();
}
