/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The data path of regular files, internal to lib/fs. lib/fs/file/ owns
 * it (its private header: fs/file/file-int.h): the per-inode data state,
 * the file handlers (open, read, write, flush, release, fsync, fallocate,
 * lseek, copy_file_range, truncate through setattr), the publisher (the
 * interval sweep, fsync group commit, buffer limits) and the glue to the
 * allocator (fs/alloc.h), the extent maps (space/extmap.h) and the device
 * pool (dev/iopool.h). reclaim.c frees the blocks of dropped inodes.
 *
 * The model:
 *  - A regular file gets a struct efs_fs_data when it is first opened or
 *    written; it holds the extent map (loaded from e/<ino> under the lock,
 *    the node's merged view of published and unpublished extents), the
 *    runs allocated and not yet published, the runs buried (replaced or
 *    punched) and not yet freed in etcd, and the record fields changed and
 *    not yet published (size, blocks, times, deferred setattr: mode, uid,
 *    gid). The inode cache entry's record (in->rec) is always the merged
 *    view: the inode cache's reload hook re-applies the pending fields
 *    whenever the engine replaces the record with one read from etcd.
 *  - Writes hold the inode's exclusive lock (pinned only while a request
 *    is in flight: a release between requests publishes first, through
 *    the lock ops of file/lockops.c) and go copy-on-write to fresh
 *    blocks (in place only into preallocated, unpublished-as-data blocks),
 *    then update the map in memory and reply: the data is on the device,
 *    its extent is not yet published.
 *  - Publication is an engine operation (fs-int.h) whose transaction
 *    carries, for up to EFS_LOCK_REQ_MAX dirty inodes, their changed chunk
 *    keys, their records (merged, with a size never below the published
 *    extents) and the allocator's contribution (maps, free counts, free
 *    intents). It runs from the interval sweep, at once for fsync /
 *    O_SYNC / O_DSYNC and for buffer limits, before a lock is released,
 *    and for every truncate (which is never left pending, so that a record
 *    put by another operation never has a size below extents in etcd).
 *    Before each publication the device descriptor is fdatasync'ed.
 *    Concurrent fsyncs share one publication.
 *  - A failed publication keeps the state dirty; fsync answers EIO until
 *    a publication of the inode commits.
 *
 * Everything runs on the loop thread.
 */

#include <stdbool.h>
#include <stdint.h>

#include "fs/fs-int.h"

struct efs_fs_data;

/* Sets up the publisher and its sweep timer (after fs->alloc and fs->pool
 * exist). 0 or a negative errno. */
int efs_fs_data_init(struct efs_fs *fs);
/* Frees every data state and the timer; nothing may be in flight. */
void efs_fs_data_done(struct efs_fs *fs);
/* Stops the publisher's and the fault hooks' timers (efs_fs_abandon). */
void efs_fs_data_abandon(struct efs_fs *fs);
/* The kernel channel stopped (efs_fs_set_fuse(NULL)): releases waiting
 * for invalidations go on. */
void efs_fs_data_kernel_gone(struct efs_fs *fs);

/* ---- FUSE handlers ---- */

void efs_fs_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void efs_fs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		 struct fuse_file_info *fi);
void efs_fs_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void efs_fs_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
		      struct fuse_file_info *fi);
void efs_fs_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void efs_fs_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void efs_fs_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
		      struct fuse_file_info *fi);
void efs_fs_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		  struct fuse_file_info *fi);
void efs_fs_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in,
			    struct fuse_file_info *fi_in, fuse_ino_t ino_out, off_t off_out,
			    struct fuse_file_info *fi_out, size_t len, int flags);

/*
 * The open half of create (ns.c's create reply): makes the handle for the
 * new inode |ino| with the open flags in |fi| (fh, direct_io, keep_cache
 * set). 0 or a negative errno (nothing to undo).
 */
int efs_fs_data_open_handle(struct efs_fs *fs, uint64_t ino, struct fuse_file_info *fi,
			    bool created);

/*
 * setattr of a regular file, called by attr.c's handler before the
 * engine's setattr: returns true when the data path took the request (it
 * then replies): every request with FUSE_SET_ATTR_SIZE (a truncate: extents
 * beyond the size freed, the partial last block zeroed past the size,
 * published before the reply, split into several publications when it
 * frees more chunks than one transaction holds), and any other request on
 * an inode whose data state holds the exclusive lock (applied to the
 * merged record and published with the data: deferred setattr). false:
 * the engine handles it as before.
 */
bool efs_fs_data_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			 struct fuse_file_info *fi);

/* ---- Engine hooks ---- */

/* efs_fs_handle_free() is freeing |h| (release, or a create whose reply
 * failed): free h->dpriv and drop what the handle held. */
void efs_fs_data_handle_free(struct efs_fs *fs, struct efs_fs_handle *h);

/* True when |ino| has unpublished data or fields. */
bool efs_fs_data_dirty(const struct efs_fs *fs, uint64_t ino);

/*
 * Publishes every dirty inode (clean leave, before locks are released);
 * |cb| with 0 or the first error. Same return convention as alloc.h.
 */
int efs_fs_data_sync_all(struct efs_fs *fs, void (*cb)(int status, void *arg), void *arg);
/* The session was lost: every data state is discarded (handles then fail
 * with EIO), nothing is published. */
void efs_fs_data_session_lost(struct efs_fs *fs);

/* ---- Reclaim (reclaim.c) ---- */

/*
 * Reclaim records: an inode dropped with extents gets
 * rc/<ino> in the transaction that deletes i/<ino> (ns.c puts it with
 * efs_fs_reclaim_put); the reclaimer then frees its chunks in batches,
 * each one transaction that deletes a few e/<ino> chunk keys, frees their
 * blocks through the allocator and advances or deletes rc/<ino>. At start
 * it adopts this node's reclaim records, those of nodes whose n/ key is
 * gone, and orphans (o/<ino>) whose opener is gone (turned into reclaim
 * records), and again each time another node's session ends (the lock
 * cache's peer-gone callback). efs_fs_reclaim_kick schedules a pass.
 */
int efs_fs_reclaim_put(struct efs_fs_op *op, uint64_t ino);
int efs_fs_reclaim_init(struct efs_fs *fs);
void efs_fs_reclaim_kick(struct efs_fs *fs);
/* Reclaim records waiting and blocks freed so far (metrics, tests). */
uint64_t efs_fs_reclaim_pending(const struct efs_fs *fs);
void efs_fs_reclaim_done(struct efs_fs *fs);
/* Stops the reclaimer's timer (efs_fs_abandon). */
void efs_fs_reclaim_abandon(struct efs_fs *fs);
