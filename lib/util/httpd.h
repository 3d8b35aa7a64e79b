/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A minimal HTTP/1.1 server on the libuv loop for /metrics: GET /metrics
 * answers the registry's text (Content-Type: text/plain; version=0.0.4),
 * GET / a short index, anything else 404 (405 for another method). One
 * request per connection (Connection: close), requests over 8 KiB or
 * taking over 5 s are dropped; never blocks the loop.
 */

#include <uv.h>

#include "util/metrics.h"

struct efs_httpd;

/*
 * Listens on |addr| ("host:port", "[v6]:port" or ":port" for 127.0.0.1;
 * port 0 picks a free one) and serves |m|. -EINVAL for a malformed
 * address, or the bind/listen errno.
 */
int efs_httpd_start(struct efs_httpd **ret, uv_loop_t *loop, const char *addr,
		    const struct efs_metrics *m);
/* The "host:port" actually bound (port resolved when 0 was asked). */
const char *efs_httpd_address(const struct efs_httpd *h);
/* Closes the listener and every connection; |done| runs once all handles
 * are closed (may be NULL). */
void efs_httpd_stop(struct efs_httpd *h, void (*done)(void *arg), void *arg);
