/* test_env: nexar_comm_init_from_env reads the environment as it is at the
 * time of the call, so variables set with setenv() after an earlier init
 * (and after the library was loaded) are seen. Run with 1 rank. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

static int failures;

/* refused checks that init_from_env failed with code and a last error
 * naming the function, want1 and want2. */
static void refused(int line, nexar_result_t code, const char* want1, const char* want2) {
    nexar_comm_t c = NEXAR_COMM_NULL;
    nexar_result_t got = nexar_comm_init_from_env(&c);
    const char* msg = nexar_last_error();
    if (got != code || strstr(msg, "nexar_comm_init_from_env") == NULL ||
        strstr(msg, want1) == NULL || strstr(msg, want2) == NULL) {
        fprintf(stderr, "line %d: init_from_env -> %d (%s) \"%s\"; want %d naming %s, %s\n",
                line, (int)got, nexar_result_string(got), got ? msg : "", (int)code, want1, want2);
        failures++;
    }
    if (c != NEXAR_COMM_NULL) CK(nexar_comm_destroy(c));
}

int main(void) {
    nexar_comm_t c;
    int n;
    CK(nexar_comm_init_from_env(&c));
    CK(nexar_comm_size(c, &n));
    EXPECT(n == 1, "run test_env with 1 rank, not %d", n);
    g_rank = 0;
    CK(nexar_comm_destroy(c));

    /* a bad value set after the first init is seen (and named) */
    EXPECT(setenv("NEXAR_TIMEOUT", "soon", 1) == 0, "setenv");
    refused(__LINE__, NEXAR_ERR_INVALID_ARGUMENT, "NEXAR_TIMEOUT", "soon");
    EXPECT(unsetenv("NEXAR_TIMEOUT") == 0, "unsetenv");

    /* so are changed ranks and sizes */
    EXPECT(setenv("NEXAR_WORLD_SIZE", "3", 1) == 0 && setenv("NEXAR_RANK", "5", 1) == 0, "setenv");
    refused(__LINE__, NEXAR_ERR_INVALID_ARGUMENT, "NEXAR_RANK=5", "world size 3");

    /* and removed ones: a one-rank world needs no seed and no token */
    EXPECT(setenv("NEXAR_WORLD_SIZE", "1", 1) == 0 && setenv("NEXAR_RANK", "0", 1) == 0, "setenv");
    EXPECT(unsetenv("NEXAR_SEED") == 0 && unsetenv("NEXAR_TOKEN") == 0, "unsetenv");
    EXPECT(setenv("NEXAR_TIMEOUT", "30s", 1) == 0, "setenv");
    CK(nexar_comm_init_from_env(&c));
    int64_t v[4] = {1, 2, 3, 4};
    CK(nexar_allreduce(v, v, 4, NEXAR_INT64, NEXAR_SUM, c));
    EXPECT(v[3] == 4, "allreduce");
    CK(nexar_comm_destroy(c));

    if (failures) {
        fprintf(stderr, "test_env: %d failures\n", failures);
        return 1;
    }
    printf("test_env ok\n");
    return 0;
}
