/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A node cut off from etcd while it lives (partition.h).
 *
 * Node 2's file operations run in "agents": children of the test that
 * hold node 2's descriptors across the cut and run one system call per
 * command, answering with its result and its start and end times
 * (CLOCK_MONOTONIC, one clock for every process). The test process itself
 * holds no descriptor of node 2 across the cut: it runs ip and fsck, and
 * an exec closes every inherited descriptor, which sends node 2 a FUSE
 * flush that could wait for etcd. An agent never execs.
 *
 * The promises are checked in order, but a broken one is noted and the
 * check goes on to the rejoin, so that one run reports every promise
 * broken and every time measured; the check fails at its end with all of
 * them. A failure of the machinery (a cut that never suspends the node,
 * an agent that does not answer) fails it at once.
 */
#include "partition.h"
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether liveness bounds are asserted (not under the sanitizers). */
#if defined(__SANITIZE_ADDRESS__)
#define TIMING 0
#else
#define TIMING 1
#endif

#define NODE		1 /* node 2: cut off */
#define PEER		0 /* node 1: changes the file meanwhile */
#define QUORUM_S	3 /* node 2's --quorum-timeout */
#define QUORUM_ARG	"3"
#define SMALL		4096
#define BIG		65536
#define AGENT_WAIT_MS	30000
#define SUSPEND_WAIT_MS 15000
#define SERVE_WAIT_MS	30000
#define OLD		'o' /* f before the cut, cached by node 2 */
#define NEW		'n' /* f as node 1 writes it during the cut */
#define BASE		'b' /* cow's durable bytes */
#define LATE		'L' /* what node 2 writes after the cut */

#define STATE(s) "etcfs_session_state{state=\"" s "\"}"

enum op {
	OP_OPEN,
	OP_PREAD,
	OP_PWRITE,
	OP_FSYNC,
	OP_CLOSE,
	OP_FALLOCATE,
	OP_CREATE,
	OP_READ_PATH,
	OP_MAP,	     /* maps the slot's first |len| bytes shared and reads them */
	OP_MAP_READ, /* reads the mapping: RET_SIGBUS when the kernel cannot */
};

/* A read of a mapping the kernel could not fill (SIGBUS). */
#define RET_SIGBUS (-2)

struct cmd {
	int op, slot, flags;
	char fill;
	long long off;
	size_t len;
	char path[512];
};

struct reply {
	long long ret;
	int err;
	uint64_t t0, t1;
};

struct agent {
	pid_t pid;
	int cmd_fd, rep_fd;
	const char *name;
};

static char fails[6000];

