/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fcntl (POSIX and OFD) and flock locks on a real etcfs mount: conflicts
 * between processes (EAGAIN), F_GETLK naming the holder, F_SETLKW waiting
 * until the holder unlocks and ending with EINTR on a signal, shared read
 * locks, OFD locks between two open file descriptions of one process, flock
 * LOCK_EX/LOCK_SH/LOCK_NB (blocking too) apart from fcntl locks, the p/ keys
 * in etcd while locks are held and gone after unlock, and locks dropped by
 * close (FLUSH for fcntl locks, RELEASE for flock locks).
 *
 * The other process is a forked "remote" child that runs commands sent
 * through a pipe on its own descriptor of the file and answers each with
 * the errno (and the F_GETLK result): so the parent can tell whether a
 * blocking command is still waiting.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "../support/mount.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "meta/keys.h"
#include "util/mem.h"

static struct efs_test_fs fs;
/* The remote child, killed by fini after a failed assertion (its open
 * descriptor would keep the mount busy). */
static pid_t remote_pid;
/* The test's own descriptors on the mount, closed by fini likewise. */
static int fds[4] = {-1, -1, -1, -1};

static int open_f(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);

	cr_assert_geq(fd, 0, "open: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (fds[i] < 0) {
			fds[i] = fd;
			return fd;
		}
	}
	cr_assert_fail("too many descriptors");
	return -1;
}

static void close_f(int fd)
{
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (fds[i] == fd)
			fds[i] = -1;
	}
	close(fd);
}

static void fini(void)
{
	for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (fds[i] >= 0)
			close(fds[i]);
		fds[i] = -1;
	}
	if (remote_pid > 0) {
		kill(remote_pid, SIGKILL);
		waitpid(remote_pid, NULL, 0);
		remote_pid = 0;
	}
	efs_test_fs_stop(&fs);
}

TestSuite(plock, .fini = fini, .timeout = 180);

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

/* ---- The remote child ---- */

enum {
	CMD_FCNTL = 1, /* fcntl(fd, cmd, {type, start, len}) */
	CMD_FLOCK,     /* flock(fd, op) */
	CMD_CLOSE,     /* close(fd) */
	CMD_OPEN,      /* fd = open(path) */
	CMD_EXIT,
};

struct cmd {
	int op;
	int fcmd; /* F_SETLK, F_SETLKW, F_GETLK, F_OFD_*; flock op */
	int type;
	int64_t start, len;
};

struct answer {
	int err;
	struct flock fl;
};

struct remote {
	pid_t pid;
	int to, from;
};

static void on_usr1(int sig)
{
	(void)sig;
}

static void remote_main(const char *path, int in, int out)
{
	struct sigaction sa;
	struct cmd c;
	int fd = open(path, O_RDWR);

	/* A signal interrupts a blocking lock (no SA_RESTART). */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	while (read(in, &c, sizeof(c)) == (ssize_t)sizeof(c)) {
		struct answer a;

		memset(&a, 0, sizeof(a));
		switch (c.op) {
		case CMD_FCNTL:
			a.fl.l_type = (short)c.type;
			a.fl.l_whence = SEEK_SET;
			a.fl.l_start = c.start;
			a.fl.l_len = c.len;
			a.err = fcntl(fd, c.fcmd, &a.fl) < 0 ? errno : 0;
			break;
		case CMD_FLOCK:
			a.err = flock(fd, c.fcmd) < 0 ? errno : 0;
			break;
		case CMD_CLOSE:
			a.err = close(fd) < 0 ? errno : 0;
			fd = -1;
			break;
		case CMD_OPEN:
			fd = open(path, O_RDWR);
			a.err = fd < 0 ? errno : 0;
			break;
		default:
			_exit(0);
		}
		if (write(out, &a, sizeof(a)) != (ssize_t)sizeof(a))
			_exit(3);
	}
	_exit(0);
}

static void remote_start(struct remote *r, const char *path)
{
	int to[2], from[2];

	cr_assert_eq(pipe(to), 0);
	cr_assert_eq(pipe(from), 0);
	r->pid = fork();
	cr_assert_geq(r->pid, 0);
	if (r->pid == 0) {
		close(to[1]);
		close(from[0]);
		remote_main(path, to[0], from[1]);
	}
	remote_pid = r->pid;
	close(to[0]);
	close(from[1]);
	r->to = to[1];
	r->from = from[0];
}

