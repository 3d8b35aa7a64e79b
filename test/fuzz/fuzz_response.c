/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: arbitrary HTTP/2 server bytes against a client with a
 * unary Range call and a Watch stream in flight on an in-memory connection
 * (efs_etcd_test_new). The client must end every call and stream cleanly,
 * whatever arrives, and leave nothing behind after efs_etcd_free().
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "etcd/client-int.h"
#include "etcd/etcd.h"
#include "util/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An empty server SETTINGS frame: the connection becomes usable and the
 * Range (stream 1) and Watch (stream 3) go out. */
static const uint8_t server_settings[] = { 0, 0, 0, 4, 0, 0, 0, 0, 0 };

struct state {
	int calls_done;
	int streams_closed;
	int msgs;
};

static void on_call(struct efs_etcd_result *r, void *arg)
{
	struct state *st = arg;

	if (!r->message || (r->err == 0) != (r->resp != NULL))
		abort();
	st->calls_done++;
}

static void on_msg(struct efs_etcd_stream *s, const ProtobufCMessage *m, void *arg)
{
	struct state *st = arg;

	if (!m)
		abort();
	st->msgs++;
}

static void on_close(struct efs_etcd_stream *s, const struct efs_etcd_result *r, void *arg)
{
	struct state *st = arg;

	if (!r->message)
		abort();
	st->streams_closed++;
}

static void on_freed(void *arg)
{
	*(int *)arg = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct efs_etcd_opts o = { .endpoints = "http://127.0.0.1:1", .max_recv_msg = 1 << 20 };
	Etcdserverpb__RangeRequest q = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__WatchCreateRequest wc = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
	Etcdserverpb__WatchRequest wr = ETCDSERVERPB__WATCH_REQUEST__INIT;
	struct state st = { 0 };
	struct efs_etcd_stream *s;
	struct efs_etcd *c;
	uv_loop_t loop;
	int freed = 0;

	if (uv_loop_init(&loop) != 0)
		abort();
	if (efs_etcd_test_new(&c, &loop, &o) != 0)
		abort();
	q.key.data = (uint8_t *)"k";
	q.key.len = 1;
	if (efs_etcd_call(c, EFS_ETCD_RANGE, &q.base, NULL, on_call, &st, NULL) != 0)
		abort();
	if (efs_etcd_stream_open(c, EFS_ETCD_STREAM_WATCH, EFS_ETCD_CH_BULK, on_msg, on_close,
				 &st, &s) != 0)
		abort();
	wc.key = q.key;
	wc.watch_id = 7;
	wr.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
	wr.create_request = &wc;
	if (efs_etcd_stream_send(s, &wr.base) != 0)
		abort();

	uv_run(&loop, UV_RUN_NOWAIT);
	if (efs_etcd_test_feed(c, server_settings, sizeof(server_settings)) != 0)
		abort();
	uv_run(&loop, UV_RUN_NOWAIT);
	/* Feed in two pieces so that frames also straddle reads. */
	if (efs_etcd_test_feed(c, data, size / 2) == 0) {
		uv_run(&loop, UV_RUN_NOWAIT);
		efs_etcd_test_feed(c, data + size / 2, size - size / 2);
	}
	for (int i = 0; i < 4; i++)
		uv_run(&loop, UV_RUN_NOWAIT);

	efs_etcd_free(c, on_freed, &freed);
	while (!freed)
		uv_run(&loop, UV_RUN_ONCE);
	if (st.calls_done != 1 || st.streams_closed > 1)
		abort();
	uv_run(&loop, UV_RUN_NOWAIT);
	if (uv_loop_close(&loop) != 0)
		abort();
	return 0;
}
