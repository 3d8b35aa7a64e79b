/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * gRPC wire codec, pure (no I/O, no loop): message framing and reassembly,
 * response header/trailer interpretation, grpc-message percent-decoding, the
 * status -> errno table, grpc-timeout formatting and reconnect backoff.
 * Unit-tested on its own (test/unit/test_grpc.c) and fuzzed.
 */

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* gRPC status codes (grpc/doc/statuscodes.md). */
enum efs_grpc_code {
	EFS_GRPC_OK = 0,
	EFS_GRPC_CANCELLED = 1,
	EFS_GRPC_UNKNOWN = 2,
	EFS_GRPC_INVALID_ARGUMENT = 3,
	EFS_GRPC_DEADLINE_EXCEEDED = 4,
	EFS_GRPC_NOT_FOUND = 5,
	EFS_GRPC_ALREADY_EXISTS = 6,
	EFS_GRPC_PERMISSION_DENIED = 7,
	EFS_GRPC_RESOURCE_EXHAUSTED = 8,
	EFS_GRPC_FAILED_PRECONDITION = 9,
	EFS_GRPC_ABORTED = 10,
	EFS_GRPC_OUT_OF_RANGE = 11,
	EFS_GRPC_UNIMPLEMENTED = 12,
	EFS_GRPC_INTERNAL = 13,
	EFS_GRPC_UNAVAILABLE = 14,
	EFS_GRPC_DATA_LOSS = 15,
	EFS_GRPC_UNAUTHENTICATED = 16,
};

#define EFS_GRPC_PREFIX_LEN  5
#define EFS_GRPC_MESSAGE_MAX 512

/* ---- Framing ---- */

/*
 * Reassembles length-prefixed messages from DATA chunks whose boundaries are
 * unrelated to message boundaries. |max_msg| bounds one message's length.
 */
struct efs_grpc_reader {
	uint8_t prefix[EFS_GRPC_PREFIX_LEN];
	size_t prefix_have; /* bytes of |prefix| filled, 0..5 */
	uint8_t *buf;       /* message body being filled, or NULL */
	size_t need;        /* body length from the prefix */
	size_t have;        /* body bytes in |buf| */
	size_t cap;         /* bytes allocated at |buf| (grows with |have|) */
	size_t max_msg;
};

/* Called once per complete message; |msg| is valid during the call only. A
 * negative return stops feeding and is returned by efs_grpc_reader_feed. */
typedef int (*efs_grpc_msg_cb)(const uint8_t *msg, size_t len, void *arg);

void efs_grpc_reader_init(struct efs_grpc_reader *r, size_t max_msg);
void efs_grpc_reader_done(struct efs_grpc_reader *r);

/* Feeds |len| bytes. Returns 0, -EMSGSIZE (a prefix announces more than
 * max_msg), -EPROTO (compressed flag set: we never negotiate compression),
 * -ENOMEM, or the callback's negative return. After an error the reader must
 * not be fed again (it then returns -EPROTO; the callback's own errors are
 * the exception: the reader goes on with the next message).
 * efs_grpc_reader_done() resets it to a fresh reader. */
int efs_grpc_reader_feed(struct efs_grpc_reader *r, const uint8_t *data, size_t len,
			 efs_grpc_msg_cb cb, void *arg);

/* True when no message is partly received (a stream may end cleanly). */
bool efs_grpc_reader_is_idle(const struct efs_grpc_reader *r);

/* Serialises |msg| behind a 5-byte prefix into a new efs_mem buffer. */
int efs_grpc_frame(const ProtobufCMessage *msg, uint8_t **ret_buf, size_t *ret_len);

/*
 * Like efs_grpc_frame(), but into the caller's reusable efs_mem buffer
 * |*buf| of |*cap| bytes (NULL/0 at first), which is reallocated only when
 * too small. Returns 0 with the framed length in *ret_len, or -ENOMEM /
 * -EMSGSIZE / -EPROTO with |*buf| and |*cap| still valid (to be freed by the
 * caller) and their contents unspecified.
 */
int efs_grpc_frame_into(const ProtobufCMessage *msg, uint8_t **buf, size_t *cap,
			size_t *ret_len);

/* ---- Response headers and trailers ---- */

