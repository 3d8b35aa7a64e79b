/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Prometheus metrics: counters, gauges and latency histograms registered
 * once at start and rendered as Prometheus text exposition format 0.0.4 on
 * demand.
 *
 * Threads: registration, rendering and gauges belong to the loop thread
 * (plain stores, no locks). Counters and histograms may be updated from any
 * thread (device-I/O workers included): efs_counter_add and
 * efs_histogram_observe_ns are relaxed atomic adds, and a render reads each
 * value with a relaxed load, so it sees every update that happened before
 * the render, in no particular order across values. A histogram rendered
 * while observers run stays self-consistent (its _count is the total of the
 * buckets as read), though its _sum may include an observation its buckets
 * do not yet show, or miss one they do.
 *
 * A metric is a family name plus an optional label set written as
 * Prometheus label text, e.g. efs_metrics_counter(m, "etcfs_fuse_ops_total",
 * "FUSE requests by operation", "op=\"lookup\""). Registering the same name
 * and labels twice returns the same metric (the first help text stays);
 * every label set of one family renders under the family's single # HELP
 * and # TYPE lines. Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; the label
 * text (NULL or "" for none) is copied verbatim and must be
 * name="value"[,name="value"...] with label names [a-zA-Z_][a-zA-Z0-9_]*
 * and values already escaped (\\, \" and \n only); a histogram may not use
 * the label "le". Registration returns NULL only on ENOMEM, an invalid name
 * or label text, or a name already registered with another type; every
 * update function accepts NULL (a no-op), so a failed registration never
 * crashes a hot path.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct efs_metrics;
struct efs_counter;
struct efs_gauge;
struct efs_histogram;

/* Gauge read at render time, on the loop thread. */
typedef double (*efs_gauge_fn)(void *arg);

/* A new, empty registry. -ENOMEM. */
int efs_metrics_new(struct efs_metrics **ret);
/* Frees every metric of |m|. Accepts NULL; returns NULL. */
struct efs_metrics *efs_metrics_free(struct efs_metrics *m);

/* Predicates behind registration's validation, for callers building names. */
bool efs_metrics_name_is_valid(const char *name);
bool efs_metrics_labels_are_valid(const char *labels, bool histogram);

/* A monotonically increasing count; the value renders as an integer. */
struct efs_counter *efs_metrics_counter(struct efs_metrics *m, const char *name,
					const char *help, const char *labels);
/* Adds |v| to |c|: one relaxed atomic add, callable from any thread. */
void efs_counter_add(struct efs_counter *c, uint64_t v);
static inline void efs_counter_inc(struct efs_counter *c) { efs_counter_add(c, 1); }
/* The current value of |c| (0 for NULL). Any thread. */
uint64_t efs_counter_get(const struct efs_counter *c);

/* A gauge the caller sets (loop thread only). */
struct efs_gauge *efs_metrics_gauge(struct efs_metrics *m, const char *name, const char *help,
				    const char *labels);
/*
 * A gauge whose value comes from |fn(arg)| at each render (and each
 * efs_gauge_get); |fn| must not be NULL. Registering the same name and
 * labels again returns the same gauge only with the same |fn| and |arg|
 * (NULL otherwise, as for a set gauge registered under those labels).
 * efs_gauge_set and efs_gauge_add do nothing to such a gauge.
 */
struct efs_gauge *efs_metrics_gauge_fn(struct efs_metrics *m, const char *name, const char *help,
				       const char *labels, efs_gauge_fn fn, void *arg);
void efs_gauge_set(struct efs_gauge *g, double v);
void efs_gauge_add(struct efs_gauge *g, double v);
/* The value of |g| (0 for NULL). */
double efs_gauge_get(const struct efs_gauge *g);

/*
 * A latency histogram in seconds with 19 fixed buckets in a 1-2-5 series
 * from 10 µs to 10 s (le="1e-05", "2e-05", "5e-05", "0.0001", ..., "5",
 * "10", then "+Inf"), observed in nanoseconds; bounds are inclusive (an
 * observation of exactly 10 µs counts in le="1e-05"). _sum renders in
 * seconds with nanosecond precision. Observed from any thread; registered
 * on the loop thread.
 */
struct efs_histogram *efs_metrics_histogram(struct efs_metrics *m, const char *name,
					    const char *help, const char *labels);
void efs_histogram_observe_ns(struct efs_histogram *h, uint64_t ns);
/*
 * A histogram of counts (batch sizes and the like) with the same 19
 * bounds as plain numbers, 1 to 1000000 (le="1", "2", "5", ..., "1000000",
 * then "+Inf"); _sum renders as an integer. Observed with
 * efs_histogram_observe only. Registering the name with
 * efs_metrics_histogram first gives a latency histogram.
 */
struct efs_histogram *efs_metrics_histogram_counts(struct efs_metrics *m, const char *name,
						   const char *help, const char *labels);
void efs_histogram_observe(struct efs_histogram *h, uint64_t v);
uint64_t efs_histogram_count(const struct efs_histogram *h);

/*
 * Renders every metric, families in registration order with one # HELP
 * (omitted when the help text was NULL or empty) and one # TYPE line each,
 * label sets in registration order, into a new efs_mem buffer (*ret,
 * NUL-terminated, *ret_len bytes without the NUL). Gauge values use the
 * shortest of %.15g/%.17g that reads back exactly, and NaN, +Inf, -Inf.
 * -ENOMEM. Loop thread.
 */
int efs_metrics_render(const struct efs_metrics *m, char **ret, size_t *ret_len);
