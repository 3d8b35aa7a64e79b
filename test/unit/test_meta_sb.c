/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "../support/leak.h"
#include "meta/sb.h"
#include "util/mem.h"

TestSuite(meta_sb, .fini = efs_mem_fail_reset, .timeout = 30);

static const uint8_t UUID[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0,
				 0x0f, 0xed, 0xcb, 0xa9, 0x87, 0x65, 0x43, 0x21};

static struct efs_sb good(void)
{
	struct efs_sb sb;

	memset(&sb, 0, sizeof(sb));
	sb.format_version = EFS_SB_FORMAT_VERSION;
	memcpy(sb.uuid, UUID, 16);
	strcpy(sb.name, "testfs");
	sb.block_size = 4096;
	sb.data_start = 16;
	sb.device_size = 1ull << 30;
	sb.inode_limit = 1000000;
	sb.created_ns = 1764489600123456789;
	return sb;
}

static void encode_good(uint8_t out[EFS_SB_SIZE])
{
	struct efs_sb sb = good();
	char why[EFS_SB_REASON_MAX];

	cr_assert_eq(efs_sb_encode(&sb, out, why, sizeof(why)), 0, "%s", why);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Recomputes the checksum after a deliberate change, so that the change
 * itself (not the checksum) is what decode judges. */
static void reseal(uint8_t *b)
{
	put_le32(b + EFS_SB_CRC_OFF, efs_crc32c(0, b, EFS_SB_CRC_OFF));
}

static int decode(const uint8_t *b, size_t len, struct efs_sb *sb, unsigned *flags, char *why)
{
	return efs_sb_decode(b, len, sb, flags, why, EFS_SB_REASON_MAX);
}

/* ---- CRC32C ---- */

Test(meta_sb, crc32c_known_vectors)
{
	uint8_t zeros[32] = {0}, ones[32], inc[32];

	memset(ones, 0xff, sizeof(ones));
	for (int i = 0; i < 32; i++)
		inc[i] = (uint8_t)i;
	cr_assert_eq(efs_crc32c(0, "123456789", 9), 0xE3069283u);
	cr_assert_eq(efs_crc32c(0, "", 0), 0);
	/* RFC 3720 B.4 test vectors. */
	cr_assert_eq(efs_crc32c(0, zeros, 32), 0x8A9136AAu);
	cr_assert_eq(efs_crc32c(0, ones, 32), 0x62A8AB43u);
	cr_assert_eq(efs_crc32c(0, inc, 32), 0x46DD794Eu);
}

Test(meta_sb, crc32c_continues_across_pieces)
{
	uint32_t c = efs_crc32c(0, "1234", 4);

	cr_assert_eq(efs_crc32c(c, "56789", 5), 0xE3069283u);
}

/* ---- Round trip ---- */

Test(meta_sb, encode_decode_round_trip)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb in = good(), out;
	unsigned flags = 99;
	char why[EFS_SB_REASON_MAX] = "x";

	encode_good(buf);
	cr_assert_eq(memcmp(buf, "ETCFS\0SB", 8), 0);
	cr_assert_eq(le32(buf + EFS_SB_CRC_OFF), efs_crc32c(0, buf, EFS_SB_CRC_OFF));
	memset(&out, 0xee, sizeof(out));
	cr_assert_eq(decode(buf, sizeof(buf), &out, &flags, why), 0, "%s", why);
	cr_assert_str_eq(why, "");
	cr_assert_eq(flags, 0);
	cr_assert_eq(out.format_version, in.format_version);
	cr_assert_eq(memcmp(out.uuid, in.uuid, 16), 0);
	cr_assert_str_eq(out.name, in.name);
	cr_assert_eq(out.block_size, in.block_size);
	cr_assert_eq(out.data_start, in.data_start);
	cr_assert_eq(out.device_size, in.device_size);
	cr_assert_eq(out.feature_compat, 0);
	cr_assert_eq(out.feature_ro_compat, 0);
	cr_assert_eq(out.feature_incompat, 0);
	cr_assert_eq(out.inode_limit, in.inode_limit);
	cr_assert_eq(out.created_ns, in.created_ns);
}

Test(meta_sb, layout_is_little_endian_at_documented_offsets)
{
	uint8_t buf[EFS_SB_SIZE];

	encode_good(buf);
	cr_assert_eq(le32(buf + 8), EFS_SB_FORMAT_VERSION);
	cr_assert_eq(le32(buf + 12), 4096);
	cr_assert_eq(memcmp(buf + 16, UUID, 16), 0);
	cr_assert_str_eq((const char *)buf + 32, "testfs");
	cr_assert_eq(le32(buf + 112), 16);
	cr_assert_eq(le32(buf + 120 + 4), (1ull << 30) >> 32);
	cr_assert_eq(le32(buf + 120), (uint32_t)(1ull << 30));
	cr_assert_eq(le32(buf + 152), 1000000);
	for (size_t i = 168; i < EFS_SB_CRC_OFF; i++)
		cr_assert_eq(buf[i], 0, "reserved byte %zu not zero", i);
}

