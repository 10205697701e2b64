// conv2d with groups: the direct kernels for few channels per group (forward, also the stride-1 input gradient;
// weight gradient), and the small kernels around the im2col + cuBLAS GEMM algorithm (bias epilogue, the bias
// gradient, whose in-order sum of splits also finishes the direct weight gradient).  The tensor-core implicit
// GEMMs live in implicit_gemm.cu.
//
// Layouts: x is read through element strides (n, C, H, W); weight is contiguous (D, C / G, kH, kW); outputs and
// grad_output are contiguous (n, D, oH, oW); the group of output channel d is d / (D / G).
#include "common.cuh"

// Dynamic shared memory of every kernel in this file, 16-byte aligned for conv_fwd_direct's vector reads.
extern __shared__ __align__(16) double conv_shared[];

// Direct convolution, for few channels per group (bandwidth-bound: 36-72 multiply-adds per output in ResNeXt's
// groups of 4-8).  Every block works through items (image, group, block of outputs_per_item output channels,
// output tile of DIRECT_ROWS * blockDim.y rows x blockDim.x columns; a small plane's few threads take part of the
// group's outputs an item, so that more warps share the work); thread (tx, ty) owns the DIRECT_ROWS adjacent
// pixels (ty * DIRECT_ROWS + r, tx) of the tile and, for each block of DPT output channels of the item in turn,
// keeps their DIRECT_ROWS x DPT sums in registers: each staged weight feeds DIRECT_ROWS multiply-adds and each
// staged input value DPT.  With stride 1, dilation 1 and DIRECT_SLIDE_KH (3) kernel rows down (3 x 3 stride 1:
// ResNeXt, and every stride-1 input gradient of one), the thread's rows share input rows: each of the
// DIRECT_ROWS + 2 input values of a column is read once and feeds every (row, kernel row) pair it meets, nearly 3x
// fewer shared reads.  A warp's lanes are consecutive columns of one row (blockDim.x 32; narrower outputs take 16,
// 8, ... columns), for coalesced stores and conflict-free reads.  The group's input channels are staged in slabs of
// `slab` channels, the tile plus halo (tile_in_h x tile_in_w, zero outside the image) as acc_t, converted once;
// when one slab holds every channel of the group (the planner's aim) it is staged once per item and every block
// of output channels reads it, so x is read from memory once.  Each (block of outputs, slab) stages its weights
// [slab channel][tap][DPT], read as 16-byte vectors.  Both are staged flat, x by pairs of columns, a thread
// issuing DIRECT_BATCH (pairs of) loads before it stores any: by rows, one load and one wait at a time, the
// staging took as many instructions as the multiply-adds and its waits bound the kernel (benchmarks.predict,
// rx-128: 49 waits a warp, now 5).  Any kernel size, stride, dilation and padding (negative padding too:
// grad_input reuses this kernel); bias is fused where has_bias (else `bias` is never read: no zero-filled bias for
// the input gradient).
#if !defined(DIRECT_ROWS) || !defined(DIRECT_THREADS)
#error "conv.cu needs the -D options of cupyconv._device.compile_options('conv.cu')"
#endif
constexpr int DIRECT_SLIDE_KH = 3;   // the kernel rows of the sliding path (known when compiled: no guards)
constexpr int DIRECT_BATCH = 4;     // pairs of global loads a thread issues before it stores them to shared memory
// Two adjacent columns of a staged tile: one 8-byte (16-byte for double) store.  The tile starts at a multiple of
// 2 * DPT values from the 16-byte aligned conv_shared, so every pair is aligned.
template <typename A> struct alignas(2 * sizeof(A)) DirectPair { A v[2]; };

