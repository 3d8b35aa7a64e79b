/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Filesystem geometry and the records mkfs.etcfs writes (docs/FORMAT.md
 * section 4). Pure: no I/O, no allocation; the builders fill caller-owned
 * protobuf-c messages whose pointers borrow from the arguments.
 *
 * Geometry, for a device of D bytes and a block size B:
 *  - data_start = max(1, 1 MiB / B): the first MiB holds the superblock
 *    (4096 bytes at offset 0) and is reserved for future use;
 *  - data_blocks = floor(D / B) - data_start; at least
 *    EFS_LAYOUT_MIN_DATA_BYTES worth (a device smaller than 2 MiB is
 *    refused);
 *  - the allocation-group size G (bytes) is the largest power of two not
 *    above D / EFS_LAYOUT_AG_TARGET (64), clamped to
 *    [EFS_LAYOUT_AG_MIN_BYTES, EFS_LAYOUT_AG_MAX_BYTES] = [1 MiB, 1 GiB]
 *    and never below one block; ag_blocks = G / B. So a 4 GiB image gets
 *    64 groups of 64 MiB (the last one 1 MiB short: the reserved MiB), a
 *    64 MiB image 63 groups of 1 MiB, a 10 MiB one 9 groups of 1 MiB and
 *    a 1 TiB device 1024 groups of 1 GiB (the last one short);
 *  - ag_count = ceil(data_blocks / ag_blocks); the last group holds the
 *    remainder (it may be shorter); group g covers absolute blocks
 *    [data_start + g * ag_blocks, + its length);
 *  - inode limit: the caller's, else one per EFS_LAYOUT_BYTES_PER_INODE
 *    (16 KiB) of data area, at least EFS_LAYOUT_INODES_MIN (1024).
 */

#include <stdint.h>
#include <stddef.h>

#include "etcfs.pb-c.h"
#include "meta/sb.h"

#define EFS_LAYOUT_RESERVED_BYTES  (1ull << 20)
#define EFS_LAYOUT_MIN_DATA_BYTES  (1ull << 20)
#define EFS_LAYOUT_AG_TARGET	   64
#define EFS_LAYOUT_AG_MIN_BYTES	   (1ull << 20)
#define EFS_LAYOUT_AG_MAX_BYTES	   (1ull << 30)
#define EFS_LAYOUT_BYTES_PER_INODE (16ull << 10)
#define EFS_LAYOUT_INODES_MIN	   1024ull
/* Largest inode limit accepted (--inodes). */
#define EFS_LAYOUT_INODES_MAX (1ull << 48)

/* Inode numbers mkfs uses; the counter "ino" starts after them. */
#define EFS_LAYOUT_ROOT_INO	  1
#define EFS_LAYOUT_LOST_FOUND_INO 2
#define EFS_LAYOUT_NEXT_INO	  3
#define EFS_LAYOUT_LOST_FOUND	  "lost+found"

/* Room for any reason string of this module. */
#define EFS_LAYOUT_REASON_MAX 256

struct efs_layout {
	uint32_t block_size;
	uint64_t device_size; /* bytes */
	uint64_t data_start;  /* first block of the data area */
	uint64_t data_blocks; /* blocks of the data area */
	uint64_t ag_blocks;   /* blocks per group (the last may be shorter) */
	uint32_t ag_count;
	uint64_t inode_limit;
};

/*
 * Computes the geometry of a device of |device_size| bytes with
 * |block_size|-byte blocks and |inodes| as the inode limit (0: the
 * default). Errors, with a sentence in |reason|: -EINVAL (block size not a
 * power of two in EFS_SB_BLOCK_MIN..EFS_SB_BLOCK_MAX, inode limit below 2
 * or above EFS_LAYOUT_INODES_MAX), -ENOSPC (device too small), -EFBIG
 * (more groups than a uint32 counts). |ret| untouched on failure.
 */
int efs_layout_compute(uint64_t device_size, uint32_t block_size, uint64_t inodes,
		       struct efs_layout *ret, char *reason, size_t reason_size);

/* Blocks in group |g| (0 when g >= ag_count). */
uint64_t efs_layout_group_blocks(const struct efs_layout *l, uint32_t g);
/* First absolute block of group |g|. */
uint64_t efs_layout_group_start(const struct efs_layout *l, uint32_t g);
/* Data blocks in total (the sum of every group's blocks). */
uint64_t efs_layout_total_blocks(const struct efs_layout *l);

/*
 * The "sb" record: |fi| is initialised and filled; uuid and name borrow
 * |uuid| and |name|. Passes efs_meta_fsinfo_check() for a valid name.
 */
void efs_layout_fsinfo(const struct efs_layout *l, const uint8_t uuid[16], const char *name,
		       int64_t now_ns, Etcfs__FsInfo *fi);

/* The device superblock agreeing with efs_layout_fsinfo() (features 0,
 * EFS_SB_FORMAT_VERSION). -EINVAL when |name| is too long. */
int efs_layout_sb(const struct efs_layout *l, const uint8_t uuid[16], const char *name,
		  int64_t now_ns, struct efs_sb *sb);

/* Inode 1: S_IFDIR|0755, |uid|/|gid|, nlink 3 (".", "..", lost+found's
 * ".."), parent 1, size 0, every time |now_ns|. */
void efs_layout_root_inode(uint32_t uid, uint32_t gid, int64_t now_ns, Etcfs__Inode *in);
/* Inode 2, lost+found: S_IFDIR|0700, root-owned, nlink 2, parent 1. */
void efs_layout_lost_found_inode(int64_t now_ns, Etcfs__Inode *in);
/* d/<1>lost+found = {ino 2, DT_DIR}. */
void efs_layout_lost_found_dirent(Etcfs__Dirent *de);

/* A group's free map with its single run, self-contained (the message
 * points into the struct: do not copy it after the call). */
struct efs_layout_agmap {
	Etcfs__AgMap map;
	Etcfs__Run run;
	Etcfs__Run *runs[1];
};

/* ag/<g>/map: one free run [0, group blocks) (group-relative). */
void efs_layout_ag_map(const struct efs_layout *l, uint32_t g, struct efs_layout_agmap *ret);
/* ag/<g>/free: the group's block count. */
void efs_layout_ag_free(const struct efs_layout *l, uint32_t g, Etcfs__AgFree *ret);
