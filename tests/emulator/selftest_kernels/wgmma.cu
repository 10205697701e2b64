// Self-test kernel of raw_kernels/wgmma.cuh (tests/test_wgmma.py): C (64 x N, float) = A (64 x K) B (N x K)^T
// through shared memory in one of the descriptor layouts, on the emulator, and compiled by NVRTC for sm_90a (its
// SASS must hold HGMMA).  It uses wgmma correctly unless `bug` asks it to break one rule.  Each warpgroup of the
// block computes the same C into its own 64 x N slice of c.  With the bug branches, which are divergent, ptxas
// says it injects warpgroup.arrive and serialises the wgmmas (infos C7519, C7520); -DWGMMA_SELFTEST_CLEAN
// compiles the correct path alone, which it leaves as written (tests/test_wgmma.py checks both logs).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "../../../raw_kernels/async_copy.cuh"
#include "../../../raw_kernels/wgmma.cuh"

enum Bug {
  CORRECT = 0,
  NO_FENCE = 1,             // the first wgmma without wgmma.fence
  NO_FENCE_AFTER_WAIT = 2,  // the wgmmas after the first wait without a new fence
  WAIT_TOO_FEW = 3,         // wgmma.wait_group 1 at the end: the last k step is still in flight
  WRITE_OPERAND = 4,        // thread 0 changes a byte of the last k step's A before the wait
  WRITE_ACCUMULATOR = 5,    // each thread writes d[0] while the wgmmas are in flight
  NO_PROXY_FENCE = 6,       // thread 7 skips fence.proxy.async after its shared stores
  OTHER_DESCRIPTOR = 7,     // thread 5 gives the first wgmma another k step's A descriptor
  PARTIAL = 8,              // the last warp of each warpgroup skips the first wgmma.fence
  READ_EARLY = 9,           // stores d before the last wait (then waits): poison in c
  OFF_PATTERN = 10,         // a swizzled A descriptor 128 bytes into its pattern
  CP_ASYNC = 11,            // thread 0 has a cp.async into A's first row in flight at the first wgmma
  READ_AFTER_WAIT_ONE = 12, // stores d after wgmma.wait_group 1 (the last k step, on the same d, still in flight)
  FENCE_BEFORE_LANDING = 13,  // thread 0 copies A's first row again, fences, and only then waits for the copy
};

constexpr int kMaxSteps = 4;  // k steps of 32 bytes (16 elements of a 16-bit type, 8 of tf32)

// Byte offset of the element at byte kb of K of row `row` of a K-major operand of `rows` rows in its shared region
// (1024-byte aligned), and the descriptor of k step s.  WGMMA_INTERLEAVE: 8 x 16-byte core matrices, k step after k
// step; A (`by_group` false) puts a step's two 16-byte K halves `rows` x 16 bytes apart (leading 16 rows, stride
// 128), B (true) each 8-row group's two halves side by side (leading 128, stride 256).  Swizzles of W bytes: rows of
// W bytes of K, 8-row groups 8 W apart (stride), K beyond W bytes in the next `rows` x W bytes; the 16-byte chunk of
// a row XORed with bits 7.. of the address as the pattern has it.
__device__ int tile_offset(int row, int kb, int rows, int swizzle, bool by_group) {
  if (swizzle == WGMMA_INTERLEAVE) {
    const int step = kb / 32, half = kb % 32 / 16;
    const int core = by_group ? (row / 8) * 2 + half : half * (rows / 8) + row / 8;
    return step * rows * 32 + core * 128 + (row % 8) * 16 + kb % 16;
  }
  const int width = swizzle == WGMMA_SWIZZLE_128B ? 128 : swizzle == WGMMA_SWIZZLE_64B ? 64 : 32;
  const int logical = (kb / width) * rows * width + row * width + kb % width;
  return logical ^ ((logical >> 7 & (width / 16 - 1)) << 4);
}

