/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The blocking wrapper (sync.h) against a real etcd, and the etcfsctl
 * binary that short-lived tools are built like.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "etcd/etcd.h"
#include "etcd/sync.h"
#include "harness.h"
#include "util/clock.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;

static void start(int members)
{
	struct efs_harness_opts o = {.members = members};

	cr_assert_eq(efs_harness_start(&h, &o), 0, "cannot start etcd");
}

static void setup1(void)
{
	start(1);
}

static void setup3(void)
{
	start(3);
}

static void teardown(void)
{
	h = efs_harness_free(h);
}

static struct efs_etcd_sync *sync_new(const char *endpoints, uint32_t timeout_ms)
{
	struct efs_etcd_opts o = {
		.endpoints = endpoints,
		.call_timeout_ms = timeout_ms,
		.connect_timeout_ms = timeout_ms ? timeout_ms / 2 : 0,
	};
	struct efs_etcd_sync *s;

	cr_assert_eq(efs_etcd_sync_new(&s, &o), 0);
	return s;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* A loopback port nobody listens on (bound, then released). */
static int dead_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert_geq(fd, 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd);
	return port;
}

TestSuite(sync, .init = setup1, .fini = teardown, .timeout = 60);

Test(sync, put_get_delete_txn_status_member_list)
{
	struct efs_etcd_sync *s = sync_new(efs_harness_endpoints(h), 0);
	Etcdserverpb__StatusResponse *st = NULL;
	Etcdserverpb__MemberListResponse *ml = NULL;
	Etcdserverpb__TxnResponse *tr = NULL;
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT, *cmpp = &cmp;
	Mvccpb__KeyValue *kv = NULL;
	int64_t rev = 0, rev2 = 0, deleted = 0;

	cr_assert_eq(efs_etcd_sync_put(s, "s/a", 3, "hello", 5, 0, &rev), 0);
	cr_assert_gt(rev, 0);
	cr_assert_eq(efs_etcd_sync_get(s, "s/a", 3, &kv, &rev2), 0);
	cr_assert_eq(rev2, rev);
	cr_assert_eq(kv->value.len, 5);
	cr_assert_eq(memcmp(kv->value.data, "hello", 5), 0);
	cr_assert_eq(kv->mod_revision, rev);
	efs_test_pb_free(kv);

	rev2 = 0;
	cr_assert_eq(efs_etcd_sync_get(s, "s/none", 6, NULL, &rev2), -ENOENT);
	cr_assert_eq(rev2, rev, "the revision is reported for a missing key too");

	cmp.key.data = (uint8_t *)"s/a";
	cmp.key.len = 3;
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
	cmp.mod_revision = rev;
	txn.n_compare = 1;
	txn.compare = &cmpp;
	cr_assert_eq(efs_etcd_sync_txn(s, &txn, &tr), 0);
	cr_assert(tr->succeeded);
	efs_test_pb_free(tr);
	cmp.mod_revision = rev - 1;
	cr_assert_eq(efs_etcd_sync_txn(s, &txn, &tr), 0);
	cr_assert(!tr->succeeded, "a failed compare is not an error");
	efs_test_pb_free(tr);
	cr_assert_eq(efs_etcd_sync_txn(s, &txn, NULL), 0);

	cr_assert_eq(efs_etcd_sync_put(s, "s/b", 3, "", 0, 0, NULL), 0);
	cr_assert_eq(efs_etcd_sync_delete(s, "s/", 2, true, &deleted), 0);
	cr_assert_eq(deleted, 2);
	cr_assert_eq(efs_etcd_sync_get(s, "s/a", 3, NULL, NULL), -ENOENT);

	cr_assert_eq(efs_etcd_sync_status(s, &st), 0);
	cr_assert_str_eq(st->version, "3.4.23");
	cr_assert_neq(st->leader, 0);
	efs_test_pb_free(st);
	cr_assert_eq(efs_etcd_sync_member_list(s, &ml), 0);
	cr_assert_eq(ml->n_members, 1);
	cr_assert_str_eq(ml->members[0]->clienturls[0], efs_harness_member_url(h, 0));
	efs_test_pb_free(ml);

	cr_assert_eq(efs_etcd_sync_close(s), 0, "the loop closes cleanly");
	teardown();
	efs_test_assert_no_leaks();
}

