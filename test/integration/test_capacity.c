/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd capacity guard against a real etcd with a 2 MiB backend quota:
 * filling it turns the monitor LOW (growth refused while etcd still accepts
 * writes), deleting, compacting and defragmenting turns it OK again; filling
 * further until etcd raises its NOSPACE alarm fails the put with -ENOSPC,
 * which note_error turns into FULL, kept until the alarm is disarmed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "etcd/kv.h"
#include "maint/capacity.h"
#include "harness.h"
#include "util/mem.h"

#include "../support/leak.h"
#include "../support/loop.h"

#define QUOTA	    (16LL << 20)
#define VALUE_SIZE  (64 * 1024)
#define INTERVAL_MS 20

static struct efs_harness *h;

static void start_cluster(void)
{
	struct efs_harness_opts o = {.quota_bytes = QUOTA};
	int r;

	r = efs_harness_start(&h, &o);
	cr_assert_eq(r, 0, "harness start: %d", r);
	efs_test_loop_init();
}

/* Each test calls it before its leak check, and .fini again. */
static void teardown(void)
{
	efs_test_loop_fini();
	h = efs_harness_free(h);
}

TestSuite(capacity, .fini = teardown, .timeout = 90);

/* ---- etcd helpers ---- */

struct op_res {
	bool done;
	int err;
	int64_t revision;
};

static void put_done(struct efs_etcd_result *r, Etcdserverpb__PutResponse *resp, void *arg)
{
	struct op_res *o = arg;

	o->done = true;
	o->err = r->err;
	if (resp && resp->header)
		o->revision = resp->header->revision;
}

static void delete_done(struct efs_etcd_result *r, Etcdserverpb__DeleteRangeResponse *resp,
			void *arg)
{
	struct op_res *o = arg;

	o->done = true;
	o->err = r->err;
	if (resp && resp->header)
		o->revision = resp->header->revision;
}

static void compact_done(struct efs_etcd_result *r, Etcdserverpb__CompactionResponse *resp,
			 void *arg)
{
	struct op_res *o = arg;

	o->done = true;
	o->err = r->err;
}

/* Puts |key| = |VALUE_SIZE| bytes; returns the call's error. */
static int put(struct efs_etcd *c, const char *key, const char *value)
{
	struct op_res o = {0};

	cr_assert_eq(efs_etcd_put(c, key, strlen(key), value, VALUE_SIZE, NULL, NULL, put_done,
				  &o),
		     0);
	cr_assert(efs_test_run_until(&o.done, 15000), "put timed out");
	return o.err;
}

/* Deletes every key under "fill/", compacts physically at the resulting
 * revision and defragments the member: what the maintenance node (or an
 * operator) does to give space back. */
static void free_space(struct efs_etcd *c)
{
	struct efs_etcd_delete_opts d = {.prefix = true};
	struct op_res o = {0};
	char *out = NULL;
	int r;

	cr_assert_eq(efs_etcd_delete(c, "fill/", 5, &d, NULL, delete_done, &o), 0);
	cr_assert(efs_test_run_until(&o.done, 15000), "delete timed out");
	cr_assert_eq(o.err, 0, "delete while the quota is near: %d", o.err);
	cr_assert_gt(o.revision, 0);
	o.done = false;
	cr_assert_eq(efs_etcd_compact(c, o.revision, true, NULL, compact_done, &o), 0);
	cr_assert(efs_test_run_until(&o.done, 15000), "compact timed out");
	cr_assert_eq(o.err, 0, "compact: %d", o.err);
	r = efs_harness_etcdctl(h, &out, "defrag", NULL);
	cr_assert_eq(r, 0, "etcdctl defrag: %d: %s", r, out ? out : "");
	free(out);
}

/* ---- Monitor helpers ---- */

struct changes {
	int n;
	enum efs_capacity_state last;
};

static void on_state(struct efs_capacity *cap, enum efs_capacity_state old,
		     enum efs_capacity_state new_state, void *arg)
{
	struct changes *ch = arg;

