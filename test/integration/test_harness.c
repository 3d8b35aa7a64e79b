/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd test harness against a real etcd: start and stop, leader
 * changes, pause, TLS, auth, the CLI, and that nothing is left behind.
 * Every check goes through etcdctl or /proc, never through our own client.
 */
#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#include "../support/leak.h"

static struct efs_harness *h;

static void fini(void)
{
	h = efs_harness_free(h);
}

TestSuite(harness, .fini = fini, .timeout = 90);

static bool path_exists(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0;
}

/* Is |pid| a live (non-zombie) process? */
static bool pid_alive(pid_t pid)
{
	char path[64], buf[512];
	FILE *f;
	char *p;
	bool alive = false;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return false;
	if (fgets(buf, sizeof(buf), f)) {
		p = strrchr(buf, ')');
		alive = p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
	}
	fclose(f);
	return alive;
}

/*
 * Counts the threads of |pid| in job-control stop (state T) into *|stopped|
 * and all of them into *|total|, read from /proc at once (no waiting).
 */
static void count_stopped_threads(pid_t pid, int *stopped, int *total)
{
	char path[96], buf[512], *p;
	struct dirent *de;
	DIR *d;
	FILE *f;

	*stopped = *total = 0;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	cr_assert_not_null(d, "no %s", path);
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat", (int)pid, de->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
		fclose(f);
		if (p && p[1] == ' ') {
			(*total)++;
			*stopped += p[2] == 'T';
		}
	}
	closedir(d);
	cr_assert_gt(*total, 0);
}

/* Member |i| is stopped (every thread) or running (none stopped) right now. */
static void assert_stopped_now(int i, bool stopped)
{
	int n, total;

	count_stopped_threads(efs_harness_pid(h, i), &n, &total);
	if (stopped)
		cr_assert_eq(n, total, "member %d: %d of %d threads stopped", i, n, total);
	else
		cr_assert_eq(n, 0, "member %d: %d of %d threads still stopped", i, n, total);
}

static long long ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs etcdctl as root (or anonymously without auth); returns status. */
static int ctl(char **out, const char *a, const char *b, const char *c, const char *d)
{
	return efs_harness_etcdctl(h, out, a, b, c, d, NULL);
}

/* Value of |key| read from member |i| alone (serializable), or NULL. */
static char *get_from(int i, const char *key)
{
	char ep[256], *out = NULL, *nl;
	int r;

	snprintf(ep, sizeof(ep), "--endpoints=%s", efs_harness_member_url(h, i));
	r = efs_harness_etcdctl(h, &out, ep, "get", "--consistency=s", "--print-value-only", key,
				NULL);
	if (r != 0 || !out || !*out) {
		free(out);
		return NULL;
	}
	nl = strchr(out, '\n');
	if (nl)
		*nl = '\0';
	return out;
}

static void assert_put_get(const char *key, const char *val)
{
	char *out = NULL;

	cr_assert_eq(ctl(&out, "put", key, val, NULL), 0, "put failed: %s", out);
	free(out);
	out = NULL;
	cr_assert_eq(ctl(&out, "get", "--print-value-only", key, NULL), 0, "get: %s", out);
	out[strcspn(out, "\n")] = '\0';
	cr_assert_str_eq(out, val, "got '%s'", out);
	free(out);
}

/* Waits until member |i| serves |key| = |val| from its own state. */
static void assert_member_sees(int i, const char *key, const char *val)
{
	long long deadline = ms_now() + 10000;
	char *v;

	for (;;) {
		v = get_from(i, key);
		if (v && !strcmp(v, val))
			break;
		free(v);
		cr_assert_lt(ms_now(), deadline, "member %d never saw %s", i, key);
		usleep(50000);
	}
	free(v);
}

/* Member |i|'s etcd command line, arguments separated by spaces. */
static void cmdline_of(int i, char *buf, size_t size)
{
	char path[64];
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)efs_harness_pid(h, i));
	f = fopen(path, "r");
	cr_assert_not_null(f);
	n = fread(buf, 1, size - 1, f);
	fclose(f);
	for (size_t k = 0; k < n; k++)
		buf[k] = buf[k] ? buf[k] : ' ';
	buf[n] = '\0';
}

