/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stat_names ROOT TAG N mean|median
 *
 * The data benchmark's missing-name figure: stat(2) of N names that do not
 * exist, ROOT/dXXX/missing-TAG-I with XXX = I mod 100, each timed alone
 * with CLOCK_MONOTONIC around the call; prints the mean or the median in
 * µs. ROOT/d000 is stat'ed first, untimed, so that the root's own lookup
 * is not in the figure. A name that exists, or any error other than
 * ENOENT, ends it with status 1.
 *
 * In C, not Python: a name the kernel answers from its negative dentry
 * costs about a microsecond, and an interpreter's call and exception would
 * be most of what was measured.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	char path[4096];
	struct stat st;
	double *v, sum = 0;
	long n;

	if (argc != 5 || (strcmp(argv[4], "mean") != 0 && strcmp(argv[4], "median") != 0)) {
		fprintf(stderr, "usage: stat_names ROOT TAG N mean|median\n");
		return 2;
	}
	n = strtol(argv[3], NULL, 10);
	if (n <= 0 || n > 1000000) {
		fprintf(stderr, "stat_names: N must be 1..1000000\n");
		return 2;
	}
	v = calloc((size_t)n, sizeof(*v));
	if (!v) {
		perror("stat_names");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/d000", argv[1]);
	if (stat(path, &st) < 0) {
		fprintf(stderr, "stat_names: %s: %s\n", path, strerror(errno));
		return 1;
	}
	for (long i = 0; i < n; i++) {
		double t0, t1;
		int r, e;

		snprintf(path, sizeof(path), "%s/d%03ld/missing-%s-%ld", argv[1], i % 100,
			 argv[2], i);
		t0 = now_us();
		r = stat(path, &st);
		e = errno;
		t1 = now_us();
		if (r == 0) {
			fprintf(stderr, "stat_names: missing name exists: %s\n", path);
			return 1;
		}
		if (e != ENOENT) {
			fprintf(stderr, "stat_names: %s: %s\n", path, strerror(e));
			return 1;
		}
		v[i] = t1 - t0;
		sum += v[i];
	}
	if (strcmp(argv[4], "median") == 0) {
		qsort(v, (size_t)n, sizeof(*v), cmp_double);
		printf("%.1f\n", n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
	} else {
		printf("%.1f\n", sum / (double)n);
	}
	free(v);
	return 0;
}
