// Kernels for the emulator's self-tests (tests/test_emulator.py).  Several are wrong on purpose: each one
// shows that the emulator catches a class of bug.  Not shipped, never compiled by NVRTC.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Every thread records its built-in variables: out[8 * flat thread id + ...].
__global__ void record_indices(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned* o = out + 10 * (block * blockDim.x * blockDim.y * blockDim.z + thread);
  o[0] = threadIdx.x; o[1] = threadIdx.y; o[2] = threadIdx.z;
  o[3] = blockIdx.x; o[4] = blockIdx.y; o[5] = blockIdx.z;
  o[6] = blockDim.x * 10000 + blockDim.y * 100 + blockDim.z;
  o[7] = gridDim.x * 10000 + gridDim.y * 100 + gridDim.z;
  o[8] = 0;
  o[9] = 0;
}

// The order in which threads run: each takes a ticket.
__global__ void take_ticket(int* counter, int* ticket) {
  ticket[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

// Tree sum of blockDim.x (a power of two, <= 256) values per block, in static shared memory.
template <typename T>
__global__ void block_sum(const T* in, T* out) {
  __shared__ T partial[256];
  const int tid = threadIdx.x;
  partial[tid] = in[blockIdx.x * blockDim.x + tid];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) partial[tid] += partial[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = partial[0];
}

// BUG: no barrier inside the loop, so a thread may add a partial sum that is not complete yet.
__global__ void block_sum_missing_loop_sync(const float* in, float* out) {
  __shared__ float partial[256];
  const int tid = threadIdx.x;
  partial[tid] = in[blockIdx.x * blockDim.x + tid];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) partial[tid] += partial[tid + stride];
  }
  __syncthreads();
  if (tid == 0) out[blockIdx.x] = partial[0];
}

// BUG: reads a neighbour's shared slot without a barrier after the writes.
__global__ void rotate_missing_sync(const float* in, float* out) {
  __shared__ float tile[256];
  const int tid = threadIdx.x;
  tile[tid] = in[tid];
  out[tid] = tile[(tid + 1) % blockDim.x];
}

// Reverses each block's slice through dynamic shared memory (blockDim.x floats).
__global__ void reverse_dynamic(const float* in, float* out) {
  extern __shared__ float buffer[];
  const int tid = threadIdx.x;
  buffer[tid] = in[blockIdx.x * blockDim.x + tid];
  __syncthreads();
  out[blockIdx.x * blockDim.x + tid] = buffer[blockDim.x - 1 - tid];
}

// Reads dynamic shared memory that no thread wrote: the result must show the poison.
__global__ void read_unwritten_dynamic(float* out) {
  extern __shared__ float buffer[];
  out[threadIdx.x] = buffer[threadIdx.x];
}

// BUG: only part of the block reaches the barrier.
__global__ void barrier_in_branch(float* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// BUG: the two halves of the block wait at different barriers.
__global__ void barrier_per_branch(float* out) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

// BUG: threads past n exit early, the others then wait for them at a barrier.
__global__ void exit_before_barrier(float* out, int n) {
  if ((int)threadIdx.x >= n) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

// BUG: lanes of one warp shuffle while the rest of the warp waits at a barrier.
__global__ void shuffle_against_barrier(float* out) {
  float v = (float)threadIdx.x;
  if (threadIdx.x % 32 < 16) v = __shfl_down_sync(0xffffffffu, v, 1);
  else __syncthreads();
  out[threadIdx.x] = v;
}

// Warp collectives: a sum by __shfl_down_sync, an all-reduce by __shfl_xor_sync, a broadcast of lane 3 by
// __shfl_sync, a ballot of odd values, any/all votes and a shift by __shfl_up_sync.
__global__ void warp_ops(const int* in, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = in[i];
  int sum = v;
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  int all = v;
  for (int mask = 1; mask < 32; mask *= 2) all += __shfl_xor_sync(0xffffffffu, all, mask);
  out[6 * i + 0] = sum;
  out[6 * i + 1] = all;
  out[6 * i + 2] = __shfl_sync(0xffffffffu, v, 3);
  out[6 * i + 3] = (int)__ballot_sync(0xffffffffu, v & 1);
  out[6 * i + 4] = __any_sync(0xffffffffu, v > 100) * 10 + __all_sync(0xffffffffu, v >= 0);
  out[6 * i + 5] = __shfl_up_sync(0xffffffffu, v, 1);
}

// Every scalar kind arrives as passed.
__global__ void scalars(int a, long long b, float c, double d, unsigned int e, double* out) {
  out[0] = a;
  out[1] = (double)b;
  out[2] = c;
  out[3] = d;
  out[4] = e;
}

__global__ void scale_half(const __half* in, __half* out, float factor, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = __float2half_rn(__half2float(in[i]) * factor);
}

// Conversions both ways, as the kernels use them.
__global__ void convert_16bit(const float* in, __half* half_out, __nv_bfloat16* bf16_out, float* half_back,
                              float* bf16_back, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    half_out[i] = __float2half_rn(in[i]);
    bf16_out[i] = __float2bfloat16_rn(in[i]);
    half_back[i] = __half2float(half_out[i]);
    bf16_back[i] = __bfloat162float(bf16_out[i]);
  }
}

__global__ void atomics(int* counter, float* fsum, double* dsum, unsigned* usum) {
  atomicAdd(counter, 1);
  atomicAdd(fsum, 0.5f);
  atomicAdd(dsum, 0.25);
  atomicAdd(usum, 2u);
}

// Split-K finished by the last block to arrive: each block writes its values, its threads fence (FENCE 1; 0:
// none, BUG; 2: thread 0 only, BUG), it counts itself; the last sums every block's values in block order and
// says which block it was.
template <int FENCE>
__global__ void last_block_sum(float* partial, int* arrivals, float* out, int* last_block) {
  __shared__ int last;
  partial[blockIdx.x * blockDim.x + threadIdx.x] = (float)(blockIdx.x * 1000 + threadIdx.x);
  if (FENCE == 1 || (FENCE == 2 && threadIdx.x == 0)) __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(arrivals, 1) == (int)gridDim.x - 1;
    if (last) {
      __threadfence();
      *arrivals = 0;
      *last_block = (int)blockIdx.x;
    }
  }
  __syncthreads();
  if (!last) return;
  float sum = 0.0f;
  for (unsigned b = 0; b < gridDim.x; ++b) sum += __ldcg(partial + b * blockDim.x + threadIdx.x);
  out[threadIdx.x] = sum;
}

