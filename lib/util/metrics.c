/* SPDX-License-Identifier: Apache-2.0 */
#include "util/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/list.h"
#include "util/mem.h"

enum metric_type {
	TYPE_COUNTER,
	TYPE_GAUGE,
	TYPE_HISTOGRAM,
};

static const char *const type_names[] = {
	[TYPE_COUNTER] = "counter",
	[TYPE_GAUGE] = "gauge",
	[TYPE_HISTOGRAM] = "histogram",
};

/*
 * Upper bounds of the histogram buckets, inclusive as Prometheus wants
 * (le), in nanoseconds, and the same bounds as rendered in seconds. A 1-2-5
 * series keeps the rendered text readable.
 */
#define NBOUNDS 19
static const uint64_t bounds_ns[NBOUNDS] = {
	10000ULL,     20000ULL,     50000ULL,     100000ULL,     200000ULL,
	500000ULL,    1000000ULL,   2000000ULL,   5000000ULL,    10000000ULL,
	20000000ULL,  50000000ULL,  100000000ULL, 200000000ULL,  500000000ULL,
	1000000000ULL, 2000000000ULL, 5000000000ULL, 10000000000ULL,
};
static const char *const bounds_text[NBOUNDS] = {
	"1e-05", "2e-05", "5e-05", "0.0001", "0.0002", "0.0005", "0.001",
	"0.002", "0.005", "0.01",  "0.02",   "0.05",   "0.1",    "0.2",
	"0.5",   "1",     "2",     "5",      "10",
};
/* A count histogram's bounds are the latency bounds over COUNT_SCALE: the
 * same 1-2-5 series from 1 to 1000000. */
#define COUNT_SCALE 10000ULL
static const char *const count_bounds_text[NBOUNDS] = {
	"1",	"2",	"5",	"10",	 "20",	  "50",	   "100",    "200",   "500",	"1000",
	"2000", "5000", "10000", "20000", "50000", "100000", "200000", "500000", "1000000",
};

/* The part every metric shares: its label text and its place in a family. */
struct metric {
	struct efs_list link; /* in its family's metrics */
	char *labels; /* "" for none */
};

struct efs_counter {
	struct metric base;
	/* Relaxed atomic: any thread adds, the loop thread renders. */
	_Atomic uint64_t value;
};

struct efs_gauge {
	struct metric base;
	double value;   /* loop thread only; unused when fn is set */
	efs_gauge_fn fn; /* NULL for a gauge that is set */
	void *arg;
};

struct efs_histogram {
	struct metric base;
	/* Observed from any thread (relaxed atomics): buckets[i] counts
	 * observations in (bound i-1, bound i]. */
	_Atomic uint64_t buckets[NBOUNDS + 1];
	_Atomic uint64_t count;
	_Atomic uint64_t sum_ns; /* a count histogram's sum of values */
	bool counts; /* set at registration: counts, not nanoseconds */
};

/* Families and their metrics render in the order they were registered. */
struct family {
	struct efs_list link; /* in the registry's families */
	char *name;
	char *help; /* NULL for none */
	enum metric_type type;
	struct efs_list metrics;
};

struct efs_metrics {
	struct efs_list families;
};

#define family_of(n) efs_list_entry(n, struct family, link)
#define metric_of(n) efs_list_entry(n, struct metric, link)

int efs_metrics_new(struct efs_metrics **ret)
{
	struct efs_metrics *m = efs_mem_calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	efs_list_init(&m->families);
	*ret = m;
	return 0;
}

static void metric_free(struct metric *x)
{
	efs_mem_free(x->labels);
	efs_mem_free(x);
}

static void family_free(struct family *f)
{
	struct efs_list *n;

	while ((n = efs_list_pop(&f->metrics)))
		metric_free(metric_of(n));
	efs_mem_free(f->name);
	efs_mem_free(f->help);
	efs_mem_free(f);
}

struct efs_metrics *efs_metrics_free(struct efs_metrics *m)
{
	struct efs_list *n;

	if (!m)
		return NULL;
	while ((n = efs_list_pop(&m->families)))
		family_free(family_of(n));
	efs_mem_free(m);
	return NULL;
}

bool efs_metrics_name_is_valid(const char *name)
{
	const char *p;

	if (!name || !*name)
		return false;
	for (p = name; *p; p++) {
		bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
			     *p == ':';

		if (!alpha && (p == name || !(*p >= '0' && *p <= '9')))
			return false;
	}
	return true;
}

/*
 * Label text must be name="value" pairs separated by commas, names matching
 * [a-zA-Z_][a-zA-Z0-9_]* and values escaped as the text format wants (\\,
 * \" and \n only), so that whatever a caller passes renders as valid text.
 * A histogram's own labels may not use "le", which it adds itself.
 */
