/* test_fork: a child made by fork() without exec() gets NEXAR_ERR_FORKED at
 * once from every call on the parent's handles, and touches nothing the
 * parent owns: afterwards the parent's world still works, with correct data
 * on every rank. Rank 0 forks; the other ranks go straight on to the next
 * collectives and wait there for rank 0. Then rank 0 forks again while
 * another of its threads is inside the library (where a child that entered
 * the Go runtime at all would often hang). Run with 2 ranks (works with any). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

enum { SMALL = 1000, LARGE = 1 << 18 }; /* int64 elements: 8 KB and 2 MiB */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int child_failures, child_calls;
static double child_slowest;

/* refused checks, in the child, that a call returned NEXAR_ERR_FORKED
 * within 2 s with a last error naming the function, the parent's pid and
 * fork. */
static void refused(int line, const char* fn, double t0, nexar_result_t got, const char* parent) {
    double dt = now() - t0;
    const char* msg = nexar_last_error();
    child_calls++;
    if (dt > child_slowest) child_slowest = dt;
    if (got != NEXAR_ERR_FORKED || dt > 2.0 || strstr(msg, fn) == NULL ||
        strstr(msg, parent) == NULL || strstr(msg, "fork") == NULL) {
        fprintf(stderr, "child line %d: %s -> %d (%s) after %.3f s: \"%s\"; want NEXAR_ERR_FORKED "
                "at once naming %s, \"%s\" and fork\n",
                line, fn, (int)got, nexar_result_string(got), dt, msg, fn, parent);
        child_failures++;
    }
}
#define REFUSED(fn, call)                                        \
    do {                                                         \
        double t0_ = now();                                      \
        nexar_result_t r_ = (call);                              \
        refused(__LINE__, #fn, t0_, r_, parent);                 \
    } while (0)

/* child runs in the forked child: every call on the parent's handles must
 * be refused (only two calls unless full). A watchdog kills it if any call
 * hangs. */
static void child(nexar_comm_t c, nexar_request_t req, int rank, int n, pid_t ppid, int full) {
    signal(SIGALRM, SIG_DFL);
    alarm(5);
    char parent[32];
    snprintf(parent, sizeof parent, "pid %ld", (long)ppid);
    int64_t v[SMALL] = {0}, w[SMALL];
    int x = -1, done = 0;
    nexar_result_t health;
    nexar_request_t r2 = NEXAR_REQUEST_NULL;
    nexar_comm_t other = NEXAR_COMM_NULL;
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    cfg.world_size = 1;
    double t0 = now();

    REFUSED(nexar_comm_rank, nexar_comm_rank(c, &x));
    REFUSED(nexar_allreduce, nexar_allreduce(v, w, SMALL, NEXAR_INT64, NEXAR_SUM, c));
    if (!full) _exit(child_failures ? 1 : 0);
    REFUSED(nexar_barrier, nexar_barrier(c));
    REFUSED(nexar_wait, nexar_wait(req));
    REFUSED(nexar_test, nexar_test(req, &done));
    REFUSED(nexar_iallreduce, nexar_iallreduce(v, w, SMALL, NEXAR_INT64, NEXAR_SUM, c, &r2));
    REFUSED(nexar_broadcast, nexar_broadcast(v, SMALL, NEXAR_INT64, 0, c));
    REFUSED(nexar_send, nexar_send(v, 1, NEXAR_INT64, (rank + 1) % n, 7, c));
    REFUSED(nexar_irecv, nexar_irecv(w, 1, NEXAR_INT64, NEXAR_ANY_SOURCE, 7, c, &r2));
    REFUSED(nexar_comm_get_error, nexar_comm_get_error(c, &health));
    REFUSED(nexar_comm_split, nexar_comm_split(c, 0, 0, &other));
    REFUSED(nexar_comm_abort, nexar_comm_abort(c));
    REFUSED(nexar_request_free, nexar_request_free(req));
    REFUSED(nexar_comm_destroy, nexar_comm_destroy(c));
    /* a handle that never existed is refused the same way: nothing is looked up */
    REFUSED(nexar_comm_destroy, nexar_comm_destroy((nexar_comm_t)(uintptr_t)12345));
    REFUSED(nexar_comm_init_from_env, nexar_comm_init_from_env(&other));
    REFUSED(nexar_comm_init, nexar_comm_init(&cfg, &other));

    if (x != -1 || r2 != NEXAR_REQUEST_NULL || other != NEXAR_COMM_NULL) {
        fprintf(stderr, "child: a refused call wrote its out-parameter\n");
        child_failures++;
    }
    /* the parts that need no communicator still work */
    int ma = -1;
    nexar_get_version(&ma, NULL, NULL);
    const char* name = nexar_result_string(NEXAR_ERR_FORKED);
    if (ma != NEXAR_VERSION_MAJOR || strstr(name, "fork") == NULL) {
        fprintf(stderr, "child: version %d, result string \"%s\"\n", ma, name);
        child_failures++;
    }
    printf("rank %d: forked child: %d calls checked in %.4f s in all (slowest %.6f s)\n", rank,
           child_calls, now() - t0, child_slowest);
    fflush(stdout);
    _exit(child_failures ? 1 : 0);
}

/* run_child forks, runs child and waits up to 20 s for it (killing it
 * after that); returns 0 if it exited with status 0. */
static int run_child(nexar_comm_t c, nexar_request_t req, int rank, int n, int full) {
    fflush(NULL);
    pid_t self = getpid();
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork failed");
    if (pid == 0) child(c, req, rank, n, self, full);
    int status = 0;
    double t0 = now();
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        EXPECT(w >= 0, "waitpid failed");
        if (w == pid) break;
        if (now() - t0 > 20) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "rank %d: forked child killed by signal %d after %.1f s (hung in a call)\n",
                rank, WTERMSIG(status), now() - t0);
    } else {
        fprintf(stderr, "rank %d: forked child exited with status %d\n", rank, WEXITSTATUS(status));
    }
    return 1;
}

