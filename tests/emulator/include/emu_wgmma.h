// Stand-in for raw_kernels/wgmma.cuh in the CPU emulator: wgmma as warpgroup collectives with the hardware's
// rules as the PTX ISA states them (sections "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": the
// matrix descriptor, the shared-memory layouts and swizzles, the m64nNk16 and tf32 m64nNk8 accumulator fragment,
// wgmma.fence, commit_group, wait_group, and the async proxy).
//
// Every call but wgmma_desc and wgmma_fence_shared is a collective of the aligned warpgroup (threads 128 g ..
// 128 g + 127 of the block): all 128 must reach the same call (file:line) or the block deadlocks and the launch
// fails; a block whose last warpgroup has fewer than 128 threads fails at its first such call.  The engine
// (emu_runtime.h, wgmma_collective) then, with all 128 threads' arguments in hand:
// - wgmma_fence: lets the warpgroup issue wgmmas until its next wait_group (stricter than the ISA, which asks
//   for the fence again only where a thread touched the registers: the emulator cannot see register accesses).
// - wgmma_step: fails unless the warpgroup fenced, every thread gave the same descriptors, shape and scale-d,
//   and every thread of the block ran wgmma_fence_shared() since the barrier before the last one (the emulator
//   does not see shared stores, so it takes every thread for a writer, like __threadfence in emu_runtime.h) and
//   after its last cp.async landing (cp_async_wait: the copies are generic-proxy writes too).
//   A and B are read through the descriptors (emu_runtime.h, wgmma_row_chunk: interleaved core matrices or the
//   32/64/128-byte swizzles, the XOR taken from the shared-window address, counted here from the block's shared
//   memory rounded down to 1024 bytes so that a variable's alignment keeps the pattern); a byte a cp.async still
//   has in flight, a swizzled start off its pattern, a nonzero base offset or a read outside shared memory fails.
//   A k step is 32 bytes of each row: 16 elements of a 16-bit type, 8 of tf32, which are read as the tensor cores
//   read them (a float's 13 low mantissa bits ignored: emu_runtime.h tf32_operand, mma.sync's reading too).
//   The product is formed then (exact products, summed with C in double, rounded to float once per instruction:
//   emu_mma.h's idealisation), the read bytes are kept, and each thread's accumulators are poisoned (all bits
//   set: NaN) until the wait.
// - wgmma_commit: closes the warpgroup's open group.  wgmma_wait<N>: retires the groups older than the N most
//   recent: fails if a shared byte a retiring wgmma read has changed since, or if a thread wrote its accumulators
//   while they were in flight; then hands each thread its D (unless a younger wgmma still in flight writes the
//   same registers: they stay poisoned).  A block that ends with a wgmma in flight fails.
// Not modelled: transposed (MN-major) operands, A from registers, scale-a/b = -1, fp8/integer types, a
// nonzero matrix base offset, and the memory counters of the profile build (wgmma's reads are not counted).
#pragma once

#include "emu_wgmma_call.h"

inline unsigned long long wgmma_desc(const void* smem, int swizzle, unsigned leading_bytes, unsigned stride_bytes) {
  return wgmma_desc_bits(emu::shared_window_address(smem), swizzle, leading_bytes, stride_bytes);
}

inline void wgmma_fence(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const emu::WgmmaCall call{emu::WGMMA_FENCE, 0, 0, 0, 0, nullptr, 0, 0};
  emu::warpgroup_call(file, line, &call);
}

inline void wgmma_fence_shared() { emu::proxy_fence(); }

inline void wgmma_commit(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  const emu::WgmmaCall call{emu::WGMMA_COMMIT, 0, 0, 0, 0, nullptr, 0, 0};
  emu::warpgroup_call(file, line, &call);
}

template <int N> inline void wgmma_wait(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0 .. 7");
  const emu::WgmmaCall call{emu::WGMMA_WAIT, 0, 0, 0, 0, nullptr, 0, N};
  emu::warpgroup_call(file, line, &call);
}

template <int R> inline void wgmma_fence_operand(float (&)[R]) {}

template <typename T, int N>
inline void wgmma_step(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b, bool accumulate,
                       const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  static_assert(N == 8 || N == 64 || N == 128, "wgmma_step is written out for N = 8, 64 and 128");
  const emu::WgmmaCall call{emu::WGMMA_MMA, N, WgmmaType<T>::type, desc_a, desc_b, d, accumulate ? 1 : 0, 0};
  emu::warpgroup_call(file, line, &call);
}
