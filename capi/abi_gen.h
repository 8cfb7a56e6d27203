// @generated from internal/abi by go generate ./internal/abi. Do not edit.
// The messages of nexar_result_string (capi/lasterror.c).
#ifndef NEXAR_CAPI_ABI_GEN_H
#define NEXAR_CAPI_ABI_GEN_H

#include "nexar.h"

static const char* nxcapi_result_message(nexar_result_t code) {
    switch (code) {
    case NEXAR_SUCCESS:
        return "success";
    case NEXAR_ERR_INVALID_ARGUMENT:
        return "invalid argument (see nexar_last_error)";
    case NEXAR_ERR_INVALID_HANDLE:
        return "invalid handle: unknown, NULL or already destroyed";
    case NEXAR_ERR_MISMATCH:
        return "ranks made mismatched collective calls";
    case NEXAR_ERR_PEER_DOWN:
        return "peer down";
    case NEXAR_ERR_TIMEOUT:
        return "timeout";
    case NEXAR_ERR_ABORTED:
        return "communicator aborted";
    case NEXAR_ERR_CLOSED:
        return "communicator closed";
    case NEXAR_ERR_AUTH:
        return "authentication failed";
    case NEXAR_ERR_TRUNCATED:
        return "message truncated: larger than the receive buffer";
    case NEXAR_ERR_UNAVAILABLE:
        return "feature or device unavailable";
    case NEXAR_ERR_INTERNAL:
        return "internal error (see nexar_last_error)";
    case NEXAR_ERR_FORKED:
        return "called in a child made by fork() without exec(); the library is unusable there";
    case NEXAR_ERR_REVOKED:
        return "communicator revoked";
    case NEXAR_ERR_NO_QUORUM:
        return "no quorum: this side of the job must not continue";
    }
    return "unknown result";
}

#endif
