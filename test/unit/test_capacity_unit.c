/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The etcd capacity guard without etcd: the pure decision (thresholds,
 * hysteresis, the alarm, exactness at the boundaries and for huge quotas),
 * the reading of Status answers, and the monitor's local behaviour (option
 * checks, note_error, state callbacks, metrics, failed Status calls keeping
 * the state) against an endpoint that refuses connections.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <criterion/criterion.h>
#include <uv.h>

#include "../support/leak.h"
#include "etcd/etcd.h"
#include "maint/capacity.h"
#include "util/mem.h"
#include "util/metrics.h"

TestSuite(capacity, .timeout = 20);

static struct efs_capacity_sample sample(uint64_t in_use, bool alarm)
{
	return (struct efs_capacity_sample){.db_size = in_use, .in_use = in_use,
					    .nospace_alarm = alarm};
}

static enum efs_capacity_state decide(enum efs_capacity_state prev, uint64_t quota,
				      uint64_t in_use, bool alarm)
{
	struct efs_capacity_limits l = {.quota = quota, .low_pct = 80, .ok_pct = 75, .db_pct = 90};
	struct efs_capacity_sample s = sample(in_use, alarm);

	return efs_capacity_decide(prev, &l, &s);
}

Test(capacity, decide_thresholds_at_the_boundaries)
{
	/* Quota 1000: LOW from 800, OK again below 750. */
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 0, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 799, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 800, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 1000, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 5000, false), EFS_CAPACITY_LOW);
	efs_test_assert_no_leaks();
}

Test(capacity, decide_hysteresis)
{
	/* Between 75 % and 80 % the state keeps what it was. */
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 760, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_LOW, 1000, 799, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_LOW, 1000, 750, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_LOW, 1000, 749, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_LOW, 1000, 0, false), EFS_CAPACITY_OK);
	/* A disarmed alarm leaves FULL by the sizes, with LOW's hysteresis. */
	cr_assert_eq(decide(EFS_CAPACITY_FULL, 1000, 900, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_FULL, 1000, 760, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_FULL, 1000, 749, false), EFS_CAPACITY_OK);
	efs_test_assert_no_leaks();
}

Test(capacity, decide_alarm_wins)
{
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1000, 0, true), EFS_CAPACITY_FULL);
	cr_assert_eq(decide(EFS_CAPACITY_LOW, 1000, 500, true), EFS_CAPACITY_FULL);
	cr_assert_eq(decide(EFS_CAPACITY_FULL, 1000, 10, true), EFS_CAPACITY_FULL);
	efs_test_assert_no_leaks();
}

Test(capacity, decide_is_exact_for_odd_and_huge_quotas)
{
	const uint64_t gib2 = EFS_CAPACITY_QUOTA_DEFAULT;
	/* 80 % of 2 GiB is 1717986918.4: the first LOW size is ...919. */
	cr_assert_eq(decide(EFS_CAPACITY_OK, gib2, 1717986918ULL, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_OK, gib2, 1717986919ULL, false), EFS_CAPACITY_LOW);
	/* 75 % of 2 GiB is exactly 1610612736. */
	cr_assert_eq(decide(EFS_CAPACITY_LOW, gib2, 1610612736ULL, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_LOW, gib2, 1610612735ULL, false), EFS_CAPACITY_OK);
	/* UINT64_MAX * 4 / 5 = 14757395258967641292 exactly: no overflow. */
	cr_assert_eq(decide(EFS_CAPACITY_OK, UINT64_MAX, 14757395258967641291ULL, false),
		     EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_OK, UINT64_MAX, 14757395258967641292ULL, false),
		     EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_OK, UINT64_MAX, UINT64_MAX, false), EFS_CAPACITY_LOW);
	/* Quota 1 byte, 3 bytes: ceil(0.8) = 1, ceil(2.4) = 3. */
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1, 0, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 1, 1, false), EFS_CAPACITY_LOW);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 3, 2, false), EFS_CAPACITY_OK);
	cr_assert_eq(decide(EFS_CAPACITY_OK, 3, 3, false), EFS_CAPACITY_LOW);
	/* Quota 0 refuses everything. */
	cr_assert_eq(decide(EFS_CAPACITY_OK, 0, 0, false), EFS_CAPACITY_LOW);
	efs_test_assert_no_leaks();
}

Test(capacity, decide_other_percentages)
{
	struct efs_capacity_limits l = {.quota = 1000, .low_pct = 90, .ok_pct = 50, .db_pct = 100};
	struct efs_capacity_sample s = sample(899, false);

	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_OK);
	s.in_use = 900;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_LOW);
	s.in_use = 500;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_LOW, &l, &s), EFS_CAPACITY_LOW);
	s.in_use = 499;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_LOW, &l, &s), EFS_CAPACITY_OK);
	l.low_pct = 100;
	l.ok_pct = 99;
	s.in_use = 1000;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_LOW);
	s.in_use = 999;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_OK);
	efs_test_assert_no_leaks();
}

