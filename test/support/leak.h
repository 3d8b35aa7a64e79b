/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Leak checking for Criterion tests. Criterion runs each test in a forked
 * worker that ends without LeakSanitizer's exit-time check, and neither a
 * failed assertion nor a crash (abort) in .fini fails a test: Criterion only
 * warns and still reports "ok". So a test that has freed everything it
 * allocated (clients, watchers, leases, its harness) ends its body with
 * efs_test_assert_no_leaks(): under ASan or LSan, any heap block that
 * nothing reachable points to any more fails the test. The failure message
 * carries the start of LeakSanitizer's report (sizes and allocation stacks:
 * with --tap=- Criterion sends a worker's stderr to /dev/null), and the
 * whole report also goes to stderr. Without a sanitizer it checks nothing.
 *
 * It is a macro that must be used in the test body itself, not in a helper
 * the body calls: it zeroes the dead stack below the body's frame, where the
 * test's callees left stale copies of pointers, so that a leaked block is
 * not kept "reachable" by such a copy, and runs the check below that area.
 * (A helper's own frame would sit in that dead area, with uninitialised
 * slots that can hold such copies.) Each use takes 256 KiB of stack (an
 * alloca) until the test function returns: in a loop, call it only a few
 * times (the worker's stack is 8 MiB).
 *
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
#include <sys/mman.h>
#include <unistd.h>

#include <sanitizer/lsan_interface.h>

/* Dead stack below the test body that is zeroed before the check. */
#define EFS_TEST_SCRUB_BYTES (256 * 1024)

/*
 * Returns the number of leaks LeakSanitizer finds now (0: none) and points
 * *|ret_report| at the start of its report (static storage, "" when there
 * is none), caught by pointing fd 2 at a memfd during the check; the whole
 * report is then copied to the real fd 2. First it makes one allocation and
 * frees it, so that nothing the allocator still holds from the test's last
 * allocation masks a leak.
 */
__attribute__((noinline, unused)) static int efs_test_leak_check(const char **ret_report)
{
	static char report[6144];
	static char buf[4096];
	void *volatile churn = malloc(64);
	int fd, saved = -1, leaks;
	off_t off = 0;
	ssize_t n = 0;

	free(churn);
	churn = NULL;
	report[0] = '\0';
	*ret_report = report;
	fd = memfd_create("lsan-report", MFD_CLOEXEC);
	if (fd >= 0)
		saved = dup(2);
	if (saved >= 0 && dup2(fd, 2) < 0) {
		close(saved);
		saved = -1;
	}
	leaks = __lsan_do_recoverable_leak_check();
	if (saved >= 0) {
		(void)dup2(saved, 2);
		close(saved);
		n = pread(fd, report, sizeof(report) - 1, 0);
		report[n > 0 ? n : 0] = '\0';
		while ((n = pread(fd, buf, sizeof(buf), off)) > 0) {
			(void)!write(2, buf, (size_t)n);
			off += n;
		}
	}
	if (fd >= 0)
		close(fd);
	return leaks;
}

/*
 * The scrub area is an alloca in the test body's own frame: it covers the
 * dead frames of the test's callees, and the check's frames lie below it.
 */
#define efs_test_assert_no_leaks()                                                        \
	do {                                                                               \
		volatile unsigned long *efs_scrub_ = __builtin_alloca(EFS_TEST_SCRUB_BYTES);  \
		const char *efs_leak_report_ = "";                                         \
		int efs_leaks_;                                                            \
                                                                                           \
		for (size_t efs_i_ = 0; efs_i_ < EFS_TEST_SCRUB_BYTES / sizeof(*efs_scrub_);  \
		     efs_i_++)                                                             \
			efs_scrub_[efs_i_] = 0;                                            \
		efs_leaks_ = efs_test_leak_check(&efs_leak_report_);                       \
		cr_assert_eq(efs_leaks_, 0, "LeakSanitizer found a leak (report truncated):\n%s", \
			     efs_leak_report_);                                            \
	} while (0)
#else
#define efs_test_assert_no_leaks() ((void)0)
#endif
