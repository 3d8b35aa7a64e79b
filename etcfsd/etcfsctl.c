/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsctl: administration commands. Each subcommand is one entry of the
 * table at the end of this file; the etcd connection flags keep the names
 * etcdctl users know and are shared by every subcommand.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <uv.h>

#include "backup.h"
#include "cli.h"
#include "config.h"
#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "meta/keys.h"
#include "meta/layout.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "progress.h"
#include "space/freemap.h"
#include "util/clock.h"
#include "util/mem.h"

/* Exit codes, shared by the subcommands and documented in usage(). */
enum {
	EXIT_FIT = 0,
	EXIT_UNFIT = 1,
	EXIT_USAGE = 2,
	EXIT_NOCONNECT = 3,
	EXIT_FAILED = 4,
};

static const char *prog = "etcfsctl";

/* ---- etcd connection flags (cli.c, shared by every command) ---- */

enum {
	OPT_ETCD = 0x100,
	OPT_DURATION,
	OPT_CONCURRENCY,
	OPT_SAMPLES,
	OPT_QUOTA,
	OPT_HELP,
	OPT_NAME,
	OPT_HUMAN,
	OPT_JSON,
	OPT_RECALL_BOUND,
	OPT_INTERVAL,
	OPT_COUNT,
	OPT_INODES,
};

#define CONN_LONGOPTS EFS_CLI_ETCD_LONGOPTS(OPT_ETCD), {"help", no_argument, NULL, OPT_HELP}

static int parse_seconds_ms(const char *s, uint32_t *ret_ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0) || v > 86400)
		return -EINVAL;
	*ret_ms = (uint32_t)(v * 1000.0 + 0.5);
	return 0;
}

static int parse_uint(const char *s, unsigned long max, unsigned long *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v == 0 || v > max || s[0] == '-')
		return -EINVAL;
	*ret = v;
	return 0;
}

/*
 * Handles one shared connection option (getopt_long's |opt| and |name|).
 * Returns 1 when it was one, 0 when it is not, -EINVAL (after printing
 * why) for a bad value, -ENOMEM.
 */
static int conn_args_option(struct efs_cli_etcd *e, int opt, const char *name, const char *val)
{
	char err[EFS_CLI_ERR_MAX] = "";
	int r;

	if (opt != OPT_ETCD)
		return 0;
	r = efs_cli_etcd_option(e, name, val, err, sizeof(err));
	if (r < 0)
		efs_cli_print_err(prog, r, err);
	return r;
}

/* Checks and completes the connection flags after parsing. */
static int conn_args_finish(struct efs_cli_etcd *e)
{
	char err[EFS_CLI_ERR_MAX] = "";
	int r;

	r = efs_cli_etcd_finish(e, err, sizeof(err));
	if (r < 0)
		efs_cli_print_err(prog, r, err);
	return r;
}

/* Client options for |endpoints| (one member, or all of them). */
static void conn_args_to_opts(const struct efs_cli_etcd *e, const char *endpoints,
			      struct efs_etcd_opts *o)
{
	*o = (struct efs_etcd_opts){
		.endpoints = endpoints,
		.cacert = e->cacert,
		.cert = e->cert,
		.key = e->key,
		.user = e->user,
		.password = e->password,
		.call_timeout_ms = e->command_timeout_ms,
		.connect_timeout_ms = e->dial_timeout_ms < 2000 ? e->dial_timeout_ms : 2000,
	};
}

/* Runs |loop| until |*pending| drops to 0 (or nothing is left to run). */
static void run_until_done(uv_loop_t *loop, const unsigned *pending)
{
	while (*pending > 0 && uv_run(loop, UV_RUN_ONCE))
		;
}

static void client_freed(void *arg)
{
	unsigned *pending = arg;

	(*pending)--;
}

/* Closes |c| and waits until its handles are closed. */
static void client_close(uv_loop_t *loop, struct efs_etcd *c)
{
	unsigned pending = 1;

	if (!c)
		return;
	efs_etcd_free(c, client_freed, &pending);
	run_until_done(loop, &pending);
}

/* ---- etcd-check ---- */

/* Verdict thresholds. */
#define CHECK_P99_MAX_MS   10.0
#define CHECK_QUOTA_FRAC   0.8
#define CHECK_QUOTA_DEFAULT (2ULL << 30)

struct member {
	uint64_t id;
	char *name;        /* owned */
	char *client_urls; /* owned, comma-separated; "" when none */
	bool learner;
	/* Status of this member, through its own client. */
	struct efs_etcd *c;
	Etcdserverpb__StatusResponse *status; /* owned, NULL if unreachable */
	char *error; /* owned, why Status failed */
};

struct check {
	uv_loop_t loop;
	struct efs_cli_etcd conn;
	double duration_s;
	unsigned concurrency;
	unsigned samples;
	uint64_t quota;

	struct efs_etcd *c; /* all endpoints */
	uint64_t cluster_id;
	struct member *members;
	size_t nmembers;
	unsigned pending;
	int err;
	char errmsg[512];

	/* Scratch keys live under this prefix, removed at the end. */
	char prefix[64];
	uint64_t leader;

	/* Latency phase. */
	uint64_t *lat_ns;
	size_t nlat;
	uint64_t t0;

	/* Throughput phase. */
	uint64_t deadline_ns;
	uint64_t txns;
	uint64_t txn_errors;
	uint64_t *tp_lat_ns;
	size_t ntp_lat, tp_lat_cap;
	char tp_errmsg[256];

	/* Verdict reasons. */
	char reasons[2048];
	size_t reasons_len;

	/* --json: the report goes to stderr, one object to stdout at the end. */
	bool json;
	double tp_secs; /* the throughput run's length (0: not run) */
};

