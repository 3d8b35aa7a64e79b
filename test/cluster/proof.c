/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The proof checks of proof.h. Every worker is a child process of the
 * test, started by a team (released together through a gate), reporting
 * into memory shared with the test and never failing by itself: the test
 * reaps every worker before it looks at what they did, so a failed check
 * leaves no worker behind. Workers bound themselves (a deadline, and an
 * alarm on every system call of a history); the watchdog bounds the rest.
 */
#include "proof.h"
#include "history.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- Teams of workers ---- */

#define MAX_WORKERS EFS_HIST_MAX_PROCS

struct team {
	pid_t pid[MAX_WORKERS];
	int n;
};

/* Runs fn(arg, 0) .. fn(arg, n - 1) in children released together. */
static void team_run(struct team *t, void (*fn)(void *arg, int i), void *arg, int n)
{
	int gate[2];

	CL_CHECK(n <= MAX_WORKERS, "%d workers", n);
	CL_CHECK(pipe2(gate, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
	fflush(stdout);
	t->n = 0;
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();

		if (pid == 0) {
			char b;

			prctl(PR_SET_PDEATHSIG, SIGKILL);
			efs_cl_jmp = NULL; /* a failure here aborts the worker */
			close(gate[1]);
			while (read(gate[0], &b, 1) < 0 && errno == EINTR)
				;
			fn(arg, i);
			_exit(0);
		}
		if (pid < 0) {
			int e = errno;

			for (int k = 0; k < t->n; k++) {
				kill(t->pid[k], SIGKILL);
				waitpid(t->pid[k], NULL, 0);
			}
			close(gate[0]);
			close(gate[1]);
			CL_CHECK(false, "fork: %s", strerror(e));
		}
		t->pid[t->n++] = pid;
	}
	close(gate[0]);
	close(gate[1]);
}

/* Reaps every worker; returns how many did not exit 0. */
static int team_wait(struct team *t)
{
	int bad = 0;

	for (int i = 0; i < t->n; i++) {
		int st;

		while (waitpid(t->pid[i], &st, 0) < 0 && errno == EINTR)
			;
		bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	t->n = 0;
	return bad;
}

/* Memory shared with the workers: one area, made once, reused by every
 * check (so a failed check leaks nothing). */
#define SHARED_BYTES (4u << 20)

static void *shared_area(size_t need)
{
	static void *area;

	CL_CHECK(need <= SHARED_BYTES, "%zu bytes of shared memory", need);
	if (!area) {
		area = mmap(NULL, SHARED_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
			    -1, 0);
		CL_CHECK(area != MAP_FAILED, "mmap: %s", strerror(errno));
	}
	memset(area, 0, need);
	return area;
}

static const char *path_in(struct efs_cl *c, int node, const char *dir, const char *name,
			   char *buf, size_t size)
{
	char rel[512];

	snprintf(rel, sizeof(rel), "%s%s%s", dir, name[0] ? "/" : "", name);
	return efs_cl_path(c, node, rel, buf, size);
}

/* Mounts node |i| again with fault switch |name| on, or (NULL) without. */
static void remount(struct efs_cl *c, int i, const char *name)
{
	efs_cl_unmount(c, i);
	if (name)
		efs_cl_setenv(c, i, name, "1");
	efs_cl_mount(c, i);
	if (name)
		efs_cl_setenv(c, i, name, NULL);
}

/* ---- Histories ---- */

/* Operations per process: 6 processes give at most 1,800 records. */
#define HIST_OPS    150
#define HIST_PATHS  6
#define HIST_BUDGET 30000 /* ms for the checker */

struct hist_run {
	struct efs_cl *c;
	const char *dir;
	char sub[512]; /* dir/<the run's name>: where it runs */
	int nprocs;
	int node[MAX_WORKERS];
	const struct efs_hist_mix *mix[MAX_WORKERS];
	unsigned secs;
	unsigned op_timeout_s;
	uint64_t seed;
	uint64_t deadline_ns;
	/* shared */
	struct efs_hist_op *log; /* nprocs * 2 * HIST_OPS */
	size_t *count;		 /* nprocs */
};

/*
 * Per node, one process reads and writes data and the other changes names:
 * a read on the node of a write that is still going on may see the new
 * bytes with the old size (the kernel copies into the page before it moves
 * i_size, on any file system), which no serial order explains; across nodes
 * the locks make both whole.
 */
static const struct efs_hist_mix mix_data = {
	.create = 10, .write = 30, .read = 30, .stat = 10, .truncate = 10, .chmod = 10};
/* Attributes only: after the first creates, no name changes, so no
 * directory is recalled (see docs/TESTING.md for why that matters today). */
static const struct efs_hist_mix mix_attrs = {.create = 20, .stat = 50, .chmod = 30};
/* With unlinks, and with renames (run only when named). */
static const struct efs_hist_mix mix_names = {.create = 30, .stat = 30, .chmod = 15, .unlink = 25};
static const struct efs_hist_mix mix_renames = {
	.create = 25, .stat = 25, .chmod = 10, .rename = 25, .unlink = 15};
/* Changes only, paced so that the lookers' kernel caches fill between
 * them (a cache without invalidations then goes stale), and looks only. */
static const struct efs_hist_mix mix_change = {
	.create = 15, .write = 25, .truncate = 15, .chmod = 25, .unlink = 10, .pause_ms = 150};
static const struct efs_hist_mix mix_look = {.read = 40, .stat = 60, .pause_ms = 20};

static void hist_worker(void *arg, int i)
{
	struct hist_run *r = arg;
	char dir[512];

	path_in(r->c, r->node[i], r->sub, "", dir, sizeof(dir));
	r->count[i] = efs_hist_run_proc(dir, HIST_PATHS, r->mix[i], r->seed, i, r->node[i],
					HIST_OPS, r->deadline_ns, r->op_timeout_s,
					r->log + (size_t)i * 2 * HIST_OPS);
}

static uint64_t hist_seed(void)
{
	const char *v = getenv("ETCFS_HIST_SEED");

	if (v && *v)
		return strtoull(v, NULL, 0);
	return efs_hist_now_ns() ^ ((uint64_t)getpid() << 32);
}

/* With ETCFS_HIST_DUMP=DIR (an existing directory), writes every
 * operation of the history to DIR/history-<seed>-<what>.txt, one a line. */
static void hist_dump(const struct efs_hist_op *ops, size_t n, uint64_t seed, const char *what)
{
	const char *dir = getenv("ETCFS_HIST_DUMP");
	char path[1024], line[400];
	FILE *f;

	if (!dir || !*dir)
		return;
	snprintf(path, sizeof(path), "%s/history-%" PRIu64 "-%s.txt", dir, seed, what);
	for (char *p = strrchr(path, '/'); *p; p++)
		if (*p == ' ')
			*p = '_';
	f = fopen(path, "w");
	CL_CHECK(f, "%s: %s", path, strerror(errno));
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s\n", efs_hist_op_str(&ops[i], line, sizeof(line)));
	fclose(f);
}

/*
 * Runs the history |r| describes and checks it: returns the checker's
 * result, with its report in |report|. Prints the seed and the figures.
 */
static int hist_run(struct hist_run *r, const char *what, char *report, size_t size)
{
	struct team t;
	size_t total = 0, k = 0, orphan = 0;
	struct efs_hist_op *all;
	char path[1024];
	uint64_t states = 0, t0;
	int bad, rc;

	/* Each run starts from an empty directory of its own. */
	snprintf(r->sub, sizeof(r->sub), "%s/%s", r->dir, what);
	for (char *p = r->sub; *p; p++)
		if (*p == ' ')
			*p = '_';
	path_in(r->c, 0, r->sub, "", path, sizeof(path));
	CL_CHECK(mkdir(path, 0755) == 0, "mkdir %s: %s", path, strerror(errno));
	r->log = shared_area((size_t)r->nprocs * 2 * HIST_OPS * sizeof(*r->log) +
			     (size_t)r->nprocs * sizeof(size_t));
	r->count = (size_t *)(r->log + (size_t)r->nprocs * 2 * HIST_OPS);
	r->deadline_ns = efs_hist_now_ns() + (uint64_t)r->secs * 1000000000u;
	team_run(&t, hist_worker, r, r->nprocs);
	bad = team_wait(&t);
	CL_CHECK(!bad, "%s (seed %" PRIu64 "): %d history workers died", what, r->seed, bad);
	for (int i = 0; i < r->nprocs; i++)
		total += r->count[i];
	all = malloc((total + 1) * sizeof(*all));
	CL_CHECK(all, "out of memory");
	for (int i = 0; i < r->nprocs; i++)
		for (size_t j = 0; j < r->count[i]; j++)
			all[k++] = r->log[(size_t)i * 2 * HIST_OPS + j];
	t0 = efs_hist_now_ns();
	rc = efs_hist_check(all, total, EFS_HIST_ORPHAN_IO_MAY_FAIL | EFS_HIST_WRITE_SIZE_LAGS,
			    HIST_BUDGET, report, size, &states);
	hist_dump(all, total, r->seed, what);
	for (size_t i = 0; i < total; i++)
		orphan += (all[i].kind == EFS_HIST_PWRITE || all[i].kind == EFS_HIST_PREAD) &&
			  (all[i].err == ENOENT || all[i].err == ESTALE);
	free(all);
	printf("# %s: seed %" PRIu64 ", %zu operations by %d processes (%zu I/O failed on an "
	       "unlinked file), checked in %.2f s (%" PRIu64 " states): %s\n",
	       what, r->seed, total, r->nprocs, orphan, (double)(efs_hist_now_ns() - t0) / 1e9,
	       states,
	       rc == 0 ? "linearizable" : rc == -EINVAL ? "NOT linearizable" : strerror(-rc));
	return rc;
}

static void hist_init(struct hist_run *r, struct efs_cl *c, const char *dir)
{
	memset(r, 0, sizeof(*r));
	r->c = c;
	r->dir = dir;
	r->secs = 8;
	r->op_timeout_s = 10;
	r->seed = hist_seed();
}

/* ETCFS_HIST_MIX="create,write,read,stat,truncate,chmod,rename,unlink"
 * (weights) replaces |mix| (to chase a failure to the kinds that cause it). */
static const struct efs_hist_mix *mix_from_env(const struct efs_hist_mix *mix)
{
	static struct efs_hist_mix m;
	const char *v = getenv("ETCFS_HIST_MIX");

	if (!v || !*v)
		return mix;
	CL_CHECK(sscanf(v, "%u,%u,%u,%u,%u,%u,%u,%u", &m.create, &m.write, &m.read, &m.stat,
			&m.truncate, &m.chmod, &m.rename, &m.unlink) == 8,
		 "ETCFS_HIST_MIX=%s: eight weights expected", v);
	return &m;
}

/* Two processes per node: one with |data|, one with |names|. */
static void history_check(struct efs_cl *c, const char *dir, const struct efs_hist_mix *names)
{
	static char report[16384];
	struct hist_run r;
	int rc;

	hist_init(&r, c, dir);
	r.nprocs = 2 * c->n;
	for (int i = 0; i < r.nprocs; i++) {
		r.node[i] = i % c->n;
		r.mix[i] = mix_from_env(i < c->n ? &mix_data : names);
	}
	rc = hist_run(&r, "history", report, sizeof(report));
	CL_CHECK(rc == 0,
		 "the history of seed %" PRIu64 " (ETCFS_HIST_SEED=%" PRIu64
		 " repeats its operations) is not linearizable: %s\n%s",
		 r.seed, r.seed, rc == -EINVAL ? "" : strerror(-rc), report);
}

void efs_proof_history(struct efs_cl *c, const char *dir)
{
	history_check(c, dir, &mix_attrs);
}

void efs_proof_history_with_unlinks(struct efs_cl *c, const char *dir)
{
	history_check(c, dir, &mix_names);
}

void efs_proof_history_with_renames(struct efs_cl *c, const char *dir)
{
	history_check(c, dir, &mix_renames);
}

/* Two processes on node 1 change, two on node 3 look. */
static void change_and_look(struct hist_run *r)
{
	r->nprocs = 4;
	r->secs = 6;
	for (int i = 0; i < 4; i++) {
		r->node[i] = i < 2 ? 0 : 2;
		r->mix[i] = i < 2 ? &mix_change : &mix_look;
	}
}

void efs_proof_history_without_invalidations(struct efs_cl *c, const char *dir)
{
	static char report[2][16384];
	struct hist_run r;
	int off, on;

	hist_init(&r, c, dir);
	change_and_look(&r);
	remount(c, 2, "ETCFS_FAULT_NO_INVAL");
	off = hist_run(&r, "node3 without invalidations", report[0], sizeof(report[0]));
	remount(c, 2, NULL);
	/* The same operations with invalidations: linearizable. */
	on = hist_run(&r, "node3 with invalidations", report[1], sizeof(report[1]));
	CL_CHECK(on == 0, "with invalidations, the history of seed %" PRIu64
		 " is not linearizable: %s", r.seed, report[1]);
	CL_CHECK(off == -EINVAL,
		 "the checker found no violation in a history (seed %" PRIu64
		 ") where node3's kernel kept what it cached (%s)",
		 r.seed, off ? strerror(-off) : "linearizable");
	printf("# the violation found:\n");
	for (const char *p = report[0]; *p;) {
		const char *nl = strchr(p, '\n');
		int len = nl ? (int)(nl - p) : (int)strlen(p);

		printf("#   %.*s\n", len, p);
		p += len + (nl ? 1 : 0);
	}
}

void efs_proof_history_without_recall_answers(struct efs_cl *c, const char *dir)
{
	static char report[16384];
	struct hist_run r;
	int rc;

	hist_init(&r, c, dir);
	change_and_look(&r);
	/* Node 2 looks and never answers a recall; node 1 changes. */
	for (int i = 2; i < 4; i++)
		r.node[i] = 1;
	r.op_timeout_s = 2;
	remount(c, 1, "ETCFS_FAULT_NO_RECALL");
	rc = hist_run(&r, "node2 without recall answers", report, sizeof(report));
	remount(c, 1, NULL);
	CL_CHECK(rc == -EINVAL && strstr(report, "(timed out)"),
		 "without recall answers on node2, the history of seed %" PRIu64
		 " was not flagged by operation timeouts (%s):\n%s",
		 r.seed, rc ? strerror(-rc) : "linearizable", report);
}

/* ---- Lock ping-pong: one file ---- */

/*
 * A record: "W<w> K<k> <O|A>" and a pattern, then the FNV-1a hash of the
 * first REC_BODY bytes in 8 hex digits. Writer w's k-th own record goes to
 * slot k * PP_WRITERS + w of the region at the start of the file (made
 * with its final size first); its appended records follow the region.
 */
#define REC_LEN	   64
#define REC_BODY   56
#define PP_WRITERS 3
#define PP_SLOTS   2048 /* own records per writer at most */
#define PP_REGION  ((off_t)PP_WRITERS * PP_SLOTS * REC_LEN)
#define PP_SECS	   5

/* The first error of each writer (shared), and what it was doing. */
struct pp_errs {
	int err[PP_WRITERS];
	char what[PP_WRITERS][64];
};

/* Runs fn(arg, w) for writers 0 .. |nodes| - 1, each on its own node,
 * until |secs| pass (|deadline_ns| is set for them); fails the check with
 * the first error a writer met. */
static void run_writers(void (*fn)(void *arg, int w), void *arg, int nodes, unsigned secs,
			uint64_t *deadline_ns, const struct pp_errs *e)
{
	struct team t;
	int bad;

	*deadline_ns = efs_hist_now_ns() + (uint64_t)secs * 1000000000u;
	team_run(&t, fn, arg, nodes);
	bad = team_wait(&t);
	CL_CHECK(!bad, "%d writers died", bad);
	for (int w = 0; w < nodes; w++)
		CL_CHECK(!e->err[w], "writer %d (node%d): %s: %s", w, w + 1, e->what[w],
			 strerror(e->err[w]));
}

struct pp_run {
	struct efs_cl *c;
	const char *dir;
	uint64_t deadline_ns;
	/* shared: acknowledged records, errors */
	unsigned acked_own[PP_WRITERS], acked_app[PP_WRITERS];
	struct pp_errs e;
};

static uint32_t fnv32(const unsigned char *p, size_t n)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 16777619u;
	return h;
}

static void rec_make(unsigned char *rec, int w, unsigned k, char type)
{
	char hex[9];
	int n = snprintf((char *)rec, REC_LEN, "W%d K%06u %c ", w, k, type);

	for (int i = n; i < REC_BODY; i++)
		rec[i] = (unsigned char)('a' + (i + w + (int)k) % 26);
	snprintf(hex, sizeof(hex), "%08x", fnv32(rec, REC_BODY));
	memcpy(rec + REC_BODY, hex, 8);
}

/* Parses |rec|: false when it is torn (its hash does not match). */
static bool rec_parse(const unsigned char *rec, int *w, unsigned *k, char *type)
{
	char hex[9];

	snprintf(hex, sizeof(hex), "%08x", fnv32(rec, REC_BODY));
	return !memcmp(rec + REC_BODY, hex, 8) &&
	       sscanf((const char *)rec, "W%d K%u %c ", w, k, type) == 3;
}

static void file_writer(void *arg, int w)
{
	struct pp_run *r = arg;
	char path[512];
	unsigned char rec[REC_LEN];
	int own, app;

	path_in(r->c, w, r->dir, "f", path, sizeof(path));
	own = open(path, O_WRONLY | O_CLOEXEC);
	app = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
	if (own < 0 || app < 0) {
		r->e.err[w] = errno;
		snprintf(r->e.what[w], sizeof(r->e.what[w]), "open");
		return;
	}
	for (unsigned k = 0; k < PP_SLOTS && efs_hist_now_ns() < r->deadline_ns; k++) {
		rec_make(rec, w, k, 'O');
		if (pwrite(own, rec, REC_LEN, ((off_t)k * PP_WRITERS + w) * REC_LEN) != REC_LEN) {
			r->e.err[w] = errno ? errno : EIO;
			snprintf(r->e.what[w], sizeof(r->e.what[w]), "pwrite of record %u", k);
			break;
		}
		r->acked_own[w] = k + 1;
		rec_make(rec, w, k, 'A');
		if (write(app, rec, REC_LEN) != REC_LEN) {
			r->e.err[w] = errno ? errno : EIO;
			snprintf(r->e.what[w], sizeof(r->e.what[w]), "append of record %u", k);
			break;
		}
		r->acked_app[w] = k + 1;
	}
	close(own);
	close(app);
}

/* Reads the whole of |path| (at most |max|); fails the check on an error. */
static size_t read_all(const char *path, unsigned char *buf, size_t max)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t used = 0;
	ssize_t n = 0;

	CL_CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
	while (used < max && (n = read(fd, buf + used, max - used)) > 0)
		used += (size_t)n;
	close(fd);
	CL_CHECK(n >= 0, "read %s: %s", path, strerror(errno));
	return used;
}

