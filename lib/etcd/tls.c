/* SPDX-License-Identifier: Apache-2.0 */
#include "etcd/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "util/mem.h"

struct efs_tls_ctx {
	SSL_CTX *ssl_ctx;
};

struct efs_tls {
	SSL *ssl;
	BIO *rbio; /* ciphertext from the peer, owned by |ssl| */
	BIO *wbio; /* ciphertext to the peer, owned by |ssl| */
	char err[256];
};

static const unsigned char alpn_h2[] = { 2, 'h', '2' };

/* Appends OpenSSL's queued errors to |buf| and empties the queue. */
static void drain_errors(char *buf, size_t len, const char *what)
{
	size_t off;
	unsigned long e;

	if (!len)
		return;
	off = (size_t)snprintf(buf, len, "%s", what);
	while ((e = ERR_get_error()) != 0) {
		if (off + 3 >= len)
			continue;
		buf[off++] = ':';
		buf[off++] = ' ';
		ERR_error_string_n(e, buf + off, len - off);
		off += strlen(buf + off);
	}
}

static int check_file(const char *path, const char *what, char *err, size_t errlen)
{
	if (access(path, R_OK) < 0) {
		int r = -errno;

		snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
		return r;
	}
	return 0;
}

int efs_tls_ctx_new(struct efs_tls_ctx **ret, const char *cacert, const char *cert,
		    const char *key, char *err, size_t errlen)
{
	struct efs_tls_ctx *ctx;
	int r;

	if (!cert != !key) {
		snprintf(err, errlen, "a client certificate needs a key and the other way round");
		return -EINVAL;
	}
	if (cacert && (r = check_file(cacert, "CA file", err, errlen)) < 0)
		return r;
	if (cert && (r = check_file(cert, "certificate", err, errlen)) < 0)
		return r;
	if (key && (r = check_file(key, "key", err, errlen)) < 0)
		return r;

	ctx = efs_mem_calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	r = -ENOMEM;
	ctx->ssl_ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx->ssl_ctx) {
		drain_errors(err, errlen, "SSL_CTX_new");
		goto out_free;
	}
	r = -EPROTO;
	if (!SSL_CTX_set_min_proto_version(ctx->ssl_ctx, TLS1_2_VERSION)) {
		drain_errors(err, errlen, "cannot require TLS 1.2");
		goto out_free;
	}
	SSL_CTX_set_verify(ctx->ssl_ctx, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_mode(ctx->ssl_ctx, SSL_MODE_RELEASE_BUFFERS);
	if (cacert) {
		if (SSL_CTX_load_verify_locations(ctx->ssl_ctx, cacert, NULL) != 1) {
			drain_errors(err, errlen, "invalid CA file");
			goto out_free;
		}
	} else if (SSL_CTX_set_default_verify_paths(ctx->ssl_ctx) != 1) {
		drain_errors(err, errlen, "no default trust store");
		goto out_free;
	}
	if (cert) {
		if (SSL_CTX_use_certificate_chain_file(ctx->ssl_ctx, cert) != 1) {
			drain_errors(err, errlen, "invalid certificate");
			goto out_free;
		}
		if (SSL_CTX_use_PrivateKey_file(ctx->ssl_ctx, key, SSL_FILETYPE_PEM) != 1) {
			drain_errors(err, errlen, "invalid key");
			goto out_free;
		}
		if (SSL_CTX_check_private_key(ctx->ssl_ctx) != 1) {
			drain_errors(err, errlen, "key does not match certificate");
			goto out_free;
		}
	}
	if (SSL_CTX_set_alpn_protos(ctx->ssl_ctx, alpn_h2, sizeof(alpn_h2)) != 0) {
		drain_errors(err, errlen, "cannot set ALPN");
		goto out_free;
	}
	*ret = ctx;
	return 0;

out_free:
	SSL_CTX_free(ctx->ssl_ctx);
	efs_mem_free(ctx);
	ERR_clear_error();
	return r;
}

void efs_tls_ctx_free(struct efs_tls_ctx *ctx)
{
	if (!ctx)
		return;
	SSL_CTX_free(ctx->ssl_ctx);
	efs_mem_free(ctx);
}