Test(capacity, decide_db_size_criterion)
{
	struct efs_capacity_limits l = {.quota = 1000, .low_pct = 80, .ok_pct = 75, .db_pct = 90};
	struct efs_capacity_sample s = {.db_size = 899, .in_use = 100};

	/* Little in use, but etcd's own check (dbSize + cost) is near. */
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_OK);
	s.db_size = 900;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_LOW);
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_LOW, &l, &s), EFS_CAPACITY_LOW);
	/* Defragmented: dbSize shrinks below db_pct, in use below ok_pct. */
	s.db_size = 899;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_LOW, &l, &s), EFS_CAPACITY_OK);
	s.in_use = 760;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_LOW, &l, &s), EFS_CAPACITY_LOW);
	/* db_pct 100: only a dbSize at the quota counts. */
	l.db_pct = 100;
	s.in_use = 100;
	s.db_size = 999;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_OK);
	s.db_size = 1000;
	cr_assert_eq(efs_capacity_decide(EFS_CAPACITY_OK, &l, &s), EFS_CAPACITY_LOW);
	efs_test_assert_no_leaks();
}

Test(capacity, decide_error)
{
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_OK, -ENOSPC), EFS_CAPACITY_FULL);
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_LOW, -ENOSPC), EFS_CAPACITY_FULL);
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_OK, 0), EFS_CAPACITY_OK);
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_LOW, -EIO), EFS_CAPACITY_LOW);
	/* Not -ENOSPC: a positive ENOSPC is not an error value here. */
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_OK, ENOSPC), EFS_CAPACITY_OK);
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_OK, -ENOBUFS), EFS_CAPACITY_OK);
	cr_assert_eq(efs_capacity_decide_error(EFS_CAPACITY_FULL, -ETIMEDOUT), EFS_CAPACITY_FULL);
	efs_test_assert_no_leaks();
}

Test(capacity, sample_from_status)
{
	Etcdserverpb__StatusResponse r = ETCDSERVERPB__STATUS_RESPONSE__INIT;
	char e0[] = "etcdserver: no leader";
	char e1[] = "memberID:8076694127913051967 alarm:CORRUPT ";
	char e2[] = "memberID:8076694127913051967 alarm:NOSPACE ";
	char *errs[] = {e0, e1, e2};
	struct efs_capacity_sample s;

	/* The figures etcd 3.4.23 answered when full (as seen in a test run). */
	r.dbsize = 2347008;
	r.dbsizeinuse = 2084864;
	efs_capacity_sample_from_status(&r, &s);
	cr_assert_eq(s.db_size, 2347008);
	cr_assert_eq(s.in_use, 2084864);
	cr_assert_not(s.nospace_alarm);

	r.n_errors = 2;
	r.errors = errs;
	efs_capacity_sample_from_status(&r, &s);
	cr_assert_not(s.nospace_alarm, "CORRUPT or no leader is not NOSPACE");
	r.n_errors = 3;
	efs_capacity_sample_from_status(&r, &s);
	cr_assert(s.nospace_alarm);

	/* A member that does not fill dbSizeInUse (before 3.4): dbSize. */
	r.n_errors = 0;
	r.dbsizeinuse = 0;
	efs_capacity_sample_from_status(&r, &s);
	cr_assert_eq(s.in_use, 2347008);
	/* Negative sizes (a broken peer) read as 0. */
	r.dbsize = -5;
	r.dbsizeinuse = -7;
	efs_capacity_sample_from_status(&r, &s);
	cr_assert_eq(s.db_size, 0);
	cr_assert_eq(s.in_use, 0);
	efs_test_assert_no_leaks();
}

Test(capacity, state_names_and_null)
{
	cr_assert_str_eq(efs_capacity_state_name(EFS_CAPACITY_OK), "ok");
	cr_assert_str_eq(efs_capacity_state_name(EFS_CAPACITY_LOW), "low");
	cr_assert_str_eq(efs_capacity_state_name(EFS_CAPACITY_FULL), "full");
	cr_assert_str_eq(efs_capacity_state_name((enum efs_capacity_state)42), "?");
	cr_assert_eq(efs_capacity_check_growth(NULL), 0);
	efs_capacity_note_error(NULL, -ENOSPC);
	efs_capacity_recheck(NULL);
	cr_assert_null(efs_capacity_free(NULL));
	efs_test_assert_no_leaks();
}

