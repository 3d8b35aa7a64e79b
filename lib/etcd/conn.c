/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/conn.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <nghttp2/nghttp2.h>
#include <uv.h>

#include "etcd/client-int.h"
#include "etcd/tls.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

/* Reads are handed to nghttp2 straight from this buffer. */
#define RBUF_SIZE (256 * 1024)
/* One write gathers at most this much before it goes out; the rest follows
 * when it completes, so a multi-MiB request cannot balloon the buffer. */
#define WBUF_MAX (1024 * 1024)
/* Flow control: per-stream and connection receive windows. Big replies
 * (ranges of tens of MiB) then stream at link speed instead of RTT speed. */
#define STREAM_WINDOW (4 * 1024 * 1024)
#define CONN_WINDOW   (64 * 1024 * 1024)
/* Recycle a connection well before client stream ids (odd, < 2^31) run out. */
#define STREAM_ID_RECYCLE ((int32_t)0x7fff0000)

static void conn_on_handle_closed(uv_handle_t *h);
static int h2_start(struct efs_conn *conn);
static void read_input(struct efs_conn *conn, const uint8_t *data, size_t len);

static struct efs_tls_ctx *tls_ctx_of(struct efs_conn *conn);

static void on_tcp_closed(uv_handle_t *h);

static void conn_close_handles(struct efs_conn *conn)
{
	if (!uv_is_closing((uv_handle_t *)&conn->timer))
		uv_close((uv_handle_t *)&conn->timer, conn_on_handle_closed);
	if (conn->tcp && !uv_is_closing((uv_handle_t *)conn->tcp))
		uv_close((uv_handle_t *)conn->tcp, on_tcp_closed);
}

/* Frees |conn| once nothing (handle, getaddrinfo request, write) refers to it. */
static void conn_maybe_free(struct efs_conn *conn)
{
	if (conn->handles || conn->gai_pending)
		return;
	efs_client_conn_gone(conn);
	if (conn->ai)
		uv_freeaddrinfo(conn->ai);
	if (conn->h2)
		nghttp2_session_del(conn->h2);
	efs_tls_free(conn->tls);
	efs_mem_free(conn->rbuf);
	efs_mem_free(conn->wbuf);
	efs_mem_free(conn->pbuf);
	efs_mem_free(conn->token);
	efs_mem_free(conn);
}

static void conn_on_handle_closed(uv_handle_t *h)
{
	struct efs_conn *conn = h->data;

	conn->handles--;
	conn_maybe_free(conn);
}

/* TCP handles are allocated per connect attempt: a failed attempt's handle
 * may only be reused after its close callback, and the next address is
 * tried at once. */
static void on_tcp_closed(uv_handle_t *h)
{
	struct efs_conn *conn = h->data;

	efs_mem_free(h);
	conn->handles--;
	conn_maybe_free(conn);
}

static void drop_tcp(struct efs_conn *conn)
{
	uv_close((uv_handle_t *)conn->tcp, on_tcp_closed);
	conn->tcp = NULL;
}

void efs_conn_fail(struct efs_conn *conn, int err, const char *fmt, ...)
{
	va_list ap;

	if (conn->state == EFS_CONN_DEAD)
		return;
	conn->state = EFS_CONN_DEAD;
	va_start(ap, fmt);
	vsnprintf(conn->err, sizeof(conn->err), fmt, ap);
	va_end(ap);
	efs_log_debug("etcd: connection to %s: %s", efs_client_endpoint(conn->c, conn->ep)->url,
		      conn->err);
	if (conn->dirty) {
		conn->dirty = false;
		efs_list_del(&conn->dirty_link);
	}
	efs_client_conn_down(conn, err);
	conn_close_handles(conn);
}

void efs_conn_drain(struct efs_conn *conn)
{
	if (conn->state == EFS_CONN_DEAD)
		return;
	/* No GOAWAY of our own: it would stop nghttp2 from reading the
	 * replies of the streams still open. */
	conn->state = EFS_CONN_DRAINING;
	if (!conn->nrpcs)
		efs_conn_fail(conn, -ECONNRESET, "connection drained");
}

