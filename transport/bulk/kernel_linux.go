package bulk

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tcpEstablished is TCP_ESTABLISHED (include/net/tcp_states.h).
const tcpEstablished = 1

// kernelAnswered reports how long ago the kernel at the other end of c
// last sent anything on it (data, an ACK, a keepalive's answer), and
// whether c is an established TCP connection whose TCP_INFO says so.
func kernelAnswered(c net.Conn) (time.Duration, bool) {
	rc := tcpRaw(c)
	if rc == nil {
		return 0, false
	}
	var age time.Duration
	ok := false
	_ = rc.Control(func(fd uintptr) { age, ok = kernelAnsweredFD(int(fd)) })
	return age, ok
}

// tcpRaw is c's descriptor for system calls, or nil where c is not a TCP
// connection (or has none).
func tcpRaw(c net.Conn) syscall.RawConn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// kernelAnsweredFD is kernelAnswered for the socket fd.
func kernelAnsweredFD(fd int) (time.Duration, bool) {
	i, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil || i.State != tcpEstablished {
		return 0, false
	}
	return time.Duration(min(i.Last_ack_recv, i.Last_data_recv)) * time.Millisecond, true
}
