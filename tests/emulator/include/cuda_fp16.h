// Stand-in for CUDA's cuda_fp16.h in the CPU emulator: __half as a 2-byte, trivially copyable struct.
// Conversions go through g++'s _Float16, which rounds to binary16 to nearest even (subnormals included),
// like the hardware's cvt.rn.f16.f32.
#pragma once
#include "emu_half_ops.h"

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(from(f)) {}
  __half(double d) : __x(from(d)) {}
  __half(int v) : __x(from(v)) {}
  __half(unsigned int v) : __x(from(v)) {}
  __half(long long v) : __x(from(v)) {}
  __half(unsigned long long v) : __x(from(v)) {}
  __half(long v) : __x(from(v)) {}
  __half(unsigned long v) : __x(from(v)) {}
  __half(short v) : __x(from(v)) {}
  __half(unsigned short v) : __x(from(v)) {}
  operator float() const {
    const unsigned short bits = __x;  // a load the profile build sees (it does not see memcpy)
    _Float16 h;
    std::memcpy(&h, &bits, 2);
    return (float)h;
  }

 private:
  template <typename V> static unsigned short from(V v) {
    _Float16 h = (_Float16)v;  // one rounding, straight from the source type (no detour through float)
    unsigned short bits;
    std::memcpy(&bits, &h, 2);
    return bits;
  }
};
typedef __half half;
static_assert(sizeof(__half) == 2 && std::is_trivially_copyable<__half>::value, "__half must be 2 plain bytes");

EMU_HALF_OPERATORS(__half)

inline float __half2float(__half h) { return (float)h; }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __double2half(double d) { return __half(d); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hfma(__half a, __half b, __half c) { return __half(std::fma((float)a, (float)b, (float)c)); }
