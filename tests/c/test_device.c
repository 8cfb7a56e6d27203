/* test_device: the C ABI with CUDA device pointers, against the fake CUDA
 * runtime (tests/fakes/cudart: device memory the host cannot touch, streams
 * that run on their own threads after a delay). The program links the fake
 * and NEXAR_CUDART names the same file, so libnexar and this program share
 * one fake runtime. Run under `nexar run -n N`, N >= 1.
 *
 * The CUDA entry points are declared here (no CUDA header needed), with
 * the runtime's signatures. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nexar.h"
#include "devprobe.h"
#include "testutil.h"

#include "cudautil.h"

int main(void) {
    int r, n;
    nexar_comm_t c = init_world(&r, &n);
    const size_t count = 1000;
    int64_t* in = malloc(count * sizeof *in);
    int64_t* want = malloc(count * n * sizeof *want);
    for (size_t i = 0; i < count; i++) {
        in[i] = (int64_t)r * 1000000 + (int64_t)i;
    }

    /* The fake is faithful: a host read of device memory dies by SIGSEGV. */
    void* probe = dev_of(in, count);
    expect_host_read_dies(probe, "fake device memory");

    /* Blocking allreduce, device to device. */
    void* send = dev_of(in, count);
    void* recv = dev_of(NULL, count);
    CK(nexar_allreduce(send, recv, count, NEXAR_INT64, NEXAR_SUM, c));
    for (size_t i = 0; i < count; i++) {
        want[i] = 0;
        for (int k = 0; k < n; k++) {
            want[i] += (int64_t)k * 1000000 + (int64_t)i;
        }
    }
    expect_dev(recv, want, count, "allreduce");
    expect_dev(send, in, count, "allreduce sendbuf (untouched)");

    /* Stream variants on a non-blocking stream; the inputs are written on
     * the stream by delayed copies, the results read back on it. */
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, 1));
    int64_t* pin;
    CU(cudaMallocHost((void**)&pin, count * n * sizeof *pin));
    memcpy(pin, in, count * sizeof *pin);
    void* inplace = dev_of(NULL, count);
    CU(cudaMemcpyAsync(inplace, pin, count * sizeof *pin, H2D, s));
    CK(nexar_allreduce_stream(inplace, inplace, count, NEXAR_INT64, NEXAR_SUM, c, s));
    CU(cudaMemcpyAsync(pin, inplace, count * sizeof *pin, D2H, s));
    CU(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        EXPECT(pin[i] == want[i], "allreduce_stream[%zu] = %lld, want %lld", i, (long long)pin[i],
               (long long)want[i]);
    }

    /* Host buffers on a stream: the call waits for the copy into them that
     * is queued on the stream (early, it would see the fake's 0xA5). */
    int64_t* hb;
    CU(cudaMallocHost((void**)&hb, count * sizeof *hb));
    CU(cudaMemcpyAsync(hb, send, count * sizeof *hb, D2H, s));
    CK(nexar_allreduce_stream(hb, hb, count, NEXAR_INT64, NEXAR_SUM, c, s));
    for (size_t i = 0; i < count; i++) {
        EXPECT(hb[i] == want[i], "allreduce_stream of host memory [%zu] = %lld, want %lld", i,
               (long long)hb[i], (long long)want[i]);
    }
    CU(cudaFreeHost(hb));

    void* bc = dev_of(r == 0 ? in : NULL, count);
    CK(nexar_broadcast_stream(bc, count, NEXAR_INT64, 0, c, s));
    CU(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        want[i] = (int64_t)i; /* rank 0's input */
    }
    expect_dev(bc, want, count, "broadcast_stream");

    void* ag = dev_of(NULL, count * n);
    CK(nexar_allgather_stream(send, ag, count, NEXAR_INT64, c, s));
    CU(cudaStreamSynchronize(s));
    for (int k = 0; k < n; k++) {
        for (size_t i = 0; i < count; i++) {
            want[k * count + i] = (int64_t)k * 1000000 + (int64_t)i;
        }
    }
    expect_dev(ag, want, count * n, "allgather_stream");

    /* reduce_scatter in place: ag holds n blocks; block r of the sum. */
    CK(nexar_reduce_scatter_stream(ag, ag, count, NEXAR_INT64, NEXAR_SUM, c, s));
    CU(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        want[i] = (int64_t)n * ((int64_t)r * 1000000 + (int64_t)i);
    }
    expect_dev(ag, want, count, "reduce_scatter_stream (in place)");

    if (n >= 2) {
        void* p2p = dev_of(r == 0 ? in : NULL, count);
        if (r == 0) {
            CK(nexar_send_stream(p2p, count, NEXAR_INT64, 1, 7, c, s));
            CK(nexar_send(p2p, count, NEXAR_INT64, 1, 8, c));
        } else if (r == 1) {
            CK(nexar_recv_stream(p2p, count, NEXAR_INT64, 0, 7, c, s));
            CU(cudaStreamSynchronize(s));
            for (size_t i = 0; i < count; i++) {
                want[i] = (int64_t)i;
            }
            expect_dev(p2p, want, count, "recv_stream");
            void* p2 = dev_of(NULL, count);
            nexar_status_t st;
            CK(nexar_recv_status(p2, count, NEXAR_INT64, NEXAR_ANY_SOURCE, 8, c, &st));
            EXPECT(st.source == 0, "recv_status source %d", st.source);
            expect_dev(p2, want, count, "recv_status");
            CU(cudaFree(p2));
        }
        CU(cudaFree(p2p));
    }

    /* A non-blocking form refuses device memory, naming the argument. */
    nexar_request_t req;
    nexar_result_t res = nexar_iallreduce(send, recv, count, NEXAR_INT64, NEXAR_SUM, c, &req);
    EXPECT(res == NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "nexar_iallreduce") &&
               strstr(nexar_last_error(), "sendbuf") && strstr(nexar_last_error(), "device memory"),
           "iallreduce on device memory: %s: %s", nexar_result_string(res), nexar_last_error());

    CK(nexar_barrier(c));
    CU(cudaStreamDestroy(s));
    CU(cudaFreeHost(pin));
    CU(cudaFree(send));
    CU(cudaFree(recv));
    CU(cudaFree(inplace));
    CU(cudaFree(bc));
    CU(cudaFree(ag));
    CU(cudaFree(probe));
    free(in);
    free(want);
    CK(nexar_comm_destroy(c));
    return 0;
}
