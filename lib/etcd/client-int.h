/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Internals of the etcd client shared by client.c and conn.c, and the test
 * hooks the fuzz target and unit tests use. Not part of the public API.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "etcd/conn.h"
#include "etcd/etcd.h"
#include "etcd/grpc.h"

/*
 * One HTTP/2 stream's worth of state: a unary call's current attempt or a
 * bidirectional stream. Embedded first in struct efs_etcd_call and struct
 * efs_etcd_stream.
 */
struct efs_rpc {
	struct efs_list link;  /* in conn->rpcs, or in the channel's wait list */
	struct efs_conn *conn; /* connection carrying the stream, or NULL */
	int32_t stream_id;
	uint8_t ch;
	bool is_stream;
	bool waiting;       /* in the channel's wait list */
	bool sent;          /* HEADERS handed to the socket */
	bool reset;         /* RST_STREAM sent: ignore what still arrives */
	bool orphan;        /* stream whose owner is gone: free once detached */
	int local_err;      /* error found on our side (-EMSGSIZE, -EBADMSG, ...) */
	struct efs_grpc_reader reader;
	struct efs_grpc_status st;
};

/* Hooks conn.c calls for a stream's events. */
int efs_rpc_on_header(struct efs_rpc *rpc, const uint8_t *name, size_t namelen,
		      const uint8_t *value, size_t valuelen);
int efs_rpc_on_data(struct efs_rpc *rpc, const uint8_t *data, size_t len);
/* The stream ended (|h2_error| from RST_STREAM, or NO_ERROR); |rpc| is
 * already detached from |conn|, which is still valid. */
void efs_rpc_on_close(struct efs_rpc *rpc, struct efs_conn *conn, uint32_t h2_error);
/* HEADERS of |rpc| went out. */
void efs_rpc_on_sent(struct efs_rpc *rpc);
/* Body source for nghttp2: fills |buf|, sets NGHTTP2_DATA_FLAG_EOF at the
 * end, or returns NGHTTP2_ERR_DEFERRED. */
ssize_t efs_rpc_read_body(struct efs_rpc *rpc, uint8_t *buf, size_t len, uint32_t *flags);

/* Hooks conn.c calls for connection events. */
void efs_client_conn_up(struct efs_conn *conn);
/* |conn| died; every rpc on it must be taken off (conn->rpcs). */
void efs_client_conn_down(struct efs_conn *conn, int err);
void efs_client_conn_goaway(struct efs_conn *conn, uint32_t error_code, const uint8_t *data,
			    size_t len);
/* All handles of |conn| are closed; it is about to be freed. */
void efs_client_conn_gone(struct efs_conn *conn);
/* A PING was sent / the interval in force for PINGs. */
uint32_t efs_client_ping_interval_ms(const struct efs_etcd *c);
uint32_t efs_client_ping_timeout_ms(const struct efs_etcd *c);
uint32_t efs_client_connect_timeout_ms(const struct efs_etcd *c);
const struct efs_endpoint *efs_client_endpoint(const struct efs_etcd *c, size_t ep);
uv_loop_t *efs_client_loop(const struct efs_etcd *c);
struct efs_etcd_stats *efs_client_stats(struct efs_etcd *c);
/* Queues |conn| for this loop turn's flush. */
void efs_client_mark_dirty(struct efs_etcd *c, struct efs_conn *conn);
struct efs_tls_ctx *efs_client_tls_ctx(const struct efs_etcd *c);
/* Name sent as SNI and verified for endpoint |ep|. */
const char *efs_client_server_name(const struct efs_etcd *c, size_t ep);
/* Output and captured bytes of an in-memory peer (test hook). */
void efs_client_mem_peer_write(struct efs_etcd *c, const uint8_t *data, size_t len);

/* ---- Test hooks ---- */

/*
 * Creates a client like efs_etcd_new() whose bulk channel talks to an
 * in-memory peer instead of a socket: what the client writes is appended to
 * a capture buffer (efs_etcd_test_output), and efs_etcd_test_feed() hands it
 * server bytes as if read from the socket. The connection is made (without
 * I/O) on the first call or stream of the channel, and becomes usable once
 * the fed bytes contain the server's SETTINGS. |opts->endpoints| must still
 * parse. The priority channel behaves normally.
 */
int efs_etcd_test_new(struct efs_etcd **ret, uv_loop_t *loop, const struct efs_etcd_opts *opts);

/* Feeds server bytes to the oldest live in-memory connection (a draining
 * one after a GOAWAY, else the bulk channel's). Returns 0, or -ENOTCONN when
 * there is no such connection right now (|len| 0 just asks). */
int efs_etcd_test_feed(struct efs_etcd *c, const uint8_t *data, size_t len);

/* The bytes the client has written to its in-memory peer so far. */
const uint8_t *efs_etcd_test_output(const struct efs_etcd *c, size_t *ret_len);
/* Forgets captured output. */
void efs_etcd_test_output_clear(struct efs_etcd *c);
