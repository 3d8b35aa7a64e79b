/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * The session's /dev/fuse I/O, through libfuse's custom I/O hooks
 * (fuse_session_custom_io, on the descriptor fuse_session_mount opened),
 * for what libfuse 3.14 cannot say: the replies to OPEN and CREATE that
 * set FOPEN_DIRECT_IO also get FOPEN_PARALLEL_DIRECT_WRITES (kernel FUSE
 * 7.38 and later; older kernels ignore the bit), so that the kernel stops
 * serialising O_DIRECT writes to one file on its inode lock and concurrent
 * writers reach the daemon, which orders overlapping ones itself (range
 * locks). The kernel still takes the lock exclusively for appends and for
 * writes past the end of the file.
 *
 * The read hook notes the unique id of every OPEN and CREATE request; the
 * writev hook patches the reply with a noted id. Ids live in a small ring
 * per process (a reply normally follows its request closely; an id pushed
 * out of the ring only loses the flag). Reads and writes go to the
 * descriptor unchanged otherwise. Thread-safe (replies may come from any
 * thread).
 */

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 312
#endif
#include <fuse_lowlevel.h>

/* Installs the hooks on |se| (mounted, not yet read from): 0 or a
 * negative errno (the session then keeps libfuse's own I/O). */
int efs_fuseio_install(struct fuse_session *se);

/* Replies patched so far (for tests and the log). */
unsigned long efs_fuseio_parallel_opens(void);
