/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The history checker on hand-made histories: linearizable ones are
 * accepted (including ones only a reordering of overlapping operations
 * explains), and each kind of violation is rejected with a report naming
 * it; a search that cannot finish in its budget says so.
 */
#include "history.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "../support/leak.h"

TestSuite(history, .timeout = 60);

#define MAX_OPS 8192

static struct efs_hist_op h[MAX_OPS];
static size_t n;
static unsigned flags;
static char report[8192];

/* Appends an operation of |proc| on |path|, called at |t0| and answered
 * at |t1| (milliseconds), that observed |err|. */
static struct efs_hist_op *op(int kind, int proc, int path, unsigned t0, unsigned t1, int err)
{
	struct efs_hist_op *o = &h[n++];

	cr_assert(n <= MAX_OPS);
	memset(o, 0, sizeof(*o));
	o->kind = (uint8_t)kind;
	o->proc = (uint8_t)proc;
	o->path = (uint8_t)path;
	o->call_ns = (uint64_t)t0 * 1000000u;
	o->ret_ns = (uint64_t)t1 * 1000000u;
	o->err = err;
	return o;
}

static struct efs_hist_op *create(int proc, int path, unsigned t0, unsigned t1, int err)
{
	struct efs_hist_op *o = op(EFS_HIST_CREATE, proc, path, t0, t1, err);

	o->mode = 0644;
	return o;
}

/* An OPEN_W and a PWRITE of |len| blocks from |off| filled with |fill|. */
static void write_at(int proc, int path, unsigned t0, unsigned t1, unsigned off, unsigned len,
		     unsigned fill)
{
	struct efs_hist_op *o;

	op(EFS_HIST_OPEN_W, proc, path, t0, t0 + 1, 0);
	o = op(EFS_HIST_PWRITE, proc, path, t0 + 1, t1, 0);
	o->off = (uint8_t)off;
	o->len = (uint8_t)len;
	o->fill = (uint8_t)fill;
}

/* An OPEN_R and a PREAD that saw the blocks |blk| (|nblk| of them). */
static void read_saw(int proc, int path, unsigned t0, unsigned t1, const uint16_t *blk,
		     unsigned nblk)
{
	struct efs_hist_op *o;

	op(EFS_HIST_OPEN_R, proc, path, t0, t0 + 1, 0);
	o = op(EFS_HIST_PREAD, proc, path, t0 + 1, t1, 0);
	o->size = nblk * EFS_HIST_BLOCK;
	memcpy(o->blk, blk, nblk * sizeof(*blk));
}

static struct efs_hist_op *stat_saw(int proc, int path, unsigned t0, unsigned t1, int err,
				    unsigned size, unsigned mode)
{
	struct efs_hist_op *o = op(EFS_HIST_STAT, proc, path, t0, t1, err);

	o->size = size;
	o->st_mode = (uint16_t)mode;
	return o;
}

static int check(void)
{
	int rc = efs_hist_check(h, n, flags, 10000, report, sizeof(report), NULL);

	cr_log_info("%s", report);
	return rc;
}

static void init(void)
{
	n = 0;
	flags = 0;
	report[0] = '\0';
}

static const uint16_t seven[] = {7}, seven_nine[] = {7, 9}, zero_seven[] = {0, 7};

Test(history, a_serial_history_is_linearizable, .init = init)
{
	create(0, 0, 0, 10, 0);
	write_at(1, 0, 20, 30, 0, 1, 7);
	read_saw(2, 0, 40, 50, seven, 1);
	stat_saw(0, 0, 60, 70, 0, 256, 0644);
	create(1, 0, 80, 90, EEXIST);
	write_at(0, 0, 100, 110, 1, 1, 9);
	read_saw(1, 0, 120, 130, seven_nine, 2);
	op(EFS_HIST_TRUNCATE, 2, 0, 140, 150, 0)->len = 0;
	stat_saw(0, 0, 160, 170, 0, 0, 0644);
	op(EFS_HIST_UNLINK, 1, 0, 180, 190, 0);
	stat_saw(2, 0, 200, 210, ENOENT, 0, 0);
	op(EFS_HIST_UNLINK, 1, 0, 220, 230, ENOENT);
	cr_assert_eq(check(), 0);
	efs_test_assert_no_leaks();
}

