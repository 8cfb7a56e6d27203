/* cudautil.h: the CUDA runtime entry points the device tests call,
 * declared here with the runtime's signatures (no CUDA header needed), and
 * helpers over them. The tests link the fake runtime (tests/fakes/cudart).
 * Include after testutil.h. */
#ifndef NEXAR_CUDAUTIL_H
#define NEXAR_CUDAUTIL_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef void* cudaStream_t;
int cudaMalloc(void** p, size_t n);
int cudaFree(void* p);
int cudaMemcpy(void* dst, const void* src, size_t n, int kind);
int cudaMemcpyAsync(void* dst, const void* src, size_t n, int kind, cudaStream_t s);
int cudaMallocHost(void** p, size_t n);
int cudaFreeHost(void* p);
int cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags);
int cudaStreamSynchronize(cudaStream_t s);
int cudaStreamDestroy(cudaStream_t s);
enum { H2D = 1, D2H = 2 };

#define CU(call)                                                                      \
    do {                                                                              \
        int e_ = (call);                                                              \
        EXPECT(e_ == 0, "%s -> cudaError %d", #call, e_);                             \
    } while (0)

static inline void* dev_of(const int64_t* host, size_t count) {
    void* d;
    CU(cudaMalloc(&d, count * sizeof(int64_t)));
    if (host != NULL) {
        CU(cudaMemcpy(d, host, count * sizeof(int64_t), H2D));
    }
    return d;
}

static inline void expect_dev(const void* d, const int64_t* want, size_t count, const char* what) {
    int64_t* got = malloc(count * sizeof *got);
    CU(cudaMemcpy(got, d, count * sizeof *got, D2H));
    for (size_t i = 0; i < count; i++) {
        EXPECT(got[i] == want[i], "%s[%zu] = %lld, want %lld", what, i, (long long)got[i],
               (long long)want[i]);
    }
    free(got);
}

#endif
