/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Leak checking for Criterion tests. Criterion runs each test in a forked
 * worker that ends without LeakSanitizer's exit-time check, and neither a
 * failed assertion nor a crash (abort) in .fini fails a test: Criterion only
 * warns on stderr and still reports "ok". So a test that has freed
 * everything it allocated (clients, watchers, leases, its harness) ends its
 * body with efs_test_assert_no_leaks(): under ASan or LSan, any heap block
 * that nothing reachable points to any more fails the test, with
 * LeakSanitizer's report (allocation stacks) on stderr. Without a
 * sanitizer it checks nothing.
 *
 * Call it from the test body itself, not from a helper the body calls: a
 * helper's frame sits where the test's earlier callees were, and stale
 * copies of a leaked pointer in its uninitialised slots would hide the leak.
 * Include this file by relative path: #include "../support/leak.h".
 */

#include <criterion/criterion.h>

#if defined(__SANITIZE_ADDRESS__)
#define EFS_TEST_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define EFS_TEST_HAVE_LSAN 1
#endif
#endif

#ifdef EFS_TEST_HAVE_LSAN
#include <stdlib.h>

#include <sanitizer/lsan_interface.h>

/*
 * Returns the number of leaks LeakSanitizer finds now (0: none). First one
 * allocation and free, so that nothing the allocator or a register still
 * holds from the test's last allocation masks it, then it zeroes the dead
 * stack below the caller (a real stack array: no ASan fake stack), where
 * deeper frames of the test and of the library were, so that stale copies
 * of a leaked pointer there do not look like roots to the check, whose own
 * frames reuse that memory uninitialised.
 */
__attribute__((noinline, no_sanitize_address, unused)) static int efs_test_leak_check(void)
{
	volatile char pad[128 * 1024];
	void *volatile churn = malloc(64);

	free(churn);
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = 0;
	return __lsan_do_recoverable_leak_check();
}

#define efs_test_assert_no_leaks()                                                        \
	cr_assert_eq(efs_test_leak_check(), 0,                                            \
		     "LeakSanitizer found a leak (its report with allocation stacks is "  \
		     "on stderr)")
#else
#define efs_test_assert_no_leaks() ((void)0)
#endif
