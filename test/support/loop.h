/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Loop scaffolding shared by the integration suites: one uv loop per test
 * process (Criterion forks a worker per test) kept awake by a 10 ms ticker,
 * loop-running helpers with deadlines, client creation and release that fail
 * the current test on error, and a protobuf message free helper.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "etcd/etcd.h"

/* The test's loop; valid between efs_test_loop_init() and efs_test_loop_fini(). */
extern uv_loop_t efs_test_loop;

/*
 * Initialises efs_test_loop and starts the ticker that keeps UV_RUN_ONCE
 * from blocking for long. Fails the current test if the loop cannot start.
 */
void efs_test_loop_init(void);

/*
 * Stops the ticker and closes the loop. A passing test has freed everything,
 * so the loop empties at once. A test that failed an assertion may have left
 * clients open: closing handles get a bounded time (3 s) and the rest are
 * never waited for. Does nothing if the loop is not initialised, so tests may
 * call it before their leak check and again from .fini.
 */
void efs_test_loop_fini(void);

/* Returns the monotonic clock in milliseconds. */
uint64_t efs_test_now_ms(void);

/* Runs the loop until *|flag| or |ms| elapse; returns *|flag|. */
bool efs_test_run_until(const bool *flag, uint64_t ms);

/* Runs the loop for |ms| milliseconds. */
void efs_test_run_for(uint64_t ms);

/*
 * Returns a new client on efs_test_loop for |endpoints| with default options;
 * fails the current test on error.
 */
struct efs_etcd *efs_test_client_new(const char *endpoints);

/* Free callback that sets the bool at |arg|. */
void efs_test_freed_cb(void *arg);

/* Frees |c| and runs the loop until it is gone; fails the test after 10 s. */
void efs_test_client_free(struct efs_etcd *c);

/* Frees the unpacked protobuf message |m| (a ProtobufCMessage *) if not NULL. */
void efs_test_pb_free(void *m);
