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
// - Kernels: cudaLaunchKernel runs the fake's one "kernel",
//   nexarFakeCudaKernel(long long us, const char* label), which occupies its
//   stream for us microseconds (compute that tests place on a stream).
// - cuStreamWaitValue32 (driver API): the stream waits until a 32-bit word
//   in host memory meets the condition, polled by the stream's thread.
// - A timeline, when NEXAR_FAKE_CUDA_TIMELINE is set (its value: how many
//   entries to keep): each copy, kernel, event record, stream wait, memory
//   wait and host function with its stream, addresses, size, when it was
//   enqueued, when the enqueuing call returned to the host, and when it
//   started and ended on its stream (CLOCK_MONOTONIC ns, Python's
//   time.monotonic_ns). Read with nexarFakeCudaTimeline; tests add host
//   marks with nexarFakeCudaTimelineMark.
//
// Only entry points of the real runtime, with their real signatures
// (CUDA 12 runtime API); enum arguments are passed as int, which is their
// ABI. Exceptions, for the other fakes and tests only: nexarFakeCudaDeviceAlias,
// nexarFakeCudaKernel and the timeline's (at the end). Thread-safe throughout.
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
    cudaErrorInvalidDeviceFunction = 98,
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

enum { opCopy, opRecord, opWait, opHost, opMarker, opKernel, opWaitValue };

// ---- timeline (NEXAR_FAKE_CUDA_TIMELINE) --------------------------------------

struct tl_rec {
    int kind;     // an op kind, or -1 for a host mark
    int dir;      // a copy's cudaMemcpyKind as resolved: memHost2Device...
    uintptr_t stream, dst, src;
    size_t n;
    int64_t enq, ret, start, end;  // CLOCK_MONOTONIC ns; 0: not (yet)
    char label[32];
};

static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static struct tl_rec* tl;  // NULL: no timeline
static size_t tl_cap;
static size_t tl_len;  // entries taken (atomic); past tl_cap they are dropped

