/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Process and file helpers shared by the test fixtures (the mount fixture
 * under Criterion, the cluster fixture under TAP): no assertions here, so
 * that each fixture fails in its own way.
 */
#ifndef ETCFS_TEST_SUPPORT_PROC_H
#define ETCFS_TEST_SUPPORT_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/types.h>

uint64_t efs_tp_now_ms(void); /* CLOCK_MONOTONIC */
void efs_tp_sleep_ms(unsigned ms);

/* The build root: $ETCFS_BUILD_ROOT, else three levels above the test
 * binary (<build>/test/<suite>/<exe>). NULL when neither can be found. */
const char *efs_tp_build_root(void);

/* The last |max| - 1 bytes of |path| into |buf| (empty if unreadable). */
void efs_tp_file_tail(const char *path, char *buf, size_t max);

/* Runs |argv| with stdin, stdout and stderr on /dev/null; its exit status,
 * or -1. */
int efs_tp_run_quiet(const char *const *argv);

/* fusermount3 -u (or -uz when |lazy|) |dir|: its exit status. */
int efs_tp_fusermount(const char *dir, bool lazy);

/* Waits up to |ms| for |pid|: 1 when it exited (status in *st), 0 if not,
 * -1 on error. */
int efs_tp_wait_pid(pid_t pid, int *st, uint64_t ms);

/* Runs |path| with |argv| (stdin on /dev/null, stdout and stderr into
 * |out|, NUL-terminated, truncated to fit) and waits for it, at most
 * |timeout_ms|: its exit status, -1 when it could not run or died of a
 * signal, -2 when it was killed at the bound. Reads what a background
 * child left in the pipe after the command exits. */
int efs_tp_run_capture(const char *path, const char *const *argv, char *out, size_t out_size,
		       uint64_t timeout_ms);

/* Runs the build's tool |path| (etcfsctl, fsck.etcfs, mkfs.etcfs: |cmd|)
 * with --endpoints |endpoints| and |args| (NULL-terminated; etcfsctl's
 * subcommand stays first), as efs_tp_run_capture; -3 when the arguments
 * do not fit. */
int efs_tp_run_tool(const char *path, const char *cmd, const char *endpoints,
		    const char *const *args, char *out, size_t out_size, uint64_t timeout_ms);

/* Copies the NULL-terminated const char * arguments of |ap| into |args|
 * (room for |max|, the NULL included): their count, or -1 when too many. */
int efs_tp_collect_args(const char **args, int max, va_list ap);

/* Whether etcfsd logged its own readiness ("info: mounted ...") into |log|
 * after offset |from|. */
bool efs_tp_logged_ready(const char *log, off_t from);

/* The HOST:PORT of the last "listening on http://HOST:PORT/metrics" that
 * etcfsd wrote into |log| after offset |from|, into |addr| (|size| bytes):
 * false (|addr| empty) when there is none yet. */
bool efs_tp_metrics_addr(const char *log, off_t from, char *addr, size_t size);

/* The text of http://|addr|/metrics (the body, one sample a line) into
 * *ret, to free(). 0, or a negative errno (5 s bound per step). */
int efs_tp_metrics_get(const char *addr, char **ret);

/* The value of |sample| (a metric's name and labels as /metrics prints
 * them) from http://|addr|/metrics, into *value (-1 when absent). 0, or
 * a negative errno when it cannot be read. */
int efs_tp_metric(const char *addr, const char *sample, double *value);

/* Removes |dir| and everything below it, not crossing mount points. */
void efs_tp_rm_tree(const char *dir);

#endif
