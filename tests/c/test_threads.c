/* test_threads: 8 threads drive 8 communicators at once (split from the
 * world, same members), each with its own data, and check that
 * nexar_last_error() is per thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

enum { THREADS = 8, ITERS = 200, COUNT = 33 };

struct job {
    int id;
    nexar_comm_t comm;
    int ok;
};

static void* drive(void* arg) {
    struct job* j = arg;
    int r, n;
    CK(nexar_comm_rank(j->comm, &r));
    CK(nexar_comm_size(j->comm, &n));
    int64_t v[COUNT];
    char want[64];
    for (int it = 0; it < ITERS; it++) {
        for (int i = 0; i < COUNT; i++) v[i] = (int64_t)j->id * 1000000 + it * 1000 + r + i;
        nexar_request_t req;
        if (it % 2) {
            CK(nexar_allreduce(v, v, COUNT, NEXAR_INT64, NEXAR_SUM, j->comm));
        } else {
            CK(nexar_iallreduce(v, v, COUNT, NEXAR_INT64, NEXAR_SUM, j->comm, &req));
            CK(nexar_wait(req));
            CK(nexar_request_free(req));
        }
        for (int i = 0; i < COUNT; i++) {
            int64_t e = n * ((int64_t)j->id * 1000000 + it * 1000 + i) + (int64_t)n * (n - 1) / 2;
            EXPECT(v[i] == e, "thread %d iter %d v[%d]=%lld want %lld", j->id, it, i,
                   (long long)v[i], (long long)e);
        }
        /* a failing call with a thread-specific argument; the message must
         * be this thread's even though other threads fail at the same time */
        nexar_result_t rc = nexar_broadcast(v, 1, NEXAR_INT64, 1000 + j->id, j->comm);
        EXPECT(rc == NEXAR_ERR_INVALID_ARGUMENT, "bad root accepted");
        snprintf(want, sizeof want, "root %d ", 1000 + j->id);
        EXPECT(strstr(nexar_last_error(), want) != NULL, "thread %d got \"%s\"", j->id,
               nexar_last_error());
    }
    j->ok = 1;
    return NULL;
}

int main(void) {
    int r, n;
    nexar_comm_t world = init_world(&r, &n);
    struct job jobs[THREADS];
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t].id = t;
        jobs[t].ok = 0;
        CK(nexar_comm_split(world, 0, r, &jobs[t].comm));
    }
    for (int t = 0; t < THREADS; t++) EXPECT(pthread_create(&th[t], NULL, drive, &jobs[t]) == 0, "pthread_create");
    for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < THREADS; t++) {
        EXPECT(jobs[t].ok, "thread %d", t);
        CK(nexar_barrier(jobs[t].comm));
    }
    for (int t = 0; t < THREADS; t++) CK(nexar_comm_destroy(jobs[t].comm));
    CK(nexar_barrier(world));
    CK(nexar_comm_destroy(world));
    printf("rank %d/%d: test_threads ok\n", r, n);
    return 0;
}
