/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "etcd/keys.h"
#include "util/mem.h"

#include "../support/leak.h"

TestSuite(keys, .fini = efs_mem_fail_reset, .timeout = 30);

static size_t pend(const char *p, size_t len, uint8_t *out)
{
	memset(out, 0xaa, 16);
	return efs_etcd_prefix_end((const uint8_t *)p, len, out);
}

/* ---- Prefix end ---- */

Test(keys, prefix_end_increments_the_last_byte)
{
	uint8_t out[16];

	cr_assert_eq(pend("abc", 3, out), 3);
	cr_assert_eq(memcmp(out, "abd", 3), 0);
	cr_assert_eq(pend("/fs/", 4, out), 4);
	cr_assert_eq(memcmp(out, "/fs0", 4), 0);
	cr_assert_eq(pend("\x00", 1, out), 1);
	cr_assert_eq(out[0], 1);
	cr_assert_eq(pend("a\xfe", 2, out), 2);
	cr_assert_eq(memcmp(out, "a\xff", 2), 0);
	efs_test_assert_no_leaks();
}

Test(keys, prefix_end_drops_trailing_ff_bytes_and_carries)
{
	uint8_t out[16];

	cr_assert_eq(pend("a\xff", 2, out), 1);
	cr_assert_eq(out[0], 'b');
	cr_assert_eq(pend("ab\xff\xff\xff", 5, out), 2);
	cr_assert_eq(memcmp(out, "ac", 2), 0);
	cr_assert_eq(pend("\x01\xff", 2, out), 1);
	cr_assert_eq(out[0], 2);
	efs_test_assert_no_leaks();
}

Test(keys, prefix_end_of_all_ff_or_empty_is_a_single_zero_byte)
{
	uint8_t out[16];

	cr_assert_eq(pend("\xff\xff", 2, out), 1);
	cr_assert_eq(out[0], 0);
	cr_assert_eq(pend("\xff", 1, out), 1);
	cr_assert_eq(out[0], 0);
	cr_assert_eq(pend("", 0, out), 1);
	cr_assert_eq(out[0], 0);
	efs_test_assert_no_leaks();
}

Test(keys, prefix_end_bounds_exactly_the_keys_with_the_prefix)
{
	/* Every 2-byte key k with prefix {p} satisfies p <= k < end, and
	 * every other key falls outside; for p = 0xff the end is "\0",
	 * i.e. unbounded. */
	for (unsigned p = 0; p < 256; p++) {
		uint8_t pre[1] = {(uint8_t)p}, end[1];
		size_t elen = efs_etcd_prefix_end(pre, 1, end);

		for (unsigned a = 0; a < 256; a += 5) {
			for (unsigned b = 0; b < 256; b += 51) {
				uint8_t key[2] = {(uint8_t)a, (uint8_t)b};
				bool in = efs_etcd_key_cmp(key, 2, pre, 1) >= 0 &&
					  (p == 0xff || efs_etcd_key_cmp(key, 2, end, elen) < 0);

				cr_assert_eq(in, efs_etcd_key_has_prefix(key, 2, pre, 1),
					     "prefix %u key %u,%u", p, a, b);
			}
		}
	}
	efs_test_assert_no_leaks();
}

Test(keys, prefix_end_may_work_in_place)
{
	uint8_t buf[3] = {'x', 0xff, 0xff};

	cr_assert_eq(efs_etcd_prefix_end(buf, 3, buf), 1);
	cr_assert_eq(buf[0], 'y');
	efs_test_assert_no_leaks();
}

Test(keys, prefix_end_dup_allocates_the_same_result)
{
	ProtobufCBinaryData d = {0, NULL};

	cr_assert_eq(efs_etcd_prefix_end_dup((const uint8_t *)"k\xff", 2, &d), 0);
	cr_assert_eq(d.len, 1);
	cr_assert_eq(d.data[0], 'l');
	efs_mem_free(d.data);
	cr_assert_eq(efs_etcd_prefix_end_dup(NULL, 0, &d), 0);
	cr_assert_eq(d.len, 1);
	cr_assert_eq(d.data[0], 0);
	efs_mem_free(d.data);
	efs_test_assert_no_leaks();
}

Test(keys, dup_helpers_report_enomem_and_leave_outputs_untouched)
{
	ProtobufCBinaryData d = {7, (uint8_t *)"x"};
	struct efs_etcd_key k;
	uint8_t buf[8];

	efs_mem_fail_after(0);
	cr_assert_eq(efs_etcd_prefix_end_dup((const uint8_t *)"a", 1, &d), -ENOMEM);
	cr_assert_eq(efs_etcd_next_key_dup((const uint8_t *)"a", 1, &d), -ENOMEM);
	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_str(&k, "ab"), 0);
	cr_assert_eq(efs_etcd_key_dup(&k, &d), -ENOMEM);
	cr_assert_eq(d.len, 7);
	cr_assert_str_eq((const char *)d.data, "x");
	efs_test_assert_no_leaks();
}

