//go:build !amd64 || purego

package record

import "unsafe"

// aegisFast is false: only the reference block functions exist here.
const aegisFast = false

func update(s *aegisState, m *[32]byte) { refUpdate(s, m) }

func encBlocks(s *aegisState, dst, src *byte, n int) {
	refEnc(s, unsafe.Slice(dst, 32*n), unsafe.Slice(src, 32*n))
}

func decBlocks(s *aegisState, dst, src *byte, n int) {
	refDec(s, unsafe.Slice(dst, 32*n), unsafe.Slice(src, 32*n))
}
