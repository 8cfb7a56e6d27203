//go:build !linux

package collective

// Off Linux large scratch buffers come from the Go heap.
func mapHuge(int) []byte   { return nil }
func isMapped([]byte) bool { return false }
func unmapHuge([]byte)     {}
