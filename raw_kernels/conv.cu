// conv2d with groups: the tensor-core implicit GEMM, the direct kernel for few channels per group, and the small
// kernels around the im2col + cuBLAS GEMM algorithm (bias epilogue, the bias gradient).
//
// Layouts: x is read through element strides (n, C, H, W); weight is contiguous (D, C / G, kH, kW); outputs and
// grad_output are contiguous (n, D, oH, oW); the group of output channel d is d / (D / G).
#include "common.cuh"
#include "mma.cuh"

// Dynamic shared memory of every kernel in this file; double gives the 8-byte alignment double needs.
extern __shared__ double conv_shared[];

// Direct convolution.  Every block works through items (image, group, block of DPT output channels of the
// group, output tile of blockDim.y x blockDim.x pixels); thread (ty, tx) owns one pixel of the tile and keeps
// its DPT output channels in registers, so every staged input value feeds DPT multiply-adds.  The group's input
// channels are walked in slabs of `slab` channels: the slab's input tile plus halo (tile_in_h x tile_in_w, zero
// outside the image) and the slab's weights are staged in shared memory as acc_t (converted once).  Any kernel
// size, stride, dilation and padding (negative padding too: grad_input reuses this kernel); bias is fused.
template <typename T, typename I, int DPT>
__global__ void conv_fwd_direct(const T* __restrict__ x, const T* __restrict__ weight,
                                const T* __restrict__ bias, T* __restrict__ out, I n,
                                I x_stride_n, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
                                int channels_per_group, int outputs_per_group, int height, int width, int kernel_h,
                                int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left,
                                int dilation_h, int dilation_w, int out_h, int out_w, int slab, int tile_in_h,
                                int tile_in_w) {
  typedef acc_t<T> A;
  const int taps = kernel_h * kernel_w;
  const int tile_elems = tile_in_h * tile_in_w;
  // The weights go first, at the aligned start: each tap's DPT weights can then be read as vectors.
  A* wslab = reinterpret_cast<A*>(conv_shared);  // [slab channel][tap][DPT]
  A* tile = wslab + slab * taps * DPT;           // [slab channel][tile_in_h][tile_in_w]

  // The block is the output tile: signed copies of its shape keep the padding arithmetic signed.
  const int tile_w = blockDim.x, tile_h = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int threads = tile_w * tile_h;
  const int tid = ty * tile_w + tx;
  const int tiles_x = (out_w + tile_w - 1) / tile_w;
  const int tiles_y = (out_h + tile_h - 1) / tile_h;
  const int dblocks = (outputs_per_group + DPT - 1) / DPT;
  const I items = n * groups * dblocks * tiles_y * tiles_x;

  // The item loop and the slab loop are uniform across the block, so every thread meets every barrier.
  for (I item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile_x = (int)(item % tiles_x);
    const int tile_y = (int)((item / tiles_x) % tiles_y);
    const int dblock = (int)((item / ((I)tiles_x * tiles_y)) % dblocks);
    const I image_group = item / ((I)tiles_x * tiles_y * dblocks);
    const int g = (int)(image_group % groups);
    const I image = image_group / groups;
    const int d0 = dblock * DPT;  // first output channel of this item, within the group
    const int oy = tile_y * tile_h + ty;
    const int ox = tile_x * tile_w + tx;
    const int iy0 = tile_y * tile_h * stride_h - pad_top;  // input row of the tile's top-left tap
    const int ix0 = tile_x * tile_w * stride_w - pad_left;

    A sum[DPT];
#pragma unroll
    for (int d = 0; d < DPT; ++d) {
      sum[d] = d0 + d < outputs_per_group ? to_acc(bias[g * outputs_per_group + d0 + d]) : A(0);
    }

    const T* x_image = x + image * x_stride_n + (I)(g * channels_per_group) * x_stride_c;
    for (int c0 = 0; c0 < channels_per_group; c0 += slab) {
      const int channels = min(slab, channels_per_group - c0);
      __syncthreads();  // the previous slab's readers are done with shared memory
      for (int e = tid; e < channels * tile_elems; e += threads) {
        const int c = e / tile_elems;
        const int r = e - c * tile_elems;
        const int y = iy0 + r / tile_in_w;
        const int xx = ix0 + r % tile_in_w;
        A value = 0;
        if (y >= 0 && y < height && xx >= 0 && xx < width) {
          value = to_acc(x_image[(I)(c0 + c) * x_stride_c + (I)y * x_stride_h + (I)xx * x_stride_w]);
        }
        tile[e] = value;
      }
      for (int e = tid; e < channels * taps * DPT; e += threads) {
        const int d = e % DPT;
        const int t = (e / DPT) % taps;
        const int c = e / (DPT * taps);
        A value = 0;
        if (d0 + d < outputs_per_group) {
          value = to_acc(weight[((I)(g * outputs_per_group + d0 + d) * channels_per_group + c0 + c) * taps + t]);
        }
        wslab[e] = value;
      }
      __syncthreads();
      if (oy < out_h && ox < out_w) {
        for (int c = 0; c < channels; ++c) {
          const A* in = tile + c * tile_elems + ty * stride_h * tile_in_w + tx * stride_w;
          const A* w = wslab + c * taps * DPT;
          for (int i = 0; i < kernel_h; ++i) {
            for (int j = 0; j < kernel_w; ++j) {
              const A v = in[i * dilation_h * tile_in_w + j * dilation_w];
              const A* wt = w + (i * kernel_w + j) * DPT;
#pragma unroll
              for (int d = 0; d < DPT; ++d) sum[d] += v * wt[d];
            }
          }
        }
      }
    }

    if (oy < out_h && ox < out_w) {
      const I pixel = (I)oy * out_w + ox;
      const I channel0 = image * groups * outputs_per_group + g * outputs_per_group + d0;
#pragma unroll
      for (int d = 0; d < DPT; ++d) {
        if (d0 + d < outputs_per_group) out[(channel0 + d) * out_h * out_w + pixel] = from_acc<T>(sum[d]);
      }
    }
  }
}

