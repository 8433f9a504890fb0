// OpenSSL 3.0 (Debian 12 libssl-dev). Function-like macros and variadic functions do not import
// into Swift; the static inline wrappers below exist only for those cases. Prefix: cossl_.
#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
#include <string.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/pem.h>
#include <openssl/pkcs12.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

// One-shot SHA-256 with the low-level API. EVP_Digest allocates and frees a digest context and
// a provider context on every call: ~5k instructions to hash a 50-byte credential on the relay's
// ingest path (callgrind), against a few hundred here. The low-level functions are deprecated in
// OpenSSL 3 but run the same assembly (SHA-NI where the CPU has it); the context lives on the
// stack and is cleansed, since it holds state derived from the (secret) input.
static inline void cossl_sha256(const void *data, size_t len, unsigned char out[32]) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    SHA256_CTX c;
    SHA256_Init(&c);
    SHA256_Update(&c, data, len);
    SHA256_Final(out, &c);
    OPENSSL_cleanse(&c, sizeof c);
#pragma GCC diagnostic pop
}

// HMAC-SHA256 with a key's padded blocks hashed once (OpenSSLSupport's HMACSHA256.Key, one per
// webhook secret): `cossl_sha256_begin` absorbs one 64-byte block into a fresh context, and
// `cossl_sha256_continue` hashes `data` from a copy of such a context (the saved one is left
// as it was). Low-level API for the reason given above; copies are cleansed.
static inline void cossl_sha256_begin(SHA256_CTX *c, const unsigned char block[64]) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    SHA256_Init(c);
    SHA256_Update(c, block, 64);
#pragma GCC diagnostic pop
}
static inline void cossl_sha256_continue(const SHA256_CTX *start, const void *data, size_t len, unsigned char out[32]) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    SHA256_CTX c = *start;
    SHA256_Update(&c, data, len);
    SHA256_Final(out, &c);
    OPENSSL_cleanse(&c, sizeof c);
#pragma GCC diagnostic pop
}
static inline void cossl_sha256_cleanse(SHA256_CTX *c) { OPENSSL_cleanse(c, sizeof *c); }

// OPENSSL_free is a macro around CRYPTO_free with file/line.
static inline void cossl_free(void *p) { OPENSSL_free(p); }

// Drains this thread's OpenSSL error queue into `buf` as "error; error; ..." (NUL-terminated,
// cut at `len`). Returns how many errors there were (0: `buf` is ""). Called only by
// OpenSSLSupport's OpenSSLErrors.drain, which every module uses.
static inline int cossl_drain_errors(char *buf, size_t len) {
    int count = 0;
    size_t used = 0;
    unsigned long code;
    if (len == 0) return 0;
    buf[0] = 0;
    while ((code = ERR_get_error()) != 0) {
        if (count > 0 && used + 2 < len) { buf[used++] = ';'; buf[used++] = ' '; buf[used] = 0; }
        if (used + 1 < len) { ERR_error_string_n(code, buf + used, len - used); used += strlen(buf + used); }
        count++;
    }
    return count;
}
// ---- Ratchet (HKDF via EVP_KDF) -------------------------------------------------------------
// OSSL_PARAM_construct_* return structs that keep pointers to their arguments, so a params array
// built in Swift could point at temporaries that are gone by the time OpenSSL reads them. These
// two wrappers build the array on this C stack frame, valid for exactly the one call that uses it.

// Configures an HKDF context for SHA-256 and the given EVP_KDF_HKDF_MODE_* value.
static inline int cossl_hkdf_configure(EVP_KDF_CTX *ctx, int mode) {
    char digest[] = "SHA256";
    OSSL_PARAM params[3];
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0);
    params[1] = OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode);
    params[2] = OSSL_PARAM_construct_end();
    return EVP_KDF_CTX_set_params(ctx, params);
}

// One HKDF derivation on a configured context. Empty salt or info are left out (RFC 5869: an
// absent salt is HashLen zero bytes, which HMAC treats the same as an empty key).
static inline int cossl_hkdf_derive(EVP_KDF_CTX *ctx,
                                    const unsigned char *key, size_t key_len,
                                    const unsigned char *salt, size_t salt_len,
                                    const unsigned char *info, size_t info_len,
                                    unsigned char *out, size_t out_len) {
    OSSL_PARAM params[4];
    size_t n = 0;
    params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key, key_len);
    if (salt != NULL && salt_len > 0)
        params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len);
    if (info != NULL && info_len > 0)
        params[n++] = OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, info_len);
    params[n] = OSSL_PARAM_construct_end();
    return EVP_KDF_derive(ctx, out, out_len, params);
}

// ---- SipHash-2-4 (EVP_MAC "SIPHASH"): the oracle BasicsTests checks Basics.SipHash24 against --
// A context keyed once; each hash re-initialises it with the same key (EVP_MAC_init with a NULL
// key keeps the key: OpenSSL 3.0's siphash provider), so a hash costs no allocation.
static inline EVP_MAC_CTX *cossl_siphash_new(const unsigned char key[16]) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "SIPHASH", NULL);
    if (mac == NULL) return NULL;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);   // the context holds its own reference
    if (ctx == NULL) return NULL;
    size_t size = 8;
    OSSL_PARAM params[2];
    params[0] = OSSL_PARAM_construct_size_t(OSSL_MAC_PARAM_SIZE, &size);
    params[1] = OSSL_PARAM_construct_end();
    if (!EVP_MAC_init(ctx, key, 16, params)) { EVP_MAC_CTX_free(ctx); return NULL; }
    return ctx;
}

