/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/grpc.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <nghttp2/nghttp2.h>

#include "util/mem.h"

/* ---- Framing ---- */

/* A valid, non-NULL address handed to the callback for zero-length
 * messages, so that callers may pass it on to protobuf_c_message_unpack. */
static const uint8_t empty_msg[1];

void efs_grpc_reader_init(struct efs_grpc_reader *r, size_t max_msg)
{
	memset(r, 0, sizeof(*r));
	r->max_msg = max_msg;
}

void efs_grpc_reader_done(struct efs_grpc_reader *r)
{
	efs_mem_free(r->buf);
	r->buf = NULL;
	r->cap = 0;
	r->prefix_have = 0;
	r->need = 0;
	r->have = 0;
}

bool efs_grpc_reader_is_idle(const struct efs_grpc_reader *r)
{
	return r->prefix_have == 0;
}

/* Ends the current message: the reader goes back to waiting for a prefix
 * whatever the callback said, so that its buffer is never leaked. */
static void reader_next(struct efs_grpc_reader *r)
{
	efs_mem_free(r->buf);
	r->buf = NULL;
	r->cap = 0;
	r->prefix_have = 0;
	r->need = 0;
	r->have = 0;
}

/* The first allocation for a split message. A prefix is only a claim: a
 * broken or hostile server could announce max_msg-sized messages on many
 * streams and send nothing more, so the buffer grows with the bytes that
 * actually arrive instead of being sized from the prefix up front. */
#define READER_INITIAL_CAP (64 * 1024)

/* Makes room for |more| body bytes (have + more <= need). */
static int reader_reserve(struct efs_grpc_reader *r, size_t more)
{
	size_t want = r->have + more, ncap;
	uint8_t *n;

	if (want <= r->cap)
		return 0;
	ncap = r->cap ? r->cap : READER_INITIAL_CAP;
	while (ncap < want)
		ncap = ncap > r->need / 2 ? r->need : ncap * 2;
	if (ncap > r->need)
		ncap = r->need;
	n = efs_mem_realloc(r->buf, ncap);
	if (!n)
		return -ENOMEM;
	r->buf = n;
	r->cap = ncap;
	return 0;
}

/* prefix_have past the prefix length marks a reader that failed: feeding it
 * again returns -EPROTO instead of misreading the bytes after the error. */
#define READER_FAILED (EFS_GRPC_PREFIX_LEN + 1)

static int reader_fail(struct efs_grpc_reader *r, int err)
{
	r->prefix_have = READER_FAILED;
	return err;
}

/*
 * A message that arrives whole inside one chunk is handed to the callback in
 * place; only a message split across chunks is copied into |buf|, which
 * grows (doubling, at most to the announced size, itself bounded by max_msg)
 * as its bytes arrive.
 */
int efs_grpc_reader_feed(struct efs_grpc_reader *r, const uint8_t *data, size_t len,
			 efs_grpc_msg_cb cb, void *arg)
{
	if (r->prefix_have > EFS_GRPC_PREFIX_LEN)
		return -EPROTO;
	while (len > 0 || (r->prefix_have == EFS_GRPC_PREFIX_LEN && r->have == r->need)) {
		size_t n;
		int err;

		if (r->prefix_have < EFS_GRPC_PREFIX_LEN) {
			uint32_t mlen;

			n = EFS_GRPC_PREFIX_LEN - r->prefix_have;
			if (n > len)
				n = len;
			memcpy(r->prefix + r->prefix_have, data, n);
			r->prefix_have += n;
			data += n;
			len -= n;
			if (r->prefix_have < EFS_GRPC_PREFIX_LEN)
				return 0;
			/* Flag values other than 0 are compression (1) or
			 * garbage; we never negotiate grpc-encoding. */
			if (r->prefix[0] != 0)
				return reader_fail(r, -EPROTO);
			mlen = (uint32_t)r->prefix[1] << 24 | (uint32_t)r->prefix[2] << 16 |
			       (uint32_t)r->prefix[3] << 8 | (uint32_t)r->prefix[4];
			if (mlen > r->max_msg)
				return reader_fail(r, -EMSGSIZE);
			r->need = mlen;
			r->have = 0;
			if (r->need > 0 && len >= r->need) {
				err = cb(data, r->need, arg);
				data += r->need;
				len -= r->need;
				reader_next(r);
				if (err < 0)
					return err;
				continue;
			}
		}
		n = r->need - r->have;
		if (n > len)
			n = len;
		if (n > 0) {
			if (reader_reserve(r, n) < 0)
				return reader_fail(r, -ENOMEM);
			memcpy(r->buf + r->have, data, n);
			r->have += n;
			data += n;
			len -= n;
		}
		if (r->have < r->need)
			return 0;
		err = cb(r->buf ? r->buf : empty_msg, r->need, arg);
		reader_next(r);
		if (err < 0)
			return err;
	}
	return 0;
}

