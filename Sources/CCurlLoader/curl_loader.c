// See include/ccurl_loader.h. A .c file because dlopen/dlsym and the calls through variadic
// function pointers are C; the pointers are written once under pthread_once, then only read.
#include "ccurl_loader.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static CURLcode (*p_global_init)(long);
static CURL *(*p_easy_init)(void);
static void (*p_easy_cleanup)(CURL *);
static CURLcode (*p_easy_setopt)(CURL *, CURLoption, ...);
static CURLcode (*p_easy_getinfo)(CURL *, CURLINFO, ...);
static const char *(*p_easy_strerror)(CURLcode);
static CURLM *(*p_multi_init)(void);
static CURLMcode (*p_multi_cleanup)(CURLM *);
static CURLMcode (*p_multi_setopt)(CURLM *, CURLMoption, ...);
static CURLMcode (*p_multi_add_handle)(CURLM *, CURL *);
static CURLMcode (*p_multi_remove_handle)(CURLM *, CURL *);
static CURLMcode (*p_multi_perform)(CURLM *, int *);
static CURLMcode (*p_multi_poll)(CURLM *, struct curl_waitfd *, unsigned int, int, int *);
static CURLMcode (*p_multi_wakeup)(CURLM *);
static const char *(*p_multi_strerror)(CURLMcode);
static CURLMsg *(*p_multi_info_read)(CURLM *, int *);
static struct curl_slist *(*p_slist_append)(struct curl_slist *, const char *);
static void (*p_slist_free_all)(struct curl_slist *);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded = 0;
static char load_error[256];

#define RESOLVE(handle, pointer, name) \
    do { *(void **)(&pointer) = dlsym(handle, name); \
         if (!pointer) { snprintf(load_error, sizeof load_error, "libcurl.so.4 has no %s", name); return; } } while (0)

static void load_once(void) {
    // RTLD_LOCAL: libcurl's symbols stay out of the global namespace (libpq, OpenSSL users).
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error, "cannot load libcurl.so.4 (Debian: apt install libcurl4): %s", e ? e : "unknown");
        return;
    }
    RESOLVE(h, p_global_init, "curl_global_init");
    RESOLVE(h, p_easy_init, "curl_easy_init");
    RESOLVE(h, p_easy_cleanup, "curl_easy_cleanup");
    RESOLVE(h, p_easy_setopt, "curl_easy_setopt");
    RESOLVE(h, p_easy_getinfo, "curl_easy_getinfo");
    RESOLVE(h, p_easy_strerror, "curl_easy_strerror");
    RESOLVE(h, p_multi_init, "curl_multi_init");
    RESOLVE(h, p_multi_cleanup, "curl_multi_cleanup");
    RESOLVE(h, p_multi_setopt, "curl_multi_setopt");
    RESOLVE(h, p_multi_add_handle, "curl_multi_add_handle");
    RESOLVE(h, p_multi_remove_handle, "curl_multi_remove_handle");
    RESOLVE(h, p_multi_perform, "curl_multi_perform");
    RESOLVE(h, p_multi_poll, "curl_multi_poll");
    RESOLVE(h, p_multi_wakeup, "curl_multi_wakeup");
    RESOLVE(h, p_multi_strerror, "curl_multi_strerror");
    RESOLVE(h, p_multi_info_read, "curl_multi_info_read");
    RESOLVE(h, p_slist_append, "curl_slist_append");
    RESOLVE(h, p_slist_free_all, "curl_slist_free_all");
    CURLcode rc = p_global_init(CURL_GLOBAL_DEFAULT);
    if (rc != CURLE_OK) {
        snprintf(load_error, sizeof load_error, "curl_global_init: %s", p_easy_strerror(rc));
        return;
    }
    loaded = 1;
}

int ccurld_load(char *error, size_t error_len) {
    pthread_once(&once, load_once);
    if (!loaded && error && error_len > 0) snprintf(error, error_len, "%s", load_error);
    return loaded;
}

CURL *ccurld_easy_init(void) { return p_easy_init(); }
void ccurld_easy_cleanup(CURL *c) { p_easy_cleanup(c); }
CURLcode ccurld_setopt_long(CURL *c, CURLoption o, long v) { return p_easy_setopt(c, o, v); }
CURLcode ccurld_setopt_string(CURL *c, CURLoption o, const char *v) { return p_easy_setopt(c, o, v); }
CURLcode ccurld_setopt_pointer(CURL *c, CURLoption o, void *v) { return p_easy_setopt(c, o, v); }
CURLcode ccurld_setopt_offset(CURL *c, CURLoption o, curl_off_t v) { return p_easy_setopt(c, o, v); }
CURLcode ccurld_setopt_callback(CURL *c, CURLoption o, ccurld_data_callback v) { return p_easy_setopt(c, o, v); }
long ccurld_response_code(CURL *c) {
    long code = 0;
    return p_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK ? code : 0;
}
const char *ccurld_easy_strerror(CURLcode code) { return p_easy_strerror(code); }

CURLM *ccurld_multi_init(void) { return p_multi_init(); }
CURLMcode ccurld_multi_cleanup(CURLM *m) { return p_multi_cleanup(m); }
CURLMcode ccurld_multi_setopt_long(CURLM *m, CURLMoption o, long v) { return p_multi_setopt(m, o, v); }
CURLMcode ccurld_multi_add_handle(CURLM *m, CURL *c) { return p_multi_add_handle(m, c); }
CURLMcode ccurld_multi_remove_handle(CURLM *m, CURL *c) { return p_multi_remove_handle(m, c); }
CURLMcode ccurld_multi_perform(CURLM *m, int *running) { return p_multi_perform(m, running); }
CURLMcode ccurld_multi_poll(CURLM *m, int timeout_ms, int *numfds) { return p_multi_poll(m, NULL, 0, timeout_ms, numfds); }
CURLMcode ccurld_multi_wakeup(CURLM *m) { return p_multi_wakeup(m); }
const char *ccurld_multi_strerror(CURLMcode code) { return p_multi_strerror(code); }
int ccurld_multi_next_done(CURLM *m, CURL **easy, CURLcode *result) {
    int left = 0;
    CURLMsg *msg;
    while ((msg = p_multi_info_read(m, &left)) != NULL) {
        if (msg->msg == CURLMSG_DONE) {
            *easy = msg->easy_handle;
            *result = msg->data.result;
            return 1;
        }
    }
    return 0;
}

struct curl_slist *ccurld_slist_append(struct curl_slist *l, const char *line) { return p_slist_append(l, line); }
void ccurld_slist_free_all(struct curl_slist *l) { p_slist_free_all(l); }
