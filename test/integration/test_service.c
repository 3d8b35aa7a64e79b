/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsd as a service: the sd_notify messages a service manager gets
 * (READY=1 only once the mount answers, STATUS=, STOPPING=1 at unmount,
 * MAINPID= when it forks) on a datagram socket the test listens on; the
 * configuration file and ETCFS_<NAME> variables with their precedence
 * (command line > environment > file); /healthz and /readyz (503 while
 * the session is suspended by a SIGSTOPped etcd); the mount helper
 * clearing the dead mount a kill -9 left; journald priority prefixes; and
 * the monitoring files (promtool check rules, and every metric they name
 * present on a live /metrics).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "harness.h"
#include "util/log.h"

#include "../support/mount.h"
#include "../support/proc.h"

static struct efs_test_fs fs, fs2; /* fs2: a second node on fs's etcd and image */
static int nsock = -1;
static char nsock_path[300];
/* A daemon the test started itself in the background (not our child). */
static pid_t bg_daemon;

static void fini(void)
{
	if (bg_daemon > 0 && kill(bg_daemon, 0) == 0) {
		if (fs.mnt[0])
			efs_tp_fusermount(fs.mnt, false);
		for (int i = 0; i < 300 && kill(bg_daemon, 0) == 0; i++)
			efs_tp_sleep_ms(50);
		if (kill(bg_daemon, 0) == 0)
			kill(bg_daemon, SIGKILL);
	}
	if (fs2.mnt[0])
		efs_test_fs_stop(&fs2);
	efs_test_fs_stop(&fs);
	if (nsock >= 0)
		close(nsock);
	if (nsock_path[0] == '/')
		unlink(nsock_path);
}

TestSuite(service, .fini = fini, .timeout = 180);

/* ---- helpers ---- */

/* Binds the notification socket: a path, or an abstract name when
 * |abstract|; *env gets the NOTIFY_SOCKET value. */
static void notify_listen(bool abstract, char *env, size_t size)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	socklen_t len;

	nsock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	cr_assert_geq(nsock, 0);
	if (abstract) {
		snprintf(env, size, "@etcfs-test-notify-%d", (int)getpid());
		memcpy(a.sun_path + 1, env + 1, strlen(env) - 1);
		len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(env));
	} else {
		snprintf(nsock_path, sizeof(nsock_path), "%s/notify.sock", fs.dir);
		cr_assert_lt(strlen(nsock_path), sizeof(a.sun_path));
		memcpy(a.sun_path, nsock_path, strlen(nsock_path) + 1);
		cr_assert_lt(strlen(nsock_path), size);
		memcpy(env, nsock_path, strlen(nsock_path) + 1);
		len = sizeof(a);
	}
	cr_assert_eq(bind(nsock, (struct sockaddr *)&a, len), 0, "bind %s: %s", env,
		     strerror(errno));
}

/* One datagram within |ms| into |buf|: its length, or 0 on timeout. */
static size_t notify_recv(char *buf, size_t size, unsigned ms)
{
	struct pollfd p = {.fd = nsock, .events = POLLIN};
	ssize_t n;

	if (poll(&p, 1, (int)ms) <= 0)
		return 0;
	n = recv(nsock, buf, size - 1, 0);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	return (size_t)n;
}

/* Whether |msg| has the line |line| ("READY=1") or a line starting with it
 * when it ends in '='. */
static bool has_line(const char *msg, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = msg; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
		if (!strncmp(p, line, n) && (line[n - 1] == '=' || p[n] == '\n' || !p[n]))
			return true;
	}
	return false;
}

/* Where the log stood when the last daemon was spawned: one log holds every
 * daemon a test starts, and a check is about the one it started last. */
static long log_mark;

/*
 * Starts etcfsd of the build with |args| (NULL-terminated, before DEVICE
 * and MOUNTPOINT, which are the fixture's) and |envs| ("NAME=VALUE" set in
 * the child, NULL-terminated); stderr goes to the fixture's log. Returns
 * the child's pid.
 */
