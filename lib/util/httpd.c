/* SPDX-License-Identifier: Apache-2.0 */
#include "util/httpd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/list.h"
#include "util/log.h"
#include "util/mem.h"

/*
 * One accepted connection. It is freed once both handles are closed; the
 * request buffer is inline so that a connection costs one allocation.
 */
struct conn {
	uv_tcp_t tcp;
	uv_timer_t timer;
	uv_write_t wr;
	uv_shutdown_t sd;
	struct efs_httpd *h;
	struct efs_list link; /* on h->conns until freed */
	unsigned handles; /* handles not yet closed: 2, then 1, then freed */
	bool closing;
	bool answered; /* the answer is queued: later input is read and dropped */
	char *body;    /* efs_mem buffer owned by the connection, or NULL */
	size_t len;    /* bytes in req */
	char head[256];
	char req[EFS_HTTPD_MAX_REQUEST + 1]; /* the head, and room for a NUL */
};

struct efs_httpd {
	uv_loop_t *loop;
	uv_tcp_t listener;
	/*
	 * Closes connections refused (over the limit, or out of memory); one at
	 * a time, and a refusal arriving while it is busy waits in the listener
	 * (libuv stops reading it until uv_accept) until spare_closed.
	 */
	uv_tcp_t spare;
	bool spare_busy, accept_pending;
	const struct efs_metrics *m;
	efs_httpd_probe_cb healthz, readyz;
	void *probe_arg;
	struct efs_list conns; /* of conn, newest first */
	unsigned nconns;
	unsigned handles; /* listener, spare when busy, and one per connection */
	uint64_t timeout_ms;
	bool stopping;
	void (*done)(void *arg);
	void *done_arg;
	char address[64];
};

static const char index_body[] = "etcfs metrics: /metrics; probes: /healthz, /readyz\n";

static void httpd_handle_gone(struct efs_httpd *h)
{
	void (*done)(void *arg) = h->done;
	void *arg = h->done_arg;

	if (--h->handles || !h->stopping)
		return;
	efs_mem_free(h);
	if (done)
		done(arg);
}

static void conn_closed(uv_handle_t *handle)
{
	struct conn *c = handle->data;
	struct efs_httpd *h = c->h;

	if (--c->handles)
		return;
	efs_list_del(&c->link);
	h->nconns--;
	efs_mem_free(c->body);
	efs_mem_free(c);
	httpd_handle_gone(h);
}

static void conn_close(struct conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	uv_close((uv_handle_t *)&c->tcp, conn_closed);
	uv_close((uv_handle_t *)&c->timer, conn_closed);
}

static void conn_timeout(uv_timer_t *t)
{
	conn_close(t->data);
}

/*
 * After the answer is written, the write side is shut down and the
 * connection is read until the peer closes (or the timer fires): closing a
 * socket with unread input would reset it and could destroy the answer
 * before the client read it.
 */
static void shutdown_done(uv_shutdown_t *req, int status)
{
	struct conn *c = req->data;

	if (status < 0)
		conn_close(c);
}

static void write_done(uv_write_t *req, int status)
{
	struct conn *c = req->data;

	if (c->closing)
		return;
	c->sd.data = c;
	if (status < 0 || uv_shutdown(&c->sd, (uv_stream_t *)&c->tcp, shutdown_done) < 0)
		conn_close(c);
}

/* Queues the answer; |body| is an efs_mem buffer the connection takes, or static text. */
static void conn_answer(struct conn *c, const char *status, const char *extra, const char *ctype,
			const char *body, size_t body_len, bool owned, bool head_only)
{
	uv_buf_t bufs[2];
	int n;

	c->answered = true;
	if (owned)
		c->body = (char *)body;
	n = snprintf(c->head, sizeof(c->head),
		     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s"
		     "Connection: close\r\n\r\n",
		     status, ctype, body_len, extra);
	bufs[0] = uv_buf_init(c->head, (unsigned)n);
	bufs[1] = uv_buf_init((char *)body, (unsigned)body_len);
	c->wr.data = c;
	if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, bufs, head_only || !body_len ? 1 : 2,
		     write_done) < 0)
		conn_close(c);
}

