// fake_cudart.c: a stand-in for libcudart.so, loaded through NEXAR_CUDART,
// that fails the way the real runtime and hardware would.
//
// - "Device memory" (cudaMalloc) is a memfd mapped twice: the address handed
//   out is mapped PROT_NONE, so any host dereference of a device pointer
//   dies by SIGSEGV as it would on a GPU; the fake's own copy routines reach
//   the bytes through a second, private read-write mapping of the same pages.
// - Streams run their work on their own thread, in order, each operation
//   after a delay (NEXAR_FAKE_CUDA_DELAY_US, default 2000): an event queried
//   too early is not complete, and a copy enqueued but not waited for has
//   not happened.
// - Events record a generation on their stream; cudaStreamWaitEvent waits
//   for the generation recorded at the time of the call, as CUDA does.
// - The legacy default stream (NULL, cudaStreamLegacy, cudaStreamPerThread)
//   is one stream with its own thread; its implicit synchronization with
//   other blocking streams is NOT modelled (the fake is stricter: only
//   explicit events order streams). cudaMemcpy runs on it and waits.
//
// Only entry points of the real runtime, with their real signatures
// (CUDA 12 runtime API); enum arguments are passed as int, which is their
// ABI. One exception, for the other fakes only: nexarFakeCudaDeviceAlias
// (at the end). Thread-safe throughout.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int cudaError_t;
typedef struct fstream* cudaStream_t;
typedef struct fevent* cudaEvent_t;
typedef void (*cudaHostFn_t)(void*);

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
};

enum { memHost2Host = 0, memHost2Device = 1, memDevice2Host = 2, memDevice2Device = 3, memDefault = 4 };
enum { typeUnregistered = 0, typeHost = 1, typeDevice = 2 };

struct cudaPointerAttributes {
    int type;
    int device;
    void* devicePointer;
    void* hostPointer;
};

// ---- allocations ------------------------------------------------------------

struct alloc {
    uintptr_t base;  // the address the caller sees
    size_t size;
    char* shadow;  // read-write alias of a device allocation; NULL for pinned host memory
    int fd;        // the memfd behind a device allocation (dma-buf export); -1 for host memory
    int type;
    struct alloc* next;
};

static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc* allocs;
static __thread cudaError_t last_error;

static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) {
        last_error = e;
    }
    return e;
}

// find returns the allocation holding [p, p+n), or NULL. Caller holds amu.
static struct alloc* find(uintptr_t p, size_t n) {
    for (struct alloc* a = allocs; a; a = a->next) {
        if (p >= a->base && p - a->base < a->size + (a->size == 0) && n <= a->size - (p - a->base)) {
            return a;
        }
    }
    return NULL;
}

// resolve turns p into an address the fake may touch: the shadow of device
// memory, or p itself for host memory. -1 on a bad range of device memory.
static int resolve(const void* p, size_t n, char** out, int* isdev) {
    pthread_mutex_lock(&amu);
    struct alloc* a = find((uintptr_t)p, n);
    int rc = 0;
    *isdev = 0;
    if (a != NULL && a->type == typeDevice) {
        *out = a->shadow + ((uintptr_t)p - a->base);
        *isdev = 1;
    } else {
        *out = (char*)p;
        // A range that starts in device memory but runs past it is an error.
        for (struct alloc* b = allocs; b; b = b->next) {
            if (b->type == typeDevice && (uintptr_t)p >= b->base && (uintptr_t)p < b->base + b->size) {
                rc = -1;
            }
        }
    }
    pthread_mutex_unlock(&amu);
    return rc;
}

// Device addresses come from a range reserved once and never handed back to
// the system, as CUDA's driver takes them from ranges it reserves for the
// life of the context under unified addressing: a freed device address is
// never returned by a host mmap or malloc, nor a freed host address by
// cudaMalloc (hier.Kinds relies on it). Addresses are not reused at all;
// past the range, allocations fall back to the system's choice.
#define DEV_SPAN ((size_t)256 << 30)
static pthread_once_t dev_once = PTHREAD_ONCE_INIT;
static uintptr_t dev_lo, dev_next, dev_hi;

static void dev_reserve(void) {
    void* p = mmap(NULL, DEV_SPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
        dev_lo = dev_next = (uintptr_t)p;
        dev_hi = dev_lo + DEV_SPAN;
    }
}