Test(sync, generic_call_and_error_reporting)
{
	struct efs_etcd_sync *s = sync_new(efs_harness_endpoints(h), 0);
	Etcdserverpb__RangeRequest rr = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__PutRequest pr = ETCDSERVERPB__PUT_REQUEST__INIT;
	struct efs_etcd_sync_info info;
	ProtobufCMessage *resp = NULL;
	char *msg = NULL;

	/* An empty key is the server's to reject. */
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_RANGE, &rr.base, &resp, &msg), -EINVAL);
	cr_assert_null(resp);
	cr_assert_not_null(msg);
	cr_assert(strstr(msg, "key is not provided"), "%s", msg);
	cr_assert_str_eq(efs_etcd_sync_last_message(s), msg);
	efs_mem_free(msg);
	efs_etcd_sync_last_result(s, &info);
	cr_assert_eq(info.err, -EINVAL);
	cr_assert_eq(info.grpc_status, 3);
	cr_assert(!info.outcome_unknown);

	/* The wrong request type for the method is refused before sending. */
	msg = NULL;
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_RANGE, &pr.base, &resp, &msg), -EINVAL);
	cr_assert_not_null(msg);
	efs_mem_free(msg);

	/* Then a good call works and clears the message. */
	rr.key.data = (uint8_t *)"x";
	rr.key.len = 1;
	cr_assert_eq(efs_etcd_sync_call(s, EFS_ETCD_RANGE, &rr.base, &resp, NULL), 0);
	cr_assert_not_null(resp);
	cr_assert_eq(resp->descriptor, &etcdserverpb__range_response__descriptor);
	cr_assert_str_eq(efs_etcd_sync_last_message(s), "");
	efs_test_pb_free(resp);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	teardown();
	efs_test_assert_no_leaks();
}

Test(sync, dead_endpoint_fails_within_the_deadline)
{
	char url[64];
	struct efs_etcd_sync *s;
	uint64_t t0, ms;
	char *msg = NULL;
	int r;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d", dead_port());
	s = sync_new(url, 1500);
	t0 = efs_clock_mono_ns();
	r = efs_etcd_sync_get(s, "k", 1, NULL, NULL);
	ms = (efs_clock_mono_ns() - t0) / EFS_NSEC_PER_MSEC;
	cr_assert_lt(r, 0);
	cr_assert_neq(r, -ENOENT);
	cr_assert_leq(ms, 1500 + 1000, "took %" PRIu64 " ms", ms);
	cr_assert_neq(efs_etcd_sync_last_message(s)[0], '\0', "the failure is described");

	t0 = efs_clock_mono_ns();
	r = efs_etcd_sync_put(s, "k", 1, "v", 1, 0, NULL);
	ms = (efs_clock_mono_ns() - t0) / EFS_NSEC_PER_MSEC;
	cr_assert_lt(r, 0);
	cr_assert_leq(ms, 1500 + 1000, "took %" PRIu64 " ms", ms);
	cr_assert_eq(efs_etcd_sync_close(s), 0, "the loop closes cleanly after failures");
	(void)msg;
	teardown();
	efs_test_assert_no_leaks();
}

Test(sync, new_and_close_leave_no_descriptors_behind)
{
	struct efs_etcd_opts bad = {.endpoints = "ftp://127.0.0.1:1"};
	struct efs_etcd_sync *s;
	int before, after;

	cr_assert_lt(efs_etcd_sync_new(&s, &bad), 0);
	/* Warm up whatever the first call sets up once per process. */
	s = sync_new(efs_harness_endpoints(h), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "w", 1, "v", 1, 0, NULL), 0);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	before = count_fds();
	for (int i = 0; i < 20; i++) {
		s = sync_new(efs_harness_endpoints(h), 0);
		cr_assert_eq(efs_etcd_sync_put(s, "w", 1, "v", 1, 0, NULL), 0);
		if (i % 2)
			cr_assert_eq(efs_etcd_sync_close(s), 0);
		else
			cr_assert_null(efs_etcd_sync_free(s));
	}
	/* A client that never called anything closes too. */
	s = sync_new(efs_harness_endpoints(h), 0);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	cr_assert_eq(efs_etcd_sync_close(NULL), 0);
	after = count_fds();
	cr_assert_eq(after, before, "%d descriptors before, %d after", before, after);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- etcfsctl ---- */

