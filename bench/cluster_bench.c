/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cluster's own mechanisms, in absolute time (they have no baseline):
 * three etcfsd nodes on one sparse image file in /tmp over a three-member etcd
 * (the cluster test fixture, session TTL 2 s, the default).
 *
 *  - handover: node A writes a file (A holds it exclusively), then node B
 *    stats it (A's lock is recalled and downgraded: A publishes first),
 *    then A writes again (B's shared lock is recalled). Each is the
 *    latency of the whole operation as the application sees it, recall
 *    included; idle, and with a writer loading A (64 KiB writes to another
 *    file, fsync every 16).
 *  - takeover: A holds a file exclusively (open, written, fsynced) and is
 *    killed with SIGKILL; the time until B's open + write + fsync of that
 *    file returns, and node C's worst gap between two of its own writes
 *    meanwhile.
 *
 *  - nodekill: the same kill while all three nodes write durably and A
 *    has an unlinked file open: B's takeover, the survivors' worst gap,
 *    and the time until the orphan's space is free (after --dead-grace,
 *    5 s unless --daemon-arg gives it).
 *  - space: A fills the device while B and C own groups they barely use;
 *    A's hand-over waits (etcfs_space_handover_wait_seconds).
 *
 *  - partition: node B cut off from etcd (its veth down) with
 *    --quorum-timeout 3: cut to suspension, cut to EIO, restore to
 *    serving. It puts every node in a network namespace of its own.
 *
 *  - local metadata: on node A alone, repeated stat of one file and
 *    listing passes (readdir + stat of each of 200 files), which the
 *    kernel serves from its caches while the cache timeout allows.
 *
 * Prints medians and p99 (nearest rank) and the raw takeover runs; for
 * the handovers also the recall waits each waiting node measured itself
 * (etcfs_lock_recall_wait_seconds: from the creation of its recall key to
 * its grant), as bucket bounds of that histogram.
 * Usage: cluster_bench [--rounds N] [--takeovers N] [--cache-timeout MS]
 * (--cache-timeout is passed to every etcfsd: the kernel cache timeout
 * under a held lock, whose cost and benefit this shows).
 */
#include "cluster.h"
#include "harness.h"
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct efs_cl cl;
static const char *dead_grace = "5"; /* etcfsd --dead-grace of the run */

static const char *P(int node, const char *rel)
{
	static char buf[8][512];
	static int k;

	k = (k + 1) % 8;
	return efs_cl_path(&cl, node, rel, buf[k], sizeof(buf[k]));
}

static void die(const char *what, const char *path)
{
	fprintf(stderr, "cluster_bench: %s %s: %s\n", what, path, strerror(errno));
	efs_cl_stop(&cl);
	exit(1);
}

static void put(const char *path, const char *data)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0 || write(fd, data, strlen(data)) != (ssize_t)strlen(data))
		die("write", path);
	close(fd);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *v, size_t n)
{
	size_t p99 = (n * 99 + 99) / 100;

	qsort(v, n, sizeof(*v), cmp_u64);
	printf("%-52s median %7.2f ms   p99 %7.2f ms   (n=%zu, max %.2f ms)\n", what,
	       (double)v[n / 2] / 1000, (double)v[(p99 ? p99 : 1) - 1] / 1000, n,
	       (double)v[n - 1] / 1000);
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

/* A writer on node |node| until killed. */
static pid_t start_load(int node)
{
	pid_t pid = fork();

	if (pid == 0) {
		static char buf[65536];
		int fd = open(P(node, "load"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);

		memset(buf, 'l', sizeof(buf));
		for (unsigned k = 0; fd >= 0; k++) {
			if (pwrite(fd, buf, sizeof(buf), (off_t)(k % 256) * sizeof(buf)) < 0)
				_exit(1);
			if (k % 16 == 15)
				fsync(fd);
		}
		_exit(1);
	}
	return pid;
}

static void stop_load(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
}

/*
 * The waiter's own measure of its recall waits: node |i|'s histogram
 * etcfs_lock_recall_wait_seconds (from its recall key's creation to the
 * grant), as cumulative bucket counts under the bounds its le labels give.
 */
#define RW_BUCKETS 64
struct rwhist {
	double le[RW_BUCKETS]; /* seconds, ascending (+Inf last) */
	double cum[RW_BUCKETS];
	int n;
	double count, sum;
};

/* Node |i|'s histogram |name| (unlabelled). */
static void hist_read(int i, const char *name, struct rwhist *h)
{
	char bucket[128], count[128], sum[128];
	char *text = efs_cl_metrics_text(&cl, i), *p;
	size_t bl, cl_, sl;

	bl = (size_t)snprintf(bucket, sizeof(bucket), "%s_bucket{le=\"", name);
	cl_ = (size_t)snprintf(count, sizeof(count), "%s_count ", name);
	sl = (size_t)snprintf(sum, sizeof(sum), "%s_sum ", name);
	memset(h, 0, sizeof(*h));
	h->count = h->sum = -1;
	for (p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		char *q;

		if (strncmp(p, bucket, bl) == 0 && h->n < RW_BUCKETS) {
			p += bl;
			h->le[h->n] = strncmp(p, "+Inf", 4) == 0 ? INFINITY : strtod(p, NULL);
			q = strstr(p, "} ");
			h->cum[h->n++] = q ? strtod(q + 2, NULL) : 0;
		} else if (strncmp(p, count, cl_) == 0) {
			h->count = strtod(p + cl_, NULL);
		} else if (strncmp(p, sum, sl) == 0) {
			h->sum = strtod(p + sl, NULL);
		}
	}
	free(text);
}

static void rw_read(int i, struct rwhist *h)
{
	hist_read(i, "etcfs_lock_recall_wait_seconds", h);
}

/* The bucket bound (ms) at or below which rank q of the waits between
 * |a| and |b| lies (both read from one node, so the same bounds). */
static double rw_quantile(const struct rwhist *a, const struct rwhist *b, double q)
{
	double n = b->count - a->count, want = q * n;

	for (int k = 0; k < b->n && k < a->n; k++)
		if (b->cum[k] - a->cum[k] >= want)
			return b->le[k] * 1000;
	return INFINITY;
}

static void rw_report(const char *what, const struct rwhist *a, const struct rwhist *b)
{
	double n = b->count - a->count;

	if (a->count < 0 || b->count < 0) {
		printf("  %-50s (no /metrics)\n", what);
		return;
	}
	if (n <= 0) {
		printf("  %-50s none\n", what);
		return;
	}
	printf("  %-50s median <= %.0f ms   p99 <= %.0f ms   mean %.2f ms   (n=%.0f)\n", what,
	       rw_quantile(a, b, 0.5), rw_quantile(a, b, 0.99), (b->sum - a->sum) / n * 1000, n);
}

/* ---- The summary table ---- */

#define SUM_MAX 64
static struct {
	char what[72];
	char value[96];
} sum_row[SUM_MAX];
static int sum_n;

static void sum_add(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sum_add(const char *what, const char *fmt, ...)
{
	va_list ap;

	if (sum_n == SUM_MAX)
		return;
	snprintf(sum_row[sum_n].what, sizeof(sum_row[0].what), "%s", what);
	va_start(ap, fmt);
	vsnprintf(sum_row[sum_n].value, sizeof(sum_row[0].value), fmt, ap);
	va_end(ap);
	sum_n++;
}

static double median_ms(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return (double)v[n / 2] / 1000;
}

static double p99_ms(uint64_t *v, size_t n)
{
	size_t p99 = (n * 99 + 99) / 100;

	qsort(v, n, sizeof(*v), cmp_u64);
	return (double)v[(p99 ? p99 : 1) - 1] / 1000;
}

static void handover(int rounds, bool loaded)
{
	struct rwhist b0, b1, a0, a1;
	uint64_t *stat_us = calloc((size_t)rounds, sizeof(uint64_t));
	uint64_t *write_us = calloc((size_t)rounds, sizeof(uint64_t));
	pid_t load = loaded ? start_load(0) : 0;
	char name[64];
	struct stat st;

	if (!stat_us || !write_us)
		die("calloc", "");
	snprintf(name, sizeof(name), "h%d", loaded);
	put(P(0, name), "0");
	efs_cl_sleep_ms(200);
	rw_read(1, &b0);
	rw_read(0, &a0);
	for (int k = 0; k < rounds; k++) {
		char rec[32];
		uint64_t t0;

		snprintf(rec, sizeof(rec), "%d", k);
		efs_cl_sleep_ms(20);
		t0 = now_us();
		if (stat(P(1, name), &st) < 0)
			die("stat", P(1, name));
		stat_us[k] = now_us() - t0;
		efs_cl_sleep_ms(20);
		t0 = now_us();
		put(P(0, name), rec);
		write_us[k] = now_us() - t0;
	}
	if (load)
		stop_load(load);
	printf("handover, %s:\n", loaded ? "node A under a write load" : "idle");
	report("  stat on B of a file A holds exclusively", stat_us, (size_t)rounds);
	report("  rewrite on A of a file B holds shared", write_us, (size_t)rounds);
	sum_add(loaded ? "handover, A loaded: stat on B, median / p99" : "handover, idle: stat on B, median / p99",
		"%.2f / %.2f ms", median_ms(stat_us, (size_t)rounds), p99_ms(stat_us, (size_t)rounds));
	sum_add(loaded ? "handover, A loaded: rewrite on A, median / p99"
		       : "handover, idle: rewrite on A, median / p99",
		"%.2f / %.2f ms", median_ms(write_us, (size_t)rounds), p99_ms(write_us, (size_t)rounds));
	rw_read(1, &b1);
	rw_read(0, &a1);
	printf("  recall waits as the waiter measures them (its recall key's creation to its "
	       "grant; bucket bounds):\n");
	rw_report("    on B (for the stats)", &b0, &b1);
	rw_report("    on A (for the rewrites and the load)", &a0, &a1);
	free(stat_us);
	free(write_us);
}

/*
 * etcd's current revision (member 0's etcd_debugging_mvcc_current_revision):
 * every transaction that writes moves it by one, so its growth over a run
 * counts the commits of every node (an upper bound on those of the run
 * itself). -1 when it cannot be read.
 */
static double etcd_revision(void)
{
	const char *url = efs_harness_metrics_url(cl.etcd, 0);
	double v = -1;

	if (!url)
		return -1;
	if (!strncmp(url, "http://", 7))
		url += 7;
	if (efs_tp_metric(url, "etcd_debugging_mvcc_current_revision", &v) < 0)
		return -1;
	return v;
}

/* Node C's own writes every 10 ms; writes its worst gap (ms) to |out| when
 * SIGTERM arrives. */
static volatile sig_atomic_t stop_flag;

static void on_term(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static pid_t start_survivor(int pfd)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct sigaction sa = {.sa_handler = on_term};
		int fd = open(P(2, "own"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		uint64_t last = efs_cl_now_ms(), worst = 0;

		sigaction(SIGTERM, &sa, NULL);
		while (fd >= 0 && !stop_flag) {
			uint64_t now;

			if (pwrite(fd, "x", 1, 0) != 1)
				break;
			now = efs_cl_now_ms();
			if (now - last > worst)
				worst = now - last;
			last = now;
			efs_cl_sleep_ms(10);
		}
		if (write(pfd, &worst, sizeof(worst)) < 0)
			_exit(1);
		_exit(0);
	}
	return pid;
}

static void takeover(int runs)
{
	uint64_t *took = calloc((size_t)runs, sizeof(uint64_t));
	uint64_t *gap = calloc((size_t)runs, sizeof(uint64_t));

	if (!took || !gap)
		die("calloc", "");
	printf("takeover (kill -9 of A, session TTL %u s), runs:", cl.opts.session_ttl);
	for (int k = 0; k < runs; k++) {
		char name[32];
		int pfd[2], fd, st;
		uint64_t t0;
		pid_t surv;

		snprintf(name, sizeof(name), "t%d", k);
		fd = open(P(0, name), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0 || write(fd, "from A", 6) != 6 || fsync(fd) < 0)
			die("write", P(0, name));
		if (pipe(pfd) < 0)
			die("pipe", "");
		surv = start_survivor(pfd[1]);
		close(pfd[1]);
		efs_cl_sleep_ms(300);
		efs_cl_kill(&cl, 0);
		t0 = now_us();
		close(fd);
		fd = open(P(1, name), O_RDWR | O_CLOEXEC);
		if (fd < 0 || pwrite(fd, "from B", 6, 0) != 6 || fsync(fd) < 0)
			die("takeover write", P(1, name));
		took[k] = now_us() - t0;
		close(fd);
		kill(surv, SIGTERM);
		if (read(pfd[0], &gap[k], sizeof(gap[k])) != sizeof(gap[k]))
			gap[k] = 0;
		close(pfd[0]);
		waitpid(surv, &st, 0);
		gap[k] *= 1000;
		printf(" %.0f ms (gap %.0f ms)", (double)took[k] / 1000, (double)gap[k] / 1000);
		fflush(stdout);
		efs_cl_mount(&cl, 0);
	}
	printf("\n");
	report("  kill -9 to B's durable write of A's file", took, (size_t)runs);
	report("  node C's worst gap between its own writes", gap, (size_t)runs);
	sum_add("takeover: kill -9 to B's durable write, median / p99", "%.0f / %.0f ms (target 2500)",
		median_ms(took, (size_t)runs), p99_ms(took, (size_t)runs));
	sum_add("takeover: C's worst write gap, median / p99", "%.0f / %.0f ms (target 500)",
		median_ms(gap, (size_t)runs), p99_ms(gap, (size_t)runs));
	free(took);
	free(gap);
}

/*
 * A writer on node |node| (file |name|): 64 KiB writes cycling over 4 MiB,
 * each made durable (fdatasync). Its control pipe: 'r' restarts its
 * measure, 's' stops it; it then writes the worst gap (us) between two
 * acknowledged writes since the last restart (UINT64_MAX: a write failed)
 * and exits. No signals: one would interrupt a FUSE request (EINTR).
 */
struct gapw {
	pid_t pid;
	int ctl; /* write end */
	int res; /* read end */
};

static void start_gap_writer(struct gapw *g, int node, const char *name)
{
	int ctl[2], res[2];

	if (pipe(ctl) < 0 || pipe(res) < 0)
		die("pipe", "");
	g->pid = fork();
	if (g->pid < 0)
		die("fork", "");
	if (g->pid == 0) {
		static char buf[65536];
		int fd = open(P(node, name), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		uint64_t last = now_us(), worst = 0;
		bool failed = fd < 0;
		char c;

		close(ctl[1]);
		close(res[0]);
		fcntl(ctl[0], F_SETFL, O_NONBLOCK);
		memset(buf, 'g', sizeof(buf));
		for (unsigned k = 0;; k++) {
			uint64_t now;

			if (read(ctl[0], &c, 1) == 1) {
				if (c == 's')
					break;
				worst = 0;
				last = now_us();
			}
			if (failed) {
				efs_cl_sleep_ms(10);
				continue;
			}
			if (pwrite(fd, buf, sizeof(buf), (off_t)(k % 64) * sizeof(buf)) < 0 ||
			    fdatasync(fd) < 0) {
				failed = true;
				continue;
			}
			now = now_us();
			if (now - last > worst)
				worst = now - last;
			last = now;
		}
		if (failed)
			worst = UINT64_MAX;
		if (write(res[1], &worst, sizeof(worst)) < 0)
			_exit(1);
		_exit(0);
	}
	close(ctl[0]);
	close(res[1]);
	g->ctl = ctl[1];
	g->res = res[0];
}

static void gap_writer_restart(struct gapw *g)
{
	if (write(g->ctl, "r", 1) != 1)
		die("write", "control pipe");
}

static uint64_t stop_gap_writer(struct gapw *g)
{
	uint64_t worst = UINT64_MAX;
	int st;

	if (write(g->ctl, "s", 1) != 1)
		kill(g->pid, SIGKILL);
	if (read(g->res, &worst, sizeof(worst)) != sizeof(worst))
		worst = UINT64_MAX;
	close(g->ctl);
	close(g->res);
	waitpid(g->pid, &st, 0);
	return worst;
}

static unsigned long long free_bytes_on(int node)
{
	struct statvfs sv;

	if (statvfs(P(node, ""), &sv) < 0)
		die("statvfs", P(node, ""));
	return (unsigned long long)sv.f_bavail * sv.f_frsize;
}

/*
 * kill -9 of node A while all three nodes write (each its own file, 64 KiB
 * + fdatasync in a loop) and A also holds a file exclusively and has an
 * unlinked file of ORPHAN_MIB open: the time until B's open + write +
 * fsync of A's file returns, the survivors' (B's and C's) worst gap
 * between two acknowledged writes from the kill until then plus a second,
 * and the time until the orphan's space is free again (after the lease and
 * the dead-node grace, --dead-grace, 5 s here unless given).
 */
#define ORPHAN_MIB 64

static void nodekill(int runs)
{
	uint64_t *took = calloc((size_t)runs, sizeof(uint64_t));
	uint64_t *gap = calloc((size_t)runs, sizeof(uint64_t));
	uint64_t *back = calloc((size_t)runs, sizeof(uint64_t));

	if (!took || !gap || !back)
		die("calloc", "");
	printf("node kill under a write load on all nodes (session TTL %u s), runs:",
	       cl.opts.session_ttl);
	for (int k = 0; k < runs; k++) {
		static char mib[1 << 20];
		char name[32], oname[32];
		int fd, ofd;
		struct gapw w[3];
		unsigned long long base;
		uint64_t t0, g;

		for (int i = 0; i < 3; i++) {
			char wname[32];

			snprintf(wname, sizeof(wname), "w%d.%d", i, k);
			start_gap_writer(&w[i], i, wname);
		}
		efs_cl_sleep_ms(500);
		base = free_bytes_on(1);
		snprintf(name, sizeof(name), "k%d", k);
		snprintf(oname, sizeof(oname), "ko%d", k);
		fd = open(P(0, name), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0 || write(fd, "from A", 6) != 6 || fsync(fd) < 0)
			die("write", P(0, name));
		ofd = open(P(0, oname), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
		memset(mib, 'o', sizeof(mib));
		for (int m = 0; ofd >= 0 && m < ORPHAN_MIB; m++)
			if (write(ofd, mib, sizeof(mib)) != (ssize_t)sizeof(mib))
				die("write", P(0, oname));
		if (ofd < 0 || fsync(ofd) < 0 || unlink(P(0, oname)) < 0)
			die("orphan", P(0, oname));
		efs_cl_sleep_ms(300);
		/* The survivors' worst gap is over the takeover and a second
		 * after it: their measure restarts at the kill. */
		gap_writer_restart(&w[1]);
		gap_writer_restart(&w[2]);
		efs_cl_kill(&cl, 0);
		t0 = now_us();
		close(fd);
		close(ofd);
		stop_gap_writer(&w[0]);
		fd = open(P(1, name), O_RDWR | O_CLOEXEC);
		if (fd < 0 || pwrite(fd, "from B", 6, 0) != 6 || fsync(fd) < 0)
			die("takeover write", P(1, name));
		took[k] = now_us() - t0;
		close(fd);
		efs_cl_sleep_ms(1000);
		gap[k] = 0;
		for (int i = 1; i < 3; i++) {
			g = stop_gap_writer(&w[i]);
			if (g == UINT64_MAX)
				die("a survivor's writer failed", "");
			if (g > gap[k])
				gap[k] = g;
		}
		/* The orphan's space: back once the grace has passed. */
		while (free_bytes_on(1) + (ORPHAN_MIB / 4) * (1ull << 20) < base) {
			if (now_us() - t0 > 120ull * 1000000) {
				fprintf(stderr, "free on B %llu MiB, before the orphan %llu MiB\n",
					free_bytes_on(1) >> 20, base >> 20);
				die("the dead node's orphan was not reclaimed within 120 s", "");
			}
			efs_cl_sleep_ms(50);
		}
		back[k] = now_us() - t0;
		printf(" %.0f ms (gap %.0f ms, orphan back %.1f s)", (double)took[k] / 1000,
		       (double)gap[k] / 1000, (double)back[k] / 1e6);
		fflush(stdout);
		efs_cl_mount(&cl, 0);
	}
	printf("\n");
	report("  kill -9 to B's durable write of A's file", took, (size_t)runs);
	report("  survivors' worst gap between durable writes", gap, (size_t)runs);
	report("  kill -9 to the dead node's orphan space free", back, (size_t)runs);
	sum_add("node kill, all writing: B's durable write, median / p99", "%.0f / %.0f ms",
		median_ms(took, (size_t)runs), p99_ms(took, (size_t)runs));
	sum_add("node kill: survivors' worst write gap, median / p99", "%.0f / %.0f ms (target 500)",
		median_ms(gap, (size_t)runs), p99_ms(gap, (size_t)runs));
	sum_add("node kill: orphan space back, median / p99", "%.1f / %.1f s (grace %s s)",
		median_ms(back, (size_t)runs) / 1000, p99_ms(back, (size_t)runs) / 1000, dead_grace);
	free(took);
	free(gap);
	free(back);
}

/*
 * Space hand-over: B and C each write 1 MiB (each then owns a group with
 * free space it does not use); A fallocates 16 MiB files until ENOSPC. Its
 * etcfs_space_handover_wait_seconds histogram times each shortage from
 * the hand-over request to the first allocation it let through. The files
 * are removed afterwards.
 */
static void space_handover(void)
{
	struct rwhist h0, h1;
	double given0 = 0, given1 = 0;
	uint64_t t0 = now_us();
	int n = 0, err = 0;

	for (int i = 1; i < 3; i++) {
		char nm[32];

		snprintf(nm, sizeof(nm), "sp%d", i);
		put(P(i, nm), "spare");
	}
	for (int i = 1; i < 3; i++)
		given0 += efs_cl_metric(&cl, i, "etcfs_space_groups_given_total");
	hist_read(0, "etcfs_space_handover_wait_seconds", &h0);
	for (;; n++) {
		char nm[32];
		int fd;

		snprintf(nm, sizeof(nm), "fill%d", n);
		fd = open(P(0, nm), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			die("create", P(0, nm));
		if (fallocate(fd, 0, 0, 16 << 20) != 0)
			err = errno;
		close(fd);
		if (err)
			break;
	}
	hist_read(0, "etcfs_space_handover_wait_seconds", &h1);
	for (int i = 1; i < 3; i++)
		given1 += efs_cl_metric(&cl, i, "etcfs_space_groups_given_total");
	printf("space hand-over: A filled %d x 16 MiB in %.1f s until %s; B and C gave %.0f "
	       "groups\n",
	       n, (double)(now_us() - t0) / 1e6, strerror(err), given1 - given0);
	rw_report("  A's shortage to its first allocation in a handed-over group", &h0, &h1);
	if (h1.count - h0.count > 0)
		sum_add("space hand-over: shortage to allocation, median / mean",
			"<= %.0f / %.1f ms (n=%.0f)", rw_quantile(&h0, &h1, 0.5),
			(h1.sum - h0.sum) / (h1.count - h0.count) * 1000, h1.count - h0.count);
	else
		sum_add("space hand-over: shortage to allocation", "none measured");
	for (int k = 0; k <= n; k++) {
		char nm[32];

		snprintf(nm, sizeof(nm), "fill%d", k);
		unlink(P(0, nm));
	}
	unlink(P(1, "sp1"));
	unlink(P(2, "sp2"));
}

/*
 * A create of |rel| on node |node| in a child (the bench process holds no
 * descriptor of a node it cuts off): its errno (0: it worked), or
 * ETIMEDOUT when it did not answer within |ms| (the child is killed).
 */
static int create_in_child(int node, const char *rel, unsigned ms)
{
	uint64_t end = now_us() + (uint64_t)ms * 1000;
	pid_t pid = fork();
	int st;

	if (pid < 0)
		die("fork", "");
	if (pid == 0) {
		int fd = open(P(node, rel), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);

		_exit(fd < 0 ? (errno & 0x7f) : 0);
	}
	while (now_us() < end) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
		efs_cl_sleep_ms(5);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return ETIMEDOUT;
}

/*
 * Node B cut off from etcd (its veth down: packets lost silently) with
 * --quorum-timeout 3: from the cut to its session's suspension (its
 * /metrics, polled every 10 ms), to the EIO of a create sent at the
 * suspension, and from the restore to its first create that works (one
 * every 50 ms).
 */
#define PART_QUORUM "3"

static void partition(int runs)
{
	const char *const qargs[] = {"--quorum-timeout", PART_QUORUM, NULL};
	uint64_t *susp = calloc((size_t)runs, sizeof(uint64_t));
	uint64_t *eio = calloc((size_t)runs, sizeof(uint64_t));
	uint64_t *serve = calloc((size_t)runs, sizeof(uint64_t));

	if (!susp || !eio || !serve)
		die("calloc", "");
	efs_cl_setargs(&cl, 1, qargs);
	efs_cl_unmount(&cl, 1);
	efs_cl_mount(&cl, 1);
	printf("partition of node B (--quorum-timeout %s s, session TTL %u s), runs:", PART_QUORUM,
	       cl.opts.session_ttl);
	for (int k = 0; k < runs; k++) {
		char rel[32];
		uint64_t t0, t1;
		int err;

		snprintf(rel, sizeof(rel), "pb%d", k);
		if (create_in_child(1, rel, 20000) != 0)
			die("create before the cut", P(1, rel));
		efs_cl_sleep_ms(300);
		t0 = now_us();
		efs_cl_cut(&cl, 1);
		while (efs_cl_metric(&cl, 1, "etcfs_session_state{state=\"suspended\"}") != 1) {
			if (now_us() - t0 > 30ull * 1000000)
				die("node B did not suspend within 30 s of the cut", "");
			efs_cl_sleep_ms(10);
		}
		susp[k] = now_us() - t0;
		snprintf(rel, sizeof(rel), "pc%d", k);
		err = create_in_child(1, rel, 60000);
		if (err != EIO) {
			fprintf(stderr, "cluster_bench: a create on the cut-off node gave %s\n",
				strerror(err));
			die("partition", "");
		}
		eio[k] = now_us() - t0;
		t1 = now_us();
		efs_cl_restore(&cl, 1);
		snprintf(rel, sizeof(rel), "pd%d", k);
		while ((err = create_in_child(1, rel, 20000)) != 0) {
			if (now_us() - t1 > 60ull * 1000000)
				die("node B did not serve within 60 s of the restore", "");
			efs_cl_sleep_ms(50);
		}
		serve[k] = now_us() - t1;
		printf(" %.0f/%.0f/%.0f ms", (double)susp[k] / 1000, (double)eio[k] / 1000,
		       (double)serve[k] / 1000);
		fflush(stdout);
	}
	printf(" (cut->suspended/cut->EIO/restore->serving)\n");
	report("  cut to the node's suspension", susp, (size_t)runs);
	report("  cut to EIO of a create sent at the suspension", eio, (size_t)runs);
	report("  restore to the node serving a create again", serve, (size_t)runs);
	sum_add("partition: cut to suspended, median / p99", "%.0f / %.0f ms",
		median_ms(susp, (size_t)runs), p99_ms(susp, (size_t)runs));
	sum_add("partition: cut to EIO, median / p99", "%.0f / %.0f ms (quorum timeout %s s)",
		median_ms(eio, (size_t)runs), p99_ms(eio, (size_t)runs), PART_QUORUM);
	sum_add("partition: restore to serving, median / p99", "%.0f / %.0f ms",
		median_ms(serve, (size_t)runs), p99_ms(serve, (size_t)runs));
	efs_cl_setargs(&cl, 1, NULL);
	efs_cl_unmount(&cl, 1);
	efs_cl_mount(&cl, 1);
	free(susp);
	free(eio);
	free(serve);
}

static void local_metadata(void)
{
	enum { STATS = 20000, FILES = 200, PASSES = 20 };
	uint64_t t0, took;
	struct stat st;
	char rel[300];

	put(P(0, "s"), "x");
	if (mkdir(P(0, "tree"), 0755) < 0 && errno != EEXIST)
		die("mkdir", P(0, "tree"));
	for (int k = 0; k < FILES; k++) {
		snprintf(rel, sizeof(rel), "tree/f%03d", k);
		put(P(0, rel), "x");
	}
	efs_cl_sleep_ms(200);
	t0 = now_us();
	for (int k = 0; k < STATS; k++)
		if (stat(P(0, "s"), &st) < 0)
			die("stat", P(0, "s"));
	took = now_us() - t0;
	printf("local metadata on node A:\n");
	sum_add("local: stat of one file, repeated", "%.2f us", (double)took / STATS);
	printf("  %-50s %8.2f us per stat (%d stats)\n", "stat of one file, repeated",
	       (double)took / STATS, STATS);
	t0 = now_us();
	for (int p = 0; p < PASSES; p++) {
		DIR *dir = opendir(P(0, "tree"));
		struct dirent *de;

		if (!dir)
			die("opendir", P(0, "tree"));
		while ((de = readdir(dir))) {
			if (de->d_name[0] == '.')
				continue;
			snprintf(rel, sizeof(rel), "tree/%s", de->d_name);
			if (stat(P(0, rel), &st) < 0)
				die("stat", P(0, rel));
		}
		closedir(dir);
	}
	took = now_us() - t0;
	printf("  %-50s %8.2f ms per pass (%d passes)\n", "listing: readdir + stat of 200 files",
	       (double)took / PASSES / 1000, PASSES);
	sum_add("local: readdir + stat of 200 files", "%.2f ms", (double)took / PASSES / 1000);
}

/* ---- Counters: what a section cost, summed over every node and member ---- */

/*
 * A snapshot of counters: every sample line of the nodes' /metrics whose
 * name starts with one of node_prefixes, and of the etcd members'
 * /metrics with one of etcd_prefixes, each summed over the nodes (or
 * members) under its full name with labels. The difference of two
 * snapshots is what happened in between on the whole cluster.
 */
#define SNAP_MAX 512
struct snap {
	double rev;
	int n;
	char key[SNAP_MAX][160];
	double v[SNAP_MAX];
};

static const char *const node_prefixes[] = {
	"etcfs_etcd_txns_total", "etcfs_lock_", "etcfs_fuse_ops_total", "etcfs_dev_ios_total",
	"etcfs_dev_bytes_total", "etcfs_op_retries_total", "etcfs_data_publish_txns_total",
	"etcfs_fuse_op_seconds_sum", "etcfs_fuse_op_seconds_count", NULL,
};
/* Requests every member served (OK only: the codes are pre-registered),
 * and what member 0 applied (every member applies the same). */
static const char *const etcd_prefixes[] = {"grpc_server_handled_total{grpc_code=\"OK\"", NULL};
static const char *const etcd0_prefixes[] = {"etcd_debugging_mvcc_put_total",
					     "etcd_debugging_mvcc_delete_total",
					     "etcd_debugging_mvcc_txn_total",
					     "etcd_debugging_mvcc_range_total", NULL};

static void snap_add(struct snap *s, const char *line, size_t len, double v)
{
	int k;

	if (len >= sizeof(s->key[0]))
		len = sizeof(s->key[0]) - 1;
	for (k = 0; k < s->n; k++)
		if (strncmp(s->key[k], line, len) == 0 && s->key[k][len] == '\0')
			break;
	if (k == s->n) {
		if (s->n == SNAP_MAX)
			return;
		memcpy(s->key[k], line, len);
		s->key[k][len] = '\0';
		s->v[s->n++] = 0;
	}
	s->v[k] += v;
}

/* Adds the matching samples of one /metrics text: counters (*_total) and
 * histograms' sums and counts (their buckets and gauges are left out). */
static void snap_text(struct snap *s, const char *text, const char *const *prefixes)
{
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		const char *sp = strchr(p, ' '), *nl = strchr(p, '\n');
		bool match = false;

		if (!sp || (nl && sp > nl) || *p == '#')
			continue;
		for (int k = 0; prefixes[k] && !match; k++)
			match = strncmp(p, prefixes[k], strlen(prefixes[k])) == 0;
		if (match && (memmem(p, (size_t)(sp - p), "_total", 6) ||
			      memmem(p, (size_t)(sp - p), "_sum", 4) ||
			      memmem(p, (size_t)(sp - p), "_count", 6)))
			snap_add(s, p, (size_t)(sp - p), strtod(sp + 1, NULL));
	}
}

static void snap_take(struct snap *s)
{
	memset(s, 0, sizeof(*s));
	s->rev = etcd_revision();
	for (int i = 0; i < cl.n; i++) {
		char *text = efs_cl_metrics_text(&cl, i);

		snap_text(s, text, node_prefixes);
		free(text);
	}
	for (int m = 0; m < efs_harness_members(cl.etcd); m++) {
		const char *url = efs_harness_metrics_url(cl.etcd, m);
		char *text = NULL;

		if (url && !strncmp(url, "http://", 7) && efs_tp_metrics_get(url + 7, &text) == 0) {
			snap_text(s, text, etcd_prefixes);
			if (m == 0)
				snap_text(s, text, etcd0_prefixes);
		}
		free(text);
	}
}

static double snap_get(const struct snap *s, const char *key)
{
	for (int k = 0; k < s->n; k++)
		if (!strcmp(s->key[k], key))
			return s->v[k];
	return 0;
}

/* etcd commits between two snapshots per |per| units of work; NAN when
 * etcd's metrics were unreadable or there was no work (printed "nan"). */
static double snap_commits(const struct snap *a, const struct snap *b, double per)
{
	return a->rev >= 0 && b->rev >= 0 && per > 0 ? (b->rev - a->rev) / per : NAN;
}

/* With --counters: every counter that moved between |a| and |b|, per |per|
 * units of work (e.g. per handover), so that each section shows what it
 * cost whom. */
static bool show_counters;

static void snap_print(const struct snap *a, const struct snap *b, double per, const char *unit)
{
	if (!show_counters || per <= 0)
		return;
	printf("    counters moved (whole cluster; per %s):\n", unit);
	for (int k = 0; k < b->n; k++) {
		double d = b->v[k] - snap_get(a, b->key[k]);

		if (strstr(b->key[k], "grpc_type=\"bidi_stream\""))
			continue;
		if (d > 0)
			printf("      %-100s %12.6g  %10.4g\n", b->key[k], d, d / per);
	}
}

/* ---- Lock ping-pong ---- */

/*
 * Nodes take turns (A, B, A, ... or A, B, C, A, ...) on one file each
 * keeps open: a step writes a 16-byte record k at offset 16 k and reads
 * back records k - 1 and k, which must be the previous node's and its
 * own. The write takes the exclusive lock over from the previous writer
 * (whose state is published on the way); the read back is served under
 * it. At most |rounds| steps and |ms| milliseconds.
 */
static void pingpong(int nodes, int rounds, unsigned ms)
{
	uint64_t *us = calloc((size_t)rounds, sizeof(uint64_t));
	int fd[EFS_CL_MAX_NODES];
	struct snap s0, s1;
	uint64_t t0, t1;
	char name[16], what[80];
	int steps = 0;
	double commits;

	if (!us)
		die("calloc", "");
	snprintf(name, sizeof(name), "pp%d", nodes);
	put(P(0, name), "");
	for (int i = 0; i < nodes; i++) {
		fd[i] = open(P(i, name), O_RDWR | O_CLOEXEC);
		if (fd[i] < 0)
			die("open", P(i, name));
	}
	efs_cl_sleep_ms(200);
	snap_take(&s0);
	t0 = now_us();
	for (; steps < rounds && now_us() - t0 < (uint64_t)ms * 1000; steps++) {
		int i = steps % nodes;
		char rec[2][17], got[33] = {0};
		uint64_t a = now_us();

		snprintf(rec[1], sizeof(rec[1]), "%08d%08d", i, steps);
		if (pwrite(fd[i], rec[1], 16, (off_t)steps * 16) != 16)
			die("pwrite", P(i, name));
		if (steps > 0) {
			snprintf(rec[0], sizeof(rec[0]), "%08d%08d", (steps - 1) % nodes, steps - 1);
			if (pread(fd[i], got, 32, (off_t)(steps - 1) * 16) != 32 ||
			    memcmp(got, rec[0], 16) || memcmp(got + 16, rec[1], 16)) {
				fprintf(stderr, "cluster_bench: ping-pong step %d on node %d read \"%s\"\n",
					steps, i, got);
				die("read back", P(i, name));
			}
		}
		us[steps] = now_us() - a;
	}
	t1 = now_us();
	snap_take(&s1);
	for (int i = 0; i < nodes; i++)
		close(fd[i]);
	commits = snap_commits(&s0, &s1, steps);
	printf("lock ping-pong, %d nodes in turn (write a record, read it and the previous one back):\n",
	       nodes);
	printf("  %-50s %.1f per second (%d in %.2f s)\n", "handovers", steps / ((t1 - t0) / 1e6), steps,
	       (t1 - t0) / 1e6);
	report("  each step (its handover included)", us, (size_t)steps);
	printf("  %-50s %.2f (etcd revision %.0f -> %.0f: every commit of every node)\n",
	       "etcd commits per handover", commits, s0.rev, s1.rev);
	snap_print(&s0, &s1, steps, "handover");
	snprintf(what, sizeof(what), "ping-pong %d nodes: handovers/s", nodes);
	sum_add(what, "%.1f", steps / ((t1 - t0) / 1e6));
	snprintf(what, sizeof(what), "ping-pong %d nodes: step median / p99", nodes);
	sum_add(what, "%.2f / %.2f ms", median_ms(us, (size_t)steps), p99_ms(us, (size_t)steps));
	snprintf(what, sizeof(what), "ping-pong %d nodes: etcd commits per handover", nodes);
	sum_add(what, "%.2f (target 1)", commits);
	free(us);
}

/* ---- Profiles ---- */

/* With --perf DIR: perf record -g of node |node|'s daemon (A for the
 * handoff's write, B for its O_DIRECT read) into
 * DIR/<name>.perf while a measurement runs (0: not profiling). */
static const char *perf_dir;

static pid_t perf_start(int node, const char *name)
{
	char out[512], pidarg[32];
	pid_t pid;

	if (!perf_dir)
		return 0;
	snprintf(out, sizeof(out), "%s/%s.perf", perf_dir, name);
	snprintf(pidarg, sizeof(pidarg), "%d", (int)cl.node[node].pid);
	pid = fork();
	if (pid == 0) {
		execlp("perf", "perf", "record", "-q", "-g", "-o", out, "-p", pidarg, (char *)NULL);
		_exit(127);
	}
	efs_cl_sleep_ms(500); /* attached */
	return pid < 0 ? 0 : pid;
}

static void perf_stop(pid_t pid)
{
	int st;

	if (pid <= 0)
		return;
	kill(pid, SIGINT);
	waitpid(pid, &st, 0);
}

/* ---- Cross-node handoff ---- */

#define MIB (1024 * 1024)

static void *mib_buf(void)
{
	void *buf = NULL;

	if (posix_memalign(&buf, 4096, MIB) != 0)
		die("posix_memalign", "");
	return buf;
}

/* MiB per second of |mib| MiB in |us| microseconds. */
static double rate(uint64_t mib, uint64_t us)
{
	return (double)mib / (us / 1e6);
}

/* Writes |mib| MiB sequentially to |path| (1 MiB writes, each MiB stamped
 * with its index, then fsync); microseconds taken. */
static uint64_t seq_write(const char *path, int flags, uint64_t mib)
{
	uint64_t *buf = mib_buf(), t0;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | flags, 0644);

	if (fd < 0)
		die("open", path);
	memset(buf, 'h', MIB);
	t0 = now_us();
	for (uint64_t k = 0; k < mib; k++) {
		buf[0] = k;
		if (write(fd, buf, MIB) != MIB)
			die("write", path);
	}
	if (fsync(fd) < 0)
		die("fsync", path);
	t0 = now_us() - t0;
	close(fd);
	free(buf);
	return t0;
}

/* Reads |path| sequentially (1 MiB reads), checking each MiB's stamp;
 * microseconds taken. */
static uint64_t seq_read(const char *path, int flags, uint64_t mib)
{
	uint64_t *buf = mib_buf(), t0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | flags);

	if (fd < 0)
		die("open", path);
	t0 = now_us();
	for (uint64_t k = 0; k < mib; k++) {
		if (read(fd, buf, MIB) != MIB)
			die("read", path);
		if (buf[0] != k) {
			fprintf(stderr, "cluster_bench: MiB %llu of %s reads stamp %llu\n",
				(unsigned long long)k, path, (unsigned long long)buf[0]);
			die("check", path);
		}
	}
	t0 = now_us() - t0;
	close(fd);
	free(buf);
	return t0;
}

/*
 * The device's own sequential read speed where the file lives: O_DIRECT
 * reads of 1 MiB of the image file's data regions (SEEK_DATA/SEEK_HOLE:
 * the blocks mkfs and the nodes wrote, the handoff file among them), up
 * to |mib| MiB; microseconds taken, the MiB read in *got.
 */
static uint64_t image_read(uint64_t mib, uint64_t *got)
{
	void *buf = mib_buf();
	int fd = open(cl.image, O_RDONLY | O_DIRECT | O_CLOEXEC);
	off_t pos = 0, end, hole;
	uint64_t t0, n = 0;

	if (fd < 0)
		die("open", cl.image);
	t0 = now_us();
	while (n < mib && (pos = lseek(fd, pos, SEEK_DATA)) >= 0) {
		hole = lseek(fd, pos, SEEK_HOLE);
		pos &= ~(off_t)(MIB - 1);
		for (end = hole; pos < end && n < mib; pos += MIB, n++)
			if (pread(fd, buf, MIB, pos) <= 0)
				die("pread", cl.image);
	}
	t0 = now_us() - t0;
	close(fd);
	free(buf);
	*got = n;
	return t0;
}

/* image_read's MiB/s. */
static double image_rate(uint64_t mib)
{
	uint64_t got, us = image_read(mib, &got);

	return rate(got, us);
}

static double median3(const double v[3])
{
	double lo = fmin(v[0], v[1]), hi = fmax(v[0], v[1]);

	return fmax(lo, fmin(hi, v[2]));
}

/* One node's rate against the device's, printed and in the summary. */
static void handoff_line(const char *what, const char *sum_what, double mibs, double dev)
{
	printf("  %-50s %8.1f MiB/s  %.2fx device\n", what, mibs, mibs / dev);
	sum_add(sum_what, "%.0f MiB/s = %.2fx device (target 0.8x)", mibs, mibs / dev);
}

/*
 * Node A writes |mib| MiB and fsyncs; node B reads the file with O_DIRECT,
 * node C through its page cache; each against the device measured in the
 * same run: an O_DIRECT write of the same size to a scratch file beside
 * the image, and O_DIRECT reads of the image's data before B, between B
 * and C and after C (the device's speed moves from one read to the next,
 * the host caching it too: their median is the baseline).
 */
static void handoff(uint64_t mib)
{
	char scratch[400];
	uint64_t wa, wraw, rb, rc;
	double dev[3], dev_r, dev_w;
	static struct snap sa, sa1, s0, s1, s2;
	pid_t perf;

	snprintf(scratch, sizeof(scratch), "%s/raw-scratch", cl.dir);
	wraw = seq_write(scratch, O_DIRECT, mib);
	unlink(scratch);
	perf = perf_start(0, "handoff-A");
	snap_take(&sa);
	wa = seq_write(P(0, "big"), 0, mib);
	snap_take(&sa1);
	perf_stop(perf);
	dev[0] = image_rate(mib);
	perf = perf_start(1, "handoff-B");
	snap_take(&s0);
	rb = seq_read(P(1, "big"), O_DIRECT, mib);
	snap_take(&s1);
	perf_stop(perf);
	dev[1] = image_rate(mib);
	rc = seq_read(P(2, "big"), 0, mib);
	snap_take(&s2);
	dev[2] = image_rate(mib);
	dev_r = median3(dev);
	dev_w = rate(mib, wraw);
	printf("handoff (%llu MiB, 1 MiB requests, one process at a time):\n", (unsigned long long)mib);
	printf("  %-50s %8.1f MiB/s\n", "device: O_DIRECT write + fsync, scratch file", dev_w);
	printf("  %-50s %8.1f MiB/s (median of %.1f before B, %.1f before C, %.1f after C)\n",
	       "device: O_DIRECT read of the image's data", dev_r, dev[0], dev[1], dev[2]);
	sum_add("handoff: device read / write (O_DIRECT)", "%.0f / %.0f MiB/s", dev_r, dev_w);
	handoff_line("A writes it (write + fsync)", "handoff: A write + fsync", rate(mib, wa), dev_w);
	handoff_line("B reads it with O_DIRECT", "handoff: B O_DIRECT read", rate(mib, rb), dev_r);
	handoff_line("C reads it through its page cache", "handoff: C page-cache read", rate(mib, rc),
		     dev_r);
	snap_print(&sa, &sa1, (double)mib, "MiB A wrote");
	snap_print(&s0, &s1, (double)mib, "MiB B read");
	snap_print(&s1, &s2, (double)mib, "MiB C read");
}

/* ---- Metadata scaling ---- */

enum { PH_CREATE, PH_STAT, PH_UNLINK, PH_N };
static const char *const ph_name[PH_N] = {"create", "stat", "unlink"};

struct ph_result {
	uint64_t ops, us;
};

/*
 * One worker on node |node|: for each phase, waits for the go byte on
 * |in|, then creates (stats, unlinks) "<dir>/w<node>_<k>" for k below
 * |files| (the phase stops early after |ms|; the later phases only touch
 * what was created) and writes a struct ph_result to |out|.
 */
static void scale_worker(int node, const char *dir, int files, unsigned ms, int in, int out)
{
	int made = files;

	for (int ph = 0; ph < PH_N; ph++) {
		struct ph_result res = {0};
		uint64_t t0;
		char go, path[600];
		int k;

		if (read(in, &go, 1) != 1)
			_exit(1);
		t0 = now_us();
		for (k = 0; k < made && now_us() - t0 < (uint64_t)ms * 1000; k++) {
			struct stat st;
			int fd;

			snprintf(path, sizeof(path), "%s/w%d_%d", dir, node, k);
			if (ph == PH_CREATE) {
				fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
				if (fd >= 0 && close(fd) == 0)
					continue;
			} else if ((ph == PH_STAT ? stat(path, &st) : unlink(path)) == 0) {
				continue;
			}
			fprintf(stderr, "cluster_bench: %s %s: %s\n", ph_name[ph], path, strerror(errno));
			break;
		}
		if (ph == PH_CREATE)
			made = k;
		res.ops = (uint64_t)k;
		res.us = now_us() - t0;
		if (write(out, &res, sizeof(res)) != sizeof(res))
			_exit(1);
	}
	_exit(0);
}

/* One configuration: |nodes| workers, in one directory or one each. */
static void scale_run(int nodes, bool shared, int files, unsigned ms)
{
	static int cfg;
	int to[EFS_CL_MAX_NODES], from[EFS_CL_MAX_NODES];
	pid_t pid[EFS_CL_MAX_NODES];
	char rel[64], dir[EFS_CL_MAX_NODES][512], line[256], what[80];
	int len;

	cfg++;
	for (int i = 0; i < nodes; i++) {
		int p1[2], p2[2];

		if (shared)
			snprintf(rel, sizeof(rel), "sc%d", cfg);
		else
			snprintf(rel, sizeof(rel), "sc%d_%d", cfg, i);
		/* Each own directory is made by its node; the shared one by A. */
		if ((i == 0 || !shared) && mkdir(P(i, rel), 0755) < 0)
			die("mkdir", P(i, rel));
		snprintf(dir[i], sizeof(dir[i]), "%s", P(i, rel));
		if (pipe(p1) < 0 || pipe(p2) < 0)
			die("pipe", "");
		pid[i] = fork();
		if (pid[i] < 0)
			die("fork", "");
		if (pid[i] == 0) {
			close(p1[1]);
			close(p2[0]);
			scale_worker(i, dir[i], files, ms, p1[0], p2[1]);
		}
		close(p1[0]);
		close(p2[1]);
		to[i] = p1[1];
		from[i] = p2[0];
	}
	efs_cl_sleep_ms(200);
	len = snprintf(line, sizeof(line), "  %d node%s, %-9s", nodes, nodes > 1 ? "s" : " ",
		       shared ? "one dir" : "own dirs");
	for (int ph = 0; ph < PH_N; ph++) {
		struct snap s0, s1;
		uint64_t ops = 0, us = 0;
		double commits, opss;

		snap_take(&s0);
		for (int i = 0; i < nodes; i++)
			if (write(to[i], "g", 1) != 1)
				die("write", "pipe");
		for (int i = 0; i < nodes; i++) {
			struct ph_result res;

			if (read(from[i], &res, sizeof(res)) != sizeof(res))
				die("worker", dir[i]);
			ops += res.ops;
			if (res.us > us)
				us = res.us;
		}
		snap_take(&s1);
		commits = snap_commits(&s0, &s1, (double)ops);
		opss = us ? ops / (us / 1e6) : 0;
		len += snprintf(line + len, sizeof(line) - (size_t)len, " | %8.0f %6.2f", opss,
				commits);
		snprintf(what, sizeof(what), "scaling %s, %d node%s, %s: ops/s, commits/op",
			 ph_name[ph], nodes, nodes > 1 ? "s" : "", shared ? "one dir" : "own dirs");
		sum_add(what, "%.0f, %.2f (%llu ops)", opss, commits,
			(unsigned long long)ops);
		if (show_counters && ops) {
			printf("  %d nodes, %s, %s:\n", nodes, shared ? "one dir" : "own dirs", ph_name[ph]);
			snap_print(&s0, &s1, (double)ops, "op");
		}
	}
	for (int i = 0; i < nodes; i++) {
		int st;

		close(to[i]);
		close(from[i]);
		waitpid(pid[i], &st, 0);
	}
	printf("%s\n", line);
}

/*
 * Metadata ops/s (create, stat, unlink of empty files; one process per
 * node, every process at once, |files| each, a phase stopping after |ms|)
 * at 1, 2 and 3 nodes, in one shared directory and in one directory per
 * node. ops/s is the sum of the processes' operations over the slowest
 * one's time.
 */
static void scaling(int files, unsigned ms)
{
	printf("metadata scaling (%d files per process, a phase stops after %u ms; ops/s, etcd commits "
	       "per op):\n", files, ms);
	printf("  %-20s | %15s | %15s | %15s\n", "", "create", "stat", "unlink");
	scale_run(1, false, files, ms);
	for (int n = 2; n <= cl.n; n++) {
		scale_run(n, true, files, ms);
		scale_run(n, false, files, ms);
	}
}

static const char *const sections[] = {"local",	 "handover", "pingpong", "handoff", "scaling",
					"takeover", "nodekill", "space",    "partition", NULL};

/* The bit of each section named in the comma-separated |list|; -1 when a
 * name is unknown. */
static int parse_only(const char *list)
{
	char buf[256], *save, *tok;
	int mask = 0;

	snprintf(buf, sizeof(buf), "%s", list);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		int k;

		for (k = 0; sections[k] && strcmp(sections[k], tok); k++)
			;
		if (!sections[k]) {
			fprintf(stderr, "cluster_bench: unknown section %s\n", tok);
			return -1;
		}
		mask |= 1 << k;
	}
	return mask;
}

enum {
	S_LOCAL = 1,
	S_HANDOVER = 2,
	S_PINGPONG = 4,
	S_HANDOFF = 8,
	S_SCALING = 16,
	S_TAKEOVER = 32,
	S_NODEKILL = 64,
	S_SPACE = 128,
	S_PARTITION = 256,
};

static void usage(void)
{
	fprintf(stderr, "usage: cluster_bench [--only local,handover,pingpong,handoff,scaling,takeover,\n"
			"       nodekill,space,partition] [--kills N] [--cuts N]\n"
			"       [--rounds N] [--takeovers N] [--pingpong-ms MS] [--handoff-mib N]\n"
			"       [--files N] [--phase-ms MS] [--cache-timeout MS] [--counters]\n"
			"       [--perf DIR] [--daemon-arg ARG]...\n");
}

int main(int argc, char **argv)
{
	struct efs_cl_opts o = {.nodes = 3};
	int rounds = 50, takeovers = 5, kills = 3, cuts = 3, only = -1, files = 200, handoff_mib = 256;
	bool grace_given = false;
	unsigned pp_ms = 5000, phase_ms = 4000;
	static const char *mount_args[16];
	const char *cache_timeout = NULL;
	int nargs = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--takeovers") && i + 1 < argc)
			takeovers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--kills") && i + 1 < argc)
			kills = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cuts") && i + 1 < argc)
			cuts = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--pingpong-ms") && i + 1 < argc)
			pp_ms = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--handoff-mib") && i + 1 < argc)
			handoff_mib = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--files") && i + 1 < argc)
			files = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--phase-ms") && i + 1 < argc)
			phase_ms = (unsigned)atoi(argv[++i]);
		else if (!strcmp(argv[i], "--perf") && i + 1 < argc)
			perf_dir = argv[++i];
		else if (!strcmp(argv[i], "--counters"))
			show_counters = true;
		else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
			only = parse_only(argv[++i]);
			if (only < 0)
				return 2;
		} else if (!strcmp(argv[i], "--cache-timeout") && i + 1 < argc) {
			cache_timeout = argv[++i];
			mount_args[nargs++] = "--cache-timeout";
			mount_args[nargs++] = cache_timeout;
			o.mount_args = mount_args;
		} else if (!strcmp(argv[i], "--daemon-arg") && i + 1 < argc && nargs < 12) {
			if (!strcmp(argv[i + 1], "--dead-grace")) {
				grace_given = true;
				if (i + 3 < argc && !strcmp(argv[i + 2], "--daemon-arg"))
					dead_grace = argv[i + 3];
			}
			mount_args[nargs++] = argv[++i];
			o.mount_args = mount_args;
		} else {
			usage();
			return 2;
		}
	}
	if (!grace_given) {
		/* The node kill waits for the dead node's orphan past the grace. */
		mount_args[nargs++] = "--dead-grace";
		mount_args[nargs++] = dead_grace;
		o.mount_args = mount_args;
	}
	if (cuts < 1 || kills < 1 || rounds < 1 || takeovers < 1 || files < 1 || handoff_mib < 1 || pp_ms < 1 || phase_ms < 1) {
		fprintf(stderr, "cluster_bench: every count and time must be at least 1\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!getenv("ETCFS_BUILD_ROOT")) {
		/* The binary lives in <build>/bench/. */
		char exe[4096];
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		char *slash;

		if (n > 0) {
			exe[n] = '\0';
			for (int k = 0; k < 2 && (slash = strrchr(exe, '/')); k++)
				*slash = '\0';
			setenv("ETCFS_BUILD_ROOT", exe, 0);
		}
	}
	/* Room for the handoff file and the rest (sparse: costs what is
	 * written). */
	o.image = ((uint64_t)handoff_mib + 512) << 20;
	/* A partition cuts a node's veth: every node then reaches etcd
	 * through a network namespace of its own (the cluster tests' way). */
	o.netns = (only & S_PARTITION) != 0;
	efs_cl_start(&cl, &o);
	printf("cluster: 3 etcfsd nodes, one sparse image in %s (ext4 or whatever holds /tmp), "
	       "3-member etcd (data in /dev/shm) at %s\n"
	       "kernel cache timeout under a held lock: %s\n",
	       cl.dir, cl.endpoints, cache_timeout ? cache_timeout : "default (TTL/4: 500 ms)");
	printf("etcfsd pids: A %d, B %d, C %d\n", (int)cl.node[0].pid, (int)cl.node[1].pid,
	       (int)cl.node[2].pid);
	if (only & S_LOCAL)
		local_metadata();
	if (only & S_HANDOVER) {
		handover(rounds, false);
		handover(rounds, true);
	}
	if (only & S_PINGPONG) {
		pingpong(2, 100000, pp_ms);
		pingpong(3, 100000, pp_ms);
	}
	if (only & S_HANDOFF)
		handoff((uint64_t)handoff_mib);
	if (only & S_SCALING)
		scaling(files, phase_ms);
	if (only & S_TAKEOVER)
		takeover(takeovers);
	if (only & S_NODEKILL)
		nodekill(kills);
	if (only & S_SPACE)
		space_handover();
	if (only & S_PARTITION)
		partition(cuts);
	if (sum_n) {
		printf("\nsummary (one run; absolute figures, devices measured in the same run):\n");
		for (int k = 0; k < sum_n; k++)
			printf("  %-58s %s\n", sum_row[k].what, sum_row[k].value);
	}
	return efs_cl_stop(&cl) ? 0 : 1;
}
