/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The extent map of one file, in memory, chunked the way it is stored
 * (docs/FORMAT.md): keys e/<ino><chunk> whose chunk number is the first file
 * block the chunk covers; a chunk covers [its key, the next chunk's key) and
 * holds the sorted, non-overlapping extents of that range. Chunks split by
 * extent count (a chunk that grows past |chunk_max| extents splits in two
 * halves, the second keyed by its first extent's file block); a chunk left
 * empty is dropped. The first chunk of a new map has key 0, and a set that
 * reaches below the first chunk's key (after a punch dropped the chunk of key
 * 0) creates a new chunk of key 0 rather than moving a key. Keys never change
 * otherwise: a set over several chunks is cut at their boundaries, so every
 * extent lies inside its chunk's range; extents are not merged across chunks.
 * A chunk of a loaded map may hold more than |chunk_max| extents (another
 * chunk_max wrote it): it splits in halves on each change until the halves
 * fit.
 *
 * The map is the node's merged view (published extents plus the node's
 * own unpublished writes). Each chunk carries a version bumped by every
 * change, and remembers the version last published, so that publication
 * is: take a snapshot of the dirty chunks (efs_extmap_changes), put them
 * in a transaction, and after it commits mark exactly that snapshot
 * published (efs_extmap_published): chunks changed again meanwhile stay
 * dirty. Keys of published chunks that disappeared (emptied) are listed
 * as deletions until a publication of them commits; a key that a new
 * chunk takes again (before its deletion was published) leaves the deletion
 * list, and that chunk (dirty) replaces the stored value. A chunk emptied
 * after it was in a snapshot is listed as a deletion even if that snapshot
 * never commits (a delete of a missing key is harmless), so that
 * efs_extmap_published never needs memory.
 *
 * Costs: a change costs O(extents of the chunks its range meets) plus
 * O(number of chunks) pointer moves when chunks appear or disappear;
 * efs_extmap_ndirty and efs_extmap_changes scan the chunk array.
 *
 * Extents that are split keep their device mapping (a split of
 * {f, d, n} at f + k gives {f, d, k} and {f + k, d + k, n - k}); adjacent
 * extents are merged when both file and device blocks continue and the
 * flags are equal (within one chunk). Pure: no I/O, not thread-safe, all
 * memory through efs_mem; -ENOMEM leaves the map as it was.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "space/runs.h"
#include "etcfs.pb-c.h"

/* Default extents per chunk before it splits (a chunk value stays near
 * 1 KiB, so that a publication of ~100 chunks fits one etcd request). */
#define EFS_EXTMAP_CHUNK_MAX 64

struct efs_ext {
	uint64_t fblk;	/* first file block */
	uint64_t dblk;	/* first device block (absolute) */
	uint64_t count; /* blocks, >= 1 */
	uint32_t flags; /* EFS_META_EXTENT_F_* (PREALLOC: reads as zeroes) */
};

struct efs_extmap;

/* A new empty map; |chunk_max| 0 means EFS_EXTMAP_CHUNK_MAX (>= 4). */
int efs_extmap_new(struct efs_extmap **ret, uint32_t chunk_max);
/* Accepts NULL; returns NULL. */
struct efs_extmap *efs_extmap_free(struct efs_extmap *m);

/*
 * Loads one published chunk (key |key|, decoded value |ch|) into a map that
 * is being filled from etcd; chunks may come in any order. The chunk is
 * clean (published). -EUCLEAN when it is inconsistent with itself (not
 * sorted, overlapping, wrapping, an extent before |key|) or with chunks
 * already loaded (same key, overlapping extents, an extent reaching into
 * a later chunk's range); -ENOMEM.
 */
int efs_extmap_load_chunk(struct efs_extmap *m, uint64_t key, const Etcfs__ExtentChunk *ch);

/*
 * The mapped pieces of [fblk, fblk + count), in file order, clipped to the
 * range; holes are the gaps between them. Writes at most |max| pieces into
 * |out| and returns how many pieces exist in the range (so a return above
 * |max| means "call again from after out[max - 1]").
 */
size_t efs_extmap_lookup(const struct efs_extmap *m, uint64_t fblk, uint64_t count,
			 struct efs_ext *out, size_t max);

