/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <nghttp2/nghttp2.h>

#include "etcd/grpc.h"
#include "rpc.pb-c.h"
#include "util/mem.h"

#include "../support/leak.h"

TestSuite(grpc, .fini = efs_mem_fail_reset, .timeout = 30);

/* ---- Framing helpers ---- */

#define MAXMSGS 16

/* Records every message the reader delivers (copied, since |msg| is only
 * valid during the callback) and can fail on a chosen one. */
struct sink {
	size_t n;
	size_t len[MAXMSGS];
	uint8_t *data[MAXMSGS];
	bool null_seen;
	int fail_at; /* index of the message whose callback fails, or -1 */
	int fail_err;
};

static void sink_init(struct sink *s)
{
	memset(s, 0, sizeof(*s));
	s->fail_at = -1;
}

static void sink_done(struct sink *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->data[i]);
	s->n = 0;
}

static int sink_cb(const uint8_t *msg, size_t len, void *arg)
{
	struct sink *s = arg;

	if (!msg)
		s->null_seen = true;
	if (s->fail_at >= 0 && (size_t)s->fail_at == s->n)
		return s->fail_err;
	cr_assert_lt(s->n, MAXMSGS);
	s->len[s->n] = len;
	s->data[s->n] = malloc(len ? len : 1);
	if (len)
		memcpy(s->data[s->n], msg, len);
	s->n++;
	return 0;
}

/* Appends a frame of |len| bytes, each byte derived from |seed| and its
 * index so that misplaced bytes show. */
static size_t put_frame(uint8_t *out, size_t len, uint8_t seed)
{
	out[0] = 0;
	out[1] = (uint8_t)(len >> 24);
	out[2] = (uint8_t)(len >> 16);
	out[3] = (uint8_t)(len >> 8);
	out[4] = (uint8_t)len;
	for (size_t i = 0; i < len; i++)
		out[5 + i] = (uint8_t)(seed + i * 7);
	return 5 + len;
}

static void check_body(const struct sink *s, size_t i, size_t len, uint8_t seed)
{
	cr_assert_eq(s->len[i], len, "message %zu: length %zu, want %zu", i, s->len[i], len);
	for (size_t j = 0; j < len; j++)
		cr_assert_eq(s->data[i][j], (uint8_t)(seed + j * 7), "message %zu byte %zu", i, j);
}

/* Three messages: empty, one byte, 300 bytes. */
static size_t three_frames(uint8_t *buf)
{
	size_t n = 0;

	n += put_frame(buf + n, 0, 1);
	n += put_frame(buf + n, 1, 2);
	n += put_frame(buf + n, 300, 3);
	return n;
}

static void check_three(const struct sink *s)
{
	cr_assert_eq(s->n, 3, "got %zu messages", s->n);
	check_body(s, 0, 0, 1);
	check_body(s, 1, 1, 2);
	check_body(s, 2, 300, 3);
}

/* ---- Framing ---- */

Test(grpc, frame_then_read_round_trips_a_protobuf_message)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeRequest *back;
	struct efs_grpc_reader r;
	struct sink s;
	uint8_t *buf;
	size_t len, plen;

	req.key.data = (uint8_t *)"foo";
	req.key.len = 3;
	req.limit = 42;
	plen = protobuf_c_message_get_packed_size(&req.base);
	cr_assert_eq(efs_grpc_frame(&req.base, &buf, &len), 0);
	cr_assert_eq(len, plen + 5);
	cr_assert_eq(buf[0], 0);
	cr_assert_eq((size_t)buf[4] | (size_t)buf[3] << 8, plen);
	cr_assert_eq(buf[1] | buf[2], 0);

	sink_init(&s);
	efs_grpc_reader_init(&r, 1024);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, len, sink_cb, &s), 0);
	cr_assert_eq(s.n, 1);
	back = etcdserverpb__range_request__unpack(NULL, s.len[0], s.data[0]);
	cr_assert_not_null(back);
	cr_assert_eq(back->key.len, 3);
	cr_assert_eq(memcmp(back->key.data, "foo", 3), 0);
	cr_assert_eq(back->limit, 42);
	etcdserverpb__range_request__free_unpacked(back, NULL);
	efs_grpc_reader_done(&r);
	efs_mem_free(buf);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, frame_of_an_empty_message_is_five_zero_bytes)
{
	Etcdserverpb__WatchProgressRequest req = ETCDSERVERPB__WATCH_PROGRESS_REQUEST__INIT;
	static const uint8_t zeros[5];
	uint8_t *buf;
	size_t len;

	cr_assert_eq(efs_grpc_frame(&req.base, &buf, &len), 0);
	cr_assert_eq(len, 5);
	cr_assert_eq(memcmp(buf, zeros, 5), 0);
	efs_mem_free(buf);
	efs_test_assert_no_leaks();
}

Test(grpc, frame_reports_enomem_and_leaves_outputs_untouched)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	uint8_t *buf = (uint8_t *)&req;
	size_t len = 77;

	efs_mem_fail_after(0);
	cr_assert_eq(efs_grpc_frame(&req.base, &buf, &len), -ENOMEM);
	cr_assert_eq(buf, (uint8_t *)&req);
	cr_assert_eq(len, 77);
	efs_test_assert_no_leaks();
}

