/* test_bucketed: nexar_allreduce_multi and nexar_iallreduce_multi with
 * real data (buffers of mixed sizes, several bucket sizes, in place and
 * not, a collective issued while the non-blocking form is in flight),
 * nexar_allreduce_compressed (TopK with error feedback, RandomK scaled),
 * and every kind of bad argument. Run under `nexar run -n N`, N >= 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

#define NB 7
static const size_t counts[NB] = {3, 0, 1000, 1, 70000, 17, 5};

static double val(int r, int b, size_t i) { return r * 1000000.0 + b * 100000.0 + (double)i; }

static void fill(double** bufs, int r) {
    for (int b = 0; b < NB; b++)
        for (size_t i = 0; i < counts[b]; i++) bufs[b][i] = val(r, b, i);
}

static void check(double** bufs, int n, const char* what) {
    for (int b = 0; b < NB; b++)
        for (size_t i = 0; i < counts[b]; i++) {
            double want = 0;
            for (int k = 0; k < n; k++) want += val(k, b, i);
            EXPECT(bufs[b][i] == want, "%s: buffer %d [%zu] = %g, want %g", what, b, i, bufs[b][i],
                   want);
        }
}

static int failures;

static void bad_in(int line, nexar_result_t got, const char* fn, const char* want) {
    const char* msg = nexar_last_error();
    if (got != NEXAR_ERR_INVALID_ARGUMENT && got != NEXAR_ERR_INVALID_HANDLE) got = NEXAR_SUCCESS;
    if (got == NEXAR_SUCCESS || strstr(msg, fn) == NULL || strstr(msg, want) == NULL) {
        fprintf(stderr, "line %d: got %d \"%s\"; want an argument error naming \"%s\"\n", line,
                (int)got, msg, want);
        failures++;
    }
}
#define BAD(call, want) bad_in(__LINE__, (call), "allreduce_multi", want)
#define BADC(call, want) bad_in(__LINE__, (call), "nexar_allreduce_compressed", want)

static void test_compressed(nexar_comm_t c, int r, int n) {
    /* TopK, one element in ten: each rank's single large element wins */
    float x[8], res[8];
    for (int i = 0; i < 8; i++) {
        x[i] = i == r % 8 ? 100.0f + (float)r : 1.0f;
        res[i] = 0;
    }
    CK(nexar_allreduce_compressed(x, res, 8, NEXAR_FLOAT32, NEXAR_COMPRESS_TOPK, 0.1, 0, c));
    for (int i = 0; i < 8; i++) {
        float want = 0;
        for (int k = 0; k < n; k++)
            if (k % 8 == i) want += 100.0f + (float)k;
        EXPECT(x[i] == want, "topk [%d] = %g, want %g", i, x[i], want);
        EXPECT(res[i] == (i == r % 8 ? 0.0f : 1.0f), "residual [%d] = %g", i, res[i]);
    }
    /* ratio 1: a plain sum, each rank counted once */
    for (int i = 0; i < 8; i++) x[i] = (float)(r + 1);
    CK(nexar_allreduce_compressed(x, NULL, 8, NEXAR_FLOAT32, NEXAR_COMPRESS_TOPK, 1.0, 0, c));
    for (int i = 0; i < 8; i++) EXPECT(x[i] == n * (n + 1) / 2.0f, "topk ratio 1 [%d] = %g", i, x[i]);
    /* RandomK without residual: 5 of 10 elements, scaled by 10/5 */
    float y[10];
    for (int i = 0; i < 10; i++) y[i] = 1.0f;
    CK(nexar_allreduce_compressed(y, NULL, 10, NEXAR_FLOAT32, NEXAR_COMPRESS_RANDOMK, 0.5, 42, c));
    int kept = 0;
    for (int i = 0; i < 10; i++) {
        EXPECT(y[i] == 0.0f || y[i] == 2.0f * (float)n, "randomk [%d] = %g", i, y[i]);
        kept += y[i] != 0.0f;
    }
    EXPECT(kept == 5, "randomk kept %d, want 5", kept);

    double d[2] = {1, 2};
    BADC(nexar_allreduce_compressed(d, NULL, 2, NEXAR_FLOAT64, NEXAR_COMPRESS_TOPK, 0.5, 0, c), "float32");
    BADC(nexar_allreduce_compressed(x, NULL, 8, NEXAR_FLOAT32, (nexar_compress_t)7, 0.5, 0, c), "method");
    BADC(nexar_allreduce_compressed(x, NULL, 8, NEXAR_FLOAT32, NEXAR_COMPRESS_TOPK, 0.0, 0, c), "ratio");
    BADC(nexar_allreduce_compressed(x, NULL, 8, NEXAR_FLOAT32, NEXAR_COMPRESS_TOPK, 1.5, 0, c), "ratio");
    BADC(nexar_allreduce_compressed(NULL, NULL, 8, NEXAR_FLOAT32, NEXAR_COMPRESS_TOPK, 0.5, 0, c), "buf");
    BADC(nexar_allreduce_compressed(x, NULL, 8, (nexar_datatype_t)99, NEXAR_COMPRESS_TOPK, 0.5, 0, c), "dt");
    BADC(nexar_allreduce_compressed(x, NULL, 8, NEXAR_FLOAT32, NEXAR_COMPRESS_TOPK, 0.5, 0, NEXAR_COMM_NULL), "comm");
    CK(nexar_barrier(c));
}

