// fake_nccl.c: a stand-in for libnccl.so.2, loaded through NEXAR_NCCL, that
// works with the fake CUDA runtime (tests/fakes/cudart) and fails the way
// NCCL does.
//
// - Communicators span processes: ncclGetUniqueId makes a random id, and
//   ncclCommInitRank maps a shared-memory segment named after it
//   (/dev/shm/nexar-fakenccl-*), then waits, with no deadline, as NCCL's
//   bootstrap does, until every rank has joined.
// - Collectives are enqueued on the caller's stream as host functions of the
//   fake CUDA runtime (cudaLaunchHostFunc): they run asynchronously on the
//   stream's thread, in stream order, after the fake's delay
//   (NEXAR_FAKE_CUDA_DELAY_US). A result is there only once the stream has
//   passed the call.
// - Device memory is reached only the way the fake runtime's own copies
//   reach it, through its private alias (nexarFakeCudaDeviceAlias): a host
//   buffer passed as a device buffer is refused, and nothing here ever
//   dereferences a device address.
// - Data moves through the segment in chunks; the ranks meet at a barrier
//   before and after each chunk. A rank that dies, or never makes the call,
//   or makes a different call (kind, count, type, op or root) leaves the
//   others waiting for ever, as NCCL's kernels do, until ncclCommAbort.
// - ncclCommAbort ends the wait of every operation of the communicator,
//   pending or queued (their outputs are left as they are), and marks the
//   rank aborted in the segment. Peers waiting on an aborted rank record
//   ncclRemoteError, which ncclCommGetAsyncError reports (as NCCL reports a
//   peer whose connections closed); they still wait until aborted
//   themselves. A rank that died is not reported: only its absence shows.
// - Groups (ncclGroupStart/End) launch their operations together at
//   ncclGroupEnd, one host function per stream, run in call order.
// - ncclSend and ncclRecv move a message between two ranks through a slot
//   of the segment per ordered pair (64 KiB at a time), matched in launch
//   order per pair, as NCCL matches them (no tags). A run of sends and
//   receives in one launch (a group) progresses together, so a ring
//   exchange in a group does not deadlock; one outside a group waits for
//   its peer. Sizes that differ between the two sides hang, as NCCL does.
//   Collectives are matched by their own count, which point-to-point work
//   does not shift.
//
// Limits of the fake: at most 16 ranks per communicator; one device (the
// fake runtime's); operations of one communicator run in the order they
// were launched, whatever their streams; an aborted communicator's memory is
// never freed (queued host functions still refer to it).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct fcomm* ncclComm_t;
typedef void* cudaStream_t;

enum { tInt8, tUint8, tInt32, tUint32, tInt64, tUint64, tFloat16, tFloat32, tFloat64, tBfloat16, numTypes };
enum { rSum, rProd, rMax, rMin, rAvg, numOps };
enum { kAllReduce = 1, kReduce, kBroadcast, kAllGather, kReduceScatter, kSend, kRecv };

#define MAXR 16
#define SLOT (256 << 10)
#define PSLOT (64 << 10)  // a pair's point-to-point slot
#define ID_MAGIC "nexar-fake-nccl"

static const size_t type_size[numTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

// ---- the fake CUDA runtime ----------------------------------------------------

typedef int (*launch_fn)(cudaStream_t, void (*)(void*), void*);
typedef void* (*alias_fn)(const void*, size_t);
static launch_fn cuda_launch;
static alias_fn cuda_alias;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

// bind_cuda finds the fake runtime: the library NEXAR_CUDART names (the one
// libnexar loaded), else the process's global symbols.
static void bind_cuda(void) {
    const char* path = getenv("NEXAR_CUDART");
    void* h = path != NULL && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : RTLD_DEFAULT;
    if (h == NULL) {
        return;
    }
    // The POSIX way to take a function from dlsym (ISO C has no
    // conversion from void* to a function pointer).
    void* f = dlsym(h, "cudaLaunchHostFunc");
    memcpy(&cuda_launch, &f, sizeof f);
    f = dlsym(h, "nexarFakeCudaDeviceAlias");
    memcpy(&cuda_alias, &f, sizeof f);
}

// ---- errors -------------------------------------------------------------------

static __thread char last_error[256];

static ncclResult_t fail(ncclResult_t r, const char* fmt, const char* what) {
    snprintf(last_error, sizeof last_error, fmt, what);
    return r;
}

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess:
            return "no error";
        case ncclUnhandledCudaError:
            return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError:
            return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError:
            return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument:
            return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage:
            return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError:
            return "remote process exited or there was a network error";
        case ncclInProgress:
            return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error;
}

