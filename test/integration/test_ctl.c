/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsctl's newer output against a real mount: stats (the per-second view
 * read from the node's /metrics at the address its session record
 * publishes: --count, --interval, --json, and a clear refusal for a node
 * without a session), status --json, df --json and etcd-check --json.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "../support/mount.h"

static struct efs_test_fs fs;

static void fini(void)
{
	efs_test_fs_stop(&fs);
}

TestSuite(ctl, .fini = fini, .timeout = 90);

static size_t count_of(const char *s, const char *needle)
{
	size_t n = 0;

	for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* A child that writes and fsyncs small files until killed. */
static pid_t busy_writer(void)
{
	pid_t pid = fork();

	cr_assert_geq(pid, 0);
	if (pid == 0) {
		char path[512], buf[8192];

		memset(buf, 'w', sizeof(buf));
		for (int i = 0;; i++) {
			int fd;

			snprintf(path, sizeof(path), "%s/busy%d", fs.mnt, i % 50);
			fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
			if (fd < 0)
				_exit(1);
			if (write(fd, buf, sizeof(buf)) < 0 || fsync(fd) < 0)
				_exit(1);
			close(fd);
		}
	}
	return pid;
}

Test(ctl, stats_status_df)
{
	struct efs_test_fs_opts o = {.image_size = 64ull << 20, .metrics = true};
	static char out[65536];
	pid_t w;
	int r, st;

	efs_test_fs_start(&fs, &o);
	w = busy_writer();
	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "stats", "--json", "--count", "3",
			    "--interval", "0.5", fs.image, NULL);
	kill(w, SIGTERM);
	waitpid(w, &st, 0);
	cr_assert_eq(r, 0, "stats --json: status %d:\n%s", r, out);
	cr_assert_eq(count_of(out, "\"ops_per_s\":"), 3, "three samples expected:\n%s", out);
	cr_assert(strstr(out, "\"node\":\"node1\""), "%s", out);
	cr_assert(strstr(out, "\"sample\":3"), "%s", out);
	/* The writer was busy: some sample saw operations and commits. */
	cr_assert_eq(strstr(out, "\"ops_per_s\":0.0,") == NULL ||
			     count_of(out, "\"ops_per_s\":0.0,") < 3,
		     true, "no operation counted while a writer ran:\n%s", out);

	/* Human lines, named by --name and NODE. */
	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "stats", "--count", "2",
			    "--interval", "0.2", "--name", "testfs", "node1", NULL);
	cr_assert_eq(r, 0, "stats: status %d:\n%s", r, out);
	cr_assert(strstr(out, "OPS/s") && strstr(out, "COMMIT/s") && strstr(out, "DEV-WR/s"),
		  "%s", out);
	cr_assert_eq(count_of(out, "\n"), 3, "a header and two lines expected:\n%s", out);

	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "stats", "--count", "1",
			    "--name", "testfs", "nosuchnode", NULL);
	cr_assert_eq(r, 4, "stats of a node without a session: status %d:\n%s", r, out);
	cr_assert(strstr(out, "node nosuchnode has no session"), "%s", out);

	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "status", "--json", fs.image,
			    NULL);
	cr_assert_eq(r, 0, "status --json: status %d:\n%s", r, out);
	cr_assert(strstr(out, "\"filesystem\":\"testfs\""), "%s", out);
	cr_assert(strstr(out, "\"node\":\"node1\""), "%s", out);
	cr_assert(strstr(out, "\"metrics_addr\":\"127.0.0.1:"), "%s", out);
	cr_assert(strstr(out, "\"lease_ttl_s\":"), "%s", out);

	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "df", "--json", "--name", "testfs",
			    NULL);
	cr_assert_eq(r, 0, "df --json: status %d:\n%s", r, out);
	cr_assert(strstr(out, "\"free_blocks\":") && strstr(out, "\"groups\":63"), "%s", out);

	/* etcd-check --json: the report on stderr, the object on stdout (both
	 * captured here); fit or unfit depends on this machine's load. */
	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "etcd-check", "--json",
			    "--duration", "0.5", "--samples", "10", NULL);
	cr_assert(r == 0 || r == 1, "etcd-check --json: status %d:\n%s", r, out);
	cr_assert(strstr(out, "{\"verdict\":\""), "%s", out);
	cr_assert(strstr(out, "\"throughput\":{\"concurrency\":16"), "%s", out);
}
