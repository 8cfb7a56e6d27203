//go:build amd64 && !purego

#include "textflag.h"

// Every kernel is func(dst, src unsafe.Pointer, n int): n > 0 bytes, a
// multiple of 128, no alignment needed; dst = dst op src, four 32-byte
// vectors per iteration. Intel's src1 is always the dst element, so a NaN
// from dst wins for add/mul as in the scalar SSE code Go emits.

// BINOP: a single VEX instruction with src as the memory operand.
#define BINOP(NAME, INSN) \
TEXT NAME(SB), NOSPLIT, $0-24 \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX \
loop: \
	VMOVDQU 0(DI), Y0 \
	VMOVDQU 32(DI), Y1 \
	VMOVDQU 64(DI), Y2 \
	VMOVDQU 96(DI), Y3 \
	INSN 0(SI), Y0, Y0 \
	INSN 32(SI), Y1, Y1 \
	INSN 64(SI), Y2, Y2 \
	INSN 96(SI), Y3, Y3 \
	VMOVDQU Y0, 0(DI) \
	VMOVDQU Y1, 32(DI) \
	VMOVDQU Y2, 64(DI) \
	VMOVDQU Y3, 96(DI) \
	ADDQ $128, DI \
	ADDQ $128, SI \
	SUBQ $128, CX \
	JNZ loop \
	VZEROUPPER \
	RET

BINOP(·addF32AVX2, VADDPS)
BINOP(·mulF32AVX2, VMULPS)
BINOP(·addF64AVX2, VADDPD)
BINOP(·mulF64AVX2, VMULPD)
BINOP(·addI8AVX2, VPADDB)
BINOP(·minI8AVX2, VPMINSB)
BINOP(·maxI8AVX2, VPMAXSB)
BINOP(·minU8AVX2, VPMINUB)
BINOP(·maxU8AVX2, VPMAXUB)
BINOP(·addI32AVX2, VPADDD)
BINOP(·mulI32AVX2, VPMULLD)
BINOP(·minI32AVX2, VPMINSD)
BINOP(·maxI32AVX2, VPMAXSD)
BINOP(·minU32AVX2, VPMINUD)
BINOP(·maxU32AVX2, VPMAXUD)
BINOP(·addI64AVX2, VPADDQ)
BINOP(·andAVX2, VPAND)
BINOP(·orAVX2, VPOR)
BINOP(·xorAVX2, VPXOR)

// FMM: one vector of float min/max with the scalar semantics of fmin/fmax.
// MINOP(a, b) returns b when they compare equal or either is NaN, so:
//   t = MINOP(a, b)
//   t = (a == b) ? MERGE(t, a) : t   // OR picks -0 for min, AND +0 for max
//   t = isNaN(a) ? a : t             // a NaN in b is already in t
#define FMM(OFF, A, B, T, M, MINOP, MERGE, CMP, BLEND) \
	VMOVDQU OFF(DI), A \
	VMOVDQU OFF(SI), B \
	MINOP B, A, T \
	CMP $0, B, A, M \
	MERGE A, T, B \
	BLEND M, B, T, T \
	CMP $3, A, A, M \
	BLEND M, A, T, T \
	VMOVDQU T, OFF(DI)

#define FMINMAX(NAME, MINOP, MERGE, CMP, BLEND) \
TEXT NAME(SB), NOSPLIT, $0-24 \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX \
loop: \
	FMM(0, Y0, Y1, Y2, Y3, MINOP, MERGE, CMP, BLEND) \
	FMM(32, Y4, Y5, Y6, Y7, MINOP, MERGE, CMP, BLEND) \
	FMM(64, Y8, Y9, Y10, Y11, MINOP, MERGE, CMP, BLEND) \
	FMM(96, Y12, Y13, Y14, Y15, MINOP, MERGE, CMP, BLEND) \
	ADDQ $128, DI \
	ADDQ $128, SI \
	SUBQ $128, CX \
	JNZ loop \
	VZEROUPPER \
	RET

FMINMAX(·minF32AVX2, VMINPS, VORPS, VCMPPS, VBLENDVPS)
FMINMAX(·maxF32AVX2, VMAXPS, VANDPS, VCMPPS, VBLENDVPS)
FMINMAX(·minF64AVX2, VMINPD, VORPD, VCMPPD, VBLENDVPD)
FMINMAX(·maxF64AVX2, VMAXPD, VANDPD, VCMPPD, VBLENDVPD)

// Float16 via F16C: widen 8 halves to float32, operate, and narrow with
// round-to-nearest-even (imm 0), which is exactly the portable rule.
#define F16STEP(OFF, INSN) \
	VCVTPH2PS OFF(DI), Y0 \
	VCVTPH2PS OFF(SI), Y1 \
	INSN Y1, Y0, Y0 \
	VCVTPS2PH $0, Y0, OFF(DI)

