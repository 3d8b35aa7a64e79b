/* SPDX-License-Identifier: Apache-2.0 */
#include "kchan/fuseloop.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/mem.h"

struct efs_fuseloop {
	uv_poll_t poll; /* first: the close callback gets the fuseloop */
	struct fuse_session *se;
	struct fuse_buf buf; /* .mem allocated by libfuse (malloc), freed with free() */
	efs_fuseloop_exit_cb exit_cb;
	void *arg;
	void (*close_done)(void *arg);
	void *close_arg;
	uint64_t requests;
	bool polling;
	bool paused;
	bool ended;
	bool closing;
};

static void end_session(struct efs_fuseloop *fl, int status)
{
	if (fl->ended)
		return;
	fl->ended = true;
	if (fl->polling) {
		uv_poll_stop(&fl->poll);
		fl->polling = false;
	}
	if (fl->exit_cb)
		fl->exit_cb(fl, status, fl->arg);
}

/*
 * Receives and processes every request that is ready. A handler may pause
 * or close the fuseloop, so the loop checks after each request; the memory
 * stays valid until the close callback, which runs in a later loop phase.
 */
/* Requests read per poll callback: the rest wait for the next loop
 * iteration (the fd stays readable and the poll armed), so that timers
 * (session suspension, lease renewal) are never starved by a busy mount. */
#define PUMP_MAX 64

static void pump(struct efs_fuseloop *fl)
{
	int r;

	for (int n = 0; n < PUMP_MAX && !fl->closing && !fl->paused && !fl->ended; n++) {
		r = fuse_session_receive_buf(fl->se, &fl->buf);
		if (r == -EINTR)
			continue;
		if (r == -EAGAIN)
			break;
		if (r == 0 || fuse_session_exited(fl->se)) {
			/* ENODEV: unmounted or aborted; libfuse exited the session. */
			end_session(fl, 0);
			break;
		}
		if (r < 0) {
			efs_log_debug("fuseloop: reading /dev/fuse: %s", strerror(-r));
			end_session(fl, r);
			break;
		}
		fl->requests++;
		fuse_session_process_buf(fl->se, &fl->buf);
		if (fuse_session_exited(fl->se)) {
			/* A handler (or FUSE_DESTROY) ended the session. */
			end_session(fl, 0);
			break;
		}
	}
}

static void on_poll(uv_poll_t *h, int status, int events)
{
	struct efs_fuseloop *fl = h->data;

	(void)events;
	/*
	 * libuv reports POLLERR as UV_EBADF: /dev/fuse signals a dead
	 * connection that way. One read tells ENODEV (session over) from a
	 * real error.
	 */
	if (status < 0 && status != UV_EBADF) {
		end_session(fl, status);
		return;
	}
	pump(fl);
	if (status == UV_EBADF && !fl->ended && !fl->closing)
		end_session(fl, -EIO);
}

static int poll_start(struct efs_fuseloop *fl)
{
	int r;

	if (fl->polling || fl->ended || fl->closing)
		return 0;
	r = uv_poll_start(&fl->poll, UV_READABLE | UV_DISCONNECT, on_poll);
	if (r < 0)
		return r;
	fl->polling = true;
	return 0;
}

int efs_fuseloop_start(struct efs_fuseloop **ret, uv_loop_t *loop, struct fuse_session *se,
		       efs_fuseloop_exit_cb exit_cb, void *arg)
{
	struct efs_fuseloop *fl;
	int fd, flags, r;

	fd = fuse_session_fd(se);
	if (fd < 0)
		return -EBADF;
	flags = fcntl(fd, F_GETFL);
	if (flags < 0)
		return -errno;
	if (!(flags & O_NONBLOCK) && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return -errno;

	fl = efs_mem_calloc(1, sizeof(*fl));
	if (!fl)
		return -ENOMEM;
	fl->se = se;
	fl->exit_cb = exit_cb;
	fl->arg = arg;
	r = uv_poll_init(loop, &fl->poll, fd);
	if (r < 0) {
		efs_mem_free(fl);
		return r;
	}
	fl->poll.data = fl;
	r = poll_start(fl);
	if (r < 0) {
		/* The handle exists: it goes through close like any other. */
		efs_fuseloop_close(fl, NULL, NULL);
		return r;
	}
	*ret = fl;
	return 0;
}

void efs_fuseloop_pause(struct efs_fuseloop *fl, bool paused)
{
	if (!fl || fl->ended || fl->closing || fl->paused == paused)
		return;
	fl->paused = paused;
	if (paused) {
		if (fl->polling) {
			uv_poll_stop(&fl->poll);
			fl->polling = false;
		}
	} else {
		int r = poll_start(fl);

		if (r < 0)
			end_session(fl, r);
	}
}

bool efs_fuseloop_ended(const struct efs_fuseloop *fl)
{
	return fl->ended;
}

uint64_t efs_fuseloop_requests(const struct efs_fuseloop *fl)
{
	return fl->requests;
}

static void on_closed(uv_handle_t *h)
{
	struct efs_fuseloop *fl = h->data;
	void (*done)(void *) = fl->close_done;
	void *darg = fl->close_arg;

	/* libfuse allocated the buffer with malloc(). */
	free(fl->buf.mem);
	efs_mem_free(fl);
	if (done)
		done(darg);
}

void efs_fuseloop_close(struct efs_fuseloop *fl, void (*done)(void *arg), void *arg)
{
	if (!fl)
		return;
	fl->closing = true;
	fl->exit_cb = NULL;
	fl->close_done = done;
	fl->close_arg = arg;
	fl->polling = false;
	uv_close((uv_handle_t *)&fl->poll, on_closed);
}