static pid_t spawn_daemon(const char *const *args, const char *const *envs)
{
	char daemon[PATH_MAX];
	const char *argv[48];
	int argc = 0, logfd;
	pid_t pid;

	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	argv[argc++] = daemon;
	for (int i = 0; args && args[i]; i++)
		argv[argc++] = args[i];
	argv[argc++] = fs.image;
	argv[argc++] = fs.mnt;
	argv[argc] = NULL;
	logfd = open(fs.log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	cr_assert_geq(logfd, 0);
	log_mark = (long)lseek(logfd, 0, SEEK_END);
	cr_assert_geq(log_mark, 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		for (int i = 0; envs && envs[i]; i++)
			putenv((char *)envs[i]);
		if (null >= 0)
			dup2(null, STDIN_FILENO);
		dup2(logfd, STDOUT_FILENO);
		dup2(logfd, STDERR_FILENO);
		execv(daemon, (char *const *)argv);
		_exit(127);
	}
	close(logfd);
	return pid;
}

/* Whether the mount answers now (mounted by FUSE, stat succeeds). */
static bool mount_answers(void)
{
	struct stat st;

	return efs_test_is_fuse_mount(fs.mnt) && stat(fs.mnt, &st) == 0;
}

/* Whether the fixture's log has |text| since the last spawn_daemon. */
static bool log_has(const char *text)
{
	char *buf;
	FILE *f = fopen(fs.log, "re");
	size_t n;
	bool found;

	if (!f)
		return false;
	if (fseek(f, log_mark, SEEK_SET) != 0) {
		fclose(f);
		return false;
	}
	buf = calloc(1, 1 << 20);
	cr_assert_not_null(buf);
	n = fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	buf[n] = '\0';
	found = strstr(buf, text) != NULL;
	free(buf);
	return found;
}

/* Waits for a mount the test started itself to answer and to log ready. */
static void wait_mounted(pid_t child)
{
	char tail[4096];
	uint64_t end = efs_tp_now_ms() + 20000;
	int st;

	while (!(mount_answers() && log_has("info: mounted "))) {
		if (child > 0 && waitpid(child, &st, WNOHANG) == child) {
			efs_tp_file_tail(fs.log, tail, sizeof(tail));
			cr_assert_fail("etcfsd exited during start; log:\n%s", tail);
		}
		if (efs_tp_now_ms() > end) {
			efs_tp_file_tail(fs.log, tail, sizeof(tail));
			cr_assert_fail("the mount did not answer in 20 s; log:\n%s", tail);
		}
		efs_tp_sleep_ms(20);
	}
}

/* Unmounts and waits for our foreground child to exit 0. */
static void unmount_child(pid_t pid)
{
	int st;

	cr_assert_eq(efs_tp_fusermount(fs.mnt, false), 0);
	cr_assert_eq(efs_tp_wait_pid(pid, &st, 30000), 1, "etcfsd did not exit after unmount");
	fs.daemon = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "etcfsd exit status %d", st);
}

/* GET http://|addr||path|: the status code, the body into |body|. */
static int http_get(const char *addr, const char *path, char *body, size_t size)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	char host[64], req[256], resp[8192];
	const char *colon = strrchr(addr, ':'), *b;
	size_t got = 0;
	int fd, code = -1;

	cr_assert_not_null(colon);
	snprintf(host, sizeof(host), "%.*s", (int)(colon - addr), addr);
	sin.sin_port = htons((uint16_t)atoi(colon + 1));
	cr_assert_eq(inet_pton(AF_INET, host, &sin.sin_addr), 1);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		close(fd);
		return -errno;
	}
	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	for (;;) {
		ssize_t n = read(fd, resp + got, sizeof(resp) - 1 - got);

		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	resp[got] = '\0';
	if (sscanf(resp, "HTTP/1.1 %d", &code) != 1)
		return -EPROTO;
	b = strstr(resp, "\r\n\r\n");
	snprintf(body, size, "%s", b ? b + 4 : "");
	return code;
}

/* Polls |path| until it answers |code|, at most |ms|; the last status. */
static int wait_status(const char *path, int code, unsigned ms, char *body, size_t size)
{
	uint64_t end = efs_tp_now_ms() + ms;
	int r;

	for (;;) {
		r = http_get(fs.metrics, path, body, size);
		if (r == code || efs_tp_now_ms() > end)
			return r;
		efs_tp_sleep_ms(50);
	}
}

static void start_unmounted(int ttl)
{
	struct efs_test_fs_opts o = {.no_mount = true, .session_ttl = ttl};

	efs_test_fs_start(&fs, &o);
}

/* ---- 1. sd_notify ---- */

