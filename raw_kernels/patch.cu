// Patch convolution: the same filters over a batch of tiny patches, x (n, C, H, W) -> out (n, D, oH, oW),
// weight (D, C / G, kH, kW) contiguous.  Padding is inside every patch: nothing is ever read across patches.
//
// The batch of patches is read in place through element strides: the leading dims collapse to at most two,
// (outer, inner), so patch q starts at (q / inner) * stride_outer + (q % inner) * stride_inner; a
// (B, C, N, H, W) array transposed to (B, N, C, H, W) is read without a copy.  Outputs are contiguous.
//
// Kernels (PH, PW, KH, KW: patch and kernel size as compile-time constants, which unrolls the tap loops and
// turns the index arithmetic into constant divisions; all 0 for the generic kernel, which takes them at run time):
//   patch_fwd<T, I, PH, PW, KH, KW>        forward, bias fused
//   patch_bwd_input<T, I, PH, PW, KH, KW>  grad input: the same tile kernel on grad_out, transposed + flipped
//   patch_bwd_weight<T, I>                 grad weight: one partial sum per block slice, no atomics (its inner
//                                          loop runs over pixels, which constant sizes would not shorten)
//   patch_reduce<T, I>                     sums the slices' partials in a fixed order (same bits every run)
//
// Forward cost of the seed shape (n = 20480 patches, C = 32, D = 64, 4x4, 3x3 kernel, padding 1, fp32):
//   FLOPs = 2 * n * D * oH * oW * C * kH * kW = 2 * 20480 * 64 * 16 * 288 = 12.1 GFLOP
//   bytes = x 42 MB + out 84 MB (+ 74 KB weights) = 126 MB  ->  96 FLOP/byte
// An H100 (~67 TFLOP/s FP32 FMA, ~3.35 TB/s HBM3; balance ~20 FLOP/byte) is compute-bound here: 180 us at the
// FMA roofline against 38 us for the bytes.  So the kernel is built around the FMA pipe: every thread keeps a
// TM x TN register tile (4 pixels x 16 output channels = 64 accumulators) and per tap issues TM scalar shared
// loads (one per pixel; the host pads patch_stride to spread a warp's loads over the banks) and TN / 4
// broadcast 16-byte weight loads: 8 shared loads per 64 FMAs, well under the 1 : 4 ratio at which the shared
// memory pipe (one wavefront per clock against four warp FMAs) would become the bound.  Global traffic is one
// read of every input element and one write of every output element, a warp's stores covering runs of
// consecutive pixels.  fp16/bf16 halve the bytes and change nothing else: tiles live in shared memory as
// float and every FMA is an FP32 FMA.  At 2 blocks of 256 threads per SM (121 registers, 37 KB of shared
// memory each) the 1280 blocks of the seed shape run in under 5 waves on 132 SMs.
#include "common.cuh"

// Constants shared with the planner: cupyconv/ops/patch.py defines them (KERNELS.defines) and every compiler
// of this file gets them as -D options, so they exist once.
//   PATCH_TM/TN/TK/TD_FLOAT, _DOUBLE  register tiles: TM output pixels x TN output channels per thread in the
//                                     tile kernels, TK weight entries x TD output channels in patch_bwd_weight
//                                     (float for every type but double, which gets half: 64 doubles would not
//                                     fit the 128 registers of 512-thread blocks);
//   PATCH_MAX_THREADS                 the largest block the host launches; the bound lets the compiler budget
//                                     128 registers per thread.
#if !defined(PATCH_TM_FLOAT) || !defined(PATCH_TN_FLOAT) || !defined(PATCH_TK_FLOAT) || !defined(PATCH_TD_FLOAT) || \
    !defined(PATCH_TM_DOUBLE) || !defined(PATCH_TN_DOUBLE) || !defined(PATCH_TK_DOUBLE) ||                        \
    !defined(PATCH_TD_DOUBLE) || !defined(PATCH_MAX_THREADS)
#error "patch.cu needs the -D options of cupyconv._device.compile_options('patch.cu')"
#endif
template <typename T> struct PatchTile {
  static constexpr int TM = PATCH_TM_FLOAT, TN = PATCH_TN_FLOAT, TK = PATCH_TK_FLOAT, TD = PATCH_TD_FLOAT;
};
template <> struct PatchTile<double> {
  static constexpr int TM = PATCH_TM_DOUBLE, TN = PATCH_TN_DOUBLE, TK = PATCH_TK_DOUBLE, TD = PATCH_TD_DOUBLE;
};

// Four accumulators loaded together (one 16-byte shared load for float): weights and grad_out tiles keep
// their channel dimension innermost and 4-aligned so a thread's TN channels are TN / 4 of these.
template <typename A> struct alignas(16) Pack4 { A v[4]; };

// Dynamic shared memory of every kernel in this file; float4 gives the 16-byte alignment Pack4 needs.
extern __shared__ float4 patch_shared[];

template <typename I>
__device__ __forceinline__ I patch_offset(I q, I inner, I stride_outer, I stride_inner) {
  return (q / inner) * stride_outer + (q % inner) * stride_inner;
}

template <typename A, int TN>
__device__ __forceinline__ void load_channels(const A* p, A (&v)[TN]) {
#pragma unroll
  for (int u = 0; u < TN / 4; ++u) {
    const Pack4<A> pack = reinterpret_cast<const Pack4<A>*>(p)[u];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[4 * u + k] = pack.v[k];
  }
}

// One step of a register tile: acc[t][u] += rows[offsets[t]] * channels[u], the M gathered values times the N
// channels loaded as Pack4 vectors (the inner loop of every kernel in this file).
template <typename A, int M, int N>
__device__ __forceinline__ void tile_fma(const A* rows, const int (&offsets)[M], const A* channels, A (&acc)[M][N]) {
  A xv[M], cv[N];
#pragma unroll
  for (int t = 0; t < M; ++t) xv[t] = rows[offsets[t]];
  load_channels<A, N>(channels, cv);
#pragma unroll
  for (int t = 0; t < M; ++t) {
#pragma unroll
    for (int u = 0; u < N; ++u) acc[t][u] += xv[t] * cv[u];
  }
}