Test(grpc, several_messages_in_one_chunk_are_all_delivered_in_order)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 1000);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, n, sink_cb, &s), 0);
	check_three(&s);
	cr_assert(efs_grpc_reader_is_idle(&r));
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, a_split_at_every_byte_boundary_yields_the_same_messages)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);

	for (size_t i = 0; i <= n; i++) {
		struct efs_grpc_reader r;
		struct sink s;

		sink_init(&s);
		efs_grpc_reader_init(&r, 1000);
		cr_assert_eq(efs_grpc_reader_feed(&r, buf, i, sink_cb, &s), 0);
		cr_assert_eq(efs_grpc_reader_feed(&r, buf + i, n - i, sink_cb, &s), 0);
		check_three(&s);
		cr_assert(!s.null_seen);
		cr_assert(efs_grpc_reader_is_idle(&r));
		efs_grpc_reader_done(&r);
		sink_done(&s);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, two_splits_at_every_pair_of_boundaries_yield_the_same_messages)
{
	uint8_t buf[64];
	size_t n = 0;

	n += put_frame(buf + n, 3, 9);
	n += put_frame(buf + n, 0, 1);
	n += put_frame(buf + n, 20, 5);
	for (size_t i = 0; i <= n; i++) {
		for (size_t j = i; j <= n; j++) {
			struct efs_grpc_reader r;
			struct sink s;

			sink_init(&s);
			efs_grpc_reader_init(&r, 20);
			cr_assert_eq(efs_grpc_reader_feed(&r, buf, i, sink_cb, &s), 0);
			cr_assert_eq(efs_grpc_reader_feed(&r, buf + i, j - i, sink_cb, &s), 0);
			cr_assert_eq(efs_grpc_reader_feed(&r, buf + j, n - j, sink_cb, &s), 0);
			cr_assert_eq(s.n, 3, "split %zu/%zu", i, j);
			check_body(&s, 0, 3, 9);
			check_body(&s, 1, 0, 1);
			check_body(&s, 2, 20, 5);
			efs_grpc_reader_done(&r);
			sink_done(&s);
		}
	}
	efs_test_assert_no_leaks();
}

Test(grpc, byte_at_a_time_feeding_reassembles_everything)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 1000);
	for (size_t i = 0; i < n; i++)
		cr_assert_eq(efs_grpc_reader_feed(&r, buf + i, 1, sink_cb, &s), 0);
	check_three(&s);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, one_large_message_over_many_chunks_is_delivered_once_whole)
{
	size_t len = 1 << 20, n;
	uint8_t *buf = malloc(len + 5);
	struct efs_grpc_reader r;
	struct sink s;

	n = put_frame(buf, len, 77);
	sink_init(&s);
	efs_grpc_reader_init(&r, len);
	for (size_t off = 0; off < n; off += 997) {
		size_t c = n - off < 997 ? n - off : 997;

		cr_assert_eq(efs_grpc_reader_feed(&r, buf + off, c, sink_cb, &s), 0);
		cr_assert_eq(s.n, off + c == n ? 1u : 0u);
		cr_assert_eq(efs_grpc_reader_is_idle(&r), off + c == n);
	}
	check_body(&s, 0, len, 77);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	free(buf);
	efs_test_assert_no_leaks();
}

Test(grpc, a_message_whole_inside_one_chunk_is_delivered_without_copying)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 1000);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, n, sink_cb, &s), 0);
	cr_assert_eq(efs_mem_count(), 0);
	/* Exactly one whole frame per chunk, too. */
	n = put_frame(buf, 9, 4);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, n, sink_cb, &s), 0);
	cr_assert_eq(efs_mem_count(), 0);
	cr_assert_eq(s.n, 4);
	check_body(&s, 3, 9, 4);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, zero_length_message_is_delivered_with_a_valid_pointer)
{
	uint8_t buf[5] = {0};
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 0);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, 3, sink_cb, &s), 0);
	cr_assert_eq(s.n, 0);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf + 3, 2, sink_cb, &s), 0);
	cr_assert_eq(s.n, 1);
	cr_assert_eq(s.len[0], 0);
	cr_assert(!s.null_seen);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, 5, sink_cb, &s), 0);
	cr_assert_eq(s.n, 2);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, feeding_nothing_is_a_no_op)
{
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 10);
	cr_assert_eq(efs_grpc_reader_feed(&r, NULL, 0, sink_cb, &s), 0);
	cr_assert_eq(s.n, 0);
	cr_assert(efs_grpc_reader_is_idle(&r));
	efs_grpc_reader_done(&r);
	efs_test_assert_no_leaks();
}

Test(grpc, message_of_exactly_max_size_passes_and_one_more_byte_is_emsgsize)
{
	uint8_t buf[64];
	size_t n;
	struct efs_grpc_reader r;
	struct sink s;

	n = put_frame(buf, 10, 0);
	sink_init(&s);
	efs_grpc_reader_init(&r, 10);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, n, sink_cb, &s), 0);
	cr_assert_eq(s.n, 1);
	n = put_frame(buf, 11, 0);
	/* The prefix alone is enough to refuse it, before any body byte. */
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, 5, sink_cb, &s), -EMSGSIZE);
	cr_assert_eq(s.n, 1);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, announced_length_of_four_gib_minus_one_is_refused_without_allocating)
{
	static const uint8_t pfx[5] = {0, 0xff, 0xff, 0xff, 0xff};
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 256u << 20);
	efs_mem_fail_after(-1);
	cr_assert_eq(efs_grpc_reader_feed(&r, pfx, 5, sink_cb, &s), -EMSGSIZE);
	cr_assert_eq(efs_mem_count(), 0);
	efs_grpc_reader_done(&r);
	efs_test_assert_no_leaks();
}

