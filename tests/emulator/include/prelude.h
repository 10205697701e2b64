// CUDA built-ins for the CPU kernel emulator: force-included (g++ -include prelude.h) before an unmodified
// raw_kernels/ file.  The fiber engine that runs the threads lives in emu_runtime.h.
#pragma once

// Standard headers come first: libstdc++ spells attributes such as __noinline__ that the CUDA keyword macros
// below redefine, so no standard header may be included after them.
#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <type_traits>
#include <utility>
// ... and the system headers of the engine (emu_runtime.h): glibc's <sys/cdefs.h> spells __noinline__ too.
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <ucontext.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define __CUPYCONV_EMULATOR__ 1

// Function and variable qualifiers: everything is ordinary host code here.
#define __global__
#define __device__
#define __host__
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

// Shared memory.  All the threads of a block are fibers of one OS thread and blocks run one after another, so
// a thread_local variable is exactly "one instance per block".  thread_local is also the one storage class
// that is valid both alone (`__shared__ float tile[256];`, a block-scope static) and after `extern`
// (`extern __shared__ float smem[];`, whose definition the emulator generates in a second translation unit
// and aliases to its dynamic shared buffer).  The engine finds every shared variable as this library's TLS
// block and fills it with 0xFF before each block.
#define __shared__ thread_local

// ---------------------------------------------------------------------------------------------------------
// Built-in variables.  Plain globals, not macros (macros would collide with any CUDA header that names them):
// the engine sets threadIdx before it switches to a thread's fiber, so each fiber sees its own.
struct uint3 { unsigned int x, y, z; };
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
static uint3 threadIdx;
static uint3 blockIdx;
static dim3 blockDim;
static dim3 gridDim;
static constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------------------
// Synchronisation.  A barrier is identified by the file and line of its call (default arguments evaluated at
// the call site), never by a return address, which differs between inlined copies of one __syncthreads().
namespace emu {
void syncthreads(const char* file, int line);
void warp_exchange(const char* file, int line, int kind, unsigned mask, unsigned long long value, int src_lane,
                   unsigned long long* result);
enum { WARP_SYNC = 0, WARP_SHFL = 1, WARP_BALLOT = 2, WARP_MMA = 3, WARP_GROUP = 4 };  // WARP_GROUP: 128 threads
int lane_id();
}  // namespace emu

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::syncthreads(file, line);
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  emu::warp_exchange(file, line, emu::WARP_SYNC, mask, 0, emu::lane_id(), nullptr);
}
// Integer intrinsics.
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }

namespace emu {
void threadfence();  // emu_runtime.h: the rule of fences and publishing atomics
void publishing_atomic(const void* address, const char* file, int line);
}  // namespace emu
inline void __threadfence() { emu::threadfence(); }
inline void __threadfence_block() {}

// Warp shuffles and votes: exchange points among the fibers of one warp (32 consecutive threads of the block).
// Each thread posts its value and the lane it reads; the engine hands out the results once every lane named
// in `mask` has arrived at the same call.  A source lane outside the mask reads all-ones bits (poison).
namespace emu {
template <typename T> T shuffle(const char* file, int line, unsigned mask, T var, int src_lane) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of an unsupported type");
  unsigned long long bits = 0, result = 0;
  std::memcpy(&bits, &var, sizeof(T));
  warp_exchange(file, line, WARP_SHFL, mask, bits, src_lane, &result);
  T out;
  std::memcpy(&out, &result, sizeof(T));
  return out;
}
inline int segment_base(int width) { return lane_id() / width * width; }
}  // namespace emu

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
              int line = __builtin_LINE()) {
  return emu::shuffle(file, line, mask, var, emu::segment_base(width) + ((src_lane % width) + width) % width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int lane = emu::lane_id();
  const int src = lane % width + (int)delta < width ? lane + (int)delta : lane;
  return emu::shuffle(file, line, mask, var, src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  const int lane = emu::lane_id();
  const int src = lane % width >= (int)delta ? lane - (int)delta : lane;
  return emu::shuffle(file, line, mask, var, src);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const int lane = emu::lane_id();
  const int src = lane ^ lane_mask;
  return emu::shuffle(file, line, mask, var, src < emu::segment_base(width) + width ? src : lane);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  unsigned long long result = 0;
  emu::warp_exchange(file, line, emu::WARP_BALLOT, mask, predicate != 0, emu::lane_id(), &result);
  return (unsigned)result;
}
inline int __any_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  return __ballot_sync(mask, predicate, file, line) != 0;
}
inline int __all_sync(unsigned mask, int predicate, const char* file = __builtin_FILE(),
                      int line = __builtin_LINE()) {
  // Every participating lane voted true exactly when the ballot of the negated predicate is empty.
  return __ballot_sync(mask, !predicate, file, line) == 0;
}

// ---------------------------------------------------------------------------------------------------------
// Clocks.  On a GPU clock64() reads the SM's cycle counter.  Here the SM runs at an emulated 1 GHz
// (EMULATED_CLOCK_HZ, tests/emulator/_device.py): clock64() is the host's monotonic clock in nanoseconds, so a
// kernel that spins for N cycles (raw_kernels/timing.cu) spins for N ns of wall time.
inline long long clock64() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

// ---------------------------------------------------------------------------------------------------------
// Atomics: fibers never preempt each other, so a plain read-modify-write is atomic.
template <typename T> inline T emu_atomic_add(T* address, T value) { T old = *address; *address = old + value; return old; }
// An integer atomicAdd after a barrier publishes the block's work: emu::publishing_atomic checks the fences.
inline int atomicAdd(int* a, int v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::publishing_atomic(a, file, line);
  return emu_atomic_add(a, v);
}
inline unsigned int atomicAdd(unsigned int* a, unsigned int v, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  emu::publishing_atomic(a, file, line);
  return emu_atomic_add(a, v);
}
inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) { return emu_atomic_add(a, v); }
inline float atomicAdd(float* a, float v) { return emu_atomic_add(a, v); }
inline double atomicAdd(double* a, double v) { return emu_atomic_add(a, v); }
template <typename T> inline T atomicExch(T* a, T v) { T old = *a; *a = v; return old; }
template <typename T> inline T atomicCAS(T* a, T compare, T v) { T old = *a; if (old == compare) *a = v; return old; }
template <typename T> inline T atomicMax(T* a, T v) { T old = *a; if (v > old) *a = v; return old; }
template <typename T> inline T atomicMin(T* a, T v) { T old = *a; if (v < old) *a = v; return old; }

// ---------------------------------------------------------------------------------------------------------
// Loads and math.
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }  // (L2 only on a GPU: no stale L1 line)

template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  if constexpr (std::is_floating_point<C>::value) return std::fmin((C)a, (C)b);  // CUDA's min is fminf here
  else return (C)b < (C)a ? (C)b : (C)a;
}
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b) {
  typedef typename std::common_type<A, B>::type C;
  if constexpr (std::is_floating_point<C>::value) return std::fmax((C)a, (C)b);
  else return (C)a < (C)b ? (C)b : (C)a;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
// Byte n of the result is byte (s >> 4n) & 7 of the 8 bytes b:a (a the low four); CUDA's __byte_perm.
inline unsigned __byte_perm(unsigned a, unsigned b, unsigned s) {
  const unsigned long long x = (unsigned long long)b << 32 | a;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= (unsigned)(x >> 8 * ((s >> 4 * n) & 7) & 0xff) << 8 * n;
  return r;
}

// Vector types (kernels may pun global memory through them: -fno-strict-aliasing keeps that well defined).
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline double2 make_double2(double x, double y) { return double2{x, y}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
