//go:build !linux

package sched

import (
	"context"
	"errors"
)

// MoveOff reports false: moving a thread off a CPU is implemented on Linux
// only.
func MoveOff(cpu int) bool { return false }

// IdleSysmon reports an error: it is implemented on Linux only.
func IdleSysmon(ctx context.Context) (int, error) {
	return 0, errors.New("sched: IdleSysmon is implemented on Linux only")
}

// Policy reports an error: it is implemented on Linux only.
func Policy(tid int) (int, error) {
	return 0, errors.New("sched: Policy is implemented on Linux only")
}

// Allowed is nil: the CPU set is read on Linux only.
func Allowed() []uint64 { return nil }
