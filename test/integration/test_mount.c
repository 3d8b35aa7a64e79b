/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsd as a user runs it: mount and umount, the background start that
 * returns once the mount answers, -f, the clean leave on SIGTERM and on
 * umount (the node key is gone from etcd at once, not after the lease
 * TTL), the mount(8) helper called directly with mount(8)'s convention and
 * through a real `mount -t etcfs` (in a private mount namespace whose
 * /usr/sbin is an overlay holding mount.etcfs, so nothing is written to
 * /sbin), "node id in use", and the metrics endpoint. Also the pieces
 * under the daemon on a toy filesystem of the test's own: lib/kchan/fuseloop
 * and kernel cache invalidations (lib/kchan/inval).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <uv.h>

#include "kchan/fuseloop.h"
#include "kchan/inval.h"
#include "harness.h"

#include "../support/leak.h"
#include "../support/mount.h"

/* Long enough that a key left to expire would still be there when checked. */
#define TTL_S 10

static struct efs_test_fs fs;
/* The toy filesystem's mount point, unmounted by fini after a failure. */
static char toy_dir[64];

static void fini(void)
{
	char cmd[128];

	efs_test_fs_stop(&fs);
	if (toy_dir[0] && efs_test_is_fuse_mount(toy_dir)) {
		snprintf(cmd, sizeof(cmd), "fusermount3 -uz '%s'", toy_dir);
		(void)!system(cmd);
	}
	if (toy_dir[0])
		rmdir(toy_dir);
}

TestSuite(mount, .fini = fini, .timeout = 120);

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	nanosleep(&ts, NULL);
}

static void start(const char *node, bool mount, bool metrics)
{
	struct efs_test_fs_opts o = {
		.node = node,
		.session_ttl = TTL_S,
		.no_mount = !mount,
		.metrics = metrics,
	};

	efs_test_fs_start(&fs, &o);
}

/* True when n/<node> of the fixture's filesystem exists in etcd. */
static bool node_key_exists(const char *node)
{
	char key[256], *out = NULL;
	bool found;
	int r;

	snprintf(key, sizeof(key), "/etcfs/%s/n/%s", fs.opts.fsname, node);
	r = efs_harness_etcdctl(fs.etcd, &out, "get", key, "--keys-only", NULL);
	cr_assert_eq(r, 0, "etcdctl get %s: %d: %s", key, r, out ? out : "");
	found = strstr(out, key) != NULL;
	free(out);
	return found;
}

/* The first line of /proc/mounts for |dir|, "" when none. */
static void mount_line(const char *dir, char *buf, size_t size)
{
	FILE *fp = fopen("/proc/self/mounts", "re");
	char line[4096], pat[PATH_MAX + 2];

	buf[0] = '\0';
	cr_assert_not_null(fp);
	snprintf(pat, sizeof(pat), " %s ", dir);
	while (fgets(line, sizeof(line), fp)) {
		if (strstr(line, pat)) {
			snprintf(buf, size, "%s", line);
			break;
		}
	}
	fclose(fp);
}