static void check_reason(struct check *k, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void check_reason(struct check *k, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (k->reasons_len >= sizeof(k->reasons) - 3)
		return;
	if (k->reasons_len) {
		memcpy(k->reasons + k->reasons_len, "; ", 3);
		k->reasons_len += 2;
	}
	va_start(ap, fmt);
	n = vsnprintf(k->reasons + k->reasons_len, sizeof(k->reasons) - k->reasons_len, fmt, ap);
	va_end(ap);
	if (n > 0)
		k->reasons_len += (size_t)n;
	if (k->reasons_len >= sizeof(k->reasons))
		k->reasons_len = sizeof(k->reasons) - 1;
}

static void member_list_cb(struct efs_etcd_result *r, Etcdserverpb__MemberListResponse *resp,
			   void *arg)
{
	struct check *k = arg;

	k->pending--;
	if (r->err) {
		k->err = r->err;
		snprintf(k->errmsg, sizeof(k->errmsg), "%s", r->message);
		return;
	}
	k->cluster_id = resp->header ? resp->header->cluster_id : 0;
	k->members = efs_mem_calloc(resp->n_members ? resp->n_members : 1, sizeof(*k->members));
	if (!k->members) {
		k->err = -ENOMEM;
		return;
	}
	for (size_t i = 0; i < resp->n_members; i++) {
		Etcdserverpb__Member *m = resp->members[i];
		struct member *dst = &k->members[k->nmembers];
		size_t len = 1;

		for (size_t j = 0; j < m->n_clienturls; j++)
			len += strlen(m->clienturls[j]) + 1;
		dst->client_urls = efs_mem_malloc(len);
		dst->name = efs_mem_strdup(m->name && m->name[0] ? m->name : "(unstarted)");
		if (!dst->client_urls || !dst->name) {
			efs_mem_free(dst->client_urls);
			efs_mem_free(dst->name);
			k->err = -ENOMEM;
			return;
		}
		dst->client_urls[0] = '\0';
		for (size_t j = 0; j < m->n_clienturls; j++) {
			if (j)
				strcat(dst->client_urls, ",");
			strcat(dst->client_urls, m->clienturls[j]);
		}
		dst->id = m->id;
		dst->learner = m->islearner;
		k->nmembers++;
	}
}

static void member_status_cb(struct efs_etcd_result *r, Etcdserverpb__StatusResponse *resp,
			     void *arg)
{
	struct member *m = arg;

	if (r->err) {
		m->error = efs_mem_strdup(r->message[0] ? r->message : strerror(-r->err));
	} else {
		m->status = resp;
		r->resp = NULL;
	}
}

struct status_ctx {
	struct check *k;
	struct member *m;
};

static void status_done_cb(struct efs_etcd_result *r, Etcdserverpb__StatusResponse *resp,
			   void *arg)
{
	struct status_ctx *sc = arg;

	member_status_cb(r, resp, sc->m);
	sc->k->pending--;
}

static int check_connect(struct check *k)
{
	struct efs_etcd_opts o;
	int r;

	conn_args_to_opts(&k->conn, k->conn.endpoints, &o);
	r = efs_etcd_new(&k->c, &k->loop, &o);
	if (r < 0) {
		fprintf(stderr, "%s: cannot set up a client for %s: %s\n", prog, k->conn.endpoints,
			strerror(-r));
		return r == -EINVAL ? EXIT_USAGE : EXIT_NOCONNECT;
	}
	r = efs_etcd_member_list(k->c, NULL, member_list_cb, k);
	if (r < 0) {
		fprintf(stderr, "%s: MemberList: %s\n", prog, strerror(-r));
		return EXIT_FAILED;
	}
	k->pending = 1;
	run_until_done(&k->loop, &k->pending);
	if (k->err) {
		bool denied = k->err == -EACCES || k->err == -EPERM;

		fprintf(stderr, "%s: %s %s: %s (%s)\n", prog,
			denied ? "etcd refused access at" : "cannot reach etcd at",
			k->conn.endpoints, k->errmsg[0] ? k->errmsg : "no reply",
			strerror(-k->err));
		return k->err == -ENOMEM ? EXIT_FAILED : EXIT_NOCONNECT;
	}
	return EXIT_FIT;
}

/* Asks every member for its Status through a client of its own, at once. */
static int check_statuses(struct check *k)
{
	struct status_ctx *ctx;
	struct efs_etcd_callopts co = {.timeout_ms = 3000};
	int r;

	ctx = efs_mem_calloc(k->nmembers ? k->nmembers : 1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	k->pending = 0;
	for (size_t i = 0; i < k->nmembers; i++) {
		struct member *m = &k->members[i];
		struct efs_etcd_opts o;

		ctx[i] = (struct status_ctx){k, m};
		if (!m->client_urls[0]) {
			m->error = efs_mem_strdup("member has no client URL (not started?)");
			continue;
		}
		conn_args_to_opts(&k->conn, m->client_urls, &o);
		r = efs_etcd_new(&m->c, &k->loop, &o);
		if (r == 0)
			r = efs_etcd_status(m->c, &co, status_done_cb, &ctx[i]);
		if (r < 0) {
			char buf[256];

			snprintf(buf, sizeof(buf), "cannot ask %s: %s", m->client_urls,
				 strerror(-r));
			m->error = efs_mem_strdup(buf);
			continue;
		}
		k->pending++;
	}
	run_until_done(&k->loop, &k->pending);
	efs_mem_free(ctx);
	return 0;
}

static const char *member_name(const struct check *k, uint64_t id)
{
	for (size_t i = 0; i < k->nmembers; i++)
		if (k->members[i].id == id)
			return k->members[i].name;
	return NULL;
}

static void fmt_bytes(char *buf, size_t size, int64_t b)
{
	if (b >= 10 * 1048576LL)
		snprintf(buf, size, "%" PRId64 " B (%.1f MiB)", b, (double)b / 1048576.0);
	else if (b >= 10 * 1024LL)
		snprintf(buf, size, "%" PRId64 " B (%.1f KiB)", b, (double)b / 1024.0);
	else
		snprintf(buf, size, "%" PRId64 " B", b);
}

/* Prints the cluster and decides the leader; adds verdict reasons. */
static void check_report_cluster(struct check *k)
{
	size_t unreachable = 0;
	uint64_t leader = 0;
	unsigned best = 0;
	bool split = false;

	printf("cluster id: %016" PRIx64 "\n", k->cluster_id);
	printf("members: %zu\n", k->nmembers);
	for (size_t i = 0; i < k->nmembers; i++) {
		const struct member *m = &k->members[i];

		printf("  member %016" PRIx64 " name=%s client-urls=%s learner=%s\n", m->id,
		       m->name, m->client_urls[0] ? m->client_urls : "-",
		       m->learner ? "true" : "false");
	}
	/* The leader is what most members that answered report. */
	for (size_t i = 0; i < k->nmembers; i++) {
		unsigned votes = 0;
		uint64_t l;

		if (!k->members[i].status || !k->members[i].status->leader)
			continue;
		l = k->members[i].status->leader;
		for (size_t j = 0; j < k->nmembers; j++)
			if (k->members[j].status && k->members[j].status->leader == l)
				votes++;
		if (leader && l != leader)
			split = true;
		if (votes > best) {
			best = votes;
			leader = l;
		}
	}
	k->leader = leader;
	if (leader) {
		const char *name = member_name(k, leader);

		printf("leader: %016" PRIx64 " (%s)\n", leader,
		       name ? name : "not a listed member");
	} else {
		printf("leader: none\n");
		check_reason(k, "no leader");
	}
	if (split)
		check_reason(k, "members disagree about the leader");
	printf("status:\n");
	for (size_t i = 0; i < k->nmembers; i++) {
		const struct member *m = &k->members[i];
		const Etcdserverpb__StatusResponse *s = m->status;
		char db[64], use[64];

		if (!s) {
			printf("  %s %016" PRIx64 ": unreachable (%s)\n", m->name, m->id,
			       m->error ? m->error : "no reply");
			unreachable++;
			continue;
		}
		fmt_bytes(db, sizeof(db), s->dbsize);
		fmt_bytes(use, sizeof(use), s->dbsizeinuse);
		printf("  %s %016" PRIx64 ": version %s, db size %s, db size in use %s, raft index "
		       "%" PRIu64 ", raft term %" PRIu64 ", leader %016" PRIx64 "%s\n",
		       m->name, m->id, s->version ? s->version : "?", db, use, s->raftindex,
		       s->raftterm, s->leader, s->islearner ? ", learner" : "");
		for (size_t j = 0; j < s->n_errors; j++) {
			printf("    error: %s\n", s->errors[j]);
			check_reason(k, "%s reports: %s", m->name, s->errors[j]);
		}
		if ((double)s->dbsizeinuse >= CHECK_QUOTA_FRAC * (double)k->quota)
			check_reason(k, "%s db size in use %" PRId64 " B is >= %.0f%% of the quota "
				     "%" PRIu64 " B",
				     m->name, s->dbsizeinuse, CHECK_QUOTA_FRAC * 100, k->quota);
		else if ((double)s->dbsize >= CHECK_QUOTA_FRAC * (double)k->quota)
			check_reason(k, "%s db size %" PRId64 " B is >= %.0f%% of the quota "
				     "%" PRIu64 " B (defragment it)",
				     m->name, s->dbsize, CHECK_QUOTA_FRAC * 100, k->quota);
	}
	if (unreachable)
		check_reason(k, "%zu of %zu members unreachable", unreachable, k->nmembers);
}

/* -- latency: serial puts to one scratch key -- */

static int lat_next(struct check *k);

static void lat_put_cb(struct efs_etcd_result *r, Etcdserverpb__PutResponse *resp, void *arg)
{
	struct check *k = arg;
	int err;

	if (r->err) {
		k->err = r->err;
		snprintf(k->errmsg, sizeof(k->errmsg), "%s", r->message);
		k->pending--;
		return;
	}
	k->lat_ns[k->nlat++] = efs_clock_mono_ns() - k->t0;
	if (k->nlat == k->samples) {
		k->pending--;
		return;
	}
	err = lat_next(k);
	if (err < 0) {
		k->err = err;
		snprintf(k->errmsg, sizeof(k->errmsg), "%s", strerror(-err));
		k->pending--;
	}
}

static int lat_next(struct check *k)
{
	char key[96], val[32];

	snprintf(key, sizeof(key), "%slatency", k->prefix);
	snprintf(val, sizeof(val), "%zu", k->nlat);
	k->t0 = efs_clock_mono_ns();
	return efs_etcd_put(k->c, key, strlen(key), val, strlen(val), NULL, NULL, lat_put_cb, k);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* The q-quantile (nearest rank) of |v| sorted, in milliseconds. */
static double quantile_ms(const uint64_t *v, size_t n, double q)
{
	size_t rank;

	if (n == 0)
		return 0;
	rank = (size_t)ceil(q * (double)n);
	if (rank < 1)
		rank = 1;
	return (double)v[rank - 1] / 1e6;
}

static int check_latency(struct check *k, double *ret_p99)
{
	int r;

	k->lat_ns = efs_mem_calloc(k->samples, sizeof(*k->lat_ns));
	if (!k->lat_ns)
		return -ENOMEM;
	k->err = 0;
	k->errmsg[0] = '\0';
	r = lat_next(k);
	if (r < 0)
		return r;
	k->pending = 1;
	run_until_done(&k->loop, &k->pending);
	if (k->err) {
		printf("commit latency: failed after %zu puts: %s (%s)\n", k->nlat, k->errmsg,
		       strerror(-k->err));
		check_reason(k, "writes fail: %s", k->errmsg[0] ? k->errmsg : strerror(-k->err));
		return 0;
	}
	qsort(k->lat_ns, k->nlat, sizeof(*k->lat_ns), cmp_u64);
	*ret_p99 = quantile_ms(k->lat_ns, k->nlat, 0.99);
	printf("commit latency (%zu serial puts): p50 %.3f ms, p99 %.3f ms, max %.3f ms\n",
	       k->nlat, quantile_ms(k->lat_ns, k->nlat, 0.50), *ret_p99,
	       (double)k->lat_ns[k->nlat - 1] / 1e6);
	if (*ret_p99 > CHECK_P99_MAX_MS)
		check_reason(k, "p99 commit latency %.3f ms > %.0f ms", *ret_p99, CHECK_P99_MAX_MS);
	return 0;
}

/* -- throughput: N workers, each a compare-and-swap loop on its own key -- */

struct worker {
	struct check *k;
	unsigned idx;
	int64_t mod_rev; /* of our key after our last txn; 0: absent */
	uint64_t t0;
	uint64_t seq;
};

static int worker_next(struct worker *w);

static void tp_record(struct check *k, uint64_t ns)
{
	if (k->ntp_lat == k->tp_lat_cap) {
		size_t cap = k->tp_lat_cap ? k->tp_lat_cap * 2 : 4096;
		uint64_t *v = efs_mem_realloc(k->tp_lat_ns, cap * sizeof(*v));

		if (!v)
			return;
		k->tp_lat_ns = v;
		k->tp_lat_cap = cap;
	}
	k->tp_lat_ns[k->ntp_lat++] = ns;
}

static void worker_txn_cb(struct efs_etcd_result *r, Etcdserverpb__TxnResponse *resp, void *arg)
{
	struct worker *w = arg;
	struct check *k = w->k;
	int err;

	if (r->err) {
		k->txn_errors++;
		if (!k->tp_errmsg[0])
			snprintf(k->tp_errmsg, sizeof(k->tp_errmsg), "%s", r->message);
		/* If the txn applied after all, the next compare fails and
		 * its failure branch tells us the key's revision. */
	} else if (!resp->succeeded) {
		/* Someone else wrote our key, or a timed-out txn applied:
		 * take the revision from the failure branch's Range. */
		k->txn_errors++;
		if (!k->tp_errmsg[0])
			snprintf(k->tp_errmsg, sizeof(k->tp_errmsg),
				 "compare failed on a key only this check writes");
		w->mod_rev = 0;
		if (resp->n_responses == 1 && resp->responses[0]->response_case ==
			    ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE) {
			Etcdserverpb__RangeResponse *rr = resp->responses[0]->response_range;

			if (rr->n_kvs)
				w->mod_rev = rr->kvs[0]->mod_revision;
		}
	} else {
		k->txns++;
		tp_record(k, efs_clock_mono_ns() - w->t0);
		w->mod_rev = resp->header ? resp->header->revision : 0;
	}
	if (efs_clock_mono_ns() >= k->deadline_ns) {
		k->pending--;
		return;
	}
	err = worker_next(w);
	if (err < 0) {
		k->txn_errors++;
		k->pending--;
	}
}

static int worker_next(struct worker *w)
{
	struct check *k = w->k;
	char key[96], val[32];
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	Etcdserverpb__Compare *cmps[1] = {&cmp};
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__RangeRequest get = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RequestOp op_put = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp op_get = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp *succ[1] = {&op_put}, *fail[1] = {&op_get};
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;

	snprintf(key, sizeof(key), "%sw%u", k->prefix, w->idx);
	snprintf(val, sizeof(val), "%" PRIu64, w->seq++);
	/* The kind of guarded write etcfs makes: succeed only if the key is
	 * still at the revision we last wrote it at. */
	cmp.key.data = (uint8_t *)key;
	cmp.key.len = strlen(key);
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
	cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
	cmp.mod_revision = w->mod_rev;
	put.key = cmp.key;
	put.value.data = (uint8_t *)val;
	put.value.len = strlen(val);
	op_put.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	op_put.request_put = &put;
	get.key = cmp.key;
	op_get.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
	op_get.request_range = &get;
	txn.n_compare = 1;
	txn.compare = cmps;
	txn.n_success = 1;
	txn.success = succ;
	txn.n_failure = 1;
	txn.failure = fail;
	w->t0 = efs_clock_mono_ns();
	return efs_etcd_txn(k->c, &txn, NULL, worker_txn_cb, w);
}

static int check_throughput(struct check *k)
{
	struct worker *w;
	uint64_t start;
	double secs, p50, p99;
	int r = 0;

	w = efs_mem_calloc(k->concurrency, sizeof(*w));
	if (!w)
		return -ENOMEM;
	start = efs_clock_mono_ns();
	k->deadline_ns = start + (uint64_t)(k->duration_s * 1e9);
	k->pending = 0;
	for (unsigned i = 0; i < k->concurrency; i++) {
		w[i] = (struct worker){.k = k, .idx = i};
		r = worker_next(&w[i]);
		if (r < 0)
			break;
		k->pending++;
	}
	run_until_done(&k->loop, &k->pending);
	secs = (double)(efs_clock_mono_ns() - start) / 1e9;
	k->tp_secs = secs;
	efs_mem_free(w);
	if (r < 0 && k->pending == 0 && k->txns == 0)
		return r;
	qsort(k->tp_lat_ns, k->ntp_lat, sizeof(*k->tp_lat_ns), cmp_u64);
	p50 = quantile_ms(k->tp_lat_ns, k->ntp_lat, 0.50);
	p99 = quantile_ms(k->tp_lat_ns, k->ntp_lat, 0.99);
	printf("throughput (%u concurrent txns for %.1f s): %.1f txn/s (%" PRIu64 " txns, %" PRIu64
	       " errors), txn latency p50 %.3f ms, p99 %.3f ms\n",
	       k->concurrency, secs, (double)k->txns / secs, k->txns, k->txn_errors, p50, p99);
	if (k->txn_errors)
		check_reason(k, "%" PRIu64 " of %" PRIu64 " txns failed (first: %s)", k->txn_errors,
			     k->txns + k->txn_errors, k->tp_errmsg);
	return 0;
}

static void cleanup_cb(struct efs_etcd_result *r, Etcdserverpb__DeleteRangeResponse *resp,
		       void *arg)
{
	struct check *k = arg;

	if (r->err)
		fprintf(stderr, "%s: warning: could not delete the scratch keys under %s: %s\n",
			prog, k->prefix, r->message);
	k->pending--;
}

static void check_cleanup(struct check *k)
{
	struct efs_etcd_delete_opts o = {.prefix = true};

	if (efs_etcd_delete(k->c, k->prefix, strlen(k->prefix), &o, NULL, cleanup_cb, k) < 0) {
		fprintf(stderr, "%s: warning: could not delete the scratch keys under %s\n", prog,
			k->prefix);
		return;
	}
	k->pending = 1;
	run_until_done(&k->loop, &k->pending);
}

static void check_free(struct check *k)
{
	for (size_t i = 0; i < k->nmembers; i++) {
		struct member *m = &k->members[i];

		client_close(&k->loop, m->c);
		if (m->status)
			protobuf_c_message_free_unpacked(&m->status->base, efs_mem_protobuf());
		efs_mem_free(m->name);
		efs_mem_free(m->client_urls);
		efs_mem_free(m->error);
	}
	efs_mem_free(k->members);
	client_close(&k->loop, k->c);
	efs_mem_free(k->lat_ns);
	efs_mem_free(k->tp_lat_ns);
	uv_run(&k->loop, UV_RUN_NOWAIT);
	if (uv_loop_close(&k->loop) < 0)
		fprintf(stderr, "%s: warning: handles left open on the loop\n", prog);
	efs_cli_etcd_free(&k->conn);
}

static int make_prefix(char *buf, size_t size)
{
	uint8_t rnd[8];
	FILE *f = fopen("/dev/urandom", "re");
	size_t n;

	if (!f)
		return -errno;
	n = fread(rnd, 1, sizeof(rnd), f);
	fclose(f);
	if (n != sizeof(rnd))
		return -EIO;
	snprintf(buf, size, "/etcfs-check/%02x%02x%02x%02x%02x%02x%02x%02x/", rnd[0], rnd[1],
		 rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	return 0;
}

static void json_str(const char *s);
static void json_kstr(bool first, const char *key, const char *val);

/* etcd-check --json: the figures of the report as one object. */
static void check_print_json(const struct check *k, bool fit)
{
	printf("{\"verdict\":\"%s\"", fit ? "fit" : "unfit");
	json_kstr(false, "reasons", k->reasons_len ? k->reasons : NULL);
	printf(",\"cluster_id\":\"%016" PRIx64 "\"", k->cluster_id);
	if (k->leader)
		printf(",\"leader\":\"%016" PRIx64 "\"", k->leader);
	else
		printf(",\"leader\":null");
	printf(",\"members\":[");
	for (size_t i = 0; i < k->nmembers; i++) {
		const struct member *m = &k->members[i];
		const Etcdserverpb__StatusResponse *st = m->status;

		printf("%s\n {\"id\":\"%016" PRIx64 "\"", i ? "," : "", m->id);
		json_kstr(false, "name", m->name);
		json_kstr(false, "client_urls", m->client_urls);
		printf(",\"learner\":%s,\"reachable\":%s", m->learner ? "true" : "false",
		       st ? "true" : "false");
		if (st) {
			json_kstr(false, "version", st->version);
			printf(",\"db_size\":%" PRId64 ",\"db_size_in_use\":%" PRId64
			       ",\"raft_index\":%" PRIu64 ",\"raft_term\":%" PRIu64
			       ",\"leader\":\"%016" PRIx64 "\",\"errors\":%zu",
			       st->dbsize, st->dbsizeinuse, st->raftindex, st->raftterm, st->leader,
			       st->n_errors);
		} else {
			json_kstr(false, "error", m->error ? m->error : "no reply");
		}
		printf("}");
	}
	printf("\n]");
	if (k->nlat && !k->err)
		printf(",\"latency\":{\"samples\":%zu,\"p50_ms\":%.3f,\"p99_ms\":%.3f"
		       ",\"max_ms\":%.3f}",
		       k->nlat, quantile_ms(k->lat_ns, k->nlat, 0.50),
		       quantile_ms(k->lat_ns, k->nlat, 0.99), (double)k->lat_ns[k->nlat - 1] / 1e6);
	else
		printf(",\"latency\":null");
	if (k->tp_secs > 0)
		printf(",\"throughput\":{\"concurrency\":%u,\"seconds\":%.3f,\"txns\":%" PRIu64
		       ",\"errors\":%" PRIu64 ",\"txns_per_s\":%.1f,\"p50_ms\":%.3f"
		       ",\"p99_ms\":%.3f}",
		       k->concurrency, k->tp_secs, k->txns, k->txn_errors,
		       (double)k->txns / k->tp_secs, quantile_ms(k->tp_lat_ns, k->ntp_lat, 0.50),
		       quantile_ms(k->tp_lat_ns, k->ntp_lat, 0.99));
	else
		printf(",\"throughput\":null");
	printf("}\n");
	fflush(stdout);
}

static void usage_etcd_check(FILE *f)
{
	fprintf(f,
		"Usage: %s etcd-check [OPTIONS]\n"
		"\n"
		"Checks whether an etcd cluster is fit to hold etcfs metadata: prints the\n"
		"cluster id, every member (id, name, client URLs, learner flag), the leader,\n"
		"each member's version, db size, db size in use and raft index; then measures\n"
		"commit latency (serial puts to a scratch key) and sustained guarded-txn\n"
		"throughput, and ends with a verdict line. Scratch keys live under\n"
		"/etcfs-check/<random>/ and are deleted afterwards.\n"
		"\n"
		"%s"
		"\n"
		"measurement:\n"
		"  --samples N              serial puts for the latency figures (default 200)\n"
		"  --duration SECONDS       length of the throughput run (default 5)\n"
		"  --concurrency N          txns in flight during it (default 16)\n"
		"  --quota-bytes N          the cluster's --quota-backend-bytes (default 2 GiB)\n"
		"  --json                   the report on stderr, one JSON object on stdout\n"
		"  --help                   this text\n"
		"\n"
		"The verdict is 'unfit' when the p99 commit latency exceeds %.0f ms, there is no\n"
		"leader, members disagree about it, a member is unreachable or reports an\n"
		"error (alarm), writes fail, or a member's db size (in use) reaches %.0f%% of\n"
		"the quota.\n"
		"\n"
		"Exit status: 0 fit; 1 unfit; 2 usage error; 3 cannot connect to etcd or it\n"
		"refuses our credentials;\n"
		"4 the check itself failed (out of memory, cannot make the scratch prefix).\n",
		prog, efs_cli_etcd_usage(), CHECK_P99_MAX_MS, CHECK_QUOTA_FRAC * 100);
}

static int cmd_etcd_check(int argc, char **argv)
{
	static const struct option longopts[] = {
		CONN_LONGOPTS,
		{"duration", required_argument, NULL, OPT_DURATION},
		{"concurrency", required_argument, NULL, OPT_CONCURRENCY},
		{"samples", required_argument, NULL, OPT_SAMPLES},
		{"quota-bytes", required_argument, NULL, OPT_QUOTA},
		{"json", no_argument, NULL, OPT_JSON},
		{NULL, 0, NULL, 0},
	};
	struct check k = {
		.duration_s = 5,
		.concurrency = 16,
		.samples = 200,
		.quota = CHECK_QUOTA_DEFAULT,
	};
	char err[EFS_CLI_ERR_MAX] = "";
	double p99 = 0;
	unsigned long v;
	uint32_t ms;
	int opt, idx, r, ret, saved_stdout = -1;

	r = efs_cli_etcd_defaults(&k.conn, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		ret = r == -ENOMEM ? EXIT_FAILED : EXIT_USAGE;
		goto out_args;
	}
	for (;;) {
		idx = 0;
		opt = getopt_long(argc, argv, "", longopts, &idx);
		if (opt == -1)
			break;
		r = conn_args_option(&k.conn, opt, longopts[idx].name, optarg);
		if (r < 0) {
			ret = r == -ENOMEM ? EXIT_FAILED : EXIT_USAGE;
			goto out_args;
		}
		if (r > 0)
			continue;
		switch (opt) {
		case OPT_HELP:
			usage_etcd_check(stdout);
			ret = EXIT_FIT;
			goto out_args;
		case OPT_DURATION:
			if (parse_seconds_ms(optarg, &ms) < 0) {
				fprintf(stderr, "%s: --duration wants seconds > 0, not '%s'\n",
					prog, optarg);
				ret = EXIT_USAGE;
				goto out_args;
			}
			k.duration_s = ms / 1000.0;
			break;
		case OPT_CONCURRENCY:
			if (parse_uint(optarg, 10000, &v) < 0) {
				fprintf(stderr, "%s: --concurrency wants 1..10000, not '%s'\n",
					prog, optarg);
				ret = EXIT_USAGE;
				goto out_args;
			}
			k.concurrency = (unsigned)v;
			break;
		case OPT_SAMPLES:
			if (parse_uint(optarg, 1000000, &v) < 0) {
				fprintf(stderr, "%s: --samples wants 1..1000000, not '%s'\n", prog,
					optarg);
				ret = EXIT_USAGE;
				goto out_args;
			}
			k.samples = (unsigned)v;
			break;
		case OPT_JSON:
			k.json = true;
			break;
		case OPT_QUOTA:
			if (parse_uint(optarg, ULONG_MAX, &v) < 0) {
				fprintf(stderr, "%s: --quota-bytes wants a byte count, not '%s'\n",
					prog, optarg);
				ret = EXIT_USAGE;
				goto out_args;
			}
			k.quota = v;
			break;
		default:
			fprintf(stderr, "Try '%s etcd-check --help'.\n", prog);
			ret = EXIT_USAGE;
			goto out_args;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "%s: etcd-check takes no arguments ('%s')\n", prog, argv[optind]);
		ret = EXIT_USAGE;
		goto out_args;
	}
	r = conn_args_finish(&k.conn);
	if (r < 0) {
		ret = r == -ENOMEM ? EXIT_FAILED : EXIT_USAGE;
		goto out_args;
	}
	r = make_prefix(k.prefix, sizeof(k.prefix));
	if (r < 0) {
		fprintf(stderr, "%s: cannot make a random scratch prefix: %s\n", prog,
			strerror(-r));
		ret = EXIT_FAILED;
		goto out_args;
	}
	r = uv_loop_init(&k.loop);
	if (r < 0) {
		fprintf(stderr, "%s: cannot create an event loop: %s\n", prog, uv_strerror(r));
		ret = EXIT_FAILED;
		goto out_args;
	}

	if (k.json) {
		/* The human report goes to stderr; stdout gets the object. */
		fflush(stdout);
		saved_stdout = dup(STDOUT_FILENO);
		if (saved_stdout < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
			fprintf(stderr, "%s: --json: %s\n", prog, strerror(errno));
			ret = EXIT_FAILED;
			goto out_free;
		}
	}
	ret = check_connect(&k);
	if (ret != EXIT_FIT)
		goto out_free;
	r = check_statuses(&k);
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", prog, strerror(-r));
		ret = EXIT_FAILED;
		goto out_free;
	}
	check_report_cluster(&k);
	fflush(stdout);
	if (!k.leader) {
		printf("commit latency: not measured (no leader)\n");
		printf("throughput: not measured (no leader)\n");
	} else {
		printf("scratch prefix: %s\n", k.prefix);
		r = check_latency(&k, &p99);
		if (r == 0 && !k.err) {
			fflush(stdout);
			r = check_throughput(&k);
		}
		check_cleanup(&k);
		if (r < 0) {
			fprintf(stderr, "%s: measurement failed: %s\n", prog, strerror(-r));
			ret = EXIT_FAILED;
			goto out_free;
		}
	}
	if (k.reasons_len) {
		printf("verdict: unfit: %s\n", k.reasons);
		ret = EXIT_UNFIT;
	} else {
		printf("verdict: fit (p99 commit latency %.3f ms <= %.0f ms, %zu member%s, "
		       "leader %016" PRIx64 ")\n",
		       p99, CHECK_P99_MAX_MS, k.nmembers, k.nmembers == 1 ? "" : "s", k.leader);
		ret = EXIT_FIT;
	}
out_free:
	if (saved_stdout >= 0) {
		fflush(stdout);
		dup2(saved_stdout, STDOUT_FILENO);
		close(saved_stdout);
		if (ret == EXIT_FIT || ret == EXIT_UNFIT)
			check_print_json(&k, ret == EXIT_FIT);
	}
	check_free(&k);
	return ret;
out_args:
	efs_cli_etcd_free(&k.conn);
	return ret;
}

/* ---- df and status: one filesystem, named by DEVICE or --name ---- */

/* What a command takes beyond DEVICE | --name NAME (fs_cmd_parse). */
enum {
	FS_CMD_HUMAN = 1 << 0,	      /* -h, --human-readable */
	FS_CMD_JSON = 1 << 1,	      /* --json */
	FS_CMD_TARGET = 1 << 2,	      /* one more positional argument, optional */
	FS_CMD_RECALL_BOUND = 1 << 3, /* --recall-bound SECONDS */
	FS_CMD_SAMPLES = 1 << 4,      /* --interval SECONDS, --count N */
	FS_CMD_INODES = 1 << 5,	      /* --inodes N */
};

struct fs_cmd {
	struct efs_cli_etcd conn;
	const char *name;   /* --name */
	const char *device; /* DEVICE */
	const char *target; /* the positional after DEVICE (FS_CMD_TARGET), or NULL */
	bool human;
	bool json;
	unsigned recall_bound_s; /* --recall-bound (0: not given) */
	uint32_t interval_ms;	 /* --interval (0: not given) */
	unsigned long count;	 /* --count (0: not given: until interrupted) */
	uint64_t inodes;	 /* --inodes (0: not given) */
	struct efs_etcd_sync *s;
	struct efs_meta_ns ns;
	Etcfs__FsInfo *fi;
	bool sb_matched; /* DEVICE's superblock matched etcd */
};

static const char fs_cmd_help[] =
	"\nThe filesystem is named by DEVICE (its superblock is read and checked against\n"
	"etcd) or by --name NAME (etcd alone).\n";

/* --recall-bound SECONDS: whole seconds in etcfsd's range (1 to 3600). */
static int parse_recall_bound(const char *s, unsigned *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v < 1 || v > 3600) {
		fprintf(stderr, "%s: --recall-bound '%s': seconds from 1 to 3600\n", prog, s);
		return -EINVAL;
	}
	*ret = (unsigned)v;
	return 0;
}

/*
 * Parses the shared arguments of the filesystem commands; |flags| (FS_CMD_*)
 * say which of the optional ones this command takes. Returns -1 to go on,
 * otherwise the exit status.
 */
static int fs_cmd_parse(struct fs_cmd *f, int argc, char **argv, unsigned flags,
			void (*help)(FILE *))
{
	static const struct option longopts[] = {
		CONN_LONGOPTS,
		{"name", required_argument, NULL, OPT_NAME},
		{"human-readable", no_argument, NULL, OPT_HUMAN},
		{"json", no_argument, NULL, OPT_JSON},
		{"recall-bound", required_argument, NULL, OPT_RECALL_BOUND},
		{"interval", required_argument, NULL, OPT_INTERVAL},
		{"count", required_argument, NULL, OPT_COUNT},
		{"inodes", required_argument, NULL, OPT_INODES},
		{NULL, 0, NULL, 0},
	};
	char err[EFS_CLI_ERR_MAX] = "";
	int opt, idx, r;

	r = efs_cli_etcd_defaults(&f->conn, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		return r == -ENOMEM ? EXIT_FAILED : EXIT_USAGE;
	}
	for (;;) {
		idx = 0;
		opt = getopt_long(argc, argv, flags & FS_CMD_HUMAN ? "h" : "", longopts, &idx);
		if (opt == -1)
			break;
		r = conn_args_option(&f->conn, opt, longopts[idx].name, optarg);
		if (r < 0)
			return r == -ENOMEM ? EXIT_FAILED : EXIT_USAGE;
		if (r > 0)
			continue;
		switch (opt) {
		case OPT_HELP:
			help(stdout);
			return EXIT_FIT;
		case OPT_NAME:
			if (!efs_meta_fsname_is_valid(optarg)) {
				fprintf(stderr, "%s: invalid filesystem name '%s'\n", prog, optarg);
				return EXIT_USAGE;
			}
			f->name = optarg;
			break;
		case 'h':
		case OPT_HUMAN:
			if (flags & FS_CMD_HUMAN) {
				f->human = true;
				break;
			}
			fprintf(stderr, "%s: %s has no --human-readable\n", prog, argv[0]);
			fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
			return EXIT_USAGE;
		case OPT_JSON:
			if (flags & FS_CMD_JSON) {
				f->json = true;
				break;
			}
			fprintf(stderr, "%s: %s has no --json\n", prog, argv[0]);
			fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
			return EXIT_USAGE;
		case OPT_RECALL_BOUND:
			if (!(flags & FS_CMD_RECALL_BOUND)) {
				fprintf(stderr, "%s: %s has no --recall-bound\n", prog, argv[0]);
				fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
				return EXIT_USAGE;
			}
			if (parse_recall_bound(optarg, &f->recall_bound_s) < 0)
				return EXIT_USAGE;
			break;
		case OPT_INTERVAL:
		case OPT_COUNT:
			if (!(flags & FS_CMD_SAMPLES)) {
				fprintf(stderr, "%s: %s has no --%s\n", prog, argv[0],
					longopts[idx].name);
				fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
				return EXIT_USAGE;
			}
			if (opt == OPT_INTERVAL ? parse_seconds_ms(optarg, &f->interval_ms) < 0
						: parse_uint(optarg, 1000000000ul, &f->count) < 0 ||
							  f->count == 0) {
				fprintf(stderr, "%s: --%s '%s': %s\n", prog, longopts[idx].name,
					optarg,
					opt == OPT_INTERVAL ? "seconds, e.g. 1 or 0.5"
							    : "a count from 1");
				return EXIT_USAGE;
			}
			break;
		case OPT_INODES: {
			unsigned long long v;
			char *end;

			if (!(flags & FS_CMD_INODES)) {
				fprintf(stderr, "%s: %s has no --inodes\n", prog, argv[0]);
				fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
				return EXIT_USAGE;
			}
			errno = 0;
			v = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' ||
			    v < 2 || v > EFS_LAYOUT_INODES_MAX) {
				fprintf(stderr, "%s: --inodes '%s': a number from 2 to %llu\n",
					prog, optarg, EFS_LAYOUT_INODES_MAX);
				return EXIT_USAGE;
			}
			f->inodes = v;
			break;
		}
		default:
			fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
			return EXIT_USAGE;
		}
	}
	if (optind < argc && !f->name)
		f->device = argv[optind++];
	else if (optind < argc && !(flags & FS_CMD_TARGET))
		f->device = argv[optind++]; /* both: refused below */
	if (optind < argc && (flags & FS_CMD_TARGET))
		f->target = argv[optind++];
	if (!!f->device == !!f->name) {
		fprintf(stderr, "%s: %s wants a DEVICE or --name NAME (one of them)\n", prog,
			argv[0]);
		return EXIT_USAGE;
	}
	if (optind < argc) {
		fprintf(stderr, "%s: %s: unexpected argument '%s'\n", prog, argv[0], argv[optind]);
		fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
		return EXIT_USAGE;
	}
	if (conn_args_finish(&f->conn) < 0)
		return EXIT_USAGE;
	return -1;
}

/* Connects and reads the filesystem's "sb" (checking DEVICE against it).
 * Returns -1 on success, else the exit status. */
static int fs_cmd_open(struct fs_cmd *f)
{
	char err[EFS_CLI_ERR_MAX] = "";
	struct efs_meta_key key;
	Mvccpb__KeyValue *kv = NULL;
	const char *why = NULL;
	int r;

	r = efs_cli_etcd_connect(&f->conn, &f->s, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		return r == -ENOMEM ? EXIT_FAILED : EXIT_NOCONNECT;
	}
	if (f->device) {
		struct efs_cli_device d;
		struct efs_sb sb;

		r = efs_cli_device_open(f->device, false, &d, err, sizeof(err));
		if (r < 0) {
			efs_cli_print_err(prog, r, err);
			return EXIT_FAILED;
		}
		r = efs_cli_check_fs(f->s, &d, &sb, NULL, &f->fi, err, sizeof(err));
		efs_cli_device_close(&d);
		if (r < 0) {
			efs_cli_print_err(prog, r, err);
			return EXIT_FAILED;
		}
		f->sb_matched = true;
		return efs_meta_ns_init(&f->ns, sb.name) < 0 ? EXIT_FAILED : -1;
	}
	if (efs_meta_ns_init(&f->ns, f->name) < 0 || efs_meta_key_sb(&f->ns, &key) < 0)
		return EXIT_USAGE;
	r = efs_etcd_sync_get(f->s, key.buf, key.len, &kv, NULL);
	if (r == -ENOENT) {
		fprintf(stderr, "%s: no filesystem %s in etcd at %s (no \"sb\" record)\n", prog,
			f->name, f->conn.endpoints);
		return EXIT_FAILED;
	}
	if (r < 0) {
		fprintf(stderr, "%s: cannot read filesystem %s: %s\n", prog, f->name,
			efs_etcd_sync_last_message(f->s));
		return EXIT_FAILED;
	}
	r = efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &f->fi, &why);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	if (r < 0) {
		fprintf(stderr, "%s: filesystem %s: the \"sb\" record is corrupt: %s\n", prog,
			f->name, why ? why : strerror(-r));
		return EXIT_FAILED;
	}
	return -1;
}

