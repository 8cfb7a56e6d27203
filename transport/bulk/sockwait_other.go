//go:build !linux

package bulk

import "net"

// sockWait needs a duplicated descriptor and a non-blocking peek (Linux):
// elsewhere a TCP channel's read loop reads alone and nobody polls it.
type sockWait struct{}

func newSockWait(net.Conn) *sockWait { return nil }

func (*sockWait) peek() bool      { return false }
func (*sockWait) wait() error     { return nil }
func (*sockWait) interrupt()      {}
func (*sockWait) clearInterrupt() {}
func (*sockWait) close()          {}
