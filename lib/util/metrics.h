/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Prometheus metrics: counters, gauges and latency histograms registered
 * once at start, updated on the loop thread (plain integer stores, no
 * locks: every metric of one registry is touched by one thread, except
 * counters marked atomic, which worker threads may add to), and rendered as
 * Prometheus text exposition format 0.0.4 on demand.
 *
 * A metric is a family name plus an optional label set written as
 * Prometheus label text, e.g. efs_metrics_counter(m, "etcfs_fuse_ops_total",
 * "FUSE requests by operation", "op=\"lookup\""). Registering the same name
 * and labels twice returns the same metric. Names must match
 * [a-zA-Z_:][a-zA-Z0-9_:]*; the label text is copied verbatim (callers pass
 * constant, already-escaped text). Registration returns NULL only on ENOMEM
 * or an invalid name; every update function accepts NULL (a no-op), so a
 * failed registration never crashes a hot path.
 */

#include <stddef.h>
#include <stdint.h>

struct efs_metrics;
struct efs_counter;
struct efs_gauge;
struct efs_histogram;

/* Gauge read at render time. */
typedef double (*efs_gauge_fn)(void *arg);

int efs_metrics_new(struct efs_metrics **ret);
/* Frees every metric of |m|. Accepts NULL; returns NULL. */
struct efs_metrics *efs_metrics_free(struct efs_metrics *m);

struct efs_counter *efs_metrics_counter(struct efs_metrics *m, const char *name,
					const char *help, const char *labels);
void efs_counter_add(struct efs_counter *c, uint64_t v);
static inline void efs_counter_inc(struct efs_counter *c) { efs_counter_add(c, 1); }
uint64_t efs_counter_get(const struct efs_counter *c);

struct efs_gauge *efs_metrics_gauge(struct efs_metrics *m, const char *name, const char *help,
				    const char *labels);
/* A gauge whose value comes from |fn(arg)| at each render. */
struct efs_gauge *efs_metrics_gauge_fn(struct efs_metrics *m, const char *name, const char *help,
				       const char *labels, efs_gauge_fn fn, void *arg);
void efs_gauge_set(struct efs_gauge *g, double v);
void efs_gauge_add(struct efs_gauge *g, double v);
double efs_gauge_get(const struct efs_gauge *g);

/*
 * A latency histogram in seconds with fixed exponential buckets from 10 µs
 * to about 10 s (le="1e-05", ..., "+Inf"), observed in nanoseconds.
 */
struct efs_histogram *efs_metrics_histogram(struct efs_metrics *m, const char *name,
					    const char *help, const char *labels);
void efs_histogram_observe_ns(struct efs_histogram *h, uint64_t ns);
uint64_t efs_histogram_count(const struct efs_histogram *h);

/*
 * Renders every metric, families in registration order with one # HELP and
 * # TYPE line each, into a new efs_mem buffer (*ret, NUL-terminated,
 * *ret_len bytes without the NUL). -ENOMEM.
 */
int efs_metrics_render(const struct efs_metrics *m, char **ret, size_t *ret_len);