int efs_grpc_frame_into(const ProtobufCMessage *msg, uint8_t **buf, size_t *cap,
			size_t *ret_len)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *b;

	if (len > UINT32_MAX)
		return -EMSGSIZE;
	if (EFS_GRPC_PREFIX_LEN + len > *cap) {
		/* No realloc: the old contents are not wanted. */
		b = efs_mem_malloc(EFS_GRPC_PREFIX_LEN + len);
		if (!b)
			return -ENOMEM;
		efs_mem_free(*buf);
		*buf = b;
		*cap = EFS_GRPC_PREFIX_LEN + len;
	}
	b = *buf;
	b[0] = 0;
	b[1] = (uint8_t)(len >> 24);
	b[2] = (uint8_t)(len >> 16);
	b[3] = (uint8_t)(len >> 8);
	b[4] = (uint8_t)len;
	if (protobuf_c_message_pack(msg, b + EFS_GRPC_PREFIX_LEN) != len)
		return -EPROTO;
	*ret_len = EFS_GRPC_PREFIX_LEN + len;
	return 0;
}

int efs_grpc_frame(const ProtobufCMessage *msg, uint8_t **ret_buf, size_t *ret_len)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf;

	if (len > UINT32_MAX)
		return -EMSGSIZE;
	buf = efs_mem_malloc(EFS_GRPC_PREFIX_LEN + len);
	if (!buf)
		return -ENOMEM;
	buf[0] = 0;
	buf[1] = (uint8_t)(len >> 24);
	buf[2] = (uint8_t)(len >> 16);
	buf[3] = (uint8_t)(len >> 8);
	buf[4] = (uint8_t)len;
	if (protobuf_c_message_pack(msg, buf + EFS_GRPC_PREFIX_LEN) != len) {
		efs_mem_free(buf);
		return -EPROTO;
	}
	*ret_buf = buf;
	*ret_len = EFS_GRPC_PREFIX_LEN + len;
	return 0;
}

/* ---- Response headers and trailers ---- */

void efs_grpc_status_init(struct efs_grpc_status *st)
{
	st->http_status = 0;
	st->code = -1;
	st->content_type_ok = false;
	st->message[0] = '\0';
}

static bool name_is(const uint8_t *name, size_t namelen, const char *want)
{
	size_t n = strlen(want);

	return namelen == n && memcmp(name, want, n) == 0;
}

/* Parses a decimal number of 1..|maxdigits| digits with nothing around it. */
static int parse_uint(const uint8_t *v, size_t len, size_t maxdigits, int *ret)
{
	int x = 0;

	if (len == 0 || len > maxdigits)
		return -EPROTO;
	for (size_t i = 0; i < len; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -EPROTO;
		x = x * 10 + (v[i] - '0');
	}
	*ret = x;
	return 0;
}

/* "application/grpc", optionally followed by "+<subtype>" or parameters;
 * media types compare case-insensitively (RFC 9110 8.3.1). */
static bool content_type_is_grpc(const uint8_t *v, size_t len)
{
	static const char want[] = "application/grpc";
	size_t n = sizeof(want) - 1;

	if (len < n || strncasecmp((const char *)v, want, n) != 0)
		return false;
	return len == n || v[n] == '+' || v[n] == ';';
}

