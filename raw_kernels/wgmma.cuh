// Warpgroup matrix multiply-accumulate (wgmma, sm_90a only): the four warps of an aligned warpgroup (threads
// 128 g .. 128 g + 127 of the block) multiply a 64 x k tile of A by a k x N tile of B, k the elements of 32 bytes
// (16 of a 16-bit type, 8 of tf32), both read by the tensor cores straight from shared memory through 64-bit
// matrix descriptors, into N / 2 float accumulators a thread.
// Used by conv_fwd_wgmma (raw_kernels/wgmma_conv.cu, issue 24 item 10; docs/architecture.md, "wgmma on sm_90a").
//
//   wgmma_desc(smem, swizzle, leading_bytes, stride_bytes)
//        the descriptor of a K-major tile at smem (the PTX ISA's "matrix descriptor": start address >> 4 in
//        bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, base offset 0 in 49-51,
//        swizzle mode in 62-63).  Rows (the M rows of A, the N columns of B) are in groups of 8, `stride_bytes`
//        apart.  WGMMA_INTERLEAVE: each 8-row group holds 8 x 16-byte core matrices' rows contiguously (row r of
//        the group at 16 r), and the second 16 bytes of K (elements 8-15 of 16-bit types) are `leading_bytes`
//        after the first.  WGMMA_SWIZZLE_{32,64,128}B: row r of a group is at r W (W = 32, 64, 128), its 16-byte
//        chunk c stored at chunk c ^ ((address >> 7) & (W / 16 - 1)) of the row, the XOR taken from the
//        absolute shared address (so a group must start on a W * 8-byte boundary, plus the K offset within the
//        row: the next 32-byte k step of a 64- or 128-byte row is the same descriptor 32 bytes further);
//        `leading_bytes` is not used (one k step never leaves the row).
//   wgmma_fence()           wgmma.fence: before the first wgmma of a batch, and again after every wait below
//                           (and after any access to the accumulators outside a wgmma).
//   wgmma_fence_shared()    fence.proxy.async.shared::cta: a thread's ordinary shared stores (and its landed
//                           cp.async copies) become visible to wgmma's operand reads; then __syncthreads().
//   wgmma_step<T, N>(d, desc_a, desc_b, accumulate)
//                           one k step of 32 bytes: wgmma.mma_async m64nNk16, f32 += T x T for T = __half or
//                           __nv_bfloat16, m64nNk8 .tf32 for T = float (N = 8, 64 or 128), A and B from shared
//                           memory, both K-major (tf32 has no transposed form), no negation; accumulate = false
//                           ignores d's old values.  tf32 operands are 32-bit floats of which the tensor cores
//                           read the top 19 bits (the 13 low mantissa bits ignored, not rounded: round first, as
//                           channels_last_copy does).  Asynchronous: d is not to be read or written until the
//                           wait that retires its group, nor A's and B's shared bytes written.
//   wgmma_commit()          wgmma.commit_group: the warpgroup's wgmmas since the last commit form one group.
//   wgmma_wait<N>()         wgmma.wait_group N: waits until at most N committed groups are in flight.
//   wgmma_fence_operand(d)  keeps the compiler from moving accesses to d across the wait (an empty asm on d).
//
// All 128 threads of the warpgroup call each of these but the descriptor and the proxy fence together
// (.sync.aligned), with the same descriptors.  Accumulators (the PTX ISA's m64nN D fragment, the same for k16 and
// k8): thread t of the warpgroup, w = t / 32, g = (t % 32) / 4, q = t % 4, holds for j = 0 .. N / 8 - 1
//   d[4 j] = D[16 w + g][8 j + 2 q]        d[4 j + 1] = D[16 w + g][8 j + 2 q + 1]
//   d[4 j + 2] = D[16 w + g + 8][8 j + 2 q]  d[4 j + 3] = D[16 w + g + 8][8 j + 2 q + 1]
// (mma.sync's m16n8 layout, warp w taking rows 16 w .. 16 w + 15).
//
// Compiling: wgmma exists on sm_90a only (not sm_90, not later architectures), so a file that uses it declares
// `KernelFile(..., sm90a=True)` and CudaDevice compiles it with -arch=sm_90a on a compute capability 9.0 device
// (cupyconv/_kernels.py `KernelFile.arch_options`); everywhere else these compile to a trap.
//
// The CPU emulator (tests/emulator/include/emu_wgmma.h) runs these with the hardware's rules: a warpgroup
// collective, operands read through the descriptor and swizzle, accumulators poisoned until the wait, shared
// operands changed before it, a missing fence or proxy fence, a partial warpgroup: a failed launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

enum WgmmaSwizzle { WGMMA_INTERLEAVE = 0, WGMMA_SWIZZLE_128B = 1, WGMMA_SWIZZLE_64B = 2, WGMMA_SWIZZLE_32B = 3 };