	ch->n++;
	ch->last = new_state;
}

static struct efs_capacity_stats stats(const struct efs_capacity *cap)
{
	struct efs_capacity_stats st;

	efs_capacity_get_stats(cap, &st);
	return st;
}

/* Asks for a recheck and runs the loop until a Status answer newer than the
 * current one arrived. */
static struct efs_capacity_stats fresh_stats(struct efs_capacity *cap)
{
	uint64_t checks = stats(cap).checks;
	uint64_t end = efs_test_now_ms() + 10000;

	efs_capacity_recheck(cap);
	while (stats(cap).checks == checks) {
		cr_assert_lt(efs_test_now_ms(), end, "no Status answer within 10 s");
		efs_test_run_for(5);
	}
	return stats(cap);
}

/* Runs the loop (without asking for rechecks) until the state is |st|. */
static void wait_state(struct efs_capacity *cap, enum efs_capacity_state st, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (efs_capacity_state(cap) != st) {
		struct efs_capacity_stats s = stats(cap);

		cr_assert_lt(efs_test_now_ms(), end,
			     "state %s, wanted %s (in use %" PRIu64 " of %" PRIu64 ", db %" PRIu64
			     ", alarm %d, checks %" PRIu64 ", failures %" PRIu64 ")",
			     efs_capacity_state_name(s.state), efs_capacity_state_name(st),
			     s.in_use, s.quota, s.db_size, s.alarm, s.checks, s.check_failures);
		efs_test_run_for(10);
	}
}

static char *value_new(void)
{
	char *v = efs_mem_malloc(VALUE_SIZE);

	cr_assert(v);
	memset(v, 'v', VALUE_SIZE);
	return v;
}

Test(capacity, low_refuses_growth_and_space_freed_ends_it)
{
	struct changes ch = {0};
	struct efs_capacity_opts o = {
		.quota_bytes = QUOTA,
		.interval_ms = INTERVAL_MS,
		.state_cb = on_state,
		.arg = &ch,
	};
	struct efs_capacity *cap;
	struct efs_capacity_stats st;
	struct efs_etcd *c;
	char *value = value_new();
	char key[32];
	int i, r;

	start_cluster();
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_capacity_new(&cap, &efs_test_loop, c, &o), 0);
	st = fresh_stats(cap);
	cr_assert(st.known);
	cr_assert_gt(st.db_size, 0);
	cr_assert_gt(st.in_use, 0);
	cr_assert_leq(st.in_use, st.db_size);
	cr_assert_eq(st.quota, (uint64_t)QUOTA);
	cr_assert_eq(st.state, EFS_CAPACITY_OK);
	cr_assert_eq(efs_capacity_check_growth(cap), 0);

	/* Fill, one put per fresh Status answer, until LOW. */
	for (i = 0; i < 400 && efs_capacity_state(cap) == EFS_CAPACITY_OK; i++) {
		snprintf(key, sizeof(key), "fill/%04d", i);
		r = put(c, key, value);
		cr_assert_eq(r, 0, "put %d failed (%d) before the guard said LOW", i, r);
		st = fresh_stats(cap);
	}
	cr_assert_eq(efs_capacity_state(cap), EFS_CAPACITY_LOW, "never LOW after %d puts", i);
	cr_assert_eq(efs_capacity_check_growth(cap), -ENOSPC);
	cr_assert(st.in_use * 100 >= (uint64_t)QUOTA * 80 || st.db_size * 100 >= (uint64_t)QUOTA * 90,
		  "LOW at %" PRIu64 " in use, dbSize %" PRIu64, st.in_use, st.db_size);
	cr_assert_not(st.alarm);
	cr_log_info("LOW after %d puts: in use %" PRIu64 ", dbSize %" PRIu64, i, st.in_use,
		    st.db_size);
	cr_assert_eq(ch.n, 1);
	cr_assert_eq(ch.last, EFS_CAPACITY_LOW);

	/* Give the space back; the periodic poll alone finds it. */
	free_space(c);
	wait_state(cap, EFS_CAPACITY_OK, 5000);
	st = stats(cap);
	cr_assert_lt(st.in_use * 100, (uint64_t)QUOTA * 75);
	cr_assert_eq(efs_capacity_check_growth(cap), 0);
	cr_assert_eq(ch.n, 2);
	cr_assert_eq(ch.last, EFS_CAPACITY_OK);

	cap = efs_capacity_free(cap);
	efs_test_client_free(c);
	efs_mem_free(value);
	teardown();
	efs_test_assert_no_leaks();
}

