/* Helpers shared by the C tests: fail loudly with rank, line and the
 * library's last error. */
#ifndef NEXAR_TESTUTIL_H
#define NEXAR_TESTUTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nexar.h"

static int g_rank = -1;

#define CK(call)                                                                   \
    do {                                                                           \
        nexar_result_t r_ = (call);                                                \
        if (r_ != NEXAR_SUCCESS) {                                                 \
            fprintf(stderr, "rank %d: %s:%d: %s -> %s: %s\n", g_rank, __FILE__,     \
                    __LINE__, #call, nexar_result_string(r_), nexar_last_error()); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

#define EXPECT(cond, ...)                                                             \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "rank %d: %s:%d: expected %s: ", g_rank, __FILE__, __LINE__, \
                    #cond);                                                           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* init_world creates the world communicator from the launcher's
 * environment and stores this process's rank (also in g_rank) and the
 * world's size. */
static inline nexar_comm_t init_world(int* rank, int* size) {
    nexar_comm_t c = NEXAR_COMM_NULL;
    CK(nexar_comm_init_from_env(&c));
    CK(nexar_comm_rank(c, rank));
    CK(nexar_comm_size(c, size));
    g_rank = *rank;
    return c;
}

/* sum_check: allreduce of rank+1 (plus the element's index) over c,
 * checked against n(n+1)/2 (plus n times the index). */
static inline void sum_check(nexar_comm_t c) {
    int rank, size;
    CK(nexar_comm_rank(c, &rank));
    CK(nexar_comm_size(c, &size));
    int64_t v[256];
    for (int i = 0; i < 256; i++) {
        v[i] = rank + 1 + i;
    }
    CK(nexar_allreduce(v, v, 256, NEXAR_INT64, NEXAR_SUM, c));
    for (int i = 0; i < 256; i++) {
        EXPECT(v[i] == (int64_t)size * (size + 1) / 2 + (int64_t)size * i,
               "element %d: %lld on %d ranks", i, (long long)v[i], size);
    }
}

#endif