Test(grpc, compressed_flag_is_eproto_even_when_split_across_chunks)
{
	static const uint8_t one[] = {1, 0, 0, 0, 1, 'x'};
	static const uint8_t two[] = {2, 0, 0, 0, 0};
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 10);
	cr_assert_eq(efs_grpc_reader_feed(&r, one, 2, sink_cb, &s), 0);
	cr_assert_eq(efs_grpc_reader_feed(&r, one + 2, 4, sink_cb, &s), -EPROTO);
	efs_grpc_reader_done(&r);
	efs_grpc_reader_init(&r, 10);
	cr_assert_eq(efs_grpc_reader_feed(&r, two, 5, sink_cb, &s), -EPROTO);
	cr_assert_eq(s.n, 0);
	efs_grpc_reader_done(&r);
	efs_test_assert_no_leaks();
}

Test(grpc, a_failed_reader_refuses_further_input)
{
	static const uint8_t bad[] = {1, 0, 0, 0, 0};
	static const uint8_t good[] = {0, 0, 0, 0, 0};
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 10);
	cr_assert_eq(efs_grpc_reader_feed(&r, bad, 5, sink_cb, &s), -EPROTO);
	cr_assert(!efs_grpc_reader_is_idle(&r));
	cr_assert_eq(efs_grpc_reader_feed(&r, good, 5, sink_cb, &s), -EPROTO);
	cr_assert_eq(efs_grpc_reader_feed(&r, NULL, 0, sink_cb, &s), -EPROTO);
	cr_assert_eq(s.n, 0);
	efs_grpc_reader_done(&r);
	/* done() makes it a fresh, idle reader again. */
	cr_assert(efs_grpc_reader_is_idle(&r));
	cr_assert_eq(efs_grpc_reader_feed(&r, good, 5, sink_cb, &s), 0);
	cr_assert_eq(s.n, 1);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

Test(grpc, callback_error_stops_feeding_and_is_returned)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);
	struct efs_grpc_reader r;
	struct sink s;

	/* Fail on the 300-byte message, once whole in the chunk and once
	 * reassembled from pieces (buffered path). */
	for (int split = 0; split < 2; split++) {
		sink_init(&s);
		s.fail_at = 2;
		s.fail_err = -EBADMSG;
		efs_grpc_reader_init(&r, 1000);
		if (split) {
			cr_assert_eq(efs_grpc_reader_feed(&r, buf, n - 1, sink_cb, &s), 0);
			cr_assert_eq(efs_grpc_reader_feed(&r, buf + n - 1, 1, sink_cb, &s),
				     -EBADMSG);
		} else {
			cr_assert_eq(efs_grpc_reader_feed(&r, buf, n, sink_cb, &s), -EBADMSG);
		}
		cr_assert_eq(s.n, 2);
		efs_grpc_reader_done(&r);
		sink_done(&s);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, callback_error_on_the_first_message_skips_the_rest_of_the_chunk)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	s.fail_at = 0;
	s.fail_err = -EIO;
	efs_grpc_reader_init(&r, 1000);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, n, sink_cb, &s), -EIO);
	cr_assert_eq(s.n, 0);
	efs_grpc_reader_done(&r);
	efs_test_assert_no_leaks();
}

Test(grpc, reader_is_not_idle_inside_a_prefix_or_a_body)
{
	uint8_t buf[16];
	size_t n = put_frame(buf, 4, 0);
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 10);
	cr_assert(efs_grpc_reader_is_idle(&r));
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, 2, sink_cb, &s), 0);
	cr_assert(!efs_grpc_reader_is_idle(&r));
	cr_assert_eq(efs_grpc_reader_feed(&r, buf + 2, 5, sink_cb, &s), 0);
	cr_assert(!efs_grpc_reader_is_idle(&r));
	cr_assert_eq(efs_grpc_reader_feed(&r, buf + 7, n - 7, sink_cb, &s), 0);
	cr_assert(efs_grpc_reader_is_idle(&r));
	cr_assert_eq(s.n, 1);
	efs_grpc_reader_done(&r);
	sink_done(&s);
	efs_test_assert_no_leaks();
}

/* Leaves a reader holding a partial message and ends it; noinline so that
 * the reader's copy of the buffer pointer dies with this frame. */
__attribute__((noinline)) static void feed_partial_then_done(void)
{
	uint8_t buf[64];
	size_t n = put_frame(buf, 50, 0);
	struct efs_grpc_reader r;
	struct sink s;

	sink_init(&s);
	efs_grpc_reader_init(&r, 100);
	cr_assert_eq(efs_grpc_reader_feed(&r, buf, n - 10, sink_cb, &s), 0);
	cr_assert_not_null(r.buf);
	efs_grpc_reader_done(&r);
	cr_assert_null(r.buf);
	cr_assert(efs_grpc_reader_is_idle(&r));
}

Test(grpc, reader_done_mid_message_frees_the_partial_buffer)
{
	feed_partial_then_done();
	efs_test_assert_no_leaks();
}

/* The scenario of the sweep: every message split so the buffered path (the
 * only one that allocates) runs for each. */
static int reader_scenario(size_t *ret_msgs)
{
	uint8_t buf[400];
	size_t n = three_frames(buf);
	struct efs_grpc_reader r;
	struct sink s;
	int err = 0;

	sink_init(&s);
	efs_grpc_reader_init(&r, 1000);
	for (size_t off = 0; off < n && !err; off++)
		err = efs_grpc_reader_feed(&r, buf + off, 1, sink_cb, &s);
	efs_grpc_reader_done(&r);
	*ret_msgs = s.n;
	sink_done(&s);
	return err;
}