/* Checks the file's contents against what the writers acknowledged. */
static void file_verify(const struct pp_run *r, int nodes, const unsigned char *buf, size_t n,
			int reader)
{
	unsigned next[PP_WRITERS] = {0}, total = 0;

	for (int w = 0; w < nodes; w++)
		total += r->acked_app[w];
	CL_CHECK(n == (size_t)PP_REGION + (size_t)total * REC_LEN,
		 "node%d reads %zu bytes: the region and %u appended records make %zu", reader + 1,
		 n, total, (size_t)PP_REGION + (size_t)total * REC_LEN);
	for (int w = 0; w < PP_WRITERS; w++)
		for (unsigned k = 0; k < PP_SLOTS; k++) {
			const unsigned char *rec = buf + ((size_t)k * PP_WRITERS + w) * REC_LEN;
			unsigned rk;
			char type;
			int rw;

			if (k >= r->acked_own[w]) {
				CL_CHECK(rec[0] == 0, "node%d: slot %u of writer %d, never written, "
					 "holds %.16s", reader + 1, k, w, rec);
				continue;
			}
			CL_CHECK(rec_parse(rec, &rw, &rk, &type),
				 "node%d: writer %d's record %u is torn or lost: %.64s", reader + 1,
				 w, k, rec);
			CL_CHECK(rw == w && rk == k && type == 'O',
				 "node%d: writer %d's slot %u holds W%d K%u %c", reader + 1, w, k,
				 rw, rk, type);
		}
	for (size_t off = (size_t)PP_REGION; off < n; off += REC_LEN) {
		unsigned rk;
		char type;
		int rw;

		CL_CHECK(rec_parse(buf + off, &rw, &rk, &type) && type == 'A' && rw >= 0 &&
				 rw < nodes,
			 "node%d: a torn appended record at %zu: %.64s", reader + 1, off, buf + off);
		/* One writer's appends are sequential: in order, each once. */
		CL_CHECK(rk == next[rw], "node%d: writer %d's append %u at %zu, %u expected",
			 reader + 1, rw, rk, off, next[rw]);
		next[rw]++;
	}
	for (int w = 0; w < nodes; w++)
		CL_CHECK(next[w] == r->acked_app[w],
			 "node%d: writer %d has %u appended records, %u acknowledged", reader + 1, w,
			 next[w], r->acked_app[w]);
}

