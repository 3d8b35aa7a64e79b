/* SPDX-License-Identifier: Apache-2.0 */
/*
 * etcfsctl backup / restore. The stream format is docs/FORMAT.md section 6:
 * a fixed header, then records (type, length, payload, CRC32C), one SB
 * record (the device's block 0), META records (key relative to the prefix,
 * value), DATA records (a device block run and its bytes), and an END
 * record with the totals and a CRC32C of every byte before it.
 *
 * Why the pieces are where they are:
 *  - The metadata is read at the revision of a pin/backup.* key that this
 *    command puts first: the maintenance node never compacts past a pin, so
 *    every page of the range read is served at that one revision however
 *    long the copy takes.
 *  - Before it takes its revision the backup asks every mounted node to
 *    publish what it buffers (sync/<id>, efs_backup_request_sync) and waits
 *    for their answers, so everything written before the command started
 *    is in it; for a node that does not answer it waits --settle (2 s,
 *    twice the default --flush-interval) instead.
 *  - Blocks freed after the revision are not reused while the copy runs:
 *    the pin is also the allocators' hold (lib/alloc/alloc.h). As a second
 *    line of defence (a node that does not honour it, a bug), after the
 *    copy the history of every chunk it copied blocks for is checked
 *    (bk_changed): a block freed since the revision must still be free in
 *    its group's map (or named by a free intent) and not mapped again in
 *    its place, or the backup fails.
 *  - restore reads its input twice: once to check everything, once to
 *    write; a stream cannot be checked before it is written, so restore
 *    wants a file.
 */
#include "backup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "etcd/kv.h"
#include "etcd/sync.h"
#include "etcd/txn.h"
#include "meta/keys.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "space/freemap.h"
#include "space/runs.h"
#include "util/clock.h"
#include "util/mem.h"

/* ---- The stream format ---- */

#define BK_MAGIC	  "ETCFSBAK"
#define BK_VERSION	  1u
#define BK_HEADER_SIZE	  160u
#define BK_REC_HEAD	  8u
#define BK_MAX_PAYLOAD	  (8u << 20)
#define BK_DATA_CHUNK	  (1u << 20) /* bytes of device data per DATA record */
#define BK_TXN_OPS	  100	     /* etcd allows 128 operations per transaction */
#define BK_TXN_BYTES	  (1u << 20) /* and 1.5 MiB per request */

enum { REC_SB = 1, REC_META = 2, REC_DATA = 3, REC_END = 0x7f };

struct bk_header {
	uint32_t version, block_size;
	uint8_t uuid[16];
	char name[EFS_META_FSNAME_MAX + 1];
	uint64_t revision, data_start, device_size;
	int64_t created_ns;
};

static void le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static void header_encode(const struct bk_header *h, uint8_t out[BK_HEADER_SIZE])
{
	memset(out, 0, BK_HEADER_SIZE);
	memcpy(out, BK_MAGIC, 8);
	le32(out + 8, h->version);
	le32(out + 12, 0); /* flags */
	le32(out + 16, h->block_size);
	le32(out + 20, BK_HEADER_SIZE);
	memcpy(out + 24, h->uuid, 16);
	memcpy(out + 40, h->name, strlen(h->name));
	le64(out + 120, h->revision);
	le64(out + 128, h->data_start);
	le64(out + 136, h->device_size);
	le64(out + 144, (uint64_t)h->created_ns);
	le32(out + 156, efs_crc32c(0, out, 156));
}

/* 0, or -EUCLEAN with |why|. */
static int header_decode(const uint8_t in[BK_HEADER_SIZE], struct bk_header *h, const char **why)
{
	if (memcmp(in, BK_MAGIC, 8) != 0) {
		*why = "not an etcfs backup (no ETCFSBAK magic)";
		return -EUCLEAN;
	}
	if (get32(in + 156) != efs_crc32c(0, in, 156)) {
		*why = "header checksum mismatch";
		return -EUCLEAN;
	}
	h->version = get32(in + 8);
	if (h->version != BK_VERSION) {
		*why = "unsupported backup format version";
		return -EUCLEAN;
	}
	if (get32(in + 12) != 0 || get32(in + 20) != BK_HEADER_SIZE ||
	    !memchr(in + 40, 0, EFS_META_FSNAME_MAX + 1)) {
		*why = "unknown header flags or size";
		return -EUCLEAN;
	}
	h->block_size = get32(in + 16);
	memcpy(h->uuid, in + 24, 16);
	memcpy(h->name, in + 40, EFS_META_FSNAME_MAX + 1); /* NUL-terminated, checked above */
	h->revision = get64(in + 120);
	h->data_start = get64(in + 128);
	h->device_size = get64(in + 136);
	h->created_ns = (int64_t)get64(in + 144);
	if (!efs_meta_fsname_is_valid(h->name) || h->block_size < 1024 ||
	    h->block_size > 65536 || (h->block_size & (h->block_size - 1)) || !h->revision) {
		*why = "impossible header fields";
		return -EUCLEAN;
	}
	return 0;
}

/* ---- Progress: a bar on a terminal, plain lines otherwise (stderr) ---- */

