/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pure rules of lib/fs: operation ids, setattr's timestamp and mode
 * rules, owners of new inodes, readdir cookies, xattr name rules, access
 * checks and POSIX ACL arithmetic.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "fs/fs-int.h"
#include "util/mem.h"

#include "../support/leak.h"

TestSuite(fs_unit, .timeout = 10);

/* ---- Operation ids ---- */

Test(fs_unit, opid_round_trip)
{
	uint8_t buf[EFS_FS_OPID_MAX];
	char node[EFS_META_NODE_MAX + 1];
	uint64_t gen = 0, seq = 0;
	int n = efs_fs_opid_encode(buf, "node-1", 7, 0x0102030405060708ull);

	cr_assert_eq(n, 6 + 1 + 16);
	cr_assert_eq(buf[6], 0);
	cr_assert_eq(buf[7 + 7], 7, "generation is big-endian");
	cr_assert_eq(efs_fs_opid_decode(buf, (size_t)n, node, &gen, &seq), 0);
	cr_assert_str_eq(node, "node-1");
	cr_assert_eq(gen, 7);
	cr_assert_eq(seq, 0x0102030405060708ull);
	efs_test_assert_no_leaks();
}

Test(fs_unit, opid_longest_node_fits)
{
	uint8_t buf[EFS_FS_OPID_MAX];
	char node[EFS_META_NODE_MAX + 1];
	char got[EFS_META_NODE_MAX + 1];
	uint64_t gen, seq;

	memset(node, 'n', EFS_META_NODE_MAX);
	node[EFS_META_NODE_MAX] = 0;
	cr_assert_eq(efs_fs_opid_encode(buf, node, UINT64_MAX, 1), EFS_FS_OPID_MAX);
	cr_assert_eq(efs_fs_opid_decode(buf, EFS_FS_OPID_MAX, got, &gen, &seq), 0);
	cr_assert_eq(gen, UINT64_MAX);
	cr_assert_eq(seq, 1);
	efs_test_assert_no_leaks();
}

Test(fs_unit, opid_rejects_bad_input)
{
	uint8_t buf[EFS_FS_OPID_MAX];
	char node[EFS_META_NODE_MAX + 1];
	uint64_t gen, seq;
	int n;

	cr_assert_eq(efs_fs_opid_encode(buf, "bad/node", 1, 1), -EINVAL);
	cr_assert_eq(efs_fs_opid_encode(buf, "", 1, 1), -EINVAL);
	n = efs_fs_opid_encode(buf, "a", 1, 2);
	cr_assert_eq(efs_fs_opid_decode(buf, (size_t)n - 1, node, &gen, &seq), -EINVAL);
	cr_assert_eq(efs_fs_opid_decode(buf + 1, (size_t)n - 1, node, &gen, &seq), -EINVAL);
	cr_assert_eq(efs_fs_opid_decode((const uint8_t *)"abcdefghijklmnopqrst", 20, node, &gen,
					&seq),
		     -EINVAL, "no NUL separator");
	cr_assert_eq(efs_fs_opid_decode(NULL, 0, node, &gen, &seq), -EINVAL);
	efs_test_assert_no_leaks();
}

Test(fs_unit, opid_equality)
{
	uint8_t a[EFS_FS_OPID_MAX], b[EFS_FS_OPID_MAX];
	int na = efs_fs_opid_encode(a, "n1", 3, 9);
	int nb = efs_fs_opid_encode(b, "n1", 3, 10);

	cr_assert(efs_fs_opid_equal(a, (size_t)na, a, (size_t)na));
	cr_assert_not(efs_fs_opid_equal(a, (size_t)na, b, (size_t)nb));
	cr_assert_not(efs_fs_opid_equal(a, 0, a, 0), "an empty id is nobody's");
	nb = efs_fs_opid_encode(b, "n2", 3, 9);
	cr_assert_not(efs_fs_opid_equal(a, (size_t)na, b, (size_t)nb));
	efs_test_assert_no_leaks();
}

/* ---- setattr ---- */

static Etcfs__Inode file_rec(uint32_t mode)
{
	Etcfs__Inode in = ETCFS__INODE__INIT;

	in.mode = mode;
	in.nlink = S_ISDIR(mode) ? 2 : 1;
	in.uid = 1;
	in.gid = 1;
	in.atime_ns = in.mtime_ns = in.ctime_ns = 100;
	if (S_ISDIR(mode))
		in.parent = 1;
	return in;
}