Test(grpc, reader_failmalloc_sweep_gives_enomem_at_every_allocation)
{
	size_t msgs;
	long count;

	efs_mem_fail_after(-1);
	cr_assert_eq(reader_scenario(&msgs), 0);
	cr_assert_eq(msgs, 3);
	count = efs_mem_count();
	/* One buffer each for the 1- and 300-byte messages. */
	cr_assert_eq(count, 2);
	for (long i = 0; i < count; i++) {
		efs_mem_fail_after(i);
		cr_assert_eq(reader_scenario(&msgs), -ENOMEM, "allocation %ld", i);
		cr_assert_lt(msgs, 3);
	}
	efs_mem_fail_after(count);
	cr_assert_eq(reader_scenario(&msgs), 0);
	efs_test_assert_no_leaks();
}

/* ---- Headers and trailers ---- */

static int hdr(struct efs_grpc_status *st, const char *name, const char *value)
{
	return efs_grpc_status_header(st, (const uint8_t *)name, strlen(name),
				      (const uint8_t *)value, strlen(value));
}

Test(grpc, normal_response_takes_status_from_the_trailers)
{
	struct efs_grpc_status st;

	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, ":status", "200"), 0);
	cr_assert_eq(hdr(&st, "content-type", "application/grpc"), 0);
	cr_assert_eq(hdr(&st, "access-control-allow-origin", "*"), 0);
	cr_assert_eq(st.code, -1);
	cr_assert_eq(hdr(&st, "grpc-status", "0"), 0);
	cr_assert_eq(hdr(&st, "grpc-status-details-bin", "AAAA"), 0);
	cr_assert_eq(efs_grpc_status_finish(&st), EFS_GRPC_OK);
	cr_assert_eq(st.http_status, 200);
	cr_assert(st.content_type_ok);
	cr_assert_str_eq(st.message, "");
	efs_test_assert_no_leaks();
}

Test(grpc, trailers_only_response_carries_code_and_decoded_message)
{
	struct efs_grpc_status st;

	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, ":status", "200"), 0);
	cr_assert_eq(hdr(&st, "content-type", "application/grpc+proto"), 0);
	cr_assert_eq(hdr(&st, "grpc-status", "14"), 0);
	cr_assert_eq(hdr(&st, "grpc-message", "etcdserver: no leader %2850%25%29"), 0);
	cr_assert_eq(efs_grpc_status_finish(&st), EFS_GRPC_UNAVAILABLE);
	cr_assert_str_eq(st.message, "etcdserver: no leader (50%)");
	cr_assert(st.content_type_ok);
	efs_test_assert_no_leaks();
}

Test(grpc, missing_grpc_status_after_200_is_unknown_with_a_message)
{
	struct efs_grpc_status st;

	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, ":status", "200"), 0);
	cr_assert_eq(hdr(&st, "content-type", "application/grpc"), 0);
	cr_assert_eq(efs_grpc_status_finish(&st), EFS_GRPC_UNKNOWN);
	cr_assert_eq(st.code, EFS_GRPC_UNKNOWN);
	cr_assert_not_null(strstr(st.message, "grpc-status"));
	efs_test_assert_no_leaks();
}

Test(grpc, missing_status_and_http_status_is_internal)
{
	struct efs_grpc_status st;

	efs_grpc_status_init(&st);
	cr_assert_eq(efs_grpc_status_finish(&st), EFS_GRPC_INTERNAL);
	cr_assert_not_null(strstr(st.message, ":status"));
	efs_test_assert_no_leaks();
}

Test(grpc, non_200_without_grpc_status_follows_the_http_table)
{
	static const struct {
		const char *http;
		int code;
	} rows[] = {
		{"400", EFS_GRPC_INTERNAL},     {"401", EFS_GRPC_UNAUTHENTICATED},
		{"403", EFS_GRPC_PERMISSION_DENIED}, {"404", EFS_GRPC_UNIMPLEMENTED},
		{"429", EFS_GRPC_UNAVAILABLE},  {"502", EFS_GRPC_UNAVAILABLE},
		{"503", EFS_GRPC_UNAVAILABLE},  {"504", EFS_GRPC_UNAVAILABLE},
		{"500", EFS_GRPC_UNKNOWN},      {"302", EFS_GRPC_UNKNOWN},
		{"100", EFS_GRPC_UNKNOWN},
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct efs_grpc_status st;

		efs_grpc_status_init(&st);
		cr_assert_eq(hdr(&st, ":status", rows[i].http), 0);
		cr_assert_eq(hdr(&st, "content-type", "text/html"), 0);
		cr_assert(!st.content_type_ok);
		cr_assert_eq(efs_grpc_status_finish(&st), rows[i].code, "HTTP %s", rows[i].http);
		cr_assert_not_null(strstr(st.message, rows[i].http));
	}
	efs_test_assert_no_leaks();
}

Test(grpc, grpc_status_wins_over_a_non_200_http_status)
{
	struct efs_grpc_status st;

	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, ":status", "503"), 0);
	cr_assert_eq(hdr(&st, "grpc-status", "5"), 0);
	cr_assert_eq(hdr(&st, "grpc-message", "etcdserver: requested lease not found"), 0);
	cr_assert_eq(efs_grpc_status_finish(&st), EFS_GRPC_NOT_FOUND);
	cr_assert_str_eq(st.message, "etcdserver: requested lease not found");
	efs_test_assert_no_leaks();
}

