/* SPDX-License-Identifier: Apache-2.0 */
/* Geometry and the initial records of lib/meta/layout.h. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "meta/layout.h"
#include "meta/records.h"
#include "meta/sb.h"
#include "util/mem.h"

TestSuite(layout, .timeout = 30);

#define MiB (1ull << 20)
#define GiB (1ull << 30)
#define TiB (1ull << 40)

static const uint8_t UUID[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
				 0x0f, 0xed, 0xcb, 0xa9, 0x87, 0x65, 0x43, 0x21};

static struct efs_layout compute(uint64_t size, uint32_t bs, uint64_t inodes)
{
	struct efs_layout l;
	char why[EFS_LAYOUT_REASON_MAX];

	cr_assert_eq(efs_layout_compute(size, bs, inodes, &l, why, sizeof(why)), 0, "%s", why);
	cr_assert_str_empty(why);
	return l;
}

/* Every group but the last is full, they tile the data area, and the
 * FsInfo invariant ag_count == ceil(data / ag_blocks) holds. */
static void check_tiling(const struct efs_layout *l)
{
	uint64_t sum = 0;

	cr_assert_gt(l->ag_count, 0);
	for (uint32_t g = 0; g < l->ag_count; g++) {
		uint64_t n = efs_layout_group_blocks(l, g);

		cr_assert_gt(n, 0, "group %u empty", g);
		cr_assert_leq(n, l->ag_blocks);
		if (g + 1 < l->ag_count)
			cr_assert_eq(n, l->ag_blocks);
		cr_assert_eq(efs_layout_group_start(l, g), l->data_start + sum);
		sum += n;
	}
	cr_assert_eq(sum, l->data_blocks);
	cr_assert_eq(efs_layout_total_blocks(l), l->data_blocks);
	cr_assert_eq(efs_layout_group_blocks(l, l->ag_count), 0);
	cr_assert_eq(l->data_start + l->data_blocks, l->device_size / l->block_size);
	cr_assert_eq((l->data_blocks - 1) / l->ag_blocks + 1, l->ag_count);
}

Test(layout, four_gib_image_gets_64_groups_of_64_mib)
{
	struct efs_layout l = compute(4 * GiB, 4096, 0);

	cr_assert_eq(l.block_size, 4096);
	cr_assert_eq(l.device_size, 4 * GiB);
	cr_assert_eq(l.data_start, 256, "the first MiB is reserved");
	cr_assert_eq(l.data_blocks, 4 * GiB / 4096 - 256);
	cr_assert_eq(l.ag_blocks * 4096, 64 * MiB);
	cr_assert_eq(l.ag_count, 64);
	cr_assert_eq(efs_layout_group_blocks(&l, 63), 16384 - 256, "the last is short");
	cr_assert_eq(l.inode_limit, (4 * GiB - MiB) / (16 * 1024));
	check_tiling(&l);
}

Test(layout, group_size_is_a_clamped_power_of_two)
{
	static const struct {
		uint64_t size;
		uint32_t bs;
		uint64_t ag_bytes;
	} cases[] = {
		{2 * MiB, 4096, MiB},	       /* the smallest device */
		{10 * MiB, 4096, MiB},	       /* clamped up to 1 MiB */
		{64 * MiB, 4096, MiB},	       /* exactly 1 MiB */
		{128 * MiB, 4096, 2 * MiB},    /* 128 / 64 */
		{200 * MiB, 4096, 2 * MiB},    /* largest power of two below 3.1 MiB */
		{GiB, 1024, 16 * MiB},	       /* 1 KiB blocks */
		{2 * GiB, 65536, 32 * MiB},    /* 64 KiB blocks */
		{TiB, 4096, GiB},	       /* 1 TiB / 64 = 16 GiB, clamped to 1 GiB */
		{100 * TiB, 4096, GiB},
		{3 * MiB, 65536, MiB},	       /* 16 blocks a group */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct efs_layout l = compute(cases[i].size, cases[i].bs, 0);
		uint64_t ag = l.ag_blocks * l.block_size;

		cr_assert_eq(ag, cases[i].ag_bytes, "case %zu: group of %llu bytes", i,
			     (unsigned long long)ag);
		cr_assert_eq(ag & (ag - 1), 0);
		cr_assert_geq(ag, EFS_LAYOUT_AG_MIN_BYTES);
		cr_assert_leq(ag, EFS_LAYOUT_AG_MAX_BYTES);
		cr_assert_eq(l.data_start * l.block_size, MiB, "case %zu", i);
		check_tiling(&l);
	}
}

Test(layout, a_few_gib_gives_tens_of_mib_and_enough_groups)
{
	for (uint64_t size = GiB; size <= 16 * GiB; size += GiB / 2) {
		struct efs_layout l = compute(size, 4096, 0);
		uint64_t ag = l.ag_blocks * l.block_size;

		cr_assert_geq(l.ag_count, 64, "%llu bytes: %u groups", (unsigned long long)size,
			      l.ag_count);
		cr_assert_leq(l.ag_count, 128);
		cr_assert_geq(ag, 16 * MiB);
		cr_assert_leq(ag, 256 * MiB);
		check_tiling(&l);
	}
}

