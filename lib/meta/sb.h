/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The on-device superblock (docs/FORMAT.md): block 0 of the device, a fixed
 * little-endian layout of EFS_SB_SIZE bytes ending in a CRC32C of everything
 * before it. It names the etcd keyspace (the filesystem name) and carries the
 * UUID that etcd's "sb" record must match, so a device is never mounted
 * against the wrong keyspace. Pure: the caller reads and writes the bytes.
 *
 * Errors of efs_sb_decode(), in the order they are checked (each with a
 * sentence in |reason|):
 *   -EINVAL           fewer than EFS_SB_SIZE bytes ("truncated")
 *   -ENODATA          no etcfs magic: "not an etcfs device" (mkfs may
 *                     format it without --force)
 *   -EUCLEAN          checksum mismatch (any flipped bit outside the magic)
 *   -EPROTONOSUPPORT  a format version this code does not know
 *   -EUCLEAN          a field that makes no sense (block size, data start,
 *                     name, uuid, reserved bytes not zero, ...)
 *   -EPROTONOSUPPORT  incompat feature bits this code does not know (named
 *                     in |reason|)
 * An unknown ro_compat bit is not an error: EFS_SB_MOUNT_READ_ONLY is set in
 * the returned flags. Unknown compat bits are ignored.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcfs.pb-c.h"
#include "meta/keys.h"

/* Bytes of the superblock on the device (it fits in any block size). */
#define EFS_SB_SIZE 4096
/* Offset of the little-endian CRC32C of bytes [0, EFS_SB_CRC_OFF). Fixed for
 * every format version, so that a checksum is verified before the version
 * is trusted. */
#define EFS_SB_CRC_OFF (EFS_SB_SIZE - 4)
/* The first 8 bytes of block 0. */
#define EFS_SB_MAGIC	 "ETCFS\0SB"
#define EFS_SB_MAGIC_LEN 8
/* The format this code writes and reads. */
#define EFS_SB_FORMAT_VERSION 1
/* Bytes of the fs name field (a name of up to EFS_META_FSNAME_MAX bytes,
 * NUL-terminated and NUL-padded). */
#define EFS_SB_NAME_FIELD 80
#define EFS_SB_BLOCK_MIN     1024
#define EFS_SB_BLOCK_MAX     65536
#define EFS_SB_BLOCK_DEFAULT 4096

/* Feature bits known to this code (none yet: every set bit is unknown). */
#define EFS_SB_FEATURE_COMPAT_SUPP    0ull
#define EFS_SB_FEATURE_RO_COMPAT_SUPP 0ull
#define EFS_SB_FEATURE_INCOMPAT_SUPP  0ull

/* Flags returned by efs_sb_decode(). */
#define EFS_SB_MOUNT_READ_ONLY 0x1u /* unknown ro_compat features: mount read-only only */

/* Room for any reason string of this module. */
#define EFS_SB_REASON_MAX 256

/* The decoded superblock. */
struct efs_sb {
	uint32_t format_version;
	uint8_t uuid[16];
	char name[EFS_META_FSNAME_MAX + 1]; /* NUL-terminated, valid fsname */
	uint32_t block_size;		    /* bytes, power of two in 1024..65536 */
	uint64_t data_start;		    /* first block of the data area, >= 1 */
	uint64_t device_size;		    /* bytes, at mkfs (or last grow) */
	uint64_t feature_compat;
	uint64_t feature_ro_compat;
	uint64_t feature_incompat;
	uint64_t inode_limit; /* >= 1 */
	int64_t created_ns;
};

/* Features a reader knows, for efs_sb_check_features(). */
struct efs_sb_features {
	uint64_t compat;
	uint64_t ro_compat;
	uint64_t incompat;
};

/* CRC32C (Castagnoli, reflected, as iSCSI and ext4 use): |crc| is 0 for a
 * new computation or a previous result to continue one. */
uint32_t efs_crc32c(uint32_t crc, const void *buf, size_t len);

/*
 * Checks that |sb|'s fields make sense (the checks decode applies after the
 * checksum): 0 or -EUCLEAN with |reason|. efs_sb_encode() refuses what this
 * refuses, so that mkfs cannot write a superblock mount would reject.
 */
int efs_sb_validate(const struct efs_sb *sb, char *reason, size_t reason_size);

/*
 * Checks |sb|'s feature masks against |known|: unknown incompat bits give
 * -EPROTONOSUPPORT with the bits in |reason|; unknown ro_compat bits set
 * EFS_SB_MOUNT_READ_ONLY in *ret_flags (which may be NULL); unknown compat
 * bits are ignored.
 */
int efs_sb_check_features(const struct efs_sb *sb, const struct efs_sb_features *known,
			  unsigned *ret_flags, char *reason, size_t reason_size);

/*
 * Writes |sb| as exactly EFS_SB_SIZE bytes into |out| (reserved bytes zero,
 * format version EFS_SB_FORMAT_VERSION, checksum last). -EUCLEAN when the
 * fields are invalid (efs_sb_validate), |out| untouched then.
 */
int efs_sb_encode(const struct efs_sb *sb, uint8_t out[EFS_SB_SIZE], char *reason,
		  size_t reason_size);

/*
 * Reads a superblock from |len| bytes at |buf| (only the first EFS_SB_SIZE
 * are looked at). Errors in the header comment. On success *ret is filled
 * and *ret_flags (may be NULL) receives EFS_SB_MOUNT_* flags; both are
 * untouched on failure. |reason| gets "" on success.
 */
int efs_sb_decode(const void *buf, size_t len, struct efs_sb *ret, unsigned *ret_flags,
		  char *reason, size_t reason_size);

/*
 * Compares the device's superblock with the filesystem's "sb" record in
 * etcd: a different UUID or name gives -ESTALE ("device belongs to another
 * filesystem"); a different block size, data start, format version or
 * feature mask, or a record device size smaller than the superblock's,
 * gives -EUCLEAN (the two disagree: fsck). 0 when they match.
 */
int efs_sb_match_fsinfo(const struct efs_sb *sb, const Etcfs__FsInfo *fi, char *reason,
			size_t reason_size);

/* Formats |uuid| as the 36-character canonical text into |out| (37 bytes). */
void efs_sb_uuid_format(const uint8_t uuid[16], char out[37]);
