/* nexar_seed_start / nexar_seed_close: a seed on port 0 reports the address
 * it got, two ranks (threads of this process) form a job through it and run
 * an allreduce, and bad arguments and a double close are refused. */
#include <pthread.h>
#include <string.h>

#include "testutil.h"

static const char token[] = "test-seed-token";
static char seed_addr[64];

static void* run_rank(void* arg) {
    int rank = (int)(size_t)arg;
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    cfg.rank = rank;
    cfg.world_size = 2;
    cfg.seed_addr = seed_addr;
    cfg.token = token;
    cfg.token_len = sizeof token - 1;
    cfg.bind_addr = "127.0.0.1:0";
    cfg.connect_timeout_ms = 30000;
    nexar_comm_t comm = NEXAR_COMM_NULL;
    CK(nexar_comm_init(&cfg, &comm));
    int v[3] = {rank + 1, 10 * (rank + 1), -rank};
    CK(nexar_allreduce(v, v, 3, NEXAR_INT32, NEXAR_SUM, comm));
    EXPECT(v[0] == 3 && v[1] == 30 && v[2] == -1, "rank %d got %d %d %d", rank, v[0], v[1], v[2]);
    CK(nexar_comm_destroy(comm));
    return NULL;
}

int main(void) {
    nexar_seed_t seed = NULL;
    char small[4] = "xyz";

    /* Bad arguments: an error naming the argument, nothing written. */
    EXPECT(nexar_seed_start(NULL, 2, token, 3, &seed, seed_addr, sizeof seed_addr) ==
               NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "bind_addr") != NULL,
           "NULL bind_addr: %s", nexar_last_error());
    EXPECT(nexar_seed_start("127.0.0.1:0", 0, token, 3, &seed, seed_addr, sizeof seed_addr) ==
               NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "world_size") != NULL,
           "world size 0: %s", nexar_last_error());
    EXPECT(nexar_seed_start("127.0.0.1:0", 2, token, 0, &seed, seed_addr, sizeof seed_addr) ==
               NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "token") != NULL,
           "empty token: %s", nexar_last_error());
    EXPECT(nexar_seed_start("127.0.0.1:0", 2, token, 3, &seed, small, sizeof small) ==
               NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "addr_len") != NULL,
           "small addr: %s", nexar_last_error());
    EXPECT(strcmp(small, "xyz") == 0 && seed == NULL, "a failed call wrote its outputs");
    EXPECT(nexar_seed_start("not an address", 2, token, 3, &seed, seed_addr, sizeof seed_addr) !=
               NEXAR_SUCCESS, "a bad bind address was accepted");

    /* Port 0: the seed reports the port it got. */
    CK(nexar_seed_start("127.0.0.1:0", 2, token, sizeof token - 1, &seed, seed_addr,
                        sizeof seed_addr));
    EXPECT(strncmp(seed_addr, "127.0.0.1:", 10) == 0 && strcmp(seed_addr, "127.0.0.1:0") != 0,
           "seed address %s", seed_addr);

    pthread_t t[2];
    for (int r = 0; r < 2; r++) {
        EXPECT(pthread_create(&t[r], NULL, run_rank, (void*)(size_t)r) == 0, "pthread_create");
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(t[r], NULL);
    }
    CK(nexar_seed_close(seed));
    EXPECT(nexar_seed_close(seed) == NEXAR_ERR_INVALID_HANDLE, "second close: %s",
           nexar_last_error());
    printf("seed: formed through %s, allreduce ok, bad input refused\n", seed_addr);
    return 0;
}