Test(meta_sb, longest_name_and_extreme_block_sizes_round_trip)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb in = good(), out;
	const uint32_t sizes[] = {1024, 2048, 65536};

	memset(in.name, 'n', EFS_META_FSNAME_MAX);
	in.name[EFS_META_FSNAME_MAX] = '\0';
	for (size_t i = 0; i < 3; i++) {
		in.block_size = sizes[i];
		in.data_start = (EFS_SB_SIZE + sizes[i] - 1) / sizes[i];
		in.device_size = (uint64_t)sizes[i] * (in.data_start + 1);
		cr_assert_eq(efs_sb_encode(&in, buf, NULL, 0), 0, "block size %u", sizes[i]);
		cr_assert_eq(efs_sb_decode(buf, sizeof(buf), &out, NULL, NULL, 0), 0);
		cr_assert_str_eq(out.name, in.name);
		cr_assert_eq(out.block_size, sizes[i]);
	}
}

Test(meta_sb, decode_ignores_bytes_after_the_superblock)
{
	uint8_t buf[EFS_SB_SIZE + 100];
	struct efs_sb out;

	memset(buf, 0xab, sizeof(buf));
	encode_good(buf);
	cr_assert_eq(efs_sb_decode(buf, sizeof(buf), &out, NULL, NULL, 0), 0);
}

/* ---- Errors ---- */

Test(meta_sb, truncation_at_every_length_is_einval)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	char why[EFS_SB_REASON_MAX];

	encode_good(buf);
	for (size_t len = 0; len < EFS_SB_SIZE; len++) {
		uint8_t *copy = malloc(len ? len : 1);

		memcpy(copy, buf, len);
		cr_assert_eq(decode(copy, len, &out, NULL, why), -EINVAL, "len %zu", len);
		free(copy);
	}
	cr_assert(strstr(why, "truncated"), "%s", why);
	cr_assert_eq(efs_sb_decode(NULL, 0, &out, NULL, why, sizeof(why)), -EINVAL);
}

Test(meta_sb, no_magic_is_enodata_not_an_etcfs_device)
{
	uint8_t buf[EFS_SB_SIZE] = {0};
	struct efs_sb out;
	char why[EFS_SB_REASON_MAX];

	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -ENODATA);
	cr_assert(strstr(why, "not an etcfs device"), "%s", why);
	encode_good(buf);
	buf[0] = 'e';
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -ENODATA);
}

Test(meta_sb, every_single_bit_flip_is_detected)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	char why[EFS_SB_REASON_MAX];

	encode_good(buf);
	for (size_t bit = 0; bit < EFS_SB_SIZE * 8; bit++) {
		int r;

		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		r = decode(buf, sizeof(buf), &out, NULL, why);
		if (bit / 8 < EFS_SB_MAGIC_LEN) {
			cr_assert_eq(r, -ENODATA, "bit %zu", bit);
		} else {
			cr_assert_eq(r, -EUCLEAN, "bit %zu: %d", bit, r);
			cr_assert(strstr(why, "superblock checksum mismatch"), "bit %zu: %s", bit,
				  why);
		}
		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), 0);
}

Test(meta_sb, unsupported_version_is_eprotonosupport)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	char why[EFS_SB_REASON_MAX];

	encode_good(buf);
	put_le32(buf + 8, 2);
	reseal(buf);
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -EPROTONOSUPPORT);
	cr_assert(strstr(why, "version 2"), "%s", why);
	put_le32(buf + 8, 0);
	reseal(buf);
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -EPROTONOSUPPORT);
}

/* One corruption of each field, each resealed so that only the field is
 * wrong: every one must be refused as -EUCLEAN with a reason naming it. */
