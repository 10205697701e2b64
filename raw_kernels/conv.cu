// conv2d with groups: the direct kernel for few channels per group, and the small kernels around the im2col + cuBLAS
// GEMM algorithm (bias epilogue, the bias gradient).  The tensor-core implicit GEMMs live in implicit_gemm.cu.
//
// Layouts: x is read through element strides (n, C, H, W); weight is contiguous (D, C / G, kH, kW); outputs and
// grad_output are contiguous (n, D, oH, oW); the group of output channel d is d / (D / G).
#include "common.cuh"

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

// grad_bias[d] = sum over (image, pixel) of grad_output (n, D, L), in two passes with no atomics, so the bits are
// the same on every run.  conv_bgrad: block (d, s) sums split s of channel d -- images [s_i n / image_splits,
// (s_i + 1) n / image_splits) and pixels [s_p L / pixel_splits, ...), s = s_i * pixel_splits + s_p -- each thread
// a fixed subset in order (pixels threadIdx.x + k * blockDim.x of each image: coalesced; four sums in flight),
// then a fixed shared-memory tree (blockDim.x a power of two: REDUCE_BLOCK); partial[d * splits + s] = the sum.
// The splits exist because one block per channel left most of the chip idle: 64 channels took 160 us for 51 MB
// (measured, H200, r50-64 fp32).  conv_bgrad_sum: grad_bias[d] = the splits' sums of channel d, in order.
template <typename T, typename I>
__global__ void conv_bgrad(const T* __restrict__ grad_output, acc_t<T>* __restrict__ partial, I n, int channels,
                           I pixels, int image_splits, int pixel_splits) {
  typedef acc_t<T> A;
  A* tree = reinterpret_cast<A*>(conv_shared);
  const int d = blockIdx.x, s = blockIdx.y;
  const int si = s / pixel_splits, sp = s % pixel_splits;
  // 64-bit products: n * image_splits may pass 2^31 even where every index fits in I
  const I image_begin = (I)((long long)n * si / image_splits), image_end = (I)((long long)n * (si + 1) / image_splits);
  const I p_begin = (I)((long long)pixels * sp / pixel_splits), p_end = (I)((long long)pixels * (sp + 1) / pixel_splits);
  const int step = blockDim.x;
  A sum[4] = {0, 0, 0, 0};
  for (I image = image_begin; image < image_end; ++image) {
    const T* plane = grad_output + (image * channels + d) * pixels;
    I p = p_begin + threadIdx.x;
    for (; p + 3 * step < p_end; p += 4 * step) {
#pragma unroll
      for (int k = 0; k < 4; ++k) sum[k] += to_acc(plane[p + k * step]);
    }
    for (; p < p_end; p += step) sum[0] += to_acc(plane[p]);
  }
  tree[threadIdx.x] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half) tree[threadIdx.x] += tree[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[(I)d * gridDim.y + s] = tree[0];
}

template <typename T, typename I>
__global__ void conv_bgrad_sum(const acc_t<T>* __restrict__ partial, T* __restrict__ grad_bias, int channels,
                               int splits) {
  for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < channels; d += gridDim.x * blockDim.x) {
    acc_t<T> sum = 0;
    for (int s = 0; s < splits; ++s) sum += partial[(I)d * splits + s];
    grad_bias[d] = from_acc<T>(sum);
  }
}