// Bias epilogue of the GEMM algorithm: out (n, D, L) += bias (D,), in place, one grid-stride pass.
template <typename T, typename I>
__global__ void conv_fwd_bias(T* __restrict__ out, const T* __restrict__ bias, I total, int channels,
                              I pixels) {
  for (I index = grid_start<I>(); index < total; index += grid_stride<I>()) {
    const int d = (int)((index / pixels) % channels);
    out[index] = from_acc<T>(to_acc(out[index]) + to_acc(bias[d]));
  }
}

// grad_bias[d] = sum over (image, pixel) of grad_output (n, D, L).  One block per channel; each thread sums a
// fixed subset (pixels threadIdx.x + k * blockDim.x of every image: coalesced) in order, then a fixed
// shared-memory tree combines the threads: no atomics, so the bits are the same on every run.  blockDim.x
// must be a power of two (the launcher uses REDUCE_BLOCK = 256).
template <typename T, typename I>
__global__ void conv_bgrad(const T* __restrict__ grad_output, T* __restrict__ grad_bias, I n, int channels,
                           I pixels) {
  typedef acc_t<T> A;
  A* partial = reinterpret_cast<A*>(conv_shared);
  const int d = blockIdx.x;
  A sum = 0;
  for (I image = 0; image < n; ++image) {
    const T* plane = grad_output + (image * channels + d) * pixels;
    for (I p = threadIdx.x; p < pixels; p += blockDim.x) sum += to_acc(plane[p]);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) grad_bias[d] = from_acc<T>(partial[0]);
}

// ---------------------------------------------------------------------------------------------------------
// Tensor-core implicit GEMM, forward: out (M x N) = A (M x K) * B (K x N) per group, with
//   M = images * oH * oW output pixels, N = D / G output channels, K = C / G * kH * kW, k = (c * kH + i) * kW + j;
//   A[m][k] = x[image, g * C/G + c, oy * stride_h - pad_top + i * dilation_h, ox * stride_w - ...] (0 outside),
//   B[k][n] = weight[g * N + n][k] (the weight's own layout: each column of B is contiguous).
// No column matrix exists anywhere: a block gathers its A tile straight from x.  x is read through a batch view
// (image q at (q / x_inner) * x_stride_outer + (q % x_inner) * x_stride_inner, then c, h, w strides), so conv2d
// and patch_conv2d (any leading dims, transposed included) share this kernel.  out is contiguous
// (images, D, oH, oW); bias and the conversion to T are applied to the float accumulators (one rounding).
//
// Block tile TC_BM x TC_BN (pixels x channels), 4 warps in 2 x 2, each warp 32 x 32 = 2 x 4 mma tiles of
// 16 x 8; the K dimension in chunks of TC_BK.  The A and B chunks are staged in shared memory as T (as float
// for float inputs, rounded to tf32 when the fragments are read), rows TC_BK + pad apart so that the fragment
// reads of a warp hit 32 different banks.  Two stages: the global loads of chunk t + 1 are issued into
// registers before the tensor cores work on chunk t, and stored to the other stage after, one barrier per chunk.
// Global loads: a warp reads 32 consecutive pixels of one (c, i, j) (one row of x: coalesced when oW >= 32).
// TC_BM, TC_BN and TC_THREADS are shared with the planner (cupyconv/ops/conv.py passes them as -D options).
#if !defined(TC_BM) || !defined(TC_BN) || !defined(TC_THREADS)
#error "conv.cu needs the -D options of cupyconv._device.compile_options('conv.cu')"
#endif
static_assert(TC_BM == 64 && TC_BN == 64 && TC_THREADS == 128, "the warp layout below is 2 x 2 warps of 32 x 32");
constexpr int TC_BK = 32;

