/* SPDX-License-Identifier: Apache-2.0 */
#pragma once

/*
 * TLS for the etcd client: OpenSSL driven through memory BIOs, so that the
 * socket stays a plain uv_tcp_t and no call ever blocks. The connection code
 * feeds the ciphertext it reads with efs_tls_feed(), pulls plaintext with
 * efs_tls_read(), encrypts with efs_tls_write() and collects the ciphertext
 * to send with efs_tls_out_take(). Loop thread only.
 *
 * Errors are -errno: -EPROTO for handshake, verification and protocol
 * failures, -EIO for other OpenSSL failures, -ENOMEM. OpenSSL's error queue
 * is emptied on every failure and its text kept for logs
 * (efs_tls_last_error()).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct efs_tls_ctx;
struct efs_tls;

/*
 * Creates a client context: TLS 1.2 or later, ALPN "h2", peer verification
 * against |cacert| (NULL: the system's default trust store), and a client
 * certificate |cert| with key |key| (both or neither). Errors: -EINVAL (only
 * one of |cert| and |key|), -ENOENT/-EACCES (a file is missing or
 * unreadable), -EPROTO (a file is not valid PEM or the key does not match),
 * -ENOMEM. On failure a description is written to |err| (size |errlen|).
 */
int efs_tls_ctx_new(struct efs_tls_ctx **ret, const char *cacert, const char *cert,
		    const char *key, char *err, size_t errlen);
/* Frees |ctx| once no efs_tls made from it remains. Accepts NULL. */
void efs_tls_ctx_free(struct efs_tls_ctx *ctx);

/*
 * Starts a client session on |ctx| for |host|, which is sent as SNI (unless
 * it is an IP address) and checked against the server's certificate (as a
 * DNS name or an IP address). Errors: -ENOMEM, -EIO.
 */
int efs_tls_new(struct efs_tls **ret, struct efs_tls_ctx *ctx, const char *host);
void efs_tls_free(struct efs_tls *t);

/* Hands |len| bytes of ciphertext read from the socket to the session. */
int efs_tls_feed(struct efs_tls *t, const uint8_t *data, size_t len);

/*
 * Advances the handshake. Returns 1 when it is complete (and the server
 * selected ALPN "h2"), 0 when it needs more input (collect output with
 * efs_tls_out_take() first), or -EPROTO.
 */
int efs_tls_handshake(struct efs_tls *t);

/*
 * Decrypts into |buf|. Returns the number of bytes (> 0), 0 when all fed
 * input is consumed, -ECONNRESET after the peer's close_notify, or -EPROTO.
 */
ssize_t efs_tls_read(struct efs_tls *t, uint8_t *buf, size_t len);

/* Encrypts all of |data| into the output buffer. Returns 0 or -EPROTO/-EIO. */
int efs_tls_write(struct efs_tls *t, const uint8_t *data, size_t len);

/* Bytes of ciphertext waiting to be sent. */
size_t efs_tls_out_pending(const struct efs_tls *t);
/* Moves up to |len| bytes of ciphertext into |buf|; returns how many. */
size_t efs_tls_out_take(struct efs_tls *t, uint8_t *buf, size_t len);

/* The text of the last failure (never NULL; "" when none). */
const char *efs_tls_last_error(const struct efs_tls *t);
