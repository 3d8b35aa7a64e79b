/* SPDX-License-Identifier: Apache-2.0 */
/* Process and file helpers shared by the test fixtures (proc.h). */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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

/* What |log| holds after |from| (at most |size| - 1 bytes) into |buf|,
 * NUL-terminated: false when nothing. */
static bool log_since(const char *log, off_t from, char *buf, size_t size)
{
	int fd = open(log, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	buf[0] = '\0';
	if (fd < 0)
		return false;
	n = pread(fd, buf, size - 1, from);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	return true;
}

bool efs_tp_logged_ready(const char *log, off_t from)
{
	char buf[16384];

	return log_since(log, from, buf, sizeof(buf)) && strstr(buf, "info: mounted ") != NULL;
}

bool efs_tp_metrics_addr(const char *log, off_t from, char *addr, size_t size)
{
	static const char tag[] = "listening on http://";
	char buf[16384], *p, *last = NULL, *end;

	addr[0] = '\0';
	if (!log_since(log, from, buf, sizeof(buf)))
		return false;
	for (p = buf; (p = strstr(p, tag)); p += sizeof(tag) - 1)
		last = p + sizeof(tag) - 1;
	end = last ? strstr(last, "/metrics") : NULL;
	if (!end || (size_t)(end - last) >= size)
		return false;
	memcpy(addr, last, (size_t)(end - last));
	addr[end - last] = '\0';
	return true;
}

/* Connects to |addr| (HOST:PORT, [V6]:PORT): the socket or -errno. */
static int metrics_connect(const char *addr)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	char host[128], *port;
	int fd, e;

	snprintf(host, sizeof(host), "%s", addr);
	port = strrchr(host, ':');
	if (!port)
		return -EINVAL;
	*port++ = '\0';
	if (host[0] == '[') {
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = '\0';
	}
	if (getaddrinfo(host, port, &hints, &ai) != 0)
		return -EHOSTUNREACH;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	e = fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 ? -errno : 0;
	freeaddrinfo(ai);
	if (e < 0) {
		if (fd >= 0)
			close(fd);
		return e;
	}
	return fd;
}

int efs_tp_metrics_get(const char *addr, char **ret)
{
	size_t len = 0, cap = 0;
	char *body = NULL, *p;
	int fd = metrics_connect(addr), e = 0;

	*ret = NULL;
	if (fd < 0)
		return fd;
	if (dprintf(fd, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr) < 0)
		e = -EIO;
	while (e == 0) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (cap - len < 4096) {
			char *nb = realloc(body, (cap ? cap * 2 : 65536) + 1);

			if (!nb) {
				e = -ENOMEM;
				break;
			}
			body = nb;
			cap = cap ? cap * 2 : 65536;
		}
		if (poll(&pf, 1, 5000) <= 0) {
			e = -ETIMEDOUT;
			break;
		}
		n = read(fd, body + len, cap - len);
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (e == 0 && !body)
		e = -EIO;
	if (e < 0) {
		free(body);
		return e;
	}
	body[len] = '\0';
	/* The samples follow the headers. */
	p = strstr(body, "\r\n\r\n");
	if (!p) {
		free(body);
		return -EPROTO;
	}
	memmove(body, p + 4, strlen(p + 4) + 1);
	*ret = body;
	return 0;
}

int efs_tp_metric(const char *addr, const char *sample, double *value)
{
	size_t slen = strlen(sample);
	char *body, *p;
	int e = efs_tp_metrics_get(addr, &body);

	*value = -1;
	if (e < 0)
		return e;
	for (p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, sample, slen) == 0 && p[slen] == ' ') {
			*value = strtod(p + slen + 1, NULL);
			break;
		}
	}
	free(body);
	return 0;
}