void efs_conn_set_ref(struct efs_conn *conn, bool on)
{
	if (conn->tcp_ref == on)
		return;
	conn->tcp_ref = on;
	if (!conn->tcp || uv_is_closing((uv_handle_t *)conn->tcp))
		return;
	if (on)
		uv_ref((uv_handle_t *)conn->tcp);
	else
		uv_unref((uv_handle_t *)conn->tcp);
}

/* ---- Timers: connect timeout and keepalive ---- */

static void arm_ping_timer(struct efs_conn *conn, uint64_t ms);

static void on_timer(uv_timer_t *t)
{
	struct efs_conn *conn = t->data;
	uint64_t now, interval;

	if (conn->state == EFS_CONN_DEAD)
		return;
	/* libuv timers count from the loop's cached time, which is stale when
	 * the loop has not run for a while: decide on the real clock. */
	now = efs_clock_mono_ns();
	if (conn->state < EFS_CONN_AUTH) {
		if (now < conn->connect_deadline_ns) {
			arm_ping_timer(conn,
				       (conn->connect_deadline_ns - now) / EFS_NSEC_PER_MSEC + 1);
			return;
		}
		efs_conn_fail(conn, -ETIMEDOUT, "connect timed out after %u ms",
			      efs_client_connect_timeout_ms(conn->c));
		return;
	}
	if (conn->ping_outstanding) {
		uint64_t limit = efs_client_ping_timeout_ms(conn->c) * EFS_NSEC_PER_MSEC;

		if (now - conn->ping_sent_ns < limit) {
			arm_ping_timer(conn,
				       (limit - (now - conn->ping_sent_ns)) / EFS_NSEC_PER_MSEC + 1);
			return;
		}
		efs_conn_fail(conn, -ETIMEDOUT, "no PING ACK within %u ms",
			      efs_client_ping_timeout_ms(conn->c));
		return;
	}
	/* PING only while a stream is open: etcd counts PINGs on an idle
	 * connection as abuse (too_many_pings). */
	interval = efs_client_ping_interval_ms(conn->c);
	if (!conn->nrpcs) {
		arm_ping_timer(conn, interval);
		return;
	}
	if (now - conn->last_ping_ns < interval * EFS_NSEC_PER_MSEC) {
		arm_ping_timer(conn, interval - (now - conn->last_ping_ns) / EFS_NSEC_PER_MSEC);
		return;
	}
	if (nghttp2_submit_ping(conn->h2, NGHTTP2_FLAG_NONE, NULL) != 0) {
		efs_conn_fail(conn, -ENOMEM, "cannot queue a PING");
		return;
	}
	conn->ping_outstanding = true;
	conn->ping_sent_ns = now;
	conn->last_ping_ns = now;
	efs_client_stats(conn->c)->pings_sent++;
	efs_conn_mark_dirty(conn);
	arm_ping_timer(conn, efs_client_ping_timeout_ms(conn->c));
}

static void arm_ping_timer(struct efs_conn *conn, uint64_t ms)
{
	uv_timer_start(&conn->timer, on_timer, ms ? ms : 1, 0);
}

static bool session_over(struct efs_conn *conn);

/* ---- Output ---- */

void efs_conn_mark_dirty(struct efs_conn *conn)
{
	if (conn->dirty || conn->state == EFS_CONN_DEAD)
		return;
	conn->dirty = true;
	efs_client_mark_dirty(conn->c, conn);
}

static int buf_reserve(uint8_t **buf, size_t *cap, size_t need)
{
	size_t ncap;
	uint8_t *n;

	if (need <= *cap)
		return 0;
	ncap = *cap ? *cap : 16384;
	while (ncap < need)
		ncap *= 2;
	n = efs_mem_realloc(*buf, ncap);
	if (!n)
		return -ENOMEM;
	*buf = n;
	*cap = ncap;
	return 0;
}

static void on_write(uv_write_t *req, int status)
{
	struct efs_conn *conn = req->data;

	conn->writing = false;
	conn->wlen = 0;
	conn->handles--; /* the write held the connection */
	if (conn->state == EFS_CONN_DEAD) {
		conn_maybe_free(conn);
		return;
	}
	if (status < 0) {
		efs_conn_fail(conn, status, "write failed: %s", uv_strerror(status));
		return;
	}
	if ((conn->h2 && nghttp2_session_want_write(conn->h2)) ||
	    (conn->tls && efs_tls_out_pending(conn->tls)))
		efs_conn_mark_dirty(conn);
}