/* Overlapping operations that fit only in an order other than their calls'. */
Test(history, overlapping_operations_may_take_effect_in_any_order, .init = init)
{
	create(0, 0, 0, 10, 0);
	/* The write of 9 is called first, yet the read that overlaps both
	 * sees 7 last: 9 then 7 fits. */
	write_at(0, 0, 20, 60, 0, 1, 9);
	write_at(1, 0, 25, 70, 0, 1, 7);
	read_saw(2, 0, 30, 80, seven, 1);
	read_saw(2, 0, 90, 100, seven, 1);
	/* A stat and a chmod overlapping: the stat saw the new mode. */
	op(EFS_HIST_CHMOD, 0, 0, 110, 130, 0)->mode = 0600;
	stat_saw(1, 0, 105, 140, 0, 256, 0600);
	cr_assert_eq(check(), 0);
	efs_test_assert_no_leaks();
}

Test(history, a_read_of_a_value_never_written_is_rejected, .init = init)
{
	const uint16_t five[] = {5};

	create(0, 0, 0, 10, 0);
	write_at(1, 0, 20, 30, 0, 1, 7);
	read_saw(2, 0, 25, 50, five, 1);
	cr_assert_eq(check(), -EINVAL);
	cr_assert(strstr(report, "pread p0: 256 bytes: 5"), "%s", report);
	efs_test_assert_no_leaks();
}

Test(history, a_stale_read_after_a_completed_write_is_rejected, .init = init)
{
	create(0, 0, 0, 10, 0);
	write_at(1, 0, 20, 30, 0, 1, 7);
	read_saw(2, 0, 35, 40, seven, 1);
	write_at(1, 0, 50, 60, 0, 1, 9);
	/* Called after the write of 9 returned, it sees 7. */
	read_saw(2, 0, 70, 80, seven, 1);
	cr_assert_eq(check(), -EINVAL);
	cr_assert(strstr(report, "(the model: 256 bytes: 9)"), "%s", report);
	efs_test_assert_no_leaks();
}

Test(history, a_stale_mode_and_a_stale_name_are_rejected, .init = init)
{
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_CHMOD, 0, 0, 20, 30, 0)->mode = 0600;
	stat_saw(1, 0, 40, 50, 0, 0, 0644);
	cr_assert_eq(check(), -EINVAL);
	cr_assert(strstr(report, "(the model: size 0 mode 0600)"), "%s", report);

	init();
	create(0, 2, 0, 10, 0);
	stat_saw(1, 2, 20, 30, ENOENT, 0, 0);
	cr_assert_eq(check(), -EINVAL);
	cr_assert(strstr(report, "paths p2/p3"), "%s", report);
	efs_test_assert_no_leaks();
}

Test(history, renames_move_inodes_and_replace_targets, .init = init)
{
	create(0, 0, 0, 10, 0);
	create(1, 1, 0, 10, 0);
	write_at(0, 0, 20, 30, 0, 1, 7);
	/* p0 is opened, renamed over p1, then written through the handle. */
	op(EFS_HIST_OPEN_W, 2, 0, 40, 41, 0);
	op(EFS_HIST_RENAME, 1, 0, 50, 60, 0)->path2 = 1;
	{
		struct efs_hist_op *o = op(EFS_HIST_PWRITE, 2, 0, 70, 80, 0);

		o->off = 1;
		o->len = 1;
		o->fill = 9;
	}
	stat_saw(0, 0, 90, 100, ENOENT, 0, 0);
	read_saw(0, 1, 110, 120, seven_nine, 2);
	cr_assert_eq(check(), 0);

	/* After the rename completed, p0 still answers: rejected. */
	init();
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_RENAME, 1, 0, 20, 30, 0)->path2 = 1;
	stat_saw(0, 0, 40, 50, 0, 0, 0644);
	cr_assert_eq(check(), -EINVAL);
	efs_test_assert_no_leaks();
}

