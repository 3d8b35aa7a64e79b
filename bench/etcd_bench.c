/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Closed-loop benchmark of the etcd client: one uv loop, one client, one
 * connection (the bulk channel), exactly N unary calls in flight.
 *
 * For each (workload, concurrency, repetition) it prints one JSON line on
 * stdout: throughput, latency p50/p99, client CPU per request (getrusage of
 * the whole process over the measurement window) and peak RSS. A memory mode
 * issues bursts of M calls at once (M in flight together) and reports the
 * RSS growth per burst, to show that memory per in-flight call is small and
 * that repeated bursts do not grow the process. A human table with the
 * median of the repetitions goes to stderr at the end.
 *
 * Workloads:
 *   put: Put of key <prefix>/<cfg>/<slot>, value of --value-size bytes.
 *   txn: Txn with one compare (mod_revision of the slot's key equals the
 *        revision of the slot's last write, 0 at first) and one Put of that
 *        key in the success branch; the failure branch reads the key back so
 *        that a failed compare re-synchronises the slot (a compare-and-swap,
 *        the shape of an etcfs metadata update). Only the slot writes its
 *        key, so every compare succeeds; failures are counted.
 *   get:  linearizable Range of the slot's key, which does not exist (the
 *         read of a missing name): the leader confirms it still leads and
 *         the member waits until it has applied that far before it reads.
 *   sget: the same Range, serializable: answered from the member's store.
 *
 * Everything the bench writes is under --prefix; at the end it deletes that
 * prefix and compacts at the last revision, so repeated runs do not grow the
 * etcd database.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include <uv.h>

#include "etcd/etcd.h"
#include "util/clock.h"
#include "util/mem.h"

#define MAX_LIST  16
#define KEY_MAX   96
#define MAX_ERRNO 160

enum workload {
	WL_PUT = 0,
	WL_TXN,
	WL_GET,
	WL_SGET,
	WL_N,
};

static const char *const workload_names[WL_N] = {"put", "txn", "get", "sget"};

enum phase {
	PH_IDLE = 0, /* nothing running */
	PH_WARMUP,   /* calls run, nothing is recorded */
	PH_MEASURE,  /* completions are recorded */
	PH_DRAIN,    /* no new calls; waiting for those in flight */
	PH_BURST,    /* memory mode: one burst in flight */
};

struct bench;

/* One closed-loop "user": it has at most one call in flight. */
struct slot {
	struct bench *b;
	uint64_t start_ns;
	/* Revision of the slot's last successful write of its key (txn). */
	int64_t mod_rev;
	/* Memory mode: times this slot's call was re-issued after an error. */
	unsigned retries;
	size_t keylen;
	char key[KEY_MAX];
};

/* The outcome of one (workload, concurrency, repetition) measurement. */
struct result {
	enum workload wl;
	unsigned conc;
	unsigned rep;
	uint64_t ops;
	uint64_t errors;
	uint64_t txn_failed;
	double secs;
	double ops_per_s;
	double p50_us;
	double p99_us;
	double cpu_us_per_op;
	double utime_s;
	double stime_s;
	long rss_start_kb;
	long rss_end_kb;
	long hwm_kb;
};

struct bench {
	uv_loop_t loop;
	struct efs_etcd *client;
	struct efs_etcd_callopts co;
	uv_timer_t timer;

	/* Options. */
	const char *endpoint;
	const char *prefix;
	unsigned duration_ms;
	unsigned warmup_ms;
	size_t value_size;
	char *value;

	/* The configuration being run. */
	enum workload wl;
	enum phase phase;
	unsigned cfg_id;
	struct slot *slots;
	unsigned nslots;
	unsigned inflight;
	uint64_t issued;

	/* Measurement window. */
	uint64_t t0_ns;
	uint64_t t1_ns;
	struct rusage ru0;
	struct rusage ru1;
	uint64_t *lat; /* latencies (ns) of completions in the window */
	size_t nlat;
	size_t caplat;
	uint64_t errors;
	uint64_t txn_failed;
	int first_err;
	char first_msg[160];
	/* Memory mode: the most heap in use seen during a burst, and calls
	 * re-issued after an error. */
	size_t heap_max;
	uint64_t burst_retries;

