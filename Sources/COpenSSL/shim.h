#ifndef ATTEST_COPENSSL_SHIM_H
#define ATTEST_COPENSSL_SHIM_H
#include <openssl/bn.h>
#include <openssl/cms.h>
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
#include <openssl/ssl.h>
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
static inline void attest_sk_X509_pop_free(STACK_OF(X509) *s) { sk_X509_pop_free(s, X509_free); }
static inline int attest_sk_CMS_SignerInfo_num(STACK_OF(CMS_SignerInfo) *s) { return sk_CMS_SignerInfo_num(s); }
/* An EC public key from an encoded point. Built in C because OSSL_PARAM keeps pointers to its
   key names, which must outlive the call: Swift would pass temporary copies of the macros. */
static inline EVP_PKEY *attest_ec_public_key_from_point(const char *group, const unsigned char *point, size_t length) {
    EVP_PKEY *pkey = NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, "EC", NULL);
    if (ctx == NULL) return NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_PKEY_PARAM_GROUP_NAME, (char *)group, 0),
        OSSL_PARAM_construct_octet_string(OSSL_PKEY_PARAM_PUB_KEY, (void *)point, length),
        OSSL_PARAM_construct_end(),
    };
    if (EVP_PKEY_fromdata_init(ctx) != 1 || EVP_PKEY_fromdata(ctx, &pkey, EVP_PKEY_PUBLIC_KEY, params) != 1) pkey = NULL;
    EVP_PKEY_CTX_free(ctx);
    return pkey;
}
#endif
