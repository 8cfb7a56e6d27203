/* test_rpc: every rank serves function 1 (echo, prefixed with "<rank><-<from>:"),
 * function 2 (fails with NEXAR_ERR_UNAVAILABLE and a message) and function 3
 * (sleeps 2 s), then calls every rank, itself too, blocking, with a deadline
 * non-blocking and into the caller's buffer (nexar_rpc_call_into, 1 MiB
 * too). Unknown functions, handler errors, deadlines and bad
 * arguments come back as errors on every form. Run under the launcher. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static nexar_result_t slow(nexar_comm_t comm, int from, uint32_t fn, const void* req,
                           size_t req_len, void** reply, size_t* reply_len, void* user) {
    (void)comm;
    (void)from;
    (void)fn;
    (void)req;
    (void)req_len;
    (void)reply;
    (void)reply_len;
    (void)user;
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    return NEXAR_SUCCESS;
}

/* lent_echo serves function 5 with nexar_rpc_register_lent: the reply is
 * lent from a static buffer (the request, copied), released through
 * count_release; function 6 fails with a lent message. */
static int released; /* lent replies released (atomic) */
static char lent_buf[1 << 20];
static char lent_msg[] = "lent refusal";

static void count_release(void* owner) {
    EXPECT(owner == lent_buf || owner == lent_msg, "release of a wrong owner");
    __atomic_add_fetch(&released, 1, __ATOMIC_SEQ_CST);
}

static nexar_result_t lent_echo(nexar_comm_t comm, int from, uint32_t fn, const void* req, size_t req_len,
                                nexar_rpc_reply_t* reply, void* user) {
    (void)comm;
    (void)from;
    (void)user;
    EXPECT(reply->data == NULL && reply->len == 0 && reply->release == NULL, "reply not zeroed");
    if (fn == 6) {
        reply->data = lent_msg;
        reply->release = count_release;
        reply->owner = lent_msg;
        return NEXAR_ERR_UNAVAILABLE;
    }
    EXPECT(req_len <= sizeof lent_buf, "request of %zu bytes", req_len);
    if (req_len > 0) {
        memcpy(lent_buf, req, req_len);
    }
    reply->data = lent_buf;
    reply->len = req_len;
    reply->release = count_release;
    reply->owner = lent_buf;
    return NEXAR_SUCCESS;
}

/* lent_checks: nexar_rpc_register_lent's handlers against peer, one call
 * at a time (lent_buf is shared), each reply released once. */
static void lent_checks(nexar_comm_t c, int rank, int peer) {
    enum { BIG = 1 << 20 };
    char* req = malloc(BIG);
    EXPECT(req != NULL, "no memory");
    for (size_t i = 0; i < BIG; i++) {
        req[i] = (char)(i * 13 + (size_t)rank);
    }
    void* reply = NULL;
    size_t len = 0;
    CK(nexar_rpc_call(c, peer, 5, req, BIG, &reply, &len));
    EXPECT(len == BIG && memcmp(reply, req, BIG) == 0, "lent 1 MiB echo: %zu bytes", len);
    nexar_free(reply);
    CK(nexar_rpc_call(c, peer, 5, "ab", 2, &reply, &len));
    EXPECT(len == 2 && memcmp(reply, "ab", 2) == 0, "lent echo: %zu bytes", len);
    nexar_free(reply);
    nexar_result_t r = nexar_rpc_call(c, peer, 6, NULL, 0, &reply, &len);
    EXPECT(r == NEXAR_ERR_UNAVAILABLE && strstr(nexar_last_error(), "lent refusal") != NULL,
           "lent refusal: %s: %s", nexar_result_string(r), nexar_last_error());
    free(req);
}

/* die ends this process in the middle of a call (exit status 0: the test
 * wants the caller to see a lost peer). */
static nexar_result_t die(nexar_comm_t comm, int from, uint32_t fn, const void* req, size_t req_len,
                          void** reply, size_t* reply_len, void* user) {
    (void)comm;
    (void)from;
    (void)fn;
    (void)req;
    (void)req_len;
    (void)reply;
    (void)reply_len;
    (void)user;
    printf("rank %d: test_rpc ok (exiting in a call)\n", g_rank);
    fflush(stdout);
    _exit(0);
}

