/* test_gpudirect: CUDA device pointers given to the C ABI's point-to-point
 * calls between two processes whose data path is RDMA (NEXAR_BULK=rdma)
 * over the fake libibverbs (NEXAR_IBVERBS), with the fake CUDA runtime
 * (NEXAR_CUDART; the program links the same file). Device memory is
 * PROT_NONE to the host in the fake, so any host access of it anywhere in
 * libnexar crashes the test.
 *
 *   test_gpudirect p2p WAY     2 ranks under tests/c/launch.sh; WAY is how
 *                              the fakes let device memory reach the NIC:
 *                              dma-buf, peer (peer memory only) or staged
 *                              (neither), checked by the bytes the fake NIC
 *                              moved through each kind of registration.
 *                              Then device allreduce (blocking in place,
 *                              _stream out of place), broadcast and
 *                              allgather (in place): by GPUDirect RDMA where
 *                              the NIC reaches device memory (the bytes it
 *                              moved through dma-bufs or peer memory grow),
 *                              staged where it does not (they do not).
 *   test_gpudirect kill ROLE   starts its own two ranks (spawn and exec of
 *                              itself); rank 1, the ROLE (sender or
 *                              receiver) of a stream of 16 MiB device
 *                              messages, is SIGKILLed mid-transfer: rank 0's
 *                              call fails naming rank 1, within the test's
 *                              deadline.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

#include "cudautil.h"

extern char** environ;

static void* dev_alloc(size_t n, unsigned char fill) {
    void* d;
    CU(cudaMalloc(&d, n));
    unsigned char* h = malloc(n);
    memset(h, fill, n);
    CU(cudaMemcpy(d, h, n, H2D));
    free(h);
    return d;
}

static unsigned char* dev_read(const void* d, size_t n) {
    unsigned char* h = malloc(n);
    CU(cudaMemcpy(h, d, n, D2H));
    return h;
}

static unsigned char* pattern(size_t n, int seed) {
    unsigned char* p = malloc(n);
    for (size_t i = 0; i < n; i++) {
        p[i] = (unsigned char)(i * 131 + (i >> 10) + (size_t)seed * 7);
    }
    return p;
}

static void* dev_pattern(size_t n, int seed) {
    void* d;
    CU(cudaMalloc(&d, n));
    unsigned char* p = pattern(n, seed);
    CU(cudaMemcpy(d, p, n, H2D));
    free(p);
    return d;
}

static void expect_pattern(const void* d, size_t n, int seed, const char* what) {
    unsigned char* got = dev_read(d, n);
    unsigned char* want = pattern(n, seed);
    for (size_t i = 0; i < n; i++) {
        EXPECT(got[i] == want[i], "%s (%zu bytes): byte %zu is %#x, want %#x", what, n, i, got[i], want[i]);
    }
    free(got);
    free(want);
}

/* fake_nic_bytes: the bytes the fake NIC of this process moved through
 * registrations of kind 0 (host), 1 (peer memory) or 2 (dma-buf). */
static long long fake_nic_bytes(int kind) {
    const char* lib = getenv("NEXAR_IBVERBS");
    EXPECT(lib != NULL && *lib, "NEXAR_IBVERBS is not set");
    void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    EXPECT(h != NULL, "the fake libibverbs %s is not loaded: the data path is not RDMA", lib);
    void* sym = dlsym(h, "nexar_fake_ibv_bytes");
    EXPECT(sym != NULL, "%s has no nexar_fake_ibv_bytes", lib);
    long long (*f)(int);
    memcpy(&f, &sym, sizeof sym);
    long long n = f(kind);
    dlclose(h);
    return n;
}