/* Runs etcfsctl with |args| (a shell-quoted string), output in |out|;
 * returns the exit status. */
static int run_ctl(const char *args, char *out, size_t outsize)
{
	const char *root = getenv("ETCFS_BUILD_ROOT");
	char cmd[2048];
	size_t n = 0;
	FILE *f;
	int st;

	cr_assert_not_null(root, "ETCFS_BUILD_ROOT is not set");
	snprintf(cmd, sizeof(cmd), "%s/etcfsd/etcfsctl %s 2>&1", root, args);
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

static double figure_before(const char *out, const char *unit_after)
{
	const char *p = strstr(out, unit_after);

	cr_assert_not_null(p, "no '%s' in:\n%s", unit_after, out);
	p += strlen(unit_after);
	return strtod(p, NULL);
}

TestSuite(etcfsctl, .init = setup3, .fini = teardown, .timeout = 90);

Test(etcfsctl, etcd_check_reports_a_three_member_cluster)
{
	static char out[65536];
	char args[1024], *p;
	unsigned members = 0;
	int st;

	snprintf(args, sizeof(args),
		 "etcd-check --endpoints %s --duration 1 --concurrency 8 --samples 50",
		 efs_harness_endpoints(h));
	st = run_ctl(args, out, sizeof(out));
	cr_assert(st == 0 || st == 1, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "cluster id: "), "%s", out);
	cr_assert_neq(strtoull(strstr(out, "cluster id: ") + 12, NULL, 16), 0, "%s", out);
	for (p = out; (p = strstr(p, "\n  member ")); p++)
		members++;
	cr_assert_eq(members, 3, "%s", out);
	cr_assert(strstr(out, "members: 3\n"), "%s", out);
	p = strstr(out, "leader: ");
	cr_assert_not_null(p, "%s", out);
	cr_assert_neq(strtoull(p + 8, NULL, 16), 0, "no leader id:\n%s", out);
	for (int i = 0; i < 3; i++)
		cr_assert(strstr(out, efs_harness_member_url(h, i)), "member %d missing:\n%s", i,
			  out);
	cr_assert(strstr(out, "version 3.4.23"), "%s", out);
	cr_assert_gt(figure_before(out, "commit latency (50 serial puts): p50 "), 0);
	cr_assert_gt(figure_before(out, ", p99 "), 0);
	p = strstr(out, " txn/s");
	cr_assert_not_null(p, "%s", out);
	while (p > out && p[-1] != ' ')
		p--;
	cr_assert_gt(strtod(p, NULL), 10.0, "txn/s figure:\n%s", out);
	cr_assert(strstr(out, "verdict: fit") || strstr(out, "verdict: unfit: p99"), "%s", out);
	cr_assert_eq(st, strstr(out, "verdict: fit") ? 0 : 1);

	/* The scratch keys are gone. */
	{
		char *o = NULL;

		cr_assert_eq(efs_harness_etcdctl(h, &o, "get", "--prefix", "--keys-only",
						 "/etcfs-check/", NULL),
			     0);
		cr_assert(!strstr(o, "/etcfs-check/"), "left behind: %s", o);
		free(o);
	}
	teardown();
	efs_test_assert_no_leaks();
}

