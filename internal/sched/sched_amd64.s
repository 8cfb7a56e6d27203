#include "textflag.h"

// func cpuidRDPID() bool
TEXT ·cpuidRDPID(SB),NOSPLIT,$0-1
	MOVL $0, AX
	MOVL $0, CX
	CPUID
	CMPL AX, $7
	JB   none
	MOVL $7, AX
	MOVL $0, CX
	CPUID
	SHRL $22, CX
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET
none:
	MOVB $0, ret+0(FP)
	RET

// func rdpid() uint64
TEXT ·rdpid(SB),NOSPLIT,$0-8
	RDPID AX
	MOVQ AX, ret+0(FP)
	RET
