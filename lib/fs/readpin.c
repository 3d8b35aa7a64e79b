/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Read pins: a read's GETATTR and its READ under one grant (attr.c
 * serves the GETATTR, file/handlers.c the open and the READ).
 */
#include <errno.h>
#include <string.h>

#include "fs/fs-int.h"
#include "util/mem.h"
#include "util/timer.h"

/*
 * A read's GETATTR and its READ under one grant (fs-int.h, read pins).
 * The kernel (fuse_cache_read_iter, auto_inval_data) asks the size
 * through the handle when its attributes are stale, reads the pages in
 * a separate request, and copies the data cut at the size it holds then;
 * a READ reply can lower that size but never raise it. Two ways the cut
 * was stale:
 *  - the lock went to another node between the two requests: the size
 *    came from the old grant, the data from the new one;
 *  - the kernel dropped the GETATTR's reply, because an invalidation of
 *    the inode (our release's) came between the request and the moment
 *    the reading task applied the reply (its attr_version check), and
 *    went on with the size of an older reply (the open's lookup). A
 *    GETATTR waiting through a release is always answered after the
 *    release's invalidation, so always dropped.
 * So the read's GETATTR is served like the READ that follows it (a
 * drain lets it through: EFS_LOCK_F_PAGES), and its reply keeps the lock
 * pinned until that READ pinned it. The release, and its invalidation,
 * come after the READ, by which time the reading task has applied the
 * reply. An open for reading takes the same pin (file/handlers.c): its
 * read's GETATTR comes next. A GETATTR without a handle is a stat: the
 * kernel answers the stat from the reply itself, dropped or not.
 */
struct readpin {
	struct efs_fs *fs;
	struct efs_lock_req lr;
	uint64_t ino, fh;
	uint32_t pid;
	uint64_t seq; /* fs->readpin_seq when taken */
	uv_timer_t *timer;
	struct efs_list link; /* fs->readpins */
};

/* Read pins are few (one per reading thread and file); past this many
 * a read's GETATTR keeps none. */
#define READPINS_MAX 4096

static void readpin_free(struct readpin *p)
{
	struct efs_fs *fs = p->fs;

	efs_list_del(&p->link);
	fs->nreadpins--;
	p->timer = efs_timer_free(p->timer);
	efs_lock_put(fs->lc, &p->lr);
	efs_mem_free(p);
}

/* Never called: a pin taken under another is served at once. */
static void readpin_cb(struct efs_lock_req *req, int status)
{
	(void)req;
	(void)status;
}

static void readpin_expired(uv_timer_t *t)
{
	struct readpin *p = t->data;

	if (p)
		readpin_free(p);
}

/* Drops the pins of |ino| matching |pid| and |fh| (0: any) taken up to
 * |seq|. */
void efs_fs_readpins_drop_upto(struct efs_fs *fs, uint64_t ino, uint32_t pid, uint64_t fh,
			       uint64_t seq)
{
	struct efs_list *n, *next;

	if (!fs->readpins.next || !fs->nreadpins)
		return;
	for (n = fs->readpins.next; n != &fs->readpins; n = next) {
		struct readpin *p = efs_list_entry(n, struct readpin, link);

		next = n->next;
		if (p->ino == ino && (!pid || p->pid == pid) && (!fh || p->fh == fh) &&
		    p->seq <= seq)
			readpin_free(p);
	}
}

void efs_fs_readpins_drop(struct efs_fs *fs, uint64_t ino, uint32_t pid, uint64_t fh)
{
	efs_fs_readpins_drop_upto(fs, ino, pid, fh, UINT64_MAX);
}

void efs_fs_readpins_drop_all(struct efs_fs *fs)
{
	if (!fs->readpins.next)
		return;
	while (!efs_list_empty(&fs->readpins))
		readpin_free(efs_list_entry(efs_list_first(&fs->readpins), struct readpin, link));
}

void efs_fs_readpin_take(struct efs_fs *fs, const struct efs_lock_req *held, uint64_t ino,
			 uint32_t pid, uint64_t fh)
{
	struct readpin *p;

	if (!fs->lc || fs->nreadpins >= READPINS_MAX)
		return;
	/* One per thread and file: the newer request stands for its read. */
	efs_fs_readpins_drop(fs, ino, pid, 0);
	p = efs_mem_calloc(1, sizeof(*p));
	if (!p)
		return;
	p->fs = fs;
	p->ino = ino;
	p->fh = fh;
	p->pid = pid;
	p->seq = ++fs->readpin_seq;
	p->lr.n = 1;
	p->lr.ino[0] = ino;
	p->lr.mode[0] = EFS_LOCK_SHARED;
	p->lr.cb = readpin_cb;
	p->timer = efs_timer_new(fs->loop, p);
	if (!p->timer || efs_lock_acquire_under(fs->lc, held, &p->lr) != 1) {
		p->timer = efs_timer_free(p->timer);
		efs_mem_free(p);
		return;
	}
	efs_list_add_tail(&fs->readpins, &p->link);
	fs->nreadpins++;
	uv_timer_start(p->timer, readpin_expired, EFS_FS_READPIN_MS, 0);
}
