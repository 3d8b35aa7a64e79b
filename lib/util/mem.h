/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

#include <stddef.h>

#include <nghttp2/nghttp2.h>
#include <protobuf-c/protobuf-c.h>

/*
 * Every allocation in libetcfs goes through these, so that a test can make
 * the Nth allocation fail (failmalloc) and check that each path unwinds
 * cleanly with -ENOMEM. They never abort: callers check for NULL.
 */
void *efs_mem_malloc(size_t size);
void *efs_mem_calloc(size_t nmemb, size_t size);
void *efs_mem_realloc(void *ptr, size_t size);
void efs_mem_free(void *ptr);
char *efs_mem_strdup(const char *s);
char *efs_mem_strndup(const char *s, size_t n);
void *efs_mem_memdup(const void *p, size_t n);
/*
 * Makes room for |n| elements of |size| bytes in a growable heap array:
 * |arrp| points to the array's pointer (of any object pointer type, NULL
 * while empty) and |cap| to its capacity in elements. The capacity doubles,
 * from 8, until it holds |n|, so that appending one at a time costs O(1)
 * amortised. 0 (also when there is room already) or -ENOMEM (out of
 * memory, or |n| elements overflow size_t), the array and |cap| untouched.
 */
int efs_mem_reserve(void *arrp, size_t *cap, size_t n, size_t size);
/* Like efs_mem_reserve(), but the capacity grows to exactly |n|: for
 * arrays whose size is known up front, where doubling would only waste
 * memory. */
int efs_mem_reserve_exact(void *arrp, size_t *cap, size_t n, size_t size);

/*
 * Failure injection. After efs_mem_fail_after(n), the allocation with index
 * |n| (0-based, counted from this call) and every later one fails until
 * efs_mem_fail_reset(). efs_mem_count() returns how many allocations were
 * attempted since the last reset, to size a sweep. Loop thread only.
 */
void efs_mem_fail_after(long n);
void efs_mem_fail_reset(void);
long efs_mem_count(void);

/*
 * How many allocations have failed so far (injected or real). Compare the
 * value around a call into a library that reports failure without a
 * reason, such as protobuf_c_message_unpack(), to tell -ENOMEM from bad
 * input. Loop thread only.
 */
unsigned long efs_mem_failures(void);

/* Allocator tables for the libraries we hand memory management to. */
nghttp2_mem *efs_mem_nghttp2(void);
ProtobufCAllocator *efs_mem_protobuf(void);
