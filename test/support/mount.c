/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The real-mount fixture of test/support/mount.h. Every process it starts
 * is a child stopped by PID; the daemon runs in the foreground (-f) with
 * its stderr in a log file of the fixture's directory, and dies with the
 * test (PR_SET_PDEATHSIG: SIGTERM, so that it still leaves cleanly).
 */
#include "mount.h"
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

/* How long a mount may take to answer, and a daemon to exit. */
#define MOUNT_WAIT_MS  20000
#define EXIT_WAIT_MS   30000
#define RUN_TIMEOUT_MS 120000

const char *efs_test_build_root(void)
{
	const char *root = efs_tp_build_root();

	cr_assert_not_null(root, "mount fixture: ETCFS_BUILD_ROOT is not set and the build "
				 "root cannot be found from /proc/self/exe");
	return root;
}

const char *efs_test_command_path(const char *cmd, char *buf, size_t size)
{
	int n = snprintf(buf, size, "%s/etcfsd/%s", efs_test_build_root(), cmd);

	cr_assert(n > 0 && (size_t)n < size, "mount fixture: path of %s too long", cmd);
	return buf;
}

bool efs_test_is_fuse_mount(const char *dir)
{
	FILE *fp = fopen("/proc/self/mountinfo", "re");
	char line[4096];
	bool found = false;

	if (!fp)
		return false;
	/* "id parent maj:min root mountpoint opts [optional...] - fstype source superopts" */
	while (fgets(line, sizeof(line), fp)) {
		char mp[PATH_MAX], *sep, fstype[64];

		if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
			continue;
		if (strcmp(mp, dir) != 0)
			continue;
		sep = strstr(line, " - ");
		if (!sep || sscanf(sep + 3, "%63s", fstype) != 1)
			continue;
		/* The last mount on the directory wins. */
		found = strncmp(fstype, "fuse", 4) == 0;
	}
	fclose(fp);
	return found;
}

static off_t file_size(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? st.st_size : 0;
}

static void push(const char **argv, int *argc, int max, const char *a)
{
	cr_assert_lt(*argc, max - 1, "mount fixture: too many daemon arguments");
	argv[(*argc)++] = a;
	argv[*argc] = NULL;
}

void efs_test_fs_mount(struct efs_test_fs *f, const char *const *extra_args)
{
	char daemon[PATH_MAX], ttl[32], quota[32], tail[4096];
	const char *argv[64];
	int argc = 0, st, logfd;
	bool quiet = false;
	off_t log_start;
	uint64_t deadline;
	pid_t pid;

	cr_assert_eq(f->daemon, 0, "mount fixture: a daemon is already running");
	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	push(argv, &argc, 64, daemon);
	push(argv, &argc, 64, "-f");
	push(argv, &argc, 64, "--endpoints");
	push(argv, &argc, 64, f->endpoints);
	push(argv, &argc, 64, "--node-id");
	push(argv, &argc, 64, f->opts.node);
	if (f->opts.session_ttl > 0) {
		snprintf(ttl, sizeof(ttl), "%d", f->opts.session_ttl);
		push(argv, &argc, 64, "--session-ttl");
		push(argv, &argc, 64, ttl);
	}
	if (f->opts.etcd_quota) {
		snprintf(quota, sizeof(quota), "%llu", (unsigned long long)f->opts.etcd_quota);
		push(argv, &argc, 64, "--etcd-quota");
		push(argv, &argc, 64, quota);
	}
	if (f->opts.metrics) {
		push(argv, &argc, 64, "--metrics-addr");
		push(argv, &argc, 64, "127.0.0.1:0");
	}
	for (int i = 0; f->opts.mount_args && f->opts.mount_args[i]; i++)
		push(argv, &argc, 64, f->opts.mount_args[i]);
	for (int i = 0; extra_args && extra_args[i]; i++)
		push(argv, &argc, 64, extra_args[i]);
	/* Below info the daemon does not log its readiness. */
	for (int i = 0; i < argc; i++)
		if (strncmp(argv[i], "--log-level", 11) == 0)
			quiet = true;
	push(argv, &argc, 64, f->image);
	push(argv, &argc, 64, f->mnt);

	logfd = open(f->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	cr_assert_geq(logfd, 0, "mount fixture: cannot open %s: %s", f->log, strerror(errno));
	log_start = file_size(f->log);
	f->metrics[0] = '\0';

	pid = fork();
	cr_assert_geq(pid, 0, "mount fixture: fork: %s", strerror(errno));
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);

		/* Leave cleanly if the test dies. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (null >= 0)
			dup2(null, STDIN_FILENO);
		dup2(logfd, STDOUT_FILENO);
		dup2(logfd, STDERR_FILENO);
		execv(daemon, (char *const *)argv);
		dprintf(logfd, "mount fixture: exec %s: %s\n", daemon, strerror(errno));
		_exit(127);
	}
	close(logfd);
	f->daemon = pid;

	deadline = efs_tp_now_ms() + MOUNT_WAIT_MS;
	for (;;) {
		struct stat sb;

		if (waitpid(pid, &st, WNOHANG) == pid) {
			f->daemon = 0;
			efs_tp_file_tail(f->log, tail, sizeof(tail));
			cr_assert_fail("mount fixture: etcfsd exited during mount (%s %d); log:\n%s",
				 WIFEXITED(st) ? "status" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), tail);
		}
		/* Mounted, answering, and the daemon itself considers it ready. */
		if (efs_test_is_fuse_mount(f->mnt) && stat(f->mnt, &sb) == 0 &&
		    (quiet || efs_tp_logged_ready(f->log, log_start)) &&
		    (!f->opts.metrics || efs_tp_metrics_addr(f->log, log_start, f->metrics, sizeof(f->metrics))))
			break;
		if (efs_tp_now_ms() >= deadline) {
			efs_tp_file_tail(f->log, tail, sizeof(tail));
			cr_assert_fail("mount fixture: %s did not answer within %d ms; log:\n%s", f->mnt,
				 MOUNT_WAIT_MS, tail);
		}
		efs_tp_sleep_ms(20);
	}
}