struct progress {
	const char *what;
	uint64_t total, done;
	double t0, last;
	bool tty;
	int last_tenth;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void progress_print(struct progress *p, bool final)
{
	double el = now_s() - p->t0;
	double rate = el > 0 ? (double)p->done / el : 0;
	double frac = p->total ? (double)p->done / (double)p->total : 1;
	double left = rate > 0 && p->total > p->done ? (double)(p->total - p->done) / rate : 0;
	char bar[31];

	if (frac > 1)
		frac = 1;
	if (p->tty) {
		int fill = (int)(frac * 30);

		for (int i = 0; i < 30; i++)
			bar[i] = i < fill ? '#' : '.';
		bar[30] = '\0';
		fprintf(stderr, "\r%-9s [%s] %3d%% %8.1f MiB/s  %d:%02d left ", p->what, bar,
			(int)(frac * 100), rate / 1048576.0, (int)left / 60, (int)left % 60);
		if (final)
			fputc('\n', stderr);
	} else {
		fprintf(stderr, "%s: %" PRIu64 " of %" PRIu64 " MiB (%d%%), %.1f MiB/s, %d s left\n",
			p->what, p->done >> 20, p->total >> 20, (int)(frac * 100),
			rate / 1048576.0, (int)left);
	}
	fflush(stderr);
}

static void progress_start(struct progress *p, const char *what, uint64_t total)
{
	*p = (struct progress){.what = what, .total = total, .t0 = now_s(), .last_tenth = -1};
	p->tty = isatty(STDERR_FILENO);
	p->last = p->t0;
}

static void progress_add(struct progress *p, uint64_t n)
{
	double t = now_s();
	int tenth;

	p->done += n;
	tenth = p->total ? (int)(p->done * 10 / p->total) : 10;
	/* Plain lines only for a copy that lasts: a small one says nothing
	 * before its summary. */
	if (p->tty ? t - p->last >= 0.2
		   : t - p->t0 >= 1 && ((tenth != p->last_tenth && tenth < 10) || t - p->last >= 5)) {
		p->last = t;
		p->last_tenth = tenth;
		progress_print(p, false);
	}
}

static void progress_done(struct progress *p)
{
	if (p->tty)
		progress_print(p, true);
}

/* ---- Buffered output with the running stream checksum ---- */

struct out {
	int fd;
	uint8_t *buf;
	size_t len, cap;
	uint32_t crc;	/* CRC32C of every byte written so far */
	uint64_t bytes; /* bytes written so far */
};

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int out_flush(struct out *o)
{
	int r = write_all(o->fd, o->buf, o->len);

	o->len = 0;
	return r;
}

static int out_put(struct out *o, const void *p, size_t n)
{
	const uint8_t *b = p;

	o->crc = efs_crc32c(o->crc, p, n);
	o->bytes += n;
	while (n) {
		size_t k = o->cap - o->len < n ? o->cap - o->len : n;
		int r;

		memcpy(o->buf + o->len, b, k);
		o->len += k;
		b += k;
		n -= k;
		if (o->len == o->cap) {
			r = out_flush(o);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

/* One record: |head| bytes then |body| bytes form the payload. */
static int out_record(struct out *o, int type, const void *head, size_t head_len,
		      const void *body, size_t body_len)
{
	uint8_t rh[BK_REC_HEAD] = {(uint8_t)type}, c[4];
	uint32_t crc;
	int r;

	le32(rh + 4, (uint32_t)(head_len + body_len));
	crc = efs_crc32c(0, rh, sizeof(rh));
	crc = efs_crc32c(crc, head, head_len);
	crc = efs_crc32c(crc, body, body_len);
	le32(c, crc);
	r = out_put(o, rh, sizeof(rh));
	if (r == 0)
		r = out_put(o, head, head_len);
	if (r == 0)
		r = out_put(o, body, body_len);
	if (r == 0)
		r = out_put(o, c, 4);
	return r;
}

/* ---- Block runs ---- */

struct run {
	uint64_t start, count;
};

struct runs {
	struct run *v;
	size_t n, cap;
};

static int runs_add(struct runs *rs, uint64_t start, uint64_t count)
{
	if (rs->n == rs->cap) {
		size_t cap = rs->cap ? rs->cap * 2 : 256;
		struct run *v = efs_mem_realloc(rs->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		rs->v = v;
		rs->cap = cap;
	}
	rs->v[rs->n++] = (struct run){start, count};
	return 0;
}

static int run_cmp(const void *a, const void *b)
{
	const struct run *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* Sorts and merges overlapping and adjacent runs; returns the block total. */
static uint64_t runs_merge(struct runs *rs)
{
	size_t w = 0;
	uint64_t total = 0;

	if (!rs->n)
		return 0;
	qsort(rs->v, rs->n, sizeof(*rs->v), run_cmp);
	for (size_t i = 1; i < rs->n; i++) {
		struct run *last = &rs->v[w];

		if (rs->v[i].start <= last->start + last->count) {
			uint64_t end = rs->v[i].start + rs->v[i].count;

			if (end > last->start + last->count)
				last->count = end - last->start;
		} else {
			rs->v[++w] = rs->v[i];
		}
	}
	rs->n = w + 1;
	for (size_t i = 0; i < rs->n; i++)
		total += rs->v[i].count;
	return total;
}

/* The first block of |need| (merged) not inside |have| (merged), or
 * UINT64_MAX when every block is. */
static uint64_t runs_first_missing(const struct runs *need, const struct runs *have)
{
	size_t j = 0;

	for (size_t i = 0; i < need->n; i++) {
		uint64_t b = need->v[i].start, end = b + need->v[i].count;

		while (b < end) {
			while (j < have->n && have->v[j].start + have->v[j].count <= b)
				j++;
			if (j == have->n || have->v[j].start > b)
				return b;
			b = have->v[j].start + have->v[j].count;
		}
	}
	return UINT64_MAX;
}

/* Adds the blocks of an ExtentChunk value (preallocated extents read as
 * zeroes and are not copied). -EBADMSG/-EUCLEAN for a chunk that does not
 * decode, -ERANGE for an extent outside |dev_blocks|. */
static int runs_add_chunk(struct runs *rs, const uint8_t *v, size_t len, uint64_t dev_blocks)
{
	Etcfs__ExtentChunk *ch = NULL;
	int r = efs_meta_extent_chunk_decode(v, len, &ch, NULL);

	if (r < 0)
		return r;
	for (size_t i = 0; i < ch->n_extents && r == 0; i++) {
		const Etcfs__Extent *e = ch->extents[i];

		if (e->flags & EFS_META_EXTENT_F_PREALLOC)
			continue;
		if (e->dev_block >= dev_blocks || e->count > dev_blocks - e->dev_block)
			r = -ERANGE;
		else
			r = runs_add(rs, e->dev_block, e->count);
	}
	efs_meta_record_free(ch);
	return r;
}

/* ---- Options shared by both commands ---- */

enum { OPT_ETCD = 0x100, OPT_HELP, OPT_SETTLE, OPT_FORCE, OPT_RETRIES, OPT_SYNC_TIMEOUT };

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void catch_signals(void)
{
	struct sigaction sa = {.sa_handler = on_signal};

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* Parses the options; the positionals go to |pos| (exactly |npos|).
 * Returns -1 to go on, else the exit status. */
/* SECONDS (fractions allowed, 0 to 3600) of option --|name| into |ret_ms|.
 * Returns -1 to go on, else the exit status. */
static int parse_seconds(const char *prog, const char *name, const char *s, uint32_t *ret_ms)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || v < 0 || v > 3600) {
		fprintf(stderr, "%s: --%s '%s': seconds from 0 to 3600\n", prog, name, s);
		return EFS_BACKUP_EXIT_USAGE;
	}
	*ret_ms = (uint32_t)(v * 1000 + 0.5);
	return -1;
}

static int parse_args(const char *prog, int argc, char **argv, struct efs_cli_etcd *conn,
		      uint32_t *settle_ms, uint32_t *sync_ms, bool *force, unsigned *retries,
		      const char **pos, int npos, void (*help)(const char *))
{
	static const struct option longopts[] = {
		EFS_CLI_ETCD_LONGOPTS(OPT_ETCD),
		{"help", no_argument, NULL, OPT_HELP},
		{"settle", required_argument, NULL, OPT_SETTLE},
		{"force", no_argument, NULL, OPT_FORCE},
		{"retries", required_argument, NULL, OPT_RETRIES},
		{"sync-timeout", required_argument, NULL, OPT_SYNC_TIMEOUT},
		{NULL, 0, NULL, 0},
	};
	char err[EFS_CLI_ERR_MAX] = "";
	int opt, idx, r;

	r = efs_cli_etcd_defaults(conn, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		return EFS_BACKUP_EXIT_USAGE;
	}
	for (;;) {
		idx = 0;
		opt = getopt_long(argc, argv, "", longopts, &idx);
		if (opt == -1)
			break;
		if (opt == OPT_ETCD) {
			r = efs_cli_etcd_option(conn, longopts[idx].name, optarg, err, sizeof(err));
			if (r < 0) {
				efs_cli_print_err(prog, r, err);
				return EFS_BACKUP_EXIT_USAGE;
			}
		} else if (opt == OPT_HELP) {
			help(prog);
			return EFS_BACKUP_EXIT_OK;
		} else if (opt == OPT_RETRIES && retries) {
			char *end;
			unsigned long v;

			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || end == optarg || *end || optarg[0] == '-' || v > 100) {
				fprintf(stderr, "%s: --retries '%s': a number from 0 to 100\n", prog,
					optarg);
				return EFS_BACKUP_EXIT_USAGE;
			}
			*retries = (unsigned)v;
		} else if (opt == OPT_FORCE && force) {
			*force = true;
		} else if ((opt == OPT_SETTLE && settle_ms) || (opt == OPT_SYNC_TIMEOUT && sync_ms)) {
			r = parse_seconds(prog, longopts[idx].name, optarg,
					  opt == OPT_SETTLE ? settle_ms : sync_ms);
			if (r >= 0)
				return r;
		} else {
			fprintf(stderr, "Try '%s %s --help'.\n", prog, argv[0]);
			return EFS_BACKUP_EXIT_USAGE;
		}
	}
	if (argc - optind != npos) {
		fprintf(stderr, "%s: %s wants %d arguments (see --help)\n", prog, argv[0], npos);
		return EFS_BACKUP_EXIT_USAGE;
	}
	for (int i = 0; i < npos; i++)
		pos[i] = argv[optind + i];
	r = efs_cli_etcd_finish(conn, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		return EFS_BACKUP_EXIT_USAGE;
	}
	return -1;
}

/* ---- backup ---- */

static void usage_backup(const char *prog)
{
	printf("Usage: %s backup [OPTIONS] DEVICE OUTPUT\n"
	       "\n"
	       "Copies filesystem DEVICE (its superblock names the keyspace) into one backup:\n"
	       "the metadata at one etcd revision and every device block that revision's\n"
	       "extents reference. OUTPUT is a file (created; an existing one is refused), a\n"
	       "directory (the file NAME-REVISION.etcfs-backup is created in it) or - for\n"
	       "stdout. The filesystem may stay mounted: the command first asks every\n"
	       "mounted node to publish what it buffers (a sync/ key the nodes watch) and\n"
	       "waits for their answers, at most --sync-timeout seconds; for nodes that do\n"
	       "not answer it says so and waits --settle seconds (default 2: twice the nodes'\n"
	       "default --flush-interval) instead. Then it pins the revision it reads\n"
	       "(pin/backup.*) so that compaction keeps it while the copy runs; the nodes do\n"
	       "not reuse blocks freed after that revision while the pin exists.\n"
	       "\n"
	       "  --sync-timeout SECONDS  how long to wait for the nodes' answers (default\n"
	       "                     10; 0: ask nobody, wait --settle)\n"
	       "  --settle SECONDS   wait before taking the revision when a node did not\n"
	       "                     answer (default 2; 0: none)\n"
	       "  --retries N        start again, at most N times (default 2), when blocks the\n"
	       "                     copy needed were freed and reused while it ran, which\n"
	       "                     only a node that does not hold them allows (a file\n"
	       "                     OUTPUT only; on stdout such a backup fails at once)\n"
	       "\n"
	       "%s\n"
	       "Exit status: 0 success; 2 usage error; 3 cannot connect to etcd; 4 failed.\n",
	       prog, efs_cli_etcd_usage());
}

struct bk {
	const char *prog;
	struct efs_etcd_sync *s;
	struct efs_meta_ns ns;
	struct efs_sb sb;
	int fd, dfd; /* the device, buffered and O_DIRECT (-1 when refused) */
	uint8_t *io;   /* BK_DATA_CHUNK bytes, aligned */
	struct out o;
	struct runs runs;
	int64_t rev;
	uint64_t keys, skipped, data_records, blocks;
	/* The extent chunks at b->rev that reference blocks: keys (packed)
	 * and mod revisions, in key order, to tell after the copy whether any
	 * of them changed meanwhile. */
	uint8_t *ck;
	size_t ck_len, ck_cap;
	struct chunk_seen {
		size_t off, len;
		int64_t mod;
		bool suspect; /* changed or gone since b->rev */
	} *cs;
	size_t ncs, cs_cap, cs_next;
	uint64_t changed; /* chunks that dropped copied blocks since b->rev */
	/* Copied blocks freed since b->rev (bk_changed), the part of them in
	 * the group being read, what of it that group shows free (its map and
	 * free intents), and the blocks found reused. */
	struct efs_runs freed, gpart, gfree;
	uint64_t reused;
	uint64_t ag_blocks;
	/* Every extent of inode |mapped_ino|'s chunks now (chunk_freed): a
	 * chunk that splits moves extents to a new chunk key, not freeing
	 * them. */
	struct bk_ext {
		uint64_t file_block, dev_block, count;
	} *mapped;
	size_t nmapped, mapped_cap;
	uint64_t mapped_ino; /* 0: none read */
	char pin_name[64];
	bool pinned;
	char err[EFS_CLI_ERR_MAX];
};

/* Reads |len| bytes at |off| of the device, O_DIRECT when it allows. */
static int dev_read(struct bk *b, uint64_t off, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = -1;

		if (b->dfd >= 0) {
			n = pread(b->dfd, b->io + done, len - done, (off_t)(off + done));
			if (n < 0 && errno == EINVAL) {
				close(b->dfd);
				b->dfd = -1;
			}
		}
		if (b->dfd < 0)
			n = pread(b->fd, b->io + done, len - done, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -EIO; /* the device is shorter than its extents */
		done += (size_t)n;
	}
	return 0;
}

/* Puts pin/<name> = the current revision: compaction keeps every revision
 * from it on. The revision of that put is the backup's. */
static int bk_pin(struct bk *b)
{
	struct efs_meta_key k, sbk;
	int64_t cur = 0, put_rev = 0;
	char val[32];
	int r;

	/* Put again (a later revision) under the same name: the key stays
	 * from the first put to the end, and with it the nodes' stop of
	 * in-place overwrites. */
	if (!b->pinned)
		snprintf(b->pin_name, sizeof(b->pin_name), EFS_META_PIN_BACKUP "%ld.%ld",
			 (long)getpid(), (long)time(NULL));
	r = efs_meta_key_sb(&b->ns, &sbk);
	if (r == 0)
		r = efs_meta_key_pin(&b->ns, b->pin_name, &k);
	if (r < 0)
		return r;
	r = efs_etcd_sync_get(b->s, sbk.buf, sbk.len, NULL, &cur);
	if (r < 0)
		return r;
	snprintf(val, sizeof(val), "%" PRId64, cur);
	r = efs_etcd_sync_put(b->s, k.buf, k.len, val, strlen(val), 0, &put_rev);
	if (r < 0)
		return r;
	b->pinned = true;
	b->rev = put_rev;
	return 0;
}

static void bk_unpin(struct bk *b)
{
	struct efs_meta_key k;

	if (!b->pinned || efs_meta_key_pin(&b->ns, b->pin_name, &k) < 0)
		return;
	if (efs_etcd_sync_delete(b->s, k.buf, k.len, false, NULL) < 0)
		fprintf(stderr, "%s: could not delete the pin %.*s (compaction stays held until it is deleted)\n",
			b->prog, (int)k.len, (const char *)k.buf);
	b->pinned = false;
}

/* Remembers an extent chunk's key and mod revision (bk_changed). */
static int chunk_note(struct bk *b, const Mvccpb__KeyValue *kv)
{
	if (b->ck_len + kv->key.len > b->ck_cap) {
		size_t cap = (b->ck_cap ? b->ck_cap * 2 : 65536) + kv->key.len;
		uint8_t *n = efs_mem_realloc(b->ck, cap);

		if (!n)
			return -ENOMEM;
		b->ck = n;
		b->ck_cap = cap;
	}
	if (b->ncs == b->cs_cap) {
		size_t cap = b->cs_cap ? b->cs_cap * 2 : 1024;
		struct chunk_seen *n = efs_mem_realloc(b->cs, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		b->cs = n;
		b->cs_cap = cap;
	}
	memcpy(b->ck + b->ck_len, kv->key.data, kv->key.len);
	b->cs[b->ncs++] = (struct chunk_seen){b->ck_len, kv->key.len, kv->mod_revision, false};
	b->ck_len += kv->key.len;
	return 0;
}

static int key_cmp(const uint8_t *a, size_t al, const uint8_t *c, size_t cl)
{
	int d = memcmp(a, c, al < cl ? al : cl);

	return d ? d : (al > cl) - (al < cl);
}

/*
 * One key of e/ now, in key order: every remembered chunk before it is
 * gone (deleted since), and the one equal to it changed if its mod
 * revision did.
 */
static void chunk_check(struct bk *b, const Mvccpb__KeyValue *kv)
{
	while (b->cs_next < b->ncs) {
		struct chunk_seen *c = &b->cs[b->cs_next];
		int d = key_cmp(b->ck + c->off, c->len, kv->key.data, kv->key.len);

		if (d > 0)
			return;
		b->cs_next++;
		if (d < 0 || c->mod != kv->mod_revision)
			c->suspect = true;
		if (d == 0)
			return;
	}
}

/* Families of session state (they ride a lease when written: a stale key
 * without one is an fsck finding, not something to restore) and pins. */
static bool is_session_state(enum efs_meta_family f)
{
	switch (f) {
	case EFS_META_K_HOLDER:
	case EFS_META_K_RECALL:
	case EFS_META_K_OPEN:
	case EFS_META_K_PLOCK:
	case EFS_META_K_NODE:
	case EFS_META_K_AG_OWNER:
	case EFS_META_K_MAINT:
	case EFS_META_K_PIN:
	case EFS_META_K_HANDOVER:
	case EFS_META_K_SYNC:
	case EFS_META_K_SYNC_ACK:
		return true;
	default:
		return false;
	}
}

/* One key of the snapshot: a META record, and its extents' blocks. */
static int bk_kv(struct bk *b, const Mvccpb__KeyValue *kv)
{
	struct efs_meta_key_info ki;
	uint8_t head[2];
	size_t rel;
	int r;

	if (kv->key.len < b->ns.len || memcmp(kv->key.data, b->ns.prefix, b->ns.len) != 0)
		return 0;
	r = efs_meta_key_parse(&b->ns, kv->key.data, kv->key.len, &ki);
	/* Session state (holders, open references, owners, nodes, the
	 * maintenance election) rides leases that a restore cannot bring
	 * back; pins are this and other tools' own. */
	if (kv->lease != 0 || (r == 0 && is_session_state(ki.family))) {
		b->skipped++;
		return 0;
	}
	if (r == 0 && ki.family == EFS_META_K_EXTENT) {
		size_t before = b->runs.n;

		r = runs_add_chunk(&b->runs, kv->value.data, kv->value.len,
				   b->sb.device_size / b->sb.block_size);
		if (r == 0 && b->runs.n > before)
			r = chunk_note(b, kv);
		if (r == -ENOMEM)
			return r;
		if (r < 0) {
			snprintf(b->err, sizeof(b->err),
				 "extent chunk %.*s %s; run fsck.etcfs first", (int)kv->key.len,
				 (const char *)kv->key.data,
				 r == -ERANGE ? "points outside the device" : "does not decode");
			return -EUCLEAN;
		}
	}
	rel = kv->key.len - b->ns.len;
	if (kv->value.len > BK_MAX_PAYLOAD - 2 - rel) {
		snprintf(b->err, sizeof(b->err), "value of %.*s too large", (int)kv->key.len,
			 (const char *)kv->key.data);
		return -EFBIG;
	}
	uint8_t *rec = efs_mem_malloc(2 + rel);

	if (!rec)
		return -ENOMEM;
	le16(head, (uint16_t)rel);
	memcpy(rec, head, 2);
	memcpy(rec + 2, kv->key.data + b->ns.len, rel);
	r = out_record(&b->o, REC_META, rec, 2 + rel, kv->value.data, kv->value.len);
	efs_mem_free(rec);
	if (r < 0) {
		snprintf(b->err, sizeof(b->err), "writing the backup: %s", strerror(-r));
		return r;
	}
	b->keys++;
	return 0;
}

/*
 * Reads |range| at revision |rev| (0: the latest, then every page at the
 * first page's) in pages, calling |cb| for each key-value in key order.
 */
static int bk_range(struct bk *b, const struct efs_meta_range *range, int64_t rev, bool keys_only,
		    int (*cb)(struct bk *b, const Mvccpb__KeyValue *kv))
{
	uint8_t start[EFS_META_KEY_MAX + 1];
	size_t start_len;
	int r;

	memcpy(start, range->key.buf, range->key.len);
	start_len = range->key.len;
	for (;;) {
		Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
		struct efs_etcd_range_opts ro = {
			.range_end = range->end.buf,
			.range_end_len = range->end.len,
			.limit = EFS_CLI_PAGE,
			.revision = rev,
			.keys_only = keys_only,
		};
		Etcdserverpb__RangeResponse *resp;
		ProtobufCMessage *m;
		bool more;

		if (interrupted)
			return -EINTR;
		r = efs_etcd_range_fill(&req, start, start_len, &ro, NULL);
		if (r < 0)
			return r;
		r = efs_etcd_sync_call(b->s, EFS_ETCD_RANGE, &req.base, &m, NULL);
		if (r < 0) {
			snprintf(b->err, sizeof(b->err), "reading the keyspace at revision %" PRId64 ": %s",
				 rev, efs_etcd_sync_last_message(b->s));
			return r;
		}
		resp = (Etcdserverpb__RangeResponse *)m;
		if (!rev && resp->header)
			rev = resp->header->revision;
		for (size_t i = 0; i < resp->n_kvs && r == 0; i++)
			r = cb(b, resp->kvs[i]);
		more = resp->more && resp->n_kvs > 0;
		if (r == 0 && more) {
			const Mvccpb__KeyValue *last = resp->kvs[resp->n_kvs - 1];

			if (last->key.len > EFS_META_KEY_MAX) {
				r = -EUCLEAN;
			} else {
				memcpy(start, last->key.data, last->key.len);
				start[last->key.len] = 0;
				start_len = last->key.len + 1;
			}
		}
		protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
		if (r < 0 || !more)
			return r;
	}
}

static int chunk_check_cb(struct bk *b, const Mvccpb__KeyValue *kv)
{
	chunk_check(b, kv);
	return 0;
}

/* Reads one key at |rev| (0: latest): 1 with *ret (caller frees), 0 when
 * absent, or -errno. */
static int get_at(struct bk *b, const uint8_t *key, size_t len, int64_t rev,
		  Etcdserverpb__RangeResponse **ret)
{
	Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
	struct efs_etcd_range_opts ro = {.revision = rev};
	ProtobufCMessage *m;
	int r = efs_etcd_range_fill(&req, key, len, &ro, NULL);

	if (r == 0)
		r = efs_etcd_sync_call(b->s, EFS_ETCD_RANGE, &req.base, &m, NULL);
	if (r < 0) {
		snprintf(b->err, sizeof(b->err), "reading an extent chunk's history: %s",
			 efs_etcd_sync_last_message(b->s));
		return r;
	}
	*ret = (Etcdserverpb__RangeResponse *)m;
	if ((*ret)->n_kvs == 1)
		return 1;
	protobuf_c_message_free_unpacked(m, efs_mem_protobuf());
	*ret = NULL;
	return 0;
}

/*
 * Appends to |out| the device blocks of |old|'s written extents that chunk
 * value |v| (NULL: none, the chunk is gone) does not map at the same file
 * block. An undecodable |v| maps nothing.
 */
static int chunk_lacking(const Etcfs__ExtentChunk *old, const uint8_t *v, size_t len,
			 struct efs_runs *out)
{
	Etcfs__ExtentChunk *ch = NULL;
	int r = 0;

	if (v && efs_meta_extent_chunk_decode(v, len, &ch, NULL) < 0)
		ch = NULL;
	for (size_t i = 0; r == 0 && i < old->n_extents; i++) {
		const Etcfs__Extent *e = old->extents[i];
		struct efs_runs left = {0};

		if (e->flags & EFS_META_EXTENT_F_PREALLOC)
			continue;
		r = efs_runs_add(&left, e->dev_block, e->count);
		for (size_t j = 0; r == 0 && ch && j < ch->n_extents; j++) {
			const Etcfs__Extent *x = ch->extents[j];

			if (x->dev_block - x->file_block == e->dev_block - e->file_block)
				r = efs_runs_subtract(&left, x->dev_block, x->count, NULL);
		}
		if (r == 0)
			r = efs_runs_append(out, &left);
		efs_runs_done(&left);
	}
	if (ch)
		efs_meta_record_free(ch);
	return r;
}

/* One chunk of the inode being read (inode_mapped): its extents. */
static int mapped_cb(struct bk *b, const Mvccpb__KeyValue *kv)
{
	Etcfs__ExtentChunk *ch = NULL;

	if (efs_meta_extent_chunk_decode(kv->value.data, kv->value.len, &ch, NULL) < 0)
		return 0; /* maps nothing */
	for (size_t i = 0; i < ch->n_extents; i++) {
		if (b->nmapped == b->mapped_cap) {
			size_t cap = b->mapped_cap ? 2 * b->mapped_cap : 256;
			struct bk_ext *n = efs_mem_realloc(b->mapped, cap * sizeof(*n));

			if (!n) {
				efs_meta_record_free(ch);
				return -ENOMEM;
			}
			b->mapped = n;
			b->mapped_cap = cap;
		}
		b->mapped[b->nmapped++] = (struct bk_ext){ch->extents[i]->file_block,
							  ch->extents[i]->dev_block,
							  ch->extents[i]->count};
	}
	efs_meta_record_free(ch);
	return 0;
}

/*
 * Removes from |gone| (device blocks |old| mapped and its chunk no longer
 * does) those that a chunk of the same inode maps now at the same file
 * block: moved by a split, not freed. The inode's chunks are read once for
 * consecutive chunks of one inode.
 */
static int still_mapped(struct bk *b, const uint8_t *key, size_t len,
			const Etcfs__ExtentChunk *old, struct efs_runs *gone)
{
	struct efs_meta_key_info ki;
	struct efs_meta_range range;
	int r;

	if (efs_meta_key_parse(&b->ns, key, len, &ki) < 0 || ki.family != EFS_META_K_EXTENT)
		return 0;
	if (b->mapped_ino != ki.ino) {
		b->nmapped = 0;
		b->mapped_ino = 0;
		r = efs_meta_range_ino(&b->ns, EFS_META_K_EXTENT, ki.ino, &range);
		if (r == 0)
			r = bk_range(b, &range, 0, false, mapped_cb);
		if (r < 0)
			return r;
		b->mapped_ino = ki.ino;
	}
	r = 0;
	for (size_t i = 0; r == 0 && i < old->n_extents; i++) {
		const Etcfs__Extent *e = old->extents[i];

		for (size_t j = 0; r == 0 && j < b->nmapped; j++) {
			const struct bk_ext *x = &b->mapped[j];
			uint64_t lo, hi;

			if (x->dev_block - x->file_block != e->dev_block - e->file_block)
				continue;
			lo = x->dev_block > e->dev_block ? x->dev_block : e->dev_block;
			hi = x->dev_block + x->count < e->dev_block + e->count
				     ? x->dev_block + x->count
				     : e->dev_block + e->count;
			if (lo < hi)
				r = efs_runs_subtract(gone, lo, hi - lo, NULL);
		}
	}
	return r;
}

/*
 * The chunk |key| changed or went since b->rev. Walking its history back
 * from the latest version (the pin keeps it): the blocks it mapped at
 * b->rev and no longer maps now, nor does another chunk of the inode
 * (a split), were freed since, and go to b->freed for bk_reused; a block
 * missing from some version in between but mapped in its place again now
 * was freed and reused, which the hold forbids (b->reused). b->changed
 * counts the chunks that dropped blocks. 0 or -errno.
 */
static int chunk_freed(struct bk *b, const uint8_t *key, size_t len)
{
	Etcdserverpb__RangeResponse *at = NULL, *cur = NULL;
	Etcfs__ExtentChunk *old = NULL;
	struct efs_runs now = {0}, then = {0}, gone = {0};
	int64_t rev = 0;
	bool latest = true;
	int r;

	r = get_at(b, key, len, b->rev, &at);
	if (r <= 0)
		return r;
	r = efs_meta_extent_chunk_decode(at->kvs[0]->value.data, at->kvs[0]->value.len, &old,
					 NULL);
	protobuf_c_message_free_unpacked(&at->base, efs_mem_protobuf());
	if (r < 0)
		return 0; /* copied as it was; restore's check judges it */
	for (;;) {
		const Mvccpb__KeyValue *kv;

		r = get_at(b, key, len, rev, &cur);
		if (r < 0)
			break;
		kv = r ? cur->kvs[0] : NULL;
		if (kv && kv->mod_revision <= b->rev) {
			r = 0; /* back at the backup's version */
			break;
		}
		efs_runs_clear(&then);
		r = chunk_lacking(old, kv ? kv->value.data : NULL, kv ? kv->value.len : 0,
				  latest ? &now : &then);
		if (r == 0 && latest) {
			r = efs_runs_normalize(&now);
			if (r == 0)
				r = efs_runs_append(&gone, &now);
			if (r == 0 && gone.n)
				r = still_mapped(b, key, len, old, &gone);
			if (r == 0 && gone.n) {
				b->changed++;
				r = efs_runs_append(&b->freed, &gone);
			}
		} else if (r == 0 && efs_runs_normalize(&then) == 0 &&
			   efs_runs_remove_all(&then, &now, NULL) == 0 && then.n) {
			b->reused += efs_runs_total(&then);
			fprintf(stderr,
				"%s: an extent chunk dropped device block %" PRIu64
				" after the backup's revision and maps it in its place again\n",
				b->prog, then.v[0].start);
		}
		latest = false;
		if (r < 0 || !kv)
			break; /* absent in some version: deleted (or created) since */
		rev = kv->mod_revision - 1;
		protobuf_c_message_free_unpacked(&cur->base, efs_mem_protobuf());
		cur = NULL;
	}
	if (cur)
		protobuf_c_message_free_unpacked(&cur->base, efs_mem_protobuf());
	efs_runs_done(&now);
	efs_runs_done(&then);
	efs_runs_done(&gone);
	efs_meta_record_free(old);
	return r;
}

/* One key of a group's range (bk_reused): its map's free runs and its free
 * intents' runs go to b->gfree. */
static int group_free_cb(struct bk *b, const Mvccpb__KeyValue *kv)
{
	struct efs_meta_key_info ki;
	int r = 0;

	if (efs_meta_key_parse(&b->ns, kv->key.data, kv->key.len, &ki) < 0)
		return 0;
	if (ki.family == EFS_META_K_AG_MAP) {
		Etcfs__AgMap *m = NULL;
		struct efs_freemap fm;

		if (efs_meta_ag_map_decode(kv->value.data, kv->value.len, &m, NULL) < 0)
			return 0; /* nothing shown free: its blocks count as reused */
		r = efs_freemap_from_msg(&fm, m);
		efs_meta_record_free(m);
		if (r < 0)
			return r == -ENOMEM ? r : 0;
		r = efs_runs_append(&b->gfree, &fm.free);
		efs_freemap_done(&fm);
	} else if (ki.family == EFS_META_K_FREE_INTENT) {
		Etcfs__FreeIntent *fi = NULL;

		if (efs_meta_free_intent_decode(kv->value.data, kv->value.len, &fi, NULL) < 0)
			return 0;
		for (size_t i = 0; r == 0 && i < fi->n_runs; i++)
			r = efs_runs_add(&b->gfree, fi->runs[i]->start, fi->runs[i]->len);
		efs_meta_record_free(fi);
	}
	return r;
}

/*
 * Whether the copied blocks freed since b->rev (b->freed) are still free:
 * each group they lie in is read now (its map and free intents), and a
 * block it shows in use was handed out again while the pin held it
 * (b->reused). A reuse not yet published leaves no trace here.
 */
static int bk_reused(struct bk *b)
{
	uint64_t ds = b->sb.data_start, agb = b->ag_blocks;
	size_t i = 0;
	int r = efs_runs_normalize(&b->freed);

	if (r == -EUCLEAN)
		r = 0; /* a block two chunks mapped: sorted, checked twice */
	while (r == 0 && i < b->freed.n && agb) {
		uint64_t g = (b->freed.v[i].start - ds) / agb, gs = ds + g * agb;
		struct efs_meta_range range;

		efs_runs_clear(&b->gpart);
		efs_runs_clear(&b->gfree);
		for (; r == 0 && i < b->freed.n && b->freed.v[i].start < gs + agb; i++) {
			uint64_t s = b->freed.v[i].start, e = s + b->freed.v[i].len;

			if (e > gs + agb) {
				/* The rest is in the next group. */
				b->freed.v[i].start = gs + agb;
				b->freed.v[i].len = e - (gs + agb);
				e = gs + agb;
				r = efs_runs_add(&b->gpart, s - gs, e - s);
				break;
			}
			r = efs_runs_add(&b->gpart, s - gs, e - s);
		}
		if (r == 0)
			r = efs_meta_range_group(&b->ns, (uint32_t)g, &range);
		if (r == 0)
			r = bk_range(b, &range, 0, false, group_free_cb);
		for (size_t k = 0; r == 0 && k < b->gfree.n; k++)
			r = efs_runs_subtract(&b->gpart, b->gfree.v[k].start, b->gfree.v[k].len,
					      NULL);
		if (r == 0 && b->gpart.n) {
			b->reused += efs_runs_total(&b->gpart);
			fprintf(stderr,
				"%s: device block %" PRIu64
				" was freed after the backup's revision and is in use again\n",
				b->prog, gs + b->gpart.v[0].start);
		}
	}
	return r;
}

/*
 * After the copy: whether any extent chunk that referenced copied blocks
 * at b->rev has changed or gone since. Blocks are freed only by the
 * transaction that changes (or deletes) the chunk referencing them, so
 * when none has, no copied block was freed. Those that were are held by
 * the allocators while the pin exists; that they are still free, and not
 * mapped again, is checked here (b->reused) rather than trusted.
 */
static int bk_changed(struct bk *b)
{
	struct efs_meta_range range;
	int r = efs_meta_range_family(&b->ns, EFS_META_K_EXTENT, &range);

	if (r == 0)
		r = bk_range(b, &range, 0, true, chunk_check_cb);
	for (size_t i = b->cs_next; i < b->ncs; i++)
		b->cs[i].suspect = true; /* past the last key now: gone */
	/* A chunk that changed may only have gained extents (a publication
	 * of appended data): only a version without one of its blocks means
	 * the block was freed. */
	for (size_t i = 0; r == 0 && i < b->ncs; i++)
		if (b->cs[i].suspect)
			r = chunk_freed(b, b->ck + b->cs[i].off, b->cs[i].len);
	if (r == 0 && b->freed.n)
		r = bk_reused(b);
	return r;
}

static int bk_blocks(struct bk *b)
{
	uint32_t bs = b->sb.block_size;
	uint64_t per = BK_DATA_CHUNK / bs;
	struct progress p;
	int r;

	b->blocks = runs_merge(&b->runs);
	progress_start(&p, "backup", b->blocks * bs);
	for (size_t i = 0; i < b->runs.n; i++) {
		uint64_t blk = b->runs.v[i].start, left = b->runs.v[i].count;

		while (left) {
			uint64_t n = left < per ? left : per;
			uint8_t head[16] = {0};

			if (interrupted)
				return -EINTR;
			r = dev_read(b, blk * bs, (size_t)(n * bs));
			if (r < 0) {
				snprintf(b->err, sizeof(b->err), "reading device block %" PRIu64 ": %s",
					 blk, strerror(-r));
				return r;
			}
			le64(head, blk);
			le32(head + 8, (uint32_t)n);
			r = out_record(&b->o, REC_DATA, head, 16, b->io, (size_t)(n * bs));
			if (r < 0) {
				snprintf(b->err, sizeof(b->err), "writing the backup: %s",
					 strerror(-r));
				return r;
			}
			b->data_records++;
			progress_add(&p, n * bs);
			blk += n;
			left -= n;
		}
	}
	progress_done(&p);
	return 0;
}

static int bk_trailer(struct bk *b)
{
	uint8_t t[40] = {0};

	le64(t, b->keys);
	le64(t + 8, b->data_records);
	le64(t + 16, b->blocks);
	le64(t + 24, b->o.bytes);
	le32(t + 32, b->o.crc);
	return out_record(&b->o, REC_END, t, sizeof(t), NULL, 0);
}

/* ---- Publication request (sync/<id>) ---- */

#define SYNC_POLL_MS  50
#define SYNC_NODES_MAX 256

struct sync_nodes {
	const struct efs_meta_ns *ns;
	uint32_t n;
	char node[SYNC_NODES_MAX][EFS_META_NODE_MAX + 1];
	bool ok[SYNC_NODES_MAX];
	bool cow[SYNC_NODES_MAX];     /* mounted -o cow: never overwrites in place */
	char why[SYNC_NODES_MAX][64]; /* an answer other than "ok" */
};

/* One n/ key: a node with a session, to be waited for. */
static int sync_node_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct sync_nodes *sn = arg;
	struct efs_meta_key_info ki;

	Etcfs__NodeInfo *ni = NULL;

	if (efs_meta_key_parse(sn->ns, kv->key.data, kv->key.len, &ki) < 0 ||
	    ki.family != EFS_META_K_NODE || sn->n == SYNC_NODES_MAX)
		return 0;
	/* A record that does not decode is taken as overwriting in place. */
	if (efs_meta_nodeinfo_decode(kv->value.data, kv->value.len, &ni, NULL) == 0) {
		sn->cow[sn->n] = ni->cow;
		efs_meta_record_free(ni);
	}
	memcpy(sn->node[sn->n++], ki.node, sizeof(ki.node));
	return 0;
}

/* Nodes that did not answer (an error answer comes after the node
 * stopped overwriting in place) and may overwrite in place: each named. */
static uint32_t sync_inplace(const char *prog, const struct sync_nodes *sn)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < sn->n; i++) {
		if (sn->ok[i] || sn->why[i][0] || sn->cow[i])
			continue;
		fprintf(stderr,
			"%s: node %s may overwrite blocks in place (it did not answer and is not"
			" mounted with -o cow): a copy now could hold blocks it rewrote half-way\n",
			prog, sn->node[i]);
		n++;
	}
	return n;
}

/* One sync/<id>/<node> answer. */
static int sync_ack_cb(const Mvccpb__KeyValue *kv, void *arg)
{
	struct sync_nodes *sn = arg;
	struct efs_meta_key_info ki;

	if (efs_meta_key_parse(sn->ns, kv->key.data, kv->key.len, &ki) < 0 ||
	    ki.family != EFS_META_K_SYNC_ACK)
		return 0;
	for (uint32_t i = 0; i < sn->n; i++) {
		if (strcmp(sn->node[i], ki.node) || sn->ok[i] || sn->why[i][0])
			continue;
		if (kv->value.len == 2 && !memcmp(kv->value.data, "ok", 2))
			sn->ok[i] = true;
		else
			snprintf(sn->why[i], sizeof(sn->why[i]), "%.*s",
				 (int)(kv->value.len < 60 ? kv->value.len : 60),
				 (const char *)kv->value.data);
	}
	return 0;
}

static uint32_t sync_answered(const struct sync_nodes *sn)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < sn->n; i++)
		n += sn->ok[i] || sn->why[i][0];
	return n;
}

