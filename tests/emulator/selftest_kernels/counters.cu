// Kernels for the memory counters' self-tests (tests/test_counters.py): access patterns whose global sectors and
// shared-memory wavefronts per warp request are documented.  Each access sits on its own line, which the tests
// find by the marker comment at its end.  Not shipped, never compiled by NVRTC.
#include <cuda_fp16.h>

// out[i] = in[stride * i], one float per thread: 4 sectors per request for stride 1 (a warp reads 128
// contiguous bytes), 8 for stride 2 (256 bytes, half of each sector unused), 1 for stride 0 (every lane reads the
// same float: 4 useful bytes); the store is always 4.
__global__ void copy_strided_float(const float* in, float* out, int stride) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = in[(long long)stride * i];  // @global_load
  out[i] = v;                                 // @global_store
}

// Each lane reads word `stride * lane` of a shared array: stride 0 is a broadcast (1 wavefront), 1 is
// conflict-free (1), 2, 4 and 32 are 2-, 4- and 32-way conflicts (lanes in 16, 8 and 1 of the 32 banks).
__global__ void shared_float_stride(float* out, int stride) {
  __shared__ float words[32 * 32];
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 32 * 32; i += blockDim.x) words[i] = (float)i;  // @shared_fill
  __syncthreads();
  const float v = words[stride * lane];  // @shared_load
  __syncthreads();
  words[stride * lane] = v + 1.0f;  // @shared_store
  out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}

// 8-byte (float2) and 16-byte (float4) shared loads of element `stride * lane % period`: conflict-free at stride 1,
// served per half warp (2 wavefronts) and per quarter warp (4); stride 2 doubles both.  With period 16 (8) every
// half (quarter) warp reads the same elements: still 2 (4) wavefronts, one per phase.
__global__ void shared_vector_stride(float* out, int stride, int period) {
  __shared__ float4 quads[64];
  __shared__ float2 pairs[64];
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < 64; i += blockDim.x) {
    quads[i] = make_float4(i, i, i, i);
    pairs[i] = make_float2(i, i);
  }
  __syncthreads();
  const float2 p = pairs[stride * lane % period];  // @shared_load8
  const float4 q = quads[stride * lane % period];  // @shared_load16
  out[blockIdx.x * blockDim.x + threadIdx.x] = p.x + q.x;
}

// 2-byte shared stores down a column of a [32][pitch] __half tile (the tensor-core kernels' stage layout, lanes on
// rows): pitch 40 halves (80 bytes, 20 words) puts the 32 lanes in 8 banks, 4 distinct words each: 4-way.
// Lanes 2 bytes apart (pitch 1) share words: 16 words in 16 banks, 1 wavefront.
__global__ void shared_half_column(float* out, int pitch) {
  __shared__ __half tile[32 * 40];
  const int lane = threadIdx.x & 31;
  tile[lane * pitch] = __half((float)lane);  // @shared_store2
  __syncthreads();
  out[threadIdx.x] = (float)tile[lane];
}

// Only lanes below `active` read, in a loop of `repeat` iterations: each iteration is one request of the site, made
// by the active lanes only; lanes that run the loop more often than others still pair up by iteration.
__global__ void partial_warp_loop(const float* in, float* out, int active, int repeat) {
  float sum = 0.0f;
  if ((int)(threadIdx.x & 31) < active) {
    for (int r = 0; r < repeat; ++r) sum += in[r * 32 + (threadIdx.x & 31)];  // @loop_load
  }
  out[threadIdx.x] = sum;
}

// A load predicated off in a helper, as the tensor-core gathers skip the padding: lane 0 skips it in the first
// iteration.  On a GPU the predicated instruction still issues once per iteration, so each iteration is one
// request of 128 bytes in 4 sectors (31 lanes in the first); pairing lane 0's first load with the others' first
// would mix iterations 256 bytes apart (5 sectors).
__device__ float load_unless(const float* p, bool skip) {
  if (skip) return 0.0f;
  return *p;  // @helper_load
}
__global__ void predicated_helper(const float* in, float* out, int repeat) {
  const int lane = threadIdx.x & 31;
  float sum = 0.0f;
  for (int r = 0; r < repeat; ++r) sum += load_unless(in + 64 * r + lane, lane == 0 && r == 0);
  out[threadIdx.x] = sum;
}
