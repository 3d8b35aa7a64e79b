/* SPDX-License-Identifier: Apache-2.0 */
#include "meta/sb.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/*
 * Layout, version 1 (docs/FORMAT.md has the table). Every integer is
 * little-endian; everything between OFF_END and EFS_SB_CRC_OFF is reserved
 * and zero in version 1.
 */
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 8,
	OFF_BLOCK_SIZE = 12,
	OFF_UUID = 16,
	OFF_NAME = 32,
	OFF_DATA_START = OFF_NAME + EFS_SB_NAME_FIELD, /* 112 */
	OFF_DEVICE_SIZE = 120,
	OFF_COMPAT = 128,
	OFF_RO_COMPAT = 136,
	OFF_INCOMPAT = 144,
	OFF_INODE_LIMIT = 152,
	OFF_CREATED = 160,
	OFF_END = 168,
};

_Static_assert(OFF_DATA_START == 112, "superblock layout moved");
_Static_assert(EFS_SB_NAME_FIELD > EFS_META_FSNAME_MAX, "name field lacks room for the NUL");

/* ---- CRC32C ---- */

/* Table of the reflected Castagnoli polynomial 0x82F63B78 (byte-at-a-time;
 * the superblock is read once per mount, so speed does not matter). Const,
 * so that any thread may checksum. */
