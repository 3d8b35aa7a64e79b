/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fault checks of faults.h. Their processes (tar, the writers) are
 * children of the test program, each stopped by PID; a check's own files
 * outside the mounts (the tree and tarball, the writers' logs) live in a
 * directory of its own under the cluster's directory, removed at its end
 * (and with the cluster's directory when the check fails).
 *
 * A writer acknowledges a record only after its fsync returned 0, and logs
 * it then, outside the mounts: every logged record must be read back.
 */
#include "faults.h"
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether liveness bounds are asserted (not under the sanitizers). */
#if defined(__SANITIZE_ADDRESS__)
#define TIMING 0
#else
#define TIMING 1
#endif

#define MAX_PROCS 24

/* What the running check started, for efs_faults_cleanup(). */
static pid_t procs[MAX_PROCS];
static int dead_member = -1;
static char tmp[512];

/* ---- Processes ---- */

static void proc_note(pid_t pid)
{
	for (int k = 0; k < MAX_PROCS; k++)
		if (!procs[k]) {
			procs[k] = pid;
			return;
		}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	efs_cl_fail("more than %d processes", MAX_PROCS);
}

static void proc_forget(pid_t pid)
{
	for (int k = 0; k < MAX_PROCS; k++)
		if (procs[k] == pid)
			procs[k] = 0;
}

/* Waits up to |ms| for |pid| (reaped and forgotten when it exited): 1 with
 * its status in *st and its end time in *t_end, 0 when it still runs. */
static int proc_wait(pid_t pid, int *st, uint64_t ms, uint64_t *t_end)
{
	uint64_t end = efs_cl_now_ms() + ms;

	for (;;) {
		pid_t r = waitpid(pid, st, WNOHANG);

		if (r == pid) {
			if (t_end)
				*t_end = efs_cl_now_ms();
			proc_forget(pid);
			return 1;
		}
		CL_CHECK(r == 0 || errno == EINTR, "waitpid %d: %s", (int)pid, strerror(errno));
		if (efs_cl_now_ms() >= end)
			return 0;
		efs_cl_sleep_ms(20);
	}
}

/* Whether |pid| has ended (it is not reaped here). */
static bool proc_ended(pid_t pid)
{
	siginfo_t si = {0};

	return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid != 0;
}

static const char *status_text(int st, char *buf, size_t size)
{
	if (WIFEXITED(st))
		snprintf(buf, size, "exit %d", WEXITSTATUS(st));
	else
		snprintf(buf, size, "signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : -1);
	return buf;
}

/* A child that dies with the test program; stdout and stderr in |log|. */
static pid_t proc_fork(const char *log)
{
	int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	pid_t pid;

	CL_CHECK(fd >= 0, "create %s: %s", log, strerror(errno));
	fflush(stdout);
	pid = fork();
	CL_CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		/* No CL_CHECK in a child: its jump would land in the parent's
		 * runner, copied. */
		efs_cl_jmp = NULL;
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		return 0;
	}
	close(fd);
	proc_note(pid);
	return pid;
}

void efs_faults_cleanup(struct efs_cl *c)
{
	for (int k = 0; k < MAX_PROCS; k++) {
		if (!procs[k])
			continue;
		kill(procs[k], SIGKILL);
		waitpid(procs[k], NULL, 0);
		procs[k] = 0;
	}
	if (dead_member >= 0 && efs_harness_state(c->etcd, dead_member) == EFS_HARNESS_DEAD) {
		if (efs_harness_restart(c->etcd, dead_member) == 0)
			efs_harness_wait_leader(c->etcd, 20000);
	}
	dead_member = -1;
	if (tmp[0]) {
		efs_tp_rm_tree(tmp);
		tmp[0] = '\0';
	}
}

/* The check's directory outside the mounts, in |tmp|. */
static void tmp_make(struct efs_cl *c, const char *what)
{
	snprintf(tmp, sizeof(tmp), "%s/%s-XXXXXX", c->dir, what);
	CL_CHECK(mkdtemp(tmp), "mkdtemp %s: %s", tmp, strerror(errno));
}

static void tmp_remove(void)
{
	efs_tp_rm_tree(tmp);
	tmp[0] = '\0';
}

/* "<the check's directory>/<name>", from a ring of buffers (copy what
 * must outlive eight calls). */
static const char *in_tmp(const char *name)
{
	static char ring[8][600];
	static unsigned next;
	char *buf = ring[next++ % 8];

	snprintf(buf, sizeof(ring[0]), "%s/%s", tmp, name);
	return buf;
}

/* Bytes |seed| gives, the same each time. */
static void fill_bytes(unsigned char *buf, size_t len, uint64_t seed)
{
	uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;

	for (size_t k = 0; k < len; k++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		buf[k] = (unsigned char)(x >> 56);
	}
}

/* ---- The tree, its tarball, and the comparison ---- */

/* 200 files: a reader on node2 (whose watch is late) waits about 100 ms
 * for each file another node wrote. */
#define TREE_FILES 200
/* The file from which on an untar counts as partway (in archive order,
 * which is by name: bin/, etc/conf.d/, then etc/'s files): about a third
 * of the way in. */
#define PARTWAY_FILE "etc/f097"
#define UNTAR_BOUND_MS 60000

static const char *const tree_dirs[] = {"bin",	     "etc",	      "etc/conf.d", "usr",
					"usr/lib",   "usr/share",     "usr/share/doc",
					"var",	     "var/empty"};
#define TREE_FULL_DIRS 8 /* the last one stays empty */

/* File k of the tree: its directory, size and mode. */
static void tree_file(int k, char *rel, size_t size, size_t *len, mode_t *mode)
{
	uint32_t x = (uint32_t)k * 2654435761u;

	snprintf(rel, size, "%s/f%03d", tree_dirs[k % TREE_FULL_DIRS], k);
	if (k % 10 == 0)
		*len = 0;
	else if (k % 40 == 7)
		*len = 65536 + x % 200000;
	else
		*len = 1 + x % 6000;
	*mode = k % 7 == 0 ? 0755 : 0640;
}

static void make_tree(const char *root)
{
	static unsigned char data[270000];
	char path[1024], rel[64];
	struct timespec ts[2] = {{0}};

	CL_CHECK(mkdir(root, 0755) == 0, "mkdir %s: %s", root, strerror(errno));
	for (size_t d = 0; d < sizeof(tree_dirs) / sizeof(tree_dirs[0]); d++) {
		snprintf(path, sizeof(path), "%s/%s", root, tree_dirs[d]);
		CL_CHECK(mkdir(path, 0750) == 0, "mkdir %s: %s", path, strerror(errno));
	}
	for (int k = 0; k < TREE_FILES; k++) {
		size_t len;
		mode_t mode;
		int fd;

		tree_file(k, rel, sizeof(rel), &len, &mode);
		snprintf(path, sizeof(path), "%s/%s", root, rel);
		fill_bytes(data, len, (uint64_t)k);
		fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		CL_CHECK(fd >= 0, "create %s: %s", path, strerror(errno));
		CL_CHECK(write(fd, data, len) == (ssize_t)len, "write %s: %s", path,
			 strerror(errno));
		CL_CHECK(fchmod(fd, mode) == 0, "chmod %s: %s", path, strerror(errno));
		ts[0].tv_sec = ts[1].tv_sec = 1700000000 + k;
		CL_CHECK(futimens(fd, ts) == 0, "futimens %s: %s", path, strerror(errno));
		close(fd);
	}
	/* Two symbolic links, one dangling. */
	snprintf(path, sizeof(path), "%s/etc/link", root);
	CL_CHECK(symlink("../usr/lib/f004", path) == 0, "symlink: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/var/dangling", root);
	CL_CHECK(symlink("nowhere", path) == 0, "symlink: %s", strerror(errno));
}

/* Whether files |a| and |b| hold the same bytes; where they differ in *at. */
static bool same_bytes(const char *a, const char *b, off_t *at)
{
	static unsigned char ba[65536], bb[65536];
	int fa = open(a, O_RDONLY | O_CLOEXEC), fb = open(b, O_RDONLY | O_CLOEXEC);
	off_t off = 0;
	bool same = true;

	CL_CHECK(fa >= 0, "open %s: %s", a, strerror(errno));
	CL_CHECK(fb >= 0, "open %s: %s", b, strerror(errno));
	for (;;) {
		ssize_t na = pread(fa, ba, sizeof(ba), off), nb = pread(fb, bb, sizeof(bb), off);

		CL_CHECK(na >= 0 && nb >= 0, "read %s or %s: %s", a, b, strerror(errno));
		if (na != nb || memcmp(ba, bb, (size_t)na) != 0) {
			same = false;
			break;
		}
		if (na == 0)
			break;
		off += na;
	}
	*at = off;
	close(fa);
	close(fb);
	return same;
}

static int count_entries(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *de;
	int n = 0;

	CL_CHECK(d, "opendir %s: %s", path, strerror(errno));
	while ((de = readdir(d)))
		n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* |dst| holds what |src| holds: the same names, types, modes, modification
 * times, link targets and bytes, below its subdirectories too when
 * |recurse|; the number of entries compared. */
static int compare_tree(const char *src, const char *dst, const char *who, bool recurse)
{
	char sp[1024], dp[1024], la[256], lb[256];
	struct stat ss, ds;
	struct dirent *de;
	int n = 0, ns, nd;
	DIR *d;

	ns = count_entries(src);
	nd = count_entries(dst);
	CL_CHECK(ns == nd, "%s: %s holds %d entries, the source %d", who, dst, nd, ns);
	d = opendir(src);
	CL_CHECK(d, "opendir %s: %s", src, strerror(errno));
	while ((de = readdir(d))) {
		off_t at;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(sp, sizeof(sp), "%s/%s", src, de->d_name);
		snprintf(dp, sizeof(dp), "%s/%s", dst, de->d_name);
		CL_CHECK(lstat(sp, &ss) == 0, "lstat %s: %s", sp, strerror(errno));
		CL_CHECK(lstat(dp, &ds) == 0, "%s: lstat %s: %s", who, dp, strerror(errno));
		CL_CHECK((ss.st_mode & S_IFMT) == (ds.st_mode & S_IFMT), "%s: %s is of type %o, %o "
			 "expected", who, dp, ds.st_mode & S_IFMT, ss.st_mode & S_IFMT);
		n++;
		if (S_ISLNK(ss.st_mode)) {
			ssize_t a = readlink(sp, la, sizeof(la) - 1), b;

			b = readlink(dp, lb, sizeof(lb) - 1);
			CL_CHECK(a > 0 && b == a && !memcmp(la, lb, (size_t)a),
				 "%s: the link %s points elsewhere", who, dp);
			continue;
		}
		CL_CHECK((ss.st_mode & 07777) == (ds.st_mode & 07777), "%s: %s has mode %o, %o "
			 "expected", who, dp, ds.st_mode & 07777, ss.st_mode & 07777);
		if (S_ISDIR(ss.st_mode)) {
			if (recurse)
				n += compare_tree(sp, dp, who, true);
			continue;
		}
		CL_CHECK(ss.st_size == ds.st_size, "%s: %s has %lld bytes, %lld expected", who, dp,
			 (long long)ds.st_size, (long long)ss.st_size);
		CL_CHECK(ss.st_mtim.tv_sec == ds.st_mtim.tv_sec, "%s: %s has mtime %lld, %lld "
			 "expected", who, dp, (long long)ds.st_mtim.tv_sec,
			 (long long)ss.st_mtim.tv_sec);
		CL_CHECK(same_bytes(sp, dp, &at), "%s: %s differs from the source at byte %lld",
			 who, dp, (long long)at);
	}
	closedir(d);
	return n;
}

struct cmp_job {
	const char *src, *dst, *who;
};

static void compare_one_dir(void *arg)
{
	const struct cmp_job *job = arg;

	compare_tree(job->src, job->dst, job->who, false);
}

/*
 * The trees |dst|[0] and |dst|[1] (on node |i|) hold what |src| holds, each
 * directory compared in a child of its own: a node whose watch is late
 * waits that long for each file another node holds, so one directory after
 * the other would take the delay times the whole tree.
 */
static void compare_in_parallel(const char *src, const char *const dst[2], int i)
{
	enum { NDIRS = 1 + sizeof(tree_dirs) / sizeof(tree_dirs[0]) };
	static char msg[4096];
	pid_t pid[2][NDIRS];
	int fd[2][NDIRS];
	uint64_t end;

	for (int t = 0; t < 2; t++)
		for (int d = 0; d < NDIRS; d++) {
			char sp[1024], dp[1024], who[64], log[32];
			int pfd[2];

			snprintf(sp, sizeof(sp), "%s/%s", src, d ? tree_dirs[d - 1] : "");
			snprintf(dp, sizeof(dp), "%s/%s", dst[t], d ? tree_dirs[d - 1] : "");
			snprintf(who, sizeof(who), "node%d", i + 1);
			snprintf(log, sizeof(log), "cmp-%d-%d.log", t, d);
			CL_CHECK(pipe2(pfd, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
			pid[t][d] = proc_fork(in_tmp(log));
			if (pid[t][d] == 0) {
				struct cmp_job job = {sp, dp, who};

				close(pfd[0]);
				efs_cl_child_run(compare_one_dir, &job, pfd[1]);
			}
			close(pfd[1]);
			fd[t][d] = pfd[0];
		}
	msg[0] = '\0';
	end = efs_cl_now_ms() + UNTAR_BOUND_MS;
	for (int t = 0; t < 2; t++)
		for (int d = 0; d < NDIRS; d++) {
			uint64_t now = efs_cl_now_ms();
			ssize_t n = 0, r;
			int st;

			if (proc_wait(pid[t][d], &st, now < end ? end - now : 0, NULL) != 1)
				snprintf(msg, sizeof(msg), "node%d's comparison of %s still runs after "
					 "%d ms", i + 1, dst[t], UNTAR_BOUND_MS);
			else if (!msg[0] && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) {
				while ((r = read(fd[t][d], msg + n, sizeof(msg) - 1 - (size_t)n)) > 0)
					n += r;
				msg[n] = '\0';
				if (!n)
					snprintf(msg, sizeof(msg), "a comparison on node%d died", i + 1);
			}
			close(fd[t][d]);
		}
	CL_CHECK(!msg[0], "%s", msg);
}

/* tar -xf |tarball| -C |dest|, a child logging into |log|. */
static pid_t untar(const char *tarball, const char *dest, const char *log)
{
	pid_t pid = proc_fork(log);

	if (pid == 0) {
		execlp("tar", "tar", "-xf", tarball, "-C", dest, (char *)NULL);
		fprintf(stderr, "exec tar: %s\n", strerror(errno));
		_exit(127);
	}
	return pid;
}

/* The index of the etcd leader, waiting for one (bounded). */
static int etcd_leader(struct efs_cl *c)
{
	int r = efs_harness_wait_leader(c->etcd, 20000);

	CL_CHECK(r >= 0, "no etcd leader: %s", strerror(-r));
	return r;
}

void efs_faults_untar_leader_kill(struct efs_cl *c, const char *dir)
{
	static char out[8192], tail[2][2048];
	/* Two nodes untar, the third one compares too. */
	static const int on[2] = {0, 2}, third = 1;
	static const char *const sub[2] = {"a", "b"}, *const logs[2] = {"tar-a.log", "tar-b.log"};
	char what[64], who[64];
	char src[600], tarball[600];
	const char *dst[2];
	const char *tar_args[] = {"tar", "--sort=name", "-cf", NULL, "-C", NULL, ".", NULL};
	uint64_t t0, t_kill = 0, t_end[2] = {0, 0}, t_leader, t_restart, t_cmp, t_own;
	int st[2] = {0, 0}, done[2] = {0, 0}, leader, r, n;
	bool running_at_kill[2];
	pid_t pid[2];

	tmp_make(c, "untar");
	snprintf(src, sizeof(src), "%s", in_tmp("src"));
	snprintf(tarball, sizeof(tarball), "%s", in_tmp("tree.tar"));
	make_tree(src);
	tar_args[3] = tarball;
	tar_args[5] = src;
	r = efs_tp_run_capture("/usr/bin/tar", tar_args, out, sizeof(out), 60000);
	CL_CHECK(r == 0, "tar -cf exited %d:\n%s", r, out);
	for (int k = 0; k < 2; k++)
		CL_CHECK(mkdir(efs_cl_dpath(c, on[k], dir, sub[k]), 0755) == 0,
			 "mkdir %s on node%d: %s", sub[k], on[k] + 1, strerror(errno));

	leader = etcd_leader(c);
	t0 = efs_cl_now_ms();
	for (int k = 0; k < 2; k++)
		pid[k] = untar(tarball, efs_cl_dpath(c, on[k], dir, sub[k]), in_tmp(logs[k]));
	/* Partway: once either untar has reached the file a third of the way
	 * in (polled on its own node). */
	while (efs_cl_now_ms() - t0 < UNTAR_BOUND_MS) {
		if (proc_ended(pid[0]) || proc_ended(pid[1]))
			break;
		if (access(efs_cl_dpath(c, on[0], dir, "a/" PARTWAY_FILE), F_OK) == 0 ||
		    access(efs_cl_dpath(c, on[1], dir, "b/" PARTWAY_FILE), F_OK) == 0)
			break;
		efs_cl_sleep_ms(20);
	}
	for (int k = 0; k < 2; k++)
		running_at_kill[k] = proc_wait(pid[k], &st[k], 0, &t_end[k]) == 0;
	/* The leader may have changed meanwhile: kill the one there is now. */
	leader = etcd_leader(c);
	r = efs_harness_kill(c->etcd, leader);
	CL_CHECK(r == 0, "kill of etcd member %d: %s", leader, strerror(-r));
	dead_member = leader;
	t_kill = efs_cl_now_ms();
	r = efs_harness_wait_leader(c->etcd, 20000);
	t_leader = efs_cl_now_ms();
	/* Both untars end with the member still dead; what they did is
	 * asserted once it runs again. */
	for (uint64_t end = efs_cl_now_ms() + UNTAR_BOUND_MS; efs_cl_now_ms() < end;
	     efs_cl_sleep_ms(20)) {
		for (int k = 0; k < 2; k++)
			if (running_at_kill[k] && !done[k])
				done[k] = proc_wait(pid[k], &st[k], 0, &t_end[k]);
		if ((done[0] || !running_at_kill[0]) && (done[1] || !running_at_kill[1]))
			break;
	}
	t_restart = efs_cl_now_ms();
	n = efs_harness_restart(c->etcd, leader);
	CL_CHECK(n == 0, "restart of etcd member %d: %s", leader, strerror(-n));
	n = efs_harness_wait_member(c->etcd, leader, 20000);
	CL_CHECK(n == 0, "etcd member %d is not healthy after its restart: %s", leader,
		 strerror(-n));
	dead_member = -1;
	etcd_leader(c);
	t_restart = efs_cl_now_ms() - t_restart;
	printf("# untar: the etcd leader (member %d) killed %" PRIu64 " ms in, a new leader "
	       "after %" PRIu64 " ms; node%d's untar took %" PRIu64 " ms, node%d's %" PRIu64 " ms\n",
	       leader, t_kill - t0, t_leader - t_kill, on[0] + 1, t_end[0] - t0, on[1] + 1,
	       t_end[1] - t0);
	CL_CHECK(r >= 0, "no etcd leader within 20 s of the kill: %s", strerror(-r));
	for (int k = 0; k < 2; k++) {
		efs_tp_file_tail(in_tmp(logs[k]), tail[k], sizeof(tail[k]));
		CL_CHECK(running_at_kill[k], "node%d's untar had ended (%s) before the leader's "
			 "kill: nothing was checked; its output:\n%s", on[k] + 1,
			 status_text(st[k], what, sizeof(what)), tail[k]);
		CL_CHECK(done[k], "node%d's untar still runs %d ms after the kill", on[k] + 1,
			 UNTAR_BOUND_MS);
		CL_CHECK(WIFEXITED(st[k]) && WEXITSTATUS(st[k]) == 0,
			 "node%d's untar ended with %s; its output:\n%s", on[k] + 1,
			 status_text(st[k], what, sizeof(what)), tail[k]);
	}
	/* Each tree on its own node, then both on the third node. */
	t_cmp = efs_cl_now_ms();
	for (int k = 0; k < 2; k++) {
		snprintf(who, sizeof(who), "node%d", on[k] + 1);
		n = compare_tree(src, efs_cl_dpath(c, on[k], dir, sub[k]), who, true);
		CL_CHECK(n == TREE_FILES + 2 + (int)(sizeof(tree_dirs) / sizeof(tree_dirs[0])),
			 "the tree has %d entries", n);
	}
	t_own = efs_cl_now_ms() - t_cmp;
	dst[0] = efs_cl_dpath(c, third, dir, sub[0]);
	dst[1] = efs_cl_dpath(c, third, dir, sub[1]);
	compare_in_parallel(src, dst, third);
	printf("# untar: the member's restart took %" PRIu64 " ms; the comparisons on the "
	       "untarring nodes %" PRIu64 " ms, on node%d %" PRIu64 " ms\n",
	       t_restart, t_own, third + 1, efs_cl_now_ms() - t_cmp - t_own);
	tmp_remove();
}

/* ---- Writers under a node's kill ---- */

#define REC	       4096
#define LOAD_BEFORE_MS 2000 /* writing before the kill */
#define LOAD_AFTER_MS  4000 /* the survivors' writing after it */
#define GAP_BOUND_MS   5000 /* the longest a survivor's writes may stall */
#define BACK_MS	       15000 /* after the grace, for the space to be seen free */

/* The bytes of record |k| of writer |w|. */
static void record(unsigned char *buf, int w, int k)
{
	fill_bytes(buf, REC, (uint64_t)w << 32 | (uint32_t)k);
	memcpy(buf, &k, sizeof(k));
}

static uint32_t checksum(const unsigned char *buf, size_t len)
{
	uint32_t h = 2166136261u;

	for (size_t k = 0; k < len; k++)
		h = (h ^ buf[k]) * 16777619u;
	return h;
}

/*
 * Writer |w| on node |w|: record k at offset k * REC, then fsync; each
 * acknowledged one logged as "A k offset length checksum ms" (ms: its
 * fsync's return, CLOCK_MONOTONIC). Until |stop| exists; a failure is
 * logged as "E errno ms" and ends the writer (status 0 where |may_fail|).
 */
static void writer(int w, const char *path, const char *log, const char *stop, bool may_fail)
{
	static unsigned char buf[REC];
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

	if (fd < 0 || lfd < 0) {
		fprintf(stderr, "writer %d: open: %s\n", w + 1, strerror(errno));
		_exit(1);
	}
	for (int k = 0; access(stop, F_OK) != 0; k++) {
		record(buf, w, k);
		if (pwrite(fd, buf, REC, (off_t)k * REC) != REC || fsync(fd) != 0) {
			int e = errno;

			dprintf(lfd, "E %d %" PRIu64 "\n", e, efs_cl_now_ms());
			fprintf(stderr, "writer %d, record %d: %s\n", w + 1, k, strerror(e));
			_exit(may_fail ? 0 : 1);
		}
		dprintf(lfd, "A %d %lld %d %08x %" PRIu64 "\n", k, (long long)k * REC, REC,
			checksum(buf, REC), efs_cl_now_ms());
	}
	close(fd);
	_exit(0);
}

struct acks {
	int n;		    /* acknowledged records */
	int err;	    /* the errno that ended the writer, 0: none */
	uint64_t last_ms;   /* the last acknowledgement */
	uint64_t worst_gap; /* the longest time between two */
	uint64_t kill_gap;  /* from the last before the kill to the first after */
	int after_kill;	    /* acknowledged after the kill */
};

/* Reads writer |w|'s log; every record acknowledged must be record k at
 * offset k * REC with its checksum, in order. */
static void read_acks(const char *log, int w, uint64_t t_kill, struct acks *a)
{
	static unsigned char want[REC];
	FILE *fp = fopen(log, "re");
	char line[128];
	uint64_t prev = 0;

	CL_CHECK(fp, "open %s: %s", log, strerror(errno));
	memset(a, 0, sizeof(*a));
	while (fgets(line, sizeof(line), fp)) {
		unsigned long long off, ms;
		unsigned sum;
		int k, len, e;

		if (sscanf(line, "E %d %llu", &e, &ms) == 2) {
			a->err = e;
			continue;
		}
		CL_CHECK(sscanf(line, "A %d %llu %d %x %llu", &k, &off, &len, &sum, &ms) == 5,
			 "writer %d logged '%s'", w + 1, line);
		record(want, w, k);
		CL_CHECK(k == a->n && off == (unsigned long long)k * REC && len == REC &&
				 sum == checksum(want, REC),
			 "writer %d logged '%s' as its record %d", w + 1, line, a->n);
		a->n++;
		if (prev && ms - prev > a->worst_gap)
			a->worst_gap = ms - prev;
		if (prev && prev <= t_kill && ms > t_kill)
			a->kill_gap = ms - prev;
		prev = a->last_ms = ms;
		a->after_kill += ms > t_kill;
	}
	fclose(fp);
}

/* Every acknowledged record of |a| in |path| read on node |i|, whole. */
static void check_records(struct efs_cl *c, int i, const char *path, int w, const struct acks *a)
{
	static unsigned char want[REC], got[REC];
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	CL_CHECK(fd >= 0, "node%d: open %s: %s", i + 1, path, strerror(errno));
	for (int k = 0; k < a->n; k++) {
		ssize_t n = pread(fd, got, REC, (off_t)k * REC);

		record(want, w, k);
		CL_CHECK(n == REC && checksum(got, REC) == checksum(want, REC) &&
				 !memcmp(got, want, REC),
			 "node%d reads writer %d's acknowledged record %d (of %d) wrong: %zd bytes, "
			 "checksum %08x, %08x expected",
			 i + 1, w + 1, k, a->n, n, checksum(got, (size_t)(n > 0 ? n : 0)),
			 checksum(want, REC));
	}
	(void)c;
	close(fd);
}

void efs_faults_node_kill_under_load(struct efs_cl *c, const char *dir, unsigned grace_s)
{
	static unsigned char buf[REC];
	static char tail[2048];
	struct acks a[3];
	char name[16], log[3][600], what[64];
	char stop[600];
	unsigned long long base;
	uint64_t t_kill, worst = 0, t_take, end;
	pid_t pid[3];
	int st, fd, take_k;

	tmp_make(c, "load");
	snprintf(stop, sizeof(stop), "%s", in_tmp("stop"));
	efs_cl_sync_all(c);
	base = efs_cl_free_bytes(c);
	for (int w = 0; w < 3; w++) {
		snprintf(name, sizeof(name), "w%d", w + 1);
		snprintf(log[w], sizeof(log[w]), "%s", in_tmp(name));
		pid[w] = proc_fork(in_tmp(w == 0 ? "out1" : w == 1 ? "out2" : "out3"));
		if (pid[w] == 0)
			writer(w, efs_cl_dpath(c, w, dir, name), log[w], stop, w == 2);
	}
	efs_cl_sleep_ms(LOAD_BEFORE_MS);
	for (int w = 0; w < 3; w++)
		CL_CHECK(proc_wait(pid[w], &st, 0, NULL) == 0, "writer %d ended before the kill "
			 "(%s)", w + 1, status_text(st, what, sizeof(what)));
	efs_cl_kill(c, 2);
	t_kill = efs_cl_now_ms();
	/* node3's writer fails (its mount is gone) and ends by itself. */
	CL_CHECK(proc_wait(pid[2], &st, 10000, NULL) == 1, "node3's writer still runs 10 s after "
		 "the kill");
	CL_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "node3's writer: %s",
		 status_text(st, what, sizeof(what)));
	efs_cl_sleep_ms(LOAD_AFTER_MS);
	fd = open(stop, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	CL_CHECK(fd >= 0, "create %s: %s", stop, strerror(errno));
	close(fd);
	for (int w = 0; w < 2; w++) {
		CL_CHECK(proc_wait(pid[w], &st, 20000, NULL) == 1, "writer %d still runs 20 s after "
			 "its stop", w + 1);
		efs_tp_file_tail(in_tmp(w ? "out2" : "out1"), tail, sizeof(tail));
		CL_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d on a survivor: %s; its "
			 "output:\n%s", w + 1, status_text(st, what, sizeof(what)), tail);
	}
	for (int w = 0; w < 3; w++)
		read_acks(log[w], w, t_kill, &a[w]);
	for (int w = 0; w < 2; w++)
		if (a[w].worst_gap > worst)
			worst = a[w].worst_gap;
	printf("# worst survivor gap %" PRIu64 " ms (writers 1 and 2: %d and %d records, %d and "
	       "%d after the kill; worst gaps %" PRIu64 " and %" PRIu64 " ms, across the kill "
	       "%" PRIu64 " and %" PRIu64 " ms); node3's writer: %d records, the last %lld ms before "
	       "the kill, then %s\n",
	       worst, a[0].n, a[1].n, a[0].after_kill, a[1].after_kill, a[0].worst_gap,
	       a[1].worst_gap, a[0].kill_gap, a[1].kill_gap, a[2].n,
	       (long long)(t_kill - a[2].last_ms), strerror(a[2].err));
	for (int w = 0; w < 3; w++)
		CL_CHECK(a[w].n >= 10, "writer %d acknowledged only %d records", w + 1, a[w].n);
	for (int w = 0; w < 2; w++)
		CL_CHECK(a[w].after_kill >= 10 && a[w].last_ms + 1000 >= t_kill + LOAD_AFTER_MS,
			 "writer %d made little progress after the kill: %d records, the last %lld "
			 "ms after it", w + 1, a[w].after_kill,
			 (long long)(a[w].last_ms - t_kill));
	CL_CHECK(!TIMING || worst < GAP_BOUND_MS, "a survivor's writes stalled for %" PRIu64
		 " ms", worst);
	CL_CHECK(a[2].err != 0, "node3's writer ended without an error");

	/* node1 takes node3's file over: reads what was acknowledged, then
	 * writes a record after it, durably. */
	t_take = efs_cl_now_ms();
	check_records(c, 0, efs_cl_dpath(c, 0, dir, "w3"), 2, &a[2]);
	fd = open(efs_cl_dpath(c, 0, dir, "w3"), O_WRONLY | O_CLOEXEC);
	CL_CHECK(fd >= 0, "node1 opens node3's file: %s", strerror(errno));
	take_k = a[2].n;
	record(buf, 2, take_k);
	CL_CHECK(pwrite(fd, buf, REC, (off_t)take_k * REC) == REC && fsync(fd) == 0,
		 "node1 writes node3's file: %s", strerror(errno));
	close(fd);
	t_take = efs_cl_now_ms() - t_take;
	a[2].n++;
	printf("# takeover of node3's file by node1: %" PRIu64 " ms (%" PRIu64 " ms after the "
	       "kill)\n", t_take, efs_cl_now_ms() - t_kill);
	/* Everything, read on node2 (node1 wrote the last record). */
	for (int w = 0; w < 3; w++) {
		snprintf(name, sizeof(name), "w%d", w + 1);
		check_records(c, 1, efs_cl_dpath(c, 1, dir, name), w, &a[w]);
	}

	/* The space comes back after the grace, once the files are gone. */
	for (int w = 0; w < 3; w++) {
		snprintf(name, sizeof(name), "w%d", w + 1);
		CL_CHECK(unlink(efs_cl_dpath(c, 0, dir, name)) == 0, "unlink %s: %s", name,
			 strerror(errno));
	}
	end = t_kill + (uint64_t)c->opts.session_ttl * 1000 + grace_s * 1000;
	if (efs_cl_now_ms() < end)
		efs_cl_sleep_ms((unsigned)(end - efs_cl_now_ms()));
	efs_cl_sync_all(c);
	efs_cl_wait_free(c, base - 2 * 65536, BACK_MS, "after the grace of node3's kill");
	{
		static char out[16384];
		int r = efs_cl_run(c, out, sizeof(out), "fsck.etcfs", "-n", c->image,
				   (const char *)NULL);

		CL_CHECK(r == 0, "fsck.etcfs -n with node3 dead exited %d:\n%.6000s", r, out);
	}
	printf("# node3's space back %" PRIu64 " ms after its kill (grace %u s)\n",
	       efs_cl_now_ms() - t_kill, grace_s);
	efs_cl_down(c, 2);
	efs_cl_mount(c, 2);
	tmp_remove();
}
