/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Shared by test/integration/test_data.c and test_crash.c: the test
 * environment, a seeded generator, checksums and I/O helpers. Header only
 * (everything static inline), so the test files need no extra sources.
 *
 * The environment a test runs in: by default a real etcfs mount from
 * test/support/mount.h; built with -DDATA_LOCAL=1 (see the file comments),
 * a private ext4 on a loop device over an image in /var/tmp instead, so
 * that every expectation can first be checked against Linux's own
 * filesystem. In both, env_remount() is a real unmount and mount.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "config.h"

#include "leak.h"
#ifndef DATA_LOCAL
#include "mount.h"
#endif

/* ---- Time and randomness ---- */

static inline uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void nap_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* The seed of this test: ETCFS_TEST_SEED, else the clock and the pid. */
static inline uint64_t test_seed(void)
{
	const char *s = getenv("ETCFS_TEST_SEED");
	struct timespec ts;

	if (s && *s)
		return strtoull(s, NULL, 0);
	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
}

/* splitmix64: the state is the seed, advanced per call. */
static inline uint64_t rnd_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi] (hi >= lo). */
static inline uint64_t rnd_range(uint64_t *s, uint64_t lo, uint64_t hi)
{
	return lo + rnd_next(s) % (hi - lo + 1);
}

static inline void rnd_fill(uint64_t *s, void *buf, size_t len)
{
	uint8_t *p = buf;
	uint64_t v;

	while (len >= 8) {
		v = rnd_next(s);
		memcpy(p, &v, 8);
		p += 8;
		len -= 8;
	}
	v = rnd_next(s);
	memcpy(p, &v, len);
}

