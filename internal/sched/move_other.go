//go:build !linux

package sched

// MoveOff reports false: moving a thread off a CPU is implemented on Linux
// only.
func MoveOff(cpu int) bool { return false }
