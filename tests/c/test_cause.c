/* test_cause: 3 ranks. Rank 2 dies; rank 1 (short heartbeat timeout)
 * declares it dead first and destroys its communicator at once. Rank 0
 * (long heartbeat timeout) must fail naming rank 2, as reported by rank 1,
 * and nexar_comm_get_error must report NEXAR_ERR_PEER_DOWN, not success.
 * Reads its place from NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_SEED and
 * NEXAR_TOKEN (as set by tests/c/launch.sh or nexar run). */
#define _POSIX_C_SOURCE 200809L
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
    CK(nexar_comm_init(&cfg, &c));
    CK(nexar_barrier(c));
    if (rank == 2) {
        _exit(0); /* dies: no goodbye */
    }
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
    CK(nexar_comm_destroy(c));
    return 0;
}