/* fs_cmd_parse, then fs_cmd_open: -1 to go on, else the exit status. */
static int fs_cmd_start(struct fs_cmd *f, int argc, char **argv, unsigned flags,
			void (*help)(FILE *))
{
	int ret = fs_cmd_parse(f, argc, argv, flags, help);

	return ret >= 0 ? ret : fs_cmd_open(f);
}

static void fs_cmd_done(struct fs_cmd *f)
{
	efs_meta_record_free(f->fi);
	efs_etcd_sync_close(f->s);
	efs_cli_etcd_free(&f->conn);
}

static const char *human_size(uint64_t bytes, char *buf, size_t size)
{
	static const char units[] = "BKMGTPE";
	double v = (double)bytes;
	unsigned u = 0;

	while (v >= 1024 && u + 1 < sizeof(units) - 1) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%" PRIu64 "B", bytes);
	else if (v < 10)
		snprintf(buf, size, "%.1f%c", v, units[u]);
	else
		snprintf(buf, size, "%.0f%c", v, units[u]);
	return buf;
}

static unsigned percent(uint64_t used, uint64_t total)
{
	if (!total)
		return 0;
	/* Rounded up, as df does: any use shows as at least 1 %. */
	return (unsigned)((used * 100 + total - 1) / total);
}

struct df_scan {
	const struct efs_meta_ns *ns;
	uint64_t free_blocks;
	uint32_t groups;
	uint32_t bad;
};

static int df_scan_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct df_scan *d = arg;
	struct efs_meta_key_info info;
	Etcfs__AgFree *fr = NULL;

	if (efs_meta_key_parse(d->ns, kv->key.data, kv->key.len, &info) < 0 ||
	    info.family != EFS_META_K_AG_FREE)
		return 0;
	if (efs_meta_ag_free_decode(kv->value.data, kv->value.len, &fr, NULL) < 0) {
		d->bad++;
		return 0;
	}
	d->free_blocks += fr->free_blocks;
	d->groups++;
	efs_meta_record_free(fr);
	return 0;
}

static void usage_df(FILE *f)
{
	fprintf(f,
		"Usage: %s df [OPTIONS] DEVICE | --name NAME\n"
		"\n"
		"Space and inode usage of one filesystem: blocks total (the data area), used\n"
		"and free (the sum of the groups' free counts), inodes total (the limit), used\n"
		"(the inode records) and free.\n"
		"%s"
		"\n"
		"  --name NAME              the filesystem\n"
		"  -h, --human-readable     sizes in powers of 1024 (K, M, G, ...)\n"
		"  --json                   one JSON object on stdout (blocks and bytes)\n"
		"  --help                   this text\n"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 success; 2 usage error; 3 cannot connect to etcd; 4 failed.\n",
		prog, fs_cmd_help, efs_cli_etcd_usage());
}

static int cmd_df(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct df_scan d = {0};
	struct efs_meta_range range;
	char err[EFS_CLI_ERR_MAX] = "";
	uint64_t total, used, iused, ifree;
	int64_t inodes;
	int ret, r;

	ret = fs_cmd_start(&f, argc, argv, FS_CMD_HUMAN | FS_CMD_JSON, usage_df);
	if (ret >= 0)
		goto out;
	d.ns = &f.ns;
	ret = EXIT_FAILED;
	r = efs_meta_range_family(&f.ns, EFS_META_K_AG_FREE, &range);
	if (r == 0)
		r = efs_cli_range_foreach(f.s, &range, false, df_scan_cb, &d, err, sizeof(err));
	if (r == 0)
		r = efs_meta_range_family(&f.ns, EFS_META_K_INODE, &range);
	if (r == 0)
		r = efs_cli_range_count(f.s, &range, &inodes, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		goto out;
	}
	total = f.fi->device_size / f.fi->block_size - f.fi->data_start;
	used = d.free_blocks < total ? total - d.free_blocks : 0;
	iused = (uint64_t)inodes;
	ifree = iused < f.fi->inode_limit ? f.fi->inode_limit - iused : 0;
	if (f.json) {
		printf("{");
		json_kstr(true, "filesystem", f.fi->name);
		printf(",\"block_size\":%" PRIu32 ",\"blocks\":%" PRIu64 ",\"used_blocks\":%" PRIu64
		       ",\"free_blocks\":%" PRIu64 ",\"size_bytes\":%" PRIu64
		       ",\"used_bytes\":%" PRIu64 ",\"free_bytes\":%" PRIu64
		       ",\"use_percent\":%u,\"inodes\":%" PRIu64 ",\"inodes_used\":%" PRIu64
		       ",\"inodes_free\":%" PRIu64 ",\"inodes_use_percent\":%u"
		       ",\"groups\":%" PRIu32 ",\"groups_counted\":%" PRIu32 "}\n",
		       f.fi->block_size, total, used, d.free_blocks, total * f.fi->block_size,
		       used * f.fi->block_size, d.free_blocks * f.fi->block_size,
		       percent(used, total), f.fi->inode_limit, iused, ifree,
		       percent(iused, f.fi->inode_limit), f.fi->ag_count, d.groups);
	} else if (f.human) {
		char a[16], b[16], c[16];
		uint64_t bs = f.fi->block_size;

		printf("%-20s %7s %7s %7s %4s %10s %10s %10s %5s\n", "Filesystem", "Size", "Used",
		       "Avail", "Use%", "Inodes", "IUsed", "IFree", "IUse%");
		printf("%-20s %7s %7s %7s %3u%% %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %4u%%\n",
		       f.fi->name, human_size(total * bs, a, sizeof(a)),
		       human_size(used * bs, b, sizeof(b)),
		       human_size(d.free_blocks * bs, c, sizeof(c)), percent(used, total),
		       f.fi->inode_limit, iused, ifree, percent(iused, f.fi->inode_limit));
	} else {
		printf("%-20s %6s %12s %12s %12s %4s %10s %10s %10s %5s\n", "Filesystem", "Block",
		       "Blocks", "Used", "Free", "Use%", "Inodes", "IUsed", "IFree", "IUse%");
		printf("%-20s %6" PRIu32 " %12" PRIu64 " %12" PRIu64 " %12" PRIu64
		       " %3u%% %10" PRIu64 " %10" PRIu64 " %10" PRIu64 " %4u%%\n",
		       f.fi->name, f.fi->block_size, total, used, d.free_blocks,
		       percent(used, total), f.fi->inode_limit, iused, ifree,
		       percent(iused, f.fi->inode_limit));
	}
	ret = EXIT_FIT;
	if (d.groups != f.fi->ag_count || d.bad) {
		fprintf(stderr,
			"%s: warning: %" PRIu32 " of %" PRIu32 " groups have a free count%s; "
			"run fsck.etcfs\n",
			prog, d.groups, f.fi->ag_count, d.bad ? " (some unreadable)" : "");
	}
out:
	fs_cmd_done(&f);
	return ret;
}