/* Does member |i| itself report that it leads (MemberID == Leader)? */
static bool etcdctl_says_leader(int i)
{
	unsigned long long id = 0, leader = 1;
	char ep[256], *out = NULL, *p;

	snprintf(ep, sizeof(ep), "--endpoints=%s", efs_harness_member_url(h, i));
	cr_assert_eq(efs_harness_etcdctl(h, &out, ep, "endpoint", "status", "-w", "fields", NULL),
		     0, "%s", out);
	p = strstr(out, "\"MemberID\" : ");
	cr_assert(p && sscanf(p, "\"MemberID\" : %llu", &id) == 1, "%s", out);
	p = strstr(out, "\"Leader\" : ");
	cr_assert(p && sscanf(p, "\"Leader\" : %llu", &leader) == 1, "%s", out);
	free(out);
	return id == leader;
}

Test(harness, one_member_serves_and_leaves_nothing)
{
	struct efs_harness_opts o = {.members = 1};
	char dir[256];
	pid_t pid;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cr_assert_eq(efs_harness_members(h), 1);
	cr_assert(!strncmp(efs_harness_endpoints(h), "http://127.0.0.1:", 17));
	cr_assert_str_eq(efs_harness_endpoints(h), efs_harness_member_url(h, 0));
	cr_assert_null(efs_harness_cacert(h));
	cr_assert_null(efs_harness_root_password(h));
	cr_assert_eq(efs_harness_leader(h), 0);
	cr_assert_eq(efs_harness_follower(h), -ENOENT);
	assert_put_get("/k", "v1");
	pid = efs_harness_pid(h, 0);
	cr_assert_gt(pid, 0);
	cr_assert(pid_alive(pid));
	snprintf(dir, sizeof(dir), "%s", efs_harness_dir(h));
	cr_assert(!strncmp(dir, "/dev/shm/etcfs-harness-", 23));
	cr_assert(path_exists(efs_harness_log_path(h, 0)));
	h = efs_harness_free(h);
	cr_assert(!path_exists(dir), "%s remains", dir);
	cr_assert(!path_exists((snprintf(dir, sizeof(dir), "/proc/%d", (int)pid), dir)),
		  "member %d was not reaped", (int)pid);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, three_members_serve)
{
	struct efs_harness_opts o = {.members = 3};
	char *out = NULL;
	int commas = 0, leader, follower;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cr_assert_eq(efs_harness_members(h), 3);
	for (const char *p = efs_harness_endpoints(h); *p; p++)
		commas += *p == ',';
	cr_assert_eq(commas, 2);
	cr_assert_eq(ctl(&out, "member", "list", NULL, NULL), 0, "%s", out);
	cr_assert(strstr(out, "m0") && strstr(out, "m1") && strstr(out, "m2"), "%s", out);
	free(out);
	out = NULL;
	cr_assert_eq(ctl(&out, "endpoint", "health", NULL, NULL), 0, "%s", out);
	free(out);
	assert_put_get("/three", "yes");
	for (int i = 0; i < 3; i++)
		assert_member_sees(i, "/three", "yes");
	leader = efs_harness_leader(h);
	follower = efs_harness_follower(h);
	cr_assert(leader >= 0 && leader < 3);
	cr_assert(follower >= 0 && follower < 3 && follower != leader);
	/* The leader gauge agrees with etcdctl's view of each member. */
	for (int i = 0; i < 3; i++)
		cr_assert_eq(etcdctl_says_leader(i), i == leader, "member %d", i);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, kill_leader_elects_another_and_restart_rejoins)
{
	struct efs_harness_opts o = {.members = 3, .heartbeat_ms = 50, .election_ms = 500};
	pid_t old_pid;
	int leader, next;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	leader = efs_harness_wait_leader(h, 5000);
	cr_assert_geq(leader, 0);
	old_pid = efs_harness_pid(h, leader);
	cr_assert_eq(efs_harness_kill(h, leader), 0);
	cr_assert_eq(efs_harness_kill(h, leader), -ESRCH);
	cr_assert_eq(efs_harness_state(h, leader), EFS_HARNESS_DEAD);
	cr_assert_eq(efs_harness_pid(h, leader), -ESRCH);
	cr_assert(!pid_alive(old_pid));
	next = efs_harness_wait_leader(h, 10000);
	cr_assert_geq(next, 0, "no new leader: %d", next);
	cr_assert_neq(next, leader);
	assert_put_get("/after-kill", "1");
	cr_assert_eq(efs_harness_restart(h, next), -EBUSY);
	cr_assert_eq(efs_harness_restart(h, leader), 0);
	cr_assert_eq(efs_harness_state(h, leader), EFS_HARNESS_RUNNING);
	cr_assert_neq(efs_harness_pid(h, leader), old_pid);
	assert_member_sees(leader, "/after-kill", "1");
	cr_assert_geq(efs_harness_wait_leader(h, 5000), 0);
	/* A graceful stop and restart of a follower. */
	next = efs_harness_follower(h);
	cr_assert_geq(next, 0);
	cr_assert_eq(efs_harness_stop(h, next), 0);
	assert_put_get("/after-stop", "2");
	cr_assert_eq(efs_harness_restart(h, next), 0);
	assert_member_sees(next, "/after-stop", "2");
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, pause_and_resume)
{
	struct efs_harness_opts o = {.members = 3, .heartbeat_ms = 50, .election_ms = 500};
	int leader, f, next;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	f = efs_harness_follower(h);
	cr_assert_geq(f, 0);
	cr_assert_eq(efs_harness_pause(h, f), 0);
	/* Stopped when pause returns, not some time later. */
	assert_stopped_now(f, true);
	cr_assert_eq(efs_harness_pause(h, f), -EALREADY);
	cr_assert_eq(efs_harness_state(h, f), EFS_HARNESS_PAUSED);
	cr_assert_eq(efs_harness_wait_member(h, f, 100), -EBUSY);
	/* The two others keep serving; the paused one is skipped. */
	assert_put_get("/paused", "f");
	cr_assert_eq(efs_harness_resume(h, f), 0);
	assert_stopped_now(f, false);
	cr_assert_eq(efs_harness_resume(h, f), -EALREADY);
	cr_assert_eq(efs_harness_wait_member(h, f, 10000), 0);
	assert_member_sees(f, "/paused", "f");

	/* Pausing the leader makes the others elect a new one. */
	leader = efs_harness_wait_leader(h, 5000);
	cr_assert_geq(leader, 0);
	cr_assert_eq(efs_harness_pause(h, leader), 0);
	assert_stopped_now(leader, true);
	next = efs_harness_wait_leader(h, 10000);
	cr_assert_geq(next, 0);
	cr_assert_neq(next, leader);
	assert_put_get("/paused-leader", "l");
	cr_assert_eq(efs_harness_resume(h, leader), 0);
	cr_assert_eq(efs_harness_wait_member(h, leader, 10000), 0);
	assert_member_sees(leader, "/paused-leader", "l");
	cr_assert_geq(efs_harness_wait_leader(h, 5000), 0);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, tls_with_client_cert_auth)
{
	struct efs_harness_opts o = {.members = 1, .tls = true, .client_cert_auth = true};
	char *out = NULL;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cr_assert(!strncmp(efs_harness_endpoints(h), "https://127.0.0.1:", 18));
	cr_assert(path_exists(efs_harness_cacert(h)));
	cr_assert(path_exists(efs_harness_client_cert(h)));
	cr_assert(path_exists(efs_harness_client_key(h)));
	assert_put_get("/tls", "ok");
	/* Without the client certificate the server refuses. */
	cr_assert_neq(efs_harness_etcdctl(h, &out, "--cert=", "--key=", "--dial-timeout=1s",
					  "--command-timeout=2s", "get", "/tls", NULL),
		      0, "%s", out);
	free(out);
	out = NULL;
	/* Nor does it talk plaintext. */
	{
		char ep[256];

		snprintf(ep, sizeof(ep), "--endpoints=%s", efs_harness_endpoints(h) + 8);
		cr_assert_neq(efs_harness_etcdctl(h, &out, ep, "--cacert=", "--cert=", "--key=",
						  "--dial-timeout=1s", "--command-timeout=2s",
						  "get", "/tls", NULL),
			      0, "%s", out);
		free(out);
	}
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, tls_on_another_local_address_three_members)
{
	struct efs_harness_opts o = {.members = 3, .tls = true, .listen_addr = "127.0.0.2"};

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cr_assert(!strncmp(efs_harness_member_url(h, 1), "https://127.0.0.2:", 18));
	cr_assert(!strncmp(efs_harness_peer_url(h, 1), "http://127.0.0.2:", 17));
	cr_assert(!strncmp(efs_harness_metrics_url(h, 2), "http://127.0.0.2:", 17));
	assert_put_get("/addr", "127.0.0.2");
	cr_assert_geq(efs_harness_leader(h), 0);
	fini();
	efs_test_assert_no_leaks();
}

