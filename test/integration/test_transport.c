/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd client's transport and call layer against real etcd members
 * started by test/harness: every unary method, big replies, deadlines,
 * cancellation, failover, reconnects, lost quorum, TLS, auth, the fault
 * hooks, streams, keepalive PINGs and many concurrent calls on one
 * connection.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "config.h"
#include "etcd/client-int.h"
#include "etcd/etcd.h"
#include "harness.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

static struct efs_harness *h;
static uv_loop_t loop;
static struct efs_etcd *cli;

static void init(void)
{
	cr_assert_eq(uv_loop_init(&loop), 0);
}

/* Frees the client and checks that every handle is gone (leaks are checked
 * at the end of each test, after fini()). */
static void free_client(void)
{
	bool freed = false;

	if (!cli)
		return;
	efs_etcd_free(cli, efs_test_freed_cb, &freed);
	cli = NULL;
	while (!freed)
		uv_run(&loop, UV_RUN_ONCE);
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert_eq(uv_loop_close(&loop), 0, "client left handles on the loop");
}

/* Frees the client and the cluster. Each test calls it before its leak
 * check, and .fini again for a test that failed first: then it does nothing. */
static void fini(void)
{
	free_client();
	h = efs_harness_free(h);
}

TestSuite(transport, .init = init, .fini = fini, .timeout = 120);

static void start_cluster(const struct efs_harness_opts *o)
{
	int r = efs_harness_start(&h, o);

	cr_assert_eq(r, 0, "harness start: %s", strerror(-r));
}

static void new_client(const struct efs_etcd_opts *o)
{
	int r = efs_etcd_new(&cli, &loop, o);

	cr_assert_eq(r, 0, "efs_etcd_new: %s", strerror(-r));
}

static void plain_client(void)
{
	struct efs_etcd_opts o = { .endpoints = efs_harness_endpoints(h) };

	new_client(&o);
}

/* ---- Synchronous wrappers ---- */

struct res {
	bool done;
	int err;
	int grpc_status;
	bool unknown;
	char msg[512];
	ProtobufCMessage *resp;
};

static void on_result(struct efs_etcd_result *r, void *arg)
{
	struct res *x = arg;

	cr_assert(!x->done, "callback ran twice (first: %d %s, now: %d %s)", x->err, x->msg,
		  r->err, r->message);
	x->done = true;
	x->err = r->err;
	x->grpc_status = r->grpc_status;
	x->unknown = r->outcome_unknown;
	cr_assert_not_null(r->message);
	snprintf(x->msg, sizeof(x->msg), "%s", r->message);
	x->resp = r->resp;
	r->resp = NULL; /* taken */
	if (x->err == 0)
		cr_assert_not_null(x->resp);
	else
		cr_assert_null(x->resp);
}

static void res_done(struct res *x)
{
	if (x->resp)
		protobuf_c_message_free_unpacked(x->resp, efs_mem_protobuf());
	x->resp = NULL;
}

static void wait_for(bool *flag)
{
	while (!*flag)
		uv_run(&loop, UV_RUN_ONCE);
}

static void call_co(enum efs_etcd_method m, const ProtobufCMessage *req,
		    const struct efs_etcd_callopts *co, struct res *x)
{
	int r;

	memset(x, 0, sizeof(*x));
	r = efs_etcd_call(cli, m, req, co, on_result, x, NULL);
	cr_assert_eq(r, 0, "efs_etcd_call(%s): %s", efs_etcd_method_name(m), strerror(-r));
	cr_assert(!x->done, "callback ran inline");
	wait_for(&x->done);
}

static void call(enum efs_etcd_method m, const ProtobufCMessage *req, struct res *x)
{
	call_co(m, req, NULL, x);
}

static void call_ok(enum efs_etcd_method m, const ProtobufCMessage *req, struct res *x)
{
	call(m, req, x);
	cr_assert_eq(x->err, 0, "%s failed: %d %s", efs_etcd_method_name(m), x->err, x->msg);
}

static int put(const char *key, const void *val, size_t len, struct res *x)
{
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;

	p.key.data = (uint8_t *)key;
	p.key.len = strlen(key);
	p.value.data = (uint8_t *)val;
	p.value.len = len;
	call(EFS_ETCD_PUT, &p.base, x);
	return x->err;
}

static void put_ok(const char *key, const char *val)
{
	struct res x;

	put(key, val, strlen(val), &x);
	cr_assert_eq(x.err, 0, "Put %s: %d %s", key, x.err, x.msg);
	res_done(&x);
}

/* Value of |key| ("" when absent) into |buf|. */
static int get(const char *key, char *buf, size_t size)
{
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *rr;
	struct res x;

	q.key.data = (uint8_t *)key;
	q.key.len = strlen(key);
	call(EFS_ETCD_RANGE, &q.base, &x);
	if (x.err)
		return x.err;
	rr = (Etcdserverpb__RangeResponse *)x.resp;
	buf[0] = '\0';
	if (rr->n_kvs)
		snprintf(buf, size, "%.*s", (int)rr->kvs[0]->value.len,
			 (const char *)rr->kvs[0]->value.data);
	res_done(&x);
	return 0;
}

static int free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	port = ntohs(a.sin_port);
	close(fd); /* nothing listens there now */
	return port;
}

/* SIGSTOP is asynchronous: wait until member |i| really is stopped, so that
 * nothing sent afterwards can still be answered. */
static void pause_member(int i)
{
	char path[64], buf[512];
	pid_t pid = efs_harness_pid(h, i);

	cr_assert_gt(pid, 0);
	cr_assert_eq(efs_harness_pause(h, i), 0);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	for (int n = 0; n < 2000; n++) {
		FILE *f = fopen(path, "r");
		char *p = NULL;

		cr_assert_not_null(f);
		if (fgets(buf, sizeof(buf), f))
			p = strrchr(buf, ')');
		fclose(f);
		if (p && p[1] == ' ' && p[2] == 'T')
			return;
		usleep(1000);
	}
	cr_assert_fail("member %d did not stop", i);
}

/* ---- Tests ---- */