int efs_grpc_status_header(struct efs_grpc_status *st, const uint8_t *name, size_t namelen,
			   const uint8_t *value, size_t valuelen)
{
	int x;

	if (name_is(name, namelen, ":status")) {
		if (parse_uint(value, valuelen, 3, &x) < 0 || x < 100)
			return -EPROTO;
		st->http_status = x;
	} else if (name_is(name, namelen, "grpc-status")) {
		/* Codes beyond 16 are legal on the wire (a newer server) and
		 * end up as -EPROTO in the errno table; nine digits keep the
		 * value within int. */
		if (parse_uint(value, valuelen, 9, &x) < 0)
			return -EPROTO;
		st->code = x;
	} else if (name_is(name, namelen, "grpc-message")) {
		efs_grpc_percent_decode(value, valuelen, st->message, sizeof(st->message));
	} else if (name_is(name, namelen, "content-type")) {
		st->content_type_ok = content_type_is_grpc(value, valuelen);
	}
	return 0;
}

/* grpc's HTTP -> gRPC table (doc/http-grpc-status-mapping.md). */
static int code_from_http(int http_status)
{
	switch (http_status) {
	case 400:
		return EFS_GRPC_INTERNAL;
	case 401:
		return EFS_GRPC_UNAUTHENTICATED;
	case 403:
		return EFS_GRPC_PERMISSION_DENIED;
	case 404:
		return EFS_GRPC_UNIMPLEMENTED;
	case 429:
	case 502:
	case 503:
	case 504:
		return EFS_GRPC_UNAVAILABLE;
	default:
		return EFS_GRPC_UNKNOWN;
	}
}

/*
 * grpc-status, when present, is the answer whatever :status said. Without
 * it: no :status at all is a broken response (INTERNAL, like grpc-go); a
 * non-200 :status goes through grpc's HTTP table (a proxy or the JSON
 * gateway answered); a 200 that ended without a status is UNKNOWN. The
 * synthesised message names what was missing so that logs say why.
 */
int efs_grpc_status_finish(struct efs_grpc_status *st)
{
	if (st->code >= 0)
		return st->code;
	if (st->http_status == 0) {
		st->code = EFS_GRPC_INTERNAL;
		snprintf(st->message, sizeof(st->message), "malformed response: no :status");
	} else if (st->http_status != 200) {
		st->code = code_from_http(st->http_status);
		snprintf(st->message, sizeof(st->message), "unexpected HTTP status %d%s",
			 st->http_status, st->content_type_ok ? "" : " (not a gRPC content-type)");
	} else {
		st->code = EFS_GRPC_UNKNOWN;
		snprintf(st->message, sizeof(st->message), "stream ended without grpc-status%s",
			 st->content_type_ok ? "" : " (not a gRPC content-type)");
	}
	return st->code;
}

/*
 * grpc doc/PROTOCOL-HTTP2.md "Errors": REFUSED_STREAM means the server did
 * not process the stream (safe to retry anywhere); INADEQUATE_SECURITY is
 * PERMISSION_DENIED per that table (a refinement over "others INTERNAL");
 * NO_ERROR without trailers, like every other code, is INTERNAL.
 */
int efs_grpc_code_from_rst(uint32_t h2_error_code)
{
	switch (h2_error_code) {
	case NGHTTP2_REFUSED_STREAM:
		return EFS_GRPC_UNAVAILABLE;
	case NGHTTP2_CANCEL:
		return EFS_GRPC_CANCELLED;
	case NGHTTP2_ENHANCE_YOUR_CALM:
		return EFS_GRPC_RESOURCE_EXHAUSTED;
	case NGHTTP2_INADEQUATE_SECURITY:
		return EFS_GRPC_PERMISSION_DENIED;
	default:
		return EFS_GRPC_INTERNAL;
	}
}

