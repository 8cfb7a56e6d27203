/* test_device_stream: the _stream forms of reduce, alltoall, alltoallv,
 * gather and scatter with CUDA device pointers, against the fake CUDA
 * runtime (tests/fakes/cudart: device memory the host cannot touch,
 * streams that run on their own threads, each copy after a delay). The
 * program links the fake and NEXAR_CUDART names the same file, so libnexar
 * and this program share one fake runtime. Run under `nexar run -n N`.
 *
 * Stream order, both ways: every input is written by a copy queued on the
 * stream just before the call, and every result is read by a copy queued
 * on the stream just after it, then the stream is synchronized. A call
 * that did not wait for the stream reads the fake's fill bytes (0xDE) or
 * an earlier input; one whose results were not ordered on the stream
 * leaves the read-back copy to see what the buffer held before. Either
 * fails element by element. Then bad arguments: each call fails with
 * NEXAR_ERR_INVALID_ARGUMENT naming the call and the argument, leaves the
 * device buffers as they were, and the communicator carries on. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

#include "cudautil.h"

static cudaStream_t s;

/* put queues a copy of count elements of host into d on s (through pinned
 * memory, which stays allocated until the stream has run it: it is freed
 * by the next get). */
static int64_t* pending[64];
static size_t npending;

static void put(void* d, const int64_t* host, size_t count) {
    int64_t* pin;
    CU(cudaMallocHost((void**)&pin, count * sizeof *pin + 1));
    memcpy(pin, host, count * sizeof *pin);
    CU(cudaMemcpyAsync(d, pin, count * sizeof *pin, H2D, s));
    EXPECT(npending < sizeof pending / sizeof pending[0], "too many pending copies");
    pending[npending++] = pin;
}

/* get checks d after the work queued on s so far, read by a copy queued
 * on s. */
static void get(const void* d, const int64_t* want, size_t count, const char* what) {
    int64_t* pin;
    CU(cudaMallocHost((void**)&pin, count * sizeof *pin + 1));
    CU(cudaMemcpyAsync(pin, d, count * sizeof *pin, D2H, s));
    CU(cudaStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        EXPECT(pin[i] == want[i], "%s[%zu] = %lld, want %lld", what, i, (long long)pin[i],
               (long long)want[i]);
    }
    CU(cudaFreeHost(pin));
    while (npending > 0) {
        CU(cudaFreeHost(pending[--npending]));
    }
}

/* expect_refused checks a call's result: NEXAR_ERR_INVALID_ARGUMENT with
 * a last error naming fn and what. */
static void expect_refused(nexar_result_t res, const char* fn, const char* what) {
    const char* msg = nexar_last_error();
    EXPECT(res == NEXAR_ERR_INVALID_ARGUMENT && strstr(msg, fn) != NULL && strstr(msg, what) != NULL,
           "%s: %s: %s (want invalid argument naming %s)", fn, nexar_result_string(res), msg, what);
}

static int64_t val(int from, int to, size_t i) {
    return (int64_t)from * 1000000 + (int64_t)to * 1000 + (int64_t)i;
}