void efs_proof_file_ping_pong(struct efs_cl *c, const char *dir, int nodes)
{
	static unsigned char buf[(size_t)PP_REGION + (size_t)PP_WRITERS * PP_SLOTS * REC_LEN];
	struct pp_run *r = shared_area(sizeof(*r));
	char path[512];
	unsigned own = 0, app = 0;
	int fd;

	r->c = c;
	r->dir = dir;
	path_in(c, 0, dir, "f", path, sizeof(path));
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	CL_CHECK(fd >= 0, "create %s: %s", path, strerror(errno));
	CL_CHECK(ftruncate(fd, PP_REGION) == 0, "ftruncate: %s", strerror(errno));
	close(fd);
	run_writers(file_writer, r, nodes, PP_SECS, &r->deadline_ns, &r->e);
	for (int w = 0; w < nodes; w++) {
		own += r->acked_own[w];
		app += r->acked_app[w];
	}
	printf("# %d nodes on one file for %d s: %u records in place and %u appended "
	       "(%.0f writes/s)\n",
	       nodes, PP_SECS, own, app, (double)(own + app) / PP_SECS);
	CL_CHECK(own > 0 && app > 0, "no record was written");
	/* Every node reads the same: each record acknowledged, none torn. */
	for (int i = 0; i < c->n; i++) {
		path_in(c, i, dir, "f", path, sizeof(path));
		file_verify(r, nodes, buf, read_all(path, buf, sizeof(buf)), i);
	}
}