Test(layout, odd_sizes_tile_exactly)
{
	/* Sizes that are not multiples of the block size or of a group. */
	static const uint64_t sizes[] = {2 * MiB + 1, 3 * MiB + 4095, 1234567890123ull,
					 5 * GiB + 12345};

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (uint32_t bs = 1024; bs <= 65536; bs *= 2) {
			struct efs_layout l;

			if (efs_layout_compute(sizes[i], bs, 0, &l, NULL, 0) == 0)
				check_tiling(&l);
		}
}

Test(layout, inode_limit_default_override_and_floor)
{
	struct efs_layout l;
	char why[EFS_LAYOUT_REASON_MAX];

	l = compute(2 * MiB, 4096, 0);
	cr_assert_eq(l.inode_limit, EFS_LAYOUT_INODES_MIN, "floor");
	l = compute(GiB + MiB, 4096, 0);
	cr_assert_eq(l.inode_limit, GiB / (16 * 1024));
	l = compute(GiB, 4096, 5);
	cr_assert_eq(l.inode_limit, 5);
	l = compute(GiB, 4096, EFS_LAYOUT_INODES_MAX);
	cr_assert_eq(l.inode_limit, EFS_LAYOUT_INODES_MAX);
	cr_assert_eq(efs_layout_compute(GiB, 4096, 1, &l, why, sizeof(why)), -EINVAL);
	cr_assert(strstr(why, "inode limit"), "%s", why);
	cr_assert_eq(efs_layout_compute(GiB, 4096, EFS_LAYOUT_INODES_MAX + 1, &l, why,
					sizeof(why)),
		     -EINVAL);
}

Test(layout, bad_block_sizes_and_small_devices_are_refused)
{
	static const uint32_t bad[] = {0, 1, 512, 3000, 4095, 4097, 131072, 6144};
	struct efs_layout l = {.block_size = 77};
	char why[EFS_LAYOUT_REASON_MAX];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(efs_layout_compute(GiB, bad[i], 0, &l, why, sizeof(why)), -EINVAL,
			     "block size %u", bad[i]);
		cr_assert(strstr(why, "power of two"), "%s", why);
	}
	cr_assert_eq(efs_layout_compute(2 * MiB - 1, 4096, 0, &l, why, sizeof(why)), -ENOSPC);
	cr_assert(strstr(why, "too small"), "%s", why);
	cr_assert_eq(efs_layout_compute(MiB, 4096, 0, &l, why, sizeof(why)), -ENOSPC);
	cr_assert_eq(efs_layout_compute(0, 4096, 0, &l, why, sizeof(why)), -ENOSPC);
	cr_assert_eq(efs_layout_compute(2 * MiB - 1, 1024, 0, &l, NULL, 0), -ENOSPC);
	cr_assert_eq(l.block_size, 77, "untouched on failure");
	/* The smallest accepted device. */
	l = compute(2 * MiB, 1024, 0);
	cr_assert_eq(l.data_blocks * 1024, MiB);
}

Test(layout, too_many_groups_is_efbig)
{
	struct efs_layout l;
	char why[EFS_LAYOUT_REASON_MAX];

	/* 1 GiB groups: 2^32 of them is 4 EiB; the largest uint64 device is
	 * fine (16 EiB / 1 GiB = 2^34 groups: too many). */
	cr_assert_eq(efs_layout_compute(UINT64_MAX, 4096, 0, &l, why, sizeof(why)), -EFBIG);
	cr_assert(strstr(why, "too large"), "%s", why);
	l = compute((1ull << 32) * GiB / 2, 65536, 0);
	cr_assert_eq(l.ag_count, 1u << 31);
}

