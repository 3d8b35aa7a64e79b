/* SPDX-License-Identifier: Apache-2.0 */
#include "clock.h"

#include <time.h>

uint64_t efs_clock_mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * EFS_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

uint64_t efs_clock_real_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * EFS_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}
