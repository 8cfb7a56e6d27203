/* test_rpc: every rank serves function 1 (echo, prefixed with "<rank><-<from>:")
 * and function 2 (fails with NEXAR_ERR_UNAVAILABLE and a message), then
 * calls every rank, itself too. Unknown functions, handler errors and bad
 * arguments come back as errors. Run under the launcher. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

static int served;

static nexar_result_t echo(nexar_comm_t comm, int from, uint32_t fn, const void* req,
                           size_t req_len, void** reply, size_t* reply_len, void* user) {
    (void)comm;
    EXPECT(fn == 1 && user == (void*)&served, "echo called for function %u", (unsigned)fn);
    char head[32];
    int n = snprintf(head, sizeof head, "%d<-%d:", g_rank, from);
    char* out = malloc((size_t)n + req_len);
    if (out == NULL) {
        return NEXAR_ERR_INTERNAL;
    }
    memcpy(out, head, (size_t)n);
    if (req_len > 0) {
        memcpy(out + n, req, req_len);
    }
    *reply = out;
    *reply_len = (size_t)n + req_len;
    return NEXAR_SUCCESS;
}

static nexar_result_t refuse(nexar_comm_t comm, int from, uint32_t fn, const void* req,
                             size_t req_len, void** reply, size_t* reply_len, void* user) {
    (void)comm;
    (void)from;
    (void)fn;
    (void)req;
    (void)req_len;
    (void)reply_len;
    (void)user;
    const char* msg = "no model loaded";
    *reply = malloc(strlen(msg) + 1);
    if (*reply != NULL) {
        memcpy(*reply, msg, strlen(msg) + 1);
    }
    return NEXAR_ERR_UNAVAILABLE;
}

int main(void) {
    nexar_comm_t c;
    CK(nexar_comm_init_from_env(&c));
    int rank, size;
    CK(nexar_comm_rank(c, &rank));
    CK(nexar_comm_size(c, &size));
    g_rank = rank;
    CK(nexar_rpc_register(c, 1, echo, &served));
    CK(nexar_rpc_register(c, 2, refuse, NULL));
    CK(nexar_barrier(c)); /* every handler is registered */
    for (int peer = 0; peer < size; peer++) {
        char req[16], want[48];
        snprintf(req, sizeof req, "hi %d", peer);
        snprintf(want, sizeof want, "%d<-%d:%s", peer, rank, req);
        void* reply = NULL;
        size_t len = 0;
        CK(nexar_rpc_call(c, peer, 1, req, strlen(req), &reply, &len));
        EXPECT(len == strlen(want) && memcmp(reply, want, len) == 0, "reply %.*s, want %s", (int)len,
               (char*)reply, want);
        nexar_free(reply);
        nexar_result_t r = nexar_rpc_call(c, peer, 2, NULL, 0, &reply, &len);
        EXPECT(r == NEXAR_ERR_UNAVAILABLE && strstr(nexar_last_error(), "no model loaded") != NULL &&
                   reply == NULL,
               "refusing handler: %s: %s", nexar_result_string(r), nexar_last_error());
        r = nexar_rpc_call(c, peer, 9, "x", 1, &reply, &len);
        EXPECT(r == NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "no handler for function 9"),
               "unknown function: %s: %s", nexar_result_string(r), nexar_last_error());
    }
    void* reply = NULL;
    size_t len = 0;
    EXPECT(nexar_rpc_call(c, size, 1, NULL, 0, &reply, &len) == NEXAR_ERR_INVALID_ARGUMENT, "peer out of range");
    EXPECT(nexar_rpc_call(c, 0, 1, NULL, 4, &reply, &len) == NEXAR_ERR_INVALID_ARGUMENT, "NULL request");
    EXPECT(nexar_rpc_call(c, 0, 1, NULL, 0, NULL, &len) == NEXAR_ERR_INVALID_ARGUMENT, "NULL reply");
    nexar_free(NULL);
    CK(nexar_barrier(c)); /* nobody destroys while others still call it */
    CK(nexar_comm_destroy(c));
    EXPECT(nexar_rpc_register(c, 1, echo, NULL) == NEXAR_ERR_INVALID_HANDLE, "register on a destroyed comm");
    EXPECT(nexar_rpc_call(c, 0, 1, NULL, 0, &reply, &len) == NEXAR_ERR_INVALID_HANDLE, "call on a destroyed comm");
    printf("rank %d/%d: test_rpc ok\n", rank, size);
    return 0;
}