/* Moves TLS ciphertext into wbuf. */
static int take_tls_output(struct efs_conn *conn)
{
	size_t n;

	while ((n = efs_tls_out_pending(conn->tls)) > 0) {
		if (buf_reserve(&conn->wbuf, &conn->wcap, conn->wlen + n) < 0)
			return -ENOMEM;
		conn->wlen += efs_tls_out_take(conn->tls, conn->wbuf + conn->wlen, n);
	}
	return 0;
}

void efs_conn_flush(struct efs_conn *conn)
{
	uint8_t **dst;
	size_t *dcap, len = 0;
	uv_buf_t b;
	int r;

	if (conn->dirty) {
		conn->dirty = false;
		efs_list_del(&conn->dirty_link);
	}
	if (conn->state == EFS_CONN_DEAD || conn->writing)
		return;
	if (conn->tls) {
		dst = &conn->pbuf;
		dcap = &conn->pcap;
	} else {
		dst = &conn->wbuf;
		dcap = &conn->wcap;
	}
	while (conn->h2 && len < WBUF_MAX) {
		const uint8_t *data;
		ssize_t n = nghttp2_session_mem_send(conn->h2, &data);

		if (n < 0) {
			efs_conn_fail(conn, -EPROTO, "HTTP/2 send: %s", nghttp2_strerror((int)n));
			return;
		}
		if (n == 0)
			break;
		if (buf_reserve(dst, dcap, len + (size_t)n) < 0) {
			efs_conn_fail(conn, -ENOMEM, "out of memory");
			return;
		}
		memcpy(*dst + len, data, (size_t)n);
		len += (size_t)n;
		if (conn->state == EFS_CONN_DEAD)
			return;
	}
	if (conn->tls) {
		if (len && (r = efs_tls_write(conn->tls, conn->pbuf, len)) < 0) {
			efs_conn_fail(conn, r, "%s", efs_tls_last_error(conn->tls));
			return;
		}
		if (take_tls_output(conn) < 0) {
			efs_conn_fail(conn, -ENOMEM, "out of memory");
			return;
		}
	} else {
		conn->wlen = len;
	}
	if (!conn->wlen) {
		if (session_over(conn))
			efs_conn_fail(conn, -ECONNRESET, "HTTP/2 session ended%s%s",
				      conn->h2err[0] ? ": " : "", conn->h2err);
		return;
	}
	efs_client_stats(conn->c)->bytes_sent += conn->wlen;
	if (conn->mem_peer) {
		efs_client_mem_peer_write(conn->c, conn->wbuf, conn->wlen);
		conn->wlen = 0;
		if (session_over(conn))
			efs_conn_fail(conn, -ECONNRESET, "HTTP/2 connection error%s%s",
				      conn->h2err[0] ? ": " : "", conn->h2err);
		else if (conn->h2 && nghttp2_session_want_write(conn->h2))
			efs_conn_mark_dirty(conn);
		return;
	}
	b = uv_buf_init((char *)conn->wbuf, (unsigned)conn->wlen);
	conn->wreq.data = conn;
	r = uv_write(&conn->wreq, (uv_stream_t *)conn->tcp, &b, 1, on_write);
	if (r < 0) {
		conn->wlen = 0;
		efs_conn_fail(conn, r, "write failed: %s", uv_strerror(r));
		return;
	}
	conn->writing = true;
	conn->handles++;
	/* A connection error's GOAWAY is the last thing nghttp2 sends. */
	if (session_over(conn))
		efs_conn_fail(conn, -ECONNRESET, "HTTP/2 connection error%s%s",
			      conn->h2err[0] ? ": " : "", conn->h2err);
}