/* A member serves clients on the extra addresses too, with the same port,
 * and its TLS certificate names them. */
Test(harness, extra_client_addresses_serve_clients_on_the_same_port)
{
	static const char *const extra[] = {"127.0.0.3", "127.0.0.4", NULL};
	struct efs_harness_opts o = {.members = 1, .tls = true, .extra_client_addrs = extra};
	char ep[128], *out = NULL, cmd[8192];
	int port;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	port = efs_harness_client_port(h, 0);
	cr_assert_gt(port, 0);
	cmdline_of(0, cmd, sizeof(cmd));
	snprintf(ep, sizeof(ep), ",https://127.0.0.4:%d", port);
	cr_assert(strstr(cmd, ep), "%s", cmd);
	assert_put_get("/extra", "v1");
	snprintf(ep, sizeof(ep), "--endpoints=https://127.0.0.3:%d", port);
	cr_assert_eq(efs_harness_etcdctl(h, &out, ep, "get", "--print-value-only", "/extra", NULL),
		     0, "%s", out);
	cr_assert(!strncmp(out, "v1\n", 3), "%s", out);
	free(out);
	/* Only those: not every address (a wildcard listener). */
	out = NULL;
	snprintf(ep, sizeof(ep), "--endpoints=https://127.0.0.5:%d", port);
	cr_assert_neq(efs_harness_etcdctl(h, &out, ep, "--command-timeout=1s", "get", "/extra",
					  NULL),
		      0, "%s", out);
	free(out);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, auth_rejects_anonymous_accepts_root_and_user)
{
	struct efs_harness_opts o = {.members = 1,
				     .auth = true,
				     .root_password = "s3cret pw",
				     .user = "alice",
				     .user_prefix = "/a/",
				     .auth_token_ttl_s = 30};
	char *out = NULL, cmd[8192];

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cmdline_of(0, cmd, sizeof(cmd));
	cr_assert(strstr(cmd, "--auth-token-ttl=30"), "%s", cmd);
	cr_assert_str_eq(efs_harness_root_password(h), "s3cret pw");
	cr_assert_str_eq(efs_harness_user(h), "alice");
	cr_assert_str_eq(efs_harness_user_password(h), "etcfs-user-pw");
	cr_assert_neq(efs_harness_etcdctl_as(h, NULL, NULL, &out, "put", "/x", "1", NULL), 0);
	cr_assert(strstr(out, "user name is empty"), "%s", out);
	free(out);
	out = NULL;
	cr_assert_neq(efs_harness_etcdctl_as(h, "root", "wrong", &out, "put", "/x", "1", NULL),
		      0);
	cr_assert(strstr(out, "authentication failed"), "%s", out);
	free(out);
	assert_put_get("/x", "root");
	out = NULL;
	cr_assert_eq(efs_harness_etcdctl_as(h, "alice", "etcfs-user-pw", &out, "put", "/a/1", "u",
					    NULL),
		     0, "%s", out);
	free(out);
	out = NULL;
	cr_assert_neq(efs_harness_etcdctl_as(h, "alice", "etcfs-user-pw", &out, "put", "/b/1",
					     "u", NULL),
		      0);
	cr_assert(strstr(out, "permission denied"), "%s", out);
	free(out);
	out = NULL;
	cr_assert_eq(ctl(&out, "user", "list", NULL, NULL), 0, "%s", out);
	cr_assert(strstr(out, "root") && strstr(out, "alice"), "%s", out);
	free(out);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, tls_and_auth_together)
{
	struct efs_harness_opts o = {.members = 3, .tls = true, .client_cert_auth = true,
				     .auth = true};
	char *out = NULL;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	assert_put_get("/both", "yes");
	/* The default client CN names no user, so the certificate alone is not enough. */
	cr_assert_neq(efs_harness_etcdctl_as(h, NULL, NULL, &out, "put", "/y", "1", NULL), 0);
	free(out);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, options_reach_etcd)
{
	const char *const extra[] = {"--max-txn-ops=256", NULL};
	struct efs_harness_opts o = {.members = 1,
				     .auto_compaction = true,
				     .auto_compaction_retention = "5m",
				     .quota_bytes = 64LL << 20,
				     .fsync = true,
				     .extra_args = extra};
	char cmd[8192];
	double quota = 0;

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cr_assert_eq(efs_harness_metric(h, 0, "etcd_server_quota_backend_bytes", &quota), 0);
	cr_assert_eq((long long)quota, 64LL << 20);
	cr_assert_eq(efs_harness_metric(h, 0, "no_such_metric_xyz", &quota), -ENOENT);
	cmdline_of(0, cmd, sizeof(cmd));
	cr_assert(strstr(cmd, "--auto-compaction-mode=periodic"), "%s", cmd);
	cr_assert(strstr(cmd, "--auto-compaction-retention=5m"), "%s", cmd);
	cr_assert(strstr(cmd, "--max-txn-ops=256"), "%s", cmd);
	cr_assert(!strstr(cmd, "--unsafe-no-fsync"), "%s", cmd);
	assert_put_get("/opt", "1");
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, bad_options_fail_cleanly)
{
	struct efs_harness_opts two = {.members = 2};
	struct efs_harness_opts addr = {.listen_addr = "localhost"};
	struct efs_harness_opts cca = {.client_cert_auth = true};
	struct efs_harness_opts cn = {.tls = true, .client_cert_cn = "a/b"};
	static const char *const v6[] = {"::1", NULL};
	static const char *const one[] = {"127.0.0.3", NULL};
	struct efs_harness_opts xv6 = {.extra_client_addrs = v6};
	struct efs_harness_opts xdet = {.extra_client_addrs = one, .detached = true};

	cr_assert_eq(efs_harness_start(&h, &two), -EINVAL);
	cr_assert_eq(efs_harness_start(&h, &addr), -EINVAL);
	cr_assert_eq(efs_harness_start(&h, &cca), -EINVAL);
	cr_assert_eq(efs_harness_start(&h, &cn), -EINVAL);
	cr_assert_eq(efs_harness_start(&h, &xv6), -EINVAL);
	cr_assert_eq(efs_harness_start(&h, &xdet), -EINVAL);
	cr_assert_null(h);
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, etcdctl_reports_failures)
{
	char *out = NULL;

	cr_assert_eq(efs_harness_start(&h, NULL), 0);
	cr_assert_gt(ctl(&out, "no-such-command", NULL, NULL, NULL), 0);
	free(out);
	out = NULL;
	cr_assert_eq(ctl(&out, "get", "--print-value-only", "/absent", NULL), 0);
	cr_assert_str_eq(out, "");
	free(out);
	/* With every member dead there is nothing to ask. */
	cr_assert_eq(efs_harness_kill(h, 0), 0);
	cr_assert_eq(ctl(NULL, "get", "/x", NULL, NULL), -ESRCH);
	cr_assert_eq(efs_harness_leader(h), -ENOENT);
	cr_assert_eq(efs_harness_wait_leader(h, 100), -ETIMEDOUT);
	fini();
	efs_test_assert_no_leaks();
}