ncclResult_t ncclGetVersion(int* version) {
    if (version == NULL) {
        return fail(ncclInvalidArgument, "ncclGetVersion: %s is NULL", "version");
    }
    *version = 22105;  // presents itself as NCCL 2.21.5
    return ncclSuccess;
}

// ---- communicators ------------------------------------------------------------

struct sig {
    uint64_t seq, count;
    int32_t kind, dtype, op, root;
};

// pchan carries point-to-point messages from one rank to another, a slot
// at a time: the sender fills it when sent == taken, the receiver empties
// it when sent > taken.
struct pchan {
    _Atomic uint64_t sent, taken;
    uint64_t total;  // bytes of the message the slot's chunk belongs to
    uint64_t len;    // bytes in the slot
    _Alignas(64) char data[PSLOT];
};

// shared is the segment the ranks of one communicator map.
struct shared {
    _Atomic int32_t joined[MAXR];   // the rank's nranks once it joined
    _Atomic uint64_t arrive[MAXR];  // barrier generation each rank reached
    _Atomic int32_t aborted[MAXR];  // the rank called ncclCommAbort
    struct sig sig[MAXR];
    _Alignas(64) char slot[MAXR][SLOT];
    struct pchan p2p[MAXR][MAXR];  // [from][to]; pages touched only when used
};

#define COMM_MAGIC 0xfacecc1u

struct fcomm {
    _Atomic uint32_t magic;  // 0 once destroyed or aborted: the handle is invalid
    int rank, nranks;
    struct shared* sh;
    _Atomic int abort;
    _Atomic int async;  // ncclResult_t reported by ncclCommGetAsyncError
    _Atomic int inflight;
    pthread_mutex_t mu;  // next_seq, done
    pthread_cond_t cv;
    uint64_t next_seq;  // operations launched
    uint64_t next_cseq; // collectives launched (all ranks make each)
    uint64_t done;      // operations finished (in launch order)
    uint64_t gen;       // barrier generation (the running operation's thread only)
};

static _Atomic long ops_launched;

// nexarFakeNcclLaunched is not an NCCL entry point: the number of
// collectives this process has launched, so that tests can tell that a path
// went through NCCL.
long nexarFakeNcclLaunched(void) { return atomic_load(&ops_launched); }

static long delay_us(void) {
    const char* s = getenv("NEXAR_FAKE_CUDA_DELAY_US");
    return s ? atol(s) : 2000;
}

static void backoff(unsigned* spins) {
    if (*spins < 64) {
        (*spins)++;
        sched_yield();
        return;
    }
    struct timespec ts = {0, *spins < 1000 ? 20000 : 200000};
    (*spins)++;
    nanosleep(&ts, NULL);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (id == NULL) {
        return fail(ncclInvalidArgument, "ncclGetUniqueId: %s is NULL", "uniqueId");
    }
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    if (getrandom(id->internal + 16, 16, 0) != 16) {
        return fail(ncclSystemError, "ncclGetUniqueId: %s failed", "getrandom");
    }
    return ncclSuccess;
}