/* ---- Input ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct efs_conn *conn = h->data;

	*buf = uv_buf_init((char *)conn->rbuf, RBUF_SIZE);
}

static void feed_h2(struct efs_conn *conn, const uint8_t *data, size_t len)
{
	ssize_t n;

	if (!conn->h2 || conn->state == EFS_CONN_DEAD)
		return;
	n = nghttp2_session_mem_recv(conn->h2, data, len);
	if (conn->state == EFS_CONN_DEAD)
		return;
	if (n < 0) {
		/* nghttp2 has queued a GOAWAY for the protocol error; a
		 * courtesy flush sends it before we close. Nothing new may
		 * be opened here meanwhile. */
		conn->goaway = true;
		efs_conn_flush(conn);
		efs_conn_fail(conn, -EPROTO, "HTTP/2 protocol error from server: %s",
			      nghttp2_strerror((int)n));
		return;
	}
	if (nghttp2_session_want_write(conn->h2))
		efs_conn_mark_dirty(conn);
	else if (session_over(conn))
		efs_conn_fail(conn, -ECONNRESET, "HTTP/2 session ended%s%s",
			      conn->h2err[0] ? ": " : "", conn->h2err);
}

static void tls_progress(struct efs_conn *conn)
{
	int r;

	if (conn->state == EFS_CONN_TLS) {
		r = efs_tls_handshake(conn->tls);
		if (r < 0) {
			efs_conn_fail(conn, r, "%s", efs_tls_last_error(conn->tls));
			return;
		}
		if (r == 0) {
			efs_conn_mark_dirty(conn);
			return;
		}
		r = h2_start(conn);
		if (r < 0) {
			efs_conn_fail(conn, r, "cannot start HTTP/2: %s", strerror(-r));
			return;
		}
	}
	for (;;) {
		ssize_t n = efs_tls_read(conn->tls, conn->rbuf, RBUF_SIZE);

		if (n == 0)
			break;
		if (n < 0) {
			efs_conn_fail(conn, (int)n, "%s", efs_tls_last_error(conn->tls));
			return;
		}
		feed_h2(conn, conn->rbuf, (size_t)n);
		if (conn->state == EFS_CONN_DEAD)
			return;
	}
	if (efs_tls_out_pending(conn->tls))
		efs_conn_mark_dirty(conn);
}

static void read_input(struct efs_conn *conn, const uint8_t *data, size_t len)
{
	efs_client_stats(conn->c)->bytes_received += len;
	if (!conn->tls) {
		feed_h2(conn, data, len);
		return;
	}
	if (efs_tls_feed(conn->tls, data, len) < 0) {
		efs_conn_fail(conn, -ENOMEM, "%s", efs_tls_last_error(conn->tls));
		return;
	}
	tls_progress(conn);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct efs_conn *conn = s->data;

	if (conn->state == EFS_CONN_DEAD)
		return;
	if (nread < 0) {
		if (nread == UV_EOF)
			efs_conn_fail(conn, -ECONNRESET, "connection closed by the server");
		else
			efs_conn_fail(conn, (int)nread, "read failed: %s",
				      uv_strerror((int)nread));
		return;
	}
	if (nread == 0)
		return;
	if (conn->tls) {
		/* TLS decrypts into rbuf, so take the ciphertext out first. */
		if (efs_tls_feed(conn->tls, (const uint8_t *)buf->base, (size_t)nread) < 0) {
			efs_conn_fail(conn, -ENOMEM, "%s", efs_tls_last_error(conn->tls));
			return;
		}
		efs_client_stats(conn->c)->bytes_received += (size_t)nread;
		tls_progress(conn);
		return;
	}
	read_input(conn, (const uint8_t *)buf->base, (size_t)nread);
}

void efs_conn_feed(struct efs_conn *conn, const uint8_t *data, size_t len)
{
	if (conn->state == EFS_CONN_DEAD)
		return;
	read_input(conn, data, len);
}

/* ---- nghttp2 callbacks ---- */

/*
 * The rpc of stream |id|, or NULL. Once |conn| is dead its rpcs have been
 * taken off by efs_client_conn_down() (requeued on another connection,
 * finished or freed), but nghttp2 still holds them as stream user data and
 * goes on calling back for the rest of the bytes of the mem_recv()/
 * mem_send() in progress (a connection can die inside a callback, e.g. when
 * a re-authentication fails): none of them may be touched any more.
 */
