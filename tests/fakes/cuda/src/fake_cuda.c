// fake_cuda.c: a stand-in for the CUDA driver, libcuda.so.1 (built with that
// soname, so that dlopen("libcuda.so.1", RTLD_NOLOAD) finds it once a test
// has loaded it by path), for the driver's pointer query that libnexar asks
// where no CUDA runtime is reachable (hw/cuda Driver, hier's noRuntime):
// cuPointerGetAttribute, with the driver's real signature and error codes.
//
// What memory it knows:
// - device memory of the fake CUDA runtime (tests/fakes/cudart, cudaMalloc):
//   the driver and the runtime are separate objects that may not see each
//   other's symbols (a runtime linked into the program statically exports
//   none), so this driver recognises it as the real driver knows its
//   allocations, by what the process has mapped: the fake runtime's device
//   memory is a memfd named "fake-cuda-device" mapped with no access
//   (/proc/self/maps); its private read-write alias of the same memfd is
//   not a device address. Reported as CU_MEMORYTYPE_DEVICE on device 0.
// - page-locked host memory and managed memory it allocated itself
//   (cuMemAllocHost_v2, cuMemHostAlloc, cuMemAllocManaged):
//   CU_MEMORYTYPE_HOST and CU_MEMORYTYPE_UNIFIED.
// - anything else (malloc, the stack, an unmapped or PROT_NONE address, a
//   freed device address, the fake runtime's own cudaMallocHost memory,
//   which is not modelled here): CUDA_ERROR_INVALID_VALUE, as the real
//   driver answers for memory it does not know.
// Every call before cuInit fails with CUDA_ERROR_NOT_INITIALIZED, as the
// real driver's do. nexarFakeCuPointerQueries (tests only) counts the calls
// of cuPointerGetAttribute, so that a test can tell the driver was asked.
// Thread-safe throughout.
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
};

// CUpointer_attribute values this fake answers.
enum {
    CU_POINTER_ATTRIBUTE_CONTEXT = 1,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
    CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
    CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
};

// CUmemorytype.
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_UNIFIED = 4 };

static atomic_int initialized;
static atomic_ulong queries;

CUresult cuInit(unsigned int flags) {
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    atomic_store(&initialized, 1);
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* version) {
    if (version == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *version = 12040;  // what a CUDA 12.4 driver reports
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
    if (!atomic_load(&initialized)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (count == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *count = 1;
    return CUDA_SUCCESS;
}

// ---- the driver's own allocations -------------------------------------------

struct dalloc {
    uintptr_t base;
    size_t len;
    int type;  // CU_MEMORYTYPE_HOST or CU_MEMORYTYPE_UNIFIED
    struct dalloc* next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct dalloc* dallocs;

static CUresult alloc(void** pp, size_t size, int type) {
    if (!atomic_load(&initialized)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (pp == NULL || size == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t len = (size + 4095) & ~(size_t)4095;
    void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct dalloc* a = calloc(1, sizeof *a);
    if (p == MAP_FAILED || a == NULL) {
        if (p != MAP_FAILED) munmap(p, len);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)p;
    a->len = len;
    a->type = type;
    pthread_mutex_lock(&mu);
    a->next = dallocs;
    dallocs = a;
    pthread_mutex_unlock(&mu);
    *pp = p;
    return CUDA_SUCCESS;
}

static CUresult release(uintptr_t p, int type) {
    if (!atomic_load(&initialized)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    pthread_mutex_lock(&mu);
    struct dalloc** pp = &dallocs;
    while (*pp && !((*pp)->base == p && (*pp)->type == type)) {
        pp = &(*pp)->next;
    }
    struct dalloc* a = *pp;
    if (a) {
        *pp = a->next;
    }
    pthread_mutex_unlock(&mu);
    if (a == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void*)a->base, a->len);
    free(a);
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void** pp, size_t bytesize) { return alloc(pp, bytesize, CU_MEMORYTYPE_HOST); }

CUresult cuMemHostAlloc(void** pp, size_t bytesize, unsigned int flags) {
    (void)flags;
    return alloc(pp, bytesize, CU_MEMORYTYPE_HOST);
}

CUresult cuMemFreeHost(void* p) { return release((uintptr_t)p, CU_MEMORYTYPE_HOST); }

CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
    (void)flags;
    void* p = NULL;
    CUresult rc = alloc(&p, bytesize, CU_MEMORYTYPE_UNIFIED);
    if (rc == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr)(uintptr_t)p;
    }
    return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return release((uintptr_t)dptr, CU_MEMORYTYPE_UNIFIED); }

// own returns the type of the driver's allocation holding p, or 0.
static int own(uintptr_t p) {
    int type = 0;
    pthread_mutex_lock(&mu);
    for (struct dalloc* a = dallocs; a; a = a->next) {
        if (p >= a->base && p - a->base < a->len) {
            type = a->type;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return type;
}

// ---- the fake runtime's device memory -----------------------------------------

// fake_device reports whether p lies in a mapping of the fake runtime's
// device memory: the memfd "fake-cuda-device" mapped with no access
// (shared). Its read-write alias maps the same memfd, and is not one.
static int fake_device(uintptr_t p) {
    FILE* f = fopen("/proc/self/maps", "re");
    if (f == NULL) {
        return 0;
    }
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        uintptr_t lo, hi;
        char perms[8];
        int path = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %*s %*s %*s %n", &lo, &hi, perms, &path) < 3) {
            continue;
        }
        if (p < lo || p >= hi) {
            continue;
        }
        found = path > 0 && strncmp(line + path, "/memfd:fake-cuda-device", 23) == 0 &&
                strcmp(perms, "---s") == 0;
        break;  // mappings do not overlap
    }
    fclose(f);
    return found;
}

// ---- the pointer query --------------------------------------------------------

// cuPointerGetAttribute(data, attribute, ptr): data is an unsigned int for
// MEMORY_TYPE, an int for DEVICE_ORDINAL, a CUdeviceptr for DEVICE_POINTER,
// a void* for HOST_POINTER, an unsigned int for IS_MANAGED.
CUresult cuPointerGetAttribute(void* data, int attribute, CUdeviceptr ptr) {
    atomic_fetch_add(&queries, 1);
    if (!atomic_load(&initialized)) {
        return CUDA_ERROR_NOT_INITIALIZED;
    }
    if (data == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    uintptr_t p = (uintptr_t)ptr;
    int type = own(p);
    if (type == 0 && fake_device(p)) {
        type = CU_MEMORYTYPE_DEVICE;
    }
    if (type == 0) {
        return CUDA_ERROR_INVALID_VALUE;  // not memory this driver knows
    }
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int*)data = (unsigned int)type;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int*)data = 0;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr*)data = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (type == CU_MEMORYTYPE_DEVICE) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        *(void**)data = (void*)p;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned int*)data = type == CU_MEMORYTYPE_UNIFIED;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

// nexarFakeCuPointerQueries is how many times cuPointerGetAttribute was
// called (tests only).
unsigned long nexarFakeCuPointerQueries(void) { return atomic_load(&queries); }
