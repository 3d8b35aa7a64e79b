/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdint.h>

/* Monotonic time in nanoseconds (CLOCK_MONOTONIC). Any thread. */
uint64_t efs_clock_mono_ns(void);
/* Wall-clock time in nanoseconds since the epoch (CLOCK_REALTIME). */
uint64_t efs_clock_real_ns(void);

#define EFS_NSEC_PER_MSEC 1000000ULL
#define EFS_NSEC_PER_SEC  1000000000ULL
