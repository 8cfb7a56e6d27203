// The exported nexar_* functions: each refuses at once in a child made by
// fork() without exec(), then calls its Go implementation nxgo_* (capi/*.go).
//
// The check is in C because entering Go is itself unsafe in such a child:
// only the forking thread survives, so the runtime's other threads (the
// scheduler's, the network poller's, the goroutines that serve the
// connections) are gone, and any lock one of them held stays locked. A call
// that got into Go could hang, or run part of a collective on the parent's
// inherited sockets and shared-memory rings, handing the parent's peers data
// the parent never sent. The refusal touches nothing: no handle lookup, no
// send, no close.
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include "_cgo_export.h"
#include "capi.h"
#include "nexar.h"

// owner is the process that loaded the library; forked is set in every child
// it (or a descendant) makes with fork(). Go's own fork+exec uses clone
// directly and runs no atfork handler, so it never sets forked.
static pid_t owner;
static atomic_int forked;

static void on_fork_child(void) { atomic_store(&forked, 1); }

__attribute__((constructor)) static void nxcapi_entry_init(void) {
    owner = getpid();
    pthread_atfork(NULL, NULL, on_fork_child);
}

// refuse sets the last error of fn, called in a forked child; what names the
// handle kind the call took ("communicator", "request"), NULL for init.
static nexar_result_t refuse(const char* fn, const char* what) {
    char msg[512];
    int n;
    if (what != NULL) {
        n = snprintf(msg, sizeof msg,
                     "%s: called in process %ld, a child made by fork() without exec(): the %s "
                     "belongs to the parent process pid %ld; nothing was done (a forked child "
                     "cannot use libnexar: start workers with fork+exec or posix_spawn)",
                     fn, (long)getpid(), what, (long)owner);
    } else {
        n = snprintf(msg, sizeof msg,
                     "%s: called in process %ld, a child made by fork() without exec() of the "
                     "parent process pid %ld that loaded libnexar; nothing was done (a forked "
                     "child cannot use libnexar: start workers with fork+exec or posix_spawn)",
                     fn, (long)getpid(), (long)owner);
    }
    if (n < 0) {
        n = 0;
    }
    nxcapi_set_last_error(msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    return NEXAR_ERR_FORKED;
}

#define GUARD(what)                                                   \
    do {                                                              \
        if (atomic_load_explicit(&forked, memory_order_relaxed)) {    \
            return refuse(__func__, what);                            \
        }                                                             \
    } while (0)

void nexar_free(void* p) { free(p); }

// The shims, one per function that internal/abi describes (funcs.go).
// @generated entry: go generate ./internal/abi
nexar_result_t nexar_comm_init_from_env(nexar_comm_t* comm) {
    GUARD(NULL);
    return (nexar_result_t)nxgo_comm_init_from_env((uintptr_t*)comm);
}

nexar_result_t nexar_comm_init(const nexar_config_t* config, nexar_comm_t* comm) {
    GUARD(NULL);
    return (nexar_result_t)nxgo_comm_init((void*)config, (uintptr_t*)comm);
}

nexar_result_t nexar_comm_destroy(nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_destroy((uintptr_t)comm);
}

nexar_result_t nexar_comm_abort(nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_abort((uintptr_t)comm);
}

nexar_result_t nexar_comm_rank(nexar_comm_t comm, int* rank) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_rank((uintptr_t)comm, rank);
}

nexar_result_t nexar_comm_size(nexar_comm_t comm, int* size) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_size((uintptr_t)comm, size);
}

nexar_result_t nexar_comm_split(nexar_comm_t comm, int color, int key, nexar_comm_t* newcomm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_split((uintptr_t)comm, color, key, (uintptr_t*)newcomm);
}

nexar_result_t nexar_seed_start(const char* bind_addr, int world_size, const void* token,
                                size_t token_len, nexar_seed_t* seed, char* addr, size_t addr_len) {
    GUARD(NULL);
    return (nexar_result_t)nxgo_seed_start((char*)bind_addr, world_size, (void*)token, token_len,
        (uintptr_t*)seed, addr, addr_len);
}

nexar_result_t nexar_seed_close(nexar_seed_t seed) {
    GUARD("seed");
    return (nexar_result_t)nxgo_seed_close((uintptr_t)seed);
}

