// Shared by every kernel file: element and accumulator types, conversions, index helpers.
//
// Conventions (every raw_kernels/*.cu follows them):
// - kernels are templates on the element type T (float, double, __half, __nv_bfloat16) and on the index type
//   I (int when every flat index of every buffer fits in 32 bits, long long otherwise), instantiated by name
//   expression from Python, e.g. "unfold_im2col<float, int>"; names read <op>_<pass>[_<specialisation>];
// - arithmetic is done in acc_t<T>: float for the half types, T otherwise; load with to_acc, store with
//   from_acc<T>;
// - scalar parameters are int (32-bit) or long long (64-bit) or float/double, never size_t or long, so the
//   Python side can pass numpy.int32 / numpy.int64 / numpy.float32 / numpy.float64 exactly;
// - elementwise kernels use grid-stride loops so any grid size is correct.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

template <typename T> struct AccType { typedef T type; };
template <> struct AccType<__half> { typedef float type; };
template <> struct AccType<__nv_bfloat16> { typedef float type; };
template <typename T> using acc_t = typename AccType<T>::type;

__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }

template <typename T> __device__ __forceinline__ T from_acc(acc_t<T> v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// First flat index of this thread and the stride of a grid-stride loop, in index type I.
template <typename I> __device__ __forceinline__ I grid_start() {
  return (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x;
}
template <typename I> __device__ __forceinline__ I grid_stride() { return (I)gridDim.x * (I)blockDim.x; }

// Whether this block is the last of the `splits` blocks that count at arrivals[slot] (a block of a split reduction
// that has written its partial sums; with one split, every block is).  Release: every thread fences its own stores
// of the sums (a thread's fence orders its stores only), the barrier gathers the block, then one thread counts it in
// arrivals[slot]; the one that sees splits - 1 before it knows every other split's sums are visible, fences once more
// (acquire) and sets the count back to 0 for the next launch (or the next pass of a looping block).  Its readers
// load the sums with __ldcg (L2: another SM wrote them).  Every thread of the block must call it, after its last read
// of shared memory it shares with `flag` (the verdict, one word of shared memory).  Users: implicit_gemm.cu's
// `wg_last_arrival`, depthwise.cu's `finish_rows`.
__device__ __forceinline__ bool last_arrival(int* arrivals, int slot, int splits, int* flag) {
  if (splits == 1) {
    __syncthreads();  // (the block's own stores are visible to the block after a barrier)
    return true;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const bool last = atomicAdd(arrivals + slot, 1) == splits - 1;
    if (last) {
      __threadfence();
      arrivals[slot] = 0;
    }
    *flag = last;
  }
  __syncthreads();
  return *flag != 0;
}

// q = n / d and r = n % d for 0 <= n < 2^31 by a multiply-high, for divisors fixed for a whole kernel (a kernel
// size, a stride) that a kernel divides by in its inner loops, where a division by a run-time int costs ~20
// instructions.  Granlund and Montgomery's round-up method: with l = ceil(log2 d) and
// m = floor(2^32 (2^l - d) / d) + 1 (< 2^32), n / d = (umulhi(m, n) + n) >> l, exact for every n < 2^31 (the sum
// fits 32 bits).  Built once per thread: its one 64-bit division is paid once, not per element.
struct FastDivmod {
  int d;
  unsigned m;
  unsigned l;
  __device__ FastDivmod() : d(1), m(1), l(0) {}
  __device__ explicit FastDivmod(int divisor) : d(divisor), l(0) {
    while ((1u << l) < (unsigned)divisor) ++l;
    m = (unsigned)((((1ull << l) - (unsigned)divisor) << 32) / (unsigned)divisor + 1);
  }
  // From m computed on the host (cupyconv._kernels.fast_divmod_magic): no 64-bit division on the device, for
  // kernels whose threads are many and short.
  __device__ FastDivmod(int divisor, unsigned magic) : d(divisor), m(magic), l(32 - __clz(divisor - 1)) {}
  __device__ __forceinline__ int div(int n) const { return (int)((__umulhi(m, (unsigned)n) + (unsigned)n) >> l); }
  __device__ __forceinline__ int divmod(int n, int& r) const {
    const int q = div(n);
    r = n - q * d;
    return q;
  }
};

// q = n / d and r = n % d of a flat index n >= 0: FastDivmod's multiply-high where I is int (every index of the
// launch is below 2^31, its domain), the 64-bit division where it is long long.  Once per thread unit, never in
// a tap loop.
template <typename I>
__device__ __forceinline__ I index_divmod(I n, const FastDivmod& d, int& r) {
  if constexpr (sizeof(I) == 4) {
    return d.divmod(n, r);
  } else {
    const I q = n / d.d;
    r = (int)(n - q * d.d);
    return q;
  }
}
