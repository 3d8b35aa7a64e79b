/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * One HTTP/2 connection of the etcd client: name resolution and TCP through
 * libuv, optional TLS (tls.h), and an nghttp2 client session whose output is
 * batched into one uv_write per loop turn. It knows nothing of gRPC calls:
 * stream events go to the efs_rpc hooks of client-int.h, and connection
 * events (up, down, GOAWAY) to the efs_client_conn_* hooks. Loop thread only.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nghttp2/nghttp2.h>
#include <uv.h>

#include "util/list.h"

struct efs_etcd;
struct efs_rpc;
struct efs_tls;

/* One parsed endpoint URL. */
struct efs_endpoint {
	char *url;       /* normalised "scheme://authority", for logs */
	char *host;      /* without brackets */
	char *port;      /* decimal */
	char *authority; /* host:port as sent in :authority */
	bool tls;
};

enum efs_conn_state {
	EFS_CONN_RESOLVING,
	EFS_CONN_CONNECTING,
	EFS_CONN_TLS,
	EFS_CONN_H2,          /* preface sent, waiting for the server's SETTINGS */
	EFS_CONN_AUTH,        /* SETTINGS seen, Authenticate in flight */
	EFS_CONN_AUTH_FAILED, /* the last Authenticate was refused */
	EFS_CONN_READY,
	EFS_CONN_DRAINING, /* GOAWAY or stream ids running out: no new streams */
	EFS_CONN_DEAD,     /* failed or closed; handles closing */
};

struct efs_conn {
	struct efs_etcd *c;
	struct efs_list link; /* in the client's list of connections */
	int ch;               /* channel index */
	size_t ep;            /* endpoint index */
	enum efs_conn_state state;
	bool mem_peer; /* test hook: no socket; see efs_etcd_test_new() */

	uv_getaddrinfo_t gai;
	struct addrinfo *ai, *ai_next; /* resolved addresses, next to try */
	uv_tcp_t *tcp; /* this connect attempt's socket, or NULL */
	uv_connect_t creq;
	uv_timer_t timer; /* connect timeout, then keepalive PINGs */
	uv_write_t wreq;
	bool gai_pending;
	bool writing;
	bool tcp_ref;
	unsigned handles; /* uv handles not yet closed */

	struct efs_tls *tls;
	nghttp2_session *h2;
	struct efs_list rpcs; /* rpcs with a stream on this connection */
	unsigned nrpcs;

	uint8_t *rbuf;   /* read buffer handed to libuv */
	uint8_t *wbuf;   /* bytes in the uv_write in flight, or being gathered */
	size_t wlen, wcap;
	uint8_t *pbuf;   /* TLS: plaintext gathered before one SSL_write */
	size_t pcap;
	bool dirty;
	struct efs_list dirty_link; /* in the client's list of connections to flush */

	uint64_t connect_deadline_ns; /* mono time the connect timeout ends */
	bool ping_outstanding;
	uint64_t ping_sent_ns;
	uint64_t last_ping_ns;
	bool goaway;
	int32_t goaway_last_id;
	bool settings_seen;

	char *token;       /* auth token for this member, or NULL */
	bool auth_in_flight;
	char err[256];     /* why it died, for logs and call results */
	char h2err[128];   /* nghttp2's text of a connection error */
};

/*
 * Creates a connection of channel |ch| to endpoint |ep| and starts resolving
 * and connecting; efs_client_conn_up() or efs_client_conn_down() follows.
 * A connection is destroyed only through efs_conn_fail() or efs_conn_close().
 */
int efs_conn_new(struct efs_conn **ret, struct efs_etcd *c, int ch, size_t ep, bool mem_peer);

/*
 * Declares |conn| dead with |err| and |fmt|: efs_client_conn_down() runs at
 * once (it takes the rpcs off the connection), handles are closed and the
 * memory is freed later. Safe inside nghttp2 callbacks. Idempotent.
 */
void efs_conn_fail(struct efs_conn *conn, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Stops opening streams on |conn|; it closes itself once its last stream
 * ends (or at once when none is open). */
void efs_conn_drain(struct efs_conn *conn);

/*
 * Opens a stream for |rpc| with the header list |nva| (which, with NO_COPY
 * flags, must stay valid until the stream ends) and a body read through
 * efs_rpc_read_body(). Errors: -EAGAIN (stream ids exhausted or GOAWAY:
 * use another connection), -ENOMEM, -EPROTO.
 */
int efs_conn_submit(struct efs_conn *conn, struct efs_rpc *rpc, const nghttp2_nv *nva,
		    size_t nvlen);

/* Resets |rpc|'s stream with |h2_error| and marks it reset; it stays on
 * |conn| until nghttp2 reports the close (efs_rpc_on_close), because the
 * stream's body source still points at it. */
void efs_conn_reset(struct efs_conn *conn, struct efs_rpc *rpc, uint32_t h2_error);

/* More body is queued for |rpc| (a bidi stream). */
void efs_conn_resume(struct efs_conn *conn, struct efs_rpc *rpc);

/* Marks |conn| as having output; the client flushes it this loop turn. */
void efs_conn_mark_dirty(struct efs_conn *conn);

/* Gathers the session's output into one write. */
void efs_conn_flush(struct efs_conn *conn);

/* Takes the loop-alive reference of the socket (|on|) or drops it. */
void efs_conn_set_ref(struct efs_conn *conn, bool on);

/* Test hook: processes |len| bytes as if read from the socket. */
void efs_conn_feed(struct efs_conn *conn, const uint8_t *data, size_t len);