static struct efs_rpc *rpc_of(struct efs_conn *conn, nghttp2_session *s, int32_t id)
{
	if (conn->state == EFS_CONN_DEAD)
		return NULL;
	return id > 0 ? nghttp2_session_get_stream_user_data(s, id) : NULL;
}

static void detach(struct efs_conn *conn, struct efs_rpc *rpc)
{
	nghttp2_session_set_stream_user_data(conn->h2, rpc->stream_id, NULL);
	efs_list_del(&rpc->link);
	rpc->conn = NULL;
	conn->nrpcs--;
}

static int on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
		     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
		     void *ud)
{
	struct efs_conn *conn = ud;
	struct efs_rpc *rpc;

	if (f->hd.type != NGHTTP2_HEADERS)
		return 0;
	rpc = rpc_of(conn, s, f->hd.stream_id);
	if (!rpc || rpc->local_err || rpc->reset)
		return 0;
	if (efs_rpc_on_header(rpc, name, namelen, value, valuelen) < 0)
		nghttp2_submit_rst_stream(conn->h2, NGHTTP2_FLAG_NONE, f->hd.stream_id,
					  NGHTTP2_PROTOCOL_ERROR);
	return 0;
}

static int on_data_chunk(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *data,
			 size_t len, void *ud)
{
	struct efs_conn *conn = ud;
	struct efs_rpc *rpc = rpc_of(conn, s, id);
	int r;

	if (!rpc || rpc->local_err || rpc->reset)
		return 0;
	r = efs_rpc_on_data(rpc, data, len);
	if (conn->state == EFS_CONN_DEAD || rpc->reset)
		return 0;
	if (r < 0)
		nghttp2_submit_rst_stream(conn->h2, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
	return 0;
}

static int on_frame_recv(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct efs_conn *conn = ud;

	switch (f->hd.type) {
	case NGHTTP2_SETTINGS:
		if ((f->hd.flags & NGHTTP2_FLAG_ACK) || conn->settings_seen)
			break;
		conn->settings_seen = true;
		if (conn->state == EFS_CONN_H2) {
			conn->last_ping_ns = efs_clock_mono_ns();
			arm_ping_timer(conn, efs_client_ping_interval_ms(conn->c));
			efs_client_conn_up(conn);
		}
		break;
	case NGHTTP2_PING:
		if (f->hd.flags & NGHTTP2_FLAG_ACK) {
			conn->ping_outstanding = false;
			if (conn->state != EFS_CONN_DEAD)
				arm_ping_timer(conn, efs_client_ping_interval_ms(conn->c));
		}
		break;
	case NGHTTP2_GOAWAY:
		conn->goaway = true;
		conn->goaway_last_id = f->goaway.last_stream_id;
		efs_client_stats(conn->c)->goaways++;
		efs_client_conn_goaway(conn, f->goaway.error_code, f->goaway.opaque_data,
				       f->goaway.opaque_data_len);
		break;
	case NGHTTP2_HEADERS:
	case NGHTTP2_DATA:
		/* The server ended its side while ours is still open (an
		 * early status, or the end of a watch): stop sending. */
		if ((f->hd.flags & NGHTTP2_FLAG_END_STREAM) && conn->state != EFS_CONN_DEAD &&
		    !nghttp2_session_get_stream_local_close(s, f->hd.stream_id))
			nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, f->hd.stream_id,
						  NGHTTP2_NO_ERROR);
		break;
	default:
		break;
	}
	return 0;
}

static int on_frame_send(nghttp2_session *s, const nghttp2_frame *f, void *ud)
{
	struct efs_rpc *rpc;

	if (f->hd.type != NGHTTP2_HEADERS)
		return 0;
	rpc = rpc_of(ud, s, f->hd.stream_id);
	if (rpc)
		efs_rpc_on_sent(rpc);
	return 0;
}

/* A request HEADERS that could not go out (GOAWAY arrived first): the stream
 * was never opened, so nghttp2 reports no close; do it here. */
