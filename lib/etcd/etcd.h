/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The etcd v3 client: gRPC over raw HTTP/2 (nghttp2) on one libuv loop.
 *
 * Everything here runs on the loop thread that owns the client. Requests and
 * responses are the protobuf-c messages generated from proto/rpc.proto, so
 * every field of every RPC is available to callers; typed wrappers for the
 * calls live in kv.h, lease.h and watch.h.
 *
 * Error convention: 0 or -errno. A function that takes a callback
 * either returns an error now (and the callback never runs) or returns 0 and
 * the callback runs exactly once, later, never inline.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "rpc.pb-c.h"

struct efs_etcd;
struct efs_etcd_call;
struct efs_etcd_stream;

/*
 * A client keeps one HTTP/2 connection per channel. The bulk channel carries
 * ordinary calls; the priority channel carries lease keepalives and the lock
 * and recall watches, so they never queue behind multi-MiB replies on a
 * shared flow-control window. Where there are several endpoints the two
 * channels prefer different ones (channel i starts at endpoint i mod n).
 */
enum efs_etcd_channel {
	EFS_ETCD_CH_BULK = 0,
	EFS_ETCD_CH_PRIO = 1,
	EFS_ETCD_NCHANNELS,
};

/* Unary methods. The table in client.c maps each to its :path, request and
 * response descriptors, and whether a retry after sending is safe. */
enum efs_etcd_method {
	EFS_ETCD_RANGE = 0,
	EFS_ETCD_PUT,
	EFS_ETCD_DELETE_RANGE,
	EFS_ETCD_TXN,
	EFS_ETCD_COMPACT,
	EFS_ETCD_LEASE_GRANT,
	EFS_ETCD_LEASE_REVOKE,
	EFS_ETCD_LEASE_TIME_TO_LIVE,
	EFS_ETCD_LEASE_LEASES,
	EFS_ETCD_STATUS,
	EFS_ETCD_MEMBER_LIST,
	EFS_ETCD_AUTHENTICATE,
	EFS_ETCD_NMETHODS,
};

/* Bidirectional streaming methods. */
enum efs_etcd_stream_kind {
	EFS_ETCD_STREAM_WATCH = 0,      /* WatchRequest -> WatchResponse */
	EFS_ETCD_STREAM_LEASE_KEEPALIVE, /* LeaseKeepAliveRequest -> ...Response */
};

struct efs_etcd_opts {
	/* Comma-separated URLs, "http://host:port" (h2c prior knowledge) or
	 * "https://host:port" (TLS 1.2+, ALPN h2). Required. IPv6 hosts in
	 * brackets. */
	const char *endpoints;
	/* TLS: CA file to verify the server against (NULL: system default),
	 * client certificate and key (both or neither), and the name to send
	 * as SNI and verify (NULL: the URL's host). */
	const char *cacert;
	const char *cert;
	const char *key;
	const char *server_name;
	/* Auth: when |user| is set the client authenticates before its first
	 * call, sends the token on every call and re-authenticates when etcd
	 * says the token is invalid or the auth revision is old. */
	const char *user;
	const char *password;
	/* Per-call deadline unless a call says otherwise (0: 5000 ms). It is
	 * both sent as grpc-timeout and kept as a local timer. */
	uint32_t call_timeout_ms;
	/* TCP connect plus TLS handshake plus HTTP/2 SETTINGS (0: 2000 ms). */
	uint32_t connect_timeout_ms;
	/* HTTP/2 PING while a stream is open on a connection (0: 10000 ms;
	 * never below 5000, etcd's keepalive minimum) and how long to wait for
	 * its ACK before the connection is declared dead (0: 4000 ms). */
	uint32_t ping_interval_ms;
	uint32_t ping_timeout_ms;
	/* Reconnect backoff: base, doubling, capped, with +-20 % jitter
	 * (0: 25 ms and 2000 ms). */
	uint32_t backoff_base_ms;
	uint32_t backoff_max_ms;
	/* Largest response message accepted (0: 256 MiB). A larger one fails
	 * that call with -EMSGSIZE and resets its stream. */
	size_t max_recv_msg;
};