// DPT accumulator-typed values from shared memory (weights; grad_output for the weight gradient), float in 16-byte
// vectors where DPT % 4 == 0: w is then 16-byte aligned (the layouts keep every DPT values at a multiple of 16 bytes
// from conv_shared, which is 16-byte aligned).
template <int DPT> __device__ __forceinline__ void load_vector(float (&out)[DPT], const float* w) {
  if constexpr (DPT % 4 == 0) {
#pragma unroll
    for (int d = 0; d < DPT; d += 4) {
      const float4 v = *reinterpret_cast<const float4*>(w + d);
      out[d] = v.x; out[d + 1] = v.y; out[d + 2] = v.z; out[d + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int d = 0; d < DPT; ++d) out[d] = w[d];
  }
}
template <int DPT> __device__ __forceinline__ void load_vector(double (&out)[DPT], const double* w) {
#pragma unroll
  for (int d = 0; d < DPT; ++d) out[d] = w[d];
}
// The other way: DPT values to shared memory, as 16-byte vectors where load_vector reads them so.
template <int DPT> __device__ __forceinline__ void store_vector(float* w, const float (&in)[DPT]) {
  if constexpr (DPT % 4 == 0) {
#pragma unroll
    for (int d = 0; d < DPT; d += 4) {
      *reinterpret_cast<float4*>(w + d) = make_float4(in[d], in[d + 1], in[d + 2], in[d + 3]);
    }
  } else {
#pragma unroll
    for (int d = 0; d < DPT; ++d) w[d] = in[d];
  }
}
template <int DPT> __device__ __forceinline__ void store_vector(double* w, const double (&in)[DPT]) {
#pragma unroll
  for (int d = 0; d < DPT; ++d) w[d] = in[d];
}

// Stages `channels` channels of x's window (tile_in_h x tile_in_w values a channel, input row iy0 and column ix0 at
// its top left, zero outside the height x width image) into tile [channel][tile_in_h][tile_in_w] as acc_t, flat, by
// pairs of columns: pair e = tid, tid + threads, ... is tile[2e], tile[2e + 1], columns x, x + 1 (x = 2 (e %
// pairs_w)) of tile row e / pairs_w % tile_in_h of channel e / (pairs_w * tile_in_h) (tile_in_w is even: the
// planners round it up; tile 2 * sizeof(A)-aligned), consecutive pairs on consecutive threads (coalesced, no lane
// idles on a halo column).  The walk keeps x, the row and x's offset in x_slab, stepped by `threads` pairs, with a
// carry out of a tile row and one out of a channel: its cost is paid a pair.  A thread issues BATCH pairs of loads
// before it stores any: one wait on memory a batch.  Both direct kernels stage x so (conv_fwd_direct a slab,
// conv_bwd_weight_direct the group a unit).
// (The walk's start, pair_at(tid), and step, pair_at(threads), come from the caller: conv_bwd_weight_direct keeps
// them in shared memory rather than dividing again each unit.)
struct PairAt { int x, y, c; };   // a pair's first column (even), tile row and channel
__device__ __forceinline__ PairAt pair_at(int e, int tile_in_w, int tile_in_h) {
  const int pairs_w = tile_in_w / 2;
  return {e % pairs_w * 2, e / pairs_w % tile_in_h, e / (pairs_w * tile_in_h)};
}
template <int BATCH, typename A, typename T, typename I>
__device__ __forceinline__ void stage_pairs(A* tile, const T* x_slab, int channels, int tile_in_h, int tile_in_w,
                                            int iy0, int ix0, int height, int width, I x_stride_c, I x_stride_h,
                                            I x_stride_w, int tid, int threads, PairAt start, PairAt by) {
  const int count = channels * (tile_in_w / 2) * tile_in_h;
  const int step_x = by.x, step_y = by.y;
  int x_at = start.x, y_at = start.y;
  I at = (I)start.c * x_stride_c + (I)(iy0 + y_at) * x_stride_h + (I)(ix0 + x_at) * x_stride_w;
  const I step = (I)by.c * x_stride_c + (I)step_y * x_stride_h + (I)step_x * x_stride_w;
  const I row_carry = x_stride_h - (I)tile_in_w * x_stride_w;
  const I channel_carry = x_stride_c - (I)tile_in_h * x_stride_h;
  for (int e0 = tid; e0 < count; e0 += BATCH * threads) {
    DirectPair<A> v[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      // unsigned: a row or column of padding before the image wraps to a large number
      const bool row = e0 + b * threads < count && (unsigned)(iy0 + y_at) < (unsigned)height;
      v[b].v[0] = row && (unsigned)(ix0 + x_at) < (unsigned)width ? to_acc(x_slab[at]) : A(0);
      v[b].v[1] = row && (unsigned)(ix0 + x_at + 1) < (unsigned)width ? to_acc(x_slab[at + x_stride_w]) : A(0);
      x_at += step_x, y_at += step_y, at += step;
      if (x_at >= tile_in_w) x_at -= tile_in_w, ++y_at, at += row_carry;
      if (y_at >= tile_in_h) y_at -= tile_in_h, at += channel_carry;
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      if (e0 + b * threads < count) reinterpret_cast<DirectPair<A>*>(tile)[e0 + b * threads] = v[b];
    }
  }
}

// Blocks an SM must hold at DIRECT_THREADS threads (the register cap): 64 (DPT 8), 32 (DPT 4) and 16 (DPT 2) float
// sums a thread fit in 128, 80 and 64 registers without spilling, which keeps four 4-warp and three 7-warp blocks
// an SM (ResNeXt's 28 x 28 and 56 x 56 planes); double sums are left to the compiler.
template <typename T, int DPT>
constexpr int direct_min_blocks = sizeof(acc_t<T>) == 8 ? 1 : DPT == 8 ? 2 : DPT == 4 ? 3 : 4;

template <typename T, typename I, int DPT>
__global__ void __launch_bounds__(DIRECT_THREADS, direct_min_blocks<T, DPT>)
conv_fwd_direct(const T* __restrict__ x, const T* __restrict__ weight,
                                const T* __restrict__ bias, T* __restrict__ out, I n,
                                I x_stride_n, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
                                int channels_per_group, int outputs_per_group, int height, int width, int kernel_h,
                                int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left,
                                int dilation_h, int dilation_w, int out_h, int out_w, int outputs_per_item,
                                int slab, int tile_in_h, int tile_in_w, int has_bias) {
  typedef acc_t<T> A;
  const int taps = kernel_h * kernel_w;
  const int tile_elems = tile_in_h * tile_in_w;
  // The weights go first, at the aligned start, so that each tap's DPT weights are 16-byte vectors.
  A* wslab = reinterpret_cast<A*>(conv_shared);  // [slab channel][tap][DPT]
  A* tile = wslab + slab * taps * DPT;           // [slab channel][tile_in_h][tile_in_w]

  // The block's columns and rows: signed copies keep the padding arithmetic signed.
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int threads = bx * by;
  const int tid = ty * bx + tx;
  const int tile_h = by * DIRECT_ROWS;
  const int tiles_x = (out_w + bx - 1) / bx;
  const int tiles_y = (out_h + tile_h - 1) / tile_h;
  const int d_items = (outputs_per_group + outputs_per_item - 1) / outputs_per_item;
  const I items = n * groups * d_items * tiles_y * tiles_x;
  // Staging walks the slab's tile flat: element e = tid, tid + threads, ... is tile[e] (column e % tile_in_w of
  // tile row e / tile_in_w % tile_in_h of slab channel e / tile_elems), consecutive elements on consecutive threads
  // (coalesced, no lane idle on a halo column), split once here and stepped by `threads` with a carry per digit.
  const int row_step = stride_h * tile_in_w;   // from one of a thread's rows to the next in the tile
  const bool slide = stride_h == 1 && dilation_h == 1 && kernel_h == DIRECT_SLIDE_KH;

  // The item, block-of-outputs and slab loops are uniform across the block, so every thread meets every barrier.
  for (I item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile_x = (int)(item % tiles_x);
    const int tile_y = (int)((item / tiles_x) % tiles_y);
    const int d_item = (int)((item / ((I)tiles_x * tiles_y)) % d_items);
    const I image_group = item / ((I)tiles_x * tiles_y * d_items);
    const int d_begin = d_item * outputs_per_item, d_end = min(outputs_per_group, d_begin + outputs_per_item);
    const int g = (int)(image_group % groups);
    const I image = image_group / groups;
    const int oy = tile_y * tile_h + ty * DIRECT_ROWS;  // the thread's first row of DIRECT_ROWS
    const int ox = tile_x * bx + tx;
    const int iy0 = tile_y * tile_h * stride_h - pad_top;  // input row of the tile's top-left tap
    const int ix0 = tile_x * bx * stride_w - pad_left;
    const T* x_group = x + image * x_stride_n + (I)(g * channels_per_group) * x_stride_c;

    for (int d0 = d_begin; d0 < d_end; d0 += DPT) {
      A sum[DIRECT_ROWS][DPT];
#pragma unroll
      for (int d = 0; d < DPT; ++d) {
        const A b = has_bias && d0 + d < d_end ? to_acc(bias[g * outputs_per_group + d0 + d]) : A(0);
#pragma unroll
        for (int r = 0; r < DIRECT_ROWS; ++r) sum[r][d] = b;
      }
      for (int c0 = 0; c0 < channels_per_group; c0 += slab) {
        const int channels = min(slab, channels_per_group - c0);
        __syncthreads();  // the previous slab's readers are done with shared memory
        // A thread issues DIRECT_BATCH loads before it stores any: one wait on memory a batch, not one an element.
        if (d0 == d_begin || slab < channels_per_group) {  // one slab of every channel: staged once per item
          stage_pairs<DIRECT_BATCH>(tile, x_group + (I)c0 * x_stride_c, channels, tile_in_h, tile_in_w, iy0, ix0,
                                    height, width, x_stride_c, x_stride_h, x_stride_w, tid, threads,
                                    pair_at(tid, tile_in_w, tile_in_h), pair_at(threads, tile_in_w, tile_in_h));
        }
        const int w_count = channels * taps * DPT;
        for (int e0 = tid; e0 < w_count; e0 += DIRECT_BATCH * threads) {
          A v[DIRECT_BATCH];
#pragma unroll
          for (int b = 0; b < DIRECT_BATCH; ++b) {
            const int e = e0 + b * threads;
            const int d = e % DPT;
            const int ct = e / DPT;  // c * taps + t
            v[b] = e < w_count && d0 + d < d_end
                       ? to_acc(weight[(I)(g * outputs_per_group + d0 + d) * channels_per_group * taps + c0 * taps + ct])
                       : A(0);
          }
#pragma unroll
          for (int b = 0; b < DIRECT_BATCH; ++b) {
            if (e0 + b * threads < w_count) wslab[e0 + b * threads] = v[b];
          }
        }
        __syncthreads();
        // Rows past out_h and columns past out_w compute on staged zeros and are not stored: no branch here.
        for (int c = 0; c < channels; ++c) {
          const A* in = tile + c * tile_elems + ty * DIRECT_ROWS * row_step + tx * stride_w;
          const A* w = wslab + c * taps * DPT;
          if (slide) {
#pragma unroll 1  // one kernel column a trip: unrolled further, the DPT 2 loop costs registers, no instructions
            for (int j = 0; j < kernel_w; ++j) {
              A wt[DIRECT_SLIDE_KH][DPT];
#pragma unroll
              for (int i = 0; i < DIRECT_SLIDE_KH; ++i) load_vector(wt[i], w + (i * kernel_w + j) * DPT);
              const A* column = in + j * dilation_w;
              // Input row y of the thread's window feeds output row r through kernel row y - r (known when
              // unrolled): every pair the kernel has, each value read once.
#pragma unroll
              for (int y = 0; y < DIRECT_ROWS + DIRECT_SLIDE_KH - 1; ++y) {
                const A v = column[y * tile_in_w];
#pragma unroll
                for (int r = 0; r < DIRECT_ROWS; ++r) {
                  if (y - r >= 0 && y - r < DIRECT_SLIDE_KH) {
#pragma unroll
                    for (int d = 0; d < DPT; ++d) sum[r][d] += v * wt[y - r][d];
                  }
                }
              }
            }
            continue;
          }
          for (int i = 0; i < kernel_h; ++i) {
            // Unrolled twice, not the compiler's 8: the sliding path above is the hot one (and the loop with the
            // most FMAs, the one benchmarks.sass reads as the kernel's main loop); this one keeps its code small.
#pragma unroll 2
            for (int j = 0; j < kernel_w; ++j) {
              // The tap's weights read on lines of their own, not load_vector's: benchmarks.executed shares a source
              // line's counted reads among all its inlined copies, and would charge the sliding path's to this loop.
              A wt[DPT];
#pragma unroll
              for (int d = 0; d < DPT; ++d) wt[d] = w[(i * kernel_w + j) * DPT + d];
              const A* tap = in + i * dilation_h * tile_in_w + j * dilation_w;
#pragma unroll
              for (int r = 0; r < DIRECT_ROWS; ++r) {
                const A v = tap[r * row_step];
#pragma unroll
                for (int d = 0; d < DPT; ++d) sum[r][d] += v * wt[d];
              }
            }
          }
        }
      }

      if (ox < out_w) {
        const I channel0 = image * groups * outputs_per_group + g * outputs_per_group + d0;
#pragma unroll
        for (int r = 0; r < DIRECT_ROWS; ++r) {
          const int y = oy + r;
          if (y >= out_h) break;
          const I pixel = (I)y * out_w + ox;
#pragma unroll
          for (int d = 0; d < DPT; ++d) {
            if (d0 + d < d_end) out[(channel0 + d) * out_h * out_w + pixel] = from_acc<T>(sum[r][d]);
          }
        }
      }
    }
  }
}

// Weight gradient of the direct algorithm, for few channels per group: per group a GEMM of Dg rows (output
// channels) by K = C / G * kH * kW columns (input channel, tap) reduced over every (image, output pixel), too
// small for cuBLAS and whose column matrix would be kH * kW times x.  Block (split s, group g and chunk of its
// output blocks) walks the units (image, tile of tile_rows x lane_columns output pixels) [s * units_per_split,
// ...) in order, staging for each the group's x tile plus halo (tile_in_h x tile_in_w a channel, zero outside the
// image) and its grad_output tile (zero outside the output) in shared memory as acc_t.  Warp w owns output block
// chunk * (blockDim.x / 32) + w: WGRAD_DPT output channels x WGRAD_KT columns (c, tap), decoded once into offsets
// in the x tile; lane l sums column l % lane_columns of the tile rows l / lane_columns + k * 32 / lane_columns
// (lane_columns 32, or 16 or 8 on narrow outputs, so that no lane idles for want of columns), each staged
// grad_output vector (16 bytes) feeding WGRAD_KT x WGRAD_DPT multiply-adds.  The 4-byte-sum instantiations fit
// 64 registers (32 warps an SM, where 98 registers let 16 in: the warps take turns at barriers and staging
// loads): a warp's output block and column offsets, and the x staging walk's start and step, wait in shared
// memory and its lane indices are worked out again each unit, rather than held beside the 36 sums.  At the end
// the lanes' sums are added by halves (wgrad_lane_halves) and each lane writes the ones it holds to
// partial[o * splits + s] (o the flat index of the weight); conv_bgrad_sum adds the splits in order: the same
// bits on every run, no atomics.  Any kernel size, stride,
// dilation and padding.  With with_bias, the warps of column block 0 also sum their WGRAD_DPT channels'
// grad_output (already staged: no second read of it, and no conv_bgrad + conv_bgrad_sum launches): after a unit's
// products, each lane adds its pixels' values, in step order, to its own slot in shared memory (registers beside
// the 36 sums would spill), and at the end a shuffle tree a channel writes grad_bias's split sums after the weight's,
// partial[(D * K + d) * splits + s], which the one conv_bgrad_sum adds in order with the weight's.
#if !defined(WGRAD_DPT) || !defined(WGRAD_KT) || !defined(WGRAD_MAX_THREADS) || !defined(WGRAD_INFO)
#error "conv.cu needs the -D options of cupyconv._device.compile_options('conv.cu')"
#endif

// pairs of x tile elements a thread loads before it stores them (loads in flight; registers)
constexpr int WGRAD_X_BATCH = 4;
// WGRAD_INFO (from ops/conv.py, which sizes the shared memory): the ints of shared memory a warp keeps its output
// block in: WGRAD_KT column offsets, d0 (-1: no block), k0
static_assert(WGRAD_INFO == WGRAD_KT + 2, "a warp's info: its column offsets, d0 and k0");
// Blocks of WGRAD_MAX_THREADS (512) an SM must hold: 2 (64 registers a thread, so 32 warps an SM: the kernel's
// warps wait on barriers and staging loads, and 98 registers had let 16 in) where the sums are 4-byte and the
// indices int; the double and long long instantiations keep their registers (they would spill).  Before sm_90, 1
// (the compiler's choice, up to 128): with the fused bias sums (task grpbias) sm_80's code spilled 16 bytes at 64,
// and 85 registers (3 blocks of 256 before task grpdir) is no whole number of 512-thread blocks.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
template <typename T, typename I> constexpr int wgrad_min_blocks = 1;
#else
template <typename T, typename I> constexpr int wgrad_min_blocks = sizeof(acc_t<T>) == 4 && sizeof(I) == 4 ? 2 : 1;
#endif
// Thread `thread`'s WGRAD_DPT bias sums: after the warps' info, at the next 16 bytes (the planner pads to them),
// worked out where used rather than held in a register through the unit loop (64 registers: it spilled).
// (An offset from conv_shared, not an address rounded as an integer, which would lose that it is shared memory.)
// v summed over the warp's 32 lanes by a fixed xor butterfly (16, 8, 4, 2, 1): the same bits on every lane and run,
// for the fused bias sums (the weight's use wgrad_lane_halves).
template <typename A> __device__ __forceinline__ A warp_tree_sum(A v) {
#pragma unroll
  for (int step = 16; step > 0; step /= 2) v += __shfl_xor_sync(0xffffffffu, v, step);
  return v;
}
// A warp's WGRAD_DPT * WGRAD_KT sums v, each added over the 32 lanes by halves: at xor distance 16, 8, 4, 2, 1 a
// lane keeps the lower half of its n values (the upper where its lane bit is set; n odd: the halves are h = (n + 1)
// / 2 and n - h, the short one padded with a zero) and adds its partner's copy of the same half, sending the
// other: 36 -> 18 -> 9 -> 5 -> 3 -> 2 values, 37 shuffles and adds where a tree a sum takes 180.  Lane l ends
// holding v[first], ..., v[first + held - 1] (held <= WGRAD_HELD) summed over the lanes, in v[0 ...]: a fixed
// order, so the same bits on every run.
__host__ __device__ constexpr int wgrad_halves(int n, int step) {
  return step == 0 ? n : wgrad_halves((n + 1) / 2, step / 2);
}
constexpr int WGRAD_HELD = wgrad_halves(WGRAD_DPT * WGRAD_KT, 16);
template <int N, int STEP, typename A>
__device__ __forceinline__ void wgrad_lane_halves(A* v, int lane, int& first, int& held) {
  if constexpr (STEP > 0) {
    constexpr int h = (N + 1) / 2;
    const bool upper = lane & STEP;
#pragma unroll
    for (int i = 0; i < h; ++i) {
      const A high = i + h < N ? v[i + h] : A(0);
      const A kept = upper ? high : v[i], sent = upper ? v[i] : high;
      v[i] = kept + __shfl_xor_sync(0xffffffffu, sent, STEP);
    }
    if (upper) {
      first += h, held -= h;
    } else {
      held = min(held, h);
    }
    wgrad_lane_halves<h, STEP / 2>(v, lane, first, held);
  }
}
template <typename A> __device__ __forceinline__ A* wgrad_bias_sums(int* info, int warps, int thread) {
  char* base = reinterpret_cast<char*>(conv_shared);
  const int end = static_cast<int>(reinterpret_cast<char*>(info + warps * WGRAD_INFO) - base);
  return reinterpret_cast<A*>(base + (end + 15) / 16 * 16) + thread * WGRAD_DPT;
}

template <typename T, typename I>
__global__ void __launch_bounds__(WGRAD_MAX_THREADS, wgrad_min_blocks<T, I>)
conv_bwd_weight_direct(const T* __restrict__ x, const T* __restrict__ grad_output, acc_t<T>* __restrict__ partial,
                       I n, I x_stride_n, I x_stride_c, I x_stride_h, I x_stride_w, int groups,
                       int channels_per_group, int outputs_per_group, int height, int width, int kernel_h,
                       int kernel_w, int stride_h, int stride_w, int pad_top, int pad_left, int dilation_h,
                       int dilation_w, int out_h, int out_w, int tile_rows, int lane_columns, int tile_in_h,
                       int tile_in_w, int units_per_split, int with_bias) {
  typedef acc_t<T> A;
  const int taps = kernel_h * kernel_w;
  const int columns = channels_per_group * taps;  // K
  const int d_blocks = (outputs_per_group + WGRAD_DPT - 1) / WGRAD_DPT;
  const int k_blocks = (columns + WGRAD_KT - 1) / WGRAD_KT;
  const int warps = blockDim.x / 32;
  const int chunks = (d_blocks * k_blocks + warps - 1) / warps;
  const int g = blockIdx.y / chunks;
  const int splits = gridDim.x, s = blockIdx.x;
  const int tile_elems = tile_in_h * tile_in_w;
  // A warp step covers `steps` = 32 / lane_columns tile rows; tile_rows is a multiple of them.
  const int row_steps = 32 / lane_columns, steps = tile_rows / row_steps;
  // grad_output goes first, at the aligned start: [d_block][tile pixel][WGRAD_DPT], 16-byte vectors, a warp step's
  // 32 pixels consecutive; then x [channel][tile_in_h][tile_in_w]; then each warp's WGRAD_INFO ints (below); then,
  // with with_bias, each thread's WGRAD_DPT bias sums (wgrad_bias_sums).
  A* gy_tile = reinterpret_cast<A*>(conv_shared);
  A* x_tile = gy_tile + d_blocks * WGRAD_DPT * tile_rows * lane_columns;
  // the x staging's walk: [0] its step, [1 + t] thread t's first pair (pair_at: divisions done once, not a unit)
  PairAt* walk = reinterpret_cast<PairAt*>(x_tile + channels_per_group * tile_elems);
  int* info = reinterpret_cast<int*>(walk + 1 + blockDim.x);
  // The sliding path: a 3 x 3 kernel (so that a warp's WGRAD_KT columns are one channel's taps), stride equal to
  // dilation down, and a warp step of one row (32 columns a lane row).
  static_assert(WGRAD_KT == 9, "the sliding path takes a warp's columns as one channel's 3 x 3");
  const bool slide = kernel_h == 3 && kernel_w == 3 && stride_h == dilation_h && lane_columns == 32;

  // Each warp's output block (d0, k0) and its columns as offsets in the x tile (from the lane's first pixel; past
  // K offset 0, whose sums are never written) wait in shared memory, info[warp * WGRAD_INFO ...], written once by
  // the warp's first lanes and visible after the unit loop's first barrier; they and every lane index are read or
  // worked out again each unit, so that the sums' 36 registers and the loops' own fit 64 a thread.  Whether the
  // warp sums the bias (with_bias, column block 0) is a predicate, not a register of k0 held through the loops.
  bool sums_bias;
  {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int block = (blockIdx.y % chunks) * warps + warp;  // d_block * k_blocks + k_block
    const bool computes = block < d_blocks * k_blocks;
    const int d0 = computes ? block / k_blocks * WGRAD_DPT : -1, k0 = computes ? block % k_blocks * WGRAD_KT : 0;
    const int k = k0 + lane, c = k / taps, t = k % taps;
    sums_bias = with_bias && computes && k0 == 0;
    walk[1 + threadIdx.x] = pair_at(threadIdx.x, tile_in_w, tile_in_h);
    if (threadIdx.x == 0) walk[0] = pair_at(blockDim.x, tile_in_w, tile_in_h);
    if (lane < WGRAD_KT) {
      info[warp * WGRAD_INFO + lane] = k < columns
          ? c * tile_elems + t / kernel_w * dilation_h * tile_in_w + t % kernel_w * dilation_w : 0;
    } else if (lane == WGRAD_KT) {
      info[warp * WGRAD_INFO + lane] = d0;   // -1: a warp past the output blocks (it stages, never sums)
    } else if (lane == WGRAD_KT + 1) {
      info[warp * WGRAD_INFO + lane] = k0;
    }
  }
  A sum[WGRAD_DPT][WGRAD_KT];
#pragma unroll
  for (int d = 0; d < WGRAD_DPT; ++d) {
#pragma unroll
    for (int kk = 0; kk < WGRAD_KT; ++kk) sum[d][kk] = 0;
    if (with_bias) wgrad_bias_sums<A>(info, warps, threadIdx.x)[d] = 0;   // this thread's alone: no barrier
  }

  const int tiles_x = (out_w + lane_columns - 1) / lane_columns, tiles_y = (out_h + tile_rows - 1) / tile_rows;
  const I units = n * tiles_y * tiles_x;
  const I unit_begin = (I)s * units_per_split;
  const I unit_end = min(units, unit_begin + units_per_split);
  const I plane = (I)out_h * out_w;
  for (I unit = unit_begin; unit < unit_end; ++unit) {
    const int tile_x = (int)(unit % tiles_x);
    const int tile_y = (int)((unit / tiles_x) % tiles_y);
    const I image = unit / ((I)tiles_x * tiles_y);
    const int oy0 = tile_y * tile_rows;
    const int iy0 = oy0 * stride_h - pad_top, ix0 = tile_x * lane_columns * stride_w - pad_left;
    // The thread's indices, worked out again each unit: the empty asm hides that they are the same every unit,
    // or the compiler keeps them across the sums (spilled at 64 registers).
    int thread = threadIdx.x;
    asm volatile("" : "+r"(thread));
    __syncthreads();  // the previous unit's readers are done with shared memory
    // x: the group's tile, channels x rows x columns (x_tile's own layout), flat by pairs of columns as the
    // forward's (stage_pairs): consecutive pairs on consecutive threads, WGRAD_X_BATCH pairs of loads a thread in
    // flight; by elements its walk had cost about 40 instructions a value (rx-256: a third of the kernel's).
    stage_pairs<WGRAD_X_BATCH>(x_tile, x + image * x_stride_n + (I)(g * channels_per_group) * x_stride_c,
                               channels_per_group, tile_in_h, tile_in_w, iy0, ix0, height, width, x_stride_c,
                               x_stride_h, x_stride_w, thread, (int)blockDim.x, walk[1 + thread], walk[0]);
    // grad_output: one warp step of one block of WGRAD_DPT output channels per warp at a time, a lane's pixel as
    // in the sums below (a coalesced load per channel), the lane's WGRAD_DPT values stored as one vector
    const int warp = thread / 32, lane = thread % 32;
    const int lane_row = lane / lane_columns, lane_column = lane % lane_columns;
    const T* gy_group = grad_output + (image * groups + g) * outputs_per_group * plane;
    const int ox = tile_x * lane_columns + lane_column;
    // (by block of channels, then steps: a flat walk of both divided by `steps` each trip, 12% of rx-128's count)
    for (int db = 0; db < d_blocks; ++db) {
      for (int step = warp; step < steps; step += warps) {
        const int y = oy0 + step * row_steps + lane_row;
        A value[WGRAD_DPT];
#pragma unroll
        for (int dd = 0; dd < WGRAD_DPT; ++dd) {
          const int d = db * WGRAD_DPT + dd;
          value[dd] = d < outputs_per_group && y < out_h && ox < out_w
                          ? to_acc(gy_group[d * plane + (I)y * out_w + ox]) : A(0);
        }
        store_vector(gy_tile + ((db * steps + step) * 32 + lane) * WGRAD_DPT, value);
      }
    }
    __syncthreads();
    const int* warp_info = info + warp * WGRAD_INFO;
    const int d0 = warp_info[WGRAD_KT], k0 = warp_info[WGRAD_KT + 1];
    if (d0 < 0) continue;
    const A* x_lane = x_tile + lane_row * stride_h * tile_in_w + lane_column * stride_w;
    const A* gy_lane = gy_tile + (d0 / WGRAD_DPT * steps * 32 + lane) * WGRAD_DPT;
    if (slide) {
      // One channel's 3 x 3, a lane per column of the tile rows in turn: the window of row step + 1 is that of
      // row step moved down one kernel row (stride = dilation down), so each step reads one new row of 3 values
      // and keeps the other 6 in registers.
      const A* column = x_lane + k0 / WGRAD_KT * tile_elems;
      const int row = stride_h * tile_in_w;
      A xv[3][3];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 3; ++j) xv[i][j] = column[i * row + j * dilation_w];
      }
      // two rows a trip: 96 instructions per 72 FFMA on sm_90 against 55 per 36 (four spill at 64 registers)
#pragma unroll 2
      for (int step = 0; step < steps; ++step) {
        A gv[WGRAD_DPT];
        load_vector(gv, gy_lane + step * 32 * WGRAD_DPT);
#pragma unroll
        for (int j = 0; j < 3; ++j) xv[2][j] = column[(step + 2) * row + j * dilation_w];
#pragma unroll
        for (int i = 0; i < 3; ++i) {
#pragma unroll
          for (int j = 0; j < 3; ++j) {
#pragma unroll
            for (int d = 0; d < WGRAD_DPT; ++d) sum[d][i * 3 + j] += gv[d] * xv[i][j];
          }
        }
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          xv[0][j] = xv[1][j];
          xv[1][j] = xv[2][j];
        }
      }
    } else {
      int offset[WGRAD_KT];
#pragma unroll
      for (int kk = 0; kk < WGRAD_KT; ++kk) offset[kk] = warp_info[kk];
      for (int step = 0; step < steps; ++step) {
        // grad_output read here on its own line (not load_vector's, which the sliding loop uses), 16-byte
        // aligned as there: the model's executed count anchors each loop to its own loads
        const A* gy_step = static_cast<const A*>(__builtin_assume_aligned(gy_lane + step * 32 * WGRAD_DPT, 16));
        A gv[WGRAD_DPT];
#pragma unroll
        for (int d = 0; d < WGRAD_DPT; ++d) gv[d] = gy_step[d];
        const A* x_row = x_lane + step * row_steps * stride_h * tile_in_w;
#pragma unroll
        for (int kk = 0; kk < WGRAD_KT; ++kk) {
          const A v = x_row[offset[kk]];
#pragma unroll
          for (int d = 0; d < WGRAD_DPT; ++d) sum[d][kk] += gv[d] * v;
        }
      }
    }
    if (sums_bias) {
      // the unit's grad_output of the warp's channels, the lane's pixels in step order, onto the lane's slot (read
      // on lines of their own, not load_vector's: the model's executed count anchors each loop to its own loads)
      A* bias_sums = wgrad_bias_sums<A>(info, warps, thread);
      const A* slot = static_cast<const A*>(__builtin_assume_aligned(bias_sums, 16));
      // added into the slot step by step (4 sums held through the loop beside the 36 spilled the slot's address)
      for (int step = 0; step < steps; ++step) {
        const A* gy_step = static_cast<const A*>(__builtin_assume_aligned(gy_lane + step * 32 * WGRAD_DPT, 16));
        A b[WGRAD_DPT];
#pragma unroll
        for (int d = 0; d < WGRAD_DPT; ++d) b[d] = slot[d] + gy_step[d];
        store_vector(bias_sums, b);
      }
    }
  }

  const int lane = threadIdx.x % 32;
  const int* warp_info = info + threadIdx.x / 32 * WGRAD_INFO;
  const int d0 = warp_info[WGRAD_KT], k0 = warp_info[WGRAD_KT + 1];
  if (d0 < 0) return;
  // The warp's sums over its 32 lanes by halves (wgrad_lane_halves): each lane ends with WGRAD_HELD of them, one
  // store each, where a tree a sum (5 shuffles and 5 adds, then lane 0's store) took 36 trees and 36 stores.
  A* flat = &sum[0][0];
  int first = 0, held = WGRAD_DPT * WGRAD_KT;
  wgrad_lane_halves<WGRAD_DPT * WGRAD_KT, 16>(flat, lane, first, held);
