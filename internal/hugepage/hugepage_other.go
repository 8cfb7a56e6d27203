//go:build !linux

package hugepage

// Map returns nil off Linux: buffers come from the Go heap.
func Map(int) []byte { return nil }

// Unmap does nothing off Linux.
func Unmap([]byte) {}
