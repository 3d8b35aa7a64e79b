/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A minimal HTTP/1.1 server on the libuv loop for /metrics: GET (or HEAD)
 * /metrics answers the registry's text (Content-Type: text/plain;
 * version=0.0.4), GET /healthz and /readyz the probes' answers (below),
 * GET / a short index, another path 404, another method 405
 * and a malformed request line 400. One request per connection (Connection:
 * close; a request body is read and ignored). A request whose head exceeds
 * 8 KiB is dropped (closed without an answer), and so is a connection still
 * open after the timeout (5 s from accept by default, answer included). At
 * most 64 connections are served at once; further ones are accepted and
 * closed at once. Never blocks the loop. Everything here runs on the loop
 * thread of |loop|.
 */

#include <stdint.h>

#include <uv.h>

#include "util/metrics.h"

struct efs_httpd;

/* Largest request head (request line and headers) accepted, in bytes. */
#define EFS_HTTPD_MAX_REQUEST 8192
/* Connections served at once. */
#define EFS_HTTPD_MAX_CONNS 64
/* Default time a connection may stay open, in milliseconds. */
#define EFS_HTTPD_TIMEOUT_MS 5000

/*
 * Listens on |addr| ("host:port" with a numeric IPv4 host or "localhost",
 * "[v6]:port", or ":port" for 127.0.0.1; port 0 picks a free one) and
 * serves |m|, which must outlive the server. -EINVAL for a malformed
 * address, -ENOMEM, or the socket/bind/listen errno (-EADDRINUSE, ...).
 * On failure nothing is left on the loop.
 */
int efs_httpd_start(struct efs_httpd **ret, uv_loop_t *loop, const char *addr,
		    const struct efs_metrics *m);
/* The "host:port" actually bound (port resolved when 0 was asked). */
const char *efs_httpd_address(const struct efs_httpd *h);
/*
 * Sets the time a connection may stay open, from accept to close, to |ms|
 * (> 0) for connections accepted from now on.
 */
void efs_httpd_set_timeout(struct efs_httpd *h, uint64_t ms);
/*
 * A probe: fills |why| (|size| bytes) with one line saying what it found
 * (no newline) and returns the HTTP status to answer, 200 or 503.
 */
typedef int (*efs_httpd_probe_cb)(void *arg, char *why, size_t size);
/*
 * Sets the probes of /healthz and /readyz (either may be NULL), called on
 * the loop thread for each request. Without a probe, /healthz answers 200
 * "ok" (the loop that serves it runs) and /readyz 503 "no readiness
 * probe". The body is the probe's line and a newline.
 */
void efs_httpd_set_probes(struct efs_httpd *h, efs_httpd_probe_cb healthz,
			  efs_httpd_probe_cb readyz, void *arg);
/*
 * Closes the listener and every connection; |done(arg)| runs once all
 * handles are closed (may be NULL), after which |h| is freed. Call once.
 */
void efs_httpd_stop(struct efs_httpd *h, void (*done)(void *arg), void *arg);