// BUG: writes one element past the end of out (n elements) from the last thread.
__global__ void write_past_end(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 1.0f;
}

// BUG: indexes a static shared array one past its end.
__global__ void static_shared_past_end(float* out, int n) {
  __shared__ float tile[32];
  tile[threadIdx.x] = 1.0f;  // launched with 33 threads
  __syncthreads();
  out[threadIdx.x] = tile[threadIdx.x] + (float)n;
}

// BUG: uses more dynamic shared memory than the launch provides (blockDim.x floats, but reads one more).
__global__ void dynamic_shared_past_end(float* out) {
  extern __shared__ float buffer[];
  buffer[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = buffer[threadIdx.x + 1];
}

// 40 KiB of static shared memory: with more than 8 KiB of dynamic memory it exceeds 48 KiB.
__global__ void big_static_shared(float* out) {
  __shared__ float big[10 * 1024];
  big[threadIdx.x] = 2.0f;
  __syncthreads();
  out[threadIdx.x] = big[threadIdx.x];
}

// Reads through an element stride (negative included), as the shipped kernels read their inputs.
__global__ void copy_strided(const float* in, long long stride, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i * stride];
}

// BUG: a 32-bit index that overflows (the kernel should have used a 64-bit index type).
__global__ void int_index_overflow(float* out, int rows, int cols) {
  const int last = rows * cols - 1;
  out[last % 7] = 1.0f;
}

// BUG: a thread-local array indexed past its end.
__global__ void local_array_past_end(float* out, int n) {
  float taps[4];
  for (int i = 0; i < n; ++i) taps[i] = (float)i;
  out[threadIdx.x] = taps[0];
}

// Copies through vector type V (float2, float4, int4, uint2...): each thread loads V at in + in_offset and stores
// it at out + out_offset (offsets in floats).  BUG unless both offsets keep the pointers aligned to sizeof(V).
template <typename V>
__global__ void vector_copy(const float* in, float* out, int in_offset, int out_offset) {
  const V v = reinterpret_cast<const V*>(in + in_offset)[threadIdx.x];
  reinterpret_cast<V*>(out + out_offset)[threadIdx.x] = v;
}

// Two neighbouring halves read as one unsigned from static shared memory (as conv.cu's tensor-core fragments):
// BUG unless offset (in halves) is even.
__global__ void half_pair_shared(const __half* in, unsigned* out, int offset) {
  __shared__ __align__(16) __half tile[2 * 32 + 2];
  tile[2 * threadIdx.x] = in[2 * threadIdx.x];
  tile[2 * threadIdx.x + 1] = in[2 * threadIdx.x + 1];
  if (threadIdx.x < 2) tile[64 + threadIdx.x] = __half(0.0f);
  __syncthreads();
  out[threadIdx.x] = *reinterpret_cast<const unsigned*>(tile + offset + 2 * threadIdx.x);
}

// A float4 stored to dynamic shared memory and read back as floats: BUG unless offset (in floats) is a
// multiple of 4.
__global__ void vector_dynamic_shared(float* out, int offset) {
  extern __shared__ float buffer[];
  reinterpret_cast<float4*>(buffer + offset)[threadIdx.x] = make_float4(1.0f, 2.0f, 3.0f, 4.0f);
  __syncthreads();
  out[threadIdx.x] = buffer[offset + 4 * threadIdx.x + 2];
}

