/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The metrics registry (counters, gauges, histograms, rendering checked line
 * by line against the Prometheus text format 0.0.4) and the /metrics HTTP
 * server on a private uv loop, driven by plain blocking sockets from client
 * threads (results are collected there and asserted on the test's thread).
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "util/httpd.h"
#include "util/mem.h"
#include "util/metrics.h"

#include "../support/leak.h"

TestSuite(metrics, .fini = efs_mem_fail_reset, .timeout = 30);

/* ---- Helpers ---- */

static char *render(const struct efs_metrics *m)
{
	size_t len;
	char *text;
	int r;

	r = efs_metrics_render(m, &text, &len);
	cr_assert_eq(r, 0, "render: %d", r);
	cr_assert_eq(strlen(text), len);
	return text;
}

static struct efs_metrics *registry(void)
{
	struct efs_metrics *m;

	cr_assert_eq(efs_metrics_new(&m), 0);
	return m;
}

/* Asserts that |text| is exactly the lines of |want| (NULL-terminated). */
static void assert_lines(const char *text, const char *const *want)
{
	const char *p = text;

	for (size_t i = 0; want[i]; i++) {
		const char *nl = strchr(p, '\n');

		cr_assert_not_null(nl, "line %zu missing, want \"%s\"", i, want[i]);
		cr_assert(strlen(want[i]) == (size_t)(nl - p) &&
				  !strncmp(p, want[i], (size_t)(nl - p)),
			  "line %zu: got \"%.*s\", want \"%s\"", i, (int)(nl - p), p, want[i]);
		p = nl + 1;
	}
	cr_assert_str_eq(p, "", "extra text after the expected lines: \"%s\"", p);
}

static bool is_name(const char *s, size_t n)
{
	char buf[256];

	if (n == 0 || n >= sizeof(buf))
		return false;
	memcpy(buf, s, n);
	buf[n] = '\0';
	return efs_metrics_name_is_valid(buf);
}

/*
 * A checker of the text format 0.0.4 as Prometheus parses it: every line
 * ends in \n; "# HELP name text" and "# TYPE name type" come once per family,
 * TYPE before its samples; each sample is name[{labels}] value, its name the
 * family's (plus _bucket/_sum/_count for a histogram), the family's samples
 * contiguous; label values escaped; a histogram's buckets cumulative with
 * le ascending, ending in +Inf equal to _count. Returns the number of
 * samples.
 */
static int check_exposition(const char *text)
{
	char family[256] = "", type[32] = "";
	char seen[64][256];
	int nseen = 0, samples = 0;
	double last_le = -INFINITY, last_bucket = 0, inf_bucket = -1;
	const char *p = text;

	cr_assert(*text == '\0' || text[strlen(text) - 1] == '\n', "text must end in a newline");
	while (*p) {
		const char *nl = strchr(p, '\n'), *q, *name_end, *value;
		char line[4096];
		char *end;
		double v;

		cr_assert_not_null(nl);
		cr_assert_lt((size_t)(nl - p), sizeof(line));
		memcpy(line, p, (size_t)(nl - p));
		line[nl - p] = '\0';
		p = nl + 1;
		if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
			const char *n = line + 7, *sp = strchr(n, ' ');

			cr_assert_not_null(sp, "%s", line);
			cr_assert(is_name(n, (size_t)(sp - n)), "bad family name: %s", line);
			if (strncmp(family, n, (size_t)(sp - n)) || family[sp - n] != '\0') {
				for (int i = 0; i < nseen; i++)
					cr_assert(strncmp(seen[i], n, (size_t)(sp - n)) ||
						  seen[i][sp - n] != '\0',
						  "family %s comes twice", line);
				cr_assert_lt(nseen, 64);
				memcpy(family, n, (size_t)(sp - n));
				family[sp - n] = '\0';
				strcpy(seen[nseen++], family);
				type[0] = '\0';
				last_le = -INFINITY;
			}
			if (line[2] == 'T') {
				cr_assert_str_eq(type, "", "second TYPE: %s", line);
				snprintf(type, sizeof(type), "%s", sp + 1);
				cr_assert(!strcmp(type, "counter") || !strcmp(type, "gauge") ||
					  !strcmp(type, "histogram"), "type: %s", line);
			} else {
				for (q = sp + 1; *q; q++) {
					if (*q != '\\')
						continue;
					cr_assert(q[1] == '\\' || q[1] == 'n', "help escape: %s",
						  line);
					q++;
				}
			}
			continue;
		}
		cr_assert_neq(line[0], '#', "comment line: %s", line);
		cr_assert_str_neq(type, "", "sample before TYPE: %s", line);
		for (name_end = line; *name_end && *name_end != '{' && *name_end != ' '; name_end++)
			;
		cr_assert(is_name(line, (size_t)(name_end - line)), "sample name: %s", line);
		{
			size_t fl = strlen(family), nl_ = (size_t)(name_end - line);
			const char *suffix = line + fl;

			cr_assert(nl_ >= fl && !strncmp(line, family, fl), "%s not in %s", line,
				  family);
			if (!strcmp(type, "histogram"))
				cr_assert((!strncmp(suffix, "_bucket", 7) && nl_ == fl + 7) ||
					  (!strncmp(suffix, "_sum", 4) && nl_ == fl + 4) ||
					  (!strncmp(suffix, "_count", 6) && nl_ == fl + 6),
					  "histogram sample %s", line);
			else
				cr_assert_eq(nl_, fl, "sample %s in family %s", line, family);
		}
		q = name_end;
		double le = NAN;
		if (*q == '{') {
			q++;
			for (;;) {
				const char *ln = q, *val;

				while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
				       *q == '_' || (q > ln && *q >= '0' && *q <= '9'))
					q++;
				cr_assert_gt(q - ln, 0, "label name: %s", line);
				cr_assert_eq(*q, '=', "%s", line);
				cr_assert_eq(q[1], '"', "%s", line);
				q += 2;
				val = q;
				while (*q != '"') {
					cr_assert_neq(*q, '\0', "unterminated value: %s", line);
					if (*q == '\\') {
						cr_assert(q[1] == '\\' || q[1] == '"' ||
								  q[1] == 'n',
							  "escape: %s", line);
						q++;
					}
					q++;
				}
				if (q - ln > 3 && !strncmp(ln, "le=", 3))
					le = !strncmp(val, "+Inf\"", 5) ? INFINITY
									: strtod(val, NULL);
				q++;
				if (*q == '}')
					break;
				cr_assert_eq(*q, ',', "%s", line);
				q++;
			}
			q++;
		}
		cr_assert_eq(*q, ' ', "no space before the value: %s", line);
		value = q + 1;
		if (!strcmp(value, "+Inf"))
			v = INFINITY;
		else if (!strcmp(value, "-Inf"))
			v = -INFINITY;
		else if (!strcmp(value, "NaN"))
			v = NAN;
		else {
			v = strtod(value, &end);
			cr_assert(end != value && *end == '\0', "value: %s", line);
		}
		if (!strcmp(type, "counter") || !strcmp(type, "histogram"))
			cr_assert((v >= 0 && v == floor(v)) || strstr(line, "_sum"), "%s", line);
		if (!strcmp(type, "histogram") && strstr(line, "_bucket")) {
			cr_assert(!isnan(le), "bucket without le: %s", line);
			if (last_le == INFINITY)
				last_le = -INFINITY; /* next label set */
			else if (last_le != -INFINITY) {
				cr_assert_gt(le, last_le, "%s", line);
				cr_assert_geq(v, last_bucket, "not cumulative: %s", line);
			}
			last_le = le;
			last_bucket = v;
			if (le == INFINITY)
				inf_bucket = v;
		}
		if (!strcmp(type, "histogram") && strstr(line, "_count"))
			cr_assert_eq(v, inf_bucket, "_count != +Inf bucket: %s", line);
		samples++;
	}
	return samples;
}