void efs_test_fs_unmount(struct efs_test_fs *f)
{
	char tail[4096];
	int st, r;

	cr_assert_neq(f->daemon, 0, "mount fixture: no daemon to unmount");
	r = efs_tp_fusermount(f->mnt, false);
	if (r != 0) {
		/* Busy or already dead: do not leave anything behind. */
		kill(f->daemon, SIGTERM);
		if (efs_tp_wait_pid(f->daemon, &st, EXIT_WAIT_MS) != 1) {
			kill(f->daemon, SIGKILL);
			waitpid(f->daemon, &st, 0);
		}
		f->daemon = 0;
		if (efs_test_is_fuse_mount(f->mnt))
			efs_tp_fusermount(f->mnt, true);
		cr_assert_fail("mount fixture: fusermount3 -u %s failed (%d)", f->mnt, r);
	}
	r = efs_tp_wait_pid(f->daemon, &st, EXIT_WAIT_MS);
	if (r != 1) {
		kill(f->daemon, SIGKILL);
		waitpid(f->daemon, &st, 0);
		f->daemon = 0;
		efs_tp_file_tail(f->log, tail, sizeof(tail));
		cr_assert_fail("mount fixture: etcfsd did not exit within %d ms after unmount; log:\n%s",
			 EXIT_WAIT_MS, tail);
	}
	f->daemon = 0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		efs_tp_file_tail(f->log, tail, sizeof(tail));
		cr_assert_fail("mount fixture: etcfsd exited with %s %d after unmount; log:\n%s",
			 WIFEXITED(st) ? "status" : "signal",
			 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), tail);
	}
}

void efs_test_fs_kill(struct efs_test_fs *f)
{
	int st;

	cr_assert_neq(f->daemon, 0, "mount fixture: no daemon to kill");
	kill(f->daemon, SIGKILL);
	waitpid(f->daemon, &st, 0);
	f->daemon = 0;
	efs_tp_fusermount(f->mnt, true);
	cr_assert(!efs_test_is_fuse_mount(f->mnt), "mount fixture: %s still mounted after kill",
		  f->mnt);
}

static int run_cmd(struct efs_test_fs *f, char *out, size_t out_size, const char *cmd,
		   const char *const *args)
{
	char path[PATH_MAX];
	int r;

	efs_test_command_path(cmd, path, sizeof(path));
	r = efs_tp_run_tool(path, cmd, f->endpoints, args, out, out_size, RUN_TIMEOUT_MS);
	cr_assert_neq(r, -3, "mount fixture: too many arguments for %s", cmd);
	cr_assert_neq(r, -2, "mount fixture: %s did not finish within %d ms; output:\n%s", cmd,
		      RUN_TIMEOUT_MS, out ? out : "");
	return r;
}

int efs_test_fs_run(struct efs_test_fs *f, char *out, size_t out_size, const char *cmd, ...)
{
	const char *args[56];
	va_list ap;
	int n;

	va_start(ap, cmd);
	n = efs_tp_collect_args(args, 56, ap);
	va_end(ap);
	cr_assert_geq(n, 0, "mount fixture: too many arguments for %s", cmd);
	return run_cmd(f, out, out_size, cmd, args);
}

int efs_test_fs_runv(struct efs_test_fs *f, char *out, size_t out_size, const char *cmd,
		     const char *const *args)
{
	return run_cmd(f, out, out_size, cmd, args);
}