/* FNV-1a, 64 bits. */
static inline uint64_t fnv64(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static inline bool all_zero(const uint8_t *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

/* ---- Small I/O helpers ---- */

/* Full pwrite: the byte count written (short only on an error), -1 with
 * errno when nothing was written. */
static inline ssize_t pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pwrite(fd, (const char *)buf + done, len - done, off + (off_t)done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return done ? (ssize_t)done : -1;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

/* Full pread up to EOF: the byte count, or -1 with errno. */
static inline ssize_t pread_all(int fd, void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = pread(fd, (char *)buf + done, len - done, off + (off_t)done);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

/* Runs a shell command line; its exit status, or -1. Output into |out|. */
__attribute__((format(printf, 3, 4))) static inline int shell(char *out, size_t out_size, const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	FILE *p;
	size_t used = 0;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	p = popen(cmd, "r");
	if (!p)
		return -1;
	if (out && out_size)
		out[0] = '\0';
	for (;;) {
		char buf[4096];
		size_t n = fread(buf, 1, sizeof(buf), p);

		if (n == 0)
			break;
		if (out && used + 1 < out_size) {
			size_t k = n < out_size - used - 1 ? n : out_size - used - 1;

			memcpy(out + used, buf, k);
			used += k;
			out[used] = '\0';
		}
	}
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- The environment ---- */

/* How long one test may run before the watchdog kills the daemon. */
#define ENV_WATCHDOG_MS 240000

static struct {
	bool up;
	pthread_t watchdog;
	bool watchdog_running;
	volatile bool watchdog_stop;
	volatile bool watchdog_fired;
	uint64_t deadline;
	char root[PATH_MAX]; /* where the test's files go (the mount point) */
	uint64_t image_size;
#ifdef DATA_LOCAL
	char dir[256];
	char image[300];
	bool mounted;
#else
	struct efs_test_fs f;
#endif
} env;

static inline const char *env_path(char *buf, size_t size, const char *name)
{
	int n = snprintf(buf, size, "%s/%s", env.root, name);

	cr_assert(n > 0 && (size_t)n < size, "path %s too long", name);
	return buf;
}

#ifdef DATA_LOCAL
static inline void env_mount(void)
{
	char out[2048];
	int r = shell(out, sizeof(out), "mount -o loop %s %s 2>&1", env.image, env.root);

	cr_assert_eq(r, 0, "local: mount %s: %s", env.image, out);
	env.mounted = true;
}

static inline void env_unmount(void)
{
	char out[2048];
	int r;

	if (!env.mounted)
		return;
	r = shell(out, sizeof(out), "umount %s 2>&1", env.root);
	cr_assert_eq(r, 0, "local: umount %s: %s", env.root, out);
	env.mounted = false;
}
#endif

#ifndef DATA_LOCAL
/*
 * A daemon thread stuck in the kernel (a notification waiting for a page
 * the hung call holds) keeps the connection open after the kill: abort it
 * through fusectl (mounted here if it is not), so the hung call fails.
 */
static inline void env_abort_connection(void)
{
	char path[128];
	bool mounted = false;
	struct stat st;
	int fd;

	nap_ms(500);
	if (stat(env.f.mnt, &st) != 0)
		return;
	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort", minor(st.st_dev));
	if (access(path, F_OK) != 0) {
		if (mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, NULL) != 0)
			return;
		mounted = true;
	}
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "1", 1) == 1)
			fprintf(stderr, "watchdog: aborted FUSE connection %u\n", minor(st.st_dev));
		close(fd);
	}
	if (mounted)
		umount("/sys/fs/fuse/connections");
}
#endif

/*
 * The watchdog: a test that hangs (a FUSE request the daemon never answers)
 * would otherwise hang the suite. Past the deadline the daemon is killed,
 * so the hung call fails (ENOTCONN) and env_why() names the cause.
 */
static inline void *env_watchdog_main(void *arg)
{
	(void)arg;
	while (!env.watchdog_stop) {
		if (mono_ms() >= env.deadline) {
			env.watchdog_fired = true;
			fprintf(stderr, "watchdog: test still running after %d ms: killing the daemon\n",
				ENV_WATCHDOG_MS);
#ifndef DATA_LOCAL
			if (env.f.daemon > 0)
				kill(env.f.daemon, SIGKILL);
			env_abort_connection();
#endif
			return NULL;
		}
		nap_ms(100);
	}
	return NULL;
}

/* A note for failure messages: why the mount went away, or "". */
static inline const char *env_why(void)
{
	return env.watchdog_fired ? " [watchdog: the test hung for 240 s, etcfsd was killed]" : "";
}

/*
 * Starts the environment: an etcfs of |image_size| bytes (0: 256 MiB),
 * mounted with allow_other (checks as another user), with metrics.
 */
static inline void env_start(uint64_t image_size, const char *const *mount_args)
{
	env.image_size = image_size ? image_size : 256ull << 20;
	env.watchdog_stop = false;
	env.watchdog_fired = false;
	env.deadline = mono_ms() + ENV_WATCHDOG_MS;
	cr_assert_eq(pthread_create(&env.watchdog, NULL, env_watchdog_main, NULL), 0);
	env.watchdog_running = true;
#ifdef DATA_LOCAL
	char out[2048];
	int fd, r;

	(void)mount_args;
	snprintf(env.dir, sizeof(env.dir), "/var/tmp/datatest-XXXXXX");
	cr_assert_not_null(mkdtemp(env.dir), "mkdtemp: %s", strerror(errno));
	env.up = true;
	snprintf(env.image, sizeof(env.image), "%s/disk.img", env.dir);
	snprintf(env.root, sizeof(env.root), "%s/mnt", env.dir);
	cr_assert_eq(mkdir(env.root, 0755), 0);
	fd = open(env.image, O_RDWR | O_CREAT | O_EXCL, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, (off_t)env.image_size), 0);
	close(fd);
	r = shell(out, sizeof(out), "mkfs.ext4 -q -F -m 0 %s 2>&1", env.image);
	cr_assert_eq(r, 0, "local: mkfs.ext4: %s", out);
	env_mount();
	cr_assert_eq(chmod(env.root, 0755), 0);
#else
	static const char *const margs[] = {"-o", "allow_other", NULL};
	struct efs_test_fs_opts o = {
		.image_size = env.image_size,
		.mount_args = mount_args ? mount_args : margs,
		.metrics = true,
	};

	efs_test_fs_start(&env.f, &o);
	env.up = true;
	cr_assert(efs_test_is_fuse_mount(env.f.mnt), "%s is not a FUSE mount", env.f.mnt);
	snprintf(env.root, sizeof(env.root), "%s", env.f.mnt);
#endif
}

