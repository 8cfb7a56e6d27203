// fake_hip.c: a stand-in for a second GPU runtime (ROCm's HIP), and the
// adapter a HIP backend of nexar would ship: libnexar reaches it only
// through nexar_device_adapter_t (include/nexar.h), never by name.
//
// The runtime part exports a few HIP entry points with HIP's signatures
// (hipMalloc, hipMemcpyAsync, hipPointerGetAttributes, ...) and fails the
// way a GPU would:
// - device memory (hipMalloc) is a memfd mapped twice: the address handed
//   out is PROT_NONE, so a host read of it dies by SIGSEGV; only the
//   fake's copies reach the bytes, through a private second mapping.
//   Fresh device memory holds 0xBE, fresh pinned memory 0x5A;
// - streams run their work in order on a thread of their own, each copy
//   after a delay (NEXAR_FAKE_HIP_DELAY_US, default 1000): an event
//   queried too early is not complete;
// - events record a generation; hipStreamWaitEvent waits for the record
//   current at the call;
// - hipPointerGetAttributes fails with hipErrorInvalidValue for memory it
//   did not allocate, as HIP does for plain host memory (the adapter turns
//   that into NEXAR_MEMORY_UNREGISTERED).
// It exports no cuda* name: a process that loads it has no CUDA runtime.
//
// The adapter part (nexar_fake_hip_adapter, at the end) fills the table
// from the HIP entry points alone. Not modelled: several devices, the
// NULL stream's synchronisation with other streams, managed memory.
// Thread-safe throughout.
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../../../include/nexar.h"

typedef int hipError_t;
typedef struct hstream* hipStream_t;
typedef struct hevent* hipEvent_t;

enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorInvalidDevice = 101,
    hipErrorInvalidHandle = 400,
    hipErrorNotReady = 600,
};
enum { hipMemoryTypeHost = 1, hipMemoryTypeDevice = 2 };

typedef struct {
    int type;  // hipMemoryType
    int device;
    void* devicePointer;
    void* hostPointer;
    int isManaged;
    unsigned allocationFlags;
} hipPointerAttribute_t;

// ---- memory -----------------------------------------------------------------

struct halloc {
    uintptr_t base;
    size_t len;
    char* shadow;  // the device memory's read-write alias; NULL for pinned memory
    int type;
    struct halloc* next;
};

static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;
static struct halloc* allocs;

static size_t pages(size_t n) { return n ? (n + 4095) & ~(size_t)4095 : 4096; }

// lookup returns the allocation holding p, or NULL. Caller holds amu.
static struct halloc* lookup(uintptr_t p) {
    for (struct halloc* a = allocs; a; a = a->next) {
        if (p >= a->base && p - a->base < a->len) return a;
    }
    return NULL;
}

static void track(uintptr_t base, size_t len, char* shadow, int type) {
    struct halloc* a = calloc(1, sizeof *a);
    a->base = base;
    a->len = len;
    a->shadow = shadow;
    a->type = type;
    pthread_mutex_lock(&amu);
    a->next = allocs;
    allocs = a;
    pthread_mutex_unlock(&amu);
}

hipError_t hipMalloc(void** ptr, size_t size) {
    if (ptr == NULL) return hipErrorInvalidValue;
    size_t len = pages(size);
    int fd = memfd_create("fake-hip-device", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        if (fd >= 0) close(fd);
        return hipErrorOutOfMemory;
    }
    void* dev = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    void* shadow = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (dev == MAP_FAILED || shadow == MAP_FAILED) return hipErrorOutOfMemory;
    memset(shadow, 0xBE, len);
    track((uintptr_t)dev, len, shadow, hipMemoryTypeDevice);
    *ptr = dev;
    return hipSuccess;
}

hipError_t hipHostMalloc(void** ptr, size_t size, unsigned int flags) {
    (void)flags;
    if (ptr == NULL) return hipErrorInvalidValue;
    size_t len = pages(size);
    void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return hipErrorOutOfMemory;
    memset(p, 0x5A, len);
    track((uintptr_t)p, len, NULL, hipMemoryTypeHost);
    *ptr = p;
    return hipSuccess;
}

static hipError_t release(void* p, int type) {
    if (p == NULL) return hipSuccess;
    pthread_mutex_lock(&amu);
    struct halloc** pp = &allocs;
    while (*pp && !((*pp)->base == (uintptr_t)p && (*pp)->type == type)) pp = &(*pp)->next;
    struct halloc* a = *pp;
    if (a) *pp = a->next;
    pthread_mutex_unlock(&amu);
    if (a == NULL) return hipErrorInvalidValue;
    munmap((void*)a->base, a->len);
    if (a->shadow) munmap(a->shadow, a->len);
    free(a);
    return hipSuccess;
}