// dev_place returns where the next device allocation of len bytes goes
// (MAP_FIXED into the reserved range), or NULL for the system's choice.
static void* dev_place(size_t len) {
    pthread_once(&dev_once, dev_reserve);
    void* at = NULL;
    pthread_mutex_lock(&amu);
    if (dev_lo != 0 && dev_hi - dev_next >= len) {
        at = (void*)dev_next;
        dev_next += len;
    }
    pthread_mutex_unlock(&amu);
    return at;
}

// dev_unmap gives a device range back: inside the reserved range it is
// reserved again instead of unmapped.
static void dev_unmap(uintptr_t base, size_t len) {
    if (dev_lo != 0 && base >= dev_lo && base < dev_hi) {
        mmap((void*)base, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        return;
    }
    munmap((void*)base, len);
}

cudaError_t cudaMalloc(void** devPtr, size_t size) {
    if (devPtr == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    size_t len = size ? (size + 4095) & ~(size_t)4095 : 4096;
    int fd = memfd_create("fake-cuda-device", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        if (fd >= 0) close(fd);
        return ret(cudaErrorMemoryAllocation);
    }
    void* at = dev_place(len);
    void* dev = mmap(at, len, PROT_NONE, MAP_SHARED | (at != NULL ? MAP_FIXED : 0), fd, 0);
    void* shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dev == MAP_FAILED || shadow == MAP_FAILED) {
        close(fd);
        return ret(cudaErrorMemoryAllocation);
    }
    memset(shadow, 0xDE, len);  // uninitialised device memory is garbage
    struct alloc* a = calloc(1, sizeof *a);
    a->base = (uintptr_t)dev;
    a->size = size;
    a->shadow = shadow;
    a->fd = fd;  // kept for dma-buf export (below)
    a->type = typeDevice;
    pthread_mutex_lock(&amu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&amu);
    *devPtr = dev;
    return cudaSuccess;
}

static cudaError_t release(void* p, int type) {
    if (p == NULL) {
        return cudaSuccess;
    }
    pthread_mutex_lock(&amu);
    struct alloc** pp = &allocs;
    while (*pp && !((*pp)->base == (uintptr_t)p && (*pp)->type == type)) {
        pp = &(*pp)->next;
    }
    struct alloc* a = *pp;
    if (a) {
        *pp = a->next;
    }
    pthread_mutex_unlock(&amu);
    if (a == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    size_t len = a->size ? (a->size + 4095) & ~(size_t)4095 : 4096;
    if (type == typeDevice) {
        dev_unmap(a->base, len);
        munmap(a->shadow, len);
        close(a->fd);
    } else {
        munmap((void*)a->base, len);
    }
    free(a);
    return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) { return release(devPtr, typeDevice); }

// Internal calls go to static functions, never to the exported names: a
// process may have the real libcudart loaded globally (torch with CUDA),
// whose symbols would interpose the fake's own calls through the PLT.
static cudaError_t host_alloc(void** pHost, size_t size) {
    if (pHost == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    size_t len = size ? (size + 4095) & ~(size_t)4095 : 4096;
    void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return ret(cudaErrorMemoryAllocation);
    }
    memset(p, 0xA5, len);  // so that reading a staging buffer too early shows
    struct alloc* a = calloc(1, sizeof *a);
    a->base = (uintptr_t)p;
    a->size = size;
    a->fd = -1;
    a->type = typeHost;
    pthread_mutex_lock(&amu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&amu);
    *pHost = p;
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
    (void)flags;
    return host_alloc(pHost, size);
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return host_alloc(ptr, size); }

cudaError_t cudaFreeHost(void* ptr) { return release(ptr, typeHost); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attr, const void* ptr) {
    if (attr == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    memset(attr, 0, sizeof *attr);
    attr->device = -2;  // what CUDA 11+ reports for unregistered memory
    pthread_mutex_lock(&amu);
    struct alloc* a = find((uintptr_t)ptr, 0);
    if (a) {
        attr->type = a->type;
        attr->device = 0;
        if (a->type == typeDevice) {
            attr->devicePointer = (void*)ptr;
        } else {
            attr->hostPointer = (void*)ptr;
            attr->devicePointer = (void*)ptr;
        }
    }
    pthread_mutex_unlock(&amu);
    return cudaSuccess;
}

// ---- devices ----------------------------------------------------------------

static __thread int cur_device;

cudaError_t cudaGetDeviceCount(int* count) {
    if (count == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device != 0) {
        return ret(cudaErrorInvalidDevice);
    }
    cur_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    if (device == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    *device = cur_device;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess:
            return "no error";
        case cudaErrorInvalidValue:
            return "invalid argument";
        case cudaErrorMemoryAllocation:
            return "out of memory";
        case cudaErrorInvalidDevice:
            return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle:
            return "invalid resource handle";
        case cudaErrorNotReady:
            return "device not ready";
    }
    return "unrecognized error code";
}

const char* cudaGetErrorName(cudaError_t error) {
    switch (error) {
        case cudaSuccess:
            return "cudaSuccess";
        case cudaErrorInvalidValue:
            return "cudaErrorInvalidValue";
        case cudaErrorNotReady:
            return "cudaErrorNotReady";
    }
    return "cudaErrorUnknown";
}

// ---- streams and events -----------------------------------------------------

enum { opCopy, opRecord, opWait, opHost, opMarker };

struct op {
    int kind;
    char *dst;
    const char* src;
    size_t n;
    struct fevent* ev;
    uint64_t gen;
    cudaHostFn_t fn;
    void* user;
    int* done;  // opMarker: set when reached
    struct op* next;
};

struct fstream {
    uint32_t magic;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct op *head, *tail;
    int busy, quit;
    pthread_t thr;
};

struct fevent {
    uint32_t magic;
    uint64_t recorded;   // generation of the latest record
    uint64_t completed;  // highest generation its stream has reached
};

#define STREAM_MAGIC 0x57e4a11u
#define EVENT_MAGIC 0xe7e47u

static pthread_mutex_t emu = PTHREAD_MUTEX_INITIALIZER;  // all events
static pthread_cond_t ecv = PTHREAD_COND_INITIALIZER;

static long delay_us(void) {
    const char* s = getenv("NEXAR_FAKE_CUDA_DELAY_US");
    return s ? atol(s) : 2000;
}

static void* stream_main(void* arg) {
    struct fstream* s = arg;
    long d = delay_us();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->head == NULL && !s->quit) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->head == NULL) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        struct op* o = s->head;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);

        if (d > 0 && o->kind == opCopy) {
            struct timespec ts = {d / 1000000, (d % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
        switch (o->kind) {
            case opCopy:
                memmove(o->dst, o->src, o->n);
                break;
            case opRecord:
                pthread_mutex_lock(&emu);
                if (o->ev->completed < o->gen) {
                    o->ev->completed = o->gen;
                }
                pthread_cond_broadcast(&ecv);
                pthread_mutex_unlock(&emu);
                break;
            case opWait:
                pthread_mutex_lock(&emu);
                while (o->ev->completed < o->gen) {
                    pthread_cond_wait(&ecv, &emu);
                }
                pthread_mutex_unlock(&emu);
                break;
            case opHost:
                o->fn(o->user);
                break;
            case opMarker:
                break;
        }
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        s->busy = 0;
        if (o->kind == opMarker) {
            *o->done = 1;
        }
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        free(o);
    }
}

static struct fstream* new_stream(void) {
    struct fstream* s = calloc(1, sizeof *s);
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->thr, NULL, stream_main, s);
    return s;
}

static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static struct fstream* default_stream;
static void make_default(void) { default_stream = new_stream(); }

// stream maps a cudaStream_t to the fake's stream; NULL when invalid.
static struct fstream* stream(cudaStream_t s) {
    if (s == NULL || s == (cudaStream_t)0x1 || s == (cudaStream_t)0x2) {
        pthread_once(&default_once, make_default);
        return default_stream;
    }
    return s->magic == STREAM_MAGIC ? s : NULL;
}

static void enqueue(struct fstream* s, struct op* o) {
    pthread_mutex_lock(&s->mu);
    if (s->tail) {
        s->tail->next = o;
    } else {
        s->head = o;
    }
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

// drain waits until everything enqueued on s so far has run.
static void drain(struct fstream* s) {
    int done = 0;
    struct op* o = calloc(1, sizeof *o);
    o->kind = opMarker;
    o->done = &done;
    enqueue(s, o);
    pthread_mutex_lock(&s->mu);
    while (!done) {
        pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

static cudaError_t stream_create(cudaStream_t* pStream) {
    if (pStream == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    *pStream = new_stream();
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
    (void)flags;
    return stream_create(pStream);
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return stream_create(pStream); }

cudaError_t cudaStreamDestroy(cudaStream_t st) {
    struct fstream* s = stream(st);
    if (s == NULL || s == default_stream) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    // CUDA lets pending work finish after destroy; the fake drains first.
    drain(s);
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    s->magic = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thr, NULL);
    free(s);
    return cudaSuccess;
}

static cudaError_t stream_sync(cudaStream_t st) {
    struct fstream* s = stream(st);
    if (s == NULL) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    drain(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) { return stream_sync(st); }

cudaError_t cudaStreamQuery(cudaStream_t st) {
    struct fstream* s = stream(st);
    if (s == NULL) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    pthread_mutex_lock(&s->mu);
    int idle = s->head == NULL && !s->busy;
    pthread_mutex_unlock(&s->mu);
    return idle ? cudaSuccess : cudaErrorNotReady;
}

static cudaError_t event_create(cudaEvent_t* event) {
    if (event == NULL) {
        return ret(cudaErrorInvalidValue);
    }
    struct fevent* e = calloc(1, sizeof *e);
    e->magic = EVENT_MAGIC;
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
    (void)flags;
    return event_create(event);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return event_create(event); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (event == NULL || event->magic != EVENT_MAGIC) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    // CUDA defers the release until recorded work completes; the fake
    // leaks the few bytes instead so that a stream thread never touches
    // freed memory.
    event->magic = 0;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t st) {
    struct fstream* s = stream(st);
    if (event == NULL || event->magic != EVENT_MAGIC || s == NULL) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    struct op* o = calloc(1, sizeof *o);
    o->kind = opRecord;
    o->ev = event;
    pthread_mutex_lock(&emu);
    o->gen = ++event->recorded;
    pthread_mutex_unlock(&emu);
    enqueue(s, o);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    if (event == NULL || event->magic != EVENT_MAGIC) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    pthread_mutex_lock(&emu);
    int done = event->completed >= event->recorded;
    pthread_mutex_unlock(&emu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    if (event == NULL || event->magic != EVENT_MAGIC) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    pthread_mutex_lock(&emu);
    uint64_t want = event->recorded;
    while (event->completed < want) {
        pthread_cond_wait(&ecv, &emu);
    }
    pthread_mutex_unlock(&emu);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t event, unsigned int flags) {
    (void)flags;
    struct fstream* s = stream(st);
    if (event == NULL || event->magic != EVENT_MAGIC || s == NULL) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    struct op* o = calloc(1, sizeof *o);
    o->kind = opWait;
    o->ev = event;
    pthread_mutex_lock(&emu);
    o->gen = event->recorded;  // the record current at the call, as CUDA
    pthread_mutex_unlock(&emu);
    enqueue(s, o);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void* userData) {
    struct fstream* s = stream(st);
    if (s == NULL || fn == NULL) {
        return ret(s == NULL ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
    }
    struct op* o = calloc(1, sizeof *o);
    o->kind = opHost;
    o->fn = fn;
    o->user = userData;
    enqueue(s, o);
    return cudaSuccess;
}

// ---- copies -----------------------------------------------------------------

// prepare checks a copy's direction against what the addresses are and
// resolves them to addresses the fake may touch.
static cudaError_t prepare(void* dst, const void* src, size_t n, int kind, char** d, char** s) {
    int ddev, sdev;
    if (resolve(dst, n, d, &ddev) != 0 || resolve(src, n, s, &sdev) != 0) {
        return cudaErrorInvalidValue;
    }
    switch (kind) {
        case memHost2Host:
            return ddev || sdev ? cudaErrorInvalidValue : cudaSuccess;
        case memHost2Device:
            return ddev && !sdev ? cudaSuccess : cudaErrorInvalidValue;
        case memDevice2Host:
            return !ddev && sdev ? cudaSuccess : cudaErrorInvalidValue;
        case memDevice2Device:
            return ddev && sdev ? cudaSuccess : cudaErrorInvalidValue;
        case memDefault:
            return cudaSuccess;
    }
    return cudaErrorInvalidValue;
}

static cudaError_t memcpy_async(void* dst, const void* src, size_t count, int kind, cudaStream_t st) {
    struct fstream* s = stream(st);
    if (s == NULL) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    char *d, *sp;
    cudaError_t e = prepare(dst, src, count, kind, &d, &sp);
    if (e != cudaSuccess) {
        return ret(e);
    }
    if (count == 0) {
        return cudaSuccess;
    }
    struct op* o = calloc(1, sizeof *o);
    o->kind = opCopy;
    o->dst = d;
    o->src = sp;
    o->n = count;
    enqueue(s, o);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind, cudaStream_t st) {
    return memcpy_async(dst, src, count, kind, st);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
    cudaError_t e = memcpy_async(dst, src, count, kind, NULL);
    if (e != cudaSuccess) {
        return e;
    }
    return stream_sync(NULL);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
    char* d;
    int isdev;
    if (resolve(devPtr, count, &d, &isdev) != 0 || !isdev) {
        return ret(cudaErrorInvalidValue);
    }
    stream_sync(NULL);
    memset(d, value, count);
    return cudaSuccess;
}

// ---- for the other fakes only -------------------------------------------------

// nexarFakeCudaDeviceAlias is not a CUDA entry point: it lets the fake NCCL
// (tests/fakes/nccl), which stands for kernels running on the device, reach
// device memory the way the fake's own copies do, through the private
// read-write alias. It returns the alias of [p, p+n) when that range lies
// within one device allocation, else NULL. Code under test never calls it:
// to the host, device memory stays unreadable.
void* nexarFakeCudaDeviceAlias(const void* p, size_t n) {
    pthread_mutex_lock(&amu);
    struct alloc* a = find((uintptr_t)p, n);
    void* out = NULL;
    if (a != NULL && a->type == typeDevice) {
        out = a->shadow + ((uintptr_t)p - a->base);
    }
    pthread_mutex_unlock(&amu);
    return out;
}

// ---- dma-buf export (GPUDirect RDMA) ----------------------------------------

// A device range exported as a dma-buf is, here, the allocation's memfd
// reopened (a file description of its own) and positioned at the range's
// start: the fake libibverbs (tests/fakes/ibverbs) maps it for its own use
// and never touches the device address. NEXAR_FAKE_CUDA_DMABUF=0 makes the
// export fail as a driver or kernel without dma-buf support does.

enum { cuSuccess = 0, cuErrorInvalidValue = 1, cuErrorNotSupported = 801 };
enum { cuRangeHandleDmaBufFd = 1 };

// export_range opens a file description for [p, p+n) of one device
// allocation: the fd and the range's offset in the memfd.
static int export_range(uintptr_t p, size_t n, int* fd, uint64_t* off) {
    pthread_mutex_lock(&amu);
    struct alloc* a = allocs;
    for (; a; a = a->next) {
        size_t len = a->size ? (a->size + 4095) & ~(size_t)4095 : 4096;
        if (a->type == typeDevice && p >= a->base && p - a->base < len && n <= len - (p - a->base)) break;
    }
    int rc = -1;
    if (a && n > 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", a->fd);
        *fd = open(path, O_RDWR | O_CLOEXEC);
        *off = p - a->base;
        rc = *fd >= 0 ? 0 : -1;
    }
    pthread_mutex_unlock(&amu);
    return rc;
}

// cuMemGetHandleForAddressRange is the CUDA driver's dma-buf export (CUDA
// 11.7+): handle is an int* for CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD; the
// range must be page aligned and within one allocation.
int cuMemGetHandleForAddressRange(void* handle, unsigned long long dptr, size_t size, int handleType,
                                  unsigned long long flags) {
    const char* env = getenv("NEXAR_FAKE_CUDA_DMABUF");
    if (env && strcmp(env, "0") == 0) {
        return cuErrorNotSupported;
    }
    if (handle == NULL || handleType != cuRangeHandleDmaBufFd || flags != 0 || dptr % 4096 != 0 || size % 4096 != 0) {
        return cuErrorInvalidValue;
    }
    int fd;
    uint64_t off;
    if (export_range((uintptr_t)dptr, size, &fd, &off) != 0) {
        return cuErrorInvalidValue;
    }
    if (lseek(fd, (off_t)off, SEEK_SET) < 0) {
        close(fd);
        return cuErrorInvalidValue;
    }
    *(int*)handle = fd;
    return cuSuccess;
}

// nexar_fake_cuda_export stands in for nvidia-peermem: the fake libibverbs
// asks it for the memory behind a device range it is told to register.
int nexar_fake_cuda_export(const void* p, size_t n, int* fd, uint64_t* off) {
    return export_range((uintptr_t)p, n, fd, off);
}