/* ---- Lock ping-pong: one directory ---- */

#define PD_MAX	 4096 /* names per writer at most */
#define PD_SECS	 5
#define PD_EVERY 10 /* each 10th name is a directory */

enum { PD_NONE, PD_MADE, PD_GONE };

struct pd_run {
	struct efs_cl *c;
	const char *dir;
	uint64_t deadline_ns;
	/* shared */
	unsigned char state[PP_WRITERS][PD_MAX];
	struct pp_errs e;
};

static void pd_name(char *buf, size_t size, int w, unsigned k)
{
	snprintf(buf, size, "%c%d-%05u", k % PD_EVERY ? 'f' : 'd', w, k);
}

/* Creates names and unlinks every third one it made two steps before. */
static void dir_writer(void *arg, int w)
{
	struct pd_run *r = arg;

	for (unsigned k = 0; k < PD_MAX && efs_hist_now_ns() < r->deadline_ns; k++) {
		char name[32], path[512];
		int res;

		pd_name(name, sizeof(name), w, k);
		path_in(r->c, w, r->dir, name, path, sizeof(path));
		if (k % PD_EVERY == 0) {
			res = mkdir(path, 0755);
		} else {
			res = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
			if (res >= 0)
				close(res);
		}
		if (res < 0) {
			r->e.err[w] = errno;
			snprintf(r->e.what[w], sizeof(r->e.what[w]), "create %s", name);
			return;
		}
		r->state[w][k] = PD_MADE;
		if (k % 3 == 2) {
			pd_name(name, sizeof(name), w, k - 2);
			path_in(r->c, w, r->dir, name, path, sizeof(path));
			if ((k - 2) % PD_EVERY == 0 ? rmdir(path) : unlink(path)) {
				r->e.err[w] = errno;
				snprintf(r->e.what[w], sizeof(r->e.what[w]), "remove %s", name);
				return;
			}
			r->state[w][k - 2] = PD_GONE;
		}
	}
}