/*
 * Free with a paused member, under TLS and auth: every process is gone
 * (reaped, so not even a zombie) and every directory removed.
 */
Test(harness, free_stops_paused_members_and_removes_everything)
{
	struct efs_harness_opts o = {.members = 3, .tls = true, .auth = true};
	char dir[256], proc[64];
	pid_t pids[3];

	cr_assert_eq(efs_harness_start(&h, &o), 0);
	snprintf(dir, sizeof(dir), "%s", efs_harness_dir(h));
	for (int i = 0; i < 3; i++)
		pids[i] = efs_harness_pid(h, i);
	cr_assert_eq(efs_harness_pause(h, 1), 0);
	cr_assert_eq(efs_harness_kill(h, 2), 0);
	h = efs_harness_free(h);
	cr_assert(!path_exists(dir), "%s remains", dir);
	for (int i = 0; i < 3; i++) {
		snprintf(proc, sizeof(proc), "/proc/%d", (int)pids[i]);
		cr_assert(!path_exists(proc), "member %d (pid %d) remains", i, (int)pids[i]);
	}
	fini();
	efs_test_assert_no_leaks();
}

/*
 * A test process that dies without cleanup takes its members with it
 * (PDEATHSIG), and the next start removes its directory.
 */
Test(harness, members_die_with_their_process)
{
	struct efs_harness_opts o = {.members = 3};
	char dir[256];
	pid_t child, pids[3];
	int p[2], status;
	long long deadline;

	cr_assert_eq(pipe(p), 0);
	child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		struct efs_harness *ch;

		close(p[0]);
		if (efs_harness_start(&ch, &o) != 0)
			_exit(1);
		snprintf(dir, sizeof(dir), "%s", efs_harness_dir(ch));
		for (int i = 0; i < 3; i++)
			pids[i] = efs_harness_pid(ch, i);
		if (write(p[1], pids, sizeof(pids)) != sizeof(pids) ||
		    write(p[1], dir, sizeof(dir)) != sizeof(dir))
			_exit(1);
		raise(SIGKILL);
		_exit(1);
	}
	close(p[1]);
	cr_assert_eq(read(p[0], pids, sizeof(pids)), (ssize_t)sizeof(pids));
	cr_assert_eq(read(p[0], dir, sizeof(dir)), (ssize_t)sizeof(dir));
	close(p[0]);
	cr_assert_eq(waitpid(child, &status, 0), child);
	cr_assert(WIFSIGNALED(status));
	deadline = ms_now() + 5000;
	for (int i = 0; i < 3; i++) {
		while (pid_alive(pids[i]) && ms_now() < deadline)
			usleep(20000);
		cr_assert(!pid_alive(pids[i]), "member pid %d outlived its parent", (int)pids[i]);
	}
	cr_assert(path_exists(dir));
	cr_assert_eq(efs_harness_start(&h, NULL), 0);
	cr_assert(!path_exists(dir), "stale %s was not swept", dir);
	fini();
	efs_test_assert_no_leaks();
}