// The descriptor's bits from a shared-window address (bytes); the byte offsets are multiples of 16 below 256 KiB.
__host__ __device__ constexpr unsigned long long wgmma_desc_bits(unsigned address, int swizzle,
                                                                 unsigned leading_bytes, unsigned stride_bytes) {
  return (unsigned long long)((address & 0x3FFFFu) >> 4) |
         (unsigned long long)((leading_bytes >> 4) & 0x3FFFu) << 16 |
         (unsigned long long)((stride_bytes >> 4) & 0x3FFFu) << 32 | (unsigned long long)(swizzle & 3) << 62;
}

// The PTX operand type of T: 0 f16, 1 bf16, 2 tf32 (the emulator's WgmmaCall::type too).
template <typename T> struct WgmmaType;
template <> struct WgmmaType<__half> { static constexpr int type = 0; };
template <> struct WgmmaType<__nv_bfloat16> { static constexpr int type = 1; };
template <> struct WgmmaType<float> { static constexpr int type = 2; };

#ifdef __CUPYCONV_EMULATOR__
#include <emu_wgmma.h>  // tests/emulator/include: angle brackets, so kernel_source() does not inline it
#else

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CUPYCONV_WGMMA 1
#endif

__device__ __forceinline__ unsigned long long wgmma_desc(const void* smem, int swizzle, unsigned leading_bytes,
                                                         unsigned stride_bytes) {
  return wgmma_desc_bits((unsigned)__cvta_generic_to_shared(smem), swizzle, leading_bytes, stride_bytes);
}

__device__ __forceinline__ void wgmma_fence() {
#ifdef CUPYCONV_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_fence_shared() {
#ifdef CUPYCONV_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#ifdef CUPYCONV_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
  __trap();
#endif
}

template <int N> __device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0 .. 7");
#ifdef CUPYCONV_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

template <int R> __device__ __forceinline__ void wgmma_fence_operand(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One wgmma.mma_async m64n<N><k> of `type` ("f16", "bf16": k = "k16", trans = ", 0, 0"; "tf32": "k8", ""), D (f32)
// = A * B + (accumulate ? D : 0); scale-d is a predicate, the immediates are scale-a = scale-b = 1 and, for the
// 16-bit types, trans-a = trans-b = 0 (K-major; the tf32 form takes no transpose immediates).
#define CUPYCONV_WGMMA_N8(k, type, trans) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n8" k ".f32." type "." type " {" \
               "%0, %1, %2, %3" \
               "}, %4, %5, p, 1, 1" trans ";\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) \
               : "l"(desc_a), "l"(desc_b), "r"((int)accumulate))

#define CUPYCONV_WGMMA_N64(k, type, trans) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64" k ".f32." type "." type " {" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
               "}, %32, %33, p, 1, 1" trans ";\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
                 "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
                 "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "l"(desc_a), "l"(desc_b), "r"((int)accumulate))

#define CUPYCONV_WGMMA_N128(k, type, trans) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128" k ".f32." type "." type " {" \
               "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
               "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
               "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
               "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" \
               "}, %64, %65, p, 1, 1" trans ";\n}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
                 "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
                 "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
                 "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
                 "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
                 "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), \
                 "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), \
                 "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
                 "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
                 "+f"(d[63]) \
               : "l"(desc_a), "l"(desc_b), "r"((int)accumulate))

#define CUPYCONV_WGMMA_TYPES(SHAPE) \
  if constexpr (WgmmaType<T>::type == 0) SHAPE("k16", "f16", ", 0, 0"); \
  else if constexpr (WgmmaType<T>::type == 1) SHAPE("k16", "bf16", ", 0, 0"); \
  else SHAPE("k8", "tf32", "")

template <typename T, int N>
__device__ __forceinline__ void wgmma_step(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b,
                                           bool accumulate) {
  static_assert(N == 8 || N == 64 || N == 128, "wgmma_step is written out for N = 8, 64 and 128");
#ifdef CUPYCONV_WGMMA
  if constexpr (N == 8) {
    CUPYCONV_WGMMA_TYPES(CUPYCONV_WGMMA_N8);
  } else if constexpr (N == 64) {
    CUPYCONV_WGMMA_TYPES(CUPYCONV_WGMMA_N64);
  } else {
    CUPYCONV_WGMMA_TYPES(CUPYCONV_WGMMA_N128);
  }
#else
  (void)d, (void)desc_a, (void)desc_b, (void)accumulate;
  __trap();
#endif
}
#undef CUPYCONV_WGMMA_TYPES
#undef CUPYCONV_WGMMA_N8
#undef CUPYCONV_WGMMA_N64
#undef CUPYCONV_WGMMA_N128

#endif  // __CUPYCONV_EMULATOR__
