/* test_adapter: a second GPU runtime through the C ABI's device adapter
 * (nexar_device_adapter_t), as a ROCm/HIP backend would plug in: the fake
 * HIP runtime of tests/fakes/hip (device memory the host cannot touch,
 * streams on their own threads after a delay) and its adapter. No CUDA
 * runtime is in the process (NEXAR_CUDART unset). Run under
 * `nexar run -n N`, N >= 1.
 *
 * Checks: malformed tables are refused, naming the fault; the adapter
 * installs once; a host read of the fake's device memory dies by SIGSEGV
 * (so a test passing says libnexar never read it); allreduce (blocking and
 * _stream, in place), broadcast and allgather of device memory are
 * correct; a second install is refused. */
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

/* The fake HIP runtime's entry points, with HIP's signatures. */
typedef void* hipStream_t;
int hipMalloc(void** p, size_t n);
int hipFree(void* p);
int hipMemcpy(void* dst, const void* src, size_t n, int kind);
int hipMemcpyAsync(void* dst, const void* src, size_t n, int kind, hipStream_t s);
int hipHostMalloc(void** p, size_t n, unsigned int flags);
int hipStreamCreateWithFlags(hipStream_t* s, unsigned int flags);
int hipStreamSynchronize(hipStream_t s);
int nexar_fake_hip_adapter(nexar_device_adapter_t* a);

#define HIP(call)                                                   \
    do {                                                            \
        int e_ = (call);                                            \
        EXPECT(e_ == 0, "%s -> hipError %d", #call, e_);            \
    } while (0)

static void* dev_of(const int64_t* host, size_t count) {
    void* d;
    HIP(hipMalloc(&d, count * sizeof(int64_t)));
    if (host != NULL) {
        HIP(hipMemcpy(d, host, count * sizeof(int64_t), 1));
    }
    return d;
}

static void expect_dev(const void* d, const int64_t* want, size_t count, const char* what) {
    int64_t* got = malloc(count * sizeof *got);
    HIP(hipMemcpy(got, d, count * sizeof *got, 2));
    for (size_t i = 0; i < count; i++) {
        EXPECT(got[i] == want[i], "%s[%zu] = %lld, want %lld", what, i, (long long)got[i],
               (long long)want[i]);
    }
    free(got);
}

/* refused installs a broken table and expects NEXAR_ERR_INVALID_ARGUMENT
 * with a message containing what. */
static void refused(const nexar_device_adapter_t* a, const char* what) {
    nexar_result_t r = nexar_device_adapter_install(a);
    EXPECT(r == NEXAR_ERR_INVALID_ARGUMENT, "install of a table with %s: %s", what,
           nexar_result_string(r));
    EXPECT(strstr(nexar_last_error(), what) != NULL, "message %s does not name %s",
           nexar_last_error(), what);
}

int main(void) {
    nexar_device_adapter_t a;
    EXPECT(nexar_fake_hip_adapter(&a) == 0, "nexar_fake_hip_adapter");

    nexar_device_adapter_t bad = a;
    refused(NULL, "NULL");
    bad.size = 16;
    refused(&bad, "size 16");
    bad = a;
    bad.version = NEXAR_DEVICE_ADAPTER_VERSION + 1;
    refused(&bad, "version");
    bad = a;
    bad.event_query = NULL;
    refused(&bad, "event_query");

    CK(nexar_device_adapter_install(&a));

    int r, n;
    nexar_comm_t c = init_world(&r, &n);
    const size_t count = 1001;
    int64_t* in = malloc(count * sizeof *in);
    int64_t* want = malloc(count * n * sizeof *want);
    for (size_t i = 0; i < count; i++) {
        in[i] = (int64_t)r * 1000000 + (int64_t)i;
        want[i] = 0;
        for (int k = 0; k < n; k++) {
            want[i] += (int64_t)k * 1000000 + (int64_t)i;
        }
    }

    /* The fake is faithful: a host read of its device memory dies. */
    void* probe = dev_of(in, count);
    expect_host_read_dies(probe, "fake HIP device memory");

    /* Blocking allreduce, device to device. */
    void* send = dev_of(in, count);
    void* recv = dev_of(NULL, count);
    CK(nexar_allreduce(send, recv, count, NEXAR_INT64, NEXAR_SUM, c));
    expect_dev(recv, want, count, "allreduce");
    expect_dev(send, in, count, "allreduce sendbuf (untouched)");

    /* In place on a HIP stream: the input arrives by a delayed copy queued
     * on the stream, the result is read back on it. */
    hipStream_t s;
    HIP(hipStreamCreateWithFlags(&s, 1));
    int64_t* pin;
    HIP(hipHostMalloc((void**)&pin, count * sizeof *pin, 0));
    memcpy(pin, in, count * sizeof *pin);
    void* inplace = dev_of(NULL, count);
    HIP(hipMemcpyAsync(inplace, pin, count * sizeof *pin, 1, s));
    CK(nexar_allreduce_stream(inplace, inplace, count, NEXAR_INT64, NEXAR_SUM, c, s));
    HIP(hipMemcpyAsync(pin, inplace, count * sizeof *pin, 2, s));
    HIP(hipStreamSynchronize(s));
    for (size_t i = 0; i < count; i++) {
        EXPECT(pin[i] == want[i], "allreduce_stream[%zu] = %lld, want %lld", i, (long long)pin[i],
               (long long)want[i]);
    }

    /* Broadcast from the last rank, allgather. */
    void* b = dev_of(in, count);
    CK(nexar_broadcast(b, count, NEXAR_INT64, n - 1, c));
    for (size_t i = 0; i < count; i++) {
        want[i] = (int64_t)(n - 1) * 1000000 + (int64_t)i;
    }
    expect_dev(b, want, count, "broadcast");
    void* all = dev_of(NULL, count * n);
    CK(nexar_allgather(send, all, count, NEXAR_INT64, c));
    for (int k = 0; k < n; k++) {
        for (size_t i = 0; i < count; i++) {
            want[k * count + i] = (int64_t)k * 1000000 + (int64_t)i;
        }
    }
    expect_dev(all, want, count * n, "allgather");

    /* Once per process. */
    EXPECT(nexar_device_adapter_install(&a) == NEXAR_ERR_UNAVAILABLE, "second install: %s",
           nexar_last_error());
    EXPECT(strstr(nexar_last_error(), "hip") != NULL, "second install's message %s names no hip",
           nexar_last_error());

    CK(nexar_comm_destroy(c));
    free(in);
    free(want);
    printf("rank %d: adapter ok\n", r);
    return 0;
}
