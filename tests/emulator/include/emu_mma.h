// Stand-in for raw_kernels/mma.cuh in the CPU emulator: the tensor-core functions as warp collectives.
//
// Each lane posts its fragments; when all 32 lanes of the warp have reached the same call (file:line), the
// engine (emu_runtime.h, warp_mma) assembles A, B and C from the fragments in the PTX ISA's documented layouts
// (mma.cuh lists them), computes D = A * B + C and hands every lane its part of D.  So a kernel that puts an
// element in any other register, or that lets only some lanes reach the call, fails its tests here as it
// would on the GPU.  Numerics: the operands are read as the hardware reads them (tf32 ignoring the 13 low
// mantissa bits: without to_tf32 a float is truncated, not rounded), their products are exact, and the sum of
// the products and C is carried in double and rounded to float once.  That is an idealisation, not the
// hardware's adder: the tensor cores add in a fixed-width, non-IEEE adder (published measurements: the terms
// aligned to the largest exponent, bits below about float's precision truncated, normalised once per block of
// products), so a GPU's result may differ from this one in the last bits of a float, more where terms cancel.
// Tests that demand bit equality with a once-rounded float64 result hold here by construction; on a GPU they
// hold only for data whose sums the narrower adder still holds exactly (tests/bug_classes.py `exact_terms`).
#pragma once
#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace emu {
enum MmaShape { MMA_M16N8K16_F16 = 1, MMA_M16N8K16_BF16 = 2, MMA_M16N8K8_TF32 = 3 };
struct MmaOperands {
  int shape;
  const unsigned* a;  // 4 registers
  const unsigned* b;  // 2 registers
  float* d;           // 4 accumulators, read as C and overwritten with D
};
void warp_mma(const char* file, int line, const MmaOperands* operands);

template <typename T> struct MmaShapeOf;
template <> struct MmaShapeOf<__half> { static constexpr int value = MMA_M16N8K16_F16; };
template <> struct MmaShapeOf<__nv_bfloat16> { static constexpr int value = MMA_M16N8K16_BF16; };
}  // namespace emu

template <typename T> inline unsigned pack2(T lo, T hi) {
  static_assert(sizeof(T) == 2, "pack2 packs 16-bit values");
  unsigned short l, h;
  std::memcpy(&l, &lo, 2);
  std::memcpy(&h, &hi, 2);
  return (unsigned)l | ((unsigned)h << 16);
}

// cvt.rna.tf32.f32: round to the nearest tf32 (10 mantissa bits), ties away from zero; NaN and Inf unchanged.
inline unsigned to_tf32(float x) {
  unsigned bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u) return bits;
  return (bits + 0x1000u) & ~0x1fffu;
}

template <typename T>
inline void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const emu::MmaOperands operands{emu::MmaShapeOf<T>::value, a, b, d};
  emu::warp_mma(file, line, &operands);
}

inline void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                             const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const emu::MmaOperands operands{emu::MMA_M16N8K8_TF32, a, b, d};
  emu::warp_mma(file, line, &operands);
}