// The 8-byte tag of `data` read little-endian (SipHash's own word order). 0 on failure with
// *ok = 0.
static inline uint64_t cossl_siphash(EVP_MAC_CTX *ctx, const void *data, size_t len, int *ok) {
    unsigned char out[8];
    size_t outlen = 0;
    *ok = EVP_MAC_init(ctx, NULL, 0, NULL) && EVP_MAC_update(ctx, data, len)
        && EVP_MAC_final(ctx, out, &outlen, sizeof out) && outlen == 8;
    if (!*ok) return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | out[i];
    return v;
}

// ---- HTTPServer (issue 3) shims: begin ----
// SSL_CTX_set_min_proto_version is a macro around SSL_CTX_ctrl.
static inline int cossl_ctx_set_min_tls12(SSL_CTX *ctx) {
    return (int)SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
}
// The ALPN select callback receives `const unsigned char **out` while SSL_select_next_proto
// takes `unsigned char **`: the cast cannot be written in Swift. `arg` is the server's
// preference list in wire format (length-prefixed), prefixed by its 2-byte length, owned by the
// Swift TLS context for the SSL_CTX's lifetime.
static inline int cossl_alpn_select_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                                const unsigned char *in, unsigned int inlen, void *arg) {
    (void)ssl;
    const unsigned char *prefs = (const unsigned char *)arg;
    unsigned int plen = ((unsigned int)prefs[0] << 8) | prefs[1];
    if (SSL_select_next_proto((unsigned char **)out, outlen, prefs + 2, plen, in, inlen)
        != OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_NOACK;
    }
    return SSL_TLSEXT_ERR_OK;
}
// Installs the C callback above (a function pointer Swift would otherwise have to build).
static inline void cossl_ctx_set_alpn_prefs(SSL_CTX *ctx, const unsigned char *prefs) {
    SSL_CTX_set_alpn_select_cb(ctx, cossl_alpn_select_cb, (void *)prefs);
}
// SSL_OP_* are built by the SSL_OP_BIT macro (a cast), which does not import: no
// renegotiation (a DoS vector), server cipher preference.
static inline void cossl_ctx_harden_server(SSL_CTX *ctx) {
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
}
// ---- HTTPServer (issue 3) shims: end ----
// ---- PKCS#12 client certificates (PushClient, relayctl check-config) ----------------------------
// The extra CA certificates come back as a STACK_OF(X509), whose accessors (sk_X509_shift,
// sk_X509_pop_free) are macro-generated inline functions Swift cannot call; these two keep the
// stack on the C side.

// Reads a .p12/.pfx file: its certificate and private key (caller frees both) and, if `chain` is
// not NULL, the other certificates (caller frees with sk_X509_pop_free via the function below).
// Returns 1 on success, 0 on a parse/password failure (details on the OpenSSL error queue),
// -1 if the file cannot be opened.
static inline int cossl_pkcs12_read(const char *path, const char *passphrase, X509 **cert, EVP_PKEY **key,
                                    STACK_OF(X509) **chain) {
    *cert = NULL; *key = NULL;
    BIO *bio = BIO_new_file(path, "rb");
    if (bio == NULL) return -1;
    PKCS12 *p12 = d2i_PKCS12_bio(bio, NULL);
    BIO_free(bio);
    if (p12 == NULL) return 0;
    STACK_OF(X509) *extra = NULL;
    int ok = PKCS12_parse(p12, passphrase ? passphrase : "", key, cert, &extra);
    PKCS12_free(p12);
    if (ok == 1 && (*cert == NULL || *key == NULL)) ok = 0;
    if (ok != 1 || chain == NULL) {
        sk_X509_pop_free(extra, X509_free);
        extra = NULL;
    }
    if (ok != 1) {
        X509_free(*cert); EVP_PKEY_free(*key);
        *cert = NULL; *key = NULL;
        return 0;
    }
    if (chain) *chain = extra;
    return 1;
}

// Loads a .p12/.pfx file into `ctx`: certificate, private key and chain. Same return values.
static inline int cossl_ctx_use_pkcs12_file(SSL_CTX *ctx, const char *path, const char *passphrase) {
    X509 *cert; EVP_PKEY *key; STACK_OF(X509) *chain = NULL;
    int rc = cossl_pkcs12_read(path, passphrase, &cert, &key, &chain);
    if (rc != 1) return rc;
    int ok = SSL_CTX_use_certificate(ctx, cert) == 1 && SSL_CTX_use_PrivateKey(ctx, key) == 1;
    X509 *extra;
    // add0 takes ownership of each certificate shifted off the stack.
    while (ok && chain != NULL && (extra = sk_X509_shift(chain)) != NULL) {
        if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) { X509_free(extra); ok = 0; }
    }
    sk_X509_pop_free(chain, X509_free);
    X509_free(cert);
    EVP_PKEY_free(key);
    return ok ? 1 : 0;
}

#endif
