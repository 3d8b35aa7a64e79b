/* SPDX-License-Identifier: Apache-2.0 */
#include "util/timer.h"

#include "util/mem.h"

uv_timer_t *efs_timer_new(uv_loop_t *loop, void *data)
{
	uv_timer_t *t = efs_mem_calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	uv_timer_init(loop, t);
	t->data = data;
	return t;
}

static void timer_closed(uv_handle_t *h)
{
	efs_mem_free(h);
}

uv_timer_t *efs_timer_free(uv_timer_t *t)
{
	if (t) {
		t->data = NULL;
		uv_close((uv_handle_t *)t, timer_closed);
	}
	return NULL;
}