hipError_t hipFree(void* ptr) { return release(ptr, hipMemoryTypeDevice); }
hipError_t hipHostFree(void* ptr) { return release(ptr, hipMemoryTypeHost); }

hipError_t hipPointerGetAttributes(hipPointerAttribute_t* attr, const void* ptr) {
    if (attr == NULL) return hipErrorInvalidValue;
    memset(attr, 0, sizeof *attr);
    pthread_mutex_lock(&amu);
    struct halloc* a = lookup((uintptr_t)ptr);
    if (a) {
        attr->type = a->type;
        attr->device = 0;
        attr->devicePointer = (void*)ptr;
        attr->hostPointer = a->type == hipMemoryTypeHost ? (void*)ptr : NULL;
    }
    pthread_mutex_unlock(&amu);
    return a ? hipSuccess : hipErrorInvalidValue;
}

// resolve turns [p, p+n) into memory the fake may touch: a device range's
// alias, or host memory as it is. -1 for a device range past its
// allocation.
static int resolve(const void* p, size_t n, char** out) {
    int rc = 0;
    pthread_mutex_lock(&amu);
    struct halloc* a = lookup((uintptr_t)p);
    if (a && a->type == hipMemoryTypeDevice) {
        size_t off = (uintptr_t)p - a->base;
        *out = a->shadow + off;
        rc = n <= a->len - off ? 0 : -1;
    } else {
        *out = (char*)p;
    }
    pthread_mutex_unlock(&amu);
    return rc;
}

// ---- devices ----------------------------------------------------------------

static __thread int cur_device;

hipError_t hipGetDeviceCount(int* count) {
    if (count == NULL) return hipErrorInvalidValue;
    *count = 1;
    return hipSuccess;
}

hipError_t hipSetDevice(int device) {
    if (device != 0) return hipErrorInvalidDevice;
    cur_device = device;
    return hipSuccess;
}

hipError_t hipGetDevice(int* device) {
    if (device == NULL) return hipErrorInvalidValue;
    *device = cur_device;
    return hipSuccess;
}

const char* hipGetErrorString(hipError_t e) {
    switch (e) {
        case hipSuccess:
            return "no error";
        case hipErrorInvalidValue:
            return "invalid argument";
        case hipErrorOutOfMemory:
            return "out of memory";
        case hipErrorInvalidDevice:
            return "invalid device ordinal";
        case hipErrorInvalidHandle:
            return "invalid resource handle";
        case hipErrorNotReady:
            return "device not ready";
    }
    return "unknown error";
}

// ---- streams and events -----------------------------------------------------

enum { opCopy, opRecord, opWait, opMarker };

struct hop {
    int kind;
    char* dst;
    const char* src;
    size_t n;
    struct hevent* ev;
    uint64_t gen;
    int* done;
    struct hop* next;
};

struct hstream {
    uint32_t magic;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct hop *head, *tail;
    int quit;
    pthread_t thr;
};

struct hevent {
    uint32_t magic;
    uint64_t recorded, completed;
};

#define STREAM_MAGIC 0x415057u
#define EVENT_MAGIC 0x41e7u

static pthread_mutex_t emu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ecv = PTHREAD_COND_INITIALIZER;

static void* stream_main(void* arg) {
    struct hstream* s = arg;
    const char* env = getenv("NEXAR_FAKE_HIP_DELAY_US");
    long d = env ? atol(env) : 1000;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->head == NULL && !s->quit) pthread_cond_wait(&s->cv, &s->mu);
        if (s->head == NULL) {
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        struct hop* o = s->head;
        pthread_mutex_unlock(&s->mu);
        switch (o->kind) {
            case opCopy:
                if (d > 0) {
                    struct timespec ts = {d / 1000000, (d % 1000000) * 1000};
                    nanosleep(&ts, NULL);
                }
                memmove(o->dst, o->src, o->n);
                break;
            case opRecord:
                pthread_mutex_lock(&emu);
                if (o->ev->completed < o->gen) o->ev->completed = o->gen;
                pthread_cond_broadcast(&ecv);
                pthread_mutex_unlock(&emu);
                break;
            case opWait:
                pthread_mutex_lock(&emu);
                while (o->ev->completed < o->gen) pthread_cond_wait(&ecv, &emu);
                pthread_mutex_unlock(&emu);
                break;
        }
        pthread_mutex_lock(&s->mu);
        s->head = o->next;
        if (s->head == NULL) s->tail = NULL;
        if (o->kind == opMarker) *o->done = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        free(o);
    }
}