static int64_t buffered(nexar_comm_t c) {
    nexar_stats_t st = NEXAR_STATS_INIT;
    CK(nexar_comm_get_stats(c, &st));
    return st.bytes_buffered;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* recv_posted_first receives n bytes from rank 0 into device memory with
 * the receive posted before the message is sent: by nexar_irecv where the
 * path moves device memory (then rank 0 is told to send only once it is
 * posted), else (the call refuses device memory, naming why) by the
 * blocking call, which rank 0 waits 200 ms for. */
static int recv_posted_first(nexar_comm_t c, size_t n, uint64_t tag, int seed) {
    void* dst = dev_alloc(n, 0x11);
    nexar_request_t req = NEXAR_REQUEST_NULL;
    nexar_result_t r = nexar_irecv(dst, n, NEXAR_UINT8, 0, tag, c, &req);
    int go = r == NEXAR_SUCCESS;
    EXPECT(go || (r == NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "nexar_irecv") &&
                  strstr(nexar_last_error(), "device memory")),
           "nexar_irecv of device memory: %s: %s", nexar_result_string(r), nexar_last_error());
    CK(nexar_send(&go, 1, NEXAR_INT32, 0, 1000 + tag, c));
    if (go) {
        CK(nexar_wait(req));
        nexar_status_t st;
        CK(nexar_request_status(req, &st));
        EXPECT(st.source == 0 && st.count == n, "irecv status: source %d, count %zu", st.source, st.count);
        CK(nexar_request_free(req));
    } else {
        CK(nexar_recv(dst, n, NEXAR_UINT8, 0, tag, c));
    }
    expect_pattern(dst, n, seed, go ? "irecv posted first" : "recv posted first");
    CU(cudaFree(dst));
    return go;
}

/* collectives: device allreduce, broadcast and allgather between the two
 * ranks, checked element by element; device memory reaches the NIC the way
 * the fakes allow (GPUDirect collectives), or not at all (staged). */
static void collectives(nexar_comm_t c, int rank, const char* way, cudaStream_t s) {
    const size_t count = 70001; /* float32: blocks of 35001 and 35000 */
    const size_t n = count * sizeof(float);
    long long dev_before = fake_nic_bytes(1) + fake_nic_bytes(2);
    float* h = malloc(n);
    for (size_t i = 0; i < count; i++) h[i] = (float)((rank + 1) * (int)(i % 13) + rank);
    void* a;
    void* b;
    CU(cudaMalloc(&a, n));
    CU(cudaMalloc(&b, n));
    CU(cudaMemcpy(a, h, n, H2D));
    CK(nexar_allreduce(a, a, count, NEXAR_FLOAT32, NEXAR_SUM, c));
    CK(nexar_allreduce_stream(a, b, count, NEXAR_FLOAT32, NEXAR_SUM, c, s));
    CU(cudaStreamSynchronize(s));
    float* got = (float*)dev_read(a, n);
    float* got2 = (float*)dev_read(b, n);
    for (size_t i = 0; i < count; i++) {
        float once = (float)(3 * (int)(i % 13) + 1);
        EXPECT(got[i] == once, "allreduce: element %zu is %g, want %g", i, got[i], once);
        EXPECT(got2[i] == 2 * once, "allreduce_stream: element %zu is %g, want %g", i, got2[i], 2 * once);
    }
    free(got);
    free(got2);

    /* Broadcast from rank 1, then an in-place allgather of each rank's
     * 300 KiB block. */
    const size_t m = 300 << 10;
    void* g = dev_alloc(2 * m, 0);
    if (rank == 1) {
        unsigned char* p = pattern(m, 77);
        CU(cudaMemcpy((char*)g + m, p, m, H2D));
        free(p);
    }
    CK(nexar_broadcast((char*)g + m, m, NEXAR_UINT8, 1, c));
    if (rank == 0) { /* rank 0's block: what the broadcast brought */
        unsigned char* p = dev_read((char*)g + m, m);
        CU(cudaMemcpy(g, p, m, H2D));
        free(p);
    }
    CK(nexar_allgather(g, g, m, NEXAR_UINT8, c));
    expect_pattern(g, m, 77, "allgather block 0");
    expect_pattern((char*)g + m, m, 77, "allgather block 1");
    CU(cudaFree(g));
    CU(cudaFree(a));
    CU(cudaFree(b));
    free(h);

    long long dev = fake_nic_bytes(1) + fake_nic_bytes(2) - dev_before;
    fprintf(stderr, "rank %d: %s: device collectives moved %lld bytes of device memory through the NIC\n", rank, way, dev);
    if (strcmp(way, "staged") == 0) {
        EXPECT(dev == 0, "staged: device memory reached the NIC in a collective");
    } else {
        EXPECT(dev >= (long long)(n / 2 + m), "%s: the device collectives did not go by GPUDirect RDMA", way);
    }
}

