/* SPDX-License-Identifier: Apache-2.0 */
#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define SHM_ROOT	       "/dev/shm"
#define DIR_PREFIX	       "etcfs-harness-"
#define DETACHED_PREFIX	       "etcfs-harness-detached-"
#define DEFAULT_ETCD	       "/usr/bin/etcd"
#define DEFAULT_ETCDCTL	       "/usr/bin/etcdctl"
#define DEFAULT_OPENSSL	       "/usr/bin/openssl"
#define DEFAULT_ROOT_PW	       "etcfs-root-pw"
#define DEFAULT_USER_PW	       "etcfs-user-pw"
#define DEFAULT_CLIENT_CN      "etcfs-client"
#define DEFAULT_RETENTION      "1h"
#define USER_ROLE	       "etcfs-rw"
#define START_ATTEMPTS	       4
#define DEFAULT_START_MS       20000
#define STOP_GRACE_MS	       3000
#define HTTP_TIMEOUT_MS	       2000
#define CMD_TIMEOUT_MS	       15000
#define SIGSTOP_WAIT_MS	       3000
#define POLL_MS		       20
#define MAX_EXTRA_ARGS	       32
#define MAX_CLIENT_ADDRS       4
#define MAX_ARGS	       (48 + MAX_EXTRA_ARGS)

struct member {
	pid_t pid; /* 0 when dead */
	enum efs_harness_member_state state;
	int client_port;
	int peer_port;
	int metrics_port;
	char *name;
	char *client_url;
	char *peer_url;
	char *metrics_url;
	char *hostport;
	char *data_dir;
	char *log_path;
	char *out_path;
};

struct efs_harness {
	int n;
	pid_t owner; /* process that may stop the members (atexit guard) */
	bool detached;
	bool attached; /* members are not our children */
	bool tls;
	bool client_cert_auth;
	bool auth;
	bool auto_compaction;
	bool fsync;
	long long quota_bytes;
	int auth_token_ttl_s;
	int heartbeat_ms;
	int election_ms;
	int start_timeout_ms;
	int n_extra;
	char *extra[MAX_EXTRA_ARGS];
	int n_client_addrs; /* extra client addresses */
	char *client_addrs[MAX_CLIENT_ADDRS];
	char *listen_addr;
	char *url_host; /* listen_addr, bracketed when IPv6 */
	char *retention;
	char *client_cn;
	char *root_pw;
	char *user;
	char *user_pw;
	char *user_prefix;
	char *dir;
	char *token;
	char *initial_cluster;
	char *endpoints;
	char *tls_dir;
	char *cacert;
	char *cakey;
	char *server_cert;
	char *server_key;
	char *client_cert;
	char *client_key;
	char *state_dir; /* attached: removed with the cluster */
	struct member m[EFS_HARNESS_MAX_MEMBERS];
	struct efs_harness *next_live;
};

static struct efs_harness *live_list;
static bool atexit_done;
static unsigned dir_counter;

/* Small helpers. */

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;
	int r;

	va_start(ap, fmt);
	r = vasprintf(&s, fmt, ap);
	va_end(ap);
	return r < 0 ? NULL : s;
}

static char *xstrdup_or(const char *s, const char *dflt)
{
	const char *v = s ? s : dflt;

	return v ? strdup(v) : NULL;
}

static const char *tool_path(const char *env, const char *dflt)
{
	const char *p = getenv(env);

	return p && *p ? p : dflt;
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if (flag == FTW_DP || flag == FTW_D)
		(void)rmdir(path);
	else
		(void)unlink(path);
	return 0;
}

static void rm_rf(const char *path)
{
	if (path)
		(void)nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int write_file(const char *path, const char *content)
{
	size_t len = strlen(content), off = 0;
	int fd, r = 0;

	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	while (off < len) {
		ssize_t w = write(fd, content + off, len - off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			r = -errno;
			break;
		}
		off += (size_t)w;
	}
	if (close(fd) < 0 && r == 0)
		r = -errno;
	return r;
}

/* Reads a whole (small) file; NULL with errno set on failure. */
static char *read_file(const char *path, size_t max)
{
	size_t cap = 4096, len = 0;
	char *buf, *nb;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	buf = malloc(cap);
	if (!buf)
		goto fail;
	for (;;) {
		ssize_t r;

		if (len + 1 >= cap) {
			if (cap >= max)
				break;
			cap *= 2;
			nb = realloc(buf, cap);
			if (!nb)
				goto fail;
			buf = nb;
		}
		r = read(fd, buf + len, cap - len - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			goto fail;
		if (r == 0)
			break;
		len += (size_t)r;
	}
	buf[len] = '\0';
	close(fd);
	return buf;
fail:
	free(buf);
	close(fd);
	return NULL;
}

static bool file_contains(const char *path, const char *needle)
{
	char *s = read_file(path, 8 << 20);
	bool found = s && strstr(s, needle);

	free(s);
	return found;
}

static void print_tail(const char *path, size_t bytes)
{
	char *s = read_file(path, 8 << 20);
	size_t len;

	if (!s)
		return;
	len = strlen(s);
	fprintf(stderr, "etcd-harness: --- last lines of %s ---\n%s\n", path,
		len > bytes ? s + len - bytes : s);
	free(s);
}

/*
 * Environment for etcd and etcdctl: the caller's, minus ETCD_* and
 * ETCDCTL_* (etcd reads ETCD_<FLAG> as flags, and a sourced CLI env file
 * must not steer a test's members), plus |extra| if not NULL.
 */
static char **clean_env(const char *extra)
{
	size_t n = 0, k = 0;
	char **env;

	while (environ && environ[n])
		n++;
	env = calloc(n + 2, sizeof(*env));
	if (!env)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (!strncmp(environ[i], "ETCD_", 5) || !strncmp(environ[i], "ETCDCTL_", 8))
			continue;
		env[k++] = environ[i];
	}
	if (extra)
		env[k++] = (char *)extra;
	env[k] = NULL;
	return env;
}

/*
 * Child side of every spawn; only async-signal-safe calls. Resets the
 * signal state inherited from the test (blocked masks and ignored signals
 * survive exec), closes every descriptor except 0-2 and |errfd|, and reports
 * an exec failure through |errfd|.
 */
static void __attribute__((noreturn))
child_exec(const char *path, char *const argv[], char *const envp[], int in_fd, int out_fd,
	   int errfd, pid_t parent, bool die_with_parent, bool new_session)
{
	sigset_t all;
	int e, in2, out2;

	/*
	 * Move our descriptors above 2 first: a test that closed its stdin
	 * may have handed us fd 0 for one of them.
	 */
	errfd = fcntl(errfd, F_DUPFD_CLOEXEC, 3);
	in2 = fcntl(in_fd, F_DUPFD_CLOEXEC, 3);
	out2 = fcntl(out_fd, F_DUPFD_CLOEXEC, 3);
	if (errfd < 0 || in2 < 0 || out2 < 0)
		_exit(127);
	if (die_with_parent) {
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
			_exit(127);
	}
	if (new_session)
		(void)setsid();
	sigemptyset(&all);
	sigprocmask(SIG_SETMASK, &all, NULL);
	for (int s = 1; s < NSIG; s++) {
		if (s != SIGKILL && s != SIGSTOP)
			signal(s, SIG_DFL);
	}
	if (dup2(in2, 0) < 0 || dup2(out2, 1) < 0 || dup2(out2, 2) < 0)
		goto fail;
	/* Everything else the test holds (Criterion's pipes, sockets) stays out. */
	if (errfd > 3)
		(void)close_range(3, (unsigned)errfd - 1, 0);
	(void)close_range((unsigned)errfd + 1, ~0U, 0);
	execve(path, argv, envp);
fail:
	e = errno;
	while (write(errfd, &e, sizeof(e)) < 0 && errno == EINTR)
		;
	_exit(127);
}

/*
 * Forks and execs |path|; stdin from /dev/null, stdout+stderr to |out_fd|.
 * Returns the PID, or -errno (the exec's errno when exec failed; the child
 * is reaped then).
 */
static pid_t spawn(const char *path, char *const argv[], char *const envp[], int out_fd,
		   bool die_with_parent, bool new_session)
{
	pid_t parent = getpid(), pid;
	int p[2], in_fd, e = 0;
	ssize_t r;

	in_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (in_fd < 0)
		return -errno;
	if (pipe2(p, O_CLOEXEC) < 0) {
		e = -errno;
		close(in_fd);
		return e;
	}
	pid = fork();
	if (pid < 0) {
		e = -errno;
		close(p[0]);
		close(p[1]);
		close(in_fd);
		return e;
	}
	if (pid == 0)
		child_exec(path, argv, envp, in_fd, out_fd, p[1], parent, die_with_parent,
			   new_session);
	close(p[1]);
	close(in_fd);
	do {
		r = read(p[0], &e, sizeof(e));
	} while (r < 0 && errno == EINTR);
	close(p[0]);
	if (r == (ssize_t)sizeof(e)) {
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		return -e;
	}
	return pid;
}

/*
 * Runs |argv| to completion with output captured, bounded by |timeout_ms|
 * (then SIGKILL and -ETIMEDOUT). Returns the exit status (128+signal when
 * killed by a signal) or -errno.
 */
static int run_capture(const char *path, char *const argv[], char *const envp[], int timeout_ms,
		       char **ret_out)
{
	long long deadline = now_ms() + timeout_ms;
	size_t cap = 4096, len = 0;
	char *buf, *nb;
	int p[2], status, r;
	pid_t pid;

	buf = malloc(cap);
	if (!buf)
		return -ENOMEM;
	if (pipe2(p, O_CLOEXEC) < 0) {
		r = -errno;
		free(buf);
		return r;
	}
	pid = spawn(path, argv, envp, p[1], true, false);
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		free(buf);
		return pid;
	}
	r = 0;
	for (;;) {
		struct pollfd pfd = {.fd = p[0], .events = POLLIN};
		long long left = deadline - now_ms();
		ssize_t n;

		if (left <= 0) {
			r = -ETIMEDOUT;
			break;
		}
		if (poll(&pfd, 1, (int)left) < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			break;
		}
		if (len + 1024 > cap) {
			nb = realloc(buf, cap * 2);
			if (!nb) {
				r = -ENOMEM;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		n = read(p[0], buf + len, cap - len - 1);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(p[0]);
	buf[len] = '\0';
	if (r < 0)
		kill(pid, SIGKILL);
	while (waitpid(pid, &status, 0) < 0) {
		if (errno != EINTR) {
			r = r < 0 ? r : -errno;
			break;
		}
	}
	if (r == 0)
		r = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
	if (ret_out && r >= 0)
		*ret_out = buf;
	else
		free(buf);
	return r;
}

/* Minimal HTTP/1.0 GET over plaintext. */

static int wait_fd(int fd, short events, long long deadline)
{
	struct pollfd pfd = {.fd = fd, .events = events};

	for (;;) {
		long long left = deadline - now_ms();
		int r;

		if (left <= 0)
			return -ETIMEDOUT;
		r = poll(&pfd, 1, (int)left);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return -errno;
	}
}

/*
 * GETs http://|host|:|port||path|; returns the HTTP status and the body in
 * *|ret_body| (free()), or -errno.
 */
static int http_get(const char *host, int port, const char *path, int timeout_ms, char **ret_body)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
	long long deadline = now_ms() + timeout_ms;
	size_t cap = 64 * 1024, len = 0, off = 0, reqlen;
	struct addrinfo *ai = NULL;
	char portstr[16], req[256], *buf = NULL, *nb, *body;
	int fd = -1, r, status, err;
	socklen_t elen = sizeof(err);

	snprintf(portstr, sizeof(portstr), "%d", port);
	if (getaddrinfo(host, portstr, &hints, &ai) != 0 || !ai)
		return -EINVAL;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			r = -errno;
			goto out;
		}
		r = wait_fd(fd, POLLOUT, deadline);
		if (r < 0)
			goto out;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0) {
			r = -errno;
			goto out;
		}
		if (err) {
			r = -err;
			goto out;
		}
	}
	reqlen = (size_t)snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: %s:%d\r\n\r\n", path,
				  host, port);
	while (off < reqlen) {
		ssize_t w = write(fd, req + off, reqlen - off);

		if (w < 0 && errno == EAGAIN) {
			r = wait_fd(fd, POLLOUT, deadline);
			if (r < 0)
				goto out;
			continue;
		}
		if (w < 0 && errno != EINTR) {
			r = -errno;
			goto out;
		}
		if (w > 0)
			off += (size_t)w;
	}
	r = -ENOMEM;
	buf = malloc(cap);
	if (!buf)
		goto out;
	for (;;) {
		ssize_t n;

		if (len + 1 >= cap) {
			nb = realloc(buf, cap * 2);
			if (!nb)
				goto out;
			buf = nb;
			cap *= 2;
		}
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EAGAIN) {
			r = wait_fd(fd, POLLIN, deadline);
			if (r < 0)
				goto out;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	r = -EIO;
	if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1)
		goto out;
	body = strstr(buf, "\r\n\r\n");
	if (!body)
		goto out;
	body += 4;
	memmove(buf, body, strlen(body) + 1);
	*ret_body = buf;
	buf = NULL;
	r = status;