/* ---- Registry ---- */

Test(metrics, counter_adds_and_renders_as_an_integer)
{
	struct efs_metrics *m = registry();
	struct efs_counter *c = efs_metrics_counter(m, "etcfs_test_total", "Test things.", NULL);
	char *text;

	cr_assert_not_null(c);
	efs_counter_inc(c);
	efs_counter_add(c, 41);
	cr_assert_eq(efs_counter_get(c), 42);
	efs_counter_add(c, UINT64_C(10000000000000000000) - 42);
	text = render(m);
	assert_lines(text, (const char *const[]){
		"# HELP etcfs_test_total Test things.",
		"# TYPE etcfs_test_total counter",
		"etcfs_test_total 10000000000000000000",
		NULL});
	cr_assert_eq(check_exposition(text), 1);
	efs_mem_free(text);
	m = efs_metrics_free(m);
	cr_assert_null(m);
	efs_test_assert_no_leaks();
}

Test(metrics, same_name_and_labels_return_the_same_metric)
{
	struct efs_metrics *m = registry();
	struct efs_counter *a, *b, *c;
	struct efs_histogram *h;
	struct efs_gauge *g;

	a = efs_metrics_counter(m, "ops_total", "Ops.", "op=\"lookup\"");
	b = efs_metrics_counter(m, "ops_total", "Other help is ignored.", "op=\"lookup\"");
	c = efs_metrics_counter(m, "ops_total", "Ops.", "op=\"mkdir\"");
	cr_assert_not_null(a);
	cr_assert_eq(a, b);
	cr_assert_neq(a, c);
	cr_assert_eq(efs_metrics_counter(m, "ops_total", NULL, NULL),
		     efs_metrics_counter(m, "ops_total", NULL, ""));
	/* Another type under a registered name is refused. */
	cr_assert_null(efs_metrics_gauge(m, "ops_total", "x", "op=\"lookup\""));
	cr_assert_null(efs_metrics_histogram(m, "ops_total", "x", NULL));
	g = efs_metrics_gauge(m, "level", "Level.", NULL);
	cr_assert_eq(g, efs_metrics_gauge(m, "level", "Level.", NULL));
	h = efs_metrics_histogram(m, "lat_seconds", "Latency.", "op=\"a\"");
	cr_assert_eq(h, efs_metrics_histogram(m, "lat_seconds", "Latency.", "op=\"a\""));
	cr_assert_neq(h, efs_metrics_histogram(m, "lat_seconds", "Latency.", "op=\"b\""));
	cr_assert_null(efs_metrics_counter(m, "level", "x", NULL));
	efs_counter_inc(a);
	cr_assert_eq(efs_counter_get(b), 1);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

Test(metrics, label_sets_of_one_family_render_under_one_help_and_type)
{
	struct efs_metrics *m = registry();
	char *text;

	efs_counter_add(efs_metrics_counter(m, "etcfs_fuse_ops_total",
					    "FUSE requests by operation.",
					    "op=\"lookup\""), 3);
	efs_gauge_set(efs_metrics_gauge(m, "etcfs_session_state", "Session state.", NULL), 2);
	efs_counter_add(efs_metrics_counter(m, "etcfs_fuse_ops_total",
					    "FUSE requests by operation.",
					    "op=\"mkdir\""), 1);
	efs_counter_add(efs_metrics_counter(m, "etcfs_etcd_txn_total", "Transactions.",
					    "origin=\"create\",outcome=\"ok\""), 7);
	efs_metrics_counter(m, "etcfs_fuse_ops_total", NULL, "op=\"a\\\"b\\\\c\\nd\"");
	text = render(m);
	assert_lines(text, (const char *const[]){
		"# HELP etcfs_fuse_ops_total FUSE requests by operation.",
		"# TYPE etcfs_fuse_ops_total counter",
		"etcfs_fuse_ops_total{op=\"lookup\"} 3",
		"etcfs_fuse_ops_total{op=\"mkdir\"} 1",
		"etcfs_fuse_ops_total{op=\"a\\\"b\\\\c\\nd\"} 0",
		"# HELP etcfs_session_state Session state.",
		"# TYPE etcfs_session_state gauge",
		"etcfs_session_state 2",
		"# HELP etcfs_etcd_txn_total Transactions.",
		"# TYPE etcfs_etcd_txn_total counter",
		"etcfs_etcd_txn_total{origin=\"create\",outcome=\"ok\"} 7",
		NULL});
	cr_assert_eq(check_exposition(text), 5);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

Test(metrics, invalid_names_and_labels_are_refused)
{
	static const char *const bad_names[] = {"", "1abc", "a-b", "a b", "é", "a.b", "a{", NULL};
	static const char *const bad_labels[] = {
		"op",         "op=x",        "op=\"x",     "1op=\"x\"", "op=\"a\"b", "op=\"x\",",
		"op=\"\\t\"", ",op=\"x\"",   "op =\"x\"",  "o-p=\"x\"", "op=\"x\" ", "op=\"a\nb\"",
		":op=\"x\"",  "op=\"x\"\"",  NULL};
	struct efs_metrics *m = registry();
	char *text;

	for (size_t i = 0; bad_names[i]; i++) {
		cr_assert_not(efs_metrics_name_is_valid(bad_names[i]), "%s", bad_names[i]);
		cr_assert_null(efs_metrics_counter(m, bad_names[i], "x", NULL), "%s", bad_names[i]);
		cr_assert_null(efs_metrics_gauge(m, bad_names[i], "x", NULL));
		cr_assert_null(efs_metrics_histogram(m, bad_names[i], "x", NULL));
	}
	cr_assert_null(efs_metrics_counter(m, NULL, "x", NULL));
	for (size_t i = 0; bad_labels[i]; i++) {
		cr_assert_not(efs_metrics_labels_are_valid(bad_labels[i], false), "%s",
			      bad_labels[i]);
		cr_assert_null(efs_metrics_counter(m, "ok_total", "x", bad_labels[i]), "%s",
			       bad_labels[i]);
	}
	/* A histogram owns "le"; other metrics may use it. */
	cr_assert_null(efs_metrics_histogram(m, "h_seconds", "x", "le=\"1\""));
	cr_assert_null(efs_metrics_histogram(m, "h_seconds", "x", "op=\"a\",le=\"1\""));
	cr_assert_not_null(efs_metrics_histogram(m, "h_seconds", "x", "lex=\"1\""));
	cr_assert_not_null(efs_metrics_counter(m, "c_total", "x", "le=\"1\""));
	cr_assert_not_null(efs_metrics_counter(m, "_a:b_C9", NULL, "_x=\"\",y9=\"\\\\\\\"\\n\""));
	cr_assert(efs_metrics_labels_are_valid(NULL, true));
	cr_assert(efs_metrics_labels_are_valid("", true));
	text = render(m);
	/* Refused registrations left no families behind. */
	cr_assert_null(strstr(text, "ok_total"));
	cr_assert_eq(check_exposition(text), 1 + 1 + 22);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

Test(metrics, updates_accept_null)
{
	char *text;
	size_t len;

	efs_counter_add(NULL, 1);
	efs_counter_inc(NULL);
	cr_assert_eq(efs_counter_get(NULL), 0);
	efs_gauge_set(NULL, 1);
	efs_gauge_add(NULL, 1);
	cr_assert_eq(efs_gauge_get(NULL), 0);
	efs_histogram_observe_ns(NULL, 5);
	cr_assert_eq(efs_histogram_count(NULL), 0);
	cr_assert_null(efs_metrics_counter(NULL, "a", "b", NULL));
	cr_assert_null(efs_metrics_gauge(NULL, "a", "b", NULL));
	cr_assert_null(efs_metrics_histogram(NULL, "a", "b", NULL));
	cr_assert_null(efs_metrics_free(NULL));
	cr_assert_eq(efs_metrics_render(NULL, &text, &len), 0);
	cr_assert_eq(len, 0);
	cr_assert_str_eq(text, "");
	efs_mem_free(text);
	efs_test_assert_no_leaks();
}

Test(metrics, gauges_set_add_and_render_floats)
{
	struct efs_metrics *m = registry();
	struct efs_gauge *g[7];
	char *text;

	for (int i = 0; i < 7; i++) {
		char labels[16];

		snprintf(labels, sizeof(labels), "i=\"%d\"", i);
		g[i] = efs_metrics_gauge(m, "g", "", labels);
		cr_assert_not_null(g[i]);
	}
	efs_gauge_set(g[0], 1.5);
	efs_gauge_add(g[0], -3.5);
	cr_assert_eq(efs_gauge_get(g[0]), -2);
	efs_gauge_set(g[1], 0.1);
	efs_gauge_set(g[2], 1.0 / 3);
	efs_gauge_set(g[3], NAN);
	efs_gauge_set(g[4], INFINITY);
	efs_gauge_set(g[5], -INFINITY);
	efs_gauge_set(g[6], 1e300);
	text = render(m);
	assert_lines(text, (const char *const[]){
		"# TYPE g gauge",
		"g{i=\"0\"} -2",
		"g{i=\"1\"} 0.1",
		"g{i=\"2\"} 0.33333333333333331",
		"g{i=\"3\"} NaN",
		"g{i=\"4\"} +Inf",
		"g{i=\"5\"} -Inf",
		"g{i=\"6\"} 1e+300",
		NULL});
	cr_assert_eq(check_exposition(text), 7);
	cr_assert_eq(strtod("0.33333333333333331", NULL), 1.0 / 3);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

static double read_int(void *arg)
{
	return *(int *)arg;
}

static double read_int_twice(void *arg)
{
	return 2 * *(int *)arg;
}

Test(metrics, gauge_fn_is_read_at_render_time)
{
	struct efs_metrics *m = registry();
	struct efs_gauge *g;
	int v = 5, w = 0;
	char *text;

	g = efs_metrics_gauge_fn(m, "etcfs_loop_lag_seconds", "Loop lag.", NULL, read_int, &v);
	cr_assert_not_null(g);
	cr_assert_eq(efs_metrics_gauge_fn(m, "etcfs_loop_lag_seconds", "x", NULL, read_int, &v), g);
	cr_assert_null(efs_metrics_gauge_fn(m, "etcfs_loop_lag_seconds", "x", NULL, read_int, &w));
	cr_assert_null(efs_metrics_gauge_fn(m, "etcfs_loop_lag_seconds", "x", NULL, read_int_twice,
					    &v));
	cr_assert_null(efs_metrics_gauge(m, "etcfs_loop_lag_seconds", "x", NULL));
	cr_assert_null(efs_metrics_gauge_fn(m, "other", "x", NULL, NULL, &v));
	cr_assert_not_null(efs_metrics_gauge_fn(m, "etcfs_loop_lag_seconds", "x", "k=\"2\"",
						read_int_twice, &v));
	efs_gauge_set(g, 100);
	efs_gauge_add(g, 100);
	cr_assert_eq(efs_gauge_get(g), 5);
	v = 7;
	cr_assert_eq(efs_gauge_get(g), 7);
	text = render(m);
	assert_lines(text, (const char *const[]){
		"# HELP etcfs_loop_lag_seconds Loop lag.",
		"# TYPE etcfs_loop_lag_seconds gauge",
		"etcfs_loop_lag_seconds 7",
		"etcfs_loop_lag_seconds{k=\"2\"} 14",
		NULL});
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

static const char *const le_text[] = {
	"1e-05", "2e-05", "5e-05", "0.0001", "0.0002", "0.0005", "0.001", "0.002", "0.005", "0.01",
	"0.02",  "0.05",  "0.1",   "0.2",    "0.5",    "1",      "2",     "5",     "10",    "+Inf",
};

/* Renders |m|, one histogram of 22 samples, as |want| says, then frees
 * it; nothing leaks. */
static void assert_histogram_page(struct efs_metrics *m, const char *const *want)
{
	char *text = render(m);

	assert_lines(text, want);
	cr_assert_eq(check_exposition(text), 22);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

Test(metrics, histogram_buckets_are_inclusive_cumulative_and_exact)
{
	struct efs_metrics *m = registry();
	struct efs_histogram *h = efs_metrics_histogram(m, "lat_seconds", "Latency.", NULL);
	/* Observations and the bucket index each must land in. */
	static const struct {
		uint64_t ns;
		int bucket;
	} obs[] = {
		{0, 0},
		{10000, 0},               /* exactly 10 µs: le="1e-05" */
		{10001, 1},
		{20000, 1},
		{20001, 2},
		{999999, 6},
		{1000000, 6},             /* 1 ms */
		{1000001, 7},
		{1000000000, 15},         /* 1 s */
		{10000000000ULL, 18},     /* 10 s */
		{10000000001ULL, 19},     /* +Inf */
		{3600000000000ULL, 19},
	};
	uint64_t want[20] = {0}, sum = 0, cum = 0;
	char lines[24][96];
	const char *wantl[26];
	int n = 0;

	cr_assert_not_null(h);
	for (size_t i = 0; i < sizeof(obs) / sizeof(obs[0]); i++) {
		efs_histogram_observe_ns(h, obs[i].ns);
		want[obs[i].bucket]++;
		sum += obs[i].ns;
	}
	cr_assert_eq(efs_histogram_count(h), sizeof(obs) / sizeof(obs[0]));
	wantl[n++] = "# HELP lat_seconds Latency.";
	wantl[n++] = "# TYPE lat_seconds histogram";
	for (int i = 0; i < 20; i++) {
		cum += want[i];
		snprintf(lines[i], sizeof(lines[i]), "lat_seconds_bucket{le=\"%s\"} %llu",
			 le_text[i],
			 (unsigned long long)cum);
		wantl[n++] = lines[i];
	}
	snprintf(lines[20], sizeof(lines[20]), "lat_seconds_sum %llu.%09llu",
		 (unsigned long long)(sum / 1000000000), (unsigned long long)(sum % 1000000000));
	wantl[n++] = lines[20];
	snprintf(lines[21], sizeof(lines[21]), "lat_seconds_count %zu",
		 sizeof(obs) / sizeof(obs[0]));
	wantl[n++] = lines[21];
	wantl[n] = NULL;
	cr_assert_str_eq(lines[20], "lat_seconds_sum 3621.003060003");
	assert_histogram_page(m, wantl);
}

/* A count histogram: the same 1-2-5 bounds as plain numbers, an integer
 * sum. */
Test(metrics, count_histogram_renders_numbers_and_an_integer_sum)
{
	struct efs_metrics *m = registry();
	struct efs_histogram *h =
		efs_metrics_histogram_counts(m, "batch_inodes", "Inodes per batch.", NULL);
	static const char *const wantl[] = {
		"# HELP batch_inodes Inodes per batch.",
		"# TYPE batch_inodes histogram",
		"batch_inodes_bucket{le=\"1\"} 2",
		"batch_inodes_bucket{le=\"2\"} 2",
		"batch_inodes_bucket{le=\"5\"} 3",
		"batch_inodes_bucket{le=\"10\"} 3",
		"batch_inodes_bucket{le=\"20\"} 3",
		"batch_inodes_bucket{le=\"50\"} 3",
		"batch_inodes_bucket{le=\"100\"} 4",
		"batch_inodes_bucket{le=\"200\"} 4",
		"batch_inodes_bucket{le=\"500\"} 4",
		"batch_inodes_bucket{le=\"1000\"} 4",
		"batch_inodes_bucket{le=\"2000\"} 4",
		"batch_inodes_bucket{le=\"5000\"} 4",
		"batch_inodes_bucket{le=\"10000\"} 4",
		"batch_inodes_bucket{le=\"20000\"} 4",
		"batch_inodes_bucket{le=\"50000\"} 4",
		"batch_inodes_bucket{le=\"100000\"} 4",
		"batch_inodes_bucket{le=\"200000\"} 4",
		"batch_inodes_bucket{le=\"500000\"} 4",
		"batch_inodes_bucket{le=\"1000000\"} 5",
		"batch_inodes_bucket{le=\"+Inf\"} 6",
		"batch_inodes_sum 3000108",
		"batch_inodes_count 6",
		NULL,
	};

	cr_assert_not_null(h);
	efs_histogram_observe(h, 0);
	efs_histogram_observe(h, 1);	   /* inclusive: le="1" */
	efs_histogram_observe(h, 3);
	efs_histogram_observe(h, 100);
	efs_histogram_observe(h, 1000000); /* the last bound */
	efs_histogram_observe(h, 2000004); /* +Inf */
	cr_assert_eq(efs_histogram_count(h), 6);
	assert_histogram_page(m, wantl);
}

/* Observers on several threads (a read answered from an I/O worker): no
 * observation is lost, and a render meanwhile stays consistent. */
#define HOBS 200000

static void *observe_main(void *arg)
{
	struct efs_histogram *h = arg;

	for (int i = 0; i < HOBS; i++)
		efs_histogram_observe_ns(h, (uint64_t)(i % 7) * 1000000);
	return NULL;
}

Test(metrics, histogram_observations_from_many_threads_are_all_counted)
{
	struct efs_metrics *m = registry();
	struct efs_histogram *h = efs_metrics_histogram(m, "mt_seconds", "Latency.", NULL);
	pthread_t th[4];
	char *text, want[64];

	cr_assert_not_null(h);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, observe_main, h), 0);
	for (int k = 0; k < 20; k++) {
		/* +Inf and _count are the same total while observers run. */
		unsigned long long inf = 0, count = 1;
		const char *p, *q;

		text = render(m);
		p = strstr(text, "mt_seconds_bucket{le=\"+Inf\"} ");
		q = strstr(text, "mt_seconds_count ");
		cr_assert(p && q);
		sscanf(p + strlen("mt_seconds_bucket{le=\"+Inf\"} "), "%llu", &inf);
		sscanf(q + strlen("mt_seconds_count "), "%llu", &count);
		cr_assert_eq(inf, count, "+Inf %llu, _count %llu", inf, count);
		efs_mem_free(text);
	}
	for (int i = 0; i < 4; i++)
		cr_assert_eq(pthread_join(th[i], NULL), 0);
	cr_assert_eq(efs_histogram_count(h), 4ull * HOBS);
	text = render(m);
	snprintf(want, sizeof(want), "mt_seconds_count %llu\n", 4ull * HOBS);
	cr_assert_not_null(strstr(text, want), "%s", text);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

Test(metrics, histogram_labels_come_before_le)
{
	struct efs_metrics *m = registry();
	struct efs_histogram *a = efs_metrics_histogram(m, "op_seconds", "Ops.", "op=\"lookup\"");
	struct efs_histogram *b = efs_metrics_histogram(m, "op_seconds", "Ops.", "op=\"mkdir\"");
	char *text;

	efs_histogram_observe_ns(a, 15000);
	efs_histogram_observe_ns(b, 1500000000);
	text = render(m);
	cr_assert_not_null(strstr(text, "\nop_seconds_bucket{op=\"lookup\",le=\"1e-05\"} 0\n"
					"op_seconds_bucket{op=\"lookup\",le=\"2e-05\"} 1\n"));
	cr_assert_not_null(strstr(text, "\nop_seconds_bucket{op=\"lookup\",le=\"+Inf\"} 1\n"
					"op_seconds_sum{op=\"lookup\"} 0.000015000\n"
					"op_seconds_count{op=\"lookup\"} 1\n"
					"op_seconds_bucket{op=\"mkdir\",le=\"1e-05\"} 0\n"));
	cr_assert_not_null(strstr(text, "\nop_seconds_bucket{op=\"mkdir\",le=\"1\"} 0\n"
					"op_seconds_bucket{op=\"mkdir\",le=\"2\"} 1\n"));
	cr_assert_not_null(strstr(text, "op_seconds_sum{op=\"mkdir\"} 1.500000000\n"));
	cr_assert_eq(check_exposition(text), 44);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

Test(metrics, help_text_is_escaped_and_empty_help_omitted)
{
	struct efs_metrics *m = registry();
	char *text;

	efs_metrics_counter(m, "a_total", "Back\\slash and\nnewline \"quotes\" stay.", NULL);
	efs_metrics_counter(m, "b_total", "", NULL);
	efs_metrics_counter(m, "c_total", NULL, NULL);
	text = render(m);
	assert_lines(text, (const char *const[]){
		"# HELP a_total Back\\\\slash and\\nnewline \"quotes\" stay.",
		"# TYPE a_total counter",
		"a_total 0",
		"# TYPE b_total counter",
		"b_total 0",
		"# TYPE c_total counter",
		"c_total 0",
		NULL});
	cr_assert_eq(check_exposition(text), 3);
	efs_mem_free(text);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

#define ADDERS 4
#define ADDS 200000

static void *adder(void *arg)
{
	for (int i = 0; i < ADDS; i++)
		efs_counter_inc(arg);
	return NULL;
}

Test(metrics, counter_adds_from_threads_are_not_lost)
{
	struct efs_metrics *m = registry();
	struct efs_counter *c = efs_metrics_counter(m, "io_total", "I/O.", NULL);
	pthread_t t[ADDERS];
	uint64_t seen = 0;

	for (int i = 0; i < ADDERS; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, adder, c), 0);
	/* Concurrent reads see a count that never goes back. */
	for (int i = 0; i < 1000; i++) {
		uint64_t v = efs_counter_get(c);

		cr_assert_geq(v, seen);
		seen = v;
	}
	for (int i = 0; i < ADDERS; i++)
		pthread_join(t[i], NULL);
	cr_assert_eq(efs_counter_get(c), (uint64_t)ADDERS * ADDS);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}

/* One registration and render scenario, for the failmalloc sweep. */
static int scenario(void)
{
	struct efs_metrics *m;
	char *text;
	size_t len;
	int r;

	r = efs_metrics_new(&m);
	if (r < 0)
		return r;
	for (int i = 0; i < 40; i++) {
		char labels[32];

		snprintf(labels, sizeof(labels), "op=\"op%d\"", i);
		efs_counter_inc(efs_metrics_counter(m, "ops_total", "Ops.", labels));
		efs_histogram_observe_ns(efs_metrics_histogram(m, "op_seconds", "Ops.", labels),
					 (uint64_t)i * 100000);
	}
	efs_gauge_set(efs_metrics_gauge(m, "state", "State.", NULL), 1);
	r = efs_metrics_render(m, &text, &len);
	if (r == 0)
		efs_mem_free(text);
	efs_metrics_free(m);
	return r;
}

Test(metrics, every_allocation_failure_unwinds_cleanly)
{
	long n;

	efs_mem_fail_reset();
	cr_assert_eq(scenario(), 0);
	n = efs_mem_count();
	cr_assert_gt(n, 100);
	for (long i = 0; i < n; i++) {
		efs_mem_fail_after(i);
		int r = scenario();

		cr_assert(r == 0 || r == -ENOMEM, "step %ld: %d", i, r);
		efs_mem_fail_reset();
	}
	efs_test_assert_no_leaks();
}

/* ---- HTTP server ---- */

/* A server on a private loop, driven until a client thread says it is done. */
struct server {
	uv_loop_t loop;
	uv_async_t finish;
	struct efs_metrics *m;
	struct efs_counter *requests;
	struct efs_httpd *h;
	uint64_t timeout_ms;
	int port;
	bool stopped;
	void *(*client)(void *arg);
	void *client_arg;
};

static void server_stopped(void *arg)
{
	*(bool *)arg = true;
}

static void finish_cb(uv_async_t *a)
{
	struct server *s = a->data;

	efs_httpd_stop(s->h, server_stopped, &s->stopped);
	uv_close((uv_handle_t *)a, NULL);
}

static void *client_main(void *arg)
{
	struct server *s = arg;
	void *ret = s->client(s->client_arg);

	uv_async_send(&s->finish);
	return ret;
}

static void server_init(struct server *s)
{
	const char *colon;
	int r;

	memset(s, 0, sizeof(*s));
	cr_assert_eq(uv_loop_init(&s->loop), 0);
	s->m = registry();
	s->requests = efs_metrics_counter(s->m, "etcfs_test_requests_total", "Requests.", NULL);
	efs_counter_add(s->requests, 12);
	efs_histogram_observe_ns(efs_metrics_histogram(s->m, "etcfs_test_seconds", "Lat.", NULL),
				 123456);
	r = efs_httpd_start(&s->h, &s->loop, "127.0.0.1:0", s->m);
	cr_assert_eq(r, 0, "start: %d", r);
	colon = strrchr(efs_httpd_address(s->h), ':');
	cr_assert_not_null(colon);
	cr_assert(!strncmp(efs_httpd_address(s->h), "127.0.0.1:", 10));
	s->port = atoi(colon + 1);
	cr_assert_gt(s->port, 0);
	cr_assert_eq(uv_async_init(&s->loop, &s->finish, finish_cb), 0);
	s->finish.data = s;
}

/* Runs |client(arg)| in a thread while the loop serves, then stops everything. */
static void server_run(struct server *s, void *(*client)(void *), void *arg)
{
	pthread_t t;

	if (s->timeout_ms)
		efs_httpd_set_timeout(s->h, s->timeout_ms);
	s->client = client;
	s->client_arg = arg;
	cr_assert_eq(pthread_create(&t, NULL, client_main, s), 0);
	uv_run(&s->loop, UV_RUN_DEFAULT);
	pthread_join(t, NULL);
	cr_assert(s->stopped, "stop callback did not run");
	cr_assert_eq(uv_loop_close(&s->loop), 0, "handles left on the loop");
	efs_metrics_free(s->m);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int connect_to(int port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	struct timeval tv = {.tv_sec = 10};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		int r = -errno;

		close(fd);
		return r;
	}
	return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Reads until EOF (or an error) into |buf|; returns the length, or -errno with nothing read. */
static long recv_all(int fd, char *buf, size_t size)
{
	size_t len = 0;

	for (;;) {
		ssize_t n = recv(fd, buf + len, size - 1 - len, 0);

		if (n == 0)
			break;
		if (n < 0) {
			if (len == 0)
				return -errno;
			break;
		}
		len += (size_t)n;
		if (len == size - 1)
			break;
	}
	buf[len] = '\0';
	return (long)len;
}

struct response {
	int status;
	char head[1024];
	char body[65536];
	long body_len;
	long content_length;
	int err;
};

/* Sends |req| on a new connection and parses the answer into |res|. */
static void exchange_on(int fd, const char *req, struct response *res)
{
	static __thread char buf[70000];
	char *sep, *cl;
	long n;

	memset(res, 0, sizeof(*res));
	res->content_length = -1;
	res->err = send_all(fd, req, strlen(req));
	if (res->err)
		goto out;
	n = recv_all(fd, buf, sizeof(buf));
	if (n < 0) {
		res->err = (int)n;
		goto out;
	}
	sep = strstr(buf, "\r\n\r\n");
	if (!sep || sscanf(buf, "HTTP/1.1 %d ", &res->status) != 1) {
		res->err = -EPROTO;
		goto out;
	}
	snprintf(res->head, sizeof(res->head), "%.*s", (int)(sep + 2 - buf), buf);
	res->body_len = n - (sep + 4 - buf);
	memcpy(res->body, sep + 4, (size_t)res->body_len);
	res->body[res->body_len] = '\0';
	cl = strcasestr(res->head, "\r\nContent-Length: ");
	if (cl)
		res->content_length = atol(cl + 18);
out:
	close(fd);
}

static void exchange(int port, const char *req, struct response *res)
{
	int fd = connect_to(port);

	if (fd < 0) {
		memset(res, 0, sizeof(*res));
		res->err = fd;
		return;
	}
	exchange_on(fd, req, res);
}

static void assert_metrics_response(const struct response *res, const struct efs_metrics *m)
{
	char *text = render(m);

	cr_assert_eq(res->err, 0, "exchange: %d", res->err);
	cr_assert_eq(res->status, 200, "%s", res->head);
	cr_assert_not_null(strstr(res->head,
				  "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
			   "%s", res->head);
	cr_assert_not_null(strstr(res->head, "\r\nConnection: close\r\n"));
	cr_assert_eq(res->content_length, res->body_len);
	cr_assert_str_eq(res->body, text);
	efs_mem_free(text);
}

struct basic {
	int port;
	struct response get, head, query, index, nope, post, bad, http10, split, http2, relative;
};

static void *basic_client(void *arg)
{
	struct basic *b = arg;

	exchange(b->port, "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n", &b->get);
	exchange(b->port, "HEAD /metrics HTTP/1.1\r\n\r\n", &b->head);
	exchange(b->port, "GET /metrics?name[]=x HTTP/1.1\n\n", &b->query);
	exchange(b->port, "GET / HTTP/1.1\r\n\r\n", &b->index);
	exchange(b->port, "GET /nope HTTP/1.1\r\n\r\n", &b->nope);
	exchange(b->port,
		 "POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", &b->post);
	exchange(b->port, "GARBAGE\r\n\r\n", &b->bad);
	exchange(b->port, "GET /metrics HTTP/1.0\r\n\r\n", &b->http10);
	exchange(b->port, "GET /metrics HTTP/2.0\r\n\r\n", &b->http2);
	exchange(b->port, "GET metrics HTTP/1.1\r\n\r\n", &b->relative);
	/* A head that arrives a few bytes at a time, split inside the final CRLF CRLF. */
	{
		static const char *const parts[] = {"G", "ET /met", "rics HTTP/1.1\r",
						    "\nHost: x\r\n\r",
						    "\n"};
		int fd = connect_to(b->port), one = 1;

		if (fd < 0) {
			b->split.err = fd;
			return NULL;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		for (size_t i = 0; i < 4; i++) {
			send_all(fd, parts[i], strlen(parts[i]));
			usleep(5000);
		}
		exchange_on(fd, parts[4], &b->split);
	}
	return NULL;
}

Test(metrics, httpd_answers_metrics_404_405_and_400)
{
	struct server s;
	struct basic b;

	server_init(&s);
	b.port = s.port;
	server_run(&s, basic_client, &b);
	/* server_run freed the registry: rebuild the same one to compare. */
	s.m = registry();
	efs_counter_add(efs_metrics_counter(s.m, "etcfs_test_requests_total", "Requests.", NULL),
			12);
	efs_histogram_observe_ns(efs_metrics_histogram(s.m, "etcfs_test_seconds", "Lat.", NULL),
				 123456);
	assert_metrics_response(&b.get, s.m);
	assert_metrics_response(&b.query, s.m);
	assert_metrics_response(&b.http10, s.m);
	assert_metrics_response(&b.split, s.m);
	cr_assert(strstr(b.get.body, "etcfs_test_requests_total 12\n"));
	cr_assert_eq(check_exposition(b.get.body), 1 + 22);
	cr_assert_eq(b.head.err, 0);
	cr_assert_eq(b.head.status, 200);
	cr_assert_eq(b.head.body_len, 0);
	cr_assert_eq(b.head.content_length, b.get.body_len);
	cr_assert_eq(b.index.status, 200);
	cr_assert(strstr(b.index.body, "/metrics"));
	cr_assert_eq(b.index.content_length, b.index.body_len);
	cr_assert_eq(b.nope.err, 0);
	cr_assert_eq(b.nope.status, 404, "%s", b.nope.head);
	cr_assert_eq(b.nope.content_length, b.nope.body_len);
	cr_assert_eq(b.post.err, 0, "%d", b.post.err);
	cr_assert_eq(b.post.status, 405, "%s", b.post.head);
	cr_assert(strstr(b.post.head, "\r\nAllow: GET, HEAD\r\n"), "%s", b.post.head);
	cr_assert_eq(b.bad.status, 400, "%s", b.bad.head);
	cr_assert_eq(b.http2.status, 400, "%s", b.http2.head);
	cr_assert_eq(b.relative.status, 400, "%s", b.relative.head);
	efs_metrics_free(s.m);
	efs_test_assert_no_leaks();
}

struct oversized {
	int port;
	long first_read;
	int first_err;
	struct response after;
};

static void *oversized_client(void *arg)
{
	struct oversized *o = arg;
	char *req = malloc(EFS_HTTPD_MAX_REQUEST + 1000);
	char buf[256];
	int fd;

	memset(req, 'a', EFS_HTTPD_MAX_REQUEST + 1000);
	memcpy(req, "GET /metrics HTTP/1.1\r\nX-Big: ", 30);
	fd = connect_to(o->port);
	o->first_err = fd < 0 ? fd : send_all(fd, req, EFS_HTTPD_MAX_REQUEST + 1000);
	/* The send may fail with EPIPE/ECONNRESET once the server has dropped it. */
	o->first_read = fd < 0 ? fd : recv_all(fd, buf, sizeof(buf));
	if (fd >= 0)
		close(fd);
	free(req);
	exchange(o->port, "GET /metrics HTTP/1.1\r\n\r\n", &o->after);
	return NULL;
}

Test(metrics, httpd_drops_an_oversized_request)
{
	struct server s;
	struct oversized o = {0};

	server_init(&s);
	o.port = s.port;
	server_run(&s, oversized_client, &o);
	cr_assert(o.first_err == 0 || o.first_err == -EPIPE || o.first_err == -ECONNRESET,
		  "%d", o.first_err);
	/* Closed without an answer: EOF, or a reset for the unread excess. */
	cr_assert(o.first_read == 0 || o.first_read == -ECONNRESET, "read %ld", o.first_read);
	cr_assert_eq(o.after.err, 0);
	cr_assert_eq(o.after.status, 200);
	efs_test_assert_no_leaks();
}

struct exact {
	int port;
	const char *req;
	struct response res;
};

static void *exact_client(void *arg)
{
	struct exact *e = arg;

	exchange(e->port, e->req, &e->res);
	return NULL;
}

Test(metrics, httpd_accepts_a_head_of_exactly_the_limit)
{
	static struct exact e;
	char *req = malloc(EFS_HTTPD_MAX_REQUEST + 1);
	struct server s;

	memset(req, 'a', EFS_HTTPD_MAX_REQUEST);
	memcpy(req, "GET /metrics HTTP/1.1\r\nX-Big: ", 30);
	memcpy(req + EFS_HTTPD_MAX_REQUEST - 4, "\r\n\r\n", 5);
	cr_assert_eq(strlen(req), EFS_HTTPD_MAX_REQUEST);
	server_init(&s);
	e.port = s.port;
	e.req = req;
	server_run(&s, exact_client, &e);
	free(req);
	cr_assert_eq(e.res.err, 0, "%d", e.res.err);
	cr_assert_eq(e.res.status, 200);
	efs_test_assert_no_leaks();
}

struct slow {
	int port;
	int timeout_ms;
	int fd_err;
	long slow_read;
	uint64_t opened_ms, closed_ms, fast_done_ms;
	struct response fast[3];
	int ready[2]; /* a pipe: the slow connection is open and its partial request sent */
};

/* Opens the slow connection, sends half a request and waits until the server closes it. */
static void *slow_reader(void *arg)
{
	struct slow *sl = arg;
	char buf[256];
	int fd;

	fd = connect_to(sl->port);
	sl->fd_err = fd < 0 ? fd : send_all(fd, "GET /metr", 9);
	sl->opened_ms = now_ms();
	(void)!write(sl->ready[1], "x", 1);
	sl->slow_read = fd < 0 ? fd : recv_all(fd, buf, sizeof(buf));
	sl->closed_ms = now_ms();
	if (fd >= 0)
		close(fd);
	return NULL;
}

static void *slow_client(void *arg)
{
	struct slow *sl = arg;
	pthread_t t;
	char c;

	pthread_create(&t, NULL, slow_reader, sl);
	(void)!read(sl->ready[0], &c, 1);
	for (int i = 0; i < 3; i++)
		exchange(sl->port, "GET /metrics HTTP/1.1\r\n\r\n", &sl->fast[i]);
	sl->fast_done_ms = now_ms();
	pthread_join(t, NULL);
	return NULL;
}

Test(metrics, httpd_closes_a_slow_client_without_blocking_others)
{
	struct slow sl = {.timeout_ms = 500};
	struct server s;

	cr_assert_eq(pipe(sl.ready), 0);
	server_init(&s);
	s.timeout_ms = (uint64_t)sl.timeout_ms;
	sl.port = s.port;
	server_run(&s, slow_client, &sl);
	close(sl.ready[0]);
	close(sl.ready[1]);
	cr_assert_eq(sl.fd_err, 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(sl.fast[i].err, 0);
		cr_assert_eq(sl.fast[i].status, 200);
	}
	/* Closed without an answer, after the timeout, and the others went first. */
	cr_assert_eq(sl.slow_read, 0, "slow client got %ld", sl.slow_read);
	cr_assert_lt(sl.fast_done_ms, sl.closed_ms, "the others waited for the slow client");
	cr_assert_geq(sl.closed_ms - sl.opened_ms, (uint64_t)sl.timeout_ms - 50,
		      "closed after %llu ms",
		      (unsigned long long)(sl.closed_ms - sl.opened_ms));
	cr_assert_lt(sl.closed_ms - sl.opened_ms, 3000, "closed after %llu ms",
		     (unsigned long long)(sl.closed_ms - sl.opened_ms));
	efs_test_assert_no_leaks();
}

#define BIG_SERIES 8
#define BIG_LABEL (1 << 20)

struct reader {
	int port;
	int timeout_ms;
	long got;
	struct response after;
};

/* Asks for a large answer, reads none of it until well after the timeout, then reads it all. */
static void *nonreading_client(void *arg)
{
	struct reader *r = arg;
	int fd, small = 4096;
	char *buf = malloc(BIG_SERIES * (BIG_LABEL + 100));

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	{
		struct sockaddr_in sin = {.sin_family = AF_INET,
					  .sin_port = htons((uint16_t)r->port)};

		sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		r->got = connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 ? -errno : 0;
	}
	if (r->got == 0 && send_all(fd, "GET /metrics HTTP/1.1\r\n\r\n", 25) == 0) {
		usleep((useconds_t)(r->timeout_ms + 300) * 1000);
		r->got = recv_all(fd, buf, BIG_SERIES * (BIG_LABEL + 100));
	}
	close(fd);
	free(buf);
	exchange(r->port, "GET / HTTP/1.1\r\n\r\n", &r->after);
	return NULL;
}

Test(metrics, httpd_cuts_a_client_that_does_not_read_at_the_timeout)
{
	char *labels = malloc(BIG_LABEL + 16);
	struct reader r = {.timeout_ms = 300};
	struct server s;

	server_init(&s);
	memcpy(labels, "v=\"", 3);
	memset(labels + 3, 'a', BIG_LABEL);
	for (int i = 0; i < BIG_SERIES; i++) {
		snprintf(labels + 3 + BIG_LABEL, 16, "%d\"", i);
		cr_assert_not_null(efs_metrics_counter(s.m, "big_total", NULL, labels));
	}
	free(labels);
	s.timeout_ms = (uint64_t)r.timeout_ms;
	r.port = s.port;
	server_run(&s, nonreading_client, &r);
	/* Only what the kernel buffered before the close arrives, not the whole answer. */
	cr_assert(r.got == -ECONNRESET || (r.got > 0 && r.got < BIG_SERIES * BIG_LABEL),
		  "got %ld", r.got);
	cr_assert_eq(r.after.status, 200);
	efs_test_assert_no_leaks();
}

#define CONCURRENT 50
#define SEQ_THREADS 4
#define SEQ_REQUESTS 25

struct many {
	int port;
	struct response *res; /* CONCURRENT + SEQ_THREADS * SEQ_REQUESTS */
};

struct seq_arg {
	struct many *m;
	int base;
};

static void *seq_client(void *arg)
{
	struct seq_arg *a = arg;

	for (int i = 0; i < SEQ_REQUESTS; i++)
		exchange(a->m->port, "GET /metrics HTTP/1.1\r\n\r\n", &a->m->res[a->base + i]);
	return NULL;
}

static void *many_client(void *arg)
{
	struct many *m = arg;
	struct seq_arg sa[SEQ_THREADS];
	pthread_t t[SEQ_THREADS];
	int fds[CONCURRENT];

	for (int i = 0; i < SEQ_THREADS; i++) {
		sa[i].m = m;
		sa[i].base = CONCURRENT + i * SEQ_REQUESTS;
		pthread_create(&t[i], NULL, seq_client, &sa[i]);
	}
	/* Every connection open and its request sent before any answer is read. */
	for (int i = 0; i < CONCURRENT; i++) {
		fds[i] = connect_to(m->port);
		if (fds[i] >= 0)
			send_all(fds[i], "GET /metrics HTTP/1.1\r\n\r\n", 25);
	}
	for (int i = CONCURRENT - 1; i >= 0; i--) {
		if (fds[i] < 0)
			m->res[i].err = fds[i];
		else
			exchange_on(fds[i], "", &m->res[i]);
	}
	for (int i = 0; i < SEQ_THREADS; i++)
		pthread_join(t[i], NULL);
	return NULL;
}

Test(metrics, httpd_serves_many_concurrent_clients)
{
	static struct response res[CONCURRENT + SEQ_THREADS * SEQ_REQUESTS];
	struct many m = {.res = res};
	struct server s;
	char *text;

	server_init(&s);
	text = render(s.m);
	m.port = s.port;
	server_run(&s, many_client, &m);
	for (size_t i = 0; i < sizeof(res) / sizeof(res[0]); i++) {
		cr_assert_eq(res[i].err, 0, "request %zu: %d", i, res[i].err);
		cr_assert_eq(res[i].status, 200, "request %zu", i);
		cr_assert_str_eq(res[i].body, text, "request %zu", i);
	}
	efs_mem_free(text);
	efs_test_assert_no_leaks();
}

struct limit {
	int port;
	int idle_err;
	long refused_read;
	struct response after;
};

static void *limit_client(void *arg)
{
	struct limit *l = arg;
	int fds[EFS_HTTPD_MAX_CONNS];
	char buf[256];
	int fd;

	for (int i = 0; i < EFS_HTTPD_MAX_CONNS; i++) {
		fds[i] = connect_to(l->port);
		if (fds[i] < 0)
			l->idle_err = fds[i];
	}
	/* One over the limit: accepted and closed without an answer. */
	fd = connect_to(l->port);
	if (fd >= 0) {
		send_all(fd, "GET /metrics HTTP/1.1\r\n\r\n", 25);
		l->refused_read = recv_all(fd, buf, sizeof(buf));
		close(fd);
	} else {
		l->refused_read = fd;
	}
	/* Once one idle connection is gone, the server takes a new one. */
	close(fds[0]);
	for (int i = 0; i < 100; i++) {
		exchange(l->port, "GET /metrics HTTP/1.1\r\n\r\n", &l->after);
		if (l->after.err == 0)
			break;
		usleep(20 * 1000);
	}
	for (int i = 1; i < EFS_HTTPD_MAX_CONNS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return NULL;
}

Test(metrics, httpd_refuses_connections_over_the_limit)
{
	struct server s;
	struct limit l = {0};

	server_init(&s);
	l.port = s.port;
	server_run(&s, limit_client, &l);
	cr_assert_eq(l.idle_err, 0);
	cr_assert(l.refused_read == 0 || l.refused_read == -ECONNRESET, "%ld", l.refused_read);
	cr_assert_eq(l.after.err, 0);
	cr_assert_eq(l.after.status, 200);
	efs_test_assert_no_leaks();
}

#define OOM_CLIENTS 10

struct oom {
	int port;
	long read[OOM_CLIENTS];
};

static void *oom_client(void *arg)
{
	struct oom *o = arg;
	int fds[OOM_CLIENTS];
	char buf[64];

	for (int i = 0; i < OOM_CLIENTS; i++) {
		fds[i] = connect_to(o->port);
		if (fds[i] >= 0)
			send_all(fds[i], "GET /metrics HTTP/1.1\r\n\r\n", 25);
	}
	for (int i = 0; i < OOM_CLIENTS; i++) {
		o->read[i] = fds[i] < 0 ? fds[i] : recv_all(fds[i], buf, sizeof(buf));
		if (fds[i] >= 0)
			close(fds[i]);
	}
	return NULL;
}

Test(metrics, httpd_closes_connections_it_has_no_memory_for)
{
	struct efs_metrics *m = registry();
	static struct exact e;
	struct efs_httpd *h;
	struct oom o = {0};
	struct server s;
	uv_loop_t loop;

	/* A failed start leaves nothing on the loop. */
	cr_assert_eq(uv_loop_init(&loop), 0);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_httpd_start(&h, &loop, "127.0.0.1:0", m), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(uv_loop_close(&loop), 0);
	efs_metrics_free(m);

	/* Connections arriving together are all refused, one by one, through the spare handle. */
	server_init(&s);
	o.port = s.port;
	efs_mem_fail_after(0);
	server_run(&s, oom_client, &o);
	efs_mem_fail_reset();
	for (int i = 0; i < OOM_CLIENTS; i++)
		cr_assert(o.read[i] == 0 || o.read[i] == -ECONNRESET, "client %d: %ld", i,
			  o.read[i]);

	/* With memory for the connection but not for the text: 500. */
	server_init(&s);
	e.port = s.port;
	e.req = "GET /metrics HTTP/1.1\r\n\r\n";
	efs_mem_fail_after(1);
	server_run(&s, exact_client, &e);
	efs_mem_fail_reset();
	cr_assert_eq(e.res.err, 0);
	cr_assert_eq(e.res.status, 500, "%s", e.res.head);
	efs_test_assert_no_leaks();
}

struct idle {
	int port;
	int fds[5];
	struct response probe;
};

static void *idle_client(void *arg)
{
	struct idle *i = arg;

	for (int k = 0; k < 5; k++)
		i->fds[k] = connect_to(i->port);
	send_all(i->fds[0], "GET /met", 8);
	/* Connections are accepted in order: once this one is answered, all five are in. */
	exchange(i->port, "GET / HTTP/1.1\r\n\r\n", &i->probe);
	return NULL;
}

Test(metrics, httpd_stop_closes_open_connections)
{
	struct server s;
	struct idle i = {0};
	char buf[16];

	server_init(&s);
	i.port = s.port;
	server_run(&s, idle_client, &i);
	cr_assert_eq(i.probe.status, 200);
	for (int k = 0; k < 5; k++) {
		cr_assert_geq(i.fds[k], 0);
		cr_assert_eq(recv_all(i.fds[k], buf, sizeof(buf)), 0);
		close(i.fds[k]);
	}
	efs_test_assert_no_leaks();
}

Test(metrics, httpd_start_checks_the_address)
{
	static const char *const bad[] = {
		"",           "127.0.0.1",   "1.2.3.4.5:80",  "127.0.0.1:99999", "127.0.0.1:x",
		"127.0.0.1:", "[::1]80",     "::1:80",        "[::1:80",         "host.example:80",
		"127.0.0.1:-1", "127.0.0.1:80x", "[zz]:80",   NULL};
	struct efs_metrics *m = registry();
	struct efs_httpd *h, *h2;
	bool stopped = false;
	uv_loop_t loop;
	char addr[64];

	cr_assert_eq(uv_loop_init(&loop), 0);
	for (size_t i = 0; bad[i]; i++)
		cr_assert_eq(efs_httpd_start(&h, &loop, bad[i], m), -EINVAL, "%s", bad[i]);
	cr_assert_eq(efs_httpd_start(&h, &loop, NULL, m), -EINVAL);
	cr_assert_eq(efs_httpd_start(&h, &loop, ":0", m), 0);
	cr_assert(!strncmp(efs_httpd_address(h), "127.0.0.1:", 10), "%s", efs_httpd_address(h));
	cr_assert_neq(strcmp(efs_httpd_address(h), "127.0.0.1:0"), 0);
	snprintf(addr, sizeof(addr), "%s", efs_httpd_address(h));
	cr_assert_eq(efs_httpd_start(&h2, &loop, addr, m), -EADDRINUSE);
	cr_assert_eq(efs_httpd_start(&h2, &loop, "192.0.2.1:0", m), -EADDRNOTAVAIL);
	efs_httpd_stop(h, server_stopped, &stopped);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert(stopped);
	cr_assert_eq(efs_httpd_start(&h, &loop, "localhost:0", m), 0);
	cr_assert(!strncmp(efs_httpd_address(h), "127.0.0.1:", 10));
	stopped = false;
	efs_httpd_stop(h, server_stopped, &stopped);
	uv_run(&loop, UV_RUN_DEFAULT);
	cr_assert(stopped);
	/* IPv6 loopback may be missing in a container; its parse must not be. */
	int r = efs_httpd_start(&h, &loop, "[::1]:0", m);
	cr_assert(r == 0 || r == -EADDRNOTAVAIL || r == -EAFNOSUPPORT, "%d", r);
	if (r == 0) {
		cr_assert(!strncmp(efs_httpd_address(h), "[::1]:", 6), "%s",
			  efs_httpd_address(h));
		stopped = false;
		efs_httpd_stop(h, server_stopped, &stopped);
		uv_run(&loop, UV_RUN_DEFAULT);
		cr_assert(stopped);
	}
	cr_assert_eq(uv_loop_close(&loop), 0);
	efs_metrics_free(m);
	efs_test_assert_no_leaks();
}