static void conn_answer_text(struct conn *c, const char *status, const char *extra,
			     const char *text)
{
	conn_answer(c, status, extra, "text/plain; charset=utf-8", text, strlen(text), false,
		    false);
}

/* Answers a probe: its status and its line. */
static void conn_probe(struct conn *c, efs_httpd_probe_cb cb, int dflt, const char *dflt_why,
		       bool head_only)
{
	char why[256];
	char *body;
	int status = dflt, n;

	why[0] = '\0';
	if (cb)
		status = cb(c->h->probe_arg, why, sizeof(why));
	else
		snprintf(why, sizeof(why), "%s", dflt_why);
	n = (int)strlen(why);
	body = efs_mem_malloc((size_t)n + 2);
	if (!body) {
		conn_answer_text(c, "500 Internal Server Error", "", "out of memory\n");
		return;
	}
	memcpy(body, why, (size_t)n);
	body[n++] = '\n';
	body[n] = '\0';
	conn_answer(c, status == 200 ? "200 OK" : "503 Service Unavailable",
		    "Cache-Control: no-store\r\n", "text/plain; charset=utf-8", body, (size_t)n,
		    true, head_only);
}

/* Answers the request head in c->req[0..end). */
static void conn_serve(struct conn *c, size_t end)
{
	char *method = c->req, *target, *version, *path_end;
	bool head_only;
	size_t len;
	char *body;
	int r;

	c->req[end] = '\0';
	target = strchr(method, ' ');
	if (!target)
		goto bad;
	*target++ = '\0';
	version = strchr(target, ' ');
	if (!version)
		goto bad;
	*version++ = '\0';
	if (strncmp(version, "HTTP/1.", 7) || (version[7] != '0' && version[7] != '1') ||
	    (version[8] != '\r' && version[8] != '\n') || target[0] != '/')
		goto bad;
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		conn_answer_text(c, "405 Method Not Allowed", "Allow: GET, HEAD\r\n",
				 "method not allowed\n");
		return;
	}
	head_only = !strcmp(method, "HEAD");
	path_end = strchr(target, '?');
	if (path_end)
		*path_end = '\0';
	if (!strcmp(target, "/metrics")) {
		r = efs_metrics_render(c->h->m, &body, &len);
		if (r < 0) {
			conn_answer_text(c, "500 Internal Server Error", "", "out of memory\n");
			return;
		}
		conn_answer(c, "200 OK", "", "text/plain; version=0.0.4; charset=utf-8", body, len,
			    true, head_only);
		return;
	}
	if (!strcmp(target, "/healthz")) {
		conn_probe(c, c->h->healthz, 200, "ok", head_only);
		return;
	}
	if (!strcmp(target, "/readyz")) {
		conn_probe(c, c->h->readyz, 503, "no readiness probe", head_only);
		return;
	}
	if (!strcmp(target, "/")) {
		conn_answer(c, "200 OK", "", "text/plain; charset=utf-8", index_body,
			    sizeof(index_body) - 1, false, head_only);
		return;
	}
	conn_answer_text(c, "404 Not Found", "", "not found\n");
	return;

bad:
	conn_answer_text(c, "400 Bad Request", "", "bad request\n");
}

/* The length of the request head in |p| (ending in an empty line), or 0 if incomplete. */
static size_t head_end(const char *p, size_t len, size_t from)
{
	for (size_t i = from; i < len; i++) {
		if (p[i] != '\n')
			continue;
		if (i + 1 < len && p[i + 1] == '\n')
			return i + 2;
		if (i + 2 < len && p[i + 1] == '\r' && p[i + 2] == '\n')
			return i + 3;
	}
	return 0;
}