bool efs_metrics_labels_are_valid(const char *labels, bool histogram)
{
	const char *p = labels, *start;

	if (!p || !*p)
		return true;
	for (;;) {
		start = p;
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_'))
			return false;
		while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
		       (*p >= '0' && *p <= '9'))
			p++;
		if (histogram && p - start == 2 && !strncmp(start, "le", 2))
			return false;
		if (*p++ != '=' || *p++ != '"')
			return false;
		while (*p != '"') {
			if (*p == '\0' || *p == '\n')
				return false;
			if (*p == '\\') {
				p++;
				if (*p != '\\' && *p != '"' && *p != 'n')
					return false;
			}
			p++;
		}
		p++;
		if (*p == '\0')
			return true;
		if (*p++ != ',')
			return false;
	}
}

/*
 * Finds or makes the family |name| of |type| and looks up |labels| in it.
 * Returns the family (NULL when |name| is invalid, registered with another
 * type, or on ENOMEM) and sets *|ret_found| to the existing metric, if any,
 * and *|ret_created| when the family is new (the caller frees it if it then
 * fails to add a metric).
 */
static struct family *family_get(struct efs_metrics *m, const char *name, const char *help,
				 enum metric_type type, const char *labels,
				 struct metric **ret_found, bool *ret_created)
{
	struct efs_list *n, *k;
	struct family *f;

	*ret_found = NULL;
	*ret_created = false;
	if (!m || !efs_metrics_name_is_valid(name) ||
	    !efs_metrics_labels_are_valid(labels, type == TYPE_HISTOGRAM))
		return NULL;
	efs_list_for_each(n, &m->families) {
		f = family_of(n);
		if (strcmp(f->name, name))
			continue;
		if (f->type != type)
			return NULL;
		efs_list_for_each(k, &f->metrics) {
			if (!strcmp(metric_of(k)->labels, labels ? labels : "")) {
				*ret_found = metric_of(k);
				break;
			}
		}
		return f;
	}
	f = efs_mem_calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	efs_list_init(&f->metrics);
	f->name = efs_mem_strdup(name);
	if (!f->name)
		goto out_free;
	if (help && *help) {
		f->help = efs_mem_strdup(help);
		if (!f->help)
			goto out_free;
	}
	f->type = type;
	*ret_created = true;
	return f;

out_free:
	family_free(f);
	return NULL;
}

/* Links |x| (allocated by the caller, labels unset) into |f|, or frees both on ENOMEM. */
static struct metric *family_add(struct efs_metrics *m, struct family *f, bool created,
				 struct metric *x, const char *labels)
{
	if (x)
		x->labels = efs_mem_strdup(labels ? labels : "");
	if (!x || !x->labels) {
		efs_mem_free(x);
		if (created)
			family_free(f);
		return NULL;
	}
	efs_list_add_tail(&f->metrics, &x->link);
	if (created)
		efs_list_add_tail(&m->families, &f->link);
	return x;
}

/*
 * The |type| metric |name| with |labels|: the registered one, else a new
 * zeroed one of |size| bytes (a struct that starts with struct metric).
 * NULL for an invalid name or labels, a name registered with another type,
 * or -ENOMEM.
 */
static struct metric *metric_get(struct efs_metrics *m, const char *name, const char *help,
				 enum metric_type type, const char *labels, size_t size)
{
	struct metric *found;
	struct family *f;
	bool created;

	f = family_get(m, name, help, type, labels, &found, &created);
	if (!f || found)
		return found;
	return family_add(m, f, created, efs_mem_calloc(1, size), labels);
}

struct efs_counter *efs_metrics_counter(struct efs_metrics *m, const char *name,
					const char *help, const char *labels)
{
	return (struct efs_counter *)metric_get(m, name, help, TYPE_COUNTER, labels,
						sizeof(struct efs_counter));
}

void efs_counter_add(struct efs_counter *c, uint64_t v)
{
	if (c)
		atomic_fetch_add_explicit(&c->value, v, memory_order_relaxed);
}

uint64_t efs_counter_get(const struct efs_counter *c)
{
	return c ? atomic_load_explicit(&((struct efs_counter *)c)->value, memory_order_relaxed)
		 : 0;
}