/* ---- Next key ---- */

Test(keys, next_key_appends_one_zero_byte)
{
	uint8_t out[8];
	size_t n = 0;

	cr_assert_eq(efs_etcd_next_key((const uint8_t *)"abc", 3, out, 4, &n), 0);
	cr_assert_eq(n, 4);
	cr_assert_eq(memcmp(out, "abc\0", 4), 0);
	/* It sorts right after the key and before any longer key. */
	cr_assert_gt(efs_etcd_key_cmp(out, n, (const uint8_t *)"abc", 3), 0);
	cr_assert_lt(efs_etcd_key_cmp(out, n, (const uint8_t *)"abc\x01", 4), 0);
	cr_assert_lt(efs_etcd_key_cmp(out, n, (const uint8_t *)"abd", 3), 0);
	efs_test_assert_no_leaks();
}

Test(keys, next_key_without_room_is_e2big_and_writes_nothing)
{
	uint8_t out[3] = {9, 9, 9};
	size_t n = 42;

	cr_assert_eq(efs_etcd_next_key((const uint8_t *)"abc", 3, out, 3, &n), -E2BIG);
	cr_assert_eq(n, 42);
	cr_assert_eq(out[0], 9);
	cr_assert_eq(efs_etcd_next_key(NULL, 0, out, 0, &n), -E2BIG);
	cr_assert_eq(efs_etcd_next_key(NULL, 0, out, 1, &n), 0);
	cr_assert_eq(n, 1);
	cr_assert_eq(out[0], 0);
	efs_test_assert_no_leaks();
}

Test(keys, next_key_dup_allocates_key_plus_zero)
{
	ProtobufCBinaryData d;

	cr_assert_eq(efs_etcd_next_key_dup((const uint8_t *)"k\xff", 2, &d), 0);
	cr_assert_eq(d.len, 3);
	cr_assert_eq(memcmp(d.data, "k\xff\0", 3), 0);
	efs_mem_free(d.data);
	efs_test_assert_no_leaks();
}

/* ---- Order ---- */

Test(keys, key_cmp_is_unsigned_bytewise_with_shorter_prefix_first)
{
	cr_assert_lt(efs_etcd_key_cmp((const uint8_t *)"a", 1, (const uint8_t *)"b", 1), 0);
	cr_assert_lt(efs_etcd_key_cmp((const uint8_t *)"a", 1, (const uint8_t *)"a\0", 2), 0);
	cr_assert_lt(efs_etcd_key_cmp((const uint8_t *)"\x7f", 1, (const uint8_t *)"\x80", 1),
		     0);
	cr_assert_gt(efs_etcd_key_cmp((const uint8_t *)"\xff", 1, (const uint8_t *)"a", 1), 0);
	cr_assert_eq(efs_etcd_key_cmp((const uint8_t *)"ab", 2, (const uint8_t *)"ab", 2), 0);
	cr_assert_eq(efs_etcd_key_cmp(NULL, 0, NULL, 0), 0);
	cr_assert_lt(efs_etcd_key_cmp(NULL, 0, (const uint8_t *)"", 1), 0);
	efs_test_assert_no_leaks();
}

Test(keys, has_prefix_checks_length_and_bytes)
{
	cr_assert(efs_etcd_key_has_prefix((const uint8_t *)"abc", 3, (const uint8_t *)"ab", 2));
	cr_assert(efs_etcd_key_has_prefix((const uint8_t *)"abc", 3, (const uint8_t *)"abc", 3));
	cr_assert(efs_etcd_key_has_prefix((const uint8_t *)"abc", 3, NULL, 0));
	cr_assert(!efs_etcd_key_has_prefix((const uint8_t *)"ab", 2, (const uint8_t *)"abc", 3));
	cr_assert(!efs_etcd_key_has_prefix((const uint8_t *)"abc", 3, (const uint8_t *)"b", 1));
	efs_test_assert_no_leaks();
}

/* ---- Big-endian ---- */

Test(keys, be32_and_be64_round_trip_with_the_most_significant_byte_first)
{
	uint8_t b[8];

	efs_etcd_be32_put(b, 0x01020304u);
	cr_assert_eq(memcmp(b, "\x01\x02\x03\x04", 4), 0);
	cr_assert_eq(efs_etcd_be32_get(b), 0x01020304u);
	efs_etcd_be64_put(b, 0x0102030405060708ull);
	cr_assert_eq(memcmp(b, "\x01\x02\x03\x04\x05\x06\x07\x08", 8), 0);
	cr_assert_eq(efs_etcd_be64_get(b), 0x0102030405060708ull);
	efs_etcd_be64_put(b, UINT64_MAX);
	cr_assert_eq(efs_etcd_be64_get(b), UINT64_MAX);
	efs_etcd_be32_put(b, UINT32_MAX);
	cr_assert_eq(efs_etcd_be32_get(b), UINT32_MAX);
	efs_test_assert_no_leaks();
}