/* The CLI: members outlive it, and stop removes them by PID. */
Test(harness, cli_start_status_fault_stop)
{
	const char *root = getenv("ETCFS_BUILD_ROOT");
	char exe[512], state[256], cmd[1024], line[512], *eps = NULL;
	int pid = 0, pids[3] = {0}, n = 0, idx;
	FILE *f;

	cr_assert_not_null(root, "ETCFS_BUILD_ROOT is not set (run through meson test)");
	snprintf(exe, sizeof(exe), "%s/test/harness/etcd-harness", root);
	snprintf(state, sizeof(state), "/dev/shm/etcfs-harness-cli-test-%d", (int)getpid());
	snprintf(cmd, sizeof(cmd), "%s start --members 3 --auth --state %s 2>/dev/null", exe,
		 state);
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "ETCD_ENDPOINTS=", 15))
			eps = strdup(line + 15);
	}
	cr_assert_eq(pclose(f), 0);
	cr_assert_not_null(eps);
	cr_assert(!strncmp(eps, "http://127.0.0.1:", 17), "%s", eps);
	free(eps);

	snprintf(cmd, sizeof(cmd), "%s status --state %s", exe, state);
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	while (fgets(line, sizeof(line), f) && n < 3) {
		cr_assert_eq(sscanf(line, "%d %d", &idx, &pid), 2, "%s", line);
		pids[n++] = pid;
	}
	cr_assert_eq(pclose(f), 0);
	cr_assert_eq(n, 3);
	for (int i = 0; i < 3; i++)
		cr_assert(pid_alive(pids[i]));

	snprintf(cmd, sizeof(cmd), "%s etcdctl --state %s -- put /cli 1 >/dev/null", exe, state);
	cr_assert_eq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s etcdctl --anon --state %s -- put /cli 2 >/dev/null 2>&1",
		 exe, state);
	cr_assert_neq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s kill --state %s follower >/dev/null", exe, state);
	cr_assert_eq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s status --state %s >/dev/null", exe, state);
	cr_assert_neq(system(cmd), 0, "status must fail with a dead member");
	snprintf(cmd, sizeof(cmd), "%s stop --state %s", exe, state);
	cr_assert_eq(system(cmd), 0);
	for (int i = 0; i < 3; i++)
		cr_assert(!pid_alive(pids[i]), "pid %d survived stop", pids[i]);
	cr_assert(!path_exists(state));
	fini();
	efs_test_assert_no_leaks();
}

