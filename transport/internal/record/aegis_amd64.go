//go:build amd64 && !purego

package record

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// aegisFast: the AES-NI block functions can run here.
var aegisFast = cpu.X86.HasAES && cpu.X86.HasSSE2

//go:noescape
func updateAsm(s *aegisState, m *[32]byte)

//go:noescape
func encBlocksAsm(s *aegisState, dst, src *byte, n int)

//go:noescape
func decBlocksAsm(s *aegisState, dst, src *byte, n int)

func update(s *aegisState, m *[32]byte) {
	if aegisFast {
		updateAsm(s, m)
		return
	}
	refUpdate(s, m)
}

// encBlocks encrypts n 32-byte blocks from src to dst (which may be src).
func encBlocks(s *aegisState, dst, src *byte, n int) {
	if aegisFast {
		encBlocksAsm(s, dst, src, n)
		return
	}
	refEnc(s, unsafe.Slice(dst, 32*n), unsafe.Slice(src, 32*n))
}

// decBlocks decrypts n 32-byte blocks from src to dst (which may be src).
func decBlocks(s *aegisState, dst, src *byte, n int) {
	if aegisFast {
		decBlocksAsm(s, dst, src, n)
		return
	}
	refDec(s, unsafe.Slice(dst, 32*n), unsafe.Slice(src, 32*n))
}