	/* Highest revision seen, for the final compaction. */
	int64_t max_rev;
	bool fatal;
};

/* Reads a "Vm...:" line of /proc/self/status in KiB, or -1. */
static long proc_status_kb(const char *field)
{
	char line[256];
	size_t flen = strlen(field);
	long kb = -1;
	FILE *f = fopen("/proc/self/status", "re");

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
			kb = strtol(line + flen + 1, NULL, 10);
			break;
		}
	}
	fclose(f);
	return kb;
}

/* Bytes of heap in use (glibc's mallinfo2), or 0 where unavailable. */
static size_t heap_in_use(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
	struct mallinfo2 mi = mallinfo2();

	return mi.uordblks + mi.hblkhd;
#else
	return 0;
#endif
}

/* Resets VmHWM to the current RSS (Linux >= 4.0); returns 0 or -errno. */
static int reset_hwm(void)
{
	FILE *f = fopen("/proc/self/clear_refs", "we");
	int r = 0;

	if (!f)
		return -errno;
	if (fputs("5", f) < 0)
		r = -EIO;
	if (fclose(f) != 0 && r == 0)
		r = -errno;
	return r;
}

static double tv_s(struct timeval tv)
{
	return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of a sorted array, in microseconds. */
static double pct_us(const uint64_t *v, size_t n, double p)
{
	size_t rank;

	if (n == 0)
		return 0;
	rank = (size_t)(p / 100.0 * (double)n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return (double)v[rank - 1] / 1e3;
}

static int lat_push(struct bench *b, uint64_t ns)
{
	if (b->nlat == b->caplat) {
		size_t ncap = b->caplat ? b->caplat * 2 : 65536;
		uint64_t *n = efs_mem_realloc(b->lat, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		b->lat = n;
		b->caplat = ncap;
	}
	b->lat[b->nlat++] = ns;
	return 0;
}

static void call_done(struct efs_etcd_result *r, void *arg);

/* Starts the slot's next call. Returns 0 or the -errno of efs_etcd_call. */
static int slot_issue(struct slot *s)
{
	struct bench *b = s->b;
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__RangeRequest get = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	Etcdserverpb__RequestOp op_put = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp op_get = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__TxnRequest txn = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__Compare *cmps[1] = {&cmp};
	Etcdserverpb__RequestOp *succ[1] = {&op_put};
	Etcdserverpb__RequestOp *fail[1] = {&op_get};
	const ProtobufCMessage *req;
	enum efs_etcd_method m;
	int r;

	put.key.data = (uint8_t *)s->key;
	put.key.len = s->keylen;
	put.value.data = (uint8_t *)b->value;
	put.value.len = b->value_size;

	if (b->wl == WL_PUT) {
		m = EFS_ETCD_PUT;
		req = &put.base;
	} else if (b->wl == WL_GET || b->wl == WL_SGET) {
		get.key = put.key;
		get.serializable = b->wl == WL_SGET;
		m = EFS_ETCD_RANGE;
		req = &get.base;
	} else {
		cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
		cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD;
		cmp.key = put.key;
		cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
		cmp.mod_revision = s->mod_rev;
		op_put.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
		op_put.request_put = &put;
		get.key = put.key;
		op_get.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
		op_get.request_range = &get;
		txn.n_compare = 1;
		txn.compare = cmps;
		txn.n_success = 1;
		txn.success = succ;
		txn.n_failure = 1;
		txn.failure = fail;
		m = EFS_ETCD_TXN;
		req = &txn.base;
	}

	s->start_ns = efs_clock_mono_ns();
	r = efs_etcd_call(b->client, m, req, &b->co, call_done, s, NULL);
	if (r < 0)
		return r;
	b->inflight++;
	b->issued++;
	return 0;
}

static void note_error(struct bench *b, const struct efs_etcd_result *r)
{
	if (b->errors++ == 0) {
		b->first_err = r->err;
		snprintf(b->first_msg, sizeof(b->first_msg), "grpc-status %d: %s", r->grpc_status,
			 r->message ? r->message : "");
	}
}

/* Learns the slot's key revision from a reply; counts failed compares. */
static void note_reply(struct bench *b, struct slot *s, const ProtobufCMessage *resp)
{
	if (b->wl == WL_GET || b->wl == WL_SGET) {
		const Etcdserverpb__RangeResponse *g = (const Etcdserverpb__RangeResponse *)resp;

		if (g->header && g->header->revision > b->max_rev)
			b->max_rev = g->header->revision;
		return;
	}
	if (b->wl == WL_PUT) {
		const Etcdserverpb__PutResponse *p = (const Etcdserverpb__PutResponse *)resp;

		if (p->header && p->header->revision > b->max_rev)
			b->max_rev = p->header->revision;
		return;
	}

	const Etcdserverpb__TxnResponse *t = (const Etcdserverpb__TxnResponse *)resp;

	if (t->header && t->header->revision > b->max_rev)
		b->max_rev = t->header->revision;
	if (t->succeeded) {
		/* The put of this txn created the header's revision. */
		if (t->header)
			s->mod_rev = t->header->revision;
		return;
	}
	if (b->phase == PH_MEASURE)
		b->txn_failed++;
	s->mod_rev = 0;
	if (t->n_responses == 1 &&
	    t->responses[0]->response_case == ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE) {
		const Etcdserverpb__RangeResponse *rr = t->responses[0]->response_range;

		if (rr->n_kvs == 1)
			s->mod_rev = rr->kvs[0]->mod_revision;
	}
}

static void phase_done(struct bench *b)
{
	b->phase = PH_IDLE;
	uv_stop(&b->loop);
}

static void call_done(struct efs_etcd_result *r, void *arg)
{
	struct slot *s = arg;
	struct bench *b = s->b;
	uint64_t now = efs_clock_mono_ns();
	int e;

	b->inflight--;
	if (b->phase == PH_BURST && (b->inflight & 255) == 0) {
		size_t h = heap_in_use();

		if (h > b->heap_max)
			b->heap_max = h;
	}
	if (r->err && b->phase == PH_BURST && s->retries < 5) {
		/* etcd sheds load ("too many requests") when its apply queue is
		 * 5000 behind; re-issue so that the burst stays n in flight. */
		s->retries++;
		b->burst_retries++;
		e = slot_issue(s);
		if (e == 0)
			return;
	}
	if (r->err) {
		if (b->phase == PH_MEASURE || b->phase == PH_BURST)
			note_error(b, r);
		/* The key's revision is unknown after a failed txn; a failed
		 * compare next time re-reads it. */
		s->mod_rev = -1;
	} else {
		note_reply(b, s, r->resp);
		if (b->phase == PH_MEASURE && lat_push(b, now - s->start_ns) < 0)
			b->fatal = true;
	}

	switch (b->phase) {
	case PH_WARMUP:
	case PH_MEASURE:
		if (b->fatal)
			break;
		e = slot_issue(s);
		if (e < 0) {
			fprintf(stderr, "etcd_bench: efs_etcd_call: %s\n", strerror(-e));
			b->fatal = true;
		}
		break;
	default:
		break;
	}
	if (b->inflight == 0 && (b->phase == PH_DRAIN || b->phase == PH_BURST || b->fatal))
		phase_done(b);
}

static void timer_cb(uv_timer_t *t)
{
	struct bench *b = t->data;

	if (b->phase == PH_WARMUP) {
		b->phase = PH_MEASURE;
		getrusage(RUSAGE_SELF, &b->ru0);
		b->t0_ns = efs_clock_mono_ns();
		uv_timer_start(&b->timer, timer_cb, b->duration_ms, 0);
		return;
	}
	if (b->phase == PH_MEASURE) {
		b->t1_ns = efs_clock_mono_ns();
		getrusage(RUSAGE_SELF, &b->ru1);
		b->phase = PH_DRAIN;
		if (b->inflight == 0)
			phase_done(b);
	}
}

static int slots_setup(struct bench *b, unsigned n)
{
	b->slots = efs_mem_calloc(n, sizeof(*b->slots));
	if (!b->slots)
		return -ENOMEM;
	b->nslots = n;
	for (unsigned i = 0; i < n; i++) {
		struct slot *s = &b->slots[i];
		int len = snprintf(s->key, sizeof(s->key), "%s/%u/%06u", b->prefix, b->cfg_id, i);

		if (len < 0 || (size_t)len >= sizeof(s->key))
			return -ENAMETOOLONG;
		s->keylen = (size_t)len;
		s->b = b;
		s->mod_rev = 0;
	}
	return 0;
}

static void slots_free(struct bench *b)
{
	efs_mem_free(b->slots);
	b->slots = NULL;
	b->nslots = 0;
}

/* Runs one closed-loop measurement; fills |res|. */
static int run_closed(struct bench *b, enum workload wl, unsigned conc, unsigned rep,
		      struct result *res)
{
	int r;

	b->wl = wl;
	b->cfg_id++;
	b->nlat = 0;
	b->errors = 0;
	b->txn_failed = 0;
	b->first_err = 0;
	b->first_msg[0] = '\0';
	r = slots_setup(b, conc);
	if (r < 0)
		goto out;

	memset(res, 0, sizeof(*res));
	res->wl = wl;
	res->conc = conc;
	res->rep = rep;
	res->rss_start_kb = proc_status_kb("VmRSS");
	(void)reset_hwm();

	b->phase = PH_WARMUP;
	for (unsigned i = 0; i < conc; i++) {
		r = slot_issue(&b->slots[i]);
		if (r < 0) {
			fprintf(stderr, "etcd_bench: efs_etcd_call: %s\n", strerror(-r));
			b->fatal = true;
			break;
		}
	}
	uv_timer_start(&b->timer, timer_cb, b->warmup_ms, 0);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	uv_timer_stop(&b->timer);
	if (b->fatal) {
		/* Let what is in flight finish before the slots go away. */
		b->phase = PH_DRAIN;
		if (b->inflight)
			uv_run(&b->loop, UV_RUN_DEFAULT);
		r = -EIO;
		goto out;
	}

	qsort(b->lat, b->nlat, sizeof(*b->lat), cmp_u64);
	res->ops = b->nlat;
	res->errors = b->errors;
	res->txn_failed = b->txn_failed;
	res->secs = (double)(b->t1_ns - b->t0_ns) / 1e9;
	res->ops_per_s = res->secs > 0 ? (double)res->ops / res->secs : 0;
	res->p50_us = pct_us(b->lat, b->nlat, 50);
	res->p99_us = pct_us(b->lat, b->nlat, 99);
	res->utime_s = tv_s(b->ru1.ru_utime) - tv_s(b->ru0.ru_utime);
	res->stime_s = tv_s(b->ru1.ru_stime) - tv_s(b->ru0.ru_stime);
	res->cpu_us_per_op = res->ops ? (res->utime_s + res->stime_s) * 1e6 / (double)res->ops : 0;
	res->rss_end_kb = proc_status_kb("VmRSS");
	res->hwm_kb = proc_status_kb("VmHWM");
	r = 0;
out:
	slots_free(b);
	return r;
}

static void print_json(const struct bench *b, const struct result *res)
{
	printf("{\"client\":\"c\",\"test\":\"closed\",\"workload\":\"%s\",\"concurrency\":%u,"
	       "\"rep\":%u,\"ops\":%" PRIu64 ",\"secs\":%.4f,\"ops_per_s\":%.1f,"
	       "\"p50_us\":%.1f,\"p99_us\":%.1f,\"cpu_us_per_op\":%.3f,\"utime_s\":%.4f,"
	       "\"stime_s\":%.4f,\"errors\":%" PRIu64 ",\"txn_failed\":%" PRIu64 ","
	       "\"rss_start_kb\":%ld,\"rss_end_kb\":%ld,\"hwm_kb\":%ld,\"value_size\":%zu}\n",
	       workload_names[res->wl], res->conc, res->rep, res->ops, res->secs, res->ops_per_s,
	       res->p50_us, res->p99_us, res->cpu_us_per_op, res->utime_s, res->stime_s,
	       res->errors, res->txn_failed, res->rss_start_kb, res->rss_end_kb, res->hwm_kb,
	       b->value_size);
	if (res->errors)
		fprintf(stderr, "etcd_bench: %s c=%u: %" PRIu64 " errors, first %s: %s\n",
			workload_names[res->wl], res->conc, res->errors, strerror(-b->first_err),
			b->first_msg);
	fflush(stdout);
}

/* Issues |n| Puts at once and runs the loop until all have completed. */
static int burst(struct bench *b, unsigned n)
{
	int r;

	b->cfg_id++;
	b->errors = 0;
	b->burst_retries = 0;
	b->heap_max = 0;
	r = slots_setup(b, n);
	if (r < 0)
		return r;
	b->phase = PH_BURST;
	for (unsigned i = 0; i < n; i++) {
		r = slot_issue(&b->slots[i]);
		if (r < 0) {
			fprintf(stderr, "etcd_bench: burst call %u: %s\n", i, strerror(-r));
			break;
		}
	}
	b->heap_max = heap_in_use();
	if (b->inflight)
		uv_run(&b->loop, UV_RUN_DEFAULT);
	b->phase = PH_IDLE;
	slots_free(b);
	return r;
}

/*
 * Memory mode: a small warm-up burst (connects, lets the allocator settle),
 * then the idle RSS and heap, then |rounds| bursts of |n| Puts issued at
 * once, so all n are in flight together. Per round: peak RSS (VmHWM, reset
 * before the burst) and its growth over the idle RSS, the peak heap in use
 * (sampled after issuing and every 256 completions) over the idle heap, and
 * the RSS after the burst. The first round's growth is the memory that n
 * requests in flight cost; later rounds show whether it stays bounded (the
 * allocator keeps and reuses what the first round grew).
 */
static int run_mem(struct bench *b, unsigned n, unsigned rounds)
{
	long rss_idle, first_hwm = -1, max_hwm = 0, first_after = -1, last_after = -1;
	size_t heap_idle, first_heap = 0;
	double secs_sum = 0, cpu_sum = 0;
	uint64_t errs = 0;
	int r;

	b->wl = WL_PUT;
	r = burst(b, 256);
	if (r < 0)
		return r;
	rss_idle = proc_status_kb("VmRSS");
	heap_idle = heap_in_use();
	for (unsigned round = 1; round <= rounds; round++) {
		struct rusage ru0, ru1;
		long hwm, rss1;
		size_t heap_after;
		uint64_t t0, t1;
		double cpu;

		(void)reset_hwm();
		getrusage(RUSAGE_SELF, &ru0);
		t0 = efs_clock_mono_ns();
		r = burst(b, n);
		t1 = efs_clock_mono_ns();
		getrusage(RUSAGE_SELF, &ru1);
		if (r < 0)
			return r;
		hwm = proc_status_kb("VmHWM");
		rss1 = proc_status_kb("VmRSS");
		heap_after = heap_in_use();
		cpu = tv_s(ru1.ru_utime) + tv_s(ru1.ru_stime) - tv_s(ru0.ru_utime) -
		      tv_s(ru0.ru_stime);
		printf("{\"client\":\"c\",\"test\":\"mem\",\"inflight\":%u,\"round\":%u,"
		       "\"rss_idle_kb\":%ld,\"hwm_kb\":%ld,\"peak_delta_kb\":%ld,"
		       "\"bytes_per_inflight\":%.0f,\"heap_delta_bytes\":%zd,"
		       "\"heap_per_inflight\":%.0f,\"heap_after_delta_bytes\":%zd,\"rss_after_kb\":"
		       "%ld,\"secs\":%.4f,"
		       "\"cpu_us_per_op\":%.3f,\"errors\":%" PRIu64 ",\"retries\":%" PRIu64 "}\n",
		       n, round, rss_idle, hwm, hwm - rss_idle,
		       (double)(hwm - rss_idle) * 1024.0 / n, (ssize_t)(b->heap_max - heap_idle),
		       ((double)b->heap_max - (double)heap_idle) / n,
		       (ssize_t)(heap_after - heap_idle), rss1, (double)(t1 - t0) / 1e9,
		       cpu * 1e6 / n, b->errors, b->burst_retries);
		fflush(stdout);
		if (b->errors)
			fprintf(stderr,
				"etcd_bench: mem round %u: %" PRIu64 " errors, first %s: %s\n",
				round, b->errors, strerror(-b->first_err), b->first_msg);
		errs += b->errors;
		if (first_hwm < 0) {
			first_hwm = hwm;
			first_after = rss1;
			first_heap = b->heap_max;
		}
		if (hwm > max_hwm)
			max_hwm = hwm;
		last_after = rss1;
		secs_sum += (double)(t1 - t0) / 1e9;
		cpu_sum += cpu;
	}
	if (rounds > 0)
		fprintf(stderr,
			"memory, %u Puts in flight at once: idle RSS %ld KiB; first burst peak RSS "
			"%ld KiB (+%ld KiB, %.0f B per request; heap +%.0f B per request); "
			"peak over %u bursts %ld KiB; RSS after first/last burst %ld/%ld KiB; "
			"burst %.3f s, CPU %.2f us/call, %" PRIu64 " errors\n",
			n, rss_idle, first_hwm, first_hwm - rss_idle,
			(double)(first_hwm - rss_idle) * 1024.0 / n,
			((double)first_heap - (double)heap_idle) / n, rounds, max_hwm, first_after,
			last_after, secs_sum / rounds, cpu_sum * 1e6 / ((double)n * rounds), errs);
	return 0;
}

static void cleanup_done(struct efs_etcd_result *r, void *arg)
{
	struct bench *b = arg;

	if (r->err)
		fprintf(stderr, "etcd_bench: cleanup: %s: %s\n", strerror(-r->err), r->message);
	else if (r->resp) {
		const Etcdserverpb__DeleteRangeResponse *d =
		    (const Etcdserverpb__DeleteRangeResponse *)r->resp;

		if (d->header && d->header->revision > b->max_rev)
			b->max_rev = d->header->revision;
	}
	b->inflight--;
	if (b->inflight == 0)
		uv_stop(&b->loop);
}

/* Deletes everything under the prefix, then compacts at the last revision. */
static void cleanup(struct bench *b)
{
	Etcdserverpb__DeleteRangeRequest del = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	Etcdserverpb__CompactionRequest cmp = ETCDSERVERPB__COMPACTION_REQUEST__INIT;
	char key[KEY_MAX], end[KEY_MAX];
	int len = snprintf(key, sizeof(key), "%s/", b->prefix);

	if (len <= 0 || (size_t)len >= sizeof(key))
		return;
	memcpy(end, key, (size_t)len);
	end[len - 1]++; /* '/' + 1: the prefix's range end */
	del.key.data = (uint8_t *)key;
	del.key.len = (size_t)len;
	del.range_end.data = (uint8_t *)end;
	del.range_end.len = (size_t)len;
	if (efs_etcd_call(b->client, EFS_ETCD_DELETE_RANGE, &del.base, &b->co, cleanup_done, b,
			  NULL) == 0) {
		b->inflight++;
		uv_run(&b->loop, UV_RUN_DEFAULT);
	}
	if (b->max_rev <= 0)
		return;
	cmp.revision = b->max_rev;
	if (efs_etcd_call(b->client, EFS_ETCD_COMPACT, &cmp.base, &b->co, cleanup_done, b, NULL) ==
	    0) {
		b->inflight++;
		uv_run(&b->loop, UV_RUN_DEFAULT);
	}
}

static void client_freed(void *arg)
{
	(void)arg;
}

/* The client's counters: one connection, no reconnects, no retries. */
static void print_stats(const struct bench *b)
{
	struct efs_etcd_stats st;

	efs_etcd_get_stats(b->client, &st);
	printf("{\"client\":\"c\",\"test\":\"stats\",\"calls_started\":%" PRIu64
	       ",\"calls_failed\":%" PRIu64 ",\"calls_retried\":%" PRIu64 ",\"reconnects\":%" PRIu64
	       ",\"bytes_sent\":%" PRIu64 ",\"bytes_received\":%" PRIu64 "}\n",
	       st.calls_started, st.calls_failed, st.calls_retried, st.reconnects, st.bytes_sent,
	       st.bytes_received);
	fflush(stdout);
}

static double median(double *v, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		double x = v[i];
		size_t j = i;

		while (j > 0 && v[j - 1] > x) {
			v[j] = v[j - 1];
			j--;
		}
		v[j] = x;
	}
	if (n == 0)
		return 0;
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void print_table(const struct result *res, size_t nres, unsigned reps)
{
	fprintf(stderr, "%-8s %6s %12s %10s %10s %12s %10s %8s\n", "workload", "conc", "ops/s",
		"p50 us", "p99 us", "cpu us/op", "hwm KiB", "errors");
	for (size_t i = 0; i < nres; i += reps) {
		double ops[MAX_LIST], p50[MAX_LIST], p99[MAX_LIST], cpu[MAX_LIST];
		uint64_t errs = 0;
		long hwm = 0;
		size_t n = 0;

		for (size_t k = i; k < i + reps && k < nres; k++, n++) {
			ops[n] = res[k].ops_per_s;
			p50[n] = res[k].p50_us;
			p99[n] = res[k].p99_us;
			cpu[n] = res[k].cpu_us_per_op;
			errs += res[k].errors + res[k].txn_failed;
			if (res[k].hwm_kb > hwm)
				hwm = res[k].hwm_kb;
		}
		fprintf(stderr, "%-8s %6u %12.0f %10.1f %10.1f %12.2f %10ld %8" PRIu64 "\n",
			workload_names[res[i].wl], res[i].conc, median(ops, n), median(p50, n),
			median(p99, n), median(cpu, n), hwm, errs);
	}
	fprintf(stderr,
		"(medians of %u repetitions; CPU = getrusage user+sys of the process / "
		"completed requests)\n",
		reps);
}

static int parse_list(const char *s, unsigned *out, size_t *n)
{
	char *end;

	*n = 0;
	while (*s) {
		unsigned long v = strtoul(s, &end, 10);

		if (end == s || v == 0 || v > 1000000 || *n == MAX_LIST)
			return -EINVAL;
		out[(*n)++] = (unsigned)v;
		s = end;
		if (*s == ',')
			s++;
		else if (*s)
			return -EINVAL;
	}
	return *n ? 0 : -EINVAL;
}

static int parse_workloads(const char *s, enum workload *out, size_t *n)
{
	*n = 0;
	while (*s) {
		size_t len = strcspn(s, ",");
		int found = -1;

		for (int w = 0; w < WL_N; w++)
			if (strlen(workload_names[w]) == len &&
			    strncmp(s, workload_names[w], len) == 0)
				found = w;
		if (found < 0 || *n == MAX_LIST)
			return -EINVAL;
		out[(*n)++] = (enum workload)found;
		s += len;
		if (*s == ',')
			s++;
	}
	return *n ? 0 : -EINVAL;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: etcd_bench --endpoint URL [options]\n"
		   "  --workload LIST      put,txn,get,sget (default put,txn)\n"
		   "  --concurrency LIST   calls in flight (default 1,16,64,256)\n"
		   "  --reps N             repetitions of each configuration (default 3)\n"
		   "  --duration-ms MS     measurement window (default 3000)\n"
		   "  --warmup-ms MS       unrecorded warm-up before each window (default 500)\n"
		   "  --value-size B       Put value size (default 64)\n"
		   "  --mem-inflight N     memory mode: bursts of N calls at once (0: off)\n"
		   "  --mem-rounds N       bursts after the warm-up burst (default 3)\n"
		   "  --prefix P           key prefix (default bench/c<pid>)\n"
		   "  --mem-only           skip the closed-loop runs\n"
		   "  --no-cleanup         keep the keys and do not compact\n"
		   "JSON lines on stdout, a table of medians on stderr.\n");
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
	    {"endpoint", required_argument, NULL, 'e'},
	    {"workload", required_argument, NULL, 'w'},
	    {"concurrency", required_argument, NULL, 'c'},
	    {"reps", required_argument, NULL, 'r'},
	    {"duration-ms", required_argument, NULL, 'd'},
	    {"warmup-ms", required_argument, NULL, 'W'},
	    {"value-size", required_argument, NULL, 'v'},
	    {"mem-inflight", required_argument, NULL, 'm'},
	    {"mem-rounds", required_argument, NULL, 'M'},
	    {"prefix", required_argument, NULL, 'p'},
	    {"no-cleanup", no_argument, NULL, 'n'},
	    {"mem-only", no_argument, NULL, 'o'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct efs_etcd_opts opts = {0};
	struct bench b = {0};
	enum workload wls[MAX_LIST] = {WL_PUT, WL_TXN};
	unsigned concs[MAX_LIST] = {1, 16, 64, 256};
	size_t nwl = 2, nconc = 4;
	unsigned reps = 3, mem_n = 0, mem_rounds = 3;
	bool do_cleanup = true, mem_only = false;
	char prefix[64];
	struct result *res = NULL;
	size_t nres = 0;
	int opt, r, ret = 1;

	b.duration_ms = 3000;
	b.warmup_ms = 500;
	b.value_size = 64;
	snprintf(prefix, sizeof(prefix), "bench/c%ld", (long)getpid());
	b.prefix = prefix;

	while ((opt = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (opt) {
		case 'e':
			b.endpoint = optarg;
			break;
		case 'w':
			if (parse_workloads(optarg, wls, &nwl) < 0)
				goto bad_arg;
			break;
		case 'c':
			if (parse_list(optarg, concs, &nconc) < 0)
				goto bad_arg;
			break;
		case 'r':
			reps = (unsigned)strtoul(optarg, NULL, 10);
			if (reps == 0 || reps > MAX_LIST)
				goto bad_arg;
			break;
		case 'd':
			b.duration_ms = (unsigned)strtoul(optarg, NULL, 10);
			if (b.duration_ms == 0)
				goto bad_arg;
			break;
		case 'W':
			b.warmup_ms = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'v':
			b.value_size = strtoul(optarg, NULL, 10);
			if (b.value_size > 1024 * 1024)
				goto bad_arg;
			break;
		case 'm':
			mem_n = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'M':
			mem_rounds = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'p':
			b.prefix = optarg;
			break;
		case 'n':
			do_cleanup = false;
			break;
		case 'o':
			mem_only = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			goto bad_arg;
		}
	}
	if (!b.endpoint || optind != argc)
		goto bad_arg;
	if (mem_only)
		nwl = 0;

	b.value = efs_mem_malloc(b.value_size + 1);
	res = efs_mem_calloc(nwl * nconc * reps + 1, sizeof(*res));
	if (!b.value || !res) {
		fprintf(stderr, "etcd_bench: out of memory\n");
		goto out;
	}
	memset(b.value, 'v', b.value_size);

	r = uv_loop_init(&b.loop);
	if (r < 0) {
		fprintf(stderr, "etcd_bench: uv_loop_init: %s\n", uv_strerror(r));
		goto out;
	}
	uv_timer_init(&b.loop, &b.timer);
	b.timer.data = &b;
	/* A generous deadline: the memory mode queues 10k calls at once. */
	opts.endpoints = b.endpoint;
	opts.call_timeout_ms = 60000;
	r = efs_etcd_new(&b.client, &b.loop, &opts);
	if (r < 0) {
		fprintf(stderr, "etcd_bench: efs_etcd_new(%s): %s\n", b.endpoint, strerror(-r));
		goto out_loop;
	}
	b.co.channel = EFS_ETCD_CH_BULK;

	/* Repetitions are the inner loop so that a configuration's runs sit
	 * next to each other in the output and the table. */
	ret = 0;
	for (size_t w = 0; w < nwl && ret == 0; w++) {
		for (size_t c = 0; c < nconc && ret == 0; c++) {
			for (unsigned k = 0; k < reps; k++) {
				r = run_closed(&b, wls[w], concs[c], k, &res[nres]);
				if (r < 0) {
					fprintf(stderr, "etcd_bench: %s c=%u failed: %s\n",
						workload_names[wls[w]], concs[c], strerror(-r));
					ret = 1;
					break;
				}
				print_json(&b, &res[nres]);
				nres++;
			}
		}
	}
	if (ret == 0 && mem_n > 0 && run_mem(&b, mem_n, mem_rounds) < 0)
		ret = 1;
	if (nres)
		print_table(res, nres, reps);
	print_stats(&b);
	if (do_cleanup)
		cleanup(&b);

	efs_etcd_free(b.client, client_freed, NULL);
out_loop:
	uv_close((uv_handle_t *)&b.timer, NULL);
	uv_run(&b.loop, UV_RUN_DEFAULT);
	if (uv_loop_close(&b.loop) < 0)
		fprintf(stderr, "etcd_bench: loop still has handles at exit\n");
out:
	efs_mem_free(b.lat);
	efs_mem_free(res);
	efs_mem_free(b.value);
	return ret;

bad_arg:
	usage(stderr);
	return 2;
}
