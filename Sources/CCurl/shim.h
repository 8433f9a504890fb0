// libcurl from Debian 12 apt. Wrappers below exist only where Swift cannot call the C API
// directly (function-like macros, variadic functions, pointer casts); see ../shared/INTEROP.md.
#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
#include <curl/curl.h>

// MARK: PushClient (Sources/PushClient/Curl.swift is the only Swift file that calls these)
// curl_easy_setopt / curl_multi_setopt / curl_easy_getinfo are variadic, which Swift cannot
// call: one typed wrapper per argument kind, never one per option.

// Options whose argument is a `long` (flags, timeouts, enum values).
static inline CURLcode ccurl_easy_setopt_long(CURL *h, CURLoption o, long v) { return curl_easy_setopt(h, o, v); }
// Options whose argument is a `curl_off_t` (CURLOPT_POSTFIELDSIZE_LARGE).
static inline CURLcode ccurl_easy_setopt_off_t(CURL *h, CURLoption o, curl_off_t v) { return curl_easy_setopt(h, o, v); }
// Options whose argument is a NUL-terminated string; libcurl copies strings (except POSTFIELDS,
// which we never use: COPYPOSTFIELDS copies, POSTFIELDS would keep a pointer into Swift memory).
static inline CURLcode ccurl_easy_setopt_string(CURL *h, CURLoption o, const char *v) { return curl_easy_setopt(h, o, v); }
// Options whose argument is an opaque pointer libcurl hands back to us (CURLOPT_PRIVATE,
// CURLOPT_WRITEDATA, CURLOPT_HEADERDATA) or an object it borrows (CURLOPT_HTTPHEADER's slist).
static inline CURLcode ccurl_easy_setopt_pointer(CURL *h, CURLoption o, void *v) { return curl_easy_setopt(h, o, v); }
// CURLOPT_WRITEFUNCTION and CURLOPT_HEADERFUNCTION share this callback type.
static inline CURLcode ccurl_easy_setopt_write_callback(CURL *h, CURLoption o, curl_write_callback cb) { return curl_easy_setopt(h, o, cb); }
// CURLINFO_* with a `long` result.
static inline CURLcode ccurl_easy_getinfo_long(CURL *h, CURLINFO i, long *out) { return curl_easy_getinfo(h, i, out); }
// CURLINFO_* with a `curl_off_t` result (CURLINFO_SIZE_UPLOAD_T).
static inline CURLcode ccurl_easy_getinfo_off_t(CURL *h, CURLINFO i, curl_off_t *out) { return curl_easy_getinfo(h, i, out); }
// CURLINFO_PRIVATE returns the pointer stored with CURLOPT_PRIVATE (declared as char *).
static inline CURLcode ccurl_easy_getinfo_pointer(CURL *h, CURLINFO i, void **out) { return curl_easy_getinfo(h, i, (char **)out); }
// CURLMOPT_* with a `long` argument.
static inline CURLMcode ccurl_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return curl_multi_setopt(m, o, v); }
// CURLMsg.data is an anonymous union; reading `result` through C avoids relying on how Swift
// imports it.
static inline CURLcode ccurl_msg_result(const CURLMsg *m) { return m->data.result; }
#endif
