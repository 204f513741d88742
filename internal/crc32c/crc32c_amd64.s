// CRC-32C (Castagnoli) by carry-less multiplication with AVX-512
// VPCLMULQDQ. Adapted from Go's hash/crc32 ieeeCLMUL (crc32_amd64.s,
// BSD-style licence, Copyright 2011 The Go Authors), which is based on
// Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ",
// with the Castagnoli constants (internal/crc32c/crc32c_amd64.go says how they are
// derived; TestCRC32CConstants recomputes them) and four 512-bit
// accumulators instead of one, so the folds do not wait on each other.

#include "textflag.h"

// Fold by 2048 bits (four ZMM registers): x^(2048+32), x^(2048-32) mod P,
// bit-reflected and shifted left by one, splatted over the four lanes.
DATA k2048<>+0(SB)/8, $0xdcb17aa4
DATA k2048<>+8(SB)/8, $0xb9e02b86
DATA k2048<>+16(SB)/8, $0xdcb17aa4
DATA k2048<>+24(SB)/8, $0xb9e02b86
DATA k2048<>+32(SB)/8, $0xdcb17aa4
DATA k2048<>+40(SB)/8, $0xb9e02b86
DATA k2048<>+48(SB)/8, $0xdcb17aa4
DATA k2048<>+56(SB)/8, $0xb9e02b86
GLOBL k2048<>(SB), RODATA, $64

// Fold by 512 bits (one ZMM register): x^544, x^480 mod P.
DATA k512<>+0(SB)/8, $0x740eef02
DATA k512<>+8(SB)/8, $0x9e4addf8
DATA k512<>+16(SB)/8, $0x740eef02
DATA k512<>+24(SB)/8, $0x9e4addf8
DATA k512<>+32(SB)/8, $0x740eef02
DATA k512<>+40(SB)/8, $0x9e4addf8
DATA k512<>+48(SB)/8, $0x740eef02
DATA k512<>+56(SB)/8, $0x9e4addf8
GLOBL k512<>(SB), RODATA, $64

// Fold by 128 bits: x^160, x^96 mod P.
DATA k128<>+0(SB)/8, $0xf20c0dfe
DATA k128<>+8(SB)/8, $0x14cd00bd6
GLOBL k128<>(SB), RODATA, $16

// x^64 mod P.
DATA k64<>+0(SB)/8, $0xdd45aab8
GLOBL k64<>(SB), RODATA, $8

// Barrett reduction: P and floor(x^64 / P), bit-reflected (33 bits).
DATA kpoly<>+0(SB)/8, $0x105ec76f1
DATA kpoly<>+8(SB)/8, $0xdea713f1
GLOBL kpoly<>(SB), RODATA, $16

// LANES folds the four 128-bit lanes of Z1 into X1 (leaving k128 in X0),
// as hash/crc32 does after its loop.
#define LANES \
	VEXTRACTF32X4 $1, Z1, X2; \
	VEXTRACTF32X4 $2, Z1, X3; \
	VEXTRACTF32X4 $3, Z1, X4; \
	VZEROUPPER; \
	MOVOU     k128<>+0(SB), X0; \
	MOVOA     X1, X5; \
	PCLMULQDQ $0, X0, X1; \
	PCLMULQDQ $0x11, X0, X5; \
	PXOR      X5, X1; \
	PXOR      X2, X1; \
	MOVOA     X1, X5; \
	PCLMULQDQ $0, X0, X1; \
	PCLMULQDQ $0x11, X0, X5; \
	PXOR      X5, X1; \
	PXOR      X3, X1; \
	MOVOA     X1, X5; \
	PCLMULQDQ $0, X0, X1; \
	PCLMULQDQ $0x11, X0, X5; \
	PXOR      X5, X1; \
	PXOR      X4, X1

// FINISH reduces X1 to the 32-bit CRC in X1's second dword: 128 bits
// to 64, then Barrett reduction (hash/crc32's code).
#define FINISH \
	PCMPEQB   X3, X3; \
	PCLMULQDQ $1, X1, X0; \
	PSRLDQ    $8, X1; \
	PXOR      X0, X1; \
	MOVOA X1, X2; \
	MOVQ  k64<>+0(SB), X0; \
	PSRLQ $32, X3; \
	PSRLDQ    $4, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0, X0, X1; \
	PXOR      X2, X1; \
	MOVOU kpoly<>+0(SB), X0; \
	MOVOA     X1, X2; \
	PAND      X3, X1; \
	PCLMULQDQ $0x10, X0, X1; \
	PAND      X3, X1; \
	PCLMULQDQ $0, X0, X1; \
	PXOR      X2, X1