Test(fs_unit, setattr_mode_keeps_type_and_sets_ctime)
{
	Etcfs__Inode in = file_rec(S_IFREG | 0644);
	struct stat st = {0};

	st.st_mode = S_IFDIR | 04711; /* the type in the request is ignored */
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_MODE, 500), 0);
	cr_assert_eq(in.mode, S_IFREG | 04711);
	cr_assert_eq(in.ctime_ns, 500);
	cr_assert_eq(in.mtime_ns, 100, "chmod leaves mtime");
	efs_test_assert_no_leaks();
}

Test(fs_unit, chown_clears_setuid_and_group_exec_setgid)
{
	Etcfs__Inode in = file_rec(S_IFREG | 06755);
	struct stat st = {0};

	st.st_uid = 1000;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_UID, 7), 0);
	cr_assert_eq(in.uid, 1000);
	cr_assert_eq(in.mode, S_IFREG | 0755);

	/* Without group execute, S_ISGID means mandatory locking: kept. */
	in = file_rec(S_IFREG | 06745);
	st.st_gid = 5;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_GID, 7), 0);
	cr_assert_eq(in.gid, 5);
	cr_assert_eq(in.mode, S_IFREG | 02745);
	efs_test_assert_no_leaks();
}

Test(fs_unit, chown_keeps_directory_bits_and_explicit_mode)
{
	Etcfs__Inode in = file_rec(S_IFDIR | 03775);
	struct stat st = {0};

	st.st_uid = 2;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_UID, 7), 0);
	cr_assert_eq(in.mode, S_IFDIR | 03775);

	in = file_rec(S_IFREG | 0644);
	st.st_mode = 06755;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_UID | FUSE_SET_ATTR_MODE, 7), 0);
	cr_assert_eq(in.mode, S_IFREG | 06755, "a mode in the same request wins");
	efs_test_assert_no_leaks();
}

Test(fs_unit, setattr_times)
{
	Etcfs__Inode in = file_rec(S_IFREG | 0644);
	struct stat st = {0};

	st.st_atim.tv_sec = 1;
	st.st_atim.tv_nsec = 2;
	st.st_mtim.tv_sec = 3;
	st.st_mtim.tv_nsec = 4;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME,
					  900),
		     0);
	cr_assert_eq(in.atime_ns, 1000000002);
	cr_assert_eq(in.mtime_ns, 3000000004);
	cr_assert_eq(in.ctime_ns, 900);

	/* UTIME_NOW arrives as *_NOW; UTIME_OMIT as the bit not set. */
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_MTIME | FUSE_SET_ATTR_MTIME_NOW,
					  950),
		     0);
	cr_assert_eq(in.mtime_ns, 950);
	cr_assert_eq(in.atime_ns, 1000000002, "omitted atime untouched");

	st.st_ctim.tv_sec = 5;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_CTIME, 990), 0);
	cr_assert_eq(in.ctime_ns, 5000000000);
	efs_test_assert_no_leaks();
}

Test(fs_unit, setattr_size_rules)
{
	Etcfs__Inode in = file_rec(S_IFREG | 0644);
	Etcfs__Inode d = file_rec(S_IFDIR | 0755);
	Etcfs__Inode f = file_rec(S_IFIFO | 0644);
	struct stat st = {0};

	st.st_size = 12345;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_SIZE, 9), 0);
	cr_assert_eq(in.size, 12345);
	cr_assert_eq(in.ctime_ns, 9);
	cr_assert_eq(efs_fs_setattr_apply(&d, &st, FUSE_SET_ATTR_SIZE, 9), -EISDIR);
	cr_assert_eq(efs_fs_setattr_apply(&f, &st, FUSE_SET_ATTR_SIZE, 9), -EINVAL);
	st.st_size = -1;
	cr_assert_eq(efs_fs_setattr_apply(&in, &st, FUSE_SET_ATTR_SIZE, 9), -EINVAL);
	efs_test_assert_no_leaks();
}

/* ---- New inodes ---- */