static const uint32_t crc_table[256] = {
	0x00000000u, 0xf26b8303u, 0xe13b70f7u, 0x1350f3f4u, 0xc79a971fu, 0x35f1141cu,
	0x26a1e7e8u, 0xd4ca64ebu, 0x8ad958cfu, 0x78b2dbccu, 0x6be22838u, 0x9989ab3bu,
	0x4d43cfd0u, 0xbf284cd3u, 0xac78bf27u, 0x5e133c24u, 0x105ec76fu, 0xe235446cu,
	0xf165b798u, 0x030e349bu, 0xd7c45070u, 0x25afd373u, 0x36ff2087u, 0xc494a384u,
	0x9a879fa0u, 0x68ec1ca3u, 0x7bbcef57u, 0x89d76c54u, 0x5d1d08bfu, 0xaf768bbcu,
	0xbc267848u, 0x4e4dfb4bu, 0x20bd8edeu, 0xd2d60dddu, 0xc186fe29u, 0x33ed7d2au,
	0xe72719c1u, 0x154c9ac2u, 0x061c6936u, 0xf477ea35u, 0xaa64d611u, 0x580f5512u,
	0x4b5fa6e6u, 0xb93425e5u, 0x6dfe410eu, 0x9f95c20du, 0x8cc531f9u, 0x7eaeb2fau,
	0x30e349b1u, 0xc288cab2u, 0xd1d83946u, 0x23b3ba45u, 0xf779deaeu, 0x05125dadu,
	0x1642ae59u, 0xe4292d5au, 0xba3a117eu, 0x4851927du, 0x5b016189u, 0xa96ae28au,
	0x7da08661u, 0x8fcb0562u, 0x9c9bf696u, 0x6ef07595u, 0x417b1dbcu, 0xb3109ebfu,
	0xa0406d4bu, 0x522bee48u, 0x86e18aa3u, 0x748a09a0u, 0x67dafa54u, 0x95b17957u,
	0xcba24573u, 0x39c9c670u, 0x2a993584u, 0xd8f2b687u, 0x0c38d26cu, 0xfe53516fu,
	0xed03a29bu, 0x1f682198u, 0x5125dad3u, 0xa34e59d0u, 0xb01eaa24u, 0x42752927u,
	0x96bf4dccu, 0x64d4cecfu, 0x77843d3bu, 0x85efbe38u, 0xdbfc821cu, 0x2997011fu,
	0x3ac7f2ebu, 0xc8ac71e8u, 0x1c661503u, 0xee0d9600u, 0xfd5d65f4u, 0x0f36e6f7u,
	0x61c69362u, 0x93ad1061u, 0x80fde395u, 0x72966096u, 0xa65c047du, 0x5437877eu,
	0x4767748au, 0xb50cf789u, 0xeb1fcbadu, 0x197448aeu, 0x0a24bb5au, 0xf84f3859u,
	0x2c855cb2u, 0xdeeedfb1u, 0xcdbe2c45u, 0x3fd5af46u, 0x7198540du, 0x83f3d70eu,
	0x90a324fau, 0x62c8a7f9u, 0xb602c312u, 0x44694011u, 0x5739b3e5u, 0xa55230e6u,
	0xfb410cc2u, 0x092a8fc1u, 0x1a7a7c35u, 0xe811ff36u, 0x3cdb9bddu, 0xceb018deu,
	0xdde0eb2au, 0x2f8b6829u, 0x82f63b78u, 0x709db87bu, 0x63cd4b8fu, 0x91a6c88cu,
	0x456cac67u, 0xb7072f64u, 0xa457dc90u, 0x563c5f93u, 0x082f63b7u, 0xfa44e0b4u,
	0xe9141340u, 0x1b7f9043u, 0xcfb5f4a8u, 0x3dde77abu, 0x2e8e845fu, 0xdce5075cu,
	0x92a8fc17u, 0x60c37f14u, 0x73938ce0u, 0x81f80fe3u, 0x55326b08u, 0xa759e80bu,
	0xb4091bffu, 0x466298fcu, 0x1871a4d8u, 0xea1a27dbu, 0xf94ad42fu, 0x0b21572cu,
	0xdfeb33c7u, 0x2d80b0c4u, 0x3ed04330u, 0xccbbc033u, 0xa24bb5a6u, 0x502036a5u,
	0x4370c551u, 0xb11b4652u, 0x65d122b9u, 0x97baa1bau, 0x84ea524eu, 0x7681d14du,
	0x2892ed69u, 0xdaf96e6au, 0xc9a99d9eu, 0x3bc21e9du, 0xef087a76u, 0x1d63f975u,
	0x0e330a81u, 0xfc588982u, 0xb21572c9u, 0x407ef1cau, 0x532e023eu, 0xa145813du,
	0x758fe5d6u, 0x87e466d5u, 0x94b49521u, 0x66df1622u, 0x38cc2a06u, 0xcaa7a905u,
	0xd9f75af1u, 0x2b9cd9f2u, 0xff56bd19u, 0x0d3d3e1au, 0x1e6dcdeeu, 0xec064eedu,
	0xc38d26c4u, 0x31e6a5c7u, 0x22b65633u, 0xd0ddd530u, 0x0417b1dbu, 0xf67c32d8u,
	0xe52cc12cu, 0x1747422fu, 0x49547e0bu, 0xbb3ffd08u, 0xa86f0efcu, 0x5a048dffu,
	0x8ecee914u, 0x7ca56a17u, 0x6ff599e3u, 0x9d9e1ae0u, 0xd3d3e1abu, 0x21b862a8u,
	0x32e8915cu, 0xc083125fu, 0x144976b4u, 0xe622f5b7u, 0xf5720643u, 0x07198540u,
	0x590ab964u, 0xab613a67u, 0xb831c993u, 0x4a5a4a90u, 0x9e902e7bu, 0x6cfbad78u,
	0x7fab5e8cu, 0x8dc0dd8fu, 0xe330a81au, 0x115b2b19u, 0x020bd8edu, 0xf0605beeu,
	0x24aa3f05u, 0xd6c1bc06u, 0xc5914ff2u, 0x37faccf1u, 0x69e9f0d5u, 0x9b8273d6u,
	0x88d28022u, 0x7ab90321u, 0xae7367cau, 0x5c18e4c9u, 0x4f48173du, 0xbd23943eu,
	0xf36e6f75u, 0x0105ec76u, 0x12551f82u, 0xe03e9c81u, 0x34f4f86au, 0xc69f7b69u,
	0xd5cf889du, 0x27a40b9eu, 0x79b737bau, 0x8bdcb4b9u, 0x988c474du, 0x6ae7c44eu,
	0xbe2da0a5u, 0x4c4623a6u, 0x5f16d052u, 0xad7d5351u,
};