static void p2p(const char* way) {
    int staged = strcmp(way, "staged") == 0;
    int rank, size;
    nexar_comm_t c = init_world(&rank, &size);
    EXPECT(size == 2, "run with 2 ranks, not %d", size);
    const size_t sizes[] = {100, 65536, (1 << 20) + 3};
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, 1));
    uint64_t tag = 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        int seed = (int)k + 1;
        void* src = rank == 0 ? dev_pattern(n, seed) : NULL;

        /* Posted before the message arrives. */
        tag++;
        if (rank == 0) {
            int go = 0;
            CK(nexar_recv(&go, 1, NEXAR_INT32, 1, 1000 + tag, c));
            if (!go) sleep_ms(200);
            /* nexar_isend takes device memory where the channel to rank 1
             * moves it: always with dma-buf or peer memory; staged, not
             * after the first device buffer showed the NIC cannot. */
            nexar_request_t req = NEXAR_REQUEST_NULL;
            nexar_result_t r = nexar_isend(src, n, NEXAR_UINT8, 1, tag, c, &req);
            if (r == NEXAR_SUCCESS) {
                EXPECT(!staged || k == 0, "nexar_isend took device memory after the NIC refused it for good");
                CK(nexar_wait(req));
                CK(nexar_request_free(req));
            } else {
                EXPECT(r == NEXAR_ERR_INVALID_ARGUMENT && strstr(nexar_last_error(), "nexar_isend") &&
                           strstr(nexar_last_error(), "GPUDirect") && staged,
                       "nexar_isend of device memory: %s: %s", nexar_result_string(r), nexar_last_error());
                CK(nexar_send(src, n, NEXAR_UINT8, 1, tag, c));
            }
        } else {
            int direct = recv_posted_first(c, n, tag, seed);
            /* Where the NIC takes device memory the channel from rank 0
             * (set up by now) moves it, and nexar_irecv takes it; where it
             * does not, the first device buffer of WRITE size showed it
             * (size 1) and the library stages from then on, which
             * nexar_irecv cannot. */
            EXPECT(staged || k == 0 || direct, "nexar_irecv refused device memory over an RDMA channel that moves it");
            EXPECT(!staged || k < 2 || !direct, "nexar_irecv took device memory after the NIC refused it for good");
        }

        /* Arrived (buffered in host memory) before the receive: rank 1
         * counts what it holds, then lets rank 0 send. */
        tag++;
        int ready = 0;
        if (rank == 0) {
            CK(nexar_recv(&ready, 1, NEXAR_INT32, 1, 1000 + tag, c));
            CK(nexar_send(src, n, NEXAR_UINT8, 1, tag, c));
        } else {
            int64_t base = buffered(c);
            CK(nexar_send(&ready, 1, NEXAR_INT32, 0, 1000 + tag, c));
            for (int i = 0; buffered(c) < base + (int64_t)n; i++) {
                EXPECT(i < 30000, "%zu bytes never buffered at the receiver", n);
                sleep_ms(1);
            }
            void* dst = dev_alloc(n, 0x22);
            CK(nexar_recv(dst, n, NEXAR_UINT8, 0, tag, c));
            expect_pattern(dst, n, seed, "recv after arrival");
            CU(cudaFree(dst));
        }

        /* Any source, with its status. */
        tag++;
        if (rank == 0) {
            CK(nexar_send(src, n, NEXAR_UINT8, 1, tag, c));
        } else {
            void* dst = dev_alloc(n, 0x33);
            nexar_status_t st;
            CK(nexar_recv_status(dst, n, NEXAR_UINT8, NEXAR_ANY_SOURCE, tag, c, &st));
            EXPECT(st.source == 0 && st.tag == tag && st.count == n, "recv_status: source %d tag %llu count %zu",
                   st.source, (unsigned long long)st.tag, st.count);
            expect_pattern(dst, n, seed, "recv_status any source");
            CU(cudaFree(dst));
        }

        /* Too small: NEXAR_ERR_TRUNCATED, the bytes that fit, nothing past
         * the buffer (a guard of 0xEE after it in the same allocation). */
        tag++;
        if (rank == 0) {
            CK(nexar_send(src, n, NEXAR_UINT8, 1, tag, c));
        } else {
            size_t fit = n / 2, guard = 4096;
            void* dst = dev_alloc(fit + guard, 0xEE);
            nexar_result_t r = nexar_recv(dst, fit, NEXAR_UINT8, 0, tag, c);
            EXPECT(r == NEXAR_ERR_TRUNCATED, "a %zu-byte message into %zu bytes: %s: %s", n, fit,
                   nexar_result_string(r), nexar_last_error());
            unsigned char* got = dev_read(dst, fit + guard);
            unsigned char* want = pattern(n, seed);
            /* A receive the library staged keeps its contents when the
             * call fails (docs/device-memory.md); one the NIC or the
             * channel wrote holds the bytes that fit. */
            int kept = 1;
            for (size_t i = 0; i < fit; i++) kept &= got[i] == 0xEE;
            EXPECT(memcmp(got, want, fit) == 0 || (kept && staged),
                   "truncated: the %zu bytes that fit differ (and were not left as they were by staging)", fit);
            for (size_t i = fit; i < fit + guard; i++) {
                EXPECT(got[i] == 0xEE, "truncated: byte %zu past the %zu-byte buffer was written (%#x)", i, fit, got[i]);
            }
            free(got);
            free(want);
            CU(cudaFree(dst));
        }

        /* Ordered with the caller's stream: the sender's data is written
         * by a copy queued on the stream (the legacy default stream for the
         * blocking call), which the fake delays; the receiver reads the
         * result back on the stream. */
        tag++;
        unsigned char* pin;
        CU(cudaMallocHost((void**)&pin, n));
        if (rank == 0) {
            unsigned char* p = pattern(n, seed + 50);
            memcpy(pin, p, n);
            free(p);
            void* d = dev_alloc(n, 0);
            CU(cudaMemcpyAsync(d, pin, n, H2D, s));
            CK(nexar_send_stream(d, n, NEXAR_UINT8, 1, tag, c, s));
            void* d2 = dev_alloc(n, 0);
            CU(cudaMemcpyAsync(d2, pin, n, H2D, NULL));
            CK(nexar_send(d2, n, NEXAR_UINT8, 1, tag + 100, c));
            CU(cudaStreamSynchronize(s));
            CU(cudaFree(d));
            CU(cudaFree(d2));
        } else {
            void* d = dev_alloc(n, 0x44);
            CK(nexar_recv_stream(d, n, NEXAR_UINT8, 0, tag, c, s));
            CU(cudaMemcpyAsync(pin, d, n, D2H, s));
            CU(cudaStreamSynchronize(s));
            unsigned char* want = pattern(n, seed + 50);
            EXPECT(memcmp(pin, want, n) == 0, "send_stream/recv_stream of %zu bytes: the data differs", n);
            CK(nexar_recv(d, n, NEXAR_UINT8, 0, tag + 100, c));
            expect_pattern(d, n, seed + 50, "send after a copy on the legacy default stream");
            free(want);
            CU(cudaFree(d));
        }
        CU(cudaFreeHost(pin));
        if (src != NULL) {
            CU(cudaFree(src));
        }
    }
    CK(nexar_barrier(c));
    collectives(c, rank, way, s);

    /* How device memory reached the NIC, by the fake NIC's own count. */
    long long host = fake_nic_bytes(0), peer = fake_nic_bytes(1), dmabuf = fake_nic_bytes(2);
    fprintf(stderr, "rank %d: %s: the NIC moved %lld bytes through host memory registrations, %lld through peer memory, %lld through dma-bufs\n",
            rank, way, host, peer, dmabuf);
    const long long large = (1 << 20) + 3;
    if (strcmp(way, "dma-buf") == 0) {
        EXPECT(dmabuf >= large && peer == 0, "device buffers did not reach the NIC by dma-buf only");
    } else if (strcmp(way, "peer") == 0) {
        EXPECT(peer >= large && dmabuf == 0, "device buffers did not reach the NIC as peer memory only");
    } else {
        EXPECT(strcmp(way, "staged") == 0, "unknown way %s", way);
        EXPECT(peer == 0 && dmabuf == 0 && host >= large, "device memory reached the NIC although neither way works");
    }
    CU(cudaStreamDestroy(s));
    CK(nexar_comm_destroy(c));
}