static void format_time(int64_t ns, char *buf, size_t size)
{
	time_t t = (time_t)(ns / 1000000000);
	struct tm tm;

	if (!gmtime_r(&t, &tm) || !strftime(buf, size, "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(buf, size, "%" PRId64 " ns", ns);
}

/* A session lease as LeaseTimeToLive sees it. */
struct lease_ttl {
	int err;	    /* 0, or the call's -errno */
	int64_t ttl_s;	    /* remaining; -1: expired (etcd does not know it) */
	int64_t granted_s;  /* the TTL it was granted with */
};

/* Asks etcd for lease |id|'s remaining TTL (bounded by the command
 * timeout) into |ret|. */
static void lease_ttl_get(struct efs_etcd_sync *s, int64_t id, struct lease_ttl *ret)
{
	Etcdserverpb__LeaseTimeToLiveRequest req = ETCDSERVERPB__LEASE_TIME_TO_LIVE_REQUEST__INIT;
	Etcdserverpb__LeaseTimeToLiveResponse *resp = NULL;

	*ret = (struct lease_ttl){0};
	req.id = id;
	ret->err = efs_etcd_sync_call(s, EFS_ETCD_LEASE_TIME_TO_LIVE, &req.base,
				      (ProtobufCMessage **)&resp, NULL);
	if (ret->err == 0) {
		ret->ttl_s = resp->ttl < 0 ? -1 : resp->ttl;
		ret->granted_s = resp->grantedttl;
	}
	if (resp)
		protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
}

/* "remaining/granted", "expired", "none" (|lease| 0) or "? (why)" for
 * lease |lease|, asking etcd; the answer also in |ret| when not NULL. */
static void format_lease_ttl(struct efs_etcd_sync *s, int64_t lease, char *buf, size_t size,
			     struct lease_ttl *ret)
{
	struct lease_ttl lt = {.err = -ENOENT};

	snprintf(buf, size, "none");
	if (lease) {
		lease_ttl_get(s, lease, &lt);
		if (lt.err < 0)
			snprintf(buf, size, "? (%s)", strerror(-lt.err));
		else if (lt.ttl_s < 0)
			snprintf(buf, size, "expired");
		else
			snprintf(buf, size, "%" PRId64 "s/%" PRId64 "s", lt.ttl_s, lt.granted_s);
	}
	if (ret)
		*ret = lt;
}

struct status_scan {
	struct fs_cmd *f;
	unsigned nodes;
	int64_t now_ns;
};

/* One node of status --json: an object in the "nodes" array. */
static int status_node_json(struct status_scan *st, const Mvccpb__KeyValue *kv,
			    const char *node)
{
	Etcfs__NodeInfo *ni = NULL;
	const char *why = NULL;
	struct lease_ttl lt;
	char started[32];
	int64_t lease;
	int r;

	printf("%s\n {", st->nodes++ ? "," : "");
	json_kstr(true, "node", node);
	r = efs_meta_nodeinfo_decode(kv->value.data, kv->value.len, &ni, &why);
	if (r < 0) {
		printf(",\"readable\":false");
		json_kstr(false, "error", why ? why : strerror(-r));
		printf("}");
		return r == -ENOMEM ? r : 0;
	}
	lease = kv->lease ? kv->lease : ni->lease_id;
	lease_ttl_get(st->f->s, lease, &lt);
	format_time(ni->started_ns, started, sizeof(started));
	printf(",\"readable\":true");
	json_kstr(false, "hostname", ni->hostname);
	printf(",\"pid\":%" PRId32, ni->pid);
	json_kstr(false, "version", ni->version);
	printf(",\"session_generation\":%" PRIu64 ",\"lease_id\":%" PRId64, ni->session_generation,
	       lease);
	if (lt.err == 0 && lt.ttl_s >= 0)
		printf(",\"lease_ttl_s\":%" PRId64 ",\"lease_granted_ttl_s\":%" PRId64, lt.ttl_s,
		       lt.granted_s);
	else
		printf(",\"lease_ttl_s\":null,\"lease_granted_ttl_s\":null");
	printf(",\"clock_skew_s\":%.3f", (double)(ni->wall_clock_ns - st->now_ns) / 1e9);
	printf(",\"started_ns\":%" PRId64, ni->started_ns);
	json_kstr(false, "started", started);
	json_kstr(false, "metrics_addr", ni->metrics_addr[0] ? ni->metrics_addr : NULL);
	printf("}");
	efs_meta_record_free(ni);
	return 0;
}

static int status_node_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct status_scan *st = arg;
	struct efs_meta_key_info info;
	Etcfs__NodeInfo *ni = NULL;
	const char *why = NULL;
	char ttl[48], skew[32], started[32];
	int64_t lease;
	int r;

	if (efs_meta_key_parse(&st->f->ns, kv->key.data, kv->key.len, &info) < 0 ||
	    info.family != EFS_META_K_NODE)
		return 0;
	if (st->f->json)
		return status_node_json(st, kv, info.node);
	if (!st->nodes++)
		printf("  %-16s %-16s %8s %-10s %-14s %10s %10s %-20s %s\n", "NODE", "HOSTNAME",
		       "PID", "VERSION", "LEASE-TTL", "GENERATION", "CLOCK-SKEW", "STARTED",
		       "METRICS");
	r = efs_meta_nodeinfo_decode(kv->value.data, kv->value.len, &ni, &why);
	if (r < 0) {
		printf("  %-16s (unreadable record: %s)\n", info.node, why ? why : strerror(-r));
		return r == -ENOMEM ? r : 0;
	}
	lease = kv->lease ? kv->lease : ni->lease_id;
	format_lease_ttl(st->f->s, lease, ttl, sizeof(ttl), NULL);
	snprintf(skew, sizeof(skew), "%+.3fs",
		 (double)(ni->wall_clock_ns - st->now_ns) / 1e9);
	format_time(ni->started_ns, started, sizeof(started));
	printf("  %-16s %-16s %8" PRId32 " %-10s %-14s %10" PRIu64 " %10s %-20s %s\n", info.node,
	       ni->hostname[0] ? ni->hostname : "-", ni->pid, ni->version[0] ? ni->version : "-",
	       ttl, ni->session_generation, skew, started,
	       ni->metrics_addr[0] ? ni->metrics_addr : "-");
	efs_meta_record_free(ni);
	return 0;
}

static void usage_status(FILE *f)
{
	fprintf(f,
		"Usage: %s status [OPTIONS] DEVICE | --name NAME\n"
		"\n"
		"The identity of one filesystem (name, UUID, geometry, inode limit, creation\n"
		"time) and the nodes that have it mounted: node id, hostname, daemon pid and\n"
		"version, the session lease's remaining/granted TTL (LeaseTimeToLive), the\n"
		"session generation, the clock skew (the node's clock when it last wrote its\n"
		"record minus the local clock now: minus the record's age when clocks agree;\n"
		"positive means the node's clock is ahead), start time and metrics address.\n"
		"%s"
		"\n"
		"  --name NAME              the filesystem\n"
		"  --json                   one JSON object on stdout\n"
		"  --help                   this text\n"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 success; 2 usage error; 3 cannot connect to etcd; 4 failed.\n",
		prog, fs_cmd_help, efs_cli_etcd_usage());
}

/* The filesystem part of status --json (the "nodes" array follows). */
static void status_print_json_head(const struct fs_cmd *f, const char *uuid, const char *created)
{
	printf("{");
	json_kstr(true, "filesystem", f->fi->name);
	json_kstr(false, "uuid", uuid);
	json_kstr(false, "endpoints", f->conn.endpoints);
	json_kstr(false, "device", f->device);
	printf(",\"format_version\":%" PRIu32 ",\"feature_compat\":%" PRIu64
	       ",\"feature_ro_compat\":%" PRIu64 ",\"feature_incompat\":%" PRIu64
	       ",\"block_size\":%" PRIu32 ",\"device_size\":%" PRIu64 ",\"data_start\":%" PRIu64
	       ",\"ag_count\":%" PRIu32 ",\"ag_blocks\":%" PRIu64 ",\"inode_limit\":%" PRIu64
	       ",\"created_ns\":%" PRId64,
	       f->fi->format_version, f->fi->feature_compat, f->fi->feature_ro_compat,
	       f->fi->feature_incompat, f->fi->block_size, f->fi->device_size, f->fi->data_start,
	       f->fi->ag_count, f->fi->ag_blocks, f->fi->inode_limit, f->fi->created_ns);
	json_kstr(false, "created", created);
	printf(",\"nodes\":[");
}

static int cmd_status(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct status_scan st = {.f = &f};
	struct efs_meta_range range;
	char err[EFS_CLI_ERR_MAX] = "", uuid[37] = "?", created[32];
	int ret, r;

	ret = fs_cmd_start(&f, argc, argv, FS_CMD_JSON, usage_status);
	if (ret >= 0)
		goto out;
	if (f.fi->uuid.len == 16)
		efs_sb_uuid_format(f.fi->uuid.data, uuid);
	format_time(f.fi->created_ns, created, sizeof(created));
	if (f.json) {
		st.now_ns = (int64_t)efs_clock_real_ns();
		r = efs_meta_range_family(&f.ns, EFS_META_K_NODE, &range);
		status_print_json_head(&f, uuid, created);
		if (r == 0)
			r = efs_cli_range_foreach(f.s, &range, false, status_node_cb, &st, err,
						  sizeof(err));
		printf("\n]}\n");
		fflush(stdout);
		if (r < 0) {
			efs_cli_print_err(prog, r, err);
			ret = EXIT_FAILED;
		} else {
			ret = EXIT_FIT;
		}
		goto out;
	}
	printf("filesystem: %s\n"
	       "  uuid:        %s\n"
	       "  etcd:        %s (keys under /etcfs/%s/)\n",
	       f.fi->name, uuid, f.conn.endpoints, f.fi->name);
	if (f.device)
		printf("  device:      %s (superblock matches etcd)\n", f.device);
	printf("  format:      version %" PRIu32 ", features compat 0x%" PRIx64
	       " ro_compat 0x%" PRIx64 " incompat 0x%" PRIx64 "\n"
	       "  block size:  %" PRIu32 "\n"
	       "  size:        %" PRIu64 " bytes, data from block %" PRIu64 "\n"
	       "  groups:      %" PRIu32 " of %" PRIu64 " blocks\n"
	       "  inode limit: %" PRIu64 "\n"
	       "  created:     %s\n",
	       f.fi->format_version, f.fi->feature_compat, f.fi->feature_ro_compat,
	       f.fi->feature_incompat, f.fi->block_size, f.fi->device_size, f.fi->data_start,
	       f.fi->ag_count, f.fi->ag_blocks, f.fi->inode_limit, created);
	fflush(stdout);
	st.now_ns = (int64_t)efs_clock_real_ns();
	ret = EXIT_FAILED;
	r = efs_meta_range_family(&f.ns, EFS_META_K_NODE, &range);
	if (r == 0) {
		printf("mounted on:\n");
		r = efs_cli_range_foreach(f.s, &range, false, status_node_cb, &st, err,
					  sizeof(err));
	}
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		goto out;
	}
	if (!st.nodes)
		printf("  no node\n");
	ret = EXIT_FIT;
out:
	fs_cmd_done(&f);
	return ret;
}

/* ---- JSON output (--json) ---- */

/*
 * The length of the UTF-8 sequence at |p| (1 to 4 bytes), 0 when it is not
 * a valid one (overlong, a surrogate, beyond U+10FFFF, or cut short, the
 * terminating NUL included).
 */
static size_t utf8_len(const unsigned char *p)
{
	uint32_t cp;
	size_t n;

	if (p[0] < 0x80)
		return 1;
	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		n = 2;
		cp = p[0] & 0x1f;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		n = 3;
		cp = p[0] & 0x0f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		n = 4;
		cp = p[0] & 0x07;
	} else {
		return 0;
	}
	for (size_t i = 1; i < n; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (p[i] & 0x3f);
	}
	if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
	    (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
		return 0;
	return n;
}

/*
 * Writes |s| as a JSON string, or null when |s| is NULL: quotes,
 * backslashes and control characters escaped, and each byte that is not
 * part of valid UTF-8 written as U+FFFD, since hostnames and paths are
 * whatever users made them.
 */
static void json_str(const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	if (!s) {
		fputs("null", stdout);
		return;
	}
	putchar('"');
	while (*p) {
		size_t n = utf8_len(p);

		if (n == 0) {
			fputs("\\ufffd", stdout);
			p++;
		} else if (n > 1) {
			fwrite(p, 1, n, stdout);
			p += n;
		} else if (*p == '"' || *p == '\\') {
			printf("\\%c", *p++);
		} else if (*p == '\n') {
			fputs("\\n", stdout);
			p++;
		} else if (*p == '\t') {
			fputs("\\t", stdout);
			p++;
		} else if (*p < 0x20 || *p == 0x7f) {
			printf("\\u%04x", *p++);
		} else {
			putchar(*p++);
		}
	}
	putchar('"');
}

/* `"key":` and a string value (null for NULL), after a comma unless
 * |first|. */
static void json_kstr(bool first, const char *key, const char *val)
{
	printf("%s\"%s\":", first ? "" : ",", key);
	json_str(val);
}

/* Seconds with millisecond (|prec| digits) precision, or null when
 * |known| is false. */
static void json_kseconds(const char *key, bool known, double v, int prec)
{
	if (known)
		printf(",\"%s\":%.*f", key, prec, v);
	else
		printf(",\"%s\":null", key);
}

/* The options of the filesystem commands with --json, for their --help. */
static const char json_cmd_options[] =
	"  --name NAME              the filesystem\n"
	"  --json                   one JSON document on stdout (docs/OPERATIONS.md)\n"
	"  --help                   this text\n";

/* ---- locks ---- */

/* A recall older than this with a conflicting holder is flagged, unless
 * --recall-bound says otherwise: etcfsd's --recall-bound and its default,
 * after which the holder's daemon logs and counts it
 * (etcfs_lock_recalls_unanswered_total). */
#define LOCKS_UNANSWERED_S 30

/* How long resolving a PATH (stat(2) through the mount) may take. */
#define LOCKS_STAT_MS 2000

/* A holder key l/<ino><mode><node> or a recall key w/<ino><seq><node>,
 * with its record. */
struct lock_key {
	uint64_t ino;
	char mode; /* a holder's enum efs_meta_lock_mode */
	char node[EFS_META_NODE_MAX + 1];
	int64_t create_revision;
	/* The record, owned, NULL when unreadable: a holder's granted_ns is
	 * its wall clock at the grant, a waiter's since_ns when it queued
	 * (0: unknown). */
	Etcfs__LockHolder *holder;
	Etcfs__LockWaiter *waiter;
	bool shared;	 /* a waiter wants shared (exclusive when unreadable) */
	int64_t since_ns; /* a waiter's since_ns */
	bool unanswered; /* a waiter older than the bound with a blocking holder */
};

struct locks_scan {
	struct fs_cmd *f;
	struct lock_key *h; /* holders in key order, so by inode */
	size_t nh, hcap;
	struct lock_key *w; /* waiters by inode, then arrival */
	size_t nw, wcap;
	unsigned unanswered;
	unsigned bound_s; /* a recall older than this may be unanswered */
	int64_t now_ns;
	/* The filter (PATH | INO), 0: every lock. */
	uint64_t ino;
	const char *path;
};

static const char *lock_mode_name(char mode)
{
	return mode == EFS_META_LOCK_EXCLUSIVE ? "exclusive" : "shared";
}

/* Whether |h| is another node's holder that keeps |w| waiting. */
static bool holder_blocks(const struct lock_key *h, const struct lock_key *w)
{
	return h->ino == w->ino && strcmp(h->node, w->node) &&
	       !(w->shared && h->mode == EFS_META_LOCK_SHARED);
}

static void format_age(int64_t since_ns, int64_t now_ns, char *buf, size_t size)
{
	if (since_ns <= 0)
		snprintf(buf, size, "?");
	else
		snprintf(buf, size, "%.1fs", (double)(now_ns - since_ns) / 1e9);
}

/*
 * For the scans that collect one element per key: parses |kv|'s key into
 * |info| and makes room for element |n| + 1 of the array |*arrp| (|cap|,
 * elements of |size| bytes; efs_mem_reserve). 1 when the key is of
 * |family| and there is room, 0 for a key to skip, -ENOMEM.
 */
static int scan_key_add(const struct efs_meta_ns *ns, const Mvccpb__KeyValue *kv,
			enum efs_meta_family family, struct efs_meta_key_info *info, void *arrp,
			size_t *cap, size_t n, size_t size)
{
	if (efs_meta_key_parse(ns, kv->key.data, kv->key.len, info) < 0 || info->family != family)
		return 0;
	return efs_mem_reserve(arrp, cap, n + 1, size) < 0 ? -ENOMEM : 1;
}