static int on_frame_not_send(nghttp2_session *s, const nghttp2_frame *f, int lib_error, void *ud)
{
	struct efs_conn *conn = ud;
	struct efs_list *l;

	if (f->hd.type != NGHTTP2_HEADERS)
		return 0;
	efs_list_for_each(l, &conn->rpcs) {
		struct efs_rpc *rpc = efs_list_entry(l, struct efs_rpc, link);

		if (rpc->stream_id == f->hd.stream_id) {
			/* Whatever stopped it stops the next one too: open
			 * nothing more here, or the retry would come back. */
			conn->goaway = true;
			detach(conn, rpc);
			efs_rpc_on_close(rpc, conn, NGHTTP2_REFUSED_STREAM);
			break;
		}
	}
	return 0;
}

static int on_stream_close(nghttp2_session *s, int32_t id, uint32_t error_code, void *ud)
{
	struct efs_conn *conn = ud;
	struct efs_rpc *rpc = rpc_of(conn, s, id);

	if (!rpc)
		return 0;
	detach(conn, rpc);
	efs_rpc_on_close(rpc, conn, error_code);
	if (conn->state == EFS_CONN_DRAINING && !conn->nrpcs)
		efs_conn_drain(conn);
	return 0;
}

static ssize_t read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
			       uint32_t *flags, nghttp2_data_source *src, void *ud)
{
	struct efs_conn *conn = ud;
	struct efs_rpc *rpc = src->ptr;

	/* On a dead connection |rpc| may be freed already (see rpc_of). */
	if (conn->state == EFS_CONN_DEAD)
		return NGHTTP2_ERR_DEFERRED;
	if (rpc->reset || rpc->conn != conn)
		return NGHTTP2_ERR_DEFERRED;
	return efs_rpc_read_body(rpc, buf, len, flags);
}

/* nghttp2's description of a connection error it found, kept for the
 * result messages of the calls that fail with it. */
static int on_h2_error(nghttp2_session *s, int lib_error, const char *msg, size_t len, void *ud)
{
	struct efs_conn *conn = ud;

	snprintf(conn->h2err, sizeof(conn->h2err), "%.*s", (int)len, msg);
	return 0;
}

/* True once nghttp2 has nothing left to do: it sent or got a GOAWAY for a
 * connection error and every stream is gone. */
static bool session_over(struct efs_conn *conn)
{
	return conn->h2 && !nghttp2_session_want_read(conn->h2) &&
	       !nghttp2_session_want_write(conn->h2);
}

static nghttp2_session_callbacks *h2_callbacks(void)
{
	static nghttp2_session_callbacks *cbs;

	if (cbs)
		return cbs;
	if (nghttp2_session_callbacks_new(&cbs) != 0)
		return NULL;
	nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk);
	nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv);
	nghttp2_session_callbacks_set_on_frame_send_callback(cbs, on_frame_send);
	nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, on_frame_not_send);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close);
	nghttp2_session_callbacks_set_error_callback2(cbs, on_h2_error);
	return cbs;
}

static int h2_start(struct efs_conn *conn)
{
	static const nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_ENABLE_PUSH, 0 },
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW },
		{ NGHTTP2_SETTINGS_MAX_FRAME_SIZE, 1 << 20 },
	};
	nghttp2_session_callbacks *cbs = h2_callbacks();
	nghttp2_option *opt;
	int r;

	if (!cbs)
		return -ENOMEM;
	if (nghttp2_option_new(&opt) != 0)
		return -ENOMEM;
	/* Our own peer-set limits are generous; the server's SETTINGS rule. */
	nghttp2_option_set_peer_max_concurrent_streams(opt, 1u << 20);
	/*
	 * No HTTP messaging checks: they cost about 5 % of a call's client CPU
	 * (every received header name and value is scanned, content-length
	 * tracked), and gRPC needs only three facts from the headers, which
	 * client.c checks itself: a body is taken only after a ":status 200"
	 * with a gRPC content-type (efs_rpc_on_data), :status and grpc-status
	 * must be plain decimal numbers (efs_grpc_status_header, which fails
	 * the stream otherwise), and a missing grpc-status is synthesised from
	 * :status (efs_grpc_status_finish). Lost with them: rejection of
	 * malformed header names/values, misplaced pseudo-headers and
	 * content-length mismatches, none of which changes what a call
	 * reports. Framing, flow control and HPACK are still checked.
	 */
	nghttp2_option_set_no_http_messaging(opt, 1);
	r = nghttp2_session_client_new3(&conn->h2, cbs, conn, opt, efs_mem_nghttp2());
	nghttp2_option_del(opt);
	if (r != 0)
		return -ENOMEM;
	r = nghttp2_submit_settings(conn->h2, NGHTTP2_FLAG_NONE, iv, sizeof(iv) / sizeof(iv[0]));
	if (r == 0)
		r = nghttp2_session_set_local_window_size(conn->h2, NGHTTP2_FLAG_NONE, 0,
							  CONN_WINDOW);
	if (r != 0)
		return r == NGHTTP2_ERR_NOMEM ? -ENOMEM : -EPROTO;
	conn->state = EFS_CONN_H2;
	efs_conn_mark_dirty(conn);
	return 0;
}

