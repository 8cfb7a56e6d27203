//go:build linux && (amd64 || arm64)

package bulk

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

// Cross-memory attach (process_vm_readv): the receiver of a large frame on
// a shared-memory ring copies the payload straight out of the sender's
// buffer, one copy instead of two through the ring. The kernel allows it
// between processes of one user that may trace each other; the endpoints
// probe it when the ring is set up and fall back to the ring copy when it
// is refused (containers' seccomp profiles, Yama, PID namespaces).

const cmaSupported = true

// readRemote copies len(dst) bytes at addr in process pid into dst.
func readRemote(pid int, addr uint64, dst []byte) error {
	for len(dst) > 0 {
		local := syscall.Iovec{Base: &dst[0]}
		local.SetLen(len(dst))
		remote := struct {
			base uintptr
			len  uint64
		}{uintptr(addr), uint64(len(dst))}
		n, _, errno := syscall.Syscall6(sysProcessVMReadv, uintptr(pid),
			uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
		runtime.KeepAlive(dst)
		if errno != 0 {
			return fmt.Errorf("bulk: process_vm_readv from pid %d: %w", pid, errno)
		}
		if n == 0 {
			return fmt.Errorf("bulk: process_vm_readv from pid %d: no progress", pid)
		}
		dst = dst[n:]
		addr += uint64(n)
	}
	return nil
}

func selfPID() int { return os.Getpid() }