Test(etcfsctl, etcd_check_with_a_dead_member_is_unfit)
{
	static char out[65536];
	char args[1024];
	int st;

	cr_assert_eq(efs_harness_kill(h, 2), 0);
	snprintf(args, sizeof(args),
		 "etcd-check --endpoints %s --duration 0.5 --concurrency 2 --samples 10",
		 efs_harness_member_url(h, 0));
	st = run_ctl(args, out, sizeof(out));
	cr_assert_eq(st, 1, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "unreachable"), "%s", out);
	cr_assert(strstr(out, "verdict: unfit"), "%s", out);
	cr_assert(strstr(out, "1 of 3 members unreachable"), "%s", out);
	teardown();
	efs_test_assert_no_leaks();
}

Test(etcfsctl, etcd_check_cannot_connect_and_usage_errors)
{
	static char out[65536];
	char args[256];
	uint64_t t0;
	int st;

	snprintf(args, sizeof(args),
		 "etcd-check --endpoints 127.0.0.1:%d --command-timeout 1 --dial-timeout 0.5",
		 dead_port());
	t0 = efs_clock_mono_ns();
	st = run_ctl(args, out, sizeof(out));
	cr_assert_eq(st, 3, "exit %d:\n%s", st, out);
	cr_assert(strstr(out, "cannot reach etcd"), "%s", out);
	cr_assert_lt(efs_clock_mono_ns() - t0, 5 * EFS_NSEC_PER_SEC);

	cr_assert_eq(run_ctl("etcd-check --help", out, sizeof(out)), 0);
	cr_assert(strstr(out, "Exit status"), "%s", out);
	cr_assert(strstr(out, "--cacert"), "%s", out);
	cr_assert_eq(run_ctl("etcd-check --concurrency 0", out, sizeof(out)), 2);
	cr_assert_eq(run_ctl("etcd-check --cert x", out, sizeof(out)), 2, "%s", out);
	cr_assert_eq(run_ctl("no-such-command", out, sizeof(out)), 2);
	cr_assert_eq(run_ctl("--help", out, sizeof(out)), 0);
	cr_assert(strstr(out, "etcd-check"), "%s", out);
	teardown();
	efs_test_assert_no_leaks();
}

/* ---- allocation failures ---- */

TestSuite(sync_failmalloc, .init = setup1, .fini = teardown, .timeout = 120);

/*
 * Fails each allocation of a new/put/get/close scenario in turn: every
 * step either works or returns an error (-ENOMEM or a failed call), and
 * close always closes the loop (leaks show under ASan).
 */
Test(sync_failmalloc, every_allocation_failure_unwinds)
{
	struct efs_etcd_opts o = {.endpoints = efs_harness_endpoints(h), .call_timeout_ms = 400};
	struct efs_etcd_sync *s;
	Mvccpb__KeyValue *kv;
	long total, n;
	int r;

	/* Count the allocations of one clean run. */
	efs_mem_fail_after(-1);
	cr_assert_eq(efs_etcd_sync_new(&s, &o), 0);
	cr_assert_eq(efs_etcd_sync_put(s, "fm", 2, "v", 1, 0, NULL), 0);
	cr_assert_eq(efs_etcd_sync_get(s, "fm", 2, &kv, NULL), 0);
	efs_test_pb_free(kv);
	cr_assert_eq(efs_etcd_sync_close(s), 0);
	total = efs_mem_count();
	cr_assert_gt(total, 10);
	cr_log_info("%ld allocations", total);

	for (n = 0; n < total; n++) {
		kv = NULL;
		efs_mem_fail_after(n);
		r = efs_etcd_sync_new(&s, &o);
		if (r < 0) {
			efs_mem_fail_reset();
			cr_assert_eq(r, -ENOMEM, "new at %ld: %d", n, r);
			continue;
		}
		r = efs_etcd_sync_put(s, "fm", 2, "v", 1, 0, NULL);
		cr_assert_leq(r, 0);
		r = efs_etcd_sync_get(s, "fm", 2, &kv, NULL);
		cr_assert_leq(r, 0);
		if (r == 0)
			efs_test_pb_free(kv);
		efs_mem_fail_reset();
		cr_assert_eq(efs_etcd_sync_close(s), 0, "close after failing allocation %ld", n);
	}
	teardown();
	efs_test_assert_no_leaks();
}