/*
 * The outcome of a call, handed to its callback.
 *
 * |err| is 0 or a negative errno from the one status table in grpc.c
 * (efs_grpc_status_to_errno). |grpc_status| is the gRPC status code, or -1
 * when the call failed below gRPC (connection, TLS, deadline before any
 * reply). |message| is grpc-message, percent-decoded, or a description of the
 * transport failure; never NULL, valid during the callback only.
 * |outcome_unknown| is true when a mutation (Put, DeleteRange, Txn, Compact,
 * LeaseGrant without an id) was sent and no reply says whether it applied: a
 * timeout or a lost connection. |resp| is the decoded response when err == 0
 * and NULL otherwise. It is freed after the callback returns unless the
 * callback takes ownership by setting r->resp to NULL (free it later with
 * protobuf_c_message_free_unpacked(msg, efs_mem_protobuf())).
 */
struct efs_etcd_result {
	int err;
	int grpc_status;
	const char *message;
	bool outcome_unknown;
	ProtobufCMessage *resp;
};

typedef void (*efs_etcd_call_cb)(struct efs_etcd_result *r, void *arg);

/* Options of one call; NULL means all defaults. */
struct efs_etcd_callopts {
	uint32_t timeout_ms;           /* 0: the client's call_timeout_ms */
	enum efs_etcd_channel channel; /* default EFS_ETCD_CH_BULK */
	/* Do not retry after UNAVAILABLE or a lost connection even when the
	 * method is idempotent (health probes that must see each failure). */
	bool no_retry;
};

/*
 * Creates a client on |loop|. Connections are made lazily on the first call
 * or stream of each channel. Errors: -EINVAL (no or malformed endpoint, cert
 * without key), -ENOENT/-EACCES/-EPROTO (TLS files unreadable or invalid),
 * -ENOMEM.
 */
int efs_etcd_new(struct efs_etcd **ret, uv_loop_t *loop, const struct efs_etcd_opts *opts);

/*
 * Starts closing |c|: every pending call completes with -ECANCELED, every
 * open stream's close callback runs with -ECANCELED, connections are shut
 * down, and |done| runs once all handles are closed; after that |c| is gone.
 * Accepts NULL (then |done| is not called); a second call while closing is
 * ignored.
 *
 * It may be called from any callback of |c| (a call's callback, a stream's
 * message or close callback), like uv_close() from a libuv callback: the
 * handle of the running callback stays valid until it returns, calls whose
 * result was already decided keep it, the others complete as above, and no
 * callback runs inside efs_etcd_free() itself. Until |done| runs, |c| stays
 * valid: efs_etcd_call() and efs_etcd_stream_open() return -ESHUTDOWN, and
 * call and stream handles stay valid until their callbacks have run.
 */
void efs_etcd_free(struct efs_etcd *c, void (*done)(void *arg), void *arg);

uv_loop_t *efs_etcd_loop(const struct efs_etcd *c);

/*
 * Starts a unary call. |req| must be the request message type of |method|; it
 * is serialised before this returns, so it may live on the caller's stack.
 * Retries: a call that never reached the server (connect failure,
 * REFUSED_STREAM, above a GOAWAY's last stream id) is retried on another
 * endpoint until its deadline; idempotent methods are also retried after
 * UNAVAILABLE or a lost connection; mutations already sent are not, and report
 * outcome_unknown. Token errors cause one re-authentication and one retry.
 *
 * |ret_call| may be NULL; when not, it receives a handle valid until the
 * callback has run. Errors: -EINVAL (wrong message type), -ENOMEM,
 * -ESHUTDOWN (client closing).
 */
int efs_etcd_call(struct efs_etcd *c, enum efs_etcd_method method, const ProtobufCMessage *req,
		  const struct efs_etcd_callopts *co, efs_etcd_call_cb cb, void *arg,
		  struct efs_etcd_call **ret_call);

/* Cancels a call that has not completed: sends RST_STREAM(CANCEL) if it is on
 * the wire, and its callback runs later with -ECANCELED. */
void efs_etcd_call_cancel(struct efs_etcd_call *call);

/*
 * Bidirectional streams (watch, lease keepalive). A stream is opened on one
 * channel's connection (connecting it if needed) and lives until the server
 * ends it, the connection dies, or the caller closes it. Reopening after a
 * failure, and resuming what ran on it, is the caller's job (watch.c,
 * lease.c); the client only moves the channel to the next healthy endpoint.
 *
 * |msg_cb| gets each decoded response message (borrowed for the callback).
 * |close_cb| runs exactly once when the stream ends by itself, with the
 * status (err 0 for grpc-status OK); the stream handle is freed after it
 * returns. Auth tokens are attached like on unary calls.
 */
