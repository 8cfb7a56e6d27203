/* test_cause: 3 ranks. Rank 2 dies; rank 1 (short heartbeat timeout)
 * declares it dead first and destroys its communicator at once. Rank 0
 * (long heartbeat timeout) must fail naming rank 2, as reported by rank 1,
 * and nexar_comm_get_error must report NEXAR_ERR_PEER_DOWN, not success.
 * On both survivors the failure handler is called once, for rank 2, and
 * nexar_comm_get_failed lists rank 2. Rank 0 keeps its data on QUIC
 * (NEXAR_BULK=off, so it starts from the environment), which also keeps it
 * from watching its local peers' processes: otherwise it would see rank 2's
 * exit itself, at once.
 * Reads its place from NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_SEED and
 * NEXAR_TOKEN (as set by tests/c/launch.sh or nexar run). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

static const char* env(const char* name) {
    const char* v = getenv(name);
    EXPECT(v != NULL && *v != '\0', "%s is not set", name);
    return v;
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int calls, called_rank = -1;
static nexar_result_t called_code;
static nexar_comm_t called_comm;

static void on_failure(nexar_comm_t comm, int rank, nexar_result_t code, const char* message,
                       void* user) {
    pthread_mutex_lock(&mu);
    calls++;
    called_rank = rank;
    called_code = code;
    called_comm = comm;
    pthread_mutex_unlock(&mu);
    EXPECT(user == (void*)&calls, "handler got user %p", user);
    printf("test_cause: rank %d: handler: rank %d: %s\n", g_rank, rank, message);
}

/* wait_handler waits up to 10 s for the first handler call. */
static int wait_handler(void) {
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&mu);
        int n = calls;
        pthread_mutex_unlock(&mu);
        if (n > 0) {
            return n;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

int main(void) {
    int rank = atoi(env("NEXAR_RANK")), size = atoi(env("NEXAR_WORLD_SIZE"));
    g_rank = rank;
    if (size != 3) {
        printf("test_cause: needs 3 ranks, skipped on %d\n", size);
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
    cfg.heartbeat_timeout_ms = rank == 1 ? 1000 : 60000;
    nexar_comm_t c;
    if (rank == 0) {
        EXPECT(setenv("NEXAR_BULK", "off", 1) == 0 && setenv("NEXAR_TIMEOUT", "60s", 1) == 0 &&
                   setenv("NEXAR_HEARTBEAT_INTERVAL", "200ms", 1) == 0 &&
                   setenv("NEXAR_HEARTBEAT_TIMEOUT", "60s", 1) == 0,
               "setenv failed");
        CK(nexar_comm_init_from_env(&c));
    } else {
        CK(nexar_comm_init(&cfg, &c));
    }
    CK(nexar_comm_set_failure_handler(c, on_failure, &calls));
    CK(nexar_barrier(c));
    /* Rank 2 dies once the others are past the barrier: its death is seen
     * in milliseconds, and must not fail a barrier still finishing. */
    int one = 1;
    if (rank == 2) {
        int got;
        CK(nexar_recv(&got, 1, NEXAR_INT32, 0, 7, c));
        CK(nexar_recv(&got, 1, NEXAR_INT32, 1, 7, c));
        _exit(0); /* dies: no goodbye */
    }
    CK(nexar_send(&one, 1, NEXAR_INT32, 2, 7, c));
    float v[4] = {1, 2, 3, 4};
    nexar_result_t r = nexar_allreduce(v, v, 4, NEXAR_FLOAT32, NEXAR_SUM, c);
    const char* msg = nexar_last_error();
    EXPECT(r == NEXAR_ERR_PEER_DOWN && strstr(msg, "rank 2") != NULL, "allreduce: %s: %s",
           nexar_result_string(r), msg);
    if (rank == 0) {
        EXPECT(strstr(msg, "reported by rank 1") != NULL, "allreduce: %s", msg);
        nexar_result_t health = NEXAR_SUCCESS;
        CK(nexar_comm_get_error(c, &health));
        EXPECT(health == NEXAR_ERR_PEER_DOWN, "nexar_comm_get_error: %s after \"%s\"",
               nexar_result_string(health), msg);
        printf("test_cause: rank 0: %s\n", msg);
    }
    EXPECT(wait_handler() == 1, "failure handler called %d times, want once", calls);
    pthread_mutex_lock(&mu);
    EXPECT(called_rank == 2 && called_code == NEXAR_ERR_PEER_DOWN && called_comm == c,
           "handler called for rank %d with %s", called_rank, nexar_result_string(called_code));
    pthread_mutex_unlock(&mu);
    int failed[4] = {-1, -1, -1, -1};
    size_t nfailed = 0;
    CK(nexar_comm_get_failed(c, failed, 4, &nfailed));
    EXPECT(nfailed == 1 && failed[0] == 2 && failed[1] == -1, "get_failed: %zu ranks, first %d",
           nfailed, failed[0]);
    CK(nexar_comm_destroy(c));
    return 0;
}