static int sync_lease(struct efs_etcd_sync *s, int64_t ttl_s, int64_t *ret)
{
	Etcdserverpb__LeaseGrantRequest rq = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	int r;

	rq.ttl = ttl_s;
	r = efs_etcd_sync_call(s, EFS_ETCD_LEASE_GRANT, &rq.base, &resp, NULL);
	if (r == 0)
		*ret = ((Etcdserverpb__LeaseGrantResponse *)resp)->id;
	if (resp)
		protobuf_c_message_free_unpacked(resp, efs_mem_protobuf());
	return r;
}

static void sync_lease_revoke(struct efs_etcd_sync *s, int64_t lease)
{
	Etcdserverpb__LeaseRevokeRequest rq = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;

	rq.id = lease;
	(void)efs_etcd_sync_call(s, EFS_ETCD_LEASE_REVOKE, &rq.base, &resp, NULL);
	if (resp)
		protobuf_c_message_free_unpacked(resp, efs_mem_protobuf());
}

int efs_backup_request_sync(const char *prog, struct efs_etcd_sync *s,
			    const struct efs_meta_ns *ns, uint32_t timeout_ms, uint32_t *ret_inplace)
{
	struct sync_nodes *sn;
	struct efs_meta_range nodes, acks;
	struct efs_meta_key k;
	char id[EFS_META_NODE_MAX + 1], err[EFS_CLI_ERR_MAX] = "";
	uint64_t deadline;
	int64_t lease = 0;
	uint32_t missing;
	int r;

	if (ret_inplace)
		*ret_inplace = 0;
	if (!timeout_ms && !ret_inplace)
		return 1;
	sn = efs_mem_calloc(1, sizeof(*sn));
	if (!sn) {
		fprintf(stderr, "%s: asking the nodes to publish: %s\n", prog, strerror(ENOMEM));
		return 1;
	}
	sn->ns = ns;
	snprintf(id, sizeof(id), "req.%ld.%ld", (long)getpid(), (long)time(NULL));
	r = efs_meta_range_family(ns, EFS_META_K_NODE, &nodes);
	if (r == 0)
		r = efs_cli_range_foreach(s, &nodes, false, sync_node_cb, sn, err, sizeof(err));
	if (r == 0 && !sn->n)
		goto out; /* not mounted: nothing is buffered */
	if (r == 0 && !timeout_ms) {
		/* Nobody asked: only the -o cow nodes are known not to
		 * overwrite in place. */
		*ret_inplace = sync_inplace(prog, sn);
		efs_mem_free(sn);
		return 1;
	}
	if (r == 0)
		r = efs_meta_key_sync(ns, id, &k);
	if (r == 0)
		r = efs_meta_range_sync_acks(ns, id, &acks);
	/* The request lives on a lease, so that it goes when we die. */
	if (r == 0)
		r = sync_lease(s, timeout_ms / 1000 + 10, &lease);
	if (r == 0)
		r = efs_etcd_sync_put(s, k.buf, k.len, "", 0, lease, NULL);
	if (r < 0) {
		fprintf(stderr, "%s: asking the nodes to publish: %s\n", prog,
			err[0] ? err : efs_etcd_sync_last_message(s));
		missing = 1;
		if (ret_inplace)
			*ret_inplace = sync_inplace(prog, sn);
		goto out_lease;
	}
	deadline = efs_clock_mono_ns() + (uint64_t)timeout_ms * 1000000;
	while (sync_answered(sn) < sn->n && efs_clock_mono_ns() < deadline && !interrupted) {
		struct timespec ts = {0, SYNC_POLL_MS * 1000000L};

		nanosleep(&ts, NULL);
		err[0] = '\0';
		if (efs_cli_range_foreach(s, &acks, false, sync_ack_cb, sn, err, sizeof(err)) < 0)
			break;
	}
	missing = sn->n - sync_answered(sn);
	for (uint32_t i = 0; i < sn->n; i++) {
		if (sn->why[i][0]) {
			missing++;
			fprintf(stderr, "%s: node %s could not publish what it buffers (%s)\n",
				prog, sn->node[i], sn->why[i]);
		} else if (!sn->ok[i]) {
			fprintf(stderr,
				"%s: node %s did not answer the request to publish within %.1f s\n",
				prog, sn->node[i], timeout_ms / 1000.0);
		}
	}
	if (ret_inplace)
		*ret_inplace = sync_inplace(prog, sn);
	(void)efs_etcd_sync_delete(s, acks.key.buf, acks.key.len, true, NULL);
	(void)efs_etcd_sync_delete(s, k.buf, k.len, false, NULL);
out_lease:
	if (lease)
		sync_lease_revoke(s, lease);
	efs_mem_free(sn);
	return (int)missing;
out:
	if (r < 0)
		fprintf(stderr, "%s: listing the mounted nodes: %s\n", prog, err);
	efs_mem_free(sn);
	return r < 0 ? 1 : 0;
}

