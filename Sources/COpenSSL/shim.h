// OpenSSL 3.0 (Debian 12 libssl-dev). Function-like macros and variadic functions do not import
// into Swift; the static inline wrappers below exist only for those cases. Prefix: cossl_.
#ifndef COPENSSL_SHIM_H
#define COPENSSL_SHIM_H
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
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

// OPENSSL_free is a macro around CRYPTO_free with file/line.
static inline void cossl_free(void *p) { OPENSSL_free(p); }
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
#endif
