/* SPDX-License-Identifier: Apache-2.0 */
/* The freed-block quarantine of lib/space/quarantine.h. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "space/quarantine.h"
#include "util/mem.h"

TestSuite(quarantine, .fini = efs_mem_fail_reset, .timeout = 60);

/* What efs_quar_release handed out, in order. */
struct got {
	size_t n, cap;
	struct {
		uint32_t group;
		uint64_t start, len;
	} *v;
};

static void collect(uint32_t group, uint64_t start, uint64_t len, void *arg)
{
	struct got *g = arg;

	if (g->n == g->cap) {
		g->cap = g->cap ? 2 * g->cap : 64;
		g->v = realloc(g->v, g->cap * sizeof(*g->v));
		cr_assert(g->v);
	}
	g->v[g->n].group = group;
	g->v[g->n].start = start;
	g->v[g->n].len = len;
	g->n++;
}

/* Releases and expects exactly the runs starting at |starts| (group 7, len 1). */
static void expect_release(struct efs_quarantine *q, const uint64_t *starts, size_t n)
{
	struct got g = {0};

	cr_assert_eq(efs_quar_release(q, collect, &g), n);
	cr_assert_eq(g.n, n);
	for (size_t i = 0; i < n; i++)
		cr_assert(g.v[i].group == 7 && g.v[i].start == starts[i] && g.v[i].len == 1,
			  "release %zu: group %u start %llu, expected start %llu", i, g.v[i].group,
			  (unsigned long long)g.v[i].start, (unsigned long long)starts[i]);
	free(g.v);
}

static struct efs_quarantine *make(void)
{
	struct efs_quarantine *q = NULL;

	cr_assert_eq(efs_quar_new(&q), 0);
	cr_assert_not_null(q);
	return q;
}

Test(quarantine, a_run_waits_for_reads_begun_before_it_only)
{
	struct efs_quarantine *q = make();
	uint64_t before, after;
	static const uint64_t a[] = {100};

	before = efs_quar_read_begin(q);
	cr_assert_eq(efs_quar_add(q, 7, 100, 1), 0);
	after = efs_quar_read_begin(q);
	cr_assert_gt(after, before);
	cr_assert_eq(efs_quar_reads(q), 2);
	cr_assert_eq(efs_quar_blocks(q), 1);
	expect_release(q, NULL, 0);
	efs_quar_read_end(q, after);
	expect_release(q, NULL, 0);
	efs_quar_read_end(q, before);
	expect_release(q, a, 1);
	cr_assert_eq(efs_quar_reads(q), 0);
	cr_assert_eq(efs_quar_blocks(q), 0);
	expect_release(q, NULL, 0);
	q = efs_quar_free(q);
	cr_assert_null(q);
	cr_assert_null(efs_quar_free(NULL));
	efs_test_assert_no_leaks();
}

Test(quarantine, with_no_read_in_flight_a_run_is_released_at_once)
{
	struct efs_quarantine *q = make();
	struct got g = {0};
	uint64_t t;

	cr_assert_eq(efs_quar_add(q, 3, 40, 8), 0);
	cr_assert_eq(efs_quar_add(q, 4, 50, 2), 0);
	cr_assert_eq(efs_quar_blocks(q), 10);
	/* A read begun after the adds does not hold them. */
	t = efs_quar_read_begin(q);
	cr_assert_eq(efs_quar_release(q, collect, &g), 2);
	cr_assert_eq(g.n, 2);
	cr_assert(g.v[0].group == 3 && g.v[0].start == 40 && g.v[0].len == 8);
	cr_assert(g.v[1].group == 4 && g.v[1].start == 50 && g.v[1].len == 2);
	cr_assert_eq(efs_quar_blocks(q), 0);
	efs_quar_read_end(q, t);
	free(g.v);
	/* Left in the quarantine: freed with it. */
	t = efs_quar_read_begin(q);
	cr_assert_eq(efs_quar_add(q, 3, 60, 1), 0);
	efs_quar_free(q);
	efs_test_assert_no_leaks();
}