static int64_t big[LARGE];

/* busy keeps a thread inside the library: allreduces on its own
 * communicator until rank 0 clears more (agreed by the allreduce itself). */
struct busy {
    nexar_comm_t comm;
    pthread_mutex_t mu;
    int more, iters;
};

static void* busy_loop(void* arg) {
    struct busy* b = arg;
    int rank;
    static int64_t buf[LARGE / 4];
    CK(nexar_comm_rank(b->comm, &rank));
    for (;;) {
        pthread_mutex_lock(&b->mu);
        buf[0] = rank == 0 ? b->more : 0;
        pthread_mutex_unlock(&b->mu);
        CK(nexar_allreduce(buf, buf, LARGE / 4, NEXAR_INT64, NEXAR_SUM, b->comm));
        b->iters++;
        if (buf[0] == 0) return NULL;
    }
}

/* fork_while_busy forks 20 children on rank 0 while a thread of every rank
 * runs collectives; returns the number of failed children. */
static int fork_while_busy(nexar_comm_t c, nexar_request_t req, int rank, int n) {
    struct busy b;
    b.more = 1;
    b.iters = 0;
    pthread_mutex_init(&b.mu, NULL);
    CK(nexar_comm_split(c, 0, rank, &b.comm));
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, busy_loop, &b) == 0, "pthread_create");
    int failed = 0;
    if (rank == 0) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        for (int k = 0; k < 20; k++) failed += run_child(c, req, rank, n, 0);
        pthread_mutex_lock(&b.mu);
        b.more = 0;
        pthread_mutex_unlock(&b.mu);
    }
    pthread_join(t, NULL);
    CK(nexar_comm_destroy(b.comm));
    pthread_mutex_destroy(&b.mu);
    if (rank == 0) {
        printf("rank 0: 20 children forked during %d busy allreduces, %d failed\n", b.iters, failed);
    }
    return failed;
}

int main(void) {
    int rank, n;
    nexar_comm_t c = init_world(&rank, &n);

    /* warm up: connections and data path in use, and a request to hand the child */
    int64_t v[SMALL];
    for (int i = 0; i < SMALL; i++) v[i] = rank + i;
    CK(nexar_allreduce(v, v, SMALL, NEXAR_INT64, NEXAR_SUM, c));
    for (int i = 0; i < LARGE; i++) big[i] = rank;
    CK(nexar_allreduce(big, big, LARGE, NEXAR_INT64, NEXAR_SUM, c));
    nexar_request_t req;
    CK(nexar_ibarrier(c, &req));
    CK(nexar_wait(req));

    int failed = 0;
    if (rank == 0) failed = run_child(c, req, rank, n, 1);

    /* the parent's world is intact: collectives give the right data on every rank */
    const int64_t ranks = (int64_t)n * (n - 1) / 2;
    for (int it = 0; it < 3; it++) {
        for (int i = 0; i < SMALL; i++) v[i] = (rank + 1) * (it + 1) + i;
        CK(nexar_allreduce(v, v, SMALL, NEXAR_INT64, NEXAR_SUM, c));
        for (int i = 0; i < SMALL; i++) {
            int64_t want = (ranks + n) * (it + 1) + (int64_t)n * i;
            EXPECT(v[i] == want, "iter %d v[%d]=%lld want %lld", it, i, (long long)v[i],
                   (long long)want);
        }
        for (int i = 0; i < LARGE; i++) big[i] = (int64_t)rank * i + it;
        CK(nexar_allreduce(big, big, LARGE, NEXAR_INT64, NEXAR_SUM, c));
        for (int i = 0; i < LARGE; i++) {
            int64_t want = ranks * i + (int64_t)n * it;
            EXPECT(big[i] == want, "iter %d big[%d]=%lld want %lld", it, i, (long long)big[i],
                   (long long)want);
        }
        CK(nexar_barrier(c));
        if (it == 0) failed += fork_while_busy(c, req, rank, n);
    }
    CK(nexar_wait(req));
    CK(nexar_request_free(req));
    nexar_result_t health;
    CK(nexar_comm_get_error(c, &health));
    EXPECT(health == NEXAR_SUCCESS, "sticky error %d", (int)health);
    CK(nexar_comm_destroy(c));
    if (failed) return 1;
    printf("rank %d/%d: test_fork ok\n", rank, n);
    return 0;
}