static struct efs_gauge *gauge_get(struct efs_metrics *m, const char *name, const char *help,
				   const char *labels, efs_gauge_fn fn, void *arg)
{
	struct efs_gauge *g;
	struct metric *found;
	struct family *f;
	bool created;

	f = family_get(m, name, help, TYPE_GAUGE, labels, &found, &created);
	if (!f)
		return NULL;
	if (found) {
		g = (struct efs_gauge *)found;
		return g->fn == fn && g->arg == arg ? g : NULL;
	}
	g = efs_mem_calloc(1, sizeof(*g));
	if (g) {
		g->fn = fn;
		g->arg = arg;
	}
	return (struct efs_gauge *)family_add(m, f, created, g ? &g->base : NULL, labels);
}

struct efs_gauge *efs_metrics_gauge(struct efs_metrics *m, const char *name, const char *help,
				    const char *labels)
{
	return gauge_get(m, name, help, labels, NULL, NULL);
}

struct efs_gauge *efs_metrics_gauge_fn(struct efs_metrics *m, const char *name, const char *help,
				       const char *labels, efs_gauge_fn fn, void *arg)
{
	if (!fn)
		return NULL;
	return gauge_get(m, name, help, labels, fn, arg);
}

void efs_gauge_set(struct efs_gauge *g, double v)
{
	if (g)
		g->value = v;
}

void efs_gauge_add(struct efs_gauge *g, double v)
{
	if (g)
		g->value += v;
}

double efs_gauge_get(const struct efs_gauge *g)
{
	if (!g)
		return 0;
	return g->fn ? g->fn(g->arg) : g->value;
}

struct efs_histogram *efs_metrics_histogram(struct efs_metrics *m, const char *name,
					    const char *help, const char *labels)
{
	return (struct efs_histogram *)metric_get(m, name, help, TYPE_HISTOGRAM, labels,
						  sizeof(struct efs_histogram));
}

struct efs_histogram *efs_metrics_histogram_counts(struct efs_metrics *m, const char *name,
						   const char *help, const char *labels)
{
	struct efs_histogram *h = efs_metrics_histogram(m, name, help, labels);

	if (h)
		h->counts = true;
	return h;
}