Test(transport, bad_options_are_rejected)
{
	struct efs_etcd_opts o = { 0 };
	struct efs_etcd *c = NULL;

	cr_assert_eq(efs_etcd_new(&c, &loop, &o), -EINVAL);
	o.endpoints = "ftp://x:1";
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), -EINVAL);
	o.endpoints = "http://host:99999";
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), -EINVAL);
	o.endpoints = "[::1";
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), -EINVAL);
	o.endpoints = "https://127.0.0.1:1";
	o.cacert = "/nonexistent/ca.pem";
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), -ENOENT);
	o.cacert = NULL;
	o.cert = "/etc/hostname";
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), -EINVAL, "cert without key");

	/* Endpoint forms that parse; the default port is 2379. */
	o = (struct efs_etcd_opts){ .endpoints = "10.1.2.3, http://h:1/,[::1]:5,[fe80::1]" };
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), 0);
	cr_assert_str_eq(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_BULK), "http://10.1.2.3:2379");
	cr_assert_str_eq(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_PRIO), "http://h:1");
	efs_etcd_channel_failover(c, EFS_ETCD_CH_BULK);
	cr_assert_str_eq(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_BULK), "http://h:1");
	efs_etcd_channel_failover(c, EFS_ETCD_CH_BULK);
	cr_assert_str_eq(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_BULK), "http://[::1]:5");
	efs_etcd_channel_failover(c, EFS_ETCD_CH_BULK);
	cr_assert_str_eq(efs_etcd_channel_endpoint(c, EFS_ETCD_CH_BULK), "http://[fe80::1]:2379");
	cli = c;

	/* A request of the wrong type is refused at once. */
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_PUT, &q.base, NULL, on_result, NULL, NULL),
		     -EINVAL);
	cr_assert_str_eq(efs_etcd_method_name(EFS_ETCD_TXN), "Txn");
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, every_unary_method_round_trips)
{
	struct res x;

	start_cluster(NULL);
	plain_client();

	put_ok("/t/a", "1");
	put_ok("/t/b", "2");

	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/t/";
	q.key.len = 3;
	q.range_end.data = (uint8_t *)"/t0";
	q.range_end.len = 3;
	call_ok(EFS_ETCD_RANGE, &q.base, &x);
	Etcdserverpb__RangeResponse *rr = (void *)x.resp;
	cr_assert_eq(rr->n_kvs, 2);
	cr_assert_eq(rr->kvs[1]->value.len, 1);
	cr_assert_eq(rr->kvs[1]->value.data[0], '2');
	int64_t rev = rr->header->revision;
	res_done(&x);

	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	cmp.key.data = (uint8_t *)"/t/a";
	cmp.key.len = 4;
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE;
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
	cmp.value.data = (uint8_t *)"1";
	cmp.value.len = 1;
	Etcdserverpb__Compare *cmps[] = { &cmp };
	Etcdserverpb__PutRequest tp = ETCDSERVERPB__PUT_REQUEST__INIT;
	tp.key.data = (uint8_t *)"/t/c";
	tp.key.len = 4;
	tp.value.data = (uint8_t *)"3";
	tp.value.len = 1;
	Etcdserverpb__RequestOp op = ETCDSERVERPB__REQUEST_OP__INIT;
	op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	op.request_put = &tp;
	Etcdserverpb__RequestOp *ops[] = { &op };
	Etcdserverpb__TxnRequest t = ETCDSERVERPB__TXN_REQUEST__INIT;
	t.n_compare = 1;
	t.compare = cmps;
	t.n_success = 1;
	t.success = ops;
	call_ok(EFS_ETCD_TXN, &t.base, &x);
	cr_assert(((Etcdserverpb__TxnResponse *)x.resp)->succeeded);
	res_done(&x);

	Etcdserverpb__DeleteRangeRequest d = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	d.key = q.key;
	d.range_end = q.range_end;
	call_ok(EFS_ETCD_DELETE_RANGE, &d.base, &x);
	cr_assert_eq(((Etcdserverpb__DeleteRangeResponse *)x.resp)->deleted, 3);
	res_done(&x);

	Etcdserverpb__CompactionRequest cp = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
	cp.revision = rev;
	call_ok(EFS_ETCD_COMPACT, &cp.base, &x);
	res_done(&x);
	/* A read below the compacted revision is OUT_OF_RANGE. */
	q.revision = rev - 1;
	call(EFS_ETCD_RANGE, &q.base, &x);
	cr_assert_eq(x.grpc_status, 11, "%d %s", x.grpc_status, x.msg);
	cr_assert_lt(x.err, 0);
	cr_assert(strstr(x.msg, "compacted"), "%s", x.msg);
	q.revision = 0;

	Etcdserverpb__LeaseGrantRequest lg = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	lg.ttl = 30;
	call_ok(EFS_ETCD_LEASE_GRANT, &lg.base, &x);
	int64_t id = ((Etcdserverpb__LeaseGrantResponse *)x.resp)->id;
	cr_assert_gt(id, 0);
	res_done(&x);

	Etcdserverpb__LeaseTimeToLiveRequest ttl = ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
	ttl.id = id;
	call_ok(EFS_ETCD_LEASE_TIME_TO_LIVE, &ttl.base, &x);
	cr_assert_eq(((Etcdserverpb__LeaseTimeToLiveResponse *)x.resp)->grantedttl, 30);
	res_done(&x);

	Etcdserverpb__LeaseLeasesRequest ll = ETCDSERVERPB__LEASE_LEASES_REQUEST__INIT;
	call_ok(EFS_ETCD_LEASE_LEASES, &ll.base, &x);
	cr_assert_eq(((Etcdserverpb__LeaseLeasesResponse *)x.resp)->n_leases, 1);
	res_done(&x);

	Etcdserverpb__LeaseRevokeRequest lr = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	lr.id = id;
	call_ok(EFS_ETCD_LEASE_REVOKE, &lr.base, &x);
	res_done(&x);
	call(EFS_ETCD_LEASE_REVOKE, &lr.base, &x);
	cr_assert_eq(x.grpc_status, 5, "revoking twice: %d %s", x.grpc_status, x.msg);

	Etcdserverpb__StatusRequest sr = ETCDSERVERPB__STATUS_REQUEST__INIT;
	call_ok(EFS_ETCD_STATUS, &sr.base, &x);
	cr_assert_str_eq(((Etcdserverpb__StatusResponse *)x.resp)->version, "3.4.23");
	res_done(&x);

	Etcdserverpb__MemberListRequest ml = ETCDSERVERPB__MEMBER_LIST_REQUEST__INIT;
	call_ok(EFS_ETCD_MEMBER_LIST, &ml.base, &x);
	cr_assert_eq(((Etcdserverpb__MemberListResponse *)x.resp)->n_members, 1);
	res_done(&x);

	/* An etcd error arrives trailers-only with its message. */
	Etcdserverpb__PutRequest bad = ETCDSERVERPB__PUT_REQUEST__INIT;
	call(EFS_ETCD_PUT, &bad.base, &x);
	cr_assert_eq(x.grpc_status, 3);
	cr_assert_eq(x.err, -EINVAL, "%d", x.err);
	cr_assert(strstr(x.msg, "key is not provided"), "%s", x.msg);
	cr_assert(!x.unknown);

	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_assert_geq(st.calls_started, 15);
	cr_assert_gt(st.bytes_sent, 0);
	cr_assert_gt(st.bytes_received, 0);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, large_reply_of_20_mib)
{
	enum { N = 20, SZ = 1000 * 1000 };
	char *val = malloc(SZ);
	struct res x;

	cr_assert_not_null(val);
	start_cluster(NULL);
	plain_client();
	for (int i = 0; i < N; i++) {
		char key[32];

		memset(val, 'a' + i, SZ);
		snprintf(key, sizeof(key), "/big/%02d", i);
		cr_assert_eq(put(key, val, SZ, &x), 0, "%s", x.msg);
		res_done(&x);
	}
	free(val);
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/big/";
	q.key.len = 5;
	q.range_end.data = (uint8_t *)"/big0";
	q.range_end.len = 5;
	struct efs_etcd_callopts co = { .timeout_ms = 20000 };
	uint64_t t0 = efs_test_now_ms();
	call_co(EFS_ETCD_RANGE, &q.base, &co, &x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	Etcdserverpb__RangeResponse *rr = (void *)x.resp;
	cr_assert_eq(rr->n_kvs, N);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(rr->kvs[i]->value.len, SZ);
		cr_assert_eq(rr->kvs[i]->value.data[SZ - 1], 'a' + i);
	}
	res_done(&x);
	cr_log_info("20 MB range took %llu ms", (unsigned long long)(efs_test_now_ms() - t0));

	/* The same reply over a client with a small receive limit fails
	 * with -EMSGSIZE, and the connection stays usable. */
	free_client();
	cr_assert_eq(uv_loop_init(&loop), 0);
	struct efs_etcd_opts o = { .endpoints = efs_harness_endpoints(h),
				   .max_recv_msg = 1 << 20 };
	new_client(&o);
	call(EFS_ETCD_RANGE, &q.base, &x);
	cr_assert_eq(x.err, -EMSGSIZE, "%d %s", x.err, x.msg);
	q.keys_only = true;
	call_ok(EFS_ETCD_RANGE, &q.base, &x);
	cr_assert_eq(((Etcdserverpb__RangeResponse *)x.resp)->n_kvs, N);
	res_done(&x);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, local_deadline_and_cancel)
{
	struct res x, y;
	struct efs_etcd_call *handle;

	start_cluster(NULL);
	plain_client();
	put_ok("/d", "1");

	/* A stopped member accepts nothing: the local timer ends the call. */
	pause_member(0);
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/d";
	q.key.len = 2;
	struct efs_etcd_callopts co = { .timeout_ms = 300 };
	uint64_t t0 = efs_test_now_ms();
	call_co(EFS_ETCD_RANGE, &q.base, &co, &x);
	uint64_t took = efs_test_now_ms() - t0;
	cr_assert_eq(x.err, -ETIMEDOUT, "%d %s", x.err, x.msg);
	cr_assert_eq(x.grpc_status, -1);
	cr_assert(!x.unknown, "a read has no unknown outcome");
	cr_assert(took >= 290 && took < 1000, "took %llu ms", (unsigned long long)took);

	/* A mutation that times out after sending has an unknown outcome. */
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	p.key.data = (uint8_t *)"/d2";
	p.key.len = 3;
	call_co(EFS_ETCD_PUT, &p.base, &co, &x);
	cr_assert_eq(x.err, -ETIMEDOUT);
	cr_assert(x.unknown);

	/* Cancel: the callback runs later, once, with -ECANCELED. */
	memset(&y, 0, sizeof(y));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &y, &handle), 0);
	uv_run(&loop, UV_RUN_NOWAIT);
	efs_etcd_call_cancel(handle);
	cr_assert(!y.done);
	wait_for(&y.done);
	cr_assert_eq(y.err, -ECANCELED);

	cr_assert_eq(efs_harness_resume(h, 0), 0);
	char buf[16];
	cr_assert_eq(get("/d", buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "1");

	/* Cancelling before anything went out. */
	memset(&y, 0, sizeof(y));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &y, &handle), 0);
	efs_etcd_call_cancel(handle);
	wait_for(&y.done);
	cr_assert_eq(y.err, -ECANCELED);
	cr_assert(!y.unknown);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, failover_past_a_dead_endpoint)
{
	char eps[512];
	struct res x;

	start_cluster(NULL);
	snprintf(eps, sizeof(eps), "http://127.0.0.1:%d,%s", free_port(),
		 efs_harness_endpoints(h));
	struct efs_etcd_opts o = { .endpoints = eps };
	new_client(&o);
	cr_assert(strstr(efs_etcd_channel_endpoint(cli, EFS_ETCD_CH_BULK), "127.0.0.1:"));
	/* A mutation that never reached a server is retried elsewhere. */
	cr_assert_eq(put("/f", "v", 1, &x), 0, "%s", x.msg);
	res_done(&x);
	cr_assert_str_eq(efs_etcd_channel_endpoint(cli, EFS_ETCD_CH_BULK),
			 efs_harness_member_url(h, 0));
	/* The priority channel started on the live endpoint (1 mod 2). */
	cr_assert_str_eq(efs_etcd_channel_endpoint(cli, EFS_ETCD_CH_PRIO),
			 efs_harness_member_url(h, 0));
	Etcdserverpb__StatusRequest sr = ETCDSERVERPB__STATUS_REQUEST__INIT;
	struct efs_etcd_callopts co = { .channel = EFS_ETCD_CH_PRIO };
	call_co(EFS_ETCD_STATUS, &sr.base, &co, &x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	res_done(&x);

	/* Only dead endpoints: the call ends at its deadline with the
	 * connect error in the message. */
	free_client();
	cr_assert_eq(uv_loop_init(&loop), 0);
	snprintf(eps, sizeof(eps), "127.0.0.1:%d", free_port());
	o = (struct efs_etcd_opts){ .endpoints = eps, .call_timeout_ms = 500 };
	new_client(&o);
	cr_assert_eq(put("/f", "v", 1, &x), -ETIMEDOUT);
	cr_assert(!x.unknown, "never sent: %s", x.msg);
	cr_assert(strstr(x.msg, "refused"), "%s", x.msg);
	fini();
	efs_test_assert_no_leaks();
}

/* A listener that never accepts: TCP connects (the kernel's backlog) but
 * no HTTP/2 SETTINGS ever comes back. Returns the fd; *port gets its port. */
static int silent_listener(int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert(fd >= 0);
	cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(fd, 16), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

Test(transport, connect_timeout_moves_to_the_next_endpoint)
{
	char eps[512];
	struct res x;
	int port, fd;

	start_cluster(NULL);
	fd = silent_listener(&port);
	snprintf(eps, sizeof(eps), "http://127.0.0.1:%d,%s", port, efs_harness_endpoints(h));
	struct efs_etcd_opts o = { .endpoints = eps, .connect_timeout_ms = 300 };
	new_client(&o);
	uint64_t t0 = efs_test_now_ms();
	cr_assert_eq(put("/ct", "v", 1, &x), 0, "%s", x.msg);
	res_done(&x);
	uint64_t took = efs_test_now_ms() - t0;
	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_assert(took >= 280 && took < 2000, "took %llu ms", (unsigned long long)took);
	cr_assert_eq(st.reconnects, 1);
	cr_assert_str_eq(efs_etcd_channel_endpoint(cli, EFS_ETCD_CH_BULK),
			 efs_harness_member_url(h, 0));
	free_client();

	/* Only the silent endpoint: the deadline reports the connect timeout. */
	cr_assert_eq(uv_loop_init(&loop), 0);
	snprintf(eps, sizeof(eps), "http://127.0.0.1:%d", port);
	o = (struct efs_etcd_opts){ .endpoints = eps, .connect_timeout_ms = 200,
				    .call_timeout_ms = 700 };
	new_client(&o);
	cr_assert_eq(put("/ct", "v", 1, &x), -ETIMEDOUT);
	cr_assert(!x.unknown, "never sent: %s", x.msg);
	cr_assert(strstr(x.msg, "connect timed out"), "%s", x.msg);
	close(fd);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, reconnects_after_the_member_restarts)
{
	struct res x;
	char buf[16];

	start_cluster(NULL);
	plain_client();
	put_ok("/r", "1");
	cr_assert_eq(efs_harness_kill(h, 0), 0);
	/* Reads retry through the outage until their deadline. */
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/r";
	q.key.len = 2;
	struct efs_etcd_callopts co = { .timeout_ms = 20000 };
	memset(&x, 0, sizeof(x));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, &co, on_result, &x, NULL), 0);
	for (int i = 0; i < 20; i++)
		uv_run(&loop, UV_RUN_NOWAIT), usleep(10000);
	cr_assert(!x.done, "failed during the outage: %s", x.msg);
	cr_assert_eq(efs_harness_restart(h, 0), 0);
	wait_for(&x.done);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	res_done(&x);
	cr_assert_eq(get("/r", buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "1");
	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_assert_geq(st.reconnects, 1);

	/* An explicit failover drops the connection; the next call makes
	 * a new one (here to the same, only, member). */
	uint64_t before = st.reconnects;
	efs_etcd_channel_failover(cli, EFS_ETCD_CH_BULK);
	put_ok("/r", "2");
	efs_etcd_get_stats(cli, &st);
	cr_assert_eq(st.reconnects, before + 1);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, lost_quorum_times_out, .timeout = 150)
{
	struct efs_harness_opts ho = { .members = 3 };
	struct res x;

	start_cluster(&ho);
	struct efs_etcd_opts o = { .endpoints = efs_harness_member_url(h, 0) };
	new_client(&o);
	put_ok("/q", "1");
	cr_assert_eq(efs_harness_kill(h, 1), 0);
	cr_assert_eq(efs_harness_kill(h, 2), 0);
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	p.key.data = (uint8_t *)"/q";
	p.key.len = 2;
	struct efs_etcd_callopts co = { .timeout_ms = 1500 };
	uint64_t t0 = efs_test_now_ms();
	call_co(EFS_ETCD_PUT, &p.base, &co, &x);
	cr_assert_lt(efs_test_now_ms() - t0, 3000);
	cr_assert(x.err == -ETIMEDOUT || x.unknown, "%d %s", x.err, x.msg);
	cr_assert(x.unknown, "a sent Put without an answer has an unknown outcome");
	/* A linearizable read cannot complete either and is not left hanging. */
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key = p.key;
	call_co(EFS_ETCD_RANGE, &q.base, &co, &x);
	cr_assert_lt(x.err, 0);
	/* A serializable one is served by the minority member. */
	q.serializable = true;
	call_co(EFS_ETCD_RANGE, &q.base, &co, &x);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	res_done(&x);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, tls_with_client_certificates)
{
	struct efs_harness_opts ho = { .tls = true, .client_cert_auth = true };
	struct res x;
	char buf[16];

	start_cluster(&ho);
	cr_assert(!strncmp(efs_harness_endpoints(h), "https://", 8));
	struct efs_etcd_opts o = { .endpoints = efs_harness_endpoints(h),
				   .cacert = efs_harness_cacert(h),
				   .cert = efs_harness_client_cert(h),
				   .key = efs_harness_client_key(h) };
	new_client(&o);
	put_ok("/tls", "yes");
	cr_assert_eq(get("/tls", buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "yes");
	/* Multi-MiB replies go through TLS records and flow control too. */
	enum { SZ = 1000 * 1000 };
	char *val = malloc(SZ);
	cr_assert_not_null(val);
	for (int i = 0; i < 4; i++) {
		char key[32];

		memset(val, 'a' + i, SZ);
		snprintf(key, sizeof(key), "/tlsbig/%d", i);
		cr_assert_eq(put(key, val, SZ, &x), 0, "%s", x.msg);
		res_done(&x);
	}
	free(val);
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/tlsbig/";
	q.key.len = 8;
	q.range_end.data = (uint8_t *)"/tlsbig0";
	q.range_end.len = 8;
	call_ok(EFS_ETCD_RANGE, &q.base, &x);
	Etcdserverpb__RangeResponse *rr = (void *)x.resp;
	cr_assert_eq(rr->n_kvs, 4);
	cr_assert_eq(rr->kvs[3]->value.len, SZ);
	cr_assert_eq(rr->kvs[3]->value.data[SZ - 1], 'd');
	res_done(&x);
	free_client();

	/* Without a client certificate the server refuses the handshake. */
	cr_assert_eq(uv_loop_init(&loop), 0);
	o.cert = o.key = NULL;
	o.call_timeout_ms = 1000;
	new_client(&o);
	cr_assert_lt(put("/tls", "x", 1, &x), 0);
	cr_assert(!x.unknown);
	free_client();

	/* A name the certificate does not carry fails verification. */
	cr_assert_eq(uv_loop_init(&loop), 0);
	o.cert = efs_harness_client_cert(h);
	o.key = efs_harness_client_key(h);
	o.server_name = "wrong.example";
	new_client(&o);
	cr_assert_lt(put("/tls", "x", 1, &x), 0);
	cr_assert(strstr(x.msg, "verif"), "%s", x.msg);
	fini();
	efs_test_assert_no_leaks();
}

#if EFS_FAULT_HOOKS
Test(transport, drop_reply_leaves_outcome_unknown)
{
	struct res x;
	char buf[16];

	start_cluster(NULL);
	plain_client();
	put_ok("/drop", "before");
	efs_etcd_fault_drop_reply(cli, EFS_ETCD_PUT, 2);
	put_ok("/other", "x");
	cr_assert_eq(put("/drop", "after", 5, &x), -ETIMEDOUT, "%d %s", x.err, x.msg);
	cr_assert(x.unknown);
	cr_assert_eq(get("/drop", buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "after", "the dropped Put was applied");
	put_ok("/drop", "again");
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, stall_loop_hook)
{
	start_cluster(NULL);
	plain_client();
	put_ok("/s", "1");
	uint64_t t0 = efs_test_now_ms();
	efs_etcd_fault_stall_loop(cli, 200);
	put_ok("/s", "2");
	cr_assert_geq(efs_test_now_ms() - t0, 200);
	fini();
	efs_test_assert_no_leaks();
}
#endif

#define NPUTS 10000

static void count_cb(struct efs_etcd_result *r, void *arg)
{
	int *left = arg;

	cr_assert_eq(r->err, 0, "%d %d %s", r->err, r->grpc_status, r->message);
	(*left)--;
}

Test(transport, ten_thousand_concurrent_puts)
{
	int left = NPUTS;

	start_cluster(NULL);
	plain_client();
	for (int i = 0; i < NPUTS; i++) {
		Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
		char key[32];

		snprintf(key, sizeof(key), "/many/%05d", i);
		p.key.data = (uint8_t *)key;
		p.key.len = strlen(key);
		p.value = p.key;
		cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_PUT, &p.base, NULL, count_cb, &left,
					   NULL), 0);
	}
	while (left)
		uv_run(&loop, UV_RUN_ONCE);
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/many/";
	q.key.len = 6;
	q.range_end.data = (uint8_t *)"/many0";
	q.range_end.len = 6;
	q.count_only = true;
	struct res x;
	call_ok(EFS_ETCD_RANGE, &q.base, &x);
	cr_assert_eq(((Etcdserverpb__RangeResponse *)x.resp)->count, NPUTS);
	res_done(&x);
	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_assert_eq(st.reconnects, 0, "all on one connection");
	cr_assert_eq(st.calls_failed, 0);
	fini();
	efs_test_assert_no_leaks();
}

/* ---- Streams ---- */

struct watch_state {
	int created;
	int events;
	bool closed;
	int close_err;
	char last_key[64];
};

static void watch_msg(struct efs_etcd_stream *s, const ProtobufCMessage *m, void *arg)
{
	const Etcdserverpb__WatchResponse *w = (const void *)m;
	struct watch_state *ws = arg;

	if (w->created)
		ws->created++;
	for (size_t i = 0; i < w->n_events; i++) {
		ws->events++;
		snprintf(ws->last_key, sizeof(ws->last_key), "%.*s",
			 (int)w->events[i]->kv->key.len, (const char *)w->events[i]->kv->key.data);
	}
}

static void watch_close(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg)
{
	struct watch_state *ws = arg;

	cr_assert(!ws->closed, "close callback ran twice");
	ws->closed = true;
	ws->close_err = r->err;
}

static struct efs_etcd_stream *watch_prefix(struct watch_state *ws, const char *prefix,
					    enum efs_etcd_channel ch)
{
	struct efs_etcd_stream *s;
	Etcdserverpb__WatchCreateRequest cr = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
	Etcdserverpb__WatchRequest wr = ETCDSERVERPB__WATCH_REQUEST__INIT;
	char end[64];
	size_t n = strlen(prefix);

	memcpy(end, prefix, n);
	end[n - 1]++;
	cr_assert_eq(efs_etcd_stream_open(cli, EFS_ETCD_STREAM_WATCH, ch, watch_msg, watch_close,
					  ws, &s), 0);
	cr_assert_eq(efs_etcd_stream_last_send_ns(s), 0);
	cr.key.data = (uint8_t *)prefix;
	cr.key.len = n;
	cr.range_end.data = (uint8_t *)end;
	cr.range_end.len = n;
	cr.watch_id = 7;
	wr.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
	wr.create_request = &cr;
	cr_assert_eq(efs_etcd_stream_send(s, &wr.base), 0);
	return s;
}

static void run_until(bool (*pred)(void *), void *arg, int timeout_ms)
{
	uint64_t end = efs_test_now_ms() + (uint64_t)timeout_ms;

	while (!pred(arg) && efs_test_now_ms() < end) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
}

static bool ws_created(void *arg)
{
	return ((struct watch_state *)arg)->created > 0;
}

static bool ws_has_event(void *arg)
{
	return ((struct watch_state *)arg)->events > 0;
}

static bool ws_closed(void *arg)
{
	return ((struct watch_state *)arg)->closed;
}

Test(transport, watch_stream_and_close)
{
	struct watch_state ws = { 0 };
	struct efs_etcd_stream *s;

	start_cluster(NULL);
	plain_client();
	uint64_t t0 = efs_clock_mono_ns();
	s = watch_prefix(&ws, "/w/", EFS_ETCD_CH_PRIO);
	run_until(ws_created, &ws, 5000);
	cr_assert_eq(ws.created, 1);
	cr_assert_geq(efs_etcd_stream_last_send_ns(s), t0);
	put_ok("/w/x", "1");
	run_until(ws_has_event, &ws, 5000);
	cr_assert_eq(ws.events, 1);
	cr_assert_str_eq(ws.last_key, "/w/x");
	efs_etcd_stream_close(s);
	/* The close callback never runs after stream_close. */
	put_ok("/w/y", "1");
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert(!ws.closed);

	/* A stream open when the client is freed closes with -ECANCELED. */
	struct watch_state ws2 = { 0 };
	watch_prefix(&ws2, "/w/", EFS_ETCD_CH_BULK);
	run_until(ws_created, &ws2, 5000);
	cr_assert_eq(ws2.created, 1);
	free_client();
	cr_assert(ws2.closed);
	cr_assert_eq(ws2.close_err, -ECANCELED);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, keepalive_pings_detect_a_stopped_member, .timeout = 60)
{
	struct watch_state ws = { 0 };

	start_cluster(NULL);
	struct efs_etcd_opts o = { .endpoints = efs_harness_endpoints(h),
				   .ping_interval_ms = 5000, .ping_timeout_ms = 1000 };
	new_client(&o);
	watch_prefix(&ws, "/k/", EFS_ETCD_CH_PRIO);
	run_until(ws_created, &ws, 5000);
	cr_assert_eq(ws.created, 1);
	/* An open stream gets PINGs, acknowledged while the member runs. */
	struct efs_etcd_stats st;
	run_until(ws_closed, &ws, 5600);
	efs_etcd_get_stats(cli, &st);
	cr_assert_geq(st.pings_sent, 1);
	cr_assert(!ws.closed);
	/* A stopped member does not acknowledge: the stream fails. */
	pause_member(0);
	uint64_t t0 = efs_test_now_ms();
	run_until(ws_closed, &ws, 9000);
	cr_assert(ws.closed, "no failure after %llu ms",
		  (unsigned long long)(efs_test_now_ms() - t0));
	cr_assert_lt(ws.close_err, 0);
	cr_assert_eq(efs_harness_resume(h, 0), 0);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, goaway_on_graceful_stop_moves_on, .timeout = 150)
{
	struct efs_harness_opts ho = { .members = 3 };
	struct watch_state ws = { 0 };
	char buf[16];

	start_cluster(&ho);
	plain_client();
	put_ok("/g", "1");
	watch_prefix(&ws, "/g/", EFS_ETCD_CH_BULK);
	run_until(ws_created, &ws, 5000);
	/* A member may still be joining and not serve clients yet; find the
	 * one the channel actually uses. */
	int m = -1;
	for (int i = 0; i < 3; i++)
		if (!strcmp(efs_etcd_channel_endpoint(cli, EFS_ETCD_CH_BULK),
			    efs_harness_member_url(h, i)))
			m = i;
	cr_assert_geq(m, 0);
	/* SIGTERM: etcd stops its gRPC server (GOAWAY, then close). */
	cr_assert_eq(efs_harness_stop(h, m), 0);
	run_until(ws_closed, &ws, 10000);
	cr_assert(ws.closed);
	cr_assert_lt(ws.close_err, 0);
	put_ok("/g", "2");
	cr_assert_eq(get("/g", buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "2");
	cr_assert_str_neq((char *)efs_etcd_channel_endpoint(cli, EFS_ETCD_CH_BULK),
			  (char *)efs_harness_member_url(h, m));
	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_log_info("goaways seen: %lu", (unsigned long)st.goaways);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, auth_token_and_wrong_password)
{
	struct efs_harness_opts ho = { .auth = true, .user = "alice", .auth_token_ttl_s = 1 };
	struct res x;
	char buf[16];

	start_cluster(&ho);
	struct efs_etcd_opts o = { .endpoints = efs_harness_endpoints(h),
				   .user = efs_harness_user(h),
				   .password = efs_harness_user_password(h) };
	new_client(&o);
	put_ok("/auth", "ok");
	cr_assert_eq(get("/auth", buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "ok");

	/* Streams carry the token too: a watch under auth gets its events. */
	struct watch_state ws = { 0 };
	watch_prefix(&ws, "/auth/", EFS_ETCD_CH_PRIO);
	run_until(ws_created, &ws, 5000);
	cr_assert_eq(ws.created, 1);
	put_ok("/auth/w", "1");
	run_until(ws_has_event, &ws, 5000);
	cr_assert_eq(ws.events, 1);

	/* An expired token (TTL 1 s, unused for 2.5 s) is renewed and the
	 * call retried once, invisibly. */
	usleep(2500 * 1000);
	put_ok("/auth", "again");
	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_assert_geq(st.reauths, 1);
	free_client();

	cr_assert_eq(uv_loop_init(&loop), 0);
	o.password = "wrong";
	new_client(&o);
	cr_assert_eq(put("/auth", "x", 1, &x), -EACCES, "%d %s", x.err, x.msg);
	cr_assert(strstr(x.msg, "alice"), "%s", x.msg);
	/* Each later call tries again and fails the same way. */
	cr_assert_eq(put("/auth", "x", 1, &x), -EACCES, "%d %s", x.err, x.msg);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, free_cancels_pending_calls)
{
	struct res x[3];

	start_cluster(NULL);
	plain_client();
	put_ok("/p", "1");
	pause_member(0);
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"/p";
	q.key.len = 2;
	for (int i = 0; i < 3; i++) {
		memset(&x[i], 0, sizeof(x[i]));
		cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &x[i],
					   NULL), 0);
	}
	uv_run(&loop, UV_RUN_NOWAIT);
	free_client();
	for (int i = 0; i < 3; i++) {
		cr_assert(x[i].done);
		cr_assert_eq(x[i].err, -ECANCELED);
	}
	cr_assert_eq(efs_harness_resume(h, 0), 0);
	fini();
	efs_test_assert_no_leaks();
}

/*
 * efs_etcd_free() from inside the client's own callbacks, as the daemon does
 * when it gives up at shutdown: a call that failed while etcd is paused (its
 * attempt is still on the wire, reset), a stream's close callback, and a call
 * to an endpoint nobody listens on, each with other calls pending.
 */
static bool freed_in_cb;

static void free_client_from_cb(void)
{
	freed_in_cb = false;
	efs_etcd_free(cli, efs_test_freed_cb, &freed_in_cb);
	cli = NULL;
}

static void on_result_free_client(struct efs_etcd_result *r, void *arg)
{
	on_result(r, arg);
	free_client_from_cb();
}

static void watch_close_free_client(struct efs_etcd_stream *s, const struct efs_etcd_result *r,
				    void *arg)
{
	watch_close(s, r, arg);
	free_client_from_cb();
}

/* Runs the loop until the client freed from a callback is gone, then
 * checks that it left nothing on the loop. */
static void wait_freed_in_cb(void)
{
	uint64_t end = efs_test_now_ms() + 10000;

	while (!freed_in_cb && efs_test_now_ms() < end) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	cr_assert(freed_in_cb, "efs_etcd_free from a callback never finished");
	uv_run(&loop, UV_RUN_NOWAIT);
	cr_assert_eq(uv_loop_close(&loop), 0, "client left handles on the loop");
}

Test(transport, free_from_the_callback_of_a_call_failed_on_a_paused_member)
{
	Etcdserverpb__LeaseRevokeRequest rq = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	struct efs_etcd_callopts co = { .timeout_ms = 300 };
	struct watch_state ws = { 0 };
	struct res x, y;

	start_cluster(NULL);
	plain_client();
	put_ok("/f", "1");
	watch_prefix(&ws, "/f/", EFS_ETCD_CH_BULK);
	run_until(ws_created, &ws, 5000);
	cr_assert_eq(ws.created, 1);
	pause_member(0);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	p.key.data = (uint8_t *)"/f/p";
	p.key.len = 4;
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_PUT, &p.base, NULL, on_result, &y, NULL), 0);
	rq.id = 0x1234;
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_LEASE_REVOKE, &rq.base, &co,
				   on_result_free_client, &x, NULL), 0);
	wait_freed_in_cb();
	cr_assert(x.done);
	cr_assert_eq(x.err, -ETIMEDOUT, "%d %s", x.err, x.msg);
	cr_assert(y.done);
	cr_assert_eq(y.err, -ECANCELED, "%d %s", y.err, y.msg);
	cr_assert(y.unknown, "a sent Put cancelled by free has an unknown outcome");
	cr_assert(ws.closed);
	cr_assert_eq(ws.close_err, -ECANCELED);
	cr_assert_eq(efs_harness_resume(h, 0), 0);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, free_from_a_stream_close_callback_on_a_paused_member)
{
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct efs_etcd_stream *s;
	struct watch_state ws = { 0 };
	struct res x;

	start_cluster(NULL);
	plain_client();
	put_ok("/g", "1");
	cr_assert_eq(efs_etcd_stream_open(cli, EFS_ETCD_STREAM_WATCH, EFS_ETCD_CH_BULK, watch_msg,
					  watch_close_free_client, &ws, &s), 0);
	pause_member(0);
	memset(&x, 0, sizeof(x));
	q.key.data = (uint8_t *)"/g";
	q.key.len = 2;
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &x, NULL), 0);
	uv_run(&loop, UV_RUN_NOWAIT);
	/* The member answers no PING: drop the connection under both. */
	efs_etcd_channel_failover(cli, EFS_ETCD_CH_BULK);
	wait_freed_in_cb();
	cr_assert(ws.closed);
	cr_assert_eq(ws.close_err, -ECONNRESET, "%d", ws.close_err);
	cr_assert(x.done);
	cr_assert_eq(x.err, -ECANCELED, "%d %s", x.err, x.msg);
	cr_assert_eq(efs_harness_resume(h, 0), 0);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, free_from_the_callback_of_a_call_to_an_unreachable_endpoint)
{
	char ep[64];
	struct efs_etcd_opts o = { .endpoints = ep, .backoff_base_ms = 10, .backoff_max_ms = 50 };
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct efs_etcd_callopts co = { .timeout_ms = 200 };
	struct res x, y;

	snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", free_port());
	new_client(&o);
	memset(&x, 0, sizeof(x));
	memset(&y, 0, sizeof(y));
	q.key.data = (uint8_t *)"/u";
	q.key.len = 2;
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &y, NULL), 0);
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, &co, on_result_free_client, &x,
				   NULL), 0);
	wait_freed_in_cb();
	cr_assert(x.done);
	cr_assert_eq(x.err, -ETIMEDOUT, "%d %s", x.err, x.msg);
	cr_assert(y.done);
	cr_assert_eq(y.err, -ECANCELED, "%d %s", y.err, y.msg);
	fini();
	efs_test_assert_no_leaks();
}