/* ---- a rank killed mid-transfer -------------------------------------- */

#define KILL_MSG (16u << 20)

static void* kill_self(void* arg) {
    (void)arg;
    sleep_ms(5);
    kill(getpid(), SIGKILL);
    return NULL;
}

static void kill_rank(const char* role) {
    int rank, size;
    nexar_comm_t c = init_world(&rank, &size);
    void* buf = dev_alloc(KILL_MSG, (unsigned char)rank);
    int victim_sends = strcmp(role, "sender") == 0;
    int sends = (rank == 1) == victim_sends;
    int peer = 1 - rank;
    /* One whole message first: the path is set up. */
    if (sends) {
        CK(nexar_send(buf, KILL_MSG, NEXAR_UINT8, peer, 0, c));
    } else {
        CK(nexar_recv(buf, KILL_MSG, NEXAR_UINT8, peer, 0, c));
    }
    if (rank == 1) {
        pthread_t t;
        EXPECT(pthread_create(&t, NULL, kill_self, NULL) == 0, "pthread_create");
    }
    struct timespec t0, t1;
    nexar_result_t r = NEXAR_SUCCESS;
    int i;
    for (i = 1; i < 100000 && r == NEXAR_SUCCESS; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        r = sends ? nexar_send(buf, KILL_MSG, NEXAR_UINT8, peer, (uint64_t)i, c)
                  : nexar_recv(buf, KILL_MSG, NEXAR_UINT8, peer, (uint64_t)i, c);
    }
    EXPECT(rank == 0, "rank 1 outlived its SIGKILL");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    EXPECT(r == NEXAR_ERR_PEER_DOWN && strstr(nexar_last_error(), "rank 1") != NULL,
           "the %s's call %d after rank 1 was killed: %s: %s", sends ? "sender" : "receiver", i,
           nexar_result_string(r), nexar_last_error());
    fprintf(stderr, "rank 0 (%s): call %d failed after %.3f s: %s\n", sends ? "sender" : "receiver", i, took,
            nexar_last_error());
    CU(cudaFree(buf));
    nexar_comm_destroy(c);
}