Test(grpc, malformed_grpc_status_values_are_eproto_and_leave_code_unset)
{
	static const char *bad[] = {"", "abc", "-1", "1x", " 1", "1 ", "+3", "1234567890", "0x1"};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct efs_grpc_status st;

		efs_grpc_status_init(&st);
		cr_assert_eq(hdr(&st, "grpc-status", bad[i]), -EPROTO, "value '%s'", bad[i]);
		cr_assert_eq(st.code, -1);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, unassigned_grpc_status_is_kept_and_maps_to_eproto)
{
	struct efs_grpc_status st;
	bool unknown;

	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, "grpc-status", "99"), 0);
	cr_assert_eq(efs_grpc_status_finish(&st), 99);
	cr_assert_eq(efs_grpc_status_to_errno(99, "", false, &unknown), -EPROTO);
	cr_assert(!unknown);
	efs_test_assert_no_leaks();
}

Test(grpc, malformed_http_status_values_are_eproto)
{
	static const char *bad[] = {"", "20", "2000", "abc", "099", "20x"};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct efs_grpc_status st;

		efs_grpc_status_init(&st);
		cr_assert_eq(hdr(&st, ":status", bad[i]), -EPROTO, "value '%s'", bad[i]);
		cr_assert_eq(st.http_status, 0);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, content_type_accepts_grpc_variants_only)
{
	static const struct {
		const char *v;
		bool ok;
	} rows[] = {
		{"application/grpc", true},      {"application/grpc+proto", true},
		{"Application/GRPC", true},      {"application/grpc;charset=utf-8", true},
		{"application/grpcx", false},    {"application/grp", false},
		{"application/json", false},     {"", false},
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct efs_grpc_status st;

		efs_grpc_status_init(&st);
		cr_assert_eq(hdr(&st, "content-type", rows[i].v), 0);
		cr_assert_eq(st.content_type_ok, rows[i].ok, "content-type '%s'", rows[i].v);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, header_names_match_exactly)
{
	struct efs_grpc_status st;

	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, "grpc-status-x", "zzz"), 0);
	cr_assert_eq(hdr(&st, "grpc-statu", "zzz"), 0);
	cr_assert_eq(hdr(&st, ":statusx", "zzz"), 0);
	cr_assert_eq(st.code, -1);
	cr_assert_eq(st.http_status, 0);
	efs_test_assert_no_leaks();
}

Test(grpc, rst_stream_codes_map_to_grpc_codes)
{
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_REFUSED_STREAM), EFS_GRPC_UNAVAILABLE);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_CANCEL), EFS_GRPC_CANCELLED);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_ENHANCE_YOUR_CALM),
		     EFS_GRPC_RESOURCE_EXHAUSTED);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_INADEQUATE_SECURITY),
		     EFS_GRPC_PERMISSION_DENIED);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_NO_ERROR), EFS_GRPC_INTERNAL);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_PROTOCOL_ERROR), EFS_GRPC_INTERNAL);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_INTERNAL_ERROR), EFS_GRPC_INTERNAL);
	cr_assert_eq(efs_grpc_code_from_rst(NGHTTP2_FLOW_CONTROL_ERROR), EFS_GRPC_INTERNAL);
	cr_assert_eq(efs_grpc_code_from_rst(0xdeadbeef), EFS_GRPC_INTERNAL);
	efs_test_assert_no_leaks();
}

/* ---- Percent-decoding ---- */

static const char *pdec(const char *in, size_t outsize, size_t *ret_len)
{
	static char out[64];

	*ret_len = efs_grpc_percent_decode((const uint8_t *)in, strlen(in), out, outsize);
	return out;
}

Test(grpc, percent_decode_decodes_valid_escapes_in_either_case)
{
	size_t n;

	cr_assert_str_eq(pdec("%41%62%7e%7E", 64, &n), "Ab~~");
	cr_assert_eq(n, 4);
	cr_assert_str_eq(pdec("100%25", 64, &n), "100%");
	cr_assert_str_eq(pdec("plain text", 64, &n), "plain text");
	cr_assert_eq(n, 10);
	cr_assert_str_eq(pdec("", 64, &n), "");
	cr_assert_eq(n, 0);
	efs_test_assert_no_leaks();
}

Test(grpc, percent_decode_keeps_truncated_and_invalid_escapes)
{
	size_t n;

	cr_assert_str_eq(pdec("%4", 64, &n), "%4");
	cr_assert_eq(n, 2);
	cr_assert_str_eq(pdec("abc%", 64, &n), "abc%");
	cr_assert_str_eq(pdec("%ZZ", 64, &n), "%ZZ");
	cr_assert_str_eq(pdec("%4G%41", 64, &n), "%4GA");
	cr_assert_str_eq(pdec("%%41", 64, &n), "%A");
	cr_assert_str_eq(pdec("%00x", 64, &n), "%00x");
	efs_test_assert_no_leaks();
}

Test(grpc, percent_decode_yields_utf8_and_passes_raw_non_ascii_through)
{
	size_t n;

	cr_assert_str_eq(pdec("caf%C3%A9", 64, &n), "caf\xc3\xa9");
	cr_assert_eq(n, 5);
	cr_assert_str_eq(pdec("raw \xe2\x82\xac", 64, &n), "raw \xe2\x82\xac");
	efs_test_assert_no_leaks();
}

