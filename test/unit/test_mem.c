/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <criterion/criterion.h>

#include "util/mem.h"

#include "../support/leak.h"

TestSuite(mem, .fini = efs_mem_fail_reset, .timeout = 10);

Test(mem, fail_after_fails_exactly_from_the_nth_allocation)
{
	void *a, *b;

	efs_mem_fail_after(1);
	a = efs_mem_malloc(16);
	cr_assert_not_null(a);
	b = efs_mem_malloc(16);
	cr_assert_null(b);
	cr_assert_null(efs_mem_strdup("x"));
	cr_assert_eq(efs_mem_count(), 3);
	efs_mem_fail_reset();
	b = efs_mem_strdup("abc");
	cr_assert_str_eq(b, "abc");
	efs_mem_free(a);
	efs_mem_free(b);
	efs_test_assert_no_leaks();
}

Test(mem, strndup_stops_at_nul_and_at_n)
{
	char *s = efs_mem_strndup("abcdef", 3);

	cr_assert_str_eq(s, "abc");
	efs_mem_free(s);
	s = efs_mem_strndup("ab\0cd", 5);
	cr_assert_str_eq(s, "ab");
	efs_mem_free(s);
	efs_test_assert_no_leaks();
}

Test(mem, protobuf_and_nghttp2_tables_route_through_the_counter)
{
	ProtobufCAllocator *pa = efs_mem_protobuf();
	nghttp2_mem *nm = efs_mem_nghttp2();
	void *p;

	efs_mem_fail_after(0);
	cr_assert_null(pa->alloc(pa->allocator_data, 8));
	cr_assert_null(nm->malloc(8, nm->mem_user_data));
	efs_mem_fail_reset();
	p = pa->alloc(pa->allocator_data, 8);
	cr_assert_not_null(p);
	pa->free(pa->allocator_data, p);
	efs_test_assert_no_leaks();
}

Test(mem, reserve_doubles_from_eight_and_keeps_the_array_on_failure)
{
	uint32_t *v = NULL;
	size_t cap = 0;

	cr_assert_eq(efs_mem_reserve(&v, &cap, 0, sizeof(*v)), 0);
	cr_assert_null(v);
	cr_assert_eq(efs_mem_reserve(&v, &cap, 1, sizeof(*v)), 0);
	cr_assert_eq(cap, 8);
	v[0] = 7;
	cr_assert_eq(efs_mem_reserve(&v, &cap, 8, sizeof(*v)), 0);
	cr_assert_eq(cap, 8);
	cr_assert_eq(efs_mem_reserve(&v, &cap, 9, sizeof(*v)), 0);
	cr_assert_eq(cap, 16);
	cr_assert_eq(efs_mem_reserve(&v, &cap, 100, sizeof(*v)), 0);
	cr_assert_eq(cap, 128);
	cr_assert_eq(v[0], 7);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_mem_reserve(&v, &cap, 129, sizeof(*v)), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(cap, 128);
	cr_assert_eq(v[0], 7);
	cr_assert_eq(efs_mem_reserve(&v, &cap, SIZE_MAX / 2, sizeof(*v)), -ENOMEM);
	cr_assert_eq(cap, 128);
	efs_mem_free(v);
	efs_test_assert_no_leaks();
}

Test(mem, reserve_exact_grows_to_the_count_asked_for)
{
	uint64_t *v = NULL;
	size_t cap = 0;

	cr_assert_eq(efs_mem_reserve_exact(&v, &cap, 3, sizeof(*v)), 0);
	cr_assert_eq(cap, 3);
	v[2] = 9;
	cr_assert_eq(efs_mem_reserve_exact(&v, &cap, 2, sizeof(*v)), 0);
	cr_assert_eq(cap, 3);
	efs_mem_fail_after(0);
	cr_assert_eq(efs_mem_reserve_exact(&v, &cap, 5, sizeof(*v)), -ENOMEM);
	efs_mem_fail_reset();
	cr_assert_eq(cap, 3);
	cr_assert_eq(efs_mem_reserve_exact(&v, &cap, SIZE_MAX / 4, sizeof(*v)), -ENOMEM);
	cr_assert_eq(efs_mem_reserve_exact(&v, &cap, 5, sizeof(*v)), 0);
	cr_assert_eq(cap, 5);
	cr_assert_eq(v[2], 9);
	efs_mem_free(v);
	efs_test_assert_no_leaks();
}
