/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TLS (server verification, client certificates) and etcd user auth
 * (passwords, token expiry, failover to a member that never saw our token)
 * against real etcd members.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "harness.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;

static void start(const struct efs_harness_opts *o)
{
	cr_assert_eq(efs_harness_start(&h, o), 0, "cannot start etcd");
}

static void teardown(void)
{
	h = efs_harness_free(h);
}

static int open_sync(struct efs_etcd_sync **ret, const struct efs_etcd_opts *o)
{
	return efs_etcd_sync_new(ret, o);
}

/* ---- TLS ---- */

static void setup_tls(void)
{
	struct efs_harness_opts o = {.tls = true, .client_cert_auth = true};

	start(&o);
}

TestSuite(tls, .init = setup_tls, .fini = teardown, .timeout = 60);

Test(tls, right_ca_and_client_cert_work)
{
	struct efs_etcd_opts o = {
		.endpoints = efs_harness_endpoints(h),
		.cacert = efs_harness_cacert(h),
		.cert = efs_harness_client_cert(h),
		.key = efs_harness_client_key(h),
	};
	struct efs_etcd_sync *s;
	Mvccpb__KeyValue *kv = NULL;

	cr_assert(!strncmp(o.endpoints, "https://", 8), "%s", o.endpoints);
	cr_assert_eq(open_sync(&s, &o), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "tls", 3, "ok", 2, 0, NULL), 0, "%s",
		     efs_etcd_sync_last_message(s));
	cr_assert_eq(efs_etcd_sync_get(s, "tls", 3, &kv, NULL), 0);
	cr_assert_eq(kv->value.len, 2);
	efs_test_pb_free(kv);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	teardown();
	efs_test_assert_no_leaks();
}

/* Makes a CA of our own that never signed the server's certificate. */
static void make_other_ca(char *dir, size_t size, char *ca, size_t casize)
{
	char cmd[1024];

	snprintf(dir, size, "/dev/shm/etcfs-test-ca-%d", (int)getpid());
	snprintf(ca, casize, "%s/ca.pem", dir);
	snprintf(cmd, sizeof(cmd),
		 "mkdir -p %s && openssl req -x509 -newkey ec "
		 "-pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=other-ca -days 1 "
		 "-keyout %s/ca.key -out %s >/dev/null 2>&1",
		 dir, dir, ca);
	cr_assert_eq(system(cmd), 0, "openssl failed");
}

