/* SPDX-License-Identifier: Apache-2.0 */
#include "mem.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A counter rather than a flag so that a sweep can fail each allocation of a
 * scenario in turn. Negative means "never fail". */
static long fail_at = -1;
static long alloc_count;
/* Every allocation that returned NULL, injected or real; never reset, so
 * that a caller can compare it before and after a library call that does
 * not say why it failed (protobuf-c's unpack returns NULL both for bad input
 * and for exhausted memory). Loop thread only, like the injection. */
static unsigned long failures;

static bool should_fail(void)
{
	long i = alloc_count++;

	if (fail_at >= 0 && i >= fail_at) {
		failures++;
		return true;
	}
	return false;
}

static void *note(void *p)
{
	if (!p)
		failures++;
	return p;
}

unsigned long efs_mem_failures(void)
{
	return failures;
}

void efs_mem_fail_after(long n)
{
	alloc_count = 0;
	fail_at = n;
}

void efs_mem_fail_reset(void)
{
	fail_at = -1;
	alloc_count = 0;
}

long efs_mem_count(void)
{
	return alloc_count;
}

void *efs_mem_malloc(size_t size)
{
	if (should_fail())
		return NULL;
	return note(malloc(size ? size : 1));
}

void *efs_mem_calloc(size_t nmemb, size_t size)
{
	if (should_fail())
		return NULL;
	return note(calloc(nmemb ? nmemb : 1, size ? size : 1));
}

void *efs_mem_realloc(void *ptr, size_t size)
{
	if (should_fail())
		return NULL;
	return note(realloc(ptr, size ? size : 1));
}

void efs_mem_free(void *ptr)
{
	free(ptr);
}

void *efs_mem_memdup(const void *p, size_t n)
{
	void *q = efs_mem_malloc(n);

	if (q && n)
		memcpy(q, p, n);
	return q;
}

/* Reallocates the array |arrp| points to to |ncap| elements of |size|
 * bytes (ncap * size does not overflow). 0 or -ENOMEM, the array and |cap|
 * untouched. */
static int resize(void *arrp, size_t *cap, size_t ncap, size_t size)
{
	void *arr, *p;

	/* Through memcpy, since |arrp| is not a void ** but a T **. */
	memcpy(&arr, arrp, sizeof(arr));
	p = efs_mem_realloc(arr, ncap * size);
	if (!p)
		return -ENOMEM;
	memcpy(arrp, &p, sizeof(p));
	*cap = ncap;
	return 0;
}

int efs_mem_reserve(void *arrp, size_t *cap, size_t n, size_t size)
{
	size_t max = SIZE_MAX / size, ncap;

	if (n <= *cap)
		return 0;
	if (n > max)
		return -ENOMEM;
	ncap = *cap ? *cap : 8;
	while (ncap < n)
		ncap = ncap <= max / 2 ? ncap * 2 : max;
	return resize(arrp, cap, ncap, size);
}

int efs_mem_reserve_exact(void *arrp, size_t *cap, size_t n, size_t size)
{
	if (n <= *cap)
		return 0;
	if (n > SIZE_MAX / size)
		return -ENOMEM;
	return resize(arrp, cap, n, size);
}

char *efs_mem_strndup(const char *s, size_t n)
{
	size_t len = strnlen(s, n);
	char *q = efs_mem_malloc(len + 1);

	if (!q)
		return NULL;
	memcpy(q, s, len);
	q[len] = '\0';
	return q;
}

char *efs_mem_strdup(const char *s)
{
	return efs_mem_strndup(s, strlen(s));
}

static void *ng_malloc(size_t size, void *ud)
{
	return efs_mem_malloc(size);
}

static void ng_free(void *ptr, void *ud)
{
	efs_mem_free(ptr);
}

static void *ng_calloc(size_t nmemb, size_t size, void *ud)
{
	return efs_mem_calloc(nmemb, size);
}

static void *ng_realloc(void *ptr, size_t size, void *ud)
{
	return efs_mem_realloc(ptr, size);
}

nghttp2_mem *efs_mem_nghttp2(void)
{
	static nghttp2_mem mem = {
		.malloc = ng_malloc,
		.free = ng_free,
		.calloc = ng_calloc,
		.realloc = ng_realloc,
	};

	return &mem;
}

static void *pb_alloc(void *ud, size_t size)
{
	return efs_mem_malloc(size);
}

static void pb_free(void *ud, void *ptr)
{
	efs_mem_free(ptr);
}

ProtobufCAllocator *efs_mem_protobuf(void)
{
	static ProtobufCAllocator a = {
		.alloc = pb_alloc,
		.free = pb_free,
	};

	return &a;
}