static void remote_send(struct remote *r, int op, int fcmd, int type, int64_t start, int64_t len)
{
	struct cmd c = {.op = op, .fcmd = fcmd, .type = type, .start = start, .len = len};

	cr_assert_eq(write(r->to, &c, sizeof(c)), (ssize_t)sizeof(c));
}

/* Waits up to |ms| for the answer: false when none came. */
static bool remote_answer(struct remote *r, unsigned ms, struct answer *a)
{
	struct pollfd p = {.fd = r->from, .events = POLLIN};

	if (poll(&p, 1, (int)ms) != 1)
		return false;
	cr_assert_eq(read(r->from, a, sizeof(*a)), (ssize_t)sizeof(*a), "remote died");
	return true;
}

/* Runs one command and returns its errno (10 s bound). */
static int remote_do(struct remote *r, int op, int fcmd, int type, int64_t start, int64_t len,
		     struct flock *ret)
{
	struct answer a;

	remote_send(r, op, fcmd, type, start, len);
	cr_assert(remote_answer(r, 10000, &a), "remote command %d/%d hangs", op, fcmd);
	if (ret)
		*ret = a.fl;
	return a.err;
}

static void remote_stop(struct remote *r)
{
	int st;

	remote_send(r, CMD_EXIT, 0, 0, 0, 0);
	close(r->to);
	close(r->from);
	cr_assert_eq(waitpid(r->pid, &st, 0), r->pid);
	remote_pid = 0;
}

/* ---- Local locks ---- */

static int lk(int fd, int cmd, int type, off_t start, off_t len)
{
	struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = start,
			   .l_len = len};

	return fcntl(fd, cmd, &fl) < 0 ? errno : 0;
}

static struct flock getlk(int fd, int cmd, int type, off_t start, off_t len)
{
	struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = start,
			   .l_len = len};

	cr_assert_eq(fcntl(fd, cmd, &fl), 0, "getlk: %s", strerror(errno));
	return fl;
}

/* ---- etcd ---- */

/* Number of p/<ino> keys (lock owners holding locks on the file). */
static int plock_keys(const char *path)
{
	struct efs_etcd_opts eo = {.endpoints = fs.endpoints};
	struct efs_etcd_sync *s = NULL;
	struct efs_etcd_txn *t = NULL;
	Etcdserverpb__TxnResponse *resp = NULL;
	Etcdserverpb__RangeResponse *rr = NULL;
	struct efs_meta_ns ns;
	struct efs_meta_range range;
	struct stat st;
	int n;

	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(efs_meta_ns_init(&ns, "testfs"), 0);
	cr_assert_eq(efs_meta_range_ino(&ns, EFS_META_K_PLOCK, st.st_ino, &range), 0);
	cr_assert_eq(efs_etcd_sync_new(&s, &eo), 0);
	cr_assert_eq(efs_etcd_txn_new(&t, 0), 0);
	cr_assert_eq(efs_etcd_txn_range(t, EFS_ETCD_TXN_SUCCESS, range.key.buf, range.key.len,
					range.end.buf, range.end.len),
		     0);
	cr_assert_eq(efs_etcd_sync_txn(s, efs_etcd_txn_request(t), &resp), 0);
	cr_assert_eq(efs_etcd_txn_resp_range(resp, 0, &rr), 0);
	n = (int)rr->n_kvs;
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	efs_etcd_txn_free(t);
	efs_etcd_sync_free(s);
	return n;
}

/* Waits (bounded) for the key count to become |n|: an unlock answered to
 * the process is committed, but allow for a slow machine anyway. */
static int plock_keys_wait(const char *path, int n)
{
	int got = plock_keys(path);

	for (int i = 0; i < 50 && got != n; i++) {
		sleep_ms(100);
		got = plock_keys(path);
	}
	return got;
}

static void start_fs(char *path, size_t size, bool metrics)
{
	struct efs_test_fs_opts o = {.metrics = metrics};
	int fd;

	efs_test_fs_start(&fs, &o);
	snprintf(path, size, "%s/f", fs.mnt);
	fd = open(path, O_CREAT | O_RDWR, 0644);
	cr_assert_geq(fd, 0, "create: %s", strerror(errno));
	close(fd);
}

/* ---- Tests ---- */