static int hexval(uint8_t c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Length of |s|[0..len) without a trailing incomplete UTF-8 sequence, so a
 * truncated message never ends in half a character. */
static size_t utf8_trim(const char *s, size_t len)
{
	size_t i = len, cont = 0;

	while (i > 0 && ((uint8_t)s[i - 1] & 0xc0) == 0x80 && cont < 3) {
		i--;
		cont++;
	}
	if (i > 0) {
		uint8_t lead = (uint8_t)s[i - 1];
		size_t want;

		if (lead >= 0xf0)
			want = 3;
		else if (lead >= 0xe0)
			want = 2;
		else if (lead >= 0xc0)
			want = 1;
		else
			return len;
		if (cont < want)
			return i - 1;
	}
	return len;
}

/*
 * Lenient like grpc-go: "%" not followed by two hex digits is kept as is.
 * "%00" is kept as the three characters too, because a decoded NUL would cut
 * the C string the result is used as.
 */
size_t efs_grpc_percent_decode(const uint8_t *in, size_t len, char *out, size_t outsize)
{
	size_t o = 0;
	bool truncated = false;

	if (outsize == 0)
		return 0;
	for (size_t i = 0; i < len; i++) {
		uint8_t c = in[i];
		int hi, lo;

		if (c == '%' && i + 2 < len && (hi = hexval(in[i + 1])) >= 0 &&
		    (lo = hexval(in[i + 2])) >= 0 && (hi | lo) != 0) {
			c = (uint8_t)(hi << 4 | lo);
			i += 2;
		} else if (c == '\0') {
			/* A raw NUL cannot be a header value byte; stop. */
			break;
		}
		if (o + 1 >= outsize) {
			truncated = true;
			break;
		}
		out[o++] = (char)c;
	}
	if (truncated)
		o = utf8_trim(out, o);
	out[o] = '\0';
	return o;
}

/* ---- Status -> errno ---- */

/*
 * The client's one status -> errno table. Rows are tried in order; the
 * first whose code matches and whose |text| (when set) occurs in the
 * message wins, so each code's catch-all row comes last. etcd prefixes its texts with
 * "etcdserver: " or "mvcc: ", hence substring matching. Per row:
 *  - unknown: if the call was a mutation already on the wire, its outcome is
 *    unknown (it may have been applied): timeouts, a stopping server that
 *    may have proposed it, unspecific unavailability, transport-level
 *    INTERNAL and UNKNOWN. Everything else was rejected before being
 *    applied.
 *  - auth_retry: re-authenticate once and retry.
 * Choices beyond the obvious:
 *  - UNAVAILABLE splits into -ETIMEDOUT (timed out, maybe applied), -EAGAIN
 *    (this member cannot serve now: back off or go elsewhere, not applied)
 *    and -ENOTCONN (anything else, including RST_STREAM REFUSED_STREAM and
 *    synthesised 502/503/504).
 *  - RESOURCE_EXHAUSTED: database full -ENOSPC, apply backlog -EBUSY,
 *    grpc's message size limit -EMSGSIZE, anything else (ENHANCE_YOUR_CALM)
 *    -ENOBUFS.
 *  - OUT_OF_RANGE has three distinct meanings with the EFS_ETCD_E* names in
 *    grpc.h; anything else there is -EDOM.
 *  - FAILED_PRECONDITION: "...already exist(s)" -EEXIST, "...not found"
 *    -ENOENT, auth disabled -EOPNOTSUPP, otherwise -EPERM (the cluster is not
 *    in a state that allows the operation).
 *  - ABORTED (unused by etcd) -EAGAIN; ALREADY_EXISTS -EEXIST.
 *  - DATA_LOSS ("corrupt cluster") and UNKNOWN (etcd's unmapped errors) -EIO,
 *    but for UNKNOWN's known raw texts: "too many requests" -EBUSY and
 *    "raft proposal dropped" -EAGAIN (both refused before proposing).
 */
struct status_row {
	int code;
	const char *text;
	int err;
	bool unknown;
	bool auth_retry;
};

static const struct status_row status_table[] = {
	{EFS_GRPC_OK, NULL, 0, false, false},
	{EFS_GRPC_CANCELLED, NULL, -ECANCELED, false, false},
	/* etcd 3.4 sends some errors as raw Go errors, which grpc-go turns
	 * into UNKNOWN: its rate limit (rejected before proposing, so known
	 * not applied) and the server-side copy of our deadline firing. */
	{EFS_GRPC_UNKNOWN, "too many requests", -EBUSY, false, false},
	/* raft's ErrProposalDropped: a member with no leader (a follower
	 * during an election, a candidate) or a leader handing its role over
	 * refuses the proposal before it enters the log, so it never
	 * applies. Like "no leader", resent within the deadline. */
	{EFS_GRPC_UNKNOWN, "raft proposal dropped", -EAGAIN, false, false},
	{EFS_GRPC_UNKNOWN, "context deadline exceeded", -ETIMEDOUT, true, false},
	{EFS_GRPC_UNKNOWN, "context canceled", -ECANCELED, true, false},
	{EFS_GRPC_UNKNOWN, NULL, -EIO, true, false},
	{EFS_GRPC_INVALID_ARGUMENT, "request is too large", -EMSGSIZE, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "too many operations in txn request", -E2BIG, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, "revision of auth store is old", -EACCES, false, true},
	{EFS_GRPC_INVALID_ARGUMENT, "user name is empty", -EACCES, false, true},
	{EFS_GRPC_INVALID_ARGUMENT, "authentication failed", -EACCES, false, false},
	{EFS_GRPC_INVALID_ARGUMENT, NULL, -EINVAL, false, false},
	{EFS_GRPC_DEADLINE_EXCEEDED, NULL, -ETIMEDOUT, true, false},
	{EFS_GRPC_NOT_FOUND, NULL, -ENOENT, false, false},
	{EFS_GRPC_ALREADY_EXISTS, NULL, -EEXIST, false, false},
	{EFS_GRPC_PERMISSION_DENIED, NULL, -EPERM, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, "database space exceeded", -ENOSPC, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, "too many requests", -EBUSY, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, "larger than max", -EMSGSIZE, false, false},
	{EFS_GRPC_RESOURCE_EXHAUSTED, NULL, -ENOBUFS, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "authentication is not enabled", -EOPNOTSUPP, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "already exist", -EEXIST, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, "not found", -ENOENT, false, false},
	{EFS_GRPC_FAILED_PRECONDITION, NULL, -EPERM, false, false},
	{EFS_GRPC_ABORTED, NULL, -EAGAIN, false, false},
	{EFS_GRPC_OUT_OF_RANGE, "required revision has been compacted", EFS_ETCD_ECOMPACTED, false,
	 false},
	{EFS_GRPC_OUT_OF_RANGE, "future revision", EFS_ETCD_EFUTUREREV, false, false},
	{EFS_GRPC_OUT_OF_RANGE, "too large lease TTL", EFS_ETCD_ELEASETTL, false, false},
	{EFS_GRPC_OUT_OF_RANGE, NULL, -EDOM, false, false},
	{EFS_GRPC_UNIMPLEMENTED, NULL, -ENOSYS, false, false},
	{EFS_GRPC_INTERNAL, NULL, -EPROTO, true, false},
	/* A read waiting for the applied index: nothing was written. */
	{EFS_GRPC_UNAVAILABLE, "waiting for the applied index", -ETIMEDOUT, false, false},
	/* Also "...possibly due to previous leader failure" and
	 * "...possibly due to connection lost". */
	{EFS_GRPC_UNAVAILABLE, "request timed out", -ETIMEDOUT, true, false},
	{EFS_GRPC_UNAVAILABLE, "no leader", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "leader changed", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "not capable", -EAGAIN, false, false},
	{EFS_GRPC_UNAVAILABLE, "not supported for learner", -EAGAIN, false, false},
	/* The server may stop after proposing our write. */
	{EFS_GRPC_UNAVAILABLE, "server stopped", -EAGAIN, true, false},
	{EFS_GRPC_UNAVAILABLE, NULL, -ENOTCONN, true, false},
	{EFS_GRPC_DATA_LOSS, NULL, -EIO, false, false},
	{EFS_GRPC_UNAUTHENTICATED, "invalid auth token", -EACCES, false, true},
	{EFS_GRPC_UNAUTHENTICATED, NULL, -EACCES, false, false},
};

static const struct status_row *status_lookup(int code, const char *message)
{
	for (size_t i = 0; i < sizeof(status_table) / sizeof(status_table[0]); i++) {
		const struct status_row *row = &status_table[i];

		if (row->code != code)
			continue;
		if (row->text && (!message || !strstr(message, row->text)))
			continue;
		return row;
	}
	return NULL;
}

int efs_grpc_status_to_errno(int code, const char *message, bool sent_mutation,
			     bool *ret_unknown)
{
	const struct status_row *row = status_lookup(code, message);

	if (ret_unknown)
		*ret_unknown = row ? sent_mutation && row->unknown : sent_mutation;
	/* A code we do not know is a protocol we do not speak; whether a
	 * mutation applied cannot be told. */
	return row ? row->err : -EPROTO;
}

bool efs_grpc_is_auth_retry(int code, const char *message)
{
	const struct status_row *row = status_lookup(code, message);

	return row && row->auth_retry;
}

/*
 * Input has millisecond precision, so "m" is the finest unit worth sending;
 * coarser units are used only when the value needs more than 8 digits, and
 * round up so the server never gives up before we would. 0 becomes "1m"
 * (a 0 timeout would fail at once), and beyond 99999999 hours it saturates.
 */
size_t efs_grpc_format_timeout(uint64_t ms, char buf[16])
{
	static const struct {
		uint64_t ms;
		char unit;
	} units[] = {
		{1, 'm'},
		{1000, 'S'},
		{60ull * 1000, 'M'},
		{3600ull * 1000, 'H'},
	};
	const uint64_t max = 99999999;
	uint64_t v = ms ? ms : 1;
	char unit = 'H', digits[20];
	int n;

	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		uint64_t d = ms / units[i].ms + (ms % units[i].ms != 0);

		if (d <= max) {
			v = d ? d : 1;
			unit = units[i].unit;
			break;
		}
		v = max;
	}
	/* Formatted by hand: this runs for every call, and snprintf cost
	 * about 4 % of a Put's client CPU in the benchmark. */
	n = 0;
	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (int i = 0; i < n; i++)
		buf[i] = digits[n - 1 - i];
	buf[n++] = unit;
	buf[n] = '\0';
	return (size_t)n;
}