/*
 * Collects what a response's header blocks say. Feed every header of the
 * response block and of the trailer block; then efs_grpc_status_finish()
 * decides the call's status: grpc-status if present (trailers-only or
 * trailers), otherwise synthesised from :status per grpc's HTTP table
 * (404 UNIMPLEMENTED; 429, 502, 503, 504 UNAVAILABLE; 401 UNAUTHENTICATED;
 * 403 PERMISSION_DENIED; others, and 200 without grpc-status, UNKNOWN or
 * INTERNAL).
 */
struct efs_grpc_status {
	int http_status;  /* :status, 0 if not seen */
	int code;         /* grpc-status, -1 if not seen */
	bool content_type_ok;
	char message[EFS_GRPC_MESSAGE_MAX]; /* percent-decoded grpc-message */
};

void efs_grpc_status_init(struct efs_grpc_status *st);
/* Returns 0, or -EPROTO for a malformed :status or grpc-status value. */
int efs_grpc_status_header(struct efs_grpc_status *st, const uint8_t *name, size_t namelen,
			   const uint8_t *value, size_t valuelen);
/* Returns the final gRPC code (and fills message when it synthesises one). */
int efs_grpc_status_finish(struct efs_grpc_status *st);

/* gRPC code for a server RST_STREAM error code, as gRPC maps them:
 * REFUSED_STREAM (nothing processed) is UNAVAILABLE, anything unknown
 * INTERNAL. */
int efs_grpc_code_from_rst(uint32_t h2_error_code);

/* Decodes grpc-message's %XX escapes leniently (a bad escape is copied as
 * is) into |out| (NUL-terminated, truncated to |outsize|). Returns the
 * decoded length. */
size_t efs_grpc_percent_decode(const uint8_t *in, size_t len, char *out, size_t outsize);

/*
 * The client's one status -> errno table, deciding from code and message
 * text together. |sent_mutation| says the call was a mutation
 * that reached the wire; *ret_unknown is set to true when its outcome is
 * unknown (timeouts, DEADLINE_EXCEEDED, "request timed out"). Returns 0 for
 * OK and a negative errno otherwise; see grpc.c for the table.
 */
int efs_grpc_status_to_errno(int code, const char *message, bool sent_mutation,
			     bool *ret_unknown);

/*
 * Errnos of the table that callers must tell apart, each distinct from every
 * other errno the table returns:
 *  - EFS_ETCD_ECOMPACTED: "mvcc: required revision has been compacted"
 *    (OUT_OF_RANGE); re-read at the latest revision.
 *  - EFS_ETCD_EFUTUREREV: "mvcc: required revision is a future revision"
 *    (OUT_OF_RANGE); this member is behind, retry later or elsewhere.
 *  - EFS_ETCD_ELEASETTL: "etcdserver: too large lease TTL" (OUT_OF_RANGE).
 * Other rows callers commonly test: -ETIMEDOUT (timed out, see
 * ret_unknown), -EAGAIN (member cannot serve now: no leader, leader changed,
 * not capable, learner, stopping), -ENOTCONN (other UNAVAILABLE), -ENOSPC
 * (database space exceeded), -EBUSY (too many requests), -EMSGSIZE (request
 * or message too large), -E2BIG (too many operations in txn), -ENOENT
 * (requested lease not found), -EACCES (auth), -EPERM (permission denied).
 */
#define EFS_ETCD_ECOMPACTED (-ESTALE)
#define EFS_ETCD_EFUTUREREV (-ERANGE)
#define EFS_ETCD_ELEASETTL  (-EOVERFLOW)

/* True when a token error asks for one re-authentication and a retry. */
bool efs_grpc_is_auth_retry(int code, const char *message);

/* Formats a grpc-timeout header value for |ms| ("1500m"; at most 8 digits,
 * moving to coarser units when needed). Returns its length. */
size_t efs_grpc_format_timeout(uint64_t ms, char buf[16]);

/* ---- Backoff ---- */

/* Exponential backoff with +-20 % jitter, capped. */
struct efs_backoff {
	uint32_t base_ms;
	uint32_t max_ms;
	uint32_t attempt;
	uint64_t rng; /* xorshift state, never 0 */
};

void efs_backoff_init(struct efs_backoff *b, uint32_t base_ms, uint32_t max_ms, uint64_t seed);
/* Next delay: base * 2^attempt capped at max, then jittered by +-20 %. */
uint32_t efs_backoff_next(struct efs_backoff *b);
void efs_backoff_reset(struct efs_backoff *b);