#define F16OP(NAME, INSN) \
TEXT NAME(SB), NOSPLIT, $0-24 \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX \
loop: \
	F16STEP(0, INSN) \
	F16STEP(16, INSN) \
	F16STEP(32, INSN) \
	F16STEP(48, INSN) \
	F16STEP(64, INSN) \
	F16STEP(80, INSN) \
	F16STEP(96, INSN) \
	F16STEP(112, INSN) \
	ADDQ $128, DI \
	ADDQ $128, SI \
	SUBQ $128, CX \
	JNZ loop \
	VZEROUPPER \
	RET

F16OP(·addF16F16C, VADDPS)
F16OP(·mulF16F16C, VMULPS)

// func hasF16C() bool: CPUID.1:ECX bit 29 (x/sys/cpu does not report it).
TEXT ·hasF16C(SB), NOSPLIT, $0-1
	MOVL $1, AX
	XORL CX, CX
	CPUID
	SHRL $29, CX
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET

// BFloat16: widen by shifting into the top half of a float32, operate, and
// round to nearest even with integer ops (x + 0x7fff + lsb) >> 16; NaNs
// are kept NaN by OR-ing the quiet bit. Y13 = 0x40, Y14 = 0x7fff, Y15 = 1.
#define BF16ROUND(X, H, R, M) \
	VPSRLD $16, X, H \
	VPAND Y15, H, R \
	VPADDD Y14, R, R \
	VPADDD X, R, R \
	VPSRLD $16, R, R \
	VPOR Y13, H, H \
	VCMPPS $3, X, X, M \
	VBLENDVPS M, H, R, X

#define BF16STEP(OFF, INSN) \
	VPMOVZXWD OFF(DI), Y0 \
	VPMOVZXWD 16+OFF(DI), Y1 \
	VPMOVZXWD OFF(SI), Y2 \
	VPMOVZXWD 16+OFF(SI), Y3 \
	VPSLLD $16, Y0, Y0 \
	VPSLLD $16, Y1, Y1 \
	VPSLLD $16, Y2, Y2 \
	VPSLLD $16, Y3, Y3 \
	INSN Y2, Y0, Y0 \
	INSN Y3, Y1, Y1 \
	BF16ROUND(Y0, Y4, Y5, Y6) \
	BF16ROUND(Y1, Y7, Y8, Y9) \
	VPACKUSDW Y1, Y0, Y0 \
	VPERMQ $0xD8, Y0, Y0 \
	VMOVDQU Y0, OFF(DI)

#define BF16OP(NAME, INSN) \
TEXT NAME(SB), NOSPLIT, $0-24 \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX \
	VPCMPEQD Y15, Y15, Y15 \
	VPSRLD $17, Y15, Y14 \
	VPSRLD $31, Y15, Y15 \
	VPSLLD $6, Y15, Y13 \
loop: \
	BF16STEP(0, INSN) \
	BF16STEP(32, INSN) \
	BF16STEP(64, INSN) \
	BF16STEP(96, INSN) \
	ADDQ $128, DI \
	ADDQ $128, SI \
	SUBQ $128, CX \
	JNZ loop \
	VZEROUPPER \
	RET

BF16OP(·addBF16AVX2, VADDPS)
BF16OP(·mulBF16AVX2, VMULPS)

// The rest of the table: every kernel below works on whole 32-byte vectors,
// four per 128-byte iteration, with the loop of LOOP4.
#define LOOP4(STEP) \
loop: \
	STEP(0) \
	STEP(32) \
	STEP(64) \
	STEP(96) \
	ADDQ $128, DI \
	ADDQ $128, SI \
	SUBQ $128, CX \
	JNZ loop \
	VZEROUPPER \
	RET

#define ARGS \
	MOVQ dst+0(FP), DI \
	MOVQ src+8(FP), SI \
	MOVQ n+16(FP), CX

// 64-bit min/max: AVX2 has no VPMINSQ; compare and blend. Both operands
// are XORed with Y15 for the compare only: 0 for signed ones, the sign bit
// for unsigned ones (which then compare as signed).
#define SEL64(OFF, X, Y) \
	VMOVDQU OFF(DI), Y0 \
	VMOVDQU OFF(SI), Y1 \
	VPXOR Y15, Y0, Y3 \
	VPXOR Y15, Y1, Y4 \
	VPCMPGTQ Y, X, Y2 \
	VPBLENDVB Y2, Y1, Y0, Y0 \
	VMOVDQU Y0, OFF(DI)

#define MIN64(OFF) SEL64(OFF, Y3, Y4)
#define MAX64(OFF) SEL64(OFF, Y4, Y3)

#define SIGNED64 VPXOR Y15, Y15, Y15
#define UNSIGNED64 \
	VPCMPEQQ Y15, Y15, Y15 \
	VPSLLQ $63, Y15, Y15

TEXT ·minI64AVX2(SB), NOSPLIT, $0-24
	ARGS
	SIGNED64
	LOOP4(MIN64)

TEXT ·maxI64AVX2(SB), NOSPLIT, $0-24
	ARGS
	SIGNED64
	LOOP4(MAX64)