Test(harness, etcd_failure_is_reported_and_cleaned_up)
{
	const char *const bad[] = {"--no-such-flag", NULL};
	struct efs_harness_opts o = {.members = 1, .extra_args = bad};

	cr_assert_eq(efs_harness_start(&h, &o), -EIO);
	cr_assert_null(h);
	fini();
	efs_test_assert_no_leaks();
}

/*
 * A restart whose port has been taken fails with -EIO (after retries) and
 * leaves the member dead; once the port is free again it succeeds.
 */
Test(harness, restart_fails_cleanly_when_its_port_is_taken)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	const char *hp;
	int fd, one = 1;

	cr_assert_eq(efs_harness_start(&h, NULL), 0);
	assert_put_get("/before", "1");
	hp = efs_harness_member_hostport(h, 0);
	sa.sin_port = htons((uint16_t)atoi(strrchr(hp, ':') + 1));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(efs_harness_kill(h, 0), 0);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(fd, 0);
	cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0, "bind: %s", strerror(errno));
	cr_assert_eq(listen(fd, 1), 0);
	cr_assert_eq(efs_harness_restart(h, 0), -EIO);
	cr_assert_eq(efs_harness_state(h, 0), EFS_HARNESS_DEAD);
	close(fd);
	cr_assert_eq(efs_harness_restart(h, 0), 0);
	cr_assert_eq(efs_harness_leader(h), 0);
	assert_put_get("/before", "1");
	fini();
	efs_test_assert_no_leaks();
}

