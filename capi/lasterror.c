// The parts of the C ABI that need no Go: error strings, the thread-local
// last error and the version query.
#include <string.h>

#include "abi_gen.h"
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

// The messages are generated from internal/abi with the enum itself.
const char* nexar_result_string(nexar_result_t code) { return nxcapi_result_message(code); }

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