Test(grpc, percent_decode_truncates_without_splitting_a_utf8_character)
{
	size_t n;

	cr_assert_str_eq(pdec("abcdef", 4, &n), "abc");
	cr_assert_eq(n, 3);
	/* "ab" + U+20AC (3 bytes): room for 4 bytes would cut the euro. */
	cr_assert_str_eq(pdec("ab%E2%82%AC", 5, &n), "ab");
	cr_assert_eq(n, 2);
	cr_assert_str_eq(pdec("ab%E2%82%AC", 6, &n), "ab\xe2\x82\xac");
	/* Whole characters right at the cut are kept. */
	cr_assert_str_eq(pdec("ab%E2%82%ACc", 6, &n), "ab\xe2\x82\xac");
	cr_assert_eq(n, 5);
	cr_assert_str_eq(pdec("a%C3%A9c", 4, &n), "a\xc3\xa9");
	/* U+1F600 is 4 bytes: with room for 4 bytes, "a" and 3 bytes of it fit, so
	 * the partial character is dropped. */
	cr_assert_str_eq(pdec("a%F0%9F%98%80", 5, &n), "a");
	cr_assert_str_eq(pdec("a%F0%9F%98%80", 6, &n), "a\xf0\x9f\x98\x80");
	/* Two-byte character cut after its lead byte. */
	cr_assert_str_eq(pdec("ab%C3%A9", 4, &n), "ab");
	cr_assert_str_eq(pdec("x", 1, &n), "");
	cr_assert_eq(n, 0);
	efs_test_assert_no_leaks();
}

Test(grpc, percent_decode_with_no_room_writes_nothing)
{
	char out[1] = {'Z'};

	cr_assert_eq(efs_grpc_percent_decode((const uint8_t *)"abc", 3, out, 0), 0);
	cr_assert_eq(out[0], 'Z');
	efs_test_assert_no_leaks();
}

Test(grpc, grpc_message_longer_than_the_buffer_is_truncated_and_terminated)
{
	struct efs_grpc_status st;
	char big[2000];

	memset(big, 'q', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, "grpc-message", big), 0);
	cr_assert_eq(strlen(st.message), EFS_GRPC_MESSAGE_MAX - 1);
	efs_test_assert_no_leaks();
}

/* ---- Status -> errno ---- */

struct row {
	int code;
	const char *msg;
	int err;
	bool unknown; /* for a sent mutation */
	bool auth_retry;
};

/* Every row of the status -> errno table (grpc.c) with etcd's exact texts,
 * plus every code's fallback. */
static const struct row rows[] = {
	{EFS_GRPC_OK, "", 0, false, false},
	{EFS_GRPC_CANCELLED, "context canceled", -ECANCELED, false, false},
	{EFS_GRPC_UNKNOWN, "etcdserver: unhealthy cluster", -EIO, true, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: request is too large", -EMSGSIZE, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: too many operations in txn request", -E2BIG,
	 false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request", -EINVAL,
	 false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: key is not provided", -EINVAL, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: key not found", -EINVAL, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: value is provided", -EINVAL, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: lease is provided", -EINVAL, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: revision of auth store is old", -EACCES, false,
	 true},
	{EFS_GRPC_INVALID_ARGUMENT, "etcdserver: user name is empty", -EACCES, false, true},
	{EFS_GRPC_INVALID_ARGUMENT,
	 "etcdserver: authentication failed, invalid user ID or password",
	 -EACCES, false, false},
	{EFS_GRPC_DEADLINE_EXCEEDED, "context deadline exceeded", -ETIMEDOUT, true, false},
	{EFS_GRPC_UNKNOWN, "etcdserver: too many requests", -EBUSY, false, false},
	{EFS_GRPC_UNKNOWN, "raft proposal dropped", -EAGAIN, false, false},
	{EFS_GRPC_UNKNOWN, "context deadline exceeded", -ETIMEDOUT, true, false},
	{EFS_GRPC_UNKNOWN, "context canceled", -ECANCELED, true, false},
	{EFS_GRPC_UNKNOWN, "some raw Go error", -EIO, true, false},
	{EFS_GRPC_NOT_FOUND, "etcdserver: requested lease not found", -ENOENT, false, false},
	{EFS_GRPC_ALREADY_EXISTS, "x", -EEXIST, false, false},
	{EFS_GRPC_PERMISSION_DENIED, "etcdserver: permission denied", -EPERM, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, "mvcc: database space exceeded", -ENOSPC, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, "etcdserver: too many requests", -EBUSY, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED,
	 "grpc: received message larger than max (3000000 vs. 2097152)", -EMSGSIZE, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, "", -ENOBUFS, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "etcdserver: lease already exists", -EEXIST, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "etcdserver: authentication is not enabled", -EOPNOTSUPP,
	 false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "etcdserver: user name not found", -ENOENT, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "etcdserver: invalid auth management", -EPERM, false,
	 false},
	{EFS_GRPC_ABORTED, "", -EAGAIN, false, false},
	{EFS_GRPC_OUT_OF_RANGE, "mvcc: required revision has been compacted", EFS_ETCD_ECOMPACTED,
	 false, false},
	{EFS_GRPC_OUT_OF_RANGE, "mvcc: required revision is a future revision",
	 EFS_ETCD_EFUTUREREV, false, false},
	{EFS_GRPC_OUT_OF_RANGE, "etcdserver: too large lease TTL", EFS_ETCD_ELEASETTL, false,
	 false},
	{EFS_GRPC_OUT_OF_RANGE, "something else", -EDOM, false, false},
	{EFS_GRPC_UNIMPLEMENTED, "unknown service etcdserverpb.Foo", -ENOSYS, false, false},
	{EFS_GRPC_INTERNAL, "", -EPROTO, true, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: request timed out", -ETIMEDOUT, true, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: request timed out, possibly due to previous leader "
			       "failure",
	 -ETIMEDOUT, true, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: request timed out, possibly due to connection lost",
	 -ETIMEDOUT, true, false},
	{EFS_GRPC_UNAVAILABLE,
	 "etcdserver: request timed out, waiting for the applied index took too long", -ETIMEDOUT,
	 false, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: no leader", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: leader changed", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: not capable", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: rpc not supported for learner", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "etcdserver: server stopped", -EAGAIN, true, false},
	{EFS_GRPC_UNAVAILABLE, "transport is closing", -ENOTCONN, true, false},
	{EFS_GRPC_DATA_LOSS, "etcdserver: corrupt cluster", -EIO, false, false},
	{EFS_GRPC_UNAUTHENTICATED, "etcdserver: invalid auth token", -EACCES, false, true},
	{EFS_GRPC_UNAUTHENTICATED, "", -EACCES, false, false},
};