out:
	free(buf);
	if (fd >= 0)
		close(fd);
	freeaddrinfo(ai);
	return r;
}

/* Member process bookkeeping. */

static bool valid_index(const struct efs_harness *h, int i)
{
	return h && i >= 0 && i < h->n;
}

/*
 * For attached harnesses: is |pid| still our member? It must exist, not be
 * a zombie, and name the member's data directory on its command line.
 */
static bool foreign_alive(const struct member *m)
{
	char path[64], *cmd, *stat, *p;
	size_t len = 0;
	bool ok = false;
	int fd;

	if (m->pid <= 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)m->pid);
	stat = read_file(path, 4096);
	if (!stat)
		return false;
	p = strrchr(stat, ')');
	if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X') {
		free(stat);
		return false;
	}
	free(stat);
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)m->pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	cmd = malloc(65536);
	if (cmd) {
		ssize_t r;

		while ((r = read(fd, cmd + len, 65535 - len)) > 0)
			len += (size_t)r;
		for (size_t i = 0; i < len; i++) {
			if (cmd[i] == '\0')
				cmd[i] = '\n';
		}
		cmd[len] = '\0';
		p = xasprintf("--data-dir=%s\n", m->data_dir);
		ok = p && strstr(cmd, p);
		free(p);
		free(cmd);
	}
	close(fd);
	return ok;
}

/* State letter of the thread whose stat file is |path| ('R', 'S', 'T', 'Z', ...), 0 if gone. */
static char stat_state(const char *path)
{
	char *stat = read_file(path, 4096), *p, c = 0;

	if (!stat)
		return 0;
	p = strrchr(stat, ')');
	if (p && p[1] == ' ')
		c = p[2];
	free(stat);
	return c;
}

/*
 * Counts the threads of process |pid| in job-control stop (state 'T') into
 * *|stopped| and all its threads into *|total|. SIGSTOP stops the threads
 * one by one, each when it next handles the signal, so the process is
 * stopped once every thread is. -ESRCH when the process is gone or a zombie.
 */
static int proc_stop_count(pid_t pid, int *stopped, int *total)
{
	char path[96];
	struct dirent *de;
	DIR *d;
	char c;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	c = stat_state(path);
	if (!c || c == 'Z' || c == 'X')
		return -ESRCH;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return -ESRCH;
	*stopped = *total = 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat", (int)pid, de->d_name);
		c = stat_state(path);
		if (!c || c == 'Z' || c == 'X')
			continue; /* a thread that has just exited */
		(*total)++;
		if (c == 'T')
			(*stopped)++;
	}
	closedir(d);
	return *total ? 0 : -ESRCH;
}

static bool member_exited(struct efs_harness *h, struct member *m);

/*
 * After SIGSTOP (|stopped| true) or SIGCONT: waits, at most SIGSTOP_WAIT_MS,
 * until every thread of member |m| is stopped, or none is any more. Signals
 * are delivered asynchronously, so without this a member could still answer
 * right after pause() returned. -ESRCH when it died, -ETIMEDOUT.
 */
static int wait_stop_state(struct efs_harness *h, struct member *m, bool stopped)
{
	long long deadline = now_ms() + SIGSTOP_WAIT_MS;
	int n_stopped, total;

	for (;;) {
		if (proc_stop_count(m->pid, &n_stopped, &total) < 0) {
			if (member_exited(h, m))
				return -ESRCH;
		} else if (stopped ? n_stopped == total : n_stopped == 0) {
			return 0;
		}
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		sleep_ms(1);
	}
}

/*
 * Has member |m| exited? Reaps our own children (non-blocking); for
 * attached members checks /proc. Marks it dead when it has.
 */
static bool member_exited(struct efs_harness *h, struct member *m)
{
	pid_t r;

	if (m->pid <= 0)
		return true;
	if (h->attached) {
		if (foreign_alive(m))
			return false;
	} else {
		do {
			r = waitpid(m->pid, NULL, WNOHANG);
		} while (r < 0 && errno == EINTR);
		if (r == 0)
			return false;
		/* SIGCHLD ignored by the test: children reap themselves. */
		if (r < 0 && errno == ECHILD && foreign_alive(m))
			return false;
	}
	m->pid = 0;
	m->state = EFS_HARNESS_DEAD;
	return true;
}

/* Signals member |m| and waits until it has exited; SIGKILL after |grace_ms|. */
static void member_terminate(struct efs_harness *h, struct member *m, int sig, int grace_ms)
{
	long long deadline = now_ms() + grace_ms;

	if (m->pid <= 0 || member_exited(h, m))
		return;
	if (m->state == EFS_HARNESS_PAUSED && sig != SIGKILL)
		(void)kill(m->pid, SIGCONT);
	(void)kill(m->pid, sig);
	if (sig != SIGKILL) {
		while (now_ms() < deadline) {
			if (member_exited(h, m))
				return;
			sleep_ms(10);
		}
		(void)kill(m->pid, SIGKILL);
	}
	if (h->attached) {
		deadline = now_ms() + STOP_GRACE_MS;
		while (!member_exited(h, m) && now_ms() < deadline)
			sleep_ms(5);
		return;
	}
	while (waitpid(m->pid, NULL, 0) < 0 && errno == EINTR)
		;
	m->pid = 0;
	m->state = EFS_HARNESS_DEAD;
}

