/* SPDX-License-Identifier: Apache-2.0 */
/* Process and file helpers shared by the test fixtures (proc.h). */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t efs_tp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void efs_tp_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

const char *efs_tp_build_root(void)
{
	static char root[PATH_MAX];
	const char *env = getenv("ETCFS_BUILD_ROOT");
	char exe[PATH_MAX];
	ssize_t n;

	if (env && *env)
		return env;
	if (root[0])
		return root;
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return NULL;
	exe[n] = '\0';
	for (int i = 0; i < 3; i++) {
		char *slash = strrchr(exe, '/');

		if (!slash)
			return NULL;
		*slash = '\0';
	}
	snprintf(root, sizeof(root), "%s", exe);
	return root;
}

void efs_tp_file_tail(const char *path, char *buf, size_t max)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	off_t size;
	ssize_t n;

	buf[0] = '\0';
	if (fd < 0)
		return;
	size = lseek(fd, 0, SEEK_END);
	lseek(fd, size > (off_t)max - 1 ? size - (off_t)max + 1 : 0, SEEK_SET);
	n = read(fd, buf, max - 1);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
}

int efs_tp_run_quiet(const char *const *argv)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -1;
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);

		if (null >= 0) {
			dup2(null, STDIN_FILENO);
			dup2(null, STDOUT_FILENO);
			dup2(null, STDERR_FILENO);
		}
		execvp(argv[0], (char *const *)argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int efs_tp_fusermount(const char *dir, bool lazy)
{
	const char *argv[] = {"fusermount3", lazy ? "-uz" : "-u", dir, NULL};

	return efs_tp_run_quiet(argv);
}

int efs_tp_wait_pid(pid_t pid, int *st, uint64_t ms)
{
	uint64_t end = efs_tp_now_ms() + ms;

	for (;;) {
		pid_t r = waitpid(pid, st, WNOHANG);

		if (r == pid)
			return 1;
		if (r < 0 && errno != EINTR)
			return -1;
		if (efs_tp_now_ms() >= end)
			return 0;
		efs_tp_sleep_ms(10);
	}
}

int efs_tp_run_capture(const char *path, const char *const *argv, char *out, size_t out_size,
		       uint64_t timeout_ms)
{
	uint64_t deadline;
	bool exited = false;
	size_t used = 0;
	int pfd[2], st = 0;
	pid_t pid;

	if (out && out_size)
		out[0] = '\0';
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return -1;
	}
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (null >= 0)
			dup2(null, STDIN_FILENO);
		dup2(pfd[1], STDOUT_FILENO);
		dup2(pfd[1], STDERR_FILENO);
		execv(path, (char *const *)argv);
		dprintf(pfd[1], "exec %s: %s\n", path, strerror(errno));
		_exit(127);
	}
	close(pfd[1]);
	fcntl(pfd[0], F_SETFL, O_NONBLOCK);
	/* Read until the command exits, then what it left in the pipe: a
	 * daemon it started in the background may keep the write end open. */
	deadline = efs_tp_now_ms() + timeout_ms;
	for (;;) {
		struct pollfd p = {.fd = pfd[0], .events = POLLIN};
		char buf[4096];
		ssize_t n;

		if (!exited && waitpid(pid, &st, WNOHANG) == pid)
			exited = true;
		if (poll(&p, 1, exited ? 0 : 50) > 0) {
			n = read(pfd[0], buf, sizeof(buf));
			if (n > 0) {
				size_t k = out && out_size > used + 1 ? out_size - used - 1 : 0;

				if (k > (size_t)n)
					k = (size_t)n;
				if (k) {
					memcpy(out + used, buf, k);
					used += k;
					out[used] = '\0';
				}
				continue;
			}
			if (n == 0 && !exited) {
				waitpid(pid, &st, 0);
				exited = true;
			}
		}
		if (exited)
			break;
		if (efs_tp_now_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			close(pfd[0]);
			return -2;
		}
	}
	close(pfd[0]);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int efs_tp_run_tool(const char *path, const char *cmd, const char *endpoints,
		    const char *const *args, char *out, size_t out_size, uint64_t timeout_ms)
{
	const char *argv[64];
	int argc = 0;

	argv[argc++] = path;
	if (strcmp(cmd, "etcfsctl") == 0 && args[0])
		argv[argc++] = *args++;
	argv[argc++] = "--endpoints";
	argv[argc++] = endpoints;
	for (; *args; args++) {
		if (argc == 63)
			return -3;
		argv[argc++] = *args;
	}
	argv[argc] = NULL;
	return efs_tp_run_capture(path, argv, out, out_size, timeout_ms);
}

int efs_tp_collect_args(const char **args, int max, va_list ap)
{
	int n = 0;

	for (const char *a; (a = va_arg(ap, const char *));) {
		if (n == max - 1)
			return -1;
		args[n++] = a;
	}
	args[n] = NULL;
	return n;
}

static int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return type == FTW_DP ? rmdir(path) : unlink(path);
}

void efs_tp_rm_tree(const char *dir)
{
	nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}