nexar_result_t nexar_comm_get_error(nexar_comm_t comm, nexar_result_t* error) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_get_error((uintptr_t)comm, (int*)error);
}

nexar_result_t nexar_comm_get_path(nexar_comm_t comm, int peer, char* buf, size_t size,
                                   size_t* len) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_get_path((uintptr_t)comm, peer, buf, size, len);
}

nexar_result_t nexar_comm_get_failed(nexar_comm_t comm, int* ranks, size_t capacity,
                                     size_t* count) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_get_failed((uintptr_t)comm, ranks, capacity, count);
}

nexar_result_t nexar_comm_set_failure_handler(nexar_comm_t comm, nexar_failure_fn fn, void* user) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_set_failure_handler((uintptr_t)comm, (uintptr_t)fn, user);
}

nexar_result_t nexar_comm_set_failure_policy(nexar_comm_t comm, nexar_failure_policy_t policy) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_set_failure_policy((uintptr_t)comm, (int)policy);
}

nexar_result_t nexar_comm_get_failure_policy(nexar_comm_t comm, nexar_failure_policy_t* policy) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_get_failure_policy((uintptr_t)comm, (int*)policy);
}

nexar_result_t nexar_comm_revoke(nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_revoke((uintptr_t)comm);
}

nexar_result_t nexar_comm_is_revoked(nexar_comm_t comm, int* flag) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_is_revoked((uintptr_t)comm, flag);
}

nexar_result_t nexar_comm_agree(nexar_comm_t comm, uint64_t* flag, int* failed, size_t capacity,
                                size_t* count) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_agree((uintptr_t)comm, flag, failed, capacity, count);
}

nexar_result_t nexar_comm_shrink(nexar_comm_t comm, nexar_comm_t* newcomm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_shrink((uintptr_t)comm, (uintptr_t*)newcomm);
}

nexar_result_t nexar_comm_grow(nexar_comm_t comm, nexar_comm_t* newcomm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_grow((uintptr_t)comm, (uintptr_t*)newcomm);
}

nexar_result_t nexar_comm_join(const nexar_config_t* config, nexar_comm_t* comm) {
    GUARD(NULL);
    return (nexar_result_t)nxgo_comm_join((void*)config, (uintptr_t*)comm);
}

nexar_result_t nexar_comm_get_join_addrs(nexar_comm_t comm, char* buf, size_t len, size_t* needed) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_get_join_addrs((uintptr_t)comm, buf, len, needed);
}

nexar_result_t nexar_rpc_register(nexar_comm_t comm, uint32_t fn, nexar_rpc_handler_t handler,
                                  void* user) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_rpc_register((uintptr_t)comm, fn, (uintptr_t)handler, user);
}

nexar_result_t nexar_rpc_register_lent(nexar_comm_t comm, uint32_t fn,
                                       nexar_rpc_lent_handler_t handler, void* user) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_rpc_register_lent((uintptr_t)comm, fn, (uintptr_t)handler, user);
}

nexar_result_t nexar_rpc_call(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                              size_t req_len, void** reply, size_t* reply_len) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_rpc_call((uintptr_t)comm, peer, fn, (void*)req, req_len, 0, 0,
        reply, reply_len);
}

nexar_result_t nexar_rpc_call_timeout(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                                      size_t req_len, int64_t timeout_ms, void** reply,
                                      size_t* reply_len) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_rpc_call((uintptr_t)comm, peer, fn, (void*)req, req_len, 1,
        timeout_ms, reply, reply_len);
}

nexar_result_t nexar_rpc_call_into(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                                   size_t req_len, int64_t timeout_ms, nexar_rpc_alloc_t alloc,
                                   void* user, size_t* reply_len) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_rpc_call_into((uintptr_t)comm, peer, fn, (void*)req, req_len,
        timeout_ms, (uintptr_t)alloc, user, reply_len);
}

nexar_result_t nexar_rpc_icall(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                               size_t req_len, int64_t timeout_ms, void** reply, size_t* reply_len,
                               nexar_request_t* request) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_rpc_icall((uintptr_t)comm, peer, fn, (void*)req, req_len,
        timeout_ms, reply, reply_len, (uintptr_t*)request);
}

nexar_result_t nexar_send(const void* buf, size_t count, nexar_datatype_t dt, int peer,
                          uint64_t tag, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_send((void*)buf, count, dt, peer, tag, (uintptr_t)comm);
}

