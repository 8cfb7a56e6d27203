/* test_grow: growth through the C ABI, 3 ranks and a process started later.
 *  1. Bad input to nexar_comm_grow, nexar_comm_join and
 *     nexar_comm_get_join_addrs; a joiner with the wrong token is refused.
 *  2. With NEXAR_MAX_WORLD_SIZE=4, rank 1 starts this program again as a joiner (NEXAR_JOIN=1, the
 *     members' lobby addresses as NEXAR_SEED; it joins through
 *     nexar_comm_init_from_env). The members grow until it is in (a grow
 *     with nobody waiting keeps the members): a 4-rank world, the joiner
 *     rank 3, that computes right; the old world still works.
 * Reads its place from NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_SEED and
 * NEXAR_TOKEN (tests/c/launch.sh). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

static void expect_rc(nexar_result_t got, nexar_result_t want, const char* what) {
    EXPECT(got == want, "%s: %s (%s), want %s", what, nexar_result_string(got),
           nexar_last_error(), nexar_result_string(want));
}

static int joiner(void) {
    nexar_comm_t c = NEXAR_COMM_NULL;
    CK(nexar_comm_init_from_env(&c));
    int rank, size;
    CK(nexar_comm_rank(c, &rank));
    CK(nexar_comm_size(c, &size));
    g_rank = rank;
    EXPECT(rank == 3 && size == 4, "joiner: rank %d of %d, want 3 of 4", rank, size);
    sum_check(c);
    CK(nexar_barrier(c));
    CK(nexar_comm_destroy(c));
    printf("test_grow: joiner OK\n");
    return 0;
}

int main(void) {
    const char* j = getenv("NEXAR_JOIN");
    if (j != NULL && strcmp(j, "1") == 0) {
        return joiner();
    }
    nexar_comm_t world = NEXAR_COMM_NULL;
    setenv("NEXAR_MAX_WORLD_SIZE", "4", 1); /* room for one more */
    CK(nexar_comm_init_from_env(&world));
    int rank, size;
    CK(nexar_comm_rank(world, &rank));
    CK(nexar_comm_size(world, &size));
    g_rank = rank;
    if (size != 3) {
        printf("test_grow: needs 3 ranks, skipped on %d\n", size);
        CK(nexar_comm_destroy(world));
        return 0;
    }

    /* 1. Bad input. */
    nexar_comm_t out = NEXAR_COMM_NULL;
    expect_rc(nexar_comm_grow(NEXAR_COMM_NULL, &out), NEXAR_ERR_INVALID_HANDLE, "grow(NULL comm)");
    expect_rc(nexar_comm_grow(world, NULL), NEXAR_ERR_INVALID_ARGUMENT, "grow(newcomm NULL)");
    expect_rc(nexar_comm_join(NULL, &out), NEXAR_ERR_INVALID_ARGUMENT, "join(config NULL)");
    nexar_config_t jc = NEXAR_CONFIG_INIT;
    expect_rc(nexar_comm_join(&jc, &out), NEXAR_ERR_INVALID_ARGUMENT, "join(no seed_addr)");
    expect_rc(nexar_comm_join(&jc, NULL), NEXAR_ERR_INVALID_ARGUMENT, "join(comm NULL)");
    size_t need = 0;
    expect_rc(nexar_comm_get_join_addrs(NEXAR_COMM_NULL, NULL, 0, &need), NEXAR_ERR_INVALID_HANDLE,
              "get_join_addrs(NULL comm)");
    expect_rc(nexar_comm_get_join_addrs(world, NULL, 8, &need), NEXAR_ERR_INVALID_ARGUMENT,
              "get_join_addrs(buf NULL, len 8)");
    char tiny[4] = "xyz";
    expect_rc(nexar_comm_get_join_addrs(world, tiny, sizeof tiny, &need), NEXAR_ERR_TRUNCATED,
              "get_join_addrs(4 bytes)");
    EXPECT(tiny[0] == '\0' && need > sizeof tiny, "truncated: buf \"%s\", needed %zu", tiny, need);
    char addrs[1024];
    CK(nexar_comm_get_join_addrs(world, addrs, sizeof addrs, NULL));
    EXPECT(strlen(addrs) + 1 == need, "addresses \"%s\", needed %zu", addrs, need);
    if (rank == 0) {
        nexar_config_t bad = NEXAR_CONFIG_INIT;
        bad.seed_addr = addrs;
        bad.token = "not the token";
        bad.token_len = strlen("not the token");
        bad.timeout_ms = 3000;
        expect_rc(nexar_comm_join(&bad, &out), NEXAR_ERR_AUTH, "join with the wrong token");
        EXPECT(out == NEXAR_COMM_NULL, "a refused join returned a handle");
    }
    /* A destroyed handle, and a revoked communicator (grow works on it:
     * nobody waits, so the live members' communicator comes back). */
    nexar_comm_t dup = NEXAR_COMM_NULL;
    CK(nexar_comm_split(world, 0, rank, &dup));
    CK(nexar_comm_set_failure_policy(dup, NEXAR_ON_FAILURE_MANUAL));
    CK(nexar_comm_revoke(dup));
    nexar_comm_t again = NEXAR_COMM_NULL;
    CK(nexar_comm_grow(dup, &again));
    int asize = 0;
    CK(nexar_comm_size(again, &asize));
    EXPECT(asize == 3, "grow of a revoked communicator: %d ranks", asize);
    sum_check(again);
    CK(nexar_comm_get_join_addrs(dup, addrs, sizeof addrs, NULL));
    CK(nexar_comm_destroy(again));
    CK(nexar_comm_destroy(dup));
    expect_rc(nexar_comm_grow(dup, &out), NEXAR_ERR_INVALID_HANDLE, "grow a destroyed comm");
    expect_rc(nexar_comm_get_join_addrs(dup, addrs, sizeof addrs, NULL), NEXAR_ERR_INVALID_HANDLE,
              "get_join_addrs of a destroyed comm");
    CK(nexar_comm_get_join_addrs(world, addrs, sizeof addrs, NULL));
    CK(nexar_barrier(world));

    /* 2. A process started later joins. */
    pid_t child = -1;
    if (rank == 1) {
        child = fork();
        EXPECT(child >= 0, "fork failed");
        if (child == 0) {
            setenv("NEXAR_JOIN", "1", 1);
            setenv("NEXAR_SEED", addrs, 1);
            char self[4096];
            ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
            if (n > 0) {
                self[n] = '\0';
                execl(self, self, (char*)NULL);
            }
            _exit(127);
        }
    }
    nexar_comm_t grown = NEXAR_COMM_NULL;
    int gsize = 0;
    for (int tries = 0; tries < 300; tries++) {
        CK(nexar_comm_grow(world, &grown));
        CK(nexar_comm_size(grown, &gsize));
        if (gsize == 4) {
            break;
        }
        EXPECT(gsize == 3, "grow with nobody waiting: %d ranks", gsize);
        CK(nexar_comm_destroy(grown));
        grown = NEXAR_COMM_NULL;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    EXPECT(gsize == 4, "the joiner never came in");
    int grank;
    CK(nexar_comm_rank(grown, &grank));
    EXPECT(grank == rank, "member %d is rank %d of the grown world", rank, grank);
    sum_check(grown);
    CK(nexar_barrier(grown));
    sum_check(world); /* the old world still works */
    CK(nexar_comm_destroy(grown));
    if (child > 0) {
        int st = 0;
        EXPECT(waitpid(child, &st, 0) == child, "waitpid");
        EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the joiner failed (status %d)", st);
    }
    CK(nexar_comm_destroy(world));
    printf("test_grow: rank %d OK\n", rank);
    return 0;
}
