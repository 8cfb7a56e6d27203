#include <nexar.h>
#include <stdio.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        nexar_result_t rc_ = (call);                                                  \
        if (rc_ != NEXAR_SUCCESS) {                                                   \
            fprintf(stderr, "%s: %s\n", nexar_result_string(rc_), nexar_last_error()); \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

int main(void) {
    nexar_comm_t comm;
    CHECK(nexar_comm_init_from_env(&comm)); /* nexar run, torchrun, Slurm or Open MPI */
    int rank, size;
    CHECK(nexar_comm_rank(comm, &rank));
    CHECK(nexar_comm_size(comm, &size));

    float x[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) x[i] *= (float)(rank + 1);
    CHECK(nexar_allreduce(x, x, 4, NEXAR_FLOAT32, NEXAR_SUM, comm)); /* in place */

    const float k = (float)size * (size + 1) / 2;
    for (int i = 0; i < 4; i++) {
        if (x[i] != (i + 1) * k) {
            fprintf(stderr, "rank %d: x[%d] = %g\n", rank, i, x[i]);
            return 1;
        }
    }
    if (rank == 0) printf("allreduce over %d ranks: %g %g %g %g\n", size, x[0], x[1], x[2], x[3]);
    CHECK(nexar_comm_destroy(comm));
    return 0;
}