Test(service, notify_ready_only_once_the_mount_answers_and_stopping_at_unmount)
{
	char env[160], msg[1024], ready_msg[1024] = "";
	const char *envs[3] = {env, "WATCHDOG_USEC=400000", NULL};
	const char *args[] = {"-f", "--endpoints", NULL, "--node-id", "svc1", NULL};
	char notify_env[128];
	bool ready = false, stopping = false;
	uint64_t end;
	pid_t pid;

	start_unmounted(0);
	notify_listen(false, notify_env, sizeof(notify_env));
	snprintf(env, sizeof(env), "NOTIFY_SOCKET=%s", notify_env);
	args[2] = fs.endpoints;
	pid = spawn_daemon(args, envs);
	fs.daemon = pid;

	/* Every message before READY=1 comes while the mount does not yet
	 * serve; READY=1 comes once it answers. */
	end = efs_tp_now_ms() + 20000;
	while (!ready && efs_tp_now_ms() < end) {
		if (!notify_recv(msg, sizeof(msg), 50))
			continue;
		cr_assert(!has_line(msg, "STOPPING=1"), "STOPPING before READY: %s", msg);
		if (has_line(msg, "READY=1")) {
			ready = true;
			snprintf(ready_msg, sizeof(ready_msg), "%s", msg);
			cr_assert(mount_answers(), "READY=1 arrived before the mount answered");
		}
	}
	cr_assert(ready, "no READY=1 within 20 s");
	cr_assert(has_line(ready_msg, "STATUS="), "READY=1 without STATUS: %s", ready_msg);
	cr_assert(strstr(ready_msg, "serving") && strstr(ready_msg, "svc1"),
		  "STATUS does not say what serves: %s", ready_msg);
	/* In the foreground nothing forks: no MAINPID. */
	cr_assert(!has_line(ready_msg, "MAINPID="), "MAINPID in the foreground: %s", ready_msg);
	/* WatchdogSec=0.4s: keep-alives at least every 0.2 s. */
	{
		unsigned pings = 0;

		end = efs_tp_now_ms() + 1000;
		while (efs_tp_now_ms() < end)
			if (notify_recv(msg, sizeof(msg), 50) && has_line(msg, "WATCHDOG=1"))
				pings++;
		cr_assert_geq(pings, 3, "%u WATCHDOG=1 in 1 s with WATCHDOG_USEC=400000", pings);
	}

	cr_assert_eq(efs_tp_fusermount(fs.mnt, false), 0);
	end = efs_tp_now_ms() + 20000;
	while (!stopping && efs_tp_now_ms() < end) {
		if (notify_recv(msg, sizeof(msg), 50) && has_line(msg, "STOPPING=1"))
			stopping = true;
	}
	cr_assert(stopping, "no STOPPING=1 after the unmount");
	{
		int st;

		cr_assert_eq(efs_tp_wait_pid(pid, &st, 30000), 1);
		fs.daemon = 0;
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
}

Test(service, notify_background_start_sends_mainpid_on_an_abstract_socket)
{
	char notify_env[128], env[160], msg[1024], out[4096];
	const char *argv[8];
	char daemon[PATH_MAX], cmd[PATH_MAX + 64];
	bool ready = false;
	pid_t mainpid = 0;
	int r;

	start_unmounted(0);
	notify_listen(true, notify_env, sizeof(notify_env));
	snprintf(env, sizeof(env), "%s", notify_env);
	setenv("NOTIFY_SOCKET", env, 1);
	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	argv[0] = daemon;
	argv[1] = "--endpoints";
	argv[2] = fs.endpoints;
	argv[3] = "--node-id";
	argv[4] = "svcbg";
	argv[5] = fs.image;
	argv[6] = fs.mnt;
	argv[7] = NULL;
	/* Without -f: returns once the mount answers. */
	r = efs_tp_run_capture(daemon, argv, out, sizeof(out), 30000);
	unsetenv("NOTIFY_SOCKET");
	cr_assert_eq(r, 0, "background etcfsd: %d: %s", r, out);
	cr_assert(mount_answers());
	while (notify_recv(msg, sizeof(msg), 2000)) {
		if (!has_line(msg, "READY=1"))
			continue;
		ready = true;
		cr_assert(has_line(msg, "MAINPID="), "READY=1 without MAINPID: %s", msg);
		mainpid = (pid_t)atoi(strstr(msg, "MAINPID=") + 8);
		break;
	}
	cr_assert(ready, "no READY=1 from the background daemon");
	cr_assert_gt(mainpid, 0);
	bg_daemon = mainpid;
	snprintf(cmd, sizeof(cmd), "/proc/%d/exe", (int)mainpid);
	cr_assert_eq(access(cmd, F_OK), 0, "MAINPID %d is not a live process", (int)mainpid);
	cr_assert_eq(efs_tp_fusermount(fs.mnt, false), 0);
	for (int i = 0; i < 400 && kill(mainpid, 0) == 0; i++)
		efs_tp_sleep_ms(50);
	cr_assert_neq(kill(mainpid, 0), 0, "MAINPID %d still runs after unmount", (int)mainpid);
	bg_daemon = 0;
}

/* ---- 2. Configuration ---- */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");

	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

Test(service, config_file_then_environment_then_command_line)
{
	char conf[400], text[1024], env_conf[460], out[4096], daemon[PATH_MAX];
	const char *envs1[] = {env_conf, NULL};
	const char *envs2[] = {env_conf, "ETCFS_NODE_ID=envnode",
			       "ETCFS_ENDPOINTS=http://127.0.0.1:1", NULL};
	const char *args1[] = {"-f", NULL};
	const char *args2[] = {"-f", "--endpoints", NULL, NULL};
	const char *bad_argv[6];
	pid_t pid;
	int r;

	start_unmounted(0);
	snprintf(conf, sizeof(conf), "%s/etcfs.conf", fs.dir);
	snprintf(env_conf, sizeof(env_conf), "ETCFS_CONFIG=%s", conf);
	/* The file alone: endpoints, node id, metrics address, log level. */
	snprintf(text, sizeof(text),
		 "# etcfs test configuration\n"
		 "endpoints = %s\n"
		 "\n"
		 "node-id = filenode\n"
		 "metrics-addr = 127.0.0.1:0\n"
		 "log-level = debug\n"
		 "session-ttl = 4\n",
		 fs.endpoints);
	write_file(conf, text);
	pid = spawn_daemon(args1, envs1);
	fs.daemon = pid;
	wait_mounted(pid);
	cr_assert(log_has("as node filenode"), "the file's node-id was not used");
	cr_assert(log_has("metrics: listening on http://127.0.0.1:"),
		  "the file's metrics-addr was not used");
	cr_assert(log_has(" debug: "), "the file's log-level was not used");
	unmount_child(pid);

	/* The environment over the file (node id); the command line over the
	 * environment (endpoints: the variable names a dead port). */
	args2[2] = fs.endpoints;
	pid = spawn_daemon(args2, envs2);
	fs.daemon = pid;
	wait_mounted(pid);
	cr_assert(log_has("as node envnode"), "ETCFS_NODE_ID did not override the file");
	unmount_child(pid);

	/* The command line over the environment for a daemon option, and
	 * --config naming the file. */
	{
		const char *envs3[] = {"ETCFS_NODE_ID=envnode2", NULL};
		const char *args3[] = {"-f", "--config", conf, "--node-id", "flagnode", NULL};

		pid = spawn_daemon(args3, envs3);
		fs.daemon = pid;
		wait_mounted(pid);
		cr_assert(log_has("as node flagnode"), "--node-id did not override ETCFS_NODE_ID");
		unmount_child(pid);
	}

	/* An unknown key is refused, naming the file and the line. */
	write_file(conf, "# comment\nnode-id = x\nno-such-option = 1\n");
	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	bad_argv[0] = daemon;
	bad_argv[1] = "--config";
	bad_argv[2] = conf;
	bad_argv[3] = fs.image;
	bad_argv[4] = fs.mnt;
	bad_argv[5] = NULL;
	r = efs_tp_run_capture(daemon, bad_argv, out, sizeof(out), 30000);
	cr_assert_eq(r, 2, "unknown key: exit %d: %s", r, out);
	snprintf(text, sizeof(text), "%s:3: unknown key 'no-such-option'", conf);
	cr_assert(strstr(out, text), "no FILE:LINE error: %s", out);
	/* A line without '=' and a bad value, too. */
	write_file(conf, "node-id\n");
	r = efs_tp_run_capture(daemon, bad_argv, out, sizeof(out), 30000);
	snprintf(text, sizeof(text), "%s:1: expected 'key = value'", conf);
	cr_assert(r == 2 && strstr(out, text), "line without '=': %d: %s", r, out);
	write_file(conf, "\n\nsession-ttl = soon\n");
	r = efs_tp_run_capture(daemon, bad_argv, out, sizeof(out), 30000);
	snprintf(text, sizeof(text), "%s:3: session-ttl: 'soon'", conf);
	cr_assert(r == 2 && strstr(out, text), "bad value: %d: %s", r, out);
	/* A bad environment value names the variable. */
	setenv("ETCFS_IO_THREADS", "many", 1);
	write_file(conf, "");
	r = efs_tp_run_capture(daemon, bad_argv, out, sizeof(out), 30000);
	unsetenv("ETCFS_IO_THREADS");
	cr_assert(r == 2 && strstr(out, "ETCFS_IO_THREADS: 'many'"), "bad env: %d: %s", r, out);
	/* The tools read the same file and skip etcfsd's own keys. */
	write_file(conf, "session-ttl = 4\nio-threads = 2\n");
	setenv("ETCFS_CONFIG", conf, 1);
	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsctl", "df", fs.image, NULL);
	unsetenv("ETCFS_CONFIG");
	cr_assert_eq(r, 0, "etcfsctl with etcfsd keys in the file: %d: %s", r, out);
}

/* ---- 3. /healthz and /readyz ---- */

Test(service, healthz_and_readyz_follow_the_session)
{
	struct efs_test_fs_opts o = {.metrics = true, .session_ttl = 4};
	char body[1024], notify_env[128], msg[1024];
	bool seen;
	uint64_t end;
	int r;

	/* The fixture's daemon inherits the notification socket. */
	notify_listen(true, notify_env, sizeof(notify_env));
	setenv("NOTIFY_SOCKET", notify_env, 1);
	efs_test_fs_start(&fs, &o);
	unsetenv("NOTIFY_SOCKET");
	r = http_get(fs.metrics, "/healthz", body, sizeof(body));
	cr_assert_eq(r, 200, "healthz %d: %s", r, body);
	cr_assert(!strncmp(body, "ok", 2), "healthz body: %s", body);
	r = http_get(fs.metrics, "/readyz", body, sizeof(body));
	cr_assert_eq(r, 200, "readyz %d: %s", r, body);
	cr_assert(strstr(body, "serving") && strchr(body, '\n') == body + strlen(body) - 1,
		  "readyz body is not one line saying it serves: %s", body);

	/* etcd stops answering: the session suspends after TTL/2. */
	cr_assert_eq(efs_harness_pause(fs.etcd, 0), 0);
	r = wait_status("/readyz", 503, 10000, body, sizeof(body));
	cr_assert_eq(r, 503, "readyz stayed %d with etcd stopped: %s", r, body);
	cr_assert(strstr(body, "suspended"), "readyz 503 body: %s", body);
	seen = false;
	end = efs_tp_now_ms() + 5000;
	while (!seen && efs_tp_now_ms() < end)
		seen = notify_recv(msg, sizeof(msg), 50) && strstr(msg, "STATUS=suspended");
	cr_assert(seen, "no STATUS=suspended while etcd is stopped");
	r = http_get(fs.metrics, "/healthz", body, sizeof(body));
	cr_assert_eq(r, 200, "healthz while suspended %d: %s", r, body);
	cr_assert_eq(efs_harness_resume(fs.etcd, 0), 0);
	r = wait_status("/readyz", 200, 15000, body, sizeof(body));
	cr_assert_eq(r, 200, "readyz did not come back after etcd resumed: %d %s", r, body);
	seen = false;
	end = efs_tp_now_ms() + 5000;
	while (!seen && efs_tp_now_ms() < end)
		seen = notify_recv(msg, sizeof(msg), 50) && strstr(msg, "STATUS=serving");
	cr_assert(seen, "no STATUS=serving after etcd resumed");
	efs_test_fs_unmount(&fs);
}

/* ---- 4. The mount helper and a dead mount ---- */

Test(service, mount_helper_clears_the_dead_mount_of_a_killed_daemon)
{
	char helper[PATH_MAX], daemon[PATH_MAX], opts[1024], out[8192];
	const char *argv[8];
	struct statvfs sv;
	int r;

	start_unmounted(2);
	efs_test_fs_mount(&fs, NULL);
	kill(fs.daemon, SIGKILL);
	waitpid(fs.daemon, NULL, 0);
	fs.daemon = 0;
	cr_assert(efs_test_is_fuse_mount(fs.mnt), "no mount left behind by the kill");
	/* statfs: a stat may be answered from the attribute cache. */
	cr_assert_neq(statvfs(fs.mnt, &sv), 0);
	cr_assert_eq(errno, ENOTCONN, "the dead mount: %s", strerror(errno));

	snprintf(helper, sizeof(helper), "%s/etcfsd/mount.etcfs", getenv("ETCFS_SOURCE_ROOT"));
	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	snprintf(opts, sizeof(opts), "endpoints=%s,node=node1,session-ttl=2", fs.endpoints);
	setenv("ETCFSD", daemon, 1);
	argv[0] = helper;
	argv[1] = fs.image;
	argv[2] = fs.mnt;
	argv[3] = "-o";
	argv[4] = opts;
	argv[5] = NULL;
	r = efs_tp_run_capture(helper, argv, out, sizeof(out), 60000);
	unsetenv("ETCFSD");
	cr_assert_eq(r, 0, "mount.etcfs over the dead mount: %d: %s", r, out);
	cr_assert(strstr(out, "dead") && strstr(out, "unmounting"),
		  "no message about the dead mount: %s", out);
	cr_assert(mount_answers(), "the new mount does not answer");
	{
		int fd;
		char p[400];

		snprintf(p, sizeof(p), "%s/after-crash", fs.mnt);
		fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
		cr_assert_geq(fd, 0, "create on the new mount: %s", strerror(errno));
		cr_assert_eq(write(fd, "x", 1), 1);
		close(fd);
	}
	/* Only one mount is left on the directory's stack's top: unmount it
	 * and nothing of etcfs remains. */
	{
		DIR *dp;
		struct dirent *de;
		char path[300], cmdline[4096];

		dp = opendir("/proc");
		cr_assert_not_null(dp);
		while ((de = readdir(dp))) {
			FILE *f;
			size_t n;

			if (de->d_name[0] < '0' || de->d_name[0] > '9')
				continue;
			snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
			f = fopen(path, "re");
			if (!f)
				continue;
			n = fread(cmdline, 1, sizeof(cmdline) - 1, f);
			fclose(f);
			cmdline[n] = '\0';
			for (size_t i = 0; i + 1 < n; i++)
				if (!cmdline[i])
					cmdline[i] = ' ';
			if (strstr(cmdline, "etcfsd") && strstr(cmdline, fs.mnt) &&
			    !strstr(cmdline, "mount.etcfs")) {
				bg_daemon = (pid_t)atoi(de->d_name);
			}
		}
		closedir(dp);
	}
	cr_assert_gt(bg_daemon, 0, "the new daemon was not found");
	cr_assert_eq(efs_tp_fusermount(fs.mnt, false), 0);
	for (int i = 0; i < 400 && kill(bg_daemon, 0) == 0; i++)
		efs_tp_sleep_ms(50);
	cr_assert_neq(kill(bg_daemon, 0), 0, "the new daemon did not exit after unmount");
	bg_daemon = 0;
	cr_assert(!efs_test_is_fuse_mount(fs.mnt), "a mount is left on %s", fs.mnt);
}

/* ---- 5. Log lines for the journal ---- */

static int fmt(char *buf, size_t size, bool journal, enum efs_log_level l, const char *f, ...)
	__attribute__((format(printf, 5, 6)));
static int fmt(char *buf, size_t size, bool journal, enum efs_log_level l, const char *f, ...)
{
	va_list ap;
	int n;

	va_start(ap, f);
	n = efs_log_format(buf, size, journal, l, f, ap);
	va_end(ap);
	return n;
}

Test(service, log_lines_carry_journal_priorities_only_on_the_journal)
{
	char line[256], js[64];
	struct stat st;
	int p[2];

	fmt(line, sizeof(line), true, EFS_LOG_ERR, "disk %s", "gone");
	cr_assert_str_eq(line, "<3>disk gone\n");
	fmt(line, sizeof(line), true, EFS_LOG_WARN, "w");
	cr_assert_str_eq(line, "<4>w\n");
	fmt(line, sizeof(line), true, EFS_LOG_INFO, "i");
	cr_assert_str_eq(line, "<6>i\n");
	fmt(line, sizeof(line), true, EFS_LOG_DEBUG, "d");
	cr_assert_str_eq(line, "<7>d\n");
	fmt(line, sizeof(line), false, EFS_LOG_WARN, "w");
	cr_assert(line[0] != '<' && strstr(line, " warning: w\n"), "human line: %s", line);

	/* JOURNAL_STREAM names the journal's socket; a stderr elsewhere
	 * (redirected to a file or a terminal) does not match it. */
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(fstat(p[1], &st), 0);
	snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	cr_assert(efs_log_stream_is_journal(js, p[1]));
	cr_assert(!efs_log_stream_is_journal(js, STDIN_FILENO));
	cr_assert(!efs_log_stream_is_journal(NULL, p[1]));
	cr_assert(!efs_log_stream_is_journal("garbage", p[1]));
	close(p[0]);
	close(p[1]);
}

/* ---- 6. The monitoring files ---- */

/* Adds the etcfs_* names in |text| to the list |names| (|*n| of them). */
static void collect_names(const char *text, char names[][96], size_t *n, size_t max)
{
	regex_t re;
	regmatch_t m;
	const char *p = text;

	cr_assert_eq(regcomp(&re, "etcfs_[a-z0-9_]+", REG_EXTENDED), 0);
	while (regexec(&re, p, 1, &m, 0) == 0) {
		char name[96];
		size_t len = (size_t)(m.rm_eo - m.rm_so);
		bool dup = false;

		snprintf(name, sizeof(name), "%.*s", (int)len, p + m.rm_so);
		p += m.rm_eo;
		for (size_t i = 0; i < *n && !dup; i++)
			dup = !strcmp(names[i], name);
		if (!dup && *n < max)
			snprintf(names[(*n)++], 96, "%s", name);
	}
	regfree(&re);
}

static char *read_all(const char *path)
{
	FILE *f = fopen(path, "re");
	char *buf;
	size_t n;

	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	buf = calloc(1, 1 << 20);
	cr_assert_not_null(buf);
	n = fread(buf, 1, (1 << 20) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* Whether /metrics text |page| has a sample or a TYPE line of |name|
 * (histogram series end in _bucket, _sum, _count). */
static bool page_has(const char *page, const char name[96])
{
	char pat[300];
	static const char *const suffix[] = {"", "_bucket", "_sum", "_count"};

	snprintf(pat, sizeof(pat), "# TYPE %.96s ", name);
	if (strstr(page, pat))
		return true;
	for (size_t i = 0; i < 4; i++) {
		size_t nl = strlen(name), sl = strlen(suffix[i]);

		if (nl > sl && !strcmp(name + nl - sl, suffix[i])) {
			snprintf(pat, sizeof(pat), "# TYPE %.*s histogram", (int)(nl - sl), name);
			if (sl && strstr(page, pat))
				return true;
		}
	}
	return false;
}

Test(service, monitoring_rules_pass_promtool_and_name_only_real_metrics)
{
	static char names[512][96];
	struct efs_test_fs_opts o = {.metrics = true};
	char rules[PATH_MAX], dash[PATH_MAX], out[16384], missing[4096] = "";
	const char *argv[5];
	const char *src = getenv("ETCFS_SOURCE_ROOT");
	char *text, *page;
	size_t n = 0;
	int r;

	cr_assert_not_null(src, "ETCFS_SOURCE_ROOT is not set");
	snprintf(rules, sizeof(rules), "%s/packaging/monitoring/etcfs-alerts.yml", src);
	snprintf(dash, sizeof(dash), "%s/packaging/monitoring/etcfs-dashboard.json", src);
	/* promtool is required: a missing one fails this test. */
	cr_assert(access("/usr/bin/promtool", X_OK) == 0,
		  "promtool not found (apt-get install prometheus; packaging/install-deps.sh)");
	argv[0] = "/usr/bin/promtool";
	argv[1] = "check";
	argv[2] = "rules";
	argv[3] = rules;
	argv[4] = NULL;
	r = efs_tp_run_capture(argv[0], argv, out, sizeof(out), 60000);
	cr_assert_eq(r, 0, "promtool check rules %s: %d:\n%s", rules, r, out);

	text = read_all(rules);
	collect_names(text, names, &n, 512);
	free(text);
	text = read_all(dash);
	collect_names(text, names, &n, 512);
	free(text);
	cr_assert_gt(n, 10, "only %zu metric names in the monitoring files", n);

	efs_test_fs_start(&fs, &o);
	r = efs_tp_metrics_get(fs.metrics, &page);
	cr_assert_eq(r, 0, "GET /metrics: %s", strerror(-r));
	for (size_t i = 0; i < n; i++) {
		if (!page_has(page, names[i]) && strlen(missing) + 100 < sizeof(missing)) {
			strcat(missing, " ");
			strcat(missing, names[i]);
		}
	}
	free(page);
	cr_assert(!missing[0], "metrics named by the monitoring files but not on /metrics:%s",
		  missing);
	efs_test_fs_unmount(&fs);
}

/* ---- Publication batches, pending bytes and the clock skew ---- */

static void write_small(const char *path)
{
	char buf[65536];
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);

	cr_assert(fd >= 0, "create %s: %s", path, strerror(errno));
	memset(buf, 'p', sizeof(buf));
	cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf), "write %s", path);
	cr_assert_eq(close(fd), 0);
}

