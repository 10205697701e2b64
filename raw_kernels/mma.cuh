// Warp-level matrix multiply-accumulate on the tensor cores (sm_80 and newer): one PTX mma.sync each.
//
//   mma_m16n8k16<T>(d, a, b)   T = __half or __nv_bfloat16:  D (16 x 8, f32) += A (16 x 16) * B (16 x 8)
//   mma_m16n8k8_tf32(d, a, b)  tf32 operands:                D (16 x 8, f32) += A (16 x 8) * B (8 x 8)
//
// All 32 lanes of the warp call it together (.sync.aligned), each with its fragments in the PTX ISA's
// documented layout; with g = lane / 4 and q = lane % 4:
//   m16n8k16  a[0] = A[g][2q | 2q+1]    a[1] = A[g+8][2q | 2q+1]    (two 16-bit values per register,
//             a[2] = A[g][2q+8 | 2q+9]  a[3] = A[g+8][2q+8 | 2q+9]   the lower column in the low half)
//             b[0] = B[2q | 2q+1][g]    b[1] = B[2q+8 | 2q+9][g]
//   m16n8k8   a[0] = A[g][q]  a[1] = A[g+8][q]  a[2] = A[g][q+4]  a[3] = A[g+8][q+4]   (tf32 bit patterns)
//             b[0] = B[q][g]  b[1] = B[q+4][g]
//   D (both)  d[0] = D[g][2q]  d[1] = D[g][2q+1]  d[2] = D[g+8][2q]  d[3] = D[g+8][2q+1]
// pack2 builds a 16-bit pair register; to_tf32 rounds a float to tf32 (cvt.rna, as cuBLAS's TF32 mode does):
// the tensor cores would otherwise just drop the 13 low mantissa bits.
//
// Numerics: D accumulates in float, but not as IEEE float additions: the tensor cores form the products exactly
// and add them (and C) in a fixed-width adder that aligns the terms to the largest and truncates the bits below
// about float's precision, so results may differ from a sum rounded once in the last bits (more where terms
// cancel); the kernels' tests on a GPU compare with tolerances.
//
// The CPU emulator (tests/emulator) defines these functions as warp collectives with the same layouts, the same
// operand rounding, exact products and one rounding of the sum (tests/emulator/include/emu_mma.h): a kernel that
// assumes any other fragment layout computes wrong results there; its last bits are the idealised sum's, not
// the hardware's.
#pragma once
#include "common.cuh"

#ifdef __CUPYCONV_EMULATOR__
#include <emu_mma.h>  // tests/emulator/include: angle brackets, so kernel_source() does not inline it
#else

template <typename T> __device__ __forceinline__ unsigned pack2(T lo, T hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(__half lo, __half hi) {
  return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return (unsigned)__bfloat16_as_ushort(lo) | ((unsigned)__bfloat16_as_ushort(hi) << 16);
}

// The tensor-core instructions exist from sm_80 on; the planner launches these kernels only there, and older
// targets compile a trap so that the NVRTC check can still build every file for them.
__device__ __forceinline__ unsigned to_tf32(float x) {
#if __CUDA_ARCH__ >= 800
  unsigned bits;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(x));
  return bits;
#else
  __trap();
  return 0;
#endif
}

// The one instruction the three wrappers issue, D (f32) += A (row-major) * B (column-major); a trap below sm_80.
#if __CUDA_ARCH__ >= 800
#define CUPYCONV_MMA_SYNC(shape, type)                                                                            \
  asm volatile("mma.sync.aligned." shape ".row.col.f32." type "." type ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
               "{%8, %9}, {%0, %1, %2, %3};"                                                                      \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                   \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#else
#define CUPYCONV_MMA_SYNC(shape, type) __trap()
#endif

template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  CUPYCONV_MMA_SYNC("m16n8k16", "f16");
}
template <>
__device__ __forceinline__ void mma_m16n8k16<__nv_bfloat16>(float (&d)[4], const unsigned (&a)[4],
                                                            const unsigned (&b)[2]) {
  CUPYCONV_MMA_SYNC("m16n8k16", "bf16");
}
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  CUPYCONV_MMA_SYNC("m16n8k8", "tf32");
}
#undef CUPYCONV_MMA_SYNC

#endif  // __CUPYCONV_EMULATOR__

// Two neighbouring elements of T as one shared-memory store (4 bytes of 16-bit, 8 of float): an accumulator pair
// of a thread (columns 2 q, 2 q + 1 of an mma fragment, of wgmma's too) staged for an epilogue.
template <typename T> __device__ __forceinline__ void store_pair(unsigned char* at, float lo, float hi) {
  *reinterpret_cast<unsigned*>(at) = pack2<T>(from_acc<T>(lo), from_acc<T>(hi));
}
template <> __device__ __forceinline__ void store_pair<float>(unsigned char* at, float lo, float hi) {
  *reinterpret_cast<float2*>(at) = make_float2(lo, hi);
}