/* ---- In-memory peer (no etcd): exact server behaviour on demand ---- */

static size_t h2_frame(uint8_t *out, uint8_t type, uint8_t flags, uint32_t sid,
		       const uint8_t *payload, size_t len)
{
	out[0] = (uint8_t)(len >> 16);
	out[1] = (uint8_t)(len >> 8);
	out[2] = (uint8_t)len;
	out[3] = type;
	out[4] = flags;
	out[5] = (uint8_t)(sid >> 24);
	out[6] = (uint8_t)(sid >> 16);
	out[7] = (uint8_t)(sid >> 8);
	out[8] = (uint8_t)sid;
	if (len)
		memcpy(out + 9, payload, len);
	return 9 + len;
}

/* HPACK literal header fields without indexing, no Huffman. */
static size_t hpack(uint8_t *out, const char *const *kv)
{
	size_t n = 0;

	for (; kv[0]; kv += 2) {
		size_t nl = strlen(kv[0]), vl = strlen(kv[1]);

		out[n++] = 0;
		out[n++] = (uint8_t)nl;
		memcpy(out + n, kv[0], nl);
		n += nl;
		out[n++] = (uint8_t)vl;
		memcpy(out + n, kv[1], vl);
		n += vl;
	}
	return n;
}

static void feed(const uint8_t *b, size_t n)
{
	cr_assert_eq(efs_etcd_test_feed(cli, b, n), 0);
	uv_run(&loop, UV_RUN_NOWAIT);
}

static void feed_settings(void)
{
	uint8_t b[16];
	uint64_t end = efs_test_now_ms() + 2000;

	/* A retry may wait for its backoff before it connects again. */
	while (efs_etcd_test_feed(cli, NULL, 0) != 0 && efs_test_now_ms() < end) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	uv_run(&loop, UV_RUN_NOWAIT);
	feed(b, h2_frame(b, 4, 0, 0, NULL, 0));
	uv_run(&loop, UV_RUN_NOWAIT);
}

/* A complete successful Range reply on stream |sid|. */
static void feed_range_reply(uint32_t sid)
{
	static const char *const resp[] = { ":status", "200", "content-type", "application/grpc",
					    NULL };
	static const char *const ok[] = { "grpc-status", "0", NULL };
	Etcdserverpb__RangeResponse rr = ETCDSERVERPB__RANGE_RESPONSE__INIT;
	Etcdserverpb__ResponseHeader hd = ETCDSERVERPB__RESPONSE_HEADER__INIT;
	uint8_t hb[256], b[1024], msg[256];
	size_t n = 0, len;

	hd.revision = 42;
	rr.header = &hd;
	rr.count = 7;
	len = protobuf_c_message_pack(&rr.base, msg + 5);
	msg[0] = 0;
	msg[1] = msg[2] = msg[3] = 0;
	msg[4] = (uint8_t)len;
	n += h2_frame(b + n, 1, 4, sid, hb, hpack(hb, resp));
	n += h2_frame(b + n, 0, 0, sid, msg, len + 5);
	n += h2_frame(b + n, 1, 5, sid, hb, hpack(hb, ok));
	feed(b, n);
}