/* PID of a live (not zombie) etcfsd whose command line names |dir|, or 0. */
static pid_t find_daemon(const char *dir)
{
	DIR *proc = opendir("/proc");
	struct dirent *de;
	pid_t found = 0;

	cr_assert_not_null(proc);
	while (!found && (de = readdir(proc))) {
		char path[300], buf[4096], state = 0;
		ssize_t n;
		bool daemon = false, names_dir = false;
		int fd;
		FILE *fp;

		if (de->d_name[0] < '0' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
		fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		for (char *p = buf; p < buf + n; p += strlen(p) + 1) {
			const char *base = strrchr(p, '/');

			if (p == buf && strcmp(base ? base + 1 : p, "etcfsd") == 0)
				daemon = true;
			if (strcmp(p, dir) == 0)
				names_dir = true;
		}
		if (!daemon || !names_dir)
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
		fp = fopen(path, "re");
		if (fp) {
			if (fscanf(fp, "%*d (%*[^)]) %c", &state) != 1)
				state = 0;
			fclose(fp);
		}
		if (state && state != 'Z' && state != 'X')
			found = (pid_t)atoi(de->d_name);
	}
	closedir(proc);
	return found;
}

static bool wait_daemon_gone(const char *dir, unsigned ms)
{
	uint64_t end = now_ms() + ms;

	while (find_daemon(dir)) {
		if (now_ms() >= end)
			return false;
		sleep_ms(20);
	}
	return true;
}

/* True when |pid| holds /dev/fuse open (it serves a FUSE mount itself). */
static bool holds_dev_fuse(pid_t pid)
{
	char path[64], target[PATH_MAX];
	struct dirent *de;
	bool found = false;
	DIR *dir;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	dir = opendir(path);
	if (!dir)
		return false;
	while (!found && (de = readdir(dir))) {
		char link[PATH_MAX];
		ssize_t n;

		snprintf(link, sizeof(link), "%s/%s", path, de->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n > 0) {
			target[n] = '\0';
			found = strcmp(target, "/dev/fuse") == 0;
		}
	}
	closedir(dir);
	return found;
}

/* Runs a shell command line; its exit status, -1 on a signal. */
static int sh(const char *cmd)
{
	int st = system(cmd);

	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* sh() of a formatted command line. */
static int shf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int shf(const char *fmt, ...)
{
	char *cmd = NULL;
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = vasprintf(&cmd, fmt, ap);
	va_end(ap);
	cr_assert_geq(r, 0);
	r = sh(cmd);
	free(cmd);
	return r;
}

Test(mount, mount_and_umount)
{
	char line[4096];
	struct stat st, parent;
	char up[PATH_MAX];

	start("node1", true, false);
	cr_assert(efs_test_is_fuse_mount(fs.mnt));
	mount_line(fs.mnt, line, sizeof(line));
	cr_assert(strstr(line, "etcfs:testfs ") == line, "fsname: %s", line);
	cr_assert(strstr(line, " fuse.etcfs "), "type: %s", line);
	cr_assert(strstr(line, "default_permissions"), "options: %s", line);
	cr_assert_eq(stat(fs.mnt, &st), 0);
	snprintf(up, sizeof(up), "%s/..", fs.mnt);
	cr_assert_eq(stat(up, &parent), 0);
	cr_assert_neq(st.st_dev, parent.st_dev, "the mount point is not a new filesystem");
	cr_assert(S_ISDIR(st.st_mode));
	cr_assert_eq(st.st_ino, 1, "root inode %lu", (unsigned long)st.st_ino);
	cr_assert(node_key_exists("node1"));

	/* fusermount3 -u; the daemon must exit 0 on its own. */
	efs_test_fs_unmount(&fs);
	cr_assert(!efs_test_is_fuse_mount(fs.mnt));
	cr_assert(!node_key_exists("node1"), "n/node1 outlived a clean umount");

	/* It mounts again with the same node id at once. */
	efs_test_fs_mount(&fs, NULL);
	cr_assert(node_key_exists("node1"));
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, read_only_mount)
{
	static const char *const ro[] = {"-o", "ro,noatime", NULL};
	struct efs_test_fs_opts o = {.node = "ro1", .session_ttl = TTL_S, .mount_args = ro};
	char line[4096], path[PATH_MAX];

	efs_test_fs_start(&fs, &o);
	mount_line(fs.mnt, line, sizeof(line));
	cr_assert(strstr(line, " ro,"), "not read-only: %s", line);
	cr_assert(strstr(line, "noatime"), "noatime missing: %s", line);
	snprintf(path, sizeof(path), "%s/newdir", fs.mnt);
	cr_assert_eq(mkdir(path, 0755), -1);
	cr_assert_eq(errno, EROFS, "mkdir on a read-only mount: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/lost+found", fs.mnt);
	cr_assert_eq(access(path, F_OK), 0, "lost+found: %s", strerror(errno));
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, three_member_cluster)
{
	struct efs_test_fs_opts o = {.members = 3, .node = "tri1", .session_ttl = TTL_S};
	char path[PATH_MAX];

	efs_test_fs_start(&fs, &o);
	cr_assert_eq(efs_harness_members(fs.etcd), 3);
	/* Every member's URL reaches the daemon. */
	cr_assert_eq(strchr(fs.endpoints, ',') != NULL, true, "endpoints: %s", fs.endpoints);
	snprintf(path, sizeof(path), "%s/d", fs.mnt);
	cr_assert_eq(mkdir(path, 0755), 0, "mkdir: %s", strerror(errno));
	cr_assert(node_key_exists("tri1"));
	efs_test_fs_unmount(&fs);
	cr_assert(!node_key_exists("tri1"));
	/* What was made survives a remount. */
	efs_test_fs_mount(&fs, NULL);
	cr_assert_eq(access(path, F_OK), 0, "%s after remount: %s", path, strerror(errno));
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, foreground_serves_from_its_own_process)
{
	start("fg1", true, false);
	/* -f: the process the fixture started is the one serving. */
	cr_assert_eq(kill(fs.daemon, 0), 0);
	cr_assert(holds_dev_fuse(fs.daemon), "etcfsd -f does not hold /dev/fuse itself");
	cr_assert_eq(find_daemon(fs.mnt), fs.daemon);
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, background_returns_once_ready)
{
	char out[8192];
	struct stat st;
	pid_t pid;
	int r;

	start("bg1", false, false);
	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsd", "--node-id", "bg1", "--session-ttl",
			    "10", fs.image, fs.mnt, NULL);
	cr_assert_eq(r, 0, "etcfsd (background) failed: %d\n%s", r, out);
	/* Returned: mounted and answering now, with no wait. */
	cr_assert(efs_test_is_fuse_mount(fs.mnt), "not mounted when etcfsd returned");
	cr_assert_eq(stat(fs.mnt, &st), 0, "stat: %s", strerror(errno));
	cr_assert_eq(st.st_ino, 1);
	cr_assert(node_key_exists("bg1"));
	pid = find_daemon(fs.mnt);
	cr_assert_gt(pid, 0, "no background daemon found");
	cr_assert(holds_dev_fuse(pid));
	/* Quiet on success: a mount command prints nothing. */
	cr_assert_str_empty(out, "output on success: %s", out);

	cr_assert_eq(shf("fusermount3 -u '%s'", fs.mnt), 0);
	cr_assert(wait_daemon_gone(fs.mnt, 20000), "the daemon did not exit after umount");
	cr_assert(!node_key_exists("bg1"), "n/bg1 outlived a clean umount");
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, sigterm_leaves_cleanly)
{
	uint64_t t0;
	int st;

	start("term1", true, false);
	cr_assert(node_key_exists("term1"));
	t0 = now_ms();
	cr_assert_eq(kill(fs.daemon, SIGTERM), 0);
	cr_assert_eq(waitpid(fs.daemon, &st, 0), fs.daemon);
	fs.daemon = 0;
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %#x", st);
	cr_assert_lt(now_ms() - t0, 5000, "leave took %llu ms",
		     (unsigned long long)(now_ms() - t0));
	/* Unmounted by the daemon, and the lease revoked (TTL is 10 s). */
	cr_assert(!efs_test_is_fuse_mount(fs.mnt), "still mounted after SIGTERM");
	cr_assert(!node_key_exists("term1"), "n/term1 still in etcd after the leave");
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, sigterm_with_etcd_paused_is_bounded)
{
	uint64_t t0, took;
	int st, r;

	start("pause1", true, false);
	r = efs_harness_pause(fs.etcd, 0);
	cr_assert_eq(r, 0, "pausing etcd: %d", r);
	t0 = now_ms();
	cr_assert_eq(kill(fs.daemon, SIGTERM), 0);
	for (r = 0; r == 0 && now_ms() - t0 < 30000;) {
		r = waitpid(fs.daemon, &st, WNOHANG);
		if (r == 0)
			sleep_ms(20);
	}
	took = now_ms() - t0;
	efs_harness_resume(fs.etcd, 0);
	cr_assert_eq(r, fs.daemon, "etcfsd did not exit within 30 s of SIGTERM with etcd paused");
	fs.daemon = 0;
	/* Locks and the lease cannot be released: it still exits 0, unmounted. */
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %#x", st);
	cr_assert_lt(took, 25000, "leave took %llu ms", (unsigned long long)took);
	cr_assert(!efs_test_is_fuse_mount(fs.mnt), "still mounted");
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, node_id_in_use_is_refused)
{
	char out[8192], mnt2[PATH_MAX];
	int r;

	start("dup1", true, false);
	snprintf(mnt2, sizeof(mnt2), "%s/mnt2", fs.dir);
	cr_assert_eq(mkdir(mnt2, 0755), 0);
	r = efs_test_fs_run(&fs, out, sizeof(out), "etcfsd", "--node-id", "dup1", fs.image, mnt2,
			    NULL);
	cr_assert_eq(r, 1, "second daemon with the same node id: %d\n%s", r, out);
	cr_assert(strstr(out, "in use"), "message: %s", out);
	cr_assert(!efs_test_is_fuse_mount(mnt2));
	/* The first mount is untouched. */
	cr_assert(node_key_exists("dup1"));
	cr_assert_eq(kill(fs.daemon, 0), 0);
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

/* The helper path: the source tree's mount.etcfs. */
static const char *helper_path(char *buf, size_t size)
{
	const char *src = getenv("ETCFS_SOURCE_ROOT");

	cr_assert_not_null(src, "ETCFS_SOURCE_ROOT is not set");
	snprintf(buf, size, "%s/etcfsd/mount.etcfs", src);
	cr_assert_eq(access(buf, X_OK), 0, "%s: %s", buf, strerror(errno));
	return buf;
}

Test(mount, helper_called_like_mount8)
{
	char helper[PATH_MAX], daemon[PATH_MAX], opts[1024], line[4096];
	struct stat st;

	start("helper1", false, false);
	helper_path(helper, sizeof(helper));
	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	/* mount(8) passes: spec dir [-sfnv] [-N ns] [-o options] [-t type]. */
	snprintf(opts, sizeof(opts),
		 "rw,_netdev,endpoints=%s,node=helper1,session-ttl=10,noatime,allow_other,nofail,"
		 "x-systemd.requires=etcd.service",
		 fs.endpoints);
	cr_assert_eq(shf("ETCFSD='%s' '%s' '%s' '%s' -n -o '%s' -t etcfs", daemon, helper,
			 fs.image, fs.mnt, opts),
		     0);
	cr_assert(efs_test_is_fuse_mount(fs.mnt));
	cr_assert_eq(stat(fs.mnt, &st), 0);
	mount_line(fs.mnt, line, sizeof(line));
	cr_assert(strstr(line, "noatime"), "noatime not passed on: %s", line);
	cr_assert(strstr(line, "allow_other"), "allow_other not passed on: %s", line);
	cr_assert(node_key_exists("helper1"));

	/* -f (fake) does nothing. */
	cr_assert_eq(shf("ETCFSD='%s' '%s' '%s' '%s/mnt-none' -f -o 'endpoints=%s'", daemon,
			 helper, fs.image, fs.dir, fs.endpoints),
		     0);

	/* A bad option is a mount failure (32), nothing mounted. */
	cr_assert_eq(shf("ETCFSD='%s' '%s' '%s' '%s/mnt' -o 'endpoints=%s,node=helper2,bogus' "
			 "2>/dev/null",
			 daemon, helper, fs.image, fs.dir, fs.endpoints),
		     32);

	cr_assert_eq(shf("umount '%s'", fs.mnt), 0);
	cr_assert(wait_daemon_gone(fs.mnt, 20000), "the daemon did not exit after umount");
	cr_assert(!node_key_exists("helper1"));
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, real_mount_t_etcfs_and_fstab)
{
	char helper[PATH_MAX], daemon[PATH_MAX], ovl[PATH_MAX], fstab[PATH_MAX];
	bool had_helper = access("/sbin/mount.etcfs", F_OK) == 0;
	FILE *fp;
	int r;

	start("real1", false, false);
	helper_path(helper, sizeof(helper));
	efs_test_command_path("etcfsd", daemon, sizeof(daemon));
	snprintf(ovl, sizeof(ovl), "%s/sbin-overlay", fs.dir);
	cr_assert_eq(mkdir(ovl, 0755), 0);
	cr_assert_eq(shf("cp '%s' '%s/mount.etcfs'", helper, ovl), 0);
	/* An /etc/fstab line as the README shows it (read with mount -T). */
	snprintf(fstab, sizeof(fstab), "%s/fstab", fs.dir);
	fp = fopen(fstab, "we");
	cr_assert_not_null(fp);
	fprintf(fp, "# etcfs\n%s %s etcfs _netdev,nofail,endpoints=%s,node=real2,session-ttl=10 0 0\n",
		fs.image, fs.mnt, fs.endpoints);
	fclose(fp);

	/*
	 * mount(8) only looks for helpers in /sbin: in a private mount
	 * namespace, /usr/sbin (/sbin links there) becomes an overlay with
	 * the helper on top. The FUSE mounts live in that namespace, so the
	 * checks run inside it; the daemon leaves when it is unmounted.
	 */
	r = shf("ETCFSD='%s' unshare --mount --propagation private sh -ec '"
		"mount -t overlay overlay -o lowerdir=%s:/usr/sbin /usr/sbin; "
		"mount -t etcfs -o endpoints=%s,node=real1,session-ttl=10 %s %s; "
		"grep -q \" %s fuse.etcfs \" /proc/self/mounts; "
		"test \"$(stat -c %%i %s)\" = 1; "
		"umount %s; "
		"! grep -q \" %s \" /proc/self/mounts; "
		"mount -T %s %s; "
		"grep -q \" %s fuse.etcfs \" /proc/self/mounts; "
		"test \"$(stat -c %%i %s)\" = 1; "
		"umount %s'",
		daemon, ovl, fs.endpoints, fs.image, fs.mnt, fs.mnt, fs.mnt, fs.mnt, fs.mnt,
		fstab, fs.mnt, fs.mnt, fs.mnt, fs.mnt);
	cr_assert_eq(r, 0, "mount -t etcfs / mount -T fstab in a private namespace failed (%d)",
		     r);
	cr_assert(wait_daemon_gone(fs.mnt, 20000), "a daemon did not exit after umount");
	cr_assert(!node_key_exists("real1"), "n/real1 outlived a clean umount");
	cr_assert(!node_key_exists("real2"), "n/real2 outlived a clean umount");
	cr_assert_eq(access("/sbin/mount.etcfs", F_OK) == 0, had_helper, "/sbin changed");
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, metrics_endpoint_answers)
{
	double v;

	start("met1", true, true);
	cr_assert(fs.metrics[0], "no metrics address in the log");
	v = efs_test_fs_metric(&fs, "etcfs_session_state{state=\"active\"}");
	cr_assert_eq(v, 1, "session state active: %g", v);
	v = efs_test_fs_metric(&fs, "etcfs_session_state{state=\"suspended\"}");
	cr_assert_eq(v, 0);
	/* Counters are copied from the session every 100 ms tick. */
	sleep_ms(350);
	v = efs_test_fs_metric(&fs, "etcfs_session_registrations_total");
	cr_assert_eq(v, 1, "registrations: %g", v);
	v = efs_test_fs_metric(&fs, "etcfs_loop_lag_seconds_count");
	cr_assert_geq(v, 2, "loop lag samples: %g", v);
	v = efs_test_fs_metric(&fs, "etcfs_session_generation");
	cr_assert_geq(v, 1);
	cr_assert_geq(efs_test_fs_metric(&fs, "etcfs_lock_cache_held"), 0);
	/* One node never waits for a peer's lock. */
	v = efs_test_fs_metric(&fs, "etcfs_lock_recall_wait_seconds_count");
	cr_assert_eq(v, 0, "recall waits on one node: %g", v);
	cr_assert_geq(efs_test_fs_metric(&fs, "etcfs_fuse_requests_received_total"), 1);
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

/* ---- lib/kchan/fuseloop and lib/kchan/inval on a real mount ---- */

/*
 * A toy filesystem served by fuseloop on a loop thread of its own: the
 * root (1) holds one file (2) whose name and size the test changes behind
 * the kernel's back. Entries and attributes are granted for an hour, so
 * only an invalidation makes the kernel see a change.
 */
struct toy {
	uv_loop_t loop;
	uv_async_t async;
	struct fuse_session *se;
	struct efs_fuseloop *fl;
	struct efs_inval *iv;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	/* protected by mu */
	char name[16];
	off_t size;
	bool present;
	int cmd; /* 1: submit |req|, 2: stop the invalidation queue */
	bool done;
	int status;
	int exit_status; /* of the fuseloop: 1 until it ended */
	int ref_left;	 /* the next answers of toy_referenced that are true */
	int ref_asked;	 /* toy_referenced's calls */
	struct efs_inval_req req;
};

static struct toy toy;

static void toy_attr(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	if (ino == 1) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else {
		st->st_mode = S_IFREG | 0644;
		st->st_nlink = 1;
		pthread_mutex_lock(&toy.mu);
		st->st_size = toy.size;
		pthread_mutex_unlock(&toy.mu);
	}
}

static void toy_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e = {.ino = 2, .attr_timeout = 3600, .entry_timeout = 3600};
	bool found;

	pthread_mutex_lock(&toy.mu);
	found = parent == 1 && toy.present && strcmp(name, toy.name) == 0;
	pthread_mutex_unlock(&toy.mu);
	if (!found) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	toy_attr(2, &e.attr);
	fuse_reply_entry(req, &e);
}

static void toy_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	if (ino != 1 && ino != 2) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	toy_attr(ino, &st);
	fuse_reply_attr(req, &st, 3600);
}

static void toy_forget(fuse_req_t req, fuse_ino_t ino, uint64_t n)
{
	(void)ino;
	(void)n;
	fuse_reply_none(req);
}

static const struct fuse_lowlevel_ops toy_ops = {
	.lookup = toy_lookup,
	.getattr = toy_getattr,
	.forget = toy_forget,
};

/* The daemon's count of kernel references, as the invalidation queue
 * asks for it (loop thread): true |ref_left| times. */
static bool toy_referenced(void *arg, uint64_t ino)
{
	bool r;

	(void)arg;
	(void)ino;
	pthread_mutex_lock(&toy.mu);
	toy.ref_asked++;
	r = toy.ref_left > 0;
	if (r)
		toy.ref_left--;
	pthread_mutex_unlock(&toy.mu);
	return r;
}

static int toy_ref_asked(int left)
{
	int n;

	pthread_mutex_lock(&toy.mu);
	n = toy.ref_asked;
	toy.ref_asked = 0;
	toy.ref_left = left;
	pthread_mutex_unlock(&toy.mu);
	return n;
}

static void toy_signal(int status)
{
	pthread_mutex_lock(&toy.mu);
	toy.done = true;
	toy.status = status;
	pthread_cond_broadcast(&toy.cond);
	pthread_mutex_unlock(&toy.mu);
}

static void toy_inval_done(struct efs_inval_req *req, int status)
{
	(void)req;
	toy_signal(status);
}

static void toy_inval_stopped(void *arg)
{
	(void)arg;
	toy_signal(0);
}

static void toy_on_async(uv_async_t *h)
{
	int cmd, r;

	(void)h;
	pthread_mutex_lock(&toy.mu);
	cmd = toy.cmd;
	toy.cmd = 0;
	pthread_mutex_unlock(&toy.mu);
	if (cmd == 1) {
		r = efs_inval_submit(toy.iv, &toy.req);
		if (r < 0)
			toy_signal(r);
	} else if (cmd == 2) {
		efs_inval_stop(toy.iv, toy_inval_stopped, NULL);
	}
}

static void toy_on_exit(struct efs_fuseloop *fl, int status, void *arg)
{
	(void)arg;
	pthread_mutex_lock(&toy.mu);
	toy.exit_status = status;
	pthread_cond_broadcast(&toy.cond);
	pthread_mutex_unlock(&toy.mu);
	efs_fuseloop_close(fl, NULL, NULL);
	toy.fl = NULL;
	uv_close((uv_handle_t *)&toy.async, NULL);
}

static void *toy_thread(void *arg)
{
	(void)arg;
	uv_run(&toy.loop, UV_RUN_DEFAULT);
	return NULL;
}

/* Runs one command on the loop thread and waits for its status. */
static int toy_command(int cmd)
{
	struct timespec until;
	int status;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&toy.mu);
	toy.cmd = cmd;
	toy.done = false;
	pthread_mutex_unlock(&toy.mu);
	uv_async_send(&toy.async);
	pthread_mutex_lock(&toy.mu);
	while (!toy.done)
		cr_assert_neq(pthread_cond_timedwait(&toy.cond, &toy.mu, &until), ETIMEDOUT,
			      "toy command %d timed out", cmd);
	status = toy.status;
	pthread_mutex_unlock(&toy.mu);
	return status;
}