/* Appends one formatted argument; -ENOMEM leaves |argv| NULL-terminated. */
static int addf(char **argv, int *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int addf(char **argv, int *k, const char *fmt, ...)
{
	va_list ap;
	char *s;
	int r;

	if (*k >= MAX_ARGS)
		return -E2BIG;
	va_start(ap, fmt);
	r = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (r < 0)
		return -ENOMEM;
	argv[(*k)++] = s;
	argv[*k] = NULL;
	return 0;
}

/* Builds member |i|'s etcd command line into |argv| (strings malloc'ed). */
static int member_argv(const struct efs_harness *h, int i, char **argv)
{
	const struct member *m = &h->m[i];
	int k = 0, r = 0;

	argv[0] = NULL;
	r |= addf(argv, &k, "etcd");
	r |= addf(argv, &k, "--name=%s", m->name);
	r |= addf(argv, &k, "--data-dir=%s", m->data_dir);
	if (h->n_client_addrs) {
		char *urls = strdup(m->client_url);

		for (int a = 0; urls && a < h->n_client_addrs; a++) {
			char *more = xasprintf("%s,%s://%s:%d", urls, h->tls ? "https" : "http",
					       h->client_addrs[a], m->client_port);

			free(urls);
			urls = more;
		}
		if (!urls)
			return -ENOMEM;
		r |= addf(argv, &k, "--listen-client-urls=%s", urls);
		free(urls);
	} else {
		r |= addf(argv, &k, "--listen-client-urls=%s", m->client_url);
	}
	r |= addf(argv, &k, "--advertise-client-urls=%s", m->client_url);
	r |= addf(argv, &k, "--listen-peer-urls=%s", m->peer_url);
	r |= addf(argv, &k, "--initial-advertise-peer-urls=%s", m->peer_url);
	r |= addf(argv, &k, "--listen-metrics-urls=%s", m->metrics_url);
	r |= addf(argv, &k, "--initial-cluster=%s", h->initial_cluster);
	r |= addf(argv, &k, "--initial-cluster-token=%s", h->token);
	r |= addf(argv, &k, "--initial-cluster-state=new");
	r |= addf(argv, &k, "--logger=zap");
	r |= addf(argv, &k, "--log-outputs=%s", m->log_path);
	if (!h->fsync)
		r |= addf(argv, &k, "--unsafe-no-fsync");
	if (h->auto_compaction) {
		r |= addf(argv, &k, "--auto-compaction-mode=periodic");
		r |= addf(argv, &k, "--auto-compaction-retention=%s", h->retention);
	}
	if (h->quota_bytes > 0)
		r |= addf(argv, &k, "--quota-backend-bytes=%lld", h->quota_bytes);
	if (h->heartbeat_ms > 0)
		r |= addf(argv, &k, "--heartbeat-interval=%d", h->heartbeat_ms);
	if (h->election_ms > 0)
		r |= addf(argv, &k, "--election-timeout=%d", h->election_ms);
	if (h->auth_token_ttl_s > 0)
		r |= addf(argv, &k, "--auth-token-ttl=%d", h->auth_token_ttl_s);
	if (h->tls) {
		r |= addf(argv, &k, "--cert-file=%s", h->server_cert);
		r |= addf(argv, &k, "--key-file=%s", h->server_key);
		r |= addf(argv, &k, "--trusted-ca-file=%s", h->cacert);
		if (h->client_cert_auth)
			r |= addf(argv, &k, "--client-cert-auth");
	}
	for (int e = 0; e < h->n_extra; e++)
		r |= addf(argv, &k, "%s", h->extra[e]);
	if (r) {
		for (int j = 0; j < k; j++)
			free(argv[j]);
		argv[0] = NULL;
		return -ENOMEM;
	}
	return 0;
}

static void free_argv(char **argv)
{
	for (int j = 0; argv[j]; j++)
		free(argv[j]);
}

static int member_spawn(struct efs_harness *h, int i)
{
	struct member *m = &h->m[i];
	char *argv[MAX_ARGS + 1] = {NULL};
	char **env = NULL;
	int fd = -1, r;
	pid_t pid;

	r = member_argv(h, i, argv);
	if (r < 0)
		return r;
	r = -ENOMEM;
	env = clean_env(NULL);
	if (!env)
		goto out;
	fd = open(m->out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	pid = spawn(tool_path("ETCFS_ETCD", DEFAULT_ETCD), argv, env, fd, !h->detached,
		    h->detached);
	if (pid < 0) {
		r = pid;
		fprintf(stderr, "etcd-harness: cannot run %s: %s\n",
			tool_path("ETCFS_ETCD", DEFAULT_ETCD), strerror(-r));
		goto out;
	}
	m->pid = pid;
	m->state = EFS_HARNESS_RUNNING;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	free(env);
	free_argv(argv);
	return r;
}

/*
 * Health of a running member: 1 when /health says true, 0 when it answers
 * otherwise or not yet, -ESRCH when the process has exited.
 */
static int member_healthy(struct efs_harness *h, int i, int timeout_ms)
{
	struct member *m = &h->m[i];
	char *body = NULL;
	int st, ok;

	if (member_exited(h, m))
		return -ESRCH;
	st = http_get(h->listen_addr, m->metrics_port, "/health", timeout_ms, &body);
	ok = st == 200 && body && strstr(body, "\"health\":\"true\"");
	free(body);
	return ok;
}

/* Waits for |i| to serve; on its exit prints its log tail. */
static int wait_member(struct efs_harness *h, int i, long long deadline)
{
	for (;;) {
		long long left = deadline - now_ms();
		int r;

		if (left <= 0)
			return -ETIMEDOUT;
		r = member_healthy(h, i, left < HTTP_TIMEOUT_MS ? (int)left : HTTP_TIMEOUT_MS);
		if (r == 1)
			return 0;
		if (r < 0)
			return r;
		sleep_ms(POLL_MS);
	}
}

static bool member_addr_in_use(const struct member *m)
{
	return file_contains(m->log_path, "address already in use") ||
	       file_contains(m->out_path, "address already in use");
}

/* Harness construction. */

static bool safe_token(const char *s)
{
	if (!s || !*s)
		return false;
	for (; *s; s++) {
		if (!(*s >= 'a' && *s <= 'z') && !(*s >= 'A' && *s <= 'Z') &&
		    !(*s >= '0' && *s <= '9') && *s != '-' && *s != '_' && *s != '.')
			return false;
	}
	return true;
}

static bool no_newline(const char *s)
{
	return !s || !strpbrk(s, "\n\r");
}

static void free_member_strings(struct member *m)
{
	free(m->name);
	free(m->client_url);
	free(m->peer_url);
	free(m->metrics_url);
	free(m->hostport);
	free(m->data_dir);
	free(m->log_path);
	free(m->out_path);
	memset(m, 0, sizeof(*m));
}

static void harness_release(struct efs_harness *h)
{
	struct efs_harness **pp;

	for (pp = &live_list; *pp; pp = &(*pp)->next_live) {
		if (*pp == h) {
			*pp = h->next_live;
			break;
		}
	}
	for (int i = 0; i < EFS_HARNESS_MAX_MEMBERS; i++)
		free_member_strings(&h->m[i]);
	for (int e = 0; e < h->n_extra; e++)
		free(h->extra[e]);
	for (int a = 0; a < h->n_client_addrs; a++)
		free(h->client_addrs[a]);
	free(h->listen_addr);
	free(h->url_host);
	free(h->retention);
	free(h->client_cn);
	free(h->root_pw);
	free(h->user);
	free(h->user_pw);
	free(h->user_prefix);
	free(h->dir);
	free(h->token);
	free(h->initial_cluster);
	free(h->endpoints);
	free(h->tls_dir);
	free(h->cacert);
	free(h->cakey);
	free(h->server_cert);
	free(h->server_key);
	free(h->client_cert);
	free(h->client_key);
	free(h->state_dir);
	free(h);
}

static void atexit_cleanup(void)
{
	pid_t me = getpid();
	struct efs_harness *h = live_list, *next;

	for (; h; h = next) {
		next = h->next_live;
		if (h->owner == me)
			efs_harness_free(h);
	}
}

static void register_live(struct efs_harness *h)
{
	if (!atexit_done) {
		atexit_done = true;
		(void)atexit(atexit_cleanup);
	}
	h->next_live = live_list;
	live_list = h;
}

/*
 * Removes /dev/shm/etcfs-harness-<pid>-<n> directories of processes that
 * are gone (a test that crashed before its cleanup ran; its members died
 * with it through PDEATHSIG).
 */
static void sweep_stale(void)
{
	DIR *d = opendir(SHM_ROOT);
	struct dirent *de;

	if (!d)
		return;
	while ((de = readdir(d))) {
		char path[512];
		int pid, n, used = 0;

		if (sscanf(de->d_name, DIR_PREFIX "%d-%d%n", &pid, &n, &used) != 2 ||
		    de->d_name[used] != '\0' || pid <= 0 || pid == getpid())
			continue;
		if (kill(pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), SHM_ROOT "/%s", de->d_name);
		rm_rf(path);
	}
	closedir(d);
}

static int make_dir(struct efs_harness *h)
{
	for (int tries = 0; tries < 1000; tries++) {
		char *d = xasprintf(SHM_ROOT "/%s%d-%u", h->detached ? DETACHED_PREFIX : DIR_PREFIX,
				    (int)getpid(), dir_counter++);

		if (!d)
			return -ENOMEM;
		if (mkdir(d, 0700) == 0) {
			h->dir = d;
			return 0;
		}
		free(d);
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

static int copy_opts(struct efs_harness *h, const struct efs_harness_opts *o)
{
	const char *addr = o->listen_addr ? o->listen_addr : "127.0.0.1";
	unsigned char buf[sizeof(struct in6_addr)];
	bool v6 = false;

	h->n = o->members ? o->members : 1;
	if (h->n != 1 && h->n != 3) {
		fprintf(stderr, "etcd-harness: members must be 1 or 3, not %d\n", o->members);
		return -EINVAL;
	}
	if (inet_pton(AF_INET, addr, buf) != 1) {
		if (inet_pton(AF_INET6, addr, buf) != 1) {
			fprintf(stderr, "etcd-harness: listen address %s is not a numeric IP\n",
				addr);
			return -EINVAL;
		}
		v6 = true;
	}
	if ((o->client_cert_cn && !safe_token(o->client_cert_cn)) ||
	    (o->user && !safe_token(o->user)) ||
	    (o->auto_compaction_retention && !safe_token(o->auto_compaction_retention)) ||
	    !no_newline(o->root_password) || !no_newline(o->user_password) ||
	    !no_newline(o->user_prefix) || (o->root_password && !*o->root_password)) {
		fprintf(stderr, "etcd-harness: invalid user, password, CN or retention\n");
		return -EINVAL;
	}
	if (o->client_cert_auth && !o->tls) {
		fprintf(stderr, "etcd-harness: client_cert_auth needs tls\n");
		return -EINVAL;
	}
	h->tls = o->tls;
	h->client_cert_auth = o->client_cert_auth;
	h->auth = o->auth;
	h->auto_compaction = o->auto_compaction;
	h->fsync = o->fsync;
	h->quota_bytes = o->quota_bytes;
	h->auth_token_ttl_s = o->auth_token_ttl_s;
	h->heartbeat_ms = o->heartbeat_ms;
	h->election_ms = o->election_ms;
	h->detached = o->detached;
	h->start_timeout_ms = o->start_timeout_ms > 0 ? o->start_timeout_ms : DEFAULT_START_MS;
	h->listen_addr = strdup(addr);
	h->url_host = v6 ? xasprintf("[%s]", addr) : strdup(addr);
	h->retention = xstrdup_or(o->auto_compaction_retention, DEFAULT_RETENTION);
	h->client_cn = xstrdup_or(o->client_cert_cn, DEFAULT_CLIENT_CN);
	if (!h->listen_addr || !h->url_host || !h->retention || !h->client_cn)
		return -ENOMEM;
	if (o->auth) {
		h->root_pw = xstrdup_or(o->root_password, DEFAULT_ROOT_PW);
		if (!h->root_pw)
			return -ENOMEM;
		if (o->user) {
			h->user = strdup(o->user);
			h->user_pw = xstrdup_or(o->user_password, DEFAULT_USER_PW);
			h->user_prefix = xstrdup_or(o->user_prefix, "");
			if (!h->user || !h->user_pw || !h->user_prefix)
				return -ENOMEM;
		}
	}
	for (int e = 0; o->extra_args && o->extra_args[e]; e++) {
		if (e >= MAX_EXTRA_ARGS) {
			fprintf(stderr, "etcd-harness: more than %d extra args\n", MAX_EXTRA_ARGS);
			return -EINVAL;
		}
		h->extra[e] = strdup(o->extra_args[e]);
		if (!h->extra[e])
			return -ENOMEM;
		h->n_extra = e + 1;
	}
	for (int a = 0; o->extra_client_addrs && o->extra_client_addrs[a]; a++) {
		struct in_addr in;

		if (a >= MAX_CLIENT_ADDRS || o->detached ||
		    inet_pton(AF_INET, o->extra_client_addrs[a], &in) != 1) {
			fprintf(stderr, "etcd-harness: extra client addresses: at most %d IPv4 "
					"addresses, not with a detached cluster\n",
				MAX_CLIENT_ADDRS);
			return -EINVAL;
		}
		h->client_addrs[a] = strdup(o->extra_client_addrs[a]);
		if (!h->client_addrs[a])
			return -ENOMEM;
		h->n_client_addrs = a + 1;
	}
	return 0;
}

/* Paths and URLs that depend on the directory and ports. */
static int build_member_strings(struct efs_harness *h)
{
	const char *scheme = h->tls ? "https" : "http";
	size_t ic_len = 0, ep_len = 0;

	free(h->initial_cluster);
	free(h->endpoints);
	h->initial_cluster = NULL;
	h->endpoints = NULL;
	for (int i = 0; i < h->n; i++) {
		struct member *m = &h->m[i];

		free(m->name);
		free(m->client_url);
		free(m->peer_url);
		free(m->metrics_url);
		free(m->hostport);
		free(m->data_dir);
		free(m->log_path);
		free(m->out_path);
		m->name = xasprintf("m%d", i);
		m->client_url = xasprintf("%s://%s:%d", scheme, h->url_host, m->client_port);
		m->peer_url = xasprintf("http://%s:%d", h->url_host, m->peer_port);
		m->metrics_url = xasprintf("http://%s:%d", h->url_host, m->metrics_port);
		m->hostport = xasprintf("%s:%d", h->url_host, m->client_port);
		m->data_dir = xasprintf("%s/m%d", h->dir, i);
		m->log_path = xasprintf("%s/m%d.log", h->dir, i);
		m->out_path = xasprintf("%s/m%d.out", h->dir, i);
		if (!m->name || !m->client_url || !m->peer_url || !m->metrics_url ||
		    !m->hostport || !m->data_dir || !m->log_path || !m->out_path)
			return -ENOMEM;
		ic_len += strlen(m->name) + strlen(m->peer_url) + 2;
		ep_len += strlen(m->client_url) + 1;
	}
	h->initial_cluster = calloc(1, ic_len + 1);
	h->endpoints = calloc(1, ep_len + 1);
	if (!h->initial_cluster || !h->endpoints)
		return -ENOMEM;
	for (int i = 0; i < h->n; i++) {
		if (i) {
			strcat(h->initial_cluster, ",");
			strcat(h->endpoints, ",");
		}
		strcat(h->initial_cluster, h->m[i].name);
		strcat(h->initial_cluster, "=");
		strcat(h->initial_cluster, h->m[i].peer_url);
		strcat(h->endpoints, h->m[i].client_url);
	}
	return 0;
}

/*
 * Picks 3 free ports per member: all sockets are bound (port 0) at once so
 * that no port repeats, then released for etcd to bind.
 */
static int pick_ports(struct efs_harness *h)
{
	int fds[3 * EFS_HARNESS_MAX_MEMBERS], nfd = 0, r = 0;
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE};
	struct addrinfo *ai = NULL;

	if (getaddrinfo(h->listen_addr, "0", &hints, &ai) != 0 || !ai)
		return -EINVAL;
	for (int i = 0; i < 3 * h->n; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd, port;

		fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			r = -errno;
			break;
		}
		fds[nfd++] = fd;
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
		    getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
			r = -errno;
			fprintf(stderr, "etcd-harness: cannot bind %s: %s\n", h->listen_addr,
				strerror(errno));
			break;
		}
		port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
						: ntohs(((struct sockaddr_in *)&ss)->sin_port);
		if (i % 3 == 0)
			h->m[i / 3].client_port = port;
		else if (i % 3 == 1)
			h->m[i / 3].peer_port = port;
		else
			h->m[i / 3].metrics_port = port;
	}
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
	freeaddrinfo(ai);
	return r;
}

/* Runs openssl with |args| (NULL-terminated); -EIO with its output on failure. */
static int run_openssl(struct efs_harness *h, const char *const *args)
{
	const char *argv[24];
	char *out = NULL;
	char **env;
	int k = 0, r;

	argv[k++] = "openssl";
	for (int i = 0; args[i] && k < 23; i++)
		argv[k++] = args[i];
	argv[k] = NULL;
	env = clean_env(NULL);
	if (!env)
		return -ENOMEM;
	r = run_capture(tool_path("ETCFS_OPENSSL", DEFAULT_OPENSSL), (char *const *)argv, env,
			CMD_TIMEOUT_MS, &out);
	free(env);
	if (r < 0) {
		fprintf(stderr, "etcd-harness: cannot run openssl: %s\n", strerror(-r));
		return r;
	}
	if (r != 0) {
		fprintf(stderr, "etcd-harness: openssl %s failed (%d):\n%s\n", args[0], r,
			out ? out : "");
		r = -EIO;
	}
	free(out);
	return r;
}

/*
 * A throwaway CA, a server certificate for localhost, 127.0.0.1 and the
 * listen address, and a client certificate, all P-256 (fast to generate),
 * valid for 7 days, under <dir>/tls/. Our own openssl.cnf keeps the
 * extensions independent of the distribution's defaults.
 */
static int make_certs(struct efs_harness *h)
{
	char *cnf = NULL, *cnf_text = NULL, *csr_s = NULL, *csr_c = NULL, *subj = NULL;
	char more_ips[MAX_CLIENT_ADDRS * 24] = "";
	int r = -ENOMEM;

	/* The extra client addresses are names of the server too. */
	for (int a = 0; a < h->n_client_addrs; a++)
		snprintf(more_ips + strlen(more_ips), sizeof(more_ips) - strlen(more_ips),
			 ",IP:%s", h->client_addrs[a]);

	h->tls_dir = xasprintf("%s/tls", h->dir);
	if (!h->tls_dir)
		return -ENOMEM;
	if (mkdir(h->tls_dir, 0700) < 0)
		return -errno;
	h->cacert = xasprintf("%s/ca.crt", h->tls_dir);
	h->cakey = xasprintf("%s/ca.key", h->tls_dir);
	h->server_cert = xasprintf("%s/server.crt", h->tls_dir);
	h->server_key = xasprintf("%s/server.key", h->tls_dir);
	h->client_cert = xasprintf("%s/client.crt", h->tls_dir);
	h->client_key = xasprintf("%s/client.key", h->tls_dir);
	cnf = xasprintf("%s/openssl.cnf", h->tls_dir);
	csr_s = xasprintf("%s/server.csr", h->tls_dir);
	csr_c = xasprintf("%s/client.csr", h->tls_dir);
	subj = xasprintf("/CN=%s", h->client_cn);
	cnf_text = xasprintf(
		"[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = etcfs\n"
		"[ca_ext]\nbasicConstraints = critical,CA:TRUE\n"
		"keyUsage = critical,keyCertSign,cRLSign\nsubjectKeyIdentifier = hash\n"
		"[server_ext]\nbasicConstraints = CA:FALSE\n"
		"keyUsage = critical,digitalSignature,keyEncipherment\n"
		"extendedKeyUsage = serverAuth,clientAuth\n"
		"subjectAltName = IP:127.0.0.1,DNS:localhost%s%s%s\n"
		"authorityKeyIdentifier = keyid\n"
		"[client_ext]\nbasicConstraints = CA:FALSE\n"
		"keyUsage = critical,digitalSignature\nextendedKeyUsage = clientAuth\n"
		"authorityKeyIdentifier = keyid\n",
		strcmp(h->listen_addr, "127.0.0.1") ? ",IP:" : "",
		strcmp(h->listen_addr, "127.0.0.1") ? h->listen_addr : "", more_ips);
	if (!h->cacert || !h->cakey || !h->server_cert || !h->server_key || !h->client_cert ||
	    !h->client_key || !cnf || !csr_s || !csr_c || !subj || !cnf_text)
		goto out;
	r = write_file(cnf, cnf_text);
	if (r < 0)
		goto out;
	{
		const char *ca[] = {"req", "-config", cnf, "-x509", "-newkey", "ec", "-pkeyopt",
				    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", h->cakey,
				    "-out", h->cacert, "-days", "7", "-subj",
				    "/CN=etcfs-harness-ca", "-extensions", "ca_ext", NULL};
		const char *sreq[] = {"req", "-config", cnf, "-new", "-newkey", "ec", "-pkeyopt",
				      "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
				      h->server_key, "-out", csr_s, "-subj", "/CN=localhost",
				      NULL};
		const char *ssign[] = {"x509", "-req", "-in", csr_s, "-CA", h->cacert, "-CAkey",
				       h->cakey, "-set_serial", "2", "-days", "7", "-out",
				       h->server_cert, "-extfile", cnf, "-extensions",
				       "server_ext", NULL};
		const char *creq[] = {"req", "-config", cnf, "-new", "-newkey", "ec", "-pkeyopt",
				      "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
				      h->client_key, "-out", csr_c, "-subj", subj, NULL};
		const char *csign[] = {"x509", "-req", "-in", csr_c, "-CA", h->cacert, "-CAkey",
				       h->cakey, "-set_serial", "3", "-days", "7", "-out",
				       h->client_cert, "-extfile", cnf, "-extensions",
				       "client_ext", NULL};
		const char *const *steps[] = {ca, sreq, ssign, creq, csign};

		for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
			r = run_openssl(h, steps[s]);
			if (r < 0)
				goto out;
		}
	}
out:
	free(cnf);
	free(cnf_text);
	free(csr_s);
	free(csr_c);
	free(subj);
	return r;
}

