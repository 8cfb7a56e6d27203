/* Helpers shared by the C tests: fail loudly with rank, line and the
 * library's last error. */
#ifndef NEXAR_TESTUTIL_H
#define NEXAR_TESTUTIL_H
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

#endif
