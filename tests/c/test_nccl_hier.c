/* test_nccl_hier: the C ABI's device collectives through NCCL within a host
 * and nexar between hosts (NEXAR_NCCL_HIER=on), against the fake CUDA
 * runtime and the fake NCCL (tests/fakes). Two "hosts" are simulated on this
 * machine: each rank names its host in NEXAR_HIER_HOST_ID before creating
 * its communicator (rank 1 alone on host B, the others on host A: 3+1 for
 * 4 ranks, out of rank order). Run under `nexar run -n N` with
 * NEXAR_CUDART and NEXAR_NCCL naming the fakes. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

#include "cudautil.h"

static int64_t value(int rank, size_t i) { return (int64_t)rank * 1000000 + (int64_t)i; }

/* launched is the fake NCCL's count of collectives this process launched. */
static long launched(void) {
    static long (*fn)(void);
    if (fn == NULL) {
        void* h = dlopen(getenv("NEXAR_NCCL"), RTLD_NOW | RTLD_LOCAL);
        EXPECT(h != NULL, "dlopen NEXAR_NCCL: %s", dlerror());
        void* f = dlsym(h, "nexarFakeNcclLaunched");
        EXPECT(f != NULL, "NEXAR_NCCL is not the fake NCCL");
        memcpy(&fn, &f, sizeof f);
    }
    return fn();
}

int main(void) {
    const char* rs = getenv("NEXAR_RANK");
    EXPECT(rs != NULL, "NEXAR_RANK is not set");
    setenv("NEXAR_HIER_HOST_ID", atoi(rs) == 1 ? "host-B" : "host-A", 1);
    setenv("NEXAR_NCCL_HIER", "on", 1);
    int r, n;
    nexar_comm_t c = init_world(&r, &n);
    const size_t count = 1001; /* odd: uneven pieces */
    int64_t* in = malloc(count * n * sizeof *in);
    int64_t* want = malloc(count * n * sizeof *want);
    for (size_t i = 0; i < count * n; i++) {
        in[i] = value(r, i);
    }

    /* Blocking allreduce, device to device: through NCCL. */
    long before = launched();
    void* send = dev_of(in, count);
    void* recv = dev_of(NULL, count);
    CK(nexar_allreduce(send, recv, count, NEXAR_INT64, NEXAR_SUM, c));
    for (size_t i = 0; i < count; i++) {
        want[i] = 0;
        for (int k = 0; k < n; k++) {
            want[i] += value(k, i);
        }
    }
    expect_dev(recv, want, count, "allreduce");
    expect_dev(send, in, count, "allreduce sendbuf (untouched)");
    EXPECT(launched() > before, "the allreduce of device memory did not go through NCCL");

    /* The _stream variants, on a stream of this program's. */
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, 1));
    CK(nexar_allreduce_stream(send, send, count, NEXAR_INT64, NEXAR_SUM, c, s));
    CU(cudaStreamSynchronize(s));
    expect_dev(send, want, count, "allreduce_stream (in place)");

    void* bc = dev_of(in, count);
    CK(nexar_broadcast_stream(bc, count, NEXAR_INT64, n - 1, c, s));
    CU(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        want[i] = value(n - 1, i);
    }
    expect_dev(bc, want, count, "broadcast_stream");

    void* mine = dev_of(in, count);
    void* ag = dev_of(NULL, count * n);
    CK(nexar_allgather_stream(mine, ag, count, NEXAR_INT64, c, s));
    CU(cudaStreamSynchronize(s));
    for (int k = 0; k < n; k++) {
        for (size_t i = 0; i < count; i++) {
            want[k * count + i] = value(k, i);
        }
    }
    expect_dev(ag, want, count * n, "allgather_stream");

    /* reduce_scatter in place: the n blocks in, block r of the sum at the start. */
    void* rsb = dev_of(in, count * n);
    CK(nexar_reduce_scatter_stream(rsb, rsb, count, NEXAR_INT64, NEXAR_SUM, c, s));
    CU(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        want[i] = 0;
        for (int k = 0; k < n; k++) {
            want[i] += value(k, r * count + i);
        }
    }
    expect_dev(rsb, want, count, "reduce_scatter_stream (in place)");

    /* NCCL has no bitwise reduction: the call is staged, still correct. */
    long mid = launched();
    void* band = dev_of(in, count);
    CK(nexar_allreduce(band, band, count, NEXAR_INT64, NEXAR_BAND, c));
    for (size_t i = 0; i < count; i++) {
        want[i] = value(0, i);
        for (int k = 1; k < n; k++) {
            want[i] &= value(k, i);
        }
    }
    expect_dev(band, want, count, "allreduce band (staged)");
    EXPECT(launched() == mid, "a bitwise allreduce went to NCCL");

    /* A mismatch: the call fails on every rank, naming it, and no rank hangs. */
    nexar_result_t res = nexar_allreduce(send, recv, r == 0 ? count : count - 1, NEXAR_INT64, NEXAR_SUM, c);
    if (n > 1) {
        EXPECT(res == NEXAR_ERR_MISMATCH || res == NEXAR_ERR_ABORTED, "mismatched allreduce: %s: %s",
               nexar_result_string(res), nexar_last_error());
    }

    CU(cudaStreamDestroy(s));
    void* bufs[] = {send, recv, bc, mine, ag, rsb, band};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        CU(cudaFree(bufs[i]));
    }
    free(in);
    free(want);
    CK(nexar_comm_destroy(c));
    printf("rank %d: nccl hier ok\n", r);
    return 0;
}
