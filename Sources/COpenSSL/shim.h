#ifndef ATTEST_COPENSSL_SHIM_H
#define ATTEST_COPENSSL_SHIM_H
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>
#include <openssl/objects.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>

/* Macros and stack helpers that Swift cannot import directly. */
static inline void attest_openssl_free(void *p) { OPENSSL_free(p); }
static inline int attest_sk_X509_num(const STACK_OF(X509) *s) { return sk_X509_num(s); }
static inline STACK_OF(X509) *attest_sk_X509_new_null(void) { return sk_X509_new_null(); }
static inline int attest_sk_X509_push(STACK_OF(X509) *s, X509 *x) { return sk_X509_push(s, x); }
static inline void attest_sk_X509_free(STACK_OF(X509) *s) { sk_X509_free(s); }
static inline long attest_BIO_get_mem_data(BIO *b, char **pp) { return BIO_get_mem_data(b, pp); }
static inline X509 *attest_sk_X509_value(const STACK_OF(X509) *s, int i) { return sk_X509_value(s, i); }
static inline int attest_evp_pkey_public_key_selection(void) { return EVP_PKEY_PUBLIC_KEY; }
#endif
