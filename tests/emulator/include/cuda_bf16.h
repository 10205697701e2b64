// Stand-in for CUDA's cuda_bf16.h in the CPU emulator: __nv_bfloat16 as a 2-byte, trivially copyable struct.
// float -> bfloat16 rounds to nearest even on the bits (as cvt.rn.bf16.f32 does); NaN becomes 0x7FFF.
#pragma once
#include "cuda_fp16.h"

namespace emu {
inline unsigned short float_to_bf16_bits(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN: canonical quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                       // round half to even on the 16 dropped bits
  return (unsigned short)(u >> 16);
}
// double -> bfloat16 in one rounding: first to float rounding to odd (inexact results get the last bit set),
// which float's 24 significand bits make innocuous for the final round to bfloat16's 8.
inline unsigned short double_to_bf16_bits(double d) {
  if (d != d) return 0x7fffu;
  float f = (float)d;
  if ((double)f != d) {
    if (std::fabs((double)f) > std::fabs(d)) f = std::nextafter(f, 0.0f);
    unsigned int u;
    std::memcpy(&u, &f, 4);
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return float_to_bf16_bits(f);
}
}  // namespace emu

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(emu::float_to_bf16_bits(f)) {}
  __nv_bfloat16(double d) : __x(emu::double_to_bf16_bits(d)) {}
  __nv_bfloat16(int v) : __x(emu::double_to_bf16_bits(v)) {}
  __nv_bfloat16(unsigned int v) : __x(emu::double_to_bf16_bits(v)) {}
  __nv_bfloat16(long long v) : __x(emu::double_to_bf16_bits((double)v)) {}
  __nv_bfloat16(unsigned long long v) : __x(emu::double_to_bf16_bits((double)v)) {}
  __nv_bfloat16(long v) : __x(emu::double_to_bf16_bits((double)v)) {}
  __nv_bfloat16(unsigned long v) : __x(emu::double_to_bf16_bits((double)v)) {}
  __nv_bfloat16(short v) : __x(emu::double_to_bf16_bits(v)) {}
  __nv_bfloat16(unsigned short v) : __x(emu::double_to_bf16_bits(v)) {}
  operator float() const {
    unsigned int u = (unsigned int)__x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
typedef __nv_bfloat16 nv_bfloat16;
static_assert(sizeof(__nv_bfloat16) == 2 && std::is_trivially_copyable<__nv_bfloat16>::value,
              "__nv_bfloat16 must be 2 plain bytes");

EMU_HALF_OPERATORS(__nv_bfloat16)

inline float __bfloat162float(__nv_bfloat16 h) { return (float)h; }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __double2bfloat16(double d) { return __nv_bfloat16(d); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }
