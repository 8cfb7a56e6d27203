//go:build !linux

package bulk

import (
	"net"
	"time"
)

// kernelAnswered needs TCP_INFO (Linux): elsewhere no connection tells.
func kernelAnswered(net.Conn) (time.Duration, bool) { return 0, false }