/* into is the nexar_rpc_alloc_t of into_checks: a fixed buffer, handed
 * out when the reply fits, and a count of the calls. */
struct into {
    char* buf;
    size_t cap;
    int calls;
    size_t asked;
};

static void* into_alloc(size_t len, void* user) {
    struct into* in = user;
    in->calls++;
    in->asked = len;
    return len <= in->cap ? in->buf : NULL;
}

/* into_checks: nexar_rpc_call_into against peer: a small and a 1 MiB reply
 * into the caller's buffer, a buffer too small, errors that never call
 * alloc, bad arguments. */
static void into_checks(nexar_comm_t c, int rank, int peer) {
    enum { BIG = 1 << 20 };
    char* req = malloc(BIG);
    char* buf = malloc(BIG + 64);
    EXPECT(req != NULL && buf != NULL, "no memory");
    for (size_t i = 0; i < BIG; i++) {
        req[i] = (char)(i * 31 + (size_t)rank);
    }
    char head[32];
    int n = snprintf(head, sizeof head, "%d<-%d:", peer, rank);
    for (int round = 0; round < 3; round++) { /* again: the library reuses its buffers */
        struct into in = {buf, BIG + 64, 0, 0};
        size_t len = 0;
        CK(nexar_rpc_call_into(c, peer, 1, req, BIG, 0, into_alloc, &in, &len));
        EXPECT(in.calls == 1 && len == (size_t)n + BIG && in.asked == len && memcmp(buf, head, (size_t)n) == 0 &&
                   memcmp(buf + n, req, BIG) == 0,
               "call_into 1 MiB (round %d): %d allocs, len %zu, reply %s", round, in.calls, len,
               memcmp(buf + n, req, BIG) == 0 ? "right" : "wrong");
    }
    struct into small = {buf, 4, 0, 0};
    size_t len = 0;
    nexar_result_t r = nexar_rpc_call_into(c, peer, 1, "abc", 3, 0, into_alloc, &small, &len);
    EXPECT(r == NEXAR_ERR_TRUNCATED && small.calls == 1 && len == (size_t)n + 3 &&
               strstr(nexar_last_error(), "function 1") != NULL,
           "call_into, buffer too small: %s, %d allocs, len %zu: %s", nexar_result_string(r), small.calls, len,
           nexar_last_error());
    struct into none = {buf, BIG, 0, 0};
    r = nexar_rpc_call_into(c, peer, 2, NULL, 0, 0, into_alloc, &none, &len);
    EXPECT(r == NEXAR_ERR_UNAVAILABLE && none.calls == 0 && strstr(nexar_last_error(), "no model loaded") != NULL,
           "call_into refusing handler: %s, %d allocs: %s", nexar_result_string(r), none.calls, nexar_last_error());
    r = nexar_rpc_call_into(c, peer, 9, "x", 1, 0, into_alloc, &none, &len);
    EXPECT(r == NEXAR_ERR_INVALID_ARGUMENT && none.calls == 0 && strstr(nexar_last_error(), "no handler for function 9"),
           "call_into unknown function: %s: %s", nexar_result_string(r), nexar_last_error());
    r = nexar_rpc_call_into(c, peer, 3, NULL, 0, 200, into_alloc, &none, &len);
    EXPECT(r == NEXAR_ERR_TIMEOUT && none.calls == 0, "call_into past its deadline: %s", nexar_result_string(r));
    EXPECT(nexar_rpc_call_into(c, peer, 1, NULL, 0, 0, NULL, &none, &len) == NEXAR_ERR_INVALID_ARGUMENT &&
               strstr(nexar_last_error(), "alloc") != NULL,
           "call_into without alloc: %s", nexar_last_error());
    EXPECT(nexar_rpc_call_into(c, peer, 1, NULL, 0, 0, into_alloc, &none, NULL) == NEXAR_ERR_INVALID_ARGUMENT,
           "call_into without reply_len");
    free(req);
    free(buf);
}