Test(fs_unit, new_owner_umask_and_symlinks)
{
	Etcfs__Inode p = file_rec(S_IFDIR | 0755);
	uint32_t mode, uid, gid;

	efs_fs_new_owner(&p, 10, 20, S_IFREG | 0666, 022, true, &mode, &uid, &gid);
	cr_assert_eq(mode, S_IFREG | 0644);
	cr_assert_eq(uid, 10);
	cr_assert_eq(gid, 20);
	efs_fs_new_owner(&p, 10, 20, S_IFREG | 0666, 022, false, &mode, &uid, &gid);
	cr_assert_eq(mode, S_IFREG | 0666, "a default ACL replaces the umask");
	efs_fs_new_owner(&p, 10, 20, S_IFLNK | 0600, 077, true, &mode, &uid, &gid);
	cr_assert_eq(mode, S_IFLNK | 0777);
	efs_test_assert_no_leaks();
}

Test(fs_unit, new_owner_setgid_directory)
{
	Etcfs__Inode p = file_rec(S_IFDIR | 02775);
	uint32_t mode, uid, gid;

	p.gid = 77;
	efs_fs_new_owner(&p, 10, 20, S_IFREG | 0644, 0, true, &mode, &uid, &gid);
	cr_assert_eq(gid, 77);
	cr_assert_eq(mode, S_IFREG | 0644, "files do not inherit S_ISGID");
	efs_fs_new_owner(&p, 10, 20, S_IFDIR | 0755, 0, true, &mode, &uid, &gid);
	cr_assert_eq(gid, 77);
	cr_assert_eq(mode, S_IFDIR | 02755, "directories do");
	efs_test_assert_no_leaks();
}

/* ---- Readdir cookies ---- */

Test(fs_unit, dir_positions)
{
	cr_assert_eq(efs_fs_dir_index(0, 5), -1, "offset 0 starts with .");
	cr_assert_eq(efs_fs_dir_index(1, 5), -2, "then ..");
	cr_assert_eq(efs_fs_dir_index(2, 5), 0);
	cr_assert_eq(efs_fs_dir_index(7, 5), 5, "past the known entries: read more");
	cr_assert_eq(efs_fs_dir_index(1000, 0), 998, "offsets beyond stay positions");
	efs_test_assert_no_leaks();
}

/* ---- Kernel cache bound (7.1) ---- */

Test(fs_unit, cache_bound_stops_at_suspension)
{
	const uint64_t ms = 1000000, s = 1000 * ms, now = 100 * s;

	/* TTL 2 s, renewed just now: 1 s to suspension, the 0.5 s timeout fits. */
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 2 * s, 2), 500 * ms);
	/* Renewals lagging: 1.2 s left of the lease, 0.2 s to suspension. */
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 1200 * ms, 2), 200 * ms);
	/* At or past the suspension point, or past the deadline: nothing. */
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 1 * s, 2), 0);
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 300 * ms, 2), 0);
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now - 1, 2), 0);
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, 0, 2), 0);
	/* TTL unknown: TTL/2 taken as twice the cache timeout. */
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 1300 * ms, 0), 300 * ms);
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 3 * s, 0), 500 * ms);
	/* A longer TTL than asked for: its own half counts. */
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 5500 * ms, 10), 500 * ms);
	cr_assert_eq(efs_fs_cache_bound(500 * ms, now, now + 5100 * ms, 10), 100 * ms);
	efs_test_assert_no_leaks();
}

/* ---- Xattr names ---- */