/* ---- Streams ---- */

int efs_conn_submit(struct efs_conn *conn, struct efs_rpc *rpc, const nghttp2_nv *nva,
		    size_t nvlen)
{
	nghttp2_data_provider dp = { .source.ptr = rpc, .read_callback = read_body };
	int32_t id;

	if (conn->state == EFS_CONN_DEAD || conn->state == EFS_CONN_DRAINING || conn->goaway)
		return -EAGAIN;
	if (nghttp2_session_get_next_stream_id(conn->h2) >= (uint32_t)STREAM_ID_RECYCLE ||
	    !nghttp2_session_check_request_allowed(conn->h2))
		return -EAGAIN;
	id = nghttp2_submit_request(conn->h2, NULL, nva, nvlen, &dp, rpc);
	if (id < 0) {
		if (id == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE)
			return -EAGAIN;
		return id == NGHTTP2_ERR_NOMEM ? -ENOMEM : -EPROTO;
	}
	rpc->stream_id = id;
	rpc->conn = conn;
	rpc->sent = false;
	rpc->reset = false;
	efs_list_add_tail(&conn->rpcs, &rpc->link);
	conn->nrpcs++;
	efs_conn_mark_dirty(conn);
	return 0;
}

void efs_conn_reset(struct efs_conn *conn, struct efs_rpc *rpc, uint32_t h2_error)
{
	if (rpc->reset)
		return;
	rpc->reset = true;
	if (conn->state == EFS_CONN_DEAD)
		return;
	nghttp2_submit_rst_stream(conn->h2, NGHTTP2_FLAG_NONE, rpc->stream_id, h2_error);
	efs_conn_mark_dirty(conn);
}

void efs_conn_resume(struct efs_conn *conn, struct efs_rpc *rpc)
{
	if (conn->state == EFS_CONN_DEAD)
		return;
	nghttp2_session_resume_data(conn->h2, rpc->stream_id);
	efs_conn_mark_dirty(conn);
}

/* ---- Connecting ---- */

static void try_connect(struct efs_conn *conn);

static void on_connect(uv_connect_t *req, int status)
{
	struct efs_conn *conn = req->data;
	const struct efs_endpoint *ep;
	int r;

	if (conn->state == EFS_CONN_DEAD)
		return;
	ep = efs_client_endpoint(conn->c, conn->ep);
	if (status < 0) {
		if (conn->ai_next) {
			/* Another address of the name may work (::1 vs
			 * 127.0.0.1); the handle is closed and a new one made. */
			drop_tcp(conn);
			try_connect(conn);
			return;
		}
		efs_conn_fail(conn, status, "connect to %s failed: %s", ep->url,
			      uv_strerror(status));
		return;
	}
	uv_tcp_nodelay(conn->tcp, 1);
	r = uv_read_start((uv_stream_t *)conn->tcp, on_alloc, on_read);
	if (r < 0) {
		efs_conn_fail(conn, r, "cannot read from %s: %s", ep->url, uv_strerror(r));
		return;
	}
	if (ep->tls) {
		conn->state = EFS_CONN_TLS;
		tls_progress(conn);
		return;
	}
	r = h2_start(conn);
	if (r < 0)
		efs_conn_fail(conn, r, "cannot start HTTP/2: %s", strerror(-r));
}

