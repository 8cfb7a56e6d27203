/* test_recover: recovery without restart through the C ABI, 4 ranks.
 *  1. Bad input to every recovery function, and agree refused under the
 *     default policy (abort).
 *  2. Revoke: on a split copy of the world, rank 0 revokes; the others'
 *     barrier fails with NEXAR_ERR_REVOKED naming rank 0, and every rank
 *     sees it revoked.
 *  3. Manual policy: rank 3 dies; the survivors' allreduce fails naming it;
 *     agree gives every survivor the AND of their flags and the failed
 *     list [3]; shrink gives a 3-rank communicator that computes right.
 *  4. Shrink policy on that communicator: its rank 2 dies; the survivors'
 *     next allreduce fails naming it, and the one after, on the same
 *     handle, runs on the 2 survivors.
 * Reads its place from NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_SEED and
 * NEXAR_TOKEN (tests/c/launch.sh). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

static const char* env(const char* name) {
    const char* v = getenv(name);
    EXPECT(v != NULL && *v != '\0', "%s is not set", name);
    return v;
}

static void expect_rc(nexar_result_t got, nexar_result_t want, const char* what) {
    EXPECT(got == want, "%s: %s (%s), want %s", what, nexar_result_string(got),
           nexar_last_error(), nexar_result_string(want));
}

/* past_barrier_then_die: after a barrier on c, victim exits (no goodbye)
 * once every other rank has told it that its barrier returned: a death is
 * seen at once on one host (the process is watched) and must not fail a
 * barrier that another rank is still finishing. */
static void past_barrier_then_die(nexar_comm_t c, int victim) {
    int me, n, one = 1;
    CK(nexar_comm_rank(c, &me));
    CK(nexar_comm_size(c, &n));
    if (me != victim) {
        CK(nexar_send(&one, 1, NEXAR_INT32, victim, 99, c));
        return;
    }
    for (int i = 0; i < n - 1; i++) {
        CK(nexar_recv(&one, 1, NEXAR_INT32, NEXAR_ANY_SOURCE, 99, c));
    }
    fflush(NULL);
    _exit(0); /* dies: no goodbye */
}