static bool is_ip(const char *host)
{
	unsigned char buf[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

int efs_tls_new(struct efs_tls **ret, struct efs_tls_ctx *ctx, const char *host)
{
	struct efs_tls *t;
	X509_VERIFY_PARAM *param;

	t = efs_mem_calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->ssl = SSL_new(ctx->ssl_ctx);
	t->rbio = BIO_new(BIO_s_mem());
	t->wbio = BIO_new(BIO_s_mem());
	if (!t->ssl || !t->rbio || !t->wbio)
		goto out_free;
	BIO_set_mem_eof_return(t->rbio, -1);
	SSL_set_bio(t->ssl, t->rbio, t->wbio);
	SSL_set_connect_state(t->ssl);
	param = SSL_get0_param(t->ssl);
	if (is_ip(host)) {
		if (X509_VERIFY_PARAM_set1_ip_asc(param, host) != 1)
			goto out_free_ssl;
	} else {
		X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (X509_VERIFY_PARAM_set1_host(param, host, 0) != 1)
			goto out_free_ssl;
		if (SSL_set_tlsext_host_name(t->ssl, host) != 1)
			goto out_free_ssl;
	}
	*ret = t;
	return 0;

out_free:
	BIO_free(t->rbio);
	BIO_free(t->wbio);
out_free_ssl:
	SSL_free(t->ssl);
	efs_mem_free(t);
	ERR_clear_error();
	return -ENOMEM;
}

void efs_tls_free(struct efs_tls *t)
{
	if (!t)
		return;
	SSL_free(t->ssl);
	efs_mem_free(t);
	ERR_clear_error();
}

int efs_tls_feed(struct efs_tls *t, const uint8_t *data, size_t len)
{
	while (len) {
		int n = BIO_write(t->rbio, data, len > (size_t)INT32_MAX ? INT32_MAX : (int)len);

		if (n <= 0) {
			drain_errors(t->err, sizeof(t->err), "BIO_write");
			return -ENOMEM;
		}
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Turns an SSL_* failure into -errno with a message; r is the call's return. */
static int ssl_failure(struct efs_tls *t, int r, const char *what)
{
	int e = SSL_get_error(t->ssl, r);
	long vr;

	switch (e) {
	case SSL_ERROR_WANT_READ:
	case SSL_ERROR_WANT_WRITE:
		return 0;
	case SSL_ERROR_ZERO_RETURN:
		snprintf(t->err, sizeof(t->err), "%s: peer closed the TLS session", what);
		ERR_clear_error();
		return -ECONNRESET;
	default:
		break;
	}
	vr = SSL_get_verify_result(t->ssl);
	if (vr != X509_V_OK) {
		snprintf(t->err, sizeof(t->err), "%s: certificate verification failed: %s", what,
			 X509_verify_cert_error_string(vr));
		ERR_clear_error();
		return -EPROTO;
	}
	drain_errors(t->err, sizeof(t->err), what);
	return -EPROTO;
}

int efs_tls_handshake(struct efs_tls *t)
{
	const unsigned char *proto;
	unsigned int plen;
	int r;

	if (SSL_is_init_finished(t->ssl))
		return 1;
	r = SSL_do_handshake(t->ssl);
	if (r != 1) {
		r = ssl_failure(t, r, "TLS handshake");
		return r == -ECONNRESET ? -EPROTO : r;
	}
	SSL_get0_alpn_selected(t->ssl, &proto, &plen);
	if (plen != 2 || memcmp(proto, "h2", 2) != 0) {
		snprintf(t->err, sizeof(t->err), "TLS handshake: server did not select ALPN h2");
		return -EPROTO;
	}
	return 1;
}

ssize_t efs_tls_read(struct efs_tls *t, uint8_t *buf, size_t len)
{
	int n;

	if (len > (size_t)INT32_MAX)
		len = INT32_MAX;
	n = SSL_read(t->ssl, buf, (int)len);
	if (n > 0)
		return n;
	return ssl_failure(t, n, "TLS read");
}

int efs_tls_write(struct efs_tls *t, const uint8_t *data, size_t len)
{
	while (len) {
		int n = SSL_write(t->ssl, data, len > (size_t)INT32_MAX ? INT32_MAX : (int)len);

		if (n <= 0) {
			int r = ssl_failure(t, n, "TLS write");

			return r ? r : -EIO;
		}
		data += n;
		len -= (size_t)n;
	}
	return 0;
}

size_t efs_tls_out_pending(const struct efs_tls *t)
{
	return BIO_ctrl_pending(t->wbio);
}

size_t efs_tls_out_take(struct efs_tls *t, uint8_t *buf, size_t len)
{
	int n;

	if (len > (size_t)INT32_MAX)
		len = INT32_MAX;
	n = BIO_read(t->wbio, buf, (int)len);
	return n > 0 ? (size_t)n : 0;
}

const char *efs_tls_last_error(const struct efs_tls *t)
{
	return t->err;
}