/* One anonymous etcdctl call of the auth setup; -EIO with its output. */
static int auth_step(struct efs_harness *h, const char *const *argv)
{
	char *out = NULL;
	int argc = 0, r;

	while (argv[argc])
		argc++;
	r = efs_harness_etcdctlv(h, NULL, NULL, &out, argc, argv);
	if (r != 0) {
		fprintf(stderr, "etcd-harness: auth setup: etcdctl %s %s failed (%d): %s\n",
			argv[0], argv[1], r, out ? out : "");
		r = r < 0 ? r : -EIO;
	}
	free(out);
	return r;
}

static int setup_auth(struct efs_harness *h)
{
	char *np = xasprintf("--new-user-password=%s", h->root_pw), *unp = NULL;
	int r = -ENOMEM;

	if (!np)
		goto out;
	r = auth_step(h, (const char *const[]){"user", "add", EFS_HARNESS_ROOT_USER, np, NULL});
	if (r == 0 && h->user) {
		unp = xasprintf("--new-user-password=%s", h->user_pw);
		r = unp ? 0 : -ENOMEM;
		if (r == 0)
			r = auth_step(h, (const char *const[]){"role", "add", USER_ROLE, NULL});
		if (r == 0)
			r = auth_step(h, (const char *const[]){"role", "grant-permission",
								"--prefix=true", USER_ROLE,
								"readwrite", h->user_prefix, NULL});
		if (r == 0)
			r = auth_step(h, (const char *const[]){"user", "add", h->user, unp, NULL});
		if (r == 0)
			r = auth_step(h, (const char *const[]){"user", "grant-role", h->user,
								USER_ROLE, NULL});
	}
	if (r == 0)
		r = auth_step(h, (const char *const[]){"auth", "enable", NULL});
out:
	free(np);
	free(unp);
	return r;
}