static void conn_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
	struct conn *c = handle->data;

	/* One byte stays free for the NUL that conn_serve writes. */
	*buf = uv_buf_init(c->req + c->len, (unsigned)(sizeof(c->req) - 1 - c->len));
}

static void conn_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	struct conn *c = stream->data;
	size_t old = c->len, end;

	if (nread < 0) {
		conn_close(c);
		return;
	}
	if (c->answered) {
		c->len = 0;
		return;
	}
	c->len += (size_t)nread;
	end = head_end(c->req, c->len, old > 2 ? old - 2 : 0);
	if (end) {
		conn_serve(c, end);
		c->len = 0;
	} else if (c->len >= EFS_HTTPD_MAX_REQUEST) {
		efs_log_debug("httpd: request head over %d bytes, dropped", EFS_HTTPD_MAX_REQUEST);
		conn_close(c);
	}
}

static void spare_closed(uv_handle_t *handle);

/* Accepts the waiting connection into the spare handle and closes it. */
static void refuse(struct efs_httpd *h)
{
	if (h->spare_busy) {
		h->accept_pending = true;
		return;
	}
	(void)uv_tcp_init(h->loop, &h->spare);
	h->spare.data = h;
	h->spare_busy = true;
	h->handles++;
	(void)uv_accept((uv_stream_t *)&h->listener, (uv_stream_t *)&h->spare);
	uv_close((uv_handle_t *)&h->spare, spare_closed);
}

static void on_connection(uv_stream_t *server, int status);

static void spare_closed(uv_handle_t *handle)
{
	struct efs_httpd *h = handle->data;

	h->spare_busy = false;
	if (h->accept_pending && !h->stopping) {
		h->accept_pending = false;
		on_connection((uv_stream_t *)&h->listener, 0);
	}
	httpd_handle_gone(h);
}

static void on_connection(uv_stream_t *server, int status)
{
	struct efs_httpd *h = server->data;
	struct conn *c;

	if (status < 0) {
		efs_log_debug("httpd: accept: %s", uv_strerror(status));
		return;
	}
	if (h->nconns >= EFS_HTTPD_MAX_CONNS) {
		refuse(h);
		return;
	}
	c = efs_mem_malloc(sizeof(*c));
	if (!c) {
		refuse(h);
		return;
	}
	memset(c, 0, offsetof(struct conn, req));
	c->h = h;
	(void)uv_tcp_init(h->loop, &c->tcp);
	(void)uv_timer_init(h->loop, &c->timer);
	c->tcp.data = c;
	c->timer.data = c;
	c->handles = 2;
	efs_list_add_head(&h->conns, &c->link);
	h->nconns++;
	h->handles++;
	if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0 ||
	    uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read) < 0) {
		conn_close(c);
		return;
	}
	(void)uv_timer_start(&c->timer, conn_timeout, h->timeout_ms, 0);
}

/* Parses |addr| into |ss|; see efs_httpd_start. */
static int parse_address(const char *addr, struct sockaddr_storage *ss, socklen_t *ret_len)
{
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)ss;
	const char *colon, *port_text;
	char host[INET6_ADDRSTRLEN + 1];
	size_t host_len;
	unsigned long port;
	char *end;

	if (!addr)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	if (addr[0] == '[') {
		colon = strchr(addr, ']');
		if (!colon || colon[1] != ':')
			return -EINVAL;
		host_len = (size_t)(colon - addr - 1);
		if (host_len >= sizeof(host))
			return -EINVAL;
		memcpy(host, addr + 1, host_len);
		host[host_len] = '\0';
		port_text = colon + 2;
		if (inet_pton(AF_INET6, host, &sin6->sin6_addr) != 1)
			return -EINVAL;
		sin6->sin6_family = AF_INET6;
		*ret_len = sizeof(*sin6);
	} else {
		colon = strchr(addr, ':');
		if (!colon || strchr(colon + 1, ':'))
			return -EINVAL;
		host_len = (size_t)(colon - addr);
		if (host_len >= sizeof(host))
			return -EINVAL;
		memcpy(host, addr, host_len);
		host[host_len] = '\0';
		port_text = colon + 1;
		if (!host_len || !strcmp(host, "localhost"))
			strcpy(host, "127.0.0.1");
		if (inet_pton(AF_INET, host, &sin->sin_addr) != 1)
			return -EINVAL;
		sin->sin_family = AF_INET;
		*ret_len = sizeof(*sin);
	}
	if (*port_text < '0' || *port_text > '9')
		return -EINVAL;
	errno = 0;
	port = strtoul(port_text, &end, 10);
	if (errno || *end || port > 65535)
		return -EINVAL;
	if (ss->ss_family == AF_INET6)
		sin6->sin6_port = htons((uint16_t)port);
	else
		sin->sin_port = htons((uint16_t)port);
	return 0;
}

