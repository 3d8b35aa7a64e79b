/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Histories of file system operations and their linearizability checker.
 *
 * A history is what several processes did to a few paths of one shared
 * directory: every operation with its invoke and response times (one
 * CLOCK_MONOTONIC, all processes on one machine) and what it observed.
 * The checker decides whether every observation fits one serial order of
 * the operations, consistent with real time, of a sequential model of a
 * file system (docs/TESTING.md, "Histories"): paths name inodes, inodes
 * have a mode and contents in blocks of EFS_HIST_BLOCK bytes, each block
 * written whole with one fill byte.
 *
 * Files never grow past EFS_HIST_BLOCKS blocks, writes and truncates are
 * block-aligned, so a read or a stat that shows any other size, or a block
 * mixing two fills, is already outside the model.
 *
 * The runner (efs_hist_run_proc) is plain POSIX and knows nothing of the
 * cluster; the checker is pure code with its own unit test
 * (test_history).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EFS_HIST_BLOCK	    256
#define EFS_HIST_BLOCKS	    16
#define EFS_HIST_MAX_PATHS  8
#define EFS_HIST_MAX_PROCS  8
/* A block whose bytes are not all one value, in efs_hist_op.blk. */
#define EFS_HIST_MIXED	    0x100

enum efs_hist_kind {
	EFS_HIST_CREATE,   /* open(O_CREAT | O_EXCL) and close: 0 or EEXIST */
	EFS_HIST_OPEN_W,   /* open(O_WRONLY): the handle of the next PWRITE */
	EFS_HIST_OPEN_R,   /* open(O_RDONLY): the handle of the next PREAD */
	EFS_HIST_PWRITE,   /* through the handle opened last, then closed */
	EFS_HIST_PREAD,	   /* the whole file from offset 0, then closed */
	EFS_HIST_STAT,	   /* size and mode, or ENOENT */
	EFS_HIST_TRUNCATE, /* truncate(path, len blocks) */
	EFS_HIST_CHMOD,
	EFS_HIST_RENAME, /* path to path2 */
	EFS_HIST_UNLINK,
	/* The checker's own, never recorded: the name lookup of a STAT,
	 * TRUNCATE or CHMOD, which then acts on the inode it found. */
	EFS_HIST_LOOKUP,
};

/* One operation: its arguments, then what it observed. */
struct efs_hist_op {
	uint64_t call_ns; /* CLOCK_MONOTONIC before the system call */
	uint64_t ret_ns;  /* ... and after it */
	uint8_t proc;	  /* the process (< EFS_HIST_MAX_PROCS) */
	uint8_t node;	  /* the node it ran on (for reports only) */
	uint8_t kind;	  /* enum efs_hist_kind */
	uint8_t path;	  /* < EFS_HIST_MAX_PATHS */
	uint8_t path2;	  /* RENAME's target */
	uint8_t off;	  /* PWRITE: first block */
	uint8_t len;	  /* PWRITE: blocks; TRUNCATE: the new size in blocks */
	uint8_t fill;	  /* PWRITE: the byte every written block is filled with */
	uint16_t mode;	  /* CREATE, CHMOD: permission bits */
	/* Results. */
	int err;	  /* 0 or the errno; for PWRITE a short write is EIO */
	uint16_t st_mode; /* STAT: permission bits */
	uint32_t size;	  /* STAT: st_size; PREAD: bytes read */
	uint16_t blk[EFS_HIST_BLOCKS]; /* PREAD: each whole block's byte, or EFS_HIST_MIXED */
};

/* What the processes of a run do: weights per kind of operation (a write
 * is an OPEN_W and a PWRITE, a read an OPEN_R and a PREAD), and a pause. */
struct efs_hist_mix {
	unsigned create, write, read, stat, truncate, chmod, rename, unlink;
	unsigned pause_ms; /* after each operation */
};

/*
 * Runs process |proc| of a history in directory |dir|: up to |nops|
 * operations drawn from |mix| by a generator seeded with |seed| and
 * |proc| (the same two always give the same sequence of operations,
 * whatever they observe), stopping early at CLOCK_MONOTONIC |deadline_ns|.
 * Paths are "p0".."p<npaths-1>" in |dir|; renames stay within a pair
 * (p0 <-> p1, p2 <-> p3, ...), so each pair is checked on its own. Every
 * system call is bounded by |op_timeout_s| (an alarm: a lock wait is
 * interruptible, and its EINTR is recorded). Records into |log| (room for
 * 2 * |nops|) and returns how many were recorded. Sets the umask to 0.
 */
size_t efs_hist_run_proc(const char *dir, int npaths, const struct efs_hist_mix *mix,
			 uint64_t seed, int proc, int node, size_t nops, uint64_t deadline_ns,
			 unsigned op_timeout_s, struct efs_hist_op *log);

/* The pair ("group") of path |p| under the runner's rename rule. */
static inline int efs_hist_group(int p)
{
	return p / 2;
}

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t efs_hist_now_ns(void);

/* One line describing |op| (with its result) in |buf|; returns |buf|. */
const char *efs_hist_op_str(const struct efs_hist_op *op, char *buf, size_t size);

/*
 * Checks that |ops| (|n| of them, in any order) is linearizable against
 * the model (|flags|: EFS_HIST_* below), path group by path group
 * (efs_hist_group), with a search
 * bounded by |budget_ms| of CPU time in all. Returns 0 when it is;
 * -EINVAL when it is not, or an operation failed with an errno the model
 * never gives (EIO, EINTR from a timeout, ...): |report| says which
 * operations no serial order explains and what the model expected;
 * -ETIMEDOUT when the budget ran out first (a failure too: nothing was
 * shown); -ENOMEM. |states| (may be NULL) gets the number of distinct
 * search states visited.
 */
int efs_hist_check(const struct efs_hist_op *ops, size_t n, unsigned flags, uint64_t budget_ms,
		   char *report, size_t size, uint64_t *states);

/*
 * A flag of efs_hist_check: a PWRITE or PREAD through a handle whose inode
 * no path names any more (unlinked, or replaced by a rename) may fail with
 * ENOENT or ESTALE instead of working. A node cannot keep a file another
 * node unlinked until open references exist across nodes (issue 12); until
 * then the cluster checks pass this (and print how many operations
 * failed so). Everything else is still checked.
 */
#define EFS_HIST_ORPHAN_IO_MAY_FAIL 1u
/* (It also lets a STAT, TRUNCATE or CHMOD fail with ESTALE when the inode
 * its lookup found lost its last name before the call reached it.) */

/*
 * A flag of efs_hist_check: a PREAD that overlaps a PWRITE extending the
 * same file may see the write's blocks below the old size written and the
 * size not yet moved, as a read on the writer's own node may on any Linux
 * file system (the kernel copies into the page before it moves i_size);
 * across nodes a recall can publish the writer's state at that moment.
 * The read must still fit the state before the write in everything else.
 */
#define EFS_HIST_WRITE_SIZE_LAGS 2u