void efs_test_fs_start(struct efs_test_fs *f, const struct efs_test_fs_opts *o)
{
	struct efs_harness_opts ho = {0};
	char out[8192], inodes[32];
	const char *args[48];
	int fd, r, n = 0;

	memset(f, 0, sizeof(*f));
	if (o)
		f->opts = *o;
	if (!f->opts.fsname)
		f->opts.fsname = "testfs";
	if (!f->opts.node)
		f->opts.node = "node1";
	if (!f->opts.image_size)
		f->opts.image_size = 256ull << 20;

	ho.members = f->opts.members ? f->opts.members : 1;
	ho.quota_bytes = (long long)f->opts.etcd_quota;
	r = efs_harness_start(&f->etcd, &ho);
	cr_assert_eq(r, 0, "mount fixture: etcd harness start: %s", strerror(-r));
	snprintf(f->endpoints, sizeof(f->endpoints), "%s", efs_harness_endpoints(f->etcd));

	snprintf(f->dir, sizeof(f->dir), "/tmp/etcfs-test-XXXXXX");
	cr_assert_not_null(mkdtemp(f->dir), "mount fixture: mkdtemp: %s", strerror(errno));
	snprintf(f->image, sizeof(f->image), "%s/disk.img", f->dir);
	snprintf(f->mnt, sizeof(f->mnt), "%s/mnt", f->dir);
	snprintf(f->log, sizeof(f->log), "%s/etcfsd.log", f->dir);
	cr_assert_eq(mkdir(f->mnt, 0755), 0, "mount fixture: mkdir %s: %s", f->mnt,
		     strerror(errno));
	fd = open(f->image, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0, "mount fixture: create %s: %s", f->image, strerror(errno));
	r = ftruncate(fd, (off_t)f->opts.image_size);
	close(fd);
	cr_assert_eq(r, 0, "mount fixture: truncate %s: %s", f->image, strerror(errno));

	args[n++] = "--name";
	args[n++] = f->opts.fsname;
	if (f->opts.inodes) {
		snprintf(inodes, sizeof(inodes), "%llu", (unsigned long long)f->opts.inodes);
		args[n++] = "--inodes";
		args[n++] = inodes;
	}
	for (int i = 0; f->opts.mkfs_args && f->opts.mkfs_args[i]; i++) {
		cr_assert_lt(n, 45, "mount fixture: too many mkfs arguments");
		args[n++] = f->opts.mkfs_args[i];
	}
	args[n++] = f->image;
	args[n] = NULL;
	r = run_cmd(f, out, sizeof(out), "mkfs.etcfs", args);
	cr_assert_eq(r, 0, "mount fixture: mkfs.etcfs failed (%d):\n%s", r, out);

	if (!f->opts.no_mount)
		efs_test_fs_mount(f, NULL);
}

void efs_test_fs_stop(struct efs_test_fs *f)
{
	char problem[512] = "";
	int st;

	if (f->daemon) {
		if (waitpid(f->daemon, &st, WNOHANG) == f->daemon) {
			/* It died: clear the dead mount. */
			snprintf(problem, sizeof(problem), "etcfsd had exited (%s %d) before stop",
				 WIFEXITED(st) ? "status" : "signal",
				 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			f->daemon = 0;
		} else if (efs_tp_fusermount(f->mnt, false) != 0) {
			snprintf(problem, sizeof(problem), "fusermount3 -u %s failed", f->mnt);
			kill(f->daemon, SIGTERM);
		}
		if (f->daemon && efs_tp_wait_pid(f->daemon, &st, EXIT_WAIT_MS) != 1) {
			snprintf(problem, sizeof(problem), "etcfsd did not exit within %d ms",
				 EXIT_WAIT_MS);
			kill(f->daemon, SIGKILL);
			waitpid(f->daemon, &st, 0);
		}
		f->daemon = 0;
	}
	/* A dead daemon, or one a test started itself, may leave a mount. */
	if (f->mnt[0] && efs_test_is_fuse_mount(f->mnt)) {
		efs_tp_fusermount(f->mnt, false);
		if (efs_test_is_fuse_mount(f->mnt))
			efs_tp_fusermount(f->mnt, true);
	}
	f->etcd = efs_harness_free(f->etcd);
	if (f->dir[0]) {
		efs_tp_rm_tree(f->dir);
		f->dir[0] = '\0';
	}
	if (problem[0])
		cr_assert_fail("mount fixture: stop: %s", problem);
}

double efs_test_fs_metric(struct efs_test_fs *f, const char *sample)
{
	double v;
	int r;

	cr_assert(f->metrics[0], "mount fixture: metrics were not asked for (opts.metrics)");
	r = efs_tp_metric(f->metrics, sample, &v);
	cr_assert_eq(r, 0, "mount fixture: reading http://%s/metrics: %s", f->metrics,
		     strerror(-r));
	return v;
}
