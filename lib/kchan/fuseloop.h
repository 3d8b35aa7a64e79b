/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A libfuse3 low-level session pumped by a libuv loop: the session's /dev/fuse descriptor is made non-blocking and
 * watched with uv_poll; when it is readable, requests are received with
 * fuse_session_receive_buf() until -EAGAIN and each is handed to
 * fuse_session_process_buf() on the loop thread, so every handler runs on
 * the loop. One receive buffer is allocated by libfuse on the first
 * request and reused for every later one.
 *
 * The session ends when the kernel says so (the filesystem was unmounted,
 * or the connection aborted through /sys/fs/fuse/connections: reads fail
 * with ENODEV and libfuse marks the session exited) or on a read error:
 * then polling stops and the exit callback runs once, on the loop.
 *
 * Everything here runs on the loop thread.
 */

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

struct efs_fuseloop;

/*
 * The session ended: |status| is 0 when the kernel ended it (unmount or
 * abort), or the negative errno of a failed read. Runs once, on the loop;
 * the fuseloop is stopped then and must still be closed.
 */
typedef void (*efs_fuseloop_exit_cb)(struct efs_fuseloop *fl, int status, void *arg);

/*
 * Starts pumping |se|, which must be mounted (fuse_session_mount) and not
 * yet read from: sets its descriptor O_NONBLOCK and starts polling it on
 * |loop|. |exit_cb| may be NULL. Errors: -EBADF (no descriptor: not
 * mounted), the fcntl/uv_poll errno, -ENOMEM. The session stays the
 * caller's: it must outlive the fuseloop.
 */
int efs_fuseloop_start(struct efs_fuseloop **ret, uv_loop_t *loop, struct fuse_session *se,
		       efs_fuseloop_exit_cb exit_cb, void *arg);

/*
 * Stops or resumes reading requests (a clean leave stops taking new
 * requests while the ones in flight finish; they keep replying). Requests
 * the kernel queues meanwhile wait in the kernel. No-op after the session
 * ended.
 */
void efs_fuseloop_pause(struct efs_fuseloop *fl, bool paused);

/* True once the session ended (the exit callback ran or is about to). */
bool efs_fuseloop_ended(const struct efs_fuseloop *fl);

/* Requests processed so far. */
uint64_t efs_fuseloop_requests(const struct efs_fuseloop *fl);

/*
 * Stops polling and frees the fuseloop and its buffer; |done| (may be
 * NULL) runs on the loop once the poll handle is closed. No callback of
 * the fuseloop runs after this call. Accepts NULL (|done| then runs never).
 */
void efs_fuseloop_close(struct efs_fuseloop *fl, void (*done)(void *arg), void *arg);