Test(quarantine, reads_ending_out_of_order_release_runs_in_order)
{
	struct efs_quarantine *q = make();
	uint64_t t1, t1b, t2, t3;
	static const uint64_t a[] = {1}, bc[] = {2, 3};

	t1 = efs_quar_read_begin(q);
	t1b = efs_quar_read_begin(q);
	cr_assert_eq(t1, t1b, "no add in between: the same epoch");
	cr_assert_eq(efs_quar_add(q, 7, 1, 1), 0);
	t2 = efs_quar_read_begin(q);
	cr_assert_eq(efs_quar_add(q, 7, 2, 1), 0);
	t3 = efs_quar_read_begin(q);
	cr_assert_eq(efs_quar_add(q, 7, 3, 1), 0);
	cr_assert_eq(efs_quar_reads(q), 4);
	efs_quar_read_end(q, t3);
	efs_quar_read_end(q, t1);
	expect_release(q, NULL, 0);
	efs_quar_read_end(q, t1b);
	expect_release(q, a, 1);
	efs_quar_read_end(q, t2);
	expect_release(q, bc, 2);
	cr_assert_eq(efs_quar_reads(q), 0);
	cr_assert_eq(efs_quar_blocks(q), 0);
	efs_quar_free(q);
	efs_test_assert_no_leaks();
}

/* A callback that adds to the quarantine while it is being released. */
struct readd {
	struct efs_quarantine *q;
	size_t calls;
};

static void readd_cb(uint32_t group, uint64_t start, uint64_t len, void *arg)
{
	struct readd *r = arg;

	r->calls++;
	if (start < 1000)
		cr_assert_eq(efs_quar_add(r->q, group, start + 1000, len), 0);
}

Test(quarantine, many_epochs_and_thousands_of_reads_stay_cheap)
{
	struct efs_quarantine *q = make();
	enum { N = 20000 };
	uint64_t *tickets = malloc(N * sizeof(*tickets));
	struct got g = {0};
	struct readd r;

	cr_assert(tickets);
	/* A read and a run per epoch, the oldest read outliving them all. */
	for (size_t i = 0; i < N; i++) {
		tickets[i] = efs_quar_read_begin(q);
		if (i > 0)
			cr_assert_gt(tickets[i], tickets[i - 1]);
		cr_assert_eq(efs_quar_add(q, 7, i, 1), 0);
	}
	cr_assert_eq(efs_quar_reads(q), N);
	cr_assert_eq(efs_quar_blocks(q), N);
	/* The newest reads end first: nothing moves until the oldest ends. */
	for (size_t i = N - 1; i >= 1; i--)
		efs_quar_read_end(q, tickets[i]);
	cr_assert_eq(efs_quar_release(q, collect, &g), 0);
	efs_quar_read_end(q, tickets[0]);
	cr_assert_eq(efs_quar_release(q, collect, &g), N);
	for (size_t i = 0; i < N; i++)
		cr_assert_eq(g.v[i].start, i);
	/* Then the oldest ends first each time: one run at a time. */
	for (size_t i = 0; i < N; i++) {
		tickets[i] = efs_quar_read_begin(q);
		cr_assert_eq(efs_quar_add(q, 7, i, 1), 0);
	}
	for (size_t i = 0; i < N; i++) {
		efs_quar_read_end(q, tickets[i]);
		cr_assert_eq(efs_quar_release(q, collect, &g), 1);
		cr_assert_eq(g.v[g.n - 1].start, i);
	}
	cr_assert_eq(efs_quar_reads(q), 0);
	/* A callback may add: the new runs wait their turn, in order. */
	for (size_t i = 0; i < 100; i++)
		cr_assert_eq(efs_quar_add(q, 7, i, 1), 0);
	r.q = q;
	r.calls = 0;
	cr_assert_eq(efs_quar_release(q, readd_cb, &r), 200);
	cr_assert_eq(r.calls, 200);
	cr_assert_eq(efs_quar_blocks(q), 0);
	free(g.v);
	free(tickets);
	efs_quar_free(q);
	efs_test_assert_no_leaks();
}

