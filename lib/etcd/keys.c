/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/keys.h"

#include <errno.h>
#include <string.h>

#include "util/mem.h"

/* ---- Range helpers ---- */

size_t efs_etcd_prefix_end(const uint8_t *prefix, size_t len, uint8_t *out)
{
	size_t i = len;

	while (i > 0 && prefix[i - 1] == 0xff)
		i--;
	if (i == 0) {
		out[0] = 0;
		return 1;
	}
	memmove(out, prefix, i);
	out[i - 1]++;
	return i;
}

int efs_etcd_prefix_end_dup(const uint8_t *prefix, size_t len, ProtobufCBinaryData *ret)
{
	uint8_t *buf = efs_mem_malloc(len ? len : 1);

	if (!buf)
		return -ENOMEM;
	ret->len = efs_etcd_prefix_end(prefix, len, buf);
	ret->data = buf;
	return 0;
}

int efs_etcd_next_key(const uint8_t *key, size_t len, uint8_t *out, size_t outsize,
		      size_t *ret_len)
{
	if (len >= outsize)
		return -E2BIG;
	if (len)
		memmove(out, key, len);
	out[len] = 0;
	*ret_len = len + 1;
	return 0;
}

int efs_etcd_next_key_dup(const uint8_t *key, size_t len, ProtobufCBinaryData *ret)
{
	uint8_t *buf = efs_mem_malloc(len + 1);

	if (!buf)
		return -ENOMEM;
	if (len)
		memcpy(buf, key, len);
	buf[len] = 0;
	ret->data = buf;
	ret->len = len + 1;
	return 0;
}

bool efs_etcd_key_has_prefix(const uint8_t *key, size_t len, const uint8_t *prefix,
			     size_t plen)
{
	return plen <= len && (plen == 0 || memcmp(key, prefix, plen) == 0);
}

int efs_etcd_key_cmp(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? memcmp(a, b, n) : 0;

	if (c != 0)
		return c;
	return (alen > blen) - (alen < blen);
}

/* ---- Big-endian integers ---- */

/* |n| bytes of |v|, most significant first: the one byte order of keys. */
static void be_put(uint8_t *out, uint64_t v, int n)
{
	for (int i = n - 1; i >= 0; i--) {
		out[i] = (uint8_t)v;
		v >>= 8;
	}
}

static uint64_t be_get(const uint8_t *in, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v = v << 8 | in[i];
	return v;
}

void efs_etcd_be32_put(uint8_t out[4], uint32_t v)
{
	be_put(out, v, 4);
}

uint32_t efs_etcd_be32_get(const uint8_t in[4])
{
	return (uint32_t)be_get(in, 4);
}

void efs_etcd_be64_put(uint8_t out[8], uint64_t v)
{
	be_put(out, v, 8);
}

uint64_t efs_etcd_be64_get(const uint8_t in[8])
{
	return be_get(in, 8);
}

/* Two's complement with the sign bit flipped is offset binary, whose
 * unsigned order is the signed order. */
void efs_etcd_be64s_put(uint8_t out[8], int64_t v)
{
	efs_etcd_be64_put(out, (uint64_t)v ^ (UINT64_C(1) << 63));
}

int64_t efs_etcd_be64s_get(const uint8_t in[8])
{
	uint64_t u = efs_etcd_be64_get(in) ^ (UINT64_C(1) << 63);

	/* Converting back without implementation-defined behaviour. */
	if (u <= INT64_MAX)
		return (int64_t)u;
	return -(int64_t)(~u) - 1;
}

int efs_etcd_key_get_u32(const uint8_t *key, size_t len, size_t off, uint32_t *ret)
{
	if (off > len || len - off < 4)
		return -EINVAL;
	*ret = efs_etcd_be32_get(key + off);
	return 0;
}

int efs_etcd_key_get_u64(const uint8_t *key, size_t len, size_t off, uint64_t *ret)
{
	if (off > len || len - off < 8)
		return -EINVAL;
	*ret = efs_etcd_be64_get(key + off);
	return 0;
}

/* ---- Key builder ---- */

void efs_etcd_key_init(struct efs_etcd_key *k, uint8_t *buf, size_t cap)
{
	k->buf = buf;
	k->cap = cap;
	k->len = 0;
	k->err = 0;
}

int efs_etcd_key_add(struct efs_etcd_key *k, const void *p, size_t n)
{
	if (k->err)
		return k->err;
	if (n > k->cap - k->len)
		return k->err = -E2BIG;
	if (n)
		memcpy(k->buf + k->len, p, n);
	k->len += n;
	return 0;
}

int efs_etcd_key_add_str(struct efs_etcd_key *k, const char *s)
{
	return efs_etcd_key_add(k, s, strlen(s));
}

int efs_etcd_key_add_name(struct efs_etcd_key *k, const char *name)
{
	size_t n;

	if (k->err)
		return k->err;
	n = strnlen(name, EFS_ETCD_NAME_MAX + 1);
	if (n > EFS_ETCD_NAME_MAX)
		return k->err = -ENAMETOOLONG;
	if (n == 0 || memchr(name, '/', n))
		return k->err = -EINVAL;
	return efs_etcd_key_add(k, name, n);
}

int efs_etcd_key_add_u32(struct efs_etcd_key *k, uint32_t v)
{
	uint8_t b[4];

	efs_etcd_be32_put(b, v);
	return efs_etcd_key_add(k, b, sizeof(b));
}

int efs_etcd_key_add_u64(struct efs_etcd_key *k, uint64_t v)
{
	uint8_t b[8];

	efs_etcd_be64_put(b, v);
	return efs_etcd_key_add(k, b, sizeof(b));
}

int efs_etcd_key_dup(const struct efs_etcd_key *k, ProtobufCBinaryData *ret)
{
	uint8_t *buf;

	if (k->err)
		return k->err;
	buf = efs_mem_malloc(k->len ? k->len : 1);
	if (!buf)
		return -ENOMEM;
	if (k->len)
		memcpy(buf, k->buf, k->len);
	ret->data = buf;
	ret->len = k->len;
	return 0;
}