typedef void (*efs_etcd_stream_msg_cb)(struct efs_etcd_stream *s, const ProtobufCMessage *msg,
				       void *arg);
typedef void (*efs_etcd_stream_close_cb)(struct efs_etcd_stream *s,
					 const struct efs_etcd_result *r, void *arg);

int efs_etcd_stream_open(struct efs_etcd *c, enum efs_etcd_stream_kind kind,
			 enum efs_etcd_channel channel, efs_etcd_stream_msg_cb msg_cb,
			 efs_etcd_stream_close_cb close_cb, void *arg,
			 struct efs_etcd_stream **ret);

/* Queues |msg| (the request type of the stream's kind) for sending; messages
 * go out in order. Errors: -EINVAL, -ENOMEM, -EPIPE (stream ending). */
int efs_etcd_stream_send(struct efs_etcd_stream *s, const ProtobufCMessage *msg);

/* Ends the stream from our side with RST_STREAM(CANCEL) and frees it at
 * once; its close callback does not run. */
void efs_etcd_stream_close(struct efs_etcd_stream *s);

/* Mono time (ns) at which the last message of this stream was handed to the
 * socket, or 0 if none was; lets lease.c time fencing from send times. */
uint64_t efs_etcd_stream_last_send_ns(const struct efs_etcd_stream *s);

/* The URL channel |channel| currently uses (or will use next), for logs and
 * for tests that need to know which member a client talks to. */
const char *efs_etcd_channel_endpoint(const struct efs_etcd *c, enum efs_etcd_channel channel);

/* Drops the channel's connection (failing what is on it as a lost
 * connection) and moves it to the next endpoint. Used when a member stops
 * answering in time even though TCP is up (a SIGSTOPped member). */
void efs_etcd_channel_failover(struct efs_etcd *c, enum efs_etcd_channel channel);

/* Per-client counters, for metrics and tests. */
struct efs_etcd_stats {
	uint64_t calls_started;
	uint64_t calls_failed;
	uint64_t calls_retried;
	uint64_t reconnects;
	uint64_t reauths;
	uint64_t goaways;
	uint64_t pings_sent;
	uint64_t bytes_sent;
	uint64_t bytes_received;
};
void efs_etcd_get_stats(const struct efs_etcd *c, struct efs_etcd_stats *ret);

/*
 * Observes every unary call as its result is decided: |m|, the time from
 * the call to its result in ns (retries included), and its error (0 or
 * -errno). Runs on the loop thread, before the call's callback; must not
 * call into the client. The client's own Authenticate calls are not
 * observed. NULL |fn| turns it off.
 */
typedef void (*efs_etcd_call_observer)(void *arg, enum efs_etcd_method m, uint64_t ns, int err);
void efs_etcd_set_call_observer(struct efs_etcd *c, efs_etcd_call_observer fn, void *arg);

/*
 * Fault hooks for tests, compiled in (EFS_FAULT_HOOKS) and off by default.
 *
 * efs_etcd_fault_drop_reply: the |nth| call (1-based, counted from this
 * call) of |method| is sent and processed by etcd as usual, but its reply is
 * thrown away and the call fails as if the connection had dropped after
 * sending (-ETIMEDOUT for the unary call, outcome_unknown for mutations).
 *
 * efs_etcd_fault_stall_loop: at the next loop iteration the loop thread
 * sleeps |ms| milliseconds, as a stuck handler would.
 *
 * efs_etcd_fault_watch_delay: every watch stream opened from now on holds
 * each event batch |ms| milliseconds before delivering it (in order), as
 * a slow link to etcd would; efs_etcd_watch_delay_ms says what is set (0
 * in builds without fault hooks).
 */
void efs_etcd_fault_drop_reply(struct efs_etcd *c, enum efs_etcd_method method, unsigned nth);
void efs_etcd_fault_stall_loop(struct efs_etcd *c, uint32_t ms);
void efs_etcd_fault_watch_delay(struct efs_etcd *c, uint32_t ms);
uint32_t efs_etcd_watch_delay_ms(const struct efs_etcd *c);

/* Name of a method ("Range", "Txn", ...), for logs and metrics. */
const char *efs_etcd_method_name(enum efs_etcd_method method);