/* Kills every member, removes their data (not the TLS files). */
static void teardown_members(struct efs_harness *h)
{
	for (int i = 0; i < h->n; i++) {
		member_terminate(h, &h->m[i], SIGKILL, 0);
		rm_rf(h->m[i].data_dir);
		if (h->m[i].log_path)
			(void)unlink(h->m[i].log_path);
		if (h->m[i].out_path)
			(void)unlink(h->m[i].out_path);
	}
}

/*
 * Waits until every member is healthy. Any member exiting ends the wait at
 * once: 1 when it lost a port race, -EIO otherwise (its log tail printed).
 */
static int wait_all(struct efs_harness *h, long long deadline)
{
	bool ok[EFS_HARNESS_MAX_MEMBERS] = {false};
	int healthy = 0, r = 0, bad = -1;

	while (healthy < h->n) {
		long long left = deadline - now_ms();

		if (left <= 0) {
			r = -ETIMEDOUT;
			break;
		}
		for (int i = 0; i < h->n && r == 0; i++) {
			int st;

			if (ok[i])
				continue;
			st = member_healthy(h, i,
					    left < HTTP_TIMEOUT_MS ? (int)left : HTTP_TIMEOUT_MS);
			if (st == 1) {
				ok[i] = true;
				healthy++;
			} else if (st < 0) {
				r = -EIO;
				bad = i;
			}
		}
		if (r < 0)
			break;
		if (healthy < h->n)
			sleep_ms(POLL_MS);
	}
	if (r == 0)
		return 0;
	for (int i = 0; i < h->n; i++) {
		if (member_exited(h, &h->m[i]) && member_addr_in_use(&h->m[i]))
			return 1;
	}
	for (int i = 0; i < h->n; i++) {
		if (bad >= 0 && i != bad)
			continue;
		if (bad < 0 && ok[i])
			continue;
		fprintf(stderr, "etcd-harness: member m%d %s\n", i,
			bad >= 0 ? "exited during start" : "did not become healthy in time");
		print_tail(h->m[i].log_path, 3000);
		print_tail(h->m[i].out_path, 1000);
	}
	return r;
}

/* One attempt: 1 on a port collision (retry), 0 or -errno otherwise. */
static int start_attempt(struct efs_harness *h)
{
	long long deadline = now_ms() + h->start_timeout_ms;
	int r;

	r = pick_ports(h);
	if (r < 0)
		return r;
	r = build_member_strings(h);
	if (r < 0)
		return r;
	for (int i = 0; i < h->n; i++) {
		r = member_spawn(h, i);
		if (r < 0)
			return r;
	}
	r = wait_all(h, deadline);
	if (r == 1)
		return 1;
	if (r < 0)
		return r;
	r = efs_harness_wait_leader(h, (int)(deadline - now_ms()));
	if (r < 0) {
		fprintf(stderr, "etcd-harness: no leader in time\n");
		return r;
	}
	if (h->auth)
		return setup_auth(h);
	return 0;
}