int efs_backup_cmd(const char *prog, int argc, char **argv)
{
	struct efs_cli_etcd conn = {0};
	struct efs_cli_device dev = {.fd = -1};
	struct bk b = {.prog = prog, .fd = -1, .dfd = -1, .o.fd = -1};
	uint32_t settle_ms = 2000, sync_ms = 10000;
	unsigned retries = 2, attempt = 0;
	const char *pos[2];
	char path[PATH_MAX] = "", partial[PATH_MAX + 16] = "";
	Etcfs__FsInfo *fi = NULL;
	struct bk_header h = {0};
	uint8_t hb[BK_HEADER_SIZE];
	double t0 = now_s();
	struct stat st;
	int ret, r;

	ret = parse_args(prog, argc, argv, &conn, &settle_ms, &sync_ms, NULL, &retries, pos, 2,
			 usage_backup);
	if (ret >= 0)
		goto out;
	ret = EFS_BACKUP_EXIT_FAILED;
	catch_signals();
	if (!strcmp(pos[1], "-") && isatty(STDOUT_FILENO)) {
		fprintf(stderr, "%s: refusing to write a backup to a terminal\n", prog);
		ret = EFS_BACKUP_EXIT_USAGE;
		goto out;
	}
	r = efs_cli_etcd_connect(&conn, &b.s, b.err, sizeof(b.err));
	if (r < 0) {
		efs_cli_print_err(prog, r, b.err);
		ret = EFS_BACKUP_EXIT_NOCONNECT;
		goto out;
	}
	r = efs_cli_device_open(pos[0], false, &dev, b.err, sizeof(b.err));
	if (r == 0)
		r = efs_cli_check_fs(b.s, &dev, &b.sb, NULL, &fi, b.err, sizeof(b.err));
	if (r < 0) {
		efs_cli_print_err(prog, r, b.err);
		goto out;
	}
	b.fd = dev.fd;
	b.dfd = open(pos[0], O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (efs_meta_ns_init(&b.ns, b.sb.name) < 0 ||
	    posix_memalign((void **)&b.io, 4096, BK_DATA_CHUNK) != 0) {
		b.io = NULL;
		goto out;
	}
	b.o.cap = 1u << 20;
	b.o.buf = efs_mem_malloc(b.o.cap);
	if (!b.o.buf)
		goto out;
	/* Block 0 before anything: the SB record comes first. */
	r = dev_read(&b, 0, EFS_SB_SIZE);
	if (r < 0) {
		fprintf(stderr, "%s: reading the superblock of %s: %s\n", prog, pos[0],
			strerror(-r));
		goto out;
	}
	/*
	 * The pin first: a node that sees the request stops overwriting in
	 * place and stays so while a backup pin exists. Then the nodes
	 * publish what they buffer; those that do not answer get the settle,
	 * unless one may overwrite in place (not mounted -o cow): nothing
	 * after the copy could tell a block it rewrote during the copy, so
	 * the backup fails rather than be torn.
	 */
	r = bk_pin(&b);
	if (r < 0) {
		fprintf(stderr, "%s: pinning a revision of %s: %s\n", prog, b.sb.name,
			efs_etcd_sync_last_message(b.s));
		goto out;
	}
	{
		uint32_t inplace = 0;
		int missing = efs_backup_request_sync(prog, b.s, &b.ns, sync_ms, &inplace);

		if (inplace) {
			fprintf(stderr,
				"%s: backup of %s failed: %u mounted node%s may overwrite in place"
				" during the copy (named above); mount %s with -o cow, or retry"
				" when %s\n",
				prog, b.sb.name, inplace, inplace == 1 ? "" : "s",
				inplace == 1 ? "it" : "them",
				inplace == 1 ? "it answers" : "they answer");
			goto out;
		}
		if (missing > 0 && settle_ms) {
			struct timespec ts = {settle_ms / 1000,
					      (long)(settle_ms % 1000) * 1000000L};

			fprintf(stderr, "%s: waiting --settle %.1f s for them instead\n", prog,
				settle_ms / 1000.0);
			while (nanosleep(&ts, &ts) < 0 && errno == EINTR && !interrupted)
				;
		}
	}
again:
	t0 = now_s(); /* the rate counts the copy, not the settle */
	r = bk_pin(&b);
	if (r < 0) {
		fprintf(stderr, "%s: pinning a revision of %s: %s\n", prog, b.sb.name,
			efs_etcd_sync_last_message(b.s));
		goto out;
	}
	if (!strcmp(pos[1], "-")) {
		b.o.fd = STDOUT_FILENO;
		snprintf(path, sizeof(path), "(stdout)");
	} else {
		if (stat(pos[1], &st) == 0 && S_ISDIR(st.st_mode))
			snprintf(path, sizeof(path), "%s/%s-%" PRId64 ".etcfs-backup", pos[1],
				 b.sb.name, b.rev);
		else
			snprintf(path, sizeof(path), "%s", pos[1]);
		if (access(path, F_OK) == 0) {
			fprintf(stderr, "%s: %s exists; not overwriting it\n", prog, path);
			goto out;
		}
		snprintf(partial, sizeof(partial), "%s.partial", path);
		b.o.fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (b.o.fd < 0) {
			fprintf(stderr, "%s: cannot create %s: %s\n", prog, partial, strerror(errno));
			partial[0] = '\0';
			goto out;
		}
	}
	h.version = BK_VERSION;
	h.block_size = b.sb.block_size;
	memcpy(h.uuid, b.sb.uuid, 16);
	snprintf(h.name, sizeof(h.name), "%s", b.sb.name);
	h.revision = (uint64_t)b.rev;
	h.data_start = b.sb.data_start;
	b.ag_blocks = fi->ag_blocks;
	h.device_size = fi->device_size > b.sb.device_size ? fi->device_size : b.sb.device_size;
	b.sb.device_size = h.device_size; /* extents may reach a grown end */
	{
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		h.created_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
	}
	header_encode(&h, hb);
	r = out_put(&b.o, hb, sizeof(hb));
	if (r == 0)
		r = out_record(&b.o, REC_SB, b.io, EFS_SB_SIZE, NULL, 0);
	if (r < 0) {
		fprintf(stderr, "%s: writing %s: %s\n", prog, path, strerror(-r));
		goto out;
	}
	b.err[0] = '\0';
	{
		struct efs_meta_range range;

		r = efs_meta_range_fs(&b.ns, &range);
		if (r == 0)
			r = bk_range(&b, &range, b.rev, false, bk_kv);
	}
#if EFS_FAULT_HOOKS
	/* ETCFS_FAULT_BACKUP_PAUSE_MS=N (tests): a pause between the metadata
	 * and the blocks, so that a test can free blocks in between. */
	if (r == 0 && getenv("ETCFS_FAULT_BACKUP_PAUSE_MS")) {
		long ms = atol(getenv("ETCFS_FAULT_BACKUP_PAUSE_MS"));
		struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

		if (ms > 0 && ms < 600000)
			nanosleep(&ts, NULL);
	}
#endif
	if (r == 0)
		r = bk_blocks(&b);
	if (r == 0)
		r = bk_changed(&b);
	if (r == 0 && b.reused && partial[0] && attempt < retries) {
		/* A file can start over at a new revision. */
		fprintf(stderr,
			"%s: %" PRIu64 " copied blocks were reused while they were copied;"
			" starting again at a new revision (%u of %u)\n",
			prog, b.reused, attempt + 1, retries);
		close(b.o.fd);
		b.o.fd = -1;
		unlink(partial);
		partial[0] = '\0';
		b.o.len = 0;
		b.o.crc = 0;
		b.o.bytes = 0;
		b.runs.n = 0;
		b.ck_len = b.ncs = b.cs_next = 0;
		b.keys = b.skipped = b.data_records = b.blocks = b.changed = b.reused = 0;
		efs_runs_clear(&b.freed);
		b.mapped_ino = 0;
		attempt++;
		goto again;
	}
	if (r == 0 && b.reused) {
		/* No trailer: a stream cut here is refused by restore. */
		snprintf(b.err, sizeof(b.err),
			 "%" PRIu64 " blocks freed after the backup's revision (files overwritten,"
			 " truncated or deleted) were in use again before the copy ended, although"
			 " the backup's pin holds them (a node that does not honour the hold?); the"
			 " backup is not exact (and has no trailer, so restore refuses it)",
			 b.reused);
		r = -EAGAIN;
	}
	if (r == 0)
		r = bk_trailer(&b);
	if (r == 0)
		r = out_flush(&b.o);
	if (r == 0 && partial[0] && fsync(b.o.fd) < 0)
		r = -errno;
	if (r < 0) {
		if (r == -EINTR)
			fprintf(stderr, "%s: interrupted\n", prog);
		else
			fprintf(stderr, "%s: backup of %s failed: %s\n", prog, b.sb.name,
				b.err[0] ? b.err : strerror(-r));
		goto out;
	}
	if (partial[0]) {
		if (close(b.o.fd) < 0 || rename(partial, path) < 0) {
			b.o.fd = -1;
			fprintf(stderr, "%s: finishing %s: %s\n", prog, path, strerror(errno));
			goto out;
		}
		b.o.fd = -1;
		partial[0] = '\0';
	}
	{
		double el = now_s() - t0;
		double mib = (double)(b.blocks * b.sb.block_size) / 1048576.0;

		if (b.changed)
			fprintf(stderr,
				"%s: %" PRIu64 " extent chunks dropped blocks during the copy; "
				"the blocks were held and are still free\n",
				prog, b.changed);
		fprintf(stderr,
			"backup of %s at revision %" PRId64 ": %" PRIu64 " keys, %" PRIu64
			" blocks (%.1f MiB), %" PRIu64 " bytes in %.1f s (%.1f MiB/s) -> %s\n",
			b.sb.name, b.rev, b.keys, b.blocks, mib, b.o.bytes, el,
			el > 0 ? mib / el : 0, path);
	}
	ret = EFS_BACKUP_EXIT_OK;
out:
	if (b.s)
		bk_unpin(&b);
	if (partial[0]) {
		if (b.o.fd >= 0)
			close(b.o.fd);
		unlink(partial);
	}
	efs_mem_free(b.o.buf);
	efs_mem_free(b.runs.v);
	efs_mem_free(b.ck);
	efs_mem_free(b.cs);
	efs_runs_done(&b.freed);
	efs_runs_done(&b.gpart);
	efs_runs_done(&b.gfree);
	efs_mem_free(b.mapped);
	free(b.io);
	if (b.dfd >= 0)
		close(b.dfd);
	efs_cli_device_close(&dev);
	efs_meta_record_free(fi);
	efs_etcd_sync_close(b.s);
	efs_cli_etcd_free(&conn);
	return ret;
}

/* ---- restore ---- */

static void usage_restore(const char *prog)
{
	printf("Usage: %s restore [OPTIONS] BACKUP DEVICE\n"
	       "\n"
	       "Restores a file made by '%s backup' onto DEVICE and the etcd the options\n"
	       "name. The whole file is checked first (every record's CRC32C, the trailer's\n"
	       "totals and stream checksum, and that every block the extents reference is in\n"
	       "it); a truncated, corrupt or metadata-only backup is refused before anything\n"
	       "is written. Refused too: a keyspace /etcfs/NAME/ that holds any key, a DEVICE\n"
	       "mounted or open in another process here, or whose filesystem has sessions\n"
	       "(n/ keys) in etcd, a DEVICE smaller than the backed-up one, and a DEVICE\n"
	       "holding another filesystem (another UUID) whose keyspace is in this etcd\n"
	       "(--force overwrites that one). Then the blocks are written back to their\n"
	       "offsets, the keys are put in transactions of at most %d operations (\"sb\"\n"
	       "last), and the superblock is written.\n"
	       "Session state (locks, open files, group owners) is not restored; groups are\n"
	       "claimable at once. Run fsck.etcfs afterwards to confirm.\n"
	       "\n"
	       "  --force            overwrite a device holding another, live, filesystem\n"
	       "\n"
	       "%s\n"
	       "Exit status: 0 success; 1 refused (bad backup, or target in use); 2 usage\n"
	       "error; 3 cannot connect to etcd; 4 failed midway.\n",
	       prog, prog, BK_TXN_OPS, efs_cli_etcd_usage());
}

/* Buffered input with the running stream checksum. */
struct in {
	int fd;
	uint8_t *buf;
	size_t pos, len, cap;
	uint32_t crc;
	uint64_t off;
};

/* Reads exactly |n| bytes: 0, -ENODATA at a clean end of file before the
 * first byte, -EPIPE for an end of file inside, -errno. */
static int in_read(struct in *in, void *dst, size_t n)
{
	uint8_t *d = dst;
	size_t got = 0;

	while (got < n) {
		if (in->pos == in->len) {
			ssize_t k = read(in->fd, in->buf, in->cap);

			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				return -errno;
			if (k == 0)
				return got ? -EPIPE : -ENODATA;
			in->pos = 0;
			in->len = (size_t)k;
		}
		size_t c = in->len - in->pos < n - got ? in->len - in->pos : n - got;

		memcpy(d + got, in->buf + in->pos, c);
		in->pos += c;
		got += c;
	}
	in->crc = efs_crc32c(in->crc, dst, n);
	in->off += n;
	return 0;
}

/* What a pass over the file found. */
struct scan {
	struct bk_header h;
	uint8_t sbblock[EFS_SB_SIZE];
	struct efs_sb sb;
	bool has_sb, has_sb_key, has_end;
	uint64_t metas, datas, blocks;
	struct runs need, have;
	/* Inodes whose record has link count 0, and orphan records (start:
	 * the inode), in key order. */
	struct runs nlink0, orphans;
};

struct rs {
	const char *prog;
	const char *src;
	struct efs_etcd_sync *s;
	struct efs_meta_ns ns;
	int devfd;
	struct efs_etcd_txn *t;
	size_t t_ops, t_bytes;
	uint8_t *sbval; /* the "sb" key's value, put last */
	size_t sbval_len;
	uint64_t keys_put, txns, closed_files;
	/* Orphans (link count 0, open when backed up) whose openers are not
	 * restored: start = inode, count = 1 once a chunk of it was seen. */
	struct runs closed;
	char err[EFS_CLI_ERR_MAX];
};

/* The entry of |ino| in R->closed, or NULL. */
static struct run *closed_find(struct rs *R, uint64_t ino)
{
	struct run key = {ino, 0};

	if (!R->closed.n)
		return NULL;
	return bsearch(&key, R->closed.v, R->closed.n, sizeof(key), run_cmp);
}

static int rs_txn_send(struct rs *R)
{
	Etcdserverpb__TxnResponse *resp = NULL;
	int r;

	if (!R->t)
		return 0;
	r = efs_etcd_sync_txn(R->s, efs_etcd_txn_request(R->t), &resp);
	R->t = efs_etcd_txn_free(R->t);
	if (r < 0) {
		snprintf(R->err, sizeof(R->err), "putting the keys: %s",
			 efs_etcd_sync_last_message(R->s));
		return r;
	}
	r = resp->succeeded ? 0 : -EEXIST;
	protobuf_c_message_free_unpacked(&resp->base, efs_mem_protobuf());
	if (r < 0)
		snprintf(R->err, sizeof(R->err),
			 "filesystem %s appeared in etcd while restoring; stopped", R->ns.name);
	R->txns++;
	return r;
}

/* Adds a put to the current transaction (which compares "sb" absent, so a
 * concurrent mkfs or restore makes it fail), sending it when full. */
static int rs_put(struct rs *R, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	struct efs_meta_key sbk;
	int r;

	if (R->t && (R->t_ops + 1 >= BK_TXN_OPS || R->t_bytes + klen + vlen > BK_TXN_BYTES)) {
		r = rs_txn_send(R);
		if (r < 0)
			return r;
	}
	if (!R->t) {
		r = efs_meta_key_sb(&R->ns, &sbk);
		if (r == 0)
			r = efs_etcd_txn_new(&R->t, 0);
		if (r == 0)
			r = efs_etcd_txn_compare(R->t, EFS_ETCD_CMP_CREATE, EFS_ETCD_CMP_EQUAL,
						 sbk.buf, sbk.len, 0);
		if (r < 0)
			return r;
		R->t_ops = 0;
		R->t_bytes = 0;
	}
	r = efs_etcd_txn_put(R->t, EFS_ETCD_TXN_SUCCESS, key, klen, val, vlen, 0);
	if (r < 0)
		return r;
	R->t_ops++;
	R->t_bytes += klen + vlen;
	R->keys_put++;
	return 0;
}

/* One META record during the write pass. */
static int rs_meta(struct rs *R, const uint8_t *p, size_t len)
{
	uint8_t key[EFS_META_KEY_MAX];
	struct efs_meta_key_info ki;
	size_t rel = get16(p), klen = R->ns.len + rel;
	const uint8_t *val = p + 2 + rel;
	size_t vlen = len - 2 - rel;
	ProtobufCBinaryData packed = {0};
	int r;

	memcpy(key, R->ns.prefix, R->ns.len);
	memcpy(key + R->ns.len, p + 2, rel);
	r = efs_meta_key_parse(&R->ns, key, klen, &ki);
	/*
	 * An orphan's openers are sessions, not restored: the file is put
	 * back as its last close would have left it (the inode, its xattrs
	 * and the orphan record gone, a reclaim record when it has chunks,
	 * which stay until a node frees them).
	 */
	if (r == 0 && (ki.family == EFS_META_K_INODE || ki.family == EFS_META_K_XATTR ||
		       ki.family == EFS_META_K_ORPHAN || ki.family == EFS_META_K_EXTENT)) {
		struct run *c = closed_find(R, ki.ino);

		if (c && ki.family == EFS_META_K_EXTENT) {
			c->count = 1;
		} else if (c && ki.family == EFS_META_K_ORPHAN) {
			Etcfs__Reclaim rc = ETCFS__RECLAIM__INIT;
			struct efs_meta_key rk;
			struct timespec ts;

			R->closed_files++;
			if (!c->count)
				return 0;
			clock_gettime(CLOCK_REALTIME, &ts);
			rc.since_ns = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
			r = efs_meta_key_reclaim(&R->ns, ki.ino, &rk);
			if (r == 0)
				r = efs_meta_pack(&rc.base, &packed);
			if (r == 0)
				r = rs_put(R, rk.buf, rk.len, packed.data, packed.len);
			efs_mem_free(packed.data);
			return r;
		} else if (c) {
			return 0;
		}
	}
	if (r == 0 && ki.family == EFS_META_K_SB) {
		R->sbval = efs_mem_malloc(vlen ? vlen : 1);
		if (!R->sbval)
			return -ENOMEM;
		memcpy(R->sbval, val, vlen);
		R->sbval_len = vlen;
		return 0;
	}
	if (r == 0 && ki.family == EFS_META_K_AG_FREE) {
		Etcfs__AgFree *af = NULL;

		/* Its last owner is a node of the backed-up filesystem: without
		 * this the restored groups would wait out the dead-node grace. */
		if (efs_meta_ag_free_decode(val, vlen, &af, NULL) == 0) {
			Etcfs__AgLastOwner *last = af->last;

			af->last = NULL;
			r = efs_meta_pack(&af->base, &packed);
			af->last = last; /* freed with the record */
			efs_meta_record_free(af);
			if (r < 0)
				return r;
			val = packed.data;
			vlen = packed.len;
		}
	}
	if (r == 0 && ki.family == EFS_META_K_FREE_INTENT) {
		Etcfs__FreeIntent *fi = NULL;

		/* No read of the node that freed them can be in flight on this
		 * device: drained, so the first owner folds them at once
		 * instead of after the dead-node grace. */
		if (efs_meta_free_intent_decode(val, vlen, &fi, NULL) == 0 && !fi->drained) {
			fi->drained = true;
			r = efs_meta_pack(&fi->base, &packed);
			if (r == 0) {
				val = packed.data;
				vlen = packed.len;
			}
		}
		efs_meta_record_free(fi);
		if (r < 0)
			return r;
	}
	r = rs_put(R, key, klen, val, vlen);
	efs_mem_free(packed.data);
	return r;
}

/*
 * One pass over the backup: checks everything; with |R| also writes (the
 * blocks to the device, the keys to etcd). 0, -EUCLEAN with |err| for a bad
 * backup, or another -errno.
 */
static int rs_pass(int fd, struct scan *sc, struct rs *R, struct progress *p, char *err,
		   size_t err_size)
{
	struct in in = {.fd = fd, .cap = 1u << 20};
	uint8_t hb[BK_HEADER_SIZE], rh[BK_REC_HEAD], cb[4], *pl = NULL;
	const char *why = NULL;
	uint64_t recno = 0;
	int last_type = 0, r;

	*sc = (struct scan){0};
	if (lseek(fd, 0, SEEK_SET) < 0)
		return -errno;
	in.buf = efs_mem_malloc(in.cap);
	pl = efs_mem_malloc(BK_MAX_PAYLOAD);
	if (!in.buf || !pl) {
		r = -ENOMEM;
		goto out;
	}
	r = in_read(&in, hb, sizeof(hb));
	if (r < 0) {
		snprintf(err, err_size, "%s", r == -ENODATA || r == -EPIPE ?
			 "truncated: shorter than a backup header" : strerror(-r));
		r = r == -ENODATA || r == -EPIPE ? -EUCLEAN : r;
		goto out;
	}
	r = header_decode(hb, &sc->h, &why);
	if (r < 0) {
		snprintf(err, err_size, "%s", why);
		goto out;
	}
	for (;;) {
		uint64_t at = in.off, stream_bytes = in.off;
		uint32_t stream_crc = in.crc, len, crc;
		int type;

		r = in_read(&in, rh, sizeof(rh));
		if (r == -ENODATA || r == -EPIPE) {
			snprintf(err, err_size, "truncated at byte %" PRIu64 " (no trailer)", at);
			r = -EUCLEAN;
			goto out;
		}
		if (r < 0)
			goto out;
		type = rh[0];
		len = get32(rh + 4);
		recno++;
		if (rh[1] || rh[2] || rh[3] || len > BK_MAX_PAYLOAD) {
			snprintf(err, err_size, "record %" PRIu64 " at byte %" PRIu64 " is damaged (bad record header)",
				 recno, at);
			r = -EUCLEAN;
			goto out;
		}
		r = in_read(&in, pl, len);
		if (r == 0)
			r = in_read(&in, cb, 4);
		if (r == -ENODATA || r == -EPIPE) {
			snprintf(err, err_size, "truncated inside record %" PRIu64 " at byte %" PRIu64,
				 recno, at);
			r = -EUCLEAN;
			goto out;
		}
		if (r < 0)
			goto out;
		crc = efs_crc32c(efs_crc32c(0, rh, sizeof(rh)), pl, len);
		if (crc != get32(cb)) {
			snprintf(err, err_size,
				 "checksum mismatch in record %" PRIu64 " at byte %" PRIu64
				 " (stored %08x, computed %08x)",
				 recno, at, get32(cb), crc);
			r = -EUCLEAN;
			goto out;
		}
		if (p)
			progress_add(p, BK_REC_HEAD + len + 4);
		/* Order: SB, META*, DATA*, END. */
		r = -EUCLEAN;
		if ((type == REC_SB && last_type != 0) ||
		    (type == REC_META && last_type != REC_SB && last_type != REC_META) ||
		    (type == REC_DATA && last_type != REC_META && last_type != REC_DATA &&
		     last_type != REC_SB) ||
		    (type == REC_END && last_type == 0) ||
		    (type != REC_SB && type != REC_META && type != REC_DATA && type != REC_END)) {
			snprintf(err, err_size, "record %" PRIu64 " (type %d) out of place", recno,
				 type);
			goto out;
		}
		last_type = type;
		if (type == REC_SB) {
			char reason[256] = "";

			if (len != EFS_SB_SIZE ||
			    efs_sb_decode(pl, len, &sc->sb, NULL, reason, sizeof(reason)) < 0 ||
			    memcmp(sc->sb.uuid, sc->h.uuid, 16) || strcmp(sc->sb.name, sc->h.name) ||
			    sc->sb.block_size != sc->h.block_size) {
				snprintf(err, err_size, "its superblock record does not match its header%s%s",
					 reason[0] ? ": " : "", reason);
				goto out;
			}
			memcpy(sc->sbblock, pl, EFS_SB_SIZE);
			sc->has_sb = true;
		} else if (type == REC_META) {
			struct efs_meta_ns ns;
			struct efs_meta_key_info ki;
			uint8_t key[EFS_META_KEY_MAX];
			size_t rel;

			if (len < 2 || (rel = get16(pl)) + 2 > len ||
			    efs_meta_ns_init(&ns, sc->h.name) < 0 || ns.len + rel > sizeof(key)) {
				snprintf(err, err_size, "record %" PRIu64 ": malformed key", recno);
				goto out;
			}
			memcpy(key, ns.prefix, ns.len);
			memcpy(key + ns.len, pl + 2, rel);
			if (efs_meta_key_parse(&ns, key, ns.len + rel, &ki) == 0) {
				if (ki.family == EFS_META_K_SB) {
					Etcfs__FsInfo *fi = NULL;

					if (efs_meta_fsinfo_decode(pl + 2 + rel, len - 2 - rel, &fi,
								   NULL) < 0 ||
					    fi->uuid.len != 16 ||
					    memcmp(fi->uuid.data, sc->h.uuid, 16)) {
						efs_meta_record_free(fi);
						snprintf(err, err_size,
							 "its sb record does not match its header");
						goto out;
					}
					efs_meta_record_free(fi);
					sc->has_sb_key = true;
				} else if (ki.family == EFS_META_K_INODE ||
					   ki.family == EFS_META_K_ORPHAN) {
					Etcfs__Inode *ir = NULL;
					int e = 0;

					if (ki.family == EFS_META_K_ORPHAN)
						e = runs_add(&sc->orphans, ki.ino, 0);
					else if (efs_meta_inode_decode(pl + 2 + rel, len - 2 - rel,
								       &ir, NULL) == 0 &&
						 ir->nlink == 0)
						e = runs_add(&sc->nlink0, ki.ino, 0);
					efs_meta_record_free(ir);
					if (e < 0) {
						r = e;
						goto out;
					}
				} else if (ki.family == EFS_META_K_EXTENT) {
					int e = runs_add_chunk(&sc->need, pl + 2 + rel,
							       len - 2 - rel,
							       sc->h.device_size / sc->h.block_size);

					if (e == -ENOMEM) {
						r = e;
						goto out;
					}
					if (e < 0) {
						snprintf(err, err_size,
							 "record %" PRIu64 ": a bad extent chunk", recno);
						goto out;
					}
				}
			}
			sc->metas++;
			if (R) {
				r = rs_meta(R, pl, len);
				if (r < 0)
					goto out;
			}
		} else if (type == REC_DATA) {
			uint64_t blk, n;

			if (len < 16 || (len - 16) % sc->h.block_size ||
			    (n = get32(pl + 8)) != (len - 16) / sc->h.block_size || !n ||
			    (blk = get64(pl)) >= sc->h.device_size / sc->h.block_size ||
			    n > sc->h.device_size / sc->h.block_size - blk || blk < sc->h.data_start) {
				snprintf(err, err_size, "record %" PRIu64 ": a bad block run", recno);
				goto out;
			}
			r = runs_add(&sc->have, blk, n);
			if (r < 0)
				goto out;
			sc->datas++;
			sc->blocks += n;
			if (R) {
				size_t done = 0, bytes = (size_t)(n * sc->h.block_size);

				while (done < bytes) {
					ssize_t w = pwrite(R->devfd, pl + 16 + done, bytes - done,
							   (off_t)(blk * sc->h.block_size + done));

					if (w < 0 && errno == EINTR)
						continue;
					if (w < 0) {
						r = -errno;
						snprintf(R->err, sizeof(R->err),
							 "writing device block %" PRIu64 ": %s", blk,
							 strerror(errno));
						goto out;
					}
					done += (size_t)w;
				}
			}
		} else {
			uint8_t extra;

			if (len != 40 || get64(pl) != sc->metas || get64(pl + 8) != sc->datas ||
			    get64(pl + 16) != sc->blocks || get64(pl + 24) != stream_bytes ||
			    get32(pl + 32) != stream_crc) {
				snprintf(err, err_size,
					 "its trailer does not match what precedes it (records lost or reordered)");
				goto out;
			}
			r = read(fd, &extra, 1);
			if (in.pos != in.len || r != 0) {
				snprintf(err, err_size, "bytes follow its trailer");
				r = -EUCLEAN;
				goto out;
			}
			sc->has_end = true;
			break;
		}
	}
	r = -EUCLEAN;
	if (!sc->has_sb || !sc->has_sb_key) {
		snprintf(err, err_size, "it has no %s", sc->has_sb ? "sb key" : "superblock record");
		goto out;
	}
	runs_merge(&sc->need);
	runs_merge(&sc->have);
	{
		uint64_t miss = runs_first_missing(&sc->need, &sc->have);

		if (miss != UINT64_MAX) {
			snprintf(err, err_size,
				 "it lacks device blocks its extents reference (first: block %" PRIu64
				 "); a backup without its blocks is never restored",
				 miss);
			goto out;
		}
	}
	r = 0;
out:
	efs_mem_free(in.buf);
	efs_mem_free(pl);
	return r;
}

static void scan_done(struct scan *sc)
{
	efs_mem_free(sc->need.v);
	efs_mem_free(sc->have.v);
	efs_mem_free(sc->nlink0.v);
	efs_mem_free(sc->orphans.v);
	sc->need = sc->have = sc->nlink0 = sc->orphans = (struct runs){0};
}

/* The orphans of |sc| whose inode record has link count 0 (both lists
 * are in inode order), into |out|. */
static int closed_files(const struct scan *sc, struct runs *out)
{
	size_t j = 0;
	int r = 0;

	for (size_t i = 0; r == 0 && i < sc->orphans.n; i++) {
		while (j < sc->nlink0.n && sc->nlink0.v[j].start < sc->orphans.v[i].start)
			j++;
		if (j < sc->nlink0.n && sc->nlink0.v[j].start == sc->orphans.v[i].start)
			r = runs_add(out, sc->orphans.v[i].start, 0);
	}
	return r;
}

/*
 * Whether another process of this host has |dst| (the device) open, as a
 * mounted etcfsd has: 1 with |what| naming it, 0 when none. A FUSE mount's
 * source names the filesystem, not the device, and names are unique only
 * per etcd, so the descriptors are what tell.
 */
static bool device_open_elsewhere(const struct stat *dst, char *what, size_t what_size)
{
	DIR *proc = opendir("/proc");
	struct dirent *pe;
	bool found = false;

	if (!proc)
		return false;
	while (!found && (pe = readdir(proc))) {
		char fdpath[300], comm[64] = "?";
		struct dirent *fe;
		DIR *fds;
		FILE *cf;

		if (pe->d_name[0] < '1' || pe->d_name[0] > '9' || atol(pe->d_name) == (long)getpid())
			continue;
		snprintf(fdpath, sizeof(fdpath), "/proc/%s/fd", pe->d_name);
		fds = opendir(fdpath);
		if (!fds)
			continue;
		while (!found && (fe = readdir(fds))) {
			char p[600];
			struct stat st;

			if (fe->d_name[0] == '.')
				continue;
			snprintf(p, sizeof(p), "%s/%s", fdpath, fe->d_name);
			if (stat(p, &st) < 0)
				continue;
			if (S_ISBLK(dst->st_mode) ? S_ISBLK(st.st_mode) && st.st_rdev == dst->st_rdev
						  : st.st_dev == dst->st_dev && st.st_ino == dst->st_ino)
				found = true;
		}
		closedir(fds);
		if (found) {
			snprintf(fdpath, sizeof(fdpath), "/proc/%s/comm", pe->d_name);
			cf = fopen(fdpath, "re");
			if (cf) {
				if (fgets(comm, sizeof(comm), cf))
					comm[strcspn(comm, "\n")] = '\0';
				fclose(cf);
			}
			snprintf(what, what_size, "open in process %s (%s)", pe->d_name, comm);
		}
	}
	closedir(proc);
	return found;
}

/* Whether |dev| is mounted here (a mount whose source is the device: its
 * path or, for a block device, its number) or open in another process. */
static bool device_mounted(const char *dev, const struct stat *dst, char *what, size_t what_size)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char line[4096], real[PATH_MAX];
	bool found = false;

	if (!realpath(dev, real))
		snprintf(real, sizeof(real), "%s", dev);
	while (f && !found && fgets(line, sizeof(line), f)) {
		unsigned maj, min;
		char mnt[1024], fstype[256], source[1024];
		char *sep = strstr(line, " - ");

		if (!sep || sscanf(line, "%*s %*s %u:%u %*s %1023s", &maj, &min, mnt) != 3 ||
		    sscanf(sep + 3, "%255s %1023s", fstype, source) != 2)
			continue;
		if (S_ISBLK(dst->st_mode) && makedev(maj, min) == dst->st_rdev)
			found = true;
		if (!strcmp(source, dev) || !strcmp(source, real))
			found = true;
		if (found)
			snprintf(what, what_size, "%s on %s (%s)", source, mnt, fstype);
	}
	if (f)
		fclose(f);
	return found || device_open_elsewhere(dst, what, what_size);
}