/* Notes a broken promise; the check fails with all of them at its end. */
static void broken(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void broken(const char *fmt, ...)
{
	size_t used = strlen(fails);
	va_list ap;

	if (used + 8 >= sizeof(fails))
		return;
	snprintf(fails + used, sizeof(fails) - used, "\n  - ");
	used = strlen(fails);
	va_start(ap, fmt);
	vsnprintf(fails + used, sizeof(fails) - used, fmt, ap);
	va_end(ap);
}

/* Writes (|wr|) or reads all |len| bytes; false at an error or the end. */
static bool io_full(int fd, void *buf, size_t len, bool wr)
{
	char *p = buf;

	while (len) {
		ssize_t n = wr ? write(fd, p, len) : read(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

static bool write_full(int fd, const void *buf, size_t len)
{
	return io_full(fd, (void *)buf, len, true);
}

static bool read_full(int fd, void *buf, size_t len)
{
	return io_full(fd, buf, len, false);
}

/* Up to |len| bytes at |off|: the count, or -1 with errno. */
static long long read_span(int fd, char *buf, size_t len, long long off)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, buf + got, len - got, (off_t)(off + (long long)got));

		if (n < 0)
			return -1;
		if (n == 0)
			break;
		got += (size_t)n;
	}
	return (long long)got;
}

static sigjmp_buf bus_jmp;

static void on_sigbus(int sig)
{
	(void)sig;
	siglongjmp(bus_jmp, 1);
}

/* Copies |len| bytes of mapping |map| into |buf|: |len|, or RET_SIGBUS. */
static long long map_copy(const char *map, char *buf, size_t len)
{
	if (sigsetjmp(bus_jmp, 1))
		return RET_SIGBUS;
	for (size_t k = 0; k < len; k++)
		buf[k] = ((const volatile char *)map)[k];
	return (long long)len;
}

static _Noreturn void agent_main(int cfd, int rfd)
{
	static char buf[BIG];
	struct sigaction sa = {.sa_handler = on_sigbus};
	int fds[4] = {-1, -1, -1, -1};
	char *map[4] = {NULL, NULL, NULL, NULL};
	size_t map_len[4] = {0};
	struct cmd m;

	sigaction(SIGBUS, &sa, NULL);

	while (read_full(cfd, &m, sizeof(m))) {
		struct reply r = {.t0 = efs_cl_now_ms()};
		long long n = -1;
		int fd, e;

		if (m.slot < 0 || m.slot >= 4 || m.len > BIG)
			_exit(2);
		errno = 0;
		switch (m.op) {
		case OP_OPEN:
			fd = open(m.path, m.flags | O_CLOEXEC, 0644);
			if (fd >= 0) {
				fds[m.slot] = fd;
				n = 0;
			}
			break;
		case OP_PREAD:
			n = read_span(fds[m.slot], buf, m.len, m.off);
			break;
		case OP_PWRITE:
			memset(buf, m.fill, m.len);
			n = pwrite(fds[m.slot], buf, m.len, (off_t)m.off);
			break;
		case OP_FSYNC:
			n = fsync(fds[m.slot]);
			break;
		case OP_CLOSE:
			if (map[m.slot])
				munmap(map[m.slot], map_len[m.slot]);
			map[m.slot] = NULL;
			n = close(fds[m.slot]);
			fds[m.slot] = -1;
			break;
		case OP_FALLOCATE:
			n = fallocate(fds[m.slot], 0, (off_t)m.off, (off_t)m.len);
			break;
		case OP_CREATE:
			fd = open(m.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
			if (fd >= 0)
				n = close(fd);
			break;
		case OP_READ_PATH:
			fd = open(m.path, O_RDONLY | O_CLOEXEC);
			if (fd >= 0) {
				n = read_span(fd, buf, m.len, 0);
				e = errno;
				close(fd);
				errno = e;
			}
			break;
		case OP_MAP:
			map[m.slot] = mmap(NULL, m.len, PROT_READ, MAP_SHARED, fds[m.slot], 0);
			if (map[m.slot] == MAP_FAILED) {
				map[m.slot] = NULL;
				break;
			}
			map_len[m.slot] = m.len;
			n = map_copy(map[m.slot], buf, m.len);
			break;
		case OP_MAP_READ:
			if (!map[m.slot])
				_exit(2);
			n = map_copy(map[m.slot], buf, map_len[m.slot]);
			break;
		default:
			_exit(2);
		}
		r.err = n == -1 ? errno : 0;
		r.ret = n;
		r.t1 = efs_cl_now_ms();
		if (!write_full(rfd, &r, sizeof(r)))
			_exit(1);
		if ((m.op == OP_PREAD || m.op == OP_READ_PATH || m.op == OP_MAP ||
		     m.op == OP_MAP_READ) &&
		    n > 0 && !write_full(rfd, buf, (size_t)n))
			_exit(1);
	}
	_exit(0);
}

static void agent_start(struct efs_cl *c, struct agent *a, const char *name)
{
	int cp[2], rp[2];

	CL_CHECK(pipe2(cp, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	CL_CHECK(pipe2(rp, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	fflush(stdout);
	a->pid = fork();
	CL_CHECK(a->pid >= 0, "fork: %s", strerror(errno));
	if (a->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		/* Only its own pipes: another agent's command pipe held open
		 * here would never see its end. */
		for (int fd = 3; fd < 4096; fd++)
			if (fd != cp[0] && fd != rp[1])
				close(fd);
		agent_main(cp[0], rp[1]);
	}
	efs_cl_spawned(c, a->pid);
	close(cp[0]);
	close(rp[1]);
	a->cmd_fd = cp[1];
	a->rep_fd = rp[0];
	a->name = name;
}

static void agent_send(struct agent *a, int op, int slot, const char *path, int flags,
		       long long off, size_t len, char fill)
{
	struct cmd m = {
	    .op = op, .slot = slot, .flags = flags, .fill = fill, .off = off, .len = len};

	if (path)
		snprintf(m.path, sizeof(m.path), "%s", path);
	CL_CHECK(write_full(a->cmd_fd, &m, sizeof(m)), "the %s agent is gone", a->name);
}

/* The answer to the oldest command still unanswered; its bytes read into
 * |data| (room for BIG) when it read any. */
static void agent_reply(struct agent *a, struct reply *r, char *data, const char *what)
{
	struct pollfd p = {.fd = a->rep_fd, .events = POLLIN};
	int pr;

	do
		pr = poll(&p, 1, AGENT_WAIT_MS);
	while (pr < 0 && errno == EINTR);
	CL_CHECK(pr == 1, "node2's %s agent did not answer %s within %d ms", a->name, what,
		 AGENT_WAIT_MS);
	CL_CHECK(read_full(a->rep_fd, r, sizeof(*r)), "node2's %s agent died during %s", a->name,
		 what);
	if (data && r->ret > 0) {
		CL_CHECK(r->ret <= BIG, "%s: %lld bytes", what, r->ret);
		CL_CHECK(read_full(a->rep_fd, data, (size_t)r->ret),
			 "node2's %s agent died during %s", a->name, what);
	}
}

static void agent_do(struct agent *a, struct reply *r, char *data, const char *what, int op,
		     int slot, const char *path, int flags, long long off, size_t len, char fill)
{
	agent_send(a, op, slot, path, flags, off, len, fill);
	agent_reply(a, r, data, what);
}

/* The same, failing the check unless the call returned |want|. */
static void agent_ok(struct agent *a, char *data, const char *what, long long want, int op,
		     int slot, const char *path, int flags, long long off, size_t len, char fill)
{
	struct reply r;

	agent_do(a, &r, data, what, op, slot, path, flags, off, len, fill);
	CL_CHECK(r.ret == want, "node2 %s: returned %lld (%s)", what, r.ret,
		 r.ret < 0 ? strerror(r.err) : "short");
}

static void agent_stop(struct efs_cl *c, struct agent *a)
{
	int st;

	close(a->cmd_fd);
	CL_CHECK(efs_tp_wait_pid(a->pid, &st, AGENT_WAIT_MS) == 1,
		 "node2's %s agent did not exit within %d ms of its last command", a->name,
		 AGENT_WAIT_MS);
	efs_cl_reaped(c, a->pid);
	close(a->rep_fd);
	CL_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "node2's %s agent exited with %d", a->name,
		 st);
}

/* What a read gave, in words: its error, or its bytes counted as |want|
 * (named |want_name|), |bad| (named |bad_name|) and others. */
static const char *what_read(long long n, int err, const char *buf, char want,
			     const char *want_name, char bad, const char *bad_name)
{
	static char out[4][240];
	static unsigned next;
	char *o = out[next++ % 4];
	long long w = 0, b = 0;

	if (n == RET_SIGBUS) {
		snprintf(o, sizeof(out[0]), "SIGBUS (the kernel could not fill the page)");
		return o;
	}
	if (n < 0) {
		snprintf(o, sizeof(out[0]), "error %s", strerror(err));
		return o;
	}
	for (long long k = 0; k < n; k++) {
		w += buf[k] == want;
		b += buf[k] == bad;
	}
	snprintf(o, sizeof(out[0]), "%lld bytes: %lld %s, %lld %s, %lld other", n, w, want_name, b,
		 bad_name, n - w - b);
	return o;
}

static bool all_of(const char *buf, long long n, long long len, char ch)
{
	if (n != len)
		return false;
	for (long long k = 0; k < n; k++)
		if (buf[k] != ch)
			return false;
	return true;
}

/* Writes |len| bytes |ch| over |path| from 0 and fsyncs it. */
static void write_synced(const char *path, char ch, size_t len, int flags)
{
	static char buf[BIG];
	int fd = open(path, O_WRONLY | O_CLOEXEC | flags, 0644);

	memset(buf, ch, len);
	CL_CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	CL_CHECK(pwrite(fd, buf, len, 0) == (ssize_t)len, "write %s: %s", path, strerror(errno));
	CL_CHECK(fsync(fd) == 0, "fsync %s: %s", path, strerror(errno));
	CL_CHECK(close(fd) == 0, "close %s: %s", path, strerror(errno));
}

/* Reads node |i|'s |path| (by this process: no descriptor stays open);
 * the count or -1 with *err. */
static long long read_path(const char *path, char *buf, size_t len, int *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	long long n;

	*err = 0;
	if (fd < 0) {
		*err = errno;
		return -1;
	}
	n = read_span(fd, buf, len, 0);
	if (n < 0)
		*err = errno;
	close(fd);
	return n;
}

/* Node |i| must read the late-write files as they were made durable before
 * the cut: "pre" all zeroes (preallocated, never written), "cow" all BASE. */
static void late_writes_invisible(struct efs_cl *c, int i, const char *dir, const char *when)
{
	static char buf[BIG];
	long long n;
	int err;

	n = read_path(efs_cl_dpath(c, i, dir, "pre"), buf, BIG, &err);
	if (!all_of(buf, n, BIG, '\0'))
		broken("node%d reads the preallocated file %s as %s (want %d zero bytes)", i + 1,
		       when, what_read(n, err, buf, '\0', "zero", LATE, "of node2's late write"),
		       BIG);
	n = read_path(efs_cl_dpath(c, i, dir, "cow"), buf, BIG, &err);
	if (!all_of(buf, n, BIG, BASE))
		broken("node%d reads the written file %s as %s (want %d bytes '%c')", i + 1, when,
		       what_read(n, err, buf, BASE, "durable", LATE, "of node2's late write"), BIG,
		       BASE);
}

static const char *outcome(const struct reply *r)
{
	static char out[4][64];
	static unsigned next;
	char *o = out[next++ % 4];

	if (r->ret == RET_SIGBUS)
		snprintf(o, sizeof(out[0]), "SIGBUS");
	else if (r->ret < 0)
		snprintf(o, sizeof(out[0]), "%s", strerror(r->err));
	else
		snprintf(o, sizeof(out[0]), "returned %lld", r->ret);
	return o;
}

void efs_part_cut_off_node(struct efs_cl *c, const char *dir)
{
	static const char *const short_quorum[] = {"--quorum-timeout", QUORUM_ARG, NULL};
	static char buf[BIG];
	const uint64_t ttl_ms = (uint64_t)c->opts.session_ttl * 1000;
	struct agent a = {0}, b = {0}, w = {0};
	struct reply r, late_pre, late_cow, create, waited;
	uint64_t t_cut, t_susp, t_eio, t_change, t_restore, t_serving;
	double gen0, gen1, st;
	long long n;
	int fd = -1, err = 0;

	fails[0] = '\0';
	CL_CHECK(c->node[NODE].veth_made, "node2 has no network namespace (opts.netns)");
	efs_cl_setargs(c, NODE, short_quorum);
	efs_cl_unmount(c, NODE);
	efs_cl_mount(c, NODE);

	/* f: node 1 writes it, node 2 reads it (its pages cached, its lock
	 * held shared) through a descriptor it keeps. pre: preallocated by
	 * node 2, durable as zeroes; cow: written by node 2, durable. Both
	 * stay open on node 2 for its late writes. */
	write_synced(efs_cl_dpath(c, PEER, dir, "f"), OLD, SMALL, O_CREAT | O_TRUNC);
	agent_start(c, &a, "holder");
	agent_start(c, &b, "prober");
	agent_start(c, &w, "waiter");
	agent_ok(&a, NULL, "opens f", 0, OP_OPEN, 0, efs_cl_dpath(c, NODE, dir, "f"), O_RDONLY, 0,
		 0, 0);
	agent_do(&a, &r, buf, "reads f", OP_PREAD, 0, NULL, 0, 0, SMALL, 0);
	CL_CHECK(all_of(buf, r.ret, SMALL, OLD), "node2 reads f before the cut as %s",
		 what_read(r.ret, r.err, buf, OLD, "written", NEW, "new"));
	/* A mapping too: its pages are read without asking the daemon (no
	 * attribute check), so only the daemon dropping them keeps them from
	 * going stale. */
	agent_ok(&a, NULL, "opens f for a mapping", 0, OP_OPEN, 3, efs_cl_dpath(c, NODE, dir, "f"),
		 O_RDONLY, 0, 0, 0);
	agent_do(&a, &r, buf, "maps f", OP_MAP, 3, NULL, 0, 0, SMALL, 0);
	CL_CHECK(all_of(buf, r.ret, SMALL, OLD),
		 "node2 reads its mapping of f before the cut as %s",
		 what_read(r.ret, r.err, buf, OLD, "written", NEW, "new"));
	agent_ok(&a, NULL, "creates pre", 0, OP_OPEN, 1, efs_cl_dpath(c, NODE, dir, "pre"),
		 O_RDWR | O_CREAT, 0, 0, 0);
	agent_ok(&a, NULL, "preallocates pre", 0, OP_FALLOCATE, 1, NULL, 0, 0, BIG, 0);
	agent_ok(&a, NULL, "fsyncs pre", 0, OP_FSYNC, 1, NULL, 0, 0, 0, 0);
	agent_ok(&a, NULL, "creates cow", 0, OP_OPEN, 2, efs_cl_dpath(c, NODE, dir, "cow"),
		 O_RDWR | O_CREAT, 0, 0, 0);
	agent_ok(&a, NULL, "writes cow", BIG, OP_PWRITE, 2, NULL, 0, 0, BIG, BASE);
	agent_ok(&a, NULL, "fsyncs cow", 0, OP_FSYNC, 2, NULL, 0, 0, 0, 0);
	st = efs_cl_metric(c, NODE, STATE("active"));
	CL_CHECK(st == 1, "node2's session is not active before the cut (%s = %g)", STATE("active"),
		 st);
	gen0 = efs_cl_metric(c, NODE, "etcfs_session_generation");

	/* The cut. At once: node 2 writes over both files (device writes
	 * after the cut: nothing may ever show them) and creates a name (it
	 * needs etcd: EIO once the quorum bound has passed). */
	efs_cl_cut(c, NODE);
	t_cut = efs_cl_now_ms();
	agent_send(&a, OP_PWRITE, 1, NULL, 0, 0, BIG, LATE);
	agent_send(&a, OP_PWRITE, 2, NULL, 0, 0, BIG, LATE);
	agent_send(&b, OP_CREATE, 0, efs_cl_dpath(c, NODE, dir, "made-while-cut"), 0, 0, 0, 0);

	while ((st = efs_cl_metric(c, NODE, STATE("suspended"))) != 1 &&
	       efs_cl_now_ms() - t_cut < SUSPEND_WAIT_MS)
		efs_cl_sleep_ms(20);
	t_susp = efs_cl_now_ms() - t_cut;
	CL_CHECK(st == 1,
		 "node2 did not report its session suspended within %d ms of the cut "
		 "(%s = %g, %s = %g)",
		 SUSPEND_WAIT_MS, STATE("suspended"), st, STATE("active"),
		 efs_cl_metric(c, NODE, STATE("active")));
	printf("# cut->suspended %llu ms\n", (unsigned long long)t_susp);
	if (TIMING && t_susp > ttl_ms + 2000)
		broken("node2 suspended %llu ms after the cut (bound: the TTL %llu ms + 2 s)",
		       (unsigned long long)t_susp, (unsigned long long)ttl_ms);

	/* An operation that arrives while suspended waits at most the quorum
	 * bound. */
	agent_send(&w, OP_CREATE, 0, efs_cl_dpath(c, NODE, dir, "made-while-suspended"), 0, 0, 0,
		   0);

	/* Node 1 changes f: it gets the lock once node 2's lease is gone. */
	t_change = efs_cl_now_ms();
	write_synced(efs_cl_dpath(c, PEER, dir, "f"), NEW, SMALL, 0);
	printf("# node1's change of f took %llu ms (from %llu ms after the cut)\n",
	       (unsigned long long)(efs_cl_now_ms() - t_change),
	       (unsigned long long)(t_change - t_cut));

	agent_reply(&b, &create, NULL, "the create during the cut");
	t_eio = create.t1 - t_cut;
	printf("# cut->EIO %llu ms (the create: %s, --quorum-timeout %d s)\n",
	       (unsigned long long)t_eio, outcome(&create), QUORUM_S);
	if (create.ret >= 0 || create.err != EIO)
		broken("node2's create during the cut: %s (want EIO)", outcome(&create));
	else if (TIMING && t_eio > ttl_ms + QUORUM_S * 1000 + 4000)
		broken("node2's create failed %llu ms after the cut (bound: TTL + quorum timeout "
		       "+ 4 s)",
		       (unsigned long long)t_eio);
	agent_reply(&w, &waited, NULL, "the create while suspended");
	printf("# suspended->EIO %llu ms (a create sent once suspended: %s)\n",
	       (unsigned long long)(waited.t1 - waited.t0), outcome(&waited));
	if (waited.ret >= 0 || waited.err != EIO)
		broken("node2's create while suspended: %s (want EIO)", outcome(&waited));
	else if (TIMING && waited.t1 - waited.t0 > QUORUM_S * 1000 + 2000)
		broken("node2's create sent while suspended failed after %llu ms (bound: the "
		       "quorum timeout + 2 s)",
		       (unsigned long long)(waited.t1 - waited.t0));
	agent_reply(&a, &late_pre, NULL, "the late write into pre");
	agent_reply(&a, &late_cow, NULL, "the late write into cow");
	printf("# late writes after the cut: pre %s at %llu ms, cow %s at %llu ms\n",
	       outcome(&late_pre), (unsigned long long)(late_pre.t1 - t_cut), outcome(&late_cow),
	       (unsigned long long)(late_cow.t1 - t_cut));
	/* Node 1 now holds what node 2 wrote late: none of it shows. */
	late_writes_invisible(c, PEER, dir, "during the cut");

	/* Node 2 serves no stale data: neither through the descriptor it
	 * had read f with (its pages cached) nor by a new open. */
	agent_do(&a, &r, buf, "reads f again", OP_PREAD, 0, NULL, 0, 0, SMALL, 0);
	if (r.ret >= 0 || r.err != EIO)
		broken(
		    "node2, cut off, reads f through the descriptor it had read it with, after "
		    "node1 changed it: %s (want EIO)",
		    what_read(r.ret, r.err, buf, NEW, "new", OLD, "stale (from before the cut)"));
	agent_do(&a, &r, buf, "reads its mapping of f", OP_MAP_READ, 3, NULL, 0, 0, 0, 0);
	if (r.ret != RET_SIGBUS)
		broken(
		    "node2, cut off, reads its mapping of f after node1 changed it: %s (want "
		    "SIGBUS: the pages dropped, and the daemon cannot read them again)",
		    what_read(r.ret, r.err, buf, NEW, "new", OLD, "stale (from before the cut)"));
	agent_do(&b, &r, buf, "opens and reads f", OP_READ_PATH, 0, efs_cl_dpath(c, NODE, dir, "f"),
		 0, 0, SMALL, 0);
	if (r.ret >= 0 || r.err != EIO)
		broken(
		    "node2, cut off, opens and reads f after node1 changed it: %s (want EIO)",
		    what_read(r.ret, r.err, buf, NEW, "new", OLD, "stale (from before the cut)"));
	/* A late write the device took cannot be made durable: its lease is
	 * gone, so nothing can publish it. */
	if (late_pre.ret == BIG) {
		agent_do(&a, &r, NULL, "fsyncs pre", OP_FSYNC, 1, NULL, 0, 0, 0, 0);
		if (r.ret >= 0 || r.err != EIO)
			broken("node2's fsync of its late write into pre: %s (want EIO)",
			       outcome(&r));
	}
	if (late_cow.ret == BIG) {
		agent_do(&a, &r, NULL, "fsyncs cow", OP_FSYNC, 2, NULL, 0, 0, 0, 0);
		if (r.ret >= 0 || r.err != EIO)
			broken("node2's fsync of its late write into cow: %s (want EIO)",
			       outcome(&r));
	}

	/* The link returns: node 2 serves again. */
	efs_cl_restore(c, NODE);
	t_restore = efs_cl_now_ms();
	for (int k = 0;; k++) {
		char name[32];

		snprintf(name, sizeof(name), "back%d", k);
		fd = open(efs_cl_dpath(c, NODE, dir, name), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
			  0644);
		err = errno;
		if (fd >= 0 || efs_cl_now_ms() - t_restore >= SERVE_WAIT_MS)
			break;
		efs_cl_sleep_ms(50);
	}
	CL_CHECK(fd >= 0, "node2 did not serve a create within %d ms of the restore (last: %s)",
		 SERVE_WAIT_MS, strerror(err));
	close(fd);
	t_serving = efs_cl_now_ms() - t_restore;
	gen1 = efs_cl_metric(c, NODE, "etcfs_session_generation");
	printf("# restore->serving %llu ms (session generation %.0f -> %.0f)\n",
	       (unsigned long long)t_serving, gen0, gen1);
	st = efs_cl_metric(c, NODE, STATE("active"));
	if (st != 1)
		broken("node2 serves again but its session is not active (%s = %g)",
		       STATE("active"), st);

	/* Node 1's bytes, never the stale ones. */
	n = read_path(efs_cl_dpath(c, NODE, dir, "f"), buf, SMALL, &err);
	if (!all_of(buf, n, SMALL, NEW))
		broken("node2 reads f after the rejoin as %s (want node1's %d bytes)",
		       what_read(n, err, buf, NEW, "new", OLD, "stale"), SMALL);
	agent_do(&a, &r, buf, "reads f through its old descriptor", OP_PREAD, 0, NULL, 0, 0, SMALL,
		 0);
	if (!all_of(buf, r.ret, SMALL, NEW) && !(r.ret < 0 && r.err == EIO))
		broken("node2 reads f through its descriptor from before the cut, after the "
		       "rejoin, as %s (want node1's bytes or EIO)",
		       what_read(r.ret, r.err, buf, NEW, "new", OLD, "stale"));

	agent_do(&a, &r, buf, "reads its mapping of f", OP_MAP_READ, 3, NULL, 0, 0, 0, 0);
	if (!all_of(buf, r.ret, SMALL, NEW) && r.ret != RET_SIGBUS)
		broken("node2 reads its mapping of f from before the cut, after the rejoin, as %s "
		       "(want node1's bytes or SIGBUS)",
		       what_read(r.ret, r.err, buf, NEW, "new", OLD, "stale"));

	/* Its late writes: node 2 closes what it wrote them through (a close
	 * is the last chance to publish them), then no node sees them. */
	for (int slot = 0; slot < 4; slot++)
		agent_do(&a, &r, NULL, "closes", OP_CLOSE, slot, NULL, 0, 0, 0, 0);
	agent_stop(c, &a);
	agent_stop(c, &b);
	agent_stop(c, &w);
	late_writes_invisible(c, NODE, dir, "after the rejoin");
	late_writes_invisible(c, PEER, dir, "after the rejoin");

	/* Node 2 as the suite mounts it; a fresh mount reads the device. */
	efs_cl_setargs(c, NODE, NULL);
	efs_cl_unmount(c, NODE);
	efs_cl_mount(c, NODE);
	late_writes_invisible(c, NODE, dir, "mounted again");
	CL_CHECK(!fails[0], "promises broken:%s", fails);
}