/* ---- The monitor against an endpoint that refuses connections ---- */

static uv_loop_t loop;
static int refuse_fd = -1;

/* A bound, never listening TCP socket: connecting to it is refused. */
static char *refusing_endpoint(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	char *url = malloc(64);

	cr_assert(url);
	refuse_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(refuse_fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(bind(refuse_fd, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(getsockname(refuse_fd, (struct sockaddr *)&a, &len), 0);
	snprintf(url, 64, "http://127.0.0.1:%u", ntohs(a.sin_port));
	return url;
}

static struct efs_etcd *client_new(uint32_t timeout_ms)
{
	char *url = refusing_endpoint();
	struct efs_etcd_opts o = {.endpoints = url, .call_timeout_ms = timeout_ms};
	struct efs_etcd *c = NULL;

	cr_assert_eq(uv_loop_init(&loop), 0);
	cr_assert_eq(efs_etcd_new(&c, &loop, &o), 0);
	free(url);
	return c;
}

static void freed_cb(void *arg)
{
	*(bool *)arg = true;
}

static void run_for(uint64_t ms)
{
	uint64_t end;

	uv_update_time(&loop);
	end = uv_now(&loop) + ms;
	while (uv_now(&loop) < end) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(2000);
		uv_update_time(&loop);
	}
}

static void client_free(struct efs_etcd *c)
{
	bool freed = false;

	efs_etcd_free(c, freed_cb, &freed);
	for (int i = 0; i < 5000 && !freed; i++) {
		uv_run(&loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	cr_assert(freed, "client never freed");
	run_for(10);
	cr_assert_eq(uv_loop_close(&loop), 0, "handles left on the loop");
	close(refuse_fd);
	refuse_fd = -1;
}

struct changes {
	int n;
	enum efs_capacity_state old[8], now[8];
};

static void on_state(struct efs_capacity *cap, enum efs_capacity_state old,
		     enum efs_capacity_state new_state, void *arg)
{
	struct changes *ch = arg;

	cr_assert_neq(old, new_state);
	cr_assert_eq(efs_capacity_state(cap), new_state);
	if (ch->n < 8) {
		ch->old[ch->n] = old;
		ch->now[ch->n] = new_state;
	}
	ch->n++;
}

Test(capacity, new_checks_its_arguments)
{
	struct efs_etcd *c = client_new(0);
	struct efs_capacity *cap = NULL;
	struct efs_capacity_opts o = {0};
	uv_loop_t other;

	cr_assert_eq(efs_capacity_new(&cap, NULL, c, NULL), -EINVAL);
	cr_assert_eq(efs_capacity_new(&cap, &loop, NULL, NULL), -EINVAL);
	cr_assert_eq(efs_capacity_new(NULL, &loop, c, NULL), -EINVAL);
	cr_assert_eq(uv_loop_init(&other), 0);
	cr_assert_eq(efs_capacity_new(&cap, &other, c, NULL), -EINVAL, "loop is not the client's");
	cr_assert_eq(uv_loop_close(&other), 0);
	o.low_pct = 101;
	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), -EINVAL);
	o.low_pct = 70; /* ok_pct defaults to 75 */
	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), -EINVAL);
	o.low_pct = 80;
	o.ok_pct = 80;
	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), -EINVAL);
	o.ok_pct = 0;
	o.db_pct = 101;
	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), -EINVAL);
	cr_assert_null(cap, "ret untouched on failure");

	/* Allocation failures unwind cleanly. */
	for (long i = 0; i < 2; i++) {
		efs_mem_fail_after(i);
		cr_assert_eq(efs_capacity_new(&cap, &loop, c, NULL), -ENOMEM);
		efs_mem_fail_reset();
		cr_assert_null(cap);
	}
	cr_assert_eq(efs_capacity_new(&cap, &loop, c, NULL), 0);
	cap = efs_capacity_free(cap);
	client_free(c);
	efs_test_assert_no_leaks();
}