/* Collects the holder keys (l/) and the recall keys (w/) of the scans. */
static int locks_key_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct locks_scan *ls = arg;
	struct efs_meta_key_info info;
	int r;

	bool holder;
	struct lock_key *k;

	if (efs_meta_key_parse(&ls->f->ns, kv->key.data, kv->key.len, &info) < 0)
		return 0;
	holder = info.family == EFS_META_K_HOLDER;
	r = scan_key_add(&ls->f->ns, kv, holder ? EFS_META_K_HOLDER : EFS_META_K_RECALL, &info,
			 holder ? &ls->h : &ls->w, holder ? &ls->hcap : &ls->wcap,
			 holder ? ls->nh : ls->nw, sizeof(*k));
	if (r <= 0)
		return r;
	k = holder ? &ls->h[ls->nh++] : &ls->w[ls->nw++];
	*k = (struct lock_key){.ino = info.ino, .mode = info.mode,
			       .create_revision = kv->create_revision};
	memcpy(k->node, info.node, sizeof(info.node));
	r = holder ? efs_meta_holder_decode(kv->value.data, kv->value.len, &k->holder, NULL)
		   : efs_meta_waiter_decode(kv->value.data, kv->value.len, &k->waiter, NULL);
	if (k->waiter) {
		k->shared = k->waiter->mode == EFS_META_LOCK_SHARED;
		k->since_ns = k->waiter->since_ns;
	}
	return r == -ENOMEM ? r : 0;
}

/* Marks the recalls waiting past the bound behind another node's lock
 * (the holders are all read first: a recall names its blockers). */
static void locks_mark_unanswered(struct locks_scan *ls)
{
	for (size_t i = 0; i < ls->nw; i++) {
		struct lock_key *w = &ls->w[i];
		bool blocked = false;

		if (w->since_ns <= 0 ||
		    ls->now_ns - w->since_ns <= (int64_t)ls->bound_s * 1000000000)
			continue;
		for (size_t j = 0; j < ls->nh && !blocked; j++)
			blocked = holder_blocks(&ls->h[j], w);
		w->unanswered = blocked;
		ls->unanswered += blocked;
	}
}

static void locks_print_human(const struct locks_scan *ls)
{
	char age[32];

	printf("locks of %s", ls->f->fi->name);
	if (ls->ino && ls->path)
		printf(", inode %" PRIu64 " (%s)", ls->ino, ls->path);
	else if (ls->ino)
		printf(", inode %" PRIu64, ls->ino);
	printf(":\n");
	printf("  (ages: this host's wall clock now minus the node's when it was granted or\n"
	       "  queued; a clock skew between them adds in, see '%s members')\n",
	       prog);
	if (ls->nh)
		printf("  %-20s %-9s %-16s %10s %10s %s\n", "INODE", "MODE", "NODE", "GENERATION",
		       "HELD-FOR", "GRANT");
	for (size_t i = 0; i < ls->nh; i++) {
		const struct lock_key *h = &ls->h[i];

		if (!h->holder) {
			printf("  %-20" PRIu64 " %-9s %-16s %10s %10s (unreadable record)\n", h->ino,
			       lock_mode_name(h->mode), h->node, "?", "?");
			continue;
		}
		format_age(h->holder->granted_ns, ls->now_ns, age, sizeof(age));
		printf("  %-20" PRIu64 " %-9s %-16s %10" PRIu64 " %10s %" PRIu64 "\n", h->ino,
		       lock_mode_name(h->mode), h->node, h->holder->session_generation, age,
		       h->holder->token);
	}
	if (!ls->nh)
		printf("  no lock held\n");
	printf("recalls:\n");
	if (ls->nw)
		printf("  %-20s %-9s %-16s %10s %10s %10s %s\n", "INODE", "WANTS", "NODE",
		       "GENERATION", "WAITING", "REVISION", "HELD-BY");
	for (size_t i = 0; i < ls->nw; i++) {
		const struct lock_key *w = &ls->w[i];
		char gen[24] = "?", blocked[160] = "";

		/* Who keeps it waiting: other nodes' holders it cannot share. */
		for (size_t j = 0; j < ls->nh; j++) {
			size_t used = strlen(blocked);

			if (holder_blocks(&ls->h[j], w))
				snprintf(blocked + used, sizeof(blocked) - used, "%s%s",
					 used ? "," : "", ls->h[j].node);
		}
		if (w->waiter)
			snprintf(gen, sizeof(gen), "%" PRIu64, w->waiter->session_generation);
		format_age(w->since_ns, ls->now_ns, age, sizeof(age));
		printf("  %-20" PRIu64 " %-9s %-16s %10s %10s %10" PRId64 " %s%s\n", w->ino,
		       w->shared ? "shared" : "exclusive", w->node, gen, age, w->create_revision,
		       blocked[0] ? blocked : "-", w->unanswered ? "  UNANSWERED" : "");
	}
	if (!ls->nw)
		printf("  no node waits\n");
}

static void locks_json_holder(const struct locks_scan *ls, const struct lock_key *h)
{
	json_kstr(true, "node", h->node);
	json_kstr(false, "mode", lock_mode_name(h->mode));
	printf(",\"readable\":%s", h->holder ? "true" : "false");
	if (!h->holder)
		return;
	printf(",\"generation\":%" PRIu64 ",\"grant\":%" PRIu64 ",\"lease_id\":%" PRId64
	       ",\"granted_ns\":%" PRId64,
	       h->holder->session_generation, h->holder->token, h->holder->lease_id, h->holder->granted_ns);
	json_kseconds("held_for_s", h->holder->granted_ns > 0,
		      (double)(ls->now_ns - h->holder->granted_ns) / 1e9, 3);
}

static void locks_json_waiter(const struct locks_scan *ls, const struct lock_key *w)
{
	bool first = true;

	json_kstr(true, "node", w->node);
	json_kstr(false, "mode", w->shared ? "shared" : "exclusive");
	printf(",\"readable\":%s", w->waiter ? "true" : "false");
	if (w->waiter)
		printf(",\"generation\":%" PRIu64 ",\"lease_id\":%" PRId64 ",\"since_ns\":%" PRId64,
		       w->waiter->session_generation, w->waiter->lease_id, w->since_ns);
	json_kseconds("waiting_s", w->since_ns > 0, (double)(ls->now_ns - w->since_ns) / 1e9, 3);
	printf(",\"create_revision\":%" PRId64 ",\"blocked_by\":[", w->create_revision);
	for (size_t j = 0; j < ls->nh; j++) {
		if (!holder_blocks(&ls->h[j], w))
			continue;
		if (!first)
			putchar(',');
		json_str(ls->h[j].node);
		first = false;
	}
	printf("],\"unanswered\":%s", w->unanswered ? "true" : "false");
}

/* One object per inode with holders or waiters, in inode order (both
 * lists are in key order, and keys sort by inode). */
static void locks_print_json(const struct locks_scan *ls)
{
	size_t i = 0, j = 0;
	bool first = true;

	printf("{");
	json_kstr(true, "filesystem", ls->f->fi->name);
	printf(",\"clock\":\"realtime\",\"now_ns\":%" PRId64 ",\"unanswered_after_s\":%u",
	       ls->now_ns, ls->bound_s);
	if (ls->ino) {
		printf(",\"target\":{\"ino\":%" PRIu64, ls->ino);
		json_kstr(false, "path", ls->path);
		printf("}");
	} else {
		printf(",\"target\":null");
	}
	printf(",\"locks\":[");
	while (i < ls->nh || j < ls->nw) {
		uint64_t ino = i < ls->nh ? ls->h[i].ino : UINT64_MAX;
		bool one = true;

		if (j < ls->nw && ls->w[j].ino < ino)
			ino = ls->w[j].ino;
		printf("%s\n {\"ino\":%" PRIu64 ",\"holders\":[", first ? "" : ",", ino);
		first = false;
		for (; i < ls->nh && ls->h[i].ino == ino; i++, one = false) {
			printf("%s{", one ? "" : ",");
			locks_json_holder(ls, &ls->h[i]);
			printf("}");
		}
		printf("],\"waiters\":[");
		for (one = true; j < ls->nw && ls->w[j].ino == ino; j++, one = false) {
			printf("%s{", one ? "" : ",");
			locks_json_waiter(ls, &ls->w[j]);
			printf("}");
		}
		printf("]}");
	}
	printf("\n],\"unanswered\":%u}\n", ls->unanswered);
}

/*
 * stat(2) of |path| in a child process, so that a mount that does not
 * answer (a lock held by a node that answers no recall) costs at most
 * LOCKS_STAT_MS: 0 with |ret| set, or -errno with |err| saying why.
 */
static int stat_bounded(const char *path, struct stat *ret, char *err, size_t err_size)
{
	struct {
		int err;
		struct stat st;
	} m = {0};
	struct pollfd p;
	int pfd[2], r;
	ssize_t n;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		r = -errno;
		close(pfd[0]);
		close(pfd[1]);
		return r;
	}
	if (pid == 0) {
		m.err = stat(path, &m.st) < 0 ? errno : 0;
		_exit(write(pfd[1], &m, sizeof(m)) == (ssize_t)sizeof(m) ? 0 : 1);
	}
	close(pfd[1]);
	p = (struct pollfd){.fd = pfd[0], .events = POLLIN};
	do {
		r = poll(&p, 1, LOCKS_STAT_MS);
	} while (r < 0 && errno == EINTR);
	if (r <= 0) {
		/* A FUSE request dies with its caller; do not wait for it. */
		kill(pid, SIGKILL);
		close(pfd[0]);
		(void)waitpid(pid, NULL, WNOHANG);
		snprintf(err, err_size,
			 "stat %s did not answer within %d ms (a node holding it that does not "
			 "answer recalls?); give its inode number instead",
			 path, LOCKS_STAT_MS);
		return -ETIMEDOUT;
	}
	n = read(pfd[0], &m, sizeof(m));
	close(pfd[0]);
	(void)waitpid(pid, NULL, 0);
	if (n != (ssize_t)sizeof(m)) {
		snprintf(err, err_size, "stat %s: no answer from the child", path);
		return -EIO;
	}
	if (m.err) {
		snprintf(err, err_size, "cannot stat %s: %s", path, strerror(m.err));
		return -m.err;
	}
	*ret = m.st;
	return 0;
}

/*
 * Checks in /proc/self/mountinfo that the file |path| (whose stat is |st|)
 * lies on a mount of etcfs filesystem |fsname| (source "etcfs:<fsname>",
 * as etcfsd names its mounts, or type fuse.etcfs when fsname= renamed
 * it). 0, or -EINVAL with |err| saying where it is instead.
 */
static int check_on_fs(const char *path, const struct stat *st, const char *fsname, char *err,
		       size_t err_size)
{
	FILE *mi = fopen("/proc/self/mountinfo", "re");
	char *line = NULL, type[64], source[320];
	size_t cap = 0;
	int r = -EINVAL;

	if (!mi) {
		r = -errno;
		snprintf(err, err_size, "cannot read /proc/self/mountinfo: %s", strerror(-r));
		return r;
	}
	snprintf(err, err_size, "%s: its device is in no mount of /proc/self/mountinfo", path);
	while (getline(&line, &cap, mi) > 0) {
		unsigned maj, min;
		const char *sep = strstr(line, " - ");

		if (sscanf(line, "%*u %*u %u:%u", &maj, &min) != 2 ||
		    makedev(maj, min) != st->st_dev || !sep ||
		    sscanf(sep + 3, "%63s %319s", type, source) != 2)
			continue;
		if (!strncmp(source, "etcfs:", 6) && !strcmp(source + 6, fsname))
			r = 0;
		else if (!strncmp(source, "etcfs:", 6))
			snprintf(err, err_size, "%s is on etcfs filesystem %s, not %s", path,
				 source + 6, fsname);
		else if (!strcmp(type, "fuse.etcfs"))
			r = 0;
		else
			snprintf(err, err_size, "%s is not inside an etcfs mount (it is on %s %s)",
				 path, type, source);
		break;
	}
	free(line);
	fclose(mi);
	return r;
}

/*
 * Resolves the target of locks (|arg|: an inode number in decimal, or a
 * PATH inside a mount of the filesystem, whose st_ino is the etcfs inode
 * number) into |ls|. Returns -1 to go on, else the exit status.
 */
static int locks_target(struct locks_scan *ls, const char *arg)
{
	char err[EFS_CLI_ERR_MAX] = "";
	struct stat st = {0};
	unsigned long long v;
	char *end;

	if (arg[0] >= '0' && arg[0] <= '9') {
		errno = 0;
		v = strtoull(arg, &end, 10);
		if (!errno && !*end && v > 0) {
			ls->ino = v;
			return -1;
		}
		if (!*end) {
			fprintf(stderr, "%s: locks: inode number %s out of range\n", prog, arg);
			return EXIT_USAGE;
		}
	}
	if (stat_bounded(arg, &st, err, sizeof(err)) < 0 ||
	    check_on_fs(arg, &st, ls->f->ns.name, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s: locks: %s\n", prog, err);
		return EXIT_USAGE;
	}
	ls->ino = (uint64_t)st.st_ino;
	ls->path = arg;
	return -1;
}

static void usage_locks(FILE *f)
{
	fprintf(f,
		"Usage: %s locks [OPTIONS] DEVICE | --name NAME [PATH | INO]\n"
		"\n"
		"The inode locks of one filesystem as etcd holds them: every holder key (inode,\n"
		"mode, node, its session generation, how long ago it was granted, grant id) and\n"
		"every recall key (a node waiting for a lock: inode, the mode it wants, the\n"
		"waiter's generation, how long it has waited, the key's create revision, and the\n"
		"nodes whose locks keep it waiting). Ages are this host's wall clock minus the\n"
		"node's at the grant or when it queued. A recall waiting longer than the bound\n"
		"behind another node's lock is marked UNANSWERED: that node's daemon logs it too\n"
		"and counts it in etcfs_lock_recalls_unanswered_total.\n"
		"\n"
		"  --recall-bound SECONDS   the bound (default %d s); give the daemons' own\n"
		"                           --recall-bound, so that both agree\n"
		"\n"
		"PATH (a file inside a mount of the filesystem: its st_ino is the inode) or INO\n"
		"(an inode number in decimal; write a file named by digits as ./123) shows the\n"
		"locks of that inode alone. PATH is resolved with stat(2) through the mount\n"
		"(within %d s): on a node that does not hold the inode that takes a shared lock,\n"
		"which asks an exclusive holder elsewhere to downgrade; INO only reads etcd.\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 no recall unanswered; 1 some recall unanswered; 2 usage error\n"
		"(also a PATH that cannot be resolved or is not on the filesystem); 3 cannot\n"
		"connect to etcd; 4 failed.\n",
		prog, LOCKS_UNANSWERED_S, LOCKS_STAT_MS / 1000, fs_cmd_help, json_cmd_options,
		efs_cli_etcd_usage());
}

static int cmd_locks(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct locks_scan ls = {.f = &f};
	struct efs_meta_range range;
	char err[EFS_CLI_ERR_MAX] = "";
	int ret, r;

	ret = fs_cmd_start(&f, argc, argv, FS_CMD_JSON | FS_CMD_TARGET | FS_CMD_RECALL_BOUND,
			   usage_locks);
	if (ret >= 0)
		goto out;
	ls.bound_s = f.recall_bound_s ? f.recall_bound_s : LOCKS_UNANSWERED_S;
	if (f.target) {
		ret = locks_target(&ls, f.target);
		if (ret >= 0)
			goto out;
	}
	ls.now_ns = (int64_t)efs_clock_real_ns();
	ret = EXIT_FAILED;
	r = ls.ino ? efs_meta_range_ino(&f.ns, EFS_META_K_HOLDER, ls.ino, &range)
		   : efs_meta_range_family(&f.ns, EFS_META_K_HOLDER, &range);
	if (r == 0)
		r = efs_cli_range_foreach(f.s, &range, false, locks_key_cb, &ls, err,
					  sizeof(err));
	if (r == 0)
		r = ls.ino ? efs_meta_range_ino(&f.ns, EFS_META_K_RECALL, ls.ino, &range)
			   : efs_meta_range_family(&f.ns, EFS_META_K_RECALL, &range);
	if (r == 0)
		r = efs_cli_range_foreach(f.s, &range, false, locks_key_cb, &ls, err,
					  sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		goto out;
	}
	locks_mark_unanswered(&ls);
	if (f.json)
		locks_print_json(&ls);
	else
		locks_print_human(&ls);
	ret = ls.unanswered ? EXIT_UNFIT : EXIT_FIT;
out:
	for (size_t i = 0; i < ls.nh; i++)
		efs_meta_record_free(ls.h[i].holder);
	for (size_t i = 0; i < ls.nw; i++)
		efs_meta_record_free(ls.w[i].waiter);
	efs_mem_free(ls.h);
	efs_mem_free(ls.w);
	fs_cmd_done(&f);
	return ret;
}

/* ---- members ---- */

/* The bound of one node's /metrics request (connect, send, answer). */
#define MEMBERS_METRICS_MS 1500
/* The most of a /metrics answer read. */

/* One n/<node> key, what its record says and what was measured. */
struct node_row {
	char node[EFS_META_NODE_MAX + 1];
	Etcfs__NodeInfo *ni; /* owned; NULL when the record is unreadable */
	char why[96];	     /* why it is unreadable */
	int64_t lease;	     /* the key's lease (else the record's) */
	struct lease_ttl ttl;
	char ttl_text[48];
	bool has_gen;	 /* g/<node> exists and decodes */
	uint64_t gen;	 /* its value */
	bool skew_known; /* else |skew_why| */
	double skew_s;	 /* node clock minus ours at the middle of the request */
	double skew_err_s; /* half the round trip */
	char skew_why[96];
};

/* g/<node> of one node. */
struct node_gen {
	char node[EFS_META_NODE_MAX + 1];
	uint64_t gen;
};

struct members_scan {
	struct fs_cmd *f;
	struct node_row *rows;
	size_t nrows, rcap;
	struct node_gen *gens;
	size_t ngens, gcap;
};

static int members_gen_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct members_scan *ms = arg;
	struct efs_meta_key_info info;
	Etcfs__Generation *g = NULL;
	int r;

	r = scan_key_add(&ms->f->ns, kv, EFS_META_K_GEN, &info, &ms->gens, &ms->gcap, ms->ngens,
			 sizeof(*ms->gens));
	if (r <= 0 || efs_meta_generation_decode(kv->value.data, kv->value.len, &g, NULL) < 0)
		return r < 0 ? r : 0;
	memcpy(ms->gens[ms->ngens].node, info.node, sizeof(info.node));
	ms->gens[ms->ngens++].gen = g->generation;
	efs_meta_record_free(g);
	return 0;
}