uint32_t efs_crc32c(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	crc = ~crc;
	for (size_t i = 0; i < len; i++)
		crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* ---- Little-endian fields ---- */

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v = 0;

	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

__attribute__((format(printf, 4, 5))) static int fail(int err, char *reason, size_t size,
						      const char *fmt, ...)
{
	va_list ap;

	if (reason && size) {
		va_start(ap, fmt);
		vsnprintf(reason, size, fmt, ap);
		va_end(ap);
	}
	return err;
}

static void ok(char *reason, size_t size)
{
	if (reason && size)
		reason[0] = '\0';
}

/* ---- Checks ---- */

int efs_sb_validate(const struct efs_sb *sb, char *reason, size_t reason_size)
{
	static const uint8_t zero[16];
	uint64_t bs = sb->block_size;

	if (sb->format_version != EFS_SB_FORMAT_VERSION)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: format version %" PRIu32 " is not %d", sb->format_version,
			    EFS_SB_FORMAT_VERSION);
	if (bs < EFS_SB_BLOCK_MIN || bs > EFS_SB_BLOCK_MAX || (bs & (bs - 1)))
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: block size %" PRIu64
			    " is not a power of two in 1024..65536",
			    bs);
	if (sb->data_start == 0 || sb->data_start > UINT64_MAX / bs ||
	    sb->data_start * bs < EFS_SB_SIZE)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: data area start %" PRIu64
			    " overlaps the superblock or overflows",
			    sb->data_start);
	if (sb->device_size / bs <= sb->data_start)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: device size %" PRIu64
			    " leaves no data area after block %" PRIu64,
			    sb->device_size, sb->data_start);
	if (memchr(sb->name, '\0', sizeof(sb->name)) == NULL || !efs_meta_fsname_is_valid(sb->name))
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: invalid filesystem name");
	if (memcmp(sb->uuid, zero, sizeof(zero)) == 0)
		return fail(-EUCLEAN, reason, reason_size, "superblock: uuid is all zeroes");
	if (sb->inode_limit == 0)
		return fail(-EUCLEAN, reason, reason_size, "superblock: inode limit 0");
	ok(reason, reason_size);
	return 0;
}

int efs_sb_check_features(const struct efs_sb *sb, const struct efs_sb_features *known,
			  unsigned *ret_flags, char *reason, size_t reason_size)
{
	uint64_t unknown = sb->feature_incompat & ~known->incompat;

	if (unknown)
		return fail(-EPROTONOSUPPORT, reason, reason_size,
			    "superblock: unsupported incompatible features 0x%016" PRIx64
			    " (a newer etcfs made this filesystem)",
			    unknown);
	if (ret_flags)
		*ret_flags = (sb->feature_ro_compat & ~known->ro_compat) ? EFS_SB_MOUNT_READ_ONLY
									  : 0;
	ok(reason, reason_size);
	return 0;
}

/* ---- Codec ---- */