// The tile kernel behind patch_fwd and patch_bwd_input: an implicit GEMM, no column matrix in global memory.
//
// Forward: out[q, g*O + o, m] = bias + sum over (r, i, j) of w[g*O + o, r, i, j] * x[q, g*R + r, tap pixel], with
// R = C / G channels reduced and O = D / G outputs per group.  The "tile" of a patch is the padded patch (only
// the rows and columns the taps reach), read at output pixel (oy, ox), tap (i, j) at
// (oy * stride + i * dilation, ox * stride + j * dilation).
//
// Transposed (grad input, gather form): grad_x[q, g*O + o, y, x] = sum over (r, i, j) of w[g*R + r, o, i, j] *
// grad_out[q, g*R + r, (y + pad - i * dil) / stride, ...] (where that divides and lands inside), with R = D / G
// and O = C / G.  Written with the flipped kernel i' = kH - 1 - i this is the forward tile computation at
// stride 1 on a tile where grad_out pixel (oy, ox) sits at (oy * stride + (kH - 1) * dil - pad, ...) and
// every other position is zero: the same loop, no atomics, no conditionals in the inner loop.
//
// Block = P patches x all (or a tile of out_tile) outputs of one group: blockIdx.x picks the patches,
// blockIdx.y = group * out_tiles + out tile.  Thread = (output-channel lane, patch, pixel group): pixel group
// pg owns pixels pg, pg + PG, ... (PG = ceil(pixels / TM)), so a warp's stores and tile loads are runs of
// consecutive pixels.  The R reduced channels are walked in chunks of `chunk`: per chunk, the chunk's weights
// (as [r][tap][out_tile], zero past O) and the P patches' tiles ([patch][r][tile_h][tile_w], each patch
// `patch_stride` floats apart) are staged in shared memory as acc_t, converted once.  The tiles are zeroed
// once: every chunk writes the same interior positions, so the zero halo survives.
template <typename T, typename I, int PH, int PW, int KH, int KW, bool TRANSPOSED>
__device__ __forceinline__ void patch_tile_conv(
    const T* __restrict__ src, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out,
    I n, I inner, I src_stride_outer, I src_stride_inner, I src_stride_c, I src_stride_h, I src_stride_w,
    int channels_per_group, int outputs_per_group, int height, int width, int out_h, int out_w, int kernel_h,
    int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w,
    int patches, int out_tile, int chunk, int patch_stride, int has_bias) {
  typedef acc_t<T> A;
  constexpr int TM = PatchTile<T>::TM, TN = PatchTile<T>::TN;
  const int kh = KH ? KH : kernel_h, kw = KW ? KW : kernel_w;
  const int h = PH ? PH : height, w = PW ? PW : width;
  const int taps = kh * kw;
  const int src_h = TRANSPOSED ? out_h : h, src_w = TRANSPOSED ? out_w : w;
  const int dst_h = TRANSPOSED ? h : out_h, dst_w = TRANSPOSED ? w : out_w;
  const int reduce = TRANSPOSED ? outputs_per_group : channels_per_group;
  const int outs = TRANSPOSED ? channels_per_group : outputs_per_group;
  const int step_y = TRANSPOSED ? 1 : stride_h, step_x = TRANSPOSED ? 1 : stride_w;
  const int insert_y = TRANSPOSED ? stride_h : 1, insert_x = TRANSPOSED ? stride_w : 1;
  const int offset_y = TRANSPOSED ? (kh - 1) * dilation_h - pad_top : pad_top;
  const int offset_x = TRANSPOSED ? (kw - 1) * dilation_w - pad_left : pad_left;
  const int tile_h = (dst_h - 1) * step_y + (kh - 1) * dilation_h + 1;
  const int tile_w = (dst_w - 1) * step_x + (kw - 1) * dilation_w + 1;
  const int plane = tile_h * tile_w;
  const int pixels = dst_h * dst_w;
  const int pixel_groups = (pixels + TM - 1) / TM;
  const int out_tiles = (outs + out_tile - 1) / out_tile;
  const int groups = gridDim.y / out_tiles;
  const int g = blockIdx.y / out_tiles;
  const int o_first = (blockIdx.y % out_tiles) * out_tile;
  const I first = (I)blockIdx.x * patches;
  const int block_patches = (int)min((I)patches, n - first);

  const int pg = threadIdx.x % pixel_groups;
  const int p = (threadIdx.x / pixel_groups) % patches;
  const int o_lane = threadIdx.x / (pixel_groups * patches) * TN;

  A* wtile = reinterpret_cast<A*>(patch_shared);  // [chunk][taps][out_tile]
  A* tiles = wtile + chunk * taps * out_tile;     // [patches][patch_stride]
  for (int e = threadIdx.x; e < patches * patch_stride; e += blockDim.x) tiles[e] = A(0);

  int pix[TM];  // offset of each of this thread's pixels in a tile; 0 (a harmless read) past the last pixel
#pragma unroll
  for (int t = 0; t < TM; ++t) {
    const int m = pg + t * pixel_groups;
    pix[t] = m < pixels ? (m / dst_w) * step_y * tile_w + (m % dst_w) * step_x : 0;
  }
  A acc[TM][TN];
#pragma unroll
  for (int t = 0; t < TM; ++t) {
#pragma unroll
    for (int u = 0; u < TN; ++u) acc[t][u] = A(0);
  }

  const int src_plane = src_h * src_w;
  for (int r0 = 0; r0 < reduce; r0 += chunk) {
    const int rc = min(chunk, reduce - r0);
    __syncthreads();  // the previous chunk is consumed (and, the first time, the tiles are zeroed)
    for (int e = threadIdx.x; e < rc * taps * out_tile; e += blockDim.x) {
      const int o = e % out_tile, tap = (e / out_tile) % taps, r = e / (out_tile * taps);
      const int oo = o_first + o, rr = r0 + r;
      A value = A(0);
      if (oo < outs) {
        value = to_acc(TRANSPOSED ? weight[((I)(g * reduce + rr) * outs + oo) * taps + (taps - 1 - tap)]
                                  : weight[((I)(g * outs + oo) * reduce + rr) * taps + tap]);
      }
      wtile[e] = value;
    }
    for (int e = threadIdx.x; e < block_patches * rc * src_plane; e += blockDim.x) {
      const int sx = e % src_w, sy = (e / src_w) % src_h;
      const int r = (e / src_plane) % rc, q = e / (src_plane * rc);
      const int a = sy * insert_y + offset_y, b = sx * insert_x + offset_x;
      if (a >= 0 && a < tile_h && b >= 0 && b < tile_w) {
        const T* s = src + patch_offset(first + q, inner, src_stride_outer, src_stride_inner) +
                     (I)(g * reduce + r0 + r) * src_stride_c;
        tiles[q * patch_stride + r * plane + a * tile_w + b] = to_acc(s[(I)sy * src_stride_h + (I)sx * src_stride_w]);
      }
    }
    __syncthreads();

    const A* tile = tiles + p * patch_stride;
    for (int r = 0; r < rc; ++r) {
      const A* tr = tile + r * plane;
      const A* wr = wtile + r * taps * out_tile + o_lane;
#pragma unroll
      for (int i = 0; i < kh; ++i) {
#pragma unroll
        for (int j = 0; j < kw; ++j) {
          tile_fma(tr + i * dilation_h * tile_w + j * dilation_w, pix, wr + (i * kw + j) * out_tile, acc);
        }
      }
    }
  }

  if (p >= block_patches) return;
  T* dst = out + ((first + p) * groups + g) * outs * (I)pixels;
#pragma unroll
  for (int u = 0; u < TN; ++u) {
    const int oo = o_first + o_lane + u;
    if (oo >= outs) continue;
    const A b = has_bias ? to_acc(bias[g * outs + oo]) : A(0);
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      const int m = pg + t * pixel_groups;
      if (m < pixels) dst[(I)oo * pixels + m] = from_acc<T>(acc[t][u] + b);
    }
  }
}

