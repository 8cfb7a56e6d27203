/* Declarations shared by the Go export files of capi. Definitions live in
 * lasterror.c (cgo allows only declarations in an export file's preamble). */
#ifndef NEXAR_CAPI_H
#define NEXAR_CAPI_H
#include <stddef.h>
#include <stdint.h>

/* nxcapi_set_last_error copies msg[0:n] (truncated, NUL-terminated) into
 * the calling thread's last-error buffer. */
void nxcapi_set_last_error(const char* msg, size_t n);

#endif