template <typename T> struct TcTile {  // 16-bit inputs: m16n8k16, rows padded by 8 elements (16 bytes)
  typedef T Stage;
  static constexpr int K_STEP = 16, PITCH = TC_BK + 8;
};
template <> struct TcTile<float> {  // float inputs on TF32: m16n8k8, rows padded by 4 floats
  typedef float Stage;
  static constexpr int K_STEP = 8, PITCH = TC_BK + 4;
};

// One K step of one warp: acc[mi][ni] += A rows (warp_m + 16 mi ..) x B columns (warp_n + 8 ni ..).
template <typename T>
__device__ __forceinline__ void tc_warp_step(const T* as, const T* bs, int k0, int lane, float (&acc)[2][4][4]) {
  constexpr int P = TcTile<T>::PITCH;
  const int g = lane >> 2, q = lane & 3;
  unsigned a[2][4], b[4][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const T* p = as + (mi * 16 + g + 8 * (r & 1)) * P + k0 + 2 * q + 8 * (r >> 1);
      a[mi][r] = *reinterpret_cast<const unsigned*>(p);  // two neighbouring k: 4-byte aligned (even P, even k)
    }
  }
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      b[ni][r] = *reinterpret_cast<const unsigned*>(bs + (ni * 8 + g) * P + k0 + 2 * q + 8 * r);
    }
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) mma_m16n8k16<T>(acc[mi][ni], a[mi], b[ni]);
  }
}

template <>
__device__ __forceinline__ void tc_warp_step<float>(const float* as, const float* bs, int k0, int lane,
                                                   float (&acc)[2][4][4]) {
  constexpr int P = TcTile<float>::PITCH;
  const int g = lane >> 2, q = lane & 3;
  unsigned a[2][4], b[4][2];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
    const float* p = as + (mi * 16 + g) * P + k0 + q;
    a[mi][0] = to_tf32(p[0]);
    a[mi][1] = to_tf32(p[8 * P]);
    a[mi][2] = to_tf32(p[4]);
    a[mi][3] = to_tf32(p[8 * P + 4]);
  }
#pragma unroll
  for (int ni = 0; ni < 4; ++ni) {
    const float* p = bs + (ni * 8 + g) * P + k0 + q;
    b[ni][0] = to_tf32(p[0]);
    b[ni][1] = to_tf32(p[4]);
  }
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) mma_m16n8k8_tf32(acc[mi][ni], a[mi], b[ni]);
  }
}