/* Counts |v| in the bucket of |key| (in nanoseconds' scale). */
static void observe(struct efs_histogram *h, uint64_t key, uint64_t v)
{
	unsigned lo = 0, hi = NBOUNDS;

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if (key <= bounds_ns[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	atomic_fetch_add_explicit(&h->buckets[lo], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, v, memory_order_relaxed);
}

void efs_histogram_observe_ns(struct efs_histogram *h, uint64_t ns)
{
	if (h)
		observe(h, ns, ns);
}

void efs_histogram_observe(struct efs_histogram *h, uint64_t v)
{
	if (h)
		observe(h, v > UINT64_MAX / COUNT_SCALE ? UINT64_MAX : v * COUNT_SCALE, v);
}

uint64_t efs_histogram_count(const struct efs_histogram *h)
{
	return h ? atomic_load_explicit(&((struct efs_histogram *)h)->count, memory_order_relaxed)
		 : 0;
}

/* A growing render buffer; |err| sticks once an allocation failed. */
struct buf {
	char *p;
	size_t len, cap;
	int err;
};

static bool buf_reserve(struct buf *b, size_t n)
{
	size_t cap;
	char *p;

	if (b->err)
		return false;
	if (b->len + n + 1 <= b->cap)
		return true;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + n + 1)
		cap *= 2;
	p = efs_mem_realloc(b->p, cap);
	if (!p) {
		b->err = -ENOMEM;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

static void buf_put(struct buf *b, const char *s, size_t n)
{
	if (!buf_reserve(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void buf_puts(struct buf *b, const char *s)
{
	buf_put(b, s, strlen(s));
}

/* Help text escapes backslash and newline. */
static void buf_put_help(struct buf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\')
			buf_put(b, "\\\\", 2);
		else if (*s == '\n')
			buf_put(b, "\\n", 2);
		else
			buf_put(b, s, 1);
	}
}

/* Decimal digits by hand: a render writes tens of thousands of them. */
static void buf_put_u64(struct buf *b, uint64_t v)
{
	char tmp[20];
	size_t i = sizeof(tmp);

	do {
		tmp[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	buf_put(b, tmp + i, sizeof(tmp) - i);
}

/* Writes ".ddddddddd" for |ns| < 1e9. */
static void buf_put_frac9(struct buf *b, uint64_t ns)
{
	char tmp[10];

	tmp[0] = '.';
	for (int i = 9; i >= 1; i--) {
		tmp[i] = (char)('0' + ns % 10);
		ns /= 10;
	}
	buf_put(b, tmp, sizeof(tmp));
}

/* Shortest of %.15g and %.17g that reads back as |v|; Prometheus spells the specials. */
static void buf_put_double(struct buf *b, double v)
{
	char tmp[32];
	int n;

	if (isnan(v)) {
		buf_puts(b, "NaN");
		return;
	}
	if (isinf(v)) {
		buf_puts(b, v > 0 ? "+Inf" : "-Inf");
		return;
	}
	n = snprintf(tmp, sizeof(tmp), "%.15g", v);
	if (strtod(tmp, NULL) != v)
		n = snprintf(tmp, sizeof(tmp), "%.17g", v);
	buf_put(b, tmp, (size_t)n);
}

/*
 * Writes "name|suffix|{labels} " or, with |le|, "name|suffix|{labels,le="|le|"} ".
 */
static void buf_put_series(struct buf *b, const struct family *f, const char *suffix,
			   const struct metric *x, const char *le)
{
	buf_puts(b, f->name);
	buf_puts(b, suffix);
	if (!*x->labels && !le) {
		buf_put(b, " ", 1);
		return;
	}
	buf_put(b, "{", 1);
	buf_puts(b, x->labels);
	if (le) {
		if (*x->labels)
			buf_put(b, ",", 1);
		buf_put(b, "le=\"", 4);
		buf_puts(b, le);
		buf_put(b, "\"", 1);
	}
	buf_put(b, "} ", 2);
}

static void render_histogram(struct buf *b, const struct family *f,
			     const struct efs_histogram *h)
{
	struct efs_histogram *w = (struct efs_histogram *)h;
	uint64_t cum = 0, sum = atomic_load_explicit(&w->sum_ns, memory_order_relaxed);

	/* Observers may run meanwhile: the count is the buckets' total as
	 * read, so the series stay consistent (+Inf == _count >= every
	 * bucket). */
	for (unsigned i = 0; i < NBOUNDS; i++) {
		cum += atomic_load_explicit(&w->buckets[i], memory_order_relaxed);
		buf_put_series(b, f, "_bucket", &h->base,
			       h->counts ? count_bounds_text[i] : bounds_text[i]);
		buf_put_u64(b, cum);
		buf_put(b, "\n", 1);
	}
	cum += atomic_load_explicit(&w->buckets[NBOUNDS], memory_order_relaxed);
	buf_put_series(b, f, "_bucket", &h->base, "+Inf");
	buf_put_u64(b, cum);
	buf_put(b, "\n", 1);
	/* The sum in seconds, exactly: whole seconds, then nine decimals. */
	buf_put_series(b, f, "_sum", &h->base, NULL);
	if (h->counts) {
		buf_put_u64(b, sum);
	} else {
		buf_put_u64(b, sum / UINT64_C(1000000000));
		buf_put_frac9(b, sum % UINT64_C(1000000000));
	}
	buf_put(b, "\n", 1);
	buf_put_series(b, f, "_count", &h->base, NULL);
	buf_put_u64(b, cum);
	buf_put(b, "\n", 1);
}

/* Appends family |f|'s # HELP and # TYPE lines and every metric of it. */
static void render_family(struct buf *b, const struct family *f)
{
	const struct efs_list *k;

	if (f->help) {
		buf_puts(b, "# HELP ");
		buf_puts(b, f->name);
		buf_put(b, " ", 1);
		buf_put_help(b, f->help);
		buf_put(b, "\n", 1);
	}
	buf_puts(b, "# TYPE ");
	buf_puts(b, f->name);
	buf_put(b, " ", 1);
	buf_puts(b, type_names[f->type]);
	buf_put(b, "\n", 1);
	efs_list_for_each(k, &f->metrics) {
		const struct metric *x = metric_of(k);

		switch (f->type) {
		case TYPE_COUNTER:
			buf_put_series(b, f, "", x, NULL);
			buf_put_u64(b, efs_counter_get((const struct efs_counter *)x));
			break;
		case TYPE_GAUGE:
			buf_put_series(b, f, "", x, NULL);
			buf_put_double(b, efs_gauge_get((const struct efs_gauge *)x));
			break;
		case TYPE_HISTOGRAM:
			render_histogram(b, f, (const struct efs_histogram *)x);
			continue;
		}
		buf_put(b, "\n", 1);
	}
}

int efs_metrics_render(const struct efs_metrics *m, char **ret, size_t *ret_len)
{
	struct buf b = { 0 };
	const struct efs_list *n;

	/* Even an empty registry renders as an empty, NUL-terminated text. */
	if (buf_reserve(&b, 0))
		b.p[0] = '\0';
	if (m)
		efs_list_for_each(n, &m->families)
			render_family(&b, family_of(n));
	if (b.err) {
		efs_mem_free(b.p);
		return b.err;
	}
	*ret = b.p;
	*ret_len = b.len;
	return 0;
}