static void remove_dir(const char *dir)
{
	char cmd[512];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

Test(tls, wrong_ca_fails_with_a_clear_error)
{
	char dir[256], ca[300];
	struct efs_etcd_opts o = {
		.endpoints = efs_harness_endpoints(h),
		.cert = efs_harness_client_cert(h),
		.key = efs_harness_client_key(h),
		.call_timeout_ms = 2000,
	};
	struct efs_etcd_sync *s;
	const char *msg;
	uint64_t t0;
	int r;

	make_other_ca(dir, sizeof(dir), ca, sizeof(ca));
	o.cacert = ca;
	r = open_sync(&s, &o);
	/* The client has loaded the CA: nothing needs the files any more. */
	remove_dir(dir);
	cr_assert_eq(r, 0);
	t0 = efs_clock_mono_ns();
	r = efs_etcd_sync_put(s, "tls", 3, "no", 2, 0, NULL);
	msg = efs_etcd_sync_last_message(s);
	cr_assert_lt(r, 0);
	cr_assert_lt(efs_clock_mono_ns() - t0, 4 * EFS_NSEC_PER_SEC);
	cr_assert(strstr(msg, "certificate") || strstr(msg, "verif"),
		  "the error should name the certificate problem: %d %s", r, msg);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	teardown();
	efs_test_assert_no_leaks();
}

Test(tls, missing_client_cert_fails_clearly)
{
	struct efs_etcd_opts o = {
		.endpoints = efs_harness_endpoints(h),
		.cacert = efs_harness_cacert(h),
		.call_timeout_ms = 2000,
	};
	struct efs_etcd_sync *s;
	const char *msg;
	uint64_t t0;
	int r;

	cr_assert_eq(open_sync(&s, &o), 0);
	t0 = efs_clock_mono_ns();
	r = efs_etcd_sync_get(s, "tls", 3, NULL, NULL);
	msg = efs_etcd_sync_last_message(s);
	cr_assert_lt(r, 0);
	cr_assert_neq(r, -ENOENT);
	cr_assert_lt(efs_clock_mono_ns() - t0, 4 * EFS_NSEC_PER_SEC);
	cr_assert(strstr(msg, "certificate") || strstr(msg, "handshake") || strstr(msg, "TLS") ||
			  strstr(msg, "tls"),
		  "the error should say TLS refused us: %d %s", r, msg);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- auth ---- */

static void setup_auth(void)
{
	struct efs_harness_opts o = {.auth = true, .user = "etcfs"};

	start(&o);
}

TestSuite(auth, .init = setup_auth, .fini = teardown, .timeout = 60);

Test(auth, wrong_password_is_rejected_and_right_one_accepted)
{
	struct efs_etcd_opts o = {
		.endpoints = efs_harness_endpoints(h),
		.user = efs_harness_user(h),
		.password = "not-the-password",
	};
	struct efs_etcd_sync *s;
	struct efs_etcd_sync_info info;
	int r;

	cr_assert_eq(open_sync(&s, &o), 0);
	r = efs_etcd_sync_put(s, "a", 1, "v", 1, 0, NULL);
	cr_assert_eq(r, -EACCES, "%d %s", r, efs_etcd_sync_last_message(s));
	cr_assert(strstr(efs_etcd_sync_last_message(s), "authentication failed"), "%s",
		  efs_etcd_sync_last_message(s));
	efs_etcd_sync_last_result(s, &info);
	cr_assert(!info.outcome_unknown, "nothing was written");
	cr_assert_eq(efs_etcd_sync_close(s), 0);

	/* Without credentials the server refuses too. */
	o.user = NULL;
	o.password = NULL;
	cr_assert_eq(open_sync(&s, &o), 0);
	r = efs_etcd_sync_put(s, "a", 1, "v", 1, 0, NULL);
	cr_assert_lt(r, 0);
	cr_assert(r == -EACCES || r == -EPERM, "%d %s", r, efs_etcd_sync_last_message(s));
	cr_assert_eq(efs_etcd_sync_close(s), 0);

	o.user = efs_harness_user(h);
	o.password = efs_harness_user_password(h);
	cr_assert_eq(open_sync(&s, &o), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "a", 1, "v", 1, 0, NULL), 0, "%s",
		     efs_etcd_sync_last_message(s));
	cr_assert_eq(efs_etcd_sync_get(s, "a", 1, NULL, NULL), 0);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	teardown();
	efs_test_assert_no_leaks();
}

struct auth_got {
	bool done;
	int err;
	char msg[256];
	char token[256];
};

static void auth_cb(struct efs_etcd_result *r, Etcdserverpb__AuthenticateResponse *resp,
		    void *arg)
{
	struct auth_got *g = arg;

	g->done = true;
	g->err = r->err;
	snprintf(g->msg, sizeof(g->msg), "%s", r->message);
	if (resp)
		snprintf(g->token, sizeof(g->token), "%s", resp->token);
}

Test(auth, authenticate_wrapper_returns_a_token_or_eacces)
{
	struct efs_etcd_opts o = {.endpoints = efs_harness_endpoints(h)};
	struct auth_got g = {0};
	struct efs_etcd *c;
	uv_loop_t loop;
	bool freed = false;

	cr_assert_eq(uv_loop_init(&loop), 0);
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), 0);
	cr_assert_eq(efs_etcd_authenticate(c, NULL, "x", NULL, auth_cb, &g), -EINVAL);
	cr_assert_eq(efs_etcd_authenticate(c, efs_harness_user(h), "wrong", NULL, auth_cb, &g), 0);
	while (!g.done)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(g.err, -EACCES, "%d %s", g.err, g.msg);
	cr_assert(strstr(g.msg, "authentication failed"), "%s", g.msg);

	memset(&g, 0, sizeof(g));
	cr_assert_eq(efs_etcd_authenticate(c, efs_harness_user(h), efs_harness_user_password(h),
					   NULL, auth_cb, &g),
		     0);
	while (!g.done)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(g.err, 0, "%s", g.msg);
	cr_assert_gt(strlen(g.token), 8, "token '%s'", g.token);

	efs_etcd_free(c, efs_test_freed_cb, &freed);
	while (!freed)
		uv_run(&loop, UV_RUN_ONCE);
	cr_assert_eq(uv_loop_close(&loop), 0);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- auth with failover and token expiry ---- */