nexar_result_t nexar_isend(const void* buf, size_t count, nexar_datatype_t dt, int peer,
                           uint64_t tag, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_isend((void*)buf, count, dt, peer, tag, (uintptr_t)comm,
        (uintptr_t*)req);
}

nexar_result_t nexar_send_stream(const void* buf, size_t count, nexar_datatype_t dt, int peer,
                                 uint64_t tag, nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_send_stream((void*)buf, count, dt, peer, tag, (uintptr_t)comm,
        stream);
}

nexar_result_t nexar_recv(void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag,
                          nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_recv(buf, count, dt, peer, tag, (uintptr_t)comm);
}

nexar_result_t nexar_irecv(void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag,
                           nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_irecv(buf, count, dt, peer, tag, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_recv_stream(void* buf, size_t count, nexar_datatype_t dt, int peer,
                                 uint64_t tag, nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_recv_stream(buf, count, dt, peer, tag, (uintptr_t)comm, stream);
}

nexar_result_t nexar_recv_status(void* buf, size_t count, nexar_datatype_t dt, int peer,
                                 uint64_t tag, nexar_comm_t comm, nexar_status_t* status) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_recv_status(buf, count, dt, peer, tag, (uintptr_t)comm,
        (void*)status);
}

nexar_result_t nexar_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                               nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allreduce((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm);
}

nexar_result_t nexar_iallreduce(const void* sendbuf, void* recvbuf, size_t count,
                                nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iallreduce((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm,
        (uintptr_t*)req);
}

nexar_result_t nexar_allreduce_stream(const void* sendbuf, void* recvbuf, size_t count,
                                      nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                      void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allreduce_stream((void*)sendbuf, recvbuf, count, dt, op,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_broadcast(void* buf, size_t count, nexar_datatype_t dt, int root,
                               nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_broadcast(buf, count, dt, root, (uintptr_t)comm);
}

nexar_result_t nexar_ibroadcast(void* buf, size_t count, nexar_datatype_t dt, int root,
                                nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_ibroadcast(buf, count, dt, root, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_broadcast_stream(void* buf, size_t count, nexar_datatype_t dt, int root,
                                      nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_broadcast_stream(buf, count, dt, root, (uintptr_t)comm, stream);
}

nexar_result_t nexar_reduce(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                            nexar_op_t op, int root, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_reduce((void*)sendbuf, recvbuf, count, dt, op, root,
        (uintptr_t)comm);
}

nexar_result_t nexar_ireduce(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                             nexar_op_t op, int root, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_ireduce((void*)sendbuf, recvbuf, count, dt, op, root,
        (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_reduce_stream(const void* sendbuf, void* recvbuf, size_t count,
                                   nexar_datatype_t dt, nexar_op_t op, int root, nexar_comm_t comm,
                                   void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_reduce_stream((void*)sendbuf, recvbuf, count, dt, op, root,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                               nexar_datatype_t dt, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allgather((void*)sendbuf, recvbuf, sendcount, dt, (uintptr_t)comm);
}

nexar_result_t nexar_iallgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                nexar_datatype_t dt, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iallgather((void*)sendbuf, recvbuf, sendcount, dt, (uintptr_t)comm,
        (uintptr_t*)req);
}

nexar_result_t nexar_allgather_stream(const void* sendbuf, void* recvbuf, size_t sendcount,
                                      nexar_datatype_t dt, nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allgather_stream((void*)sendbuf, recvbuf, sendcount, dt,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_allgatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                                const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt,
                                nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allgatherv((void*)sendbuf, sendcount, recvbuf, (size_t*)recvcounts,
        (size_t*)displs, dt, (uintptr_t)comm);
}

nexar_result_t nexar_iallgatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                                 const size_t* recvcounts, const size_t* displs,
                                 nexar_datatype_t dt, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iallgatherv((void*)sendbuf, sendcount, recvbuf, (size_t*)recvcounts,
        (size_t*)displs, dt, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                    nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_reduce_scatter((void*)sendbuf, recvbuf, recvcount, dt, op,
        (uintptr_t)comm);
}

nexar_result_t nexar_ireduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                     nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                     nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_ireduce_scatter((void*)sendbuf, recvbuf, recvcount, dt, op,
        (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_reduce_scatter_stream(const void* sendbuf, void* recvbuf, size_t recvcount,
                                           nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                           void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_reduce_scatter_stream((void*)sendbuf, recvbuf, recvcount, dt, op,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_alltoall(const void* sendbuf, void* recvbuf, size_t count_per_peer,
                              nexar_datatype_t dt, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_alltoall((void*)sendbuf, recvbuf, count_per_peer, dt,
        (uintptr_t)comm);
}

nexar_result_t nexar_ialltoall(const void* sendbuf, void* recvbuf, size_t count_per_peer,
                               nexar_datatype_t dt, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_ialltoall((void*)sendbuf, recvbuf, count_per_peer, dt,
        (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_alltoall_stream(const void* sendbuf, void* recvbuf, size_t count_per_peer,
                                     nexar_datatype_t dt, nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_alltoall_stream((void*)sendbuf, recvbuf, count_per_peer, dt,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_alltoallv(const void* sendbuf, const size_t* sendcounts, const size_t* sdispls,
                               void* recvbuf, const size_t* recvcounts, const size_t* rdispls,
                               nexar_datatype_t dt, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_alltoallv((void*)sendbuf, (size_t*)sendcounts, (size_t*)sdispls,
        recvbuf, (size_t*)recvcounts, (size_t*)rdispls, dt, (uintptr_t)comm);
}

nexar_result_t nexar_ialltoallv(const void* sendbuf, const size_t* sendcounts,
                                const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                const size_t* rdispls, nexar_datatype_t dt, nexar_comm_t comm,
                                nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_ialltoallv((void*)sendbuf, (size_t*)sendcounts, (size_t*)sdispls,
        recvbuf, (size_t*)recvcounts, (size_t*)rdispls, dt, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_alltoallv_stream(const void* sendbuf, const size_t* sendcounts,
                                      const size_t* sdispls, void* recvbuf,
                                      const size_t* recvcounts, const size_t* rdispls,
                                      nexar_datatype_t dt, nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_alltoallv_stream((void*)sendbuf, (size_t*)sendcounts,
        (size_t*)sdispls, recvbuf, (size_t*)recvcounts, (size_t*)rdispls, dt, (uintptr_t)comm,
        stream);
}

nexar_result_t nexar_gather(const void* sendbuf, void* recvbuf, size_t sendcount,
                            nexar_datatype_t dt, int root, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_gather((void*)sendbuf, recvbuf, sendcount, dt, root,
        (uintptr_t)comm);
}

nexar_result_t nexar_igather(const void* sendbuf, void* recvbuf, size_t sendcount,
                             nexar_datatype_t dt, int root, nexar_comm_t comm,
                             nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_igather((void*)sendbuf, recvbuf, sendcount, dt, root,
        (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_gather_stream(const void* sendbuf, void* recvbuf, size_t sendcount,
                                   nexar_datatype_t dt, int root, nexar_comm_t comm, void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_gather_stream((void*)sendbuf, recvbuf, sendcount, dt, root,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_gatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                             const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt,
                             int root, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_gatherv((void*)sendbuf, sendcount, recvbuf, (size_t*)recvcounts,
        (size_t*)displs, dt, root, (uintptr_t)comm);
}

nexar_result_t nexar_igatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                              const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt,
                              int root, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_igatherv((void*)sendbuf, sendcount, recvbuf, (size_t*)recvcounts,
        (size_t*)displs, dt, root, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                             nexar_datatype_t dt, int root, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_scatter((void*)sendbuf, recvbuf, recvcount, dt, root,
        (uintptr_t)comm);
}

nexar_result_t nexar_iscatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                              nexar_datatype_t dt, int root, nexar_comm_t comm,
                              nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iscatter((void*)sendbuf, recvbuf, recvcount, dt, root,
        (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_scatter_stream(const void* sendbuf, void* recvbuf, size_t recvcount,
                                    nexar_datatype_t dt, int root, nexar_comm_t comm,
                                    void* stream) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_scatter_stream((void*)sendbuf, recvbuf, recvcount, dt, root,
        (uintptr_t)comm, stream);
}

nexar_result_t nexar_scatterv(const void* sendbuf, const size_t* sendcounts, const size_t* displs,
                              void* recvbuf, size_t recvcount, nexar_datatype_t dt, int root,
                              nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_scatterv((void*)sendbuf, (size_t*)sendcounts, (size_t*)displs,
        recvbuf, recvcount, dt, root, (uintptr_t)comm);
}

nexar_result_t nexar_iscatterv(const void* sendbuf, const size_t* sendcounts, const size_t* displs,
                               void* recvbuf, size_t recvcount, nexar_datatype_t dt, int root,
                               nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iscatterv((void*)sendbuf, (size_t*)sendcounts, (size_t*)displs,
        recvbuf, recvcount, dt, root, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_scan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                          nexar_op_t op, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_scan((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm);
}

nexar_result_t nexar_iscan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                           nexar_op_t op, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iscan((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm,
        (uintptr_t*)req);
}

nexar_result_t nexar_exscan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                            nexar_op_t op, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_exscan((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm);
}

nexar_result_t nexar_iexscan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                             nexar_op_t op, nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iexscan((void*)sendbuf, recvbuf, count, dt, op, (uintptr_t)comm,
        (uintptr_t*)req);
}

nexar_result_t nexar_barrier(nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_barrier((uintptr_t)comm);
}

nexar_result_t nexar_ibarrier(nexar_comm_t comm, nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_ibarrier((uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_allreduce_multi(const void* const* sendbufs, void* const* recvbufs,
                                     const size_t* counts, size_t nbufs, nexar_datatype_t dt,
                                     nexar_op_t op, size_t bucket_bytes, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allreduce_multi((void*)sendbufs, (void*)recvbufs, (size_t*)counts,
        nbufs, dt, op, bucket_bytes, (uintptr_t)comm);
}

nexar_result_t nexar_iallreduce_multi(const void* const* sendbufs, void* const* recvbufs,
                                      const size_t* counts, size_t nbufs, nexar_datatype_t dt,
                                      nexar_op_t op, size_t bucket_bytes, nexar_comm_t comm,
                                      nexar_request_t* req) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_iallreduce_multi((void*)sendbufs, (void*)recvbufs, (size_t*)counts,
        nbufs, dt, op, bucket_bytes, (uintptr_t)comm, (uintptr_t*)req);
}

nexar_result_t nexar_allreduce_compressed(void* buf, void* residual, size_t count,
                                          nexar_datatype_t dt, nexar_compress_t method,
                                          double ratio, uint64_t seed, nexar_comm_t comm) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_allreduce_compressed(buf, residual, count, dt, (int)method, ratio,
        seed, (uintptr_t)comm);
}

nexar_result_t nexar_waitall(size_t count, nexar_request_t* reqs, nexar_result_t* results) {
    GUARD("request");
    return (nexar_result_t)nxgo_waitall(count, (uintptr_t*)reqs, (int*)results);
}

nexar_result_t nexar_testany(size_t count, nexar_request_t* reqs, size_t* index, int* done) {
    GUARD("request");
    return (nexar_result_t)nxgo_testany(count, (uintptr_t*)reqs, index, done);
}

nexar_result_t nexar_wait(nexar_request_t req) {
    GUARD("request");
    return (nexar_result_t)nxgo_wait((uintptr_t)req);
}

nexar_result_t nexar_test(nexar_request_t req, int* done) {
    GUARD("request");
    return (nexar_result_t)nxgo_test((uintptr_t)req, done);
}

nexar_result_t nexar_request_status(nexar_request_t req, nexar_status_t* status) {
    GUARD("request");
    return (nexar_result_t)nxgo_request_status((uintptr_t)req, (void*)status);
}

nexar_result_t nexar_request_free(nexar_request_t req) {
    GUARD("request");
    return (nexar_result_t)nxgo_request_free((uintptr_t)req);
}

nexar_result_t nexar_comm_dump_flight_record(nexar_comm_t comm, const char* path) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_dump_flight_record((uintptr_t)comm, (char*)path);
}

nexar_result_t nexar_comm_get_stats(nexar_comm_t comm, nexar_stats_t* stats) {
    GUARD("communicator");
    return (nexar_result_t)nxgo_comm_get_stats((uintptr_t)comm, (void*)stats);
}

nexar_result_t nexar_device_adapter_install(const nexar_device_adapter_t* adapter) {
    GUARD(NULL);
    return (nexar_result_t)nxgo_device_adapter_install((void*)adapter);
}
// @end entry