static void mem_client(void)
{
	struct efs_etcd_opts o = { .endpoints = "http://127.0.0.1:1" };
	int r = efs_etcd_test_new(&cli, &loop, &o);

	cr_assert_eq(r, 0);
}

Test(transport, goaway_retries_unprocessed_calls)
{
	struct res x, y;
	uint8_t b[64], pl[32];
	size_t len;

	mem_client();
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"k";
	q.key.len = 1;
	memset(&x, 0, sizeof(x));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &x, NULL), 0);
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	p.key = q.key;
	memset(&y, 0, sizeof(y));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_PUT, &p.base, NULL, on_result, &y, NULL), 0);
	feed_settings();
	const uint8_t *out = efs_etcd_test_output(cli, &len);
	cr_assert_geq(len, 24);
	cr_assert(!memcmp(out, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24), "client preface first");
	cr_assert_gt(len, 24 + 9 + 9, "SETTINGS and request headers went out");

	/* GOAWAY(last_stream_id 1, too_many_pings): stream 1 (Range) may
	 * finish, stream 3 (Put) was not processed and must move to a new
	 * connection, writes included. */
	memcpy(pl, "\0\0\0\1\0\0\0\x0btoo_many_pings", 22);
	feed(b, h2_frame(b, 7, 0, 0, pl, 22));
	feed_range_reply(1);
	wait_for(&x.done);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	cr_assert_eq(((Etcdserverpb__RangeResponse *)x.resp)->count, 7);
	res_done(&x);
	cr_assert(!y.done);

	/* The Put goes out on the replacement connection as its stream 1. */
	efs_etcd_test_output_clear(cli);
	feed_settings();
	out = efs_etcd_test_output(cli, &len);
	cr_assert_gt(len, 24, "Put resent after GOAWAY");
	static const char *const err[] = { ":status", "200", "content-type", "application/grpc",
					   "grpc-status", "3", "grpc-message",
					   "etcdserver: key is not provided", NULL };
	uint8_t hb[256];
	uint8_t big[512];
	feed(big, h2_frame(big, 1, 5, 1, hb, hpack(hb, err)));
	wait_for(&y.done);
	cr_assert_eq(y.err, -EINVAL, "%d %s", y.err, y.msg);
	cr_assert_str_eq(y.msg, "etcdserver: key is not provided");

	struct efs_etcd_stats st;
	efs_etcd_get_stats(cli, &st);
	cr_assert_eq(st.goaways, 1);
	cr_assert_geq(st.calls_retried, 1);
	cr_assert_eq(st.reconnects, 1);
	fini();
	efs_test_assert_no_leaks();
}