static void tl_init(void) {
    const char* v = getenv("NEXAR_FAKE_CUDA_TIMELINE");
    long n = v ? atol(v) : 0;
    if (v && *v && n <= 0) n = 65536;
    if (n > 0) {
        tl = calloc((size_t)n, sizeof *tl);
        tl_cap = tl ? (size_t)n : 0;
    }
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// tl_new takes an entry (enqueued now) and returns its index + 1, or 0
// when there is no timeline or it is full.
static size_t tl_new(int kind, const void* stream, const void* dst, const void* src, size_t n, const char* label) {
    pthread_once(&tl_once, tl_init);
    if (tl == NULL) return 0;
    size_t i = __atomic_fetch_add(&tl_len, 1, __ATOMIC_RELAXED);
    if (i >= tl_cap) return 0;
    struct tl_rec* r = &tl[i];
    r->kind = kind;
    r->stream = (uintptr_t)stream;
    r->dst = (uintptr_t)dst;
    r->src = (uintptr_t)src;
    r->n = n;
    if (label) snprintf(r->label, sizeof r->label, "%s", label);
    __atomic_store_n(&r->enq, now_ns(), __ATOMIC_RELEASE);
    return i + 1;
}

static void tl_set(size_t id, int64_t* (*field)(struct tl_rec*)) {
    if (id) __atomic_store_n(field(&tl[id - 1]), now_ns(), __ATOMIC_RELEASE);
}
static int64_t* f_ret(struct tl_rec* r) { return &r->ret; }
static int64_t* f_start(struct tl_rec* r) { return &r->start; }
static int64_t* f_end(struct tl_rec* r) { return &r->end; }

struct op {
    int kind;
    size_t tl;  // timeline entry + 1, or 0
    long long us;        // opKernel: how long it runs
    uint32_t* word;      // opWaitValue: the word, its value and condition
    uint32_t value;
    unsigned int cond;
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

// The conditions of cuStreamWaitValue32 (CU_STREAM_WAIT_VALUE_GEQ is a
// cyclic comparison, as CUDA's).
enum { waitGEQ = 0, waitEQ = 1, waitAND = 2, waitNOR = 3 };

static int wait_value_met(uint32_t have, uint32_t want, unsigned int cond) {
    switch (cond) {
        case waitGEQ:
            return (int32_t)(have - want) >= 0;
        case waitEQ:
            return have == want;
        case waitAND:
            return (have & want) != 0;
        case waitNOR:
            return ~(have | want) != 0;
    }
    return 1;
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

        tl_set(o->tl, f_start);
        if (d > 0 && o->kind == opCopy) {
            struct timespec ts = {d / 1000000, (d % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
        switch (o->kind) {
            case opKernel:
                if (o->us > 0) {
                    struct timespec ts = {o->us / 1000000, (o->us % 1000000) * 1000};
                    nanosleep(&ts, NULL);
                }
                break;
            case opWaitValue:
                while (!wait_value_met(__atomic_load_n(o->word, __ATOMIC_ACQUIRE), o->value, o->cond)) {
                    struct timespec ts = {0, 20000};
                    nanosleep(&ts, NULL);
                }
                break;
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
        tl_set(o->tl, f_end);
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
    o->tl = tl_new(opRecord, s, event, NULL, 0, NULL);
    pthread_mutex_lock(&emu);
    o->gen = ++event->recorded;
    pthread_mutex_unlock(&emu);
    size_t tl = o->tl;  // o is the stream's once enqueued: it may run and be freed at once
    enqueue(s, o);
    tl_set(tl, f_ret);
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
    o->tl = tl_new(opWait, s, NULL, event, 0, NULL);
    pthread_mutex_lock(&emu);
    o->gen = event->recorded;  // the record current at the call, as CUDA
    pthread_mutex_unlock(&emu);
    size_t tl = o->tl;  // o is the stream's once enqueued: it may run and be freed at once
    enqueue(s, o);
    tl_set(tl, f_ret);
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
    o->tl = tl_new(opHost, s, NULL, NULL, 0, NULL);
    size_t tl = o->tl;  // o is the stream's once enqueued: it may run and be freed at once
    enqueue(s, o);
    tl_set(tl, f_ret);
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
    // The timeline names the caller's addresses (a device pointer, not its
    // alias) and the direction the addresses have.
    int ddev, sdev;
    char* ignore;
    resolve(dst, count, &ignore, &ddev);
    resolve(src, count, &ignore, &sdev);
    o->tl = tl_new(opCopy, s, dst, src, count, NULL);
    if (o->tl) tl[o->tl - 1].dir = ddev ? (sdev ? memDevice2Device : memHost2Device) : (sdev ? memDevice2Host : memHost2Host);
    size_t tl = o->tl;  // o is the stream's once enqueued: it may run and be freed at once
    enqueue(s, o);
    tl_set(tl, f_ret);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, int kind, cudaStream_t st) {
    return memcpy_async(dst, src, count, kind, st);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, int kind) {
    size_t before = tl ? __atomic_load_n(&tl_len, __ATOMIC_RELAXED) : 0;
    cudaError_t e = memcpy_async(dst, src, count, kind, NULL);
    if (e != cudaSuccess) {
        return e;
    }
    e = stream_sync(NULL);
    // A synchronous copy returns to the host after it ran: its entry (the
    // first taken since the call began, by this thread's copy) says so.
    if (tl && before < tl_cap && before < __atomic_load_n(&tl_len, __ATOMIC_RELAXED) && tl[before].kind == opCopy &&
        tl[before].dst == (uintptr_t)dst) {
        tl_set(before + 1, f_ret);
    }
    return e;
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

// ---- kernels, stream memory operations, timeline (tests only) ----------------

// dim3 as CUDA declares it; passed by value.
typedef struct {
    unsigned int x, y, z;
} dim3;

// nexarFakeCudaKernel is the fake's one kernel: launched with
// cudaLaunchKernel(nexarFakeCudaKernel, grid, block, args, 0, stream), where
// args[0] points to a long long (microseconds it runs) and args[1] to a
// const char* (its label on the timeline, may be NULL), it occupies its
// stream that long. Called directly, it does nothing: kernels run on streams.
void nexarFakeCudaKernel(long long us, const char* label) {
    (void)us;
    (void)label;
}

cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                             cudaStream_t st) {
    (void)sharedMem;
    struct fstream* s = stream(st);
    if (s == NULL) {
        return ret(cudaErrorInvalidResourceHandle);
    }
    // Compared as integers: ISO C has no conversion of a function pointer
    // to void* (-pedantic, as CMake builds the fake).
    if ((uintptr_t)func != (uintptr_t)nexarFakeCudaKernel) {
        return ret(cudaErrorInvalidDeviceFunction);
    }
    if (args == NULL || args[0] == NULL || gridDim.x * gridDim.y * gridDim.z == 0 ||
        blockDim.x * blockDim.y * blockDim.z == 0) {
        return ret(cudaErrorInvalidValue);
    }
    struct op* o = calloc(1, sizeof *o);
    o->kind = opKernel;
    o->us = *(const long long*)args[0];
    const char* label = args[1] ? *(const char* const*)args[1] : NULL;
    o->tl = tl_new(opKernel, s, NULL, NULL, 0, label);
    size_t tl = o->tl;  // o is the stream's once enqueued: it may run and be freed at once
    enqueue(s, o);
    tl_set(tl, f_ret);
    return cudaSuccess;
}

// cuStreamWaitValue32 (driver API; CUDA 12 names it cuStreamWaitValue32_v2):
// work enqueued on stream after it waits until the 32-bit word at addr
// meets flags' condition against value. addr is host memory (pinned, as
// CUDA needs) or device memory of the fake's.
int cuStreamWaitValue32(cudaStream_t st, unsigned long long addr, uint32_t value, unsigned int flags) {
    struct fstream* s = stream(st);
    if (s == NULL) {
        return 400;  // CUDA_ERROR_INVALID_HANDLE
    }
    if (addr == 0 || addr % 4 != 0 || (flags & 0x3) != flags) {
        return cuErrorInvalidValue;
    }
    char* p;
    int isdev;
    if (resolve((const void*)(uintptr_t)addr, 4, &p, &isdev) != 0) {
        return cuErrorInvalidValue;
    }
    struct op* o = calloc(1, sizeof *o);
    o->kind = opWaitValue;
    o->word = (uint32_t*)p;
    o->value = value;
    o->cond = flags;
    o->tl = tl_new(opWaitValue, s, (const void*)(uintptr_t)addr, NULL, 4, NULL);
    size_t tl = o->tl;  // o is the stream's once enqueued: it may run and be freed at once
    enqueue(s, o);
    tl_set(tl, f_ret);
    return cuSuccess;
}

int cuStreamWaitValue32_v2(cudaStream_t st, unsigned long long addr, uint32_t value, unsigned int flags) {
    return cuStreamWaitValue32(st, addr, value, flags);
}

// nexarFakeCudaTimelineMark adds a host mark (label) at the current time.
void nexarFakeCudaTimelineMark(const char* label) {
    size_t id = tl_new(-1, NULL, NULL, NULL, 0, label);
    if (id) {
        tl[id - 1].ret = tl[id - 1].start = tl[id - 1].end = tl[id - 1].enq;
    }
}

// nexarFakeCudaTimeline writes the timeline, one entry a line, into buf (at
// most cap bytes, NUL-terminated when cap > 0) and returns the length of
// the whole text (call again with a larger buf when it is >= cap):
//   kind stream dst src bytes enq ret start end label
// kind: copy_h2d, copy_d2h, copy_d2d, copy_h2h, kernel, record, wait,
// host, waitvalue, mark; addresses in hex; times in CLOCK_MONOTONIC ns, 0
// where not reached yet; label "-" when none. A last line "dropped N"
// counts entries past the capacity.
size_t nexarFakeCudaTimeline(char* buf, size_t cap) {
    pthread_once(&tl_once, tl_init);
    size_t len = 0, written = 0, n = __atomic_load_n(&tl_len, __ATOMIC_RELAXED);
    size_t have = n < tl_cap ? n : tl_cap;
    static const char* dirs[] = {"copy_h2h", "copy_h2d", "copy_d2h", "copy_d2d"};
    for (size_t i = 0; i < have; i++) {
        struct tl_rec* r = &tl[i];
        int64_t enq = __atomic_load_n(&r->enq, __ATOMIC_ACQUIRE);
        if (enq == 0) continue;  // being written
        const char* kind = "?";
        switch (r->kind) {
            case opCopy: kind = dirs[r->dir & 3]; break;
            case opKernel: kind = "kernel"; break;
            case opRecord: kind = "record"; break;
            case opWait: kind = "wait"; break;
            case opHost: kind = "host"; break;
            case opWaitValue: kind = "waitvalue"; break;
            case -1: kind = "mark"; break;
        }
        char line[256];
        int k = snprintf(line, sizeof line, "%s %#lx %#lx %#lx %zu %lld %lld %lld %lld %s\n", kind,
                         (unsigned long)r->stream, (unsigned long)r->dst, (unsigned long)r->src, r->n, (long long)enq,
                         (long long)__atomic_load_n(&r->ret, __ATOMIC_ACQUIRE),
                         (long long)__atomic_load_n(&r->start, __ATOMIC_ACQUIRE),
                         (long long)__atomic_load_n(&r->end, __ATOMIC_ACQUIRE), r->label[0] ? r->label : "-");
        if (len + k < cap) memcpy(buf + len, line, k), written = len + k;
        len += k;
    }
    if (n > tl_cap) {
        char line[64];
        int k = snprintf(line, sizeof line, "dropped %zu\n", n - tl_cap);
        if (len + k < cap) memcpy(buf + len, line, k), written = len + k;
        len += k;
    }
    if (cap > 0) buf[written] = 0;
    return len;
}