static int members_node_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct members_scan *ms = arg;
	struct efs_meta_key_info info;
	struct node_row *row;
	const char *why = NULL;
	int r;

	r = scan_key_add(&ms->f->ns, kv, EFS_META_K_NODE, &info, &ms->rows, &ms->rcap, ms->nrows,
			 sizeof(*ms->rows));
	if (r <= 0)
		return r;
	row = &ms->rows[ms->nrows++];
	*row = (struct node_row){.lease = kv->lease};
	memcpy(row->node, info.node, sizeof(info.node));
	r = efs_meta_nodeinfo_decode(kv->value.data, kv->value.len, &row->ni, &why);
	if (r == -ENOMEM)
		return r;
	if (r < 0)
		snprintf(row->why, sizeof(row->why), "%s", why ? why : strerror(-r));
	else if (!row->lease)
		row->lease = row->ni->lease_id;
	return 0;
}

/* Whether the host of |addr| ("a.b.c.d:port" or "[v6]:port") is only
 * reachable on its own machine (loopback) or is no address (a wildcard). */
static bool addr_is_local_only(const char *addr)
{
	return !strncmp(addr, "127.", 4) || !strncmp(addr, "0.0.0.0:", 8) ||
	       !strncmp(addr, "[::1]:", 6) || !strncmp(addr, "[::]:", 5);
}

static void measure_skew(struct node_row *row, const char *addr)
{
	int r = efs_cli_clock_probe(addr, MEMBERS_METRICS_MS, &row->skew_s, &row->skew_err_s,
				    row->skew_why, sizeof(row->skew_why));

	row->skew_known = r == 0;
}

/* Everything about one node beyond its record: g/, the lease, the skew. */
static void members_complete(struct members_scan *ms, struct node_row *row, const char *here)
{
	const char *addr;

	for (size_t i = 0; i < ms->ngens; i++) {
		if (!strcmp(ms->gens[i].node, row->node)) {
			row->has_gen = true;
			row->gen = ms->gens[i].gen;
		}
	}
	format_lease_ttl(ms->f->s, row->lease, row->ttl_text, sizeof(row->ttl_text), &row->ttl);
	addr = row->ni ? row->ni->metrics_addr : "";
	if (!row->ni)
		snprintf(row->skew_why, sizeof(row->skew_why), "unreadable record");
	else if (!addr[0])
		snprintf(row->skew_why, sizeof(row->skew_why), "metrics off");
	else if (addr_is_local_only(addr) && strcmp(row->ni->hostname, here))
		snprintf(row->skew_why, sizeof(row->skew_why), "metrics on %s of host %s", addr,
			 row->ni->hostname);
	else
		measure_skew(row, addr);
}

static void members_print_human(const struct members_scan *ms)
{
	printf("members of %s:\n", ms->f->fi->name);
	if (!ms->nrows) {
		printf("  no node\n");
		return;
	}
	printf("  %-16s %-16s %8s %-10s %10s %-16s %-10s %-20s %-21s %s\n", "NODE", "HOSTNAME",
	       "PID", "VERSION", "GENERATION", "LEASE", "LEASE-TTL", "STARTED", "METRICS",
	       "CLOCK-SKEW");
	for (size_t i = 0; i < ms->nrows; i++) {
		const struct node_row *row = &ms->rows[i];
		const Etcfs__NodeInfo *ni = row->ni;
		char lease[24], started[32], skew[128];

		if (!ni) {
			printf("  %-16s (unreadable record: %s)\n", row->node, row->why);
			continue;
		}
		snprintf(lease, sizeof(lease), "%" PRIx64, (uint64_t)row->lease);
		format_time(ni->started_ns, started, sizeof(started));
		if (row->skew_known)
			snprintf(skew, sizeof(skew), "%+.6fs +-%.6fs", row->skew_s, row->skew_err_s);
		else
			snprintf(skew, sizeof(skew), "unknown (%s)", row->skew_why);
		printf("  %-16s %-16s %8" PRId32 " %-10s %10" PRIu64 " %-16s %-10s %-20s %-21s %s\n",
		       row->node, ni->hostname[0] ? ni->hostname : "-", ni->pid,
		       ni->version[0] ? ni->version : "-", ni->session_generation, lease,
		       row->ttl_text, started, ni->metrics_addr[0] ? ni->metrics_addr : "-", skew);
		if (!row->has_gen)
			printf("    warning: no g/%s: the record's generation is not confirmed\n",
			       row->node);
		else if (row->gen != ni->session_generation)
			printf("    warning: g/%s is %" PRIu64 ", the record says %" PRIu64
			       ": a stale record\n",
			       row->node, row->gen, ni->session_generation);
	}
}

static void members_json_row(const struct node_row *row)
{
	const Etcfs__NodeInfo *ni = row->ni;
	const char *lease_state = row->ttl.err == -ENOENT ? "none"
				  : row->ttl.err < 0	 ? "unknown"
				  : row->ttl.ttl_s < 0	 ? "expired"
							 : "alive";
	char started[32];

	json_kstr(true, "node", row->node);
	printf(",\"readable\":%s", ni ? "true" : "false");
	if (!ni) {
		json_kstr(false, "error", row->why);
		return;
	}
	format_time(ni->started_ns, started, sizeof(started));
	json_kstr(false, "hostname", ni->hostname);
	printf(",\"pid\":%" PRId32, ni->pid);
	json_kstr(false, "version", ni->version);
	printf(",\"session_generation\":%" PRIu64, ni->session_generation);
	if (row->has_gen)
		printf(",\"generation_key\":%" PRIu64 ",\"generation_agrees\":%s", row->gen,
		       row->gen == ni->session_generation ? "true" : "false");
	else
		printf(",\"generation_key\":null,\"generation_agrees\":false");
	printf(",\"lease_id\":%" PRId64, row->lease);
	json_kstr(false, "lease_state", lease_state);
	if (row->ttl.err == 0 && row->ttl.ttl_s >= 0)
		printf(",\"lease_ttl_s\":%" PRId64 ",\"lease_granted_ttl_s\":%" PRId64,
		       row->ttl.ttl_s, row->ttl.granted_s);
	else
		printf(",\"lease_ttl_s\":null,\"lease_granted_ttl_s\":null");
	printf(",\"started_ns\":%" PRId64, ni->started_ns);
	json_kstr(false, "started", started);
	json_kstr(false, "metrics_addr", ni->metrics_addr[0] ? ni->metrics_addr : NULL);
	printf(",\"record_clock_ns\":%" PRId64, ni->wall_clock_ns);
	json_kseconds("clock_skew_s", row->skew_known, row->skew_s, 6);
	json_kseconds("clock_skew_error_s", row->skew_known, row->skew_err_s, 6);
	json_kstr(false, "clock_skew_unknown", row->skew_known ? NULL : row->skew_why);
}

static void members_print_json(const struct members_scan *ms)
{
	printf("{");
	json_kstr(true, "filesystem", ms->f->fi->name);
	printf(",\"members\":[");
	for (size_t i = 0; i < ms->nrows; i++) {
		printf("%s\n {", i ? "," : "");
		members_json_row(&ms->rows[i]);
		printf("}");
	}
	printf("\n]}\n");
}

static void usage_members(FILE *f)
{
	fprintf(f,
		"Usage: %s members [OPTIONS] DEVICE | --name NAME\n"
		"\n"
		"Every node of one filesystem with a session (its key n/<node>): node id,\n"
		"hostname, daemon pid and version, the session generation (and a warning when\n"
		"g/<node> disagrees: a stale record), the session lease id (hex) and its\n"
		"remaining/granted TTL (LeaseTimeToLive), start time (UTC), metrics address, and\n"
		"the clock skew measured over one request to the node's /metrics: the node's\n"
		"clock (etcfs_clock_wall_seconds) minus ours at the middle of the request, +-\n"
		"half the round trip; positive means the node's clock is ahead. Each request\n"
		"is bounded (%d ms); the skew is unknown when the node has no metrics, they do\n"
		"not answer, or they listen on loopback of another host.\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 success; 2 usage error; 3 cannot connect to etcd; 4 failed.\n",
		prog, MEMBERS_METRICS_MS, fs_cmd_help, json_cmd_options, efs_cli_etcd_usage());
}

static int cmd_members(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct members_scan ms = {.f = &f};
	struct efs_meta_range range;
	char err[EFS_CLI_ERR_MAX] = "", here[256] = "";
	int ret, r;

	ret = fs_cmd_start(&f, argc, argv, FS_CMD_JSON, usage_members);
	if (ret >= 0)
		goto out;
	ret = EXIT_FAILED;
	r = efs_meta_range_family(&f.ns, EFS_META_K_GEN, &range);
	if (r == 0)
		r = efs_cli_range_foreach(f.s, &range, false, members_gen_cb, &ms, err,
					  sizeof(err));
	if (r == 0)
		r = efs_meta_range_family(&f.ns, EFS_META_K_NODE, &range);
	if (r == 0)
		r = efs_cli_range_foreach(f.s, &range, false, members_node_cb, &ms, err,
					  sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		goto out;
	}
	(void)gethostname(here, sizeof(here) - 1);
	for (size_t i = 0; i < ms.nrows; i++)
		members_complete(&ms, &ms.rows[i], here);
	if (f.json)
		members_print_json(&ms);
	else
		members_print_human(&ms);
	ret = EXIT_FIT;
out:
	for (size_t i = 0; i < ms.nrows; i++)
		efs_meta_record_free(ms.rows[i].ni);
	efs_mem_free(ms.rows);
	efs_mem_free(ms.gens);
	fs_cmd_done(&f);
	return ret;
}

/* ---- evict: fence a wedged node ---- */

static void usage_evict(FILE *f)
{
	fprintf(f,
		"Usage: %s evict [OPTIONS] DEVICE NODE | --name NAME NODE\n"
		"\n"
		"Fences node NODE of one filesystem (an operator's answer to a wedged node):\n"
		"in one transaction its generation g/NODE is bumped and its session key\n"
		"n/NODE deleted, so no transaction it builds can commit again (each compares\n"
		"the generation its session wrote); then its session lease is revoked, so its\n"
		"locks, open references and group ownerships pass to the other nodes. Its\n"
		"groups are reused only after the nodes' --dead-grace (it may still write).\n"
		"A fenced daemon that wakes up finds its session gone, fails what it had\n"
		"open with EIO and registers a new session. Evicting a node without a\n"
		"session changes nothing and succeeds (the command is idempotent); a NODE the\n"
		"filesystem has never seen is an error.\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 success; 2 usage error; 3 cannot connect to etcd; 4 failed\n"
		"(no such node, or etcd refused).\n",
		prog, fs_cmd_help, json_cmd_options, efs_cli_etcd_usage());
}

/* What evict found and did. */
struct evict_res {
	bool has_gen, has_session, evicted, lease_revoked;
	uint64_t gen_before, gen_after;
	int64_t lease;
};

/* Reads n/<node> (its lease, the record's mod revision) and g/<node>. */
static int evict_read(struct fs_cmd *f, const char *node, struct evict_res *e, int64_t *n_mod,
		      int64_t *g_mod)
{
	struct efs_meta_key nk, gk;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__Generation *g = NULL;
	int r;

	if (efs_meta_key_node(&f->ns, node, &nk) < 0 || efs_meta_key_gen(&f->ns, node, &gk) < 0)
		return -EINVAL;
	r = efs_etcd_sync_get(f->s, gk.buf, gk.len, &kv, NULL);
	if (r < 0 && r != -ENOENT)
		return r;
	if (r == 0) {
		e->has_gen = true;
		*g_mod = kv->mod_revision;
		r = efs_meta_generation_decode(kv->value.data, kv->value.len, &g, NULL);
		protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
		kv = NULL;
		if (r < 0)
			return -EBADMSG;
		e->gen_before = e->gen_after = g->generation;
		efs_meta_record_free(g);
	}
	r = efs_etcd_sync_get(f->s, nk.buf, nk.len, &kv, NULL);
	if (r == -ENOENT)
		return 0;
	if (r < 0)
		return r;
	e->has_session = true;
	e->lease = kv->lease;
	*n_mod = kv->mod_revision;
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	return 0;
}

/*
 * Bumps g/<node> and deletes n/<node> in one transaction, comparing both
 * unchanged since |n_mod|/|g_mod|: 1 done, 0 something changed meanwhile
 * (read again), or a negative errno.
 */
static int evict_fence(struct fs_cmd *f, const char *node, struct evict_res *e, int64_t n_mod,
		       int64_t g_mod)
{
	Etcfs__Generation g = ETCFS__GENERATION__INIT;
	Etcdserverpb__TxnResponse *resp = NULL;
	struct efs_etcd_txn *t = NULL;
	struct efs_meta_key nk, gk;
	int r;

	r = efs_meta_key_node(&f->ns, node, &nk);
	if (r == 0)
		r = efs_meta_key_gen(&f->ns, node, &gk);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, nk.buf, nk.len,
					 n_mod);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, gk.buf, gk.len,
					 e->has_gen ? g_mod : 0);
	g.generation = e->gen_before + 1;
	if (r == 0)
		r = efs_meta_txn_put(t, EFS_ETCD_TXN_SUCCESS, &gk, &g.base, 0);
	if (r == 0)
		r = efs_etcd_txn_delete(t, EFS_ETCD_TXN_SUCCESS, nk.buf, nk.len, NULL, 0, false);
	if (r == 0)
		r = efs_etcd_sync_txn(f->s, efs_etcd_txn_request(t), &resp);
	efs_etcd_txn_free(t);
	if (r < 0)
		return r;
	r = resp->succeeded ? 1 : 0;
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	if (r)
		e->gen_after = g.generation;
	return r;
}

static int cmd_evict(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct evict_res e = {0};
	const char *node;
	int ret, r = 0;

	ret = fs_cmd_parse(&f, argc, argv, FS_CMD_JSON | FS_CMD_TARGET, usage_evict);
	if (ret >= 0)
		goto out;
	node = f.target;
	ret = EXIT_USAGE;
	if (!node || !efs_meta_node_is_valid(node)) {
		fprintf(stderr, "%s: evict wants a valid NODE id after the filesystem\n", prog);
		goto out;
	}
	ret = fs_cmd_open(&f);
	if (ret >= 0)
		goto out;
	ret = EXIT_FAILED;
	/* A registration between the read and the fence makes the compares
	 * fail: read again (a few times, each bounded by the client). */
	for (int tries = 0; tries < 5; tries++) {
		int64_t n_mod = 0, g_mod = 0;

		e = (struct evict_res){0};
		r = evict_read(&f, node, &e, &n_mod, &g_mod);
		if (r < 0 || !e.has_session)
			break;
		r = evict_fence(&f, node, &e, n_mod, g_mod);
		if (r != 0)
			break;
	}
	if (r == 0 && e.has_session) {
		fprintf(stderr, "%s: node %s kept changing its session; not evicted\n", prog, node);
		goto out;
	}
	if (r < 0) {
		fprintf(stderr, "%s: evicting %s: %s\n", prog, node,
			r == -EBADMSG ? "g/ record is corrupt" : efs_etcd_sync_last_message(f.s));
		goto out;
	}
	if (!e.has_gen && !e.has_session) {
		fprintf(stderr, "%s: filesystem %s has no node %s (no g/%s or n/%s key)\n", prog,
			f.fi->name, node, node, node);
		goto out;
	}
	e.evicted = e.has_session;
	if (e.evicted && e.lease) {
		Etcdserverpb__LeaseRevokeRequest rq = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
		ProtobufCMessage *resp = NULL;

		/* The fence holds already; the revoke hands its keys on now
		 * rather than at the end of the TTL. A lease already gone is
		 * what we want. */
		rq.id = e.lease;
		r = efs_etcd_sync_call(f.s, EFS_ETCD_LEASE_REVOKE, &rq.base, &resp, NULL);
		if (resp)
			protobuf_c_message_free_unpacked(resp, efs_mem_protobuf());
		e.lease_revoked = r == 0 || r == -ENOENT;
		if (!e.lease_revoked)
			fprintf(stderr,
				"%s: %s is fenced, but revoking its lease %" PRIx64
				" failed (%s): its keys go when the lease expires\n",
				prog, node, (uint64_t)e.lease, efs_etcd_sync_last_message(f.s));
	}
	if (f.json) {
		printf("{");
		json_kstr(true, "filesystem", f.fi->name);
		json_kstr(false, "node", node);
		printf(",\"evicted\":%s,\"had_session\":%s", e.evicted ? "true" : "false",
		       e.has_session ? "true" : "false");
		printf(",\"generation_before\":%" PRIu64 ",\"generation\":%" PRIu64,
		       e.gen_before, e.gen_after);
		if (e.evicted)
			printf(",\"lease_id\":%" PRId64 ",\"lease_revoked\":%s", e.lease,
			       e.lease_revoked ? "true" : "false");
		printf("}\n");
	} else if (e.evicted) {
		printf("node %s evicted: generation %" PRIu64 " -> %" PRIu64
		       ", lease %" PRIx64 " %s\n",
		       node, e.gen_before, e.gen_after, (uint64_t)e.lease,
		       e.lease_revoked ? "revoked" : "NOT revoked (expires with its TTL)");
	} else {
		printf("node %s has no session (generation %" PRIu64 "): nothing to evict\n", node,
		       e.gen_before);
	}
	ret = e.evicted && !e.lease_revoked ? EXIT_FAILED : EXIT_FIT;
out:
	fs_cmd_done(&f);
	return ret;
}

