/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the passes share about the state read: growing its arrays, looking up
 * inodes and per-inode keys, and describing inodes, entries and keys in the
 * words of the findings.
 */
#include "fsck/check-int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "util/mem.h"

void *efs_check__grow(void *arr, size_t *cap, size_t n, size_t size)
{
	if (efs_mem_reserve(&arr, cap, n + 1, size) < 0)
		return NULL;
	return arr;
}

void *efs_check__slot(state_t *st, void *arrp, size_t *cap, size_t n, size_t size)
{
	char *arr;

	if (efs_mem_reserve(arrp, cap, n + 1, size) < 0) {
		st->err = -ENOMEM;
		return NULL;
	}
	memcpy(&arr, arrp, sizeof(arr));
	memset(arr + n * size, 0, size);
	return arr + n * size;
}

__attribute__((format(printf, 1, 0))) char *efs_check__vfmt(const char *fmt, va_list ap)
{
	va_list aq;
	char *s;
	int n;

	va_copy(aq, ap);
	n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0)
		return NULL;
	s = efs_mem_malloc((size_t)n + 1);
	if (s)
		vsnprintf(s, (size_t)n + 1, fmt, ap);
	return s;
}

/* Key bytes after the prefix, printable (non-printing bytes as \xNN). */
void efs_check__key_text(const state_t *st, const uint8_t *key, size_t len, char *buf, size_t size)
{
	size_t i = 0, o = 0;

	if (len >= st->ns.len && memcmp(key, st->ns.prefix, st->ns.len) == 0)
		i = st->ns.len;
	for (; i < len && o + 5 < size; i++) {
		if (key[i] >= 0x21 && key[i] < 0x7f && key[i] != '\\')
			buf[o++] = (char)key[i];
		else
			o += (size_t)snprintf(buf + o, size - o, "\\x%02x", key[i]);
	}
	buf[o] = '\0';
}