Test(grpc, status_table_maps_every_documented_row)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		bool unknown = true;

		cr_assert_eq(efs_grpc_status_to_errno(rows[i].code, rows[i].msg, false, &unknown),
			     rows[i].err, "code %d '%s'", rows[i].code, rows[i].msg);
		cr_assert(!unknown, "code %d '%s': unknown without a sent mutation", rows[i].code,
			  rows[i].msg);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, status_table_marks_outcome_unknown_only_for_ambiguous_sent_mutations)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		bool unknown = !rows[i].unknown;

		cr_assert_eq(efs_grpc_status_to_errno(rows[i].code, rows[i].msg, true, &unknown),
			     rows[i].err);
		cr_assert_eq(unknown, rows[i].unknown, "code %d '%s'", rows[i].code, rows[i].msg);
	}
	efs_test_assert_no_leaks();
}

Test(grpc, auth_retry_is_exactly_the_token_errors)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		cr_assert_eq(efs_grpc_is_auth_retry(rows[i].code, rows[i].msg), rows[i].auth_retry,
			     "code %d '%s'", rows[i].code, rows[i].msg);
	/* The text alone is not enough: it must come with its code. */
	cr_assert(!efs_grpc_is_auth_retry(EFS_GRPC_UNKNOWN, "etcdserver: invalid auth token"));
	cr_assert(!efs_grpc_is_auth_retry(EFS_GRPC_UNAUTHENTICATED, NULL));
	efs_test_assert_no_leaks();
}

Test(grpc, named_errnos_are_distinct_from_each_other_and_from_the_rest_of_the_table)
{
	const int named[] = {EFS_ETCD_ECOMPACTED, EFS_ETCD_EFUTUREREV, EFS_ETCD_ELEASETTL};

	for (size_t a = 0; a < 3; a++) {
		cr_assert_lt(named[a], 0);
		for (size_t b = a + 1; b < 3; b++)
			cr_assert_neq(named[a], named[b]);
		for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
			if (rows[i].code == EFS_GRPC_OUT_OF_RANGE)
				continue;
			cr_assert_neq(rows[i].err, named[a], "code %d '%s'", rows[i].code,
				      rows[i].msg);
		}
	}
	efs_test_assert_no_leaks();
}

Test(grpc, status_table_tolerates_null_message_and_null_unknown_pointer)
{
	bool unknown = false;

	cr_assert_eq(efs_grpc_status_to_errno(EFS_GRPC_UNAVAILABLE, NULL, true, &unknown),
		     -ENOTCONN);
	cr_assert(unknown);
	cr_assert_eq(efs_grpc_status_to_errno(EFS_GRPC_RESOURCE_EXHAUSTED, NULL, false, NULL),
		     -ENOBUFS);
	cr_assert_eq(efs_grpc_status_to_errno(EFS_GRPC_OK, NULL, true, &unknown), 0);
	cr_assert(!unknown);
	efs_test_assert_no_leaks();
}

Test(grpc, unknown_codes_are_eproto_and_ambiguous_for_sent_mutations)
{
	bool unknown = false;

	cr_assert_eq(efs_grpc_status_to_errno(17, "x", true, &unknown), -EPROTO);
	cr_assert(unknown);
	cr_assert_eq(efs_grpc_status_to_errno(-1, "x", false, &unknown), -EPROTO);
	cr_assert(!unknown);
	cr_assert_eq(efs_grpc_status_to_errno(1000000, "", false, &unknown), -EPROTO);
	efs_test_assert_no_leaks();
}

Test(grpc, synthesised_statuses_map_sensibly)
{
	struct efs_grpc_status st;
	bool unknown;

	/* A 503 from a proxy: retryable elsewhere, unknown for a sent write. */
	efs_grpc_status_init(&st);
	cr_assert_eq(hdr(&st, ":status", "503"), 0);
	cr_assert_eq(efs_grpc_status_to_errno(efs_grpc_status_finish(&st), st.message, true,
					      &unknown),
		     -ENOTCONN);
	cr_assert(unknown);
	/* RST_STREAM(REFUSED_STREAM) carries no text. */
	cr_assert_eq(efs_grpc_status_to_errno(efs_grpc_code_from_rst(NGHTTP2_REFUSED_STREAM), "",
					      false, &unknown),
		     -ENOTCONN);
	efs_test_assert_no_leaks();
}

/* ---- grpc-timeout ---- */

static const char *tmo(uint64_t ms)
{
	static char buf[16];
	size_t n = efs_grpc_format_timeout(ms, buf);

	cr_assert_eq(n, strlen(buf));
	cr_assert_leq(n, 9); /* 8 digits and a unit */
	return buf;
}

Test(grpc, timeout_uses_milliseconds_while_they_fit_in_eight_digits)
{
	cr_assert_str_eq(tmo(1), "1m");
	cr_assert_str_eq(tmo(1500), "1500m");
	cr_assert_str_eq(tmo(99999999), "99999999m");
	efs_test_assert_no_leaks();
}