static int format_address(int fd, char *buf, size_t size)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[INET6_ADDRSTRLEN];

	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return -errno;
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

		inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host));
		snprintf(buf, size, "[%s]:%u", host, ntohs(sin6->sin6_port));
	} else {
		struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

		inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
		snprintf(buf, size, "%s:%u", host, ntohs(sin->sin_port));
	}
	return 0;
}

/*
 * The socket is bound and listening before libuv sees it, so that every
 * likely failure (a bad or busy address) leaves nothing on the loop.
 */
int efs_httpd_start(struct efs_httpd **ret, uv_loop_t *loop, const char *addr,
		    const struct efs_metrics *m)
{
	struct sockaddr_storage ss;
	struct efs_httpd *h;
	socklen_t ss_len;
	int fd, one = 1, r;

	r = parse_address(addr, &ss, &ss_len);
	if (r < 0)
		return r;
	h = efs_mem_calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	efs_list_init(&h->conns);
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		goto out_free;
	}
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&ss, ss_len) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		goto out_close_fd;
	}
	r = format_address(fd, h->address, sizeof(h->address));
	if (r < 0)
		goto out_close_fd;
	h->loop = loop;
	h->m = m;
	h->timeout_ms = EFS_HTTPD_TIMEOUT_MS;
	r = uv_tcp_init(loop, &h->listener);
	if (r < 0)
		goto out_close_fd;
	h->listener.data = h;
	h->handles = 1;
	r = uv_tcp_open(&h->listener, fd);
	if (r < 0) {
		close(fd);
		goto out_stop;
	}
	r = uv_listen((uv_stream_t *)&h->listener, 128, on_connection);
	if (r < 0)
		goto out_stop;
	*ret = h;
	return 0;

out_stop:
	/* Unlikely (the socket already listens); the loop frees |h| later. */
	efs_httpd_stop(h, NULL, NULL);
	return r;
out_close_fd:
	close(fd);
out_free:
	efs_mem_free(h);
	return r;
}

const char *efs_httpd_address(const struct efs_httpd *h)
{
	return h->address;
}

void efs_httpd_set_timeout(struct efs_httpd *h, uint64_t ms)
{
	if (ms)
		h->timeout_ms = ms;
}

void efs_httpd_set_probes(struct efs_httpd *h, efs_httpd_probe_cb healthz,
			  efs_httpd_probe_cb readyz, void *arg)
{
	h->healthz = healthz;
	h->readyz = readyz;
	h->probe_arg = arg;
}

static void listener_closed(uv_handle_t *handle)
{
	httpd_handle_gone(handle->data);
}

void efs_httpd_stop(struct efs_httpd *h, void (*done)(void *arg), void *arg)
{
	struct efs_list *n;

	h->stopping = true;
	h->done = done;
	h->done_arg = arg;
	/* conn_close only starts closing: each conn leaves the list later. */
	efs_list_for_each(n, &h->conns)
		conn_close(efs_list_entry(n, struct conn, link));
	uv_close((uv_handle_t *)&h->listener, listener_closed);
}