static void seg_name(const ncclUniqueId* id, char* out, size_t n) {
    int k = snprintf(out, n, "/nexar-fakenccl-");
    for (int i = 0; i < 16 && (size_t)k + 2 < n; i++) {
        k += snprintf(out + k, n - (size_t)k, "%02x", (unsigned char)id->internal[16 + i]);
    }
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (comm == NULL) {
        return fail(ncclInvalidArgument, "ncclCommInitRank: %s is NULL", "comm");
    }
    *comm = NULL;
    if (nranks < 1 || nranks > MAXR) {
        return fail(ncclInvalidArgument, "ncclCommInitRank: nranks out of range [1, 16] (%s)", "fake limit");
    }
    if (rank < 0 || rank >= nranks) {
        return fail(ncclInvalidArgument, "ncclCommInitRank: %s out of range", "rank");
    }
    if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0) {
        return fail(ncclInvalidArgument, "ncclCommInitRank: %s was not made by ncclGetUniqueId", "commId");
    }
    pthread_once(&cuda_once, bind_cuda);
    if (cuda_launch == NULL || cuda_alias == NULL) {
        return fail(ncclSystemError, "ncclCommInitRank: %s",
                    "the fake NCCL needs the fake CUDA runtime (NEXAR_CUDART, tests/fakes/cudart)");
    }
    char name[64];
    seg_name(&id, name, sizeof name);
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0) {
        return fail(ncclSystemError, "ncclCommInitRank: shm_open %s failed", name);
    }
    if (ftruncate(fd, sizeof(struct shared)) != 0) {
        close(fd);
        return fail(ncclSystemError, "ncclCommInitRank: ftruncate %s failed", name);
    }
    struct shared* sh = mmap(NULL, sizeof(struct shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (sh == MAP_FAILED) {
        return fail(ncclSystemError, "ncclCommInitRank: mmap %s failed", name);
    }
    int32_t zero = 0;
    if (!atomic_compare_exchange_strong(&sh->joined[rank], &zero, nranks)) {
        munmap(sh, sizeof *sh);
        return fail(ncclInvalidUsage, "ncclCommInitRank: %s joined twice", "rank");
    }
    // NCCL's bootstrap waits for every rank, with no deadline of its own.
    unsigned spins = 0;
    for (int i = 0; i < nranks; i++) {
        int32_t v;
        while ((v = atomic_load(&sh->joined[i])) == 0) {
            backoff(&spins);
        }
        if (v != nranks) {
            return fail(ncclInvalidUsage, "ncclCommInitRank: ranks disagree on %s", "nranks");
        }
    }
    shm_unlink(name);  // every rank has it mapped; the first unlink wins
    struct fcomm* c = calloc(1, sizeof *c);
    c->rank = rank;
    c->nranks = nranks;
    c->sh = sh;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    atomic_store(&c->magic, COMM_MAGIC);
    *comm = c;
    return ncclSuccess;
}

static int valid(ncclComm_t c) { return c != NULL && atomic_load(&c->magic) == COMM_MAGIC; }

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
    if (!valid(comm) || count == NULL) {
        return fail(ncclInvalidArgument, "ncclCommCount: %s", "invalid argument");
    }
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
    if (!valid(comm) || rank == NULL) {
        return fail(ncclInvalidArgument, "ncclCommUserRank: %s", "invalid argument");
    }
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
    if (!valid(comm) || device == NULL) {
        return fail(ncclInvalidArgument, "ncclCommCuDevice: %s", "invalid argument");
    }
    *device = 0;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
    if (!valid(comm) || asyncError == NULL) {
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError: %s", "invalid communicator");
    }
    *asyncError = (ncclResult_t)atomic_load(&comm->async);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (comm == NULL) {
        return ncclSuccess;  // as NCCL
    }
    uint32_t m = COMM_MAGIC;
    if (!atomic_compare_exchange_strong(&comm->magic, &m, 0)) {
        return fail(ncclInvalidArgument, "ncclCommAbort: %s", "invalid communicator");
    }
    atomic_store(&comm->abort, 1);
    atomic_store(&comm->sh->aborted[comm->rank], 1);
    pthread_mutex_lock(&comm->mu);
    pthread_cond_broadcast(&comm->cv);
    pthread_mutex_unlock(&comm->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (comm == NULL) {
        return ncclSuccess;
    }
    uint32_t m = COMM_MAGIC;
    if (!atomic_compare_exchange_strong(&comm->magic, &m, 0)) {
        return fail(ncclInvalidArgument, "ncclCommDestroy: %s", "invalid communicator");
    }
    // Waits for the operations launched on it, as NCCL does.
    unsigned spins = 0;
    while (atomic_load(&comm->inflight) > 0) {
        backoff(&spins);
    }
    munmap(comm->sh, sizeof *comm->sh);
    pthread_mutex_destroy(&comm->mu);
    pthread_cond_destroy(&comm->cv);
    free(comm);
    return ncclSuccess;
}

// ---- execution ----------------------------------------------------------------

struct op {
    struct fcomm* c;
    int kind, dtype, redop, root;
    size_t count;
    const char* send;  // aliases of the device buffers (NULL where unused)
    char* recv;
    int peer;          // kSend, kRecv
    size_t moved;      // kSend, kRecv: bytes moved so far
    uint64_t seq;      // launch order on this rank
    uint64_t cseq;     // collectives: the same on every rank
    cudaStream_t stream;
    int skip;  // its launch failed: it takes its turn and does nothing
    struct op* next;
};

// wait_all is a barrier over the communicator's ranks: -1 once aborted.
static int wait_all(struct fcomm* c) {
    uint64_t g = ++c->gen;
    atomic_store_explicit(&c->sh->arrive[c->rank], g, memory_order_release);
    unsigned spins = 0;
    for (int i = 0; i < c->nranks; i++) {
        while (atomic_load_explicit(&c->sh->arrive[i], memory_order_acquire) < g) {
            if (atomic_load(&c->abort)) {
                return -1;
            }
            if (atomic_load(&c->sh->aborted[i])) {
                atomic_store(&c->async, ncclRemoteError);
            }
            backoff(&spins);
        }
    }
    return 0;
}

// hang is what a kernel does that waits for a peer that never comes: it
// ends only with ncclCommAbort (a peer's abort is reported, as by wait_all).
static void hang(struct fcomm* c) {
    unsigned spins = 0;
    while (!atomic_load(&c->abort)) {
        for (int i = 0; i < c->nranks; i++) {
            if (atomic_load(&c->sh->aborted[i])) {
                atomic_store(&c->async, ncclRemoteError);
            }
        }
        backoff(&spins);
    }
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xff, man = x & 0x7fffff;
    if (exp == 0xff) {
        return sign | 0x7c00 | (man ? 0x200 : 0);
    }
    int e = (int)exp - 127 + 15;
    if (e >= 0x1f) {
        return sign | 0x7c00;
    }
    if (e <= 0) {
        if (e < -10) {
            return sign;
        }
        man |= 0x800000;
        int shift = 14 - e;
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) {
            h++;
        }
        return sign | (uint16_t)h;
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) {
        h++;  // may carry into the exponent, as rounding should
    }
    return sign | (uint16_t)h;
}