Test(layout, fsinfo_and_superblock_agree_and_validate)
{
	struct efs_layout l = compute(3 * GiB + 123 * 4096, 4096, 0);
	Etcfs__FsInfo fi;
	struct efs_sb sb, back;
	const char *why = NULL;
	char reason[EFS_SB_REASON_MAX];
	uint8_t buf[EFS_SB_SIZE];
	ProtobufCBinaryData packed;
	Etcfs__FsInfo *dec = NULL;

	efs_layout_fsinfo(&l, UUID, "testfs", 1764489600123456789, &fi);
	cr_assert_eq(efs_meta_fsinfo_check(&fi, &why), 0, "%s", why);
	cr_assert_eq(fi.uuid.len, 16);
	cr_assert_eq(memcmp(fi.uuid.data, UUID, 16), 0);
	cr_assert_str_eq(fi.name, "testfs");
	cr_assert_eq(fi.block_size, 4096);
	cr_assert_eq(fi.device_size, l.device_size);
	cr_assert_eq(fi.data_start, 256);
	cr_assert_eq(fi.format_version, EFS_SB_FORMAT_VERSION);
	cr_assert_eq(fi.feature_compat | fi.feature_ro_compat | fi.feature_incompat, 0);
	cr_assert_eq(fi.inode_limit, l.inode_limit);
	cr_assert_eq(fi.ag_blocks, l.ag_blocks);
	cr_assert_eq(fi.ag_count, l.ag_count);
	cr_assert_eq(fi.created_ns, 1764489600123456789);

	cr_assert_eq(efs_layout_sb(&l, UUID, "testfs", 1764489600123456789, &sb), 0);
	cr_assert_eq(efs_sb_encode(&sb, buf, reason, sizeof(reason)), 0, "%s", reason);
	cr_assert_eq(efs_sb_decode(buf, sizeof(buf), &back, NULL, reason, sizeof(reason)), 0);
	cr_assert_eq(efs_sb_match_fsinfo(&back, &fi, reason, sizeof(reason)), 0, "%s", reason);
	cr_assert_eq(back.inode_limit, l.inode_limit);

	/* Through the codec as well. */
	cr_assert_eq(efs_meta_pack(&fi.base, &packed), 0);
	cr_assert_eq(efs_meta_fsinfo_decode(packed.data, packed.len, &dec, &why), 0, "%s", why);
	cr_assert_eq(dec->ag_count, l.ag_count);
	efs_meta_record_free(dec);
	efs_mem_free(packed.data);

	{
		char longname[EFS_META_FSNAME_MAX + 2];

		memset(longname, 'a', sizeof(longname) - 1);
		longname[sizeof(longname) - 1] = '\0';
		cr_assert_eq(efs_layout_sb(&l, UUID, longname, 1, &sb), -EINVAL);
	}
	efs_test_assert_no_leaks();
}

Test(layout, root_and_lost_found_records_pass_the_checks)
{
	Etcfs__Inode root, lf;
	Etcfs__Dirent de;
	const char *why = NULL;

	efs_layout_root_inode(1000, 100, 42, &root);
	cr_assert_eq(efs_meta_inode_check(&root, &why), 0, "%s", why);
	cr_assert_eq(root.mode, S_IFDIR | 0755);
	cr_assert_eq(root.uid, 1000);
	cr_assert_eq(root.gid, 100);
	cr_assert_eq(root.nlink, 3);
	cr_assert_eq(root.parent, EFS_LAYOUT_ROOT_INO);
	cr_assert_eq(root.atime_ns, 42);
	cr_assert_eq(root.mtime_ns, 42);
	cr_assert_eq(root.ctime_ns, 42);
	cr_assert_eq(root.btime_ns, 42);

	efs_layout_lost_found_inode(43, &lf);
	cr_assert_eq(efs_meta_inode_check(&lf, &why), 0, "%s", why);
	cr_assert_eq(lf.mode, S_IFDIR | 0700);
	cr_assert_eq(lf.uid, 0);
	cr_assert_eq(lf.gid, 0);
	cr_assert_eq(lf.nlink, 2);
	cr_assert_eq(lf.parent, EFS_LAYOUT_ROOT_INO);
	cr_assert_eq(lf.ctime_ns, 43);

	efs_layout_lost_found_dirent(&de);
	cr_assert_eq(efs_meta_dirent_check(&de, &why), 0, "%s", why);
	cr_assert_eq(de.ino, EFS_LAYOUT_LOST_FOUND_INO);
	cr_assert_eq(de.type, DT_DIR);
	cr_assert_eq(EFS_LAYOUT_NEXT_INO, 3);
}

Test(layout, group_records_cover_each_group)
{
	struct efs_layout l = compute(100 * MiB + 8192, 4096, 0);

	for (uint32_t g = 0; g < l.ag_count; g++) {
		struct efs_layout_agmap m;
		Etcfs__AgFree fr;
		ProtobufCBinaryData packed;
		Etcfs__AgMap *dec = NULL;
		const char *why = NULL;

		efs_layout_ag_map(&l, g, &m);
		efs_layout_ag_free(&l, g, &fr);
		cr_assert_eq(m.map.n_free, 1);
		cr_assert_eq(m.map.free[0]->start, 0);
		cr_assert_eq(m.map.free[0]->len, efs_layout_group_blocks(&l, g));
		cr_assert_eq(m.map.group_blocks, efs_layout_group_blocks(&l, g));
		cr_assert_eq(fr.free_blocks, efs_layout_group_blocks(&l, g));
		cr_assert_eq(efs_meta_pack(&m.map.base, &packed), 0);
		cr_assert_eq(efs_meta_ag_map_decode(packed.data, packed.len, &dec, &why), 0, "%s",
			     why);
		cr_assert_eq(dec->n_free, 1);
		cr_assert_eq(dec->free[0]->len, m.run.len);
		efs_meta_record_free(dec);
		efs_mem_free(packed.data);
	}
	efs_test_assert_no_leaks();
}