static void try_connect(struct efs_conn *conn)
{
	const struct efs_endpoint *ep = efs_client_endpoint(conn->c, conn->ep);
	struct addrinfo *ai = conn->ai_next;
	int r;

	conn->ai_next = ai->ai_next;
	conn->tcp = efs_mem_malloc(sizeof(*conn->tcp));
	if (!conn->tcp) {
		efs_conn_fail(conn, -ENOMEM, "out of memory");
		return;
	}
	r = uv_tcp_init(efs_client_loop(conn->c), conn->tcp);
	if (r < 0) {
		efs_mem_free(conn->tcp);
		conn->tcp = NULL;
		efs_conn_fail(conn, r, "cannot create a socket: %s", uv_strerror(r));
		return;
	}
	conn->tcp->data = conn;
	conn->handles++;
	if (!conn->tcp_ref)
		uv_unref((uv_handle_t *)conn->tcp);
	conn->state = EFS_CONN_CONNECTING;
	conn->creq.data = conn;
	r = uv_tcp_connect(&conn->creq, conn->tcp, ai->ai_addr, on_connect);
	if (r < 0) {
		if (conn->ai_next) {
			drop_tcp(conn);
			try_connect(conn);
			return;
		}
		efs_conn_fail(conn, r, "connect to %s failed: %s", ep->url, uv_strerror(r));
	}
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
	struct efs_conn *conn = req->data;
	const struct efs_endpoint *ep = efs_client_endpoint(conn->c, conn->ep);

	conn->gai_pending = false;
	conn->ai = res;
	if (conn->state == EFS_CONN_DEAD) {
		conn_maybe_free(conn);
		return;
	}
	if (status < 0 || !res) {
		efs_conn_fail(conn, status < 0 ? status : -EHOSTUNREACH,
			      "cannot resolve %s: %s", ep->host,
			      uv_strerror(status < 0 ? status : UV_EAI_NONAME));
		return;
	}
	conn->ai_next = res;
	try_connect(conn);
}

int efs_conn_new(struct efs_conn **ret, struct efs_etcd *c, int ch, size_t epi, bool mem_peer)
{
	const struct efs_endpoint *ep = efs_client_endpoint(c, epi);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV };
	struct efs_conn *conn;
	int r;

	conn = efs_mem_calloc(1, sizeof(*conn));
	if (!conn)
		return -ENOMEM;
	conn->c = c;
	conn->ch = ch;
	conn->ep = epi;
	conn->mem_peer = mem_peer;
	efs_list_init(&conn->rpcs);
	r = -ENOMEM;
	conn->rbuf = efs_mem_malloc(RBUF_SIZE);
	if (!conn->rbuf)
		goto out_free;
	if (ep->tls && !mem_peer) {
		r = efs_tls_new(&conn->tls, tls_ctx_of(conn), efs_client_server_name(c, epi));
		if (r < 0)
			goto out_free;
	}
	uv_timer_init(efs_client_loop(c), &conn->timer);
	conn->timer.data = conn;
	uv_unref((uv_handle_t *)&conn->timer);
	conn->handles = 1;
	conn->connect_deadline_ns = efs_clock_mono_ns() +
				    efs_client_connect_timeout_ms(c) * EFS_NSEC_PER_MSEC;
	uv_timer_start(&conn->timer, on_timer, efs_client_connect_timeout_ms(c), 0);

	if (mem_peer) {
		r = h2_start(conn);
		if (r < 0) {
			/* The timer is closed by the normal path. */
			conn->state = EFS_CONN_DEAD;
			conn_close_handles(conn);
			return r;
		}
		*ret = conn;
		return 0;
	}
	conn->state = EFS_CONN_RESOLVING;
	conn->gai.data = conn;
	r = uv_getaddrinfo(efs_client_loop(c), &conn->gai, on_resolved, ep->host, ep->port,
			   &hints);
	if (r < 0) {
		conn->state = EFS_CONN_DEAD;
		conn_close_handles(conn);
		return r;
	}
	conn->gai_pending = true;
	*ret = conn;
	return 0;

out_free:
	efs_tls_free(conn->tls);
	efs_mem_free(conn->rbuf);
	efs_mem_free(conn);
	return r;
}

static struct efs_tls_ctx *tls_ctx_of(struct efs_conn *conn)
{
	return efs_client_tls_ctx(conn->c);
}