Test(history, an_unlinked_file_stays_readable_through_its_handle, .init = init)
{
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_TRUNCATE, 0, 0, 15, 18, 0)->len = 1;
	write_at(0, 0, 20, 30, 1, 1, 7);
	op(EFS_HIST_OPEN_R, 1, 0, 40, 41, 0);
	op(EFS_HIST_UNLINK, 2, 0, 50, 60, 0);
	create(2, 0, 70, 80, 0);
	{
		struct efs_hist_op *o = op(EFS_HIST_PREAD, 1, 0, 90, 100, 0);

		o->size = 2 * EFS_HIST_BLOCK;
		memcpy(o->blk, zero_seven, sizeof(zero_seven));
	}
	stat_saw(0, 0, 110, 120, 0, 0, 0644);
	cr_assert_eq(check(), 0);
	efs_test_assert_no_leaks();
}

Test(history, an_errno_outside_the_model_is_rejected, .init = init)
{
	create(0, 0, 0, 10, 0);
	stat_saw(1, 0, 20, 5000, EINTR, 0, 0);
	op(EFS_HIST_RENAME, 1, 2, 20, 30, EIO)->path2 = 3;
	cr_assert_eq(check(), -EINVAL);
	cr_assert(strstr(report, "Interrupted system call (timed out)"), "%s", report);
	cr_assert(strstr(report, "rename p2 -> p3: Input/output error"), "%s", report);
	efs_test_assert_no_leaks();
}

/*
 * A search that cannot finish in its budget says so rather than pass:
 * here a budget of 0 ms, and more operations than the search does between
 * two looks at the clock.
 */
Test(history, a_search_past_its_budget_is_reported, .init = init)
{
	for (unsigned i = 0; i < 6000; i++) {
		int proc = (int)(i % EFS_HIST_MAX_PROCS);
		unsigned t = 10 * (i / EFS_HIST_MAX_PROCS) + (unsigned)proc;

		stat_saw(proc, 0, t, t + 15, ENOENT, 0, 0);
	}
	cr_assert_eq(efs_hist_check(h, n, 0, 0, report, sizeof(report), NULL), -ETIMEDOUT);
	cr_assert(strstr(report, "budget"), "%s", report);
	efs_test_assert_no_leaks();
}

/* With EFS_HIST_ORPHAN_IO_MAY_FAIL, I/O through a handle whose file lost
 * its last name may fail with ENOENT; I/O on a named file still may not. */
Test(history, io_on_an_unlinked_file_may_fail_only_when_allowed, .init = init)
{
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_OPEN_W, 1, 0, 20, 21, 0);
	op(EFS_HIST_UNLINK, 2, 0, 30, 40, 0);
	op(EFS_HIST_PWRITE, 1, 0, 50, 60, ENOENT)->len = 1;
	cr_assert_eq(check(), -EINVAL);
	flags = EFS_HIST_ORPHAN_IO_MAY_FAIL;
	cr_assert_eq(check(), 0);

	init();
	flags = EFS_HIST_ORPHAN_IO_MAY_FAIL;
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_OPEN_W, 1, 0, 20, 21, 0);
	op(EFS_HIST_PWRITE, 1, 0, 50, 60, ENOENT)->len = 1;
	cr_assert_eq(check(), -EINVAL);
	efs_test_assert_no_leaks();
}

/* With EFS_HIST_WRITE_SIZE_LAGS, a read overlapping a write that extends
 * the file may see the write's blocks below the old size, the size not
 * moved yet; never after the write returned, never past the old size. */
Test(history, a_read_may_see_an_extending_write_in_flight_only_when_allowed, .init = init)
{
	const uint16_t old_new[] = {7, 9}, old_old[] = {7, 7};

	create(0, 0, 0, 10, 0);
	write_at(0, 0, 20, 30, 0, 2, 7);
	op(EFS_HIST_OPEN_W, 1, 0, 40, 41, 0);
	{
		struct efs_hist_op *o = op(EFS_HIST_PWRITE, 1, 0, 41, 100, 0);

		o->off = 1;
		o->len = 2;
		o->fill = 9;
	}
	read_saw(2, 0, 50, 60, old_new, 2);
	read_saw(2, 0, 70, 80, old_old, 2);
	cr_assert_eq(check(), -EINVAL);
	flags = EFS_HIST_WRITE_SIZE_LAGS;
	/* 7 9 then 7 7 again: the write is not linearized by the first read. */
	cr_assert_eq(check(), 0);
	/* After the write returned: the whole write or nothing. */
	read_saw(2, 0, 110, 120, old_new, 2);
	cr_assert_eq(check(), -EINVAL);
	efs_test_assert_no_leaks();
}