/* ---- backup, restore (backup.c) ---- */

static int cmd_backup(int argc, char **argv)
{
	return efs_backup_cmd(prog, argc, argv);
}

static int cmd_restore(int argc, char **argv)
{
	return efs_restore_cmd(prog, argc, argv);
}

/* ---- sync ---- */

#define SYNC_TIMEOUT_MS 10000

static void usage_sync(FILE *f)
{
	fprintf(f,
		"Usage: %s sync [OPTIONS] DEVICE | --name NAME\n"
		"\n"
		"Asks every node that has the filesystem mounted to publish what it buffers\n"
		"(written data, sizes and times not yet in etcd) and waits for each node's\n"
		"answer, at most %d s; names the nodes that did not answer. What any node\n"
		"wrote before the command started is then in etcd (and survives that node's\n"
		"crash).\n"
		"%s"
		"\n"
		"  --name NAME              the filesystem\n"
		"  --help                   this text\n"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 every node answered (or none is mounted); 2 usage error;\n"
		"3 cannot connect to etcd; 4 a node did not answer or could not publish.\n",
		prog, SYNC_TIMEOUT_MS / 1000, fs_cmd_help, efs_cli_etcd_usage());
}

static int cmd_sync(int argc, char **argv)
{
	struct fs_cmd f = {0};
	int ret;

	ret = fs_cmd_start(&f, argc, argv, 0, usage_sync);
	if (ret < 0)
		ret = efs_backup_request_sync(prog, f.s, &f.ns, SYNC_TIMEOUT_MS, NULL) ? EXIT_FAILED
										  : EXIT_FIT;
	fs_cmd_done(&f);
	return ret;
}

/* ---- grow ---- */

/* New groups' records written per transaction ahead of the final one. */
#define GROW_BATCH_GROUPS 60
/* Final transactions tried when the old last group's map moves meanwhile. */
#define GROW_TRIES 8

static void usage_grow(FILE *f)
{
	fprintf(f,
		"Usage: %s grow [OPTIONS] DEVICE [SIZE]\n"
		"\n"
		"Grows a mounted (or unmounted) filesystem to SIZE bytes (a suffix K, M, G or T\n"
		"counts in powers of 1024), by default to the whole device. Grow the device\n"
		"first (truncate -s on an image, losetup -c on a loop device, lvextend, ...)\n"
		"on every host. The larger \"sb\" record goes into etcd in one transaction with\n"
		"the last 60 new groups (more are written ahead of it), then DEVICE's\n"
		"superblock takes the size; every mounted node allocates in the new groups once\n"
		"it sees its own device at the new size. Shrinking is refused.\n"
		"\n"
		"The inode limit grows in proportion to the data area (never lower than it\n"
		"was), or becomes N with --inodes N (refused below the inodes in use); a\n"
		"grow to the current size with --inodes changes the limit alone. Mounted\n"
		"read-write nodes take the new limit from the \"sb\" record at once.\n"
		"\n"
		"  --inodes N               the inode limit after the growth\n"
		"  --json                   one JSON object on stdout\n"
		"  --help                   this text\n"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 success (also: already that size); 2 usage error; 3 cannot\n"
		"connect to etcd; 4 failed (a shrink, a device smaller than SIZE, ...).\n",
		prog, efs_cli_etcd_usage());
}

/* "100M" -> 104857600. -EINVAL when not a size. */
static int parse_bytes(const char *s, uint64_t *ret)
{
	static const char units[] = "KMGT";
	unsigned long long v;
	char *end;
	const char *u;

	errno = 0;
	if (!s[0] || s[0] == '-')
		return -EINVAL;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	if (*end) {
		u = strchr(units, *end);
		if (!u || (end[1] && strcmp(end + 1, "iB") && strcmp(end + 1, "B")))
			return -EINVAL;
		for (const char *p = units; p <= u; p++) {
			if (v > UINT64_MAX / 1024)
				return -EINVAL;
			v *= 1024;
		}
	}
	*ret = v;
	return 0;
}

static int grow_put_msg(struct efs_etcd_txn *t, const struct efs_meta_key *k,
			const ProtobufCMessage *msg)
{
	ProtobufCBinaryData v = {0};
	int r = efs_meta_pack(msg, &v);

	if (r < 0)
		return r;
	r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, k->buf, k->len, v.data, v.len, 0);
	efs_mem_free(v.data);
	return r;
}

/* Adds group |g|'s map and free count (the whole group free) to |t|. */
static int grow_put_group(struct efs_etcd_txn *t, const struct efs_meta_ns *ns,
			  const struct efs_layout *l, uint32_t g)
{
	struct efs_layout_agmap am;
	Etcfs__AgFree af;
	struct efs_meta_key k;
	int r;

	efs_layout_ag_map(l, g, &am);
	efs_layout_ag_free(l, g, &af);
	r = efs_meta_key_ag(ns, g, EFS_META_K_AG_MAP, &k);
	if (r == 0)
		r = grow_put_msg(t, &k, &am.map.base);
	if (r == 0)
		r = efs_meta_key_ag(ns, g, EFS_META_K_AG_FREE, &k);
	if (r == 0)
		r = grow_put_msg(t, &k, &af.base);
	return r;
}

/* Reads |k|: *ret_kv (free with protobuf_c_message_free_unpacked) or -ENOENT. */
static int grow_get(struct fs_cmd *f, const struct efs_meta_key *k, Mvccpb__KeyValue **ret_kv)
{
	return efs_etcd_sync_get(f->s, k->buf, k->len, ret_kv, NULL);
}

static void grow_kv_free(Mvccpb__KeyValue *kv)
{
	if (kv)
		protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
}

/*
 * The old last group |g| grows from |old_len| to |new_len| blocks: adds to
 * |t| its longer map and free count, comparing both records' revisions.
 */
static int grow_last_group(struct fs_cmd *f, struct efs_etcd_txn *t, uint32_t g,
			   uint64_t old_len, uint64_t new_len, char *err, size_t err_size)
{
	Mvccpb__KeyValue *mkv = NULL, *fkv = NULL;
	struct efs_meta_key mk, fk;
	Etcfs__AgMap *m = NULL;
	Etcfs__AgFree *fr = NULL;
	struct efs_freemap fm;
	ProtobufCBinaryData packed = {0};
	bool fm_ok = false;
	int r;

	r = efs_meta_key_ag(&f->ns, g, EFS_META_K_AG_MAP, &mk);
	if (r == 0)
		r = efs_meta_key_ag(&f->ns, g, EFS_META_K_AG_FREE, &fk);
	if (r == 0)
		r = grow_get(f, &mk, &mkv);
	if (r == 0)
		r = grow_get(f, &fk, &fkv);
	if (r < 0) {
		snprintf(err, err_size, "reading group %" PRIu32 "'s map and free count: %s", g,
			 r == -ENOENT ? "missing (run fsck.etcfs)" : strerror(-r));
		goto out;
	}
	r = efs_meta_ag_map_decode(mkv->value.data, mkv->value.len, &m, NULL);
	if (r == 0)
		r = efs_meta_ag_free_decode(fkv->value.data, fkv->value.len, &fr, NULL);
	if (r == 0 && m->group_blocks != old_len)
		r = -EUCLEAN;
	if (r == 0)
		r = efs_freemap_from_msg(&fm, m);
	if (r < 0) {
		snprintf(err, err_size,
			 "group %" PRIu32 "'s map or free count is not as the geometry says "
			 "(run fsck.etcfs)",
			 g);
		goto out;
	}
	fm_ok = true;
	fm.group_blocks = new_len;
	r = efs_freemap_put(&fm, old_len, new_len - old_len);
	if (r == 0)
		r = efs_freemap_pack(&fm, &packed);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, mk.buf, mk.len,
					 mkv->mod_revision);
	if (r == 0)
		r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, fk.buf, fk.len,
					 fkv->mod_revision);
	if (r == 0)
		r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, mk.buf, mk.len, packed.data,
				     packed.len, 0);
	if (r == 0) {
		fr->free_blocks += new_len - old_len;
		r = grow_put_msg(t, &fk, &fr->base);
	}
	if (r < 0)
		snprintf(err, err_size, "building the transaction: %s", strerror(-r));
out:
	efs_mem_free(packed.data);
	if (fm_ok)
		efs_freemap_done(&fm);
	efs_meta_record_free(m);
	efs_meta_record_free(fr);
	grow_kv_free(mkv);
	grow_kv_free(fkv);
	return r;
}

static int grow_txn_run(struct fs_cmd *f, struct efs_etcd_txn *t, bool *ret_ok, char *err,
			size_t err_size)
{
	Etcdserverpb__TxnResponse *resp = NULL;
	int r = efs_etcd_sync_txn(f->s, efs_etcd_txn_request(t), &resp);

	if (r < 0) {
		const char *msg = efs_etcd_sync_last_message(f->s);

		snprintf(err, err_size, "etcd transaction failed: %s",
			 msg && msg[0] ? msg : strerror(-r));
		return r;
	}
	*ret_ok = resp->succeeded;
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	return 0;
}

/* Rewrites DEVICE's superblock with |size| as its device size. */
static int grow_write_sb(const struct efs_cli_device *d, uint64_t size, char *err,
			 size_t err_size)
{
	char reason[EFS_SB_REASON_MAX];
	struct efs_sb sb;
	uint8_t *buf;
	size_t done = 0;
	int r;

	r = efs_cli_read_sb(d, &sb, NULL, err, err_size);
	if (r < 0)
		return r;
	sb.device_size = size;
	buf = efs_mem_calloc(1, EFS_SB_SIZE);
	if (!buf)
		return -ENOMEM;
	r = efs_sb_encode(&sb, buf, reason, sizeof(reason));
	if (r < 0)
		snprintf(err, err_size, "superblock: %s", reason);
	while (r == 0 && done < EFS_SB_SIZE) {
		ssize_t n = pwrite(d->fd, buf + done, EFS_SB_SIZE - done, (off_t)done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			r = n < 0 ? -errno : -EIO;
			snprintf(err, err_size, "%s: writing the superblock: %s", d->path,
				 strerror(-r));
		} else {
			done += (size_t)n;
		}
	}
	if (r == 0 && fdatasync(d->fd) < 0) {
		r = -errno;
		snprintf(err, err_size, "%s: fdatasync: %s", d->path, strerror(-r));
	}
	efs_mem_free(buf);
	return r;
}

/*
 * The inode limit after a growth from |old_data| to |new_data| data blocks:
 * --inodes when given (refused below the inode records in use), else
 * |limit| scaled by the growth of the data area, so that the inodes per
 * byte of data stay what mkfs (or an earlier grow) set; never lower than
 * |limit|, never above EFS_LAYOUT_INODES_MAX.
 */
static int grow_inode_limit(struct fs_cmd *f, uint64_t limit, uint64_t old_data,
			    uint64_t new_data, uint64_t *ret, char *err, size_t err_size)
{
	struct efs_meta_range range;
	int64_t used = 0;
	double scaled;
	int r;

	if (!f->inodes) {
		scaled = old_data ? (double)limit * (double)new_data / (double)old_data : 0;
		if (scaled > (double)EFS_LAYOUT_INODES_MAX)
			scaled = (double)EFS_LAYOUT_INODES_MAX;
		*ret = scaled > (double)limit ? (uint64_t)scaled : limit;
		return 0;
	}
	r = efs_meta_range_family(&f->ns, EFS_META_K_INODE, &range);
	if (r == 0)
		r = efs_cli_range_count(f->s, &range, &used, err, err_size);
	if (r < 0)
		return r;
	if (f->inodes < (uint64_t)used) {
		snprintf(err, err_size,
			 "--inodes %" PRIu64 " is below the %" PRId64
			 " inodes in use; give at least that many",
			 f->inodes, used);
		return -EINVAL;
	}
	*ret = f->inodes;
	return 0;
}

static int cmd_grow(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct efs_cli_device d = {.fd = -1};
	char err[EFS_CLI_ERR_MAX] = "";
	struct efs_layout l = {0};
	struct efs_meta_key sbk;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__FsInfo *cur = NULL;
	uint64_t want, old, bs, old_data, new_data, old_last, new_last, old_inodes, inodes;
	uint32_t old_count, new_count, first, g;
	bool ok = false, tail;
	int ret, r;

	ret = fs_cmd_start(&f, argc, argv, FS_CMD_TARGET | FS_CMD_JSON | FS_CMD_INODES, usage_grow);
	if (ret >= 0)
		goto out;
	ret = EXIT_FAILED;
	if (!f.device) {
		fprintf(stderr, "%s: grow wants the DEVICE (it checks its size and rewrites its "
				"superblock), not --name\n",
			prog);
		ret = EXIT_USAGE;
		goto out;
	}
	r = efs_cli_device_open(f.device, true, &d, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		goto out;
	}
	want = d.size;
	if (f.target && parse_bytes(f.target, &want) < 0) {
		fprintf(stderr, "%s: grow: '%s' is not a size (bytes, or with K, M, G, T)\n", prog,
			f.target);
		ret = EXIT_USAGE;
		goto out;
	}
	/* The geometry as etcd has it now, with its revision for the compare. */
	if (efs_meta_key_sb(&f.ns, &sbk) < 0 || grow_get(&f, &sbk, &kv) < 0 ||
	    efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &cur, NULL) < 0) {
		fprintf(stderr, "%s: grow: cannot read the \"sb\" record again\n", prog);
		goto out;
	}
	bs = cur->block_size;
	old = cur->device_size;
	old_count = cur->ag_count;
	if (want < old) {
		fprintf(stderr,
			"%s: refusing to shrink %s from %" PRIu64 " to %" PRIu64
			" bytes: etcfs filesystems only grow\n",
			prog, cur->name, old, want);
		goto out;
	}
	if (want > d.size) {
		fprintf(stderr,
			"%s: %s has %" PRIu64 " bytes, fewer than the %" PRIu64
			" asked for: grow the device first (truncate -s, losetup -c, ...)\n",
			prog, f.device, d.size, want);
		goto out;
	}
	old_data = old / bs - cur->data_start;
	new_data = want / bs - cur->data_start;
	old_inodes = cur->inode_limit;
	r = grow_inode_limit(&f, old_inodes, old_data, new_data, &inodes, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "%s: grow: %s\n", prog, err);
		goto out;
	}
	if (new_data == old_data && inodes == old_inodes) {
		if (f.json)
			printf("{\"name\":\"%s\",\"grown\":false,\"device_size\":%" PRIu64
			       ",\"ag_count\":%" PRIu32 ",\"inode_limit\":%" PRIu64 "}\n",
			       cur->name, old, old_count, old_inodes);
		else
			printf("%s is already %" PRIu64 " bytes (%" PRIu32 " groups, %" PRIu64
			       " inodes): nothing to do\n",
			       cur->name, old, old_count, old_inodes);
		ret = EXIT_FIT;
		goto out;
	}
	if ((new_data + cur->ag_blocks - 1) / cur->ag_blocks > UINT32_MAX) {
		fprintf(stderr, "%s: grow: %" PRIu64 " bytes make too many groups\n", prog, want);
		goto out;
	}
	new_count = (uint32_t)((new_data + cur->ag_blocks - 1) / cur->ag_blocks);
	l.block_size = cur->block_size;
	l.device_size = want;
	l.data_start = cur->data_start;
	l.data_blocks = new_data;
	l.ag_blocks = cur->ag_blocks;
	l.ag_count = new_count;
	l.inode_limit = inodes;
	old_last = old_data - (uint64_t)(old_count - 1) * cur->ag_blocks;
	new_last = efs_layout_group_blocks(&l, old_count - 1);
	tail = new_last != old_last;

	/* The new groups' records first, in batches: nobody reads groups past
	 * "sb"'s count, so a batch left by a failed run is only rewritten. The
	 * last batch goes with "sb" itself. */
	progress_start("grow: new groups", new_count - old_count);
	first = old_count;
	while (new_count - first > GROW_BATCH_GROUPS) {
		struct efs_etcd_txn *t = NULL;

		r = efs_etcd_txn_new(&t, 0);
		if (r == 0)
			r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, sbk.buf,
						 sbk.len, kv->mod_revision);
		for (g = first; r == 0 && g < first + GROW_BATCH_GROUPS; g++)
			r = grow_put_group(t, &f.ns, &l, g);
		if (r == 0)
			r = grow_txn_run(&f, t, &ok, err, sizeof(err));
		efs_etcd_txn_free(t);
		if (r == 0 && !ok) {
			snprintf(err, sizeof(err), "the \"sb\" record changed meanwhile (another "
						   "grow?); try again");
			r = -EAGAIN;
		}
		if (r < 0) {
			progress_done(NULL);
			fprintf(stderr, "%s: grow: %s\n", prog, err);
			goto out;
		}
		first += GROW_BATCH_GROUPS;
		progress_add(GROW_BATCH_GROUPS);
	}
	for (int tries = 0;; tries++) {
		struct efs_etcd_txn *t = NULL;
		ProtobufCBinaryData v = {0};

		cur->device_size = want;
		cur->ag_count = new_count;
		cur->inode_limit = inodes;
		r = efs_etcd_txn_new(&t, 0);
		if (r == 0)
			r = efs_etcd_txn_compare(t, EFS_ETCD_CMP_MOD, EFS_ETCD_CMP_EQUAL, sbk.buf,
						 sbk.len, kv->mod_revision);
		if (r == 0 && tail)
			r = grow_last_group(&f, t, old_count - 1, old_last, new_last, err,
					    sizeof(err));
		for (g = first; r == 0 && g < new_count; g++)
			r = grow_put_group(t, &f.ns, &l, g);
		if (r == 0)
			r = efs_meta_pack(&cur->base, &v);
		if (r == 0)
			r = efs_etcd_txn_put(t, EFS_ETCD_TXN_SUCCESS, sbk.buf, sbk.len, v.data,
					     v.len, 0);
		efs_mem_free(v.data);
		if (r == 0)
			r = grow_txn_run(&f, t, &ok, err, sizeof(err));
		efs_etcd_txn_free(t);
		if (r < 0 || ok)
			break;
		/* The old last group's owner changed its map meanwhile, or "sb"
		 * moved: read again (a moved "sb" fails the compare again). */
		if (tries + 1 >= GROW_TRIES) {
			snprintf(err, sizeof(err),
				 "the filesystem kept changing under the transaction; try again");
			r = -EAGAIN;
			break;
		}
		if (!tail)
			break;
	}
	if (r == 0 && !ok) {
		snprintf(err, sizeof(err),
			 "the \"sb\" record changed meanwhile (another grow?); try again");
		r = -EAGAIN;
	}
	if (r < 0) {
		progress_done(NULL);
		fprintf(stderr, "%s: grow: %s\n", prog, err);
		goto out;
	}
	progress_add(new_count - first);
	progress_done("etcd updated");
	/* etcd may record a larger device than the superblock (mount accepts
	 * it), never a smaller one: the superblock goes second. */
	r = grow_write_sb(&d, want, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr,
			"%s: grow: etcd has the new size but the superblock was not rewritten: %s "
			"(run grow again)\n",
			prog, err);
		goto out;
	}
	if (f.json)
		printf("{\"name\":\"%s\",\"grown\":true,\"old_device_size\":%" PRIu64
		       ",\"device_size\":%" PRIu64 ",\"old_ag_count\":%" PRIu32
		       ",\"ag_count\":%" PRIu32 ",\"ag_bytes\":%" PRIu64
		       ",\"old_inode_limit\":%" PRIu64 ",\"inode_limit\":%" PRIu64 "}\n",
		       cur->name, old, want, old_count, new_count, cur->ag_blocks * bs, old_inodes,
		       inodes);
	else
		printf("%s grown from %" PRIu64 " to %" PRIu64 " bytes: %" PRIu32 " -> %" PRIu32
		       " allocation groups of %" PRIu64 " bytes, %" PRIu64 " -> %" PRIu64
		       " inodes\n",
		       cur->name, old, want, old_count, new_count, cur->ag_blocks * bs, old_inodes,
		       inodes);
	ret = EXIT_FIT;