// x (n, C, H, W) strided -> out (n, D, oH, oW) contiguous; bias (D,) read when has_bias.
template <typename T, typename I, int PH, int PW, int KH, int KW>
__global__ void __launch_bounds__(PATCH_MAX_THREADS) patch_fwd(
    const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias, T* __restrict__ out,
    I n, I x_inner, I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w,
    int channels_per_group, int outputs_per_group, int height, int width, int out_h, int out_w, int kernel_h,
    int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w,
    int patches, int out_tile, int chunk, int patch_stride, int has_bias) {
  patch_tile_conv<T, I, PH, PW, KH, KW, false>(
      x, weight, bias, out, n, x_inner, x_stride_outer, x_stride_inner, x_stride_c, x_stride_h, x_stride_w,
      channels_per_group, outputs_per_group, height, width, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w,
      pad_top, pad_left, dilation_h, dilation_w, patches, out_tile, chunk, patch_stride, has_bias);
}

// grad_out (n, D, oH, oW) strided -> grad_x (n, C, H, W) contiguous.  The geometry arguments are the forward's.
template <typename T, typename I, int PH, int PW, int KH, int KW>
__global__ void __launch_bounds__(PATCH_MAX_THREADS) patch_bwd_input(
    const T* __restrict__ grad_out, const T* __restrict__ weight, T* __restrict__ grad_x,
    I n, I g_inner, I g_stride_outer, I g_stride_inner, I g_stride_c, I g_stride_h, I g_stride_w,
    int channels_per_group, int outputs_per_group, int height, int width, int out_h, int out_w, int kernel_h,
    int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w,
    int patches, int out_tile, int chunk, int patch_stride) {
  patch_tile_conv<T, I, PH, PW, KH, KW, true>(
      grad_out, weight, nullptr, grad_x, n, g_inner, g_stride_outer, g_stride_inner, g_stride_c, g_stride_h,
      g_stride_w, channels_per_group, outputs_per_group, height, width, out_h, out_w, kernel_h, kernel_w,
      stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w, patches, out_tile, chunk, patch_stride, 0);
}