int main(void) {
    int rank = atoi(env("NEXAR_RANK")), size = atoi(env("NEXAR_WORLD_SIZE"));
    g_rank = rank;
    if (size != 4) {
        printf("test_recover: needs 4 ranks, skipped on %d\n", size);
        return 0;
    }
    const char* token = env("NEXAR_TOKEN");
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    cfg.rank = rank;
    cfg.world_size = size;
    cfg.seed_addr = env("NEXAR_SEED");
    cfg.token = token;
    cfg.token_len = strlen(token);
    cfg.timeout_ms = 60000;
    cfg.heartbeat_interval_ms = 200;
    cfg.heartbeat_timeout_ms = 1500;
    nexar_comm_t w;
    CK(nexar_comm_init(&cfg, &w));

    /* 1. Bad input. */
    nexar_failure_policy_t pol = NEXAR_ON_FAILURE_SHRINK;
    CK(nexar_comm_get_failure_policy(w, &pol));
    EXPECT(pol == NEXAR_ON_FAILURE_ABORT, "default policy %d", (int)pol);
    uint64_t flag = 1;
    expect_rc(nexar_comm_agree(w, &flag, NULL, 0, NULL), NEXAR_ERR_UNAVAILABLE, "agree under abort");
    nexar_comm_t nc = (nexar_comm_t)1;
    expect_rc(nexar_comm_shrink(w, &nc), NEXAR_ERR_UNAVAILABLE, "shrink under abort");
    EXPECT(nc == NEXAR_COMM_NULL, "shrink left newcomm %p", (void*)nc);
    expect_rc(nexar_comm_set_failure_policy(w, (nexar_failure_policy_t)7), NEXAR_ERR_INVALID_ARGUMENT,
              "policy 7");
    EXPECT(strstr(nexar_last_error(), "nexar_comm_set_failure_policy") != NULL, "%s", nexar_last_error());
    expect_rc(nexar_comm_get_failure_policy(w, NULL), NEXAR_ERR_INVALID_ARGUMENT, "policy NULL");
    expect_rc(nexar_comm_agree(w, NULL, NULL, 0, NULL), NEXAR_ERR_INVALID_ARGUMENT, "agree flag NULL");
    expect_rc(nexar_comm_agree(w, &flag, NULL, 4, &(size_t){0}), NEXAR_ERR_INVALID_ARGUMENT,
              "agree failed NULL with capacity");
    expect_rc(nexar_comm_shrink(w, NULL), NEXAR_ERR_INVALID_ARGUMENT, "shrink newcomm NULL");
    expect_rc(nexar_comm_is_revoked(w, NULL), NEXAR_ERR_INVALID_ARGUMENT, "is_revoked NULL");
    expect_rc(nexar_comm_revoke(NEXAR_COMM_NULL), NEXAR_ERR_INVALID_HANDLE, "revoke NULL handle");
    expect_rc(nexar_comm_agree((nexar_comm_t)0x1234, &flag, NULL, 0, NULL), NEXAR_ERR_INVALID_HANDLE,
              "agree bogus handle");
    CK(nexar_comm_set_failure_policy(w, NEXAR_ON_FAILURE_MANUAL));

    /* 2. Revoke, on a copy of the world. */
    nexar_comm_t dup;
    CK(nexar_comm_split(w, 0, rank, &dup));
    CK(nexar_comm_get_failure_policy(dup, &pol));
    EXPECT(pol == NEXAR_ON_FAILURE_MANUAL, "split child's policy %d", (int)pol);
    if (rank == 0) {
        CK(nexar_comm_revoke(dup));
        CK(nexar_comm_revoke(dup)); /* idempotent */
    } else {
        expect_rc(nexar_barrier(dup), NEXAR_ERR_REVOKED, "barrier on a revoked comm");
        EXPECT(strstr(nexar_last_error(), "revoked by rank 0") != NULL, "%s", nexar_last_error());
    }
    int revoked = 0;
    CK(nexar_comm_is_revoked(dup, &revoked));
    EXPECT(revoked == 1, "is_revoked %d", revoked);
    flag = ~(uint64_t)0;
    CK(nexar_comm_agree(dup, &flag, NULL, 0, NULL)); /* agree works on a revoked comm */
    EXPECT(flag == ~(uint64_t)0, "agree on the revoked comm: %llx", (unsigned long long)flag);
    CK(nexar_comm_destroy(dup));
    expect_rc(nexar_comm_revoke(dup), NEXAR_ERR_INVALID_HANDLE, "revoke a destroyed comm");
    expect_rc(nexar_comm_shrink(dup, &nc), NEXAR_ERR_INVALID_HANDLE, "shrink a destroyed comm");

    /* 3. Manual policy: rank 3 dies. */
    CK(nexar_barrier(w));
    past_barrier_then_die(w, 3);
    float x[4] = {1, 2, 3, 4};
    nexar_result_t r = nexar_allreduce(x, x, 4, NEXAR_FLOAT32, NEXAR_SUM, w);
    EXPECT((r == NEXAR_ERR_PEER_DOWN && strstr(nexar_last_error(), "rank 3") != NULL) ||
               r == NEXAR_ERR_REVOKED,
           "allreduce after the death: %s: %s", nexar_result_string(r), nexar_last_error());
    flag = ~((uint64_t)1 << rank);
    int failed[4] = {-1, -1, -1, -1};
    size_t nfailed = 0;
    CK(nexar_comm_agree(w, &flag, failed, 4, &nfailed));
    EXPECT(flag == ~(uint64_t)7, "agreed flag %llx, want ~7", (unsigned long long)flag);
    EXPECT(nfailed == 1 && failed[0] == 3, "agreed failed: %zu ranks, first %d", nfailed, failed[0]);
    nexar_comm_t s;
    CK(nexar_comm_shrink(w, &s));
    int srank, ssize;
    CK(nexar_comm_rank(s, &srank));
    CK(nexar_comm_size(s, &ssize));
    EXPECT(srank == rank && ssize == 3, "shrunk: rank %d of %d", srank, ssize);
    sum_check(s);
    r = nexar_barrier(w); /* failed for good: its first failure, or the revoke */
    EXPECT(r == NEXAR_ERR_PEER_DOWN || r == NEXAR_ERR_REVOKED, "the old world after the shrink: %s",
           nexar_result_string(r));

    /* 4. Shrink policy: the shrunk communicator's rank 2 dies. */
    CK(nexar_comm_set_failure_policy(s, NEXAR_ON_FAILURE_SHRINK));
    CK(nexar_barrier(s));
    past_barrier_then_die(s, 2);
    r = nexar_allreduce(x, x, 4, NEXAR_FLOAT32, NEXAR_SUM, s);
    EXPECT(r == NEXAR_ERR_PEER_DOWN || r == NEXAR_ERR_REVOKED, "allreduce meeting the death: %s: %s",
           nexar_result_string(r), nexar_last_error());
    sum_check(s); /* the same handle, now the 2 survivors */
    CK(nexar_comm_size(s, &ssize));
    EXPECT(ssize == 2, "size %d after the automatic shrink", ssize);
    CK(nexar_comm_destroy(s));
    CK(nexar_comm_destroy(w));
    printf("test_recover: rank %d: ok\n", rank);
    return 0;
}