static void setup_auth3(void)
{
	struct efs_harness_opts o = {.members = 3, .auth = true, .user = "etcfs"};

	start(&o);
}

TestSuite(auth3, .init = setup_auth3, .fini = teardown, .timeout = 90);

static int member_of(const char *url)
{
	for (int i = 0; i < efs_harness_members(h); i++)
		if (!strcmp(url, efs_harness_member_url(h, i)))
			return i;
	return -1;
}

/*
 * The client talks to member |first| (its URL first in the endpoint list)
 * when that member is killed; every call made after that must succeed.
 */
static void survive_member_loss(int first)
{
	char eps[1024];
	struct efs_etcd_opts o = {
		.endpoints = eps,
		.user = efs_harness_user(h),
		.password = efs_harness_user_password(h),
		.call_timeout_ms = 5000,
	};
	struct efs_etcd_stats before, after;
	struct efs_etcd_sync *s;
	int victim, ok = 0;
	char key[32];
	size_t len;

	len = (size_t)snprintf(eps, sizeof(eps), "%s", efs_harness_member_url(h, first));
	for (int i = 0; i < efs_harness_members(h); i++)
		if (i != first)
			len += (size_t)snprintf(eps + len, sizeof(eps) - len, ",%s",
						efs_harness_member_url(h, i));
	cr_assert_eq(open_sync(&s, &o), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "f", 1, "0", 1, 0, NULL), 0, "%s",
		     efs_etcd_sync_last_message(s));
	victim = member_of(efs_etcd_channel_endpoint(efs_etcd_sync_client(s), EFS_ETCD_CH_BULK));
	cr_assert_eq(victim, first);
	efs_etcd_get_stats(efs_etcd_sync_client(s), &before);
	cr_assert_eq(efs_harness_kill(h, victim), 0);

	/* Reads retry on their own. The token stays good on the other
	 * members: etcd 3.4 assigns simple tokens through raft, so every
	 * member knows them (only their TTL is kept per member). */
	cr_assert_eq(efs_etcd_sync_get(s, "f", 1, NULL, NULL), 0, "%s",
		     efs_etcd_sync_last_message(s));
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "f%d", i);
		if (efs_etcd_sync_put(s, key, strlen(key), "v", 1, 0, NULL) == 0)
			ok++;
	}
	cr_assert_eq(ok, 10, "puts after failover: %d of 10 (last: %s)", ok,
		     efs_etcd_sync_last_message(s));
	cr_assert_neq(member_of(efs_etcd_channel_endpoint(efs_etcd_sync_client(s),
							  EFS_ETCD_CH_BULK)),
		      victim);
	efs_etcd_get_stats(efs_etcd_sync_client(s), &after);
	cr_assert_gt(after.reconnects, before.reconnects);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
}

Test(auth3, authenticated_client_survives_the_loss_of_its_member)
{
	int f = efs_harness_follower(h);

	cr_assert_geq(f, 0);
	survive_member_loss(f);
	teardown();
	efs_test_assert_no_leaks();
}

Test(auth3, authenticated_client_survives_the_loss_of_the_leader)
{
	int l = efs_harness_leader(h);

	cr_assert_geq(l, 0);
	survive_member_loss(l);
	teardown();
	efs_test_assert_no_leaks();
}

static void setup_auth_ttl(void)
{
	struct efs_harness_opts o = {.auth = true, .user = "etcfs", .auth_token_ttl_s = 2};

	start(&o);
}

TestSuite(auth_ttl, .init = setup_auth_ttl, .fini = teardown, .timeout = 60);