__device__ unsigned long long tile_desc(const unsigned char* region, int step, int rows, int swizzle, bool by_group) {
  if (swizzle == WGMMA_INTERLEAVE)
    return wgmma_desc(region + step * rows * 32, swizzle, by_group ? 128 : rows * 16, by_group ? 256 : 128);
  const int width = swizzle == WGMMA_SWIZZLE_128B ? 128 : swizzle == WGMMA_SWIZZLE_64B ? 64 : 32;
  const int kb = 32 * step;
  return wgmma_desc(region + (kb / width) * rows * width + kb % width, swizzle, 16, 8 * width);
}

template <typename T, int N>
__global__ void wgmma_gemm(const T* a, const T* b, float* c, int steps, int swizzle, int bug) {
  __shared__ __align__(1024) unsigned char a_tile[kMaxSteps * 64 * 32];
  __shared__ __align__(1024) unsigned char b_tile[kMaxSteps * N * 32];
#ifdef WGMMA_SELFTEST_CLEAN
  bug = CORRECT;  // no bug branches: ptxas then has no divergent path to inject warpgroup.arrive into
#endif
  constexpr int E = (int)sizeof(T);  // bytes an element
  const int tid = threadIdx.x, threads = blockDim.x, K = 32 / E * steps;
  for (int i = tid; i < 64 * K; i += threads)
    *(T*)(a_tile + tile_offset(i / K, i % K * E, 64, swizzle, false)) = a[i];
  for (int i = tid; i < N * K; i += threads)
    *(T*)(b_tile + tile_offset(i / K, i % K * E, N, swizzle, true)) = b[i];
  if (bug == FENCE_BEFORE_LANDING && tid == 0) {
    cp_async_cg_16(a_tile + tile_offset(0, 0, 64, swizzle, false), a, 16);
    cp_async_commit();
  }
  if (!(bug == NO_PROXY_FENCE && tid == 7)) wgmma_fence_shared();
  if (bug == FENCE_BEFORE_LANDING && tid == 0) cp_async_wait<0>();
  __syncthreads();
  if (bug == CP_ASYNC && tid == 0) {
    cp_async_cg_16(a_tile + tile_offset(0, 0, 64, swizzle, false), a, 16);
    cp_async_commit();
  }

  const int t = tid % 128, w = t / 32, g = t % 32 / 4, q = t % 4;
  float d[N / 2];
  auto desc_a = [&](int s) {
    return tile_desc(a_tile, s, 64, swizzle, false) + (bug == OFF_PATTERN && swizzle != WGMMA_INTERLEAVE ? 8 : 0);
  };
  auto store = [&]() {
    float* out = c + (long long)(tid / 128) * 64 * N;
    for (int reg = 0; reg < N / 2; ++reg)
      out[(16 * w + g + 8 * (reg >> 1 & 1)) * N + 8 * (reg / 4) + 2 * q + (reg & 1)] = d[reg];
  };
  const bool partial = bug == PARTIAL && w == 3;
  if (bug != NO_FENCE && !partial) wgmma_fence();
  wgmma_step<T, N>(d, bug == OTHER_DESCRIPTOR && t == 5 ? desc_a(steps - 1) : desc_a(0),
                     tile_desc(b_tile, 0, N, swizzle, true), false);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(d);
  if (bug != NO_FENCE_AFTER_WAIT) wgmma_fence();
  for (int s = 1; s < steps; ++s) {  // one group each, chained on d
    wgmma_step<T, N>(d, desc_a(s), tile_desc(b_tile, s, N, swizzle, true), true);
    wgmma_commit();
  }
  if (bug == WRITE_OPERAND && tid == 0) a_tile[tile_offset(0, (K - 1) * E, 64, swizzle, false)] ^= 1;
  if (bug == WRITE_ACCUMULATOR) d[0] = 0.f;
  if (bug == READ_EARLY) store();
  if (bug == READ_AFTER_WAIT_ONE) {
    wgmma_wait<1>();
    store();
  }
  if (bug == WAIT_TOO_FEW) wgmma_wait<1>(); else wgmma_wait<0>();
  wgmma_fence_operand(d);
  if (bug != READ_EARLY && bug != READ_AFTER_WAIT_ONE) store();
}