int efs_sb_encode(const struct efs_sb *sb, uint8_t out[EFS_SB_SIZE], char *reason,
		  size_t reason_size)
{
	size_t nlen;
	int r;

	r = efs_sb_validate(sb, reason, reason_size);
	if (r < 0)
		return r;
	nlen = strlen(sb->name);
	memset(out, 0, EFS_SB_SIZE);
	memcpy(out + OFF_MAGIC, EFS_SB_MAGIC, EFS_SB_MAGIC_LEN);
	put32(out + OFF_VERSION, sb->format_version);
	put32(out + OFF_BLOCK_SIZE, sb->block_size);
	memcpy(out + OFF_UUID, sb->uuid, 16);
	memcpy(out + OFF_NAME, sb->name, nlen);
	put64(out + OFF_DATA_START, sb->data_start);
	put64(out + OFF_DEVICE_SIZE, sb->device_size);
	put64(out + OFF_COMPAT, sb->feature_compat);
	put64(out + OFF_RO_COMPAT, sb->feature_ro_compat);
	put64(out + OFF_INCOMPAT, sb->feature_incompat);
	put64(out + OFF_INODE_LIMIT, sb->inode_limit);
	put64(out + OFF_CREATED, (uint64_t)sb->created_ns);
	put32(out + EFS_SB_CRC_OFF, efs_crc32c(0, out, EFS_SB_CRC_OFF));
	return 0;
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

int efs_sb_decode(const void *buf, size_t len, struct efs_sb *ret, unsigned *ret_flags,
		  char *reason, size_t reason_size)
{
	static const struct efs_sb_features known = {
		.compat = EFS_SB_FEATURE_COMPAT_SUPP,
		.ro_compat = EFS_SB_FEATURE_RO_COMPAT_SUPP,
		.incompat = EFS_SB_FEATURE_INCOMPAT_SUPP,
	};
	const uint8_t *p = buf;
	struct efs_sb sb;
	uint32_t want, got;
	const uint8_t *nul;
	unsigned flags = 0;
	int r;

	if (!buf || len < EFS_SB_SIZE)
		return fail(-EINVAL, reason, reason_size,
			    "superblock truncated: %zu of %d bytes", buf ? len : 0, EFS_SB_SIZE);
	if (memcmp(p + OFF_MAGIC, EFS_SB_MAGIC, EFS_SB_MAGIC_LEN) != 0)
		return fail(-ENODATA, reason, reason_size,
			    "not an etcfs device (no etcfs superblock in block 0)");
	want = get32(p + EFS_SB_CRC_OFF);
	got = efs_crc32c(0, p, EFS_SB_CRC_OFF);
	if (want != got)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock checksum mismatch (stored 0x%08" PRIx32
			    ", computed 0x%08" PRIx32 ")",
			    want, got);
	memset(&sb, 0, sizeof(sb));
	sb.format_version = get32(p + OFF_VERSION);
	if (sb.format_version != EFS_SB_FORMAT_VERSION)
		return fail(-EPROTONOSUPPORT, reason, reason_size,
			    "superblock format version %" PRIu32 " is not supported (this is %d)",
			    sb.format_version, EFS_SB_FORMAT_VERSION);
	/* The name must end inside the field and be NUL-padded after. */
	nul = memchr(p + OFF_NAME, '\0', sizeof(sb.name));
	if (!nul || !all_zero(nul, (size_t)(p + OFF_NAME + EFS_SB_NAME_FIELD - nul)))
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: filesystem name not NUL-terminated and padded");
	memcpy(sb.name, p + OFF_NAME, (size_t)(nul - (p + OFF_NAME)) + 1);
	if (!all_zero(p + OFF_END, EFS_SB_CRC_OFF - OFF_END))
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock: reserved bytes are not zero");
	sb.block_size = get32(p + OFF_BLOCK_SIZE);
	memcpy(sb.uuid, p + OFF_UUID, 16);
	sb.data_start = get64(p + OFF_DATA_START);
	sb.device_size = get64(p + OFF_DEVICE_SIZE);
	sb.feature_compat = get64(p + OFF_COMPAT);
	sb.feature_ro_compat = get64(p + OFF_RO_COMPAT);
	sb.feature_incompat = get64(p + OFF_INCOMPAT);
	sb.inode_limit = get64(p + OFF_INODE_LIMIT);
	sb.created_ns = (int64_t)get64(p + OFF_CREATED);
	r = efs_sb_validate(&sb, reason, reason_size);
	if (r < 0)
		return r;
	r = efs_sb_check_features(&sb, &known, &flags, reason, reason_size);
	if (r < 0)
		return r;
	*ret = sb;
	if (ret_flags)
		*ret_flags = flags;
	ok(reason, reason_size);
	return 0;
}

void efs_sb_uuid_format(const uint8_t uuid[16], char out[37])
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			out[o++] = '-';
		out[o++] = hex[uuid[i] >> 4];
		out[o++] = hex[uuid[i] & 15];
	}
	out[o] = '\0';
}

int efs_sb_match_fsinfo(const struct efs_sb *sb, const Etcfs__FsInfo *fi, char *reason,
			size_t reason_size)
{
	char a[37], b[37];

	if (fi->uuid.len != 16 || memcmp(fi->uuid.data, sb->uuid, 16) != 0) {
		efs_sb_uuid_format(sb->uuid, a);
		if (fi->uuid.len == 16)
			efs_sb_uuid_format(fi->uuid.data, b);
		else
			snprintf(b, sizeof(b), "(invalid)");
		return fail(-ESTALE, reason, reason_size,
			    "device belongs to another filesystem (device uuid %s, etcd uuid %s)",
			    a, b);
	}
	if (!fi->name || strcmp(fi->name, sb->name) != 0)
		return fail(-ESTALE, reason, reason_size,
			    "device belongs to another filesystem (name \"%s\" on the device, "
			    "\"%s\" in etcd)",
			    sb->name, fi->name ? fi->name : "");
	if (fi->block_size != sb->block_size)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock and etcd disagree on the block size (%" PRIu32
			    " vs %" PRIu32 ")",
			    sb->block_size, fi->block_size);
	if (fi->data_start != sb->data_start)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock and etcd disagree on the data area start");
	if (fi->format_version != sb->format_version)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock and etcd disagree on the format version");
	if (fi->feature_compat != sb->feature_compat ||
	    fi->feature_ro_compat != sb->feature_ro_compat ||
	    fi->feature_incompat != sb->feature_incompat)
		return fail(-EUCLEAN, reason, reason_size,
			    "superblock and etcd disagree on the feature masks");
	if (fi->device_size < sb->device_size)
		return fail(-EUCLEAN, reason, reason_size,
			    "etcd records a device smaller than the superblock does");
	ok(reason, reason_size);
	return 0;
}