Test(auth_ttl, expired_token_is_renewed_transparently)
{
	struct efs_etcd_opts o = {
		.endpoints = efs_harness_endpoints(h),
		.user = efs_harness_user(h),
		.password = efs_harness_user_password(h),
	};
	struct efs_etcd_stats before, after;
	struct efs_etcd_sync *s;
	Mvccpb__KeyValue *kv = NULL;

	cr_assert_eq(open_sync(&s, &o), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "t", 1, "1", 1, 0, NULL), 0, "%s",
		     efs_etcd_sync_last_message(s));
	efs_etcd_get_stats(efs_etcd_sync_client(s), &before);
	cr_assert_geq(before.reauths, 0);
	/* Past the 2 s token TTL (etcd sweeps expired simple tokens). */
	sleep(4);
	cr_assert_eq(efs_etcd_sync_put(s, "t", 1, "2", 1, 0, NULL), 0, "%s",
		     efs_etcd_sync_last_message(s));
	cr_assert_eq(efs_etcd_sync_get(s, "t", 1, &kv, NULL), 0);
	cr_assert_eq(kv->value.data[0], '2');
	efs_test_pb_free(kv);
	efs_etcd_get_stats(efs_etcd_sync_client(s), &after);
	cr_assert_gt(after.reauths, before.reauths, "the expired token was replaced");
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- etcfsctl with TLS client certificates and a user ---- */

static void setup_tls_auth(void)
{
	struct efs_harness_opts o = {
		.tls = true,
		.client_cert_auth = true,
		.auth = true,
		.user = "etcfs",
	};

	start(&o);
}

TestSuite(ctl_tls_auth, .init = setup_tls_auth, .fini = teardown, .timeout = 60);

static int run_ctl(const char *args, char *out, size_t outsize)
{
	const char *root = getenv("ETCFS_BUILD_ROOT");
	char cmd[4096];
	size_t n = 0;
	FILE *f;
	int st;

	cr_assert_not_null(root, "ETCFS_BUILD_ROOT is not set");
	snprintf(cmd, sizeof(cmd), "%s/etcfsd/etcfsctl %s 2>&1 </dev/null", root, args);
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (n + 1 < outsize) {
		size_t got = fread(out + n, 1, outsize - 1 - n, f);

		if (got == 0)
			break;
		n += got;
	}
	out[n] = '\0';
	st = pclose(f);
	cr_assert(WIFEXITED(st), "etcfsctl did not exit normally:\n%s", out);
	return WEXITSTATUS(st);
}

Test(ctl_tls_auth, etcd_check_takes_etcdctl_tls_and_user_flags)
{
	static char out[65536];
	char args[2048];
	int st;

	snprintf(args, sizeof(args),
		 "etcd-check --endpoints %s --cacert %s --cert %s --key %s --user %s:%s "
		 "--duration 0.5 --concurrency 4 --samples 20",
		 efs_harness_endpoints(h), efs_harness_cacert(h), efs_harness_client_cert(h),
		 efs_harness_client_key(h), efs_harness_user(h), efs_harness_user_password(h));
	st = run_ctl(args, out, sizeof(out));
	cr_assert(st == 0 || st == 1, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "members: 1\n"), "%s", out);
	cr_assert(strstr(out, " txn/s "), "%s", out);
	cr_assert(strstr(out, "verdict: "), "%s", out);

	/* The same with --password, host:port endpoints (https implied). */
	snprintf(args, sizeof(args),
		 "etcd-check --endpoints %s --cacert %s --cert %s --key %s --user %s "
		 "--password %s --duration 0.5 --concurrency 2 --samples 10",
		 efs_harness_member_hostport(h, 0), efs_harness_cacert(h),
		 efs_harness_client_cert(h), efs_harness_client_key(h), efs_harness_user(h),
		 efs_harness_user_password(h));
	st = run_ctl(args, out, sizeof(out));
	cr_assert(st == 0 || st == 1, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "verdict: "), "%s", out);

	/* A wrong password: exit 3 and says so. */
	snprintf(args, sizeof(args),
		 "etcd-check --endpoints %s --cacert %s --cert %s --key %s --user %s:wrong",
		 efs_harness_endpoints(h), efs_harness_cacert(h), efs_harness_client_cert(h),
		 efs_harness_client_key(h), efs_harness_user(h));
	st = run_ctl(args, out, sizeof(out));
	cr_assert_eq(st, 3, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "authentication failed"), "%s", out);

	/* A user without a password and no terminal to ask on: usage error. */
	snprintf(args, sizeof(args), "etcd-check --endpoints %s --user %s",
		 efs_harness_endpoints(h), efs_harness_user(h));
	st = run_ctl(args, out, sizeof(out));
	cr_assert_eq(st, 2, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "needs a password"), "%s", out);
	teardown();
	efs_test_assert_no_leaks();
}