/* Deterministic pseudo-random values that hit every byte position. */
static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s >> (*s & 63);
}

Test(keys, big_endian_encodings_sort_bytewise_in_numeric_order)
{
	uint64_t s = 88172645463325252ull;

	for (int i = 0; i < 20000; i++) {
		uint64_t a = next_rand(&s), b = next_rand(&s);
		uint8_t ea[8], eb[8];
		int c;

		efs_etcd_be64_put(ea, a);
		efs_etcd_be64_put(eb, b);
		c = efs_etcd_key_cmp(ea, 8, eb, 8);
		cr_assert_eq(c < 0, a < b, "%llu vs %llu", (unsigned long long)a,
			     (unsigned long long)b);
		cr_assert_eq(c == 0, a == b);
		efs_etcd_be32_put(ea, (uint32_t)a);
		efs_etcd_be32_put(eb, (uint32_t)b);
		c = efs_etcd_key_cmp(ea, 4, eb, 4);
		cr_assert_eq(c < 0, (uint32_t)a < (uint32_t)b);
	}
	efs_test_assert_no_leaks();
}

Test(keys, signed_encoding_sorts_negatives_first_and_round_trips)
{
	const int64_t v[] = {INT64_MIN, INT64_MIN + 1, -256, -1, 0, 1, 255, 256, INT64_MAX};
	uint8_t prev[8], cur[8];

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		efs_etcd_be64s_put(cur, v[i]);
		cr_assert_eq(efs_etcd_be64s_get(cur), v[i], "value %lld", (long long)v[i]);
		if (i > 0)
			cr_assert_lt(efs_etcd_key_cmp(prev, 8, cur, 8), 0, "value %lld",
				     (long long)v[i]);
		memcpy(prev, cur, 8);
	}
	efs_test_assert_no_leaks();
}

Test(keys, get_integer_from_key_checks_bounds)
{
	const uint8_t key[] = {'i', 0, 0, 0, 0, 0, 0, 1, 2, 0xaa};
	uint64_t v64 = 5;
	uint32_t v32 = 5;

	cr_assert_eq(efs_etcd_key_get_u64(key, sizeof(key), 1, &v64), 0);
	cr_assert_eq(v64, 0x102);
	cr_assert_eq(efs_etcd_key_get_u64(key, sizeof(key), 2, &v64), 0);
	cr_assert_eq(efs_etcd_key_get_u64(key, sizeof(key), 3, &v64), -EINVAL);
	cr_assert_eq(efs_etcd_key_get_u64(key, sizeof(key), SIZE_MAX, &v64), -EINVAL);
	cr_assert_eq(efs_etcd_key_get_u32(key, sizeof(key), 6, &v32), 0);
	cr_assert_eq(v32, 0x000102aa);
	cr_assert_eq(efs_etcd_key_get_u32(key, sizeof(key), 7, &v32), -EINVAL);
	cr_assert_eq(v32, 0x000102aa);
	cr_assert_eq(efs_etcd_key_get_u32(key, 3, 0, &v32), -EINVAL);
	cr_assert_eq(efs_etcd_key_get_u32(key, sizeof(key), SIZE_MAX - 1, &v32), -EINVAL);
	efs_test_assert_no_leaks();
}

/* ---- Builder ---- */

Test(keys, builder_concatenates_prefix_and_segments)
{
	uint8_t buf[64];
	struct efs_etcd_key k;

	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_str(&k, "fs1/d/"), 0);
	cr_assert_eq(efs_etcd_key_add_u64(&k, 0x1122334455667788ull), 0);
	cr_assert_eq(efs_etcd_key_add_str(&k, "/"), 0);
	cr_assert_eq(efs_etcd_key_add_name(&k, "hello.txt"), 0);
	cr_assert_eq(efs_etcd_key_add_u32(&k, 7), 0);
	cr_assert_eq(efs_etcd_key_add(&k, "\xff", 1), 0);
	cr_assert_eq(k.len, 6 + 8 + 1 + 9 + 4 + 1);
	cr_assert_eq(memcmp(buf,
			    "fs1/d/\x11\x22\x33\x44\x55\x66\x77\x88/hello.txt\0\0\0\x07\xff",
			    k.len),
		     0);
	cr_assert_eq(k.err, 0);
	efs_test_assert_no_leaks();
}

