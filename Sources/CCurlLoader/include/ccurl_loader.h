// libcurl loaded with dlopen, only when a relay has webhooks configured (RelayCore's
// WebhookTransport). relay-server must not link libcurl: its dependency tree (GnuTLS, Kerberos,
// LDAP, libssh2, librtmp...) costs resident memory in every relay process (docs/storage.md,
// "Memory"; Tests/IntegrationTests/LinkageTests.swift). curl.h is included for its types and
// constants only; every call goes through a pointer that ccurld_load resolved. The variadic
// curl_easy_setopt / curl_multi_setopt / curl_easy_getinfo get one typed wrapper per argument
// kind, as in Sources/CCurl/shim.h. Prefix: ccurld_.
#ifndef CCURL_LOADER_H
#define CCURL_LOADER_H
#include <stddef.h>
#include <curl/curl.h>

// Loads libcurl.so.4 and resolves every function below, once per process (thread-safe);
// curl_global_init runs once after. Returns 1 when loaded; 0 with the reason in `error`.
int ccurld_load(char *error, size_t error_len);

CURL *ccurld_easy_init(void);
void ccurld_easy_cleanup(CURL *c);
CURLcode ccurld_setopt_long(CURL *c, CURLoption option, long value);
CURLcode ccurld_setopt_string(CURL *c, CURLoption option, const char *value);
CURLcode ccurld_setopt_pointer(CURL *c, CURLoption option, void *value);
CURLcode ccurld_setopt_offset(CURL *c, CURLoption option, curl_off_t value);
typedef size_t (*ccurld_data_callback)(char *data, size_t size, size_t count, void *context);
CURLcode ccurld_setopt_callback(CURL *c, CURLoption option, ccurld_data_callback callback);
// CURLINFO_RESPONSE_CODE (0 when none arrived) and CURLINFO_HTTP_VERSION (CURL_HTTP_VERSION_*).
long ccurld_response_code(CURL *c);
const char *ccurld_easy_strerror(CURLcode code);

CURLM *ccurld_multi_init(void);
CURLMcode ccurld_multi_cleanup(CURLM *m);
CURLMcode ccurld_multi_setopt_long(CURLM *m, CURLMoption option, long value);
CURLMcode ccurld_multi_add_handle(CURLM *m, CURL *c);
CURLMcode ccurld_multi_remove_handle(CURLM *m, CURL *c);
CURLMcode ccurld_multi_perform(CURLM *m, int *running);
CURLMcode ccurld_multi_poll(CURLM *m, int timeout_ms, int *numfds);
CURLMcode ccurld_multi_wakeup(CURLM *m);
const char *ccurld_multi_strerror(CURLMcode code);
// The next finished transfer: 1 with its handle and result, 0 when none is left. (CURLMsg's
// result sits in a union, read here rather than through Swift's import of it.)
int ccurld_multi_next_done(CURLM *m, CURL **easy, CURLcode *result);

struct curl_slist *ccurld_slist_append(struct curl_slist *list, const char *line);
void ccurld_slist_free_all(struct curl_slist *list);
#endif