int main(void) {
    int r, n;
    nexar_comm_t c = init_world(&r, &n);
    const size_t un = (size_t)n;
    const size_t count = 999;
    CU(cudaStreamCreateWithFlags(&s, 1)); /* cudaStreamNonBlocking */
    int64_t* in = malloc(count * un * sizeof *in);
    int64_t* want = malloc(count * un * sizeof *want);
    int64_t* old = malloc(count * un * sizeof *old);
    for (size_t i = 0; i < count * un; i++) {
        old[i] = -7;
    }

    /* reduce_stream to the last rank, sum, out of place (the other ranks
     * pass recvbuf NULL), then max in place on root. */
    {
        const int root = n - 1;
        void* send = dev_of(NULL, count);
        void* recv = r == root ? dev_of(NULL, count) : NULL;
        for (size_t i = 0; i < count; i++) {
            in[i] = val(r, 0, i);
            want[i] = 0;
            for (int k = 0; k < n; k++) {
                want[i] += val(k, 0, i);
            }
        }
        put(send, in, count);
        if (recv != NULL) {
            put(recv, old, count);
        }
        CK(nexar_reduce_stream(send, recv, count, NEXAR_INT64, NEXAR_SUM, root, c, s));
        if (r == root) {
            get(recv, want, count, "reduce_stream");
        }
        get(send, in, count, "reduce_stream sendbuf (untouched)");

        for (size_t i = 0; i < count; i++) {
            in[i] = (int64_t)((r * 7 + (int)i) % (n + 3));
            want[i] = 0;
            for (int k = 0; k < n; k++) {
                int64_t v = (int64_t)((k * 7 + (int)i) % (n + 3));
                want[i] = v > want[i] ? v : want[i];
            }
        }
        put(send, in, count);
        CK(nexar_reduce_stream(send, r == root ? send : NULL, count, NEXAR_INT64, NEXAR_MAX, root, c, s));
        if (r == root) {
            get(send, want, count, "reduce_stream in place (max)");
        } else {
            get(send, in, count, "reduce_stream sendbuf of a non-root (untouched)");
        }
        CU(cudaFree(send));
        if (recv != NULL) {
            CU(cudaFree(recv));
        }
    }

    /* alltoall_stream: block j of rank r's sendbuf goes to block r of rank
     * j's recvbuf; out of place, then in place. */
    {
        void* send = dev_of(NULL, count * un);
        void* recv = dev_of(NULL, count * un);
        for (size_t j = 0; j < un; j++) {
            for (size_t i = 0; i < count; i++) {
                in[j * count + i] = val(r, (int)j, i);
                want[j * count + i] = val((int)j, r, i);
            }
        }
        put(send, in, count * un);
        put(recv, old, count * un);
        CK(nexar_alltoall_stream(send, recv, count, NEXAR_INT64, c, s));
        get(recv, want, count * un, "alltoall_stream");
        put(send, in, count * un);
        CK(nexar_alltoall_stream(send, send, count, NEXAR_INT64, c, s));
        get(send, want, count * un, "alltoall_stream in place");
        CU(cudaFree(send));
        CU(cudaFree(recv));
    }

    /* alltoallv_stream: rank r sends r+j+1 elements to rank j, packed with
     * a gap of 1 in sendbuf and of 2 in recvbuf; the gaps of recvbuf keep
     * what they held. */
    {
        size_t sc[16], sd[16], rc[16], rd[16];
        EXPECT(n <= 16, "world of %d", n);
        size_t send_n = 0, recv_n = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = (size_t)(r + j + 1);
            sd[j] = send_n;
            send_n += sc[j] + 1;
            rc[j] = (size_t)(j + r + 1);
            rd[j] = recv_n;
            recv_n += rc[j] + 2;
        }
        for (size_t i = 0; i < send_n; i++) {
            in[i] = -1;
        }
        for (size_t i = 0; i < recv_n; i++) {
            want[i] = old[0];
        }
        for (int j = 0; j < n; j++) {
            for (size_t k = 0; k < sc[j]; k++) {
                in[sd[j] + k] = val(r, j, k);
            }
            for (size_t k = 0; k < rc[j]; k++) {
                want[rd[j] + k] = val(j, r, k);
            }
        }
        void* send = dev_of(NULL, send_n);
        void* recv = dev_of(NULL, recv_n);
        put(send, in, send_n);
        put(recv, old, recv_n);
        CK(nexar_alltoallv_stream(send, sc, sd, recv, rc, rd, NEXAR_INT64, c, s));
        get(recv, want, recv_n, "alltoallv_stream");

        /* Bad arguments, naming what is wrong; recv keeps its contents. */
        expect_refused(nexar_alltoallv_stream(send, NULL, sd, recv, rc, rd, NEXAR_INT64, c, s),
                       "nexar_alltoallv_stream", "sendcounts is NULL");
        expect_refused(nexar_alltoallv_stream(recv, rc, rd, recv, rc, rd, NEXAR_INT64, c, s),
                       "nexar_alltoallv_stream", "no in-place form");
        get(recv, want, recv_n, "alltoallv_stream recvbuf after refused calls");
        CU(cudaFree(send));
        CU(cudaFree(recv));
    }

    /* gather_stream to rank 1 % n (the others pass recvbuf NULL). */
    {
        const int root = 1 % n;
        void* send = dev_of(NULL, count);
        void* recv = r == root ? dev_of(NULL, count * un) : NULL;
        for (size_t i = 0; i < count; i++) {
            in[i] = val(r, root, i);
        }
        for (size_t k = 0; k < un; k++) {
            for (size_t i = 0; i < count; i++) {
                want[k * count + i] = val((int)k, root, i);
            }
        }
        put(send, in, count);
        if (recv != NULL) {
            put(recv, old, count * un);
        }
        CK(nexar_gather_stream(send, recv, count, NEXAR_INT64, root, c, s));
        if (r == root) {
            get(recv, want, count * un, "gather_stream");
        }
        get(send, in, count, "gather_stream sendbuf (untouched)");
        CU(cudaFree(send));
        if (recv != NULL) {
            CU(cudaFree(recv));
        }
    }

    /* scatter_stream from rank n/2 (the others pass sendbuf NULL). */
    {
        const int root = n / 2;
        void* send = r == root ? dev_of(NULL, count * un) : NULL;
        void* recv = dev_of(NULL, count);
        for (size_t k = 0; k < un; k++) {
            for (size_t i = 0; i < count; i++) {
                in[k * count + i] = val(root, (int)k, i);
            }
        }
        for (size_t i = 0; i < count; i++) {
            want[i] = val(root, r, i);
        }
        if (send != NULL) {
            put(send, in, count * un);
        }
        put(recv, old, count);
        CK(nexar_scatter_stream(send, recv, count, NEXAR_INT64, root, c, s));
        get(recv, want, count, "scatter_stream");

        /* Bad arguments: a root out of range, a count that overflows. */
        expect_refused(nexar_scatter_stream(send, recv, count, NEXAR_INT64, n, c, s),
                       "nexar_scatter_stream", "root");
        expect_refused(nexar_scatter_stream(send, recv, SIZE_MAX / 2, NEXAR_INT64, root, c, s),
                       "nexar_scatter_stream", "recvcount");
        get(recv, want, count, "scatter_stream recvbuf after refused calls");
        if (send != NULL) {
            CU(cudaFree(send));
        }
        CU(cudaFree(recv));
    }

    /* Bad arguments of the other three, on device memory. */
    {
        void* d = dev_of(NULL, count * un);
        put(d, old, count * un);
        expect_refused(nexar_reduce_stream(d, d, count, NEXAR_INT64, NEXAR_SUM, n, c, s),
                       "nexar_reduce_stream", "root");
        expect_refused(nexar_reduce_stream(d, d, count, NEXAR_INT64, (nexar_op_t)99, 0, c, s),
                       "nexar_reduce_stream", "op 99");
        expect_refused(nexar_gather_stream(d, d, count, NEXAR_INT64, -1, c, s),
                       "nexar_gather_stream", "root -1");
        expect_refused(nexar_alltoall_stream(d, NULL, count, NEXAR_INT64, c, s),
                       "nexar_alltoall_stream", "recvbuf");
        expect_refused(nexar_alltoall_stream(d, d, SIZE_MAX / 4, NEXAR_INT64, c, s),
                       "nexar_alltoall_stream", "count");
        get(d, old, count * un, "device buffer after refused calls");
        CU(cudaFree(d));
    }

    /* The communicator carries on after the refusals. */
    sum_check(c);
    CK(nexar_barrier(c));
    CU(cudaStreamDestroy(s));
    free(in);
    free(want);
    free(old);
    CK(nexar_comm_destroy(c));
    printf("rank %d: device stream collectives ok\n", r);
    return 0;
}
