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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct efs_cl cl;

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

static void rw_read(int i, struct rwhist *h)
{
	static const char bucket[] = "etcfs_lock_recall_wait_seconds_bucket{le=\"";
	char *text = efs_cl_metrics_text(&cl, i), *p;

	memset(h, 0, sizeof(*h));
	h->count = h->sum = -1;
	for (p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		char *q;

		if (strncmp(p, bucket, sizeof(bucket) - 1) == 0 && h->n < RW_BUCKETS) {
			p += sizeof(bucket) - 1;
			h->le[h->n] = strncmp(p, "+Inf", 4) == 0 ? INFINITY : strtod(p, NULL);
			q = strstr(p, "} ");
			h->cum[h->n++] = q ? strtod(q + 2, NULL) : 0;
		} else if (strncmp(p, "etcfs_lock_recall_wait_seconds_count ", 37) == 0) {
			h->count = strtod(p + 37, NULL);
		} else if (strncmp(p, "etcfs_lock_recall_wait_seconds_sum ", 35) == 0) {
			h->sum = strtod(p + 35, NULL);
		}
	}
	free(text);
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

/*
 * Lock ping-pong: nodes A and B keep one file open and write it in turn
 * (a 16-byte record at offset 0, no fsync), so every write takes the
 * exclusive lock over from the other node, whose buffered write is
 * published on the way. Handovers per second, the write's latency, and
 * etcd commits per handover.
 */
static void pingpong(int rounds)
{
	uint64_t *us = calloc((size_t)rounds, sizeof(uint64_t));
	int fd[2];
	double rev0, rev1;
	uint64_t t0, t1;
	char rec[17], got[17] = {0};

	if (!us)
		die("calloc", "");
	put(P(0, "pp"), "0000000000000000");
	fd[0] = open(P(0, "pp"), O_RDWR | O_CLOEXEC);
	fd[1] = open(P(1, "pp"), O_RDWR | O_CLOEXEC);
	if (fd[0] < 0 || fd[1] < 0)
		die("open", P(0, "pp"));
	efs_cl_sleep_ms(200);
	rev0 = etcd_revision();
	t0 = now_us();
	for (int k = 0; k < rounds; k++) {
		uint64_t a = now_us();

		snprintf(rec, sizeof(rec), "%016d", k);
		if (pwrite(fd[k % 2], rec, 16, 0) != 16)
			die("pwrite", P(k % 2, "pp"));
		us[k] = now_us() - a;
	}
	t1 = now_us();
	rev1 = etcd_revision();
	/* The last writer's record, read on the other node. */
	if (pread(fd[rounds % 2], got, 16, 0) != 16 || strcmp(got, rec) != 0)
		die("read back the last record on the other node", P(rounds % 2, "pp"));
	close(fd[0]);
	close(fd[1]);
	printf("lock ping-pong (A and B write one open file in turn, no fsync):\n");
	printf("  %-50s %.0f per second (%d writes in %.2f s)\n", "handovers", rounds / ((t1 - t0) / 1e6),
	       rounds, (t1 - t0) / 1e6);
	report("  each write (its handover included)", us, (size_t)rounds);
	if (rev0 >= 0 && rev1 >= 0)
		printf("  %-50s %.2f (etcd revisions %.0f -> %.0f; every node's commits)\n",
		       "etcd commits per handover", (rev1 - rev0) / rounds, rev0, rev1);
	else
		printf("  %-50s (etcd's metrics unreadable)\n", "etcd commits per handover");
	free(us);
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
	free(took);
	free(gap);
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
}

int main(int argc, char **argv)
{
	struct efs_cl_opts o = {.nodes = 3};
	int rounds = 100, takeovers = 7;
	static const char *mount_args[3];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--takeovers") && i + 1 < argc)
			takeovers = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cache-timeout") && i + 1 < argc) {
			mount_args[0] = "--cache-timeout";
			mount_args[1] = argv[++i];
			o.mount_args = mount_args;
		}
		else {
			fprintf(stderr, "usage: cluster_bench [--rounds N] [--takeovers N] "
					"[--cache-timeout MS]\n");
			return 2;
		}
	}
	if (rounds < 1 || takeovers < 1) {
		fprintf(stderr, "cluster_bench: --rounds and --takeovers must be at least 1\n");
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
	efs_cl_start(&cl, &o);
	printf("cluster: 3 etcfsd nodes, one sparse image in /tmp, 3-member etcd (data in /dev/shm) at %s\n"
	       "kernel cache timeout under a held lock: %s\n",
	       cl.endpoints, o.mount_args ? mount_args[1] : "default (TTL/4: 500 ms)");
	local_metadata();
	handover(rounds, false);
	handover(rounds, true);
	pingpong(rounds);
	takeover(takeovers);
	return efs_cl_stop(&cl) ? 0 : 1;
}