Test(capacity, defaults_and_note_error)
{
	struct efs_etcd *c = client_new(0);
	struct changes ch = {0};
	struct efs_capacity_opts o = {.state_cb = on_state, .arg = &ch};
	struct efs_capacity_stats st;
	struct efs_capacity *cap;

	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), 0);
	efs_capacity_get_stats(cap, &st);
	cr_assert_eq(st.quota, 2ULL << 30);
	cr_assert_eq(st.state, EFS_CAPACITY_OK);
	cr_assert_not(st.known);
	/* Nothing known yet: growth is allowed. */
	cr_assert_eq(efs_capacity_check_growth(cap), 0);

	efs_capacity_note_error(cap, -EIO);
	efs_capacity_note_error(cap, 0);
	cr_assert_eq(efs_capacity_state(cap), EFS_CAPACITY_OK);
	cr_assert_eq(ch.n, 0);

	efs_capacity_note_error(cap, -ENOSPC);
	cr_assert_eq(efs_capacity_state(cap), EFS_CAPACITY_FULL);
	cr_assert_eq(efs_capacity_check_growth(cap), -ENOSPC);
	cr_assert_eq(ch.n, 1);
	cr_assert_eq(ch.old[0], EFS_CAPACITY_OK);
	cr_assert_eq(ch.now[0], EFS_CAPACITY_FULL);
	/* Again: no new change reported. */
	efs_capacity_note_error(cap, -ENOSPC);
	cr_assert_eq(ch.n, 1);
	efs_capacity_get_stats(cap, &st);
	cr_assert_eq(st.nospace_errors, 2);
	cr_assert_eq(st.state, EFS_CAPACITY_FULL);

	/* Free with the first Status call still connecting: it is cancelled
	 * and its callback only frees its argument. */
	run_for(20);
	cap = efs_capacity_free(cap);
	client_free(c);
	cr_assert_eq(ch.n, 1, "no callback after free");
	efs_test_assert_no_leaks();
}

Test(capacity, failed_status_keeps_the_state)
{
	struct efs_etcd *c = client_new(150);
	struct changes ch = {0};
	struct efs_capacity_opts o = {.interval_ms = 100, .state_cb = on_state, .arg = &ch};
	struct efs_capacity_stats st;
	struct efs_capacity *cap;

	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), 0);
	efs_capacity_note_error(cap, -ENOSPC);
	/* Several Status calls fail (deadline 150 ms, connection refused). */
	for (int i = 0; i < 300; i++) {
		run_for(10);
		efs_capacity_get_stats(cap, &st);
		if (st.check_failures >= 2)
			break;
	}
	cr_assert_geq(st.check_failures, 2, "Status calls did not fail: %" PRIu64,
		      st.check_failures);
	cr_assert_lt(st.last_err, 0);
	cr_assert_not(st.known);
	cr_assert_eq(st.checks, 0);
	cr_assert_eq(st.state, EFS_CAPACITY_FULL);
	cr_assert_eq(efs_capacity_check_growth(cap), -ENOSPC);
	cr_assert_eq(ch.n, 1);
	cap = efs_capacity_free(cap);
	client_free(c);
	efs_test_assert_no_leaks();
}

static double metric(const char *text, const char *name)
{
	size_t n = strlen(name);

	for (const char *p = text; (p = strstr(p, name)); p += n)
		if ((p == text || p[-1] == '\n') && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	cr_assert_fail("metric %s missing in:\n%s", name, text);
	return -1;
}

Test(capacity, metrics_follow_the_slot)
{
	struct efs_etcd *c = client_new(0);
	struct efs_capacity_opts o = {.quota_bytes = 123456789};
	struct efs_capacity *cap = NULL;
	struct efs_metrics *m;
	char *text;
	size_t len;

	cr_assert_eq(efs_metrics_new(&m), 0);
	cr_assert_eq(efs_capacity_register_metrics(&cap, m), 0);
	cr_assert_eq(efs_metrics_render(m, &text, &len), 0);
	cr_assert_eq(metric(text, "etcfs_etcd_quota_bytes"), 0, "no monitor yet");
	cr_assert_eq(metric(text, "etcfs_metadata_space_low"), 0);
	efs_mem_free(text);

	cr_assert_eq(efs_capacity_new(&cap, &loop, c, &o), 0);
	efs_capacity_note_error(cap, -ENOSPC);
	cr_assert_eq(efs_metrics_render(m, &text, &len), 0);
	cr_assert_eq(metric(text, "etcfs_etcd_quota_bytes"), 123456789);
	cr_assert_eq(metric(text, "etcfs_etcd_db_bytes"), 0);
	cr_assert_eq(metric(text, "etcfs_etcd_db_in_use_bytes"), 0);
	cr_assert_eq(metric(text, "etcfs_metadata_space_low"), 1);
	cr_assert_eq(metric(text, "etcfs_etcd_nospace_alarm"), 1);
	efs_mem_free(text);

	/* Freed and cleared before the registry: the gauges read 0. */
	cap = efs_capacity_free(cap);
	cr_assert_eq(efs_metrics_render(m, &text, &len), 0);
	cr_assert_eq(metric(text, "etcfs_etcd_quota_bytes"), 0);
	cr_assert_eq(metric(text, "etcfs_etcd_nospace_alarm"), 0);
	efs_mem_free(text);
	m = efs_metrics_free(m);
	client_free(c);
	efs_test_assert_no_leaks();
}