// Weight gradient: grad_w[g*O + d, c, i, j] = sum over patches q and output pixels (oy, ox) of
// grad_out[q, g*O + d, oy, ox] * x[q, g*R + c, oy * stride + i * dil - pad, ...] (zero in the padding).
// An implicit GEMM (O x pixels) . (pixels x R*taps) with the long pixel dimension reduced inside each block.
//
// blockIdx.y = (group * d_tiles + d tile) * k_tiles + k tile picks a tile of out_tile output channels x k_tile
// weight entries k = c * taps + tap; blockIdx.x is a slice: it walks the batches of P patches blockIdx.x,
// blockIdx.x + gridDim.x, ... and writes its sums to partial[slice] (gridDim.x, D, R * taps), which
// patch_reduce adds up in slice order.  Every thread owns TK entries (k = first + lane, + k_lanes, ...: a
// warp's loads are consecutive taps) x TD channels.  Per batch the P patches' tiles of the channels this k
// tile touches ([patch][c][tile_h][tile_w], zero halo) and their grad_out ([patch][pixel][out_tile + 4]:
// channels innermost for the Pack4 loads, padded so that stores of consecutive pixels spread over the banks)
// are staged as acc_t.  No atomics: the result is the same bits on every run and any thread order.
template <typename T, typename I>
__global__ void __launch_bounds__(PATCH_MAX_THREADS) patch_bwd_weight(
    const T* __restrict__ x, const T* __restrict__ grad_out, acc_t<T>* __restrict__ partial, I n,
    I x_inner, I x_stride_outer, I x_stride_inner, I x_stride_c, I x_stride_h, I x_stride_w,
    I g_inner, I g_stride_outer, I g_stride_inner, I g_stride_c, I g_stride_h, I g_stride_w,
    int channels_per_group, int outputs_per_group, int height, int width, int out_h, int out_w, int kernel_h,
    int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h, int dilation_w,
    int patches, int out_tile, int k_tile, int patch_stride) {
  typedef acc_t<T> A;
  constexpr int TK = PatchTile<T>::TK, TD = PatchTile<T>::TD;
  const int kh = kernel_h, kw = kernel_w, h = height, w = width;
  const int taps = kh * kw;
  const int R = channels_per_group, O = outputs_per_group, K = R * taps;
  const int tile_h = (out_h - 1) * stride_h + (kh - 1) * dilation_h + 1;
  const int tile_w = (out_w - 1) * stride_w + (kw - 1) * dilation_w + 1;
  const int plane = tile_h * tile_w;
  const int pixels = out_h * out_w;
  const int row = out_tile + 4;  // grad_out tile row stride (see above)
  const int k_tiles = (K + k_tile - 1) / k_tile, d_tiles = (O + out_tile - 1) / out_tile;
  const int k_first = (blockIdx.y % k_tiles) * k_tile;
  const int d_first = (blockIdx.y / k_tiles % d_tiles) * out_tile;
  const int g = blockIdx.y / (k_tiles * d_tiles);
  const int c_first = k_first / taps;
  const int channels = (min(K, k_first + k_tile) - 1) / taps - c_first + 1;

  const int k_lanes = k_tile / TK;
  const int kl = threadIdx.x % k_lanes;
  const int d_lane = threadIdx.x / k_lanes * TD;

  A* gtile = reinterpret_cast<A*>(patch_shared);  // [patches][pixels][row]
  A* tiles = gtile + patches * pixels * row;      // [patches][patch_stride]
  for (int e = threadIdx.x; e < patches * patch_stride; e += blockDim.x) tiles[e] = A(0);

  int koff[TK];  // offset of each of this thread's entries (c, i, j) in a patch's tiles; 0 past the last
#pragma unroll
  for (int t = 0; t < TK; ++t) {
    const int k = k_first + kl + t * k_lanes;
    const int tap = k % taps;
    koff[t] = k < K ? (k / taps - c_first) * plane + (tap / kw) * dilation_h * tile_w + (tap % kw) * dilation_w : 0;
  }
  A acc[TK][TD];
#pragma unroll
  for (int t = 0; t < TK; ++t) {
#pragma unroll
    for (int u = 0; u < TD; ++u) acc[t][u] = A(0);
  }

  const int hw = h * w;
  for (I first = (I)blockIdx.x * patches; first < n; first += (I)gridDim.x * patches) {
    const int bp = (int)min((I)patches, n - first);
    __syncthreads();  // the previous batch is consumed (and, the first time, the tiles are zeroed)
    for (int e = threadIdx.x; e < bp * channels * hw; e += blockDim.x) {
      const int xx = e % w, y = (e / w) % h;
      const int c = (e / hw) % channels, q = e / (hw * channels);
      const int a = y + pad_top, b = xx + pad_left;
      if (a < tile_h && b < tile_w) {
        const T* s = x + patch_offset(first + q, x_inner, x_stride_outer, x_stride_inner) +
                     (I)(g * R + c_first + c) * x_stride_c;
        tiles[q * patch_stride + c * plane + a * tile_w + b] = to_acc(s[(I)y * x_stride_h + (I)xx * x_stride_w]);
      }
    }
    for (int e = threadIdx.x; e < bp * out_tile * pixels; e += blockDim.x) {
      const int m = e % pixels, d = (e / pixels) % out_tile, q = e / (pixels * out_tile);
      const int dd = d_first + d;
      A value = A(0);
      if (dd < O) {
        const T* s = grad_out + patch_offset(first + q, g_inner, g_stride_outer, g_stride_inner) +
                     (I)(g * O + dd) * g_stride_c;
        value = to_acc(s[(I)(m / out_w) * g_stride_h + (I)(m % out_w) * g_stride_w]);
      }
      gtile[(q * pixels + m) * row + d] = value;
    }
    __syncthreads();

    for (int q = 0; q < bp; ++q) {
      const A* tile = tiles + q * patch_stride;
      const A* grow = gtile + q * pixels * row + d_lane;
      for (int oy = 0; oy < out_h; ++oy) {
        for (int ox = 0; ox < out_w; ++ox) {
          tile_fma(tile + oy * stride_h * tile_w + ox * stride_w, koff, grow + (oy * out_w + ox) * row, acc);
        }
      }
    }
  }

  const int D = O * (gridDim.y / (k_tiles * d_tiles));
  A* dst = partial + (I)blockIdx.x * D * K;
#pragma unroll
  for (int u = 0; u < TD; ++u) {
    const int dd = d_first + d_lane + u;
    if (dd >= O) continue;
#pragma unroll
    for (int t = 0; t < TK; ++t) {
      const int k = k_first + kl + t * k_lanes;
      if (k < K) dst[(I)(g * O + dd) * K + k] = acc[t][u];
    }
  }
}

// out[e] = sum over s < slices of partial[s, e], in order s = 0, 1, ...: one thread per element.
template <typename T, typename I>
__global__ void patch_reduce(const acc_t<T>* __restrict__ partial, T* __restrict__ out, I slices, I size) {
  for (I e = grid_start<I>(); e < size; e += grid_stride<I>()) {
    acc_t<T> sum = 0;
    for (I s = 0; s < slices; ++s) sum += partial[s * size + e];
    out[e] = from_acc<T>(sum);
  }
}