Test(fs_unit, xattr_rules)
{
	char big[EFS_META_XATTR_NAME_MAX + 2];

	cr_assert_eq(efs_fs_xattr_check("user.a", 10, 1000, true), 0);
	cr_assert_eq(efs_fs_xattr_check("user.a", EFS_META_XATTR_VALUE_MAX, 1000, true), 0);
	cr_assert_eq(efs_fs_xattr_check("user.a", EFS_META_XATTR_VALUE_MAX + 1, 1000, true),
		     -E2BIG);
	cr_assert_eq(efs_fs_xattr_check("trusted.x", 1, 1000, true), -EPERM);
	cr_assert_eq(efs_fs_xattr_check("trusted.x", 0, 1000, false), -ENODATA);
	cr_assert_eq(efs_fs_xattr_check("trusted.x", 1, 0, true), 0);
	cr_assert_eq(efs_fs_xattr_check("security.selinux", 1, 1000, true), 0);
	cr_assert_eq(efs_fs_xattr_check("system.posix_acl_access", 28, 1000, true), 0);
	cr_assert_eq(efs_fs_xattr_check("system.other", 1, 0, true), -EOPNOTSUPP);
	cr_assert_eq(efs_fs_xattr_check("nonamespace", 1, 0, true), -EOPNOTSUPP);
	cr_assert_eq(efs_fs_xattr_check("user.", 1, 0, true), -EINVAL);
	cr_assert_eq(efs_fs_xattr_check("", 1, 0, true), -EINVAL);
	memset(big, 'a', sizeof(big) - 1);
	memcpy(big, "user.", 5);
	big[sizeof(big) - 1] = 0;
	cr_assert_eq(efs_fs_xattr_check(big, 1, 0, true), -ERANGE);
	efs_test_assert_no_leaks();
}

/* ---- access(2) ---- */

Test(fs_unit, access_classes)
{
	Etcfs__Inode in = file_rec(S_IFREG | 0640);
	gid_t groups[] = {5, 1};

	in.uid = 10;
	in.gid = 1;
	cr_assert_eq(efs_fs_access_check(&in, R_OK | W_OK, 10, 99, NULL, 0), 0);
	cr_assert_eq(efs_fs_access_check(&in, X_OK, 10, 99, NULL, 0), -EACCES);
	cr_assert_eq(efs_fs_access_check(&in, R_OK, 11, 1, NULL, 0), 0);
	cr_assert_eq(efs_fs_access_check(&in, W_OK, 11, 1, NULL, 0), -EACCES);
	cr_assert_eq(efs_fs_access_check(&in, R_OK, 11, 99, groups, 2), 0, "supplementary");
	cr_assert_eq(efs_fs_access_check(&in, R_OK, 11, 99, NULL, 0), -EACCES);
	cr_assert_eq(efs_fs_access_check(&in, F_OK, 11, 99, NULL, 0), 0);
	cr_assert_eq(efs_fs_access_check(&in, R_OK | W_OK, 0, 0, NULL, 0), 0, "root");
	cr_assert_eq(efs_fs_access_check(&in, X_OK, 0, 0, NULL, 0), -EACCES,
		     "root needs one x bit on files");
	in.mode = S_IFDIR | 0700;
	cr_assert_eq(efs_fs_access_check(&in, X_OK, 0, 0, NULL, 0), 0);
	efs_test_assert_no_leaks();
}

/* ---- POSIX ACLs ---- */

static size_t acl_build(uint8_t *buf, const uint16_t (*ents)[3], size_t n)
{
	buf[0] = 2;
	buf[1] = buf[2] = buf[3] = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t *e = buf + 4 + 8 * i;

		e[0] = (uint8_t)ents[i][0];
		e[1] = 0;
		e[2] = (uint8_t)ents[i][1];
		e[3] = 0;
		e[4] = (uint8_t)ents[i][2];
		e[5] = e[6] = e[7] = 0;
	}
	return 4 + 8 * n;
}

static int acl_perm(const uint8_t *buf, size_t len, uint16_t tag)
{
	for (size_t off = 4; off + 8 <= len; off += 8)
		if (buf[off] == tag)
			return buf[off + 2];
	return -1;
}

Test(fs_unit, acl_mode)
{
	const uint16_t min[][3] = {{0x01, 6, 0}, {0x04, 4, 0}, {0x20, 4, 0}};
	const uint16_t ext[][3] = {{0x01, 6, 0}, {0x02, 7, 1000}, {0x04, 4, 0},
				   {0x10, 7, 0}, {0x20, 0, 0}};
	uint8_t buf[64];
	uint32_t perm;
	bool minimal;
	size_t n;

	n = acl_build(buf, min, 3);
	cr_assert_eq(efs_fs_acl_to_mode(buf, n, &perm, &minimal), 0);
	cr_assert_eq(perm, 0644);
	cr_assert(minimal);
	n = acl_build(buf, ext, 5);
	cr_assert_eq(efs_fs_acl_to_mode(buf, n, &perm, &minimal), 0);
	cr_assert_eq(perm, 0670, "the mask stands for the group");
	cr_assert_not(minimal);
	cr_assert_eq(efs_fs_acl_to_mode(buf, n - 1, &perm, &minimal), -EINVAL);
	buf[0] = 1;
	cr_assert_eq(efs_fs_acl_to_mode(buf, n, &perm, &minimal), -EINVAL, "version 1");
	efs_test_assert_no_leaks();
}