Test(service, metrics_show_publication_batches_pending_bytes_and_clock_skew)
{
	static const char *const args[] = {"--flush-interval", "60000", NULL};
	struct efs_test_fs_opts o = {.metrics = true, .mount_args = args};
	double sum0, count0, pending = 0, peers = 0, skew;
	char path[3][400];
	int fd;

	efs_test_fs_start(&fs, &o);
	sum0 = efs_test_fs_metric(&fs, "etcfs_data_publish_batch_inodes_sum");
	count0 = efs_test_fs_metric(&fs, "etcfs_data_publish_batch_inodes_count");
	/* Written, not published (the flush interval is a minute): pending. */
	for (int i = 0; i < 3; i++) {
		snprintf(path[i], sizeof(path[i]), "%s/pending%d", fs.mnt, i);
		write_small(path[i]);
	}
	pending = efs_test_fs_metric(&fs, "etcfs_data_pending_bytes");
	cr_assert_geq(pending, 3 * 65536.0, "etcfs_data_pending_bytes %.0f after 192 KiB", pending);
	/* fsync publishes them: batches of the three inodes in all. */
	for (int i = 0; i < 3; i++) {
		fd = open(path[i], O_WRONLY | O_CLOEXEC);
		cr_assert(fd >= 0 && fsync(fd) == 0, "fsync %s: %s", path[i], strerror(errno));
		close(fd);
	}
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_data_pending_bytes"), 0);
	cr_assert_geq(efs_test_fs_metric(&fs, "etcfs_data_publish_batch_inodes_sum") - sum0, 3);
	cr_assert_geq(efs_test_fs_metric(&fs, "etcfs_data_publish_batch_inodes_count") - count0, 1);
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_data_publish_batch_inodes_bucket{le=\"+Inf\"}"),
		     efs_test_fs_metric(&fs, "etcfs_data_publish_batch_inodes_count"));

	/* Alone, the node is the cluster; a second node reads the first's
	 * clock at its first usage poll (right after its start). */
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_clock_skew_peers"), 0);
	cr_assert_eq(efs_test_fs_metric(&fs, "etcfs_clock_skew_seconds"), 0);
	fs2 = fs;
	fs2.etcd = NULL;
	fs2.daemon = 0;
	fs2.dir[0] = '\0'; /* fs's stop removes the directory */
	fs2.metrics[0] = '\0';
	fs2.opts.node = "node2";
	snprintf(fs2.mnt, sizeof(fs2.mnt), "%s/mnt2", fs.dir);
	snprintf(fs2.log, sizeof(fs2.log), "%s/node2.log", fs.dir);
	cr_assert_eq(mkdir(fs2.mnt, 0755), 0, "mkdir %s: %s", fs2.mnt, strerror(errno));
	efs_test_fs_mount(&fs2, NULL);
	for (int waited = 0; waited < 10000 && peers < 1; waited += 200) {
		peers = efs_test_fs_metric(&fs2, "etcfs_clock_skew_peers");
		if (peers < 1)
			efs_tp_sleep_ms(200);
	}
	cr_assert_eq(peers, 1, "node2 measured %.0f peers' clocks", peers);
	/* One host, one clock: half the probe's error at most. */
	skew = efs_test_fs_metric(&fs2, "etcfs_clock_skew_seconds");
	cr_assert(skew > -0.25 && skew < 0.25, "node2's skew %g s", skew);
	efs_test_fs_unmount(&fs2);
	efs_test_fs_unmount(&fs);
}