static int toy_inval(enum efs_inval_kind kind, fuse_ino_t ino, fuse_ino_t child,
		     const char *name)
{
	memset(&toy.req, 0, sizeof(toy.req));
	toy.req.kind = kind;
	toy.req.cls = kind == EFS_INVAL_INODE ? EFS_INVAL_GATING : EFS_INVAL_BEST_EFFORT;
	toy.req.ino = ino;
	toy.req.child = child;
	toy.req.off = -1; /* attributes only */
	toy.req.name = name;
	toy.req.name_len = name ? strlen(name) : 0;
	toy.req.cb = toy_inval_done;
	return toy_command(1);
}

static off_t stat_size(const char *dir, const char *name)
{
	char path[PATH_MAX];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (stat(path, &st) < 0)
		return -errno;
	return st.st_size;
}

/*
 * A cold listing of a directory (readdirplus) takes its entries' shared
 * locks EFS_LOCK_REQ_MAX per transaction, and those transactions bring
 * the records: no separate transaction reads the attributes, and the
 * kernel then has every entry with its attributes (a stat of each is not
 * a lookup). 300 names: more than one page of names.
 */
Test(mount, a_cold_listing_takes_the_records_with_its_locks)
{
	const char *txn_rpcs = "etcfs_etcd_rpc_seconds_count{method=\"Txn\"}";
	const char *lock_txns = "etcfs_etcd_txns_total{origin=\"lock\",outcome=\"ok\"}";
	const char *atime_txns = "etcfs_etcd_txns_total{origin=\"atime\",outcome=\"ok\"}";
	const char *lookups = "etcfs_fuse_op_seconds_count{op=\"lookup\"}";
	enum { N = 300 };
	char dir[PATH_MAX], path[PATH_MAX + 16], buf[N];
	double t0, l0, a0, k0, reads, locks;
	struct dirent *e;
	int n = 0, seen[N] = {0};
	DIR *d;

	start("ls1", true, true);
	memset(buf, 'x', sizeof(buf));
	snprintf(dir, sizeof(dir), "%s/d", fs.mnt);
	cr_assert_eq(mkdir(dir, 0755), 0, "mkdir: %s", strerror(errno));
	for (int i = 0; i < N; i++) {
		int fd;

		snprintf(path, sizeof(path), "%s/f%03d", dir, i);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
		cr_assert(fd >= 0, "create %s: %s", path, strerror(errno));
		cr_assert_eq(write(fd, buf, (size_t)i + 1), i + 1, "write: %s", strerror(errno));
		close(fd);
	}
	/* Cold: no lock, record or name cached. */
	efs_test_fs_unmount(&fs);
	efs_test_fs_mount(&fs, NULL);
	cr_assert_eq(access(dir, F_OK), 0);
	t0 = efs_test_fs_metric(&fs, txn_rpcs);
	l0 = efs_test_fs_metric(&fs, lock_txns);
	a0 = efs_test_fs_metric(&fs, atime_txns);
	d = opendir(dir);
	cr_assert(d, "opendir: %s", strerror(errno));
	while ((e = readdir(d))) {
		int i;

		if (e->d_name[0] == '.')
			continue;
		cr_assert(sscanf(e->d_name, "f%03d", &i) == 1 && i >= 0 && i < N, "name %s",
			  e->d_name);
		seen[i]++;
		n++;
	}
	closedir(d);
	cr_assert_eq(n, N, "%d names listed", n);
	for (int i = 0; i < N; i++)
		cr_assert_eq(seen[i], 1, "f%03d listed %d times", i, seen[i]);
	locks = efs_test_fs_metric(&fs, lock_txns) - l0;
	reads = efs_test_fs_metric(&fs, txn_rpcs) - t0 - locks -
		(efs_test_fs_metric(&fs, atime_txns) - a0);
	printf("# a cold listing of %d names: %.0f lock transactions, %.0f other reads\n", N,
	       locks, reads);
	/* The record reads the lock transactions made needless (3 for 300
	 * names before) fail this; 1 leaves room for a read of the
	 * directory's own record. */
	cr_assert_leq(reads, 1, "%.0f attribute reads beside %.0f lock transactions", reads, locks);
	/* 300 / 32 in 10, the directory's own, room for one more. */
	cr_assert_leq(locks, 12, "%.0f lock transactions for %d names", locks, N);
	k0 = efs_test_fs_metric(&fs, lookups);
	for (int i = 0; i < N; i++) {
		struct stat st;

		snprintf(path, sizeof(path), "%s/f%03d", dir, i);
		cr_assert_eq(stat(path, &st), 0, "stat %s: %s", path, strerror(errno));
		cr_assert_eq(st.st_size, i + 1, "f%03d: size %lld", i, (long long)st.st_size);
	}
	/* The kernel's entries live 500 ms under the held locks: a slow run
	 * may see some expire, not most. */
	cr_assert_lt(efs_test_fs_metric(&fs, lookups) - k0, N / 2, "%.0f lookups after the listing",
		     efs_test_fs_metric(&fs, lookups) - k0);
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

/*
 * A descriptor that created the file for writing only bypasses the page
 * cache: its writes
 * reach the daemon as written (one request per write(2), not split at
 * pages) without the security.capability getxattr the kernel sends before
 * every write through the page cache, and a descriptor reading through
 * the page cache sees them at once.
 */
Test(mount, a_write_only_descriptor_bypasses_the_page_cache)
{
	const char *getxattrs = "etcfs_fuse_op_seconds_count{op=\"getxattr\"}";
	const char *writes = "etcfs_fuse_op_seconds_count{op=\"write\"}";
	const char *syncs = "etcfs_data_device_syncs_total";
	char path[PATH_MAX], buf[16384], got[16];
	double x0, w0;
	int rfd, wfd;

	start("wo1", true, true);
	snprintf(path, sizeof(path), "%s/f", fs.mnt);
	memset(buf, 'a', sizeof(buf));
	wfd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	cr_assert(wfd >= 0, "create: %s", strerror(errno));
	x0 = efs_test_fs_metric(&fs, getxattrs);
	w0 = efs_test_fs_metric(&fs, writes);
	/* 10 writes of 10,000 bytes, each across page boundaries. */
	for (int i = 0; i < 10; i++)
		cr_assert_eq(write(wfd, buf, 10000), 10000, "write: %s", strerror(errno));
	cr_assert_eq(efs_test_fs_metric(&fs, getxattrs) - x0, 0, "%.0f getxattrs for 10 writes",
		     efs_test_fs_metric(&fs, getxattrs) - x0);
	cr_assert_eq(efs_test_fs_metric(&fs, writes) - w0, 10, "%.0f write requests for 10 writes",
		     efs_test_fs_metric(&fs, writes) - w0);
	/* A reader's cached pages follow the write-only descriptor's writes. */
	rfd = open(path, O_RDONLY | O_CLOEXEC);
	cr_assert(rfd >= 0, "open: %s", strerror(errno));
	cr_assert_eq(pread(rfd, got, 8, 4096), 8);
	cr_assert(memcmp(got, "aaaaaaaa", 8) == 0);
	cr_assert_eq(pwrite(wfd, "BBBB", 4, 4098), 4, "pwrite: %s", strerror(errno));
	cr_assert_eq(pread(rfd, got, 8, 4096), 8);
	cr_assert(memcmp(got, "aaBBBBaa", 8) == 0, "the reader sees %.8s", got);
	/* RWF_DSYNC of one write, which the kernel leaves to us on a
	 * direct_io handle: a device sync before the answer. */
	{
		struct iovec iov = {.iov_base = (void *)"D", .iov_len = 1};
		double s0 = efs_test_fs_metric(&fs, syncs);

		cr_assert_eq(pwritev2(wfd, &iov, 1, 0, RWF_DSYNC), 1, "pwritev2: %s",
			     strerror(errno));
		cr_assert_gt(efs_test_fs_metric(&fs, syncs), s0, "no device sync for RWF_DSYNC");
	}
	close(wfd);
	close(rfd);
	/* A write-only descriptor of a file it did not create writes through
	 * the page cache (the kernel removes file capabilities there). */
	wfd = open(path, O_WRONLY | O_CLOEXEC);
	cr_assert(wfd >= 0, "open: %s", strerror(errno));
	x0 = efs_test_fs_metric(&fs, getxattrs);
	cr_assert_eq(pwrite(wfd, "C", 1, 0), 1, "pwrite: %s", strerror(errno));
	cr_assert_geq(efs_test_fs_metric(&fs, getxattrs) - x0, 1,
		      "a write through the page cache sent no getxattr: the check above shows nothing");
	close(wfd);
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(mount, fuseloop_serves_and_invalidations_reach_the_kernel)
{
	char *dir = toy_dir, *fargv[] = {(char *)"toy", NULL};
	struct fuse_args args = FUSE_ARGS_INIT(1, fargv);
	struct timespec until;
	int r;

	snprintf(toy_dir, sizeof(toy_dir), "/tmp/etcfs-toy-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	memset(&toy, 0, sizeof(toy));
	pthread_mutex_init(&toy.mu, NULL);
	pthread_cond_init(&toy.cond, NULL);
	snprintf(toy.name, sizeof(toy.name), "f");
	toy.size = 1;
	toy.present = true;
	toy.exit_status = 1;
	cr_assert_eq(uv_loop_init(&toy.loop), 0);
	cr_assert_eq(uv_async_init(&toy.loop, &toy.async, toy_on_async), 0);
	toy.se = fuse_session_new(&args, &toy_ops, sizeof(toy_ops), NULL);
	cr_assert_not_null(toy.se);
	cr_assert_eq(fuse_session_mount(toy.se, dir), 0);
	cr_assert_eq(efs_fuseloop_start(&toy.fl, &toy.loop, toy.se, toy_on_exit, NULL), 0);
	cr_assert_eq(efs_inval_new(&toy.iv, &toy.loop, NULL), 0);
	efs_inval_set_session(toy.iv, toy.se);
	efs_inval_set_referenced(toy.iv, toy_referenced, NULL);
	cr_assert_eq(pthread_create(&toy.thread, NULL, toy_thread, NULL), 0);

	/* Attributes: cached until invalidated. */
	cr_assert_eq(stat_size(dir, "f"), 1);
	pthread_mutex_lock(&toy.mu);
	toy.size = 2;
	pthread_mutex_unlock(&toy.mu);
	cr_assert_eq(stat_size(dir, "f"), 1, "the kernel did not cache the attributes");
	cr_assert_eq(toy_inval(EFS_INVAL_INODE, 2, 0, NULL), 0);
	/* An inode the kernel has: done at once, the count not asked. */
	cr_assert_eq(toy_ref_asked(0), 0);
	cr_assert_eq(stat_size(dir, "f"), 2, "attributes not invalidated");

	/* Entries: a renamed file stays visible under its old name until then. */
	pthread_mutex_lock(&toy.mu);
	snprintf(toy.name, sizeof(toy.name), "g");
	pthread_mutex_unlock(&toy.mu);
	cr_assert_eq(stat_size(dir, "f"), 2, "the kernel did not cache the entry");
	cr_assert_eq(toy_inval(EFS_INVAL_ENTRY, 1, 0, "f"), 0);
	cr_assert_eq(stat_size(dir, "f"), -ENOENT, "entry not invalidated");
	cr_assert_eq(stat_size(dir, "g"), 2);

	/* Deletion notice. */
	pthread_mutex_lock(&toy.mu);
	toy.present = false;
	pthread_mutex_unlock(&toy.mu);
	cr_assert_eq(stat_size(dir, "g"), 2);
	cr_assert_eq(toy_inval(EFS_INVAL_DELETE, 1, 2, "g"), 0);
	cr_assert_eq(stat_size(dir, "g"), -ENOENT, "entry not deleted");

	/* Nothing cached for an inode the kernel never saw: ENOENT counts as
	 * done once no reference to it is counted. */
	toy_ref_asked(0);
	cr_assert_eq(toy_inval(EFS_INVAL_INODE, 12345, 0, NULL), 0);
	cr_assert_eq(toy_ref_asked(3), 1, "the count was not asked");
	cr_assert_eq(toy_inval(EFS_INVAL_ENTRY, 1, 0, "never-looked-up"), 0);
	/* While a reference is counted (a reply the kernel has not applied
	 * yet), it is issued again: three times here, then done. */
	cr_assert_eq(toy_inval(EFS_INVAL_INODE, 12345, 0, NULL), 0);
	cr_assert_eq(toy_ref_asked(3), 4, "not issued again while referenced");


	/* Stop: later submissions are refused. */
	cr_assert_eq(toy_command(2), 0);
	cr_assert_eq(toy_inval(EFS_INVAL_INODE, 2, 0, NULL), -ESHUTDOWN);

	/* Unmount: the fuseloop sees the session end (ENODEV) and reports 0. */
	cr_assert_eq(shf("fusermount3 -u '%s'", dir), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&toy.mu);
	r = 0;
	while (toy.exit_status == 1 && r != ETIMEDOUT)
		r = pthread_cond_timedwait(&toy.cond, &toy.mu, &until);
	pthread_mutex_unlock(&toy.mu);
	cr_assert_eq(toy.exit_status, 0, "fuseloop exit: %d", toy.exit_status);
	cr_assert_eq(pthread_join(toy.thread, NULL), 0);

	toy.iv = efs_inval_free(toy.iv);
	fuse_session_unmount(toy.se);
	fuse_session_destroy(toy.se);
	fuse_opt_free_args(&args);
	cr_assert_eq(uv_loop_close(&toy.loop), 0);
	pthread_cond_destroy(&toy.cond);
	pthread_mutex_destroy(&toy.mu);
	rmdir(dir);
	toy_dir[0] = '\0';
	efs_test_assert_no_leaks();
}