static float bf16_to_float(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) {
        return (uint16_t)((x >> 16) | 0x40);
    }
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#define APPLY(T)                                                        \
    do {                                                                \
        T* d = (T*)dst;                                                 \
        const T* s = (const T*)src;                                     \
        for (size_t i = 0; i < n; i++) {                                \
            T a, b;                                                     \
            memcpy(&a, d + i, sizeof a);                                \
            memcpy(&b, s + i, sizeof b);                                \
            T v = op == rProd ? (T)(a * b)                              \
                  : op == rMax ? (a > b ? a : b)                        \
                  : op == rMin ? (a < b ? a : b)                        \
                               : (T)(a + b);                            \
            memcpy(d + i, &v, sizeof v);                                \
        }                                                               \
    } while (0)

#define APPLY16(TO, FROM)                                               \
    do {                                                                \
        for (size_t i = 0; i < n; i++) {                                \
            uint16_t x, y;                                              \
            memcpy(&x, dst + 2 * i, 2);                                 \
            memcpy(&y, src + 2 * i, 2);                                 \
            float a = TO(x), b = TO(y);                                 \
            float v = op == rProd ? a * b                               \
                      : op == rMax ? (a > b ? a : b)                    \
                      : op == rMin ? (a < b ? a : b)                    \
                                   : a + b;                             \
            uint16_t r = FROM(v);                                       \
            memcpy(dst + 2 * i, &r, 2);                                 \
        }                                                               \
    } while (0)

