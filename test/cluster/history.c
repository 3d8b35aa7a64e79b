/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Histories of file system operations (history.h): the runner that makes
 * one, and the linearizability checker.
 *
 * The checker is Wing and Gong's search as Lowe improved it (and as
 * porcupine implements it): the history is a list of call and return
 * events in time order; an operation may be linearized next when its call
 * comes before the first return still in the list; it is tried against the
 * model, and a step is taken only to a (set of linearized operations,
 * model state) pair not seen before, so no state is explored twice; when
 * nothing fits, the search backtracks. It runs per group of paths that
 * renames connect (P-compositionality: no operation touches two groups, so
 * the history is linearizable exactly when each group's part is).
 */
#include "history.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t efs_hist_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- The runner ---- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static unsigned draw(uint64_t *rng, unsigned n)
{
	return (unsigned)(splitmix64(rng) % n);
}

static const uint16_t modes[] = {0600, 0640, 0644, 0660, 0666};

static void on_alarm(int sig)
{
	(void)sig;
}

/* Starts recording |op| (its call time, armed alarm). */
static void op_begin(struct efs_hist_op *op, unsigned timeout_s)
{
	alarm(timeout_s);
	op->call_ns = efs_hist_now_ns();
}

/* Ends |op|: |r| < 0 means the call failed with errno. */
static void op_end(struct efs_hist_op *op, long r)
{
	int e = errno;

	op->ret_ns = efs_hist_now_ns();
	alarm(0);
	op->err = r < 0 ? e : 0;
}

/* What a read of |n| bytes in |buf| observed, block by block. */
static void note_blocks(struct efs_hist_op *op, const unsigned char *buf, size_t n)
{
	for (size_t b = 0; b * EFS_HIST_BLOCK < n && b < EFS_HIST_BLOCKS; b++) {
		const unsigned char *p = buf + b * EFS_HIST_BLOCK;
		size_t len = n - b * EFS_HIST_BLOCK;

		if (len > EFS_HIST_BLOCK)
			len = EFS_HIST_BLOCK;
		op->blk[b] = p[0];
		for (size_t j = 1; j < len; j++)
			if (p[j] != p[0])
				op->blk[b] = EFS_HIST_MIXED;
	}
}

size_t efs_hist_run_proc(const char *dir, int npaths, const struct efs_hist_mix *mix,
			 uint64_t seed, int proc, int node, size_t nops, uint64_t deadline_ns,
			 unsigned op_timeout_s, struct efs_hist_op *log)
{
	const unsigned w[] = {mix->create, mix->write,	  mix->read,  mix->stat,
			      mix->truncate, mix->chmod, mix->rename, mix->unlink};
	struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: EINTR */
	unsigned total = 0;
	uint64_t rng = seed ^ (0x5851f42d4c957f2dull * (uint64_t)(proc + 1));
	unsigned char buf[2 * EFS_HIST_BLOCK * EFS_HIST_BLOCKS];
	size_t used = 0;

	for (size_t k = 0; k < sizeof(w) / sizeof(w[0]); k++)
		total += w[k];
	if (!total)
		return 0;
	sigaction(SIGALRM, &sa, NULL);
	umask(0);
	for (size_t k = 0; k < nops && efs_hist_now_ns() < deadline_ns; k++) {
		/* Every argument is drawn before anything runs, so the
		 * sequence depends on the seed alone. */
		unsigned r = draw(&rng, total), kind = 0;
		int p = (int)draw(&rng, (unsigned)npaths);
		unsigned off = draw(&rng, EFS_HIST_BLOCKS);
		unsigned len = 1 + draw(&rng, EFS_HIST_BLOCKS - off < 4 ? EFS_HIST_BLOCKS - off : 4);
		unsigned fill = 1 + draw(&rng, 255);
		unsigned tlen = draw(&rng, EFS_HIST_BLOCKS + 1);
		uint16_t mode = modes[draw(&rng, sizeof(modes) / sizeof(modes[0]))];
		char path[4096], path2[4096];
		struct efs_hist_op *op = &log[used++];
		struct stat st;
		long res;
		int fd;

		while (r >= w[kind])
			r -= w[kind++];
		snprintf(path, sizeof(path), "%s/p%d", dir, p);
		snprintf(path2, sizeof(path2), "%s/p%d", dir, p ^ 1);
		memset(op, 0, sizeof(*op));
		op->proc = (uint8_t)proc;
		op->node = (uint8_t)node;
		op->path = (uint8_t)p;
		switch (kind) {
		case 0:
			op->kind = EFS_HIST_CREATE;
			op->mode = mode;
			op_begin(op, op_timeout_s);
			fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
			op_end(op, fd);
			if (fd >= 0)
				close(fd);
			break;
		case 1:
		case 2:
			op->kind = kind == 1 ? EFS_HIST_OPEN_W : EFS_HIST_OPEN_R;
			op_begin(op, op_timeout_s);
			fd = open(path, (kind == 1 ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
			op_end(op, fd);
			if (fd < 0)
				break;
			op = &log[used++];
			memset(op, 0, sizeof(*op));
			op->proc = (uint8_t)proc;
			op->node = (uint8_t)node;
			op->path = (uint8_t)p;
			if (kind == 1) {
				op->kind = EFS_HIST_PWRITE;
				op->off = (uint8_t)off;
				op->len = (uint8_t)len;
				op->fill = (uint8_t)fill;
				memset(buf, (int)fill, len * EFS_HIST_BLOCK);
				op_begin(op, op_timeout_s);
				res = pwrite(fd, buf, len * EFS_HIST_BLOCK,
					     (off_t)off * EFS_HIST_BLOCK);
				op_end(op, res);
				if (res >= 0 && res != (long)(len * EFS_HIST_BLOCK))
					op->err = EIO;
			} else {
				op->kind = EFS_HIST_PREAD;
				op_begin(op, op_timeout_s);
				res = pread(fd, buf, sizeof(buf), 0);
				op_end(op, res);
				if (res >= 0) {
					op->size = (uint32_t)res;
					note_blocks(op, buf, (size_t)res);
				}
			}
			close(fd);
			break;
		case 3:
			op->kind = EFS_HIST_STAT;
			op_begin(op, op_timeout_s);
			res = stat(path, &st);
			op_end(op, res);
			if (res == 0) {
				op->size = (uint32_t)st.st_size;
				op->st_mode = (uint16_t)(st.st_mode & 07777);
			}
			break;
		case 4:
			op->kind = EFS_HIST_TRUNCATE;
			op->len = (uint8_t)tlen;
			op_begin(op, op_timeout_s);
			op_end(op, truncate(path, (off_t)tlen * EFS_HIST_BLOCK));
			break;
		case 5:
			op->kind = EFS_HIST_CHMOD;
			op->mode = mode;
			op_begin(op, op_timeout_s);
			op_end(op, chmod(path, mode));
			break;
		case 6:
			op->kind = EFS_HIST_RENAME;
			op->path2 = (uint8_t)(p ^ 1);
			op_begin(op, op_timeout_s);
			op_end(op, rename(path, path2));
			break;
		default:
			op->kind = EFS_HIST_UNLINK;
			op_begin(op, op_timeout_s);
			op_end(op, unlink(path));
			break;
		}
		/* The mount is gone: nothing more to learn from this process. */
		if (op->err == ENOTCONN)
			break;
		if (mix->pause_ms)
			usleep(mix->pause_ms * 1000u);
	}
	return used;
}

/* ---- Reports ---- */

static const char *const kind_names[] = {
	[EFS_HIST_CREATE] = "create",	  [EFS_HIST_OPEN_W] = "open-w", [EFS_HIST_OPEN_R] = "open-r",
	[EFS_HIST_PWRITE] = "pwrite",	  [EFS_HIST_PREAD] = "pread",	[EFS_HIST_STAT] = "stat",
	[EFS_HIST_TRUNCATE] = "truncate", [EFS_HIST_CHMOD] = "chmod",	[EFS_HIST_RENAME] = "rename",
	[EFS_HIST_UNLINK] = "unlink",	  [EFS_HIST_LOOKUP] = "lookup",
};

const char *efs_hist_op_str(const struct efs_hist_op *op, char *buf, size_t size)
{
	char args[64] = "", res[200];
	int n;

	switch (op->kind) {
	case EFS_HIST_CREATE:
	case EFS_HIST_CHMOD:
		snprintf(args, sizeof(args), " %04o", op->mode);
		break;
	case EFS_HIST_PWRITE:
		snprintf(args, sizeof(args), " blocks %u+%u fill %u", op->off, op->len, op->fill);
		break;
	case EFS_HIST_TRUNCATE:
		snprintf(args, sizeof(args), " to %u blocks", op->len);
		break;
	case EFS_HIST_RENAME:
		snprintf(args, sizeof(args), " -> p%u", op->path2);
		break;
	default:
		break;
	}
	if (op->err) {
		snprintf(res, sizeof(res), "%s", strerror(op->err));
	} else if (op->kind == EFS_HIST_STAT) {
		snprintf(res, sizeof(res), "size %u mode %04o", op->size, op->st_mode);
	} else if (op->kind == EFS_HIST_PREAD) {
		n = snprintf(res, sizeof(res), "%u bytes:", op->size);
		for (unsigned b = 0; b * EFS_HIST_BLOCK < op->size && b < EFS_HIST_BLOCKS &&
				     n < (int)sizeof(res) - 8;
		     b++) {
			if (op->blk[b] == EFS_HIST_MIXED)
				n += snprintf(res + n, sizeof(res) - (size_t)n, " mixed");
			else
				n += snprintf(res + n, sizeof(res) - (size_t)n, " %u", op->blk[b]);
		}
	} else {
		snprintf(res, sizeof(res), "ok");
	}
	snprintf(buf, size, "[%.6f-%.6f] proc%u node%u %s p%u%s: %s", (double)op->call_ns / 1e9,
		 (double)op->ret_ns / 1e9, op->proc, op->node + 1, kind_names[op->kind], op->path,
		 args, res);
	return buf;
}

/* ---- The model ---- */

/* Paths per group: a rename pair. */
#define GP	2
#define MAX_INO (GP + EFS_HIST_MAX_PROCS)

struct mino {
	uint16_t id; /* the creating operation's index in its group + 1 */
	uint16_t mode;
	uint8_t size; /* in blocks; every block at or past it is 0 */
	uint8_t blk[EFS_HIST_BLOCKS];
	uint8_t pad;
};

/*
 * The model's state for one group. Canonical, so that equal states are
 * equal bytes: inodes sorted by id, only those a path or a handle names,
 * unused slots zero.
 */
struct mstate {
	uint16_t at[GP];		 /* the inode each path names, 0: none */
	uint16_t h[EFS_HIST_MAX_PROCS]; /* the inode a process has open, 0: none */
	uint16_t nino;
	struct mino ino[MAX_INO];
};

static struct mino *ino_of(struct mstate *s, uint16_t id)
{
	for (unsigned i = 0; i < s->nino; i++)
		if (s->ino[i].id == id)
			return &s->ino[i];
	return NULL;
}

static bool is_named(const struct mstate *s, uint16_t id)
{
	for (int p = 0; p < GP; p++)
		if (s->at[p] == id)
			return true;
	for (int i = 0; i < EFS_HIST_MAX_PROCS; i++)
		if (s->h[i] == id)
			return true;
	return false;
}

/* Drops the inodes nothing names (a file unlinked and closed). */
static void canonical(struct mstate *s)
{
	unsigned k = 0;

	for (unsigned i = 0; i < s->nino; i++)
		if (is_named(s, s->ino[i].id))
			s->ino[k++] = s->ino[i];
	for (unsigned i = k; i < MAX_INO; i++)
		memset(&s->ino[i], 0, sizeof(s->ino[i]));
	s->nino = (uint16_t)k;
}

static int errno_of(const struct mstate *s, int lp)
{
	return s->at[lp] ? 0 : ENOENT;
}

/*
 * A STAT, TRUNCATE or CHMOD of a path is two steps, as in the kernel: the
 * lookup finds the inode (a LOOKUP the checker adds), then the call acts
 * on that inode, through the process's handle slot. A rename or unlink
 * can come between them: chmod(p5) that looked p5 up just before a
 * rename p5 -> p4 changes the mode of p4's inode (the rename holds the
 * inode's lock, the chmod waits for it), on any Linux file system. Those
 * that failed with ENOENT found no name: one step.
 */
static bool two_steps(const struct efs_hist_op *op)
{
	return (op->kind == EFS_HIST_STAT || op->kind == EFS_HIST_TRUNCATE ||
		op->kind == EFS_HIST_CHMOD) &&
	       op->err != ENOENT;
}

/* Whether |op| (a PWRITE or PREAD, or the second step of a STAT, TRUNCATE
 * or CHMOD) failed as EFS_HIST_ORPHAN_IO_MAY_FAIL allows: the inode of
 * its handle has no name in |s|. */
static bool orphan_io_failed(const struct mstate *s, const struct efs_hist_op *op, unsigned flags)
{
	uint16_t id = s->h[op->proc];
	bool io = op->kind == EFS_HIST_PWRITE || op->kind == EFS_HIST_PREAD;

	if (!(flags & EFS_HIST_ORPHAN_IO_MAY_FAIL) || !(io || two_steps(op)) ||
	    (op->err != ESTALE && (!io || op->err != ENOENT)) || !id)
		return false;
	for (int p = 0; p < GP; p++)
		if (s->at[p] == id)
			return false;
	return true;
}

/*
 * Applies |op| (path |lp| of the group; |id| names an inode it creates)
 * to |s| in |out|. Returns whether its observation is what the model
 * says; when |why| is given, it says what the model expected.
 */
static bool step(const struct mstate *s, const struct efs_hist_op *op, int lp, uint16_t id,
		 unsigned flags, struct mstate *out, char *why, size_t why_size)
{
	struct mino *in;
	int want = errno_of(s, lp);
	bool ok = true;

	*out = *s;
	if (why)
		snprintf(why, why_size, "%s", want ? strerror(want) : "ok");
	if (orphan_io_failed(s, op, flags)) {
		out->h[op->proc] = 0;
		canonical(out);
		return true;
	}
	switch (op->kind) {
	case EFS_HIST_CREATE:
		want = s->at[lp] ? EEXIST : 0;
		if (why)
			snprintf(why, why_size, "%s", want ? strerror(want) : "ok");
		if (op->err != want)
			return false;
		if (!want) {
			struct mino *n = &out->ino[out->nino++];

			memset(n, 0, sizeof(*n));
			n->id = id;
			n->mode = op->mode;
			out->at[lp] = id;
			/* Sorted by id: ids grow with the operation's index,
			 * which is not the linearization order. */
			for (unsigned i = out->nino - 1; i > 0 && out->ino[i - 1].id > id; i--) {
				struct mino t = out->ino[i];

				out->ino[i] = out->ino[i - 1];
				out->ino[i - 1] = t;
			}
		}
		return true;
	case EFS_HIST_OPEN_W:
	case EFS_HIST_OPEN_R:
		if (op->err != want)
			return false;
		out->h[op->proc] = s->at[lp];
		canonical(out);
		return true;
	case EFS_HIST_PWRITE:
		in = ino_of(out, s->h[op->proc]);
		if (why)
			snprintf(why, why_size, "%s", in ? "ok" : "no open handle (runner bug)");
		if (!in || op->err)
			return false;
		for (unsigned b = op->off; b < (unsigned)op->off + op->len; b++)
			in->blk[b] = op->fill;
		if (in->size < op->off + op->len)
			in->size = (uint8_t)(op->off + op->len);
		out->h[op->proc] = 0;
		canonical(out);
		return true;
	case EFS_HIST_PREAD:
		in = ino_of(out, s->h[op->proc]);
		if (!in) {
			if (why)
				snprintf(why, why_size, "no open handle (runner bug)");
			return false;
		}
		if (why) {
			int n = snprintf(why, why_size, "%u bytes:", in->size * EFS_HIST_BLOCK);

			for (unsigned b = 0; b < in->size && n < (int)why_size - 8; b++)
				n += snprintf(why + n, why_size - (size_t)n, " %u", in->blk[b]);
		}
		ok = !op->err && op->size == (uint32_t)in->size * EFS_HIST_BLOCK;
		for (unsigned b = 0; ok && b < in->size; b++)
			ok = op->blk[b] == in->blk[b];
		out->h[op->proc] = 0;
		canonical(out);
		return ok;
	case EFS_HIST_LOOKUP:
		if (want)
			return false;
		out->h[op->proc] = s->at[lp];
		return true;
	case EFS_HIST_STAT:
	case EFS_HIST_TRUNCATE:
	case EFS_HIST_CHMOD:
		/* A failed one found no name (one step); else the call on the
		 * inode its lookup step found. */
		if (op->err)
			return op->err == want;
		in = ino_of(out, s->h[op->proc]);
		if (!in) {
			if (why)
				snprintf(why, why_size, "not looked up yet");
			return false;
		}
		if (op->kind == EFS_HIST_STAT) {
			if (why)
				snprintf(why, why_size, "size %u mode %04o",
					 in->size * EFS_HIST_BLOCK, in->mode);
			ok = op->size == (uint32_t)in->size * EFS_HIST_BLOCK &&
			     op->st_mode == in->mode;
		} else if (op->kind == EFS_HIST_CHMOD) {
			in->mode = op->mode;
		} else {
			for (unsigned b = op->len; b < EFS_HIST_BLOCKS; b++)
				in->blk[b] = 0;
			in->size = op->len;
		}
		out->h[op->proc] = 0;
		canonical(out);
		return ok;
	case EFS_HIST_RENAME:
		if (op->err != want)
			return false;
		if (!want) {
			out->at[lp ^ 1] = s->at[lp];
			out->at[lp] = 0;
			canonical(out);
		}
		return true;
	case EFS_HIST_UNLINK:
		if (op->err != want)
			return false;
		out->at[lp] = 0;
		canonical(out);
		return true;
	}
	return false;
}

/* Whether |op|'s errno is one the model can give at all. */
static bool errno_possible(const struct efs_hist_op *op, unsigned flags)
{
	switch (op->kind) {
	case EFS_HIST_CREATE:
		return op->err == 0 || op->err == EEXIST;
	case EFS_HIST_PWRITE:
	case EFS_HIST_PREAD:
		return op->err == 0 || ((flags & EFS_HIST_ORPHAN_IO_MAY_FAIL) &&
					(op->err == ENOENT || op->err == ESTALE));
	case EFS_HIST_STAT:
	case EFS_HIST_TRUNCATE:
	case EFS_HIST_CHMOD:
		return op->err == 0 || op->err == ENOENT ||
		       ((flags & EFS_HIST_ORPHAN_IO_MAY_FAIL) && op->err == ESTALE);
	default:
		return op->err == 0 || op->err == ENOENT;
	}
}

static void describe_state(const struct mstate *s, int group, char *buf, size_t size)
{
	int n = 0;

	for (int p = 0; p < GP && n < (int)size; p++) {
		struct mino *in = ino_of((struct mstate *)s, s->at[p]);

		if (!in) {
			n += snprintf(buf + n, size - (size_t)n, " p%d: none;", group * GP + p);
			continue;
		}
		n += snprintf(buf + n, size - (size_t)n, " p%d: inode #%u mode %04o, %u blocks:",
			      group * GP + p, in->id, in->mode, in->size);
		for (unsigned b = 0; b < in->size && n < (int)size; b++)
			n += snprintf(buf + n, size - (size_t)n, " %u", in->blk[b]);
		n += snprintf(buf + n, size - (size_t)n, ";");
	}
}

/* ---- The search ---- */

struct ev {
	int op; /* index in the group's operations */
	bool ret;
	uint64_t t;
	struct ev *prev, *next;
	struct ev *match; /* a call's return */
};

/* The set of (linearized operations, state) pairs seen: open addressing
 * over an array of entries, each a bitset and a state. */
struct memo {
	size_t words; /* per bitset */
	size_t n, cap;
	unsigned char *ent; /* cap entries of entry_size bytes */
	uint32_t *slot;	    /* index + 1, 0: empty */
	size_t nslot;
	size_t max;
};

/* Where an entry's bitset starts: after its state, 8-byte aligned (entries
 * are a multiple of 8 bytes long, so every bitset is aligned). */
#define BITS_AT (((sizeof(struct mstate) + 7) / 8) * 8)

static size_t entry_size(const struct memo *m)
{
	return BITS_AT + m->words * sizeof(uint64_t);
}

static uint64_t hash_of(const uint64_t *bits, size_t words, const struct mstate *s)
{
	uint64_t h = 1469598103934665603ull;
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0; i < words; i++)
		h = (h ^ bits[i]) * 1099511628211ull;
	for (size_t i = 0; i < sizeof(*s); i++)
		h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

/* Adds the pair; 1 if it is new, 0 if seen, -ENOMEM / -ETIMEDOUT (the
 * memory bound). */
static int memo_add(struct memo *m, const uint64_t *bits, const struct mstate *s)
{
	size_t es = entry_size(m), i;
	uint64_t h;

	if (m->n * 2 >= m->nslot) {
		size_t nn = m->nslot ? m->nslot * 2 : 1024;
		uint32_t *ns = calloc(nn, sizeof(*ns));

		if (!ns)
			return -ENOMEM;
		for (size_t k = 0; k < m->n; k++) {
			const unsigned char *e = m->ent + k * es;

			h = hash_of((const uint64_t *)(e + BITS_AT), m->words,
				    (const struct mstate *)e);
			for (i = h & (nn - 1); ns[i]; i = (i + 1) & (nn - 1))
				;
			ns[i] = (uint32_t)(k + 1);
		}
		free(m->slot);
		m->slot = ns;
		m->nslot = nn;
	}
	h = hash_of(bits, m->words, s);
	for (i = h & (m->nslot - 1); m->slot[i]; i = (i + 1) & (m->nslot - 1)) {
		const unsigned char *e = m->ent + (m->slot[i] - 1) * es;

		if (!memcmp(e, s, sizeof(*s)) &&
		    !memcmp(e + BITS_AT, bits, m->words * sizeof(uint64_t)))
			return 0;
	}
	if (m->n >= m->max)
		return -ETIMEDOUT;
	if (m->n == m->cap) {
		size_t nc = m->cap ? m->cap * 2 : 1024;
		unsigned char *ne = realloc(m->ent, nc * es);

		if (!ne)
			return -ENOMEM;
		m->ent = ne;
		m->cap = nc;
	}
	memcpy(m->ent + m->n * es, s, sizeof(*s));
	memcpy(m->ent + m->n * es + BITS_AT, bits, m->words * sizeof(uint64_t));
	m->slot[i] = (uint32_t)(++m->n);
	return 1;
}

static int ev_cmp(const void *a, const void *b)
{
	const struct ev *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	/* At the same instant a call comes first: the more permissive order. */
	if (x->ret != y->ret)
		return x->ret ? 1 : -1;
	return x->op - y->op;
}

static void lift(struct ev *call)
{
	call->prev->next = call->next;
	if (call->next)
		call->next->prev = call->prev;
	call->match->prev->next = call->match->next;
	if (call->match->next)
		call->match->next->prev = call->match->prev;
}

static void unlift(struct ev *call)
{
	call->match->prev->next = call->match;
	if (call->match->next)
		call->match->next->prev = call->match;
	call->prev->next = call;
	if (call->next)
		call->next->prev = call;
}

/* The group's operations in time order that overlap the second before
 * |stuck| and |stuck| itself (at most 40), for the report. */
static void excerpt(const struct efs_hist_op *ops, const size_t *g, size_t m,
		    const struct efs_hist_op *stuck, char *buf, size_t size)
{
	uint64_t from = stuck->call_ns > 1000000000u ? stuck->call_ns - 1000000000u : 0;
	const struct efs_hist_op *last = NULL;
	int n = snprintf(buf, size, "the operations on these paths around it:\n");

	for (int shown = 0; shown < 40 && n < (int)size; shown++) {
		const struct efs_hist_op *next = NULL;
		char line[400];

		/* The next by call time after |last| (m is small). */
		for (size_t i = 0; i < m; i++) {
			const struct efs_hist_op *o = &ops[g[i]];

			if (o->kind == EFS_HIST_LOOKUP || o->ret_ns < from ||
			    o->call_ns > stuck->ret_ns)
				continue;
			if (last && (o->call_ns < last->call_ns ||
				     (o->call_ns == last->call_ns && o <= last)))
				continue;
			if (!next || o->call_ns < next->call_ns ||
			    (o->call_ns == next->call_ns && o < next))
				next = o;
		}
		if (!next)
			break;
		n += snprintf(buf + n, size - (size_t)n, "  %s\n",
			      efs_hist_op_str(next, line, sizeof(line)));
		last = next;
	}
}

/*
 * EFS_HIST_WRITE_SIZE_LAGS: whether the PREAD |op|, which does not fit
 * |s|, fits it with the blocks below the current size of one PWRITE still
 * in flight (invoked before |op| answered, not yet linearized, through a
 * handle on the same inode) already written and the size not yet moved.
 * The write itself still takes effect whole, later: |next| is |s| after
 * the read alone.
 */
static bool read_sees_a_write_in_flight(const struct mstate *s, const struct efs_hist_op *op,
					const struct efs_hist_op *ops, const size_t *g,
					const struct ev *head, unsigned flags, struct mstate *next)
{
	uint16_t id = s->h[op->proc];

	if (!(flags & EFS_HIST_WRITE_SIZE_LAGS) || op->kind != EFS_HIST_PREAD || !id)
		return false;
	for (const struct ev *e = head->next; e && e->t <= op->ret_ns; e = e->next) {
		const struct efs_hist_op *w = &ops[g[e->op]];
		struct mstate partial = *s, out;
		struct mino *in;

		if (e->ret || w->kind != EFS_HIST_PWRITE || w == op || s->h[w->proc] != id)
			continue;
		in = ino_of(&partial, id);
		for (unsigned b = w->off; b < (unsigned)w->off + w->len && b < in->size; b++)
			in->blk[b] = w->fill;
		if (step(&partial, op, 0, 0, 0, &out, NULL, 0)) {
			*next = *s;
			next->h[op->proc] = 0;
			canonical(next);
			return true;
		}
	}
	return false;
}

struct frame {
	struct ev *call;
	struct mstate state;
};

/* The memory the search may use, over every group (the states' set). */
#define MEMO_BYTES (256u << 20)

/*
 * Checks one group's operations |g| (|m| of them, indices into |ops|).
 * Returns 0, -EINVAL (|report| says why), -ETIMEDOUT, -ENOMEM.
 */
static int check_group(const struct efs_hist_op *ops, const size_t *g, size_t m, int group,
		       unsigned flags, uint64_t deadline_ns, char *report, size_t size,
		       uint64_t *states)
{
	struct ev *evs = calloc(2 * m + 1, sizeof(*evs)), *head, *e;
	struct frame *stack = calloc(m + 1, sizeof(*stack));
	struct memo memo = {.words = m / 64 + 1};
	uint64_t *bits = calloc(memo.words, sizeof(uint64_t));
	struct mstate state, next, best_state;
	size_t depth = 0, best = 0, best_cand[8], nbest_cand = 0, best_first_ret = SIZE_MAX;
	unsigned long iter = 0;
	int rc = 0;

	memset(&state, 0, sizeof(state));
	best_state = state;
	if (!evs || !stack || !bits) {
		rc = -ENOMEM;
		goto out;
	}
	memo.max = MEMO_BYTES / entry_size(&memo);
	for (size_t i = 0; i < m; i++) {
		evs[2 * i] = (struct ev){.op = (int)i, .ret = false, .t = ops[g[i]].call_ns};
		evs[2 * i + 1] = (struct ev){.op = (int)i, .ret = true, .t = ops[g[i]].ret_ns};
	}
	qsort(evs, 2 * m, sizeof(*evs), ev_cmp);
	/* evs[2m] is the list's head. */
	head = &evs[2 * m];
	head->op = -1;
	for (size_t i = 0; i < 2 * m; i++) {
		evs[i].prev = i ? &evs[i - 1] : head;
		evs[i].next = i + 1 < 2 * m ? &evs[i + 1] : NULL;
	}
	head->next = m ? &evs[0] : NULL;
	{
		/* Each call's return: the calls are matched by index. */
		struct ev **call_of = calloc(m, sizeof(*call_of));

		if (!call_of) {
			rc = -ENOMEM;
			goto out;
		}
		for (size_t i = 0; i < 2 * m; i++) {
			if (!evs[i].ret)
				call_of[evs[i].op] = &evs[i];
			else
				call_of[evs[i].op]->match = &evs[i];
		}
		free(call_of);
	}
	e = head->next;
	while (head->next) {
		if (++iter % 4096 == 0 && efs_hist_now_ns() > deadline_ns) {
			rc = -ETIMEDOUT;
			goto out;
		}
		if (!e->ret) {
			const struct efs_hist_op *op = &ops[g[e->op]];

			if (step(&state, op, op->path - group * GP, (uint16_t)(e->op + 1), flags,
				 &next, NULL, 0) ||
			    read_sees_a_write_in_flight(&state, op, ops, g, head, flags, &next)) {
				int r;

				bits[e->op / 64] |= 1ull << (e->op % 64);
				r = memo_add(&memo, bits, &next);
				if (r < 0) {
					rc = r;
					goto out;
				}
				if (r) {
					stack[depth].call = e;
					stack[depth++].state = state;
					state = next;
					lift(e);
					e = head->next;
					continue;
				}
				bits[e->op / 64] &= ~(1ull << (e->op % 64));
			}
			e = e->next;
			continue;
		}
		/* Nothing before this return fits: note the deepest such
		 * point for the report, then backtrack. */
		if (depth >= best) {
			best = depth;
			best_state = state;
			nbest_cand = 0;
			for (struct ev *c = head->next; c && !c->ret && nbest_cand < 8; c = c->next)
				best_cand[nbest_cand++] = g[c->op];
			best_first_ret = g[e->op];
		}
		if (!depth) {
			rc = -EINVAL;
			break;
		}
		depth--;
		e = stack[depth].call;
		state = stack[depth].state;
		bits[e->op / 64] &= ~(1ull << (e->op % 64));
		unlift(e);
		e = e->next;
	}
	if (rc == -EINVAL) {
		char line[400], want[200], st[1200];
		int n;

		describe_state(&best_state, group, st, sizeof(st));
		n = snprintf(report, size,
			     "paths p%d/p%d: no serial order explains %zu operations; at best %zu "
			     "fit, leaving the model at:%s\nthen %s must be done, and none of these "
			     "fits next:\n",
			     group * GP, group * GP + 1, m, best, st,
			     efs_hist_op_str(&ops[best_first_ret], line, sizeof(line)));
		for (size_t k = 0; k < nbest_cand && n < (int)size; k++) {
			const struct efs_hist_op *op = &ops[best_cand[k]];

			step(&best_state, op, op->path - group * GP, 1, flags, &next, want,
			     sizeof(want));
			n += snprintf(report + n, size - (size_t)n, "  %s (the model: %s)\n",
				      efs_hist_op_str(op, line, sizeof(line)), want);
		}
		if (n < (int)size)
			excerpt(ops, g, m, &ops[best_first_ret], report + n, size - (size_t)n);
	}
out:
	if (states)
		*states += memo.n;
	free(memo.ent);
	free(memo.slot);
	free(bits);
	free(stack);
	free(evs);
	return rc;
}

int efs_hist_check(const struct efs_hist_op *ops, size_t n, unsigned flags, uint64_t budget_ms,
		   char *report, size_t size, uint64_t *states)
{
	uint64_t deadline = efs_hist_now_ns() + budget_ms * 1000000u;
	struct efs_hist_op *x = NULL;
	size_t *g = NULL, nx = 0;
	int rc = 0, used = 0, failed = 0;

	report[0] = '\0';
	if (states)
		*states = 0;
	/* An errno the model never gives fails the history by itself. */
	for (size_t i = 0; i < n; i++) {
		char line[400];

		if (errno_possible(&ops[i], flags))
			continue;
		if (!rc)
			used = snprintf(report, size, "operations failed:\n");
		rc = -EINVAL;
		if (++failed > 12)
			continue;
		if (used < (int)size)
			used += snprintf(report + used, size - (size_t)used, "  %s%s\n",
					 efs_hist_op_str(&ops[i], line, sizeof(line)),
					 ops[i].err == EINTR ? " (timed out)" : "");
	}
	if (failed > 12 && used < (int)size)
		snprintf(report + used, size - (size_t)used, "  ... and %d more\n", failed - 12);
	/* The operations, then a LOOKUP for each that takes two steps. */
	for (size_t i = 0; i < n; i++)
		nx += two_steps(&ops[i]);
	x = malloc((n + nx + 1) * sizeof(*x));
	g = malloc((n + nx + 1) * sizeof(*g));
	if (!x || !g) {
		free(x);
		free(g);
		return -ENOMEM;
	}
	memcpy(x, ops, n * sizeof(*x));
	nx = n;
	for (size_t i = 0; i < n; i++) {
		if (!two_steps(&ops[i]))
			continue;
		x[nx] = ops[i];
		x[nx].kind = EFS_HIST_LOOKUP;
		x[nx++].err = 0;
	}
	for (int grp = 0; !rc && grp < EFS_HIST_MAX_PATHS / GP; grp++) {
		size_t m = 0;

		for (size_t i = 0; i < nx; i++)
			if (efs_hist_group(x[i].path) == grp)
				g[m++] = i;
		if (m)
			rc = check_group(x, g, m, grp, flags, deadline, report, size, states);
	}
	if (rc == -ETIMEDOUT)
		snprintf(report, size, "the checker's budget of %llu ms ran out",
			 (unsigned long long)budget_ms);
	free(x);
	free(g);
	return rc;
}