Test(meta_sb, nonsensical_fields_are_euclean)
{
	static const struct {
		size_t off;
		int width; /* 4, 8, or 0 for a byte */
		uint64_t value;
		const char *word;
	} cases[] = {
		{12, 4, 0, "block size"},
		{12, 4, 3000, "block size"},
		{12, 4, 512, "block size"},
		{12, 4, 131072, "block size"},
		{12, 4, 4097, "block size"},
		{16, 0, 0, "uuid"}, /* special: zero the whole uuid */
		{32, 0, 0, "name"}, /* empty name */
		{33, 0, '/', "name"},
		{112, 8, 0, "data area"},
		{120, 8, 16 * 4096, "device size"},
		{120, 8, 0, "device size"},
		{152, 8, 0, "inode limit"},
		{200, 0, 1, "reserved"},
		{4091, 0, 0x80, "reserved"},
	};
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	char why[EFS_SB_REASON_MAX];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		encode_good(buf);
		if (cases[i].off == 16)
			memset(buf + 16, 0, 16);
		else if (cases[i].width == 4)
			put_le32(buf + cases[i].off, (uint32_t)cases[i].value);
		else if (cases[i].width == 8)
			put_le64(buf + cases[i].off, cases[i].value);
		else
			buf[cases[i].off] = (uint8_t)cases[i].value;
		reseal(buf);
		cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -EUCLEAN, "case %zu", i);
		cr_assert(strstr(why, cases[i].word), "case %zu: \"%s\" lacks \"%s\"", i, why,
			  cases[i].word);
	}
}

Test(meta_sb, name_must_be_nul_terminated_and_padded)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	char why[EFS_SB_REASON_MAX];

	encode_good(buf);
	memset(buf + 32, 'a', EFS_SB_NAME_FIELD); /* no NUL at all */
	reseal(buf);
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -EUCLEAN);
	cr_assert(strstr(why, "name"), "%s", why);
	encode_good(buf);
	buf[32 + 70] = 'z'; /* garbage after the terminator */
	reseal(buf);
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -EUCLEAN);
	encode_good(buf);
	memset(buf + 32, 'a', 65); /* 65 bytes then NUL: too long */
	reseal(buf);
	cr_assert_eq(decode(buf, sizeof(buf), &out, NULL, why), -EUCLEAN);
}

Test(meta_sb, data_start_must_clear_the_superblock_at_small_blocks)
{
	struct efs_sb sb = good();
	uint8_t buf[EFS_SB_SIZE];

	sb.block_size = 1024;
	sb.data_start = 3; /* 3 KiB < 4 KiB superblock */
	cr_assert_eq(efs_sb_encode(&sb, buf, NULL, 0), -EUCLEAN);
	sb.data_start = 4;
	cr_assert_eq(efs_sb_encode(&sb, buf, NULL, 0), 0);
	sb.data_start = UINT64_MAX / 2;
	cr_assert_eq(efs_sb_encode(&sb, buf, NULL, 0), -EUCLEAN, "overflow must not pass");
}

Test(meta_sb, encode_refuses_invalid_fields_and_leaves_buffer)
{
	struct efs_sb sb = good();
	uint8_t buf[EFS_SB_SIZE];
	char why[EFS_SB_REASON_MAX];

	memset(buf, 0x5c, sizeof(buf));
	sb.block_size = 1000;
	cr_assert_eq(efs_sb_encode(&sb, buf, why, sizeof(why)), -EUCLEAN);
	cr_assert(strstr(why, "block size"), "%s", why);
	sb = good();
	sb.format_version = 7;
	cr_assert_eq(efs_sb_encode(&sb, buf, why, sizeof(why)), -EUCLEAN);
	sb = good();
	strcpy(sb.name, "bad name");
	cr_assert_eq(efs_sb_encode(&sb, buf, why, sizeof(why)), -EUCLEAN);
	for (size_t i = 0; i < sizeof(buf); i++)
		cr_assert_eq(buf[i], 0x5c);
}

/* ---- Features ---- */

static void with_features(uint8_t *buf, uint64_t compat, uint64_t ro, uint64_t incompat)
{
	struct efs_sb sb = good();

	sb.feature_compat = compat;
	sb.feature_ro_compat = ro;
	sb.feature_incompat = incompat;
	cr_assert_eq(efs_sb_encode(&sb, buf, NULL, 0), 0);
}

Test(meta_sb, unknown_incompat_bit_refuses_naming_the_bits)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	unsigned flags = 77;
	char why[EFS_SB_REASON_MAX];

	out.block_size = 5;
	with_features(buf, 0, 0, (1ull << 63) | 0x4);
	cr_assert_eq(decode(buf, sizeof(buf), &out, &flags, why), -EPROTONOSUPPORT);
	cr_assert(strstr(why, "0x8000000000000004"), "%s", why);
	cr_assert_eq(flags, 77, "flags touched on failure");
	cr_assert_eq(out.block_size, 5, "sb touched on failure");
}

Test(meta_sb, unknown_compat_bit_is_accepted)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	unsigned flags = 77;
	char why[EFS_SB_REASON_MAX];

	with_features(buf, 0xffffffffffffffffull, 0, 0);
	cr_assert_eq(decode(buf, sizeof(buf), &out, &flags, why), 0, "%s", why);
	cr_assert_eq(flags, 0);
	cr_assert_eq(out.feature_compat, 0xffffffffffffffffull);
}