// reduce sets dst[i] = dst[i] op src[i] (Avg adds; finish divides).
static void reduce(char* dst, const char* src, size_t n, int dtype, int op) {
    switch (dtype) {
        case tInt8: APPLY(int8_t); break;
        case tUint8: APPLY(uint8_t); break;
        case tInt32: APPLY(int32_t); break;
        case tUint32: APPLY(uint32_t); break;
        case tInt64: APPLY(int64_t); break;
        case tUint64: APPLY(uint64_t); break;
        case tFloat32: APPLY(float); break;
        case tFloat64: APPLY(double); break;
        case tFloat16: APPLY16(half_to_float, float_to_half); break;
        case tBfloat16: APPLY16(bf16_to_float, float_to_bf16); break;
    }
}

#define DIVIDE(T)                                 \
    do {                                          \
        for (size_t i = 0; i < n; i++) {          \
            T a;                                  \
            memcpy(&a, dst + i * sizeof a, sizeof a); \
            a = (T)(a / (T)k);                    \
            memcpy(dst + i * sizeof a, &a, sizeof a); \
        }                                         \
    } while (0)

// finish divides by k for ncclAvg.
static void finish(char* dst, size_t n, int dtype, int op, int k) {
    if (op != rAvg) {
        return;
    }
    switch (dtype) {
        case tInt8: DIVIDE(int8_t); break;
        case tUint8: DIVIDE(uint8_t); break;
        case tInt32: DIVIDE(int32_t); break;
        case tUint32: DIVIDE(uint32_t); break;
        case tInt64: DIVIDE(int64_t); break;
        case tUint64: DIVIDE(uint64_t); break;
        case tFloat32: DIVIDE(float); break;
        case tFloat64: DIVIDE(double); break;
        case tFloat16:
        case tBfloat16:
            for (size_t i = 0; i < n; i++) {
                uint16_t x;
                memcpy(&x, dst + 2 * i, 2);
                float v = (dtype == tFloat16 ? half_to_float(x) : bf16_to_float(x)) / (float)k;
                x = dtype == tFloat16 ? float_to_half(v) : float_to_bf16(v);
                memcpy(dst + 2 * i, &x, 2);
            }
            break;
    }
}

