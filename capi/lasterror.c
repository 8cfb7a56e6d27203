// The parts of the C ABI that need no Go: error strings, the thread-local
// last error and the version query.
#include <string.h>

#include "capi.h"
#include "nexar.h"

// One buffer per OS thread. A call from C into Go runs on the caller's
// thread for its whole duration, so Go writing here through
// nxcapi_set_last_error fills the caller's own buffer.
static _Thread_local char last_error[1024];

void nxcapi_set_last_error(const char* msg, size_t n) {
    if (n >= sizeof last_error) {
        n = sizeof last_error - 1;
    }
    if (n > 0) {
        memcpy(last_error, msg, n);
    }
    last_error[n] = '\0';
}

const char* nexar_last_error(void) { return last_error; }

const char* nexar_result_string(nexar_result_t code) {
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
    }
    return "unknown result";
}

void nexar_get_version(int* major, int* minor, int* patch) {
    if (major != NULL) {
        *major = NEXAR_VERSION_MAJOR;
    }
    if (minor != NULL) {
        *minor = NEXAR_VERSION_MINOR;
    }
    if (patch != NULL) {
        *patch = NEXAR_VERSION_PATCH;
    }
}
