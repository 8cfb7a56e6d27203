/* Declarations shared by the Go export files of capi. Definitions live in
 * lasterror.c (cgo allows only declarations in an export file's preamble). */
#ifndef NEXAR_CAPI_H
#define NEXAR_CAPI_H
#include <stddef.h>
#include <stdint.h>

/* nxcapi_set_last_error copies msg[0:n] (truncated, NUL-terminated) into
 * the calling thread's last-error buffer. */
void nxcapi_set_last_error(const char* msg, size_t n);

/* nxcapi_call_failure calls the nexar_failure_fn fn for comm, marking the
 * calling thread as inside comm's failure handler meanwhile;
 * nxcapi_in_failure_handler(comm) reports that mark (nexar_comm_destroy
 * from comm's own handler must not wait for the handler to return). */
void nxcapi_call_failure(uintptr_t fn, uintptr_t comm, int rank, int code, const char* msg, void* user);
int nxcapi_in_failure_handler(uintptr_t comm);

/* nxcapi_call_rpc calls the nexar_rpc_handler_t fn. */
int nxcapi_call_rpc(uintptr_t fn, uintptr_t comm, int from, uint32_t id, const void* req,
                    size_t req_len, void** reply, size_t* reply_len, void* user);

#endif