int main(void) {
    int r, n;
    nexar_comm_t c = init_world(&r, &n);

    double* recv[NB];
    double* send[NB];
    for (int b = 0; b < NB; b++) {
        recv[b] = calloc(counts[b] + 1, sizeof(double));
        send[b] = calloc(counts[b] + 1, sizeof(double));
    }
    /* 0: the default (one bucket); 64: a bucket per small buffer; 8192:
     * staged buckets of several buffers plus a direct one. */
    const size_t buckets[] = {0, 64, 8192};
    for (size_t k = 0; k < sizeof buckets / sizeof buckets[0]; k++) {
        fill(recv, r);
        CK(nexar_allreduce_multi(NULL, (void* const*)recv, counts, NB, NEXAR_FLOAT64, NEXAR_SUM,
                                 buckets[k], c));
        check(recv, n, "in place");

        fill(send, r);
        const void* sp[NB];
        for (int b = 0; b < NB; b++) sp[b] = send[b];
        sp[4] = recv[4]; /* in place for this one: its input is in recv */
        fill(recv, r);
        CK(nexar_allreduce_multi(sp, (void* const*)recv, counts, NB, NEXAR_FLOAT64, NEXAR_SUM,
                                 buckets[k], c));
        check(recv, n, "send");

        /* non-blocking, with a plain allreduce issued while it runs */
        fill(recv, r);
        nexar_request_t q;
        size_t cc[NB];
        memcpy(cc, counts, sizeof cc);
        CK(nexar_iallreduce_multi(NULL, (void* const*)recv, cc, NB, NEXAR_FLOAT64, NEXAR_SUM,
                                  buckets[k], c, &q));
        memset(cc, 0xff, sizeof cc); /* the arrays were copied */
        int32_t one = r + 1;
        CK(nexar_allreduce(&one, &one, 1, NEXAR_INT32, NEXAR_SUM, c));
        CK(nexar_wait(q));
        CK(nexar_request_free(q));
        EXPECT(one == n * (n + 1) / 2, "allreduce during the bucketed call: %d", one);
        check(recv, n, "non-blocking");
    }
    /* nothing to reduce */
    CK(nexar_allreduce_multi(NULL, NULL, NULL, 0, NEXAR_FLOAT32, NEXAR_SUM, 0, c));

    /* bad arguments: each an error naming the function and argument */
    void* rb[2] = {recv[0], recv[2]};
    const void* sb[2] = {send[0], NULL};
    size_t two[2] = {3, 4}, huge[2] = {3, SIZE_MAX / 4};
    void* nullrb[2] = {recv[0], NULL};
    const void* nullsb[2] = {NULL, NULL};
    nexar_request_t q;
    BAD(nexar_allreduce_multi(NULL, NULL, two, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, c), "recvbufs");
    BAD(nexar_allreduce_multi(NULL, rb, NULL, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, c), "counts");
    BAD(nexar_allreduce_multi(NULL, nullrb, two, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, c), "recvbufs[1]");
    BAD(nexar_allreduce_multi(sb, rb, huge, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, c), "counts[1]");
    BAD(nexar_allreduce_multi(sb, rb, two, 2, (nexar_datatype_t)99, NEXAR_SUM, 0, c), "dt");
    BAD(nexar_allreduce_multi(sb, rb, two, 2, NEXAR_FLOAT64, (nexar_op_t)99, 0, c), "op");
    BAD(nexar_allreduce_multi(sb, rb, two, 2, NEXAR_FLOAT64, NEXAR_BAND, 0, c), "band");
    BAD(nexar_allreduce_multi(sb, rb, two, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, NEXAR_COMM_NULL), "comm");
    BAD(nexar_allreduce_multi(sb, rb, two, 2, NEXAR_FLOAT64, NEXAR_SUM, SIZE_MAX, c), "bucket_bytes");
    BAD(nexar_iallreduce_multi(sb, rb, two, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, c, NULL), "req");
    BAD(nexar_iallreduce_multi(nullsb, nullrb, two, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, c, &q), "recvbufs[1]");
    /* nothing was started by the bad calls: the ranks still agree */
    CK(nexar_barrier(c));

    test_compressed(c, r, n);

    /* a destroyed communicator */
    nexar_comm_t dup;
    CK(nexar_comm_split(c, 0, r, &dup));
    CK(nexar_comm_destroy(dup));
    BAD(nexar_allreduce_multi(sb, rb, two, 2, NEXAR_FLOAT64, NEXAR_SUM, 0, dup), "comm");

    for (int b = 0; b < NB; b++) {
        free(recv[b]);
        free(send[b]);
    }
    CK(nexar_comm_destroy(c));
    if (failures) {
        fprintf(stderr, "rank %d: %d failures\n", r, failures);
        return 1;
    }
    if (r == 0) printf("test_bucketed: ok (%d ranks)\n", n);
    return 0;
}
