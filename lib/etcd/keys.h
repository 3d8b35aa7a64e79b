/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Key helpers for etcd, pure (no I/O): range ends for prefix scans, the next
 * key for paging, fixed-width big-endian integers inside keys (so that a
 * range scan returns them in numeric order) and a bounded key builder.
 *
 * etcd orders keys as unsigned bytes, shorter first on a common prefix
 * (efs_etcd_key_cmp). etcd's range conventions: range_end empty means the
 * key alone; range_end "\0" (one zero byte) means every key >= key.
 *
 * Functions filling a caller buffer return 0 or -E2BIG (buffer too small,
 * nothing written); *_dup variants allocate with efs_mem and return 0 or
 * -ENOMEM, and the caller frees ret->data with efs_mem_free(). Outputs are
 * set only on success.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Longest name efs_etcd_key_add_name() accepts (POSIX NAME_MAX). */
#define EFS_ETCD_NAME_MAX 255

/* ---- Range helpers ---- */

/*
 * The range_end that selects every key starting with |prefix|: the prefix
 * with its last byte that is not 0xff incremented and everything after it
 * dropped ("a\xff" -> "b"). An empty prefix or one made only of 0xff bytes
 * has no such end, so the result is "\0" (every key >= the start key).
 * |out| needs room for max(|len|, 1) bytes; returns the result's length
 * (always >= 1). Cannot fail.
 */
size_t efs_etcd_prefix_end(const uint8_t *prefix, size_t len, uint8_t *out);

/* Like efs_etcd_prefix_end() into a new efs_mem buffer. -ENOMEM. */
int efs_etcd_prefix_end_dup(const uint8_t *prefix, size_t len, ProtobufCBinaryData *ret);

/*
 * The smallest key after |key|: |key| followed by one zero byte, the start
 * of the next page of a Range whose last returned key was |key|. Needs
 * |outsize| >= |len| + 1, else -E2BIG; *ret_len is |len| + 1.
 */
int efs_etcd_next_key(const uint8_t *key, size_t len, uint8_t *out, size_t outsize,
		      size_t *ret_len);

/* Like efs_etcd_next_key() into a new efs_mem buffer. -ENOMEM. */
int efs_etcd_next_key_dup(const uint8_t *key, size_t len, ProtobufCBinaryData *ret);

/* True when |key| starts with |prefix| (an empty prefix matches all). */
bool efs_etcd_key_has_prefix(const uint8_t *key, size_t len, const uint8_t *prefix, size_t plen);

/* etcd's key order: <0, 0 or >0 like memcmp, a proper prefix sorts first. */
int efs_etcd_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen);

/* ---- Big-endian integers ---- */

/*
 * Fixed-width big-endian encodings compare bytewise in numeric order, so
 * keys holding them scan in numeric order. The signed form flips the sign
 * bit so that negative values sort before positive ones.
 */
void efs_etcd_be32_put(uint8_t out[4], uint32_t v);
uint32_t efs_etcd_be32_get(const uint8_t in[4]);
void efs_etcd_be64_put(uint8_t out[8], uint64_t v);
uint64_t efs_etcd_be64_get(const uint8_t in[8]);
void efs_etcd_be64s_put(uint8_t out[8], int64_t v);
int64_t efs_etcd_be64s_get(const uint8_t in[8]);

/*
 * Reads a big-endian integer at byte |off| of a key of |len| bytes (a key
 * from a response, so its length is not trusted). -EINVAL when the integer
 * does not fit inside the key; *ret untouched then.
 */
int efs_etcd_key_get_u32(const uint8_t *key, size_t len, size_t off, uint32_t *ret);
int efs_etcd_key_get_u64(const uint8_t *key, size_t len, size_t off, uint64_t *ret);

/* ---- Key builder ---- */

/*
 * Builds a key in a caller-owned buffer of |cap| bytes from a prefix and
 * segments. The first error sticks: later adds do nothing and return it,
 * so a caller may chain adds and check once (efs_etcd_key_add_* return
 * value or |err|). A failed add leaves the key as it was before that add.
 */
struct efs_etcd_key {
	uint8_t *buf;
	size_t cap;
	size_t len; /* bytes used, <= cap */
	int err;    /* first error, 0 if none */
};

void efs_etcd_key_init(struct efs_etcd_key *k, uint8_t *buf, size_t cap);

/* Appends |n| raw bytes. -E2BIG when the key would exceed its capacity. */
int efs_etcd_key_add(struct efs_etcd_key *k, const void *p, size_t n);

/* Appends a NUL-terminated string (without the NUL). -E2BIG. */
int efs_etcd_key_add_str(struct efs_etcd_key *k, const char *s);

/*
 * Appends a file name: 1 to EFS_ETCD_NAME_MAX bytes, no '/'. Errors:
 * -ENAMETOOLONG (longer than EFS_ETCD_NAME_MAX), -EINVAL (empty or holding
 * '/'), -E2BIG (no room left).
 */
int efs_etcd_key_add_name(struct efs_etcd_key *k, const char *name);

/* Appends 4 or 8 big-endian bytes. -E2BIG. */
int efs_etcd_key_add_u32(struct efs_etcd_key *k, uint32_t v);
int efs_etcd_key_add_u64(struct efs_etcd_key *k, uint64_t v);

/* Copies the key into a new efs_mem buffer. Returns the sticky error if any,
 * else 0 or -ENOMEM. */
int efs_etcd_key_dup(const struct efs_etcd_key *k, ProtobufCBinaryData *ret);
