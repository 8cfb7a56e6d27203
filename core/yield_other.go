//go:build !linux

package core

import "runtime"

// osYield lets other goroutines run; off Linux there is no shared-memory
// path whose waiters would need more.
func osYield() { runtime.Gosched() }