int efs_harness_start(struct efs_harness **ret_h, const struct efs_harness_opts *opts)
{
	struct efs_harness_opts dflt = {0};
	struct efs_harness *h;
	int r;

	if (!opts)
		opts = &dflt;
	if (access(tool_path("ETCFS_ETCD", DEFAULT_ETCD), X_OK) < 0) {
		fprintf(stderr, "etcd-harness: %s not found (install etcd-server)\n",
			tool_path("ETCFS_ETCD", DEFAULT_ETCD));
		return -ENOENT;
	}
	if (access(tool_path("ETCFS_ETCDCTL", DEFAULT_ETCDCTL), X_OK) < 0) {
		fprintf(stderr, "etcd-harness: %s not found (install etcd-client)\n",
			tool_path("ETCFS_ETCDCTL", DEFAULT_ETCDCTL));
		return -ENOENT;
	}
	if (opts->tls && access(tool_path("ETCFS_OPENSSL", DEFAULT_OPENSSL), X_OK) < 0) {
		fprintf(stderr, "etcd-harness: openssl not found\n");
		return -ENOENT;
	}
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->owner = getpid();
	register_live(h);
	r = copy_opts(h, opts);
	if (r < 0)
		goto fail;
	sweep_stale();
	r = make_dir(h);
	if (r < 0) {
		fprintf(stderr, "etcd-harness: cannot create a directory in %s: %s\n", SHM_ROOT,
			strerror(-r));
		goto fail;
	}
	h->token = xasprintf("etcfs-%s", strrchr(h->dir, '/') + 1);
	if (!h->token) {
		r = -ENOMEM;
		goto fail;
	}
	if (h->tls) {
		r = make_certs(h);
		if (r < 0)
			goto fail;
	}
	for (int attempt = 0;; attempt++) {
		r = start_attempt(h);
		if (r == 0)
			break;
		teardown_members(h);
		if (r < 0)
			goto fail;
		if (attempt + 1 == START_ATTEMPTS) {
			fprintf(stderr, "etcd-harness: ports kept colliding, giving up\n");
			r = -EADDRINUSE;
			goto fail;
		}
	}
	*ret_h = h;
	return 0;
fail:
	if (r == -ENOMEM)
		fprintf(stderr, "etcd-harness: out of memory\n");
	efs_harness_free(h);
	return r;
}

/*
 * Stops the members one after the other, within one shared bound, then
 * kills what is left. Not all at once: a leader that gets SIGTERM first
 * hands leadership to a live follower (quick), but one whose followers are
 * shutting down too waits for the hand-over to time out (seconds).
 */
static void stop_all(struct efs_harness *h)
{
	long long deadline = now_ms() + STOP_GRACE_MS;

	for (int i = 0; i < h->n; i++) {
		struct member *m = &h->m[i];

		if (!member_exited(h, m) && m->state == EFS_HARNESS_PAUSED) {
			(void)kill(m->pid, SIGCONT);
			m->state = EFS_HARNESS_RUNNING;
		}
	}
	for (int i = 0; i < h->n; i++) {
		struct member *m = &h->m[i];

		if (member_exited(h, m))
			continue;
		(void)kill(m->pid, SIGTERM);
		while (now_ms() < deadline && !member_exited(h, m))
			sleep_ms(5);
	}
	for (int i = 0; i < h->n; i++)
		member_terminate(h, &h->m[i], SIGKILL, 0);
}

struct efs_harness *efs_harness_free(struct efs_harness *h)
{
	if (!h)
		return NULL;
	if (h->owner == getpid()) {
		stop_all(h);
		rm_rf(h->dir);
		if (h->state_dir) {
			char *p = xasprintf("%s/state", h->state_dir);
			char *e = xasprintf("%s/env", h->state_dir);

			if (p)
				(void)unlink(p);
			if (e)
				(void)unlink(e);
			free(p);
			free(e);
			(void)rmdir(h->state_dir);
		}
	}
	harness_release(h);
	return NULL;
}

/* Accessors. */

int efs_harness_members(const struct efs_harness *h)
{
	return h ? h->n : 0;
}

const char *efs_harness_endpoints(const struct efs_harness *h)
{
	return h ? h->endpoints : NULL;
}

int efs_harness_client_port(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].client_port : -EINVAL;
}

const char *efs_harness_member_url(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].client_url : NULL;
}

const char *efs_harness_peer_url(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].peer_url : NULL;
}

const char *efs_harness_metrics_url(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].metrics_url : NULL;
}

const char *efs_harness_member_hostport(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].hostport : NULL;
}

pid_t efs_harness_pid(const struct efs_harness *h, int i)
{
	if (!valid_index(h, i))
		return -EINVAL;
	return h->m[i].pid > 0 ? h->m[i].pid : -ESRCH;
}

enum efs_harness_member_state efs_harness_state(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].state : EFS_HARNESS_DEAD;
}

const char *efs_harness_dir(const struct efs_harness *h)
{
	return h ? h->dir : NULL;
}

const char *efs_harness_log_path(const struct efs_harness *h, int i)
{
	return valid_index(h, i) ? h->m[i].log_path : NULL;
}

const char *efs_harness_cacert(const struct efs_harness *h)
{
	return h && h->tls ? h->cacert : NULL;
}

const char *efs_harness_client_cert(const struct efs_harness *h)
{
	return h && h->tls ? h->client_cert : NULL;
}

const char *efs_harness_client_key(const struct efs_harness *h)
{
	return h && h->tls ? h->client_key : NULL;
}

const char *efs_harness_root_password(const struct efs_harness *h)
{
	return h ? h->root_pw : NULL;
}

const char *efs_harness_user(const struct efs_harness *h)
{
	return h ? h->user : NULL;
}

const char *efs_harness_user_password(const struct efs_harness *h)
{
	return h ? h->user_pw : NULL;
}

/* Metrics, leader, waiting. */