template <typename T, typename I>
__global__ void __launch_bounds__(TC_THREADS) conv_fwd_tc(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out, I n,
    I x_inner, I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
    int channels_per_group, int outputs_per_group, int height, int width, int kernel_h, int kernel_w, int stride_h,
    int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w, int out_h, int out_w, int has_bias) {
  typedef typename TcTile<T>::Stage S;
  constexpr int P = TcTile<T>::PITCH;
  constexpr int A_PER_THREAD = TC_BM * TC_BK / TC_THREADS, B_PER_THREAD = TC_BN * TC_BK / TC_THREADS;
  // Static, so the planner needs no copy of the pitches: 20 KiB for 16-bit inputs, 36 KiB for float.
  __shared__ __align__(16) S as[2 * TC_BM * P];  // [stage][pixel][k]
  __shared__ __align__(16) S bs[2 * TC_BN * P];  // [stage][channel][k]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int taps = kernel_h * kernel_w, K = channels_per_group * taps, N = outputs_per_group;
  const I pixels = (I)out_h * out_w, M = n * pixels;
  const int n_tiles = (N + TC_BN - 1) / TC_BN;
  const int g = blockIdx.y / n_tiles, n0 = blockIdx.y % n_tiles * TC_BN;
  const I m0 = (I)blockIdx.x * TC_BM;

  // A loads: this thread's rows m0 + lane and m0 + lane + 32, columns k = warp + 4 * e (e = 0..7) of a chunk.
  I row_base[2];
  int row_y[2], row_x[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const I m = m0 + lane + 32 * h;
    row_y[h] = -(1 << 30);  // rows past M read nothing: every y is out of range
    row_x[h] = 0;
    row_base[h] = 0;
    if (m < M) {
      const I image = m / pixels;
      const int p = (int)(m - image * pixels);
      row_y[h] = p / out_w * stride_h - pad_top;
      row_x[h] = p % out_w * stride_w - pad_left;
      row_base[h] = (image / x_inner) * x_stride_outer + (image % x_inner) * x_stride_inner +
                    (I)(g * channels_per_group) * x_stride_c;
    }
  }
  // B loads: this thread's channel row n0 + tid / 2, columns (tid % 2) * 16 + e (e = 0..15) of a chunk.
  const int b_row = tid >> 1, b_col = (tid & 1) * 16;
  const bool b_valid = n0 + b_row < N;
  const T* w_row = weight + (I)(g * N + n0 + b_row) * K;

  S a_next[A_PER_THREAD], b_next[B_PER_THREAD];
  auto load_chunk = [&](int k0) {
#pragma unroll
    for (int e = 0; e < A_PER_THREAD / 2; ++e) {
      const int k = k0 + warp + 4 * e;
      const int c = k / taps, tap = k - c * taps;
      const int dy = tap / kernel_w * dilation_h, dx = tap % kernel_w * dilation_w;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int y = row_y[h] + dy, xx = row_x[h] + dx;
        S value = S(0.0f);
        if (k < K && y >= 0 && y < height && xx >= 0 && xx < width) {
          value = x[row_base[h] + (I)c * x_stride_c + (I)y * x_stride_h + (I)xx * x_stride_w];
        }
        a_next[2 * e + h] = value;
      }
    }
#pragma unroll
    for (int e = 0; e < B_PER_THREAD; ++e) {
      const int k = k0 + b_col + e;
      b_next[e] = b_valid && k < K ? S(w_row[k]) : S(0.0f);
    }
  };
  auto store_chunk = [&](int stage) {
    S* a_stage = as + stage * TC_BM * P;
    S* b_stage = bs + stage * TC_BN * P;
#pragma unroll
    for (int e = 0; e < A_PER_THREAD / 2; ++e) {
#pragma unroll
      for (int h = 0; h < 2; ++h) a_stage[(lane + 32 * h) * P + warp + 4 * e] = a_next[2 * e + h];
    }
#pragma unroll
    for (int e = 0; e < B_PER_THREAD; ++e) b_stage[b_row * P + b_col + e] = b_next[e];
  };

  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.0f;
    }
  }

  const int warp_m = (warp >> 1) * 32, warp_n = (warp & 1) * 32;
  const int chunks = (K + TC_BK - 1) / TC_BK;
  load_chunk(0);
  store_chunk(0);
  __syncthreads();
  for (int t = 0; t < chunks; ++t) {
    const int stage = t & 1;
    if (t + 1 < chunks) load_chunk((t + 1) * TC_BK);  // in flight while the tensor cores work on chunk t
    const S* a_stage = as + stage * TC_BM * P + warp_m * P;
    const S* b_stage = bs + stage * TC_BN * P + warp_n * P;
#pragma unroll
    for (int k0 = 0; k0 < TC_BK; k0 += TcTile<T>::K_STEP) tc_warp_step<S>(a_stage, b_stage, k0, lane, acc);
    if (t + 1 < chunks) store_chunk(stage ^ 1);  // the other stage: last read before the previous barrier
    __syncthreads();
  }

  // Epilogue: accumulator (row g (+8), columns 2q, 2q+1) of each mma tile -> out, plus bias, one rounding.
  const int gq = lane >> 2, q = lane & 3;
  const I channel_stride = pixels;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const I m = m0 + warp_m + mi * 16 + gq + 8 * half;
      if (m >= M) continue;
      const I image = m / pixels;
      T* dst = out + (image * groups + g) * (I)N * pixels + (m - image * pixels);
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const int nn = n0 + warp_n + ni * 8 + 2 * q + j;
          if (nn >= N) continue;
          float value = acc[mi][ni][2 * half + j];
          if (has_bias) value += to_acc(bias[g * N + nn]);
          dst[(I)nn * channel_stride] = from_acc<T>(value);
        }
      }
    }
  }
}
