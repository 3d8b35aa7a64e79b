/* SPDX-License-Identifier: Apache-2.0 */
#include "loop.h"

#include <string.h>

#include <criterion/criterion.h>
#include <protobuf-c/protobuf-c.h>

#include "util/clock.h"
#include "util/mem.h"

uv_loop_t efs_test_loop;
static uv_timer_t ticker;

static void on_tick(uv_timer_t *t)
{
	(void)t;
}

void efs_test_loop_init(void)
{
	cr_assert_eq(uv_loop_init(&efs_test_loop), 0);
	uv_timer_init(&efs_test_loop, &ticker);
	uv_timer_start(&ticker, on_tick, 10, 10);
}

static void count_handle(uv_handle_t *hd, void *arg)
{
	if (hd != (uv_handle_t *)&ticker)
		(*(int *)arg)++;
}

static int other_handles(void)
{
	int n = 0;

	uv_walk(&efs_test_loop, count_handle, &n);
	return n;
}

void efs_test_loop_fini(void)
{
	if (ticker.loop) {
		uint64_t end = efs_test_now_ms() + 3000;

		while (other_handles() && efs_test_now_ms() < end)
			uv_run(&efs_test_loop, UV_RUN_ONCE);
		uv_close((uv_handle_t *)&ticker, NULL);
		uv_run(&efs_test_loop, UV_RUN_NOWAIT);
		cr_expect_eq(uv_loop_close(&efs_test_loop), 0, "handles left open on the loop");
		memset(&ticker, 0, sizeof(ticker));
	}
}

uint64_t efs_test_now_ms(void)
{
	return efs_clock_mono_ns() / EFS_NSEC_PER_MSEC;
}

bool efs_test_run_until(const bool *flag, uint64_t ms)
{
	uint64_t end = efs_test_now_ms() + ms;

	while (!*flag && efs_test_now_ms() < end)
		uv_run(&efs_test_loop, UV_RUN_ONCE);
	return *flag;
}

void efs_test_run_for(uint64_t ms)
{
	bool never = false;

	efs_test_run_until(&never, ms);
}

struct efs_etcd *efs_test_client_new(const char *endpoints)
{
	struct efs_etcd_opts o = {.endpoints = endpoints};
	struct efs_etcd *c;
	int r = efs_etcd_new(&c, &efs_test_loop, &o);

	cr_assert_eq(r, 0, "efs_etcd_new: %d", r);
	return c;
}

void efs_test_freed_cb(void *arg)
{
	*(bool *)arg = true;
}

void efs_test_client_free(struct efs_etcd *c)
{
	bool done = false;

	efs_etcd_free(c, efs_test_freed_cb, &done);
	cr_assert(efs_test_run_until(&done, 10000), "client free did not finish");
}

void efs_test_pb_free(void *m)
{
	if (m)
		protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
}