TEXT ·minU64AVX2(SB), NOSPLIT, $0-24
	ARGS
	UNSIGNED64
	LOOP4(MIN64)

TEXT ·maxU64AVX2(SB), NOSPLIT, $0-24
	ARGS
	UNSIGNED64
	LOOP4(MAX64)

// 64-bit product modulo 2^64 from 32x32->64 multiplies:
// lo(a)*lo(b) + ((hi(a)*lo(b) + lo(a)*hi(b)) << 32).
#define MUL64(OFF) \
	VMOVDQU OFF(DI), Y0 \
	VMOVDQU OFF(SI), Y1 \
	VPMULUDQ Y1, Y0, Y2 \
	VPSRLQ $32, Y0, Y3 \
	VPMULUDQ Y1, Y3, Y3 \
	VPSRLQ $32, Y1, Y4 \
	VPMULUDQ Y4, Y0, Y4 \
	VPADDQ Y4, Y3, Y3 \
	VPSLLQ $32, Y3, Y3 \
	VPADDQ Y3, Y2, Y0 \
	VMOVDQU Y0, OFF(DI)

TEXT ·mulI64AVX2(SB), NOSPLIT, $0-24
	ARGS
	LOOP4(MUL64)

// 8-bit product modulo 2^8 (the same bits signed or not): widen to 16-bit
// words in each lane, multiply, keep the low bytes, pack back (unpack and
// pack are both per 128-bit lane, so the order is kept). Y15 = 0,
// Y14 = 0x00ff in every word.
#define MUL8(OFF) \
	VMOVDQU OFF(DI), Y0 \
	VMOVDQU OFF(SI), Y1 \
	VPUNPCKLBW Y15, Y0, Y2 \
	VPUNPCKLBW Y15, Y1, Y3 \
	VPMULLW Y3, Y2, Y2 \
	VPAND Y14, Y2, Y2 \
	VPUNPCKHBW Y15, Y0, Y4 \
	VPUNPCKHBW Y15, Y1, Y5 \
	VPMULLW Y5, Y4, Y4 \
	VPAND Y14, Y4, Y4 \
	VPACKUSWB Y4, Y2, Y0 \
	VMOVDQU Y0, OFF(DI)

TEXT ·mulI8AVX2(SB), NOSPLIT, $0-24
	ARGS
	VPXOR Y15, Y15, Y15
	VPCMPEQW Y14, Y14, Y14
	VPSRLW $8, Y14, Y14
	LOOP4(MUL8)

// Half-precision min/max (float16 and bfloat16 alike) in the integer
// domain, 16 elements per vector: the key x ^ ((x >>arith 15) & 0x7fff)
// orders like the floats as signed words (-0 just below +0), so VPMINSW
// or VPMAXSW picks the answer and the same map turns the key back. NaNs
// (magnitude above the exponent mask EXP) are then put back with the
// portable priority: a NaN in dst wins, else one in src.
// Y15 = 0x7fff, Y14 = EXP in every word.
#define HALFMM(OFF, MM) \
	VMOVDQU OFF(DI), Y0 \
	VMOVDQU OFF(SI), Y1 \
	VPSRAW $15, Y0, Y2 \
	VPAND Y15, Y2, Y2 \
	VPXOR Y0, Y2, Y2 \
	VPSRAW $15, Y1, Y3 \
	VPAND Y15, Y3, Y3 \
	VPXOR Y1, Y3, Y3 \
	MM Y3, Y2, Y2 \
	VPSRAW $15, Y2, Y3 \
	VPAND Y15, Y3, Y3 \
	VPXOR Y3, Y2, Y2 \
	VPAND Y15, Y1, Y4 \
	VPCMPGTW Y14, Y4, Y4 \
	VPBLENDVB Y4, Y1, Y2, Y2 \
	VPAND Y15, Y0, Y4 \
	VPCMPGTW Y14, Y4, Y4 \
	VPBLENDVB Y4, Y0, Y2, Y2 \
	VMOVDQU Y2, OFF(DI)

#define HALFMIN(OFF) HALFMM(OFF, VPMINSW)
#define HALFMAX(OFF) HALFMM(OFF, VPMAXSW)

#define HALFCONST(EXP) \
	VPCMPEQW Y15, Y15, Y15 \
	VPSRLW $1, Y15, Y15 \
	MOVL $EXP, AX \
	VMOVD AX, X14 \
	VPBROADCASTW X14, Y14

TEXT ·minF16AVX2(SB), NOSPLIT, $0-24
	ARGS
	HALFCONST(0x7c00)
	LOOP4(HALFMIN)

TEXT ·maxF16AVX2(SB), NOSPLIT, $0-24
	ARGS
	HALFCONST(0x7c00)
	LOOP4(HALFMAX)

TEXT ·minBF16AVX2(SB), NOSPLIT, $0-24
	ARGS
	HALFCONST(0x7f80)
	LOOP4(HALFMIN)

TEXT ·maxBF16AVX2(SB), NOSPLIT, $0-24
	ARGS
	HALFCONST(0x7f80)
	LOOP4(HALFMAX)