/* A clean unmount and a mount again. */
static inline void env_remount(void)
{
	cr_assert_eq(chdir("/"), 0);
#ifdef DATA_LOCAL
	env_unmount();
	env_mount();
#else
	efs_test_fs_unmount(&env.f);
	efs_test_fs_mount(&env.f, NULL);
#endif
}

#ifdef DATA_LOCAL
static inline int rm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
	(void)sb;
	(void)ftw;
	return type == FTW_DP ? rmdir(path) : unlink(path);
}
#endif

/*
 * Closes every descriptor of this process open under the environment's
 * root: a failed assertion leaves the test's files open, which would keep
 * the mount busy.
 */
static inline void env_close_fds(void)
{
	size_t rl = strlen(env.root);
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char link[64], target[PATH_MAX];
		int fd = atoi(e->d_name);
		ssize_t n;

		if (fd <= 2 || fd == dirfd(d))
			continue;
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		n = readlink(link, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, env.root, rl) == 0 && (target[rl] == '/' || target[rl] == '\0'))
			close(fd);
	}
	closedir(d);
}

/* Stops everything (also the suite's .fini after a failed assertion). */
static inline void env_stop(void)
{
	if (env.watchdog_running) {
		env.watchdog_stop = true;
		pthread_join(env.watchdog, NULL);
		env.watchdog_running = false;
	}
	if (!env.up)
		return;
	(void)!chdir("/");
	env_close_fds();
	env.up = false;
#ifdef DATA_LOCAL
	if (env.mounted) {
		char out[512];

		if (shell(out, sizeof(out), "umount %s 2>&1", env.root) != 0)
			shell(out, sizeof(out), "umount -l %s 2>&1", env.root);
		env.mounted = false;
	}
	nftw(env.dir, rm_one, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
#else
	efs_test_fs_stop(&env.f);
#endif
}

/* Free bytes (f_bfree) and available bytes (f_bavail) of the environment. */
static inline void env_space(uint64_t *bfree, uint64_t *bavail)
{
	struct statvfs sv;

	cr_assert_eq(statvfs(env.root, &sv), 0, "statvfs %s: %s", env.root, strerror(errno));
	if (bfree)
		*bfree = (uint64_t)sv.f_bfree * sv.f_frsize;
	if (bavail)
		*bavail = (uint64_t)sv.f_bavail * sv.f_frsize;
}

#ifndef DATA_LOCAL
/* The number of etcd keys under /etcfs/<fsname>/<family> (e.g. "rc/"). */
static inline long etcd_count(const char *family)
{
	char out[65536];
	long n = 0;
	int r;

	r = shell(out, sizeof(out),
		  "ETCDCTL_API=3 etcdctl --endpoints %s get --prefix --keys-only /etcfs/%s/%s "
		  "2>&1",
		  env.f.endpoints, env.f.opts.fsname, family);
	cr_assert_eq(r, 0, "etcdctl get %s failed: %s", family, out);
	for (char *p = out; *p; p++)
		if (*p == '\n' && p > out && p[-1] != '\n')
			n++;
	return n;
}

/* Waits (bounded) until etcd holds no rc/ and o/ keys; the last counts. */
static inline bool wait_no_reclaim(unsigned ms, long *rc, long *o)
{
	uint64_t end = mono_ms() + ms;

	for (;;) {
		*rc = etcd_count("rc/");
		*o = etcd_count("o/");
		if (*rc == 0 && *o == 0)
			return true;
		if (mono_ms() >= end)
			return false;
		nap_ms(200);
	}
}

/* Runs fsck.etcfs -n on the (unmounted) image: exit status and output. */
static inline int run_fsck(char *out, size_t size)
{
	return efs_test_fs_run(&env.f, out, size, "fsck.etcfs", "-n", env.f.image, NULL);
}
#endif
