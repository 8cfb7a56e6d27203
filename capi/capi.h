/* Declarations shared by the Go export files of capi. Definitions live in
 * lasterror.c (cgo allows only declarations in an export file's preamble). */
#ifndef NEXAR_CAPI_H
#define NEXAR_CAPI_H
#include <stddef.h>
#include <stdint.h>

/* nxcapi_set_last_error copies msg[0:n] (truncated, NUL-terminated) into
 * the calling thread's last-error buffer. */
void nxcapi_set_last_error(const char* msg, size_t n);

/* nxcapi_call_failure calls the nexar_failure_fn fn, marking the calling
 * thread as inside a failure handler meanwhile; nxcapi_in_failure_handler
 * reports that mark (nexar_comm_destroy from a handler must not wait for
 * the handler to return). */
void nxcapi_call_failure(uintptr_t fn, uintptr_t comm, int rank, int code, const char* msg, void* user);
int nxcapi_in_failure_handler(void);

#endif