Test(transport, broken_server_bytes_fail_cleanly)
{
	struct res x, y;
	uint8_t b[64];

	mem_client();
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	q.key.data = (uint8_t *)"k";
	q.key.len = 1;
	memset(&x, 0, sizeof(x));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &x, NULL), 0);
	Etcdserverpb__PutRequest p = ETCDSERVERPB__PUT_REQUEST__INIT;
	p.key = q.key;
	memset(&y, 0, sizeof(y));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_PUT, &p.base, NULL, on_result, &y, NULL), 0);
	feed_settings();
	/* A frame of an unknown length class: connection error. The sent
	 * Put's outcome is unknown; the Range is retried. */
	memset(b, 0xff, sizeof(b));
	feed(b, sizeof(b));
	wait_for(&y.done);
	cr_assert_eq(y.err, -ECONNRESET, "%d %s", y.err, y.msg);
	cr_assert(y.unknown);
	cr_assert(!x.done);
	feed_settings();
	feed_range_reply(1);
	wait_for(&x.done);
	cr_assert_eq(x.err, 0, "%s", x.msg);
	res_done(&x);

	/* Garbage protobuf in a well-formed reply: -EBADMSG, no retry. */
	memset(&x, 0, sizeof(x));
	cr_assert_eq(efs_etcd_call(cli, EFS_ETCD_RANGE, &q.base, NULL, on_result, &x, NULL), 0);
	uv_run(&loop, UV_RUN_NOWAIT);
	static const char *const resp[] = { ":status", "200", "content-type", "application/grpc",
					    NULL };
	uint8_t hb[128], f[256];
	size_t n = h2_frame(f, 1, 4, 3, hb, hpack(hb, resp));
	const uint8_t bad[] = { 0, 0, 0, 0, 3, 0xff, 0xff, 0xff };
	n += h2_frame(f + n, 0, 1, 3, bad, sizeof(bad));
	feed(f, n);
	wait_for(&x.done);
	cr_assert_eq(x.err, -EBADMSG, "%d %s", x.err, x.msg);
	fini();
	efs_test_assert_no_leaks();
}
