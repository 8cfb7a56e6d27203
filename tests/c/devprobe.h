/* devprobe.h: the check that fake device memory is what the hardware's
 * is to the host, unreadable (tests/fakes: a host read must crash). */
#ifndef NEXAR_TEST_DEVPROBE_H
#define NEXAR_TEST_DEVPROBE_H

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

/* expect_host_read_dies checks that reading 8 bytes at probe from the host
 * dies by SIGSEGV, in a forked child. Under AddressSanitizer, whose
 * handler would catch that fault, report it and exit 1, it checks instead
 * that the kernel refuses to read the bytes (write(2) of them to a pipe
 * fails with EFAULT): the same fact, without a fault. */
static inline void expect_host_read_dies(const void* probe, const char* what) {
#if defined(__SANITIZE_ADDRESS__)
    int fds[2];
    EXPECT(pipe(fds) == 0, "pipe");
    errno = 0;
    ssize_t n = write(fds[1], probe, 8);
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    EXPECT(n < 0 && err == EFAULT, "the kernel read %s from the host (write returned %zd, errno %d)", what, n, err);
#else
    pid_t pid = fork();
    if (pid == 0) {
        volatile int64_t v = *(volatile const int64_t*)probe;
        (void)v;
        _exit(0);
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    EXPECT(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "a host read of %s did not die by SIGSEGV (status %#x)",
           what, status);
#endif
}

#endif