static struct hstream* new_stream(void) {
    struct hstream* s = calloc(1, sizeof *s);
    s->magic = STREAM_MAGIC;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->thr, NULL, stream_main, s);
    return s;
}

static pthread_once_t null_once = PTHREAD_ONCE_INIT;
static struct hstream* null_stream;
static void make_null(void) { null_stream = new_stream(); }

static struct hstream* stream_of(hipStream_t h) {
    if (h == NULL) {
        pthread_once(&null_once, make_null);
        return null_stream;
    }
    return h->magic == STREAM_MAGIC ? h : NULL;
}

static struct hevent* event_of(hipEvent_t e) { return e && e->magic == EVENT_MAGIC ? e : NULL; }

static void enqueue(struct hstream* s, struct hop* o) {
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

static void drain(struct hstream* s) {
    int done = 0;
    struct hop* o = calloc(1, sizeof *o);
    o->kind = opMarker;
    o->done = &done;
    enqueue(s, o);
    pthread_mutex_lock(&s->mu);
    while (!done) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags) {
    (void)flags;
    if (stream == NULL) return hipErrorInvalidValue;
    *stream = new_stream();
    return hipSuccess;
}

hipError_t hipStreamDestroy(hipStream_t h) {
    struct hstream* s = stream_of(h);
    if (s == NULL || s == null_stream) return hipErrorInvalidHandle;
    drain(s);
    pthread_mutex_lock(&s->mu);
    s->quit = 1;
    s->magic = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thr, NULL);
    free(s);
    return hipSuccess;
}

hipError_t hipStreamSynchronize(hipStream_t h) {
    struct hstream* s = stream_of(h);
    if (s == NULL) return hipErrorInvalidHandle;
    drain(s);
    return hipSuccess;
}

hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags) {
    (void)flags;
    if (event == NULL) return hipErrorInvalidValue;
    struct hevent* e = calloc(1, sizeof *e);
    e->magic = EVENT_MAGIC;
    *event = e;
    return hipSuccess;
}

hipError_t hipEventDestroy(hipEvent_t event) {
    struct hevent* e = event_of(event);
    if (e == NULL) return hipErrorInvalidHandle;
    e->magic = 0;  // leaked, not freed: a stream may still hold a record of it
    return hipSuccess;
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t h) {
    struct hevent* e = event_of(event);
    struct hstream* s = stream_of(h);
    if (e == NULL || s == NULL) return hipErrorInvalidHandle;
    struct hop* o = calloc(1, sizeof *o);
    o->kind = opRecord;
    o->ev = e;
    pthread_mutex_lock(&emu);
    o->gen = ++e->recorded;
    pthread_mutex_unlock(&emu);
    enqueue(s, o);
    return hipSuccess;
}

hipError_t hipEventQuery(hipEvent_t event) {
    struct hevent* e = event_of(event);
    if (e == NULL) return hipErrorInvalidHandle;
    pthread_mutex_lock(&emu);
    int done = e->completed >= e->recorded;
    pthread_mutex_unlock(&emu);
    return done ? hipSuccess : hipErrorNotReady;
}

hipError_t hipStreamWaitEvent(hipStream_t h, hipEvent_t event, unsigned int flags) {
    (void)flags;
    struct hevent* e = event_of(event);
    struct hstream* s = stream_of(h);
    if (e == NULL || s == NULL) return hipErrorInvalidHandle;
    struct hop* o = calloc(1, sizeof *o);
    o->kind = opWait;
    o->ev = e;
    pthread_mutex_lock(&emu);
    o->gen = e->recorded;
    pthread_mutex_unlock(&emu);
    enqueue(s, o);
    return hipSuccess;
}

hipError_t hipMemcpyAsync(void* dst, const void* src, size_t n, int kind, hipStream_t h) {
    (void)kind;  // inferred from the addresses, as hipMemcpyDefault
    struct hstream* s = stream_of(h);
    if (s == NULL) return hipErrorInvalidHandle;
    char *d, *sr;
    if (resolve(dst, n, &d) != 0 || resolve(src, n, &sr) != 0) return hipErrorInvalidValue;
    struct hop* o = calloc(1, sizeof *o);
    o->kind = opCopy;
    o->dst = d;
    o->src = sr;
    o->n = n;
    enqueue(s, o);
    return hipSuccess;
}

