/* test_errors: every kind of bad input returns an error code and sets a
 * last-error message naming the function and the argument; nothing
 * crashes. Runs on a world of any size (most cases need only one rank). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "nexar.h"
#include "testutil.h"

static int failures;

/* expect checks a result code and that nexar_last_error() contains both
 * the function name and want (an argument name or phrase). */
static void expect(int line, nexar_result_t got, nexar_result_t code, const char* fn,
                   const char* want) {
    const char* msg = nexar_last_error();
    if (got != code || strstr(msg, fn) == NULL || strstr(msg, want) == NULL) {
        fprintf(stderr, "line %d: got %d (%s) \"%s\"; want %d with \"%s\" and \"%s\"\n", line,
                (int)got, nexar_result_string(got), msg, (int)code, fn, want);
        failures++;
    }
}
#define BAD(call, code, fn, want) expect(__LINE__, (call), code, fn, want)
#define ARG NEXAR_ERR_INVALID_ARGUMENT
#define HANDLE NEXAR_ERR_INVALID_HANDLE

int main(void) {
    nexar_comm_t c, dead;
    size_t nfailed = 99;
    CK(nexar_comm_init_from_env(&c));
    int rank, n;
    CK(nexar_comm_rank(c, &rank));
    CK(nexar_comm_size(c, &n));
    g_rank = rank;
    float f[4] = {1, 2, 3, 4}, g[64];
    nexar_request_t req;
    int done_flag = 0;
    const size_t huge = SIZE_MAX / 2;
    size_t counts[64] = {0}, displs[64] = {0};

    /* static strings and version */
    EXPECT(strcmp(nexar_result_string(NEXAR_SUCCESS), "success") == 0, "success string");
    EXPECT(strcmp(nexar_result_string((nexar_result_t)999), "unknown result") == 0, "unknown");
    nexar_get_version(NULL, NULL, NULL);
    int ma = -1, mi = -1, pa = -1;
    nexar_get_version(&ma, &mi, &pa);
    EXPECT(ma == NEXAR_VERSION_MAJOR && mi == NEXAR_VERSION_MINOR && pa == NEXAR_VERSION_PATCH,
           "version %d.%d.%d", ma, mi, pa);

    /* A CUDA stream where no CUDA runtime is loaded (this test runs
     * without NEXAR_CUDART): refused, saying why. A NULL stream is a
     * host call. */
    BAD(nexar_allreduce_stream(f, g, 4, NEXAR_FLOAT32, NEXAR_SUM, c, (void*)f), ARG,
        "nexar_allreduce_stream", "CUDA is not usable");
    BAD(nexar_recv_stream(g, 4, NEXAR_FLOAT32, 0, 0, c, (void*)f), ARG, "nexar_recv_stream",
        "stream");

    /* NULL buffers with a non-zero count */
    BAD(nexar_allreduce(NULL, g, 4, NEXAR_FLOAT32, NEXAR_SUM, c), ARG, "nexar_allreduce", "sendbuf");
    BAD(nexar_allreduce(f, NULL, 4, NEXAR_FLOAT32, NEXAR_SUM, c), ARG, "nexar_allreduce", "recvbuf");
    BAD(nexar_broadcast(NULL, 1, NEXAR_INT8, 0, c), ARG, "nexar_broadcast", "buf");
    BAD(nexar_send(NULL, 3, NEXAR_INT32, 0, 0, c), ARG, "nexar_send", "buf");
    BAD(nexar_recv(NULL, 3, NEXAR_INT32, 0, 0, c), ARG, "nexar_recv", "buf");
    BAD(nexar_allgather(f, NULL, 1, NEXAR_FLOAT32, c), ARG, "nexar_allgather", "recvbuf");
    BAD(nexar_alltoall(NULL, g, 1, NEXAR_FLOAT32, c), ARG, "nexar_alltoall", "sendbuf");
    BAD(nexar_reduce_scatter(NULL, g, 1, NEXAR_FLOAT32, NEXAR_SUM, c), ARG, "nexar_reduce_scatter", "sendbuf");
    BAD(nexar_scan(f, NULL, 2, NEXAR_FLOAT32, NEXAR_SUM, c), ARG, "nexar_scan", "recvbuf");
    BAD(nexar_exscan(NULL, g, 2, NEXAR_FLOAT32, NEXAR_SUM, c), ARG, "nexar_exscan", "sendbuf");
    BAD(nexar_iallreduce(NULL, g, 4, NEXAR_FLOAT32, NEXAR_SUM, c, &req), ARG, "nexar_iallreduce", "sendbuf");
    BAD(nexar_isend(NULL, 1, NEXAR_FLOAT32, 0, 0, c, &req), ARG, "nexar_isend", "buf");
    BAD(nexar_irecv(NULL, 1, NEXAR_FLOAT32, 0, 0, c, &req), ARG, "nexar_irecv", "buf");
    BAD(nexar_allgatherv(f, 1, g, NULL, displs, NEXAR_FLOAT32, c), ARG, "nexar_allgatherv", "recvcounts");
    BAD(nexar_allgatherv(f, 1, g, counts, NULL, NEXAR_FLOAT32, c), ARG, "nexar_allgatherv", "displs");
    BAD(nexar_alltoallv(f, counts, displs, g, NULL, displs, NEXAR_FLOAT32, c), ARG, "nexar_alltoallv", "recvcounts");

    /* NULL out-parameters */
    BAD(nexar_comm_rank(c, NULL), ARG, "nexar_comm_rank", "rank");
    BAD(nexar_comm_size(c, NULL), ARG, "nexar_comm_size", "size");
    BAD(nexar_comm_split(c, 0, 0, NULL), ARG, "nexar_comm_split", "newcomm");
    BAD(nexar_comm_get_error(c, NULL), ARG, "nexar_comm_get_error", "error");
    BAD(nexar_comm_get_failed(c, NULL, 0, NULL), ARG, "nexar_comm_get_failed", "count");
    BAD(nexar_comm_get_failed(c, NULL, 4, &nfailed), ARG, "nexar_comm_get_failed", "ranks");
    BAD(nexar_comm_init(NULL, &dead), ARG, "nexar_comm_init", "config");
    BAD(nexar_comm_init_from_env(NULL), ARG, "nexar_comm_init_from_env", "comm");
    BAD(nexar_ibarrier(c, NULL), ARG, "nexar_ibarrier", "req");
    BAD(nexar_iallreduce(f, g, 4, NEXAR_FLOAT32, NEXAR_SUM, c, NULL), ARG, "nexar_iallreduce", "req");
    BAD(nexar_igather(f, g, 1, NEXAR_FLOAT32, 0, c, NULL), ARG, "nexar_igather", "req");
    BAD(nexar_iscatter(f, g, 1, NEXAR_FLOAT32, 99, c, &req), ARG, "nexar_iscatter", "root");
    BAD(nexar_iscan(NULL, g, 2, NEXAR_FLOAT32, NEXAR_SUM, c, &req), ARG, "nexar_iscan", "sendbuf");
    BAD(nexar_iexscan(f, g, 2, NEXAR_FLOAT32, NEXAR_SUM, c, NULL), ARG, "nexar_iexscan", "req");
    BAD(nexar_iallgatherv(f, 1, g, NULL, displs, NEXAR_FLOAT32, c, &req), ARG, "nexar_iallgatherv", "recvcounts");
    BAD(nexar_igatherv(f, 1, g, counts, displs, NEXAR_FLOAT32, -2, c, &req), ARG, "nexar_igatherv", "root");
    BAD(nexar_iscatterv(f, counts, displs, g, 0, NEXAR_FLOAT32, 0, c, NULL), ARG, "nexar_iscatterv", "req");
    BAD(nexar_ialltoallv(f, counts, displs, g, counts, displs, NEXAR_FLOAT32, c, NULL), ARG, "nexar_ialltoallv", "req");
    BAD(nexar_waitall(2, NULL, NULL), ARG, "nexar_waitall", "reqs");
    BAD(nexar_testany(1, &req, NULL, &done_flag), ARG, "nexar_testany", "index");

    /* bad config */
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    cfg.struct_size = 8;
    BAD(nexar_comm_init(&cfg, &dead), ARG, "nexar_comm_init", "struct_size");
    nexar_config_t cfg2 = NEXAR_CONFIG_INIT;
    BAD(nexar_comm_init(&cfg2, &dead), ARG, "nexar_comm_init", "world_size");
    cfg2.world_size = 2;
    cfg2.rank = 5;
    BAD(nexar_comm_init(&cfg2, &dead), ARG, "nexar_comm_init", "rank");
    cfg2.rank = 0;
    cfg2.token_len = 4;
    BAD(nexar_comm_init(&cfg2, &dead), ARG, "nexar_comm_init", "token");

    /* invalid datatype and op */
    BAD(nexar_allreduce(f, g, 4, (nexar_datatype_t)10, NEXAR_SUM, c), ARG, "nexar_allreduce", "dt");
    BAD(nexar_allreduce(f, g, 4, (nexar_datatype_t)-1, NEXAR_SUM, c), ARG, "nexar_allreduce", "dt");
    BAD(nexar_send(f, 4, (nexar_datatype_t)42, 0, 0, c), ARG, "nexar_send", "dt");
    BAD(nexar_allreduce(f, g, 4, NEXAR_FLOAT32, (nexar_op_t)8, c), ARG, "nexar_allreduce", "op");
    BAD(nexar_reduce(f, g, 4, NEXAR_FLOAT32, (nexar_op_t)-3, 0, c), ARG, "nexar_reduce", "op");
    BAD(nexar_allreduce(f, g, 4, NEXAR_FLOAT32, NEXAR_BXOR, c), ARG, "nexar_allreduce", "op");
    BAD(nexar_scan(f, g, 1, NEXAR_INT32, NEXAR_AVG, c), ARG, "nexar_scan", "op");

    /* invalid root and peer */
    BAD(nexar_broadcast(f, 4, NEXAR_FLOAT32, n, c), ARG, "nexar_broadcast", "root");
    BAD(nexar_broadcast(f, 4, NEXAR_FLOAT32, -1, c), ARG, "nexar_broadcast", "root");
    BAD(nexar_reduce(f, g, 4, NEXAR_FLOAT32, NEXAR_SUM, n + 3, c), ARG, "nexar_reduce", "root");
    BAD(nexar_gather(f, g, 1, NEXAR_FLOAT32, -2, c), ARG, "nexar_gather", "root");
    BAD(nexar_scatter(f, g, 1, NEXAR_FLOAT32, n, c), ARG, "nexar_scatter", "root");
    BAD(nexar_ibroadcast(f, 4, NEXAR_FLOAT32, n, c, &req), ARG, "nexar_ibroadcast", "root");
    BAD(nexar_send(f, 1, NEXAR_FLOAT32, n, 0, c), ARG, "nexar_send", "peer");
    BAD(nexar_send(f, 1, NEXAR_FLOAT32, NEXAR_ANY_SOURCE, 0, c), ARG, "nexar_send", "peer");
    BAD(nexar_recv(f, 1, NEXAR_FLOAT32, -2, 0, c), ARG, "nexar_recv", "peer");
    BAD(nexar_irecv(f, 1, NEXAR_FLOAT32, n, 0, c, &req), ARG, "nexar_irecv", "peer");

    /* byte sizes that overflow */
    BAD(nexar_allreduce(f, g, SIZE_MAX, NEXAR_FLOAT32, NEXAR_SUM, c), ARG, "nexar_allreduce", "count");
    BAD(nexar_send(f, huge, NEXAR_FLOAT64, 0, 0, c), ARG, "nexar_send", "count");
    BAD(nexar_allgather(f, g, huge, NEXAR_INT8, c), ARG, "nexar_allgather", "count");
    BAD(nexar_alltoall(f, g, SIZE_MAX / 3, NEXAR_INT8, c), ARG, "nexar_alltoall", "count");
    BAD(nexar_reduce_scatter(f, g, huge, NEXAR_INT64, NEXAR_SUM, c), ARG, "nexar_reduce_scatter", "recvcount");
    BAD(nexar_ialltoall(f, g, huge, NEXAR_INT64, c, &req), ARG, "nexar_ialltoall", "count");
    counts[0] = SIZE_MAX;
    BAD(nexar_allgatherv(f, 1, g, counts, displs, NEXAR_FLOAT32, c), ARG, "nexar_allgatherv", "recvcounts");
    counts[0] = 0;

    /* unknown and destroyed handles */
    nexar_comm_t bogus = (nexar_comm_t)(uintptr_t)12345;
    BAD(nexar_barrier(NEXAR_COMM_NULL), HANDLE, "nexar_barrier", "comm");
    BAD(nexar_barrier(bogus), HANDLE, "nexar_barrier", "comm");
    BAD(nexar_comm_destroy(bogus), HANDLE, "nexar_comm_destroy", "comm");
    BAD(nexar_wait(NEXAR_REQUEST_NULL), HANDLE, "nexar_wait", "req");
    BAD(nexar_request_free((nexar_request_t)(uintptr_t)777), HANDLE, "nexar_request_free", "req");
    /* a comm handle is not a request handle and vice versa */
    BAD(nexar_wait((nexar_request_t)c), HANDLE, "nexar_wait", "req");
    CK(nexar_ibarrier(c, &req));
    BAD(nexar_barrier((nexar_comm_t)req), HANDLE, "nexar_barrier", "comm");
    CK(nexar_wait(req));
    CK(nexar_request_free(req));
    BAD(nexar_request_free(req), HANDLE, "nexar_request_free", "req");
    BAD(nexar_wait(req), HANDLE, "nexar_wait", "req");
    int done;
    BAD(nexar_test(req, &done), HANDLE, "nexar_test", "req");
    nexar_status_t st;
    BAD(nexar_request_status(req, &st), HANDLE, "nexar_request_status", "req");

    /* use after destroy, double destroy */
    CK(nexar_comm_split(c, 0, rank, &dead));
    CK(nexar_comm_destroy(dead));
    BAD(nexar_comm_destroy(dead), HANDLE, "nexar_comm_destroy", "comm");
    BAD(nexar_allreduce(f, g, 4, NEXAR_FLOAT32, NEXAR_SUM, dead), HANDLE, "nexar_allreduce", "comm");
    BAD(nexar_comm_rank(dead, &done), HANDLE, "nexar_comm_rank", "comm");
    BAD(nexar_comm_abort(dead), HANDLE, "nexar_comm_abort", "comm");
    BAD(nexar_comm_get_failed(dead, NULL, 0, &nfailed), HANDLE, "nexar_comm_get_failed", "comm");
    BAD(nexar_comm_set_failure_handler(dead, NULL, NULL), HANDLE, "nexar_comm_set_failure_handler", "comm");
    BAD(nexar_isend(f, 1, NEXAR_FLOAT32, 0, 0, dead, &req), HANDLE, "nexar_isend", "comm");

    /* the flight record: NULL, empty or unwritable paths and dead handles
     * are refused; a dump names the communicator and its last operation */
    BAD(nexar_comm_dump_flight_record(c, NULL), ARG, "nexar_comm_dump_flight_record", "path");
    BAD(nexar_comm_dump_flight_record(c, ""), ARG, "nexar_comm_dump_flight_record", "path");
    BAD(nexar_comm_dump_flight_record(dead, "/tmp/x.json"), HANDLE, "nexar_comm_dump_flight_record", "comm");
    BAD(nexar_comm_dump_flight_record(c, "/nonexistent-dir/nexar/flight.json"), NEXAR_ERR_INTERNAL,
        "nexar_comm_dump_flight_record", "flight record");
    {
        static char text[1 << 18];
        char path[64];
        snprintf(path, sizeof path, "/tmp/nexar-test-flight-%d-%d.json", (int)getpid(), rank);
        CK(nexar_barrier(c));
        CK(nexar_comm_dump_flight_record(c, path));
        FILE* fp = fopen(path, "r");
        size_t len = fp ? fread(text, 1, sizeof text - 1, fp) : 0;
        text[len] = 0;
        if (fp) fclose(fp);
        remove(path);
        EXPECT(strstr(text, "\"comm\"") && strstr(text, "\"op\": \"barrier\"") && strstr(text, "\"state\": \"completed\""),
               "flight record %s: %.200s", path, text);
    }

    /* the world still works after all that */
    CK(nexar_allreduce(f, g, 4, NEXAR_FLOAT32, NEXAR_SUM, c));
    EXPECT(g[3] == 4.0f * n, "allreduce after errors");

    /* abort: later operations fail with NEXAR_ERR_ABORTED, destroy still works */
    if (n == 1) {
        CK(nexar_comm_abort(c));
        BAD(nexar_barrier(c), NEXAR_ERR_ABORTED, "nexar_barrier", "abort");
        nexar_result_t health;
        CK(nexar_comm_get_error(c, &health));
        EXPECT(health == NEXAR_ERR_ABORTED, "sticky error %d", (int)health);
    }
    CK(nexar_comm_get_failed(c, NULL, 0, &nfailed));
    EXPECT(nfailed == 0, "a healthy communicator reports %zu failed members", nfailed);
    CK(nexar_comm_destroy(c));
    if (failures) {
        fprintf(stderr, "rank %d: %d failures\n", rank, failures);
        return 1;
    }
    printf("rank %d/%d: test_errors ok\n", rank, n);
    return 0;
}
