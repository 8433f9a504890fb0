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
#endif