/*
 * Maps [x->fblk, x->fblk + x->count) to x->dblk... with x->flags, replacing
 * whatever was mapped there; the device runs that are no longer referenced
 * (the replaced mapping) are appended to |buried| (not normalized).
 * -EINVAL for count 0 or a wrapping range; -ENOMEM.
 */
int efs_extmap_set(struct efs_extmap *m, const struct efs_ext *x, struct efs_runs *buried);

/*
 * Unmaps [fblk, fblk + count) (count may reach UINT64_MAX - fblk: "to the
 * end"), appending the unreferenced device runs to |buried|. 0 or -ENOMEM.
 */
int efs_extmap_punch(struct efs_extmap *m, uint64_t fblk, uint64_t count,
		     struct efs_runs *buried);

/*
 * Clears |flags| on the mapped parts of [fblk, fblk + count) (a write in
 * place into preallocated blocks makes them data). 0 or -ENOMEM.
 */
int efs_extmap_clear_flags(struct efs_extmap *m, uint64_t fblk, uint64_t count, uint32_t flags);

/* Blocks mapped (with or without flags). */
uint64_t efs_extmap_blocks(const struct efs_extmap *m);
/* One past the last mapped file block; 0 for an empty map. */
uint64_t efs_extmap_end(const struct efs_extmap *m);
/* Number of chunks, and the number of dirty chunks plus pending deletions. */
size_t efs_extmap_nchunks(const struct efs_extmap *m);
size_t efs_extmap_ndirty(const struct efs_extmap *m);
/*
 * The chunk keys, ascending, into |keys| (at most |max|); returns the number
 * of chunks. Callers that must split a large change (a truncate freeing
 * more chunks than fit one transaction) pick intermediate points here.
 */
size_t efs_extmap_chunk_keys(const struct efs_extmap *m, uint64_t *keys, size_t max);

/*
 * SEEK_DATA / SEEK_HOLE on blocks: the first block >= |fblk| mapped without
 * PREALLOC (-ENXIO when none), and the first block >= |fblk| that is not
 * (a hole or preallocated; at the latest efs_extmap_end, or |fblk|).
 */
int efs_extmap_seek_data(const struct efs_extmap *m, uint64_t fblk, uint64_t *ret);
uint64_t efs_extmap_seek_hole(const struct efs_extmap *m, uint64_t fblk);

/* ---- Publication ---- */

struct efs_extmap_change {
	uint64_t key;		 /* chunk key */
	bool del;		 /* delete e/<ino><key> (val empty) */
	ProtobufCBinaryData val; /* packed ExtentChunk (efs_mem) when !del */
	uint64_t end;		 /* one past the chunk's last block (0 for del) */
	/* One past the last block of the value etcd holds for the key now
	 * (0 when the key is not stored): a publication in parts never
	 * publishes this change without the changes of the keys below |pend|
	 * that follow it (their blocks are still covered by this value). */
	uint64_t pend;
	uint64_t ver; /* private: the chunk version snapshotted */
};

/*
 * Snapshot of up to |max| pending changes (deletions first, then dirty
 * chunks by key) into a new array (*ret, *n; free with
 * efs_extmap_changes_free). Returns 0 (with *n 0 when clean) or -ENOMEM.
 */
int efs_extmap_changes(struct efs_extmap *m, size_t max, struct efs_extmap_change **ret,
		       size_t *n);
void efs_extmap_changes_free(struct efs_extmap_change *v, size_t n);
/*
 * The snapshot |v| committed: each chunk whose version is still the
 * snapshotted one becomes clean, and each deletion is forgotten unless the
 * key was used again since (then its chunk stays dirty). Snapshots must be
 * marked published in the order they were taken (one publication in flight
 * at a time, or commits in snapshot order). Never fails.
 */
void efs_extmap_published(struct efs_extmap *m, const struct efs_extmap_change *v, size_t n);
/*
 * One past the last block of the published state (as efs_extmap_published
 * last left it, or as loaded): publishers use it to keep a published size
 * that never falls below published extents (invariant 5).
 */
uint64_t efs_extmap_published_end(const struct efs_extmap *m);
/* Marks every chunk dirty (after an unknown outcome that turned out not
 * applied, nothing needs this; it serves tests and repairs). */
void efs_extmap_mark_all_dirty(struct efs_extmap *m);
