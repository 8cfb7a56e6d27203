/* test_knobs: nexar_comm_init with an explicit config takes the knobs of
 * the environment it leaves unset (NEXAR_TIMEOUT here) and its own appended
 * fields (topology, bulk, bulk_plaintext), observed through
 * nexar_comm_get_path and a receive that times out; a bad field is named;
 * a program built against the first, smaller nexar_config_t still works.
 * Run with 4 ranks (kregular:2: r+-1 are neighbours, r+2 is relayed). */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void path_of(nexar_comm_t c, int peer, char* buf, size_t size) {
    size_t len = 0;
    CK(nexar_comm_get_path(c, peer, buf, size, &len));
    EXPECT(len < size && strlen(buf) == len, "path to %d: length %zu, buf \"%s\"", peer, len, buf);
}

/* job_config is the launcher's job as an explicit config, knobs unset. */
static nexar_config_t job_config(int rank, int n, const char* seed, const char* token) {
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    cfg.rank = rank;
    cfg.world_size = n;
    cfg.seed_addr = seed;
    cfg.token = token;
    cfg.token_len = strlen(token);
    return cfg;
}

int main(void) {
    const char* rs = getenv("NEXAR_RANK");
    const char* ns = getenv("NEXAR_WORLD_SIZE");
    const char* seed = getenv("NEXAR_SEED");
    const char* token = getenv("NEXAR_TOKEN");
    EXPECT(rs && ns && seed && token, "run under the launcher");
    int rank = atoi(rs), n = atoi(ns);
    g_rank = rank;
    EXPECT(n == 4, "run test_knobs with 4 ranks, not %d", n);

    /* A field that does not parse is named, with the accepted forms. */
    nexar_config_t bad = job_config(rank, n, seed, token);
    bad.topology = "ring";
    nexar_comm_t c = NEXAR_COMM_NULL;
    EXPECT(nexar_comm_init(&bad, &c) == NEXAR_ERR_INVALID_ARGUMENT && c == NEXAR_COMM_NULL, "topology \"ring\" accepted");
    EXPECT(strstr(nexar_last_error(), "config->topology") && strstr(nexar_last_error(), "kregular:K"),
           "error does not name the field and its forms: %s", nexar_last_error());

    /* A struct from a newer header (larger than this library knows) is refused. */
    bad.topology = NULL;
    bad.struct_size = sizeof(nexar_config_t) + 8;
    EXPECT(nexar_comm_init(&bad, &c) == NEXAR_ERR_INVALID_ARGUMENT, "an unknown struct_size was accepted");

    /* A program built against the first header: only the fields up to
     * max_buffered_bytes, which the library must not read past. A world of
     * one rank, so that no peer is involved. */
    struct config_v1 {
        size_t struct_size;
        int rank, world_size;
        const char* seed_addr;
        const void* token;
        size_t token_len;
        const char *bind_addr, *advertise_addr;
        int64_t timeout_ms, connect_timeout_ms, heartbeat_interval_ms, heartbeat_timeout_ms, max_buffered_bytes;
    } old;
    EXPECT(sizeof old == offsetof(nexar_config_t, topology), "the first layout is %zu bytes, the appended fields start at %zu",
           sizeof old, offsetof(nexar_config_t, topology));
    memset(&old, 0, sizeof old);
    old.struct_size = sizeof old;
    old.rank = 0;
    old.world_size = 1;
    CK(nexar_comm_init((const nexar_config_t*)(const void*)&old, &c));
    CK(nexar_comm_destroy(c));

    /* The real job: explicit topology, data path and plaintext; the
     * timeout from the environment (set now: read at the call). */
    EXPECT(setenv("NEXAR_TIMEOUT", "3s", 1) == 0, "setenv");
    nexar_config_t cfg = job_config(rank, n, seed, token);
    cfg.topology = "kregular:2";
    cfg.bulk = "tcp";
    cfg.bulk_plaintext = 1;
    CK(nexar_comm_init(&cfg, &c));
    int64_t v[4096];
    for (int i = 0; i < 4096; i++) v[i] = rank;
    CK(nexar_allreduce(v, v, 4096, NEXAR_INT64, NEXAR_SUM, c));
    EXPECT(v[4095] == 6, "allreduce gave %lld", (long long)v[4095]);

    char p[128];
    path_of(c, rank, p, sizeof p);
    EXPECT(strcmp(p, "loopback") == 0, "own path \"%s\"", p);
    path_of(c, (rank + 2) % n, p, sizeof p);
    EXPECT(strncmp(p, "relay via ", 10) == 0, "path to %d is \"%s\", not relayed", (rank + 2) % n, p);
    for (int d = 1; d <= 3; d += 2) {
        path_of(c, (rank + d) % n, p, sizeof p);
        EXPECT(strstr(p, "tcp") && strstr(p, "plaintext"), "path to %d is \"%s\", not plaintext tcp", (rank + d) % n, p);
    }
    size_t len = 0;
    EXPECT(nexar_comm_get_path(c, n, p, sizeof p, &len) == NEXAR_ERR_INVALID_ARGUMENT, "peer %d accepted", n);
    CK(nexar_comm_get_path(c, rank, NULL, 0, &len));
    EXPECT(len == strlen("loopback"), "length-only query gave %zu", len);
    CK(nexar_barrier(c));

    /* Rank 0 waits for a message rank 1 never sends: NEXAR_TIMEOUT (3 s)
     * bounds it, not the 5-minute default. The others stay until it is
     * done (a flag file), so that it sees silence, not a departure. */
    char flag[256];
    snprintf(flag, sizeof flag, "/tmp/nexar-test-knobs-%s", token);
    if (rank == 0) {
        int64_t x = 0;
        double t0 = now();
        nexar_result_t r = nexar_recv(&x, 1, NEXAR_INT64, 1, 77, c);
        double took = now() - t0;
        EXPECT(r == NEXAR_ERR_TIMEOUT, "receive -> %s: %s", nexar_result_string(r), nexar_last_error());
        EXPECT(took >= 2.5 && took < 60, "receive timed out after %.1f s, want about 3", took);
        printf("rank 0: receive timed out after %.1f s\n", took);
        FILE* f = fopen(flag, "w");
        EXPECT(f != NULL, "creating %s", flag);
        fclose(f);
    } else {
        double end = now() + 120;
        while (access(flag, F_OK) != 0) {
            EXPECT(now() < end, "rank 0 never finished its receive");
            struct timespec ts = {0, 50000000};
            nanosleep(&ts, NULL);
        }
    }
    CK(nexar_comm_destroy(c));
    if (rank == 0) {
        sleep(1); /* the others have seen the flag by then; it is removed after them */
        unlink(flag);
    }
    printf("rank %d: ok\n", rank);
    return 0;
}