Test(quarantine, out_of_memory_changes_nothing_and_reads_never_allocate)
{
	struct efs_quarantine *q = NULL;
	uint64_t t[64];
	static const uint64_t last[] = {99};
	size_t n;
	long i;

	efs_mem_fail_after(0);
	cr_assert_eq(efs_quar_new(&q), -ENOMEM);
	cr_assert_null(q);
	efs_mem_fail_reset();
	for (i = 1; efs_mem_fail_after(i), efs_quar_new(&q) == -ENOMEM; i++)
		cr_assert_lt(i, 10);
	efs_mem_fail_reset();
	/* Fail every allocation: adds succeed while their rings have room. */
	efs_mem_fail_after(0);
	for (n = 0; n < 64; n++) {
		t[n] = efs_quar_read_begin(q);
		if (efs_quar_add(q, 7, n, 1) < 0)
			break;
	}
	cr_assert_lt(n, 64, "the rings never grew");
	cr_assert_eq(efs_quar_add(q, 7, 99, 1), -ENOMEM);
	cr_assert_eq(efs_quar_blocks(q), n);
	/* Reads need no memory, whatever the epoch did. */
	for (size_t k = n + 1; k < 64; k++)
		t[k] = efs_quar_read_begin(q);
	cr_assert_eq(efs_quar_reads(q), 64);
	for (size_t k = 0; k < 64; k++)
		efs_quar_read_end(q, t[k]);
	efs_mem_fail_reset();
	{
		struct got g = {0};

		cr_assert_eq(efs_quar_release(q, collect, &g), n);
		for (size_t k = 0; k < n; k++)
			cr_assert_eq(g.v[k].start, k);
		free(g.v);
	}
	cr_assert_eq(efs_quar_add(q, 7, 99, 1), 0);
	expect_release(q, last, 1);
	efs_quar_free(q);
	efs_test_assert_no_leaks();
}

/*
 * Against a model: each run remembers the reads in flight when it was
 * added and is releasable once they have all ended; every release hands
 * out exactly the releasable runs, oldest first.
 */
Test(quarantine, random_sequences_match_a_model)
{
	enum { READS = 4096, RUNS = 4096 };
	uint64_t seed = 0x9a11ull + (uint64_t)getpid();
	uint64_t st = seed * 0x9e3779b97f4a7c15ull | 1;
	struct efs_quarantine *q = make();
	/* Reads: id -> ticket, alive; runs: the reads begun before each add. */
	uint64_t *ticket = calloc(READS, sizeof(*ticket));
	bool *alive = calloc(READS, sizeof(*alive));
	uint64_t *born = calloc(RUNS, sizeof(*born)); /* reads begun before the add */
	bool *out = calloc(RUNS, sizeof(*out));
	size_t nreads = 0, nruns = 0, nout = 0;
	uint64_t inflight = 0, blocks = 0;
	struct got g = {0};

	cr_assert(ticket && alive && born && out);
	while (nreads < READS && nruns < RUNS) {
		uint64_t x;

		st ^= st >> 12;
		st ^= st << 25;
		st ^= st >> 27;
		x = (st * 2685821657736338717ull) >> 11;
		switch (x % 4) {
		case 0:
			ticket[nreads] = efs_quar_read_begin(q);
			alive[nreads++] = true;
			inflight++;
			break;
		case 1:
			born[nruns] = nreads;
			cr_assert_eq(efs_quar_add(q, 7, nruns, 1 + x % 5), 0);
			blocks += 1 + x % 5;
			nruns++;
			break;
		case 2: {
			size_t k = nreads ? (x >> 8) % nreads : 0;

			/* Ends a random read in flight, if any. */
			for (size_t j = 0; j < nreads && inflight; j++, k = (k + 1) % nreads)
				if (alive[k]) {
					alive[k] = false;
					inflight--;
					efs_quar_read_end(q, ticket[k]);
					break;
				}
			break;
		}
		default: {
			size_t before = g.n, expect = 0, oldest = 0;

			efs_quar_release(q, collect, &g);
			/* A run is held by a read alive among those begun before it. */
			while (oldest < nreads && !alive[oldest])
				oldest++;
			for (size_t r = 0; r < nruns; r++) {
				if (out[r] || oldest < born[r])
					continue;
				cr_assert_lt(before + expect, g.n, "seed %llu: run %zu not released",
					     (unsigned long long)seed, r);
				cr_assert_eq(g.v[before + expect].start, r,
					     "seed %llu: released %llu, expected run %zu",
					     (unsigned long long)seed,
					     (unsigned long long)g.v[before + expect].start, r);
				blocks -= g.v[before + expect].len;
				out[r] = true;
				nout++;
				expect++;
			}
			cr_assert_eq(g.n, before + expect, "seed %llu: released too much",
				     (unsigned long long)seed);
		}
		}
		cr_assert_eq(efs_quar_reads(q), inflight, "seed %llu", (unsigned long long)seed);
		cr_assert_eq(efs_quar_blocks(q), blocks, "seed %llu", (unsigned long long)seed);
	}
	cr_assert_gt(nout, 0);
	free(g.v);
	free(out);
	free(born);
	free(alive);
	free(ticket);
	efs_quar_free(q);
	efs_test_assert_no_leaks();
}
