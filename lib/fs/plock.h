/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * fcntl (POSIX and OFD) and flock locks kept in etcd.
 *
 * Storage: one key p/<ino><node>/<owner> per lock owner holding locks on
 * an inode, on the session lease, with every range the owner holds
 * (ByteRangeLocks: kind POSIX for fcntl locks, FLOCK for flock locks, the
 * pid the kernel reported). The kernel does not tell OFD locks from
 * classic POSIX ones (both arrive as setlk; an OFD lock's owner is its
 * open file description, a POSIX lock's its process's file table): both
 * are stored as POSIX and conflict alike, as they do in Linux. fcntl and
 * flock locks never conflict with each other (Linux semantics).
 *
 * A request reads the whole p/<ino> range (every owner of every node),
 * decides with plocktab.h, and commits in one transaction that carries the
 * session guard and "no key of p/<ino> changed since the read" (a range
 * compare on mod_revision, which also catches keys created since); a
 * compare failure reads again. An owner left with nothing has its key
 * deleted. A conflict answers EAGAIN (F_SETLK, LOCK_NB) or, for F_SETLKW
 * and blocking flock, waits: a watch on p/<ino> from the read's revision,
 * and a new attempt at each change; the wait ends with EINTR when the
 * kernel interrupts the request. Deadlocks are not detected (a cycle of
 * F_SETLKW waiters waits until one of them is interrupted).
 *
 * F_GETLK reports the conflicting lock with the lowest start, with the pid
 * stored for a lock of this node and pid 0 for another node's (its pids
 * mean nothing here), or F_UNLCK.
 *
 * This node's locks are also kept in a local table (the only writer of
 * this node's keys is this node): it answers EAGAIN/F_GETLK at once for a
 * conflict between two owners of this node, and lets flush and release
 * tell "nothing to do" without etcd.
 *
 * Everything runs on the loop thread. Transactions are counted under the
 * "plock" origin. The state is created lazily on first use when
 * efs_fs_plock_init was not called.
 */

#include <fcntl.h>
#include <stdint.h>

#include "fs/fs.h"

struct efs_fs;
struct efs_fs_handle;

/* FUSE handlers (in fs.c's table). */
void efs_fs_getlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock);
void efs_fs_setlk(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, struct flock *lock,
		  int sleep);
void efs_fs_flock(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi, int op);

/*
 * FLUSH of a handle: drops |lock_owner|'s fcntl locks on |ino| (close(2)
 * drops every POSIX lock of the process on the file). Returns 1 when the
 * owner holds none (|cb| never runs), 0 when |cb| runs later, once, with 0
 * or a negative errno, or a negative errno now.
 */
int efs_fs_plock_flush(struct efs_fs *fs, uint64_t ino, uint64_t lock_owner,
		       void (*cb)(int status, void *arg), void *arg);

/*
 * RELEASE of handle |h| (call it for every release of a file handle;
 * |lock_owner| is fi->lock_owner when fi->flock_release is set, else 0):
 * drops the flock lock and OFD locks of |lock_owner| (the open file
 * description: both use it as their owner), and the fcntl locks of every
 * owner whose last lock went through |h| (OFD locks taken without any
 * flock, whose release carries no owner; a POSIX owner's locks were
 * dropped by the flush of its close). Forgets |h| either way. Same
 * convention as efs_fs_plock_flush.
 */
int efs_fs_plock_release(struct efs_fs *fs, struct efs_fs_handle *h, uint64_t lock_owner,
			 void (*cb)(int status, void *arg), void *arg);

/*
 * Sets up (0 or -ENOMEM) and frees the lock state. done answers every
 * pending FUSE request EIO (a blocked F_SETLKW, say) and abandons pending
 * flush/release drops without calling their callbacks (the fs and its
 * handles are going away); call it while the FUSE session still exists
 * and before the etcd client is freed (it frees a watch stream). Requests
 * whose etcd call is in flight are detached and freed by that call's
 * callback (which runs, with -ECANCELED at the latest, when the client
 * closes). Flush/release drops count in efs_fs_inflight until their
 * callback ran; lock requests do not (a waiter may wait forever).
 */
int efs_fs_plock_init(struct efs_fs *fs);
void efs_fs_plock_done(struct efs_fs *fs);

/* The session was lost: waiters fail EIO, requests in flight fail EIO at
 * their next step, and the local table is emptied (the keys went with the
 * lease). */
void efs_fs_plock_session_lost(struct efs_fs *fs);