/*
 * stat, truncate and chmod of a path look the name up, then act on the
 * inode found, as the kernel does: a chmod of p1 that looked p1 up while
 * a rename p1 -> p0 was under way changes p0's inode (the rename holds
 * the inode, the chmod waits), even after a stat of p0 showed the old
 * mode. Nothing else is allowed: a chmod invoked after the rename
 * returned finds no p1, and a stat invoked after the chmod returned sees
 * its mode.
 */
Test(history, a_path_call_acts_on_the_inode_its_lookup_found, .init = init)
{
	struct efs_hist_op *o;

	create(0, 0, 0, 10, 0);
	op(EFS_HIST_RENAME, 0, 0, 20, 30, 0)->path2 = 1;
	/* p1 -> p0 from 40 to 60; chmod p1 from 45 to 70. */
	op(EFS_HIST_RENAME, 0, 1, 40, 60, 0)->path2 = 0;
	op(EFS_HIST_CHMOD, 1, 1, 45, 70, 0)->mode = 0600;
	stat_saw(0, 0, 62, 63, 0, 0, 0644);
	op(EFS_HIST_RENAME, 0, 1, 64, 65, ENOENT)->path2 = 0;
	create(0, 1, 80, 90, 0);
	stat_saw(2, 0, 100, 110, 0, 0, 0600);
	cr_assert_eq(check(), 0, "%s", report);

	/* A stat after the chmod returned still sees the old mode. */
	stat_saw(2, 0, 120, 130, 0, 0, 0644);
	cr_assert_eq(check(), -EINVAL);

	/* A chmod invoked after the rename returned: p1 is gone. */
	init();
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_RENAME, 0, 0, 20, 30, 0)->path2 = 1;
	op(EFS_HIST_RENAME, 0, 1, 40, 60, 0)->path2 = 0;
	op(EFS_HIST_CHMOD, 1, 1, 61, 70, 0)->mode = 0600;
	cr_assert_eq(check(), -EINVAL);
	cr_assert(strstr(report, "chmod p1 0600: ok"), "%s", report);

	/* truncate and stat take two steps too: a truncate of p0 that looked
	 * up the first file acts on it though a new p0 was made meanwhile. */
	init();
	create(0, 0, 0, 10, 0);
	write_at(0, 0, 20, 30, 0, 2, 7);
	o = op(EFS_HIST_TRUNCATE, 1, 0, 40, 100, 0);
	o->len = 1;
	op(EFS_HIST_RENAME, 0, 0, 50, 60, 0)->path2 = 1;
	create(0, 0, 70, 80, 0);
	stat_saw(2, 1, 110, 120, 0, EFS_HIST_BLOCK, 0644);
	stat_saw(2, 0, 130, 140, 0, 0, 0644);
	cr_assert_eq(check(), 0, "%s", report);
	efs_test_assert_no_leaks();
}

/* With EFS_HIST_ORPHAN_IO_MAY_FAIL, a chmod whose inode lost its last name
 * between its lookup and its call may fail with ESTALE; one whose inode
 * kept its name may not. */
Test(history, a_path_call_may_find_its_inode_gone_only_when_allowed, .init = init)
{
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_CHMOD, 1, 0, 20, 60, ESTALE)->mode = 0600;
	op(EFS_HIST_UNLINK, 0, 0, 30, 40, 0);
	cr_assert_eq(check(), -EINVAL);
	flags = EFS_HIST_ORPHAN_IO_MAY_FAIL;
	cr_assert_eq(check(), 0, "%s", report);

	init();
	flags = EFS_HIST_ORPHAN_IO_MAY_FAIL;
	create(0, 0, 0, 10, 0);
	op(EFS_HIST_CHMOD, 1, 0, 20, 60, ESTALE)->mode = 0600;
	stat_saw(0, 0, 30, 40, 0, 0, 0644);
	cr_assert_eq(check(), -EINVAL);
	efs_test_assert_no_leaks();
}