out:
	efs_meta_record_free(cur);
	grow_kv_free(kv);
	efs_cli_device_close(&d);
	fs_cmd_done(&f);
	return ret;
}

/* ---- stats ---- */

#define STATS_INTERVAL_MS 1000
#define STATS_FETCH_MS	  2000

/* The figures of one /metrics sample (counters, summed over labels). */
struct stats_sample {
	uint64_t t_ns; /* monotonic, when it was read */
	double ops, op_errors, commits, conflicts, txn_errors;
	double dev_read, dev_write, dev_ios, data_read, data_write, fsyncs;
};

static void usage_stats(FILE *f)
{
	fprintf(f,
		"Usage: %s stats [OPTIONS] DEVICE | --name NAME [NODE]\n"
		"\n"
		"A live per-second view of one node: FUSE operations and errors, etcd\n"
		"transactions committed, in conflict and failed, device bytes read and written\n"
		"and requests, file bytes read and written, fsyncs. The figures come from the\n"
		"node's /metrics, at the address its session record publishes (etcfsd\n"
		"--metrics-addr). NODE may be left out when one node has the filesystem\n"
		"mounted. On a terminal the view is redrawn in place; otherwise one line a\n"
		"sample (and with --json one JSON object a line).\n"
		"%s"
		"\n"
		"  --interval SECONDS       time between samples (default 1)\n"
		"  --count N                stop after N samples (default: until interrupted)\n"
		"%s"
		"\n"
		"%s"
		"\n"
		"Exit status: 0 success; 2 usage error; 3 cannot connect to etcd; 4 failed (no\n"
		"such node, no metrics address, metrics unreachable).\n",
		prog, fs_cmd_help, json_cmd_options, efs_cli_etcd_usage());
}

/* Adds the value of every sample line of |buf| to the figure its name and
 * labels say. -EPROTO when |buf| is not a 200 answer. */
static int stats_parse(const char *buf, struct stats_sample *out)
{
	const char *p;

	if (strncmp(buf, "HTTP/1.", 7) || strncmp(buf + 8, " 200", 4))
		return -EPROTO;
	p = strstr(buf, "\r\n\r\n");
	p = p ? p + 4 : buf;
	for (; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : p + strlen(p)) {
		const char *sp = strpbrk(p, " \n"), *nl = strchr(p, '\n');
		size_t nlen;
		double v;

		if (*p == '#' || !sp || *sp != ' ' || (nl && sp > nl))
			continue;
		nlen = (size_t)(sp - p);
		v = strtod(sp + 1, NULL);
#define IS(pfx) (nlen >= strlen(pfx) && !strncmp(p, pfx, strlen(pfx)))
#define HAS(lab) (memmem(p, nlen, lab, strlen(lab)) != NULL)
		if (IS("etcfs_fuse_ops_total"))
			out->ops += v;
		else if (IS("etcfs_fuse_errors_total"))
			out->op_errors += v;
		else if (IS("etcfs_etcd_txns_total") && HAS("outcome=\"ok\""))
			out->commits += v;
		else if (IS("etcfs_etcd_txns_total") && HAS("outcome=\"conflict\""))
			out->conflicts += v;
		else if (IS("etcfs_etcd_txns_total"))
			out->txn_errors += v;
		else if (IS("etcfs_dev_bytes_total") && HAS("op=\"read\""))
			out->dev_read += v;
		else if (IS("etcfs_dev_bytes_total") && HAS("op=\"write\""))
			out->dev_write += v;
		else if (IS("etcfs_dev_ios_total"))
			out->dev_ios += v;
		else if (IS("etcfs_data_read_bytes_total"))
			out->data_read += v;
		else if (IS("etcfs_data_write_bytes_total"))
			out->data_write += v;
		else if (IS("etcfs_data_fsyncs_total"))
			out->fsyncs += v;
#undef IS
#undef HAS
	}
	return 0;
}

static int stats_fetch(const char *addr, struct stats_sample *out)
{
	uint64_t deadline = efs_clock_mono_ns() + (uint64_t)STATS_FETCH_MS * 1000000;
	char *buf = NULL;
	int fd, r;

	memset(out, 0, sizeof(*out));
	fd = efs_cli_metrics_connect(addr, deadline);
	if (fd < 0)
		return fd;
	r = efs_cli_metrics_get(fd, addr, deadline, &buf, NULL);
	if (r == 0)
		r = stats_parse(buf, out);
	efs_mem_free(buf);
	out->t_ns = efs_clock_mono_ns();
	return r;
}

/* Reads n/<node> (or, with |node| NULL, the only n/ key): its metrics
 * address into |addr|, the node's name into |name|. Exit status or -1. */
static int stats_node(struct fs_cmd *f, const char *node, char *name, size_t name_size,
		      char *addr, size_t addr_size)
{
	struct efs_meta_range range;
	Etcdserverpb__RangeResponse *rr = NULL;
	Etcdserverpb__TxnResponse *resp = NULL;
	struct efs_etcd_txn *t = NULL;
	Etcfs__NodeInfo *ni = NULL;
	int ret = EXIT_FAILED, r;
	size_t found = 0, at = 0;

	r = efs_meta_range_family(&f->ns, EFS_META_K_NODE, &range);
	if (r == 0)
		r = efs_etcd_txn_new(&t, 0);
	if (r == 0)
		r = efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, range.key.buf, range.key.len,
				       range.end.buf, range.end.len);
	if (r == 0)
		r = efs_etcd_sync_txn(f->s, efs_etcd_txn_request(t), &resp);
	efs_etcd_txn_free(t);
	if (r == 0)
		r = efs_etcd_txn_resp_range(resp, 0, &rr);
	if (r < 0) {
		fprintf(stderr, "%s: reading the nodes: %s\n", prog, strerror(-r));
		goto out;
	}
	for (size_t i = 0; i < rr->n_kvs; i++) {
		struct efs_meta_key_info info;

		if (efs_meta_key_parse(&f->ns, rr->kvs[i]->key.data, rr->kvs[i]->key.len,
				       &info) < 0 ||
		    info.family != EFS_META_K_NODE)
			continue;
		if (!node || !strcmp(info.node, node)) {
			found++;
			at = i;
			snprintf(name, name_size, "%s", info.node);
		}
	}
	if (!found) {
		fprintf(stderr, node ? "%s: node %s has no session on %s (not mounted?)\n"
				     : "%s: no node has %s mounted\n",
			prog, node ? node : f->fi->name, f->fi->name);
		goto out;
	}
	if (found > 1) {
		fprintf(stderr, "%s: %zu nodes have %s mounted: name one (see %s members)\n",
			prog, found, f->fi->name, prog);
		ret = EXIT_USAGE;
		goto out;
	}
	r = efs_meta_nodeinfo_decode(rr->kvs[at]->value.data, rr->kvs[at]->value.len, &ni, NULL);
	if (r < 0) {
		fprintf(stderr, "%s: node %s: unreadable session record\n", prog, name);
		goto out;
	}
	if (!ni->metrics_addr[0]) {
		fprintf(stderr,
			"%s: node %s publishes no metrics address (start etcfsd with "
			"--metrics-addr)\n",
			prog, name);
		goto out;
	}
	snprintf(addr, addr_size, "%s", ni->metrics_addr);
	ret = -1;
out:
	efs_meta_record_free(ni);
	if (resp)
		protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	return ret;
}

static void stats_print(const struct fs_cmd *f, const char *node, const struct stats_sample *a,
			const struct stats_sample *b, unsigned long n, bool tty)
{
	double dt = (double)(b->t_ns - a->t_ns) / 1e9;
	char r1[16], r2[16], r3[16], r4[16];

	if (dt <= 0)
		dt = 1e-9;
#define RATE(x) ((b->x - a->x) / dt)
	if (f->json) {
		printf("{");
		json_kstr(true, "node", node);
		printf(",\"sample\":%lu,\"seconds\":%.3f,\"ops_per_s\":%.1f,\"op_errors_per_s\":%.1f"
		       ",\"commits_per_s\":%.1f,\"conflicts_per_s\":%.1f,\"txn_errors_per_s\":%.1f"
		       ",\"dev_read_bytes_per_s\":%.0f,\"dev_write_bytes_per_s\":%.0f"
		       ",\"dev_ios_per_s\":%.1f,\"file_read_bytes_per_s\":%.0f"
		       ",\"file_write_bytes_per_s\":%.0f,\"fsyncs_per_s\":%.1f}\n",
		       n, dt, RATE(ops), RATE(op_errors), RATE(commits), RATE(conflicts),
		       RATE(txn_errors), RATE(dev_read), RATE(dev_write), RATE(dev_ios),
		       RATE(data_read), RATE(data_write), RATE(fsyncs));
	} else {
		if (tty)
			printf("\033[H\033[J%s stats of node %s on %s, every %.1f s (Ctrl-C ends)\n\n",
			       prog, node, f->fi->name, dt);
		if (tty || n == 1)
			printf("%9s %8s %9s %9s %8s %9s %9s %8s %9s %9s %7s\n", "OPS/s", "ERR/s",
			       "COMMIT/s", "CONFL/s", "TXERR/s", "DEV-RD/s", "DEV-WR/s", "IOS/s",
			       "FILE-RD/s", "FILE-WR/s", "FSYNC/s");
		printf("%9.1f %8.1f %9.1f %9.1f %8.1f %9s %9s %8.1f %9s %9s %7.1f\n", RATE(ops),
		       RATE(op_errors), RATE(commits), RATE(conflicts), RATE(txn_errors),
		       human_size((uint64_t)RATE(dev_read), r1, sizeof(r1)),
		       human_size((uint64_t)RATE(dev_write), r2, sizeof(r2)), RATE(dev_ios),
		       human_size((uint64_t)RATE(data_read), r3, sizeof(r3)),
		       human_size((uint64_t)RATE(data_write), r4, sizeof(r4)), RATE(fsyncs));
	}
#undef RATE
	fflush(stdout);
}

static int cmd_stats(int argc, char **argv)
{
	struct fs_cmd f = {0};
	struct stats_sample prev, cur;
	char node[EFS_META_NODE_MAX + 1] = "", addr[256];
	bool tty = isatty(STDOUT_FILENO);
	int ret, r;

	ret = fs_cmd_start(&f, argc, argv, FS_CMD_TARGET | FS_CMD_JSON | FS_CMD_SAMPLES,
			   usage_stats);
	if (ret >= 0)
		goto out;
	ret = stats_node(&f, f.target, node, sizeof(node), addr, sizeof(addr));
	if (ret >= 0)
		goto out;
	ret = EXIT_FAILED;
	r = stats_fetch(addr, &prev);
	for (unsigned long n = 1; r == 0 && (!f.count || n <= f.count); n++) {
		uint32_t ms = f.interval_ms ? f.interval_ms : STATS_INTERVAL_MS;
		struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		r = stats_fetch(addr, &cur);
		if (r == 0) {
			stats_print(&f, node, &prev, &cur, n, tty);
			prev = cur;
		}
	}
	if (r < 0) {
		fprintf(stderr, "%s: node %s: metrics at %s: %s\n", prog, node, addr,
			r == -EPROTO ? "no 200 answer" : strerror(-r));
		goto out;
	}
	ret = EXIT_FIT;
out:
	fs_cmd_done(&f);
	return ret;
}

/* ---- subcommand table ---- */

struct subcmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *summary;
};

static const struct subcmd subcmds[] = {
	{"etcd-check", cmd_etcd_check, "check that an etcd cluster is fit for etcfs"},
	{"df", cmd_df, "space and inode usage of a filesystem"},
	{"grow", cmd_grow, "grow a filesystem onto a larger device, online"},
	{"stats", cmd_stats, "a live per-second view of one node's operations and I/O"},
	{"status", cmd_status, "identity of a filesystem and the nodes that mount it"},
	{"locks", cmd_locks, "inode locks held and recalls waiting, across the nodes"},
	{"members", cmd_members, "the nodes of a filesystem: sessions, leases, clock skew"},
	{"evict", cmd_evict, "fence a wedged node: end its session, bump its generation"},
	{"backup", cmd_backup, "copy a filesystem's metadata and blocks into one file"},
	{"restore", cmd_restore, "restore a backup onto a device and an empty keyspace"},
	{"sync", cmd_sync, "make every mounted node publish what it buffers, now"},
};

static void usage(FILE *f)
{
	fprintf(f, "Usage: %s COMMAND [OPTIONS]\n\nCommands:\n", prog);
	for (size_t i = 0; i < sizeof(subcmds) / sizeof(subcmds[0]); i++)
		fprintf(f, "  %-14s %s\n", subcmds[i].name, subcmds[i].summary);
	fprintf(f,
		"\n'%s COMMAND --help' describes a command and its options.\n"
		"  --version      print the version\n"
		"\n"
		"Exit status: 0 success (etcd-check: fit); 1 etcd-check: unfit, locks: a recall\n"
		"unanswered; 2 usage error;\n"
		"3 cannot connect to etcd or it refuses our credentials; 4 the command failed.\n",
		prog);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("etcfsctl %s\n", ETCFS_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(subcmds) / sizeof(subcmds[0]); i++) {
		if (!strcmp(argv[1], subcmds[i].name)) {
			/* getopt sees the subcommand as argv[0]. */
			return subcmds[i].run(argc - 1, argv + 1);
		}
	}
	fprintf(stderr, "%s: unknown command '%s'\n", prog, argv[1]);
	usage(stderr);
	return EXIT_USAGE;
}