#pragma unroll
  for (int i = 0; i < WGRAD_HELD; ++i) {
    const int o = first + i, d = o / WGRAD_KT, k = k0 + o % WGRAD_KT;
    if (i < held && d0 + d < outputs_per_group && k < columns) {
      partial[((I)(g * outputs_per_group + d0 + d) * columns + k) * splits + s] = flat[i];
    }
  }
  if (!sums_bias) return;
  A* bias_partial = partial + (I)groups * outputs_per_group * columns * splits;
  int thread = threadIdx.x;   // hidden: else the slot's address from before the loop is kept (spilled) to here
  asm volatile("" : "+r"(thread));
  const A* bias_sums = wgrad_bias_sums<A>(info, warps, thread);
#pragma unroll
  for (int d = 0; d < WGRAD_DPT; ++d) {
    const A v = warp_tree_sum(bias_sums[d]);
    if (lane == 0 && d0 + d < outputs_per_group) bias_partial[(I)(g * outputs_per_group + d0 + d) * splits + s] = v;
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

// Rows past `channels` go to grad_after: conv_bwd_weight_direct's bias sums after its weight's (one launch for
// both); other callers pass channels_after 0.
template <typename T, typename I>
__global__ void conv_bgrad_sum(const acc_t<T>* __restrict__ partial, T* __restrict__ grad_bias, int channels,
                               T* __restrict__ grad_after, int channels_after, int splits) {
  for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < channels + channels_after; d += gridDim.x * blockDim.x) {
    acc_t<T> sum = 0;
    for (int s = 0; s < splits; ++s) sum += partial[(I)d * splits + s];
    if (d < channels) {
      grad_bias[d] = from_acc<T>(sum);
    } else {
      grad_after[d - channels] = from_acc<T>(sum);
    }
  }
}