/* kill_job starts ranks 0 and 1 (this program, mode kill-rank) and checks
 * that rank 1 died by SIGKILL and rank 0 passed, within 120 s. */
static int kill_job(const char* self, const char* role) {
    char seed[64], token[64];
    snprintf(seed, sizeof seed, "NEXAR_SEED=127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
    snprintf(token, sizeof token, "NEXAR_TOKEN=gpudirect-kill-%d", (int)getpid());
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        size_t n = 0;
        while (environ[n]) n++;
        char** env = calloc(n + 5, sizeof *env);
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (strncmp(environ[i], "NEXAR_RANK=", 11) && strncmp(environ[i], "NEXAR_WORLD_SIZE=", 17) &&
                strncmp(environ[i], "NEXAR_SEED=", 11) && strncmp(environ[i], "NEXAR_TOKEN=", 12)) {
                env[k++] = environ[i];
            }
        }
        char rk[32];
        snprintf(rk, sizeof rk, "NEXAR_RANK=%d", r);
        env[k++] = rk;
        env[k++] = "NEXAR_WORLD_SIZE=2";
        env[k++] = seed;
        env[k++] = token;
        char* argv[] = {(char*)self, "kill-rank", (char*)role, NULL};
        EXPECT(posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, env) == 0, "posix_spawn %s", self);
        free(env);
    }
    int status[2] = {0, 0}, done[2] = {0, 0};
    for (int ms = 0; !(done[0] && done[1]); ms += 10) {
        for (int r = 0; r < 2; r++) {
            if (!done[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) done[r] = 1;
        }
        if (ms > 120000) {
            for (int r = 0; r < 2; r++) {
                if (!done[r]) kill(pids[r], SIGKILL);
            }
            fprintf(stderr, "kill %s: the job hung (rank 0 done %d, rank 1 done %d)\n", role, done[0], done[1]);
            return 1;
        }
        sleep_ms(10);
    }
    EXPECT(WIFSIGNALED(status[1]) && WTERMSIG(status[1]) == SIGKILL, "rank 1 did not die by SIGKILL (status %#x)",
           status[1]);
    EXPECT(WIFEXITED(status[0]) && WEXITSTATUS(status[0]) == 0, "rank 0 failed (status %#x)", status[0]);
    return 0;
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "p2p") == 0) {
        p2p(argv[2]);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "kill") == 0) {
        return kill_job(argv[0], argv[2]);
    }
    if (argc == 3 && strcmp(argv[1], "kill-rank") == 0) {
        kill_rank(argv[2]);
        return 0;
    }
    fprintf(stderr, "usage: %s p2p dma-buf|peer|staged | kill sender|receiver\n", argv[0]);
    return 2;
}
