// libcurl (Debian 12 libcurl4-openssl-dev), the client side's HTTP library (HTTPClient, for
// relayctl accessory send and send-test). curl_easy_setopt and curl_easy_getinfo are variadic,
// which Swift cannot call: the static inline wrappers below pass one typed argument each
// (CURLOPT_PROTOCOLS_STR and the other string options go through ccurl_setopt_string). Prefix: ccurl_.
#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
#include <curl/curl.h>

static inline CURLcode ccurl_setopt_long(CURL *c, CURLoption option, long value) {
    return curl_easy_setopt(c, option, value);
}
static inline CURLcode ccurl_setopt_string(CURL *c, CURLoption option, const char *value) {
    return curl_easy_setopt(c, option, value);
}
static inline CURLcode ccurl_setopt_pointer(CURL *c, CURLoption option, void *value) {
    return curl_easy_setopt(c, option, value);
}
// CURLOPT_WRITEFUNCTION / CURLOPT_HEADERFUNCTION take a function pointer.
typedef size_t (*ccurl_data_callback)(char *data, size_t size, size_t count, void *context);
static inline CURLcode ccurl_setopt_callback(CURL *c, CURLoption option, ccurl_data_callback callback) {
    return curl_easy_setopt(c, option, callback);
}
static inline long ccurl_response_code(CURL *c) {
    long code = 0;
    return curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK ? code : 0;
}
// The HTTP version used: CURL_HTTP_VERSION_1_1, CURL_HTTP_VERSION_2_0, ...
static inline long ccurl_http_version(CURL *c) {
    long version = 0;
    return curl_easy_getinfo(c, CURLINFO_HTTP_VERSION, &version) == CURLE_OK ? version : 0;
}
#endif
