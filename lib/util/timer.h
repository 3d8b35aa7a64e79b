/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * A heap-allocated libuv timer whose owner may be freed before the timer's
 * close completes: efs_timer_free() clears |data|, closes the handle and
 * frees it once libuv is done with it, so the owner can go at once.
 */

#include <uv.h>

/* A new initialised (not started) timer with |data| set; NULL on ENOMEM. */
uv_timer_t *efs_timer_new(uv_loop_t *loop, void *data);
/* Stops, closes and (later) frees |t|. Accepts NULL; returns NULL. */
uv_timer_t *efs_timer_free(uv_timer_t *t);