// run executes one collective; -1 once aborted.
static int run(struct op* o) {
    struct fcomm* c = o->c;
    struct shared* sh = c->sh;
    int me = c->rank, n = c->nranks;
    size_t es = type_size[o->dtype];
    sh->sig[me] = (struct sig){.seq = o->cseq, .count = o->count, .kind = o->kind, .dtype = o->dtype,
                               .op = o->redop, .root = o->root};
    if (wait_all(c) != 0) {
        return -1;
    }
    for (int i = 0; i < n; i++) {
        struct sig s = sh->sig[i];
        if (s.seq != o->cseq || s.count != o->count || s.kind != o->kind || s.dtype != o->dtype ||
            s.op != o->redop || s.root != o->root) {
            hang(c);  // ranks made different calls: NCCL's kernels wait for ever
            return -1;
        }
    }
    size_t per = SLOT / es;  // elements a slot holds
    if (o->kind == kReduceScatter) {
        per /= (size_t)n;
    }
    for (size_t off = 0; off < o->count; off += per) {
        size_t k = o->count - off < per ? o->count - off : per, b = k * es;
        char* mine = sh->slot[me];
        switch (o->kind) {
            case kAllReduce:
            case kReduce:
            case kAllGather:
                memcpy(mine, o->send + off * es, b);
                break;
            case kBroadcast:
                if (me == o->root) {
                    memcpy(mine, o->send + off * es, b);
                }
                break;
            case kReduceScatter:
                for (int d = 0; d < n; d++) {
                    memcpy(mine + (size_t)d * b, o->send + ((size_t)d * o->count + off) * es, b);
                }
                break;
        }
        if (wait_all(c) != 0) {
            return -1;
        }
        switch (o->kind) {
            case kAllReduce:
            case kReduce:
                if (o->kind == kAllReduce || me == o->root) {
                    char* out = o->recv + off * es;
                    memcpy(out, sh->slot[0], b);
                    for (int i = 1; i < n; i++) {
                        reduce(out, sh->slot[i], k, o->dtype, o->redop);
                    }
                    finish(out, k, o->dtype, o->redop, n);
                }
                break;
            case kBroadcast:
                memcpy(o->recv + off * es, sh->slot[o->root], b);
                break;
            case kAllGather:
                for (int i = 0; i < n; i++) {
                    memcpy(o->recv + ((size_t)i * o->count + off) * es, sh->slot[i], b);
                }
                break;
            case kReduceScatter: {
                char* out = o->recv + off * es;
                memcpy(out, sh->slot[0] + (size_t)me * b, b);
                for (int i = 1; i < n; i++) {
                    reduce(out, sh->slot[i] + (size_t)me * b, k, o->dtype, o->redop);
                }
                finish(out, k, o->dtype, o->redop, n);
                break;
            }
        }
        if (wait_all(c) != 0) {
            return -1;
        }
    }
    return 0;
}

// p2p_step moves what it can of a send or receive without waiting: 1 once
// the operation is complete, 0 if it waits for its peer, -1 where the
// sizes of the two sides differ (NCCL would hang or corrupt: the fake
// hangs).
static int p2p_step(struct op* o) {
    struct fcomm* c = o->c;
    size_t total = o->count * type_size[o->dtype];
    if (o->kind == kSend) {
        struct pchan* ch = &c->sh->p2p[c->rank][o->peer];
        if (atomic_load_explicit(&ch->sent, memory_order_acquire) != atomic_load_explicit(&ch->taken, memory_order_acquire)) {
            return 0;
        }
        size_t k = total - o->moved < PSLOT ? total - o->moved : PSLOT;
        memcpy(ch->data, o->send + o->moved, k);
        ch->len = k;
        ch->total = total;
        o->moved += k;
        atomic_fetch_add_explicit(&ch->sent, 1, memory_order_release);
        return o->moved == total;
    }
    struct pchan* ch = &c->sh->p2p[o->peer][c->rank];
    if (atomic_load_explicit(&ch->sent, memory_order_acquire) == atomic_load_explicit(&ch->taken, memory_order_acquire)) {
        return 0;
    }
    if (ch->total != total) {
        return -1;
    }
    memcpy(o->recv + o->moved, ch->data, ch->len);
    o->moved += ch->len;
    atomic_fetch_add_explicit(&ch->taken, 1, memory_order_release);
    return o->moved == total;
}

// run_p2p progresses the sends and receives of list (up to end) together,
// as NCCL runs the point-to-point operations of a group: one waiting for
// its peer does not hold up the others. -1 once aborted.
static int run_p2p(struct op* list, struct op* end) {
    struct fcomm* c = list->c;
    unsigned spins = 0;
    for (;;) {
        int pending = 0, moved = 0;
        for (struct op* o = list; o != end; o = o->next) {
            if (o->skip || o->moved == o->count * type_size[o->dtype]) {
                continue;
            }
            size_t before = o->moved;
            int r = p2p_step(o);
            if (r < 0) {
                hang(c);
                return -1;
            }
            moved |= o->moved != before;
            pending |= r == 0;
        }
        if (!pending) {
            return 0;
        }
        if (atomic_load(&c->abort)) {
            return -1;
        }
        for (int i = 0; i < c->nranks; i++) {
            if (atomic_load(&c->sh->aborted[i])) {
                atomic_store(&c->async, ncclRemoteError);
            }
        }
        if (moved) {
            spins = 0;
        } else {
            backoff(&spins);
        }
    }
}

