/* test_unknown_ptr: device pointers of a CUDA runtime libnexar was not told
 * about (no NEXAR_CUDART). Run under `nexar run -n N`, N >= 1, in one of
 * two builds:
 *
 *   loaded LIB  the program dlopen()s the fake CUDA runtime (tests/fakes/
 *               cudart) itself, RTLD_LOCAL, under a soname libnexar does
 *               not probe (as torch's bundled libcudart-<hash>.so): libnexar
 *               finds it among the loaded objects, and a device allreduce
 *               is correct.
 *   static      the fake runtime is compiled into the program (as nvcc
 *               links the static CUDA runtime by default): nothing exports
 *               it, libnexar cannot classify the pointer, and the call
 *               fails with NEXAR_ERR_INVALID_ARGUMENT naming the argument,
 *               the pointer and NEXAR_CUDART; the process survives (before
 *               the fix it died with Go's "unexpected fault address") and
 *               its host collectives still work. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

typedef int (*malloc_fn)(void**, size_t);
typedef int (*memcpy_fn)(void*, const void*, size_t, int);

#ifdef NEXAR_TEST_STATIC
int cudaMalloc(void** p, size_t n);
int cudaMemcpy(void* dst, const void* src, size_t n, int kind);
#endif

int main(int argc, char** argv) {
    malloc_fn dmalloc;
    memcpy_fn dcopy;
#ifdef NEXAR_TEST_STATIC
    (void)argc;
    (void)argv;
    dmalloc = cudaMalloc;
    dcopy = cudaMemcpy;
#else
    EXPECT(argc == 2, "usage: %s FAKE_CUDART", argv[0]);
    void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    EXPECT(h != NULL, "dlopen %s: %s", argv[1], dlerror());
    /* POSIX: a function pointer from dlsym's void* through memcpy. */
    void* f = dlsym(h, "cudaMalloc");
    EXPECT(f != NULL, "dlsym cudaMalloc");
    memcpy(&dmalloc, &f, sizeof f);
    f = dlsym(h, "cudaMemcpy");
    EXPECT(f != NULL, "dlsym cudaMemcpy");
    memcpy(&dcopy, &f, sizeof f);
#endif
    EXPECT(getenv("NEXAR_CUDART") == NULL || getenv("NEXAR_CUDART")[0] == 0,
           "NEXAR_CUDART is set: the test is of a runtime libnexar is not told about");

    int r, n;
    nexar_comm_t c = init_world(&r, &n);
    const size_t count = 777;
    int64_t in[777];
    for (size_t i = 0; i < count; i++) {
        in[i] = (int64_t)(r + 1) * 1000 + (int64_t)i;
    }
    void* d;
    EXPECT(dmalloc(&d, sizeof in) == 0, "cudaMalloc");
    EXPECT(dcopy(d, in, sizeof in, 1) == 0, "cudaMemcpy H2D");

    nexar_result_t res = nexar_allreduce(d, d, count, NEXAR_INT64, NEXAR_SUM, c);
#ifdef NEXAR_TEST_STATIC
    EXPECT(res == NEXAR_ERR_INVALID_ARGUMENT, "allreduce of an unclassifiable pointer: %s: %s",
           nexar_result_string(res), nexar_last_error());
    char ptr[32];
    snprintf(ptr, sizeof ptr, "%p", d);
    const char* msg = nexar_last_error();
    EXPECT(strstr(msg, "nexar_allreduce") && strstr(msg, "buf") && strstr(msg, ptr + 2) &&
               strstr(msg, "NEXAR_CUDART"),
           "message %s does not name the call, the argument, %s and NEXAR_CUDART", msg, ptr);
    /* The process and the communicator carry on: the refusal was local. */
    sum_check(c);
    printf("rank %d: refused: %s\n", r, msg);
#else
    int64_t got[777];
    CK(res);
    EXPECT(dcopy(got, d, sizeof got, 2) == 0, "cudaMemcpy D2H");
    for (size_t i = 0; i < count; i++) {
        int64_t want = (int64_t)n * (n + 1) / 2 * 1000 + (int64_t)n * (int64_t)i;
        EXPECT(got[i] == want, "allreduce[%zu] = %lld, want %lld", i, (long long)got[i],
               (long long)want);
    }
    printf("rank %d: found the runtime the program loaded\n", r);
#endif
    CK(nexar_comm_destroy(c));
    return 0;
}
