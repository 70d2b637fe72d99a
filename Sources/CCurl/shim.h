#ifndef ATTEST_CCURL_SHIM_H
#define ATTEST_CCURL_SHIM_H
#include <stddef.h>
#include <curl/curl.h>
/* The curl driver maps epoll's event flags to curl's; Swift's Glibc module does not export
 * this header. */
#include <sys/epoll.h>

/* Swift cannot call C variadic functions: curl_easy_setopt, curl_multi_setopt and
 * curl_easy_getinfo get one fixed-signature wrapper per argument type the
 * UpstreamClient target passes. Macros built from other macros become constants. */

static inline CURLcode attest_curl_easy_setopt_long(CURL *h, CURLoption o, long v) {
    return curl_easy_setopt(h, o, v);
}
static inline CURLcode attest_curl_easy_setopt_off(CURL *h, CURLoption o, curl_off_t v) {
    return curl_easy_setopt(h, o, v);
}
static inline CURLcode attest_curl_easy_setopt_string(CURL *h, CURLoption o, const char *v) {
    return curl_easy_setopt(h, o, v);
}
static inline CURLcode attest_curl_easy_setopt_pointer(CURL *h, CURLoption o, void *v) {
    return curl_easy_setopt(h, o, v);
}
static inline CURLcode attest_curl_easy_setopt_slist(CURL *h, CURLoption o, struct curl_slist *v) {
    return curl_easy_setopt(h, o, v);
}
/* CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION share this prototype. */
static inline CURLcode attest_curl_easy_setopt_write_function(CURL *h, CURLoption o, curl_write_callback f) {
    return curl_easy_setopt(h, o, f);
}
static inline CURLcode attest_curl_easy_setopt_read_function(CURL *h, curl_read_callback f) {
    return curl_easy_setopt(h, CURLOPT_READFUNCTION, f);
}
static inline CURLcode attest_curl_easy_setopt_seek_function(CURL *h, curl_seek_callback f) {
    return curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, f);
}
/* Every connection socket curl opens and closes passes through these (the curl driver keeps an
 * idle pooled connection in its epoll set and must see it close). */
static inline CURLcode attest_curl_easy_setopt_opensocket_function(CURL *h, curl_opensocket_callback f) {
    return curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, f);
}
static inline CURLcode attest_curl_easy_setopt_closesocket_function(CURL *h, curl_closesocket_callback f) {
    return curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, f);
}
/* A blob that curl copies (CURL_BLOB_COPY): the caller's buffer may go away afterwards. */
static inline CURLcode attest_curl_easy_setopt_blob_copy(CURL *h, CURLoption o, const void *data, size_t length) {
    struct curl_blob blob;
    blob.data = (void *)data;
    blob.len = length;
    blob.flags = CURL_BLOB_COPY;
    return curl_easy_setopt(h, o, &blob);
}

static inline CURLcode attest_curl_easy_getinfo_pointer(CURL *h, CURLINFO i, void **out) {
    return curl_easy_getinfo(h, i, out);
}
static inline CURLcode attest_curl_easy_getinfo_long(CURL *h, CURLINFO i, long *out) {
    return curl_easy_getinfo(h, i, out);
}

static inline CURLMcode attest_curl_multi_setopt_long(CURLM *m, CURLMoption o, long v) {
    return curl_multi_setopt(m, o, v);
}
static inline CURLMcode attest_curl_multi_setopt_pointer(CURLM *m, CURLMoption o, void *v) {
    return curl_multi_setopt(m, o, v);
}
static inline CURLMcode attest_curl_multi_setopt_socket_function(CURLM *m, curl_socket_callback f) {
    return curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, f);
}
static inline CURLMcode attest_curl_multi_setopt_timer_function(CURLM *m, curl_multi_timer_callback f) {
    return curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, f);
}

/* CURLMsg keeps its result in an anonymous union. */
static inline CURLcode attest_curl_msg_result(const CURLMsg *m) { return m->data.result; }

/* The built-in default CA bundle (CURLOPT_CAINFO's default), or NULL. */
static inline const char *attest_curl_default_cainfo(void) {
    const curl_version_info_data *info = curl_version_info(CURLVERSION_NOW);
    return (info != NULL && info->age >= CURLVERSION_SEVENTH) ? info->cainfo : NULL;
}

static const long attest_CURL_GLOBAL_DEFAULT = CURL_GLOBAL_DEFAULT;
static const int attest_CURLPAUSE_RECV = CURLPAUSE_RECV;
static const int attest_CURLPAUSE_CONT = CURLPAUSE_CONT;
static const curl_socket_t attest_CURL_SOCKET_TIMEOUT = CURL_SOCKET_TIMEOUT;
static const curl_socket_t attest_CURL_SOCKET_BAD = CURL_SOCKET_BAD;
static const long attest_CURLPIPE_MULTIPLEX = CURLPIPE_MULTIPLEX;
static const long attest_CURL_HTTP_VERSION_2TLS = CURL_HTTP_VERSION_2TLS;
static const long attest_CURL_HTTP_VERSION_1_1 = CURL_HTTP_VERSION_1_1;
static const size_t attest_CURL_WRITEFUNC_PAUSE = CURL_WRITEFUNC_PAUSE;
static const size_t attest_CURL_READFUNC_ABORT = CURL_READFUNC_ABORT;

#endif
