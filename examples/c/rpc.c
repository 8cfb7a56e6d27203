/* rpc: every rank serves function 1, which squares an int64; rank 0 calls
 * every rank and prints the answers. Start it with the launcher:
 *
 *     nexar run -n 4 -- ./example_c_rpc
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"

#define SQUARE 1 /* the function id */

static nexar_result_t square(nexar_comm_t comm, int from, uint32_t fn, const void* req,
                             size_t req_len, void** reply, size_t* reply_len, void* user) {
    int64_t v;
    (void)comm;
    (void)from;
    (void)fn;
    (void)user;
    if (req_len != sizeof v) {
        const char* msg = "want an 8-byte int64";
        *reply = malloc(strlen(msg) + 1);
        if (*reply != NULL) {
            memcpy(*reply, msg, strlen(msg) + 1);
        }
        return NEXAR_ERR_INVALID_ARGUMENT;
    }
    memcpy(&v, req, sizeof v);
    v *= v;
    *reply = malloc(sizeof v);
    if (*reply == NULL) {
        return NEXAR_ERR_INTERNAL;
    }
    memcpy(*reply, &v, sizeof v);
    *reply_len = sizeof v;
    return NEXAR_SUCCESS;
}

static int check(nexar_result_t r, const char* what) {
    if (r != NEXAR_SUCCESS) {
        fprintf(stderr, "%s: %s: %s\n", what, nexar_result_string(r), nexar_last_error());
        exit(1);
    }
    return 0;
}

int main(void) {
    nexar_comm_t comm;
    int rank, size;
    check(nexar_comm_init_from_env(&comm), "init");
    check(nexar_comm_rank(comm, &rank), "rank");
    check(nexar_comm_size(comm, &size), "size");
    check(nexar_rpc_register(comm, SQUARE, square, NULL), "register");
    check(nexar_barrier(comm), "barrier"); /* every rank serves from here */
    if (rank == 0) {
        for (int r = 0; r < size; r++) {
            int64_t v = r + 2, got = 0;
            void* reply = NULL;
            size_t len = 0;
            check(nexar_rpc_call(comm, r, SQUARE, &v, sizeof v, &reply, &len), "call");
            if (len != sizeof got) {
                fprintf(stderr, "rank %d answered %zu bytes\n", r, len);
                return 1;
            }
            memcpy(&got, reply, sizeof got);
            nexar_free(reply);
            printf("rank %d: %lld squared is %lld\n", r, (long long)v, (long long)got);
            if (got != v * v) {
                return 1;
            }
        }
    }
    check(nexar_barrier(comm), "barrier"); /* nobody leaves while rank 0 calls */
    check(nexar_comm_destroy(comm), "destroy");
    return 0;
}