Test(plock, fcntl_between_processes)
{
	char path[512];
	struct remote r;
	struct answer a;
	struct flock fl;
	uint64_t t0;
	int fd;

	start_fs(path, sizeof(path), true);
	remote_start(&r, path);
	fd = open_f(path);

	/* The child write-locks [0, 100). */
	cr_assert_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_WRLCK, 0, 100, NULL), 0);
	cr_expect_eq(plock_keys(path), 1, "one owner's key while held");

	/* Conflict: EAGAIN; F_GETLK names the holder. */
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 50, 10), EAGAIN);
	cr_expect_eq(lk(fd, F_SETLK, F_RDLCK, 99, 1), EAGAIN);
	fl = getlk(fd, F_GETLK, F_RDLCK, 0, 0);
	cr_expect_eq(fl.l_type, F_WRLCK);
	cr_expect_eq(fl.l_start, 0);
	cr_expect_eq(fl.l_len, 100);
	cr_expect_eq(fl.l_pid, r.pid, "holder pid %d, child %d", (int)fl.l_pid, (int)r.pid);
	fl = getlk(fd, F_GETLK, F_WRLCK, 100, 0);
	cr_expect_eq(fl.l_type, F_UNLCK, "nothing past the child's range");

	/* Beside it: fine; two owners' keys. */
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 100, 10), 0);
	cr_expect_eq(plock_keys(path), 2);
	/* The child sees the parent's lock. */
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_GETLK, F_WRLCK, 105, 1, &fl), 0);
	cr_expect_eq(fl.l_type, F_WRLCK);
	cr_expect_eq(fl.l_start, 100);
	cr_expect_eq(fl.l_len, 10);
	cr_expect_eq(fl.l_pid, getpid());

	/* F_SETLKW of the child waits until the parent unlocks. */
	remote_send(&r, CMD_FCNTL, F_SETLKW, F_WRLCK, 100, 1);
	cr_expect_not(remote_answer(&r, 700, &a), "F_SETLKW returned while the range is held");
	t0 = now_ms();
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 100, 10), 0);
	cr_assert(remote_answer(&r, 10000, &a), "F_SETLKW still waits after the unlock");
	cr_expect_eq(a.err, 0);
	cr_expect_lt(now_ms() - t0, 5000);
	/* Now the child holds it. */
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 100, 1), EAGAIN);

	/* Unlock of a range not held: success. */
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 5000, 10), 0);

	/* The child drops everything: no key left. */
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_UNLCK, 0, 0, NULL), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0, "keys vanish after unlock");

	/* Read locks share; an upgrade conflicts with the other reader. */
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_RDLCK, 0, 0, NULL), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_RDLCK, 0, 0), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 10, 1), EAGAIN);
	fl = getlk(fd, F_GETLK, F_RDLCK, 0, 0);
	cr_expect_eq(fl.l_type, F_UNLCK, "readers do not block readers");
	cr_expect_eq(plock_keys(path), 2);
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_UNLCK, 0, 0, NULL), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 10, 1), 0, "upgrade once alone");
	/* Split by a partial unlock, then everything. */
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 0, 5), 0);
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_GETLK, F_WRLCK, 0, 0, &fl), 0);
	cr_expect_eq(fl.l_type, F_RDLCK);
	cr_expect_eq(fl.l_start, 5);
	cr_expect_eq(fl.l_len, 5);
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 0, 0), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0);

	/* Every change was one transaction of the "plock" origin; unlocking
	 * what is not held and the EAGAINs of a local conflict cost none. */
	cr_expect_geq(efs_test_fs_metric(&fs, "etcfs_etcd_txns_total{origin=\"plock\","
					      "outcome=\"ok\"}"),
		      11);
	cr_expect_geq(efs_test_fs_metric(&fs, "etcfs_fuse_ops_total{op=\"getlk\"}"), 5);

	remote_stop(&r);
	close_f(fd);
	/* A clean unmount: the daemon exits 0 (no sanitizer report). */
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(plock, setlkw_is_interruptible)
{
	char path[512];
	struct remote r;
	struct answer a;
	int fd;

	start_fs(path, sizeof(path), false);
	remote_start(&r, path);
	fd = open_f(path);
	cr_assert_eq(lk(fd, F_SETLK, F_WRLCK, 0, 0), 0);
	remote_send(&r, CMD_FCNTL, F_SETLKW, F_RDLCK, 10, 10);
	cr_expect_not(remote_answer(&r, 500, &a), "F_SETLKW returned while the range is held");
	cr_assert_eq(kill(r.pid, SIGUSR1), 0);
	cr_assert(remote_answer(&r, 10000, &a), "F_SETLKW not interrupted by a signal");
	cr_expect_eq(a.err, EINTR, "got %s", strerror(a.err));
	cr_expect_eq(plock_keys(path), 1, "the interrupted waiter holds nothing");
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 0, 0), 0);
	/* The child can lock now (the daemon forgot the waiter). */
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_RDLCK, 10, 10, NULL), 0);
	cr_expect_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_UNLCK, 0, 0, NULL), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0);
	remote_stop(&r);
	close_f(fd);
	/* A clean unmount: the daemon exits 0 (no sanitizer report). */
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(plock, ofd_locks_between_descriptions)
{
	char path[512];
	struct flock fl;
	int fd1, fd2;

	start_fs(path, sizeof(path), false);
	fd1 = open_f(path);
	fd2 = open_f(path);
	cr_expect_eq(lk(fd1, F_OFD_SETLK, F_WRLCK, 0, 10), 0);
	cr_expect_eq(lk(fd2, F_OFD_SETLK, F_WRLCK, 5, 10), EAGAIN);
	cr_expect_eq(lk(fd2, F_OFD_SETLK, F_RDLCK, 9, 1), EAGAIN);
	cr_expect_eq(lk(fd2, F_OFD_SETLK, F_WRLCK, 10, 10), 0);
	fl = getlk(fd2, F_OFD_GETLK, F_WRLCK, 0, 0);
	cr_expect_eq(fl.l_type, F_WRLCK);
	cr_expect_eq(fl.l_start, 0);
	cr_expect_eq(fl.l_len, 10);
	/* A classic lock of this process conflicts with both descriptions. */
	cr_expect_eq(lk(fd1, F_SETLK, F_RDLCK, 0, 1), EAGAIN);
	cr_expect_eq(plock_keys(path), 2);
	/* The same description replaces its own lock. */
	cr_expect_eq(lk(fd1, F_OFD_SETLK, F_RDLCK, 0, 10), 0);
	cr_expect_eq(lk(fd2, F_OFD_SETLK, F_RDLCK, 0, 10), 0);
	cr_expect_eq(lk(fd1, F_OFD_SETLK, F_UNLCK, 0, 0), 0);
	cr_expect_eq(lk(fd2, F_OFD_SETLK, F_UNLCK, 0, 0), 0);
	cr_expect_eq(lk(fd1, F_SETLK, F_WRLCK, 0, 0), 0);
	cr_expect_eq(lk(fd1, F_SETLK, F_UNLCK, 0, 0), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0);
	close_f(fd1);
	close_f(fd2);
	/* A clean unmount: the daemon exits 0 (no sanitizer report). */
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

Test(plock, flock_modes)
{
	char path[512];
	struct remote r;
	struct answer a;
	int fd;

	start_fs(path, sizeof(path), false);
	remote_start(&r, path);
	fd = open_f(path);

	cr_assert_eq(remote_do(&r, CMD_FLOCK, LOCK_EX, 0, 0, 0, NULL), 0);
	cr_expect_eq(flock(fd, LOCK_EX | LOCK_NB) < 0 ? errno : 0, EWOULDBLOCK);
	cr_expect_eq(flock(fd, LOCK_SH | LOCK_NB) < 0 ? errno : 0, EWOULDBLOCK);
	/* flock and fcntl locks do not interact. */
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 0, 0), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 0, 0), 0);
	cr_expect_eq(plock_keys(path), 1);
	cr_expect_eq(remote_do(&r, CMD_FLOCK, LOCK_UN, 0, 0, 0, NULL), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0);

	/* Shared locks share; exclusive waits for both. */
	cr_expect_eq(flock(fd, LOCK_SH | LOCK_NB), 0);
	cr_expect_eq(remote_do(&r, CMD_FLOCK, LOCK_SH | LOCK_NB, 0, 0, 0, NULL), 0);
	cr_expect_eq(remote_do(&r, CMD_FLOCK, LOCK_EX | LOCK_NB, 0, 0, 0, NULL), EWOULDBLOCK);
	cr_expect_eq(plock_keys(path), 2);
	/* A blocking LOCK_EX waits until the parent unlocks. */
	remote_send(&r, CMD_FLOCK, LOCK_EX, 0, 0, 0);
	cr_expect_not(remote_answer(&r, 700, &a), "LOCK_EX returned while shared by another");
	cr_expect_eq(flock(fd, LOCK_UN), 0);
	cr_assert(remote_answer(&r, 10000, &a), "LOCK_EX still waits after the unlock");
	cr_expect_eq(a.err, 0);
	cr_expect_eq(flock(fd, LOCK_SH | LOCK_NB) < 0 ? errno : 0, EWOULDBLOCK);
	cr_expect_eq(remote_do(&r, CMD_FLOCK, LOCK_UN, 0, 0, 0, NULL), 0);
	cr_expect_eq(flock(fd, LOCK_EX | LOCK_NB), 0);
	cr_expect_eq(flock(fd, LOCK_UN), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0);

	remote_stop(&r);
	close_f(fd);
	/* A clean unmount: the daemon exits 0 (no sanitizer report). */
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}

