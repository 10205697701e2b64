// Asynchronous copies to shared memory and warp-wide matrix loads from it (sm_80 and newer), one PTX
// instruction each: the operand path of a multistage tensor-core pipeline.
//
//   cp_async_cg_16(smem, gmem, src_bytes)  cp.async.cg.shared.global, 16 bytes: copies src_bytes (0..16) bytes
//                                          from gmem and fills the rest of the 16 with zeros (src_bytes 0: a
//                                          zero row, for padding, and gmem is not read).  Both addresses must be
//                                          16-byte aligned.  The data is in smem only after the wait below.
//   cp_async_ca_8(smem, gmem, src_bytes)   cp.async.ca.shared.global of 8 or 4 bytes (through L1: .cg takes 16
//   cp_async_ca_4(smem, gmem, src_bytes)   only): the same rules at their size (src_bytes 0..8 or 0..4, both
//                                          addresses aligned to it).  A gather of single floats (simt_gemm.cu)
//                                          goes global -> shared without a register, a store or a zeroing.
//   cp_async_commit()                      cp.async.commit_group: the thread's copies since the last commit form
//                                          one group.
//   cp_async_wait<N>()                     cp.async.wait_group N: waits until at most N of the thread's committed
//                                          groups (the most recent ones) are still in flight.  The other threads'
//                                          copies are theirs: a __syncthreads() after the wait makes every
//                                          thread's landed data visible to the block.
//   ldmatrix_x4(r, row) / ldmatrix_x2(r, row) / ldmatrix_x4_trans(r, row)
//                                          ldmatrix.sync.aligned.m8n8.{x4,x2}{,.trans}.shared.b16: all 32 lanes
//                                          call it together.  Lane 8 j + i gives the address of row i of 8 x 8
//                                          matrix j (16 bytes, 16-byte aligned; .x2 reads the addresses of lanes
//                                          0-15 only); lane l receives in r[j] the elements (l / 4, 2 (l % 4))
//                                          and (l / 4, 2 (l % 4) + 1) of matrix j, the lower column in the low
//                                          half, which is the mma.sync fragment layout of mma.cuh.  With .trans
//                                          it receives (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4): the
//                                          fragment of the transposed matrix.
//
// The CPU emulator (tests/emulator/include/emu_async_copy.h) runs these with the hardware's rules: a copy lands
// at the wait that retires its group (its destination holds poison until then), reading a destination still in
// flight with ldmatrix, a misaligned address or a partial warp fails the launch.
#pragma once

#ifdef __CUPYCONV_EMULATOR__
#include <emu_async_copy.h>  // tests/emulator/include: angle brackets, so kernel_source() does not inline it
#define CUPYCONV_HAS_CP_ASYNC 1  // the emulator runs a kernel's sm_80 path
#else

// cp.async is sm_80's and ldmatrix sm_75's; older targets compile a trap so that the NVRTC check can still build
// every file that includes this for them (the planner never launches such kernels there).
#if __CUDA_ARCH__ >= 800
#define CUPYCONV_ASYNC_COPY 1
#endif
// Whether these copies run (sm_80 and newer), for a kernel that keeps a register-staged path for older targets.
#define CUPYCONV_HAS_CP_ASYNC (__CUDA_ARCH__ >= 800)

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async_cg_16(void* smem, const void* gmem, int src_bytes) {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_ca_8(void* smem, const void* gmem, int src_bytes) {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_ca_4(void* smem, const void* gmem, int src_bytes) {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(shared_address(smem)), "l"(gmem),
               "r"(src_bytes)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("cp.async.commit_group;" ::: "memory");
#else
  __trap();
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* row) {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row))
               : "memory");
#else
  r[0] = r[1] = 0;
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
#ifdef CUPYCONV_ASYNC_COPY
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row))
               : "memory");
#else
  r[0] = r[1] = r[2] = r[3] = 0;
  __trap();
#endif
}

#undef CUPYCONV_ASYNC_COPY
#endif  // __CUPYCONV_EMULATOR__