Test(capacity, nospace_alarm_is_full_until_disarmed)
{
	struct changes ch = {0};
	struct efs_capacity_opts o = {
		.quota_bytes = QUOTA,
		.interval_ms = INTERVAL_MS,
		.state_cb = on_state,
		.arg = &ch,
	};
	struct efs_capacity *cap;
	struct efs_capacity_stats st;
	struct efs_etcd *c;
	char *value = value_new();
	char key[32], *out = NULL;
	int i, r = 0;

	start_cluster();
	c = efs_test_client_new(efs_harness_endpoints(h));
	cr_assert_eq(efs_capacity_new(&cap, &efs_test_loop, c, &o), 0);

	/* Write past the guard (as a writer that ignored it would) until etcd
	 * refuses: "database space exceeded" is -ENOSPC. etcd checks its quota
	 * against the size at its last backend commit (every 100 ms), so
	 * unpaced puts overshoot the quota by whatever fits in that time: a
	 * short pause per put keeps the overshoot, and the disk used, small. */
	for (i = 0; i < 600; i++) {
		snprintf(key, sizeof(key), "fill/%04d", i);
		r = put(c, key, value);
		if (r)
			break;
		efs_test_run_for(2);
	}
	st = stats(cap);
	cr_assert_eq(r, -ENOSPC,
		     "put %d: %d, wanted -ENOSPC (last Status: dbSize %" PRIu64 ", in use %" PRIu64
		     ", alarm %d, state %s)",
		     i, r, st.db_size, st.in_use, st.alarm, efs_capacity_state_name(st.state));
	efs_capacity_note_error(cap, r);
	cr_assert_eq(efs_capacity_state(cap), EFS_CAPACITY_FULL);
	cr_assert_eq(efs_capacity_check_growth(cap), -ENOSPC);
	cr_assert_eq(ch.last, EFS_CAPACITY_FULL);

	/* Status confirms the alarm, and FULL holds across answers. */
	for (int k = 0; k < 3; k++) {
		st = fresh_stats(cap);
		cr_assert(st.alarm, "Status does not list the NOSPACE alarm");
		cr_assert_eq(st.state, EFS_CAPACITY_FULL);
	}
	cr_assert_eq(st.nospace_errors, 1);
	/* Any write is refused by etcd now, not only by the guard. */
	cr_assert_eq(put(c, "fill/more", value), -ENOSPC);

	/* Space given back: the alarm stays until someone disarms it. */
	free_space(c);
	st = fresh_stats(cap);
	cr_assert_lt(st.in_use * 100, (uint64_t)QUOTA * 75);
	cr_assert(st.alarm);
	cr_assert_eq(st.state, EFS_CAPACITY_FULL);
	cr_assert_eq(efs_capacity_check_growth(cap), -ENOSPC);

	r = efs_harness_etcdctl(h, &out, "alarm", "disarm", NULL);
	cr_assert_eq(r, 0, "etcdctl alarm disarm: %d: %s", r, out ? out : "");
	free(out);
	wait_state(cap, EFS_CAPACITY_OK, 5000);
	st = stats(cap);
	cr_assert_not(st.alarm);
	cr_assert_eq(efs_capacity_check_growth(cap), 0);
	cr_assert_eq(put(c, "fill/after", value), 0, "etcd still refuses writes");

	cap = efs_capacity_free(cap);
	efs_test_client_free(c);
	efs_mem_free(value);
	teardown();
	efs_test_assert_no_leaks();
}
