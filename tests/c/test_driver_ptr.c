/* test_driver_ptr: pointers classified by the CUDA driver where libnexar
 * has no CUDA runtime. The fake CUDA runtime is compiled into the program
 * (as nvcc links the static runtime by default: nothing exports it, so
 * libnexar cannot find it), and the program loads the fake CUDA driver
 * (tests/fakes/cuda, soname libcuda.so.1; argv[1]) RTLD_LOCAL and calls
 * cuInit, as the static runtime does. libnexar then asks the driver
 * (cuPointerGetAttribute) about each pointer the host cannot vouch for.
 * Run under `nexar run -n N` without NEXAR_CUDART:
 *
 *   - device memory (cudaMalloc) is refused with NEXAR_ERR_INVALID_ARGUMENT,
 *     the message naming the call, the pointer, the driver's answer
 *     ("CUDA device memory (device 0, says the CUDA driver)") and
 *     NEXAR_CUDART; without the driver's answer the message is the generic
 *     "not memory the host can read", which fails the test;
 *   - the driver's page-locked host memory (cuMemAllocHost) and managed
 *     memory (cuMemAllocManaged) are host memory: a correct allreduce;
 *   - memory neither the driver nor the host knows (a PROT_NONE mapping) is
 *     refused with the generic message, naming the pointer;
 *   - the driver was asked (its query count grew); nothing faults, and the
 *     communicator carries on. */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "nexar.h"
#include "testutil.h"

int cudaMalloc(void** p, size_t n);
int cudaMemcpy(void* dst, const void* src, size_t n, int kind);
int cudaFree(void* p);

typedef int (*init_fn)(unsigned int);
typedef int (*alloc_host_fn)(void**, size_t);
typedef int (*alloc_managed_fn)(unsigned long long*, size_t, unsigned int);
typedef unsigned long (*count_fn)(void);

static void* sym(void* h, const char* name) {
    void* f = dlsym(h, name);
    EXPECT(f != NULL, "dlsym %s", name);
    return f;
}

/* refused checks that res is NEXAR_ERR_INVALID_ARGUMENT with a message
 * naming fn, the pointer p and what, and not naming not (may be NULL). */
static void refused(nexar_result_t res, const char* fn, const void* p, const char* what,
                    const char* not) {
    char ptr[32];
    snprintf(ptr, sizeof ptr, "%p", p);
    const char* msg = nexar_last_error();
    EXPECT(res == NEXAR_ERR_INVALID_ARGUMENT && strstr(msg, fn) && strstr(msg, ptr + 2) &&
               strstr(msg, what) && strstr(msg, "NEXAR_CUDART") && (not == NULL || !strstr(msg, not)),
           "%s of %s: %s: %s (want invalid argument naming the call, the pointer, \"%s\" and "
           "NEXAR_CUDART)",
           fn, ptr, nexar_result_string(res), msg, what);
    printf("rank %d: refused: %s\n", g_rank, msg);
}

static void allreduce_check(nexar_comm_t c, int64_t* v, size_t count, int r, int n, const char* what) {
    for (size_t i = 0; i < count; i++) {
        v[i] = (int64_t)(r + 1) * 1000 + (int64_t)i;
    }
    CK(nexar_allreduce(v, v, count, NEXAR_INT64, NEXAR_SUM, c));
    for (size_t i = 0; i < count; i++) {
        int64_t want = (int64_t)n * (n + 1) / 2 * 1000 + (int64_t)n * (int64_t)i;
        EXPECT(v[i] == want, "%s: allreduce[%zu] = %lld, want %lld", what, i, (long long)v[i],
               (long long)want);
    }
}

int main(int argc, char** argv) {
    EXPECT(argc == 2, "usage: %s FAKE_LIBCUDA", argv[0]);
    EXPECT(getenv("NEXAR_CUDART") == NULL || getenv("NEXAR_CUDART")[0] == 0,
           "NEXAR_CUDART is set: the test is of a runtime libnexar is not told about");
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL, "dlopen %s: %s", argv[1], dlerror());
    /* POSIX: function pointers from dlsym's void* through memcpy. */
    init_fn cu_init;
    alloc_host_fn alloc_host;
    alloc_managed_fn alloc_managed;
    count_fn queries;
    void* f = sym(h, "cuInit");
    memcpy(&cu_init, &f, sizeof f);
    f = sym(h, "cuMemAllocHost_v2");
    memcpy(&alloc_host, &f, sizeof f);
    f = sym(h, "cuMemAllocManaged");
    memcpy(&alloc_managed, &f, sizeof f);
    f = sym(h, "nexarFakeCuPointerQueries");
    memcpy(&queries, &f, sizeof f);
    EXPECT(cu_init(0) == 0, "cuInit");

    int r, n;
    nexar_comm_t c = init_world(&r, &n);
    const size_t count = 777;
    int64_t in[777];
    for (size_t i = 0; i < count; i++) {
        in[i] = (int64_t)i;
    }
    unsigned long asked = queries();

    /* Device memory: the driver says so; refused, saying what it is. */
    void* d;
    EXPECT(cudaMalloc(&d, sizeof in) == 0, "cudaMalloc");
    EXPECT(cudaMemcpy(d, in, sizeof in, 1) == 0, "cudaMemcpy H2D");
    refused(nexar_allreduce(d, d, count, NEXAR_INT64, NEXAR_SUM, c), "nexar_allreduce", d,
            "is CUDA device memory (device 0, says the CUDA driver)", NULL);
    char* mid = (char*)d + 8 * 100;
    refused(nexar_broadcast(mid, 10, NEXAR_INT64, 0, c), "nexar_broadcast", mid,
            "says the CUDA driver", NULL);
    EXPECT(queries() > asked, "the driver was never asked (%lu queries)", queries());

    /* The driver's host memory is host memory. */
    void* pin;
    EXPECT(alloc_host(&pin, sizeof in) == 0, "cuMemAllocHost_v2");
    allreduce_check(c, pin, count, r, n, "cuMemAllocHost memory");
    unsigned long long man;
    EXPECT(alloc_managed(&man, sizeof in, 1) == 0, "cuMemAllocManaged");
    allreduce_check(c, (int64_t*)(uintptr_t)man, count, r, n, "managed memory");

    /* Memory nobody knows: refused without a fault, not as device memory. */
    void* none = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT(none != MAP_FAILED, "mmap");
    refused(nexar_allreduce(none, none, 16, NEXAR_INT64, NEXAR_SUM, c), "nexar_allreduce", none,
            "is not memory the host can read", "says the CUDA driver");

    /* The refusals were local: the communicator and the device memory are
     * as they were. */
    int64_t back[777];
    EXPECT(cudaMemcpy(back, d, sizeof back, 2) == 0, "cudaMemcpy D2H");
    EXPECT(memcmp(back, in, sizeof in) == 0, "device memory changed by a refused call");
    sum_check(c);
    EXPECT(cudaFree(d) == 0, "cudaFree");
    munmap(none, 4096);
    CK(nexar_comm_destroy(c));
    printf("rank %d: the driver classified device, host and unknown memory\n", r);
    return 0;
}