/*
 * A cluster on a veth address that a client in another network namespace
 * reaches (how multi-node tests use it). Needs root and iproute2, like the
 * rest of the integration suite's namespace tests.
 */
static char ns_name[32], veth_host[16];

static void ns_fini(void)
{
	char cmd[128];

	h = efs_harness_free(h);
	if (veth_host[0]) {
		snprintf(cmd, sizeof(cmd), "ip link del %s 2>/dev/null", veth_host);
		(void)system(cmd);
		veth_host[0] = '\0';
	}
	if (ns_name[0]) {
		snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null", ns_name);
		(void)system(cmd);
		ns_name[0] = '\0';
	}
}

Test(harness, listen_address_reachable_from_a_network_namespace, .fini = ns_fini)
{
	unsigned pid = (unsigned)getpid();
	unsigned b = 200 + (pid >> 16) % 50, c = (pid >> 8) & 255, d = (pid & 63) * 4;
	char addr[32], peer[32], cmd[2048], veth_ns[16];
	struct efs_harness_opts o = {.members = 3, .tls = true, .auth = true, .listen_addr = addr};
	FILE *f;

	snprintf(ns_name, sizeof(ns_name), "efsh-%u", pid);
	snprintf(veth_host, sizeof(veth_host), "efh%ua", pid);
	snprintf(veth_ns, sizeof(veth_ns), "efh%ub", pid);
	snprintf(addr, sizeof(addr), "10.%u.%u.%u", b, c, d + 1);
	snprintf(peer, sizeof(peer), "10.%u.%u.%u", b, c, d + 2);
	snprintf(cmd, sizeof(cmd),
		 "set -e; ip netns add %s; ip link add %s type veth peer name %s; "
		 "ip link set %s netns %s; ip addr add %s/30 dev %s; ip link set %s up; "
		 "ip netns exec %s ip addr add %s/30 dev %s; "
		 "ip netns exec %s ip link set %s up",
		 ns_name, veth_host, veth_ns, veth_ns, ns_name, addr, veth_host, veth_host,
		 ns_name, peer, veth_ns, ns_name, veth_ns);
	cr_assert_eq(system(cmd), 0, "cannot set up a network namespace (needs root, iproute2)");
	cr_assert_eq(efs_harness_start(&h, &o), 0);
	cr_assert(strstr(efs_harness_member_url(h, 0), addr));
	/* From inside the namespace, with the harness's CA and root. */
	snprintf(cmd, sizeof(cmd),
		 "ip netns exec %s env ETCDCTL_API=3 etcdctl --endpoints=%s --cacert=%s "
		 "--cert=%s --key=%s --user=root --password=%s --dial-timeout=3s "
		 "put /from-ns yes 2>&1",
		 ns_name, efs_harness_endpoints(h), efs_harness_cacert(h),
		 efs_harness_client_cert(h), efs_harness_client_key(h),
		 efs_harness_root_password(h));
	f = popen(cmd, "r");
	cr_assert_not_null(f);
	{
		char line[512] = "";

		(void)!fgets(line, sizeof(line), f);
		cr_assert_eq(pclose(f), 0, "%s", line);
		cr_assert(!strncmp(line, "OK", 2), "%s", line);
	}
	assert_member_sees(efs_harness_follower(h), "/from-ns", "yes");
	ns_fini();
	efs_test_assert_no_leaks();
}