Test(fs_unit, acl_chmod_rewrites_mask)
{
	const uint16_t ext[][3] = {{0x01, 6, 0}, {0x02, 7, 1000}, {0x04, 4, 0},
				   {0x10, 7, 0}, {0x20, 4, 0}};
	uint8_t buf[64];
	size_t n = acl_build(buf, ext, 5);

	cr_assert_eq(efs_fs_acl_chmod(buf, n, 0750), 0);
	cr_assert_eq(acl_perm(buf, n, 0x01), 7);
	cr_assert_eq(acl_perm(buf, n, 0x10), 5);
	cr_assert_eq(acl_perm(buf, n, 0x04), 4, "group_obj untouched under a mask");
	cr_assert_eq(acl_perm(buf, n, 0x20), 0);
	efs_test_assert_no_leaks();
}

Test(fs_unit, acl_inherit_masks_with_create_mode)
{
	const uint16_t def[][3] = {{0x01, 7, 0}, {0x02, 5, 1000}, {0x04, 5, 0},
				   {0x10, 5, 0}, {0x20, 5, 0}};
	const uint16_t defmin[][3] = {{0x01, 7, 0}, {0x04, 5, 0}, {0x20, 0, 0}};
	uint8_t buf[64];
	uint32_t mode = S_IFREG | 0666;
	size_t n = acl_build(buf, def, 5);

	cr_assert_eq(efs_fs_acl_inherit(buf, n, &mode), 1);
	cr_assert_eq(mode, S_IFREG | 0644);
	cr_assert_eq(acl_perm(buf, n, 0x10), 4);
	cr_assert_eq(acl_perm(buf, n, 0x02), 5, "named entries stay, masked");

	mode = S_IFDIR | 0777;
	n = acl_build(buf, defmin, 3);
	cr_assert_eq(efs_fs_acl_inherit(buf, n, &mode), 0, "a minimal ACL is just a mode");
	cr_assert_eq(mode, S_IFDIR | 0750);
	efs_test_assert_no_leaks();
}

/* ---- Relatime ---- */

Test(fs_unit, atime_relatime_rule)
{
	Etcfs__Inode in = file_rec(S_IFDIR | 0755);
	const int64_t day = 24ll * 3600 * 1000000000;

	in.atime_ns = 100;
	in.mtime_ns = 200;
	in.ctime_ns = 50;
	cr_assert(efs_fs_atime_due(&in, 300), "atime before mtime");
	in.atime_ns = 200;
	cr_assert(efs_fs_atime_due(&in, 300), "atime equal to mtime");
	in.atime_ns = 250;
	cr_assert_not(efs_fs_atime_due(&in, 300), "atime after mtime and ctime, fresh");
	in.ctime_ns = 260;
	cr_assert(efs_fs_atime_due(&in, 300), "atime before ctime");
	in.ctime_ns = 50;
	cr_assert(efs_fs_atime_due(&in, 250 + day), "a day old");
	efs_test_assert_no_leaks();
}

/* SETATTR replies keep a timeout only on kernels that version them. */
Test(fs_unit, kernel_release_that_versions_setattr_replies)
{
	static const struct {
		const char *release;
		bool versioned;
	} cases[] = {
		{"6.16.0", true},	     {"6.18.44-fc-v1272", true}, {"6.16", true},
		{"7.0.1", true},	     {"10.1", true},		 {"6.15.9-amd64", false},
		{"6.1.0-28-amd64", false}, {"5.19.17", false},	 {"6", false},
		{"6.", false},		     {"", false},		 {"abc", false},
		{".16", false},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		cr_assert_eq(efs_fs_kernel_versions_setattr(cases[i].release), cases[i].versioned,
			     "release '%s'", cases[i].release);
	cr_assert_not(efs_fs_kernel_versions_setattr(NULL));
}
