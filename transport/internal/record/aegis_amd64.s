//go:build amd64 && !purego

#include "textflag.h"

// AEGIS-128L block functions (aegis.go). The state S0..S7 lives in X0..X7
// while a call runs. UPDATE is Update(M0, M1) with M0 in X10 and M1 in X11
// (both clobbered): the new blocks are made from the highest down, each
// from old values that are read before they are overwritten, and S'0 from
// the old S7 saved in X12.
#define UPDATE \
	PXOR   X0, X10  \
	PXOR   X4, X11  \
	MOVOU  X7, X12  \
	MOVOU  X6, X13  \
	AESENC X7, X13  \
	MOVOU  X13, X7  \
	MOVOU  X5, X13  \
	AESENC X6, X13  \
	MOVOU  X13, X6  \
	MOVOU  X4, X13  \
	AESENC X5, X13  \
	MOVOU  X13, X5  \
	MOVOU  X3, X13  \
	AESENC X11, X13 \
	MOVOU  X13, X4  \
	MOVOU  X2, X13  \
	AESENC X3, X13  \
	MOVOU  X13, X3  \
	MOVOU  X1, X13  \
	AESENC X2, X13  \
	MOVOU  X13, X2  \
	MOVOU  X0, X13  \
	AESENC X1, X13  \
	MOVOU  X13, X1  \
	AESENC X10, X12 \
	MOVOU  X12, X0

// KEYSTREAM: z0 = S6 ^ S1 ^ (S2 & S3) into X8, z1 = S2 ^ S5 ^ (S6 & S7) into X9.
#define KEYSTREAM \
	MOVOU X2, X8 \
	PAND  X3, X8 \
	PXOR  X6, X8 \
	PXOR  X1, X8 \
	MOVOU X6, X9 \
	PAND  X7, X9 \
	PXOR  X2, X9 \
	PXOR  X5, X9

#define LOAD_STATE(R) \
	MOVOU 0(R), X0   \
	MOVOU 16(R), X1  \
	MOVOU 32(R), X2  \
	MOVOU 48(R), X3  \
	MOVOU 64(R), X4  \
	MOVOU 80(R), X5  \
	MOVOU 96(R), X6  \
	MOVOU 112(R), X7

#define STORE_STATE(R) \
	MOVOU X0, 0(R)   \
	MOVOU X1, 16(R)  \
	MOVOU X2, 32(R)  \
	MOVOU X3, 48(R)  \
	MOVOU X4, 64(R)  \
	MOVOU X5, 80(R)  \
	MOVOU X6, 96(R)  \
	MOVOU X7, 112(R)

// BLOCKS_PROLOGUE loads the arguments of encBlocksAsm and decBlocksAsm
// (s in AX, dst in DI, src in SI, n in CX) and the state.
#define BLOCKS_PROLOGUE \
	MOVQ s+0(FP), AX    \
	MOVQ dst+8(FP), DI  \
	MOVQ src+16(FP), SI \
	MOVQ n+24(FP), CX   \
	LOAD_STATE(AX)

// func updateAsm(s *aegisState, m *[32]byte)
TEXT ·updateAsm(SB), NOSPLIT, $0-16
	MOVQ s+0(FP), AX
	MOVQ m+8(FP), SI
	LOAD_STATE(AX)
	MOVOU 0(SI), X10
	MOVOU 16(SI), X11
	UPDATE
	STORE_STATE(AX)
	RET

// func encBlocksAsm(s *aegisState, dst, src *byte, n int)
TEXT ·encBlocksAsm(SB), NOSPLIT, $0-32
	BLOCKS_PROLOGUE
	TESTQ CX, CX
	JZ    encdone

encloop:
	KEYSTREAM
	MOVOU 0(SI), X10
	MOVOU 16(SI), X11
	PXOR  X10, X8
	PXOR  X11, X9
	MOVOU X8, 0(DI)
	MOVOU X9, 16(DI)
	UPDATE
	ADDQ  $32, SI
	ADDQ  $32, DI
	DECQ  CX
	JNZ   encloop

encdone:
	STORE_STATE(AX)
	RET

// func decBlocksAsm(s *aegisState, dst, src *byte, n int)
TEXT ·decBlocksAsm(SB), NOSPLIT, $0-32
	BLOCKS_PROLOGUE
	TESTQ CX, CX
	JZ    decdone

decloop:
	KEYSTREAM
	MOVOU 0(SI), X10
	MOVOU 16(SI), X11
	PXOR  X8, X10
	PXOR  X9, X11
	MOVOU X10, 0(DI)
	MOVOU X11, 16(DI)
	UPDATE
	ADDQ  $32, SI
	ADDQ  $32, DI
	DECQ  CX
	JNZ   decloop

decdone:
	STORE_STATE(AX)
	RET