Test(keys, builder_overflow_is_e2big_sticky_and_keeps_the_key)
{
	uint8_t buf[8];
	struct efs_etcd_key k;
	ProtobufCBinaryData d = {0, NULL};

	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_str(&k, "abcd"), 0);
	cr_assert_eq(efs_etcd_key_add_u64(&k, 1), -E2BIG);
	cr_assert_eq(k.len, 4);
	/* It sticks even though four bytes would now fit. */
	cr_assert_eq(efs_etcd_key_add_u32(&k, 1), -E2BIG);
	cr_assert_eq(efs_etcd_key_add_name(&k, "x"), -E2BIG);
	cr_assert_eq(k.len, 4);
	cr_assert_eq(k.err, -E2BIG);
	cr_assert_eq(efs_etcd_key_dup(&k, &d), -E2BIG);
	cr_assert_null(d.data);
	efs_test_assert_no_leaks();
}

Test(keys, builder_fills_to_exactly_its_capacity)
{
	uint8_t buf[12];
	struct efs_etcd_key k;

	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_u64(&k, 1), 0);
	cr_assert_eq(efs_etcd_key_add_u32(&k, 2), 0);
	cr_assert_eq(k.len, 12);
	cr_assert_eq(efs_etcd_key_add(&k, "", 0), 0);
	cr_assert_eq(efs_etcd_key_add(&k, "z", 1), -E2BIG);
	efs_test_assert_no_leaks();
}

Test(keys, builder_name_longer_than_name_max_is_enametoolong)
{
	uint8_t buf[1024];
	char name[EFS_ETCD_NAME_MAX + 2];
	struct efs_etcd_key k;

	memset(name, 'n', sizeof(name));
	name[EFS_ETCD_NAME_MAX] = '\0';
	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_name(&k, name), 0);
	cr_assert_eq(k.len, EFS_ETCD_NAME_MAX);
	name[EFS_ETCD_NAME_MAX] = 'n';
	name[EFS_ETCD_NAME_MAX + 1] = '\0';
	cr_assert_eq(efs_etcd_key_add_name(&k, name), -ENAMETOOLONG);
	cr_assert_eq(k.len, EFS_ETCD_NAME_MAX);
	cr_assert_eq(efs_etcd_key_add_str(&k, "x"), -ENAMETOOLONG);
	efs_test_assert_no_leaks();
}

Test(keys, builder_name_must_be_non_empty_and_slash_free)
{
	uint8_t buf[64];
	struct efs_etcd_key k;

	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_name(&k, ""), -EINVAL);
	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_name(&k, "a/b"), -EINVAL);
	cr_assert_eq(k.len, 0);
	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_name(&k, "\xc3\xa9t\xc3\xa9"), 0);
	efs_test_assert_no_leaks();
}

Test(keys, builder_name_that_does_not_fit_is_e2big)
{
	uint8_t buf[4];
	struct efs_etcd_key k;

	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_name(&k, "abcde"), -E2BIG);
	cr_assert_eq(k.len, 0);
	efs_test_assert_no_leaks();
}

Test(keys, builder_dup_copies_the_bytes)
{
	uint8_t buf[16];
	struct efs_etcd_key k;
	ProtobufCBinaryData d;

	efs_etcd_key_init(&k, buf, sizeof(buf));
	cr_assert_eq(efs_etcd_key_add_str(&k, "p/"), 0);
	cr_assert_eq(efs_etcd_key_add_u32(&k, 0x01020304), 0);
	cr_assert_eq(efs_etcd_key_dup(&k, &d), 0);
	cr_assert_eq(d.len, 6);
	cr_assert_neq(d.data, buf);
	cr_assert_eq(memcmp(d.data, "p/\x01\x02\x03\x04", 6), 0);
	efs_mem_free(d.data);
	efs_test_assert_no_leaks();
}

Test(keys, builder_keys_with_integers_sort_numerically_under_a_prefix)
{
	uint8_t a[32], b[32], end[32];
	struct efs_etcd_key ka, kb;
	size_t elen;

	for (uint32_t i = 0; i < 300; i++) {
		efs_etcd_key_init(&ka, a, sizeof(a));
		efs_etcd_key_init(&kb, b, sizeof(b));
		efs_etcd_key_add_str(&ka, "ino/");
		efs_etcd_key_add_str(&kb, "ino/");
		efs_etcd_key_add_u32(&ka, i * 1000);
		cr_assert_eq(efs_etcd_key_add_u32(&kb, i * 1000 + 999), 0);
		cr_assert_lt(efs_etcd_key_cmp(a, ka.len, b, kb.len), 0);
		elen = efs_etcd_prefix_end((const uint8_t *)"ino/", 4, end);
		cr_assert_lt(efs_etcd_key_cmp(b, kb.len, end, elen), 0);
	}
	efs_test_assert_no_leaks();
}