// Compiled for blocks of at most SELFTEST_BOUND threads (a macro, as the shipped kernels' -D constants).
#define SELFTEST_BOUND 2 * 32
__global__ void __launch_bounds__(SELFTEST_BOUND, 4) bounded(float* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1.0f;
}

// Static shared memory outside the kernel's body: 4 KiB at file scope, 16 KiB (float) in a helper that is not
// inlined and uses the file-scope array, 8 KiB in an inlined helper, 8 KiB in the body: 36 KiB per block.
__shared__ float file_scope_tile[1024];

template <typename T>
__device__ __noinline__ T helper_not_inlined(int i) {
  __shared__ T staged[4096];
  staged[i] = T(1);
  __syncthreads();
  return staged[i] + T(file_scope_tile[i]);
}

__device__ __forceinline__ float helper_inlined(int i) {
  __shared__ float partial[2048];
  partial[i] = 2.0f;
  __syncthreads();
  return partial[i];
}

__global__ void shared_in_helpers(float* out) {
  __shared__ float own[2048];
  own[threadIdx.x] = 4.0f;
  file_scope_tile[threadIdx.x] = 0.5f;
  __syncthreads();
  out[threadIdx.x] = helper_not_inlined<float>(threadIdx.x) + helper_inlined(threadIdx.x) + own[threadIdx.x];
}

// Two calls deep: 32 KiB (double) + 4 KiB in helpers, 20 KiB in the body: 56 KiB, more than a block may declare.
__device__ __noinline__ double outer_helper(int i) { return helper_not_inlined<double>(i); }

__global__ void too_much_shared_in_helpers(double* out) {
  __shared__ double own[2560];
  own[threadIdx.x] = 1.0;
  out[threadIdx.x] = outer_helper(threadIdx.x) + own[threadIdx.x];
}

// ---------------------------------------------------------------------------------------------------------
// Tensor-core matrix operations (raw_kernels/mma.cuh's functions; emu_mma.h is what that header includes here).
#include <emu_mma.h>

// One m16n8k16 product per warp: D = A B + C with A (16 x 16, row-major), B given as B^T (8 x 16, so each column
// of B is contiguous, as the .col operand wants), C and D (16 x 8, row-major); fragments in the documented
// layout.  swap = 1 exchanges a[1] and a[2]: an undocumented layout, which must compute something else.
template <typename T>
__global__ void mma_16816(const T* A, const T* Bt, const float* C, float* D, int swap) {
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  unsigned a[4], b[2];
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r & 1), col = 2 * q + 8 * (r >> 1);
    a[r] = pack2(A[row * 16 + col], A[row * 16 + col + 1]);
  }
  if (swap) {
    const unsigned t = a[1];
    a[1] = a[2];
    a[2] = t;
  }
  for (int r = 0; r < 2; ++r) b[r] = pack2(Bt[g * 16 + 2 * q + 8 * r], Bt[g * 16 + 2 * q + 8 * r + 1]);
  float d[4] = {C[g * 8 + 2 * q], C[g * 8 + 2 * q + 1], C[(g + 8) * 8 + 2 * q], C[(g + 8) * 8 + 2 * q + 1]};
  mma_m16n8k16<T>(d, a, b);
  D[g * 8 + 2 * q] = d[0];
  D[g * 8 + 2 * q + 1] = d[1];
  D[(g + 8) * 8 + 2 * q] = d[2];
  D[(g + 8) * 8 + 2 * q + 1] = d[3];
}

// One m16n8k8 tf32 product: A (16 x 8), Bt (8 x 8, B^T), C and D as above; the operands rounded with to_tf32
// when round = 1, else their float bits passed as they are (the hardware then ignores the 13 low bits).
__global__ void mma_1688_tf32(const float* A, const float* Bt, const float* C, float* D, int round) {
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  auto bits = [round](float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    return round ? to_tf32(x) : u;
  };
  unsigned a[4] = {bits(A[g * 8 + q]), bits(A[(g + 8) * 8 + q]), bits(A[g * 8 + q + 4]), bits(A[(g + 8) * 8 + q + 4])};
  unsigned b[2] = {bits(Bt[g * 8 + q]), bits(Bt[g * 8 + q + 4])};
  float d[4] = {C[g * 8 + 2 * q], C[g * 8 + 2 * q + 1], C[(g + 8) * 8 + 2 * q], C[(g + 8) * 8 + 2 * q + 1]};
  mma_m16n8k8_tf32(d, a, b);
  D[g * 8 + 2 * q] = d[0];
  D[g * 8 + 2 * q + 1] = d[1];
  D[(g + 8) * 8 + 2 * q] = d[2];
  D[(g + 8) * 8 + 2 * q + 1] = d[3];
}

// BUG: only the lanes below `lanes` reach the mma (mma.sync.aligned needs the whole warp).
__global__ void mma_divergent(float* D, int lanes) {
  unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  float d[4] = {0, 0, 0, 0};
  if ((int)(threadIdx.x % 32) < lanes) mma_m16n8k16<__half>(d, a, b);
  D[threadIdx.x] = d[0];
}