/* Needs the FLUSH and RELEASE hooks (efs_fs_plock_flush/_release) called
 * by the data path's flush and release. */
Test(plock, close_drops_locks)
{
	char path[512];
	struct remote r;
	int fd;

	start_fs(path, sizeof(path), false);
	remote_start(&r, path);
	fd = open_f(path);

	/* fcntl: closing the descriptor drops the process's locks (FLUSH). */
	cr_assert_eq(remote_do(&r, CMD_FCNTL, F_SETLK, F_WRLCK, 0, 0, NULL), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 0, 1), EAGAIN);
	cr_assert_eq(remote_do(&r, CMD_CLOSE, 0, 0, 0, 0, NULL), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 0, 1), 0, "fcntl lock kept after close");
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 0, 0), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0, "key kept after close");

	/* flock: the last close of the description drops it (RELEASE). */
	cr_assert_eq(remote_do(&r, CMD_OPEN, 0, 0, 0, 0, NULL), 0);
	cr_assert_eq(remote_do(&r, CMD_FLOCK, LOCK_EX, 0, 0, 0, NULL), 0);
	cr_expect_eq(flock(fd, LOCK_EX | LOCK_NB) < 0 ? errno : 0, EWOULDBLOCK);
	cr_assert_eq(remote_do(&r, CMD_CLOSE, 0, 0, 0, 0, NULL), 0);
	/* RELEASE is asynchronous to close(2): allow it a moment. */
	{
		int got = EWOULDBLOCK;

		for (int i = 0; i < 50 && got != 0; i++) {
			got = flock(fd, LOCK_EX | LOCK_NB) < 0 ? errno : 0;
			if (got)
				sleep_ms(100);
		}
		cr_expect_eq(got, 0, "flock lock kept after close");
	}
	cr_expect_eq(flock(fd, LOCK_UN), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0, "flock key kept after close");

	/* OFD: the last close of the description drops it (RELEASE). */
	cr_assert_eq(remote_do(&r, CMD_OPEN, 0, 0, 0, 0, NULL), 0);
	cr_assert_eq(remote_do(&r, CMD_FCNTL, F_OFD_SETLK, F_WRLCK, 0, 0, NULL), 0);
	cr_expect_eq(lk(fd, F_SETLK, F_WRLCK, 0, 1), EAGAIN);
	cr_assert_eq(remote_do(&r, CMD_CLOSE, 0, 0, 0, 0, NULL), 0);
	cr_expect_eq(plock_keys_wait(path, 0), 0, "OFD key kept after close");
	{
		/* RELEASE again: the daemon may see the commit a moment after
		 * etcd shows it. */
		int got = EAGAIN;

		for (int i = 0; i < 50 && got != 0; i++) {
			got = lk(fd, F_SETLK, F_WRLCK, 0, 1);
			if (got)
				sleep_ms(100);
		}
		cr_expect_eq(got, 0, "OFD lock kept after close");
	}
	cr_expect_eq(lk(fd, F_SETLK, F_UNLCK, 0, 0), 0);

	remote_stop(&r);
	close_f(fd);
	/* A clean unmount: the daemon exits 0 (no sanitizer report). */
	efs_test_fs_unmount(&fs);
	efs_test_fs_stop(&fs);
	efs_test_assert_no_leaks();
}
