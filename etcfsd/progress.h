/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * Progress of one long piece of work in a user command (mkfs, fsck, grow,
 * backup): on a terminal a bar on stderr with the rate and the time left,
 * redrawn at most ten times a second; otherwise plain lines on stderr at
 * every tenth of the work (from the first second on, so that short work
 * stays quiet); at the end one summary line (again only when something was
 * shown or the work took a second or more). One piece of work at a time
 * per process; not thread-safe. ETCFS_PROGRESS=off silences the bar and
 * the lines (the summary stays), =plain forces lines, =tty forces the bar.
 */

#include <stdint.h>

/* Starts |label|'s work of |total| units (0: unknown, no bar nor time
 * left). |label| is borrowed until progress_done(). */
void progress_start(const char *label, uint64_t total);
/* |n| more units done. */
void progress_add(uint64_t n);
/* Ends the work: clears the bar and, when |summary| is not NULL (and the
 * work was not quick), prints "label: summary (N in T s)" as one line on
 * stderr. */
void progress_done(const char *summary);
