/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdarg.h>

enum efs_log_level {
	EFS_LOG_ERR = 3,
	EFS_LOG_WARN = 4,
	EFS_LOG_INFO = 6,
	EFS_LOG_DEBUG = 7,
};

/*
 * Logging. Library code logs at debug level only; the daemon and commands
 * log once, where an error is handled. Messages go to stderr with a
 * timestamp unless a sink is installed. Thread-safe (one write per line).
 */
void efs_log_set_level(enum efs_log_level level);
enum efs_log_level efs_log_get_level(void);
/* Parses "err", "warn", "info", "debug"; returns 0 or -EINVAL. */
int efs_log_parse_level(const char *s, enum efs_log_level *ret_level);
void efs_log(enum efs_log_level level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void efs_logv(enum efs_log_level level, const char *fmt, va_list ap)
	__attribute__((format(printf, 2, 0)));

#define efs_log_debug(...) efs_log(EFS_LOG_DEBUG, __VA_ARGS__)
#define efs_log_info(...)  efs_log(EFS_LOG_INFO, __VA_ARGS__)
#define efs_log_warn(...)  efs_log(EFS_LOG_WARN, __VA_ARGS__)
#define efs_log_err(...)   efs_log(EFS_LOG_ERR, __VA_ARGS__)