hipError_t hipMemcpy(void* dst, const void* src, size_t n, int kind) {
    hipError_t rc = hipMemcpyAsync(dst, src, n, kind, NULL);
    if (rc == hipSuccess) drain(stream_of(NULL));
    return rc;
}

// ---- the adapter --------------------------------------------------------------
//
// What a HIP backend of nexar would ship: the table over HIP's entry points
// (ctx unused: HIP has one runtime per process).

static int a_query(void* ctx, const void* p, int* kind, int* device) {
    (void)ctx;
    hipPointerAttribute_t at;
    hipError_t rc = hipPointerGetAttributes(&at, p);
    if (rc == hipErrorInvalidValue) {  // memory HIP does not know
        *kind = NEXAR_MEMORY_UNREGISTERED;
        *device = -1;
        return 0;
    }
    if (rc != hipSuccess) return rc;
    *kind = at.isManaged ? NEXAR_MEMORY_MANAGED
                         : at.type == hipMemoryTypeDevice ? NEXAR_MEMORY_DEVICE : NEXAR_MEMORY_PINNED;
    *device = at.device;
    return 0;
}
static int a_count(void* ctx, int* n) { (void)ctx; return hipGetDeviceCount(n); }
static int a_getdev(void* ctx, int* d) { (void)ctx; return hipGetDevice(d); }
static int a_setdev(void* ctx, int d) { (void)ctx; return hipSetDevice(d); }
static int a_halloc(void* ctx, void** p, size_t n) { (void)ctx; return hipHostMalloc(p, n, 0); }
static int a_hfree(void* ctx, void* p) { (void)ctx; return hipHostFree(p); }
static int a_dalloc(void* ctx, void** p, size_t n) { (void)ctx; return hipMalloc(p, n); }
static int a_dfree(void* ctx, void* p) { (void)ctx; return hipFree(p); }
static int a_copy(void* ctx, void* d, const void* s, size_t n, int kind) { (void)ctx; return hipMemcpy(d, s, n, kind); }
static int a_copy_async(void* ctx, void* d, const void* s, size_t n, int kind, void* st) {
    (void)ctx;
    return hipMemcpyAsync(d, s, n, kind, st);
}
static int a_screate(void* ctx, void** s) { (void)ctx; return hipStreamCreateWithFlags((hipStream_t*)s, 1); }
static int a_sdestroy(void* ctx, void* s) { (void)ctx; return hipStreamDestroy(s); }
static int a_ssync(void* ctx, void* s) { (void)ctx; return hipStreamSynchronize(s); }
static int a_swait(void* ctx, void* s, void* e) { (void)ctx; return hipStreamWaitEvent(s, e, 0); }
static int a_ecreate(void* ctx, void** e) { (void)ctx; return hipEventCreateWithFlags((hipEvent_t*)e, 2); }
static int a_edestroy(void* ctx, void* e) { (void)ctx; return hipEventDestroy(e); }
static int a_erecord(void* ctx, void* e, void* s) { (void)ctx; return hipEventRecord(e, s); }
static int a_equery(void* ctx, void* e, int* done) {
    (void)ctx;
    hipError_t rc = hipEventQuery(e);
    *done = rc == hipSuccess;
    return rc == hipErrorNotReady ? 0 : rc;
}
static const char* a_errstr(void* ctx, int code) { (void)ctx; return hipGetErrorString(code); }

// nexar_fake_hip_adapter fills a with the fake HIP runtime's table.
int nexar_fake_hip_adapter(nexar_device_adapter_t* a) {
    if (a == NULL) return -1;
    memset(a, 0, sizeof *a);
    a->size = sizeof *a;
    a->version = NEXAR_DEVICE_ADAPTER_VERSION;
    a->name = "hip";
    a->pointer_query = a_query;
    a->device_count = a_count;
    a->get_device = a_getdev;
    a->set_device = a_setdev;
    a->host_alloc = a_halloc;
    a->host_free = a_hfree;
    a->device_alloc = a_dalloc;
    a->device_free = a_dfree;
    a->copy = a_copy;
    a->copy_async = a_copy_async;
    a->stream_create = a_screate;
    a->stream_destroy = a_sdestroy;
    a->stream_synchronize = a_ssync;
    a->stream_wait_event = a_swait;
    a->event_create = a_ecreate;
    a->event_destroy = a_edestroy;
    a->event_record = a_erecord;
    a->event_query = a_equery;
    a->error_string = a_errstr;
    return 0;
}