/* Whether the keyspace of |sb|'s filesystem holds its "sb" record with
 * |sb|'s UUID (or cannot be read: assume it does). */
static bool old_fs_lives(struct efs_etcd_sync *s, const struct efs_sb *sb)
{
	struct efs_meta_ns ns;
	struct efs_meta_key k;
	Mvccpb__KeyValue *kv = NULL;
	Etcfs__FsInfo *fi = NULL;
	bool lives;
	int r;

	if (efs_meta_ns_init(&ns, sb->name) < 0 || efs_meta_key_sb(&ns, &k) < 0)
		return true;
	r = efs_etcd_sync_get(s, k.buf, k.len, &kv, NULL);
	if (r == -ENOENT)
		return false;
	if (r < 0)
		return true;
	lives = efs_meta_fsinfo_decode(kv->value.data, kv->value.len, &fi, NULL) < 0 ||
		(fi->uuid.len == 16 && !memcmp(fi->uuid.data, sb->uuid, 16));
	efs_meta_record_free(fi);
	protobuf_c_message_free_unpacked(&kv->base, efs_mem_protobuf());
	return lives;
}

int efs_restore_cmd(const char *prog, int argc, char **argv)
{
	struct efs_cli_etcd conn = {0};
	struct efs_cli_device dev = {.fd = -1};
	struct rs R = {.prog = prog, .devfd = -1};
	struct scan sc = {0};
	struct progress p;
	const char *pos[2];
	char err[EFS_CLI_ERR_MAX] = "", what[2400] = "";
	struct efs_meta_range range;
	struct stat st, dst;
	double t0 = now_s();
	int64_t count = 0;
	bool force = false;
	int fd = -1, ret, r;

	ret = parse_args(prog, argc, argv, &conn, NULL, NULL, &force, NULL, pos, 2, usage_restore);
	if (ret >= 0)
		goto out;
	ret = EFS_BACKUP_EXIT_FAILED;
	R.src = pos[0];
	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(pos[0], "-")) {
		fprintf(stderr,
			"%s: restore reads its input twice (every checksum is checked before anything is written): give a file, not -\n",
			prog);
		ret = EFS_BACKUP_EXIT_USAGE;
		goto out;
	}
	fd = open(pos[0], O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "%s: %s: %s\n", prog, pos[0],
			fd < 0 ? strerror(errno) : "not a regular file");
		goto out;
	}
	/* Pass 1: check everything, write nothing. */
	progress_start(&p, "checking", (uint64_t)st.st_size);
	r = rs_pass(fd, &sc, NULL, &p, err, sizeof(err));
	progress_done(&p);
	if (r < 0) {
		fprintf(stderr, "%s: %s is not a usable backup: %s; nothing was written\n", prog,
			pos[0], r == -EUCLEAN ? err : strerror(-r));
		ret = r == -EUCLEAN ? EFS_BACKUP_EXIT_REFUSED : EFS_BACKUP_EXIT_FAILED;
		goto out;
	}
	if (efs_meta_ns_init(&R.ns, sc.h.name) < 0)
		goto out;
	/* The target: an empty keyspace, a device not in use and big enough. */
	r = efs_cli_etcd_connect(&conn, &R.s, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		ret = EFS_BACKUP_EXIT_NOCONNECT;
		goto out;
	}
	ret = EFS_BACKUP_EXIT_REFUSED;
	r = efs_cli_device_open(pos[1], true, &dev, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		ret = EFS_BACKUP_EXIT_FAILED;
		goto out;
	}
	if (fstat(dev.fd, &dst) < 0) {
		ret = EFS_BACKUP_EXIT_FAILED;
		goto out;
	}
	{
		struct efs_sb old;
		char node[EFS_META_NODE_MAX + 1] = "";

		if (efs_cli_read_sb(&dev, &old, NULL, err, sizeof(err)) == 0) {
			struct efs_meta_ns ons;
			int64_t n = 0;

			if (efs_meta_ns_init(&ons, old.name) == 0 &&
			    efs_cli_mounted_nodes(R.s, &ons, &n, node, err, sizeof(err)) == 0 &&
			    n > 0) {
				fprintf(stderr,
					"%s: %s holds filesystem %s, which node %s has mounted (n/ keys in etcd)\n",
					prog, pos[1], old.name, node);
				goto out;
			}
			/* Another filesystem whose keyspace is here: its data
			 * would be overwritten. */
			if (memcmp(old.uuid, sc.h.uuid, 16) && !force &&
			    old_fs_lives(R.s, &old)) {
				fprintf(stderr,
					"%s: %s holds filesystem %s (another UUID), whose keyspace is in this etcd; --force overwrites it\n",
					prog, pos[1], old.name);
				goto out;
			}
		}
		if (device_mounted(pos[1], &dst, what, sizeof(what))) {
			fprintf(stderr, "%s: %s is mounted or in use: %s\n", prog, pos[1], what);
			goto out;
		}
	}
	r = efs_meta_range_fs(&R.ns, &range);
	if (r == 0)
		r = efs_cli_range_count(R.s, &range, &count, err, sizeof(err));
	if (r < 0) {
		efs_cli_print_err(prog, r, err);
		ret = EFS_BACKUP_EXIT_FAILED;
		goto out;
	}
	if (count > 0) {
		fprintf(stderr,
			"%s: the keyspace of filesystem %s is not empty (%" PRId64
			" keys under /etcfs/%s/): restore only into an empty keyspace\n",
			prog, sc.h.name, count, sc.h.name);
		goto out;
	}
	if (dev.size < sc.h.device_size) {
		fprintf(stderr, "%s: %s has %" PRIu64 " bytes; the backup needs %" PRIu64 "\n", prog,
			pos[1], dev.size, sc.h.device_size);
		goto out;
	}
	/* Pass 2: blocks to the device and keys to etcd as they come ("sb"
	 * held back), then "sb", then the device superblock. */
	ret = EFS_BACKUP_EXIT_FAILED;
	R.devfd = dev.fd;
	if (closed_files(&sc, &R.closed) < 0)
		goto out;
	scan_done(&sc);
	progress_start(&p, "restore", (uint64_t)st.st_size);
	r = rs_pass(fd, &sc, &R, &p, err, sizeof(err));
	if (r == 0)
		r = rs_txn_send(&R);
	progress_done(&p);
	if (r == 0 && fdatasync(R.devfd) < 0)
		r = -errno;
	if (r == 0 && !R.sbval)
		r = -EUCLEAN;
	if (r == 0) {
		struct efs_meta_key sbk;

		r = efs_meta_key_sb(&R.ns, &sbk);
		if (r == 0)
			r = rs_put(&R, sbk.buf, sbk.len, R.sbval, R.sbval_len);
		if (r == 0)
			r = rs_txn_send(&R);
	}
	if (r == 0 && pwrite(R.devfd, sc.sbblock, EFS_SB_SIZE, 0) != EFS_SB_SIZE)
		r = errno ? -errno : -EIO;
	if (r == 0 && fdatasync(R.devfd) < 0)
		r = -errno;
	if (r < 0) {
		fprintf(stderr,
			"%s: restore of %s failed midway: %s; the keyspace holds part of it (no \"sb\", so nothing can mount it): delete /etcfs/%s/ before trying again\n",
			prog, sc.h.name,
			R.err[0] ? R.err : r == -EUCLEAN ? err : strerror(-r), sc.h.name);
		goto out;
	}
	{
		double el = now_s() - t0;
		double mib = (double)(sc.blocks * sc.h.block_size) / 1048576.0;

		fprintf(stderr,
			"restored %s (revision %" PRIu64 ") onto %s: %" PRIu64 " keys in %" PRIu64
			" transactions, %" PRIu64 " blocks (%.1f MiB), %" PRIu64
			" unlinked open files closed, in %.1f s\n",
			sc.h.name, sc.h.revision, pos[1], R.keys_put, R.txns, sc.blocks, mib,
			R.closed_files, el);
	}
	ret = EFS_BACKUP_EXIT_OK;
out:
	efs_etcd_txn_free(R.t);
	efs_mem_free(R.sbval);
	efs_mem_free(R.closed.v);
	scan_done(&sc);
	if (fd >= 0)
		close(fd);
	efs_cli_device_close(&dev);
	efs_etcd_sync_close(R.s);
	efs_cli_etcd_free(&conn);
	return ret;
}
