//go:build !linux

package bulk

import (
	"context"
	"net"
	"time"
)

// sockWait needs blocking system calls on a socket taken out of Go's
// poller (Linux): elsewhere a TCP channel's read loop reads alone and
// nobody polls it.
type sockWait struct{}

func newSockWait(net.Conn) *sockWait { return nil }

func (*sockWait) Read([]byte) (int, error)        { return 0, nil }
func (*sockWait) peek() bool                      { return false }
func (*sockWait) wait(bool, time.Duration) error  { return nil }
func (*sockWait) wake()                           {}
func (*sockWait) shutdown()                       {}
func (*sockWait) answered() (time.Duration, bool) { return 0, false }
func (*sockWait) release()                        {}

// sockWriter's non-blocking first write is Linux's; elsewhere every write
// of a TCP link is watched (connLink.write).
type sockWriter struct{ ctx context.Context }

func newSockWriter(net.Conn) *sockWriter { return nil }

func (*sockWriter) Write([]byte) (int, error)          { return 0, nil }
func (*sockWriter) writeBuffers([][]byte) (int, error) { return 0, nil }
