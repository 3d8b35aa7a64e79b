/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

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

/*
 * Journal mode: when stderr is the systemd journal, lines start with the
 * syslog priority journald reads ("<3>" err, "<4>" warning, "<6>" info,
 * "<7>" debug) and carry no timestamp; otherwise (a terminal, a log file)
 * they are "HH:MM:SS.mmm level: text" in UTC.
 *
 * efs_log_stream_is_journal() says whether |fd| is the stream that
 * |journal_stream| (the value of $JOURNAL_STREAM, "DEV:INODE") names.
 * efs_log_detect_journal() sets journal mode from $JOURNAL_STREAM and
 * stderr and returns it; call it at start and again after stderr is
 * redirected. efs_log_set_journal() forces the mode (tests).
 */
bool efs_log_stream_is_journal(const char *journal_stream, int fd);
bool efs_log_detect_journal(void);
void efs_log_set_journal(bool on);
/*
 * Formats one log line, newline included, into |line| (|size| >= 2
 * bytes, NUL-terminated, truncated to fit): its length without the NUL,
 * or -EINVAL.
 */
int efs_log_format(char *line, size_t size, bool journal, enum efs_log_level level,
		   const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

#define efs_log_debug(...) efs_log(EFS_LOG_DEBUG, __VA_ARGS__)
#define efs_log_info(...)  efs_log(EFS_LOG_INFO, __VA_ARGS__)
#define efs_log_warn(...)  efs_log(EFS_LOG_WARN, __VA_ARGS__)
#define efs_log_err(...)   efs_log(EFS_LOG_ERR, __VA_ARGS__)