/* ---- Backoff ---- */

/* splitmix64 spreads a small or structured seed over all 64 bits before it
 * seeds xorshift, whose first outputs from a seed like 1 are poor. */
static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t xorshift64(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*s = x;
	return x;
}

void efs_backoff_init(struct efs_backoff *b, uint32_t base_ms, uint32_t max_ms, uint64_t seed)
{
	b->base_ms = base_ms;
	b->max_ms = max_ms;
	b->attempt = 0;
	b->rng = splitmix64(seed);
	if (b->rng == 0)
		b->rng = 0x2545f4914f6cdd1dull;
}

uint32_t efs_backoff_next(struct efs_backoff *b)
{
	uint64_t d = b->max_ms, lo, span;

	/* base < 2^32, so shifting by fewer than 32 stays below 2^64. */
	if (b->attempt < 32) {
		uint64_t e = (uint64_t)b->base_ms << b->attempt;

		if (e < d)
			d = e;
	}
	if (b->attempt < UINT32_MAX)
		b->attempt++;
	lo = d - d / 5;
	span = d / 5 * 2;
	d = lo + xorshift64(&b->rng) % (span + 1);
	return d > UINT32_MAX ? UINT32_MAX : (uint32_t)d;
}

void efs_backoff_reset(struct efs_backoff *b)
{
	b->attempt = 0;
}
