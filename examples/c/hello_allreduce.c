/* hello_allreduce: every rank contributes its rank; everyone prints the sum.
 *
 *   nexar run -n 4 -- ./hello_allreduce
 */
#include <stdio.h>

#include "nexar.h"

static int check(nexar_result_t r, const char* what) {
    if (r != NEXAR_SUCCESS) {
        fprintf(stderr, "%s: %s: %s\n", what, nexar_result_string(r), nexar_last_error());
    }
    return r != NEXAR_SUCCESS;
}

int main(void) {
    nexar_comm_t world;
    if (check(nexar_comm_init_from_env(&world), "init")) return 1;
    int rank = 0, size = 0;
    nexar_comm_rank(world, &rank);
    nexar_comm_size(world, &size);

    double x[2] = {(double)rank, 1.0};
    if (check(nexar_allreduce(x, x, 2, NEXAR_FLOAT64, NEXAR_SUM, world), "allreduce")) return 1;
    printf("rank %d of %d: sum of ranks = %g, ranks counted = %g\n", rank, size, x[0], x[1]);

    int ok = x[0] == size * (size - 1) / 2.0 && x[1] == size;
    nexar_comm_destroy(world);
    return ok ? 0 : 1;
}
