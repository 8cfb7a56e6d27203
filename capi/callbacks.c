// Calls into failure handlers (nexar_comm_set_failure_handler) and RPC
// handlers (nexar_rpc_register): Go cannot call a C function pointer itself.
#include "capi.h"
#include "nexar.h"

// The comm whose failure handler this thread runs, or 0 (handles are
// never 0).
static _Thread_local uintptr_t in_failure_handler;

void nxcapi_call_failure(uintptr_t fn, uintptr_t comm, int rank, int code, const char* msg, void* user) {
    in_failure_handler = comm;
    ((nexar_failure_fn)fn)((nexar_comm_t)comm, rank, (nexar_result_t)code, msg, user);
    in_failure_handler = 0;
}

int nxcapi_in_failure_handler(uintptr_t comm) { return in_failure_handler == comm; }

int nxcapi_call_rpc(uintptr_t fn, uintptr_t comm, int from, uint32_t id, const void* req,
                    size_t req_len, void** reply, size_t* reply_len, void* user) {
    return (int)((nexar_rpc_handler_t)fn)((nexar_comm_t)comm, from, id, req, req_len, reply,
                                          reply_len, user);
}