struct ino_ent *efs_check__find_ino(state_t *st, uint64_t ino)
{
	size_t lo = 0, hi = st->n_inos;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (st->inos[mid].ino == ino)
			return &st->inos[mid];
		if (st->inos[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

struct ino_ent *efs_check__live_ino(state_t *st, uint64_t ino)
{
	struct ino_ent *e = efs_check__find_ino(st, ino);

	return e && !e->removed ? e : NULL;
}

bool efs_check__is_dir(const struct ino_ent *e)
{
	return S_ISDIR(e->mode);
}

const char *efs_check__type_word(uint32_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFDIR:
		return "directory";
	case S_IFREG:
		return "file";
	case S_IFLNK:
		return "symlink";
	case S_IFCHR:
		return "character device";
	case S_IFBLK:
		return "block device";
	case S_IFIFO:
		return "fifo";
	case S_IFSOCK:
		return "socket";
	}
	return "inode";
}

const char *efs_check__dt_word(uint32_t dt)
{
	switch (dt) {
	case DT_DIR:
		return "directory";
	case DT_REG:
		return "file";
	case DT_LNK:
		return "symlink";
	case DT_CHR:
		return "character device";
	case DT_BLK:
		return "block device";
	case DT_FIFO:
		return "fifo";
	case DT_SOCK:
		return "socket";
	}
	return "unknown type";
}

/*
 * The path of |ino| as the repairs leave the tree ("/a/b"), or "" when it
 * has no name or its chain of names does not reach the root.
 */
static void path_of(state_t *st, uint64_t ino, char *buf, size_t size)
{
	const struct de_ent *parts[64];
	size_t n = 0, o = 0;
	struct ino_ent *e;

	buf[0] = '\0';
	if (ino == EFS_META_ROOT_INO) {
		snprintf(buf, size, "/");
		return;
	}
	while (ino != EFS_META_ROOT_INO) {
		e = efs_check__find_ino(st, ino);
		if (!e || e->name_idx == NONE || n == 64)
			return;
		parts[n++] = &st->des[e->name_idx];
		ino = st->des[e->name_idx].parent;
		for (size_t i = 0; i + 1 < n; i++)
			if (parts[i]->parent == ino)
				return; /* a cycle */
	}
	while (n-- > 0 && o + 1 < size)
		o += (size_t)snprintf(buf + o, size - o, "/%s", parts[n]->name);
}

/* "file /a/b (inode 7)" or "file inode 7" when it has no path. */
void efs_check__ino_desc(state_t *st, uint64_t ino, char *buf, size_t size)
{
	struct ino_ent *e = efs_check__find_ino(st, ino);
	char path[512];

	path_of(st, ino, path, sizeof(path));
	if (path[0])
		snprintf(buf, size, "%s %s (inode %" PRIu64 ")",
			 e ? efs_check__type_word(e->mode) : "inode", path, ino);
	else
		snprintf(buf, size, "%s inode %" PRIu64,
			 e ? efs_check__type_word(e->mode) : "inode", ino);
}

/* "entry "x" in directory /a (inode 5)". */
void efs_check__de_desc(state_t *st, const struct de_ent *d, char *buf, size_t size)
{
	char path[512];

	path_of(st, d->parent, path, sizeof(path));
	if (path[0])
		snprintf(buf, size, "entry \"%s\" in directory %s (inode %" PRIu64 ")", d->name,
			 path, d->parent);
	else
		snprintf(buf, size, "entry \"%s\" in directory inode %" PRIu64, d->name, d->parent);
}

/* Adds a (hypothetical) dirent; returns its index or NONE. */
size_t efs_check__add_de(state_t *st, uint64_t parent, const char *name, size_t len, uint64_t ino,
			 uint32_t type, int64_t mod)
{
	struct de_ent *d;

	d = efs_check__slot(st, &st->des, &st->cap_des, st->n_des, sizeof(*d));
	if (!d)
		return NONE;
	d->name = efs_mem_strndup(name, len);
	if (!d->name) {
		st->err = -ENOMEM;
		return NONE;
	}
	d->name_len = len;
	d->parent = parent;
	d->ino = ino;
	d->type = type;
	d->mod = mod;
	return st->n_des++;
}

int64_t efs_check__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The keys of inode |ino| (any per-inode family): by_ino[*lo .. *hi). */
void efs_check__keys_of(const state_t *st, uint64_t ino, size_t *lo, size_t *hi)
{
	size_t a = 0, b = st->n_keys;

	while (a < b) {
		size_t mid = a + (b - a) / 2;

		if (st->keys[st->by_ino[mid]].ino < ino)
			a = mid + 1;
		else
			b = mid;
	}
	*lo = a;
	while (a < st->n_keys && st->keys[st->by_ino[a]].ino == ino)
		a++;
	*hi = a;
}

static int cmp_key_ino(const void *a, const void *b, void *arg)
{
	const state_t *st = arg;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	if (st->keys[x].ino != st->keys[y].ino)
		return st->keys[x].ino < st->keys[y].ino ? -1 : 1;
	return x < y ? -1 : x > y;
}

int efs_check__index_keys(state_t *st)
{
	st->by_ino = efs_mem_malloc((st->n_keys + 1) * sizeof(*st->by_ino));
	if (!st->by_ino)
		return -ENOMEM;
	for (size_t i = 0; i < st->n_keys; i++)
		st->by_ino[i] = i;
	qsort_r(st->by_ino, st->n_keys, sizeof(*st->by_ino), cmp_key_ino, st);
	return 0;
}

bool efs_check__has_reclaim(const state_t *st, uint64_t ino)
{
	size_t lo, hi;

	efs_check__keys_of(st, ino, &lo, &hi);
	for (size_t j = lo; j < hi; j++)
		if (st->keys[st->by_ino[j]].family == EFS_META_K_RECLAIM)
			return true;
	return false;
}