/* icall_checks: the non-blocking form and the deadline, against peer. */
static void icall_checks(nexar_comm_t c, int rank, int peer) {
    enum { N = 8 };
    nexar_request_t reqs[N];
    void* replies[N];
    size_t lens[N];
    char bufs[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(bufs[i], sizeof bufs[i], "i%d", i);
        CK(nexar_rpc_icall(c, peer, 1, bufs[i], strlen(bufs[i]), 0, &replies[i], &lens[i], &reqs[i]));
        EXPECT(replies[i] == NULL && lens[i] == 0, "icall: reply set before completion");
    }
    /* Some by polling, the rest by waitall. */
    int done = 0;
    while (!done) {
        CK(nexar_test(reqs[0], &done));
    }
    nexar_result_t results[N];
    CK(nexar_waitall(N, reqs, results));
    for (int i = 0; i < N; i++) {
        char want[48];
        snprintf(want, sizeof want, "%d<-%d:%s", peer, rank, bufs[i]);
        EXPECT(results[i] == NEXAR_SUCCESS && lens[i] == strlen(want) && memcmp(replies[i], want, lens[i]) == 0,
               "icall %d: reply %.*s, want %s", i, (int)lens[i], replies[i] ? (char*)replies[i] : "", want);
        nexar_free(replies[i]);
        CK(nexar_request_free(reqs[i]));
    }
    /* Errors come back through the request. */
    nexar_request_t q;
    void* reply = NULL;
    size_t len = 0;
    CK(nexar_rpc_icall(c, peer, 2, NULL, 0, 0, &reply, &len, &q));
    nexar_result_t r = nexar_wait(q);
    EXPECT(r == NEXAR_ERR_UNAVAILABLE && strstr(nexar_last_error(), "no model loaded") != NULL && reply == NULL,
           "icall refusing handler: %s: %s", nexar_result_string(r), nexar_last_error());
    EXPECT(nexar_wait(q) == NEXAR_ERR_UNAVAILABLE, "icall: waiting again gives another result");
    CK(nexar_request_free(q));
    CK(nexar_rpc_icall(c, peer, 9, "x", 1, 0, &reply, &len, &q));
    r = nexar_wait(q);
    EXPECT(r == NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "no handler for function 9"),
           "icall unknown function: %s: %s", nexar_result_string(r), nexar_last_error());
    CK(nexar_request_free(q));
    /* Deadlines: 200 ms against a 2 s handler, blocking and not. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r = nexar_rpc_call_timeout(c, peer, 3, NULL, 0, 200, &reply, &len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    EXPECT(r == NEXAR_ERR_TIMEOUT && took < 1.5 && strstr(nexar_last_error(), "function 3") != NULL,
           "call_timeout: %s after %.2f s: %s", nexar_result_string(r), took, nexar_last_error());
    CK(nexar_rpc_icall(c, peer, 3, NULL, 0, 200, &reply, &len, &q));
    struct timespec nap = {0, 400 * 1000 * 1000};
    nanosleep(&nap, NULL); /* nobody waits: the deadline ends it anyway */
    done = 0;
    r = nexar_test(q, &done);
    EXPECT(done == 1 && r == NEXAR_ERR_TIMEOUT, "icall past its deadline: done %d, %s", done, nexar_result_string(r));
    CK(nexar_request_free(q));
    EXPECT(nexar_rpc_call_timeout(c, peer, 1, NULL, 0, -1, &reply, &len) == NEXAR_ERR_INVALID_ARGUMENT &&
               strstr(nexar_last_error(), "nexar_rpc_call_timeout") != NULL,
           "negative timeout: %s", nexar_last_error());
    EXPECT(nexar_rpc_icall(c, peer, 1, NULL, 0, 0, &reply, &len, NULL) == NEXAR_ERR_INVALID_ARGUMENT,
           "icall without a request pointer");
    /* A call with a deadline that succeeds. */
    CK(nexar_rpc_call_timeout(c, peer, 1, "t", 1, 10000, &reply, &len));
    EXPECT(len > 0 && ((char*)reply)[len - 1] == 't', "call_timeout reply");
    nexar_free(reply);
}