static int is_p2p(const struct op* o) { return o->kind == kSend || o->kind == kRecv; }

// run_batch is the host function a launch enqueues: its operations in order.
static void run_batch(void* arg) {
    long d = delay_us();
    if (d > 0) {
        struct timespec ts = {d / 1000000, (d % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    for (struct op* o = arg; o != NULL;) {
        struct fcomm* c = o->c;
        // Operations of one communicator run in launch order, whichever
        // stream they are on.
        pthread_mutex_lock(&c->mu);
        while (c->done + 1 != o->seq && !atomic_load(&c->abort)) {
            pthread_cond_wait(&c->cv, &c->mu);
        }
        pthread_mutex_unlock(&c->mu);
        // A run of sends and receives of this communicator goes together.
        struct op* end = o->next;
        if (is_p2p(o)) {
            while (end != NULL && is_p2p(end) && end->c == c) {
                end = end->next;
            }
        }
        if (!atomic_load(&c->abort)) {
            if (is_p2p(o)) {
                run_p2p(o, end);
            } else if (!o->skip) {
                run(o);
            }
        }
        while (o != end) {
            pthread_mutex_lock(&c->mu);
            if (c->done < o->seq) {
                c->done = o->seq;
            }
            pthread_cond_broadcast(&c->cv);
            pthread_mutex_unlock(&c->mu);
            atomic_fetch_sub(&c->inflight, 1);
            struct op* next = o->next;
            free(o);
            o = next;
        }
    }
}

// ---- launching ----------------------------------------------------------------

static __thread int group_depth;
static __thread struct op *group_head, *group_tail;
static __thread ncclResult_t group_err;

// launch enqueues the list (one stream) as one host function.
static ncclResult_t launch(struct op* list) {
    for (struct op* o = list; o != NULL; o = o->next) {
        struct fcomm* c = o->c;
        pthread_mutex_lock(&c->mu);
        o->seq = ++c->next_seq;
        if (!is_p2p(o)) {
            o->cseq = ++c->next_cseq;
        }
        pthread_mutex_unlock(&c->mu);
        atomic_fetch_add(&c->inflight, 1);
        atomic_fetch_add(&ops_launched, 1);
    }
    if (cuda_launch(list->stream, run_batch, list) != 0) {
        // Nothing was enqueued: the operations take their turns (their
        // sequence numbers are spent) and do nothing; peers that made the
        // calls wait for this rank, as they would for NCCL's.
        for (struct op* o = list; o != NULL; o = o->next) {
            o->skip = 1;
        }
        run_batch(list);
        return fail(ncclUnhandledCudaError, "%s", "cudaLaunchHostFunc failed");
    }
    return ncclSuccess;
}

// dev resolves n bytes of device memory at p, or fails naming what.
static int dev(const void* p, size_t n, const char* what, char** out) {
    *out = cuda_alias(p, n);
    if (*out == NULL) {
        snprintf(last_error, sizeof last_error, "%s %p is not device memory of %zu bytes", what, p, n);
        return -1;
    }
    return 0;
}

static ncclResult_t enqueue(int kind, const void* send, void* recv, size_t count, int dtype, int redop, int root,
                            ncclComm_t c, cudaStream_t stream) {
    if (kind == kSend || kind == kRecv) {
        redop = rSum;  // unused; root carries the peer
    }
    ncclResult_t r = ncclSuccess;
    struct op* o = NULL;
    if (!valid(c)) {
        r = fail(ncclInvalidArgument, "%s", "invalid communicator");
        goto out;
    }
    if (dtype < 0 || dtype >= numTypes || redop < 0 || redop >= numOps) {
        r = fail(ncclInvalidArgument, "invalid %s", "datatype or reduction op");
        goto out;
    }
    if ((kind == kReduce || kind == kBroadcast) && (root < 0 || root >= c->nranks)) {
        r = fail(ncclInvalidArgument, "%s out of range", "root");
        goto out;
    }
    if ((kind == kSend || kind == kRecv) && (root < 0 || root >= c->nranks || root == c->rank)) {
        r = fail(ncclInvalidArgument, "%s out of range (or this rank)", "peer");
        goto out;
    }
    if (count == 0) {
        goto out;  // NCCL launches nothing for an empty operation
    }
    size_t es = type_size[dtype], n = (size_t)c->nranks;
    size_t sbytes = count * es * (kind == kReduceScatter ? n : 1);
    size_t rbytes = count * es * (kind == kAllGather ? n : 1);
    o = calloc(1, sizeof *o);
    *o = (struct op){.c = c, .kind = kind, .dtype = dtype, .redop = redop, .root = root, .count = count,
                     .stream = stream};
    int needSend = kind != kRecv && (kind != kBroadcast || c->rank == root);
    int needRecv = kind != kSend && (kind != kReduce || c->rank == root);
    o->peer = root;
    char* sp = NULL;
    if ((needSend && dev(send, sbytes, "sendbuff", &sp) != 0) ||
        (needRecv && dev(recv, rbytes, "recvbuff", &o->recv) != 0)) {
        r = ncclInvalidArgument;
        free(o);
        o = NULL;
        goto out;
    }
    o->send = sp;
out:
    if (group_depth > 0) {
        if (r != ncclSuccess && group_err == ncclSuccess) {
            group_err = r;
        }
        if (o != NULL) {
            if (group_tail) {
                group_tail->next = o;
            } else {
                group_head = o;
            }
            group_tail = o;
        }
        return r;
    }
    return o != NULL ? launch(o) : r;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) {
        return fail(ncclInvalidUsage, "ncclGroupEnd: %s", "no group started");
    }
    if (--group_depth > 0) {
        return ncclSuccess;
    }
    struct op* list = group_head;
    ncclResult_t r = group_err;
    group_head = group_tail = NULL;
    group_err = ncclSuccess;
    if (r != ncclSuccess) {  // a failed group launches nothing
        while (list) {
            struct op* next = list->next;
            free(list);
            list = next;
        }
        return r;
    }
    // One host function per stream, each with its operations in call order.
    while (list != NULL) {
        cudaStream_t s = list->stream;
        struct op *mine = NULL, *mtail = NULL, *rest = NULL, *rtail = NULL;
        for (struct op* o = list; o != NULL;) {
            struct op* next = o->next;
            o->next = NULL;
            struct op** h = o->stream == s ? &mine : &rest;
            struct op** t = o->stream == s ? &mtail : &rtail;
            if (*t) {
                (*t)->next = o;
            } else {
                *h = o;
            }
            *t = o;
            o = next;
        }
        ncclResult_t e = launch(mine);
        if (e != ncclSuccess && r == ncclSuccess) {
            r = e;
        }
        list = rest;
    }
    return r;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, int datatype, int op, ncclComm_t comm,
                           cudaStream_t stream) {
    return enqueue(kAllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, int datatype, int op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    return enqueue(kReduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, int datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return enqueue(kBroadcast, sendbuff, recvbuff, count, datatype, rSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, int datatype, ncclComm_t comm,
                           cudaStream_t stream) {
    return enqueue(kAllGather, sendbuff, recvbuff, sendcount, datatype, rSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, int datatype, int op,
                               ncclComm_t comm, cudaStream_t stream) {
    return enqueue(kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, int datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return enqueue(kSend, sendbuff, NULL, count, datatype, rSum, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, int datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
    return enqueue(kRecv, NULL, recvbuff, count, datatype, rSum, peer, comm, stream);
}
