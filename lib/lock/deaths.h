/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Peer deaths: which inodes a node that lost its session still held
 * exclusively, so that whoever takes such an inode over writes it
 * copy-on-write only until the grace period has passed.
 *
 * Why: a node holding an inode exclusively may have device writes queued
 * into the file's preallocated blocks (the only writes that go in place).
 * When its lease expires because it is cut off rather than dead, those
 * writes can still land after a survivor was granted the lock; had the
 * survivor written the same blocks in place, the late write would
 * overwrite acknowledged data. Copy-on-write puts the survivor's data in
 * fresh blocks that the late write cannot reach.
 *
 * How: one prefix watch on n/ (puts and deletes, from a listing of n/).
 * A node key of another node deleted at revision R ended that session: a
 * node that leaves cleanly has released its locks before its lease goes,
 * so every holder key of its at R - 1 was one its lease took with it. The
 * exclusive ones are read at R - 1 (keys only, in pages) and each inode is
 * marked until now + grace. When that read fails (the revision was
 * compacted, an error), every inode is marked for the grace period.
 *
 * A grant is only as good as what was known when it was given: in-place
 * writes under a grant at revision G are allowed once every death up to G
 * has been read. The watch may lag (and sends nothing while no one joins
 * or leaves), so a query about a newer grant asks etcd for n/ and g/ as
 * they are now: unchanged since the watch's revision (every node key of
 * the known members still there with its create revision, no g/ key
 * modified since; a registration writes both in one transaction) proves
 * no death in between, and the known revision moves up. Until then the
 * answer is "not in place", which is never wrong, only slower.
 *
 * Everything runs on the loop thread.
 */

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "etcd/etcd.h"
#include "meta/keys.h"

struct efs_deaths;

struct efs_deaths_opts {
	const struct efs_meta_ns *ns;
	const char *self;  /* this node's id: its own deaths are not counted */
	uint32_t grace_ms; /* copy-on-write period after a death (0: 60000) */
};

/* Called on the loop once the locks of a node whose session ended have
 * been read (or could not be: then every inode is marked). */
typedef void (*efs_deaths_peer_cb)(void *arg, const char *node);

struct efs_deaths_stats {
	uint64_t deaths;      /* ends of other nodes' sessions seen */
	uint64_t marked;      /* inodes marked by them */
	uint64_t unknown;     /* deaths whose holders could not be read (all marked) */
	uint64_t catchups;    /* n/ and g/ reads that moved the known revision */
	uint64_t cow;	      /* checks answered copy-on-write */
	int64_t known_rev;    /* every death up to here has been read */
};

int efs_deaths_new(struct efs_deaths **ret, uv_loop_t *loop, struct efs_etcd *c,
		   const struct efs_deaths_opts *o);
/* Starts the listing and the watch unless they run (call it again after a
 * failure: it is cheap when they do). */
void efs_deaths_start(struct efs_deaths *d);
/*
 * Whether a write under a grant of |ino| given at revision |grant_rev| may
 * go in place: no death up to |grant_rev| is unread and none of the grace
 * period marks |ino| (or every inode). 1: in place; 0: copy-on-write;
 * -EINPROGRESS: deaths up to |grant_rev| are still being read (a catch-up
 * read is sent), and |cb| runs once, later, with the answer (false when
 * the read fails or the tracker is freed first); -ENOMEM.
 */
typedef void (*efs_deaths_cb)(void *arg, bool inplace);
int efs_deaths_check(struct efs_deaths *d, uint64_t ino, int64_t grant_rev, efs_deaths_cb cb,
		     void *arg);
/*
 * Until when blocks freed by a transaction committed at revision |rev|
 * must stay unallocated: a node whose session ended before |rev| may
 * still land an in-place write in them (its grace period), and one handed
 * out again would take it. 0: none may (every session end up to |rev| is
 * known and every grace is over); otherwise a monotonic time at which to
 * ask again. Deaths are not told apart: any grace running holds every
 * free (deaths are rare, the grace is bounded). A revision the watch has
 * not reached yet is proven free of deaths by |nodes| and |gens| (n/ and
 * g/ read at |rev| by the freeing transaction: unchanged since the watch's
 * revision) or, without them, sends a catch-up read and answers "ask
 * again shortly"; |rev| <= 0 (not known) answers a whole grace from now.
 */
uint64_t efs_deaths_free_hold(struct efs_deaths *d, int64_t rev,
			      const Etcdserverpb__RangeResponse *nodes,
			      const Etcdserverpb__RangeResponse *gens);
/* Registers |cb| (NULL: none). */
void efs_deaths_set_peer_cb(struct efs_deaths *d, efs_deaths_peer_cb cb, void *arg);
/* From a timer (the lock cache's tick): starts what is not running and
 * answers copy-on-write the checks that waited too long. */
void efs_deaths_tick(struct efs_deaths *d);
void efs_deaths_get_stats(const struct efs_deaths *d, struct efs_deaths_stats *ret);
/* Accepts NULL; returns NULL. Calls in flight end without effect. */
struct efs_deaths *efs_deaths_free(struct efs_deaths *d);