int main(void) {
    int rank, size;
    nexar_comm_t c = init_world(&rank, &size);
    CK(nexar_rpc_register(c, 1, echo, &served));
    CK(nexar_rpc_register(c, 2, refuse, NULL));
    CK(nexar_rpc_register(c, 3, slow, NULL));
    CK(nexar_rpc_register(c, 4, die, NULL));
    CK(nexar_rpc_register_lent(c, 5, lent_echo, NULL));
    CK(nexar_rpc_register_lent(c, 6, lent_echo, NULL));
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
        icall_checks(c, rank, peer);
        into_checks(c, rank, peer);
    }
    /* Lent replies, one rank calling at a time (lent_buf is per process). */
    for (int caller = 0; caller < size; caller++) {
        if (caller == rank) {
            for (int peer = 0; peer < size; peer++) {
                lent_checks(c, rank, peer);
            }
        }
        CK(nexar_barrier(c));
    }
    /* Every call served here released its reply once: 3 per caller. */
    for (int i = 0; i < 1000 && __atomic_load_n(&released, __ATOMIC_SEQ_CST) < 3 * size; i++) {
        struct timespec ms = {0, 1000 * 1000};
        nanosleep(&ms, NULL);
    }
    EXPECT(__atomic_load_n(&released, __ATOMIC_SEQ_CST) == 3 * size, "%d lent replies released, want %d",
           __atomic_load_n(&released, __ATOMIC_SEQ_CST), 3 * size);
    void* reply = NULL;
    size_t len = 0;
    EXPECT(nexar_rpc_call(c, size, 1, NULL, 0, &reply, &len) == NEXAR_ERR_INVALID_ARGUMENT, "peer out of range");
    EXPECT(nexar_rpc_call(c, 0, 1, NULL, 4, &reply, &len) == NEXAR_ERR_INVALID_ARGUMENT, "NULL request");
    EXPECT(nexar_rpc_call(c, 0, 1, NULL, 0, NULL, &len) == NEXAR_ERR_INVALID_ARGUMENT, "NULL reply");
    nexar_free(NULL);
    CK(nexar_barrier(c)); /* nobody destroys while others still call it */
    /* A peer lost in the middle of a call: every form fails naming it. */
    if (size >= 2 && rank == size - 1) {
        struct timespec wait = {30, 0};
        nanosleep(&wait, NULL); /* rank 0's call ends this process first */
        fprintf(stderr, "rank %d: nobody called function 4\n", rank);
        return 1;
    }
    if (size >= 2 && rank == 0) {
        nexar_request_t q;
        CK(nexar_rpc_icall(c, size - 1, 4, NULL, 0, 20000, &reply, &len, &q));
        nexar_result_t r = nexar_wait(q);
        EXPECT(r == NEXAR_ERR_PEER_DOWN, "icall to a rank that died: %s: %s", nexar_result_string(r),
               nexar_last_error());
        CK(nexar_request_free(q));
        r = nexar_rpc_call_timeout(c, size - 1, 1, NULL, 0, 5000, &reply, &len);
        EXPECT(r == NEXAR_ERR_PEER_DOWN, "call_timeout to a dead rank: %s: %s", nexar_result_string(r),
               nexar_last_error());
        r = nexar_rpc_call(c, size - 1, 1, NULL, 0, &reply, &len);
        EXPECT(r == NEXAR_ERR_PEER_DOWN, "call to a dead rank: %s: %s", nexar_result_string(r), nexar_last_error());
        struct into none = {NULL, 0, 0, 0};
        r = nexar_rpc_call_into(c, size - 1, 1, NULL, 0, 0, into_alloc, &none, &len);
        EXPECT(r == NEXAR_ERR_PEER_DOWN && none.calls == 0, "call_into to a dead rank: %s: %s",
               nexar_result_string(r), nexar_last_error());
    }
    CK(nexar_comm_destroy(c));
    EXPECT(nexar_rpc_register(c, 1, echo, NULL) == NEXAR_ERR_INVALID_HANDLE, "register on a destroyed comm");
    EXPECT(nexar_rpc_call(c, 0, 1, NULL, 0, &reply, &len) == NEXAR_ERR_INVALID_HANDLE, "call on a destroyed comm");
    printf("rank %d/%d: test_rpc ok\n", rank, size);
    return 0;
}
