/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/* What the lock cache (lock.c) and the deaths watch (deaths.c) share. */

#include <stdbool.h>
#include <stdint.h>

#include "etcd/watch.h"
#include "meta/keys.h"

/*
 * Watches the keys of |rg| from revision |from| (0: from now on) on the
 * stream *|ws|, opened on |c|'s priority channel first when NULL; puts are
 * filtered out when |no_put|. efs_etcd_watcher_new's result.
 */
int efs_lock__watch_range(struct efs_etcd *c, struct efs_etcd_watch_stream **ws,
			  const struct efs_meta_range *rg, int64_t from, bool no_put,
			  efs_etcd_watch_cb cb, void *arg, struct efs_etcd_watcher **ret);