static int parse_metric(const char *body, const char *name, double *ret_value)
{
	size_t nl = strlen(name);
	const char *p = body;

	while (p && *p) {
		if (!strncmp(p, name, nl) && p[nl] == ' ') {
			char *end;
			double v = strtod(p + nl + 1, &end);

			if (end == p + nl + 1)
				return -EBADMSG;
			*ret_value = v;
			return 0;
		}
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return -ENOENT;
}

/* Fetches both leader gauges of member |i| in one request. */
static int leader_gauges(struct efs_harness *h, int i, double *is_leader, double *has_leader)
{
	struct member *m = &h->m[i];
	char *body = NULL;
	int st, r;

	if (member_exited(h, m))
		return -ESRCH;
	if (m->state == EFS_HARNESS_PAUSED)
		return -EBUSY;
	st = http_get(h->listen_addr, m->metrics_port, "/metrics", HTTP_TIMEOUT_MS, &body);
	if (st < 0)
		return st;
	r = st == 200 ? parse_metric(body, "etcd_server_is_leader", is_leader) : -EIO;
	if (r == 0)
		r = parse_metric(body, "etcd_server_has_leader", has_leader);
	free(body);
	return r;
}

int efs_harness_metric(struct efs_harness *h, int i, const char *name, double *ret_value)
{
	struct member *m;
	char *body = NULL;
	int st, r;

	if (!valid_index(h, i) || !name)
		return -EINVAL;
	m = &h->m[i];
	if (member_exited(h, m))
		return -ESRCH;
	if (m->state == EFS_HARNESS_PAUSED)
		return -EBUSY;
	st = http_get(h->listen_addr, m->metrics_port, "/metrics", HTTP_TIMEOUT_MS, &body);
	if (st < 0)
		return st;
	r = st == 200 ? parse_metric(body, name, ret_value) : -EIO;
	free(body);
	return r;
}

int efs_harness_leader(struct efs_harness *h)
{
	int leader = -ENOENT;

	if (!h)
		return -EINVAL;
	for (int i = 0; i < h->n; i++) {
		double is = 0, has = 0;

		if (leader_gauges(h, i, &is, &has) < 0 || is != 1)
			continue;
		if (leader >= 0)
			return -EAGAIN;
		leader = i;
	}
	return leader;
}

int efs_harness_follower(struct efs_harness *h)
{
	if (!h)
		return -EINVAL;
	for (int i = 0; i < h->n; i++) {
		double is = 0, has = 0;

		if (leader_gauges(h, i, &is, &has) == 0 && is == 0 && has == 1)
			return i;
	}
	return -ENOENT;
}

int efs_harness_wait_leader(struct efs_harness *h, int timeout_ms)
{
	long long deadline = now_ms() + timeout_ms;

	if (!h)
		return -EINVAL;
	for (;;) {
		int r = efs_harness_leader(h);

		if (r >= 0)
			return r;
		if (now_ms() >= deadline)
			return -ETIMEDOUT;
		sleep_ms(POLL_MS);
	}
}

int efs_harness_wait_member(struct efs_harness *h, int i, int timeout_ms)
{
	if (!valid_index(h, i))
		return -EINVAL;
	if (member_exited(h, &h->m[i]))
		return -ESRCH;
	if (h->m[i].state == EFS_HARNESS_PAUSED)
		return -EBUSY;
	return wait_member(h, i, now_ms() + timeout_ms);
}

/* Faults. */

int efs_harness_kill(struct efs_harness *h, int i)
{
	if (!valid_index(h, i))
		return -EINVAL;
	if (member_exited(h, &h->m[i]))
		return -ESRCH;
	member_terminate(h, &h->m[i], SIGKILL, 0);
	return 0;
}

int efs_harness_stop(struct efs_harness *h, int i)
{
	if (!valid_index(h, i))
		return -EINVAL;
	if (member_exited(h, &h->m[i]))
		return -ESRCH;
	member_terminate(h, &h->m[i], SIGTERM, STOP_GRACE_MS);
	return 0;
}

int efs_harness_pause(struct efs_harness *h, int i)
{
	struct member *m;

	if (!valid_index(h, i))
		return -EINVAL;
	m = &h->m[i];
	if (member_exited(h, m))
		return -ESRCH;
	if (m->state == EFS_HARNESS_PAUSED)
		return -EALREADY;
	if (kill(m->pid, SIGSTOP) < 0)
		return -errno;
	m->state = EFS_HARNESS_PAUSED;
	return wait_stop_state(h, m, true);
}

int efs_harness_resume(struct efs_harness *h, int i)
{
	struct member *m;

	if (!valid_index(h, i))
		return -EINVAL;
	m = &h->m[i];
	if (member_exited(h, m))
		return -ESRCH;
	if (m->state != EFS_HARNESS_PAUSED)
		return -EALREADY;
	if (kill(m->pid, SIGCONT) < 0)
		return -errno;
	m->state = EFS_HARNESS_RUNNING;
	return wait_stop_state(h, m, false);
}

int efs_harness_restart(struct efs_harness *h, int i)
{
	struct member *m;
	int r;

	if (!valid_index(h, i))
		return -EINVAL;
	m = &h->m[i];
	if (!member_exited(h, m))
		return -EBUSY;
	for (int attempt = 0; attempt < START_ATTEMPTS; attempt++) {
		r = member_spawn(h, i);
		if (r < 0)
			return r;
		r = wait_member(h, i, now_ms() + h->start_timeout_ms);
		if (r == 0)
			return 0;
		/*
		 * Our fixed ports may have been taken meanwhile, often only
		 * for a moment by an outgoing connection's ephemeral port.
		 */
		if (r == -ESRCH && member_addr_in_use(m)) {
			sleep_ms(200);
			continue;
		}
		break;
	}
	fprintf(stderr, "etcd-harness: restart of m%d failed: %s\n", i, strerror(-r));
	print_tail(m->log_path, 3000);
	print_tail(m->out_path, 1000);
	member_terminate(h, m, SIGKILL, 0);
	return r == -ESRCH ? -EIO : r;
}

/* etcdctl. */

int efs_harness_etcdctlv(struct efs_harness *h, const char *user, const char *password,
			 char **ret_out, int argc, const char *const *argv)
{
	char *args[MAX_ARGS + 1] = {NULL}, **env = NULL, *eps = NULL;
	const char *fixed[MAX_ARGS + 1];
	size_t eplen = 0;
	int k = 0, nalloc, r = -ENOMEM;
	bool own_eps = true;

	if (!h || argc < 0 || argc > MAX_ARGS - 12)
		return -EINVAL;
	for (int i = 0; i < h->n; i++)
		eplen += strlen(h->m[i].client_url) + 1;
	eps = calloc(1, eplen + 1);
	if (!eps)
		return -ENOMEM;
	for (int i = 0; i < h->n; i++) {
		if (member_exited(h, &h->m[i]) || h->m[i].state == EFS_HARNESS_PAUSED)
			continue;
		if (*eps)
			strcat(eps, ",");
		strcat(eps, h->m[i].client_url);
	}
	if (!*eps) {
		free(eps);
		return -ESRCH;
	}
	/* etcdctl appends repeated --endpoints flags, so a caller's replaces ours. */
	for (int i = 0; i < argc; i++) {
		if (!strncmp(argv[i], "--endpoints", 11) &&
		    (argv[i][11] == '=' || argv[i][11] == '\0'))
			own_eps = false;
	}
	if (own_eps)
		args[k++] = xasprintf("--endpoints=%s", eps);
	args[k++] = xasprintf("--dial-timeout=3s");
	args[k++] = xasprintf("--command-timeout=10s");
	if (h->tls) {
		args[k++] = xasprintf("--cacert=%s", h->cacert);
		args[k++] = xasprintf("--cert=%s", h->client_cert);
		args[k++] = xasprintf("--key=%s", h->client_key);
	}
	if (user) {
		args[k++] = xasprintf("--user=%s", user);
		args[k++] = xasprintf("--password=%s", password ? password : "");
	}
	nalloc = k;
	for (int i = 0; i < nalloc; i++) {
		if (!args[i])
			goto out;
	}
	fixed[0] = "etcdctl";
	for (int i = 0; i < nalloc; i++)
		fixed[1 + i] = args[i];
	for (int i = 0; i < argc; i++)
		fixed[1 + nalloc + i] = argv[i];
	fixed[1 + nalloc + argc] = NULL;
	env = clean_env("ETCDCTL_API=3");
	if (!env)
		goto out;
	r = run_capture(tool_path("ETCFS_ETCDCTL", DEFAULT_ETCDCTL), (char *const *)fixed, env,
			CMD_TIMEOUT_MS, ret_out);
out:
	free(env);
	free(eps);
	for (int i = 0; i < k; i++)
		free(args[i]);
	return r;
}

static int etcdctl_va(struct efs_harness *h, const char *user, const char *password,
		      char **ret_out, va_list ap)
{
	const char *argv[MAX_ARGS];
	const char *a;
	int argc = 0;

	while ((a = va_arg(ap, const char *))) {
		if (argc >= MAX_ARGS - 12)
			return -E2BIG;
		argv[argc++] = a;
	}
	return efs_harness_etcdctlv(h, user, password, ret_out, argc, argv);
}

int efs_harness_etcdctl(struct efs_harness *h, char **ret_out, ...)
{
	va_list ap;
	int r;

	if (!h)
		return -EINVAL;
	va_start(ap, ret_out);
	r = etcdctl_va(h, h->auth ? EFS_HARNESS_ROOT_USER : NULL, h->root_pw, ret_out, ap);
	va_end(ap);
	return r;
}

int efs_harness_etcdctl_as(struct efs_harness *h, const char *user, const char *password,
			   char **ret_out, ...)
{
	va_list ap;
	int r;

	va_start(ap, ret_out);
	r = etcdctl_va(h, user, password, ret_out, ap);
	va_end(ap);
	return r;
}

/* State files for the CLI. */

static const char *state_name(enum efs_harness_member_state s)
{
	return s == EFS_HARNESS_RUNNING ? "running" : s == EFS_HARNESS_PAUSED ? "paused" : "dead";
}

/* Shell-quotes |v| into a new string when it needs quoting. */
static char *shq(const char *v)
{
	size_t n = 3;
	char *s, *p;

	if (!strpbrk(v, " \t\"'\\$`!*?[]{}()<>|&;#~"))
		return strdup(v);
	for (const char *c = v; *c; c++)
		n += *c == '\'' ? 4 : 1;
	s = malloc(n);
	if (!s)
		return NULL;
	p = s;
	*p++ = '\'';
	for (const char *c = v; *c; c++) {
		if (*c == '\'') {
			memcpy(p, "'\\''", 4);
			p += 4;
		} else {
			*p++ = *c;
		}
	}
	*p++ = '\'';
	*p = '\0';
	return s;
}

static int append(char **buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int append(char **buf, const char *fmt, ...)
{
	va_list ap;
	char *add, *nb;
	int r;

	va_start(ap, fmt);
	r = vasprintf(&add, fmt, ap);
	va_end(ap);
	if (r < 0)
		return -ENOMEM;
	nb = xasprintf("%s%s", *buf ? *buf : "", add);
	free(add);
	if (!nb)
		return -ENOMEM;
	free(*buf);
	*buf = nb;
	return 0;
}

static int append_env(char **buf, const char *key, const char *val)
{
	char *q = shq(val);
	int r;

	if (!q)
		return -ENOMEM;
	r = append(buf, "%s=%s\n", key, q);
	free(q);
	return r;
}

static int env_text(const struct efs_harness *h, char **ret)
{
	char *b = NULL, *up = NULL;
	int r = 0;

	r |= append_env(&b, "ETCD_ENDPOINTS", h->endpoints);
	r |= append_env(&b, "ETCDCTL_API", "3");
	r |= append_env(&b, "ETCDCTL_ENDPOINTS", h->endpoints);
	if (h->tls) {
		r |= append_env(&b, "ETCD_CACERT", h->cacert);
		r |= append_env(&b, "ETCD_CERT", h->client_cert);
		r |= append_env(&b, "ETCD_KEY", h->client_key);
		r |= append_env(&b, "ETCDCTL_CACERT", h->cacert);
		r |= append_env(&b, "ETCDCTL_CERT", h->client_cert);
		r |= append_env(&b, "ETCDCTL_KEY", h->client_key);
	}
	if (h->auth) {
		up = xasprintf("%s:%s", EFS_HARNESS_ROOT_USER, h->root_pw);
		r |= append_env(&b, "ETCD_USER", EFS_HARNESS_ROOT_USER);
		r |= append_env(&b, "ETCD_PASSWORD", h->root_pw);
		r |= up ? append_env(&b, "ETCDCTL_USER", up) : -ENOMEM;
		free(up);
	}
	if (r) {
		free(b);
		return -ENOMEM;
	}
	*ret = b;
	return 0;
}

int efs_harness_env_text(const struct efs_harness *h, char **ret_text)
{
	if (!h || !ret_text)
		return -EINVAL;
	return env_text(h, ret_text);
}

int efs_harness_detach(struct efs_harness *h, const char *state_dir)
{
	char *b = NULL, *env = NULL, *p = NULL, *tmp = NULL;
	int r = 0;

	if (!h || !state_dir || !h->detached)
		return -EINVAL;
	if (mkdir(state_dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	r |= append(&b, "version=1\nmembers=%d\nlisten_addr=%s\ndir=%s\ntoken=%s\n", h->n,
		    h->listen_addr, h->dir, h->token);
	r |= append(&b, "tls=%d\nclient_cert_auth=%d\nclient_cn=%s\nauth=%d\n", h->tls,
		    h->client_cert_auth, h->client_cn, h->auth);
	if (h->root_pw)
		r |= append(&b, "root_password=%s\n", h->root_pw);
	if (h->user)
		r |= append(&b, "user=%s\nuser_password=%s\nuser_prefix=%s\n", h->user, h->user_pw,
			    h->user_prefix);
	r |= append(&b, "auto_compaction=%d\nretention=%s\nquota=%lld\nfsync=%d\n",
		    h->auto_compaction, h->retention, h->quota_bytes, h->fsync);
	r |= append(&b, "auth_token_ttl=%d\nheartbeat=%d\nelection=%d\nstart_timeout=%d\n",
		    h->auth_token_ttl_s, h->heartbeat_ms, h->election_ms, h->start_timeout_ms);
	for (int e = 0; e < h->n_extra; e++)
		r |= append(&b, "extra=%s\n", h->extra[e]);
	for (int i = 0; i < h->n; i++) {
		struct member *m = &h->m[i];

		(void)member_exited(h, m);
		r |= append(&b, "m%d=%d %d %d %d %s\n", i, (int)m->pid, m->client_port,
			    m->peer_port, m->metrics_port, state_name(m->state));
	}
	if (r) {
		r = -ENOMEM;
		goto out;
	}
	r = env_text(h, &env);
	if (r < 0)
		goto out;
	r = -ENOMEM;
	p = xasprintf("%s/state", state_dir);
	tmp = xasprintf("%s/state.tmp", state_dir);
	if (!p || !tmp)
		goto out;
	r = write_file(tmp, b);
	if (r == 0 && rename(tmp, p) < 0)
		r = -errno;
	if (r < 0)
		goto out;
	free(p);
	p = xasprintf("%s/env", state_dir);
	r = p ? write_file(p, env) : -ENOMEM;
	if (r < 0)
		goto out;
	/* Ownership passes to the state directory: nothing is stopped. */
	h->owner = 0;
	harness_release(h);
out:
	free(b);
	free(env);
	free(p);
	free(tmp);
	return r;
}

static char *dup_line_value(const char *v)
{
	size_t n = strcspn(v, "\n");

	return strndup(v, n);
}

int efs_harness_attach(struct efs_harness **ret_h, const char *state_dir)
{
	struct efs_harness *h = NULL;
	char *path, *text, *line;
	int r = -EBADMSG, version = 0;

	path = xasprintf("%s/state", state_dir);
	if (!path)
		return -ENOMEM;
	text = read_file(path, 1 << 20);
	r = text ? 0 : errno == ENOENT ? -ENOENT : -errno;
	free(path);
	if (r < 0)
		return r;
	r = -ENOMEM;
	h = calloc(1, sizeof(*h));
	if (!h)
		goto out;
	h->owner = getpid();
	h->attached = true;
	h->detached = true;
	h->state_dir = strdup(state_dir);
	if (!h->state_dir)
		goto out;
	for (line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
		char *eq = strchr(line, '='), **sp = NULL;
		int mi, pid, cp, pp, mp;
		char st[16];

		if (!eq)
			continue;
#define KEY(k) (eq - line == (long)strlen(k) && !strncmp(line, k, strlen(k)))
		if (KEY("version"))
			version = atoi(eq + 1);
		else if (KEY("members"))
			h->n = atoi(eq + 1);
		else if (KEY("listen_addr"))
			sp = &h->listen_addr;
		else if (KEY("dir"))
			sp = &h->dir;
		else if (KEY("token"))
			sp = &h->token;
		else if (KEY("client_cn"))
			sp = &h->client_cn;
		else if (KEY("root_password"))
			sp = &h->root_pw;
		else if (KEY("user"))
			sp = &h->user;
		else if (KEY("user_password"))
			sp = &h->user_pw;
		else if (KEY("user_prefix"))
			sp = &h->user_prefix;
		else if (KEY("retention"))
			sp = &h->retention;
		else if (KEY("tls"))
			h->tls = atoi(eq + 1);
		else if (KEY("client_cert_auth"))
			h->client_cert_auth = atoi(eq + 1);
		else if (KEY("auth"))
			h->auth = atoi(eq + 1);
		else if (KEY("auto_compaction"))
			h->auto_compaction = atoi(eq + 1);
		else if (KEY("fsync"))
			h->fsync = atoi(eq + 1);
		else if (KEY("quota"))
			h->quota_bytes = atoll(eq + 1);
		else if (KEY("auth_token_ttl"))
			h->auth_token_ttl_s = atoi(eq + 1);
		else if (KEY("heartbeat"))
			h->heartbeat_ms = atoi(eq + 1);
		else if (KEY("election"))
			h->election_ms = atoi(eq + 1);
		else if (KEY("start_timeout"))
			h->start_timeout_ms = atoi(eq + 1);
		else if (KEY("extra")) {
			if (h->n_extra >= MAX_EXTRA_ARGS) {
				r = -EBADMSG;
				goto out;
			}
			sp = &h->extra[h->n_extra++];
		} else if (sscanf(line, "m%d=%d %d %d %d %15s", &mi, &pid, &cp, &pp, &mp, st) ==
			   6) {
			if (mi < 0 || mi >= EFS_HARNESS_MAX_MEMBERS) {
				r = -EBADMSG;
				goto out;
			}
			h->m[mi].pid = pid;
			h->m[mi].client_port = cp;
			h->m[mi].peer_port = pp;
			h->m[mi].metrics_port = mp;
			h->m[mi].state = !strcmp(st, "running") ? EFS_HARNESS_RUNNING
					 : !strcmp(st, "paused") ? EFS_HARNESS_PAUSED
								 : EFS_HARNESS_DEAD;
		}
#undef KEY
		if (sp) {
			free(*sp);
			*sp = dup_line_value(eq + 1);
			if (!*sp)
				goto out;
		}
	}
	r = -EBADMSG;
	if (version != 1 || (h->n != 1 && h->n != 3) || !h->listen_addr || !h->dir ||
	    !h->token || !h->client_cn || !h->retention || (h->auth && !h->root_pw))
		goto out;
	{
		unsigned char buf[sizeof(struct in6_addr)];
		bool v6 = inet_pton(AF_INET, h->listen_addr, buf) != 1;

		r = -ENOMEM;
		h->url_host = v6 ? xasprintf("[%s]", h->listen_addr) : strdup(h->listen_addr);
		if (!h->url_host)
			goto out;
	}
	if (h->tls) {
		h->tls_dir = xasprintf("%s/tls", h->dir);
		h->cacert = xasprintf("%s/ca.crt", h->tls_dir);
		h->cakey = xasprintf("%s/ca.key", h->tls_dir);
		h->server_cert = xasprintf("%s/server.crt", h->tls_dir);
		h->server_key = xasprintf("%s/server.key", h->tls_dir);
		h->client_cert = xasprintf("%s/client.crt", h->tls_dir);
		h->client_key = xasprintf("%s/client.key", h->tls_dir);
		if (!h->tls_dir || !h->cacert || !h->cakey || !h->server_cert ||
		    !h->server_key || !h->client_cert || !h->client_key)
			goto out;
	}
	if (h->start_timeout_ms <= 0)
		h->start_timeout_ms = DEFAULT_START_MS;
	r = build_member_strings(h);
	if (r < 0)
		goto out;
	for (int i = 0; i < h->n; i++)
		(void)member_exited(h, &h->m[i]);
	*ret_h = h;
	h = NULL;
	r = 0;
out:
	free(text);
	if (h) {
		h->owner = 0;
		harness_release(h);
	}
	return r;
}