/* Node |i|'s listing of the directory against the writers' record. */
static void dir_verify(const struct pd_run *r, int nodes, int i, unsigned *present,
		       unsigned *subdirs)
{
	static unsigned char seen[PP_WRITERS][PD_MAX];
	char path[512];
	struct dirent *e;
	struct stat st;
	DIR *d;

	memset(seen, 0, sizeof(seen));
	*present = *subdirs = 0;
	path_in(r->c, i, r->dir, "", path, sizeof(path));
	d = opendir(path);
	CL_CHECK(d, "opendir on node%d: %s", i + 1, strerror(errno));
	while ((errno = 0, e = readdir(d))) {
		unsigned k;
		int w;
		char kind;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (sscanf(e->d_name, "%c%d-%u", &kind, &w, &k) != 3 || w < 0 || w >= nodes ||
		    k >= PD_MAX) {
			closedir(d);
			CL_CHECK(false, "node%d lists a name nobody made: %s", i + 1, e->d_name);
		}
		if (seen[w][k]++ || r->state[w][k] != PD_MADE) {
			closedir(d);
			CL_CHECK(false, "node%d lists %s %s", i + 1, e->d_name,
				 seen[w][k] > 1 ? "twice" : "which was removed or never made");
		}
		++*present;
		*subdirs += kind == 'd';
	}
	CL_CHECK(errno == 0, "readdir on node%d: %s", i + 1, strerror(errno));
	closedir(d);
	for (int w = 0; w < nodes; w++)
		for (unsigned k = 0; k < PD_MAX; k++) {
			char name[32];

			if (r->state[w][k] != PD_MADE)
				continue;
			pd_name(name, sizeof(name), w, k);
			CL_CHECK(seen[w][k], "node%d does not list %s", i + 1, name);
			path_in(r->c, i, r->dir, name, path, sizeof(path));
			CL_CHECK(lstat(path, &st) == 0, "node%d: lstat %s: %s", i + 1, name,
				 strerror(errno));
			CL_CHECK(st.st_nlink == (k % PD_EVERY ? 1u : 2u),
				 "node%d: %s has %lu links", i + 1, name, (unsigned long)st.st_nlink);
		}
	path_in(r->c, i, r->dir, "", path, sizeof(path));
	CL_CHECK(stat(path, &st) == 0, "stat: %s", strerror(errno));
	CL_CHECK(st.st_nlink == 2 + *subdirs, "node%d: the directory has %lu links, %u subdirectories",
		 i + 1, (unsigned long)st.st_nlink, *subdirs);
}

void efs_proof_dir_ping_pong(struct efs_cl *c, const char *dir, int nodes)
{
	struct pd_run *r = shared_area(sizeof(*r));
	unsigned made = 0, present = 0, subdirs = 0;

	r->c = c;
	r->dir = dir;
	run_writers(dir_writer, r, nodes, PD_SECS, &r->deadline_ns, &r->e);
	for (int w = 0; w < nodes; w++) {
		for (unsigned k = 0; k < PD_MAX; k++)
			made += r->state[w][k] != PD_NONE;
	}
	for (int i = 0; i < c->n; i++)
		dir_verify(r, nodes, i, &present, &subdirs);
	printf("# %d nodes in one directory for %d s: %u names made (%.0f/s), %u left, %u of "
	       "them directories\n",
	       nodes, PD_SECS, made, (double)made / PD_SECS, present, subdirs);
	CL_CHECK(made > 0, "no name was made");
}