// func castagnoliAVX512(crc uint32, p []byte) uint32
// crc is the inverted running CRC (as the CRC32 instruction keeps it);
// len(p) must be at least 256 and a multiple of 16.
TEXT ·castagnoliAVX512(SB), NOSPLIT, $0-36
	MOVL crc+0(FP), X0
	MOVQ p_base+8(FP), SI
	MOVQ p_len+16(FP), CX

	VPXORQ    Z10, Z10, Z10
	VMOVAPS   X0, X10
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPXORQ    Z10, Z1, Z1       // the initial CRC goes into the first bytes
	ADDQ      $256, SI
	SUBQ      $256, CX
	CMPQ      CX, $256
	JB        fold4

	VMOVDQU64 k2048<>+0(SB), Z0

	PCALIGN $32
loop256:
	VMOVDQU64  (SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x11, Z0, Z4, Z8
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPCLMULQDQ $0, Z0, Z2, Z2
	VPCLMULQDQ $0, Z0, Z3, Z3
	VPCLMULQDQ $0, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z1
	VPTERNLOGD $0x96, Z12, Z6, Z2
	VPTERNLOGD $0x96, Z13, Z7, Z3
	VPTERNLOGD $0x96, Z14, Z8, Z4
	ADDQ       $256, SI
	SUBQ       $256, CX
	CMPQ       CX, $256
	JGE        loop256

fold4:
	// Fold the four accumulators into one: Z1 into Z2, into Z3, into Z4.
	VMOVDQU64  k512<>+0(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z2, Z5, Z1
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z3, Z5, Z1
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z4, Z5, Z1

	CMPQ CX, $64
	JB   unfold

loop64:
	VMOVDQU64  (SI), Z11
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z11, Z5, Z1
	ADDQ       $64, SI
	SUBQ       $64, CX
	CMPQ       CX, $64
	JGE        loop64

unfold:
	LANES

	CMPQ CX, $16
	JB   finish

remain16:
	MOVOU     (SI), X10
	MOVOA     X1, X5
	PCLMULQDQ $0, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X10, X1
	SUBQ      $16, CX
	ADDQ      $16, SI
	CMPQ      CX, $16
	JGE       remain16

finish:
	FINISH
	PEXTRD $1, X1, AX
	MOVL   AX, ret+32(FP)
	RET

// func copyCastagnoliAVX512NT(crc uint32, dst, src []byte) uint32
// Copies src into dst with non-temporal stores (no read for ownership of
// dst, as runtime.memmove does above 1 MiB) and folds the very registers
// it stores into the inverted CRC-32C crc, so the checksum is of the bytes
// written. len(dst) == len(src), a multiple of 256 and at least 256; dst
// 64-byte aligned.
TEXT ·copyCastagnoliAVX512NT(SB), NOSPLIT, $0-60
	MOVL crc+0(FP), X0
	MOVQ dst_base+8(FP), DI
	MOVQ dst_len+16(FP), CX
	MOVQ src_base+32(FP), SI

	VPXORQ    Z10, Z10, Z10
	VMOVAPS   X0, X10
	VMOVDQU64 (SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVNTDQ  Z1, (DI)
	VMOVNTDQ  Z2, 64(DI)
	VMOVNTDQ  Z3, 128(DI)
	VMOVNTDQ  Z4, 192(DI)
	VPXORQ    Z10, Z1, Z1
	ADDQ      $256, SI
	ADDQ      $256, DI
	SUBQ      $256, CX
	JZ        ntfold4

	VMOVDQU64 k2048<>+0(SB), Z0

	PCALIGN $32
ntloop256:
	VMOVDQU64  (SI), Z11
	VMOVDQU64  64(SI), Z12
	VMOVDQU64  128(SI), Z13
	VMOVDQU64  192(SI), Z14
	VMOVNTDQ   Z11, (DI)
	VMOVNTDQ   Z12, 64(DI)
	VMOVNTDQ   Z13, 128(DI)
	VMOVNTDQ   Z14, 192(DI)
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0x11, Z0, Z2, Z6
	VPCLMULQDQ $0x11, Z0, Z3, Z7
	VPCLMULQDQ $0x11, Z0, Z4, Z8
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPCLMULQDQ $0, Z0, Z2, Z2
	VPCLMULQDQ $0, Z0, Z3, Z3
	VPCLMULQDQ $0, Z0, Z4, Z4
	VPTERNLOGD $0x96, Z11, Z5, Z1
	VPTERNLOGD $0x96, Z12, Z6, Z2
	VPTERNLOGD $0x96, Z13, Z7, Z3
	VPTERNLOGD $0x96, Z14, Z8, Z4
	ADDQ       $256, SI
	ADDQ       $256, DI
	SUBQ       $256, CX
	JNZ        ntloop256

ntfold4:
	SFENCE
	VMOVDQU64  k512<>+0(SB), Z0
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z2, Z5, Z1
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z3, Z5, Z1
	VPCLMULQDQ $0x11, Z0, Z1, Z5
	VPCLMULQDQ $0, Z0, Z1, Z1
	VPTERNLOGD $0x96, Z4, Z5, Z1

	LANES
	FINISH

	PEXTRD $1, X1, AX
	MOVL   AX, ret+56(FP)
	RET