Test(meta_sb, unknown_ro_compat_bit_asks_for_read_only)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;
	unsigned flags = 0;
	char why[EFS_SB_REASON_MAX];

	with_features(buf, 0, 1ull << 5, 0);
	cr_assert_eq(decode(buf, sizeof(buf), &out, &flags, why), 0, "%s", why);
	cr_assert_eq(flags, EFS_SB_MOUNT_READ_ONLY);
}

Test(meta_sb, known_features_are_not_reported)
{
	struct efs_sb sb = good();
	const struct efs_sb_features known = {.compat = 1, .ro_compat = 2, .incompat = 4};
	unsigned flags = 77;
	char why[EFS_SB_REASON_MAX];

	sb.feature_compat = 1;
	sb.feature_ro_compat = 2;
	sb.feature_incompat = 4;
	cr_assert_eq(efs_sb_check_features(&sb, &known, &flags, why, sizeof(why)), 0);
	cr_assert_eq(flags, 0);
	sb.feature_ro_compat = 3;
	cr_assert_eq(efs_sb_check_features(&sb, &known, &flags, why, sizeof(why)), 0);
	cr_assert_eq(flags, EFS_SB_MOUNT_READ_ONLY);
	sb.feature_incompat = 5;
	cr_assert_eq(efs_sb_check_features(&sb, &known, &flags, why, sizeof(why)),
		     -EPROTONOSUPPORT);
	cr_assert(strstr(why, "0x0000000000000001"), "%s", why);
}

/* ---- Against etcd's record ---- */

static Etcfs__FsInfo fsinfo_of(const struct efs_sb *sb, uint8_t *uuid)
{
	Etcfs__FsInfo fi = ETCFS__FS_INFO__INIT;

	memcpy(uuid, sb->uuid, 16);
	fi.uuid.data = uuid;
	fi.uuid.len = 16;
	fi.name = (char *)sb->name;
	fi.block_size = sb->block_size;
	fi.device_size = sb->device_size;
	fi.data_start = sb->data_start;
	fi.format_version = sb->format_version;
	fi.inode_limit = sb->inode_limit;
	return fi;
}

Test(meta_sb, matching_fsinfo_is_accepted)
{
	struct efs_sb sb = good();
	uint8_t uuid[16];
	Etcfs__FsInfo fi = fsinfo_of(&sb, uuid);
	char why[EFS_SB_REASON_MAX];

	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), 0, "%s", why);
	fi.device_size *= 2; /* grown since mkfs */
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), 0, "%s", why);
}

Test(meta_sb, uuid_or_name_mismatch_is_estale)
{
	struct efs_sb sb = good();
	uint8_t uuid[16];
	Etcfs__FsInfo fi = fsinfo_of(&sb, uuid);
	char why[EFS_SB_REASON_MAX];

	uuid[15] ^= 1;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -ESTALE);
	cr_assert(strstr(why, "device belongs to another filesystem"), "%s", why);
	cr_assert(strstr(why, "12345678-9abc-def0-0fed-cba987654321"), "%s", why);
	uuid[15] ^= 1;
	fi.uuid.len = 15;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -ESTALE);
	fi.uuid.len = 16;
	fi.name = (char *)"other";
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -ESTALE);
}

Test(meta_sb, geometry_disagreement_is_euclean)
{
	struct efs_sb sb = good();
	uint8_t uuid[16];
	Etcfs__FsInfo fi;
	char why[EFS_SB_REASON_MAX];

	fi = fsinfo_of(&sb, uuid);
	fi.block_size = 8192;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -EUCLEAN);
	cr_assert(strstr(why, "block size"), "%s", why);
	fi = fsinfo_of(&sb, uuid);
	fi.data_start = 17;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -EUCLEAN);
	fi = fsinfo_of(&sb, uuid);
	fi.feature_incompat = 1;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -EUCLEAN);
	fi = fsinfo_of(&sb, uuid);
	fi.format_version = 2;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -EUCLEAN);
	fi = fsinfo_of(&sb, uuid);
	fi.device_size = sb.device_size - 4096;
	cr_assert_eq(efs_sb_match_fsinfo(&sb, &fi, why, sizeof(why)), -EUCLEAN);
}

Test(meta_sb, codec_never_allocates)
{
	uint8_t buf[EFS_SB_SIZE];
	struct efs_sb out;

	efs_mem_fail_after(0);
	encode_good(buf);
	cr_assert_eq(efs_sb_decode(buf, sizeof(buf), &out, NULL, NULL, 0), 0);
	cr_assert_eq(efs_mem_count(), 0);
	efs_test_assert_no_leaks();
}