Test(grpc, timeout_of_zero_is_sent_as_one_millisecond)
{
	cr_assert_str_eq(tmo(0), "1m");
	efs_test_assert_no_leaks();
}

Test(grpc, timeout_moves_to_coarser_units_rounding_up)
{
	cr_assert_str_eq(tmo(100000000), "100000S");
	cr_assert_str_eq(tmo(100000001), "100001S");
	cr_assert_str_eq(tmo(99999999000ull), "99999999S");
	cr_assert_str_eq(tmo(99999999001ull), "1666667M");
	cr_assert_str_eq(tmo(99999999ull * 60000), "99999999M");
	cr_assert_str_eq(tmo(99999999ull * 60000 + 1), "1666667H");
	cr_assert_str_eq(tmo(99999999ull * 3600000), "99999999H");
	efs_test_assert_no_leaks();
}

Test(grpc, timeout_saturates_beyond_the_largest_encodable_value)
{
	cr_assert_str_eq(tmo(99999999ull * 3600000 + 1), "99999999H");
	cr_assert_str_eq(tmo(UINT64_MAX), "99999999H");
	efs_test_assert_no_leaks();
}

/* ---- Backoff ---- */

static void check_jittered(uint32_t got, uint64_t nominal)
{
	uint64_t lo = nominal - nominal / 5, hi = nominal + nominal / 5;

	cr_assert(got >= lo && got <= hi, "%u not in [%llu, %llu]", got, (unsigned long long)lo,
		  (unsigned long long)hi);
}

Test(grpc, backoff_doubles_from_base_until_the_cap)
{
	struct efs_backoff b;
	uint64_t want = 100;

	efs_backoff_init(&b, 100, 5000, 42);
	for (int i = 0; i < 12; i++) {
		check_jittered(efs_backoff_next(&b), want);
		want = want * 2 > 5000 ? 5000 : want * 2;
	}
	cr_assert_eq(want, 5000);
	efs_test_assert_no_leaks();
}

Test(grpc, backoff_jitter_stays_within_twenty_percent_and_spreads)
{
	struct efs_backoff b;
	uint32_t lo = UINT32_MAX, hi = 0;
	uint64_t sum = 0;
	const int draws = 20000;

	efs_backoff_init(&b, 1000, 1000, 7);
	for (int i = 0; i < draws; i++) {
		uint32_t d = efs_backoff_next(&b);

		check_jittered(d, 1000);
		lo = d < lo ? d : lo;
		hi = d > hi ? d : hi;
		sum += d;
	}
	/* Uniform over [800, 1200]: both ends are reached and the mean is
	 * near the middle. */
	cr_assert_leq(lo, 805);
	cr_assert_geq(hi, 1195);
	cr_assert(sum / draws > 990 && sum / draws < 1010, "mean %llu",
		  (unsigned long long)(sum / draws));
	efs_test_assert_no_leaks();
}

Test(grpc, backoff_reset_starts_again_from_base)
{
	struct efs_backoff b;

	efs_backoff_init(&b, 10, 100000, 3);
	for (int i = 0; i < 10; i++)
		efs_backoff_next(&b);
	check_jittered(efs_backoff_next(&b), 10240);
	efs_backoff_reset(&b);
	cr_assert_eq(b.attempt, 0);
	check_jittered(efs_backoff_next(&b), 10);
	check_jittered(efs_backoff_next(&b), 20);
	efs_test_assert_no_leaks();
}

Test(grpc, backoff_survives_huge_attempt_counts_without_overflow)
{
	struct efs_backoff b;

	efs_backoff_init(&b, UINT32_MAX, UINT32_MAX, 1);
	for (uint32_t a = 30; a < 70; a++) {
		b.attempt = a;
		/* 1.2 x UINT32_MAX saturates rather than wrapping to a short
		 * delay. */
		cr_assert_geq(efs_backoff_next(&b), UINT32_MAX - UINT32_MAX / 5);
	}
	efs_backoff_init(&b, 25, 2000, 1);
	b.attempt = UINT32_MAX;
	check_jittered(efs_backoff_next(&b), 2000);
	cr_assert_eq(b.attempt, UINT32_MAX);
	check_jittered(efs_backoff_next(&b), 2000);
	efs_test_assert_no_leaks();
}

Test(grpc, backoff_with_base_above_cap_is_capped_from_the_start)
{
	struct efs_backoff b;

	efs_backoff_init(&b, 5000, 300, 9);
	check_jittered(efs_backoff_next(&b), 300);
	efs_test_assert_no_leaks();
}

Test(grpc, backoff_is_deterministic_per_seed_and_seed_zero_still_jitters)
{
	struct efs_backoff a, b;
	bool differs = false;
	uint32_t first;

	efs_backoff_init(&a, 1000, 1000, 0);
	efs_backoff_init(&b, 1000, 1000, 0);
	cr_assert_neq(a.rng, 0);
	first = efs_backoff_next(&a);
	cr_assert_eq(efs_backoff_next(&b), first);
	for (int i = 0; i < 100; i++) {
		uint32_t x = efs_backoff_next(&a);

		cr_assert_eq(efs_backoff_next(&b), x);
		differs |= x != first;
	}
	cr_assert(differs);
	efs_backoff_init(&b, 1000, 1000, 1);
	differs = false;
	efs_backoff_init(&a, 1000, 1000, 0);
	for (int i = 0; i < 10; i++)
		differs |= efs_backoff_next(&a) != efs_backoff_next(&b);
	cr_assert(differs);
	efs_test_assert_no_leaks();
}
